/*
 * The UCX backend: every UCP call kvx makes lives here (context, worker, region registration,
 * endpoints, RMA operations, flushes, progress, wake-up). The rest of kvx sees plain errnos.
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

struct kvx_ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    ucp_address_t *waddr;
    size_t waddr_len;
    int efd;
};

struct kvx_ucx_conn {
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    bool opened; /* kvx_ucx_conn_open succeeded */
    bool wired;  /* the wire-up flush completed */
    ucs_status_t wire_status;
};

static int kvx_ucx_errno(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return 0;
    case UCS_ERR_CANCELED:
        return -ECANCELED;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return -ECONNRESET;
    case UCS_ERR_UNREACHABLE:
        return -EHOSTUNREACH;
    case UCS_ERR_REJECTED:
        return -ECONNREFUSED;
    case UCS_ERR_TIMED_OUT:
        return -ETIMEDOUT;
    case UCS_ERR_NO_MEMORY:
        return -ENOMEM;
    case UCS_ERR_INVALID_PARAM:
        return -EINVAL;
    case UCS_ERR_UNSUPPORTED:
        return -ENOTSUP;
    case UCS_ERR_BUSY:
        return -EBUSY;
    case UCS_ERR_NO_DEVICE:
        return -ENODEV;
    case UCS_ERR_NO_RESOURCE:
        return -EAGAIN;
    default:
        return -EIO;
    }
}

/*
 * Does UCX_TLS enable one of these transports (members), or a family alias naming them all? kvx
 * tunes a transport only when it is in use: UCX warns about settings nothing consumed.
 */
static bool kvx_ucx_tls_uses(const char *const *members, size_t n, const char *const *aliases,
                             size_t naliases)
{
    const char *tls = getenv("UCX_TLS");
    char buf[512], *save = NULL, *tok;
    bool negate, alias = false, all = false;
    size_t named = 0;

    if (tls == NULL || *tls == '\0')
        return true;
    negate = (tls[0] == '^');
    snprintf(buf, sizeof(buf), "%s", tls + (negate ? 1 : 0));
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        all |= strcmp(tok, "all") == 0;
        for (size_t i = 0; i < naliases; i++)
            alias |= strcmp(tok, aliases[i]) == 0;
        for (size_t i = 0; i < n; i++)
            named += strcmp(tok, members[i]) == 0;
    }
    /* "^a,b" enables every transport except a and b */
    return negate ? !(alias || named == n) : (all || alias || named > 0);
}

static bool kvx_ucx_tls_uses_shm(void)
{
    static const char *const mm[] = {"sysv", "posix"}, *const alias[] = {"sm", "shm", "mm"};
    return kvx_ucx_tls_uses(mm, 2, alias, 3);
}

static bool kvx_ucx_tls_uses_tcp(void)
{
    static const char *const tcp[] = {"tcp"};
    return kvx_ucx_tls_uses(tcp, 1, NULL, 0);
}

/* Set key=val in UCX's configuration unless the user set it (or a more specific form of it:
 * the UCX_* variables listed in user_env) in the environment. */
static void kvx_ucx_config_set(kvx_transport_t *t, ucp_config_t *cfg, const char *key,
                               const char *val, const char *const *user_env)
{
    char env[128];
    ucs_status_t s;

    snprintf(env, sizeof(env), "UCX_%s", key);
    if (getenv(env) != NULL)
        return;
    for (; user_env != NULL && *user_env != NULL; user_env++)
        if (getenv(*user_env) != NULL)
            return;
    s = ucp_config_modify(cfg, key, val);
    if (s != UCS_OK)
        kvx_debug(t, "ucx: cannot set %s=%s: %s", key, val, ucs_status_string(s));
}

