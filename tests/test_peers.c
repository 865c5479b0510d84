/*
 * Peers and completions: per-peer poll isolation, unique ids completing exactly once, removal
 * failing only that peer's transfers, replacement of a peer id, and both cancel modes. A target
 * stopped with SIGSTOP keeps transfers in flight deterministically.
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define BL 65536
#define NB 512

static kt_region_t r;
static kvx_transport_t *t;
static const uint64_t salt = 0x33;

static uint64_t submit(const char *peer, uint32_t first, uint32_t n)
{
    uint32_t li[64], ri[64];
    uint64_t id;
    for (uint32_t i = 0; i < n; i++) {
        li[i] = first + i;
        ri[i] = (first + i * 7) % NB; /* scattered on the remote side */
    }
    KT_OK(kvx_xfer_write(t, peer, li, ri, n, NULL, &id));
    return id;
}

static void verify(kt_target_t *tg, uint32_t first, uint32_t n)
{
    uint32_t li[64], ri[64];
    for (uint32_t i = 0; i < n; i++) {
        li[i] = first + i;
        ri[i] = (first + i * 7) % NB;
    }
    KT_EQ(kt_target_verify(tg, ri, li, n, salt, 0), 0);
}

static bool in(const uint64_t *ids, int n, uint64_t id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

static void isolation(void)
{
    uint64_t ida[20], idb[20];
    kvx_completion_t c[64];

    for (int i = 0; i < 20; i++) {
        ida[i] = submit("A", (uint32_t)i * 4, 4);
        idb[i] = submit("B", (uint32_t)i * 4, 4);
    }
    for (int i = 0; i < 20; i++)
        for (int j = 0; j < 20; j++)
            KT_CHECK(ida[i] != idb[j] && (i == j || ida[i] != ida[j]));
    usleep(200000); /* let B's transfers finish too: A's polls must still leave them alone */
    KT_EQ(kt_poll_n(t, "A", c, 20, 5000), 20);
    for (int i = 0; i < 20; i++) {
        KT_CHECK(in(ida, 20, c[i].id));
        KT_EQ(c[i].status, 0);
    }
    KT_EQ(kvx_transport_poll(t, "A", c, 64), 0);
    KT_EQ(kvx_transport_poll(t, "nobody", c, 64), 0);
    KT_EQ(kt_poll_n(t, NULL, c, 20, 5000), 20);
    for (int i = 0; i < 20; i++) {
        KT_CHECK(in(idb, 20, c[i].id));
        KT_EQ(c[i].status, 0);
    }
    KT_EQ(kvx_transport_poll(t, NULL, c, 64), 0);
}

/* Removing A fails A's transfers in flight (they still come out of poll("A")); B's succeed. */
static void remove_fails_only_that_peer(kt_target_t *ta, kt_target_t *tb)
{
    uint64_t ida[8], idb[8];
    kvx_completion_t c[16];
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE | KVX_PEER_ATTR_COUNTERS};

    kt_stop(&ta->proc);
    for (int i = 0; i < 8; i++) {
        ida[i] = submit("A", (uint32_t)i * 32, 32);
        idb[i] = submit("B", (uint32_t)i * 32, 32);
    }
    usleep(100000);
    KT_EQ(kvx_transport_poll(t, "A", c, 16), 0); /* A is stopped: nothing of it can finish */
    KT_EQ(kvx_peer_remove(t, "A"), 1);
    KT_EQ(kvx_peer_remove(t, "A"), 0); /* unknown now: a no-op */
    KT_ERR(kvx_xfer_write(t, "A", (uint32_t[]){0}, (uint32_t[]){0}, 1, NULL, &(uint64_t){0}),
           -ENOENT);
    KT_OK(kvx_peer_query(t, "A", &pa));
    KT_EQ(pa.state, KVX_PEER_REMOVED);
    KT_EQ(kt_poll_n(t, "A", c, 8, 1000), 8);
    for (int i = 0; i < 8; i++) {
        KT_CHECK(in(ida, 8, c[i].id));
        KT_ERR(c[i].status, -ECONNABORTED);
    }
    /* drained: the removed peer is gone for good */
    KT_ERR(kvx_peer_query(t, "A", &pa), -ENOENT);
    KT_EQ(kt_poll_n(t, "B", c, 8, 5000), 8);
    for (int i = 0; i < 8; i++) {
        KT_CHECK(in(idb, 8, c[i].id));
        KT_EQ(c[i].status, 0);
    }
    for (int i = 0; i < 8; i++)
        verify(tb, (uint32_t)i * 32, 32);
    kt_cont(&ta->proc);

    /* A comes back under the same id and works */
    KT_OK(kvx_peer_add(t, "A", ta->md, ta->md_len, NULL));
    submit("A", 0, 32);
    KT_EQ(kt_poll_n(t, "A", c, 1, 5000), 1);
    KT_EQ(c[0].status, 0);
    verify(ta, 0, 32);
}

