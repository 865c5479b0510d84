/*
 * kvx's leaves, the lowest layer (src/README.md): what every file may use. Lists, tables by name
 * (names.c), little-endian fields, the clock, errors and logging (error.c, log.c), checksums
 * (checksum.c), SHA-256 and HMAC (auth.c), same-host peers (host.c), the rendezvous choice
 * (rndv.c). No transport state.
 */
#ifndef KVX_BASE_H
#define KVX_BASE_H

#include "kvx.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

/* ---- intrusive circular list ---------------------------------------------------------------- */

typedef struct kvx_list {
    struct kvx_list *prev, *next;
} kvx_list_t;

static inline void kvx_list_init(kvx_list_t *h) { h->prev = h->next = h; }
static inline bool kvx_list_empty(const kvx_list_t *h) { return h->next == h; }
static inline bool kvx_list_linked(const kvx_list_t *n) { return n->next != NULL && n->next != n; }
static inline void kvx_list_add_tail(kvx_list_t *h, kvx_list_t *n)
{
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}
static inline void kvx_list_del(kvx_list_t *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}
/* Move every node of from onto the empty list to; from becomes empty. */
static inline void kvx_list_splice_init(kvx_list_t *from, kvx_list_t *to)
{
    if (kvx_list_empty(from)) {
        kvx_list_init(to);
        return;
    }
    to->next = from->next;
    to->prev = from->prev;
    to->next->prev = to;
    to->prev->next = to;
    kvx_list_init(from);
}
/* FNV-1a of a string: the hash of the tables by name (peers, writers). */
static inline size_t kvx_hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;

    while (*s) {
        h ^= (unsigned char)*s++;
        h *= 1099511628211ull;
    }
    return (size_t)h;
}

#define kvx_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#define kvx_list_first(h, type, member) kvx_container_of((h)->next, type, member)

/* ---- a table of entries by name (names.c) ---------------------------------------------------- */

/* A node inside an entry, and the name it goes by (the entry's own, alive while it is listed). */
typedef struct kvx_named {
    struct kvx_named *next;
    const char *name;
} kvx_named_t;
typedef struct kvx_names {
    kvx_named_t **slots;
    size_t cap, n; /* slots, entries */
} kvx_names_t;

int kvx_names_add(kvx_names_t *t, kvx_named_t *e); /* 0, or -ENOMEM (not added) */
kvx_named_t *kvx_names_find(const kvx_names_t *t, const char *name);
void kvx_names_del(kvx_names_t *t, kvx_named_t *e);
/* Every entry in turn: the first with e NULL and *slot 0, then the one after e; NULL at the end.
 * e may be deleted or freed once the one after it is taken. */
kvx_named_t *kvx_names_next(const kvx_names_t *t, size_t *slot, const kvx_named_t *e);
/* The entry whose node is e (member of type), or NULL. */
static inline void *kvx_named_at(const kvx_named_t *e, size_t off)
{
    return e != NULL ? (char *)e - off : NULL;
}
#define kvx_named_entry(e, type, member) ((type *)kvx_named_at((e), offsetof(type, member)))
void kvx_names_fini(kvx_names_t *t); /* the slots; the entries stay their owners' */

/* ---- little-endian fields of what crosses the wire --------------------------------------- */

static inline void kvx_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void kvx_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvx_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kvx_get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t kvx_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t kvx_get64(const uint8_t *p)
{
    return (uint64_t)kvx_get32(p) | (uint64_t)kvx_get32(p + 4) << 32;
}

/* A piece of memory (the layout of UCX's ucp_dt_iov_t: ucx_int.h checks it). */
typedef struct kvx_iov {
    void *base;
    size_t len;
} kvx_iov_t;

/* ---- the clock, logging (log.c) ------------------------------------------------------------ */

static inline uint64_t kvx_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
/* How a transport logs: every layer's state that logs holds one (the core's is the transport's,
 * the backend has a copy), and the logging macros take that state: kvx_info(core, ...) logs
 * through core->log. With no logger (NULL), kvx_log uses the process-wide sink. */
typedef struct kvx_logger {
    kvx_log_fn fn; /* own: the transport's own sink (NULL: stderr), else the process default */
    void *arg;
    int level;
    bool own;
    char name[KVX_NAME_MAX + 1]; /* the transport's name (its agent name): it prefixes its lines */
} kvx_logger_t;

