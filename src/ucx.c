/*
 * The UCX backend: every UCP call kvx makes lives here (context, worker, endpoints, kvx's active
 * messages in and out, progress, wake-up). The rest of kvx sees plain errnos. UCP's RMA feature
 * is never enabled: UCX's own put and get handlers, which write and read any address a message
 * names, do not exist in kvx's workers. Every byte a peer sends arrives through kvx_ucx_am_cb and
 * is checked by kvx before it goes anywhere.
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

/* The active-message id of every kvx message (the type is in kvx's own header). */
#define KVX_AM_ID 0x4b

struct kvx_ucx {
    const kvx_ucx_ops_t *ops; /* what the layers above hear of the worker (kvx_ucx_init) */
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *waddr;
    size_t waddr_len;
    int efd;
    ucp_mem_h region; /* an owned region UCX allocated, or NULL */
    int seg_id;       /* ... its System V segment, listed as this process's (seg_listed) */
    bool seg_listed;
    struct kvx_ucx_sn {
        uint64_t uid;     /* a remote worker */
        uint32_t next_sn; /* endpoints this worker opened towards it (UCX's conn_sn) */
        uint16_t fillers; /* catch-up endpoints towards it still open */
        uint8_t used;
    } * sns; /* a hash table by uid (open addressing), sns_cap a power of two */
    size_t nsns, sns_cap;
    struct kvx_ucx_filler {
        struct kvx_ucx *u;
        ucp_ep_h ep; /* NULL: a free slot */
        uint64_t uid;
        bool failed; /* its peer failed: closed by kvx_ucx_progress */
    } fillers[256];  /* endpoints opened only to catch up (kvx_ucx_align) */
    size_t nfillers, nfailed;
    void *rkey; /* its packed key (in the metadata) */
    size_t rkey_len;
    ucp_listener_h listener; /* kvx_transport_listen */
    kvx_ucx_ep_t *pair_eps;  /* endpoints of UCX's connection manager (listen.c) */
};

struct kvx_ucx_ep {
    kvx_transport_t *t;
    ucp_ep_h ep;
    const kvx_ep_ops_t *ops; /* what its owner hears: given when it opened */
    void *owner;             /* kvx_conn_t *, kvx_rconn_t * or kvx_pairing_t * */
    bool pair;               /* an endpoint of UCX's connection manager (a pairing's) */
    kvx_ucx_ep_t *pair_next;
    kvx_send_t *free; /* messages to reuse */
    ucp_rkey_h rkey;  /* the peer's owned region, mapped here (kvx_ucx_map) */
    uint32_t sn;      /* its place among this worker's endpoints to that worker */
};

_Static_assert(sizeof(kvx_iov_t) == sizeof(ucp_dt_iov_t) &&
                   offsetof(kvx_iov_t, base) == offsetof(ucp_dt_iov_t, buffer) &&
                   offsetof(kvx_iov_t, len) == offsetof(ucp_dt_iov_t, length),
               "kvx_iov_t must be laid out as ucp_dt_iov_t");

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

static ucs_status_t kvx_ucx_am_cb(void *arg, const void *header, size_t header_length, void *data,
                                  size_t length, const ucp_am_recv_param_t *param);

/* One setting kvx makes in UCX's configuration; the forms UCX versions accept for it. */
typedef struct kvx_ucx_setting {
    const char *key[2];          /* the form tried first, and the other one (or NULL) */
    const char *const *user_env; /* UCX_* variables that mean the user chose this themselves */
    char val[32];
    int form;      /* which key was applied, -1: none (the user's choice stands) */
    bool rejected; /* UCX reported the applied form unused */
} kvx_ucx_setting_t;

/*
 * UCX reports settings no transport consumed ("invalid configuration: K=V", a warning during
 * worker creation): kvx captures those warnings for its own settings, to try the other form of
 * a key (UCX 1.13 takes tcp's "TX_SEG_SIZE", 1.19 only "TCP_TX_SEG_SIZE") and to log what did
 * not apply, instead of assuming. UCX's log handlers are process-wide: kvx takes one capture at a
 * time, looks only at messages of the thread creating its worker, and passes every other message
 * on (other UCX users of the process see theirs as usual). The report names every unused key at
 * once, kvx's and any the application set through ucp_config_modify: kvx keeps its own and
 * passes the message on when it names anything else.
 */
static pthread_mutex_t kvx_ucx_capture_lock = PTHREAD_MUTEX_INITIALIZER;
static char kvx_ucx_captured[1024];
static _Thread_local bool kvx_ucx_capturing;
static const kvx_ucx_setting_t *kvx_ucx_capture_set;
static size_t kvx_ucx_capture_nset;

/* Does the report "invalid configuration(s): K=V,K=V" name only kvx's settings? */
static bool kvx_ucx_report_is_ours(const char *msg)
{
    const char *p = strchr(msg, ':');

    if (p == NULL)
        return false;
    for (p++; *p != '\0';) {
        size_t klen;
        bool ours = false;
        while (*p == ' ' || *p == ',')
            p++;
        klen = strcspn(p, "=");
        if (p[klen] != '=')
            return *p == '\0';
        for (size_t i = 0; i < kvx_ucx_capture_nset && !ours; i++) {
            const kvx_ucx_setting_t *st = &kvx_ucx_capture_set[i];
            const char *k = st->form >= 0 ? st->key[st->form] : NULL;
            ours = k != NULL && strlen(k) == klen && strncmp(p, k, klen) == 0;
        }
        if (!ours)
            return false;
        p += klen + strcspn(p + klen, ",");
    }
    return true;
}

