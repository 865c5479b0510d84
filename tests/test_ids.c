/*
 * Transfer ids and the objects behind them (white box: reads kvx's own counters):
 *  - ids are unique for the transport's life: a sequence that has passed 2^44 (where 0.1's
 *    "seq << 20 | slot" wrapped onto earlier ids) still gives new ids, and cancel finds them;
 *  - the pool of transfer objects keeps what bursts need (a repeated burst allocates nothing) and
 *    gives it back once the transport has been idle for two pool periods;
 *  - an idle transfer object does not keep the run array of an unusually large transfer;
 *  - the largest deadline accepted works as a deadline that never comes.
 */
#include "harness.h"
#include "kvx_int.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define BL 4096
#define NB 8192

static kt_region_t r;
static kvx_transport_t *t;
static kt_target_t tg;

static uint64_t write_blocks(uint32_t first, uint32_t n, const kvx_xfer_params_t *xp)
{
    static uint32_t li[NB], ri[NB];
    uint64_t id;

    for (uint32_t i = 0; i < n; i++) {
        li[i] = (first + i) % NB;
        ri[i] = (first + i * 7) % NB; /* scattered: one run per block */
    }
    KT_OK(kvx_xfer_write(t, "p", li, ri, n, xp, &id));
    return id;
}

static void drain(int n)
{
    static kvx_completion_t c[4096];
    KT_CHECK(n <= 4096);
    KT_EQ(kt_poll_n(t, "p", c, n, 20000), n);
    for (int i = 0; i < n; i++)
        KT_EQ(c[i].status, 0);
}

static void ids_never_repeat(void)
{
    uint64_t first, second, pending[1];

    first = write_blocks(0, 1, NULL);
    drain(1);
    /* jump the sequence past 2^44: 0.1's ids wrapped here onto the first ones */
    kvx_lock(&t->core);
    t->core.next_seq = first + (1ull << 44);
    kvx_unlock(&t->core);
    second = write_blocks(1, 1, NULL);
    kt_log("ids %llu then, 2^44 transfers later, %llu", (unsigned long long)first,
           (unsigned long long)second);
    KT_CHECK(second != first);
    KT_CHECK(second > first);
    KT_CHECK(second != 0);
    drain(1);
    /* cancel finds a transfer by such an id: stop the target so that it is still in flight,
     * cancel it, and it is forgotten (the peer's count drops, it never comes out of poll) */
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_COUNTERS};
        kvx_completion_t c[2];
        kt_stop(&tg.proc);
        second = write_blocks(2, 1, NULL);
        KT_OK(kvx_peer_query(t, "p", &pa));
        KT_EQ(pa.xfers_inflight, 1);
        KT_EQ(kvx_xfer_cancel(t, &second, 1, KVX_CANCEL_IMMEDIATE, pending), 0);
        KT_OK(kvx_peer_query(t, "p", &pa));
        KT_EQ(pa.xfers_inflight, 0);
        kt_cont(&tg.proc);
        KT_EQ(kt_poll_n(t, "p", c, 2, 500), 0);
    }
}

static void pool(void)
{
    uint64_t mallocs = 0;

    /* a burst of 2,000 transfers in flight at once, five times over: after the first, the pool
     * has what the burst needs */
    for (int b = 0; b < 5; b++) {
        kt_stop(&tg.proc);
        for (uint32_t i = 0; i < 2000; i++)
            write_blocks(i, 1, NULL);
        if (b == 0) {
            kvx_lock(&t->core);
            mallocs = t->core.xfer_mallocs;
            kvx_unlock(&t->core);
        }
        kt_cont(&tg.proc);
        drain(2000);
    }
    kvx_lock(&t->core);
    kt_log("5 bursts of 2,000 transfers: %llu transfer objects allocated after the first, %zu "
           "pooled",
           (unsigned long long)(t->core.xfer_mallocs - mallocs), t->core.nfree);
    KT_EQ(t->core.xfer_mallocs, mallocs);
    KT_CHECK(t->core.nfree >= 2000);
    kvx_unlock(&t->core);
    /* idle for two whole pool periods (1 s each, checked at the idle thread's 1 s wake-ups):
     * the pool shrinks back */
    {
        uint64_t t0 = kt_now_ns();
        size_t nfree;
        do {
            usleep(100000);
            kvx_lock(&t->core);
            nfree = t->core.nfree;
            KT_EQ(t->core.nlive, 0);
            kvx_unlock(&t->core);
        } while (nfree > 64 && kt_now_ns() - t0 < 10000000000ull);
        kt_log("idle: %zu transfer objects pooled after %.1f s", nfree,
               (double)(kt_now_ns() - t0) / 1e9);
        KT_CHECK(nfree <= 64);
    }
}

static void runs_memory(void)
{
    /* one transfer of 8,192 single-block runs: its object must not keep 8,192 runs once idle */
    write_blocks(0, NB, NULL);
    drain(1);
    kvx_lock(&t->core);
    for (kvx_xfer_t *x = t->core.free_xfers; x != NULL; x = x->next_free)
        KT_CHECK(x->runs_cap <= 1024);
    kvx_unlock(&t->core);
}

static void largest_deadline(void)
{
    kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_DEADLINE, .deadline_ms = KVX_MS_MAX};
    uint32_t li[4] = {1, 2, 3, 4}, ri[4] = {9, 10, 11, 12};
    kvx_completion_t c;
    uint64_t id;

    for (int i = 0; i < 4; i++)
        kt_fill(&r, li[i], 0x21, li[i], 5);
    KT_OK(kvx_xfer_write(t, "p", li, ri, 4, &xp, &id));
    KT_EQ(kt_poll_n(t, "p", &c, 1, 5000), 1);
    KT_EQ(c.id, id);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(&tg, ri, li, 4, 0x21, 5), 0);
}

int main(void)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 9, .threads = 1, .name = "id-target"};

    tg = kt_target_start(&a);
    r = kt_region_alloc(NB, BL);
    kt_fill_all(&r, 0x21, 0);
    t = kt_transport(&r, "id-source", 1);
    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    ids_never_repeat();
    pool();
    runs_memory();
    largest_deadline();
    {
        uint32_t li[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        uint32_t ri[8] = {0, 7, 14, 21, 28, 35, 42, 49};
        KT_EQ(kt_target_verify(&tg, ri, li, 8, 0x21, 0), 0);
    }
    kvx_transport_destroy(t);
    kt_region_free(&r);
    KT_EQ(kt_target_stop(&tg), 0);
    return 0;
}
