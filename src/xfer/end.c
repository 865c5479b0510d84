/*
 * How a transfer ends on the initiator's side (core/kvx_core.h writes down its life): it leaves
 * its connection's accounting and ends (kvx_xfer_end: done at once, or ENDING while UCX holds its
 * messages or receives into its blocks), is forgotten (cancel at once), fails with its
 * connection, waits for a reconnection, or misses its deadline.
 */
#include "xfer/kvx_xfer.h"

#include <errno.h>
#include <string.h>

/* The transfer leaves its connection's accounting: what it had posted and not heard back of, its
 * read requests, its notice. Replies that still come for it find nothing and are dropped. */
static void kvx_xfer_leave_conn(kvx_xfer_t *x)
{
    kvx_conn_t *c = x->conn;

    if (c == NULL) { /* parked (or never queued): only its list */
        kvx_list_del(&x->conn_link);
        return;
    }
    kvx_conn_unacked_sub(c, x, x->posted - x->done);
    x->done = x->posted;
    if (x->noticed) {
        c->notices--;
        x->noticed = false;
    }
    if (x->op == KVX_OP_READ)
        for (unsigned i = 0; i < KVX_MAX_REQS; i++)
            if (c->read_reqs[i].xfer_id == x->id)
                c->read_reqs[i].xfer_id = 0;
    if (x->state == KVX_XS_QUEUED)
        kvx_xfer_unqueue(c, x);
    else
        kvx_list_del(&x->conn_link);
    if (c->state == KVX_CONN_OPEN && kvx_conn_queued(c))
        kvx_conn_want_work(c);
}

/* How long an ENDING write waits for UCX to let go of its messages before kvx fails its
 * connection: KVX_END_GRACE_NS, or the stall limit when that is shorter. */
static uint64_t kvx_end_grace(const kvx_core_t *core)
{
    return core->stall_ns != 0 && core->stall_ns < KVX_END_GRACE_NS ? core->stall_ns
                                                                    : KVX_END_GRACE_NS;
}

/* A transfer ends (kvx_core.h): it leaves its connection's accounting now, and is done at once
 * (kvx_xfer_done queues it for poll), or, for a write whose messages UCX still holds (they read
 * its local blocks) or a read with rendezvous receives in flight (UCX writes its local blocks),
 * ENDING until the last of them is done (kvx_xfer_on_sent, kvx_xfer_on_received). The first
 * status wins. A read waits even on a lingering connection (which has no receive in flight when
 * it starts to linger: see kvx_conn_fail), since its blocks must not change once it is reported. */
void kvx_xfer_end(kvx_xfer_t *x, int status)
{
    kvx_core_t *core = x->core;

    if (x->state == KVX_XS_ENDING)
        return;
    kvx_xfer_leave_conn(x);
    if (x->sending > 0 && (x->op == KVX_OP_READ || !(x->conn != NULL && x->conn->lingering))) {
        x->state = KVX_XS_ENDING;
        x->end_status = status;
        x->deadline_ns = kvx_now_ns() + kvx_end_grace(core);
        if (x->deadline_ns < core->next_deadline_ns) {
            core->next_deadline_ns = x->deadline_ns;
            kvx_core_kick(core, x->deadline_ns);
        }
        return;
    }
    kvx_xfer_done(x, status);
}

/* KVX_CANCEL_IMMEDIATE: it is never reported. One not yet done is purged and
 * done at once, counted as canceled, though UCX may still hold its messages (the caller accepts
 * that UCX may still read a write's blocks); one done already goes with its completion. */
void kvx_xfer_forget(kvx_xfer_t *x)
{
    if (x->state == KVX_XS_DONE) {
        kvx_xfer_free(x);
        return;
    }
    kvx_xfer_purge(x);
    kvx_xfer_leave_conn(x);
    kvx_xfer_done(x, -ECANCELED);
}

void kvx_xfer_repark(kvx_conn_t *c, kvx_peer_t *p)
{
    /* the receiver refused a retired capability (kvx_fence_ex): what waited for this
     * connection was submitted before it heard of the fence, and fails with it */
    if (c->err == -EKEYREVOKED)
        return;
    /* before the handshake nothing of them was posted (kvx_xfer_post waits for it); they wait
     * highest level first (each level in submission order) and go back to their levels */
    for (int l = KVX_PRIO_LEVELS - 1; l >= 0 && !c->wired; l--)
        while (!kvx_list_empty(&c->queue[l])) {
            kvx_xfer_t *x = kvx_list_first(&c->queue[l], kvx_xfer_t, conn_link);
            kvx_xfer_leave_conn(x);
            x->conn = NULL;
            kvx_list_add_tail(&p->parked, &x->conn_link);
        }
}

/* Every transfer of a failed connection fails at once: its replies are dropped from now on, and
 * what UCX still holds of its messages only reads its local blocks (before the endpoint's forced
 * close purges them). */
