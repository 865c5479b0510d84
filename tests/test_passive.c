/*
 * Passive target: the target's application never calls kvx after exporting its metadata, yet
 * writes into it and reads from it complete, because its progress thread drives UCX. Idle, that
 * thread sleeps: the target process must use well under 1% of a core. A target without a
 * progress thread shows why it is needed: the write cannot complete.
 */
#include "harness.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define BL 65536
#define NB 256

/* CPU seconds (user + system) used so far by process pid. */
static double proc_cpu(pid_t pid)
{
    char path[64], line[1024];
    unsigned long ut, st;
    FILE *f;
    const char *p;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    KT_CHECK(f != NULL);
    KT_CHECK(fgets(line, sizeof(line), f) != NULL);
    fclose(f);
    p = strrchr(line, ')');
    KT_CHECK(p != NULL);
    /* fields after the name: state(3) ... utime(14) stime(15) */
    KT_CHECK(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

int main(void)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 2, .threads = 1, .name = "passive"};
    kt_target_t tg = kt_target_start(&a);
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_transport_t *t = kt_transport(&r, "active", 1);
    uint32_t li[64], ri[64];
    kvx_completion_t c[2];
    uint64_t id;
    double cpu0, cpu1;

    kt_fill_all(&r, 0x55, 0);
    KT_OK(kvx_peer_add(t, "tgt", tg.md, tg.md_len, NULL));
    /* write our blocks L into the target's R, read R back into our blocks D (disjoint from L):
     * the round trip must return exactly what we sent */
    uint32_t di[64];
    kt_indices(li, 64, NB / 2, true, 1);
    kt_indices(ri, 64, NB, true, 2);
    for (uint32_t i = 0; i < 64; i++)
        di[i] = NB / 2 + i;
    for (int round = 1; round <= 3; round++) {
        for (int i = 0; i < 64; i++)
            kt_fill(&r, li[i], 0x55, li[i], (uint64_t)round);
        KT_OK(kvx_xfer_write(t, "tgt", li, ri, 64, NULL, &id));
        KT_EQ(kt_poll_n(t, "tgt", c, 1, 10000), 1);
        KT_EQ(c[0].status, 0);
        KT_EQ(kt_target_verify(&tg, ri, li, 64, 0x55, (uint64_t)round), 0);
        KT_OK(kvx_xfer_read(t, "tgt", di, ri, 64, NULL, &id));
        KT_EQ(kt_poll_n(t, "tgt", c, 1, 10000), 1);
        KT_EQ(c[0].status, 0);
        for (int i = 0; i < 64; i++)
            KT_EQ(kt_check(&r, di[i], 0x55, li[i], (uint64_t)round), 0);
    }

    /* idle: the target has nothing to do for 2 s */
    cpu0 = proc_cpu(tg.proc.pid);
    usleep(2000000);
    cpu1 = proc_cpu(tg.proc.pid);
    kt_log("idle target used %.3f s of CPU in 2 s", cpu1 - cpu0);
    KT_CHECK(cpu1 - cpu0 < 0.1); /* 5% of a core; measured: 0.00 */

    /* no progress thread on the target: nothing drives its worker, the write cannot finish */
    kt_target_args_t b = a;
    b.threads = 0;
    b.name = "no-thread";
    kt_target_t dead = kt_target_start(&b);
    KT_OK(kvx_peer_add(t, "nothread", dead.md, dead.md_len, NULL));
    KT_OK(kvx_xfer_write(t, "nothread", li, ri, 64, NULL, &id));
    KT_EQ(kt_poll_n(t, "nothread", c, 1, 500), 0);
    KT_EQ(kvx_peer_remove(t, "nothread"), 1);
    KT_EQ(kt_poll_n(t, "nothread", c, 1, 1000), 1);
    KT_ERR(c[0].status, -ECONNABORTED);

    kvx_transport_destroy(t);
    kt_region_free(&r);
    KT_EQ(kt_target_stop(&tg), 0);
    KT_EQ(kt_target_stop(&dead), 0);
    return 0;
}
