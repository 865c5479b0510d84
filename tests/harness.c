/*
 * Test helpers (see harness.h): patterns, forked peers with a command channel, namespaces.
 */
#include "harness.h"
#include "common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t kt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void kt_log(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "[%d] ", (int)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

/* ---- regions and patterns ------------------------------------------------------------------- */

kt_region_t kt_region_alloc(uint64_t num_blocks, uint64_t block_len)
{
    kt_region_t r = {.num_blocks = num_blocks, .block_len = block_len};
    void *p = mmap(NULL, num_blocks * block_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        KT_FAIL("mmap %llu bytes: %s", (unsigned long long)(num_blocks * block_len),
                strerror(errno));
    r.base = p;
    return r;
}

void kt_region_free(kt_region_t *r)
{
    if (r->base != NULL)
        munmap(r->base, r->num_blocks * r->block_len);
    r->base = NULL;
}

/* The tests' fills and checks go through the _target functions, unchecked by ThreadSanitizer:
 * most touch a region a peer transport writes into or reads from, ordered by words it cannot
 * see (tools/common.c). kt_check_read checks a read's blocks in the reader's own region, which
 * kvx's lock orders with the read's landing: that stays checked. */
void kt_fill(const kt_region_t *r, uint64_t idx, uint64_t salt, uint64_t src, uint64_t round)
{
    kvx_pattern_fill_target(r->base + idx * r->block_len, r->block_len, salt, src, round);
}

void kt_fill_all(const kt_region_t *r, uint64_t salt, uint64_t round)
{
    for (uint64_t i = 0; i < r->num_blocks; i++)
        kt_fill(r, i, salt, i, round);
}

uint64_t kt_check(const kt_region_t *r, uint64_t idx, uint64_t salt, uint64_t src, uint64_t round)
{
    return kvx_pattern_check_target(r->base + idx * r->block_len, r->block_len, salt, src, round);
}

uint64_t kt_check_read(const kt_region_t *r, uint64_t idx, uint64_t salt, uint64_t src,
                       uint64_t round)
{
    return kvx_pattern_check(r->base + idx * r->block_len, r->block_len, salt, src, round);
}

/* ---- transports ----------------------------------------------------------------------------- */

kvx_transport_t *kt_transport_ex(const kt_region_t *r, const char *name, unsigned threads,
                                 const char *fingerprint, uint64_t deadline_ms)
{
    kvx_transport_t *t = NULL;
    kvx_params_t p = {
        .field_mask = KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS,
        .base = r->base,
        .num_blocks = r->num_blocks,
        .block_len = r->block_len,
        .num_threads = threads,
    };
    if (name != NULL) {
        p.field_mask |= KVX_PARAM_AGENT_NAME;
        p.agent_name = name;
    }
    if (fingerprint != NULL) {
        p.field_mask |= KVX_PARAM_FINGERPRINT;
        p.fingerprint = fingerprint;
    }
    if (deadline_ms != 0) {
        p.field_mask |= KVX_PARAM_DEADLINE;
        p.deadline_ms = deadline_ms;
    }
    kt_rndv_params(&p);
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}

void kt_rndv_params(kvx_params_t *p)
{
    const char *m = getenv("KT_RNDV");

    if (m == NULL || *m == '\0')
        return;
    p->field_mask |= KVX_PARAM_RNDV;
    p->rndv_mode = strcmp(m, "eager") == 0    ? KVX_RNDV_EAGER
                   : strcmp(m, "always") == 0 ? KVX_RNDV_ALWAYS
                                              : KVX_RNDV_AUTO;
    p->rndv_thresh = getenv("KT_RNDV_THRESH") ? strtoull(getenv("KT_RNDV_THRESH"), NULL, 0) : 0;
}

bool kt_rndv_forced(void)
{
    const char *m = getenv("KT_RNDV");

    return m != NULL && strcmp(m, "always") == 0;
}

kvx_transport_t *kt_transport(const kt_region_t *r, const char *name, unsigned threads)
{
    return kt_transport_ex(r, name, threads, NULL, 0);
}

uint8_t *kt_metadata(kvx_transport_t *t, size_t *len)
{
    size_t n = 0;
    uint8_t *buf;

    KT_ERR(kvx_transport_metadata(t, NULL, &n), -ENOSPC);
    buf = malloc(n);
    KT_CHECK(buf != NULL);
    KT_OK(kvx_transport_metadata(t, buf, &n));
    *len = n;
    return buf;
}

int kt_poll_n(kvx_transport_t *t, const char *peer_id, kvx_completion_t *out, int want,
              int timeout_ms)
{
    uint64_t end = kt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int got = 0;

    while (got < want && kt_now_ns() < end) {
        int n = kvx_transport_poll(t, peer_id, out + got, (size_t)(want - got));
        KT_OK(n);
        for (int i = got; i < got + n; i++)
            for (int j = 0; j < i; j++)
                if (out[i].id == out[j].id)
                    KT_FAIL("transfer id %llu completed twice", (unsigned long long)out[i].id);
        got += n;
        if (n == 0)
            usleep(50);
    }
    return got;
}

/* ---- forked peers --------------------------------------------------------------------------- */

kt_proc_t kt_spawn(int (*fn)(int sock, void *arg), void *arg, unsigned timeout_s)
{
    int sv[2];
    kt_proc_t p;

    fflush(NULL);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        KT_FAIL("socketpair: %s", strerror(errno));
    p.pid = fork();
    if (p.pid < 0)
        KT_FAIL("fork: %s", strerror(errno));
    if (p.pid == 0) {
        close(sv[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(timeout_s);
        _exit(fn(sv[1], arg));
    }
    close(sv[1]);
    p.sock = sv[0];
    return p;
}

int kt_wait(kt_proc_t *p)
{
    int st;

    if (p->pid <= 0)
        return -1;
    while (waitpid(p->pid, &st, 0) < 0)
        if (errno != EINTR)
            KT_FAIL("waitpid: %s", strerror(errno));
    p->pid = 0;
    if (p->sock >= 0)
        close(p->sock);
    p->sock = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void kt_kill(kt_proc_t *p, int sig)
{
    if (p->pid > 0)
        kill(p->pid, sig);
}

/* Every thread of pid in state T (stopped)? */
static bool kt_all_stopped(pid_t pid)
{
    char path[320], line[512];
    bool stopped = true;
    FILE *f;
    DIR *d;
    struct dirent *e;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    d = opendir(path);
    if (d == NULL)
        return false;
    while ((e = readdir(d)) != NULL && stopped) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, e->d_name);
        f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(line, sizeof(line), f) != NULL) {
            const char *p = strrchr(line, ')');
            stopped = p != NULL && (p[2] == 'T' || p[2] == 't');
        }
        fclose(f);
    }
    closedir(d);
    return stopped;
}

void kt_stop(kt_proc_t *p)
{
    uint64_t end = kt_now_ns() + 5000000000ull;

    kill(p->pid, SIGSTOP);
    while (!kt_all_stopped(p->pid)) {
        if (kt_now_ns() > end)
            KT_FAIL("process %d did not stop", (int)p->pid);
        usleep(100);
    }
}

void kt_cont(kt_proc_t *p) { kill(p->pid, SIGCONT); }

static void kt_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *b = buf;
    while (len > 0) {
        ssize_t n = write(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            KT_FAIL("write: %s", strerror(errno));
        b += n;
        len -= (size_t)n;
    }
}

static void kt_read_all(int fd, void *buf, size_t len)
{
    uint8_t *b = buf;
    while (len > 0) {
        ssize_t n = read(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            KT_FAIL("peer closed the channel");
        if (n < 0)
            KT_FAIL("read: %s", strerror(errno));
        b += n;
        len -= (size_t)n;
    }
}

void kt_send(int fd, const void *buf, size_t len)
{
    uint64_t n = len;
    kt_write_all(fd, &n, sizeof(n));
    kt_write_all(fd, buf, len);
}

size_t kt_recv(int fd, void *buf, size_t cap)
{
    uint64_t n;
    kt_read_all(fd, &n, sizeof(n));
    if (n > cap)
        KT_FAIL("message of %llu bytes, room for %zu", (unsigned long long)n, cap);
    kt_read_all(fd, buf, n);
    return n;
}

uint8_t *kt_recv_alloc(int fd, size_t *len)
{
    uint64_t n;
    uint8_t *buf;
    kt_read_all(fd, &n, sizeof(n));
    buf = malloc(n ? n : 1);
    KT_CHECK(buf != NULL);
    kt_read_all(fd, buf, n);
    *len = n;
    return buf;
}

/* ---- the standard target -------------------------------------------------------------------- */

enum {
    KT_CMD_VERIFY = 1,
    KT_CMD_REFILL,
    KT_CMD_QUIT,
    KT_CMD_FENCE,
    KT_CMD_NOTICES,
    KT_CMD_COUNTERS,
    KT_CMD_CANARIES,
    KT_CMD_INFO,
    KT_CMD_PROGRESS,
    KT_CMD_REGION,   /* register a region (round: its length, n: access, salt: its fill) */
    KT_CMD_DEREGION, /* deregister region n */
    KT_CMD_RCOUNTERS /* the region counters */
};

/* The target's regions beyond its main one, each with canaries of its own. */
typedef struct kt_target_reg {
    uint32_t id;
    uint8_t *mem; /* KT_REG_CANARY bytes, the region, KT_REG_CANARY bytes */
    uint64_t len;
} kt_target_reg_t;
#define KT_REG_CANARY 4096

/* Bytes of canary around a target's region: memory of the target that is not the region. */
#define KT_CANARY (64 * 1024)
#define KT_CANARY_BYTE 0xc5

typedef struct kt_cmd {
    uint32_t op;
    uint32_t n;
    uint64_t salt;
    uint64_t round;
} kt_cmd_t;

/* The target's region, with KT_CANARY bytes of canary on each side in the same mapping. */
static kt_region_t kt_target_region(const kt_target_args_t *a, uint8_t **map, size_t *map_len)
{
    kt_region_t r = {.num_blocks = a->num_blocks, .block_len = a->block_len};

    *map_len = a->num_blocks * a->block_len + 2 * KT_CANARY;
    *map = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*map == MAP_FAILED)
        KT_FAIL("mmap: %s", strerror(errno));
    memset(*map, KT_CANARY_BYTE, KT_CANARY);
    memset(*map + *map_len - KT_CANARY, KT_CANARY_BYTE, KT_CANARY);
    r.base = *map + KT_CANARY;
    return r;
}

static kt_target_reg_t kt_regs[64];
static size_t kt_nregs;

static uint64_t kt_target_reg_canaries(void)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < kt_nregs; i++)
        for (size_t k = 0; k < KT_REG_CANARY; k++)
            bad += (kt_regs[i].mem[k] != KT_CANARY_BYTE) +
                   (kt_regs[i].mem[KT_REG_CANARY + kt_regs[i].len + k] != KT_CANARY_BYTE);
    return bad;
}