int kvx_ucx_init(kvx_transport_t *t)
{
    kvx_ucx_t *u;
    ucp_config_t *cfg = NULL;
    ucs_status_t s;
    int rc;
    char val[32];

    u = calloc(1, sizeof(*u));
    if (u == NULL)
        return -ENOMEM;
    u->efd = -1;

    s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_config_read: %s", ucs_status_string(s));
        rc = -ENODEV;
        goto err_free;
    }
    /*
     * kvx's UCX defaults; an explicit UCX_<NAME> in the environment wins over each of them.
     * - Peer error handling drops shared memory from an endpoint unless the mm transports
     *   advertise it: UCX 1.13 then falls back to tcp over loopback, 3-4x slower.
     * - Shared-memory FIFO of 128 elements of 32 KiB (UCX: 64 of 8 KiB): software RMA moves
     *   blocks through this FIFO, and fewer, larger messages gave +25-35% on 64 KiB and 1 MiB
     *   blocks here. Not 64 KiB or more: UCX 1.13 then loses every put of a 64 KiB block
     *   (kvx-bench's verification caught it) - a FIFO element's length is 16 bits.
     * - tcp segments of 60 KiB (UCX: 8 KiB): 2.5-3x the throughput of 64 KiB and 1 MiB blocks.
     */
    if (kvx_ucx_tls_uses_shm()) {
        static const char *const eh[] = {"UCX_SYSV_ERROR_HANDLING", "UCX_POSIX_ERROR_HANDLING",
                                         NULL};
        static const char *const seg[] = {"UCX_SYSV_SEG_SIZE", "UCX_POSIX_SEG_SIZE", NULL};
        static const char *const fifo[] = {"UCX_SYSV_FIFO_SIZE", "UCX_POSIX_FIFO_SIZE", NULL};
        kvx_ucx_config_set(t, cfg, "MM_ERROR_HANDLING", "y", eh);
        kvx_ucx_config_set(t, cfg, "MM_SEG_SIZE", "32k", seg);
        kvx_ucx_config_set(t, cfg, "MM_FIFO_SIZE", "128", fifo);
    }
    /* UCX matches modified keys without the transport's own prefix: "TX_SEG_SIZE", which only
     * tcp has, reaches tcp; "TCP_TX_SEG_SIZE" would be ignored with a warning. */
    if (kvx_ucx_tls_uses_tcp()) {
        static const char *const tx[] = {"UCX_TCP_TX_SEG_SIZE", NULL};
        kvx_ucx_config_set(t, cfg, "TX_SEG_SIZE", "60k", tx);
    }
    if (t->keepalive_ms != 0) {
        snprintf(val, sizeof(val), "%llums", (unsigned long long)t->keepalive_ms);
        kvx_ucx_config_set(t, cfg, "KEEPALIVE_INTERVAL", val, NULL);
        /* UCX checks 128 endpoints per round by default: with more peers than that, a dead one
         * could go unnoticed for several intervals, and the endpoints peers left behind here
         * after removing us would be reclaimed at only 128 per interval. */
        kvx_ucx_config_set(t, cfg, "KEEPALIVE_NUM_EPS", "inf", NULL);
    }

    ucp_params_t params = {
        .field_mask =
            UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
        .name = t->name,
    };
    s = ucp_init(&params, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_init: %s", ucs_status_string(s));
        rc = -ENODEV;
        goto err_free;
    }

    /* kvx's own lock serializes every call on the worker (caller threads, progress thread). */
    ucp_worker_params_t wparams = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    s = ucp_worker_create(u->ctx, &wparams, &u->worker);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_worker_create: %s", ucs_status_string(s));
        rc = -ENODEV;
        goto err_cleanup;
    }

    ucp_mem_map_params_t mparams = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = t->base,
        .length = t->num_blocks * t->block_len,
        .memory_type = UCS_MEMORY_TYPE_HOST,
    };
    s = ucp_mem_map(u->ctx, &mparams, &u->memh);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_mem_map of %llu bytes: %s", (unsigned long long)mparams.length,
                  ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_worker;
    }
    s = ucp_rkey_pack(u->ctx, u->memh, &u->rkey_buf, &u->rkey_len);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_rkey_pack: %s", ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_unmap;
    }
    s = ucp_worker_get_address(u->worker, &u->waddr, &u->waddr_len);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_worker_get_address: %s", ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_rkey;
    }
    s = ucp_worker_get_efd(u->worker, &u->efd);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_worker_get_efd: %s", ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_addr;
    }
    t->ucx = u;
    return 0;

err_addr:
    ucp_worker_release_address(u->worker, u->waddr);
err_rkey:
    ucp_rkey_buffer_release(u->rkey_buf);
err_unmap:
    ucp_mem_unmap(u->ctx, u->memh);
err_worker:
    ucp_worker_destroy(u->worker);
err_cleanup:
    ucp_cleanup(u->ctx);
err_free:
    free(u);
    return rc;
}

void kvx_ucx_fini(kvx_transport_t *t)
{
    kvx_ucx_t *u = t->ucx;

    if (u == NULL)
        return;
    ucp_worker_release_address(u->worker, u->waddr);
    ucp_rkey_buffer_release(u->rkey_buf);
    ucp_mem_unmap(u->ctx, u->memh);
    ucp_worker_destroy(u->worker);
    ucp_cleanup(u->ctx);
    free(u);
    t->ucx = NULL;
}

int kvx_ucx_local_info(kvx_transport_t *t, const void **waddr, size_t *waddr_len, const void **rkey,
                       size_t *rkey_len)
{
    *waddr = t->ucx->waddr;
    *waddr_len = t->ucx->waddr_len;
    *rkey = t->ucx->rkey_buf;
    *rkey_len = t->ucx->rkey_len;
    return 0;
}

/* ---- connections ---------------------------------------------------------------------------- */

