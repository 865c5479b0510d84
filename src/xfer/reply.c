/*
 * What the receiver answers the initiator's side: ACKs of writes,
 * READ_DATA of reads (eager, copied in here; or by rendezvous, checked against the read's
 * request, then received by UCX straight into its local blocks), NOTICE_ACK; HELLO_ACK and FENCE
 * go to the connection (conn/conn.c). And UCX letting go of a transfer's message.
 */
#include "xfer/kvx_xfer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void kvx_xfer_on_ack(kvx_conn_t *c, const kvx_msg_t *m)
{
    kvx_core_t *core = c->core;

    for (uint32_t i = 0; i < m->u.ack.n; i++) {
        uint64_t id;
        uint32_t bytes;
        int32_t status;
        kvx_xfer_t *x;

        kvx_wire_ack_get(m->u.ack.entries, i, &id, &bytes, &status);
        x = kvx_xfer_lookup(core, id);
        /* a reply for a transfer that is gone (failed, canceled) or not this connection's */
        if (x == NULL || x->conn != c || x->op != KVX_OP_WRITE || x->state == KVX_XS_DONE ||
            x->state == KVX_XS_ENDING || bytes > x->posted - x->done || status > 0)
            continue;
        if (status < 0) {
            status = kvx_remote_status(status);
            kvx_debug(core, "transfer %llu: refused by %s: %s", (unsigned long long)id,
                      c->agent_name, kvx_strerror(status));
            kvx_xfer_end(x, status);
            continue;
        }
        x->done += bytes;
        kvx_conn_unacked_sub(c, x, bytes);
        if (x->done == x->bytes && !x->noticed)
            kvx_xfer_landed(c, x);
    }
    /* writes of a windowed level wait for room in their window (kvx_xfer_pick) */
    if (c->state == KVX_CONN_OPEN && kvx_conn_queued(c))
        kvx_conn_want_work(c);
}

/* The slot of a read request all of whose bytes arrived or are being received is free: more
 * can be asked. */
static void kvx_read_req_check_done(kvx_conn_t *c, kvx_read_req_t *q)
{
    if (q->got != q->len)
        return;
    q->xfer_id = 0;
    if (kvx_conn_queued(c))
        kvx_conn_want_work(c);
}

/* A rendezvous receive of read data ended (or landed at once): its bytes count as arrived, once
 * their checksum (when the read asked for checksums) matched; a receive that failed fails its
 * read and its connection (the target vanished or stopped, or the connection closed). A read
 * that ended meanwhile (ENDING) is reported once its last receive is done. */
static void kvx_xfer_read_rndv_end(kvx_conn_t *c, kvx_read_rndv_t *rr, int status)
{
    kvx_core_t *core = c->core;
    kvx_xfer_t *x = kvx_xfer_lookup(core, rr->xfer_id);
    uint32_t len = rr->len;

    if (status == 0 && rr->check_crc && kvx_crc32c(rr->dest, len) != rr->crc) {
        core->rcounters.drop_crc++;
        status = -EBADMSG;
    }
    free(rr);
    if (status == 0)
        c->last_progress_ns = kvx_now_ns();
    else if (status != -EBADMSG)
        kvx_info(core, "connection to %s: a rendezvous receive of read data ended: %s",
                 c->agent_name, kvx_strerror(status));
    if (status < 0 && status != -EBADMSG && c->state == KVX_CONN_OPEN)
        kvx_conn_error(c, status);
    /* forgotten (canceled at once) or reported already: nothing to count */
    if (x == NULL || x->conn != c || x->op != KVX_OP_READ || x->state == KVX_XS_DONE ||
        x->sending == 0)
        return;
    x->sending--;
    if (x->state == KVX_XS_ENDING) {
        if (x->sending == 0)
            kvx_xfer_done(x, x->end_status);
        return;
    }
    if (status < 0) {
        kvx_xfer_end(x, status);
        return;
    }
    if (x->canceled) {
        if (x->sending == 0)
            kvx_xfer_end(x, -ECANCELED);
        return;
    }
    x->done += len;
    kvx_conn_unacked_sub(c, x, len);
    /* a read of a windowed level may wait for these bytes (kvx_xfer_pick) */
    if (c->state == KVX_CONN_OPEN && kvx_conn_queued(c))
        kvx_conn_want_work(c);
    if (x->done == x->bytes && x->posted == x->bytes)
        kvx_xfer_landed(c, x);
}

