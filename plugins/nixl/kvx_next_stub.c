/*
 * The draft API of kvx_next.h, every call failing with -ENOSYS: linked into libplugin_KVX.so only
 * while libkvx lacks those symbols, so that the plugin links (-Wl,--no-undefined) and NIXL can load
 * it (a compile-and-load check). Such a plugin creates no engine (kvx_transport_create refuses a
 * transport without a region), is never installed, and the KVX tests skip. Not part of libkvx.
 */
#include <errno.h>

#include "kvx_next.h"

#ifdef KVX_NIXL_DRAFT_API
int kvx_region_register(kvx_transport_t *t, void *base, uint64_t len,
                        const kvx_region_params_t *params, uint32_t *region_p)
{
    (void)t, (void)base, (void)len, (void)params, (void)region_p;
    return -ENOSYS;
}

int kvx_region_deregister(kvx_transport_t *t, uint32_t region)
{
    (void)t, (void)region;
    return -ENOSYS;
}

int kvx_region_blob(kvx_transport_t *t, uint32_t region, void *buf, size_t *len_p)
{
    (void)t, (void)region, (void)buf, (void)len_p;
    return -ENOSYS;
}

int kvx_region_load(kvx_transport_t *t, const char *peer_id, const void *blob, size_t len,
                    uint32_t *handle_p)
{
    (void)t, (void)peer_id, (void)blob, (void)len, (void)handle_p;
    return -ENOSYS;
}

int kvx_region_unload(kvx_transport_t *t, const char *peer_id, uint32_t handle)
{
    (void)t, (void)peer_id, (void)handle;
    return -ENOSYS;
}

int kvx_xfer_write_ranges(kvx_transport_t *t, const char *peer_id, const kvx_range_t *ranges,
                          size_t count, const kvx_xfer_params_t *params, uint64_t *id_p)
{
    (void)t, (void)peer_id, (void)ranges, (void)count, (void)params, (void)id_p;
    return -ENOSYS;
}

int kvx_xfer_read_ranges(kvx_transport_t *t, const char *peer_id, const kvx_range_t *ranges,
                         size_t count, const kvx_xfer_params_t *params, uint64_t *id_p)
{
    (void)t, (void)peer_id, (void)ranges, (void)count, (void)params, (void)id_p;
    return -ENOSYS;
}

int kvx_notice_send(kvx_transport_t *t, const char *peer_id, const void *data, size_t len)
{
    (void)t, (void)peer_id, (void)data, (void)len;
    return -ENOSYS;
}

int kvx_notice_poll_data(kvx_transport_t *t, kvx_notice_data_t *out, size_t max, void *buf,
                         size_t cap)
{
    (void)t, (void)out, (void)max, (void)buf, (void)cap;
    return -ENOSYS;
}
#endif
