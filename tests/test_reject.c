/*
 * Every rejection of the API returns its error and leaves the transport as it was: the good
 * peer keeps working (a write to it is verified after each rejection), nothing is added, no
 * completion appears. Calls after close return -ESHUTDOWN.
 */
#include "harness.h"

#include <errno.h>
#include <string.h>

#define BL 65536
#define NB 64

static kt_region_t r;
static kvx_transport_t *t;
static kt_target_t good, older; /* older: started first, an older generation */
static uint64_t round_no;

/* The transport still has exactly `peers` peers, and a write to "p" lands intact. */
static void unchanged(size_t peers)
{
    kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_NUM_PEERS};
    kvx_completion_t c[4];
    uint32_t li[3] = {1, 2, 9}, ri[3] = {5, 6, 40};
    uint64_t id;

    KT_OK(kvx_transport_query(t, &ta));
    KT_EQ(ta.num_peers, peers);
    KT_EQ(kvx_transport_poll(t, NULL, c, 4), 0); /* no stray completion */
    round_no++;
    for (int i = 0; i < 3; i++)
        kt_fill(&r, li[i], 0x44, li[i], round_no);
    KT_OK(kvx_xfer_write(t, "p", li, ri, 3, NULL, &id));
    KT_EQ(kt_poll_n(t, "p", c, 1, 5000), 1);
    KT_EQ(c[0].id, id);
    KT_EQ(c[0].status, 0);
    KT_EQ(kt_target_verify(&good, ri, li, 3, 0x44, round_no), 0);
}

static void create_rejections(void)
{
    kvx_transport_t *x = NULL;
    const char *ucx_only[] = {"UCX"}, *unknown[] = {"ucx", "gds"};
    char long_name[KVX_NAME_MAX + 2], long_fp[KVX_FINGERPRINT_MAX + 2];
    kvx_params_t ok = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS,
                       .base = r.base,
                       .num_blocks = NB,
                       .block_len = BL,
                       .num_threads = 0};
    kvx_params_t p;

    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    memset(long_fp, 'f', sizeof(long_fp) - 1);
    long_fp[sizeof(long_fp) - 1] = '\0';

    KT_ERR(kvx_transport_create(NULL, &x), -EINVAL);
    KT_ERR(kvx_transport_create(&ok, NULL), -EINVAL);