void kvx_xfer_on_received(kvx_conn_t *c, kvx_read_rndv_t *rr, int status)
{
    kvx_xfer_read_rndv_end(c, rr, status);
}

/*
 * A READ_DATA whose payload comes by rendezvous, checked against its request as an eager one is:
 * it is received straight into the local blocks its stream offset maps to, which must be one
 * contiguous range inside one local run (a kvx target sends one piece of one run per message,
 * and runs are consecutive on both sides). A piece that would cross its local run's end is
 * refused, not received, and fails the read as a malformed reply does. Its bytes are claimed at
 * once (the next piece must follow them) and count as arrived when the receive has ended.
 */
static void kvx_xfer_read_rndv(kvx_conn_t *c, kvx_xfer_t *x, kvx_read_req_t *q, const kvx_msg_t *m,
                               void *desc, size_t len)
{
    kvx_core_t *core = c->core;
    uint64_t run_len = x->runs[q->run].len;
    kvx_read_rndv_t *rr;
    int r;

    if (!kvx_core_takes_rndv(core)) {
        /* this transport chose KVX_RNDV_EAGER and said so in its HELLO: no payload moves that
         * way into its blocks (on an RDMA lane UCX might hand the target a remote key for them) */
        kvx_debug(core, "transfer %llu: a rendezvous reply refused (this transport is eager)",
                  (unsigned long long)x->id);
        core->rcounters.drop_other++;
        kvx_xfer_end(x, -EPROTO);
        return;
    }
    if (len > run_len - q->run_off) {
        kvx_debug(core, "transfer %llu: a rendezvous reply of %zu bytes crosses a local run's end",
                  (unsigned long long)x->id, len);
        kvx_xfer_end(x, -EPROTO);
        return;
    }
    rr = malloc(sizeof(*rr));
    if (rr == NULL) {
        kvx_xfer_end(x, -ENOMEM);
        return;
    }
    rr->xfer_id = x->id;
    rr->dest = kvx_xfer_local(x, q->run, q->run_off);
    rr->len = (uint32_t)len;
    rr->crc = m->u.read_data.crc;
    rr->check_crc = c->crc;
    kvx_run_step(&q->run, &q->run_off, len, run_len);
    q->got += len;
    x->sending++; /* first: the receive's end may come before kvx_conn_recv returns */
    r = kvx_conn_recv(c, rr, desc);
    if (r == 1) {
        kvx_read_req_check_done(c, q);
        return;
    }
    if (r == 0) { /* in place already */
        kvx_read_req_check_done(c, q);
        kvx_xfer_read_rndv_end(c, rr, 0);
        return;
    }
    x->sending--;
    free(rr);
    kvx_info(core, "connection to %s: a rendezvous reply of transfer %llu cannot be received: %s",
             c->agent_name, (unsigned long long)x->id, kvx_strerror(r));
    if (r == -EBUSY) /* more receives at once than a kvx target causes */
        kvx_conn_error(c, -EPROTO);
    kvx_xfer_end(x, r == -EBUSY || r == -EPERM ? -EPROTO : r);
}

