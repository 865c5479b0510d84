/*
 * What crosses the wire between two kvx transports: the headers of kvx's active messages, one
 * table of their types (length, flags, who takes them), their encoder and a strict decoder (a
 * fuzz target, like the metadata codec), each field at the same place in both. A peer's bytes are
 * hostile input: the decoder checks every length, count and reserved field before anything is
 * used, and recv/recv.c then checks what the decoder cannot know (connection, token, region
 * bounds). Each type's decoder and encoder sit side by side, and the table names both.
 *
 * Every message starts with a common header, little-endian:
 *    0 u8 version (3)   1 u8 type   2 u16 flags   4 u32 connection id   8 u64 token
 * (the id and token the receiving side gave that connection; zero in HELLO). Flags: CRC (1)
 * on WRITE, READ_REQ and READ_DATA: checksums are set; PROOF (2) on HELLO and MD_REQ, MD: a proof
 * of the secret ends it; SECRET (4) on CHALLENGE; RNDV (8) on HELLO: the writer takes READ_DATA
 * payloads by rendezvous, on HELLO_ACK: the receiver takes WRITE payloads by rendezvous (each
 * side sends by rendezvous only what the other said it takes); DATA (16) on NOTICE: a payload
 * follows, ALONE (32) on NOTICE: kvx_notice_send's (the receiver reports transfer id 0). Then, by
 * type:
 *   HELLO      16 capability[16] 32 u32 conn id 36 u32 endpoint sequence 40 u64 token
 *              48 u64 generation
 *              56 u8 name length 57 u8[3] 0 60 u32 worker address length 64 name, address
 *              [, proof[32] with KVX_MSGF_PROOF]
 *   HELLO_ACK  16 u32 receiver's connection id 20 i32 status 24 u64 its token 32 u64 epoch
 *              40 u8[16] segment token (an owned region's: what its segment holds; else zero)
 *              56 u8[16] nonce (with a secret: the PROOF that must come first; else zero)
 *   PROOF      16 u8[32] HMAC-SHA256(secret, "kvx-proof" nonce connection id token) over the
 *              HELLO_ACK's nonce and the receiver's connection id and token, the first message
 *              a writer sends on a connection to a receiver with a secret
 *   WRITE      16 u64 transfer id 24 u64 tag 32 u64 epoch 40 u32 runs 44 u32 region (not 0)
 *              48 u8[16] the region's capability (zero for the main region) 64 runs;
 *              the payload is the runs' bytes, in order
 *   ACK        16 u32 entries 20 u32 0 24 entries {u64 transfer id, u32 bytes, i32 status}
 *   READ_REQ   16 u64 transfer id 24 u64 stream offset 32 u32 runs 36 u32 priority (0 normal,
 *              1 low, 2 high) 40 u32 region (not 0) 44 u32 0 48 u8[16] the region's capability
 *              64 runs
 *   READ_DATA  16 u64 transfer id 24 u64 stream offset 32 u32 length 36 u32 crc32c
 *              40 i32 status 44 u32 0; the payload is length bytes (none when status < 0)
 *   FENCE      16 u64 epoch
 *   NOTICE     16 u64 transfer id 24 u64 tag 32 u64 epoch 40 u64 blocks 48 u64 bytes
 *              [with flag DATA (16): 56 u32 payload length (0..1 MiB) 60 u32 0; the payload is
 *              that many bytes, always eager. Without it, no more bytes and no payload: a
 *              notice without a payload is the same 56 bytes as before payloads]
 *   NOTICE_ACK 16 u64 transfer id 24 i32 status 28 u32 0
 *   BYE        (nothing more)
 * and, on an endpoint of UCX's connection manager only (pairing by address, peer/):
 *   CHALLENGE  16 u8[16] nonce (flag KVX_MSGF_SECRET: a proof is required)
 *   MD_REQ     16 u8[32] proof of the secret over both nonces (flag KVX_MSGF_PROOF; else zero)
 *              48 u8[16] the connecting side's nonce
 *   MD         16 i32 status 20 u32 metadata length 24 u8[16] the connecting side's nonce
 *              40 u8[32] MAC over both nonces and the metadata (flag KVX_MSGF_PROOF; else
 *              zero); the payload is the metadata (none when status < 0)
 * A run is {u64 offset into the message's region of the receiver, u32 length, u32 crc32c
 * (KVX_MSGF_CRC)}: one message, one region (version 3; version 2 had no region field and one
 * region, which a version-3 decoder refuses by the version byte).
 */