/* The region commands (their answers sent here, but DEREGION's: its status, returned). A
 * region's bytes start as (uint8_t)(salt + 7 * i); its memory stays (and its canaries are
 * checked) after it is deregistered. */
static uint64_t kt_target_regions(kvx_transport_t *t, int sock, const kt_cmd_t *cmd)
{
    if (cmd->op == KT_CMD_REGION) {
        kvx_region_params_t rp = {.field_mask = KVX_REGION_PARAM_ACCESS, .access = cmd->n};
        uint8_t reply[8 + KVX_REGION_BLOB_MAX];
        size_t blen = KVX_REGION_BLOB_MAX;
        kt_target_reg_t *g = &kt_regs[kt_nregs];
        int32_t rc;

        KT_CHECK(kt_nregs < sizeof(kt_regs) / sizeof(kt_regs[0]));
        g->len = cmd->round;
        g->mem = malloc(g->len + 2 * KT_REG_CANARY);
        KT_CHECK(g->mem != NULL);
        memset(g->mem, KT_CANARY_BYTE, g->len + 2 * KT_REG_CANARY);
        for (uint64_t i = 0; i < g->len; i++)
            g->mem[KT_REG_CANARY + i] = (uint8_t)(cmd->salt + 7 * i);
        rc = kvx_region_register(t, g->mem + KT_REG_CANARY, g->len, &rp, &g->id);
        if (rc == 0)
            rc = kvx_region_blob(t, g->id, reply + 8, &blen);
        if (rc == 0)
            kt_nregs++;
        else
            blen = 0;
        memcpy(reply, &rc, 4);
        memcpy(reply + 4, &g->id, 4);
        kt_send(sock, reply, 8 + blen);
        return 0;
    }
    if (cmd->op == KT_CMD_DEREGION)
        return (uint64_t)(int64_t)kvx_region_deregister(t, cmd->n);
    if (cmd->op == KT_CMD_RCOUNTERS) {
        kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_REGIONS};
        KT_OK(kvx_transport_query(t, &ta));
        kt_send(sock, &ta.regions, sizeof(ta.regions));
    }
    return 0;
}

