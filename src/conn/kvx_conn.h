/*
 * Connections (src/README.md): the initiator's (conn.c) and the receiving side's (rconn.c). A
 * connection's life: open, handshake, failure, linger, close, free. What happens to it reaches
 * its owner through the kvx_conn_ops_t it was opened with (the initiator's) or the work lists
 * the sides drain (the receiving side's).
 */
#ifndef KVX_CONN_H
#define KVX_CONN_H

#include "core/kvx_objects.h"

/* ---- the initiator's connections (conn.c) ------------------------------------------------ */

/* A read request in flight: its part of the stream, and where the next byte of it lands. */
typedef struct kvx_rreq {
    uint64_t xfer_id; /* 0: free */
    uint64_t stream_off;
    uint64_t len;
    uint64_t got;
    uint32_t run; /* the local run, and offset in it, of stream byte stream_off + got */
    uint64_t run_off;
} kvx_rreq_t;

/* Operations kvx keeps in UCX's hands per connection at most (back-pressure): messages posted
 * and not yet sent, and read requests not yet answered. While nothing of a higher level is
 * queued, KVX_PRIO_LOW transfers use at most KVX_LOW_REQS of them: one that comes finds room. */
#define KVX_MAX_REQS 16
#define KVX_LOW_REQS 12
/* ... and at most this many bytes posted and not yet acknowledged (or arrived, for reads): what
 * UCX and the lane hold ahead of a higher transfer (a shared-memory FIFO takes 8 MiB of 32 KiB
 * segments here, and drains in order). Measured with kvx-bench --hol: 1 MiB left the bulk's rate
 * unchanged over shm and tcp here, and an urgent write's p50 behind it went from 0.84 ms to
 * 0.17-0.2 ms on shm. KVX_PRIO_NORMAL transfers keep to the same window for KVX_HIGH_RECENT_NS
 * after a KVX_PRIO_HIGH one was queued on the connection: a user who marks only the urgent
 * transfers gets the same bound, one who never uses HIGH sees no window. */
#define KVX_LOW_WINDOW ((uint64_t)1024 * 1024)
#define KVX_HIGH_RECENT_NS (100ull * 1000000ull)

/* A READ_DATA whose payload comes by rendezvous, being received straight into a read's local
 * blocks (xfer.c starts it, after checking it against the read's request; the connection's
 * endpoint reports its end through on_received). Listed on its connection until UCX ends it,
 * which closing the connection's endpoint forces. */
typedef struct kvx_rrx {
    kvx_list_t link; /* c->rrxs, oldest first */
    uint64_t since_ns;
    uint64_t xfer_id;
    uint8_t *dest; /* where in the read's local blocks */
    uint32_t len;
    uint32_t crc;
    bool check_crc;
} kvx_rrx_t;
/* Rendezvous receives in flight stalled: the oldest began (since_ns) and none ended (done_ns)
 * for longer than stall_ns. UCX says nothing of a receive until it ends, so a slow but moving
 * sender shows as receives that end: only a piece that alone takes longer than the stall limit
 * (4 MiB at under 2 MB/s with the default 2 s) trips it. */
static inline bool kvx_stalled(uint64_t since_ns, uint64_t done_ns, uint64_t now, uint64_t stall_ns)
{
    uint64_t last = done_ns > since_ns ? done_ns : since_ns;
    return now > last && now - last > stall_ns;
}

/* The most rendezvous receives in flight on one connection (a kvx target keeps at most 16 of its
 * messages in UCX's hands): past it the connection fails. */
#define KVX_RRXS_PER_CONN 32

/*
 * The initiator's side of a peer: one UCX endpoint to the peer's worker. It is OPEN from
 * kvx_peer_add on; the handshake (HELLO, answered with HELLO_ACK: the receiver's id and token
 * for this connection) completes in the background (wired). A failure makes it CLOSING (the
 * endpoint closing, forced) then CLOSED. No API call waits for any of this with the transport
 * lock held: they wait on t->core.cond, which progress signals.
 */
