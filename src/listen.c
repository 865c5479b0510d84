/*
 * Pairing by address, without a control plane: a transport listens on UCX's connection manager
 * (kvx_transport_listen), another connects to it (kvx_peer_connect), receives its metadata over
 * that connection and adds it exactly as kvx_peer_add does. The exchange, on an endpoint of the
 * connection manager (messages in wire.c):
 *
 *   listener   -> CHALLENGE  a fresh random nonce; flag KVX_MSGF_SECRET if a proof is required
 *   connecting -> MD_REQ     HMAC-SHA256(secret, "kvx-pair-v1" || nonce), with a secret
 *   listener   -> MD         its metadata (signed with the secret, if any), or -EACCES
 *
 * and the connecting side closes the endpoint. The listener sends nothing but the nonce before
 * the proof checks out. Data never travels here: kvx_peer_add opens the usual connection from
 * the metadata's worker address (shared memory between processes on one host, tcp across).
 */
#include "kvx_int.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* An exchange not finished in this time is closed (at the next housekeeping, 0.1-1 s later). */
#define KVX_PAIR_TIMEOUT_NS (2ull * 1000000000ull)
/* Pairing again: at once, then after pauses that double from the first to the last. */
#define KVX_RECONNECT_MIN_NS 10000000ull
#define KVX_RECONNECT_MAX_NS 500000000ull
/* Connections the listener keeps at once; more are rejected until some finish or expire. */
#define KVX_ACCEPTED_MAX 256

static const char kvx_pair_label[] = "kvx-pair-v1";

static void kvx_pair_proof(const kvx_transport_t *t, const uint8_t *nonce, uint8_t out[32])
{
    kvx_iov_t parts[2] = {{(void *)kvx_pair_label, sizeof(kvx_pair_label) - 1},
                          {(void *)nonce, KVX_WIRE_NONCE_LEN}};
    kvx_hmac_sha256(t->secret, t->secret_len, parts, 2, out);
}

/* "host:port" or "[v6 address]:port" to a socket address: 0, or -EINVAL. */
static int kvx_addr_parse(const char *addr, bool any_port, struct sockaddr_storage *ss,
                          socklen_t *len)
{
    char buf[KVX_ADDR_MAX], *host, *port;
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    size_t n;
    long pn;

    if (addr == NULL || (n = strlen(addr)) == 0 || n >= sizeof(buf))
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

static void kvx_addr_format(const struct sockaddr_storage *ss, char *out, size_t cap)
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

/* ---- a pairing's life ------------------------------------------------------------------------ */

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

/* Close the pairing's endpoint (forcibly: nothing is owed to the other side). */
static void kvx_pair_close(kvx_pairing_t *pg, int err)
{
    if (pg->closing)
        return;
    pg->closing = true;
    if (pg->err == 0)
        pg->err = err;
    kvx_ucx_ep_close(pg->ucx, &pg->refs);
    pg->t->conn_event = true; /* a kvx_peer_connect call waiting on it looks again */
    if (pg->peer != NULL)
        pg->t->next_reconnect_ns = 0; /* a reconnection: its peer looks at once */
}

void kvx_listen_on_sent(kvx_pairing_t *pg, int status)
{
    pg->refs--;
    if (status < 0 && status != -ECANCELED)
        kvx_pair_close(pg, status);
    kvx_pair_maybe_free(pg);
}

void kvx_listen_on_error(kvx_pairing_t *pg, int status)
{
    /* the connecting side closing after the answer is the normal end of an accepted pairing */
    if (!pg->accepted && !pg->answered)
        kvx_debug(pg->t, "pairing: the connection failed: %s", kvx_strerror(status));
    kvx_pair_close(pg, pg->answered ? 0 : status);
    kvx_pair_maybe_free(pg);
}

void kvx_listen_on_closed(kvx_pairing_t *pg)
{
    pg->refs--;
    kvx_pair_maybe_free(pg);
}

/* ---- the listener's side --------------------------------------------------------------------- */

int kvx_transport_listen(kvx_transport_t *t, const char *addr)
{
    struct sockaddr_storage ss, bound;
    socklen_t len;
    int rc;

    if (t == NULL)
        return -EINVAL;
    rc = kvx_addr_parse(addr, true, &ss, &len);
    if (rc < 0)
        return rc;
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
    } else if (t->listening) {
        rc = -EALREADY;
    } else {
        rc = kvx_ucx_listen(t, (const struct sockaddr *)&ss, len, &bound);
        if (rc == 0) {
            t->listening = true;
            kvx_addr_format(&bound, t->listen_addr, sizeof(t->listen_addr));
            kvx_info(t, "listening at %s", t->listen_addr);
        }
    }
    kvx_unlock(t);
    return rc;
}

