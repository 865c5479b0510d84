/*
 * The progress engine: one step (UCX progress, deferred connection work, deadlines), and the
 * passive-target thread that runs it so peers' transfers into this region complete while the
 * application never calls kvx. Idle, the thread sleeps on the worker's event fd.
 */
#include "engine/kvx_engine.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Spinning with nothing to do for this long, the thread yields its core at each step: a target
 * among many on few cores then gives its time to those with work (8 targets on 2 cores went from
 * 0.5x to 0.7-0.8x one target's rate), while a reply that comes sooner is still caught at once. */
#define KVX_YIELD_AFTER_NS 5000ull
/* Pauses over work only polling advances, once nothing moved for KVX_SPIN_NS. */
#define KVX_STALL_MIN_NS 100000ull
#define KVX_STALL_MAX_NS 5000000ull
/* An application that polled this recently is driving UCX itself. */
#define KVX_APP_ACTIVE_NS 1000000ull
/* The thread wakes at least once per keepalive interval, and four times as often while transfers
 * are in flight. With UCX's own keepalive setting (keepalive_ms == 0), once a second. */
#define KVX_KEEPALIVE_DIVISOR 4
#define KVX_IDLE_TICK_NS 1000000000ull
/* Stall and liveness checks run every KVX_HOUSEKEEPING_NS while transfers are in flight (and at
 * every idle tick otherwise); the transfer pool is trimmed once per KVX_POOL_PERIOD_NS. */
#define KVX_POOL_PERIOD_NS 1000000000ull

static bool kvx_progress_sleep(kvx_transport_t *t, int fd, uint64_t now, uint64_t until_ns,
                               bool stalled);

static void kvx_progress_housekeeping(kvx_transport_t *t, uint64_t now)
{
    kvx_conns_housekeeping(&t->conns, now);
    kvx_pairings_housekeeping(&t->peers, now);
    kvx_recv_housekeeping(&t->recv, now);
    if (now >= t->next_pool_trim_ns) {
        kvx_xfer_trim_pool(&t->core);
        t->next_pool_trim_ns = now + KVX_POOL_PERIOD_NS;
    }
    t->next_housekeeping_ns = now + KVX_HOUSEKEEPING_NS;
}

unsigned kvx_progress_step(kvx_transport_t *t)
{
    unsigned n = kvx_ucx_progress(t->core.ucx);
    uint64_t now;

    /* Connections that asked for work during UCX callbacks (resume posting, fail) are served
     * here, outside the callbacks. Work they queue again waits for the next step. */
    n += kvx_conns_work(&t->conns);
    /* pairing by address: what UCX's callbacks recorded */
    if (t->peers.pair_work) {
        t->peers.pair_work = false;
        n += kvx_pairings_work(&t->peers);
    }
    /* the receiving side: handshakes, acknowledgements, read data */
    if (kvx_recv_has_work(&t->recv))
        n += kvx_recv_work(&t->recv);
    now = kvx_now_ns();
    kvx_xfer_check_deadlines(&t->core, now);
    if (now >= t->peers.next_reconnect_ns) { /* peers paired by address pairing again */
        kvx_reconnect_step(&t->peers, now);
        now = kvx_now_ns(); /* a connection it made counts its progress from later than now */
    }
    if (now >= t->next_housekeeping_ns)
        kvx_progress_housekeeping(t, now);
    /* API calls waiting on a connection (kvx_peer_add, kvx_peer_remove) look again */
    if (t->core.conn_event) {
        t->core.conn_event = false;
        if (t->core.unlocked_calls > 0)
            pthread_cond_broadcast(&t->core.cond);
    }
    if (t->ev_used) /* notices and peer events come in steps */
        kvx_events_update(t);
    return n;
}

void kvx_progress_wait_event(kvx_transport_t *t, uint64_t until_ns)
{
    uint64_t now = kvx_now_ns(), step = now + 1000000ull;

    if (now >= until_ns)
        return;
    if (t->thread_running) {
        /* the progress thread signals t->core.cond; look again every 10 ms regardless */
        uint64_t at = until_ns < now + 10000000ull ? until_ns : now + 10000000ull;
        struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull),
                              .tv_nsec = (long)(at % 1000000000ull)};
        pthread_cond_timedwait(&t->core.cond, &t->core.lock, &ts);
        return;
    }
    /* no progress thread: the waiting call drives progress, resting on UCX's event fd */
    if (kvx_progress_step(t) == 0)
        kvx_progress_sleep(t, -1, now, until_ns < step ? until_ns : step, false);
}

