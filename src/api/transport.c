/*
 * The transport's calls: create and close, metadata, fence, and the transfer calls: write and
 * read (checked here, born in xfer.c), poll (a transfer leaves through kvx_transport_poll, from
 * the completion queue cq.c keeps) and cancel. The top of the layers: it may call any of them.
 */
#include "api/transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define KVX_DEFAULT_DEADLINE_MS 5000
#define KVX_DEFAULT_KEEPALIVE_MS 1000
#define KVX_DEFAULT_STALL_MS 2000
#define KVX_DEFAULT_NOTICES 1024
static bool kvx_text_ok(const char *s, size_t min, size_t max)
{
    size_t n = strnlen(s, max + 1);

    if (n < min || n > max)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return false;
    return true;
}

/* "kvx-<host>-<pid>-<8 hex>": unique among engines on one host and across hosts. */
static void kvx_default_name(char *buf, size_t len)
{
    char host[24] = "host";
    uint32_t rnd = 0;

    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    for (char *p = host; *p; p++)
        if (*p == '.' || (unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
            *p = '\0';
    if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
        rnd = (uint32_t)kvx_now_ns();
    snprintf(buf, len, "kvx-%s-%d-%08x", host, (int)getpid(), rnd);
}

static int kvx_params_check(const kvx_params_t *p)
{
    uint64_t len;

    bool own = (p->field_mask & KVX_PARAM_OWN_REGION) != 0;

    /* an owned region has no base yet: kvx allocates it */
    if (!(p->field_mask & KVX_PARAM_REGION) || (p->base == NULL) != own || p->num_blocks == 0 ||
        p->block_len == 0)
        return -EINVAL;
    if (p->num_blocks > UINT64_MAX / p->block_len)
        return -EINVAL;
    len = p->num_blocks * p->block_len;
    if ((uintptr_t)p->base > UINTPTR_MAX - len || len > SIZE_MAX)
        return -EINVAL;
    /* indices are 32-bit */
    if (p->num_blocks > UINT32_MAX)
        return -EINVAL;
    if ((p->field_mask & KVX_PARAM_AGENT_NAME) &&
        (p->agent_name == NULL || !kvx_text_ok(p->agent_name, 1, KVX_NAME_MAX)))
        return -EINVAL;
    if ((p->field_mask & KVX_PARAM_FINGERPRINT) && p->fingerprint != NULL &&
        !kvx_text_ok(p->fingerprint, 0, KVX_FINGERPRINT_MAX))
        return -EINVAL;
    if (p->field_mask & KVX_PARAM_BACKENDS) {
        if (p->num_backends == 0 || p->backends == NULL)
            return -EINVAL;
        for (size_t i = 0; i < p->num_backends; i++)
            if (p->backends[i] == NULL || strcasecmp(p->backends[i], "ucx") != 0)
                return -EINVAL;
    }
    if ((p->field_mask & KVX_PARAM_LOG) &&
        (p->log_level < KVX_LOG_OFF || p->log_level > KVX_LOG_DEBUG))
        return -EINVAL;
    if (((p->field_mask & KVX_PARAM_DEADLINE) && p->deadline_ms > KVX_MS_MAX) ||
        ((p->field_mask & KVX_PARAM_KEEPALIVE) && p->keepalive_ms > KVX_MS_MAX) ||
        ((p->field_mask & KVX_PARAM_STALL) && p->stall_ms > KVX_MS_MAX))
        return -EINVAL;
    if ((p->field_mask & KVX_PARAM_SECRET) &&
        (p->secret == NULL || p->secret_len == 0 || p->secret_len > KVX_SECRET_MAX))
        return -EINVAL;
    if ((p->field_mask & KVX_PARAM_NET_DEVICES) &&
        (p->net_devices == NULL || !kvx_text_ok(p->net_devices, 1, 255)))
        return -EINVAL;
    if ((p->field_mask & KVX_PARAM_NOTICES) &&
        (p->notice_queue == 0 || p->notice_queue > KVX_NOTICES_MAX))
        return -EINVAL;
    if ((p->field_mask & KVX_PARAM_RNDV) &&
        (p->rndv_mode < KVX_RNDV_AUTO || p->rndv_mode > KVX_RNDV_ALWAYS ||
         p->rndv_thresh > UINT32_MAX))
        return -EINVAL;
    return 0;
}

/* The metadata blob of t as it is now (its capability included), in a new buffer. */
static int kvx_metadata_encode(kvx_transport_t *t, uint8_t **buf_p, size_t *len_p)
{
    kvx_md_t md = {0};
    const void *waddr;
    size_t waddr_len, len;
    uint8_t *buf;
    int rc;

    kvx_ucx_local_address(t->core.ucx, &waddr, &waddr_len);
    snprintf(md.agent_name, sizeof(md.agent_name), "%s", t->core.log.name);
    snprintf(md.fingerprint, sizeof(md.fingerprint), "%s", t->core.fingerprint);
    md.base = (uintptr_t)t->core.base;
    md.num_blocks = t->core.num_blocks;
    md.block_len = t->core.block_len;
    md.generation = t->core.generation;
    memcpy(md.capability, t->core.capability, sizeof(md.capability));
    md.host = t->core.host;
    md.worker_addr = waddr;
    md.worker_addr_len = (uint32_t)waddr_len;
    md.rkey = t->rkey;
    md.rkey_len = (uint32_t)t->rkey_len;
    md.flags = t->core.secret != NULL ? KVX_MDF_MAC : 0;
    len = kvx_md_encoded_len(&md);
    buf = malloc(len);
    if (buf == NULL)
        return -ENOMEM;
    rc = kvx_md_encode(&md, t->core.secret, t->core.secret_len, buf, len);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *buf_p = buf;
    *len_p = len;
    return 0;
}

static int kvx_metadata_build(kvx_transport_t *t)
{
    int rc = kvx_metadata_encode(t, &t->metadata, &t->metadata_len);

    if (rc == 0)
        kvx_peers_metadata(&t->peers, t->metadata, t->metadata_len);
    return rc;
}

/* A superseded metadata buffer: the listener's answers in flight may still point at one (UCX
 * sends from it), so it is freed only once no accepted pairing is left, or at close. */
typedef struct kvx_old_md {
    struct kvx_old_md *next;
    uint8_t *buf;
} kvx_old_md_t;

static void kvx_old_md_free(kvx_transport_t *t)
{
    while (t->old_md != NULL) {
        kvx_old_md_t *o = t->old_md;
        t->old_md = o->next;
        free(o->buf);
        free(o);
    }
}

/* A fresh capability, and metadata that carries it; the old one joins t->retired. Returns 0 or
 * a negative errno (nothing changed). */
static int kvx_transport_retire(kvx_transport_t *t)
{
    uint8_t old[16], *buf;
    size_t len;
    kvx_old_md_t *o = malloc(sizeof(*o));
    int rc;

    if (o == NULL)
        return -ENOMEM;
    memcpy(old, t->core.capability, sizeof(old));
    if (getrandom(t->core.capability, sizeof(t->core.capability), 0) !=
        (ssize_t)sizeof(t->core.capability)) {
        rc = errno ? -errno : -EIO;
        memcpy(t->core.capability, old, sizeof(old));
        free(o);
        return rc;
    }
    rc = kvx_metadata_encode(t, &buf, &len);
    if (rc < 0) {
        memcpy(t->core.capability, old, sizeof(old));
        free(o);
        return rc;
    }
    if (t->peers.naccepted == 0)
        kvx_old_md_free(t);
    o->buf = t->metadata;
    o->next = t->old_md;
    t->old_md = o;
    t->metadata = buf;
    t->metadata_len = len;
    kvx_peers_metadata(&t->peers, buf, len);
    kvx_recv_retire(&t->recv, old);
    kvx_info(&t->core, "capability retired: new metadata (%zu bytes)", len);
    return 0;
}

/* What create copied from the parameters. */
static void kvx_transport_free_params(kvx_transport_t *t)
{
    if (t->core.secret != NULL)
        memset(t->core.secret, 0, t->core.secret_len);
    free(t->core.secret);
    free(t->net_devices);
    kvx_recv_fini(&t->recv);
    t->core.secret = NULL;
    t->net_devices = NULL;
}

/* What the backend reports of the worker (arg: the transport), and which layer hears it. */
static void kvx_transport_on_request(void *arg, const kvx_msg_t *m, const void *hdr, size_t hdr_len,
                                     const uint8_t *data, size_t data_len)
{
    kvx_transport_t *t = arg;
    kvx_recv_on_message(&t->recv, m, hdr, hdr_len, data, data_len);
}
static void kvx_transport_on_reply(void *arg, const kvx_msg_t *m, const uint8_t *data,
                                   size_t data_len)
{
    kvx_transport_t *t = arg;
    kvx_xfer_on_message(&t->conns, m, data, data_len);
}
static void kvx_transport_on_conn_request(void *arg, void *conn_req)
{
    kvx_transport_t *t = arg;
    kvx_listen_on_request(&t->peers, conn_req);
}
static void kvx_transport_on_drop(void *arg, int why)
{
    kvx_transport_t *t = arg;
    kvx_count_drop(&t->core, why);
}

static const kvx_ucx_ops_t kvx_transport_ucx_ops = {
    .on_request = kvx_transport_on_request,
    .on_reply = kvx_transport_on_reply,
    .on_conn_request = kvx_transport_on_conn_request,
    .on_drop = kvx_transport_on_drop,
};

int kvx_transport_create(const kvx_params_t *params, kvx_transport_t **transport_p)
{
    kvx_transport_t *t;
    int rc;

    if (params == NULL || transport_p == NULL)
        return -EINVAL;
    rc = kvx_params_check(params);
    if (rc < 0) {
        kvx_log(NULL, KVX_LOG_ERROR, "kvx_transport_create: invalid parameters");
        return rc;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    pthread_mutex_init(&t->core.lock, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&t->core.cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    kvx_list_init(&t->core.ready);
    kvx_list_init(&t->core.active);
    kvx_conns_init(&t->conns, &t->core);
    kvx_peers_init(&t->peers, &t->core, &t->conns);
    t->core.next_deadline_ns = UINT64_MAX;
    t->core.next_seq = 1;
    rc = kvx_engine_init(&t->engine, &t->core, &t->conns, &t->recv, &t->peers);
    if (rc < 0) {
        pthread_cond_destroy(&t->core.cond);
        pthread_mutex_destroy(&t->core.lock);
        free(t);
        return rc;
    }
    t->core.base = params->base;
    t->core.num_blocks = params->num_blocks;
    t->core.block_len = params->block_len;
    t->core.region_len = params->num_blocks * params->block_len;
    t->core.integrity = (params->field_mask & KVX_PARAM_INTEGRITY) && params->integrity != 0;
    if (params->field_mask & KVX_PARAM_RNDV) {
        t->core.rndv_mode = params->rndv_mode;
        t->core.rndv_thresh = params->rndv_thresh;
    }
    rc = kvx_recv_init(&t->recv, &t->core,
                       (params->field_mask & KVX_PARAM_NOTICES) ? params->notice_queue
                                                                : KVX_DEFAULT_NOTICES);
    if (rc < 0)
        goto err_free;
    if (params->field_mask & KVX_PARAM_SECRET) {
        t->core.secret = malloc(params->secret_len);
        if (t->core.secret == NULL) {
            rc = -ENOMEM;
            goto err_free;
        }
        memcpy(t->core.secret, params->secret, params->secret_len);
        t->core.secret_len = params->secret_len;
    }
    if ((params->field_mask & KVX_PARAM_NET_DEVICES) &&
        (t->net_devices = strdup(params->net_devices)) == NULL) {
        rc = -ENOMEM;
        goto err_free;
    }
    if (params->field_mask & KVX_PARAM_AGENT_NAME)
        snprintf(t->core.log.name, sizeof(t->core.log.name), "%s", params->agent_name);
    else
        kvx_default_name(t->core.log.name, sizeof(t->core.log.name));
    if ((params->field_mask & KVX_PARAM_FINGERPRINT) && params->fingerprint != NULL)
        snprintf(t->core.fingerprint, sizeof(t->core.fingerprint), "%s", params->fingerprint);
    t->num_threads = (params->field_mask & KVX_PARAM_NUM_THREADS) ? params->num_threads : 1;
    /* every duration is at most KVX_MS_MAX (checked above): in ns, it cannot overflow */
    t->core.deadline_ns = ((params->field_mask & KVX_PARAM_DEADLINE) ? params->deadline_ms
                                                                     : KVX_DEFAULT_DEADLINE_MS) *
                          1000000ull;
    t->core.keepalive_ms = (params->field_mask & KVX_PARAM_KEEPALIVE) ? params->keepalive_ms
                                                                      : KVX_DEFAULT_KEEPALIVE_MS;
    t->core.stall_ns =
        ((params->field_mask & KVX_PARAM_STALL) ? params->stall_ms : KVX_DEFAULT_STALL_MS) *
        1000000ull;
    kvx_host_self(&t->core.host);
    {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        t->core.generation = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    }
    if (getrandom(t->core.capability, sizeof(t->core.capability), 0) !=
        (ssize_t)sizeof(t->core.capability)) {
        rc = -errno;
        kvx_log(NULL, KVX_LOG_ERROR, "kvx_transport_create: getrandom: %s", strerror(errno));
        goto err_free;
    }
    if (params->field_mask & KVX_PARAM_LOG) {
        t->core.log.own = true;
        t->core.log.fn = params->log_fn;
        t->core.log.arg = params->log_arg;
        t->core.log.level = params->log_level;
    }

    rc = kvx_ucx_init(&(kvx_ucx_config_t){.log = t->core.log,
                                          .keepalive_ms = t->core.keepalive_ms,
                                          .net_devices = t->net_devices},
                      &kvx_transport_ucx_ops, t, &t->core.ucx);
    if (rc < 0)
        goto err_free;
    if (params->field_mask & KVX_PARAM_OWN_REGION) {
        void *base;
        rc = kvx_ucx_region_alloc(t->core.ucx, t->core.region_len, &base, &t->rkey, &t->rkey_len,
                                  t->core.seg_token);
        if (rc < 0)
            goto err_ucx;
        t->core.base = base;
        t->owned = true;
    }
    rc = kvx_metadata_build(t);
    if (rc < 0)
        goto err_ucx;
    if (t->num_threads > 0) {
        rc = kvx_progress_start(&t->engine);
        if (rc < 0)
            goto err_md;
    }
    kvx_info(&t->core,
             "created: %llu blocks of %llu bytes at %p%s, fingerprint '%s', %u progress thread(s)",
             (unsigned long long)t->core.num_blocks, (unsigned long long)t->core.block_len,
             (void *)t->core.base, t->owned ? " (owned)" : "", t->core.fingerprint,
             t->engine.thread_running ? 1u : 0u);
    *transport_p = t;
    return 0;

err_md:
    free(t->metadata);
err_ucx:
    kvx_ucx_free(t->core.ucx);
err_free:
    kvx_engine_fini(&t->engine);
    pthread_cond_destroy(&t->core.cond);
    pthread_mutex_destroy(&t->core.lock);
    kvx_transport_free_params(t);
    free(t);
    return rc;
}

/* How long close waits for connections to close before destroying the worker anyway. */
#define KVX_CLOSE_DRAIN_NS (2ull * 1000000000ull)

int kvx_transport_close(kvx_transport_t *t)
{
    uint64_t end;

    if (t == NULL)
        return -EINVAL;
    kvx_lock(&t->core);
    if (t->core.closed) {
        /* another thread is closing: return once it has finished, as the first close does */
        while (!t->close_done)
            pthread_cond_wait(&t->core.cond, &t->core.lock);
        kvx_unlock(&t->core);
        return 0;
    }
    /* From here every other call returns -ESHUTDOWN. Calls waiting with the lock released (in
     * kvx_transport_wait, or in peer add/remove on t->core.cond) wake, see it and leave; the
     * teardown starts once none is left. */
    t->core.closed = true;
    t->engine.cq_signaled = false; /* one count for every waiter, whatever was signaled before */
    kvx_notify_waiters(&t->engine);
    pthread_cond_broadcast(&t->core.cond);
    while (t->core.unlocked_calls > 0 || t->engine.waiters > 0)
        pthread_cond_wait(&t->core.cond, &t->core.lock);
    kvx_unlock(&t->core);
    kvx_progress_stop(&t->engine);

    kvx_lock(&t->core);
    for (size_t i = 0; i < t->core.ptab_cap; i++) {
        for (kvx_peer_t *p = t->core.ptab[i]; p != NULL; p = p->hnext) {
            kvx_conn_t *c = p->conn;
            kvx_reconnect_forget(&t->peers, p);
            kvx_xfer_unpark(p, NULL, -ECONNABORTED);
            if (c == NULL)
                continue;
            p->conn = NULL;
            kvx_conn_release(c, -ECONNABORTED);
        }
    }
    kvx_rconns_close_all(&t->recv.conns);
    kvx_pairings_close_all(&t->peers);
    kvx_conns_end_lingers(&t->conns);
    /* Drive UCX until the forced closes complete (they need no answer from the peers) and UCX has
     * let go of every request of kvx's: it purges a closed endpoint's requests only once its
     * lanes' discard completes, in a later progress, and a worker destroyed before that left
     * them (and kvx's records) behind, and UCX 1.19.1 then freed twice what it had registered
     * for such a send itself (test_hostile section 9: a reader holding its read data). */
    end = kvx_now_ns() + KVX_CLOSE_DRAIN_NS;
    while (kvx_pairings_closing(&t->peers) || kvx_conns_closing(&t->conns) ||
           kvx_rconns_closing(&t->recv.conns)) {
        if (kvx_now_ns() > end) {
            kvx_warn(
                &t->core,
                "connections still closing, or UCX still holding their requests, after %llu ms",
                (unsigned long long)(KVX_CLOSE_DRAIN_NS / 1000000ull));
            break;
        }
        kvx_ucx_progress(t->core.ucx);
    }
    /* Anything UCX still calls back during teardown finds its objects alive; free them after. */
    kvx_conns_unmap_all(&t->conns);
    kvx_ucx_fini(t->core.ucx);
    kvx_conns_free_all(&t->conns);
    kvx_recv_free_all(&t->recv);
    kvx_pairings_free_all(&t->peers);
    kvx_xfer_free_all(&t->core);
    kvx_peer_free_all(&t->core);
    kvx_peers_metadata(&t->peers, NULL, 0);
    free(t->metadata);
    t->metadata = NULL;
    kvx_old_md_free(t);
    kvx_engine_closed(&t->engine); /* a loop waiting on an event fd wakes, its calls say closed */
    t->close_done = true;
    pthread_cond_broadcast(&t->core.cond);
    kvx_info(&t->core, "closed");
    kvx_unlock(&t->core);
    return 0;
}

void kvx_transport_destroy(kvx_transport_t *t)
{
    if (t == NULL)
        return;
    kvx_transport_close(t);
    kvx_ucx_free(t->core.ucx); /* an owned region lives until here */
    t->core.ucx = NULL;
    kvx_engine_fini(&t->engine);
    pthread_cond_destroy(&t->core.cond);
    pthread_mutex_destroy(&t->core.lock);
    kvx_transport_free_params(t);
    free(t);
}

int kvx_transport_query(kvx_transport_t *t, kvx_transport_attr_t *attr)
{
    if (t == NULL || attr == NULL)
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_AGENT_NAME)
        memcpy(attr->agent_name, t->core.log.name, sizeof(attr->agent_name));
    if (attr->field_mask & KVX_TRANSPORT_ATTR_FINGERPRINT)
        memcpy(attr->fingerprint, t->core.fingerprint, sizeof(attr->fingerprint));
    if (attr->field_mask & KVX_TRANSPORT_ATTR_REGION) {
        attr->base = t->core.base;
        attr->num_blocks = t->core.num_blocks;
        attr->block_len = t->core.block_len;
    }
    if (attr->field_mask & KVX_TRANSPORT_ATTR_NUM_THREADS)
        attr->num_threads = t->engine.thread_running ? 1 : 0;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_DEADLINE)
        attr->deadline_ms = t->core.deadline_ns / 1000000ull;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_METADATA_LEN)
        attr->metadata_len = t->metadata_len;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_NUM_PEERS)
        attr->num_peers = t->core.nconnected;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_STALL)
        attr->stall_ms = t->core.stall_ns / 1000000ull;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_LISTEN)
        snprintf(attr->listen_addr, sizeof(attr->listen_addr), "%s", t->peers.listen_addr);
    if (attr->field_mask & KVX_TRANSPORT_ATTR_RECV)
        attr->recv = t->core.rcounters;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_MAPS_REFUSED)
        attr->maps_refused = t->core.maps_refused;
    kvx_unlock(&t->core);
    return 0;
}

