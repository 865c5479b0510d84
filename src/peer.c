/*
 * Peers and their connections: add, remove, replace, the compatibility rules, and how a
 * connection fails and closes (every failure path of a transfer ends in kvx_conn_fail).
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

/* How long kvx_peer_add waits for the wire-up before letting it finish in the background. */
#define KVX_CONNECT_WAIT_NS (200ull * 1000000ull)
/* How long removing or replacing a peer waits for its old connection to close. */
#define KVX_CLOSE_WAIT_NS (2ull * 1000000000ull)

/* ---- compatibility rules -------------------------------------------------------------------- */

/* The compatibility rules of kvx_peer_add. Returns 0, or the error with *why saying which rule. */
int kvx_peer_check(const kvx_transport_t *t, const kvx_md_t *md, const kvx_peer_params_t *expect,
                   const char **why)
{
    if (strcmp(md->agent_name, t->name) == 0) {
        *why = "the metadata is this transport's own (same agent name)";
        return -EEXIST;
    }
    if (expect != NULL && (expect->field_mask & KVX_PEER_PARAM_EXPECT_REGION) &&
        (expect->base_addr != md->base || expect->num_blocks != md->num_blocks ||
         expect->block_len != md->block_len)) {
        *why = "base address, block count or block length disagree with the metadata";
        return -EINVAL;
    }
    if (md->block_len != t->block_len) {
        *why = "block length differs from ours";
        return -KVX_EINCOMPAT;
    }
    if (md->fingerprint[0] != '\0' && t->fingerprint[0] != '\0' &&
        strcmp(md->fingerprint, t->fingerprint) != 0) {
        *why = "config fingerprint differs from ours";
        return -KVX_EINCOMPAT;
    }
    return 0;
}

/* ---- connections ---------------------------------------------------------------------------- */

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
    c->t->conn_event = true;
    kvx_conn_maybe_free(c);
}

