/*
 * The initiator's side (src/README.md): a transfer born (submit.c), cut into messages and posted
 * on its connection in priority order (post.c), the receiver's replies (reply.c), its end,
 * cancel, a failed connection's transfers and deadlines (end.c). core/kvx_core.h writes down a
 * transfer's life. It never calls the receiving side, which never calls it.
 */
#ifndef KVX_XFER_H
#define KVX_XFER_H

#include "conn/kvx_conn.h"

/* Bytes one progress step posts (or copies into or out of a mapped region) per connection
 * before other work and API calls get their turn on the lock: about 0.1 ms at memcpy speed.
 * Before this bound a step posted for as long as a shared-memory lane took messages at once,
 * and an urgent submit waited 50-60 ms for the lock behind a bulk write (kvx-bench --hol). */
#define KVX_STEP_BUDGET ((size_t)1024 * 1024)

/* ---- where a stream's bytes are ------------------------------------------------------------- */

/* The local address of the stream's byte at run i, offset off in it. */
static inline uint8_t *kvx_xfer_local(const kvx_xfer_t *x, uint32_t i, uint64_t off)
{
    return x->runs[i].local + off;
}
/* ... and its offset in the peer's region (x->rregs[x->runs[i].rreg]). */
static inline uint64_t kvx_xfer_remote(const kvx_xfer_t *x, uint32_t i, uint64_t off)
{
    return x->runs[i].remote + off;
}
/* Move a stream cursor (run, offset in it) piece bytes on; a finished run moves it to the next. */
static inline void kvx_run_step(uint32_t *run, uint64_t *off, size_t piece, uint64_t run_len)
{
    *off += piece;
    if (*off == run_len) {
        (*run)++;
        *off = 0;
    }
}

/* ---- a transfer's place in its connection's queues ------------------------------------------ */

/* Queue x on c at its level (now: the time); returns whether that level had nothing queued. A
 * HIGH one makes NORMAL transfers keep to the low window for a while (kvx_windowed, post.c). */
static inline bool kvx_xfer_enqueue(kvx_conn_t *c, kvx_xfer_t *x, uint64_t now)
{
    bool was_idle = kvx_list_empty(&c->queue[x->prio]);

    kvx_list_add_tail(&c->queue[x->prio], &x->conn_link);
    if (x->prio == KVX_PRIO_HIGH)
        c->high_ns = now;
    return was_idle;
}
/* x leaves c's queue of its level; a level left with nothing queued starts its next round from
 * nothing (kvx_xfer_pick): it saves nothing up and owes nothing. */
static inline void kvx_xfer_unqueue(kvx_conn_t *c, kvx_xfer_t *x)
{
    kvx_list_del(&x->conn_link);
    if (kvx_list_empty(&c->queue[x->prio]))
        c->credit[x->prio] = 0;
}

/* ---- born (submit.c) ------------------------------------------------------------------------ */

/* A new transfer to peer p (the API checked the arguments and found p, lock held): where a
 * transfer is born. Returns 0 with *id_p, or a negative errno with nothing changed. */
typedef struct kvx_xfer_src {
    const uint32_t *local, *remote; /* block indices (ranges NULL) */
    const kvx_range_t *ranges;      /* ... or ranges */
    size_t count;
    bool unreported; /* kvx_notice_send's: purged from birth, its end never reported */
} kvx_xfer_src_t;
int kvx_xfer_submit(kvx_core_t *core, kvx_peer_t *p, int op, const kvx_xfer_src_t *src,
                    const kvx_xfer_params_t *params, uint64_t *id_p);
/* A reconnected peer's parked transfers go to its new connection c (those beyond its region
 * fail with -EINVAL); or they all fail with err (c NULL: the peer was removed or closed). */
void kvx_xfer_unpark(kvx_peer_t *p, kvx_conn_t *c, int err);

/* ---- travels (post.c) ----------------------------------------------------------------------- */

/* Hand queued transfers' messages to UCX (or copy them, mapped), at most budget bytes. */
void kvx_xfer_post(kvx_conn_t *c, size_t budget_bytes);
/* All of a write's bytes were acknowledged, or a read's arrived: it ends, or first its notice
 * goes (KVX_XFER_NOTIFY, KVX_XFER_PARAM_NOTICE_DATA), and NOTICE_ACK ends it. */
void kvx_xfer_landed(kvx_conn_t *c, kvx_xfer_t *x);

/* ---- replies (reply.c) ---------------------------------------------------------------------- */

/* A message of the initiator's side arrived (ACK, READ_DATA, NOTICE_ACK; HELLO_ACK and FENCE go
 * to the connection). */
void kvx_xfer_on_message(kvx_conns_t *cs, const kvx_msg_t *m, const uint8_t *data, size_t data_len);
/* UCX is done with a message of transfer xfer_id on c. */
void kvx_xfer_on_sent(kvx_conn_t *c, uint64_t xfer_id);
/* A rendezvous receive of read data on c ended (status 0: its bytes are in place). */
void kvx_xfer_on_received(kvx_conn_t *c, kvx_read_rndv_t *rr, int status);

/* ---- ends (end.c) --------------------------------------------------------------------------- */

/* The transfer ends with status (core/kvx_core.h: done at once, or ENDING first). */
void kvx_xfer_end(kvx_xfer_t *x, int status);
/* Cancel at once (KVX_CANCEL_IMMEDIATE): it is never reported. */
void kvx_xfer_forget(kvx_xfer_t *x);
/* Every transfer of a failed connection ends with err. */
void kvx_xfer_fail_conn(kvx_conn_t *c, int err);
/* A peer's connection failed before its handshake: its transfers (none posted yet) wait again. */
void kvx_xfer_repark(kvx_conn_t *c, kvx_peer_t *p);
/* When x (not ENDING) fails unless it is done: its deadline, or while it waits for a
 * connection, the stall limit from its submission (0: never). */
uint64_t kvx_xfer_due(const kvx_core_t *core, const kvx_xfer_t *x);
/* Transfers past their deadline end (from the progress step, when the earliest is due). */
void kvx_xfer_check_deadlines(kvx_core_t *core, uint64_t now);

#endif /* KVX_XFER_H */
