/*
 * Regions and ranges (kvx.h, docs/regions.md), between real peers: this program and a copy of
 * itself exec'd as the other process (an "owner" of regions, or a "writer" for the fence), over
 * the transport argv[2] names (shm or tcp: UCX_TLS limited to it). Every transfer is checked byte
 * for byte against a pattern of (seed, region, offset). argv[1]:
 *   api      register, deregister, blob, load, unload and range submissions refused with their
 *            errors, nothing changed (the counters and a transfer after them say so)
 *   xfer     write and read ranges across several regions of both sides at odd offsets and
 *            lengths; consecutive ranges coalesced (one message); a range into a region the
 *            owner deregistered fails -ENOENT; block calls beside ranges; canaries intact
 *   many     4,096 regions in the owner, one write and one read of a range in each of them
 *   cycles N N register/deregister cycles of the writer's regions beside live transfers, the
 *            cost of each call in us, and the process's memory flat
 *   fence N  the deregistration fence: a writer process stopped (SIGSTOP) with writes in flight
 *            into a region of this process, the region deregistered and overwritten, the writer
 *            resumed: no byte lands after deregister returned, N runs (every other writer
 *            without a progress thread: its writes wait in it until it resumes); then a control
 *            run that overwrites without deregistering, where bytes do land (the check can fail)
 */
#include "harness.h"
#include "kvx_int.h" /* the region blob codec, for blobs no kvx would make */

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define BL 4096
#define NB 64
#define CANARY 256
#define CANARY_BYTE 0xc5

static const char *self_exe;

/* The pattern byte at offset off of (seed, origin region id). */
static uint8_t pat(uint64_t seed, uint64_t id, uint64_t off)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ id * 0xc2b2ae3d27d4eb4full ^ off;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return (uint8_t)x;
}
static void fill(uint8_t *p, uint64_t len, uint64_t seed, uint64_t id, uint64_t off)
{
    for (uint64_t i = 0; i < len; i++)
        p[i] = pat(seed, id, off + i);
}
/* Bytes of p that differ from the pattern. */
static uint64_t bad(const uint8_t *p, uint64_t len, uint64_t seed, uint64_t id, uint64_t off)
{
    uint64_t n = 0;
    for (uint64_t i = 0; i < len; i++)
        n += p[i] != pat(seed, id, off + i);
    return n;
}

static kvx_transport_t *transport_ex(const char *name, void *base, uint64_t nb, uint64_t stall_ms,
                                     unsigned threads)
{
    kvx_transport_t *t;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_NUM_THREADS,
                      .base = base,
                      .num_blocks = nb,
                      .block_len = BL,
                      .agent_name = name,
                      .num_threads = threads};
    if (stall_ms != 0) {
        p.field_mask |= KVX_PARAM_STALL;
        p.stall_ms = stall_ms;
    }
    kt_rndv_params(&p);
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}
static kvx_transport_t *transport(const char *name, void *base, uint64_t nb, uint64_t stall_ms)
{
    return transport_ex(name, base, nb, stall_ms, 1);
}

static kvx_region_counters_t counters(kvx_transport_t *t)
{
    kvx_transport_attr_t a = {.field_mask = KVX_TRANSPORT_ATTR_REGIONS};
    KT_OK(kvx_transport_query(t, &a));
    return a.regions;
}

static kvx_recv_counters_t rcounters(kvx_transport_t *t)
{
    kvx_transport_attr_t a = {.field_mask = KVX_TRANSPORT_ATTR_RECV};
    KT_OK(kvx_transport_query(t, &a));
    return a.recv;
}

/* One transfer's completion, its status returned. */
static int wait_id(kvx_transport_t *t, uint64_t id)
{
    kvx_completion_t c;
    KT_EQ(kt_poll_n(t, NULL, &c, 1, 20000), 1);
    KT_EQ(c.id, id);
    return c.status;
}

/* ---- the other process: this program again, exec'd ------------------------------------------ */

static kt_proc_t spawn_self(const char *role)
{
    int sv[2];
    char fd[16];
    kt_proc_t p;

    fflush(NULL);
    KT_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    snprintf(fd, sizeof(fd), "%d", sv[1]);
    p.pid = fork();
    KT_CHECK(p.pid >= 0);
    if (p.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(300);
        fcntl(sv[1], F_SETFD, 0);
        execl(self_exe, self_exe, role, fd, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    p.sock = sv[0];
    return p;
}

/* ---- the owner: regions of its own, on command ---------------------------------------------- */

enum { OP_REGISTER = 1, OP_DEREG, OP_VERIFY, OP_CANARIES, OP_COUNTERS, OP_QUIT, OP_FILL };

typedef struct cmd {
    uint32_t op, id, access, pad;
    uint64_t len, off, seed, origin, origin_off;
} cmd_t;

typedef struct owned {
    uint32_t id;
    uint8_t *mem; /* CANARY bytes, the region, CANARY bytes */
    uint64_t len;
} owned_t;

typedef struct owner_state {
    kvx_transport_t *t;
    owned_t *regs;
    size_t n, cap;
} owner_state_t;

static owned_t *owned_find(owner_state_t *o, uint32_t id)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->regs[i].id == id)
            return &o->regs[i];
    return NULL;
}

