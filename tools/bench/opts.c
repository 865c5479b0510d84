/*
 * kvx-bench's options: the defaults, the command line parsed into struct opts, the usage text.
 */
#include "opts.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const struct opts defaults = {
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
    .max_region = 4ull << 30,
    .hol_bulk = 2,
    .hol_op = OP_WRITE,
    .hol_blocks = 1,
    .hol_every_us = 1000,
    .hol_seconds = 3,
    .hol_prio = 1,
    .seed = 1,
};

static const struct option long_opts[] = {
    {"sizes", 1, 0, 's'},          {"region", 1, 0, 'r'},     {"blocks", 1, 0, 'b'},
    {"pattern", 1, 0, 'P'},        {"op", 1, 0, 'o'},         {"iters", 1, 0, 'n'},
    {"warmup", 1, 0, 'w'},         {"inflight", 1, 0, 'q'},   {"threads", 1, 0, 't'},
    {"target-threads", 1, 0, 'T'}, {"peers", 1, 0, 'N'},      {"port", 1, 0, 'p'},
    {"loopback", 0, 0, 'L'},       {"json", 0, 0, 'J'},       {"no-verify", 0, 0, 'V'},
    {"same-block", 0, 0, 'S'},     {"quiet", 0, 0, 'Q'},      {"help", 0, 0, 'h'},
    {"client-index", 1, 0, 'K'},   {"clients", 1, 0, 'C'},    {"initiators", 1, 0, 'C'},
    {"wait", 0, 0, 'W'},           {"wait-fd", 0, 0, 'F'},    {"load", 1, 0, 'D'},
    {"bind", 1, 0, 'B'},           {"max-region", 1, 0, 'M'}, {"integrity", 0, 0, 'G'},
    {"owned", 0, 0, 'O'},          {"listen", 2, 0, 'l'},     {"rndv", 1, 0, 'R'},
    {"hol", 0, 0, 1001},           {"hol-op", 1, 0, 1002},    {"hol-every-us", 1, 0, 1003},
    {"hol-seconds", 1, 0, 1004},   {"hol-bulk", 1, 0, 1005},  {"hol-blocks", 1, 0, 1006},
    {"hol-prio", 1, 0, 1007},      {"regions", 1, 0, 1101},   {"ranges", 1, 0, 1102},
    {"seed", 1, 0, 1103},          {"reg-cost", 1, 0, 1104},  {0, 0, 0, 0}};

const char *opts_pattern_name(int p)
{
    return p == PAT_CONTIG ? "contiguous" : p == PAT_SCATTER ? "scattered" : "random";
}

static uint64_t parse_size(const char *s)
{
    uint64_t v = kvx_tool_parse_size(s);
    if (v == 0)
        die("bad size '%s'", s);
    return v;
}