#define REJECT(field_changes)                                                                      \
    do {                                                                                           \
        p = ok;                                                                                    \
        field_changes;                                                                             \
        KT_ERR(kvx_transport_create(&p, &x), -EINVAL);                                             \
        KT_CHECK(x == NULL);                                                                       \
    } while (0)
    REJECT(p.field_mask = 0);
    REJECT(p.base = NULL);
    REJECT(p.num_blocks = 0);
    REJECT(p.block_len = 0);
    REJECT(p.num_blocks = UINT64_MAX / 2; p.block_len = 4);          /* size overflows */
    REJECT(p.base = (void *)(UINTPTR_MAX - 4096); p.num_blocks = 2); /* wraps the address space */
    REJECT(p.num_blocks = (1ull << 32) + 1; p.block_len = 1);        /* indices are 32-bit */
    REJECT(p.field_mask |= KVX_PARAM_AGENT_NAME; p.agent_name = "");
    REJECT(p.field_mask |= KVX_PARAM_AGENT_NAME; p.agent_name = "has space");
    REJECT(p.field_mask |= KVX_PARAM_AGENT_NAME; p.agent_name = long_name);
    REJECT(p.field_mask |= KVX_PARAM_AGENT_NAME; p.agent_name = NULL);
    REJECT(p.field_mask |= KVX_PARAM_FINGERPRINT; p.fingerprint = long_fp);
    REJECT(p.field_mask |= KVX_PARAM_BACKENDS; p.backends = unknown; p.num_backends = 2);
    REJECT(p.field_mask |= KVX_PARAM_BACKENDS; p.backends = ucx_only; p.num_backends = 0);
    REJECT(p.field_mask |= KVX_PARAM_LOG; p.log_level = 9);
    /* an owned region: kvx allocates it, so a base is a contradiction, and the size rules hold */
    REJECT(p.field_mask |= KVX_PARAM_OWN_REGION);
    REJECT(p.field_mask |= KVX_PARAM_OWN_REGION; p.base = NULL; p.num_blocks = 0);
    REJECT(p.field_mask |= KVX_PARAM_OWN_REGION; p.base = NULL; p.block_len = 0);
    REJECT(p.field_mask |= KVX_PARAM_OWN_REGION; p.base = NULL; p.num_blocks = UINT64_MAX / 2;
           p.block_len = 4);
    REJECT(p.field_mask |= KVX_PARAM_OWN_REGION; p.base = NULL; p.num_blocks = (1ull << 32) + 1;
           p.block_len = 1);
    REJECT(p.field_mask |= KVX_PARAM_OWN_REGION; p.base = NULL; p.field_mask |= KVX_PARAM_LOG;
           p.log_level = 9);
    /* durations: in ns they would overflow (0.1 took UINT64_MAX / 10^6 + 3 ms for 2 ms) */
    REJECT(p.field_mask |= KVX_PARAM_DEADLINE; p.deadline_ms = UINT64_MAX / 1000000 + 3);
    REJECT(p.field_mask |= KVX_PARAM_DEADLINE; p.deadline_ms = UINT64_MAX / 1000000 + 1);
    REJECT(p.field_mask |= KVX_PARAM_DEADLINE; p.deadline_ms = KVX_MS_MAX + 1);
    REJECT(p.field_mask |= KVX_PARAM_DEADLINE; p.deadline_ms = UINT64_MAX);
    REJECT(p.field_mask |= KVX_PARAM_KEEPALIVE; p.keepalive_ms = KVX_MS_MAX + 1);
    REJECT(p.field_mask |= KVX_PARAM_STALL; p.stall_ms = UINT64_MAX / 1000000 + 3);
    /* the receiving side's parameters */
    {
        static const uint8_t key[KVX_SECRET_MAX + 1] = {1};
        REJECT(p.field_mask |= KVX_PARAM_SECRET; p.secret = NULL; p.secret_len = 8);
        REJECT(p.field_mask |= KVX_PARAM_SECRET; p.secret = key; p.secret_len = 0);
        REJECT(p.field_mask |= KVX_PARAM_SECRET; p.secret = key; p.secret_len = sizeof(key));
    }
    REJECT(p.field_mask |= KVX_PARAM_NET_DEVICES; p.net_devices = NULL);
    REJECT(p.field_mask |= KVX_PARAM_NET_DEVICES; p.net_devices = "");
    REJECT(p.field_mask |= KVX_PARAM_NET_DEVICES; p.net_devices = "lo eth0");
    REJECT(p.field_mask |= KVX_PARAM_NOTICES; p.notice_queue = 0);
    REJECT(p.field_mask |= KVX_PARAM_NOTICES; p.notice_queue = KVX_NOTICES_MAX + 1);
    /* how data travels: a mode kvx does not know, a threshold past a run's 32-bit length */
    REJECT(p.field_mask |= KVX_PARAM_RNDV; p.rndv_mode = -1);
    REJECT(p.field_mask |= KVX_PARAM_RNDV; p.rndv_mode = KVX_RNDV_ALWAYS + 1);
    REJECT(p.field_mask |= KVX_PARAM_RNDV; p.rndv_mode = KVX_RNDV_AUTO;
           p.rndv_thresh = (uint64_t)UINT32_MAX + 1);
