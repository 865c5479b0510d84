/*
 * The receiving side's connections (conn/rconn.c), as the receiving side (recv/) sees them: the
 * bounds, the queued replies, the counters, and what rconn.c (a receiving connection's life, the
 * writers, the slots and bounds) gives recv/hello.c (the handshake), recv/fence.c (the writers'
 * fences) and recv/recv.c (the messages). The initiator's side (xfer/) never includes it.
 */
#ifndef KVX_RCONN_H
#define KVX_RCONN_H

#include "conn/kvx_conn.h"

/*
 * Resource bounds (docs/security.md, "Resource bounds"). UCX's active messages cannot be paused
 * per connection, so a connection whose replies cannot leave (its writer does not drain) is
 * closed once one of its queues is full (conns_overflow), and its writer's transfers on it fail.
 * Per connection: KVX_SEND_WINDOW + KVX_ACK_WINDOW messages in UCX's hands, KVX_ACKS_MAX
 * acknowledgements, KVX_SERVE_MAX read requests, KVX_CTL_MAX control messages. All connections
 * together: KVX_RQ_MAX bytes of that (past it, the connection holding the most is closed:
 * rconn.c, with the slots and the rates of new connections).
 */
#define KVX_RCONNS_MAX 4096                  /* connections from writers, at most */
#define KVX_RCONNS_PER_WRITER 1024           /* ... of one writer's name: a quarter */
#define KVX_WRITERS_MAX (2 * KVX_RCONNS_MAX) /* names: room for new ones while slots turn over */
#define KVX_HELLOS_MAX 64                    /* handshakes waiting for kvx_recv_work */
#define KVX_HELLOS_PER_NAME 16 /* ... of one writer's name (those its rate holds back wait) */
#define KVX_SERVE_MAX 64       /* read requests queued per connection (an initiator sends 16) */
#define KVX_CTL_MAX 256        /* control messages queued per connection */
#define KVX_SEND_WINDOW 16     /* messages of one connection UCX may hold */
#define KVX_ACK_WINDOW 8       /* ... and this many more, of acknowledgements only */
/* tcp connections closed while UCX holds replies of theirs whose endpoints wait (kvx_rconn_close),
 * at most: each holds at most KVX_SEND_WINDOW + KVX_ACK_WINDOW messages */
#define KVX_LINGER_MAX 256
/* With a secret, a connection must prove it within this (else it is closed, drop_unproven). */
#define KVX_PROOF_WAIT_NS (2000ull * 1000000ull)

typedef struct kvx_hello {
    kvx_list_t link;
    bool retired;          /* it presents a retired capability: it is refused */
    kvx_came_on_t came_on; /* the endpoint it came on (kvx_ucx_came_on) */
    char name[KVX_NAME_MAX + 1];
    size_t len;
    uint8_t buf[];
} kvx_hello_t;

/* A small message waiting to be sent (HELLO_ACK, FENCE, NOTICE_ACK, a refused read). */
typedef struct kvx_ctl {
    kvx_list_t link;
    size_t len;
    uint8_t hdr[KVX_WIRE_HELLO_ACK_LEN]; /* the largest of them */
} kvx_ctl_t;

/* A read request being answered: its runs, and how far the answer got. rc->serve holds them
 * highest priority first, in arrival order within a level, except that a request is passed over
 * at most KVX_SERVE_PASS_MAX times (kvx_recv_read_req): none starves. */
#define KVX_SERVE_PASS_MAX 8
typedef struct kvx_serve {
    kvx_list_t link;
    uint64_t xfer_id, stream_off;
    bool crc;
    uint8_t prio;        /* the request's (enum kvx_priority) */
    uint8_t passed;      /* requests answered ahead of it though they came later */
    uint32_t nruns, run; /* the next byte to send: runs[run], at run_off */
    uint64_t run_off;
    kvx_wire_run_t runs[];
} kvx_serve_t;

static inline void kvx_count(kvx_transport_t *t, kvx_writer_t *w, size_t field)
{
    ((uint64_t *)&t->core.rcounters)[field]++;
    if (w != NULL)
        ((uint64_t *)&w->counters)[field]++;
}
#define KVX_CNT(f) (offsetof(kvx_recv_counters_t, f) / sizeof(uint64_t))

/* ---- rconn.c: writers, receiving connections, slots and bounds ------------------------------ */

/* The writer of that name, made on its first connection (NULL: none can be given up, or out of
 * memory); its fence records dropped; the writer freed. */
kvx_writer_t *kvx_writer_get(kvx_transport_t *t, const char *name);
void kvx_writer_drop_fences(kvx_transport_t *t, kvx_writer_t *w);
void kvx_writer_free(kvx_transport_t *t, kvx_writer_t *w);
/* What a receiving connection's endpoint reports (kvx_ucx_ep_open). */
extern const kvx_ep_ops_t kvx_rconn_ep_ops;
void kvx_rconn_want_work(kvx_rconn_t *rc); /* it has something to send: kvx_recv_work */
void kvx_rconn_maybe_free(kvx_rconn_t *rc);
void kvx_rconn_end_linger(kvx_rconn_t *rc);
/* Stop accepting its messages and close its endpoint (over tcp, it may linger first). */
void kvx_rconn_close(kvx_rconn_t *rc);
void kvx_rconn_doom(kvx_rconn_t *rc, const char *why); /* over a bound: kvx_recv_work closes it */
/* ... and the same, not counted as an overflow: a rendezvous receive that ended badly */
void kvx_rconn_abort(kvx_rconn_t *rc, const char *why);
/* The connection a message names, if its token matches; NULL (counted) otherwise. */
kvx_rconn_t *kvx_rconn_of(kvx_transport_t *t, const kvx_msg_t *m);
/* Queue a small message (at most KVX_WIRE_HELLO_ACK_LEN): 0, or -ENOBUFS (it is doomed). */
int kvx_rconn_ctl(kvx_rconn_t *rc, const uint8_t *hdr, size_t len);
/* Connection slots and the bounds over all connections. Slots give way in the order of
 * rslots[]: unproven, fresh (no transfer completed yet), active (least recently first). */
enum { KVX_SLOT_UNPROVEN = 0, KVX_SLOT_FRESH, KVX_SLOT_ACTIVE };
void kvx_rq_add(kvx_rconn_t *rc, size_t n); /* past the transport's bound, one is doomed */
void kvx_rq_sub(kvx_rconn_t *rc, size_t n);
/* May a HELLO of w open an endpoint now (the rates of new connections)? Takes it if so. */
bool kvx_hello_rate(kvx_transport_t *t, kvx_writer_t *w, uint64_t now);
void kvx_slots_init(kvx_transport_t *t);
void kvx_slot_set(kvx_rconn_t *rc, int cls, uint64_t now);
void kvx_rconn_active(kvx_rconn_t *rc); /* it completed (part of) a transfer */
/* The connection that gives way to a new one: of writer w (over its share), or of any. */
kvx_rconn_t *kvx_slot_victim(kvx_transport_t *t, kvx_writer_t *w, uint64_t now);

#endif
