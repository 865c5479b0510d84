/*
 * The notice calls of kvx_next.h, each failing with -ENOSYS: linked into libplugin_KVX.so only
 * while include/kvx.h does not declare them (libkvx then lacks the symbols), so that the plugin
 * links (-Wl,--no-undefined) and works without notifications. Not part of libkvx.
 */
#include <errno.h>

#include "kvx_next.h"

#ifdef KVX_NIXL_DRAFT_NOTICES
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