#undef REJECT
    /* the largest durations accepted are kept exactly */
    {
        kvx_transport_attr_t ta = {.field_mask =
                                       KVX_TRANSPORT_ATTR_DEADLINE | KVX_TRANSPORT_ATTR_STALL};
        p = ok;
        p.field_mask |= KVX_PARAM_DEADLINE | KVX_PARAM_STALL;
        p.deadline_ms = KVX_MS_MAX;
        p.stall_ms = KVX_MS_MAX;
        KT_OK(kvx_transport_create(&p, &x));
        KT_OK(kvx_transport_query(x, &ta));
        KT_EQ(ta.deadline_ms, KVX_MS_MAX);
        KT_EQ(ta.stall_ms, KVX_MS_MAX);
        kvx_transport_destroy(x);
        x = NULL;
    }
    /* no alignment is required of the region */
    p = ok;
    p.base = r.base + 3;
    p.num_blocks = NB - 1;
    KT_OK(kvx_transport_create(&p, &x));
    kvx_transport_destroy(x);
    x = NULL;
    /* UCX cannot start (no usable transport): -ENODEV, nothing created */
    setenv("UCX_TLS", "no-such-transport", 1);
    KT_ERR(kvx_transport_create(&ok, &x), -ENODEV);
    KT_CHECK(x == NULL);
    unsetenv("UCX_TLS");
    /* the NIXL transport's spelling of the backend is accepted */
    p = ok;
    p.field_mask |= KVX_PARAM_BACKENDS;
    p.backends = ucx_only;
    p.num_backends = 1;
    KT_OK(kvx_transport_create(&p, &x));
    kvx_transport_destroy(x);
}

/* With a shared secret: metadata not signed with it, or signed when we have none, is refused
 * with -EACCES and nothing changes; the same secret on both sides connects. */
static void secret_rejections(void)
{
    static const uint8_t k1[] = "the-right-key", k2[] = "another-key";
    kvx_transport_t *s1, *s2, *plain;
    uint8_t *md1, *md_plain;
    size_t md1_len, md_plain_len;
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_SECRET |
                                    KVX_PARAM_NUM_THREADS,
                      .base = r.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .num_threads = 1};

    p.agent_name = "signed-1";
    p.secret = k1;
    p.secret_len = sizeof(k1);
    KT_OK(kvx_transport_create(&p, &s1));
    p.agent_name = "signed-2";
    p.secret = k2;
    p.secret_len = sizeof(k2);
    KT_OK(kvx_transport_create(&p, &s2));
    p.field_mask &= ~KVX_PARAM_SECRET;
    p.agent_name = "unsigned";
    KT_OK(kvx_transport_create(&p, &plain));
    md1 = kt_metadata(s1, &md1_len);
    md_plain = kt_metadata(plain, &md_plain_len);

    KT_ERR(kvx_peer_add(s2, "x", md1, md1_len, NULL), -EACCES);           /* another key */
    KT_ERR(kvx_peer_add(plain, "x", md1, md1_len, NULL), -EACCES);        /* we have none */
    KT_ERR(kvx_peer_add(s1, "x", md_plain, md_plain_len, NULL), -EACCES); /* unsigned */
    KT_ERR(kvx_peer_query(s2, "x", &pa), -ENOENT);
    KT_ERR(kvx_peer_query(plain, "x", &pa), -ENOENT);
    KT_ERR(kvx_peer_query(s1, "x", &pa), -ENOENT);
    md1[md1_len - 1] ^= 1; /* a signature one bit off: the checksum sees it first (with the
                            * checksum recomputed, the signature: test_metadata.c) */
    p.field_mask |= KVX_PARAM_SECRET;
    p.agent_name = "signed-3";
    p.secret = k1;
    p.secret_len = sizeof(k1);
    {
        kvx_transport_t *s3;
        KT_OK(kvx_transport_create(&p, &s3));
        KT_ERR(kvx_peer_add(s3, "x", md1, md1_len, NULL), -EBADMSG);
        md1[md1_len - 1] ^= 1;
        KT_OK(kvx_peer_add(s3, "x", md1, md1_len, NULL)); /* the same key: connected */
        kvx_transport_destroy(s3);
    }
    free(md1);
    free(md_plain);
    kvx_transport_destroy(plain);
    kvx_transport_destroy(s2);
    kvx_transport_destroy(s1);
}

