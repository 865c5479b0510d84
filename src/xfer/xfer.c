/*
 * Where a transfer is born and travels on the initiator's side: index checks, coalescing into
 * runs, cutting its byte stream into kvx's messages (WRITE carries the blocks, READ_REQ asks for
 * them) with back-pressure, how it ends, and deadlines. What the receiver answers is
 * xfer_reply.c; the receiving side is recv.c.
 */
#include "xfer/kvx_xfer.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Bytes the submitting thread posts itself before leaving the rest to the progress engine: small
 * transfers go out at once, large ones do not hold the caller for the whole copy. */
#define KVX_INLINE_BUDGET ((size_t)256 * 1024)
/* Room a message leaves for UCX's own headers on its lane. */
#define KVX_MSG_SLACK 128
/* Deficit round robin over the priority levels (kvx.h, enum kvx_priority): the bytes a level
 * with queued transfers may post in a round, LOW, NORMAL, HIGH (weights 1, 4, 16). */
static const int64_t kvx_prio_quantum[KVX_PRIO_LEVELS] = {64 << 10, 256 << 10, 1 << 20};

/* Check every index and fold runs consecutive on both sides. O(count), no allocation once the
 * transfer slot has seen a transfer this large. */
static int kvx_xfer_build_runs(kvx_core_t *core, kvx_xfer_t *x, uint64_t remote_num_blocks,
                               const uint32_t *local, const uint32_t *remote, size_t count)
{
    kvx_run_t *r;
    uint32_t nruns = 0;

    if (x->runs_cap < count) {
        size_t cap = count < 16 ? 16 : count;
        kvx_run_t *runs = realloc(x->runs, cap * sizeof(*runs));
        if (runs == NULL)
            return -ENOMEM;
        x->runs = runs;
        x->runs_cap = (uint32_t)cap;
    }
    r = x->runs - 1;
    for (size_t i = 0; i < count; i++) {
        uint32_t l = local[i], rm = remote[i];

        if (l >= core->num_blocks || rm >= remote_num_blocks) {
            kvx_debug(core, "index %zu out of range: local %u of %llu, remote %u of %llu", i, l,
                      (unsigned long long)core->num_blocks, rm,
                      (unsigned long long)remote_num_blocks);
            return -EINVAL;
        }
        if (nruns > 0 && l == r->local + r->count && rm == r->remote + r->count) {
            r->count++;
        } else {
            r++;
            r->local = l;
            r->remote = rm;
            r->count = 1;
            nruns++;
        }
    }
    x->nruns = nruns;
    return 0;
}

/* The local address of the stream's byte at run i, offset off in it. */
uint8_t *kvx_xfer_local(const kvx_core_t *core, const kvx_xfer_t *x, uint32_t i, uint64_t off)
{
    return core->base + (uint64_t)x->runs[i].local * core->block_len + off;
}

static uint64_t kvx_xfer_remote(const kvx_core_t *core, const kvx_xfer_t *x, uint32_t i,
                                uint64_t off)
{
    return (uint64_t)x->runs[i].remote * core->block_len + off;
}

/*
 * When a transfer that is not ENDING fails unless it finished (0: never): its deadline, and, for
 * one waiting for a connection (parked while its peer pairs again, or queued behind a handshake
 * not yet answered), the stall limit counted from its submission. No connection's stall clock
 * runs for a parked transfer, and a connection opened after its submission started its clock
 * late: this bounds both as the stall limit bounds the others.
 */
static uint64_t kvx_xfer_due(const kvx_core_t *core, const kvx_xfer_t *x)
{
    uint64_t due = x->deadline_ns, stall;

    if (core->stall_ns == 0 || x->state != KVX_XS_QUEUED || (x->conn != NULL && x->conn->wired))
        return due;
    stall = x->t_submit_ns + core->stall_ns;
    return due == 0 || stall < due ? stall : due;
}

/* Queue x on c at its level (now: the time); returns whether that level had nothing queued. A
 * HIGH one makes NORMAL transfers keep to the low window for a while (kvx_windowed). */
