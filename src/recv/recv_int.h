/*
 * What the receiving side's handshake (hello.c), fences (fence.c) and notices (notice.c) give the
 * files of the receiving side above them (fence.c, notice.c, recv.c), and no other file needs.
 */
#ifndef KVX_RECV_INT_H
#define KVX_RECV_INT_H

#include "recv/kvx_recv.h"

/* A HELLO that arrived, kept for kvx_recv_hellos (after UCX progress). */
typedef struct kvx_hello {
    kvx_list_t link;
    bool retired;          /* it presents a retired capability: it is refused */
    kvx_came_on_t came_on; /* the endpoint it came on (kvx_ucx_came_on) */
    char name[KVX_NAME_MAX + 1];
    size_t len;
    uint8_t buf[];
} kvx_hello_t;

/* ---- hello.c: the handshake ----------------------------------------------------------------- */

/* A HELLO arrived (inside UCX progress): checked, and kept for kvx_recv_hellos. */
void kvx_recv_hello_in(kvx_recv_t *r, const kvx_msg_t *m, const void *hdr, size_t hdr_len);
/* Make the connections of the HELLOs that arrived (force: none is held back by the rates).
 * Returns the HELLOs done with. */
unsigned kvx_recv_hellos(kvx_recv_t *r, bool force);
void kvx_recv_proof(kvx_recv_t *r, const kvx_msg_t *m); /* a PROOF arrived */

/* ---- fence.c: the writers' fences ----------------------------------------------------------- */

/* Did a fence after the writer's epoch e cover tag? */
bool kvx_writer_fenced(const kvx_writer_t *w, uint64_t e, uint64_t tag);
/* Refuse a read request (its transfer and stream offset) with err: a READ_DATA that fails the
 * reader's transfer (fence.c). */
void kvx_recv_refuse(kvx_rconn_t *rc, uint64_t xfer_id, uint64_t stream_off, int err);

/* ---- notice.c: the notices ------------------------------------------------------------------ */

/* A NOTICE arrived (with data_len bytes of payload, checked by the decoder): queued, or refused
 * (fenced, over the queue's bounds), and answered. */
void kvx_recv_notice(kvx_recv_t *r, const kvx_msg_t *m, const uint8_t *data, size_t data_len);
/* The notices' ring and every payload in it go (kvx_recv_fini). */
void kvx_notices_free(kvx_recv_t *r);

#endif
