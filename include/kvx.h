/*
 * kvx: move fixed-size KV-cache blocks between processes and hosts over UCX.
 * The public API. Read it top to bottom: objects, lifetime, transfers, completions, errors.
 */
#ifndef KVX_H
#define KVX_H

#include <stddef.h>
#include <stdint.h>

#include "kvx_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KVX_API __attribute__((visibility("default")))
#else
#define KVX_API
#endif

/*
 * Overview
 * --------
 * A transport (kvx_transport_t) owns one memory region of num_blocks x block_len bytes. It exports
 * a small metadata blob (kvx_transport_metadata) that a peer passes to kvx_peer_add under a name
 * of its choosing (the peer id). Transfers move lists of blocks by index: kvx_xfer_write pushes
 * local block local_idxs[i] into the peer's block remote_idxs[i]; kvx_xfer_read pulls the other
 * way. Each transfer gets an id and completes exactly once, as a success or a negative errno,
 * reaped with kvx_transport_poll.
 *
 * The receiving side is in charge of its region: every byte a peer sends travels in kvx's own
 * messages (UCX active messages), and the receiving kvx checks each one before it applies it.
 * Bytes land only inside the region, only from peers that hold its metadata (a random
 * capability in it, and the shared secret when one is set), and never after the receiver has
 * fenced them (kvx_fence). Nothing of the region is exposed to UCX's one-sided operations. The
 * exception is a region kvx allocates (KVX_PARAM_OWN_REGION): peers on the same host map it and
 * copy into it themselves, bounded by kvx's index checks and the segment (docs/security.md).
 *
 * Return values: every function returning int returns >= 0 on success (a count where documented)
 * and a negative errno on failure. kvx-specific codes live above KVX_ERRNO_OFFSET.
 *
 * Threading: all functions taking a transport may be called from any thread, concurrently with
 * each other, kvx_transport_close included (calls that overlap it return -ESHUTDOWN); only
 * kvx_transport_destroy must not race with any other call on the same transport. No call holds
 * kvx's lock while it waits on the network (a peer's wire-up, a connection's close), so a slow
 * or stopped peer never stalls other peers' transfers. A background progress thread (on by
 * default, see num_threads) drives UCX so that peers can write into and read from this
 * transport's region while the application never calls kvx at all.
 * Completions are only ever delivered through kvx_transport_poll; kvx never calls back into the
 * application except through the log callback.
 */

/** Opaque transport handle. */
typedef struct kvx_transport kvx_transport_t;

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

/** kvx-specific error codes are returned negated, like errno values: -KVX_EINCOMPAT. */
#define KVX_ERRNO_OFFSET 1000
/** The peer is incompatible: a different block length or a different config fingerprint. */
#define KVX_EINCOMPAT (KVX_ERRNO_OFFSET + 1)
/** A write the receiver fenced (kvx_fence): none of its bytes lands after the fence. */
#define KVX_EFENCED (KVX_ERRNO_OFFSET + 2)

/**
 * Name an error code returned by kvx (negative or positive). Returns a static string; never NULL,
 * never needs freeing. Unknown codes give "unknown error".
 */
KVX_API const char *kvx_strerror(int err);

/** Version of the library actually loaded, as "MAJOR.MINOR.PATCH" (a static string). */
KVX_API const char *kvx_version(void);

/* ---------------------------------------------------------------------------------------------
 * Logging
 * ------------------------------------------------------------------------------------------- */

typedef enum kvx_log_level {
    KVX_LOG_OFF = 0,
    KVX_LOG_ERROR = 1,
    KVX_LOG_WARN = 2,
    KVX_LOG_INFO = 3,
    KVX_LOG_DEBUG = 4
} kvx_log_level_t;

/**
 * Log sink: receives one formatted line (no trailing newline) and the level. May be called from
 * any thread, including the progress thread, with kvx's internal lock held: it must not call kvx.
 */
typedef void (*kvx_log_fn)(void *arg, int level, const char *msg);

/**
 * Set the process-wide log sink and level used by transports that set none of their own, and by
 * errors seen before a transport exists. fn == NULL restores the default sink (stderr). The
 * default level is KVX_LOG_OFF unless the environment variable KVX_LOG names one of "error",
 * "warn", "info", "debug". arg is kept until the next call; kvx never frees it.
 */
KVX_API void kvx_log_set(kvx_log_fn fn, void *arg, int level);

/* ---------------------------------------------------------------------------------------------
 * Transport lifetime
 * ------------------------------------------------------------------------------------------- */

/** Longest agent name (a writer's too, kvx_notice_t.writer), in bytes, without the NUL. */
#define KVX_NAME_MAX 63
/** Size of an address text, "host:port" (kvx_transport_attr_t.listen_addr). */
#define KVX_ADDR_MAX 96
/** Longest peer id (kvx_peer_add), in bytes, without the terminating NUL. */
#define KVX_PEER_ID_MAX 255
/** Longest fingerprint (kvx_params_t.fingerprint), in bytes, without the terminating NUL. */
#define KVX_FINGERPRINT_MAX 64

/** Bits of kvx_params_t.field_mask: a field whose bit is clear takes its documented default. */
enum kvx_params_field {
    /** base, num_blocks, block_len: required. The main region (KVX_REGION_MAIN); or none, with
     *  base NULL, num_blocks 0 and block_len 0 all three (without KVX_PARAM_OWN_REGION): block
     *  calls then return -ENOENT, the metadata says 0 blocks of 0 bytes, and data moves through
     *  registered regions and ranges only (kvx_region_register). */
    KVX_PARAM_REGION = 1u << 0,
    KVX_PARAM_AGENT_NAME = 1u << 1,   /**< default: "kvx-<host>-<pid>-<random>" */
    KVX_PARAM_FINGERPRINT = 1u << 2,  /**< default: "" (compatible with every peer) */
    KVX_PARAM_BACKENDS = 1u << 3,     /**< default: {"ucx"} */
    KVX_PARAM_NUM_THREADS = 1u << 4,  /**< default: 1 */
    KVX_PARAM_DEADLINE = 1u << 5,     /**< default: 5000 ms */
    KVX_PARAM_KEEPALIVE = 1u << 6,    /**< default: 1000 ms */
    KVX_PARAM_LOG = 1u << 7,          /**< default: the process-wide sink of kvx_log_set */
    KVX_PARAM_STALL = 1u << 8,        /**< default: 2000 ms */
    KVX_PARAM_SECRET = 1u << 9,       /**< default: none */
    KVX_PARAM_NET_DEVICES = 1u << 10, /**< default: UCX's (every device) */
    KVX_PARAM_INTEGRITY = 1u << 11,   /**< default: off */
    KVX_PARAM_NOTICES = 1u << 12,     /**< default: 1024 */
    KVX_PARAM_OWN_REGION = 1u << 13,  /**< default: the application provides the region */
    KVX_PARAM_RNDV = 1u << 14,        /**< default: KVX_RNDV_AUTO, each lane's threshold */
    KVX_PARAM_THREAD_MODE = 1u << 15  /**< default: KVX_THREAD_YIELDS */
};

/** How a transfer's data travels (kvx_params_t.rndv_mode). By rendezvous, the receiving side
 *  checks a run's header first, then UCX moves the run into the place the header names; in
 *  eager messages, the receiving side copies it out of UCX's buffers. Each side says in its
 *  handshake whether it takes rendezvous payloads (every mode but KVX_RNDV_EAGER does), and a
 *  side sends by rendezvous only to a peer that takes them, so any two modes work together. */
enum kvx_rndv_mode {
    /** Rendezvous where UCX moves it by zero-copy RMA (the connection's rendezvous lanes are all
     *  rc, dc or gga: an RDMA READ or WRITE straight into the place the receiver chose), for
     *  runs of at least rndv_thresh bytes if set, else of UCX's own threshold for that endpoint
     *  (or 8 KiB when UCX says none); eager on every other lane (tcp, shared memory, cma, ud,
     *  the GPU copy engines: there UCX's rendezvous of host memory is a copy all the same).
     *  Takes rendezvous payloads. docs/guide.md, "Rendezvous modes". */
    KVX_RNDV_AUTO = 0,
    /** Every byte in eager messages, both ways: this transport sends no rendezvous payload, and
     *  its handshake tells peers it takes none (one sent anyway is refused: -EPROTO). */
    KVX_RNDV_EAGER = 1,
    /** Every run of at least rndv_thresh bytes (every run, with 0) by rendezvous, on every lane,
     *  to peers that take them. Takes rendezvous payloads. */
    KVX_RNDV_ALWAYS = 2
};

/** How the progress thread (num_threads > 0) shares UCX with an application that polls
 *  (kvx_params_t.thread_mode). Only one thread at a time can drive UCX's worker: two that take
 *  turns slow each other down, and one that waits for the other adds its wait to every
 *  transfer. */
enum kvx_thread_mode {
    /** The thread steps aside for a millisecond after each kvx_transport_poll (or
     *  kvx_transport_wait) of the application's, and for as long as the polls keep coming: an
     *  application that spins on kvx_transport_poll drives UCX alone, at its own pace. An
     *  application that polls with gaps of its own (once per step of a serving loop, from Python)
     *  leaves UCX undriven for up to a millisecond after each poll: use KVX_THREAD_DRIVES. A
     *  transport whose application asked for an event descriptor (kvx_transport_event_fd) polls
     *  when woken, and the thread never steps aside for it. */
    KVX_THREAD_YIELDS = 0,
    /** The thread always drives UCX; the application's polls add progress steps of their own. */
    KVX_THREAD_DRIVES = 1
};

/** Largest value accepted for a duration in milliseconds (deadline_ms, keepalive_ms, stall_ms):
 *  10^12 ms, about 31 years. Larger values are rejected with -EINVAL. */
#define KVX_MS_MAX 1000000000000ull

/**
 * Creation parameters. Start from zero, set the fields you need and name them in field_mask.
 * Every pointer is read during kvx_transport_create only; kvx copies what it keeps.
 */
