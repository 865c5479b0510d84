/*
 * A peer removed and added again while the target's progress thread sleeps: the target must
 * wake for the new handshake at once, not at its next tick (up to keepalive_ms later).
 *
 * UCX's ucp_worker_arm arms only the interfaces in use; one whose last endpoint just went is
 * re-armed by a callback that the next ucp_worker_progress runs. A thread that armed and slept
 * before that callback ran missed the next message on that interface. The target here spins
 * for 1 us only (kvx's default is 100 us, which hides the race most of the time): each cycle
 * is a remove, a pause with the target asleep, an add and a verified one-block write, and each
 * must finish far below the target's 1 s idle tick. Before the fix, 4-5 of 6 cycles here took
 * 200 ms (the add's wait for the handshake) plus up to 0.8 s for the write.
 */
#include "harness.h"
#include "kvx_int.h"

#include <string.h>
#include <unistd.h>

#define NB 16
#define BL 4096

int main(void)
{
    kt_region_t rt = kt_region_alloc(NB, BL), rw = kt_region_alloc(NB, BL);
    kvx_transport_t *tgt, *w;
    uint8_t *md;
    size_t md_len;
    int slow = 0;

    kt_fill_all(&rt, 1, 0);
    kt_fill_all(&rw, 2, 0);
    tgt = kt_transport(&rt, "rewire-target", 1);
    kvx_lock(&tgt->core);
    tgt->engine.spin_ns = 1000;
    kvx_unlock(&tgt->core);
    w = kt_transport(&rw, "rewire-writer", 1);
    md = kt_metadata(tgt, &md_len);
    for (int i = 0; i < 10; i++) {
        uint32_t l = (uint32_t)i, r = (uint32_t)(NB - 1 - i);
        kvx_completion_t c;
        uint64_t id, t0;

        if (i > 0)
            KT_EQ(kvx_peer_remove(w, "t"), 1);
        usleep(50000); /* the target goes to sleep */
        t0 = kt_now_ns();
        KT_OK(kvx_peer_add(w, "t", md, md_len, NULL));
        KT_OK(kvx_xfer_write(w, "t", &l, &r, 1, NULL, &id));
        KT_EQ(kt_poll_n(w, "t", &c, 1, 5000), 1);
        KT_EQ(c.status, 0);
        KT_EQ(kt_check(&rt, r, 2, l, 0), 0);
        kt_log("cycle %d: add and first write in %.1f ms", i, (double)(kt_now_ns() - t0) / 1e6);
        /* a missed wake-up costs 200 ms (the add's wait) or more; a healthy cycle a few ms */
        slow += kt_now_ns() - t0 > 150000000ull;
    }
    KT_EQ(slow, 0);
    free(md);
    kvx_transport_destroy(w);
    kvx_transport_destroy(tgt);
    kt_region_free(&rt);
    kt_region_free(&rw);
    return 0;
}
