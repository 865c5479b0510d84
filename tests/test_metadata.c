/*
 * The metadata codec: a round trip, rejection of every truncation, of corruption anywhere, of
 * foreign and future blobs; and a blob whose size does not depend on the number of blocks.
 */
#include "harness.h"
#include "kvx_int.h"

#include <errno.h>
#include <string.h>

static void codec(void)
{
    uint8_t waddr[200], buf[512], copy[512];
    kvx_md_t in = {
        .agent_name = "engine-a",
        .fingerprint = "0123456789abcdef",
        .base = 0x7f0000000000ull,
        .num_blocks = 20000,
        .block_len = 65536,
        .worker_addr = waddr,
        .worker_addr_len = sizeof(waddr),
        .generation = 0x1234567890abcdefull,
        .capability = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
        .host = {.boot_id = {0xb0, 0x07}, .pid_ns = 4026531836ull, .start_time = 777, .pid = 4242}};
    kvx_md_t out;
    int len;

    for (size_t i = 0; i < sizeof(waddr); i++)
        waddr[i] = (uint8_t)(i * 7);
    len = kvx_md_encode(&in, NULL, 0, buf, sizeof(buf));
    KT_EQ(len, (int)kvx_md_encoded_len(&in));
    KT_ERR(kvx_md_encode(&in, NULL, 0, buf, (size_t)len - 1), -ENOSPC);

    KT_OK(kvx_md_decode(buf, (size_t)len, &out));
    KT_CHECK(strcmp(out.agent_name, "engine-a") == 0);
    KT_CHECK(strcmp(out.fingerprint, "0123456789abcdef") == 0);
    KT_EQ(out.base, in.base);
    KT_EQ(out.num_blocks, 20000);
    KT_EQ(out.block_len, 65536);
    KT_EQ(out.worker_addr_len, sizeof(waddr));
    KT_CHECK(memcmp(out.worker_addr, waddr, sizeof(waddr)) == 0);
    KT_EQ(out.flags, 0);
    KT_CHECK(out.mac == NULL);
    KT_EQ(out.generation, in.generation);
    KT_CHECK(memcmp(out.capability, in.capability, 16) == 0);
    KT_CHECK(memcmp(out.host.boot_id, in.host.boot_id, 16) == 0);
    KT_EQ(out.host.pid_ns, in.host.pid_ns);
    KT_EQ(out.host.start_time, 777);
    KT_EQ(out.host.pid, 4242);

    /* every truncation, and trailing garbage */
    for (int n = 0; n < len; n++)
        KT_ERR(kvx_md_decode(buf, (size_t)n, &out), -EBADMSG);
    memcpy(copy, buf, (size_t)len);
    copy[len] = 0;
    KT_ERR(kvx_md_decode(copy, (size_t)len + 1, &out), -EBADMSG);

    /* a flipped bit anywhere: the version field says "unknown version", everything else
     * "bad message" */
    for (int i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(copy, buf, (size_t)len);
            copy[i] ^= (uint8_t)(1u << bit);
            int want = (i == 4 || i == 5) ? -EPROTONOSUPPORT : -EBADMSG;
            int rc = kvx_md_decode(copy, (size_t)len, &out);
            if (rc != want)
                KT_FAIL("byte %d bit %d flipped: got %d (%s), want %d", i, bit, rc,
                        kvx_strerror(rc), want);
        }
    }

    /* a future format version is refused as such */
    memcpy(copy, buf, (size_t)len);
    copy[4] = KVX_MD_VERSION + 1;
    KT_ERR(kvx_md_decode(copy, (size_t)len, &out), -EPROTONOSUPPORT);
    /* foreign bytes (a NIXL-like blob) and NULL */
    KT_ERR(kvx_md_decode("nixl-agent-metadata....................................", 56, &out),
           -EBADMSG);
    KT_ERR(kvx_md_decode(NULL, 0, &out), -EBADMSG);

    /* fields that decode but make no sense are refused even with a valid checksum */
    kvx_md_t bad = in;
    bad.num_blocks = 0;
    len = kvx_md_encode(&bad, NULL, 0, buf, sizeof(buf));
    KT_ERR(kvx_md_decode(buf, (size_t)len, &out), -EBADMSG);
    bad = in;
    bad.num_blocks = UINT64_MAX / 2;
    len = kvx_md_encode(&bad, NULL, 0, buf, sizeof(buf));
    KT_ERR(kvx_md_decode(buf, (size_t)len, &out), -EBADMSG);
    bad = in;
    bad.num_blocks = (1ull << 32) + 5; /* beyond 32-bit block indices */
    bad.block_len = 64;
    len = kvx_md_encode(&bad, NULL, 0, buf, sizeof(buf));
    KT_ERR(kvx_md_decode(buf, (size_t)len, &out), -EBADMSG);
    bad = in;
    strcpy(bad.agent_name, "has space");
    len = kvx_md_encode(&bad, NULL, 0, buf, sizeof(buf));
    KT_ERR(kvx_md_decode(buf, (size_t)len, &out), -EBADMSG);
}

