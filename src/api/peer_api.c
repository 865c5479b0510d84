/*
 * The application's calls about peers: add (from metadata or by address), remove, listen, and
 * what they wait for with the lock released (a handshake, an old connection closing, the adds and
 * removes of one id before them). Peers and their connections themselves are peer.c's.
 */
#include "api/transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long kvx_peer_add waits for the wire-up before letting it finish in the background. */
#define KVX_CONNECT_WAIT_NS (200ull * 1000000ull)

/* How long removing or replacing a peer waits for its old connection to close. */
#define KVX_CLOSE_WAIT_NS (2ull * 1000000000ull)

/* What a call waits for on a connection: its handshake answered (or failed), or its close. */
static bool kvx_conn_wired_or_failed(void *arg)
{
    const kvx_conn_t *c = arg;
    return !(c->state == KVX_CONN_OPEN && !c->wired && c->pending_err == 0);
}
static bool kvx_conn_closed_or_lingering(void *arg)
{
    const kvx_conn_t *c = arg;
    return !(c->state == KVX_CONN_CLOSING && !c->lingering);
}

/* Wait with the lock released (kvx_core_wait) until c is no longer open-and-unwired (wait_wired)
 * or no longer closing (otherwise), the transport closes, or until_ns. c is pinned meanwhile: it
 * stays allocated. */
static void kvx_conn_wait(kvx_transport_t *t, kvx_conn_t *c, bool wait_wired, uint64_t until_ns)
{
    c->pins++;
    kvx_core_wait(&t->core, &(kvx_wait_t){.done = wait_wired ? kvx_conn_wired_or_failed
                                                             : kvx_conn_closed_or_lingering,
                                          .arg = c,
                                          .until_ns = until_ns});
    c->pins--;
}

/*
 * Adds and removes of one peer id run one after the other, in call order, although they wait
 * with the lock released: without this, a slow add of stale metadata that began first could
 * install its connection after a quick add of fresh metadata, and win. Returns 0 when it is the
 * caller's turn, or -ESHUTDOWN (the transport closes; the queue does not matter any more).
 */
typedef struct kvx_turn {
    const kvx_peer_t *p;
    uint64_t ticket;
} kvx_turn_t;

static bool kvx_peer_turn_came(void *arg)
{
    const kvx_turn_t *turn = arg;
    return turn->p->turn_now == turn->ticket;
}

static int kvx_peer_turn_begin(kvx_transport_t *t, kvx_peer_t *p)
{
    kvx_turn_t turn = {p, p->turn_next++};

    /* looked at every 10 ms: a turn that comes signals nobody */
    return kvx_core_wait(&t->core, &(kvx_wait_t){.done = kvx_peer_turn_came,
                                                 .arg = &turn,
                                                 .until_ns = UINT64_MAX,
                                                 .slice_ns = 10000000ull});
}

static void kvx_peer_turn_end(kvx_transport_t *t, kvx_peer_t *p)
{
    p->turn_now++;
    if (p->turn_now != p->turn_next)
        pthread_cond_broadcast(&t->core.cond); /* the next add or remove of this id */
}

/*
 * Whether a blob of generation gen is refused as stale for peer p: only while p's connection is
 * healthy (open, answered its handshake, no error, not pairing again) and of a later generation.
 * A stale copy of the metadata of a process since restarted cannot take the id from its live
 * successor; but a connection that failed or never answered holds nothing: a peer whose clock
 * stepped back, or one forged blob of generation 2^64-1 (without a secret, any holder of the
 * metadata can make one), keeps the id no longer than the connection it made stays healthy.
 * Answers of a listener (kvx_peer_connect, a reconnection) are never stale: the address is
 * authoritative, whatever the generation.
 */
static bool kvx_peer_stale(const kvx_peer_t *p, uint64_t gen)
{
    const kvx_conn_t *c = p->conn;

    return c != NULL && gen < c->generation && c->state == KVX_CONN_OPEN && c->wired &&
           c->pending_err == 0 && !p->reconnecting;
}

