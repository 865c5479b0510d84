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

#define KVX_RCONNS_MAX 4096 /* connections from writers, at most */
#define KVX_WRITERS_MAX 4096
#define KVX_HELLOS_MAX 64  /* handshakes waiting for kvx_recv_work */
#define KVX_SERVE_MAX 64   /* read requests queued per connection (an initiator sends 16) */
#define KVX_SEND_WINDOW 16 /* messages of one connection UCX may hold */

typedef struct kvx_hello {
    kvx_list_t link;
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

void kvx_recv_count_drop(kvx_transport_t *t, int why)
{
    kvx_debug(t, "message dropped (%s)",
              why == KVX_DROP_MALFORMED    ? "malformed"
              : why == KVX_DROP_CAPABILITY ? "no capability"
              : why == KVX_DROP_UNKNOWN    ? "unknown connection"
                                           : "rendezvous");
    switch (why) {
    case KVX_DROP_MALFORMED:
        kvx_count(t, NULL, KVX_CNT(drop_malformed));
        break;
    case KVX_DROP_CAPABILITY:
        kvx_count(t, NULL, KVX_CNT(drop_capability));
        break;
    case KVX_DROP_UNKNOWN:
        kvx_count(t, NULL, KVX_CNT(drop_unknown));
        break;
    default:
        kvx_count(t, NULL, KVX_CNT(drop_other));
        break;
    }
}

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
        free(w);
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

/* Did a fence after the writer's epoch e cover tag? */
static bool kvx_writer_fenced(const kvx_writer_t *w, uint64_t e, uint64_t tag)
{
    for (uint32_t i = w->nfences; i-- > 0;) {
        const kvx_fence_rec_t *f = &w->fences[i];
        if (f->at_epoch <= e)
            return false; /* records are in epoch order: older ones cannot apply either */
        if (f->ntags == 0)
            return true;
        for (uint32_t k = 0; k < f->ntags; k++)
            if (f->tags[k] == tag)
                return true;
    }
    return false;
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
        free(s);
    }
    while (!kvx_list_empty(&rc->ctl)) {
        kvx_ctl_t *c = kvx_list_first(&rc->ctl, kvx_ctl_t, link);
        kvx_list_del(&c->link);
        free(c);
    }
    rc->nserve = 0;
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
    free(rc->acks);
    free(rc);
}

/* Stop accepting its messages (the id is freed: a message naming it is unknown from now on) and
 * close its endpoint. */
static void kvx_rconn_close(kvx_rconn_t *rc)
{
    kvx_transport_t *t = rc->t;

    if (rc->state != KVX_CONN_OPEN)
        return;
    rc->state = KVX_CONN_CLOSING;
    kvx_idtab_release(&t->rconn_ids, rc->id);
    t->nrconns--;
    kvx_list_del(&rc->w_link);
    kvx_list_del(&rc->work_link);
    kvx_rconn_drop_queued(rc);
    kvx_info(t, "writer %s: connection %u closed", rc->w->name, rc->id);
    if (kvx_ucx_ep_close(rc->ucx, &rc->ucx_refs) == 0) {
        rc->state = KVX_CONN_CLOSED;
        kvx_rconn_maybe_free(rc);
    }
}

/* The forced close completed (its callback). */
void kvx_recv_on_closed(kvx_rconn_t *rc)
{
    rc->ucx_refs--;
    rc->state = KVX_CONN_CLOSED;
    kvx_rconn_maybe_free(rc);
}

void kvx_recv_on_error(kvx_rconn_t *rc, int status)
{
    kvx_info(rc->t, "writer %s: connection %u failed: %s", rc->w ? rc->w->name : "?", rc->id,
             kvx_strerror(status));
    kvx_rconn_close(rc);
}

void kvx_recv_on_sent(kvx_rconn_t *rc, int status)
{
    (void)status; /* a reply lost with its connection: the writer sees that connection fail */
    rc->ucx_refs--;
    rc->sending--;
    if (rc->state == KVX_CONN_OPEN &&
        (rc->nacks > 0 || !kvx_list_empty(&rc->serve) || !kvx_list_empty(&rc->ctl)))
        kvx_rconn_want_work(rc);
    kvx_rconn_maybe_free(rc);
}