int kvx_transport_metadata(kvx_transport_t *t, void *buf, size_t *len_p)
{
    int rc = 0;

    if (t == NULL || len_p == NULL || (buf == NULL && *len_p != 0))
        return -EINVAL;
    kvx_lock(&t->core);
    if (t->core.closed) {
        rc = -ESHUTDOWN;
    } else if (*len_p < t->metadata_len) {
        *len_p = t->metadata_len;
        rc = -ENOSPC;
    } else {
        memcpy(buf, t->metadata, t->metadata_len);
        *len_p = t->metadata_len;
    }
    kvx_unlock(&t->core);
    return rc;
}

/* ---- fences (the receiving side's records: fence.c) ----------------------------------------- */

static int kvx_tag_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* How long a fence waits for the rendezvous receives of fenced writes in flight to end (the stall
 * limit when shorter), before it closes their connections. */
#define KVX_FENCE_RX_WAIT_NS (1000ull * 1000000ull)
/* ... and how long for UCX to end them once their connections closed (it does in its next
 * progress: measured at once on UCX 1.13.1 and 1.19.1). */
#define KVX_FENCE_RX_END_NS (100ull * 1000000ull)

/*
 * A fence returns with no rendezvous receive of a write it covers in flight (its payload lands
 * in the region while it is): those in flight are waited for, with the lock released, up to
 * KVX_FENCE_RX_WAIT_NS (they land: a fence drops what arrives after it, and these arrived
 * before), then their connections close, which ends them (their transfers fail). Lock held.
 */