static void kvx_xfer_on_read_data(kvx_conn_t *c, const kvx_msg_t *m, const uint8_t *data,
                                  size_t len)
{
    kvx_core_t *core = c->core;
    kvx_read_req_t *q = NULL;
    kvx_xfer_t *x;

    for (unsigned i = 0; i < KVX_MAX_REQS && q == NULL; i++)
        if (c->read_reqs[i].xfer_id == m->u.read_data.xfer_id &&
            c->read_reqs[i].stream_off <= m->u.read_data.stream_off &&
            m->u.read_data.stream_off < c->read_reqs[i].stream_off + c->read_reqs[i].len)
            q = &c->read_reqs[i];
    x = q != NULL ? kvx_xfer_lookup(core, q->xfer_id) : NULL;
    /* a reply for a read that failed or was canceled: dropped, so that a read reported failed
     * never has a byte land in its local blocks afterwards (a rendezvous one is not received) */
    if (x == NULL || x->conn != c || x->state == KVX_XS_DONE || x->canceled)
        return;
    if (q->stream_off + q->got != m->u.read_data.stream_off) {
        kvx_xfer_end(x, -EPROTO); /* out of order: the read cannot be put together */
        return;
    }
    if (m->u.read_data.status < 0) {
        kvx_xfer_end(x, kvx_remote_status(m->u.read_data.status));
        return;
    }
    if (len > q->len - q->got) {
        kvx_xfer_end(x, -EPROTO);
        return;
    }
    if ((m->flags & KVX_MSGF_CRC) != c->crc * KVX_MSGF_CRC ||
        (c->crc && !m->rndv && kvx_crc32c(data, len) != m->u.read_data.crc)) {
        core->rcounters.drop_crc++;
        kvx_xfer_end(x, -EBADMSG);
        return;
    }
    if (m->rndv) { /* checked as an eager one: now received, its checksum checked once landed */
        kvx_xfer_read_rndv(c, x, q, m, (void *)data, len);
        return;
    }
    for (size_t off = 0; off < len;) {
        uint64_t run_len = x->runs[q->run].len;
        size_t piece =
            run_len - q->run_off < len - off ? (size_t)(run_len - q->run_off) : len - off;
        memcpy(kvx_xfer_local(x, q->run, q->run_off), data + off, piece);
        off += piece;
        kvx_run_step(&q->run, &q->run_off, piece, run_len);
    }
    q->got += len;
    x->done += len;
    kvx_conn_unacked_sub(c, x, len);
    kvx_read_req_check_done(c, q);
    if (x->done == x->bytes && x->posted == x->bytes)
        kvx_xfer_landed(c, x);
}

void kvx_xfer_on_message(kvx_conns_t *cs, const kvx_msg_t *m, const uint8_t *data, size_t data_len)
{
    kvx_conn_t *c = kvx_conn_of(cs, m);
    kvx_xfer_t *x;

    if (c == NULL)
        return;
    switch (m->type) {
    case KVX_MSG_HELLO_ACK: /* the connection's: its handshake answered */
        kvx_conn_hello_ack(c, m);
        break;
    case KVX_MSG_FENCE:
        kvx_conn_fence(c, m);
        break;
    case KVX_MSG_ACK:
        kvx_xfer_on_ack(c, m);
        break;
    case KVX_MSG_READ_DATA:
        kvx_xfer_on_read_data(c, m, data, data_len);
        break;
    case KVX_MSG_NOTICE_ACK:
        x = kvx_xfer_lookup(cs->core, m->u.notice_ack.xfer_id);
        if (x != NULL && x->conn == c && x->noticed)
            kvx_xfer_end(x, kvx_remote_status(m->u.notice_ack.status));
        break;
    default:
        break;
    }
}

void kvx_xfer_on_sent(kvx_conn_t *c, uint64_t xfer_id)
{
    kvx_xfer_t *x = kvx_xfer_lookup(c->core, xfer_id);

    if (x == NULL || x->conn != c || x->sending == 0 || --x->sending > 0)
        return;
    /* its last message left: it touches no memory any more */
    if (x->state == KVX_XS_ENDING)
        kvx_xfer_done(x, x->end_status);
    else if (x->canceled && x->state != KVX_XS_DONE)
        kvx_xfer_end(x, -ECANCELED);
}
