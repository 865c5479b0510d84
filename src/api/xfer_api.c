/*
 * The transfer calls: write and read (checked here, born in xfer/submit.c), poll (a transfer
 * leaves through kvx_transport_poll, from its peer's completion queue: core/cq.c) and cancel.
 */
#include "api/transport.h"

#include <errno.h>

/* ---- write and read ----------------------------------------------------------------------- */

/* Block calls and ranges alike (src: block indices or ranges): checked here, born in
 * xfer/submit.c, one path for both. */
static int kvx_submit(kvx_transport_t *t, int op, const char *peer_id, const kvx_xfer_src_t *src,
                      const kvx_xfer_params_t *params, uint64_t *id_p)
{
    uint64_t fm = params != NULL ? params->field_mask : 0;
    uint32_t flags = (fm & KVX_XFER_PARAM_FLAGS) ? params->flags : 0;
    size_t count = src->count;
    kvx_peer_t *p;
    int rc;

    if (t == NULL || peer_id == NULL || id_p == NULL ||
        (count != 0 && src->ranges == NULL && (!src->local || !src->remote)) ||
        count > UINT32_MAX ||
        (src->ranges == NULL && t->core.block_len != 0 && count > UINT64_MAX / t->core.block_len) ||
        ((fm & KVX_XFER_PARAM_DEADLINE) && params->deadline_ms > KVX_MS_MAX) ||
        ((fm & KVX_XFER_PARAM_PRIORITY) && params->priority >= KVX_PRIO_LEVELS) ||
        (flags & ~(uint32_t)KVX_XFER_NOTIFY) || ((flags & KVX_XFER_NOTIFY) && op != KVX_OP_WRITE) ||
        ((fm & KVX_XFER_PARAM_NOTICE_DATA) &&
         (params->notice_len > KVX_NOTICE_DATA_MAX ||
          (params->notice_data == NULL && params->notice_len > 0))))
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    p = kvx_peer_lookup(&t->core, peer_id);
    if (p == NULL || p->conn == NULL) {
        kvx_debug(&t->core, "submit: unknown peer '%s'", peer_id);
        rc = -ENOENT;
        goto out;
    }
    rc = kvx_xfer_submit(&t->core, p, op, src, params, id_p);
out:
    kvx_unlock(&t->core);
    return rc;
}

/* A standalone notice: a transfer of nothing with the payload, whose end nobody is told of
 * (purged: counted, then freed). It waits in its connection's queue as any transfer, so notices
 * go in the order of the calls. */
int kvx_notice_send(kvx_transport_t *t, const char *peer_id, const void *data, size_t len)
{
    kvx_xfer_params_t params = {
        .field_mask = KVX_XFER_PARAM_NOTICE_DATA, .notice_data = data, .notice_len = len};
    kvx_xfer_src_t src = {.count = 0, .unreported = true};
    uint64_t id;
    kvx_peer_t *p;
    int rc;

    if (t == NULL || peer_id == NULL || len > KVX_NOTICE_DATA_MAX || (data == NULL && len > 0))
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    p = kvx_peer_lookup(&t->core, peer_id);
    if (p == NULL || p->conn == NULL) {
        rc = -ENOENT;
        goto out;
    }
    rc = kvx_xfer_submit(&t->core, p, KVX_OP_WRITE, &src, &params, &id);
out:
    kvx_unlock(&t->core);
    return rc;
}

int kvx_xfer_write(kvx_transport_t *t, const char *peer_id, const uint32_t *local_idxs,
                   const uint32_t *remote_idxs, size_t count, const kvx_xfer_params_t *params,
                   uint64_t *id_p)
{
    kvx_xfer_src_t src = {.local = local_idxs, .remote = remote_idxs, .count = count};

    return kvx_submit(t, KVX_OP_WRITE, peer_id, &src, params, id_p);
}

int kvx_xfer_read(kvx_transport_t *t, const char *peer_id, const uint32_t *local_idxs,
                  const uint32_t *remote_idxs, size_t count, const kvx_xfer_params_t *params,
                  uint64_t *id_p)
{
    kvx_xfer_src_t src = {.local = local_idxs, .remote = remote_idxs, .count = count};

    return kvx_submit(t, KVX_OP_READ, peer_id, &src, params, id_p);
}