typedef struct kvx_fence_wait {
    kvx_recv_t *recv;
    const char *writer;
} kvx_fence_wait_t;

static bool kvx_fence_rndvs_ended(void *arg)
{
    kvx_fence_wait_t *fw = arg;
    return kvx_recv_fence_rndvs(fw->recv, fw->writer, false) == 0;
}

/* Wait (lock released) while rendezvous receives a fence covers are in flight, until until_ns.
 * Returns false when the transport closes meanwhile. */
static bool kvx_fence_rxs_wait(kvx_transport_t *t, const char *writer, uint64_t until_ns)
{
    kvx_fence_wait_t fw = {&t->recv, writer};

    /* this call steps progress itself: a receive that ended (or the close that ends it) must not
     * wait for the progress thread's next wake-up */
    return kvx_core_wait(&t->core, &(kvx_wait_t){.done = kvx_fence_rndvs_ended,
                                                 .arg = &fw,
                                                 .until_ns = until_ns,
                                                 .slice_ns = 1000000ull,
                                                 .step = true}) != -ESHUTDOWN;
}

static void kvx_fence_rxs(kvx_transport_t *t, const char *writer)
{
    uint64_t wait = t->core.stall_ns != 0 && t->core.stall_ns < KVX_FENCE_RX_WAIT_NS
                        ? t->core.stall_ns
                        : KVX_FENCE_RX_WAIT_NS;

    if (kvx_recv_fence_rndvs(&t->recv, writer, false) == 0 ||
        !kvx_fence_rxs_wait(t, writer, kvx_now_ns() + wait))
        return;
    if (kvx_recv_fence_rndvs(&t->recv, writer, true) > 0) {
        kvx_warn(&t->core,
                 "fence of %s: rendezvous receives still in flight after %llu ms: their "
                 "connections close",
                 writer ? writer : "every writer", (unsigned long long)(wait / 1000000));
        kvx_recv_work(&t->recv); /* the closes, now: UCX ends the receives in its next progress */
        kvx_fence_rxs_wait(t, writer, kvx_now_ns() + KVX_FENCE_RX_END_NS);
    }
}

