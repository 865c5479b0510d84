/*
 * What the files of pairing by address share (pairing.c, listen.c, dial.c, reconnect.c), and no
 * other file needs: its bounds and labels, and a pairing's life below its two sides.
 *
 * The exchange, on an endpoint of UCX's connection manager (messages in wire/wire.c), with s and
 * c fresh random nonces of each side:
 *
 *   listener   -> CHALLENGE  s; flag KVX_MSGF_SECRET if a proof is required
 *   connecting -> MD_REQ     c, and with a secret HMAC-SHA256(secret, "kvx-pair-req-v1" || s || c)
 *   listener   -> MD         c again, its metadata (signed with the secret, if any) or -EACCES,
 *                            and with a secret HMAC-SHA256(secret, "kvx-pair-md-v1" || s || c ||
 *                            metadata): an answer to this exchange, not a recorded one
 *
 * and the connecting side closes the endpoint. The listener sends nothing but the nonce before
 * the proof checks out. Data never travels here: kvx_peer_add opens the usual connection from
 * the metadata's worker address (shared memory between processes on one host, tcp across).
 */
#ifndef KVX_PAIR_INT_H
#define KVX_PAIR_INT_H

#include "peer/kvx_peer.h"

/* An exchange the listener took that is not finished in this time is closed (at the next
 * housekeeping, 0.1-1 s later): what one client can hold of the listener. */
#define KVX_PAIR_TIMEOUT_NS (2ull * 1000000000ull)
/* How long the connecting side waits for the answer. Longer than the listener's bound: its wait
 * also covers UCX's connection-manager wire-up (a dozen hand-offs between the two processes'
 * threads, 0.15-0.4 s each way on a loaded 2-core machine for 1.19) and, behind a flood, the
 * time the listener's UCX takes to accept and drop the connections that came first (764 of
 * test_pair's: 0.03-0.4 s); together they reached 2.1 s there, which timed out the 2 s wait. */
#define KVX_CONNECT_TIMEOUT_NS (5ull * 1000000000ull)
/* Connections the listener keeps at once; more are rejected until some finish or expire. */
#define KVX_ACCEPTED_MAX 256

/* What the MACs of an exchange cover, after the label: the listener's nonce, the connecting
 * side's, and for MD the metadata. */
#define KVX_PAIR_REQ_LABEL "kvx-pair-req-v1"
#define KVX_PAIR_MD_LABEL "kvx-pair-md-v1"

/* What a pairing's endpoint reports (kvx_ucx_pair_open): pairing.c's. */
extern const kvx_ep_ops_t kvx_pair_ep_ops;
/* A new pairing of side's, on no list yet (NULL: no memory). */
kvx_pairing_t *kvx_pair_new(kvx_peers_t *pp, const kvx_pair_side_t *side);
/* Free pg once its endpoint has closed, UCX holds nothing of it and nobody waits for it. */
void kvx_pair_maybe_free(kvx_pairing_t *pg);
/* Close the pairing's endpoint (forcibly: nothing is owed to the other side). Not from a UCX
 * callback. pg stays allocated; the caller frees it with kvx_pair_maybe_free. */
void kvx_pair_close(kvx_pairing_t *pg, int err);
/* The pairing's endpoint, when it can still be used: NULL once kvx_pair_close closed it (which
 * an error reported in the same progress step as an answer does before the answer is taken). */
static inline kvx_ucx_ep_t *kvx_pair_ep(const kvx_pairing_t *pg)
{
    return pg->closing ? NULL : pg->ucx;
}
/* Something for kvx_pairings_work to do about pg. */
void kvx_pair_want_work(kvx_pairing_t *pg);
/* Close pg if its endpoint failed or the other side sent out of turn (fail_err): whether it was
 * (or was closing already). */
bool kvx_pair_close_failed(kvx_pairing_t *pg);
/* The MAC that binds an exchange's two nonces to what it carries (a request: nothing). */
void kvx_pair_mac(const kvx_core_t *core, const char *label, const uint8_t *snonce,
                  const uint8_t *cnonce, const void *data, size_t len, uint8_t out[32]);

#endif /* KVX_PAIR_INT_H */
