/*
 * The application's queries and waits: the arrival notices of recv.c (a query runs one progress
 * step first, so that a caller that only polls still advances), waiting for completions
 * (kvx_transport_wait, whose loop is the engine's), and the event fd that says a poll has
 * something (kvx_transport_event_fd; notify.c keeps its state).
 */
#include "kvx_engine.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>

int kvx_notice_poll(kvx_transport_t *t, kvx_notice_t *out, size_t max)
{
    size_t n;

    if (t == NULL || (out == NULL && max != 0))
        return -EINVAL;
    if (max > INT32_MAX)
        max = INT32_MAX;
    if (kvx_enter(t) < 0)
        return -ESHUTDOWN;
    kvx_progress_step(t);
    n = kvx_notice_take(t, out, max);
    kvx_events_update(t);
    kvx_unlock(t);
    return (int)n;
}

int kvx_transport_event_fd(kvx_transport_t *t, int *fd_p)
{
    int rc = 0;

    if (t == NULL || fd_p == NULL)
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    if (t->ev_fd < 0) {
        t->ev_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (t->ev_fd < 0) {
            rc = -errno;
            kvx_error(t, "event fd: eventfd: %s", strerror(errno));
            goto out;
        }
        t->ev_set = false;
        kvx_events_update(t);
    }
    *fd_p = t->ev_fd;
out:
    kvx_unlock(t);
    return rc;
}

int kvx_transport_wait(kvx_transport_t *t, const char *peer_id, int timeout_ms)
{
    uint64_t now = kvx_now_ns();
    uint64_t end = timeout_ms < 0 ? UINT64_MAX : now + (uint64_t)timeout_ms * 1000000ull;
    int rc;

    if (t == NULL)
        return -EINVAL;
    kvx_lock(t);
    rc = kvx_progress_wait_cq(t, peer_id, end);
    kvx_unlock(t);
    return rc;
}
