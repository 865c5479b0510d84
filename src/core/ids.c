/*
 * Ids of connections: what their messages carry (both sides' connections are found by them). A
 * table of pointers; an id is reused once released, never 0.
 */
#include "core/kvx_core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