int kt_target_main(int sock, void *arg)
{
    const kt_target_args_t *a = arg;
    kt_region_t r;
    kvx_transport_t *t;
    uint8_t *md, *map;
    size_t md_len, len, map_len;

    if (a->owned) {
        /* the region is kvx's; the canary is the rest of its last page, shared with peers */
        kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_REGION};
        kvx_params_t p = {
            .field_mask = KVX_PARAM_REGION | KVX_PARAM_OWN_REGION | KVX_PARAM_NUM_THREADS |
                          (a->name ? KVX_PARAM_AGENT_NAME : 0) |
                          (a->fingerprint ? KVX_PARAM_FINGERPRINT : 0),
            .num_blocks = a->num_blocks,
            .block_len = a->block_len,
            .num_threads = a->threads,
            .agent_name = a->name,
            .fingerprint = a->fingerprint,
        };
        kt_rndv_params(&p);
        KT_OK(kvx_transport_create(&p, &t));
        KT_OK(kvx_transport_query(t, &ta));
        r = (kt_region_t){.base = ta.base, .num_blocks = a->num_blocks, .block_len = a->block_len};
        map = NULL;
        map_len = ((a->num_blocks * a->block_len + 4095) & ~4095ull) - a->num_blocks * a->block_len;
        memset(r.base + a->num_blocks * a->block_len, KT_CANARY_BYTE, map_len);
        kt_fill_all(&r, a->salt, 0);
    } else {
        r = kt_target_region(a, &map, &map_len);
        kt_fill_all(&r, a->salt, 0);
        t = kt_transport_ex(&r, a->name, a->threads, a->fingerprint, 0);
    }
    md = kt_metadata(t, &md_len);
    kt_send(sock, md, md_len);
    free(md);
    if (a->listen != NULL) {
        kvx_transport_attr_t la = {.field_mask = KVX_TRANSPORT_ATTR_LISTEN};
        KT_OK(kvx_transport_listen(t, a->listen));
        KT_OK(kvx_transport_query(t, &la));
        kt_send(sock, la.listen_addr, strlen(la.listen_addr) + 1);
    }
    for (;;) {
        uint8_t *msg = kt_recv_alloc(sock, &len);
        kt_cmd_t cmd;
        uint64_t bad = 0;

        KT_CHECK(len >= sizeof(cmd));
        memcpy(&cmd, msg, sizeof(cmd));
        if (cmd.op == KT_CMD_QUIT) {
            free(msg);
            break;
        }
        if (cmd.op >= KT_CMD_REGION) {
            bad = kt_target_regions(t, sock, &cmd);
            free(msg);
            if (cmd.op == KT_CMD_DEREGION)
                kt_send(sock, &bad, sizeof(bad));
            continue;
        }
        if (cmd.op == KT_CMD_VERIFY) {
            const uint32_t *dst = (const uint32_t *)(msg + sizeof(cmd));
            const uint32_t *src = dst + cmd.n;
            KT_EQ(len, sizeof(cmd) + 8ull * cmd.n);
            for (uint32_t i = 0; i < cmd.n; i++) {
                uint64_t w = kt_check(&r, dst[i], cmd.salt, src[i], cmd.round);
                if (w != 0 && bad++ < 3)
                    kt_log("target: block %u (from %u, round %llu) wrong at word %llu", dst[i],
                           src[i], (unsigned long long)cmd.round, (unsigned long long)(w - 1));
            }
        } else if (cmd.op == KT_CMD_REFILL) {
            kt_fill_all(&r, a->salt, cmd.round);
        } else if (cmd.op == KT_CMD_FENCE) {
            /* a writer's name (or "" for every writer) follows, then n tags */
            const char *name = (const char *)(msg + sizeof(cmd));
            size_t nlen = strnlen(name, len - sizeof(cmd));
            const uint64_t *tags = (const uint64_t *)(msg + sizeof(cmd) + 64);
            KT_EQ(len, sizeof(cmd) + 64 + 8ull * cmd.n);
            bad = (uint64_t)kvx_fence(t, nlen ? name : NULL, cmd.n ? tags : NULL, cmd.n);
        } else if (cmd.op == KT_CMD_NOTICES) {
            /* the notices waiting, each with whether its blocks hold (salt, src, round): the
             * test's writes put block src into block src + cmd.salt, round cmd.round */
            kvx_notice_t nt[256];
            int n = kvx_notice_poll(t, nt, 256);
            KT_OK(n);
            kt_send(sock, nt, (size_t)n * sizeof(nt[0]));
            free(msg);
            continue;
        } else if (cmd.op == KT_CMD_COUNTERS) {
            kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_RECV};
            KT_OK(kvx_transport_query(t, &ta));
            kt_send(sock, &ta.recv, sizeof(ta.recv));
            free(msg);
            continue;
        } else if (cmd.op == KT_CMD_CANARIES && map == NULL) { /* owned: map_len after it */
            for (size_t i = 0; i < map_len; i++)
                bad += r.base[r.num_blocks * r.block_len + i] != KT_CANARY_BYTE;
        } else if (cmd.op == KT_CMD_CANARIES) {
            for (size_t i = 0; i < KT_CANARY; i++)
                bad +=
                    (map[i] != KT_CANARY_BYTE) + (map[map_len - KT_CANARY + i] != KT_CANARY_BYTE);
            bad += kt_target_reg_canaries();
        } else if (cmd.op == KT_CMD_PROGRESS) {
            /* drive progress for cmd.round ms (a target without a progress thread) */
            uint64_t end = kt_now_ns() + cmd.round * 1000000ull;
            while (kt_now_ns() < end) {
                kvx_completion_t c[4];
                KT_OK(kvx_transport_poll(t, NULL, c, 4));
                usleep(100);
            }
        } else if (cmd.op == KT_CMD_INFO) {
            uint64_t info[2] = {(uintptr_t)r.base, map == NULL ? map_len : KT_CANARY};
            kt_send(sock, info, sizeof(info));
            free(msg);
            continue;
        }
        kt_send(sock, &bad, sizeof(bad));
        free(msg);
    }
    kvx_transport_destroy(t);
    if (map != NULL)
        munmap(map, map_len);
    return 0;
}

