/*
 * Things break on purpose, over shared memory:
 *  - peer death: a target SIGKILLed with 1,200 transfers in flight, once reaped at once and once
 *    left a zombie (its parent has not called wait). With no deadline and no stall limit, every
 *    transfer comes out of poll failed within 1.5 x keepalive + 0.5 s of the kill (UCX's
 *    keepalive misses a zombie: kvx watches same-host peers itself), a healthy second peer's
 *    transfers all succeed, a restarted target added under the same id works, and the process
 *    is idle afterwards (UCX's endless flush of the dead peer's full FIFO does not spin it);
 *  - stalled peer: a SIGSTOPped target. Transfers fail with -ETIMEDOUT at their deadline, each
 *    alone (the connection stays), enforced by the progress thread with nobody polling (and
 *    without spinning meanwhile), each reported once even after the target resumes and answers
 *    for them; after SIGCONT, transfers on the same connection succeed;
 *  - stall limit: with no deadline at all, transfers to a SIGSTOPped target fail once the
 *    connection made no progress for stall_ms;
 *  - deadlines: a queued transfer past its (per-transfer) deadline fails alone and leaves the
 *    connection up; with no progress thread, poll enforces deadlines;
 *  - a write whose messages UCX still holds at its deadline is reported only once UCX let go of
 *    them: what the caller writes into its blocks after the report never reaches the receiver.
 * Every transfer that succeeds is verified byte for byte.
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* CPU seconds this process has used. */
static double kt_cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

#define BL 65536
#define NB 256

static kt_region_t r;
static const uint64_t salt = 0x99;

static kt_target_t start(const char *name)
{
    kt_target_args_t a = {.num_blocks = NB, .block_len = BL, .salt = 7, .threads = 1, .name = name};
    return kt_target_start(&a);
}

static uint64_t write1(kvx_transport_t *t, const char *peer, uint32_t l, uint32_t rm,
                       uint64_t deadline_ms)
{
    kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_DEADLINE, .deadline_ms = deadline_ms};
    uint64_t id;
    KT_OK(kvx_xfer_write(t, peer, &l, &rm, 1, deadline_ms ? &xp : NULL, &id));
    return id;
}

static void check_written(kvx_transport_t *t, kt_target_t *tg, const char *peer, uint32_t n)
{
    uint32_t li[64], ri[64];
    kvx_completion_t c;
    uint64_t id;

    KT_CHECK(n <= 64);
    for (uint32_t i = 0; i < n; i++) {
        li[i] = i * 3 % NB;
        ri[i] = (i * 5 + 1) % NB;
    }
    KT_OK(kvx_xfer_write(t, peer, li, ri, n, NULL, &id));
    KT_EQ(kt_poll_n(t, peer, &c, 1, 10000), 1);
    KT_EQ(c.id, id);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(tg, ri, li, n, salt, 0), 0);
}

/* A transport with the given deadline and stall limit (0: none) and a 1 s keepalive. */
static kvx_transport_t *transport(const char *name, uint64_t deadline_ms, uint64_t stall_ms)
{
    kvx_transport_t *t;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_DEADLINE |
                                    KVX_PARAM_STALL | KVX_PARAM_KEEPALIVE,
                      .base = r.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .agent_name = name,
                      .deadline_ms = deadline_ms,
                      .stall_ms = stall_ms,
                      .keepalive_ms = 1000};
    kt_rndv_params(&p);
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}

