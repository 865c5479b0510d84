/*
 * The receiving side's handshake. A writer's connection is made when its HELLO presents this
 * transport's capability (and proves the shared secret, when one is set): the HELLO is checked
 * inside UCX progress (a recorded one is a replay, a retired capability is refused with an
 * answer), and the connection made after it, within the rates and slots of rconn.c. With a
 * secret, the writer then proves it over the HELLO_ACK's nonce (PROOF) in time, or its
 * connection closes.
 */
#include "recv/kvx_recv.h"
#include "recv/recv_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ---- retired capabilities ------------------------------------------------------------------ */

#define KVX_REFUSING_MAX 16 /* connections open at once only to refuse a HELLO */

static bool kvx_capability_retired(const kvx_recv_t *r, const uint8_t *cap)
{
    bool hit = false;

    for (unsigned i = 0; i < r->nretired; i++) /* every one compared: constant time */
        hit |= kvx_equal_ct(cap, r->retired[i], sizeof(r->retired[i]));
    return hit;
}

/* A receiving connection for HELLO m of writer w, on its endpoint (the one UCX paired with the
 * writer's: kvx_ucx_ep_accept): its id and random token (a refusing one's no message can name),
 * and with a secret, the nonce its PROOF must cover. NULL (nothing kept, nothing counted) when it
 * cannot be had; *over: the catch-up was over its budget. */
static kvx_rconn_t *kvx_recv_hello_rconn(kvx_recv_t *r, kvx_writer_t *w, const kvx_msg_t *m,
                                         const kvx_came_on_t *came_on, bool refusing, bool *over)
{
    kvx_rconn_t *rc = kvx_rconn_alloc(&r->conns, w, m);
    int err;

    if (rc == NULL)
        return NULL;
    rc->refusing = refusing;
    rc->proven = refusing || r->core->secret == NULL; /* a refusing one takes no message */
    if (getrandom(&rc->token, sizeof(rc->token), 0) != sizeof(rc->token) ||
        (!rc->proven && getrandom(rc->nonce, sizeof(rc->nonce), 0) != sizeof(rc->nonce)) ||
        kvx_idtab_alloc(&r->conns.ids, rc, &rc->id) < 0) {
        free(rc);
        return NULL;
    }
    /* UCX parses the writer's address here: what holds the capability (and, with a secret, what
     * proved it) may make this transport parse an address (docs/security.md) */
    if ((err = kvx_ucx_ep_accept(r->core->ucx, m->u.hello.waddr, m->u.hello.ep_sn, came_on,
                                 m->u.hello.name, &kvx_rconn_ep_ops, rc, &rc->ucx)) < 0) {
        kvx_idtab_release(&r->conns.ids, rc->id);
        free(rc);
        return NULL;
    }
    *over = err == 1;
    rc->state = KVX_CONN_OPEN;
    w->live++;
    w->nopen++; /* a refusing one's too: kvx_rconn_close takes it back */
    kvx_list_add_tail(refusing ? &r->refusing : &w->rconns, &rc->w_link);
    kvx_list_add_tail(&r->conns.all, &rc->all_link);
    r->conns.nopen++;
    return rc;
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
static void kvx_recv_refuse_hello(kvx_recv_t *r, const uint8_t *buf, size_t len,
                                  const kvx_came_on_t *came_on)
{
    kvx_msg_t m;
    kvx_writer_t *w;
    kvx_rconn_t *rc;
    uint8_t ack[KVX_WIRE_HELLO_ACK_LEN];
    unsigned n = 0;
    bool over;

    if (kvx_wire_decode(buf, len, 0, &m) < 0 || m.type != KVX_MSG_HELLO)
        return;
    w = kvx_writer_lookup(&r->conns, m.u.hello.name);
    kvx_count(r->core, w, KVX_CNT(drop_capability));
    kvx_info(r->core, "writer %s: handshake with a retired capability refused", m.u.hello.name);
    for (kvx_list_t *l = r->refusing.next; l != &r->refusing; l = l->next)
        n++;
    if (n >= KVX_REFUSING_MAX) { /* the oldest that sent its answer gives way */
        for (kvx_list_t *l = r->refusing.next; l != &r->refusing; l = l->next) {
            kvx_rconn_t *old = kvx_container_of(l, kvx_rconn_t, w_link);
            if (old->sending == 0) {
                kvx_rconn_close(old);
                n--;
                break;
            }
        }
    }
    if (n >= KVX_REFUSING_MAX || r->conns.nopen >= KVX_RCONNS_MAX ||
        (w = kvx_writer_get(&r->conns, m.u.hello.name)) == NULL)
        return;
    /* the rates of new connections bound these endpoints too */
    if (!kvx_hello_rate(&r->conns, w, kvx_now_ns())) {
        kvx_count(r->core, w, KVX_CNT(drop_hello_limit));
        return;
    }
    /* on no slot list: KVX_REFUSING_MAX bounds these */
    if ((rc = kvx_recv_hello_rconn(r, w, &m, came_on, true, &over)) == NULL)
        return;
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_HELLO_ACK,
                                 .conn_id = rc->peer_conn_id,
                                 .token = rc->peer_token,
                                 .u.hello_ack.status = -EKEYREVOKED},
                    ack);
    if (kvx_ucx_send_ctl(rc->ucx, ack, sizeof(ack), &rc->ucx_refs) == 1) {
        rc->sending++;
        kvx_rq_add(rc, sizeof(kvx_send_t)); /* the endpoint's on_sent takes it back */
    }
}

