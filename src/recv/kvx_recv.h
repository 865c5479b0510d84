/*
 * The receiving side, as the layers above see it (hello.c, fence.c, recv.c, src/README.md;
 * what only its files share is recv/recv_int.h): messages in, its work after UCX progress, fences,
 * arrival notices, the writers' counters.
 */
#ifndef KVX_RECV_H
#define KVX_RECV_H

#include "api/transport.h"

/* ---- the receiving side (hello.c, fence.c, recv.c) ------------------------------------------ */

/* A message for the receiving side arrived (HELLO, WRITE, READ_REQ, NOTICE, BYE). Runs inside
 * UCX progress: it applies writes at once, and defers what needs to send to kvx_recv_work. */
void kvx_recv_on_message(kvx_transport_t *t, const kvx_msg_t *m, const void *hdr, size_t hdr_len,
                         const uint8_t *data, size_t data_len);
/* After UCX progress: handshakes, acknowledgements, read data, control. Returns work done. */
unsigned kvx_recv_work(kvx_transport_t *t);
/* Whether kvx_recv_work has something to do. */
bool kvx_recv_has_work(const kvx_transport_t *t);
/* Work only polling advances: handshakes to answer, replies to send, messages UCX holds. */
bool kvx_recv_needs_polling(const kvx_transport_t *t);
/* Periodic (kvx_progress_step's housekeeping): unproven connections past their time close. */
void kvx_recv_housekeeping(kvx_transport_t *t, uint64_t now);
void kvx_recv_free_all(kvx_transport_t *t);
/* A fence (kvx_fence_ex) in two halves: what can fail (0, -ENOSPC, -ENOMEM: nothing fenced),
 * then the fence itself (the connections fenced). tags sorted and distinct. */
int kvx_recv_fence_prepare(kvx_transport_t *t, const char *writer, const uint64_t *tags,
                           size_t ntags);
int kvx_recv_fence(kvx_transport_t *t, const char *writer, const uint64_t *tags, size_t ntags);
/* The rendezvous receives in flight that a fence just made covers (fence.c): how many; with
 * abort, their connections close, which ends them. */
unsigned kvx_recv_fence_rxs(kvx_transport_t *t, const char *writer, bool abort);
/* Take up to max arrival notices into out, oldest first (kvx_notice_poll): how many. */
size_t kvx_notice_take(kvx_transport_t *t, kvx_notice_t *out, size_t max);

#endif /* KVX_RECV_H */