static void usage(const struct opts *o)
{
    printf("usage: kvx-bench --listen [host[:port]] [options]  serve target regions\n"
           "                        (default 127.0.0.1:%d; also without --listen)\n"
           "       kvx-bench [options] host[:port]  run against a server (several: one per peer);\n"
           "                        it pairs with each region's transport by address\n"
           "                        (kvx_peer_connect to the listener kvx runs beside it)\n"
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
           "      --integrity       CRC-32C of every block written or read, checked on arrival\n"
           "      --rndv MODE[:BYTES]  how data travels: auto (default: each lane's threshold),\n"
           "                        eager, or always (runs of BYTES or more, default every run,\n"
           "                        by rendezvous); auto:BYTES sets the threshold\n"
           "      --owned           server: kvx allocates its regions in shared memory\n"
           "                        (KVX_PARAM_OWN_REGION); initiators on its host copy into\n"
           "                        and out of them with no work by the server\n"
           "  -p, --port N          server port (default %d; 0 = any)\n"
           "      --bind ADDR       server: listen on this IPv4 address (default 127.0.0.1;\n"
           "                        0.0.0.0 for every interface: anyone who reaches it can\n"
           "                        make regions and write into them)\n"
           "      --max-region BYTES  server: the most its regions may take together (default 4G)\n"
           "      --wait            sleep in kvx_transport_wait instead of spinning on poll\n"
           "                        (for more busy threads than cores)\n"
           "      --wait-fd         sleep in poll(2) on the completions' event fd (an event\n"
           "                        loop's way); with --inflight 1 the rows' seen p50/p99 are\n"
           "                        submit-to-seen times, wake-up included\n"
           "      --hol             head-of-line latency: urgent transfers of --hol-blocks blocks\n"
           "                        (the first --sizes, default 64K) at a fixed rate while\n"
           "                        --hol-bulk whole-region writes stream to the same peer; also\n"
           "                        the urgent ones idle and the bulk alone (one peer, one\n"
           "                        initiator)\n"
           "      --hol-op OP       the urgent transfers: write (default) or read\n"
           "      --hol-every-us US one urgent transfer every US microseconds (default 1000)\n"
           "      --hol-seconds S   each phase's length (default 3)\n"
           "      --hol-bulk N      bulk writes in flight (default 2)\n"
           "      --hol-blocks N    blocks per urgent transfer (default 1)\n"
           "      --hol-prio P      on (default): urgent transfers KVX_PRIO_HIGH, bulk\n"
           "                        KVX_PRIO_LOW; high: urgent high, bulk the default; off:\n"
           "                        both the default (as before kvx had priorities)\n"
           "      --regions N       the ranges mode: N regions on each side (at most %d), each\n"
           "                        --region / N bytes, registered (kvx_region_register) beside\n"
           "                        a small main region; transfers are lists of -b ranges\n"
           "                        (default 64) between them (kvx_xfer_write_ranges), every\n"
           "                        byte of every range moved checked\n"
           "      --ranges MIN[-MAX]  each range's length, log-uniform in MIN..MAX at any byte\n"
           "                        offset (default 4K-4M); MIN alone: block-aligned ranges of\n"
           "                        that length, the same bytes as blocks of that size\n"
           "      --seed S          the ranges' layout and choice (default 1)\n"
           "      --reg-cost N      time N kvx_region_register/kvx_region_deregister pairs of a\n"
           "                        region of the first --sizes (default 64K), then N regions at\n"
           "                        once; no server\n"
           "      --json            one JSON object per result line\n"
           "      --no-verify       skip checking the bytes that landed\n"
           "      --quiet           no progress display\n",
           o->port, o->port, MAX_RREGIONS);
}

static void parse_sizes(struct opts *o, const char *arg)
{
    char *list = strdup(arg), *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->nsizes == MAX_SIZES)
            die("too many sizes");
        o->sizes[o->nsizes++] = parse_size(tok);
    }
    free(list);
}

static void parse_rndv(struct opts *o, const char *arg)
{
    const char *colon = strchr(arg, ':');
    size_t n = colon ? (size_t)(colon - arg) : strlen(arg);
    if (n == 4 && strncmp(arg, "auto", 4) == 0)
        o->rndv_mode = KVX_RNDV_AUTO;
    else if (n == 5 && strncmp(arg, "eager", 5) == 0)
        o->rndv_mode = KVX_RNDV_EAGER;
    else if (n == 6 && strncmp(arg, "always", 6) == 0)
        o->rndv_mode = KVX_RNDV_ALWAYS;
    else
        die("--rndv: auto, eager or always, not '%s'", arg);
    o->rndv_thresh = colon ? parse_size(colon + 1) : 0;
}

