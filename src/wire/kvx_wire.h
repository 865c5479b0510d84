/*
 * The codecs (src/README.md): what crosses the wire (wire.c), the metadata blob (metadata.c),
 * a region's blob (region.c), and what an owned region's segment must be and hold (segment.c).
 * Pure functions of their input: no transport state, no UCX (the fuzz targets drive them alone).
 */
#ifndef KVX_WIRE_H
#define KVX_WIRE_H

#include "base/kvx_base.h"

/* ---- owned-region segments (segment.c: no UCX, fuzzed) -------------------------------------- */

#define KVX_SEG_TRAILER_LEN 64 /* at the end of an owned region's segment: magic, length, token */
/* What the kernel says of the mapping holding an address (/proc/self/maps, IPC_STAT). */
typedef struct kvx_seg_info {
    uint64_t lo, hi, off; /* the mapping, and its offset in what it maps */
    bool rw_shared;
    bool sysv; /* a System V segment: the fields below are set */
    int shmid;
    int64_t cpid; /* the process that created it */
    uint64_t segsz;
} kvx_seg_info_t;
int kvx_seg_lookup(uintptr_t p, kvx_seg_info_t *s); /* 0, or -ENOENT: nothing mapped at p */
/* Whether a peer's region of len bytes at p (in segment s) may be mapped: the peer's process
 * (owner) created s, starting at p and holding the region and the trailer; if s is this
 * process's (self), only as an owned region of one of its transports (own_region). 0, or
 * -EOPNOTSUPP (not a System V segment) or -EPERM, with *why. */
int kvx_seg_check(const kvx_seg_info_t *s, uint64_t p, uint64_t len, uint32_t owner, uint32_t self,
                  bool own_region, const char **why);
/* The owned regions' segments of this process (kvx_ucx_region_alloc lists them). */
int kvx_seg_own_add(int shmid); /* 0 or -ENOMEM */
void kvx_seg_own_del(int shmid);
bool kvx_seg_own_has(int shmid);
void kvx_seg_trailer_put(uint8_t *tr, uint64_t region_len, const uint8_t *token);
/* 0 and the token (nonzero) when tr is an owner's trailer for a region of len bytes or more;
 * -EPERM with *why otherwise. */
int kvx_seg_trailer_get(const uint8_t *tr, uint64_t len, uint8_t *token, const char **why);
/* The token a handshake brought (got) is the segment's (want, nonzero); constant time. */
bool kvx_seg_token_ok(const uint8_t *want, const uint8_t *got);

/* ---- metadata codec (metadata.c) ------------------------------------------------------------ */

#define KVX_MD_MAGIC 0x4d58564bu /* "KVXM" read little-endian */
/* 3: its transport's handshake says which payload paths it takes (KVX_MSGF_RNDV), which a
 * format-2 peer's decoder refuses: the format says so at kvx_peer_add (-EPROTONOSUPPORT) */
/* 4: wire version 3 (regions: WRITE and READ_REQ name a region), which a format-3 peer's wire
 * decoder refuses: the format says so at kvx_peer_add (-EPROTONOSUPPORT), as 3 did for 2 */
#define KVX_MD_VERSION 4u
#define KVX_MDF_MAC 1u /* a 32-byte HMAC-SHA256 of the blob ends it */
#define KVX_MAC_LEN 32

typedef struct kvx_md {
    char agent_name[KVX_NAME_MAX + 1];
    char fingerprint[KVX_FINGERPRINT_MAX + 1];
    uint64_t base;
    uint64_t num_blocks;
    uint64_t block_len;
    uint64_t generation;
    uint8_t capability[16];
    kvx_host_id_t host;
    uint32_t flags;
    const uint8_t *worker_addr; /* points into the decoded buffer */
    uint32_t worker_addr_len;
    const uint8_t *rkey; /* an owned region's packed key, or NULL (points into the buffer) */
    uint32_t rkey_len;
    const uint8_t *mac; /* points into the decoded buffer, when flags has KVX_MDF_MAC */
} kvx_md_t;

size_t kvx_md_encoded_len(const kvx_md_t *md);
/* With a secret, the blob is signed (KVX_MDF_MAC). Returns the length or -ENOSPC. */
int kvx_md_encode(const kvx_md_t *md, const uint8_t *secret, size_t secret_len, uint8_t *buf,
                  size_t cap);
