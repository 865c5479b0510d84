/*
 * What the UCX backend's files share, and no other file includes (the layers above see only
 * kvx_ucx.h): UCP's headers, the backend's state, the helpers more than one of its files calls.
 * Every UCP call kvx makes lives in these files (context, worker, endpoints, kvx's active
 * messages in and out, progress, wake-up); the rest of kvx sees plain errnos. UCP's RMA feature is
 * never enabled: UCX's own put and get handlers, which write and read any address a message
 * names, do not exist in kvx's workers. Every byte a peer sends arrives through kvx_ucx_am_cb
 * (worker.c) and is checked by kvx before it goes anywhere.
 *
 * The files, lowest first; each calls only files of the ranks before it, never one of its own
 * rank or above (scripts/layers checks it):
 *   config.c, mem.c     the settings kvx applies to UCX, the context and worker made with them
 *                       (and the log capture that tells which applied, the environment); owned
 *                       regions and mapping a peer's
 *   lanes.c, ep.c,      what an endpoint's lanes are (read from UCX's own description); an
 *   msg.c               endpoint towards a worker address (its link, its error handler, its
 *                       place among this worker's endpoints to that worker); kvx's messages
 *                       out on an endpoint and the receive of a rendezvous payload
 *   catchup.c, cm.c     the catch-up endpoints that keep UCX's pairing by creation order
 *                       (docs/design/catchup-endpoints.md), and with them a HELLO's endpoint
 *                       (kvx_ucx_ep_accept) and an endpoint's close; UCX's connection manager
 *   worker.c            the backend's entry: kvx_ucx_init (the context and worker themselves are
 *                       made by config.c's kvx_ucx_create) and the teardown that ends all of the
 *                       above; messages in; progress and wake-up
 */
#ifndef KVX_UCX_INT_H
#define KVX_UCX_INT_H

#include "ucx/kvx_ucx.h"

#include <ucp/api/ucp.h>

/* The active-message id of every kvx message (the type is in kvx's own header). */
#define KVX_AM_ID 0x4b

struct kvx_ucx {
    kvx_logger_t log;         /* the transport's (kvx_ucx_config_t) */
    const kvx_ucx_ops_t *ops; /* what the layers above hear of the worker (kvx_ucx_init) */
    void *arg;                /* ... and the argument they get */
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *waddr;
    size_t waddr_len;
    int efd;
    ucp_mem_h region; /* an owned region UCX allocated, or NULL */
    int seg_id;       /* ... its System V segment, listed as this process's (seg_listed) */
    bool seg_listed;
    struct kvx_ucx_sn {
        uint64_t uid;     /* a remote worker */
        uint32_t next_sn; /* endpoints this worker opened towards it (UCX's conn_sn) */
        uint16_t fillers; /* catch-up endpoints towards it still open */
        uint8_t used;
    } * sns; /* a hash table by uid (open addressing), sns_cap a power of two */
    size_t nsns, sns_cap;
    /* endpoints opened only to catch up (kvx_ucx_align), NULL: a free slot; a HELLO that came
     * on one makes it its connection's (kvx_ucx_ep_accept) */
    kvx_ucx_ep_t *fillers[256];
    size_t nfillers, nfailed;
    void *rkey; /* its packed key (in the metadata) */
    size_t rkey_len;
    ucp_listener_h listener; /* kvx_transport_listen */
    kvx_ucx_ep_t *pair_eps;  /* endpoints of UCX's connection manager (pairing by address) */
    /* the endpoint the message being handled came on (its sender's REPLY), or NULL: a
     * rendezvous payload is received only for a connection whose endpoint that is
     * (kvx_ucx_recv), and a HELLO's connection takes it (kvx_ucx_came_on, kvx_ucx_ep_accept) */
    ucp_ep_h came_on_ep;
    struct kvx_ucx_link *links;     /* every UCX endpoint kvx opened towards a worker address */
    struct kvx_ucx_recv *recv_free; /* receive records to reuse (kvx_ucx_recv) */
    uint64_t next_link_id;
};

/*
 * One UCX endpoint towards a worker address, and the kvx endpoints using it: its error handler's
 * argument, so it lives as long as the UCX endpoint. Usually one user. UCX pairs two workers'
 * endpoints by the order each opened them towards the other, so when two transports open
 * connections towards each other before either answered the other's HELLO, each one's writing
 * endpoint is paired with the other's: the HELLO came on the receiver's own writing endpoint
 * (one kvx_ucx_ep_open opened for a connection of this transport's, not a catch-up one or one
 * whose error UCX reported), and the receiving connection shares it (kvx_ucx_ep_accept), as UCX
 * means such a pair to be used, in both directions; so does a HELLO that came on the endpoint of
 * a receiving connection whose own HELLO came on another (not matched). A
 * shared endpoint closes for one user only (the other goes on) unless that user still has
 * messages or receives in UCX's hands: then it closes for both (UCX cannot end one user's alone),
 * and the other user hears -ECONNRESET (its own messages UCX held end as canceled first). That
 * forced close does not wait for the other user's tcp linger (kvx_conn_fail, kvx_rconn_close):
 * the same as an unshared endpoint whose receives must end.
 */
