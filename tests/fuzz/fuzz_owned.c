/*
 * libFuzzer harness for the owned-region key path with a shared secret: what decides whether a
 * writer maps a peer's region and copies into it (src/segment.c), reached the way kvx_peer_add
 * reaches it. Build with clang (CMake: CC=clang, -DKVX_BUILD_FUZZ=ON).
 *
 * An input is a control block of CTL bytes, then a metadata blob. The blob's checksum is
 * recomputed and it is signed with the fuzzer's secret, so that it passes kvx_md_verify (what an
 * attacker holding the secret, or a peer that has it, can send); the control block describes
 * what the kernel would say of the mapping UCX gave for the blob's key (creator, size, offset,
 * the segment's last bytes) and the token the peer's HELLO_ACK brings. UCX's own part (unpacking
 * the key, ucp_rkey_ptr) is left out: UCX parses packed keys without a length, so junk keys
 * crash inside UCX; that is why the decision is kvx's own code in src/wire/segment.c, apart from
 * src/ucx/mem.c.
 *
 * Checked: a blob kvx accepts (decoded, verified, compatible) is mapped exactly when every rule
 * holds, recomputed here from the facts: not this process, the segment's creator is the
 * metadata's process, a System V segment starting at the region, holding it and the trailer,
 * the trailer an owner's for at least the region, its token nonzero and the handshake's. And
 * kvx's lookup of real mappings: a segment this process created is never accepted.
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/shm.h>
#include <unistd.h>

#define CTL 128
static const uint8_t secret[] = "fuzz-owned-secret";
static const uint8_t other_secret[] = "fuzz-owned-other";

/* Once: kvx's lookup on real mappings of this process. */
static void check_real(void)
{
    static bool done;
    kvx_seg_info_t s;
    const char *why;
    uint8_t local[64];
    int id;
    void *p;

    if (done)
        return;
    done = true;
    id = shmget(IPC_PRIVATE, 1 << 16, IPC_CREAT | 0600);
    if (id < 0)
        return;
    p = shmat(id, NULL, 0);
    shmctl(id, IPC_RMID, NULL);
    if (p == (void *)-1)
        return;
    if (kvx_seg_lookup((uintptr_t)p, &s) != 0 || !s.sysv || s.shmid != id || s.cpid != getpid() ||
        s.segsz != (1u << 16) || s.lo != (uintptr_t)p)
        abort();
    /* this process's own segment, whatever the metadata claims */
    if (kvx_seg_check(&s, (uintptr_t)p, 4096, (uint32_t)getpid(), (uint32_t)getpid(), false,
                      &why) != -EPERM ||
        kvx_seg_check(&s, (uintptr_t)p, 4096, 1, (uint32_t)getpid(), false, &why) != -EPERM ||
        kvx_seg_own_has(id))
        abort();
    shmdt(p);
    if (kvx_seg_lookup((uintptr_t)local, &s) != 0 || s.sysv ||
        kvx_seg_check(&s, (uintptr_t)local, 1, 1, (uint32_t)getpid(), false, &why) != -EOPNOTSUPP)
        abort();
}

/* The blob (checksum fixed), signed with the secret as a peer holding it would sign it. Returns
 * its length, 0 if kvx's decoder refuses it. */
