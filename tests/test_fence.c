/*
 * The receiving side in charge of its region, over shared memory, every block verified:
 *  - late writes: 100 connections (10 rounds of 10) each have a write of old data that reaches
 *    the receiver only after it fenced the writer: with the receiver SIGSTOPped, another writer
 *    fills its FIFO, so UCX keeps the late writer's messages (it has no progress thread: they
 *    move only when it is polled); they fail by deadline; the receiver resumes and fences; the
 *    writer's next poll hands them over and the receiver drops every one (100 fenced messages,
 *    the blocks keep their contents); the writer rewrites the same blocks over a new connection;
 *    2 s later every block holds the new data;
 *  - fence semantics: on a receiver whose messages wait unprocessed (no progress thread), a fence
 *    of one tag drops the queued write of that tag (its writer sees -KVX_EFENCED) and lets the
 *    other tag's land; the writer's next write of the fenced tag lands without a re-add;
 *  - arrival notices: one per write sent with KVX_XFER_NOTIFY, after all of its blocks landed,
 *    with its tag, block and byte counts; none for a write that failed or was fenced;
 *  - integrity: with CRC-32C on, writes and reads move every byte and nothing is refused;
 *  - many tag fences (a receiver in this process, its progress held): after 1,000 of them,
 *    waiting writes of fenced tags are refused and one of a tag never fenced lands; the bound
 *    on distinct tags fails a fence with -ENOSPC and fences nothing;
 *  - a write on a connection whose HELLO the receiver had not processed: kvx_fence lets it land
 *    (the weaker form), kvx_fence_ex(KVX_FENCE_RETIRE) refuses it (-EKEYREVOKED, 0 blocks), for
 *    a peer added by metadata, one paired by address (which pairs again by itself) and one
 *    with a shared secret (its HELLO proves the secret and is refused all the same); with the
 *    argument "unheard-tcp", the same over tcp alone ("unheard": over shared memory, alone).
 */
#include "harness.h"
#include "kvx_int.h" /* the paired case looks at the listener's pairings */

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define BL 4096
#define NB 256
#define SALT 0x51

static kt_region_t r;

/* A writer on the test's region; threads: its progress threads; stall_ms 0: the default. */
static kvx_transport_t *writer(const char *name, int integrity, unsigned threads, uint64_t stall_ms)
{
    kvx_transport_t *t;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_INTEGRITY |
                                    KVX_PARAM_NUM_THREADS,
                      .base = r.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .agent_name = name,
                      .integrity = integrity,
                      .num_threads = threads};
    if (stall_ms != 0) {
        p.field_mask |= KVX_PARAM_STALL;
        p.stall_ms = stall_ms;
    }
    kt_rndv_params(&p);
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}

static uint64_t put(kvx_transport_t *t, const char *peer, const uint32_t *l, const uint32_t *rm,
                    size_t n, uint64_t deadline_ms, uint64_t tag, bool notify)
{
    kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_TAG | KVX_XFER_PARAM_FLAGS,
                            .tag = tag,
                            .flags = notify ? KVX_XFER_NOTIFY : 0};
    uint64_t id;
    if (deadline_ms) {
        xp.field_mask |= KVX_XFER_PARAM_DEADLINE;
        xp.deadline_ms = deadline_ms;
    }
    KT_OK(kvx_xfer_write(t, peer, l, rm, n, &xp, &id));
    return id;
}

static int wait_one(kvx_transport_t *t, const char *peer, uint64_t id)
{
    kvx_completion_t c;
    KT_EQ(kt_poll_n(t, peer, &c, 1, 10000), 1);
    KT_EQ(c.id, id);
    return c.status;
}

/* The receiver's shared-memory FIFO: kvx sets UCX's MM_FIFO_SIZE to 128 elements of
 * MM_SEG_SIZE = 32 KiB, and each of kvx's WRITE messages fills one element (kvx cuts them to
 * the segment: xfer.c, kvx_xfer_post_write). Every sender to a receiver shares its one FIFO. */
#define FIFO_ELEMS 128
/* Filler writes per round, one message each (4 blocks, 16 KiB). Each submit hands its message
 * to UCX at once unless UCX holds KVX_MAX_REQS (16) of the connection's messages already
 * (xfer.c, kvx_xfer_submit and kvx_xfer_post); those the FIFO takes do not count. With the
 * receiver stopped, the FIFO is therefore full after at most FIFO_ELEMS of them, whatever room
 * it had; the rest wait in the filler's UCX and kvx until the receiver resumes. */
#define FILLERS (FIFO_ELEMS + 32)
#define FILL_GROUPS 16     /* fillers write remote blocks FILL_DST.. in groups of 4 */
#define FILL_DST 192       /* .. up to NB - 1 */
#define STALE_DEADLINE 100 /* ms */

/* What remote block S_i = dst[i][k] holds before round `round` writes it: the target's own
 * pattern, then the new data of the round before. */
static uint64_t prev_salt(int round) { return round == 0 ? 3 : SALT; }
static uint64_t prev_round(int round) { return round == 0 ? 0 : 2ull * round; }

/*
 * 10 rounds of 10 connections. The late writer has no progress thread: its UCX moves only
 * while the test calls it. With the receiver stopped, a filler transport fills the receiver's
 * FIFO; the writer's 10 writes of old data then find it full, so UCX keeps each one's single
 * message on the writer's side. They miss their deadline; the receiver resumes and fences the
 * writer, and only then does the writer's next poll hand them over: each reaches the receiver
 * after its fence, which drops it. The writer then rewrites the blocks over new connections.
 * By rendezvous (KT_RNDV=always, ctest fence_rndv) the fillers' sends wait for the stopped
 * receiver in UCX's hands instead of filling its FIFO, so the writes' headers do reach the FIFO;
 * the resumed receiver takes them before the fence and starts their receives, whose payloads
 * wait for the writer's UCX (it moves only when polled): the fence finds them in flight, waits
 * its bound (1 s), and ends them by closing their connections (rndv_failed). Either way no
 * byte of an old write may land, and 2 s after the rewrite every block holds the new data.
 */