/*
 * A target is a process of its own image (tests/kt_target.c, exec'd): forking a process that
 * already runs UCX leaves the child with UCX's global state but none of its threads, and it then
 * fails to wire up. Targets started after the test's own transport exists must be exec'd.
 */
kt_target_t kt_target_start(const kt_target_args_t *args)
{
    kt_target_t tg = {.args = *args};
    char a[8][32], *argv[24];
    char owned[2] = {args->owned ? '1' : '0', '\0'};
    char listen_arg[KVX_ADDR_MAX];
    int sv[2], n = 0;

    fflush(NULL);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        KT_FAIL("socketpair: %s", strerror(errno));
    snprintf(a[0], sizeof(a[0]), "%d", sv[1]);
    snprintf(a[1], sizeof(a[1]), "%llu", (unsigned long long)args->num_blocks);
    snprintf(a[2], sizeof(a[2]), "%llu", (unsigned long long)args->block_len);
    snprintf(a[3], sizeof(a[3]), "%llu", (unsigned long long)args->salt);
    snprintf(a[4], sizeof(a[4]), "%u", args->threads);
    argv[n++] = (char *)KT_TARGET_BIN;
    argv[n++] = a[0];
    argv[n++] = a[1];
    argv[n++] = a[2];
    argv[n++] = a[3];
    argv[n++] = a[4];
    argv[n++] = (char *)(args->name ? args->name : "-");
    argv[n++] = (char *)(args->fingerprint ? args->fingerprint : "-");
    argv[n++] = (char *)(args->netns ? args->netns->ns[args->ns_index] : "-");
    argv[n++] = (char *)(args->netns ? args->netns->ifname[args->ns_index] : "-");
    argv[n++] = owned;
    snprintf(listen_arg, sizeof(listen_arg), "%s", args->listen ? args->listen : "-");
    argv[n++] = listen_arg;
    argv[n] = NULL;
    tg.proc.pid = fork();
    if (tg.proc.pid < 0)
        KT_FAIL("fork: %s", strerror(errno));
    if (tg.proc.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(120);
        fcntl(sv[1], F_SETFD, 0); /* the target's end survives exec */
        /* a test that must read what the target printed (KT_TARGET_STDERR names a file) */
        if (getenv("KT_TARGET_STDERR") != NULL) {
            int fd = open(getenv("KT_TARGET_STDERR"), O_WRONLY | O_CREAT | O_APPEND, 0600);
            if (fd >= 0 && fd != 2) {
                dup2(fd, 2);
                close(fd);
            }
        }
        execv(KT_TARGET_BIN, argv);
        _exit(127);
    }
    close(sv[1]);
    tg.proc.sock = sv[0];
    tg.md = kt_recv_alloc(tg.proc.sock, &tg.md_len);
    if (args->listen != NULL) {
        size_t got = kt_recv(tg.proc.sock, tg.listen_addr, sizeof(tg.listen_addr));
        KT_CHECK(got > 0 && tg.listen_addr[got - 1] == '\0');
    }
    return tg;
}

