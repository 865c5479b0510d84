/*
 * Transfer priorities (kvx_xfer_params_t.priority) between two processes over real UCX, every
 * byte checked. argv[1] names the transport ("shm" or "tcp"); argv[2] "rndv": every run goes by
 * rendezvous (KT_RNDV=always, both sides), where a read's bytes count as arrived only once its
 * receives end.
 *  - order: an urgent (KVX_PRIO_HIGH) write or read submitted after four large KVX_PRIO_LOW ones
 *    to the same peer completes before every one of them; the same transfers without
 *    priorities complete in submission order (so the check can tell the two apart);
 *  - no starvation: one KVX_PRIO_LOW write and one read finish while KVX_PRIO_HIGH writes
 *    (reads) keep the high level's queue full all along;
 *  - as without priorities: cancel of a low transfer queued behind high ones, a deadline missed
 *    by a low one, a fence, and a peer killed with transfers of every level in flight.
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

#define BLOCK ((uint64_t)64 * 1024)
#define NBLOCKS 1536u /* 96 MiB: four bulk ranges of 256 blocks, then urgent slots */
#define BULK 256u     /* blocks per bulk transfer (16 MiB) */
#define URGENT 1024u  /* first urgent block */
#define SALT 0x51

static const char *want_tl;

static kvx_xfer_params_t prio(unsigned level)
{
    return (kvx_xfer_params_t){.field_mask = KVX_XFER_PARAM_PRIORITY, .priority = level};
}

static void seq(uint32_t *out, uint32_t first, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = first + i;
}

/* Reads land in blocks the test zeroed: check each against the target's pattern. */
static void check_read(const kt_region_t *r, uint32_t first, uint32_t n, uint64_t round)
{
    for (uint32_t i = 0; i < n; i++)
        if (kt_check(r, first + i, 0x7a, first + i, round) != 0)
            KT_FAIL("read block %u wrong", first + i);
}

static void zero(const kt_region_t *r, uint32_t first, uint32_t n)
{
    memset(r->base + (uint64_t)first * r->block_len, 0, (uint64_t)n * r->block_len);
}

static uint64_t xfers_done(kvx_transport_t *t)
{
    kvx_peer_attr_t a = {.field_mask = KVX_PEER_ATTR_COUNTERS};

    KT_OK(kvx_peer_query(t, "target", &a));
    return a.xfers_done;
}

/* Four bulk transfers of BULK blocks (low priority, or the default), then one urgent block
 * (high, or the default). Returns the urgent one's place among the five completions (0: first);
 * *early: the transfers done by the time the urgent submit returned (a descheduled test may let
 * the first bulk one finish before the urgent one is even submitted). */
static int order_once(kvx_transport_t *t, kt_target_t *tg, kt_region_t *r, bool read,
                      bool priorities, uint64_t *early)
{
    uint32_t idx[BULK];
    uint64_t ids[5];
    kvx_xfer_params_t lo = prio(KVX_PRIO_LOW), hi = prio(KVX_PRIO_HIGH);
    kvx_completion_t c[5];
    int place = -1;

    if (read) {
        kt_target_refill(tg, 0);
        zero(r, 0, NBLOCKS);
    }
    *early = xfers_done(t);
    for (int i = 0; i < 4; i++) {
        seq(idx, (uint32_t)i * BULK, BULK);
        KT_OK(read ? kvx_xfer_read(t, "target", idx, idx, BULK, priorities ? &lo : NULL, &ids[i])
                   : kvx_xfer_write(t, "target", idx, idx, BULK, priorities ? &lo : NULL, &ids[i]));
    }
    seq(idx, URGENT, 1);
    KT_OK(read ? kvx_xfer_read(t, "target", idx, idx, 1, priorities ? &hi : NULL, &ids[4])
               : kvx_xfer_write(t, "target", idx, idx, 1, priorities ? &hi : NULL, &ids[4]));
    *early = xfers_done(t) - *early;
    KT_EQ(kt_poll_n(t, "target", c, 5, 30000), 5);
    for (int i = 0; i < 5; i++) {
        KT_EQ(c[i].status, 0);
        KT_EQ(c[i].bytes, (c[i].id == ids[4] ? 1 : BULK) * BLOCK);
        if (c[i].id == ids[4])
            place = i;
    }
    KT_CHECK(place >= 0);
    if (read) {
        check_read(r, 0, 4 * BULK, 0);
        check_read(r, URGENT, 1, 0);
    } else {
        for (uint32_t i = 0; i < 4; i++) {
            seq(idx, i * BULK, BULK);
            KT_EQ(kt_target_verify(tg, idx, idx, BULK, SALT, 0), 0);
        }
        seq(idx, URGENT, 1);
        KT_EQ(kt_target_verify(tg, idx, idx, 1, SALT, 0), 0);
    }
    return place;
}

