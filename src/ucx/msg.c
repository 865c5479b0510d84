/*
 * kvx's messages on an endpoint: out (a header and a payload iov, eager or by rendezvous), and the
 * receive of a rendezvous payload that came on it.
 */
#include "ucx/ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- messages out --------------------------------------------------------------------------- */

kvx_send_t *kvx_ucx_send_get(kvx_ucx_ep_t *e)
{
    kvx_send_t *s = e->free;

    if (s != NULL)
        e->free = s->next_free;
    else if ((s = malloc(sizeof(*s))) == NULL)
        return NULL;
    s->ep = e;
    s->next_free = NULL;
    s->xfer_id = 0;
    s->rndv = false;
    s->named = false;
    return s;
}

static void kvx_ucx_send_put(kvx_send_t *s)
{
    kvx_ucx_ep_t *e = s->ep;
    s->next_free = e->free;
    e->free = s;
}

static void kvx_ucx_send_cb(void *req, ucs_status_t status, void *arg)
{
    kvx_send_t *s = arg;
    kvx_ucx_ep_t *e = s->ep;
    uint64_t xfer_id = s->xfer_id;

    ucp_request_free(req);
    kvx_ucx_send_put(s);
    e->inflight--;
    e->ops->on_sent(e->owner, xfer_id, kvx_ucx_errno(status));
}

int kvx_ucx_send(kvx_send_t *s, size_t hdr_len, size_t iovcnt, unsigned *refs)
{
    kvx_ucx_ep_t *e = s->ep;
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE,
        .flags = UCP_AM_SEND_FLAG_EAGER | (e->pair || s->named ? UCP_AM_SEND_FLAG_REPLY : 0),
        .cb.send = kvx_ucx_send_cb,
        .user_data = s,
        .datatype = iovcnt > 0 ? ucp_dt_make_iov() : ucp_dt_make_contig(1),
    };
    const void *buf = iovcnt > 0 ? (void *)s->iov : NULL;
    size_t count = iovcnt;
    void *req;

    if (e->ep == NULL) {
        kvx_ucx_send_put(s);
        return -ENOTCONN;
    }
    if (s->rndv && iovcnt == 1) {
        /* one contiguous piece: UCX's rendezvous takes it from there. No memory handle is
         * passed: on an RDMA lane UCX registers what the send needs and packs its remote key,
         * not one of the whole region (docs/security.md, "Rendezvous and remote keys"). The
         * receiver takes it only on the endpoint it would close to end it (REPLY: UCX names the
         * endpoint it came on, kvx_ucx_recv) */
        p.flags = UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY;
        p.datatype = ucp_dt_make_contig(1);
        buf = s->iov[0].base;
        count = s->iov[0].len;
    }
    e->inflight++; /* first, as for receives: counted while UCX may hold it */
    req = ucp_am_send_nbx(e->ep, KVX_AM_ID, s->hdr, hdr_len, buf, count, &p);
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        e->inflight--;
        kvx_ucx_send_put(s);
        return req == NULL ? 0 : kvx_ucx_errno(UCS_PTR_STATUS(req));
    }
    (*refs)++;
    return 1;
}

/* A message of a header and one piece of payload (data_len 0: none): a pairing's (the metadata),
 * or a control message. */
int kvx_ucx_send_pair(kvx_ucx_ep_t *e, const void *hdr, size_t hdr_len, const void *data,
                      size_t data_len, unsigned *refs)
{
    kvx_send_t *s;

    if (hdr_len > KVX_SEND_HDR_MAX)
        return -EINVAL;
    s = kvx_ucx_send_get(e);
    if (s == NULL)
        return -ENOMEM;
    memcpy(s->hdr, hdr, hdr_len);
    s->iov[0].base = (void *)data;
    s->iov[0].len = data_len;
    return kvx_ucx_send(s, hdr_len, data_len > 0 ? 1 : 0, refs);
}

int kvx_ucx_send_ctl(kvx_ucx_ep_t *e, const void *hdr, size_t hdr_len, unsigned *refs)
{
    return kvx_ucx_send_pair(e, hdr, hdr_len, NULL, 0, refs);
}

/* ---- rendezvous receives --------------------------------------------------------------------- */

/* A receive's record, reused from the worker's list (u->recv_free): no allocation per receive once
 * as many were in flight at once. */
struct kvx_ucx_recv {
    kvx_ucx_ep_t *ep;
    void *cookie;
    struct kvx_ucx_recv *next_free;
};
typedef struct kvx_ucx_recv kvx_ucx_recv_t;

static void kvx_ucx_recv_put(kvx_ucx_t *u, kvx_ucx_recv_t *rec)
{
    rec->next_free = u->recv_free;
    u->recv_free = rec;
}

void kvx_ucx_free_recvs(kvx_ucx_t *u)
{
    while (u->recv_free != NULL) {
        kvx_ucx_recv_t *rec = u->recv_free;
        u->recv_free = rec->next_free;
        free(rec);
    }
}

static void kvx_ucx_recv_cb(void *req, ucs_status_t status, size_t length, void *arg)
{
    kvx_ucx_recv_t *rec = arg;
    kvx_ucx_ep_t *e = rec->ep;
    void *cookie = rec->cookie;

    (void)length;
    ucp_request_free(req);
    kvx_ucx_recv_put(e->u, rec);
    e->inflight--;
    e->ops->on_received(e->owner, cookie, kvx_ucx_errno(status));
}

int kvx_ucx_recv(kvx_ucx_ep_t *e, void *desc, void *dest, size_t len, void *cookie, unsigned *refs)
{
    kvx_ucx_t *u = e->u;
    kvx_ucx_recv_t *rec = u->recv_free;
    ucp_request_param_t p = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.recv_am = kvx_ucx_recv_cb,
        .datatype = ucp_dt_make_contig(1),
    };
    void *req;

    /* only what came on e itself: closing e is what ends the receive (UCX cannot cancel it),
     * and a sender could otherwise tie it to an endpoint nobody would close */
    if (e->ep == NULL || u->came_on_ep != e->ep) {
        bool filler = false;
        const size_t nf = u->came_on_ep != NULL ? sizeof(u->fillers) / sizeof(u->fillers[0]) : 0;
        for (size_t i = 0; i < nf && !filler; i++)
            filler = u->fillers[i] != NULL && u->fillers[i]->ep == u->came_on_ep;
        /* which one tells a hostile sender from endpoints UCX paired out of order */
        kvx_debug(e->u, "ucx: a rendezvous payload on %s endpoint, not its connection's",
                  u->came_on_ep == NULL ? "no"
                  : filler              ? "a catch-up (kvx_ucx_align)"
                                        : "another");
        return -EPERM;
    }
    if (rec != NULL)
        u->recv_free = rec->next_free;
    else if ((rec = malloc(sizeof(*rec))) == NULL)
        return -ENOMEM;
    rec->ep = e;
    rec->cookie = cookie;
    p.user_data = rec;
    /* no memory handle, as for sends: a remote key UCX sends for this receive (a put-based
     * rendezvous on an RDMA lane) covers what UCX registers for it, not the whole region */
    /* counted first: the callback may run before this returns */
    (*refs)++;
    e->inflight++;
    req = ucp_am_recv_data_nbx(u->worker, desc, dest, len, &p);
    if (UCS_PTR_IS_PTR(req))
        return 1;
    (*refs)--;
    e->inflight--;
    kvx_ucx_recv_put(u, rec);
    return req == NULL ? 0 : kvx_ucx_errno(UCS_PTR_STATUS(req));
}
