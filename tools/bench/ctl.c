/*
 * kvx-bench's control channel: framed messages over TCP between the initiator and the server
 * (region sizes and the port its transport listens on, verification, barriers, CPU figures),
 * and the sockets under it. The metadata itself travels over kvx's own pairing (listen.c).
 */
#include "ctl.h"

#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

bool io_all(int fd, void *buf, size_t len, bool wr)
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

void msg_send(int fd, uint32_t type, const void *buf, uint32_t len)
{
    msg_hdr_t h = {type, len};
    if (!io_all(fd, &h, sizeof(h), true) || (len && !io_all(fd, (void *)buf, len, true)))
        die("control channel: send failed: %s", strerror(errno));
}

uint8_t *msg_recv(int fd, msg_hdr_t *h)
{
    uint8_t *buf;

    if (!io_all(fd, h, sizeof(*h), false))
        die("control channel closed");
    if (h->len > MSG_MAX)
        die("control channel: message of %u bytes", h->len);
    buf = malloc(h->len ? h->len : 1);
    if (buf == NULL || !io_all(fd, buf, h->len, false))
        die("control channel: short message");
    if (h->type == MSG_ERROR)
        die("server: %.*s", (int)h->len, (const char *)buf);
    return buf;
}

int listen_on(const char *addr, int port, int *port_out)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    socklen_t alen = sizeof(a);
    int one = 1, fd;

    if (inet_pton(AF_INET, addr != NULL ? addr : "127.0.0.1", &a.sin_addr) != 1)
        die("--bind: '%s' is not an IPv4 address", addr);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die("socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 64) < 0)
        die("listen on %s:%d: %s", addr != NULL ? addr : "127.0.0.1", port, strerror(errno));
    getsockname(fd, (struct sockaddr *)&a, &alen);
    *port_out = ntohs(a.sin_port);
    return fd;
}

int connect_to(const char *spec, int default_port)
{
    char host[256];
    const char *colon = strrchr(spec, ':');
    int port = default_port, fd, one = 1;
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

uint32_t ctl_region(int fd, uint64_t block_len, uint64_t num_blocks)
{
    uint64_t geo[2] = {block_len, num_blocks};
    msg_hdr_t h;
    uint8_t *reply;
    uint32_t port;

    msg_send(fd, MSG_REGION, geo, sizeof(geo));
    reply = msg_recv(fd, &h);
    if (h.len != sizeof(port))
        die("server: a REGION answer of %u bytes", h.len);
    memcpy(&port, reply, sizeof(port));
    free(reply);
    return port;
}

void ctl_refill(int fd, uint64_t block_len, uint64_t num_blocks)
{
    uint64_t geo[2] = {block_len, num_blocks};
    msg_hdr_t h;

    msg_send(fd, MSG_REFILL, geo, sizeof(geo));
    free(msg_recv(fd, &h));
}

void ctl_barrier(int fd, uint32_t id, uint32_t n)
{
    uint32_t b[2] = {id, n};
    msg_hdr_t h;

    msg_send(fd, MSG_BARRIER, b, sizeof(b));
    free(msg_recv(fd, &h));
}

uint64_t ctl_cpu_ns(int fd)
{
    msg_hdr_t h;
    uint64_t v = 0;
    uint8_t *rep;

    msg_send(fd, MSG_CPU, NULL, 0);
    rep = msg_recv(fd, &h);
    if (h.type != MSG_CPU || h.len != sizeof(v))
        die("the server does not report its CPU time");
    memcpy(&v, rep, sizeof(v));
    free(rep);
    return v;
}

uint64_t ctl_verify(int fd, const verify_req_t *q, const uint32_t *dst, const uint32_t *src)
{
    size_t len = sizeof(*q) + 8ull * q->n;
    uint8_t *buf = malloc(len), *rep;
    uint32_t *pairs = (uint32_t *)(buf + sizeof(*q));
    msg_hdr_t h;
    uint64_t bad;

    if (buf == NULL)
        die("out of memory");
    memcpy(buf, q, sizeof(*q));
    for (uint64_t k = 0; k < q->n; k++) {
        pairs[2 * k] = dst[k];
        pairs[2 * k + 1] = src[k];
    }
    msg_send(fd, MSG_VERIFY, buf, (uint32_t)len);
    rep = msg_recv(fd, &h);
    memcpy(&bad, rep, sizeof(bad));
    free(rep);
    free(buf);
    return bad;
}

void ctl_regions(int fd, uint64_t block_len, uint64_t num_blocks, uint32_t count, uint64_t bytes,
                 uint8_t *blobs, size_t *lens)
{
    regions_req_t q = {block_len, num_blocks, count, bytes};
    msg_hdr_t h;
    uint8_t *rep;
    size_t at = 0;

    msg_send(fd, MSG_REGIONS, &q, sizeof(q));
    rep = msg_recv(fd, &h);
    for (uint32_t k = 0; k < count; k++) {
        uint32_t len;
        if (at + sizeof(len) > h.len)
            die("server: a REGIONS answer of %u bytes for %u regions", h.len, count);
        memcpy(&len, rep + at, sizeof(len));
        at += sizeof(len);
        if (len > RR_BLOB_MAX || at + len > h.len)
            die("server: a REGIONS answer with a blob of %u bytes", len);
        memcpy(blobs + (size_t)k * RR_BLOB_MAX, rep + at, len);
        lens[k] = len;
        at += len;
    }
    free(rep);
}

uint64_t ctl_verify_ranges(int fd, const verify_ranges_req_t *q, const range_check_t *c, size_t n)
{
    uint64_t bad = 0;

    for (size_t done = 0; done < n;) {
        verify_ranges_req_t part = *q;
        size_t k = n - done < RANGE_CHECKS_MAX ? n - done : RANGE_CHECKS_MAX;
        size_t len = sizeof(part) + k * sizeof(*c);
        uint8_t *buf = malloc(len), *rep;
        msg_hdr_t h;
        uint64_t b = 0;

        if (buf == NULL)
            die("out of memory");
        part.n = (uint32_t)k;
        memcpy(buf, &part, sizeof(part));
        memcpy(buf + sizeof(part), c + done, k * sizeof(*c));
        msg_send(fd, MSG_VERIFY_RANGES, buf, (uint32_t)len);
        rep = msg_recv(fd, &h);
        if (h.len == sizeof(b))
            memcpy(&b, rep, sizeof(b));
        free(rep);
        free(buf);
        bad += b;
        done += k;
    }
    return bad;
}

void ctl_bye(int fd)
{
    msg_send(fd, MSG_BYE, NULL, 0);
    close(fd);
}