static void owner_register(owner_state_t *o, int sock, const cmd_t *c)
{
    kvx_region_params_t rp = {.field_mask = KVX_REGION_PARAM_ACCESS, .access = c->access};
    uint8_t reply[8 + KVX_REGION_BLOB_MAX];
    size_t blen = KVX_REGION_BLOB_MAX;
    owned_t g = {.len = c->len};
    int32_t rc;

    g.mem = malloc(c->len + 2 * CANARY);
    KT_CHECK(g.mem != NULL);
    memset(g.mem, CANARY_BYTE, CANARY);
    memset(g.mem + CANARY + c->len, CANARY_BYTE, CANARY);
    rc = kvx_region_register(o->t, g.mem + CANARY, c->len, &rp, &g.id);
    if (rc == 0) {
        fill(g.mem + CANARY, c->len, c->seed, g.id, 0);
        rc = kvx_region_blob(o->t, g.id, reply + 8, &blen);
    }
    if (rc == 0) {
        if (o->n == o->cap) {
            o->cap = o->cap ? 2 * o->cap : 64;
            o->regs = realloc(o->regs, o->cap * sizeof(*o->regs));
            KT_CHECK(o->regs != NULL);
        }
        o->regs[o->n++] = g;
    } else {
        free(g.mem);
        blen = 0;
    }
    memcpy(reply, &rc, 4);
    memcpy(reply + 4, &g.id, 4);
    kt_send(sock, reply, 8 + blen);
}

static uint64_t owner_canaries(owner_state_t *o)
{
    uint64_t n = 0;
    for (size_t i = 0; i < o->n; i++)
        for (uint64_t k = 0; k < CANARY; k++)
            n += (o->regs[i].mem[k] != CANARY_BYTE) +
                 (o->regs[i].mem[CANARY + o->regs[i].len + k] != CANARY_BYTE);
    return n;
}

static int owner_main(int sock)
{
    static uint8_t main_region[NB * BL];
    owner_state_t o = {0};
    uint8_t md[8192];
    size_t md_len = sizeof(md);

    o.t = transport("owner", main_region, NB, 0);
    fill(main_region, sizeof(main_region), 7, KVX_REGION_MAIN, 0);
    KT_OK(kvx_transport_metadata(o.t, md, &md_len));
    kt_send(sock, md, md_len);
    for (;;) {
        cmd_t c;
        owned_t *g;
        uint64_t r = 0;
        int32_t rc;

        kt_recv(sock, &c, sizeof(c));
        switch (c.op) {
        case OP_REGISTER:
            owner_register(&o, sock, &c);
            continue;
        case OP_DEREG:
            rc = kvx_region_deregister(o.t, c.id);
            kt_send(sock, &rc, sizeof(rc));
            continue;
        case OP_VERIFY: /* region id's bytes [off, off + len) hold (seed, origin, origin_off..) */
            g = c.id == KVX_REGION_MAIN ? NULL : owned_find(&o, c.id);
            if (c.id == KVX_REGION_MAIN)
                r = bad(main_region + c.off, c.len, c.seed, c.origin, c.origin_off);
            else
                r = g == NULL ? UINT64_MAX
                              : bad(g->mem + CANARY + c.off, c.len, c.seed, c.origin, c.origin_off);
            break;
        case OP_FILL:
            g = owned_find(&o, c.id);
            KT_CHECK(g != NULL);
            fill(g->mem + CANARY, g->len, c.seed, g->id, 0);
            break;
        case OP_CANARIES:
            r = owner_canaries(&o);
            break;
        case OP_COUNTERS: {
            kvx_region_counters_t rc2 = counters(o.t);
            kvx_recv_counters_t rr = rcounters(o.t);
            kt_send(sock, &rc2, sizeof(rc2));
            kt_send(sock, &rr, sizeof(rr));
            continue;
        }
        case OP_QUIT:
            kvx_transport_destroy(o.t);
            for (size_t i = 0; i < o.n; i++)
                free(o.regs[i].mem);
            free(o.regs);
            kt_send(sock, &r, sizeof(r));
            return 0;
        }
        kt_send(sock, &r, sizeof(r));
    }
}

/* The test's side of an owner. */
typedef struct owner {
    kt_proc_t proc;
    uint8_t md[8192];
    size_t md_len;
} owner_t;

static void owner_start(owner_t *o)
{
    o->proc = spawn_self("owner");
    o->md_len = kt_recv(o->proc.sock, o->md, sizeof(o->md));
}

static uint64_t owner_cmd(owner_t *o, cmd_t c)
{
    uint64_t r;
    kt_send(o->proc.sock, &c, sizeof(c));
    kt_recv(o->proc.sock, &r, sizeof(r));
    return r;
}

/* A region of len bytes in the owner, filled with (seed, its id): its id and blob. */
static uint32_t owner_region(owner_t *o, uint64_t len, unsigned access, uint64_t seed,
                             uint8_t *blob, size_t *blob_len)
{
    cmd_t c = {.op = OP_REGISTER, .len = len, .access = access, .seed = seed};
    uint8_t reply[8 + KVX_REGION_BLOB_MAX];
    size_t n;
    int32_t rc;
    uint32_t id;

    kt_send(o->proc.sock, &c, sizeof(c));
    n = kt_recv(o->proc.sock, reply, sizeof(reply));
    memcpy(&rc, reply, 4);
    memcpy(&id, reply + 4, 4);
    KT_OK(rc);
    memcpy(blob, reply + 8, n - 8);
    *blob_len = n - 8;
    return id;
}

static int owner_dereg(owner_t *o, uint32_t id)
{
    cmd_t c = {.op = OP_DEREG, .id = id};
    int32_t rc;
    kt_send(o->proc.sock, &c, sizeof(c));
    kt_recv(o->proc.sock, &rc, sizeof(rc));
    return rc;
}

static uint64_t owner_verify(owner_t *o, uint32_t id, uint64_t off, uint64_t len, uint64_t seed,
                             uint64_t origin, uint64_t origin_off)
{
    return owner_cmd(o, (cmd_t){.op = OP_VERIFY,
                                .id = id,
                                .off = off,
                                .len = len,
                                .seed = seed,
                                .origin = origin,
                                .origin_off = origin_off});
}