static void kvx_ucx_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    kvx_on_conn_error(arg, kvx_ucx_errno(status));
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

/*
 * Which transport carries the data. ucp_ep_print_info lists each lane as
 *   "lane[0]:  3:sysv/memory.0 md[2] -> md[2]/sysv/sysdev[255] am am_bw#0 keepalive"
 * Lanes tagged rma_bw do one-sided RMA on registered memory (RDMA, rkey reachable). Without
 * them UCX emulates RMA with active messages on the am_bw lanes (shared memory, tcp in 1.13).
 */
static void kvx_ucx_describe(kvx_conn_t *c)
{
    char *text = NULL, *line, *save = NULL;
    size_t size = 0;
    char rma[KVX_TRANSPORT_NAME_MAX] = "", am[KVX_TRANSPORT_NAME_MAX] = "";
    FILE *f = open_memstream(&text, &size);

    if (f == NULL)
        return;
    ucp_ep_print_info(c->ucx->ep, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char tl[32];
        const char *p = strstr(line, "lane[");

        if (p == NULL || (p = strchr(p, ':')) == NULL)
            continue;
        /* "  3:sysv/memory.0" -> "sysv" */
        while (*++p == ' ')
            ;
        while (*p >= '0' && *p <= '9')
            p++;
        if (*p != ':' || sscanf(p + 1, "%31[^/ ]", tl) != 1)
            continue;
        if (strstr(line, "rma_bw") != NULL)
            kvx_ucx_list_add(rma, sizeof(rma), tl);
        if (strstr(line, "am_bw") != NULL)
            kvx_ucx_list_add(am, sizeof(am), tl);
    }
    free(text);
    c->rma_hw = rma[0] != '\0';
    snprintf(c->transport, sizeof(c->transport), "%s", c->rma_hw ? rma : am);
}

static void kvx_ucx_ep_force_close(kvx_transport_t *t, ucp_ep_h ep)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(ep, &p);

    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(t->ucx->worker);
        ucp_request_free(req);
    }
}

/* The wire-up flush: completes once the endpoint's lanes are connected to the peer. */
static void kvx_ucx_wire_cb(void *req, ucs_status_t status, void *arg)
{
    kvx_conn_t *c = arg;

    ucp_request_free(req);
    c->ucx->wired = true;
    c->ucx->wire_status = status;
    c->ucx_refs--;
    if (c->ucx->opened) {
        if (status != UCS_OK)
            kvx_on_conn_error(c, kvx_ucx_errno(status));
        kvx_conn_maybe_free(c);
    }
}

/*
 * Create the endpoint and start wiring it up at once, so that the first transfer does not pay
 * for it. Wait up to wait_ns for the wire-up: a healthy peer answers within milliseconds, an
 * unreachable one fails here. A peer that does not answer in time (stopped, busy) is not an
 * error: wire-up goes on in the background and transfers queue behind it, bounded by their
 * deadlines.
 */
int kvx_ucx_conn_open(kvx_conn_t *c, const kvx_md_t *md, uint64_t wait_ns)
{
    kvx_transport_t *t = c->t;
    kvx_ucx_conn_t *uc;
    ucs_status_t s;
    void *req;
    int rc;
    uint64_t end;

    uc = calloc(1, sizeof(*uc));
    if (uc == NULL)
        return -ENOMEM;

    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_NAME,
        .address = (const ucp_address_t *)md->worker_addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = kvx_ucx_err_cb, .arg = c},
        .name = md->agent_name,
    };
    s = ucp_ep_create(t->ucx->worker, &ep_params, &uc->ep);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_ep_create to %s: %s", md->agent_name, ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_free;
    }
    s = ucp_ep_rkey_unpack(uc->ep, md->rkey, &uc->rkey);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_ep_rkey_unpack from %s: %s", md->agent_name, ucs_status_string(s));
        rc = s == UCS_ERR_UNREACHABLE ? -EHOSTUNREACH : -EBADMSG;
        goto err_close;
    }
    c->ucx = uc;

    ucp_request_param_t fp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = kvx_ucx_wire_cb,
        .user_data = c,
    };
    req = ucp_ep_flush_nbx(uc->ep, &fp);
    if (UCS_PTR_IS_ERR(req)) {
        rc = kvx_ucx_errno(UCS_PTR_STATUS(req));
        goto err_rkey;
    }
    if (req == NULL) {
        uc->wired = true;
        uc->wire_status = UCS_OK;
    } else {
        c->ucx_refs++;
    }
    end = kvx_now_ns() + wait_ns;
    while (!uc->wired && c->pending_err == 0 && kvx_now_ns() < end)
        ucp_worker_progress(t->ucx->worker);
    rc = c->pending_err != 0                      ? c->pending_err
         : uc->wired && uc->wire_status != UCS_OK ? kvx_ucx_errno(uc->wire_status)
                                                  : 0;
    if (rc != 0) {
        kvx_error(t, "ucx: connecting to %s: %s", md->agent_name, kvx_strerror(rc));
        goto err_rkey;
    }
    if (!uc->wired)
        kvx_info(t, "ucx: %s has not answered yet; wire-up goes on in the background",
                 md->agent_name);
    uc->opened = true;
    kvx_ucx_describe(c);
    return 0;

