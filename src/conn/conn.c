/*
 * The initiator's connections: one per peer, to the peer's worker, and their whole life: opened
 * from the peer's metadata (its process watched when on this host, its owned region mapped: map.c,
 * its HELLO sent), attached to its peer, wired once the HELLO_ACK comes (with a secret, after its
 * PROOF), failed (kvx_conn_fail: every failure path of a transfer ends here), lingering over tcp
 * while UCX still holds its sends, closed, freed (and, at the transport's close, every one freed
 * after the worker went). It tells its owner what happens through the kvx_conn_ops_t given at
 * open: UCX let go of a transfer's message, it has work (runs to post), it fails (its transfers
 * go), a receive of read data ended. It calls nothing above it by name.
 */
#include "conn/kvx_conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

/* the tokens a segment holds (segment.c) fit the fields that keep them */
_Static_assert(sizeof(((kvx_conn_t *)0)->seg_token) == KVX_SEG_TOKEN_LEN &&
                   sizeof(((kvx_core_t *)0)->seg_token) == KVX_SEG_TOKEN_LEN,
               "segment tokens");

void kvx_conns_init(kvx_conns_t *cs, kvx_core_t *core)
{
    cs->core = core;
    kvx_list_init(&cs->all);
    kvx_list_init(&cs->work);
}

void kvx_conn_maybe_free(kvx_conn_t *c)
{
    if (c->state != KVX_CONN_CLOSED || c->ucx_refs != 0)
        return;
    kvx_ucx_ep_free(c->ucx);
    c->ucx = NULL;
    if (c->pidfd >= 0) {
        close(c->pidfd);
        c->pidfd = -1;
    }
    if (c->peer != NULL || c->pins > 0)
        return; /* a failed connection stays visible on its peer until remove or re-add */
    kvx_list_del(&c->all_link);
    kvx_list_del(&c->work_link);
    free(c);
}

static void kvx_conn_closed(kvx_conn_t *c)
{
    c->state = KVX_CONN_CLOSED;
    c->core->conn_event = true;
    kvx_conn_maybe_free(c);
}

/*
 * Fail a connection: every transfer in flight on it fails at once (replies for them are dropped
 * from now on), the receiver is told goodbye when the handshake was done, and the endpoint is
 * closed, forced: the close makes UCX let go of what it held, so a write's failure is reported
 * once nothing reads its blocks any more. Its id is released: a message naming it is unknown
 * from now on. May free c (when it is detached from its peer).
 *
 * Over tcp with sends UCX still holds (a cut link, a stopped peer), the endpoint is not closed
 * yet: UCX's tcp transport (1.13 to 1.22) uses an endpoint after freeing it when one closed with
 * bytes queued later meets its peer's close. It lingers, unused, until UCX has sent what it holds
 * or reports the endpoint failed, or the transport closes. Its transfers are reported failed at
 * once all the same, so UCX may still read a failed write's blocks meanwhile (README).
 */
void kvx_conn_fail(kvx_conn_t *c, int err)
{
    bool linger;

    if (c->state != KVX_CONN_OPEN)
        return;
    c->state = KVX_CONN_CLOSING;
    c->err = err;
    c->core->conn_event = true;
    kvx_list_del(&c->work_link);
    kvx_idtab_release(&c->conns->ids, c->id);
    kvx_info(c->core, "connection to %s closing: %s", c->agent_name, kvx_strerror(err));
    /* with rendezvous receives in flight it does not linger: only the endpoint's close ends
     * them, and their reads are reported once they ended */
    linger = !c->core->closed && c->reqs > 0 && c->nread_rndvs == 0 &&
             strncmp(c->transport, "tcp", 3) == 0;
    c->lingering = linger;
    c->ops->on_failed(c, err); /* its transfers fail (or wait for a reconnection) */
    kvx_conn_unmap(c);         /* no copy runs outside the lock: nothing uses the mapping now */
    if (c->wired) {            /* best effort: a message the close purges is not missed */
        uint8_t bye[KVX_WIRE_HDR_LEN];
        kvx_msg_t m = {.type = KVX_MSG_BYE, .conn_id = c->rconn_id, .token = c->rconn_token};
        if (kvx_ucx_send_ctl(c->ucx, bye, kvx_wire_encode(&m, bye), &c->ucx_refs) == 1)
            c->reqs++;
    }
    if (linger) {
        kvx_info(c->core, "connection to %s: its endpoint closes once UCX has sent what it holds",
                 c->agent_name);
        return;
    }
    if (kvx_ucx_ep_close(c->ucx, &c->ucx_refs) == 0)
        kvx_conn_closed(c);
}