static void test_order(kvx_transport_t *t, kt_target_t *tg, kt_region_t *r)
{
    for (int read = 0; read < 2; read++) {
        uint64_t early = 0, unused;
        int with = -1, without, round = 0;
        /* it may follow only transfers done before it was submitted; a round in which none was
         * (one of at most 5) must see it first */
        while (round++ < 5) {
            with = order_once(t, tg, r, read, true, &early);
            KT_CHECK((uint64_t)with <= early);
            if (early == 0)
                break;
        }
        KT_EQ(early, 0);
        without = order_once(t, tg, r, read, false, &unused);
        kt_log("order (%s): the urgent one completed %d of 5 with priorities (round %d), %d of 5 "
               "without",
               read ? "reads" : "writes", with + 1, round, without + 1);
        KT_EQ(with, 0);
        /* in submission order the urgent one waits for the four before it */
        KT_EQ(without, 4);
    }
}

/* A steady stream of high transfers (four of BULK/2 blocks in flight, each resubmitted on
 * completion, so the high queue never empties) and one low transfer of BULK blocks: the low one
 * finishes while the stream runs. */
static void test_no_starvation(kvx_transport_t *t, kt_target_t *tg, kt_region_t *r, bool read)
{
    uint32_t idx[BULK];
    uint64_t hid[4], lid, t0 = kt_now_ns(), highs = 0, highs_before = 0;
    kvx_xfer_params_t lo = prio(KVX_PRIO_LOW), hi = prio(KVX_PRIO_HIGH);
    kvx_completion_t c[8];
    bool low_done = false;

    if (read) {
        kt_target_refill(tg, 0);
        zero(r, 0, NBLOCKS);
    }
    /* the stream: blocks [0, 2 * BULK), four slots of BULK/2 */
    for (uint32_t s = 0; s < 4; s++) {
        seq(idx, s * (BULK / 2), BULK / 2);
        KT_OK(read ? kvx_xfer_read(t, "target", idx, idx, BULK / 2, &hi, &hid[s])
                   : kvx_xfer_write(t, "target", idx, idx, BULK / 2, &hi, &hid[s]));
    }
    seq(idx, 2 * BULK, BULK); /* the low one: blocks [2 * BULK, 3 * BULK) */
    KT_OK(read ? kvx_xfer_read(t, "target", idx, idx, BULK, &lo, &lid)
               : kvx_xfer_write(t, "target", idx, idx, BULK, &lo, &lid));
    while (!low_done) {
        int n = kvx_transport_poll(t, "target", c, 8);
        KT_CHECK(n >= 0);
        if (kt_now_ns() - t0 > 30000000000ull)
            KT_FAIL("the low transfer did not finish in 30 s under the high stream (%llu highs)",
                    (unsigned long long)highs);
        for (int i = 0; i < n; i++) {
            KT_EQ(c[i].status, 0);
            if (c[i].id == lid) {
                KT_EQ(c[i].bytes, BULK * BLOCK);
                low_done = true;
                highs_before = highs;
                continue;
            }
            for (uint32_t s = 0; s < 4; s++)
                if (c[i].id == hid[s]) {
                    KT_EQ(c[i].bytes, BULK / 2 * BLOCK);
                    highs++;
                    seq(idx, s * (BULK / 2), BULK / 2);
                    KT_OK(read ? kvx_xfer_read(t, "target", idx, idx, BULK / 2, &hi, &hid[s])
                               : kvx_xfer_write(t, "target", idx, idx, BULK / 2, &hi, &hid[s]));
                }
        }
    }
    /* drain the stream (the four in flight), then check every byte */
    KT_EQ(kt_poll_n(t, "target", c, 4, 30000), 4);
    for (int i = 0; i < 4; i++)
        KT_EQ(c[i].status, 0);
    kt_log("no starvation (%s): the low one (16 MiB) finished after %.1f ms, while %llu high "
           "ones of 8 MiB completed, four kept in flight",
           read ? "reads" : "writes", (kt_now_ns() - t0) / 1e6, (unsigned long long)highs_before);
    /* it shared the lane: the stream kept going while it moved (a low transfer served only once
     * the stream stopped would see every high one of the run before it) */
    KT_CHECK(highs_before >= 1);
    /* and got its share: 1/17 of the bytes while both levels were queued, so about 32 high ones
     * of 8 MiB (256 MiB) for its 16 MiB; a low transfer served only in the stream's gaps would
     * need far more */
    KT_CHECK(highs_before <= 96);
    if (read) {
        check_read(r, 0, 3 * BULK, 0);
    } else {
        for (uint32_t i = 0; i < 3; i++) {
            seq(idx, i * BULK, BULK);
            KT_EQ(kt_target_verify(tg, idx, idx, BULK, SALT, 0), 0);
        }
    }
}