static void late_writes(void)
{
    kt_target_args_t a = {.num_blocks = NB, .block_len = BL, .salt = 3, .threads = 1};
    kt_target_t tg;
    kt_region_t fr = kt_region_alloc(4 * FILL_GROUPS, BL);
    /* no progress thread; and a stall limit far above the ~0.1 s from the writes' deadline to
     * the poll after the fence, so that even a loaded machine cannot make kvx give up (fail the
     * connection, which purges UCX's messages) writes UCX still holds before they could reach
     * the receiver (xfer.c, kvx_xfer_finish and kvx_xfer_check_deadlines) */
    kvx_transport_t *t = writer("late-writer", 0, 0, 20000), *fill;
    kvx_completion_t fc[FILLERS];
    kvx_recv_counters_t rc;
    uint64_t stale = 0;

    a.name = "late-target";
    tg = kt_target_start(&a);
    /* the filler is another writer (the fence spares it) with a progress thread of its own */
    fill = kt_transport(&fr, "late-filler", 1);
    KT_OK(kvx_peer_add(fill, "t", tg.md, tg.md_len, NULL));
    for (int round = 0; round < 10; round++) {
        uint64_t ids[10];
        char peer[10][8];
        uint32_t old_l[10][4], new_l[10][4], probe_l[10][4], dst[10][4];
        uint32_t fill_l[FILL_GROUPS][4], fill_d[FILL_GROUPS][4];
        kvx_completion_t c[10];

        /* old data in local blocks 0..39, new data in 40..79, both to remote S_i; 80..119
         * take S_i's contents back before the round */
        for (int i = 0; i < 10; i++)
            for (int k = 0; k < 4; k++) {
                old_l[i][k] = (uint32_t)(i * 4 + k);
                new_l[i][k] = (uint32_t)(40 + i * 4 + k);
                probe_l[i][k] = (uint32_t)(80 + i * 4 + k);
                dst[i][k] = (uint32_t)(100 + i * 4 + k);
                kt_fill(&r, old_l[i][k], SALT, old_l[i][k], 2ull * round + 1);
                kt_fill(&r, new_l[i][k], SALT, new_l[i][k], 2ull * round + 2);
            }
        for (int g = 0; g < FILL_GROUPS; g++)
            for (int k = 0; k < 4; k++) {
                fill_l[g][k] = (uint32_t)(g * 4 + k);
                fill_d[g][k] = (uint32_t)(FILL_DST + g * 4 + k);
                kt_fill(&fr, fill_l[g][k], SALT, fill_l[g][k], 100ull + round);
            }
        for (int i = 0; i < 10; i++) {
            snprintf(peer[i], sizeof(peer[i]), "a%d", i);
            KT_OK(kvx_peer_add(t, peer[i], tg.md, tg.md_len, NULL));
            /* a read that completes: the connection is wired up, so that its write below goes
             * straight to UCX; and S_i holds what it held before this round */
            KT_OK(kvx_xfer_read(t, peer[i], probe_l[i], dst[i], 4, NULL, &ids[i]));
            KT_EQ(wait_one(t, peer[i], ids[i]), 0);
            for (int k = 0; k < 4; k++)
                KT_EQ(kt_check(&r, probe_l[i][k], prev_salt(round),
                               round == 0 ? dst[i][k] : new_l[i][k], prev_round(round)),
                      0);
        }
        if (round == 0) { /* the FIFO above is shared memory's */
            kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};
            KT_OK(kvx_peer_query(t, peer[0], &pa));
            kt_log("late writes travel over %s", pa.transport);
            KT_CHECK(strncmp(pa.transport, "sysv", 4) == 0 ||
                     strncmp(pa.transport, "posix", 5) == 0);
        }
        kt_stop(&tg.proc);
        /* fill the stopped receiver's FIFO */
        for (int f = 0; f < FILLERS; f++)
            put(fill, "t", fill_l[f % FILL_GROUPS], fill_d[f % FILL_GROUPS], 4, 0, 0, false);
        /* each write is one message that UCX cannot put in the full FIFO: it holds it */
        for (int i = 0; i < 10; i++)
            ids[i] = put(t, peer[i], old_l[i], dst[i], 4, STALE_DEADLINE, 0, false);
        usleep((STALE_DEADLINE + 50) * 1000);
        /* past their deadline they failed, but none is reported while UCX still holds its
         * message (xfer.c, kvx_xfer_finish): had one gone into the FIFO, it would be here (by
         * rendezvous UCX holds each until the receiver has taken its payload) */
        KT_EQ(kt_poll_n(t, NULL, c, 10, 20), 0);
        kt_cont(&tg.proc);
        usleep(50000); /* time to drain its FIFO: the late messages are not in it */
        KT_CHECK(kt_target_fence(&tg, "late-writer", NULL, 0) >= 10);
        /* now the writer's UCX moves again: each message leaves for the FIFO, after the
         * fence, and only then is its write reported */
        for (int i = 0; i < 10; i++)
            KT_ERR(wait_one(t, peer[i], ids[i]), -ETIMEDOUT);
        /* the receiver drops all 10 as fenced, and S_i keeps what it held; by rendezvous
         * (KT_RNDV=always) their headers came before the fence, which finds their receives in
         * flight (the writer's UCX does not move meanwhile), and ends them (rndv_failed) */
        for (uint64_t end = kt_now_ns() + 10000000000ull;;) {
            kt_target_counters(&tg, &rc);
            if (rc.drop_fenced + rc.rndv_failed >= 10ull * (round + 1) || kt_now_ns() > end)
                break;
            usleep(1000);
        }
        KT_EQ(rc.drop_fenced + rc.rndv_failed, 10ull * (round + 1));
        for (int i = 0; i < 10; i++)
            KT_EQ(kt_target_verify(&tg, dst[i], round == 0 ? dst[i] : new_l[i], 4, prev_salt(round),
                                   prev_round(round)),
                  0);
        /* every filler landed */
        KT_EQ(kt_poll_n(fill, "t", fc, FILLERS, 10000), FILLERS);
        for (int f = 0; f < FILLERS; f++)
            KT_EQ(fc[f].status, 0);
        for (int g = 0; g < FILL_GROUPS; g++)
            KT_EQ(kt_target_verify(&tg, fill_d[g], fill_l[g], 4, SALT, 100ull + round), 0);
        for (int i = 0; i < 10; i++) {
            KT_OK(kvx_peer_add(t, peer[i], tg.md, tg.md_len, NULL)); /* a new connection */
            ids[i] = put(t, peer[i], new_l[i], dst[i], 4, 0, 0, false);
        }
        for (int i = 0; i < 10; i++)
            KT_EQ(wait_one(t, peer[i], ids[i]), 0);
        usleep(2000000);
        for (int i = 0; i < 10; i++) {
            stale += kt_target_verify(&tg, dst[i], new_l[i], 4, SALT, 2ull * round + 2);
            KT_EQ(kvx_peer_remove(t, peer[i]), 1);
        }
    }
    kt_target_counters(&tg, &rc);
    kt_log("late writes: 100 runs, %llu stale blocks; the receiver dropped %llu fenced messages "
           "and ended %llu rendezvous receives in flight at the fence",
           (unsigned long long)stale, (unsigned long long)rc.drop_fenced,
           (unsigned long long)rc.rndv_failed);
    KT_EQ(stale, 0);
    /* every one of the 100 old writes reached the receiver after its fence, and the fence alone
     * kept its bytes out (checked in each round, before the rewrite); nothing else was fenced.
     * By rendezvous each one's receive was in flight at the fence, which ended it. */
    KT_EQ(rc.drop_fenced + rc.rndv_failed, 100);
    KT_EQ(rc.rndv_failed, kt_rndv_forced() ? 100 : 0);
    KT_EQ(kt_target_canaries(&tg), 0);
    kvx_transport_destroy(fill);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&tg), 0);
    kt_region_free(&fr);
}

