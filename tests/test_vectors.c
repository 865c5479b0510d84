/*
 * Known answers for kvx's hashes and MACs, and metadata blobs made by an earlier kvx: SHA-256,
 * HMAC-SHA256 and CRC-32 against their standards' published vectors, then against outputs that
 * kvx's own implementation (before it moved to libcrypto and zlib) produced from fixed inputs, so
 * that every MAC stays byte for byte what peers running that version make. Those blobs are
 * format 2, which is refused by name now; made format 3 (the version field, then the CRC and MAC
 * again), they must be what this kvx encodes, byte for byte.
 *   test_vectors           check (the ctest test)
 *   test_vectors --print   write the current outputs as tests/vectors_md2.h (done once, on the
 *                          commit before the change; never regenerate it to make a test pass)
 */
#include "harness.h"
#include "kvx_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#if __has_include("vectors_md2.h")
#include "vectors_md2.h"
#define HAVE_VECTORS 1
#endif

/* ---- the standards' vectors ----------------------------------------------------------------- */

static void hex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            KT_FAIL("bad hex at %zu", i);
        out[i] = (uint8_t)v;
    }
}

static void expect32(const char *what, const uint8_t got[32], const char *want_hex)
{
    uint8_t want[32];
    hex(want_hex, want, 32);
    if (memcmp(got, want, 32) != 0) {
        char g[65];
        for (int i = 0; i < 32; i++)
            snprintf(g + 2 * i, 3, "%02x", got[i]);
        KT_FAIL("%s: got %s, want %s", what, g, want_hex);
    }
}

