/*
 * The writers' fences (kvx_fence_ex, transport.c): a fence bumps its writers' epochs and records
 * which tags it covered, so that a write or notice stamped with an older epoch is refused
 * (kvx_writer_fenced, for recv.c); each connection of a fenced writer is told the new epoch by
 * a FENCE message. kvx_conn.h's struct kvx_writer says what the records are.
 */
#include "recv/kvx_recv.h"
#include "recv/recv_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- a writer's fence records ---------------------------------------------------------------- */

/* Where tag's record is among the writer's tag fences, or would be. */
static uint32_t kvx_ftag_find(const kvx_writer_t *w, uint64_t tag)
{
    uint32_t lo = 0, hi = w->nftags;

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (w->ftags[mid].tag < tag)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Did a fence after the writer's epoch e cover tag? */
bool kvx_writer_fenced(const kvx_writer_t *w, uint64_t e, uint64_t tag)
{
    uint32_t i;

    if (w->fence_all > e)
        return true;
    i = kvx_ftag_find(w, tag);
    return i < w->nftags && w->ftags[i].tag == tag && w->ftags[i].at_epoch > e;
}

/* ---- fences (kvx_fence_ex) ------------------------------------------------------------------ */

/* The writers a fence names: the one called writer, or every one (writer NULL). Start with w
 * NULL and *bucket 0. */
static kvx_writer_t *kvx_fence_next(const kvx_recv_t *r, const char *writer, size_t *bucket,
                                    kvx_writer_t *w)
{
    if (writer != NULL)
        return w == NULL ? kvx_writer_lookup(&r->conns, writer) : NULL;
    return kvx_writer_next(&r->conns, bucket, w);
}

/* Tag records a fence of tags (sorted, distinct; ntags > 0) adds to w: none for a writer
 * without connections, which needs none. */
static uint32_t kvx_writer_fence_need(const kvx_writer_t *w, const uint64_t *tags, size_t ntags)
{
    uint32_t need = 0;

    if (w->live == 0)
        return 0;
    for (size_t k = 0; k < ntags; k++) {
        uint32_t i = kvx_ftag_find(w, tags[k]);
        need += !(i < w->nftags && w->ftags[i].tag == tags[k]);
    }
    return need;
}

/* Room for need more tag records: 0 or -ENOMEM (no fence changes either way). */
static int kvx_writer_fence_reserve(kvx_writer_t *w, uint32_t need)
{
    uint32_t cap = w->ftags_cap ? w->ftags_cap : 16;
    kvx_fence_rec_t *f;

    if (w->nftags + need <= w->ftags_cap)
        return 0;
    while (cap < w->nftags + need)
        cap *= 2;
    if (cap > KVX_FENCE_WRITER_TAGS_MAX)
        cap = KVX_FENCE_WRITER_TAGS_MAX;
    f = realloc(w->ftags, (size_t)cap * sizeof(*f));
    if (f == NULL)
        return -ENOMEM;
    w->ftags = f;
    w->ftags_cap = cap;
    return 0;
}

/* Fence w (room for its records was made), and tell its connections the new epoch. */
static void kvx_writer_fence(kvx_recv_t *r, kvx_writer_t *w, const uint64_t *tags, size_t ntags,
                             int *count)
{
    w->epoch++;
    if (w->live == 0) {
        /* no connection: nothing can come stamped with an older epoch (a new one starts at
         * this one), so no record is needed, and older ones are moot */
        kvx_writer_drop_fences(&r->conns, w);
    } else if (ntags == 0) {
        w->fence_all = w->epoch;
        kvx_writer_drop_fences(&r->conns, w); /* every tag record is older: moot */
    } else {
        for (size_t k = 0; k < ntags; k++) {
            uint32_t i = kvx_ftag_find(w, tags[k]);
            if (i == w->nftags || w->ftags[i].tag != tags[k]) {
                memmove(&w->ftags[i + 1], &w->ftags[i], (w->nftags - i) * sizeof(w->ftags[0]));
                w->ftags[i].tag = tags[k];
                w->nftags++;
                r->conns.nftags++;
            }
            w->ftags[i].at_epoch = w->epoch;
        }
    }
    for (kvx_list_t *n = w->rconns.next; n != &w->rconns; n = n->next) {
        kvx_rconn_t *rc = kvx_container_of(n, kvx_rconn_t, w_link);
        kvx_msg_t f = {.type = KVX_MSG_FENCE,
                       .conn_id = rc->peer_conn_id,
                       .token = rc->peer_token,
                       .u.fence.epoch = w->epoch};
        uint8_t hdr[KVX_WIRE_FENCE_LEN];
        kvx_ctl_t *queued = NULL;
        /* the writer keeps only the newest epoch: a FENCE still queued takes the new one, so
         * that fences in a burst (1,000 tag fences) queue one message, not one each (which
         * would overflow the connection's control queue and close it) */
        for (kvx_list_t *l = rc->ctl.next; l != &rc->ctl && queued == NULL; l = l->next)
            if (kvx_container_of(l, kvx_ctl_t, link)->hdr[1] == KVX_MSG_FENCE)
                queued = kvx_container_of(l, kvx_ctl_t, link);
        if (queued != NULL) {
            kvx_wire_encode(&f, queued->hdr); /* the same message, the newer epoch */
        } else {
            kvx_wire_encode(&f, hdr);
            kvx_rconn_ctl(rc, hdr, sizeof(hdr));
        }
        (*count)++;
    }
}

/* The first half of a fence (kvx_fence_ex, transport.c): the HELLOs that arrived become
 * connections, so that their writers' writes submitted before the call are fenced too (and,
 * retiring, they were made with the old capability); then everything that can fail, before any
 * fence changes: the bounds and the memory for the records. tags are sorted and distinct. */
int kvx_recv_fence_prepare(kvx_recv_t *r, const char *writer, const uint64_t *tags, size_t ntags)
{
    size_t bucket = 0, total = 0;
    kvx_writer_t *w;
    int rc = 0;

    kvx_recv_hellos(r, true);
    for (w = NULL; ntags > 0 && (w = kvx_fence_next(r, writer, &bucket, w)) != NULL;) {
        uint32_t need = kvx_writer_fence_need(w, tags, ntags);
        if (w->nftags + need > KVX_FENCE_WRITER_TAGS_MAX)
            rc = -ENOSPC;
        total += need;
    }
    if (rc == 0 && r->conns.nftags + total > KVX_FENCE_TOTAL_TAGS_MAX)
        rc = -ENOSPC;
    bucket = 0;
    for (w = NULL; rc == 0 && ntags > 0 && (w = kvx_fence_next(r, writer, &bucket, w)) != NULL;)
        rc = kvx_writer_fence_reserve(w, kvx_writer_fence_need(w, tags, ntags));
    return rc;
}

/* The second half, which cannot fail: returns the number of connections fenced. */
int kvx_recv_fence(kvx_recv_t *r, const char *writer, const uint64_t *tags, size_t ntags)
{
    size_t bucket = 0;
    kvx_writer_t *w;
    int count = 0;

    for (w = NULL; (w = kvx_fence_next(r, writer, &bucket, w)) != NULL;)
        kvx_writer_fence(r, w, tags, ntags, &count);
    if (count > 0) {
        r->core->stats.fences++;
        kvx_core_kick(r->core, 0); /* tell the writers now */
    }
    return count;
}

/* ---- rendezvous receives a fence covers ----------------------------------------------------- */

/* How many rendezvous receives in flight a fence of writer (NULL: every writer) now covers; with
 * abort, the connections holding them close (which ends them). */
unsigned kvx_recv_fence_rndvs(kvx_recv_t *r, const char *writer, bool abort)
{
    unsigned n = 0;

    for (kvx_list_t *c = r->conns.all.next; c != &r->conns.all; c = c->next) {
        kvx_rconn_t *rc = kvx_container_of(c, kvx_rconn_t, all_link);
        unsigned here = 0;

        if (rc->nwrite_rndvs == 0 || rc->w == NULL ||
            (writer != NULL && strcmp(rc->w->name, writer)))
            continue;
        for (kvx_list_t *x = rc->write_rndvs.next; x != &rc->write_rndvs; x = x->next) {
            kvx_write_rndv_t *wr = kvx_container_of(x, kvx_write_rndv_t, link);
            if (kvx_writer_fenced(rc->w, wr->epoch, wr->tag))
                here++;
        }
        if (here > 0 && abort)
            kvx_rconn_abort(rc, "a fence covers its rendezvous receives still in flight");
        n += here;
    }
    return n;
}

/* ---- a region's deregistration (kvx_region_deregister): a fence of a region --------------- */

void kvx_recv_refuse(kvx_rconn_t *rc, uint64_t xfer_id, uint64_t stream_off, int err)
{
    uint8_t hdr[KVX_WIRE_READ_DATA_LEN];

    kvx_wire_encode(
        &(kvx_msg_t){.type = KVX_MSG_READ_DATA,
                     .conn_id = rc->peer_conn_id,
                     .token = rc->peer_token,
                     .u.read_data = {.xfer_id = xfer_id, .stream_off = stream_off, .status = err}},
        hdr);
    kvx_rconn_ctl(rc, hdr, sizeof(hdr)); /* no room: the connection closes (kvx_rconn_doom) */
}

void kvx_recv_region_dead(kvx_recv_t *r, kvx_region_t *g)
{
    for (kvx_list_t *c = r->conns.all.next; c != &r->conns.all; c = c->next) {
        kvx_rconn_t *rc = kvx_container_of(c, kvx_rconn_t, all_link);

        for (kvx_list_t *n = rc->serve.next, *next; n != &rc->serve; n = next) {
            kvx_serve_t *s = kvx_container_of(n, kvx_serve_t, link);
            next = n->next;
            if (s->region != g)
                continue;
            kvx_list_del(&s->link);
            rc->nserve--;
            kvx_rq_sub(rc, sizeof(*s) + s->nruns * sizeof(s->runs[0]));
            kvx_region_put(g);
            if (rc->state == KVX_CONN_OPEN && !rc->doomed)
                kvx_recv_refuse(rc, s->xfer_id, s->stream_off, -ENOENT);
            free(s);
        }
    }
}

unsigned kvx_recv_region_close(kvx_recv_t *r, kvx_region_t *g)
{
    uint64_t rndvs = 0;
    unsigned n = 0;

    /* its rendezvous receives: each is known by its connection */
    for (kvx_list_t *c = r->conns.all.next; c != &r->conns.all; c = c->next) {
        kvx_rconn_t *rc = kvx_container_of(c, kvx_rconn_t, all_link);
        bool holds = false;

        for (kvx_list_t *x = rc->write_rndvs.next; x != &rc->write_rndvs; x = x->next)
            if (kvx_container_of(x, kvx_write_rndv_t, link)->region == g) {
                holds = true;
                rndvs++;
            }
        if (holds && rc->state == KVX_CONN_OPEN) {
            kvx_rconn_abort(rc, "a deregistered region's rendezvous receives still in flight");
            n++;
        }
    }
    if (g->users <= rndvs)
        return n;
    /* READ_DATA sends UCX holds, reading it: which connection's is not kept, so every one with
     * read data in UCX's hands closes (a stopped reader; rare) */
    for (kvx_list_t *c = r->conns.all.next; c != &r->conns.all; c = c->next) {
        kvx_rconn_t *rc = kvx_container_of(c, kvx_rconn_t, all_link);
        if (rc->data_sending > 0 && rc->state == KVX_CONN_OPEN) {
            kvx_rconn_abort(rc, "read data of a deregistered region still in UCX's hands");
            n++;
        }
    }
    return n;
}
