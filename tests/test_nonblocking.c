/*
 * Control-plane calls never stall the data plane. While this transport adds a peer that is
 * SIGSTOPped (its wire-up cannot finish) and removes a peer whose transfers are stuck, a healthy
 * peer's transfers (a thread of this process) and a peer writing into this transport's region
 * (another process: this transport is its passive target) keep completing. The test reports the
 * longest gap between completions of each and fails when one exceeds KT_GAP_MAX_MS: kvx must not
 * hold its lock across a wait on the network (0.1 held it up to 200 ms for wire-up and up to 5 s
 * for a close). Then: two adds of one id, a slow one of a stopped peer called first and a quick
 * one 30 ms later, end with the later one's connection (they take turns, in call order); and
 * close() from one thread wakes three threads asleep in kvx_transport_wait at once.
 */
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define BL 4096
#define NB 256
/* A healthy completion gap is well under 10 ms here; a lock held through a wire-up wait is 200. */
#define KT_GAP_MAX_MS 120

static kt_region_t r;
static kvx_transport_t *t;

/* A stream of small writes, one in flight at a time, for duration_ns: the longest gap between
 * completions (and how many there were). */
static uint64_t stream(kvx_transport_t *tx, const char *peer, uint64_t duration_ns, uint64_t *count)
{
    uint64_t start = kt_now_ns(), last = start, max_gap = 0, n = 0;
    kvx_completion_t c;

    while (last - start < duration_ns) {
        uint32_t l = (uint32_t)(n % 64), rm = (uint32_t)(n % 64) + 64;
        uint64_t id, now;
        KT_OK(kvx_xfer_write(tx, peer, &l, &rm, 1, NULL, &id));
        KT_EQ(kt_poll_n(tx, peer, &c, 1, 10000), 1);
        KT_EQ(c.id, id);
        KT_EQ(c.status, 0);
        now = kt_now_ns();
        if (now - last > max_gap)
            max_gap = now - last;
        last = now;
        n++;
    }
    *count = n;
    return max_gap;
}

#define RUN_NS 2500000000ull

static uint64_t healthy_gap, healthy_count;

static void *healthy_writer(void *arg)
{
    (void)arg;
    healthy_gap = stream(t, "healthy", RUN_NS, &healthy_count);
    return NULL;
}

/* Another process writing into this transport's region for RUN_NS once told to go; it reports
 * its longest completion gap and how many writes it made. Forked before this process runs UCX. */
static int outside_writer(int sock, void *arg)
{
    kt_region_t mine = kt_region_alloc(NB, BL);
    kvx_transport_t *tx;
    size_t md_len;
    uint8_t *md = kt_recv_alloc(sock, &md_len);
    uint64_t res[2];
    char go;

    (void)arg;
    kt_fill_all(&mine, 0x77, 0);
    tx = kt_transport(&mine, "outside", 1);
    KT_OK(kvx_peer_add(tx, "passive", md, md_len, NULL));
    kt_send(sock, "r", 1);
    kt_recv(sock, &go, 1);
    res[0] = stream(tx, "passive", RUN_NS, &res[1]);
    kt_send(sock, res, sizeof(res));
    kvx_transport_destroy(tx);
    kt_region_free(&mine);
    free(md);
    return 0;
}

/* A slow add (a stopped peer: it waits 200 ms for the wire-up) called first, a quick add of the
 * same id called 30 ms later: the later call's connection must be the one left. */
static kt_target_t *slow_target;
static int slow_rc;

static void *slow_add(void *arg)
{
    (void)arg;
    slow_rc = kvx_peer_add(t, "x", slow_target->md, slow_target->md_len, NULL);
    return NULL;
}