/* Signed with a shared secret: verified with it, refused with another or with none, and an
 * unsigned blob is refused where a secret is required. */
static void signature(void)
{
    static const uint8_t secret[] = "correct horse battery staple", other[] = "incorrect";
    uint8_t waddr[64], buf[512];
    kvx_md_t in = {.agent_name = "signer",
                   .base = 4096,
                   .num_blocks = 8,
                   .block_len = 4096,
                   .worker_addr = waddr,
                   .worker_addr_len = sizeof(waddr)},
             out;
    int len;

    memset(waddr, 0x5a, sizeof(waddr));
    len = kvx_md_encode(&in, secret, sizeof(secret), buf, sizeof(buf));
    KT_CHECK(len > 0);
    KT_OK(kvx_md_decode(buf, (size_t)len, &out));
    KT_EQ(out.flags, KVX_MDF_MAC);
    KT_OK(kvx_md_verify(buf, (size_t)len, &out, secret, sizeof(secret)));
    KT_ERR(kvx_md_verify(buf, (size_t)len, &out, other, sizeof(other)), -EACCES);
    KT_ERR(kvx_md_verify(buf, (size_t)len, &out, NULL, 0), -EACCES);
    /* a forged field with the crc recomputed still fails the signature */
    buf[24] ^= 1;
    memset(buf + 12, 0, 4);
    {
        uint32_t crc = kvx_crc32(buf, (size_t)len);
        for (int i = 0; i < 4; i++)
            buf[12 + i] = (uint8_t)(crc >> (8 * i));
    }
    KT_OK(kvx_md_decode(buf, (size_t)len, &out));
    KT_ERR(kvx_md_verify(buf, (size_t)len, &out, secret, sizeof(secret)), -EACCES);
    len = kvx_md_encode(&in, NULL, 0, buf, sizeof(buf));
    KT_OK(kvx_md_decode(buf, (size_t)len, &out));
    KT_ERR(kvx_md_verify(buf, (size_t)len, &out, secret, sizeof(secret)), -EACCES);
    KT_OK(kvx_md_verify(buf, (size_t)len, &out, NULL, 0));
}

/* The blob of a 16-block region and of a 1,048,576-block region have the same size. */
static void size_independent_of_blocks(void)
{
    kt_region_t small = kt_region_alloc(16, 64), big = kt_region_alloc(1048576, 64);
    kvx_transport_t *a = kt_transport(&small, "same-length-name-a", 0);
    kvx_transport_t *b = kt_transport(&big, "same-length-name-b", 0);
    size_t la, lb;
    uint8_t *ma = kt_metadata(a, &la), *mb = kt_metadata(b, &lb);
    kvx_md_t da, db;

    kt_log("metadata: %zu bytes for 16 blocks, %zu bytes for 1048576 blocks", la, lb);
    KT_EQ(la, lb);
    KT_CHECK(la < 4096);
    KT_OK(kvx_md_decode(ma, la, &da));
    KT_OK(kvx_md_decode(mb, lb, &db));
    KT_EQ(db.num_blocks, 1048576);
    KT_EQ(db.base, (uintptr_t)big.base);
    free(ma);
    free(mb);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    kt_region_free(&small);
    kt_region_free(&big);
}

int main(void)
{
    codec();
    signature();
    size_independent_of_blocks();
    return 0;
}