/* A receiver without a progress thread: writes wait in its FIFO until it polls, so a fence
 * surely comes before they are looked at. */
static void fence_tags_and_notices(void)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 4, .threads = 0, .name = "lazy-target"};
    kt_target_t tg = kt_target_start(&a);
    kvx_transport_t *t = writer("tagged-writer", 0, 1, 0);
    kvx_notice_t nt[8];
    kvx_recv_counters_t rc;
    uint32_t l7[3] = {1, 2, 3}, d7[3] = {10, 11, 12}, l8[2] = {4, 5}, d8[2] = {20, 21};
    uint64_t id7, id8, tag7 = 7;
    int st;

    for (uint32_t i = 0; i < 8; i++)
        kt_fill(&r, i, SALT, i, 9);
    KT_OK(kvx_peer_add(t, "lazy", tg.md, tg.md_len, NULL)); /* its handshake needs no poll */
    kt_target_progress(&tg, 50);
    id7 = put(t, "lazy", l7, d7, 3, 0, 7, true);
    id8 = put(t, "lazy", l8, d8, 2, 0, 8, true);
    usleep(50000); /* both sit unprocessed in the receiver's FIFO */
    KT_EQ(kt_target_fence(&tg, "tagged-writer", &tag7, 1), 1);
    kt_target_progress(&tg, 200);
    st = wait_one(t, "lazy", id7);
    kt_log("the write fenced by its tag: %s", kvx_strerror(st));
    KT_ERR(st, -KVX_EFENCED);
    kt_target_progress(&tg, 200);
    KT_EQ(wait_one(t, "lazy", id8), 0);
    KT_EQ(kt_target_verify(&tg, d8, l8, 2, SALT, 9), 0);
    KT_EQ(kt_target_verify(&tg, d7, l7, 3, SALT, 9), 3); /* nothing of it landed */
    /* one notice, for the write of tag 8 only */
    KT_EQ(kt_target_notices(&tg, nt, 8), 1);
    KT_CHECK(strcmp(nt[0].writer, "tagged-writer") == 0);
    KT_EQ(nt[0].tag, 8);
    KT_EQ(nt[0].blocks, 2);
    KT_EQ(nt[0].bytes, 2 * BL);
    KT_EQ(nt[0].status, 0);
    /* the writer heard of the fence: its next write of tag 7 lands, no re-add */
    id7 = put(t, "lazy", l7, d7, 3, 0, 7, true);
    kt_target_progress(&tg, 200);
    KT_EQ(wait_one(t, "lazy", id7), 0);
    KT_EQ(kt_target_notices(&tg, nt, 8), 1);
    KT_EQ(nt[0].tag, 7);
    KT_EQ(kt_target_verify(&tg, d7, l7, 3, SALT, 9), 0);
    KT_EQ(kt_target_notices(&tg, nt, 8), 0); /* each notice once */
    kt_target_counters(&tg, &rc);
    KT_EQ(rc.drop_fenced, 1);
    KT_EQ(rc.notices, 2);
    KT_EQ(kt_target_canaries(&tg), 0);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&tg), 0);
}

