/*
 * The transport core: create and close, transfer ids and slots, per-peer completion queues, poll
 * and cancel. A transfer completes here (kvx_xfer_complete) and leaves through kvx_transport_poll.
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define KVX_SLOT_BITS 20
#define KVX_SLOT_MASK ((1ull << KVX_SLOT_BITS) - 1)
#define KVX_DEFAULT_DEADLINE_MS 5000
#define KVX_DEFAULT_KEEPALIVE_MS 1000

uint64_t kvx_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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

    if (!(p->field_mask & KVX_PARAM_REGION) || p->base == NULL || p->num_blocks == 0 ||
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
    return 0;
}

static int kvx_metadata_build(kvx_transport_t *t)
{
    kvx_md_t md = {0};
    const void *waddr, *rkey;
    size_t waddr_len, rkey_len;
    int rc;

    kvx_ucx_local_info(t, &waddr, &waddr_len, &rkey, &rkey_len);
    snprintf(md.agent_name, sizeof(md.agent_name), "%s", t->name);
    snprintf(md.fingerprint, sizeof(md.fingerprint), "%s", t->fingerprint);
    md.base = (uintptr_t)t->base;
    md.num_blocks = t->num_blocks;
    md.block_len = t->block_len;
    md.worker_addr = waddr;
    md.worker_addr_len = (uint32_t)waddr_len;
    md.rkey = rkey;
    md.rkey_len = (uint32_t)rkey_len;
    t->metadata_len = kvx_md_encoded_len(&md);
    t->metadata = malloc(t->metadata_len);
    if (t->metadata == NULL)
        return -ENOMEM;
    rc = kvx_md_encode(&md, t->metadata, t->metadata_len);
    return rc < 0 ? rc : 0;
}

int kvx_transport_create(const kvx_params_t *params, kvx_transport_t **transport_p)
{
    kvx_transport_t *t;
    int rc;

    if (params == NULL || transport_p == NULL)
        return -EINVAL;
    rc = kvx_params_check(params);
    if (rc < 0) {
        kvx_error(NULL, "kvx_transport_create: invalid parameters");
        return rc;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    pthread_mutex_init(&t->lock, NULL);
    kvx_list_init(&t->ready);
    kvx_list_init(&t->conns);
    kvx_list_init(&t->work);
    kvx_list_init(&t->active);
    t->next_deadline_ns = UINT64_MAX;
    t->next_seq = 1;
    t->wake_fd = -1;
    t->cq_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->cq_fd < 0) {
        rc = -errno;
        free(t);
        return rc;
    }
    t->base = params->base;
    t->num_blocks = params->num_blocks;
    t->block_len = params->block_len;
    if (params->field_mask & KVX_PARAM_AGENT_NAME)
        snprintf(t->name, sizeof(t->name), "%s", params->agent_name);
    else
        kvx_default_name(t->name, sizeof(t->name));
    if ((params->field_mask & KVX_PARAM_FINGERPRINT) && params->fingerprint != NULL)
        snprintf(t->fingerprint, sizeof(t->fingerprint), "%s", params->fingerprint);
    t->num_threads = (params->field_mask & KVX_PARAM_NUM_THREADS) ? params->num_threads : 1;
    t->deadline_ns = ((params->field_mask & KVX_PARAM_DEADLINE) ? params->deadline_ms
                                                                : KVX_DEFAULT_DEADLINE_MS) *
                     1000000ull;
    t->keepalive_ms = (params->field_mask & KVX_PARAM_KEEPALIVE) ? params->keepalive_ms
                                                                 : KVX_DEFAULT_KEEPALIVE_MS;
    if (params->field_mask & KVX_PARAM_LOG) {
        t->own_log = true;
        t->log_fn = params->log_fn;
        t->log_arg = params->log_arg;
        t->log_level = params->log_level;
    }

    rc = kvx_ucx_init(t);
    if (rc < 0)
        goto err_free;
    rc = kvx_metadata_build(t);
    if (rc < 0)
        goto err_ucx;
    if (t->num_threads > 0) {
        rc = kvx_progress_start(t);
        if (rc < 0)
            goto err_md;
    }
    kvx_info(t, "created: %llu blocks of %llu bytes at %p, fingerprint '%s', %u progress thread(s)",
             (unsigned long long)t->num_blocks, (unsigned long long)t->block_len, (void *)t->base,
             t->fingerprint, t->thread_running ? 1u : 0u);
    *transport_p = t;
    return 0;

err_md:
    free(t->metadata);
err_ucx:
    kvx_ucx_fini(t);
err_free:
    close(t->cq_fd);
    pthread_mutex_destroy(&t->lock);
    free(t);
    return rc;
}

int kvx_transport_close(kvx_transport_t *t)
{
    if (t == NULL)
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return 0;
    }
    kvx_unlock(t);
    kvx_progress_stop(t);

    kvx_lock(t);
    for (size_t i = 0; i < t->ptab_cap; i++) {
        for (kvx_peer_t *p = t->ptab[i]; p != NULL; p = p->hnext) {
            kvx_conn_t *c = p->conn;
            if (c == NULL)
                continue;
            p->conn = NULL;
            kvx_conn_release(c, -ECONNABORTED);
        }
    }
    kvx_conn_wait_closed(t);
    /* Anything UCX still calls back during teardown finds its objects alive; free them after. */
    kvx_ucx_fini(t);
    while (!kvx_list_empty(&t->conns)) {
        kvx_conn_t *c = kvx_list_first(&t->conns, kvx_conn_t, all_link);
        kvx_list_del(&c->all_link);
        kvx_warn(t, "connection to %s did not close in time", c->agent_name);
        free(c->ucx); /* the worker is gone: nothing left to release in UCX */
        kvx_xfer_free_flushes(c);
        free(c);
    }
    kvx_xfer_free_all(t);
    kvx_peer_free_all(t);
    free(t->metadata);
    t->metadata = NULL;
    close(t->cq_fd);
    t->cq_fd = -1;
    t->closed = true;
    kvx_info(t, "closed");
    kvx_unlock(t);
    return 0;
}