static void owner_counters(owner_t *o, kvx_region_counters_t *rc, kvx_recv_counters_t *rr)
{
    cmd_t c = {.op = OP_COUNTERS};
    kt_send(o->proc.sock, &c, sizeof(c));
    kt_recv(o->proc.sock, rc, sizeof(*rc));
    kt_recv(o->proc.sock, rr, sizeof(*rr));
}

static void owner_stop(owner_t *o)
{
    KT_EQ(owner_cmd(o, (cmd_t){.op = OP_CANARIES}), 0);
    owner_cmd(o, (cmd_t){.op = OP_QUIT});
    KT_EQ(kt_wait(&o->proc), 0);
}

/* ---- api: every refusal, nothing changed ---------------------------------------------------- */

static void api_register(kvx_transport_t *t, uint8_t *buf)
{
    kvx_region_counters_t before = counters(t);
    uint32_t id = 0xdead;
    kvx_region_params_t rp = {.field_mask = KVX_REGION_PARAM_ACCESS};

    KT_ERR(kvx_region_register(NULL, buf, 64, NULL, &id), -EINVAL);
    KT_ERR(kvx_region_register(t, NULL, 64, NULL, &id), -EINVAL);
    KT_ERR(kvx_region_register(t, buf, 0, NULL, &id), -EINVAL);
    KT_ERR(kvx_region_register(t, buf, 64, NULL, NULL), -EINVAL);
    KT_ERR(kvx_region_register(t, (void *)(UINTPTR_MAX - 10), 64, NULL, &id), -EINVAL);
    rp.access = 0;
    KT_ERR(kvx_region_register(t, buf, 64, &rp, &id), -EINVAL);
    rp.access = 4;
    KT_ERR(kvx_region_register(t, buf, 64, &rp, &id), -EINVAL);
    rp.field_mask = 2;
    rp.access = KVX_REGION_READ;
    KT_ERR(kvx_region_register(t, buf, 64, &rp, &id), -EINVAL);
    KT_EQ(id, 0xdead);
    KT_ERR(kvx_region_deregister(NULL, 2), -EINVAL);
    KT_ERR(kvx_region_deregister(t, 0), -EINVAL);
    KT_ERR(kvx_region_deregister(t, 999999), -ENOENT);
    KT_EQ(counters(t).registered, before.registered);
    KT_EQ(counters(t).registrations, before.registrations);
    /* register, deregister, and the same id again: gone; ids are not reused */
    KT_OK(kvx_region_register(t, buf, 64, NULL, &id));
    KT_CHECK(id >= 2);
    KT_EQ(counters(t).registered, before.registered + 1);
    KT_OK(kvx_region_deregister(t, id));
    KT_ERR(kvx_region_deregister(t, id), -ENOENT);
    {
        uint32_t id2;
        KT_OK(kvx_region_register(t, buf, 64, NULL, &id2));
        KT_CHECK(id2 > id);
        KT_OK(kvx_region_deregister(t, id2));
    }
    KT_EQ(counters(t).registered, before.registered);
    KT_EQ(counters(t).registrations, before.registrations + 2);
}

static void api_blob(kvx_transport_t *t, uint8_t *buf)
{
    uint8_t blob[KVX_REGION_BLOB_MAX];
    size_t len = 4;
    uint32_t id;

    KT_OK(kvx_region_register(t, buf, 100, NULL, &id));
    KT_ERR(kvx_region_blob(t, id, blob, &len), -ENOSPC);
    KT_CHECK(len > 4 && len <= KVX_REGION_BLOB_MAX);
    KT_ERR(kvx_region_blob(t, id, NULL, &len), -EINVAL);
    KT_ERR(kvx_region_blob(t, id, blob, NULL), -EINVAL);
    KT_ERR(kvx_region_blob(t, 999999, blob, &len), -ENOENT);
    KT_OK(kvx_region_blob(t, id, blob, &len));
    KT_OK(kvx_region_deregister(t, id));
    KT_ERR(kvx_region_blob(t, id, blob, &len), -ENOENT);
}

/* A blob as the owner's, with one thing changed (another agent, generation, region), made with
 * the codec: what no kvx hands out. */
static size_t forge(const uint8_t *blob, size_t len, uint8_t *out, const char *agent,
                    uint64_t gen_delta, uint32_t id)
{
    kvx_region_blob_t rb;
    KT_OK(kvx_region_blob_decode(blob, len, &rb));
    if (agent != NULL)
        snprintf(rb.agent_name, sizeof(rb.agent_name), "%s", agent);
    rb.generation += gen_delta;
    if (id != 0)
        rb.id = id;
    int n = kvx_region_blob_encode(&rb, NULL, 0, out, KVX_REGION_BLOB_MAX);
    KT_CHECK(n > 0);
    return (size_t)n;
}

