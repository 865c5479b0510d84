/*
 * The connecting side of pairing by address (pair_int.h says what the exchange is): a pairing
 * to a listener's address (kvx_peer_connect's, or a reconnection's), its MD_REQ answering the
 * challenge with a proof of the secret, and the listener's metadata taken only from an MD that
 * answers this very exchange.
 */
#include "peer/pair_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int kvx_dial(kvx_peers_t *pp, const struct sockaddr_storage *ss, socklen_t len,
             kvx_pairing_t **pg_p)
{
    kvx_pairing_t *pg = kvx_pair_new(pp, &kvx_dial_side);
    int rc;

    if (pg == NULL)
        return -ENOMEM;
    /* our nonce, which the answer must carry: random from the start */
    if (getrandom(pg->cnonce, sizeof(pg->cnonce), 0) != (ssize_t)sizeof(pg->cnonce)) {
        free(pg);
        return -EIO;
    }
    rc = kvx_ucx_pair_open(pp->core->ucx, NULL, (const struct sockaddr *)ss, len, &kvx_pair_ep_ops,
                           pg, &pg->ucx);
    if (rc < 0) {
        free(pg);
        return rc;
    }
    kvx_list_add_tail(&pp->pairings, &pg->link);
    pg->expires_ns = kvx_now_ns() + KVX_CONNECT_TIMEOUT_NS;
    *pg_p = pg;
    return 0;
}

bool kvx_dial_over(const kvx_pairing_t *pg)
{
    return pg->answered || pg->closing || kvx_now_ns() >= pg->expires_ns;
}

/* The answer taken (the metadata moves to the caller): what the debug log says of it. */
static void kvx_dial_answered(kvx_pairing_t *pg, const char *peer_id, const char *addr)
{
    if (kvx_pair_ep(pg) != NULL) {
        kvx_lanes_t lanes;
        kvx_ucx_ep_describe(pg->ucx, &lanes);
        kvx_debug(pg->peers->core, "peer %s: the pairing connection to %s ran over '%s'", peer_id,
                  addr, lanes.am);
    } else {
        kvx_debug(pg->peers->core,
                  "peer %s: the pairing connection to %s closed right after its answer", peer_id,
                  addr);
    }
}

int kvx_dial_end(kvx_pairing_t *pg, const char *peer_id, const char *addr, uint8_t **md_p,
                 size_t *md_len_p)
{
    kvx_core_t *core = pg->peers->core;
    int rc = 0;

    if (core->closed) {
        rc = -ESHUTDOWN;
    } else if (pg->err < 0) {
        rc = pg->err;
    } else if (pg->answered) {
        /* a whole answer, checked: the metadata is the listener's, whatever became of the
         * connection after it (a failure reported in the same progress step has closed the
         * endpoint already; the add finds out whether that process is still there) */
        *md_p = pg->md;
        *md_len_p = pg->md_len;
        pg->md = NULL;
        kvx_dial_answered(pg, peer_id, addr);
    } else {
        rc = -ETIMEDOUT;
    }
    if (rc < 0)
        kvx_error(core, "peer %s: pairing with %s: %s", peer_id, addr, kvx_strerror(rc));
    pg->abandoned = true;
    if (!core->closed) /* at close, kvx_pairings_close_all has it */
        kvx_pair_close(pg, 0);
    kvx_pair_maybe_free(pg);
    return rc;
}

/* The listener's challenge came: ask for its metadata, with a proof of the secret over both
 * nonces. */
static void kvx_dial_request(kvx_pairing_t *pg)
{
    kvx_core_t *core = pg->peers->core;
    uint8_t hdr[KVX_WIRE_MD_REQ_LEN], proof[KVX_PROOF_LEN];
    int rc;

    if (pg->secret_needed && core->secret == NULL) {
        /* it would refuse us: say so without asking */
        pg->answered = true;
        pg->err = -EACCES;
        kvx_pair_close(pg, -EACCES);
        return;
    }
    if (kvx_pair_ep(pg) == NULL)
        return;
    kvx_debug(core, "pairing: the listener's challenge came; asking for its metadata");
    if (core->secret != NULL)
        kvx_pair_mac(core, KVX_PAIR_REQ_LABEL, pg->nonce, pg->cnonce, NULL, 0, proof);
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_MD_REQ,
                                 .flags = core->secret != NULL ? KVX_MSGF_PROOF : 0,
                                 .u.md_req = {.proof = core->secret != NULL ? proof : NULL,
                                              .cnonce = pg->cnonce}},
                    hdr);
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), NULL, 0, &pg->refs);
    if (rc < 0)
        kvx_pair_close(pg, rc);
}

/* MD, in UCX's callback: its metadata must answer this exchange (our nonce, and with a secret,
 * the listener's MAC over both nonces and the metadata). */
static void kvx_dial_on_md(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                           size_t data_len)
{
    kvx_core_t *core = pg->peers->core;
    uint8_t want[KVX_PROOF_LEN];

    pg->answered = true;
    if (!kvx_equal_ct(m->u.md.cnonce, pg->cnonce, KVX_WIRE_NONCE_LEN)) {
        pg->err = -EPROTO; /* not an answer to this exchange */
    } else if (m->u.md.status < 0) {
        pg->err = m->u.md.status == -EACCES ? -EACCES : -EPROTO;
    } else if (core->secret != NULL &&
               (m->u.md.mac == NULL ||
                (kvx_pair_mac(core, KVX_PAIR_MD_LABEL, pg->nonce, pg->cnonce, data, data_len, want),
                 !kvx_equal_ct(m->u.md.mac, want, sizeof(want))))) {
        pg->err = -EACCES;
    } else if ((pg->md = malloc(data_len)) == NULL) {
        pg->err = -ENOMEM;
    } else {
        memcpy(pg->md, data, data_len);
        pg->md_len = data_len;
    }
    if (pg->err < 0)
        kvx_pair_want_work(pg); /* close it */
    core->conn_event = true;
    if (pg->peer != NULL)
        pg->peers->next_reconnect_ns = 0;
}

/* A message on a connecting pairing's endpoint: the CHALLENGE, then the MD, once each; anything
 * else is out of turn (the other side is not kvx, or not well). */
static void kvx_dial_on_message(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                                size_t data_len)
{
    if (m->type == KVX_MSG_CHALLENGE && !pg->asked) {
        pg->asked = true;
        memcpy(pg->nonce, m->u.challenge.nonce, KVX_WIRE_NONCE_LEN);
        pg->secret_needed = (m->flags & KVX_MSGF_SECRET) != 0;
        pg->want_request = true;
        kvx_pair_want_work(pg);
    } else if (m->type == KVX_MSG_MD && pg->asked && !pg->answered) {
        kvx_dial_on_md(pg, m, data, data_len);
    } else {
        pg->fail_err = -EPROTO;
        kvx_pair_want_work(pg);
    }
}

/* After UCX progress: a failure, a refused answer, the request. */
static void kvx_dial_work(kvx_pairing_t *pg)
{
    if (!kvx_pair_close_failed(pg) && pg->err < 0)
        kvx_pair_close(pg, pg->err);
    if (!pg->closing && pg->want_request) {
        pg->want_request = false;
        kvx_dial_request(pg);
    }
}

const kvx_pair_side_t kvx_dial_side = {.on_message = kvx_dial_on_message, .work = kvx_dial_work};
