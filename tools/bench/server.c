/*
 * kvx-bench's server: owns target regions, hands their metadata to initiators, answers
 * verification requests and barriers. Anything a client sends is checked before it is used (sizes,
 * overflow, counts); a client that sends something wrong gets MSG_ERROR and is disconnected, and
 * the server keeps serving the others. Sockets are non-blocking: a client that stalls halfway
 * through a message holds up nobody.
 */
#include "server.h"

#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CLIENTS 64
#define MAX_REGIONS (MAX_SIZES * 2)
#define MAX_BLOCK_LEN (1ull << 30)

typedef struct srv_region {
    uint64_t block_len, num_blocks;
    uint8_t *base;
    kvx_transport_t *t;
    uint32_t port; /* where its transport listens for initiators (kvx_transport_listen) */
    /* the regions registered beside it for the ranges mode (MSG_REGIONS) */
    uint32_t nrr;
    uint64_t rr_bytes;
    uint8_t *rr_base[MAX_RREGIONS];
    uint32_t rr_id[MAX_RREGIONS];
} srv_region_t;

/* One connected client and the message it is in the middle of sending. */
typedef struct srv_client {
    int fd;
    msg_hdr_t h;
    size_t got;   /* bytes of header + payload received so far */
    uint8_t *buf; /* the payload, allocated once the header has been checked */
    bool barrier; /* waiting in the barrier */
} srv_client_t;

/* Everything one server_run owns. */
typedef struct server {
    const struct opts *o;
    srv_region_t regions[MAX_REGIONS];
    int nregions;
    uint64_t bytes; /* of all regions: at most --max-region */
    srv_client_t clients[MAX_CLIENTS];
    int nclients;
    /* A barrier for several initiators sharing this target: each sends {id, n}; all n are
     * answered when the n-th arrives, so that their measured phases overlap. */
    struct {
        uint32_t id, n, count;
    } barrier;
} server_t;

static srv_region_t *srv_region_find(server_t *s, uint64_t block_len, uint64_t num_blocks)
{
    for (int i = 0; i < s->nregions; i++)
        if (s->regions[i].block_len == block_len && s->regions[i].num_blocks == num_blocks)
            return &s->regions[i];
    return NULL;
}

static void srv_region_fill(const srv_region_t *r)
{
    for (uint64_t i = 0; i < r->num_blocks; i++)
        kvx_pattern_fill_target(r->base + i * r->block_len, r->block_len, SERVER_SALT, i, 0);
    for (uint32_t k = 0; k < r->nrr; k++)
        kvx_pattern_fill_target(r->rr_base[k], r->rr_bytes, SERVER_SALT, RR_SRC + k, 0);
}

/* Initiators pair with r's transport by address: at the control channel's address, any port. */
static int srv_region_listen(server_t *s, srv_region_t *r)
{
    kvx_transport_attr_t la = {.field_mask = KVX_TRANSPORT_ATTR_LISTEN};
    char at[KVX_ADDR_MAX];
    int rc;

    snprintf(at, sizeof(at), "%s:0", s->o->bind != NULL ? s->o->bind : "127.0.0.1");
    rc = kvx_transport_listen(r->t, at);
    if (rc == 0)
        rc = kvx_transport_query(r->t, &la);
    if (rc == 0)
        r->port = (uint32_t)strtoul(strrchr(la.listen_addr, ':') + 1, NULL, 10);
    return rc;
}

/* r's memory and transport, filled with the server's pattern and listening. */
static const char *srv_region_open(server_t *s, srv_region_t *r)
{
    const struct opts *o = s->o;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS | KVX_PARAM_RNDV,
                      .rndv_mode = o->rndv_mode,
                      .rndv_thresh = o->rndv_thresh};
    int rc;

    if (o->owned) { /* kvx allocates it (shared memory): same-host peers copy into it */
        p.field_mask |= KVX_PARAM_OWN_REGION;
    } else {
        r->base = mmap(NULL, r->block_len * r->num_blocks, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (r->base == MAP_FAILED)
            return "out of memory";
    }
    p.base = r->base;
    p.num_blocks = r->num_blocks;
    p.block_len = r->block_len;
    p.num_threads = (unsigned)o->target_threads;
    rc = kvx_transport_create(&p, &r->t);
    if (rc == 0 && o->owned) {
        kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_REGION};
        kvx_transport_query(r->t, &ta);
        r->base = ta.base;
    }
    if (rc == 0)
        srv_region_fill(r);
    if (rc == 0)
        rc = srv_region_listen(s, r);
    if (rc < 0) {
        kvx_transport_destroy(r->t);
        if (!o->owned)
            munmap(r->base, r->block_len * r->num_blocks);
        return kvx_strerror(rc);
    }
    return NULL;
}

