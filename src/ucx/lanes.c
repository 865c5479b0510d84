/*
 * What an endpoint's lanes are: the transports its active messages and rendezvous travel on, and
 * where UCX itself would switch to rendezvous, read from UCX's own description of the endpoint
 * (kvx_ucx_lanes_parse is pure: the tests drive it with UCX's texts).
 */
#include "ucx/ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Append name to a ','-joined list unless it is already there. */
static void kvx_ucx_list_add(char *list, size_t cap, const char *name)
{
    size_t n = strlen(name), len = strlen(list);
    const char *p = list;

    while ((p = strstr(p, name)) != NULL) {
        if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return;
        p += n;
    }
    if (len + n + 2 > cap)
        return;
    if (len > 0)
        list[len++] = ',';
    memcpy(list + len, name, n + 1);
}

/* A size as UCX's tables print it ("550999", "256K", "4M"); UINT64_MAX for "inf" or junk. */
static uint64_t kvx_ucx_size_get(const char *p)
{
    char *end;
    unsigned long long v;

    if (*p < '0' || *p > '9')
        return UINT64_MAX;
    v = strtoull(p, &end, 10);
    switch (*end) {
    case 'K':
        return (uint64_t)v << 10;
    case 'M':
        return (uint64_t)v << 20;
    case 'G':
        return (uint64_t)v << 30;
    default:
        return (uint64_t)v;
    }
}

/* One row of a protocol table of UCX 1.14 and later,
 *   "# |   550999..inf | (?) rendezvous fragmented copy-in copy-out | sysv/memory |",
 * whose protocol is a rendezvous: where it starts, and UCX's name for it. */
static bool kvx_ucx_rndv_row(const char *line, uint64_t *from, char *proto, size_t cap)
{
    const char *a = strstr(line, "| "), *b, *e;
    size_t n;

    if (a == NULL || strstr(a, "..") == NULL || (b = strstr(a + 1, "| ")) == NULL)
        return false;
    for (a += 2; *a == ' '; a++)
        ;
    for (b += 2; *b == ' '; b++)
        ;
    if (strncmp(b, "(?) ", 4) == 0) /* not used yet: its figures are UCX's estimates */
        b += 4;
    if (strncmp(b, "rendezvous", 10) != 0 || (e = strstr(b, " |")) == NULL)
        return false;
    while (e > b && e[-1] == ' ')
        e--;
    n = (size_t)(e - b) < cap - 1 ? (size_t)(e - b) : cap - 1;
    memcpy(proto, b, n);
    proto[n] = '\0';
    *from = kvx_ucx_size_get(a);
    return true;
}

/*
 * What an endpoint's lanes are, from ucp_ep_print_info's text. It lists each lane as
 *   "lane[0]:  3:sysv/memory.0 md[2] -> md[2]/sysv/sysdev[255] am am_bw#0 keepalive"  (1.13)
 *   "lane[0]:  3:sysv/memory.0 md[2] -> md[2]/sysv/sysdev[255] seg 4294967295 am keepalive"
 * (1.19, whose protocols v2 tag only the am lane; rendezvous lanes are tagged rma_bw#N in both).
 * kvx's messages travel on the am_bw lanes, or the am lane when none is tagged am_bw. Where UCX
 * itself would switch an active message to rendezvous on this endpoint: 1.13 prints it as
 *   "am_send: 0..<egr/short>..61433..<egr/zcopy>..87903..<rndv>..(inf)"
 * and 1.14 and later in a protocol table per kind of send, whose row names the protocol
 * ("rendezvous zero-copy read from remote" on an RDMA lane, "rendezvous fragmented copy-in
 * copy-out" over tcp or shared memory); kvx's sends name their endpoint, so the table "active
 * message by ucp_am_send* with reply flag from host memory" is theirs.
 */
