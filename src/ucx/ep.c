/*
 * The UCX backend's endpoints: opening one towards a worker address, the catch-up endpoints that
 * keep UCX's pairing by creation order, closing, describing; and the messages kvx sends on them.
 */
#include "ucx/ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- endpoints ---------------------------------------------------------------------------- */

void kvx_ucx_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvx_ucx_ep_t *e = arg;

    (void)ep;
    if (e->filler) { /* its peer is gone: closed after this progress (kvx_ucx_reap_fillers) */
        if (!e->failed) {
            e->failed = true;
            e->t->ucx->nfailed++;
        }
        return;
    }
    if (e->pair) {
        kvx_debug(e->t, "ucx: a pairing endpoint failed: %s", ucs_status_string(status));
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

/* Close e's UCX endpoint itself (forced), with close parameters cp. */
static void *kvx_ucx_ep_close_ucp(kvx_ucx_ep_t *e, const ucp_request_param_t *cp)
{
    void *req = ucp_ep_close_nbx(e->ep, cp);

    if (e->link != NULL)
        kvx_ucx_link_drop(e->link);
    e->ep = NULL;
    return req;
}

/* Whether the HELLO came on l's endpoint: l by its number, or, when it came on an endpoint kvx had
 * not opened then, a link opened since whose ucp_ep_create took over that very endpoint (UCX had
 * made it for the writer's, and hands it to the next one opened with its place). */
static bool kvx_ucx_came_on_link(const struct kvx_ucx_link *l, const kvx_came_on_t *c)
{
    if (c->link != 0)
        return l->id == c->link;
    return l->id > c->last && (const void *)l->ep == c->ep;
}

void kvx_ucx_drop_links(kvx_ucx_t *u)
{
    while (u->links != NULL)
        kvx_ucx_link_drop(u->links);
}

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
 * stays open as a filler (kvx_ucx_ep_keep).
 */
#define KVX_ALIGN_MAX 16

#define KVX_FILLERS_PER_WORKER 32 /* catch-up endpoints open towards one remote worker */

static uint64_t kvx_ucx_uid(const void *waddr, bool *ok)
{
    ucp_worker_address_attr_t a = {.field_mask = UCP_WORKER_ADDRESS_ATTR_FIELD_UID};

    *ok = ucp_worker_address_query((ucp_address_t *)waddr, &a) == UCS_OK;
    return *ok ? a.worker_uid : 0;
}

/* The entry of remote worker uid (made when create), or NULL: a hash table, 16 bytes per remote
 * worker an endpoint was ever opened to, as UCX's own matching keeps one per remote worker. */
static struct kvx_ucx_sn *kvx_ucx_sn_find(kvx_ucx_t *u, uint64_t uid, bool create)
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

/* An endpoint to waddr (uid: its worker's, ok: known), counted among those towards that worker. */
static int kvx_ucx_ep_new(kvx_transport_t *t, const void *waddr, uint64_t uid, bool ok,
                          const char *name, kvx_ucx_ep_t **ep_p)
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
    e->t = t;
    e->uid = uid;
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_NAME,
        .address = (const ucp_address_t *)waddr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = kvx_ucx_link_err_cb, .arg = l},
        .name = name,
    };
    s = ucp_ep_create(t->ucx->worker, &ep_params, &e->ep);
    /* UCX counts an endpoint it made (its failures are nearly all before it counts: an address it
     * refused); a worker is remembered from its first endpoint on */
    if (ok && s == UCS_OK && (sn = kvx_ucx_sn_find(t->ucx, uid, true)) != NULL)
        e->sn = sn->next_sn++;
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_ep_create to %s: %s", name, ucs_status_string(s));
        free(e);
        free(l);
        return kvx_ucx_errno(s);
    }
    l->ep = e->ep;
    l->id = ++t->ucx->next_link_id;
    l->users[0] = e;
    if ((l->next = t->ucx->links) != NULL)
        l->next->prevp = &l->next;
    l->prevp = &t->ucx->links;
    t->ucx->links = l;
    e->link = l;
    *ep_p = e;
    return 0;
}

