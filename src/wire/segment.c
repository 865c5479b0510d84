/*
 * Owned regions: what a System V segment must be, and hold, before a peer's region is mapped and
 * copied into. No UCX here (ucx_mem.c unpacks the key and gives the pointer), so that the decision
 * is fuzzed on its own (tests/fuzz/fuzz_owned.c).
 *
 * The owner's segment holds the region from its first byte, and its last KVX_SEG_TRAILER_LEN
 * bytes are a trailer the owner writes at creation (the region and the trailer never share a
 * page: the owner asks for one page more than the region's pages). Little-endian:
 *    0 u8[8] "KVXSEG01"   8 u64 the region's length   16 u8[16] segment token (random)
 *   32 u8[32] zero
 * The owner sends the token in its HELLO_ACK; a writer copies into the mapping only once the
 * token it read from the segment's trailer equals the one the connection brought.
 * The trailer sits at the segment's end, which the kernel reports, not at an offset the
 * metadata could choose: a forged block count cannot aim the token read at other bytes.
 */
#include "wire/kvx_wire.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/shm.h>
#include <unistd.h>

static const uint8_t kvx_seg_magic[8] = {'K', 'V', 'X', 'S', 'E', 'G', '0', '1'};

int kvx_seg_lookup(uintptr_t p, kvx_seg_info_t *s)
{
    FILE *f = fopen("/proc/self/maps", "re");
    char line[512];
    int rc = -ENOENT;

    memset(s, 0, sizeof(*s));
    s->shmid = -1;
    if (f == NULL)
        return -errno;
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi, off, inode;
        unsigned dmaj, dmin;
        char perms[8];
        struct shmid_ds ds;
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &dmaj, &dmin,
                   &inode) != 7 ||
            p < lo || p >= hi)
            continue;
        s->lo = lo;
        s->hi = hi;
        s->off = off;
        s->rw_shared = perms[0] == 'r' && perms[1] == 'w' && perms[3] == 's';
        /* a System V mapping's inode is its segment id; IPC_STAT says who made it, how large */
        if (strstr(line, "/SYSV") != NULL && inode <= INT32_MAX &&
            shmctl((int)inode, IPC_STAT, &ds) == 0) {
            s->sysv = true;
            s->shmid = (int)inode;
            s->cpid = (int64_t)ds.shm_cpid;
            s->segsz = (uint64_t)ds.shm_segsz;
        }
        rc = 0;
        break;
    }
    fclose(f);
    return rc;
}

/*
 * The segments of the owned regions this process's transports allocated: the only segments of
 * its own that this process maps (a writer and an owner may share a process). Its other
 * segments (UCX's receive FIFOs and pools among them) are never copied into. Entries name the
 * process that listed them: a forked child lists its own.
 */
static pthread_mutex_t kvx_seg_own_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kvx_seg_own {
    pid_t pid;
    int shmid;
} * kvx_seg_own;
static size_t kvx_seg_nown, kvx_seg_own_cap;

int kvx_seg_own_add(int shmid)
{
    int rc = 0;

    pthread_mutex_lock(&kvx_seg_own_lock);
    if (kvx_seg_nown == kvx_seg_own_cap) {
        size_t cap = kvx_seg_own_cap ? 2 * kvx_seg_own_cap : 4;
        struct kvx_seg_own *n = realloc(kvx_seg_own, cap * sizeof(*n));
        if (n == NULL) {
            rc = -ENOMEM;
            goto out;
        }
        kvx_seg_own = n;
        kvx_seg_own_cap = cap;
    }
    kvx_seg_own[kvx_seg_nown++] = (struct kvx_seg_own){getpid(), shmid};
out:
    pthread_mutex_unlock(&kvx_seg_own_lock);
    return rc;
}

void kvx_seg_own_del(int shmid)
{
    pid_t self = getpid();

    pthread_mutex_lock(&kvx_seg_own_lock);
    for (size_t i = 0; i < kvx_seg_nown; i++)
        if (kvx_seg_own[i].pid == self && kvx_seg_own[i].shmid == shmid) {
            kvx_seg_own[i] = kvx_seg_own[--kvx_seg_nown];
            break;
        }
    if (kvx_seg_nown == 0) { /* the last one went: nothing of the list stays allocated */
        free(kvx_seg_own);
        kvx_seg_own = NULL;
        kvx_seg_own_cap = 0;
    }
    pthread_mutex_unlock(&kvx_seg_own_lock);
}

bool kvx_seg_own_has(int shmid)
{
    pid_t self = getpid();
    bool found = false;

    pthread_mutex_lock(&kvx_seg_own_lock);
    for (size_t i = 0; i < kvx_seg_nown && !found; i++)
        found = kvx_seg_own[i].pid == self && kvx_seg_own[i].shmid == shmid;
    pthread_mutex_unlock(&kvx_seg_own_lock);
    return found;
}

int kvx_seg_check(const kvx_seg_info_t *s, uint64_t p, uint64_t len, uint32_t owner, uint32_t self,
                  bool own_region, const char **why)
{
    if (!s->sysv) {
        *why = "not a System V segment";
        return -EOPNOTSUPP;
    }
    if (s->cpid == (int64_t)self && !own_region) {
        *why = "a segment of this process that is no owned region of its transports";
        return -EPERM;
    }
    if (s->cpid != (int64_t)owner || owner == 0) {
        *why = "a segment another process created than the one the metadata names";
        return -EPERM;
    }
    if (!s->rw_shared || p != s->lo || s->off != 0) {
        *why = "the region does not start the segment";
        return -EPERM;
    }
    if (len == 0 || s->segsz < KVX_SEG_TRAILER_LEN || len > s->segsz - KVX_SEG_TRAILER_LEN ||
        s->segsz > s->hi - s->lo) {
        *why = "the segment does not hold the region and its trailer";
        return -EPERM;
    }
    return 0;
}

void kvx_seg_trailer_put(uint8_t *tr, uint64_t region_len, const uint8_t *token)
{
    memcpy(tr, kvx_seg_magic, 8);
    kvx_put64(tr + 8, region_len);
    memcpy(tr + 16, token, KVX_SEG_TOKEN_LEN);
    memset(tr + 32, 0, KVX_SEG_TRAILER_LEN - 32);
}

int kvx_seg_trailer_get(const uint8_t *tr, uint64_t len, uint8_t *token, const char **why)
{
    static const uint8_t zero[KVX_SEG_TRAILER_LEN];

    if (memcmp(tr, kvx_seg_magic, 8) != 0 || memcmp(tr + 32, zero, KVX_SEG_TRAILER_LEN - 32)) {
        *why = "the segment holds no kvx trailer";
        return -EPERM;
    }
    if (len > kvx_get64(tr + 8)) {
        *why = "the metadata claims more than the owner's region";
        return -EPERM;
    }
    if (memcmp(tr + 16, zero, KVX_SEG_TOKEN_LEN) == 0) {
        *why = "the segment's token is zero";
        return -EPERM;
    }
    memcpy(token, tr + 16, KVX_SEG_TOKEN_LEN);
    return 0;
}

bool kvx_seg_token_ok(const uint8_t *want, const uint8_t *got)
{
    static const uint8_t zero[KVX_SEG_TOKEN_LEN];

    /* the zero token is what a transport whose region is not owned sends; both comparisons run
     * whatever the first says */
    bool zero_want = kvx_equal_ct(want, zero, KVX_SEG_TOKEN_LEN);
    bool same = kvx_equal_ct(want, got, KVX_SEG_TOKEN_LEN);

    return !zero_want && same;
}