int kvx_fence_ex(kvx_transport_t *t, const char *writer, const uint64_t *tags, size_t ntags,
                 unsigned flags)
{
    uint64_t sorted[KVX_FENCE_TAGS_MAX];
    size_t n = 0;
    int rc;

    if (t == NULL || ntags > KVX_FENCE_TAGS_MAX || (tags == NULL && ntags > 0) ||
        (flags & ~(unsigned)KVX_FENCE_RETIRE) != 0 ||
        (writer != NULL && (strnlen(writer, KVX_NAME_MAX + 1) == 0 ||
                            strnlen(writer, KVX_NAME_MAX + 1) > KVX_NAME_MAX)))
        return -EINVAL;
    /* the distinct tags, sorted: one record each */
    if (ntags > 0) {
        memcpy(sorted, tags, ntags * sizeof(tags[0]));
        qsort(sorted, ntags, sizeof(sorted[0]), kvx_tag_cmp);
        for (size_t k = 0; k < ntags; k++)
            if (n == 0 || sorted[k] != sorted[n - 1])
                sorted[n++] = sorted[k];
    }
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    /* what can fail comes first (the bounds, memory, the new capability): on error nothing is
     * fenced and the capability stays */
    rc = kvx_recv_fence_prepare(&t->recv, writer, sorted, n);
    if (rc == 0 && (flags & KVX_FENCE_RETIRE))
        rc = kvx_transport_retire(t);
    if (rc < 0) {
        kvx_warn(&t->core, "fence of %s: %s; nothing fenced", writer ? writer : "every writer",
                 kvx_strerror(rc));
        kvx_unlock(&t->core);
        return rc;
    }
    rc = kvx_recv_fence(&t->recv, writer, sorted, n);
    kvx_info(&t->core, "fence of %s%s%s: %d connection(s)", writer ? writer : "every writer",
             n ? " (some tags)" : "", (flags & KVX_FENCE_RETIRE) ? ", capability retired" : "", rc);
    kvx_fence_rxs(t, writer);
    kvx_unlock(&t->core);
    return rc;
}