static void api_load_and_ranges(kvx_transport_t *t, owner_t *o, uint8_t *local)
{
    uint8_t blob[KVX_REGION_BLOB_MAX], f[KVX_REGION_BLOB_MAX];
    size_t blen, flen;
    uint32_t rid, rro, h, h2, lid, lro;
    uint64_t id = 777;
    kvx_region_params_t ro = {.field_mask = KVX_REGION_PARAM_ACCESS, .access = KVX_REGION_READ};
    kvx_xfer_params_t notify = {.field_mask = KVX_XFER_PARAM_FLAGS, .flags = KVX_XFER_NOTIFY};

    rid = owner_region(o, 1000, KVX_REGION_WRITE | KVX_REGION_READ, 5, blob, &blen);
    KT_ERR(kvx_region_load(t, "nobody", blob, blen, &h), -ENOENT);
    KT_ERR(kvx_region_load(t, "o", NULL, blen, &h), -EINVAL);
    KT_ERR(kvx_region_load(t, "o", blob, blen - 1, &h), -EBADMSG);
    memcpy(f, blob, blen);
    f[0] ^= 1;
    KT_ERR(kvx_region_load(t, "o", f, blen, &h), -EBADMSG);
    flen = forge(blob, blen, f, "someone-else", 0, 0);
    KT_ERR(kvx_region_load(t, "o", f, flen, &h), -EINVAL);
    flen = forge(blob, blen, f, NULL, 1, 0);
    KT_ERR(kvx_region_load(t, "o", f, flen, &h), -ESTALE);
    flen = forge(blob, blen, f, NULL, 0, KVX_REGION_MAIN);
    KT_ERR(kvx_region_load(t, "o", f, flen, &h), -EINVAL);
    KT_OK(kvx_region_load(t, "o", blob, blen, &h));
    KT_CHECK(h >= 2);
    KT_OK(kvx_region_load(t, "o", blob, blen, &h2));
    KT_EQ(h2, h); /* the same blob, the same handle */
    KT_ERR(kvx_region_unload(t, "o", 999999), -ENOENT);
    KT_ERR(kvx_region_unload(t, "o", KVX_REGION_MAIN), -ENOENT);
    KT_ERR(kvx_region_unload(t, "nobody", h), -ENOENT);

    rro = owner_region(o, 500, KVX_REGION_READ, 6, blob, &blen);
    KT_OK(kvx_region_load(t, "o", blob, blen, &h2));
    KT_OK(kvx_region_register(t, local, 4096, NULL, &lid));
    KT_OK(kvx_region_register(t, local, 2048, &ro, &lro)); /* peers' access: ours is whole */
    {
        kvx_range_t good = {lid, h, 1, 3, 997};
        struct {
            kvx_range_t r;
            int op, err;
        } bad_ranges[] = {
            {{lid, h, 0, 0, 0}, KVX_OP_WRITE, -EINVAL},          /* empty */
            {{lid, h, 0, 1, 1000}, KVX_OP_WRITE, -EINVAL},       /* past the remote end */
            {{lid, h, 4000, 0, 97}, KVX_OP_WRITE, -EINVAL},      /* past the local end */
            {{lid, h, UINT64_MAX, 0, 2}, KVX_OP_WRITE, -EINVAL}, /* offset + len wraps */
            {{lid, h, 0, UINT64_MAX, 2}, KVX_OP_READ, -EINVAL},
            {{999999, h, 0, 0, 1}, KVX_OP_WRITE, -ENOENT},   /* unknown local region */
            {{lid, 999999, 0, 0, 1}, KVX_OP_WRITE, -ENOENT}, /* unknown handle */
            {{lid, h2, 0, 0, 1}, KVX_OP_WRITE, -EACCES},     /* the region grants reads only */
        };
        for (size_t i = 0; i < sizeof(bad_ranges) / sizeof(bad_ranges[0]); i++) {
            const kvx_range_t pair[2] = {good, bad_ranges[i].r};
            int rc = bad_ranges[i].op == KVX_OP_WRITE
                         ? kvx_xfer_write_ranges(t, "o", pair, 2, NULL, &id)
                         : kvx_xfer_read_ranges(t, "o", pair, 2, NULL, &id);
            if (rc != bad_ranges[i].err)
                KT_FAIL("bad range %zu: got %d (%s), want %d", i, rc, kvx_strerror(rc),
                        bad_ranges[i].err);
        }
        KT_ERR(kvx_xfer_write_ranges(t, "o", &good, 0, NULL, &id), -EINVAL);
        KT_ERR(kvx_xfer_write_ranges(t, "o", NULL, 1, NULL, &id), -EINVAL);
        KT_ERR(kvx_xfer_write_ranges(t, "nobody", &good, 1, NULL, &id), -ENOENT);
        KT_ERR(kvx_xfer_read_ranges(t, "o", &good, 1, &notify, &id), -EINVAL);
        KT_EQ(id, 777);
        /* nothing was submitted: the next transfer is the only completion */
        fill(local, 4096, 11, lid, 0);
        KT_OK(kvx_xfer_write_ranges(t, "o", &good, 1, NULL, &id));
        KT_EQ(wait_id(t, id), 0);
        KT_EQ(owner_verify(o, rid, 3, 997, 11, lid, 1), 0);
        KT_EQ(owner_verify(o, rid, 0, 3, 5, rid, 0), 0); /* around it: untouched */
        KT_ERR(kvx_transport_poll(t, NULL, &(kvx_completion_t){0}, 1), 0);
        /* a read of the read-only region, into the region peers may only read: ours to fill */
        kvx_range_t rd = {lro, h2, 10, 20, 480};
        KT_OK(kvx_xfer_read_ranges(t, "o", &rd, 1, NULL, &id));
        KT_EQ(wait_id(t, id), 0);
        KT_EQ(bad(local + 10, 480, 6, rro, 20), 0);
    }
    KT_OK(kvx_region_unload(t, "o", h));
    KT_ERR(kvx_region_unload(t, "o", h), -ENOENT);
    KT_ERR(kvx_xfer_write_ranges(t, "o", &(kvx_range_t){lid, h, 0, 0, 1}, 1, NULL, &id), -ENOENT);
    KT_OK(kvx_region_deregister(t, lid));
    KT_OK(kvx_region_deregister(t, lro));
}

