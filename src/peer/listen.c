/*
 * Pairing by address, without a control plane: a transport listens on UCX's connection manager
 * (kvx_transport_listen), another connects to it (kvx_peer_connect), receives its metadata over
 * that connection and adds it exactly as kvx_peer_add does. The exchange, on an endpoint of the
 * connection manager (messages in wire.c), with s and c fresh random nonces of each side:
 *
 *   listener   -> CHALLENGE  s; flag KVX_MSGF_SECRET if a proof is required
 *   connecting -> MD_REQ     c, and with a secret HMAC-SHA256(secret, "kvx-pair-req-v1" || s || c)
 *   listener   -> MD         c again, its metadata (signed with the secret, if any) or -EACCES,
 *                            and with a secret HMAC-SHA256(secret, "kvx-pair-md-v1" || s || c ||
 *                            metadata): an answer to this exchange, not a recorded one
 *
 * and the connecting side closes the endpoint. The listener sends nothing but the nonce before
 * the proof checks out. Data never travels here: kvx_peer_add opens the usual connection from
 * the metadata's worker address (shared memory between processes on one host, tcp across).
 */
#include "peer/kvx_peer.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* An exchange the listener took that is not finished in this time is closed (at the next
 * housekeeping, 0.1-1 s later): what one client can hold of the listener. */
#define KVX_PAIR_TIMEOUT_NS (2ull * 1000000000ull)
/* How long the connecting side waits for the answer. Longer than the listener's bound: its wait
 * also covers UCX's connection-manager wire-up (a dozen hand-offs between the two processes'
 * threads, 0.15-0.4 s each way on a loaded 2-core machine for 1.19) and, behind a flood, the
 * time the listener's UCX takes to accept and drop the connections that came first (764 of
 * test_pair's: 0.03-0.4 s); together they reached 2.1 s there, which timed out the 2 s wait. */
#define KVX_CONNECT_TIMEOUT_NS (5ull * 1000000000ull)
/* Connections the listener keeps at once; more are rejected until some finish or expire. */
#define KVX_ACCEPTED_MAX 256

/* What the MACs of an exchange cover, after the label: the listener's nonce, the connecting
 * side's, and for MD the metadata. */
static const char kvx_pair_req_label[] = "kvx-pair-req-v1";
static const char kvx_pair_md_label[] = "kvx-pair-md-v1";

int kvx_addr_split(const char *addr, bool any_port, char buf[KVX_ADDR_MAX], char **host_p,
                   char **port_p)
{
    char *host, *port;
    size_t n;
    long pn;

    if (addr == NULL || (n = strnlen(addr, KVX_ADDR_MAX)) == 0 || n >= KVX_ADDR_MAX)
        return -EINVAL;
    memcpy(buf, addr, n + 1);
    if (buf[0] == '[') {
        char *end = strchr(buf, ']');
        if (end == NULL || end[1] != ':')
            return -EINVAL;
        *end = '\0';
        host = buf + 1;
        port = end + 2;
    } else {
        port = strrchr(buf, ':');
        if (port == NULL)
            return -EINVAL;
        *port++ = '\0';
        host = buf;
        if (strchr(host, ':') != NULL) /* an IPv6 address goes in brackets */
            return -EINVAL;
    }
    if (*host == '\0' || *port == '\0' || strlen(port) > 5 ||
        strspn(port, "0123456789") != strlen(port))
        return -EINVAL;
    pn = strtol(port, NULL, 10);
    if (pn > 65535 || (pn == 0 && !any_port))
        return -EINVAL;
    *host_p = host;
    *port_p = port;
    return 0;
}

