/*
 * The listener's side of pairing by address (pair_int.h says what the exchange is): it listens
 * on UCX's connection manager (kvx_transport_listen), takes a connection request, sends its
 * challenge, and answers an MD_REQ whose proof of the secret holds with its metadata.
 */
#include "peer/pair_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int kvx_listen(kvx_peers_t *pp, const struct sockaddr_storage *ss, socklen_t len)
{
    struct sockaddr_storage bound;
    int rc;

    if (pp->listening)
        return -EALREADY;
    rc = kvx_ucx_listen(pp->core->ucx, (const struct sockaddr *)ss, len, &bound);
    if (rc < 0)
        return rc;
    pp->listening = true;
    kvx_addr_format(&bound, pp->listen_addr, sizeof(pp->listen_addr));
    kvx_info(pp->core, "listening at %s", pp->listen_addr);
    return 0;
}

/* In UCX's callback: keep the request for the work after progress, or refuse it at once. */
void kvx_listen_on_request(kvx_peers_t *pp, void *conn_req)
{
    kvx_pairing_t *pg = NULL;

    if (pp->core->closed || !pp->listening || pp->naccepted >= KVX_ACCEPTED_MAX ||
        (pg = kvx_pair_new(pp, &kvx_listen_side)) == NULL ||
        getrandom(pg->nonce, sizeof(pg->nonce), 0) != (ssize_t)sizeof(pg->nonce)) {
        kvx_debug(pp->core, "listener: a connection rejected (%u waiting)", pp->naccepted);
        free(pg);
        kvx_ucx_reject(pp->core->ucx, conn_req);
        return;
    }
    pg->accepted = true;
    pg->conn_req = conn_req;
    pg->expires_ns = kvx_now_ns() + KVX_PAIR_TIMEOUT_NS;
    kvx_list_add_tail(&pp->pairings, &pg->link);
    pp->naccepted++;
    kvx_debug(pp->core, "listener: a connection request (%u under way)", pp->naccepted);
    kvx_pair_want_work(pg);
}

/* The endpoint from the request, and the challenge. */
static void kvx_listen_accept(kvx_pairing_t *pg)
{
    kvx_core_t *core = pg->peers->core;
    uint8_t hdr[KVX_WIRE_CHALLENGE_LEN];
    void *req = pg->conn_req;
    int rc;

    pg->conn_req = NULL;
    /* a failed ucp_ep_create releases the request itself */
    rc = kvx_ucx_pair_open(core->ucx, req, NULL, 0, &kvx_pair_ep_ops, pg, &pg->ucx);
    if (rc < 0) {
        pg->closing = true; /* nothing to close */
        return;
    }
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_CHALLENGE,
                                 .flags = core->secret != NULL ? KVX_MSGF_SECRET : 0,
                                 .u.challenge.nonce = pg->nonce},
                    hdr);
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), NULL, 0, &pg->refs);
    if (rc < 0)
        kvx_pair_close(pg, rc);
}

/* MD_REQ (kept in pg): the metadata, if the proof holds (or no secret is needed). */
static void kvx_listen_answer(kvx_pairing_t *pg)
{
    kvx_peers_t *pp = pg->peers;
    kvx_core_t *core = pp->core;
    uint8_t hdr[KVX_WIRE_MD_LEN], want[KVX_PROOF_LEN], mac[KVX_PROOF_LEN];
    int32_t status = 0;
    int rc;

    if (core->secret != NULL) {
        kvx_pair_mac(core, KVX_PAIR_REQ_LABEL, pg->nonce, pg->cnonce, NULL, 0, want);
        if (!pg->has_proof || !kvx_equal_ct(pg->proof, want, sizeof(want))) {
            kvx_warn(core, "listener: a peer without the shared secret was refused");
            status = -EACCES;
        }
    }
    if (status == 0 && core->secret != NULL)
        kvx_pair_mac(core, KVX_PAIR_MD_LABEL, pg->nonce, pg->cnonce, pp->md, pp->md_len, mac);
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_MD,
                                 .flags = status == 0 && core->secret != NULL ? KVX_MSGF_PROOF : 0,
                                 .u.md = {.status = status,
                                          .len = status == 0 ? (uint32_t)pp->md_len : 0,
                                          .cnonce = pg->cnonce,
                                          .mac = status == 0 && core->secret != NULL ? mac : NULL}},
                    hdr);
    pg->answered = true;
    pg->expires_ns = kvx_now_ns() + KVX_PAIR_TIMEOUT_NS; /* for the other side to close */
    if (kvx_pair_ep(pg) == NULL)
        return;
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), status == 0 ? pp->md : NULL,
                           status == 0 ? pp->md_len : 0, &pg->refs);
    if (rc < 0)
        kvx_pair_close(pg, rc);
    else if (status == 0)
        kvx_debug(core, "listener: metadata sent");
}

/* A message on an accepted pairing's endpoint: its MD_REQ, once; anything else is out of turn
 * (the other side is not kvx, or not well). */
static void kvx_listen_on_message(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                                  size_t data_len)
{
    (void)data;
    (void)data_len;
    if (m->type == KVX_MSG_MD_REQ && !pg->asked && kvx_pair_ep(pg) != NULL) {
        pg->asked = true;
        pg->has_proof = m->u.md_req.proof != NULL;
        if (pg->has_proof)
            memcpy(pg->proof, m->u.md_req.proof, KVX_PROOF_LEN);
        memcpy(pg->cnonce, m->u.md_req.cnonce, KVX_WIRE_NONCE_LEN);
        pg->want_answer = true;
    } else {
        pg->fail_err = -EPROTO;
    }
    kvx_pair_want_work(pg);
}

/* After UCX progress: the endpoint of a request, a failure, the answer. */
static void kvx_listen_work(kvx_pairing_t *pg)
{
    if (pg->conn_req != NULL)
        kvx_listen_accept(pg);
    if (!kvx_pair_close_failed(pg) && pg->want_answer) {
        pg->want_answer = false;
        kvx_listen_answer(pg);
    }
}

const kvx_pair_side_t kvx_listen_side = {.on_message = kvx_listen_on_message,
                                         .work = kvx_listen_work};
