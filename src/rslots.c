/*
 * The receiving side's connection slots and the bounds over all of its connections (recv.c holds
 * the connections themselves): what their reply queues hold in all, which connection gives its
 * slot to a new one, how fast HELLOs may make this transport open endpoints, and the proof a
 * writer answers a receiver's nonce with. docs/security.md, "Resource bounds", gives the figures.
 */
#include "kvx_int.h"

#include <string.h>

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
    if (n > rc->qbytes || n > rc->t->rqbytes) {
        kvx_error(rc->t, "reply queue accounting: %zu taken, %zu held by connection %u, %zu in all",
                  n, rc->qbytes, rc->id, rc->t->rqbytes);
        n = rc->qbytes < rc->t->rqbytes ? rc->qbytes : rc->t->rqbytes;
    }
    rc->qbytes -= n;
    rc->t->rqbytes -= n;
}
/* More queued for rc; past the transport's bound, the connection holding the most gives way. */
void kvx_rq_add(kvx_rconn_t *rc, size_t n)
{
    kvx_transport_t *t = rc->t;
    kvx_rconn_t *big = NULL;

    rc->qbytes += n;
    t->rqbytes += n;
    if (t->rqbytes <= KVX_RQ_MAX)
        return;
    for (kvx_list_t *l = t->rconns.next; l != &t->rconns; l = l->next) {
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

bool kvx_hello_rate(kvx_transport_t *t, kvx_writer_t *w, uint64_t now)
{
    if (!kvx_rate_ok(&w->hello_credit_ns, now, KVX_EP_RATE_WRITER) ||
        !kvx_rate_ok(&t->hello_credit_ns, now, KVX_EP_RATE_TRANSPORT))
        return false;
    kvx_rate_take(&w->hello_credit_ns, now, KVX_EP_RATE_WRITER);
    kvx_rate_take(&t->hello_credit_ns, now, KVX_EP_RATE_TRANSPORT);
    return true;
}

/* ---- connection slots ----------------------------------------------------------------------- */

void kvx_slots_init(kvx_transport_t *t)
{
    if (t->rslots[0].next == NULL)
        for (int i = 0; i < 3; i++)
            kvx_list_init(&t->rslots[i]);
}

void kvx_slot_set(kvx_rconn_t *rc, int cls, uint64_t now)
{
    kvx_slots_init(rc->t);
    kvx_list_del(&rc->slot_link);
    rc->slot_class = (uint8_t)cls;
    rc->since_ns = now;
    kvx_list_add_tail(&rc->t->rslots[cls], &rc->slot_link);
}

/* It completed (a part of) a transfer: it goes last in the order of eviction. */
void kvx_rconn_active(kvx_rconn_t *rc)
{
    if (rc->slot_class != KVX_SLOT_ACTIVE || rc->t->rslots[KVX_SLOT_ACTIVE].prev != &rc->slot_link)
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
kvx_rconn_t *kvx_slot_victim(kvx_transport_t *t, kvx_writer_t *w, uint64_t now)
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
        if (!kvx_list_empty(&t->rslots[i])) {
            kvx_rconn_t *x = kvx_list_first(&t->rslots[i], kvx_rconn_t, slot_link);
            if (v == NULL || kvx_slot_before(x, v, now))
                v = x;
        }
    return v;
}