void kvx_recv_retire(kvx_recv_t *r, const uint8_t cap[16])
{
    /* the newest first; the oldest beyond KVX_RETIRED_MAX is forgotten (dropped as unknown) */
    memmove(r->retired[1], r->retired[0], (KVX_RETIRED_MAX - 1) * sizeof(r->retired[0]));
    memcpy(r->retired[0], cap, sizeof(r->retired[0]));
    if (r->nretired < KVX_RETIRED_MAX)
        r->nretired++;
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
static bool kvx_recv_replayed(kvx_recv_t *r, const uint8_t *proof)
{
    uint64_t now = kvx_now_ns();
    size_t h = (size_t)kvx_get64(proof) & (KVX_SEEN_SLOTS - 1), pick = h;
    struct kvx_seen_proof *s;

    if (r->seen == NULL && (r->seen = calloc(KVX_SEEN_SLOTS, sizeof(*r->seen))) == NULL)
        return false; /* no memory: the PROOF over the nonce still holds */
    for (size_t i = 0; i < KVX_SEEN_PROBE; i++) {
        s = &r->seen[(h + i) & (KVX_SEEN_SLOTS - 1)];
        if (s->at_ns == 0) {
            pick = (h + i) & (KVX_SEEN_SLOTS - 1);
            break;
        }
        if (now - s->at_ns < KVX_SEEN_NS && kvx_equal_ct(s->proof, proof, KVX_PROOF_LEN))
            return true;
        if (s->at_ns < r->seen[pick].at_ns) /* the oldest goes, an expired one first */
            pick = (h + i) & (KVX_SEEN_SLOTS - 1);
    }
    s = &r->seen[pick];
    memcpy(s->proof, proof, KVX_PROOF_LEN);
    s->at_ns = now;
    return false;
}

/* ---- HELLOs in (inside UCX progress) -------------------------------------------------------- */

/* A HELLO: the capability must match (and the proof of the secret, with one) before kvx keeps
 * anything of it; the connection itself is made after progress (kvx_recv_hello). */
void kvx_recv_hello_in(kvx_recv_t *r, const kvx_msg_t *m, const void *hdr, size_t hdr_len)
{
    kvx_hello_t *h;
    bool retired = false;

    /* a capability kvx_fence_ex retired is refused, with an answer (kvx_recv_refuse_hello) */
    if (!kvx_equal_ct(m->u.hello.capability, r->core->capability, sizeof(r->core->capability)) &&
        !(retired = kvx_capability_retired(r, m->u.hello.capability))) {
        kvx_count(r->core, NULL, KVX_CNT(drop_capability));
        return;
    }
    if (r->core->secret != NULL) {
        uint8_t proof[KVX_PROOF_LEN];
        kvx_iov_t part = {(void *)hdr, m->u.hello.signed_len};
        if (m->u.hello.proof == NULL) {
            kvx_count(r->core, NULL, KVX_CNT(drop_capability));
            return;
        }
        kvx_hmac_sha256(r->core->secret, r->core->secret_len, &part, 1, proof);
        if (!kvx_equal_ct(proof, m->u.hello.proof, KVX_PROOF_LEN)) {
            kvx_count(r->core, NULL, KVX_CNT(drop_capability));
            return;
        }
        if (kvx_recv_replayed(r, m->u.hello.proof)) {
            kvx_count(r->core, kvx_writer_lookup(&r->conns, m->u.hello.name),
                      KVX_CNT(drop_replayed));
            return;
        }
    }
    if (r->nhellos >= KVX_HELLOS_MAX || (h = malloc(sizeof(*h) + hdr_len)) == NULL) {
        kvx_count(r->core, NULL, KVX_CNT(drop_other));
        return;
    }
    /* HELLOs its rate holds back wait (kvx_recv_hellos), a few per name: more is a flood */
    {
        unsigned same = 0;
        for (kvx_list_t *l = r->hellos.next; l != &r->hellos; l = l->next)
            same += strcmp(kvx_container_of(l, kvx_hello_t, link)->name, m->u.hello.name) == 0;
        if (same >= KVX_HELLOS_PER_NAME) {
            free(h);
            kvx_count(r->core, kvx_writer_lookup(&r->conns, m->u.hello.name),
                      KVX_CNT(drop_hello_limit));
            return;
        }
    }
    memcpy(h->buf, hdr, hdr_len);
    h->len = hdr_len;
    h->retired = retired;
    h->came_on = kvx_ucx_came_on(r->core->ucx);
    snprintf(h->name, sizeof(h->name), "%s", m->u.hello.name);
    kvx_list_add_tail(&r->hellos, &h->link);
    r->nhellos++;
}

/* ---- after UCX progress: the connections of the HELLOs ------------------------------------- */

/* Make the connection of a HELLO that arrived: 0 when done with it (connected, refused or
 * dropped), 1 when the rates of new connections hold it back (it waits; force: fence, which
 * takes every HELLO that arrived before it, is not held back). */
/* The new connection rc of HELLO m is answered: how its read data travel (README,
 * "Rendezvous": by rendezvous only if the reader said it takes it, on lanes and from a size this
 * transport's mode chooses), its slot, and the HELLO_ACK. */
static void kvx_recv_hello_answer(kvx_recv_t *r, kvx_rconn_t *rc, const kvx_msg_t *m, uint64_t now)
{
    uint8_t ack[KVX_WIRE_HELLO_ACK_LEN];
    kvx_lanes_t lanes;
    char why[256];

    kvx_ucx_ep_describe(rc->ucx, &lanes);
    rc->seg = lanes.seg;
    rc->tcp = strncmp(lanes.am, "tcp", 3) == 0;
    rc->rndv_min = kvx_rndv_choose(&(kvx_rndv_in_t){.mode = r->core->rndv_mode,
                                                    .thresh = r->core->rndv_thresh,
                                                    .peer_takes = (m->flags & KVX_MSGF_RNDV) != 0,
                                                    .rndv_lanes = lanes.rndv,
                                                    .am_lanes = lanes.am,
                                                    .ucx_rndv = lanes.ucx_rndv,
                                                    .ucx_proto = lanes.ucx_proto},
                                   why, sizeof(why));
    kvx_slot_set(rc, rc->proven ? KVX_SLOT_FRESH : KVX_SLOT_UNPROVEN, now);
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_HELLO_ACK,
                                 .flags = kvx_core_takes_rndv(r->core) ? KVX_MSGF_RNDV : 0,
                                 .conn_id = rc->peer_conn_id,
                                 .token = rc->peer_token,
                                 .u.hello_ack = {.rconn_id = rc->id,
                                                 .token = rc->token,
                                                 .epoch = rc->w->epoch,
                                                 /* zero unless the region is owned */
                                                 .seg_token = r->core->seg_token,
                                                 /* the writer's PROOF must cover it */
                                                 .nonce = rc->proven ? NULL : rc->nonce}},
                    ack);
    kvx_rconn_ctl(rc, ack, sizeof(ack));
    kvx_info(r->core, "writer %s: connection %u over %s", rc->w->name, rc->id, lanes.am);
    kvx_debug(r->core, "writer %s: connection %u: read data over %s (rendezvous lanes '%s'): %s",
              rc->w->name, rc->id, lanes.am, lanes.rndv, why);
}