struct kvx_conn {
    kvx_transport_t *t;
    const kvx_conn_ops_t *ops; /* what its owner hears (kvx_conn_open) */
    kvx_peer_t *peer;          /* NULL until kvx_peer_add installs it, and once detached */
    int state;
    bool wired;                /* the receiver answered the handshake */
    bool lingering;            /* failed over tcp with sends UCX holds: its endpoint is closed
                                * once they left or UCX reports it failed (see kvx_conn_fail) */
    bool linger_over;          /* ... which has happened: kvx_conn_handle_work closes it */
    int err;                   /* why it failed or closes */
    int pending_err;           /* an error reported by UCX, handled outside UCX callbacks */
    unsigned pins;             /* API calls waiting on this connection: it is not freed meanwhile */
    uint64_t last_progress_ns; /* last sign of life from the peer on this connection */
    kvx_host_id_t host;        /* the peer's process, when it runs on this host */
    bool watched;              /* same host: kvx checks that process is alive */
    int pidfd;                 /* its pidfd (-1: none, /proc is read instead) */
    uint32_t id;               /* messages to this connection carry id and token */
    uint64_t token;
    uint32_t rconn_id; /* ... and ours to the receiver carry its id and token */
    uint64_t rconn_token;
    uint64_t epoch; /* the receiver's fence epoch for us, as last heard */
    bool crc;       /* integrity: checksums on this connection's data */
    size_t seg;     /* a message's size on this connection's lane */
    /* runs of at least this many bytes go by rendezvous (UINT64_MAX: none; none before the
     * HELLO_ACK says whether the receiver takes them: kvx_conn_wired) */
    uint64_t rndv_min;
    kvx_lanes_t lanes; /* its endpoint's lanes, as kvx_conn_open found them */
    uint64_t remote_base;
    uint64_t remote_num_blocks;
    uint64_t remote_len; /* bytes of its region */
    uint64_t generation; /* its metadata's: when the peer's transport was created */
    uint8_t capability[16];
    char agent_name[KVX_NAME_MAX + 1];
    char transport[KVX_TRANSPORT_NAME_MAX];
    int rma_hw;
    uint8_t *mapped;       /* the peer's owned region, mapped here: copies, no messages (xfer.c) */
    uint8_t *unproven;     /* ... mapped, until its HELLO_ACK's token matches its segment's */
    uint8_t seg_token[16]; /* the token its segment holds (KVX_SEG_TOKEN_LEN) */
    kvx_list_t queue[KVX_PRIO_LEVELS]; /* QUEUED transfers per priority, in submission order */
    int64_t credit[KVX_PRIO_LEVELS];   /* bytes each level may still post this round (xfer.c) */
    kvx_list_t waiting;                /* WAITING transfers */
    unsigned reqs;    /* messages UCX holds and read requests unanswered (back-pressure) */
    uint64_t unacked; /* bytes posted and not yet acknowledged or arrived */
    uint64_t unacked_lvl[KVX_PRIO_LEVELS]; /* ... of them, per level (KVX_LOW_WINDOW) */
    uint64_t high_ns; /* when a KVX_PRIO_HIGH transfer was last queued here (0: never) */
    unsigned notices; /* notices sent and not yet answered */
    kvx_rreq_t rreqs[KVX_MAX_REQS];
    kvx_list_t rrxs; /* rendezvous receives of read data in flight (kvx_rrx_t), oldest first */
    unsigned nrrxs;
    uint64_t rrx_done_ns; /* when one of them last ended (their progress: kvx_stalled) */
    unsigned ucx_refs;    /* UCX callbacks still to come that name this connection */
    kvx_list_t work_link; /* t->work: has queued runs to post or an error to handle */
    kvx_list_t all_link;  /* t->conns */
    kvx_list_t fail_link; /* a local list of connections to fail */
    kvx_ucx_ep_t *ucx;
};

/* What a connection tells its owner, from kvx_conn_open on (the lock held; on_sent inside UCX
 * progress, the others outside it). */
struct kvx_conn_ops {
    /* UCX is done with a message of the connection's (xfer_id: the transfer it carried, or 0) */
    void (*on_sent)(kvx_conn_t *c, uint64_t xfer_id, int status);
    /* the progress step serves a connection that asked for work: runs to post */
    void (*on_work)(kvx_conn_t *c);
    /* it fails (once, in kvx_conn_fail, before its endpoint closes): its transfers go */
    void (*on_failed)(kvx_conn_t *c, int err);
    /* a rendezvous receive of read data ended (inside UCX progress; rx is off c->rrxs and the
     * owner's to free): status 0, its bytes are in place; else they may be partly there */
    void (*on_received)(kvx_conn_t *c, kvx_rrx_t *rx, int status);
};

/* A new connection from md: its process watched when on this host, its endpoint, its mapping of
 * an owned region, listed, and its handshake sent. Not yet any peer's. Returns 0 with *c_p set,
 * or a negative errno (logged for peer_id) with nothing of it left to the caller. */
int kvx_conn_open(kvx_transport_t *t, const char *peer_id, const kvx_md_t *md,
                  const kvx_conn_ops_t *ops, kvx_conn_t **c_p);