static void same_id_adds(kt_target_t *fresh, kt_target_t *stale)
{
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_AGENT_NAME | KVX_PEER_ATTR_STATE};
    uint32_t li[2] = {5, 6}, ri[2] = {210, 211};
    kvx_completion_t c;
    pthread_t th;
    uint64_t id;

    slow_target = stale;
    kt_stop(&stale->proc);
    KT_CHECK(pthread_create(&th, NULL, slow_add, NULL) == 0);
    usleep(30000);
    KT_OK(kvx_peer_add(t, "x", fresh->md, fresh->md_len, NULL));
    pthread_join(th, NULL);
    KT_OK(slow_rc);
    KT_OK(kvx_peer_query(t, "x", &pa));
    kt_log("two adds of one id: the later one's connection (to %s) is left", pa.agent_name);
    KT_CHECK(strcmp(pa.agent_name, "healthy") == 0);
    /* its handshake may still be under way (kvx_peer_add waits 200 ms for it) */
    for (uint64_t end = kt_now_ns() + 5000000000ull;
         pa.state == KVX_PEER_WIRING && kt_now_ns() < end;) {
        usleep(1000);
        KT_OK(kvx_peer_query(t, "x", &pa));
    }
    KT_EQ(pa.state, KVX_PEER_CONNECTED);
    KT_OK(kvx_xfer_write(t, "x", li, ri, 2, NULL, &id));
    KT_EQ(kt_poll_n(t, "x", &c, 1, 5000), 1);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(fresh, ri, li, 2, 0x31, 0), 0);
    kt_cont(&stale->proc);
    KT_EQ(kvx_peer_remove(t, "x"), 1);
}

/* close() from one thread wakes every thread asleep in kvx_transport_wait, at once: with a
 * 10 s keepalive, a waiter that missed its wake-up would sleep up to 10 s. */
static kvx_transport_t *tw;
static int wait_rc[3];

static void *waiter(void *arg)
{
    int *rc = arg;
    *rc = kvx_transport_wait(tw, NULL, -1);
    return NULL;
}

static void close_wakes_waiters(void)
{
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_KEEPALIVE,
                      .base = r.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .keepalive_ms = 10000};
    pthread_t th[3];
    uint64_t t0;

    KT_OK(kvx_transport_create(&p, &tw));
    for (int i = 0; i < 3; i++)
        KT_CHECK(pthread_create(&th[i], NULL, waiter, &wait_rc[i]) == 0);
    usleep(200000);
    t0 = kt_now_ns();
    KT_OK(kvx_transport_close(tw));
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    kt_log("close with 3 threads asleep in kvx_transport_wait: %.1f ms",
           (double)(kt_now_ns() - t0) / 1e6);
    KT_CHECK(kt_now_ns() - t0 < 2000000000ull);
    for (int i = 0; i < 3; i++)
        KT_ERR(wait_rc[i], -ESHUTDOWN);
    kvx_transport_destroy(tw);
}