static void peer_death(bool reap)
{
    enum { N = 1200 };
    kt_target_t a = start("doomed"), b = start("healthy");
    /* neither a deadline nor the stall limit may be what fails the transfers */
    kvx_transport_t *t = transport("survivor", 0, 0);
    static kvx_completion_t c[N];
    uint64_t idb[50], t_kill, t_last = 0;
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE | KVX_PEER_ATTR_COUNTERS};
    int got = 0, gotb;

    KT_OK(kvx_peer_add(t, "A", a.md, a.md_len, NULL));
    KT_OK(kvx_peer_add(t, "B", b.md, b.md_len, NULL));
    kt_stop(&a.proc); /* so that the transfers are surely still in flight at the kill */
    for (int i = 0; i < N; i++)
        write1(t, "A", (uint32_t)i % NB, (uint32_t)(i * 7) % NB, 0);
    for (int i = 0; i < 50; i++)
        idb[i] = write1(t, "B", (uint32_t)i, (uint32_t)i + 100, 0);
    KT_OK(kvx_peer_query(t, "A", &pa));
    KT_EQ(pa.xfers_inflight, N);

    kt_kill(&a.proc, SIGKILL);
    t_kill = kt_now_ns();
    if (reap)
        KT_EQ(kt_wait(&a.proc), 128 + SIGKILL); /* reaped, as its parent would */

    while (got < N && kt_now_ns() - t_kill < 10000000000ull) {
        int n = kvx_transport_poll(t, "A", c + got, (size_t)(N - got));
        KT_OK(n);
        for (int i = got; i < got + n; i++) {
            if (c[i].status != -ECONNRESET)
                KT_FAIL("transfer %d failed with %d (%s)", i, c[i].status,
                        kvx_strerror(c[i].status));
            t_last = kt_now_ns();
        }
        got += n;
        if (n == 0)
            usleep(1000);
    }
    KT_EQ(got, N);
    kt_log("peer death (%s): %d transfers failed, the last %.3f s after SIGKILL",
           reap ? "reaped at once" : "a zombie until the end", N, (double)(t_last - t_kill) / 1e9);
    KT_CHECK(t_last - t_kill <= 2000000000ull); /* 1.5 x keepalive (1 s) + 0.5 s */
    if (!reap)
        KT_EQ(kt_wait(&a.proc), 128 + SIGKILL);
    KT_EQ(kvx_transport_poll(t, "A", c, 1), 0);
    KT_OK(kvx_peer_query(t, "A", &pa));
    KT_EQ(pa.state, KVX_PEER_FAILED);
    KT_EQ(pa.xfers_inflight, 0);
    KT_EQ(pa.xfers_failed, N);
    KT_ERR(kvx_xfer_write(t, "A", (uint32_t[]){0}, (uint32_t[]){0}, 1, NULL, &(uint64_t){0}),
           -ENOTCONN);

    /* the healthy peer did not notice */
    gotb = kt_poll_n(t, "B", c, 50, 10000);
    KT_EQ(gotb, 50);
    for (int i = 0; i < 50; i++) {
        KT_EQ(c[i].status, 0);
        KT_EQ(c[i].id, idb[i]);
    }
    {
        uint32_t li[50], ri[50];
        for (uint32_t i = 0; i < 50; i++) {
            li[i] = i;
            ri[i] = i + 100;
        }
        KT_EQ(kt_target_verify(&b, ri, li, 50, salt, 0), 0);
    }

    check_written(t, &b, "B", 10);
    /* remove the dead one, start another under the same id */
    KT_EQ(kvx_peer_remove(t, "A"), 1);
    kt_target_t a2 = start("reborn");
    KT_OK(kvx_peer_add(t, "A", a2.md, a2.md_len, NULL));
    check_written(t, &a2, "A", 40);
    check_written(t, &b, "B", 10);
    {
        /* Idle now. UCX keeps trying to flush the dead peer's full shared-memory FIFO for good
         * (it discards the endpoint only once the flush completes): that must not keep this
         * process's progress thread spinning. */
        double cpu0 = kt_cpu_s(), cpu;
        usleep(1000000);
        cpu = kt_cpu_s() - cpu0;
        kt_log("peer death (%s): idle afterwards, %.1f ms of CPU in 1 s",
               reap ? "reaped" : "zombie", cpu * 1e3);
        KT_CHECK(cpu < 0.2);
    }

    kvx_transport_destroy(t);
    free(a.md);
    KT_EQ(kt_target_stop(&a2), 0);
    KT_EQ(kt_target_stop(&b), 0);
}

/* No deadline: only the stall limit stops transfers to a stopped peer from hanging. */
static void stall_limit(void)
{
    kt_target_t s = start("stalls");
    kvx_transport_t *t = transport("stall-watcher", 0, 500);
    kvx_transport_attr_t ta = {.field_mask =
                                   KVX_TRANSPORT_ATTR_STALL | KVX_TRANSPORT_ATTR_DEADLINE};
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
    kvx_completion_t c[20];
    uint64_t t0, t_last = 0;
    int got = 0;

    KT_OK(kvx_transport_query(t, &ta));
    KT_EQ(ta.stall_ms, 500);
    KT_EQ(ta.deadline_ms, 0);
    KT_OK(kvx_peer_add(t, "S", s.md, s.md_len, NULL));
    check_written(t, &s, "S", 8);
    kt_stop(&s.proc);
    t0 = kt_now_ns();
    for (int i = 0; i < 20; i++)
        write1(t, "S", (uint32_t)i, (uint32_t)i, 0);
    while (got < 20 && kt_now_ns() - t0 < 10000000000ull) {
        int n = kvx_transport_poll(t, "S", c + got, (size_t)(20 - got));
        KT_OK(n);
        for (int i = got; i < got + n; i++) {
            KT_ERR(c[i].status, -ETIMEDOUT);
            t_last = kt_now_ns();
        }
        got += n;
        if (n == 0)
            usleep(1000);
    }
    KT_EQ(got, 20);
    kt_log("stall limit 0.5 s, no deadline: 20 transfers to a stopped peer failed %.3f s after "
           "submission",
           (double)(t_last - t0) / 1e9);
    KT_CHECK(t_last - t0 >= 500000000ull);
    KT_OK(kvx_peer_query(t, "S", &pa));
    KT_EQ(pa.state, KVX_PEER_FAILED);
    kt_cont(&s.proc);
    KT_OK(kvx_peer_add(t, "S", s.md, s.md_len, NULL));
    check_written(t, &s, "S", 16);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&s), 0);
}

