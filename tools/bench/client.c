/*
 * kvx-bench's initiator: opens a transport per block size, pairs with the servers, runs the
 * measured transfers (write, read; contiguous, scattered or random) and checks every byte that
 * landed. report.c prints what it measured.
 */
#include "client.h"

#include "ctl.h"

#include <poll.h>

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Pair with server i's region (pairing is short and the machine noisy: the median of 5 pairings
 * in ms, the last one stays). */
static double client_pair(client_t *c, const struct opts *o, int *ctl, int i)
{
    char addr[300];
    const char *colon = strrchr(o->addrs[i], ':');
    uint32_t port = ctl_region(ctl[i], c->size, c->nb);
    double add_ms[5];
    uint64_t t0;

    /* the server's transport listens at the control channel's host, on that port: kvx pairs
     * with it by address (kvx_peer_connect) and carries the metadata itself */
    snprintf(addr, sizeof(addr), "%.*s:%u",
             (int)(colon != NULL ? (size_t)(colon - o->addrs[i]) : strlen(o->addrs[i])),
             o->addrs[i], port);
    for (int k = 0; k < 5; k++) {
        if (k > 0)
            CHECK_KVX(kvx_peer_remove(c->t, c->peer[i]));
        t0 = now_ns();
        CHECK_KVX(kvx_peer_connect(c->t, c->peer[i], addr, NULL));
        add_ms[k] = (double)(now_ns() - t0) / 1e6;
    }
    for (int a = 0; a < 5; a++) /* insertion sort of 5 */
        for (int b = a; b > 0 && add_ms[b] < add_ms[b - 1]; b--) {
            double x = add_ms[b];
            add_ms[b] = add_ms[b - 1];
            add_ms[b - 1] = x;
        }
    return add_ms[2];
}

void client_open(client_t *c, const struct opts *o, int *ctl, uint64_t size, uint64_t region)
{
    uint64_t t0;

    memset(c, 0, sizeof(*c));
    c->size = size;
    c->nb = region / size;
    c->npeers = o->naddrs;
    if (c->nb == 0)
        die("region of %llu bytes holds no block of %llu", (unsigned long long)region,
            (unsigned long long)size);
    if (c->nb > UINT32_MAX)
        die("too many blocks");
    c->base = region_alloc(c->nb * size);
    for (uint64_t i = 0; i < c->nb; i++)
        kvx_pattern_fill(c->base + i * size, size, CLIENT_SALT + (uint64_t)o->client_index, i, 0);

    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS | KVX_PARAM_INTEGRITY |
                                    KVX_PARAM_RNDV,
                      .base = c->base,
                      .num_blocks = c->nb,
                      .block_len = size,
                      .num_threads = (unsigned)o->threads,
                      .integrity = o->integrity,
                      .rndv_mode = o->rndv_mode,
                      .rndv_thresh = o->rndv_thresh};
    t0 = now_ns();
    CHECK_KVX(kvx_transport_create(&p, &c->t));
    c->create_ms = (double)(now_ns() - t0) / 1e6;
    kvx_transport_metadata(c->t, NULL, &c->md_bytes);
    for (int i = 0; i < c->npeers; i++) {
        snprintf(c->peer[i], sizeof(c->peer[i]), "target%d", i);
        c->peer_add_ms += client_pair(c, o, ctl, i);
    }
    c->peer_add_ms /= c->npeers;
}

void client_close(client_t *c)
{
    kvx_transport_destroy(c->t);
    munmap(c->base, c->nb * c->size);
}

void client_transport(const client_t *c, char *out, size_t len)
{
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};
    CHECK_KVX(kvx_peer_query(c->t, c->peer[0], &pa));
    snprintf(out, len, "%s", pa.transport);
}

/* ---- the default mode: one block size ------------------------------------------------------- */