err_rkey:
    ucp_rkey_destroy(uc->rkey);
err_close:
    kvx_ucx_ep_force_close(t, uc->ep);
    /* the wire-up flush calls back once the close has purged it */
    end = kvx_now_ns() + 1000000000ull;
    while (c->ucx_refs > 0 && kvx_now_ns() < end)
        ucp_worker_progress(t->ucx->worker);
    if (c->ucx_refs > 0)
        kvx_warn(t, "ucx: wire-up request to %s still pending after close", md->agent_name);
    c->ucx = NULL;
err_free:
    free(uc);
    return rc;
}

static void kvx_ucx_close_cb(void *req, ucs_status_t status, void *arg)
{
    kvx_conn_t *c = arg;

    (void)status;
    ucp_request_free(req);
    c->ucx_refs--;
    kvx_on_conn_closed(c);
}

/* Returns 0 when the endpoint is closed on return, 1 when kvx_on_conn_closed will follow. */
int kvx_ucx_conn_close(kvx_conn_t *c)
{
    ucp_request_param_t p = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = kvx_ucx_close_cb,
        .user_data = c,
    };
    void *req;

    if (c->ucx == NULL || c->ucx->ep == NULL)
        return 0;
    req = ucp_ep_close_nbx(c->ucx->ep, &p);
    c->ucx->ep = NULL;
    if (UCS_PTR_IS_ERR(req)) {
        kvx_warn(c->t, "ucx: closing endpoint to %s: %s", c->agent_name,
                 ucs_status_string(UCS_PTR_STATUS(req)));
        return 0;
    }
    if (req == NULL)
        return 0;
    c->ucx_refs++;
    return 1;
}

void kvx_ucx_conn_free(kvx_conn_t *c)
{
    if (c->ucx == NULL)
        return;
    if (c->ucx->rkey != NULL)
        ucp_rkey_destroy(c->ucx->rkey);
    free(c->ucx);
    c->ucx = NULL;
}

/* ---- operations ----------------------------------------------------------------------------- */

static void kvx_ucx_op_cb(void *req, ucs_status_t status, void *arg)
{
    ucp_request_free(req);
    kvx_on_op_done(arg, kvx_ucx_errno(status));
}

/* Returns 0 when UCX finished with the local buffer at once, 1 when kvx_on_op_done follows. */
int kvx_ucx_rma(kvx_conn_t *c, int op, void *local, uint64_t remote, size_t len)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = kvx_ucx_op_cb,
        .user_data = c,
    };
    void *req;

    if (op == KVX_OP_WRITE)
        req = ucp_put_nbx(c->ucx->ep, local, len, remote, c->ucx->rkey, &p);
    else
        req = ucp_get_nbx(c->ucx->ep, local, len, remote, c->ucx->rkey, &p);
    if (req == NULL)
        return 0;
    if (UCS_PTR_IS_ERR(req))
        return kvx_ucx_errno(UCS_PTR_STATUS(req));
    c->reqs++;
    c->ucx_refs++;
    return 1;
}

static void kvx_ucx_flush_cb(void *req, ucs_status_t status, void *arg)
{
    ucp_request_free(req);
    kvx_on_flush_done(arg, kvx_ucx_errno(status));
}

/* Returns 0 when every operation posted before it has completed remotely, 1 when
 * kvx_on_flush_done(f) follows. */
int kvx_ucx_flush(kvx_conn_t *c, kvx_flush_t *f)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = kvx_ucx_flush_cb,
        .user_data = f,
    };
    void *req = ucp_ep_flush_nbx(c->ucx->ep, &p);

    if (req == NULL)
        return 0;
    if (UCS_PTR_IS_ERR(req))
        return kvx_ucx_errno(UCS_PTR_STATUS(req));
    c->ucx_refs++;
    return 1;
}

unsigned kvx_ucx_progress(kvx_transport_t *t) { return ucp_worker_progress(t->ucx->worker); }

/* Returns 0 when armed (the event fd will wake a poller), -EBUSY when events are pending. */
int kvx_ucx_arm(kvx_transport_t *t) { return kvx_ucx_errno(ucp_worker_arm(t->ucx->worker)); }

int kvx_ucx_event_fd(kvx_transport_t *t) { return t->ucx->efd; }
