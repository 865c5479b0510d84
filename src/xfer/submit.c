/*
 * Where a transfer is born: its block indices or ranges checked and folded into runs (block
 * calls are runs over the two main regions: one path for both), the object made (core/), and
 * queued on its peer's connection at its level (or parked while its peer pairs again), the first
 * of its level posted at once. A peer back from pairing again gets its parked transfers.
 */
#include "xfer/kvx_xfer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Bytes the submitting thread posts itself before leaving the rest to the progress engine: small
 * transfers go out at once, large ones do not hold the caller for the whole copy. */
#define KVX_INLINE_BUDGET ((size_t)256 * 1024)

/* Room for n more runs (a transfer object keeps its arrays: no allocation once the slot has
 * seen a transfer this large). */
static int kvx_xfer_runs_room(kvx_xfer_t *x, size_t n)
{
    if (x->runs_cap < n) {
        size_t cap = n < 16 ? 16 : n;
        kvx_run_t *runs = realloc(x->runs, cap * sizeof(*runs));
        if (runs == NULL)
            return -ENOMEM;
        x->runs = runs;
        x->runs_cap = (uint32_t)cap;
    }
    return 0;
}

/* The index in x->rregs of remote region id (capability cap), added if new: >= 0 or -ENOMEM.
 * Consecutive ranges mostly name the same region: the last one is looked at first. */
static int kvx_xfer_rreg(kvx_xfer_t *x, uint32_t id, const uint8_t *cap)
{
    static const uint8_t zero[16];

    if (x->nrregs > 0 && x->rregs[x->nrregs - 1].id == id)
        return (int)x->nrregs - 1;
    for (uint32_t i = 0; i < x->nrregs; i++)
        if (x->rregs[i].id == id)
            return (int)i;
    if (x->nrregs == x->rregs_cap) {
        uint32_t cap2 = x->rregs_cap ? x->rregs_cap * 2 : 4;
        kvx_rreg_t *r = realloc(x->rregs, (size_t)cap2 * sizeof(*r));
        if (r == NULL)
            return -ENOMEM;
        x->rregs = r;
        x->rregs_cap = cap2;
    }
    x->rregs[x->nrregs].id = id;
    memcpy(x->rregs[x->nrregs].capability, cap != NULL ? cap : zero, 16);
    return (int)x->nrregs++;
}

/* One checked piece joins the runs: merged into the last run when it continues it on both
 * sides (the same regions, consecutive bytes), as block calls always coalesced. */
static void kvx_xfer_add_run(kvx_xfer_t *x, uint8_t *local, uint32_t lregion, uint32_t rreg,
                             uint64_t remote, uint64_t len)
{
    kvx_run_t *r = x->nruns > 0 ? &x->runs[x->nruns - 1] : NULL;

    if (r != NULL && r->lregion == lregion && r->rreg == rreg && r->local + r->len == local &&
        r->remote + r->len == remote) {
        r->len += len;
    } else {
        x->runs[x->nruns++] = (kvx_run_t){
            .local = local, .remote = remote, .len = len, .lregion = lregion, .rreg = rreg};
    }
    x->bytes += len;
}

/* Block calls: every index checked, runs over the two main regions. */
static int kvx_xfer_build_blocks(kvx_core_t *core, kvx_xfer_t *x, uint64_t remote_num_blocks,
                                 const kvx_xfer_src_t *src)
{
    kvx_region_t *main = kvx_region_find(core, KVX_REGION_MAIN);
    uint64_t bl = core->block_len;
    int ri;

    if (main == NULL || main->dead || remote_num_blocks == 0) {
        kvx_debug(core, "block call: %s main region",
                  main == NULL || main->dead ? "no local" : "no remote");
        return -ENOENT;
    }
    if ((ri = kvx_xfer_rreg(x, KVX_REGION_MAIN, NULL)) < 0)
        return ri;
    for (size_t i = 0; i < src->count; i++) {
        uint32_t l = src->local[i], rm = src->remote[i];

        if (l >= core->num_blocks || rm >= remote_num_blocks) {
            kvx_debug(core, "index %zu out of range: local %u of %llu, remote %u of %llu", i, l,
                      (unsigned long long)core->num_blocks, rm,
                      (unsigned long long)remote_num_blocks);
            return -EINVAL;
        }
        kvx_xfer_add_run(x, main->base + (uint64_t)l * bl, KVX_REGION_MAIN, (uint32_t)ri,
                         (uint64_t)rm * bl, bl);
    }
    return 0;
}

