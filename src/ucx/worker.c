/*
 * The UCX backend's worker: creating it and tearing it down (with everything it holds), kvx's
 * messages in, progress and wake-up. ucx_int.h says what the backend is and how its files rank.
 */
#include "ucx/ucx_int.h"

#include <stdlib.h>

static ucs_status_t kvx_ucx_am_cb(void *arg, const void *header, size_t header_length, void *data,
                                  size_t length, const ucp_am_recv_param_t *param);

int kvx_ucx_init(const kvx_ucx_config_t *cfg, const kvx_ucx_ops_t *ops, void *arg, kvx_ucx_t **u_p)
{
    kvx_ucx_t *u;
    ucs_status_t s;
    int rc;

    u = calloc(1, sizeof(*u));
    if (u == NULL)
        return -ENOMEM;
    u->log = cfg->log;
    u->efd = -1;
    u->ops = ops;
    u->arg = arg;

    rc = kvx_ucx_create(u, cfg);
    if (rc != 0)
        goto err_free;

    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = KVX_AM_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = kvx_ucx_am_cb,
        .arg = u,
    };
    s = ucp_worker_set_am_recv_handler(u->worker, &hp);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: ucp_worker_set_am_recv_handler: %s", ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_stop;
    }
    s = ucp_worker_get_address(u->worker, &u->waddr, &u->waddr_len);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: ucp_worker_get_address: %s", ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_stop;
    }
    s = ucp_worker_get_efd(u->worker, &u->efd);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: ucp_worker_get_efd: %s", ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_addr;
    }
    *u_p = u;
    return 0;

err_addr:
    ucp_worker_release_address(u->worker, u->waddr);
err_stop:
    kvx_ucx_stop(u);
err_free:
    free(u);
    return rc;
}

void kvx_ucx_fini(kvx_ucx_t *u)
{
    if (u == NULL || u->worker == NULL)
        return;
    kvx_ucx_close_fillers(u);
    kvx_ucx_unlisten(u);
    ucp_worker_release_address(u->worker, u->waddr);
    ucp_worker_destroy(u->worker);
    u->worker = NULL;
    kvx_ucx_drop_links(u);
    kvx_ucx_free_recvs(u);
    if (u->region != NULL)
        return; /* an owned region stays mapped until kvx_ucx_free, and its context with it */
    ucp_cleanup(u->ctx);
    u->ctx = NULL;
}

/* After kvx_ucx_fini: the owned region (if any), the context, the handle. */
void kvx_ucx_free(kvx_ucx_t *u)
{
    if (u == NULL)
        return;
    kvx_ucx_fini(u); /* when the transport never closed */
    kvx_ucx_region_free(u);
    if (u->ctx != NULL)
        ucp_cleanup(u->ctx);
    free(u->sns);
    free(u);
}

void kvx_ucx_local_address(kvx_ucx_t *u, const void **waddr, size_t *waddr_len)
{
    *waddr = u->waddr;
    *waddr_len = u->waddr_len;
}

/* ---- messages in ------------------------------------------------------------------------------
 */

/* Every kvx message arrives here, inside UCX progress with the transport lock held. Its header is
 * decoded strictly before anything else looks at it. */
static ucs_status_t kvx_ucx_am_cb(void *arg, const void *header, size_t header_length, void *data,
                                  size_t length, const ucp_am_recv_param_t *param)
{
    kvx_ucx_t *u = arg;
    const kvx_wire_type_t *ty;
    kvx_msg_t m;

    if (kvx_wire_decode(header, header_length, length, &m) < 0) {
        u->ops->on_drop(u->arg, KVX_DROP_MALFORMED);
        return UCS_OK;
    }
    ty = kvx_wire_type(m.type); /* who takes it: the codecs' table */
    u->came_on_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* Only a WRITE's or a READ_DATA's payload may come by rendezvous. Nothing of it has
         * moved: data is UCX's descriptor, and the side's handler checks the header, then
         * either receives the payload where it chooses (kvx_ucx_recv) or returns without it,
         * which UCX reports to the sender as done (returning UCS_OK in both cases). */
        m.rndv = true;
        if (!ty->rndv) {
            u->ops->on_drop(u->arg, KVX_DROP_RNDV);
            u->came_on_ep = NULL;
            return UCS_OK;
        }
    }
    switch (ty->to) {
    case KVX_TO_RECEIVER:
        u->ops->on_request(u->arg, &m, header, header_length, data, length);
        break;
    case KVX_TO_PAIRING: {
        /* only on a pairing's endpoint, which the sender names (UCP_AM_SEND_FLAG_REPLY) */
        kvx_ucx_ep_t *e = NULL;
        if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
            for (e = u->pair_eps; e != NULL && e->ep != param->reply_ep; e = e->pair_next)
                ;
        if (e == NULL) {
            u->ops->on_drop(u->arg, KVX_DROP_UNKNOWN);
            break;
        }
        e->ops->on_message(e->owner, &m, data, length);
        break;
    }
    default: /* KVX_TO_INITIATOR: the decoder let no other type through */
        u->ops->on_reply(u->arg, &m, data, length);
        break;
    }
    u->came_on_ep = NULL;
    return UCS_OK;
}

kvx_came_on_t kvx_ucx_came_on(kvx_ucx_t *u)
{
    kvx_came_on_t c = {.ep = u->came_on_ep, .link = 0, .last = u->next_link_id};

    for (const struct kvx_ucx_link *l = c.ep != NULL ? u->links : NULL; l != NULL; l = l->next)
        if ((const void *)l->ep == c.ep) {
            c.link = l->id;
            break;
        }
    return c;
}

/* ---- progress and wake-up ------------------------------------------------------------------ */

unsigned kvx_ucx_progress(kvx_ucx_t *u)
{
    unsigned n = ucp_worker_progress(u->worker);

    if (u->nfailed > 0)
        kvx_ucx_reap_fillers(u);
    return n;
}

/* Returns 0 when armed (the event fd will wake a poller), -EBUSY when events are pending. */
int kvx_ucx_arm(kvx_ucx_t *u) { return kvx_ucx_errno(ucp_worker_arm(u->worker)); }

int kvx_ucx_event_fd(kvx_ucx_t *u) { return u->efd; }
