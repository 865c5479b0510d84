/*
 * The transport's tables: peers by id (a chained hash) and connections by the id their messages
 * carry. No transport state beyond the tables themselves; every layer above may use them.
 */
#include "core/kvx_objects.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the peer table: a chained hash by peer id ---------------------------------------------- */

kvx_peer_t *kvx_peer_lookup(const kvx_transport_t *t, const char *id)
{
    if (t->ptab_cap == 0)
        return NULL;
    for (kvx_peer_t *p = t->ptab[kvx_hash_str(id) & (t->ptab_cap - 1)]; p != NULL; p = p->hnext)
        if (strcmp(p->id, id) == 0)
            return p;
    return NULL;
}

int kvx_peer_insert(kvx_transport_t *t, kvx_peer_t *p)
{
    if (t->npeers + 1 > t->ptab_cap) {
        size_t cap = t->ptab_cap ? t->ptab_cap * 2 : 16;
        kvx_peer_t **tab = calloc(cap, sizeof(*tab));
        if (tab == NULL)
            return -ENOMEM;
        for (size_t i = 0; i < t->ptab_cap; i++) {
            kvx_peer_t *q, *next;
            for (q = t->ptab[i]; q != NULL; q = next) {
                next = q->hnext;
                q->hnext = tab[kvx_hash_str(q->id) & (cap - 1)];
                tab[kvx_hash_str(q->id) & (cap - 1)] = q;
            }
        }
        free(t->ptab);
        t->ptab = tab;
        t->ptab_cap = cap;
    }
    size_t b = kvx_hash_str(p->id) & (t->ptab_cap - 1);
    p->hnext = t->ptab[b];
    t->ptab[b] = p;
    t->npeers++;
    return 0;
}

static void kvx_peer_unlink(kvx_transport_t *t, kvx_peer_t *p)
{
    kvx_peer_t **pp = &t->ptab[kvx_hash_str(p->id) & (t->ptab_cap - 1)];

    while (*pp != p)
        pp = &(*pp)->hnext;
    *pp = p->hnext;
    t->npeers--;
}

/* A removed peer lives on while the application still has transfers of it to poll. */
void kvx_peer_maybe_free(kvx_transport_t *t, kvx_peer_t *p)
{
    if (!p->removed || p->conn != NULL || p->nxfers != 0 || p->turn_now != p->turn_next)
        return;
    kvx_peer_unlink(t, p);
    free(p->addr);
    free(p->id);
    free(p);
}

void kvx_peer_free_all(kvx_transport_t *t)
{
    for (size_t i = 0; i < t->ptab_cap; i++) {
        kvx_peer_t *p, *next;
        for (p = t->ptab[i]; p != NULL; p = next) {
            next = p->hnext;
            free(p->addr);
            free(p->id);
            free(p);
        }
    }
    free(t->ptab);
    t->ptab = NULL;
    t->ptab_cap = t->npeers = t->nconnected = 0;
}

bool kvx_peer_id_ok(const char *id)
{
    size_t n;

    if (id == NULL)
        return false;
    n = strnlen(id, KVX_PEER_ID_MAX + 1);
    return n >= 1 && n <= KVX_PEER_ID_MAX;
}

/* An entry for a new id, invisible (removed) until a connection is installed. */
kvx_peer_t *kvx_peer_new(kvx_transport_t *t, const char *peer_id)
{
    kvx_peer_t *p = calloc(1, sizeof(*p));

    if (p == NULL || (p->id = strdup(peer_id)) == NULL || kvx_peer_insert(t, p) < 0) {
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

/* ---- ids of connections: what their messages carry --------------------------------------- */

int kvx_idtab_alloc(kvx_idtab_t *tab, void *obj, uint32_t *id_p)
{
    uint32_t i;

    for (i = tab->free_hint; i < tab->cap && tab->slots[i] != NULL; i++)
        ;
    if (i == tab->cap) {
        uint32_t cap = tab->cap ? tab->cap * 2 : 64;
        void **slots = realloc(tab->slots, cap * sizeof(*slots));
        if (slots == NULL)
            return -ENOMEM;
        memset(slots + tab->cap, 0, (cap - tab->cap) * sizeof(*slots));
        i = tab->cap;
        tab->slots = slots;
        tab->cap = cap;
    }
    if (i == 0) /* id 0 is never given: an unset field names nothing */
        i = 1;
    tab->slots[i] = obj;
    tab->free_hint = i + 1;
    *id_p = i;
    return 0;
}

void *kvx_idtab_get(const kvx_idtab_t *tab, uint32_t id)
{
    return id != 0 && id < tab->cap ? tab->slots[id] : NULL;
}

void kvx_idtab_release(kvx_idtab_t *tab, uint32_t id)
{
    if (id == 0 || id >= tab->cap)
        return;
    tab->slots[id] = NULL;
    if (id < tab->free_hint)
        tab->free_hint = id;
}