static ucs_log_func_rc_t kvx_ucx_capture(const char *file, unsigned line, const char *function,
                                         ucs_log_level_t level,
                                         const ucs_log_component_config_t *comp_conf,
                                         const char *message, va_list ap)
{
    char buf[512];
    size_t len;
    va_list aq;

    (void)file, (void)line, (void)function, (void)comp_conf;
    if (!kvx_ucx_capturing || level != UCS_LOG_LEVEL_WARN ||
        strncmp(message, "invalid configuration", 21) != 0)
        return UCS_LOG_FUNC_RC_CONTINUE;
    va_copy(aq, ap);
    vsnprintf(buf, sizeof(buf), message, aq);
    va_end(aq);
    len = strlen(kvx_ucx_captured);
    snprintf(kvx_ucx_captured + len, sizeof(kvx_ucx_captured) - len, "%s,", buf);
    /* kvx handles a report of its own settings (kvx_ucx_start); anything else stays visible */
    return kvx_ucx_report_is_ours(buf) ? UCS_LOG_FUNC_RC_STOP : UCS_LOG_FUNC_RC_CONTINUE;
}

/* Did UCX report "key=..." unused in the captured warnings? */
static bool kvx_ucx_reported(const char *key)
{
    char pat[64];
    const char *p = kvx_ucx_captured;

    snprintf(pat, sizeof(pat), "%s=", key);
    while ((p = strstr(p, pat)) != NULL) {
        if (p[-1] == ' ' || p[-1] == ',')
            return true;
        p++;
    }
    return false;
}

static void kvx_ucx_apply(kvx_transport_t *t, ucp_config_t *cfg, kvx_ucx_setting_t *st)
{
    char env[128];
    ucs_status_t s;

    st->form = -1;
    for (int i = 0; i < 2 && st->key[i] != NULL; i++) {
        snprintf(env, sizeof(env), "UCX_%s", st->key[i]);
        if (getenv(env) != NULL)
            return;
    }
    for (const char *const *e = st->user_env; e != NULL && *e != NULL; e++)
        if (getenv(*e) != NULL)
            return;
    for (int i = st->rejected ? 1 : 0; i < 2 && st->key[i] != NULL; i++) {
        s = ucp_config_modify(cfg, st->key[i], st->val);
        if (s == UCS_OK) {
            st->form = i;
            return;
        }
        kvx_debug(t, "ucx: cannot set %s=%s: %s", st->key[i], st->val, ucs_status_string(s));
    }
}

static void kvx_ucx_stop(kvx_ucx_t *u)
{
    if (u->worker != NULL)
        ucp_worker_destroy(u->worker);
    if (u->ctx != NULL)
        ucp_cleanup(u->ctx);
    u->worker = NULL;
    u->ctx = NULL;
}

/* Context and worker with kvx's settings applied. Returns 1 when UCX reported one of them
 * unused and another form exists (the caller starts again), 0 when started, or an errno. */
static int kvx_ucx_start(kvx_transport_t *t, kvx_ucx_t *u, kvx_ucx_setting_t *set, size_t nset)
{
    ucp_config_t *cfg = NULL;
    ucs_status_t s;
    int retry = 0;

    s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_config_read: %s", ucs_status_string(s));
        return -ENODEV;
    }
    for (size_t i = 0; i < nset; i++)
        kvx_ucx_apply(t, cfg, &set[i]);
    if (t->net_devices != NULL) { /* the application's choice: it overrides UCX_NET_DEVICES */
        s = ucp_config_modify(cfg, "NET_DEVICES", t->net_devices);
        if (s != UCS_OK) {
            kvx_error(t, "ucx: NET_DEVICES=%s: %s", t->net_devices, ucs_status_string(s));
            ucp_config_release(cfg);
            return -EINVAL;
        }
    }

    ucp_params_t params = {
        .field_mask =
            UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
        .name = t->name,
    };
    /* kvx's own lock serializes every call on the worker (caller threads, progress thread). */
    ucp_worker_params_t wparams = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    pthread_mutex_lock(&kvx_ucx_capture_lock);
    kvx_ucx_captured[0] = '\0';
    kvx_ucx_capture_set = set;
    kvx_ucx_capture_nset = nset;
    kvx_ucx_capturing = true;
    ucs_log_push_handler(kvx_ucx_capture);
    s = ucp_init(&params, cfg, &u->ctx);
    if (s == UCS_OK) {
        s = ucp_worker_create(u->ctx, &wparams, &u->worker);
        if (s != UCS_OK)
            kvx_error(t, "ucx: ucp_worker_create: %s", ucs_status_string(s));
    } else {
        kvx_error(t, "ucx: ucp_init: %s", ucs_status_string(s));
    }
    ucs_log_pop_handler();
    kvx_ucx_capturing = false;
    for (size_t i = 0; i < nset; i++) {
        kvx_ucx_setting_t *st = &set[i];
        if (st->form < 0 || !kvx_ucx_reported(st->key[st->form]))
            continue;
        if (st->form == 0 && st->key[1] != NULL && !st->rejected) {
            kvx_debug(t, "ucx: %s=%s unused by this UCX; trying %s", st->key[0], st->val,
                      st->key[1]);
            st->rejected = true;
            retry = 1;
        } else {
            kvx_warn(t, "ucx: this UCX ignored kvx's setting %s=%s", st->key[st->form], st->val);
        }
    }
    pthread_mutex_unlock(&kvx_ucx_capture_lock);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        kvx_ucx_stop(u);
        return -ENODEV;
    }
    if (retry)
        kvx_ucx_stop(u);
    return retry;
}

