/*
 * The peers by id: a chained hash of the core's. A peer is made invisible (removed) and stays
 * while anything names it: a connection, transfers not yet freed, adds and removes of its id.
 */
#include "core/kvx_core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

kvx_peer_t *kvx_peer_lookup(const kvx_core_t *c, const char *id)
{
    if (c->ptab_cap == 0)
        return NULL;
    for (kvx_peer_t *p = c->ptab[kvx_hash_str(id) & (c->ptab_cap - 1)]; p != NULL; p = p->hnext)
        if (strcmp(p->id, id) == 0)
            return p;
    return NULL;
}

static int kvx_peer_insert(kvx_core_t *c, kvx_peer_t *p)
{
    if (c->npeers + 1 > c->ptab_cap) {
        size_t cap = c->ptab_cap ? c->ptab_cap * 2 : 16;
        kvx_peer_t **tab = calloc(cap, sizeof(*tab));
        if (tab == NULL)
            return -ENOMEM;
        for (size_t i = 0; i < c->ptab_cap; i++) {
            kvx_peer_t *q, *next;
            for (q = c->ptab[i]; q != NULL; q = next) {
                next = q->hnext;
                q->hnext = tab[kvx_hash_str(q->id) & (cap - 1)];
                tab[kvx_hash_str(q->id) & (cap - 1)] = q;
            }
        }
        free(c->ptab);
        c->ptab = tab;
        c->ptab_cap = cap;
    }
    size_t b = kvx_hash_str(p->id) & (c->ptab_cap - 1);
    p->hnext = c->ptab[b];
    c->ptab[b] = p;
    c->npeers++;
    return 0;
}

static void kvx_peer_unlink(kvx_core_t *c, kvx_peer_t *p)
{
    kvx_peer_t **pp = &c->ptab[kvx_hash_str(p->id) & (c->ptab_cap - 1)];

    while (*pp != p)
        pp = &(*pp)->hnext;
    *pp = p->hnext;
    c->npeers--;
}

void kvx_peer_maybe_free(kvx_core_t *c, kvx_peer_t *p)
{
    if (!p->removed || p->conn != NULL || p->nxfers != 0 || p->turn_now != p->turn_next)
        return;
    kvx_peer_unlink(c, p);
    free(p->addr);
    free(p->id);
    free(p);
}

void kvx_peer_free_all(kvx_core_t *c)
{
    for (size_t i = 0; i < c->ptab_cap; i++) {
        kvx_peer_t *p, *next;
        for (p = c->ptab[i]; p != NULL; p = next) {
            next = p->hnext;
            free(p->addr);
            free(p->id);
            free(p);
        }
    }
    free(c->ptab);
    c->ptab = NULL;
    c->ptab_cap = c->npeers = c->nconnected = 0;
}

bool kvx_peer_id_ok(const char *id)
{
    size_t n;

    if (id == NULL)
        return false;
    n = strnlen(id, KVX_PEER_ID_MAX + 1);
    return n >= 1 && n <= KVX_PEER_ID_MAX;
}

kvx_peer_t *kvx_peer_new(kvx_core_t *c, const char *peer_id)
{
    kvx_peer_t *p = calloc(1, sizeof(*p));

    if (p == NULL || (p->id = strdup(peer_id)) == NULL || kvx_peer_insert(c, p) < 0) {
        if (p != NULL)
            free(p->id);
        free(p);
        return NULL;
    }
    p->removed = true; /* until a connection is installed */
    kvx_list_init(&p->cq);
    kvx_list_init(&p->ready_link);
    kvx_list_init(&p->reconnect_link);
    kvx_list_init(&p->parked);
    return p;
}