int kvx_fence(kvx_transport_t *t, const char *writer, const uint64_t *tags, size_t ntags)
{
    return kvx_fence_ex(t, writer, tags, ntags, 0);
}

int kvx_transport_poll(kvx_transport_t *t, const char *peer_id, kvx_completion_t *out, size_t max)
{
    size_t n = 0;

    if (t == NULL || (out == NULL && max != 0))
        return -EINVAL;
    if (max > INT32_MAX)
        max = INT32_MAX;
    kvx_defer_to_waiters(&t->core);
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    kvx_progress_step(&t->engine);
    /* An application that polls in a loop drives UCX itself, and the progress thread steps
     * aside; one that waits on the event fd polls once per wake-up and sleeps: the thread must
     * not step aside for it (it would add up to a millisecond to every wake-up). */
    if (!t->engine.ev_used)
        atomic_store_explicit(&t->engine.app_poll_ns, kvx_now_ns(), memory_order_relaxed);
    if (peer_id != NULL) {
        kvx_peer_t *p = kvx_peer_lookup(&t->core, peer_id);
        if (p != NULL)
            n = kvx_cq_drain(p, out, max);
    } else {
        while (n < max && !kvx_list_empty(&t->core.ready)) {
            kvx_peer_t *p = kvx_list_first(&t->core.ready, kvx_peer_t, ready_link);
            /* rotate, so that one busy peer cannot starve the others */
            kvx_list_del(&p->ready_link);
            kvx_list_add_tail(&t->core.ready, &p->ready_link);
            n += kvx_cq_drain(p, out + n, max - n);
        }
    }
    kvx_events_update(&t->engine);
    kvx_unlock(&t->core);
    return (int)n;
}

