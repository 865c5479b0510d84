/*
 * Pairing by address (kvx_transport_listen, kvx_peer_connect), every transfer verified:
 *  - two processes over loopback: a target listening at 127.0.0.1:0, with a region of its own
 *    and then one kvx owns; the initiator connects by address alone, writes and reads, and the
 *    data path is shared memory (the metadata's worker address), mapped for the owned region;
 *  - refusals, each with its documented error and nothing changed on either side: block length,
 *    fingerprint, secret (missing, different, unexpected), bad addresses, nothing listening,
 *    listening twice or on a port in use;
 *  - exchanges that never finish (UCX clients that stop after wiring up): the listener closes
 *    them after 2 s and serves real peers meanwhile, and closes cleanly with some under way;
 *  - garbage at the listener (raw tcp junk, half-open connections, floods of connects): a real
 *    peer still pairs, within the connecting side's 5 s wait, and transfers during and after
 *    it ("test_pair garbage": that case alone);
 *  - with the argument "netns": across two network namespaces (tcp), by address alone.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define BL 65536
#define NB 64

static kt_region_t r;

static kvx_transport_t *mk(const char *name, uint64_t block_len, const char *fp, const char *secret)
{
    kvx_transport_t *t = NULL;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_NUM_THREADS,
                      .base = r.base,
                      .num_blocks = r.num_blocks * r.block_len / block_len,
                      .block_len = block_len,
                      .agent_name = name,
                      .num_threads = 1};
    if (fp != NULL) {
        p.field_mask |= KVX_PARAM_FINGERPRINT;
        p.fingerprint = fp;
    }
    if (secret != NULL) {
        p.field_mask |= KVX_PARAM_SECRET;
        p.secret = secret;
        p.secret_len = strlen(secret);
    }
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}

static void addr_of(kvx_transport_t *t, char *out)
{
    kvx_transport_attr_t a = {.field_mask = KVX_TRANSPORT_ATTR_LISTEN};
    KT_OK(kvx_transport_query(t, &a));
    memcpy(out, a.listen_addr, KVX_ADDR_MAX);
}

static size_t npeers(kvx_transport_t *t)
{
    kvx_transport_attr_t a = {.field_mask = KVX_TRANSPORT_ATTR_NUM_PEERS};
    KT_OK(kvx_transport_query(t, &a));
    return a.num_peers;
}

/* Write 16 scattered blocks to the target and read 16 back, every byte verified. */
static void transfers(kvx_transport_t *t, const char *peer, kt_target_t *tg, uint64_t round)
{
    uint32_t li[16], ri[16], di[16];
    kvx_completion_t c;
    uint64_t id;

    kt_indices(li, 16, 32, true, round);
    kt_indices(ri, 16, tg->args.num_blocks, true, round + 7);
    for (int i = 0; i < 16; i++) {
        kt_fill(&r, li[i], 0x61, li[i], round);
        di[i] = 32 + (uint32_t)i;
    }
    KT_OK(kvx_xfer_write(t, peer, li, ri, 16, NULL, &id));
    KT_EQ(kt_poll_n(t, peer, &c, 1, 10000), 1);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(tg, ri, li, 16, 0x61, round), 0);
    kt_target_refill(tg, round);
    KT_OK(kvx_xfer_read(t, peer, di, ri, 16, NULL, &id));
    KT_EQ(kt_poll_n(t, peer, &c, 1, 10000), 1);
    KT_EQ(c.status, 0);
    for (int i = 0; i < 16; i++)
        KT_EQ(kt_check(&r, di[i], tg->args.salt, ri[i], round), 0);
}