/* No notice for a write that failed. */
static void no_notice_for_failures(void)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 5, .threads = 1, .name = "stopped-target"};
    kt_target_t tg = kt_target_start(&a);
    kvx_transport_t *t = writer("failing-writer", 0, 1, 0);
    kvx_notice_t nt[8];
    uint32_t l[2] = {1, 2}, d[2] = {30, 31};
    uint64_t id;

    KT_OK(kvx_peer_add(t, "s", tg.md, tg.md_len, NULL));
    kt_stop(&tg.proc);
    id = put(t, "s", l, d, 2, 100, 5, true);
    KT_ERR(wait_one(t, "s", id), -ETIMEDOUT);
    kt_cont(&tg.proc);
    usleep(300000); /* its bytes land late (no fence here), but no notice ever comes */
    KT_EQ(kt_target_notices(&tg, nt, 8), 0);
    if (kt_rndv_forced()) {
        /* UCX held its rendezvous send to the stopped receiver: the deadline failed the
         * connection (README, "deadline D"), whose close ended the receive; add it again */
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
        KT_OK(kvx_peer_query(t, "s", &pa));
        KT_EQ(pa.state, KVX_PEER_FAILED);
        KT_OK(kvx_peer_add(t, "s", tg.md, tg.md_len, NULL));
    }
    id = put(t, "s", l, d, 2, 0, 6, true);
    KT_EQ(wait_one(t, "s", id), 0);
    KT_EQ(kt_target_notices(&tg, nt, 8), 1);
    KT_EQ(nt[0].tag, 6);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&tg), 0);
}

/* Integrity on: every byte moves both ways, checked by CRC-32C. */
static void integrity(void)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 6, .threads = 1, .name = "crc-target"};
    kt_target_t tg = kt_target_start(&a);
    kvx_transport_t *t = writer("crc-writer", 1, 1, 0);
    kvx_recv_counters_t rc;
    uint32_t l[64], d[64], back[64];
    uint64_t id;

    kt_indices(l, 64, 128, true, 1);
    kt_indices(d, 64, NB, true, 2);
    for (int i = 0; i < 64; i++) {
        kt_fill(&r, l[i], SALT, l[i], 11);
        back[i] = 128 + (uint32_t)i;
    }
    KT_OK(kvx_peer_add(t, "c", tg.md, tg.md_len, NULL));
    id = put(t, "c", l, d, 64, 0, 0, false);
    KT_EQ(wait_one(t, "c", id), 0);
    KT_EQ(kt_target_verify(&tg, d, l, 64, SALT, 11), 0);
    KT_OK(kvx_xfer_read(t, "c", back, d, 64, NULL, &id));
    KT_EQ(wait_one(t, "c", id), 0);
    for (int i = 0; i < 64; i++)
        KT_EQ(kt_check(&r, back[i], SALT, l[i], 11), 0);
    kt_target_counters(&tg, &rc);
    KT_EQ(rc.drop_crc, 0);
    KT_EQ(rc.bytes_landed, 64 * BL);
    KT_EQ(rc.bytes_served, 64 * BL);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&tg), 0);
}

/* ---- receivers in this process, whose progress the test holds (no progress thread) ------ */

/* Drive a receiver without a progress thread for ms milliseconds. */
static void drive(kvx_transport_t *rx, uint64_t ms)
{
    uint64_t end = kt_now_ns() + ms * 1000000ull;
    kvx_completion_t c[4];

    while (kt_now_ns() < end) {
        KT_OK(kvx_transport_poll(rx, NULL, c, 4));
        usleep(100);
    }
}

/* Wait for transfer id of writer t while driving receiver rx; returns its status. */
static int wait_driving(kvx_transport_t *t, const char *peer, uint64_t id, kvx_transport_t *rx,
                        uint64_t *ms_p)
{
    uint64_t t0 = kt_now_ns(), end = t0 + 10000000000ull;
    kvx_completion_t c;

    for (;;) {
        int n = kvx_transport_poll(t, peer, &c, 1);
        KT_OK(n);
        if (n == 1)
            break;
        if (kt_now_ns() > end)
            KT_FAIL("transfer %llu: no completion in 10 s", (unsigned long long)id);
        if (rx != NULL)
            drive(rx, 1);
        else
            usleep(100);
    }
    KT_EQ(c.id, id);
    if (ms_p != NULL)
        *ms_p = (kt_now_ns() - t0) / 1000000ull;
    return c.status;
}

/* The blocks dst[i] of region rt hold (salt, src[i], round): the number that do not. */
static int check_blocks(const kt_region_t *rt, const uint32_t *dst, const uint32_t *src, size_t n,
                        uint64_t salt, uint64_t round)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += kt_check(rt, dst[i], salt, src[i], round) != 0;
    return bad;
}

/* Add rx (metadata md) to t as peer and wait until the connection is wired (rx driven). */
static void add_wired(kvx_transport_t *t, const char *peer, const uint8_t *md, size_t md_len,
                      kvx_transport_t *rx)
{
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
    uint32_t l = NB - 1, d = NB - 1;
    uint64_t id;

    KT_OK(kvx_peer_add(t, peer, md, md_len, NULL));
    /* a read completes only once the handshake is done */
    KT_OK(kvx_xfer_read(t, peer, &l, &d, 1, NULL, &id));
    KT_EQ(wait_driving(t, peer, id, rx, NULL), 0);
    KT_OK(kvx_peer_query(t, peer, &pa));
    KT_EQ(pa.state, KVX_PEER_CONNECTED);
}