/* Work that only polling can advance: UCX does not signal free space in a shared-memory FIFO. */
static bool kvx_progress_needs_polling(kvx_transport_t *t)
{
    return kvx_conns_need_polling(&t->conns) || kvx_recv_needs_polling(&t->recv);
}

/* When the progress engine must look again at the latest: the next deadline, and UCX's
 * keepalive, which only runs inside progress (it notices dead peers and reclaims endpoints that
 * removed peers left here). */
static uint64_t kvx_progress_tick(kvx_transport_t *t, uint64_t now)
{
    uint64_t until =
        now + (t->core.keepalive_ms ? t->core.keepalive_ms * 1000000ull : KVX_IDLE_TICK_NS) /
                  (kvx_list_empty(&t->core.active) ? 1 : KVX_KEEPALIVE_DIVISOR);
    if (!kvx_list_empty(&t->core.active) && t->next_housekeeping_ns < until)
        until = t->next_housekeeping_ns;
    if (t->peers.next_reconnect_ns < until)
        until = t->peers.next_reconnect_ns;
    return t->core.next_deadline_ns < until ? t->core.next_deadline_ns : until;
}

/*
 * How a progress loop rests: spin while work moves and for KVX_SPIN_NS after; then sleep on the
 * worker's event fd. Work that only polling advances (operations queued behind a full
 * shared-memory FIFO, which UCX does not signal freeing) keeps the loop spinning, but once
 * nothing has moved for KVX_SPIN_NS the peer is slow or stopped: the loop then looks again after
 * pauses that double up to KVX_STALL_MAX_NS instead of burning a core until the deadline.
 *
 * UCX can also refuse to let the loop sleep while having nothing for it: after a peer died with
 * kvx's messages in its full shared-memory FIFO, UCX retries flushing that endpoint for good
 * (uct_mm_ep_flush ignores UCT_FLUSH_FLAG_CANCEL, 1.13 to 1.19) and ucp_worker_arm answers busy
 * every time. After KVX_BUSY_IDLE_MAX such refusals in a row with no work found, the loop pauses
 * as when stalled, up to KVX_BUSY_PAUSE_MAX_NS: events then wait at most that long.
 */
#define KVX_BUSY_IDLE_MAX 2
#define KVX_BUSY_PAUSE_MAX_NS 1000000ull

typedef struct kvx_rest {
    uint64_t last_work;
    uint64_t pause;
    unsigned busy_idle; /* sleeps UCX refused in a row while the steps found nothing */
} kvx_rest_t;

/* After a step that did n things: 0 to step again at once, else the time to sleep until, with
 * *stalled set when the sleep is a pause over work only polling advances. */
static uint64_t kvx_progress_rest(kvx_transport_t *t, kvx_rest_t *r, unsigned n, uint64_t now,
                                  bool *stalled)
{
    uint64_t tick = kvx_progress_tick(t, now);

    uint64_t max = KVX_STALL_MAX_NS;

    if (n > 0) {
        r->last_work = now;
        r->pause = KVX_STALL_MIN_NS;
        r->busy_idle = 0;
        return 0;
    }
    if (now - r->last_work < t->spin_ns)
        return 0;
    *stalled = kvx_progress_needs_polling(t);
    if (!*stalled && r->busy_idle >= KVX_BUSY_IDLE_MAX) {
        *stalled = true;
        max = KVX_BUSY_PAUSE_MAX_NS;
    }
    if (!*stalled)
        return tick;
    now += r->pause;
    r->pause = r->pause * 2 < max ? r->pause * 2 : max;
    return now < tick ? now : tick;
}

