/*
 * kvx internals shared by the core files: the transport, peer, connection and transfer objects,
 * and the narrow interface of the UCX backend (ucx.c is the only file that includes UCP headers).
 */
#ifndef KVX_INT_H
#define KVX_INT_H

#include "kvx.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

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

/* ---- objects -------------------------------------------------------------------------------- */

typedef struct kvx_peer kvx_peer_t;
typedef struct kvx_conn kvx_conn_t;
typedef struct kvx_xfer kvx_xfer_t;
typedef struct kvx_ucx kvx_ucx_t;           /* backend state of a transport (ucx.c) */
typedef struct kvx_ucx_conn kvx_ucx_conn_t; /* backend state of a connection (ucx.c) */

enum kvx_op { KVX_OP_WRITE = 0, KVX_OP_READ = 1 };

/* A run of blocks consecutive on both sides: one UCX operation. */
typedef struct kvx_run {
    uint32_t local;
    uint32_t remote;
    uint32_t count;
} kvx_run_t;

/*
 * Life of a transfer:
 *   QUEUED   in conn->queue; runs [0, next_run) and run_off bytes of the next one handed to UCX
 *            (none when kvx_xfer_started is false)
 *   FLUSHING every run posted: in conn->flushing, waiting for the endpoint flush numbered
 *            flush_seq (0: none posted yet) whose completion means its bytes all landed
 *   FAILING  its connection is closing; reported when the close completes: in conn->failing
 *   DONE     finished, waiting in peer->cq for poll
 * UCX never holds a pointer to a transfer: its callbacks name connections and flush tokens, so
 * a transfer can be forgotten (cancel, close) at any time.
 */
enum kvx_xfer_state {
    KVX_XS_FREE = 0,
    KVX_XS_QUEUED,
    KVX_XS_FLUSHING,
    KVX_XS_FAILING,
    KVX_XS_DONE
};

/* One endpoint flush in flight; it covers every transfer of its connection with flush_seq <= seq.
 */
typedef struct kvx_flush {
    kvx_conn_t *conn;
    uint64_t seq;
    struct kvx_flush *next_free;
} kvx_flush_t;

struct kvx_xfer {
    kvx_transport_t *t;
    uint64_t id;
    uint8_t state;
    uint8_t op;
    bool canceled;
    bool purged;          /* its peer was removed with KVX_PEER_REMOVE_PURGE: never reported */
    uint32_t cancel_call; /* the kvx_xfer_cancel call that last reported it (dedupes ids) */
    kvx_peer_t *peer;
    kvx_conn_t *conn;
    kvx_list_t conn_link;   /* conn->queue / flushing / failing, or peer->cq when DONE */
    kvx_list_t active_link; /* t->active: every transfer not yet DONE, for deadlines */
    kvx_run_t *runs;
    uint32_t nruns, next_run, runs_cap;
    uint64_t run_off; /* bytes of runs[next_run] already handed to UCX */
    int status;
    uint64_t flush_seq;
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

/*
 * One UCX endpoint to a peer's worker plus the unpacked remote key of its region. It is OPEN from
 * kvx_peer_add on; wire-up (the peer answering) completes in the background (wired). A failure
 * makes it CLOSING (the endpoint closing, forced) then CLOSED. No API call waits for any of this
 * with the transport lock held: they wait on t->cond, which progress signals.
 */
struct kvx_conn {
    kvx_transport_t *t;
    kvx_peer_t *peer; /* NULL until kvx_peer_add installs it, and once detached */
    int state;
    bool wired;                /* the peer answered the wire-up */
    int err;                   /* why it failed or closes */
    int pending_err;           /* an error reported by UCX, handled outside UCX callbacks */
    unsigned pins;             /* API calls waiting on this connection: it is not freed meanwhile */
    uint64_t last_progress_ns; /* last completion of a UCX operation of this connection */
    kvx_host_id_t host;        /* the peer's process, when it runs on this host */
    bool watched;              /* same host: kvx checks that process is alive */
    int pidfd;                 /* its pidfd (-1: none, /proc is read instead) */
    uint64_t remote_base;
    uint64_t remote_num_blocks;
    char agent_name[KVX_NAME_MAX + 1];
    char transport[KVX_TRANSPORT_NAME_MAX];
    int rma_hw;
    kvx_list_t queue;    /* QUEUED transfers, in submission order */
    kvx_list_t flushing; /* FLUSHING transfers */
    kvx_list_t failing;  /* FAILING transfers */
    unsigned reqs;       /* UCX operation requests outstanding (back-pressure) */
    unsigned flushes;    /* endpoint flushes outstanding */
    uint64_t flush_seq;  /* the last flush posted */
    kvx_flush_t *free_flushes;
    unsigned ucx_refs;    /* UCX callbacks still to come that name this connection */
    kvx_list_t work_link; /* t->work: has queued runs to post or an error to handle */
    kvx_list_t all_link;  /* t->conns */
    kvx_list_t fail_link; /* a local list of connections to fail (deadline scan) */
    kvx_ucx_conn_t *ucx;
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
    uint64_t last_base, last_num_blocks;
};

/* Transfer ids in flight or waiting for poll, for cancel: an open-addressing table. */
typedef struct kvx_idmap {
    kvx_xfer_t **slots;
    size_t cap; /* a power of two, or 0 */
    size_t count;
} kvx_idmap_t;

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
    uint64_t deadline_ns;
    uint64_t keepalive_ms;
    uint64_t stall_ns;
    unsigned num_threads;
    kvx_host_id_t host;
    uint64_t generation;
    uint8_t capability[16];