static void kvx_conn_retire(kvx_transport_t *t, kvx_conn_t *old, int err)
{
    old->pins++;
    kvx_conn_release(old, err);
    kvx_conn_wait(t, old, false, kvx_now_ns() + KVX_CLOSE_WAIT_NS);
    old->pins--;
    kvx_conn_maybe_free(old);
}

static int kvx_peer_add_at(kvx_transport_t *t, const char *peer_id, const void *metadata,
                           size_t metadata_len, const kvx_peer_params_t *params, const char *addr);

int kvx_peer_add(kvx_transport_t *t, const char *peer_id, const void *metadata, size_t metadata_len,
                 const kvx_peer_params_t *params)
{
    return kvx_peer_add_at(t, peer_id, metadata, metadata_len, params, NULL);
}

/* The checks of an add (lock held): the blob signed with this transport's secret (with one,
 * nothing of it reaches UCX's parsers unless it was), and the compatibility rules. 0, or the
 * error (logged). */
static int kvx_peer_add_check(kvx_transport_t *t, const char *peer_id, const void *metadata,
                              size_t metadata_len, const kvx_md_t *md,
                              const kvx_peer_params_t *params)
{
    const char *why;
    int rc = kvx_md_verify(metadata, metadata_len, md, t->core.secret, t->core.secret_len);

    if (rc < 0) {
        kvx_error(&t->core, "peer %s (%s) rejected: %s", peer_id, md->agent_name,
                  t->core.secret ? "metadata not signed with this transport's secret"
                                 : "the peer requires a shared secret and this transport has none");
        return rc;
    }
    rc = kvx_peer_check(&t->core, md, params, &why);
    if (rc < 0)
        kvx_error(&t->core, "peer %s (%s) rejected: %s", peer_id, md->agent_name, why);
    return rc;
}

/* The new connection of an add: open, its handshake waited for (KVX_CONNECT_WAIT_NS: it is not
 * the peer's until it has answered, or that time passed; until then an existing connection of
 * that id keeps working, and stays if this one fails), its mapping prefaulted. 0 with *c_p, or
 * the error (logged; the connection goes). */
static int kvx_peer_add_conn(kvx_transport_t *t, const char *peer_id, const kvx_md_t *md,
                             kvx_conn_t **c_p)
{
    kvx_conn_t *c;
    int rc = kvx_conn_open(&t->conns, peer_id, md, &kvx_peer_conn_ops, &t->peers, &c);

    if (rc < 0)
        return rc;
    c->pins++;
    kvx_conn_wait(t, c, true, kvx_now_ns() + KVX_CONNECT_WAIT_NS);
    if (c->mapped != NULL && !t->core.closed)
        kvx_conn_prefault(c);
    c->pins--;
    rc = t->core.closed ? -ESHUTDOWN : c->state != KVX_CONN_OPEN ? c->err : c->pending_err;
    if (rc < 0) {
        kvx_error(&t->core, "peer %s (%s): %s", peer_id, md->agent_name, kvx_strerror(rc));
        if (c->state == KVX_CONN_OPEN)
            kvx_conn_fail(c, rc);
        else
            kvx_conn_maybe_free(c);
        return rc;
    }
    if (!c->wired)
        kvx_info(&t->core, "peer %s (%s) has not answered yet; wire-up goes on in the background",
                 peer_id, md->agent_name);
    *c_p = c;
    return 0;
}

/* Install the new connection c on p (addr: where p listens, or NULL; the peer takes it), then
 * retire the old one. The peer id stays known throughout: a write submitted meanwhile goes to
 * one connection or the other. */
static void kvx_peer_install(kvx_transport_t *t, kvx_peer_t *p, kvx_conn_t *c,
                             const kvx_peer_params_t *params, char *addr)
{
    kvx_conn_t *old = p->conn;

    if (p->removed)
        t->core.nconnected++;
    kvx_conn_attach(c, p);
    p->removed = false;
    p->last_err = 0;
    memset(&p->expect, 0, sizeof(p->expect));
    if (params != NULL && (params->field_mask & KVX_PEER_PARAM_EXPECT_REGION))
        p->expect = *params;
    /* paired by address or not from now on; a reconnection under way is over, and the
     * transfers it parked go to this connection */
    free(p->addr);
    p->addr = addr;
    kvx_reconnect_forget(&t->peers, p);
    kvx_xfer_unpark(p, c, 0);
    kvx_info(&t->core, "peer %s: connected to %s over %s (messages of %zu bytes)%s", p->id,
             c->agent_name, c->transport, c->seg, c->watched ? ", watching its process" : "");
    if (old == NULL)
        return;
    kvx_info(&t->core, "peer %s: replaced its connection to %s", p->id, old->agent_name);
    if (params != NULL && (params->field_mask & KVX_PEER_PARAM_FLAGS) &&
        (params->flags & KVX_PEER_ADD_PURGE))
        kvx_xfer_purge_peer(&t->core, p, old); /* ENDING ones too: they name their connection */
    kvx_conn_retire(t, old, -ECONNABORTED);
}