static void peer_rejections(kt_target_t *badlen, kt_target_t *badfp, kt_target_t *nofp)
{
    size_t own_len, n;
    uint8_t *own = kt_metadata(t, &own_len), *md = malloc(good.md_len);
    char long_id[KVX_PEER_ID_MAX + 2];
    kvx_peer_params_t ex = {.field_mask = KVX_PEER_PARAM_EXPECT_REGION};
    memset(long_id, 'i', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';

    /* metadata export: too small a buffer says how much is needed */
    n = 10;
    KT_ERR(kvx_transport_metadata(t, md, &n), -ENOSPC);
    KT_EQ(n, own_len);
    KT_ERR(kvx_transport_metadata(t, md, NULL), -EINVAL);

    KT_ERR(kvx_peer_add(t, "x", badlen->md, badlen->md_len, NULL), -KVX_EINCOMPAT);
    unchanged(1);
    KT_ERR(kvx_peer_add(t, "x", badfp->md, badfp->md_len, NULL), -KVX_EINCOMPAT);
    unchanged(1);
    KT_ERR(kvx_peer_add(t, "x", own, own_len, NULL), -EEXIST);
    unchanged(1);
    KT_ERR(kvx_peer_add(t, "x", good.md, good.md_len - 1, NULL), -EBADMSG);
    KT_ERR(kvx_peer_add(t, "x", good.md, 20, NULL), -EBADMSG);
    KT_ERR(kvx_peer_add(t, "x", "not kvx metadata at all", 23, NULL), -EBADMSG);
    memcpy(md, good.md, good.md_len);
    md[good.md_len / 2] ^= 0x40; /* corrupted inside the UCX address: the checksum catches it */
    KT_ERR(kvx_peer_add(t, "x", md, good.md_len, NULL), -EBADMSG);
    memcpy(md, good.md, good.md_len);
    md[4] = 9; /* a format version from the future */
    KT_ERR(kvx_peer_add(t, "x", md, good.md_len, NULL), -EPROTONOSUPPORT);
    unchanged(1);

    /* explicit arguments that disagree with the metadata */
    ex.num_blocks = NB;
    ex.block_len = BL;
    ex.base_addr = 0;
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_REGION};
        KT_OK(kvx_peer_query(t, "p", &pa));
        ex.base_addr = pa.remote_base;
    }
    ex.base_addr++;
    KT_ERR(kvx_peer_add(t, "x", good.md, good.md_len, &ex), -EINVAL);
    ex.base_addr--;
    ex.num_blocks++;
    KT_ERR(kvx_peer_add(t, "x", good.md, good.md_len, &ex), -EINVAL);
    ex.num_blocks--;
    ex.block_len = 4096;
    KT_ERR(kvx_peer_add(t, "x", good.md, good.md_len, &ex), -EINVAL);
    ex.block_len = BL;
    unchanged(1);

    /* bad ids and pointers */
    KT_ERR(kvx_peer_add(t, NULL, good.md, good.md_len, NULL), -EINVAL);
    KT_ERR(kvx_peer_add(t, "", good.md, good.md_len, NULL), -EINVAL);
    KT_ERR(kvx_peer_add(t, long_id, good.md, good.md_len, NULL), -EINVAL);
    KT_ERR(kvx_peer_add(t, "x", NULL, 10, NULL), -EINVAL);
    KT_ERR(kvx_peer_add(NULL, "x", good.md, good.md_len, NULL), -EINVAL);
    unchanged(1);

    /* peer events: bad buffers are refused; a peer added from a blob has none */
    {
        kvx_peer_event_t ev;
        KT_ERR(kvx_peer_event_poll(NULL, &ev, 1), -EINVAL);
        KT_ERR(kvx_peer_event_poll(t, NULL, 1), -EINVAL);
        KT_EQ(kvx_peer_event_poll(t, NULL, 0), 0);
        KT_EQ(kvx_peer_event_poll(t, &ev, 1), 0);
    }
    unchanged(1);

    /* a rejected re-add of an existing id leaves its connection alone */
    KT_ERR(kvx_peer_add(t, "p", badlen->md, badlen->md_len, NULL), -KVX_EINCOMPAT);
    unchanged(1);
    KT_ERR(kvx_peer_add(t, "p", own, own_len, NULL), -EEXIST);
    unchanged(1);
    KT_ERR(kvx_peer_add(t, "p", good.md, good.md_len - 3, NULL), -EBADMSG);
    unchanged(1);

    /* metadata older than the peer's (a stale copy, as of a process since restarted) is
     * refused for that id, and the peer keeps its connection; any other id takes it, and the
     * peer's own metadata again (the same generation) is a re-add */
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_GENERATION | KVX_PEER_ATTR_AGENT_NAME};
        uint64_t gen;

        KT_OK(kvx_peer_query(t, "p", &pa));
        gen = pa.generation;
        KT_CHECK(gen > 0);
        KT_ERR(kvx_peer_add(t, "p", older.md, older.md_len, NULL), -ESTALE);
        unchanged(1);
        KT_OK(kvx_peer_query(t, "p", &pa));
        KT_EQ(pa.generation, gen);
        KT_CHECK(strcmp(pa.agent_name, "good") == 0);
        KT_OK(kvx_peer_add(t, "o", older.md, older.md_len, NULL));
        KT_OK(kvx_peer_query(t, "o", &pa));
        KT_CHECK(pa.generation > 0 && pa.generation < gen);
        KT_EQ(kvx_peer_remove(t, "o"), 1);
        KT_OK(kvx_peer_add(t, "p", good.md, good.md_len, NULL));
        KT_OK(kvx_peer_query(t, "p", &pa));
        KT_EQ(pa.generation, gen);
        unchanged(1);
    }

    /* accepted: an empty fingerprint pairs with anyone; matching explicit arguments */
    KT_OK(kvx_peer_add(t, "q", nofp->md, nofp->md_len, NULL));
    unchanged(2);
    KT_EQ(kvx_peer_remove(t, "q"), 1);
    KT_OK(kvx_peer_add(t, "p2", good.md, good.md_len, &ex));
    unchanged(2);
    KT_EQ(kvx_peer_remove(t, "p2"), 1);
    KT_EQ(kvx_peer_remove(t, "never-added"), 0);
    KT_ERR(kvx_peer_remove(t, NULL), -EINVAL);
    unchanged(1);
    free(own);
    free(md);
}

