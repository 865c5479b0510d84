/*
 * How kvx tells the threads that wait on it that something happened: the progress thread asleep
 * on its wake fd (kvx_kick), application threads in kvx_transport_wait (kvx_notify_waiters), and
 * whoever watches kvx_transport_event_fd (kvx_events_update). Every layer may call these; they
 * only write file descriptors and flags of the transport.
 */
#include "kvx_objects.h"

#include <errno.h>
#include <string.h>
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
        kvx_warn(t, "progress: waking waiters: %s", strerror(errno));
}

/* ---- the event fd (kvx_transport_event_fd) -------------------------------------------------
 * A plain eventfd holding 1 exactly while a poll has something: written when the first thing
 * arrives, read empty when the last is taken. Both happen under the lock, so the fd's state
 * follows the queues' (ev_set says which it is in). */
void kvx_events_update(kvx_transport_t *t)
{
    uint64_t v = 1;
    bool has;

    if (t->ev_fd < 0 || t->closed)
        return;
    has = !kvx_list_empty(&t->ready) || t->notice_count > 0 || t->ev_count > 0;
    if (has == t->ev_set)
        return;
    if (has ? write(t->ev_fd, &v, sizeof(v)) < 0 : read(t->ev_fd, &v, sizeof(v)) < 0) {
        if (errno != EAGAIN)
            kvx_warn(t, "event fd: %s", strerror(errno));
    }
    t->ev_set = has;
}

/* Wake the sleeping thread if it would otherwise sleep past when_ns (0: now). Lock held. */
void kvx_kick(kvx_transport_t *t, uint64_t when_ns)
{
    uint64_t one = 1;

    if (!t->thread_sleeping || when_ns >= t->thread_wake_at_ns)
        return;
    t->thread_wake_at_ns = 0; /* one kick per sleep is enough */
    if (write(t->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        kvx_warn(t, "progress: kicking thread: %s", strerror(errno));
}