    kvx_log_fn log_fn;
    void *log_arg;
    int log_level;
    bool own_log;

    kvx_ucx_t *ucx;
    uint8_t *metadata;
    size_t metadata_len;

    /* peers by id */
    kvx_peer_t **ptab;
    size_t ptab_cap;
    size_t npeers;     /* entries in ptab, removed ones included */
    size_t nconnected; /* peers with a connection */
    kvx_list_t ready;  /* peers with completions */
    kvx_list_t conns;  /* every connection not yet freed */
    kvx_list_t work;   /* connections with runs to post or an error to handle */

    /* transfers: objects are pooled (free_xfers); the pool keeps what recent peaks needed */
    kvx_idmap_t ids;
    kvx_xfer_t *free_xfers;
    size_t nfree, nlive;              /* transfer objects in the pool / in use */
    size_t live_peak, live_peak_prev; /* the most in use in this and the previous period */
    uint64_t xfer_mallocs;            /* transfer objects allocated over the transport's life */
    uint64_t next_seq;
    uint32_t cancel_calls;
    kvx_list_t active;             /* transfers not yet DONE (QUEUED, FLUSHING, FAILING) */
    uint64_t next_deadline_ns;     /* earliest deadline in active, or later; UINT64_MAX = none */
    uint64_t next_housekeeping_ns; /* stall and liveness checks, pool trimming */
    uint64_t next_pool_trim_ns;

