/*
 * The catch-up endpoints (docs/design/catchup-endpoints.md says why kvx keeps them), and the two
 * entry points whose outcome they decide: the endpoint a HELLO's connection takes
 * (kvx_ucx_ep_accept) and an endpoint's close (kvx_ucx_ep_close), which may keep it open as a
 * catch-up endpoint or, shared, for its other user.
 */
#include "ucx/ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * UCX pairs the endpoints of two workers by creation order: the k-th endpoint one worker opens
 * towards the other (by address) is paired with the other's k-th (ucp_ep_match, conn_sn). A
 * writer whose endpoint was force-closed before its HELLO left (a remove while the receiver was
 * stopped) leaves the receiver one reply endpoint behind, and the receiver's next reply
 * endpoint would be paired with the writer's dead one. So each side counts the endpoints it
 * opened towards each remote worker, a HELLO carries the writer's count for its endpoint, and
 * the receiver first opens the endpoints it lacks (at most KVX_ALIGN_MAX per HELLO, 256 in all)
 * so that its reply endpoint takes the same place. They stay open, unused, until their peer
 * fails (UCX reports it: then they close) or the transport closes: closing a tcp endpoint whose
 * wire-up is still queued meets UCX's use-after-free (see kvx_conn_fail). A holder of the
 * metadata chooses the number its HELLO claims: a catch-up over its budget (KVX_ALIGN_MAX per
 * HELLO, KVX_FILLERS_PER_WORKER open towards one worker, 256 open in all) opens none, and the
 * connection opens without it (counted in catchup_over). Refusing the HELLO instead let a holder
 * that sent HELLOs naming another worker push this worker's count towards it so far ahead that
 * the other worker refused every connection of this one's. A receiver already ahead (it opened
 * endpoints of its own towards that worker) is left as it is. HELLOs of two connections open at
 * once may arrive out of order (tcp: each endpoint is its own socket): the later one's catch-up
 * opens the earlier one's endpoint as a filler. So a HELLO names the endpoint it came on
 * (UCP_AM_SEND_FLAG_REPLY: UCX tells the receiver which of its endpoints is paired with the
 * writer's), and a filler a HELLO came on becomes that HELLO's connection's endpoint
 * (kvx_ucx_ep_accept). A HELLO that came on this transport's own writing endpoint towards that
 * worker (both transports opened theirs before either answered) shares it (struct kvx_ucx_link). A
 * connection whose endpoint is still not the one its HELLO came on (the writer's count was wrong,
 * the catch-up was over budget, or the HELLO named another worker's address than its sender's)
 * works by eager messages, which do not care which endpoint brings them; its rendezvous payloads
 * are refused (kvx_ucx_recv), and a debug line says so. Its endpoint keeps its place for the writer
 * UCX pairs it with: a HELLO that comes on it shares it, and when its connection closes first it
 * stays open as a filler (kvx_ucx_ep_keep). Why the receiver opens endpoints of its own at all,
 * rather than answering on the reply endpoint UCX hands the handler (which UCX frees behind kvx
 * when the writer closes its end, with no error callback), is docs/design/catchup-endpoints.md.
 */
#define KVX_ALIGN_MAX 16

#define KVX_FILLERS_PER_WORKER 32 /* catch-up endpoints open towards one remote worker */

/* Whether the HELLO came on l's endpoint: l by its number, or, when it came on an endpoint kvx had
 * not opened then, a link opened since whose ucp_ep_create took over that very endpoint (UCX had
 * made it for the writer's, and hands it to the next one opened with its place). */
static bool kvx_ucx_came_on_link(const struct kvx_ucx_link *l, const kvx_came_on_t *c)
{
    if (c->link != 0)
        return l->id == c->link;
    return l->id > c->last && (const void *)l->ep == c->ep;
}

static void kvx_ucx_filler_closed(void *req, ucs_status_t status, void *arg)
{
    (void)status;
    (void)arg;
    ucp_request_free(req);
}

/* Put f in the free filler slot i, counted towards its worker (sn: that worker's entry). */
static void kvx_ucx_filler_put(kvx_ucx_t *u, size_t i, kvx_ucx_ep_t *f, struct kvx_ucx_sn *sn)
{
    f->filler = true;
    u->fillers[i] = f;
    u->nfillers++;
    if (sn != NULL)
        sn->fillers++;
}

/* Take filler slot i off the list (its endpoint stays open: closed or adopted by the caller). */
static kvx_ucx_ep_t *kvx_ucx_filler_take(kvx_ucx_t *u, size_t i)
{
    kvx_ucx_ep_t *e = u->fillers[i];
    struct kvx_ucx_sn *sn = kvx_ucx_sn_find(u, e->uid, false);

    if (sn != NULL && sn->fillers > 0)
        sn->fillers--;
    if (e->failed)
        u->nfailed--;
    u->fillers[i] = NULL;
    u->nfillers--;
    e->filler = false;
    e->failed = false;
    return e;
}

/* Close the catch-up endpoints whose peer failed (not from inside UCX's callback). UCX calls no
 * error handler of an endpoint once its close began, so each goes at once. */
void kvx_ucx_reap_fillers(kvx_ucx_t *u)
{
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE,
                              .cb.send = kvx_ucx_filler_closed};

    for (size_t i = 0; i < sizeof(u->fillers) / sizeof(u->fillers[0]) && u->nfailed > 0; i++) {
        kvx_ucx_ep_t *e;
        void *req;
        if (u->fillers[i] == NULL || !u->fillers[i]->failed)
            continue;
        e = kvx_ucx_filler_take(u, i);
        req = kvx_ucx_ep_close_ucp(e, &cp);
        (void)req; /* a request frees itself in kvx_ucx_filler_closed */
        free(e);
    }
}

