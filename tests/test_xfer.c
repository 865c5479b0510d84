/*
 * Write and read between two processes over real UCX, every byte checked: block lengths 4 KiB,
 * 64 KiB and 1 MiB, contiguous, scattered and mixed index lists. argv[1] names the transport
 * ("shm" or "tcp"): UCX_TLS is limited to it, and the peer must report that it travels on it.
 * kvx's settings for that transport must have been applied in the form this UCX accepts (kvx
 * logs each one at debug level, and warns when UCX reports one unused). argv[2] "rndv": every
 * run goes by rendezvous (KVX_RNDV_ALWAYS), and the target must count its writes landed so and
 * its reads' answers (READ_DATA) sent so.
 */
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

static char applied[4096];
static bool ignored;
static bool rndv;                       /* every run by rendezvous: the target counts them */
#define KVX_READ_REQ_BYTES (256 * 1024) /* what one read request asks at most (kvx_wire.h) */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static void capture(void *arg, int level, const char *msg)
{
    const char *p;
    (void)arg;
    (void)level;
    pthread_mutex_lock(&log_lock);
    if (strstr(msg, "ignored kvx's setting") != NULL) {
        ignored = true;
        fprintf(stderr, "%s\n", msg);
    }
    /* "ucx 1.13.1: TX_SEG_SIZE=60k" */
    if ((p = strstr(msg, "] ucx ")) != NULL && strchr(p, '=') != NULL &&
        strlen(applied) + strlen(p) + 2 < sizeof(applied)) {
        strcat(applied, p + 2);
        strcat(applied, "\n");
    }
    pthread_mutex_unlock(&log_lock);
}

static void run(uint64_t block_len, uint64_t num_blocks, const char *want_tl, uint64_t round)
{
    kt_target_args_t ta = {
        .num_blocks = num_blocks, .block_len = block_len, .salt = 0x7a, .threads = 1};
    kt_target_t tg = kt_target_start(&ta);
    kt_region_t r = kt_region_alloc(num_blocks, block_len);
    kvx_transport_t *t = kt_transport(&r, NULL, 1);
    const uint64_t salt = 0x11;
    const size_t n = num_blocks / 4;
    uint32_t *li = calloc(n, 4), *ri = calloc(n, 4);
    kvx_completion_t c[4];
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT | KVX_PEER_ATTR_COUNTERS |
                                        KVX_PEER_ATTR_STATE | KVX_PEER_ATTR_REGION};
    uint64_t id, bytes_w = 0, bytes_r = 0;

    kt_fill_all(&r, salt, round);
    KT_OK(kvx_peer_add(t, "target", tg.md, tg.md_len, NULL));

    /* writes: contiguous (one run), scattered (n runs), contiguous -> scattered */
    for (int shape = 0; shape < 3; shape++) {
        kt_indices(li, n, num_blocks, shape == 1, 3 + shape);
        kt_indices(ri, n, num_blocks, shape >= 1, 11 + shape);
        KT_OK(kvx_xfer_write(t, "target", li, ri, n, NULL, &id));
        KT_EQ(kt_poll_n(t, "target", c, 1, 10000), 1);
        KT_EQ(c[0].id, id);
        KT_EQ(c[0].status, 0);
        KT_EQ(c[0].bytes, n * block_len);
        KT_EQ(c[0].flags, 0);
        bytes_w += n * block_len;
        KT_EQ(kt_target_verify(&tg, ri, li, n, salt, round), 0);
    }
    /* reads: the target's blocks carry (0x7a, index, round) again after a refill */
    kt_target_refill(&tg, round);
    for (int shape = 0; shape < 3; shape++) {
        kt_indices(li, n, num_blocks, shape >= 1, 5 + shape);
        kt_indices(ri, n, num_blocks, shape == 1, 17 + shape);
        KT_OK(kvx_xfer_read(t, "target", li, ri, n, NULL, &id));
        KT_EQ(kt_poll_n(t, "target", c, 1, 10000), 1);
        KT_EQ(c[0].id, id);
        KT_EQ(c[0].status, 0);
        KT_EQ(c[0].flags, KVX_COMPLETION_READ);
        bytes_r += n * block_len;
        for (size_t i = 0; i < n; i++)
            if (kt_check_read(&r, li[i], 0x7a, ri[i], round) != 0)
                KT_FAIL("read block %u <- %u wrong (block_len %llu)", li[i], ri[i],
                        (unsigned long long)block_len);
    }

    {
        kvx_recv_counters_t rc;
        kt_target_counters(&tg, &rc);
        kt_log("block_len %llu: the target landed %llu writes, %llu by rendezvous, %llu failed; "
               "served %llu READ_DATA by rendezvous",
               (unsigned long long)block_len, (unsigned long long)rc.writes_landed,
               (unsigned long long)rc.rndv_landed, (unsigned long long)rc.rndv_failed,
               (unsigned long long)rc.rndv_served);
        if (rndv) {
            KT_CHECK(rc.rndv_landed > 0 && rc.rndv_landed == rc.writes_landed);
            KT_EQ(rc.rndv_failed, 0);
            /* every read's runs by rendezvous: one message at least per request of 256 KiB and
             * per run (3 reads of n blocks: one run, n runs, n runs) */
            KT_CHECK(rc.rndv_served >= 1 + 2 * (uint64_t)n);
            KT_CHECK(rc.rndv_served >= bytes_r / KVX_READ_REQ_BYTES);
        } else {
            KT_EQ(rc.rndv_served, 0); /* auto: shm eager, tcp's threshold above a request */
        }
    }
    KT_OK(kvx_peer_query(t, "target", &pa));
    KT_EQ(pa.state, KVX_PEER_CONNECTED);
    KT_EQ(pa.bytes_written, bytes_w);
    KT_EQ(pa.bytes_read, bytes_r);
    KT_EQ(pa.xfers_done, 6);
    KT_EQ(pa.xfers_failed, 0);
    KT_EQ(pa.xfers_inflight, 0);
    KT_EQ(pa.remote_num_blocks, num_blocks);
    KT_CHECK(pa.latency_max_ns > 0 && pa.latency_sum_ns >= pa.latency_max_ns);
    kt_log("block_len %llu: peer travels on '%s' (rma %s)", (unsigned long long)block_len,
           pa.transport, pa.rma_hw ? "hardware" : "emulated");
    if (strstr(pa.transport, want_tl) == NULL)
        KT_FAIL("transport '%s' does not name '%s'", pa.transport, want_tl);

    kvx_transport_destroy(t);
    kt_region_free(&r);
    KT_EQ(kt_target_stop(&tg), 0);
    free(li);
    free(ri);
}

