/*
 * Notices with a payload between two transports over real UCX (argv[1]: shm or tcp, UCX_TLS
 * limited to it; KT_RNDV=always moves the data by rendezvous): a write's payload of 0, 1, 4 KiB
 * and 1 MiB seen only once the write's bytes are in the region, a read's at the peer read from
 * once the read's bytes arrived, standalone notices in order, -ENOSPC then success with a bigger
 * buffer, kvx_notice_poll dropping payloads, the queue's payload bound, and the calls' refusals.
 * Every byte moved and every payload byte is checked.
 */
#include "harness.h"

#include <errno.h>
#include <string.h>

#define NB 64
#define BL (64 * 1024)

static uint8_t *nbuf; /* KVX_NOTICE_DATA_MAX bytes */
static uint8_t payload[KVX_NOTICE_DATA_MAX];

static void fill_payload(uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(i * 131u + seed * 7u + (i >> 8));
}
static void check_payload(const kvx_notice_data_t *n, size_t len, unsigned seed)
{
    KT_EQ(n->data_len, len);
    KT_CHECK(n->data != NULL);
    for (size_t i = 0; i < len; i++)
        if (((uint8_t *)n->data)[i] != (uint8_t)(i * 131u + seed * 7u + (i >> 8)))
            KT_FAIL("payload of %zu bytes (seed %u): byte %zu differs", len, seed, i);
}

/* Wait for one notice at t (polled with kvx_notice_poll_data into nbuf). */
static void wait_notice(kvx_transport_t *t, kvx_notice_data_t *out)
{
    uint64_t end = kt_now_ns() + 10000000000ull;
    int n;

    while ((n = kvx_notice_poll_data(t, out, 1, nbuf, KVX_NOTICE_DATA_MAX)) == 0 &&
           kt_now_ns() < end)
        ;
    KT_EQ(n, 1);
}

static uint64_t recv_other(kvx_transport_t *t)
{
    kvx_transport_attr_t a = {.field_mask = KVX_TRANSPORT_ATTR_RECV};
    KT_OK(kvx_transport_query(t, &a));
    return a.recv.drop_other;
}

