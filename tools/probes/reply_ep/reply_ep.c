/*
 * What UCX's reply endpoint (UCP_AM_SEND_FLAG_REPLY -> ucp_am_recv_param_t.reply_ep) is, tested
 * with raw UCX between two processes: a receiver R (the parent) and a writer W (a forked child,
 * its own UCX context and worker, made after the fork). No kvx code is used.
 *
 *   W opens NEP endpoints ep[0..5] to R's worker address (err_mode PEER, an error handler) and
 *   sends two AMs with REPLY on each. R records the reply endpoint of every message, then:
 *   1. are they distinct per writer endpoint, the same for both messages of one?
 *   2. adopt: R's own ucp_ep_create towards W, three times: which endpoints come back?
 *   3. ucp_ep_modify_nb(reply[3], err handler): the only public way to give an endpoint UCX made
 *      an error handler without ucp_ep_create
 *   4. R sends on every reply endpoint: which of W's endpoints does each reach?
 *   5. a rendezvous receive (ucp_am_recv_data_nbx) in flight on reply[4], never adopted, its
 *      writer paused: does a forced close of reply[4] end it, do the others still work?
 *   5b. reply[5] gets an error handler by ucp_ep_modify_nb, then W force-closes ep[5] (W stays
 *      up, as a writer that removes its peer): does the handler run, what does UCX do with it?
 *   5c. W opens a new endpoint and sends on it: the address of its reply endpoint on R?
 *   6. W is killed (SIGKILL): which error handlers run, and what does UCX do with reply[3]
 *   (in 5b and 6 UCX's log at debug level is captured, and its lines about endpoint failures
 *   printed)
 *
 * Build (Debian's UCX 1.13.1), from this folder:
 *   gcc -std=gnu11 -O1 -g -Wall -o reply_ep-1.13 reply_ep.c $(pkg-config --cflags --libs ucx)
 * Build (UCX 1.19.1 under ~/.cache/kvx):
 *   U=~/.cache/kvx/ucx-1.19.1; gcc -std=gnu11 -O1 -g -Wall -o reply_ep-1.19 reply_ep.c \
 *     $(PKG_CONFIG_PATH=$U/lib/pkgconfig pkg-config --cflags --libs ucx) -Wl,-rpath,$U/lib
 * Run: UCX_TLS=sysv ./reply_ep-1.13 ; UCX_TLS=tcp ./reply_ep-1.13 (and -1.19); run.sh builds
 * and runs all four, by hand (no part of the test command).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>

#define NEP 6
#define AM_ID 7
#define RNDV_LEN (4u << 20)

struct hdr {
    char tag[8];
    uint32_t seq;
};

static ucp_context_h ctx;
static ucp_worker_h worker;
static int ctl = -1;
static char who = '?';

static void say(const char *fmt, ...)
{
    va_list ap;
    printf("%c: ", who);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- control channel (a socketpair made before the fork) ---------------------------------- */

static void ctl_send(char c, const void *data, uint32_t len)
{
    if (write(ctl, &c, 1) != 1 || write(ctl, &len, 4) != 4 ||
        (len && write(ctl, data, len) != (ssize_t)len)) {
        perror("ctl write");
        exit(2);
    }
}

static int ctl_recv(char *c, void **data, uint32_t *len, int timeout_ms)
{
    struct pollfd p = {.fd = ctl, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return 0;
    if (read(ctl, c, 1) != 1 || read(ctl, len, 4) != 4)
        return -1;
    *data = NULL;
    if (*len) {
        size_t got = 0;
        *data = malloc(*len);
        while (got < *len) {
            ssize_t r = read(ctl, (char *)*data + got, *len - got);
            if (r <= 0)
                return -1;
            got += r;
        }
    }
    return 1;
}

/* wait for control message c, progressing UCX meanwhile unless progress is 0 */
static void *ctl_wait(char want, uint32_t *len, int progress)
{
    for (;;) {
        char c;
        void *d;
        uint32_t l;
        int r;
        if (progress)
            while (ucp_worker_progress(worker))
                ;
        r = ctl_recv(&c, &d, &l, progress ? 1 : -1);
        if (r < 0) {
            say("control channel closed");
            exit(2);
        }
        if (r == 0)
            continue;
        if (c != want) {
            say("unexpected control message %c (wanted %c)", c, want);
            exit(2);
        }
        if (len)
            *len = l;
        return d;
    }
}

/* ---- UCX --------------------------------------------------------------------------------------
 */

static void ucx_init(void)
{
    ucp_config_t *cfg;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
        exit(2);
    /* as kvx does: peer failure handling over shared memory, a short keepalive */
    (void)ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y");
    (void)ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "200ms");
    (void)ucp_config_modify(cfg, "KEEPALIVE_NUM_EPS", "inf");
    if (ucp_init(&p, cfg, &ctx) != UCS_OK || ucp_worker_create(ctx, &wp, &worker) != UCS_OK) {
        say("ucp_init/worker_create failed");
        exit(2);
    }
    ucp_config_release(cfg);
}