static int kvx_recv_hello(kvx_recv_t *r, const uint8_t *buf, size_t len,
                          const kvx_came_on_t *came_on, bool force)
{
    uint64_t now = kvx_now_ns();
    kvx_rconn_t *rc, *v = NULL;
    kvx_writer_t *w;
    kvx_msg_t m;
    bool over;

    if (kvx_wire_decode(buf, len, 0, &m) < 0 || m.type != KVX_MSG_HELLO)
        return 0; /* decoded once already */
    /* retired while it waited (kvx_fence_ex): refused as one that came after */
    if (!kvx_equal_ct(m.u.hello.capability, r->core->capability, sizeof(r->core->capability))) {
        kvx_recv_refuse_hello(r, buf, len, came_on);
        return 0;
    }
    if ((w = kvx_writer_get(&r->conns, m.u.hello.name)) == NULL) {
        kvx_count(r->core, NULL, KVX_CNT(drop_other));
        return 0;
    }
    /* how fast a HELLO may make this transport open an endpoint to the address it names: one
     * over the rate waits for it (a writer churning through adds is slowed, not failed) */
    if (!force && !kvx_hello_rate(&r->conns, w, now)) {
        kvx_debug(r->core, "writer %s: HELLO over the rate of new connections waits", w->name);
        return 1;
    }
    /* slots: a writer's name over its share gives up one of its own, a full table one of any */
    if (w->nopen >= KVX_RCONNS_PER_WRITER)
        v = kvx_slot_victim(&r->conns, w, now);
    else if (r->conns.nopen >= KVX_RCONNS_MAX)
        v = kvx_slot_victim(&r->conns, NULL, now);
    /* the victim gives way only once the new connection is made: a HELLO that makes none
     * (no memory, an address UCX refuses) closes nothing */
    if ((r->conns.nopen >= KVX_RCONNS_MAX && v == NULL) ||
        (rc = kvx_recv_hello_rconn(r, w, &m, came_on, false, &over)) == NULL) {
        kvx_count(r->core, w, KVX_CNT(drop_other));
        return 0;
    }
    if (over)
        kvx_count(r->core, w, KVX_CNT(catchup_over));
    if (v != NULL) {
        kvx_count(r->core, v->w, KVX_CNT(conns_evicted));
        kvx_info(r->core, "writer %s: connection %u gives its slot to a new one of %s", v->w->name,
                 v->id, w->name);
        kvx_rconn_close(v);
    }
    kvx_recv_hello_answer(r, rc, &m, now);
    return 0;
}