/* A lingering connection's endpoint closes now (forced). */
static void kvx_conn_end_linger(kvx_conn_t *c)
{
    if (!c->lingering)
        return;
    c->lingering = false;
    c->linger_over = false;
    if (kvx_ucx_ep_close(c->ucx, &c->ucx_refs) == 0)
        kvx_conn_closed(c);
}

void kvx_conn_release(kvx_conn_t *c, int err)
{
    c->peer = NULL;
    if (c->state == KVX_CONN_OPEN)
        kvx_conn_fail(c, err);
    else
        kvx_conn_maybe_free(c);
}

void kvx_conn_want_work(kvx_conn_t *c)
{
    if (!kvx_list_linked(&c->work_link))
        kvx_list_add_tail(&c->conns->work, &c->work_link);
}

/* Called from UCX callbacks: only record the error; the next step acts on it. */
void kvx_conn_error(kvx_conn_t *c, int status)
{
    if (c->lingering) { /* UCX gave up on it: closing it is safe now */
        c->linger_over = true;
        kvx_conn_want_work(c);
        return;
    }
    if (c->state != KVX_CONN_OPEN || c->pending_err != 0)
        return;
    c->pending_err = status != 0 ? status : -ECONNRESET;
    c->core->conn_event = true;
    kvx_info(c->core, "UCX reports connection to %s failed: %s", c->agent_name,
             kvx_strerror(c->pending_err));
    kvx_conn_want_work(c);
}

static void kvx_conn_handle_work(kvx_conn_t *c)
{
    kvx_list_del(&c->work_link);
    if (c->lingering && c->linger_over) {
        kvx_conn_end_linger(c);
        return;
    }
    if (c->state != KVX_CONN_OPEN)
        return;
    if (c->pending_err != 0)
        kvx_conn_fail(c, c->pending_err);
    else
        c->ops->on_work(c);
}

bool kvx_conn_awaits_peer(const kvx_conn_t *c)
{
    return c->state == KVX_CONN_OPEN &&
           (!c->wired || c->unacked > 0 || c->notices > 0 || c->reqs > 0 || c->nread_rndvs > 0);
}

void kvx_conn_attach(kvx_conn_t *c, kvx_peer_t *p)
{
    p->conn = c;
    c->peer = p;
    memcpy(p->last_agent, c->agent_name, sizeof(p->last_agent));
    p->last_base = c->remote_base;
    p->last_num_blocks = c->remote_num_blocks;
    p->last_generation = c->generation;
}

static kvx_conn_t *kvx_conn_new(kvx_conns_t *cs, const kvx_md_t *md)
{
    kvx_conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    if (getrandom(&c->token, sizeof(c->token), 0) != sizeof(c->token)) {
        free(c);
        return NULL;
    }
    c->conns = cs;
    c->core = cs->core;
    c->pidfd = -1;
    c->crc = cs->core->integrity;
    c->remote_base = md->base;
    c->remote_num_blocks = md->num_blocks;
    c->remote_len = md->num_blocks * md->block_len;
    c->generation = md->generation;
    c->host = md->host;
    memcpy(c->capability, md->capability, sizeof(c->capability));
    memcpy(c->agent_name, md->agent_name, sizeof(c->agent_name));
    for (int l = 0; l < KVX_PRIO_LEVELS; l++)
        kvx_list_init(&c->queue[l]);
    kvx_list_init(&c->waiting);
    kvx_list_init(&c->work_link);
    kvx_list_init(&c->all_link);
    kvx_list_init(&c->read_rndvs);
    return c;
}

/* ---- the handshake -------------------------------------------------------------------------- */