/*
 * Tag fences fence exactly their tags, however many: with a receiver that holds its progress,
 * writes of tags 1, 500 and 1000000 wait unprocessed in its FIFO; 1,000 fences of tags 1..1000
 * follow (one tag each). The writes of tags 1 and 500 are refused (nothing of them lands), the
 * one of tag 1000000 lands byte for byte. (Before, fence records past 32 merged into a fence of
 * every tag, and the write of tag 1000000 failed too.)
 */
static void many_tag_fences(void)
{
    kt_region_t rt = kt_region_alloc(NB, BL);
    kvx_transport_t *rx = kt_transport(&rt, "many-target", 0);
    kvx_transport_t *t = writer("many-writer", 0, 1, 0);
    uint32_t l[3][2] = {{1, 2}, {3, 4}, {5, 6}}, d[3][2] = {{40, 41}, {50, 51}, {60, 61}};
    uint64_t tags[3] = {1, 500, 1000000}, ids[3];
    kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_RECV};
    uint8_t *md;
    size_t md_len;
    int st[3];

    kt_fill_all(&rt, 7, 0);
    md = kt_metadata(rx, &md_len);
    add_wired(t, "t", md, md_len, rx);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 2; k++)
            kt_fill(&r, l[i][k], SALT, l[i][k], 21);
        ids[i] = put(t, "t", l[i], d[i], 2, 0, tags[i], false);
    }
    usleep(50000); /* the writer's thread posted them: they wait in the receiver's FIFO */
    for (uint64_t tag = 1; tag <= 1000; tag++)
        KT_EQ(kvx_fence(rx, "many-writer", &tag, 1), 1);
    for (int i = 0; i < 3; i++)
        st[i] = wait_driving(t, "t", ids[i], rx, NULL);
    kt_log("after 1000 tag fences: tag 1 %s, tag 500 %s, tag 1000000 %s", kvx_strerror(st[0]),
           kvx_strerror(st[1]), kvx_strerror(st[2]));
    KT_ERR(st[0], -KVX_EFENCED);
    KT_ERR(st[1], -KVX_EFENCED);
    KT_EQ(st[2], 0);
    KT_EQ(check_blocks(&rt, d[2], l[2], 2, SALT, 21), 0);
    KT_EQ(check_blocks(&rt, d[0], d[0], 2, 7, 0), 0); /* nothing of the fenced ones landed */
    KT_EQ(check_blocks(&rt, d[1], d[1], 2, 7, 0), 0);
    KT_OK(kvx_transport_query(rx, &ta));
    KT_EQ(ta.recv.drop_fenced, 2);

    /* the bound: tags up to KVX_FENCE_WRITER_TAGS_MAX distinct ones are remembered; a fence of
     * one more fails with -ENOSPC and fences nothing (a write of that tag, waiting in the
     * receiver's FIFO, lands), while fences of tags already fenced still work */
    {
        uint64_t tg16[16], extra = 5000000, again = 1;
        uint64_t next = 1001;
        while (next <= KVX_FENCE_WRITER_TAGS_MAX) {
            size_t n = 0;
            while (n < 16 && next <= KVX_FENCE_WRITER_TAGS_MAX)
                tg16[n++] = next++;
            KT_EQ(kvx_fence(rx, "many-writer", tg16, n), 1);
        }
        drive(rx, 50); /* the fence notices go out */
        for (int k = 0; k < 2; k++)
            kt_fill(&r, l[0][k], SALT, l[0][k], 22);
        ids[0] = put(t, "t", l[0], d[0], 2, 0, extra, false);
        usleep(50000);
        KT_ERR(kvx_fence(rx, "many-writer", &extra, 1), -ENOSPC);
        KT_EQ(kvx_fence(rx, "many-writer", &again, 1), 1);
        KT_EQ(wait_driving(t, "t", ids[0], rx, NULL), 0);
        KT_EQ(check_blocks(&rt, d[0], l[0], 2, SALT, 22), 0);
        /* a fence of every tag frees the tag records: tag fences are possible again */
        KT_EQ(kvx_fence(rx, "many-writer", NULL, 0), 1);
        KT_EQ(kvx_fence(rx, "many-writer", &extra, 1), 1);
        KT_ERR(kvx_fence_ex(rx, "many-writer", &extra, 1, 2), -EINVAL);
    }
    free(md);
    kvx_transport_destroy(t);
    kvx_transport_destroy(rx);
    kt_region_free(&rt);
}

/*
 * A write in flight on a connection whose handshake the receiver has not processed yet. The
 * writer holds an older connection the receiver heard from ("old"), then adds the receiver
 * again ("new") while the receiver's progress is held: the HELLO waits in its FIFO, the peer is
 * KVX_PEER_WIRING, and a 16-block write waits behind the handshake. The receiver fences the
 * writer (the call fences "old": it returns 1), then progresses.
 *  - kvx_fence (the weaker form, documented): "new" is a connection the receiver had not heard
 *    from; its write lands in full after the fence and succeeds.
 *  - kvx_fence_ex with KVX_FENCE_RETIRE: the HELLO presents the retired capability and is
 *    refused with an answer: the write fails at once with -EKEYREVOKED and none of its 16
 *    blocks lands; the peer is FAILED with that error; the metadata changed; "old" keeps
 *    working, and so does another writer's connection made before; a re-add with the old
 *    metadata is refused the same way, and one with the new metadata writes, byte for byte.
 */
