/*
 * The progress engine (progress.c, src/README.md): one step over every layer below, the progress
 * thread, and the waits of API calls that drive progress themselves. Only the API calls it.
 */
#ifndef KVX_ENGINE_H
#define KVX_ENGINE_H

#include "api/transport.h"

/* ---- wake-ups (wake.c) ---------------------------------------------------------------------- */

/* Make each event fd readable or not, as the polls of its kinds have something or not (after
 * anything that may change that: a step, a completion, a drain). Cheap when nothing changed. */
void kvx_events_update(kvx_transport_t *t);
/* Make a new event fd for kinds and bring it to the polls' state (lock held): its fd, or the
 * negative errno of eventfd(2). */
int kvx_events_open(kvx_transport_t *t, unsigned kinds);
/* The transport closed: every event fd readable for good, so that a loop asleep on one wakes. */
void kvx_events_closed(kvx_transport_t *t);
/* Close every event fd (kvx_transport_destroy). */
void kvx_events_free(kvx_transport_t *t);
void kvx_notify_waiters(kvx_transport_t *t);
/* Wake the progress thread if it would otherwise sleep past when_ns (0: now). */
void kvx_kick(kvx_transport_t *t, uint64_t when_ns);
/* Install the core's hooks: the layers below wake what waits through them. */
void kvx_engine_hooks(kvx_transport_t *t);

/* ---- progress (progress.c) ------------------------------------------------------------------ */

unsigned kvx_progress_step(kvx_transport_t *t);
void kvx_progress_wait_event(kvx_transport_t *t, uint64_t until_ns);
/* kvx_transport_wait's loop (lock held): 1 when peer_id (NULL: any) has a completion, 0 at
 * end_ns, -ESHUTDOWN at close. */
int kvx_progress_wait_cq(kvx_transport_t *t, const char *peer_id, uint64_t end_ns);
int kvx_progress_start(kvx_transport_t *t);
void kvx_progress_stop(kvx_transport_t *t);

#endif /* KVX_ENGINE_H */
