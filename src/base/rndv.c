/*
 * How a connection's runs travel (README, "Rendezvous"): in eager messages, which the receiving
 * side copies out of UCX's buffers, or by rendezvous, where the receiving side checks the header
 * and UCX then moves the run into the place it names. A pure function of the mode, the lanes and
 * what the peer takes: the tests drive it with lane names, as no RDMA device is here.
 */
#include "base/kvx_base.h"

#include <stdio.h>
#include <string.h>

/*
 * Transports on which UCX's rendezvous moves a payload of host memory (a kvx region) by zero-copy
 * RMA: an RDMA READ (or WRITE) straight between the two buffers, no CPU copying it: rc, dc and
 * gga, over verbs or mlx5. Not: tcp (a socket copy), sysv/posix (UCX cuts the payload into
 * fragments each side copies: "rendezvous fragmented copy-in copy-out"), cma (a copy by the
 * kernel; with peer error handling UCX uses no cma lane here), ud (datagrams: UCX's ud transport
 * has no RDMA READ or WRITE, uct's ud_iface.c, so its rendezvous lands in receive buffers the CPU
 * copies out), self, and the GPU copy engines (cuda_copy, cuda_ipc, gdr_copy, rocm_*): UCX adds
 * their lanes for GPU memory, and a host region does not move through them without a copy.
 */
static const char *const kvx_zcopy_prefixes[] = {"rc_", "dc_", "gga_"};

bool kvx_rndv_lane_zcopy(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof(kvx_zcopy_prefixes) / sizeof(kvx_zcopy_prefixes[0]); i++) {
        size_t n = strlen(kvx_zcopy_prefixes[i]);
        if (len > n && strncmp(name, kvx_zcopy_prefixes[i], n) == 0)
            return true;
    }
    return false;
}

bool kvx_rndv_lanes_zcopy(const char *lanes)
{
    const char *p = lanes;

    if (lanes == NULL || *lanes == '\0')
        return false; /* no rendezvous lane: UCX cuts a rendezvous into active messages */
    while (*p != '\0') {
        size_t n = strcspn(p, ",");
        if (!kvx_rndv_lane_zcopy(p, n))
            return false;
        p += n + (p[n] == ',');
    }
    return true;
}

bool kvx_rndv_zcopy(const kvx_rndv_in_t *in)
{
    /* UCX 1.14 and later name the protocol: one that copies is a copy whatever the lanes */
    return kvx_rndv_lanes_zcopy(in->rndv_lanes) &&
           (in->ucx_proto[0] == '\0' || strstr(in->ucx_proto, "zero-copy") != NULL);
}

uint64_t kvx_rndv_choose(const kvx_rndv_in_t *in, char *why, size_t why_len)
{
    const char *lanes = in->rndv_lanes[0] != '\0' ? in->rndv_lanes : in->am_lanes;

    if (in->mode == KVX_RNDV_EAGER) {
        snprintf(why, why_len, "eager: this transport chose KVX_RNDV_EAGER");
        return UINT64_MAX;
    }
    if (!in->peer_takes) {
        snprintf(why, why_len, "eager: the peer takes no rendezvous payloads (KVX_RNDV_EAGER)");
        return UINT64_MAX;
    }
    if (in->mode == KVX_RNDV_ALWAYS) {
        if (in->thresh == 0)
            snprintf(why, why_len, "rendezvous for every run: KVX_RNDV_ALWAYS");
        else
            snprintf(why, why_len, "rendezvous for runs of %llu bytes or more: KVX_RNDV_ALWAYS",
                     (unsigned long long)in->thresh);
        return in->thresh;
    }
    if (!kvx_rndv_zcopy(in)) {
        snprintf(why, why_len, "eager: UCX's rendezvous on '%s' is a copy, not zero-copy RMA%s%s%s",
                 lanes, in->ucx_proto[0] != '\0' ? " (UCX: \"" : "", in->ucx_proto,
                 in->ucx_proto[0] != '\0' ? "\")" : "");
        return UINT64_MAX;
    }
    if (in->thresh != 0) {
        snprintf(why, why_len,
                 "rendezvous for runs of %llu bytes or more: zero-copy RMA on '%s', the threshold "
                 "set (rndv_thresh)",
                 (unsigned long long)in->thresh, lanes);
        return in->thresh;
    }
    if (in->ucx_rndv != UINT64_MAX) {
        snprintf(why, why_len,
                 "rendezvous for runs of %llu bytes or more: zero-copy RMA on '%s', UCX's own "
                 "threshold for this endpoint%s%s%s",
                 (unsigned long long)in->ucx_rndv, lanes, in->ucx_proto[0] != '\0' ? " (\"" : "",
                 in->ucx_proto, in->ucx_proto[0] != '\0' ? "\")" : "");
        return in->ucx_rndv;
    }
    snprintf(why, why_len,
             "rendezvous for runs of %llu bytes or more: zero-copy RMA on '%s', UCX reports no "
             "threshold (its own is never below the lane's eager segment, 8 KiB by default)",
             (unsigned long long)KVX_RNDV_ZCOPY_MIN, lanes);
    return KVX_RNDV_ZCOPY_MIN;
}