/* The receiver answered the handshake (its HELLO_ACK, status 0, ack_flags its flags): runs go
 * by rendezvous from now on as this transport's mode, the lanes and the receiver agree (it takes
 * rendezvous payloads: KVX_MSGF_RNDV), said at debug level with the reason. */
void kvx_conn_wired(kvx_conn_t *c, unsigned ack_flags);
/* Start a rendezvous receive of rx->len bytes into rx->dest (checked by the caller) for a
 * message of c whose payload descriptor is desc, from inside its handler: 0 (landed at once: rx
 * is the caller's again), 1 (in flight, listed on c: the owner's on_received follows, and may
 * have run before this returns), or a negative errno (nothing received; -EBUSY: over
 * KVX_RRXS_PER_CONN). */
int kvx_conn_recv(kvx_conn_t *c, kvx_rrx_t *rx, void *desc);
/* Fault a mapped region's pages in (lock released meanwhile; c pinned by the caller). */
void kvx_conn_prefault(kvx_conn_t *c);
void kvx_conn_fail(kvx_conn_t *c, int err);
void kvx_conn_end_linger(kvx_conn_t *c);
void kvx_conn_release(kvx_conn_t *c, int err);
void kvx_conn_handle_work(kvx_conn_t *c);
void kvx_conn_maybe_free(kvx_conn_t *c);
/* The HELLO_ACK's segment token: a mapping still unproven is used if it is its segment's, and
 * let go of (counted, logged) if not. */
void kvx_conn_map_prove(kvx_conn_t *c, const uint8_t *token);
void kvx_conn_housekeeping(kvx_transport_t *t, uint64_t now);
bool kvx_conn_busy(const kvx_conn_t *c);
/* Bytes of transfer x posted on c (add), or acknowledged, arrived or let go of (sub). */
static inline void kvx_conn_unacked_add(kvx_conn_t *c, const kvx_xfer_t *x, uint64_t n)
{
    c->unacked += n;
    c->unacked_lvl[x->prio] += n;
}
static inline void kvx_conn_unacked_sub(kvx_conn_t *c, const kvx_xfer_t *x, uint64_t n)
{
    c->unacked -= n;
    c->unacked_lvl[x->prio] -= n;
}
/* Ask the next progress step to work on c (kvx_conn_handle_work: post what is queued, act on
 * an error, end a linger); once, however often asked. */
void kvx_conn_want_work(kvx_conn_t *c);
/* Whether any transfer is QUEUED on c (at any priority). */
static inline bool kvx_conn_queued(const kvx_conn_t *c)
{
    for (int l = 0; l < KVX_PRIO_LEVELS; l++)
        if (!kvx_list_empty(&c->queue[l]))
            return true;
    return false;
}

/* What the connection's endpoint reports (conn.c's table of it), inside UCX progress. */
void kvx_on_conn_error(kvx_conn_t *c, int status);
void kvx_on_conn_closed(kvx_conn_t *c);

/* ---- the receiving side's connections (rconn.c) ---------------------------------- */

/*
 * The fences of a writer. A message it stamped with epoch e is dropped iff a fence made after e
 * covered its tag: the latest fence of every tag (fence_all), or the latest fence of that very
 * tag (ftags, sorted by tag, one record per distinct tag). A fence of every tag makes the tag
 * records moot (they are freed), and so does a writer with no connection (a new connection
 * starts at the current epoch). At most KVX_FENCE_WRITER_TAGS_MAX records per writer and
 * KVX_FENCE_TOTAL_TAGS_MAX over all: a fence that would need more fails and fences nothing.
 */
typedef struct kvx_fence_rec {
    uint64_t tag;
    uint64_t at_epoch;
} kvx_fence_rec_t;

/* One remote transport (an agent name) that connected to this one to write or read. */
struct kvx_writer {
    char name[KVX_NAME_MAX + 1];
    kvx_writer_t *hnext;
    uint64_t epoch;         /* bumped by each kvx_fence of this writer */
    uint64_t fence_all;     /* epoch of its latest fence of every tag (0: none) */
    kvx_fence_rec_t *ftags; /* its latest fence of each tag fenced alone, sorted by tag */
    uint32_t nftags, ftags_cap;
    kvx_list_t rconns; /* its open connections */
    unsigned live;     /* its connections not yet freed, closing ones too: it stays while any */
    unsigned nopen;    /* its open connections (at most KVX_RCONNS_PER_WRITER) */
    uint64_t hello_credit_ns; /* its endpoint-open budget: refilled with time (rconn.c) */
    kvx_recv_counters_t counters;
};

