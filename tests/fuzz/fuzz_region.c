/*
 * libFuzzer harness for a peer's region blob (src/wire/region.c) before kvx_region_load uses it:
 * the strict decoder and the signature check. Build as the others (CC=clang, -DKVX_BUILD_FUZZ=ON).
 * Each input is tried as it is and with its checksum recomputed, so that the fuzzer reaches the
 * structure behind it. An accepted blob must be canonical: encoding what was decoded gives back
 * the same bytes.
 */
#include "kvx_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void check(const uint8_t *data, size_t size)
{
    static const uint8_t secret[] = "fuzz-secret";
    uint8_t again[KVX_REGION_BLOB_MAX];
    kvx_region_blob_t rb;

    if (kvx_region_blob_decode(data, size, &rb) < 0)
        return;
    /* what the decoder hands on is well formed and inside the input */
    if (rb.agent_name[0] == '\0' || strlen(rb.agent_name) > KVX_NAME_MAX || rb.id == 0 ||
        rb.access == 0 || (rb.access & ~(unsigned)(KVX_REGION_WRITE | KVX_REGION_READ)) ||
        rb.len == 0 || rb.base > UINT64_MAX - rb.len || size > KVX_REGION_BLOB_MAX ||
        ((rb.flags & KVX_MDF_MAC) && (rb.mac < data || rb.mac + KVX_MAC_LEN != data + size)))
        abort();
    if (!(rb.flags & KVX_MDF_MAC)) {
        if (kvx_region_blob_encode(&rb, NULL, 0, again, sizeof(again)) != (int)size ||
            memcmp(again, data, size) != 0 ||
            kvx_region_blob_verify(data, size, &rb, NULL, 0) != 0 ||
            kvx_region_blob_verify(data, size, &rb, secret, sizeof(secret)) != -EACCES)
            abort();
    } else if (kvx_region_blob_verify(data, size, &rb, secret, sizeof(secret)) == 0 &&
               (kvx_region_blob_encode(&rb, secret, sizeof(secret), again, sizeof(again)) !=
                    (int)size ||
                memcmp(again, data, size) != 0)) {
        abort();
    } else if (kvx_region_blob_verify(data, size, &rb, NULL, 0) != -EACCES) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t buf[1024];

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
