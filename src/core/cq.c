/*
 * Transfer objects: pooled, found by id (an open-addressing table), and how a transfer ends:
 * kvx_xfer_complete puts it in its peer's completion queue, where kvx_transport_poll finds it
 * (kvx_cq_drain), and kvx_xfer_release gives the object back.
 */
#include "core/kvx_objects.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Transfers in flight or unpolled at once, at most. */
#define KVX_MAX_XFERS (1u << 20)
/* The pool keeps this many idle transfer objects at least, and at most what the busier of the
 * last two housekeeping periods had in use: bursts reuse objects, idle transports give them
 * back. */
#define KVX_POOL_MIN 64
/* An idle transfer object keeps its run array up to this many runs (12 bytes each). */
#define KVX_POOL_RUNS_KEEP 1024

/* ---- transfer ids and the object pool -------------------------------------------------------- */

/* Fibonacci hashing of a 64-bit id into a table of 2^k slots. */
static size_t kvx_idmap_home(const kvx_idmap_t *m, uint64_t id)
{
    return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 32) & (m->cap - 1);
}

static int kvx_idmap_grow(kvx_idmap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : 128;
    kvx_xfer_t **slots = calloc(cap, sizeof(*slots)), **old = m->slots;
    size_t old_cap = m->cap;

    if (slots == NULL)
        return -ENOMEM;
    m->slots = slots;
    m->cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i] == NULL)
            continue;
        size_t j = kvx_idmap_home(m, old[i]->id);
        while (slots[j] != NULL)
            j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    free(old);
    return 0;
}

static int kvx_idmap_insert(kvx_idmap_t *m, kvx_xfer_t *x)
{
    size_t j;

    if ((m->count + 1) * 2 > m->cap && kvx_idmap_grow(m) < 0)
        return -ENOMEM;
    j = kvx_idmap_home(m, x->id);
    while (m->slots[j] != NULL)
        j = (j + 1) & (m->cap - 1);
    m->slots[j] = x;
    m->count++;
    return 0;
}

static size_t kvx_idmap_find(const kvx_idmap_t *m, uint64_t id)
{
    size_t j;

    if (m->cap == 0)
        return SIZE_MAX;
    for (j = kvx_idmap_home(m, id); m->slots[j] != NULL; j = (j + 1) & (m->cap - 1))
        if (m->slots[j]->id == id)
            return j;
    return SIZE_MAX;
}

/* Linear probing without tombstones: entries after the hole move back when their home allows. */
static void kvx_idmap_remove(kvx_idmap_t *m, uint64_t id)
{
    size_t hole = kvx_idmap_find(m, id), j, mask = m->cap - 1;

    if (hole == SIZE_MAX)
        return;
    m->slots[hole] = NULL;
    m->count--;
    for (j = (hole + 1) & mask; m->slots[j] != NULL; j = (j + 1) & mask) {
        size_t home = kvx_idmap_home(m, m->slots[j]->id);
        /* the entry at j may fill the hole unless its home lies in (hole, j] */
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            m->slots[hole] = m->slots[j];
            m->slots[j] = NULL;
            hole = j;
        }
    }
}

/* An id is a 64-bit sequence number: unique for the transport's life. Returns 0, -ENOSPC when
 * KVX_MAX_XFERS transfers are in flight or unpolled, or -ENOMEM. */
int kvx_xfer_alloc(kvx_transport_t *t, kvx_xfer_t **x_p)
{
    kvx_xfer_t *x = t->free_xfers;

    if (t->nlive >= KVX_MAX_XFERS)
        return -ENOSPC;
    if (x != NULL) {
        t->free_xfers = x->next_free;
        t->nfree--;
    } else {
        x = calloc(1, sizeof(*x));
        if (x == NULL)
            return -ENOMEM;
        x->t = t;
        t->xfer_mallocs++;
    }
    x->next_free = NULL;
    x->id = t->next_seq++;
    if (kvx_idmap_insert(&t->ids, x) < 0) {
        x->next_free = t->free_xfers;
        t->free_xfers = x;
        t->nfree++;
        return -ENOMEM;
    }
    t->nlive++;
    if (t->nlive > t->live_peak)
        t->live_peak = t->nlive;
    x->canceled = false;
    x->purged = false;
    x->notify = false;
    x->noticed = false;
    x->status = 0;
    x->nruns = x->next_run = 0;
    x->run_off = 0;
    x->posted = x->done = 0;
    x->sending = 0;
    x->conn = NULL;
    x->peer = NULL;
    kvx_list_init(&x->conn_link);
    kvx_list_init(&x->active_link);
    *x_p = x;
    return 0;
}