int kvx_addr_parse(const char *addr, bool any_port, struct sockaddr_storage *ss, socklen_t *len)
{
    char buf[KVX_ADDR_MAX], *host, *port;
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = kvx_addr_split(addr, any_port, buf, &host, &port);

    if (rc < 0)
        return rc;
    if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL)
        return -EINVAL;
    if (res->ai_addrlen > sizeof(*ss)) {
        freeaddrinfo(res);
        return -EINVAL;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

void kvx_addr_format(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char host[64], port[8];
    socklen_t len =
        ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);

    if (getnameinfo((const struct sockaddr *)ss, len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, cap, "?");
        return;
    }
    snprintf(out, cap, ss->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

/* ---- a pairing's life ------------------------------------------------------------------------
 *
 * UCX calls back (a connection request, a message, an error, a send or close completed) inside its
 * progress; the callbacks only record what happened, and kvx_listen_work, run by the progress
 * step right after, makes the UCX calls (endpoint, sends, close), as for kvx's connections.
 */

static void kvx_pair_maybe_free(kvx_pairing_t *pg)
{
    if (!pg->closing || pg->refs > 0 || !(pg->accepted || pg->abandoned))
        return;
    kvx_list_del(&pg->link);
    if (pg->accepted)
        pg->t->naccepted--;
    kvx_ucx_ep_free(pg->ucx);
    free(pg->md);
    free(pg);
}

/* Close the pairing's endpoint (forcibly: nothing is owed to the other side). Not from a UCX
 * callback. pg stays allocated; the caller frees it with kvx_pair_maybe_free. */
static void kvx_pair_close(kvx_pairing_t *pg, int err)
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
    pg->t->core.conn_event = true; /* a kvx_peer_connect call waiting on it looks again */
    if (pg->peer != NULL)
        pg->t->next_reconnect_ns = 0; /* a reconnection: its peer looks at once */
}

/* The pairing's endpoint, when it can still be used: NULL once kvx_pair_close closed it (which
 * an error reported in the same progress step as an answer does before the answer is taken). */
static kvx_ucx_ep_t *kvx_pair_ep(const kvx_pairing_t *pg) { return pg->closing ? NULL : pg->ucx; }

/* Something for kvx_listen_work to do about pg. */
static void kvx_pair_want_work(kvx_pairing_t *pg)
{
    pg->work = true;
    pg->t->pair_work = true;
}

void kvx_listen_on_sent(kvx_pairing_t *pg, int status)
{
    pg->refs--;
    if (status < 0 && status != -ECANCELED && !pg->closing) {
        pg->fail_err = status;
        kvx_pair_want_work(pg);
    }
    kvx_pair_maybe_free(pg);
}

void kvx_listen_on_error(kvx_pairing_t *pg, int status)
{
    if (pg->closing)
        return;
    /* the connecting side closing after the answer is the normal end of an accepted pairing */
    if (!pg->accepted && !pg->answered)
        kvx_debug(&pg->t->core, "pairing: the connection failed: %s", kvx_strerror(status));
    pg->fail_err = pg->answered ? 1 : status; /* 1: closed after the answer, no error */
    pg->t->core.conn_event = true;
    kvx_pair_want_work(pg);
}

void kvx_listen_on_closed(kvx_pairing_t *pg)
{
    pg->refs--;
    kvx_pair_maybe_free(pg);
}

/* ---- the listener's side --------------------------------------------------------------------- */

static void kvx_pair_ep_sent(void *pg, uint64_t xfer_id, int status)
{
    (void)xfer_id;
    kvx_listen_on_sent(pg, status);
}
static void kvx_pair_ep_error(void *pg, int status) { kvx_listen_on_error(pg, status); }
static void kvx_pair_ep_closed(void *pg) { kvx_listen_on_closed(pg); }
static void kvx_pair_ep_message(void *pg, const kvx_msg_t *m, const uint8_t *data, size_t len)
{
    kvx_listen_on_message(pg, m, data, len);
}

/* What a pairing's endpoint reports (kvx_ucx_pair_open). */
static const kvx_ep_ops_t kvx_pair_ep_ops = {
    .on_sent = kvx_pair_ep_sent,
    .on_error = kvx_pair_ep_error,
    .on_closed = kvx_pair_ep_closed,
    .on_message = kvx_pair_ep_message,
};

/* In UCX's callback: keep the request for kvx_listen_work, or refuse it at once. */
void kvx_listen_on_request(kvx_transport_t *t, void *conn_req)
{
    kvx_pairing_t *pg = NULL;

    if (t->core.closed || !t->listening || t->naccepted >= KVX_ACCEPTED_MAX ||
        (pg = calloc(1, sizeof(*pg))) == NULL ||
        getrandom(pg->nonce, sizeof(pg->nonce), 0) != (ssize_t)sizeof(pg->nonce)) {
        kvx_debug(&t->core, "listener: a connection rejected (%u waiting)", t->naccepted);
        free(pg);
        kvx_ucx_reject(t->core.ucx, conn_req);
        return;
    }
    pg->t = t;
    pg->accepted = true;
    pg->conn_req = conn_req;
    pg->expires_ns = kvx_now_ns() + KVX_PAIR_TIMEOUT_NS;
    kvx_list_add_tail(&t->pairings, &pg->link);
    t->naccepted++;
    kvx_debug(&t->core, "listener: a connection request (%u under way)", t->naccepted);
    kvx_pair_want_work(pg);
}

/* The endpoint from the request, and the challenge. */
static void kvx_listen_accept(kvx_pairing_t *pg)
{
    kvx_transport_t *t = pg->t;
    uint8_t hdr[KVX_WIRE_CHALLENGE_LEN];
    void *req = pg->conn_req;
    int rc;

    pg->conn_req = NULL;
    /* a failed ucp_ep_create releases the request itself */
    rc = kvx_ucx_pair_open(t->core.ucx, req, NULL, 0, &kvx_pair_ep_ops, pg, &pg->ucx);
    if (rc < 0) {
        pg->closing = true; /* nothing to close */
        return;
    }
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_CHALLENGE,
                                 .flags = t->core.secret != NULL ? KVX_MSGF_SECRET : 0,
                                 .u.challenge.nonce = pg->nonce},
                    hdr);
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), NULL, 0, &pg->refs);
    if (rc < 0)
        kvx_pair_close(pg, rc);
}