/* The remote side of range i: the peer's main region or a loaded handle, checked. */
static int kvx_xfer_range_remote(kvx_core_t *core, kvx_xfer_t *x, kvx_peer_t *p, int op,
                                 const kvx_range_t *rg, uint64_t main_len, uint64_t gen)
{
    unsigned need = op == KVX_OP_WRITE ? KVX_REGION_WRITE : KVX_REGION_READ;
    kvx_rhandle_t *h;

    if (rg->remote_region == KVX_REGION_MAIN) {
        if (main_len == 0)
            return -ENOENT;
        if (!kvx_region_fits(&(kvx_region_t){.len = main_len}, rg->remote_offset, rg->len))
            return -EINVAL;
        return kvx_xfer_rreg(x, KVX_REGION_MAIN, NULL);
    }
    h = kvx_rhandle_find(p, rg->remote_region);
    if (h == NULL)
        return -ENOENT;
    if (h->generation != gen) {
        kvx_debug(core, "handle %u of %s: of its earlier process", h->handle, p->id);
        return -ESTALE;
    }
    if (!(h->access & need))
        return -EACCES;
    if (!kvx_region_fits(&(kvx_region_t){.len = h->len}, rg->remote_offset, rg->len))
        return -EINVAL;
    x->rgen = gen;
    return kvx_xfer_rreg(x, h->id, h->capability);
}

/* Ranges: each checked against its local region and the peer's region, then folded. */
static int kvx_xfer_build_ranges(kvx_core_t *core, kvx_xfer_t *x, kvx_peer_t *p, int op,
                                 const kvx_xfer_src_t *src)
{
    kvx_conn_t *c = p->conn;
    uint64_t main_len = p->reconnecting ? p->last_num_blocks * core->block_len : c->remote_len;
    uint64_t gen = p->reconnecting ? p->last_generation : c->generation;

    for (size_t i = 0; i < src->count; i++) {
        const kvx_range_t *rg = &src->ranges[i];
        kvx_region_t *l = kvx_region_find(core, rg->local_region);
        int ri;

        if (l == NULL || l->dead)
            return -ENOENT;
        if (rg->len == 0 || !kvx_region_fits(l, rg->local_offset, rg->len) ||
            x->bytes > UINT64_MAX - rg->len)
            return -EINVAL;
        ri = kvx_xfer_range_remote(core, x, p, op, rg, main_len, gen);
        if (ri < 0) {
            kvx_debug(core, "range %zu (%u:%llu to %u:%llu, %llu bytes) refused: %s", i,
                      rg->local_region, (unsigned long long)rg->local_offset, rg->remote_region,
                      (unsigned long long)rg->remote_offset, (unsigned long long)rg->len,
                      kvx_strerror(ri));
            return ri;
        }
        kvx_xfer_add_run(x, l->base + rg->local_offset, l->id, (uint32_t)ri, rg->remote_offset,
                         rg->len);
    }
    /* a peer's owned region mapped here is its main one: other regions need messages, which a
     * mapped connection does not send */
    if ((c->mapped != NULL || c->unproven != NULL) && x->rgen != 0)
        return -EOPNOTSUPP;
    return 0;
}

