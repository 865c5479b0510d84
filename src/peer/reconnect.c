/*
 * Pairing again: a peer paired by address whose connection failed (peer.c starts it) dials its
 * address again, at once and then after pauses that double from KVX_RECONNECT_MIN_NS up to
 * KVX_RECONNECT_MAX_NS (the retry policy: kvx_reconnect_later), until the listener's metadata
 * gives it a new connection (kvx_peer_reinstall), it is removed or re-added, or the transport
 * closes. The transfers submitted meanwhile wait, parked, within their deadlines.
 */
#include "peer/pair_int.h"

#include <errno.h>

/* The attempt under way is over (its outcome taken or not wanted). */
static void kvx_reconnect_drop_attempt(kvx_peer_t *p)
{
    kvx_pairing_t *pg = p->pg;

    if (pg == NULL)
        return;
    p->pg = NULL;
    pg->peer = NULL;
    pg->abandoned = true;
    kvx_pair_close(pg, 0);
    kvx_pair_maybe_free(pg);
}

void kvx_reconnect_forget(kvx_peers_t *pp, kvx_peer_t *p)
{
    (void)pp;
    if (!p->reconnecting)
        return;
    p->reconnecting = false;
    kvx_list_del(&p->reconnect_link);
    kvx_reconnect_drop_attempt(p);
}

/* An attempt that finished: 0 when the peer is back, else why not. */
static int kvx_reconnect_outcome(kvx_peers_t *pp, kvx_peer_t *p)
{
    kvx_pairing_t *pg = p->pg;
    kvx_md_t md;
    int rc;

    if (pg->err < 0)
        return pg->err;
    if (pg->md == NULL)
        return -ETIMEDOUT;
    rc = kvx_md_decode(pg->md, pg->md_len, &md);
    if (rc == 0)
        rc = kvx_md_verify(pg->md, pg->md_len, &md, pp->core->secret, pp->core->secret_len);
    if (rc == 0)
        rc = kvx_peer_reinstall(pp, p, &md); /* md points into pg->md, alive until below */
    return rc;
}

/* The next try after a pause, and the pause after it twice as long (up to the longest). */
static void kvx_reconnect_later(kvx_peer_t *p, uint64_t now)
{
    p->next_try_ns = now + p->backoff_ns;
    p->backoff_ns =
        p->backoff_ns * 2 < KVX_RECONNECT_MAX_NS ? p->backoff_ns * 2 : KVX_RECONNECT_MAX_NS;
}

/* One peer's step: returns when it must be looked at again (UINT64_MAX: back, not again). */
static uint64_t kvx_reconnect_peer(kvx_peers_t *pp, kvx_peer_t *p, uint64_t now)
{
    kvx_pairing_t *pg = p->pg;
    int rc;

    if (p->turn_now != p->turn_next) /* an add or remove of this id is under way: it decides */
        return now + KVX_RECONNECT_MIN_NS;
    if (pg != NULL && !pg->answered && !pg->closing && now < pg->expires_ns)
        return pg->expires_ns; /* the attempt under way goes on */
    if (pg != NULL) {
        rc = kvx_reconnect_outcome(pp, p);
        kvx_reconnect_drop_attempt(p);
        if (rc == 0) {
            p->reconnecting = false;
            kvx_list_del(&p->reconnect_link);
            return UINT64_MAX;
        }
        kvx_debug(pp->core, "peer %s: pairing again with %s: %s; next try in %llu ms", p->id,
                  p->addr, kvx_strerror(rc), (unsigned long long)(p->backoff_ns / 1000000));
        kvx_reconnect_later(p, now);
    }
    if (now >= p->next_try_ns) {
        struct sockaddr_storage ss;
        socklen_t len;
        rc = kvx_addr_parse(p->addr, false, &ss, &len); /* numeric: no lookup */
        if (rc == 0)
            rc = kvx_dial(pp, &ss, len, &p->pg);
        if (rc == 0) {
            p->pg->peer = p;
            return p->pg->expires_ns;
        }
        kvx_reconnect_later(p, now);
    }
    return p->next_try_ns;
}

void kvx_reconnect_step(kvx_peers_t *pp, uint64_t now)
{
    uint64_t next = UINT64_MAX;

    for (kvx_list_t *n = pp->reconnects.next, *nx; n != &pp->reconnects; n = nx) {
        kvx_peer_t *p = kvx_container_of(n, kvx_peer_t, reconnect_link);
        uint64_t at;
        nx = n->next;
        at = kvx_reconnect_peer(pp, p, now);
        next = at < next ? at : next;
    }
    pp->next_reconnect_ns = next;
}
