/*
 * The initiator's connections: one per peer, to the peer's worker. Its life: opened from the
 * peer's metadata (its process watched when on this host, its owned region mapped, its HELLO
 * sent), wired once the HELLO_ACK comes (xfer.c), failed (kvx_conn_fail: every failure path of a
 * transfer ends here), lingering over tcp while UCX still holds its sends, closed, freed. It
 * tells its owner what happens through the kvx_conn_ops_t given at open: UCX let go of a message,
 * it has work (runs to post), it fails (its transfers go). It calls nothing above it by name.
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
    c->t->core.conn_event = true;
    kvx_conn_maybe_free(c);
}

/* The forced close completed (its callback). */
void kvx_on_conn_closed(kvx_conn_t *c)
{
    c->ucx_refs--;
    kvx_conn_closed(c);
}

/* The mapping goes (a connection that failed has let go of it already); messages carry the
 * data from now on. */
static void kvx_conn_unmap(kvx_conn_t *c)
{
    char *suffix = strstr(c->transport, "-mapped");

    if (c->mapped == NULL && c->unproven == NULL)
        return;
    c->mapped = NULL;
    c->unproven = NULL;
    memset(c->seg_token, 0, sizeof(c->seg_token));
    kvx_ucx_unmap(c->ucx);
    if (suffix != NULL)
        *suffix = '\0';
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
    c->t->core.conn_event = true;
    kvx_list_del(&c->work_link);
    kvx_idtab_release(&c->t->conn_ids, c->id);
    kvx_info(&c->t->core, "connection to %s closing: %s", c->agent_name, kvx_strerror(err));
    /* with rendezvous receives in flight it does not linger: only the endpoint's close ends
     * them, and their reads are reported once they ended */
    linger =
        !c->t->core.closed && c->reqs > 0 && c->nrrxs == 0 && strncmp(c->transport, "tcp", 3) == 0;
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
        kvx_info(&c->t->core,
                 "connection to %s: its endpoint closes once UCX has sent what it holds",
                 c->agent_name);
        return;
    }
    if (kvx_ucx_ep_close(c->ucx, &c->ucx_refs) == 0)
        kvx_conn_closed(c);
}

/*
 * A peer on this host whose region kvx allocated: map it, so that transfers are copies by this
 * process (xfer.c) with no work by the peer. The mapping is unproven until the peer's HELLO_ACK
 * brings the token its segment holds (kvx_conn_map_prove); nothing is copied before. Without a
 * mapping (the key gives none, say over tcp), messages carry the data as for any region; a key
 * that names a segment kvx refuses (one of this process's own that is no owned region of its
 * transports, another process's, too small, without the owner's trailer) is counted
 * (kvx_transport_attr_t.maps_refused).
 */
static void kvx_conn_map(kvx_conn_t *c, const kvx_md_t *md)
{
    kvx_transport_t *t = c->t;
    void *ptr;
    int rc;

    rc = kvx_ucx_map(c->ucx, md->rkey, md->rkey_len, md->base, c->remote_len, md->host.pid, &ptr,
                     c->seg_token);
    if (rc < 0) {
        if (rc == -EPERM)
            t->core.maps_refused++;
        kvx_info(&t->core, "peer %s: its region gives no mapping here; messages carry the data",
                 md->agent_name);
        return;
    }
    c->unproven = ptr;
}

void kvx_conn_map_prove(kvx_conn_t *c, const uint8_t *token)
{
    size_t n;

    if (c->unproven == NULL)
        return;
    if (!kvx_seg_token_ok(c->seg_token, token)) {
        kvx_warn(&c->t->core,
                 "peer %s: its handshake does not bring the token of the segment its region key "
                 "names: not mapped, messages carry the data",
                 c->agent_name);
        c->t->core.maps_refused++;
        kvx_conn_unmap(c);
        return;
    }
    c->mapped = c->unproven;
    c->unproven = NULL;
    n = strlen(c->transport);
    snprintf(c->transport + n, sizeof(c->transport) - n, "-mapped");
}

/* Bytes prefaulted between two looks at the connection and the transport. */
#define KVX_PREFAULT_STEP ((size_t)64 << 20)