int kvx_md_decode(const void *buf, size_t len, kvx_md_t *md);
/* 0 when the blob's signature matches the secret; -EACCES otherwise, or when one side has a
 * secret and the other none. */
int kvx_md_verify(const void *buf, size_t len, const kvx_md_t *md, const uint8_t *secret,
                  size_t secret_len);

/* ---- a region's blob (region.c: kvx_region_blob, kvx_region_load; fuzzed) ------------------ */

#define KVX_RB_MAGIC 0x5258564bu /* "KVXR" read little-endian */
#define KVX_RB_VERSION 1u
typedef struct kvx_region_blob {
    char agent_name[KVX_NAME_MAX + 1]; /* the owner's */
    uint64_t generation;               /* the owner's process (a restarted owner's differs) */
    uint32_t id;                       /* >= 1 */
    uint32_t access;                   /* KVX_REGION_WRITE | KVX_REGION_READ, not 0 */
    uint64_t base, len;                /* len > 0, base + len does not wrap */
    uint8_t capability[16];
    uint32_t flags;     /* KVX_MDF_MAC: signed with the secret */
    const uint8_t *mac; /* with KVX_MDF_MAC: points into the decoded buffer */
} kvx_region_blob_t;
/* With a secret, the blob is signed (KVX_MDF_MAC). Returns its length (at most
 * KVX_REGION_BLOB_MAX), -ENOSPC, or -EINVAL (an agent name empty or too long). */
int kvx_region_blob_encode(const kvx_region_blob_t *rb, const uint8_t *secret, size_t secret_len,
                           uint8_t *buf, size_t cap);
/* 0, -EBADMSG (malformed, or no region blob), or -EPROTONOSUPPORT (a format this kvx does not
 * know). Checks structure only; whose it is and its signature are the caller's to check. */
int kvx_region_blob_decode(const void *buf, size_t len, kvx_region_blob_t *rb);
/* 0 when the blob's signature matches the secret; -EACCES otherwise, or when one side has a
 * secret and the other none. */
int kvx_region_blob_verify(const void *buf, size_t len, const kvx_region_blob_t *rb,
                           const uint8_t *secret, size_t secret_len);

/* ---- wire format (wire.c) -------------------------------------------------------------------- */

/* 3: WRITE and READ_REQ name a region of the receiver and carry its capability (regions) */
#define KVX_WIRE_VERSION 3
enum kvx_msg_type {
    KVX_MSG_HELLO = 1,
    KVX_MSG_HELLO_ACK,
    KVX_MSG_WRITE,
    KVX_MSG_ACK,
    KVX_MSG_READ_REQ,
    KVX_MSG_READ_DATA,
    KVX_MSG_FENCE,
    KVX_MSG_NOTICE,
    KVX_MSG_NOTICE_ACK,
    KVX_MSG_BYE,
    /* pairing by address, over an endpoint of UCX's connection manager (listen.c) */
    KVX_MSG_CHALLENGE,
    KVX_MSG_MD_REQ,
    KVX_MSG_MD,
    /* the writer's answer to a receiver with a secret: its proof over HELLO_ACK's nonce */
    KVX_MSG_PROOF
};
#define KVX_MSGF_CRC 1u    /* WRITE, READ_REQ, READ_DATA: checksums are set */
#define KVX_MSGF_PROOF 2u  /* HELLO, MD_REQ: a proof of the shared secret ends it */
#define KVX_MSGF_SECRET 4u /* CHALLENGE: the listener requires a proof */
/* HELLO: the writer takes READ_DATA payloads by rendezvous; HELLO_ACK: the receiver takes WRITE
 * payloads by rendezvous. A sender sends by rendezvous only what its peer said it takes. */
#define KVX_MSGF_RNDV 8u
/* NOTICE: a payload follows (its length at 56, 0 allowed); without it, no tail and no payload */
#define KVX_MSGF_DATA 16u
/* NOTICE: a notice on its own (kvx_notice_send): its transfer id is for NOTICE_ACK only, and the
 * receiver reports 0 */
