/*
 * Authentication with a shared secret: SHA-256 and HMAC-SHA256 through OpenSSL's libcrypto (EVP,
 * so that a configured provider, FIPS included, does the work), and a comparison in constant time.
 * kvx signs its metadata and its connection requests with them when the application configures a
 * secret (see docs/security.md); tests/test_vectors.c pins every byte.
 */
#include "base/kvx_base.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* Fetched once: EVP_MAC_fetch and EVP_MD_fetch look the algorithm up in the providers, which is
 * the slow part of a MAC over a few hundred bytes. */
static EVP_MAC *kvx_hmac_alg;
static EVP_MD *kvx_sha256_alg;
static pthread_once_t kvx_auth_once = PTHREAD_ONCE_INIT;

static void kvx_auth_fetch(void)
{
    kvx_hmac_alg = EVP_MAC_fetch(NULL, "HMAC", NULL);
    kvx_sha256_alg = EVP_MD_fetch(NULL, "SHA2-256", NULL);
    if (kvx_hmac_alg == NULL || kvx_sha256_alg == NULL)
        kvx_log(NULL, KVX_LOG_ERROR, "libcrypto has no %s: nothing signed or verified will match",
                kvx_hmac_alg == NULL ? "HMAC" : "SHA2-256");
}

/*
 * The callers take a digest as given, so a failure inside libcrypto (no provider, no memory) must
 * not leave a predictable value behind: the output becomes random bytes, which no peer's MAC and
 * no recomputation matches, so that everything signed or verified then fails closed.
 */
static void kvx_auth_fail(const char *what, uint8_t out[32])
{
    kvx_log(NULL, KVX_LOG_ERROR, "libcrypto: %s failed: the result will not verify", what);
    if (RAND_bytes(out, 32) == 1)
        return;
    if (getrandom(out, 32, 0) == 32)
        return;
    abort(); /* neither source of randomness works: nothing safe to return */
}

void kvx_sha256(const void *data, size_t len, uint8_t out[32])
{
    unsigned int n = 0;

    pthread_once(&kvx_auth_once, kvx_auth_fetch);
    if (kvx_sha256_alg == NULL || EVP_Digest(data, len, out, &n, kvx_sha256_alg, NULL) != 1 ||
        n != 32)
        kvx_auth_fail("SHA-256", out);
}

/* HMAC-SHA256 of the concatenation of the n parts. */
void kvx_hmac_sha256(const void *key, size_t key_len, const kvx_iov_t *parts, size_t n,
                     uint8_t out[32])
{
    static const uint8_t empty_key; /* libcrypto reads a NULL key as "keep the previous one" */
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                           OSSL_PARAM_construct_end()};
    EVP_MAC_CTX *ctx = NULL;
    size_t got = 0;
    bool ok;

    pthread_once(&kvx_auth_once, kvx_auth_fetch);
    ok = kvx_hmac_alg != NULL && (ctx = EVP_MAC_CTX_new(kvx_hmac_alg)) != NULL &&
         EVP_MAC_init(ctx, key_len > 0 ? key : &empty_key, key_len, params) == 1;
    for (size_t i = 0; ok && i < n; i++)
        ok = parts[i].len == 0 || EVP_MAC_update(ctx, parts[i].base, parts[i].len) == 1;
    ok = ok && EVP_MAC_final(ctx, out, &got, 32) == 1 && got == 32;
    EVP_MAC_CTX_free(ctx);
    if (!ok)
        kvx_auth_fail("HMAC-SHA256", out);
}

bool kvx_equal_ct(const void *a, const void *b, size_t len)
{
    return CRYPTO_memcmp(a, b, len) == 0;
}
