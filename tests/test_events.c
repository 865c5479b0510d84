/*
 * The event fds and the statistics: a loop that waits only on kvx_transport_event_fd gets every
 * completion (it is readable while poll has something, and not once drained), notices and
 * closing wake it too; the fd of each mask of kinds (kvx_transport_event_fd_ex) is readable
 * exactly while its kinds have something, whatever waits of the others; kvx_stats_query counts
 * every transfer by op and status, in its latency histogram and its bytes, for the peer and the
 * transport. Real peers, every byte checked.
 */
#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>

#define NB 64
#define BL 65536

static bool readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, timeout_ms);
    KT_CHECK(n >= 0);
    return n == 1 && (p.revents & POLLIN);
}

static uint64_t sum(const uint64_t *v, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += v[i];
    return s;
}

/* Each of fds[1..KVX_EVENT_ALL] (the fd of that mask) is readable exactly when its mask shares a
 * kind with kinds. */
static void expect_fds(const int *fds, unsigned kinds, const char *when)
{
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++) {
        bool r = readable(fds[m], 0);
        if (r != ((m & kinds) != 0))
            KT_FAIL("%s: the fd of kinds %u is %sreadable", when, m, r ? "" : "not ");
    }
}

/* The progress thread sets the fds of an arrival one after the other, under t's lock: once one
 * is readable, a call that takes the lock returns after it has set them all. */
static void settle(kvx_transport_t *t)
{
    kvx_stats_t st = {.field_mask = KVX_STATS_EVENTS};
    KT_OK(kvx_stats_query(t, NULL, &st));
}

/* Every mask's fd of t (and the checks of bad kinds, which change nothing). */
static void open_fds(kvx_transport_t *t, int *fds)
{
    const unsigned bad[] = {0, KVX_EVENT_ALL + 1, KVX_EVENT_COMPLETIONS | 8, 1u << 31, ~0u};
    size_t nfd = kt_count_entries("/proc/self/fd");
    int fd = -2, all;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        KT_ERR(kvx_transport_event_fd_ex(t, bad[i], &fd), -EINVAL);
    KT_ERR(kvx_transport_event_fd_ex(NULL, KVX_EVENT_ALL, &fd), -EINVAL);
    KT_ERR(kvx_transport_event_fd_ex(t, KVX_EVENT_NOTICES, NULL), -EINVAL);
    KT_EQ(fd, -2);                                 /* not written */
    KT_EQ(kt_count_entries("/proc/self/fd"), nfd); /* nothing made */
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++) {
        KT_OK(kvx_transport_event_fd_ex(t, m, &fds[m]));
        for (unsigned k = 1; k < m; k++)
            KT_CHECK(fds[k] != fds[m]); /* one per mask */
    }
    KT_EQ(kt_count_entries("/proc/self/fd"), nfd + KVX_EVENT_ALL);
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++) { /* asked again: the same, nothing new */
        KT_OK(kvx_transport_event_fd_ex(t, m, &fd));
        KT_EQ(fd, fds[m]);
    }
    KT_OK(kvx_transport_event_fd(t, &all));
    KT_EQ(all, fds[KVX_EVENT_ALL]);
    KT_EQ(kt_count_entries("/proc/self/fd"), nfd + KVX_EVENT_ALL);
    expect_fds(fds, 0, "new");
}

/*
 * The fd of each mask of kinds, on a writer (completions, peer events) and a receiver (notices):
 * readable exactly while a poll of its kinds has something, whatever waits of the other kinds;
 * not once drained; readable for good once the transport closes.
 */
