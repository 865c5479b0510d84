/*
 * The progress thread's mode (kvx_params_t.thread_mode) between two transports over real UCX
 * (argv[1]: shm or tcp): KVX_THREAD_YIELDS steps aside while the application spins on
 * kvx_transport_poll (the thread's count of step-asides grows), KVX_THREAD_DRIVES never does
 * (it stays 0 through the same traffic), and neither does a yielding transport whose application
 * asked for an event descriptor. Refusals of a mode that is neither. Every byte moved, written
 * and read back, is checked.
 */
#include "harness.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#define NB 256
#define BL (16 * 1024)

static kvx_transport_t *make(const kt_region_t *r, const char *name, int mode)
{
    kvx_transport_t *t = NULL;
    kvx_params_t p = {
        .field_mask =
            KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS | KVX_PARAM_AGENT_NAME | KVX_PARAM_THREAD_MODE,
        .base = r->base,
        .num_blocks = r->num_blocks,
        .block_len = r->block_len,
        .num_threads = 1,
        .agent_name = name,
        .thread_mode = mode,
    };
    kt_rndv_params(&p);
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}

static void query(kvx_transport_t *t, int *mode, uint64_t *asides)
{
    kvx_transport_attr_t a = {.field_mask = KVX_TRANSPORT_ATTR_THREAD};
    KT_OK(kvx_transport_query(t, &a));
    *mode = a.thread_mode;
    *asides = a.thread_asides;
}

/* Spin on kvx_transport_poll until transfer id completes, successfully. */
static void await_ok(kvx_transport_t *tx, uint64_t id)
{
    kvx_completion_t c[2];
    KT_EQ(kt_poll_n(tx, "rx", c, 1, 10000), 1);
    KT_EQ(c[0].id, id);
    KT_EQ(c[0].status, 0);
}

/* One round: 8 scattered blocks written tx -> rx, then read back into other blocks of tx's;
 * every byte checked. */
static void round_trip(kvx_transport_t *tx, kt_region_t *r1, kt_region_t *r2, unsigned k)
{
    uint32_t li[8], ri[8], back[8];
    uint64_t id;

    for (unsigned i = 0; i < 8; i++) {
        li[i] = (k * 8 + i * 13) % (NB / 2); /* i * 13 < NB / 2, i * 31 < NB: distinct */
        ri[i] = (k * 29 + i * 31) % NB;
        back[i] = NB / 2 + (k * 8 + i) % (NB / 2);
    }
    KT_OK(kvx_xfer_write(tx, "rx", li, ri, 8, NULL, &id));
    await_ok(tx, id);
    for (unsigned i = 0; i < 8; i++)
        KT_EQ(kt_check(r2, ri[i], 0x61, li[i], k + 1), 0);
    KT_OK(kvx_xfer_read(tx, "rx", back, ri, 8, NULL, &id));
    await_ok(tx, id);
    for (unsigned i = 0; i < 8; i++)
        KT_EQ(kt_check_read(r1, back[i], 0x61, li[i], k + 1), 0);
}

/* Traffic through a transport of this mode (with an event descriptor asked for, if evfd):
 * rounds until min_rounds ran and, when want_asides, the thread stepped aside at least once
 * (10 s at most). Returns the step-asides counted. */
static uint64_t run(int mode, bool evfd, unsigned min_rounds, bool want_asides)
{
    kt_region_t r1 = kt_region_alloc(NB, BL), r2 = kt_region_alloc(NB, BL);
    kvx_transport_t *tx = make(&r1, "tm-writer", mode);
    kvx_transport_t *rx = kt_transport(&r2, "tm-target", 1);
    uint64_t asides = 0, end = kt_now_ns() + 10000000000ull;
    size_t mdl;
    uint8_t *md = kt_metadata(rx, &mdl);
    int got_mode, fd;
    unsigned k;

    KT_OK(kvx_peer_add(tx, "rx", md, mdl, NULL));
    free(md);
    if (evfd)
        KT_OK(kvx_transport_event_fd_ex(tx, KVX_EVENT_COMPLETIONS, &fd));
    for (k = 0; k < min_rounds || (want_asides && asides == 0 && kt_now_ns() < end); k++) {
        kt_fill_all(&r1, 0x61, k + 1);
        round_trip(tx, &r1, &r2, k);
        query(tx, &got_mode, &asides);
    }
    KT_EQ(got_mode, mode);
    kt_log("%s%s: %u rounds of 8 blocks written and read back, %llu step-asides",
           mode == KVX_THREAD_DRIVES ? "KVX_THREAD_DRIVES" : "KVX_THREAD_YIELDS",
           evfd ? " with an event fd" : "", k, (unsigned long long)asides);
    kvx_transport_destroy(tx);
    kvx_transport_destroy(rx);
    kt_region_free(&r1);
    kt_region_free(&r2);
    return asides;
}

int main(int argc, char **argv)
{
    const char *tl = argc > 1 ? argv[1] : "shm";
    kt_region_t r = kt_region_alloc(4, 4096);
    kvx_transport_t *t = NULL;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_THREAD_MODE,
                      .base = r.base,
                      .num_blocks = r.num_blocks,
                      .block_len = r.block_len};

    setenv("UCX_TLS", strcmp(tl, "tcp") == 0 ? "tcp" : "sm", 1);
    /* a mode that is neither: refused, nothing made */
    static const int bad[] = {-1, 2, 3, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p.thread_mode = bad[i];
        KT_ERR(kvx_transport_create(&p, &t), -EINVAL);
        KT_CHECK(t == NULL);
    }
    p.field_mask |= KVX_PARAM_NUM_THREADS; /* no thread: the mode accepted, and reported */
    p.num_threads = 0;
    p.thread_mode = KVX_THREAD_DRIVES;
    KT_OK(kvx_transport_create(&p, &t));
    {
        int mode;
        uint64_t asides;
        query(t, &mode, &asides);
        KT_EQ(mode, KVX_THREAD_DRIVES);
        KT_EQ(asides, 0);
    }
    kvx_transport_destroy(t);
    kt_region_free(&r);

    /* the default steps aside for a spinning application: the control that the count works */
    KT_CHECK(run(KVX_THREAD_YIELDS, false, 50, true) > 0);
    /* drives: never, through at least as much traffic */
    KT_EQ(run(KVX_THREAD_DRIVES, false, 400, false), 0);
    /* yields, but the application waits on an event fd: never either */
    KT_EQ(run(KVX_THREAD_YIELDS, true, 400, false), 0);
    kt_log("thread modes over %s: ok", tl);
    return 0;
}