int main(void)
{
    kt_proc_t out = kt_spawn(outside_writer, NULL, 60);
    kt_target_args_t a = {.num_blocks = NB, .block_len = BL, .salt = 3, .threads = 1};
    kt_target_t healthy, stopped, stuck;
    uint64_t res[2], t0, add_ms, remove_ms, ids[8];
    uint8_t *md;
    size_t md_len;
    pthread_t th;
    char ready;

    /* stopped first: its metadata is older than healthy's, so that the later add of the same id
     * (healthy's) replaces it (an add of older metadata is refused: -ESTALE) */
    a.name = "stopped";
    stopped = kt_target_start(&a);
    a.name = "healthy";
    healthy = kt_target_start(&a);
    a.name = "stuck";
    stuck = kt_target_start(&a);
    r = kt_region_alloc(NB, BL);
    kt_fill_all(&r, 0x31, 0);
    {
        /* the stopped peer stays stopped about 2 s: keep the stall limit out of the way */
        kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_STALL,
                          .base = r.base,
                          .num_blocks = NB,
                          .block_len = BL,
                          .agent_name = "busy",
                          .stall_ms = 30000};
        KT_OK(kvx_transport_create(&p, &t));
    }
    md = kt_metadata(t, &md_len);
    kt_send(out.sock, md, md_len);
    kt_recv(out.sock, &ready, 1);
    KT_OK(kvx_peer_add(t, "healthy", healthy.md, healthy.md_len, NULL));
    KT_OK(kvx_peer_add(t, "stuck", stuck.md, stuck.md_len, NULL));

    /* both streams run for RUN_NS; the control-plane calls happen in their middle */
    kt_send(out.sock, "g", 1);
    KT_CHECK(pthread_create(&th, NULL, healthy_writer, NULL) == 0);
    usleep(500000);

    /* a peer that is stopped: its wire-up cannot finish while we add it */
    kt_stop(&stopped.proc);
    t0 = kt_now_ns();
    KT_OK(kvx_peer_add(t, "stopped", stopped.md, stopped.md_len, NULL));
    add_ms = (kt_now_ns() - t0) / 1000000;

    /* a peer with transfers stuck in flight, removed */
    kt_stop(&stuck.proc);
    for (int i = 0; i < 8; i++) {
        uint32_t li[16], ri[16];
        kt_indices(li, 16, NB, true, (uint64_t)i);
        kt_indices(ri, 16, NB, true, (uint64_t)i + 3);
        KT_OK(kvx_xfer_write(t, "stuck", li, ri, 16, NULL, &ids[i]));
    }
    usleep(50000);
    t0 = kt_now_ns();
    KT_EQ(kvx_peer_remove(t, "stuck"), 1);
    remove_ms = (kt_now_ns() - t0) / 1000000;

    pthread_join(th, NULL);
    kt_recv(out.sock, res, sizeof(res));
    KT_EQ(kt_wait(&out), 0);
    kt_log("during a %llu ms add of a stopped peer and a %llu ms remove of a stuck one: longest "
           "completion gap %.1f ms for a healthy peer (%llu writes), %.1f ms for a peer writing "
           "into this transport (%llu writes)",
           (unsigned long long)add_ms, (unsigned long long)remove_ms, (double)healthy_gap / 1e6,
           (unsigned long long)healthy_count, (double)res[0] / 1e6, (unsigned long long)res[1]);
#if !defined(__SANITIZE_THREAD__)
    /* Under ThreadSanitizer (the KVX_TSAN build runs this test for its threads) every step is
     * several times slower, and beside the other tests on two cores the writer's gap reached
     * 188 ms once: the gaps are judged in the other builds. */
    KT_CHECK(healthy_gap < KT_GAP_MAX_MS * 1000000ull);
    KT_CHECK(res[0] < KT_GAP_MAX_MS * 1000000ull);
#endif

    /* the removed peer's transfers came out failed; every healthy write landed intact */
    {
        kvx_completion_t c[8];
        KT_EQ(kt_poll_n(t, "stuck", c, 8, 5000), 8);
        for (int i = 0; i < 8; i++)
            KT_ERR(c[i].status, -ECONNABORTED);
    }
    {
        uint32_t dst[64], src[64];
        for (uint32_t i = 0; i < 64; i++) {
            dst[i] = i + 64;
            src[i] = i;
        }
        KT_EQ(kt_target_verify(&healthy, dst, src, 64, 0x31, 0), 0);
        for (uint32_t i = 0; i < 64; i++)
            KT_EQ(kt_check(&r, i + 64, 0x77, i, 0), 0);
    }
    /* the stopped peer, resumed, finishes its wire-up in the background and works */
    kt_cont(&stopped.proc);
    kt_cont(&stuck.proc);
    {
        uint32_t li[4] = {1, 2, 3, 4}, ri[4] = {200, 201, 202, 203};
        kvx_completion_t c;
        uint64_t id;
        KT_OK(kvx_xfer_write(t, "stopped", li, ri, 4, NULL, &id));
        KT_EQ(kt_poll_n(t, "stopped", &c, 1, 10000), 1);
        KT_EQ(c.status, 0);
        KT_EQ(kt_target_verify(&stopped, ri, li, 4, 0x31, 0), 0);
    }
    same_id_adds(&healthy, &stopped);
    kvx_transport_destroy(t);
    close_wakes_waiters();
    kt_region_free(&r);
    free(md);
    KT_EQ(kt_target_stop(&healthy), 0);
    KT_EQ(kt_target_stop(&stopped), 0);
    KT_EQ(kt_target_stop(&stuck), 0);
    return 0;
}
