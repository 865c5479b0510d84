/*
 * Re-adding a peer id with KVX_PEER_ADD_PURGE forgets the old connection's transfers in flight
 * (their ids never come out of poll), where a plain re-add fails them with -ECONNABORTED; the
 * new connection works, byte for byte; unknown flags are refused with nothing changed.
 */
#include "harness.h"

#include <errno.h>
#include <string.h>

#define NB 16
#define BL 65536

static int run(bool purge)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 4, .threads = 1, .name = "purge-target"};
    kt_target_t tg = kt_target_start(&a);
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_transport_t *t = kt_transport_ex(&r, "purge-writer", 1, NULL, 10000);
    kvx_peer_params_t pp = {.field_mask = KVX_PEER_PARAM_FLAGS, .flags = KVX_PEER_ADD_PURGE};
    kvx_peer_params_t bad = {.field_mask = KVX_PEER_PARAM_FLAGS, .flags = 2};
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
    uint32_t l[8] = {0, 1, 2, 3, 4, 5, 6, 7}, d[8] = {8, 9, 10, 11, 12, 13, 14, 15};
    kvx_completion_t c[4];
    uint64_t id, stuck, seen_stuck = 0;
    int n;

    kt_fill_all(&r, 0x33, 1);
    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    KT_OK(kvx_xfer_write(t, "p", l, d, 1, NULL, &id));
    KT_EQ(kt_poll_n(t, "p", c, 1, 10000), 1);
    KT_EQ(c[0].status, 0);
    /* bad flags: refused, the peer unchanged */
    KT_ERR(kvx_peer_add(t, "p", tg.md, tg.md_len, &bad), -EINVAL);
    KT_OK(kvx_peer_query(t, "p", &pa));
    KT_EQ(pa.state, KVX_PEER_CONNECTED);
    /* a write in flight to a stopped target, then the re-add */
    kt_stop(&tg.proc);
    KT_OK(kvx_xfer_write(t, "p", l, d, 8, NULL, &stuck));
    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, purge ? &pp : NULL));
    kt_cont(&tg.proc);
    /* the new connection works */
    KT_OK(kvx_xfer_write(t, "p", l + 1, d + 1, 2, NULL, &id));
    for (uint64_t t0 = kt_now_ns(); kt_now_ns() - t0 < 10000000000ull;) {
        n = kt_poll_n(t, "p", c, 1, 100);
        if (n == 0)
            continue;
        if (c[0].id == stuck) {
            seen_stuck = 1;
            KT_ERR(c[0].status, -ECONNABORTED);
            continue;
        }
        KT_EQ(c[0].id, id);
        KT_EQ(c[0].status, 0);
        break;
    }
    KT_EQ(kt_target_verify(&tg, d + 1, l + 1, 2, 0x33, 1), 0);
    /* and nothing else comes out for the purged one */
    n = kt_poll_n(t, "p", c, 1, 500);
    if (n == 1) {
        KT_EQ(c[0].id, stuck);
        KT_ERR(c[0].status, -ECONNABORTED);
        seen_stuck = 1;
    }
    kt_log("%s re-add: the old connection's write %s", purge ? "purging" : "plain",
           seen_stuck ? "came out failed (-ECONNABORTED)" : "never came out");
    KT_EQ(seen_stuck, purge ? 0 : 1);
    kvx_transport_destroy(t);
    kt_region_free(&r);
    return kt_target_stop(&tg);
}

int main(void)
{
    int rc = run(false) | run(true);
    if (rc == 0)
        printf("PASS test_purge_readd\n");
    return rc;
}
