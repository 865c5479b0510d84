/*
 * The receiving side in charge of its region, over shared memory, every block verified:
 *  - late writes: 100 connections (10 rounds of 10) each have writes queued to a SIGSTOPped
 *    receiver; they fail by deadline; the receiver resumes and fences the writer; the writer
 *    rewrites the same blocks over a new connection; 2 s later every block holds the new data;
 *  - fence semantics: on a receiver whose messages wait unprocessed (no progress thread), a fence
 *    of one tag drops the queued write of that tag (its writer sees -KVX_EFENCED) and lets the
 *    other tag's land; the writer's next write of the fenced tag lands without a re-add;
 *  - arrival notices: one per write sent with KVX_XFER_NOTIFY, after all of its blocks landed,
 *    with its tag, block and byte counts; none for a write that failed or was fenced;
 *  - integrity: with CRC-32C on, writes and reads move every byte and nothing is refused.
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define BL 4096
#define NB 256
#define SALT 0x51

static kt_region_t r;

static kvx_transport_t *writer(const char *name, int integrity)
{
    kvx_transport_t *t;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_INTEGRITY,
                      .base = r.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .agent_name = name,
                      .integrity = integrity};
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

/* 10 rounds of 10 connections: writes queued to a stopped receiver fail by deadline; it
 * resumes and fences; new writes over new connections; 2 s later only the new data is there. */
static void late_writes(void)
{
    kt_target_args_t a = {.num_blocks = NB, .block_len = BL, .salt = 3, .threads = 1};
    kt_target_t tg;
    kvx_transport_t *t = writer("late-writer", 0);
    kvx_recv_counters_t rc;
    uint64_t stale = 0;

    a.name = "late-target";
    tg = kt_target_start(&a);
    for (int round = 0; round < 10; round++) {
        uint64_t ids[10];
        char peer[10][8];
        uint32_t old_l[10][4], new_l[10][4], dst[10][4];

        /* old data in local blocks 0..39, new data in 40..79, both to remote S_i */
        for (int i = 0; i < 10; i++)
            for (int k = 0; k < 4; k++) {
                old_l[i][k] = (uint32_t)(i * 4 + k);
                new_l[i][k] = (uint32_t)(40 + i * 4 + k);
                dst[i][k] = (uint32_t)(100 + i * 4 + k);
                kt_fill(&r, old_l[i][k], SALT, old_l[i][k], 2ull * round + 1);
                kt_fill(&r, new_l[i][k], SALT, new_l[i][k], 2ull * round + 2);
            }
        for (int i = 0; i < 10; i++) {
            snprintf(peer[i], sizeof(peer[i]), "a%d", i);
            KT_OK(kvx_peer_add(t, peer[i], tg.md, tg.md_len, NULL));
        }
        kt_stop(&tg.proc);
        for (int i = 0; i < 10; i++)
            ids[i] = put(t, peer[i], old_l[i], dst[i], 4, 100, 0, false);
        for (int i = 0; i < 10; i++)
            KT_ERR(wait_one(t, peer[i], ids[i]), -ETIMEDOUT);
        kt_cont(&tg.proc);
        KT_CHECK(kt_target_fence(&tg, "late-writer", NULL, 0) >= 10);
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
    kt_log("late writes: 100 runs, %llu stale blocks; the receiver dropped %llu fenced messages",
           (unsigned long long)stale, (unsigned long long)rc.drop_fenced);
    KT_EQ(stale, 0);
    /* the stopped receiver's FIFO held the failed writes and the fence dropped them. (Over shared
     * memory they would not have been stale without it either: the FIFO hands them over before
     * the rewrite. Over tcp they can be: test_linkcut.c, whose control run shows it.) */
    KT_CHECK(rc.drop_fenced > 0);
    KT_EQ(kt_target_canaries(&tg), 0);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&tg), 0);
}

/* A receiver without a progress thread: writes wait in its FIFO until it polls, so a fence
 * surely comes before they are looked at. */
static void fence_tags_and_notices(void)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 4, .threads = 0, .name = "lazy-target"};
    kt_target_t tg = kt_target_start(&a);
    kvx_transport_t *t = writer("tagged-writer", 0);
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
    kvx_transport_t *t = writer("failing-writer", 0);
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
    kvx_transport_t *t = writer("crc-writer", 1);
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

int main(void)
{
    r = kt_region_alloc(NB, BL);
    kt_fill_all(&r, SALT, 0);
    fence_tags_and_notices();
    no_notice_for_failures();
    integrity();
    late_writes();
    kt_region_free(&r);
    return 0;
}
