/*
 * Where a peer's bytes land: the receiving side of kvx's protocol. A writer's connection is made
 * when its HELLO presents this transport's capability (and proves the shared secret, when one is
 * set); every later message must carry that connection's id and token. A write is checked
 * against the region and the writer's fences, then copied in and acknowledged; a read is served
 * from the region; an arrival notice is queued for kvx_notice_poll. Nothing a peer sends is used
 * before it is checked. Messages arrive inside UCX progress (kvx_recv_on_message); what must be
 * sent in return waits for kvx_recv_work, after it.
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/*
 * Resource bounds (docs/security.md, "Resource bounds"). UCX's active messages cannot be paused
 * per connection, so a connection whose replies cannot leave (its writer does not drain) is
 * closed once one of its queues is full (conns_overflow), and its writer's transfers on it fail.
 * Per connection: KVX_SEND_WINDOW + KVX_ACK_WINDOW messages in UCX's hands, KVX_ACKS_MAX
 * acknowledgements, KVX_SERVE_MAX read requests, KVX_CTL_MAX control messages. All connections
 * together: KVX_RQ_MAX bytes of that (past it, the connection holding the most is closed:
 * rslots.c, with the slots and the rates of new connections).
 */
#define KVX_RCONNS_MAX 4096                  /* connections from writers, at most */
#define KVX_RCONNS_PER_WRITER 1024           /* ... of one writer's name: a quarter */
#define KVX_WRITERS_MAX (2 * KVX_RCONNS_MAX) /* names: room for new ones while slots turn over */
#define KVX_HELLOS_MAX 64                    /* handshakes waiting for kvx_recv_work */
#define KVX_HELLOS_PER_NAME 16 /* ... of one writer's name (those its rate holds back wait) */
#define KVX_SERVE_MAX 64       /* read requests queued per connection (an initiator sends 16) */
#define KVX_CTL_MAX 256        /* control messages queued per connection */
#define KVX_SEND_WINDOW 16     /* messages of one connection UCX may hold */
#define KVX_ACK_WINDOW 8       /* ... and this many more, of acknowledgements only */
/* tcp connections closed while UCX holds replies of theirs whose endpoints wait (kvx_rconn_close),
 * at most: each holds at most KVX_SEND_WINDOW + KVX_ACK_WINDOW messages */
#define KVX_LINGER_MAX 256
/* With a secret, a connection must prove it within this (else it is closed, drop_unproven). */
#define KVX_PROOF_WAIT_NS (2000ull * 1000000ull)

typedef struct kvx_hello {
    kvx_list_t link;
    bool retired; /* it presents a retired capability: it is refused */
    char name[KVX_NAME_MAX + 1];
    size_t len;
    uint8_t buf[];
} kvx_hello_t;

/* A small message waiting to be sent (HELLO_ACK, FENCE, NOTICE_ACK, a refused read). */
typedef struct kvx_ctl {
    kvx_list_t link;
    size_t len;
    uint8_t hdr[KVX_WIRE_HELLO_ACK_LEN]; /* the largest of them */
} kvx_ctl_t;

/* A read request being answered: its runs, and how far the answer got. */
typedef struct kvx_serve {
    kvx_list_t link;
    uint64_t xfer_id, stream_off;
    bool crc;
    uint32_t nruns, run; /* the next byte to send: runs[run], at run_off */
    uint64_t run_off;
    kvx_wire_run_t runs[];
} kvx_serve_t;

static void kvx_count(kvx_transport_t *t, kvx_writer_t *w, size_t field)
{
    ((uint64_t *)&t->rcounters)[field]++;
    if (w != NULL)
        ((uint64_t *)&w->counters)[field]++;
}
#define KVX_CNT(f) (offsetof(kvx_recv_counters_t, f) / sizeof(uint64_t))

/* ---- writers ------------------------------------------------------------------------------- */

static size_t kvx_whash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) {
        h ^= (unsigned char)*s++;
        h *= 1099511628211ull;
    }
    return (size_t)h;
}

kvx_writer_t *kvx_writer_lookup(const kvx_transport_t *t, const char *name)
{
    if (t->wtab_cap == 0)
        return NULL;
    for (kvx_writer_t *w = t->wtab[kvx_whash(name) & (t->wtab_cap - 1)]; w != NULL; w = w->hnext)
        if (strcmp(w->name, name) == 0)
            return w;
    return NULL;
}

static void kvx_writer_unlink(kvx_transport_t *t, kvx_writer_t *w)
{
    kvx_writer_t **pp = &t->wtab[kvx_whash(w->name) & (t->wtab_cap - 1)];
    while (*pp != w)
        pp = &(*pp)->hnext;
    *pp = w->hnext;
    t->nwriters--;
}

static void kvx_writer_drop_fences(kvx_transport_t *t, kvx_writer_t *w)
{
    t->nftags -= w->nftags;
    free(w->ftags);
    w->ftags = NULL;
    w->nftags = w->ftags_cap = 0;
}

static void kvx_writer_free(kvx_transport_t *t, kvx_writer_t *w)
{
    kvx_writer_drop_fences(t, w);
    free(w);
}

/* The writer of that name, made on its first connection. A full table gives up a writer with no
 * connection left, closing ones included (forgetting its fences is safe: messages of its closed
 * connections are refused by their tokens). NULL when none can be given up, or out of memory. */