/* Cancel and deadline, as without priorities. */
static void test_cancel_deadline(kvx_transport_t *t, kt_target_t *tg)
{
    uint32_t idx[BULK];
    uint64_t hid[2], lid, pending[1];
    kvx_xfer_params_t lo = prio(KVX_PRIO_LOW), hi = prio(KVX_PRIO_HIGH);
    kvx_xfer_params_t lo_dl = {.field_mask = KVX_XFER_PARAM_PRIORITY | KVX_XFER_PARAM_DEADLINE,
                               .priority = KVX_PRIO_LOW,
                               .deadline_ms = 1};
    kvx_completion_t c[4];
    int np;

    /* cancel: a low write queued behind two high ones is forgotten or reported -ECANCELED; the
     * high ones land in full */
    for (uint32_t s = 0; s < 2; s++) {
        seq(idx, s * BULK, BULK);
        KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, &hi, &hid[s]));
    }
    seq(idx, 2 * BULK, BULK);
    KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, &lo, &lid));
    np = kvx_xfer_cancel(t, &lid, 1, KVX_CANCEL_WAIT, pending);
    KT_CHECK(np == 0 || np == 1);
    KT_EQ(kt_poll_n(t, "target", c, 2 + np, 30000), 2 + np);
    for (int i = 0; i < 2 + np; i++) {
        if (c[i].id == lid) {
            KT_EQ(c[i].status, -ECANCELED);
            continue;
        }
        KT_CHECK(c[i].id == hid[0] || c[i].id == hid[1]);
        KT_EQ(c[i].status, 0);
    }
    for (uint32_t s = 0; s < 2; s++) {
        seq(idx, s * BULK, BULK);
        KT_EQ(kt_target_verify(tg, idx, idx, BULK, SALT, 0), 0);
    }
    kt_log("cancel: the low write behind two high ones %s",
           np ? "was reported -ECANCELED" : "was forgotten at once");

    /* cancel in mid-stream: a low write alone, canceled once some of it went; what it had in
     * flight leaves the low level's window, and later low writes of 16 MiB land in full */
    seq(idx, 0, BULK);
    KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, &lo, &lid));
    {
        uint64_t until = kt_now_ns() + 2000000ull;
        while (kt_now_ns() < until)
            KT_CHECK(kvx_transport_poll(t, "target", c, 0) >= 0);
    }
    np = kvx_xfer_cancel(t, &lid, 1, KVX_CANCEL_WAIT, pending);
    KT_CHECK(np == 0 || np == 1);
    if (np == 1) {
        KT_EQ(kt_poll_n(t, "target", c, 1, 30000), 1);
        KT_EQ(c[0].id, lid);
        KT_CHECK(c[0].status == -ECANCELED || c[0].status == 0);
    }
    for (int k = 0; k < 3; k++) {
        seq(idx, (uint32_t)(k % 2) * BULK, BULK);
        KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, &lo, &lid));
        KT_EQ(kt_poll_n(t, "target", c, 1, 30000), 1);
        KT_EQ(c[0].status, 0);
        KT_EQ(kt_target_verify(tg, idx, idx, BULK, SALT, 0), 0);
    }

    /* deadline: a low write of 16 MiB with a 1 ms deadline behind two high ones of 16 MiB fails
     * with -ETIMEDOUT; the high ones land */
    for (uint32_t s = 0; s < 2; s++) {
        seq(idx, s * BULK, BULK);
        KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, &hi, &hid[s]));
    }
    seq(idx, 2 * BULK, BULK);
    KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, &lo_dl, &lid));
    KT_EQ(kt_poll_n(t, "target", c, 3, 30000), 3);
    for (int i = 0; i < 3; i++)
        KT_EQ(c[i].status, c[i].id == lid ? -ETIMEDOUT : 0);
    for (uint32_t s = 0; s < 2; s++) {
        seq(idx, s * BULK, BULK);
        KT_EQ(kt_target_verify(tg, idx, idx, BULK, SALT, 0), 0);
    }
}

