/*
 * Peers: what a peer's connection tells it (kvx_peer_conn_ops: a failure fails its transfers, or
 * parks them while a peer paired by address pairs again), the compatibility rules of metadata, a
 * new connection for a peer that paired again, and the peer events. The calls that add and
 * remove peers, which wait, are the api's (api/peer_api.c); the peer table is core/peers.c's.
 */
#include "peer/kvx_peer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

/* ---- what a peer's connection tells it ------------------------------------------------------ */

static void kvx_reconnect_due(kvx_peers_t *pp, uint64_t at)
{
    if (at < pp->next_reconnect_ns) {
        pp->next_reconnect_ns = at;
        kvx_core_kick(pp->core, at);
    }
}

/* A peer paired by address lost its connection: it pairs again (reconnect.c takes it from the
 * reconnects when due). */
static void kvx_peer_lost(kvx_peers_t *pp, kvx_peer_t *p, int err)
{
    if (p->reconnecting)
        return;
    p->reconnecting = true;
    p->backoff_ns = KVX_RECONNECT_MIN_NS;
    p->next_try_ns = kvx_now_ns();
    kvx_list_add_tail(&pp->reconnects, &p->reconnect_link);
    kvx_info(pp->core, "peer %s: connection failed (%s); pairing again with %s", p->id,
             kvx_strerror(err), p->addr);
    kvx_peer_event(pp, p, KVX_PEER_EVENT_DOWN, err);
    kvx_reconnect_due(pp, p->next_try_ns);
}

static void kvx_peer_conn_sent(kvx_conn_t *c, uint64_t xfer_id) { kvx_xfer_on_sent(c, xfer_id); }

static void kvx_peer_conn_work(kvx_conn_t *c) { kvx_xfer_post(c, KVX_STEP_BUDGET); }

static void kvx_peer_conn_received(kvx_conn_t *c, kvx_read_rndv_t *rr, int status)
{
    kvx_xfer_on_received(c, rr, status);
}

/* A peer paired by address pairs again (reconnect.c); its transfers in flight fail all the same,
 * but those of a connection that never finished its handshake sent nothing: they wait for the
 * next one. */
static void kvx_peer_conn_failed(kvx_conn_t *c, int err)
{
    if (c->peer != NULL && c->peer->conn == c && c->peer->addr != NULL && !c->core->closed) {
        kvx_peer_lost(c->owner, c->peer, err);
        kvx_xfer_repark(c, c->peer);
    }
    kvx_xfer_fail_conn(c, err);
}

const kvx_conn_ops_t kvx_peer_conn_ops = {
    .on_sent = kvx_peer_conn_sent,
    .on_work = kvx_peer_conn_work,
    .on_failed = kvx_peer_conn_failed,
    .on_received = kvx_peer_conn_received,
};

/* ---- compatibility rules -------------------------------------------------------------------- */

/* The compatibility rules of kvx_peer_add. Returns 0, or the error with *why saying which rule. */
int kvx_peer_check(const kvx_core_t *core, const kvx_md_t *md, const kvx_peer_params_t *expect,
                   const char **why)
{
    if (strcmp(md->agent_name, core->log.name) == 0) {
        *why = "the metadata is this transport's own (same agent name)";
        return -EEXIST;
    }
    if (expect != NULL && (expect->field_mask & KVX_PEER_PARAM_EXPECT_REGION) &&
        (expect->base_addr != md->base || expect->num_blocks != md->num_blocks ||
         expect->block_len != md->block_len)) {
        *why = "base address, block count or block length disagree with the metadata";
        return -EINVAL;
    }
    if (md->block_len != core->block_len) {
        *why = "block length differs from ours";
        return -KVX_EINCOMPAT;
    }
    if (md->fingerprint[0] != '\0' && core->fingerprint[0] != '\0' &&
        strcmp(md->fingerprint, core->fingerprint) != 0) {
        *why = "config fingerprint differs from ours";
        return -KVX_EINCOMPAT;
    }
    return 0;
}

/* ---- pairing again: a new connection, events ----------------------------------------------- */

/* A peer paired by address whose connection failed gets a new one from md, without waiting (its
 * handshake completes in the background); the transfers parked meanwhile move to it. */
int kvx_peer_reinstall(kvx_peers_t *pp, kvx_peer_t *p, const kvx_md_t *md)
{
    const char *why;
    kvx_conn_t *c, *old = p->conn;
    bool restarted;
    int rc;

    /* the checks of the add or connect that made the peer, expectations included; not the
     * generation: the address's answer is authoritative (a restarted process whose clock is
     * behind has an older one) */
    rc = kvx_peer_check(pp->core, md, &p->expect, &why);
    if (rc < 0) {
        kvx_error(pp->core, "peer %s (%s) at %s refused: %s", p->id, md->agent_name, p->addr, why);
        return rc;
    }
    /* not prefaulted (the first copies fault the pages in); not the peer's until installed
     * below, so a failure here starts no reconnection of its own */
    rc = kvx_conn_open(pp->conns, p->id, md, &kvx_peer_conn_ops, pp, &c);
    if (rc < 0)
        return rc;
    /* installed at once: transfers wait behind the handshake, as after a slow kvx_peer_add */
    restarted = c->generation != p->last_generation;
    kvx_conn_attach(c, p);
    kvx_info(pp->core, "peer %s: paired again with %s at %s over %s (generation %s)", p->id,
             c->agent_name, p->addr, c->transport,
             restarted ? "another: it restarted" : "the same");
    kvx_peer_event(pp, p, restarted ? KVX_PEER_EVENT_RESTARTED : KVX_PEER_EVENT_RECONNECTED, 0);
    p->stats.reconnections++;
    pp->core->stats.reconnections++;
    kvx_xfer_unpark(p, c, 0);
    if (old != NULL)
        kvx_conn_release(old, -ECONNABORTED); /* failed already: it only goes */
    return 0;
}

void kvx_peer_event(kvx_peers_t *pp, const kvx_peer_t *p, int type, int err)
{
    kvx_peer_event_t *e;

    if (pp->ev_count == KVX_PEER_EVENTS_MAX) { /* the oldest goes */
        pp->ev_head = (pp->ev_head + 1) % KVX_PEER_EVENTS_MAX;
        pp->ev_count--;
    }
    e = &pp->events[(pp->ev_head + pp->ev_count) % KVX_PEER_EVENTS_MAX];
    memset(e, 0, sizeof(*e));
    snprintf(e->peer_id, sizeof(e->peer_id), "%s", p->id);
    e->type = type;
    e->error = err;
    e->generation = p->last_generation;
    pp->ev_count++;
}

size_t kvx_peer_events_take(kvx_peers_t *pp, kvx_peer_event_t *out, size_t max)
{
    size_t n = 0;

    while (n < max && pp->ev_count > 0) {
        out[n++] = pp->events[pp->ev_head];
        pp->ev_head = (pp->ev_head + 1) % KVX_PEER_EVENTS_MAX;
        pp->ev_count--;
    }
    return n;
}