/* Open the endpoints this worker lacks towards waddr's before its sn-th: 0, or 1 over the
 * budget (none opened). */
static int kvx_ucx_align(kvx_transport_t *t, const void *waddr, uint64_t uid, uint32_t sn)
{
    kvx_ucx_t *u = t->ucx;
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
        kvx_info(t,
                 "ucx: a writer %u endpoint(s) ahead: over the catch-up budget, none opened (its "
                 "connection's rendezvous payloads will be refused)",
                 want);
        return 1;
    }
    kvx_debug(t, "ucx: %u endpoint(s) behind the writer's (its %u, this worker's %u): catching up",
              want, sn, have);
    for (size_t i = 0; i < cap && have < sn; i++) {
        kvx_ucx_ep_t *f;
        if (u->fillers[i] != NULL)
            continue;
        if (kvx_ucx_ep_new(t, waddr, uid, true, "kvx-catch-up", &f) < 0)
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

int kvx_ucx_ep_open(kvx_transport_t *t, const void *waddr, const char *name,
                    const kvx_ep_ops_t *ops, void *owner, kvx_ucx_ep_t **ep_p)
{
    bool ok;
    uint64_t uid = kvx_ucx_uid(waddr, &ok);
    int rc = kvx_ucx_ep_new(t, waddr, uid, ok, name, ep_p);

    if (rc == 0) {
        (*ep_p)->ops = ops;
        (*ep_p)->owner = owner;
    }
    return rc;
}

int kvx_ucx_ep_accept(kvx_transport_t *t, const void *waddr, uint32_t sn,
                      const kvx_came_on_t *came_on, const char *name, const kvx_ep_ops_t *ops,
                      void *owner, kvx_ucx_ep_t **ep_p)
{
    kvx_ucx_t *u = t->ucx;
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
        kvx_debug(t, "ucx: a HELLO on catch-up endpoint %u: its connection's now", e->sn);
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
        *e = (kvx_ucx_ep_t){.t = t,
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
        kvx_debug(t, "ucx: the HELLO of %s came on %s endpoint %u towards it: shared", name,
                  w->accepted ? "another receiving connection's" : "this transport's own writing",
                  w->sn);
        *ep_p = e;
        return 0;
    }
    over = kvx_ucx_align(t, waddr, uid, sn);
    if ((rc = kvx_ucx_ep_open(t, waddr, name, ops, owner, ep_p)) < 0)
        return rc;
    (*ep_p)->accepted = true;
    (*ep_p)->matched = ep != NULL && (const void *)(*ep_p)->ep == ep;
    if (!(*ep_p)->matched)
        kvx_debug(t,
                  "ucx: the HELLO of %s (the writer's endpoint %u) %s its connection's (%u): "
                  "its rendezvous payloads will be refused",
                  name, sn, ep == NULL ? "named no endpoint, not" : "came on another than",
                  (*ep_p)->sn);
    return over;
}

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

/* A receiving connection's endpoint on which its HELLO did not come (kvx_ucx_ep_accept; such an
 * endpoint is its link's first user), closing as its link's only user with nothing of its own in
 * UCX's hands, before any HELLO came on it: UCX paired it with an
 * endpoint the writer's worker opens towards this one, whose HELLO is still to come on it. It
 * stays open as a catch-up endpoint for that one, within their budget, so that closing the
 * connection (a slot given away, say) does not leave that one paired with nothing. true: it is
 * one now, e no longer has it. */
static bool kvx_ucx_ep_keep(kvx_ucx_ep_t *e)
{
    kvx_ucx_t *u = e->t->ucx;
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
    *f = (kvx_ucx_ep_t){.t = e->t, .ep = e->ep, .sn = e->sn, .uid = e->uid, .link = l};
    l->users[0] = f;
    kvx_ucx_filler_put(u, i, f, sn);
    e->ep = NULL;
    e->link = NULL;
    kvx_debug(e->t, "ucx: endpoint %u, on which no HELLO came, stays open for the one to come",
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
        kvx_info(e->t, "ucx: a shared endpoint closes with its user's messages in flight: its "
                       "other user's connection fails");
        other->ep = NULL;
        l->users[1 - me] = NULL;
        other->link = NULL;
    }
    req = kvx_ucx_ep_close_ucp(e, &p);
    if (other != NULL)
        other->ops->on_error(other->owner, -ECONNRESET);
    if (UCS_PTR_IS_ERR(req)) {
        kvx_warn(e->t, "ucx: closing an endpoint: %s", ucs_status_string(UCS_PTR_STATUS(req)));
        return 0;
    }
    if (req == NULL)
        return 0;
    (*refs)++;
    return 1;
}

void kvx_ucx_ep_free(kvx_ucx_ep_t *e)
{
    if (e == NULL)
        return;
    if (e->link != NULL) /* never closed (its worker is gone): the link goes with the worker */
        e->link->users[e->link->users[0] == e ? 0 : 1] = NULL;
    if (e->pair) {
        kvx_ucx_ep_t **pp = &e->t->ucx->pair_eps;
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

/* ---- rendezvous receives ----------------------------------------------------------------------
 */

/* A receive's record, reused from the worker's list (u->rx_free): no allocation per receive once
 * as many were in flight at once. */
struct kvx_ucx_rx {
    kvx_ucx_ep_t *ep;
    void *cookie;
    struct kvx_ucx_rx *next_free;
};
typedef struct kvx_ucx_rx kvx_ucx_rx_t;

static void kvx_ucx_rx_put(kvx_ucx_t *u, kvx_ucx_rx_t *rx)
{
    rx->next_free = u->rx_free;
    u->rx_free = rx;
}

void kvx_ucx_free_rxs(kvx_ucx_t *u)
{
    while (u->rx_free != NULL) {
        kvx_ucx_rx_t *rx = u->rx_free;
        u->rx_free = rx->next_free;
        free(rx);
    }
}

static void kvx_ucx_recv_cb(void *req, ucs_status_t status, size_t length, void *arg)
{
    kvx_ucx_rx_t *rx = arg;
    kvx_ucx_ep_t *e = rx->ep;
    void *cookie = rx->cookie;

    (void)length;
    ucp_request_free(req);
    kvx_ucx_rx_put(e->t->ucx, rx);
    e->inflight--;
    e->ops->on_received(e->owner, cookie, kvx_ucx_errno(status));
}

int kvx_ucx_recv(kvx_ucx_ep_t *e, void *desc, void *dest, size_t len, void *cookie, unsigned *refs)
{
    kvx_ucx_t *u = e->t->ucx;
    kvx_ucx_rx_t *rx = u->rx_free;
    ucp_request_param_t p = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.recv_am = kvx_ucx_recv_cb,
        .datatype = ucp_dt_make_contig(1),
    };
    void *req;

    /* only what came on e itself: closing e is what ends the receive (UCX cannot cancel it),
     * and a sender could otherwise tie it to an endpoint nobody would close */
    if (e->ep == NULL || u->rx_reply_ep != e->ep) {
        bool filler = false;
        const size_t nf = u->rx_reply_ep != NULL ? sizeof(u->fillers) / sizeof(u->fillers[0]) : 0;
        for (size_t i = 0; i < nf && !filler; i++)
            filler = u->fillers[i] != NULL && u->fillers[i]->ep == u->rx_reply_ep;
        /* which one tells a hostile sender from endpoints UCX paired out of order */
        kvx_debug(e->t, "ucx: a rendezvous payload on %s endpoint, not its connection's",
                  u->rx_reply_ep == NULL ? "no"
                  : filler               ? "a catch-up (kvx_ucx_align)"
                                         : "another");
        return -EPERM;
    }
    if (rx != NULL)
        u->rx_free = rx->next_free;
    else if ((rx = malloc(sizeof(*rx))) == NULL)
        return -ENOMEM;
    rx->ep = e;
    rx->cookie = cookie;
    p.user_data = rx;
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
    kvx_ucx_rx_put(u, rx);
    return req == NULL ? 0 : kvx_ucx_errno(UCS_PTR_STATUS(req));
}
