/*
 * Peers (peer.c) and pairing by address (listen.c), src/README.md: over both sides.
 */
#ifndef KVX_PEER_H
#define KVX_PEER_H

#include "api/transport.h"
#include "xfer/kvx_xfer.h"

/* ---- peers (peer.c) ------------------------------------------------------------------------- */

/* Pairing again: at once, then after pauses that double from the first to the last. */
#define KVX_RECONNECT_MIN_NS 10000000ull
#define KVX_RECONNECT_MAX_NS 500000000ull
/* A peer paired by address lost its connection: it pairs again (listen.c's kvx_listen_reconnect
 * takes it from t->reconnects when due). */
void kvx_peer_lost(kvx_transport_t *t, kvx_peer_t *p, int err);
/* A peer event for kvx_peer_event_poll (the oldest goes when the ring is full). */
void kvx_peer_event(kvx_transport_t *t, const kvx_peer_t *p, int type, int err);
/* What the peers' connections tell them (kvx_conn_open). */
extern const kvx_conn_ops_t kvx_peer_conn_ops;
/* The compatibility rules of kvx_peer_add. Returns 0, or the error with *why saying which rule. */
int kvx_peer_check(const kvx_core_t *core, const kvx_md_t *md, const kvx_peer_params_t *expect,
                   const char **why);
/* Install a new connection from md on a peer paired by address whose connection failed, without
 * waiting (its handshake completes in the background); the transfers parked meanwhile move to
 * it. Returns 0 or a negative errno (nothing changed). */
int kvx_peer_reinstall(kvx_transport_t *t, kvx_peer_t *p, const kvx_md_t *md);

/* ---- pairing by address (listen.c) ---------------------------------------------------------- */

/* One exchange over an endpoint of UCX's connection manager: the listener's side (accepted) sends
 * a nonce, the connecting side answers with a proof of the secret over it, the listener answers
 * with its metadata. Freed once its endpoint has closed and UCX holds nothing of it. */
struct kvx_pairing {
    kvx_transport_t *t;
    kvx_ucx_ep_t *ucx;
    void *conn_req;   /* accepted: UCX's request, until kvx_listen_work opens the endpoint */
    kvx_peer_t *peer; /* a reconnection's (else a kvx_peer_connect call's or the listener's) */
    bool accepted;    /* the listener's side (else a kvx_peer_connect call's) */
    bool answered;    /* accepted: MD sent; connecting: MD (or an error) received */
    bool closing;
    bool abandoned; /* connecting: the call has gone; free once closed */
    bool asked;     /* accepted: MD_REQ came; connecting: CHALLENGE came */
    bool secret_needed, has_proof;
    bool want_answer, want_request, work; /* for kvx_listen_work */
    int err;
    int fail_err; /* the endpoint failed (1: closed after the answer) or sent out of turn */
    uint8_t nonce[KVX_WIRE_NONCE_LEN];  /* the listener's */
    uint8_t cnonce[KVX_WIRE_NONCE_LEN]; /* the connecting side's */
    uint8_t proof[KVX_PROOF_LEN];       /* accepted: MD_REQ's */
    uint8_t *md;                        /* connecting: the metadata received */
    size_t md_len;
    uint64_t expires_ns;
    unsigned refs;   /* UCX callbacks still to come */
    kvx_list_t link; /* t->pairings */
};

/* "host:port" or "[v6 address]:port" (port 0 only with any_port), split in buf (KVX_ADDR_MAX
 * bytes) into *host_p and *port_p: 0, or -EINVAL. kvx_addr_parse resolves it too (host may be a
 * name) into *ss: 0, or -EINVAL. kvx_addr_format writes ss back as text (numeric). */
int kvx_addr_split(const char *addr, bool any_port, char buf[KVX_ADDR_MAX], char **host_p,
                   char **port_p);
int kvx_addr_parse(const char *addr, bool any_port, struct sockaddr_storage *ss, socklen_t *len);
void kvx_addr_format(const struct sockaddr_storage *ss, char *out, size_t cap);
void kvx_listen_on_request(kvx_transport_t *t, void *conn_req);
/* kvx_peer_connect's pairing: open it to a listener's address (lock held), whether it has an
 * outcome, and its outcome (0 and the listener's metadata, the caller's to free; the pairing
 * goes). */
int kvx_listen_dial(kvx_transport_t *t, const struct sockaddr_storage *ss, socklen_t len,
                    kvx_pairing_t **pg_p);
bool kvx_listen_dial_over(const kvx_pairing_t *pg);
int kvx_listen_dial_end(kvx_pairing_t *pg, const char *peer_id, const char *addr, uint8_t **md_p,
                        size_t *md_len_p);
void kvx_listen_on_message(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                           size_t data_len);
void kvx_listen_on_sent(kvx_pairing_t *pg, int status);
void kvx_listen_on_error(kvx_pairing_t *pg, int status);
void kvx_listen_on_closed(kvx_pairing_t *pg);
void kvx_listen_housekeeping(kvx_transport_t *t, uint64_t now);
unsigned kvx_listen_work(kvx_transport_t *t);
void kvx_listen_close_all(kvx_transport_t *t); /* at close: every pairing's endpoint */
bool kvx_listen_closing(const kvx_transport_t *t);
void kvx_listen_free_all(kvx_transport_t *t); /* after the worker is gone */
/* Reconnection of peers paired by address (kvx_peer_lost starts it): stop it (removed,
 * re-added, closing), and its step (from kvx_progress_step when due). */
void kvx_listen_peer_forget(kvx_transport_t *t, kvx_peer_t *p);
void kvx_listen_reconnect(kvx_transport_t *t, uint64_t now);

#endif /* KVX_PEER_H */
