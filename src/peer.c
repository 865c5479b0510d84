/*
 * Peers and their connections: add, remove, replace, the compatibility rules, and how a
 * connection fails and closes (every failure path of a transfer ends in kvx_conn_fail).
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long kvx_peer_add waits for the wire-up before letting it finish in the background. */
#define KVX_CONNECT_WAIT_NS (200ull * 1000000ull)
#define KVX_CLOSE_WAIT_NS (5ull * 1000000000ull)

/* ---- the peer table: a chained hash by peer id ---------------------------------------------- */

static size_t kvx_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;

    while (*s) {
        h ^= (unsigned char)*s++;
        h *= 1099511628211ull;
    }
    return (size_t)h;
}

kvx_peer_t *kvx_peer_lookup(const kvx_transport_t *t, const char *id)
{
    if (t->ptab_cap == 0)
        return NULL;
    for (kvx_peer_t *p = t->ptab[kvx_hash(id) & (t->ptab_cap - 1)]; p != NULL; p = p->hnext)
        if (strcmp(p->id, id) == 0)
            return p;
    return NULL;
}

static int kvx_peer_insert(kvx_transport_t *t, kvx_peer_t *p)
{
    if (t->npeers + 1 > t->ptab_cap) {
        size_t cap = t->ptab_cap ? t->ptab_cap * 2 : 16;
        kvx_peer_t **tab = calloc(cap, sizeof(*tab));
        if (tab == NULL)
            return -ENOMEM;
        for (size_t i = 0; i < t->ptab_cap; i++) {
            kvx_peer_t *q, *next;
            for (q = t->ptab[i]; q != NULL; q = next) {
                next = q->hnext;
                q->hnext = tab[kvx_hash(q->id) & (cap - 1)];
                tab[kvx_hash(q->id) & (cap - 1)] = q;
            }
        }
        free(t->ptab);
        t->ptab = tab;
        t->ptab_cap = cap;
    }
    size_t b = kvx_hash(p->id) & (t->ptab_cap - 1);
    p->hnext = t->ptab[b];
    t->ptab[b] = p;
    t->npeers++;
    return 0;
}

static void kvx_peer_unlink(kvx_transport_t *t, kvx_peer_t *p)
{
    kvx_peer_t **pp = &t->ptab[kvx_hash(p->id) & (t->ptab_cap - 1)];

    while (*pp != p)
        pp = &(*pp)->hnext;
    *pp = p->hnext;
    t->npeers--;
}

/* A removed peer lives on while the application still has transfers of it to poll. */
void kvx_peer_maybe_free(kvx_transport_t *t, kvx_peer_t *p)
{
    if (!p->removed || p->conn != NULL || p->nxfers != 0)
        return;
    kvx_peer_unlink(t, p);
    free(p->id);
    free(p);
}

void kvx_peer_free_all(kvx_transport_t *t)
{
    for (size_t i = 0; i < t->ptab_cap; i++) {
        kvx_peer_t *p, *next;
        for (p = t->ptab[i]; p != NULL; p = next) {
            next = p->hnext;
            free(p->id);
            free(p);
        }
    }
    free(t->ptab);
    t->ptab = NULL;
    t->ptab_cap = t->npeers = t->nconnected = 0;
}

/* ---- compatibility rules -------------------------------------------------------------------- */

/* The compatibility rules of kvx_peer_add. Returns 0, or the error with *why saying which rule. */
int kvx_peer_check(const kvx_transport_t *t, const kvx_md_t *md, const kvx_peer_params_t *expect,
                   const char **why)
{
    if (strcmp(md->agent_name, t->name) == 0) {
        *why = "the metadata is this transport's own (same agent name)";
        return -EEXIST;
    }
    if (expect != NULL && (expect->field_mask & KVX_PEER_PARAM_EXPECT_REGION) &&
        (expect->base_addr != md->base || expect->num_blocks != md->num_blocks ||
         expect->block_len != md->block_len)) {
        *why = "base address, block count or block length disagree with the metadata";
        return -EINVAL;
    }
    if (md->block_len != t->block_len) {
        *why = "block length differs from ours";
        return -KVX_EINCOMPAT;
    }
    if (md->fingerprint[0] != '\0' && t->fingerprint[0] != '\0' &&
        strcmp(md->fingerprint, t->fingerprint) != 0) {
        *why = "config fingerprint differs from ours";
        return -KVX_EINCOMPAT;
    }
    return 0;
}

/* ---- connections ---------------------------------------------------------------------------- */

void kvx_conn_maybe_free(kvx_conn_t *c)
{
    if (c->state != KVX_CONN_CLOSED || c->ucx_refs != 0)
        return;
    kvx_ucx_conn_free(c);
    kvx_xfer_free_flushes(c);
    if (c->peer != NULL)
        return; /* a failed connection stays visible on its peer until remove or re-add */
    kvx_list_del(&c->all_link);
    kvx_list_del(&c->work_link);
    free(c);
}