static void stalled_peer(void)
{
    kt_target_t s = start("stalled");
    kvx_transport_t *t = kt_transport_ex(&r, "impatient", 1, NULL, 1500);
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE | KVX_PEER_ATTR_COUNTERS};
    kvx_completion_t c[40];
    uint64_t ids[20], t0;
    double cpu0, cpu1;

    KT_OK(kvx_peer_add(t, "S", s.md, s.md_len, NULL));
    check_written(t, &s, "S", 8);
    kt_stop(&s.proc);
    t0 = kt_now_ns();
    for (int i = 0; i < 20; i++)
        ids[i] = write1(t, "S", (uint32_t)i, (uint32_t)i, 0);
    /* nobody polls: the progress thread enforces the deadline, and while the peer is stopped it
     * must not spin on the operations queued behind the peer's full FIFO */
    cpu0 = kt_cpu_s();
    do {
        usleep(20000);
        KT_OK(kvx_peer_query(t, "S", &pa));
    } while (pa.xfers_failed < 20 && kt_now_ns() - t0 < 5000000000ull);
    cpu1 = kt_cpu_s();
    kt_log("stalled peer: 20 transfers failed %.3f s after submission (deadline 1.5 s), "
           "nobody polling; %.3f s of CPU meanwhile",
           (double)(kt_now_ns() - t0) / 1e9, cpu1 - cpu0);
    KT_CHECK(cpu1 - cpu0 < 0.3); /* measured 0.03 s; spinning would be 1.5 s */
    KT_EQ(pa.xfers_failed, 20);
    KT_CHECK(kt_now_ns() - t0 >= 1500000000ull);
    /* a deadline fails its transfer, not the connection; but by rendezvous UCX holds the sends
     * to the stopped receiver, and then the deadline fails the connection (docs/guide.md, "deadline
     * D") */
    KT_EQ(pa.state, kt_rndv_forced() ? KVX_PEER_FAILED : KVX_PEER_CONNECTED);
    KT_EQ(kt_poll_n(t, "S", c, 40, 500), 20);
    for (int i = 0; i < 20; i++) { /* each once (kt_poll_n); in order, except by rendezvous */
        KT_ERR(c[i].status, -ETIMEDOUT);
        if (kt_rndv_forced()) {
            int k = 0;
            while (k < 20 && ids[k] != c[i].id)
                k++;
            KT_CHECK(k < 20);
        } else {
            KT_EQ(c[i].id, ids[i]);
        }
    }
    /* the target resumes, drains what it had and acknowledges it: nothing is reported twice */
    kt_cont(&s.proc);
    usleep(300000);
    KT_EQ(kvx_transport_poll(t, NULL, c, 40), 0);
    if (kt_rndv_forced())
        KT_OK(kvx_peer_add(t, "S", s.md, s.md_len, NULL));
    check_written(t, &s, "S", 30);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&s), 0);
}