static void api_owned(void)
{
    kvx_transport_t *t;
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_OWN_REGION |
                                    KVX_PARAM_NUM_THREADS | KVX_PARAM_AGENT_NAME,
                      .num_blocks = 3,
                      .block_len = 1000,
                      .agent_name = "owned",
                      .num_threads = 0};
    KT_OK(kvx_transport_create(&p, &t));
    KT_ERR(kvx_region_deregister(t, KVX_REGION_MAIN), -EBUSY);
    KT_EQ(counters(t).registered, 1);
    kvx_transport_destroy(t);
}

static void run_api(void)
{
    static uint8_t region[NB * BL], buf[4096];
    owner_t o;
    kvx_transport_t *t;

    owner_start(&o);
    t = transport("api", region, NB, 0);
    KT_EQ(counters(t).registered, 1); /* the main region */
    api_register(t, buf);
    api_blob(t, buf);
    KT_OK(kvx_peer_add(t, "o", o.md, o.md_len, NULL));
    api_load_and_ranges(t, &o, buf);
    {
        /* the main region too can go; block calls then find no local main region */
        uint32_t l = 0;
        uint64_t id;
        KT_OK(kvx_region_deregister(t, KVX_REGION_MAIN));
        KT_ERR(kvx_xfer_write(t, "o", &l, &l, 1, NULL, &id), -ENOENT);
        KT_ERR(kvx_region_blob(t, KVX_REGION_MAIN, buf, &(size_t){sizeof(buf)}), -ENOENT);
    }
    kvx_transport_destroy(t);
    owner_stop(&o);
    api_owned();
    kt_log("api: every refusal returned its error and changed nothing");
}

/* ---- xfer: ranges across regions ------------------------------------------------------------ */

#define NLOC 3
#define NREM 3

static void run_xfer(void)
{
    static uint8_t region[NB * BL];
    static const uint64_t lsz[NLOC] = {100003, 77777, 4099}, rsz[NREM] = {65537, 123457, 9001};
    uint8_t *lmem[NLOC], blob[KVX_REGION_BLOB_MAX];
    uint32_t lid[NLOC], rid[NREM], h[NREM];
    size_t blen;
    owner_t o;
    kvx_transport_t *t;
    kvx_recv_counters_t r0, r1;
    kvx_region_counters_t g0;
    kvx_range_t w[64], rd[64];
    uint64_t id;
    size_t nw = 0;

    owner_start(&o);
    t = transport("xfer", region, NB, 0);
    KT_OK(kvx_peer_add(t, "o", o.md, o.md_len, NULL));
    for (int i = 0; i < NLOC; i++) {
        lmem[i] = malloc(lsz[i]);
        KT_OK(kvx_region_register(t, lmem[i], lsz[i], NULL, &lid[i]));
        fill(lmem[i], lsz[i], 21, lid[i], 0);
    }
    for (int i = 0; i < NREM; i++) {
        rid[i] = owner_region(&o, rsz[i], KVX_REGION_WRITE | KVX_REGION_READ, 31, blob, &blen);
        KT_OK(kvx_region_load(t, "o", blob, blen, &h[i]));
    }
    /* writes: odd offsets and lengths, every local region to every remote one, none
     * overlapping on the remote side (each remote region is cut in 9 slices, one per pair) */
    for (int l = 0; l < NLOC; l++)
        for (int r = 0; r < NREM; r++) {
            uint64_t slice = rsz[r] / (NLOC * NREM), len = slice - 13 - (uint64_t)l;
            if (len > lsz[l] / 3)
                len = lsz[l] / 3 - (uint64_t)l;
            uint64_t roff = slice * (uint64_t)(l * NREM + r) + 7;
            uint64_t loff = (lsz[l] - len) / 3 + (uint64_t)r;
            w[nw++] = (kvx_range_t){lid[l], h[r], loff, roff, len};
        }
    KT_OK(kvx_xfer_write_ranges(t, "o", w, nw, NULL, &id));
    KT_EQ(wait_id(t, id), 0);
    for (size_t i = 0; i < nw; i++) {
        int r = (int)(i % NREM);
        KT_EQ(owner_verify(&o, rid[r], w[i].remote_offset, w[i].len, 21, w[i].local_region,
                           w[i].local_offset),
              0);
        /* the bytes just before each slice: the owner's own pattern still */
        KT_EQ(
            owner_verify(&o, rid[r], w[i].remote_offset - 7, 7, 31, rid[r], w[i].remote_offset - 7),
            0);
    }
    /* reads: the same ranges back into local regions wiped meanwhile (local ranges overlap,
     * each holding what was written from those very bytes), and each remote region's untouched
     * first 7 bytes at an odd offset */
    for (int i = 0; i < NLOC; i++)
        memset(lmem[i], 0xaa, lsz[i]);
    memcpy(rd, w, nw * sizeof(w[0]));
    for (int r = 0; r < NREM; r++)
        rd[nw + (size_t)r] = (kvx_range_t){lid[0], h[r], 1 + 13 * (uint64_t)r, 0, 7};
    KT_OK(kvx_xfer_read_ranges(t, "o", rd, nw + NREM, NULL, &id));
    KT_EQ(wait_id(t, id), 0);
    for (size_t i = 0; i < nw; i++) {
        int l = (int)(i / NREM);
        KT_EQ(bad(lmem[l] + rd[i].local_offset, rd[i].len, 21, lid[l], rd[i].local_offset), 0);
    }
    for (int r = 0; r < NREM; r++)
        KT_EQ(bad(lmem[0] + 1 + 13 * (uint64_t)r, 7, 31, rid[r], 0), 0);
    fill(lmem[2], lsz[2], 21, lid[2], 0);
    /* coalescing: 64 ranges consecutive on both sides are one run, one message */
    owner_counters(&o, &g0, &r0);
    for (int i = 0; i < 64; i++)
        w[i] = (kvx_range_t){lid[2], h[1], 3 + 61 * (uint64_t)i, 1001 + 61 * (uint64_t)i, 61};
    KT_OK(kvx_xfer_write_ranges(t, "o", w, 64, NULL, &id));
    KT_EQ(wait_id(t, id), 0);
    owner_counters(&o, &g0, &r1);
    KT_EQ(r1.writes_landed - r0.writes_landed, 1);
    KT_EQ(owner_verify(&o, rid[1], 1001, 64 * 61, 21, lid[2], 3), 0);
    /* a remote region the owner deregistered: refused by the owner, -ENOENT, counted */
    KT_OK(owner_dereg(&o, rid[0]));
    KT_OK(kvx_xfer_write_ranges(t, "o", &(kvx_range_t){lid[0], h[0], 0, 0, 100}, 1, NULL, &id));
    KT_EQ(wait_id(t, id), -ENOENT);
    KT_OK(kvx_xfer_read_ranges(t, "o", &(kvx_range_t){lid[0], h[0], 0, 0, 100}, 1, NULL, &id));
    KT_EQ(wait_id(t, id), -ENOENT);
    owner_counters(&o, &g0, &r1);
    KT_EQ(g0.drop_region, 2);
    /* block calls beside ranges: the main regions */
    {
        uint32_t li[4] = {1, 2, 3, 9}, ri[4] = {5, 6, 7, 60};
        fill(region, sizeof(region), 41, KVX_REGION_MAIN, 0);
        KT_OK(kvx_xfer_write(t, "o", li, ri, 4, NULL, &id));
        KT_EQ(wait_id(t, id), 0);
        for (int i = 0; i < 4; i++)
            KT_EQ(owner_verify(&o, KVX_REGION_MAIN, (uint64_t)ri[i] * BL, BL, 41, KVX_REGION_MAIN,
                               (uint64_t)li[i] * BL),
                  0);
        KT_OK(kvx_xfer_read(t, "o", ri, li, 4, NULL, &id)); /* back into 5, 6, 7, 60 */
        KT_EQ(wait_id(t, id), 0);
        for (int i = 0; i < 4; i++)
            KT_EQ(bad(region + (uint64_t)li[i] * BL, BL, 41, KVX_REGION_MAIN, (uint64_t)li[i] * BL),
                  0);
    }
    kvx_transport_destroy(t);
    owner_stop(&o);
    for (int i = 0; i < NLOC; i++)
        free(lmem[i]);
    kt_log("xfer: ranges over %d local and %d remote regions, byte for byte; 64 consecutive "
           "ranges in one message; a deregistered region refused (-ENOENT)",
           NLOC, NREM);
}