/* After a sleep: busy says whether UCX refused to arm (events pending, found or not by the next
 * step). Refusals count only while they come in a row: one that UCX grants ends the pausing
 * (around its keepalive rounds UCX refuses twice or so, and the loop then paused 1 ms at a time
 * until the next work came: ~930 wake-ups in every other idle second). A real sleep ends in a
 * burst of events, likely: spin again. */
static void kvx_rest_woke(kvx_rest_t *r, bool stalled, bool busy)
{
    if (busy) {
        r->busy_idle++;
        return;
    }
    r->busy_idle = 0;
    if (!stalled)
        r->last_work = kvx_now_ns();
}

/*
 * Arm the worker's event fd and sleep, with the lock released, until UCX has events, fd is
 * readable, or until_ns. If UCX has events pending already (it refuses to arm), return true: at
 * once, unless stalled: then after a pause until until_ns or fd anyway. Lock held on entry and
 * on return.
 */
static bool kvx_progress_sleep(kvx_transport_t *t, int fd, uint64_t now, uint64_t until_ns,
                               bool stalled)
{
    struct pollfd fds[2] = {{.fd = fd, .events = POLLIN},
                            {.fd = kvx_ucx_event_fd(t->core.ucx), .events = POLLIN}};
    uint64_t d = until_ns > now ? until_ns - now : 0, v;
    struct timespec ts = {.tv_sec = (time_t)(d / 1000000000ull),
                          .tv_nsec = (long)(d % 1000000000ull)};
    nfds_t nfds = 2;
    bool refused = false;

    if (kvx_ucx_arm(t->core.ucx) == -EBUSY) {
        if (!stalled)
            return true;
        refused = true;
        nfds = 1;
    } else if (kvx_ucx_progress(t->core.ucx) > 0) {
        /* ucp_worker_arm arms only the interfaces in use. One whose last endpoint just went
         * (a peer removed) is re-armed by a callback that the next ucp_worker_progress runs;
         * asleep before that, a message arriving on it (a peer connecting again) would wake
         * nobody until the next tick. This progress runs it; if it found work, look again. */
        return false;
    }
    pthread_mutex_unlock(&t->core.lock);
    if (ppoll(fds, nfds, &ts, NULL) > 0 && (fds[0].revents & POLLIN) &&
        read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        kvx_warn(&t->core, "progress: reading fd %d: %s", fd, strerror(errno));
    pthread_mutex_lock(&t->core.lock);
    return refused;
}

static void *kvx_progress_main(void *arg)
{
    kvx_transport_t *t = arg;
    kvx_rest_t rest = {.last_work = kvx_now_ns(), .pause = KVX_STALL_MIN_NS};
    uint64_t now, until;
    bool stalled, busy;

    pthread_mutex_lock(&t->core.lock);
    while (!t->thread_stop) {
        now = kvx_now_ns();
        if (now - atomic_load_explicit(&t->app_poll_ns, memory_order_relaxed) < KVX_APP_ACTIVE_NS) {
            /* The application is polling, and its polls drive UCX: two threads taking turns on
             * one worker only slow each other down. Step aside, and look again each
             * KVX_APP_ACTIVE_NS without the lock for as long as the application keeps polling:
             * taking the lock only to let it go again made the application's unlocks wake this
             * thread (a futex call in its posting path, some 3,000 a second). A stop (the wake
             * fd) ends the step aside at once. */
            struct pollfd wake = {.fd = t->wake_fd, .events = POLLIN};
            struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)KVX_APP_ACTIVE_NS};
            uint64_t v;
            pthread_mutex_unlock(&t->core.lock);
            do {
                if (ppoll(&wake, 1, &ts, NULL) > 0) {
                    if (read(t->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                        kvx_warn(&t->core, "progress: reading wake fd: %s", strerror(errno));
                    break;
                }
            } while (kvx_now_ns() - atomic_load_explicit(&t->app_poll_ns, memory_order_relaxed) <
                     KVX_APP_ACTIVE_NS);
            pthread_mutex_lock(&t->core.lock);
            rest.last_work = kvx_now_ns();
            continue;
        }
        unsigned n = kvx_progress_step(t);
        now = kvx_now_ns();
        until = kvx_progress_rest(t, &rest, n, now, &stalled);
        if (until == 0) {
            pthread_mutex_unlock(&t->core.lock);
            if ((n == 0 && now - rest.last_work > KVX_YIELD_AFTER_NS) ||
                atomic_load_explicit(&t->core.lock_waiters, memory_order_relaxed) > 0)
                sched_yield();
            pthread_mutex_lock(&t->core.lock);
            continue;
        }
        t->thread_sleeping = true;
        t->thread_wake_at_ns = until;
        busy = kvx_progress_sleep(t, t->wake_fd, now, until, stalled);
        t->thread_sleeping = false;
        kvx_rest_woke(&rest, stalled, busy);
    }
    pthread_mutex_unlock(&t->core.lock);
    return NULL;
}

/* kvx_transport_wait's loop (lock held): progress steps, resting between them on the
 * completion fd, until peer_id (or any peer, NULL) has a completion (1), end_ns (0) or close. */
int kvx_progress_wait_cq(kvx_transport_t *t, const char *peer_id, uint64_t end)
{
    uint64_t now = kvx_now_ns(), until;
    kvx_rest_t rest = {.last_work = now, .pause = KVX_STALL_MIN_NS};
    bool stalled;
    int rc;

    t->waiters++;
    for (;;) {
        kvx_peer_t *p;
        unsigned n;

        if (t->core.closed) {
            rc = -ESHUTDOWN;
            break;
        }
        n = kvx_progress_step(t);
        now = kvx_now_ns();
        atomic_store_explicit(&t->app_poll_ns, now, memory_order_relaxed);
        p = peer_id != NULL ? kvx_peer_lookup(&t->core, peer_id) : NULL;
        if (peer_id != NULL ? p != NULL && !kvx_list_empty(&p->cq)
                            : !kvx_list_empty(&t->core.ready)) {
            rc = 1;
            break;
        }
        if (now >= end) {
            rc = 0;
            break;
        }
        until = kvx_progress_rest(t, &rest, n, now, &stalled);
        if (until == 0) {
            kvx_unlock(&t->core);
            sched_yield();
            kvx_lock(&t->core);
            continue;
        }
        t->cq_signaled = false;
        kvx_rest_woke(&rest, stalled,
                      kvx_progress_sleep(t, t->cq_fd, now, until < end ? until : end, stalled));
    }
    t->waiters--;
    if (t->core.closed)
        pthread_cond_broadcast(&t->core.cond); /* close waits for the waiters to leave */
    return rc;
}

int kvx_progress_start(kvx_transport_t *t)
{
    sigset_t all, old;
    int rc;

    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->wake_fd < 0) {
        rc = -errno;
        kvx_error(&t->core, "progress: eventfd: %s", strerror(errno));
        return rc;
    }
    t->thread_stop = false;
    /* the thread takes no signals: they belong to the application's threads */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = -pthread_create(&t->thread, NULL, kvx_progress_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc < 0) {
        kvx_error(&t->core, "progress: pthread_create: %s", strerror(-rc));
        close(t->wake_fd);
        t->wake_fd = -1;
        return rc;
    }
    t->thread_running = true;
    return 0;
}

void kvx_progress_stop(kvx_transport_t *t)
{
    uint64_t one = 1;

    kvx_lock(&t->core);
    if (!t->thread_running) {
        kvx_unlock(&t->core);
        return;
    }
    t->thread_stop = true;
    if (write(t->wake_fd, &one, sizeof(one)) < 0)
        kvx_warn(&t->core, "progress: waking thread to stop: %s", strerror(errno));
    kvx_unlock(&t->core);
    pthread_join(t->thread, NULL);
    close(t->wake_fd);
    t->wake_fd = -1;
    t->thread_running = false;
}