/* Re-adding B replaces its connection: B's transfers in flight fail; the new one works. Then
 * "B" is pointed at target C, and writes to "B" land in C. */
static void replace(kt_target_t *tb, kt_target_t *tc)
{
    uint64_t ids[4];
    kvx_completion_t c[8];
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_AGENT_NAME | KVX_PEER_ATTR_STATE};

    kt_stop(&tb->proc);
    for (int i = 0; i < 4; i++)
        ids[i] = submit("B", (uint32_t)i * 32, 32);
    KT_OK(kvx_peer_add(t, "B", tb->md, tb->md_len, NULL));
    KT_EQ(kt_poll_n(t, "B", c, 4, 1000), 4);
    for (int i = 0; i < 4; i++) {
        KT_CHECK(in(ids, 4, c[i].id));
        KT_ERR(c[i].status, -ECONNABORTED);
    }
    kt_cont(&tb->proc);
    submit("B", 128, 32);
    KT_EQ(kt_poll_n(t, "B", c, 1, 5000), 1);
    KT_EQ(c[0].status, 0);
    verify(tb, 128, 32);

    KT_OK(kvx_peer_add(t, "B", tc->md, tc->md_len, NULL));
    KT_OK(kvx_peer_query(t, "B", &pa));
    KT_CHECK(strcmp(pa.agent_name, "target-c") == 0);
    /* its handshake may still be under way (kvx_peer_add waits 200 ms for it) */
    for (uint64_t end = kt_now_ns() + 5000000000ull;
         pa.state == KVX_PEER_WIRING && kt_now_ns() < end;) {
        usleep(1000);
        KT_OK(kvx_peer_query(t, "B", &pa));
    }
    KT_EQ(pa.state, KVX_PEER_CONNECTED);
    submit("B", 256, 32);
    KT_EQ(kt_poll_n(t, "B", c, 1, 5000), 1);
    KT_EQ(c[0].status, 0);
    verify(tc, 256, 32);
}

/* kvx_transport_wait sleeps until poll has something for the given scope, or times out. */
static void wait_for_completions(kt_target_t *ta)
{
    kvx_completion_t c[4];
    uint64_t id, t0;

    t0 = kt_now_ns();
    KT_EQ(kvx_transport_wait(t, NULL, 100), 0); /* nothing in flight: times out */
    KT_CHECK(kt_now_ns() - t0 >= 90000000ull);
    id = submit("A", 0, 32);
    KT_EQ(kvx_transport_wait(t, "B", 50), 0); /* A's completion is not B's */
    KT_EQ(kvx_transport_wait(t, "A", 5000), 1);
    KT_EQ(kvx_transport_wait(t, NULL, 5000), 1); /* it consumed nothing */
    KT_EQ(kvx_transport_poll(t, "A", c, 4), 1);
    KT_EQ(c[0].id, id);
    KT_EQ(c[0].status, 0);
    verify(ta, 0, 32);
    KT_ERR(kvx_transport_wait(NULL, NULL, 0), -EINVAL);
}