void kvx_transport_destroy(kvx_transport_t *t)
{
    if (t == NULL)
        return;
    kvx_transport_close(t);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int kvx_transport_query(kvx_transport_t *t, kvx_transport_attr_t *attr)
{
    if (t == NULL || attr == NULL)
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return -ESHUTDOWN;
    }
    if (attr->field_mask & KVX_TRANSPORT_ATTR_AGENT_NAME)
        memcpy(attr->agent_name, t->name, sizeof(attr->agent_name));
    if (attr->field_mask & KVX_TRANSPORT_ATTR_FINGERPRINT)
        memcpy(attr->fingerprint, t->fingerprint, sizeof(attr->fingerprint));
    if (attr->field_mask & KVX_TRANSPORT_ATTR_REGION) {
        attr->base = t->base;
        attr->num_blocks = t->num_blocks;
        attr->block_len = t->block_len;
    }
    if (attr->field_mask & KVX_TRANSPORT_ATTR_NUM_THREADS)
        attr->num_threads = t->thread_running ? 1 : 0;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_DEADLINE)
        attr->deadline_ms = t->deadline_ns / 1000000ull;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_METADATA_LEN)
        attr->metadata_len = t->metadata_len;
    if (attr->field_mask & KVX_TRANSPORT_ATTR_NUM_PEERS)
        attr->num_peers = t->nconnected;
    kvx_unlock(t);
    return 0;
}

int kvx_transport_metadata(kvx_transport_t *t, void *buf, size_t *len_p)
{
    int rc = 0;

    if (t == NULL || len_p == NULL || (buf == NULL && *len_p != 0))
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
    } else if (*len_p < t->metadata_len) {
        *len_p = t->metadata_len;
        rc = -ENOSPC;
    } else {
        memcpy(buf, t->metadata, t->metadata_len);
        *len_p = t->metadata_len;
    }
    kvx_unlock(t);
    return rc;
}

/* ---- transfer slots and ids ----------------------------------------------------------------- */