static void unheard_connection(bool retire)
{
    kt_region_t rt = kt_region_alloc(NB, BL);
    const char *wname = retire ? "retire-writer" : "weak-writer";
    kvx_transport_t *rx = kt_transport(&rt, retire ? "retire-target" : "weak-target", 0);
    kvx_transport_t *t = writer(wname, 0, 1, 0);
    kvx_transport_t *other = writer(retire ? "retire-bystander" : "weak-bystander", 0, 1, 0);
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE | KVX_PEER_ATTR_TRANSPORT};
    kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_RECV};
    uint32_t l[16], d[16], l2 = 40, d2 = 140;
    uint8_t *md, *md2;
    size_t md_len, md2_len;
    uint64_t id, ms;
    int st, landed;

    kt_fill_all(&rt, 8, 0);
    md = kt_metadata(rx, &md_len);
    for (uint32_t i = 0; i < 16; i++) {
        l[i] = 16 + i;
        d[i] = 100 + i;
        kt_fill(&r, l[i], SALT, l[i], 31);
    }
    kt_fill(&r, l2, SALT, l2, 32);
    add_wired(t, "old", md, md_len, rx);
    add_wired(other, "rx", md, md_len, rx); /* another writer, connected before the fence */
    KT_OK(kvx_peer_query(t, "old", &pa));
    kt_log("unheard connection: over %s", pa.transport);
    KT_CHECK(getenv("UCX_TLS") == NULL || strncmp(pa.transport, "tcp", 3) == 0);
    KT_OK(kvx_peer_add(t, "new", md, md_len, NULL)); /* the receiver does not answer in 200 ms */
    KT_OK(kvx_peer_query(t, "new", &pa));
    KT_EQ(pa.state, KVX_PEER_WIRING);
    id = put(t, "new", l, d, 16, 0, 0, false);
    usleep(20000);
    KT_EQ(kvx_fence_ex(rx, wname, NULL, 0, retire ? KVX_FENCE_RETIRE : 0), 1);
    st = wait_driving(t, "new", id, rx, &ms);
    drive(rx, 200);
    landed = check_blocks(&rt, d, d, 16, 8, 0); /* blocks no longer the original */
    KT_EQ(check_blocks(&rt, d, l, 16, SALT, 31), retire ? 16 : 0);
    kt_log("%s: the write on a connection the receiver had not heard from: %s after %llu ms, "
           "%d of 16 blocks landed",
           retire ? "kvx_fence_ex(RETIRE)" : "kvx_fence", kvx_strerror(st), (unsigned long long)ms,
           landed);
    if (!retire) {
        KT_EQ(st, 0);
        KT_EQ(landed, 16);
        goto out;
    }
    KT_ERR(st, -EKEYREVOKED);
    KT_EQ(landed, 0);
    KT_CHECK(ms < 1000); /* an answer, not a timeout */
    pa.field_mask = KVX_PEER_ATTR_STATE;
    KT_OK(kvx_peer_query(t, "new", &pa));
    KT_EQ(pa.state, KVX_PEER_FAILED);
    KT_ERR(pa.error, -EKEYREVOKED);
    KT_OK(kvx_transport_query(rx, &ta));
    KT_EQ(ta.recv.drop_capability, 1);
    md2 = kt_metadata(rx, &md2_len);
    KT_EQ(md2_len, md_len);
    KT_CHECK(memcmp(md, md2, md_len) != 0);
    /* the connection made before stays (it heard of the fence: its next write lands), and so
     * does the other writer's, unfenced */
    id = put(t, "old", &l2, &d2, 1, 0, 0, false);
    KT_EQ(wait_driving(t, "old", id, rx, NULL), 0);
    KT_EQ(kt_check(&rt, d2, SALT, l2, 32), 0);
    kt_fill(&r, l2, SALT, l2, 33);
    id = put(other, "rx", &l2, &d2, 1, 0, 0, false);
    KT_EQ(wait_driving(other, "rx", id, rx, NULL), 0);
    KT_EQ(kt_check(&rt, d2, SALT, l2, 33), 0);
    /* the old metadata is refused for good; the new one works */
    KT_OK(kvx_peer_add(t, "new", md, md_len, NULL));
    id = put(t, "new", l, d, 16, 0, 0, false);
    KT_ERR(wait_driving(t, "new", id, rx, &ms), -EKEYREVOKED);
    KT_CHECK(ms < 1000);
    KT_EQ(check_blocks(&rt, d, d, 16, 8, 0), 0);
    add_wired(t, "new", md2, md2_len, rx);
    id = put(t, "new", l, d, 16, 0, 0, false);
    KT_EQ(wait_driving(t, "new", id, rx, NULL), 0);
    KT_EQ(check_blocks(&rt, d, l, 16, SALT, 31), 0);
    KT_OK(kvx_transport_query(rx, &ta));
    KT_EQ(ta.recv.drop_capability, 2);
    free(md2);
out:
    free(md);
    kvx_transport_destroy(other);
    kvx_transport_destroy(t);
    kvx_transport_destroy(rx);
    kt_region_free(&rt);
}

/* A thread that drives a receiver without a progress thread (run 1), holds it (run 0), or, with
 * hold_answered, drives it until its listener's answer to a pairing has left, then holds. */
static struct {
    kvx_transport_t *rx;
    atomic_int run, hold_answered, quit;
} drv;

static bool answer_gone(kvx_transport_t *rx)
{
    bool gone = false;

    kvx_lock(&rx->core);
    for (kvx_list_t *n = rx->peers.pairings.next; n != &rx->peers.pairings; n = n->next) {
        kvx_pairing_t *pg = kvx_container_of(n, kvx_pairing_t, link);
        gone |= pg->accepted && pg->answered && pg->refs == 0;
    }
    kvx_unlock(&rx->core);
    return gone;
}