static void cancel(kt_target_t *ta)
{
    uint64_t ids[6], pending[6], done_id;
    kvx_completion_t c[8];
    int np;

    /* a finished but unpolled transfer is forgotten by either mode */
    done_id = submit("A", 0, 1);
    usleep(100000);
    KT_EQ(kvx_xfer_cancel(t, &done_id, 1, KVX_CANCEL_WAIT, pending), 0);
    KT_EQ(kvx_transport_poll(t, "A", c, 8), 0);
    KT_EQ(kvx_xfer_cancel(t, (uint64_t[]){12345678}, 1, KVX_CANCEL_WAIT, pending), 0);
    KT_ERR(kvx_xfer_cancel(t, ids, 1, 7, pending), -EINVAL);

    kt_stop(&ta->proc);
    for (int i = 0; i < 6; i++)
        ids[i] = submit("A", (uint32_t)i * 32, 32);
    /* immediate forgets a transfer at once: it leaves the peer's in-flight count, a later cancel
     * no longer knows it, and it never comes out of poll (checked at the end) */
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_COUNTERS};
        kvx_stats_t st = {.field_mask = KVX_STATS_XFERS};
        uint64_t failed0;
        KT_OK(kvx_peer_query(t, "A", &pa));
        KT_EQ(pa.xfers_inflight, 6);
        failed0 = pa.xfers_failed;
        KT_EQ(kvx_xfer_cancel(t, ids + 5, 1, KVX_CANCEL_IMMEDIATE, pending), 0);
        KT_OK(kvx_peer_query(t, "A", &pa));
        KT_EQ(pa.xfers_inflight, 5);
        /* counted as it ended, as kvx_stats_t counts it (kvx.h): failed, canceled */
        KT_EQ(pa.xfers_failed, failed0 + 1);
        KT_OK(kvx_stats_query(t, "A", &st));
        KT_CHECK(st.xfers[0][KVX_STATUS_CANCELED] >= 1);
        KT_EQ(kvx_xfer_cancel(t, ids + 5, 1, KVX_CANCEL_WAIT, pending), 0);
    }
    /* Wait reports what UCX still holds messages of: with A stopped, its FIFO (4 MiB) fills and
     * the transfer being posted then has messages UCX keeps; those before it were copied into
     * the FIFO and are forgotten, those after it never started. */
    usleep(100000); /* the progress thread posts until the FIFO is full */
    np = kvx_xfer_cancel(t, ids, 5, KVX_CANCEL_WAIT, pending);
    KT_OK(np);
    kt_log("cancel wait: %d of 5 transfers may still touch memory", np);
    KT_CHECK(np >= 1);
    for (int i = 0; i < np; i++)
        KT_CHECK(in(ids, 5, pending[i]));
    {
        /* the same id twice in one call is reported once; a later call reports it again,
         * since it may still touch memory */
        uint64_t twice[2] = {pending[0], pending[0]}, out[2];
        KT_EQ(kvx_xfer_cancel(t, twice, 2, KVX_CANCEL_WAIT, out), 1);
        KT_EQ(out[0], pending[0]);
    }
    usleep(100000);
    KT_EQ(kvx_transport_poll(t, "A", c, 8), 0); /* nothing can finish while A is stopped */
    kt_cont(&ta->proc);
    KT_EQ(kt_poll_n(t, "A", c, np, 5000), np);
    for (int i = 0; i < np; i++) {
        KT_CHECK(in(pending, np, c[i].id));
        KT_ERR(c[i].status, -ECANCELED);
    }
    usleep(100000);
    KT_EQ(kvx_transport_poll(t, NULL, c, 8), 0); /* the forgotten ones never show up */
}

/* Removing with KVX_PEER_REMOVE_PURGE forgets the peer's transfers, finished or not: none ever
 * comes out of poll, and the peer id is gone at once. */