/* An id is (sequence << KVX_SLOT_BITS | slot): unique for the transport's life, found in O(1).
 * Returns 0, -ENOSPC when 2^KVX_SLOT_BITS transfers are in flight, or -ENOMEM. */
int kvx_xfer_alloc(kvx_transport_t *t, kvx_xfer_t **x_p)
{
    kvx_xfer_t *x = t->free_xfers;

    if (x != NULL) {
        t->free_xfers = x->next_free;
    } else {
        if (t->nslots > KVX_SLOT_MASK)
            return -ENOSPC;
        if ((t->nslots & (t->nslots - 1)) == 0) { /* grow at powers of two */
            uint32_t cap = t->nslots ? t->nslots * 2 : 64;
            kvx_xfer_t **slots = realloc(t->slots, cap * sizeof(*slots));
            if (slots == NULL)
                return -ENOMEM;
            t->slots = slots;
        }
        x = calloc(1, sizeof(*x));
        if (x == NULL)
            return -ENOMEM;
        x->t = t;
        x->slot = t->nslots;
        t->slots[t->nslots++] = x;
    }
    x->next_free = NULL;
    x->id = (t->next_seq++ << KVX_SLOT_BITS) | x->slot;
    x->canceled = false;
    x->status = 0;
    x->nruns = x->next_run = 0;
    x->conn = NULL;
    x->peer = NULL;
    kvx_list_init(&x->conn_link);
    kvx_list_init(&x->active_link);
    *x_p = x;
    return 0;
}

/* Return a slot to the free list: nothing (kvx or UCX) refers to the transfer any more. */
void kvx_xfer_free(kvx_transport_t *t, kvx_xfer_t *x)
{
    x->state = KVX_XS_FREE;
    x->conn = NULL;
    x->peer = NULL;
    /* Give back memory of unusually large transfers; keep the common size for reuse. */
    if (x->runs_cap > 65536) {
        free(x->runs);
        x->runs = NULL;
        x->runs_cap = 0;
    }
    x->next_free = t->free_xfers;
    t->free_xfers = x;
}

kvx_xfer_t *kvx_xfer_lookup(kvx_transport_t *t, uint64_t id)
{
    uint64_t slot = id & KVX_SLOT_MASK;
    kvx_xfer_t *x;

    if (slot >= t->nslots)
        return NULL;
    x = t->slots[slot];
    if (x->id != id || x->state == KVX_XS_FREE)
        return NULL;
    return x;
}

void kvx_xfer_free_all(kvx_transport_t *t)
{
    for (uint32_t i = 0; i < t->nslots; i++) {
        free(t->slots[i]->runs);
        free(t->slots[i]);
    }
    free(t->slots);
    t->slots = NULL;
    t->nslots = 0;
    t->free_xfers = NULL;
    kvx_list_init(&t->active);
    kvx_list_init(&t->ready);
}

/* ---- completion ----------------------------------------------------------------------------- */

/* Finish a transfer: it leaves every connection list and waits in its peer's queue for poll. */
void kvx_xfer_complete(kvx_xfer_t *x, int status)
{
    kvx_peer_t *p = x->peer;
    uint64_t now = kvx_now_ns(), lat = now - x->t_submit_ns;

    if (x->canceled)
        status = -ECANCELED;
    x->status = status;
    x->t_done_ns = now;
    x->state = KVX_XS_DONE;
    kvx_list_del(&x->conn_link);
    kvx_list_del(&x->active_link);
    p->inflight--;
    if (status == 0) {
        p->xfers_done++;
        if (x->op == KVX_OP_WRITE)
            p->bytes_written += x->bytes;
        else
            p->bytes_read += x->bytes;
    } else {
        p->xfers_failed++;
    }
    p->lat_sum_ns += lat;
    if (lat > p->lat_max_ns)
        p->lat_max_ns = lat;
    kvx_list_add_tail(&p->cq, &x->conn_link);
    if (!kvx_list_linked(&p->ready_link))
        kvx_list_add_tail(&x->t->ready, &p->ready_link);
    if (x->t->waiters > 0)
        kvx_progress_notify_waiters(x->t);
}

