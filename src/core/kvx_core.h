/*
 * The core (src/README.md): the state and objects both sides share, below the connections. The
 * core's struct (kvx_core_t) holds the transport's logger, its lock and the accounting of the
 * calls that go without it, its region and settings, the backend's handle, the hooks the engine
 * installs (so that a lower layer wakes the threads waiting on the transport without calling up),
 * the peers by id, the transfer objects and the counters. The peer and the transfer themselves
 * are defined here: every layer above reads them. Files: peers.c (the peer table), ids.c (ids of
 * connections), stats.c (the counters), xfers.c (transfer objects: pool, ids), cq.c (a transfer
 * done: into its peer's completion queue, and out of it for poll).
 */
#ifndef KVX_CORE_H
#define KVX_CORE_H

#include "ucx/kvx_ucx.h"

typedef struct kvx_core kvx_core_t;
typedef struct kvx_peer kvx_peer_t;
typedef struct kvx_xfer kvx_xfer_t;
typedef struct kvx_conn kvx_conn_t;       /* the initiator's connection (conn/kvx_conn.h) */
typedef struct kvx_pairing kvx_pairing_t; /* pairing by address (peer/kvx_peer.h) */

enum kvx_op { KVX_OP_WRITE = 0, KVX_OP_READ = 1 };

/* A connection's state, on either side (conn/). */
enum kvx_conn_state { KVX_CONN_OPEN = 0, KVX_CONN_CLOSING, KVX_CONN_CLOSED };

/* A run of bytes consecutive on both sides: at local (in local region lregion), to or from
 * offset remote of the transfer's remote region rreg (an index into x->rregs). Block calls are
 * runs over the two main regions (submit.c). */
typedef struct kvx_run {
    uint8_t *local;
    uint64_t remote;
    uint64_t len;
    uint32_t lregion;
    uint32_t rreg;
} kvx_run_t;

/* A remote region a transfer names: its id in the peer and the capability its messages carry
 * (zero for the main region, which the connection's own capability opened). */
typedef struct kvx_rreg {
    uint32_t id;
    uint8_t capability[16];
} kvx_rreg_t;

/*
 * A region of this transport (regions.c): what peers may address, by id. The main region
 * (KVX_PARAM_REGION) is KVX_REGION_MAIN; ids are never reused. Dead: deregistration began, and
 * nothing of a peer is applied to it or served from it any more. users: what may still touch
 * its memory on the receiving side (rendezvous receives into it, read requests queued from it,
 * READ_DATA sends UCX holds that read it); kvx_region_deregister waits for 0.
 */
typedef struct kvx_region {
    uint32_t id;
    bool dead;
    unsigned access; /* enum kvx_region_access */
    uint8_t *base;
    uint64_t len;
    uint8_t capability[16];
    uint64_t users;
} kvx_region_t;

/* The regions by id: open addressing, linear probing, deletion by backward shift (no tombstones,
 * so 100,000 register/deregister cycles leave the table as it was). */
typedef struct kvx_regions {
    kvx_region_t **slots;
    size_t cap; /* a power of two, or 0 */
    size_t count;
    uint32_t next_id; /* the next registered region's */
    kvx_region_counters_t counters;
} kvx_regions_t;

/* A peer's region this transport loaded (kvx_region_load), by handle (increasing: the array
 * stays sorted). */
typedef struct kvx_rhandle {
    uint32_t handle;
    uint32_t id;
    unsigned access;
    uint64_t len;
    uint64_t generation; /* the peer process's whose region it is */
    uint8_t capability[16];
} kvx_rhandle_t;

