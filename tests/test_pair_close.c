/*
 * A listener that goes away right after it answers, while the connecting process is descheduled:
 * when that process runs again, the listener's answer (MD) and its endpoint's failure arrive in
 * the same progress step. kvx_peer_connect must not use the endpoint the failure closed; it
 * returns a clear error (the metadata names a process that has exited), 20 rounds, with and
 * without a progress thread on the connecting side.
 *
 * Three processes per round, each its own image (UCX does not survive a fork):
 *  - the listener ("test_pair_close listen FD"): a kvx transport (for real metadata of its own)
 *    and a bare UCX listener that speaks kvx's pairing (CHALLENGE, MD_REQ, MD, src/peer/);
 *    on MD_REQ it tells the test, waits until the test has stopped the dialer, answers, and exits;
 *  - the dialer ("test_pair_close dial ADDR THREADS FD"): kvx_peer_connect, its result sent back;
 *  - the test: stops the dialer (SIGSTOP) before the answer, resumes it 350 ms after the listener
 *    exited, and checks the dialer's result and exit.
 */
#include "harness.h"
#include "kvx_int.h"
#include "rawucx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define BL 65536
#define NB 16
#define ROUNDS 20
#define AM_ID 0x4b /* kvx's (src/ucx/ucx_int.h) */

/* ---- the listener: bare UCX speaking kvx's pairing ---------------------------------------- */

static struct {
    ucp_worker_h w;
    ucp_ep_h ep;
    ucp_conn_request_h req;
    bool asked, sent;
    uint8_t cnonce[KVX_WIRE_NONCE_LEN];
} ls;

static void ls_err(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg, (void)ep, (void)status;
}

static void ls_conn(ucp_conn_request_h req, void *arg)
{
    (void)arg;
    if (ls.req == NULL && ls.ep == NULL)
        ls.req = req;
}

static ucs_status_t ls_am(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    kvx_msg_t m;
    (void)arg, (void)data, (void)param;
    if (kvx_wire_decode(hdr, hdr_len, len, &m) == 0 && m.type == KVX_MSG_MD_REQ && !ls.asked) {
        memcpy(ls.cnonce, m.u.md_req.cnonce, KVX_WIRE_NONCE_LEN);
        ls.asked = true;
    }
    return UCS_OK;
}

static void ls_sent(void *req, ucs_status_t status, void *arg)
{
    (void)status, (void)arg;
    ucp_request_free(req);
    ls.sent = true;
}

static void ls_send(const void *hdr, size_t hdr_len, const void *data, size_t len)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
                             .cb.send = ls_sent};
    void *r = ucp_am_send_nbx(ls.ep, AM_ID, hdr, hdr_len, data, len, &p);
    KT_CHECK(!UCS_PTR_IS_ERR(r));
    ls.sent = r == NULL;
    for (uint64_t end = kt_now_ns() + 5000000000ull; !ls.sent && kt_now_ns() < end;)
        ucp_worker_progress(ls.w);
    KT_CHECK(ls.sent);
}

static void ls_progress_until(bool *flag)
{
    for (uint64_t end = kt_now_ns() + 10000000000ull; !*flag && kt_now_ns() < end;) {
        ucp_worker_progress(ls.w);
        usleep(100);
    }
    KT_CHECK(*flag);
}

static int listener_main(int sock)
{
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_transport_t *t = kt_transport(&r, "short-lived", 0);
    size_t md_len;
    uint8_t *md = kt_metadata(t, &md_len), chal[KVX_WIRE_HDR_LEN + KVX_WIRE_NONCE_LEN] = {0},
            ans[KVX_WIRE_MD_LEN] = {0}, go;
    ucp_context_h ctx;
    ucp_listener_h l;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                              UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof(sa)},
                                .conn_handler = {.cb = ls_conn}};
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    ucp_am_handler_param_t hp = {.field_mask =
                                     UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
                                 .id = AM_ID,
                                 .cb = ls_am};
    char addr[KVX_ADDR_MAX];
    bool have_req = false;

    ctx = kt_rawucx_context(UCP_FEATURE_AM); /* kvx's UCX settings: peers must agree on them */
    KT_CHECK(ucp_worker_create(ctx, &wp, &ls.w) == UCS_OK);
    KT_CHECK(ucp_worker_set_am_recv_handler(ls.w, &hp) == UCS_OK);
    KT_CHECK(ucp_listener_create(ls.w, &lp, &l) == UCS_OK);
    KT_CHECK(ucp_listener_query(l, &la) == UCS_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u",
             (unsigned)ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port));
    kt_send(sock, addr, strlen(addr) + 1);
    /* the request, the challenge, and the dialer's MD_REQ */
    for (uint64_t end = kt_now_ns() + 10000000000ull; ls.req == NULL && kt_now_ns() < end;) {
        ucp_worker_progress(ls.w);
        usleep(100);
    }
    have_req = ls.req != NULL;
    KT_CHECK(have_req);
    {
        ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLER,
                              .conn_request = ls.req,
                              .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                              .err_handler = {.cb = ls_err}};
        KT_CHECK(ucp_ep_create(ls.w, &ep, &ls.ep) == UCS_OK);
    }
    kvx_wire_put_hdr(chal, KVX_MSG_CHALLENGE, 0, 0, 0);
    memset(chal + KVX_WIRE_HDR_LEN, 0x5a, KVX_WIRE_NONCE_LEN);
    ls_send(chal, sizeof(chal), NULL, 0);
    ls_progress_until(&ls.asked);
    /* the test stops the dialer; then the answer, and this process is gone */
    kt_send(sock, &go, 1);
    kt_recv(sock, &go, 1);
    kvx_wire_put_hdr(ans, KVX_MSG_MD, 0, 0, 0);
    kvx_put32(ans + 16, 0);
    kvx_put32(ans + 20, (uint32_t)md_len);
    memcpy(ans + 24, ls.cnonce, KVX_WIRE_NONCE_LEN);
    ls_send(ans, sizeof(ans), md, md_len);
    for (int i = 0; i < 20; i++) { /* on its way */
        ucp_worker_progress(ls.w);
        usleep(500);
    }
    _exit(0); /* no goodbye: the kernel closes the connections */
}