/* kvx_peer_add; addr: where the peer listens (kvx_peer_connect), or NULL (a metadata blob). */
static int kvx_peer_add_at(kvx_transport_t *t, const char *peer_id, const void *metadata,
                           size_t metadata_len, const kvx_peer_params_t *params, const char *addr)
{
    char *addr_copy = NULL;
    kvx_md_t md;
    kvx_conn_t *c;
    kvx_peer_t *p;
    int rc;

    if (t == NULL || !kvx_peer_id_ok(peer_id) || (metadata == NULL && metadata_len != 0) ||
        (params != NULL && (params->field_mask & KVX_PEER_PARAM_FLAGS) &&
         (params->flags & ~(uint32_t)KVX_PEER_ADD_PURGE)))
        return -EINVAL;
    rc = kvx_md_decode(metadata, metadata_len, &md);
    if (rc < 0) {
        kvx_error(&t->core, "peer %s: metadata rejected: %s", peer_id, kvx_strerror(rc));
        return rc;
    }
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    rc = kvx_peer_add_check(t, peer_id, metadata, metadata_len, &md, params);
    if (rc < 0)
        goto out;
    /* A new id gets its entry now, invisible until a connection is installed: it holds the
     * queue of adds and removes of that id. */
    p = kvx_peer_lookup(&t->core, peer_id);
    if (p == NULL && (p = kvx_peer_new(&t->core, peer_id)) == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    rc = kvx_peer_turn_begin(t, p);
    if (rc < 0)
        goto out; /* closing: close frees p */
    if (addr != NULL && (addr_copy = strdup(addr)) == NULL) {
        rc = -ENOMEM;
        goto out_turn;
    }
    /* a blob older than the peer's live connection: a stale copy (of a process since
     * restarted, say); a listener's answer never is */
    if (addr == NULL && kvx_peer_stale(p, md.generation)) {
        kvx_error(&t->core, "peer %s (%s) rejected: its metadata is older than the peer's (%s)",
                  peer_id, md.agent_name, p->conn->agent_name);
        rc = -ESTALE;
        goto out_turn;
    }
    rc = kvx_peer_add_conn(t, peer_id, &md, &c);
    if (rc == -ESHUTDOWN)
        goto out;
    if (rc == 0) {
        kvx_peer_install(t, p, c, params, addr_copy);
        addr_copy = NULL;
    }
out_turn:
    kvx_peer_turn_end(t, p);
    kvx_peer_maybe_free(&t->core, p); /* an entry made for an add that failed */
out:
    kvx_unlock(&t->core);
    free(addr_copy);
    return rc;
}

static int kvx_peer_remove_impl(kvx_transport_t *t, const char *peer_id, unsigned flags)
{
    kvx_peer_t *p;
    kvx_conn_t *c;
    int rc = 0;

    if (t == NULL || !kvx_peer_id_ok(peer_id) || (flags & ~(unsigned)KVX_PEER_REMOVE_PURGE))
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    p = kvx_peer_lookup(&t->core, peer_id);
    if (p == NULL || (p->conn == NULL && p->turn_now == p->turn_next))
        goto out;
    /* after the adds and removes of this id called before this one */
    p->nxfers++; /* keeps p allocated while the lock is released below */
    rc = kvx_peer_turn_begin(t, p);
    p->nxfers--;
    if (rc < 0)
        goto out;
    c = p->conn;
    if (c == NULL) {
        kvx_peer_turn_end(t, p);
        kvx_peer_maybe_free(&t->core, p);
        goto out;
    }
    if (flags & KVX_PEER_REMOVE_PURGE) {
        /* forget what finished and was not polled yet (p keeps its connection meanwhile, so
         * freeing cannot free it), and mark what is in flight to be forgotten as it ends */
        while (!kvx_list_empty(&p->cq))
            kvx_xfer_free(kvx_list_first(&p->cq, kvx_xfer_t, conn_link));
        kvx_xfer_purge_peer(&t->core, p, NULL);
    }
    p->conn = NULL;
    p->removed = true;
    p->nrh = 0; /* its loaded regions go with it (transfers in flight keep their own copies) */
    p->last_err = c->err;
    t->core.nconnected--;
    free(p->addr); /* no more pairing again */
    p->addr = NULL;
    kvx_reconnect_forget(&t->peers, p);
    kvx_xfer_unpark(p, NULL, -ECONNABORTED);
    kvx_conn_retire(t, c, -ECONNABORTED);
    kvx_peer_turn_end(t, p);
    kvx_peer_maybe_free(&t->core, p);
    rc = 1;
out:
    kvx_unlock(&t->core);
    return rc;
}

int kvx_peer_remove(kvx_transport_t *t, const char *peer_id)
{
    return kvx_peer_remove_impl(t, peer_id, 0);
}

int kvx_peer_remove_ex(kvx_transport_t *t, const char *peer_id, unsigned flags)
{
    return kvx_peer_remove_impl(t, peer_id, flags);
}

/* The peer's counters, from its statistics (the one count of its transfers' ends). */
static void kvx_peer_counters(const kvx_peer_t *p, kvx_peer_attr_t *attr)
{
    const kvx_stats_t *s = &p->stats;

    attr->bytes_written = s->bytes[KVX_OP_WRITE];
    attr->bytes_read = s->bytes[KVX_OP_READ];
    attr->xfers_done = s->xfers[KVX_OP_WRITE][KVX_STATUS_OK] + s->xfers[KVX_OP_READ][KVX_STATUS_OK];
    attr->xfers_failed = 0;
    for (int op = 0; op < 2; op++)
        for (int cls = KVX_STATUS_OK + 1; cls < KVX_STATUS_CLASSES; cls++)
            attr->xfers_failed += s->xfers[op][cls];
    attr->xfers_inflight = p->inflight;
    attr->latency_sum_ns = s->latency_sum_ns;
    attr->latency_max_ns = p->latency_max_ns;
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
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    p = kvx_peer_lookup(&t->core, peer_id);
    if (!kvx_peer_known(p)) {
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
                      : p->reconnecting           ? KVX_PEER_RECONNECTING
                      : c->state != KVX_CONN_OPEN ? KVX_PEER_FAILED
                      : c->pending_err != 0       ? KVX_PEER_FAILED
                      : !c->wired                 ? KVX_PEER_WIRING
                                                  : KVX_PEER_CONNECTED;
        attr->error = c == NULL ? p->last_err : c->err != 0 ? c->err : c->pending_err;
    }
    if (m & KVX_PEER_ATTR_REGION) {
        attr->remote_base = p->last_base;
        attr->remote_num_blocks = p->last_num_blocks;
        attr->block_len = t->core.block_len;
    }
    if (m & KVX_PEER_ATTR_GENERATION)
        attr->generation = p->last_generation;
    if (m & KVX_PEER_ATTR_RECV) {
        kvx_writer_t *w = kvx_writer_lookup(&t->recv.conns, p->last_agent);
        memset(&attr->recv, 0, sizeof(attr->recv));
        if (w != NULL)
            attr->recv = w->counters;
    }
    if (m & KVX_PEER_ATTR_COUNTERS)
        kvx_peer_counters(p, attr);
out:
    kvx_unlock(&t->core);
    return rc;
}

int kvx_transport_listen(kvx_transport_t *t, const char *addr)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int rc;

    if (t == NULL)
        return -EINVAL;
    rc = kvx_addr_parse(addr, true, &ss, &len);
    if (rc < 0)
        return rc;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    rc = kvx_listen(&t->peers, &ss, len);
    kvx_unlock(&t->core);
    return rc;
}

