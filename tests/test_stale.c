/*
 * -ESTALE refuses a stale copy of a peer's metadata, and nothing more (no secret here, so anyone
 * holding the metadata can edit its generation):
 *  - a blob of the live target with generation 2^64-1 is taken; the genuine blob is then refused
 *    -ESTALE while that connection is healthy (the documented refusal), but once the target
 *    died and the peer's connection failed, its successor's genuine blob is taken;
 *  - a blob one nanosecond older than the peer's healthy connection is refused -ESTALE;
 *  - a generation 2^64-1 blob of a target that does not answer (stopped) holds nothing: the
 *    genuine blob replaces it at once;
 * every transfer verified, byte for byte.
 */
#include "harness.h"
#include "kvx_int.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define BL 65536
#define NB 32

static kt_region_t r;

/* A copy of md whose generation is gen (crc fixed up: without a secret, that is all it takes). */
static uint8_t *forge(const uint8_t *md, size_t len, uint64_t gen)
{
    uint8_t *f = malloc(len);
    KT_CHECK(f != NULL);
    memcpy(f, md, len);
    kvx_put64(f + 40, gen);
    kvx_put32(f + 12, 0);
    kvx_put32(f + 12, kvx_crc32(f, len));
    return f;
}

static kvx_peer_attr_t query(kvx_transport_t *t)
{
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE | KVX_PEER_ATTR_GENERATION};
    KT_OK(kvx_peer_query(t, "p", &pa));
    return pa;
}

static void write_verified(kvx_transport_t *t, kt_target_t *tg, uint64_t round)
{
    uint32_t li[8], ri[8];
    kvx_completion_t c;
    uint64_t id;

    kt_indices(li, 8, NB, true, round);
    kt_indices(ri, 8, NB, true, round + 3);
    for (int i = 0; i < 8; i++)
        kt_fill(&r, li[i], 0x51, li[i], round);
    KT_OK(kvx_xfer_write(t, "p", li, ri, 8, NULL, &id));
    KT_EQ(kt_poll_n(t, "p", &c, 1, 10000), 1);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(tg, ri, li, 8, 0x51, round), 0);
}

int main(void)
{
    kt_target_args_t a = {.num_blocks = NB, .block_len = BL, .salt = 3, .threads = 1, .name = "A"};
    kvx_transport_t *t;
    kt_target_t tg;
    uint8_t *forged;
    kvx_md_t md;
    kvx_peer_attr_t pa;

    r = kt_region_alloc(NB, BL);
    t = kt_transport(&r, "initiator", 1);
    tg = kt_target_start(&a);

    /* the forged far-future generation of the live target: taken, the data path is the real one */
    forged = forge(tg.md, tg.md_len, UINT64_MAX);
    KT_OK(kvx_peer_add(t, "p", forged, tg.md_len, NULL));
    free(forged);
    KT_EQ((pa = query(t)).generation, UINT64_MAX);
    write_verified(t, &tg, 1);
    /* while that connection is healthy, the genuine (older) blob is refused, nothing changes */
    KT_ERR(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL), -ESTALE);
    KT_EQ((pa = query(t)).generation, UINT64_MAX);
    KT_EQ(pa.state, KVX_PEER_CONNECTED);

    /* the target dies, the connection fails: the id is not locked, its successor's blob goes in */
    kt_kill(&tg.proc, SIGKILL);
    KT_EQ(kt_wait(&tg.proc), 128 + SIGKILL);
    free(tg.md);
    for (uint64_t end = kt_now_ns() + 10000000000ull;
         query(t).state != KVX_PEER_FAILED && kt_now_ns() < end;)
        usleep(1000);
    KT_EQ(query(t).state, KVX_PEER_FAILED);
    tg = kt_target_start(&a);
    KT_OK(kvx_md_decode(tg.md, tg.md_len, &md));
    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    KT_EQ((pa = query(t)).generation, md.generation);
    KT_EQ(pa.state, KVX_PEER_CONNECTED);
    write_verified(t, &tg, 2);

    /* a copy one nanosecond older than that healthy connection: stale */
    forged = forge(tg.md, tg.md_len, md.generation - 1);
    KT_ERR(kvx_peer_add(t, "p", forged, tg.md_len, NULL), -ESTALE);
    free(forged);
    KT_EQ(query(t).generation, md.generation);

    /* a far-future blob whose connection never answers (the target stopped) holds nothing: the
     * genuine blob takes the id back at once, and transfers once the target runs again */
    kt_stop(&tg.proc);
    forged = forge(tg.md, tg.md_len, UINT64_MAX);
    KT_OK(kvx_peer_add(t, "p", forged, tg.md_len, NULL)); /* wire-up goes on in the background */
    free(forged);
    KT_EQ(query(t).generation, UINT64_MAX);
    KT_OK(kvx_peer_add(t, "p", tg.md, tg.md_len, NULL));
    KT_EQ(query(t).generation, md.generation);
    kt_cont(&tg.proc);
    write_verified(t, &tg, 3);

    kvx_transport_destroy(t);
    KT_EQ(kt_target_stop(&tg), 0);
    kt_region_free(&r);
    return 0;
}