/*
 * A transfer (the initiator's side), and the three verbs that end it, each written once:
 *   kvx_xfer_end(x, status)   xfer/: it ends with status (the first one wins): it leaves its
 *                             connection's accounting, and is done at once, or ENDING first
 *   kvx_xfer_done(x, status)  core/cq.c: DONE, in its peer's completion queue for poll (purged:
 *                             freed instead, never reported)
 *   kvx_xfer_free(x)          core/xfers.c: back to the pool (polled, canceled at once, purged)
 * Its states:
 *   QUEUED   in conn->queue[prio] (or its peer's parked list while the peer pairs again); its
 *            byte stream (its runs, in order) is handed to UCX in messages from posted = 0 up: a
 *            write's WRITE messages, a read's READ_REQ ones
 *   WAITING  every byte posted: in conn->waiting, until the receiver has acknowledged them all
 *            (a write; with KVX_XFER_PARAM_NOTIFY, then its notice) or they all arrived (a read)
 *   ENDING   ended while UCX still held messages of it, which read its local blocks, or received
 *            into them (x->sending): done once UCX has let go of them (xfer/), so that the
 *            caller never reuses blocks UCX still touches; if UCX does not within
 *            KVX_END_GRACE_NS (the stall limit when shorter), its connection fails, which makes
 *            UCX let go (and a close that does not is waited for KVX_END_GRACE_NS more)
 *   DONE     in peer->cq until poll takes it (then it is freed)
 * Canceling: KVX_CANCEL_WAIT marks it (it posts nothing more, and ends -ECANCELED once UCX has
 * let go); KVX_CANCEL_IMMEDIATE forgets it (kvx_xfer_forget: purged, then done at once,
 * unreported). UCX never holds a pointer to a transfer: messages in its hands name their connection
 * and the transfer's id, so a transfer can fail or be forgotten at any time. A reply for a transfer
 * that is gone is dropped: a failed read's local blocks never change after its failure.
 */
enum kvx_xfer_state { KVX_XS_FREE = 0, KVX_XS_QUEUED, KVX_XS_WAITING, KVX_XS_ENDING, KVX_XS_DONE };
#define KVX_END_GRACE_NS (200ull * 1000000ull)

struct kvx_xfer {
    kvx_core_t *core;
    uint64_t id;
    uint8_t state;
    uint8_t op;
    uint8_t prio; /* enum kvx_priority: its queue on its connection */
    bool canceled;
    bool purged;          /* never reported (kvx_xfer_purge) */
    bool notify;          /* its receiver is told when all of it landed (a read: arrived) */
    bool noticed;         /* its notice was sent; NOTICE_ACK ends it */
    bool has_data;        /* its notice carries notice_len bytes at notice_data (its own copy) */
    bool alone;           /* kvx_notice_send's: nothing but the notice, never reported */
    uint32_t cancel_call; /* the kvx_xfer_cancel call that last reported it (dedupes ids) */
    kvx_peer_t *peer;
    kvx_conn_t *conn;
    kvx_list_t conn_link;   /* conn->queue[prio] / waiting, peer->parked, or peer->cq when DONE */
    kvx_list_t active_link; /* core->active: every transfer not yet DONE, for deadlines */
    kvx_run_t *runs;
    uint32_t nruns, next_run, runs_cap;
    kvx_rreg_t *rregs; /* the remote regions its runs name (runs[i].rreg) */
    uint32_t nrregs, rregs_cap;
    uint64_t rgen;    /* the peer's generation its remote regions are of (0: the main one only) */
    uint64_t run_off; /* bytes of runs[next_run] already posted */
    uint64_t posted;  /* bytes of the stream posted */
    uint64_t done;    /* bytes acknowledged (write) or arrived (read) */
    /* its messages UCX still holds (their iov points into its local blocks), and the rendezvous
     * receives of its read data in flight */
    uint32_t sending;
    void *notice_data; /* has_data: the payload (malloc'd; NULL when empty), freed with it */
    uint32_t notice_len;
    uint64_t tag;
    uint64_t epoch; /* the receiver's fence epoch this transfer was submitted under */
    int status;
    int end_status; /* ENDING: the status it will be reported with */
    uint64_t bytes;
    uint64_t pieces; /* the blocks (block calls) or ranges it was submitted with */
    uint64_t t_submit_ns;
    uint64_t t_done_ns;
    uint64_t deadline_ns; /* absolute; 0 = none */
    kvx_xfer_t *next_free;
};