/* The MAC that binds an exchange's two nonces to what it carries (a request: nothing). */
static void kvx_pair_mac(const kvx_transport_t *t, const char *label, const uint8_t *snonce,
                         const uint8_t *cnonce, const void *data, size_t len, uint8_t out[32])
{
    kvx_iov_t parts[4] = {{(void *)label, strlen(label)},
                          {(void *)snonce, KVX_WIRE_NONCE_LEN},
                          {(void *)cnonce, KVX_WIRE_NONCE_LEN},
                          {(void *)data, len}};
    kvx_hmac_sha256(t->core.secret, t->core.secret_len, parts, len > 0 ? 4 : 3, out);
}

/* MD_REQ (kept in pg): the metadata, if the proof holds (or no secret is needed). */
static void kvx_listen_answer(kvx_pairing_t *pg)
{
    kvx_transport_t *t = pg->t;
    uint8_t hdr[KVX_WIRE_MD_LEN], want[KVX_PROOF_LEN], mac[KVX_PROOF_LEN];
    int32_t status = 0;
    int rc;

    if (t->core.secret != NULL) {
        kvx_pair_mac(t, kvx_pair_req_label, pg->nonce, pg->cnonce, NULL, 0, want);
        if (!pg->has_proof || !kvx_equal_ct(pg->proof, want, sizeof(want))) {
            kvx_warn(&t->core, "listener: a peer without the shared secret was refused");
            status = -EACCES;
        }
    }
    if (status == 0 && t->core.secret != NULL)
        kvx_pair_mac(t, kvx_pair_md_label, pg->nonce, pg->cnonce, t->metadata, t->metadata_len,
                     mac);
    kvx_wire_encode(
        &(kvx_msg_t){.type = KVX_MSG_MD,
                     .flags = status == 0 && t->core.secret != NULL ? KVX_MSGF_PROOF : 0,
                     .u.md = {.status = status,
                              .len = status == 0 ? (uint32_t)t->metadata_len : 0,
                              .cnonce = pg->cnonce,
                              .mac = status == 0 && t->core.secret != NULL ? mac : NULL}},
        hdr);
    pg->answered = true;
    pg->expires_ns = kvx_now_ns() + KVX_PAIR_TIMEOUT_NS; /* for the other side to close */
    if (kvx_pair_ep(pg) == NULL)
        return;
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), status == 0 ? t->metadata : NULL,
                           status == 0 ? t->metadata_len : 0, &pg->refs);
    if (rc < 0)
        kvx_pair_close(pg, rc);
    else if (status == 0)
        kvx_debug(&t->core, "listener: metadata sent");
}

/* ---- the connecting side --------------------------------------------------------------------- */