/* The forced close completed (its callback). */
void kvx_on_conn_closed(kvx_conn_t *c)
{
    c->ucx_refs--;
    kvx_conn_closed(c);
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
static void kvx_conn_unmap(kvx_conn_t *c);

void kvx_conn_fail(kvx_conn_t *c, int err)
{
    bool linger;

    if (c->state != KVX_CONN_OPEN)
        return;
    c->state = KVX_CONN_CLOSING;
    c->err = err;
    c->t->conn_event = true;
    /* a peer paired by address pairs again (listen.c); its transfers in flight fail all the
     * same, but those of a connection that never finished its handshake sent nothing: they
     * wait for the next one */
    if (c->peer != NULL && c->peer->conn == c && c->peer->addr != NULL && !c->t->closed) {
        kvx_listen_peer_lost(c->t, c->peer, err);
        kvx_xfer_repark(c, c->peer);
    }
    kvx_list_del(&c->work_link);
    kvx_idtab_release(&c->t->conn_ids, c->id);
    kvx_info(c->t, "connection to %s closing: %s", c->agent_name, kvx_strerror(err));
    linger = !c->t->closed && c->reqs > 0 && strncmp(c->transport, "tcp", 3) == 0;
    c->lingering = linger;
    kvx_xfer_fail_conn(c, err);
    kvx_conn_unmap(c); /* no copy runs outside the lock: nothing uses the mapping now */
    if (c->wired) {    /* best effort: a message the close purges is not missed */
        uint8_t bye[KVX_WIRE_HDR_LEN];
        kvx_wire_put_hdr(bye, KVX_MSG_BYE, 0, c->rconn_id, c->rconn_token);
        if (kvx_ucx_send_ctl(c->ucx, bye, sizeof(bye), &c->ucx_refs) == 1)
            c->reqs++;
    }
    if (linger) {
        kvx_info(c->t, "connection to %s: its endpoint closes once UCX has sent what it holds",
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
            t->maps_refused++;
        kvx_info(t, "peer %s: its region gives no mapping here; messages carry the data",
                 md->agent_name);
        return;
    }
    c->unproven = ptr;
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

void kvx_conn_map_prove(kvx_conn_t *c, const uint8_t *token)
{
    size_t n;

    if (c->unproven == NULL)
        return;
    if (!kvx_seg_token_ok(c->seg_token, token)) {
        kvx_warn(c->t,
                 "peer %s: its handshake does not bring the token of the segment its region key "
                 "names: not mapped, messages carry the data",
                 c->agent_name);
        c->t->maps_refused++;
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
static void kvx_conn_prefault(kvx_conn_t *c)
{
    kvx_transport_t *t = c->t;
    uintptr_t start = (uintptr_t)c->mapped & ~(uintptr_t)4095;
    size_t len = (size_t)c->remote_len + ((uintptr_t)c->mapped & 4095), off = 0;
    uint64_t t0 = kvx_now_ns();
    int rc = 0;

    t->busy++;
    while (off < len && rc == 0 && !t->closed && c->state == KVX_CONN_OPEN && c->mapped != NULL) {
        size_t n = len - off < KVX_PREFAULT_STEP ? len - off : KVX_PREFAULT_STEP;
        kvx_unlock(t);
        rc = madvise((void *)(start + off), n, MADV_POPULATE_WRITE) == 0 ? 0 : -errno;
        kvx_lock(t);
        off += n;
    }
    t->busy--;
    if (t->closed) {
        pthread_cond_broadcast(&t->cond); /* close waits for busy calls to leave */
        return;
    }
    if (c->state != KVX_CONN_OPEN || c->mapped == NULL)
        return;
    if (rc < 0 && rc != -EINVAL) { /* EINVAL: a kernel without MADV_POPULATE_WRITE */
        kvx_warn(t, "peer %s: its region's pages cannot be had here (%s): messages carry the data",
                 c->agent_name, kvx_strerror(rc));
        kvx_conn_unmap(c);
        return;
    }
    kvx_info(t, "peer %s: its mapped region (%zu bytes) prefaulted in %.1f ms", c->agent_name, len,
             (double)(kvx_now_ns() - t0) / 1e6);
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

/* Called from UCX callbacks: only record the error; kvx_conn_handle_work acts on it. */
void kvx_on_conn_error(kvx_conn_t *c, int status)
{
    if (c->lingering) { /* UCX gave up on it: closing it is safe now */
        c->linger_over = true;
        if (!kvx_list_linked(&c->work_link))
            kvx_list_add_tail(&c->t->work, &c->work_link);
        return;
    }
    if (c->state != KVX_CONN_OPEN || c->pending_err != 0)
        return;
    c->pending_err = status != 0 ? status : -ECONNRESET;
    c->t->conn_event = true;
    kvx_info(c->t, "UCX reports connection to %s failed: %s", c->agent_name,
             kvx_strerror(c->pending_err));
    if (!kvx_list_linked(&c->work_link))
        kvx_list_add_tail(&c->t->work, &c->work_link);
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
        kvx_xfer_post(c, SIZE_MAX);
}

/* This connection waits for its peer: the handshake, replies to what it posted, messages UCX
 * has not sent yet. */
bool kvx_conn_busy(const kvx_conn_t *c)
{
    return c->state == KVX_CONN_OPEN &&
           (!c->wired || c->unacked > 0 || c->notices > 0 || c->reqs > 0);
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
            kvx_info(t, "connection to %s: its process %u has exited", c->agent_name,
                     (unsigned)c->host.pid);
            kvx_conn_fail(c, -ECONNRESET);
        } else if (t->stall_ns != 0 && kvx_conn_busy(c) && now > c->last_progress_ns &&
                   now - c->last_progress_ns > t->stall_ns) {
            kvx_warn(t, "connection to %s made no progress for %llu ms: failing it", c->agent_name,
                     (unsigned long long)((now - c->last_progress_ns) / 1000000ull));
            kvx_conn_fail(c, -ETIMEDOUT);
        }
    }
}

/*
 * Wait with the lock released until c is no longer open-and-unwired (wait_wired) or no longer
 * closing (otherwise), the transport closes, or until_ns. c is pinned meanwhile: it stays
 * allocated. Lock held on entry and on return.
 */
static void kvx_conn_wait(kvx_conn_t *c, bool wait_wired, uint64_t until_ns)
{
    kvx_transport_t *t = c->t;

    c->pins++;
    t->busy++;
    while (!t->closed && kvx_now_ns() < until_ns &&
           (wait_wired ? c->state == KVX_CONN_OPEN && !c->wired && c->pending_err == 0
                       : c->state == KVX_CONN_CLOSING && !c->lingering))
        kvx_progress_wait_event(t, until_ns);
    t->busy--;
    c->pins--;
    if (t->closed)
        pthread_cond_broadcast(&t->cond); /* close waits for busy calls to leave */
}

/*
 * Adds and removes of one peer id run one after the other, in call order, although they wait
 * with the lock released: without this, a slow add of stale metadata that began first could
 * install its connection after a quick add of fresh metadata, and win. Returns 0 when it is the
 * caller's turn, or -ESHUTDOWN (the transport closes; the queue does not matter any more).
 */
static int kvx_peer_turn_begin(kvx_transport_t *t, kvx_peer_t *p)
{
    uint64_t ticket = p->turn_next++;

    t->busy++;
    while (p->turn_now != ticket && !t->closed)
        kvx_progress_wait_event(t, kvx_now_ns() + 10000000ull);
    t->busy--;
    if (t->closed) {
        pthread_cond_broadcast(&t->cond); /* close waits for busy calls to leave */
        return -ESHUTDOWN;
    }
    return 0;
}

static void kvx_peer_turn_end(kvx_transport_t *t, kvx_peer_t *p)
{
    p->turn_now++;
    if (p->turn_now != p->turn_next)
        pthread_cond_broadcast(&t->cond); /* the next add or remove of this id */
}

/* ---- public API ----------------------------------------------------------------------------- */

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
    c->crc = t->integrity;
    c->remote_base = md->base;
    c->remote_num_blocks = md->num_blocks;
    c->remote_len = md->num_blocks * md->block_len;
    c->generation = md->generation;
    c->host = md->host;
    memcpy(c->capability, md->capability, sizeof(c->capability));
    memcpy(c->agent_name, md->agent_name, sizeof(c->agent_name));
    kvx_list_init(&c->queue);
    kvx_list_init(&c->waiting);
    kvx_list_init(&c->work_link);
    kvx_list_init(&c->all_link);
    kvx_list_init(&c->fail_link);
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
    size_t waddr_len, name_len = strlen(t->name), len;
    int rc;

    kvx_ucx_local_address(t, &waddr, &waddr_len);
    len = KVX_WIRE_HELLO_LEN + name_len + waddr_len;
    if (waddr_len > KVX_WIRE_MAX_WADDR) {
        kvx_error(t, "ucx: this worker's address is %zu bytes", waddr_len);
        return -EINVAL;
    }
    s = kvx_ucx_send_get(c->ucx);
    if (s == NULL)
        return -ENOMEM;
    memset(s->hdr, 0, KVX_WIRE_HELLO_LEN);
    kvx_wire_put_hdr(s->hdr, KVX_MSG_HELLO, t->secret ? KVX_MSGF_PROOF : 0, 0, 0);
    memcpy(s->hdr + 16, c->capability, 16);
    kvx_put32(s->hdr + 32, c->id);
    kvx_put32(s->hdr + 36, kvx_ucx_ep_sn(c->ucx));
    kvx_put64(s->hdr + 40, c->token);
    kvx_put64(s->hdr + 48, t->generation);
    s->hdr[56] = (uint8_t)name_len;
    kvx_put32(s->hdr + 60, (uint32_t)waddr_len);
    memcpy(s->hdr + KVX_WIRE_HELLO_LEN, t->name, name_len);
    memcpy(s->hdr + KVX_WIRE_HELLO_LEN + name_len, waddr, waddr_len);
    if (t->secret != NULL) {
        kvx_iov_t part = {s->hdr, len};
        kvx_hmac_sha256(t->secret, t->secret_len, &part, 1, s->hdr + len);
        len += KVX_PROOF_LEN;
    }
    rc = kvx_ucx_send(s, len, 0, &c->ucx_refs);
    if (rc == 1)
        c->reqs++;
    return rc < 0 ? rc : 0;
}

/* Detach a connection from its peer, fail it, and wait (lock released) for it to close, so that
 * its transfers have failed when kvx_peer_add / kvx_peer_remove return. */
/*
 * A new connection from md: its process watched when on this host, its endpoint, its mapping of
 * an owned region, listed, and its handshake sent. Not yet any peer's. Returns 0 with *c_p set,
 * or a negative errno (logged for peer_id) with nothing of it left to the caller.
 */
static int kvx_conn_open(kvx_transport_t *t, const char *peer_id, const kvx_md_t *md,
                         kvx_conn_t **c_p)
{
    kvx_conn_t *c = kvx_conn_new(t, md);
    int rc, watch;

    if (c == NULL)
        return -ENOMEM;
    watch = kvx_host_watch(&t->host, &md->host, &c->pidfd);
    if (watch < 0) {
        kvx_error(t, "peer %s (%s): its process %u on this host has exited", peer_id,
                  md->agent_name, (unsigned)md->host.pid);
        free(c);
        return watch;
    }
    c->watched = watch == 1;
    rc = kvx_idtab_alloc(&t->conn_ids, c, &c->id);
    if (rc == 0) {
        rc = kvx_ucx_ep_open(t, md->worker_addr, md->agent_name, &kvx_xfer_ep_ops, c, &c->ucx);
        if (rc < 0)
            kvx_idtab_release(&t->conn_ids, c->id);
    }
    if (rc < 0) {
        if (c->pidfd >= 0)
            close(c->pidfd);
        free(c);
        return rc;
    }
    kvx_ucx_ep_describe(c->ucx, c->transport, sizeof(c->transport), &c->rma_hw, &c->seg);
    if (md->rkey != NULL && c->watched)
        kvx_conn_map(c, md);
    kvx_list_add_tail(&t->conns, &c->all_link);
    c->last_progress_ns = kvx_now_ns();
    rc = kvx_conn_hello(c);
    if (rc < 0) {
        kvx_error(t, "peer %s (%s): handshake: %s", peer_id, md->agent_name, kvx_strerror(rc));
        kvx_conn_fail(c, rc);
        return rc;
    }
    *c_p = c;
    return 0;
}

/*
 * Whether a blob of generation gen is refused as stale for peer p: only while p's connection is
 * healthy (open, answered its handshake, no error, not pairing again) and of a later generation.
 * A stale copy of the metadata of a process since restarted cannot take the id from its live
 * successor; but a connection that failed or never answered holds nothing: a peer whose clock
 * stepped back, or one forged blob of generation 2^64-1 (without a secret, any holder of the
 * metadata can make one), keeps the id no longer than the connection it made stays healthy.
 * Answers of a listener (kvx_peer_connect, a reconnection) are never stale: the address is
 * authoritative, whatever the generation.
 */
static bool kvx_peer_stale(const kvx_peer_t *p, uint64_t gen)
{
    const kvx_conn_t *c = p->conn;

    return c != NULL && gen < c->generation && c->state == KVX_CONN_OPEN && c->wired &&
           c->pending_err == 0 && !p->reconnecting;
}

static void kvx_conn_retire(kvx_conn_t *old, int err)
{
    old->pins++;
    kvx_conn_release(old, err);
    kvx_conn_wait(old, false, kvx_now_ns() + KVX_CLOSE_WAIT_NS);
    old->pins--;
    kvx_conn_maybe_free(old);
}

int kvx_peer_add(kvx_transport_t *t, const char *peer_id, const void *metadata, size_t metadata_len,
                 const kvx_peer_params_t *params)
{
    return kvx_peer_add_at(t, peer_id, metadata, metadata_len, params, NULL);
}

/* kvx_peer_add; addr: where the peer listens (kvx_peer_connect), or NULL (a metadata blob). */
int kvx_peer_add_at(kvx_transport_t *t, const char *peer_id, const void *metadata,
                    size_t metadata_len, const kvx_peer_params_t *params, const char *addr)
{
    char *addr_copy = NULL;
    kvx_md_t md;
    kvx_conn_t *c, *old;
    kvx_peer_t *p;
    const char *why;
    int rc;

    if (t == NULL || !kvx_peer_id_ok(peer_id) || (metadata == NULL && metadata_len != 0) ||
        (params != NULL && (params->field_mask & KVX_PEER_PARAM_FLAGS) &&
         (params->flags & ~(uint32_t)KVX_PEER_ADD_PURGE)))
        return -EINVAL;
    rc = kvx_md_decode(metadata, metadata_len, &md);
    if (rc < 0) {
        kvx_error(t, "peer %s: metadata rejected: %s", peer_id, kvx_strerror(rc));
        return rc;
    }
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    /* with a secret, nothing of the blob reaches UCX's parsers unless it was signed with it */
    rc = kvx_md_verify(metadata, metadata_len, &md, t->secret, t->secret_len);
    if (rc < 0) {
        kvx_error(t, "peer %s (%s) rejected: %s", peer_id, md.agent_name,
                  t->secret ? "metadata not signed with this transport's secret"
                            : "the peer requires a shared secret and this transport has none");
        goto out;
    }
    rc = kvx_peer_check(t, &md, params, &why);
    if (rc < 0) {
        kvx_error(t, "peer %s (%s) rejected: %s", peer_id, md.agent_name, why);
        goto out;
    }
    /* A new id gets its entry now, invisible until a connection is installed: it holds the
     * queue of adds and removes of that id. */
    p = kvx_peer_lookup(t, peer_id);
    if (p == NULL && (p = kvx_peer_new(t, peer_id)) == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    rc = kvx_peer_turn_begin(t, p);
    if (rc < 0)
        goto out; /* closing: close frees p */
    if (addr != NULL && (addr_copy = strdup(addr)) == NULL) {
        rc = -ENOMEM;
        goto out_turn;
    }
    /* a blob older than the peer's live connection: a stale copy (of a process since
     * restarted, say); a listener's answer never is */
    if (addr == NULL && kvx_peer_stale(p, md.generation)) {
        kvx_error(t, "peer %s (%s) rejected: its metadata is older than the peer's (%s)", peer_id,
                  md.agent_name, p->conn->agent_name);
        rc = -ESTALE;
        goto out_turn;
    }
    /* The new connection is not the peer's until it has answered (or 200 ms passed): until
     * then an existing connection of that id keeps working, and stays if this one fails. */
    rc = kvx_conn_open(t, peer_id, &md, &c);
    if (rc < 0)
        goto out_turn;
    c->pins++;
    kvx_conn_wait(c, true, kvx_now_ns() + KVX_CONNECT_WAIT_NS);
    if (c->mapped != NULL && !t->closed)
        kvx_conn_prefault(c);
    c->pins--;
    rc = t->closed ? -ESHUTDOWN : c->state != KVX_CONN_OPEN ? c->err : c->pending_err;
    if (rc < 0) {
        kvx_error(t, "peer %s (%s): %s", peer_id, md.agent_name, kvx_strerror(rc));
        if (c->state == KVX_CONN_OPEN)
            kvx_conn_fail(c, rc);
        else
            kvx_conn_maybe_free(c);
        if (rc == -ESHUTDOWN)
            goto out;
        goto out_turn;
    }
    if (!c->wired)
        kvx_info(t, "peer %s (%s) has not answered yet; wire-up goes on in the background", peer_id,
                 md.agent_name);
    /* Install the new connection, then retire the old one. The peer id stays known
     * throughout: a write submitted meanwhile goes to one connection or the other. */
    old = p->conn;
    if (p->removed)
        t->nconnected++;
    p->conn = c;
    p->removed = false;
    p->last_err = 0;
    c->peer = p;
    memcpy(p->last_agent, c->agent_name, sizeof(p->last_agent));
    p->last_base = c->remote_base;
    p->last_num_blocks = c->remote_num_blocks;
    p->last_generation = c->generation;
    memset(&p->expect, 0, sizeof(p->expect));
    if (params != NULL && (params->field_mask & KVX_PEER_PARAM_EXPECT_REGION))
        p->expect = *params;
    /* paired by address or not from now on; a reconnection under way is over, and the
     * transfers it parked go to this connection */
    free(p->addr);
    p->addr = addr_copy;
    addr_copy = NULL;
    kvx_listen_peer_forget(t, p);
    kvx_xfer_unpark(p, c, 0);
    kvx_info(t, "peer %s: connected to %s over %s (messages of %zu bytes)%s", peer_id,
             c->agent_name, c->transport, c->seg, c->watched ? ", watching its process" : "");
    if (old != NULL) {
        kvx_info(t, "peer %s: replaced its connection to %s", peer_id, old->agent_name);
        if (params != NULL && (params->field_mask & KVX_PEER_PARAM_FLAGS) &&
            (params->flags & KVX_PEER_ADD_PURGE))
            for (kvx_list_t *n = t->active.next; n != &t->active; n = n->next) {
                kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);
                if (x->peer == p && x->conn == old)
                    x->purged = true; /* ENDING ones too: they still name their connection */
            }
        kvx_conn_retire(old, -ECONNABORTED);
    }
    rc = 0;
out_turn:
    kvx_peer_turn_end(t, p);
    kvx_peer_maybe_free(t, p); /* an entry made for an add that failed */
out:
    kvx_unlock(t);
    free(addr_copy);
    return rc;
}

int kvx_peer_reinstall(kvx_transport_t *t, kvx_peer_t *p, const kvx_md_t *md)
{
    const char *why;
    kvx_conn_t *c, *old = p->conn;
    bool restarted;
    int rc;

    /* the checks of the add or connect that made the peer, expectations included; not the
     * generation: the address's answer is authoritative (a restarted process whose clock is
     * behind has an older one) */
    rc = kvx_peer_check(t, md, &p->expect, &why);
    if (rc < 0) {
        kvx_error(t, "peer %s (%s) at %s refused: %s", p->id, md->agent_name, p->addr, why);
        return rc;
    }
    /* not prefaulted (the first copies fault the pages in); not the peer's until installed
     * below, so a failure here starts no reconnection of its own */
    rc = kvx_conn_open(t, p->id, md, &c);
    if (rc < 0)
        return rc;
    /* installed at once: transfers wait behind the handshake, as after a slow kvx_peer_add */
    p->conn = c;
    c->peer = p;
    memcpy(p->last_agent, c->agent_name, sizeof(p->last_agent));
    p->last_base = c->remote_base;
    p->last_num_blocks = c->remote_num_blocks;
    restarted = c->generation != p->last_generation;
    p->last_generation = c->generation;
    kvx_info(t, "peer %s: paired again with %s at %s over %s (generation %s)", p->id, c->agent_name,
             p->addr, c->transport, restarted ? "another: it restarted" : "the same");
    kvx_listen_event(t, p, restarted ? KVX_PEER_EVENT_RESTARTED : KVX_PEER_EVENT_RECONNECTED, 0);
    p->stats.reconnections++;
    t->stats.reconnections++;
    kvx_xfer_unpark(p, c, 0);
    if (old != NULL)
        kvx_conn_release(old, -ECONNABORTED); /* failed already: it only goes */
    return 0;
}

static int kvx_peer_remove_impl(kvx_transport_t *t, const char *peer_id, unsigned flags)
{
    kvx_peer_t *p;
    kvx_conn_t *c;
    int rc = 0;

    if (t == NULL || !kvx_peer_id_ok(peer_id) || (flags & ~(unsigned)KVX_PEER_REMOVE_PURGE))
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    p = kvx_peer_lookup(t, peer_id);
    if (p == NULL || (p->conn == NULL && p->turn_now == p->turn_next))
        goto out;
    /* after the adds and removes of this id called before this one */
    p->nxfers++; /* keeps p allocated while the lock is released below */
    rc = kvx_peer_turn_begin(t, p);
    p->nxfers--;
    if (rc < 0)
        goto out;
    c = p->conn;
    if (c == NULL) {
        kvx_peer_turn_end(t, p);
        kvx_peer_maybe_free(t, p);
        goto out;
    }
    if (flags & KVX_PEER_REMOVE_PURGE) {
        /* forget what finished and was not polled yet (p keeps its connection meanwhile, so
         * releasing cannot free it), and mark what is in flight to be forgotten as it ends:
         * every transfer not DONE is on t->active, ENDING ones too (on no connection list) */
        while (!kvx_list_empty(&p->cq))
            kvx_xfer_release(kvx_list_first(&p->cq, kvx_xfer_t, conn_link));
        for (kvx_list_t *n = t->active.next; n != &t->active; n = n->next) {
            kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);
            if (x->peer == p)
                x->purged = true;
        }
    }
    p->conn = NULL;
    p->removed = true;
    p->last_err = c->err;
    t->nconnected--;
    free(p->addr); /* no more pairing again */
    p->addr = NULL;
    kvx_listen_peer_forget(t, p);
    kvx_xfer_unpark(p, NULL, -ECONNABORTED);
    kvx_conn_retire(c, -ECONNABORTED);
    kvx_peer_turn_end(t, p);
    kvx_peer_maybe_free(t, p);
    rc = 1;
out:
    kvx_unlock(t);
    return rc;
}

int kvx_peer_remove(kvx_transport_t *t, const char *peer_id)
{
    return kvx_peer_remove_impl(t, peer_id, 0);
}

int kvx_peer_remove_ex(kvx_transport_t *t, const char *peer_id, unsigned flags)
{
    return kvx_peer_remove_impl(t, peer_id, flags);
}

int kvx_peer_query(kvx_transport_t *t, const char *peer_id, kvx_peer_attr_t *attr)
{
    kvx_peer_t *p;
    kvx_conn_t *c;
    uint64_t m;
    int rc = 0;

    if (t == NULL || !kvx_peer_id_ok(peer_id) || attr == NULL)
        return -EINVAL;
    m = attr->field_mask;
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    p = kvx_peer_lookup(t, peer_id);
    if (p == NULL || (p->conn == NULL && p->nxfers == 0)) { /* an add still under way */
        rc = -ENOENT;
        goto out;
    }
    c = p->conn;
    if (m & KVX_PEER_ATTR_AGENT_NAME)
        memcpy(attr->agent_name, p->last_agent, sizeof(attr->agent_name));
    if (m & KVX_PEER_ATTR_TRANSPORT) {
        snprintf(attr->transport, sizeof(attr->transport), "%s", c ? c->transport : "");
        attr->rma_hw = c ? c->rma_hw : 0;
    }
    if (m & KVX_PEER_ATTR_STATE) {
        attr->state = c == NULL                   ? KVX_PEER_REMOVED
                      : p->reconnecting           ? KVX_PEER_RECONNECTING
                      : c->state != KVX_CONN_OPEN ? KVX_PEER_FAILED
                      : c->pending_err != 0       ? KVX_PEER_FAILED
                      : !c->wired                 ? KVX_PEER_WIRING
                                                  : KVX_PEER_CONNECTED;
        attr->error = c == NULL ? p->last_err : c->err != 0 ? c->err : c->pending_err;
    }
    if (m & KVX_PEER_ATTR_REGION) {
        attr->remote_base = p->last_base;
        attr->remote_num_blocks = p->last_num_blocks;
        attr->block_len = t->block_len;
    }
    if (m & KVX_PEER_ATTR_GENERATION)
        attr->generation = p->last_generation;
    if (m & KVX_PEER_ATTR_RECV) {
        kvx_writer_t *w = kvx_writer_lookup(t, p->last_agent);
        memset(&attr->recv, 0, sizeof(attr->recv));
        if (w != NULL)
            attr->recv = w->counters;
    }
    if (m & KVX_PEER_ATTR_COUNTERS) {
        attr->bytes_written = p->bytes_written;
        attr->bytes_read = p->bytes_read;
        attr->xfers_done = p->xfers_done;
        attr->xfers_failed = p->xfers_failed;
        attr->xfers_inflight = p->inflight;
        attr->latency_sum_ns = p->lat_sum_ns;
        attr->latency_max_ns = p->lat_max_ns;
    }
out:
    kvx_unlock(t);
    return rc;
}
