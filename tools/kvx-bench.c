/*
 * kvx-bench: kvx's benchmark and main job, in the habits of ucx_perftest. No address: serve
 * target regions. An address: run transfers against it. --loopback: fork the targets here.
 * Every run verifies the bytes that landed unless --no-verify.
 */
#define _GNU_SOURCE
#include "common.h"
#include "kvx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES 16
#define MAX_PEERS 16
#define SERVER_SALT 0x5eull
#define CLIENT_SALT 0xc0ull

enum { OP_WRITE = 1, OP_READ = 2 };

static struct opts {
    uint64_t sizes[MAX_SIZES];
    int nsizes;
    uint64_t region;
    uint64_t blocks;
    int pattern;
    int ops;
    int iters, warmup, inflight;
    int threads, target_threads;
    int peers;
    int client_index, clients;
    bool json, verify, loopback, same_block, quiet, wait;
    double load_s;
    const char *addrs[MAX_PEERS];
    int naddrs;
    int port;
} o = {
    .nsizes = 0,
    .region = 256ull << 20,
    .pattern = PAT_SCATTER,
    .ops = OP_WRITE | OP_READ,
    .iters = 5,
    .warmup = 1,
    .inflight = 1,
    .threads = 1,
    .target_threads = 1,
    .peers = 1,
    .clients = 1,
    .verify = true,
    .port = 13337,
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kvx-bench: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

#define CHECK_KVX(expr)                                                                            \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ < 0)                                                                               \
            die("%s: %s", #expr, kvx_strerror(rc_));                                               \
    } while (0)

static uint64_t now_ns(void) { return kvx_tool_now_ns(); }

static uint64_t parse_size(const char *s)
{
    uint64_t v = kvx_tool_parse_size(s);
    if (v == 0)
        die("bad size '%s'", s);
    return v;
}

static const char *fmt_size(uint64_t v, char *buf, size_t len)
{
    if (v >= (1ull << 30) && v % (1ull << 30) == 0)
        snprintf(buf, len, "%lluG", (unsigned long long)(v >> 30));
    else if (v >= (1ull << 20) && v % (1ull << 20) == 0)
        snprintf(buf, len, "%lluM", (unsigned long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, len, "%lluK", (unsigned long long)(v >> 10));
    else
        snprintf(buf, len, "%llu", (unsigned long long)v);
    return buf;
}

static void *region_alloc(uint64_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap %llu bytes: %s", (unsigned long long)bytes, strerror(errno));
    return p;
}

/* ---- control channel: framed messages over TCP ---------------------------------------------- */

enum { MSG_REGION = 1, MSG_VERIFY, MSG_REFILL, MSG_BARRIER, MSG_BYE };

typedef struct msg_hdr {
    uint32_t type;
    uint32_t len;
} msg_hdr_t;

static bool io_all(int fd, void *buf, size_t len, bool wr)
{
    uint8_t *b = buf;
    while (len > 0) {
        ssize_t n = wr ? write(fd, b, len) : read(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        b += n;
        len -= (size_t)n;
    }
    return true;
}

static void msg_send(int fd, uint32_t type, const void *buf, uint32_t len)
{
    msg_hdr_t h = {type, len};
    if (!io_all(fd, &h, sizeof(h), true) || (len && !io_all(fd, (void *)buf, len, true)))
        die("control channel: send failed: %s", strerror(errno));
}

/* Returns a malloc'd payload (NULL on EOF when eof_ok). */
static uint8_t *msg_recv(int fd, msg_hdr_t *h, bool eof_ok)
{
    uint8_t *buf;
    if (!io_all(fd, h, sizeof(*h), false)) {
        if (eof_ok)
            return NULL;
        die("control channel closed");
    }
    if (h->len > (256u << 20))
        die("control channel: message of %u bytes", h->len);
    buf = malloc(h->len ? h->len : 1);
    if (buf == NULL || !io_all(fd, buf, h->len, false))
        die("control channel: short message");
    return buf;
}

/* ---- server: owns target regions, answers metadata and verification requests ---------------- */

typedef struct srv_region {
    uint64_t block_len, num_blocks;
    uint8_t *base;
    kvx_transport_t *t;
    uint8_t *md;
    size_t md_len;
} srv_region_t;

static srv_region_t srv_regions[MAX_SIZES * 2];
static int srv_nregions;

/* A barrier for several initiators sharing this target: each sends {id, n}; all n are answered
 * when the n-th arrives, so that their measured phases overlap. */
static struct {
    uint32_t id, n;
    int fds[64];
    int nfds;
} srv_barrier;

static srv_region_t *srv_region_get(uint64_t block_len, uint64_t num_blocks)
{
    srv_region_t *r;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS};

    for (int i = 0; i < srv_nregions; i++)
        if (srv_regions[i].block_len == block_len && srv_regions[i].num_blocks == num_blocks)
            return &srv_regions[i];
    if (srv_nregions == (int)(sizeof(srv_regions) / sizeof(srv_regions[0])))
        die("server: too many regions");
    r = &srv_regions[srv_nregions++];
    r->block_len = block_len;
    r->num_blocks = num_blocks;
    r->base = region_alloc(block_len * num_blocks);
    for (uint64_t i = 0; i < num_blocks; i++)
        kvx_pattern_fill(r->base + i * block_len, block_len, SERVER_SALT, i, 0);
    p.base = r->base;
    p.num_blocks = num_blocks;
    p.block_len = block_len;
    p.num_threads = (unsigned)o.target_threads;
    CHECK_KVX(kvx_transport_create(&p, &r->t));
    r->md_len = 0;
    kvx_transport_metadata(r->t, NULL, &r->md_len);
    r->md = malloc(r->md_len);
    CHECK_KVX(kvx_transport_metadata(r->t, r->md, &r->md_len));
    return r;
}

typedef struct verify_req {
    uint64_t block_len, num_blocks, salt, round;
    uint32_t n;
    uint32_t pad;
    /* followed by n pairs {dst, src} */
} verify_req_t;

static void srv_handle(int fd, msg_hdr_t *h, uint8_t *buf)
{
    uint64_t geo[2], bad = 0;

    switch (h->type) {
    case MSG_REGION: {
        srv_region_t *r;
        if (h->len != sizeof(geo))
            die("server: bad REGION");
        memcpy(geo, buf, sizeof(geo));
        r = srv_region_get(geo[0], geo[1]);
        msg_send(fd, MSG_REGION, r->md, (uint32_t)r->md_len);
        break;
    }
    case MSG_VERIFY: {
        verify_req_t q;
        const uint32_t *pairs = (const uint32_t *)(buf + sizeof(q));
        srv_region_t *r;
        memcpy(&q, buf, sizeof(q));
        if (h->len != sizeof(q) + 8ull * q.n)
            die("server: bad VERIFY");
        r = srv_region_get(q.block_len, q.num_blocks);
        for (uint32_t i = 0; i < q.n; i++) {
            uint32_t dst = pairs[2 * i], src = pairs[2 * i + 1];
            if (dst >= r->num_blocks || kvx_pattern_check(r->base + dst * r->block_len,
                                                          r->block_len, q.salt, src, q.round) != 0)
                bad++;
        }
        msg_send(fd, MSG_VERIFY, &bad, sizeof(bad));
        break;
    }
    case MSG_REFILL: {
        srv_region_t *r;
        memcpy(geo, buf, sizeof(geo));
        r = srv_region_get(geo[0], geo[1]);
        for (uint64_t i = 0; i < r->num_blocks; i++)
            kvx_pattern_fill(r->base + i * r->block_len, r->block_len, SERVER_SALT, i, 0);
        msg_send(fd, MSG_REFILL, NULL, 0);
        break;
    }
    case MSG_BARRIER: {
        uint32_t b[2];
        if (h->len != sizeof(b))
            die("server: bad BARRIER");
        memcpy(b, buf, sizeof(b));
        if (srv_barrier.nfds == 0) {
            srv_barrier.id = b[0];
            srv_barrier.n = b[1];
        } else if (srv_barrier.id != b[0] || srv_barrier.n != b[1]) {
            die("server: initiators disagree on barrier %u/%u vs %u/%u", b[0], b[1], srv_barrier.id,
                srv_barrier.n);
        }
        srv_barrier.fds[srv_barrier.nfds++] = fd;
        if ((uint32_t)srv_barrier.nfds == srv_barrier.n) {
            for (int i = 0; i < srv_barrier.nfds; i++)
                msg_send(srv_barrier.fds[i], MSG_BARRIER, NULL, 0);
            srv_barrier.nfds = 0;
        }
        break;
    }
    default:
        die("server: unknown message %u", h->type);
    }
}

static int listen_on(int port, int *port_out)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t alen = sizeof(a);
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        die("socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 64) < 0)
        die("listen on port %d: %s", port, strerror(errno));
    getsockname(fd, (struct sockaddr *)&a, &alen);
    *port_out = ntohs(a.sin_port);
    return fd;
}

/* Serve until every client has said BYE (once == true) or forever. */
static int server_run(int lfd, bool once)
{
    struct pollfd fds[1 + 64];
    int nfds = 1, served = 0;

    fds[0].fd = lfd;
    fds[0].events = POLLIN;
    while (!(once && served > 0 && nfds == 1)) {
        if (poll(fds, (nfds_t)nfds, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll: %s", strerror(errno));
        }
        if ((fds[0].revents & POLLIN) && nfds < 65) {
            int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC), one = 1;
            if (c >= 0) {
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                fds[nfds].fd = c;
                fds[nfds].events = POLLIN;
                fds[nfds].revents = 0;
                nfds++;
                served++;
            }
        }
        for (int i = 1; i < nfds; i++) {
            msg_hdr_t h;
            uint8_t *buf;
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            buf = msg_recv(fds[i].fd, &h, true);
            if (buf == NULL || h.type == MSG_BYE) {
                free(buf);
                close(fds[i].fd);
                fds[i--] = fds[--nfds];
                continue;
            }
            srv_handle(fds[i].fd, &h, buf);
            free(buf);
        }
    }
    for (int i = 0; i < srv_nregions; i++) {
        kvx_transport_destroy(srv_regions[i].t);
        munmap(srv_regions[i].base, srv_regions[i].block_len * srv_regions[i].num_blocks);
        free(srv_regions[i].md);
    }
    close(lfd);
    return 0;
}

static int connect_to(const char *spec)
{
    char host[256];
    const char *colon = strrchr(spec, ':');
    int port = o.port, fd, one = 1;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    char ports[16];

    snprintf(host, sizeof(host), "%s", spec);
    if (colon != NULL) {
        host[colon - spec] = '\0';
        port = atoi(colon + 1);
    }
    snprintf(ports, sizeof(ports), "%d", port);
    if (getaddrinfo(host, ports, &hints, &ai) != 0)
        die("cannot resolve %s", host);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    for (int tries = 0; connect(fd, ai->ai_addr, ai->ai_addrlen) < 0; tries++) {
        if (tries == 100)
            die("connect to %s: %s", spec, strerror(errno));
        usleep(50000);
    }
    freeaddrinfo(ai);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* ---- client --------------------------------------------------------------------------------- */

typedef struct result {
    const char *op;
    uint64_t size, blocks;
    double gbps, xfers_per_s, p50_us, p99_us, submit_ns_per_block;
    double create_ms, peer_add_ms;
    size_t md_bytes;
    char transport[KVX_TRANSPORT_NAME_MAX];
    uint64_t bad;
    uint64_t bytes;
    uint64_t xfers;            /* transfers completed (load mode) */
    uint64_t start_ns, end_ns; /* CLOCK_MONOTONIC: comparable between processes of one host */
    int initiator;             /* -1: the aggregate of several initiators */
} result_t;

static const char *pattern_name(int p)
{
    return p == PAT_CONTIG ? "contiguous" : p == PAT_SCATTER ? "scattered" : "random";
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void progress_line(const char *what, int done, int total)
{
    static uint64_t last;
    uint64_t now = now_ns();
    if (o.quiet || !isatty(2) || (now - last < 100000000ull && done != total))
        return;
    last = now;
    fprintf(stderr, "\r  %s: %d/%d transfers%s", what, done, total,
            done == total ? "\r\033[K" : "");
}

/* One initiator's side of a run at one block size: its region, transport and peers. */
typedef struct client {
    uint64_t size, nb;
    uint8_t *base;
    kvx_transport_t *t;
    char peer[MAX_PEERS][24];
    int npeers;
    double create_ms, peer_add_ms;
    size_t md_bytes;
} client_t;

static void client_open(client_t *c, int *ctl, uint64_t size)
{
    uint64_t t0;

    memset(c, 0, sizeof(*c));
    c->size = size;
    c->nb = o.region / size;
    c->npeers = o.naddrs;
    if (c->nb == 0)
        die("region of %llu bytes holds no block of %llu", (unsigned long long)o.region,
            (unsigned long long)size);
    if (c->nb > UINT32_MAX)
        die("too many blocks");
    c->base = region_alloc(c->nb * size);
    for (uint64_t i = 0; i < c->nb; i++)
        kvx_pattern_fill(c->base + i * size, size, CLIENT_SALT + (uint64_t)o.client_index, i, 0);

    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS,
                      .base = c->base,
                      .num_blocks = c->nb,
                      .block_len = size,
                      .num_threads = (unsigned)o.threads};
    t0 = now_ns();
    CHECK_KVX(kvx_transport_create(&p, &c->t));
    c->create_ms = (double)(now_ns() - t0) / 1e6;
    kvx_transport_metadata(c->t, NULL, &c->md_bytes);
    for (int i = 0; i < c->npeers; i++) {
        uint64_t geo[2] = {size, c->nb};
        msg_hdr_t h;
        uint8_t *md;
        snprintf(c->peer[i], sizeof(c->peer[i]), "target%d", i);
        msg_send(ctl[i], MSG_REGION, geo, sizeof(geo));
        md = msg_recv(ctl[i], &h, false);
        /* peer add is short and the machine noisy: the median of 5 adds (the last one stays) */
        double add_ms[5];
        for (int k = 0; k < 5; k++) {
            if (k > 0)
                CHECK_KVX(kvx_peer_remove(c->t, c->peer[i]));
            t0 = now_ns();
            CHECK_KVX(kvx_peer_add(c->t, c->peer[i], md, h.len, NULL));
            add_ms[k] = (double)(now_ns() - t0) / 1e6;
        }
        for (int a = 0; a < 5; a++) /* insertion sort of 5 */
            for (int b = a; b > 0 && add_ms[b] < add_ms[b - 1]; b--) {
                double x = add_ms[b];
                add_ms[b] = add_ms[b - 1];
                add_ms[b - 1] = x;
            }
        c->peer_add_ms += add_ms[2];
        free(md);
    }
    c->peer_add_ms /= c->npeers;
}

static void client_close(client_t *c)
{
    kvx_transport_destroy(c->t);
    munmap(c->base, c->nb * c->size);
}

static void run_size(int *ctl, uint64_t size, result_t *res_out, int *nres)
{
    uint64_t span_l, span_r, B;
    uint64_t *scratch;
    client_t cl;

    client_open(&cl, ctl, size);
    uint64_t nb = cl.nb;
    uint8_t *base = cl.base;
    kvx_transport_t *t = cl.t;
    int npeers = cl.npeers;
    char(*peer)[24] = cl.peer;
    double create_ms = cl.create_ms, peer_add_ms = cl.peer_add_ms;
    size_t md_bytes = cl.md_bytes;

    span_l = o.same_block ? 1 : nb / (uint64_t)npeers;
    span_r = o.same_block ? 1 : nb / (uint64_t)o.clients;
    B = o.blocks ? o.blocks : (span_l < span_r ? span_l : span_r);
    if (o.same_block)
        B = 1;
    if (B > span_l || B > span_r || B == 0)
        die("%llu blocks per transfer do not fit a region slice of %llu blocks",
            (unsigned long long)B, (unsigned long long)(span_l < span_r ? span_l : span_r));

    int total = o.warmup + o.iters;
    int nmaps = o.pattern == PAT_RANDOM ? total : 1;
    uint32_t *L = malloc(sizeof(uint32_t) * B * (size_t)nmaps * (size_t)npeers);
    uint32_t *R = malloc(sizeof(uint32_t) * B * (size_t)nmaps * (size_t)npeers);
    uint64_t *lat = malloc(sizeof(uint64_t) * (size_t)total * (size_t)npeers);
    scratch = malloc(sizeof(uint64_t) * (span_l > span_r ? span_l : span_r));
    if (!L || !R || !lat || !scratch)
        die("out of memory");
    for (int m = 0; m < nmaps; m++)
        for (int i = 0; i < npeers; i++)
            kvx_index_map(L + ((size_t)m * npeers + i) * B, R + ((size_t)m * npeers + i) * B, B,
                          span_l < span_r ? span_l : span_r, (uint64_t)i * span_l,
                          (uint64_t)o.client_index * span_r, o.pattern, scratch);

    for (int op = OP_WRITE; op <= OP_READ; op <<= 1) {
        if (!(o.ops & op))
            continue;
        result_t *res = &res_out[(*nres)++];
        memset(res, 0, sizeof(*res));
        res->op = op == OP_WRITE ? "write" : "read";
        res->size = size;
        res->blocks = B;
        res->create_ms = create_ms;
        res->peer_add_ms = peer_add_ms;
        res->md_bytes = md_bytes;
        if (op == OP_READ)
            for (int i = 0; i < npeers; i++) {
                uint64_t geo[2] = {size, nb};
                msg_hdr_t h;
                msg_send(ctl[i], MSG_REFILL, geo, sizeof(geo));
                free(msg_recv(ctl[i], &h, false));
            }

        if (o.clients > 1) {
            uint32_t b[2] = {(uint32_t)(*nres), (uint32_t)o.clients};
            msg_hdr_t h;
            msg_send(ctl[0], MSG_BARRIER, b, sizeof(b));
            free(msg_recv(ctl[0], &h, false));
        }
        /* transfers k = 0 .. total*npeers-1; k goes to peer k % npeers; a window of
         * inflight*npeers transfers stays in flight */
        int ntx = total * npeers, window = o.inflight * npeers, submitted = 0, completed = 0;
        int warm_tx = o.warmup * npeers, nlat = 0;
        uint64_t start = 0, end, sub_cpu = 0, sub_blocks = 0;
        kvx_completion_t comp[64];
        while (completed < ntx) {
            while (submitted < ntx && submitted - completed < window) {
                if (submitted == warm_tx && completed < warm_tx)
                    break; /* the measured phase starts once the warm-up has drained */
                if (submitted == warm_tx)
                    start = now_ns();
                int pi = submitted % npeers, m = o.pattern == PAT_RANDOM ? submitted / npeers : 0;
                const uint32_t *l = L + ((size_t)m * npeers + pi) * B;
                const uint32_t *r = R + ((size_t)m * npeers + pi) * B;
                /* the CPU clock is a system call: sample one submission in 8 */
                bool timed = submitted >= warm_tx && ((submitted - warm_tx) & 7) == 0;
                uint64_t id, c0 = timed ? kvx_tool_thread_cpu_ns() : 0;
                int rc = op == OP_WRITE ? kvx_xfer_write(t, peer[pi], l, r, B, NULL, &id)
                                        : kvx_xfer_read(t, peer[pi], l, r, B, NULL, &id);
                if (rc < 0)
                    die("submit: %s", kvx_strerror(rc));
                if (timed) {
                    sub_cpu += kvx_tool_thread_cpu_ns() - c0;
                    sub_blocks += B;
                }
                submitted++;
            }
            int n = kvx_transport_poll(t, NULL, comp, 64);
            if (n < 0)
                die("poll: %s", kvx_strerror(n));
            if (n == 0 && o.wait)
                kvx_transport_wait(t, NULL, 100);
            for (int i = 0; i < n; i++) {
                if (comp[i].status != 0)
                    die("transfer %llu failed: %s", (unsigned long long)comp[i].id,
                        kvx_strerror(comp[i].status));
                if (completed >= warm_tx)
                    lat[nlat++] = comp[i].duration_ns;
                completed++;
            }
            progress_line(res->op, completed, ntx);
        }
        end = now_ns();

        uint64_t bytes = (uint64_t)o.iters * (uint64_t)npeers * B * size;
        double secs = (double)(end - start) / 1e9;
        qsort(lat, (size_t)nlat, sizeof(*lat), cmp_u64);
        res->bytes = bytes;
        res->start_ns = start;
        res->end_ns = end;
        res->initiator = o.client_index;
        res->gbps = (double)bytes / secs / 1e9;
        res->xfers_per_s = (double)nlat / secs;
        res->p50_us = nlat ? (double)lat[nlat / 2] / 1e3 : 0;
        res->p99_us = nlat ? (double)lat[(size_t)((nlat - 1) * 0.99)] / 1e3 : 0;
        res->submit_ns_per_block = sub_blocks ? (double)sub_cpu / (double)sub_blocks : 0;

        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};
        CHECK_KVX(kvx_peer_query(t, peer[0], &pa));
        snprintf(res->transport, sizeof(res->transport), "%s", pa.transport);

        if (o.verify) {
            int last = o.pattern == PAT_RANDOM ? total - 1 : 0;
            for (int i = 0; i < npeers; i++) {
                const uint32_t *l = L + ((size_t)last * npeers + i) * B;
                const uint32_t *r = R + ((size_t)last * npeers + i) * B;
                if (op == OP_WRITE) {
                    size_t len = sizeof(verify_req_t) + 8 * B;
                    uint8_t *buf = malloc(len);
                    verify_req_t q = {.block_len = size,
                                      .num_blocks = nb,
                                      .salt = CLIENT_SALT + (uint64_t)o.client_index,
                                      .round = 0,
                                      .n = (uint32_t)B};
                    uint32_t *pairs = (uint32_t *)(buf + sizeof(q));
                    msg_hdr_t h;
                    uint8_t *rep;
                    memcpy(buf, &q, sizeof(q));
                    for (uint64_t k = 0; k < B; k++) {
                        pairs[2 * k] = r[k];
                        pairs[2 * k + 1] = l[k];
                    }
                    msg_send(ctl[i], MSG_VERIFY, buf, (uint32_t)len);
                    rep = msg_recv(ctl[i], &h, false);
                    uint64_t bad;
                    memcpy(&bad, rep, sizeof(bad));
                    res->bad += bad;
                    free(rep);
                    free(buf);
                } else {
                    for (uint64_t k = 0; k < B; k++)
                        if (kvx_pattern_check(base + (uint64_t)l[k] * size, size, SERVER_SALT, r[k],
                                              0) != 0)
                            res->bad++;
                }
            }
        }
    }
    free(L);
    free(R);
    free(lat);
    free(scratch);
    client_close(&cl);
}

/*
 * --load: random traffic for a given time, every byte checked. Each peer gets `inflight` lanes;
 * a lane owns a slice of the peer's region (this initiator's share of it) and a scratch area
 * here, and loops: write a random number of random local blocks into random blocks of its slice,
 * read those blocks back into its scratch area, compare with what was written. Each completion
 * must name the id its lane waits for: an id that completes twice, or that nobody waits for,
 * fails the run, as does any failed transfer or any wrong byte.
 */
typedef struct lane {
    int peer;
    uint64_t id; /* 0: idle */
    int phase;   /* 0 write in flight, 1 read in flight */
    uint32_t n;
    uint32_t rbase, lscratch, span;
    uint32_t src[4096], dst[4096], scr[4096];
} lane_t;

static void run_load(int *ctl, uint64_t size, result_t *res_out, int *nres)
{
    client_t cl;
    int lanes_per_peer = o.inflight < 2 ? 8 : o.inflight, nlanes, busy = 0;
    uint64_t half, span_r, span, scratch_per_lane, end, start, rng;
    uint64_t writes = 0, reads = 0, bytes = 0, bad = 0, blocks_max;
    lane_t *lanes;
    kvx_completion_t comp[64];

    client_open(&cl, ctl, size);
    half = cl.nb / 2; /* sources below, scratch areas above */
    nlanes = lanes_per_peer * cl.npeers;
    span_r = cl.nb / (uint64_t)o.clients;
    span = span_r / (uint64_t)lanes_per_peer;
    scratch_per_lane = (cl.nb - half) / (uint64_t)nlanes;
    blocks_max = o.blocks ? o.blocks : 64;
    if (blocks_max > span)
        blocks_max = span;
    if (blocks_max > scratch_per_lane)
        blocks_max = scratch_per_lane;
    if (blocks_max > 4096)
        blocks_max = 4096;
    if (blocks_max == 0)
        die("--load: the region is too small for %d lanes x %d peers", lanes_per_peer, cl.npeers);
    lanes = calloc((size_t)nlanes, sizeof(*lanes));
    for (int i = 0; i < nlanes; i++) {
        lanes[i].peer = i % cl.npeers;
        lanes[i].rbase =
            (uint32_t)((uint64_t)o.client_index * span_r + (uint64_t)(i / cl.npeers) * span);
        lanes[i].lscratch = (uint32_t)(half + (uint64_t)i * scratch_per_lane);
        lanes[i].span = (uint32_t)span;
    }
    rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 20) ^ now_ns();
#define RND() (rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17, rng)

    start = now_ns();
    end = start + (uint64_t)(o.load_s * 1e9);
    for (;;) {
        bool stopping = now_ns() >= end;
        for (int i = 0; i < nlanes && !stopping; i++) {
            lane_t *l = &lanes[i];
            if (l->id != 0)
                continue;
            /* a new write of n random sources into n distinct random blocks of the slice */
            l->n = (uint32_t)(1 + RND() % blocks_max);
            for (uint32_t k = 0; k < l->n; k++) {
                uint32_t d;
                bool dup;
                l->src[k] = (uint32_t)(RND() % half);
                do {
                    d = l->rbase + (uint32_t)(RND() % l->span);
                    dup = false;
                    for (uint32_t j = 0; j < k && !dup; j++)
                        dup = l->dst[j] == d;
                } while (dup);
                l->dst[k] = d;
                l->scr[k] = l->lscratch + k;
            }
            CHECK_KVX(kvx_xfer_write(cl.t, cl.peer[l->peer], l->src, l->dst, l->n, NULL, &l->id));
            l->phase = 0;
            busy++;
        }
        if (stopping && busy == 0)
            break;
        int n = kvx_transport_poll(cl.t, NULL, comp, 64);
        if (n < 0)
            die("poll: %s", kvx_strerror(n));
        if (n == 0 && o.wait)
            kvx_transport_wait(cl.t, NULL, 100);
        for (int c = 0; c < n; c++) {
            lane_t *l = NULL;
            for (int i = 0; i < nlanes && l == NULL; i++)
                if (lanes[i].id == comp[c].id)
                    l = &lanes[i];
            if (l == NULL) {
                fprintf(stderr, "kvx-bench: id %llu completed but nobody waits for it\n",
                        (unsigned long long)comp[c].id);
                bad++;
                continue;
            }
            if (comp[c].status != 0) {
                fprintf(stderr, "kvx-bench: transfer %llu failed: %s\n",
                        (unsigned long long)comp[c].id, kvx_strerror(comp[c].status));
                bad++;
                l->id = 0;
                busy--;
                continue;
            }
            bytes += comp[c].bytes;
            if (l->phase == 0) {
                writes++;
                CHECK_KVX(
                    kvx_xfer_read(cl.t, cl.peer[l->peer], l->scr, l->dst, l->n, NULL, &l->id));
                l->phase = 1;
                continue;
            }
            reads++;
            for (uint32_t k = 0; k < l->n; k++)
                if (kvx_pattern_check(cl.base + (uint64_t)l->scr[k] * size, size,
                                      CLIENT_SALT + (uint64_t)o.client_index, l->src[k], 0) != 0)
                    bad++;
            l->id = 0;
            busy--;
        }
        progress_line("load", (int)((now_ns() - start) / 1000000000ull), (int)o.load_s);
    }
#undef RND
    uint64_t stop = now_ns();
    result_t *res = &res_out[(*nres)++];
    memset(res, 0, sizeof(*res));
    res->op = "load";
    res->size = size;
    res->blocks = blocks_max;
    res->bytes = bytes;
    res->gbps = (double)bytes / (double)(stop - start);
    res->xfers_per_s = (double)(writes + reads) / ((double)(stop - start) / 1e9);
    res->xfers = writes + reads;
    res->bad = bad;
    res->start_ns = start;
    res->end_ns = stop;
    res->initiator = o.client_index;
    res->create_ms = cl.create_ms;
    res->peer_add_ms = cl.peer_add_ms;
    res->md_bytes = cl.md_bytes;
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};
        CHECK_KVX(kvx_peer_query(cl.t, cl.peer[0], &pa));
        snprintf(res->transport, sizeof(res->transport), "%s", pa.transport);
    }
    free(lanes);
    client_close(&cl);
}

