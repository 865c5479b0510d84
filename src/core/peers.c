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
    return kvx_named_entry(kvx_names_find(&c->peers, id), kvx_peer_t, by_id);
}

kvx_peer_t *kvx_peer_next(const kvx_core_t *c, size_t *slot, const kvx_peer_t *p)
{
    return kvx_named_entry(kvx_names_next(&c->peers, slot, p != NULL ? &p->by_id : NULL),
                           kvx_peer_t, by_id);
}

static void kvx_peer_free(kvx_peer_t *p)
{
    free(p->addr);
    free(p->id);
    free(p->rh);
    free(p);
}

void kvx_peer_maybe_free(kvx_core_t *c, kvx_peer_t *p)
{
    if (!p->removed || p->conn != NULL || p->nxfers != 0 || p->turn_now != p->turn_next)
        return;
    kvx_names_del(&c->peers, &p->by_id);
    kvx_peer_free(p);
}

void kvx_peer_free_all(kvx_core_t *c)
{
    size_t slot = 0;
    kvx_peer_t *next;

    for (kvx_peer_t *p = kvx_peer_next(c, &slot, NULL); p != NULL; p = next) {
        next = kvx_peer_next(c, &slot, p);
        kvx_peer_free(p);
    }
    kvx_names_fini(&c->peers);
    c->nconnected = 0;
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

    if (p != NULL && (p->id = strdup(peer_id)) != NULL)
        p->by_id.name = p->id;
    if (p == NULL || p->id == NULL || kvx_names_add(&c->peers, &p->by_id) < 0) {
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
