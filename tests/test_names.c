/*
 * The table of entries by name (src/base/names.c) that holds the peers by id and the writers by
 * name: every entry added is found by its name and seen once by a walk, across the table's
 * growth; deleting entries, some of them during a walk, leaves the others found and walked.
 */
#include "harness.h"
#include "kvx_int.h"

#include <stdio.h>
#include <string.h>

#define N 1000

typedef struct entry {
    char name[16];
    kvx_named_t node;
    int seen;
} entry_t;

static entry_t e[N];

/* Walk the table: each listed entry seen once; returns how many. */
static int walk(const kvx_names_t *t)
{
    size_t slot = 0;
    int n = 0;

    for (int i = 0; i < N; i++)
        e[i].seen = 0;
    for (kvx_named_t *x = kvx_names_next(t, &slot, NULL); x != NULL;
         x = kvx_names_next(t, &slot, x)) {
        entry_t *en = kvx_named_entry(x, entry_t, node);
        KT_EQ(en->seen, 0);
        en->seen = 1;
        n++;
    }
    return n;
}

int main(void)
{
    kvx_names_t t = {0};
    size_t slot = 0;
    kvx_named_t *x, *next;
    int left;

    KT_CHECK(kvx_names_find(&t, "none") == NULL);
    KT_EQ(walk(&t), 0);
    for (int i = 0; i < N; i++) {
        snprintf(e[i].name, sizeof(e[i].name), "entry-%d", i);
        e[i].node.name = e[i].name;
        KT_EQ(kvx_names_add(&t, &e[i].node), 0);
    }
    KT_EQ(t.n, N);
    KT_CHECK(t.cap >= 2 * t.n);
    for (int i = 0; i < N; i++)
        KT_CHECK(kvx_named_entry(kvx_names_find(&t, e[i].name), entry_t, node) == &e[i]);
    KT_CHECK(kvx_names_find(&t, "entry-1000") == NULL);
    KT_EQ(walk(&t), N);
    for (int i = 0; i < N; i += 2) /* the even ones go */
        kvx_names_del(&t, &e[i].node);
    KT_EQ(t.n, N / 2);
    KT_EQ(walk(&t), N / 2);
    for (int i = 0; i < N; i++)
        KT_CHECK((kvx_names_find(&t, e[i].name) != NULL) == (i % 2 == 1) && e[i].seen == i % 2);
    /* deleting the entry just walked past, as a walk that frees does */
    for (x = kvx_names_next(&t, &slot, NULL); x != NULL; x = next) {
        next = kvx_names_next(&t, &slot, x);
        if (kvx_named_entry(x, entry_t, node) - e < N / 2)
            kvx_names_del(&t, x);
    }
    left = walk(&t);
    KT_EQ(left, N / 4);
    KT_EQ(t.n, N / 4);
    for (int i = 0; i < N; i++)
        KT_CHECK((kvx_names_find(&t, e[i].name) != NULL) == (i % 2 == 1 && i >= N / 2));
    kvx_names_fini(&t);
    KT_CHECK(t.slots == NULL && t.cap == 0 && t.n == 0);
    kt_log("%d entries added, found and walked across growth; deleted ones gone", N);
    return 0;
}
