/*
 * The metadata blob a transport hands to its peers: encode and a strict decoder (the fuzz
 * target). Its size depends on the names and UCX addresses, never on the number of blocks.
 *
 * Layout, little-endian, format version 3 (2 is the same bytes, from a kvx whose handshake
 * carries no rendezvous flag):
 *    0  u32 magic "KVXM"         4  u16 version (3)      6  u16 header length (120)
 *    8  u32 total length        12  u32 crc32 of the blob with this field zeroed
 *   16  u64 base address        24  u64 number of blocks 32  u64 block length
 *   40  u64 generation (when the transport was created, ns since the epoch)
 *   48  u8[16] capability (random; reserved for peers that hold this blob)
 *   64  u8[16] host (the kernel's boot id; zero when unknown)
 *   80  u64 pid namespace       88  u64 process start time (clock ticks after boot)
 *   96  u32 pid                100  u32 flags (KVX_MDF_MAC, or 0)
 *  104  u8  agent name length  105  u8  fingerprint length  106 u16 reserved (0)
 *  108  u32 worker address length  112 u32 region key length (0: the application's region)
 *  116  u32 reserved (0)
 *  120  agent name, fingerprint, worker address, region key (no terminators, no padding)
 *       [with KVX_MDF_MAC: HMAC-SHA256 of all that precedes, keyed with the shared secret, the
 *       crc field zeroed]
 * The capability is what a peer must present before the transport applies any of its data: only
 * those who hold the blob can write into (or read) the region. The region key (UCX's packed
 * key of a region kvx allocated, KVX_PARAM_OWN_REGION) lets a peer on this host map the region.
 */
#include "wire/kvx_wire.h"

#include <errno.h>
#include <string.h>

#define KVX_MD_HDR_LEN 120u
/* UCX addresses are a few hundred bytes: refuse absurd sizes. */
#define KVX_MD_MAX_BLOB (1u << 20)
/* UCX's packed keys are tens of bytes */
#define KVX_MD_MAX_RKEY 4096u

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
           md->rkey_len + ((md->flags & KVX_MDF_MAC) ? KVX_MAC_LEN : 0);
}

/* The MAC of a blob of len bytes (its trailer excluded), the crc field taken as zero. */
static void kvx_md_mac(const uint8_t *buf, size_t len, const uint8_t *secret, size_t secret_len,
                       uint8_t out[KVX_MAC_LEN])
{
    static const uint8_t zero[4];
    kvx_iov_t parts[3] = {{(void *)buf, 12}, {(void *)zero, 4}, {(void *)(buf + 16), len - 16}};
    kvx_hmac_sha256(secret, secret_len, parts, 3, out);
}

int kvx_md_encode(const kvx_md_t *in, const uint8_t *secret, size_t secret_len, uint8_t *buf,
                  size_t cap)
{
    kvx_md_t md = *in;
    size_t name_len = strlen(md.agent_name), fp_len = strlen(md.fingerprint), len;
    uint8_t *p = buf + KVX_MD_HDR_LEN;

    md.flags = secret != NULL ? KVX_MDF_MAC : 0;
    len = kvx_md_encoded_len(&md);
    if (len > cap || len > KVX_MD_MAX_BLOB || name_len > KVX_NAME_MAX ||
        fp_len > KVX_FINGERPRINT_MAX || md.rkey_len > KVX_MD_MAX_RKEY)
        return -ENOSPC;
    memset(buf, 0, KVX_MD_HDR_LEN);
    kvx_put32(buf, KVX_MD_MAGIC);
    kvx_put16(buf + 4, KVX_MD_VERSION);
    kvx_put16(buf + 6, KVX_MD_HDR_LEN);
    kvx_put32(buf + 8, (uint32_t)len);
    kvx_put64(buf + 16, md.base);
    kvx_put64(buf + 24, md.num_blocks);
    kvx_put64(buf + 32, md.block_len);
    kvx_put64(buf + 40, md.generation);
    memcpy(buf + 48, md.capability, 16);
    memcpy(buf + 64, md.host.boot_id, 16);
    kvx_put64(buf + 80, md.host.pid_ns);
    kvx_put64(buf + 88, md.host.start_time);
    kvx_put32(buf + 96, md.host.pid);
    kvx_put32(buf + 100, md.flags);
    buf[104] = (uint8_t)name_len;
    buf[105] = (uint8_t)fp_len;
    kvx_put32(buf + 108, md.worker_addr_len);
    kvx_put32(buf + 112, md.rkey_len);
    memcpy(p, md.agent_name, name_len);
    p += name_len;
    memcpy(p, md.fingerprint, fp_len);
    p += fp_len;
    memcpy(p, md.worker_addr, md.worker_addr_len);
    p += md.worker_addr_len;
    if (md.rkey_len > 0)
        memcpy(p, md.rkey, md.rkey_len);
    if (md.flags & KVX_MDF_MAC)
        kvx_md_mac(buf, len - KVX_MAC_LEN, secret, secret_len, buf + len - KVX_MAC_LEN);
    kvx_put32(buf + 12, kvx_crc32(buf, len));
    return (int)len;
}