/* One block size's run: the client, and the block maps every op uses. */
typedef struct size_run {
    const struct opts *o;
    int *ctl;
    client_t cl;
    uint64_t B;      /* blocks per transfer */
    int total;       /* transfers per peer: warm-up and measured */
    uint32_t *L, *R; /* per map m and peer i, at (m * npeers + i) * B: B local, B remote blocks */
    uint64_t *lat;   /* the measured transfers' latencies */
} size_run_t;

/* The submit/poll loop's state over one op. */
typedef struct xfer_loop {
    int ntx, window, warm_tx, submitted, completed, nlat, nseen, evfd;
    uint64_t *seen, last_submit;
    uint64_t start, end, sub_cpu, sub_blocks;
} xfer_loop_t;

/* The maps of transfer k = m * npeers + i (map m, peer i): a new one per transfer when random. */
static uint32_t *map_at(const size_run_t *r, uint32_t *map, int m, int i)
{
    return map + ((size_t)m * r->cl.npeers + i) * r->B;
}

static void size_maps(size_run_t *r)
{
    const struct opts *o = r->o;
    int npeers = r->cl.npeers;
    uint64_t nb = r->cl.nb, *scratch;
    uint64_t span_l = o->same_block ? 1 : nb / (uint64_t)npeers;
    uint64_t span_r = o->same_block ? 1 : nb / (uint64_t)o->clients;
    uint64_t span = span_l < span_r ? span_l : span_r;

    r->B = o->blocks ? o->blocks : span;
    if (o->same_block)
        r->B = 1;
    if (r->B > span_l || r->B > span_r || r->B == 0)
        die("%llu blocks per transfer do not fit a region slice of %llu blocks",
            (unsigned long long)r->B, (unsigned long long)span);
    r->total = o->warmup + o->iters;
    int nmaps = o->pattern == PAT_RANDOM ? r->total : 1;
    r->L = malloc(sizeof(uint32_t) * r->B * (size_t)nmaps * (size_t)npeers);
    r->R = malloc(sizeof(uint32_t) * r->B * (size_t)nmaps * (size_t)npeers);
    r->lat = malloc(sizeof(uint64_t) * (size_t)r->total * (size_t)npeers);
    scratch = malloc(sizeof(uint64_t) * (span_l > span_r ? span_l : span_r));
    if (!r->L || !r->R || !r->lat || !scratch)
        die("out of memory");
    for (int m = 0; m < nmaps; m++)
        for (int i = 0; i < npeers; i++)
            kvx_index_map(map_at(r, r->L, m, i), map_at(r, r->R, m, i), r->B, span,
                          (uint64_t)i * span_l, (uint64_t)o->client_index * span_r, o->pattern,
                          scratch);
    free(scratch);
}

/* Submit while the window has room; the measured phase starts once the warm-up has drained. */
static void loop_submit(const size_run_t *r, int op, xfer_loop_t *lp)
{
    int npeers = r->cl.npeers;

    while (lp->submitted < lp->ntx && lp->submitted - lp->completed < lp->window) {
        if (lp->submitted == lp->warm_tx && lp->completed < lp->warm_tx)
            break;
        if (lp->submitted == lp->warm_tx)
            lp->start = now_ns();
        int pi = lp->submitted % npeers;
        int m = r->o->pattern == PAT_RANDOM ? lp->submitted / npeers : 0;
        const uint32_t *l = map_at(r, r->L, m, pi), *rm = map_at(r, r->R, m, pi);
        /* the CPU clock is a system call: sample one submission in 8 */
        bool timed = lp->submitted >= lp->warm_tx && ((lp->submitted - lp->warm_tx) & 7) == 0;
        uint64_t id, c0 = timed ? kvx_tool_thread_cpu_ns() : 0;
        int rc = op == OP_WRITE ? kvx_xfer_write(r->cl.t, r->cl.peer[pi], l, rm, r->B, NULL, &id)
                                : kvx_xfer_read(r->cl.t, r->cl.peer[pi], l, rm, r->B, NULL, &id);
        if (rc < 0)
            die("submit: %s", kvx_strerror(rc));
        if (timed) {
            lp->sub_cpu += kvx_tool_thread_cpu_ns() - c0;
            lp->sub_blocks += r->B;
        }
        lp->submitted++;
        lp->last_submit = now_ns();
    }
}

