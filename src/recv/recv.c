/*
 * Where a peer's bytes land: the receiving side's messages. Every message after a HELLO
 * (hello.c) must carry its connection's id and token (rconn.c). A write is checked against the
 * region and the writer's fences (fence.c), then copied in and acknowledged; a read is served
 * from the region; a notice goes to notice.c. Nothing a peer
 * sends is used before it is checked. Messages arrive inside UCX progress (kvx_recv_on_message);
 * what must be sent in return waits for kvx_recv_work, after it.
 */
#include "recv/kvx_recv.h"
#include "recv/recv_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Acknowledge bytes of a transfer (status 0) or refuse them; consecutive acknowledgements of one
 * transfer merge. Returns false when the batch is full (a flood of distinct transfers). */
static bool kvx_rconn_ack(kvx_rconn_t *rc, uint64_t xfer_id, uint64_t bytes, int32_t status)
{
    if (rc->nacks > 0) {
        uint64_t id;
        uint32_t b;
        int32_t st;
        kvx_wire_ack_get(rc->acks, rc->nacks - 1, &id, &b, &st);
        if (id == xfer_id && st == status && (uint64_t)b + bytes <= UINT32_MAX) {
            kvx_wire_ack_put(rc->acks, rc->nacks - 1, id, b + (uint32_t)bytes, st);
            return true;
        }
    }
    if (rc->nacks == rc->acks_cap) {
        uint32_t cap = rc->acks_cap ? rc->acks_cap * 2 : KVX_ACK_BATCH;
        uint8_t *acks = cap <= KVX_ACKS_MAX ? realloc(rc->acks, (size_t)cap * 16) : NULL;
        if (acks == NULL)
            return false;
        size_t grown = (size_t)(cap - rc->acks_cap) * KVX_WIRE_ACK_ENTRY_LEN;
        /* the buffer and its size first: a doom inside kvx_rq_add frees exactly what is here */
        rc->acks = acks;
        rc->acks_cap = cap;
        kvx_rq_add(rc, grown);
        if (rc->doomed) /* the transport's bound took this one */
            return true;
    }
    kvx_wire_ack_put(rc->acks, rc->nacks++, xfer_id, (uint32_t)bytes, status);
    kvx_rconn_want_work(rc);
    return true;
}

/* ---- messages in (inside UCX progress) ---------------------------------------------------- */

/* The receive ended: the write landed (its checksum checked first) and is acknowledged, or the
 * connection closes (its writer's transfers on it fail: a receive that did not end well may have
 * left part of its bytes in place, which only a failed transfer may do). */
static void kvx_recv_landed(kvx_rconn_t *rc, kvx_write_rndv_t *wr, int status)
{
    kvx_core_t *core = rc->core;
    kvx_writer_t *w = rc->w;
    int32_t st = 0;

    if (status < 0) {
        kvx_count(core, w, KVX_CNT(rndv_failed));
        kvx_info(core, "writer %s: connection %u: a rendezvous receive of write %llu ended: %s",
                 w->name, rc->id, (unsigned long long)wr->xfer_id, kvx_strerror(status));
        if (rc->state == KVX_CONN_OPEN)
            kvx_rconn_abort(rc, "a rendezvous receive failed");
        free(wr);
        return;
    }
    if (wr->check_crc && kvx_crc32c(wr->region->base + wr->off, wr->len) != wr->crc) {
        kvx_count(core, w, KVX_CNT(drop_crc));
        st = -EBADMSG;
    } else {
        core->rcounters.bytes_landed += wr->len;
        w->counters.bytes_landed += wr->len;
        kvx_count(core, w, KVX_CNT(writes_landed));
        kvx_count(core, w, KVX_CNT(rndv_landed));
        kvx_rconn_active(rc);
    }
    if (rc->state == KVX_CONN_OPEN && !rc->doomed && !kvx_rconn_ack(rc, wr->xfer_id, wr->len, st))
        kvx_rconn_doom(rc, "its acknowledgements cannot leave");
    free(wr);
}