static void kvx_connect_request(kvx_pairing_t *pg)
{
    kvx_transport_t *t = pg->t;
    uint8_t hdr[KVX_WIRE_MD_REQ_LEN], proof[KVX_PROOF_LEN];
    int rc;

    if (pg->secret_needed && t->core.secret == NULL) {
        /* it would refuse us: say so without asking */
        pg->answered = true;
        pg->err = -EACCES;
        kvx_pair_close(pg, -EACCES);
        return;
    }
    if (kvx_pair_ep(pg) == NULL)
        return;
    kvx_debug(&t->core, "pairing: the listener's challenge came; asking for its metadata");
    if (t->core.secret != NULL)
        kvx_pair_mac(t, kvx_pair_req_label, pg->nonce, pg->cnonce, NULL, 0, proof);
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_MD_REQ,
                                 .flags = t->core.secret != NULL ? KVX_MSGF_PROOF : 0,
                                 .u.md_req = {.proof = t->core.secret != NULL ? proof : NULL,
                                              .cnonce = pg->cnonce}},
                    hdr);
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), NULL, 0, &pg->refs);
    if (rc < 0)
        kvx_pair_close(pg, rc);
}

/* MD, in UCX's callback: its metadata must answer this exchange (our nonce, and with a secret,
 * the listener's MAC over both nonces and the metadata). */