static void two_processes(bool owned)
{
    kt_target_args_t a = {.num_blocks = owned ? 61 : NB,
                          .block_len = BL,
                          .salt = 5,
                          .threads = 1,
                          .name = owned ? "listener-owned" : "listener",
                          .owned = owned,
                          .listen = "127.0.0.1:0"};
    kt_target_t tg = kt_target_start(&a);
    kvx_transport_t *t = mk("dialer", BL, NULL, NULL);
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT | KVX_PEER_ATTR_AGENT_NAME |
                                        KVX_PEER_ATTR_REGION | KVX_PEER_ATTR_GENERATION};
    uint64_t t0 = kt_now_ns(), base, canary;

    KT_CHECK(strncmp(tg.listen_addr, "127.0.0.1:", 10) == 0 && strcmp(tg.listen_addr + 10, "0"));
    KT_OK(kvx_peer_connect(t, "L", tg.listen_addr, NULL));
    KT_OK(kvx_peer_query(t, "L", &pa));
    kt_log("paired with %s at %s in %.2f ms, data over '%s'", pa.agent_name, tg.listen_addr,
           (double)(kt_now_ns() - t0) / 1e6, pa.transport);
    KT_CHECK(strcmp(pa.agent_name, a.name) == 0);
    KT_EQ(pa.remote_num_blocks, a.num_blocks);
    kt_target_info(&tg, &base, &canary);
    KT_EQ(pa.remote_base, base);
    KT_CHECK(pa.generation > 0);
    /* the metadata's worker address: shared memory between processes on one host */
    KT_CHECK(strncmp(pa.transport, "sysv", 4) == 0 || strncmp(pa.transport, "posix", 5) == 0 ||
             getenv("UCX_TLS") != NULL);
    if (owned && getenv("UCX_TLS") == NULL)
        KT_CHECK(strstr(pa.transport, "-mapped") != NULL);
    transfers(t, "L", &tg, 1);
    /* connecting again replaces the peer with the same generation: a re-add */
    KT_OK(kvx_peer_connect(t, "L", tg.listen_addr, NULL));
    transfers(t, "L", &tg, 2);
    KT_EQ(npeers(t), 1);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_canaries(&tg), 0);
    KT_EQ(kt_target_stop(&tg), 0);
}