void kvx_listen_on_request(kvx_transport_t *t, void *conn_req)
{
    uint8_t hdr[KVX_WIRE_HDR_LEN + KVX_WIRE_NONCE_LEN];
    kvx_pairing_t *pg = NULL;
    int rc;

    if (t->closed || !t->listening || t->naccepted >= KVX_ACCEPTED_MAX ||
        (pg = calloc(1, sizeof(*pg))) == NULL ||
        getrandom(pg->nonce, sizeof(pg->nonce), 0) != (ssize_t)sizeof(pg->nonce)) {
        kvx_debug(t, "listener: a connection rejected (%u waiting)", t->naccepted);
        free(pg);
        kvx_ucx_reject(t, conn_req);
        return;
    }
    pg->t = t;
    pg->accepted = true;
    kvx_list_init(&pg->link);
    /* a failed ucp_ep_create releases the request itself */
    if (kvx_ucx_pair_open(t, conn_req, NULL, 0, pg, &pg->ucx) < 0) {
        free(pg);
        return;
    }
    pg->expires_ns = kvx_now_ns() + KVX_PAIR_TIMEOUT_NS;
    kvx_list_add_tail(&t->pairings, &pg->link);
    t->naccepted++;
    kvx_wire_put_hdr(hdr, KVX_MSG_CHALLENGE, t->secret != NULL ? KVX_MSGF_SECRET : 0, 0, 0);
    memcpy(hdr + KVX_WIRE_HDR_LEN, pg->nonce, sizeof(pg->nonce));
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), NULL, 0, &pg->refs);
    if (rc < 0) {
        kvx_pair_close(pg, rc);
        kvx_pair_maybe_free(pg);
    }
}

/* MD_REQ: the metadata, if the proof holds (or no secret is needed). */
static void kvx_listen_answer(kvx_pairing_t *pg, const kvx_msg_t *m)
{
    kvx_transport_t *t = pg->t;
    uint8_t hdr[24], want[KVX_PROOF_LEN];
    int32_t status = 0;
    int rc;

    if (t->secret != NULL) {
        kvx_pair_proof(t, pg->nonce, want);
        if (m->u.md_req.proof == NULL || !kvx_equal_ct(m->u.md_req.proof, want, sizeof(want))) {
            kvx_warn(t, "listener: a peer without the shared secret was refused");
            status = -EACCES;
        }
    }
    kvx_wire_put_hdr(hdr, KVX_MSG_MD, 0, 0, 0);
    kvx_put32(hdr + 16, (uint32_t)status);
    kvx_put32(hdr + 20, status == 0 ? (uint32_t)t->metadata_len : 0);
    pg->answered = true;
    pg->expires_ns = kvx_now_ns() + KVX_PAIR_TIMEOUT_NS; /* for the other side to close */
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), status == 0 ? t->metadata : NULL,
                           status == 0 ? t->metadata_len : 0, &pg->refs);
    if (rc < 0)
        kvx_pair_close(pg, rc);
    else if (status == 0)
        kvx_debug(t, "listener: metadata sent");
}

/* ---- the connecting side --------------------------------------------------------------------- */