static void xfer_rejections(void)
{
    uint32_t ok_i[2] = {0, 1}, bad_l[2] = {0, NB}, big[2] = {0, UINT32_MAX};
    uint64_t id = 777;
    kvx_completion_t c[4];
    kvx_peer_attr_t before = {.field_mask = KVX_PEER_ATTR_COUNTERS}, after = before;

    KT_OK(kvx_peer_query(t, "p", &before));
    KT_ERR(kvx_xfer_write(t, "nobody", ok_i, ok_i, 2, NULL, &id), -ENOENT);
    KT_ERR(kvx_xfer_write(t, "p", bad_l, ok_i, 2, NULL, &id), -EINVAL); /* local out of range */
    KT_ERR(kvx_xfer_write(t, "p", ok_i, bad_l, 2, NULL, &id), -EINVAL); /* remote out of range */
    KT_ERR(kvx_xfer_write(t, "p", big, ok_i, 2, NULL, &id), -EINVAL);
    KT_ERR(kvx_xfer_read(t, "p", ok_i, big, 2, NULL, &id), -EINVAL);
    KT_ERR(kvx_xfer_write(t, "p", NULL, ok_i, 2, NULL, &id), -EINVAL);
    KT_ERR(kvx_xfer_write(t, "p", ok_i, NULL, 2, NULL, &id), -EINVAL);
    KT_ERR(kvx_xfer_write(t, "p", ok_i, ok_i, 2, NULL, NULL), -EINVAL);
    KT_ERR(kvx_xfer_write(t, NULL, ok_i, ok_i, 2, NULL, &id), -EINVAL);
    KT_ERR(kvx_xfer_write(NULL, "p", ok_i, ok_i, 2, NULL, &id), -EINVAL);
    {
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_DEADLINE,
                                .deadline_ms = UINT64_MAX / 1000000 + 3};
        KT_ERR(kvx_xfer_write(t, "p", ok_i, ok_i, 2, &xp, &id), -EINVAL);
        xp.deadline_ms = KVX_MS_MAX + 1;
        KT_ERR(kvx_xfer_read(t, "p", ok_i, ok_i, 2, &xp, &id), -EINVAL);
    }
    {
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_FLAGS, .flags = 0x80};
        KT_ERR(kvx_xfer_write(t, "p", ok_i, ok_i, 2, &xp, &id), -EINVAL); /* unknown flag */
        xp.flags = KVX_XFER_NOTIFY;
        KT_ERR(kvx_xfer_read(t, "p", ok_i, ok_i, 2, &xp, &id), -EINVAL); /* notices: writes */
    }
    KT_EQ(id, 777); /* out-parameters are written only on success */
    KT_OK(kvx_peer_query(t, "p", &after));
    KT_EQ(after.xfers_done + after.xfers_failed + after.xfers_inflight,
          before.xfers_done + before.xfers_failed + before.xfers_inflight);
    KT_EQ(kvx_transport_poll(t, NULL, c, 4), 0);

    /* an empty transfer is legal and completes at once with 0 bytes */
    KT_OK(kvx_xfer_write(t, "p", NULL, NULL, 0, NULL, &id));
    KT_EQ(kt_poll_n(t, "p", c, 1, 5000), 1);
    KT_EQ(c[0].id, id);
    KT_EQ(c[0].status, 0);
    KT_EQ(c[0].bytes, 0);

    KT_ERR(kvx_transport_poll(t, NULL, NULL, 4), -EINVAL);
    KT_ERR(kvx_transport_poll(NULL, NULL, c, 4), -EINVAL);
    KT_ERR(kvx_xfer_cancel(t, &id, 1, 3, NULL), -EINVAL);
    KT_ERR(kvx_xfer_cancel(t, NULL, 2, KVX_CANCEL_WAIT, NULL), -EINVAL);
    KT_EQ(kvx_xfer_cancel(t, &id, 1, KVX_CANCEL_WAIT, NULL), 0); /* already reported: ignored */
    {
        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};
        KT_ERR(kvx_peer_query(t, "nobody", &pa), -ENOENT);
        KT_ERR(kvx_peer_query(t, "p", NULL), -EINVAL);
    }
    {
        uint64_t tags[KVX_FENCE_TAGS_MAX + 1] = {0};
        char long_name[KVX_NAME_MAX + 2];
        kvx_notice_t nt;
        memset(long_name, 'w', sizeof(long_name) - 1);
        long_name[sizeof(long_name) - 1] = '\0';
        KT_ERR(kvx_fence(NULL, "w", NULL, 0), -EINVAL);
        KT_ERR(kvx_fence(t, "w", tags, KVX_FENCE_TAGS_MAX + 1), -EINVAL);
        KT_ERR(kvx_fence(t, "w", NULL, 2), -EINVAL);
        KT_ERR(kvx_fence(t, "", NULL, 0), -EINVAL);
        KT_ERR(kvx_fence(t, long_name, NULL, 0), -EINVAL);
        KT_EQ(kvx_fence(t, "nobody-writes-here", tags, 1), 0); /* no such writer: a no-op */
        KT_ERR(kvx_notice_poll(NULL, &nt, 1), -EINVAL);
        KT_ERR(kvx_notice_poll(t, NULL, 1), -EINVAL);
        KT_EQ(kvx_notice_poll(t, &nt, 1), 0);
    }
    unchanged(1);
}

