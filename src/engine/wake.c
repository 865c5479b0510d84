/*
 * How kvx tells the threads that wait on it that something happened: the progress thread asleep
 * on its wake fd (kvx_kick), application threads in kvx_transport_wait (kvx_notify_waiters), and
 * whoever watches an event fd (kvx_events_update). The layers below reach them through the core's
 * hooks (engine.c); they only write file descriptors and flags of the engine.
 */
#include "engine/kvx_engine.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* A completion was queued while application threads sleep in kvx_transport_wait. cq_fd is a
 * semaphore eventfd: each waiter's wake-up consumes one count, so that one waiter waking first
 * cannot swallow the others' (a plain eventfd, drained by the first reader, lost them). */
void kvx_notify_waiters(kvx_engine_t *e)
{
    uint64_t n = e->waiters;

    if (e->cq_signaled || n == 0)
        return;
    e->cq_signaled = true;
    if (write(e->cq_fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
        kvx_warn(e->core, "progress: waking waiters: %s", strerror(errno));
}

/* ---- the event fds (kvx_transport_event_fd_ex) ---------------------------------------------
 * One plain eventfd per mask of kinds, holding 1 exactly while a poll of one of its kinds has
 * something: written when the first thing of its kinds arrives, read empty when the last is
 * taken. Both happen under the lock, so each fd's state follows the queues' (its set says which
 * it is in; the fds of a change are set one after the other, all before the lock is released).
 * A fd of its own per mask, rather than one for all: a loop that drains only completions would
 * spin on a fd kept readable by a notice nobody takes. */

static void kvx_events_set(kvx_engine_t *e, unsigned m, bool set)
{
    uint64_t v = 1;

    if (set ? write(e->evfd[m].fd, &v, sizeof(v)) < 0 : read(e->evfd[m].fd, &v, sizeof(v)) < 0) {
        if (errno != EAGAIN)
            kvx_warn(e->core, "event fd: %s", strerror(errno));
    }
    e->evfd[m].set = set;
}

void kvx_events_update(kvx_engine_t *e)
{
    unsigned has;

    if (!e->ev_used || e->core->closed)
        return;
    has = (kvx_list_empty(&e->core->ready) ? 0 : KVX_EVENT_COMPLETIONS) |
          (kvx_notices_pending(e->recv) > 0 ? KVX_EVENT_NOTICES : 0) |
          (kvx_peer_events_pending(e->peers) > 0 ? KVX_EVENT_PEER_EVENTS : 0);
    if (has == e->ev_kinds)
        return;
    e->ev_kinds = has;
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++) {
        bool want = (has & m) != 0;
        if (e->evfd[m].fd >= 0 && e->evfd[m].set != want)
            kvx_events_set(e, m, want);
    }
}

int kvx_events_open(kvx_engine_t *e, unsigned kinds)
{
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

    if (fd < 0)
        return -errno;
    e->evfd[kinds].fd = fd;
    e->evfd[kinds].set = false;
    e->ev_used = true;
    e->ev_kinds = UINT_MAX; /* no state of the polls: the update looks at every fd */
    kvx_events_update(e);
    return fd;
}

void kvx_events_closed(kvx_engine_t *e)
{
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++)
        if (e->evfd[m].fd >= 0 && !e->evfd[m].set)
            kvx_events_set(e, m, true);
}

/* Wake the sleeping thread if it would otherwise sleep past when_ns (0: now). Lock held. */
void kvx_kick(kvx_engine_t *e, uint64_t when_ns)
{
    uint64_t one = 1;

    if (!e->thread_sleeping || when_ns >= e->thread_wake_at_ns)
        return;
    e->thread_wake_at_ns = 0; /* one kick per sleep is enough */
    if (write(e->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        kvx_warn(e->core, "progress: kicking thread: %s", strerror(errno));
}
