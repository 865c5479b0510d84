/*
 * The region calls (kvx.h, "Regions and ranges"): register, deregister (the fence), the blob
 * peers load, load and unload a peer's. The range transfers are born with the block calls
 * (xfer_api.c). A region is a table entry and 16 random bytes: nothing goes to UCX.
 */
#include "api/transport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define KVX_ACCESS_ALL ((unsigned)(KVX_REGION_WRITE | KVX_REGION_READ))
/* How long a deregistration waits for what is in flight before closing connections, at most
 * (the stall limit when shorter), and then for the closes. */
#define KVX_DEREG_WAIT_NS (1000ull * 1000000ull)
#define KVX_DEREG_CLOSE_NS (200ull * 1000000ull)

int kvx_region_register(kvx_transport_t *t, void *base, uint64_t len,
                        const kvx_region_params_t *params, uint32_t *region_p)
{
    uint64_t fm = params != NULL ? params->field_mask : 0;
    unsigned access = (fm & KVX_REGION_PARAM_ACCESS) ? params->access : KVX_ACCESS_ALL;
    uint8_t cap[16];
    kvx_region_t *g;
    int rc;

    if (t == NULL || base == NULL || region_p == NULL || len == 0 ||
        (uintptr_t)base > UINTPTR_MAX - len || (fm & ~(uint64_t)KVX_REGION_PARAM_ACCESS) ||
        access == 0 || (access & ~KVX_ACCESS_ALL))
        return -EINVAL;
    if (getrandom(cap, sizeof(cap), 0) != (ssize_t)sizeof(cap))
        return -errno;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    rc = kvx_region_add(&t->core, base, len, access, cap, false, &g);
    if (rc == 0) {
        t->core.regions.counters.registrations++;
        *region_p = g->id;
    }
    kvx_unlock(&t->core);
    return rc;
}

/* ---- deregistration: a fence --------------------------------------------------------------- */

/* A deregistration under way. held: our connections whose messages in UCX's hands read or
 * write the region (its transfers' sends and rendezvous receives when it began, and those it
 * closed): a tcp one that fails lingers while UCX still sends what it holds (a UCX defect:
 * docs/design.md, "UCX defects kvx works around"), its transfers reported at once, so the
 * fence waits for its linger to end too. */
#define KVX_DEREG_HELD 16
typedef struct kvx_dereg {
    kvx_transport_t *t;
    uint32_t id;
    kvx_conn_t *held[KVX_DEREG_HELD];
    unsigned nheld;
    /* which connections hold it is not known (more than KVX_DEREG_HELD, or a call again for a
     * region an earlier call left dead): every lingering connection with sends UCX holds counts */
    bool any;
} kvx_dereg_t;

static void kvx_dereg_hold(kvx_dereg_t *d, kvx_conn_t *c)
{
    for (unsigned i = 0; i < d->nheld; i++)
        if (d->held[i] == c)
            return;
    if (d->nheld < KVX_DEREG_HELD)
        d->held[d->nheld++] = c;
    else
        d->any = true;
}

/* Whether connection c (a pointer only: it may be freed meanwhile), or with c NULL any of ours,
 * still lingers with messages UCX holds. */
static bool kvx_dereg_lingers(kvx_transport_t *t, const kvx_conn_t *c)
{
    for (kvx_list_t *n = t->conns.all.next; n != &t->conns.all; n = n->next) {
        const kvx_conn_t *o = kvx_container_of(n, kvx_conn_t, all_link);
        if ((c == NULL || o == c) && o->lingering && o->reqs > 0)
            return true;
    }
    return false;
}

/* How long a deregistration waits before it closes what holds the region: 1 s, or the stall
 * limit when that is shorter (0: no stall limit, 1 s). */
static uint64_t kvx_dereg_wait_ns(const kvx_core_t *core)
{
    return core->stall_ns != 0 && core->stall_ns < KVX_DEREG_WAIT_NS ? core->stall_ns
                                                                     : KVX_DEREG_WAIT_NS;
}

/* Nothing touches region id's memory any more: no hold on the receiving side, no transfer of
 * ours not yet done naming it (or the region is gone: another deregistration finished it). */