#include "wire/kvx_wire.h"

#include <errno.h>
#include <string.h>

static const uint8_t kvx_zero[8];

void kvx_wire_put_hdr(uint8_t *p, int type, unsigned flags, uint32_t conn_id, uint64_t token)
{
    p[0] = KVX_WIRE_VERSION;
    p[1] = (uint8_t)type;
    kvx_put16(p + 2, (uint16_t)flags);
    kvx_put32(p + 4, conn_id);
    kvx_put64(p + 8, token);
}

void kvx_wire_run_get(const uint8_t *runs, uint32_t i, kvx_wire_run_t *r)
{
    const uint8_t *p = runs + (size_t)i * KVX_WIRE_RUN_LEN;
    r->offset = kvx_get64(p);
    r->len = kvx_get32(p + 8);
    r->crc = kvx_get32(p + 12);
}

void kvx_wire_run_put(uint8_t *runs, uint32_t i, const kvx_wire_run_t *r)
{
    uint8_t *p = runs + (size_t)i * KVX_WIRE_RUN_LEN;
    kvx_put64(p, r->offset);
    kvx_put32(p + 8, r->len);
    kvx_put32(p + 12, r->crc);
}

/* Runs: a count within bounds, exactly that many, each non-empty; their total in *total. */
static int kvx_wire_runs(const uint8_t *runs, uint32_t n, size_t avail, uint64_t *total)
{
    uint64_t sum = 0;

    if (n == 0 || n > KVX_WIRE_MAX_RUNS || avail != (size_t)n * KVX_WIRE_RUN_LEN)
        return -EBADMSG;
    for (uint32_t i = 0; i < n; i++) {
        kvx_wire_run_t r;
        kvx_wire_run_get(runs, i, &r);
        if (r.len == 0)
            return -EBADMSG;
        sum += r.len; /* at most 2^12 runs of < 2^32 bytes: no overflow */
    }
    *total = sum;
    return 0;
}

static bool kvx_wire_text_ok(const uint8_t *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    return true;
}

/* Bytes of a fixed-size field: copied from src, or zero (src NULL). */
static void kvx_wire_put_bytes(uint8_t *p, const uint8_t *src, size_t len)
{
    if (src != NULL)
        memcpy(p, src, len);
    else
        memset(p, 0, len);
}

/* ---- each type: its decoder (p: the header, its fixed part whole and, for a type with a tail,
 * tail bytes after it; data_len: the payload's) and its encoder (p zeroed over the fixed part,
 * the common header written; returns the tail's bytes), every field at the same place in both */

static int kvx_hello_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    const uint8_t *name = p + KVX_WIRE_HELLO_LEN;
    size_t name_len = p[56], waddr_len = kvx_get32(p + 60);
    size_t proof = (m->flags & KVX_MSGF_PROOF) ? KVX_PROOF_LEN : 0;

    (void)data_len;
    if (m->conn_id != 0 || m->token != 0 || memcmp(p + 57, kvx_zero, 3) != 0 || name_len == 0 ||
        name_len > KVX_NAME_MAX || waddr_len == 0 || waddr_len > KVX_WIRE_MAX_WADDR ||
        tail != name_len + waddr_len + proof || !kvx_wire_text_ok(name, name_len))
        return -EBADMSG;
    m->u.hello.capability = p + 16;
    m->u.hello.conn_id = kvx_get32(p + 32);
    m->u.hello.ep_sn = kvx_get32(p + 36);
    m->u.hello.token = kvx_get64(p + 40);
    m->u.hello.generation = kvx_get64(p + 48);
    memcpy(m->u.hello.name, name, name_len);
    m->u.hello.name[name_len] = '\0';
    m->u.hello.waddr = name + name_len;
    m->u.hello.waddr_len = (uint32_t)waddr_len;
    m->u.hello.proof = proof ? name + name_len + waddr_len : NULL;
    m->u.hello.signed_len = KVX_WIRE_HELLO_LEN + name_len + waddr_len;
    return 0;
}
static size_t kvx_hello_enc(const kvx_msg_t *m, uint8_t *p)
{
    uint8_t *name = p + KVX_WIRE_HELLO_LEN;
    size_t n = strlen(m->u.hello.name);

    kvx_wire_put_bytes(p + 16, m->u.hello.capability, 16);
    kvx_put32(p + 32, m->u.hello.conn_id);
    kvx_put32(p + 36, m->u.hello.ep_sn);
    kvx_put64(p + 40, m->u.hello.token);
    kvx_put64(p + 48, m->u.hello.generation);
    p[56] = (uint8_t)n;
    kvx_put32(p + 60, m->u.hello.waddr_len);
    memcpy(name, m->u.hello.name, n);
    memcpy(name + n, m->u.hello.waddr, m->u.hello.waddr_len);
    return n + m->u.hello.waddr_len; /* the proof, if any, follows: signed_len */
}

