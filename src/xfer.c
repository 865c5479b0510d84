/*
 * Where a transfer is born and travels: index checks, coalescing into runs, posting the runs to
 * UCX with back-pressure, the closing flush, and per-transfer deadlines.
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdlib.h>

/* Operation requests UCX may hold per connection before kvx stops posting (UCX queues what its
 * transport cannot take at once; kvx keeps the rest in its own queue, where it can still be
 * canceled cheaply). */
#define KVX_MAX_REQS 16
/* Bytes the submitting thread posts itself before leaving the rest to the progress engine: small
 * transfers go out at once, large ones do not hold the caller for the whole copy. */
#define KVX_INLINE_BUDGET ((size_t)256 * 1024)
/* The largest UCX operation kvx posts: a run of blocks consecutive on both sides is posted in
 * pieces of at most this, so that an operation completes well within the stall limit even on a
 * slow link (1 MiB at 100 MB/s: 10 ms), and a large run does not hold UCX for seconds. */
#define KVX_OP_MAX ((size_t)1 << 20)
/* How long a closing connection may take before its transfers are reported anyway. */
#define KVX_CLOSE_GRACE_NS (2ull * 1000000000ull)

/* Check every index and fold runs consecutive on both sides. O(count), no allocation once the
 * transfer slot has seen a transfer this large. */
static int kvx_xfer_build_runs(kvx_transport_t *t, kvx_xfer_t *x, uint64_t remote_num_blocks,
                               const uint32_t *local, const uint32_t *remote, size_t count)
{
    kvx_run_t *r;
    uint32_t nruns = 0;

    if (x->runs_cap < count) {
        size_t cap = count < 16 ? 16 : count;
        kvx_run_t *runs = realloc(x->runs, cap * sizeof(*runs));
        if (runs == NULL)
            return -ENOMEM;
        x->runs = runs;
        x->runs_cap = (uint32_t)cap;
    }
    r = x->runs - 1;
    for (size_t i = 0; i < count; i++) {
        uint32_t l = local[i], rm = remote[i];

        if (l >= t->num_blocks || rm >= remote_num_blocks) {
            kvx_debug(t, "index %zu out of range: local %u of %llu, remote %u of %llu", i, l,
                      (unsigned long long)t->num_blocks, rm, (unsigned long long)remote_num_blocks);
            return -EINVAL;
        }
        if (nruns > 0 && l == r->local + r->count && rm == r->remote + r->count) {
            r->count++;
        } else {
            r++;
            r->local = l;
            r->remote = rm;
            r->count = 1;
            nruns++;
        }
    }
    x->nruns = nruns;
    return 0;
}

static int kvx_xfer_submit(kvx_transport_t *t, int op, const char *peer_id, const uint32_t *local,
                           const uint32_t *remote, size_t count, const kvx_xfer_params_t *params,
                           uint64_t *id_p)
{
    uint64_t deadline_ms, now;
    kvx_peer_t *p;
    kvx_conn_t *c;
    kvx_xfer_t *x;
    bool was_idle;
    int rc;

    if (t == NULL || peer_id == NULL || id_p == NULL || (count != 0 && (!local || !remote)) ||
        count > UINT32_MAX || count > UINT64_MAX / t->block_len ||
        (params != NULL && (params->field_mask & KVX_XFER_PARAM_DEADLINE) &&
         params->deadline_ms > KVX_MS_MAX))
        return -EINVAL;
    kvx_lock(t);
    if (t->closed) {
        rc = -ESHUTDOWN;
        goto out;
    }
    deadline_ms = t->deadline_ns / 1000000ull;
    if (params != NULL && (params->field_mask & KVX_XFER_PARAM_DEADLINE))
        deadline_ms = params->deadline_ms; /* at most KVX_MS_MAX: no overflow below */

    p = kvx_peer_lookup(t, peer_id);
    if (p == NULL || p->conn == NULL) {
        kvx_debug(t, "submit: unknown peer '%s'", peer_id);
        rc = -ENOENT;
        goto out;
    }
    c = p->conn;
    if (c->state != KVX_CONN_OPEN) {
        rc = -ENOTCONN;
        goto out;
    }
    rc = kvx_xfer_alloc(t, &x);
    if (rc < 0)
        goto out;
    rc = kvx_xfer_build_runs(t, x, c->remote_num_blocks, local, remote, count);
    if (rc < 0) {
        kvx_xfer_free(t, x);
        goto out;
    }
    now = kvx_now_ns();
    x->op = (uint8_t)op;
    x->peer = p;
    x->conn = c;
    x->bytes = (uint64_t)count * t->block_len;
    x->t_submit_ns = now;
    x->deadline_ns = deadline_ms ? now + deadline_ms * 1000000ull : 0;
    x->state = KVX_XS_QUEUED;
    p->nxfers++;
    p->inflight++;
    /* leaving idle: a progress thread asleep for a long tick looks again soon (stall and
     * liveness checks run every KVX_HOUSEKEEPING_NS while transfers are in flight) */
    if (kvx_list_empty(&t->active))
        kvx_progress_kick(t, now + KVX_HOUSEKEEPING_NS);
    kvx_list_add_tail(&t->active, &x->active_link);
    if (x->deadline_ns != 0 && x->deadline_ns < t->next_deadline_ns) {
        t->next_deadline_ns = x->deadline_ns;
        kvx_progress_kick(t, x->deadline_ns);
    }
    was_idle = kvx_list_empty(&c->queue);
    kvx_list_add_tail(&c->queue, &x->conn_link);
    *id_p = x->id;
    if (was_idle)
        kvx_xfer_post(c, KVX_INLINE_BUDGET);
    if (c->state == KVX_CONN_OPEN && !kvx_list_empty(&c->queue) && c->reqs < KVX_MAX_REQS) {
        if (!kvx_list_linked(&c->work_link))
            kvx_list_add_tail(&t->work, &c->work_link);
        kvx_progress_kick(t, 0);
    }
    rc = 0;
out:
    kvx_unlock(t);
    return rc;
}

