/*
 * The UCX backend's configuration: the settings kvx applies to UCX's context and worker, the
 * capture of UCX's log that tells which of them applied, and what kvx reads from the environment.
 */
#include "ucx/ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucs/debug/log_def.h>

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

/* One setting kvx makes in UCX's configuration; the forms UCX versions accept for it. */
typedef struct kvx_ucx_setting {
    const char *key[2];          /* the form tried first, and the other one (or NULL) */
    const char *const *user_env; /* UCX_* variables that mean the user chose this themselves */
    char val[32];
    int form;      /* which key was applied, -1: none (the user's choice stands) */
    bool rejected; /* UCX reported the applied form unused */
    bool forced;   /* applied whatever the environment says (a UCX_* variable is warned about) */
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

static void kvx_ucx_apply(kvx_ucx_t *u, ucp_config_t *cfg, kvx_ucx_setting_t *st)
{
    char env[128];
    ucs_status_t s;

    st->form = -1;
    for (int i = 0; i < 2 && st->key[i] != NULL; i++) {
        snprintf(env, sizeof(env), "UCX_%s", st->key[i]);
        if (getenv(env) == NULL)
            continue;
        if (!st->forced)
            return;
        if (strcmp(getenv(env), st->val) != 0 && !st->rejected)
            kvx_warn(u, "ucx: %s=%s ignored: kvx keeps %s=%s", env, getenv(env), st->key[i],
                     st->val);
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
        kvx_debug(u, "ucx: cannot set %s=%s: %s", st->key[i], st->val, ucs_status_string(s));
    }
}

void kvx_ucx_stop(kvx_ucx_t *u)
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
static int kvx_ucx_start(kvx_ucx_t *u, const char *net_devices, kvx_ucx_setting_t *set, size_t nset)
{
    ucp_config_t *cfg = NULL;
    ucs_status_t s;
    int retry = 0;

    s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: ucp_config_read: %s", ucs_status_string(s));
        return -ENODEV;
    }
    for (size_t i = 0; i < nset; i++)
        kvx_ucx_apply(u, cfg, &set[i]);
    if (net_devices != NULL) { /* the application's choice: it overrides UCX_NET_DEVICES */
        s = ucp_config_modify(cfg, "NET_DEVICES", net_devices);
        if (s != UCS_OK) {
            kvx_error(u, "ucx: NET_DEVICES=%s: %s", net_devices, ucs_status_string(s));
            ucp_config_release(cfg);
            return -EINVAL;
        }
    }

    ucp_params_t params = {
        .field_mask =
            UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
        .name = u->log.name,
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
            kvx_error(u, "ucx: ucp_worker_create: %s", ucs_status_string(s));
    } else {
        kvx_error(u, "ucx: ucp_init: %s", ucs_status_string(s));
    }
    ucs_log_pop_handler();
    kvx_ucx_capturing = false;
    for (size_t i = 0; i < nset; i++) {
        kvx_ucx_setting_t *st = &set[i];
        if (st->form < 0 || !kvx_ucx_reported(st->key[st->form]))
            continue;
        if (st->form == 0 && st->key[1] != NULL && !st->rejected) {
            kvx_debug(u, "ucx: %s=%s unused by this UCX; trying %s", st->key[0], st->val,
                      st->key[1]);
            st->rejected = true;
            retry = 1;
        } else {
            kvx_warn(u, "ucx: this UCX ignored kvx's setting %s=%s", st->key[st->form], st->val);
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
 * live listener). UCX 1.19 takes TCP_CM_REUSEADDR from ucp_config_modify (kvx_ucx_create); 1.13
 * takes it only from its environment, read when the worker is created (measured with getsockopt
 * on the listening socket). So on 1.13 kvx sets UCX_TCP_CM_REUSEADDR=y once, before its first
 * worker, unless the environment says otherwise.
 */
static void kvx_ucx_reuseaddr_env(kvx_ucx_t *u)
{
    static bool done;

    pthread_mutex_lock(&kvx_ucx_capture_lock);
    if (!done && getenv("UCX_TCP_CM_REUSEADDR") == NULL) {
        if (setenv("UCX_TCP_CM_REUSEADDR", "y", 0) == 0)
            kvx_debug(u, "ucx: UCX_TCP_CM_REUSEADDR=y (this UCX reads it from the environment)");
    }
    done = true;
    pthread_mutex_unlock(&kvx_ucx_capture_lock);
}

/* kvx_ucx_init's context and worker: kvx's settings, and a second start when UCX reported the
 * first form of one unused. */
int kvx_ucx_create(kvx_ucx_t *u, const kvx_ucx_config_t *cfg)
{
    static const char *const eh[] = {"UCX_SYSV_ERROR_HANDLING", "UCX_POSIX_ERROR_HANDLING", NULL};
    static const char *const seg[] = {"UCX_SYSV_SEG_SIZE", "UCX_POSIX_SEG_SIZE", NULL};
    static const char *const fifo[] = {"UCX_SYSV_FIFO_SIZE", "UCX_POSIX_FIFO_SIZE", NULL};
    static const char *const tx[] = {"UCX_TCP_TX_SEG_SIZE", "UCX_TX_SEG_SIZE", NULL};
    static const char *const reuse[] = {"UCX_TCP_CM_REUSEADDR", NULL};
    kvx_ucx_setting_t set[10];
    size_t nset = 0;
    unsigned major, minor, release;
    int rc;

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
     * - tcp's zero-copy PUT off: kvx never puts, and with it on, a worker address offers it to
     *   any peer, whose puts UCX 1.19's tcp writes to the address the frame names, below UCP and
     *   kvx, unchecked (test_hostile, "1b"; docs/security.md). A peer writing UCX's tcp frames
     *   itself is not stopped by this: uct/tcp takes a PUT frame whatever this setting says.
     *   Forced: a UCX_TCP_PUT_ENABLE (or UCX_PUT_ENABLE, which 1.19 ignores) is warned about.
     */
    memset(set, 0, sizeof(set));
    ucp_get_version(&major, &minor, &release);
    if (major == 1 && minor <= 13)
        kvx_ucx_reuseaddr_env(u);
    if (kvx_ucx_tls_uses_shm()) {
        set[nset++] = (kvx_ucx_setting_t){{"MM_ERROR_HANDLING", NULL}, eh, "y", -1, false, false};
        set[nset++] = (kvx_ucx_setting_t){{"MM_SEG_SIZE", NULL}, seg, "32k", -1, false, false};
        set[nset++] = (kvx_ucx_setting_t){{"MM_FIFO_SIZE", NULL}, fifo, "128", -1, false, false};
    }
    if (kvx_ucx_tls_uses_tcp()) {
        bool old = major == 1 && minor <= 13;
        set[nset++] = (kvx_ucx_setting_t){
            {old ? "TX_SEG_SIZE" : "TCP_TX_SEG_SIZE", old ? "TCP_TX_SEG_SIZE" : "TX_SEG_SIZE"},
            tx,
            "60k",
            -1,
            false,
            false};
        set[nset++] = (kvx_ucx_setting_t){
            {old ? "PUT_ENABLE" : "TCP_PUT_ENABLE", old ? "TCP_PUT_ENABLE" : "PUT_ENABLE"},
            NULL,
            "n",
            -1,
            false,
            true};
    }
    /* SO_REUSEADDR for a listener (kvx_ucx_reuseaddr_env says why; on 1.13, done there) */
    if (!(major == 1 && minor <= 13))
        set[nset++] = (kvx_ucx_setting_t){{"TCP_CM_REUSEADDR", NULL}, reuse, "y", -1, false, false};
    if (cfg->keepalive_ms != 0) {
        kvx_ucx_setting_t *st = &set[nset++];
        *st = (kvx_ucx_setting_t){{"KEEPALIVE_INTERVAL", NULL}, NULL, "", -1, false, false};
        snprintf(st->val, sizeof(st->val), "%llums", (unsigned long long)cfg->keepalive_ms);
        /* UCX checks 128 endpoints per round by default: with more peers than that, a dead one
         * could go unnoticed for several intervals, and the endpoints peers left behind here
         * after removing us would be reclaimed at only 128 per interval. */
        set[nset++] =
            (kvx_ucx_setting_t){{"KEEPALIVE_NUM_EPS", NULL}, NULL, "inf", -1, false, false};
    }
    rc = kvx_ucx_start(u, cfg->net_devices, set, nset);
    if (rc == 1)
        rc = kvx_ucx_start(u, cfg->net_devices, set, nset);
    if (rc != 0)
        return rc > 0 ? -ENODEV : rc;
    for (size_t i = 0; i < nset; i++)
        if (set[i].form >= 0)
            kvx_debug(u, "ucx %u.%u.%u: %s=%s", major, minor, release, set[i].key[set[i].form],
                      set[i].val);
    return 0;
}

/* A size from the environment ("32k"), or dflt. */
size_t kvx_ucx_env_size(const char *const *names, size_t dflt)
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