/*
 * A listener (kvx_transport_listen) of a process that restarted must bind its address again while
 * connections of the last one linger in TIME_WAIT: SO_REUSEADDR (Linux still refuses a second
 * live listener). UCX 1.19 takes TCP_CM_REUSEADDR from ucp_config_modify (kvx_ucx_init); 1.13
 * takes it only from its environment, read when the worker is created (measured with getsockopt
 * on the listening socket). So on 1.13 kvx sets UCX_TCP_CM_REUSEADDR=y once, before its first
 * worker, unless the environment says otherwise.
 */
static void kvx_ucx_reuseaddr_env(kvx_transport_t *t)
{
    static bool done;

    pthread_mutex_lock(&kvx_ucx_capture_lock);
    if (!done && getenv("UCX_TCP_CM_REUSEADDR") == NULL) {
        if (setenv("UCX_TCP_CM_REUSEADDR", "y", 0) == 0)
            kvx_debug(t, "ucx: UCX_TCP_CM_REUSEADDR=y (this UCX reads it from the environment)");
    }
    done = true;
    pthread_mutex_unlock(&kvx_ucx_capture_lock);
}

int kvx_ucx_init(kvx_transport_t *t, const kvx_ucx_ops_t *ops)
{
    static const char *const eh[] = {"UCX_SYSV_ERROR_HANDLING", "UCX_POSIX_ERROR_HANDLING", NULL};
    static const char *const seg[] = {"UCX_SYSV_SEG_SIZE", "UCX_POSIX_SEG_SIZE", NULL};
    static const char *const fifo[] = {"UCX_SYSV_FIFO_SIZE", "UCX_POSIX_FIFO_SIZE", NULL};
    static const char *const tx[] = {"UCX_TCP_TX_SEG_SIZE", "UCX_TX_SEG_SIZE", NULL};
    static const char *const reuse[] = {"UCX_TCP_CM_REUSEADDR", NULL};
    kvx_ucx_setting_t set[10];
    size_t nset = 0;
    unsigned major, minor, release;
    kvx_ucx_t *u;
    ucs_status_t s;
    int rc;

    u = calloc(1, sizeof(*u));
    if (u == NULL)
        return -ENOMEM;
    u->efd = -1;
    u->ops = ops;

    /*
     * kvx's UCX defaults; an explicit UCX_<NAME> in the environment wins over each of them.
     * - Peer error handling drops shared memory from an endpoint unless the mm transports
     *   advertise it: UCX 1.13 then falls back to tcp over loopback, 3-4x slower.
     * - Shared-memory FIFO of 128 elements of 32 KiB (UCX: 64 of 8 KiB): software RMA moves
     *   blocks through this FIFO, and fewer, larger messages gave +25-35% on 64 KiB and 1 MiB
     *   blocks here. Not 64 KiB or more: UCX 1.13 then loses every put of a 64 KiB block
     *   (kvx-bench's verification caught it) - a FIFO element's length is 16 bits.
     * - tcp segments of 60 KiB (UCX: 8 KiB): 2.5-3x the throughput of 64 KiB and 1 MiB blocks.
     *   UCX 1.13 matches modified keys without the transport's prefix ("TX_SEG_SIZE"); later
     *   versions want "TCP_TX_SEG_SIZE". The form this version takes is tried first, and UCX's
     *   report decides (kvx_ucx_start).
     */
    memset(set, 0, sizeof(set));
    ucp_get_version(&major, &minor, &release);
    if (major == 1 && minor <= 13)
        kvx_ucx_reuseaddr_env(t);
    if (kvx_ucx_tls_uses_shm()) {
        set[nset++] = (kvx_ucx_setting_t){{"MM_ERROR_HANDLING", NULL}, eh, "y", -1, false};
        set[nset++] = (kvx_ucx_setting_t){{"MM_SEG_SIZE", NULL}, seg, "32k", -1, false};
        set[nset++] = (kvx_ucx_setting_t){{"MM_FIFO_SIZE", NULL}, fifo, "128", -1, false};
    }
    if (kvx_ucx_tls_uses_tcp()) {
        bool old = major == 1 && minor <= 13;
        set[nset++] = (kvx_ucx_setting_t){
            {old ? "TX_SEG_SIZE" : "TCP_TX_SEG_SIZE", old ? "TCP_TX_SEG_SIZE" : "TX_SEG_SIZE"},
            tx,
            "60k",
            -1,
            false};
    }
    /* SO_REUSEADDR for a listener (kvx_ucx_reuseaddr_env says why; on 1.13, done there) */
    if (!(major == 1 && minor <= 13))
        set[nset++] = (kvx_ucx_setting_t){{"TCP_CM_REUSEADDR", NULL}, reuse, "y", -1, false};
    if (t->keepalive_ms != 0) {
        kvx_ucx_setting_t *st = &set[nset++];
        *st = (kvx_ucx_setting_t){{"KEEPALIVE_INTERVAL", NULL}, NULL, "", -1, false};
        snprintf(st->val, sizeof(st->val), "%llums", (unsigned long long)t->keepalive_ms);
        /* UCX checks 128 endpoints per round by default: with more peers than that, a dead one
         * could go unnoticed for several intervals, and the endpoints peers left behind here
         * after removing us would be reclaimed at only 128 per interval. */
        set[nset++] = (kvx_ucx_setting_t){{"KEEPALIVE_NUM_EPS", NULL}, NULL, "inf", -1, false};
    }
    rc = kvx_ucx_start(t, u, set, nset);
    if (rc == 1)
        rc = kvx_ucx_start(t, u, set, nset);
    if (rc != 0) {
        rc = rc > 0 ? -ENODEV : rc;
        goto err_free;
    }
    for (size_t i = 0; i < nset; i++)
        if (set[i].form >= 0)
            kvx_debug(t, "ucx %u.%u.%u: %s=%s", major, minor, release, set[i].key[set[i].form],
                      set[i].val);

    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = KVX_AM_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = kvx_ucx_am_cb,
        .arg = t,
    };
    s = ucp_worker_set_am_recv_handler(u->worker, &hp);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_worker_set_am_recv_handler: %s", ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_stop;
    }
    s = ucp_worker_get_address(u->worker, &u->waddr, &u->waddr_len);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_worker_get_address: %s", ucs_status_string(s));
        rc = kvx_ucx_errno(s);
        goto err_stop;
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
err_stop:
    kvx_ucx_stop(u);