static int kvx_hello_ack_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)tail, (void)data_len;
    m->u.hello_ack.rconn_id = kvx_get32(p + 16);
    m->u.hello_ack.status = (int32_t)kvx_get32(p + 20);
    m->u.hello_ack.token = kvx_get64(p + 24);
    m->u.hello_ack.epoch = kvx_get64(p + 32);
    m->u.hello_ack.seg_token = p + 40;
    m->u.hello_ack.nonce = p + 56;
    return m->u.hello_ack.status > 0 ? -EBADMSG : 0;
}
static size_t kvx_hello_ack_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_put32(p + 16, m->u.hello_ack.rconn_id);
    kvx_put32(p + 20, (uint32_t)m->u.hello_ack.status);
    kvx_put64(p + 24, m->u.hello_ack.token);
    kvx_put64(p + 32, m->u.hello_ack.epoch);
    kvx_wire_put_bytes(p + 40, m->u.hello_ack.seg_token, KVX_SEG_TOKEN_LEN);
    kvx_wire_put_bytes(p + 56, m->u.hello_ack.nonce, KVX_WIRE_NONCE_LEN);
    return 0;
}

static int kvx_proof_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)tail, (void)data_len;
    m->u.proof.mac = p + 16;
    return 0;
}
static size_t kvx_proof_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_wire_put_bytes(p + 16, m->u.proof.mac, KVX_PROOF_LEN);
    return 0;
}

/* Runs after a header's fixed part (at): in place already (written by kvx_wire_run_put: the
 * pointer is NULL or at), or copied; their bytes. */
static size_t kvx_wire_put_runs(uint8_t *at, const uint8_t *runs, uint32_t nruns)
{
    size_t n = (size_t)nruns * KVX_WIRE_RUN_LEN;

    if (runs != NULL && runs != at)
        memcpy(at, runs, n);
    return n;
}

static int kvx_write_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    uint64_t total;

    m->u.write.xfer_id = kvx_get64(p + 16);
    m->u.write.tag = kvx_get64(p + 24);
    m->u.write.epoch = kvx_get64(p + 32);
    m->u.write.nruns = kvx_get32(p + 40);
    m->u.write.region = kvx_get32(p + 44);
    m->u.write.region_cap = p + 48;
    m->u.write.runs = p + KVX_WIRE_WRITE_LEN;
    if (m->u.write.region == 0 ||
        kvx_wire_runs(m->u.write.runs, m->u.write.nruns, tail, &total) < 0 || total != data_len)
        return -EBADMSG;
    return 0;
}
static size_t kvx_write_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_put64(p + 16, m->u.write.xfer_id);
    kvx_put64(p + 24, m->u.write.tag);
    kvx_put64(p + 32, m->u.write.epoch);
    kvx_put32(p + 40, m->u.write.nruns);
    kvx_put32(p + 44, m->u.write.region);
    kvx_wire_put_bytes(p + 48, m->u.write.region_cap, 16);
    return kvx_wire_put_runs(p + KVX_WIRE_WRITE_LEN, m->u.write.runs, m->u.write.nruns);
}