int main(int argc, char **argv)
{
    const char *tl = argc > 1 ? argv[1] : "shm";
    static const size_t sizes[] = {0, 1, 4096, KVX_NOTICE_DATA_MAX};
    kvx_notice_data_t out[8];
    kvx_completion_t c[4];
    uint32_t li[4], ri[4];
    uint64_t id;
    int rc;

    setenv("UCX_TLS", strcmp(tl, "tcp") == 0 ? "tcp" : "sm", 1);
    nbuf = malloc(KVX_NOTICE_DATA_MAX);
    KT_CHECK(nbuf != NULL);
    kt_region_t r1 = kt_region_alloc(NB, BL), r2 = kt_region_alloc(NB, BL);
    kvx_transport_t *tx = kt_transport(&r1, "nd-writer", 1);
    kvx_transport_t *rx = kt_transport(&r2, "nd-receiver", 1);
    size_t mdl;
    uint8_t *md = kt_metadata(rx, &mdl);
    KT_OK(kvx_peer_add(tx, "rx", md, mdl, NULL));
    free(md);
    kt_fill_all(&r1, 0x51, 1);
    kt_fill_all(&r2, 0x52, 1);

    /* the calls' refusals */
    KT_ERR(kvx_notice_send(tx, "nobody", "x", 1), -ENOENT);
    KT_ERR(kvx_notice_send(tx, "rx", NULL, 1), -EINVAL);
    KT_ERR(kvx_notice_send(tx, "rx", payload, KVX_NOTICE_DATA_MAX + 1), -EINVAL);
    KT_ERR(kvx_notice_send(NULL, "rx", "x", 1), -EINVAL);
    KT_ERR(kvx_notice_poll_data(rx, NULL, 1, nbuf, 1), -EINVAL);
    KT_ERR(kvx_notice_poll_data(rx, out, 0, nbuf, 1), -EINVAL);
    KT_ERR(kvx_notice_poll_data(rx, out, 1, NULL, 1), -EINVAL);
    {
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_NOTICE_DATA,
                                .notice_data = payload,
                                .notice_len = KVX_NOTICE_DATA_MAX + 1};
        li[0] = ri[0] = 0;
        KT_ERR(kvx_xfer_write(tx, "rx", li, ri, 1, &xp, &id), -EINVAL);
        xp.notice_data = NULL;
        xp.notice_len = 1;
        KT_ERR(kvx_xfer_read(tx, "rx", li, ri, 1, &xp, &id), -EINVAL);
    }
    KT_EQ(kvx_notice_poll_data(rx, out, 8, nbuf, KVX_NOTICE_DATA_MAX), 0);

    /* writes: the notice comes only once every byte landed; its payload whole */
    for (unsigned k = 0; k < 4; k++) {
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_NOTICE_DATA | KVX_XFER_PARAM_TAG,
                                .tag = 100 + k,
                                .notice_data = payload,
                                .notice_len = sizes[k]};
        fill_payload(payload, sizes[k], k);
        for (unsigned i = 0; i < 4; i++) {
            li[i] = 4 * k + i;
            ri[i] = 20 + 4 * k + i;
        }
        KT_OK(kvx_xfer_write(tx, "rx", li, ri, 4, &xp, &id));
        memset(payload, 0xee, sizes[k]); /* copied at the call */
        wait_notice(rx, out);
        for (unsigned i = 0; i < 4; i++) /* there before the notice */
            KT_EQ(kt_check(&r2, ri[i], 0x51, li[i], 1), 0);
        KT_EQ(out[0].xfer_id, id);
        KT_EQ(out[0].tag, 100 + k);
        KT_EQ(strcmp(out[0].writer, "nd-writer"), 0);
        check_payload(&out[0], sizes[k], k);
        KT_EQ(kt_poll_n(tx, "rx", c, 1, 10000), 1);
        KT_EQ(c[0].id, id);
        KT_EQ(c[0].status, 0);
    }
    kt_log("writes with payloads of 0, 1, 4096, 1 MiB: ok");

    /* a write with KVX_XFER_NOTIFY alone: a notice without a payload (data NULL) */
    {
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_FLAGS, .flags = KVX_XFER_NOTIFY};
        li[0] = 30;
        ri[0] = 50;
        KT_OK(kvx_xfer_write(tx, "rx", li, ri, 1, &xp, &id));
        wait_notice(rx, out);
        KT_EQ(out[0].xfer_id, id);
        KT_EQ(out[0].data_len, 0);
        KT_CHECK(out[0].data == NULL);
        KT_EQ(kt_poll_n(tx, "rx", c, 1, 10000), 1);
        KT_EQ(c[0].status, 0);
    }

    /* reads: the notice goes to the peer read from, once the read's bytes arrived here */
    for (unsigned k = 0; k < 4; k++) {
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_NOTICE_DATA,
                                .notice_data = payload,
                                .notice_len = sizes[k]};
        fill_payload(payload, sizes[k], 10 + k);
        for (unsigned i = 0; i < 4; i++) {
            li[i] = 40 + 4 * k + i;
            ri[i] = 4 * k + i;
        }
        KT_OK(kvx_xfer_read(tx, "rx", li, ri, 4, &xp, &id));
        wait_notice(rx, out);
        KT_EQ(out[0].xfer_id, id);
        check_payload(&out[0], sizes[k], 10 + k);
        KT_EQ(kt_poll_n(tx, "rx", c, 1, 10000), 1);
        KT_EQ(c[0].status, 0);
        for (unsigned i = 0; i < 4; i++)
            KT_EQ(kt_check_read(&r1, li[i], 0x52, ri[i], 1), 0);
    }
    kt_log("reads with payloads: ok");

    /* standalone notices, in the order sent, xfer_id 0; several per poll */
    for (unsigned k = 0; k < 200; k++) {
        fill_payload(payload, k * 37, 1000 + k);
        KT_OK(kvx_notice_send(tx, "rx", payload, k * 37));
    }
    for (unsigned k = 0; k < 200;) {
        int n = kvx_notice_poll_data(rx, out, 8, nbuf, KVX_NOTICE_DATA_MAX);
        KT_CHECK(n >= 0);
        for (int i = 0; i < n; i++, k++) {
            KT_EQ(out[i].xfer_id, 0);
            KT_EQ(out[i].tag, 0);
            check_payload(&out[i], k * 37, 1000 + k);
        }
    }
    kt_log("200 standalone notices in order: ok");

    /* -ENOSPC: the oldest alone does not fit; out[0] tells its size; a bigger buffer takes it */
    fill_payload(payload, 4096, 7);
    KT_OK(kvx_notice_send(tx, "rx", payload, 4096));
    KT_OK(kvx_notice_send(tx, "rx", payload, 10));
    {
        uint64_t end = kt_now_ns() + 10000000000ull;
        while ((rc = kvx_notice_poll_data(rx, out, 2, nbuf, 100)) == 0 && kt_now_ns() < end)
            ;
        KT_EQ(rc, -ENOSPC);
        KT_EQ(out[0].data_len, 4096);
        KT_EQ(kvx_notice_poll_data(rx, out, 2, nbuf, 4096), 1); /* the second waits for room */
        check_payload(&out[0], 4096, 7);
        end = kt_now_ns() + 10000000000ull;
        while ((rc = kvx_notice_poll_data(rx, out, 2, nbuf, 4096)) == 0 && kt_now_ns() < end)
            ;
        KT_EQ(rc, 1);
        fill_payload(payload, 10, 7);
        check_payload(&out[0], 10, 7);
    }

    /* kvx_notice_poll takes a payload notice too, its payload dropped */
    {
        kvx_notice_t nt[2];
        uint64_t end = kt_now_ns() + 10000000000ull;
        KT_OK(kvx_notice_send(tx, "rx", payload, 100));
        while ((rc = kvx_notice_poll(rx, nt, 2)) == 0 && kt_now_ns() < end)
            ;
        KT_EQ(rc, 1);
        KT_EQ(strcmp(nt[0].writer, "nd-writer"), 0);
        KT_EQ(nt[0].bytes, 0);
    }

    /* the queue's payload bound: 64 MiB wait at most; beyond, refused and counted; a write's
     * notice then fails the write with -ENOSPC; all is well once drained */
    {
        uint64_t before = recv_other(rx), end;
        unsigned want = KVX_NOTICE_QUEUE_BYTES / KVX_NOTICE_DATA_MAX, got = 0;
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_NOTICE_DATA,
                                .notice_data = payload,
                                .notice_len = KVX_NOTICE_DATA_MAX};
        fill_payload(payload, KVX_NOTICE_DATA_MAX, 3);
        for (unsigned k = 0; k < want + 4; k++)
            KT_OK(kvx_notice_send(tx, "rx", payload, KVX_NOTICE_DATA_MAX));
        end = kt_now_ns() + 30000000000ull;
        while (recv_other(rx) < before + 4 && kt_now_ns() < end)
            kvx_transport_wait(tx, NULL, 10);
        KT_EQ(recv_other(rx) - before, 4);
        li[0] = ri[0] = 5;
        KT_OK(kvx_xfer_write(tx, "rx", li, ri, 1, &xp, &id));
        KT_EQ(kt_poll_n(tx, "rx", c, 1, 10000), 1);
        KT_EQ(c[0].status, -ENOSPC);
        KT_EQ(recv_other(rx) - before, 5);
        while ((rc = kvx_notice_poll_data(rx, out, 8, nbuf, KVX_NOTICE_DATA_MAX)) > 0)
            for (int i = 0; i < rc; i++, got++)
                check_payload(&out[i], KVX_NOTICE_DATA_MAX, 3);
        KT_EQ(rc, 0);
        KT_EQ(got, want);
        KT_OK(kvx_xfer_write(tx, "rx", li, ri, 1, &xp, &id));
        wait_notice(rx, out);
        check_payload(&out[0], KVX_NOTICE_DATA_MAX, 3);
        KT_EQ(kt_poll_n(tx, "rx", c, 1, 10000), 1);
        KT_EQ(c[0].status, 0);
    }
    kt_log("the payload bound: ok");

    /* nothing more came out of the writer's poll: standalone notices are never reported */
    KT_EQ(kvx_transport_poll(tx, NULL, c, 4), 0);
    KT_OK(kvx_peer_remove(tx, "rx"));
    kvx_transport_destroy(tx);
    kvx_transport_destroy(rx);
    kt_region_free(&r1);
    kt_region_free(&r2);
    free(nbuf);
    printf("PASS test_notice_data %s\n", tl);
    return 0;
}