/*
 * Fault the mapped region's pages in here (without changing a byte: MADV_POPULATE_WRITE), so
 * that the first transfer does not pay for them (this also commits the owner's shared pages
 * that nobody touched yet). Runs with the lock released (c pinned by the caller), 64 MiB at a
 * time: between steps it stops if the transport closes or the connection failed (which let go
 * of the mapping). If the kernel refuses (no memory for the pages), the mapping is dropped and
 * messages carry the data: a copy must never meet a page that cannot be had.
 */
void kvx_conn_prefault(kvx_conn_t *c)
{
    kvx_transport_t *t = c->t;
    uintptr_t start = (uintptr_t)c->mapped & ~(uintptr_t)4095;
    size_t len = (size_t)c->remote_len + ((uintptr_t)c->mapped & 4095), off = 0;
    uint64_t t0 = kvx_now_ns();
    int rc = 0;

    t->core.unlocked_calls++;
    while (off < len && rc == 0 && !t->core.closed && c->state == KVX_CONN_OPEN &&
           c->mapped != NULL) {
        size_t n = len - off < KVX_PREFAULT_STEP ? len - off : KVX_PREFAULT_STEP;
        kvx_unlock(&t->core);
        rc = madvise((void *)(start + off), n, MADV_POPULATE_WRITE) == 0 ? 0 : -errno;
        kvx_lock(&t->core);
        off += n;
    }
    t->core.unlocked_calls--;
    if (t->core.closed) {
        pthread_cond_broadcast(&t->core.cond); /* close waits for busy calls to leave */
        return;
    }
    if (c->state != KVX_CONN_OPEN || c->mapped == NULL)
        return;
    if (rc < 0 && rc != -EINVAL) { /* EINVAL: a kernel without MADV_POPULATE_WRITE */
        kvx_warn(&t->core,
                 "peer %s: its region's pages cannot be had here (%s): messages carry the data",
                 c->agent_name, kvx_strerror(rc));
        kvx_conn_unmap(c);
        return;
    }
    kvx_info(&t->core, "peer %s: its mapped region (%zu bytes) prefaulted in %.1f ms",
             c->agent_name, len, (double)(kvx_now_ns() - t0) / 1e6);
}

/* A lingering connection's endpoint closes now (forced). */
void kvx_conn_end_linger(kvx_conn_t *c)
{
    if (!c->lingering)
        return;
    c->lingering = false;
    c->linger_over = false;
    if (kvx_ucx_ep_close(c->ucx, &c->ucx_refs) == 0)
        kvx_conn_closed(c);
}

/* Detach a connection from its peer and make sure it goes away. May free c. */
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
        kvx_list_add_tail(&c->t->work, &c->work_link);
}

/* Called from UCX callbacks: only record the error; kvx_conn_handle_work acts on it. */
void kvx_on_conn_error(kvx_conn_t *c, int status)
{
    if (c->lingering) { /* UCX gave up on it: closing it is safe now */
        c->linger_over = true;
        kvx_conn_want_work(c);
        return;
    }
    if (c->state != KVX_CONN_OPEN || c->pending_err != 0)
        return;
    c->pending_err = status != 0 ? status : -ECONNRESET;
    c->t->core.conn_event = true;
    kvx_info(&c->t->core, "UCX reports connection to %s failed: %s", c->agent_name,
             kvx_strerror(c->pending_err));
    kvx_conn_want_work(c);
}

void kvx_conn_handle_work(kvx_conn_t *c)
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

/* This connection waits for its peer: the handshake, replies to what it posted, messages UCX
 * has not sent yet. */
bool kvx_conn_busy(const kvx_conn_t *c)
{
    return c->state == KVX_CONN_OPEN &&
           (!c->wired || c->unacked > 0 || c->notices > 0 || c->reqs > 0 || c->nrrxs > 0);
}

/*
 * Periodic checks of every open connection: a same-host peer whose process exited (UCX's
 * keepalive misses a zombie), and a connection whose outstanding operations have all been stuck
 * for stall_ns. Failing one never disturbs the list walk: failed connections stay listed.
 */