void kvx_log(const kvx_logger_t *lg, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define kvx_error(o, ...) kvx_log(&(o)->log, KVX_LOG_ERROR, __VA_ARGS__)
#define kvx_warn(o, ...) kvx_log(&(o)->log, KVX_LOG_WARN, __VA_ARGS__)
#define kvx_info(o, ...) kvx_log(&(o)->log, KVX_LOG_INFO, __VA_ARGS__)
#define kvx_debug(o, ...) kvx_log(&(o)->log, KVX_LOG_DEBUG, __VA_ARGS__)

/* Who a transport is: same kernel (boot id) and pid namespace means a peer's pid names the same
 * process here (host.c). */
typedef struct kvx_host_id {
    uint8_t boot_id[16]; /* zero: unknown */
    uint64_t pid_ns;
    uint64_t start_time; /* clock ticks after boot, as /proc/<pid>/stat says */
    uint32_t pid;
} kvx_host_id_t;

/* ---- same-host peers (host.c) --------------------------------------------------------------- */

void kvx_host_self(kvx_host_id_t *id);
/* Start watching a peer's process: 1 (same host: *pidfd_p set, or -1 to fall back on /proc),
 * 0 (another host, or unknown: UCX's keepalive watches it), -EHOSTUNREACH (already gone). */
int kvx_host_watch(const kvx_host_id_t *self, const kvx_host_id_t *peer, int *pidfd_p);
bool kvx_host_alive(const kvx_host_id_t *peer, int pidfd);

/* ---- checksums and authentication (checksum.c, auth.c) -------------------------------------- */

uint32_t kvx_crc32(const void *buf, size_t len);
uint32_t kvx_crc32_parts(const kvx_iov_t *parts, size_t n);
uint32_t kvx_crc32c(const void *buf, size_t len);
uint32_t kvx_crc32c_parts(const kvx_iov_t *parts, size_t n);
void kvx_sha256(const void *data, size_t len, uint8_t out[32]);
void kvx_hmac_sha256(const void *key, size_t key_len, const kvx_iov_t *parts, size_t n,
                     uint8_t out[32]);
bool kvx_equal_ct(const void *a, const void *b, size_t len);

/* ---- how a connection's runs travel (rndv.c) ------------------------------------------------ */

/* The rendezvous threshold on a zero-copy lane when neither the application (rndv_thresh) nor UCX
 * says one: UCX's own never goes below the lane's eager segment (ucp_ep.c takes the larger of its
 * estimate and the lane's am.max_bcopy), 8 KiB by default on the verbs transports. */
#define KVX_RNDV_ZCOPY_MIN ((uint64_t)8192)

typedef struct kvx_rndv_in {
    int mode;               /* this transport's kvx_rndv_mode */
    uint64_t thresh;        /* ... and its rndv_thresh (0: none set) */
    bool peer_takes;        /* the peer said in the handshake that it takes rendezvous payloads */
    const char *rndv_lanes; /* the endpoint's rendezvous lanes ("" : none), kvx_lanes_t */
    const char *am_lanes;   /* ... its active-message lanes */
    uint64_t ucx_rndv;      /* UCX's own threshold for the endpoint (UINT64_MAX: not said) */
    const char *ucx_proto;  /* ... and UCX's name for the protocol ("": not said) */
} kvx_rndv_in_t;

/* Whether a transport's name (len bytes) is one whose rendezvous UCX moves by zero-copy RMA, and
 * whether every one of a ','-joined list is (false for an empty list). */
bool kvx_rndv_lane_zcopy(const char *name, size_t len);
bool kvx_rndv_lanes_zcopy(const char *lanes);
/* Whether UCX's rendezvous on those lanes is zero-copy RMA: every rendezvous lane is one, and
 * UCX (1.14 and later) names no protocol that is not "zero-copy". */
bool kvx_rndv_zcopy(const kvx_rndv_in_t *in);
/* The smallest run that goes by rendezvous on a connection (UINT64_MAX: every run in eager
 * messages), and why, in words for the debug log: KVX_RNDV_EAGER or a peer that takes no
 * rendezvous payloads, none; KVX_RNDV_ALWAYS, runs of rndv_thresh and more (every run with 0);
 * KVX_RNDV_AUTO, none unless every rendezvous lane is a zero-copy one, then runs of rndv_thresh
 * (when set), else of UCX's own threshold (when it says one), else of KVX_RNDV_ZCOPY_MIN. */
uint64_t kvx_rndv_choose(const kvx_rndv_in_t *in, char *why, size_t why_len);

#endif /* KVX_BASE_H */