typedef struct kvx_params {
    uint64_t field_mask;

    /** The region: num_blocks blocks of block_len bytes starting at base (all three NULL or 0:
     *  no main region, KVX_PARAM_REGION). It must stay mapped and
     *  valid until kvx_transport_close returns; kvx never frees it. num_blocks * block_len must
     *  not overflow and must not wrap the address space.
     *
     *  With KVX_PARAM_OWN_REGION, base must be NULL: kvx allocates the region itself, through
     *  UCX, from shared memory (zero-filled; if UCX can only give private memory, its contents
     *  start unspecified and peers use messages), and kvx_transport_query
     *  (KVX_TRANSPORT_ATTR_REGION) gives its address. A peer on this host that holds the metadata
     *  maps it and, once this transport has answered its handshake, writes and reads it with one
     *  memcpy of its own, with no work by this transport: its progress thread may sleep and the
     *  process may even be stopped (writes with KVX_XFER_NOTIFY excepted: their notice needs this
     *  side). The peer's transport is then named "sysv-mapped" (from the handshake's answer on,
     *  which kvx_peer_add waits 200 ms for; a later answer renames it then). The peer maps only
     *  a System V segment that the metadata's process created (one of its own process only if it
     *  is an owned region of a transport there), holding the region and a trailer kvx writes at
     *  the segment's end (one page is allocated beyond the region for it), and copies nothing
     *  until this transport's handshake brings the random token that trailer holds; anything
     *  else goes in messages (kvx_transport_attr_t.maps_refused). Every peer that connects
     *  receives the token, so a holder of this metadata can steer another writer's copies into
     *  this region, never past it (docs/security.md). Such a peer's bytes are not seen by this
     *  side: kvx_fence and integrity do not apply to them (docs/guide.md). The region
     *  stays mapped after kvx_transport_close (what landed can still be read) and is freed by
     *  kvx_transport_destroy: the application must not touch it after that. */
    void *base;
    uint64_t num_blocks;
    uint64_t block_len;

    /** Unique name of this agent among its peers; 1..KVX_NAME_MAX printable ASCII characters. */
    const char *agent_name;

    /** Configuration fingerprint (at most KVX_FINGERPRINT_MAX printable characters). Two
     *  transports whose fingerprints are both non-empty and differ refuse to pair. The Python
     *  binding computes it as the first 16 hex digits of sha256 of the config dict in JSON. */
    const char *fingerprint;

    /** Backend names, tried in order. Only "ucx" (any case) exists; anything else is -EINVAL. */
    const char *const *backends;
    size_t num_backends;

    /** Progress threads. 0: no thread, so the application must call kvx_transport_poll for its
     *  own transfers and for peers' transfers into its region to progress. Any positive value
     *  starts one thread: UCX drives one worker per transport, and more threads would only
     *  contend for it. Idle, the thread sleeps on the worker's event fd. */
    unsigned num_threads;

    /** Default per-transfer deadline in milliseconds, counted from submission; 0 disables it.
     *  At most KVX_MS_MAX. A transfer still unfinished at its deadline fails with -ETIMEDOUT,
     *  whatever its state, reported by its deadline + 200 ms at the latest (see
     *  kvx_xfer_write). */
    uint64_t deadline_ms;

    /** Keepalive interval in milliseconds: how soon a dead peer with transfers in flight is
     *  noticed (within about 1.5 x this value; a peer process on this host is watched by kvx
     *  itself, so that one that died but was not reaped counts as dead too). 0 keeps UCX's own
     *  setting. At most KVX_MS_MAX. */
    uint64_t keepalive_ms;

    /** Log sink and level for this transport (see kvx_log_set). */
    kvx_log_fn log_fn;
    void *log_arg;
    int log_level;

    /** Stall limit in milliseconds: a connection that owes answers (handshake, acknowledgements,
     *  read data, a notice's answer, messages UCX holds) and heard nothing from its peer for
     *  this long fails, and with it every transfer in flight to that peer (-ETIMEDOUT), whatever
     *  their deadlines; it is checked every 100 ms. A transfer waiting for a connection (a peer
     *  paired by address pairing again, a handshake not answered yet) fails with -ETIMEDOUT
     *  stall_ms after its submission. So a transfer never hangs even with no deadline
     *  (deadline_ms = 0, for very large transfers): it is reported within stall_ms + 100 ms of
     *  the later of its submission and its peer's last sign of life; a slow but moving peer is
     *  never given up. 0 disables it. At most KVX_MS_MAX. */
    uint64_t stall_ms;

    /** A shared secret (1..KVX_SECRET_MAX bytes; copied). With one, the metadata is signed
     * (HMAC-SHA256) and peers' metadata must carry this secret's signature (else kvx_peer_add
     * returns -EACCES before any of it reaches UCX), and a peer connecting to this transport must
     * prove it holds the secret, in its HELLO and then over a fresh nonce of this transport's,
     * before anything else happens. See docs/security.md. */
    const void *secret;
    size_t secret_len;

    /** The network devices UCX may listen and connect on, as UCX_NET_DEVICES takes them
     *  ("lo", "eth0,eth1"; copied). Default: every device. Shared memory is not a network
     *  device: peers on this host still use it. */
    const char *net_devices;

    /** Integrity: nonzero adds a CRC-32C of every piece of data this transport sends as an
     *  initiator (its writes, and what its reads bring back): the side that receives checks it
     *  before the bytes count as landed, and a mismatch fails the transfer with -EBADMSG. */
    int integrity;

    /** How many arrival notices (kvx_notice_poll) may wait here at once, 1..KVX_NOTICES_MAX. A
     * write whose notice finds the queue full fails at its sender with -ENOSPC. */
    size_t notice_queue;

    /** How data travels (KVX_PARAM_RNDV): rndv_mode is a kvx_rndv_mode, and rndv_thresh, at most
     *  UINT32_MAX, the smallest run in bytes that goes by rendezvous where the mode chooses it (0:
     *  the lane's threshold with KVX_RNDV_AUTO, every run with KVX_RNDV_ALWAYS). With
     *  KVX_LOG=debug each connection logs which way its runs go and why. On an RDMA lane UCX's
     *  rendezvous hands the peer a remote key for the memory UCX registered for that transfer:
     *  see docs/security.md, "Rendezvous and remote keys", for what it covers. */
    int rndv_mode;
    uint64_t rndv_thresh;

    /** How the progress thread shares UCX with the application's polls (KVX_PARAM_THREAD_MODE):
     *  a kvx_thread_mode. No effect without a progress thread. */
    int thread_mode;
} kvx_params_t;

/** The longest shared secret, in bytes. */
#define KVX_SECRET_MAX 1024
/** The most arrival notices that may wait at once (notice_queue). */
#define KVX_NOTICES_MAX (1u << 20)

/**
 * Create a transport: take the region, start UCX, start the progress thread.
 * Returns 0 and sets *transport_p, or a negative errno (-EINVAL for bad parameters, a duration
 * above KVX_MS_MAX included, -ENOMEM, -ENODEV when UCX cannot start) and leaves *transport_p
 * untouched. The caller owns the handle and releases it with kvx_transport_destroy.
 */
KVX_API int kvx_transport_create(const kvx_params_t *params, kvx_transport_t **transport_p);

/**
 * Shut a transport down: fail what is in flight, close every peer connection, stop the progress
 * thread, deregister the region. Idempotent: a second call returns 0 and does nothing. It may
 * overlap other calls on the transport from other threads: from the moment it begins, every
 * other call returns -ESHUTDOWN, and calls asleep in kvx_transport_wait or waiting in
 * kvx_peer_add / kvx_peer_remove wake and return -ESHUTDOWN before the teardown proceeds. The
 * handle stays valid for kvx_transport_destroy. When this returns, kvx and UCX no longer touch
 * the region, with one exception: an owned region (KVX_PARAM_OWN_REGION) stays mapped until
 * kvx_transport_destroy, and peers on this host that mapped it may still copy into it until
 * they notice the close (their keepalive, at most about 1.5 x keepalive_ms).
 */
KVX_API int kvx_transport_close(kvx_transport_t *transport);

/** Close the transport if needed and free the handle. NULL is accepted and ignored. */
KVX_API void kvx_transport_destroy(kvx_transport_t *transport);

/** What peers did to this transport's region, and what kvx refused them (cumulative). */
typedef struct kvx_recv_counters {
    uint64_t bytes_landed;    /**< bytes peers' writes put into the region */
    uint64_t writes_landed;   /**< write messages applied */
    uint64_t bytes_served;    /**< bytes peers' reads took from the region */
    uint64_t notices;         /**< arrival notices queued for kvx_notice_poll */
    uint64_t drop_malformed;  /**< messages kvx's decoder refused */
    uint64_t drop_capability; /**< connection requests without the capability (or the secret), or
                               *   with a retired one (kvx_fence_ex) */
    uint64_t drop_unknown;    /**< messages naming no connection of this transport, or forged */
    uint64_t drop_range;      /**< writes or reads of bytes outside the region */
    uint64_t drop_fenced;     /**< write messages a fence dropped */
    uint64_t drop_crc;        /**< data whose checksum did not match */
    uint64_t drop_other;      /**< rendezvous payloads this transport takes none of
                               *   (KVX_RNDV_EAGER), HELLOs it could make no connection for,
                               *   notices over the queue or over KVX_NOTICE_QUEUE_BYTES of
                               *   payload, overflows */
    /** Connections closed because their replies could not leave (docs/security.md, "Resource
     *  bounds"): acknowledgements, read requests or control messages over their bound, per
     *  connection or per transport. Their writers' transfers on them fail. */
    uint64_t conns_overflow;
    /** Connections closed to give their slot to a new one (slots short, or the writer's name
     *  over its share): unproven ones first, then those that never completed a transfer (after
     *  their first second), then the least recently active, oldest first. */
    uint64_t conns_evicted;
    /** With a secret: messages on a connection that had not proven the secret over this
     *  receiver's nonce yet, wrong proofs, and unproven connections expired (each closes it). */
    uint64_t drop_unproven;
    /** HELLOs refused by a bound on endpoints: more than 16 of one writer's name waiting for
     *  the rates of new connections (HELLOs over the rates wait, they are not refused), or
     *  catch-up endpoints over their budget. */
    uint64_t drop_hello_limit;
    /** With a secret: HELLOs whose proof this transport saw in the last 10 s (a recorded HELLO
     *  replayed), dropped before they take any of the bounds above. */
    uint64_t drop_replayed;
    /** Write messages whose payload came by rendezvous: received into the region after their
     *  header's checks (included in writes_landed once landed). */
    uint64_t rndv_landed;
    /** Rendezvous receives that did not end well: their sender vanished, stopped past the
     *  stall limit, or their connection closed meanwhile (each closes the connection). */
    uint64_t rndv_failed;
    /** READ_DATA messages this side sent whose payload UCX moved by rendezvous (a read's run of
     *  at least the lane's threshold, one contiguous piece each, checked by the reader against
     *  its request before it receives it into its blocks). */
    uint64_t rndv_served;
    /** HELLOs whose writer counted more endpoints towards this transport than the catch-up
     *  budget lets it open (16 per HELLO, 32 open towards one worker, 256 in all): answered
     *  without catching up, so their connections work by eager messages and their rendezvous
     *  payloads are refused. */
    uint64_t catchup_over;
} kvx_recv_counters_t;

