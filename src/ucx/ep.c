/*
 * The UCX backend's endpoints towards a worker address: opening one (its link, its error handler,
 * its place among this worker's endpoints towards that worker), UCX's close of it, and freeing.
 * Which endpoint a HELLO's connection takes, and how one closes, are catchup.c's.
 */
#include "ucx/ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvx_ucx_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvx_ucx_ep_t *e = arg;

    (void)ep;
    if (e->filler) { /* its peer is gone: closed after this progress (kvx_ucx_reap_fillers) */
        if (!e->failed) {
            e->failed = true;
            e->u->nfailed++;
        }
        return;
    }
    if (e->pair) {
        kvx_debug(e->u, "ucx: a pairing endpoint failed: %s", ucs_status_string(status));
        /* what UCX's connection manager says when nothing listens at the address */
        e->ops->on_error(e->owner,
                         status == UCS_ERR_NOT_CONNECTED ? -ECONNREFUSED : kvx_ucx_errno(status));
    } else
        e->ops->on_error(e->owner, kvx_ucx_errno(status));
}

static void kvx_ucx_link_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    struct kvx_ucx_link *l = arg;

    l->failed = true;
    for (int i = 0; i < 2; i++)
        if (l->users[i] != NULL)
            kvx_ucx_err_cb(l->users[i], ep, status);
}

/* A link whose UCX endpoint closed (UCX calls no error handler of it once its close began). */
static void kvx_ucx_link_drop(struct kvx_ucx_link *l)
{
    for (int i = 0; i < 2; i++)
        if (l->users[i] != NULL)
            l->users[i]->link = NULL;
    if ((*l->prevp = l->next) != NULL)
        l->next->prevp = l->prevp;
    free(l);
}

void *kvx_ucx_ep_close_ucp(kvx_ucx_ep_t *e, const ucp_request_param_t *cp)
{
    void *req = ucp_ep_close_nbx(e->ep, cp);

    if (e->link != NULL)
        kvx_ucx_link_drop(e->link);
    e->ep = NULL;
    return req;
}

void kvx_ucx_drop_links(kvx_ucx_t *u)
{
    while (u->links != NULL)
        kvx_ucx_link_drop(u->links);
}

uint64_t kvx_ucx_uid(const void *waddr, bool *ok)
{
    ucp_worker_address_attr_t a = {.field_mask = UCP_WORKER_ADDRESS_ATTR_FIELD_UID};

    *ok = ucp_worker_address_query((ucp_address_t *)waddr, &a) == UCS_OK;
    return *ok ? a.worker_uid : 0;
}

/* The entry of remote worker uid (made when create), or NULL: a hash table, 16 bytes per remote
 * worker an endpoint was ever opened to, as UCX's own matching keeps one per remote worker. */
struct kvx_ucx_sn *kvx_ucx_sn_find(kvx_ucx_t *u, uint64_t uid, bool create)
{
    size_t mask = u->sns_cap - 1, i;

    if (u->sns_cap != 0)
        for (i = (size_t)(uid * 0x9e3779b97f4a7c15ull) & mask; u->sns[i].used; i = (i + 1) & mask)
            if (u->sns[i].uid == uid)
                return &u->sns[i];
    if (!create)
        return NULL;
    if (2 * (u->nsns + 1) > u->sns_cap) {
        size_t cap = u->sns_cap ? 2 * u->sns_cap : 64;
        struct kvx_ucx_sn *n = calloc(cap, sizeof(*n)), *old = u->sns;
        size_t oldcap = u->sns_cap;
        if (n == NULL)
            return NULL;
        u->sns = n;
        u->sns_cap = cap;
        u->nsns = 0;
        for (size_t k = 0; k < oldcap; k++)
            if (old[k].used)
                *kvx_ucx_sn_find(u, old[k].uid, true) = old[k];
        free(old);
        mask = cap - 1;
    }
    for (i = (size_t)(uid * 0x9e3779b97f4a7c15ull) & mask; u->sns[i].used; i = (i + 1) & mask)
        ;
    u->sns[i] = (struct kvx_ucx_sn){.uid = uid, .used = 1};
    u->nsns++;
    return &u->sns[i];
}

uint32_t kvx_ucx_ep_sn(const kvx_ucx_ep_t *e) { return e != NULL ? e->sn : 0; }

int kvx_ucx_ep_new(kvx_ucx_t *u, const void *waddr, uint64_t uid, bool ok, const char *name,
                   kvx_ucx_ep_t **ep_p)
{
    kvx_ucx_ep_t *e = calloc(1, sizeof(*e));
    struct kvx_ucx_link *l = calloc(1, sizeof(*l));
    struct kvx_ucx_sn *sn;
    ucs_status_t s;

    if (e == NULL || l == NULL) {
        free(e);
        free(l);
        return -ENOMEM;
    }
    e->u = u;
    e->uid = uid;
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_NAME,
        .address = (const ucp_address_t *)waddr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = kvx_ucx_link_err_cb, .arg = l},
        .name = name,
    };
    s = ucp_ep_create(u->worker, &ep_params, &e->ep);
    /* UCX counts an endpoint it made (its failures are nearly all before it counts: an address it
     * refused); a worker is remembered from its first endpoint on */
    if (ok && s == UCS_OK && (sn = kvx_ucx_sn_find(u, uid, true)) != NULL)
        e->sn = sn->next_sn++;
    if (s != UCS_OK) {
        kvx_error(u, "ucx: ucp_ep_create to %s: %s", name, ucs_status_string(s));
        free(e);
        free(l);
        return kvx_ucx_errno(s);
    }
    l->ep = e->ep;
    l->id = ++u->next_link_id;
    l->users[0] = e;
    if ((l->next = u->links) != NULL)
        l->next->prevp = &l->next;
    l->prevp = &u->links;
    u->links = l;
    e->link = l;
    *ep_p = e;
    return 0;
}

int kvx_ucx_ep_open(kvx_ucx_t *u, const void *waddr, const char *name, const kvx_ep_ops_t *ops,
                    void *owner, kvx_ucx_ep_t **ep_p)
{
    bool ok;
    uint64_t uid = kvx_ucx_uid(waddr, &ok);
    int rc = kvx_ucx_ep_new(u, waddr, uid, ok, name, ep_p);

    if (rc == 0) {
        (*ep_p)->ops = ops;
        (*ep_p)->owner = owner;
    }
    return rc;
}

void kvx_ucx_ep_free(kvx_ucx_ep_t *e)
{
    if (e == NULL)
        return;
    if (e->link != NULL) /* never closed (its worker is gone): the link goes with the worker */
        e->link->users[e->link->users[0] == e ? 0 : 1] = NULL;
    if (e->pair) {
        kvx_ucx_ep_t **pp = &e->u->pair_eps;
        while (*pp != NULL && *pp != e)
            pp = &(*pp)->pair_next;
        if (*pp == e)
            *pp = e->pair_next;
    }
    kvx_ucx_unmap(e);
    while (e->free != NULL) {
        kvx_send_t *s = e->free;
        e->free = s->next_free;
        free(s);
    }
    free(e);
}