/* The handshake: present the capability from the receiver's metadata, this connection's id and
 * token (for the receiver's replies), where to reach this transport, and, with a secret, a
 * proof of it over all of that. The receiver answers HELLO_ACK, or nothing when it refuses. */
static int kvx_conn_hello(kvx_conn_t *c)
{
    kvx_core_t *core = c->core;
    kvx_send_t *s;
    const void *waddr;
    size_t waddr_len, len;
    kvx_msg_t m = {.type = KVX_MSG_HELLO,
                   .flags = (core->secret ? KVX_MSGF_PROOF : 0) |
                            (kvx_core_takes_rndv(core) ? KVX_MSGF_RNDV : 0),
                   .u.hello = {.capability = c->capability,
                               .conn_id = c->id,
                               .ep_sn = kvx_ucx_ep_sn(c->ucx),
                               .token = c->token,
                               .generation = core->generation}};
    int rc;

    kvx_ucx_local_address(core->ucx, &waddr, &waddr_len);
    if (waddr_len > KVX_WIRE_MAX_WADDR) {
        kvx_error(core, "ucx: this worker's address is %zu bytes", waddr_len);
        return -EINVAL;
    }
    s = kvx_ucx_send_get(c->ucx);
    if (s == NULL)
        return -ENOMEM;
    snprintf(m.u.hello.name, sizeof(m.u.hello.name), "%s", core->log.name);
    m.u.hello.waddr = waddr;
    m.u.hello.waddr_len = (uint32_t)waddr_len;
    len = kvx_wire_encode(&m, s->hdr);
    if (core->secret != NULL) {
        kvx_iov_t part = {s->hdr, len};
        kvx_hmac_sha256(core->secret, core->secret_len, &part, 1, s->hdr + len);
        len += KVX_PROOF_LEN;
    }
    s->named = true; /* the receiver's connection takes the endpoint paired with this one */
    rc = kvx_ucx_send(s, len, 0, &c->ucx_refs);
    if (rc == 1)
        c->reqs++;
    return rc < 0 ? rc : 0;
}

/* The receiver answered the handshake (ack_flags: its HELLO_ACK's): runs go by rendezvous from
 * now on as this transport's mode, the lanes and the receiver agree (it takes rendezvous
 * payloads: KVX_MSGF_RNDV), said at debug level with the reason. */
static void kvx_conn_wired(kvx_conn_t *c, unsigned ack_flags)
{
    char why[256];
    kvx_rndv_in_t in = {.mode = c->core->rndv_mode,
                        .thresh = c->core->rndv_thresh,
                        .peer_takes = (ack_flags & KVX_MSGF_RNDV) != 0,
                        .rndv_lanes = c->lanes.rndv,
                        .am_lanes = c->lanes.am,
                        .ucx_rndv = c->lanes.ucx_rndv,
                        .ucx_proto = c->lanes.ucx_proto};

    c->rndv_min = kvx_rndv_choose(&in, why, sizeof(why));
    /* by hardware RMA: runs over the threshold move by UCX's zero-copy rendezvous */
    c->rma_hw = c->rndv_min != UINT64_MAX && kvx_rndv_zcopy(&in);
    kvx_debug(c->core, "connection %u to %s: writes over %s (rendezvous lanes '%s'): %s", c->id,
              c->agent_name, c->lanes.am, c->lanes.rndv, why);
    c->wired = true;
    c->core->conn_event = true;
    /* transfers queued before the handshake carry the epoch it brought */
    for (int l = 0; l < KVX_PRIO_LEVELS; l++)
        for (kvx_list_t *n = c->queue[l].next; n != &c->queue[l]; n = n->next) {
            kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, conn_link);
            if (x->epoch == UINT64_MAX)
                x->epoch = c->epoch;
        }
    if (kvx_conn_queued(c))
        kvx_conn_want_work(c);
}

static const uint8_t kvx_zero_nonce[KVX_WIRE_NONCE_LEN];

/* The receiver asks for a proof of the secret over its fresh nonce (a recorded HELLO has none):
 * it goes before anything else on this endpoint. 0, or the send's negative errno. */