/* Check the call's pieces and fold them into runs: O(count). */
static int kvx_xfer_build_runs(kvx_core_t *core, kvx_xfer_t *x, kvx_peer_t *p, int op,
                               const kvx_xfer_src_t *src)
{
    int rc = kvx_xfer_runs_room(x, src->count);

    x->bytes = 0;
    if (rc < 0)
        return rc;
    if (src->ranges != NULL)
        return kvx_xfer_build_ranges(core, x, p, op, src);
    /* a peer pairing again: checked against the region last known, and again when it is back */
    return kvx_xfer_build_blocks(
        core, x, p->reconnecting ? p->last_num_blocks : p->conn->remote_num_blocks, src);
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
    x->pieces = count;
    x->tag = (fm & KVX_XFER_PARAM_TAG) ? params->tag : 0;
    x->notify = (flags & KVX_XFER_NOTIFY) != 0 || (fm & KVX_XFER_PARAM_NOTICE_DATA);
    x->has_data = (fm & KVX_XFER_PARAM_NOTICE_DATA) != 0;
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

/* The notice's payload, the transfer's own copy (the caller's buffer may go at once): 0 or
 * -ENOMEM. Its length was checked by the call (at most KVX_NOTICE_DATA_MAX). */
static int kvx_xfer_copy_notice(kvx_xfer_t *x, const kvx_xfer_params_t *params)
{
    if (params == NULL || !(params->field_mask & KVX_XFER_PARAM_NOTICE_DATA) ||
        params->notice_len == 0)
        return 0;
    x->notice_data = malloc(params->notice_len);
    if (x->notice_data == NULL)
        return -ENOMEM;
    memcpy(x->notice_data, params->notice_data, params->notice_len);
    x->notice_len = (uint32_t)params->notice_len;
    return 0;
}

int kvx_xfer_submit(kvx_core_t *core, kvx_peer_t *p, int op, const kvx_xfer_src_t *src,
                    const kvx_xfer_params_t *params, uint64_t *id_p)
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
    rc = kvx_xfer_build_runs(core, x, p, op, src);
    if (rc < 0) {
        kvx_xfer_free(x);
        return rc;
    }
    rc = kvx_xfer_copy_notice(x, params);
    if (rc < 0) {
        kvx_xfer_free(x);
        return rc;
    }
    now = kvx_now_ns();
    kvx_xfer_fill(core, x, p, op, src->count, params, now);
    if (src->unreported) {
        x->alone = true;
        kvx_xfer_purge(x);
    }
    *id_p = x->id;
    if (x->bytes == 0 && !x->notify) { /* nothing to move, nobody to tell: done at once */
        kvx_list_add_tail(&core->active, &x->active_link);
        kvx_xfer_done(x, 0);
        return 0;
    }
    kvx_xfer_queue(core, x, now);
    return 0;
}

/* Whether parked x still fits its peer's new connection c: its main-region runs inside the
 * main region (-EINVAL), its other regions of the same process (-ESTALE). 0 if so. */
static int kvx_xfer_fits(const kvx_xfer_t *x, const kvx_conn_t *c)
{
    if (x->rgen != 0 && x->rgen != c->generation)
        return -ESTALE;
    for (uint32_t i = 0; i < x->nruns; i++)
        if (x->rregs[x->runs[i].rreg].id == KVX_REGION_MAIN &&
            (x->runs[i].remote > c->remote_len ||
             x->runs[i].len > c->remote_len - x->runs[i].remote))
            return -EINVAL;
    return 0;
}

void kvx_xfer_unpark(kvx_peer_t *p, kvx_conn_t *c, int err)
{
    uint64_t now = kvx_now_ns();
    bool any = false;

    while (!kvx_list_empty(&p->parked)) {
        kvx_xfer_t *x = kvx_list_first(&p->parked, kvx_xfer_t, conn_link);
        int why = c != NULL ? kvx_xfer_fits(x, c) : err;

        if (why != 0) {
            kvx_xfer_end(x, why);
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
