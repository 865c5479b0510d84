/*
 * The receiving side's calls: fences of writers (kvx_fence_ex: the records are recv/fence.c's;
 * a fence waits for the rendezvous receives of writes it covers) and the arrival notices
 * (kvx_notice_poll: a poll runs one progress step first, so that a caller that only polls still
 * advances).
 */
#include "api/transport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int kvx_tag_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* How long a fence waits for the rendezvous receives of fenced writes in flight to end (the stall
 * limit when shorter), before it closes their connections. */
#define KVX_FENCE_RNDV_WAIT_NS (1000ull * 1000000ull)
/* ... and how long for UCX to end them once their connections closed (it does in its next
 * progress: measured at once on UCX 1.13.1 and 1.19.1). */
#define KVX_FENCE_RNDV_END_NS (100ull * 1000000ull)

/*
 * A fence returns with no rendezvous receive of a write it covers in flight (its payload lands
 * in the region while it is): those in flight are waited for, with the lock released, up to
 * KVX_FENCE_RNDV_WAIT_NS (they land: a fence drops what arrives after it, and these arrived
 * before), then their connections close, which ends them (their transfers fail). Lock held.
 */
typedef struct kvx_fence_wait {
    kvx_recv_t *recv;
    const char *writer;
} kvx_fence_wait_t;

static bool kvx_fence_rndvs_ended(void *arg)
{
    kvx_fence_wait_t *fw = arg;
    return kvx_recv_fence_rndvs(fw->recv, fw->writer, false) == 0;
}

/* Wait (lock released) while rendezvous receives a fence covers are in flight, until until_ns.
 * Returns false when the transport closes meanwhile. */
static bool kvx_fence_rndvs_wait(kvx_transport_t *t, const char *writer, uint64_t until_ns)
{
    kvx_fence_wait_t fw = {&t->recv, writer};

    /* this call steps progress itself: a receive that ended (or the close that ends it) must not
     * wait for the progress thread's next wake-up */
    return kvx_core_wait(&t->core, &(kvx_wait_t){.done = kvx_fence_rndvs_ended,
                                                 .arg = &fw,
                                                 .until_ns = until_ns,
                                                 .slice_ns = 1000000ull,
                                                 .step = true}) != -ESHUTDOWN;
}

static void kvx_fence_rndvs(kvx_transport_t *t, const char *writer)
{
    uint64_t wait = t->core.stall_ns != 0 && t->core.stall_ns < KVX_FENCE_RNDV_WAIT_NS
                        ? t->core.stall_ns
                        : KVX_FENCE_RNDV_WAIT_NS;

    if (kvx_recv_fence_rndvs(&t->recv, writer, false) == 0 ||
        !kvx_fence_rndvs_wait(t, writer, kvx_now_ns() + wait))
        return;
    if (kvx_recv_fence_rndvs(&t->recv, writer, true) > 0) {
        kvx_warn(&t->core,
                 "fence of %s: rendezvous receives still in flight after %llu ms: their "
                 "connections close",
                 writer ? writer : "every writer", (unsigned long long)(wait / 1000000));
        kvx_recv_work(&t->recv); /* the closes, now: UCX ends the receives in its next progress */
        kvx_fence_rndvs_wait(t, writer, kvx_now_ns() + KVX_FENCE_RNDV_END_NS);
    }
}

int kvx_fence_ex(kvx_transport_t *t, const char *writer, const uint64_t *tags, size_t ntags,
                 unsigned flags)
{
    uint64_t sorted[KVX_FENCE_TAGS_MAX];
    size_t n = 0;
    int rc;

    if (t == NULL || ntags > KVX_FENCE_TAGS_MAX || (tags == NULL && ntags > 0) ||
        (flags & ~(unsigned)KVX_FENCE_RETIRE) != 0 ||
        (writer != NULL && (strnlen(writer, KVX_NAME_MAX + 1) == 0 ||
                            strnlen(writer, KVX_NAME_MAX + 1) > KVX_NAME_MAX)))
        return -EINVAL;
    /* the distinct tags, sorted: one record each */
    if (ntags > 0) {
        memcpy(sorted, tags, ntags * sizeof(tags[0]));
        qsort(sorted, ntags, sizeof(sorted[0]), kvx_tag_cmp);
        for (size_t k = 0; k < ntags; k++)
            if (n == 0 || sorted[k] != sorted[n - 1])
                sorted[n++] = sorted[k];
    }
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    /* what can fail comes first (the bounds, memory, the new capability): on error nothing is
     * fenced and the capability stays */
    rc = kvx_recv_fence_prepare(&t->recv, writer, sorted, n);
    if (rc == 0 && (flags & KVX_FENCE_RETIRE))
        rc = kvx_transport_retire(t);
    if (rc < 0) {
        kvx_warn(&t->core, "fence of %s: %s; nothing fenced", writer ? writer : "every writer",
                 kvx_strerror(rc));
        kvx_unlock(&t->core);
        return rc;
    }
    rc = kvx_recv_fence(&t->recv, writer, sorted, n);
    kvx_info(&t->core, "fence of %s%s%s: %d connection(s)", writer ? writer : "every writer",
             n ? " (some tags)" : "", (flags & KVX_FENCE_RETIRE) ? ", capability retired" : "", rc);
    kvx_fence_rndvs(t, writer);
    kvx_unlock(&t->core);
    return rc;
}

int kvx_fence(kvx_transport_t *t, const char *writer, const uint64_t *tags, size_t ntags)
{
    return kvx_fence_ex(t, writer, tags, ntags, 0);
}

int kvx_notice_poll(kvx_transport_t *t, kvx_notice_t *out, size_t max)
{
    size_t n;

    if (t == NULL || (out == NULL && max != 0))
        return -EINVAL;
    if (max > INT32_MAX)
        max = INT32_MAX;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    kvx_progress_step(&t->engine);
    n = kvx_notice_take(&t->recv, out, max);
    kvx_events_update(&t->engine);
    kvx_unlock(&t->core);
    return (int)n;
}

int kvx_notice_poll_data(kvx_transport_t *t, kvx_notice_data_t *out, size_t max, void *buf,
                         size_t cap)
{
    int n;

    if (t == NULL || out == NULL || max == 0 || (buf == NULL && cap > 0))
        return -EINVAL;
    if (max > INT32_MAX)
        max = INT32_MAX;
    if (kvx_enter(&t->core) < 0)
        return -ESHUTDOWN;
    kvx_progress_step(&t->engine);
    n = kvx_notice_take_data(&t->recv, out, max, buf, cap);
    kvx_events_update(&t->engine);
    kvx_unlock(&t->core);
    return n;
}