/* Every refusal: its error, no peer made here, and the listener serves the next one. */
static void refusals(void)
{
    kvx_transport_t *plain = mk("plain", BL, "fp-1", NULL);
    kvx_transport_t *guarded = mk("guarded", BL, "fp-1", "the-secret");
    kvx_transport_t *small = mk("small", 4096, "fp-1", NULL);
    kvx_transport_t *other_fp = mk("other-fp", BL, "fp-2", NULL);
    kvx_transport_t *d = mk("dialer", BL, "fp-1", NULL);
    kvx_transport_t *ds = mk("dialer-s", BL, "fp-1", "the-secret");
    kvx_transport_t *dw = mk("dialer-w", BL, "fp-1", "a-wrong-secret");
    char a_plain[KVX_ADDR_MAX], a_guarded[KVX_ADDR_MAX], a_small[KVX_ADDR_MAX], a_fp[KVX_ADDR_MAX],
        taken[KVX_ADDR_MAX + 8];

    KT_OK(kvx_transport_listen(plain, "127.0.0.1:0"));
    KT_OK(kvx_transport_listen(guarded, "localhost:0"));
    KT_OK(kvx_transport_listen(small, "127.0.0.1:0"));
    KT_OK(kvx_transport_listen(other_fp, "127.0.0.1:0"));
    addr_of(plain, a_plain);
    addr_of(guarded, a_guarded);
    addr_of(small, a_small);
    addr_of(other_fp, a_fp);

    /* listening: twice, a port in use, bad addresses */
    KT_ERR(kvx_transport_listen(plain, "127.0.0.1:0"), -EALREADY);
    snprintf(taken, sizeof(taken), "%s", a_plain);
    KT_ERR(kvx_transport_listen(d, taken), -EADDRINUSE);
    KT_ERR(kvx_transport_listen(d, NULL), -EINVAL);
    KT_ERR(kvx_transport_listen(d, "127.0.0.1"), -EINVAL);
    KT_ERR(kvx_transport_listen(d, ":0"), -EINVAL);
    KT_ERR(kvx_transport_listen(d, "127.0.0.1:65536"), -EINVAL);
    KT_ERR(kvx_transport_listen(d, "127.0.0.1:12x"), -EINVAL);
    KT_ERR(kvx_transport_listen(d, "::1:0"), -EINVAL);
    KT_ERR(kvx_transport_listen(d, "no-such-host.invalid:0"), -EINVAL);
    KT_ERR(kvx_transport_listen(NULL, "127.0.0.1:0"), -EINVAL);
    {
        char none[KVX_ADDR_MAX];
        addr_of(d, none);
        KT_CHECK(none[0] == '\0'); /* none of that made it listen */
    }

    /* connecting: bad arguments, nothing listening */
    KT_ERR(kvx_peer_connect(d, "x", "127.0.0.1:0", NULL), -EINVAL);
    KT_ERR(kvx_peer_connect(d, "x", "127.0.0.1", NULL), -EINVAL);
    KT_ERR(kvx_peer_connect(d, "x", NULL, NULL), -EINVAL);
    KT_ERR(kvx_peer_connect(d, "", a_plain, NULL), -EINVAL);
    KT_ERR(kvx_peer_connect(d, NULL, a_plain, NULL), -EINVAL);
    KT_ERR(kvx_peer_connect(NULL, "x", a_plain, NULL), -EINVAL);
    {
        int rc = kvx_peer_connect(d, "x", "127.0.0.1:1", NULL); /* nothing listens on port 1 */
        kt_log("nothing listening: %s", kvx_strerror(rc));
        KT_ERR(rc, -ECONNREFUSED);
    }
    KT_EQ(npeers(d), 0);

    /* the metadata's checks, as kvx_peer_add's */
    KT_ERR(kvx_peer_connect(d, "x", a_small, NULL), -KVX_EINCOMPAT);
    KT_ERR(kvx_peer_connect(d, "x", a_fp, NULL), -KVX_EINCOMPAT);
    /* the secret: missing here, different here, or only here */
    KT_ERR(kvx_peer_connect(d, "x", a_guarded, NULL), -EACCES);
    KT_ERR(kvx_peer_connect(dw, "x", a_guarded, NULL), -EACCES);
    KT_ERR(kvx_peer_connect(ds, "x", a_plain, NULL), -EACCES);
    KT_EQ(npeers(d), 0);
    KT_EQ(npeers(dw), 0);
    KT_EQ(npeers(ds), 0);
    KT_EQ(npeers(plain) + npeers(guarded) + npeers(small) + npeers(other_fp), 0);

    /* and the right ones pair, with the listeners still serving */
    KT_OK(kvx_peer_connect(d, "plain", a_plain, NULL));
    KT_OK(kvx_peer_connect(ds, "guarded", a_guarded, NULL));
    KT_EQ(npeers(d), 1);
    KT_EQ(npeers(ds), 1);
    /* a refused connect under an existing id leaves that peer as it was */
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_AGENT_NAME | KVX_PEER_ATTR_STATE |
                                            KVX_PEER_ATTR_GENERATION};
        uint64_t gen;
        KT_OK(kvx_peer_query(d, "plain", &pa));
        gen = pa.generation;
        KT_ERR(kvx_peer_connect(d, "plain", a_small, NULL), -KVX_EINCOMPAT);
        KT_ERR(kvx_peer_connect(d, "plain", a_guarded, NULL), -EACCES);
        KT_ERR(kvx_peer_connect(d, "plain", "127.0.0.1:1", NULL), -ECONNREFUSED);
        KT_OK(kvx_peer_query(d, "plain", &pa));
        KT_CHECK(strcmp(pa.agent_name, "plain") == 0);
        KT_EQ(pa.state, KVX_PEER_CONNECTED);
        KT_EQ(pa.generation, gen);
        KT_EQ(npeers(d), 1);
    }
    {
        kvx_peer_params_t ex = {.field_mask = KVX_PEER_PARAM_EXPECT_REGION,
                                .base_addr = (uintptr_t)r.base,
                                .num_blocks = NB + 1,
                                .block_len = BL};
        KT_ERR(kvx_peer_connect(d, "y", a_plain, &ex), -EINVAL); /* disagrees with params */
        ex.num_blocks = NB;
        KT_OK(kvx_peer_connect(d, "y", a_plain, &ex));
        KT_EQ(npeers(d), 2);
    }
    kvx_transport_destroy(d);
    kvx_transport_destroy(ds);
    kvx_transport_destroy(dw);
    kvx_transport_destroy(plain);
    kvx_transport_destroy(guarded);
    kvx_transport_destroy(small);
    kvx_transport_destroy(other_fp);
}