err_free:
    free(u);
    return rc;
}

static void kvx_ucx_close_fillers(kvx_ucx_t *u);

void kvx_ucx_fini(kvx_transport_t *t)
{
    kvx_ucx_t *u = t->ucx;

    if (u == NULL || u->worker == NULL)
        return;
    kvx_ucx_close_fillers(u);
    kvx_ucx_unlisten(t);
    ucp_worker_release_address(u->worker, u->waddr);
    ucp_worker_destroy(u->worker);
    u->worker = NULL;
    if (u->region != NULL)
        return; /* an owned region stays mapped until kvx_ucx_free */
    kvx_ucx_free(t);
}

/* After kvx_ucx_fini: the owned region (if any) and the context go. */
void kvx_ucx_free(kvx_transport_t *t)
{
    kvx_ucx_t *u = t->ucx;

    if (u == NULL)
        return;
    kvx_ucx_region_free(t);
    ucp_cleanup(u->ctx);
    free(u->sns);
    free(u);
    t->ucx = NULL;
}

void kvx_ucx_local_address(kvx_transport_t *t, const void **waddr, size_t *waddr_len)
{
    *waddr = t->ucx->waddr;
    *waddr_len = t->ucx->waddr_len;
}

/* ---- owned regions ---------------------------------------------------------------------------
 */

static bool kvx_ucx_shared_mapping(uintptr_t p, uint64_t len);

/*
 * The owner's half of the segment proof (segment.c): a fresh random token in the trailer at the
 * end of the region's System V segment, which every HELLO_ACK also carries (recv.c). Without
 * such a segment the token stays zero and no peer maps the region.
 */
static void kvx_ucx_seg_token(kvx_transport_t *t, uint8_t *base, size_t len)
{
    uint8_t token[KVX_SEG_TOKEN_LEN] = {0};
    kvx_seg_info_t s;

    memset(t->seg_token, 0, sizeof(t->seg_token));
    if (kvx_seg_lookup((uintptr_t)base, &s) < 0 || !s.sysv || s.lo != (uintptr_t)base ||
        s.off != 0 || s.segsz < KVX_SEG_TRAILER_LEN || s.segsz - KVX_SEG_TRAILER_LEN < len ||
        s.segsz > s.hi - s.lo) {
        kvx_info(t, "ucx: the owned region is not a System V segment of its own: peers on this "
                    "host use messages");
        return;
    }
    while (kvx_equal_ct(token, t->seg_token, sizeof(token)))
        if (getrandom(token, sizeof(token), 0) != (ssize_t)sizeof(token)) {
            kvx_warn(t, "ucx: no random segment token (%m): peers on this host use messages");
            return;
        }
    if (kvx_seg_own_add(s.shmid) < 0) {
        kvx_warn(t, "ucx: no memory to list the owned region's segment: peers use messages");
        return;
    }
    t->ucx->seg_id = s.shmid;
    t->ucx->seg_listed = true;
    kvx_seg_trailer_put(base + s.segsz - KVX_SEG_TRAILER_LEN, len, token);
    memcpy(t->seg_token, token, sizeof(token));
}

/*
 * Allocate len bytes through UCX (ucp_mem_map with UCP_MEM_MAP_ALLOCATE): UCX takes them from
 * shared memory (sysv, else posix) when it can, so that a peer on this host that unpacks the
 * packed key maps the same pages. One page more than the region's holds the segment's trailer
 * (kvx_ucx_seg_token); the region and the block count peers see are len bytes. The packed key
 * goes into the metadata. When UCX could only give private memory (no shared-memory transport),
 * the region works all the same, peers use messages, and its contents start unspecified (logged).
 */
int kvx_ucx_region_alloc(kvx_transport_t *t, size_t len, void **base_p, const void **rkey_p,
                         size_t *rkey_len_p)
{
    kvx_ucx_t *u = t->ucx;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    ucs_status_t s;

    if (len > SIZE_MAX - 2 * page)
        return -ENOMEM;
    mp.length = (len + page - 1) / page * page + page;
    s = ucp_mem_map(u->ctx, &mp, &u->region);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: allocating a region of %zu bytes: %s", len, ucs_status_string(s));
        u->region = NULL;
        return s == UCS_ERR_NO_MEMORY ? -ENOMEM : kvx_ucx_errno(s);
    }
    s = ucp_mem_query(u->region, &attr);
    if (s == UCS_OK && attr.length < mp.length)
        s = UCS_ERR_NO_MEMORY;
    if (s == UCS_OK)
        s = ucp_rkey_pack(u->ctx, u->region, &u->rkey, &u->rkey_len);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: the owned region: %s", ucs_status_string(s));
        kvx_ucx_region_free(t);
        return -ENOMEM;
    }
    if (!kvx_ucx_shared_mapping((uintptr_t)attr.address, len))
        kvx_info(t, "ucx: the owned region is private memory (no shared-memory transport): peers "
                    "use messages, its contents start unspecified");
    else
        kvx_ucx_seg_token(t, attr.address, len);
    *base_p = attr.address;
    *rkey_p = u->rkey;
    *rkey_len_p = u->rkey_len;
    return 0;
}