/* A connection from a writer: made when its HELLO arrives with our capability. Acknowledgements
 * go out in messages of KVX_ACK_BATCH entries; at most KVX_ACKS_MAX wait at once. */
#define KVX_ACK_BATCH 256
#define KVX_ACKS_MAX 65536
/* A rendezvous receive in flight on a receiving connection: the side that started it
 * (kvx_rconn_recv) embeds this in its own record, and done runs once UCX has ended it (status 0:
 * its bytes are in place), inside UCX progress, with the connection still allocated. */
typedef struct kvx_rx kvx_rx_t;
struct kvx_rx {
    kvx_list_t link; /* rc->rxs, oldest first */
    uint64_t since_ns;
    uint64_t epoch, tag; /* the write's, as its header said (a fence may cover it) */
    void (*done)(kvx_rconn_t *rc, kvx_rx_t *rx, int status);
};

struct kvx_rconn {
    kvx_transport_t *t;
    uint32_t id;
    uint64_t token;
    kvx_writer_t *w;
    uint32_t peer_conn_id; /* our messages to the writer carry its id and token */
    uint64_t peer_token;
    int state;       /* kvx_conn_state */
    int pending_err; /* UCX reported it failed: closed by kvx_recv_work, outside UCX's call */
    unsigned ucx_refs;
    unsigned sending;         /* messages of ours UCX holds (acks, read data) */
    bool crc_reads;           /* the reader asked for checksums */
    uint32_t nacks, acks_cap; /* acknowledgements to send: {transfer id, bytes, status} */
    uint8_t *acks;
    kvx_list_t serve; /* read requests to answer: by priority (kvx_recv_serve_queue) */
    unsigned nserve;
    kvx_list_t ctl; /* small messages to send (HELLO_ACK, FENCE, NOTICE_ACK) */
    unsigned nctl;
    size_t qbytes;        /* what it has queued and UCX holds of it (the bounds of rconn.c) */
    bool doomed;          /* over a bound: closed by kvx_recv_work, its messages refused */
    bool tcp;             /* its lane is tcp: closed only once UCX holds none of its messages */
    bool lingering;       /* closing: its endpoint waits for that (or its failure) to close */
    bool proven;          /* the writer proved the secret over nonce (always, without one) */
    uint8_t slot_class;   /* which of t->rslots it is in: unproven, fresh or active */
    uint64_t since_ns;    /* made (or proven) at; last active at, once active */
    uint8_t nonce[16];    /* KVX_WIRE_NONCE_LEN: what its PROOF must cover */
    kvx_list_t slot_link; /* t->rslots[slot_class], oldest first */
    size_t seg;           /* a message's size on its lane */
    kvx_list_t work_link; /* t->rwork */
    kvx_list_t w_link;    /* w->rconns */
    kvx_list_t all_link;  /* t->rconns: until freed */
    kvx_ucx_ep_t *ucx;
    kvx_list_t rxs; /* rendezvous receives in flight (kvx_rx_t), oldest first */
    unsigned nrxs;
    uint64_t rx_done_ns; /* when one of them last ended (their progress: kvx_stalled) */
    /* read runs of at least this many bytes are answered by rendezvous (UINT64_MAX: none; set
     * at its HELLO from this transport's mode, its lanes and whether the reader takes them) */
    uint64_t rndv_min;

    /* made only to refuse a HELLO of a retired capability (linked by w_link in t->refusing) */
    bool refusing;
};

/* The most rendezvous receives in flight on one connection (an initiator keeps at most
 * KVX_MAX_REQS messages in UCX's hands): past it the connection closes. */
#define KVX_RXS_PER_CONN 32
/* What one counts in the receiving side's bound over all connections' queues (its record and
 * UCX's request for it). */
#define KVX_RX_COST 512
/* Start a rendezvous receive of len bytes of the region at off (checked by the caller) for a
 * message of rc whose payload descriptor is desc: 0 (landed at once: rx->done has not run, the
 * caller finishes), 1 (in flight: rx->done follows), or a negative errno (nothing received). */
int kvx_rconn_recv(kvx_rconn_t *rc, kvx_rx_t *rx, void *desc, uint64_t off, size_t len);
/* Periodic: connections whose rendezvous receives stalled past the stall limit close. */
void kvx_rconn_housekeeping(kvx_transport_t *t, uint64_t now);

/* The writer of that agent name, or NULL (rconn.c). */
kvx_writer_t *kvx_writer_lookup(const kvx_transport_t *t, const char *name);
/* At close: every receiving connection closes (rconn.c). */
void kvx_recv_close_all(kvx_transport_t *t);

#endif /* KVX_CONN_H */
