/*
 * The initiator's connections (conn/conn.c, conn/map.c; src/README.md): a connection's whole
 * life, from kvx_conn_open to its free: its handshake (HELLO out, HELLO_ACK and FENCE in, the
 * proof of the secret), its attachment to a peer, the mapping of a peer's owned region, failure,
 * linger, close, and the frees at the transport's close. What happens to it reaches its owner
 * through the kvx_conn_ops_t it was opened with. The receiving side's connections are
 * kvx_rconn.h's: the two sides never see each other's.
 */
#ifndef KVX_CONN_H
#define KVX_CONN_H

#include "core/kvx_core.h"

typedef struct kvx_conn_ops kvx_conn_ops_t;

/* The initiator's connections of a transport. */
typedef struct kvx_conns {
    kvx_core_t *core;
    kvx_list_t all;  /* every connection not yet freed */
    kvx_list_t work; /* connections with runs to post, an error to handle or a linger to end */
    kvx_idtab_t ids; /* by the id their messages carry */
} kvx_conns_t;

/* A read request in flight (a READ_REQ sent): its part of the stream, and where the next byte of
 * it lands. */
typedef struct kvx_read_req {
    uint64_t xfer_id; /* 0: free */
    uint64_t stream_off;
    uint64_t len;
    uint64_t got;
    uint32_t run; /* the local run, and offset in it, of stream byte stream_off + got */
    uint64_t run_off;
} kvx_read_req_t;

/* Operations kvx keeps in UCX's hands per connection at most (back-pressure): messages posted
 * and not yet sent, and read requests not yet answered. While nothing of a higher level is
 * queued, KVX_PRIO_LOW transfers use at most KVX_LOW_REQS of them: one that comes finds room. */
#define KVX_MAX_REQS 16
#define KVX_LOW_REQS 12
/* ... and at most this many bytes posted and not yet acknowledged (or arrived, for reads): what
 * UCX and the lane hold ahead of a higher transfer (a shared-memory FIFO takes 8 MiB of 32 KiB
 * segments here, and drains in order). Measured with kvx-bench --hol: 1 MiB left the bulk's rate
 * unchanged over shm and tcp here, and an urgent write's p50 behind it went from 0.84 ms to
 * 0.17-0.2 ms on shm. KVX_PRIO_NORMAL transfers keep to the same window for KVX_HIGH_RECENT_NS
 * after a KVX_PRIO_HIGH one was queued on the connection: a user who marks only the urgent
 * transfers gets the same bound, one who never uses HIGH sees no window. */
#define KVX_LOW_WINDOW ((uint64_t)1024 * 1024)
#define KVX_HIGH_RECENT_NS (100ull * 1000000ull)

/* A rendezvous receive of read data: a READ_DATA whose payload comes by rendezvous, being
 * received straight into a read's local blocks (xfer/ starts it, after checking it against the
 * read's request; the connection's endpoint reports its end through on_received). Listed on its
 * connection until UCX ends it, which closing the connection's endpoint forces. */
typedef struct kvx_read_rndv {
    kvx_list_t link; /* c->read_rndvs, oldest first */
    uint64_t since_ns;
    uint64_t xfer_id;
    uint8_t *dest; /* where in the read's local blocks */
    uint32_t len;
    uint32_t crc;
    bool check_crc;
} kvx_read_rndv_t;
/* The most rendezvous receives in flight on one connection (a kvx target keeps at most 16 of its
 * messages in UCX's hands): past it the connection fails. */
#define KVX_READ_RNDVS_PER_CONN 32

/*
 * The initiator's side of a peer: one UCX endpoint to the peer's worker. It is OPEN from
 * kvx_peer_add on; the handshake (HELLO, answered with HELLO_ACK: the receiver's id and token
 * for this connection) completes in the background (wired). A failure makes it CLOSING (the
 * endpoint closing, forced) then CLOSED, and it is freed once UCX has let go of it and nothing
 * names it (its peer, an API call that pinned it). No API call waits for any of this with the
 * lock held: they wait on core->cond, which progress signals.
 */