/* After the header's checks (status): the payload goes straight into the region, or is refused
 * (UCX tells the sender it is done; the acknowledgement says why). Nothing of it reaches memory
 * before the checks. */
static void kvx_recv_write_rndv(kvx_rconn_t *rc, const kvx_msg_t *m, kvx_region_t *g,
                                const uint8_t *desc, size_t data_len, int32_t status)
{
    kvx_write_rndv_t *wr = NULL;
    kvx_wire_run_t run;
    int got;

    if (status == 0 && (wr = calloc(1, sizeof(*wr))) == NULL)
        status = -ENOSPC;
    if (status != 0) {
        if (!kvx_rconn_ack(rc, m->u.write.xfer_id, data_len, status))
            kvx_rconn_doom(rc, "its acknowledgements cannot leave");
        return;
    }
    kvx_wire_run_get(m->u.write.runs, 0, &run);
    wr->done = kvx_recv_landed;
    wr->epoch = m->u.write.epoch;
    wr->tag = m->u.write.tag;
    wr->xfer_id = m->u.write.xfer_id;
    wr->region = g;
    wr->off = run.offset;
    wr->len = run.len;
    wr->crc = run.crc;
    wr->check_crc = (m->flags & KVX_MSGF_CRC) != 0;
    got = kvx_rconn_recv(rc, wr, (void *)desc);
    if (got == 0) {
        kvx_recv_landed(rc, wr, 0);
    } else if (got == -EPERM) {
        /* not on the connection's own endpoint: refused, as a message of no connection */
        free(wr);
        kvx_count(rc->core, rc->w, KVX_CNT(drop_unknown));
        if (!kvx_rconn_ack(rc, m->u.write.xfer_id, data_len, -EPROTO))
            kvx_rconn_doom(rc, "its acknowledgements cannot leave");
    } else if (got < 0) {
        free(wr);
        if (got != -EBUSY) /* over the per-connection bound: counted as an overflow */
            kvx_count(rc->core, rc->w, KVX_CNT(rndv_failed));
        if (rc->state == KVX_CONN_OPEN)
            kvx_rconn_abort(rc, "a rendezvous receive could not start");
    }
}