static void after_close(void)
{
    uint8_t buf[1024];
    size_t n = sizeof(buf);
    uint32_t i0 = 0;
    uint64_t id;
    kvx_completion_t c;
    kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_NUM_PEERS};
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};

    KT_OK(kvx_transport_close(t));
    KT_OK(kvx_transport_close(t)); /* idempotent */
    KT_ERR(kvx_transport_metadata(t, buf, &n), -ESHUTDOWN);
    KT_ERR(kvx_transport_query(t, &ta), -ESHUTDOWN);
    KT_ERR(kvx_peer_add(t, "p", good.md, good.md_len, NULL), -ESHUTDOWN);
    KT_ERR(kvx_peer_remove(t, "p"), -ESHUTDOWN);
    KT_ERR(kvx_peer_query(t, "p", &pa), -ESHUTDOWN);
    KT_ERR(kvx_xfer_write(t, "p", &i0, &i0, 1, NULL, &id), -ESHUTDOWN);
    KT_ERR(kvx_xfer_read(t, "p", &i0, &i0, 1, NULL, &id), -ESHUTDOWN);
    KT_ERR(kvx_transport_poll(t, NULL, &c, 1), -ESHUTDOWN);
    KT_ERR(kvx_xfer_cancel(t, &id, 1, KVX_CANCEL_WAIT, NULL), -ESHUTDOWN);
    KT_ERR(kvx_transport_wait(t, NULL, 10), -ESHUTDOWN);
    KT_ERR(kvx_fence(t, NULL, NULL, 0), -ESHUTDOWN);
    {
        kvx_notice_t nt;
        kvx_peer_event_t ev;
        KT_ERR(kvx_notice_poll(t, &nt, 1), -ESHUTDOWN);
        KT_ERR(kvx_peer_event_poll(t, &ev, 1), -ESHUTDOWN);
    }
    KT_ERR(kvx_transport_listen(t, "127.0.0.1:0"), -ESHUTDOWN);
    KT_ERR(kvx_peer_connect(t, "p", "127.0.0.1:1", NULL), -ESHUTDOWN);
}