static bool kvx_xfer_enqueue(kvx_conn_t *c, kvx_xfer_t *x, uint64_t now)
{
    bool was_idle = kvx_list_empty(&c->queue[x->prio]);

    kvx_list_add_tail(&c->queue[x->prio], &x->conn_link);
    if (x->prio == KVX_PRIO_HIGH)
        c->high_ns = now;
    return was_idle;
}

/* x leaves c's queue of its level; a level left with nothing queued starts its next round from
 * nothing (kvx_xfer_pick): it saves nothing up and owes nothing. */
static void kvx_xfer_unqueue(kvx_conn_t *c, kvx_xfer_t *x)
{
    kvx_list_del(&x->conn_link);
    if (kvx_list_empty(&c->queue[x->prio]))
        c->credit[x->prio] = 0;
}

/* A new transfer to peer p (the API checked the arguments and found p, lock held): where a
 * transfer is born. Returns 0 with *id_p, or a negative errno with nothing changed. */
int kvx_xfer_submit(kvx_core_t *core, kvx_peer_t *p, int op, const uint32_t *local,
                    const uint32_t *remote, size_t count, const kvx_xfer_params_t *params,
                    uint64_t *id_p)
{
    uint64_t deadline_ms, now, due, fm = params != NULL ? params->field_mask : 0;
    uint32_t flags = (fm & KVX_XFER_PARAM_FLAGS) ? params->flags : 0;
    uint8_t prio = (fm & KVX_XFER_PARAM_PRIORITY) ? (uint8_t)params->priority : KVX_PRIO_NORMAL;
    kvx_conn_t *c;
    kvx_xfer_t *x;
    bool was_idle;
    int rc;

    deadline_ms = core->deadline_ns / 1000000ull;
    if (fm & KVX_XFER_PARAM_DEADLINE)
        deadline_ms = params->deadline_ms; /* at most KVX_MS_MAX: no overflow below */

    c = p->conn;
    if (c->state != KVX_CONN_OPEN && !p->reconnecting) {
        rc = -ENOTCONN;
        goto out;
    }
    rc = kvx_xfer_alloc(core, &x);
    if (rc < 0)
        goto out;
    /* a peer pairing again: checked against the region last known, and again when it is back */
    rc = kvx_xfer_build_runs(core, x, p->reconnecting ? p->last_num_blocks : c->remote_num_blocks,
                             local, remote, count);
    if (rc < 0) {
        kvx_xfer_free(x);
        goto out;
    }
    now = kvx_now_ns();
    x->op = (uint8_t)op;
    x->prio = prio;
    x->peer = p;
    x->conn = p->reconnecting ? NULL : c;
    x->bytes = (uint64_t)count * core->block_len;
    x->tag = (fm & KVX_XFER_PARAM_TAG) ? params->tag : 0;
    x->notify = (flags & KVX_XFER_NOTIFY) != 0;
    /* stamped with the fence epoch the receiver gave us; before the handshake, with the one its
     * HELLO_ACK brings (kvx_xfer_on_message) */
    x->epoch = c->wired ? c->epoch : UINT64_MAX;
    x->t_submit_ns = now;
    x->deadline_ns = deadline_ms ? now + deadline_ms * 1000000ull : 0;
    x->state = KVX_XS_QUEUED;
    p->nxfers++;
    p->inflight++;
    *id_p = x->id;
    if (x->bytes == 0) { /* nothing to move: done at once */
        kvx_list_add_tail(&core->active, &x->active_link);
        kvx_xfer_done(x, 0);
        rc = 0;
        goto out;
    }
    /* leaving idle: a progress thread asleep for a long tick looks again soon (stall and
     * liveness checks run every KVX_HOUSEKEEPING_NS while transfers are in flight) */
    if (kvx_list_empty(&core->active))
        kvx_core_kick(core, now + KVX_HOUSEKEEPING_NS);
    kvx_list_add_tail(&core->active, &x->active_link);
    due = kvx_xfer_due(core, x);
    if (due != 0 && due < core->next_deadline_ns) {
        core->next_deadline_ns = due;
        kvx_core_kick(core, due);
    }
    if (p->reconnecting) { /* it waits for the new connection (kvx_xfer_unpark) */
        kvx_list_add_tail(&p->parked, &x->conn_link);
        rc = 0;
        goto out;
    }
    /* the first of its level posts at once (what goes first is kvx_xfer_pick's choice); later
     * ones are posted as the earlier leave room */
    was_idle = kvx_xfer_enqueue(c, x, now);
    if (was_idle)
        kvx_xfer_post(c, KVX_INLINE_BUDGET);
    if (c->state == KVX_CONN_OPEN && c->wired && kvx_conn_queued(c) && c->reqs < KVX_MAX_REQS) {
        kvx_conn_want_work(c);
        kvx_core_kick(core, 0);
    }
    rc = 0;
out:
    return rc;
}