static int kvx_conn_prove(kvx_conn_t *c, const uint8_t *nonce)
{
    kvx_core_t *core = c->core;
    uint8_t pr[KVX_WIRE_PROOF_LEN], mac[KVX_PROOF_LEN];
    int rc;

    kvx_wire_proof_mac(core->secret, core->secret_len, nonce, c->rconn_id, c->rconn_token, mac);
    kvx_wire_encode(&(kvx_msg_t){.type = KVX_MSG_PROOF,
                                 .conn_id = c->rconn_id,
                                 .token = c->rconn_token,
                                 .u.proof.mac = mac},
                    pr);
    rc = kvx_ucx_send_ctl(c->ucx, pr, sizeof(pr), &c->ucx_refs);
    if (rc == 1)
        c->reqs++;
    return rc < 0 ? rc : 0;
}

void kvx_conn_hello_ack(kvx_conn_t *c, const kvx_msg_t *m)
{
    if (c->wired)
        return;
    if (m->u.hello_ack.status < 0) {
        int st = kvx_remote_status(m->u.hello_ack.status);
        kvx_warn(c->core, "peer %s refused the handshake: %s", c->agent_name, kvx_strerror(st));
        kvx_conn_error(c, st);
        return;
    }
    /* before anything is posted: no byte is copied into a mapping the token did not prove */
    kvx_conn_map_prove(c, m->u.hello_ack.seg_token);
    c->rconn_id = m->u.hello_ack.rconn_id;
    c->rconn_token = m->u.hello_ack.token;
    c->epoch = m->u.hello_ack.epoch;
    if (c->core->secret != NULL &&
        !kvx_equal_ct(m->u.hello_ack.nonce, kvx_zero_nonce, KVX_WIRE_NONCE_LEN)) {
        int rc = kvx_conn_prove(c, m->u.hello_ack.nonce);
        if (rc < 0) {
            kvx_conn_error(c, rc);
            return;
        }
    }
    kvx_conn_wired(c, m->flags);
}

void kvx_conn_fence(kvx_conn_t *c, const kvx_msg_t *m)
{
    /* later writes carry the new epoch; those submitted before are judged by the receiver */
    if (m->u.fence.epoch > c->epoch)
        c->epoch = m->u.fence.epoch;
}

kvx_conn_t *kvx_conn_of(kvx_conns_t *cs, const kvx_msg_t *m)
{
    kvx_conn_t *c = kvx_idtab_get(&cs->ids, m->conn_id);
    uint8_t a[8], b[8];

    if (c != NULL) {
        kvx_put64(a, c->token);
        kvx_put64(b, m->token);
    }
    if (c == NULL || c->state != KVX_CONN_OPEN || !kvx_equal_ct(a, b, 8)) {
        kvx_count_drop(cs->core, KVX_DROP_UNKNOWN);
        return NULL;
    }
    c->last_progress_ns = kvx_now_ns();
    return c;
}

/* ---- what its endpoint reports -------------------------------------------------------------- */

/* UCX is done with a message of c's (xfer_id: the transfer it carried, 0: none). */
static void kvx_conn_ep_sent(void *arg, uint64_t xfer_id, int status)
{
    kvx_conn_t *c = arg;

    if (--c->reqs == 0 && c->lingering) { /* all it held left: its endpoint may close */
        c->linger_over = true;
        kvx_conn_want_work(c);
    }
    c->ucx_refs--;
    c->last_progress_ns = kvx_now_ns();
    if (xfer_id != 0)
        c->ops->on_sent(c, xfer_id);
    if (c->state == KVX_CONN_OPEN) {
        if (status != 0)
            kvx_conn_error(c, status);
        else if (kvx_conn_queued(c))
            kvx_conn_want_work(c);
    }
    kvx_conn_maybe_free(c);
}

static void kvx_conn_ep_error(void *c, int status) { kvx_conn_error(c, status); }

/* The forced close completed. */
static void kvx_conn_ep_closed(void *arg)
{
    kvx_conn_t *c = arg;

    c->ucx_refs--;
    kvx_conn_closed(c);
}