static void kvx_recv_write(kvx_recv_t *r, const kvx_msg_t *m, const uint8_t *data, size_t data_len)
{
    kvx_rconn_t *rc = kvx_rconn_of(&r->conns, m);
    kvx_writer_t *w;
    kvx_region_t *g = NULL;
    int32_t status = 0;
    const uint8_t *d;
    int err;

    if (rc == NULL)
        return;
    w = rc->w;
    /* every check before any byte lands: a message lands whole or not at all; first the region
     * it names (known, live, its capability, writable), then the writer's fences */
    g = kvx_region_check(r->core, m->u.write.region, m->u.write.region_cap, KVX_REGION_WRITE, &err);
    if (g == NULL) {
        status = err;
    } else if (kvx_writer_fenced(w, m->u.write.epoch, m->u.write.tag)) {
        kvx_count(r->core, w, KVX_CNT(drop_fenced));
        status = -KVX_EFENCED;
    }
    /* a rendezvous payload is one run, received in one piece into the region, and only by a
     * transport that takes them (not KVX_RNDV_EAGER, which its HELLO_ACK said): on an RDMA lane
     * UCX might hand the sender a remote key for the place it lands in */
    if (m->rndv && status == 0 && !kvx_core_takes_rndv(r->core)) {
        kvx_count(r->core, w, KVX_CNT(drop_other));
        status = -EPROTO;
    } else if (m->rndv && status == 0 && m->u.write.nruns != 1) {
        kvx_count(r->core, w, KVX_CNT(drop_malformed));
        status = -EINVAL;
    }
    d = data;
    for (uint32_t i = 0; i < m->u.write.nruns && status == 0; i++) {
        kvx_wire_run_t run;
        kvx_wire_run_get(m->u.write.runs, i, &run);
        if (!kvx_region_fits(g, run.offset, run.len)) {
            kvx_count(r->core, w, KVX_CNT(drop_range));
            status = -EINVAL;
        } else if (m->rndv) {
            /* its checksum, if any, is checked once it has landed (kvx_recv_landed) */
        } else if ((m->flags & KVX_MSGF_CRC) && kvx_crc32c(d, run.len) != run.crc) {
            kvx_count(r->core, w, KVX_CNT(drop_crc));
            status = -EBADMSG;
        }
        d += run.len;
    }
    if (status != 0)
        kvx_debug(r->core, "writer %s: write %llu refused: %s", w->name,
                  (unsigned long long)m->u.write.xfer_id, kvx_strerror(status));
    if (m->rndv) { /* the checks passed or not: the payload is received now, or refused */
        kvx_recv_write_rndv(rc, m, g, data, data_len, status);
        return;
    }
    if (status == 0) {
        d = data;
        for (uint32_t i = 0; i < m->u.write.nruns; i++) {
            kvx_wire_run_t run;
            kvx_wire_run_get(m->u.write.runs, i, &run);
            memcpy(g->base + run.offset, d, run.len);
            d += run.len;
        }
        r->core->rcounters.bytes_landed += data_len;
        w->counters.bytes_landed += data_len;
        kvx_count(r->core, w, KVX_CNT(writes_landed));
        kvx_rconn_active(rc);
    }
    /* no room to remember the answer: rather than leave the writer waiting for it, close the
     * connection (the writer's transfers on it fail) */
    if (!kvx_rconn_ack(rc, m->u.write.xfer_id, data_len, status))
        kvx_rconn_doom(rc, "its acknowledgements cannot leave");
}

/* Answer a read request with a refusal: the reader's transfer fails with err at once. */
static void kvx_recv_refuse_read(kvx_rconn_t *rc, const kvx_msg_t *m, int err)
{
    kvx_recv_refuse(rc, m->u.read_req.xfer_id, m->u.read_req.stream_off, err);
}

/* Queue a read request to be answered: behind every request of its priority or higher, and
 * ahead of lower ones that have been passed over fewer than KVX_SERVE_PASS_MAX times (each now
 * once more). The first may be half answered: its READ_DATA carry their stream offsets, and a
 * reader takes each request's in order, however requests interleave. */
static void kvx_recv_serve_queue(kvx_rconn_t *rc, kvx_serve_t *s)
{
    kvx_list_t *at = rc->serve.prev; /* s goes after at */

    while (at != &rc->serve) {
        kvx_serve_t *o = kvx_container_of(at, kvx_serve_t, link);
        if (o->prio >= s->prio || o->passed >= KVX_SERVE_PASS_MAX)
            break;
        at = at->prev;
    }
    for (kvx_list_t *n = at->next; n != &rc->serve; n = n->next)
        kvx_container_of(n, kvx_serve_t, link)->passed++;
    kvx_list_add_tail(at->next, &s->link); /* before at's next: after at */
}

