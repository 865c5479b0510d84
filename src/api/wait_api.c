/*
 * The application's waits: kvx_transport_wait (whose loop is the engine's) and the event fds that
 * say a poll has something (kvx_transport_event_fd_ex; engine/wake.c makes them and keeps their
 * state).
 */
#include "api/transport.h"

#include <errno.h>
#include <string.h>

int kvx_transport_event_fd_ex(kvx_transport_t *t, unsigned kinds, int *fd_p)
{
    int rc = 0;

    if (t == NULL || fd_p == NULL || kinds == 0 || (kinds & ~(unsigned)KVX_EVENT_ALL) != 0)
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    if (t->engine.evfd[kinds].fd < 0) {
        rc = kvx_events_open(&t->engine, kinds);
        if (rc < 0) {
            kvx_error(&t->core, "event fd: eventfd: %s", strerror(-rc));
            goto out;
        }
        rc = 0;
    }
    *fd_p = t->engine.evfd[kinds].fd;
out:
    kvx_unlock(&t->core);
    return rc;
}

int kvx_transport_event_fd(kvx_transport_t *t, int *fd_p)
{
    return kvx_transport_event_fd_ex(t, KVX_EVENT_ALL, fd_p);
}

int kvx_transport_wait(kvx_transport_t *t, const char *peer_id, int timeout_ms)
{
    uint64_t now = kvx_now_ns();
    uint64_t end = timeout_ms < 0 ? UINT64_MAX : now + (uint64_t)timeout_ms * 1000000ull;
    int rc;

    if (t == NULL)
        return -EINVAL;
    kvx_lock(&t->core);
    rc = kvx_progress_wait_cq(&t->engine, peer_id, end);
    kvx_unlock(&t->core);
    return rc;
}