static uint64_t kt_target_cmd(kt_target_t *tg, const kt_cmd_t *cmd, const uint32_t *dst,
                              const uint32_t *src)
{
    size_t len = sizeof(*cmd) + 8ull * cmd->n;
    uint8_t *msg = malloc(len);
    uint64_t bad;

    KT_CHECK(msg != NULL);
    memcpy(msg, cmd, sizeof(*cmd));
    if (cmd->n) {
        memcpy(msg + sizeof(*cmd), dst, 4ull * cmd->n);
        memcpy(msg + sizeof(*cmd) + 4ull * cmd->n, src, 4ull * cmd->n);
    }
    kt_send(tg->proc.sock, msg, len);
    free(msg);
    kt_recv(tg->proc.sock, &bad, sizeof(bad));
    return bad;
}

uint64_t kt_target_verify(kt_target_t *tg, const uint32_t *dst, const uint32_t *src, size_t n,
                          uint64_t salt, uint64_t round)
{
    kt_cmd_t cmd = {.op = KT_CMD_VERIFY, .n = (uint32_t)n, .salt = salt, .round = round};
    return kt_target_cmd(tg, &cmd, dst, src);
}

void kt_target_refill(kt_target_t *tg, uint64_t round)
{
    kt_cmd_t cmd = {.op = KT_CMD_REFILL, .round = round};
    kt_target_cmd(tg, &cmd, NULL, NULL);
}

