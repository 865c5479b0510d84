/*
 * DRAFT: the kvx C API additions the NIXL plugin is written against (regions registered at any
 * time, their blobs, loading a peer's blob, range transfers, notices with payloads, standalone
 * notices, transports without a main region). They are being built in the core and are NOT in
 * libkvx yet; this header only lets the plugin compile until include/kvx.h declares them, and
 * goes away then. Names, signatures and the contracts in the comments are the core's draft.
 * While libkvx lacks these symbols, CMake links the plugin to kvx_next_stub.c (every call
 * -ENOSYS) for a compile-and-load check only, and neither installs it nor runs the KVX tests.
 */
#ifndef KVX_NIXL_KVX_NEXT_H
#define KVX_NIXL_KVX_NEXT_H

#include "kvx.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KVX_REGION_MAIN /* the core's kvx.h does not declare them yet */
#define KVX_NIXL_DRAFT_API 1

/* ---- Transports without a main region --------------------------------------------------------
 * kvx_params_t's KVX_PARAM_REGION becomes optional: a transport created without it has no main
 * region (block calls on it return -ENOENT) and moves data only through regions registered
 * later (kvx_region_register) and ranges (kvx_xfer_write_ranges). Its metadata then carries
 * num_blocks 0 and block_len 0; kvx_peer_add of such metadata needs no region arguments. */

/* ---- Regions --------------------------------------------------------------------------------- */

/** The main region (KVX_PARAM_REGION) has this id, and a peer added with kvx_peer_add has its
 *  main region loaded under this handle. 0 is never an id or a handle. */
#define KVX_REGION_MAIN 1u

/** What peers may do with a region. */
enum kvx_region_access { KVX_REGION_WRITE = 1u << 0, KVX_REGION_READ = 1u << 1 };

enum kvx_region_params_field { KVX_REGION_PARAM_ACCESS = 1u << 0 };
typedef struct kvx_region_params {
    uint64_t field_mask;
    unsigned access; /**< KVX_REGION_WRITE | KVX_REGION_READ (the default) */
} kvx_region_params_t;

/** The longest region blob (kvx_region_blob), in bytes. */
#define KVX_REGION_BLOB_MAX 256

/**
 * Register len bytes at base as a region peers may address (many at once, any time, overlapping
 * allowed). Returns 0 and *region_p (>= 2, never reused in the transport's life), or -EINVAL (NULL
 * base, len 0, a range that wraps, unknown access bits), -ENOMEM, -ESHUTDOWN. base must stay
 * valid until kvx_region_deregister returns; kvx never frees it.
 */
KVX_API int kvx_region_register(kvx_transport_t *transport, void *base, uint64_t len,
                                const kvx_region_params_t *params, uint32_t *region_p);

/**
 * Deregister a region: a fence. When it returns 0, no byte of any peer lands in the region and
 * none is read from it any more, whatever was in flight, and this transport's own transfers
 * that named it have completed or failed (their completions come out of poll as usual): the
 * memory may be freed or reused at once. Waits, with the lock released, at most 1 s (the stall
 * limit when shorter) for what is in flight, then closes the connections still holding it
 * (their other transfers fail with -ECONNRESET) and returns at most ~100 ms later. -ENOENT:
 * unknown or already deregistered; -EBUSY: the main region of a KVX_PARAM_OWN_REGION transport
 * (peers on this host copy into it directly); -ESHUTDOWN.
 */
KVX_API int kvx_region_deregister(kvx_transport_t *transport, uint32_t region);

/** A region's blob for peers (what NIXL calls its public data): into buf, *len_p in/out
 *  (-ENOSPC: too small, *len_p the size needed). Stable for the region's life. -ENOENT. */
KVX_API int kvx_region_blob(kvx_transport_t *transport, uint32_t region, void *buf, size_t *len_p);

/**
 * Load a peer's region blob for peer_id (added already): returns 0 and *handle_p (>= 2), which
 * names that region in ranges to that peer until unloaded or the peer is removed. The same blob
 * loaded twice gives the same handle. -ENOENT: unknown peer; -EBADMSG: not a region blob;
 * -EINVAL: the blob is of another agent than the peer; -ESTALE: of another process than the
 * peer's now (it restarted: load its new blob); -EACCES: the secret's signature does not match.
 * No network traffic.
 */
KVX_API int kvx_region_load(kvx_transport_t *transport, const char *peer_id, const void *blob,
                            size_t len, uint32_t *handle_p);
/** Forget a loaded handle (0; -ENOENT: unknown). Transfers in flight naming it go on. */
KVX_API int kvx_region_unload(kvx_transport_t *transport, const char *peer_id, uint32_t handle);

