/*
 * A region's blob: what a peer needs to address one region of a transport (kvx_region_blob,
 * kvx_region_load): whose it is (the owner's agent name and generation, so that a restarted
 * owner's regions are refused until loaded again), its id, where it is and how long, what peers
 * may do with it, and the capability every message naming it must carry. A strict decoder (a
 * fuzz target: tests/fuzz/fuzz_region.c), like the metadata's; its size does not depend on the
 * region's (at most 72 + 63 + 32 bytes, under KVX_REGION_BLOB_MAX).
 *
 * Layout, little-endian, format version 1:
 *    0 u32 magic "KVXR"        4 u16 version (1)         6 u16 header length (72)
 *    8 u32 total length       12 u32 crc32 of the blob with this field zeroed
 *   16 u64 the owner's generation
 *   24 u32 region id (>= 1)   28 u32 access (KVX_REGION_WRITE | KVX_REGION_READ, not 0)
 *   32 u64 base address       40 u64 length (> 0, base + length does not wrap)
 *   48 u8[16] the region's capability (random)
 *   64 u32 flags (KVX_MDF_MAC, or 0)   68 u8 agent name length (1..63)   69 u8[3] 0
 *   72 agent name (no terminator)
 *      [with KVX_MDF_MAC: HMAC-SHA256 of all that precedes, keyed with the shared secret, the crc
 *      field zeroed]
 */
#include "wire/kvx_wire.h"

#include <errno.h>
#include <string.h>

#define KVX_RB_HDR_LEN 72u

static void kvx_rb_mac(const uint8_t *buf, size_t len, const uint8_t *secret, size_t secret_len,
                       uint8_t out[KVX_MAC_LEN])
{
    static const uint8_t zero[4];
    kvx_iov_t parts[3] = {{(void *)buf, 12}, {(void *)zero, 4}, {(void *)(buf + 16), len - 16}};
    kvx_hmac_sha256(secret, secret_len, parts, 3, out);
}

int kvx_region_blob_encode(const kvx_region_blob_t *rb, const uint8_t *secret, size_t secret_len,
                           uint8_t *buf, size_t cap)
{
    size_t name_len = strnlen(rb->agent_name, sizeof(rb->agent_name));
    size_t len = KVX_RB_HDR_LEN + name_len + (secret != NULL ? KVX_MAC_LEN : 0);

    if (name_len == 0 || name_len > KVX_NAME_MAX)
        return -EINVAL;
    if (len > cap)
        return -ENOSPC;
    memset(buf, 0, KVX_RB_HDR_LEN);
    kvx_put32(buf, KVX_RB_MAGIC);
    kvx_put16(buf + 4, KVX_RB_VERSION);
    kvx_put16(buf + 6, KVX_RB_HDR_LEN);
    kvx_put32(buf + 8, (uint32_t)len);
    kvx_put64(buf + 16, rb->generation);
    kvx_put32(buf + 24, rb->id);
    kvx_put32(buf + 28, rb->access);
    kvx_put64(buf + 32, rb->base);
    kvx_put64(buf + 40, rb->len);
    memcpy(buf + 48, rb->capability, 16);
    kvx_put32(buf + 64, secret != NULL ? KVX_MDF_MAC : 0);
    buf[68] = (uint8_t)name_len;
    memcpy(buf + KVX_RB_HDR_LEN, rb->agent_name, name_len);
    if (secret != NULL)
        kvx_rb_mac(buf, len - KVX_MAC_LEN, secret, secret_len, buf + len - KVX_MAC_LEN);
    kvx_put32(buf + 12, kvx_crc32(buf, len));
    return (int)len;
}

int kvx_region_blob_decode(const void *data, size_t len, kvx_region_blob_t *rb)
{
    static const uint8_t zero[4];
    const uint8_t *buf = data;
    uint32_t flags, access;
    size_t name_len;
    uint64_t base, rlen;

    if (buf == NULL || len < 8 || kvx_get32(buf) != KVX_RB_MAGIC)
        return -EBADMSG;
    if (kvx_get16(buf + 4) != KVX_RB_VERSION)
        return -EPROTONOSUPPORT;
    if (len < KVX_RB_HDR_LEN || kvx_get16(buf + 6) != KVX_RB_HDR_LEN || kvx_get32(buf + 8) != len)
        return -EBADMSG;
    {
        kvx_iov_t parts[3] = {{(void *)buf, 12}, {(void *)zero, 4}, {(void *)(buf + 16), len - 16}};
        if (kvx_crc32_parts(parts, 3) != kvx_get32(buf + 12))
            return -EBADMSG;
    }
    flags = kvx_get32(buf + 64);
    access = kvx_get32(buf + 28);
    name_len = buf[68];
    base = kvx_get64(buf + 32);
    rlen = kvx_get64(buf + 40);
    if ((flags & ~KVX_MDF_MAC) != 0 || buf[69] != 0 || buf[70] != 0 || buf[71] != 0 ||
        name_len == 0 || name_len > KVX_NAME_MAX || kvx_get32(buf + 24) == 0 || access == 0 ||
        (access & ~(KVX_REGION_WRITE | KVX_REGION_READ)) != 0 || rlen == 0 || base == 0 ||
        base > UINT64_MAX - rlen ||
        len != KVX_RB_HDR_LEN + name_len + ((flags & KVX_MDF_MAC) ? KVX_MAC_LEN : 0))
        return -EBADMSG;
    for (size_t i = 0; i < name_len; i++)
        if (buf[KVX_RB_HDR_LEN + i] < 0x21 || buf[KVX_RB_HDR_LEN + i] > 0x7e)
            return -EBADMSG;
    memset(rb, 0, sizeof(*rb));
    memcpy(rb->agent_name, buf + KVX_RB_HDR_LEN, name_len);
    rb->generation = kvx_get64(buf + 16);
    rb->id = kvx_get32(buf + 24);
    rb->access = access;
    rb->base = base;
    rb->len = rlen;
    memcpy(rb->capability, buf + 48, 16);
    rb->flags = flags;
    rb->mac = (flags & KVX_MDF_MAC) ? buf + KVX_RB_HDR_LEN + name_len : NULL;
    return 0;
}

int kvx_region_blob_verify(const void *data, size_t len, const kvx_region_blob_t *rb,
                           const uint8_t *secret, size_t secret_len)
{
    uint8_t mac[KVX_MAC_LEN];

    if (secret == NULL)
        return (rb->flags & KVX_MDF_MAC) ? -EACCES : 0;
    if (!(rb->flags & KVX_MDF_MAC) || len < KVX_RB_HDR_LEN + KVX_MAC_LEN)
        return -EACCES;
    kvx_rb_mac(data, len - KVX_MAC_LEN, secret, secret_len, mac);
    return kvx_equal_ct(mac, rb->mac, KVX_MAC_LEN) ? 0 : -EACCES;
}
