/*
 * The engine's life: made with the layers it steps, its hooks installed in the core (through
 * which the layers below wake what waits on the transport, and kvx_core_wait sleeps), closed with
 * the transport, its descriptors freed.
 */
#include "engine/kvx_engine.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

static void kvx_hook_kick(void *arg, uint64_t when_ns) { kvx_kick(arg, when_ns); }
static void kvx_hook_arrived(void *arg) { kvx_notify_waiters(arg); }
static void kvx_hook_polls_changed(void *arg) { kvx_events_update(arg); }
/* kvx_core_wait's sleep: a step first when the call must not wait for the progress thread's
 * next wake-up (a receive that ended, or the close that ends it). */
static void kvx_hook_sleep(void *arg, uint64_t until_ns, bool step)
{
    if (step)
        kvx_progress_step(arg);
    kvx_progress_wait_event(arg, until_ns);
}

int kvx_engine_init(kvx_engine_t *e, kvx_core_t *core, kvx_conns_t *conns, kvx_recv_t *recv,
                    kvx_peers_t *peers)
{
    e->core = core;
    e->conns = conns;
    e->recv = recv;
    e->peers = peers;
    e->wake_fd = -1;
    for (unsigned m = 0; m <= KVX_EVENT_ALL; m++)
        e->evfd[m].fd = -1;
    e->spin_ns = KVX_SPIN_NS;
    e->cq_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC | EFD_SEMAPHORE);
    if (e->cq_fd < 0)
        return -errno;
    core->hooks = (kvx_core_hooks_t){.arg = e,
                                     .kick = kvx_hook_kick,
                                     .arrived = kvx_hook_arrived,
                                     .polls_changed = kvx_hook_polls_changed,
                                     .sleep = kvx_hook_sleep};
    return 0;
}

void kvx_engine_closed(kvx_engine_t *e)
{
    close(e->cq_fd);
    e->cq_fd = -1;
    kvx_events_closed(e); /* a loop waiting on one wakes, and its calls say closed */
}

void kvx_engine_fini(kvx_engine_t *e)
{
    if (e->cq_fd >= 0)
        close(e->cq_fd);
    e->cq_fd = -1;
    for (unsigned m = 1; m <= KVX_EVENT_ALL; m++) {
        if (e->evfd[m].fd >= 0)
            close(e->evfd[m].fd);
        e->evfd[m].fd = -1;
    }
}
