/*
 * The one way an API call goes without the lock for a while, waiting or working (kvx_core_wait,
 * kvx_core.h): the calls that wait for a handshake, a connection's close, their turn among the
 * adds and removes of an id, a pairing's answer or a fence's receives, and the prefault of a
 * mapped region. Close waits for each to come back (core->unlocked_calls).
 */
#include "core/kvx_core.h"

#include <errno.h>

int kvx_core_wait(kvx_core_t *c, const kvx_wait_t *w)
{
    int rc;

    c->unlocked_calls++;
    for (;;) {
        uint64_t now, until;

        if (c->closed) {
            rc = -ESHUTDOWN;
            break;
        }
        if (w->done(w->arg)) {
            rc = 0;
            break;
        }
        now = kvx_now_ns();
        if (now >= w->until_ns) {
            rc = -ETIMEDOUT;
            break;
        }
        if (w->work != NULL) {
            kvx_unlock(c);
            w->work(w->arg);
            kvx_lock(c);
            continue;
        }
        until =
            w->slice_ns != 0 && w->slice_ns < w->until_ns - now ? now + w->slice_ns : w->until_ns;
        c->hooks.sleep(c->hooks.arg, until, w->step);
    }
    c->unlocked_calls--;
    if (c->closed)
        pthread_cond_broadcast(&c->cond); /* close waits for calls away from the lock */
    return rc;
}
