/*
 * The transport's life: create (the parameters checked and copied, every layer's state made, the
 * backend and the progress thread started), close (every call let out, every connection and
 * pairing closed while UCX still runs, then the worker and everything else), destroy, query.
 * The api is the top of the layers: it sees the transport whole and may call any of them.
 */
#include "api/transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

    if (!(p->field_mask & KVX_PARAM_REGION))
        return -EINVAL;
    /* no main region at all: every one of the three says so (ranges only) */
    if (!own && p->base == NULL && p->num_blocks == 0 && p->block_len == 0)
        goto region_ok;
    /* an owned region has no base yet: kvx allocates it */
    if ((p->base == NULL) != own || p->num_blocks == 0 || p->block_len == 0)
        return -EINVAL;
    if (p->num_blocks > UINT64_MAX / p->block_len)
        return -EINVAL;
    len = p->num_blocks * p->block_len;
    if ((uintptr_t)p->base > UINTPTR_MAX - len || len > SIZE_MAX)
        return -EINVAL;
    /* indices are 32-bit */
    if (p->num_blocks > UINT32_MAX)
        return -EINVAL;
region_ok:
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
    if ((p->field_mask & KVX_PARAM_THREAD_MODE) && p->thread_mode != KVX_THREAD_YIELDS &&
        p->thread_mode != KVX_THREAD_DRIVES)
        return -EINVAL;
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

/* A transport with its lock, every layer's state made empty and the engine's hooks installed:
 * 0, or a negative errno (nothing left). */
static int kvx_transport_alloc(kvx_transport_t **t_p)
{
    kvx_transport_t *t = calloc(1, sizeof(*t));
    pthread_condattr_t ca;
    int rc;

    if (t == NULL)
        return -ENOMEM;
    pthread_mutex_init(&t->core.lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->core.cond, &ca);
    pthread_condattr_destroy(&ca);
    kvx_list_init(&t->core.ready);
    kvx_list_init(&t->core.active);
    t->core.next_deadline_ns = UINT64_MAX;
    t->core.next_seq = 1;
    kvx_conns_init(&t->conns, &t->core);
    kvx_peers_init(&t->peers, &t->core, &t->conns);
    rc = kvx_engine_init(&t->engine, &t->core, &t->conns, &t->recv, &t->peers);
    if (rc < 0) {
        pthread_cond_destroy(&t->core.cond);
        pthread_mutex_destroy(&t->core.lock);
        free(t);
        return rc;
    }
    *t_p = t;
    return 0;
}

/* The parameters copied into the core (and the api's own): 0, or a negative errno (what was
 * copied goes with kvx_transport_free_params). */
static int kvx_transport_settings(kvx_transport_t *t, const kvx_params_t *params)
{
    uint64_t fm = params->field_mask;
    kvx_core_t *core = &t->core;

    core->base = params->base;
    core->num_blocks = params->num_blocks;
    core->block_len = params->block_len;
    core->region_len = params->num_blocks * params->block_len;
    core->integrity = (fm & KVX_PARAM_INTEGRITY) && params->integrity != 0;
    if (fm & KVX_PARAM_RNDV) {
        core->rndv_mode = params->rndv_mode;
        core->rndv_thresh = params->rndv_thresh;
    }
    if (fm & KVX_PARAM_SECRET) {
        if ((core->secret = malloc(params->secret_len)) == NULL)
            return -ENOMEM;
        memcpy(core->secret, params->secret, params->secret_len);
        core->secret_len = params->secret_len;
    }
    if ((fm & KVX_PARAM_NET_DEVICES) && (t->net_devices = strdup(params->net_devices)) == NULL)
        return -ENOMEM;
    if (fm & KVX_PARAM_AGENT_NAME)
        snprintf(core->log.name, sizeof(core->log.name), "%s", params->agent_name);
    else
        kvx_default_name(core->log.name, sizeof(core->log.name));
    if ((fm & KVX_PARAM_FINGERPRINT) && params->fingerprint != NULL)
        snprintf(core->fingerprint, sizeof(core->fingerprint), "%s", params->fingerprint);
    t->num_threads = (fm & KVX_PARAM_NUM_THREADS) ? params->num_threads : 1;
    t->engine.thread_drives =
        (fm & KVX_PARAM_THREAD_MODE) && params->thread_mode == KVX_THREAD_DRIVES;
    /* every duration is at most KVX_MS_MAX (checked above): in ns, it cannot overflow */
    core->deadline_ns =
        ((fm & KVX_PARAM_DEADLINE) ? params->deadline_ms : KVX_DEFAULT_DEADLINE_MS) * 1000000ull;
    core->keepalive_ms =
        (fm & KVX_PARAM_KEEPALIVE) ? params->keepalive_ms : KVX_DEFAULT_KEEPALIVE_MS;
    core->stall_ns =
        ((fm & KVX_PARAM_STALL) ? params->stall_ms : KVX_DEFAULT_STALL_MS) * 1000000ull;
    if (fm & KVX_PARAM_LOG) {
        core->log.own = true;
        core->log.fn = params->log_fn;
        core->log.arg = params->log_arg;
        core->log.level = params->log_level;
    }
    return 0;
}

