/*
 * The metadata blob a transport hands to its peers: encode and a strict decoder (the fuzz
 * target). Its size depends on the names and UCX addresses, never on the number of blocks.
 *
 * Layout, little-endian, format version 2:
 *    0  u32 magic "KVXM"         4  u16 version (2)      6  u16 header length (120)
 *    8  u32 total length        12  u32 crc32 of the blob with this field zeroed
 *   16  u64 base address        24  u64 number of blocks 32  u64 block length
 *   40  u64 generation (when the transport was created, ns since the epoch)
 *   48  u8[16] capability (random; reserved for peers that hold this blob)
 *   64  u8[16] host (the kernel's boot id; zero when unknown)
 *   80  u64 pid namespace       88  u64 process start time (clock ticks after boot)
 *   96  u32 pid                100  u32 flags (none defined: 0)
 *  104  u8  agent name length  105  u8  fingerprint length  106 u16 reserved (0)
 *  108  u32 worker address length  112 u32 remote key length  116 u32 reserved (0)
 *  120  agent name, fingerprint, worker address, remote key (no terminators, no padding)
 */
#include "kvx_int.h"

#include <errno.h>
#include <string.h>

#define KVX_MD_HDR_LEN 120u
/* UCX addresses are a few hundred bytes: refuse absurd sizes. */
#define KVX_MD_MAX_BLOB (1u << 20)

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t kvx_crc32_update(uint32_t crc, const uint8_t *p, size_t len)
{
    while (len--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
    }
    return crc;
}

uint32_t kvx_crc32(const void *buf, size_t len) { return ~kvx_crc32_update(~0u, buf, len); }

/* Agent names and fingerprints: printable ASCII without spaces. */
static bool kvx_md_text_ok(const uint8_t *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    return true;
}

size_t kvx_md_encoded_len(const kvx_md_t *md)
{
    return KVX_MD_HDR_LEN + strlen(md->agent_name) + strlen(md->fingerprint) + md->worker_addr_len +
           md->rkey_len;
}

int kvx_md_encode(const kvx_md_t *md, uint8_t *buf, size_t cap)
{
    size_t name_len = strlen(md->agent_name), fp_len = strlen(md->fingerprint);
    size_t len = kvx_md_encoded_len(md);
    uint8_t *p = buf + KVX_MD_HDR_LEN;

    if (len > cap || len > KVX_MD_MAX_BLOB || name_len > KVX_NAME_MAX ||
        fp_len > KVX_FINGERPRINT_MAX)
        return -ENOSPC;
    memset(buf, 0, KVX_MD_HDR_LEN);
    put32(buf, KVX_MD_MAGIC);
    put16(buf + 4, KVX_MD_VERSION);
    put16(buf + 6, KVX_MD_HDR_LEN);
    put32(buf + 8, (uint32_t)len);
    put64(buf + 16, md->base);
    put64(buf + 24, md->num_blocks);
    put64(buf + 32, md->block_len);
    put64(buf + 40, md->generation);
    memcpy(buf + 48, md->capability, 16);
    memcpy(buf + 64, md->host.boot_id, 16);
    put64(buf + 80, md->host.pid_ns);
    put64(buf + 88, md->host.start_time);
    put32(buf + 96, md->host.pid);
    put32(buf + 100, 0);
    buf[104] = (uint8_t)name_len;
    buf[105] = (uint8_t)fp_len;
    put32(buf + 108, md->worker_addr_len);
    put32(buf + 112, md->rkey_len);
    memcpy(p, md->agent_name, name_len);
    p += name_len;
    memcpy(p, md->fingerprint, fp_len);
    p += fp_len;
    memcpy(p, md->worker_addr, md->worker_addr_len);
    p += md->worker_addr_len;
    memcpy(p, md->rkey, md->rkey_len);
    put32(buf + 12, kvx_crc32(buf, len));
    return (int)len;
}

int kvx_md_decode(const void *data, size_t len, kvx_md_t *md)
{
    const uint8_t *buf = data;
    uint8_t hdr[KVX_MD_HDR_LEN];
    size_t name_len, fp_len, need;
    uint32_t waddr_len, rkey_len, crc;
    uint64_t base, num_blocks, block_len;

    if (buf == NULL || len < 8 || get32(buf) != KVX_MD_MAGIC)
        return -EBADMSG;
    if (get16(buf + 4) != KVX_MD_VERSION)
        return -EPROTONOSUPPORT;
    if (len < KVX_MD_HDR_LEN || get16(buf + 6) != KVX_MD_HDR_LEN || get32(buf + 8) != len ||
        len > KVX_MD_MAX_BLOB)
        return -EBADMSG;

    /* The crc covers the whole blob with its own field zeroed. */
    memcpy(hdr, buf, KVX_MD_HDR_LEN);
    put32(hdr + 12, 0);
    crc = ~kvx_crc32_update(kvx_crc32_update(~0u, hdr, KVX_MD_HDR_LEN), buf + KVX_MD_HDR_LEN,
                            len - KVX_MD_HDR_LEN);
    if (crc != get32(buf + 12))
        return -EBADMSG;

    base = get64(buf + 16);
    num_blocks = get64(buf + 24);
    block_len = get64(buf + 32);
    name_len = buf[104];
    fp_len = buf[105];
    waddr_len = get32(buf + 108);
    rkey_len = get32(buf + 112);
    if (get32(buf + 100) != 0 || get16(buf + 106) != 0 || get32(buf + 116) != 0 || name_len == 0 ||
        name_len > KVX_NAME_MAX || fp_len > KVX_FINGERPRINT_MAX || waddr_len == 0 || rkey_len == 0)
        return -EBADMSG;
    need = (size_t)KVX_MD_HDR_LEN + name_len + fp_len + (size_t)waddr_len + (size_t)rkey_len;
    if (need != len)
        return -EBADMSG;
    /* block indices are 32-bit: a larger region cannot be addressed (nor made by kvx) */
    if (num_blocks == 0 || num_blocks > UINT32_MAX || block_len == 0 ||
        num_blocks > UINT64_MAX / block_len || base > UINT64_MAX - num_blocks * block_len ||
        base == 0)
        return -EBADMSG;

    const uint8_t *p = buf + KVX_MD_HDR_LEN;
    if (!kvx_md_text_ok(p, name_len) || !kvx_md_text_ok(p + name_len, fp_len))
        return -EBADMSG;

    memcpy(md->agent_name, p, name_len);
    md->agent_name[name_len] = '\0';
    p += name_len;
    memcpy(md->fingerprint, p, fp_len);
    md->fingerprint[fp_len] = '\0';
    p += fp_len;
    md->worker_addr = p;
    md->worker_addr_len = waddr_len;
    p += waddr_len;
    md->rkey = p;
    md->rkey_len = rkey_len;
    md->base = base;
    md->num_blocks = num_blocks;
    md->block_len = block_len;
    md->generation = get64(buf + 40);
    memcpy(md->capability, buf + 48, 16);
    memcpy(md->host.boot_id, buf + 64, 16);
    md->host.pid_ns = get64(buf + 80);
    md->host.start_time = get64(buf + 88);
    md->host.pid = get32(buf + 96);
    return 0;
}