static void print_results(const result_t *res, int n)
{
    char sz[24], op[24];

    if (o.json) {
        for (int i = 0; i < n; i++) {
            const result_t *r = &res[i];
            printf("{\"tool\":\"kvx-bench\",\"op\":\"%s\",\"block_size\":%llu,"
                   "\"blocks_per_xfer\":%llu,\"pattern\":\"%s\",\"iters\":%d,\"inflight\":%d,"
                   "\"peers\":%d,\"initiators\":%d,\"initiator\":%d,\"threads\":%d,"
                   "\"bytes\":%llu,\"gbps\":%.4f,\"xfers_per_s\":%.1f,\"p50_us\":%.2f,"
                   "\"p99_us\":%.2f,\"submit_ns_per_block\":%.1f,\"create_ms\":%.3f,"
                   "\"metadata_bytes\":%zu,\"peer_add_ms\":%.3f,\"transport\":\"%s\","
                   "\"start_ns\":%llu,\"end_ns\":%llu,\"xfers\":%llu,\"verified\":%s,"
                   "\"bad_blocks\":%llu}\n",
                   r->op, (unsigned long long)r->size, (unsigned long long)r->blocks,
                   pattern_name(o.pattern), o.iters, o.inflight, o.naddrs, o.clients, r->initiator,
                   o.threads, (unsigned long long)r->bytes, r->gbps, r->xfers_per_s, r->p50_us,
                   r->p99_us, r->submit_ns_per_block, r->create_ms, r->md_bytes, r->peer_add_ms,
                   r->transport, (unsigned long long)r->start_ns, (unsigned long long)r->end_ns,
                   (unsigned long long)r->xfers,
                   !o.verify ? "null"
                   : r->bad  ? "false"
                             : "true",
                   (unsigned long long)r->bad);
        }
        fflush(stdout);
        return;
    }
    if (o.load_s > 0)
        printf("kvx-bench %s: load for %.0f s, random writes each read back and compared, "
               "%d peer(s), %d initiator(s), progress thread %s\n",
               kvx_version(), o.load_s, o.naddrs, o.clients, o.threads ? "on" : "off");
    else
        printf("kvx-bench %s: %s blocks, %d iteration(s) after %d warm-up, %d in flight per "
               "peer, %d peer(s), %d initiator(s), progress thread %s\n",
               kvx_version(), pattern_name(o.pattern), o.iters, o.warmup, o.inflight, o.naddrs,
               o.clients, o.threads ? "on" : "off");
    printf("%-8s %6s %8s %10s %10s %9s %9s %10s  %-10s %s\n", "op", "block", "blocks", "GB/s",
           "xfers/s", "p50 us", "p99 us", "sub ns/blk", "transport", "verified");
    for (int i = 0; i < n; i++) {
        const result_t *r = &res[i];
        if (o.clients > 1)
            snprintf(op, sizeof(op), "%s%s%.0d", r->op, r->initiator < 0 ? "*" : "#",
                     r->initiator < 0 ? 0 : r->initiator);
        else
            snprintf(op, sizeof(op), "%s", r->op);
        if (o.clients > 1 && r->initiator == 0)
            op[strlen(r->op) + 1] = '0', op[strlen(r->op) + 2] = '\0';
        printf("%-8s %6s %8llu %10.3f %10.1f %9.1f %9.1f %10.1f  %-10s %s\n", op,
               fmt_size(r->size, sz, sizeof(sz)), (unsigned long long)r->blocks, r->gbps,
               r->xfers_per_s, r->p50_us, r->p99_us, r->submit_ns_per_block, r->transport,
               !o.verify ? "off"
               : r->bad  ? "NO"
                         : "yes");
    }
    if (n > 0)
        printf("set-up: create %.2f ms, metadata %zu bytes, peer add %.2f ms (median of 5)\n",
               res[0].create_ms, res[0].md_bytes, res[0].peer_add_ms);
    if (o.clients > 1)
        printf("rows op#k: initiator k; op*: all initiators together (their bytes over the span "
               "from the first start to the last end)\n");
    for (int i = 0; i < n; i++)
        if (strcmp(res[i].op, "load") == 0 && (o.clients == 1 || res[i].initiator < 0))
            printf("load: %llu transfers (half writes, half reads of them back), %llu bytes, "
                   "%llu failed transfers or wrong blocks, each id completed once\n",
                   (unsigned long long)res[i].xfers, (unsigned long long)res[i].bytes,
                   (unsigned long long)res[i].bad);
}