/* A pairing answered, failed or closed (its time is kvx_core_wait's bound). */
static bool kvx_dial_answered(void *pg) { return kvx_dial_over(pg); }

int kvx_peer_connect(kvx_transport_t *t, const char *peer_id, const char *addr,
                     const kvx_peer_params_t *params)
{
    struct sockaddr_storage ss;
    char numeric[KVX_ADDR_MAX];
    kvx_pairing_t *pg;
    uint8_t *md = NULL;
    size_t md_len = 0;
    socklen_t len;
    int rc;

    if (t == NULL || !kvx_peer_id_ok(peer_id))
        return -EINVAL;
    rc = kvx_addr_parse(addr, false, &ss, &len);
    if (rc < 0)
        return rc;
    /* the peer remembers the address resolved: pairing again never waits on a name lookup */
    kvx_addr_format(&ss, numeric, sizeof(numeric));
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    rc = kvx_dial(&t->peers, &ss, len, &pg);
    if (rc < 0) {
        kvx_unlock(&t->core);
        return rc;
    }
    kvx_core_wait(&t->core,
                  &(kvx_wait_t){.done = kvx_dial_answered, .arg = pg, .until_ns = pg->expires_ns});
    rc = kvx_dial_end(pg, peer_id, addr, &md, &md_len);
    kvx_unlock(&t->core);
    if (rc == 0)
        rc = kvx_peer_add_at(t, peer_id, md, md_len, params, numeric);
    free(md);
    return rc;
}

