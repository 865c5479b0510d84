/*
 * The receiving side's connections (conn/rconn.c; src/README.md): a receiving connection's life
 * below the messages it carries (the writers by name, its close, linger, doom and free, what its
 * endpoint reports, the replies it queues) and the bounds over all of them (what their reply
 * queues hold, which gives its slot to a new one, how fast HELLOs may open endpoints), as the
 * receiving side (recv/) sees them. The initiator's side (xfer/) never includes it.
 */
#ifndef KVX_RCONN_H
#define KVX_RCONN_H

#include "core/kvx_core.h"

typedef struct kvx_rconn kvx_rconn_t;
typedef struct kvx_writer kvx_writer_t;

/* The receiving side's connections of a transport, and their writers. */
typedef struct kvx_rconns {
    kvx_core_t *core;
    kvx_names_t writers;      /* by name */
    size_t nftags;            /* tag fence records of every writer (kvx_fence_rec_t) */
    kvx_idtab_t ids;          /* open connections by the id their messages carry */
    size_t nopen;             /* open connections */
    kvx_list_t all;           /* every connection not yet freed */
    kvx_list_t work;          /* connections with acknowledgements, read data or control to send */
    kvx_list_t slots[3];      /* open connections by eviction order: unproven, fresh, active */
    size_t qbytes;            /* the sum of their qbytes (lingering ones' excepted) */
    unsigned nlingering;      /* closed tcp connections whose endpoints wait for UCX */
    uint64_t hello_credit_ns; /* the transport's endpoint-open budget */
} kvx_rconns_t;

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
    kvx_named_t by_name;    /* in rconns->writers */
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
/* A rendezvous receive of write data: a WRITE whose payload comes by rendezvous, received
 * straight into the region after its header's checks (recv/ makes it, kvx_rconn_recv starts it
 * and lists it on its connection). done runs once UCX has ended it (status 0: its bytes are in
 * place), inside UCX progress, with the connection still allocated, and frees it. */
typedef struct kvx_write_rndv kvx_write_rndv_t;
struct kvx_write_rndv {
    kvx_list_t link; /* rc->write_rndvs, oldest first */
    uint64_t since_ns;
    uint64_t epoch, tag; /* the write's, as its header said (a fence may cover it) */
    uint64_t xfer_id;
    kvx_region_t *region; /* where: a run of this region checked by the header's checks */
    uint64_t off;
    uint32_t len;
    uint32_t crc;
    bool check_crc;
    void (*done)(kvx_rconn_t *rc, kvx_write_rndv_t *wr, int status);
};

struct kvx_rconn {
    kvx_rconns_t *rconns;
    kvx_core_t *core;
    uint32_t id;
    uint64_t token;
    kvx_writer_t *w;
    uint32_t peer_conn_id; /* our messages to the writer carry its id and token */
    uint64_t peer_token;
    int state;       /* kvx_conn_state */
    int pending_err; /* UCX reported it failed: closed by the next step, outside UCX's call */
    unsigned ucx_refs;
    unsigned sending;         /* messages of ours UCX holds (acks, read data) */
    unsigned data_sending;    /* ... of them, READ_DATA reading a region (held by it) */
    bool crc_reads;           /* the reader asked for checksums */
    uint32_t nacks, acks_cap; /* acknowledgements to send: {transfer id, bytes, status} */
    uint8_t *acks;
    kvx_list_t serve; /* read requests to answer: by priority (kvx_recv_serve_queue) */
    unsigned nserve;
    kvx_list_t ctl; /* small messages to send (HELLO_ACK, FENCE, NOTICE_ACK) */
    unsigned nctl;
    size_t qbytes;        /* what it has queued and UCX holds of it (the bounds, rconn.c) */
    bool doomed;          /* over a bound: closed by the next step, its messages refused */
    bool tcp;             /* its lane is tcp: closed only once UCX holds none of its messages */
    bool lingering;       /* closing: its endpoint waits for that (or its failure) to close */
    bool proven;          /* the writer proved the secret over nonce (always, without one) */
    uint8_t slot_class;   /* which of rconns->slots it is in: unproven, fresh or active */
    uint64_t since_ns;    /* made (or proven) at; last active at, once active */
    uint8_t nonce[16];    /* KVX_WIRE_NONCE_LEN: what its PROOF must cover */
    kvx_list_t slot_link; /* rconns->slots[slot_class], oldest first */
    size_t seg;           /* a message's size on its lane */
    kvx_list_t work_link; /* rconns->work */
    kvx_list_t w_link;    /* w->rconns (or the receiving side's refusing list) */
    kvx_list_t all_link;  /* rconns->all: until freed */
    kvx_ucx_ep_t *ucx;
    kvx_list_t write_rndvs; /* rendezvous receives of write data in flight, oldest first */
    unsigned nwrite_rndvs;
    uint64_t write_rndv_done_ns; /* when one of them last ended (their progress: kvx_stalled) */
    /* read runs of at least this many bytes are answered by rendezvous (UINT64_MAX: none; set
     * at its HELLO from this transport's mode, its lanes and whether the reader takes them) */
    uint64_t rndv_min;

    /* made only to refuse a HELLO of a retired capability (linked by w_link on a list of those) */
    bool refusing;
};

/* The most rendezvous receives in flight on one connection (an initiator keeps at most
 * KVX_MAX_REQS messages in UCX's hands): past it the connection closes. */
#define KVX_WRITE_RNDVS_PER_CONN 32
/* What one counts in the receiving side's bound over all connections' queues (its record and
 * UCX's request for it). */