/* ---- the connection's accounting of a transfer --------------------------------------------- */

/* The transfer leaves its connection's accounting: what it had posted and not heard back of, its
 * read requests, its notice. Replies that still come for it find nothing and are dropped. */
static void kvx_xfer_detach(kvx_xfer_t *x)
{
    kvx_conn_t *c = x->conn;

    if (c == NULL) { /* parked (or never queued): only its list */
        kvx_list_del(&x->conn_link);
        return;
    }
    kvx_conn_unacked_sub(c, x, x->posted - x->done);
    x->done = x->posted;
    if (x->noticed) {
        c->notices--;
        x->noticed = false;
    }
    if (x->op == KVX_OP_READ)
        for (unsigned i = 0; i < KVX_MAX_REQS; i++)
            if (c->read_reqs[i].xfer_id == x->id)
                c->read_reqs[i].xfer_id = 0;
    if (x->state == KVX_XS_QUEUED)
        kvx_xfer_unqueue(c, x);
    else
        kvx_list_del(&x->conn_link);
    if (c->state == KVX_CONN_OPEN && kvx_conn_queued(c))
        kvx_conn_want_work(c);
}

/* How long an ENDING write waits for UCX to let go of its messages before kvx fails its
 * connection: KVX_END_GRACE_NS, or the stall limit when that is shorter. */
static uint64_t kvx_end_grace(const kvx_core_t *core)
{
    return core->stall_ns != 0 && core->stall_ns < KVX_END_GRACE_NS ? core->stall_ns
                                                                    : KVX_END_GRACE_NS;
}

/* A transfer ends (kvx_core.h): it leaves its connection's accounting now, and is done at once
 * (kvx_xfer_done queues it for poll), or, for a write whose messages UCX still holds (they read
 * its local blocks) or a read with rendezvous receives in flight (UCX writes its local blocks),
 * ENDING until the last of them is done (kvx_xfer_on_sent, kvx_xfer_on_received). The first
 * status wins. A read waits even on a lingering connection (which has no receive in flight when
 * it starts to linger: see kvx_conn_fail), since its blocks must not change once it is reported. */
void kvx_xfer_end(kvx_xfer_t *x, int status)
{
    kvx_core_t *core = x->core;

    if (x->state == KVX_XS_ENDING)
        return;
    kvx_xfer_detach(x);
    if (x->sending > 0 && (x->op == KVX_OP_READ || !(x->conn != NULL && x->conn->lingering))) {
        x->state = KVX_XS_ENDING;
        x->end_status = status;
        x->deadline_ns = kvx_now_ns() + kvx_end_grace(core);
        if (x->deadline_ns < core->next_deadline_ns) {
            core->next_deadline_ns = x->deadline_ns;
            kvx_core_kick(core, x->deadline_ns);
        }
        return;
    }
    kvx_xfer_done(x, status);
}

/* Forget a transfer (KVX_CANCEL_IMMEDIATE): it is never reported. One not yet done is purged and
 * done at once, counted as canceled, though UCX may still hold its messages (the caller accepts
 * that UCX may still read a write's blocks); one done already goes with its completion. */
