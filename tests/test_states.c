/*
 * No transfer stays in flight forever, whatever state it is in when its peer stops answering. A
 * table of states, each put together with real peers over shared memory:
 *   unwired   queued behind a handshake a SIGSTOPped target never answers
 *   queued    behind a window that a SIGSTOPped target's full FIFO keeps full
 *   posted    all of it handed over to a SIGSTOPped target, no acknowledgement back
 *   notified  a KVX_XFER_NOTIFY write that landed and whose notice was sent, waiting for the
 *             NOTICE_ACK of a receiver that stopped right after its blocks landed
 *   parked    submitted to a peer paired by address (kvx_peer_connect) that died and never
 *             comes back: it waits for a connection that never comes
 *   ending    a write that failed while UCX still held its messages (a stopped target's FIFO
 *             full): reported only once UCX lets go of them
 * Each runs with a deadline D and no stall limit, with no deadline and a stall limit S, and with
 * D and the default stall limit (2 s). Every transfer must fail with -ETIMEDOUT, with a deadline
 * by D + 200 ms (the longest a write whose messages UCX holds waits past its deadline: kvx.h,
 * docs/guide.md), with the stall limit alone by S + 100 ms (the housekeeping period), each with a
 * margin for this machine's scheduling. Then
 * KVX_PEER_REMOVE_PURGE on a peer with an ENDING write: its id never comes out of poll.
 * Every transfer that succeeds is verified byte for byte.
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define BL 65536
#define NB 256
#define BIG 192 /* blocks of a write that fills a stopped target's FIFO (4 MiB) and more */

#define D_MS 500ull
#define S_MS 500ull
#define END_GRACE_MS 200ull    /* kvx: an ENDING write fails its connection this long after */
#define HOUSEKEEPING_MS 100ull /* kvx: how often the stall limit is checked */
#define MARGIN_MS 300ull       /* scheduling on a loaded machine */

static kt_region_t r;
static const uint64_t salt = 0x5a;
static const char *self_exe = "/proc/self/exe";

typedef struct mode {
    const char *name;
    uint64_t deadline_ms, stall_ms;
    uint64_t bound_ms; /* every transfer is reported by then, counted from its submission */
    uint64_t min_ms;   /* ... and not before */
} kt_mode_t;

static const kt_mode_t modes[] = {
    {"deadline 500 ms, no stall limit", D_MS, 0, D_MS + END_GRACE_MS + MARGIN_MS, D_MS},
    {"no deadline, stall limit 500 ms", 0, S_MS, S_MS + HOUSEKEEPING_MS + MARGIN_MS, 0},
    /* the default stall limit, longer than the grace of an ENDING write: the deadline holds */
    {"deadline 500 ms, stall limit 2 s", D_MS, 2000, D_MS + END_GRACE_MS + MARGIN_MS, D_MS},
};

static kvx_transport_t *writer(const char *name, const kt_mode_t *m, unsigned threads)
{
    kvx_transport_t *t;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_DEADLINE |
                                    KVX_PARAM_STALL | KVX_PARAM_NUM_THREADS,
                      .base = r.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .agent_name = name,
                      .deadline_ms = m->deadline_ms,
                      .stall_ms = m->stall_ms,
                      .num_threads = threads};
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}

static kt_target_t target(const char *name, const char *listen)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 3, .threads = 1, .name = name, .listen = listen};
    return kt_target_start(&a);
}

static bool over_tcp;

/* A target stopped for a row goes on and quits. Over tcp it is killed instead: resumed, it may
 * crash in UCX's tcp transport (the writer closed its endpoint while the target's socket held
 * unread bytes; see docs/design.md on UCX's tcp use-after-free). */
static void kill_target(kt_target_t *tg)
{
    kt_kill(&tg->proc, SIGKILL);
    kt_wait(&tg->proc);
    close(tg->proc.sock);
    free(tg->md);
}

static void resume_and_stop(kt_target_t *tg)
{
    if (over_tcp) {
        kill_target(tg);
        return;
    }
    kt_cont(&tg->proc);
    KT_EQ(kt_target_stop(tg), 0);
}

/* A write that succeeds, verified block by block on the target: the connection works before
 * the state under test is set up. */
