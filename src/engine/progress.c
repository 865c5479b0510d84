/*
 * The progress engine: one step (UCX progress, deferred connection work, deadlines, pairing
 * again, housekeeping), how a progress loop rests between steps (spin, pause, sleep on the
 * worker's event fd), and the loops that drive it from a caller's thread (a wait for an event,
 * kvx_transport_wait). The passive-target thread that runs it is thread.c's.
 */
#include "engine/kvx_engine.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Pauses over work only polling advances, once nothing moved for KVX_SPIN_NS. */
#define KVX_STALL_MIN_NS 100000ull
#define KVX_STALL_MAX_NS 5000000ull
/* The thread wakes at least once per keepalive interval, and four times as often while transfers
 * are in flight. With UCX's own keepalive setting (keepalive_ms == 0), once a second. */
#define KVX_KEEPALIVE_DIVISOR 4
#define KVX_IDLE_TICK_NS 1000000000ull
/* Stall and liveness checks run every KVX_HOUSEKEEPING_NS while transfers are in flight (and at
 * every idle tick otherwise); the transfer pool is trimmed once per KVX_POOL_PERIOD_NS. */
#define KVX_POOL_PERIOD_NS 1000000000ull

bool kvx_progress_sleep(kvx_engine_t *e, int fd, uint64_t now, uint64_t until_ns, bool stalled);

static void kvx_progress_housekeeping(kvx_engine_t *e, uint64_t now)
{
    kvx_conns_housekeeping(e->conns, now);
    kvx_pairings_housekeeping(e->peers, now);
    kvx_recv_housekeeping(e->recv, now);
    if (now >= e->next_pool_trim_ns) {
        kvx_xfer_trim_pool(e->core);
        e->next_pool_trim_ns = now + KVX_POOL_PERIOD_NS;
    }
    e->next_housekeeping_ns = now + KVX_HOUSEKEEPING_NS;
}

unsigned kvx_progress_step(kvx_engine_t *e)
{
    unsigned n = kvx_ucx_progress(e->core->ucx);
    uint64_t now;

    /* Connections that asked for work during UCX callbacks (resume posting, fail) are served
     * here, outside the callbacks. Work they queue again waits for the next step. */
    n += kvx_conns_work(e->conns);
    /* pairing by address: what UCX's callbacks recorded */
    if (e->peers->pair_work) {
        e->peers->pair_work = false;
        n += kvx_pairings_work(e->peers);
    }
    /* the receiving side: handshakes, acknowledgements, read data */
    if (kvx_recv_has_work(e->recv))
        n += kvx_recv_work(e->recv);
    now = kvx_now_ns();
    kvx_xfer_check_deadlines(e->core, now);
    if (now >= e->peers->next_reconnect_ns) { /* peers paired by address pairing again */
        kvx_reconnect_step(e->peers, now);
        now = kvx_now_ns(); /* a connection it made counts its progress from later than now */
    }
    if (now >= e->next_housekeeping_ns)
        kvx_progress_housekeeping(e, now);
    /* API calls waiting on a connection (kvx_peer_add, kvx_peer_remove) look again */
    if (e->core->conn_event) {
        e->core->conn_event = false;
        if (e->core->unlocked_calls > 0)
            pthread_cond_broadcast(&e->core->cond);
    }
    if (e->ev_used) /* notices and peer events come in steps */
        kvx_events_update(e);
    return n;
}

void kvx_progress_wait_event(kvx_engine_t *e, uint64_t until_ns)
{
    uint64_t now = kvx_now_ns(), step = now + 1000000ull;

    if (now >= until_ns)
        return;
    if (e->thread_running) {
        /* the progress thread signals e->core->cond; look again every 10 ms regardless */
        uint64_t at = until_ns < now + 10000000ull ? until_ns : now + 10000000ull;
        struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull),
                              .tv_nsec = (long)(at % 1000000000ull)};
        pthread_cond_timedwait(&e->core->cond, &e->core->lock, &ts);
        return;
    }
    /* no progress thread: the waiting call drives progress, resting on UCX's event fd */
    if (kvx_progress_step(e) == 0)
        kvx_progress_sleep(e, -1, now, until_ns < step ? until_ns : step, false);
}

/* Work that only polling can advance: UCX does not signal free space in a shared-memory FIFO. */
static bool kvx_progress_needs_polling(kvx_engine_t *e)
{
    return kvx_conns_need_polling(e->conns) || kvx_recv_needs_polling(e->recv);
}

/* When the progress engine must look again at the latest: the next deadline, and UCX's
 * keepalive, which only runs inside progress (it notices dead peers and reclaims endpoints that
 * removed peers left here). */