static void kvx_conn_ep_received(void *arg, void *cookie, int status)
{
    kvx_conn_t *c = arg;
    kvx_read_rndv_t *rr = cookie;

    c->ucx_refs--;
    kvx_list_del(&rr->link);
    c->nread_rndvs--;
    c->read_rndv_done_ns = kvx_now_ns();
    c->ops->on_received(c, rr, status);
    kvx_conn_maybe_free(c);
}

int kvx_conn_recv(kvx_conn_t *c, kvx_read_rndv_t *rr, void *desc)
{
    int r;

    if (c->state != KVX_CONN_OPEN)
        return -ENOTCONN;
    if (c->nread_rndvs >= KVX_READ_RNDVS_PER_CONN)
        return -EBUSY;
    rr->since_ns = kvx_now_ns();
    kvx_list_add_tail(&c->read_rndvs, &rr->link);
    c->nread_rndvs++;
    r = kvx_ucx_recv(c->ucx, desc, rr->dest, rr->len, rr, &c->ucx_refs);
    if (r != 1) { /* landed at once, or not at all: the caller finishes */
        kvx_list_del(&rr->link);
        c->nread_rndvs--;
    }
    return r;
}

/* What a connection's endpoint reports (kvx_ucx_ep_open). */
static const kvx_ep_ops_t kvx_conn_ep_ops = {
    .on_sent = kvx_conn_ep_sent,
    .on_error = kvx_conn_ep_error,
    .on_closed = kvx_conn_ep_closed,
    .on_received = kvx_conn_ep_received,
};

int kvx_conn_open(kvx_conns_t *cs, const char *peer_id, const kvx_md_t *md,
                  const kvx_conn_ops_t *ops, void *owner, kvx_conn_t **c_p)
{
    kvx_conn_t *c = kvx_conn_new(cs, md);
    kvx_core_t *core = cs->core;
    int rc, watch;

    if (c == NULL)
        return -ENOMEM;
    c->ops = ops;
    c->owner = owner;
    watch = kvx_host_watch(&core->host, &md->host, &c->pidfd);
    if (watch < 0) {
        kvx_error(core, "peer %s (%s): its process %u on this host has exited", peer_id,
                  md->agent_name, (unsigned)md->host.pid);
        free(c);
        return watch;
    }
    c->watched = watch == 1;
    rc = kvx_idtab_alloc(&cs->ids, c, &c->id);
    if (rc == 0) {
        rc = kvx_ucx_ep_open(core->ucx, md->worker_addr, md->agent_name, &kvx_conn_ep_ops, c,
                             &c->ucx);
        if (rc < 0)
            kvx_idtab_release(&cs->ids, c->id);
    }
    if (rc < 0) {
        if (c->pidfd >= 0)
            close(c->pidfd);
        free(c);
        return rc;
    }
    kvx_ucx_ep_describe(c->ucx, &c->lanes);
    snprintf(c->transport, sizeof(c->transport), "%s", c->lanes.am);
    c->seg = c->lanes.seg;
    c->rndv_min = UINT64_MAX; /* until the receiver says what it takes (kvx_conn_wired) */
    if (md->rkey != NULL && c->watched)
        kvx_conn_map(c, md);
    kvx_list_add_tail(&cs->all, &c->all_link);
    c->last_progress_ns = kvx_now_ns();
    rc = kvx_conn_hello(c);
    if (rc < 0) {
        kvx_error(core, "peer %s (%s): handshake: %s", peer_id, md->agent_name, kvx_strerror(rc));
        kvx_conn_fail(c, rc);
        return rc;
    }
    *c_p = c;
    return 0;
}

/* ---- every connection ----------------------------------------------------------------------- */

unsigned kvx_conns_work(kvx_conns_t *cs)
{
    kvx_list_t todo;
    unsigned n = 0;

    kvx_list_splice_init(&cs->work, &todo);
    while (!kvx_list_empty(&todo)) {
        kvx_conn_handle_work(kvx_list_first(&todo, kvx_conn_t, work_link));
        n++;
    }
    return n;
}