/* ---- the dialer ----------------------------------------------------------------------------- */

/* The dialer's log: did the answer come in the step that closed its endpoint? (src/peer/dial.c says
 * so at debug level.) Errors still go to stderr. */
static volatile int same_step;

static void dialer_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (strstr(msg, "closed right after its answer") != NULL)
        same_step = 1;
    if (level <= KVX_LOG_WARN)
        fprintf(stderr, "kvx: %s\n", msg);
}

static int dialer_main(const char *addr, unsigned threads, int sock)
{
    kt_region_t r;
    kvx_transport_t *t;
    int32_t out[3];
    kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_NUM_PEERS};

    kvx_log_set(dialer_log, NULL, KVX_LOG_DEBUG);
    r = kt_region_alloc(NB, BL);
    t = kt_transport(&r, "dialer", threads);
    out[0] = kvx_peer_connect(t, "L", addr, NULL);
    KT_OK(kvx_transport_query(t, &ta));
    out[1] = (int32_t)ta.num_peers;
    out[2] = same_step;
    kt_send(sock, out, sizeof(out));
    kvx_transport_destroy(t);
    kt_region_free(&r);
    return 0;
}

/* ---- the test ------------------------------------------------------------------------------- */

/* The dialer's result, peer count and whether the answer came in the step that closed the
 * endpoint (out[3]), or -1 with *st its exit status when it ended without sending them (a
 * crash). */
static int dialer_result(kt_proc_t *d, int32_t *out, int *st)
{
    uint64_t n = 0;
    if (recv(d->sock, &n, sizeof(n), MSG_WAITALL) != (ssize_t)sizeof(n) || n != 12 ||
        recv(d->sock, out, 12, MSG_WAITALL) != 12) {
        *st = kt_wait(d);
        return -1;
    }
    return 0;
}

static int exec_main(int sock, void *arg)
{
    char fd[16];
    const char *const *argv = arg;
    snprintf(fd, sizeof(fd), "%d", sock);
    fcntl(sock, F_SETFD, 0); /* kept across exec */
    if (argv[1] == NULL)
        execl("/proc/self/exe", "test_pair_close", argv[0], fd, (char *)NULL);
    else
        execl("/proc/self/exe", "test_pair_close", argv[0], argv[1], argv[2], fd, (char *)NULL);
    return 127;
}

int main(int argc, char **argv)
{
    int same_steps = 0;

    if (argc == 3 && strcmp(argv[1], "listen") == 0)
        return listener_main(atoi(argv[2]));
    if (argc == 5 && strcmp(argv[1], "dial") == 0)
        return dialer_main(argv[2], (unsigned)atoi(argv[3]), atoi(argv[4]));
    for (int round = 0; round < ROUNDS; round++) {
        const char *largs[] = {"listen", NULL};
        const char *threads = round % 2 ? "1" : "0";
        char addr[KVX_ADDR_MAX];
        const char *dargs[] = {"dial", addr, threads, NULL};
        kt_proc_t l = kt_spawn(exec_main, largs, 60), d;
        int32_t out[3], rc;
        uint8_t go = 1;
        int st;

        kt_recv(l.sock, addr, sizeof(addr));
        d = kt_spawn(exec_main, dargs, 60);
        kt_recv(l.sock, &go, 1); /* the dialer asked for the metadata */
        kt_stop(&d);
        kt_send(l.sock, &go, 1);
        KT_EQ(kt_wait(&l), 0); /* answered and gone */
        usleep(350000);
        kt_cont(&d);
        if (dialer_result(&d, out, &st) < 0 || (st = kt_wait(&d)) != 0)
            KT_FAIL("round %d (dialer with %s progress threads): the dialer ended with %d%s", round,
                    threads, st, st > 128 ? " (a signal)" : "");
        rc = out[0];
        kt_log("round %d (%s threads): kvx_peer_connect: %d (%s), %d peers%s", round, threads, rc,
               kvx_strerror(rc), out[1],
               out[2] ? "; the answer came in the step that closed the endpoint" : "");
        same_steps += out[2];
        /* the answer was whole, but its process is gone: the add says so, and makes no peer; or
         * (seen once in 55 rounds with two other tests beside it) the reset of the pairing's
         * endpoint was taken before the answer: the pairing failed, no peer either */
        if (!(rc == -EHOSTUNREACH || (rc == -ECONNRESET && !out[2])))
            KT_FAIL("round %d: kvx_peer_connect: %d (%s)", round, rc, kvx_strerror(rc));
        KT_EQ(out[1], 0);
    }
    /* the case this test is for did happen (it crashed every first round before the fix) */
    kt_log("%d of %d rounds took the answer in the step that closed the endpoint", same_steps,
           ROUNDS);
    KT_CHECK(same_steps > 0);
    return 0;
}