static int nfired;
static char fired[16][64];

static void err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    snprintf(fired[nfired < 16 ? nfired++ : 15], 64, "%s (%p): %s", (const char *)arg, (void *)ep,
             ucs_status_string(status));
}

static ucp_ep_h ep_create(const ucp_address_t *addr, const char *name)
{
    ucp_ep_h ep;
    ucp_ep_params_t p = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = err_cb, .arg = (void *)name},
    };
    ucs_status_t s = ucp_ep_create(worker, &p, &ep);
    if (s != UCS_OK) {
        say("ucp_ep_create: %s", ucs_status_string(s));
        exit(2);
    }
    return ep;
}

static void send_cb(void *req, ucs_status_t status, void *arg)
{
    *(ucs_status_t *)arg = status;
    ucp_request_free(req);
}

/* send an AM; *st is UCS_INPROGRESS until it completes */
static void am_send(ucp_ep_h ep, const char *tag, uint32_t seq, const void *buf, size_t len,
                    unsigned flags, ucs_status_t *st)
{
    static struct hdr hdrs[64];
    static int nh;
    struct hdr *h = &hdrs[nh++ % 64];
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
                             .cb.send = send_cb,
                             .user_data = st,
                             .flags = flags};
    void *r;
    memset(h, 0, sizeof(*h));
    snprintf(h->tag, sizeof(h->tag), "%s", tag);
    h->seq = seq;
    *st = UCS_INPROGRESS;
    r = ucp_am_send_nbx(ep, AM_ID, h, sizeof(*h), buf, len, &p);
    if (!UCS_PTR_IS_PTR(r))
        *st = UCS_PTR_STATUS(r);
}

static void wait_status(ucs_status_t *st, double secs)
{
    double end = now() + secs;
    while (*st == UCS_INPROGRESS && now() < end)
        ucp_worker_progress(worker);
}

static void progress_for(double secs)
{
    double end = now() + secs;
    while (now() < end)
        ucp_worker_progress(worker);
}

/* ---- the receiver's record of what came ------------------------------------------------------ */

static ucp_ep_h reply[NEP], reply2[NEP]; /* first and second message of each writer endpoint */
static int nmsg;
static void *rndv_desc;
static ucp_ep_h rndv_reply;
static size_t rndv_len;
static ucp_ep_h w_ep[NEP]; /* the writer's endpoints (in W) */
static ucp_ep_h new_reply; /* R: the reply ep of W's endpoint opened after 5b */
static char w_seen[256];   /* what W saw: "r<i> on ep[j]" */

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    const struct hdr *h = header;
    ucp_ep_h rep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    (void)arg;
    if (header_length != sizeof(*h))
        return UCS_OK;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        rndv_desc = data;
        rndv_reply = rep;
        rndv_len = length;
        return UCS_INPROGRESS; /* keep the descriptor: received later, outside the callback */
    }
    if (who == 'R' && h->tag[0] == 'w') {
        int i = h->tag[1] - '0';
        if (i >= 0 && i < NEP)
            (h->seq == 0 ? reply : reply2)[i] = rep;
        else if (i == NEP)
            new_reply = rep;
        nmsg++;
    } else if (who == 'W') {
        int j;
        for (j = 0; j < NEP && w_ep[j] != rep; j++)
            ;
        size_t n = strlen(w_seen);
        snprintf(w_seen + n, sizeof(w_seen) - n, "%s%s->ep[%d]", n ? " " : "", h->tag,
                 j < NEP ? j : -1);
    }
    return UCS_OK;
}

static void set_handler(void)
{
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB,
        .id = AM_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = am_cb,
    };
    if (ucp_worker_set_am_recv_handler(worker, &hp) != UCS_OK)
        exit(2);
}