/* ---- several initiators (--initiators with --loopback) -------------------------------------- */

static double json_num(const char *line, const char *key)
{
    char pat[64];
    const char *p;
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : 0;
}

static void json_str(const char *line, const char *key, char *out, size_t cap)
{
    char pat[64];
    const char *p, *e;
    snprintf(pat, sizeof(pat), "\"%s\":\"", key);
    out[0] = '\0';
    if ((p = strstr(line, pat)) == NULL || (e = strchr(p + strlen(pat), '"')) == NULL)
        return;
    p += strlen(pat);
    snprintf(out, cap, "%.*s", (int)(e - p), p);
}

/* Read the initiators' JSON lines, and add, per (op, size), their aggregate. */
static int collect_initiators(FILE **outs, int m, result_t *res, int cap)
{
    static char opname[MAX_SIZES * 4][8];
    char line[2048];
    int n = 0, base;

    for (int k = 0; k < m; k++) {
        while (fgets(line, sizeof(line), outs[k]) != NULL && n < cap) {
            result_t *r = &res[n];
            if (line[0] != '{')
                continue;
            memset(r, 0, sizeof(*r));
            json_str(line, "op", opname[n], sizeof(opname[n]));
            r->op = opname[n];
            r->size = (uint64_t)json_num(line, "block_size");
            r->blocks = (uint64_t)json_num(line, "blocks_per_xfer");
            r->gbps = json_num(line, "gbps");
            r->xfers_per_s = json_num(line, "xfers_per_s");
            r->p50_us = json_num(line, "p50_us");
            r->p99_us = json_num(line, "p99_us");
            r->submit_ns_per_block = json_num(line, "submit_ns_per_block");
            r->create_ms = json_num(line, "create_ms");
            r->md_bytes = (size_t)json_num(line, "metadata_bytes");
            r->peer_add_ms = json_num(line, "peer_add_ms");
            r->bytes = (uint64_t)json_num(line, "bytes");
            r->start_ns = (uint64_t)json_num(line, "start_ns");
            r->end_ns = (uint64_t)json_num(line, "end_ns");
            r->bad = (uint64_t)json_num(line, "bad_blocks");
            r->xfers = (uint64_t)json_num(line, "xfers");
            r->initiator = k;
            json_str(line, "transport", r->transport, sizeof(r->transport));
            n++;
        }
    }
    base = n;
    for (int i = 0; i < base && n < cap; i++) {
        result_t *a = NULL;
        for (int j = base; j < n; j++)
            if (res[j].size == res[i].size && strcmp(res[j].op, res[i].op) == 0)
                a = &res[j];
        if (a == NULL) {
            a = &res[n++];
            *a = res[i];
            a->initiator = -1;
            a->bytes = 0;
            a->xfers = 0;
            a->bad = 0;
            a->xfers_per_s = 0;
            a->start_ns = UINT64_MAX;
            a->end_ns = 0;
        }
        a->bytes += res[i].bytes;
        a->xfers += res[i].xfers;
        a->bad += res[i].bad;
        a->xfers_per_s += res[i].xfers_per_s;
        a->p99_us = res[i].p99_us > a->p99_us ? res[i].p99_us : a->p99_us;
        a->start_ns = res[i].start_ns < a->start_ns ? res[i].start_ns : a->start_ns;
        a->end_ns = res[i].end_ns > a->end_ns ? res[i].end_ns : a->end_ns;
        a->gbps = (double)a->bytes / (double)(a->end_ns - a->start_ns);
    }
    return n;
}

