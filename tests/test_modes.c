/*
 * Peers agree on how payloads travel. For every pair of modes (eager, auto, always) of the
 * initiator and of the target, writes and reads between two processes succeed, every byte
 * verified, over the lane argv[1] names ("shm" or "tcp"). Each side says in the handshake whether
 * it takes rendezvous payloads (all but KVX_RNDV_EAGER do), and a side sends by rendezvous only
 * what the other takes: the target's counters show write payloads by rendezvous exactly when the
 * initiator chose always and the target takes them, and read data by rendezvous exactly when the
 * target chose always and the initiator takes them (auto chooses rendezvous only on zero-copy RMA
 * lanes, which this host has none of). The initiator's debug log says, for its connection, which
 * path its writes take and why.
 */
#include "harness.h"

#include <pthread.h>
#include <string.h>

#define NB 32
#define BL 65536

static const char *const modes[] = {"eager", "auto", "always"};
static const int mode_val[] = {KVX_RNDV_EAGER, KVX_RNDV_AUTO, KVX_RNDV_ALWAYS};

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char path_line[512]; /* the initiator's log line on its connection's path */

static void capture(void *arg, int level, const char *msg)
{
    (void)arg;
    (void)level;
    pthread_mutex_lock(&log_lock);
    if (strstr(msg, ": writes over ") != NULL)
        snprintf(path_line, sizeof(path_line), "%s", msg);
    pthread_mutex_unlock(&log_lock);
}

static void pair(int wi, int ti, uint64_t round)
{
    kt_target_args_t ta = {.num_blocks = NB, .block_len = BL, .salt = 0x51, .threads = 1};
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS | KVX_PARAM_RNDV |
                                    KVX_PARAM_LOG | KVX_PARAM_AGENT_NAME,
                      .base = r.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .agent_name = "initiator",
                      .num_threads = 1,
                      .rndv_mode = mode_val[wi],
                      .log_fn = capture,
                      .log_level = KVX_LOG_DEBUG};
    const bool w_rndv = mode_val[wi] == KVX_RNDV_ALWAYS && mode_val[ti] != KVX_RNDV_EAGER;
    const bool r_rndv = mode_val[ti] == KVX_RNDV_ALWAYS && mode_val[wi] != KVX_RNDV_EAGER;
    uint32_t li[NB / 2], ri[NB / 2];
    kvx_recv_counters_t c0, c1;
    kvx_completion_t c;
    kvx_transport_t *t;
    kt_target_t tg;
    uint64_t id;
    char line[512];

    setenv("KT_RNDV", modes[ti], 1); /* the target's mode (the harness's target reads it) */
    tg = kt_target_start(&ta);
    path_line[0] = '\0';
    KT_OK(kvx_transport_create(&p, &t));
    kt_fill_all(&r, 0x52, round);
    KT_OK(kvx_peer_add(t, "target", tg.md, tg.md_len, NULL));
    kt_target_counters(&tg, &c0);

    /* a write of one contiguous run (8 blocks), then of 8 scattered blocks */
    for (int shape = 0; shape < 2; shape++) {
        kt_indices(li, NB / 4, NB, shape == 1, 3 + shape);
        kt_indices(ri, NB / 4, NB, shape == 1, 7 + shape);
        KT_OK(kvx_xfer_write(t, "target", li, ri, NB / 4, NULL, &id));
        KT_EQ(kt_poll_n(t, "target", &c, 1, 10000), 1);
        if (c.status != 0)
            KT_FAIL("initiator %s, target %s: write: %d (%s)", modes[wi], modes[ti], c.status,
                    kvx_strerror(c.status));
        KT_EQ(kt_target_verify(&tg, ri, li, NB / 4, 0x52, round), 0);
    }
    /* reads of the target's own pattern into other blocks */
    kt_target_refill(&tg, round);
    for (int shape = 0; shape < 2; shape++) {
        kt_indices(li, NB / 4, NB, shape == 1, 11 + shape);
        kt_indices(ri, NB / 4, NB, shape == 1, 13 + shape);
        KT_OK(kvx_xfer_read(t, "target", li, ri, NB / 4, NULL, &id));
        KT_EQ(kt_poll_n(t, "target", &c, 1, 10000), 1);
        if (c.status != 0)
            KT_FAIL("initiator %s, target %s: read: %d (%s)", modes[wi], modes[ti], c.status,
                    kvx_strerror(c.status));
        for (size_t i = 0; i < NB / 4; i++)
            if (kt_check_read(&r, li[i], 0x51, ri[i], round) != 0)
                KT_FAIL("initiator %s, target %s: read block %u <- %u wrong", modes[wi], modes[ti],
                        li[i], ri[i]);
    }
    kt_target_counters(&tg, &c1);
    pthread_mutex_lock(&log_lock);
    snprintf(line, sizeof(line), "%s", path_line);
    pthread_mutex_unlock(&log_lock);
    kt_log("initiator %-6s target %-6s: writes by rendezvous %llu of %llu, read data by "
           "rendezvous %llu, refused %llu; log: %s",
           modes[wi], modes[ti], (unsigned long long)(c1.rndv_landed - c0.rndv_landed),
           (unsigned long long)(c1.writes_landed - c0.writes_landed),
           (unsigned long long)(c1.rndv_served - c0.rndv_served),
           (unsigned long long)(c1.drop_other - c0.drop_other), line);
    KT_EQ(c1.drop_other - c0.drop_other, 0);
    KT_EQ(c1.bytes_landed - c0.bytes_landed, 2 * (NB / 4) * BL);
    if (w_rndv) /* every run: 1 contiguous run, then 8 */
        KT_EQ(c1.rndv_landed - c0.rndv_landed, 1 + NB / 4);
    else
        KT_EQ(c1.rndv_landed - c0.rndv_landed, 0);
    if (r_rndv)
        KT_CHECK(c1.rndv_served - c0.rndv_served >= 1 + NB / 4);
    else
        KT_EQ(c1.rndv_served - c0.rndv_served, 0);
    /* the log names the path and the reason */
    KT_CHECK(line[0] != '\0');
    KT_CHECK(strstr(line, w_rndv ? ": rendezvous for every run: KVX_RNDV_ALWAYS" : ": eager: ") !=
             NULL);
    if (mode_val[wi] == KVX_RNDV_EAGER)
        KT_CHECK(strstr(line, "this transport chose KVX_RNDV_EAGER") != NULL);
    else if (mode_val[ti] == KVX_RNDV_EAGER)
        KT_CHECK(strstr(line, "the peer takes no rendezvous payloads") != NULL);
    else if (mode_val[wi] == KVX_RNDV_AUTO)
        KT_CHECK(strstr(line, "is a copy, not zero-copy RMA") != NULL);

    KT_EQ(kvx_peer_remove(t, "target"), 1);
    kvx_transport_destroy(t);
    kt_region_free(&r);
    KT_EQ(kt_target_stop(&tg), 0);
}

int main(int argc, char **argv)
{
    const char *lane = argc > 1 ? argv[1] : "shm";
    uint64_t round = 1;

    setenv("UCX_TLS", strcmp(lane, "tcp") == 0 ? "tcp" : "sm", 1);
    unsetenv("KT_RNDV_THRESH");
    for (int wi = 0; wi < 3; wi++)
        for (int ti = 0; ti < 3; ti++)
            pair(wi, ti, round++);
    return 0;
}