static int kvx_ack_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)data_len;
    m->u.ack.n = kvx_get32(p + 16);
    m->u.ack.entries = p + KVX_WIRE_ACK_LEN;
    if (kvx_get32(p + 20) != 0 || m->u.ack.n == 0 || m->u.ack.n > KVX_WIRE_MAX_ACKS ||
        tail != (size_t)m->u.ack.n * KVX_WIRE_ACK_ENTRY_LEN)
        return -EBADMSG;
    return 0;
}
/* The entries: in place after the header (kvx_wire_ack_put), or copied. */
static size_t kvx_ack_enc(const kvx_msg_t *m, uint8_t *p)
{
    uint8_t *at = p + KVX_WIRE_ACK_LEN;
    size_t n = (size_t)m->u.ack.n * KVX_WIRE_ACK_ENTRY_LEN;

    kvx_put32(p + 16, m->u.ack.n);
    if (m->u.ack.entries != NULL && m->u.ack.entries != at)
        memcpy(at, m->u.ack.entries, n);
    return n;
}

static int kvx_read_req_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    uint64_t total;

    (void)data_len;
    m->u.read_req.xfer_id = kvx_get64(p + 16);
    m->u.read_req.stream_off = kvx_get64(p + 24);
    m->u.read_req.nruns = kvx_get32(p + 32);
    m->u.read_req.runs = p + KVX_WIRE_READ_REQ_LEN;
    m->u.read_req.prio = (uint8_t)kvx_wire_prio_get(kvx_get32(p + 36));
    m->u.read_req.region = kvx_get32(p + 40);
    m->u.read_req.region_cap = p + 48;
    if (kvx_get32(p + 36) > 2 || m->u.read_req.region == 0 || kvx_get32(p + 44) != 0 ||
        kvx_wire_runs(m->u.read_req.runs, m->u.read_req.nruns, tail, &total) < 0 ||
        total > KVX_READ_REQ_MAX)
        return -EBADMSG;
    m->u.read_req.bytes = total;
    return 0;
}
static size_t kvx_read_req_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_put64(p + 16, m->u.read_req.xfer_id);
    kvx_put64(p + 24, m->u.read_req.stream_off);
    kvx_put32(p + 32, m->u.read_req.nruns);
    kvx_put32(p + 36, kvx_wire_prio_put(m->u.read_req.prio));
    kvx_put32(p + 40, m->u.read_req.region);
    kvx_wire_put_bytes(p + 48, m->u.read_req.region_cap, 16);
    return kvx_wire_put_runs(p + KVX_WIRE_READ_REQ_LEN, m->u.read_req.runs, m->u.read_req.nruns);
}

/* A payload of len bytes (READ_DATA, MD) with status 0, or none with an error (status < 0). */
static bool kvx_wire_payload_ok(int32_t status, uint32_t len, size_t data_len, size_t max)
{
    if (status > 0)
        return false;
    if (status < 0)
        return len == 0 && data_len == 0;
    return len == data_len && data_len != 0 && data_len <= max;
}

static int kvx_read_data_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)tail;
    m->u.read_data.xfer_id = kvx_get64(p + 16);
    m->u.read_data.stream_off = kvx_get64(p + 24);
    m->u.read_data.len = kvx_get32(p + 32);
    m->u.read_data.crc = kvx_get32(p + 36);
    m->u.read_data.status = (int32_t)kvx_get32(p + 40);
    if (kvx_get32(p + 44) != 0 ||
        !kvx_wire_payload_ok(m->u.read_data.status, m->u.read_data.len, data_len, SIZE_MAX))
        return -EBADMSG;
    return 0;
}
static size_t kvx_read_data_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_put64(p + 16, m->u.read_data.xfer_id);
    kvx_put64(p + 24, m->u.read_data.stream_off);
    kvx_put32(p + 32, m->u.read_data.len);
    kvx_put32(p + 36, m->u.read_data.crc);
    kvx_put32(p + 40, (uint32_t)m->u.read_data.status);
    return 0;
}

static int kvx_fence_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)tail, (void)data_len;
    m->u.fence.epoch = kvx_get64(p + 16);
    return 0;
}
static size_t kvx_fence_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_put64(p + 16, m->u.fence.epoch);
    return 0;
}