/* Work that only polling can advance: UCX does not signal free space in a shared-memory FIFO. */
bool kvx_conns_need_polling(const kvx_conns_t *cs)
{
    if (!kvx_list_empty(&cs->work))
        return true;
    for (const kvx_list_t *n = cs->all.next; n != &cs->all; n = n->next) {
        const kvx_conn_t *c = kvx_container_of(n, kvx_conn_t, all_link);
        if (c->state != KVX_CONN_CLOSED && (c->reqs > 0 || kvx_conn_queued(c)))
            return true;
    }
    return false;
}

/*
 * Periodic checks of every open connection: a same-host peer whose process exited (UCX's
 * keepalive misses a zombie), and a connection whose outstanding operations have all been stuck
 * for stall_ns. Failing one never disturbs the list walk: failed connections stay listed.
 */
void kvx_conns_housekeeping(kvx_conns_t *cs, uint64_t now)
{
    uint64_t stall = cs->core->stall_ns;

    for (kvx_list_t *n = cs->all.next; n != &cs->all; n = n->next) {
        kvx_conn_t *c = kvx_container_of(n, kvx_conn_t, all_link);

        if (c->state != KVX_CONN_OPEN)
            continue;
        if (c->watched && !kvx_host_alive(&c->host, c->pidfd)) {
            kvx_info(c->core, "connection to %s: its process %u has exited", c->agent_name,
                     (unsigned)c->host.pid);
            kvx_conn_fail(c, -ECONNRESET);
        } else if (stall != 0 && kvx_conn_awaits_peer(c) && now > c->last_progress_ns &&
                   now - c->last_progress_ns > stall) {
            kvx_warn(c->core, "connection to %s made no progress for %llu ms: failing it",
                     c->agent_name, (unsigned long long)((now - c->last_progress_ns) / 1000000ull));
            kvx_conn_fail(c, -ETIMEDOUT);
        } else if (stall != 0 && c->nread_rndvs > 0 &&
                   kvx_stalled(kvx_list_first(&c->read_rndvs, kvx_read_rndv_t, link)->since_ns,
                               c->read_rndv_done_ns, now, stall)) {
            /* other messages may come meanwhile: a receive's own clock bounds it */
            kvx_warn(c->core,
                     "connection to %s: a rendezvous receive of read data made no progress "
                     "for the stall limit: failing it",
                     c->agent_name);
            kvx_conn_fail(c, -ETIMEDOUT);
        }
    }
}

/* Lingering endpoints close too: the worker goes with them, nothing of theirs runs again. */
void kvx_conns_end_lingers(kvx_conns_t *cs)
{
    for (kvx_list_t *n = cs->all.next, *next; n != &cs->all; n = next) {
        next = n->next;
        kvx_conn_end_linger(kvx_container_of(n, kvx_conn_t, all_link));
    }
}

bool kvx_conns_closing(const kvx_conns_t *cs)
{
    for (const kvx_list_t *n = cs->all.next; n != &cs->all; n = n->next) {
        const kvx_conn_t *c = kvx_container_of(n, kvx_conn_t, all_link);
        if (c->state == KVX_CONN_CLOSING || c->ucx_refs > 0)
            return true;
    }
    return false;
}

/* Keys of mapped regions belong to the worker: they go before it (every mapped connection has
 * failed, which let go of its key; this makes sure). */
void kvx_conns_unmap_all(kvx_conns_t *cs)
{
    for (kvx_list_t *n = cs->all.next; n != &cs->all; n = n->next)
        kvx_ucx_unmap(kvx_container_of(n, kvx_conn_t, all_link)->ucx);
}

/* The worker is gone: every connection goes, closed or not (nothing is left to release in UCX:
 * anything UCX still called back during the teardown found its connection alive). */
void kvx_conns_free_all(kvx_conns_t *cs)
{
    while (!kvx_list_empty(&cs->all)) {
        kvx_conn_t *c = kvx_list_first(&cs->all, kvx_conn_t, all_link);
        kvx_list_del(&c->all_link);
        if (c->state != KVX_CONN_CLOSED)
            kvx_warn(c->core, "connection to %s did not close in time", c->agent_name);
        kvx_ucx_ep_free(c->ucx);
        if (c->pidfd >= 0)
            close(c->pidfd);
        free(c);
    }
    free(cs->ids.slots);
    memset(&cs->ids, 0, sizeof(cs->ids));
}
