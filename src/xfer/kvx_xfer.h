/*
 * The initiator's side (xfer.c, src/README.md): a transfer born (kvx_xfer_submit), cut into
 * messages and posted on its connection, the receiver's replies, deadlines. It never calls the
 * receiving side, which never calls it.
 */
#ifndef KVX_XFER_H
#define KVX_XFER_H

#include "conn/kvx_conn.h"

/* ---- transfers (xfer.c) --------------------------------------------------------------------- */

/* Bytes one progress step posts (or copies into or out of a mapped region) per connection
 * before other work and API calls get their turn on the lock: about 0.1 ms at memcpy speed.
 * Before this bound a step posted for as long as a shared-memory lane took messages at once,
 * and an urgent submit waited 50-60 ms for the lock behind a bulk write (kvx-bench --hol). */
#define KVX_STEP_BUDGET ((size_t)1024 * 1024)

int kvx_xfer_submit(kvx_core_t *core, kvx_peer_t *p, int op, const uint32_t *local,
                    const uint32_t *remote, size_t count, const kvx_xfer_params_t *params,
                    uint64_t *id_p);
void kvx_xfer_post(kvx_conn_t *c, size_t budget_bytes);
void kvx_xfer_forget(kvx_xfer_t *x);
void kvx_xfer_fail_conn(kvx_conn_t *c, int err);
/* A reconnected peer's parked transfers go to its new connection c (those beyond its region
 * fail with -EINVAL); or they all fail with err (c NULL: the peer was removed or closed). */
void kvx_xfer_unpark(kvx_peer_t *p, kvx_conn_t *c, int err);
/* A peer's connection failed before its handshake: its transfers (none posted yet) wait again. */
void kvx_xfer_repark(kvx_conn_t *c, kvx_peer_t *p);
void kvx_xfer_check_deadlines(kvx_core_t *core, uint64_t now);
/* Finish a transfer, or end it while UCX still holds its messages or receives into its blocks
 * (x->sending: reported once they are done). The first status wins. */
void kvx_xfer_end(kvx_xfer_t *x, int status);
/* All of a write's bytes were acknowledged: done, or first the receiver's notice. */
void kvx_xfer_write_landed(kvx_conn_t *c, kvx_xfer_t *x);
/* The local address of the stream's byte at run i, offset off in it. */
uint8_t *kvx_xfer_local(const kvx_core_t *core, const kvx_xfer_t *x, uint32_t i, uint64_t off);
/* Move a stream cursor (run, offset in it) piece bytes on; a finished run moves it to the next. */
void kvx_run_step(uint32_t *run, uint64_t *off, size_t piece, uint64_t run_len);

/* ---- replies (xfer_reply.c) ----------------------------------------------------------------- */

/* A message of the initiator's side arrived (ACK, READ_DATA, HELLO_ACK, FENCE, NOTICE_ACK). */
void kvx_xfer_on_message(kvx_conns_t *cs, const kvx_msg_t *m, const uint8_t *data, size_t data_len);
/* UCX is done with a message of transfer xfer_id on c. */
void kvx_xfer_on_sent(kvx_conn_t *c, uint64_t xfer_id);
/* A rendezvous receive of read data on c ended (status 0: its bytes are in place). */
void kvx_xfer_on_received(kvx_conn_t *c, kvx_read_rndv_t *rr, int status);

#endif /* KVX_XFER_H */
