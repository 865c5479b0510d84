/*
 * The transport, seen whole: the container of every layer's state, and what only the api layer
 * keeps. Only the api layer's files include it (scripts/layers checks it): every layer below is
 * given its own state (or its neighbours' by pointer) and never sees the transport.
 */
#ifndef KVX_TRANSPORT_H
#define KVX_TRANSPORT_H

#include "engine/kvx_engine.h"

struct kvx_transport {
    kvx_core_t core;     /* what both sides share; first: its logger is the transport's */
    kvx_conns_t conns;   /* the initiator's connections */
    kvx_recv_t recv;     /* the receiving side, and its connections */
    kvx_peers_t peers;   /* pairing by address, peers pairing again, peer events */
    kvx_engine_t engine; /* the progress engine, its thread, the wake-ups */

    /* the api's own */
    bool close_done;  /* the teardown has finished (a second close waits for it) */
    bool owned;       /* kvx allocated the region (KVX_PARAM_OWN_REGION) */
    const void *rkey; /* ... and its packed key, which maps it on this host's peers */
    size_t rkey_len;
    unsigned num_threads;
    char *net_devices;
    uint8_t *metadata;
    size_t metadata_len;
    void *old_md;          /* metadata buffers replaced while pairings may still be sending them */
    uint32_t cancel_calls; /* kvx_xfer_cancel calls so far (the ids of one are reported once) */
};

/* ---- the api's own (metadata_api.c) --------------------------------------------------------- */

/* The metadata of t as it is now, the listener's to answer with: 0 or a negative errno. */
int kvx_metadata_build(kvx_transport_t *t);
/* A fresh capability, and metadata that carries it; the old capability is retired (a HELLO that
 * presents it is refused). Returns 0 or a negative errno (nothing changed). */
int kvx_transport_retire(kvx_transport_t *t);
/* The superseded metadata buffers go (no accepted pairing can be sending them any more). */
void kvx_old_md_free(kvx_transport_t *t);

#endif /* KVX_TRANSPORT_H */
