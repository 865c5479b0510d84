/*
 * The progress thread: the passive target's, which runs the progress step so that peers'
 * transfers into this region complete while the application never calls kvx. Idle, it sleeps on
 * the worker's event fd; while the application polls (and so drives UCX itself), it steps aside
 * (KVX_THREAD_YIELDS; kvx_engine_app_polled says when).
 */
#include "engine/kvx_engine.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Spinning with nothing to do for this long, the thread yields its core at each step: a target
 * among many on few cores then gives its time to those with work (8 targets on 2 cores went from
 * 0.5x to 0.7-0.8x one target's rate), while a reply that comes sooner is still caught at once. */
#define KVX_YIELD_AFTER_NS 5000ull
/* An application that polled this recently is driving UCX itself. */
#define KVX_APP_ACTIVE_NS 1000000ull

static void *kvx_progress_main(void *arg)
{
    kvx_engine_t *e = arg;
    kvx_rest_t rest;
    uint64_t now, until;
    bool stalled, refused;

    kvx_rest_init(&rest, kvx_now_ns());
    pthread_mutex_lock(&e->core->lock);
    while (!e->thread_stop) {
        now = kvx_now_ns();
        if (now - atomic_load_explicit(&e->app_poll_ns, memory_order_relaxed) < KVX_APP_ACTIVE_NS) {
            /* The application is polling, and its polls drive UCX: two threads taking turns on
             * one worker only slow each other down. Step aside, and look again each
             * KVX_APP_ACTIVE_NS without the lock for as long as the application keeps polling:
             * taking the lock only to let it go again made the application's unlocks wake this
             * thread (a futex call in its posting path, some 3,000 a second). A stop (the wake
             * fd) ends the step aside at once. */
            struct pollfd wake = {.fd = e->wake_fd, .events = POLLIN};
            uint64_t v, since;
            e->thread_asides++;
            pthread_mutex_unlock(&e->core->lock);
            /* sleep until KVX_APP_ACTIVE_NS after the application's latest poll, no longer */
            while ((since = kvx_now_ns() -
                            atomic_load_explicit(&e->app_poll_ns, memory_order_relaxed)) <
                   KVX_APP_ACTIVE_NS) {
                struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(KVX_APP_ACTIVE_NS - since)};
                if (ppoll(&wake, 1, &ts, NULL) > 0) {
                    if (read(e->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                        kvx_warn(e->core, "progress: reading wake fd: %s", strerror(errno));
                    break;
                }
            }
            pthread_mutex_lock(&e->core->lock);
            rest.last_work = kvx_now_ns();
            continue;
        }
        unsigned n = kvx_progress_step(e);
        now = kvx_now_ns();
        until = kvx_progress_rest(e, &rest, n, now, &stalled);
        if (until == 0) {
            pthread_mutex_unlock(&e->core->lock);
            if ((n == 0 && now - rest.last_work > KVX_YIELD_AFTER_NS) ||
                atomic_load_explicit(&e->core->lock_waiters, memory_order_relaxed) > 0)
                sched_yield();
            pthread_mutex_lock(&e->core->lock);
            continue;
        }
        e->thread_sleeping = true;
        e->thread_wake_at_ns = until;
        refused = kvx_progress_sleep(e, e->wake_fd, now, until, stalled);
        e->thread_sleeping = false;
        kvx_rest_woke(&rest, stalled, refused);
    }
    pthread_mutex_unlock(&e->core->lock);
    return NULL;
}

int kvx_progress_start(kvx_engine_t *e)
{
    sigset_t all, old;
    int rc;

    e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e->wake_fd < 0) {
        rc = -errno;
        kvx_error(e->core, "progress: eventfd: %s", strerror(errno));
        return rc;
    }
    e->thread_stop = false;
    /* the thread takes no signals: they belong to the application's threads */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = -pthread_create(&e->thread, NULL, kvx_progress_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc < 0) {
        kvx_error(e->core, "progress: pthread_create: %s", strerror(-rc));
        close(e->wake_fd);
        e->wake_fd = -1;
        return rc;
    }
    e->thread_running = true;
    return 0;
}

void kvx_progress_stop(kvx_engine_t *e)
{
    uint64_t one = 1;

    kvx_lock(e->core);
    if (!e->thread_running) {
        kvx_unlock(e->core);
        return;
    }
    e->thread_stop = true;
    if (write(e->wake_fd, &one, sizeof(one)) < 0)
        kvx_warn(e->core, "progress: waking thread to stop: %s", strerror(errno));
    kvx_unlock(e->core);
    pthread_join(e->thread, NULL);
    close(e->wake_fd);
    e->wake_fd = -1;
    e->thread_running = false;
}
