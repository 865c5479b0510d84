/*
 * A receiving connection's life, below the messages it carries: the writers by name, a
 * connection's close, linger, doom and free, what its endpoint reports, the replies it queues,
 * and the bounds over all connections (what their reply queues hold in all, which connection
 * gives its slot to a new one, how fast HELLOs may make this transport open endpoints).
 * docs/security.md, "Resource bounds", gives the figures. It calls nothing of the receiving side
 * above it: what must be sent waits on rconns->work for the next step (recv/recv.c).
 */
#include "conn/kvx_rconn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writers ------------------------------------------------------------------------------- */

kvx_writer_t *kvx_writer_lookup(const kvx_rconns_t *rs, const char *name)
{
    return kvx_named_entry(kvx_names_find(&rs->writers, name), kvx_writer_t, by_name);
}

kvx_writer_t *kvx_writer_next(const kvx_rconns_t *rs, size_t *slot, const kvx_writer_t *w)
{
    return kvx_named_entry(kvx_names_next(&rs->writers, slot, w != NULL ? &w->by_name : NULL),
                           kvx_writer_t, by_name);
}

void kvx_writer_drop_fences(kvx_rconns_t *rs, kvx_writer_t *w)
{
    rs->nftags -= w->nftags;
    free(w->ftags);
    w->ftags = NULL;
    w->nftags = w->ftags_cap = 0;
}

void kvx_writer_free(kvx_rconns_t *rs, kvx_writer_t *w)
{
    kvx_writer_drop_fences(rs, w);
    free(w);
}

/* The writer of that name, made on its first connection. A full table gives up a writer with no
 * connection left, closing ones included (forgetting its fences is safe: messages of its closed
 * connections are refused by their tokens). NULL when none can be given up, or out of memory. */
