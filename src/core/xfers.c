/*
 * Transfer objects: pooled, found by id (an open-addressing table), and given back
 * (kvx_xfer_free). kvx_core.h writes down a transfer's life.
 */
#include "core/kvx_core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Transfers in flight or unpolled at once, at most. */
#define KVX_MAX_XFERS (1u << 20)
/* The pool keeps this many idle transfer objects at least, and at most what the busier of the
 * last two housekeeping periods had in use: bursts reuse objects, idle transports give them
 * back. */
#define KVX_POOL_MIN 64
/* An idle transfer object keeps its run array up to this many runs (32 bytes each), and as
 * many remote regions. */
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

/* An id is a 64-bit sequence number: unique for the transport's life. At most KVX_MAX_XFERS
 * transfers are in flight or unpolled at once. */
int kvx_xfer_alloc(kvx_core_t *c, kvx_xfer_t **x_p)
{
    kvx_xfer_t *x = c->free_xfers;

    if (c->nlive >= KVX_MAX_XFERS)
        return -ENOSPC;
    if (x != NULL) {
        c->free_xfers = x->next_free;
        c->nfree--;
    } else {
        x = calloc(1, sizeof(*x));
        if (x == NULL)
            return -ENOMEM;
        x->core = c;
        c->xfer_mallocs++;
    }
    x->next_free = NULL;
    x->id = c->next_seq++;
    if (kvx_idmap_insert(&c->ids, x) < 0) {
        x->next_free = c->free_xfers;
        c->free_xfers = x;
        c->nfree++;
        return -ENOMEM;
    }
    c->nlive++;
    if (c->nlive > c->live_peak)
        c->live_peak = c->nlive;
    x->canceled = false;
    x->purged = false;
    x->notify = false;
    x->noticed = false;
    x->has_data = false;
    x->alone = false;
    x->notice_data = NULL;
    x->notice_len = 0;
    x->status = 0;
    x->nruns = x->next_run = 0;
    x->nrregs = 0;
    x->rgen = 0;
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

/* The object's memory goes (the pool gives it back, or the transport closes). */
static void kvx_xfer_dispose(kvx_xfer_t *x)
{
    free(x->runs);
    free(x->rregs);
    free(x);
}

void kvx_xfer_free(kvx_xfer_t *x)
{
    kvx_core_t *c = x->core;
    kvx_peer_t *p = x->peer;

    kvx_list_del(&x->conn_link);
    kvx_list_del(&x->active_link);
    if (p != NULL) {
        p->nxfers--;
        if (x->purged)
            p->npurged--;
        if (kvx_list_empty(&p->cq) && kvx_list_linked(&p->ready_link)) {
            kvx_list_del(&p->ready_link);
            kvx_core_polls_changed(c);
        }
    }
    kvx_idmap_remove(&c->ids, x->id);
    c->nlive--;
    x->state = KVX_XS_FREE;
    x->conn = NULL;
    x->peer = NULL;
    free(x->notice_data);
    x->notice_data = NULL;
    /* an idle object keeps a run array of the common size, not that of an unusual transfer */
    if (x->runs_cap > KVX_POOL_RUNS_KEEP) {
        free(x->runs);
        x->runs = NULL;
        x->runs_cap = 0;
    }
    if (x->rregs_cap > KVX_POOL_RUNS_KEEP) {
        free(x->rregs);
        x->rregs = NULL;
        x->rregs_cap = 0;
    }
    x->next_free = c->free_xfers;
    c->free_xfers = x;
    c->nfree++;
    if (p != NULL)
        kvx_peer_maybe_free(c, p);
}

/* Called once per housekeeping period: give back idle objects beyond what the busier of this
 * and the previous period needed (KVX_POOL_MIN at least). */
void kvx_xfer_trim_pool(kvx_core_t *c)
{
    size_t peak = c->live_peak > c->live_peak_prev ? c->live_peak : c->live_peak_prev;
    size_t keep = peak > KVX_POOL_MIN ? peak : KVX_POOL_MIN;

    while (c->nfree > 0 && c->nfree + c->nlive > keep) {
        kvx_xfer_t *x = c->free_xfers;
        c->free_xfers = x->next_free;
        c->nfree--;
        kvx_xfer_dispose(x);
    }
    c->live_peak_prev = c->live_peak;
    c->live_peak = c->nlive;
}

kvx_xfer_t *kvx_xfer_lookup(kvx_core_t *c, uint64_t id)
{
    size_t j = kvx_idmap_find(&c->ids, id);

    return j == SIZE_MAX ? NULL : c->ids.slots[j];
}

void kvx_xfer_free_all(kvx_core_t *c)
{
    for (size_t i = 0; i < c->ids.cap; i++)
        if (c->ids.slots[i] != NULL)
            kvx_xfer_dispose(c->ids.slots[i]);
    free(c->ids.slots);
    memset(&c->ids, 0, sizeof(c->ids));
    while (c->free_xfers != NULL) {
        kvx_xfer_t *x = c->free_xfers;
        c->free_xfers = x->next_free;
        kvx_xfer_dispose(x);
    }
    c->nfree = c->nlive = 0;
    kvx_list_init(&c->active);
    kvx_list_init(&c->ready);
}