void kvx_ucx_region_free(kvx_transport_t *t)
{
    kvx_ucx_t *u = t->ucx;

    if (u->rkey != NULL)
        ucp_rkey_buffer_release(u->rkey);
    u->rkey = NULL;
    u->rkey_len = 0;
    if (u->seg_listed)
        kvx_seg_own_del(u->seg_id);
    u->seg_listed = false;
    if (u->region != NULL)
        ucp_mem_unmap(u->ctx, u->region);
    u->region = NULL;
}

/* Whether [p, p + len) lies inside one shared mapping of this process (a System V segment or a
 * POSIX shared memory file), read from /proc/self/maps: ucp_rkey_ptr is plain arithmetic and
 * checks no bound, so the peer's num_blocks alone must not decide how far kvx copies. */
static bool kvx_ucx_shared_mapping(uintptr_t p, uint64_t len)
{
    FILE *f = fopen("/proc/self/maps", "re");
    char line[512];
    bool ok = false;

    if (f == NULL)
        return false;
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || p < lo || p >= hi)
            continue;
        ok = perms[0] == 'r' && perms[1] == 'w' && perms[3] == 's' && len <= hi - p &&
             (strstr(line, "/SYSV") != NULL || strstr(line, "/dev/shm/") != NULL);
        break;
    }
    fclose(f);
    return ok;
}

/*
 * Map a peer's owned region into this process: unpack its key on the endpoint and ask UCX for a
 * pointer to raddr (ucp_rkey_ptr: only a shared-memory key gives one). UCX attaches whatever
 * segment the key's id names and offsets into it without a check, so kvx asks the kernel what
 * the pointer is (segment.c): the start of a System V segment that the peer's process (owner,
 * its pid here) created, holding len bytes and the owner's trailer after them; a segment this
 * process created only if it is an owned region of a transport of this process. Returns 0 with
 * *ptr_p and the trailer's token in token_p; -EOPNOTSUPP when the key gives no usable mapping
 * (another host's key, a POSIX one); -EPERM when it names a segment kvx refuses (logged as a
 * warning). The caller copies nothing into *ptr_p until the peer's HELLO_ACK brings that token
 * (kvx_conn_map_prove).
 */
int kvx_ucx_map(kvx_ucx_ep_t *e, const void *rkey, size_t rkey_len, uint64_t raddr, uint64_t len,
                uint32_t owner, void **ptr_p, uint8_t *token_p)
{
    const char *why = "nothing is mapped there";
    kvx_seg_info_t seg;
    void *first = NULL;
    ucs_status_t s;
    int rc;

    (void)rkey_len; /* UCX takes none: the metadata's signature is what vouches for the key */
    if (e == NULL || e->ep == NULL || e->rkey != NULL || len == 0)
        return -EINVAL;
    s = ucp_ep_rkey_unpack(e->ep, rkey, &e->rkey);
    if (s != UCS_OK) {
        e->rkey = NULL;
        kvx_debug(e->t, "ucx: the peer's region key: %s", ucs_status_string(s));
        return -EOPNOTSUPP;
    }
    s = ucp_rkey_ptr(e->rkey, raddr, &first);
    if (s != UCS_OK) {
        kvx_info(e->t, "ucx: the peer's region gives no mapping here: %s", ucs_status_string(s));
        kvx_ucx_unmap(e);
        return -EOPNOTSUPP;
    }
    rc = kvx_seg_lookup((uintptr_t)first, &seg) < 0 ? -EOPNOTSUPP : 0;
    if (rc == 0)
        rc = kvx_seg_check(&seg, (uintptr_t)first, len, owner, (uint32_t)getpid(),
                           seg.sysv && kvx_seg_own_has(seg.shmid), &why);
    if (rc == 0)
        rc = kvx_seg_trailer_get((uint8_t *)first + seg.segsz - KVX_SEG_TRAILER_LEN, len, token_p,
                                 &why);
    if (rc < 0) {
        if (rc == -EPERM)
            kvx_warn(e->t, "ucx: the peer's region key names a segment kvx does not map (%s)", why);
        else
            kvx_info(e->t, "ucx: the peer's region gives no mapping of %llu bytes here (%s)",
                     (unsigned long long)len, why);
        kvx_ucx_unmap(e);
        return rc;
    }
    *ptr_p = first;
    return 0;
}

void kvx_ucx_unmap(kvx_ucx_ep_t *e)
{
    if (e == NULL || e->rkey == NULL)
        return;
    ucp_rkey_destroy(e->rkey);
    e->rkey = NULL;
}

/* ---- messages in ------------------------------------------------------------------------------
 */

/* Every kvx message arrives here, inside UCX progress with the transport lock held. Its header is
 * decoded strictly before anything else looks at it. */
