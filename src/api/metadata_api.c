/*
 * The transport's metadata: the blob peers add it by (its region, its worker's address, its
 * capability, signed with the secret when there is one), built at create, rebuilt when a fence
 * retires the capability (the older buffers kept while the listener may still send them), and
 * copied out by kvx_transport_metadata.
 */
#include "api/transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* The metadata blob of t as it is now (its capability included), in a new buffer. */
static int kvx_metadata_encode(kvx_transport_t *t, uint8_t **buf_p, size_t *len_p)
{
    kvx_md_t md = {0};
    const void *waddr;
    size_t waddr_len, len;
    uint8_t *buf;
    int rc;

    kvx_ucx_local_address(t->core.ucx, &waddr, &waddr_len);
    snprintf(md.agent_name, sizeof(md.agent_name), "%s", t->core.log.name);
    snprintf(md.fingerprint, sizeof(md.fingerprint), "%s", t->core.fingerprint);
    md.base = (uintptr_t)t->core.base;
    md.num_blocks = t->core.num_blocks;
    md.block_len = t->core.block_len;
    md.generation = t->core.generation;
    memcpy(md.capability, t->core.capability, sizeof(md.capability));
    md.host = t->core.host;
    md.worker_addr = waddr;
    md.worker_addr_len = (uint32_t)waddr_len;
    md.rkey = t->rkey;
    md.rkey_len = (uint32_t)t->rkey_len;
    md.flags = t->core.secret != NULL ? KVX_MDF_MAC : 0;
    len = kvx_md_encoded_len(&md);
    buf = malloc(len);
    if (buf == NULL)
        return -ENOMEM;
    rc = kvx_md_encode(&md, t->core.secret, t->core.secret_len, buf, len);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *buf_p = buf;
    *len_p = len;
    return 0;
}

int kvx_metadata_build(kvx_transport_t *t)
{
    int rc = kvx_metadata_encode(t, &t->metadata, &t->metadata_len);

    if (rc == 0)
        kvx_peers_metadata(&t->peers, t->metadata, t->metadata_len);
    return rc;
}

/* A superseded metadata buffer: the listener's answers in flight may still point at one (UCX
 * sends from it), so it is freed only once no accepted pairing is left, or at close. */
typedef struct kvx_old_md {
    struct kvx_old_md *next;
    uint8_t *buf;
} kvx_old_md_t;

void kvx_old_md_free(kvx_transport_t *t)
{
    while (t->old_md != NULL) {
        kvx_old_md_t *o = t->old_md;
        t->old_md = o->next;
        free(o->buf);
        free(o);
    }
}

int kvx_transport_retire(kvx_transport_t *t)
{
    uint8_t old[16], *buf;
    size_t len;
    kvx_old_md_t *o = malloc(sizeof(*o));
    int rc;

    if (o == NULL)
        return -ENOMEM;
    memcpy(old, t->core.capability, sizeof(old));
    if (getrandom(t->core.capability, sizeof(t->core.capability), 0) !=
        (ssize_t)sizeof(t->core.capability)) {
        rc = errno ? -errno : -EIO;
        memcpy(t->core.capability, old, sizeof(old));
        free(o);
        return rc;
    }
    rc = kvx_metadata_encode(t, &buf, &len);
    if (rc < 0) {
        memcpy(t->core.capability, old, sizeof(old));
        free(o);
        return rc;
    }
    if (t->peers.naccepted == 0)
        kvx_old_md_free(t);
    o->buf = t->metadata;
    o->next = t->old_md;
    t->old_md = o;
    t->metadata = buf;
    t->metadata_len = len;
    kvx_peers_metadata(&t->peers, buf, len);
    kvx_recv_retire(&t->recv, old);
    kvx_info(&t->core, "capability retired: new metadata (%zu bytes)", len);
    return 0;
}

int kvx_transport_metadata(kvx_transport_t *t, void *buf, size_t *len_p)
{
    int rc = 0;

    if (t == NULL || len_p == NULL || (buf == NULL && *len_p != 0))
        return -EINVAL;
    kvx_lock(&t->core);
    if (t->core.closed) {
        rc = -ESHUTDOWN;
    } else if (*len_p < t->metadata_len) {
        *len_p = t->metadata_len;
        rc = -ENOSPC;
    } else {
        memcpy(buf, t->metadata, t->metadata_len);
        *len_p = t->metadata_len;
    }
    kvx_unlock(&t->core);
    return rc;
}
