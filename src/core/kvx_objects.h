/*
 * The objects every layer shares, and the state layers under the backend (src/README.md):
 * the transport, its peers and transfers (their structs), the tables of peers and connection ids
 * (table.c), the wake-ups (notify.c), the counters (stats.c), transfer objects and their
 * completion queues (cq.c). Connections are kvx_conn.h's, the backend kvx_ucx.h's. The
 * transport's fields are grouped by the layer that owns them.
 */
#ifndef KVX_OBJECTS_H
#define KVX_OBJECTS_H

#include "ucx/kvx_ucx.h"

/* ---- objects -------------------------------------------------------------------------------- */

typedef struct kvx_peer kvx_peer_t;
typedef struct kvx_conn kvx_conn_t;
typedef struct kvx_xfer kvx_xfer_t;
typedef struct kvx_rconn kvx_rconn_t;
typedef struct kvx_writer kvx_writer_t;
typedef struct kvx_pairing kvx_pairing_t;
typedef struct kvx_conn_ops kvx_conn_ops_t; /* what a connection tells its owner (conn.c) */

enum kvx_op { KVX_OP_WRITE = 0, KVX_OP_READ = 1 };

/* A run of blocks consecutive on both sides. */
typedef struct kvx_run {
    uint32_t local;
    uint32_t remote;
    uint32_t count;
} kvx_run_t;

/*
 * Life of a transfer (the initiator's side):
 *   QUEUED   in conn->queue[prio]; its byte stream (its runs, in order) is handed to UCX in
 *            messages from posted = 0 up; a write's WRITE messages, a read's READ_REQ ones
 *   WAITING  every byte posted: in conn->waiting, until the receiver has acknowledged them all
 *            (a write; with KVX_XFER_PARAM_NOTIFY, then its notice) or they all arrived (a read)
 *   ENDING   a write that failed (or finished) while UCX still held messages of it, which read
 *            its local blocks: it is reported once UCX has let go of them (kvx_xfer_on_sent), so
 *            that the caller never reuses blocks UCX still reads; if UCX does not within
 *            KVX_END_GRACE_NS (the stall limit when shorter), its connection fails, which makes
 *            UCX let go (and a close that does not is waited for KVX_END_GRACE_NS more)
 *   DONE     finished, waiting in peer->cq for poll
 * UCX never holds a pointer to a transfer: messages in its hands name their connection and the
 * transfer's id, so a transfer can fail or be forgotten at any time. A reply for a transfer
 * that is gone is dropped: a failed read's local blocks never change after its failure.
 */
enum kvx_xfer_state { KVX_XS_FREE = 0, KVX_XS_QUEUED, KVX_XS_WAITING, KVX_XS_ENDING, KVX_XS_DONE };
#define KVX_END_GRACE_NS (200ull * 1000000ull)

struct kvx_xfer {
    kvx_transport_t *t;
    uint64_t id;
    uint8_t state;
    uint8_t op;
    uint8_t prio; /* enum kvx_priority: its queue on its connection */
    bool canceled;
    bool purged;          /* its peer was removed with KVX_PEER_REMOVE_PURGE: never reported */
    bool notify;          /* a write whose receiver is told when all of it landed */
    bool noticed;         /* its notice was sent; NOTICE_ACK completes it */
    uint32_t cancel_call; /* the kvx_xfer_cancel call that last reported it (dedupes ids) */
    kvx_peer_t *peer;
    kvx_conn_t *conn;
    kvx_list_t conn_link;   /* conn->queue[prio] / waiting, or peer->cq when DONE */
    kvx_list_t active_link; /* t->active: every transfer not yet DONE, for deadlines */
    kvx_run_t *runs;
    uint32_t nruns, next_run, runs_cap;
    uint64_t run_off; /* bytes of runs[next_run] already posted */
    uint64_t posted;  /* bytes of the stream posted */
    uint64_t done;    /* bytes acknowledged (write) or arrived (read) */
    uint32_t sending; /* its messages UCX still holds (their iov points into its local blocks) */
    uint64_t tag;
    uint64_t epoch; /* the receiver's fence epoch this transfer was submitted under */
    int status;
    int end_status; /* ENDING: the status it will be reported with */
    uint64_t bytes;
    uint64_t t_submit_ns;
    uint64_t t_done_ns;
    uint64_t deadline_ns; /* absolute; 0 = none */
    kvx_xfer_t *next_free;
};

