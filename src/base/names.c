/*
 * A table of entries by name: a chained hash whose nodes sit inside the entries, the peers by id
 * (core/peers.c) and the writers by name (conn/rconn.c). It grows by doubling, keeping at most
 * one entry per two slots; the entries are their owners'.
 */
#include "base/kvx_base.h"

#include <stdlib.h>
#include <string.h>

static kvx_named_t **kvx_names_slot(kvx_named_t **slots, size_t cap, const char *name)
{
    return &slots[kvx_hash_str(name) & (cap - 1)];
}

static int kvx_names_grow(kvx_names_t *t)
{
    size_t cap = t->cap ? t->cap * 2 : 16;
    kvx_named_t **slots = calloc(cap, sizeof(*slots));

    if (slots == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < t->cap; i++) {
        kvx_named_t *e, *next;
        for (e = t->slots[i]; e != NULL; e = next) {
            kvx_named_t **s = kvx_names_slot(slots, cap, e->name);
            next = e->next;
            e->next = *s;
            *s = e;
        }
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

int kvx_names_add(kvx_names_t *t, kvx_named_t *e)
{
    kvx_named_t **s;

    if (t->n + 1 > t->cap / 2 && kvx_names_grow(t) < 0)
        return -ENOMEM;
    s = kvx_names_slot(t->slots, t->cap, e->name);
    e->next = *s;
    *s = e;
    t->n++;
    return 0;
}

kvx_named_t *kvx_names_find(const kvx_names_t *t, const char *name)
{
    if (t->cap == 0)
        return NULL;
    for (kvx_named_t *e = *kvx_names_slot(t->slots, t->cap, name); e != NULL; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    return NULL;
}

void kvx_names_del(kvx_names_t *t, kvx_named_t *e)
{
    kvx_named_t **s = kvx_names_slot(t->slots, t->cap, e->name);

    while (*s != e)
        s = &(*s)->next;
    *s = e->next;
    t->n--;
}

kvx_named_t *kvx_names_next(const kvx_names_t *t, size_t *slot, const kvx_named_t *e)
{
    if (e != NULL && e->next != NULL)
        return e->next;
    while (*slot < t->cap) {
        kvx_named_t *x = t->slots[(*slot)++];
        if (x != NULL)
            return x;
    }
    return NULL;
}

void kvx_names_fini(kvx_names_t *t)
{
    free(t->slots);
    t->slots = NULL;
    t->cap = t->n = 0;
}
