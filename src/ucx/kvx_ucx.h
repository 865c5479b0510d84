/*
 * The UCX backend's interface to the layers above (src/README.md): the only layer that talks to
 * UCX (what only its files share is ucx_int.h, the only header that includes UCP's). It sees
 * nothing of the layers above, as UCX's uct never sees ucp_worker_t: it is given a handle of its
 * own at init (kvx_ucx_t, made from the few settings it needs, copied), and what it learns
 * reaches the layers above through the tables of callbacks they give it (the worker's at init,
 * an endpoint's when it opens).
 */
#ifndef KVX_UCX_H
#define KVX_UCX_H

#include "wire/kvx_wire.h"

typedef struct kvx_ucx kvx_ucx_t;       /* the backend of a transport: its worker (ucx_int.h) */
typedef struct kvx_ucx_ep kvx_ucx_ep_t; /* an endpoint, and its owner's table (ucx_int.h) */
typedef struct kvx_send kvx_send_t;
typedef struct kvx_ep_ops kvx_ep_ops_t;

/* A message being sent: kvx builds its header and payload iov here, and UCX keeps pointing at
 * both until it is done (a message it could not send at once waits in its queue). */
#define KVX_SEND_HDR_MAX (KVX_WIRE_HELLO_LEN + KVX_NAME_MAX + KVX_WIRE_MAX_WADDR + KVX_PROOF_LEN)
struct kvx_send {
    kvx_ucx_ep_t *ep;
    kvx_send_t *next_free;
    uint64_t xfer_id; /* the transfer whose local blocks the payload is (0: none) */
    /* its one payload piece (iov[0], memory of the region) goes by rendezvous: the receiver
     * checks the header, then UCX moves the piece into the place it names (kvx_ucx_recv) */
    bool rndv;
    /* it names the endpoint it goes on (UCP_AM_SEND_FLAG_REPLY): a HELLO, whose connection
     * then takes the endpoint UCX paired with it (kvx_ucx_ep_accept) */
    bool named;
    uint8_t hdr[KVX_SEND_HDR_MAX];
    kvx_iov_t iov[KVX_WIRE_MAX_RUNS];
};

/* What the backend needs of its transport, given to kvx_ucx_init (which copies what it keeps). */
typedef struct kvx_ucx_config {
    kvx_logger_t log;        /* the transport's logger: the backend logs as the transport does */
    uint64_t keepalive_ms;   /* UCX's keepalive interval (0: UCX's own) */
    const char *net_devices; /* UCX_NET_DEVICES for this worker (NULL: UCX's), read at init only */
} kvx_ucx_config_t;

/* Why a message was dropped before any owner saw it (kvx_ucx_ops_t.on_drop). */
enum { KVX_DROP_MALFORMED, KVX_DROP_UNKNOWN, KVX_DROP_RNDV };

/*
 * What the layers above hear from the backend: from inside UCX progress, with the transport lock
 * held, through the tables they gave it (the backend calls no kvx file above it). The worker's
 * table (kvx_ucx_init, with its arg): messages, decoded and checked against the wire format, by
 * the side they are for, connection requests of the listener, and messages dropped before any
 * owner saw them.
 */
typedef struct kvx_ucx_ops {
    /* for the receiving side: HELLO, WRITE, READ_REQ, NOTICE, BYE, PROOF */
    void (*on_request)(void *arg, const kvx_msg_t *m, const void *hdr, size_t hdr_len,
                       const uint8_t *data, size_t data_len);
    /* for the initiator's side: HELLO_ACK, ACK, READ_DATA, FENCE, NOTICE_ACK */
    void (*on_reply)(void *arg, const kvx_msg_t *m, const uint8_t *data, size_t data_len);
    void (*on_conn_request)(void *arg, void *conn_req);
    void (*on_drop)(void *arg, int why); /* KVX_DROP_* */
} kvx_ucx_ops_t;

