/*
 * The region calls (kvx.h, "Regions and ranges"): register, deregister (the fence), blob, load,
 * unload, and the range transfers. This first version declares them only: each returns -ENOSYS.
 */
#include "api/transport.h"

#include <errno.h>

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
