/*
 * The UCX backend's pairing by address (peer/'s): UCX's connection manager - the listener, its
 * connection requests, the endpoints it pairs and the messages sent on them.
 */
#include "ucx/ucx_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- pairing by address: UCX's connection manager ------------------------------------------ */

static void kvx_ucx_conn_cb(ucp_conn_request_h req, void *arg)
{
    kvx_ucx_t *u = arg;
    u->ops->on_conn_request(u->arg, req);
}

int kvx_ucx_listen(kvx_ucx_t *u, const struct sockaddr *sa, socklen_t len,
                   struct sockaddr_storage *bound)
{
    ucp_listener_params_t p = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = sa, .addrlen = len},
        .conn_handler = {.cb = kvx_ucx_conn_cb, .arg = u},
    };
    ucp_listener_attr_t a = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    ucs_status_t s;

    if (u->listener != NULL)
        return -EALREADY;
    s = ucp_listener_create(u->worker, &p, &u->listener);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: ucp_listener_create: %s", ucs_status_string(s));
        u->listener = NULL;
        return s == UCS_ERR_BUSY ? -EADDRINUSE : kvx_ucx_errno(s);
    }
    s = ucp_listener_query(u->listener, &a);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: ucp_listener_query: %s", ucs_status_string(s));
        ucp_listener_destroy(u->listener);
        u->listener = NULL;
        return kvx_ucx_errno(s);
    }
    memcpy(bound, &a.sockaddr, sizeof(*bound));
    return 0;
}

void kvx_ucx_unlisten(kvx_ucx_t *u)
{
    if (u != NULL && u->listener != NULL) {
        ucp_listener_destroy(u->listener);
        u->listener = NULL;
    }
}

void kvx_ucx_reject(kvx_ucx_t *u, void *conn_req)
{
    ucs_status_t s = ucp_listener_reject(u->listener, conn_req);
    if (s != UCS_OK)
        kvx_warn(u, "ucx: ucp_listener_reject: %s", ucs_status_string(s));
}

/* An endpoint of UCX's connection manager: from a connection request (conn_req) the listener
 * got, or to a listener's address (sa). */
int kvx_ucx_pair_open(kvx_ucx_t *u, void *conn_req, const struct sockaddr *sa, socklen_t len,
                      const kvx_ep_ops_t *ops, void *owner, kvx_ucx_ep_t **ep_p)
{
    kvx_ucx_ep_t *e = calloc(1, sizeof(*e));
    ucs_status_t s;

    if (e == NULL)
        return -ENOMEM;
    e->u = u;
    e->ops = ops;
    e->owner = owner;
    e->pair = true;
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_NAME,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = kvx_ucx_err_cb, .arg = e},
        .name = conn_req != NULL ? "kvx-accepted" : "kvx-connect",
    };
    if (conn_req != NULL) {
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
        ep_params.conn_request = conn_req;
    } else {
        ep_params.field_mask |= UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
        ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        ep_params.sockaddr.addr = sa;
        ep_params.sockaddr.addrlen = len;
    }
    s = ucp_ep_create(u->worker, &ep_params, &e->ep);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: ucp_ep_create (%s): %s", ep_params.name, ucs_status_string(s));
        free(e);
        return kvx_ucx_errno(s);
    }
    e->pair_next = u->pair_eps;
    u->pair_eps = e;
    *ep_p = e;
    return 0;
}