static void error_names(void)
{
    const int codes[] = {EINVAL,    ENOENT,          ENOMEM,    ENOSPC,        EEXIST,
                         EBADMSG,   EPROTONOSUPPORT, ETIMEDOUT, ECONNRESET,    ECONNABORTED,
                         ECANCELED, ENOTCONN,        ESHUTDOWN, KVX_EINCOMPAT, EACCES,
                         EPROTO,    KVX_EFENCED,     ESTALE,    EADDRINUSE,    EALREADY};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        KT_CHECK(strcmp(kvx_strerror(-codes[i]), "unknown error") != 0);
        KT_CHECK(strcmp(kvx_strerror(-codes[i]), kvx_strerror(codes[i])) == 0);
    }
    KT_CHECK(strcmp(kvx_strerror(0), "success") == 0);
    KT_CHECK(strcmp(kvx_strerror(-99999), "unknown error") == 0);
    KT_CHECK(strcmp(kvx_version(), KVX_VERSION_STRING) == 0);
}

int main(void)
{
    kt_target_args_t a = {.num_blocks = NB,
                          .block_len = BL,
                          .salt = 1,
                          .threads = 1,
                          .name = "good",
                          .fingerprint = "fp-1"};
    kt_target_args_t b = a, f = a, e = a, o = a;
    kt_target_t badlen, badfp, nofp;

    b.name = "badlen";
    b.block_len = 4096;
    f.name = "badfp";
    f.fingerprint = "fp-2";
    e.name = "nofp";
    e.fingerprint = NULL;
    o.name = "older";
    older = kt_target_start(&o); /* first: its transport is older than good's */
    good = kt_target_start(&a);
    badlen = kt_target_start(&b);
    badfp = kt_target_start(&f);
    nofp = kt_target_start(&e);

    error_names();
    r = kt_region_alloc(NB, BL);
    create_rejections();
    secret_rejections();
    t = kt_transport_ex(&r, "self", 1, "fp-1", 0);
    KT_OK(kvx_peer_add(t, "p", good.md, good.md_len, NULL));
    unchanged(1);
    peer_rejections(&badlen, &badfp, &nofp);
    xfer_rejections();
    after_close();
    kvx_transport_destroy(t);
    kvx_transport_destroy(NULL);
    kt_region_free(&r);
    KT_EQ(kt_target_stop(&good), 0);
    KT_EQ(kt_target_stop(&older), 0);
    KT_EQ(kt_target_stop(&badlen), 0);
    KT_EQ(kt_target_stop(&badfp), 0);
    KT_EQ(kt_target_stop(&nofp), 0);
    return 0;
}