/* ---- many: 4,096 regions -------------------------------------------------------------------- */

#define NMANY 4096
#define MANY_LEN 1031

static void run_many(void)
{
    static uint8_t region[NB * BL];
    static uint32_t rid[NMANY], h[NMANY];
    static kvx_range_t w[NMANY];
    uint8_t blob[KVX_REGION_BLOB_MAX], *mem = malloc((size_t)NMANY * MANY_LEN);
    size_t blen;
    uint32_t lid;
    uint64_t id, t0;
    owner_t o;
    kvx_transport_t *t;

    owner_start(&o);
    t = transport("many", region, NB, 0);
    KT_OK(kvx_peer_add(t, "o", o.md, o.md_len, NULL));
    KT_OK(kvx_region_register(t, mem, (uint64_t)NMANY * MANY_LEN, NULL, &lid));
    fill(mem, (uint64_t)NMANY * MANY_LEN, 51, lid, 0);
    t0 = kt_now_ns();
    for (int i = 0; i < NMANY; i++) {
        rid[i] = owner_region(&o, MANY_LEN + (uint64_t)(i % 7), KVX_REGION_WRITE | KVX_REGION_READ,
                              61, blob, &blen);
        KT_OK(kvx_region_load(t, "o", blob, blen, &h[i]));
    }
    kt_log("many: %d regions registered in the owner and loaded here in %.1f ms", NMANY,
           (double)(kt_now_ns() - t0) / 1e6);
    for (int i = 0; i < NMANY; i++)
        w[i] = (kvx_range_t){lid, h[i], (uint64_t)i * MANY_LEN, (uint64_t)(i % 7), MANY_LEN - 8};
    KT_OK(kvx_xfer_write_ranges(t, "o", w, NMANY, NULL, &id));
    KT_EQ(wait_id(t, id), 0);
    for (int i = 0; i < NMANY; i++)
        KT_EQ(owner_verify(&o, rid[i], (uint64_t)(i % 7), MANY_LEN - 8, 51, lid,
                           (uint64_t)i * MANY_LEN),
              0);
    /* and back: each region's written bytes into a fresh place here */
    memset(mem, 0, (size_t)NMANY * MANY_LEN);
    KT_OK(kvx_xfer_read_ranges(t, "o", w, NMANY, NULL, &id));
    KT_EQ(wait_id(t, id), 0);
    for (int i = 0; i < NMANY; i++)
        KT_EQ(bad(mem + (uint64_t)i * MANY_LEN, MANY_LEN - 8, 51, lid, (uint64_t)i * MANY_LEN), 0);
    kvx_transport_destroy(t);
    owner_stop(&o);
    free(mem);
    kt_log("many: one write and one read of a range in each of %d regions, byte for byte", NMANY);
}

/* ---- cycles: register/deregister beside live transfers -------------------------------------- */

