/*
 * How kvx tells the threads that wait on it that something happened: the progress thread asleep
 * on its wake fd (kvx_kick), application threads in kvx_transport_wait (kvx_notify_waiters), and
 * whoever watches an event fd (kvx_events_update). The layers below reach them through the
 * core's hooks (kvx_engine_hooks); they only write file descriptors and flags of the engine.
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
void kvx_notify_waiters(kvx_transport_t *t)
{
    uint64_t n = t->waiters;

    if (t->cq_signaled || n == 0)
        return;
    t->cq_signaled = true;
    if (write(t->cq_fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
        kvx_warn(&t->core, "progress: waking waiters: %s", strerror(errno));
}

/* ---- the event fds (kvx_transport_event_fd_ex) ---------------------------------------------
 * One plain eventfd per mask of kinds, holding 1 exactly while a poll of one of its kinds has
 * something: written when the first thing of its kinds arrives, read empty when the last is
 * taken. Both happen under the lock, so each fd's state follows the queues' (its set says which
 * it is in; the fds of a change are set one after the other, all before the lock is released).
 * A fd of its own per mask, rather than one for all: a loop that drains only completions would
 * spin on a fd kept readable by a notice nobody takes. */

static void kvx_events_set(kvx_transport_t *t, unsigned m, bool set)
{
    uint64_t v = 1;

    if (set ? write(t->evfd[m].fd, &v, sizeof(v)) < 0 : read(t->evfd[m].fd, &v, sizeof(v)) < 0) {
        if (errno != EAGAIN)
            kvx_warn(&t->core, "event fd: %s", strerror(errno));
    }
    t->evfd[m].set = set;
}

void kvx_events_update(kvx_transport_t *t)
{
    unsigned has;

    if (!t->ev_used || t->core.closed)
        return;
    has = (kvx_list_empty(&t->core.ready) ? 0 : KVX_EVENT_COMPLETIONS) |
          (kvx_notices_pending(&t->recv) > 0 ? KVX_EVENT_NOTICES : 0) |
          (kvx_peer_events_pending(&t->peers) > 0 ? KVX_EVENT_PEER_EVENTS : 0);
    if (has == t->ev_kinds)
        return;
    t->ev_kinds = has;
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++) {
        bool want = (has & m) != 0;
        if (t->evfd[m].fd >= 0 && t->evfd[m].set != want)
            kvx_events_set(t, m, want);
    }
}

int kvx_events_open(kvx_transport_t *t, unsigned kinds)
{
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);

    if (fd < 0)
        return -errno;
    t->evfd[kinds].fd = fd;
    t->evfd[kinds].set = false;
    t->ev_used = true;
    t->ev_kinds = UINT_MAX; /* no state of the polls: the update looks at every fd */
    kvx_events_update(t);
    return fd;
}

void kvx_events_closed(kvx_transport_t *t)
{
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++)
        if (t->evfd[m].fd >= 0 && !t->evfd[m].set)
            kvx_events_set(t, m, true);
}

void kvx_events_free(kvx_transport_t *t)
{
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++) {
        if (t->evfd[m].fd >= 0)
            close(t->evfd[m].fd);
        t->evfd[m].fd = -1;
    }
}

/* Wake the sleeping thread if it would otherwise sleep past when_ns (0: now). Lock held. */
void kvx_kick(kvx_transport_t *t, uint64_t when_ns)
{
    uint64_t one = 1;

    if (!t->thread_sleeping || when_ns >= t->thread_wake_at_ns)
        return;
    t->thread_wake_at_ns = 0; /* one kick per sleep is enough */
    if (write(t->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        kvx_warn(&t->core, "progress: kicking thread: %s", strerror(errno));
}

/* ---- the core's hooks ----------------------------------------------------------------------- */

static void kvx_hook_kick(void *arg, uint64_t when_ns) { kvx_kick(arg, when_ns); }
static void kvx_hook_arrived(void *arg) { kvx_notify_waiters(arg); }
static void kvx_hook_polls_changed(void *arg) { kvx_events_update(arg); }

void kvx_engine_hooks(kvx_transport_t *t)
{
    t->core.hooks = (kvx_core_hooks_t){.arg = t,
                                       .kick = kvx_hook_kick,
                                       .arrived = kvx_hook_arrived,
                                       .polls_changed = kvx_hook_polls_changed};
}