static void standards(void)
{
    uint8_t out[32], key[131], data[152];
    static uint8_t million[1000000];

    /* FIPS 180-4 examples (NIST CSRC "SHA256.pdf", "SHA2_Additional.pdf") */
    kvx_sha256("abc", 3, out);
    expect32("sha256(abc)", out,
             "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    kvx_sha256("", 0, out);
    expect32("sha256()", out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    kvx_sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, out);
    expect32("sha256(448 bits)", out,
             "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    memset(million, 'a', sizeof(million));
    kvx_sha256(million, sizeof(million), out);
    expect32("sha256(a x 10^6)", out,
             "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");

    /* RFC 4231 test cases 1, 2, 3, 4, 6, 7 (5 is truncated output) */
    struct {
        size_t key_len;
        uint8_t key_byte; /* 0: 0x01..0x19 (case 4); 0xff: "Jefe" (case 2) */
        const char *data;
        size_t data_len;
        uint8_t data_byte;
        const char *mac;
    } rfc[] = {
        {20, 0x0b, "Hi There", 8, 0,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {4, 0xff, "what do ya want for nothing?", 28, 0,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {20, 0xaa, NULL, 50, 0xdd,
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {25, 0, NULL, 50, 0xcd, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {131, 0xaa, "Test Using Larger Than Block-Size Key - Hash Key First", 54, 0,
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {131, 0xaa,
         "This is a test using a larger than block-size key and a larger than block-size "
         "data. The key needs to be hashed before being used by the HMAC algorithm.",
         152, 0, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t c = 0; c < sizeof(rfc) / sizeof(rfc[0]); c++) {
        for (size_t i = 0; i < rfc[c].key_len; i++)
            key[i] = rfc[c].key_byte ? rfc[c].key_byte : (uint8_t)(i + 1);
        if (rfc[c].key_byte == 0xff)
            memcpy(key, "Jefe", 4);
        if (rfc[c].data != NULL)
            memcpy(data, rfc[c].data, rfc[c].data_len);
        else
            memset(data, rfc[c].data_byte, rfc[c].data_len);
        /* in two parts, as kvx signs */
        kvx_iov_t parts[2] = {{data, rfc[c].data_len / 3},
                              {data + rfc[c].data_len / 3, rfc[c].data_len - rfc[c].data_len / 3}};
        char what[32];
        snprintf(what, sizeof(what), "RFC 4231 case %zu", c < 4 ? c + 1 : c + 2);
        kvx_hmac_sha256(key, rfc[c].key_len, parts, 2, out);
        expect32(what, out, rfc[c].mac);
    }

    /* CRC-32 (ISO-HDLC, zlib's): the catalogue's check value */
    KT_EQ(kvx_crc32("123456789", 9), 0xcbf43926u);
    KT_EQ(kvx_crc32("", 0), 0u);
    /* CRC-32C (Castagnoli, RFC 3720) */
    KT_EQ(kvx_crc32c("123456789", 9), 0xe3069283u);
}

/* ---- fixed inputs, outputs recorded from the earlier implementation ------------------------- */

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31 + seed * 7 + (i >> 8));
}

static const size_t sha_lens[] = {0, 1, 3, 55, 56, 63, 64, 65, 119, 128, 200, 1000, 4099};
static const size_t key_lens[] = {0, 1, 29, 63, 64, 65, 131, 200};
/* how a 300-byte message is cut into parts (an empty part included), as kvx's MACs are */
static const size_t cuts[][4] = {
    {300, 0, 0, 0}, {12, 4, 284, 0}, {0, 1, 63, 236}, {64, 64, 0, 172}};
static const size_t crc_lens[] = {0, 1, 7, 8, 9, 100, 1000, 65536};

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* The blobs: (0) unsigned, (1) signed with a 29-byte secret, (2) an owned region's key, signed
 * with a 65-byte secret, (3) the longest name and fingerprint, signed with a 1-byte secret. */
#define NBLOBS 4
static const uint8_t blob_secret[] = "correct horse battery staple"; /* 29 bytes, with the NUL */

static void blob_input(int k, kvx_md_t *md, uint8_t *waddr, uint8_t *rkey, const uint8_t **secret,
                       size_t *secret_len)
{
    static uint8_t long_secret[65], one = 0x42;

    memset(md, 0, sizeof(*md));
    pattern(waddr, 200, 3);
    pattern(rkey, 96, 5);
    pattern(long_secret, sizeof(long_secret), 9);
    strcpy(md->agent_name, "engine-a");
    strcpy(md->fingerprint, "0123456789abcdef");
    md->base = 0x7f0000000000ull;
    md->num_blocks = 20000;
    md->block_len = 65536;
    md->worker_addr = waddr;
    md->worker_addr_len = 200;
    md->generation = 0x1234567890abcdefull;
    for (int i = 0; i < 16; i++) {
        md->capability[i] = (uint8_t)(i + 1);
        md->host.boot_id[i] = (uint8_t)(0xb0 + i);
    }
    md->host.pid_ns = 4026531836ull;
    md->host.start_time = 777;
    md->host.pid = 4242;
    *secret = NULL;
    *secret_len = 0;
    switch (k) {
    case 1:
        *secret = blob_secret;
        *secret_len = sizeof(blob_secret);
        break;
    case 2:
        md->rkey = rkey;
        md->rkey_len = 96;
        *secret = long_secret;
        *secret_len = sizeof(long_secret);
        break;
    case 3:
        memset(md->agent_name, 'n', KVX_NAME_MAX);
        md->agent_name[KVX_NAME_MAX] = 0;
        memset(md->fingerprint, 'f', KVX_FINGERPRINT_MAX);
        md->fingerprint[KVX_FINGERPRINT_MAX] = 0;
        md->worker_addr_len = 17;
        *secret = &one;
        *secret_len = 1;
        break;
    }
}

static void hmac_of(size_t key_len, size_t cut, uint8_t out[32])
{
    uint8_t key[200], msg[300];
    kvx_iov_t parts[4];
    size_t off = 0, n = 0;

    pattern(key, key_len, 1);
    pattern(msg, sizeof(msg), 2);
    for (int i = 0; i < 4 && off < sizeof(msg); i++) {
        parts[n].base = msg + off;
        parts[n].len = cuts[cut][i];
        off += cuts[cut][i];
        n++;
    }
    kvx_hmac_sha256(key, key_len, parts, n, out);
}

static uint32_t crc_parts_of(size_t len)
{
    static uint8_t buf[65536];
    pattern(buf, len, 4);
    kvx_iov_t parts[3] = {{buf, len / 4}, {buf + len / 4, 0}, {buf + len / 4, len - len / 4}};
    return kvx_crc32_parts(parts, 3);
}

static void print_bytes(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%s0x%02x,", i % 12 == 0 ? "\n    " : " ", p[i]);
    printf("\n");
}

static int print_vectors(void)
{
    static uint8_t buf[65536];
    uint8_t out[32], waddr[200], rkey[96], blob[2048];

    printf("/* Made by `test_vectors --print` with kvx's own SHA-256, HMAC and CRC-32 "
           "(before libcrypto\n * and zlib), from the inputs in test_vectors.c. "
           "Do not regenerate. */\n");
    printf("static const uint8_t vec_sha256[%zu][32] = {", N(sha_lens));
    for (size_t i = 0; i < N(sha_lens); i++) {
        pattern(buf, sha_lens[i], 0);
        kvx_sha256(buf, sha_lens[i], out);
        printf("{");
        print_bytes(out, 32);
        printf("},");
    }
    printf("};\nstatic const uint8_t vec_hmac[%zu][%zu][32] = {", N(key_lens), N(cuts));
    for (size_t k = 0; k < N(key_lens); k++) {
        printf("{");
        for (size_t c = 0; c < N(cuts); c++) {
            hmac_of(key_lens[k], c, out);
            printf("{");
            print_bytes(out, 32);
            printf("},");
        }
        printf("},");
    }
    printf("};\nstatic const uint32_t vec_crc32[%zu][2] = {\n", N(crc_lens));
    for (size_t i = 0; i < N(crc_lens); i++) {
        pattern(buf, crc_lens[i], 4);
        printf("    {0x%08xu, 0x%08xu},\n", kvx_crc32(buf, crc_lens[i]), crc_parts_of(crc_lens[i]));
    }
    printf("};\n");
    for (int k = 0; k < NBLOBS; k++) {
        kvx_md_t md;
        const uint8_t *secret;
        size_t secret_len;
        blob_input(k, &md, waddr, rkey, &secret, &secret_len);
        int len = kvx_md_encode(&md, secret, secret_len, blob, sizeof(blob));
        if (len < 0)
            KT_FAIL("encode %d: %d", k, len);
        printf("static const uint8_t vec_blob%d[%d] = {", k, len);
        print_bytes(blob, (size_t)len);
        printf("};\n");
    }
    printf("static const uint8_t *const vec_blobs[%d] = {vec_blob0, vec_blob1, vec_blob2, "
           "vec_blob3};\n",
           NBLOBS);
    printf("static const size_t vec_blob_lens[%d] = {sizeof(vec_blob0), sizeof(vec_blob1), "
           "sizeof(vec_blob2), sizeof(vec_blob3)};\n",
           NBLOBS);
    return 0;
}

#ifdef HAVE_VECTORS
static void recorded(void)
{
    static uint8_t buf[65536];
    static const uint8_t zero4[4];
    uint8_t out[32], waddr[200], rkey[96], blob[2048], v3[2048];

    for (size_t i = 0; i < N(sha_lens); i++) {
        pattern(buf, sha_lens[i], 0);
        kvx_sha256(buf, sha_lens[i], out);
        if (memcmp(out, vec_sha256[i], 32) != 0)
            KT_FAIL("sha256 of %zu bytes differs from the recorded digest", sha_lens[i]);
    }
    for (size_t k = 0; k < N(key_lens); k++)
        for (size_t c = 0; c < N(cuts); c++) {
            hmac_of(key_lens[k], c, out);
            if (memcmp(out, vec_hmac[k][c], 32) != 0)
                KT_FAIL("hmac, %zu-byte key, cut %zu: differs from the recorded MAC", key_lens[k],
                        c);
        }
    for (size_t i = 0; i < N(crc_lens); i++) {
        pattern(buf, crc_lens[i], 4);
        KT_EQ(kvx_crc32(buf, crc_lens[i]), vec_crc32[i][0]);
        KT_EQ(crc_parts_of(crc_lens[i]), vec_crc32[i][1]);
    }
    for (int k = 0; k < NBLOBS; k++) {
        kvx_md_t md, dec;
        const uint8_t *secret;
        size_t secret_len;
        blob_input(k, &md, waddr, rkey, &secret, &secret_len);
        /* a recorded blob is format 2: refused by name (a kvx of format 3 says in its
         * handshake which payload paths it takes, which format 2's decoder refuses) */
        KT_ERR(kvx_md_decode(vec_blobs[k], vec_blob_lens[k], &dec), -EPROTONOSUPPORT);
        /* formats 3 and 4 (wire 3: regions) are format 2's bytes with their version: the
         * recorded blob, so changed and its CRC (and, signed, its MAC) made again, decodes to
         * its inputs and verifies with its secret, and encoding the same inputs now gives those
         * bytes */
        memcpy(v3, vec_blobs[k], vec_blob_lens[k]);
        kvx_put16(v3 + 4, KVX_MD_VERSION);
        if (secret != NULL) {
            size_t body = vec_blob_lens[k] - KVX_MAC_LEN;
            kvx_iov_t parts[3] = {{v3, 12}, {(void *)zero4, 4}, {v3 + 16, body - 16}};
            kvx_hmac_sha256(secret, secret_len, parts, 3, v3 + body);
        }
        {
            kvx_iov_t parts[3] = {{v3, 12}, {(void *)zero4, 4}, {v3 + 16, vec_blob_lens[k] - 16}};
            kvx_put32(v3 + 12, kvx_crc32_parts(parts, 3));
        }
        KT_OK(kvx_md_decode(v3, vec_blob_lens[k], &dec));
        KT_CHECK(strcmp(dec.agent_name, md.agent_name) == 0);
        KT_CHECK(strcmp(dec.fingerprint, md.fingerprint) == 0);
        KT_EQ(dec.base, md.base);
        KT_EQ(dec.num_blocks, md.num_blocks);
        KT_EQ(dec.generation, md.generation);
        KT_EQ(dec.worker_addr_len, md.worker_addr_len);
        KT_CHECK(memcmp(dec.worker_addr, md.worker_addr, md.worker_addr_len) == 0);
        KT_EQ(dec.rkey_len, md.rkey_len);
        KT_EQ(dec.flags, secret != NULL ? KVX_MDF_MAC : 0u);
        KT_OK(kvx_md_verify(v3, vec_blob_lens[k], &dec, secret, secret_len));
        if (secret != NULL) {
            static const uint8_t wrong[] = "correct horse battery stapl3";
            KT_ERR(kvx_md_verify(v3, vec_blob_lens[k], &dec, wrong, sizeof(wrong)), -EACCES);
        }
        int len = kvx_md_encode(&md, secret, secret_len, blob, sizeof(blob));
        KT_EQ(len, (int)vec_blob_lens[k]);
        if (memcmp(blob, v3, (size_t)len) != 0)
            KT_FAIL("blob %d encodes differently from the recorded one made format 3", k);
    }
    kt_log("recorded vectors: %zu digests, %zu MACs, %zu CRCs, %d blobs: identical", N(sha_lens),
           N(key_lens) * N(cuts), 2 * N(crc_lens), NBLOBS);
}
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--print") == 0)
        return print_vectors();
    standards();
#ifdef HAVE_VECTORS
    recorded();
    return 0;
#else
    KT_FAIL("tests/vectors_md2.h is missing");
#endif
}
