/*
 * Where a transfer travels: its byte stream cut into kvx's messages (WRITE carries the blocks,
 * READ_REQ asks for them) and handed to UCX with back-pressure, or copied straight into or out of
 * a peer's owned region mapped here, in the order of the priority scheduling (kvx_xfer_pick:
 * deficit round robin over the levels, the low levels' window).
 */
#include "xfer/kvx_xfer.h"

#include <limits.h>
#include <stdatomic.h>
#include <string.h>

/* Room a message leaves for UCX's own headers on its lane. */
#define KVX_MSG_SLACK 128
/* Deficit round robin over the priority levels (kvx.h, enum kvx_priority): the bytes a level
 * with queued transfers may post in a round, LOW, NORMAL, HIGH (weights 1, 4, 16). */
static const int64_t kvx_prio_quantum[KVX_PRIO_LEVELS] = {64 << 10, 256 << 10, 1 << 20};

/* The largest piece of a run one rendezvous message carries. */
#define KVX_RNDV_PIECE ((size_t)4 << 20)

/* One WRITE: as many of the stream's bytes as a message holds, from posted on. Returns the bytes
 * posted (0: none, out of message buffers), or a negative errno (the connection fails). */
static ssize_t kvx_xfer_post_write(kvx_conn_t *c, kvx_xfer_t *x)
{
    kvx_send_t *s = kvx_ucx_send_get(c->ucx);
    size_t avail = c->seg > 2 * KVX_MSG_SLACK ? c->seg - KVX_MSG_SLACK : KVX_MSG_SLACK;
    size_t len = 0, hdr_len = KVX_WIRE_WRITE_LEN;
    uint32_t n = 0;
    int rc;

    if (s == NULL)
        return 0;
    const kvx_rreg_t *rr = &x->rregs[x->runs[x->next_run].rreg]; /* the message's region */

    while (x->next_run < x->nruns && n < KVX_WIRE_MAX_RUNS &&
           hdr_len + KVX_WIRE_RUN_LEN + len < avail && &x->rregs[x->runs[x->next_run].rreg] == rr) {
        uint64_t run_len = x->runs[x->next_run].len;
        uint64_t left = run_len - x->run_off;
        size_t room = avail - hdr_len - KVX_WIRE_RUN_LEN - len;
        size_t piece = left < room ? (size_t)left : room;
        kvx_wire_run_t r;

        if (left >= c->rndv_min) {
            /* a large run goes alone, by rendezvous: the receiver checks this header, then
             * UCX moves the piece into the place it names; runs already batched go first */
            if (n > 0)
                break;
            piece = left < KVX_RNDV_PIECE ? (size_t)left : KVX_RNDV_PIECE;
            s->rndv = true;
        }
        r = (kvx_wire_run_t){kvx_xfer_remote(x, x->next_run, x->run_off), (uint32_t)piece, 0};

        s->iov[n].base = kvx_xfer_local(x, x->next_run, x->run_off);
        s->iov[n].len = piece;
        if (c->crc)
            r.crc = kvx_crc32c(s->iov[n].base, piece);
        kvx_wire_run_put(s->hdr + KVX_WIRE_WRITE_LEN, n, &r);
        n++;
        len += piece;
        hdr_len += KVX_WIRE_RUN_LEN;
        kvx_run_step(&x->next_run, &x->run_off, piece, run_len);
        if (s->rndv)
            break;
    }
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_WRITE,
                                 .flags = c->crc ? KVX_MSGF_CRC : 0,
                                 .conn_id = c->rconn_id,
                                 .token = c->rconn_token,
                                 .u.write = {.xfer_id = x->id,
                                             .tag = x->tag,
                                             .epoch = x->epoch,
                                             .nruns = n,
                                             .region = rr->id,
                                             .region_cap = rr->capability}}, /* runs in place */
                    s->hdr);
    s->xfer_id = x->id;
    rc = kvx_ucx_send(s, hdr_len, n, &c->ucx_refs);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        c->reqs++;
        x->sending++;
    } else {
        /* UCX took it at once: the lane had room, so the peer is draining it - that is
         * progress, even while its acknowledgements wait behind a long stretch of its work */
        c->last_progress_ns = kvx_now_ns();
    }
    x->posted += len;
    kvx_conn_unacked_add(c, x, len);
    return (ssize_t)len;
}

