/*
 * The progress engine (progress.c, src/README.md): one step over every layer below, the progress
 * thread, and the waits of API calls that drive progress themselves. Only the API calls it.
 */
#ifndef KVX_ENGINE_H
#define KVX_ENGINE_H

#include "peer/kvx_peer.h"

/* ---- progress (progress.c) ------------------------------------------------------------------ */

unsigned kvx_progress_step(kvx_transport_t *t);
void kvx_progress_wait_event(kvx_transport_t *t, uint64_t until_ns);
/* kvx_transport_wait's loop (lock held): 1 when peer_id (NULL: any) has a completion, 0 at
 * end_ns, -ESHUTDOWN at close. */
int kvx_progress_wait_cq(kvx_transport_t *t, const char *peer_id, uint64_t end_ns);
int kvx_progress_start(kvx_transport_t *t);
void kvx_progress_stop(kvx_transport_t *t);

#endif /* KVX_ENGINE_H */