static int tcp_connect(const char *addr)
{
    char host[KVX_ADDR_MAX], *colon;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    KT_CHECK(fd >= 0);
    snprintf(host, sizeof(host), "%s", addr);
    colon = strrchr(host, ':');
    *colon = '\0';
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    KT_CHECK(inet_pton(AF_INET, host, &sa.sin_addr) == 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

struct burst {
    kvx_transport_t *t;
    const char *addr;
    int i, rc;
};

static void *burst_main(void *arg)
{
    struct burst *b = arg;
    char id[16];
    snprintf(id, sizeof(id), "burst-%d", b->i);
    b->rc = kvx_peer_connect(b->t, id, b->addr, NULL);
    return NULL;
}

/* Junk, half-open connections and floods at the listener; a real peer pairs through it all. */
static void garbage(void)
{
    kt_target_args_t a = {.num_blocks = NB,
                          .block_len = BL,
                          .salt = 9,
                          .threads = 1,
                          .name = "besieged",
                          .listen = "127.0.0.1:0"};
    kt_target_t tg = kt_target_start(&a);
    kvx_transport_t *t = mk("dialer", BL, NULL, NULL);
    int half[64], nhalf = 0, refused = 0, rc;
    uint8_t junk[4096];
    uint64_t t0 = kt_now_ns();

    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)(i * 131 + 7);
    /* half-open: connected, silent, kept open */
    for (int i = 0; i < 64; i++)
        if ((half[nhalf] = tcp_connect(tg.listen_addr)) >= 0)
            nhalf++;
    KT_EQ(nhalf, 64);
    /* junk: connect, send garbage of various sizes, close */
    for (int i = 0; i < 200; i++) {
        int fd = tcp_connect(tg.listen_addr);
        if (fd < 0) {
            refused++;
            continue;
        }
        if (send(fd, junk, (size_t)(1 + (i * 97) % sizeof(junk)), MSG_NOSIGNAL) < 0)
            refused++;
        close(fd);
    }
    /* a flood of bare connects and closes */
    for (int i = 0; i < 500; i++) {
        int fd = tcp_connect(tg.listen_addr);
        if (fd >= 0)
            close(fd);
        else
            refused++;
    }
    kt_log("garbage: 64 half-open, 200 junk, 500 bare connects in %.1f ms (%d refused by the "
           "kernel)",
           (double)(kt_now_ns() - t0) / 1e6, refused);
    /* a real peer, with all that still open or in flight: the flood delays it (the listener's
     * UCX accepts and drops what came first, 0.03-0.4 s here, and its wire-up is slow on a loaded
     * machine: 2.1 s seen in all), but within the connecting side's wait of 5 s (kvx.h) */
    t0 = kt_now_ns();
    rc = kvx_peer_connect(t, "L", tg.listen_addr, NULL);
    kt_log("garbage: the real peer paired in %.1f ms: %d", (double)(kt_now_ns() - t0) / 1e6, rc);
    KT_OK(rc);
    KT_CHECK(kt_now_ns() - t0 < 5000000000ull);
    transfers(t, "L", &tg, 1);
    /* a burst of kvx connects at once, from 16 threads: every one pairs */
    {
        pthread_t th[16];
        struct burst b[16];
        for (int i = 0; i < 16; i++) {
            b[i] = (struct burst){t, tg.listen_addr, i, 1};
            KT_CHECK(pthread_create(&th[i], NULL, burst_main, &b[i]) == 0);
        }
        for (int i = 0; i < 16; i++) {
            KT_CHECK(pthread_join(th[i], NULL) == 0);
            KT_EQ(b[i].rc, 0);
        }
        KT_EQ(npeers(t), 17);
    }
    for (int i = 0; i < nhalf; i++)
        close(half[i]);
    KT_OK(kvx_peer_connect(t, "L2", tg.listen_addr, NULL));
    transfers(t, "L2", &tg, 2);
    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&tg), 0); /* the target is alive and quits cleanly */
}

/* Across two "hosts" (network namespaces, tcp): host b pairs with host a by its address alone. */
static kt_netns_t ns;
static kt_target_t ns_tg;

static int host_b(void)
{
    kvx_transport_t *t;
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};

    r = kt_region_alloc(NB, BL);
    t = mk("host-b", BL, NULL, NULL);
    KT_OK(kvx_peer_connect(t, "a", ns_tg.listen_addr, NULL));
    KT_OK(kvx_peer_query(t, "a", &pa));
    kt_log("host b paired with host a at %s, data over '%s'", ns_tg.listen_addr, pa.transport);
    KT_CHECK(strcmp(pa.transport, "tcp") == 0);
    transfers(t, "a", &ns_tg, 1);
    transfers(t, "a", &ns_tg, 2);
    kvx_transport_destroy(t);
    kt_region_free(&r);
    return 0;
}

/* A UCX client of the listener's connection manager that wires up for a moment, then stops
 * progressing: an exchange that never finishes. Its own process image ("test_pair lazy ADDR FD":
 * UCX does not survive a fork). */