/* A peer's owned region, mapped here: up to budget bytes of the stream (at least one piece) are
 * copied straight into it (a write) or out of it (a read), by this thread, under the lock, so a
 * cancel or failure stops the copying at once. Nothing is left for UCX or the peer to do. */
static ssize_t kvx_xfer_copy(kvx_conn_t *c, kvx_xfer_t *x, size_t budget)
{
    size_t len = 0;

    while (x->next_run < x->nruns && len < budget) {
        uint64_t run_len = x->runs[x->next_run].len;
        uint64_t left = run_len - x->run_off;
        size_t piece = left < budget - len ? (size_t)left : budget - len;
        uint8_t *local = kvx_xfer_local(x, x->next_run, x->run_off);
        uint8_t *remote = c->mapped + kvx_xfer_remote(x, x->next_run, x->run_off);

        if (x->op == KVX_OP_WRITE)
            memcpy(remote, local, piece);
        else
            memcpy(local, remote, piece);
        len += piece;
        kvx_run_step(&x->next_run, &x->run_off, piece, run_len);
    }
    x->posted += len;
    x->done = x->posted;
    return (ssize_t)len;
}

/* One READ_REQ: up to KVX_READ_REQ_MAX bytes of the stream, from posted on. Returns the bytes
 * asked for (0: no request slot free), or a negative errno. */
static ssize_t kvx_xfer_post_read(kvx_conn_t *c, kvx_xfer_t *x)
{
    const kvx_rreg_t *rr;
    kvx_read_req_t *q = NULL;
    uint8_t hdr[KVX_WIRE_READ_REQ_LEN + KVX_WIRE_MAX_RUNS * KVX_WIRE_RUN_LEN];
    uint64_t len = 0;
    uint32_t n = 0;
    size_t hdr_len;
    int rc;

    for (unsigned i = 0; i < KVX_MAX_REQS && q == NULL; i++)
        if (c->read_reqs[i].xfer_id == 0)
            q = &c->read_reqs[i];
    if (q == NULL)
        return 0;
    rr = &x->rregs[x->runs[x->next_run].rreg]; /* the request's region */
    q->stream_off = x->posted;
    q->run = x->next_run;
    q->run_off = x->run_off;
    while (x->next_run < x->nruns && n < KVX_WIRE_MAX_RUNS && len < KVX_READ_REQ_MAX &&
           &x->rregs[x->runs[x->next_run].rreg] == rr) {
        uint64_t run_len = x->runs[x->next_run].len;
        uint64_t left = run_len - x->run_off, room = KVX_READ_REQ_MAX - len;
        uint64_t piece = left < room ? left : room;
        kvx_wire_run_t r = {kvx_xfer_remote(x, x->next_run, x->run_off), (uint32_t)piece, 0};

        kvx_wire_run_put(hdr + KVX_WIRE_READ_REQ_LEN, n++, &r);
        len += piece;
        kvx_run_step(&x->next_run, &x->run_off, piece, run_len);
    }
    hdr_len = kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_READ_REQ,
                                           .flags = c->crc ? KVX_MSGF_CRC : 0,
                                           .conn_id = c->rconn_id,
                                           .token = c->rconn_token,
                                           .u.read_req = {.xfer_id = x->id,
                                                          .stream_off = q->stream_off,
                                                          .nruns = n,
                                                          /* the target answers by it */
                                                          .prio = x->prio,
                                                          .region = rr->id,
                                                          .region_cap = rr->capability}},
                              hdr);
    rc = kvx_ucx_send_ctl(c->ucx, hdr, hdr_len, &c->ucx_refs);
    if (rc < 0)
        return rc;
    if (rc == 1)
        c->reqs++;
    q->xfer_id = x->id;
    q->len = len;
    q->got = 0;
    x->posted += len;
    kvx_conn_unacked_add(c, x, len);
    return (ssize_t)len;
}