void kvx_xfer_forget(kvx_xfer_t *x)
{
    if (x->state == KVX_XS_DONE) {
        kvx_xfer_free(x);
        return;
    }
    kvx_xfer_purge(x);
    kvx_xfer_detach(x);
    kvx_xfer_done(x, -ECANCELED);
}

void kvx_xfer_repark(kvx_conn_t *c, kvx_peer_t *p)
{
    /* the receiver refused a retired capability (kvx_fence_ex): what waited for this
     * connection was submitted before it heard of the fence, and fails with it */
    if (c->err == -EKEYREVOKED)
        return;
    /* before the handshake nothing of them was posted (kvx_xfer_post waits for it); they wait
     * highest level first (each level in submission order) and go back to their levels */
    for (int l = KVX_PRIO_LEVELS - 1; l >= 0 && !c->wired; l--)
        while (!kvx_list_empty(&c->queue[l])) {
            kvx_xfer_t *x = kvx_list_first(&c->queue[l], kvx_xfer_t, conn_link);
            kvx_xfer_detach(x);
            x->conn = NULL;
            kvx_list_add_tail(&p->parked, &x->conn_link);
        }
}

void kvx_xfer_unpark(kvx_peer_t *p, kvx_conn_t *c, int err)
{
    uint64_t now = kvx_now_ns();
    bool any = false;

    while (!kvx_list_empty(&p->parked)) {
        kvx_xfer_t *x = kvx_list_first(&p->parked, kvx_xfer_t, conn_link);
        bool fits = c != NULL;

        for (uint32_t i = 0; fits && i < x->nruns; i++)
            fits = (uint64_t)x->runs[i].remote + x->runs[i].count <= c->remote_num_blocks;
        if (!fits) {
            kvx_xfer_end(x, c != NULL ? -EINVAL : err);
            continue;
        }
        kvx_list_del(&x->conn_link);
        x->conn = c;
        x->epoch = c->wired ? c->epoch : UINT64_MAX;
        kvx_xfer_enqueue(c, x, now);
        any = true;
    }
    if (any && c->state == KVX_CONN_OPEN && c->wired) {
        kvx_conn_want_work(c);
        kvx_core_kick(c->core, 0);
    }
}

/* Every transfer of a failed connection fails at once: its replies are dropped from now on, and
 * what UCX still holds of its messages only reads its local blocks (before the endpoint's forced
 * close purges them). */
void kvx_xfer_fail_conn(kvx_conn_t *c, int err)
{
    kvx_list_t *lists[] = {&c->queue[KVX_PRIO_HIGH], &c->queue[KVX_PRIO_NORMAL],
                           &c->queue[KVX_PRIO_LOW], &c->waiting};
    _Static_assert(KVX_PRIO_LEVELS == 3, "every level's queue is failed");

    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++)
        while (!kvx_list_empty(lists[i]))
            kvx_xfer_end(kvx_list_first(lists[i], kvx_xfer_t, conn_link), err);
    memset(c->read_reqs, 0, sizeof(c->read_reqs));
    if (c->lingering) /* its endpoint stays open: what waited for UCX to let go is reported now */
        for (kvx_list_t *n = c->core->active.next, *next; n != &c->core->active; n = next) {
            kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);
            next = n->next;
            if (x->state == KVX_XS_ENDING && x->conn == c &&
                (x->op == KVX_OP_WRITE || x->sending == 0))
                kvx_xfer_done(x, x->end_status);
        }
}

/* ---- posting ----------------------------------------------------------------------------------
 */

/* Move a stream cursor (run, offset in it) piece bytes on; a finished run moves it to the next. */
void kvx_run_step(uint32_t *run, uint64_t *off, size_t piece, uint64_t run_len)
{
    *off += piece;
    if (*off == run_len) {
        (*run)++;
        *off = 0;
    }
}

/* The largest piece of a run one rendezvous message carries. */
#define KVX_RNDV_PIECE ((size_t)4 << 20)

