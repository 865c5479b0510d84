/*
 * A transfer done: counted, into its peer's completion queue, where kvx_transport_poll finds it
 * (kvx_cq_drain, which frees it), or, purged, freed at once. kvx_core.h writes down its life.
 */
#include "core/kvx_core.h"

#include <errno.h>

void kvx_xfer_done(kvx_xfer_t *x, int status)
{
    kvx_core_t *c = x->core;
    kvx_peer_t *p = x->peer;
    uint64_t now = kvx_now_ns(), lat = now - x->t_submit_ns;

    kvx_stats_xfer(c, p, x->op, x->canceled ? -ECANCELED : status, x->bytes, lat);
    if (x->purged) {
        p->inflight--;
        kvx_xfer_free(x);
        return;
    }
    if (x->canceled)
        status = -ECANCELED;
    x->status = status;
    x->t_done_ns = now;
    x->state = KVX_XS_DONE;
    kvx_list_del(&x->conn_link);
    kvx_list_del(&x->active_link);
    p->inflight--;
    kvx_list_add_tail(&p->cq, &x->conn_link);
    if (!kvx_list_linked(&p->ready_link))
        kvx_list_add_tail(&c->ready, &p->ready_link);
    kvx_core_arrived(c);
    kvx_core_polls_changed(c);
}

size_t kvx_cq_drain(kvx_peer_t *p, kvx_completion_t *out, size_t max)
{
    size_t n = 0;

    while (n < max && !kvx_list_empty(&p->cq)) {
        kvx_xfer_t *x = kvx_list_first(&p->cq, kvx_xfer_t, conn_link);
        out[n].id = x->id;
        out[n].status = x->status;
        out[n].flags = x->op == KVX_OP_READ ? KVX_COMPLETION_READ : 0;
        out[n].bytes = x->bytes;
        out[n].duration_ns = x->t_done_ns - x->t_submit_ns;
        n++;
        /* the last one freed may free the peer: stop touching it then */
        bool last = p->nxfers == 1 && p->removed;
        kvx_xfer_free(x);
        if (last)
            break;
    }
    return n;
}

void kvx_xfer_purge(kvx_xfer_t *x)
{
    if (x->purged)
        return;
    x->purged = true;
    x->peer->npurged++;
}

void kvx_xfer_purge_peer(kvx_core_t *c, kvx_peer_t *p, const kvx_conn_t *conn)
{
    /* every transfer not DONE is on core->active, ENDING ones too (on no connection list) */
    for (kvx_list_t *n = c->active.next; n != &c->active; n = n->next) {
        kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);
        if (x->peer == p && (conn == NULL || x->conn == conn))
            kvx_xfer_purge(x);
    }
}