void kvx_on_conn_closed(kvx_conn_t *c)
{
    c->state = KVX_CONN_CLOSED;
    /* UCX has let go of every operation of this endpoint: now the failures may be reported. */
    while (!kvx_list_empty(&c->failing))
        kvx_xfer_complete(kvx_list_first(&c->failing, kvx_xfer_t, conn_link), c->err);
    kvx_conn_maybe_free(c);
}

/*
 * Fail a connection: transfers that never reached UCX fail now; those UCX holds fail when the
 * forced close of the endpoint completes, so that a reported failure never has bytes still
 * moving. May free c (when it is detached from its peer).
 */
void kvx_conn_fail(kvx_conn_t *c, int err)
{
    if (c->state != KVX_CONN_OPEN)
        return;
    c->state = KVX_CONN_CLOSING;
    c->err = err;
    kvx_list_del(&c->work_link);
    kvx_info(c->t, "connection to %s closing: %s", c->agent_name, kvx_strerror(err));
    while (!kvx_list_empty(&c->queue)) {
        kvx_xfer_t *x = kvx_list_first(&c->queue, kvx_xfer_t, conn_link);
        if (x->next_run == 0) {
            kvx_xfer_complete(x, err);
        } else {
            kvx_list_del(&x->conn_link);
            x->state = KVX_XS_FAILING;
            kvx_list_add_tail(&c->failing, &x->conn_link);
        }
    }
    while (!kvx_list_empty(&c->flushing)) {
        kvx_xfer_t *x = kvx_list_first(&c->flushing, kvx_xfer_t, conn_link);
        kvx_list_del(&x->conn_link);
        x->state = KVX_XS_FAILING;
        kvx_list_add_tail(&c->failing, &x->conn_link);
    }
    if (kvx_ucx_conn_close(c) == 0)
        kvx_on_conn_closed(c);
}

/* Detach a connection from its peer and make sure it goes away. May free c. */
void kvx_conn_release(kvx_conn_t *c, int err)
{
    c->peer = NULL;
    if (c->state == KVX_CONN_OPEN)
        kvx_conn_fail(c, err);
    else
        kvx_conn_maybe_free(c);
}

/* Called from UCX callbacks: only record the error; kvx_conn_handle_work acts on it. */
void kvx_on_conn_error(kvx_conn_t *c, int status)
{
    if (c->state != KVX_CONN_OPEN || c->pending_err != 0)
        return;
    c->pending_err = status != 0 ? status : -ECONNRESET;
    kvx_info(c->t, "UCX reports connection to %s failed: %s", c->agent_name,
             kvx_strerror(c->pending_err));
    if (!kvx_list_linked(&c->work_link))
        kvx_list_add_tail(&c->t->work, &c->work_link);
}

void kvx_conn_handle_work(kvx_conn_t *c)
{
    kvx_list_del(&c->work_link);
    if (c->state != KVX_CONN_OPEN)
        return;
    if (c->pending_err != 0)
        kvx_conn_fail(c, c->pending_err);
    else
        kvx_xfer_post(c, SIZE_MAX);
}

/* Drive UCX until no connection is closing any more, for KVX_CLOSE_WAIT_NS at most. */
void kvx_conn_wait_closed(kvx_transport_t *t)
{
    uint64_t end = kvx_now_ns() + KVX_CLOSE_WAIT_NS;

    for (;;) {
        bool closing = false;
        for (kvx_list_t *n = t->conns.next; n != &t->conns; n = n->next)
            if (kvx_container_of(n, kvx_conn_t, all_link)->state == KVX_CONN_CLOSING)
                closing = true;
        if (!closing)
            return;
        if (kvx_now_ns() > end) {
            kvx_warn(t, "connections still closing after %llu ms",
                     (unsigned long long)(KVX_CLOSE_WAIT_NS / 1000000ull));
            return;
        }
        kvx_ucx_progress(t);
    }
}

/* ---- public API ----------------------------------------------------------------------------- */

static bool kvx_peer_id_ok(const char *id)
{
    size_t n;

    if (id == NULL)
        return false;
    n = strnlen(id, KVX_PEER_ID_MAX + 1);
    return n >= 1 && n <= KVX_PEER_ID_MAX;
}