/* Make the connections of the HELLOs that arrived. */
unsigned kvx_recv_hellos(kvx_recv_t *r, bool force)
{
    unsigned n = 0;

    for (kvx_list_t *l = r->hellos.next, *next; l != &r->hellos; l = next) {
        kvx_hello_t *h = kvx_container_of(l, kvx_hello_t, link);
        next = l->next;
        if (h->retired)
            kvx_recv_refuse_hello(r, h->buf, h->len, &h->came_on);
        else if (kvx_recv_hello(r, h->buf, h->len, &h->came_on, force) == 1)
            continue; /* held back by the rates: it waits, in order */
        kvx_list_del(&h->link);
        r->nhellos--;
        free(h);
        n++;
    }
    return n;
}

/* ---- the proof of the secret --------------------------------------------------------------- */

void kvx_recv_proof(kvx_recv_t *r, const kvx_msg_t *m)
{
    kvx_rconn_t *rc = kvx_rconn_of(&r->conns, m);
    uint8_t mac[KVX_PROOF_LEN];

    if (rc == NULL)
        return;
    if (rc->proven) { /* none was asked for, or it came already */
        kvx_count(r->core, rc->w, KVX_CNT(drop_other));
        return;
    }
    kvx_wire_proof_mac(r->core->secret, r->core->secret_len, rc->nonce, rc->id, rc->token, mac);
    if (!kvx_equal_ct(mac, m->u.proof.mac, KVX_PROOF_LEN)) {
        kvx_count(r->core, rc->w, KVX_CNT(drop_unproven));
        kvx_info(r->core, "writer %s: connection %u: wrong proof, closed", rc->w->name, rc->id);
        kvx_rconn_close(rc);
        return;
    }
    rc->proven = true;
    kvx_slot_set(rc, KVX_SLOT_FRESH, kvx_now_ns());
}

/* With a secret: connections that did not prove it in time close (oldest first). Run after
 * each round of HELLOs and from the housekeeping, which an idle progress thread runs at least
 * once a second: an unproven connection lasts 2-3 s. */
void kvx_recv_housekeeping(kvx_recv_t *r, uint64_t now)
{
    kvx_rconns_housekeeping(&r->conns, now);
    while (!kvx_list_empty(&r->conns.slots[KVX_SLOT_UNPROVEN])) {
        kvx_rconn_t *rc =
            kvx_list_first(&r->conns.slots[KVX_SLOT_UNPROVEN], kvx_rconn_t, slot_link);
        if (now - rc->since_ns < KVX_PROOF_WAIT_NS)
            break;
        /* logged before counting: kvx_count's test of a NULL writer would otherwise let gcc's
         * -O2 -Wformat-overflow see a null name here (a receiving connection always has one) */
        kvx_info(r->core, "writer %s: connection %u did not prove the secret in time: closed",
                 rc->w->name, rc->id);
        kvx_count(r->core, rc->w, KVX_CNT(drop_unproven));
        kvx_rconn_close(rc);
    }
}
