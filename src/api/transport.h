/*
 * The transport, seen whole: the container of every layer's state. The core's (kvx_core_t,
 * core/kvx_core.h) is its first member; the other layers' state is still grouped here by the
 * layer that owns it, until each has a struct of its own.
 */
#ifndef KVX_TRANSPORT_H
#define KVX_TRANSPORT_H

#include "peer/kvx_peer.h"
#include "recv/kvx_recv.h"

/* After the last sign of activity a progress loop keeps polling this long before it arms the
 * event fd and sleeps: on tcp, arming after every empty progress costs ~50x more wake-ups. */
#define KVX_SPIN_NS 100000ull

struct kvx_transport {
    kvx_core_t core;  /* first: its logger is the transport's */
    bool close_done;  /* the teardown has finished (a second close waits for it) */
    bool owned;       /* kvx allocated the region (KVX_PARAM_OWN_REGION) */
    const void *rkey; /* ... and its packed key, which maps it on this host's peers */
    size_t rkey_len;
    unsigned num_threads;
    char *net_devices;
    void *old_md; /* metadata buffers replaced while pairings may still be sending them */
    uint8_t *metadata;
    size_t metadata_len;

    kvx_conns_t conns; /* the initiator's connections */

    kvx_recv_t recv; /* the receiving side */

    kvx_peers_t peers; /* pairing by address, peers pairing again, peer events */

    uint32_t cancel_calls;
    uint64_t next_housekeeping_ns; /* stall and liveness checks, pool trimming */
    uint64_t next_pool_trim_ns;

    /* progress thread */
    uint64_t spin_ns; /* how long a progress loop polls on after the last work (KVX_SPIN_NS) */
    _Atomic uint64_t app_poll_ns; /* last time the application polled (it drives UCX then) */
    pthread_t thread;
    bool thread_running;
    bool thread_stop;
    bool thread_sleeping;
    uint64_t thread_wake_at_ns;
    int wake_fd;

    /* application threads in kvx_transport_wait, and how kvx wakes them */
    unsigned waiters;
    bool cq_signaled;
    int cq_fd;

    /* kvx_transport_event_fd_ex: one eventfd per mask of kinds, indexed by the mask (0 unused),
     * readable while a poll of one of its kinds has something (fd -1: never asked for) */
    struct {
        int fd;
        bool set;
    } evfd[KVX_EVENT_ALL + 1];
    bool ev_used;      /* some event fd was asked for */
    unsigned ev_kinds; /* the kinds that had something at the last kvx_events_update */
};

#endif /* KVX_TRANSPORT_H */