/* Open the endpoints this worker lacks towards waddr's before its sn-th: 0, or 1 over the
 * budget (none opened). */
static int kvx_ucx_align(kvx_ucx_t *u, const void *waddr, uint64_t uid, uint32_t sn)
{
    struct kvx_ucx_sn *e = kvx_ucx_sn_find(u, uid, false);
    uint32_t have = e != NULL ? e->next_sn : 0, want;
    const size_t cap = sizeof(u->fillers) / sizeof(u->fillers[0]);

    /* UCX's numbers are 16-bit and pair nothing past 65535: nothing to catch up then */
    if (have >= sn || sn >= 0xffff)
        return 0;
    want = sn - have;
    /* the budget: per HELLO, per remote worker (open at once) and per transport (open at once;
     * those whose peer failed give their place back) */
    if (want > KVX_ALIGN_MAX || want > cap - u->nfillers ||
        (e != NULL ? e->fillers : 0) + want > KVX_FILLERS_PER_WORKER) {
        kvx_info(u,
                 "ucx: a writer %u endpoint(s) ahead: over the catch-up budget, none opened (its "
                 "connection's rendezvous payloads will be refused)",
                 want);
        return 1;
    }
    kvx_debug(u, "ucx: %u endpoint(s) behind the writer's (its %u, this worker's %u): catching up",
              want, sn, have);
    for (size_t i = 0; i < cap && have < sn; i++) {
        kvx_ucx_ep_t *f;
        if (u->fillers[i] != NULL)
            continue;
        if (kvx_ucx_ep_new(u, waddr, uid, true, "kvx-catch-up", &f) < 0)
            break;
        e = kvx_ucx_sn_find(u, uid, false);
        kvx_ucx_filler_put(u, i, f, e);
        if (e == NULL)
            break;
        have = e->next_sn;
    }
    return 0;
}

/* The catch-up endpoints go with the worker (forced: nothing of a writer's was sent on them). UCX's
 * progress is driven for at most a second for them (with the lock held: the transport closes). */