struct kvx_peer {
    char *id;
    kvx_peer_t *hnext; /* hash chain */
    kvx_conn_t *conn;  /* NULL when removed */
    bool removed;
    /* of nxfers, those purged (kvx_xfer_purge: KVX_PEER_REMOVE_PURGE, KVX_PEER_ADD_PURGE),
     * forgotten as they end: a removed peer whose every transfer is purged is unknown
     * (kvx_peer_known), though the object stays until UCX has let go of them */
    uint64_t npurged;
    int last_err;
    kvx_list_t cq;         /* DONE transfers, oldest first */
    kvx_list_t ready_link; /* t->ready while cq is not empty */
    uint64_t nxfers;       /* transfers naming this peer that are not yet freed */
    uint64_t inflight;
    /* Adds and removes of this id take turns in call order (they wait with the lock released):
     * the call holding ticket turn_now runs, later ones wait. */
    uint64_t turn_next, turn_now;
    /* counters */
    uint64_t bytes_written, bytes_read, xfers_done, xfers_failed, lat_sum_ns, lat_max_ns;
    char last_agent[KVX_NAME_MAX + 1];
    uint64_t last_base, last_num_blocks, last_generation;
    /* the caller's kvx_peer_params_t of the add or connect that installed the connection
     * (field_mask 0: none): a reconnection's metadata passes the same checks */
    kvx_peer_params_t expect;
    /* paired by address (kvx_peer_connect): where it listens, and, once its connection failed,
     * the pairing again (listen.c) */
    char *addr;
    bool reconnecting;
    uint64_t next_try_ns, backoff_ns;
    kvx_pairing_t *pg;         /* the attempt under way */
    kvx_list_t reconnect_link; /* t->reconnects */
    kvx_list_t parked;         /* transfers submitted meanwhile (QUEUED, no connection) */
    kvx_stats_t stats;         /* stats.c */
};

/* Transfer ids in flight or waiting for poll, for cancel: an open-addressing table. */
typedef struct kvx_idmap {
    kvx_xfer_t **slots;
    size_t cap; /* a power of two, or 0 */
    size_t count;
} kvx_idmap_t;

/* Connections by the id their messages carry: a table of pointers, ids reused after free. */
typedef struct kvx_idtab {
    void **slots;
    uint32_t cap;
    uint32_t free_hint;
} kvx_idtab_t;

/* Retired capabilities remembered (older ones are dropped like any unknown one). */
#define KVX_RETIRED_MAX 8

/* After the last sign of activity a progress loop keeps polling this long before it arms the
 * event fd and sleeps: on tcp, arming after every empty progress costs ~50x more wake-ups. */
#define KVX_SPIN_NS 100000ull

struct kvx_transport {
    kvx_logger_t log; /* first: log.c sees only this (kvx_base.h) */
    /* the transport's own: lock, close, its region and settings (transport.c) */
    pthread_mutex_t lock;
    pthread_cond_t cond;     /* progress signals connection events to API calls waiting */
    atomic_int lock_waiters; /* API calls waiting for the lock: the progress thread yields */
    bool closed;             /* set when close begins: every later call returns -ESHUTDOWN */
    bool close_done;         /* the teardown has finished (a second close waits for it) */
    unsigned busy;           /* API calls waiting on t->cond with the lock released */
    bool conn_event;         /* a connection was wired, failed or closed since the last signal */

    char fingerprint[KVX_FINGERPRINT_MAX + 1];
    uint8_t *base;
    uint64_t num_blocks;
    uint64_t block_len;
    uint64_t region_len;
    bool owned;            /* kvx allocated the region (KVX_PARAM_OWN_REGION) */
    const void *rkey;      /* ... and its packed key, which maps it on this host's peers */
    uint8_t seg_token[16]; /* ... its segment's token (KVX_SEG_TOKEN_LEN; zero: none) */
    uint64_t maps_refused; /* peers' regions kvx would not map (kvx.h) */
    size_t rkey_len;
    uint64_t deadline_ns;
    uint64_t keepalive_ms;
    uint64_t stall_ns;
    unsigned num_threads;
    bool integrity;
    int rndv_mode;        /* kvx_rndv_mode (KVX_PARAM_RNDV) */
    uint64_t rndv_thresh; /* ... and its threshold (0: the lane's) */
    uint8_t *secret;      /* NULL: none */
    size_t secret_len;
    char *net_devices;
    kvx_host_id_t host;
    uint64_t generation;
    uint8_t capability[16];
    void *old_md; /* metadata buffers replaced while pairings may still be sending them */

    kvx_ucx_t *ucx;
    uint8_t *metadata;
    size_t metadata_len;

    /* peers by id, and the initiator's connections */
    kvx_peer_t **ptab;
    size_t ptab_cap;
    size_t npeers;     /* entries in ptab, removed ones included */
    size_t nconnected; /* peers with a connection */
    kvx_list_t ready;  /* peers with completions */
    kvx_list_t conns;  /* every connection not yet freed */
    kvx_list_t work;   /* connections with runs to post or an error to handle */
    kvx_idtab_t conn_ids;