struct kvx_ucx_link {
    ucp_ep_h ep;
    uint64_t id; /* from 1, never reused (kvx_came_on_t) */
    bool failed; /* UCX reported its error (once): nobody joins it any more */
    bool joined; /* a HELLO that came on it shared it (kvx_ucx_ep_accept) */
    kvx_ucx_ep_t *users[2];
    struct kvx_ucx_link *next, **prevp; /* on u->links */
};

struct kvx_ucx_ep {
    kvx_ucx_t *u;
    ucp_ep_h ep;
    const kvx_ep_ops_t *ops; /* what its owner hears: given when it opened */
    void *owner;             /* a connection of either side, or a pairing */
    bool pair;               /* an endpoint of UCX's connection manager (a pairing's) */
    kvx_ucx_ep_t *pair_next;
    kvx_send_t *free;          /* messages to reuse */
    ucp_rkey_h rkey;           /* the peer's owned region, mapped here (kvx_ucx_map) */
    uint32_t sn;               /* its place among this worker's endpoints to that worker */
    uint64_t uid;              /* that worker's (UCX's worker uid) */
    bool filler;               /* a catch-up endpoint (u->fillers): no owner (kept ones carried
                                * a receiving connection's messages before) */
    bool failed;               /* ... whose peer failed: closed by kvx_ucx_progress */
    struct kvx_ucx_link *link; /* its UCX endpoint's (NULL: a pairing's, or closed) */
    unsigned inflight;         /* its messages and receives UCX holds */
    bool accepted;             /* a receiving connection's (kvx_ucx_ep_accept) */
    bool matched;              /* ... on which its HELLO came: never shared */
};

_Static_assert(sizeof(kvx_iov_t) == sizeof(ucp_dt_iov_t) &&
                   offsetof(kvx_iov_t, base) == offsetof(ucp_dt_iov_t, buffer) &&
                   offsetof(kvx_iov_t, len) == offsetof(ucp_dt_iov_t, length),
               "kvx_iov_t must be laid out as ucp_dt_iov_t");

static inline int kvx_ucx_errno(ucs_status_t s)
{
    switch (s) {
    case UCS_OK:
        return 0;
    case UCS_ERR_CANCELED:
        return -ECANCELED;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return -ECONNRESET;
    case UCS_ERR_UNREACHABLE:
        return -EHOSTUNREACH;
    case UCS_ERR_REJECTED:
        return -ECONNREFUSED;
    case UCS_ERR_TIMED_OUT:
        return -ETIMEDOUT;
    case UCS_ERR_NO_MEMORY:
        return -ENOMEM;
    case UCS_ERR_INVALID_PARAM:
        return -EINVAL;
    case UCS_ERR_UNSUPPORTED:
        return -ENOTSUP;
    case UCS_ERR_BUSY:
        return -EBUSY;
    case UCS_ERR_NO_DEVICE:
        return -ENODEV;
    case UCS_ERR_NO_RESOURCE:
        return -EAGAIN;
    default:
        return -EIO;
    }
}

/* config.c */
/* Context and worker (u->ctx, u->worker) with kvx's settings applied. Returns 0 or an errno. */
int kvx_ucx_create(kvx_ucx_t *u, const kvx_ucx_config_t *cfg);
void kvx_ucx_stop(kvx_ucx_t *u);                                /* the worker and the context */
size_t kvx_ucx_env_size(const char *const *names, size_t dflt); /* "32k" from names[0..] */

/* mem.c */
void kvx_ucx_region_free(kvx_ucx_t *u);

/* ep.c */
void kvx_ucx_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status); /* an endpoint's (arg) */
/* The uid of the worker at waddr (*ok: UCX could read it). */
uint64_t kvx_ucx_uid(const void *waddr, bool *ok);
/* The entry of remote worker uid (made when create), or NULL. */
struct kvx_ucx_sn *kvx_ucx_sn_find(kvx_ucx_t *u, uint64_t uid, bool create);
/* An endpoint to waddr (uid: its worker's, ok: known), counted among those towards that worker. */
int kvx_ucx_ep_new(kvx_ucx_t *u, const void *waddr, uint64_t uid, bool ok, const char *name,
                   kvx_ucx_ep_t **ep_p);
/* Close e's UCX endpoint itself (forced), with close parameters cp: UCX's request, if any. */
void *kvx_ucx_ep_close_ucp(kvx_ucx_ep_t *e, const ucp_request_param_t *cp);
void kvx_ucx_drop_links(kvx_ucx_t *u); /* after the worker went */

/* msg.c */
void kvx_ucx_free_recvs(kvx_ucx_t *u); /* the receive records to reuse */

/* catchup.c */
void kvx_ucx_reap_fillers(kvx_ucx_t *u);  /* the catch-up endpoints whose peer failed */
void kvx_ucx_close_fillers(kvx_ucx_t *u); /* all of them (the worker goes) */

#endif /* KVX_UCX_INT_H */
