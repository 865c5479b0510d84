/*
 * Peers and pairing by address (src/README.md), over both sides: what a peer's connection tells
 * it, the compatibility rules, a new connection for a peer that paired again, peer events
 * (peer.c); addresses (addr.c); a pairing's life (pairing.c), the listener's side (listen.c), the
 * connecting side (dial.c), and pairing again after a failure (reconnect.c). Its state is
 * kvx_peers_t; what only its files share is peer/pair_int.h.
 */
#ifndef KVX_PEER_H
#define KVX_PEER_H

#include "xfer/kvx_xfer.h"

/* The peer layer's state: pairing by address, peers pairing again, the peer events. */
typedef struct kvx_peers {
    kvx_core_t *core;
    kvx_conns_t *conns; /* where a peer that paired again gets its new connection */
    const uint8_t *md;  /* the metadata the listener answers with (kvx_peers_metadata) */
    size_t md_len;
    bool listening;
    char listen_addr[KVX_ADDR_MAX];
    kvx_list_t pairings;        /* every pairing not yet freed */
    bool pair_work;             /* a pairing has something for kvx_pairings_work */
    unsigned naccepted;         /* pairings the listener accepted that are not yet freed */
    kvx_list_t reconnects;      /* peers paired by address whose connection failed */
    uint64_t next_reconnect_ns; /* when one of them is due (UINT64_MAX: none) */
    kvx_peer_event_t events[KVX_PEER_EVENTS_MAX]; /* a ring */
    size_t ev_head, ev_count;
} kvx_peers_t;

void kvx_peers_init(kvx_peers_t *pp, kvx_core_t *core, kvx_conns_t *conns);
/* The metadata the listener answers with from now on (the caller keeps it alive while a pairing
 * it accepted may still send it: naccepted). */
void kvx_peers_metadata(kvx_peers_t *pp, const uint8_t *md, size_t md_len);

/* ---- peers (peer.c) ------------------------------------------------------------------------- */

/* Pairing again: at once, then after pauses that double from the first to the last. */
#define KVX_RECONNECT_MIN_NS 10000000ull
#define KVX_RECONNECT_MAX_NS 500000000ull
/* What the peers' connections tell them (kvx_conn_open, with the kvx_peers_t as owner): a
 * failure of a peer paired by address starts its pairing again (reconnect.c takes it from the
 * reconnects when due). */
extern const kvx_conn_ops_t kvx_peer_conn_ops;
/* The compatibility rules of kvx_peer_add. Returns 0, or the error with *why saying which rule. */
int kvx_peer_check(const kvx_core_t *core, const kvx_md_t *md, const kvx_peer_params_t *expect,
                   const char **why);
/* Install a new connection from md on a peer paired by address whose connection failed, without
 * waiting (its handshake completes in the background); the transfers parked meanwhile move to
 * it. Returns 0 or a negative errno (nothing changed). */
int kvx_peer_reinstall(kvx_peers_t *pp, kvx_peer_t *p, const kvx_md_t *md);
/* A peer event for kvx_peer_event_poll (the oldest goes when the ring is full); up to max of
 * them taken, oldest first; how many wait. */
void kvx_peer_event(kvx_peers_t *pp, const kvx_peer_t *p, int type, int err);
size_t kvx_peer_events_take(kvx_peers_t *pp, kvx_peer_event_t *out, size_t max);
static inline size_t kvx_peer_events_pending(const kvx_peers_t *pp) { return pp->ev_count; }

/* ---- addresses (addr.c) --------------------------------------------------------------------- */

/* "host:port" or "[v6 address]:port" (port 0 only with any_port), split in buf (KVX_ADDR_MAX
 * bytes) into *host_p and *port_p: 0, or -EINVAL. kvx_addr_parse resolves it too (host may be a
 * name) into *ss: 0, or -EINVAL. kvx_addr_format writes ss back as text (numeric). */
int kvx_addr_split(const char *addr, bool any_port, char buf[KVX_ADDR_MAX], char **host_p,
                   char **port_p);
int kvx_addr_parse(const char *addr, bool any_port, struct sockaddr_storage *ss, socklen_t *len);
void kvx_addr_format(const struct sockaddr_storage *ss, char *out, size_t cap);

/* ---- a pairing (pairing.c) ------------------------------------------------------------------ */

/* What one side of pairings does (listen.c: the listener's, dial.c: the connecting side's): take
 * a message that came on a pairing's endpoint (in UCX's callback), and act after UCX progress. */