/* One WRITE: as many of the stream's bytes as a message holds, from posted on. Returns the bytes
 * posted (0: none, out of message buffers), or a negative errno (the connection fails). */
static ssize_t kvx_xfer_post_write(kvx_conn_t *c, kvx_xfer_t *x)
{
    kvx_core_t *core = c->core;
    kvx_send_t *s = kvx_ucx_send_get(c->ucx);
    size_t avail = c->seg > 2 * KVX_MSG_SLACK ? c->seg - KVX_MSG_SLACK : KVX_MSG_SLACK;
    size_t len = 0, hdr_len = KVX_WIRE_WRITE_LEN;
    uint32_t n = 0;
    int rc;

    if (s == NULL)
        return 0;
    while (x->next_run < x->nruns && n < KVX_WIRE_MAX_RUNS &&
           hdr_len + KVX_WIRE_RUN_LEN + len < avail) {
        uint64_t run_len = (uint64_t)x->runs[x->next_run].count * core->block_len;
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
        r = (kvx_wire_run_t){kvx_xfer_remote(core, x, x->next_run, x->run_off), (uint32_t)piece, 0};

        s->iov[n].base = kvx_xfer_local(core, x, x->next_run, x->run_off);
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
                                             .nruns = n}}, /* the runs are in place */
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
    kvx_core_t *core = c->core;
    size_t len = 0;

    while (x->next_run < x->nruns && len < budget) {
        uint64_t run_len = (uint64_t)x->runs[x->next_run].count * core->block_len;
        uint64_t left = run_len - x->run_off;
        size_t piece = left < budget - len ? (size_t)left : budget - len;
        uint8_t *local = kvx_xfer_local(core, x, x->next_run, x->run_off);
        uint8_t *remote = c->mapped + kvx_xfer_remote(core, x, x->next_run, x->run_off);

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
    kvx_core_t *core = c->core;
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
    q->stream_off = x->posted;
    q->run = x->next_run;
    q->run_off = x->run_off;
    while (x->next_run < x->nruns && n < KVX_WIRE_MAX_RUNS && len < KVX_READ_REQ_MAX) {
        uint64_t run_len = (uint64_t)x->runs[x->next_run].count * core->block_len;
        uint64_t left = run_len - x->run_off, room = KVX_READ_REQ_MAX - len;
        uint64_t piece = left < room ? left : room;
        kvx_wire_run_t r = {kvx_xfer_remote(core, x, x->next_run, x->run_off), (uint32_t)piece, 0};

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
                                                          .prio = x->prio}},
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
static unsigned kvx_rreqs_used(const kvx_conn_t *c)
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
    unsigned rreqs = UINT_MAX; /* counted when a read is looked at: writes pay nothing */

    for (;;) { /* ends: each new round raises every level with transfers toward its quantum */
        bool any = false;

        for (int l = KVX_PRIO_LEVELS - 1; l >= 0; l--) {
            kvx_xfer_t *x;

            if (kvx_list_empty(&c->queue[l]))
                continue;
            x = kvx_list_first(&c->queue[l], kvx_xfer_t, conn_link);
            if (c->mapped == NULL && x->posted < x->bytes && !x->canceled) {
                if (x->op == KVX_OP_READ && rreqs == UINT_MAX)
                    rreqs = kvx_rreqs_used(c);
                if (x->op == KVX_OP_READ && rreqs >= KVX_MAX_REQS)
                    continue;
                if (l < KVX_PRIO_HIGH && c->unacked_lvl[l] >= KVX_LOW_WINDOW && kvx_windowed(c, l))
                    continue;
                if (l == KVX_PRIO_LOW && !any &&
                    (c->reqs >= KVX_LOW_REQS || (x->op == KVX_OP_READ && rreqs >= KVX_LOW_REQS)))
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
        } else if (c->mapped != NULL) { /* copied: it has landed (a notice may follow) */
            atomic_thread_fence(memory_order_release);
            if (x->op == KVX_OP_WRITE)
                kvx_xfer_write_landed(c, x);
            else
                kvx_xfer_end(x, 0);
        }
    }
}