/* Ranges: at least one, each non-empty (checked against the regions in xfer/submit.c). */
static int kvx_submit_ranges(kvx_transport_t *t, int op, const char *peer_id,
                             const kvx_range_t *ranges, size_t count,
                             const kvx_xfer_params_t *params, uint64_t *id_p)
{
    kvx_xfer_src_t src = {.ranges = ranges, .count = count};

    if (ranges == NULL || count == 0)
        return -EINVAL;
    return kvx_submit(t, op, peer_id, &src, params, id_p);
}

int kvx_xfer_write_ranges(kvx_transport_t *t, const char *peer_id, const kvx_range_t *ranges,
                          size_t count, const kvx_xfer_params_t *params, uint64_t *id_p)
{
    return kvx_submit_ranges(t, KVX_OP_WRITE, peer_id, ranges, count, params, id_p);
}

int kvx_xfer_read_ranges(kvx_transport_t *t, const char *peer_id, const kvx_range_t *ranges,
                         size_t count, const kvx_xfer_params_t *params, uint64_t *id_p)
{
    return kvx_submit_ranges(t, KVX_OP_READ, peer_id, ranges, count, params, id_p);
}

/* ---- cancel --------------------------------------------------------------------------------- */

int kvx_xfer_cancel(kvx_transport_t *t, const uint64_t *ids, size_t count, int mode,
                    uint64_t *pending)
{
    uint32_t call;
    int np = 0;

    if (t == NULL || (ids == NULL && count != 0) ||
        (mode != KVX_CANCEL_IMMEDIATE && mode != KVX_CANCEL_WAIT) || count > INT32_MAX)
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    call = ++t->cancel_calls;
    for (size_t i = 0; i < count; i++) {
        kvx_xfer_t *x = kvx_xfer_lookup(&t->core, ids[i]);

        if (x == NULL || x->purged) /* a purged transfer is forgotten already */
            continue;
        /*
         * Forgotten at once: a finished one; one that UCX holds nothing of (not started, a
         * read: its replies are dropped from now on, or a write whose messages all left); and
         * any with immediate, whose caller accepts that UCX may still read a write's blocks.
         */
        if (x->state == KVX_XS_DONE || mode == KVX_CANCEL_IMMEDIATE || x->sending == 0) {
            kvx_xfer_forget(x);
            continue;
        }
        /* Wait: a write with messages UCX still holds (they read its local blocks). It posts
         * nothing more, and completes (-ECANCELED) when the last of them has left. An id given
         * twice in one call is reported once. */
        if (x->canceled && x->cancel_call == call)
            continue;
        x->canceled = true;
        x->cancel_call = call;
        if (pending != NULL)
            pending[np] = x->id;
        np++;
    }
    kvx_unlock(&t->core);
    return np;
}

/* ---- poll ------------------------------------------------------------------------------- */

int kvx_transport_poll(kvx_transport_t *t, const char *peer_id, kvx_completion_t *out, size_t max)
{
    size_t n = 0;

    if (t == NULL || (out == NULL && max != 0))
        return -EINVAL;
    if (max > INT32_MAX)
        max = INT32_MAX;
    kvx_defer_to_waiters(&t->core);
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    kvx_progress_step(&t->engine);
    /* an application that polls in a loop drives UCX itself: the thread may step aside */
    kvx_engine_app_polled(&t->engine);
    if (peer_id != NULL) {
        kvx_peer_t *p = kvx_peer_lookup(&t->core, peer_id);
        if (p != NULL)
            n = kvx_cq_drain(p, out, max);
    } else {
        while (n < max && !kvx_list_empty(&t->core.ready)) {
            kvx_peer_t *p = kvx_list_first(&t->core.ready, kvx_peer_t, ready_link);
            /* rotate, so that one busy peer cannot starve the others */
            kvx_list_del(&p->ready_link);
            kvx_list_add_tail(&t->core.ready, &p->ready_link);
            n += kvx_cq_drain(p, out + n, max - n);
        }
    }
    kvx_events_update(&t->engine);
    kvx_unlock(&t->core);
    return (int)n;
}
