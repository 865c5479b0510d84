/*
 * The notices a peer sends (recv.c hands each NOTICE here): checked against the writer's fences,
 * the queue's bounds (notice_cap notices, KVX_NOTICE_QUEUE_BYTES of payload), queued with their
 * payload copied, answered (NOTICE_ACK); and taken out by kvx_notice_poll and
 * kvx_notice_poll_data. The decoder checked the payload's length against what came
 * (wire/wire.c); nothing else of the peer's is trusted.
 */
#include "recv/kvx_recv.h"
#include "recv/recv_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the notice, with len bytes of payload, may join the queue: 0, -KVX_EFENCED, -ENOSPC
 * (counted). */
static int32_t kvx_notice_admit(kvx_recv_t *r, kvx_rconn_t *rc, const kvx_msg_t *m, size_t len)
{
    if (kvx_writer_fenced(rc->w, m->u.notice.epoch, m->u.notice.tag)) {
        kvx_count(r->core, rc->w, KVX_CNT(drop_fenced));
        return -KVX_EFENCED;
    }
    if (r->notice_count == r->notice_cap || len > KVX_NOTICE_QUEUE_BYTES ||
        r->notice_bytes > KVX_NOTICE_QUEUE_BYTES - len) {
        kvx_count(r->core, rc->w, KVX_CNT(drop_other));
        return -ENOSPC;
    }
    return 0;
}

void kvx_recv_notice(kvx_recv_t *r, const kvx_msg_t *m, const uint8_t *data, size_t data_len)
{
    kvx_rconn_t *rc = kvx_rconn_of(&r->conns, m);
    bool has_data = (m->flags & KVX_MSGF_DATA) != 0;
    uint8_t hdr[KVX_WIRE_NOTICE_ACK_LEN];
    void *copy = NULL;
    int32_t status;

    if (rc == NULL)
        return;
    if (!has_data || data_len != m->u.notice.data_len) /* the decoder's checks, once more */
        data_len = 0;
    status = kvx_notice_admit(r, rc, m, data_len);
    if (status == 0 && data_len > 0 && (copy = malloc(data_len)) == NULL) {
        kvx_count(r->core, rc->w, KVX_CNT(drop_other));
        status = -ENOSPC;
    }
    if (status == 0) {
        kvx_notice_slot_t *s = &r->notices[(r->notice_head + r->notice_count) % r->notice_cap];
        memset(s, 0, sizeof(*s));
        snprintf(s->n.writer, sizeof(s->n.writer), "%s", rc->w->name);
        s->n.tag = m->u.notice.tag;
        s->n.blocks = m->u.notice.blocks;
        s->n.bytes = m->u.notice.bytes;
        s->xfer_id = (m->flags & KVX_MSGF_ALONE) ? 0 : m->u.notice.xfer_id;
        s->has_data = has_data;
        s->len = data_len;
        s->data = copy;
        if (data_len > 0)
            memcpy(copy, data, data_len);
        r->notice_bytes += data_len;
        r->notice_count++;
        kvx_count(r->core, rc->w, KVX_CNT(notices));
        kvx_rconn_active(rc);
        kvx_core_arrived(r->core);
    }
    kvx_wire_encode(
        &(kvx_msg_t){.type = KVX_MSG_NOTICE_ACK,
                     .conn_id = rc->peer_conn_id,
                     .token = rc->peer_token,
                     .u.notice_ack = {.xfer_id = m->u.notice.xfer_id, .status = status}},
        hdr);
    kvx_rconn_ctl(rc, hdr, sizeof(hdr));
}

/* The oldest notice leaves the queue (its payload the caller copied, or dropped). */
static void kvx_notice_pop(kvx_recv_t *r)
{
    kvx_notice_slot_t *s = &r->notices[r->notice_head];

    r->notice_bytes -= s->len;
    free(s->data);
    s->data = NULL;
    r->notice_head = (r->notice_head + 1) % r->notice_cap;
    r->notice_count--;
}

size_t kvx_notice_take(kvx_recv_t *r, kvx_notice_t *out, size_t max)
{
    size_t n = 0;

    while (n < max && r->notice_count > 0) {
        out[n++] = r->notices[r->notice_head].n;
        kvx_notice_pop(r);
    }
    return n;
}

int kvx_notice_take_data(kvx_recv_t *r, kvx_notice_data_t *out, size_t max, void *buf, size_t cap)
{
    size_t n = 0, used = 0;

    while (n < max && r->notice_count > 0) {
        const kvx_notice_slot_t *s = &r->notices[r->notice_head];
        kvx_notice_data_t *o = &out[n];

        if (s->len > cap - used && n > 0)
            break; /* the next call takes it */
        memset(o, 0, sizeof(*o));
        memcpy(o->writer, s->n.writer, sizeof(o->writer));
        o->xfer_id = s->xfer_id;
        o->tag = s->n.tag;
        o->data_len = s->len;
        if (s->len > cap - used)
            return -ENOSPC; /* the oldest alone: out[0] tells it, nothing is taken */
        if (s->has_data) {
            o->data = (uint8_t *)buf + used;
            if (s->len > 0)
                memcpy(o->data, s->data, s->len);
            used += s->len;
        }
        kvx_notice_pop(r);
        n++;
    }
    return (int)n;
}

void kvx_notices_free(kvx_recv_t *r)
{
    while (r->notice_count > 0)
        kvx_notice_pop(r);
    free(r->notices);
    r->notices = NULL;
}