/* The application is done with a transfer (polled or canceled). */
void kvx_xfer_release(kvx_xfer_t *x)
{
    kvx_transport_t *t = x->t;
    kvx_peer_t *p = x->peer;

    kvx_list_del(&x->conn_link);
    kvx_list_del(&x->active_link);
    x->peer = NULL;
    if (p != NULL) {
        p->nxfers--;
        if (kvx_list_empty(&p->cq) && kvx_list_linked(&p->ready_link))
            kvx_list_del(&p->ready_link);
    }
    kvx_xfer_free(t, x);
    if (p != NULL)
        kvx_peer_maybe_free(t, p);
}

static size_t kvx_cq_drain(kvx_peer_t *p, kvx_completion_t *out, size_t max)
{
    size_t n = 0;

    while (n < max && !kvx_list_empty(&p->cq)) {
        kvx_xfer_t *x = kvx_list_first(&p->cq, kvx_xfer_t, conn_link);
        out[n].id = x->id;
        out[n].status = x->status;
        out[n].flags = x->op == KVX_OP_READ ? KVX_COMPLETION_READ : 0;
        out[n].bytes = x->bytes;
        out[n].duration_ns = x->t_done_ns - x->t_submit_ns;
        n++;
        /* the last release may free the peer: stop touching it then */
        bool last = p->nxfers == 1 && p->removed;
        kvx_xfer_release(x);
        if (last)
            break;
    }
    return n;
}

int kvx_transport_poll(kvx_transport_t *t, const char *peer_id, kvx_completion_t *out, size_t max)
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
    atomic_store_explicit(&t->app_poll_ns, kvx_now_ns(), memory_order_relaxed);
    if (peer_id != NULL) {
        kvx_peer_t *p = kvx_peer_lookup(t, peer_id);
        if (p != NULL)
            n = kvx_cq_drain(p, out, max);
    } else {
        while (n < max && !kvx_list_empty(&t->ready)) {
            kvx_peer_t *p = kvx_list_first(&t->ready, kvx_peer_t, ready_link);
            /* rotate, so that one busy peer cannot starve the others */
            kvx_list_del(&p->ready_link);
            kvx_list_add_tail(&t->ready, &p->ready_link);
            n += kvx_cq_drain(p, out + n, max - n);
        }
    }
    kvx_unlock(t);
    return (int)n;
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
    kvx_lock(t);
    if (t->closed) {
        kvx_unlock(t);
        return -ESHUTDOWN;
    }
    call = ++t->cancel_calls;
    for (size_t i = 0; i < count; i++) {
        kvx_xfer_t *x = kvx_xfer_lookup(t, ids[i]);
        bool untouched;

        if (x == NULL)
            continue;
        /* Nothing handed to UCX yet, or already finished: forget it at once. */
        untouched = x->state == KVX_XS_QUEUED && x->next_run == 0;
        if (x->state == KVX_XS_DONE || untouched) {
            if (untouched)
                x->peer->inflight--;
            kvx_xfer_release(x);
            continue;
        }
        if (mode == KVX_CANCEL_IMMEDIATE) {
            /* UCX may still move its bytes; the caller accepted that. */
            x->peer->inflight--;
            kvx_xfer_release(x);
            continue;
        }
        /* Wait: stop posting its remaining runs; it completes (as -ECANCELED) once UCX is done
         * with what was posted. An id given twice in one call is reported once. */
        if (x->canceled && x->cancel_call == call)
            continue;
        x->canceled = true;
        x->cancel_call = call;
        if (x->state == KVX_XS_QUEUED && x->nruns > x->next_run) {
            x->nruns = x->next_run;
            if (!kvx_list_linked(&x->conn->work_link))
                kvx_list_add_tail(&t->work, &x->conn->work_link);
            kvx_progress_kick(t, 0);
        }
        if (pending != NULL)
            pending[np] = x->id;
        np++;
    }
    kvx_unlock(t);
    return np;
}