/* The connection a message names, if its token matches; NULL (counted) otherwise. */
static kvx_rconn_t *kvx_rconn_of(kvx_transport_t *t, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = kvx_idtab_get(&t->rconn_ids, m->conn_id);
    uint8_t a[8], b[8];

    if (rc != NULL) {
        kvx_put64(a, rc->token);
        kvx_put64(b, m->token);
    }
    if (rc == NULL || rc->state != KVX_CONN_OPEN || !kvx_equal_ct(a, b, 8)) {
        kvx_debug(t, "message for unknown connection %u dropped", m->conn_id);
        kvx_count(t, NULL, KVX_CNT(drop_unknown));
        return NULL;
    }
    return rc;
}

static int kvx_rconn_ctl(kvx_rconn_t *rc, const uint8_t *hdr, size_t len)
{
    kvx_ctl_t *c = malloc(sizeof(*c));

    if (c == NULL)
        return -ENOMEM;
    memcpy(c->hdr, hdr, len);
    c->len = len;
    kvx_list_add_tail(&rc->ctl, &c->link);
    kvx_rconn_want_work(rc);
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
        rc->acks = acks;
        rc->acks_cap = cap;
    }
    kvx_wire_ack_put(rc->acks, rc->nacks++, xfer_id, (uint32_t)bytes, status);
    kvx_rconn_want_work(rc);
    return true;
}

/* ---- messages in (inside UCX progress) ---------------------------------------------------- */

/* A HELLO: the capability must match (and the proof of the secret, with one) before kvx keeps
 * anything of it; the connection itself is made after progress (kvx_recv_hello). */
static void kvx_recv_hello_in(kvx_transport_t *t, const kvx_msg_t *m, const void *hdr,
                              size_t hdr_len)
{
    kvx_hello_t *h;

    if (!kvx_equal_ct(m->u.hello.capability, t->capability, sizeof(t->capability))) {
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
    }
    if (t->nhellos >= KVX_HELLOS_MAX || (h = malloc(sizeof(*h) + hdr_len)) == NULL) {
        kvx_count(t, NULL, KVX_CNT(drop_other));
        return;
    }
    memcpy(h->buf, hdr, hdr_len);
    h->len = hdr_len;
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
    }
    if (!kvx_rconn_ack(rc, m->u.write.xfer_id, data_len, status)) {
        /* no room to remember the answer: rather than leave the writer waiting for it, close
         * the connection (the writer's transfers on it fail) */
        kvx_count(t, w, KVX_CNT(drop_other));
        kvx_warn(t, "writer %s: %u acknowledgements waiting: closing connection %u", w->name,
                 rc->nacks, rc->id);
        kvx_rconn_close(rc);
    }
}

/* Answer a read request with a refusal: the reader's transfer fails with err at once. */
static void kvx_recv_refuse_read(kvx_rconn_t *rc, const kvx_msg_t *m, int err)
{
    uint8_t hdr[KVX_WIRE_READ_DATA_LEN] = {0};

    kvx_wire_put_hdr(hdr, KVX_MSG_READ_DATA, 0, rc->peer_conn_id, rc->peer_token);
    kvx_put64(hdr + 16, m->u.read_req.xfer_id);
    kvx_put64(hdr + 24, m->u.read_req.stream_off);
    kvx_put32(hdr + 40, (uint32_t)err);
    if (kvx_rconn_ctl(rc, hdr, sizeof(hdr)) < 0)
        kvx_rconn_close(rc); /* out of memory: the reader sees its connection fail */
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
        if (t->waiters > 0)
            kvx_progress_notify_waiters(t);
    }
    kvx_wire_put_hdr(hdr, KVX_MSG_NOTICE_ACK, 0, rc->peer_conn_id, rc->peer_token);
    kvx_put64(hdr + 16, m->u.notice.xfer_id);
    kvx_put32(hdr + 24, (uint32_t)status);
    kvx_rconn_ctl(rc, hdr, sizeof(hdr));
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
    default:
        break;
    }
}

/* ---- after UCX progress: handshakes and replies --------------------------------------------- */