static void kvx_recv_read_req(kvx_recv_t *r, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = kvx_rconn_of(&r->conns, m);
    kvx_serve_t *s;
    kvx_region_t *g;
    uint32_t n = m->u.read_req.nruns;
    int err;

    if (rc == NULL)
        return;
    g = kvx_region_check(r->core, m->u.read_req.region, m->u.read_req.region_cap, KVX_REGION_READ,
                         &err);
    if (g == NULL) { /* refused whole: the reader's transfer fails */
        kvx_recv_refuse_read(rc, m, err);
        return;
    }
    s = rc->nserve < KVX_SERVE_MAX ? malloc(sizeof(*s) + n * sizeof(s->runs[0])) : NULL;
    if (s == NULL) { /* too many waiting (a kvx reader asks 16 at a time), or out of memory */
        kvx_count(r->core, rc->w, KVX_CNT(drop_other));
        kvx_recv_refuse_read(rc, m, -EBUSY);
        return;
    }
    s->xfer_id = m->u.read_req.xfer_id;
    s->stream_off = m->u.read_req.stream_off;
    s->crc = (m->flags & KVX_MSGF_CRC) != 0;
    s->nruns = n;
    s->run = 0;
    s->run_off = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvx_wire_run_get(m->u.read_req.runs, i, &s->runs[i]);
        if (!kvx_region_fits(g, s->runs[i].offset, s->runs[i].len)) {
            /* refused whole: the reader's transfer fails */
            kvx_count(r->core, rc->w, KVX_CNT(drop_range));
            free(s);
            kvx_recv_refuse_read(rc, m, -EINVAL);
            return;
        }
    }
    s->prio = m->u.read_req.prio;
    s->passed = 0;
    s->region = g;
    kvx_region_get(g);
    kvx_recv_serve_queue(rc, s);
    rc->nserve++;
    kvx_rconn_want_work(rc);
    kvx_rconn_active(rc);
    kvx_rq_add(rc, sizeof(*s) + n * sizeof(s->runs[0]));
}

void kvx_recv_on_message(kvx_recv_t *r, const kvx_msg_t *m, const void *hdr, size_t hdr_len,
                         const uint8_t *data, size_t data_len)
{
    kvx_rconn_t *rc;

    switch (m->type) {
    case KVX_MSG_HELLO:
        kvx_recv_hello_in(r, m, hdr, hdr_len);
        break;
    case KVX_MSG_WRITE:
        kvx_recv_write(r, m, data, data_len);
        break;
    case KVX_MSG_READ_REQ:
        kvx_recv_read_req(r, m);
        break;
    case KVX_MSG_NOTICE:
        kvx_recv_notice(r, m, data, data_len);
        break;
    case KVX_MSG_BYE:
        if ((rc = kvx_rconn_of(&r->conns, m)) != NULL)
            kvx_rconn_close(rc);
        break;
    case KVX_MSG_PROOF:
        kvx_recv_proof(r, m);
        break;
    default:
        break;
    }
}

/* ---- after UCX progress: replies ----------------------------------------------------------- */

/*
 * Answer read requests: each READ_DATA carries as much of the stream as a message holds, or, for
 * a run of at least the lane's rendezvous threshold, one contiguous piece of the region alone,
 * whose payload UCX moves by rendezvous (the reader checks the header against its request, then
 * receives it straight into its blocks). The header is the same as an eager one's for that
 * piece.
 */