void kvx_xfer_fail_conn(kvx_conn_t *c, int err)
{
    kvx_list_t *lists[] = {&c->queue[KVX_PRIO_HIGH], &c->queue[KVX_PRIO_NORMAL],
                           &c->queue[KVX_PRIO_LOW], &c->waiting};
    _Static_assert(KVX_PRIO_LEVELS == 3, "every level's queue is failed");

    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++)
        while (!kvx_list_empty(lists[i]))
            kvx_xfer_end(kvx_list_first(lists[i], kvx_xfer_t, conn_link), err);
    memset(c->read_reqs, 0, sizeof(c->read_reqs));
    if (c->lingering) /* its endpoint stays open: what waited for UCX to let go is reported now */
        for (kvx_list_t *n = c->core->active.next, *next; n != &c->core->active; n = next) {
            kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);
            next = n->next;
            if (x->state == KVX_XS_ENDING && x->conn == c &&
                (x->op == KVX_OP_WRITE || x->sending == 0))
                kvx_xfer_done(x, x->end_status);
        }
}

/*
 * When a transfer that is not ENDING fails unless it finished (0: never): its deadline, and, for
 * one waiting for a connection (parked while its peer pairs again, or queued behind a handshake
 * not yet answered), the stall limit counted from its submission. No connection's stall clock
 * runs for a parked transfer, and a connection opened after its submission started its clock
 * late: this bounds both as the stall limit bounds the others.
 */
uint64_t kvx_xfer_due(const kvx_core_t *core, const kvx_xfer_t *x)
{
    uint64_t due = x->deadline_ns, stall;

    if (core->stall_ns == 0 || x->state != KVX_XS_QUEUED || (x->conn != NULL && x->conn->wired))
        return due;
    stall = x->t_submit_ns + core->stall_ns;
    return due == 0 || stall < due ? stall : due;
}

/* ---- deadlines ------------------------------------------------------------------------------ */

/*
 * Fail transfers past their deadline (or, waiting for a connection, past the stall limit:
 * kvx_xfer_due), each alone: its connection stays and replies for it are dropped from now on (a
 * read's local blocks never change again; a notified write's NOTICE_ACK is dropped too, though
 * the receiver may have queued its notice). A write whose messages UCX still holds is reported
 * once they left (ENDING); one whose messages UCX has not let go of within kvx_end_grace fails
 * its connection, whose forced close makes UCX let go. Should that close not give them back
 * within another KVX_END_GRACE_NS, the write is reported all the same (logged): no transfer
 * waits for UCX forever. Runs only when the earliest known deadline has passed.
 */
void kvx_xfer_check_deadlines(kvx_core_t *core, uint64_t now)
{
    kvx_list_t *n, *next;
    uint64_t earliest = UINT64_MAX, due;
    kvx_conn_t *stuck;

    if (now < core->next_deadline_ns)
        return;
again:
    stuck = NULL;
    earliest = UINT64_MAX;
    for (n = core->active.next; n != &core->active; n = next) {
        kvx_xfer_t *x = kvx_container_of(n, kvx_xfer_t, active_link);

        next = n->next;
        if (x->state == KVX_XS_ENDING) {
            if (x->conn == NULL || x->conn->state != KVX_CONN_OPEN) { /* its close lets go */
                due = x->deadline_ns + KVX_END_GRACE_NS;
                if (now >= due) {
                    kvx_warn(core,
                             "peer %s: UCX kept messages of failed transfer %llu after its "
                             "connection's close: reporting it anyway",
                             x->peer->id, (unsigned long long)x->id);
                    kvx_xfer_done(x, x->end_status);
                    continue;
                }
            } else if (now >= x->deadline_ns) {
                stuck = x->conn;
                break;
            } else {
                due = x->deadline_ns;
            }
            if (due < earliest)
                earliest = due;
            continue;
        }
        due = kvx_xfer_due(core, x);
        if (due == 0)
            continue;
        if (now < due) {
            if (due < earliest)
                earliest = due;
            continue;
        }
        kvx_debug(core, "transfer %llu to %s missed its %s", (unsigned long long)x->id,
                  x->conn ? x->conn->agent_name : x->peer->id,
                  due == x->deadline_ns ? "deadline" : "connection within the stall limit");
        kvx_xfer_end(x, -ETIMEDOUT);
        if (x->state == KVX_XS_ENDING && x->deadline_ns < earliest)
            earliest = x->deadline_ns;
    }
    if (stuck != NULL) {
        kvx_warn(core,
                 "connection to %s: UCX still holds messages of a failed write: failing the "
                 "connection",
                 stuck->agent_name);
        kvx_conn_fail(stuck, -ETIMEDOUT);
        goto again;
    }
    core->next_deadline_ns = earliest;
}