int kvx_xfer_write(kvx_transport_t *t, const char *peer_id, const uint32_t *local_idxs,
                   const uint32_t *remote_idxs, size_t count, const kvx_xfer_params_t *params,
                   uint64_t *id_p)
{
    return kvx_xfer_submit(t, KVX_OP_WRITE, peer_id, local_idxs, remote_idxs, count, params, id_p);
}

int kvx_xfer_read(kvx_transport_t *t, const char *peer_id, const uint32_t *local_idxs,
                  const uint32_t *remote_idxs, size_t count, const kvx_xfer_params_t *params,
                  uint64_t *id_p)
{
    return kvx_xfer_submit(t, KVX_OP_READ, peer_id, local_idxs, remote_idxs, count, params, id_p);
}

/* Complete, in posting order, the transfers that the flush numbered seq covers. */
static void kvx_xfer_flushed(kvx_conn_t *c, uint64_t seq)
{
    while (!kvx_list_empty(&c->flushing)) {
        kvx_xfer_t *x = kvx_list_first(&c->flushing, kvx_xfer_t, conn_link);
        if (x->flush_seq == 0 || x->flush_seq > seq)
            break;
        kvx_xfer_complete(x, 0);
    }
}

/*
 * One endpoint flush for every transfer whose runs are all posted and that no flush covers yet.
 * With a flush already in flight this waits for it: on tcp each flush is a message and a
 * system call, so under load one flush covers many transfers, and a lone one still gets its
 * flush at once.
 */
static void kvx_xfer_flush(kvx_conn_t *c)
{
    kvx_flush_t *f;
    uint64_t seq;
    int rc;

    if (c->state != KVX_CONN_OPEN || c->flushes > 0 || kvx_list_empty(&c->flushing) ||
        kvx_container_of(c->flushing.prev, kvx_xfer_t, conn_link)->flush_seq != 0)
        return;
    f = c->free_flushes;
    if (f != NULL) {
        c->free_flushes = f->next_free;
    } else if ((f = malloc(sizeof(*f))) == NULL) {
        kvx_conn_fail(c, -ENOMEM);
        return;
    }
    seq = ++c->flush_seq;
    for (kvx_list_t *n = c->flushing.prev; n != &c->flushing; n = n->prev) {
        kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, conn_link);
        if (x->flush_seq != 0)
            break;
        x->flush_seq = seq;
    }
    f->conn = c;
    f->seq = seq;
    if (!kvx_conn_busy(c))
        c->last_progress_ns = kvx_now_ns();
    rc = kvx_ucx_flush(c, f);
    if (rc == 1) {
        c->flushes++;
        return;
    }
    f->next_free = c->free_flushes;
    c->free_flushes = f;
    if (rc == 0) {
        kvx_xfer_flushed(c, seq);
        return;
    }
    kvx_error(c->t, "flushing to %s: %s", c->agent_name, kvx_strerror(rc));
    kvx_conn_fail(c, rc);
}

void kvx_xfer_free_flushes(kvx_conn_t *c)
{
    while (c->free_flushes != NULL) {
        kvx_flush_t *f = c->free_flushes;
        c->free_flushes = f->next_free;
        free(f);
    }
}

/*
 * Hand queued runs to UCX, oldest transfer first, until the queue is empty, UCX holds
 * KVX_MAX_REQS requests (kvx_on_op_done resumes), or the next run would exceed budget bytes.
 * Transfers whose runs are all posted then get a flush: its completion means their bytes all landed
 * remotely.
 */