#define KVX_WRITE_RNDV_COST 512

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
    kvx_region_t *region; /* the runs are offsets into it (held: kvx_region_get) */
    kvx_wire_run_t runs[];
} kvx_serve_t;

static inline void kvx_count(kvx_core_t *core, kvx_writer_t *w, size_t field)
{
    ((uint64_t *)&core->rcounters)[field]++;
    if (w != NULL)
        ((uint64_t *)&w->counters)[field]++;
}
#define KVX_CNT(f) (offsetof(kvx_recv_counters_t, f) / sizeof(uint64_t))

/* ---- writers (rconn.c) ---------------------------------------------------------------------- */

/* The writer of that agent name, or NULL. */
kvx_writer_t *kvx_writer_lookup(const kvx_rconns_t *rs, const char *name);
/* Every writer in turn: the first with w NULL and *slot 0, then the one after w; NULL at the
 * end. */
kvx_writer_t *kvx_writer_next(const kvx_rconns_t *rs, size_t *slot, const kvx_writer_t *w);
/* The writer of that name, made on its first connection (NULL: none can be given up, or out of
 * memory); its fence records dropped; the writer freed. */
kvx_writer_t *kvx_writer_get(kvx_rconns_t *rs, const char *name);
void kvx_writer_drop_fences(kvx_rconns_t *rs, kvx_writer_t *w);
void kvx_writer_free(kvx_rconns_t *rs, kvx_writer_t *w);

/* ---- a receiving connection (rconn.c) ------------------------------------------------------- */

void kvx_rconns_init(kvx_rconns_t *rs, kvx_core_t *core);
/* A receiving connection of writer w for HELLO m (its connection id and token), on no list yet
 * (zeroed, its lists empty), or NULL: no memory. */
kvx_rconn_t *kvx_rconn_alloc(kvx_rconns_t *rs, kvx_writer_t *w, const kvx_msg_t *m);
/* What a receiving connection's endpoint reports (kvx_ucx_ep_accept). */
extern const kvx_ep_ops_t kvx_rconn_ep_ops;
void kvx_rconn_want_work(kvx_rconn_t *rc); /* it has something to send: the next step's */
void kvx_rconn_maybe_free(kvx_rconn_t *rc);
void kvx_rconn_end_linger(kvx_rconn_t *rc);
/* Stop accepting its messages and close its endpoint (over tcp, it may linger first). */
void kvx_rconn_close(kvx_rconn_t *rc);
void kvx_rconn_doom(kvx_rconn_t *rc, const char *why); /* over a bound: the next step closes it */
/* ... and the same, not counted as an overflow: a rendezvous receive that ended badly */
void kvx_rconn_abort(kvx_rconn_t *rc, const char *why);
/* The connection a message names, if its token matches; NULL (counted) otherwise. */
kvx_rconn_t *kvx_rconn_of(kvx_rconns_t *rs, const kvx_msg_t *m);
/* Queue a small message (at most KVX_WIRE_HELLO_ACK_LEN): 0, or -ENOBUFS (it is doomed). */
int kvx_rconn_ctl(kvx_rconn_t *rc, const uint8_t *hdr, size_t len);
/* Start a rendezvous receive of wr->len bytes of the region at wr->off (checked by the caller)
 * for a message of rc whose payload descriptor is desc: 0 (landed at once: wr->done has not run,
 * the caller finishes), 1 (in flight: wr->done follows), or a negative errno (nothing received). */
int kvx_rconn_recv(kvx_rconn_t *rc, kvx_write_rndv_t *wr, void *desc);

/* ---- slots and bounds over all connections (rconn.c) ---------------------------------------- */

/* Connection slots and the bounds over all connections. Slots give way in the order of
 * slots[]: unproven, fresh (no transfer completed yet), active (least recently first). */
enum { KVX_SLOT_UNPROVEN = 0, KVX_SLOT_FRESH, KVX_SLOT_ACTIVE };
void kvx_rq_add(kvx_rconn_t *rc, size_t n); /* past the transport's bound, one is doomed */
void kvx_rq_sub(kvx_rconn_t *rc, size_t n);
/* May a HELLO of w open an endpoint now (the rates of new connections)? Takes it if so. */
bool kvx_hello_rate(kvx_rconns_t *rs, kvx_writer_t *w, uint64_t now);
void kvx_slot_set(kvx_rconn_t *rc, int cls, uint64_t now);
void kvx_rconn_active(kvx_rconn_t *rc); /* it completed (part of) a transfer */
/* The connection that gives way to a new one: of writer w (over its share), or of any. */
kvx_rconn_t *kvx_slot_victim(kvx_rconns_t *rs, kvx_writer_t *w, uint64_t now);

/* ---- every connection (rconn.c) ------------------------------------------------------------- */

/* Periodic: connections whose rendezvous receives stalled past the stall limit close. */
void kvx_rconns_housekeeping(kvx_rconns_t *rs, uint64_t now);
/* Work only polling advances: connections with something to send, or messages UCX holds. */
bool kvx_rconns_need_polling(const kvx_rconns_t *rs);
/* At close: every receiving connection closes (UCX still runs); whether any is still closing
 * (or UCX still holds a request of one); everything freed (the worker is gone: no callback will
 * come). */
void kvx_rconns_close_all(kvx_rconns_t *rs);
bool kvx_rconns_closing(const kvx_rconns_t *rs);
void kvx_rconns_free_all(kvx_rconns_t *rs);

#endif /* KVX_RCONN_H */