/* All of a write's bytes were acknowledged: done, or first the receiver's notice. */
void kvx_xfer_write_landed(kvx_conn_t *c, kvx_xfer_t *x)
{
    uint8_t hdr[KVX_WIRE_NOTICE_LEN];
    int rc;

    if (!x->notify || x->canceled) { /* no notice for a canceled write */
        kvx_xfer_end(x, 0);
        return;
    }
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_NOTICE,
                                 .conn_id = c->rconn_id,
                                 .token = c->rconn_token,
                                 .u.notice = {.xfer_id = x->id,
                                              .tag = x->tag,
                                              .epoch = x->epoch,
                                              .blocks = x->bytes / c->core->block_len,
                                              .bytes = x->bytes}},
                    hdr);
    rc = kvx_ucx_send_ctl(c->ucx, hdr, sizeof(hdr), &c->ucx_refs);
    if (rc < 0) {
        kvx_xfer_end(x, rc);
        return;
    }
    if (rc == 1)
        c->reqs++;
    x->noticed = true;
    c->notices++;
}

/* ---- deadlines ------------------------------------------------------------------------------ */

/*
 * Fail transfers past their deadline (or, waiting for a connection, past the stall limit:
 * kvx_xfer_due), each alone: its connection stays and replies for it are dropped from now on (a
 * read's local blocks never change again; a notified write's NOTICE_ACK is dropped too, though
 * the receiver may have queued its notice). A write whose messages UCX still holds is reported
 * once they left (ENDING); one whose messages UCX has not let go of within kvx_end_grace fails
 * its connection, whose forced close makes UCX let go. Should that close not give them back
 * within another KVX_END_GRACE_NS, the write is reported all the same (logged): no transfer
 * waits for UCX forever. Runs only when the earliest known deadline has passed.
 */
void kvx_xfer_check_deadlines(kvx_core_t *core, uint64_t now)
{
    kvx_list_t *n, *next;
    uint64_t earliest = UINT64_MAX, due;
    kvx_conn_t *stuck;

    if (now < core->next_deadline_ns)
        return;
again:
    stuck = NULL;
    earliest = UINT64_MAX;
    for (n = core->active.next; n != &core->active; n = next) {
        kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);

        next = n->next;
        if (x->state == KVX_XS_ENDING) {
            if (x->conn == NULL || x->conn->state != KVX_CONN_OPEN) { /* its close lets go */
                due = x->deadline_ns + KVX_END_GRACE_NS;
                if (now >= due) {
                    kvx_warn(core,
                             "peer %s: UCX kept messages of failed transfer %llu after its "
                             "connection's close: reporting it anyway",
                             x->peer->id, (unsigned long long)x->id);
                    kvx_xfer_done(x, x->end_status);
                    continue;
                }
            } else if (now >= x->deadline_ns) {
                stuck = x->conn;
                break;
            } else {
                due = x->deadline_ns;
            }
            if (due < earliest)
                earliest = due;
            continue;
        }
        due = kvx_xfer_due(core, x);
        if (due == 0)
            continue;
        if (now < due) {
            if (due < earliest)
                earliest = due;
            continue;
        }
        kvx_debug(core, "transfer %llu to %s missed its %s", (unsigned long long)x->id,
                  x->conn ? x->conn->agent_name : x->peer->id,
                  due == x->deadline_ns ? "deadline" : "connection within the stall limit");
        kvx_xfer_end(x, -ETIMEDOUT);
        if (x->state == KVX_XS_ENDING && x->deadline_ns < earliest)
            earliest = x->deadline_ns;
    }
    if (stuck != NULL) {
        kvx_warn(core,
                 "connection to %s: UCX still holds messages of a failed write: failing the "
                 "connection",
                 stuck->agent_name);
        kvx_conn_fail(stuck, -ETIMEDOUT);
        goto again;
    }
    core->next_deadline_ns = earliest;
}
