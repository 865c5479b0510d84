/*
 * The receiving side, as the layers above see it (src/README.md): the handshakes (hello.c), the
 * writers' fences (fence.c), the messages that land (recv.c: writes applied, reads served,
 * arrival notices); its state, kvx_recv_t, holds its connections (conn/kvx_rconn.h) and what
 * only it keeps. What only its files share is recv/recv_int.h. It never calls the initiator's
 * side, which never calls it.
 */
#ifndef KVX_RECV_H
#define KVX_RECV_H

#include "conn/kvx_rconn.h"

/* Retired capabilities remembered (older ones are dropped like any unknown one). */
#define KVX_RETIRED_MAX 8

typedef struct kvx_recv {
    kvx_core_t *core;
    kvx_rconns_t conns; /* its connections, and their writers */
    kvx_list_t hellos;  /* HELLOs with a valid capability, handled after UCX progress */
    unsigned nhellos;
    /* capabilities kvx_fence_ex retired, newest first: a HELLO with one is refused, answered */
    uint8_t retired[KVX_RETIRED_MAX][16];
    unsigned nretired;
    struct kvx_seen_proof *seen;     /* with a secret: HELLO proofs of the last seconds (hello.c) */
    kvx_list_t refusing;             /* connections made only to answer such a HELLO (at most 16) */
    struct kvx_notice_slot *notices; /* notices for kvx_notice_poll(_data): a ring of notice_cap */
    size_t notice_cap, notice_head, notice_count;
    size_t notice_bytes; /* their payloads' bytes (at most KVX_NOTICE_QUEUE_BYTES) */
} kvx_recv_t;

/* A notice waiting, with its payload (its own copy; NULL when empty or none). */
typedef struct kvx_notice_slot {
    kvx_notice_t n;
    uint64_t xfer_id;
    void *data;
    uint32_t len;
    bool has_data;
} kvx_notice_slot_t;

/* The receiving side of a transport with room for notice_cap notices: 0 or -ENOMEM. */
int kvx_recv_init(kvx_recv_t *r, kvx_core_t *core, size_t notice_cap);
/* At close: what it holds goes (the worker is gone: no callback will come); the notices' ring
 * goes with kvx_recv_fini (kvx_transport_destroy). */
void kvx_recv_free_all(kvx_recv_t *r);
void kvx_recv_fini(kvx_recv_t *r);

/* A message for the receiving side arrived (HELLO, WRITE, READ_REQ, NOTICE, BYE, PROOF). Runs
 * inside UCX progress: it applies writes at once, and defers what needs to send to
 * kvx_recv_work. */
void kvx_recv_on_message(kvx_recv_t *r, const kvx_msg_t *m, const void *hdr, size_t hdr_len,
                         const uint8_t *data, size_t data_len);
/* After UCX progress: handshakes, acknowledgements, read data, control. Returns work done. */
unsigned kvx_recv_work(kvx_recv_t *r);
/* Whether kvx_recv_work has something to do. */
bool kvx_recv_has_work(const kvx_recv_t *r);
/* Work only polling advances: handshakes to answer, replies to send, messages UCX holds. */
bool kvx_recv_needs_polling(const kvx_recv_t *r);
/* Periodic (the progress step's housekeeping): stalled receives and unproven connections close. */
void kvx_recv_housekeeping(kvx_recv_t *r, uint64_t now);

/* A fence (kvx_fence_ex) in two halves: what can fail (0, -ENOSPC, -ENOMEM: nothing fenced),
 * then the fence itself (the connections fenced). tags sorted and distinct. */
int kvx_recv_fence_prepare(kvx_recv_t *r, const char *writer, const uint64_t *tags, size_t ntags);
int kvx_recv_fence(kvx_recv_t *r, const char *writer, const uint64_t *tags, size_t ntags);
/* The rendezvous receives of write data in flight that a fence just made covers: how many; with
 * abort, their connections close, which ends them. */
unsigned kvx_recv_fence_rndvs(kvx_recv_t *r, const char *writer, bool abort);
/* The capability cap was retired (kvx_fence_ex): a HELLO that presents it is refused. */
void kvx_recv_retire(kvx_recv_t *r, const uint8_t cap[16]);
/* A region deregistered (dead already): the read requests queued from it are refused (-ENOENT)
 * and let go of it (fence.c). */
void kvx_recv_region_dead(kvx_recv_t *r, kvx_region_t *g);
/* The connections still holding g (rendezvous receives into it, READ_DATA sends reading it)
 * close, which makes UCX let go: how many. */
unsigned kvx_recv_region_close(kvx_recv_t *r, kvx_region_t *g);

/* Take up to max notices into out, oldest first (kvx_notice_poll; payloads dropped): how many.
 * (notice.c) */
size_t kvx_notice_take(kvx_recv_t *r, kvx_notice_t *out, size_t max);
/* kvx_notice_poll_data: up to max notices, payloads copied into buf (cap bytes): how many, or
 * -ENOSPC when the oldest one's payload alone is over cap (out[0] tells it; nothing taken). */
int kvx_notice_take_data(kvx_recv_t *r, kvx_notice_data_t *out, size_t max, void *buf, size_t cap);
/* Notices waiting for kvx_notice_poll. */
static inline size_t kvx_notices_pending(const kvx_recv_t *r) { return r->notice_count; }

#endif /* KVX_RECV_H */