static void kvx_connect_on_md(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                              size_t data_len)
{
    kvx_transport_t *t = pg->t;
    uint8_t want[KVX_PROOF_LEN];

    pg->answered = true;
    if (!kvx_equal_ct(m->u.md.cnonce, pg->cnonce, KVX_WIRE_NONCE_LEN)) {
        pg->err = -EPROTO; /* not an answer to this exchange */
    } else if (m->u.md.status < 0) {
        pg->err = m->u.md.status == -EACCES ? -EACCES : -EPROTO;
    } else if (t->core.secret != NULL &&
               (m->u.md.mac == NULL ||
                (kvx_pair_mac(t, kvx_pair_md_label, pg->nonce, pg->cnonce, data, data_len, want),
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
    t->core.conn_event = true;
    if (pg->peer != NULL)
        t->next_reconnect_ns = 0;
}

void kvx_listen_on_message(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                           size_t data_len)
{
    if (pg->closing || pg->fail_err != 0)
        return;
    if (pg->accepted && m->type == KVX_MSG_MD_REQ && !pg->asked && kvx_pair_ep(pg) != NULL) {
        pg->asked = true;
        pg->has_proof = m->u.md_req.proof != NULL;
        if (pg->has_proof)
            memcpy(pg->proof, m->u.md_req.proof, KVX_PROOF_LEN);
        memcpy(pg->cnonce, m->u.md_req.cnonce, KVX_WIRE_NONCE_LEN);
        pg->want_answer = true;
        kvx_pair_want_work(pg);
    } else if (!pg->accepted && m->type == KVX_MSG_CHALLENGE && !pg->asked) {
        pg->asked = true;
        memcpy(pg->nonce, m->u.challenge.nonce, KVX_WIRE_NONCE_LEN);
        pg->secret_needed = (m->flags & KVX_MSGF_SECRET) != 0;
        pg->want_request = true;
        kvx_pair_want_work(pg);
    } else if (!pg->accepted && m->type == KVX_MSG_MD && pg->asked && !pg->answered) {
        kvx_connect_on_md(pg, m, data, data_len);
    } else { /* out of turn: the other side is not kvx, or not well */
        pg->fail_err = -EPROTO;
        kvx_pair_want_work(pg);
    }
}

/* After UCX progress: what the callbacks recorded. Returns the pairings served. */
unsigned kvx_listen_work(kvx_transport_t *t)
{
    unsigned n = 0;

    for (kvx_list_t *l = t->pairings.next, *next; l != &t->pairings; l = next) {
        kvx_pairing_t *pg = kvx_container_of(l, kvx_pairing_t, link);
        next = l->next;
        if (!pg->work)
            continue;
        pg->work = false;
        n++;
        if (pg->conn_req != NULL)
            kvx_listen_accept(pg);
        if (!pg->closing && pg->fail_err != 0)
            kvx_pair_close(pg, pg->fail_err < 0 ? pg->fail_err : 0);
        else if (!pg->closing && !pg->accepted && pg->err < 0)
            kvx_pair_close(pg, pg->err);
        if (!pg->closing && pg->want_answer) {
            pg->want_answer = false;
            kvx_listen_answer(pg);
        }
        if (!pg->closing && pg->want_request) {
            pg->want_request = false;
            kvx_connect_request(pg);
        }
        kvx_pair_maybe_free(pg);
    }
    return n;
}

/* Open a pairing to a listener's address. Lock held. */
int kvx_listen_dial(kvx_transport_t *t, const struct sockaddr_storage *ss, socklen_t len,
                    kvx_pairing_t **pg_p)
{
    kvx_pairing_t *pg = calloc(1, sizeof(*pg));
    int rc;

    if (pg == NULL)
        return -ENOMEM;
    pg->t = t;
    kvx_list_init(&pg->link);
    /* our nonce, which the answer must carry: random from the start */
    if (getrandom(pg->cnonce, sizeof(pg->cnonce), 0) != (ssize_t)sizeof(pg->cnonce)) {
        free(pg);
        return -EIO;
    }
    rc = kvx_ucx_pair_open(t->core.ucx, NULL, (const struct sockaddr *)ss, len, &kvx_pair_ep_ops,
                           pg, &pg->ucx);
    if (rc < 0) {
        free(pg);
        return rc;
    }
    kvx_list_add_tail(&t->pairings, &pg->link);
    pg->expires_ns = kvx_now_ns() + KVX_CONNECT_TIMEOUT_NS;
    *pg_p = pg;
    return 0;
}

/* A kvx_peer_connect's pairing has an outcome (answered, failed or past its time). */
bool kvx_listen_dial_over(const kvx_pairing_t *pg)
{
    return pg->answered || pg->closing || kvx_now_ns() >= pg->expires_ns;
}

/* A kvx_peer_connect's pairing is over: its outcome (0 with the listener's metadata in *md_p,
 * the caller's to free, or a negative errno, logged), and the pairing goes. */
int kvx_listen_dial_end(kvx_pairing_t *pg, const char *peer_id, const char *addr, uint8_t **md_p,
                        size_t *md_len_p)
{
    kvx_transport_t *t = pg->t;
    int rc = 0;

    if (t->core.closed) {
        rc = -ESHUTDOWN;
    } else if (pg->err < 0) {
        rc = pg->err;
    } else if (pg->answered) {
        /* a whole answer, checked: the metadata is the listener's, whatever became of the
         * connection after it (a failure reported in the same progress step has closed the
         * endpoint already; kvx_peer_add_at finds out whether that process is still there) */
        *md_p = pg->md;
        *md_len_p = pg->md_len;
        pg->md = NULL;
        if (kvx_pair_ep(pg) != NULL) {
            kvx_lanes_t lanes;
            kvx_ucx_ep_describe(pg->ucx, &lanes);
            kvx_debug(&t->core, "peer %s: the pairing connection to %s ran over '%s'", peer_id,
                      addr, lanes.am);
        } else {
            kvx_debug(&t->core,
                      "peer %s: the pairing connection to %s closed right after its answer",
                      peer_id, addr);
        }
    } else {
        rc = -ETIMEDOUT;
    }
    if (rc < 0)
        kvx_error(&t->core, "peer %s: pairing with %s: %s", peer_id, addr, kvx_strerror(rc));
    pg->abandoned = true;
    if (!t->core.closed) /* at close, kvx_listen_close_all has it */
        kvx_pair_close(pg, 0);
    kvx_pair_maybe_free(pg);
    return rc;
}

/* ---- pairing again: peers paired by address whose connection failed ------------------------- */

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

void kvx_listen_peer_forget(kvx_transport_t *t, kvx_peer_t *p)
{
    (void)t;
    if (!p->reconnecting)
        return;
    p->reconnecting = false;
    kvx_list_del(&p->reconnect_link);
    kvx_reconnect_drop_attempt(p);
}

/* An attempt that finished: 0 when the peer is back, else why not. */
static int kvx_reconnect_outcome(kvx_transport_t *t, kvx_peer_t *p)
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
        rc = kvx_md_verify(pg->md, pg->md_len, &md, t->core.secret, t->core.secret_len);
    if (rc == 0)
        rc = kvx_peer_reinstall(t, p, &md); /* md points into pg->md, alive until below */
    return rc;
}

void kvx_listen_reconnect(kvx_transport_t *t, uint64_t now)
{
    uint64_t next = UINT64_MAX;

    for (kvx_list_t *n = t->reconnects.next, *nx; n != &t->reconnects; n = nx) {
        kvx_peer_t *p = kvx_container_of(n, kvx_peer_t, reconnect_link);
        kvx_pairing_t *pg = p->pg;
        nx = n->next;
        if (p->turn_now != p->turn_next) {
            /* an add or remove of this id is under way (the lock released): it decides */
            next = now + KVX_RECONNECT_MIN_NS < next ? now + KVX_RECONNECT_MIN_NS : next;
            continue;
        }
        if (pg != NULL && !pg->answered && !pg->closing && now < pg->expires_ns) {
            next = pg->expires_ns < next ? pg->expires_ns : next;
            continue;
        }
        if (pg != NULL) {
            int rc = kvx_reconnect_outcome(t, p);
            kvx_reconnect_drop_attempt(p);
            if (rc == 0) {
                p->reconnecting = false;
                kvx_list_del(&p->reconnect_link);
                continue;
            }
            kvx_debug(&t->core, "peer %s: pairing again with %s: %s; next try in %llu ms", p->id,
                      p->addr, kvx_strerror(rc), (unsigned long long)(p->backoff_ns / 1000000));
            p->next_try_ns = now + p->backoff_ns;
            p->backoff_ns =
                p->backoff_ns * 2 < KVX_RECONNECT_MAX_NS ? p->backoff_ns * 2 : KVX_RECONNECT_MAX_NS;
        }
        if (now >= p->next_try_ns) {
            struct sockaddr_storage ss;
            socklen_t len;
            int rc = kvx_addr_parse(p->addr, false, &ss, &len); /* numeric: no lookup */
            if (rc == 0)
                rc = kvx_listen_dial(t, &ss, len, &p->pg);
            if (rc == 0) {
                p->pg->peer = p;
                next = p->pg->expires_ns < next ? p->pg->expires_ns : next;
                continue;
            }
            p->next_try_ns = now + p->backoff_ns;
            p->backoff_ns =
                p->backoff_ns * 2 < KVX_RECONNECT_MAX_NS ? p->backoff_ns * 2 : KVX_RECONNECT_MAX_NS;
        }
        next = p->next_try_ns < next ? p->next_try_ns : next;
    }
    t->next_reconnect_ns = next;
}

/* ---- housekeeping and close ------------------------------------------------------------------ */

void kvx_listen_housekeeping(kvx_transport_t *t, uint64_t now)
{
    for (kvx_list_t *n = t->pairings.next, *next; n != &t->pairings; n = next) {
        kvx_pairing_t *pg = kvx_container_of(n, kvx_pairing_t, link);
        next = n->next;
        if (!pg->closing && now >= pg->expires_ns) {
            kvx_pair_close(pg, -ETIMEDOUT);
            kvx_pair_maybe_free(pg);
        }
    }
}

void kvx_listen_close_all(kvx_transport_t *t)
{
    /* requests not taken yet are refused while the listener is still there */
    for (kvx_list_t *n = t->pairings.next; n != &t->pairings; n = n->next) {
        kvx_pairing_t *pg = kvx_container_of(n, kvx_pairing_t, link);
        if (pg->conn_req != NULL) {
            kvx_ucx_reject(t->core.ucx, pg->conn_req);
            pg->conn_req = NULL;
            pg->closing = true; /* no endpoint */
        }
    }
    kvx_ucx_unlisten(t->core.ucx);
    t->listening = false;
    for (kvx_list_t *n = t->pairings.next, *next; n != &t->pairings; n = next) {
        kvx_pairing_t *pg = kvx_container_of(n, kvx_pairing_t, link);
        next = n->next;
        pg->abandoned = true;
        kvx_pair_close(pg, -ESHUTDOWN);
        kvx_pair_maybe_free(pg);
    }
}

bool kvx_listen_closing(const kvx_transport_t *t) { return !kvx_list_empty(&t->pairings); }

void kvx_listen_free_all(kvx_transport_t *t)
{
    while (!kvx_list_empty(&t->pairings)) {
        kvx_pairing_t *pg = kvx_list_first(&t->pairings, kvx_pairing_t, link);
        pg->closing = true;
        pg->abandoned = true;
        pg->refs = 0; /* the worker is gone: no callback comes any more */
        kvx_pair_maybe_free(pg);
    }
}