static void check_written(kvx_transport_t *t, kt_target_t *tg, const char *peer)
{
    uint32_t li[8], ri[8];
    kvx_completion_t c;
    uint64_t id;

    for (uint32_t i = 0; i < 8; i++) {
        li[i] = 240 + i;
        ri[i] = 240 + (i * 3) % 8;
    }
    KT_OK(kvx_xfer_write(t, peer, li, ri, 8, NULL, &id));
    KT_EQ(kt_poll_n(t, peer, &c, 1, 10000), 1);
    KT_EQ(c.id, id);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(tg, ri, li, 8, salt, 0), 0);
}

/* What one row saw: for each transfer, its status and when it was reported. */
#define MAX_IDS 4
typedef struct seen {
    int n;
    uint64_t id[MAX_IDS], t_sub[MAX_IDS];
    int status[MAX_IDS];
    uint64_t ms[MAX_IDS]; /* UINT64_MAX: never reported */
} seen_t;

/* Submit a write of blocks [first, first + n) to the same remote blocks, expected in s. */
static void submit(seen_t *s, kvx_transport_t *t, const char *peer, uint32_t first, uint32_t n,
                   uint32_t flags)
{
    kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_FLAGS, .flags = flags};
    uint32_t li[NB];

    KT_CHECK(s->n < MAX_IDS);
    for (uint32_t i = 0; i < n; i++)
        li[i] = first + i;
    s->t_sub[s->n] = kt_now_ns();
    KT_OK(kvx_xfer_write(t, peer, li, li, n, flags ? &xp : NULL, &s->id[s->n]));
    s->ms[s->n] = UINT64_MAX;
    s->status[s->n] = 1;
    s->n++;
}

/* Poll until every expected transfer is reported or wait_ms passed since the first
 * submission. */
static void collect(kvx_transport_t *t, seen_t *s, uint64_t wait_ms)
{
    uint64_t end = s->t_sub[0] + wait_ms * 1000000ull;
    int left = s->n;

    while (left > 0 && kt_now_ns() < end) {
        kvx_completion_t c[8];
        int n = kvx_transport_poll(t, NULL, c, 8);

        KT_OK(n);
        for (int i = 0; i < n; i++) {
            int j = 0;
            while (j < s->n && s->id[j] != c[i].id)
                j++;
            if (j == s->n)
                KT_FAIL("transfer %llu not of this row", (unsigned long long)c[i].id);
            if (s->ms[j] != UINT64_MAX)
                KT_FAIL("transfer %llu reported twice", (unsigned long long)c[i].id);
            s->ms[j] = (kt_now_ns() - s->t_sub[j]) / 1000000ull;
            s->status[j] = c[i].status;
            left--;
        }
        if (n == 0)
            usleep(1000);
    }
}

/* ---- the rows ------------------------------------------------------------------------------- */

static void row_queued(const kt_mode_t *m, seen_t *s)
{
    kt_target_t tg = target("queued-target", NULL);
    kvx_transport_t *t = writer("queued-writer", m, 1);

    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    check_written(t, &tg, "p");
    kt_stop(&tg.proc);
    submit(s, t, "p", 0, BIG, 0); /* fills the FIFO and the window */
    usleep(20000);
    submit(s, t, "p", BIG, 4, 0); /* nothing of it can be posted */
    collect(t, s, m->bound_ms + 2000);
    kvx_transport_destroy(t);
    resume_and_stop(&tg);
}

static void row_unwired(const kt_mode_t *m, seen_t *s)
{
    kt_target_t tg = target("unwired-target", NULL);
    kvx_transport_t *t = writer("unwired-writer", m, 1);
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};

    kt_stop(&tg.proc);
    /* it never answers the handshake: the add returns after 200 ms, wire-up in the background */
    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    KT_OK(kvx_peer_query(t, "p", &pa));
    KT_EQ(pa.state, KVX_PEER_WIRING); /* its handshake is not answered */
    submit(s, t, "p", 0, 4, 0);
    collect(t, s, m->bound_ms + 2000);
    kvx_transport_destroy(t);
    /* not resumed: it would answer the HELLO of a writer that is gone, and UCX (1.13) leaks
     * 100 bytes in libuct when its endpoint cannot attach that writer's FIFO */
    kill_target(&tg);
}

static void row_posted(const kt_mode_t *m, seen_t *s)
{
    kt_target_t tg = target("posted-target", NULL);
    kvx_transport_t *t = writer("posted-writer", m, 1);

    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    check_written(t, &tg, "p");
    kt_stop(&tg.proc);
    submit(s, t, "p", 0, 2, 0); /* 128 KiB: all in the FIFO at once */
    collect(t, s, m->bound_ms + 2000);
    kvx_transport_destroy(t);
    resume_and_stop(&tg);
}

