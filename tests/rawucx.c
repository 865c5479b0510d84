/* The bare UCX program of the tests (rawucx.h). */
#include "rawucx.h"

#include "harness.h"

#include <stdlib.h>
#include <string.h>

void kt_rawucx_put(ucp_config_t *cfg, bool on)
{
    unsigned major, minor, release;

    ucp_get_version(&major, &minor, &release);
    /* UCX 1.13 takes the key without tcp's prefix, later versions with it */
    KT_CHECK(ucp_config_modify(cfg, major == 1 && minor <= 13 ? "PUT_ENABLE" : "TCP_PUT_ENABLE",
                               on ? "y" : "n") == UCS_OK);
}

ucp_context_h kt_rawucx_context(uint64_t features)
{
    const char *tls = getenv("UCX_TLS");
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = features};
    ucp_config_t *cfg;
    ucp_context_h ctx;

    KT_CHECK(ucp_config_read(NULL, NULL, &cfg) == UCS_OK);
    if (tls == NULL || strstr(tls, "sm") != NULL || strstr(tls, "sysv") != NULL ||
        strstr(tls, "posix") != NULL) {
        ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y");
        ucp_config_modify(cfg, "MM_SEG_SIZE", "32k");
        ucp_config_modify(cfg, "MM_FIFO_SIZE", "128");
    }
    /* tcp's zero-copy PUT off, as kvx has it (src/ucx/config.c): a listener with it on fails an
     * assertion in UCX's wire-up when a peer with it off connects (test_pair_close) */
    kt_rawucx_put(cfg, false);
    KT_CHECK(ucp_init(&pp, cfg, &ctx) == UCS_OK);
    ucp_config_release(cfg);
    return ctx;
}

ucp_worker_h kt_rawucx_worker(ucp_context_h ctx, ucp_am_recv_callback_t cb)
{
    ucp_worker_h w;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
                                 .id = KT_RAWUCX_AM_ID,
                                 .cb = cb,
                                 .flags = UCP_AM_FLAG_WHOLE_MSG};

    KT_CHECK(ucp_worker_create(ctx, &wp, &w) == UCS_OK);
    KT_CHECK(ucp_worker_set_am_recv_handler(w, &hp) == UCS_OK);
    return w;
}