/** Bits of kvx_transport_attr_t.field_mask. */
enum kvx_transport_attr_field {
    KVX_TRANSPORT_ATTR_AGENT_NAME = 1u << 0,
    KVX_TRANSPORT_ATTR_FINGERPRINT = 1u << 1,
    KVX_TRANSPORT_ATTR_REGION = 1u << 2,
    KVX_TRANSPORT_ATTR_NUM_THREADS = 1u << 3,
    KVX_TRANSPORT_ATTR_DEADLINE = 1u << 4,
    KVX_TRANSPORT_ATTR_METADATA_LEN = 1u << 5,
    KVX_TRANSPORT_ATTR_NUM_PEERS = 1u << 6,
    KVX_TRANSPORT_ATTR_STALL = 1u << 7,
    KVX_TRANSPORT_ATTR_RECV = 1u << 8,
    KVX_TRANSPORT_ATTR_LISTEN = 1u << 9,
    KVX_TRANSPORT_ATTR_MAPS_REFUSED = 1u << 10,
    KVX_TRANSPORT_ATTR_REGIONS = 1u << 11,
    KVX_TRANSPORT_ATTR_THREAD = 1u << 12
};

/** Regions of this transport and what kvx refused peers' messages naming them (cumulative;
 *  kvx_transport_attr_t.regions). A refused message is counted once, by its first fault, and
 *  its bytes never touch memory; the writer's (reader's) transfer fails with the status
 *  named. Runs out of a region's bounds are counted in kvx_recv_counters_t.drop_range
 *  (-EINVAL). */
typedef struct kvx_region_counters {
    uint64_t registered;    /**< regions registered now (the main region included) */
    uint64_t registrations; /**< kvx_region_register calls that succeeded, life long */
    uint64_t drop_region;   /**< messages naming a region unknown or deregistered: -ENOENT */
    uint64_t drop_region_capability; /**< ... with another capability than the region's: -EACCES */
    uint64_t drop_access; /**< writes to a region without KVX_REGION_WRITE, reads of one without
                           *   KVX_REGION_READ: -EACCES */
    /** Connections a deregistration closed because they still held the region when its wait
     *  ended (their other transfers fail: kvx_region_deregister). */
    uint64_t dereg_closed;
} kvx_region_counters_t;

/** Transport attributes; only the fields named in field_mask are written. */
typedef struct kvx_transport_attr {
    uint64_t field_mask;
    char agent_name[KVX_NAME_MAX + 1];
    char fingerprint[KVX_FINGERPRINT_MAX + 1];
    void *base;
    uint64_t num_blocks;
    uint64_t block_len;
    unsigned num_threads; /**< progress threads actually running (0 or 1) */
    uint64_t deadline_ms;
    size_t metadata_len;
    size_t num_peers;
    uint64_t stall_ms;
    kvx_recv_counters_t recv; /**< every peer's, this transport's life long */
    /** Where kvx_transport_listen bound, "host:port" with the port it got; empty if not
     *  listening. */
    char listen_addr[KVX_ADDR_MAX];
    /** Owned regions of peers on this host that this transport would not map, their data going
     *  in messages instead (each also logged as a warning): a region key naming a System V
     *  segment that this process created and that is no owned region of a transport of this
     *  process (UCX's own FIFOs, say), or one that the metadata's process did not create, or
     *  that does not start with the region and hold it and its owner's trailer, or a peer whose
     *  handshake did not bring the token the segment holds. A key that gives no mapping at all
     *  (another host, no shared memory, a POSIX segment) is not counted. Cumulative, under
     *  KVX_TRANSPORT_ATTR_MAPS_REFUSED. */
    uint64_t maps_refused;
    /** Regions, and peers' messages refused by them (KVX_TRANSPORT_ATTR_REGIONS). */
    kvx_region_counters_t regions;
    /** The progress thread's mode (a kvx_thread_mode), and how many times it stepped aside for
     *  the application's polls, life long (KVX_TRANSPORT_ATTR_THREAD). */
    int thread_mode;
    uint64_t thread_asides;
} kvx_transport_attr_t;

/** Fill the attributes named in attr->field_mask. Returns 0, -EINVAL or -ESHUTDOWN. */
KVX_API int kvx_transport_query(kvx_transport_t *transport, kvx_transport_attr_t *attr);

/**
 * Listen for peers that pair by address (kvx_peer_connect), on UCX's connection manager (its tcp
 * sockets), at addr: "host:port", host an IPv4 or IPv6 address ("[::1]:port") or a name, port 0
 * for any (kvx_transport_query's listen_addr says which). It binds only there: 0.0.0.0 must be
 * asked for. A connecting transport gets this transport's metadata (the blob
 * kvx_transport_metadata returns) and nothing else; with a shared secret, only after proving it
 * holds the secret (an answer over a fresh random nonce, HMAC-SHA256), and without one, anyone
 * who can reach the address gets it. Connections that do not finish the exchange within 2 s are
 * closed, and at most 256 wait at once (more are rejected), so junk and floods of connections
 * do not keep real peers out for long (a client that keeps opening them does: see
 * docs/security.md). addr need only stay valid during the call. Returns 0, or -EINVAL (bad
 * address), -EALREADY (already listening), -EADDRINUSE, -ESHUTDOWN, or what UCX reported.
 */
KVX_API int kvx_transport_listen(kvx_transport_t *transport, const char *addr);

/**
 * Copy this transport's metadata into buf. *len_p is buf's size on entry and the metadata's size
 * on return. Returns 0, or -ENOSPC with *len_p set to the size needed (buf untouched). The size
 * does not depend on num_blocks (a few hundred bytes). buf may be NULL when *len_p is 0. After
 * kvx_fence_ex with KVX_FENCE_RETIRE it is new metadata (a fresh capability), of the same size:
 * a peer added with the old one is refused (-EKEYREVOKED).
 */
KVX_API int kvx_transport_metadata(kvx_transport_t *transport, void *buf, size_t *len_p);

/* ---------------------------------------------------------------------------------------------
 * Peers
 * ------------------------------------------------------------------------------------------- */

/** Bits of kvx_peer_params_t.field_mask. */
enum kvx_peer_params_field {
    /** Check the metadata against these values: any disagreement is -EINVAL. */
    KVX_PEER_PARAM_EXPECT_REGION = 1u << 0,
    /** flags: KVX_PEER_ADD_PURGE */
    KVX_PEER_PARAM_FLAGS = 1u << 1
};

/** kvx_peer_params_t.flags */
enum kvx_peer_add_flags {
    /** Replacing an existing peer_id: the old connection's transfers still in flight are
     *  forgotten, as kvx_peer_remove_ex(KVX_PEER_REMOVE_PURGE) forgets them (their ids never
     *  come out of poll; like an immediate cancel, UCX may still read a write's blocks until
     *  that connection has closed), instead of failing with -ECONNABORTED. Completions already
     *  queued stay, and transfers waiting for a reconnection go to the new connection. */
    KVX_PEER_ADD_PURGE = 1u << 0
};

/** Optional parameters of kvx_peer_add and kvx_peer_connect. The peer keeps them: a peer paired
 *  by address checks every reconnection's metadata against them too. */
typedef struct kvx_peer_params {
    uint64_t field_mask;
    uint64_t base_addr;
    uint64_t num_blocks;
    uint64_t block_len;
    uint32_t flags; /**< KVX_PEER_ADD_PURGE; other bits are -EINVAL */
} kvx_peer_params_t;

/**
 * Connect to a peer described by its metadata and call it peer_id (1..KVX_PEER_ID_MAX bytes).
 * The connection is wired up at once, so that the first transfer does not pay for it: the call
 * waits up to 200 ms for the peer to answer, without
 * holding up other calls or other peers' transfers meanwhile; a peer that does not answer in
 * time (stopped, overloaded) finishes the wire-up in the background (its state is
 * KVX_PEER_WIRING until then), and transfers to it wait behind it, within their deadlines and
 * the stall limit. A peer on this host whose process has exited (reaped or not) is refused at
 * once with -EHOSTUNREACH.
 * Returns 0, or:
 *   -EINVAL           bad arguments, or metadata that disagrees with params' expected region
 *   -EBADMSG          metadata malformed, truncated, corrupted, or not kvx's
 *   -EPROTONOSUPPORT  metadata of a format version this library does not know
 *   -KVX_EINCOMPAT    block length differs from ours, or both fingerprints set and different
 *   -EEXIST           the metadata is this transport's own (same agent name)
 *   -ESTALE           peer_id names a peer whose connection is healthy (open, its handshake
 *                     answered, no error, not pairing again) and of a later generation (see
 *                     kvx_peer_attr_t.generation) than this blob: a stale copy. The refusal
 *                     lasts only as long as that connection: once it failed, a blob of any
 *                     generation replaces it, so a peer whose clock stepped back, or one
 *                     forged blob of generation 2^64-1 (without a secret, anyone holding the
 *                     metadata can make one), cannot lock the id out. Remove the peer first to
 *                     point a healthy peer_id at an older transport on purpose. (kvx_peer_connect
 *                     never returns it: a listener's answer is not a copy.)
 *   -EKEYREVOKED      the peer answered that it retired this metadata's capability
 *                     (kvx_fence_ex, KVX_FENCE_RETIRE): get its new metadata (a peer that
 *                     answers after the 200 ms fails the same way later, see KVX_PEER_WIRING)
 *   -EHOSTUNREACH, -ECONNREFUSED, ...  UCX could not reach the peer
 * On any error nothing changes: an existing peer of that id keeps its connection.
 * If peer_id already names a peer, that peer is replaced: the new connection is installed (a
 * write submitted meanwhile goes to one or the other), then the call waits (up to 2 s, lock
 * released) for the old connection to close: its transfers in flight fail with -ECONNABORTED
 * (they come out of poll under the same peer_id). Adds and removes of one peer id take effect
 * in the order they were called. If the transport is closed while the call waits for the
 * wire-up, it returns -ESHUTDOWN. Cost does not depend on num_blocks.
 * metadata and params need only stay valid during the call.
 */