void kvx_ucx_lanes_parse(const char *text, kvx_lanes_t *l)
{
    char am_bw[KVX_TRANSPORT_NAME_MAX] = "", am[KVX_TRANSPORT_NAME_MAX] = "";
    const char *line = text, *next;
    int table = 0; /* in kvx's table: 1 at its title, 2 in its rows (after the border under it) */

    memset(l, 0, sizeof(*l));
    l->ucx_rndv = UINT64_MAX;
    for (; line != NULL && *line != '\0'; line = next) {
        char buf[512], tl[32];
        const char *p;
        size_t ll;

        next = strchr(line, '\n');
        ll = next != NULL ? (size_t)(next - line) : strlen(line);
        if (next != NULL)
            next++;
        if (ll >= sizeof(buf))
            continue; /* no line kvx reads is that long */
        memcpy(buf, line, ll);
        buf[ll] = '\0';
        if ((p = strstr(buf, "am_send:")) != NULL) { /* 1.13 */
            const char *r = strstr(p, "..<rndv>");
            if (r != NULL) {
                while (r > p && r[-1] >= '0' && r[-1] <= '9')
                    r--;
                l->ucx_rndv = kvx_ucx_size_get(r);
            }
            continue;
        }
        if (strstr(buf, " cfg#") != NULL) { /* a table's title (1.14 and later) */
            table = strstr(buf, "active message by ucp_am_send* with reply flag from host "
                                "memory") != NULL;
            continue;
        }
        if (table != 0 && strstr(buf, "+---") != NULL) { /* a border: under the title, or the end */
            table = table == 1 ? 2 : 0;
            continue;
        }
        if (table == 2 && l->ucx_proto[0] == '\0' &&
            kvx_ucx_rndv_row(buf, &l->ucx_rndv, l->ucx_proto, sizeof(l->ucx_proto)))
            continue;
        if ((p = strstr(buf, "lane[")) == NULL || (p = strchr(p, ':')) == NULL)
            continue;
        /* "  3:sysv/memory.0" -> "sysv" */
        while (*++p == ' ')
            ;
        while (*p >= '0' && *p <= '9')
            p++;
        if (*p != ':' || sscanf(p + 1, "%31[^/ ]", tl) != 1)
            continue;
        if (strstr(buf, " am_bw") != NULL)
            kvx_ucx_list_add(am_bw, sizeof(am_bw), tl);
        if (strstr(buf, " am ") != NULL || (ll > 3 && strcmp(buf + ll - 3, " am") == 0))
            kvx_ucx_list_add(am, sizeof(am), tl);
        if (strstr(buf, " rma_bw#") != NULL)
            kvx_ucx_list_add(l->rndv, sizeof(l->rndv), tl);
    }
    snprintf(l->am, sizeof(l->am), "%s", am_bw[0] != '\0' ? am_bw : am);
}

/*
 * Which transport carries the data, and the size of one message on it: a shared-memory FIFO
 * element (MM_SEG_SIZE, kvx's 32k unless set otherwise) or a tcp segment (TCP_TX_SEG_SIZE,
 * kvx's 60k); a message larger than that is split by UCX and reassembled by copying.
 */
void kvx_ucx_ep_describe(kvx_ucx_ep_t *e, kvx_lanes_t *l)
{
    static const char *const mm[] = {"UCX_SYSV_SEG_SIZE", "UCX_POSIX_SEG_SIZE", "UCX_MM_SEG_SIZE",
                                     NULL};
    static const char *const tcp[] = {"UCX_TCP_TX_SEG_SIZE", "UCX_TX_SEG_SIZE", NULL};
    char *text = NULL;
    size_t size = 0;
    FILE *f;

    memset(l, 0, sizeof(*l));
    l->ucx_rndv = UINT64_MAX;
    l->seg = 8192;
    if (e->ep == NULL) /* closed already (its shared endpoint closed for both users) */
        return;
    f = open_memstream(&text, &size);
    if (f == NULL)
        return;
    ucp_ep_print_info(e->ep, f);
    fclose(f);
    kvx_ucx_lanes_parse(text, l);
    free(text);
    l->seg = 8192;
    if (strncmp(l->am, "sysv", 4) == 0 || strncmp(l->am, "posix", 5) == 0)
        l->seg = kvx_ucx_env_size(mm, 32768);
    else if (strncmp(l->am, "tcp", 3) == 0)
        l->seg = kvx_ucx_env_size(tcp, 61440);
}