/* UCX's own debug lines about endpoints, captured in R for phase 6 */
static int capture;
static ucs_log_func_rc_t log_cb(const char *file, unsigned line, const char *function,
                                ucs_log_level_t level, const ucs_log_component_config_t *comp_conf,
                                const char *message, va_list ap)
{
    char buf[512];
    (void)comp_conf;
    if (level > UCS_LOG_LEVEL_WARN && !capture)
        return UCS_LOG_FUNC_RC_STOP;
    vsnprintf(buf, sizeof(buf), message, ap);
    if (level <= UCS_LOG_LEVEL_WARN || strstr(buf, "not exposed") ||
        strstr(buf, "will not be handled") || strstr(buf, "set_ep_failed") ||
        strstr(buf, "internal endpoint"))
        say("  ucx[%s:%u %s] %s", strrchr(file, '/') ? strrchr(file, '/') + 1 : file, line,
            function, buf);
    return UCS_LOG_FUNC_RC_STOP;
}

/* ---- the writer ------------------------------------------------------------------------------ */

static void writer(void)
{
    uint32_t len;
    void *raddr = ctl_wait('a', &len, 0);
    ucp_address_t *my;
    size_t mylen;
    ucs_status_t st[NEP][2], rst;
    char *buf;
    int i;

    ucx_init();
    set_handler();
    ucp_worker_get_address(worker, &my, &mylen);
    ctl_send('a', my, (uint32_t)mylen);
    static const char *names[NEP] = {"W.ep0", "W.ep1", "W.ep2", "W.ep3", "W.ep4", "W.ep5"};
    for (i = 0; i < NEP; i++)
        w_ep[i] = ep_create(raddr, names[i]);
    for (i = 0; i < NEP; i++) {
        char tag[4] = {'w', (char)('0' + i), 0};
        am_send(w_ep[i], tag, 0, NULL, 0, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                &st[i][0]);
        am_send(w_ep[i], tag, 1, NULL, 0, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                &st[i][1]);
    }
    for (i = 0; i < NEP; i++) {
        wait_status(&st[i][0], 5);
        wait_status(&st[i][1], 5);
    }
    /* phase 4: R sends on its reply endpoints; report where each came */
    free(ctl_wait('4', NULL, 1));
    progress_for(0.3);
    ctl_send('4', w_seen, (uint32_t)strlen(w_seen) + 1);
    w_seen[0] = '\0';
    /* phase 5: a rendezvous send on ep[4], then pause while R's receive is in flight */
    free(ctl_wait('5', NULL, 1));
    buf = malloc(RNDV_LEN);
    memset(buf, 0x5a, RNDV_LEN);
    am_send(w_ep[4], "w4-rndv", 2, buf, RNDV_LEN, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_RNDV,
            &rst);
    free(ctl_wait('P', NULL, 1)); /* R has the RTS: stop progressing */
    ctl_send('p', NULL, 0);
    free(ctl_wait('R', NULL, 0)); /* R closed reply[4]: go on */
    progress_for(1.0);
    {
        char out[512];
        snprintf(out, sizeof(out), "W: rendezvous send on ep[4]: %s; after the close W got: %s",
                 rst == UCS_INPROGRESS ? "still in flight" : ucs_status_string(rst),
                 w_seen[0] ? w_seen : "(nothing)");
        ctl_send('r', out, (uint32_t)strlen(out) + 1);
    }
    for (i = 0; i < nfired; i++)
        say("error handler ran: %s", fired[i]);
    /* phase 5b: close ep[5] (forced, as kvx closes), W stays alive */
    free(ctl_wait('C', NULL, 1));
    {
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *c = ucp_ep_close_nbx(w_ep[5], &cp);
        if (UCS_PTR_IS_PTR(c)) {
            double end = now() + 1;
            while (ucp_request_check_status(c) == UCS_INPROGRESS && now() < end)
                ucp_worker_progress(worker);
            ucp_request_free(c);
        }
        ctl_send('c', NULL, 0);
    }
    /* phase 5c: a new endpoint, one message on it */
    free(ctl_wait('N', NULL, 1));
    {
        ucs_status_t nst;
        char tag[4] = {'w', (char)('0' + NEP), 0};
        ucp_ep_h e = ep_create(raddr, "W.new");
        am_send(e, tag, 0, NULL, 0, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER, &nst);
        wait_status(&nst, 5);
    }
    /* phase 6: wait to be killed, progressing */
    for (;;)
        ucp_worker_progress(worker);
}

/* ---- the receiver ---------------------------------------------------------------------------- */

static void recv_cb(void *req, ucs_status_t status, size_t length, void *arg)
{
    (void)length;
    *(ucs_status_t *)arg = status;
    ucp_request_free(req);
}

static int is_reply(ucp_ep_h e)
{
    for (int i = 0; i < NEP; i++)
        if (reply[i] == e)
            return i;
    return -1;
}