static bool kvx_dereg_done(void *arg)
{
    kvx_dereg_t *d = arg;
    kvx_core_t *core = &d->t->core;
    kvx_region_t *g = kvx_region_find(core, d->id);

    if (g == NULL)
        return true;
    if (g->users > 0)
        return false;
    for (kvx_list_t *n = core->active.next; n != &core->active; n = n->next)
        if (kvx_xfer_names_region(kvx_container_of(n, kvx_xfer_t, active_link), d->id))
            return false;
    for (unsigned i = 0; i < d->nheld; i++)
        if (kvx_dereg_lingers(d->t, d->held[i]))
            return false;
    return !(d->any && kvx_dereg_lingers(d->t, NULL));
}

/* Our transfers naming region id end (-ECANCELED): at once, or once UCX lets go of them. */
static void kvx_dereg_end_xfers(kvx_core_t *core, kvx_dereg_t *d)
{
    for (kvx_list_t *n = core->active.next, *next; n != &core->active; n = next) {
        kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);
        next = n->next;
        if (!kvx_xfer_names_region(x, d->id))
            continue;
        if (x->sending > 0 && x->conn != NULL)
            kvx_dereg_hold(d, x->conn);
        if (x->state != KVX_XS_ENDING)
            kvx_xfer_end(x, -ECANCELED);
    }
}

/* What still holds region g when the wait ended: its connections close (counted). */
static void kvx_dereg_close(kvx_transport_t *t, kvx_region_t *g, kvx_dereg_t *d)
{
    kvx_core_t *core = &t->core;
    uint64_t n = kvx_recv_region_close(&t->recv, g);

    for (kvx_list_t *l = core->active.next, *next; l != &core->active; l = next) {
        kvx_xfer_t *x = kvx_container_of(l, kvx_xfer_t, active_link);
        next = l->next;
        if (x->conn != NULL && x->conn->state == KVX_CONN_OPEN && kvx_xfer_names_region(x, g->id)) {
            kvx_dereg_hold(d, x->conn);
            kvx_conn_fail(x->conn, -ECONNABORTED);
            n++;
            next = core->active.next; /* the failure may have ended others: from the start */
        }
    }
    core->regions.counters.dereg_closed += n;
    if (n > 0)
        kvx_info(core, "region %u: deregistration closed %llu connections still holding it", g->id,
                 (unsigned long long)n);
}

int kvx_region_deregister(kvx_transport_t *t, uint32_t id)
{
    kvx_core_t *core;
    kvx_dereg_t d = {.t = t, .id = id};
    kvx_wait_t w = {.done = kvx_dereg_done, .arg = &d, .slice_ns = 1000000, .step = true};
    kvx_region_t *g;
    int rc;

    if (t == NULL || id == 0)
        return -EINVAL;
    core = &t->core;
    if (kvx_enter(core) < 0)
        return -ESHUTDOWN;
    g = kvx_region_find(core, id);
    rc = g == NULL ? -ENOENT : id == KVX_REGION_MAIN && t->owned ? -EBUSY : 0;
    if (rc < 0)
        goto out;
    d.any = g->dead; /* an earlier call's connections are not known to this one */
    if (!g->dead) {  /* from now on nothing of a peer is applied to it or served from it */
        g->dead = true;
        kvx_recv_region_dead(&t->recv, g);
        kvx_dereg_end_xfers(core, &d);
    }
    w.until_ns = kvx_now_ns() + kvx_dereg_wait_ns(core);
    rc = kvx_core_wait(core, &w);
    if (rc == -ETIMEDOUT && (g = kvx_region_find(core, id)) != NULL) {
        kvx_dereg_close(t, g, &d);
        w.until_ns = kvx_now_ns() + KVX_DEREG_CLOSE_NS;
        rc = kvx_core_wait(core, &w);
    }
    if (rc == 0 && (g = kvx_region_find(core, id)) != NULL)
        kvx_region_remove(core, g); /* no user: nothing refers to it */
    else if (rc == -ETIMEDOUT)
        kvx_error(core, "region %u: UCX still holds it %llu ms after its deregistration began", id,
                  (unsigned long long)(kvx_dereg_wait_ns(core) + KVX_DEREG_CLOSE_NS) / 1000000ull);
out:
    kvx_unlock(core);
    return rc;
}

/* ---- blobs ---------------------------------------------------------------------------------- */