KVX_API int kvx_peer_add(kvx_transport_t *transport, const char *peer_id, const void *metadata,
                         size_t metadata_len, const kvx_peer_params_t *params);

/**
 * Remove a peer: its transfers in flight fail with -ECONNABORTED (they come out of the next poll)
 * and its connection is released even if a step of the teardown fails. Other peers are not
 * touched. The call waits (up to 2 s, without holding up other calls) for that peer's connection
 * to close, so that its transfers have failed when it returns (a close of the transport ends
 * that wait early). Returns 1 if the peer existed (it is removed), 0 if it did not (a no-op),
 * or -EINVAL / -ESHUTDOWN.
 */
KVX_API int kvx_peer_remove(kvx_transport_t *transport, const char *peer_id);

/** Flags of kvx_peer_remove_ex. */
enum kvx_peer_remove_flags {
    /** Forget the peer's transfers instead of failing them: their ids never come out of poll,
     *  whatever their state (queued, in flight, parked for a reconnection, a failed write still
     *  waiting for UCX to let go of its messages, finished and not yet polled: the seed's
     *  remove_remote_peer). Forgetting is not stopping: as with KVX_CANCEL_IMMEDIATE, their
     *  bytes may still be moving until the connection has closed (the call waits up to 2 s for
     *  that): UCX may still read a purged write's local blocks and a purged read's local blocks
     *  may still change, a purged write's remote blocks too. */
    KVX_PEER_REMOVE_PURGE = 1u << 0
};

/** kvx_peer_remove with flags (0 or KVX_PEER_REMOVE_PURGE); other bits are -EINVAL. */
KVX_API int kvx_peer_remove_ex(kvx_transport_t *transport, const char *peer_id, unsigned flags);

/**
 * Pair with a transport that listens at addr ("host:port", as kvx_transport_listen takes it)
 * and call it peer_id: kvx connects to it through UCX's connection manager, proves the shared
 * secret if this transport has one, receives the listener's metadata, closes that connection,
 * and adds the peer with that metadata exactly as kvx_peer_add does (the same checks, errors,
 * replacement rules, and the same data path: shared memory between processes on one host).
 * Waits up to 5 s for the listener's answer, without holding up other calls (what pairing takes:
 * docs/guide.md, "Pairing by address"). addr and params
 * need only stay valid during the call; a name is resolved once (its first address), and the
 * peer pairs again at that address. Returns what
 * kvx_peer_add returns, or -EINVAL (bad address), -ECONNREFUSED / -EHOSTUNREACH (nothing
 * listens there, or unreachable), -EACCES (the listener requires a secret this transport does
 * not hold, or its answer is not signed with ours for this exchange), -EPROTO (an answer that
 * is not one), -ETIMEDOUT (no answer in time).
 *
 * A peer paired this way heals: when its connection fails (its process died, the stall limit, a
 * lost link), its transfers in flight fail as for any peer (-ECONNRESET, -ETIMEDOUT), and kvx
 * pairs with the address again, at once and then with a backoff that doubles from 10 ms up to
 * 500 ms between attempts, until it succeeds or the peer is removed or re-added. Meanwhile the
 * peer's state is KVX_PEER_RECONNECTING and transfers submitted to it wait (their remote
 * indices checked against the region last known) until the new connection takes them or their
 * deadline or the stall limit (stall_ms after their submission) fails them with -ETIMEDOUT; a
 * transfer whose blocks lie beyond the new region fails with -EINVAL.
 * The listener's new metadata passes kvx_peer_add's checks, params' expected region included (an
 * incompatible one is refused and kvx keeps trying), but not the generation: the address's
 * answer is authoritative, so a process that restarted with its wall clock behind (an older
 * generation) is taken too. kvx_peer_event_poll reports KVX_PEER_EVENT_DOWN, then RESTARTED
 * (another generation, older or newer: kvx_peer_attr_t.generation changed, the remote region's
 * contents are gone) or RECONNECTED. A peer added with kvx_peer_add (a metadata blob) keeps
 * failing as before.
 */
KVX_API int kvx_peer_connect(kvx_transport_t *transport, const char *peer_id, const char *addr,
                             const kvx_peer_params_t *params);

/** Kinds of kvx_peer_event_t. */
typedef enum kvx_peer_event_type {
    /** a peer paired by address lost its connection; kvx pairs with the address again */
    KVX_PEER_EVENT_DOWN = 1,
    /** ... and paired again with a transport of another generation (newer, or older when its
     *  clock stepped back): the process restarted, and the contents of its region did not
     *  survive */
    KVX_PEER_EVENT_RESTARTED = 2,
    /** ... and paired again with the same transport (the same generation): its region is intact,
     *  but writes that failed when the connection did may or may not have landed */
    KVX_PEER_EVENT_RECONNECTED = 3
} kvx_peer_event_type_t;

/** What happened to a peer paired by address (kvx_peer_event_poll). */
typedef struct kvx_peer_event {
    char peer_id[KVX_PEER_ID_MAX + 1];
    int type;            /**< kvx_peer_event_type_t */
    int error;           /**< DOWN: why the connection failed (a negative errno) */
    uint64_t generation; /**< the peer's generation after the event */
} kvx_peer_event_t;

/** How many peer events wait at most; when more come, the oldest are dropped. */
#define KVX_PEER_EVENTS_MAX 256

/**
 * Copy out up to max events of peers paired by address, oldest first, into out (max entries; it
 * need only stay valid during the call, and may be NULL when max is 0). Each event comes out
 * once. Returns how many (0: none), or -EINVAL / -ESHUTDOWN. Never waits.
 */
KVX_API int kvx_peer_event_poll(kvx_transport_t *transport, kvx_peer_event_t *out, size_t max);

/** State of a peer's connection (kvx_peer_attr_t.state). */
typedef enum kvx_peer_state {
    KVX_PEER_CONNECTED = 0, /**< wired: the peer answered the handshake */
    KVX_PEER_FAILED = 1,    /**< the connection failed (see error); remove or re-add the peer */
    KVX_PEER_REMOVED = 2,   /**< removed; still holds completions not yet polled */
    /** paired by address (kvx_peer_connect), its connection failed, and kvx is pairing with
     *  that address again; transfers submitted meanwhile wait for it, within their deadlines
     *  and the stall limit */
    KVX_PEER_RECONNECTING = 3,
    /** the connection is open and its handshake is under way (sent, not yet answered):
     *  transfers submitted now wait for it, within their deadlines and the stall limit.
     *  kvx_peer_add waits up to 200 ms for the answer, so it returns with a peer in this state
     *  when the peer is slower (stopped, overloaded, its progress held) */
    KVX_PEER_WIRING = 4
} kvx_peer_state_t;

/** Bits of kvx_peer_attr_t.field_mask. */
enum kvx_peer_attr_field {
    KVX_PEER_ATTR_AGENT_NAME = 1u << 0,
    KVX_PEER_ATTR_TRANSPORT = 1u << 1,
    KVX_PEER_ATTR_STATE = 1u << 2,
    KVX_PEER_ATTR_REGION = 1u << 3,
    KVX_PEER_ATTR_COUNTERS = 1u << 4,
    KVX_PEER_ATTR_RECV = 1u << 5,
    KVX_PEER_ATTR_GENERATION = 1u << 6
};

/** Size of kvx_peer_attr_t.transport. */
#define KVX_TRANSPORT_NAME_MAX 64

/** Peer attributes; only the fields named in field_mask are written. */
typedef struct kvx_peer_attr {
    uint64_t field_mask;
    char agent_name[KVX_NAME_MAX + 1];
    /** UCX transport(s) the data actually travels on, e.g. "sysv", "posix", "tcp", "rc_mlx5";
     *  several are joined by ','. Empty once the connection is gone. */
    char transport[KVX_TRANSPORT_NAME_MAX];
    /** 1 when this connection's writes move runs by zero-copy hardware RMA: runs at or above
     *  its rendezvous threshold go by UCX's rendezvous on an RDMA lane (after the receiving kvx
     *  checked their header). 0 otherwise: every byte in kvx's messages or a rendezvous UCX
     *  copies. */
    int rma_hw;
    int state; /**< kvx_peer_state_t */
    int error; /**< 0, or the negative errno that failed the connection */
    uint64_t remote_base;
    uint64_t remote_num_blocks;
    uint64_t block_len;
    /* Counters, cumulative over the peer's life (they survive re-adding the same peer id),
     * derived from the peer's kvx_stats_t: they count every transfer that ended, whether poll
     * reported it or it was purged or forgotten (kvx_xfer_cancel KVX_CANCEL_IMMEDIATE: failed,
     * as canceled). */
    uint64_t bytes_written; /**< bytes of successful writes */
    uint64_t bytes_read;    /**< bytes of successful reads */
    uint64_t xfers_done;    /**< ended with status 0 */
    uint64_t xfers_failed;  /**< ended with any other status */
    uint64_t xfers_inflight;
    uint64_t latency_sum_ns; /**< submit-to-completion, summed over done + failed */
    uint64_t latency_max_ns;
    /** What the peer's transport (by agent name) did to this transport's region over its
     *  connections to it, and what kvx refused it; zero if it never connected. */
    kvx_recv_counters_t recv;
    /** The generation of the peer's metadata: when its transport was created (ns since the
     *  epoch, by its host's clock). A peer whose process restarted has another one (newer,
     *  unless its clock stepped back), and its region's contents did not survive. */
    uint64_t generation;
} kvx_peer_attr_t;