/* Read request slots in use on c. */
static unsigned kvx_read_reqs_used(const kvx_conn_t *c)
{
    unsigned n = 0;

    for (unsigned i = 0; i < KVX_MAX_REQS; i++)
        n += c->read_reqs[i].xfer_id != 0;
    return n;
}

/* Whether level l (below HIGH) keeps to KVX_LOW_WINDOW now: LOW always, NORMAL for
 * KVX_HIGH_RECENT_NS after a HIGH transfer was queued on c. */
static bool kvx_windowed(const kvx_conn_t *c, int l)
{
    return l == KVX_PRIO_LOW || (l == KVX_PRIO_NORMAL && c->high_ns != 0 &&
                                 kvx_now_ns() - c->high_ns < KVX_HIGH_RECENT_NS);
}

/*
 * The transfer whose next message goes now (kvx.h, enum kvx_priority): the oldest of the highest
 * level that has queued transfers and bytes left of its round; when no level with transfers has
 * any, a new round adds each its quantum (a message may take more than a round's bytes: a read
 * request 256 KiB against LOW's 64 KiB; its level then sits out rounds until the debt is paid).
 * A level's credit never exceeds one quantum and is cleared when its queue empties
 * (kvx_xfer_unqueue), so an idle level saves nothing up and owes nothing when it comes back. A
 * level waits, as if it had nothing queued:
 *  - LOW (and NORMAL while HIGH is in use: kvx_windowed) while KVX_LOW_WINDOW bytes of its own are
 *    posted and not acknowledged;
 *  - LOW, while no higher level has transfers queued, while UCX holds KVX_LOW_REQS messages or
 *    read requests of the connection: what a higher transfer finds ahead of it stays small;
 *  - any level whose oldest transfer is a read, while every read request slot is taken (a write
 *    of another level may go meanwhile).
 * NULL: nothing may go.
 */
static kvx_xfer_t *kvx_xfer_pick(kvx_conn_t *c)
{
    unsigned read_reqs = UINT_MAX; /* counted when a read is looked at: writes pay nothing */

    for (;;) { /* ends: each new round raises every level with transfers toward its quantum */
        bool any = false;

        for (int l = KVX_PRIO_LEVELS - 1; l >= 0; l--) {
            kvx_xfer_t *x;

            if (kvx_list_empty(&c->queue[l]))
                continue;
            x = kvx_list_first(&c->queue[l], kvx_xfer_t, conn_link);
            if (c->mapped == NULL && x->posted < x->bytes && !x->canceled) {
                if (x->op == KVX_OP_READ && read_reqs == UINT_MAX)
                    read_reqs = kvx_read_reqs_used(c);
                if (x->op == KVX_OP_READ && read_reqs >= KVX_MAX_REQS)
                    continue;
                if (l < KVX_PRIO_HIGH && c->unacked_lvl[l] >= KVX_LOW_WINDOW && kvx_windowed(c, l))
                    continue;
                if (l == KVX_PRIO_LOW && !any &&
                    (c->reqs >= KVX_LOW_REQS ||
                     (x->op == KVX_OP_READ && read_reqs >= KVX_LOW_REQS)))
                    continue;
            }
            any = true;
            if (c->credit[l] > 0)
                return x;
        }
        if (!any)
            return NULL;
        for (int l = 0; l < KVX_PRIO_LEVELS; l++) {
            int64_t q = kvx_prio_quantum[l], v = c->credit[l] + q;
            if (!kvx_list_empty(&c->queue[l]))
                c->credit[l] = v < q ? v : q;
        }
    }
}

/*
 * Hand queued transfers' messages to UCX, one message at a time, each of the transfer
 * kvx_xfer_pick chooses, until nothing is queued, UCX holds KVX_MAX_REQS messages or every read
 * request slot is taken (replies resume posting), or budget bytes went out (the connection asks
 * for the next progress step). A transfer whose stream is all posted waits for its replies.
 */
