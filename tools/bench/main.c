/*
 * kvx-bench: kvx's benchmark and main job, in the habits of ucx_perftest. No address: serve
 * target regions. An address: run transfers against it. --loopback: fork the targets here.
 * Every run verifies the bytes that landed unless --no-verify. This file: options and the
 * processes of --loopback; ctl.c the control channel, server.c the targets, client.c the
 * initiator, load.c --load.
 */
#include "bench.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

struct opts o = {
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
};

void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kvx-bench: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

static uint64_t parse_size(const char *s)
{
    uint64_t v = kvx_tool_parse_size(s);
    if (v == 0)
        die("bad size '%s'", s);
    return v;
}

const char *fmt_size(uint64_t v, char *buf, size_t len)
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

void *region_alloc(uint64_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap %llu bytes: %s", (unsigned long long)bytes, strerror(errno));
    return p;
}

static void usage(void)
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
           "      --json            one JSON object per result line\n"
           "      --no-verify       skip checking the bytes that landed\n"
           "      --quiet           no progress display\n",
           o.port, o.port);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"sizes", 1, 0, 's'},
                                       {"region", 1, 0, 'r'},
                                       {"blocks", 1, 0, 'b'},
                                       {"pattern", 1, 0, 'P'},
                                       {"op", 1, 0, 'o'},
                                       {"iters", 1, 0, 'n'},
                                       {"warmup", 1, 0, 'w'},
                                       {"inflight", 1, 0, 'q'},
                                       {"threads", 1, 0, 't'},
                                       {"target-threads", 1, 0, 'T'},
                                       {"peers", 1, 0, 'N'},
                                       {"port", 1, 0, 'p'},
                                       {"loopback", 0, 0, 'L'},
                                       {"json", 0, 0, 'J'},
                                       {"no-verify", 0, 0, 'V'},
                                       {"same-block", 0, 0, 'S'},
                                       {"quiet", 0, 0, 'Q'},
                                       {"help", 0, 0, 'h'},
                                       {"client-index", 1, 0, 'K'},
                                       {"clients", 1, 0, 'C'},
                                       {"initiators", 1, 0, 'C'},
                                       {"wait", 0, 0, 'W'},
                                       {"wait-fd", 0, 0, 'F'},
                                       {"load", 1, 0, 'D'},
                                       {"bind", 1, 0, 'B'},
                                       {"max-region", 1, 0, 'M'},
                                       {"integrity", 0, 0, 'G'},
                                       {"owned", 0, 0, 'O'},
                                       {"listen", 2, 0, 'l'},
                                       {"rndv", 1, 0, 'R'},
                                       {"hol", 0, 0, 1001},
                                       {"hol-op", 1, 0, 1002},
                                       {"hol-every-us", 1, 0, 1003},
                                       {"hol-seconds", 1, 0, 1004},
                                       {"hol-bulk", 1, 0, 1005},
                                       {"hol-blocks", 1, 0, 1006},
                                       {"hol-prio", 1, 0, 1007},
                                       {0, 0, 0, 0}};
    bool listen_mode = false;
    const char *listen_at = NULL;
    double load[1];
    int c;

    /* before this run's own processes add to it: what else keeps the host busy */
    o.load_1m = getloadavg(load, 1) == 1 ? load[0] : 0;
    o.cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (o.cores < 1)
        o.cores = 1;

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
        case 'G':
            o.integrity = true;
            break;
        case 'O':
            o.owned = true;
            break;
        case 'R': {
            const char *colon = strchr(optarg, ':');
            size_t n = colon ? (size_t)(colon - optarg) : strlen(optarg);
            if (n == 4 && strncmp(optarg, "auto", 4) == 0)
                o.rndv_mode = KVX_RNDV_AUTO;
            else if (n == 5 && strncmp(optarg, "eager", 5) == 0)
                o.rndv_mode = KVX_RNDV_EAGER;
            else if (n == 6 && strncmp(optarg, "always", 6) == 0)
                o.rndv_mode = KVX_RNDV_ALWAYS;
            else
                die("--rndv: auto, eager or always, not '%s'", optarg);
            o.rndv_thresh = colon ? parse_size(colon + 1) : 0;
            break;
        }
        case 'l':
            listen_mode = true;
            listen_at = optarg;
            break;
        case 'Q':
            o.quiet = true;
            break;
        case 'W':
            o.wait = true;
            break;
        case 'F':
            o.wait_fd = true;
            break;
        case 'D':
            o.load_s = atof(optarg);
            break;
        case 'B':
            o.bind = optarg;
            break;
        case 'M':
            o.max_region = parse_size(optarg);
            break;
        case 'K':
            o.client_index = atoi(optarg);
            break;
        case 'C':
        case 'I':
            o.clients = atoi(optarg);
            break;
        case 1001:
            o.hol = true;
            break;
        case 1002:
            o.hol_op = !strcmp(optarg, "write") ? OP_WRITE
                       : !strcmp(optarg, "read")
                           ? OP_READ
                           : (die("--hol-op: write or read, not '%s'", optarg), 0);
            break;
        case 1003:
            o.hol_every_us = atof(optarg);
            break;
        case 1004:
            o.hol_seconds = atof(optarg);
            break;
        case 1005:
            o.hol_bulk = atoi(optarg);
            break;
        case 1006:
            o.hol_blocks = atoi(optarg);
            break;
        case 1007:
            o.hol_prio = !strcmp(optarg, "on")     ? 1
                         : !strcmp(optarg, "high") ? 2
                         : !strcmp(optarg, "off")
                             ? 0
                             : (die("--hol-prio: on, high or off, not '%s'", optarg), 0);
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
    if (o.hol && (o.hol_bulk < 0 || o.hol_bulk > MAX_INITIATORS || o.hol_blocks < 1 ||
                  o.hol_every_us < 1 || o.hol_seconds <= 0 || o.peers != 1 || o.clients != 1))
        die("--hol: one peer, one initiator, --hol-bulk 0..%d, --hol-blocks >= 1, "
            "--hol-every-us >= 1, --hol-seconds > 0",
            MAX_INITIATORS);
    for (int i = optind; i < argc; i++) {
        if (o.naddrs == MAX_PEERS)
            die("too many addresses");
        o.addrs[o.naddrs++] = argv[i];
    }
    if (listen_mode) {
        /* --listen [host[:port]]: serve there (the address may also follow as an argument) */
        static char host[64];
        const char *colon;
        if (listen_at == NULL && o.naddrs == 1)
            listen_at = o.addrs[0];
        else if (o.naddrs > 0 || o.loopback)
            die("--listen serves: it takes no server address and no --loopback");
        o.naddrs = 0;
        if (listen_at != NULL) {
            colon = strrchr(listen_at, ':');
            snprintf(host, sizeof(host), "%.*s",
                     (int)(colon != NULL ? (size_t)(colon - listen_at) : strlen(listen_at)),
                     listen_at);
            if (host[0] != '\0')
                o.bind = host;
            if (colon != NULL)
                o.port = atoi(colon + 1);
        }
    }
    signal(SIGPIPE, SIG_IGN);

    if (o.loopback) {
        static char addr[MAX_PEERS][32];
        pid_t pids[MAX_PEERS];
        int rc, st, status = 0;

        for (int i = 0; i < o.peers; i++) {
            int port, lfd = listen_on("127.0.0.1", 0, &port);
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
            pid_t cp[MAX_INITIATORS];
            FILE *outs[MAX_INITIATORS];
            result_t res[MAX_INITIATORS * MAX_SIZES * 2];
            bool json = o.json;
            int n, bad = 0;

            if (o.clients > MAX_INITIATORS)
                die("at most %d initiators", MAX_INITIATORS);
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
        int port, lfd = listen_on(o.bind, o.port, &port);
        fprintf(stderr, "kvx-bench: serving on %s port %d\n", o.bind ? o.bind : "127.0.0.1", port);
        return server_run(lfd, false);
    }
    return client_run();
}