/* An endpoint's table (kvx_ucx_ep_open, kvx_ucx_pair_open), called with the owner it was given. */
struct kvx_ep_ops {
    /* UCX is done with a message of the owner's (xfer_id: the message's; status: how it went) */
    void (*on_sent)(void *owner, uint64_t xfer_id, int status);
    void (*on_error)(void *owner, int status); /* the endpoint failed */
    void (*on_closed)(void *owner);            /* a close that returned 1 completed */
    /* pairing endpoints only: a CHALLENGE, MD_REQ or MD that arrived on it */
    void (*on_message)(void *owner, const kvx_msg_t *m, const uint8_t *data, size_t data_len);
    /* a rendezvous receive the owner started on this endpoint (kvx_ucx_recv) ended: status 0,
     * its bytes are in place; else they may be partly there */
    void (*on_received)(void *owner, void *cookie, int status);
};

/* The context and worker with kvx's settings, whose messages and requests go to ops with arg:
 * 0 with *u_p, or a negative errno (logged). */
int kvx_ucx_init(const kvx_ucx_config_t *cfg, const kvx_ucx_ops_t *ops, void *arg, kvx_ucx_t **u_p);
void kvx_ucx_fini(kvx_ucx_t *u); /* the worker; an owned region stays */
void kvx_ucx_free(kvx_ucx_t *u); /* the owned region and the rest (NULL: nothing) */
void kvx_ucx_local_address(kvx_ucx_t *u, const void **waddr, size_t *waddr_len);
/* An owned region of len bytes: its base, its packed key (in the metadata; the backend's until
 * kvx_ucx_free), and its segment's token (KVX_SEG_TOKEN_LEN bytes; zero: peers on this host use
 * messages). 0, or a negative errno. */
int kvx_ucx_region_alloc(kvx_ucx_t *u, size_t len, void **base_p, const void **rkey_p,
                         size_t *rkey_len_p, uint8_t *seg_token);
int kvx_ucx_map(kvx_ucx_ep_t *ep, const void *rkey, size_t rkey_len, uint64_t raddr, uint64_t len,
                uint32_t owner, void **ptr_p, uint8_t *token_p);
void kvx_ucx_unmap(kvx_ucx_ep_t *ep);
/* An endpoint to a worker address, whose errors and sends report to owner through ops. */
int kvx_ucx_ep_open(kvx_ucx_t *u, const void *waddr, const char *name, const kvx_ep_ops_t *ops,
                    void *owner, kvx_ucx_ep_t **ep_p);
/* UCX pairs two workers' endpoints by the order each opened them towards the other: the place
 * of ep among this worker's endpoints to that peer, and a catch-up to the peer's place before
 * answering it (see catchup.c). */
uint32_t kvx_ucx_ep_sn(const kvx_ucx_ep_t *ep);
/* Where a message came from, taken inside its handler (kvx_ucx_came_on): the UCX endpoint its
 * sender named (UCP_AM_SEND_FLAG_REPLY; NULL: none), and, when that endpoint is one kvx opened,
 * its link's number (0: none), and the last number given by then. Numbers are never reused, so a
 * HELLO handled later (kvx_recv_hellos) names no endpoint kvx opened since, except the one a
 * catch-up opened since that took over the very endpoint UCX made for it (catchup.c). */
typedef struct kvx_came_on {
    const void *ep;
    uint64_t link, last;
} kvx_came_on_t;
kvx_came_on_t kvx_ucx_came_on(kvx_ucx_t *u);
/* The endpoint of a HELLO's connection, towards the writer's worker waddr, whose endpoint the
 * HELLO came on (came_on) and says is its sn-th towards this worker: the endpoint UCX paired
 * with that one. That is a catch-up endpoint opened already when HELLOs came out of order, this
 * transport's own writing endpoint towards that worker when both transports opened theirs before
 * either answered (then shared: struct kvx_ucx_link, ucx_int.h), else one opened now after
 * catching up (see catchup.c). Returns 0, 1 when the catch-up was over its budget (the endpoint
 * is opened without it: UCX pairs it with another of the writer's), or a negative errno. */
int kvx_ucx_ep_accept(kvx_ucx_t *u, const void *waddr, uint32_t sn, const kvx_came_on_t *came_on,
                      const char *name, const kvx_ep_ops_t *ops, void *owner, kvx_ucx_ep_t **ep_p);