static kvx_writer_t *kvx_writer_get(kvx_transport_t *t, const char *name)
{
    kvx_writer_t *w = kvx_writer_lookup(t, name);
    size_t b;

    if (w != NULL)
        return w;
    if (t->nwriters >= KVX_WRITERS_MAX) {
        for (size_t i = 0; i < t->wtab_cap && w == NULL; i++)
            for (kvx_writer_t *x = t->wtab[i]; x != NULL && w == NULL; x = x->hnext)
                if (x->live == 0)
                    w = x;
        if (w == NULL)
            return NULL;
        kvx_writer_unlink(t, w);
        kvx_writer_free(t, w);
    }
    if (t->nwriters + 1 > t->wtab_cap / 2) {
        size_t cap = t->wtab_cap ? t->wtab_cap * 2 : 16;
        kvx_writer_t **tab = calloc(cap, sizeof(*tab));
        if (tab == NULL)
            return NULL;
        for (size_t i = 0; i < t->wtab_cap; i++) {
            kvx_writer_t *x, *next;
            for (x = t->wtab[i]; x != NULL; x = next) {
                next = x->hnext;
                x->hnext = tab[kvx_whash(x->name) & (cap - 1)];
                tab[kvx_whash(x->name) & (cap - 1)] = x;
            }
        }
        free(t->wtab);
        t->wtab = tab;
        t->wtab_cap = cap;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    snprintf(w->name, sizeof(w->name), "%s", name);
    kvx_list_init(&w->rconns);
    b = kvx_whash(name) & (t->wtab_cap - 1);
    w->hnext = t->wtab[b];
    t->wtab[b] = w;
    t->nwriters++;
    return w;
}

/* Where tag's record is among the writer's tag fences, or would be. */
static uint32_t kvx_ftag_find(const kvx_writer_t *w, uint64_t tag)
{
    uint32_t lo = 0, hi = w->nftags;

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (w->ftags[mid].tag < tag)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Did a fence after the writer's epoch e cover tag? */
static bool kvx_writer_fenced(const kvx_writer_t *w, uint64_t e, uint64_t tag)
{
    uint32_t i;

    if (w->fence_all > e)
        return true;
    i = kvx_ftag_find(w, tag);
    return i < w->nftags && w->ftags[i].tag == tag && w->ftags[i].at_epoch > e;
}

/* ---- connections from writers -------------------------------------------------------------- */

static void kvx_rconn_want_work(kvx_rconn_t *rc)
{
    if (!kvx_list_linked(&rc->work_link))
        kvx_list_add_tail(&rc->t->rwork, &rc->work_link);
}

/* What a connection has queued to send: it will not be sent any more. */
static void kvx_rconn_drop_queued(kvx_rconn_t *rc)
{
    while (!kvx_list_empty(&rc->serve)) {
        kvx_serve_t *s = kvx_list_first(&rc->serve, kvx_serve_t, link);
        kvx_list_del(&s->link);
        kvx_rq_sub(rc, sizeof(*s) + s->nruns * sizeof(s->runs[0]));
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

static void kvx_rconn_maybe_free(kvx_rconn_t *rc)
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
static void kvx_rconn_end_linger(kvx_rconn_t *rc)
{
    if (rc->lingering)
        rc->t->nlingering--;
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
static void kvx_rconn_close(kvx_rconn_t *rc)
{
    kvx_transport_t *t = rc->t;

    if (rc->state != KVX_CONN_OPEN)
        return;
    rc->state = KVX_CONN_CLOSING;
    kvx_idtab_release(&t->rconn_ids, rc->id);
    t->nrconns--;
    rc->w->nopen--;
    kvx_list_del(&rc->w_link);
    kvx_list_del(&rc->slot_link);
    kvx_list_del(&rc->work_link);
    kvx_rconn_drop_queued(rc);
    kvx_info(t, "writer %s: connection %u closed", rc->w->name, rc->id);
    if (rc->tcp && rc->sending > 0 && rc->pending_err == 0 && !t->closed &&
        t->nlingering < KVX_LINGER_MAX) {
        rc->lingering = true;
        t->nlingering++;
        /* what UCX still holds of it no longer counts in the open connections' bound: nothing
         * of it can give way any more (kvx_rq_sub takes it off the connection alone) */
        t->rqbytes -= rc->qbytes <= t->rqbytes ? rc->qbytes : t->rqbytes;
        return;
    }
    if (rc->tcp && rc->sending > 0 && rc->pending_err == 0 && !t->closed)
        kvx_warn(t, "writer %s: connection %u closed at once: %u others linger already",
                 rc->w->name, rc->id, t->nlingering);
    kvx_rconn_end_linger(rc);
}

/* Over a bound: what it queued goes now, and kvx_recv_work closes it (a caller may be walking a
 * list it is on); its messages are refused meanwhile. */
void kvx_rconn_doom(kvx_rconn_t *rc, const char *why)
{
    if (rc->doomed || rc->state != KVX_CONN_OPEN)
        return;
    rc->doomed = true;
    kvx_count(rc->t, rc->w, KVX_CNT(conns_overflow));
    kvx_warn(rc->t,
             "writer %s: connection %u closed: %s (%u acknowledgements, %u reads, %u "
             "control messages waiting, %u held by UCX)",
             rc->w->name, rc->id, why, rc->nacks, rc->nserve, rc->nctl, rc->sending);
    kvx_rconn_drop_queued(rc);
    kvx_rconn_want_work(rc);
}

/* The forced close completed (its callback). */
void kvx_recv_on_closed(kvx_rconn_t *rc)
{
    rc->ucx_refs--;
    rc->state = KVX_CONN_CLOSED;
    kvx_rconn_maybe_free(rc);
}

/* UCX calls this from inside a send on the connection too (tcp: a send to a writer that closed
 * fails the endpoint there and then, in ucp_am_send_nbx): the connection and its endpoint must
 * outlive that call, so kvx_recv_work closes it. */
void kvx_recv_on_error(kvx_rconn_t *rc, int status)
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
    kvx_info(rc->t, "writer %s: connection %u failed: %s", rc->w ? rc->w->name : "?", rc->id,
             kvx_strerror(rc->pending_err));
    kvx_rconn_want_work(rc);
}

void kvx_recv_on_sent(kvx_rconn_t *rc, int status)
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

static void kvx_rconn_ep_sent(void *rc, uint64_t xfer_id, int status)
{
    (void)xfer_id;
    kvx_recv_on_sent(rc, status);
}
static void kvx_rconn_ep_error(void *rc, int status) { kvx_recv_on_error(rc, status); }
static void kvx_rconn_ep_closed(void *rc) { kvx_recv_on_closed(rc); }

/* What a receiving connection's endpoint reports (kvx_ucx_ep_open). */
static const kvx_ep_ops_t kvx_rconn_ep_ops = {
    .on_sent = kvx_rconn_ep_sent,
    .on_error = kvx_rconn_ep_error,
    .on_closed = kvx_rconn_ep_closed,
};

/* The connection a message names, if its token matches; NULL (counted) otherwise. */
static kvx_rconn_t *kvx_rconn_of(kvx_transport_t *t, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = kvx_idtab_get(&t->rconn_ids, m->conn_id);
    uint8_t a[8], b[8];

    if (rc != NULL) {
        kvx_put64(a, rc->token);
        kvx_put64(b, m->token);
    }
    if (rc == NULL || rc->state != KVX_CONN_OPEN || rc->doomed || rc->pending_err != 0 ||
        !kvx_equal_ct(a, b, 8)) {
        kvx_debug(t, "message for unknown connection %u dropped", m->conn_id);
        kvx_count(t, NULL, KVX_CNT(drop_unknown));
        return NULL;
    }
    if (!rc->proven && m->type != KVX_MSG_PROOF && m->type != KVX_MSG_BYE) {
        /* a kvx writer sends its PROOF first: this is not one */
        kvx_count(t, rc->w, KVX_CNT(drop_unproven));
        kvx_info(t, "writer %s: connection %u sent before proving the secret: closed", rc->w->name,
                 rc->id);
        kvx_rconn_close(rc);
        return NULL;
    }
    return rc;
}

static int kvx_rconn_ctl(kvx_rconn_t *rc, const uint8_t *hdr, size_t len)
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

/* ---- retired capabilities ------------------------------------------------------------------ */

#define KVX_REFUSING_MAX 16 /* connections open at once only to refuse a HELLO */

static bool kvx_capability_retired(const kvx_transport_t *t, const uint8_t *cap)
{
    bool hit = false;

    for (unsigned i = 0; i < t->nretired; i++) /* every one compared: constant time */
        hit |= kvx_equal_ct(cap, t->retired[i], sizeof(t->retired[i]));
    return hit;
}

/*
 * A HELLO with a retired capability (its proof of the secret checked, when one is set): the
 * writer is told at once, by a HELLO_ACK of status -EKEYREVOKED on a connection made only for
 * that; its connection then fails and it must add the peer again with the new metadata. Only a
 * holder of old metadata gets this far, and such connections are bounded (KVX_REFUSING_MAX);
 * beyond that the HELLO is dropped, and the writer's connection fails by its stall limit. The
 * connection closes when the writer's end goes (its error), when it gives way to a newer one,
 * or with the transport; it is never fenced, counts no writer's connection, and its id is
 * refused to every other message.
 */
static void kvx_recv_refuse_hello(kvx_transport_t *t, const uint8_t *buf, size_t len)
{
    kvx_msg_t m;
    kvx_writer_t *w;
    kvx_rconn_t *rc;
    uint8_t ack[KVX_WIRE_HELLO_ACK_LEN] = {0};
    unsigned n = 0;

    if (kvx_wire_decode(buf, len, 0, &m) < 0 || m.type != KVX_MSG_HELLO)
        return;
    w = kvx_writer_lookup(t, m.u.hello.name);
    kvx_count(t, w, KVX_CNT(drop_capability));
    kvx_info(t, "writer %s: handshake with a retired capability refused", m.u.hello.name);
    for (kvx_list_t *l = t->refusing.next; l != &t->refusing; l = l->next)
        n++;
    if (n >= KVX_REFUSING_MAX) { /* the oldest that sent its answer gives way */
        for (kvx_list_t *l = t->refusing.next; l != &t->refusing; l = l->next) {
            kvx_rconn_t *old = kvx_container_of(l, kvx_rconn_t, w_link);
            if (old->sending == 0) {
                kvx_rconn_close(old);
                n--;
                break;
            }
        }
    }
    if (n >= KVX_REFUSING_MAX || t->nrconns >= KVX_RCONNS_MAX ||
        (w = kvx_writer_get(t, m.u.hello.name)) == NULL)
        return;
    /* the rates of new connections bound these endpoints too */
    if (!kvx_hello_rate(t, w, kvx_now_ns())) {
        kvx_count(t, w, KVX_CNT(drop_hello_limit));
        return;
    }
    if ((rc = calloc(1, sizeof(*rc))) == NULL)
        return;
    rc->t = t;
    rc->w = w;
    rc->refusing = true;
    rc->proven = true; /* it takes no message: nothing to prove */
    rc->peer_conn_id = m.u.hello.conn_id;
    rc->peer_token = m.u.hello.token;
    kvx_list_init(&rc->serve);
    kvx_list_init(&rc->ctl);
    kvx_list_init(&rc->work_link);
    kvx_list_init(&rc->all_link);
    kvx_list_init(&rc->slot_link); /* on no slot list: KVX_REFUSING_MAX bounds these */
    /* a random token no message can name: the connection takes none */
    if (getrandom(&rc->token, sizeof(rc->token), 0) != sizeof(rc->token) ||
        kvx_idtab_alloc(&t->rconn_ids, rc, &rc->id) < 0) {
        free(rc);
        return;
    }
    if (kvx_ucx_align(t, m.u.hello.waddr, m.u.hello.ep_sn) < 0 ||
        kvx_ucx_ep_open(t, m.u.hello.waddr, m.u.hello.name, &kvx_rconn_ep_ops, rc, &rc->ucx) < 0) {
        kvx_idtab_release(&t->rconn_ids, rc->id);
        free(rc);
        return;
    }
    rc->state = KVX_CONN_OPEN;
    w->live++;
    w->nopen++; /* as any connection's: kvx_rconn_close takes it back */
    kvx_list_add_tail(&t->refusing, &rc->w_link);
    kvx_list_add_tail(&t->rconns, &rc->all_link);
    t->nrconns++;
    kvx_wire_put_hdr(ack, KVX_MSG_HELLO_ACK, 0, rc->peer_conn_id, rc->peer_token);
    kvx_put32(ack + 20, (uint32_t)-EKEYREVOKED);
    if (kvx_ucx_send_ctl(rc->ucx, ack, sizeof(ack), &rc->ucx_refs) == 1) {
        rc->sending++;
        kvx_rq_add(rc, sizeof(kvx_send_t)); /* kvx_recv_on_sent takes it back */
    }
}

/* ---- recorded HELLOs ------------------------------------------------------------------------
 * With a secret, a HELLO's proof covers its own bytes only: a recorded one replays. Each carries
 * the writer's fresh connection id and token, so an honest writer never sends the same proof
 * twice; one seen in the last KVX_SEEN_NS is a replay, dropped before it takes a place among the
 * HELLOs waiting or any rate (which a replay under the writer's own name would otherwise fill,
 * keeping that writer out for as long as it lasts). An open-addressing table of proofs, each
 * slot reused once it is older than the window; a chain longer than KVX_SEEN_PROBE reuses its
 * oldest (a replay may then pass once more, and meets the PROOF over a fresh nonce). */
#define KVX_SEEN_SLOTS 8192
#define KVX_SEEN_PROBE 16
#define KVX_SEEN_NS (10000ull * 1000000ull)

struct kvx_seen_proof {
    uint8_t proof[KVX_PROOF_LEN];
    uint64_t at_ns; /* 0: never used */
};

/* true when proof was seen within the window (a replay); else it is remembered */
static bool kvx_recv_replayed(kvx_transport_t *t, const uint8_t *proof)
{
    uint64_t now = kvx_now_ns();
    size_t h = (size_t)kvx_get64(proof) & (KVX_SEEN_SLOTS - 1), pick = h;
    struct kvx_seen_proof *s;

    if (t->seen == NULL && (t->seen = calloc(KVX_SEEN_SLOTS, sizeof(*t->seen))) == NULL)
        return false; /* no memory: the PROOF over the nonce still holds */
    for (size_t i = 0; i < KVX_SEEN_PROBE; i++) {
        s = &t->seen[(h + i) & (KVX_SEEN_SLOTS - 1)];
        if (s->at_ns == 0) {
            pick = (h + i) & (KVX_SEEN_SLOTS - 1);
            break;
        }
        if (now - s->at_ns < KVX_SEEN_NS && kvx_equal_ct(s->proof, proof, KVX_PROOF_LEN))
            return true;
        if (s->at_ns < t->seen[pick].at_ns) /* the oldest goes, an expired one first */
            pick = (h + i) & (KVX_SEEN_SLOTS - 1);
    }
    s = &t->seen[pick];
    memcpy(s->proof, proof, KVX_PROOF_LEN);
    s->at_ns = now;
    return false;
}

/* ---- messages in (inside UCX progress) ---------------------------------------------------- */

/* A HELLO: the capability must match (and the proof of the secret, with one) before kvx keeps
 * anything of it; the connection itself is made after progress (kvx_recv_hello). */
static void kvx_recv_hello_in(kvx_transport_t *t, const kvx_msg_t *m, const void *hdr,
                              size_t hdr_len)
{
    kvx_hello_t *h;
    bool retired = false;

    /* a capability kvx_fence_ex retired is refused, with an answer (kvx_recv_refuse_hello) */
    if (!kvx_equal_ct(m->u.hello.capability, t->capability, sizeof(t->capability)) &&
        !(retired = kvx_capability_retired(t, m->u.hello.capability))) {
        kvx_count(t, NULL, KVX_CNT(drop_capability));
        return;
    }
    if (t->secret != NULL) {
        uint8_t proof[KVX_PROOF_LEN];
        kvx_iov_t part = {(void *)hdr, m->u.hello.signed_len};
        if (m->u.hello.proof == NULL) {
            kvx_count(t, NULL, KVX_CNT(drop_capability));
            return;
        }
        kvx_hmac_sha256(t->secret, t->secret_len, &part, 1, proof);
        if (!kvx_equal_ct(proof, m->u.hello.proof, KVX_PROOF_LEN)) {
            kvx_count(t, NULL, KVX_CNT(drop_capability));
            return;
        }
        if (kvx_recv_replayed(t, m->u.hello.proof)) {
            kvx_count(t, kvx_writer_lookup(t, m->u.hello.name), KVX_CNT(drop_replayed));
            return;
        }
    }
    if (t->nhellos >= KVX_HELLOS_MAX || (h = malloc(sizeof(*h) + hdr_len)) == NULL) {
        kvx_count(t, NULL, KVX_CNT(drop_other));
        return;
    }
    /* HELLOs its rate holds back wait (kvx_recv_hellos), a few per name: more is a flood */
    {
        unsigned same = 0;
        for (kvx_list_t *l = t->hellos.next; l != &t->hellos; l = l->next)
            same += strcmp(kvx_container_of(l, kvx_hello_t, link)->name, m->u.hello.name) == 0;
        if (same >= KVX_HELLOS_PER_NAME) {
            free(h);
            kvx_count(t, kvx_writer_lookup(t, m->u.hello.name), KVX_CNT(drop_hello_limit));
            return;
        }
    }
    memcpy(h->buf, hdr, hdr_len);
    h->len = hdr_len;
    h->retired = retired;
    snprintf(h->name, sizeof(h->name), "%s", m->u.hello.name);
    kvx_list_add_tail(&t->hellos, &h->link);
    t->nhellos++;
}

static void kvx_recv_write(kvx_transport_t *t, const kvx_msg_t *m, const uint8_t *data,
                           size_t data_len)
{
    kvx_rconn_t *rc = kvx_rconn_of(t, m);
    kvx_writer_t *w;
    int32_t status = 0;
    const uint8_t *d;

    if (rc == NULL)
        return;
    w = rc->w;
    /* every check before any byte lands: a message lands whole or not at all */
    if (kvx_writer_fenced(w, m->u.write.epoch, m->u.write.tag)) {
        kvx_count(t, w, KVX_CNT(drop_fenced));
        status = -KVX_EFENCED;
    }
    d = data;
    for (uint32_t i = 0; i < m->u.write.nruns && status == 0; i++) {
        kvx_wire_run_t r;
        kvx_wire_run_get(m->u.write.runs, i, &r);
        if (r.offset > t->region_len || r.len > t->region_len - r.offset) {
            kvx_count(t, w, KVX_CNT(drop_range));
            status = -EINVAL;
        } else if ((m->flags & KVX_MSGF_CRC) && kvx_crc32c(d, r.len) != r.crc) {
            kvx_count(t, w, KVX_CNT(drop_crc));
            status = -EBADMSG;
        }
        d += r.len;
    }
    if (status != 0)
        kvx_debug(t, "writer %s: write %llu refused: %s", w->name,
                  (unsigned long long)m->u.write.xfer_id, kvx_strerror(status));
    if (status == 0) {
        d = data;
        for (uint32_t i = 0; i < m->u.write.nruns; i++) {
            kvx_wire_run_t r;
            kvx_wire_run_get(m->u.write.runs, i, &r);
            memcpy(t->base + r.offset, d, r.len);
            d += r.len;
        }
        t->rcounters.bytes_landed += data_len;
        w->counters.bytes_landed += data_len;
        kvx_count(t, w, KVX_CNT(writes_landed));
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
    uint8_t hdr[KVX_WIRE_READ_DATA_LEN] = {0};

    kvx_wire_put_hdr(hdr, KVX_MSG_READ_DATA, 0, rc->peer_conn_id, rc->peer_token);
    kvx_put64(hdr + 16, m->u.read_req.xfer_id);
    kvx_put64(hdr + 24, m->u.read_req.stream_off);
    kvx_put32(hdr + 40, (uint32_t)err);
    kvx_rconn_ctl(rc, hdr, sizeof(hdr)); /* no room: the connection closes (kvx_rconn_doom) */
}

static void kvx_recv_read_req(kvx_transport_t *t, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = kvx_rconn_of(t, m);
    kvx_serve_t *s;
    uint32_t n = m->u.read_req.nruns;

    if (rc == NULL)
        return;
    s = rc->nserve < KVX_SERVE_MAX ? malloc(sizeof(*s) + n * sizeof(s->runs[0])) : NULL;
    if (s == NULL) { /* too many waiting (a kvx reader asks 16 at a time), or out of memory */
        kvx_count(t, rc->w, KVX_CNT(drop_other));
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
        if (s->runs[i].offset > t->region_len ||
            s->runs[i].len > t->region_len - s->runs[i].offset) {
            /* refused whole: the reader's transfer fails */
            kvx_count(t, rc->w, KVX_CNT(drop_range));
            free(s);
            kvx_recv_refuse_read(rc, m, -EINVAL);
            return;
        }
    }
    kvx_list_add_tail(&rc->serve, &s->link);
    rc->nserve++;
    kvx_rconn_want_work(rc);
    kvx_rconn_active(rc);
    kvx_rq_add(rc, sizeof(*s) + n * sizeof(s->runs[0]));
}

static void kvx_recv_notice(kvx_transport_t *t, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = kvx_rconn_of(t, m);
    uint8_t hdr[32] = {0};
    int32_t status = 0;

    if (rc == NULL)
        return;
    if (kvx_writer_fenced(rc->w, m->u.notice.epoch, m->u.notice.tag)) {
        kvx_count(t, rc->w, KVX_CNT(drop_fenced));
        status = -KVX_EFENCED;
    } else if (t->notice_count == t->notice_cap) {
        kvx_count(t, rc->w, KVX_CNT(drop_other));
        status = -ENOSPC;
    } else {
        kvx_notice_t *n = &t->notices[(t->notice_head + t->notice_count) % t->notice_cap];
        memset(n, 0, sizeof(*n));
        snprintf(n->writer, sizeof(n->writer), "%s", rc->w->name);
        n->tag = m->u.notice.tag;
        n->blocks = m->u.notice.blocks;
        n->bytes = m->u.notice.bytes;
        t->notice_count++;
        kvx_count(t, rc->w, KVX_CNT(notices));
        kvx_rconn_active(rc);
        if (t->waiters > 0)
            kvx_notify_waiters(t);
    }
    kvx_wire_put_hdr(hdr, KVX_MSG_NOTICE_ACK, 0, rc->peer_conn_id, rc->peer_token);
    kvx_put64(hdr + 16, m->u.notice.xfer_id);
    kvx_put32(hdr + 24, (uint32_t)status);
    kvx_rconn_ctl(rc, hdr, sizeof(hdr));
}

static void kvx_recv_proof(kvx_transport_t *t, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = kvx_rconn_of(t, m);
    uint8_t mac[KVX_PROOF_LEN];

    if (rc == NULL)
        return;
    if (rc->proven) { /* none was asked for, or it came already */
        kvx_count(t, rc->w, KVX_CNT(drop_other));
        return;
    }
    kvx_wire_proof_mac(t->secret, t->secret_len, rc->nonce, rc->id, rc->token, mac);
    if (!kvx_equal_ct(mac, m->u.proof.mac, KVX_PROOF_LEN)) {
        kvx_count(t, rc->w, KVX_CNT(drop_unproven));
        kvx_info(t, "writer %s: connection %u: wrong proof, closed", rc->w->name, rc->id);
        kvx_rconn_close(rc);
        return;
    }
    rc->proven = true;
    kvx_slot_set(rc, KVX_SLOT_FRESH, kvx_now_ns());
}

void kvx_recv_on_message(kvx_transport_t *t, const kvx_msg_t *m, const void *hdr, size_t hdr_len,
                         const uint8_t *data, size_t data_len)
{
    kvx_rconn_t *rc;

    switch (m->type) {
    case KVX_MSG_HELLO:
        kvx_recv_hello_in(t, m, hdr, hdr_len);
        break;
    case KVX_MSG_WRITE:
        kvx_recv_write(t, m, data, data_len);
        break;
    case KVX_MSG_READ_REQ:
        kvx_recv_read_req(t, m);
        break;
    case KVX_MSG_NOTICE:
        kvx_recv_notice(t, m);
        break;
    case KVX_MSG_BYE:
        if ((rc = kvx_rconn_of(t, m)) != NULL)
            kvx_rconn_close(rc);
        break;
    case KVX_MSG_PROOF:
        kvx_recv_proof(t, m);
        break;
    default:
        break;
    }
}

/* ---- after UCX progress: handshakes and replies --------------------------------------------- */

/* Make the connection of a HELLO that arrived: 0 when done with it (connected, refused or
 * dropped), 1 when the rates of new connections hold it back (it waits; force: fence, which
 * takes every HELLO that arrived before it, is not held back). */
static int kvx_recv_hello(kvx_transport_t *t, const uint8_t *buf, size_t len, bool force)
{
    kvx_msg_t m;
    kvx_writer_t *w;
    kvx_rconn_t *rc;
    uint8_t ack[KVX_WIRE_HELLO_ACK_LEN] = {0};
    char tl[KVX_TRANSPORT_NAME_MAX];
    int rma_hw;

    uint64_t now = kvx_now_ns();
    kvx_rconn_t *v = NULL;

    if (kvx_wire_decode(buf, len, 0, &m) < 0 || m.type != KVX_MSG_HELLO)
        return 0; /* decoded once already */
    /* retired while it waited (kvx_fence_ex): refused as one that came after */
    if (!kvx_equal_ct(m.u.hello.capability, t->capability, sizeof(t->capability))) {
        kvx_recv_refuse_hello(t, buf, len);
        return 0;
    }
    if ((w = kvx_writer_get(t, m.u.hello.name)) == NULL) {
        kvx_count(t, NULL, KVX_CNT(drop_other));
        return 0;
    }
    /* how fast a HELLO may make this transport open an endpoint to the address it names: one
     * over the rate waits for it (a writer churning through adds is slowed, not failed) */
    if (!force && !kvx_hello_rate(t, w, now)) {
        kvx_debug(t, "writer %s: HELLO over the rate of new connections waits", w->name);
        return 1;
    }
    /* slots: a writer's name over its share gives up one of its own, a full table one of any */
    if (w->nopen >= KVX_RCONNS_PER_WRITER)
        v = kvx_slot_victim(t, w, now);
    else if (t->nrconns >= KVX_RCONNS_MAX)
        v = kvx_slot_victim(t, NULL, now);
    /* the victim gives way only once the new connection is made: a HELLO that makes none
     * (no memory, catch-up endpoints over budget, an address UCX refuses) closes nothing */
    if ((t->nrconns >= KVX_RCONNS_MAX && v == NULL) || (rc = calloc(1, sizeof(*rc))) == NULL) {
        kvx_count(t, w, KVX_CNT(drop_other));
        return 0;
    }
    rc->t = t;
    rc->w = w;
    rc->peer_conn_id = m.u.hello.conn_id;
    rc->peer_token = m.u.hello.token;
    kvx_list_init(&rc->serve);
    kvx_list_init(&rc->ctl);
    kvx_list_init(&rc->work_link);
    kvx_list_init(&rc->w_link);
    kvx_list_init(&rc->all_link);
    kvx_list_init(&rc->slot_link);
    rc->proven = t->secret == NULL;
    if (getrandom(&rc->token, sizeof(rc->token), 0) != sizeof(rc->token) ||
        (!rc->proven && getrandom(rc->nonce, sizeof(rc->nonce), 0) != sizeof(rc->nonce)) ||
        kvx_idtab_alloc(&t->rconn_ids, rc, &rc->id) < 0) {
        free(rc);
        kvx_count(t, w, KVX_CNT(drop_other));
        return 0;
    }
    /* UCX parses the writer's address here: what holds the capability (and, with a secret, what
     * proved it) may make this transport parse an address (docs/security.md) */
    if (kvx_ucx_align(t, m.u.hello.waddr, m.u.hello.ep_sn) < 0) {
        kvx_idtab_release(&t->rconn_ids, rc->id);
        free(rc);
        kvx_count(t, w, KVX_CNT(drop_hello_limit));
        return 0;
    }
    if (kvx_ucx_ep_open(t, m.u.hello.waddr, m.u.hello.name, &kvx_rconn_ep_ops, rc, &rc->ucx) < 0) {
        kvx_idtab_release(&t->rconn_ids, rc->id);
        free(rc);
        kvx_count(t, w, KVX_CNT(drop_other));
        return 0;
    }
    if (v != NULL) {
        kvx_count(t, v->w, KVX_CNT(conns_evicted));
        kvx_info(t, "writer %s: connection %u gives its slot to a new one of %s", v->w->name, v->id,
                 w->name);
        kvx_rconn_close(v);
    }
    kvx_ucx_ep_describe(rc->ucx, tl, sizeof(tl), &rma_hw, &rc->seg);
    rc->tcp = strncmp(tl, "tcp", 3) == 0;
    rc->state = KVX_CONN_OPEN;
    w->live++;
    w->nopen++;
    kvx_list_add_tail(&w->rconns, &rc->w_link);
    kvx_list_add_tail(&t->rconns, &rc->all_link);
    kvx_slot_set(rc, rc->proven ? KVX_SLOT_FRESH : KVX_SLOT_UNPROVEN, now);
    t->nrconns++;
    kvx_wire_put_hdr(ack, KVX_MSG_HELLO_ACK, 0, rc->peer_conn_id, rc->peer_token);
    kvx_put32(ack + 16, rc->id);
    kvx_put32(ack + 20, 0);
    kvx_put64(ack + 24, rc->token);
    kvx_put64(ack + 32, w->epoch);
    memcpy(ack + 40, t->seg_token, KVX_SEG_TOKEN_LEN); /* zero unless the region is owned */
    if (!rc->proven) /* the writer's PROOF must cover it (kvx_recv_proof) */
        memcpy(ack + 56, rc->nonce, KVX_WIRE_NONCE_LEN);
    kvx_rconn_ctl(rc, ack, sizeof(ack));
    kvx_info(t, "writer %s: connection %u over %s", w->name, rc->id, tl);
    return 0;
}

/* Answer read requests: each READ_DATA carries as much of the stream as a message holds. */
static unsigned kvx_recv_serve(kvx_transport_t *t, kvx_rconn_t *rc, size_t seg)
{
    unsigned n = 0;

    while (!kvx_list_empty(&rc->serve) && rc->sending < KVX_SEND_WINDOW && rc->pending_err == 0) {
        kvx_serve_t *s = kvx_list_first(&rc->serve, kvx_serve_t, link);
        kvx_send_t *m = kvx_ucx_send_get(rc->ucx);
        size_t budget = seg > 2 * KVX_WIRE_READ_DATA_LEN ? seg - 2 * KVX_WIRE_READ_DATA_LEN : 512;
        size_t len = 0, niov = 0;
        uint64_t off = s->stream_off;
        uint32_t crc = 0;
        int rc2;

        if (m == NULL)
            break;
        while (s->run < s->nruns && len < budget && niov < KVX_WIRE_MAX_RUNS) {
            kvx_wire_run_t *r = &s->runs[s->run];
            size_t piece = r->len - s->run_off < budget - len ? r->len - s->run_off : budget - len;
            m->iov[niov].base = t->base + r->offset + s->run_off;
            m->iov[niov].len = piece;
            niov++;
            len += piece;
            s->run_off += piece;
            if (s->run_off == r->len) {
                s->run++;
                s->run_off = 0;
            }
        }
        s->stream_off += len;
        if (s->crc)
            crc = kvx_crc32c_parts(m->iov, niov);
        kvx_wire_put_hdr(m->hdr, KVX_MSG_READ_DATA, s->crc ? KVX_MSGF_CRC : 0, rc->peer_conn_id,
                         rc->peer_token);
        kvx_put64(m->hdr + 16, s->xfer_id);
        kvx_put64(m->hdr + 24, off);
        kvx_put32(m->hdr + 32, (uint32_t)len);
        kvx_put32(m->hdr + 36, crc);
        kvx_put32(m->hdr + 40, 0);
        kvx_put32(m->hdr + 44, 0);
        rc2 = kvx_ucx_send(m, KVX_WIRE_READ_DATA_LEN, niov, &rc->ucx_refs);
        if (rc2 == 1)
            rc->sending++;
        t->rcounters.bytes_served += len;
        rc->w->counters.bytes_served += len;
        n++;
        if (s->run == s->nruns || rc2 < 0) {
            kvx_list_del(&s->link);
            rc->nserve--;
            kvx_rq_sub(rc, sizeof(*s) + s->nruns * sizeof(s->runs[0]));
            free(s);
        }
        if (rc2 == 1) /* last: over the transport's bound, rc may lose its queues here */
            kvx_rq_add(rc, sizeof(kvx_send_t));
        if (rc->doomed)
            break;
    }
    return n;
}

static unsigned kvx_recv_flush(kvx_transport_t *t, kvx_rconn_t *rc)
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
        size_t len = KVX_WIRE_ACK_LEN + (size_t)k * KVX_WIRE_ACK_ENTRY_LEN;
        if (m == NULL)
            break;
        kvx_wire_put_hdr(m->hdr, KVX_MSG_ACK, 0, rc->peer_conn_id, rc->peer_token);
        kvx_put32(m->hdr + 16, k);
        kvx_put32(m->hdr + 20, 0);
        memcpy(m->hdr + KVX_WIRE_ACK_LEN, rc->acks + (size_t)done * KVX_WIRE_ACK_ENTRY_LEN,
               len - KVX_WIRE_ACK_LEN);
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
        n += kvx_recv_serve(t, rc, rc->seg);
    return n;
}

/* Make the connections of the HELLOs that arrived. */
static unsigned kvx_recv_hellos(kvx_transport_t *t, bool force)
{
    unsigned n = 0;

    kvx_slots_init(t);
    for (kvx_list_t *l = t->hellos.next, *next; l != &t->hellos; l = next) {
        kvx_hello_t *h = kvx_container_of(l, kvx_hello_t, link);
        next = l->next;
        if (h->retired)
            kvx_recv_refuse_hello(t, h->buf, h->len);
        else if (kvx_recv_hello(t, h->buf, h->len, force) == 1)
            continue; /* held back by the rates: it waits, in order */
        kvx_list_del(&h->link);
        t->nhellos--;
        free(h);
        n++;
    }
    return n;
}

/* With a secret: connections that did not prove it in time close (oldest first). Run after
 * each round of HELLOs and from the housekeeping, which an idle progress thread runs at least
 * once a second: an unproven connection lasts 2-3 s. */
void kvx_recv_housekeeping(kvx_transport_t *t, uint64_t now)
{
    if (t->rslots[KVX_SLOT_UNPROVEN].next == NULL)
        return;
    while (!kvx_list_empty(&t->rslots[KVX_SLOT_UNPROVEN])) {
        kvx_rconn_t *rc = kvx_list_first(&t->rslots[KVX_SLOT_UNPROVEN], kvx_rconn_t, slot_link);
        if (now - rc->since_ns < KVX_PROOF_WAIT_NS)
            break;
        kvx_count(t, rc->w, KVX_CNT(drop_unproven));
        kvx_info(t, "writer %s: connection %u did not prove the secret in time: closed",
                 rc->w->name, rc->id);
        kvx_rconn_close(rc);
    }
}

unsigned kvx_recv_work(kvx_transport_t *t)
{
    unsigned n = kvx_recv_hellos(t, false);
    kvx_list_t todo;

    if (n > 0)
        kvx_recv_housekeeping(t, kvx_now_ns());
    kvx_list_splice_init(&t->rwork, &todo);
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
            n += kvx_recv_flush(t, rc);
        /* what the send window held back resumes from kvx_recv_on_sent */
        if (rc->pending_err != 0) { /* failed before or during the flush: UCX is out of it */
            kvx_rconn_close(rc);
            n++;
        }
    }
    return n;
}

/* Work only polling advances: replies to send, or UCX holding ours until a FIFO has room. */
bool kvx_recv_busy(const kvx_transport_t *t)
{
    if (!kvx_list_empty(&t->rwork) || !kvx_list_empty(&t->hellos))
        return true;
    for (const kvx_list_t *n = t->rconns.next; n != &t->rconns; n = n->next)
        if (kvx_container_of(n, kvx_rconn_t, all_link)->sending > 0)
            return true;
    return false;
}

/* Close every writer connection (the transport closes; UCX still runs). */
void kvx_recv_close_all(kvx_transport_t *t)
{
    for (kvx_list_t *n = t->rconns.next, *next; n != &t->rconns; n = next) {
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

/* Free everything of the receiving side (the worker is gone: no callback will come). */
void kvx_recv_free_all(kvx_transport_t *t)
{
    while (!kvx_list_empty(&t->hellos)) {
        kvx_hello_t *h = kvx_list_first(&t->hellos, kvx_hello_t, link);
        kvx_list_del(&h->link);
        free(h);
    }
    t->nhellos = 0;
    while (!kvx_list_empty(&t->rconns)) {
        kvx_rconn_t *rc = kvx_list_first(&t->rconns, kvx_rconn_t, all_link);
        rc->ucx_refs = 0;
        rc->state = KVX_CONN_CLOSED;
        kvx_rconn_maybe_free(rc);
    }
    for (size_t i = 0; i < t->wtab_cap; i++) {
        kvx_writer_t *w, *next;
        for (w = t->wtab[i]; w != NULL; w = next) {
            next = w->hnext;
            kvx_writer_free(t, w);
        }
    }
    free(t->wtab);
    t->wtab = NULL;
    t->wtab_cap = t->nwriters = 0;
    free(t->rconn_ids.slots);
    memset(&t->rconn_ids, 0, sizeof(t->rconn_ids));
    free(t->seen);
    t->seen = NULL;
}

/* ---- the API of the receiving side -------------------------------------------------------- */

/* The writers a fence names: the one called writer, or every one (writer NULL). Start with w
 * NULL and *bucket 0. */
static kvx_writer_t *kvx_fence_next(const kvx_transport_t *t, const char *writer, size_t *bucket,
                                    kvx_writer_t *w)
{
    if (writer != NULL)
        return w == NULL ? kvx_writer_lookup(t, writer) : NULL;
    if (w != NULL && w->hnext != NULL)
        return w->hnext;
    while (*bucket < t->wtab_cap) {
        kvx_writer_t *x = t->wtab[(*bucket)++];
        if (x != NULL)
            return x;
    }
    return NULL;
}

/* Tag records a fence of tags (sorted, distinct; ntags > 0) adds to w: none for a writer
 * without connections, which needs none. */
static uint32_t kvx_writer_fence_need(const kvx_writer_t *w, const uint64_t *tags, size_t ntags)
{
    uint32_t need = 0;

    if (w->live == 0)
        return 0;
    for (size_t k = 0; k < ntags; k++) {
        uint32_t i = kvx_ftag_find(w, tags[k]);
        need += !(i < w->nftags && w->ftags[i].tag == tags[k]);
    }
    return need;
}

/* Room for need more tag records: 0 or -ENOMEM (no fence changes either way). */
static int kvx_writer_fence_reserve(kvx_writer_t *w, uint32_t need)
{
    uint32_t cap = w->ftags_cap ? w->ftags_cap : 16;
    kvx_fence_rec_t *f;

    if (w->nftags + need <= w->ftags_cap)
        return 0;
    while (cap < w->nftags + need)
        cap *= 2;
    if (cap > KVX_FENCE_WRITER_TAGS_MAX)
        cap = KVX_FENCE_WRITER_TAGS_MAX;
    f = realloc(w->ftags, (size_t)cap * sizeof(*f));
    if (f == NULL)
        return -ENOMEM;
    w->ftags = f;
    w->ftags_cap = cap;
    return 0;
}

/* Fence w (room for its records was made), and tell its connections the new epoch. */
static void kvx_writer_fence(kvx_transport_t *t, kvx_writer_t *w, const uint64_t *tags,
                             size_t ntags, int *count)
{
    w->epoch++;
    if (w->live == 0) {
        /* no connection: nothing can come stamped with an older epoch (a new one starts at
         * this one), so no record is needed, and older ones are moot */
        kvx_writer_drop_fences(t, w);
    } else if (ntags == 0) {
        w->fence_all = w->epoch;
        kvx_writer_drop_fences(t, w); /* every tag record is older: moot */
    } else {
        for (size_t k = 0; k < ntags; k++) {
            uint32_t i = kvx_ftag_find(w, tags[k]);
            if (i == w->nftags || w->ftags[i].tag != tags[k]) {
                memmove(&w->ftags[i + 1], &w->ftags[i], (w->nftags - i) * sizeof(w->ftags[0]));
                w->ftags[i].tag = tags[k];
                w->nftags++;
                t->nftags++;
            }
            w->ftags[i].at_epoch = w->epoch;
        }
    }
    for (kvx_list_t *n = w->rconns.next; n != &w->rconns; n = n->next) {
        kvx_rconn_t *rc = kvx_container_of(n, kvx_rconn_t, w_link);
        uint8_t hdr[24] = {0};
        kvx_ctl_t *queued = NULL;
        /* the writer keeps only the newest epoch: a FENCE still queued takes the new one, so
         * that fences in a burst (1,000 tag fences) queue one message, not one each (which
         * would overflow the connection's control queue and close it) */
        for (kvx_list_t *l = rc->ctl.next; l != &rc->ctl && queued == NULL; l = l->next)
            if (kvx_container_of(l, kvx_ctl_t, link)->hdr[1] == KVX_MSG_FENCE)
                queued = kvx_container_of(l, kvx_ctl_t, link);
        if (queued != NULL) {
            kvx_put64(queued->hdr + 16, w->epoch);
        } else {
            kvx_wire_put_hdr(hdr, KVX_MSG_FENCE, 0, rc->peer_conn_id, rc->peer_token);
            kvx_put64(hdr + 16, w->epoch);
            kvx_rconn_ctl(rc, hdr, sizeof(hdr));
        }
        (*count)++;
    }
}

/* The first half of a fence (kvx_fence_ex, transport.c): the HELLOs that arrived become
 * connections, so that their writers' writes submitted before the call are fenced too (and,
 * retiring, they were made with the old capability); then everything that can fail, before any
 * fence changes: the bounds and the memory for the records. tags are sorted and distinct. */
int kvx_recv_fence_prepare(kvx_transport_t *t, const char *writer, const uint64_t *tags,
                           size_t ntags)
{
    size_t bucket = 0, total = 0;
    kvx_writer_t *w;
    int rc = 0;

    kvx_recv_hellos(t, true);
    for (w = NULL; ntags > 0 && (w = kvx_fence_next(t, writer, &bucket, w)) != NULL;) {
        uint32_t need = kvx_writer_fence_need(w, tags, ntags);
        if (w->nftags + need > KVX_FENCE_WRITER_TAGS_MAX)
            rc = -ENOSPC;
        total += need;
    }
    if (rc == 0 && t->nftags + total > KVX_FENCE_TOTAL_TAGS_MAX)
        rc = -ENOSPC;
    bucket = 0;
    for (w = NULL; rc == 0 && ntags > 0 && (w = kvx_fence_next(t, writer, &bucket, w)) != NULL;)
        rc = kvx_writer_fence_reserve(w, kvx_writer_fence_need(w, tags, ntags));
    return rc;
}

/* The second half, which cannot fail: returns the number of connections fenced. */
int kvx_recv_fence(kvx_transport_t *t, const char *writer, const uint64_t *tags, size_t ntags)
{
    size_t bucket = 0;
    kvx_writer_t *w;
    int count = 0;

    for (w = NULL; (w = kvx_fence_next(t, writer, &bucket, w)) != NULL;)
        kvx_writer_fence(t, w, tags, ntags, &count);
    if (count > 0) {
        t->stats.fences++;
        kvx_kick(t, 0); /* tell the writers now */
    }
    return count;
}

int kvx_notice_poll(kvx_transport_t *t, kvx_notice_t *out, size_t max)
{
    size_t n = 0;

    if (t == NULL || (out == NULL && max != 0))
        return -EINVAL;
    if (max > INT32_MAX)
        max = INT32_MAX;
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return -ESHUTDOWN;
    }
    kvx_progress_step(t);
    while (n < max && t->notice_count > 0) {
        out[n++] = t->notices[t->notice_head];
        t->notice_head = (t->notice_head + 1) % t->notice_cap;
        t->notice_count--;
    }
    kvx_events_update(t);
    kvx_unlock(t);
    return (int)n;
}