int kvx_peer_add(kvx_transport_t *t, const char *peer_id, const void *metadata, size_t metadata_len,
                 const kvx_peer_params_t *params)
{
    kvx_md_t md;
    kvx_conn_t *c;
    kvx_peer_t *p, *fresh = NULL;
    const char *why;
    int rc;

    if (t == NULL || !kvx_peer_id_ok(peer_id) || (metadata == NULL && metadata_len != 0))
        return -EINVAL;
    rc = kvx_md_decode(metadata, metadata_len, &md);
    if (rc < 0) {
        kvx_error(t, "peer %s: metadata rejected: %s", peer_id, kvx_strerror(rc));
        return rc;
    }
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    rc = kvx_peer_check(t, &md, params, &why);
    if (rc < 0) {
        kvx_error(t, "peer %s (%s) rejected: %s", peer_id, md.agent_name, why);
        goto out;
    }

    p = kvx_peer_lookup(t, peer_id);
    if (p == NULL) {
        /* a new id is inserted up front (as if removed), so that nothing can fail after the
         * connection is up */
        fresh = calloc(1, sizeof(*fresh));
        if (fresh == NULL || (fresh->id = strdup(peer_id)) == NULL ||
            kvx_peer_insert(t, fresh) < 0) {
            if (fresh != NULL)
                free(fresh->id);
            free(fresh);
            rc = -ENOMEM;
            goto out;
        }
        fresh->removed = true;
        kvx_list_init(&fresh->cq);
        kvx_list_init(&fresh->ready_link);
        p = fresh;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        rc = -ENOMEM;
        goto err_fresh;
    }
    c->t = t;
    c->remote_base = md.base;
    c->remote_num_blocks = md.num_blocks;
    memcpy(c->agent_name, md.agent_name, sizeof(c->agent_name));
    kvx_list_init(&c->queue);
    kvx_list_init(&c->flushing);
    kvx_list_init(&c->failing);
    kvx_list_init(&c->work_link);
    kvx_list_init(&c->all_link);
    rc = kvx_ucx_conn_open(c, &md, KVX_CONNECT_WAIT_NS);
    if (rc < 0) {
        kvx_list_del(&c->work_link);
        free(c);
        goto err_fresh;
    }
    if (p->conn != NULL) {
        /* Replace: the old connection goes first, and its transfers fail. */
        kvx_conn_t *old = p->conn;
        kvx_info(t, "peer %s: replacing connection to %s with one to %s", peer_id, old->agent_name,
                 md.agent_name);
        p->conn = NULL;
        kvx_conn_release(old, -ECONNABORTED);
        kvx_conn_wait_closed(t);
    } else {
        t->nconnected++;
    }
    p->conn = c;
    p->removed = false;
    p->last_err = 0;
    c->peer = p;
    kvx_list_add_tail(&t->conns, &c->all_link);
    memcpy(p->last_agent, c->agent_name, sizeof(p->last_agent));
    p->last_base = c->remote_base;
    p->last_num_blocks = c->remote_num_blocks;
    kvx_info(t, "peer %s: connected to %s over %s (%s RMA)", peer_id, c->agent_name, c->transport,
             c->rma_hw ? "hardware" : "emulated");
    rc = 0;
    goto out;

err_fresh:
    if (fresh != NULL) {
        kvx_peer_unlink(t, fresh);
        free(fresh->id);
        free(fresh);
    }
out:
    kvx_unlock(t);
    return rc;
}

int kvx_peer_remove(kvx_transport_t *t, const char *peer_id)
{
    kvx_peer_t *p;
    kvx_conn_t *c;
    int rc = 0;

    if (t == NULL || !kvx_peer_id_ok(peer_id))
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    p = kvx_peer_lookup(t, peer_id);
    if (p == NULL || p->conn == NULL)
        goto out;
    c = p->conn;
    p->last_err = c->err;
    p->conn = NULL;
    p->removed = true;
    kvx_conn_release(c, -ECONNABORTED);
    t->nconnected--;
    kvx_conn_wait_closed(t);
    kvx_peer_maybe_free(t, p);
    rc = 1;
out:
    kvx_unlock(t);
    return rc;
}

int kvx_peer_query(kvx_transport_t *t, const char *peer_id, kvx_peer_attr_t *attr)
{
    kvx_peer_t *p;
    kvx_conn_t *c;
    uint64_t m;
    int rc = 0;

    if (t == NULL || !kvx_peer_id_ok(peer_id) || attr == NULL)
        return -EINVAL;
    m = attr->field_mask;
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    p = kvx_peer_lookup(t, peer_id);
    if (p == NULL) {
        rc = -ENOENT;
        goto out;
    }
    c = p->conn;
    if (m & KVX_PEER_ATTR_AGENT_NAME)
        memcpy(attr->agent_name, p->last_agent, sizeof(attr->agent_name));
    if (m & KVX_PEER_ATTR_TRANSPORT) {
        snprintf(attr->transport, sizeof(attr->transport), "%s", c ? c->transport : "");
        attr->rma_hw = c ? c->rma_hw : 0;
    }
    if (m & KVX_PEER_ATTR_STATE) {
        attr->state = c == NULL                   ? KVX_PEER_REMOVED
                      : c->state != KVX_CONN_OPEN ? KVX_PEER_FAILED
                      : c->pending_err != 0       ? KVX_PEER_FAILED
                                                  : KVX_PEER_CONNECTED;
        attr->error = c == NULL ? p->last_err : c->err != 0 ? c->err : c->pending_err;
    }
    if (m & KVX_PEER_ATTR_REGION) {
        attr->remote_base = p->last_base;
        attr->remote_num_blocks = p->last_num_blocks;
        attr->block_len = t->block_len;
    }
    if (m & KVX_PEER_ATTR_COUNTERS) {
        attr->bytes_written = p->bytes_written;
        attr->bytes_read = p->bytes_read;
        attr->xfers_done = p->xfers_done;
        attr->xfers_failed = p->xfers_failed;
        attr->xfers_inflight = p->inflight;
        attr->latency_sum_ns = p->lat_sum_ns;
        attr->latency_max_ns = p->lat_max_ns;
    }
out:
    kvx_unlock(t);
    return rc;
}