int main(void)
{
    int sv[2];
    pid_t pid;
    ucp_address_t *my;
    size_t mylen;
    uint32_t wlen;
    void *waddr;
    ucp_ep_h own[3];
    ucs_status_t st[NEP], rs;
    int i, ok;
    unsigned major, minor, release;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 2;
    pid = fork();
    if (pid == 0) {
        who = 'W';
        close(sv[0]);
        ctl = sv[1];
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* die with the parent: nothing left behind */
        ucs_log_push_handler(log_cb);
        writer();
        _exit(0);
    }
    who = 'R';
    close(sv[1]);
    ctl = sv[0];
    ucs_log_push_handler(log_cb);
    ucp_get_version(&major, &minor, &release);
    say("UCX %u.%u.%u, UCX_TLS=%s", major, minor, release,
        getenv("UCX_TLS") ? getenv("UCX_TLS") : "(default)");
    ucx_init();
    set_handler();
    ucp_worker_get_address(worker, &my, &mylen);
    ctl_send('a', my, (uint32_t)mylen);
    waddr = ctl_wait('a', &wlen, 1);

    /* 1 */
    {
        double end = now() + 10;
        while (nmsg < 2 * NEP && now() < end)
            ucp_worker_progress(worker);
    }
    say("1. got %d of %d messages", nmsg, 2 * NEP);
    for (i = 0; i < NEP; i++) {
        int j, distinct = 1;
        for (j = 0; j < NEP; j++)
            distinct &= j == i || reply[j] != reply[i];
        say("   W.ep%d: reply ep %p (second message: %s), distinct from the others: %s", i,
            (void *)reply[i], reply2[i] == reply[i] ? "same" : "DIFFERENT",
            distinct ? "yes" : "NO");
    }

    /* 2 */
    static const char *own_names[3] = {"R.own0", "R.own1", "R.own2"};
    for (i = 0; i < 3; i++) {
        own[i] = ep_create(waddr, own_names[i]);
        int k = is_reply(own[i]);
        say("2. R's ucp_ep_create #%d towards W returned %p: %s", i, (void *)own[i],
            k >= 0 ? (k == i ? "the reply ep of W.ep with the same number (taken over)"
                             : "the reply ep of another W.ep")
                   : "a new endpoint");
    }

    /* 3 */
    {
        ucp_ep_params_t mp = {.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLER,
                              .err_handler = {.cb = err_cb, .arg = (void *)"reply[3] (modify_nb)"}};
        void *r = ucp_ep_modify_nb(reply[3], &mp);
        say("3. ucp_ep_modify_nb(reply[3], error handler): %s",
            UCS_PTR_IS_PTR(r) ? "a request" : ucs_status_string(UCS_PTR_STATUS(r)));
    }

    /* 4 */
    for (i = 0; i < NEP; i++) {
        char tag[4] = {'r', (char)('0' + i), 0};
        am_send(reply[i], tag, 0, NULL, 0, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER, &st[i]);
    }
    for (i = 0; i < NEP; i++)
        wait_status(&st[i], 5);
    ok = 1;
    for (i = 0; i < NEP; i++)
        ok &= st[i] == UCS_OK;
    ctl_send('4', NULL, 0);
    {
        char *seen = ctl_wait('4', NULL, 1);
        say("4. R sent on reply[0..5] (%s); W got (tag -> W's endpoint it came on): %s",
            ok ? "all completed OK" : "NOT all OK", seen);
        free(seen);
    }

    /* 5 */
    ctl_send('5', NULL, 0);
    {
        double end = now() + 10;
        while (rndv_desc == NULL && now() < end)
            ucp_worker_progress(worker);
    }
    if (rndv_desc == NULL) {
        say("5. no rendezvous RTS came");
        goto kill;
    }
    say("5. rendezvous RTS of %zu bytes on %p (reply[4]: %s, adopted: no)", rndv_len,
        (void *)rndv_reply, rndv_reply == reply[4] ? "yes" : "NO");
    ctl_send('P', NULL, 0);
    free(ctl_wait('p', NULL, 1)); /* W no longer progresses */
    {
        char *dst = malloc(rndv_len);
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                                 UCP_OP_ATTR_FIELD_USER_DATA |
                                                 UCP_OP_ATTR_FIELD_DATATYPE,
                                 .cb.recv_am = recv_cb,
                                 .user_data = &rs,
                                 .datatype = ucp_dt_make_contig(1)};
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *r, *c;
        double t0;
        rs = UCS_INPROGRESS;
        r = ucp_am_recv_data_nbx(worker, rndv_desc, dst, rndv_len, &p);
        if (!UCS_PTR_IS_PTR(r))
            rs = UCS_PTR_STATUS(r);
        progress_for(0.5);
        say("   ucp_am_recv_data_nbx, writer paused, after 0.5 s: %s",
            rs == UCS_INPROGRESS ? "in flight" : ucs_status_string(rs));
        t0 = now();
        c = ucp_ep_close_nbx(reply[4], &cp);
        say("   ucp_ep_close_nbx(reply[4], FORCE): %s",
            UCS_PTR_IS_PTR(c) ? "a request" : ucs_status_string(UCS_PTR_STATUS(c)));
        while (rs == UCS_INPROGRESS && now() < t0 + 3)
            ucp_worker_progress(worker);
        if (UCS_PTR_IS_PTR(c)) {
            while (ucp_request_check_status(c) == UCS_INPROGRESS && now() < t0 + 3)
                ucp_worker_progress(worker);
            ucp_request_free(c);
        }
        say("   the receive after the close: %s (%.0f ms)",
            rs == UCS_INPROGRESS ? "STILL in flight" : ucs_status_string(rs), (now() - t0) * 1e3);
        /* the others still work: eager sends on reply[3] (never adopted) and own[0] */
        am_send(reply[3], "a3", 0, NULL, 0, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER,
                &st[3]);
        am_send(own[0], "a0", 0, NULL, 0, UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER, &st[0]);
        ctl_send('R', NULL, 0);
        wait_status(&st[3], 3);
        wait_status(&st[0], 3);
        char *out = ctl_wait('r', NULL, 1);
        say("   sends after the close: reply[3] %s, own[0] %s", ucs_status_string(st[3]),
            ucs_status_string(st[0]));
        say("   %s", out);
        free(out);
        free(dst);
    }
    for (i = 0; i < nfired; i++)
        say("   error handler ran before the kill: %s", fired[i]);
    nfired = 0;

    /* 5b */
    {
        ucp_ep_params_t mp = {.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLER,
                              .err_handler = {.cb = err_cb, .arg = (void *)"reply[5] (modify_nb)"}};
        void *r = ucp_ep_modify_nb(reply[5], &mp);
        say("5b. ucp_ep_modify_nb(reply[5], error handler): %s; W force-closes W.ep5 (W stays "
            "up); R progresses 2 s",
            UCS_PTR_IS_PTR(r) ? "a request" : ucs_status_string(UCS_PTR_STATUS(r)));
        say("   reply[5] is %p", (void *)reply[5]);
        ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DEBUG;
        capture = 1;
        ctl_send('C', NULL, 0);
        free(ctl_wait('c', NULL, 1));
        progress_for(2.0);
        capture = 0;
        ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_WARN;
        for (i = 0; i < nfired; i++)
            say("   error handler ran: %s", fired[i]);
        if (nfired == 0)
            say("   no error handler ran");
        nfired = 0;
    }
    /* 5c */
    {
        double end = now() + 5;
        ctl_send('N', NULL, 0);
        while (new_reply == NULL && now() < end)
            ucp_worker_progress(worker);
        say("5c. W opens a new endpoint and sends on it: its reply ep is %p, %s", (void *)new_reply,
            new_reply == reply[5] ? "the ADDRESS reply[5] had (a holder of reply[5] would now "
                                    "close or send on this new endpoint)"
                                  : "not reply[5]'s address");
    }