static void *driver(void *arg)
{
    (void)arg;
    while (!atomic_load(&drv.quit)) {
        if (atomic_load(&drv.run)) {
            kvx_completion_t c[4];
            KT_OK(kvx_transport_poll(drv.rx, NULL, c, 4));
            if (atomic_load(&drv.hold_answered) && answer_gone(drv.rx)) {
                atomic_store(&drv.run, 0);
                atomic_store(&drv.hold_answered, 0);
            }
        }
        usleep(50);
    }
    return NULL;
}

static struct {
    kvx_transport_t *t;
    const char *addr;
    int rc;
} conn_call;

static void *connect_thread(void *arg)
{
    (void)arg;
    conn_call.rc = kvx_peer_connect(conn_call.t, "p", conn_call.addr, NULL);
    return NULL;
}

/*
 * A peer paired by address whose handshake the receiver had not processed when it retired its
 * capability: the listener answered the pairing with the old metadata, then the receiver's
 * progress is held, so the HELLO waits (KVX_PEER_WIRING) with a write behind it. After
 * kvx_fence_ex(RETIRE) the receiver resumes: the HELLO is refused, the write fails with
 * -EKEYREVOKED and none of it lands (it is not kept for the next connection: it was submitted
 * before the fence), and the peer pairs again by itself, gets the new metadata from the
 * listener (events DOWN -EKEYREVOKED, then RECONNECTED) and its next write lands.
 */
static void paired_retire(void)
{
    kt_region_t rt = kt_region_alloc(NB, BL);
    kvx_transport_t *rx = kt_transport(&rt, "paired-target", 0);
    kvx_transport_t *t = writer("paired-writer", 0, 1, 0);
    kvx_transport_attr_t la = {.field_mask = KVX_TRANSPORT_ATTR_LISTEN};
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
    kvx_peer_event_t ev[8];
    pthread_t drv_th, conn_th;
    uint32_t l[8], d[8];
    uint8_t *md0, *md1;
    size_t md0_len, md1_len;
    uint64_t id;
    int st, nev = 0;

    kt_fill_all(&rt, 9, 0);
    for (uint32_t i = 0; i < 8; i++) {
        l[i] = 64 + i;
        d[i] = 160 + i;
        kt_fill(&r, l[i], SALT, l[i], 41);
    }
    KT_OK(kvx_transport_listen(rx, "127.0.0.1:0"));
    KT_OK(kvx_transport_query(rx, &la));
    md0 = kt_metadata(rx, &md0_len);
    drv.rx = rx;
    atomic_store(&drv.quit, 0);
    atomic_store(&drv.hold_answered, 1);
    atomic_store(&drv.run, 1);
    KT_CHECK(pthread_create(&drv_th, NULL, driver, NULL) == 0);
    conn_call.t = t;
    conn_call.addr = la.listen_addr;
    KT_CHECK(pthread_create(&conn_th, NULL, connect_thread, NULL) == 0);
    pthread_join(conn_th, NULL);
    KT_OK(conn_call.rc);
    KT_EQ(atomic_load(&drv.run), 0); /* held since the answer left */
    KT_OK(kvx_peer_query(t, "p", &pa));
    KT_EQ(pa.state, KVX_PEER_WIRING);
    id = put(t, "p", l, d, 8, 0, 0, false);
    usleep(20000);
    KT_EQ(kvx_fence_ex(rx, NULL, NULL, 0, KVX_FENCE_RETIRE), 0); /* nothing it heard of */
    md1 = kt_metadata(rx, &md1_len);
    KT_CHECK(md1_len == md0_len && memcmp(md0, md1, md0_len) != 0);
    atomic_store(&drv.run, 1);
    st = wait_one(t, "p", id);
    kt_log("paired by address, the HELLO refused: the write %s", kvx_strerror(st));
    KT_ERR(st, -EKEYREVOKED);
    /* it pairs again by itself, with the new metadata */
    for (uint64_t end = kt_now_ns() + 10000000000ull; nev < 2 && kt_now_ns() < end;) {
        int n = kvx_peer_event_poll(t, ev + nev, 8 - (size_t)nev);
        KT_OK(n);
        nev += n;
        usleep(1000);
    }
    KT_EQ(nev, 2);
    KT_EQ(ev[0].type, KVX_PEER_EVENT_DOWN);
    KT_ERR(ev[0].error, -EKEYREVOKED);
    KT_EQ(ev[1].type, KVX_PEER_EVENT_RECONNECTED);
    KT_EQ(check_blocks(&rt, d, d, 8, 9, 0), 0); /* nothing of the refused write landed */
    id = put(t, "p", l, d, 8, 0, 0, false);
    KT_EQ(wait_one(t, "p", id), 0);
    KT_EQ(check_blocks(&rt, d, l, 8, SALT, 41), 0);
    /* a receiver that answers within the add's wait: the add itself fails, nothing added */
    KT_ERR(kvx_peer_add(t, "q", md0, md0_len, NULL), -EKEYREVOKED);
    KT_ERR(kvx_peer_query(t, "q", &pa), -ENOENT);
    KT_OK(kvx_peer_add(t, "q", md1, md1_len, NULL));
    atomic_store(&drv.quit, 1);
    pthread_join(drv_th, NULL);
    free(md0);
    free(md1);
    kvx_transport_destroy(t);
    kvx_transport_destroy(rx);
    kt_region_free(&rt);
}

/*
 * The bound over every writer: 17 writers connected, fences of 16 new tags each for every
 * writer (writer NULL) add 272 records per call; the call that would pass
 * KVX_FENCE_TOTAL_TAGS_MAX fails with -ENOSPC and fences no writer (each writer is still below
 * its own bound), while one writer's 16 tags still fit; a fence of every tag of every writer
 * frees the records.
 */