/* What is moved and how: sizes, counts, patterns, threads. False: not one of these options. */
static bool set_transfer_opt(struct opts *o, int c, const char *arg)
{
    switch (c) {
    case 's':
        parse_sizes(o, arg);
        return true;
    case 'r':
        o->region = parse_size(arg);
        return true;
    case 'b':
        o->blocks = strtoull(arg, NULL, 0);
        return true;
    case 'P':
        o->pattern = !strncmp(arg, "contig", 6)    ? PAT_CONTIG
                     : !strncmp(arg, "scatter", 7) ? PAT_SCATTER
                     : !strcmp(arg, "random")      ? PAT_RANDOM
                                                   : (die("bad pattern '%s'", arg), 0);
        return true;
    case 'o':
        o->ops = !strcmp(arg, "write")  ? OP_WRITE
                 : !strcmp(arg, "read") ? OP_READ
                 : !strcmp(arg, "both") ? OP_WRITE | OP_READ
                                        : (die("bad op '%s'", arg), 0);
        return true;
    case 'n':
        o->iters = atoi(arg);
        return true;
    case 'w':
        o->warmup = atoi(arg);
        return true;
    case 'q':
        o->inflight = atoi(arg);
        return true;
    case 't':
        o->threads = atoi(arg);
        return true;
    case 'T':
        o->target_threads = atoi(arg);
        return true;
    case 'S':
        o->same_block = true;
        return true;
    case 'G':
        o->integrity = true;
        return true;
    case 'R':
        parse_rndv(o, arg);
        return true;
    case 'W':
        o->wait = true;
        return true;
    case 'F':
        o->wait_fd = true;
        return true;
    default:
        return false;
    }
}

/* Which processes run, where, and what they print. False: not one of these options. */
static bool set_run_opt(struct opts *o, int c, const char *arg)
{
    switch (c) {
    case 'N':
        o->peers = atoi(arg);
        return true;
    case 'p':
        o->port = atoi(arg);
        return true;
    case 'L':
        o->loopback = true;
        return true;
    case 'J':
        o->json = true;
        return true;
    case 'V':
        o->verify = false;
        return true;
    case 'O':
        o->owned = true;
        return true;
    case 'Q':
        o->quiet = true;
        return true;
    case 'D':
        o->load_s = atof(arg);
        return true;
    case 'B':
        o->bind = arg;
        return true;
    case 'M':
        o->max_region = parse_size(arg);
        return true;
    case 'K':
        o->client_index = atoi(arg);
        return true;
    case 'C':
    case 'I':
        o->clients = atoi(arg);
        return true;
    default:
        return false;
    }
}

/* --hol and its settings. False: not one of these options. */
static bool set_hol_opt(struct opts *o, int c, const char *arg)
{
    switch (c) {
    case 1001:
        o->hol = true;
        return true;
    case 1002:
        o->hol_op = !strcmp(arg, "write")  ? OP_WRITE
                    : !strcmp(arg, "read") ? OP_READ
                                           : (die("--hol-op: write or read, not '%s'", arg), 0);
        return true;
    case 1003:
        o->hol_every_us = atof(arg);
        return true;
    case 1004:
        o->hol_seconds = atof(arg);
        return true;
    case 1005:
        o->hol_bulk = atoi(arg);
        return true;
    case 1006:
        o->hol_blocks = atoi(arg);
        return true;
    case 1007:
        o->hol_prio = !strcmp(arg, "on")     ? 1
                      : !strcmp(arg, "high") ? 2
                      : !strcmp(arg, "off")
                          ? 0
                          : (die("--hol-prio: on, high or off, not '%s'", arg), 0);
        return true;
    default:
        return false;
    }
}

/* "4K-4M" or "64K" */
static void parse_ranges(struct opts *o, const char *arg)
{
    char lo[64];
    const char *dash = strchr(arg, '-');

    snprintf(lo, sizeof(lo), "%.*s", (int)(dash != NULL ? (size_t)(dash - arg) : strlen(arg)), arg);
    o->ranges_min = parse_size(lo);
    o->ranges_max = dash != NULL ? parse_size(dash + 1) : o->ranges_min;
    if (o->ranges_max < o->ranges_min)
        die("--ranges: MIN-MAX with MIN <= MAX, not '%s'", arg);
}