static ucs_status_t kvx_ucx_am_cb(void *arg, const void *header, size_t header_length, void *data,
                                  size_t length, const ucp_am_recv_param_t *param)
{
    kvx_transport_t *t = arg;
    kvx_msg_t m;

    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* kvx sends only eager messages: a rendezvous is not kvx's; returning without
         * receiving it drops it */
        t->ucx->ops->on_drop(t, KVX_DROP_RNDV);
        return UCS_OK;
    }
    if (kvx_wire_decode(header, header_length, length, &m) < 0) {
        t->ucx->ops->on_drop(t, KVX_DROP_MALFORMED);
        return UCS_OK;
    }
    switch (m.type) {
    case KVX_MSG_HELLO:
    case KVX_MSG_WRITE:
    case KVX_MSG_READ_REQ:
    case KVX_MSG_NOTICE:
    case KVX_MSG_BYE:
    case KVX_MSG_PROOF:
        t->ucx->ops->on_request(t, &m, header, header_length, data, length);
        break;
    case KVX_MSG_CHALLENGE:
    case KVX_MSG_MD_REQ:
    case KVX_MSG_MD: {
        /* only on a pairing's endpoint, which the sender names (UCP_AM_SEND_FLAG_REPLY) */
        kvx_ucx_ep_t *e = NULL;
        if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
            for (e = t->ucx->pair_eps; e != NULL && e->ep != param->reply_ep; e = e->pair_next)
                ;
        if (e == NULL) {
            t->ucx->ops->on_drop(t, KVX_DROP_UNKNOWN);
            break;
        }
        e->ops->on_message(e->owner, &m, data, length);
        break;
    }
    default:
        t->ucx->ops->on_reply(t, &m, data, length);
        break;
    }
    return UCS_OK;
}

/* ---- endpoints ---------------------------------------------------------------------------- */

static void kvx_ucx_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvx_ucx_ep_t *e = arg;

    (void)ep;
    if (e->pair) {
        kvx_debug(e->t, "ucx: a pairing endpoint failed: %s", ucs_status_string(status));
        /* what UCX's connection manager says when nothing listens at the address */
        e->ops->on_error(e->owner,
                         status == UCS_ERR_NOT_CONNECTED ? -ECONNREFUSED : kvx_ucx_errno(status));
    } else
        e->ops->on_error(e->owner, kvx_ucx_errno(status));
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
 * HELLO, KVX_FILLERS_PER_WORKER open towards one worker, 256 open in all) refuses the HELLO. A
 * receiver already ahead (it opened endpoints of its own towards that worker) is left as it is.
 * HELLOs of two connections open at once that arrive out of order (tcp) are not told apart from a
 * lost one: the later reply endpoint then pairs with the writer's next endpoint (a known limit;
 * pairing by UCX's connection manager would remove it).
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

static void kvx_ucx_filler_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    struct kvx_ucx_filler *f = arg;
    (void)ep;
    (void)status;
    if (f->ep != NULL && !f->failed) { /* its peer is gone: closed after this progress */
        f->failed = true;
        f->u->nfailed++;
    }
}

static void kvx_ucx_filler_closed(void *req, ucs_status_t status, void *arg)
{
    (void)status;
    (void)arg;
    ucp_request_free(req);
}

/* Close the catch-up endpoints whose peer failed (not from inside UCX's callback). */
static void kvx_ucx_reap_fillers(kvx_ucx_t *u)
{
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE,
                              .cb.send = kvx_ucx_filler_closed};

    for (size_t i = 0; i < sizeof(u->fillers) / sizeof(u->fillers[0]) && u->nfailed > 0; i++) {
        struct kvx_ucx_filler *f = &u->fillers[i];
        struct kvx_ucx_sn *e;
        void *req;
        if (f->ep == NULL || !f->failed)
            continue;
        req = ucp_ep_close_nbx(f->ep, &cp);
        (void)req; /* a request frees itself in kvx_ucx_filler_closed */
        if ((e = kvx_ucx_sn_find(u, f->uid, false)) != NULL && e->fillers > 0)
            e->fillers--;
        f->ep = NULL;
        f->failed = false;
        u->nfillers--;
        u->nfailed--;
    }
}

int kvx_ucx_align(kvx_transport_t *t, const void *waddr, uint32_t sn)
{
    kvx_ucx_t *u = t->ucx;
    bool ok;
    uint64_t uid = kvx_ucx_uid(waddr, &ok);
    struct kvx_ucx_sn *e = ok ? kvx_ucx_sn_find(u, uid, false) : NULL;
    uint32_t have = e != NULL ? e->next_sn : 0, want;
    const size_t cap = sizeof(u->fillers) / sizeof(u->fillers[0]);

    /* UCX's numbers are 16-bit and pair nothing past 65535: nothing to catch up then */
    if (!ok || have >= sn || sn >= 0xffff)
        return 0;
    want = sn - have;
    /* the budget: per HELLO, per remote worker (open at once) and per transport (open at once;
     * those whose peer failed give their place back) */
    if (want > KVX_ALIGN_MAX || want > cap - u->nfillers ||
        (e != NULL ? e->fillers : 0) + want > KVX_FILLERS_PER_WORKER) {
        kvx_info(t, "ucx: a writer %u endpoint(s) ahead: over the catch-up budget, refused", want);
        return -ENOBUFS;
    }
    if (e == NULL && (e = kvx_ucx_sn_find(u, uid, true)) == NULL)
        return -ENOMEM;
    kvx_debug(t, "ucx: %u endpoint(s) behind the writer's: catching up", want);
    for (size_t i = 0; i < cap && e->next_sn < sn; i++) {
        struct kvx_ucx_filler *f = &u->fillers[i];
        ucp_ep_params_t ep_params = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER,
            .address = (const ucp_address_t *)waddr,
            .err_mode = UCP_ERR_HANDLING_MODE_PEER,
            .err_handler = {.cb = kvx_ucx_filler_err_cb, .arg = f},
        };
        if (f->ep != NULL)
            continue;
        if (ucp_ep_create(u->worker, &ep_params, &f->ep) != UCS_OK) {
            f->ep = NULL;
            break;
        }
        f->u = u;
        f->uid = uid;
        f->failed = false;
        e->next_sn++;
        e->fillers++;
        u->nfillers++;
    }
    return 0;
}