static long rss_kb(void)
{
    char line[256];
    long kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    KT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static void run_cycles(long n)
{
    static uint8_t region[NB * BL], src[1 << 16], spare[4096];
    uint8_t blob[KVX_REGION_BLOB_MAX];
    size_t blen;
    uint32_t lid, rid, h;
    uint64_t reg_ns = 0, dereg_ns = 0, rounds = 0, inflight = 0, seq = 0;
    long rss0 = 0, rss1;
    size_t heap0 = 0, heap1;
    owner_t o;
    kvx_transport_t *t;

    owner_start(&o);
    t = transport("cycles", region, NB, 0);
    KT_OK(kvx_peer_add(t, "o", o.md, o.md_len, NULL));
    KT_OK(kvx_region_register(t, src, sizeof(src), NULL, &lid));
    fill(src, sizeof(src), 71, lid, 0);
    rid = owner_region(&o, sizeof(src), KVX_REGION_WRITE | KVX_REGION_READ, 72, blob, &blen);
    KT_OK(kvx_region_load(t, "o", blob, blen, &h));
    for (long i = 0; i < n; i++) {
        kvx_completion_t c[8];
        uint32_t g;
        uint64_t a, b, e;
        int got;

        /* keep 8 writes of 8 KiB in flight, each to its own slice */
        while (inflight < 8) {
            uint64_t off = (seq++ % 8) * 8192, id;
            KT_OK(kvx_xfer_write_ranges(t, "o", &(kvx_range_t){lid, h, off, off, 8192}, 1, NULL,
                                        &id));
            inflight++;
            rounds++;
        }
        a = kt_now_ns();
        KT_OK(kvx_region_register(t, spare, sizeof(spare), NULL, &g));
        b = kt_now_ns();
        KT_OK(kvx_region_deregister(t, g));
        e = kt_now_ns();
        reg_ns += b - a;
        dereg_ns += e - b;
        got = kvx_transport_poll(t, NULL, c, 8);
        KT_OK(got);
        for (int k = 0; k < got; k++)
            KT_EQ(c[k].status, 0);
        inflight -= (uint64_t)got;
        if (i == n / 4) { /* UCX's and kvx's pools have grown to what these transfers need */
            rss0 = rss_kb();
            heap0 = mallinfo2().uordblks;
        }
        if (getenv("KT_RSS_TRACE") && i % (n / 10) == 0)
            kt_log("cycle %ld: %ld kB", i, rss_kb());
    }
    while (inflight > 0) {
        kvx_completion_t c;
        KT_EQ(kt_poll_n(t, NULL, &c, 1, 20000), 1);
        KT_EQ(c.status, 0);
        inflight--;
    }
    rss1 = rss_kb();
    heap1 = mallinfo2().uordblks;
    KT_EQ(owner_verify(&o, rid, 0, sizeof(src), 71, lid, 0), 0);
    KT_EQ(counters(t).registered, 2); /* the main region and the writes' source */
    kt_log("cycles: %ld register/deregister cycles beside %llu writes of 8 KiB: register %.2f us, "
           "deregister %.2f us each; from cycle %ld on: heap in use %zu -> %zu bytes, resident "
           "%ld kB -> %ld kB",
           n, (unsigned long long)rounds, (double)reg_ns / 1e3 / (double)n,
           (double)dereg_ns / 1e3 / (double)n, n / 4, heap0, heap1, rss0, rss1);
    /* a leak of a byte per cycle would show: 75,000 bytes over the last three quarters */
    if (n >= 10000 && heap1 > heap0 + 65536)
        KT_FAIL("the heap grew by %zu bytes over %ld cycles", heap1 - heap0, n - n / 4);
    kvx_transport_destroy(t);
    owner_stop(&o);
}

/* ---- fence: a stopped writer ---------------------------------------------------------------- */

#define FENCE_LEN ((uint64_t)32 << 20)
#define FENCE_WRITES 128
#define MARK 0xee

typedef struct fence_job {
    char name[32];
    uint32_t threads; /* the writer's progress threads: 0, its UCX moves only when it polls */
    uint8_t blob[KVX_REGION_BLOB_MAX];
    uint32_t blob_len;
    uint32_t md_len;
    uint8_t md[8192];
} fence_job_t;

/* The writer: writes of its whole source region into the receiver's region, then waits. */
static int writer_main(int sock)
{
    static uint8_t region[NB * BL];
    fence_job_t j;
    uint8_t *src = malloc(FENCE_LEN);
    uint32_t lid, h, l0 = 0;
    uint64_t id, ok = 0, failed = 0, ids[FENCE_WRITES];
    kvx_transport_t *t;
    int32_t rc;

    kt_recv(sock, &j, sizeof(j));
    t = transport_ex(j.name, region, NB, 0, j.threads);
    KT_OK(kvx_peer_add(t, "r", j.md, j.md_len, NULL));
    KT_OK(kvx_region_register(t, src, FENCE_LEN, NULL, &lid));
    fill(src, FENCE_LEN, 81, lid, 0);
    KT_OK(kvx_region_load(t, "r", j.blob, j.blob_len, &h));
    /* connected first: the writes are on the wire (or in UCX's hands) when we stop */
    KT_OK(kvx_xfer_write(t, "r", &l0, &l0, 1, NULL, &id));
    KT_EQ(wait_id(t, id), 0);
    for (int i = 0; i < FENCE_WRITES; i++) {
        uint64_t off = (uint64_t)i * (FENCE_LEN / FENCE_WRITES);
        KT_OK(kvx_xfer_write_ranges(
            t, "r", &(kvx_range_t){lid, h, off, off, FENCE_LEN / FENCE_WRITES}, 1, NULL, &ids[i]));
    }
    rc = 0;
    kt_send(sock, &rc, sizeof(rc)); /* submitted: the test stops us now */
    kt_recv(sock, &rc, sizeof(rc)); /* resumed */
    for (int i = 0; i < FENCE_WRITES; i++) {
        kvx_completion_t c;
        if (kt_poll_n(t, NULL, &c, 1, 20000) != 1)
            break;
        if (c.status == 0)
            ok++;
        else
            failed++;
    }
    kt_send(sock, &ok, sizeof(ok));
    kt_send(sock, &failed, sizeof(failed));
    kvx_transport_destroy(t);
    free(src);
    return 0;
}

/* One run: bytes of the region that changed after deregister returned (or, control, after the
 * overwrite with no deregistration). */
static uint64_t fence_run(kvx_transport_t *t, bool control, uint64_t *dereg_ms, uint64_t *ok_p)
{
    uint8_t *mem = malloc(FENCE_LEN);
    kt_proc_t w = spawn_self("writer");
    fence_job_t j = {0};
    size_t blen = sizeof(j.blob), mdl = sizeof(j.md);
    uint64_t ok, failed, landed = 0, t0;
    uint32_t id;
    int32_t rc;

    static int run;

    snprintf(j.name, sizeof(j.name), "fence-writer-%d", run);
    /* every other run, and the control, a writer without a progress thread: most of its writes
     * wait in it (and its UCX) when it stops, and move only once it resumes and polls; with a
     * thread, whatever it pushed meanwhile waits in the FIFO, the socket or UCX */
    j.threads = control || run % 2 == 0 ? 0 : 1;
    run++;
    memset(mem, 0, FENCE_LEN);
    KT_OK(kvx_region_register(t, mem, FENCE_LEN, NULL, &id));
    KT_OK(kvx_region_blob(t, id, j.blob, &blen));
    KT_OK(kvx_transport_metadata(t, j.md, &mdl));
    j.blob_len = (uint32_t)blen;
    j.md_len = (uint32_t)mdl;
    kt_send(w.sock, &j, sizeof(j));
    kt_recv(w.sock, &rc, sizeof(rc));
    kt_stop(&w);
    t0 = kt_now_ns();
    if (!control)
        KT_OK(kvx_region_deregister(t, id));
    *dereg_ms = (kt_now_ns() - t0) / 1000000;
    memset(mem, MARK, FENCE_LEN); /* reused: whatever lands now is a late byte */
    kt_cont(&w);
    kt_send(w.sock, &rc, sizeof(rc));
    kt_recv(w.sock, &ok, sizeof(ok));
    kt_recv(w.sock, &failed, sizeof(failed));
    KT_EQ(kt_wait(&w), 0);
    usleep(100000); /* the writer is gone; whatever UCX still delivered has arrived */
    for (uint64_t i = 0; i < FENCE_LEN; i++)
        landed += mem[i] != MARK;
    if (control) {
        /* and what landed is the writer's data, where it belongs */
        for (uint64_t i = 0; i < FENCE_LEN; i++)
            if (mem[i] != MARK && mem[i] != pat(81, 2, i)) /* the writer's first region: 2 */
                KT_FAIL("control: byte %llu is neither the mark nor the writer's",
                        (unsigned long long)i);
        KT_OK(kvx_region_deregister(t, id));
    }
    free(mem);
    *ok_p = ok;
    (void)failed;
    return landed;
}

static void run_fence(long n)
{
    static uint8_t region[NB * BL];
    kvx_transport_t *t = transport("fence-receiver", region, NB, 0);
    uint64_t late = 0, max_ms = 0, ctl_landed, ms, ok, ok_sum = 0;
    kvx_region_counters_t g;

    for (long i = 0; i < n; i++) {
        late += fence_run(t, false, &ms, &ok);
        ok_sum += ok;
        max_ms = ms > max_ms ? ms : max_ms;
    }
    g = counters(t);
    KT_EQ(late, 0);
    ctl_landed = fence_run(t, true, &ms, &ok);
    kt_log("fence: %ld runs, 0 bytes landed after deregister returned (at most %llu ms; "
           "%llu of %ld writes had completed before; %llu refused messages, %llu connections "
           "closed); control: %llu bytes landed after the overwrite without a deregistration",
           n, (unsigned long long)max_ms, (unsigned long long)ok_sum, n * FENCE_WRITES,
           (unsigned long long)g.drop_region, (unsigned long long)g.dereg_closed,
           (unsigned long long)ctl_landed);
    if (ctl_landed == 0)
        KT_FAIL("control: no byte landed after the overwrite: the run shows nothing");
    kvx_transport_destroy(t);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "api";
    const char *tl = argc > 2 ? argv[2] : "shm";
    long n = argc > 3 ? atol(argv[3]) : 0;

    self_exe = "/proc/self/exe";
    {
        static char exe[4096];
        ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (k > 0) {
            exe[k] = '\0';
            self_exe = exe;
        }
    }
    if (strcmp(mode, "owner") == 0)
        return owner_main(atoi(argv[2]));
    if (strcmp(mode, "writer") == 0)
        return writer_main(atoi(argv[2]));
    setenv("UCX_TLS", strcmp(tl, "tcp") == 0 ? "tcp" : "sm", 1);
    if (strcmp(mode, "api") == 0)
        run_api();
    else if (strcmp(mode, "xfer") == 0)
        run_xfer();
    else if (strcmp(mode, "many") == 0)
        run_many();
    else if (strcmp(mode, "cycles") == 0)
        run_cycles(n > 0 ? n : 100000);
    else if (strcmp(mode, "fence") == 0)
        run_fence(n > 0 ? n : 3);
    else
        KT_FAIL("unknown mode %s", mode);
    return 0;
}