/** One piece of a transfer: len bytes at local_offset of a local region to (or from)
 *  remote_offset of a peer's region (a handle of kvx_region_load, or KVX_REGION_MAIN). */
typedef struct kvx_range {
    uint32_t local_region;
    uint32_t remote_region;
    uint64_t local_offset;
    uint64_t remote_offset;
    uint64_t len;
} kvx_range_t;

/**
 * Write (read) a list of ranges to (from) a peer, as one transfer: the same ids, completions,
 * deadlines, stall limit, priorities, notices, integrity, cancel and fences as kvx_xfer_write.
 * Ranges consecutive on both sides are coalesced. Returns 0 and *id_p, or -ENOENT (unknown peer,
 * local region or remote handle), -EINVAL (a range out of its region, len 0, count 0), -EACCES
 * (the remote region does not grant the access), -ESTALE (the handle is of the peer's earlier
 * process), -ENOMEM, -ESHUTDOWN. ranges need only stay valid during the call. A range the
 * receiver refuses fails the transfer with -ENOENT (region gone), -EACCES or -EINVAL.
 */
KVX_API int kvx_xfer_write_ranges(kvx_transport_t *transport, const char *peer_id,
                                  const kvx_range_t *ranges, size_t count,
                                  const kvx_xfer_params_t *params, uint64_t *id_p);
KVX_API int kvx_xfer_read_ranges(kvx_transport_t *transport, const char *peer_id,
                                 const kvx_range_t *ranges, size_t count,
                                 const kvx_xfer_params_t *params, uint64_t *id_p);

/* ---- Notices with a payload (NIXL notifications) -------------------------------------------- */

/** KVX_NOTICE_DATA_MAX: the largest payload, in bytes. */
#define KVX_NOTICE_DATA_MAX (1u << 20)

/** A standalone notice with a payload to a peer (NIXL's genNotif): 0 once queued, -ENOENT,
 *  -EINVAL (len 0 or over KVX_NOTICE_DATA_MAX), -ENOTCONN, -ESHUTDOWN. */
KVX_API int kvx_notice_send(kvx_transport_t *transport, const char *peer_id, const void *data,
                            size_t len);

/** A notice with its payload (kvx_notice_poll_data): the writer's agent name, the transfer id
 *  (0 for kvx_notice_send's), and data_len bytes of payload copied into the caller's buffer. */
typedef struct kvx_notice_data {
    char writer[KVX_NAME_MAX + 1];
    uint64_t xfer_id;
    uint64_t tag;
    size_t data_len;
    void *data; /* points into the buf given to kvx_notice_poll_data */
} kvx_notice_data_t;
/** Take up to max notices with payloads, their payloads copied into buf (cap bytes): how many,
 *  or -ENOSPC when the oldest one's payload alone does not fit (nothing taken). */
KVX_API int kvx_notice_poll_data(kvx_transport_t *transport, kvx_notice_data_t *out, size_t max,
                                 void *buf, size_t cap);

/* ---- Names ----------------------------------------------------------------------------------
 * Agent names stay at most KVX_NAME_MAX (63) bytes; a NIXL agent name longer than that is
 * mapped by the plugin (a prefix and a hash), and metadata carries the NIXL name beside. */
#endif /* KVX_REGION_MAIN */

/* ---- The notice payload of a transfer --------------------------------------------------------
 * The draft says only, in a comment: "kvx_xfer_params_t gains KVX_XFER_PARAM_NOTICE_DATA with
 * const void *notice_data; size_t notice_len (1..KVX_NOTICE_DATA_MAX bytes, copied). A write
 * with it tells the receiver, once all its bytes landed, with that payload; a read with it tells
 * the peer it read from, once all its bytes arrived here." Until kvx.h has the flag, the plugin
 * uses this layout: today's kvx_xfer_params_t with the two fields appended (the bit is the next
 * free one). kvx_nixl_xfer_params_t is what the plugin fills; it is kvx_xfer_params_t itself
 * once the core has the fields. */
#ifndef KVX_XFER_PARAM_NOTICE_DATA
#define KVX_XFER_PARAM_NOTICE_DATA (1u << 4)
typedef struct kvx_nixl_xfer_params {
    uint64_t field_mask;
    uint64_t deadline_ms;
    uint64_t tag;
    uint32_t flags;
    uint32_t priority;
    const void *notice_data;
    size_t notice_len;
} kvx_nixl_xfer_params_t;
#define KVX_NIXL_XFER_PARAMS(p) ((const kvx_xfer_params_t *)(const void *)(p))
#else
typedef kvx_xfer_params_t kvx_nixl_xfer_params_t;
#define KVX_NIXL_XFER_PARAMS(p) (p)
#endif

#ifdef __cplusplus
}
#endif

#endif /* KVX_NIXL_KVX_NEXT_H */
