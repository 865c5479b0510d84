/*
 * The counters: every transfer's end counted once, by op and final status, with a latency
 * histogram, per peer and for the whole transport (kvx_stats_query; kvx_peer_attr_t's counters
 * derive from the peer's), and the messages dropped before any connection took them. The Python
 * binding exports them to Prometheus; nothing here allocates or takes time worth measuring on
 * the completion path.
 */
#include "core/kvx_core.h"

#include <errno.h>
#include <string.h>

/* A message dropped before it could be tied to a connection (the receiving side's counters). */
void kvx_count_drop(kvx_core_t *c, int why)
{
    kvx_debug(c, "message dropped (%s)",
              why == KVX_DROP_MALFORMED ? "malformed"
              : why == KVX_DROP_UNKNOWN ? "unknown connection"
                                        : "rendezvous");
    switch (why) {
    case KVX_DROP_MALFORMED:
        c->rcounters.drop_malformed++;
        break;
    case KVX_DROP_UNKNOWN:
        c->rcounters.drop_unknown++;
        break;
    default:
        c->rcounters.drop_other++;
        break;
    }
}

static int kvx_status_class(int status)
{
    switch (status) {
    case 0:
        return KVX_STATUS_OK;
    case -ETIMEDOUT:
        return KVX_STATUS_TIMEDOUT;
    case -ECONNRESET:
        return KVX_STATUS_CONNRESET;
    case -ECONNABORTED:
        return KVX_STATUS_CONNABORTED;
    case -ECANCELED:
        return KVX_STATUS_CANCELED;
    case -KVX_EFENCED:
        return KVX_STATUS_FENCED;
    case -EBADMSG:
        return KVX_STATUS_BADMSG;
    case -ENOSPC:
        return KVX_STATUS_NOSPC;
    case -EINVAL:
        return KVX_STATUS_INVAL;
    case -EBUSY:
        return KVX_STATUS_BUSY;
    case -EPROTO:
        return KVX_STATUS_PROTO;
    default:
        return KVX_STATUS_OTHER;
    }
}

/* Bucket i holds latencies in (2^(i-1), 2^i] microseconds; the last, everything above. */
static unsigned kvx_latency_bucket(uint64_t lat_ns)
{
    uint64_t us = (lat_ns + 999) / 1000;
    unsigned b = 0;

    while (b < KVX_LATENCY_BUCKETS - 1 && us > (1ull << b))
        b++;
    return b;
}

static void kvx_stats_add(kvx_stats_t *s, int op, int cls, int status, uint64_t bytes,
                          uint64_t lat_ns, unsigned bucket)
{
    s->xfers[op][cls]++;
    if (status == 0)
        s->bytes[op] += bytes;
    s->latency[bucket]++;
    s->latency_sum_ns += lat_ns;
}

void kvx_stats_xfer(kvx_core_t *c, kvx_peer_t *p, int op, int status, uint64_t bytes,
                    uint64_t lat_ns)
{
    int cls = kvx_status_class(status);
    unsigned bucket = kvx_latency_bucket(lat_ns);

    op = op == KVX_OP_READ ? 1 : 0;
    kvx_stats_add(&c->stats, op, cls, status, bytes, lat_ns, bucket);
    if (p != NULL) {
        kvx_stats_add(&p->stats, op, cls, status, bytes, lat_ns, bucket);
        if (lat_ns > p->latency_max_ns)
            p->latency_max_ns = lat_ns;
    }
}