/** Fill the attributes named in attr->field_mask. Returns 0, -ENOENT, -EINVAL or -ESHUTDOWN. */
KVX_API int kvx_peer_query(kvx_transport_t *transport, const char *peer_id, kvx_peer_attr_t *attr);

/* ---------------------------------------------------------------------------------------------
 * Transfers
 * ------------------------------------------------------------------------------------------- */

/** Bits of kvx_xfer_params_t.field_mask. */
enum kvx_xfer_params_field {
    /** override the transport's deadline; 0 disables it; at most KVX_MS_MAX */
    KVX_XFER_PARAM_DEADLINE = 1u << 0,
    /** a tag (default 0) the receiver sees in notices and may fence by */
    KVX_XFER_PARAM_TAG = 1u << 1,
    /** flags: KVX_XFER_NOTIFY */
    KVX_XFER_PARAM_FLAGS = 1u << 2,
    /** priority: one of enum kvx_priority (default KVX_PRIO_NORMAL) */
    KVX_XFER_PARAM_PRIORITY = 1u << 3,
    /** notice_data, notice_len: a notice with this payload once every byte moved (reads too;
     *  see "Notices with a payload" below) */
    KVX_XFER_PARAM_NOTICE_DATA = 1u << 4
};

/**
 * kvx_xfer_params_t.priority. Transfers to one peer are posted highest level first; within a
 * level, in submission order (as without priorities: every transfer is KVX_PRIO_NORMAL unless
 * set). What a new transfer waits behind is bounded, whatever is queued at lower levels:
 *  - The sender cuts every transfer into messages (a lane's segment; a read
 *    request asks for 256 KiB; a rendezvous piece is up to 4 MiB) and chooses again at each
 *    message. While several levels have transfers queued, each gets a share of the bytes in
 *    proportion to its weight, KVX_PRIO_LOW 1, NORMAL 4, HIGH 16 (deficit round robin, a round
 *    being 64 KiB, 256 KiB and 1 MiB; a level that empties starts again from nothing): no level
 *    starves, and a transfer that arrives waits for at most one round's share of the levels
 *    below it, each plus one message, before its first message goes.
 *  - KVX_PRIO_LOW transfers keep at most 1 MiB per connection posted and not yet acknowledged
 *    (or arrived), plus one message; so do KVX_PRIO_NORMAL ones for 100 ms after a HIGH transfer
 *    was queued on the connection (never, for a user who does not use HIGH). While nothing
 *    higher is queued, LOW transfers also leave 4 of the 16 messages or read requests a
 *    connection hands to UCX free: a higher transfer that comes finds room, and little of the
 *    bulk ahead of it in the lane.
 *  - No progress step posts more than 1 MiB per connection plus one message (API calls and the
 *    progress thread take turns on the transport's lock between steps), and a submit posts at
 *    most 256 KiB itself.
 *  - A read request carries its priority, and the target answers waiting requests highest
 *    first, passing a request over at most 8 times.
 * Bytes already handed to UCX go first: UCX and the lane keep them in order (on shared memory a
 * FIFO of the lane's segments, on tcp the socket's buffers). Deadlines, the stall limit, cancel,
 * fences and a failing peer apply to every level alike. A LOW or HIGH read sent to a receiver
 * older than priorities is dropped there as malformed (the read fails by its deadline or the
 * stall limit): use NORMAL reads until every peer has priorities. */
enum kvx_priority {
    KVX_PRIO_LOW = 0,    /**< background traffic: offloads nobody waits for */
    KVX_PRIO_NORMAL = 1, /**< the default */
    KVX_PRIO_HIGH = 2    /**< a request waits for it: fetches on the critical path */
};
#define KVX_PRIO_LEVELS 3

/** kvx_xfer_params_t.flags */
enum kvx_xfer_flags {
    /** A write: once all of its blocks landed, the receiver gets an arrival notice
     *  (kvx_notice_poll), and only then does the write complete here. Not for reads. */
    KVX_XFER_NOTIFY = 1u << 0
};

/** Optional per-transfer parameters. */
typedef struct kvx_xfer_params {
    uint64_t field_mask;
    uint64_t deadline_ms;
    uint64_t tag;
    uint32_t flags;
    uint32_t priority; /**< enum kvx_priority */
    /** KVX_XFER_PARAM_NOTICE_DATA: notice_len bytes (0..KVX_NOTICE_DATA_MAX; NULL only with 0),
     *  copied during the call */
    const void *notice_data;
    size_t notice_len;
} kvx_xfer_params_t;

/**
 * Submit a write: local block local_idxs[i] goes into the peer's block remote_idxs[i], for i in
 * [0, count). Runs of indices consecutive on both sides travel as one UCX operation. count may be
 * 0 (the transfer completes at once with 0 bytes). params may be NULL.
 *
 * Returns 0 and sets *id_p to an id unique for the transport's life (ids are never 0), or a
 * negative errno with nothing submitted: -ENOENT (unknown peer), -EINVAL (bad arguments, an
 * index out of range, a deadline above KVX_MS_MAX, a priority of KVX_PRIO_LEVELS or more),
 * -ENOTCONN (the peer's connection has failed: remove or re-add it), -ENOMEM, -ENOSPC (too many
 * transfers in flight), -ESHUTDOWN. Never blocks on the network.
 *
 * The index arrays need not remain valid after the call returns. The local blocks must not be
 * changed (write) or used (read) until the id comes out of kvx_transport_poll. Once an id comes
 * out of poll, done or failed, nothing writes its local blocks again (replies to a failed read
 * are dropped) and nothing reads them: a write that fails while UCX still holds messages of it
 * (they read its blocks when they go) is reported once they left. One exception: over tcp, a
 * connection that fails while UCX holds messages keeps its endpoint open until UCX sent them
 * (a UCX defect: docs/design.md) and reports its transfers at once, so UCX may still
 * read a failed write's blocks after the report. After a failure
 * the contents of the destination blocks are undefined; for a failed write that includes later
 * changes, as bytes that had already left (to the kernel, to the peer's shared-memory FIFO) may
 * still land when the peer resumes or its link returns, unless the peer fences this writer
 * (kvx_fence) first.
 *
 * The receiver refuses what its region does not hold: a write or read of blocks beyond it (the
 * metadata lied) fails with -EINVAL. With KVX_XFER_NOTIFY the receiver gets an arrival notice
 * once every block landed, and the transfer completes after that (-ENOSPC if its notice queue
 * was full). A write the receiver fenced fails with -KVX_EFENCED; one with integrity on whose
 * checksum did not match, with -EBADMSG.
 *
 * Deadline: a transfer not finished at its deadline fails alone with -ETIMEDOUT, in whatever
 * state it is (queued, posted, a notified write waiting for the receiver's answer, parked for a
 * peer pairing again); its connection stays. It is reported at its deadline, or, for a write UCX
 * still holds messages of (a stopped peer, a full link), once they left; if they have not within
 * 200 ms (the transport's stall_ms when that is shorter), the connection fails, whose forced
 * close makes UCX let go: reported by deadline + 200 ms. (Should that close not give them back,
 * the write is reported 200 ms later all the same, logged, and UCX may still read its blocks.)
 * When the connection hears nothing from a peer that owes it answers for stall_ms, the
 * connection fails: every transfer in flight to the peer fails with -ETIMEDOUT and the peer goes
 * to KVX_PEER_FAILED until it is re-added; one waiting for a connection fails stall_ms after its
 * submission (see kvx_params_t.stall_ms). A write with KVX_XFER_NOTIFY that fails with its
 * connection, by its deadline or is canceled after its notice was sent may have left the
 * receiver a notice.
 */
KVX_API int kvx_xfer_write(kvx_transport_t *transport, const char *peer_id,
                           const uint32_t *local_idxs, const uint32_t *remote_idxs, size_t count,
                           const kvx_xfer_params_t *params, uint64_t *id_p);

/** Submit a read: the peer's block remote_idxs[i] lands in local block local_idxs[i]. As
 *  kvx_xfer_write otherwise. */
KVX_API int kvx_xfer_read(kvx_transport_t *transport, const char *peer_id,
                          const uint32_t *local_idxs, const uint32_t *remote_idxs, size_t count,
                          const kvx_xfer_params_t *params, uint64_t *id_p);

/** One finished transfer. */
typedef struct kvx_completion {
    uint64_t id;
    int32_t status;       /**< 0, or -ECONNRESET, -ETIMEDOUT, -ECONNABORTED, -ECANCELED, -ENOENT,
                           *   -EACCES, ... (docs/errors.md) */
    uint32_t flags;       /**< KVX_COMPLETION_READ for a read */
    uint64_t bytes;       /**< bytes the transfer covers */
    uint64_t duration_ns; /**< from submission to completion */
} kvx_completion_t;

#define KVX_COMPLETION_READ 1u

/**
 * Drive progress and copy out up to max completions, oldest first. peer_id == NULL takes them
 * from every peer; otherwise only that peer's completions are taken and other peers' stay
 * queued. Each id comes out exactly once. Returns the number written (0 when nothing finished
 * or the peer is unknown), -EINVAL or -ESHUTDOWN. Copying the completions out allocates nothing
 * (the progress it drives may).
 */
KVX_API int kvx_transport_poll(kvx_transport_t *transport, const char *peer_id,
                               kvx_completion_t *completions, size_t max);

/**
 * Sleep until kvx_transport_poll(transport, peer_id, ...) has a completion to return, driving
 * progress meanwhile, or until timeout_ms passes (-1: no limit). For applications that would
 * otherwise spin on poll: idle, the calling thread sleeps on UCX's event fd. Consumes nothing.
 * Returns 1 when a completion is waiting, 0 on timeout, or -EINVAL / -ESHUTDOWN.
 */
