/*
 * Addresses of pairing by address: "host:port" or "[v6 address]:port" split, resolved, and
 * written back as text (numeric). Pure: fuzz_addr drives them alone.
 */
#include "peer/kvx_peer.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvx_addr_split(const char *addr, bool any_port, char buf[KVX_ADDR_MAX], char **host_p,
                   char **port_p)
{
    char *host, *port;
    size_t n;
    long pn;

    if (addr == NULL || (n = strnlen(addr, KVX_ADDR_MAX)) == 0 || n >= KVX_ADDR_MAX)
        return -EINVAL;
    memcpy(buf, addr, n + 1);
    if (buf[0] == '[') {
        char *end = strchr(buf, ']');
        if (end == NULL || end[1] != ':')
            return -EINVAL;
        *end = '\0';
        host = buf + 1;
        port = end + 2;
    } else {
        port = strrchr(buf, ':');
        if (port == NULL)
            return -EINVAL;
        *port++ = '\0';
        host = buf;
        if (strchr(host, ':') != NULL) /* an IPv6 address goes in brackets */
            return -EINVAL;
    }
    if (*host == '\0' || *port == '\0' || strlen(port) > 5 ||
        strspn(port, "0123456789") != strlen(port))
        return -EINVAL;
    pn = strtol(port, NULL, 10);
    if (pn > 65535 || (pn == 0 && !any_port))
        return -EINVAL;
    *host_p = host;
    *port_p = port;
    return 0;
}

int kvx_addr_parse(const char *addr, bool any_port, struct sockaddr_storage *ss, socklen_t *len)
{
    char buf[KVX_ADDR_MAX], *host, *port;
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = kvx_addr_split(addr, any_port, buf, &host, &port);

    if (rc < 0)
        return rc;
    if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL)
        return -EINVAL;
    if (res->ai_addrlen > sizeof(*ss)) {
        freeaddrinfo(res);
        return -EINVAL;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

void kvx_addr_format(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char host[64], port[8];
    socklen_t len =
        ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);

    if (getnameinfo((const struct sockaddr *)ss, len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(out, cap, "?");
        return;
    }
    snprintf(out, cap, ss->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}