/*
 * The stopper: a receiver with no progress thread that polls until block NOTIFIED_BLOCK holds
 * the writer's pattern (its acknowledgement leaves in the same step), says so, and stops itself
 * before it could process the notice that follows. This program runs it (see main), so that it
 * starts from a fresh process image.
 */
#define NOTIFIED_BLOCK 17u

static int stopper_main(int sock)
{
    kt_region_t cr = kt_region_alloc(NB, BL);
    kvx_transport_t *t;
    uint64_t end = kt_now_ns() + 20000000000ull;
    uint8_t *md, landed = 0;
    size_t md_len;

    kt_fill_all(&cr, 9, 0);
    t = kt_transport(&cr, "stopper", 0);
    md = kt_metadata(t, &md_len);
    kt_send(sock, md, md_len);
    free(md);
    while (kt_now_ns() < end) {
        KT_OK(kvx_transport_poll(t, NULL, NULL, 0));
        if (kt_check(&cr, NOTIFIED_BLOCK, salt, NOTIFIED_BLOCK, 0) == 0) {
            landed = 1;
            break;
        }
    }
    kt_send(sock, &landed, 1);
    if (landed)
        raise(SIGSTOP);
    kt_recv(sock, &landed, 1); /* told to go */
    kvx_transport_destroy(t);
    kt_region_free(&cr);
    return 0;
}

static int stopper_exec(int sock, void *arg)
{
    char fd[16];
    int s = dup(sock); /* without close-on-exec */

    (void)arg;
    snprintf(fd, sizeof(fd), "%d", s);
    execl(self_exe, "test_states", "--stopper", fd, (char *)NULL);
    perror("execl");
    return 2;
}

static void row_notified(const kt_mode_t *m, seen_t *s)
{
    kt_proc_t st = kt_spawn(stopper_exec, NULL, 60);
    kvx_transport_t *t = writer("notified-writer", m, 1);
    size_t md_len;
    uint8_t *md = kt_recv_alloc(st.sock, &md_len), landed = 0;

    KT_OK(kvx_peer_add(t, "p", md, md_len, NULL));
    submit(s, t, "p", NOTIFIED_BLOCK, 1, KVX_XFER_NOTIFY);
    KT_EQ(kt_recv(st.sock, &landed, 1), 1);
    KT_EQ(landed, 1); /* the receiver checked the block landed, byte for byte */
    collect(t, s, m->bound_ms + 2000);
    kvx_transport_destroy(t);
    kt_cont(&st);
    kt_send(st.sock, &landed, 1);
    KT_EQ(kt_wait(&st), 0);
    free(md);
}

static int peer_state(kvx_transport_t *t, const char *peer)
{
    kvx_peer_attr_t a = {.field_mask = KVX_PEER_ATTR_STATE};
    KT_OK(kvx_peer_query(t, peer, &a));
    return a.state;
}

static void row_parked(const kt_mode_t *m, seen_t *s)
{
    kt_target_t tg = target("parked-target", "127.0.0.1:0");
    kvx_transport_t *t = writer("parked-writer", m, 1);
    uint64_t end;

    KT_OK(kvx_peer_connect(t, "p", tg.listen_addr, NULL));
    check_written(t, &tg, "p");
    kt_kill(&tg.proc, SIGKILL); /* and nothing listens at its address again */
    kt_wait(&tg.proc);
    end = kt_now_ns() + 5000000000ull;
    while (peer_state(t, "p") != KVX_PEER_RECONNECTING && kt_now_ns() < end)
        usleep(1000);
    KT_EQ(peer_state(t, "p"), KVX_PEER_RECONNECTING);
    submit(s, t, "p", 0, 4, 0);
    collect(t, s, m->bound_ms + 2000);
    kvx_transport_destroy(t);
    close(tg.proc.sock);
    free(tg.md);
}

static void row_ending(const kt_mode_t *m, seen_t *s)
{
    kt_target_t tg = target("ending-target", NULL);
    kvx_transport_t *t = writer("ending-writer", m, 1);

    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    check_written(t, &tg, "p");
    kt_stop(&tg.proc);
    /* 12 MiB: once the FIFO is full UCX holds up to 16 of its messages, for good */
    submit(s, t, "p", 0, BIG, 0);
    collect(t, s, m->bound_ms + 2000);
    kvx_transport_destroy(t);
    resume_and_stop(&tg);
}