static void kvx_recv_hello(kvx_transport_t *t, const uint8_t *buf, size_t len)
{
    kvx_msg_t m;
    kvx_writer_t *w;
    kvx_rconn_t *rc;
    uint8_t ack[KVX_WIRE_HELLO_ACK_LEN] = {0};
    char tl[KVX_TRANSPORT_NAME_MAX];
    int rma_hw;

    if (kvx_wire_decode(buf, len, 0, &m) < 0 || m.type != KVX_MSG_HELLO)
        return; /* decoded once already */
    if (t->nrconns >= KVX_RCONNS_MAX || (w = kvx_writer_get(t, m.u.hello.name)) == NULL ||
        (rc = calloc(1, sizeof(*rc))) == NULL) {
        kvx_count(t, NULL, KVX_CNT(drop_other));
        return;
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
    if (getrandom(&rc->token, sizeof(rc->token), 0) != sizeof(rc->token) ||
        kvx_idtab_alloc(&t->rconn_ids, rc, &rc->id) < 0) {
        free(rc);
        kvx_count(t, w, KVX_CNT(drop_other));
        return;
    }
    /* UCX parses the writer's address here: what holds the capability (and, with a secret, what
     * proved it) may make this transport parse an address (docs/security.md) */
    kvx_ucx_align(t, m.u.hello.waddr, m.u.hello.ep_sn);
    if (kvx_ucx_ep_open(t, m.u.hello.waddr, m.u.hello.name, rc, true, &rc->ucx) < 0) {
        kvx_idtab_release(&t->rconn_ids, rc->id);
        free(rc);
        kvx_count(t, w, KVX_CNT(drop_other));
        return;
    }
    kvx_ucx_ep_describe(rc->ucx, tl, sizeof(tl), &rma_hw, &rc->seg);
    rc->state = KVX_CONN_OPEN;
    w->live++;
    kvx_list_add_tail(&w->rconns, &rc->w_link);
    kvx_list_add_tail(&t->rconns, &rc->all_link);
    t->nrconns++;
    kvx_wire_put_hdr(ack, KVX_MSG_HELLO_ACK, 0, rc->peer_conn_id, rc->peer_token);
    kvx_put32(ack + 16, rc->id);
    kvx_put32(ack + 20, 0);
    kvx_put64(ack + 24, rc->token);
    kvx_put64(ack + 32, w->epoch);
    memcpy(ack + 40, t->seg_token, KVX_SEG_TOKEN_LEN); /* zero unless the region is owned */
    kvx_rconn_ctl(rc, ack, sizeof(ack));
    kvx_info(t, "writer %s: connection %u over %s", w->name, rc->id, tl);
}

/* Answer read requests: each READ_DATA carries as much of the stream as a message holds. */
static unsigned kvx_recv_serve(kvx_transport_t *t, kvx_rconn_t *rc, size_t seg)
{
    unsigned n = 0;

    while (!kvx_list_empty(&rc->serve) && rc->sending < KVX_SEND_WINDOW) {
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
            free(s);
        }
    }
    return n;
}

static unsigned kvx_recv_flush(kvx_transport_t *t, kvx_rconn_t *rc)
{
    unsigned n = 0;

    while (!kvx_list_empty(&rc->ctl) && rc->sending < KVX_SEND_WINDOW) {
        kvx_ctl_t *c = kvx_list_first(&rc->ctl, kvx_ctl_t, link);
        kvx_list_del(&c->link);
        if (kvx_ucx_send_ctl(rc->ucx, c->hdr, c->len, &rc->ucx_refs) == 1)
            rc->sending++;
        free(c);
        n++;
    }
    /* acknowledgements, KVX_ACK_BATCH per message: they are how writers make progress, so they
     * go out whatever the window (it bounds read data) */
    uint32_t done = 0;
    while (done < rc->nacks) {
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
        if (kvx_ucx_send(m, len, 0, &rc->ucx_refs) == 1)
            rc->sending++;
        done += k;
        n++;
    }
    /* what could not go out (no message buffer) stays for the next round */
    if (done > 0 && done < rc->nacks)
        memmove(rc->acks, rc->acks + (size_t)done * KVX_WIRE_ACK_ENTRY_LEN,
                (size_t)(rc->nacks - done) * KVX_WIRE_ACK_ENTRY_LEN);
    rc->nacks -= done;
    if (rc->nacks > 0)
        kvx_rconn_want_work(rc);
    if (!kvx_list_empty(&rc->serve))
        n += kvx_recv_serve(t, rc, rc->seg);
    return n;
}