/* Who this transport is: its process on this host, its generation (when it was created, by this
 * host's clock), a fresh capability. 0, or a negative errno (logged). */
static int kvx_transport_identity(kvx_core_t *core)
{
    struct timespec ts;

    kvx_host_self(&core->host);
    clock_gettime(CLOCK_REALTIME, &ts);
    core->generation = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if (getrandom(core->capability, sizeof(core->capability), 0) !=
        (ssize_t)sizeof(core->capability)) {
        int rc = -errno;
        kvx_log(NULL, KVX_LOG_ERROR, "kvx_transport_create: getrandom: %s", strerror(errno));
        return rc;
    }
    return 0;
}

/* The backend (and an owned region: KVX_PARAM_OWN_REGION), the metadata, the progress thread: 0,
 * or a negative errno (all of it undone). */
static int kvx_transport_start(kvx_transport_t *t, const kvx_params_t *params)
{
    kvx_region_t *main;
    int rc = kvx_ucx_init(&(kvx_ucx_config_t){.log = t->core.log,
                                              .keepalive_ms = t->core.keepalive_ms,
                                              .net_devices = t->net_devices},
                          &kvx_transport_ucx_ops, t, &t->core.ucx);

    if (rc < 0)
        return rc;
    if (params->field_mask & KVX_PARAM_OWN_REGION) {
        void *base;
        rc = kvx_ucx_region_alloc(t->core.ucx, t->core.region_len, &base, &t->rkey, &t->rkey_len,
                                  t->core.seg_token);
        if (rc < 0)
            goto err_ucx;
        t->core.base = base;
        t->owned = true;
    }
    /* the main region, KVX_REGION_MAIN, among the others (its capability is the connection's);
     * none for a transport made without one */
    rc = t->core.base == NULL ? 0
                              : kvx_region_add(&t->core, t->core.base, t->core.region_len,
                                               KVX_REGION_WRITE | KVX_REGION_READ,
                                               (const uint8_t[16]){0}, true, &main);
    if (rc < 0)
        goto err_ucx;
    rc = kvx_metadata_build(t);
    if (rc < 0)
        goto err_ucx;
    if (t->num_threads > 0) {
        rc = kvx_progress_start(&t->engine);
        if (rc < 0)
            goto err_md;
    }
    return 0;

err_md:
    kvx_peers_metadata(&t->peers, NULL, 0);
    free(t->metadata);
    t->metadata = NULL;
err_ucx:
    kvx_region_free_all(&t->core);
    kvx_ucx_free(t->core.ucx);
    t->core.ucx = NULL;
    return rc;
}

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
    rc = kvx_transport_alloc(&t);
    if (rc < 0)
        return rc;
    rc = kvx_recv_init(&t->recv, &t->core,
                       (params->field_mask & KVX_PARAM_NOTICES) ? params->notice_queue
                                                                : KVX_DEFAULT_NOTICES);
    if (rc == 0)
        rc = kvx_transport_settings(t, params);
    if (rc == 0)
        rc = kvx_transport_identity(&t->core);
    if (rc == 0)
        rc = kvx_transport_start(t, params);
    if (rc < 0) {
        kvx_engine_fini(&t->engine);
        pthread_cond_destroy(&t->core.cond);
        pthread_mutex_destroy(&t->core.lock);
        kvx_transport_free_params(t);
        free(t);
        return rc;
    }
    kvx_info(&t->core,
             "created: %llu blocks of %llu bytes at %p%s, fingerprint '%s', %u progress thread(s)",
             (unsigned long long)t->core.num_blocks, (unsigned long long)t->core.block_len,
             (void *)t->core.base, t->owned ? " (owned)" : "", t->core.fingerprint,
             t->engine.thread_running ? 1u : 0u);
    *transport_p = t;
    return 0;
}