void kvx_ucx_close_fillers(kvx_ucx_t *u)
{
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    uint64_t until = kvx_now_ns() + 1000000000ull;

    kvx_ucx_reap_fillers(u);
    for (size_t i = 0; i < sizeof(u->fillers) / sizeof(u->fillers[0]); i++) {
        kvx_ucx_ep_t *e;
        void *req;
        if (u->fillers[i] == NULL)
            continue;
        e = kvx_ucx_filler_take(u, i);
        req = kvx_ucx_ep_close_ucp(e, &cp);
        free(e); /* no error handler of it runs once its close began */
        if (UCS_PTR_IS_PTR(req)) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS && kvx_now_ns() < until)
                ucp_worker_progress(u->worker);
            /* past the bound the request goes with the worker, which frees it */
            if (ucp_request_check_status(req) != UCS_INPROGRESS)
                ucp_request_free(req);
        }
    }
    u->nfillers = 0;
    u->nfailed = 0;
}

int kvx_ucx_ep_accept(kvx_ucx_t *u, const void *waddr, uint32_t sn, const kvx_came_on_t *came_on,
                      const char *name, const kvx_ep_ops_t *ops, void *owner, kvx_ucx_ep_t **ep_p)
{
    bool ok;
    uint64_t uid = kvx_ucx_uid(waddr, &ok);
    const void *ep = came_on != NULL ? came_on->ep : NULL;
    int rc, over;

    if (!ok)
        return -EINVAL; /* UCX would refuse the address too */
    /* came out of order: the endpoint UCX paired with the writer's is a filler of an earlier
     * catch-up (one whose peer failed is not taken: it closes). The HELLO came on that filler,
     * or, when it came before the filler was opened (both HELLOs waited in the queue), on the
     * endpoint UCX made for the writer's, which the filler's ucp_ep_create then took over: the
     * same pointer, on a link opened since the HELLO came */
    for (size_t i = 0; ep != NULL && i < sizeof(u->fillers) / sizeof(u->fillers[0]); i++) {
        kvx_ucx_ep_t *e = u->fillers[i];
        if (e == NULL || e->failed || e->link == NULL || e->uid != uid ||
            !kvx_ucx_came_on_link(e->link, came_on))
            continue;
        e = kvx_ucx_filler_take(u, i);
        e->ops = ops;
        e->owner = owner;
        e->accepted = true;
        e->matched = true;
        kvx_debug(u, "ucx: a HELLO on catch-up endpoint %u: its connection's now", e->sn);
        *ep_p = e;
        return 0;
    }
    /* paired with this transport's own writing endpoint towards that worker (both opened theirs
     * before either answered), or with the endpoint of a receiving connection whose own HELLO
     * came on another one (a HELLO that named this worker's address from elsewhere, or a count
     * that was wrong: the place is this HELLO's): the receiving connection shares it (struct
     * kvx_ucx_link) */
    for (struct kvx_ucx_link *l = ep != NULL ? u->links : NULL; l != NULL; l = l->next) {
        kvx_ucx_ep_t *w = l->users[0], *e;
        if (!kvx_ucx_came_on_link(l, came_on))
            continue;
        if (w == NULL || w->ep == NULL || l->users[1] != NULL || l->failed || w->filler ||
            w->matched || w->uid != uid)
            break;
        if ((e = calloc(1, sizeof(*e))) == NULL)
            return -ENOMEM;
        *e = (kvx_ucx_ep_t){.u = u,
                            .ep = l->ep,
                            .ops = ops,
                            .owner = owner,
                            .sn = w->sn,
                            .uid = uid,
                            .link = l,
                            .accepted = true,
                            .matched = true};
        l->users[1] = e;
        l->joined = true;
        kvx_debug(u, "ucx: the HELLO of %s came on %s endpoint %u towards it: shared", name,
                  w->accepted ? "another receiving connection's" : "this transport's own writing",
                  w->sn);
        *ep_p = e;
        return 0;
    }
    over = kvx_ucx_align(u, waddr, uid, sn);
    if ((rc = kvx_ucx_ep_open(u, waddr, name, ops, owner, ep_p)) < 0)
        return rc;
    (*ep_p)->accepted = true;
    (*ep_p)->matched = ep != NULL && (const void *)(*ep_p)->ep == ep;
    if (!(*ep_p)->matched)
        kvx_debug(u,
                  "ucx: the HELLO of %s (the writer's endpoint %u) %s its connection's (%u): "
                  "its rendezvous payloads will be refused",
                  name, sn, ep == NULL ? "named no endpoint, not" : "came on another than",
                  (*ep_p)->sn);
    return over;
}

