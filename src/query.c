/*
 * The application's queries: calls that take what the transport gathered for it (the arrival
 * notices of recv.c). A query runs one progress step first, so that a caller that only polls
 * still advances.
 */
#include "kvx_engine.h"

#include <errno.h>

int kvx_notice_poll(kvx_transport_t *t, kvx_notice_t *out, size_t max)
{
    size_t n;

    if (t == NULL || (out == NULL && max != 0))
        return -EINVAL;
    if (max > INT32_MAX)
        max = INT32_MAX;
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return -ESHUTDOWN;
    }
    kvx_progress_step(t);
    n = kvx_notice_take(t, out, max);
    kvx_events_update(t);
    kvx_unlock(t);
    return (int)n;
}
