/*
 * 1,000 add/remove cycles of one peer leave no trace: the same open file descriptors, ours and
 * the target's, no kvx object left behind, resident memory within bounds. argv[1]: shm or tcp.
 *
 * UCX reclaims the endpoint a removed peer leaves on the target's side at the target's next
 * keepalive round (about a second; kvx checks every endpoint per round), and its memory pools
 * keep their high-water mark. So a first batch of cycles reaches steady state, the counts settle,
 * and a second batch of 1,000 is measured against it.
 */
#include "harness.h"
#include "kvx_int.h"

#include <dirent.h>
#include <string.h>
#include <unistd.h>

typedef struct usage {
    int fds, tfds;
    long rss, trss;
} usage_t;

static int count_fds(pid_t pid)
{
    char path[64];
    DIR *d;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    d = opendir(path);
    KT_CHECK(d != NULL);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n - 2;
}

static long rss_kb(pid_t pid)
{
    char path[64];
    long pages = 0, resident = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
    f = fopen(path, "r");
    KT_CHECK(f != NULL);
    KT_CHECK(fscanf(f, "%ld %ld", &pages, &resident) == 2);
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Wait until descriptor counts and resident sizes have held still for 2.5 s, two keepalive
 * rounds (at most 20 s), then sample. */
static usage_t settle(pid_t target)
{
    usage_t u = {count_fds(getpid()), count_fds(target), rss_kb(getpid()), rss_kb(target)};
    uint64_t stable_since = kt_now_ns(), end = stable_since + 20000000000ull;

    while (kt_now_ns() < end && kt_now_ns() - stable_since < 2500000000ull) {
        usleep(100000);
        usage_t v = {count_fds(getpid()), count_fds(target), rss_kb(getpid()), rss_kb(target)};
        if (v.fds != u.fds || v.tfds != u.tfds || labs(v.rss - u.rss) > 64 ||
            labs(v.trss - u.trss) > 64) {
            u = v;
            stable_since = kt_now_ns();
        }
    }
    return u;
}

static void write_once(kvx_transport_t *t, kt_target_t *tg, uint32_t blk)
{
    kvx_completion_t c;
    uint64_t id;
    KT_OK(kvx_xfer_write(t, "churn", &blk, &blk, 1, NULL, &id));
    KT_EQ(kt_poll_n(t, "churn", &c, 1, 5000), 1);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(tg, &blk, &blk, 1, 0x66, 0), 0);
}

static void cycles(kvx_transport_t *t, kt_target_t *tg, int n)
{
    for (int i = 0; i < n; i++) {
        KT_OK(kvx_peer_add(t, "churn", tg->md, tg->md_len, NULL));
        if (i % 100 == 0)
            write_once(t, tg, (uint32_t)(i / 100) % 16);
        KT_EQ(kvx_peer_remove(t, "churn"), 1);
    }
}

int main(int argc, char **argv)
{
    kt_target_args_t a = {
        .num_blocks = 16, .block_len = 4096, .salt = 3, .threads = 1, .name = "churn-target"};
    kt_target_t tg;
    kt_region_t r = kt_region_alloc(16, 4096);
    kvx_transport_t *t;
    usage_t u0, u1;

    bool tcp = argc > 1 && strcmp(argv[1], "tcp") == 0;

    if (tcp)
        setenv("UCX_TLS", "tcp", 1);
    tg = kt_target_start(&a);
    kt_fill_all(&r, 0x66, 0);
    t = kt_transport(&r, "churner", 1);

    cycles(t, &tg, 1000);
    u0 = settle(tg.proc.pid);
    cycles(t, &tg, 1000);
    u1 = settle(tg.proc.pid);
    kt_log("1000 cycles: fds %d -> %d, rss %ld -> %ld KiB; target fds %d -> %d, rss %ld -> %ld "
           "KiB",
           u0.fds, u1.fds, u0.rss, u1.rss, u0.tfds, u1.tfds, u0.trss, u1.trss);
    KT_EQ(u1.fds, u0.fds);
    KT_EQ(u1.tfds, u0.tfds);
    /* kvx's own objects: nothing accumulates (exact) */
    KT_EQ(t->core.peers.n, 0);
    KT_CHECK(kvx_list_empty(&t->conns.all));
    KT_CHECK(kvx_list_empty(&t->core.active));
    KT_EQ(t->core.nlive, 0);
    KT_CHECK(t->core.nfree <= 64);
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer holds freed memory in quarantine: sizes mean nothing, LSan checks leaks */
    (void)tcp;
#else
    /* The processes' resident sizes: UCX's buffer pools grow to the number of connections still
     * lingering at once and never shrink, which varies with timing (on tcp, by up to 3 MiB
     * between two batches when other tests share the CPUs). The bounds catch a leak of a few
     * KiB per cycle; kvx's own objects are counted exactly above. */
    KT_CHECK(u1.rss - u0.rss < (tcp ? 8192 : 1024));
    KT_CHECK(u1.trss - u0.trss < (tcp ? 8192 : 1024));
#endif

    KT_OK(kvx_peer_add(t, "churn", tg.md, tg.md_len, NULL));
    write_once(t, &tg, 5);
    kvx_transport_destroy(t);
    kt_region_free(&r);
    KT_EQ(kt_target_stop(&tg), 0);
    return 0;
}