static void fds_by_kind(void)
{
    kt_target_args_t ta = {
        .num_blocks = NB, .block_len = BL, .salt = 0x6e, .threads = 1, .listen = "127.0.0.1:0"};
    kt_target_t tg = kt_target_start(&ta);
    kt_region_t r = kt_region_alloc(NB, BL), r2 = kt_region_alloc(NB, BL);
    kvx_transport_t *tx = kt_transport(&r, "fds-writer", 1);
    kvx_transport_t *rx = kt_transport(&r2, "fds-receiver", 1);
    kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_FLAGS | KVX_XFER_PARAM_TAG,
                            .flags = KVX_XFER_NOTIFY,
                            .tag = 4};
    int txf[KVX_EVENT_ALL + 1], rxf[KVX_EVENT_ALL + 1], fd;
    uint32_t li = 5, ri = 9;
    kvx_completion_t c[2];
    kvx_notice_t nt[2];
    kvx_peer_event_t ev[4];
    uint8_t *md;
    size_t md_len;
    uint64_t id;

    open_fds(tx, txf);
    open_fds(rx, rxf);
    kt_fill_all(&r, 0x22, 1);
    md = kt_metadata(rx, &md_len);
    KT_OK(kvx_peer_add(tx, "rx", md, md_len, NULL));
    free(md);

    /* a completion waits on the writer (kvx_transport_wait takes none), a notice on the
     * receiver: each side's fds of that kind only */
    KT_OK(kvx_xfer_write(tx, "rx", &li, &ri, 1, &xp, &id));
    KT_EQ(kvx_transport_wait(tx, NULL, 10000), 1);
    KT_CHECK(readable(rxf[KVX_EVENT_NOTICES], 5000));
    settle(rx);
    expect_fds(txf, KVX_EVENT_COMPLETIONS, "writer, a completion waiting");
    expect_fds(rxf, KVX_EVENT_NOTICES, "receiver, a notice waiting");
    KT_EQ(kt_check(&r2, ri, 0x22, li, 1), 0);
    KT_EQ(kvx_notice_poll(rx, nt, 2), 1);
    KT_EQ(nt[0].tag, 4);
    expect_fds(rxf, 0, "receiver, drained");
    expect_fds(txf, KVX_EVENT_COMPLETIONS, "writer, after the receiver drained");

    /* a peer event while the completion still waits: both kinds; then each drained alone */
    KT_OK(kvx_peer_connect(tx, "p", tg.listen_addr, NULL));
    expect_fds(txf, KVX_EVENT_COMPLETIONS, "writer, paired by address");
    kt_kill(&tg.proc, SIGKILL);
    KT_EQ(kt_wait(&tg.proc), 128 + SIGKILL);
    KT_CHECK(readable(txf[KVX_EVENT_PEER_EVENTS], 10000));
    settle(tx);
    expect_fds(txf, KVX_EVENT_COMPLETIONS | KVX_EVENT_PEER_EVENTS, "writer, an event too");
    KT_EQ(kvx_transport_poll(tx, NULL, c, 2), 1);
    KT_EQ(c[0].id, id);
    KT_EQ(c[0].status, 0);
    expect_fds(txf, KVX_EVENT_PEER_EVENTS, "writer, completions drained");
    KT_EQ(kvx_peer_event_poll(tx, ev, 4), 1);
    KT_EQ(ev[0].type, KVX_PEER_EVENT_DOWN);
    expect_fds(txf, 0, "writer, drained");
    KT_EQ(kvx_peer_remove(tx, "p"), 1);
    KT_OK(kvx_peer_remove(tx, "rx"));

    /* closing makes every one readable, for good; none is made any more */
    KT_OK(kvx_transport_close(tx));
    expect_fds(txf, KVX_EVENT_ALL, "writer, closed");
    expect_fds(txf, KVX_EVENT_ALL, "writer, closed, again");
    KT_ERR(kvx_transport_event_fd_ex(tx, KVX_EVENT_NOTICES, &fd), -ESHUTDOWN);
    expect_fds(rxf, 0, "receiver, its writer closed");
    kvx_transport_destroy(tx);
    kvx_transport_destroy(rx);
    free(tg.md);
    kt_region_free(&r);
    kt_region_free(&r2);
}

