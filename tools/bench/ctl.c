/*
 * kvx-bench's control channel: framed messages over TCP between the initiator and the server
 * (region sizes and the port its transport listens on, verification, barriers, CPU figures),
 * and the sockets under it. The metadata itself travels over kvx's own pairing (listen.c).
 */
#include "bench.h"

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

/* Listen on addr (an IPv4 address; NULL: 127.0.0.1) and port (0: any). */
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

int connect_to(const char *spec)
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