KVX_API int kvx_transport_wait(kvx_transport_t *transport, const char *peer_id, int timeout_ms);

/** Cancel modes. */
typedef enum kvx_cancel_mode {
    /** Stop tracking now: the ids never come out of poll. UCX may still be moving their bytes. */
    KVX_CANCEL_IMMEDIATE = 0,
    /** Stop what has not started; report the ids whose bytes UCX may still be moving: every one
     *  with some of its bytes handed to UCX and not yet known to have landed (some of them may
     *  in fact be done). Each reported id comes out of poll later, as failed with -ECANCELED,
     *  and only then may the caller reuse its blocks. Ids not reported are finished (or never
     *  started) and forgotten at once. */
    KVX_CANCEL_WAIT = 1
} kvx_cancel_mode_t;

/**
 * Cancel transfers, best effort. Unknown and already-reported ids are ignored; finished ids not
 * yet polled are forgotten. In KVX_CANCEL_WAIT mode, the ids that may still touch memory are
 * written to pending (which must hold count ids; NULL is accepted when the caller does not want
 * them). Returns how many ids were written to pending (always 0 in immediate mode), or -EINVAL
 * or -ESHUTDOWN. ids need only stay valid during the call.
 */
KVX_API int kvx_xfer_cancel(kvx_transport_t *transport, const uint64_t *ids, size_t count, int mode,
                            uint64_t *pending);

/* ---------------------------------------------------------------------------------------------
 * Regions and ranges (docs/regions.md)
 *
 * A region is memory peers may address: the main region (KVX_PARAM_REGION, id KVX_REGION_MAIN)
 * and any number registered later (kvx_region_register), each with its own id (never reused in
 * the transport's life), its own capability (16 random bytes, checked in constant time against
 * every message naming it) and what peers may do with it. A peer needs the region's blob
 * (kvx_region_blob, handed over out of band like the metadata) to address it: it loads it
 * (kvx_region_load) and gets a handle, which it names in ranges (kvx_xfer_write_ranges). The
 * main region's capability is the transport's own, which its metadata carries: a peer added
 * with kvx_peer_add has the main region under the handle KVX_REGION_MAIN, and the block calls
 * (kvx_xfer_write, kvx_xfer_read) are ranges over the two main regions.
 *
 * kvx passes no memory handle to UCX: a region's registration is a table entry and 16 random
 * bytes (UCX registers per send what its rendezvous needs, docs/security.md), so register and
 * deregister cost microseconds (docs/regions.md has the figures), and nothing of a region is
 * pinned by kvx.
 * ------------------------------------------------------------------------------------------- */

/** The main region (KVX_PARAM_REGION) has this id, and a peer added with kvx_peer_add has its
 *  main region loaded under this handle. 0 is never an id or a handle. */
#define KVX_REGION_MAIN 1u

/** What peers may do with a region. */
enum kvx_region_access {
    KVX_REGION_WRITE = 1u << 0, /**< peers' writes land in it */
    KVX_REGION_READ = 1u << 1   /**< peers' reads are served from it */
};

/** Bits of kvx_region_params_t.field_mask. */
enum kvx_region_params_field {
    KVX_REGION_PARAM_ACCESS = 1u << 0 /**< default: KVX_REGION_WRITE | KVX_REGION_READ */
};

/** Registration parameters: start from zero, set what you need, name it in field_mask. */
typedef struct kvx_region_params {
    uint64_t field_mask;
    unsigned access; /**< KVX_REGION_WRITE | KVX_REGION_READ (the default), not 0 */
} kvx_region_params_t;

/** The longest region blob (kvx_region_blob), in bytes. */
#define KVX_REGION_BLOB_MAX 256
/** Regions one transport holds at once (the main region included). */
#define KVX_REGIONS_MAX (1u << 20)

/**
 * Register len bytes at base as a region peers may address: many at once (up to
 * KVX_REGIONS_MAX), at any time, overlapping allowed, concurrent with transfers. Returns 0 and
 * *region_p (>= 2, never reused in the transport's life), or -EINVAL (transport, base or
 * region_p NULL, len 0, a range that wraps the address space, unknown access bits or access 0,
 * unknown field_mask bits), -ENOSPC (KVX_REGIONS_MAX regions), -ENOMEM, -ESHUTDOWN; nothing
 * changed on failure. base must stay valid until kvx_region_deregister (or
 * kvx_transport_close) returns; kvx never frees it. params need only be valid during the call.
 */
KVX_API int kvx_region_register(kvx_transport_t *transport, void *base, uint64_t len,
                                const kvx_region_params_t *params, uint32_t *region_p);

/**
 * Deregister a region: a fence. When it returns 0, no byte of any peer lands in the region and
 * none is read out of it any more, whatever was in flight (eager messages queued in UCX or in a
 * shared-memory FIFO, rendezvous receives into it, READ_DATA sends UCX still holds that read
 * it, read requests queued, a writer stopped that resumes later), and this transport's own
 * transfers that named it as their local region have completed or failed (their completions
 * come out of poll as usual): the memory may be freed or reused at once.
 *
 * What it does, in order:
 *  1. the region is marked dead (under the lock): every message naming it from now on is
 *     refused (the writer's or reader's transfer fails -ENOENT; counted in drop_region), and
 *     the read requests queued from it are refused the same way;
 *  2. this transport's transfers naming it as local region end with -ECANCELED: at once, or,
 *     while UCX still holds their messages (their sends read it, their rendezvous receives
 *     write it), once UCX lets go (the stall limit's grace, as for a deadline: kvx_xfer_write);
 *  3. it waits, with the lock released (other threads' calls and the progress thread go on),
 *     until nothing holds the region any more: no rendezvous receive into it, no READ_DATA send
 *     reading it, no transfer of step 2 not yet done; at most 1 s, or the transport's stall_ms
 *     when that is shorter (and not 0);
 *  4. if something still holds it then, the connections holding it close (counted in
 *     dereg_closed): a writer's or reader's connection to this transport with a rendezvous
 *     receive into it (or, for READ_DATA sends, every connection with read data in UCX's hands:
 *     which region each send reads is not kept per connection), and this transport's own
 *     connections with a transfer of step 2. Their other transfers fail as a closed connection's
 *     do: -ECONNABORTED here, -ECONNRESET or -ETIMEDOUT on the peer's side. Closing makes UCX
 *     let go; it waits up to 200 ms more for that.
 * So it returns within min(1 s, stall_ms) + 200 ms (at once when nothing is in flight: about
 * a microsecond, docs/regions.md). If UCX still holds the region then, it returns -ETIMEDOUT,
 * logged: the region stays dead but registered, the memory must not be freed yet, and a later
 * call for the same id waits again (and succeeds once UCX let go). Over tcp a peer that stops
 * taking what it is sent does that: UCX cannot take back a send it holds, and a tcp endpoint
 * with sends still queued is not force-closed (a UCX defect, docs/design.md) but lingers, so
 * UCX may go on reading them. Two cases: our writes out of the region to such a peer, and
 * READ_DATA of the region to a reader that does not take it (a stopped or hostile one). On
 * shared memory the close ends both. Calls for the same id from two threads both wait.
 * Transfers this transport forgot are not waited for (kvx_xfer_cancel KVX_CANCEL_IMMEDIATE, a
 * purge): their bytes may still be moving, as kvx_cancel_mode_t says; cancel with
 * KVX_CANCEL_WAIT and poll what it reports before deregistering their region.
 *
 * Returns 0, -EINVAL (transport NULL, region 0), -ENOENT (unknown or already deregistered),
 * -EBUSY (the main region of a KVX_PARAM_OWN_REGION transport: peers on this host copy into it
 * directly), -ETIMEDOUT (above), -ESHUTDOWN. The main region of another transport may be
 * deregistered: its block calls then fail -ENOENT here, and peers' block transfers to it fail
 * -ENOENT.
 */
KVX_API int kvx_region_deregister(kvx_transport_t *transport, uint32_t region);

/**
 * A region's blob for peers (NIXL's "public data"): into buf, *len_p in/out (-ENOSPC: too
 * small, *len_p the size needed, at most KVX_REGION_BLOB_MAX). The blob holds this transport's
 * agent name and generation, the region's id, address, length, access and capability, signed
 * with the transport's secret if it has one: whoever holds it (and the metadata) can write and
 * read that region as its access allows (docs/security.md). Stable for the region's life.
 * Returns 0, -EINVAL, -ENOENT (unknown or deregistered region), -ENOSPC, -ESHUTDOWN.
 */
KVX_API int kvx_region_blob(kvx_transport_t *transport, uint32_t region, void *buf, size_t *len_p);

/**
 * Load a peer's region blob for peer_id (added already): returns 0 and *handle_p (>= 2), which
 * names that region in ranges to that peer until unloaded or the peer is removed. The same blob
 * loaded twice gives the same handle. Nothing goes over the network: whether the region is
 * still registered is the peer's to say when a transfer names it (-ENOENT). Returns -EINVAL
 * (NULL arguments), -ENOENT (unknown peer), -EBADMSG (not a region blob),
 * -EPROTONOSUPPORT (a blob format this kvx does not know), -EINVAL (the blob is of another agent
 * than the peer, or names the main region: that is KVX_REGION_MAIN already), -ESTALE (of
 * another process than the peer's now: it restarted, load its new blob), -EACCES (the
 * signature does not match this transport's secret, or one side has a secret and the other
 * none), -ENOSPC (KVX_REGIONS_MAX handles for the peer), -ENOMEM, -ESHUTDOWN. blob need only be
 * valid during the call.
 */
KVX_API int kvx_region_load(kvx_transport_t *transport, const char *peer_id, const void *blob,
                            size_t len, uint32_t *handle_p);

