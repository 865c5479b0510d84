/*
 * A receiver SIGSTOPped while a writer's transfers are in flight, resumed after that writer
 * went away, must survive and keep serving: a peer that stops answering and then closes must
 * not be able to crash it. "tcp" runs it with UCX_TLS=tcp (peers inherit it), "shm" with UCX's
 * default transports; "rounds=N" (3) rounds of each case, a case's name runs it alone:
 *   close   the writer closes its transport while its writes sit in the stopped target's socket
 *   remove  the writer removes the peer instead (its transport stays, closed later)
 *   hello   the target was stopped before the writer's HELLO reached it: resumed, it finds the
 *           stale HELLO of a writer that is gone
 * After each, the target is resumed, must still be alive 2 s later and must serve a fresh
 * writer, byte for byte, and quit cleanly (exit 0).
 *
 * Over tcp, before the fix, "close" killed the target in every round (UCX 1.13.1 and 1.19.1):
 * resumed, it read the writes, and its first acknowledgement to the writer that had gone failed
 * inside ucp_am_send_nbx, where UCX calls the endpoint's error handler; kvx closed and freed the
 * connection there, under the send that was still using it (SIGSEGV in kvx_recv_flush).
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NB 256
#define BL 65536
#define BIG 192 /* 12 MiB: more than the stopped target's socket buffers take */

static const uint64_t salt = 0x5a, salt2 = 0x77;

/* Still running after ms? Else its exit status (128 + signal when killed), and it is reaped. */
static int alive_for(kt_target_t *tg, unsigned ms)
{
    uint64_t end = kt_now_ns() + ms * 1000000ull;
    int st;

    do {
        pid_t p = waitpid(tg->proc.pid, &st, WNOHANG);
        if (p == tg->proc.pid) {
            tg->proc.pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(10000);
    } while (kt_now_ns() < end);
    return -1;
}

/* A writer that must get through to tg: nblocks written and verified on the target. */
static void serve_check(kt_target_t *tg, const char *name)
{
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_transport_t *t;
    uint32_t li[32], ri[32];
    kvx_completion_t c;
    uint64_t id;

    kt_fill_all(&r, salt2, 0);
    t = kt_transport_ex(&r, name, 1, NULL, 5000);
    for (uint32_t i = 0; i < 32; i++) {
        li[i] = 200 + i;
        ri[i] = (i * 7) % NB;
    }
    KT_OK(kvx_peer_add(t, "p", tg->md, tg->md_len, NULL));
    KT_OK(kvx_xfer_write(t, "p", li, ri, 32, NULL, &id));
    KT_EQ(kt_poll_n(t, "p", &c, 1, 10000), 1);
    KT_EQ(c.id, id);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(tg, ri, li, 32, salt2, 0), 0);
    KT_EQ(kvx_peer_remove(t, "p"), 1);
    kvx_transport_destroy(t);
    kt_region_free(&r);
}

static int run_case(const char *which, int round)
{
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 3, .threads = 1, .name = "resume-target"};
    kt_target_t tg = kt_target_start(&a);
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_transport_t *t = kt_transport_ex(&r, "resume-writer", 1, NULL, 5000);
    bool hello = strcmp(which, "hello") == 0, remove = strcmp(which, "remove") == 0;
    uint32_t li[NB];
    uint64_t id[2];
    int st;

    kt_fill_all(&r, salt, 0);
    for (uint32_t i = 0; i < NB; i++)
        li[i] = i;
    if (hello) {
        kt_stop(&tg.proc);
        KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL)); /* unanswered: 200 ms */
    } else {
        kvx_completion_t c;
        KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
        KT_OK(kvx_xfer_write(t, "p", li, li, 8, NULL, &id[0]));
        KT_EQ(kt_poll_n(t, "p", &c, 1, 10000), 1);
        KT_EQ(c.status, 0);
        KT_EQ(kt_target_verify(&tg, li, li, 8, salt, 0), 0);
        kt_stop(&tg.proc);
    }
    KT_OK(kvx_xfer_write(t, "p", li, li, BIG, NULL, &id[0]));
    KT_OK(kvx_xfer_write(t, "p", li + BIG, li + BIG, 16, NULL, &id[1]));
    usleep(300000); /* the writer's progress thread hands what it can to UCX */
    if (remove) {
        KT_EQ(kvx_peer_remove(t, "p"), 1);
        usleep(100000);
    } else {
        kvx_transport_destroy(t);
        t = NULL;
    }
    kt_cont(&tg.proc);
    st = alive_for(&tg, 2000);
    if (st >= 0) {
        kt_log("FAIL %s round %d: the resumed target died: %s %d", which, round,
               st > 128 ? "signal" : "exit", st > 128 ? st - 128 : st);
        close(tg.proc.sock);
        free(tg.md);
        if (t != NULL)
            kvx_transport_destroy(t);
        kt_region_free(&r);
        return 1;
    }
    serve_check(&tg, "resume-writer-2");
    if (t != NULL)
        kvx_transport_destroy(t);
    st = kt_target_stop(&tg);
    kt_region_free(&r);
    if (st != 0) {
        kt_log("FAIL %s round %d: the target ended with %d", which, round, st);
        return 1;
    }
    kt_log("%s round %d: the resumed target lived and served a new writer, byte for byte", which,
           round);
    return 0;
}

int main(int argc, char **argv)
{
    static const char *cases[] = {"close", "remove", "hello"};
    const char *only = NULL;
    int rounds = 3, failed = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "shm") == 0)
            continue;
        else if (strcmp(argv[i], "tcp") == 0)
            setenv("UCX_TLS", "tcp", 1); /* the targets inherit it */
        else if (strncmp(argv[i], "rounds=", 7) == 0)
            rounds = atoi(argv[i] + 7);
        else
            only = argv[i];
    }
    signal(SIGPIPE, SIG_IGN);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        if (only != NULL && strcmp(only, cases[c]) != 0)
            continue;
        for (int i = 0; i < rounds; i++)
            failed += run_case(cases[c], i);
    }
    return failed ? 1 : 0;
}