/* How long close waits for connections to close before destroying the worker anyway. */
#define KVX_CLOSE_DRAIN_NS (2ull * 1000000000ull)

/* Close begins (lock held): from here every other call returns -ESHUTDOWN. Calls waiting with the
 * lock released (in kvx_transport_wait, or in kvx_core_wait) wake, see it and leave; the teardown
 * starts once none is left. The lock is released, and the progress thread stopped. */
static void kvx_transport_close_calls(kvx_transport_t *t)
{
    t->core.closed = true;
    t->engine.cq_signaled = false; /* one count for every waiter, whatever was signaled before */
    kvx_notify_waiters(&t->engine);
    pthread_cond_broadcast(&t->core.cond);
    while (t->core.unlocked_calls > 0 || t->engine.waiters > 0)
        pthread_cond_wait(&t->core.cond, &t->core.lock);
    kvx_unlock(&t->core);
    kvx_progress_stop(&t->engine);
}

/* Every peer's connection, receiving connection and pairing closes, while UCX still runs. */
static void kvx_transport_close_conns(kvx_transport_t *t)
{
    uint64_t end;
    size_t slot = 0;

    for (kvx_peer_t *p = kvx_peer_next(&t->core, &slot, NULL); p != NULL;
         p = kvx_peer_next(&t->core, &slot, p)) {
        kvx_conn_t *c = p->conn;
        kvx_reconnect_forget(&t->peers, p);
        kvx_xfer_unpark(p, NULL, -ECONNABORTED);
        if (c == NULL)
            continue;
        p->conn = NULL;
        kvx_conn_release(c, -ECONNABORTED);
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
}

/* The worker goes, then everything of every layer: anything UCX still called back during the
 * teardown found its objects alive. */
static void kvx_transport_close_free(kvx_transport_t *t)
{
    kvx_conns_unmap_all(&t->conns);
    kvx_ucx_fini(t->core.ucx);
    kvx_conns_free_all(&t->conns);
    kvx_recv_free_all(&t->recv);
    kvx_pairings_free_all(&t->peers);
    kvx_xfer_free_all(&t->core);
    kvx_peer_free_all(&t->core);
    kvx_region_free_all(&t->core);
    kvx_peers_metadata(&t->peers, NULL, 0);
    free(t->metadata);
    t->metadata = NULL;
    kvx_old_md_free(t);
    kvx_engine_closed(&t->engine); /* a loop waiting on an event fd wakes, its calls say closed */
}

int kvx_transport_close(kvx_transport_t *t)
{
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
    kvx_transport_close_calls(t);
    kvx_lock(&t->core);
    kvx_transport_close_conns(t);
    kvx_transport_close_free(t);
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
    if (attr->field_mask & KVX_TRANSPORT_ATTR_REGIONS)
        attr->regions = t->core.regions.counters;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_THREAD) {
        attr->thread_mode = t->engine.thread_drives ? KVX_THREAD_DRIVES : KVX_THREAD_YIELDS;
        attr->thread_asides = t->engine.thread_asides;
    }
    kvx_unlock(&t->core);
    return 0;
}