int kvx_md_verify(const void *data, size_t len, const kvx_md_t *md, const uint8_t *secret,
                  size_t secret_len)
{
    uint8_t mac[KVX_MAC_LEN];

    if (secret == NULL)
        return (md->flags & KVX_MDF_MAC) ? -EACCES : 0; /* the peer wants a secret we lack */
    if (!(md->flags & KVX_MDF_MAC) || len < KVX_MD_HDR_LEN + KVX_MAC_LEN)
        return -EACCES;
    kvx_md_mac(data, len - KVX_MAC_LEN, secret, secret_len, mac);
    return kvx_equal_ct(mac, md->mac, KVX_MAC_LEN) ? 0 : -EACCES;
}

int kvx_md_decode(const void *data, size_t len, kvx_md_t *md)
{
    const uint8_t *buf = data;
    static const uint8_t zero[4];
    size_t name_len, fp_len, need;
    uint32_t waddr_len, rkey_len, flags, crc;
    uint64_t base, num_blocks, block_len;

    if (buf == NULL || len < 8 || kvx_get32(buf) != KVX_MD_MAGIC)
        return -EBADMSG;
    if (kvx_get16(buf + 4) != KVX_MD_VERSION)
        return -EPROTONOSUPPORT;
    if (len < KVX_MD_HDR_LEN || kvx_get16(buf + 6) != KVX_MD_HDR_LEN || kvx_get32(buf + 8) != len ||
        len > KVX_MD_MAX_BLOB)
        return -EBADMSG;

    /* The crc covers the whole blob with its own field zeroed. */
    {
        kvx_iov_t parts[3] = {{(void *)buf, 12}, {(void *)zero, 4}, {(void *)(buf + 16), len - 16}};
        crc = kvx_crc32_parts(parts, 3);
    }
    if (crc != kvx_get32(buf + 12))
        return -EBADMSG;

    base = kvx_get64(buf + 16);
    num_blocks = kvx_get64(buf + 24);
    block_len = kvx_get64(buf + 32);
    name_len = buf[104];
    fp_len = buf[105];
    waddr_len = kvx_get32(buf + 108);
    rkey_len = kvx_get32(buf + 112);
    flags = kvx_get32(buf + 100);
    if ((flags & ~KVX_MDF_MAC) != 0 || kvx_get16(buf + 106) != 0 || rkey_len > KVX_MD_MAX_RKEY ||
        kvx_get32(buf + 116) != 0 || name_len == 0 || name_len > KVX_NAME_MAX ||
        fp_len > KVX_FINGERPRINT_MAX || waddr_len == 0 || waddr_len > KVX_MD_MAX_BLOB)
        return -EBADMSG;
    need = (size_t)KVX_MD_HDR_LEN + name_len + fp_len + (size_t)waddr_len + rkey_len +
           ((flags & KVX_MDF_MAC) ? KVX_MAC_LEN : 0);
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
    md->rkey = rkey_len > 0 ? p : NULL;
    md->rkey_len = rkey_len;
    p += rkey_len;
    md->flags = flags;
    md->mac = (flags & KVX_MDF_MAC) ? p : NULL;
    md->base = base;
    md->num_blocks = num_blocks;
    md->block_len = block_len;
    md->generation = kvx_get64(buf + 40);
    memcpy(md->capability, buf + 48, 16);
    memcpy(md->host.boot_id, buf + 64, 16);
    md->host.pid_ns = kvx_get64(buf + 80);
    md->host.start_time = kvx_get64(buf + 88);
    md->host.pid = kvx_get32(buf + 96);
    return 0;
}
