/*
 * kvx internals shared by the core files: the transport, peer, connection and transfer objects,
 * and the narrow interface of the UCX backend (ucx.c is the only file that includes UCP headers).
 */
#ifndef KVX_INT_H
#define KVX_INT_H

#include "kvx.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

/* ---- intrusive circular list ---------------------------------------------------------------- */

typedef struct kvx_list {
    struct kvx_list *prev, *next;
} kvx_list_t;

static inline void kvx_list_init(kvx_list_t *h) { h->prev = h->next = h; }
static inline bool kvx_list_empty(const kvx_list_t *h) { return h->next == h; }
static inline bool kvx_list_linked(const kvx_list_t *n) { return n->next != NULL && n->next != n; }
static inline void kvx_list_add_tail(kvx_list_t *h, kvx_list_t *n)
{
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}
static inline void kvx_list_del(kvx_list_t *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}
/* Move every node of from onto the empty list to; from becomes empty. */
static inline void kvx_list_splice_init(kvx_list_t *from, kvx_list_t *to)
{
    if (kvx_list_empty(from)) {
        kvx_list_init(to);
        return;
    }
    to->next = from->next;
    to->prev = from->prev;
    to->next->prev = to;
    to->prev->next = to;
    kvx_list_init(from);
}
#define kvx_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#define kvx_list_first(h, type, member) kvx_container_of((h)->next, type, member)

/* ---- little-endian fields of what crosses the wire --------------------------------------- */

static inline void kvx_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void kvx_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvx_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kvx_get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t kvx_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t kvx_get64(const uint8_t *p)
{
    return (uint64_t)kvx_get32(p) | (uint64_t)kvx_get32(p + 4) << 32;
}

/* A piece of memory (the layout of UCX's ucp_dt_iov_t: ucx.c checks it). */
typedef struct kvx_iov {
    void *base;
    size_t len;
} kvx_iov_t;

/* ---- objects -------------------------------------------------------------------------------- */

typedef struct kvx_peer kvx_peer_t;
typedef struct kvx_conn kvx_conn_t;
typedef struct kvx_xfer kvx_xfer_t;
typedef struct kvx_rconn kvx_rconn_t;
typedef struct kvx_writer kvx_writer_t;
typedef struct kvx_send kvx_send_t;
typedef struct kvx_pairing kvx_pairing_t;
typedef struct kvx_ucx kvx_ucx_t;           /* backend state of a transport (ucx.c) */
typedef struct kvx_ucx_ep kvx_ucx_ep_t;     /* backend state of an endpoint (ucx.c) */
typedef struct kvx_ep_ops kvx_ep_ops_t;     /* what an endpoint tells its owner (ucx.c) */
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
 *   QUEUED   in conn->queue; its byte stream (its runs, in order) is handed to UCX in messages
 *            from posted = 0 up; a write's WRITE messages, a read's READ_REQ ones
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
    bool canceled;
    bool purged;          /* its peer was removed with KVX_PEER_REMOVE_PURGE: never reported */
    bool notify;          /* a write whose receiver is told when all of it landed */
    bool noticed;         /* its notice was sent; NOTICE_ACK completes it */
    uint32_t cancel_call; /* the kvx_xfer_cancel call that last reported it (dedupes ids) */
    kvx_peer_t *peer;
    kvx_conn_t *conn;
    kvx_list_t conn_link;   /* conn->queue / waiting, or peer->cq when DONE */
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

enum kvx_conn_state { KVX_CONN_OPEN = 0, KVX_CONN_CLOSING, KVX_CONN_CLOSED };

/* Who a transport is: same kernel (boot id) and pid namespace means a peer's pid names the same
 * process here (host.c). */
typedef struct kvx_host_id {
    uint8_t boot_id[16]; /* zero: unknown */
    uint64_t pid_ns;
    uint64_t start_time; /* clock ticks after boot, as /proc/<pid>/stat says */
    uint32_t pid;
} kvx_host_id_t;

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
 * and not yet sent, and read requests not yet answered. */
#define KVX_MAX_REQS 16