static void kvx_connect_on_challenge(kvx_pairing_t *pg, const kvx_msg_t *m)
{
    kvx_transport_t *t = pg->t;
    uint8_t hdr[KVX_WIRE_HDR_LEN + KVX_PROOF_LEN] = {0};
    int rc;

    if ((m->flags & KVX_MSGF_SECRET) && t->secret == NULL) {
        /* it would refuse us: say so without asking */
        pg->answered = true;
        pg->err = -EACCES;
        kvx_pair_close(pg, -EACCES);
        return;
    }
    kvx_wire_put_hdr(hdr, KVX_MSG_MD_REQ, t->secret != NULL ? KVX_MSGF_PROOF : 0, 0, 0);
    if (t->secret != NULL)
        kvx_pair_proof(t, m->u.challenge.nonce, hdr + KVX_WIRE_HDR_LEN);
    memcpy(pg->nonce, m->u.challenge.nonce, sizeof(pg->nonce)); /* asked: nonzero from now */
    rc = kvx_ucx_send_pair(pg->ucx, hdr, sizeof(hdr), NULL, 0, &pg->refs);
    if (rc < 0)
        kvx_pair_close(pg, rc);
}

static void kvx_connect_on_md(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                              size_t data_len)
{
    pg->answered = true;
    if (m->u.md.status < 0) {
        pg->err = m->u.md.status;
    } else if ((pg->md = malloc(data_len)) == NULL) {
        pg->err = -ENOMEM;
    } else {
        memcpy(pg->md, data, data_len);
        pg->md_len = data_len;
    }
    pg->t->conn_event = true;
    if (pg->peer != NULL)
        pg->t->next_reconnect_ns = 0;
}

void kvx_listen_on_message(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                           size_t data_len)
{
    static const uint8_t zero[KVX_WIRE_NONCE_LEN];
    bool asked = memcmp(pg->nonce, zero, sizeof(zero)) != 0;

    if (pg->closing)
        return;
    if (pg->accepted && m->type == KVX_MSG_MD_REQ && !pg->answered)
        kvx_listen_answer(pg, m);
    else if (!pg->accepted && m->type == KVX_MSG_CHALLENGE && !asked)
        kvx_connect_on_challenge(pg, m);
    else if (!pg->accepted && m->type == KVX_MSG_MD && asked && !pg->answered)
        kvx_connect_on_md(pg, m, data, data_len);
    else /* out of turn: the other side is not kvx, or not well */
        kvx_pair_close(pg, -EPROTO);
    kvx_pair_maybe_free(pg);
}

/* Open a pairing to a listener's address. Lock held. */
static int kvx_pair_dial(kvx_transport_t *t, const struct sockaddr_storage *ss, socklen_t len,
                         kvx_pairing_t **pg_p)
{
    kvx_pairing_t *pg = calloc(1, sizeof(*pg));
    int rc;

    if (pg == NULL)
        return -ENOMEM;
    pg->t = t;
    kvx_list_init(&pg->link);
    rc = kvx_ucx_pair_open(t, NULL, (const struct sockaddr *)ss, len, pg, &pg->ucx);
    if (rc < 0) {
        free(pg);
        return rc;
    }
    kvx_list_add_tail(&t->pairings, &pg->link);
    pg->expires_ns = kvx_now_ns() + KVX_PAIR_TIMEOUT_NS;
    *pg_p = pg;
    return 0;
}

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
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return -ESHUTDOWN;
    }
    rc = kvx_pair_dial(t, &ss, len, &pg);
    if (rc < 0) {
        kvx_unlock(t);
        return rc;
    }
    t->busy++;
    while (!t->closed && !pg->answered && !pg->closing && kvx_now_ns() < pg->expires_ns)
        kvx_progress_wait_event(t, pg->expires_ns);
    t->busy--;
    if (t->closed) {
        rc = -ESHUTDOWN;
        pthread_cond_broadcast(&t->cond); /* close waits for busy calls to leave */
    } else if (pg->err < 0) {
        rc = pg->err;
    } else if (pg->answered) {
        md = pg->md;
        md_len = pg->md_len;
        pg->md = NULL;
    } else {
        rc = -ETIMEDOUT;
    }
    if (rc < 0)
        kvx_error(t, "peer %s: pairing with %s: %s", peer_id, addr, kvx_strerror(rc));
    pg->abandoned = true;
    if (!t->closed) /* at close, kvx_listen_close_all has it */
        kvx_pair_close(pg, 0);
    kvx_pair_maybe_free(pg);
    kvx_unlock(t);
    if (rc == 0)
        rc = kvx_peer_add_at(t, peer_id, md, md_len, params, numeric);
    free(md);
    return rc;
}