struct kvx_conn {
    kvx_conns_t *conns;
    kvx_core_t *core;
    const kvx_conn_ops_t *ops; /* what its owner hears (kvx_conn_open) */
    void *owner;               /* ... and the owner it was opened with */
    kvx_peer_t *peer; /* NULL until attached to a peer (kvx_conn_attach), and once detached */
    int state;
    bool wired;                /* the receiver answered the handshake */
    bool lingering;            /* failed over tcp with sends UCX holds: its endpoint is closed
                                * once they left or UCX reports it failed (see kvx_conn_fail) */
    bool linger_over;          /* ... which has happened: the next step closes it */
    int err;                   /* why it failed or closes */
    int pending_err;           /* an error reported by UCX, handled outside UCX callbacks */
    unsigned pins;             /* API calls waiting on this connection: it is not freed meanwhile */
    uint64_t last_progress_ns; /* last sign of life from the peer on this connection */
    kvx_host_id_t host;        /* the peer's process, when it runs on this host */
    bool watched;              /* same host: kvx checks that process is alive */
    int pidfd;                 /* its pidfd (-1: none, /proc is read instead) */
    uint32_t id;               /* messages to this connection carry id and token */
    uint64_t token;
    uint32_t rconn_id; /* ... and ours to the receiver carry its id and token */
    uint64_t rconn_token;
    uint64_t epoch; /* the receiver's fence epoch for us, as last heard */
    bool crc;       /* integrity: checksums on this connection's data */
    size_t seg;     /* a message's size on this connection's lane */
    /* runs of at least this many bytes go by rendezvous (UINT64_MAX: none; none before the
     * HELLO_ACK says whether the receiver takes them: kvx_conn_wired) */
    uint64_t rndv_min;
    kvx_lanes_t lanes; /* its endpoint's lanes, as kvx_conn_open found them */
    uint64_t remote_base;
    uint64_t remote_num_blocks;
    uint64_t remote_len; /* bytes of its region */
    uint64_t generation; /* its metadata's: when the peer's transport was created */
    uint8_t capability[16];
    char agent_name[KVX_NAME_MAX + 1];
    char transport[KVX_TRANSPORT_NAME_MAX];
    int rma_hw;
    uint8_t *mapped;       /* the peer's owned region, mapped here: copies, no messages (xfer/) */
    uint8_t *unproven;     /* ... mapped, until its HELLO_ACK's token matches its segment's */
    uint8_t seg_token[16]; /* the token its segment holds (KVX_SEG_TOKEN_LEN) */
    kvx_list_t queue[KVX_PRIO_LEVELS]; /* QUEUED transfers per priority, in submission order */
    int64_t credit[KVX_PRIO_LEVELS];   /* bytes each level may still post this round (xfer/) */
    kvx_list_t waiting;                /* WAITING transfers */
    unsigned reqs;    /* messages UCX holds and read requests unanswered (back-pressure) */
    uint64_t unacked; /* bytes posted and not yet acknowledged or arrived */
    uint64_t unacked_lvl[KVX_PRIO_LEVELS]; /* ... of them, per level (KVX_LOW_WINDOW) */
    uint64_t high_ns; /* when a KVX_PRIO_HIGH transfer was last queued here (0: never) */
    unsigned notices; /* notices sent and not yet answered */
    kvx_read_req_t read_reqs[KVX_MAX_REQS];
    kvx_list_t read_rndvs; /* rendezvous receives of read data in flight, oldest first */
    unsigned nread_rndvs;
    uint64_t read_rndv_done_ns; /* when one of them last ended (their progress: kvx_stalled) */
    unsigned ucx_refs;          /* UCX callbacks still to come that name this connection */
    kvx_list_t work_link;       /* conns->work: runs to post, an error to handle, a linger to end */
    kvx_list_t all_link;        /* conns->all */
    kvx_ucx_ep_t *ucx;
};

/* What a connection tells its owner, from kvx_conn_open on, with the lock held: on_sent and
 * on_received from inside UCX (its progress, or a close that purges what UCX held), on_work and
 * on_failed from the progress step or an API call, outside UCX. */
struct kvx_conn_ops {
    /* UCX is done with a message of transfer xfer_id (not 0) of the connection's */
    void (*on_sent)(kvx_conn_t *c, uint64_t xfer_id);
    /* the progress step serves a connection that asked for work: runs to post */
    void (*on_work)(kvx_conn_t *c);
    /* it fails (once, in kvx_conn_fail, before its endpoint closes): its transfers go */
    void (*on_failed)(kvx_conn_t *c, int err);
    /* a rendezvous receive of read data ended (rr is off c->read_rndvs and the owner's to free):
     * status 0, its bytes are in place; else they may be partly there */
    void (*on_received)(kvx_conn_t *c, kvx_read_rndv_t *rr, int status);
};

void kvx_conns_init(kvx_conns_t *cs, kvx_core_t *core);
/* A new connection from md: its process watched when on this host, its endpoint, its mapping of
 * an owned region, listed, and its handshake sent. Not yet any peer's. Returns 0 with *c_p set,
 * or a negative errno (logged for peer_id) with nothing of it left to the caller. */
int kvx_conn_open(kvx_conns_t *cs, const char *peer_id, const kvx_md_t *md,
                  const kvx_conn_ops_t *ops, void *owner, kvx_conn_t **c_p);