void kvx_xfer_post(kvx_conn_t *c, size_t budget)
{
    kvx_xfer_t *x;

    while (c->state == KVX_CONN_OPEN && c->wired && (x = kvx_xfer_pick(c)) != NULL) {
        if (c->mapped != NULL && x->rgen != 0) { /* mapped: its main region only (submit.c) */
            kvx_xfer_end(x, -EOPNOTSUPP);
            continue;
        }
        if (x->posted < x->bytes && !x->canceled) {
            ssize_t n;
            if (budget == 0) { /* the rest goes on in the next progress step */
                kvx_conn_want_work(c);
                return;
            }
            if (c->reqs >= KVX_MAX_REQS && c->mapped == NULL)
                return;                   /* a reply or send resumes */
            if (!kvx_conn_awaits_peer(c)) /* the stall clock starts with the first outstanding op */
                c->last_progress_ns = kvx_now_ns();
            if (c->mapped != NULL) /* a copy keeps to its level's round too */
                n = kvx_xfer_copy(c, x,
                                  (uint64_t)c->credit[x->prio] < budget ? (size_t)c->credit[x->prio]
                                                                        : budget);
            else if (x->op == KVX_OP_WRITE)
                n = kvx_xfer_post_write(c, x);
            else
                n = kvx_xfer_post_read(c, x);
            if (n < 0) {
                kvx_error(c->core, "posting to %s: %s", c->agent_name, kvx_strerror((int)n));
                kvx_conn_fail(c, (int)n);
                return;
            }
            if (n == 0)
                return; /* no message buffer or read slot: a reply or send resumes */
            budget = (size_t)n < budget ? budget - (size_t)n : 0;
            c->credit[x->prio] -= n;
            if (x->posted < x->bytes && !x->canceled)
                continue;
        }
        kvx_xfer_unqueue(c, x);
        x->state = KVX_XS_WAITING;
        kvx_list_add_tail(&c->waiting, &x->conn_link);
        if (x->canceled && x->sending == 0) { /* canceled: nothing more of it will move */
            kvx_xfer_end(x, -ECANCELED);
        } else if (c->mapped != NULL || x->bytes == 0) { /* copied (or nothing to move): it
                                                          * has landed (a notice may follow) */
            atomic_thread_fence(memory_order_release);
            kvx_xfer_landed(c, x);
        }
    }
}

/* A transfer's NOTICE, with its payload (always eager: UCX reads the transfer's copy, counted in
 * x->sending until it let go) or without: 0 (sent or in UCX's hands) or a negative errno. */
static int kvx_xfer_send_notice(kvx_conn_t *c, kvx_xfer_t *x)
{
    kvx_send_t *s = kvx_ucx_send_get(c->ucx);
    size_t hdr_len;
    int rc;

    if (s == NULL)
        return -ENOMEM;
    hdr_len = kvx_wire_encode(
        &(kvx_msg_t){.type = KVX_MSG_NOTICE,
                     .flags = (x->has_data ? KVX_MSGF_DATA : 0) | (x->alone ? KVX_MSGF_ALONE : 0),
                     .conn_id = c->rconn_id,
                     .token = c->rconn_token,
                     .u.notice = {.xfer_id = x->id,
                                  .tag = x->tag,
                                  .epoch = x->epoch,
                                  .blocks = x->pieces,
                                  .bytes = x->bytes,
                                  .data_len = x->notice_len}},
        s->hdr);
    s->iov[0].base = x->notice_data;
    s->iov[0].len = x->notice_len;
    s->xfer_id = x->id;
    rc = kvx_ucx_send(s, hdr_len, x->notice_len > 0 ? 1 : 0, &c->ucx_refs);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        c->reqs++;
        x->sending++;
    }
    return 0;
}

/* All of a write's bytes were acknowledged (a read's arrived): done, or first the notice. */
void kvx_xfer_landed(kvx_conn_t *c, kvx_xfer_t *x)
{
    int rc;

    if (!x->notify || x->canceled) { /* no notice for a canceled transfer */
        kvx_xfer_end(x, 0);
        return;
    }
    rc = kvx_xfer_send_notice(c, x);
    if (rc < 0) {
        kvx_xfer_end(x, rc);
        return;
    }
    x->noticed = true;
    c->notices++;
}