int kvx_region_blob(kvx_transport_t *t, uint32_t id, void *buf, size_t *len_p)
{
    uint8_t tmp[KVX_REGION_BLOB_MAX];
    kvx_region_blob_t rb = {0};
    kvx_region_t *g;
    int rc;

    if (t == NULL || len_p == NULL || (buf == NULL && *len_p != 0))
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    g = kvx_region_find(&t->core, id);
    if (g == NULL || g->dead) {
        rc = -ENOENT;
        goto out;
    }
    memcpy(rb.agent_name, t->core.log.name, sizeof(rb.agent_name));
    rb.generation = t->core.generation;
    rb.id = g->id;
    rb.access = g->access;
    rb.base = (uintptr_t)g->base;
    rb.len = g->len;
    if (g->id != KVX_REGION_MAIN) /* the main region's is its connection's (zero here) */
        memcpy(rb.capability, g->capability, sizeof(rb.capability));
    rc = kvx_region_blob_encode(&rb, t->core.secret, t->core.secret_len, tmp, sizeof(tmp));
    if (rc < 0)
        goto out;
    if ((size_t)rc > *len_p) {
        *len_p = (size_t)rc;
        rc = -ENOSPC;
        goto out;
    }
    memcpy(buf, tmp, (size_t)rc);
    *len_p = (size_t)rc;
    rc = 0;
out:
    kvx_unlock(&t->core);
    return rc;
}

/* rb (decoded and verified) for peer p: the handle it has already, or a new one. */
static int kvx_region_load_into(kvx_peer_t *p, const kvx_region_blob_t *rb, uint32_t *handle_p)
{
    kvx_rhandle_t *h;

    for (uint32_t i = 0; i < p->nrh; i++) {
        h = &p->rh[i];
        if (h->id == rb->id && h->generation == rb->generation && h->access == rb->access &&
            h->len == rb->len && memcmp(h->capability, rb->capability, 16) == 0) {
            *handle_p = h->handle;
            return 0;
        }
    }
    if (p->nrh >= KVX_REGIONS_MAX)
        return -ENOSPC;
    if (p->nrh == p->rh_cap) {
        uint32_t cap = p->rh_cap ? p->rh_cap * 2 : 8;
        kvx_rhandle_t *rh = realloc(p->rh, (size_t)cap * sizeof(*rh));
        if (rh == NULL)
            return -ENOMEM;
        p->rh = rh;
        p->rh_cap = cap;
    }
    if (p->next_handle <= KVX_REGION_MAIN)
        p->next_handle = KVX_REGION_MAIN + 1;
    h = &p->rh[p->nrh++];
    h->handle = p->next_handle++;
    h->id = rb->id;
    h->access = rb->access;
    h->len = rb->len;
    h->generation = rb->generation;
    memcpy(h->capability, rb->capability, 16);
    *handle_p = h->handle;
    return 0;
}

int kvx_region_load(kvx_transport_t *t, const char *peer_id, const void *blob, size_t len,
                    uint32_t *handle_p)
{
    kvx_region_blob_t rb;
    kvx_peer_t *p;
    int rc;

    if (t == NULL || peer_id == NULL || blob == NULL || handle_p == NULL)
        return -EINVAL;
    rc = kvx_region_blob_decode(blob, len, &rb);
    if (rc < 0)
        return rc;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    p = kvx_peer_lookup(&t->core, peer_id);
    if (p == NULL || p->conn == NULL)
        rc = -ENOENT;
    else if ((rc = kvx_region_blob_verify(blob, len, &rb, t->core.secret, t->core.secret_len)) < 0)
        ;
    else if (strcmp(rb.agent_name, p->last_agent) != 0 || rb.id == KVX_REGION_MAIN)
        rc = -EINVAL;
    else if (rb.generation != p->last_generation)
        rc = -ESTALE;
    else
        rc = kvx_region_load_into(p, &rb, handle_p);
    if (rc < 0)
        kvx_debug(&t->core, "region blob for %s refused: %s", peer_id, kvx_strerror(rc));
    kvx_unlock(&t->core);
    return rc;
}

int kvx_region_unload(kvx_transport_t *t, const char *peer_id, uint32_t handle)
{
    kvx_peer_t *p;
    kvx_rhandle_t *h;
    int rc = -ENOENT;

    if (t == NULL || peer_id == NULL)
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    p = kvx_peer_lookup(&t->core, peer_id);
    if (p != NULL && p->conn != NULL && (h = kvx_rhandle_find(p, handle)) != NULL) {
        size_t i = (size_t)(h - p->rh);
        memmove(h, h + 1, (p->nrh - i - 1) * sizeof(*h));
        p->nrh--;
        rc = 0;
    }
    kvx_unlock(&t->core);
    return rc;
}
