/*
 * A bare UCX program that is not kvx (an attacker, a fake peer) for the tests that need one:
 * its context and its workers, set up the way kvx's peers expect on this host.
 */
#ifndef KT_RAWUCX_H
#define KT_RAWUCX_H

#include <stdbool.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

/* kvx's active-message id (src/ucx/ucx_int.h, KVX_AM_ID): what kvx's workers send and handle. */
#define KT_RAWUCX_AM_ID 0x4b

/* A context with these UCP features and, when UCX may use shared memory (UCX_TLS unset or
 * naming it), kvx's shared-memory geometry: a sender writes into the receiver's FIFO as it
 * sees it, so both must agree. Fails the test on error. */
ucp_context_h kt_rawucx_context(uint64_t features);
/* tcp's zero-copy PUT on or off in cfg (kvx has it off; kt_rawucx_context too). */
void kt_rawucx_put(ucp_config_t *cfg, bool on);
/* A single-threaded worker of ctx whose handler for kvx's messages is cb (whole messages). */
ucp_worker_h kt_rawucx_worker(ucp_context_h ctx, ucp_am_recv_callback_t cb);

#endif