struct kvx_peer {
    char *id;
    kvx_named_t by_id; /* in the core's peers (its name: id) */
    kvx_conn_t *conn;  /* NULL when removed */
    bool removed;
    /* of nxfers, those purged (kvx_xfer_purge: KVX_PEER_REMOVE_PURGE, KVX_PEER_ADD_PURGE),
     * forgotten as they end: a removed peer whose every transfer is purged is unknown
     * (kvx_peer_known), though the object stays until UCX has let go of them */
    uint64_t npurged;
    int last_err;
    kvx_list_t cq;         /* DONE transfers, oldest first */
    kvx_list_t ready_link; /* core->ready while cq is not empty */
    uint64_t nxfers;       /* transfers naming this peer that are not yet freed */
    uint64_t inflight;     /* ... of them, not yet done */
    /* Adds and removes of this id take turns in call order (they wait with the lock released):
     * the call holding ticket turn_now runs, later ones wait. */
    uint64_t turn_next, turn_now;
    /* what its last connection said of the peer (kvx_conn_attach) */
    char last_agent[KVX_NAME_MAX + 1];
    uint64_t last_base, last_num_blocks, last_generation;
    /* the caller's kvx_peer_params_t of the add or connect that installed the connection
     * (field_mask 0: none): a reconnection's metadata passes the same checks */
    kvx_peer_params_t expect;
    /* paired by address (kvx_peer_connect): where it listens, and, once its connection failed,
     * the pairing again (peer/reconnect.c) */
    char *addr;
    bool reconnecting;
    uint64_t next_try_ns, backoff_ns;
    kvx_pairing_t *pg;         /* the attempt under way */
    kvx_list_t reconnect_link; /* the peer layer's reconnects */
    kvx_list_t parked;         /* transfers submitted meanwhile (QUEUED, no connection) */
    /* every transfer's end, counted once (kvx_stats_xfer): kvx_stats_query's figures, and
     * kvx_peer_attr_t's counters derived from them (with the latency's maximum) */
    kvx_stats_t stats;
    uint64_t latency_max_ns;
    /* its regions this transport loaded (kvx_region_load), sorted by handle */
    kvx_rhandle_t *rh;
    uint32_t nrh, rh_cap;
    uint32_t next_handle;
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

/*
 * What the layers below the engine may ask of it, installed by the engine (kvx_engine_init): a
 * call through these is no call up (src/README.md). NULL (a core built by hand, as the fuzzers
 * do): nothing is woken.
 */
typedef struct kvx_core_hooks {
    void *arg;
    /* wake the progress thread if it would otherwise sleep past when_ns (0: now) */
    void (*kick)(void *arg, uint64_t when_ns);
    /* a completion or a notice arrived: application threads in kvx_transport_wait wake */
    void (*arrived)(void *arg);
    /* what the polls hold changed: the event fds follow */
    void (*polls_changed)(void *arg);
    /* sleep until something happens or until_ns, the lock released meanwhile (step: a progress
     * step of the caller's first): kvx_core_wait's */
    void (*sleep)(void *arg, uint64_t until_ns, bool step);
} kvx_core_hooks_t;

struct kvx_core {
    kvx_logger_t log; /* the transport's: kvx_info(core, ...) */

    /* the lock, and the calls that go without it */
    pthread_mutex_t lock;
    pthread_cond_t cond;     /* progress signals connection events to API calls waiting */
    atomic_int lock_waiters; /* API calls waiting for the lock: the progress thread yields */
    bool closed;             /* set when close begins: every later call returns -ESHUTDOWN */
    unsigned unlocked_calls; /* API calls away from the lock (kvx_core_wait): close waits */
    bool conn_event;         /* a connection was wired, failed or closed since the last signal */
    kvx_core_hooks_t hooks;
    kvx_ucx_t *ucx;