static const struct row {
    const char *name;
    void (*run)(const kt_mode_t *m, seen_t *s);
} rows[] = {
    {"unwired", row_unwired},   {"queued", row_queued}, {"posted", row_posted},
    {"notified", row_notified}, {"parked", row_parked}, {"ending", row_ending},
};

/* ---- purge ---------------------------------------------------------------------------------- */

/*
 * KVX_PEER_REMOVE_PURGE while a write is ENDING (past its deadline, its messages still in UCX's
 * hands): its id never comes out of poll. No progress thread, so that the write's state moves
 * only inside the calls below.
 */
static int purge_ending(void)
{
    const kt_mode_t m = {"purge", 300, 2000, 0, 0};
    kt_target_t tg = target("purge-target", NULL);
    kvx_transport_t *t = writer("purge-writer", &m, 0);
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_COUNTERS};
    kvx_completion_t c[4];
    seen_t s = {0};
    uint64_t end;
    int n, bad = 0;

    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    check_written(t, &tg, "p");
    kt_stop(&tg.proc);
    submit(&s, t, "p", 0, BIG, 0);
    while (kt_now_ns() < s.t_sub[0] + 250000000ull) /* post until the FIFO is full */
        KT_EQ(kvx_transport_poll(t, NULL, c, 4), 0);
    usleep(100000);
    KT_EQ(kvx_transport_poll(t, NULL, c, 4), 0); /* past its deadline: ENDING, not reported */
    KT_OK(kvx_peer_query(t, "p", &pa));
    KT_EQ(pa.xfers_inflight, 1);
    KT_EQ(kvx_peer_remove_ex(t, "p", KVX_PEER_REMOVE_PURGE), 1);
    end = kt_now_ns() + 1500000000ull;
    while (kt_now_ns() < end) {
        n = kvx_transport_poll(t, NULL, c, 4);
        KT_OK(n);
        for (int i = 0; i < n; i++) {
            kt_log("FAIL purge: purged transfer %llu came out of poll: %d (%s)",
                   (unsigned long long)c[i].id, c[i].status, kvx_strerror(c[i].status));
            bad++;
        }
        usleep(1000);
    }
    if (bad == 0)
        kt_log("purge: an ENDING write purged with its peer never came out of poll");
    kvx_transport_destroy(t);
    resume_and_stop(&tg);
    return bad == 0;
}

int main(int argc, char **argv)
{
    int failed = 0;

    if (argc == 3 && strcmp(argv[1], "--stopper") == 0)
        return stopper_main(atoi(argv[2]));
    if (argc == 2 && strcmp(argv[1], "tcp") == 0) {
        setenv("UCX_TLS", "tcp", 1); /* for the peers too: they inherit it */
        over_tcp = true;
    }
    r = kt_region_alloc(NB, BL);
    kt_fill_all(&r, salt, 0);
    for (size_t mi = 0; mi < sizeof(modes) / sizeof(modes[0]); mi++) {
        const kt_mode_t *m = &modes[mi];
        for (size_t ri = 0; ri < sizeof(rows) / sizeof(rows[0]); ri++) {
            seen_t s = {0};
            bool ok = true;

            rows[ri].run(m, &s);
            for (int i = 0; i < s.n; i++) {
                bool fine = s.ms[i] != UINT64_MAX && s.status[i] == -ETIMEDOUT &&
                            s.ms[i] <= m->bound_ms && s.ms[i] >= m->min_ms;
                if (s.ms[i] == UINT64_MAX)
                    kt_log("%s | %-8s | transfer %d: not reported %llu ms after submission",
                           m->name, rows[ri].name, i, (unsigned long long)(m->bound_ms + 2000));
                else
                    kt_log("%s | %-8s | transfer %d: %d (%s) after %llu ms (bound %llu-%llu)",
                           m->name, rows[ri].name, i, s.status[i], kvx_strerror(s.status[i]),
                           (unsigned long long)s.ms[i], (unsigned long long)m->min_ms,
                           (unsigned long long)m->bound_ms);
                ok = ok && fine;
            }
            if (!ok) {
                kt_log("FAIL %s | %s", m->name, rows[ri].name);
                failed++;
            }
        }
    }
    if (!purge_ending())
        failed++;
    kt_region_free(&r);
    return failed ? 1 : 0;
}