static void purge(kt_target_t *ta)
{
    kvx_completion_t c[16];
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};

    for (int i = 0; i < 3; i++)
        submit("A", (uint32_t)i * 8, 8);
    usleep(200000); /* finished, not polled */
    kt_stop(&ta->proc);
    for (int i = 0; i < 4; i++)
        submit("A", (uint32_t)i * 32, 32);
    KT_ERR(kvx_peer_remove_ex(t, "A", 2), -EINVAL);
    KT_ERR(kvx_peer_remove_ex(t, "A", KVX_PEER_REMOVE_PURGE | 4), -EINVAL);
    KT_EQ(kvx_peer_remove_ex(t, "A", KVX_PEER_REMOVE_PURGE), 1);
    KT_ERR(kvx_peer_query(t, "A", &pa), -ENOENT);
    KT_EQ(kvx_transport_poll(t, "A", c, 16), 0);
    kt_cont(&ta->proc);
    usleep(300000);
    KT_EQ(kvx_transport_poll(t, NULL, c, 16), 0);
    KT_EQ(kvx_peer_remove_ex(t, "A", KVX_PEER_REMOVE_PURGE), 0); /* unknown: a no-op */
    KT_OK(kvx_peer_add(t, "A", ta->md, ta->md_len, NULL));
    submit("A", 64, 16);
    KT_EQ(kt_poll_n(t, "A", c, 1, 5000), 1);
    KT_EQ(c[0].status, 0);
    verify(ta, 64, 16);
}

/* The id is unknown at once however its transfers were purged and whatever follows: an add that
 * replaced its connection with KVX_PEER_ADD_PURGE while its writes waited in UCX, then a plain
 * remove; a purging remove, a re-add and a plain remove. Nothing of the purged ones is polled. */
static void purge_then_remove(kt_target_t *ta, kt_target_t *tc)
{
    kvx_peer_params_t pp = {.field_mask = KVX_PEER_PARAM_FLAGS, .flags = KVX_PEER_ADD_PURGE};
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
    kvx_completion_t c[16];

    KT_OK(kvx_peer_add(t, "A", ta->md, ta->md_len, NULL));
    kt_stop(&ta->proc);
    for (int i = 0; i < 4; i++)
        submit("A", (uint32_t)i * 32, 32);
    KT_OK(kvx_peer_add(t, "A", tc->md, tc->md_len, &pp));
    KT_EQ(kvx_peer_remove(t, "A"), 1);
    KT_ERR(kvx_peer_query(t, "A", &pa), -ENOENT);
    KT_EQ(kvx_transport_poll(t, "A", c, 16), 0);
    kt_cont(&ta->proc);

    KT_OK(kvx_peer_add(t, "A", ta->md, ta->md_len, NULL));
    kt_stop(&ta->proc);
    for (int i = 0; i < 4; i++)
        submit("A", (uint32_t)i * 32, 32);
    KT_EQ(kvx_peer_remove_ex(t, "A", KVX_PEER_REMOVE_PURGE), 1);
    KT_OK(kvx_peer_add(t, "A", tc->md, tc->md_len, NULL));
    KT_EQ(kvx_peer_remove(t, "A"), 1);
    KT_ERR(kvx_peer_query(t, "A", &pa), -ENOENT);
    kt_cont(&ta->proc);
    usleep(300000);
    KT_EQ(kvx_transport_poll(t, NULL, c, 16), 0);
}

int main(void)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 1, .threads = 1, .name = "target-a"};
    kt_target_args_t b = a, cc = a;
    kt_target_t ta, tb, tc;

    b.name = "target-b";
    cc.name = "target-c";
    ta = kt_target_start(&a);
    tb = kt_target_start(&b);
    tc = kt_target_start(&cc);
    r = kt_region_alloc(NB, BL);
    kt_fill_all(&r, salt, 0);
    t = kt_transport(&r, "initiator", 1);
    KT_OK(kvx_peer_add(t, "A", ta.md, ta.md_len, NULL));
    KT_OK(kvx_peer_add(t, "B", tb.md, tb.md_len, NULL));

    isolation();
    wait_for_completions(&ta);
    remove_fails_only_that_peer(&ta, &tb);
    replace(&tb, &tc);
    cancel(&ta);
    purge(&ta);
    purge_then_remove(&ta, &tc);

    kvx_transport_destroy(t);
    kt_region_free(&r);
    KT_EQ(kt_target_stop(&ta), 0);
    KT_EQ(kt_target_stop(&tb), 0);
    KT_EQ(kt_target_stop(&tc), 0);
    return 0;
}