static void total_tag_bound(void)
{
    enum { NW = 17 };
    kt_region_t rt = kt_region_alloc(NB, BL);
    kvx_transport_t *rx = kt_transport(&rt, "bound-target", 0), *w[NW];
    uint8_t *md = NULL;
    size_t md_len, calls = 0;
    uint64_t tags[16], next = 1;
    int rc;

    md = kt_metadata(rx, &md_len);
    for (int i = 0; i < NW; i++) {
        char name[32];
        snprintf(name, sizeof(name), "bound-writer-%d", i);
        w[i] = writer(name, 0, 0, 0);
        add_wired(w[i], "t", md, md_len, rx);
    }
    for (;;) {
        for (int k = 0; k < 16; k++)
            tags[k] = next + (uint64_t)k;
        rc = kvx_fence(rx, NULL, tags, 16);
        if (rc < 0)
            break;
        KT_EQ(rc, NW);
        next += 16;
        calls++;
    }
    kt_log("tag fences of every writer: %zu calls of 16 tags x %d writers, then %s", calls, NW,
           kvx_strerror(rc));
    KT_ERR(rc, -ENOSPC);
    KT_EQ(calls, KVX_FENCE_TOTAL_TAGS_MAX / (16 * NW));
    KT_EQ(rx->recv.conns.nftags, calls * 16 * NW); /* nothing of the refused call was recorded */
    /* one writer's 16 still fit (208 records were left) */
    KT_EQ(kvx_fence(rx, "bound-writer-0", tags, 16), 1);
    KT_EQ(rx->recv.conns.nftags, calls * 16 * NW + 16);
    KT_EQ(kvx_fence(rx, NULL, NULL, 0), NW);
    KT_EQ(rx->recv.conns.nftags, 0);
    KT_EQ(kvx_fence(rx, NULL, tags, 16), NW);
    for (int i = 0; i < NW; i++)
        kvx_transport_destroy(w[i]);
    free(md);
    kvx_transport_destroy(rx);
    kt_region_free(&rt);
}

/* A transport with the shared secret "fence-secret" (threads: progress threads). */
static kvx_transport_t *with_secret(const kt_region_t *rg, const char *name, unsigned threads)
{
    kvx_transport_t *t;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME |
                                    KVX_PARAM_NUM_THREADS | KVX_PARAM_SECRET,
                      .base = rg->base,
                      .num_blocks = rg->num_blocks,
                      .block_len = rg->block_len,
                      .agent_name = name,
                      .num_threads = threads,
                      .secret = "fence-secret",
                      .secret_len = 12};
    kt_rndv_params(&p);
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}

/* With a shared secret: the HELLO of the retired capability proves the secret and is refused
 * all the same; the new metadata is signed (an add with it passes the signature check). */
static void unheard_secret(void)
{
    kt_region_t rt = kt_region_alloc(NB, BL);
    kvx_transport_t *rx = with_secret(&rt, "secret-target", 0);
    kvx_transport_t *t = with_secret(&r, "secret-writer", 1);
    uint32_t l[4] = {90, 91, 92, 93}, d[4] = {200, 201, 202, 203};
    uint8_t *md, *md2;
    size_t md_len, md2_len;
    uint64_t id;

    kt_fill_all(&rt, 10, 0);
    for (int i = 0; i < 4; i++)
        kt_fill(&r, l[i], SALT, l[i], 51);
    md = kt_metadata(rx, &md_len);
    KT_OK(kvx_peer_add(t, "s", md, md_len, NULL));
    id = put(t, "s", l, d, 4, 0, 0, false);
    usleep(20000);
    KT_EQ(kvx_fence_ex(rx, NULL, NULL, 0, KVX_FENCE_RETIRE), 0);
    KT_ERR(wait_driving(t, "s", id, rx, NULL), -EKEYREVOKED);
    KT_EQ(check_blocks(&rt, d, d, 4, 10, 0), 0);
    md2 = kt_metadata(rx, &md2_len);
    KT_CHECK(md2_len == md_len && memcmp(md, md2, md_len) != 0);
    add_wired(t, "s", md2, md2_len, rx);
    id = put(t, "s", l, d, 4, 0, 0, false);
    KT_EQ(wait_driving(t, "s", id, rx, NULL), 0);
    KT_EQ(check_blocks(&rt, d, l, 4, SALT, 51), 0);
    free(md);
    free(md2);
    kvx_transport_destroy(t);
    kvx_transport_destroy(rx);
    kt_region_free(&rt);
}

int main(int argc, char **argv)
{
    r = kt_region_alloc(NB, BL);
    kt_fill_all(&r, SALT, 0);
    if (argc > 1 && strcmp(argv[1], "unheard-tcp") == 0) {
        /* the same over tcp alone (the HELLO waits in UCX, not in a FIFO) */
        setenv("UCX_TLS", "tcp", 1);
        unheard_connection(false);
        unheard_connection(true);
        paired_retire();
        kt_region_free(&r);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "late") == 0) { /* this alone, for repeated runs */
        late_writes();
        kt_region_free(&r);
        return 0;
    }
    unheard_connection(false);
    unheard_connection(true);
    paired_retire();
    unheard_secret();
    if (argc > 1 && strcmp(argv[1], "unheard") == 0) { /* these alone, for repeated runs */
        kt_region_free(&r);
        return 0;
    }
    many_tag_fences();
    total_tag_bound();
    fence_tags_and_notices();
    no_notice_for_failures();
    integrity();
    late_writes();
    kt_region_free(&r);
    return 0;
}