/*
 * The initiator's side of a peer: one UCX endpoint to the peer's worker. It is OPEN from
 * kvx_peer_add on; the handshake (HELLO, answered with HELLO_ACK: the receiver's id and token
 * for this connection) completes in the background (wired). A failure makes it CLOSING (the
 * endpoint closing, forced) then CLOSED. No API call waits for any of this with the transport
 * lock held: they wait on t->cond, which progress signals.
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
    kvx_list_t queue;      /* QUEUED transfers, in submission order */
    kvx_list_t waiting;    /* WAITING transfers */
    unsigned reqs;         /* messages UCX holds and read requests unanswered (back-pressure) */
    uint64_t unacked;      /* bytes posted and not yet acknowledged or arrived */
    unsigned notices;      /* notices sent and not yet answered */
    kvx_rreq_t rreqs[KVX_MAX_REQS];
    unsigned ucx_refs;    /* UCX callbacks still to come that name this connection */
    kvx_list_t work_link; /* t->work: has queued runs to post or an error to handle */
    kvx_list_t all_link;  /* t->conns */
    kvx_list_t fail_link; /* a local list of connections to fail */
    kvx_ucx_ep_t *ucx;
};

struct kvx_peer {
    char *id;
    kvx_peer_t *hnext; /* hash chain */
    kvx_conn_t *conn;  /* NULL when removed */
    bool removed;
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

/* ---- the receiving side (rconn.c, hello.c, fence.c, recv.c) --------------------------------- */

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

/* Retired capabilities remembered (older ones are dropped like any unknown one). */
#define KVX_RETIRED_MAX 8

/* A connection from a writer: made when its HELLO arrives with our capability. Acknowledgements
 * go out in messages of KVX_ACK_BATCH entries; at most KVX_ACKS_MAX wait at once. */
#define KVX_ACK_BATCH 256
#define KVX_ACKS_MAX 65536
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
    kvx_list_t serve; /* read requests to answer, oldest first */
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

    /* made only to refuse a HELLO of a retired capability (linked by w_link in t->refusing) */
    bool refusing;
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

/* After the last sign of activity a progress loop keeps polling this long before it arms the
 * event fd and sleeps: on tcp, arming after every empty progress costs ~50x more wake-ups. */
#define KVX_SPIN_NS 100000ull

struct kvx_transport {
    pthread_mutex_t lock;
    pthread_cond_t cond;     /* progress signals connection events to API calls waiting */
    atomic_int lock_waiters; /* API calls waiting for the lock: the progress thread yields */
    bool closed;             /* set when close begins: every later call returns -ESHUTDOWN */
    bool close_done;         /* the teardown has finished (a second close waits for it) */
    unsigned busy;           /* API calls waiting on t->cond with the lock released */
    bool conn_event;         /* a connection was wired, failed or closed since the last signal */

    char name[KVX_NAME_MAX + 1];
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
    uint8_t *secret; /* NULL: none */
    size_t secret_len;
    char *net_devices;
    kvx_host_id_t host;
    uint64_t generation;
    uint8_t capability[16];
    /* capabilities kvx_fence_ex retired, newest first: a HELLO with one is refused, answered */
    uint8_t retired[KVX_RETIRED_MAX][16];
    unsigned nretired;
    struct kvx_seen_proof *seen; /* with a secret: HELLO proofs of the last seconds (hello.c) */
    kvx_list_t refusing;         /* connections made only to answer such a HELLO (at most 16) */
    void *old_md;  /* metadata buffers replaced while pairings may still be sending them */
    size_t nftags; /* tag fence records of every writer (kvx_fence_rec_t) */

    kvx_log_fn log_fn;
    void *log_arg;
    int log_level;
    bool own_log;

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