void kvx_conn_housekeeping(kvx_transport_t *t, uint64_t now)
{
    for (kvx_list_t *n = t->conns.next; n != &t->conns; n = n->next) {
        kvx_conn_t *c = kvx_container_of(n, kvx_conn_t, all_link);

        if (c->state != KVX_CONN_OPEN)
            continue;
        if (c->watched && !kvx_host_alive(&c->host, c->pidfd)) {
            kvx_info(&t->core, "connection to %s: its process %u has exited", c->agent_name,
                     (unsigned)c->host.pid);
            kvx_conn_fail(c, -ECONNRESET);
        } else if (t->core.stall_ns != 0 && kvx_conn_busy(c) && now > c->last_progress_ns &&
                   now - c->last_progress_ns > t->core.stall_ns) {
            kvx_warn(&t->core, "connection to %s made no progress for %llu ms: failing it",
                     c->agent_name, (unsigned long long)((now - c->last_progress_ns) / 1000000ull));
            kvx_conn_fail(c, -ETIMEDOUT);
        } else if (t->core.stall_ns != 0 && c->nrrxs > 0 &&
                   kvx_stalled(kvx_list_first(&c->rrxs, kvx_rrx_t, link)->since_ns, c->rrx_done_ns,
                               now, t->core.stall_ns)) {
            /* other messages may come meanwhile: a receive's own clock bounds it */
            kvx_warn(&t->core,
                     "connection to %s: a rendezvous receive of read data made no progress "
                     "for the stall limit: failing it",
                     c->agent_name);
            kvx_conn_fail(c, -ETIMEDOUT);
        }
    }
}

static kvx_conn_t *kvx_conn_new(kvx_transport_t *t, const kvx_md_t *md)
{
    kvx_conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    if (getrandom(&c->token, sizeof(c->token), 0) != sizeof(c->token)) {
        free(c);
        return NULL;
    }
    c->t = t;
    c->pidfd = -1;
    c->crc = t->core.integrity;
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
    kvx_list_init(&c->fail_link);
    kvx_list_init(&c->rrxs);
    return c;
}

/* The handshake: present the capability from the receiver's metadata, this connection's id and
 * token (for the receiver's replies), where to reach this transport, and, with a secret, a
 * proof of it over all of that. The receiver answers HELLO_ACK, or nothing when it refuses. */
static int kvx_conn_hello(kvx_conn_t *c)
{
    kvx_transport_t *t = c->t;
    kvx_send_t *s;
    const void *waddr;
    size_t waddr_len, len;
    kvx_msg_t m = {.type = KVX_MSG_HELLO,
                   .flags = (t->core.secret ? KVX_MSGF_PROOF : 0) |
                            (kvx_core_takes_rndv(&t->core) ? KVX_MSGF_RNDV : 0),
                   .u.hello = {.capability = c->capability,
                               .conn_id = c->id,
                               .ep_sn = kvx_ucx_ep_sn(c->ucx),
                               .token = c->token,
                               .generation = t->core.generation}};
    int rc;

    kvx_ucx_local_address(t->core.ucx, &waddr, &waddr_len);
    if (waddr_len > KVX_WIRE_MAX_WADDR) {
        kvx_error(&t->core, "ucx: this worker's address is %zu bytes", waddr_len);
        return -EINVAL;
    }
    s = kvx_ucx_send_get(c->ucx);
    if (s == NULL)
        return -ENOMEM;
    snprintf(m.u.hello.name, sizeof(m.u.hello.name), "%s", t->core.log.name);
    m.u.hello.waddr = waddr;
    m.u.hello.waddr_len = (uint32_t)waddr_len;
    len = kvx_wire_encode(&m, s->hdr);
    if (t->core.secret != NULL) {
        kvx_iov_t part = {s->hdr, len};
        kvx_hmac_sha256(t->core.secret, t->core.secret_len, &part, 1, s->hdr + len);
        len += KVX_PROOF_LEN;
    }
    s->named = true; /* the receiver's connection takes the endpoint paired with this one */
    rc = kvx_ucx_send(s, len, 0, &c->ucx_refs);
    if (rc == 1)
        c->reqs++;
    return rc < 0 ? rc : 0;
}