static void deadlines(void)
{
    kt_target_t d = start("deadlines");
    kvx_transport_t *t = kt_transport(&r, "deadline-keeper", 1);
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
    kvx_completion_t c[4];
    uint32_t li[128], ri[128];
    uint64_t big, small, t0;

    KT_OK(kvx_peer_add(t, "D", d.md, d.md_len, NULL));
    /* wired before the peer stops (kvx_peer_add returns after 200 ms with KVX_PEER_WIRING when
     * the handshake takes longer, as on a loaded machine) */
    for (uint64_t end = kt_now_ns() + 5000000000ull;;) {
        KT_OK(kvx_peer_query(t, "D", &pa));
        if (pa.state != KVX_PEER_WIRING || kt_now_ns() > end)
            break;
        usleep(1000);
    }
    KT_EQ(pa.state, KVX_PEER_CONNECTED);
    for (uint32_t i = 0; i < 128; i++) {
        li[i] = i;
        ri[i] = (i * 3) % NB;
    }
    kt_stop(&d.proc);
    /* 8 MiB, more than the stopped target's FIFO takes (4 MiB) and UCX holds, generous deadline;
     * then one block queued behind it with a 300 ms deadline of its own */
    KT_OK(kvx_xfer_write(t, "D", li, ri, 128, NULL, &big));
    t0 = kt_now_ns();
    small = write1(t, "D", 100, 200, 300);
    KT_EQ(kt_poll_n(t, "D", c, 1, 3000), 1);
    KT_EQ(c[0].id, small);
    KT_ERR(c[0].status, -ETIMEDOUT);
    KT_CHECK(kt_now_ns() - t0 >= 300000000ull);
    KT_OK(kvx_peer_query(t, "D", &pa));
    KT_EQ(pa.state, KVX_PEER_CONNECTED); /* it never reached UCX: the connection stays */
    kt_cont(&d.proc);
    KT_EQ(kt_poll_n(t, "D", c, 1, 5000), 1);
    KT_EQ(c[0].id, big);
    KT_EQ(c[0].status, 0);
    KT_EQ(kt_target_verify(&d, ri, li, 128, salt, 0), 0);
    kvx_transport_destroy(t);

    /* no progress thread: poll enforces deadlines (and drives everything else) */
    t = kt_transport_ex(&r, "poller", 0, NULL, 400);
    KT_OK(kvx_peer_add(t, "D", d.md, d.md_len, NULL));
    check_written(t, &d, "D", 16);
    kt_stop(&d.proc);
    t0 = kt_now_ns();
    small = write1(t, "D", 1, 2, 0);
    KT_EQ(kt_poll_n(t, "D", c, 1, 3000), 1);
    KT_EQ(c[0].id, small);
    KT_ERR(c[0].status, -ETIMEDOUT);
    kt_log("poll-driven deadline: failed %.3f s after submission (deadline 0.4 s)",
           (double)(kt_now_ns() - t0) / 1e9);
    KT_CHECK(kt_now_ns() - t0 >= 400000000ull);
    kt_cont(&d.proc);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&d), 0);
}

/*
 * A write UCX still holds messages of when its deadline passes (the receiver is stopped, its FIFO
 * full): the failure is reported only once UCX has let go of them (here: the stall limit fails
 * the connection), so the blocks the caller refills right after the report never reach the
 * receiver. Before, the failure came at the deadline and 31 of 512 remote blocks later held data
 * written after it.
 */
static void failed_write_lets_go(void)
{
    kt_target_t d = start("lets-go");
    kvx_transport_t *t = kt_transport(&r, "lets-go-writer", 1);
    kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_DEADLINE, .deadline_ms = 300};
    kvx_completion_t c;
    uint32_t li[192], ri[192];
    uint64_t id, t0, fresh;

    for (uint32_t i = 0; i < 192; i++) {
        li[i] = i;
        ri[i] = (i * 5) % NB;
        kt_fill(&r, i, salt, i, 1);
    }
    KT_OK(kvx_peer_add(t, "D", d.md, d.md_len, NULL));
    kt_stop(&d.proc);
    t0 = kt_now_ns();
    KT_OK(kvx_xfer_write(t, "D", li, ri, 192, &xp, &id)); /* 12 MiB */
    KT_EQ(kt_poll_n(t, "D", &c, 1, 10000), 1);
    KT_EQ(c.id, id);
    KT_ERR(c.status, -ETIMEDOUT);
    KT_CHECK(kt_now_ns() - t0 >= 300000000ull);
    for (uint32_t i = 0; i < 192; i++) /* the caller reuses its blocks at once */
        kt_fill(&r, i, salt, i, 2);
    kt_cont(&d.proc);
    usleep(500000);
    fresh = 192 - kt_target_verify(&d, ri, li, 192, salt, 2);
    kt_log("a write failed by its deadline while UCX held messages of it: reported %.3f s after "
           "submission; %llu of 192 remote blocks hold data written after the report",
           (double)(kt_now_ns() - t0) / 1e9 - 0.5, (unsigned long long)fresh);
    KT_EQ(fresh, 0);
    for (uint32_t i = 0; i < 192; i++)
        kt_fill(&r, i, salt, i, 0);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&d), 0);
}

int main(void)
{
    r = kt_region_alloc(NB, BL);
    kt_fill_all(&r, salt, 0);
    peer_death(true);
    peer_death(false);
    stall_limit();
    stalled_peer();
    deadlines();
    failed_write_lets_go();
    kt_region_free(&r);
    return 0;
}