kill:
    /* 6 */
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_DEBUG;
    capture = 1;
    say("6. SIGKILL to W; R progresses for 3 s (UCX's debug lines about endpoint failures below)");
    say("   endpoints: own[0..2] %p %p %p, reply[3] %p (error handler by ucp_ep_modify_nb)",
        (void *)own[0], (void *)own[1], (void *)own[2], (void *)reply[3]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    progress_for(3.0);
    capture = 0;
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_WARN;
    for (i = 0; i < nfired; i++)
        say("   error handler ran: %s", fired[i]);
    {
        int r3 = 0;
        for (i = 0; i < nfired; i++)
            r3 |= strstr(fired[i], "reply[3]") != NULL;
        say("   reply[3]'s handler: %s", r3 ? "ran" : "did NOT run");
    }
    /* close what R owns (own[0..2]); reply[3] is not touched: UCX may have freed it */
    {
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE};
        for (i = 0; i < 3; i++) {
            void *c = ucp_ep_close_nbx(own[i], &cp);
            if (UCS_PTR_IS_PTR(c)) {
                double end = now() + 1;
                while (ucp_request_check_status(c) == UCS_INPROGRESS && now() < end)
                    ucp_worker_progress(worker);
                ucp_request_free(c);
            }
        }
    }
    ucp_worker_release_address(worker, my);
    free(waddr);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    return 0;
}