/* --regions, --ranges, --seed, --reg-cost. False: not one of these options. */
static bool set_region_opt(struct opts *o, int c, const char *arg)
{
    switch (c) {
    case 1101:
        o->regions = atoi(arg);
        if (o->regions < 1 || o->regions > MAX_RREGIONS)
            die("--regions: 1..%d, not '%s'", MAX_RREGIONS, arg);
        return true;
    case 1102:
        parse_ranges(o, arg);
        return true;
    case 1103:
        o->seed = strtoull(arg, NULL, 0);
        return true;
    case 1104:
        o->reg_cost = atoi(arg);
        if (o->reg_cost < 1)
            die("--reg-cost: at least 1 pair, not '%s'", arg);
        return true;
    default:
        return false;
    }
}

static void check_counts(const struct opts *o)
{
    if (o->iters < 1 || o->warmup < 0 || o->inflight < 1 || o->peers < 1 || o->peers > MAX_PEERS ||
        o->clients < 1 || o->client_index < 0 || o->client_index >= o->clients)
        die("bad iteration, warm-up, in-flight, peer or client counts");
    if (o->hol && (o->hol_bulk < 0 || o->hol_bulk > MAX_INITIATORS || o->hol_blocks < 1 ||
                   o->hol_every_us < 1 || o->hol_seconds <= 0 || o->peers != 1 || o->clients != 1))
        die("--hol: one peer, one initiator, --hol-bulk 0..%d, --hol-blocks >= 1, "
            "--hol-every-us >= 1, --hol-seconds > 0",
            MAX_INITIATORS);
}

/* --listen [host[:port]]: serve there (the address may also follow as an argument) */
static void set_listen(struct opts *o, const char *listen_at)
{
    static char host[64];
    const char *colon;

    if (listen_at == NULL && o->naddrs == 1)
        listen_at = o->addrs[0];
    else if (o->naddrs > 0 || o->loopback)
        die("--listen serves: it takes no server address and no --loopback");
    o->naddrs = 0;
    if (listen_at != NULL) {
        colon = strrchr(listen_at, ':');
        snprintf(host, sizeof(host), "%.*s",
                 (int)(colon != NULL ? (size_t)(colon - listen_at) : strlen(listen_at)), listen_at);
        if (host[0] != '\0')
            o->bind = host;
        if (colon != NULL)
            o->port = atoi(colon + 1);
    }
}

int opts_parse(struct opts *o, int argc, char **argv)
{
    bool listen_mode = false;
    const char *listen_at = NULL;
    int c;

    *o = defaults;
    /* before this run's own processes add to it: what else keeps the host busy */
    host_sample(&o->host);
    while ((c = getopt_long(argc, argv, "s:r:b:P:o:n:w:q:t:T:N:I:p:h", long_opts, NULL)) != -1) {
        if (set_transfer_opt(o, c, optarg) || set_run_opt(o, c, optarg) ||
            set_hol_opt(o, c, optarg) || set_region_opt(o, c, optarg))
            continue;
        if (c == 'l') {
            listen_mode = true;
            listen_at = optarg;
            continue;
        }
        usage(o);
        return c == 'h' ? 0 : 2;
    }
    if (o->nsizes == 0) {
        o->sizes[o->nsizes++] = 64ull << 10;
        o->sizes[o->nsizes++] = 1ull << 20;
    }
    if (o->ranges_min != 0 && o->regions == 0)
        o->regions = 1;
    if (o->regions > 0 && o->ranges_min == 0) {
        o->ranges_min = 4ull << 10;
        o->ranges_max = 4ull << 20;
    }
    if (o->regions > 0 && (o->hol || o->load_s > 0))
        die("--regions is a mode of its own: not with --hol or --load");
    if (o->regions > 0 && o->ranges_max > o->region / (uint64_t)o->regions / (uint64_t)o->clients)
        die("--ranges: a range of up to %llu bytes does not fit a region of --region / --regions "
            "/ initiators bytes",
            (unsigned long long)o->ranges_max);
    check_counts(o);
    for (int i = optind; i < argc; i++) {
        if (o->naddrs == MAX_PEERS)
            die("too many addresses");
        o->addrs[o->naddrs++] = argv[i];
    }
    if (listen_mode)
        set_listen(o, listen_at);
    return -1;
}