/* c becomes p's connection: p's last-known facts of the peer follow it. */
void kvx_conn_attach(kvx_conn_t *c, kvx_peer_t *p);
/* Detach a connection from its peer and make sure it goes away. May free c. */
void kvx_conn_release(kvx_conn_t *c, int err);
/* Free c once it is closed, UCX has let go of it and nothing names it (its peer, a pin). */
void kvx_conn_maybe_free(kvx_conn_t *c);
/* Fail a connection (conn.c says how); may free c when it is detached. */
void kvx_conn_fail(kvx_conn_t *c, int err);
/* UCX, or a reply, reports the connection failed (inside UCX progress): recorded, and the next
 * step fails it. */
void kvx_conn_error(kvx_conn_t *c, int status);
/* Ask the next progress step to work on c (post what is queued, act on an error, end a linger);
 * once, however often asked. */
void kvx_conn_want_work(kvx_conn_t *c);
/* The connection a reply names, if its token matches and it is open; NULL (counted) otherwise. */
kvx_conn_t *kvx_conn_of(kvx_conns_t *cs, const kvx_msg_t *m);
/* A HELLO_ACK (the handshake answered: wired, or refused) and a FENCE (a newer epoch) for c. */
void kvx_conn_hello_ack(kvx_conn_t *c, const kvx_msg_t *m);
void kvx_conn_fence(kvx_conn_t *c, const kvx_msg_t *m);
/* Start a rendezvous receive of rr->len bytes into rr->dest (checked by the caller) for a
 * message of c whose payload descriptor is desc, from inside its handler: 0 (landed at once: rr
 * is the caller's again), 1 (in flight, listed on c: the owner's on_received follows, and may
 * have run before this returns), or a negative errno (nothing received; -EBUSY: over
 * KVX_READ_RNDVS_PER_CONN). */
int kvx_conn_recv(kvx_conn_t *c, kvx_read_rndv_t *rr, void *desc);
/* This connection waits for its peer: the handshake, replies to what it posted, messages UCX
 * has not sent yet (the stall limit counts). */
bool kvx_conn_awaits_peer(const kvx_conn_t *c);
/* Bytes of transfer x posted on c (add), or acknowledged, arrived or let go of (sub). */
static inline void kvx_conn_unacked_add(kvx_conn_t *c, const kvx_xfer_t *x, uint64_t n)
{
    c->unacked += n;
    c->unacked_lvl[x->prio] += n;
}
static inline void kvx_conn_unacked_sub(kvx_conn_t *c, const kvx_xfer_t *x, uint64_t n)
{
    c->unacked -= n;
    c->unacked_lvl[x->prio] -= n;
}
/* Whether any transfer is QUEUED on c (at any priority). */
static inline bool kvx_conn_queued(const kvx_conn_t *c)
{
    for (int l = 0; l < KVX_PRIO_LEVELS; l++)
        if (!kvx_list_empty(&c->queue[l]))
            return true;
    return false;
}

/* ---- every connection: the progress step, housekeeping, close (conn.c) ---------------------- */

/* The progress step serves the connections that asked for work (outside UCX callbacks): how
 * many. Work they ask for meanwhile waits for the next step. */
unsigned kvx_conns_work(kvx_conns_t *cs);
/* Work only polling advances: connections with work, or with operations in UCX's hands. */
bool kvx_conns_need_polling(const kvx_conns_t *cs);
/* Periodic: a same-host peer whose process exited, a connection stalled past the stall limit. */
void kvx_conns_housekeeping(kvx_conns_t *cs, uint64_t now);
/* At close: every lingering endpoint closes now; whether any connection is still closing (or
 * UCX still holds a request of one); every mapping let go of (before the worker goes);
 * everything freed (after it went). */
void kvx_conns_end_lingers(kvx_conns_t *cs);
bool kvx_conns_closing(const kvx_conns_t *cs);
void kvx_conns_unmap_all(kvx_conns_t *cs);
void kvx_conns_free_all(kvx_conns_t *cs);

/* ---- a peer's owned region, mapped here (map.c) --------------------------------------------- */

/* At open: map it when the peer is on this host and its key gives a mapping (unproven until the
 * HELLO_ACK's token matches its segment's). */
void kvx_conn_map(kvx_conn_t *c, const kvx_md_t *md);
/* The HELLO_ACK's segment token: a mapping still unproven is used if it is its segment's, and
 * let go of (counted, logged) if not. */
void kvx_conn_map_prove(kvx_conn_t *c, const uint8_t *token);
/* The mapping goes (messages carry the data from now on). */
void kvx_conn_unmap(kvx_conn_t *c);
/* Fault a mapped region's pages in (the lock released meanwhile; c pinned by the caller). */
void kvx_conn_prefault(kvx_conn_t *c);

#endif /* KVX_CONN_H */
