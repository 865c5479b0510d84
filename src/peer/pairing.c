/*
 * A pairing's life, below its two sides (listen.c, dial.c): made, its endpoint's reports, closed,
 * freed; the work after UCX progress, the housekeeping, and every pairing at close. UCX calls back
 * (a connection request, a message, an error, a send or close completed) inside its progress; the
 * callbacks only record what happened, and kvx_pairings_work, run by the progress step right
 * after, makes the UCX calls (endpoint, sends, close), as for kvx's connections.
 */
#include "peer/pair_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void kvx_peers_init(kvx_peers_t *pp, kvx_core_t *core, kvx_conns_t *conns)
{
    pp->core = core;
    pp->conns = conns;
    kvx_list_init(&pp->pairings);
    kvx_list_init(&pp->reconnects);
    pp->next_reconnect_ns = UINT64_MAX;
}

void kvx_peers_metadata(kvx_peers_t *pp, const uint8_t *md, size_t md_len)
{
    pp->md = md;
    pp->md_len = md_len;
}

kvx_pairing_t *kvx_pair_new(kvx_peers_t *pp, const kvx_pair_side_t *side)
{
    kvx_pairing_t *pg = calloc(1, sizeof(*pg));

    if (pg == NULL)
        return NULL;
    pg->peers = pp;
    pg->side = side;
    kvx_list_init(&pg->link);
    return pg;
}

void kvx_pair_maybe_free(kvx_pairing_t *pg)
{
    if (!pg->closing || pg->refs > 0 || !(pg->accepted || pg->abandoned))
        return;
    kvx_list_del(&pg->link);
    if (pg->accepted)
        pg->peers->naccepted--;
    kvx_ucx_ep_free(pg->ucx);
    free(pg->md);
    free(pg);
}

void kvx_pair_close(kvx_pairing_t *pg, int err)
{
    if (pg->closing)
        return;
    pg->closing = true;
    if (pg->err == 0)
        pg->err = err;
    /* UCX may complete the pairing's queued sends inside the close: they must not free it */
    pg->refs++;
    kvx_ucx_ep_close(pg->ucx, &pg->refs);
    pg->refs--;
    pg->peers->core->conn_event = true; /* a kvx_peer_connect call waiting on it looks again */
    if (pg->peer != NULL)
        pg->peers->next_reconnect_ns = 0; /* a reconnection: its peer looks at once */
}

bool kvx_pair_close_failed(kvx_pairing_t *pg)
{
    if (!pg->closing && pg->fail_err != 0)
        kvx_pair_close(pg, pg->fail_err < 0 ? pg->fail_err : 0);
    return pg->closing;
}

void kvx_pair_want_work(kvx_pairing_t *pg)
{
    pg->work = true;
    pg->peers->pair_work = true;
}

void kvx_pair_mac(const kvx_core_t *core, const char *label, const uint8_t *snonce,
                  const uint8_t *cnonce, const void *data, size_t len, uint8_t out[32])
{
    kvx_iov_t parts[4] = {{(void *)label, strlen(label)},
                          {(void *)snonce, KVX_WIRE_NONCE_LEN},
                          {(void *)cnonce, KVX_WIRE_NONCE_LEN},
                          {(void *)data, len}};
    kvx_hmac_sha256(core->secret, core->secret_len, parts, len > 0 ? 4 : 3, out);
}

/* ---- what a pairing's endpoint reports (inside UCX progress) --------------------------------- */

static void kvx_pair_ep_sent(void *arg, uint64_t xfer_id, int status)
{
    kvx_pairing_t *pg = arg;

    (void)xfer_id;
    pg->refs--;
    if (status < 0 && status != -ECANCELED && !pg->closing) {
        pg->fail_err = status;
        kvx_pair_want_work(pg);
    }
    kvx_pair_maybe_free(pg);
}