/* One run of 512 MiB (blocks consecutive on both sides) with a stall limit of 100 ms: kvx posts it
 * in pieces that each complete well within the limit, so a large transfer that keeps moving
 * never trips it (posted whole, it took 250-350 ms over tcp here and failed). */
static void large_run(void)
{
    const uint64_t bl = 1 << 20, nb = 512;
    kt_target_args_t ta = {.num_blocks = nb, .block_len = bl, .salt = 0x7b, .threads = 1};
    kt_target_t tg = kt_target_start(&ta);
    kt_region_t r = kt_region_alloc(nb, bl);
    kvx_params_t p = {
        .field_mask = KVX_PARAM_REGION | KVX_PARAM_STALL | KVX_PARAM_DEADLINE,
        .base = r.base,
        .num_blocks = nb,
        .block_len = bl,
#if defined(__SANITIZE_THREAD__)
        /* Under ThreadSanitizer, beside another test on two cores, a 100 ms gap
         * without progress came once (a stall, -ETIMEDOUT, after 22 s): the limit
         * is judged in the other builds, this one checks the threads */
        .stall_ms = 2000,
#else
        .stall_ms = 100,
#endif
        .deadline_ms = 0
    };
    uint32_t *idx = calloc(nb, 4);
    kvx_transport_t *t;
    kvx_completion_t c;
    uint64_t id, t0;

    kt_fill_all(&r, 0x12, 4);
    KT_OK(kvx_transport_create(&p, &t));
    KT_OK(kvx_peer_add(t, "target", tg.md, tg.md_len, NULL));
    for (uint32_t i = 0; i < nb; i++)
        idx[i] = i;
    t0 = kt_now_ns();
    KT_OK(kvx_xfer_write(t, "target", idx, idx, nb, NULL, &id));
    KT_EQ(kt_poll_n(t, "target", &c, 1, 60000), 1);
    kt_log("one 512 MiB run, stall limit 100 ms: %s in %.3f s", kvx_strerror(c.status),
           (double)(kt_now_ns() - t0) / 1e9);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(&tg, idx, idx, nb, 0x12, 4), 0);
    kvx_transport_destroy(t);
    kt_region_free(&r);
    free(idx);
    KT_EQ(kt_target_stop(&tg), 0);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "shm";
    const char *want, *setting;

    if (argc > 2 && strcmp(argv[2], "rndv") == 0)
        setenv("KT_RNDV", "always", 1); /* the target's transport too (the harness) */
    rndv = kt_rndv_forced();            /* so, or the whole suite run by rendezvous */

    if (strcmp(mode, "tcp") == 0) {
        setenv("UCX_TLS", "tcp", 1);
        want = "tcp";
        setting = "TX_SEG_SIZE=60k"; /* TCP_TX_SEG_SIZE on UCX 1.19 */
    } else {
        setenv("UCX_TLS", "sm", 1);
        want = "sysv"; /* UCX puts active messages on sysv first, posix beside it */
        setting = "MM_SEG_SIZE=32k";
    }
    kvx_log_set(capture, NULL, KVX_LOG_DEBUG);
    run(4096, 1024, want, 1);
    kvx_log_set(NULL, NULL, KVX_LOG_OFF);
    run(65536, 256, want, 2);
    run(1 << 20, 64, want, 3);
    large_run();
    kt_log("settings applied:\n%s", applied);
    KT_CHECK(strstr(applied, setting) != NULL);
    KT_CHECK(strstr(applied, "KEEPALIVE_INTERVAL=1000ms") != NULL);
    if (strcmp(mode, "tcp") == 0) /* tcp's zero-copy PUT off (TCP_PUT_ENABLE on UCX 1.19) */
        KT_CHECK(strstr(applied, "PUT_ENABLE=n") != NULL);
    KT_CHECK(!ignored);
    return 0;
}