/* One poll (asleep first with --wait or --wait-fd when there was nothing), its completions
 * counted and timed. */
static void loop_reap(const size_run_t *r, xfer_loop_t *lp)
{
    kvx_completion_t comp[64];
    kvx_transport_t *t = r->cl.t;
    int n = kvx_transport_poll(t, NULL, comp, 64);

    if (n < 0)
        die("poll: %s", kvx_strerror(n));
    if (n == 0 && r->o->wait)
        kvx_transport_wait(t, NULL, 100);
    if (n == 0 && r->o->wait_fd) {
        struct pollfd pfd = {.events = POLLIN};
        if (lp->evfd < 0)
            CHECK_KVX(kvx_transport_event_fd_ex(t, KVX_EVENT_COMPLETIONS, &lp->evfd));
        pfd.fd = lp->evfd;
        poll(&pfd, 1, 100);
    }
    if (n == 1 && lp->window == 1 && lp->completed >= lp->warm_tx && lp->seen != NULL)
        lp->seen[lp->nseen++] = now_ns() - lp->last_submit;
    for (int i = 0; i < n; i++) {
        if (comp[i].status != 0)
            die("transfer %llu failed: %s", (unsigned long long)comp[i].id,
                kvx_strerror(comp[i].status));
        if (lp->completed >= lp->warm_tx)
            r->lat[lp->nlat++] = comp[i].duration_ns;
        lp->completed++;
    }
}

/* Transfers k = 0 .. total*npeers-1; k goes to peer k % npeers; a window of inflight*npeers
 * transfers stays in flight. */
static void op_measure(const size_run_t *r, int op, const char *name, xfer_loop_t *lp)
{
    int npeers = r->cl.npeers;

    memset(lp, 0, sizeof(*lp));
    lp->ntx = r->total * npeers;
    lp->window = r->o->inflight * npeers;
    lp->warm_tx = r->o->warmup * npeers;
    lp->evfd = -1;
    lp->seen = calloc((size_t)lp->ntx, sizeof(*lp->seen));
    while (lp->completed < lp->ntx) {
        loop_submit(r, op, lp);
        loop_reap(r, lp);
        progress_line(r->o->quiet, name, lp->completed, lp->ntx);
    }
    lp->end = now_ns();
}

/* The figures of one measured op. */
static void op_figures(const size_run_t *r, xfer_loop_t *lp, result_t *res)
{
    uint64_t bytes = (uint64_t)r->o->iters * (uint64_t)r->cl.npeers * r->B * r->cl.size;
    double secs = (double)(lp->end - lp->start) / 1e9;
    uint64_t nlat = (uint64_t)lp->nlat, nseen = (uint64_t)lp->nseen;

    sort_u64(r->lat, nlat);
    res->bytes = bytes;
    res->start_ns = lp->start;
    res->end_ns = lp->end;
    res->initiator = r->o->client_index;
    res->gbps = (double)bytes / secs / 1e9;
    res->xfers_per_s = (double)lp->nlat / secs;
    res->p50_us = pct_us(r->lat, nlat, 50);
    res->p99_us = pct_us(r->lat, nlat, 99);
    res->max_us = nlat ? (double)r->lat[nlat - 1] / 1e3 : 0;
    res->lat_n = nlat;
    res->submit_ns_per_block = lp->sub_blocks ? (double)lp->sub_cpu / (double)lp->sub_blocks : 0;
    sort_u64(lp->seen, nseen);
    res->seen_p50_us = pct_us(lp->seen, nseen, 50);
    res->seen_p99_us = pct_us(lp->seen, nseen, 99);
    free(lp->seen);
    lp->seen = NULL;
}

