/*
 * The UCX backend's memory: the owned region UCX allocates (and its segment token), and a peer's
 * owned region mapped into this process through its packed key.
 */
#include "ucx/ucx_int.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static bool kvx_ucx_shared_mapping(uintptr_t p, uint64_t len);

/*
 * The owner's half of the segment proof (segment.c): a fresh random token in the trailer at the
 * end of the region's System V segment, which every HELLO_ACK also carries (recv/hello.c). Without
 * such a segment the token stays zero and no peer maps the region.
 */
static void kvx_ucx_seg_token(kvx_ucx_t *u, uint8_t *base, size_t len, uint8_t *seg_token)
{
    uint8_t token[KVX_SEG_TOKEN_LEN] = {0};
    kvx_seg_info_t s;

    memset(seg_token, 0, KVX_SEG_TOKEN_LEN);
    if (kvx_seg_lookup((uintptr_t)base, &s) < 0 || !s.sysv || s.lo != (uintptr_t)base ||
        s.off != 0 || s.segsz < KVX_SEG_TRAILER_LEN || s.segsz - KVX_SEG_TRAILER_LEN < len ||
        s.segsz > s.hi - s.lo) {
        kvx_info(u, "ucx: the owned region is not a System V segment of its own: peers on this "
                    "host use messages");
        return;
    }
    while (kvx_equal_ct(token, seg_token, sizeof(token)))
        if (getrandom(token, sizeof(token), 0) != (ssize_t)sizeof(token)) {
            kvx_warn(u, "ucx: no random segment token (%m): peers on this host use messages");
            return;
        }
    if (kvx_seg_own_add(s.shmid) < 0) {
        kvx_warn(u, "ucx: no memory to list the owned region's segment: peers use messages");
        return;
    }
    u->seg_id = s.shmid;
    u->seg_listed = true;
    kvx_seg_trailer_put(base + s.segsz - KVX_SEG_TRAILER_LEN, len, token);
    memcpy(seg_token, token, sizeof(token));
}

/*
 * Allocate len bytes through UCX (ucp_mem_map with UCP_MEM_MAP_ALLOCATE): UCX takes them from
 * shared memory (sysv, else posix) when it can, so that a peer on this host that unpacks the
 * packed key maps the same pages. One page more than the region's holds the segment's trailer
 * (kvx_ucx_seg_token); the region and the block count peers see are len bytes. The packed key
 * goes into the metadata. When UCX could only give private memory (no shared-memory transport),
 * the region works all the same, peers use messages, and its contents start unspecified (logged).
 */
int kvx_ucx_region_alloc(kvx_ucx_t *u, size_t len, void **base_p, const void **rkey_p,
                         size_t *rkey_len_p, uint8_t *seg_token)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    ucs_status_t s;

    memset(seg_token, 0, KVX_SEG_TOKEN_LEN); /* none unless kvx_ucx_seg_token sets one */
    if (len > SIZE_MAX - 2 * page)
        return -ENOMEM;
    mp.length = (len + page - 1) / page * page + page;
    s = ucp_mem_map(u->ctx, &mp, &u->region);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: allocating a region of %zu bytes: %s", len, ucs_status_string(s));
        u->region = NULL;
        return s == UCS_ERR_NO_MEMORY ? -ENOMEM : kvx_ucx_errno(s);
    }
    s = ucp_mem_query(u->region, &attr);
    if (s == UCS_OK && attr.length < mp.length)
        s = UCS_ERR_NO_MEMORY;
    if (s == UCS_OK)
        s = ucp_rkey_pack(u->ctx, u->region, &u->rkey, &u->rkey_len);
    if (s != UCS_OK) {
        kvx_error(u, "ucx: the owned region: %s", ucs_status_string(s));
        kvx_ucx_region_free(u);
        return -ENOMEM;
    }
    if (!kvx_ucx_shared_mapping((uintptr_t)attr.address, len))
        kvx_info(u, "ucx: the owned region is private memory (no shared-memory transport): peers "
                    "use messages, its contents start unspecified");
    else
        kvx_ucx_seg_token(u, attr.address, len, seg_token);
    *base_p = attr.address;
    *rkey_p = u->rkey;
    *rkey_len_p = u->rkey_len;
    return 0;
}

