/*
 * Two "hosts": two network namespaces joined by a veth pair, UCX over tcp between them. One
 * write and one read, verified byte for byte. Skipped (77) where namespaces cannot be made;
 * the namespaces (and with them the veth pair) are deleted on every exit path.
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

static kt_netns_t ns;
static kt_target_t tg;

/* Host b, in namespace 1: writes into host a and reads back, through the target's channel it
 * inherited. */
static int host_b(void)
{
    kt_region_t r;
    kvx_transport_t *t;
    uint32_t li[32], ri[32], di[32];
    kvx_completion_t c;
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};
    kvx_recv_counters_t rc;
    uint64_t id;

    r = kt_region_alloc(128, 65536);
    kt_fill_all(&r, 0x77, 0);
    t = kt_transport(&r, "host-b", 1);
    KT_OK(kvx_peer_add(t, "a", tg.md, tg.md_len, NULL));
    KT_OK(kvx_peer_query(t, "a", &pa));
    kt_log("host b reaches host a (%s) over '%s'", ns.addr[0], pa.transport);
    KT_CHECK(strcmp(pa.transport, "tcp") == 0);

    kt_indices(li, 32, 64, true, 1);
    kt_indices(ri, 32, 128, true, 2);
    KT_OK(kvx_xfer_write(t, "a", li, ri, 32, NULL, &id));
    KT_EQ(kt_poll_n(t, "a", &c, 1, 10000), 1);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(&tg, ri, li, 32, 0x77, 0), 0);

    for (int i = 0; i < 32; i++)
        di[i] = 64 + (uint32_t)i;
    kt_target_refill(&tg, 1);
    KT_OK(kvx_xfer_read(t, "a", di, ri, 32, NULL, &id));
    KT_EQ(kt_poll_n(t, "a", &c, 1, 10000), 1);
    KT_EQ(c.status, 0);
    for (int i = 0; i < 32; i++)
        KT_EQ(kt_check(&r, di[i], 4, ri[i], 1), 0);
    /* by rendezvous (KT_RNDV=always, ctest netns_rndv) every run of both went that way */
    kt_target_counters(&tg, &rc);
    kt_log("the receiver took %llu write runs and served %llu read runs by rendezvous",
           (unsigned long long)rc.rndv_landed, (unsigned long long)rc.rndv_served);
    if (kt_rndv_forced()) { /* 32 scattered blocks: 32 runs each way */
        KT_EQ(rc.rndv_landed, 32);
        KT_EQ(rc.rndv_served, 32);
    } else if (getenv("KT_RNDV") == NULL) {
        KT_EQ(rc.rndv_landed, 0);
        KT_EQ(rc.rndv_served, 0);
    }
    kvx_transport_destroy(t);
    kt_region_free(&r);
    return 0;
}

int main(void)
{
    kt_target_args_t a = {
        .num_blocks = 128, .block_len = 65536, .salt = 4, .threads = 1, .name = "host-a"};
    return kt_two_hosts(&ns, &tg, &a, host_b, 60);
}
