/*
 * kvx-bench's options: what the command line sets, parsed once by main.c and handed to every
 * other file as a const pointer.
 */
#ifndef KVX_BENCH_OPTS_H
#define KVX_BENCH_OPTS_H

#include "util.h"

#include <stdbool.h>
#include <stdint.h>

#define MAX_SIZES 16
#define MAX_PEERS 16
#define MAX_INITIATORS 64
#define MAX_RREGIONS 64 /* --regions: regions per side */

enum { OP_WRITE = 1, OP_READ = 2 };

struct opts {
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
    bool wait_fd;   /* sleep in poll(2) on the completions' event fd instead */
    bool integrity; /* the initiator's transport checksums what it moves (CRC-32C) */
    int rndv_mode;  /* --rndv: kvx_params_t.rndv_mode and rndv_thresh, both sides */
    uint64_t rndv_thresh;
    bool owned; /* the server's regions are kvx's own (KVX_PARAM_OWN_REGION) */
    double load_s;
    const char *addrs[MAX_PEERS];
    int naddrs;
    int port;
    const char *bind;    /* the server's listening address */
    uint64_t max_region; /* the server's limit on the bytes of all its regions together */
    bool hol;            /* --hol: head-of-line latency (hol.c) */
    int hol_bulk;        /* bulk whole-region writes in flight */
    int hol_op;          /* the urgent transfers: OP_WRITE or OP_READ */
    int hol_blocks;      /* blocks per urgent transfer */
    int hol_prio;        /* 1: urgent KVX_PRIO_HIGH, bulk KVX_PRIO_LOW; 2: urgent high, bulk the
                          * default; 0: both the default */
    double hol_every_us; /* one urgent transfer submitted every ... */
    double hol_seconds;  /* per phase */
    int regions;         /* --regions N: the ranges mode over N regions per side (ranges.c) */
    uint64_t ranges_min; /* --ranges MIN-MAX: each range's length, log-uniform, seeded */
    uint64_t ranges_max; /* (MIN == MAX: block-aligned ranges of that length, as blocks) */
    uint64_t seed;       /* --seed: the ranges' layout and choice */
    int reg_cost;        /* --reg-cost N: N register/deregister pairs timed (regcost.c) */
    bench_host_t host;   /* the host's load when kvx-bench started, and its cores */
};

/* Fill o from the command line (the defaults for what it does not set). Returns -1 to run, or
 * the exit code when there is nothing to run (--help: 0 after the usage, a bad option: 2); dies
 * on a bad value. */
int opts_parse(struct opts *o, int argc, char **argv);
/* "contiguous", "scattered" or "random" */
const char *opts_pattern_name(int pattern);

#endif