/* The last transfer's blocks, every byte: written ones checked by each server, read ones here. */
static void op_verify(const size_run_t *r, int op, result_t *res)
{
    const struct opts *o = r->o;
    int last = o->pattern == PAT_RANDOM ? r->total - 1 : 0;

    for (int i = 0; i < r->cl.npeers; i++) {
        const uint32_t *l = map_at(r, r->L, last, i), *rm = map_at(r, r->R, last, i);
        if (op == OP_WRITE) {
            verify_req_t q = {.block_len = r->cl.size,
                              .num_blocks = r->cl.nb,
                              .salt = CLIENT_SALT + (uint64_t)o->client_index,
                              .round = 0,
                              .n = (uint32_t)r->B};
            res->bad += ctl_verify(r->ctl[i], &q, rm, l);
            continue;
        }
        for (uint64_t k = 0; k < r->B; k++)
            if (kvx_pattern_check(r->cl.base + (uint64_t)l[k] * r->cl.size, r->cl.size, SERVER_SALT,
                                  rm[k], 0) != 0)
                res->bad++;
    }
}

static void run_op(const size_run_t *r, int op, result_t *res, int nres)
{
    int npeers = r->cl.npeers;
    xfer_loop_t lp;

    memset(res, 0, sizeof(*res));
    res->op = op == OP_WRITE ? "write" : "read";
    res->size = r->cl.size;
    res->blocks = r->B;
    res->create_ms = r->cl.create_ms;
    res->peer_add_ms = r->cl.peer_add_ms;
    res->md_bytes = r->cl.md_bytes;
    if (op == OP_READ) {
        /* a refill rewrites the whole region: every initiator's writes are checked first */
        if (r->o->clients > 1)
            ctl_barrier(r->ctl[0], 0x80000000u | (uint32_t)nres, (uint32_t)r->o->clients);
        for (int i = 0; i < npeers; i++)
            ctl_refill(r->ctl[i], r->cl.size, r->cl.nb);
    }
    if (r->o->clients > 1)
        ctl_barrier(r->ctl[0], (uint32_t)nres, (uint32_t)r->o->clients);
    /* CPU time of this process and of the servers (all their threads) over the run */
    uint64_t cpu0 = kvx_tool_process_cpu_ns(), tcpu0 = 0, tcpu1 = 0;
    for (int i = 0; i < npeers; i++)
        tcpu0 += ctl_cpu_ns(r->ctl[i]);
    op_measure(r, op, res->op, &lp);
    double all_gb = (double)r->total * npeers * (double)r->B * (double)r->cl.size / 1e9;
    res->init_cpu_s_per_gb = (double)(kvx_tool_process_cpu_ns() - cpu0) / 1e9 / all_gb;
    for (int i = 0; i < npeers; i++)
        tcpu1 += ctl_cpu_ns(r->ctl[i]);
    res->target_cpu_s_per_gb = (double)(tcpu1 - tcpu0) / 1e9 / all_gb;
    op_figures(r, &lp, res);
    client_transport(&r->cl, res->transport, sizeof(res->transport));
    if (r->o->verify)
        op_verify(r, op, res);
}

void client_run_size(const struct opts *o, int *ctl, uint64_t size, result_t *res_out, int *nres)
{
    size_run_t r = {.o = o, .ctl = ctl};

    client_open(&r.cl, o, ctl, size, o->region);
    size_maps(&r);
    for (int op = OP_WRITE; op <= OP_READ; op <<= 1) {
        if (!(o->ops & op))
            continue;
        result_t *res = &res_out[(*nres)++];
        run_op(&r, op, res, *nres);
    }
    free(r.L);
    free(r.R);
    free(r.lat);
    client_close(&r.cl);
}