/* ---- submit -----------------------------------------------------------------------------------
 */

static int kvx_submit(kvx_transport_t *t, int op, const char *peer_id, const uint32_t *local,
                      const uint32_t *remote, size_t count, const kvx_xfer_params_t *params,
                      uint64_t *id_p)
{
    uint64_t fm = params != NULL ? params->field_mask : 0;
    uint32_t flags = (fm & KVX_XFER_PARAM_FLAGS) ? params->flags : 0;
    kvx_peer_t *p;
    int rc;

    if (t == NULL || peer_id == NULL || id_p == NULL || (count != 0 && (!local || !remote)) ||
        count > UINT32_MAX || count > UINT64_MAX / t->core.block_len ||
        ((fm & KVX_XFER_PARAM_DEADLINE) && params->deadline_ms > KVX_MS_MAX) ||
        ((fm & KVX_XFER_PARAM_PRIORITY) && params->priority >= KVX_PRIO_LEVELS) ||
        (flags & ~(uint32_t)KVX_XFER_NOTIFY) || ((flags & KVX_XFER_NOTIFY) && op != KVX_OP_WRITE))
        return -EINVAL;
    kvx_lock(&t->core);
    if (t->core.closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    p = kvx_peer_lookup(&t->core, peer_id);
    if (p == NULL || p->conn == NULL) {
        kvx_debug(&t->core, "submit: unknown peer '%s'", peer_id);
        rc = -ENOENT;
        goto out;
    }
    rc = kvx_xfer_submit(&t->core, p, op, local, remote, count, params, id_p);
out:
    kvx_unlock(&t->core);
    return rc;
}

int kvx_xfer_write(kvx_transport_t *t, const char *peer_id, const uint32_t *local_idxs,
                   const uint32_t *remote_idxs, size_t count, const kvx_xfer_params_t *params,
                   uint64_t *id_p)
{
    return kvx_submit(t, KVX_OP_WRITE, peer_id, local_idxs, remote_idxs, count, params, id_p);
}

int kvx_xfer_read(kvx_transport_t *t, const char *peer_id, const uint32_t *local_idxs,
                  const uint32_t *remote_idxs, size_t count, const kvx_xfer_params_t *params,
                  uint64_t *id_p)
{
    return kvx_submit(t, KVX_OP_READ, peer_id, local_idxs, remote_idxs, count, params, id_p);
}

/* ---- cancel --------------------------------------------------------------------------------- */

int kvx_xfer_cancel(kvx_transport_t *t, const uint64_t *ids, size_t count, int mode,
                    uint64_t *pending)
{
    uint32_t call;
    int np = 0;

    if (t == NULL || (ids == NULL && count != 0) ||
        (mode != KVX_CANCEL_IMMEDIATE && mode != KVX_CANCEL_WAIT) || count > INT32_MAX)
        return -EINVAL;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    call = ++t->cancel_calls;
    for (size_t i = 0; i < count; i++) {
        kvx_xfer_t *x = kvx_xfer_lookup(&t->core, ids[i]);

        if (x == NULL || x->purged) /* a purged transfer is forgotten already */
            continue;
        /*
         * Forgotten at once: a finished one; one that UCX holds nothing of (not started, a
         * read: its replies are dropped from now on, or a write whose messages all left); and
         * any with immediate, whose caller accepts that UCX may still read a write's blocks.
         */
        if (x->state == KVX_XS_DONE || mode == KVX_CANCEL_IMMEDIATE || x->sending == 0) {
            kvx_xfer_forget(x);
            continue;
        }
        /* Wait: a write with messages UCX still holds (they read its local blocks). It posts
         * nothing more, and completes (-ECANCELED) when the last of them has left. An id given
         * twice in one call is reported once. */
        if (x->canceled && x->cancel_call == call)
            continue;
        x->canceled = true;
        x->cancel_call = call;
        if (pending != NULL)
            pending[np] = x->id;
        np++;
    }
    kvx_unlock(&t->core);
    return np;
}