/* A fence of this writer: a high and a low write submitted after it land in full, whatever
 * their level (they carry the new epoch). */
static void test_fence(kvx_transport_t *t, kt_target_t *tg)
{
    uint32_t idx[BULK];
    uint64_t id[2];
    kvx_xfer_params_t lo = prio(KVX_PRIO_LOW), hi = prio(KVX_PRIO_HIGH);
    kvx_completion_t c[2];

    kt_target_refill(tg, 1);
    {
        uint64_t ids[3];
        int fenced = 0;
        for (uint32_t s = 0; s < 3; s++) {
            seq(idx, s * BULK, BULK);
            KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, s < 2 ? &hi : &lo, &ids[s]));
        }
        KT_OK(kt_target_fence(tg, NULL, NULL, 0));
        KT_EQ(kt_poll_n(t, "target", c, 2, 30000), 2);
        {
            kvx_completion_t c3;
            KT_EQ(kt_poll_n(t, "target", &c3, 1, 30000), 1);
            for (int i = 0; i < 3; i++) {
                const kvx_completion_t *ci = i < 2 ? &c[i] : &c3;
                uint32_t s = ci->id == ids[0] ? 0 : ci->id == ids[1] ? 1 : 2;
                KT_CHECK(ci->status == 0 || ci->status == -KVX_EFENCED);
                fenced += ci->status != 0;
                if (ci->status == 0) { /* landed: every byte */
                    seq(idx, s * BULK, BULK);
                    KT_EQ(kt_target_verify(tg, idx, idx, BULK, SALT, 0), 0);
                }
            }
        }
        kt_log("fence: %d of the three writes in flight (two high, one low) were fenced", fenced);
    }
    kt_target_refill(tg, 1);
    KT_OK(kt_target_fence(tg, NULL, NULL, 0));
    /* the fence's news reaches this side with the target's next message: let it come */
    {
        uint64_t until = kt_now_ns() + 200000000ull;
        while (kt_now_ns() < until)
            KT_CHECK(kvx_transport_poll(t, NULL, c, 0) >= 0);
    }
    seq(idx, 0, BULK);
    KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, &lo, &id[0]));
    seq(idx, URGENT, 1);
    KT_OK(kvx_xfer_write(t, "target", idx, idx, 1, &hi, &id[1]));
    KT_EQ(kt_poll_n(t, "target", c, 2, 30000), 2);
    KT_EQ(c[0].status, 0);
    KT_EQ(c[1].status, 0);
    KT_EQ(c[0].id, id[1]); /* the urgent one first, after a fence as before it */
    seq(idx, 0, BULK);
    KT_EQ(kt_target_verify(tg, idx, idx, BULK, SALT, 0), 0);
    seq(idx, URGENT, 1);
    KT_EQ(kt_target_verify(tg, idx, idx, 1, SALT, 0), 0);
}

/* A dead peer: the target stopped, then killed, with a low, a normal and a high write and a high
 * read in flight: all four fail, none hangs. */
