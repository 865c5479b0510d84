/*
 * A peer's owned region, mapped into this process: when the peer runs on this host and kvx
 * allocated its region, transfers are copies by this process (xfer/post.c) with no work by the
 * peer. The mapping is unproven until the peer's HELLO_ACK brings the token its segment holds,
 * let go of when the connection fails, and its pages may be faulted in before the first copy.
 */
#include "conn/kvx_conn.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

/*
 * A peer on this host whose region kvx allocated: map it. The mapping is unproven until the
 * peer's HELLO_ACK brings the token its segment holds (kvx_conn_map_prove); nothing is copied
 * before. Without a mapping (the key gives none, say over tcp), messages carry the data as for
 * any region; a key that names a segment kvx refuses (one of this process's own that is no owned
 * region of its transports, another process's, too small, without the owner's trailer) is
 * counted (kvx_transport_attr_t.maps_refused).
 */
void kvx_conn_map(kvx_conn_t *c, const kvx_md_t *md)
{
    void *ptr;
    int rc;

    rc = kvx_ucx_map(c->ucx, md->rkey, md->rkey_len, md->base, c->remote_len, md->host.pid, &ptr,
                     c->seg_token);
    if (rc < 0) {
        if (rc == -EPERM)
            c->core->maps_refused++;
        kvx_info(c->core, "peer %s: its region gives no mapping here; messages carry the data",
                 md->agent_name);
        return;
    }
    c->unproven = ptr;
}

void kvx_conn_map_prove(kvx_conn_t *c, const uint8_t *token)
{
    size_t n;

    if (c->unproven == NULL)
        return;
    if (!kvx_seg_token_ok(c->seg_token, token)) {
        kvx_warn(c->core,
                 "peer %s: its handshake does not bring the token of the segment its region key "
                 "names: not mapped, messages carry the data",
                 c->agent_name);
        c->core->maps_refused++;
        kvx_conn_unmap(c);
        return;
    }
    c->mapped = c->unproven;
    c->unproven = NULL;
    n = strlen(c->transport);
    snprintf(c->transport + n, sizeof(c->transport) - n, "-mapped");
}

/* Bytes prefaulted between two looks at the connection and the transport. */
#define KVX_PREFAULT_STEP ((size_t)64 << 20)

/* A prefault under way: the pages [start, start + len) of c's mapping, faulted in up to off. */
typedef struct kvx_prefault {
    kvx_conn_t *c;
    uintptr_t start;
    size_t len, off;
    int rc;
} kvx_prefault_t;

/* Its end (looked at with the lock held): all of it, an error, or a connection that failed
 * (which let go of the mapping). */
static bool kvx_prefault_over(void *arg)
{
    const kvx_prefault_t *pf = arg;

    return pf->off >= pf->len || pf->rc != 0 || pf->c->state != KVX_CONN_OPEN ||
           pf->c->mapped == NULL;
}

/* Its next KVX_PREFAULT_STEP bytes (the lock released). */
static void kvx_prefault_step(void *arg)
{
    kvx_prefault_t *pf = arg;
    size_t n = pf->len - pf->off < KVX_PREFAULT_STEP ? pf->len - pf->off : KVX_PREFAULT_STEP;

    pf->rc = madvise((void *)(pf->start + pf->off), n, MADV_POPULATE_WRITE) == 0 ? 0 : -errno;
    pf->off += n;
}

/*
 * Fault the mapped region's pages in here (without changing a byte: MADV_POPULATE_WRITE), so
 * that the first transfer does not pay for them (this also commits the owner's shared pages
 * that nobody touched yet). Runs with the lock released (c pinned by the caller), 64 MiB at a
 * time: between steps it stops if the transport closes or the connection failed (which let go
 * of the mapping). If the kernel refuses (no memory for the pages), the mapping is dropped and
 * messages carry the data: a copy must never meet a page that cannot be had.
 */
void kvx_conn_prefault(kvx_conn_t *c)
{
    kvx_prefault_t pf = {.c = c,
                         .start = (uintptr_t)c->mapped & ~(uintptr_t)4095,
                         .len = (size_t)c->remote_len + ((uintptr_t)c->mapped & 4095)};
    uint64_t t0 = kvx_now_ns();

    if (kvx_core_wait(c->core, &(kvx_wait_t){.done = kvx_prefault_over,
                                             .work = kvx_prefault_step,
                                             .arg = &pf,
                                             .until_ns = UINT64_MAX}) == -ESHUTDOWN)
        return;
    if (c->state != KVX_CONN_OPEN || c->mapped == NULL)
        return;
    if (pf.rc < 0 && pf.rc != -EINVAL) { /* EINVAL: a kernel without MADV_POPULATE_WRITE */
        kvx_warn(c->core,
                 "peer %s: its region's pages cannot be had here (%s): messages carry the data",
                 c->agent_name, kvx_strerror(pf.rc));
        kvx_conn_unmap(c);
        return;
    }
    kvx_info(c->core, "peer %s: its mapped region (%zu bytes) prefaulted in %.1f ms", c->agent_name,
             pf.len, (double)(kvx_now_ns() - t0) / 1e6);
}

/* The mapping goes (a connection that failed has let go of it already); messages carry the
 * data from now on. */
void kvx_conn_unmap(kvx_conn_t *c)
{
    char *suffix = strstr(c->transport, "-mapped");

    if (c->mapped == NULL && c->unproven == NULL)
        return;
    c->mapped = NULL;
    c->unproven = NULL;
    memset(c->seg_token, 0, sizeof(c->seg_token));
    kvx_ucx_unmap(c->ucx);
    if (suffix != NULL)
        *suffix = '\0';
}