static unsigned kvx_recv_serve(kvx_recv_t *r, kvx_rconn_t *rc, size_t seg)
{
    uint64_t rndv_min = rc->rndv_min;
    unsigned n = 0;

    while (!kvx_list_empty(&rc->serve) && rc->sending < KVX_SEND_WINDOW && rc->pending_err == 0) {
        kvx_serve_t *s = kvx_list_first(&rc->serve, kvx_serve_t, link);
        kvx_send_t *m = kvx_ucx_send_get(rc->ucx);
        size_t budget = seg > 2 * KVX_WIRE_READ_DATA_LEN ? seg - 2 * KVX_WIRE_READ_DATA_LEN : 512;
        size_t len = 0, niov = 0;
        uint64_t off = s->stream_off;
        uint32_t crc = 0;
        bool rndv;
        int rc2;

        if (m == NULL)
            break;
        while (s->run < s->nruns && len < budget && niov < KVX_WIRE_MAX_RUNS) {
            kvx_wire_run_t *run = &s->runs[s->run];
            size_t piece =
                run->len - s->run_off < budget - len ? run->len - s->run_off : budget - len;
            if (run->len - s->run_off >= rndv_min) { /* alone, the rest of the run */
                if (niov > 0)
                    break;
                piece = run->len - s->run_off;
                m->rndv = true;
            }
            m->iov[niov].base = s->region->base + run->offset + s->run_off;
            m->iov[niov].len = piece;
            niov++;
            len += piece;
            s->run_off += piece;
            if (s->run_off == run->len) {
                s->run++;
                s->run_off = 0;
            }
            if (m->rndv)
                break;
        }
        s->stream_off += len;
        if (s->crc)
            crc = kvx_crc32c_parts(m->iov, niov);
        kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_READ_DATA,
                                     .flags = s->crc ? KVX_MSGF_CRC : 0,
                                     .conn_id = rc->peer_conn_id,
                                     .token = rc->peer_token,
                                     .u.read_data = {.xfer_id = s->xfer_id,
                                                     .stream_off = off,
                                                     .len = (uint32_t)len,
                                                     .crc = crc}},
                        m->hdr);
        rndv = m->rndv;             /* m is UCX's or free again once sent */
        m->xfer_id = s->region->id; /* UCX reads the region until sent (kvx_rconn_ep_sent) */
        rc2 = kvx_ucx_send(m, KVX_WIRE_READ_DATA_LEN, niov, &rc->ucx_refs);
        if (rc2 == 1) {
            rc->sending++;
            rc->data_sending++;
            kvx_region_get(s->region);
        }
        r->core->rcounters.bytes_served += len;
        rc->w->counters.bytes_served += len;
        if (rndv && rc2 >= 0)
            kvx_count(r->core, rc->w, KVX_CNT(rndv_served));
        n++;
        if (s->run == s->nruns || rc2 < 0) {
            kvx_list_del(&s->link);
            rc->nserve--;
            kvx_rq_sub(rc, sizeof(*s) + s->nruns * sizeof(s->runs[0]));
            kvx_region_put(s->region);
            free(s);
        }
        if (rc2 == 1) /* last: over the transport's bound, rc may lose its queues here */
            kvx_rq_add(rc, sizeof(kvx_send_t));
        if (rc->doomed)
            break;
    }
    return n;
}

static unsigned kvx_recv_flush(kvx_recv_t *r, kvx_rconn_t *rc)
{
    unsigned n = 0;

    while (!kvx_list_empty(&rc->ctl) && rc->sending < KVX_SEND_WINDOW && !rc->doomed &&
           rc->pending_err == 0) {
        kvx_ctl_t *c = kvx_list_first(&rc->ctl, kvx_ctl_t, link);
        kvx_list_del(&c->link);
        rc->nctl--;
        kvx_rq_sub(rc, sizeof(*c));
        if (kvx_ucx_send_ctl(rc->ucx, c->hdr, c->len, &rc->ucx_refs) == 1) {
            rc->sending++;
            kvx_rq_add(rc, sizeof(kvx_send_t));
        }
        free(c);
        n++;
    }
    /* acknowledgements, KVX_ACK_BATCH per message: they are how writers make progress, so they
     * have KVX_ACK_WINDOW more messages than read data and control; what the window holds back
     * waits in rc->acks (at most KVX_ACKS_MAX) */
    uint32_t done = 0;
    while (done < rc->nacks && rc->sending < KVX_SEND_WINDOW + KVX_ACK_WINDOW && !rc->doomed &&
           rc->pending_err == 0) {
        kvx_send_t *m = kvx_ucx_send_get(rc->ucx);
        uint32_t k = rc->nacks - done < KVX_ACK_BATCH ? rc->nacks - done : KVX_ACK_BATCH;
        size_t len;
        if (m == NULL)
            break;
        len = kvx_wire_encode(
            &(kvx_msg_t){
                .type = KVX_MSG_ACK,
                .conn_id = rc->peer_conn_id,
                .token = rc->peer_token,
                .u.ack = {.n = k, .entries = rc->acks + (size_t)done * KVX_WIRE_ACK_ENTRY_LEN}},
            m->hdr);
        done += k;
        n++;
        if (kvx_ucx_send(m, len, 0, &rc->ucx_refs) == 1) {
            rc->sending++;
            kvx_rq_add(rc, sizeof(kvx_send_t));
        }
    }
    if (rc->doomed)
        return n;
    /* what could not go out (no message buffer) stays for the next round */
    if (done > 0 && done < rc->nacks)
        memmove(rc->acks, rc->acks + (size_t)done * KVX_WIRE_ACK_ENTRY_LEN,
                (size_t)(rc->nacks - done) * KVX_WIRE_ACK_ENTRY_LEN);
    rc->nacks -= done;
    if (rc->nacks == 0 && rc->acks_cap > 4 * KVX_ACK_BATCH) { /* a burst's buffer goes */
        kvx_rq_sub(rc, (size_t)rc->acks_cap * KVX_WIRE_ACK_ENTRY_LEN);
        free(rc->acks);
        rc->acks = NULL;
        rc->acks_cap = 0;
    }
    if (rc->nacks > 0 && rc->sending < KVX_SEND_WINDOW + KVX_ACK_WINDOW)
        kvx_rconn_want_work(rc); /* no message buffer: next round (else kvx_recv_on_sent) */
    if (!kvx_list_empty(&rc->serve))
        n += kvx_recv_serve(r, rc, rc->seg);
    return n;
}