void kvx_xfer_post(kvx_conn_t *c, size_t budget)
{
    kvx_transport_t *t = c->t;
    int rc;

    while (c->state == KVX_CONN_OPEN && !kvx_list_empty(&c->queue)) {
        kvx_xfer_t *x = kvx_list_first(&c->queue, kvx_xfer_t, conn_link);

        while (x->next_run < x->nruns) {
            const kvx_run_t *r = &x->runs[x->next_run];
            uint64_t run_len = (uint64_t)r->count * t->block_len;
            size_t len =
                run_len - x->run_off < KVX_OP_MAX ? (size_t)(run_len - x->run_off) : KVX_OP_MAX;

            /* a piece larger than what is left of the budget waits for the progress engine:
             * the submitting thread never copies more than its budget */
            if (c->reqs >= KVX_MAX_REQS || len > budget)
                goto flush;
            if (!kvx_conn_busy(c)) /* the stall clock starts with the first outstanding op */
                c->last_progress_ns = kvx_now_ns();
            rc = kvx_ucx_rma(c, x->op, t->base + (uint64_t)r->local * t->block_len + x->run_off,
                             c->remote_base + (uint64_t)r->remote * t->block_len + x->run_off, len);
            if (rc < 0) {
                kvx_error(t, "posting to %s: %s", c->agent_name, kvx_strerror(rc));
                kvx_conn_fail(c, rc);
                return;
            }
            x->run_off += len;
            if (x->run_off == run_len) {
                x->next_run++;
                x->run_off = 0;
            }
            budget -= len;
        }
        kvx_list_del(&x->conn_link);
        x->state = KVX_XS_FLUSHING;
        x->flush_seq = 0;
        kvx_list_add_tail(&c->flushing, &x->conn_link);
    }
flush:
    kvx_xfer_flush(c);
}

void kvx_on_flush_done(kvx_flush_t *f, int status)
{
    kvx_conn_t *c = f->conn;
    uint64_t seq = f->seq;

    f->next_free = c->free_flushes;
    c->free_flushes = f;
    c->flushes--;
    c->ucx_refs--;
    c->last_progress_ns = kvx_now_ns();
    if (c->state == KVX_CONN_OPEN) {
        if (status != 0) {
            kvx_on_conn_error(c, status); /* the transfers fail with their connection */
        } else {
            kvx_xfer_flushed(c, seq);
            /* transfers posted meanwhile wait for the next flush: post it outside UCX */
            if (!kvx_list_empty(&c->flushing) && !kvx_list_linked(&c->work_link))
                kvx_list_add_tail(&c->t->work, &c->work_link);
        }
    }
    kvx_conn_maybe_free(c);
}

void kvx_on_op_done(kvx_conn_t *c, int status)
{
    c->reqs--;
    c->ucx_refs--;
    c->last_progress_ns = kvx_now_ns();
    if (c->state == KVX_CONN_OPEN) {
        if (status != 0)
            kvx_on_conn_error(c, status);
        else if (!kvx_list_empty(&c->queue) && !kvx_list_linked(&c->work_link))
            kvx_list_add_tail(&c->t->work, &c->work_link);
    }
    kvx_conn_maybe_free(c);
}

/*
 * Fail transfers past their deadline. One whose bytes never reached UCX fails alone. For one
 * already posted, closing its connection is the only way to stop UCX from touching its blocks,
 * so the whole connection fails; those connections are collected first and failed after the
 * walk (failing one completes transfers, which leave the list being walked). Runs only when the
 * earliest known deadline has passed.
 */
void kvx_xfer_check_deadlines(kvx_transport_t *t, uint64_t now)
{
    kvx_list_t *n, *next, doomed;
    uint64_t earliest = UINT64_MAX;

    if (now < t->next_deadline_ns)
        return;
    kvx_list_init(&doomed);
    for (n = t->active.next; n != &t->active; n = next) {
        kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);
        uint64_t due;

        next = n->next;
        if (x->deadline_ns == 0)
            continue;
        due = x->deadline_ns + (x->state == KVX_XS_FAILING ? KVX_CLOSE_GRACE_NS : 0);
        if (now < due) {
            if (due < earliest)
                earliest = due;
            continue;
        }
        if (x->state == KVX_XS_FAILING) {
            kvx_warn(t, "transfer %llu: connection to %s still closing; reporting it failed",
                     (unsigned long long)x->id, x->conn->agent_name);
            kvx_xfer_complete(x, x->conn->err);
        } else if (x->state == KVX_XS_QUEUED && !kvx_xfer_started(x)) {
            kvx_xfer_complete(x, -ETIMEDOUT);
        } else if (!kvx_list_linked(&x->conn->fail_link)) {
            kvx_warn(t, "transfer %llu to %s missed its deadline: closing that connection",
                     (unsigned long long)x->id, x->conn->agent_name);
            kvx_list_add_tail(&doomed, &x->conn->fail_link);
        }
    }
    t->next_deadline_ns = earliest;
    while (!kvx_list_empty(&doomed)) {
        kvx_conn_t *c = kvx_list_first(&doomed, kvx_conn_t, fail_link);
        kvx_list_del(&c->fail_link);
        kvx_conn_fail(c, -ETIMEDOUT);
        /* its transfers are FAILING now, due again after their grace: one more walk finds when */
        t->next_deadline_ns = now;
    }
}