#define KVX_MSGF_ALONE 32u
#define KVX_WIRE_HDR_LEN 16
#define KVX_WIRE_HELLO_LEN 64
#define KVX_WIRE_HELLO_ACK_LEN 72
#define KVX_WIRE_PROOF_LEN 48
#define KVX_SEG_TOKEN_LEN 16
#define KVX_WIRE_WRITE_LEN 64
#define KVX_WIRE_ACK_LEN 24
#define KVX_WIRE_READ_REQ_LEN 64
#define KVX_WIRE_READ_DATA_LEN 48
#define KVX_WIRE_FENCE_LEN 24
#define KVX_WIRE_NOTICE_LEN 56
#define KVX_WIRE_NOTICE_DATA_LEN 8 /* a NOTICE's tail with KVX_MSGF_DATA */
#define KVX_WIRE_NOTICE_ACK_LEN 32
#define KVX_WIRE_CHALLENGE_LEN 32
#define KVX_WIRE_RUN_LEN 16
#define KVX_WIRE_ACK_ENTRY_LEN 16
#define KVX_WIRE_MAX_RUNS 256  /* runs in one WRITE or READ_REQ */
#define KVX_WIRE_MAX_ACKS 4096 /* entries in one ACK */
#define KVX_WIRE_MAX_WADDR 4096
#define KVX_PROOF_LEN 32
#define KVX_READ_REQ_MAX ((uint64_t)256 * 1024) /* bytes one READ_REQ asks for */
/* A READ_REQ's priority (its word at 36): 0 is KVX_PRIO_NORMAL, what readers before priorities
 * sent there, 1 KVX_PRIO_LOW, 2 KVX_PRIO_HIGH; anything else is a bad message. */
static inline uint32_t kvx_wire_prio_put(unsigned prio)
{
    return prio == KVX_PRIO_NORMAL ? 0u : prio == KVX_PRIO_LOW ? 1u : 2u;
}
static inline unsigned kvx_wire_prio_get(uint32_t v)
{
    return v == 0 ? KVX_PRIO_NORMAL : v == 1 ? KVX_PRIO_LOW : KVX_PRIO_HIGH;
}
#define KVX_WIRE_NONCE_LEN 16
#define KVX_WIRE_MAX_MD (64u * 1024) /* the metadata one MD carries */
#define KVX_WIRE_MD_REQ_LEN 64
#define KVX_WIRE_MD_LEN 72

typedef struct kvx_wire_run {
    uint64_t offset;
    uint32_t len;
    uint32_t crc;
} kvx_wire_run_t;

/* A decoded message header. Pointers point into the header decoded. */
typedef struct kvx_msg {
    uint8_t type;
    /* set by the backend, not on the wire: the payload comes by rendezvous, and the data pointer
     * handed with the message is UCX's descriptor of it, for kvx_ucx_recv (WRITE, READ_DATA) */
    bool rndv;
    uint16_t flags;
    uint32_t conn_id;
    uint64_t token;
    union {
        struct {
            const uint8_t *capability, *waddr, *proof;
            uint32_t conn_id, waddr_len;
            uint32_t ep_sn; /* the writer's endpoint's place among those it opened to us */
            uint64_t token, generation;
            size_t signed_len; /* the bytes the proof covers */
            char name[KVX_NAME_MAX + 1];
        } hello;
        struct {
            uint32_t rconn_id;
            int32_t status;
            uint64_t token, epoch;
            const uint8_t *seg_token; /* KVX_SEG_TOKEN_LEN bytes */
            const uint8_t *nonce;     /* KVX_WIRE_NONCE_LEN bytes */
        } hello_ack;
        struct {
            const uint8_t *mac; /* KVX_PROOF_LEN bytes */
        } proof;
        struct {
            uint64_t xfer_id, tag, epoch;
            uint32_t nruns;
            uint32_t region;           /* the receiver's region the runs are offsets into */
            const uint8_t *region_cap; /* its capability, 16 bytes (NULL to encode: zero) */
            const uint8_t *runs;
        } write;
        struct {
            uint32_t n;
            const uint8_t *entries;
        } ack;
        struct {
            uint64_t xfer_id, stream_off, bytes;
            uint32_t nruns;
            uint8_t prio;              /* enum kvx_priority */
            uint32_t region;           /* as WRITE's */
            const uint8_t *region_cap; /* as WRITE's */
            const uint8_t *runs;
        } read_req;
        struct {
            uint64_t xfer_id, stream_off;
            uint32_t len, crc;
            int32_t status;
        } read_data;
        struct {
            uint64_t epoch;
        } fence;
        struct {
            uint64_t xfer_id, tag, epoch, blocks, bytes;
            uint32_t data_len; /* with KVX_MSGF_DATA: the payload's length (checked) */
        } notice;
        struct {
            uint64_t xfer_id;
            int32_t status;
        } notice_ack;
        struct {
            const uint8_t *nonce;
        } challenge;
        struct {
            const uint8_t *proof; /* NULL without KVX_MSGF_PROOF */
            const uint8_t *cnonce;
        } md_req;
        struct {
            int32_t status;
            uint32_t len; /* of the metadata, the payload */
            const uint8_t *cnonce;
            const uint8_t *mac; /* NULL without KVX_MSGF_PROOF */
        } md;
    } u;
} kvx_msg_t;