    /* the regions peers may address (regions.c), the main one among them */
    kvx_regions_t regions;
    /* the main region (KVX_PARAM_REGION; base NULL and num_blocks 0: none) */
    uint8_t *base;
    uint64_t num_blocks;
    uint64_t block_len;
    uint64_t region_len;
    uint8_t seg_token[KVX_SEG_TOKEN_LEN]; /* an owned region's segment's token (zero: none) */

    /* the settings (kvx_params_t) and who this transport is */
    char fingerprint[KVX_FINGERPRINT_MAX + 1];
    uint64_t deadline_ns;
    uint64_t keepalive_ms;
    uint64_t stall_ns;
    bool integrity;
    int rndv_mode;        /* kvx_rndv_mode (KVX_PARAM_RNDV) */
    uint64_t rndv_thresh; /* ... and its threshold (0: the lane's) */
    uint8_t *secret;      /* NULL: none */
    size_t secret_len;
    kvx_host_id_t host;
    uint64_t generation;
    uint8_t capability[16];

    /* peers by id (peers.c) */
    kvx_names_t peers; /* removed ones included */
    size_t nconnected; /* peers with a connection */
    kvx_list_t ready;  /* peers with completions */

    /* transfers: objects are pooled (xfers.c); the pool keeps what recent peaks needed */
    kvx_idmap_t ids;
    kvx_xfer_t *free_xfers;
    size_t nfree, nlive;              /* transfer objects in the pool / in use */
    size_t live_peak, live_peak_prev; /* the most in use in this and the previous period */
    uint64_t xfer_mallocs;            /* transfer objects allocated over the transport's life */
    uint64_t next_seq;
    kvx_list_t active;         /* transfers not yet DONE */
    uint64_t next_deadline_ns; /* earliest deadline in active, or later; UINT64_MAX = none */