/* Make the connections of the HELLOs that arrived. */
static unsigned kvx_recv_hellos(kvx_transport_t *t)
{
    unsigned n = 0;

    while (!kvx_list_empty(&t->hellos)) {
        kvx_hello_t *h = kvx_list_first(&t->hellos, kvx_hello_t, link);
        kvx_list_del(&h->link);
        t->nhellos--;
        kvx_recv_hello(t, h->buf, h->len);
        free(h);
        n++;
    }
    return n;
}

unsigned kvx_recv_work(kvx_transport_t *t)
{
    unsigned n = kvx_recv_hellos(t);
    kvx_list_t todo;

    kvx_list_splice_init(&t->rwork, &todo);
    while (!kvx_list_empty(&todo)) {
        kvx_rconn_t *rc = kvx_list_first(&todo, kvx_rconn_t, work_link);
        kvx_list_del(&rc->work_link);
        if (rc->state != KVX_CONN_OPEN)
            continue;
        n += kvx_recv_flush(t, rc);
        /* what the send window held back resumes from kvx_recv_on_sent */
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
        next = n->next;
        kvx_rconn_close(kvx_container_of(n, kvx_rconn_t, all_link));
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
            free(w);
        }
    }
    free(t->wtab);
    t->wtab = NULL;
    t->wtab_cap = t->nwriters = 0;
    free(t->rconn_ids.slots);
    memset(&t->rconn_ids, 0, sizeof(t->rconn_ids));
}

/* ---- the API of the receiving side -------------------------------------------------------- */

static void kvx_writer_fence(kvx_writer_t *w, const uint64_t *tags, size_t ntags, int *count)
{
    kvx_fence_rec_t *f;

    if (w->nfences == KVX_FENCES_MAX) {
        /* the two oldest merge into one fence of every tag at the later epoch: it drops at
         * least what both did (writes whose writer has not heard of them for long) */
        w->fences[1].ntags = 0;
        memmove(&w->fences[0], &w->fences[1], (KVX_FENCES_MAX - 1) * sizeof(w->fences[0]));
        w->nfences--;
    }
    w->epoch++;
    f = &w->fences[w->nfences++];
    f->at_epoch = w->epoch;
    f->ntags = (uint32_t)ntags;
    if (ntags > 0)
        memcpy(f->tags, tags, ntags * sizeof(tags[0]));
    for (kvx_list_t *n = w->rconns.next; n != &w->rconns; n = n->next) {
        kvx_rconn_t *rc = kvx_container_of(n, kvx_rconn_t, w_link);
        uint8_t hdr[24] = {0};
        kvx_wire_put_hdr(hdr, KVX_MSG_FENCE, 0, rc->peer_conn_id, rc->peer_token);
        kvx_put64(hdr + 16, w->epoch);
        kvx_rconn_ctl(rc, hdr, sizeof(hdr));
        (*count)++;
    }
}

int kvx_fence(kvx_transport_t *t, const char *writer, const uint64_t *tags, size_t ntags)
{
    int count = 0;

    if (t == NULL || ntags > KVX_FENCE_TAGS_MAX || (tags == NULL && ntags > 0) ||
        (writer != NULL && (strnlen(writer, KVX_NAME_MAX + 1) == 0 ||
                            strnlen(writer, KVX_NAME_MAX + 1) > KVX_NAME_MAX)))
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return -ESHUTDOWN;
    }
    /* HELLOs that arrived already become connections first: their writers' writes submitted
     * before this call are fenced too */
    kvx_recv_hellos(t);
    if (writer != NULL) {
        kvx_writer_t *w = kvx_writer_lookup(t, writer);
        if (w != NULL)
            kvx_writer_fence(w, tags, ntags, &count);
    } else {
        for (size_t i = 0; i < t->wtab_cap; i++)
            for (kvx_writer_t *w = t->wtab[i]; w != NULL; w = w->hnext)
                kvx_writer_fence(w, tags, ntags, &count);
    }
    kvx_info(t, "fence of %s%s: %d connection(s)", writer ? writer : "every writer",
             ntags ? " (some tags)" : "", count);
    if (count > 0)
        kvx_progress_kick(t, 0); /* tell the writers now */
    kvx_unlock(t);
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
    kvx_unlock(t);
    return (int)n;
}