int kt_target_fence(kt_target_t *tg, const char *writer, const uint64_t *tags, uint32_t ntags)
{
    kt_cmd_t cmd = {.op = KT_CMD_FENCE, .n = ntags};
    size_t len = sizeof(cmd) + 64 + 8ull * ntags;
    uint8_t *msg = calloc(1, len);
    uint64_t r;

    KT_CHECK(msg != NULL);
    memcpy(msg, &cmd, sizeof(cmd));
    if (writer != NULL)
        snprintf((char *)msg + sizeof(cmd), 64, "%s", writer);
    if (ntags)
        memcpy(msg + sizeof(cmd) + 64, tags, 8ull * ntags);
    kt_send(tg->proc.sock, msg, len);
    free(msg);
    kt_recv(tg->proc.sock, &r, sizeof(r));
    return (int)r;
}

int kt_target_notices(kt_target_t *tg, kvx_notice_t *out, size_t max)
{
    kt_cmd_t cmd = {.op = KT_CMD_NOTICES};
    size_t len;
    uint8_t *buf;

    kt_send(tg->proc.sock, &cmd, sizeof(cmd));
    buf = kt_recv_alloc(tg->proc.sock, &len);
    KT_CHECK(len % sizeof(kvx_notice_t) == 0 && len / sizeof(kvx_notice_t) <= max);
    memcpy(out, buf, len);
    free(buf);
    return (int)(len / sizeof(kvx_notice_t));
}

void kt_target_progress(kt_target_t *tg, uint64_t ms)
{
    kt_cmd_t cmd = {.op = KT_CMD_PROGRESS, .round = ms};
    kt_target_cmd(tg, &cmd, NULL, NULL);
}

void kt_target_counters(kt_target_t *tg, kvx_recv_counters_t *out)
{
    kt_cmd_t cmd = {.op = KT_CMD_COUNTERS};
    kt_send(tg->proc.sock, &cmd, sizeof(cmd));
    kt_recv(tg->proc.sock, out, sizeof(*out));
}

uint32_t kt_target_add_region(kt_target_t *tg, uint64_t len, unsigned access, uint64_t salt,
                              uint8_t *blob, size_t *blob_len)
{
    kt_cmd_t cmd = {.op = KT_CMD_REGION, .n = access, .salt = salt, .round = len};
    uint8_t reply[8 + KVX_REGION_BLOB_MAX];
    size_t n;
    int32_t rc;
    uint32_t id;

    kt_send(tg->proc.sock, &cmd, sizeof(cmd));
    n = kt_recv(tg->proc.sock, reply, sizeof(reply));
    memcpy(&rc, reply, 4);
    memcpy(&id, reply + 4, 4);
    KT_OK(rc);
    memcpy(blob, reply + 8, n - 8);
    *blob_len = n - 8;
    return id;
}

int kt_target_deregister(kt_target_t *tg, uint32_t id)
{
    kt_cmd_t cmd = {.op = KT_CMD_DEREGION, .n = id};
    uint64_t r;
    kt_send(tg->proc.sock, &cmd, sizeof(cmd));
    kt_recv(tg->proc.sock, &r, sizeof(r));
    return (int)(int64_t)r;
}