    /* the receiving side: writers by name, their connections by id */
    /* capabilities kvx_fence_ex retired, newest first: a HELLO with one is refused, answered */
    uint8_t retired[KVX_RETIRED_MAX][16];
    unsigned nretired;
    struct kvx_seen_proof *seen; /* with a secret: HELLO proofs of the last seconds (hello.c) */
    kvx_list_t refusing;         /* connections made only to answer such a HELLO (at most 16) */
    size_t nftags;               /* tag fence records of every writer (kvx_fence_rec_t) */
    kvx_writer_t **wtab;
    size_t wtab_cap, nwriters;
    kvx_idtab_t rconn_ids;
    size_t nrconns;    /* open ones */
    kvx_list_t rconns; /* every one not yet freed */
    kvx_list_t rwork;  /* rconns with acknowledgements, read data or control to send */
    kvx_list_t hellos; /* HELLOs with a valid capability, handled after UCX progress */
    unsigned nhellos;
    kvx_list_t rslots[3];     /* open rconns by eviction order: unproven, fresh, active (rconn.c) */
    size_t rqbytes;           /* sum of their qbytes (lingering ones' excepted) */
    unsigned nlingering;      /* closed tcp connections whose endpoints wait for UCX (rconn.c) */
    uint64_t hello_credit_ns; /* the transport's endpoint-open budget (rconn.c) */
    kvx_recv_counters_t rcounters;
    kvx_notice_t *notices; /* a ring of notice_cap */
    size_t notice_cap, notice_head, notice_count;

    /* pairing by address (listen.c): the listener, and the pairings under way */
    bool listening;
    char listen_addr[KVX_ADDR_MAX];
    kvx_list_t pairings;
    bool pair_work;             /* a pairing has something for kvx_listen_work */
    unsigned naccepted;         /* pairings the listener accepted that are not yet freed */
    kvx_list_t reconnects;      /* peers paired by address whose connection failed */
    uint64_t next_reconnect_ns; /* when one of them is due (UINT64_MAX: none) */
    kvx_peer_event_t events[KVX_PEER_EVENTS_MAX]; /* a ring */
    size_t ev_head, ev_count;

    /* transfers: objects are pooled (free_xfers); the pool keeps what recent peaks needed */
    kvx_idmap_t ids;
    kvx_xfer_t *free_xfers;
    size_t nfree, nlive;              /* transfer objects in the pool / in use */
    size_t live_peak, live_peak_prev; /* the most in use in this and the previous period */
    uint64_t xfer_mallocs;            /* transfer objects allocated over the transport's life */
    uint64_t next_seq;
    uint32_t cancel_calls;
    kvx_list_t active;             /* transfers not yet DONE */
    uint64_t next_deadline_ns;     /* earliest deadline in active, or later; UINT64_MAX = none */
    uint64_t next_housekeeping_ns; /* stall and liveness checks, pool trimming */
    uint64_t next_pool_trim_ns;

    /* progress thread */
    uint64_t spin_ns; /* how long a progress loop polls on after the last work (KVX_SPIN_NS) */
    _Atomic uint64_t app_poll_ns; /* last time the application polled (it drives UCX then) */
    pthread_t thread;
    bool thread_running;
    bool thread_stop;
    bool thread_sleeping;
    uint64_t thread_wake_at_ns;
    int wake_fd;

    /* application threads in kvx_transport_wait, and how kvx wakes them */
    unsigned waiters;
    bool cq_signaled;
    int cq_fd;

    /* kvx_transport_event_fd_ex: one eventfd per mask of kinds, indexed by the mask (0 unused),
     * readable while a poll of one of its kinds has something (fd -1: never asked for) */
    struct {
        int fd;
        bool set;
    } evfd[KVX_EVENT_ALL + 1];
    bool ev_used;      /* some event fd was asked for */
    unsigned ev_kinds; /* the kinds that had something at the last kvx_events_update */

    kvx_stats_t stats; /* every peer's, cumulative (stats.c) */
};

/* ---- locking -------------------------------------------------------------------------------- */

/* API calls announce themselves so that a busy progress thread lets them in (glibc mutexes are
 * not fair: a thread that unlocks and relocks in a loop would starve them). */
static inline void kvx_lock(kvx_transport_t *t)
{
    atomic_fetch_add_explicit(&t->lock_waiters, 1, memory_order_relaxed);
    pthread_mutex_lock(&t->lock);
    atomic_fetch_sub_explicit(&t->lock_waiters, 1, memory_order_relaxed);
}
static inline void kvx_unlock(kvx_transport_t *t) { pthread_mutex_unlock(&t->lock); }
/* A call that applications make in a loop (kvx_transport_poll) first lets announced callers in:
 * unlocking and relocking at once, a poller spinning on two cores kept an urgent submit waiting
 * 25-30 ms for the lock (kvx-bench --hol). Bounded: a few microseconds when nobody else runs. */
