/*
 * kvx-bench: kvx's benchmark and main job, in the habits of ucx_perftest. No address: serve
 * target regions. An address: run transfers against it. --loopback: fork the targets here.
 * Every run verifies the bytes that landed unless --no-verify. This file only dispatches: the
 * processes of --loopback, and which mode an initiator runs. opts.c parses the options, ctl.c
 * is the control channel, server.c the targets, client.c the initiator, load.c --load, hol.c
 * --hol, ranges.c --regions, regcost.c --reg-cost, report.c the results, util.c what several of
 * them use.
 */
#include "client.h"
#include "ctl.h"
#include "hol.h"
#include "load.h"
#include "opts.h"
#include "ranges.h"
#include "regcost.h"
#include "report.h"
#include "server.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* One initiator: connect to every server, run the mode, say goodbye, print. 1 when a byte was
 * wrong. */
static int initiator_run(const struct opts *o)
{
    int ctl[MAX_PEERS];
    result_t res[MAX_SIZES * 2];
    int nres = 0, bad = 0;

    for (int i = 0; i < o->naddrs; i++)
        ctl[i] = connect_to(o->addrs[i], o->port);
    if (o->hol) {
        bad = hol_run(o, ctl);
        for (int i = 0; i < o->naddrs; i++)
            ctl_bye(ctl[i]);
        if (bad)
            fprintf(stderr, "kvx-bench: verification FAILED\n");
        return bad;
    }
    for (int s = 0; s < (o->regions > 0 ? 1 : o->nsizes); s++) {
        if (o->regions > 0)
            ranges_run(o, ctl, res, &nres);
        else if (o->load_s > 0)
            load_run(o, ctl, o->sizes[s], res, &nres);
        else
            client_run_size(o, ctl, o->sizes[s], res, &nres);
    }
    for (int i = 0; i < o->naddrs; i++)
        ctl_bye(ctl[i]);
    report_print(o, res, nres);
    for (int i = 0; i < nres; i++)
        if (res[i].bad)
            bad = 1;
    if (bad)
        fprintf(stderr, "kvx-bench: verification FAILED\n");
    return bad;
}

/* Fork o->peers servers on 127.0.0.1, any port, and add their addresses to o. */
static void fork_servers(struct opts *o, pid_t *pids)
{
    static char addr[MAX_PEERS][32];

    for (int i = 0; i < o->peers; i++) {
        int port, lfd = listen_on("127.0.0.1", 0, &port);
        fflush(NULL);
        pids[i] = fork();
        if (pids[i] < 0)
            die("fork: %s", strerror(errno));
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            _exit(server_run(lfd, true, o));
        }
        close(lfd);
        snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", port);
        o->addrs[o->naddrs++] = addr[i];
    }
}

/* Several initiators into the target(s): each a process of its own, on its slice of the target
 * region, started together by the target's barrier; their JSON lines are read back and printed
 * with their aggregate. */
static int fork_initiators(const struct opts *o)
{
    pid_t cp[MAX_INITIATORS];
    FILE *outs[MAX_INITIATORS];
    result_t res[(MAX_INITIATORS + 1) * MAX_SIZES * 2]; /* every line, and their aggregates */
    int n, st, rc = 0, bad = 0;

    if (o->clients > MAX_INITIATORS)
        die("at most %d initiators", MAX_INITIATORS);
    for (int k = 0; k < o->clients; k++) {
        int pfd[2];
        if (pipe(pfd) < 0)
            die("pipe: %s", strerror(errno));
        fflush(NULL);
        cp[k] = fork();
        if (cp[k] == 0) {
            struct opts mine = *o;
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(pfd[0]);
            dup2(pfd[1], 1);
            mine.client_index = k;
            mine.json = mine.quiet = true;
            _exit(initiator_run(&mine));
        }
        close(pfd[1]);
        outs[k] = fdopen(pfd[0], "r");
    }
    n = report_collect(outs, o->clients, res, (int)(sizeof(res) / sizeof(res[0])));
    for (int k = 0; k < o->clients; k++) {
        fclose(outs[k]);
        waitpid(cp[k], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            rc = 1;
    }
    report_print(o, res, n);
    for (int i = 0; i < n; i++)
        bad |= res[i].bad != 0;
    if (bad)
        fprintf(stderr, "kvx-bench: verification FAILED\n");
    return rc | bad;
}

/* --loopback: the servers and the initiator(s), all here. */
static int loopback(struct opts *o)
{
    pid_t pids[MAX_PEERS];
    int rc, st, status = 0;

    fork_servers(o, pids);
    rc = o->clients > 1 ? fork_initiators(o) : initiator_run(o);
    for (int i = 0; i < o->peers; i++) {
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            status = 1;
    }
    return rc ? rc : status;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rc = opts_parse(&o, argc, argv);

    if (rc >= 0)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    if (o.reg_cost > 0) /* no server, no peer */
        return regcost_run(&o);
    if (o.loopback)
        return loopback(&o);
    if (o.naddrs == 0) {
        int port, lfd = listen_on(o.bind, o.port, &port);
        fprintf(stderr, "kvx-bench: serving on %s port %d\n", o.bind ? o.bind : "127.0.0.1", port);
        return server_run(lfd, false, &o);
    }
    return initiator_run(&o);
}