    /* kvx_transport_event_fd: readable while a poll has something (-1: never asked for) */
    int ev_fd;
    bool ev_set;

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

/* ---- helpers (transport.c, log.c) ----------------------------------------------------------- */

static inline uint64_t kvx_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
/* A fresh capability, and metadata that carries it; the old one joins t->retired. Returns 0 or
 * a negative errno (nothing changed). */
int kvx_transport_retire(kvx_transport_t *t);
void kvx_log(const kvx_transport_t *t, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define kvx_error(t, ...) kvx_log((t), KVX_LOG_ERROR, __VA_ARGS__)
#define kvx_warn(t, ...) kvx_log((t), KVX_LOG_WARN, __VA_ARGS__)
#define kvx_info(t, ...) kvx_log((t), KVX_LOG_INFO, __VA_ARGS__)
#define kvx_debug(t, ...) kvx_log((t), KVX_LOG_DEBUG, __VA_ARGS__)

/* ---- same-host peers (host.c) --------------------------------------------------------------- */

void kvx_host_self(kvx_host_id_t *id);
/* Start watching a peer's process: 1 (same host: *pidfd_p set, or -1 to fall back on /proc),
 * 0 (another host, or unknown: UCX's keepalive watches it), -EHOSTUNREACH (already gone). */
int kvx_host_watch(const kvx_host_id_t *self, const kvx_host_id_t *peer, int *pidfd_p);
bool kvx_host_alive(const kvx_host_id_t *peer, int pidfd);

/* ---- owned-region segments (segment.c: no UCX, fuzzed) -------------------------------------- */

#define KVX_SEG_TRAILER_LEN 64 /* at the end of an owned region's segment: magic, length, token */
/* What the kernel says of the mapping holding an address (/proc/self/maps, IPC_STAT). */
typedef struct kvx_seg_info {
    uint64_t lo, hi, off; /* the mapping, and its offset in what it maps */
    bool rw_shared;
    bool sysv; /* a System V segment: the fields below are set */
    int shmid;
    int64_t cpid; /* the process that created it */
    uint64_t segsz;
} kvx_seg_info_t;
int kvx_seg_lookup(uintptr_t p, kvx_seg_info_t *s); /* 0, or -ENOENT: nothing mapped at p */
/* Whether a peer's region of len bytes at p (in segment s) may be mapped: the peer's process
 * (owner) created s, starting at p and holding the region and the trailer; if s is this
 * process's (self), only as an owned region of one of its transports (own_region). 0, or
 * -EOPNOTSUPP (not a System V segment) or -EPERM, with *why. */
int kvx_seg_check(const kvx_seg_info_t *s, uint64_t p, uint64_t len, uint32_t owner, uint32_t self,
                  bool own_region, const char **why);
/* The owned regions' segments of this process (kvx_ucx_region_alloc lists them). */
int kvx_seg_own_add(int shmid); /* 0 or -ENOMEM */
void kvx_seg_own_del(int shmid);
bool kvx_seg_own_has(int shmid);
void kvx_seg_trailer_put(uint8_t *tr, uint64_t region_len, const uint8_t *token);
/* 0 and the token (nonzero) when tr is an owner's trailer for a region of len bytes or more;
 * -EPERM with *why otherwise. */
int kvx_seg_trailer_get(const uint8_t *tr, uint64_t len, uint8_t *token, const char **why);
/* The token a handshake brought (got) is the segment's (want, nonzero); constant time. */
bool kvx_seg_token_ok(const uint8_t *want, const uint8_t *got);

/* ---- metadata codec (metadata.c) ------------------------------------------------------------ */

#define KVX_MD_MAGIC 0x4d58564bu /* "KVXM" read little-endian */
#define KVX_MD_VERSION 2u
#define KVX_MDF_MAC 1u /* a 32-byte HMAC-SHA256 of the blob ends it */
#define KVX_MAC_LEN 32

typedef struct kvx_md {
    char agent_name[KVX_NAME_MAX + 1];
    char fingerprint[KVX_FINGERPRINT_MAX + 1];
    uint64_t base;
    uint64_t num_blocks;
    uint64_t block_len;
    uint64_t generation;
    uint8_t capability[16];
    kvx_host_id_t host;
    uint32_t flags;
    const uint8_t *worker_addr; /* points into the decoded buffer */
    uint32_t worker_addr_len;
    const uint8_t *rkey; /* an owned region's packed key, or NULL (points into the buffer) */
    uint32_t rkey_len;
    const uint8_t *mac; /* points into the decoded buffer, when flags has KVX_MDF_MAC */
} kvx_md_t;

size_t kvx_md_encoded_len(const kvx_md_t *md);
/* With a secret, the blob is signed (KVX_MDF_MAC). Returns the length or -ENOSPC. */
int kvx_md_encode(const kvx_md_t *md, const uint8_t *secret, size_t secret_len, uint8_t *buf,
                  size_t cap);
int kvx_md_decode(const void *buf, size_t len, kvx_md_t *md);
/* 0 when the blob's signature matches the secret; -EACCES otherwise, or when one side has a
 * secret and the other none. */
int kvx_md_verify(const void *buf, size_t len, const kvx_md_t *md, const uint8_t *secret,
                  size_t secret_len);

/* ---- checksums and authentication (checksum.c, auth.c) -------------------------------------- */

uint32_t kvx_crc32(const void *buf, size_t len);
uint32_t kvx_crc32_parts(const kvx_iov_t *parts, size_t n);
uint32_t kvx_crc32c(const void *buf, size_t len);
uint32_t kvx_crc32c_parts(const kvx_iov_t *parts, size_t n);
void kvx_sha256(const void *data, size_t len, uint8_t out[32]);
void kvx_hmac_sha256(const void *key, size_t key_len, const kvx_iov_t *parts, size_t n,
                     uint8_t out[32]);
bool kvx_equal_ct(const void *a, const void *b, size_t len);

/* ---- wire format (wire.c) -------------------------------------------------------------------- */

#define KVX_WIRE_VERSION 2
enum kvx_msg_type {
    KVX_MSG_HELLO = 1,
    KVX_MSG_HELLO_ACK,
    KVX_MSG_WRITE,
    KVX_MSG_ACK,
    KVX_MSG_READ_REQ,
    KVX_MSG_READ_DATA,
    KVX_MSG_FENCE,
    KVX_MSG_NOTICE,
    KVX_MSG_NOTICE_ACK,
    KVX_MSG_BYE,
    /* pairing by address, over an endpoint of UCX's connection manager (listen.c) */
    KVX_MSG_CHALLENGE,
    KVX_MSG_MD_REQ,
    KVX_MSG_MD,
    /* the writer's answer to a receiver with a secret: its proof over HELLO_ACK's nonce */
    KVX_MSG_PROOF
};
#define KVX_MSGF_CRC 1u    /* WRITE, READ_REQ, READ_DATA: checksums are set */
#define KVX_MSGF_PROOF 2u  /* HELLO, MD_REQ: a proof of the shared secret ends it */
#define KVX_MSGF_SECRET 4u /* CHALLENGE: the listener requires a proof */
#define KVX_WIRE_HDR_LEN 16
#define KVX_WIRE_HELLO_LEN 64
#define KVX_WIRE_HELLO_ACK_LEN 72
#define KVX_WIRE_PROOF_LEN 48
#define KVX_SEG_TOKEN_LEN 16
#define KVX_WIRE_WRITE_LEN 48
#define KVX_WIRE_ACK_LEN 24
#define KVX_WIRE_READ_REQ_LEN 40
#define KVX_WIRE_READ_DATA_LEN 48
#define KVX_WIRE_RUN_LEN 16
#define KVX_WIRE_ACK_ENTRY_LEN 16
#define KVX_WIRE_MAX_RUNS 256  /* runs in one WRITE or READ_REQ */
#define KVX_WIRE_MAX_ACKS 4096 /* entries in one ACK */
#define KVX_WIRE_MAX_WADDR 4096
#define KVX_PROOF_LEN 32
#define KVX_READ_REQ_MAX ((uint64_t)256 * 1024) /* bytes one READ_REQ asks for */
#define KVX_WIRE_NONCE_LEN 16
#define KVX_WIRE_MAX_MD (64u * 1024) /* the metadata one MD carries */
#define KVX_WIRE_MD_REQ_LEN 64
#define KVX_WIRE_MD_LEN 72

typedef struct kvx_wire_run {
    uint64_t offset;
    uint32_t len;
    uint32_t crc;
} kvx_wire_run_t;

/* A decoded message header. Pointers point into the header decoded. */
typedef struct kvx_msg {
    uint8_t type;
    uint16_t flags;
    uint32_t conn_id;
    uint64_t token;
    union {
        struct {
            const uint8_t *capability, *waddr, *proof;
            uint32_t conn_id, waddr_len;
            uint32_t ep_sn; /* the writer's endpoint's place among those it opened to us */
            uint64_t token, generation;
            size_t signed_len; /* the bytes the proof covers */
            char name[KVX_NAME_MAX + 1];
        } hello;
        struct {
            uint32_t rconn_id;
            int32_t status;
            uint64_t token, epoch;
            const uint8_t *seg_token; /* KVX_SEG_TOKEN_LEN bytes */
            const uint8_t *nonce;     /* KVX_WIRE_NONCE_LEN bytes */
        } hello_ack;
        struct {
            const uint8_t *mac; /* KVX_PROOF_LEN bytes */
        } proof;
        struct {
            uint64_t xfer_id, tag, epoch;
            uint32_t nruns;
            const uint8_t *runs;
        } write;
        struct {
            uint32_t n;
            const uint8_t *entries;
        } ack;
        struct {
            uint64_t xfer_id, stream_off, bytes;
            uint32_t nruns;
            const uint8_t *runs;
        } read_req;
        struct {
            uint64_t xfer_id, stream_off;
            uint32_t len, crc;
            int32_t status;
        } read_data;
        struct {
            uint64_t epoch;
        } fence;
        struct {
            uint64_t xfer_id, tag, epoch, blocks, bytes;
        } notice;
        struct {
            uint64_t xfer_id;
            int32_t status;
        } notice_ack;
        struct {
            const uint8_t *nonce;
        } challenge;
        struct {
            const uint8_t *proof; /* NULL without KVX_MSGF_PROOF */
            const uint8_t *cnonce;
        } md_req;
        struct {
            int32_t status;
            uint32_t len; /* of the metadata, the payload */
            const uint8_t *cnonce;
            const uint8_t *mac; /* NULL without KVX_MSGF_PROOF */
        } md;
    } u;
} kvx_msg_t;

/* Decode a message header of hdr_len bytes that came with data_len bytes of payload: 0, or
 * -EBADMSG for anything malformed. Checks structure only (lengths, counts, reserved fields);
 * whether connection, token and runs are acceptable is the receiver's business. */
int kvx_wire_decode(const void *hdr, size_t hdr_len, size_t data_len, kvx_msg_t *m);
void kvx_wire_put_hdr(uint8_t *p, int type, unsigned flags, uint32_t conn_id, uint64_t token);
void kvx_wire_run_get(const uint8_t *runs, uint32_t i, kvx_wire_run_t *r);
void kvx_wire_run_put(uint8_t *runs, uint32_t i, const kvx_wire_run_t *r);
void kvx_wire_ack_get(const uint8_t *entries, uint32_t i, uint64_t *xfer_id, uint32_t *bytes,
                      int32_t *status);
void kvx_wire_ack_put(uint8_t *entries, uint32_t i, uint64_t xfer_id, uint32_t bytes,
                      int32_t status);

/* A failure status a receiver sent (ACK, READ_DATA, NOTICE_ACK, HELLO_ACK): one of those its
 * side gives, or -EPROTO for anything else (a peer's number is not passed on as an errno of
 * this host: -ECONNABORTED, which a replaced connection reports, or INT32_MIN). */
static inline int kvx_remote_status(int32_t status)
{
    switch (status) {
    case 0:
    case -KVX_EFENCED:
    case -EINVAL:
    case -EBADMSG:
    case -ENOSPC:
    case -EBUSY:
    case -EKEYREVOKED:
        return status;
    default:
        return -EPROTO;
    }
}

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

int kvx_peer_check(const kvx_transport_t *t, const kvx_md_t *md, const kvx_peer_params_t *expect,
                   const char **why);
kvx_peer_t *kvx_peer_lookup(const kvx_transport_t *t, const char *id);
int kvx_peer_insert(kvx_transport_t *t, kvx_peer_t *p);
kvx_peer_t *kvx_peer_new(kvx_transport_t *t, const char *peer_id);
/* Install a new connection from md on a peer paired by address whose connection failed, without
 * waiting (its handshake completes in the background); the transfers parked meanwhile move to
 * it. Returns 0 or a negative errno (nothing changed). */
int kvx_peer_reinstall(kvx_transport_t *t, kvx_peer_t *p, const kvx_md_t *md);
int kvx_peer_add_at(kvx_transport_t *t, const char *peer_id, const void *metadata,
                    size_t metadata_len, const kvx_peer_params_t *params, const char *addr);
bool kvx_peer_id_ok(const char *id);
void kvx_peer_maybe_free(kvx_transport_t *t, kvx_peer_t *p);
void kvx_peer_free_all(kvx_transport_t *t);

/* ---- connections (conn.c) ------------------------------------------------------------------- */

/* What a connection tells its owner, from kvx_conn_open on (the lock held; on_sent inside UCX
 * progress, the others outside it). */
struct kvx_conn_ops {
    /* UCX is done with a message of the connection's (xfer_id: the transfer it carried, or 0) */
    void (*on_sent)(kvx_conn_t *c, uint64_t xfer_id, int status);
    /* the progress step serves a connection that asked for work: runs to post */
    void (*on_work)(kvx_conn_t *c);
    /* it fails (once, in kvx_conn_fail, before its endpoint closes): its transfers go */
    void (*on_failed)(kvx_conn_t *c, int err);
};

/* A new connection from md: its process watched when on this host, its endpoint, its mapping of
 * an owned region, listed, and its handshake sent. Not yet any peer's. Returns 0 with *c_p set,
 * or a negative errno (logged for peer_id) with nothing of it left to the caller. */
int kvx_conn_open(kvx_transport_t *t, const char *peer_id, const kvx_md_t *md,
                  const kvx_conn_ops_t *ops, kvx_conn_t **c_p);
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
/* Connections by id (table.c). */
int kvx_idtab_alloc(kvx_idtab_t *tab, void *obj, uint32_t *id_p);
void *kvx_idtab_get(const kvx_idtab_t *tab, uint32_t id);
void kvx_idtab_release(kvx_idtab_t *tab, uint32_t id);

/* ---- transfers (xfer.c, transport.c) -------------------------------------------------------- */

int kvx_xfer_submit(kvx_transport_t *t, kvx_peer_t *p, int op, const uint32_t *local,
                    const uint32_t *remote, size_t count, const kvx_xfer_params_t *params,
                    uint64_t *id_p);
void kvx_xfer_post(kvx_conn_t *c, size_t budget_bytes);
void kvx_xfer_forget(kvx_xfer_t *x);
void kvx_xfer_fail_conn(kvx_conn_t *c, int err);
/* A reconnected peer's parked transfers go to its new connection c (those beyond its region
 * fail with -EINVAL); or they all fail with err (c NULL: the peer was removed or closed). */
void kvx_xfer_unpark(kvx_peer_t *p, kvx_conn_t *c, int err);
/* A peer's connection failed before its handshake: its transfers (none posted yet) wait again. */
void kvx_xfer_repark(kvx_conn_t *c, kvx_peer_t *p);
void kvx_xfer_complete(kvx_xfer_t *x, int status);
void kvx_xfer_release(kvx_xfer_t *x);
void kvx_xfer_check_deadlines(kvx_transport_t *t, uint64_t now);
int kvx_xfer_alloc(kvx_transport_t *t, kvx_xfer_t **x_p);
void kvx_xfer_free(kvx_transport_t *t, kvx_xfer_t *x);
kvx_xfer_t *kvx_xfer_lookup(kvx_transport_t *t, uint64_t id);
void kvx_xfer_free_all(kvx_transport_t *t);
void kvx_xfer_trim_pool(kvx_transport_t *t);
/* Up to max of p's completions into out, released (the last may free p). */
size_t kvx_cq_drain(kvx_peer_t *p, kvx_completion_t *out, size_t max);
/* A message of the initiator's side arrived (ACK, READ_DATA, HELLO_ACK, FENCE, NOTICE_ACK). */
void kvx_xfer_on_message(kvx_transport_t *t, const kvx_msg_t *m, const uint8_t *data,
                         size_t data_len);
/* UCX is done with a message of a connection's (status: how it went). */
void kvx_xfer_on_sent(kvx_conn_t *c, uint64_t xfer_id, int status);

/* How often stall and liveness checks run while transfers are in flight. */
#define KVX_HOUSEKEEPING_NS 100000000ull

/* Some of the transfer's bytes were handed to UCX. */
static inline bool kvx_xfer_started(const kvx_xfer_t *x) { return x->posted > 0; }

/* ---- the receiving side (rconn.c, hello.c, fence.c, recv.c; recv_int.h) --------------------- */

/* A message for the receiving side arrived (HELLO, WRITE, READ_REQ, NOTICE, BYE). Runs inside
 * UCX progress: it applies writes at once, and defers what needs to send to kvx_recv_work. */
void kvx_recv_on_message(kvx_transport_t *t, const kvx_msg_t *m, const void *hdr, size_t hdr_len,
                         const uint8_t *data, size_t data_len);
/* After UCX progress: handshakes, acknowledgements, read data, control. Returns work done. */
unsigned kvx_recv_work(kvx_transport_t *t);
bool kvx_recv_busy(const kvx_transport_t *t);
/* Periodic (kvx_progress_step's housekeeping): unproven connections past their time close. */
void kvx_recv_housekeeping(kvx_transport_t *t, uint64_t now);
void kvx_recv_close_all(kvx_transport_t *t);
void kvx_recv_free_all(kvx_transport_t *t);
kvx_writer_t *kvx_writer_lookup(const kvx_transport_t *t, const char *name);
/* A fence (kvx_fence_ex) in two halves: what can fail (0, -ENOSPC, -ENOMEM: nothing fenced),
 * then the fence itself (the connections fenced). tags sorted and distinct. */
int kvx_recv_fence_prepare(kvx_transport_t *t, const char *writer, const uint64_t *tags,
                           size_t ntags);
int kvx_recv_fence(kvx_transport_t *t, const char *writer, const uint64_t *tags, size_t ntags);
/* Take up to max arrival notices into out, oldest first (kvx_notice_poll): how many. */
size_t kvx_notice_take(kvx_transport_t *t, kvx_notice_t *out, size_t max);
/* What a writer with the secret answers a HELLO_ACK's nonce with (PROOF, src/wire.c). */
void kvx_wire_proof_mac(const uint8_t *secret, size_t secret_len, const uint8_t *nonce,
                        uint32_t rconn_id, uint64_t token, uint8_t out[32]);
/* Count a message dropped before it could be tied to a connection. */
void kvx_count_drop(kvx_transport_t *t, int why);
enum { KVX_DROP_MALFORMED, KVX_DROP_CAPABILITY, KVX_DROP_UNKNOWN, KVX_DROP_RNDV };

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

/* ---- statistics (stats.c) ------------------------------------------------------------------ */

/* A transfer of peer p ended with status after lat_ns (bytes: what it covered). */
void kvx_stats_xfer(kvx_transport_t *t, kvx_peer_t *p, int op, int status, uint64_t bytes,
                    uint64_t lat_ns);

/* ---- progress (progress.c) ------------------------------------------------------------------ */

/* Make the event fd readable or not, as the polls have something or not (after anything that
 * may change that: a step, a completion, a drain). Cheap when nothing changed. */
void kvx_events_update(kvx_transport_t *t);

unsigned kvx_progress_step(kvx_transport_t *t);
void kvx_notify_waiters(kvx_transport_t *t);
void kvx_progress_wait_event(kvx_transport_t *t, uint64_t until_ns);
int kvx_progress_start(kvx_transport_t *t);
void kvx_progress_stop(kvx_transport_t *t);
void kvx_kick(kvx_transport_t *t, uint64_t when_ns);

/* ---- UCX backend (ucx*.c; what only they share is in ucx_int.h) ---------------------------- */

/* A message being sent: kvx builds its header and payload iov here, and UCX keeps pointing at
 * both until it is done (a message it could not send at once waits in its queue). */
#define KVX_SEND_HDR_MAX (KVX_WIRE_HELLO_LEN + KVX_NAME_MAX + KVX_WIRE_MAX_WADDR + KVX_PROOF_LEN)
struct kvx_send {
    kvx_ucx_ep_t *ep;
    kvx_send_t *next_free;
    uint64_t xfer_id; /* the transfer whose local blocks the payload is (0: none) */
    uint8_t hdr[KVX_SEND_HDR_MAX];
    kvx_iov_t iov[KVX_WIRE_MAX_RUNS];
};

/*
 * What the layers above hear from the backend: from inside UCX progress, with the transport lock
 * held, through the tables they gave it (the backend calls no kvx file above it). The worker's
 * table (kvx_ucx_init): messages, decoded and checked against the wire format, by the side they
 * are for, connection requests of the listener, and messages dropped before any owner saw them.
 */
typedef struct kvx_ucx_ops {
    /* for the receiving side: HELLO, WRITE, READ_REQ, NOTICE, BYE, PROOF */
    void (*on_request)(kvx_transport_t *t, const kvx_msg_t *m, const void *hdr, size_t hdr_len,
                       const uint8_t *data, size_t data_len);
    /* for the initiator's side: HELLO_ACK, ACK, READ_DATA, FENCE, NOTICE_ACK */
    void (*on_reply)(kvx_transport_t *t, const kvx_msg_t *m, const uint8_t *data, size_t data_len);
    void (*on_conn_request)(kvx_transport_t *t, void *conn_req);
    void (*on_drop)(kvx_transport_t *t, int why); /* KVX_DROP_* */
} kvx_ucx_ops_t;

/* An endpoint's table (kvx_ucx_ep_open, kvx_ucx_pair_open), called with the owner it was given. */
struct kvx_ep_ops {
    /* UCX is done with a message of the owner's (xfer_id: the message's; status: how it went) */
    void (*on_sent)(void *owner, uint64_t xfer_id, int status);
    void (*on_error)(void *owner, int status); /* the endpoint failed */
    void (*on_closed)(void *owner);            /* a close that returned 1 completed */
    /* pairing endpoints only: a CHALLENGE, MD_REQ or MD that arrived on it */
    void (*on_message)(void *owner, const kvx_msg_t *m, const uint8_t *data, size_t data_len);
};

int kvx_ucx_init(kvx_transport_t *t, const kvx_ucx_ops_t *ops);
void kvx_ucx_fini(kvx_transport_t *t); /* the worker; an owned region stays */
void kvx_ucx_free(kvx_transport_t *t); /* the owned region and the rest */
void kvx_ucx_local_address(kvx_transport_t *t, const void **waddr, size_t *waddr_len);
int kvx_ucx_region_alloc(kvx_transport_t *t, size_t len, void **base_p, const void **rkey_p,
                         size_t *rkey_len_p);
int kvx_ucx_map(kvx_ucx_ep_t *ep, const void *rkey, size_t rkey_len, uint64_t raddr, uint64_t len,
                uint32_t owner, void **ptr_p, uint8_t *token_p);
void kvx_ucx_unmap(kvx_ucx_ep_t *ep);
/* An endpoint to a worker address, whose errors and sends report to owner through ops. */
int kvx_ucx_ep_open(kvx_transport_t *t, const void *waddr, const char *name,
                    const kvx_ep_ops_t *ops, void *owner, kvx_ucx_ep_t **ep_p);
/* UCX pairs two workers' endpoints by the order each opened them towards the other: the place
 * of ep among this worker's endpoints to that peer, and a catch-up to the peer's place before
 * answering it (see ucx_ep.c). */
uint32_t kvx_ucx_ep_sn(const kvx_ucx_ep_t *ep);
/* Returns 0, or -ENOBUFS when the catch-up is over its budget (the HELLO is refused). */
int kvx_ucx_align(kvx_transport_t *t, const void *waddr, uint32_t sn);
/* Close (forced). Returns 0 when closed on return, 1 when the owner's on_closed follows. */
int kvx_ucx_ep_close(kvx_ucx_ep_t *ep, unsigned *refs);
void kvx_ucx_ep_free(kvx_ucx_ep_t *ep);
/* Which transport the endpoint's data travels on, and its message size. */
void kvx_ucx_ep_describe(kvx_ucx_ep_t *ep, char *transport, size_t len, int *rma_hw, size_t *seg);
/* A message to fill (s->hdr, s->iov, s->xfer_id), then hand to kvx_ucx_send; NULL: no memory. */
kvx_send_t *kvx_ucx_send_get(kvx_ucx_ep_t *ep);
/* Send s: hdr_len bytes of s->hdr and the payload s->iov[0..iovcnt) (memory of the region). Returns
 * 0 (UCX is done with it already: s is free again), 1 (UCX holds it: the owner's on_sent follows,
 * and *refs counts it meanwhile), or a negative errno (s is free again). */
int kvx_ucx_send(kvx_send_t *s, size_t hdr_len, size_t iovcnt, unsigned *refs);
/* Wrap a header already built into a message with no payload and send it. */
int kvx_ucx_send_ctl(kvx_ucx_ep_t *ep, const void *hdr, size_t hdr_len, unsigned *refs);
/* pairing by address (UCX's connection manager) */
int kvx_ucx_listen(kvx_transport_t *t, const struct sockaddr *sa, socklen_t len,
                   struct sockaddr_storage *bound);
void kvx_ucx_unlisten(kvx_transport_t *t);
void kvx_ucx_reject(kvx_transport_t *t, void *conn_req);
int kvx_ucx_pair_open(kvx_transport_t *t, void *conn_req, const struct sockaddr *sa, socklen_t len,
                      const kvx_ep_ops_t *ops, void *owner, kvx_ucx_ep_t **ep_p);
int kvx_ucx_send_pair(kvx_ucx_ep_t *ep, const void *hdr, size_t hdr_len, const void *data,
                      size_t data_len, unsigned *refs);
unsigned kvx_ucx_progress(kvx_transport_t *t);
int kvx_ucx_arm(kvx_transport_t *t);
int kvx_ucx_event_fd(kvx_transport_t *t);

/* Called by ucx.c from inside UCX progress, with the transport lock held. */
void kvx_on_conn_error(kvx_conn_t *c, int status);
void kvx_on_conn_closed(kvx_conn_t *c);

#endif /* KVX_INT_H */