/** Forget a loaded handle: 0; -ENOENT (unknown peer or handle; KVX_REGION_MAIN cannot be
 *  unloaded), -EINVAL, -ESHUTDOWN. Transfers in flight naming it go on. */
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
 * Write a list of ranges to a peer, as one transfer: the same ids, completions, deadlines,
 * stall limit, priorities, notices (KVX_XFER_NOTIFY), integrity, cancel and fences as
 * kvx_xfer_write, whose block calls are ranges over the main regions. Any offsets and lengths;
 * ranges consecutive on both sides (same regions) are coalesced; each message carries runs of
 * one remote region. Returns 0 and *id_p, or -EINVAL (NULL arguments, count 0 or over 2^32 - 1,
 * a range of length 0 or out of its local or remote region, offset + len overflowing, the
 * params as kvx_xfer_write), -ENOENT (unknown peer, local region or remote handle), -EACCES
 * (the remote region does not grant KVX_REGION_WRITE, for a read KVX_REGION_READ), -ESTALE (the
 * handle is of the peer's earlier process), -EOPNOTSUPP (a remote region other than the main
 * one of a peer whose owned region is mapped here), -ENOTCONN, -ENOSPC, -ENOMEM, -ESHUTDOWN;
 * nothing submitted on failure. ranges need only stay valid during the call; the regions'
 * memory until the transfer's completion (deregistering a local region ends the transfer).
 * A run the receiver refuses fails the transfer with -ENOENT (the region is gone), -EACCES
 * (capability or access) or -EINVAL (bounds); docs/errors.md.
 */
KVX_API int kvx_xfer_write_ranges(kvx_transport_t *transport, const char *peer_id,
                                  const kvx_range_t *ranges, size_t count,
                                  const kvx_xfer_params_t *params, uint64_t *id_p);
/** Read a list of ranges from a peer: remote_offset of the peer's region lands at local_offset
 *  of the local region. As kvx_xfer_write_ranges otherwise (KVX_XFER_NOTIFY: -EINVAL). */
KVX_API int kvx_xfer_read_ranges(kvx_transport_t *transport, const char *peer_id,
                                 const kvx_range_t *ranges, size_t count,
                                 const kvx_xfer_params_t *params, uint64_t *id_p);

/* ---------------------------------------------------------------------------------------------
 * The receiving side: fences and arrival notices
 * ------------------------------------------------------------------------------------------- */

/** Most tags one kvx_fence may name. */
#define KVX_FENCE_TAGS_MAX 16
/** Distinct tags whose latest fence this transport remembers per writer, at most, and over all
 *  writers: a tag fence that would need more fails with -ENOSPC (kvx_fence). 16 bytes each. */
#define KVX_FENCE_WRITER_TAGS_MAX 16384
#define KVX_FENCE_TOTAL_TAGS_MAX 262144

/**
 * Fence writes into this transport's region, the weaker form: when this returns, no byte lands
 * in the region any more of any write that the transport named writer (its agent name; NULL:
 * every writer) submitted before the call, on any of its connections this transport has heard
 * from: those whose handshake (HELLO) reached this transport before the call. With tags
 * (ntags > 0), only writes carrying one of those tags are fenced, exactly those, however many
 * fences came before: the receiver keeps, per writer, the latest fence of every distinct tag
 * fenced (at most KVX_FENCE_WRITER_TAGS_MAX per writer, KVX_FENCE_TOTAL_TAGS_MAX in all; a
 * fence of every tag, ntags 0, frees the writer's tag records, and a writer with no connection
 * keeps none). A tag fence that would exceed them fails with -ENOSPC and fences nothing: a
 * fence never widens to other tags. Bytes that landed before the call stay.
 * The writer's fenced transfers fail with -KVX_EFENCED; kvx tells its connections at once, so
 * that its later writes carry the new epoch and land (one submitted before the writer heard of
 * the fence fails with -KVX_EFENCED too: it may simply be submitted again). The writer need not
 * re-add the peer.
 * Not fenced: a connection whose handshake had not reached this transport when the call was
 * made (UCX still carrying it, this process stopped or busy, the writer's kvx_peer_add just
 * made it: the writer sees KVX_PEER_WIRING). Such a connection is new to this transport: writes
 * submitted on it before the call land in full after it, and succeed. kvx_fence_ex with
 * KVX_FENCE_RETIRE covers them too.
 * Returns the number of the writer's connections fenced (0: none known, nothing to fence),
 * -EINVAL (ntags > KVX_FENCE_TAGS_MAX, tags NULL with ntags, a bad name), -ENOSPC, -ENOMEM or
 * -ESHUTDOWN; on error nothing is fenced. Never waits on the network, with one exception: on a
 * transport that takes rendezvous payloads (any KVX_PARAM_RNDV mode but eager), writes it covers
 * whose payload is still being received when it is called are waited for, up to 1 s (the stall
 * limit when shorter; they land: they arrived before the fence), and then their connections close,
 * which ends them: every transfer of the writer on those connections then fails (-ECONNRESET),
 * other tags' included, and the call returns at most 100 ms later. tags need only stay valid during
 * the call.
 */
KVX_API int kvx_fence(kvx_transport_t *transport, const char *writer, const uint64_t *tags,
                      size_t ntags);

/** Flags of kvx_fence_ex. */
enum kvx_fence_flags {
    /** Retire this transport's capability as well (kvx_fence_ex). */
    KVX_FENCE_RETIRE = 1u << 0
};

/**
 * kvx_fence with flags (0, or KVX_FENCE_RETIRE; other bits are -EINVAL). flags 0 is kvx_fence.
 *
 * KVX_FENCE_RETIRE, the stronger form: besides the fence, the transport's capability is retired.
 * A fresh one replaces it, and kvx_transport_metadata returns new metadata from then on (the
 * same length, signed as before when there is a secret; the listener hands out the new one).
 * A handshake presenting the old capability that reaches this transport after the call (and,
 * with a secret, proves it) is refused with an answer: the writer's connection fails at once
 * with -EKEYREVOKED, so does every transfer submitted to it (whatever its tag), and its peer
 * goes to KVX_PEER_FAILED: the writer must add the peer again with the new metadata (a peer
 * paired by address does so itself: kvx pairs with the address again). So every write that the
 * writer (NULL: any writer) submitted before the call is kept out, whatever connection it
 * travels on: one this transport had heard from is fenced, one it had not is refused.
 * What the retirement leaves alone: connections already made, the writer's and every other
 * writer's (the capability is checked at the handshake only), and peers that map an owned
 * region (neither form applies to their copies). But it is transport-wide: every writer's next
 * connection with the old metadata is refused (a re-add, a peer paired by a blob that fails and
 * is added again), so hand the new metadata to every writer. The last 8 retired capabilities are
 * answered, older ones dropped as unknown (the writer's connection then fails by its stall
 * limit, or its transfers by their deadlines), as are refusals beyond 16 at once.
 * Returns as kvx_fence; on error nothing is fenced and the capability stays (the HELLOs that
 * had arrived have become connections all the same: a fence takes them first, whatever follows).
 */
KVX_API int kvx_fence_ex(kvx_transport_t *transport, const char *writer, const uint64_t *tags,
                         size_t ntags, unsigned flags);

/** An arrival notice: a peer's write (sent with KVX_XFER_NOTIFY) landed whole in the region. */
typedef struct kvx_notice {
    char writer[KVX_NAME_MAX + 1]; /**< the writer's agent name */
    uint64_t tag;                  /**< the write's tag */
    uint64_t blocks;               /**< blocks it wrote */
    uint64_t bytes;                /**< bytes it wrote */
    int32_t status;                /**< 0 */
    uint32_t reserved;
} kvx_notice_t;

/**
 * Take up to max arrival notices, oldest first, into out (which need only hold max); each comes
 * out once. A notice is queued only after every block of its write landed, never for a write
 * that was fenced or refused. (The writer may still see a write fail whose notice was queued:
 * when its connection fails before the receiver's answer reaches it.) The blocks and bytes are
 * the writer's count, checked by no one. Drives progress like kvx_transport_poll. Returns the
 * number taken, -EINVAL or -ESHUTDOWN. Copying the notices out allocates nothing (the progress
 * it drives may).
 */
KVX_API int kvx_notice_poll(kvx_transport_t *transport, kvx_notice_t *out, size_t max);

/* ---------------------------------------------------------------------------------------------
 * Notices with a payload (what NIXL calls notifications)
 *
 * A notice may carry a payload: bytes the sender chose, 0 to KVX_NOTICE_DATA_MAX of them (an
 * empty payload is a notice all the same, as a NIXL notification may be empty). Three ways send
 * one, each on the connection to the peer, and the peer takes them with kvx_notice_poll_data:
 *
 *  - A write (kvx_xfer_write, kvx_xfer_write_ranges) with KVX_XFER_PARAM_NOTICE_DATA: as
 *    KVX_XFER_NOTIFY (which it implies; both may be set), its notice goes once the receiver has
 *    acknowledged every byte of the write, so the receiver finds the bytes in its region before
 *    the notice in its queue; the write completes once the receiver answered the notice:
 *    -ENOSPC when its queue was full or the payload would exceed KVX_NOTICE_QUEUE_BYTES, and
 *    -KVX_EFENCED when the receiver fenced the write.
 *  - A read (kvx_xfer_read, kvx_xfer_read_ranges) with KVX_XFER_PARAM_NOTICE_DATA: once every
 *    byte of the read arrived here, the notice goes to the peer read from (it is the receiver
 *    of this connection, as for a write), and the read completes once that peer answered it:
 *    0, or -ENOSPC (its queue was full: the read's bytes are here all the same, but the peer
 *    was not told) or -KVX_EFENCED. A read failing before its bytes arrived sends no notice.
 *    (KVX_XFER_NOTIFY stays for writes only: a read takes the payload form, possibly empty.)
 *  - kvx_notice_send: a notice on its own, xfer_id 0.
 *
 * The payload is copied at the call (the caller's buffer may go at once). Tag and epoch are the
 * transfer's: a fence of the writer (and tag) refuses the notice as it refuses the write's bytes.
 * The receiver checks every length a peer sends: a NOTICE whose lengths disagree, or whose payload
 * is over KVX_NOTICE_DATA_MAX, is dropped as malformed (stats drop_malformed; its sender's
 * transfer then fails by its deadline or the stall limit), and one that would take the payloads
 * queued here over KVX_NOTICE_QUEUE_BYTES, or the queue over notice_queue notices, is refused
 * with -ENOSPC (drop_other). A receiver older than payloads drops such a NOTICE as malformed.
 * ------------------------------------------------------------------------------------------- */

