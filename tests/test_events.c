/*
 * The event fd and the statistics: a loop that waits only on kvx_transport_event_fd gets every
 * completion (it is readable while poll has something, and not once drained), notices and
 * closing wake it too; kvx_stats_query counts every transfer by op and status, in its latency
 * histogram and its bytes, for the peer and the transport. Real peers, every byte checked.
 */
#include "harness.h"

#include <errno.h>
#include <poll.h>
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
