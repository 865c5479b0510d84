/*
 * The progress engine (src/README.md): one step over every layer below (progress.c), the
 * progress thread (thread.c), the wake-ups of the threads that wait on the transport and the
 * event fds (wake.c), and its life with the core's hooks through which the layers below reach
 * them (engine.c). Its state
 * is kvx_engine_t, which sees the other layers' state by pointer. Only the api calls it.
 */
#ifndef KVX_ENGINE_H
#define KVX_ENGINE_H

#include "peer/kvx_peer.h"
#include "recv/kvx_recv.h"

/* After the last sign of activity a progress loop keeps polling this long before it arms the
 * event fd and sleeps: on tcp, arming after every empty progress costs ~50x more wake-ups. */
#define KVX_SPIN_NS 100000ull

typedef struct kvx_engine {
    /* the layers it steps */
    kvx_core_t *core;
    kvx_conns_t *conns;
    kvx_recv_t *recv;
    kvx_peers_t *peers;
    uint64_t next_housekeeping_ns; /* stall and liveness checks, pool trimming */
    uint64_t next_pool_trim_ns;

    /* the progress thread */
    uint64_t spin_ns; /* how long a progress loop polls on after the last work (KVX_SPIN_NS) */
    _Atomic uint64_t app_poll_ns; /* last time the application polled (it drives UCX then) */
    bool thread_drives;           /* KVX_THREAD_DRIVES: the thread never steps aside */
    uint64_t thread_asides;       /* times it stepped aside (kvx_transport_query) */
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
} kvx_engine_t;

/* The application polled (lock held): the progress thread steps aside for it, unless it always
 * drives (KVX_THREAD_DRIVES) or the application waits on an event fd (one poll per wake-up:
 * stepping aside would add up to a millisecond to each). The clock is read only then. */
static inline void kvx_engine_app_polled(kvx_engine_t *e)
{
    if (!e->ev_used && !e->thread_drives)
        atomic_store_explicit(&e->app_poll_ns, kvx_now_ns(), memory_order_relaxed);
}

/* ---- the engine's life, and the core's hooks (engine.c) ------------------------------------- */

/* The engine of these layers, its hooks installed in the core: 0, or the negative errno of
 * eventfd(2) (nothing to undo). */
int kvx_engine_init(kvx_engine_t *e, kvx_core_t *core, kvx_conns_t *conns, kvx_recv_t *recv,
                    kvx_peers_t *peers);
/* The transport closed: application threads in kvx_transport_wait woke (kvx_transport_close),
 * every event fd is readable for good, so that a loop asleep on one wakes. */
void kvx_engine_closed(kvx_engine_t *e);
/* Its descriptors go (kvx_transport_destroy). */
void kvx_engine_fini(kvx_engine_t *e);

/* ---- wake-ups (wake.c) ---------------------------------------------------------------------- */
/* Make each event fd readable or not, as the polls of its kinds have something or not (after
 * anything that may change that: a step, a completion, a drain). Cheap when nothing changed. */
void kvx_events_update(kvx_engine_t *e);
/* Make a new event fd for kinds and bring it to the polls' state (lock held): its fd, or the
 * negative errno of eventfd(2). */
int kvx_events_open(kvx_engine_t *e, unsigned kinds);
/* Application threads sleeping in kvx_transport_wait wake (a completion or a notice came). */
void kvx_notify_waiters(kvx_engine_t *e);
/* Wake the progress thread if it would otherwise sleep past when_ns (0: now). */
void kvx_kick(kvx_engine_t *e, uint64_t when_ns);
/* The transport closed: every event fd readable for good, so that a loop asleep on one wakes. */
void kvx_events_closed(kvx_engine_t *e);

/* ---- progress (progress.c) ------------------------------------------------------------------ */

/* One step over every layer: UCX progress, then what its callbacks deferred (connections'
 * work, pairings, the receiving side's replies), deadlines, pairing again, housekeeping. The
 * work done. */
unsigned kvx_progress_step(kvx_engine_t *e);
/* Sleep until something happens or until_ns (lock held, released meanwhile): on the progress
 * thread's signal, or, with no thread, a step of the caller's own. */
void kvx_progress_wait_event(kvx_engine_t *e, uint64_t until_ns);
/* kvx_transport_wait's loop (lock held): 1 when peer_id (NULL: any) has a completion, 0 at
 * end_ns, -ESHUTDOWN at close. */
int kvx_progress_wait_cq(kvx_engine_t *e, const char *peer_id, uint64_t end_ns);

/* How a progress loop rests between steps (the progress thread's, kvx_transport_wait's). */
typedef struct kvx_rest {
    uint64_t last_work;
    uint64_t pause;
    unsigned refused; /* sleeps UCX refused in a row while the steps found nothing */
} kvx_rest_t;
void kvx_rest_init(kvx_rest_t *r, uint64_t now);
/* After a step that did n things: 0 to step again at once, else the time to sleep until, with
 * *stalled set when the sleep is a pause over work only polling advances. */
uint64_t kvx_progress_rest(kvx_engine_t *e, kvx_rest_t *r, unsigned n, uint64_t now, bool *stalled);
/* Arm the worker's event fd and sleep (lock released) until UCX has events, fd is readable, or
 * until_ns: whether UCX refused to arm (kvx_rest_woke takes it). */
bool kvx_progress_sleep(kvx_engine_t *e, int fd, uint64_t now, uint64_t until_ns, bool stalled);
void kvx_rest_woke(kvx_rest_t *r, bool stalled, bool refused);

/* ---- the progress thread (thread.c) --------------------------------------------------------- */

int kvx_progress_start(kvx_engine_t *e);
void kvx_progress_stop(kvx_engine_t *e);

#endif /* KVX_ENGINE_H */
