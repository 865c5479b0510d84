/*
 * Where a transfer is born: its indices checked and folded into runs, the object made (core/), and
 * queued on its peer's connection at its level (or parked while its peer pairs again), the first
 * of its level posted at once. A peer back from pairing again gets its parked transfers.
 */
#include "xfer/kvx_xfer.h"

#include <errno.h>
#include <stdlib.h>

/* Bytes the submitting thread posts itself before leaving the rest to the progress engine: small
 * transfers go out at once, large ones do not hold the caller for the whole copy. */
#define KVX_INLINE_BUDGET ((size_t)256 * 1024)

/* Check every index and fold runs consecutive on both sides. O(count), no allocation once the
 * transfer slot has seen a transfer this large. */
static int kvx_xfer_build_runs(kvx_core_t *core, kvx_xfer_t *x, uint64_t remote_num_blocks,
                               const uint32_t *local, const uint32_t *remote, size_t count)
{
    kvx_run_t *r;
    uint32_t nruns = 0;

    if (x->runs_cap < count) {
        size_t cap = count < 16 ? 16 : count;
        kvx_run_t *runs = realloc(x->runs, cap * sizeof(*runs));
        if (runs == NULL)
            return -ENOMEM;
        x->runs = runs;
        x->runs_cap = (uint32_t)cap;
    }
    r = x->runs - 1;
    for (size_t i = 0; i < count; i++) {
        uint32_t l = local[i], rm = remote[i];

        if (l >= core->num_blocks || rm >= remote_num_blocks) {
            kvx_debug(core, "index %zu out of range: local %u of %llu, remote %u of %llu", i, l,
                      (unsigned long long)core->num_blocks, rm,
                      (unsigned long long)remote_num_blocks);
            return -EINVAL;
        }
        if (nruns > 0 && l == r->local + r->count && rm == r->remote + r->count) {
            r->count++;
        } else {
            r++;
            r->local = l;
            r->remote = rm;
            r->count = 1;
            nruns++;
        }
    }
    x->nruns = nruns;
    return 0;
}

/* Fill a new transfer x of peer p from the call (lock held, the indices already in runs). */
static void kvx_xfer_fill(kvx_core_t *core, kvx_xfer_t *x, kvx_peer_t *p, int op, size_t count,
                          const kvx_xfer_params_t *params, uint64_t now)
{
    uint64_t fm = params != NULL ? params->field_mask : 0;
    uint64_t deadline_ms = (fm & KVX_XFER_PARAM_DEADLINE) ? params->deadline_ms /* <= KVX_MS_MAX */
                                                          : core->deadline_ns / 1000000ull;
    uint32_t flags = (fm & KVX_XFER_PARAM_FLAGS) ? params->flags : 0;
    kvx_conn_t *c = p->conn;

    x->op = (uint8_t)op;
    x->prio = (fm & KVX_XFER_PARAM_PRIORITY) ? (uint8_t)params->priority : KVX_PRIO_NORMAL;
    x->peer = p;
    x->conn = p->reconnecting ? NULL : c;
    x->bytes = (uint64_t)count * core->block_len;
    x->tag = (fm & KVX_XFER_PARAM_TAG) ? params->tag : 0;
    x->notify = (flags & KVX_XFER_NOTIFY) != 0;
    /* stamped with the fence epoch the receiver gave us; before the handshake, with the one its
     * HELLO_ACK brings (kvx_conn_hello_ack) */
    x->epoch = c->wired ? c->epoch : UINT64_MAX;
    x->t_submit_ns = now;
    x->deadline_ns = deadline_ms ? now + deadline_ms * 1000000ull : 0;
    x->state = KVX_XS_QUEUED;
    p->nxfers++;
    p->inflight++;
}

/* The new transfer x (with bytes to move) joins the active ones, with its deadline, and its
 * connection's queue, or its peer's parked ones while the peer pairs again. */
static void kvx_xfer_queue(kvx_core_t *core, kvx_xfer_t *x, uint64_t now)
{
    kvx_peer_t *p = x->peer;
    kvx_conn_t *c = p->conn;
    uint64_t due;

    /* leaving idle: a progress thread asleep for a long tick looks again soon (stall and
     * liveness checks run every KVX_HOUSEKEEPING_NS while transfers are in flight) */
    if (kvx_list_empty(&core->active))
        kvx_core_kick(core, now + KVX_HOUSEKEEPING_NS);
    kvx_list_add_tail(&core->active, &x->active_link);
    due = kvx_xfer_due(core, x);
    if (due != 0 && due < core->next_deadline_ns) {
        core->next_deadline_ns = due;
        kvx_core_kick(core, due);
    }
    if (p->reconnecting) { /* it waits for the new connection (kvx_xfer_unpark) */
        kvx_list_add_tail(&p->parked, &x->conn_link);
        return;
    }
    /* the first of its level posts at once (what goes first is kvx_xfer_pick's choice); later
     * ones are posted as the earlier leave room */
    if (kvx_xfer_enqueue(c, x, now))
        kvx_xfer_post(c, KVX_INLINE_BUDGET);
    if (c->state == KVX_CONN_OPEN && c->wired && kvx_conn_queued(c) && c->reqs < KVX_MAX_REQS) {
        kvx_conn_want_work(c);
        kvx_core_kick(core, 0);
    }
}

int kvx_xfer_submit(kvx_core_t *core, kvx_peer_t *p, int op, const uint32_t *local,
                    const uint32_t *remote, size_t count, const kvx_xfer_params_t *params,
                    uint64_t *id_p)
{
    kvx_conn_t *c = p->conn;
    uint64_t now;
    kvx_xfer_t *x;
    int rc;

    if (c->state != KVX_CONN_OPEN && !p->reconnecting)
        return -ENOTCONN;
    rc = kvx_xfer_alloc(core, &x);
    if (rc < 0)
        return rc;
    /* a peer pairing again: checked against the region last known, and again when it is back */
    rc = kvx_xfer_build_runs(core, x, p->reconnecting ? p->last_num_blocks : c->remote_num_blocks,
                             local, remote, count);
    if (rc < 0) {
        kvx_xfer_free(x);
        return rc;
    }
    now = kvx_now_ns();
    kvx_xfer_fill(core, x, p, op, count, params, now);
    *id_p = x->id;
    if (x->bytes == 0) { /* nothing to move: done at once */
        kvx_list_add_tail(&core->active, &x->active_link);
        kvx_xfer_done(x, 0);
        return 0;
    }
    kvx_xfer_queue(core, x, now);
    return 0;
}

void kvx_xfer_unpark(kvx_peer_t *p, kvx_conn_t *c, int err)
{
    uint64_t now = kvx_now_ns();
    bool any = false;

    while (!kvx_list_empty(&p->parked)) {
        kvx_xfer_t *x = kvx_list_first(&p->parked, kvx_xfer_t, conn_link);
        bool fits = c != NULL;

        for (uint32_t i = 0; fits && i < x->nruns; i++)
            fits = (uint64_t)x->runs[i].remote + x->runs[i].count <= c->remote_num_blocks;
        if (!fits) {
            kvx_xfer_end(x, c != NULL ? -EINVAL : err);
            continue;
        }
        kvx_list_del(&x->conn_link);
        x->conn = c;
        x->epoch = c->wired ? c->epoch : UINT64_MAX;
        kvx_xfer_enqueue(c, x, now);
        any = true;
    }
    if (any && c->state == KVX_CONN_OPEN && c->wired) {
        kvx_conn_want_work(c);
        kvx_core_kick(c->core, 0);
    }
}