/* The region of that geometry, made on first use. NULL with *why set when refused. */
static srv_region_t *srv_region_get(server_t *s, uint64_t block_len, uint64_t num_blocks,
                                    const char **why)
{
    srv_region_t *r = srv_region_find(s, block_len, num_blocks);

    if (r != NULL)
        return r;
    if (block_len == 0 || block_len > MAX_BLOCK_LEN || num_blocks == 0 || num_blocks > UINT32_MAX ||
        num_blocks > s->o->max_region / block_len) {
        *why = "region geometry out of bounds (see --max-region)";
        return NULL;
    }
    if (s->nregions == MAX_REGIONS) {
        *why = "too many regions";
        return NULL;
    }
    r = &s->regions[s->nregions];
    memset(r, 0, sizeof(*r));
    r->block_len = block_len;
    r->num_blocks = num_blocks;
    if ((*why = srv_region_open(s, r)) != NULL)
        return NULL;
    s->nregions++;
    s->bytes += block_len * num_blocks;
    return r;
}

static void srv_send(srv_client_t *c, uint32_t type, const void *buf, uint32_t len)
{
    msg_hdr_t h = {type, len};
    /* replies are small; the socket is non-blocking, so a client that does not read them until
     * its socket buffer is full is dropped */
    if (!io_all(c->fd, &h, sizeof(h), true) || (len && !io_all(c->fd, (void *)buf, len, true)))
        shutdown(c->fd, SHUT_RDWR);
}

/* The largest payload a message of each type may have. */
static uint64_t srv_max_len(uint32_t type)
{
    switch (type) {
    case MSG_REGION:
    case MSG_REFILL:
        return 2 * sizeof(uint64_t);
    case MSG_BARRIER:
        return 2 * sizeof(uint32_t);
    case MSG_REGIONS:
        return sizeof(regions_req_t);
    case MSG_VERIFY:
    case MSG_VERIFY_RANGES:
        return MSG_MAX;
    case MSG_BYE:
    case MSG_CPU:
        return 0;
    default:
        return UINT64_MAX; /* unknown */
    }
}

static const char *srv_on_verify(server_t *s, srv_client_t *c)
{
    verify_req_t q;
    const uint8_t *pairs = c->buf + sizeof(q);
    uint64_t bad = 0;
    srv_region_t *r;

    if (c->h.len < sizeof(q))
        return "VERIFY too short";
    memcpy(&q, c->buf, sizeof(q));
    if ((uint64_t)c->h.len != sizeof(q) + 8ull * q.n)
        return "VERIFY length disagrees with its count";
    r = srv_region_find(s, q.block_len, q.num_blocks);
    if (r == NULL)
        return "VERIFY of an unknown region";
    for (uint32_t i = 0; i < q.n; i++) {
        uint32_t dst, src;
        memcpy(&dst, pairs + 8ull * i, 4);
        memcpy(&src, pairs + 8ull * i + 4, 4);
        if (dst >= r->num_blocks)
            return "VERIFY of a block out of range";
        if (kvx_pattern_check_target(r->base + (uint64_t)dst * r->block_len, r->block_len, q.salt,
                                     src, q.round) != 0)
            bad++;
    }
    srv_send(c, MSG_VERIFY, &bad, sizeof(bad));
    return NULL;
}

/* MSG_REGIONS: the ranges mode's regions beside a region's transport, made on first use. */
static const char *srv_on_regions(server_t *s, srv_client_t *c)
{
    regions_req_t q;
    srv_region_t *r;
    uint8_t *rep;
    size_t at = 0;

    if (c->h.len != sizeof(q))
        return "bad REGIONS length";
    memcpy(&q, c->buf, sizeof(q));
    r = srv_region_find(s, q.block_len, q.num_blocks);
    if (r == NULL)
        return "REGIONS beside an unknown region";
    if (q.count == 0 || q.count > MAX_RREGIONS || q.bytes == 0 || q.bytes > MAX_BLOCK_LEN * 4)
        return "REGIONS count or size out of bounds";
    if (r->nrr != 0 && (r->nrr != q.count || r->rr_bytes != q.bytes))
        return "REGIONS of another count or size than before";
    if (r->nrr == 0) {
        if (q.count * q.bytes > s->o->max_region - s->bytes)
            return "REGIONS beyond --max-region";
        for (uint32_t k = 0; k < q.count; k++) {
            kvx_region_params_t rp = {0};
            uint8_t *m =
                mmap(NULL, q.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED)
                return "out of memory";
            kvx_pattern_fill_target(m, q.bytes, SERVER_SALT, RR_SRC + k, 0);
            if (kvx_region_register(r->t, m, q.bytes, &rp, &r->rr_id[k]) < 0) {
                munmap(m, q.bytes);
                return "kvx_region_register failed";
            }
            r->rr_base[r->nrr++] = m;
        }
        r->rr_bytes = q.bytes;
        s->bytes += q.count * q.bytes;
    }
    rep = malloc(q.count * (sizeof(uint32_t) + RR_BLOB_MAX));
    if (rep == NULL)
        return "out of memory";
    for (uint32_t k = 0; k < q.count; k++) {
        size_t len = RR_BLOB_MAX;
        uint32_t len32;
        if (kvx_region_blob(r->t, r->rr_id[k], rep + at + sizeof(len32), &len) < 0) {
            free(rep);
            return "kvx_region_blob failed";
        }
        len32 = (uint32_t)len;
        memcpy(rep + at, &len32, sizeof(len32));
        at += sizeof(len32) + len;
    }
    srv_send(c, MSG_REGIONS, rep, (uint32_t)at);
    free(rep);
    return NULL;
}