void kvx_ucx_region_free(kvx_ucx_t *u)
{
    if (u->rkey != NULL)
        ucp_rkey_buffer_release(u->rkey);
    u->rkey = NULL;
    u->rkey_len = 0;
    if (u->seg_listed)
        kvx_seg_own_del(u->seg_id);
    u->seg_listed = false;
    if (u->region != NULL)
        ucp_mem_unmap(u->ctx, u->region);
    u->region = NULL;
}

/* Whether [p, p + len) lies inside one shared mapping of this process (a System V segment or a
 * POSIX shared memory file), read from /proc/self/maps: ucp_rkey_ptr is plain arithmetic and
 * checks no bound, so the peer's num_blocks alone must not decide how far kvx copies. */
static bool kvx_ucx_shared_mapping(uintptr_t p, uint64_t len)
{
    FILE *f = fopen("/proc/self/maps", "re");
    char line[512];
    bool ok = false;

    if (f == NULL)
        return false;
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || p < lo || p >= hi)
            continue;
        ok = perms[0] == 'r' && perms[1] == 'w' && perms[3] == 's' && len <= hi - p &&
             (strstr(line, "/SYSV") != NULL || strstr(line, "/dev/shm/") != NULL);
        break;
    }
    fclose(f);
    return ok;
}

/*
 * Map a peer's owned region into this process: unpack its key on the endpoint and ask UCX for a
 * pointer to raddr (ucp_rkey_ptr: only a shared-memory key gives one). UCX attaches whatever
 * segment the key's id names and offsets into it without a check, so kvx asks the kernel what
 * the pointer is (segment.c): the start of a System V segment that the peer's process (owner,
 * its pid here) created, holding len bytes and the owner's trailer after them; a segment this
 * process created only if it is an owned region of a transport of this process. Returns 0 with
 * *ptr_p and the trailer's token in token_p; -EOPNOTSUPP when the key gives no usable mapping
 * (another host's key, a POSIX one); -EPERM when it names a segment kvx refuses (logged as a
 * warning). The caller copies nothing into *ptr_p until the peer's HELLO_ACK brings that token
 * (kvx_conn_map_prove).
 */
int kvx_ucx_map(kvx_ucx_ep_t *e, const void *rkey, size_t rkey_len, uint64_t raddr, uint64_t len,
                uint32_t owner, void **ptr_p, uint8_t *token_p)
{
    const char *why = "nothing is mapped there";
    kvx_seg_info_t seg;
    void *first = NULL;
    ucs_status_t s;
    int rc;

    (void)rkey_len; /* UCX takes none: the metadata's signature is what vouches for the key */
    if (e == NULL || e->ep == NULL || e->rkey != NULL || len == 0)
        return -EINVAL;
    s = ucp_ep_rkey_unpack(e->ep, rkey, &e->rkey);
    if (s != UCS_OK) {
        e->rkey = NULL;
        kvx_debug(e->u, "ucx: the peer's region key: %s", ucs_status_string(s));
        return -EOPNOTSUPP;
    }
    s = ucp_rkey_ptr(e->rkey, raddr, &first);
    if (s != UCS_OK) {
        kvx_info(e->u, "ucx: the peer's region gives no mapping here: %s", ucs_status_string(s));
        kvx_ucx_unmap(e);
        return -EOPNOTSUPP;
    }
    rc = kvx_seg_lookup((uintptr_t)first, &seg) < 0 ? -EOPNOTSUPP : 0;
    if (rc == 0)
        rc = kvx_seg_check(&seg, (uintptr_t)first, len, owner, (uint32_t)getpid(),
                           seg.sysv && kvx_seg_own_has(seg.shmid), &why);
    if (rc == 0)
        rc = kvx_seg_trailer_get((uint8_t *)first + seg.segsz - KVX_SEG_TRAILER_LEN, len, token_p,
                                 &why);
    if (rc < 0) {
        if (rc == -EPERM)
            kvx_warn(e->u, "ucx: the peer's region key names a segment kvx does not map (%s)", why);
        else
            kvx_info(e->u, "ucx: the peer's region gives no mapping of %llu bytes here (%s)",
                     (unsigned long long)len, why);
        kvx_ucx_unmap(e);
        return rc;
    }
    *ptr_p = first;
    return 0;
}

void kvx_ucx_unmap(kvx_ucx_ep_t *e)
{
    if (e == NULL || e->rkey == NULL)
        return;
    ucp_rkey_destroy(e->rkey);
    e->rkey = NULL;
}
