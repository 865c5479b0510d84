/*
 * kvx-bench's initiator: its side of a run at one block size (region, transport, pairing with
 * the servers), and the measured transfers of the default mode.
 */
#ifndef KVX_BENCH_CLIENT_H
#define KVX_BENCH_CLIENT_H

#include "opts.h"
#include "report.h"

#include <stddef.h>
#include <stdint.h>

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

/* A region of `region` bytes in blocks of `size`, filled with this initiator's pattern, its
 * transport, and a peer "target<i>" per server, paired by address with the server's region of
 * the same geometry (asked for over ctl[i]). Dies on failure. */
void client_open(client_t *c, const struct opts *o, int *ctl, uint64_t size, uint64_t region);
void client_close(client_t *c);
/* The UCX transport name kvx chose for the first peer. */
void client_transport(const client_t *c, char *out, size_t len);

/* The default mode at one block size: writes, then reads, each measured and verified; one
 * result per op appended at res_out[*nres]. */
void client_run_size(const struct opts *o, int *ctl, uint64_t size, result_t *res_out, int *nres);

#endif
