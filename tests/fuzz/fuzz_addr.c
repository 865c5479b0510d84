/*
 * libFuzzer harness for the "host:port" parser of pairing by address (src/peer/addr.c): the split
 * into host and port (brackets for IPv6, the port's digits and range, port 0 only where any port
 * is allowed), and, for numeric hosts (no name lookups while fuzzing), the resolution and the
 * numeric form kvx remembers for a peer, which must parse back to the same address. Input: one
 * byte of options (bit 0: any port allowed), then the address text.
 */
#include "kvx_int.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text, buf[KVX_ADDR_MAX], *host, *port, numeric[KVX_ADDR_MAX];
    bool any_port;
    struct sockaddr_storage ss, again;
    socklen_t len, len2;
    uint8_t bin[16];

    if (size < 1)
        return 0;
    any_port = data[0] & 1;
    /* exactly the text and its terminator: ASan sees any read past it */
    text = malloc(size);
    if (text == NULL)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    if (kvx_addr_split(text, any_port, buf, &host, &port) == 0) {
        long pn = strtol(port, NULL, 10);
        /* what it accepts: a host, and a port of 1-5 digits in range (0 only if allowed) */
        if (*host == '\0' || strlen(port) < 1 || strlen(port) > 5 || pn > 65535 ||
            (pn == 0 && !any_port) || host < buf || port < buf || port >= buf + KVX_ADDR_MAX)
            abort();
        if (strchr(host, ':') != NULL && text[0] != '[')
            abort(); /* an IPv6 address without brackets */
        if (inet_pton(AF_INET, host, bin) == 1 || inet_pton(AF_INET6, host, bin) == 1) {
            if (kvx_addr_parse(text, any_port, &ss, &len) != 0)
                abort(); /* a numeric host always resolves */
            if (len > sizeof(ss) || (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
                abort();
            kvx_addr_format(&ss, numeric, sizeof(numeric));
            if (kvx_addr_parse(numeric, any_port, &again, &len2) != 0 || len2 != len ||
                memcmp(&again, &ss, len) != 0)
                abort(); /* what kvx remembers for a peer is the same address */
        }
    }
    free(text);
    return 0;
}