/** The largest notice payload, in bytes (1 MiB). */
#define KVX_NOTICE_DATA_MAX (1u << 20)
/** The most payload bytes that wait in a transport's notice queue at once (64 MiB). */
#define KVX_NOTICE_QUEUE_BYTES (64u << 20)

/**
 * Send a notice with len bytes of payload at data (copied; data may be NULL when len is 0) to
 * peer_id, on its own: the receiver sees xfer_id 0 and tag 0. Returns 0 once queued here, or
 * -ENOENT (unknown peer), -EINVAL (len over KVX_NOTICE_DATA_MAX, data NULL with len > 0, a NULL
 * transport or peer_id), -ENOTCONN (the peer's connection failed: remove or re-add it), -ENOMEM,
 * -ENOSPC (too many transfers in flight: it travels as one), -ESHUTDOWN. Never blocks.
 *
 * Order: notices sent to one peer arrive in the order of the calls, and after the notice of any
 * transfer to that peer that completed before the call. It is NOT ordered with the bytes of
 * transfers still in flight: it may overtake them. Wait for their completion first when the
 * receiver must see their bytes before it (NIXL's rule for genNotif: a notification sent after
 * a transfer completed). A peer pairing again holds it until it is back, as a transfer.
 * Delivery: the receiver answers it, and kvx counts that answer (the peer's transfer
 * statistics, as a write of 0 bytes) but reports nothing to the caller: no id, no completion.
 * A notice the receiver refused (its queue full: -ENOSPC), or lost with its connection or by
 * the transport's deadline, is lost silently; the receiver counts what it refused (drop_other).
 */
KVX_API int kvx_notice_send(kvx_transport_t *transport, const char *peer_id, const void *data,
                            size_t len);

/** A notice as kvx_notice_poll_data returns it. */
typedef struct kvx_notice_data {
    char writer[KVX_NAME_MAX + 1]; /**< the sender's agent name */
    uint64_t xfer_id;              /**< the sender's transfer id; 0 for kvx_notice_send's */
    uint64_t tag;                  /**< the transfer's tag (0 for kvx_notice_send's) */
    size_t data_len;               /**< payload bytes (0: empty, or no payload: data NULL) */
    void *data; /**< into the buf given to kvx_notice_poll_data; NULL for a notice without a
                 *   payload (KVX_XFER_NOTIFY alone) */
} kvx_notice_data_t;

/**
 * Take up to max notices, with or without a payload, oldest first (the order they arrived: per
 * sender, the order they were sent), each payload copied into buf one after another (cap bytes
 * in all; out[i].data points at its copy). Returns how many were taken (0: none waiting), or
 * -ENOSPC when the oldest notice's payload alone is over cap: nothing is taken, and
 * out[0].data_len (and the rest of out[0]) tells that notice, so a buffer of data_len bytes (at
 * most KVX_NOTICE_DATA_MAX) takes it. Later notices whose payload does not fit in what remains
 * of buf wait for the next call. -EINVAL (NULL transport or out, max 0, buf NULL with cap > 0),
 * -ESHUTDOWN. Drives progress like kvx_transport_poll.
 *
 * kvx_notice_poll takes the same queue: a notice with a payload comes out of it too (writer and
 * tag; blocks and bytes those of its transfer, 0 for kvx_notice_send's), its payload dropped.
 * Use one of the two calls per transport.
 */
KVX_API int kvx_notice_poll_data(kvx_transport_t *transport, kvx_notice_data_t *out, size_t max,
                                 void *buf, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Statistics and an event descriptor for event loops
 * ------------------------------------------------------------------------------------------- */

/** Classes of a transfer's final status, the second index of kvx_stats_t.xfers. */
typedef enum kvx_status_class {
    KVX_STATUS_OK = 0,      /**< 0 */
    KVX_STATUS_TIMEDOUT,    /**< -ETIMEDOUT: deadline or stall limit */
    KVX_STATUS_CONNRESET,   /**< -ECONNRESET: the peer died or its link broke */
    KVX_STATUS_CONNABORTED, /**< -ECONNABORTED: removed, replaced, closed */
    KVX_STATUS_CANCELED,    /**< -ECANCELED */
    KVX_STATUS_FENCED,      /**< -KVX_EFENCED */
    KVX_STATUS_BADMSG,      /**< -EBADMSG: a checksum mismatch */
    KVX_STATUS_NOSPC,       /**< -ENOSPC: the receiver's notice queue was full */
    KVX_STATUS_INVAL,       /**< -EINVAL: the receiver refused blocks outside its region */
    KVX_STATUS_BUSY,        /**< -EBUSY: too many reads waiting at the receiver */
    KVX_STATUS_PROTO,       /**< -EPROTO: a peer broke the protocol */
    KVX_STATUS_OTHER,       /**< anything else */
    KVX_STATUS_CLASSES
} kvx_status_class_t;

/** Buckets of kvx_stats_t.latency: bucket i < KVX_LATENCY_BUCKETS - 1 counts transfers whose
 *  submit-to-completion time was at most 2^i microseconds (and more than 2^(i-1)); the last
 *  one counts the longer ones (over 2^23 us, about 8.4 s). */
#define KVX_LATENCY_BUCKETS 25

/** Bits of kvx_stats_t.field_mask. */
enum kvx_stats_field {
    KVX_STATS_XFERS = 1u << 0,   /**< xfers, bytes */
    KVX_STATS_LATENCY = 1u << 1, /**< latency, latency_sum_ns */
    KVX_STATS_EVENTS = 1u << 2   /**< reconnections, fences */
};

/**
 * Cumulative statistics of one peer (over its life: they survive re-adding the same peer id, and
 * go with kvx_peer_remove) or of the whole transport (every peer it ever had). Only the fields
 * named in field_mask are written. Counts only ever grow, so they export as counters.
 */
typedef struct kvx_stats {
    uint64_t field_mask;
    /** transfers that ended, by op (0 write, 1 read) and final status: reported by poll,
     *  purged, or forgotten by kvx_xfer_cancel before they ended (counted as canceled) */
    uint64_t xfers[2][KVX_STATUS_CLASSES];
    uint64_t bytes[2]; /**< bytes of successful transfers, by op */
    uint64_t latency[KVX_LATENCY_BUCKETS];
    uint64_t latency_sum_ns;
    /** a peer paired by address paired again after its connection failed (RECONNECTED or
     *  RESTARTED events) */
    uint64_t reconnections;
    /** the transport only: kvx_fence calls that fenced at least one connection (0 for a peer) */
    uint64_t fences;
} kvx_stats_t;

/**
 * Fill the statistics named in stats->field_mask: the peer's (peer_id), or with peer_id NULL the
 * transport's totals. Returns 0, -ENOENT (unknown peer), -EINVAL or -ESHUTDOWN. Allocates
 * nothing; stats need only stay valid during the call. What the receiving side did and dropped
 * is in kvx_transport_attr_t.recv and kvx_peer_attr_t.recv.
 */
KVX_API int kvx_stats_query(kvx_transport_t *transport, const char *peer_id, kvx_stats_t *stats);

/**
 * The ids of the transport's peers (removed ones excepted), each ending in a NUL byte, one after
 * the other, into buf (*len_p bytes; NULL when *len_p is 0). Returns how many, with *len_p set
 * to the bytes written; or -ENOSPC with *len_p set to the bytes needed (call again with that
 * much; peers added meanwhile may need more), -EINVAL or -ESHUTDOWN. For exporters that walk
 * every peer's statistics.
 */
KVX_API int kvx_peer_list(kvx_transport_t *transport, char *buf, size_t *len_p);

/** What an event descriptor watches (kvx_transport_event_fd_ex): a mask of these bits. */
enum kvx_event_kind {
    KVX_EVENT_COMPLETIONS = 1u << 0, /**< kvx_transport_poll(transport, NULL, ...) */
    KVX_EVENT_NOTICES = 1u << 1,     /**< kvx_notice_poll */
    KVX_EVENT_PEER_EVENTS = 1u << 2, /**< kvx_peer_event_poll */
    KVX_EVENT_ALL = (1u << 3) - 1    /**< all three: kvx_transport_event_fd's */
};

/**
 * A descriptor for an event loop (epoll, poll, select, asyncio's add_reader): it is readable
 * while a poll of one of the kinds in kinds (kvx_event_kind bits) has something to return, and
 * stops being readable once those kinds have been drained; what waits of another kind leaves it
 * as it is, so a loop that takes only its own kinds sleeps while other kinds wait. It is
 * level-triggered in that sense: a loop that wakes and drains only part of what is waiting is
 * woken again. There is one per mask of kinds: asking for the same kinds again gives the same
 * descriptor (the first call creates it). kvx owns it: the caller must not read, write or close
 * it; it stays valid until kvx_transport_destroy. Closing the transport makes every one readable
 * for good, so that a loop asleep on it wakes and sees -ESHUTDOWN. Completions arrive through
 * the progress thread (num_threads > 0); with num_threads = 0 only the application's own calls
 * make progress, so nothing becomes readable by itself. Waiting on it costs nothing while idle.
 * Returns 0 and sets *fd_p; -EINVAL (kinds 0 or with an unknown bit, a NULL argument: nothing
 * created), -ESHUTDOWN, or the negative errno of eventfd(2).
 */
KVX_API int kvx_transport_event_fd_ex(kvx_transport_t *transport, unsigned kinds, int *fd_p);

/**
 * kvx_transport_event_fd_ex(transport, KVX_EVENT_ALL, fd_p): a descriptor readable while
 * kvx_transport_poll(transport, NULL, ...), kvx_notice_poll or kvx_peer_event_poll has something
 * to return, and not once all three have been drained. A loop that drains only some kinds must
 * wait on the descriptor of those kinds instead: this one stays readable while the others wait.
 * Returns as kvx_transport_event_fd_ex does.
 */
KVX_API int kvx_transport_event_fd(kvx_transport_t *transport, int *fd_p);

#ifdef __cplusplus
}
#endif

#endif /* KVX_H */