void kt_target_region_counters(kt_target_t *tg, kvx_region_counters_t *out)
{
    kt_cmd_t cmd = {.op = KT_CMD_RCOUNTERS};
    kt_send(tg->proc.sock, &cmd, sizeof(cmd));
    kt_recv(tg->proc.sock, out, sizeof(*out));
}

uint64_t kt_target_canaries(kt_target_t *tg)
{
    kt_cmd_t cmd = {.op = KT_CMD_CANARIES};
    return kt_target_cmd(tg, &cmd, NULL, NULL);
}

void kt_target_info(kt_target_t *tg, uint64_t *base, uint64_t *canary)
{
    kt_cmd_t cmd = {.op = KT_CMD_INFO};
    uint64_t info[2];
    kt_send(tg->proc.sock, &cmd, sizeof(cmd));
    kt_recv(tg->proc.sock, info, sizeof(info));
    *base = info[0];
    *canary = info[1];
}

int kt_target_stop(kt_target_t *tg)
{
    kt_cmd_t cmd = {.op = KT_CMD_QUIT};
    kt_send(tg->proc.sock, &cmd, sizeof(cmd));
    free(tg->md);
    tg->md = NULL;
    return kt_wait(&tg->proc);
}

/* ---- index lists ---------------------------------------------------------------------------- */

void kt_indices(uint32_t *out, size_t n, uint64_t limit, bool scattered, uint64_t seed)
{
    uint32_t *unused = malloc(sizeof(uint32_t) * (n ? n : 1));

    KT_CHECK(n <= limit && unused != NULL);
    if (!scattered) {
        uint64_t start = limit == n ? 0 : seed % (limit - n + 1);
        for (size_t i = 0; i < n; i++)
            out[i] = (uint32_t)(start + i);
    } else {
        /* the benchmark's scattered map, rotated by seed: distinct, neighbours far apart */
        kvx_index_map(out, unused, n, limit, 0, 0, PAT_SCATTER, NULL);
        for (size_t i = 0; i < n; i++)
            out[i] = (uint32_t)((out[i] + seed) % limit);
    }
    free(unused);
}

/* ---- network namespaces --------------------------------------------------------------------- */

static kt_netns_t *kt_netns_live;
static pid_t kt_netns_owner;

static int kt_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int kt_sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    return system(cmd);
}

static void kt_netns_atexit(void)
{
    if (kt_netns_live != NULL && getpid() == kt_netns_owner)
        kt_netns_destroy(kt_netns_live);
}

/* Namespaces of earlier runs that were killed before cleaning up (named kvxt<pid>x). */
static void kt_netns_reap_stale(void)
{
    FILE *f = popen("ip netns list 2>/dev/null", "r");
    char line[256];
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        int pid;
        char tail;
        if (sscanf(line, "kvxt%d%c", &pid, &tail) == 2 && kill(pid, 0) < 0 && errno == ESRCH) {
            char name[64];
            sscanf(line, "%63s", name);
            kt_sh("ip netns del %s 2>/dev/null", name);
        }
    }
    pclose(f);
}

bool kt_netns_create(kt_netns_t *n)
{
    int pid = (int)getpid();

    memset(n, 0, sizeof(*n));
    if (geteuid() != 0 || kt_sh("command -v ip >/dev/null 2>&1") != 0)
        return false;
    kt_netns_reap_stale();
    for (int i = 0; i < 2; i++) {
        snprintf(n->ns[i], sizeof(n->ns[i]), "kvxt%d%c", pid, 'a' + i);
        snprintf(n->ifname[i], sizeof(n->ifname[i]), "kv%d%c", pid % 10000000, 'a' + i);
        snprintf(n->addr[i], sizeof(n->addr[i]), "10.231.0.%d", i + 1);
    }
    if (kt_sh("ip netns add %s 2>/dev/null", n->ns[0]) != 0)
        return false;
    if (kt_sh("ip netns add %s 2>/dev/null", n->ns[1]) != 0) {
        kt_sh("ip netns del %s", n->ns[0]);
        return false;
    }
    n->up = true;
    kt_netns_live = n;
    kt_netns_owner = getpid();
    atexit(kt_netns_atexit);
    if (kt_sh("ip link add %s netns %s type veth peer name %s netns %s", n->ifname[0], n->ns[0],
              n->ifname[1], n->ns[1]) != 0) {
        kt_netns_destroy(n);
        return false;
    }
    for (int i = 0; i < 2; i++) {
        if (kt_sh("ip -n %s addr add %s/24 dev %s && ip -n %s link set %s up && "
                  "ip -n %s link set lo up",
                  n->ns[i], n->addr[i], n->ifname[i], n->ns[i], n->ifname[i], n->ns[i]) != 0) {
            kt_netns_destroy(n);
            return false;
        }
    }
    /* the link reports UP a few milliseconds later; UCX skips devices that are down */
    for (int tries = 0; tries < 250; tries++) {
        if (kt_sh("ip -n %s link show %s | grep -q 'state UP' && "
                  "ip -n %s link show %s | grep -q 'state UP'",
                  n->ns[0], n->ifname[0], n->ns[1], n->ifname[1]) == 0)
            return true;
        usleep(20000);
    }
    kt_log("veth pair did not come up");
    kt_netns_destroy(n);
    return false;
}