static void lazy_err(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg, (void)ep, (void)status;
}

static ucs_status_t lazy_am(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                            const ucp_am_recv_param_t *param)
{
    (void)arg, (void)hdr, (void)hdr_len, (void)data, (void)len, (void)param;
    return UCS_OK; /* the listener's challenge: heard, never answered */
}

static int lazy_client(const char *addr, int sock)
{
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_ep_h ep;
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char host[KVX_ADDR_MAX], *colon;
    uint8_t go = 1;

    snprintf(host, sizeof(host), "%s", addr);
    colon = strrchr(host, ':');
    *colon = '\0';
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    KT_CHECK(inet_pton(AF_INET, host, &sa.sin_addr) == 1);
    KT_CHECK(ucp_init(&pp, NULL, &ctx) == UCS_OK);
    KT_CHECK(ucp_worker_create(ctx, &wp, &w) == UCS_OK);
    ucp_am_handler_param_t hp = {.field_mask =
                                     UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
                                 .id = 0x4b, /* kvx's (src/ucx/ucx_int.h) */
                                 .cb = lazy_am};
    KT_CHECK(ucp_worker_set_am_recv_handler(w, &hp) == UCS_OK);
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER, /* as kvx's listener wants */
        .err_handler = {.cb = lazy_err},
        .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof(sa)}};
    KT_CHECK(ucp_ep_create(w, &ep_params, &ep) == UCS_OK);
    for (int i = 0; i < 20; i++) { /* the listener accepts and sends its challenge meanwhile */
        ucp_worker_progress(w);
        usleep(1000);
    }
    kt_send(sock, &go, 1);
    pause(); /* never progresses again: killed by the test */
    return 0;
}

static int lazy_client_main(int sock, void *arg)
{
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", sock);
    fcntl(sock, F_SETFD, 0); /* kept across exec */
    execl("/proc/self/exe", "test_pair", "lazy", (const char *)arg, fd, (char *)NULL);
    return 127;
}

/* Exchanges that never finish: the listener closes them after 2 s (at its next look) and serves
 * real peers meanwhile; a transport closed while some are under way closes cleanly. */
static void lazy_clients(void)
{
    kvx_transport_t *l = mk("patient", BL, NULL, NULL), *d = mk("dialer", BL, NULL, NULL);
    kt_proc_t lazy[8];
    char at[KVX_ADDR_MAX];
    uint8_t go;

    KT_OK(kvx_transport_listen(l, "127.0.0.1:0"));
    addr_of(l, at);
    for (int i = 0; i < 8; i++) {
        lazy[i] = kt_spawn(lazy_client_main, at, 60);
        kt_recv(lazy[i].sock, &go, 1);
    }
    KT_OK(kvx_peer_connect(d, "L", at, NULL)); /* served alongside them */
    usleep(3500000);                           /* theirs expire */
    KT_OK(kvx_peer_connect(d, "L", at, NULL));
    for (int i = 0; i < 8; i++) {
        kt_kill(&lazy[i], SIGKILL);
        kt_wait(&lazy[i]);
    }
    /* and closing while exchanges are under way */
    for (int i = 0; i < 4; i++) {
        lazy[i] = kt_spawn(lazy_client_main, at, 60);
        kt_recv(lazy[i].sock, &go, 1);
    }
    kvx_transport_destroy(l);
    for (int i = 0; i < 4; i++) {
        kt_kill(&lazy[i], SIGKILL);
        kt_wait(&lazy[i]);
    }
    kvx_transport_destroy(d);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "lazy") == 0)
        return lazy_client(argv[2], atoi(argv[3]));
    if (argc > 1 && strcmp(argv[1], "netns") == 0) {
        kt_target_args_t a = {.num_blocks = NB,
                              .block_len = BL,
                              .salt = 4,
                              .threads = 1,
                              .name = "host-a",
                              .listen = "yes"};
        return kt_two_hosts(&ns, &ns_tg, &a, host_b, 60);
    }
    r = kt_region_alloc(NB, BL);
    if (argc > 1 && strcmp(argv[1], "garbage") == 0) { /* that case alone (scripts, loops) */
        garbage();
        kt_region_free(&r);
        return 0;
    }
    two_processes(false);
    two_processes(true);
    refusals();
    lazy_clients();
    garbage();
    kt_region_free(&r);
    return 0;
}
