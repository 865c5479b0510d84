/*
 * libFuzzer harness for what kvx does with a peer's metadata before UCX sees any of it: the
 * decoder and the peer compatibility rules. Build with clang -fsanitize=fuzzer,address,undefined
 * (CMake: CC=clang, -DKVX_BUILD_FUZZ=ON). Each input is tried twice: as it is (the checksum must
 * hold), and with its checksum recomputed, so that the fuzzer reaches the structure behind it.
 * An accepted blob must be canonical: encoding what was decoded gives back the same bytes.
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void check(const uint8_t *data, size_t size)
{
    static kvx_core_t self = {
        .log.name = "fuzz-self", .fingerprint = "0123456789abcdef", .block_len = 65536};
    static uint8_t again[1 << 16];
    kvx_md_t md;
    kvx_peer_params_t expect = {.field_mask = KVX_PEER_PARAM_EXPECT_REGION};
    const char *why;
    int rc;

    rc = kvx_md_decode(data, size, &md);
    if (rc < 0)
        return;
    static const uint8_t secret[] = "fuzz-secret";
    /* what the decoder hands on stays inside the input and is well formed */
    if (md.worker_addr < data || md.worker_addr + md.worker_addr_len > data + size ||
        md.agent_name[0] == '\0' || strlen(md.agent_name) > KVX_NAME_MAX ||
        strlen(md.fingerprint) > KVX_FINGERPRINT_MAX || md.num_blocks == 0 ||
        md.num_blocks > UINT32_MAX || md.block_len == 0 ||
        ((md.flags & KVX_MDF_MAC) && (md.mac < data || md.mac + KVX_MAC_LEN != data + size)))
        abort();
    /* canonical: encoding what was decoded gives the same bytes (signed with the fuzzer's own
     * secret when the input carries a signature that secret verifies) */
    if (kvx_md_encoded_len(&md) != size || size > sizeof(again))
        abort();
    if (!(md.flags & KVX_MDF_MAC)) {
        if (kvx_md_encode(&md, NULL, 0, again, sizeof(again)) != (int)size ||
            memcmp(again, data, size) != 0 || kvx_md_verify(data, size, &md, NULL, 0) != 0 ||
            kvx_md_verify(data, size, &md, secret, sizeof(secret)) != -EACCES)
            abort();
    } else if (kvx_md_verify(data, size, &md, secret, sizeof(secret)) == 0 &&
               (kvx_md_encode(&md, secret, sizeof(secret), again, sizeof(again)) != (int)size ||
                memcmp(again, data, size) != 0)) {
        abort();
    }
    (void)kvx_peer_check(&self, &md, NULL, &why);
    expect.base_addr = md.base;
    expect.num_blocks = md.num_blocks;
    expect.block_len = md.block_len;
    rc = kvx_peer_check(&self, &md, &expect, &why);
    if (rc == -EINVAL) /* the region was given exactly as the metadata says */
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t buf[1 << 16];

    check(data, size);
    if (size >= 16 && size <= sizeof(buf)) {
        uint32_t crc;
        memcpy(buf, data, size);
        memset(buf + 12, 0, 4);
        crc = kvx_crc32(buf, size);
        for (int i = 0; i < 4; i++)
            buf[12 + i] = (uint8_t)(crc >> (8 * i));
        check(buf, size);
    }
    return 0;
}