typedef struct kvx_pair_side {
    void (*on_message)(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data, size_t len);
    void (*work)(kvx_pairing_t *pg);
} kvx_pair_side_t;
extern const kvx_pair_side_t kvx_listen_side, kvx_dial_side;

/* One exchange over an endpoint of UCX's connection manager: the listener's side (accepted) sends
 * a nonce, the connecting side answers with a proof of the secret over it, the listener answers
 * with its metadata. Freed once its endpoint has closed and UCX holds nothing of it. */
struct kvx_pairing {
    kvx_peers_t *peers;
    const kvx_pair_side_t *side; /* kvx_listen_side (accepted) or kvx_dial_side */
    kvx_ucx_ep_t *ucx;
    void *conn_req;   /* accepted: UCX's request, until the side's work opens the endpoint */
    kvx_peer_t *peer; /* a reconnection's (else a kvx_peer_connect call's or the listener's) */
    bool accepted;    /* the listener's side (else a kvx_peer_connect call's) */
    bool answered;    /* accepted: MD sent; connecting: MD (or an error) received */
    bool closing;
    bool abandoned; /* connecting: the call has gone; free once closed */
    bool asked;     /* accepted: MD_REQ came; connecting: CHALLENGE came */
    bool secret_needed, has_proof;
    bool want_answer, want_request, work; /* for kvx_pairings_work */
    int err;
    int fail_err; /* the endpoint failed (1: closed after the answer) or sent out of turn */
    uint8_t nonce[KVX_WIRE_NONCE_LEN];  /* the listener's */
    uint8_t cnonce[KVX_WIRE_NONCE_LEN]; /* the connecting side's */
    uint8_t proof[KVX_PROOF_LEN];       /* accepted: MD_REQ's */
    uint8_t *md;                        /* connecting: the metadata received */
    size_t md_len;
    uint64_t expires_ns;
    unsigned refs;   /* UCX callbacks still to come */
    kvx_list_t link; /* peers->pairings */
};

/* A message that came on pg's endpoint (decoded: CHALLENGE, MD_REQ, MD), to its side. */
void kvx_pair_on_message(kvx_pairing_t *pg, const kvx_msg_t *m, const uint8_t *data,
                         size_t data_len);
/* After UCX progress: what the callbacks recorded, each pairing by its side. The pairings
 * served. */
unsigned kvx_pairings_work(kvx_peers_t *pp);
/* Periodic: pairings past their time close. */
void kvx_pairings_housekeeping(kvx_peers_t *pp, uint64_t now);
/* At close: the listener and every pairing's endpoint; whether any is still there; all freed
 * (after the worker is gone). */
void kvx_pairings_close_all(kvx_peers_t *pp);
bool kvx_pairings_closing(const kvx_peers_t *pp);
void kvx_pairings_free_all(kvx_peers_t *pp);

/* ---- the listener's side (listen.c) --------------------------------------------------------- */

/* Listen at the address ss (kvx_transport_listen): 0, or a negative errno (-EALREADY). */
int kvx_listen(kvx_peers_t *pp, const struct sockaddr_storage *ss, socklen_t len);
/* A connection request the listener got (UCX's callback). */
void kvx_listen_on_request(kvx_peers_t *pp, void *conn_req);

/* ---- the connecting side (dial.c) ----------------------------------------------------------- */

/* A pairing to a listener's address (lock held), whether it has an outcome (answered, failed or
 * past its time), and kvx_peer_connect's outcome: 0 with the listener's metadata in *md_p (the
 * caller's to free), or a negative errno (logged); the pairing goes. */
int kvx_dial(kvx_peers_t *pp, const struct sockaddr_storage *ss, socklen_t len,
             kvx_pairing_t **pg_p);
bool kvx_dial_over(const kvx_pairing_t *pg);
int kvx_dial_end(kvx_pairing_t *pg, const char *peer_id, const char *addr, uint8_t **md_p,
                 size_t *md_len_p);

/* ---- pairing again (reconnect.c) ------------------------------------------------------------ */

/* Stop pairing p again (removed, re-added, closing). */
void kvx_reconnect_forget(kvx_peers_t *pp, kvx_peer_t *p);
/* The reconnection step (from the progress step when one is due). */
void kvx_reconnect_step(kvx_peers_t *pp, uint64_t now);

#endif /* KVX_PEER_H */