void kvx_conn_wired(kvx_conn_t *c, unsigned ack_flags)
{
    kvx_transport_t *t = c->t;
    char why[256];
    kvx_rndv_in_t in = {.mode = t->core.rndv_mode,
                        .thresh = t->core.rndv_thresh,
                        .peer_takes = (ack_flags & KVX_MSGF_RNDV) != 0,
                        .rndv_lanes = c->lanes.rndv,
                        .am_lanes = c->lanes.am,
                        .ucx_rndv = c->lanes.ucx_rndv,
                        .ucx_proto = c->lanes.ucx_proto};

    c->rndv_min = kvx_rndv_choose(&in, why, sizeof(why));
    /* by hardware RMA: runs over the threshold move by UCX's zero-copy rendezvous */
    c->rma_hw = c->rndv_min != UINT64_MAX && kvx_rndv_zcopy(&in);
    kvx_debug(&t->core, "connection %u to %s: writes over %s (rendezvous lanes '%s'): %s", c->id,
              c->agent_name, c->lanes.am, c->lanes.rndv, why);
    c->wired = true;
}

static void kvx_conn_ep_sent(void *c, uint64_t xfer_id, int status)
{
    kvx_conn_t *conn = c;
    conn->ops->on_sent(conn, xfer_id, status);
}
static void kvx_conn_ep_error(void *c, int status) { kvx_on_conn_error(c, status); }
static void kvx_conn_ep_closed(void *c) { kvx_on_conn_closed(c); }

static void kvx_conn_ep_received(void *arg, void *cookie, int status)
{
    kvx_conn_t *c = arg;
    kvx_rrx_t *rx = cookie;

    c->ucx_refs--;
    kvx_list_del(&rx->link);
    c->nrrxs--;
    c->rrx_done_ns = kvx_now_ns();
    c->ops->on_received(c, rx, status);
    kvx_conn_maybe_free(c);
}

int kvx_conn_recv(kvx_conn_t *c, kvx_rrx_t *rx, void *desc)
{
    int r;

    if (c->state != KVX_CONN_OPEN)
        return -ENOTCONN;
    if (c->nrrxs >= KVX_RRXS_PER_CONN)
        return -EBUSY;
    rx->since_ns = kvx_now_ns();
    kvx_list_add_tail(&c->rrxs, &rx->link);
    c->nrrxs++;
    r = kvx_ucx_recv(c->ucx, desc, rx->dest, rx->len, rx, &c->ucx_refs);
    if (r != 1) { /* landed at once, or not at all: the caller finishes */
        kvx_list_del(&rx->link);
        c->nrrxs--;
    }
    return r;
}

/* What a connection's endpoint reports (kvx_ucx_ep_open): sends to its owner, the rest here. */
static const kvx_ep_ops_t kvx_conn_ep_ops = {
    .on_sent = kvx_conn_ep_sent,
    .on_error = kvx_conn_ep_error,
    .on_closed = kvx_conn_ep_closed,
    .on_received = kvx_conn_ep_received,
};

int kvx_conn_open(kvx_transport_t *t, const char *peer_id, const kvx_md_t *md,
                  const kvx_conn_ops_t *ops, kvx_conn_t **c_p)
{
    kvx_conn_t *c = kvx_conn_new(t, md);
    int rc, watch;

    if (c == NULL)
        return -ENOMEM;
    c->ops = ops;
    watch = kvx_host_watch(&t->core.host, &md->host, &c->pidfd);
    if (watch < 0) {
        kvx_error(&t->core, "peer %s (%s): its process %u on this host has exited", peer_id,
                  md->agent_name, (unsigned)md->host.pid);
        free(c);
        return watch;
    }
    c->watched = watch == 1;
    rc = kvx_idtab_alloc(&t->conn_ids, c, &c->id);
    if (rc == 0) {
        rc = kvx_ucx_ep_open(t->core.ucx, md->worker_addr, md->agent_name, &kvx_conn_ep_ops, c,
                             &c->ucx);
        if (rc < 0)
            kvx_idtab_release(&t->conn_ids, c->id);
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
    kvx_list_add_tail(&t->conns, &c->all_link);
    c->last_progress_ns = kvx_now_ns();
    rc = kvx_conn_hello(c);
    if (rc < 0) {
        kvx_error(&t->core, "peer %s (%s): handshake: %s", peer_id, md->agent_name,
                  kvx_strerror(rc));
        kvx_conn_fail(c, rc);
        return rc;
    }
    *c_p = c;
    return 0;
}