int main(void)
{
    kt_target_args_t ta = {.num_blocks = NB, .block_len = BL, .salt = 0x5e, .threads = 1};
    kt_target_t tg = kt_target_start(&ta);
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_transport_t *t = kt_transport(&r, NULL, 1);
    uint32_t li[NB], ri[NB];
    kvx_completion_t c[NB];
    kvx_stats_t ps = {.field_mask = KVX_STATS_XFERS | KVX_STATS_LATENCY | KVX_STATS_EVENTS};
    kvx_stats_t ts = ps;
    uint64_t id, cancel_ids[4], pending[4];
    int fd, fd2, got = 0, wakes = 0, np;
    const int writes = 20, reads = 10;

    KT_ERR(kvx_transport_event_fd(NULL, &fd), -EINVAL);
    KT_ERR(kvx_transport_event_fd(t, NULL), -EINVAL);
    KT_ERR(kvx_stats_query(t, "nobody", &ps), -ENOENT);
    KT_ERR(kvx_stats_query(t, "", &ps), -EINVAL);
    fds_by_kind();
    KT_OK(kvx_transport_event_fd(t, &fd));
    KT_OK(kvx_transport_event_fd(t, &fd2));
    KT_EQ(fd, fd2); /* one fd per transport */
    KT_CHECK(!readable(fd, 0));
    kt_fill_all(&r, 0x11, 1);
    KT_OK(kvx_peer_add(t, "target", tg.md, tg.md_len, NULL));

    /* writes and reads in flight; wait on the fd alone, then poll everything it announced */
    for (int i = 0; i < writes + reads; i++) {
        uint32_t b = (uint32_t)(i % (NB / 2));
        li[0] = b;
        ri[0] = i < writes ? b : b + NB / 2;
        if (i < writes)
            KT_OK(kvx_xfer_write(t, "target", li, ri, 1, NULL, &id));
        else
            KT_OK(kvx_xfer_read(t, "target", li, ri, 1, NULL, &id));
        if (i == writes - 1) { /* the writes land before the reads take the upper half */
            while (got < writes) {
                KT_CHECK(readable(fd, 10000));
                wakes++;
                int n = kvx_transport_poll(t, NULL, c, NB);
                KT_CHECK(n >= 0);
                for (int k = 0; k < n; k++)
                    KT_EQ(c[k].status, 0);
                got += n;
                if (got == writes) /* drained: no longer readable */
                    KT_CHECK(!readable(fd, 0));
            }
        }
    }
    while (got < writes + reads) {
        KT_CHECK(readable(fd, 10000));
        wakes++;
        /* take one at a time: the fd stays readable while more wait (level) */
        int n = kvx_transport_poll(t, NULL, c, 1);
        KT_CHECK(n >= 0);
        if (n == 1)
            KT_EQ(c[0].status, 0);
        got += n;
    }
    KT_CHECK(!readable(fd, 0));
    kt_log("%d completions in %d wake-ups", got, wakes);
    for (int i = 0; i < writes + reads; i++) {
        uint32_t b = (uint32_t)(i % (NB / 2));
        li[0] = ri[0] = b;
        if (i < writes) /* the target's block b holds what local block b held */
            KT_EQ(kt_target_verify(&tg, ri, li, 1, 0x11, 1), 0);
        else /* local block b holds the target's block b + NB/2, as it was made */
            KT_EQ(kt_check(&r, b, 0x5e, b + NB / 2, 0), 0);
    }

    /* two writes canceled before they run: counted as canceled, and their completions wake the
     * fd as any */
    kt_stop(&tg.proc);
    for (int i = 0; i < 2; i++) {
        uint32_t b = (uint32_t)i;
        KT_OK(kvx_xfer_write(t, "target", &b, &b, 1, NULL, &cancel_ids[i]));
    }
    np = kvx_xfer_cancel(t, cancel_ids, 2, KVX_CANCEL_WAIT, pending);
    KT_CHECK(np >= 0 && np <= 2);
    kt_cont(&tg.proc);
    /* ids not reported pending were forgotten at once; the np others come out canceled, each
     * waking the fd */
    for (uint64_t t0 = kt_now_ns(); np > 0 && kt_now_ns() - t0 < 5000000000ull;) {
        if (!readable(fd, 100))
            continue;
        int n = kvx_transport_poll(t, NULL, c, NB);
        for (int k = 0; k < n; k++)
            KT_EQ(c[k].status, -ECANCELED);
        np -= n;
    }
    KT_EQ(np, 0);

    /* statistics: the peer's and the transport's agree with what was done */
    KT_OK(kvx_stats_query(t, "target", &ps));
    KT_OK(kvx_stats_query(t, NULL, &ts));
    KT_EQ(ps.xfers[0][KVX_STATUS_OK], writes);
    KT_EQ(ps.xfers[1][KVX_STATUS_OK], reads);
    KT_EQ(ps.bytes[0], (uint64_t)writes * BL);
    KT_EQ(ps.bytes[1], (uint64_t)reads * BL);
    KT_EQ(ps.xfers[0][KVX_STATUS_CANCELED], 2);
    KT_EQ(sum(ps.latency, KVX_LATENCY_BUCKETS), writes + reads + 2);
    KT_CHECK(ps.latency_sum_ns > 0);
    KT_EQ(ps.latency[KVX_LATENCY_BUCKETS - 1], 0);          /* nothing took 8 s */
    KT_EQ(memcmp(ps.xfers, ts.xfers, sizeof(ps.xfers)), 0); /* one peer so far */
    KT_EQ(memcmp(ps.latency, ts.latency, sizeof(ps.latency)), 0);
    KT_EQ(ps.fences, 0);
    KT_EQ(ps.reconnections, 0);
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_COUNTERS};
        KT_OK(kvx_peer_query(t, "target", &pa));
        KT_EQ(pa.xfers_done, writes + reads);
        KT_EQ(pa.bytes_written, ps.bytes[0]);
    }
    /* the peer list */
    {
        char ids[64];
        size_t len = 3;
        KT_ERR(kvx_peer_list(t, ids, &len), -ENOSPC);
        KT_EQ(len, 7);
        len = sizeof(ids);
        KT_EQ(kvx_peer_list(t, ids, &len), 1);
        KT_EQ(len, 7);
        KT_EQ(strcmp(ids, "target"), 0);
        len = 0;
        KT_ERR(kvx_peer_list(t, NULL, &len), -ENOSPC);
        KT_ERR(kvx_peer_list(t, NULL, NULL), -EINVAL);
    }
    /* only what the mask names is written */
    {
        kvx_stats_t m;
        memset(&m, 0xab, sizeof(m));
        m.field_mask = KVX_STATS_EVENTS;
        KT_OK(kvx_stats_query(t, "target", &m));
        KT_EQ(m.xfers[0][0], 0xababababababababull);
        KT_EQ(m.reconnections, 0);
    }

    /* a receiving side's fd: readable when an arrival notice waits, not once it is taken */
    {
        kt_region_t r2 = kt_region_alloc(NB, BL);
        kvx_transport_t *t2 = kt_transport(&r2, "receiver", 1);
        uint8_t *md2;
        size_t md2_len;
        kvx_notice_t nt[2];
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_FLAGS | KVX_XFER_PARAM_TAG,
                                .flags = KVX_XFER_NOTIFY,
                                .tag = 9};
        int fd3;
        KT_OK(kvx_transport_event_fd(t2, &fd3));
        md2 = kt_metadata(t2, &md2_len);
        KT_OK(kvx_peer_add(t, "receiver", md2, md2_len, NULL));
        li[0] = 3;
        ri[0] = 7;
        KT_OK(kvx_xfer_write(t, "receiver", li, ri, 1, &xp, &id));
        KT_EQ(kt_poll_n(t, "receiver", c, 1, 10000), 1);
        KT_EQ(c[0].status, 0);
        KT_CHECK(readable(fd3, 5000));
        KT_EQ(kvx_notice_poll(t2, nt, 2), 1);
        KT_EQ(nt[0].tag, 9);
        KT_CHECK(!readable(fd3, 0));
        KT_EQ(kt_check(&r2, 7, 0x11, 3, 1), 0);
        KT_OK(kvx_peer_remove(t, "receiver"));
        kvx_transport_destroy(t2);
        free(md2);
        kt_region_free(&r2);
    }
    KT_OK(kvx_stats_query(t, NULL, &ts));
    KT_EQ(ts.xfers[0][KVX_STATUS_OK], writes + 1); /* the transport counts every peer's */

    /* close wakes a loop waiting on the fd, which stays valid until destroy */
    KT_CHECK(!readable(fd, 0));
    KT_OK(kvx_transport_close(t));
    KT_CHECK(readable(fd, 0));
    KT_ERR(kvx_transport_event_fd(t, &fd2), -ESHUTDOWN);
    KT_ERR(kvx_stats_query(t, NULL, &ts), -ESHUTDOWN);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&tg), 0);
    kt_region_free(&r);
    printf("PASS test_events\n");
    return 0;
}