kvx_writer_t *kvx_writer_get(kvx_rconns_t *rs, const char *name)
{
    kvx_writer_t *w = kvx_writer_lookup(rs, name);
    size_t slot = 0;

    if (w != NULL)
        return w;
    if (rs->writers.n >= KVX_WRITERS_MAX) {
        while ((w = kvx_writer_next(rs, &slot, w)) != NULL && w->live != 0)
            ;
        if (w == NULL)
            return NULL;
        kvx_names_del(&rs->writers, &w->by_name);
        kvx_writer_free(rs, w);
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    snprintf(w->name, sizeof(w->name), "%s", name);
    w->by_name.name = w->name;
    kvx_list_init(&w->rconns);
    if (kvx_names_add(&rs->writers, &w->by_name) < 0) {
        free(w);
        return NULL;
    }
    return w;
}

/* ---- connections from writers -------------------------------------------------------------- */

kvx_rconn_t *kvx_rconn_alloc(kvx_rconns_t *rs, kvx_writer_t *w, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = calloc(1, sizeof(*rc));

    if (rc == NULL)
        return NULL;
    rc->rconns = rs;
    rc->core = rs->core;
    rc->w = w;
    rc->peer_conn_id = m->u.hello.conn_id;
    rc->peer_token = m->u.hello.token;
    rc->rndv_min = UINT64_MAX; /* no read data by rendezvous until its HELLO is judged */
    kvx_list_init(&rc->serve);
    kvx_list_init(&rc->write_rndvs);
    kvx_list_init(&rc->ctl);
    kvx_list_init(&rc->work_link);
    kvx_list_init(&rc->w_link);
    kvx_list_init(&rc->all_link);
    kvx_list_init(&rc->slot_link);
    return rc;
}

void kvx_rconn_want_work(kvx_rconn_t *rc)
{
    if (!kvx_list_linked(&rc->work_link))
        kvx_list_add_tail(&rc->rconns->work, &rc->work_link);
}

/* What a connection has queued to send: it will not be sent any more. */
static void kvx_rconn_drop_queued(kvx_rconn_t *rc)
{
    while (!kvx_list_empty(&rc->serve)) {
        kvx_serve_t *s = kvx_list_first(&rc->serve, kvx_serve_t, link);
        kvx_list_del(&s->link);
        kvx_rq_sub(rc, sizeof(*s) + s->nruns * sizeof(s->runs[0]));
        kvx_region_put(s->region);
        free(s);
    }
    while (!kvx_list_empty(&rc->ctl)) {
        kvx_ctl_t *c = kvx_list_first(&rc->ctl, kvx_ctl_t, link);
        kvx_list_del(&c->link);
        kvx_rq_sub(rc, sizeof(*c));
        free(c);
    }
    kvx_rq_sub(rc, (size_t)rc->acks_cap * KVX_WIRE_ACK_ENTRY_LEN);
    free(rc->acks);
    rc->acks = NULL;
    rc->acks_cap = 0;
    rc->nserve = 0;
    rc->nctl = 0;
    rc->nacks = 0;
}

void kvx_rconn_maybe_free(kvx_rconn_t *rc)
{
    if (rc->state != KVX_CONN_CLOSED || rc->ucx_refs != 0)
        return;
    kvx_rconn_drop_queued(rc);
    kvx_list_del(&rc->work_link);
    kvx_list_del(&rc->all_link);
    kvx_ucx_ep_free(rc->ucx);
    rc->w->live--;
    free(rc);
}

/* Close a closing connection's endpoint (forced). */
void kvx_rconn_end_linger(kvx_rconn_t *rc)
{
    if (rc->lingering)
        rc->rconns->nlingering--;
    rc->lingering = false;
    if (kvx_ucx_ep_close(rc->ucx, &rc->ucx_refs) == 0) {
        rc->state = KVX_CONN_CLOSED;
        kvx_rconn_maybe_free(rc);
    }
}

/*
 * Stop accepting its messages (the id is freed: a message naming it is unknown from now on) and
 * close its endpoint. Over tcp, while UCX holds messages of it, the endpoint lingers, unused,
 * until UCX has taken them all or reports the endpoint failed (kvx_recv_work closes it then), or
 * the transport closes: UCX's tcp transport (1.13.1 and 1.19.1) keeps an endpoint force-closed
 * with bytes still queued as a receive-only one waiting to write them, and when its peer's close
 * comes in the same epoll round as the socket's writability, uct_tcp_iface_handle_events reads it
 * after its read handler freed it. A writer that floods and never drains its replies (closed for
 * its queue) crashed the receiver so as it went (README, "When things break"; kvx_conn_fail
 * does the same for the writing side).
 */
void kvx_rconn_close(kvx_rconn_t *rc)
{
    kvx_rconns_t *rs = rc->rconns;

    if (rc->state != KVX_CONN_OPEN)
        return;
    rc->state = KVX_CONN_CLOSING;
    kvx_idtab_release(&rs->ids, rc->id);
    rs->nopen--;
    rc->w->nopen--;
    kvx_list_del(&rc->w_link);
    kvx_list_del(&rc->slot_link);
    kvx_list_del(&rc->work_link);
    kvx_rconn_drop_queued(rc);
    kvx_info(rs->core, "writer %s: connection %u closed", rc->w->name, rc->id);
    /* a connection with rendezvous receives in flight closes at once: its close is what ends
     * them (UCX cannot cancel them otherwise), so that none outlives it */
    if (rc->tcp && rc->sending > 0 && rc->pending_err == 0 && !rs->core->closed &&
        rc->nwrite_rndvs == 0 && rs->nlingering < KVX_LINGER_MAX) {
        rc->lingering = true;
        rs->nlingering++;
        /* what UCX still holds of it no longer counts in the open connections' bound: nothing
         * of it can give way any more (kvx_rq_sub takes it off the connection alone) */
        rs->qbytes -= rc->qbytes <= rs->qbytes ? rc->qbytes : rs->qbytes;
        return;
    }
    if (rc->tcp && rc->sending > 0 && rc->pending_err == 0 && !rs->core->closed)
        kvx_warn(rs->core, "writer %s: connection %u closed at once: %u others linger already",
                 rc->w->name, rc->id, rs->nlingering);
    kvx_rconn_end_linger(rc);
}

/* Over a bound (overflow: counted so), or a rendezvous receive that ended badly: what it queued
 * goes now, and kvx_recv_work closes it (a caller may be walking a list it is on); its messages
 * are refused meanwhile. */
static void kvx_rconn_end(kvx_rconn_t *rc, const char *why, bool overflow)
{
    if (rc->doomed || rc->state != KVX_CONN_OPEN)
        return;
    rc->doomed = true;
    if (overflow)
        kvx_count(rc->core, rc->w, KVX_CNT(conns_overflow));
    kvx_warn(rc->core,
             "writer %s: connection %u closed: %s (%u acknowledgements, %u reads, %u "
             "control messages waiting, %u held by UCX)",
             rc->w->name, rc->id, why, rc->nacks, rc->nserve, rc->nctl, rc->sending);
    kvx_rconn_drop_queued(rc);
    kvx_rconn_want_work(rc);
}

void kvx_rconn_doom(kvx_rconn_t *rc, const char *why) { kvx_rconn_end(rc, why, true); }

void kvx_rconn_abort(kvx_rconn_t *rc, const char *why) { kvx_rconn_end(rc, why, false); }

/* The forced close completed (its callback). */
static void kvx_rconn_on_closed(kvx_rconn_t *rc)
{
    rc->ucx_refs--;
    rc->state = KVX_CONN_CLOSED;
    kvx_rconn_maybe_free(rc);
}

/* UCX calls this from inside a send on the connection too (tcp: a send to a writer that closed
 * fails the endpoint there and then, in ucp_am_send_nbx): the connection and its endpoint must
 * outlive that call, so kvx_recv_work closes it. */
static void kvx_rconn_on_error(kvx_rconn_t *rc, int status)
{
    if (rc->lingering) { /* UCX gave up on it: closing it is safe now */
        if (rc->pending_err == 0)
            rc->pending_err = status != 0 ? status : -ECONNRESET;
        kvx_rconn_want_work(rc);
        return;
    }
    if (rc->state != KVX_CONN_OPEN || rc->pending_err != 0)
        return;
    rc->pending_err = status != 0 ? status : -ECONNRESET;
    kvx_info(rc->core, "writer %s: connection %u failed: %s", rc->w ? rc->w->name : "?", rc->id,
             kvx_strerror(rc->pending_err));
    kvx_rconn_want_work(rc);
}

static void kvx_rconn_on_sent(kvx_rconn_t *rc, int status)
{
    (void)status; /* a reply lost with its connection: the writer sees that connection fail */
    rc->ucx_refs--;
    rc->sending--;
    kvx_rq_sub(rc, sizeof(kvx_send_t));
    if (rc->lingering && rc->sending == 0) /* UCX took them all: kvx_recv_work closes it */
        kvx_rconn_want_work(rc);
    if (rc->state == KVX_CONN_OPEN &&
        (rc->nacks > 0 || !kvx_list_empty(&rc->serve) || !kvx_list_empty(&rc->ctl)))
        kvx_rconn_want_work(rc);
    kvx_rconn_maybe_free(rc);
}

static void kvx_rconn_ep_received(void *arg, void *cookie, int status)
{
    kvx_rconn_t *rc = arg;
    kvx_write_rndv_t *wr = cookie;

    rc->ucx_refs--;
    kvx_list_del(&wr->link);
    rc->nwrite_rndvs--;
    rc->write_rndv_done_ns = kvx_now_ns();
    kvx_rq_sub(rc, KVX_WRITE_RNDV_COST);
    kvx_region_put(wr->region); /* UCX writes no more of it */
    wr->done(rc, wr, status);
    kvx_rconn_maybe_free(rc);
}

int kvx_rconn_recv(kvx_rconn_t *rc, kvx_write_rndv_t *wr, void *desc)
{
    int r;

    if (rc->nwrite_rndvs >= KVX_WRITE_RNDVS_PER_CONN) {
        kvx_rconn_doom(rc, "too many rendezvous receives at once");
        return -EBUSY;
    }
    wr->since_ns = kvx_now_ns();
    kvx_list_add_tail(&rc->write_rndvs, &wr->link);
    rc->nwrite_rndvs++;
    kvx_rq_add(rc, KVX_WRITE_RNDV_COST); /* in the bound over all connections' queues */
    kvx_region_get(wr->region);          /* first: the receive's end may come before it returns */
    r = kvx_ucx_recv(rc->ucx, desc, wr->region->base + wr->off, wr->len, wr, &rc->ucx_refs);
    if (r != 1) { /* landed at once, or not at all: the caller finishes */
        kvx_list_del(&wr->link);
        rc->nwrite_rndvs--;
        kvx_rq_sub(rc, KVX_WRITE_RNDV_COST);
        kvx_region_put(wr->region);
    }
    return r;
}

/* A READ_DATA names the region it read as its xfer_id (the receiving side's messages have no
 * transfer of their own): UCX reads no more of it. */
static void kvx_rconn_ep_sent(void *arg, uint64_t region, int status)
{
    kvx_rconn_t *rc = arg;
    kvx_region_t *g = region != 0 ? kvx_region_find(rc->core, (uint32_t)region) : NULL;

    if (g != NULL) {
        kvx_region_put(g);
        rc->data_sending--;
    }
    kvx_rconn_on_sent(rc, status);
}
static void kvx_rconn_ep_error(void *rc, int status) { kvx_rconn_on_error(rc, status); }
static void kvx_rconn_ep_closed(void *rc) { kvx_rconn_on_closed(rc); }

/* What a receiving connection's endpoint reports (kvx_ucx_ep_open). */
const kvx_ep_ops_t kvx_rconn_ep_ops = {
    .on_sent = kvx_rconn_ep_sent,
    .on_error = kvx_rconn_ep_error,
    .on_closed = kvx_rconn_ep_closed,
    .on_received = kvx_rconn_ep_received,
};

/*
 * Periodic: a connection whose rendezvous receives stalled (none ended for longer than the stall
 * limit while the oldest was in flight: its sender stopped, or never sends the payload it
 * announced) closes, which ends its receives (their bytes may be partly in place: the writer's
 * transfers on it fail).
 */
void kvx_rconns_housekeeping(kvx_rconns_t *rs, uint64_t now)
{
    if (rs->core->stall_ns == 0)
        return;
    for (kvx_list_t *n = rs->all.next; n != &rs->all; n = n->next) {
        kvx_rconn_t *rc = kvx_container_of(n, kvx_rconn_t, all_link);
        kvx_write_rndv_t *wr;

        if (rc->state != KVX_CONN_OPEN || rc->doomed || rc->nwrite_rndvs == 0)
            continue;
        wr = kvx_list_first(&rc->write_rndvs, kvx_write_rndv_t, link);
        if (kvx_stalled(wr->since_ns, rc->write_rndv_done_ns, now, rs->core->stall_ns))
            kvx_rconn_abort(rc, "a rendezvous receive made no progress within the stall limit");
    }
}

/* The connection a message names, if its token matches; NULL (counted) otherwise. */
kvx_rconn_t *kvx_rconn_of(kvx_rconns_t *rs, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = kvx_idtab_get(&rs->ids, m->conn_id);
    uint8_t a[8], b[8];

    if (rc != NULL) {
        kvx_put64(a, rc->token);
        kvx_put64(b, m->token);
    }
    if (rc == NULL || rc->state != KVX_CONN_OPEN || rc->doomed || rc->pending_err != 0 ||
        !kvx_equal_ct(a, b, 8)) {
        kvx_debug(rs->core, "message for unknown connection %u dropped", m->conn_id);
        kvx_count(rs->core, NULL, KVX_CNT(drop_unknown));
        return NULL;
    }
    if (!rc->proven && m->type != KVX_MSG_PROOF && m->type != KVX_MSG_BYE) {
        /* a kvx writer sends its PROOF first: this is not one */
        kvx_count(rs->core, rc->w, KVX_CNT(drop_unproven));
        kvx_info(rs->core, "writer %s: connection %u sent before proving the secret: closed",
                 rc->w->name, rc->id);
        kvx_rconn_close(rc);
        return NULL;
    }
    return rc;
}

int kvx_rconn_ctl(kvx_rconn_t *rc, const uint8_t *hdr, size_t len)
{
    kvx_ctl_t *c;

    if (rc->doomed)
        return -ENOBUFS;
    if (rc->nctl >= KVX_CTL_MAX || (c = malloc(sizeof(*c))) == NULL) {
        kvx_rconn_doom(rc, "its control messages cannot leave");
        return -ENOBUFS;
    }
    memcpy(c->hdr, hdr, len);
    c->len = len;
    kvx_list_add_tail(&rc->ctl, &c->link);
    rc->nctl++;
    kvx_rconn_want_work(rc);
    kvx_rq_add(rc, sizeof(*c));
    return 0;
}

/* ---- the bounds over all connections ------------------------------------------------------- */

#define KVX_RQ_MAX ((size_t)32 << 20)
/* A new connection that has not completed a transfer yet is spared eviction this long while an
 * older one can give way. */
#define KVX_SLOT_GRACE_NS (1000ull * 1000000ull)
/* Endpoints a HELLO makes this transport open (to the address it names): per writer's name and
 * per transport, this many per second, in bursts of as many. */
#define KVX_EP_RATE_WRITER 256
#define KVX_EP_RATE_TRANSPORT 4096

void kvx_rq_sub(kvx_rconn_t *rc, size_t n)
{
    if (rc->lingering) { /* out of the transport's sum already (kvx_rconn_close) */
        rc->qbytes -= n <= rc->qbytes ? n : rc->qbytes;
        return;
    }
    /* never more than was added: a wrapped sum would close every connection as the largest */
    if (n > rc->qbytes || n > rc->rconns->qbytes) {
        kvx_error(rc->core,
                  "reply queue accounting: %zu taken, %zu held by connection %u, %zu in all", n,
                  rc->qbytes, rc->id, rc->rconns->qbytes);
        n = rc->qbytes < rc->rconns->qbytes ? rc->qbytes : rc->rconns->qbytes;
    }
    rc->qbytes -= n;
    rc->rconns->qbytes -= n;
}
/* More queued for rc; past the transport's bound, the connection holding the most gives way. */
void kvx_rq_add(kvx_rconn_t *rc, size_t n)
{
    kvx_rconns_t *rs = rc->rconns;
    kvx_rconn_t *big = NULL;

    rc->qbytes += n;
    rs->qbytes += n;
    if (rs->qbytes <= KVX_RQ_MAX)
        return;
    for (kvx_list_t *l = rs->all.next; l != &rs->all; l = l->next) {
        kvx_rconn_t *x = kvx_container_of(l, kvx_rconn_t, all_link);
        if (x->state == KVX_CONN_OPEN && !x->doomed && (big == NULL || x->qbytes > big->qbytes))
            big = x;
    }
    if (big != NULL)
        kvx_rconn_doom(big, "the transport's reply queues are full");
}

/* A rate bound as the time its budget is spent up to (a leaky bucket of per_s a second, in
 * bursts of per_s): may one more go now? */
static bool kvx_rate_ok(const uint64_t *tat, uint64_t now, uint64_t per_s)
{
    uint64_t iv = 1000000000ull / per_s, t0 = *tat > now ? *tat : now;
    return t0 - now <= (per_s - 1) * iv;
}
static void kvx_rate_take(uint64_t *tat, uint64_t now, uint64_t per_s)
{
    *tat = (*tat > now ? *tat : now) + 1000000000ull / per_s;
}

bool kvx_hello_rate(kvx_rconns_t *rs, kvx_writer_t *w, uint64_t now)
{
    if (!kvx_rate_ok(&w->hello_credit_ns, now, KVX_EP_RATE_WRITER) ||
        !kvx_rate_ok(&rs->hello_credit_ns, now, KVX_EP_RATE_TRANSPORT))
        return false;
    kvx_rate_take(&w->hello_credit_ns, now, KVX_EP_RATE_WRITER);
    kvx_rate_take(&rs->hello_credit_ns, now, KVX_EP_RATE_TRANSPORT);
    return true;
}

/* ---- connection slots ----------------------------------------------------------------------- */

void kvx_slot_set(kvx_rconn_t *rc, int cls, uint64_t now)
{
    kvx_list_del(&rc->slot_link);
    rc->slot_class = (uint8_t)cls;
    rc->since_ns = now;
    kvx_list_add_tail(&rc->rconns->slots[cls], &rc->slot_link);
}

/* It completed (a part of) a transfer: it goes last in the order of eviction. */
void kvx_rconn_active(kvx_rconn_t *rc)
{
    if (rc->slot_class != KVX_SLOT_ACTIVE ||
        rc->rconns->slots[KVX_SLOT_ACTIVE].prev != &rc->slot_link)
        kvx_slot_set(rc, KVX_SLOT_ACTIVE, kvx_now_ns());
}

/* Eviction order: unproven first, then fresh ones past their grace, then the least recently
 * active, then fresh ones in their grace; oldest first within each. */
static int kvx_slot_key(const kvx_rconn_t *rc, uint64_t now)
{
    if (rc->slot_class == KVX_SLOT_FRESH)
        return now - rc->since_ns < KVX_SLOT_GRACE_NS ? 3 : 1;
    return rc->slot_class == KVX_SLOT_ACTIVE ? 2 : 0;
}

static bool kvx_slot_before(const kvx_rconn_t *a, const kvx_rconn_t *b, uint64_t now)
{
    int ka = kvx_slot_key(a, now), kb = kvx_slot_key(b, now);
    return ka != kb ? ka < kb : a->since_ns < b->since_ns;
}

/* The connection that gives way to a new one: of writer w (over its share), or of any. */
kvx_rconn_t *kvx_slot_victim(kvx_rconns_t *rs, kvx_writer_t *w, uint64_t now)
{
    kvx_rconn_t *v = NULL;

    if (w != NULL) {
        for (kvx_list_t *n = w->rconns.next; n != &w->rconns; n = n->next) {
            kvx_rconn_t *x = kvx_container_of(n, kvx_rconn_t, w_link);
            if (v == NULL || kvx_slot_before(x, v, now))
                v = x;
        }
        return v;
    }
    for (int i = 0; i < 3; i++)
        if (!kvx_list_empty(&rs->slots[i])) {
            kvx_rconn_t *x = kvx_list_first(&rs->slots[i], kvx_rconn_t, slot_link);
            if (v == NULL || kvx_slot_before(x, v, now))
                v = x;
        }
    return v;
}

/* ---- every connection --------------------------------------------------------------------- */

void kvx_rconns_init(kvx_rconns_t *rs, kvx_core_t *core)
{
    rs->core = core;
    kvx_list_init(&rs->all);
    kvx_list_init(&rs->work);
    for (int i = 0; i < 3; i++)
        kvx_list_init(&rs->slots[i]);
}

/* Work only polling advances: replies to send, or UCX holding ours until a FIFO has room. */
bool kvx_rconns_need_polling(const kvx_rconns_t *rs)
{
    if (!kvx_list_empty(&rs->work))
        return true;
    for (const kvx_list_t *n = rs->all.next; n != &rs->all; n = n->next)
        if (kvx_container_of(n, kvx_rconn_t, all_link)->sending > 0)
            return true;
    return false;
}

/* Close every receiving connection (the transport closes; UCX still runs). */
void kvx_rconns_close_all(kvx_rconns_t *rs)
{
    for (kvx_list_t *n = rs->all.next, *next; n != &rs->all; n = next) {
        kvx_rconn_t *rc = kvx_container_of(n, kvx_rconn_t, all_link);
        next = n->next;
        if (rc->lingering) {
            kvx_list_del(&rc->work_link);
            kvx_rconn_end_linger(rc); /* the worker goes */
        } else {
            kvx_rconn_close(rc);
        }
    }
}

bool kvx_rconns_closing(const kvx_rconns_t *rs)
{
    for (const kvx_list_t *n = rs->all.next; n != &rs->all; n = n->next) {
        const kvx_rconn_t *rc = kvx_container_of(n, kvx_rconn_t, all_link);
        if (rc->state == KVX_CONN_CLOSING || rc->ucx_refs > 0)
            return true;
    }
    return false;
}

/* Free every connection and writer (the worker is gone: no callback will come). */
void kvx_rconns_free_all(kvx_rconns_t *rs)
{
    while (!kvx_list_empty(&rs->all)) {
        kvx_rconn_t *rc = kvx_list_first(&rs->all, kvx_rconn_t, all_link);
        rc->ucx_refs = 0;
        rc->state = KVX_CONN_CLOSED;
        kvx_rconn_maybe_free(rc);
    }
    size_t slot = 0;
    kvx_writer_t *next;
    for (kvx_writer_t *w = kvx_writer_next(rs, &slot, NULL); w != NULL; w = next) {
        next = kvx_writer_next(rs, &slot, w);
        kvx_writer_free(rs, w);
    }
    kvx_names_fini(&rs->writers);
    free(rs->ids.slots);
    memset(&rs->ids, 0, sizeof(rs->ids));
}