    /* the counters (stats.c) */
    kvx_stats_t stats;             /* every peer's transfers, cumulative */
    kvx_recv_counters_t rcounters; /* what peers did to this region, and what kvx dropped */
    uint64_t maps_refused;         /* peers' regions kvx would not map (kvx.h) */
};

/* ---- locking -------------------------------------------------------------------------------- */

/* API calls announce themselves so that a busy progress thread lets them in (glibc mutexes are
 * not fair: a thread that unlocks and relocks in a loop would starve them). */
static inline void kvx_lock(kvx_core_t *c)
{
    atomic_fetch_add_explicit(&c->lock_waiters, 1, memory_order_relaxed);
    pthread_mutex_lock(&c->lock);
    atomic_fetch_sub_explicit(&c->lock_waiters, 1, memory_order_relaxed);
}
static inline void kvx_unlock(kvx_core_t *c) { pthread_mutex_unlock(&c->lock); }
/* A call that applications make in a loop (kvx_transport_poll) first lets announced callers in:
 * unlocking and relocking at once, a poller spinning on two cores kept an urgent submit waiting
 * 25-30 ms for the lock (kvx-bench --hol). Bounded: a few microseconds when nobody else runs. */
static inline void kvx_defer_to_waiters(kvx_core_t *c)
{
    for (int i = 0; i < 64 && atomic_load_explicit(&c->lock_waiters, memory_order_relaxed) > 0; i++)
        sched_yield();
}
/* An API call's entry: the lock taken (0), or -ESHUTDOWN when the transport closes (unlocked). */
static inline int kvx_enter(kvx_core_t *c)
{
    kvx_lock(c);
    if (c->closed) {
        kvx_unlock(c);
        return -ESHUTDOWN;
    }
    return 0;
}

/*
 * The one way an API call goes without the lock for a while (wait.c): until done(arg), looked at
 * with the lock held, says so, the transport closes, or until_ns. Between looks it sleeps through
 * the engine's hook (on the progress thread's signal, or with no thread a progress step of its
 * own; step: a step first, for a call that must not wait for the thread's next wake-up), at most
 * slice_ns at a time (0: until until_ns); or, with work, it runs work(arg) with the lock released
 * instead (one piece of a job that must not hold the lock). Close waits for every such call to
 * come back. Returns 0 (done), -ETIMEDOUT or -ESHUTDOWN. Lock held on entry and on return.
 */
typedef struct kvx_wait {
    bool (*done)(void *arg);
    void (*work)(void *arg);
    void *arg;
    uint64_t until_ns;
    uint64_t slice_ns;
    bool step;
} kvx_wait_t;
int kvx_core_wait(kvx_core_t *c, const kvx_wait_t *w);

/* ---- the engine's hooks --------------------------------------------------------------------- */

static inline void kvx_core_kick(kvx_core_t *c, uint64_t when_ns)
{
    if (c->hooks.kick != NULL)
        c->hooks.kick(c->hooks.arg, when_ns);
}
static inline void kvx_core_arrived(kvx_core_t *c)
{
    if (c->hooks.arrived != NULL)
        c->hooks.arrived(c->hooks.arg);
}
static inline void kvx_core_polls_changed(kvx_core_t *c)
{
    if (c->hooks.polls_changed != NULL)
        c->hooks.polls_changed(c->hooks.arg);
}

/* Whether this transport takes rendezvous payloads (it did not choose KVX_RNDV_EAGER): what its
 * handshakes tell peers (KVX_MSGF_RNDV), and what it refuses when a peer sends one anyway. */
static inline bool kvx_core_takes_rndv(const kvx_core_t *c)
{
    return c->rndv_mode != KVX_RNDV_EAGER;
}

/* Rendezvous receives in flight stalled: the oldest began (since_ns) and none ended (done_ns)
 * for longer than stall_ns. UCX says nothing of a receive until it ends, so a slow but moving
 * sender shows as receives that end: only a piece that alone takes longer than the stall limit
 * (4 MiB at under 2 MB/s with the default 2 s) trips it. */
static inline bool kvx_stalled(uint64_t since_ns, uint64_t done_ns, uint64_t now, uint64_t stall_ns)
{
    uint64_t last = done_ns > since_ns ? done_ns : since_ns;
    return now > last && now - last > stall_ns;
}

/* ---- peers by id (peers.c) ------------------------------------------------------------------ */

kvx_peer_t *kvx_peer_lookup(const kvx_core_t *c, const char *id);
/* Every peer in turn, removed ones included: the first with p NULL and *slot 0, then the one
 * after p; NULL at the end. */
kvx_peer_t *kvx_peer_next(const kvx_core_t *c, size_t *slot, const kvx_peer_t *p);
/* Whether the application still knows p by its id (kvx_peer_query, kvx_stats_query): it has a
 * connection, or it was removed and still holds transfers whose completions will come out of
 * poll (not when it was purged: those are forgotten). An add still under way has neither. */
static inline bool kvx_peer_known(const kvx_peer_t *p)
{
    return p != NULL && (p->conn != NULL || p->nxfers > p->npurged);
}
/* An entry for a new id, invisible (removed) until a connection is installed; NULL: no memory. */
kvx_peer_t *kvx_peer_new(kvx_core_t *c, const char *peer_id);
bool kvx_peer_id_ok(const char *id);
/* A removed peer lives on while the application still has transfers of it to poll. */
void kvx_peer_maybe_free(kvx_core_t *c, kvx_peer_t *p);
void kvx_peer_free_all(kvx_core_t *c);

/* ---- regions (regions.c) -------------------------------------------------------------------- */

kvx_region_t *kvx_region_find(const kvx_core_t *c, uint32_t id);
/* A new region (its id the next one, or KVX_REGION_MAIN for the first with main): 0 and *r_p,
 * -ENOSPC (KVX_REGIONS_MAX) or -ENOMEM; nothing changed on failure. */
int kvx_region_add(kvx_core_t *c, uint8_t *base, uint64_t len, unsigned access,
                   const uint8_t cap[16], bool main, kvx_region_t **r_p);
/* Out of the table and freed (no user left). */
void kvx_region_remove(kvx_core_t *c, kvx_region_t *r);
void kvx_region_free_all(kvx_core_t *c);
/* A peer's message names region id with capability cap, to do access (KVX_REGION_WRITE or
 * READ): the region (live), or NULL with *err: -ENOENT (unknown or dead), -EACCES (capability
 * or access); counted. The main region's capability is its connection's (the field is zero). */
kvx_region_t *kvx_region_check(kvx_core_t *c, uint32_t id, const uint8_t *cap, unsigned access,
                               int *err);
/* The receiving side's hold on r's memory begins (get) or ends (put); a deregistration waits
 * for the last to end (it looks again every millisecond). */
static inline void kvx_region_get(kvx_region_t *r) { r->users++; }
static inline void kvx_region_put(kvx_region_t *r) { r->users--; }
/* A run of len bytes at off fits in r. */
static inline bool kvx_region_fits(const kvx_region_t *r, uint64_t off, uint64_t len)
{
    return off <= r->len && len <= r->len - off;
}
/* Whether transfer x names local region id (a deregistration ends it). */
bool kvx_xfer_names_region(const kvx_xfer_t *x, uint32_t id);
/* A peer's loaded handle, or NULL. */
kvx_rhandle_t *kvx_rhandle_find(const kvx_peer_t *p, uint32_t handle);

/* ---- ids of connections (ids.c) ------------------------------------------------------------- */

int kvx_idtab_alloc(kvx_idtab_t *tab, void *obj, uint32_t *id_p);
void *kvx_idtab_get(const kvx_idtab_t *tab, uint32_t id);
void kvx_idtab_release(kvx_idtab_t *tab, uint32_t id);

/* ---- counters (stats.c) --------------------------------------------------------------------- */

/* A transfer of peer p ended with status after lat_ns (bytes: what it covered): the one place a
 * transfer's end is counted, for the transport and for the peer. */
void kvx_stats_xfer(kvx_core_t *c, kvx_peer_t *p, int op, int status, uint64_t bytes,
                    uint64_t lat_ns);
/* Count a message dropped before it could be tied to a connection (why: KVX_DROP_*). */
void kvx_count_drop(kvx_core_t *c, int why);

/* ---- transfer objects (xfers.c) ------------------------------------------------------------- */

/* A transfer object with a fresh id (unique for the transport's life): 0, -ENOSPC when too many
 * transfers are in flight or unpolled, or -ENOMEM. */
int kvx_xfer_alloc(kvx_core_t *c, kvx_xfer_t **x_p);
/* Back to the pool: x leaves its lists and its peer's count (which may free the peer); nothing,
 * kvx's or UCX's, refers to it any more. */
void kvx_xfer_free(kvx_xfer_t *x);
kvx_xfer_t *kvx_xfer_lookup(kvx_core_t *c, uint64_t id);
/* Once per housekeeping period: idle objects beyond what recent peaks needed go. */
void kvx_xfer_trim_pool(kvx_core_t *c);
void kvx_xfer_free_all(kvx_core_t *c);

/* ---- completion (cq.c) ---------------------------------------------------------------------- */

/* DONE with status (-ECANCELED if it was canceled): counted, and into its peer's queue for poll,
 * or, purged, freed. */
void kvx_xfer_done(kvx_xfer_t *x, int status);
/* Never reported: it is forgotten as it ends (its peer's npurged counts it until it is freed). */
void kvx_xfer_purge(kvx_xfer_t *x);
/* ... and so is every transfer of p not yet done, of connection conn (NULL: of any). */
void kvx_xfer_purge_peer(kvx_core_t *c, kvx_peer_t *p, const kvx_conn_t *conn);
/* Up to max of p's completions into out, freed (the last may free p). */
size_t kvx_cq_drain(kvx_peer_t *p, kvx_completion_t *out, size_t max);

/* How often stall and liveness checks run while transfers are in flight. */
#define KVX_HOUSEKEEPING_NS 100000000ull

#endif /* KVX_CORE_H */