/* Without KVX_MSGF_DATA, the 56 bytes of old and no payload; with it, a tail of the payload's
 * length, which must be the payload's and at most KVX_NOTICE_DATA_MAX (0: an empty payload). */
static int kvx_notice_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    if (!(m->flags & KVX_MSGF_DATA)) {
        if (tail != 0 || data_len != 0)
            return -EBADMSG;
    } else {
        if (tail != KVX_WIRE_NOTICE_DATA_LEN || kvx_get32(p + KVX_WIRE_NOTICE_LEN + 4) != 0)
            return -EBADMSG;
        m->u.notice.data_len = kvx_get32(p + KVX_WIRE_NOTICE_LEN);
        if (m->u.notice.data_len != data_len || data_len > KVX_NOTICE_DATA_MAX)
            return -EBADMSG;
    }
    m->u.notice.xfer_id = kvx_get64(p + 16);
    m->u.notice.tag = kvx_get64(p + 24);
    m->u.notice.epoch = kvx_get64(p + 32);
    m->u.notice.blocks = kvx_get64(p + 40);
    m->u.notice.bytes = kvx_get64(p + 48);
    return 0;
}
static size_t kvx_notice_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_put64(p + 16, m->u.notice.xfer_id);
    kvx_put64(p + 24, m->u.notice.tag);
    kvx_put64(p + 32, m->u.notice.epoch);
    kvx_put64(p + 40, m->u.notice.blocks);
    kvx_put64(p + 48, m->u.notice.bytes);
    if (!(m->flags & KVX_MSGF_DATA))
        return 0;
    kvx_put32(p + KVX_WIRE_NOTICE_LEN, m->u.notice.data_len);
    kvx_put32(p + KVX_WIRE_NOTICE_LEN + 4, 0);
    return KVX_WIRE_NOTICE_DATA_LEN;
}

static int kvx_notice_ack_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)tail, (void)data_len;
    m->u.notice_ack.xfer_id = kvx_get64(p + 16);
    m->u.notice_ack.status = (int32_t)kvx_get32(p + 24);
    return kvx_get32(p + 28) != 0 || m->u.notice_ack.status > 0 ? -EBADMSG : 0;
}
static size_t kvx_notice_ack_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_put64(p + 16, m->u.notice_ack.xfer_id);
    kvx_put32(p + 24, (uint32_t)m->u.notice_ack.status);
    return 0;
}

static int kvx_bye_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)p, (void)tail, (void)data_len, (void)m;
    return 0;
}
static size_t kvx_bye_enc(const kvx_msg_t *m, uint8_t *p)
{
    (void)m, (void)p;
    return 0;
}

static int kvx_challenge_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)tail, (void)data_len;
    m->u.challenge.nonce = p + 16;
    return 0;
}
static size_t kvx_challenge_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_wire_put_bytes(p + 16, m->u.challenge.nonce, KVX_WIRE_NONCE_LEN);
    return 0;
}

/* A proof or MAC that is there only with KVX_MSGF_PROOF, else all zero: NULL then. */
static int kvx_wire_proof_field(const uint8_t *at, bool present, const uint8_t **field_p)
{
    *field_p = present ? at : NULL;
    for (size_t i = 0; !present && i < KVX_PROOF_LEN; i++)
        if (at[i] != 0)
            return -EBADMSG;
    return 0;
}

static int kvx_md_req_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)tail, (void)data_len;
    m->u.md_req.cnonce = p + 48;
    return kvx_wire_proof_field(p + 16, (m->flags & KVX_MSGF_PROOF) != 0, &m->u.md_req.proof);
}
static size_t kvx_md_req_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_wire_put_bytes(p + 16, m->u.md_req.proof, KVX_PROOF_LEN);
    kvx_wire_put_bytes(p + 48, m->u.md_req.cnonce, KVX_WIRE_NONCE_LEN);
    return 0;
}