unsigned kvx_recv_work(kvx_recv_t *r)
{
    unsigned n = kvx_recv_hellos(r, false);
    kvx_list_t todo;

    if (n > 0)
        kvx_recv_housekeeping(r, kvx_now_ns());
    kvx_list_splice_init(&r->conns.work, &todo);
    while (!kvx_list_empty(&todo)) {
        kvx_rconn_t *rc = kvx_list_first(&todo, kvx_rconn_t, work_link);
        kvx_list_del(&rc->work_link);
        if (rc->lingering) {
            if (rc->sending == 0 || rc->pending_err != 0) {
                kvx_rconn_end_linger(rc);
                n++;
            }
            continue;
        }
        if (rc->state != KVX_CONN_OPEN)
            continue;
        if (rc->doomed) {
            kvx_rconn_close(rc);
            n++;
            continue;
        }
        if (rc->pending_err == 0)
            n += kvx_recv_flush(r, rc);
        /* what the send window held back resumes from kvx_recv_on_sent */
        if (rc->pending_err != 0) { /* failed before or during the flush: UCX is out of it */
            kvx_rconn_close(rc);
            n++;
        }
    }
    return n;
}

int kvx_recv_init(kvx_recv_t *r, kvx_core_t *core, size_t notice_cap)
{
    r->core = core;
    kvx_rconns_init(&r->conns, core);
    kvx_list_init(&r->hellos);
    kvx_list_init(&r->refusing);
    r->notice_cap = notice_cap;
    r->notices = calloc(notice_cap, sizeof(*r->notices));
    return r->notices != NULL ? 0 : -ENOMEM;
}

void kvx_recv_fini(kvx_recv_t *r) { kvx_notices_free(r); }

bool kvx_recv_has_work(const kvx_recv_t *r)
{
    return !kvx_list_empty(&r->conns.work) || !kvx_list_empty(&r->hellos);
}

/* Work only polling advances: handshakes to answer, replies to send, or UCX holding ours until
 * a FIFO has room. */
bool kvx_recv_needs_polling(const kvx_recv_t *r)
{
    return !kvx_list_empty(&r->hellos) || kvx_rconns_need_polling(&r->conns);
}

/* Free everything of the receiving side (the worker is gone: no callback will come). */
void kvx_recv_free_all(kvx_recv_t *r)
{
    while (!kvx_list_empty(&r->hellos)) {
        kvx_hello_t *h = kvx_list_first(&r->hellos, kvx_hello_t, link);
        kvx_list_del(&h->link);
        free(h);
    }
    r->nhellos = 0;
    kvx_rconns_free_all(&r->conns);
    free(r->seen);
    r->seen = NULL;
}