    /* progress thread */
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

uint64_t kvx_now_ns(void);
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

/* ---- metadata codec (metadata.c) ------------------------------------------------------------ */

#define KVX_MD_MAGIC 0x4d58564bu /* "KVXM" read little-endian */
#define KVX_MD_VERSION 2u

typedef struct kvx_md {
    char agent_name[KVX_NAME_MAX + 1];
    char fingerprint[KVX_FINGERPRINT_MAX + 1];
    uint64_t base;
    uint64_t num_blocks;
    uint64_t block_len;
    uint64_t generation;
    uint8_t capability[16];
    kvx_host_id_t host;
    const uint8_t *worker_addr; /* points into the decoded buffer */
    uint32_t worker_addr_len;
    const uint8_t *rkey;
    uint32_t rkey_len;
} kvx_md_t;

size_t kvx_md_encoded_len(const kvx_md_t *md);
int kvx_md_encode(const kvx_md_t *md, uint8_t *buf, size_t cap);
int kvx_md_decode(const void *buf, size_t len, kvx_md_t *md);
uint32_t kvx_crc32(const void *buf, size_t len);

/* ---- peers (peer.c) ------------------------------------------------------------------------- */

int kvx_peer_check(const kvx_transport_t *t, const kvx_md_t *md, const kvx_peer_params_t *expect,
                   const char **why);
kvx_peer_t *kvx_peer_lookup(const kvx_transport_t *t, const char *id);
void kvx_peer_maybe_free(kvx_transport_t *t, kvx_peer_t *p);
void kvx_peer_free_all(kvx_transport_t *t);

/* ---- connections (peer.c) ------------------------------------------------------------------- */

void kvx_conn_fail(kvx_conn_t *c, int err);
void kvx_conn_release(kvx_conn_t *c, int err);
void kvx_conn_handle_work(kvx_conn_t *c);
void kvx_conn_maybe_free(kvx_conn_t *c);
void kvx_conn_housekeeping(kvx_transport_t *t, uint64_t now);
bool kvx_conn_busy(const kvx_conn_t *c);

/* ---- transfers (xfer.c, transport.c) -------------------------------------------------------- */

void kvx_xfer_post(kvx_conn_t *c, size_t budget_bytes);
void kvx_xfer_free_flushes(kvx_conn_t *c);
void kvx_xfer_complete(kvx_xfer_t *x, int status);
void kvx_xfer_release(kvx_xfer_t *x);
void kvx_xfer_check_deadlines(kvx_transport_t *t, uint64_t now);
int kvx_xfer_alloc(kvx_transport_t *t, kvx_xfer_t **x_p);
void kvx_xfer_free(kvx_transport_t *t, kvx_xfer_t *x);
kvx_xfer_t *kvx_xfer_lookup(kvx_transport_t *t, uint64_t id);
void kvx_xfer_free_all(kvx_transport_t *t);
void kvx_xfer_trim_pool(kvx_transport_t *t);

/* How often stall and liveness checks run while transfers are in flight. */
#define KVX_HOUSEKEEPING_NS 100000000ull

/* Some of the transfer's bytes were handed to UCX. */
static inline bool kvx_xfer_started(const kvx_xfer_t *x)
{
    return x->next_run > 0 || x->run_off > 0;
}

/* ---- progress (progress.c) ------------------------------------------------------------------ */

unsigned kvx_progress_step(kvx_transport_t *t);
void kvx_progress_notify_waiters(kvx_transport_t *t);
void kvx_progress_wait_event(kvx_transport_t *t, uint64_t until_ns);
int kvx_progress_start(kvx_transport_t *t);
void kvx_progress_stop(kvx_transport_t *t);
void kvx_progress_kick(kvx_transport_t *t, uint64_t when_ns);

/* ---- UCX backend (ucx.c) -------------------------------------------------------------------- */

int kvx_ucx_init(kvx_transport_t *t);
void kvx_ucx_fini(kvx_transport_t *t);
int kvx_ucx_local_info(kvx_transport_t *t, const void **waddr, size_t *waddr_len, const void **rkey,
                       size_t *rkey_len);
int kvx_ucx_conn_open(kvx_conn_t *c, const kvx_md_t *md);
int kvx_ucx_conn_close(kvx_conn_t *c);
void kvx_ucx_conn_free(kvx_conn_t *c);
int kvx_ucx_rma(kvx_conn_t *c, int op, void *local, uint64_t remote, size_t len);
int kvx_ucx_flush(kvx_conn_t *c, kvx_flush_t *f);
unsigned kvx_ucx_progress(kvx_transport_t *t);
int kvx_ucx_arm(kvx_transport_t *t);
int kvx_ucx_event_fd(kvx_transport_t *t);

/* Called by ucx.c from inside UCX progress, with the transport lock held. */
void kvx_on_flush_done(kvx_flush_t *f, int status);
void kvx_on_op_done(kvx_conn_t *c, int status);
void kvx_on_conn_error(kvx_conn_t *c, int status);
void kvx_on_conn_closed(kvx_conn_t *c);

#endif /* KVX_INT_H */
