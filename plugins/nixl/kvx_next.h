/*
 * DRAFT: the part of kvx's C API the NIXL plugin uses that include/kvx.h does not declare yet:
 * notices with a payload (NIXL's notifications: kvx_notice_send, kvx_notice_poll_data, a
 * transfer's KVX_XFER_PARAM_NOTICE_DATA), being built in the core. Everything else (regions,
 * their blobs, range transfers) the plugin takes from kvx.h. While kvx.h lacks the notices,
 * CMake links kvx_next_stub.c (both calls -ENOSYS) and the plugin answers NIXL's notification
 * calls with NIXL_ERR_NOT_SUPPORTED; this header and the stub go away once the core has them.
 */
#ifndef KVX_NIXL_KVX_NEXT_H
#define KVX_NIXL_KVX_NEXT_H

#include "kvx.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KVX_NOTICE_DATA_MAX /* the core's kvx.h does not declare them yet */
#define KVX_NIXL_DRAFT_NOTICES 1

/* ---- Notices with a payload (NIXL notifications) -------------------------------------------- */

/** KVX_NOTICE_DATA_MAX: the largest payload, in bytes. */
#define KVX_NOTICE_DATA_MAX (1u << 20)

/* kvx_xfer_params_t gains KVX_XFER_PARAM_NOTICE_DATA with a payload: not drafted here, the
 * plugin refuses a transfer's notification until kvx.h has it. */

/** A standalone notice with a payload to a peer (NIXL's genNotif): 0 once queued, -ENOENT,
 *  -EINVAL (len 0 or over KVX_NOTICE_DATA_MAX), -ENOTCONN, -ESHUTDOWN. */
KVX_API int kvx_notice_send(kvx_transport_t *transport, const char *peer_id, const void *data,
                            size_t len);

/** A notice with its payload (kvx_notice_poll_data): the writer's agent name, the transfer id
 *  (0 for kvx_notice_send's), and data_len bytes of payload copied into the caller's buffer. */
typedef struct kvx_notice_data {
    char writer[KVX_NAME_MAX + 1];
    uint64_t xfer_id;
    uint64_t tag;
    size_t data_len;
    void *data; /* points into the buf given to kvx_notice_poll_data */
} kvx_notice_data_t;
/** Take up to max notices with payloads, their payloads copied into buf (cap bytes): how many,
 *  or -ENOSPC when the oldest one's payload alone does not fit (nothing taken). */
KVX_API int kvx_notice_poll_data(kvx_transport_t *transport, kvx_notice_data_t *out, size_t max,
                                 void *buf, size_t cap);

#endif /* KVX_NOTICE_DATA_MAX */

#ifdef __cplusplus
}
#endif

#endif /* KVX_NIXL_KVX_NEXT_H */
