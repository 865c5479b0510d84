/*
 * kvx-bench --load: random traffic for a set time, every block read back and compared.
 */
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * --load: random traffic for a given time, every byte checked. Each peer gets `inflight` lanes;
 * a lane owns a slice of the peer's region (this initiator's share of it) and a scratch area
 * here, and loops: write a random number of random local blocks into random blocks of its slice,
 * read those blocks back into its scratch area, compare with what was written. Each completion
 * must name the id its lane waits for: an id that completes twice, or that nobody waits for,
 * fails the run, as does any failed transfer or any wrong byte.
 */
typedef struct lane {
    int peer;
    uint64_t id; /* 0: idle */
    int phase;   /* 0 write in flight, 1 read in flight */
    uint32_t n;
    uint32_t rbase, lscratch, span;
    uint32_t src[4096], dst[4096], scr[4096];
} lane_t;

void run_load(int *ctl, uint64_t size, result_t *res_out, int *nres)
{
    client_t cl;
    int lanes_per_peer = o.inflight < 2 ? 8 : o.inflight, nlanes, busy = 0;
    uint64_t half, span_r, span, scratch_per_lane, end, start, rng;
    uint64_t writes = 0, reads = 0, bytes = 0, bad = 0, blocks_max;
    lane_t *lanes;
    kvx_completion_t comp[64];

    client_open(&cl, ctl, size);
    half = cl.nb / 2; /* sources below, scratch areas above */
    nlanes = lanes_per_peer * cl.npeers;
    span_r = cl.nb / (uint64_t)o.clients;
    span = span_r / (uint64_t)lanes_per_peer;
    scratch_per_lane = (cl.nb - half) / (uint64_t)nlanes;
    blocks_max = o.blocks ? o.blocks : 64;
    if (blocks_max > span)
        blocks_max = span;
    if (blocks_max > scratch_per_lane)
        blocks_max = scratch_per_lane;
    if (blocks_max > 4096)
        blocks_max = 4096;
    if (blocks_max == 0)
        die("--load: the region is too small for %d lanes x %d peers", lanes_per_peer, cl.npeers);
    lanes = calloc((size_t)nlanes, sizeof(*lanes));
    for (int i = 0; i < nlanes; i++) {
        lanes[i].peer = i % cl.npeers;
        lanes[i].rbase =
            (uint32_t)((uint64_t)o.client_index * span_r + (uint64_t)(i / cl.npeers) * span);
        lanes[i].lscratch = (uint32_t)(half + (uint64_t)i * scratch_per_lane);
        lanes[i].span = (uint32_t)span;
    }
    rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 20) ^ now_ns();
#define RND() (rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17, rng)

    start = now_ns();
    end = start + (uint64_t)(o.load_s * 1e9);
    for (;;) {
        bool stopping = now_ns() >= end;
        for (int i = 0; i < nlanes && !stopping; i++) {
            lane_t *l = &lanes[i];
            if (l->id != 0)
                continue;
            /* a new write of n random sources into n distinct random blocks of the slice */
            l->n = (uint32_t)(1 + RND() % blocks_max);
            for (uint32_t k = 0; k < l->n; k++) {
                uint32_t d;
                bool dup;
                l->src[k] = (uint32_t)(RND() % half);
                do {
                    d = l->rbase + (uint32_t)(RND() % l->span);
                    dup = false;
                    for (uint32_t j = 0; j < k && !dup; j++)
                        dup = l->dst[j] == d;
                } while (dup);
                l->dst[k] = d;
                l->scr[k] = l->lscratch + k;
            }
            CHECK_KVX(kvx_xfer_write(cl.t, cl.peer[l->peer], l->src, l->dst, l->n, NULL, &l->id));
            l->phase = 0;
            busy++;
        }
        if (stopping && busy == 0)
            break;
        int n = kvx_transport_poll(cl.t, NULL, comp, 64);
        if (n < 0)
            die("poll: %s", kvx_strerror(n));
        if (n == 0 && o.wait)
            kvx_transport_wait(cl.t, NULL, 100);
        for (int c = 0; c < n; c++) {
            lane_t *l = NULL;
            for (int i = 0; i < nlanes && l == NULL; i++)
                if (lanes[i].id == comp[c].id)
                    l = &lanes[i];
            if (l == NULL) {
                fprintf(stderr, "kvx-bench: id %llu completed but nobody waits for it\n",
                        (unsigned long long)comp[c].id);
                bad++;
                continue;
            }
            if (comp[c].status != 0) {
                fprintf(stderr, "kvx-bench: transfer %llu failed: %s\n",
                        (unsigned long long)comp[c].id, kvx_strerror(comp[c].status));
                bad++;
                l->id = 0;
                busy--;
                continue;
            }
            bytes += comp[c].bytes;
            if (l->phase == 0) {
                writes++;
                CHECK_KVX(
                    kvx_xfer_read(cl.t, cl.peer[l->peer], l->scr, l->dst, l->n, NULL, &l->id));
                l->phase = 1;
                continue;
            }
            reads++;
            for (uint32_t k = 0; k < l->n; k++)
                if (kvx_pattern_check(cl.base + (uint64_t)l->scr[k] * size, size,
                                      CLIENT_SALT + (uint64_t)o.client_index, l->src[k], 0) != 0)
                    bad++;
            l->id = 0;
            busy--;
        }
        progress_line("load", (int)((now_ns() - start) / 1000000000ull), (int)o.load_s);
    }
#undef RND
    uint64_t stop = now_ns();
    result_t *res = &res_out[(*nres)++];
    memset(res, 0, sizeof(*res));
    res->op = "load";
    res->size = size;
    res->blocks = blocks_max;
    res->bytes = bytes;
    res->gbps = (double)bytes / (double)(stop - start);
    res->xfers_per_s = (double)(writes + reads) / ((double)(stop - start) / 1e9);
    res->xfers = writes + reads;
    res->bad = bad;
    res->start_ns = start;
    res->end_ns = stop;
    res->initiator = o.client_index;
    res->create_ms = cl.create_ms;
    res->peer_add_ms = cl.peer_add_ms;
    res->md_bytes = cl.md_bytes;
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};
        CHECK_KVX(kvx_peer_query(cl.t, cl.peer[0], &pa));
        snprintf(res->transport, sizeof(res->transport), "%s", pa.transport);
    }
    free(lanes);
    client_close(&cl);
}