static void kvx_pair_ep_error(void *arg, int status)
{
    kvx_pairing_t *pg = arg;

    if (pg->closing)
        return;
    /* the connecting side closing after the answer is the normal end of an accepted pairing */
    if (!pg->accepted && !pg->answered)
        kvx_debug(pg->peers->core, "pairing: the connection failed: %s", kvx_strerror(status));
    pg->fail_err = pg->answered ? 1 : status; /* 1: closed after the answer, no error */
    pg->peers->core->conn_event = true;
    kvx_pair_want_work(pg);
}

static void kvx_pair_ep_closed(void *arg)
{
    kvx_pairing_t *pg = arg;

    pg->refs--;
    kvx_pair_maybe_free(pg);
}

void kvx_pair_on_message(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                         size_t data_len)
{
    if (pg->closing || pg->fail_err != 0)
        return;
    pg->side->on_message(pg, m, data, data_len);
}

static void kvx_pair_ep_message(void *pg, const kvx_msg_t *m, const uint8_t *data, size_t len)
{
    kvx_pair_on_message(pg, m, data, len);
}

const kvx_ep_ops_t kvx_pair_ep_ops = {
    .on_sent = kvx_pair_ep_sent,
    .on_error = kvx_pair_ep_error,
    .on_closed = kvx_pair_ep_closed,
    .on_message = kvx_pair_ep_message,
};

/* ---- every pairing -------------------------------------------------------------------------- */

unsigned kvx_pairings_work(kvx_peers_t *pp)
{
    unsigned n = 0;

    for (kvx_list_t *l = pp->pairings.next, *next; l != &pp->pairings; l = next) {
        kvx_pairing_t *pg = kvx_container_of(l, kvx_pairing_t, link);
        next = l->next;
        if (!pg->work)
            continue;
        pg->work = false;
        n++;
        pg->side->work(pg);
        kvx_pair_maybe_free(pg);
    }
    return n;
}

void kvx_pairings_housekeeping(kvx_peers_t *pp, uint64_t now)
{
    for (kvx_list_t *n = pp->pairings.next, *next; n != &pp->pairings; n = next) {
        kvx_pairing_t *pg = kvx_container_of(n, kvx_pairing_t, link);
        next = n->next;
        if (!pg->closing && now >= pg->expires_ns) {
            kvx_pair_close(pg, -ETIMEDOUT);
            kvx_pair_maybe_free(pg);
        }
    }
}

void kvx_pairings_close_all(kvx_peers_t *pp)
{
    /* requests not taken yet are refused while the listener is still there */
    for (kvx_list_t *n = pp->pairings.next; n != &pp->pairings; n = n->next) {
        kvx_pairing_t *pg = kvx_container_of(n, kvx_pairing_t, link);
        if (pg->conn_req != NULL) {
            kvx_ucx_reject(pp->core->ucx, pg->conn_req);
            pg->conn_req = NULL;
            pg->closing = true; /* no endpoint */
        }
    }
    kvx_ucx_unlisten(pp->core->ucx);
    pp->listening = false;
    for (kvx_list_t *n = pp->pairings.next, *next; n != &pp->pairings; n = next) {
        kvx_pairing_t *pg = kvx_container_of(n, kvx_pairing_t, link);
        next = n->next;
        pg->abandoned = true;
        kvx_pair_close(pg, -ESHUTDOWN);
        kvx_pair_maybe_free(pg);
    }
}

bool kvx_pairings_closing(const kvx_peers_t *pp) { return !kvx_list_empty(&pp->pairings); }

void kvx_pairings_free_all(kvx_peers_t *pp)
{
    while (!kvx_list_empty(&pp->pairings)) {
        kvx_pairing_t *pg = kvx_list_first(&pp->pairings, kvx_pairing_t, link);
        pg->closing = true;
        pg->abandoned = true;
        pg->refs = 0; /* the worker is gone: no callback comes any more */
        kvx_pair_maybe_free(pg);
    }
}