static const char *srv_on_verify_ranges(server_t *s, srv_client_t *c)
{
    verify_ranges_req_t q;
    const uint8_t *runs = c->buf + sizeof(q);
    uint64_t bad = 0;
    srv_region_t *r;

    if (c->h.len < sizeof(q))
        return "VERIFY_RANGES too short";
    memcpy(&q, c->buf, sizeof(q));
    if ((uint64_t)c->h.len != sizeof(q) + sizeof(range_check_t) * (uint64_t)q.n)
        return "VERIFY_RANGES length disagrees with its count";
    r = srv_region_find(s, q.block_len, q.num_blocks);
    if (r == NULL)
        return "VERIFY_RANGES of an unknown region";
    for (uint32_t i = 0; i < q.n; i++) {
        range_check_t k;
        memcpy(&k, runs + sizeof(k) * i, sizeof(k));
        if (k.region >= r->nrr || k.len > r->rr_bytes || k.off > r->rr_bytes - k.len)
            return "VERIFY_RANGES of a run out of range";
        if (kvx_pattern_check_run_target(r->rr_base[k.region] + k.off, k.len, q.salt,
                                         RR_SRC + k.src, q.round, k.src_off) != 0)
            bad++;
    }
    srv_send(c, MSG_VERIFY_RANGES, &bad, sizeof(bad));
    return NULL;
}

static const char *srv_on_barrier(server_t *s, srv_client_t *c)
{
    uint32_t b[2];

    if (c->h.len != sizeof(b))
        return "bad BARRIER length";
    memcpy(b, c->buf, sizeof(b));
    if (b[1] == 0 || b[1] > MAX_INITIATORS)
        return "BARRIER count out of range";
    if (c->barrier)
        return "BARRIER again before the last one was answered";
    if (s->barrier.count == 0) {
        s->barrier.id = b[0];
        s->barrier.n = b[1];
    } else if (s->barrier.id != b[0] || s->barrier.n != b[1]) {
        return "initiators disagree on the barrier";
    }
    c->barrier = true;
    if (++s->barrier.count == s->barrier.n) {
        for (int i = 0; i < s->nclients; i++) {
            if (!s->clients[i].barrier)
                continue;
            s->clients[i].barrier = false;
            srv_send(&s->clients[i], MSG_BARRIER, NULL, 0);
        }
        s->barrier.count = 0;
    }
    return NULL;
}

/* Handle one complete message. Returns NULL, or why the client is refused. */
static const char *srv_handle(server_t *s, srv_client_t *c)
{
    const char *why = NULL;
    uint64_t geo[2], ns;
    srv_region_t *r;

    switch (c->h.type) {
    case MSG_REGION:
        if (c->h.len != sizeof(geo))
            return "bad REGION length";
        memcpy(geo, c->buf, sizeof(geo));
        r = srv_region_get(s, geo[0], geo[1], &why);
        if (r == NULL)
            return why;
        srv_send(c, MSG_REGION, &r->port, sizeof(r->port));
        return NULL;
    case MSG_VERIFY:
        return srv_on_verify(s, c);
    case MSG_REFILL:
        if (c->h.len != sizeof(geo))
            return "bad REFILL length";
        memcpy(geo, c->buf, sizeof(geo));
        r = srv_region_find(s, geo[0], geo[1]);
        if (r == NULL)
            return "REFILL of an unknown region";
        srv_region_fill(r);
        srv_send(c, MSG_REFILL, NULL, 0);
        return NULL;
    case MSG_BARRIER:
        return srv_on_barrier(s, c);
    case MSG_REGIONS:
        return srv_on_regions(s, c);
    case MSG_VERIFY_RANGES:
        return srv_on_verify_ranges(s, c);
    case MSG_CPU:
        ns = kvx_tool_process_cpu_ns();
        if (c->h.len != 0)
            return "bad CPU length";
        srv_send(c, MSG_CPU, &ns, sizeof(ns));
        return NULL;
    default:
        return "unknown message";
    }
}