/* Close (forced). Returns 0 when closed on return, 1 when the owner's on_closed follows. */
int kvx_ucx_ep_close(kvx_ucx_ep_t *ep, unsigned *refs);
void kvx_ucx_ep_free(kvx_ucx_ep_t *ep);
/* What an endpoint's lanes are (kvx_ucx_ep_describe). */
typedef struct kvx_lanes {
    /* the transports its active messages travel on ("sysv", "tcp", "rc_mlx5,rc_mlx5"...): what
     * kvx_peer_query reports, and the lane kvx's messages are sized for */
    char am[KVX_TRANSPORT_NAME_MAX];
    /* the transports of its rendezvous lanes (UCX's rma_bw lanes; "" when none: a rendezvous is
     * then cut into active messages) */
    char rndv[KVX_TRANSPORT_NAME_MAX];
    /* the size from which UCX itself would send kvx's messages by rendezvous on this endpoint
     * (UINT64_MAX: UCX does not say), and UCX's name for that protocol (UCX 1.14 and later; "" if
     * not said) */
    uint64_t ucx_rndv;
    char ucx_proto[64];
    size_t seg; /* a message's size on the am lane */
} kvx_lanes_t;
void kvx_ucx_ep_describe(kvx_ucx_ep_t *ep, kvx_lanes_t *l);
/* The same read from ucp_ep_print_info's text (pure: the tests drive it with UCX's texts). */
void kvx_ucx_lanes_parse(const char *text, kvx_lanes_t *l);
/* A message to fill (s->hdr, s->iov, s->xfer_id), then hand to kvx_ucx_send; NULL: no memory. */
kvx_send_t *kvx_ucx_send_get(kvx_ucx_ep_t *ep);
/* Send s: hdr_len bytes of s->hdr and the payload s->iov[0..iovcnt) (memory of the region). Returns
 * 0 (UCX is done with it already: s is free again), 1 (UCX holds it: the owner's on_sent follows,
 * and *refs counts it meanwhile), or a negative errno (s is free again). */
int kvx_ucx_send(kvx_send_t *s, size_t hdr_len, size_t iovcnt, unsigned *refs);
/* Receive a rendezvous message's payload (m->rndv: desc is the data pointer its handler got, and
 * this is called from that handler, inside UCX progress) into len bytes at dest, memory of the
 * region: UCX moves them there itself (on RDMA lanes, by an RDMA READ or WRITE with no copy).
 * len must be the message's payload length, and the message must have come on ep itself (its
 * sender named the endpoint, UCP_AM_SEND_FLAG_REPLY): closing ep is what ends the receive, UCX
 * cannot cancel it otherwise. Returns 0 (in place already), 1 (in flight: the endpoint owner's
 * on_received follows, and *refs counts it until then; it may have run before this returns),
 * -EPERM (it came on another endpoint, or named none: not received), or another negative errno
 * (nothing received). A handler that returns without receiving refuses the payload: UCX tells
 * the sender it is done. */
int kvx_ucx_recv(kvx_ucx_ep_t *ep, void *desc, void *dest, size_t len, void *cookie,
                 unsigned *refs);
/* Wrap a header already built into a message with no payload and send it. */
int kvx_ucx_send_ctl(kvx_ucx_ep_t *ep, const void *hdr, size_t hdr_len, unsigned *refs);
/* pairing by address (UCX's connection manager) */
int kvx_ucx_listen(kvx_ucx_t *u, const struct sockaddr *sa, socklen_t len,
                   struct sockaddr_storage *bound);
void kvx_ucx_unlisten(kvx_ucx_t *u);
void kvx_ucx_reject(kvx_ucx_t *u, void *conn_req);
int kvx_ucx_pair_open(kvx_ucx_t *u, void *conn_req, const struct sockaddr *sa, socklen_t len,
                      const kvx_ep_ops_t *ops, void *owner, kvx_ucx_ep_t **ep_p);
int kvx_ucx_send_pair(kvx_ucx_ep_t *ep, const void *hdr, size_t hdr_len, const void *data,
                      size_t data_len, unsigned *refs);
unsigned kvx_ucx_progress(kvx_ucx_t *u);
/* Arm the worker's event fd: 0 (it will wake a poller), -EBUSY (events are pending). */
int kvx_ucx_arm(kvx_ucx_t *u);
int kvx_ucx_event_fd(kvx_ucx_t *u);

#endif /* KVX_UCX_H */