int kvx_peer_event_poll(kvx_transport_t *t, kvx_peer_event_t *out, size_t max)
{
    size_t n = 0;

    if (t == NULL || (out == NULL && max != 0))
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    n = kvx_peer_events_take(&t->peers, out, max < INT32_MAX ? max : INT32_MAX);
    kvx_events_update(&t->engine);
    kvx_unlock(&t->core);
    return (int)n;
}

static void kvx_stats_copy(const kvx_stats_t *from, kvx_stats_t *to)
{
    if (to->field_mask & KVX_STATS_XFERS) {
        memcpy(to->xfers, from->xfers, sizeof(to->xfers));
        memcpy(to->bytes, from->bytes, sizeof(to->bytes));
    }
    if (to->field_mask & KVX_STATS_LATENCY) {
        memcpy(to->latency, from->latency, sizeof(to->latency));
        to->latency_sum_ns = from->latency_sum_ns;
    }
    if (to->field_mask & KVX_STATS_EVENTS) {
        to->reconnections = from->reconnections;
        to->fences = from->fences;
    }
}

int kvx_stats_query(kvx_transport_t *t, const char *peer_id, kvx_stats_t *stats)
{
    int rc = 0;

    if (t == NULL || stats == NULL || (peer_id != NULL && !kvx_peer_id_ok(peer_id)))
        return -EINVAL;
    kvx_lock(&t->core);
    if (t->core.closed) {
        rc = -ESHUTDOWN;
    } else if (peer_id == NULL) {
        kvx_stats_copy(&t->core.stats, stats);
    } else {
        kvx_peer_t *p = kvx_peer_lookup(&t->core, peer_id);
        if (!kvx_peer_known(p))
            rc = -ENOENT;
        else
            kvx_stats_copy(&p->stats, stats);
    }
    kvx_unlock(&t->core);
    return rc;
}

int kvx_peer_list(kvx_transport_t *t, char *buf, size_t *len_p)
{
    size_t need = 0, cap, slot = 0;
    int n = 0, rc;

    if (t == NULL || len_p == NULL || (buf == NULL && *len_p != 0))
        return -EINVAL;
    cap = *len_p;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    for (const kvx_peer_t *p = kvx_peer_next(&t->core, &slot, NULL); p != NULL;
         p = kvx_peer_next(&t->core, &slot, p)) {
        size_t len = strlen(p->id) + 1;
        if (p->removed)
            continue;
        if (need + len <= cap)
            memcpy(buf + need, p->id, len);
        need += len;
        n++;
    }
    kvx_unlock(&t->core);
    rc = need <= cap ? n : -ENOSPC;
    *len_p = need;
    return rc;
}