/* The catch-up endpoints go with the worker (forced: nothing was ever sent on them). UCX's
 * progress is driven for at most a second for them (with the lock held: the transport closes). */
static void kvx_ucx_close_fillers(kvx_ucx_t *u)
{
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    uint64_t until = kvx_now_ns() + 1000000000ull;

    kvx_ucx_reap_fillers(u);
    for (size_t i = 0; i < sizeof(u->fillers) / sizeof(u->fillers[0]); i++) {
        void *req;
        if (u->fillers[i].ep == NULL)
            continue;
        req = ucp_ep_close_nbx(u->fillers[i].ep, &cp);
        u->fillers[i].ep = NULL;
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
    kvx_ucx_ep_t *e = calloc(1, sizeof(*e));
    struct kvx_ucx_sn *sn;
    ucs_status_t s;
    bool ok;
    uint64_t uid = kvx_ucx_uid(waddr, &ok);

    if (e == NULL)
        return -ENOMEM;
    e->t = t;
    e->ops = ops;
    e->owner = owner;
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_NAME,
        .address = (const ucp_address_t *)waddr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = kvx_ucx_err_cb, .arg = e},
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
        return kvx_ucx_errno(s);
    }
    *ep_p = e;
    return 0;
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

/* A size from the environment ("32k"), or dflt. */
static size_t kvx_ucx_env_size(const char *const *names, size_t dflt)
{
    for (; *names != NULL; names++) {
        const char *v = getenv(*names);
        char *end;
        unsigned long long n;
        if (v == NULL)
            continue;
        n = strtoull(v, &end, 10);
        if (*end == 'k' || *end == 'K')
            n <<= 10;
        else if (*end == 'm' || *end == 'M')
            n <<= 20;
        if (n >= 1024)
            return (size_t)n;
    }
    return dflt;
}

/*
 * Which transport carries the data. ucp_ep_print_info lists each lane as
 *   "lane[0]:  3:sysv/memory.0 md[2] -> md[2]/sysv/sysdev[255] am am_bw#0 keepalive"  (1.13)
 *   "lane[0]:  3:sysv/memory.0 md[2] -> md[2]/sysv/sysdev[255] seg 4294967295 am keepalive"
 * (1.19, whose protocols v2 tag only the am lane). kvx's messages travel on the am_bw lanes, or
 * the am lane when none is tagged am_bw. The size of one message on that lane: a shared-memory
 * FIFO element (MM_SEG_SIZE, kvx's 32k unless set otherwise) or a tcp segment (TCP_TX_SEG_SIZE,
 * kvx's 60k); a message larger than that is split by UCX and reassembled by copying.
 */
void kvx_ucx_ep_describe(kvx_ucx_ep_t *e, char *transport, size_t len, int *rma_hw, size_t *seg)
{
    static const char *const mm[] = {"UCX_SYSV_SEG_SIZE", "UCX_POSIX_SEG_SIZE", "UCX_MM_SEG_SIZE",
                                     NULL};
    static const char *const tcp[] = {"UCX_TCP_TX_SEG_SIZE", "UCX_TX_SEG_SIZE", NULL};
    char *text = NULL, *line, *save = NULL;
    size_t size = 0;
    char am_bw[KVX_TRANSPORT_NAME_MAX] = "", am[KVX_TRANSPORT_NAME_MAX] = "";
    FILE *f = open_memstream(&text, &size);

    *rma_hw = 0;
    *seg = 8192;
    transport[0] = '\0';
    if (f == NULL)
        return;
    ucp_ep_print_info(e->ep, f);
    fclose(f);
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char tl[32];
        const char *p = strstr(line, "lane[");
        size_t ll = strlen(line);

        if (p == NULL || (p = strchr(p, ':')) == NULL)
            continue;
        /* "  3:sysv/memory.0" -> "sysv" */
        while (*++p == ' ')
            ;
        while (*p >= '0' && *p <= '9')
            p++;
        if (*p != ':' || sscanf(p + 1, "%31[^/ ]", tl) != 1)
            continue;
        if (strstr(line, " am_bw") != NULL)
            kvx_ucx_list_add(am_bw, sizeof(am_bw), tl);
        if (strstr(line, " am ") != NULL || (ll > 3 && strcmp(line + ll - 3, " am") == 0))
            kvx_ucx_list_add(am, sizeof(am), tl);
    }
    free(text);
    snprintf(transport, len, "%s", am_bw[0] != '\0' ? am_bw : am);
    if (strncmp(transport, "sysv", 4) == 0 || strncmp(transport, "posix", 5) == 0)
        *seg = kvx_ucx_env_size(mm, 32768);
    else if (strncmp(transport, "tcp", 3) == 0)
        *seg = kvx_ucx_env_size(tcp, 61440);
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
    void *req;

    if (e == NULL || e->ep == NULL)
        return 0;
    req = ucp_ep_close_nbx(e->ep, &p);
    e->ep = NULL;
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