static int kvx_md_dec(const uint8_t *p, size_t tail, size_t data_len, kvx_msg_t *m)
{
    (void)tail;
    m->u.md.status = (int32_t)kvx_get32(p + 16);
    m->u.md.len = kvx_get32(p + 20);
    m->u.md.cnonce = p + 24;
    if (kvx_wire_proof_field(p + 40, (m->flags & KVX_MSGF_PROOF) != 0, &m->u.md.mac) < 0 ||
        !kvx_wire_payload_ok(m->u.md.status, m->u.md.len, data_len, KVX_WIRE_MAX_MD))
        return -EBADMSG;
    return 0;
}
static size_t kvx_md_enc(const kvx_msg_t *m, uint8_t *p)
{
    kvx_put32(p + 16, (uint32_t)m->u.md.status);
    kvx_put32(p + 20, m->u.md.len);
    kvx_wire_put_bytes(p + 24, m->u.md.cnonce, KVX_WIRE_NONCE_LEN);
    kvx_wire_put_bytes(p + 40, m->u.md.mac, KVX_PROOF_LEN);
    return 0;
}

/* ---- the table ------------------------------------------------------------------------------ */

#define KVX_TYPE(t, len, fl, who, rv, pay, tl, codec)                                              \
    [KVX_MSG_##t] = {.fixed = (len),                                                               \
                     .flags = (fl),                                                                \
                     .to = (who),                                                                  \
                     .rndv = (rv),                                                                 \
                     .payload = (pay),                                                             \
                     .tail = (tl),                                                                 \
                     .name = #t,                                                                   \
                     .decode = kvx_##codec##_dec,                                                  \
                     .encode = kvx_##codec##_enc}

/* Every message type: its fixed length, the flags it may carry, who takes it, whether its payload
 * may come by rendezvous, whether it may have one at all, whether its header goes on past the
 * fixed part, its name, its decoder and encoder. The decoder, the encoder, the backend's dispatch
 * and the fuzzer read this one table. */
static const kvx_wire_type_t kvx_wire_types[] = {
    KVX_TYPE(HELLO, KVX_WIRE_HELLO_LEN, KVX_MSGF_PROOF | KVX_MSGF_RNDV, KVX_TO_RECEIVER, false,
             false, true, hello),
    KVX_TYPE(HELLO_ACK, KVX_WIRE_HELLO_ACK_LEN, KVX_MSGF_RNDV, KVX_TO_INITIATOR, false, false,
             false, hello_ack),
    KVX_TYPE(WRITE, KVX_WIRE_WRITE_LEN, KVX_MSGF_CRC, KVX_TO_RECEIVER, true, true, true, write),
    KVX_TYPE(ACK, KVX_WIRE_ACK_LEN, 0, KVX_TO_INITIATOR, false, false, true, ack),
    KVX_TYPE(READ_REQ, KVX_WIRE_READ_REQ_LEN, KVX_MSGF_CRC, KVX_TO_RECEIVER, false, false, true,
             read_req),
    KVX_TYPE(READ_DATA, KVX_WIRE_READ_DATA_LEN, KVX_MSGF_CRC, KVX_TO_INITIATOR, true, true, false,
             read_data),
    KVX_TYPE(FENCE, KVX_WIRE_FENCE_LEN, 0, KVX_TO_INITIATOR, false, false, false, fence),
    KVX_TYPE(NOTICE, KVX_WIRE_NOTICE_LEN, KVX_MSGF_DATA | KVX_MSGF_ALONE, KVX_TO_RECEIVER, false,
             true, true, notice),
    KVX_TYPE(NOTICE_ACK, KVX_WIRE_NOTICE_ACK_LEN, 0, KVX_TO_INITIATOR, false, false, false,
             notice_ack),
    KVX_TYPE(BYE, KVX_WIRE_HDR_LEN, 0, KVX_TO_RECEIVER, false, false, false, bye),
    KVX_TYPE(CHALLENGE, KVX_WIRE_CHALLENGE_LEN, KVX_MSGF_SECRET, KVX_TO_PAIRING, false, false,
             false, challenge),
    KVX_TYPE(MD_REQ, KVX_WIRE_MD_REQ_LEN, KVX_MSGF_PROOF, KVX_TO_PAIRING, false, false, false,
             md_req),
    KVX_TYPE(MD, KVX_WIRE_MD_LEN, KVX_MSGF_PROOF, KVX_TO_PAIRING, false, true, false, md),
    KVX_TYPE(PROOF, KVX_WIRE_PROOF_LEN, 0, KVX_TO_RECEIVER, false, false, false, proof),
};

const kvx_wire_type_t *kvx_wire_type(unsigned type)
{
    static const kvx_wire_type_t none = {.to = KVX_TO_NOBODY, .name = "?"};

    if (type >= sizeof(kvx_wire_types) / sizeof(kvx_wire_types[0]) ||
        kvx_wire_types[type].fixed == 0)
        return &none;
    return &kvx_wire_types[type];
}

int kvx_wire_decode(const void *hdr, size_t hdr_len, size_t data_len, kvx_msg_t *m)
{
    const uint8_t *p = hdr;
    const kvx_wire_type_t *ty;

    if (p == NULL || hdr_len < KVX_WIRE_HDR_LEN || p[0] != KVX_WIRE_VERSION)
        return -EBADMSG;
    memset(m, 0, sizeof(*m));
    m->type = p[1];
    m->flags = kvx_get16(p + 2);
    m->conn_id = kvx_get32(p + 4);
    m->token = kvx_get64(p + 8);
    ty = kvx_wire_type(m->type);
    /* a known type, its fixed part whole and nothing after it but a tail where one may come,
     * only the flags it may carry, a payload only where one may come (WRITE, READ_DATA, MD,
     * NOTICE) */
    if (ty->fixed == 0 || hdr_len < ty->fixed || (!ty->tail && hdr_len != ty->fixed) ||
        (m->flags & ~ty->flags) || (data_len != 0 && !ty->payload))
        return -EBADMSG;
    /* the pairing messages name no connection */
    if (ty->to == KVX_TO_PAIRING && (m->conn_id != 0 || m->token != 0))
        return -EBADMSG;
    return ty->decode(p, hdr_len - ty->fixed, data_len, m);
}

size_t kvx_wire_encode(const kvx_msg_t *m, uint8_t *p)
{
    const kvx_wire_type_t *ty = kvx_wire_type(m->type);

    memset(p, 0, ty->fixed);
    kvx_wire_put_hdr(p, m->type, m->flags, m->conn_id, m->token);
    return ty->fixed + (ty->encode != NULL ? ty->encode(m, p) : 0);
}

void kvx_wire_ack_get(const uint8_t *entries, uint32_t i, uint64_t *xfer_id, uint32_t *bytes,
                      int32_t *status)
{
    const uint8_t *p = entries + (size_t)i * KVX_WIRE_ACK_ENTRY_LEN;
    *xfer_id = kvx_get64(p);
    *bytes = kvx_get32(p + 8);
    *status = (int32_t)kvx_get32(p + 12);
}

void kvx_wire_ack_put(uint8_t *entries, uint32_t i, uint64_t xfer_id, uint32_t bytes,
                      int32_t status)
{
    uint8_t *p = entries + (size_t)i * KVX_WIRE_ACK_ENTRY_LEN;
    kvx_put64(p, xfer_id);
    kvx_put32(p + 8, bytes);
    kvx_put32(p + 12, (uint32_t)status);
}

/* HMAC-SHA256(secret, "kvx-proof" || nonce || connection id (le32) || token (le64)): what a
 * writer with the secret answers HELLO_ACK's nonce with. */
void kvx_wire_proof_mac(const uint8_t *secret, size_t secret_len, const uint8_t *nonce,
                        uint32_t rconn_id, uint64_t token, uint8_t out[KVX_PROOF_LEN])
{
    uint8_t buf[9 + KVX_WIRE_NONCE_LEN + 12];
    kvx_iov_t part = {buf, sizeof(buf)};

    memcpy(buf, "kvx-proof", 9);
    memcpy(buf + 9, nonce, KVX_WIRE_NONCE_LEN);
    kvx_put32(buf + 9 + KVX_WIRE_NONCE_LEN, rconn_id);
    kvx_put64(buf + 13 + KVX_WIRE_NONCE_LEN, token);
    kvx_hmac_sha256(secret, secret_len, &part, 1, out);
}