/* ---- pairing again: peers paired by address whose connection failed ------------------------- */

void kvx_listen_event(kvx_transport_t *t, const kvx_peer_t *p, int type, int err)
{
    kvx_peer_event_t *e;

    if (t->ev_count == KVX_PEER_EVENTS_MAX) { /* the oldest goes */
        t->ev_head = (t->ev_head + 1) % KVX_PEER_EVENTS_MAX;
        t->ev_count--;
    }
    e = &t->events[(t->ev_head + t->ev_count) % KVX_PEER_EVENTS_MAX];
    memset(e, 0, sizeof(*e));
    snprintf(e->peer_id, sizeof(e->peer_id), "%s", p->id);
    e->type = type;
    e->error = err;
    e->generation = p->last_generation;
    t->ev_count++;
}

int kvx_peer_event_poll(kvx_transport_t *t, kvx_peer_event_t *out, size_t max)
{
    size_t n = 0;

    if (t == NULL || (out == NULL && max != 0))
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return -ESHUTDOWN;
    }
    while (n < max && n < INT32_MAX && t->ev_count > 0) {
        out[n++] = t->events[t->ev_head];
        t->ev_head = (t->ev_head + 1) % KVX_PEER_EVENTS_MAX;
        t->ev_count--;
    }
    kvx_unlock(t);
    return (int)n;
}

static void kvx_reconnect_due(kvx_transport_t *t, uint64_t at)
{
    if (at < t->next_reconnect_ns) {
        t->next_reconnect_ns = at;
        kvx_progress_kick(t, at);
    }
}

void kvx_listen_peer_lost(kvx_transport_t *t, kvx_peer_t *p, int err)
{
    if (p->reconnecting)
        return;
    p->reconnecting = true;
    p->backoff_ns = KVX_RECONNECT_MIN_NS;
    p->next_try_ns = kvx_now_ns();
    kvx_list_add_tail(&t->reconnects, &p->reconnect_link);
    kvx_info(t, "peer %s: connection failed (%s); pairing again with %s", p->id, kvx_strerror(err),
             p->addr);
    kvx_listen_event(t, p, KVX_PEER_EVENT_DOWN, err);
    kvx_reconnect_due(t, p->next_try_ns);
}

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
        rc = kvx_md_verify(pg->md, pg->md_len, &md, t->secret, t->secret_len);
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
            kvx_debug(t, "peer %s: pairing again with %s: %s; next try in %llu ms", p->id, p->addr,
                      kvx_strerror(rc), (unsigned long long)(p->backoff_ns / 1000000));
            p->next_try_ns = now + p->backoff_ns;
            p->backoff_ns =
                p->backoff_ns * 2 < KVX_RECONNECT_MAX_NS ? p->backoff_ns * 2 : KVX_RECONNECT_MAX_NS;
        }
        if (now >= p->next_try_ns) {
            struct sockaddr_storage ss;
            socklen_t len;
            int rc = kvx_addr_parse(p->addr, false, &ss, &len); /* numeric: no lookup */
            if (rc == 0)
                rc = kvx_pair_dial(t, &ss, len, &p->pg);
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
    kvx_ucx_unlisten(t);
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