/* Who takes a message: the receiving side of a connection (what a writer sends it), the
 * initiator's side (what a receiver answers), a pairing's endpoint (listen.c), or nobody (an
 * unknown type). */
enum kvx_wire_to { KVX_TO_NOBODY = 0, KVX_TO_RECEIVER, KVX_TO_INITIATOR, KVX_TO_PAIRING };
typedef struct kvx_wire_type {
    size_t fixed;   /* its fixed length (0: no such type) */
    unsigned flags; /* the KVX_MSGF_* it may carry */
    uint8_t to;     /* enum kvx_wire_to */
    bool rndv;      /* its payload may come by rendezvous (WRITE, READ_DATA) */
    bool payload;   /* it may carry a payload at all (WRITE, READ_DATA, MD, NOTICE) */
    bool tail; /* its header goes on past the fixed part (HELLO, WRITE, ACK, READ_REQ, NOTICE) */
    const char *name;
    /* its decoder (the common header checked already, the fixed part whole, tail bytes after
     * it) and its encoder (the common header written; returns the tail's length): wire.c's,
     * side by side */
    int (*decode)(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m);
    size_t (*encode)(const kvx_msg_t *m, uint8_t *p);
} kvx_wire_type_t;
/* The one table of message types (wire.c); an unknown type gives a zero entry, named "?". */
const kvx_wire_type_t *kvx_wire_type(unsigned type);
/* Encode m's header at p (room: its type's fixed length, plus for HELLO the name and address,
 * for WRITE and READ_REQ the runs, for ACK the entries): every field the decoder reads, at the
 * same place. Variable parts are copied from m's pointers, or, for runs and entries whose pointer
 * is NULL or p's own tail, taken as built there already. Returns the bytes written (a HELLO's
 * proof, if any, goes after them). */
size_t kvx_wire_encode(const kvx_msg_t *m, uint8_t *p);
/* Decode a message header of hdr_len bytes that came with data_len bytes of payload: 0, or
 * -EBADMSG for anything malformed. Checks structure only (lengths, counts, reserved fields);
 * whether connection, token and runs are acceptable is the receiver's business. */
int kvx_wire_decode(const void *hdr, size_t hdr_len, size_t data_len, kvx_msg_t *m);
void kvx_wire_put_hdr(uint8_t *p, int type, unsigned flags, uint32_t conn_id, uint64_t token);
void kvx_wire_run_get(const uint8_t *runs, uint32_t i, kvx_wire_run_t *r);
void kvx_wire_run_put(uint8_t *runs, uint32_t i, const kvx_wire_run_t *r);
void kvx_wire_ack_get(const uint8_t *entries, uint32_t i, uint64_t *xfer_id, uint32_t *bytes,
                      int32_t *status);
void kvx_wire_ack_put(uint8_t *entries, uint32_t i, uint64_t xfer_id, uint32_t bytes,
                      int32_t status);

/* A failure status a receiver sent (ACK, READ_DATA, NOTICE_ACK, HELLO_ACK): one of those its
 * side gives, or -EPROTO for anything else (a peer's number is not passed on as an errno of
 * this host: -ECONNABORTED, which a replaced connection reports, or INT32_MIN). */
static inline int kvx_remote_status(int32_t status)
{
    switch (status) {
    case 0:
    case -KVX_EFENCED:
    case -EINVAL:
    case -EBADMSG:
    case -ENOSPC:
    case -EBUSY:
    case -EKEYREVOKED:
    case -ENOENT: /* a region unknown or deregistered */
    case -EACCES: /* a region's capability or access */
        return status;
    default:
        return -EPROTO;
    }
}
/* What a writer with the secret answers a HELLO_ACK's nonce with (PROOF, src/wire.c). */
void kvx_wire_proof_mac(const uint8_t *secret, size_t secret_len, const uint8_t *nonce,
                        uint32_t rconn_id, uint64_t token, uint8_t out[32]);

#endif /* KVX_WIRE_H */