static void srv_drop(server_t *s, int i)
{
    srv_client_t *c = &s->clients[i];

    if (c->barrier)
        s->barrier.count--;
    close(c->fd);
    free(c->buf);
    s->clients[i] = s->clients[--s->nclients];
}

/* A header just arrived: check it before allocating anything. Returns NULL, or why the client
 * is refused. */
static const char *srv_header(srv_client_t *c)
{
    uint64_t max = srv_max_len(c->h.type);

    if (max == UINT64_MAX)
        return "unknown message";
    if (c->h.len > max)
        return "message too long for its type";
    if ((c->buf = malloc(c->h.len ? c->h.len : 1)) == NULL)
        return "out of memory";
    return NULL;
}

/* Read what client c has sent. Returns false when the client is gone (BYE, EOF, refused). */
static bool srv_read(server_t *s, srv_client_t *c)
{
    for (;;) {
        const char *why = NULL;
        size_t want =
            c->got < sizeof(c->h) ? sizeof(c->h) - c->got : sizeof(c->h) + c->h.len - c->got;
        uint8_t *dst =
            c->got < sizeof(c->h) ? (uint8_t *)&c->h + c->got : c->buf + (c->got - sizeof(c->h));
        ssize_t n = want == 0 ? 0 : read(c->fd, dst, want);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK;
        if (n == 0 && want > 0)
            return false; /* EOF, possibly in the middle of a message */
        c->got += (size_t)n;
        if (c->got == sizeof(c->h) && want > 0) {
            if (c->h.type == MSG_BYE && c->h.len == 0)
                return false;
            why = srv_header(c);
        }
        if (why == NULL && c->got == sizeof(c->h) + c->h.len && c->got >= sizeof(c->h)) {
            why = srv_handle(s, c);
            free(c->buf);
            c->buf = NULL;
            c->got = 0;
        }
        if (why != NULL) {
            fprintf(stderr, "kvx-bench: server: dropping a client: %s\n", why);
            srv_send(c, MSG_ERROR, why, (uint32_t)strlen(why));
            return false;
        }
    }
}

static void srv_accept(server_t *s, int lfd)
{
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), one = 1;

    if (c < 0)
        return;
    if (s->nclients == MAX_CLIENTS) {
        static const char full[] = "too many clients";
        msg_hdr_t h = {MSG_ERROR, sizeof(full) - 1};
        if (write(c, &h, sizeof(h)) == sizeof(h) && write(c, full, h.len) < 0)
            (void)0;
        close(c);
        return;
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    s->clients[s->nclients++] = (srv_client_t){.fd = c};
}

static void srv_close(server_t *s)
{
    for (int i = 0; i < s->nregions; i++) {
        srv_region_t *r = &s->regions[i];
        kvx_transport_destroy(r->t); /* an owned region goes with it, and every registration */
        if (!s->o->owned)
            munmap(r->base, r->block_len * r->num_blocks);
        for (uint32_t k = 0; k < r->nrr; k++)
            munmap(r->rr_base[k], r->rr_bytes);
    }
}

int server_run(int lfd, bool once, const struct opts *o)
{
    server_t s = {.o = o};
    struct pollfd fds[1 + MAX_CLIENTS];
    int served = 0;

    while (!(once && served > 0 && s.nclients == 0)) {
        fds[0].fd = lfd;
        fds[0].events = POLLIN;
        for (int i = 0; i < s.nclients; i++) {
            fds[1 + i].fd = s.clients[i].fd;
            fds[1 + i].events = POLLIN;
            fds[1 + i].revents = 0;
        }
        if (poll(fds, (nfds_t)(1 + s.nclients), -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll: %s", strerror(errno));
        }
        for (int i = s.nclients - 1; i >= 0; i--)
            if ((fds[1 + i].revents & (POLLIN | POLLHUP | POLLERR)) && !srv_read(&s, &s.clients[i]))
                srv_drop(&s, i);
        if (fds[0].revents & POLLIN) {
            int before = s.nclients;
            srv_accept(&s, lfd);
            served += s.nclients > before;
        }
    }
    srv_close(&s);
    close(lfd);
    return 0;
}