static int client_run(void)
{
    int ctl[MAX_PEERS];
    result_t res[MAX_SIZES * 2];
    int nres = 0, bad = 0;

    for (int i = 0; i < o.naddrs; i++)
        ctl[i] = connect_to(o.addrs[i]);
    for (int s = 0; s < o.nsizes; s++) {
        if (o.load_s > 0)
            run_load(ctl, o.sizes[s], res, &nres);
        else
            run_size(ctl, o.sizes[s], res, &nres);
    }
    for (int i = 0; i < o.naddrs; i++) {
        msg_send(ctl[i], MSG_BYE, NULL, 0);
        close(ctl[i]);
    }
    print_results(res, nres);
    for (int i = 0; i < nres; i++)
        if (res[i].bad)
            bad = 1;
    if (bad)
        fprintf(stderr, "kvx-bench: verification FAILED\n");
    return bad;
}

/* ---- main ----------------------------------------------------------------------------------- */

static void usage(void)
{
    printf("usage: kvx-bench [options]              serve target regions (port %d)\n"
           "       kvx-bench [options] host[:port]  run against a server (several: one per peer)\n"
           "       kvx-bench --loopback [options]   fork the server(s) here and run\n"
           "options:\n"
           "  -s, --sizes LIST      block sizes, e.g. 4K,64K,1M,4M (default 64K,1M)\n"
           "  -r, --region BYTES    region size on each side (default 256M)\n"
           "  -b, --blocks N        blocks per transfer (default: as many as the region holds)\n"
           "  -P, --pattern P       contiguous | scattered | random (default scattered)\n"
           "  -o, --op OP           write | read | both (default both)\n"
           "  -n, --iters N         measured transfers per peer (default 5)\n"
           "  -w, --warmup N        warm-up transfers per peer (default 1)\n"
           "  -q, --inflight N      transfers in flight per peer (default 1)\n"
           "  -t, --threads N       progress threads of the initiator (default 1)\n"
           "  -T, --target-threads N  progress threads of the target (default 1)\n"
           "  -N, --peers N         with --loopback: targets to fork (default 1)\n"
           "  -I, --initiators N    with --loopback: initiator processes sharing the target(s),\n"
           "                        each on its own slice of their regions (default 1)\n"
           "      --client-index K --clients N   without --loopback: this initiator is K of N\n"
           "      --load SECONDS    random traffic for that long instead: writes of 1..--blocks\n"
           "                        (default 64) random blocks, each read back and compared;\n"
           "                        fails on any failed transfer, wrong byte or stray id\n"
           "      --same-block      one block, the same remote block every time (ucx_perftest's\n"
           "                        cache-hot mode)\n"
           "  -p, --port N          server port (default %d; 0 = any)\n"
           "      --wait            sleep in kvx_transport_wait instead of spinning on poll\n"
           "                        (for more busy threads than cores)\n"
           "      --json            one JSON object per result line\n"
           "      --no-verify       skip checking the bytes that landed\n"
           "      --quiet           no progress display\n",
           o.port, o.port);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"sizes", 1, 0, 's'},          {"region", 1, 0, 'r'},   {"blocks", 1, 0, 'b'},
        {"pattern", 1, 0, 'P'},        {"op", 1, 0, 'o'},       {"iters", 1, 0, 'n'},
        {"warmup", 1, 0, 'w'},         {"inflight", 1, 0, 'q'}, {"threads", 1, 0, 't'},
        {"target-threads", 1, 0, 'T'}, {"peers", 1, 0, 'N'},    {"port", 1, 0, 'p'},
        {"loopback", 0, 0, 'L'},       {"json", 0, 0, 'J'},     {"no-verify", 0, 0, 'V'},
        {"same-block", 0, 0, 'S'},     {"quiet", 0, 0, 'Q'},    {"help", 0, 0, 'h'},
        {"client-index", 1, 0, 'K'},   {"clients", 1, 0, 'C'},  {"initiators", 1, 0, 'C'},
        {"wait", 0, 0, 'W'},           {"load", 1, 0, 'D'},     {0, 0, 0, 0}};
    int c;

    while ((c = getopt_long(argc, argv, "s:r:b:P:o:n:w:q:t:T:N:I:p:h", lo, NULL)) != -1) {
        switch (c) {
        case 's': {
            char *list = strdup(optarg), *save = NULL;
            for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (o.nsizes == MAX_SIZES)
                    die("too many sizes");
                o.sizes[o.nsizes++] = parse_size(tok);
            }
            free(list);
            break;
        }
        case 'r':
            o.region = parse_size(optarg);
            break;
        case 'b':
            o.blocks = strtoull(optarg, NULL, 0);
            break;
        case 'P':
            o.pattern = !strncmp(optarg, "contig", 6)    ? PAT_CONTIG
                        : !strncmp(optarg, "scatter", 7) ? PAT_SCATTER
                        : !strcmp(optarg, "random")      ? PAT_RANDOM
                                                         : (die("bad pattern '%s'", optarg), 0);
            break;
        case 'o':
            o.ops = !strcmp(optarg, "write")  ? OP_WRITE
                    : !strcmp(optarg, "read") ? OP_READ
                    : !strcmp(optarg, "both") ? OP_WRITE | OP_READ
                                              : (die("bad op '%s'", optarg), 0);
            break;
        case 'n':
            o.iters = atoi(optarg);
            break;
        case 'w':
            o.warmup = atoi(optarg);
            break;
        case 'q':
            o.inflight = atoi(optarg);
            break;
        case 't':
            o.threads = atoi(optarg);
            break;
        case 'T':
            o.target_threads = atoi(optarg);
            break;
        case 'N':
            o.peers = atoi(optarg);
            break;
        case 'p':
            o.port = atoi(optarg);
            break;
        case 'L':
            o.loopback = true;
            break;
        case 'J':
            o.json = true;
            break;
        case 'V':
            o.verify = false;
            break;
        case 'S':
            o.same_block = true;
            break;
        case 'Q':
            o.quiet = true;
            break;
        case 'W':
            o.wait = true;
            break;
        case 'D':
            o.load_s = atof(optarg);
            break;
        case 'K':
            o.client_index = atoi(optarg);
            break;
        case 'C':
        case 'I':
            o.clients = atoi(optarg);
            break;
        case 'h':
            usage();
            return 0;
        default:
            usage();
            return 2;
        }
    }
    if (o.nsizes == 0) {
        o.sizes[o.nsizes++] = 64ull << 10;
        o.sizes[o.nsizes++] = 1ull << 20;
    }
    if (o.iters < 1 || o.warmup < 0 || o.inflight < 1 || o.peers < 1 || o.peers > MAX_PEERS ||
        o.clients < 1 || o.client_index < 0 || o.client_index >= o.clients)
        die("bad iteration, warm-up, in-flight, peer or client counts");
    for (int i = optind; i < argc; i++) {
        if (o.naddrs == MAX_PEERS)
            die("too many addresses");
        o.addrs[o.naddrs++] = argv[i];
    }
    signal(SIGPIPE, SIG_IGN);

    if (o.loopback) {
        static char addr[MAX_PEERS][32];
        pid_t pids[MAX_PEERS];
        int rc, st, status = 0;

        for (int i = 0; i < o.peers; i++) {
            int port, lfd = listen_on(0, &port);
            fflush(NULL);
            pids[i] = fork();
            if (pids[i] < 0)
                die("fork: %s", strerror(errno));
            if (pids[i] == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                _exit(server_run(lfd, true));
            }
            close(lfd);
            snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", port);
            o.addrs[o.naddrs++] = addr[i];
        }
        if (o.clients > 1) {
            /* several initiators into the target(s): each a process of its own, on its slice of
             * the target region, started together by the target's barrier */
            pid_t cp[64];
            FILE *outs[64];
            result_t res[64 * MAX_SIZES * 2];
            bool json = o.json;
            int n, bad = 0;

            if (o.clients > 64)
                die("at most 64 initiators");
            for (int k = 0; k < o.clients; k++) {
                int pfd[2];
                if (pipe(pfd) < 0)
                    die("pipe: %s", strerror(errno));
                fflush(NULL);
                cp[k] = fork();
                if (cp[k] == 0) {
                    prctl(PR_SET_PDEATHSIG, SIGKILL);
                    close(pfd[0]);
                    dup2(pfd[1], 1);
                    o.client_index = k;
                    o.json = o.quiet = true;
                    _exit(client_run());
                }
                close(pfd[1]);
                outs[k] = fdopen(pfd[0], "r");
            }
            n = collect_initiators(outs, o.clients, res, (int)(sizeof(res) / sizeof(res[0])));
            rc = 0;
            for (int k = 0; k < o.clients; k++) {
                fclose(outs[k]);
                waitpid(cp[k], &st, 0);
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                    rc = 1;
            }
            o.json = json;
            print_results(res, n);
            for (int i = 0; i < n; i++)
                bad |= res[i].bad != 0;
            if (bad)
                fprintf(stderr, "kvx-bench: verification FAILED\n");
            rc |= bad;
        } else {
            rc = client_run();
        }
        for (int i = 0; i < o.peers; i++) {
            waitpid(pids[i], &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                status = 1;
        }
        return rc ? rc : status;
    }
    if (o.naddrs == 0) {
        int port, lfd = listen_on(o.port, &port);
        fprintf(stderr, "kvx-bench: serving on port %d\n", port);
        return server_run(lfd, false);
    }
    return client_run();
}