/* ---- pairing by address: UCX's connection manager ------------------------------------------ */

static void kvx_ucx_conn_cb(ucp_conn_request_h req, void *arg)
{
    kvx_transport_t *t = arg;
    t->ucx->ops->on_conn_request(t, req);
}

int kvx_ucx_listen(kvx_transport_t *t, const struct sockaddr *sa, socklen_t len,
                   struct sockaddr_storage *bound)
{
    kvx_ucx_t *u = t->ucx;
    ucp_listener_params_t p = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = sa, .addrlen = len},
        .conn_handler = {.cb = kvx_ucx_conn_cb, .arg = t},
    };
    ucp_listener_attr_t a = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    ucs_status_t s;

    if (u->listener != NULL)
        return -EALREADY;
    s = ucp_listener_create(u->worker, &p, &u->listener);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_listener_create: %s", ucs_status_string(s));
        u->listener = NULL;
        return s == UCS_ERR_BUSY ? -EADDRINUSE : kvx_ucx_errno(s);
    }
    s = ucp_listener_query(u->listener, &a);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_listener_query: %s", ucs_status_string(s));
        ucp_listener_destroy(u->listener);
        u->listener = NULL;
        return kvx_ucx_errno(s);
    }
    memcpy(bound, &a.sockaddr, sizeof(*bound));
    return 0;
}

void kvx_ucx_unlisten(kvx_transport_t *t)
{
    kvx_ucx_t *u = t->ucx;

    if (u != NULL && u->listener != NULL) {
        ucp_listener_destroy(u->listener);
        u->listener = NULL;
    }
}

void kvx_ucx_reject(kvx_transport_t *t, void *conn_req)
{
    ucs_status_t s = ucp_listener_reject(t->ucx->listener, conn_req);
    if (s != UCS_OK)
        kvx_warn(t, "ucx: ucp_listener_reject: %s", ucs_status_string(s));
}

/* An endpoint of UCX's connection manager: from a connection request (conn_req) the listener
 * got, or to a listener's address (sa). */
int kvx_ucx_pair_open(kvx_transport_t *t, void *conn_req, const struct sockaddr *sa, socklen_t len,
                      const kvx_ep_ops_t *ops, void *owner, kvx_ucx_ep_t **ep_p)
{
    kvx_ucx_ep_t *e = calloc(1, sizeof(*e));
    ucs_status_t s;

    if (e == NULL)
        return -ENOMEM;
    e->t = t;
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
    s = ucp_ep_create(t->ucx->worker, &ep_params, &e->ep);
    if (s != UCS_OK) {
        kvx_error(t, "ucx: ucp_ep_create (%s): %s", ep_params.name, ucs_status_string(s));
        free(e);
        return kvx_ucx_errno(s);
    }
    e->pair_next = t->ucx->pair_eps;
    t->ucx->pair_eps = e;
    *ep_p = e;
    return 0;
}

/* A pairing message: header, and the metadata as payload (data_len 0: none). */
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
    e->ops->on_sent(e->owner, xfer_id, kvx_ucx_errno(status));
}

int kvx_ucx_send(kvx_send_t *s, size_t hdr_len, size_t iovcnt, unsigned *refs)
{
    kvx_ucx_ep_t *e = s->ep;
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE,
        .flags = UCP_AM_SEND_FLAG_EAGER | (e->pair ? UCP_AM_SEND_FLAG_REPLY : 0),
        .cb.send = kvx_ucx_send_cb,
        .user_data = s,
        .datatype = iovcnt > 0 ? ucp_dt_make_iov() : ucp_dt_make_contig(1),
    };
    void *req;

    if (e->ep == NULL) {
        kvx_ucx_send_put(s);
        return -ENOTCONN;
    }
    req = ucp_am_send_nbx(e->ep, KVX_AM_ID, s->hdr, hdr_len, iovcnt > 0 ? (void *)s->iov : NULL,
                          iovcnt, &p);
    if (req == NULL) {
        kvx_ucx_send_put(s);
        return 0;
    }
    if (UCS_PTR_IS_ERR(req)) {
        kvx_ucx_send_put(s);
        return kvx_ucx_errno(UCS_PTR_STATUS(req));
    }
    (*refs)++;
    return 1;
}

int kvx_ucx_send_ctl(kvx_ucx_ep_t *e, const void *hdr, size_t hdr_len, unsigned *refs)
{
    kvx_send_t *s;

    if (hdr_len > KVX_SEND_HDR_MAX)
        return -EINVAL;
    s = kvx_ucx_send_get(e);
    if (s == NULL)
        return -ENOMEM;
    memcpy(s->hdr, hdr, hdr_len);
    return kvx_ucx_send(s, hdr_len, 0, refs);
}

unsigned kvx_ucx_progress(kvx_transport_t *t)
{
    unsigned n = ucp_worker_progress(t->ucx->worker);

    if (t->ucx->nfailed > 0)
        kvx_ucx_reap_fillers(t->ucx);
    return n;
}

/* Returns 0 when armed (the event fd will wake a poller), -EBUSY when events are pending. */
int kvx_ucx_arm(kvx_transport_t *t) { return kvx_ucx_errno(ucp_worker_arm(t->ucx->worker)); }

int kvx_ucx_event_fd(kvx_transport_t *t) { return t->ucx->efd; }