static size_t sign(const uint8_t *data, size_t size, bool claim_self, uint8_t *out, size_t cap,
                   kvx_md_t *md)
{
    static uint8_t buf[1 << 16];
    uint32_t crc;
    int n;

    if (size < 16 || size > sizeof(buf))
        return 0;
    memcpy(buf, data, size);
    memset(buf + 12, 0, 4);
    crc = kvx_crc32(buf, size);
    kvx_put32(buf + 12, crc);
    if (kvx_md_decode(buf, size, md) < 0)
        return 0;
    md->flags = KVX_MDF_MAC;
    if (claim_self)
        md->host.pid = (uint32_t)getpid();
    n = kvx_md_encode(md, secret, sizeof(secret), out, cap);
    if (n <= 0)
        abort(); /* what was decoded encodes */
    return (size_t)n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t blob[1 << 16];
    static kvx_core_t self = {.log.name = "fuzz-self"};
    const uint8_t *ctl = data;
    uint8_t tail[KVX_SEG_TRAILER_LEN], token[KVX_SEG_TOKEN_LEN], ack[KVX_WIRE_HELLO_ACK_LEN];
    uint32_t me = (uint32_t)getpid(), owner;
    uint64_t p, len, segsz;
    kvx_seg_info_t s = {0};
    const char *why = NULL;
    size_t n;
    kvx_md_t md;
    kvx_msg_t m;
    bool accept, want, own_region;
    int rc;

    check_real();
    if (size < CTL)
        return 0;
    n = sign(data + CTL, size - CTL, (ctl[0] & 0x40) != 0, blob, sizeof(blob), &md);
    if (n == 0)
        return 0;
    /* what kvx_peer_add does first: decode, verify with the secret, the compatibility rules */
    if (kvx_md_decode(blob, n, &md) != 0 || kvx_md_verify(blob, n, &md, secret, sizeof(secret)) ||
        kvx_md_verify(blob, n, &md, other_secret, sizeof(other_secret)) != -EACCES ||
        kvx_md_verify(blob, n, &md, NULL, 0) != -EACCES)
        abort();
    self.block_len = md.block_len;
    if (kvx_peer_check(&self, &md, NULL, &why) < 0 || md.rkey == NULL)
        return 0; /* refused, or not an owned region: no mapping is tried */
    if (md.num_blocks > UINT64_MAX / md.block_len)
        abort(); /* the decoder bounds the region */
    len = md.num_blocks * md.block_len;
    owner = md.host.pid;

    /* the mapping UCX gave for the key: p (the region's first byte here) and the kernel's facts */
    p = md.base + (ctl[1] & 0x80 ? (uint64_t)ctl[2] << 12 : 0);
    s.sysv = (ctl[0] & 1) != 0;
    s.rw_shared = (ctl[0] & 2) != 0;
    s.lo = p - (ctl[1] & 0x40 ? kvx_get32(ctl + 12) : 0);
    s.off = ctl[3] & 0x80 ? ctl[3] : 0;
    s.cpid = (ctl[1] & 3) == 0   ? (int64_t)owner
             : (ctl[1] & 3) == 1 ? (int64_t)me
                                 : (int64_t)(int32_t)kvx_get32(ctl + 8);
    segsz = ctl[0] & 0x10 ? len + KVX_SEG_TRAILER_LEN + (int64_t)(int16_t)kvx_get16(ctl + 4)
                          : kvx_get64(ctl + 16);
    s.segsz = segsz;
    s.hi =
        s.lo + (ctl[0] & 0x20 ? ((segsz + 4095) & ~4095ull) + (int64_t)(int16_t)kvx_get16(ctl + 6)
                              : kvx_get64(ctl + 24));
    s.shmid = s.sysv ? 1 : -1;
    /* the segment's last bytes: a trailer as an owner writes it, or what the input says */
    memcpy(tail, ctl + 32, sizeof(tail));
    if (ctl[0] & 4) {
        memcpy(token, ctl + 48, sizeof(token));
        kvx_seg_trailer_put(tail, len + (int64_t)(int8_t)ctl[96], token);
    }
    /* the peer's HELLO_ACK, its token the trailer's or the input's */
    memset(ack, 0, sizeof(ack));
    kvx_wire_put_hdr(ack, KVX_MSG_HELLO_ACK, 0, 1, 2);
    memcpy(ack + 40, ctl[0] & 8 ? tail + 16 : ctl + 100, KVX_SEG_TOKEN_LEN);
    if (kvx_wire_decode(ack, sizeof(ack), 0, &m) != 0 || m.u.hello_ack.seg_token != ack + 40)
        abort();

    /* the decision, as kvx_conn_map, kvx_ucx_map and kvx_conn_map_prove take it */
    own_region = (ctl[1] & 0x20) != 0;
    rc = kvx_seg_check(&s, p, len, owner, me, own_region, &why);
    if (rc == 0)
        rc = kvx_seg_trailer_get(tail, len, token, &why);
    accept = rc == 0 && kvx_seg_token_ok(token, m.u.hello_ack.seg_token);
    if (rc < 0 && (why == NULL || (rc != -EPERM && rc != -EOPNOTSUPP)))
        abort();

    /* the rules, recomputed */
    {
        static const uint8_t zero[KVX_SEG_TOKEN_LEN];
        bool magic = memcmp(tail, "KVXSEG01", 8) == 0;
        bool reserved = memcmp(tail + 32, zero, 16) == 0 && memcmp(tail + 48, zero, 16) == 0;
        want = (s.cpid != (int64_t)me || own_region) && owner != 0 && s.cpid == (int64_t)owner &&
               s.sysv && s.rw_shared && p == s.lo && s.off == 0 && len > 0 &&
               segsz >= KVX_SEG_TRAILER_LEN && len <= segsz - KVX_SEG_TRAILER_LEN &&
               segsz <= s.hi - s.lo && magic && reserved && kvx_get64(tail + 8) >= len &&
               memcmp(tail + 16, zero, KVX_SEG_TOKEN_LEN) != 0 &&
               memcmp(tail + 16, ack + 40, KVX_SEG_TOKEN_LEN) == 0;
    }
    if (accept != want)
        abort();
    if (accept && memcmp(token, tail + 16, KVX_SEG_TOKEN_LEN) != 0)
        abort();
    return 0;
}