/* A receiving connection's endpoint on which its HELLO did not come (kvx_ucx_ep_accept; such an
 * endpoint is its link's first user), closing as its link's only user with nothing of its own in
 * UCX's hands, before any HELLO came on it: UCX paired it with an
 * endpoint the writer's worker opens towards this one, whose HELLO is still to come on it. It
 * stays open as a catch-up endpoint for that one, within their budget, so that closing the
 * connection (a slot given away, say) does not leave that one paired with nothing. true: it is
 * one now, e no longer has it. */
static bool kvx_ucx_ep_keep(kvx_ucx_ep_t *e)
{
    kvx_ucx_t *u = e->u;
    struct kvx_ucx_link *l = e->link;
    struct kvx_ucx_sn *sn = kvx_ucx_sn_find(u, e->uid, false);
    const size_t cap = sizeof(u->fillers) / sizeof(u->fillers[0]);
    kvx_ucx_ep_t *f;
    size_t i = 0;

    if (!e->accepted || e->matched || e->inflight != 0 || l == NULL || l->failed || l->joined ||
        sn == NULL || u->nfillers >= cap || sn->fillers >= KVX_FILLERS_PER_WORKER ||
        (f = calloc(1, sizeof(*f))) == NULL)
        return false;
    while (u->fillers[i] != NULL)
        i++;
    *f = (kvx_ucx_ep_t){.u = e->u, .ep = e->ep, .sn = e->sn, .uid = e->uid, .link = l};
    l->users[0] = f;
    kvx_ucx_filler_put(u, i, f, sn);
    e->ep = NULL;
    e->link = NULL;
    kvx_debug(e->u, "ucx: endpoint %u, on which no HELLO came, stays open for the one to come",
              f->sn);
    return true;
}

static void kvx_ucx_close_cb(void *req, ucs_status_t status, void *arg)
{
    kvx_ucx_ep_t *e = arg;

    (void)status;
    ucp_request_free(req);
    e->ops->on_closed(e->owner);
}

int kvx_ucx_ep_close(kvx_ucx_ep_t *e, unsigned *refs)
{
    ucp_request_param_t p = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = kvx_ucx_close_cb,
        .user_data = e,
    };
    struct kvx_ucx_link *l = e != NULL ? e->link : NULL;
    int me = l != NULL && l->users[1] == e ? 1 : 0;
    kvx_ucx_ep_t *other = l != NULL ? l->users[1 - me] : NULL;
    void *req;

    if (e == NULL || e->ep == NULL || (other == NULL && kvx_ucx_ep_keep(e)))
        return 0;
    if (other != NULL && e->inflight == 0) { /* shared: it goes on for the other user */
        l->users[me] = NULL;
        e->link = NULL;
        e->ep = NULL;
        return 0;
    }
    if (other != NULL) { /* UCX holds e's messages or receives: it closes for both */
        kvx_info(e->u, "ucx: a shared endpoint closes with its user's messages in flight: its "
                       "other user's connection fails");
        other->ep = NULL;
        l->users[1 - me] = NULL;
        other->link = NULL;
    }
    req = kvx_ucx_ep_close_ucp(e, &p);
    if (other != NULL)
        other->ops->on_error(other->owner, -ECONNRESET);
    if (UCS_PTR_IS_ERR(req)) {
        kvx_warn(e->u, "ucx: closing an endpoint: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        return 0;
    }
    if (req == NULL)
        return 0;
    (*refs)++;
    return 1;
}
