/*
 * The regions of this transport peers may address, by id (kvx_core.h, kvx_region_t): the table,
 * the receiving side's check of a message against the region it names (known and live,
 * capability in constant time, access), and the holds on a region's memory that a
 * deregistration waits for. A peer's regions this transport loaded are its handles (kvx_peer_t).
 */
#include "core/kvx_core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t kvx_region_hash(uint32_t id, size_t cap)
{
    return (size_t)((id * 2654435761u) & (cap - 1));
}

kvx_region_t *kvx_region_find(const kvx_core_t *c, uint32_t id)
{
    const kvx_regions_t *rs = &c->regions;

    if (rs->cap == 0 || id == 0)
        return NULL;
    for (size_t i = kvx_region_hash(id, rs->cap);; i = (i + 1) & (rs->cap - 1)) {
        kvx_region_t *r = rs->slots[i];
        if (r == NULL)
            return NULL;
        if (r->id == id)
            return r;
    }
}

static void kvx_region_place(kvx_region_t **slots, size_t cap, kvx_region_t *r)
{
    size_t i = kvx_region_hash(r->id, cap);

    while (slots[i] != NULL)
        i = (i + 1) & (cap - 1);
    slots[i] = r;
}

/* Room for one more at a load of at most a half. */
static int kvx_region_grow(kvx_regions_t *rs)
{
    size_t cap = rs->cap ? rs->cap * 2 : 64;
    kvx_region_t **slots;

    if ((rs->count + 1) * 2 <= rs->cap)
        return 0;
    slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < rs->cap; i++)
        if (rs->slots[i] != NULL)
            kvx_region_place(slots, cap, rs->slots[i]);
    free(rs->slots);
    rs->slots = slots;
    rs->cap = cap;
    return 0;
}

int kvx_region_add(kvx_core_t *c, uint8_t *base, uint64_t len, unsigned access,
                   const uint8_t cap[16], bool main, kvx_region_t **r_p)
{
    kvx_regions_t *rs = &c->regions;
    kvx_region_t *r;

    if (rs->count >= KVX_REGIONS_MAX || (!main && rs->next_id == UINT32_MAX))
        return -ENOSPC;
    if (kvx_region_grow(rs) < 0 || (r = calloc(1, sizeof(*r))) == NULL)
        return -ENOMEM;
    if (rs->next_id <= KVX_REGION_MAIN)
        rs->next_id = KVX_REGION_MAIN + 1; /* the main region's id is its own, even unused */
    r->id = main ? KVX_REGION_MAIN : rs->next_id++;
    r->base = base;
    r->len = len;
    r->access = access;
    memcpy(r->capability, cap, sizeof(r->capability));
    kvx_region_place(rs->slots, rs->cap, r);
    rs->count++;
    rs->counters.registered = rs->count;
    *r_p = r;
    return 0;
}

void kvx_region_remove(kvx_core_t *c, kvx_region_t *r)
{
    kvx_regions_t *rs = &c->regions;
    size_t mask = rs->cap - 1, i = kvx_region_hash(r->id, rs->cap), j;

    while (rs->slots[i] != r)
        i = (i + 1) & mask;
    /* backward shift: every entry after the hole that may move into it does */
    for (j = (i + 1) & mask; rs->slots[j] != NULL; j = (j + 1) & mask) {
        size_t home = kvx_region_hash(rs->slots[j]->id, rs->cap);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            rs->slots[i] = rs->slots[j];
            rs->slots[j] = NULL;
            i = j;
        }
    }
    rs->slots[i] = NULL;
    rs->count--;
    rs->counters.registered = rs->count;
    free(r);
}

void kvx_region_free_all(kvx_core_t *c)
{
    kvx_regions_t *rs = &c->regions;

    for (size_t i = 0; i < rs->cap; i++)
        free(rs->slots[i]);
    free(rs->slots);
    rs->slots = NULL;
    rs->cap = rs->count = 0;
    rs->counters.registered = 0;
}

kvx_region_t *kvx_region_check(kvx_core_t *c, uint32_t id, const uint8_t *cap, unsigned access,
                               int *err)
{
    static const uint8_t zero[16];
    kvx_region_t *r = kvx_region_find(c, id);

    if (r == NULL || r->dead) {
        c->regions.counters.drop_region++;
        *err = -ENOENT;
        return NULL;
    }
    if (!kvx_equal_ct(cap, id == KVX_REGION_MAIN ? zero : r->capability, 16)) {
        c->regions.counters.drop_region_capability++;
        *err = -EACCES;
        return NULL;
    }
    if (!(r->access & access)) {
        c->regions.counters.drop_access++;
        *err = -EACCES;
        return NULL;
    }
    return r;
}

bool kvx_xfer_names_region(const kvx_xfer_t *x, uint32_t id)
{
    for (uint32_t i = 0; i < x->nruns; i++)
        if (x->runs[i].lregion == id)
            return true;
    return false;
}

kvx_rhandle_t *kvx_rhandle_find(const kvx_peer_t *p, uint32_t handle)
{
    uint32_t lo = 0, hi = p->nrh;

    while (lo < hi) { /* handles increase: the array is sorted */
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->rh[mid].handle == handle)
            return &p->rh[mid];
        if (p->rh[mid].handle < handle)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