void kt_netns_destroy(kt_netns_t *n)
{
    if (!n->up)
        return;
    /* deleting a namespace deletes the veth end inside it, and with it the pair */
    kt_sh("ip netns del %s 2>/dev/null", n->ns[0]);
    kt_sh("ip netns del %s 2>/dev/null", n->ns[1]);
    n->up = false;
    if (kt_netns_live == n)
        kt_netns_live = NULL;
}

void kt_netns_enter_named(const char *ns, const char *ifname)
{
    char path[128];
    int fd;

    snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        KT_FAIL("open %s: %s", path, strerror(errno));
    if (setns(fd, CLONE_NEWNET) < 0)
        KT_FAIL("setns %s: %s", path, strerror(errno));
    close(fd);
    /* UCX lists network devices in /sys/class/net: like `ip netns exec`, give this process its
     * own mount namespace with a sysfs of the new network namespace. */
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        umount2("/sys", MNT_DETACH) < 0 || mount("sysfs", "/sys", "sysfs", 0, NULL) < 0)
        KT_FAIL("remounting /sys in namespace %s: %s", ns, strerror(errno));
    /* UCX would also offer lo, which looks reachable from the other namespace but is not. */
    setenv("UCX_NET_DEVICES", ifname, 1);
}

void kt_netns_enter(const kt_netns_t *n, int i) { kt_netns_enter_named(n->ns[i], n->ifname[i]); }

struct kt_host_b {
    kt_netns_t *n;
    int (*fn)(void);
};

static int kt_host_b_main(int sock, void *arg)
{
    struct kt_host_b *h = arg;
    (void)sock;
    kt_netns_enter(h->n, 1);
    return h->fn();
}

int kt_two_hosts(kt_netns_t *n, kt_target_t *tg, kt_target_args_t *a, int (*host_b)(void),
                 unsigned timeout_s)
{
    struct kt_host_b h = {n, host_b};
    char listen[KVX_ADDR_MAX];
    kt_proc_t b;
    int rc, stop;

    if (!kt_netns_create(n)) {
        kt_log("cannot create network namespaces here: skipped");
        return KT_SKIP;
    }
    setenv("UCX_TLS", "tcp", 1);
    a->netns = n;
    a->ns_index = 0;
    if (a->listen != NULL) { /* at its own address there, any port */
        snprintf(listen, sizeof(listen), "%s:0", n->addr[0]);
        a->listen = listen;
    }
    *tg = kt_target_start(a);
    b = kt_spawn(kt_host_b_main, &h, timeout_s);
    rc = kt_wait(&b);
    kt_netns_link(n, true);
    stop = kt_target_stop(tg);
    kt_netns_destroy(n);
    if (rc != 0 || stop != 0)
        kt_log("host b exited with %d, host a with %d", rc, stop);
    return rc != 0 || stop != 0;
}

void kt_netns_link(const kt_netns_t *n, bool up)
{
    kt_sh("ip -n %s link set %s %s", n->ns[0], n->ifname[0], up ? "up" : "down");
}

size_t kt_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    size_t n = 0;

    KT_CHECK(d != NULL);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

size_t kt_count_maps(size_t *sysv_p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    size_t n = 0, sysv = 0;

    KT_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, " /SYSV") != NULL)
            sysv++;
        else
            n++;
    }
    fclose(f);
    *sysv_p = sysv;
    return n;
}

size_t kt_count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    size_t n = 0;
    int ch;

    KT_CHECK(f != NULL);
    while ((ch = fgetc(f)) != EOF)
        n += ch == '\n';
    fclose(f);
    return n;
}
