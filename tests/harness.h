/*
 * Test helpers: asserts that print both values, block patterns that encode (salt, block, round),
 * forked peer processes with a command channel, and network namespaces for two-host tests.
 * Exit codes: 0 pass, 1 fail, 77 skip.
 */
#ifndef KVX_TEST_HARNESS_H
#define KVX_TEST_HARNESS_H

#include "kvx.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#define KT_SKIP 77

#define KT_FAIL(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define KT_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            KT_FAIL("%s", #cond);                                                                  \
    } while (0)

/* Integer equality, both values printed. */
#define KT_EQ(a, b)                                                                                \
    do {                                                                                           \
        long long kt_a_ = (long long)(a), kt_b_ = (long long)(b);                                  \
        if (kt_a_ != kt_b_)                                                                        \
            KT_FAIL("%s == %s: %lld != %lld", #a, #b, kt_a_, kt_b_);                               \
    } while (0)

/* A kvx call that must succeed; prints the error name otherwise. */
#define KT_OK(expr)                                                                                \
    do {                                                                                           \
        int kt_rc_ = (expr);                                                                       \
        if (kt_rc_ < 0)                                                                            \
            KT_FAIL("%s: %d (%s)", #expr, kt_rc_, kvx_strerror(kt_rc_));                           \
    } while (0)

/* A kvx call that must fail with exactly err (negative). */
#define KT_ERR(expr, err)                                                                          \
    do {                                                                                           \
        int kt_rc_ = (expr), kt_want_ = (err);                                                     \
        if (kt_rc_ != kt_want_)                                                                    \
            KT_FAIL("%s: got %d (%s), want %d (%s)", #expr, kt_rc_, kvx_strerror(kt_rc_),          \
                    kt_want_, kvx_strerror(kt_want_));                                             \
    } while (0)

uint64_t kt_now_ns(void);
void kt_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- regions and patterns ------------------------------------------------------------------- */

typedef struct kt_region {
    uint8_t *base;
    uint64_t num_blocks;
    uint64_t block_len;
} kt_region_t;

kt_region_t kt_region_alloc(uint64_t num_blocks, uint64_t block_len);
void kt_region_free(kt_region_t *r);
/* Fill block idx with the pattern of (salt, src, round): src is the block index the data was
 * created for, so a block that travelled from src to dst still names its origin. */
void kt_fill(const kt_region_t *r, uint64_t idx, uint64_t salt, uint64_t src, uint64_t round);
void kt_fill_all(const kt_region_t *r, uint64_t salt, uint64_t round);
/* 0 if block idx holds the pattern of (salt, src, round), else the 1-based offending word. */
uint64_t kt_check(const kt_region_t *r, uint64_t idx, uint64_t salt, uint64_t src, uint64_t round);
/* The same for a read's block in the reader's own region, after the read's completion was polled
 * there: checked by ThreadSanitizer (kvx's lock orders the two), where kt_check is not. */
uint64_t kt_check_read(const kt_region_t *r, uint64_t idx, uint64_t salt, uint64_t src,
                       uint64_t round);

/* ---- transports ----------------------------------------------------------------------------- */

kvx_transport_t *kt_transport(const kt_region_t *r, const char *name, unsigned threads);
/* KT_RNDV=eager|auto|always (and KT_RNDV_THRESH=bytes) in the environment: the transports the
 * harness makes, targets included, move data that way (KVX_PARAM_RNDV). */
void kt_rndv_params(kvx_params_t *p);
/* KT_RNDV=always: every run goes by rendezvous, so UCX holds a write's sends until the receiver
 * takes the payload (a write to a stopped receiver that times out fails its connection). */
bool kt_rndv_forced(void);
kvx_transport_t *kt_transport_ex(const kt_region_t *r, const char *name, unsigned threads,
                                 const char *fingerprint, uint64_t deadline_ms);
/* Metadata of t in a malloc'd buffer. */
uint8_t *kt_metadata(kvx_transport_t *t, size_t *len);
/* Poll (peer_id may be NULL) until want completions arrived or timeout_ms passed; returns how
 * many were stored in out. Fails the test if an id shows up twice. */
int kt_poll_n(kvx_transport_t *t, const char *peer_id, kvx_completion_t *out, int want,
              int timeout_ms);

/* ---- forked peers --------------------------------------------------------------------------- */

typedef struct kt_proc {
    pid_t pid;
    int sock; /* the parent's end of a socketpair */
} kt_proc_t;

/* Fork a child running fn(sock, arg); its exit code is fn's return. The child dies with the
 * parent (PDEATHSIG) and after timeout_s seconds (alarm). */
kt_proc_t kt_spawn(int (*fn)(int sock, void *arg), void *arg, unsigned timeout_s);
int kt_wait(kt_proc_t *p); /* exit code, or 128 + signal */
void kt_kill(kt_proc_t *p, int sig);
/* SIGSTOP the child and wait until every one of its threads is stopped (kill() returns before
 * the signal has taken effect); kt_cont resumes it. */
void kt_stop(kt_proc_t *p);
void kt_cont(kt_proc_t *p);

/* Entries of a directory (/proc/self/fd: descriptors) and lines of a file (/proc/self/maps:
 * mappings) of this process, for leak checks. */
size_t kt_count_entries(const char *dir);
size_t kt_count_lines(const char *path);
/* Mappings of this process (/proc/self/maps) other than System V shared-memory segments, and
 * those in *sysv_p: UCX's shared-memory transports attach their peers' segments. */
size_t kt_count_maps(size_t *sysv_p);

/* Framed messages over a socket. */
void kt_send(int fd, const void *buf, size_t len);
size_t kt_recv(int fd, void *buf, size_t cap); /* fails the test on EOF */
uint8_t *kt_recv_alloc(int fd, size_t *len);

/*
 * The standard target: a child owning a region filled with (salt, i, round 0), exporting its
 * metadata, and serving commands from the test until told to quit. It never calls poll unless
 * asked to: what lands in its region lands through the progress thread.
 */
typedef struct kt_netns kt_netns_t;

typedef struct kt_target_args {
    uint64_t num_blocks;
    uint64_t block_len;
    uint64_t salt;
    unsigned threads;
    const char *name;
    const char *fingerprint;
    const kt_netns_t *netns; /* when set, the target runs inside namespace ns_index */
    int ns_index;
    bool owned; /* kvx allocates the region (KVX_PARAM_OWN_REGION); the canary is the rest of
                 * its last page (block_len * num_blocks should not be a multiple of 4096) */
    const char *listen; /* when set, it listens there (kvx_transport_listen); its address with
                         * the port it got is kt_target_t.listen_addr */
} kt_target_args_t;

int kt_target_main(int sock, void *arg);
/* Its own process image: tests/kt_target.c runs kt_target_main (see kt_target_start). */

typedef struct kt_target {
    kt_proc_t proc;
    uint8_t *md;
    size_t md_len;
    kt_target_args_t args;
    char listen_addr[KVX_ADDR_MAX]; /* with args.listen */
} kt_target_t;

kt_target_t kt_target_start(const kt_target_args_t *args);
/* Ask the target whether its block dst[i] holds the pattern (salt, src[i], round); returns the
 * number of bad blocks. */
uint64_t kt_target_verify(kt_target_t *tg, const uint32_t *dst, const uint32_t *src, size_t n,
                          uint64_t salt, uint64_t round);
/* Ask the target to refill every block with (its salt, i, round). */
void kt_target_refill(kt_target_t *tg, uint64_t round);
/* Ask the target to fence writer (NULL: every writer), with tags; returns kvx_fence's result. */
int kt_target_fence(kt_target_t *tg, const char *writer, const uint64_t *tags, uint32_t ntags);
/* The target's arrival notices waiting (kvx_notice_poll); returns how many (at most max). */
int kt_target_notices(kt_target_t *tg, kvx_notice_t *out, size_t max);
void kt_target_counters(kt_target_t *tg, kvx_recv_counters_t *out);
/* Ask a target without a progress thread to drive progress for ms milliseconds. */
void kt_target_progress(kt_target_t *tg, uint64_t ms);
/* Bytes of the canaries around the target's region (memory of the target outside the region)
 * that changed: 0 when untouched. */
uint64_t kt_target_canaries(kt_target_t *tg);
/* A region of len bytes (access: KVX_REGION_*) registered in the target, its bytes
 * (uint8_t)(salt + 7 * i), with canaries of its own (kt_target_canaries counts them too): its
 * id, and its blob in blob (KVX_REGION_BLOB_MAX bytes). The memory stays after deregistration. */
uint32_t kt_target_add_region(kt_target_t *tg, uint64_t len, unsigned access, uint64_t salt,
                              uint8_t *blob, size_t *blob_len);
int kt_target_deregister(kt_target_t *tg, uint32_t id); /* kvx_region_deregister's result */
void kt_target_region_counters(kt_target_t *tg, kvx_region_counters_t *out);
/* The target's region base and the canary size on each side of it. */
void kt_target_info(kt_target_t *tg, uint64_t *base, uint64_t *canary);
int kt_target_stop(kt_target_t *tg); /* exit code */

/* ---- index lists ---------------------------------------------------------------------------- */

/* n distinct indices in [0, limit): contiguous from start, or scattered by a fixed permutation. */
void kt_indices(uint32_t *out, size_t n, uint64_t limit, bool scattered, uint64_t seed);

/* ---- network namespaces --------------------------------------------------------------------- */

struct kt_netns {
    char ns[2][32];
    char ifname[2][16];
    char addr[2][16];
    bool up;
};

/* Two namespaces joined by a veth pair (10.231.x.1/24 and .2). Returns false (and leaves nothing
 * behind) when namespaces cannot be made here. Removed by kt_netns_destroy and at exit. */
bool kt_netns_create(kt_netns_t *n);
void kt_netns_destroy(kt_netns_t *n);
/* Move the calling process into namespace i (0 or 1), with a mount namespace of its own whose
 * /sys shows that namespace's devices (UCX reads them there). Call it in a child process only:
 * from a private mount namespace, kt_netns_destroy could not remove the namespaces. */
void kt_netns_enter(const kt_netns_t *n, int i);
void kt_netns_enter_named(const char *ns, const char *ifname);
/*
 * The two-host skeleton: make the namespaces (KT_SKIP when impossible), limit UCX to tcp, start
 * the target described by a in namespace 0 (into *tg), run host_b in a child in namespace 1 (it
 * inherits *tg, channel included), then stop everything and delete the namespaces. Returns the
 * test's exit code.
 */
/* With a->listen set, the target listens at its address in namespace 0, on any port. */
int kt_two_hosts(kt_netns_t *n, kt_target_t *tg, kt_target_args_t *a, int (*host_b)(void),
                 unsigned timeout_s);
/* Take the link down or up from the root namespace side. */
void kt_netns_link(const kt_netns_t *n, bool up);

#endif /* KVX_TEST_HARNESS_H */