static uint64_t kvx_progress_tick(kvx_engine_t *e, uint64_t now)
{
    uint64_t until =
        now + (e->core->keepalive_ms ? e->core->keepalive_ms * 1000000ull : KVX_IDLE_TICK_NS) /
                  (kvx_list_empty(&e->core->active) ? 1 : KVX_KEEPALIVE_DIVISOR);
    if (!kvx_list_empty(&e->core->active) && e->next_housekeeping_ns < until)
        until = e->next_housekeeping_ns;
    if (e->peers->next_reconnect_ns < until)
        until = e->peers->next_reconnect_ns;
    return e->core->next_deadline_ns < until ? e->core->next_deadline_ns : until;
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
 * every time. After KVX_REFUSED_MAX such refusals in a row with no work found, the loop pauses
 * as when stalled, up to KVX_REFUSED_PAUSE_MAX_NS: events then wait at most that long.
 */
#define KVX_REFUSED_MAX 2
#define KVX_REFUSED_PAUSE_MAX_NS 1000000ull

void kvx_rest_init(kvx_rest_t *r, uint64_t now)
{
    r->last_work = now;
    r->pause = KVX_STALL_MIN_NS;
    r->refused = 0;
}

uint64_t kvx_progress_rest(kvx_engine_t *e, kvx_rest_t *r, unsigned n, uint64_t now, bool *stalled)
{
    uint64_t tick = kvx_progress_tick(e, now);

    uint64_t max = KVX_STALL_MAX_NS;

    if (n > 0) {
        r->last_work = now;
        r->pause = KVX_STALL_MIN_NS;
        r->refused = 0;
        return 0;
    }
    if (now - r->last_work < e->spin_ns)
        return 0;
    *stalled = kvx_progress_needs_polling(e);
    if (!*stalled && r->refused >= KVX_REFUSED_MAX) {
        *stalled = true;
        max = KVX_REFUSED_PAUSE_MAX_NS;
    }
    if (!*stalled)
        return tick;
    now += r->pause;
    r->pause = r->pause * 2 < max ? r->pause * 2 : max;
    return now < tick ? now : tick;
}

/* After a sleep: refused says whether UCX refused to arm (events pending, found or not by the
 * next step). Refusals count only while they come in a row: one that UCX grants ends the pausing
 * (around its keepalive rounds UCX refuses twice or so, and the loop then paused 1 ms at a time
 * until the next work came: ~930 wake-ups in every other idle second). A real sleep ends in a
 * burst of events, likely: spin again. */
void kvx_rest_woke(kvx_rest_t *r, bool stalled, bool refused)
{
    if (refused) {
        r->refused++;
        return;
    }
    r->refused = 0;
    if (!stalled)
        r->last_work = kvx_now_ns();
}

/*
 * Arm the worker's event fd and sleep, with the lock released, until UCX has events, fd is
 * readable, or until_ns. If UCX has events pending already (it refuses to arm), return true: at
 * once, unless stalled: then after a pause until until_ns or fd anyway. Lock held on entry and
 * on return.
 */
bool kvx_progress_sleep(kvx_engine_t *e, int fd, uint64_t now, uint64_t until_ns, bool stalled)
{
    struct pollfd fds[2] = {{.fd = fd, .events = POLLIN},
                            {.fd = kvx_ucx_event_fd(e->core->ucx), .events = POLLIN}};
    uint64_t d = until_ns > now ? until_ns - now : 0, v;
    struct timespec ts = {.tv_sec = (time_t)(d / 1000000000ull),
                          .tv_nsec = (long)(d % 1000000000ull)};
    nfds_t nfds = 2;
    bool refused = false;

    if (kvx_ucx_arm(e->core->ucx) == -EBUSY) {
        if (!stalled)
            return true;
        refused = true;
        nfds = 1;
    } else if (kvx_ucx_progress(e->core->ucx) > 0) {
        /* ucp_worker_arm arms only the interfaces in use. One whose last endpoint just went
         * (a peer removed) is re-armed by a callback that the next ucp_worker_progress runs;
         * asleep before that, a message arriving on it (a peer connecting again) would wake
         * nobody until the next tick. This progress runs it; if it found work, look again. */
        return false;
    }
    pthread_mutex_unlock(&e->core->lock);
    if (ppoll(fds, nfds, &ts, NULL) > 0 && (fds[0].revents & POLLIN) &&
        read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        kvx_warn(e->core, "progress: reading fd %d: %s", fd, strerror(errno));
    pthread_mutex_lock(&e->core->lock);
    return refused;
}

/* kvx_transport_wait's loop (lock held): progress steps, resting between them on the
 * completion fd, until peer_id (or any peer, NULL) has a completion (1), end_ns (0) or close. */
int kvx_progress_wait_cq(kvx_engine_t *e, const char *peer_id, uint64_t end)
{
    uint64_t now = kvx_now_ns(), until;
    kvx_rest_t rest;
    bool stalled;
    int rc;

    kvx_rest_init(&rest, now);
    e->waiters++;
    for (;;) {
        kvx_peer_t *p;
        unsigned n;

        if (e->core->closed) {
            rc = -ESHUTDOWN;
            break;
        }
        n = kvx_progress_step(e);
        now = kvx_now_ns();
        kvx_engine_app_polled(e);
        p = peer_id != NULL ? kvx_peer_lookup(e->core, peer_id) : NULL;
        if (peer_id != NULL ? p != NULL && !kvx_list_empty(&p->cq)
                            : !kvx_list_empty(&e->core->ready)) {
            rc = 1;
            break;
        }
        if (now >= end) {
            rc = 0;
            break;
        }
        until = kvx_progress_rest(e, &rest, n, now, &stalled);
        if (until == 0) {
            kvx_unlock(e->core);
            sched_yield();
            kvx_lock(e->core);
            continue;
        }
        e->cq_signaled = false;
        kvx_rest_woke(&rest, stalled,
                      kvx_progress_sleep(e, e->cq_fd, now, until < end ? until : end, stalled));
    }
    e->waiters--;
    if (e->core->closed)
        pthread_cond_broadcast(&e->core->cond); /* close waits for the waiters to leave */
    return rc;
}