static inline void kvx_defer_to_waiters(kvx_transport_t *t)
{
    for (int i = 0; i < 64 && atomic_load_explicit(&t->lock_waiters, memory_order_relaxed) > 0; i++)
        sched_yield();
}
/* An API call's entry: the lock taken (0), or -ESHUTDOWN when the transport closes (unlocked). */
static inline int kvx_enter(kvx_transport_t *t)
{
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return -ESHUTDOWN;
    }
    return 0;
}

/* ---- the tables (table.c) ----------------------------------------------------------------- */

kvx_peer_t *kvx_peer_lookup(const kvx_transport_t *t, const char *id);
/* Whether the application still knows p by its id (kvx_peer_query, kvx_stats_query): it has a
 * connection, or it was removed and still holds transfers whose completions will come out of
 * poll (not when it was purged: those are forgotten). An add still under way has neither. */
static inline bool kvx_peer_known(const kvx_peer_t *p)
{
    return p != NULL && (p->conn != NULL || p->nxfers > p->npurged);
}
int kvx_peer_insert(kvx_transport_t *t, kvx_peer_t *p);
kvx_peer_t *kvx_peer_new(kvx_transport_t *t, const char *peer_id);
bool kvx_peer_id_ok(const char *id);
void kvx_peer_maybe_free(kvx_transport_t *t, kvx_peer_t *p);
void kvx_peer_free_all(kvx_transport_t *t);
/* Connections by the id their messages carry. */
int kvx_idtab_alloc(kvx_idtab_t *tab, void *obj, uint32_t *id_p);
void *kvx_idtab_get(const kvx_idtab_t *tab, uint32_t id);
void kvx_idtab_release(kvx_idtab_t *tab, uint32_t id);

/* ---- wake-ups (notify.c) ------------------------------------------------------------------ */

/* Make each event fd readable or not, as the polls of its kinds have something or not (after
 * anything that may change that: a step, a completion, a drain). Cheap when nothing changed. */
void kvx_events_update(kvx_transport_t *t);
/* Make a new event fd for kinds and bring it to the polls' state (lock held): its fd, or the
 * negative errno of eventfd(2). */
int kvx_events_open(kvx_transport_t *t, unsigned kinds);
/* The transport closed: every event fd readable for good, so that a loop asleep on one wakes. */
void kvx_events_closed(kvx_transport_t *t);
/* Close every event fd (kvx_transport_destroy). */
void kvx_events_free(kvx_transport_t *t);
void kvx_notify_waiters(kvx_transport_t *t);
/* Wake the progress thread if it would otherwise sleep past when_ns (0: now). */
void kvx_kick(kvx_transport_t *t, uint64_t when_ns);

/* ---- counters (stats.c) ------------------------------------------------------------------- */

/* A transfer of peer p ended with status after lat_ns (bytes: what it covered). */
void kvx_stats_xfer(kvx_transport_t *t, kvx_peer_t *p, int op, int status, uint64_t bytes,
                    uint64_t lat_ns);
/* Count a message dropped before it could be tied to a connection (why: KVX_DROP_*). */
void kvx_count_drop(kvx_transport_t *t, int why);

/* ---- transfer objects and completion queues (cq.c) ------------------------------------- */

int kvx_xfer_alloc(kvx_transport_t *t, kvx_xfer_t **x_p);
void kvx_xfer_free(kvx_transport_t *t, kvx_xfer_t *x);
kvx_xfer_t *kvx_xfer_lookup(kvx_transport_t *t, uint64_t id);
void kvx_xfer_free_all(kvx_transport_t *t);
void kvx_xfer_trim_pool(kvx_transport_t *t);
/* Up to max of p's completions into out, released (the last may free p). */
size_t kvx_cq_drain(kvx_peer_t *p, kvx_completion_t *out, size_t max);
void kvx_xfer_complete(kvx_xfer_t *x, int status);
/* Forget x as it ends: it never comes out of poll (its peer's npurged counts it until freed). */
void kvx_xfer_purge(kvx_xfer_t *x);
void kvx_xfer_release(kvx_xfer_t *x);
/* Some of the transfer's bytes were handed to UCX. */
static inline bool kvx_xfer_started(const kvx_xfer_t *x) { return x->posted > 0; }

/* How often stall and liveness checks run while transfers are in flight. */
#define KVX_HOUSEKEEPING_NS 100000000ull

#endif /* KVX_OBJECTS_H */
