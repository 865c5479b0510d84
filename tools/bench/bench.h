/*
 * kvx-bench, shared between its files: options, the control channel's messages, the server, the
 * initiator (client) and its load mode. main.c parses options and forks for --loopback.
 */
#ifndef KVX_BENCH_H
#define KVX_BENCH_H

#include "common.h"
#include "kvx.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MAX_SIZES 16
#define MAX_PEERS 16
#define MAX_INITIATORS 64
#define SERVER_SALT 0x5eull
#define CLIENT_SALT 0xc0ull

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
    double load_1m;      /* the host's 1-minute load average when kvx-bench started */
    int cores;           /* online CPUs */
};
extern struct opts o;

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#define CHECK_KVX(expr)                                                                            \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ < 0)                                                                               \
            die("%s: %s", #expr, kvx_strerror(rc_));                                               \
    } while (0)

static inline uint64_t now_ns(void) { return kvx_tool_now_ns(); }
void *region_alloc(uint64_t bytes);
const char *fmt_size(uint64_t v, char *buf, size_t len);

/* ---- how results read (client.c) ------------------------------------------------------------ */

/* Fewer latency samples than this make no p99: the tables show the slowest one instead, marked
 * "max" (with 5 samples, "p99" is the maximum anyway; with 99 it is the second slowest). */
#define P99_MIN_SAMPLES 100

/* A latency given in us, as ms with 3 significant digits: 201867.5 -> "202", 8.5 -> "0.0085". */
const char *fmt_ms(double us, char *buf, size_t len);
/* The p99 cell of a table: the p99 in ms, or with fewer than P99_MIN_SAMPLES samples the
 * maximum followed by " max"; "-" with no sample. */
const char *fmt_p99(double p99_us, double max_us, uint64_t samples, char *buf, size_t len);
/* The host is busy, by bench/compare's rule: its 1-minute load average when kvx-bench started
 * is over half its cores. busy_warning prints the warning line, if so, to out. */
bool host_busy(void);
void busy_warning(FILE *out);

/* ---- control channel (ctl.c): framed messages over TCP ------------------------------------- */

/* Every message is a header {type, len} and len bytes. The server answers each request with a
 * message of the same type, or with MSG_ERROR (a text) and closes that client. */
enum { MSG_REGION = 1, MSG_VERIFY, MSG_REFILL, MSG_BARRIER, MSG_BYE, MSG_ERROR, MSG_CPU };

typedef struct msg_hdr {
    uint32_t type;
    uint32_t len;
} msg_hdr_t;

/* MSG_REGION and MSG_REFILL carry {block_len, num_blocks}; MSG_REGION is answered with the port
 * (u32) that region's transport listens on, at the server's address. MSG_BARRIER {id, n};
 * MSG_CPU nothing, answered with the server process's CPU time in ns (u64). */
typedef struct verify_req {
    uint64_t block_len, num_blocks, salt, round;
    uint32_t n;
    uint32_t pad;
    /* followed by n pairs {dst, src} */
} verify_req_t;

/* The largest message either side accepts: a VERIFY of 2^20 blocks (8 MiB). */
#define MSG_MAX (sizeof(verify_req_t) + 8u * (1u << 20))

bool io_all(int fd, void *buf, size_t len, bool wr);
void msg_send(int fd, uint32_t type, const void *buf, uint32_t len);
/* The client's receive: a malloc'd payload; dies on a closed channel, on MSG_ERROR and on a
 * message over MSG_MAX. */
uint8_t *msg_recv(int fd, msg_hdr_t *h);
int listen_on(const char *addr, int port, int *port_out);
int connect_to(const char *spec);

/* ---- server (server.c) --------------------------------------------------------------------- */

/* Serve until every client has said BYE (once == true) or forever. */
int server_run(int lfd, bool once);

/* ---- client (client.c, load.c) ------------------------------------------------------------- */

typedef struct result {
    const char *op;
    uint64_t size, blocks;
    double gbps, xfers_per_s, p50_us, p99_us, max_us, submit_ns_per_block;
    uint64_t lat_n; /* latency samples behind p50/p99 (an aggregate: the fewest of its rows') */
    double seen_p50_us, seen_p99_us; /* submit to the poll that returned it (one in flight) */
    double init_cpu_s_per_gb, target_cpu_s_per_gb; /* both processes, warm-up included */
    double create_ms, peer_add_ms;
    size_t md_bytes;
    char transport[KVX_TRANSPORT_NAME_MAX];
    uint64_t bad;
    uint64_t bytes;
    uint64_t xfers;            /* transfers completed (load mode) */
    uint64_t start_ns, end_ns; /* CLOCK_MONOTONIC: comparable between processes of one host */
    int initiator;             /* -1: the aggregate of several initiators */
} result_t;

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

void client_open(client_t *c, int *ctl, uint64_t size);
void client_close(client_t *c);
void progress_line(const char *what, int done, int total);
void run_size(int *ctl, uint64_t size, result_t *res_out, int *nres);
void run_load(int *ctl, uint64_t size, result_t *res_out, int *nres);
void print_results(const result_t *res, int n);
int collect_initiators(FILE **outs, int m, result_t *res, int cap);
int client_run(void);
/* --hol (hol.c): prints its own result; 1 when a byte was wrong */
int run_hol(int *ctl);

#endif