static void kvx_xfer_destroy(kvx_xfer_t *x)
{
    free(x->runs);
    free(x);
}

/* Return a transfer object to the pool: nothing (kvx or UCX) refers to the transfer any more. */
void kvx_xfer_free(kvx_transport_t *t, kvx_xfer_t *x)
{
    kvx_idmap_remove(&t->ids, x->id);
    t->nlive--;
    x->state = KVX_XS_FREE;
    x->conn = NULL;
    x->peer = NULL;
    /* an idle object keeps a run array of the common size, not that of an unusual transfer */
    if (x->runs_cap > KVX_POOL_RUNS_KEEP) {
        free(x->runs);
        x->runs = NULL;
        x->runs_cap = 0;
    }
    x->next_free = t->free_xfers;
    t->free_xfers = x;
    t->nfree++;
}

/* Called once per housekeeping period: give back idle objects beyond what the busier of this
 * and the previous period needed (KVX_POOL_MIN at least). */
void kvx_xfer_trim_pool(kvx_transport_t *t)
{
    size_t peak = t->live_peak > t->live_peak_prev ? t->live_peak : t->live_peak_prev;
    size_t keep = peak > KVX_POOL_MIN ? peak : KVX_POOL_MIN;

    while (t->nfree > 0 && t->nfree + t->nlive > keep) {
        kvx_xfer_t *x = t->free_xfers;
        t->free_xfers = x->next_free;
        t->nfree--;
        kvx_xfer_destroy(x);
    }
    t->live_peak_prev = t->live_peak;
    t->live_peak = t->nlive;
}

kvx_xfer_t *kvx_xfer_lookup(kvx_transport_t *t, uint64_t id)
{
    size_t j = kvx_idmap_find(&t->ids, id);

    return j == SIZE_MAX ? NULL : t->ids.slots[j];
}

void kvx_xfer_free_all(kvx_transport_t *t)
{
    for (size_t i = 0; i < t->ids.cap; i++)
        if (t->ids.slots[i] != NULL)
            kvx_xfer_destroy(t->ids.slots[i]);
    free(t->ids.slots);
    memset(&t->ids, 0, sizeof(t->ids));
    while (t->free_xfers != NULL) {
        kvx_xfer_t *x = t->free_xfers;
        t->free_xfers = x->next_free;
        kvx_xfer_destroy(x);
    }
    t->nfree = t->nlive = 0;
    kvx_list_init(&t->active);
    kvx_list_init(&t->ready);
}

void kvx_xfer_purge(kvx_xfer_t *x)
{
    if (x->purged)
        return;
    x->purged = true;
    x->peer->npurged++;
}

/* ---- completion ----------------------------------------------------------------------------- */

/* Finish a transfer: it leaves every connection list and waits in its peer's queue for poll
 * (or, purged by kvx_peer_remove_ex, is forgotten). */
void kvx_xfer_complete(kvx_xfer_t *x, int status)
{
    kvx_peer_t *p = x->peer;
    uint64_t now = kvx_now_ns(), lat = now - x->t_submit_ns;

    kvx_stats_xfer(x->t, p, x->op, x->canceled ? -ECANCELED : status, x->bytes, lat);
    if (x->purged) {
        p->inflight--;
        kvx_xfer_release(x);
        return;
    }
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
        kvx_notify_waiters(x->t);
    if (x->t->ev_used)
        kvx_events_update(x->t);
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
        if (x->purged)
            p->npurged--;
        if (kvx_list_empty(&p->cq) && kvx_list_linked(&p->ready_link)) {
            kvx_list_del(&p->ready_link);
            if (t->ev_used)
                kvx_events_update(t);
        }
    }
    kvx_xfer_free(t, x);
    if (p != NULL)
        kvx_peer_maybe_free(t, p);
}

size_t kvx_cq_drain(kvx_peer_t *p, kvx_completion_t *out, size_t max)
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