static void test_dead_peer(kvx_transport_t *t, kt_target_t *tg)
{
    uint32_t idx[BULK];
    uint64_t id[4];
    kvx_xfer_params_t lo = prio(KVX_PRIO_LOW), hi = prio(KVX_PRIO_HIGH);
    kvx_completion_t c[4];

    kt_stop(&tg->proc);
    seq(idx, 0, BULK);
    KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, &lo, &id[0]));
    seq(idx, BULK, BULK);
    KT_OK(kvx_xfer_write(t, "target", idx, idx, BULK, NULL, &id[1]));
    seq(idx, URGENT, 1);
    KT_OK(kvx_xfer_write(t, "target", idx, idx, 1, &hi, &id[2]));
    seq(idx, URGENT + 1, 1);
    KT_OK(kvx_xfer_read(t, "target", idx, idx, 1, &hi, &id[3]));
    kt_kill(&tg->proc, SIGKILL);
    KT_EQ(kt_poll_n(t, "target", c, 4, 30000), 4);
    for (int i = 0; i < 4; i++) {
        KT_CHECK(c[i].status < 0);
        kt_log("dead peer: transfer %llu failed with %s", (unsigned long long)c[i].id,
               kvx_strerror(c[i].status));
    }
}

int main(int argc, char **argv)
{
    const char *tl = argc > 1 ? argv[1] : "shm";
    kvx_transport_t *t;
    kt_region_t r;
    kt_target_t tg;
    kt_target_args_t ta = {.num_blocks = NBLOCKS, .block_len = BLOCK, .salt = 0x7a, .threads = 1};
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};
    kvx_xfer_params_t bad = {.field_mask = KVX_XFER_PARAM_PRIORITY, .priority = KVX_PRIO_LEVELS};
    uint32_t one = 0;
    uint64_t id = 0;

    if (argc > 2 && strcmp(argv[2], "rndv") == 0)
        setenv("KT_RNDV", "always", 1); /* the target's transport too (the harness) */
    setenv("UCX_TLS", !strcmp(tl, "tcp") ? "tcp" : "sm", 1);
    want_tl = !strcmp(tl, "tcp") ? "tcp" : "sysv";
    tg = kt_target_start(&ta);
    r = kt_region_alloc(NBLOCKS, BLOCK);
    kt_fill_all(&r, SALT, 0);
    t = kt_transport(&r, NULL, 1);
    KT_OK(kvx_peer_add(t, "target", tg.md, tg.md_len, NULL));
    KT_OK(kvx_peer_query(t, "target", &pa));
    kt_log("peer travels on '%s'", pa.transport);
    if (strstr(pa.transport, want_tl) == NULL)
        KT_FAIL("transport '%s' does not name '%s'", pa.transport, want_tl);

    /* a level that does not exist: refused, nothing submitted */
    KT_ERR(kvx_xfer_write(t, "target", &one, &one, 1, &bad, &id), -EINVAL);
    KT_ERR(kvx_xfer_read(t, "target", &one, &one, 1, &bad, &id), -EINVAL);
    KT_EQ(id, 0);
    {
        kvx_peer_attr_t q = {.field_mask = KVX_PEER_ATTR_COUNTERS};
        kvx_completion_t none[1];
        KT_OK(kvx_peer_query(t, "target", &q));
        KT_EQ(q.xfers_inflight, 0);
        KT_EQ(q.xfers_done + q.xfers_failed, 0);
        KT_EQ(kvx_transport_poll(t, NULL, none, 1), 0);
    }

    test_order(t, &tg, &r);
    kt_fill_all(&r, SALT, 0); /* the reads overwrote it */
    test_no_starvation(t, &tg, &r, false);
    test_no_starvation(t, &tg, &r, true);
    kt_fill_all(&r, SALT, 0); /* the reads overwrote it */
    test_cancel_deadline(t, &tg);
    test_fence(t, &tg);
    test_dead_peer(t, &tg); /* kills the target */
    kt_wait(&tg.proc);
    kvx_transport_destroy(t);
    kt_region_free(&r);
    free(tg.md);
    return 0;
}
