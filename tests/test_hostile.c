/*
 * A peer that is not kvx: a program using UCX directly, holding a target's metadata, attacks the
 * target. Every attack must leave the target's memory outside its region untouched (canaries
 * around the region), crash nothing, and show in the target's drop counters:
 *  1. UCX's own one-sided operations (put and get, with a remote key of the attacker's own) to
 *     the region and to the canaries beside it: the target's worker has no RMA at all;
 *  2. a HELLO with a wrong capability: dropped, unanswered;
 *  3. with the capability (it holds the metadata), a connection, then: writes outside the region
 *     and far beyond it, a wrong token, an unknown connection, truncated headers, runs that
 *     disagree with the payload, a bad checksum, reads outside the region, random junk, and the
 *     same by rendezvous (outside the region, two runs, a length the run disagrees with, a wrong
 *     token, a bad checksum, a message kind with no payload); one legitimate write and read,
 *     eager and by rendezvous, verified;
 *  5. a rendezvous write whose sender never sends the payload (it stops progressing), one the
 *     target fences while it is in flight, and one whose sender vanishes (a child attacker killed
 *     after announcing it): the receive ends, counted, its connection closes (the fence returns
 *     with it ended), and the target goes on;
 *  6. two connections whose HELLOs arrive out of order (as tcp may deliver an honest writer's):
 *     each one's rendezvous write lands; a third HELLO on the first one's endpoint takes none of
 *     its endpoint (its rendezvous write is refused, the first one's lands);
 *  7. a HELLO naming another writer's worker address: that writer's rendezvous writes still land,
 *     also when the connection it made closed before the writer came (unproven, with a secret);
 *     and after 17 more such HELLOs the receiver's own connection to that writer is answered;
 *  9. a reader that keeps the descriptors of its rendezvous read data while the target closes:
 *     the close drives UCX until it lets go of them (no crash, nothing left behind);
 *  8. a target made with KVX_RNDV_EAGER: its handshake says it takes no rendezvous payload, and
 *     one sent anyway is refused at its header (-EPROTO, counted), while an eager write lands;
 *  3b. messages naming regions (wire 3): an unknown region, a deregistered one, another
 *     region's capability (and the main region with one), access the region does not grant, out
 *     of its bounds, lengths that disagree, eager and by rendezvous: each refused with its status
 *     and counted, the regions' bytes and canaries intact; legitimate ones land;
 *  4. kvx itself with forged metadata (num_blocks doubled, base moved): writes and reads beyond
 *     the real region are refused.
 * Afterwards the target still serves a real kvx peer. argv[1]: shm, tcp, or netns (the target in
 * one network namespace, the attacker in another, over tcp).
 */
#include "harness.h"
#include "kvx_int.h"
#include "rawucx.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define BL 4096
#define NB 64
#define AM_ID KT_RAWUCX_AM_ID

static kt_netns_t ns;
static kt_target_t tg;

/* ---- the attacker's UCX ------------------------------------------------------------------- */

static ucp_context_h ctx;
static ucp_worker_h worker;
static ucp_ep_h ep;
static struct {
    int hello_acks, acks, read_data, read_rndv, notice_acks;
    int32_t last_notice_status;
    int notice_refused; /* NOTICE_ACKs with -ENOSPC */
    uint16_t ack_flags; /* the last HELLO_ACK's: KVX_MSGF_RNDV when the target takes rendezvous */
    uint32_t rconn_id;
    uint64_t token, epoch; /* the last HELLO_ACK's: a fence of this writer bumps the epoch */
    int32_t last_ack_status, last_read_status;
    uint32_t last_read_len;
    uint8_t read_buf[BL];
} seen;

/* section 9: rendezvous read data the attacker keeps UCX's descriptors of, never receiving it */
static bool hold_rndv;
static void *held[64];
static int nheld;

static ucs_status_t on_reply(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                             const ucp_am_recv_param_t *param)
{
    kvx_msg_t m;
    (void)arg;
    if (kvx_wire_decode(hdr, hdr_len, len, &m) < 0)
        return UCS_OK;
    if (m.type == KVX_MSG_READ_DATA && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        /* read data by rendezvous: data is UCX's descriptor; kept (never received) in hold mode */
        seen.read_rndv++;
        if (hold_rndv && nheld < (int)(sizeof(held) / sizeof(held[0]))) {
            held[nheld++] = data;
            return UCS_INPROGRESS;
        }
        return UCS_OK;
    }
    if (m.type == KVX_MSG_HELLO_ACK) {
        seen.hello_acks++;
        seen.ack_flags = m.flags;
        seen.rconn_id = m.u.hello_ack.rconn_id;
        seen.token = m.u.hello_ack.token;
        seen.epoch = m.u.hello_ack.epoch;
    } else if (m.type == KVX_MSG_ACK) {
        uint64_t id;
        uint32_t bytes;
        for (uint32_t i = 0; i < m.u.ack.n; i++) {
            kvx_wire_ack_get(m.u.ack.entries, i, &id, &bytes, &seen.last_ack_status);
            seen.acks++;
        }
    } else if (m.type == KVX_MSG_NOTICE_ACK) {
        seen.notice_acks++;
        seen.last_notice_status = m.u.notice_ack.status;
        seen.notice_refused += m.u.notice_ack.status == -ENOSPC;
    } else if (m.type == KVX_MSG_READ_DATA) {
        seen.read_data++;
        seen.last_read_status = m.u.read_data.status;
        seen.last_read_len = m.u.read_data.len;
        if (len <= sizeof(seen.read_buf))
            memcpy(seen.read_buf, data, len);
    }
    return UCS_OK;
}

static void progress_for(uint64_t ms)
{
    uint64_t end = kt_now_ns() + ms * 1000000ull;
    while (kt_now_ns() < end)
        ucp_worker_progress(worker);
}

/* Progress until *count reaches want (answers counted by on_reply), for at most 10 s: a loaded
 * host may take longer than any fixed pause; then a little more, so that an answer that should
 * not come has had its chance too. */
static void settle(const int *count, int want)
{
    uint64_t end = kt_now_ns() + 10000000000ull;
    while (*count < want && kt_now_ns() < end)
        ucp_worker_progress(worker);
    progress_for(20);
}

/* Requests the target may never answer (a get it has no handler for) are left to the forced
 * close of the endpoint: the attacker does not wait for anything. */
static void *reqs[4096];
static int nreqs;

static bool no_progress; /* posting does not progress either (a sender that stopped) */

static void keep_req(void *req)
{
    if (UCS_PTR_IS_PTR(req) && nreqs < (int)(sizeof(reqs) / sizeof(reqs[0])))
        reqs[nreqs++] = req;
    if (!no_progress)
        ucp_worker_progress(worker);
}

/* UCX needs the header only until the send is posted when it copies it (short and bcopy eager
 * messages, as these are): every buffer here stays valid anyway until the end. */
static void send_raw(const void *hdr, size_t hdr_len, const void *data, size_t len, uint32_t flags)
{
    static uint8_t hdrs[2048][640];
    static int next;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = flags};
    uint8_t *h = hdrs[next++ % 2048];
    KT_CHECK(hdr_len <= sizeof(hdrs[0]));
    memcpy(h, hdr, hdr_len);
    keep_req(ucp_am_send_nbx(ep, AM_ID, h, hdr_len, data, len, &p));
}

static void attacker_start(const kvx_md_t *md)
{
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                 .address = (const ucp_address_t *)md->worker_addr,
                                 .err_mode = UCP_ERR_HANDLING_MODE_PEER};

    ctx = kt_rawucx_context(UCP_FEATURE_AM | UCP_FEATURE_RMA);
    worker = kt_rawucx_worker(ctx, on_reply);
    KT_CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
    progress_for(50);
}

static void attacker_stop(void)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(ep, &p);
    uint64_t end = kt_now_ns() + 2000000000ull;
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
           kt_now_ns() < end)
        ucp_worker_progress(worker);
    for (int i = 0; i < nreqs; i++)
        if (ucp_request_check_status(reqs[i]) != UCS_INPROGRESS)
            ucp_request_free(reqs[i]);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
}

/* ---- 1: UCX's one-sided operations -------------------------------------------------------- */

static void rma_attacks(uint64_t base, uint64_t canary)
{
    static uint8_t buf[BL];
    ucp_mem_h memh;
    void *packed;
    size_t packed_len;
    ucp_rkey_h rkey;
    ucp_mem_map_params_t mp = {.field_mask =
                                   UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = buf,
                               .length = sizeof(buf)};
    uint64_t targets[3] = {base - canary, base + (uint64_t)NB * BL, base};
    int tried = 0;

    memset(buf, 0xab, sizeof(buf));
    KT_CHECK(ucp_mem_map(ctx, &mp, &memh) == UCS_OK);
    KT_CHECK(ucp_rkey_pack(ctx, memh, &packed, &packed_len) == UCS_OK);
    /* a remote key of the attacker's own memory, used against the target's addresses: UCX's
     * emulated RMA never checked that a key covers the address a put names */
    if (ucp_ep_rkey_unpack(ep, packed, &rkey) == UCS_OK) {
        for (int i = 0; i < 3; i++) {
            ucp_request_param_t p = {0};
            keep_req(ucp_put_nbx(ep, buf, sizeof(buf), targets[i], rkey, &p));
            keep_req(ucp_get_nbx(ep, buf, 64, targets[i], rkey, &p));
            tried++;
        }
        ucp_rkey_destroy(rkey);
    }
    ucp_rkey_buffer_release(packed);
    ucp_mem_unmap(ctx, memh);
    progress_for(100);
    kt_log("UCX puts and gets into the region and its canaries: %d tried; the target's worker "
           "has no RMA, nothing lands",
           tried);
    KT_EQ(tried, 3); /* the attack was made: the key unpacked and every operation was posted */
    {
        /* block 0, the put aimed at base itself, still holds the target's own data (the
         * canaries around the region are checked by the caller) */
        uint32_t b0 = 0;
        KT_EQ(kt_target_verify(&tg, &b0, &b0, 1, 8, 0), 0);
    }
}

/* ---- 1b: UCX's zero-copy put, from a peer without peer error handling ----------------------- */

/*
 * The same, from an endpoint of a context of its own without peer error handling, with a put of
 * 16 blocks: UCX 1.19.1 then gives the attacker tcp's zero-copy PUT towards the target (the
 * target's worker address says its tcp interface takes PUT, whatever the target's UCP features),
 * and the target's uct/tcp writes a PUT_REQ's bytes to the address the frame names, below UCP and
 * kvx, with nothing checked. kvx turns tcp's PUT off (src/ucx/config.c), so its address offers
 * none, and the attacker's UCX emulates the put with messages that find no handler.
 */
static bool one_host; /* shm: every transport, the attacker on this host */

static void rma_zcopy_attack(const kvx_md_t *md, uint64_t base)
{
    static uint8_t buf[16 * BL];
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                 .address = (const ucp_address_t *)md->worker_addr,
                                 .err_mode = UCP_ERR_HANDLING_MODE_NONE};
    ucp_mem_map_params_t mp = {.field_mask =
                                   UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = buf,
                               .length = sizeof(buf)};
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                       .features = UCP_FEATURE_AM | UCP_FEATURE_RMA};
    ucp_config_t *cfg;
    ucp_context_h c2;
    ucp_worker_h w2;
    ucp_request_param_t p = {0};
    ucp_mem_h memh;
    ucp_rkey_h rkey;
    ucp_ep_h e2;
    void *packed, *req;
    size_t packed_len;
    uint32_t blocks[16];
    uint64_t end;
    bool unpacked;

    KT_CHECK(ucp_config_read(NULL, NULL, &cfg) == UCS_OK);
    kt_rawucx_put(cfg, true); /* a stock UCX: tcp's PUT on */
    KT_CHECK(ucp_init(&pp, cfg, &c2) == UCS_OK);
    ucp_config_release(cfg);
    w2 = kt_rawucx_worker(c2, on_reply);
    if (one_host) {
        /* on one host UCX 1.19 moves such a put by cma, process_vm_writev: the kernel lets any
         * process of the target's user write into it that way, with or without UCX, so the
         * boundary there is the user (docs/security.md); the attack is made over tcp */
        ucp_worker_destroy(w2);
        ucp_cleanup(c2);
        kt_log("a zero-copy UCX put on one host: not made (cma: the user is the boundary)");
        return;
    }
    memset(buf, 0xab, sizeof(buf));
    KT_CHECK(ucp_ep_create(w2, &ep_params, &e2) == UCS_OK);
    KT_CHECK(ucp_mem_map(c2, &mp, &memh) == UCS_OK);
    KT_CHECK(ucp_rkey_pack(c2, memh, &packed, &packed_len) == UCS_OK);
    unpacked = ucp_ep_rkey_unpack(e2, packed, &rkey) == UCS_OK;
    KT_CHECK(unpacked); /* the attack is made: the key unpacked and the put posted */
    req = ucp_put_nbx(e2, buf, sizeof(buf), base, rkey, &p);
    /* tcp completes a zero-copy put on the target's acknowledgement: up to 10 s for it (or for
     * the emulation's messages to leave), so that a put that lands has landed when checked */
    end = kt_now_ns() + 10000000000ull;
    while (kt_now_ns() < end && UCS_PTR_IS_PTR(req) &&
           ucp_request_check_status(req) == UCS_INPROGRESS)
        ucp_worker_progress(w2);
    kt_log("a zero-copy UCX put of %zu bytes at the region's base, without peer error handling: "
           "%s",
           sizeof(buf),
           !UCS_PTR_IS_PTR(req) ? ucs_status_string(UCS_PTR_STATUS(req))
           : ucp_request_check_status(req) == UCS_INPROGRESS
               ? "in progress after 10 s"
               : ucs_status_string(ucp_request_check_status(req)));
    for (uint32_t i = 0; i < 16; i++)
        blocks[i] = i;
    /* blocks 0-15 still hold the target's own data */
    KT_EQ(kt_target_verify(&tg, blocks, blocks, 16, 8, 0), 0);
    {
        /* the endpoint closed by force ends a put still in flight (UCX cannot cancel one) */
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *creq = ucp_ep_close_nbx(e2, &cp);
        end = kt_now_ns() + 5000000000ull;
        while (kt_now_ns() < end &&
               ((UCS_PTR_IS_PTR(creq) && ucp_request_check_status(creq) == UCS_INPROGRESS) ||
                (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS)))
            ucp_worker_progress(w2);
        KT_CHECK(!UCS_PTR_IS_PTR(req) || ucp_request_check_status(req) != UCS_INPROGRESS);
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req);
        if (UCS_PTR_IS_PTR(creq) && ucp_request_check_status(creq) != UCS_INPROGRESS)
            ucp_request_free(creq);
    }
    ucp_rkey_destroy(rkey); /* no operation of the endpoint uses it any more */
    ucp_rkey_buffer_release(packed);
    ucp_mem_unmap(c2, memh);
    ucp_worker_destroy(w2);
    ucp_cleanup(c2);
}

/* ---- 2, 3: kvx's messages ------------------------------------------------------------------ */

/* A HELLO naming the worker address addr (alen bytes) for its replies; with a secret, signed. */
static size_t hello_naming(uint8_t *h, const uint8_t *capability, const void *addr, size_t alen,
                           const char *secret)
{
    memset(h, 0, KVX_WIRE_HELLO_LEN);
    kvx_wire_put_hdr(h, KVX_MSG_HELLO, secret != NULL ? KVX_MSGF_PROOF : 0, 0, 0);
    memcpy(h + 16, capability, 16);
    kvx_put32(h + 32, 7);
    static uint64_t token =
        0x1234; /* each HELLO its own: with a secret, a repeated one is a replay */
    kvx_put64(h + 40, token++);
    h[56] = 8;
    kvx_put32(h + 60, (uint32_t)alen);
    memcpy(h + 64, "attacker", 8);
    memcpy(h + 72, addr, alen);
    if (secret != NULL) {
        kvx_iov_t part = {h, 72 + alen};
        kvx_hmac_sha256(secret, strlen(secret), &part, 1, h + 72 + alen);
        return 72 + alen + KVX_PROOF_LEN;
    }
    return 72 + alen;
}

static size_t hello(uint8_t *h, const kvx_md_t *md, const uint8_t *capability)
{
    ucp_address_t *addr;
    size_t alen, len;
    KT_CHECK(ucp_worker_get_address(worker, &addr, &alen) == UCS_OK);
    len = hello_naming(h, capability, addr, alen, NULL);
    ucp_worker_release_address(worker, addr);
    (void)md;
    return len;
}

/* A WRITE of one run; each its own transfer id, so that no two acknowledgements merge. */
static size_t write_hdr(uint8_t *h, uint32_t conn, uint64_t token, unsigned flags, uint64_t off,
                        uint32_t len, uint32_t crc)
{
    static uint64_t xfer_id = 100;
    kvx_wire_run_t run = {off, len, crc};
    kvx_wire_put_hdr(h, KVX_MSG_WRITE, flags, conn, token);
    kvx_put64(h + 16, xfer_id++);
    kvx_put64(h + 24, 0);
    kvx_put64(h + 32, seen.epoch);
    kvx_put32(h + 40, 1);
    kvx_put32(h + 44, KVX_REGION_MAIN); /* wire 3: the main region, capability field zero */
    memset(h + 48, 0, 16);
    kvx_wire_run_put(h + KVX_WIRE_WRITE_LEN, 0, &run);
    return KVX_WIRE_WRITE_LEN + KVX_WIRE_RUN_LEN;
}

static size_t read_hdr(uint8_t *h, uint64_t off, uint32_t len)
{
    kvx_wire_run_t run = {off, len, 0};
    kvx_wire_put_hdr(h, KVX_MSG_READ_REQ, 0, seen.rconn_id, seen.token);
    kvx_put64(h + 16, 98);
    kvx_put64(h + 24, 0);
    kvx_put32(h + 32, 1);
    kvx_put32(h + 36, 0);
    kvx_put32(h + 40, KVX_REGION_MAIN); /* wire 3: the main region, capability field zero */
    memset(h + 44, 0, 20);
    kvx_wire_run_put(h + KVX_WIRE_READ_REQ_LEN, 0, &run);
    return KVX_WIRE_READ_REQ_LEN + KVX_WIRE_RUN_LEN;
}

static void message_attacks(const kvx_md_t *md)
{
    static uint8_t data[64 * 1024];
    uint8_t h[4096], wrong[16];
    const uint64_t region = (uint64_t)NB * BL;
    size_t n;
    kvx_recv_counters_t c0, c1;
    uint64_t rng = 0x9e3779b97f4a7c15ull;

    kt_target_counters(&tg, &c0);
    /* 2: a wrong capability: nothing happens */
    memcpy(wrong, md->capability, 16);
    wrong[3] ^= 0x40;
    n = hello(h, md, wrong);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
    progress_for(200);
    KT_EQ(seen.hello_acks, 0);

    /* 3: with the capability, a connection */
    n = hello(h, md, md->capability);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
    for (int i = 0; i < 200 && seen.hello_acks == 0; i++)
        progress_for(10);
    KT_EQ(seen.hello_acks, 1);
    KT_EQ(seen.ack_flags, KVX_MSGF_RNDV); /* the target takes rendezvous payloads, and says so */

    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 13);
    /* a legitimate write of block 5 from this program: acknowledged */
    n = write_hdr(h, seen.rconn_id, seen.token, 0, 5 * BL, BL, 0);
    send_raw(h, n, data, BL, UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.acks, 1);
    KT_EQ(seen.acks, 1);
    KT_EQ(seen.last_ack_status, 0);
    /* outside the region: just past its end, straddling it, and far away */
    n = write_hdr(h, seen.rconn_id, seen.token, 0, region, 64, 0);
    send_raw(h, n, data, 64, UCP_AM_SEND_FLAG_EAGER);
    n = write_hdr(h, seen.rconn_id, seen.token, 0, region - 100, BL, 0);
    send_raw(h, n, data, BL, UCP_AM_SEND_FLAG_EAGER);
    n = write_hdr(h, seen.rconn_id, seen.token, 0, UINT64_MAX - 10, 64, 0);
    send_raw(h, n, data, 64, UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.acks, 4);
    KT_EQ(seen.acks, 4);
    KT_ERR(seen.last_ack_status, -EINVAL);
    /* a wrong token, an unknown connection: no answer at all */
    n = write_hdr(h, seen.rconn_id, seen.token ^ 1, 0, 0, 64, 0);
    send_raw(h, n, data, 64, UCP_AM_SEND_FLAG_EAGER);
    n = write_hdr(h, 4000, seen.token, 0, 0, 64, 0);
    send_raw(h, n, data, 64, UCP_AM_SEND_FLAG_EAGER);
    /* truncated headers; runs longer and shorter than the payload */
    n = write_hdr(h, seen.rconn_id, seen.token, 0, 0, 64, 0);
    send_raw(h, 20, data, 64, UCP_AM_SEND_FLAG_EAGER);
    send_raw(h, n - 1, data, 64, UCP_AM_SEND_FLAG_EAGER);
    send_raw(h, n, data, 63, UCP_AM_SEND_FLAG_EAGER);
    send_raw(h, n, data, 65, UCP_AM_SEND_FLAG_EAGER);
    /* a bad checksum: refused whole */
    n = write_hdr(h, seen.rconn_id, seen.token, KVX_MSGF_CRC, 6 * BL, BL, 0xdeadbeef);
    send_raw(h, n, data, BL, UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.acks, 5);
    KT_EQ(seen.acks, 5);
    KT_ERR(seen.last_ack_status, -EBADMSG);
    /* reads outside the region: refused; inside: the bytes written above */
    n = read_hdr(h, region - 8, 64);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.read_data, 1);
    KT_EQ(seen.read_data, 1);
    KT_ERR(seen.last_read_status, -EINVAL);
    n = read_hdr(h, 5 * BL, BL);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.read_data, 2);
    KT_EQ(seen.read_data, 2);
    KT_EQ(seen.last_read_status, 0);
    KT_EQ(seen.last_read_len, BL);
    KT_CHECK(memcmp(seen.read_buf, data, BL) == 0);
    /* a read request's priority (word 36): 1 (low) and 2 (high) are answered; 3 is no level, and
     * the request is dropped unanswered (counted malformed) */
    for (uint32_t prio = 1; prio <= 3; prio++) {
        int before = seen.read_data;
        memset(seen.read_buf, 0, BL);
        n = read_hdr(h, 5 * BL, BL);
        kvx_put32(h + 36, prio);
        send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
        settle(&seen.read_data, before + (prio < 3));
        KT_EQ(seen.read_data, before + (prio < 3));
        if (prio < 3) {
            KT_EQ(seen.last_read_status, 0);
            KT_CHECK(memcmp(seen.read_buf, data, BL) == 0);
        }
    }
    /* junk of every length */
    for (int i = 0; i < 1000; i++) {
        size_t len = 1 + (size_t)(rng % 600);
        for (size_t k = 0; k < len; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            h[k] = (uint8_t)rng;
        }
        if (i % 3 == 0)
            h[0] = KVX_WIRE_VERSION; /* get past the first check now and then */
        send_raw(h, len, data, (size_t)(rng % 128), UCP_AM_SEND_FLAG_EAGER);
    }
    /* by rendezvous: the header is checked before any of the payload moves */
    n = write_hdr(h, seen.rconn_id, seen.token, 0, region - 100, BL, 0); /* straddles the end */
    send_raw(h, n, data, BL, UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    n = write_hdr(h, seen.rconn_id, seen.token ^ 1, 0, 0, 64, 0); /* a wrong token */
    send_raw(h, n, data, 64, UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    n = write_hdr(h, seen.rconn_id, seen.token, 0, 0, 64, 0); /* the run says 64, 128 come */
    send_raw(h, n, data, 128, UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    {
        /* two runs in one rendezvous message: a rendezvous payload is one run */
        kvx_wire_run_t r2 = {BL, 64, 0};
        n = write_hdr(h, seen.rconn_id, seen.token, 0, 0, 64, 0);
        kvx_put32(h + 40, 2);
        kvx_wire_run_put(h + KVX_WIRE_WRITE_LEN, 1, &r2);
        send_raw(h, n + KVX_WIRE_RUN_LEN, data, 128,
                 UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    }
    n = read_hdr(h, 0, 64); /* a read request carries no payload: malformed */
    send_raw(h, n, data, 64, UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    settle(&seen.acks, 7);
    KT_EQ(seen.acks, 7); /* the straddling write and the one with two runs are answered */
    KT_ERR(seen.last_ack_status, -EINVAL);
    /* a bad checksum: checked once the payload has landed (inside the region), refused */
    n = write_hdr(h, seen.rconn_id, seen.token, KVX_MSGF_CRC, 8 * BL, BL, 0xdeadbeef);
    send_raw(h, n, data, BL, UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    settle(&seen.acks, 8);
    KT_EQ(seen.acks, 8);
    KT_ERR(seen.last_ack_status, -EBADMSG);
    /* a legitimate one that names no endpoint (no REPLY): refused, its payload never moves */
    n = write_hdr(h, seen.rconn_id, seen.token, 0, 16 * BL, sizeof(data), 0);
    send_raw(h, n, data, sizeof(data), UCP_AM_SEND_FLAG_RNDV);
    settle(&seen.acks, 9);
    KT_EQ(seen.acks, 9);
    KT_ERR(seen.last_ack_status, -EPROTO);
    /* a legitimate one: 16 blocks from block 16 land, read back whole */
    n = write_hdr(h, seen.rconn_id, seen.token, 0, 16 * BL, sizeof(data), 0);
    send_raw(h, n, data, sizeof(data), UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    settle(&seen.acks, 10);
    KT_EQ(seen.acks, 10);
    KT_EQ(seen.last_ack_status, 0);
    for (uint32_t b = 0; b < sizeof(data) / BL; b++) {
        int before = seen.read_data;
        n = read_hdr(h, (16 + b) * BL, BL);
        send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
        settle(&seen.read_data, before + 1);
        KT_EQ(seen.read_data, before + 1);
        KT_EQ(seen.last_read_status, 0);
        KT_CHECK(memcmp(seen.read_buf, data + b * BL, BL) == 0);
    }
    kt_target_counters(&tg, &c1);
    kt_log("target counters: capability %llu, unknown %llu, malformed %llu, range %llu, crc "
           "%llu, other %llu; landed %llu bytes",
           (unsigned long long)(c1.drop_capability - c0.drop_capability),
           (unsigned long long)(c1.drop_unknown - c0.drop_unknown),
           (unsigned long long)(c1.drop_malformed - c0.drop_malformed),
           (unsigned long long)(c1.drop_range - c0.drop_range),
           (unsigned long long)(c1.drop_crc - c0.drop_crc),
           (unsigned long long)(c1.drop_other - c0.drop_other),
           (unsigned long long)(c1.bytes_landed - c0.bytes_landed));
    KT_CHECK(c1.drop_capability - c0.drop_capability >= 1);
    KT_CHECK(c1.drop_unknown - c0.drop_unknown >= 2 + 2); /* wrong token, no endpoint named */
    /* 2 by rendezvous (the disagreeing length, a read request with a payload) */
    KT_CHECK(c1.drop_malformed - c0.drop_malformed >= 4 + 1 + 600 + 2); /* 1: priority 3 */
    KT_EQ(c1.drop_range - c0.drop_range, 4 + 1);
    KT_EQ(c1.drop_crc - c0.drop_crc, 2);
    KT_EQ(c1.bytes_landed - c0.bytes_landed, BL + sizeof(data));
    KT_EQ(c1.rndv_landed - c0.rndv_landed, 1);
    KT_EQ(c1.rndv_failed - c0.rndv_failed, 0);
}

/* ---- 3a: notices with payloads -------------------------------------------------------------- */

/* A NOTICE on the attacker's connection: flags (KVX_MSGF_DATA: the tail with len), tail_len bytes
 * of tail written (8 with DATA, as the encoder would; else what the attack wants). */
static size_t notice_hdr(uint8_t *h, unsigned flags, uint32_t len, size_t tail_len)
{
    size_t n = kvx_wire_encode(
        &(kvx_msg_t){.type = KVX_MSG_NOTICE,
                     .flags = (uint16_t)flags,
                     .conn_id = seen.rconn_id,
                     .token = seen.token,
                     .u.notice = {.xfer_id = 77, .epoch = seen.epoch, .data_len = len}},
        h);
    if (!(flags & KVX_MSGF_DATA) && tail_len > 0) {
        memset(h + n, 0, tail_len);
        kvx_put32(h + n, len);
        n += tail_len;
    }
    return n;
}

/* Lengths that disagree, over the max, tails without the flag and flags without the tail: dropped
 * as malformed, unanswered; beyond the queue's payload bound: refused (-ENOSPC) and counted; the
 * receiver intact after, its notices each checked. */
static void notice_attacks(void)
{
    static uint8_t big[KVX_NOTICE_DATA_MAX + 1];
    uint8_t h[256];
    kvx_recv_counters_t c0, c1;
    kvx_notice_t nt[256];
    const int bound = KVX_NOTICE_QUEUE_BYTES / KVX_NOTICE_DATA_MAX;
    int acks = seen.notice_acks, got = 0, n;

    kt_target_counters(&tg, &c0);
    /* a good one first */
    send_raw(h, notice_hdr(h, KVX_MSGF_DATA, 100, 0), big, 100, UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.notice_acks, acks + 1);
    KT_EQ(seen.notice_acks, acks + 1);
    KT_EQ(seen.last_notice_status, 0);
    KT_EQ(kt_target_notices(&tg, nt, 256), 1);
    /* malformed: no answer */
    send_raw(h, notice_hdr(h, KVX_MSGF_DATA, 100, 0), big, 99, UCP_AM_SEND_FLAG_EAGER);
    send_raw(h, notice_hdr(h, KVX_MSGF_DATA, 100, 0), big, 101, UCP_AM_SEND_FLAG_EAGER);
    send_raw(h, notice_hdr(h, KVX_MSGF_DATA, 0, 0), big, 1, UCP_AM_SEND_FLAG_EAGER);
    send_raw(h, notice_hdr(h, KVX_MSGF_DATA, KVX_NOTICE_DATA_MAX + 1, 0), big,
             KVX_NOTICE_DATA_MAX + 1, UCP_AM_SEND_FLAG_EAGER);
    send_raw(h, notice_hdr(h, KVX_MSGF_DATA, UINT32_MAX, 0), big, 100, UCP_AM_SEND_FLAG_EAGER);
    send_raw(h, notice_hdr(h, 0, 100, 8), big, 100, UCP_AM_SEND_FLAG_EAGER); /* no flag */
    send_raw(h, notice_hdr(h, 0, 0, 0), big, 100, UCP_AM_SEND_FLAG_EAGER);   /* no flag */
    notice_hdr(h, KVX_MSGF_DATA, 0, 0);
    send_raw(h, KVX_WIRE_NOTICE_LEN, big, 0, UCP_AM_SEND_FLAG_EAGER); /* no tail */
    n = (int)notice_hdr(h, KVX_MSGF_DATA, 100, 0);
    send_raw(h, (size_t)n - 4, big, 100, UCP_AM_SEND_FLAG_EAGER); /* half a tail */
    h[KVX_WIRE_NOTICE_LEN + 5] = 1;                               /* its reserved word */
    send_raw(h, (size_t)n, big, 100, UCP_AM_SEND_FLAG_EAGER);
    progress_for(300);
    KT_EQ(seen.notice_acks, acks + 1);
    kt_target_counters(&tg, &c1);
    KT_EQ(c1.drop_malformed - c0.drop_malformed, 10);
    /* over the bound: bound notices of the max are queued, the rest refused and counted */
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (uint8_t)(i * 29);
    for (int i = 0; i < bound + 3; i++)
        send_raw(h, notice_hdr(h, KVX_MSGF_DATA, KVX_NOTICE_DATA_MAX, 0), big, KVX_NOTICE_DATA_MAX,
                 UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.notice_acks, acks + 1 + bound + 3);
    KT_EQ(seen.notice_acks, acks + 1 + bound + 3);
    KT_EQ(seen.notice_refused, 3);
    kt_target_counters(&tg, &c1);
    KT_EQ(c1.drop_other - c0.drop_other, 3);
    while ((n = kt_target_notices(&tg, nt, 256)) > 0)
        got += n;
    KT_EQ(got, bound);
    /* intact: a notice is queued again */
    send_raw(h, notice_hdr(h, KVX_MSGF_DATA, 10, 0), big, 10, UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.notice_acks, acks + bound + 5);
    KT_EQ(seen.last_notice_status, 0);
    KT_EQ(kt_target_notices(&tg, nt, 256), 1);
    kt_log("notices: 10 malformed dropped, %d over the payload bound refused", 3);
}

/* ---- 3b: messages naming regions (wire 3) -------------------------------------------------- */

/* The message in h (a WRITE or READ_REQ of write_hdr, read_hdr) names region id with cap. */
static void name_region(uint8_t *h, uint32_t id, const uint8_t *cap)
{
    static const uint8_t zero[16];
    kvx_put32(h + (h[1] == KVX_MSG_WRITE ? 44 : 40), id);
    memcpy(h + 48, cap != NULL ? cap : zero, 16);
}

static const uint8_t *blob_cap(const uint8_t *blob, size_t len)
{
    static kvx_region_blob_t rb[8];
    static int k;
    kvx_region_blob_t *b = &rb[k++ % 8];
    KT_OK(kvx_region_blob_decode(blob, len, b));
    return b->capability;
}

/* A write of len bytes at off of region id (cap), eager or by rendezvous: its ack's status. */
static int32_t region_write(uint32_t id, const uint8_t *cap, uint64_t off, uint32_t len,
                            const uint8_t *data, bool rndv)
{
    uint8_t h[256];
    int before = seen.acks;
    size_t n = write_hdr(h, seen.rconn_id, seen.token, 0, off, len, 0);
    name_region(h, id, cap);
    send_raw(h, n, data, len,
             rndv ? UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY : UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.acks, before + 1);
    KT_EQ(seen.acks, before + 1);
    return seen.last_ack_status;
}

/* A read of len (<= BL) bytes at off of region id (cap): its READ_DATA's status (the bytes in
 * seen.read_buf). */
static int32_t region_read(uint32_t id, const uint8_t *cap, uint64_t off, uint32_t len)
{
    uint8_t h[256];
    int before = seen.read_data;
    size_t n = read_hdr(h, off, len);
    name_region(h, id, cap);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
    settle(&seen.read_data, before + 1);
    KT_EQ(seen.read_data, before + 1);
    return seen.last_read_status;
}

/* With its connection, a peer names regions: unknown, deregistered, with another region's
 * capability (and the main region with one), without the access the region grants, out of its
 * bounds, with lengths that disagree; each refused with its status and counted, nothing lands
 * (the regions' bytes and canaries checked), and a legitimate write and read of each kind land. */
static void region_attacks(void)
{
    static uint8_t data[2 * BL];
    uint8_t ba[KVX_REGION_BLOB_MAX], bb[KVX_REGION_BLOB_MAX], br[KVX_REGION_BLOB_MAX],
        bw[KVX_REGION_BLOB_MAX], bd[KVX_REGION_BLOB_MAX];
    size_t la, lb, lr, lw, ld;
    uint32_t a, b, ro, wo, dead;
    const uint8_t *ca, *cb, *cro, *cwo, *cdead;
    kvx_region_counters_t g0, g1;
    kvx_recv_counters_t c0, c1;
    const uint32_t RL = 3 * BL + 5; /* an odd length */

    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 29 + 3);
    a = kt_target_add_region(&tg, RL, KVX_REGION_WRITE | KVX_REGION_READ, 0x10, ba, &la);
    b = kt_target_add_region(&tg, RL, KVX_REGION_WRITE | KVX_REGION_READ, 0x20, bb, &lb);
    ro = kt_target_add_region(&tg, RL, KVX_REGION_READ, 0x30, br, &lr);
    wo = kt_target_add_region(&tg, RL, KVX_REGION_WRITE, 0x40, bw, &lw);
    dead = kt_target_add_region(&tg, RL, KVX_REGION_WRITE | KVX_REGION_READ, 0x50, bd, &ld);
    ca = blob_cap(ba, la), cb = blob_cap(bb, lb), cro = blob_cap(br, lr);
    cwo = blob_cap(bw, lw), cdead = blob_cap(bd, ld);
    KT_OK(kt_target_deregister(&tg, dead));
    kt_target_region_counters(&tg, &g0);
    kt_target_counters(&tg, &c0);

    KT_ERR(region_write(999999, ca, 0, 64, data, false), -ENOENT);  /* unknown */
    KT_ERR(region_write(dead, cdead, 0, 64, data, false), -ENOENT); /* deregistered */
    KT_ERR(region_read(dead, cdead, 0, 64), -ENOENT);
    KT_ERR(region_write(a, cb, 0, 64, data, false), -EACCES); /* another's capability */
    KT_ERR(region_read(a, cb, 0, 64), -EACCES);
    KT_ERR(region_write(a, NULL, 0, 64, data, false), -EACCES);             /* none */
    KT_ERR(region_write(KVX_REGION_MAIN, ca, 0, 64, data, false), -EACCES); /* main: zero only */
    KT_ERR(region_write(ro, cro, 0, 64, data, false), -EACCES);             /* read only */
    KT_ERR(region_read(wo, cwo, 0, 64), -EACCES);                           /* write only */
    KT_ERR(region_write(a, ca, RL - 10, 64, data, false), -EINVAL);         /* straddles its end */
    KT_ERR(region_write(a, ca, RL, 1, data, false), -EINVAL);               /* just past it */
    KT_ERR(region_write(a, ca, UINT64_MAX - 10, 64, data, false), -EINVAL); /* wraps */
    KT_ERR(region_read(a, ca, RL - 8, 64), -EINVAL);
    /* by rendezvous: refused at the header, the payload never moves */
    KT_ERR(region_write(999999, ca, 0, BL, data, true), -ENOENT);
    KT_ERR(region_write(dead, cdead, 0, BL, data, true), -ENOENT);
    KT_ERR(region_write(a, cb, 0, BL, data, true), -EACCES);
    KT_ERR(region_write(ro, cro, 0, BL, data, true), -EACCES);
    KT_ERR(region_write(a, ca, RL - BL + 1, BL, data, true), -EINVAL);
    /* lengths that disagree (the run says 64, 63 or 65 come): malformed, unanswered */
    {
        uint8_t h[256];
        size_t n = write_hdr(h, seen.rconn_id, seen.token, 0, 0, 64, 0);
        name_region(h, a, ca);
        send_raw(h, n, data, 63, UCP_AM_SEND_FLAG_EAGER);
        send_raw(h, n, data, 65, UCP_AM_SEND_FLAG_EAGER);
        name_region(h, 0, ca); /* region 0 names none: malformed */
        send_raw(h, n, data, 64, UCP_AM_SEND_FLAG_EAGER);
        progress_for(100);
    }
    kt_target_region_counters(&tg, &g1);
    kt_target_counters(&tg, &c1);
    kt_log("regions: refused %llu unknown or deregistered, %llu capabilities, %llu accesses, "
           "%llu out of bounds, %llu malformed",
           (unsigned long long)(g1.drop_region - g0.drop_region),
           (unsigned long long)(g1.drop_region_capability - g0.drop_region_capability),
           (unsigned long long)(g1.drop_access - g0.drop_access),
           (unsigned long long)(c1.drop_range - c0.drop_range),
           (unsigned long long)(c1.drop_malformed - c0.drop_malformed));
    KT_EQ(g1.drop_region - g0.drop_region, 3 + 2);
    KT_EQ(g1.drop_region_capability - g0.drop_region_capability, 4 + 1);
    KT_EQ(g1.drop_access - g0.drop_access, 2 + 1);
    KT_EQ(c1.drop_range - c0.drop_range, 4 + 1);
    KT_EQ(c1.drop_malformed - c0.drop_malformed, 3);
    KT_EQ(c1.bytes_landed, c0.bytes_landed);
    KT_EQ(kt_target_canaries(&tg), 0);
    /* nothing landed: every region still holds its own bytes, all of it read back */
    {
        const uint32_t ids[3] = {a, b, ro};
        const uint8_t *caps[3] = {ca, cb, cro};
        const uint8_t salts[3] = {0x10, 0x20, 0x30};
        for (int k = 0; k < 3; k++)
            for (uint64_t off = 0; off < RL; off += BL) {
                uint32_t len = RL - off < BL ? (uint32_t)(RL - off) : BL;
                KT_EQ(region_read(ids[k], caps[k], off, len), 0);
                for (uint32_t i = 0; i < len; i++)
                    if (seen.read_buf[i] != (uint8_t)(salts[k] + 7 * (off + i)))
                        KT_FAIL("region %u byte %llu changed", ids[k],
                                (unsigned long long)(off + i));
            }
    }
    /* and the legitimate ones land: eager at an odd offset, by rendezvous in the write-only
     * region, read back where the region allows it */
    KT_EQ(region_write(a, ca, 1001, 333, data, false), 0);
    KT_EQ(region_read(a, ca, 1001, 333), 0);
    KT_CHECK(memcmp(seen.read_buf, data, 333) == 0);
    KT_EQ(region_write(wo, cwo, 7, BL, data, true), 0);
    KT_EQ(region_write(b, cb, 5, BL, data + 1, true), 0);
    KT_EQ(region_read(b, cb, 5, BL), 0);
    KT_CHECK(memcmp(seen.read_buf, data + 1, BL) == 0);
    KT_EQ(kt_target_canaries(&tg), 0);
}

/* ---- 5: rendezvous writes whose payload never comes ---------------------------------------- */

/* The attacker announces a 256 KiB rendezvous write and stops progressing, so that it never
 * sends the payload (over tcp: the receiver asks for it, the sender must answer; over shared
 * memory too, with peer error handling UCX moves it in messages): within the stall limit the
 * target closes the connection, which ends the receive, counted; with fence, the target fences
 * the writer meanwhile instead. sn: the attacker's endpoint's place among those it opened. */
static void rndv_stall(const kvx_md_t *md, uint32_t sn, bool fence)
{
    static uint8_t big[256 * 1024];
    uint8_t h[4096];
    kvx_recv_counters_t c0, c1;
    size_t n;

    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                 .address = (const ucp_address_t *)md->worker_addr,
                                 .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    ucp_ep_h first = ep;

    kt_target_counters(&tg, &c0);
    memset(big, 0x5c, sizeof(big));
    /* a connection of its own endpoint, the attacker's second towards the target (which pairs
     * with the target's second towards it: the HELLO says so) */
    KT_CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
    seen.hello_acks = 0;
    n = hello(h, md, md->capability);
    kvx_put32(h + 36, sn);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
    for (int i = 0; i < 200 && seen.hello_acks == 0; i++)
        progress_for(10);
    KT_EQ(seen.hello_acks, 1);
    n = write_hdr(h, seen.rconn_id, seen.token, 0, 0, sizeof(big), 0);
    no_progress = true; /* from here on this sender never progresses: its payload never goes */
    send_raw(h, n, big, sizeof(big), UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    if (fence) {
        /* the target fences the writer while the receive is in flight: the fence waits for
         * it (up to 1 s), then closes the connection; when it returns, the receive has ended
         * (or, had the announcement reached the target only after the fence, it was refused
         * as fenced) */
        uint64_t t0;
        usleep(300 * 1000); /* the announcement reaches the target, which starts the receive */
        t0 = kt_now_ns();
        KT_CHECK(kt_target_fence(&tg, "attacker", NULL, 0) >= 0);
        kt_target_counters(&tg, &c1);
        kt_log("a fence while a rendezvous receive of the writer's was in flight: returned after "
               "%.0f ms, %llu failed, %llu fenced",
               (double)(kt_now_ns() - t0) / 1e6,
               (unsigned long long)(c1.rndv_failed - c0.rndv_failed),
               (unsigned long long)(c1.drop_fenced - c0.drop_fenced));
        KT_EQ(c1.rndv_failed - c0.rndv_failed + c1.drop_fenced - c0.drop_fenced, 1);
        KT_EQ(c1.rndv_landed - c0.rndv_landed, 0);
    } else {
        usleep(3500 * 1000); /* the target's stall limit is 2 s; no progress here meanwhile */
        for (int i = 0; i < 100; i++) { /* its close ends the receive (counted when it ends) */
            kt_target_counters(&tg, &c1);
            if (c1.rndv_failed + c1.rndv_landed > c0.rndv_failed + c0.rndv_landed)
                break;
            usleep(100 * 1000);
        }
        kt_log("a rendezvous write whose sender stopped: %llu failed, %llu landed, %llu overflowed",
               (unsigned long long)(c1.rndv_failed - c0.rndv_failed),
               (unsigned long long)(c1.rndv_landed - c0.rndv_landed),
               (unsigned long long)(c1.conns_overflow - c0.conns_overflow));
        KT_EQ(c1.rndv_failed - c0.rndv_failed, 1);
        KT_EQ(c1.rndv_landed - c0.rndv_landed, 0);
    }
    no_progress = false;
    progress_for(200);
    {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        keep_req(ucp_ep_close_nbx(ep, &p));
        ep = first;
    }
}

/* ---- 6: two connections whose HELLOs arrive out of order ------------------------------------ */

/* What tcp does to an honest writer that opens two connections at once: each endpoint is its own
 * socket, so the second connection's HELLO may arrive first. The attacker opens two endpoints
 * (its places 3 and 4 towards the target), lets both wire up, and sends the second one's HELLO
 * first. Each connection's rendezvous write must then land, every byte verified: the target's
 * endpoint of each connection is the one UCX paired with the writer's endpoint it came on, so the
 * payload that comes on it is taken. */
static void hello_order(const kvx_md_t *md)
{
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                 .address = (const ucp_address_t *)md->worker_addr,
                                 .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    kt_region_t src = kt_region_alloc(NB, BL);
    ucp_ep_h first = ep, eps[2];
    uint32_t conn[2], blocks[2] = {60, 61};
    uint64_t token[2];
    kvx_recv_counters_t c0, c1;
    uint8_t h[4096];
    size_t n;

    kt_target_counters(&tg, &c0);
    for (int k = 0; k < 2; k++) {
        KT_CHECK(ucp_ep_create(worker, &ep_params, &eps[k]) == UCS_OK);
        kt_fill(&src, blocks[k], 0x5a, blocks[k], 9);
    }
    progress_for(100);             /* both wire up: the target's UCX makes its side of each */
    for (int k = 1; k >= 0; k--) { /* the later endpoint's HELLO first */
        ep = eps[k];
        seen.hello_acks = 0;
        n = hello(h, md, md->capability);
        kvx_put32(h + 36, 3 + (uint32_t)k);
        send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
        for (int i = 0; i < 200 && seen.hello_acks == 0; i++)
            progress_for(10);
        KT_EQ(seen.hello_acks, 1);
        conn[k] = seen.rconn_id;
        token[k] = seen.token;
    }
    for (int k = 0; k < 2; k++) {
        ep = eps[k];
        seen.acks = 0;
        seen.last_ack_status = 1;
        n = write_hdr(h, conn[k], token[k], 0, (uint64_t)blocks[k] * BL, BL, 0);
        send_raw(h, n, (uint8_t *)src.base + (uint64_t)blocks[k] * BL, BL,
                 UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
        for (int i = 0; i < 200 && seen.acks == 0; i++)
            progress_for(10);
        KT_EQ(seen.acks, 1);
        KT_EQ(seen.last_ack_status, 0);
    }
    kt_target_counters(&tg, &c1);
    kt_log("two connections whose HELLOs came out of order: %llu rendezvous writes landed, "
           "%llu failed",
           (unsigned long long)(c1.rndv_landed - c0.rndv_landed),
           (unsigned long long)(c1.rndv_failed - c0.rndv_failed));
    KT_EQ(c1.rndv_landed - c0.rndv_landed, 2);
    KT_EQ(kt_target_verify(&tg, blocks, blocks, 2, 0x5a, 9), 0);
    /* A second HELLO on the first endpoint: its connection must not take (share) the endpoint
     * of the first one (only this transport's own writing endpoints are shared): its rendezvous
     * write is refused, and the first connection's still lands. */
    {
        uint32_t conn2, b3 = 62;
        uint64_t token2;
        ep = eps[0];
        seen.hello_acks = 0;
        n = hello(h, md, md->capability);
        kvx_put32(h + 36, 3);
        send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
        for (int i = 0; i < 200 && seen.hello_acks == 0; i++)
            progress_for(10);
        KT_EQ(seen.hello_acks, 1);
        conn2 = seen.rconn_id;
        token2 = seen.token;
        kt_fill(&src, b3, 0x5a, b3, 9);
        for (int k = 0; k < 2; k++) {
            seen.acks = 0;
            seen.last_ack_status = 1;
            n = write_hdr(h, k == 0 ? conn2 : conn[0], k == 0 ? token2 : token[0], 0,
                          (uint64_t)b3 * BL, BL, 0);
            send_raw(h, n, (uint8_t *)src.base + (uint64_t)b3 * BL, BL,
                     UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
            for (int i = 0; i < 200 && seen.acks == 0; i++)
                progress_for(10);
            KT_EQ(seen.acks, 1);
            KT_EQ(seen.last_ack_status, k == 0 ? -EPROTO : 0);
        }
        KT_EQ(kt_target_verify(&tg, &b3, &b3, 1, 0x5a, 9), 0);
        kt_log("a second HELLO on one endpoint: its connection took no endpoint of the first's "
               "(its rendezvous write refused), the first one's write landed");
    }
    for (int k = 0; k < 2; k++) {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        keep_req(ucp_ep_close_nbx(eps[k], &p));
    }
    ep = first;
    progress_for(100);
    kt_region_free(&src);
}

/* ---- 7: a HELLO that names another writer's worker ----------------------------------------- */

/* The attacker sends, from its own endpoint, a HELLO naming an honest writer's worker address
 * (its metadata carries it). The target opens an endpoint towards that worker for the
 * connection, which UCX pairs with the writer's next endpoint towards the target, and answers
 * there: the honest writer drops an acknowledgement it never asked for. When the writer then
 * adds the target, its HELLO comes on that endpoint: the writer's rendezvous writes must land,
 * every byte verified, as they do without the attacker. */
static void impersonate(const kvx_md_t *md)
{
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_transport_t *h_t;
    kvx_transport_attr_t a0 = {.field_mask = KVX_TRANSPORT_ATTR_RECV}, a1 = a0;
    kvx_md_t hmd;
    uint8_t *hraw, h[4096];
    size_t hlen, n;
    uint32_t l[2] = {4, 5}, d[2] = {50, 51};
    kvx_completion_t c;
    uint64_t id, end;

    setenv("KT_RNDV", "always", 1);
    unsetenv("KT_RNDV_THRESH");
    kt_fill_all(&r, 0x33, 5);
    h_t = kt_transport(&r, "writer", 1);
    setenv("KT_RNDV", "auto", 1);
    setenv("KT_RNDV_THRESH", "1073741824", 1);
    hraw = kt_metadata(h_t, &hlen);
    KT_OK(kvx_md_decode(hraw, hlen, &hmd));
    KT_OK(kvx_transport_query(h_t, &a0));
    seen.hello_acks = 0;
    n = hello_naming(h, md->capability, hmd.worker_addr, hmd.worker_addr_len, NULL);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    /* the target answered towards the writer's worker, which dropped it */
    end = kt_now_ns() + 5000000000ull;
    do {
        progress_for(10);
        KT_OK(kvx_transport_query(h_t, &a1));
    } while (a1.recv.drop_unknown == a0.recv.drop_unknown && kt_now_ns() < end);
    KT_EQ(a1.recv.drop_unknown - a0.recv.drop_unknown, 1);
    KT_EQ(seen.hello_acks, 0);
    KT_OK(kvx_peer_add(h_t, "target", tg.md, tg.md_len, NULL));
    KT_OK(kvx_xfer_write(h_t, "target", l, d, 2, NULL, &id));
    KT_EQ(kt_poll_n(h_t, "target", &c, 1, 10000), 1);
    kt_log("a HELLO naming another writer's worker: that writer's rendezvous write ended %d",
           c.status);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(&tg, d, l, 2, 0x33, 5), 0);
    KT_EQ(kvx_peer_remove(h_t, "target"), 1);
    kvx_transport_destroy(h_t);
    free(hraw);
    kt_region_free(&r);
}

/* The same against a target with a secret, where the connection such a HELLO makes closes
 * unproven 2-3 s later (the proof's nonce went to the other writer): the endpoint it had stays the
 * writer's place, so the writer's rendezvous writes must land after that too. The target is a
 * transport in this process. */
static kvx_transport_t *rndv_transport(const kt_region_t *r, const char *name, int mode,
                                       uint64_t thresh, const char *secret)
{
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME |
                                    KVX_PARAM_NUM_THREADS | KVX_PARAM_SECRET | KVX_PARAM_RNDV,
                      .base = r->base,
                      .num_blocks = r->num_blocks,
                      .block_len = r->block_len,
                      .agent_name = name,
                      .num_threads = 1,
                      .secret = secret,
                      .secret_len = strlen(secret),
                      .rndv_mode = mode,
                      .rndv_thresh = thresh};
    kvx_transport_t *t;
    KT_OK(kvx_transport_create(&p, &t));
    return t;
}

static void impersonate_unproven(void)
{
    const char *secret = "the hostile test's secret";
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                 .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    kt_region_t tr = kt_region_alloc(NB, BL), wr = kt_region_alloc(NB, BL);
    kvx_transport_t *target = rndv_transport(&tr, "target", KVX_RNDV_AUTO, 1ull << 30, secret);
    kvx_transport_t *writer = rndv_transport(&wr, "writer", KVX_RNDV_ALWAYS, 0, secret);
    kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_RECV}, wa0 = ta, wa1 = ta;
    kvx_md_t tmd, wmd;
    uint8_t *traw, *wraw, h[4096];
    size_t tlen, wlen, n;
    uint32_t l[2] = {6, 7}, d[2] = {52, 53};
    kvx_completion_t c;
    ucp_ep_h first = ep;
    uint64_t id, end;

    kt_fill_all(&wr, 0x34, 6);
    traw = kt_metadata(target, &tlen);
    wraw = kt_metadata(writer, &wlen);
    KT_OK(kvx_md_decode(traw, tlen, &tmd));
    KT_OK(kvx_md_decode(wraw, wlen, &wmd));
    ep_params.address = (const ucp_address_t *)tmd.worker_addr;
    KT_CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
    progress_for(50);
    KT_OK(kvx_transport_query(writer, &wa0));
    seen.hello_acks = 0;
    n = hello_naming(h, tmd.capability, wmd.worker_addr, wmd.worker_addr_len, secret);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    end = kt_now_ns() + 10000000000ull;
    do { /* answered towards the writer, which dropped it; then closed unproven */
        progress_for(10);
        KT_OK(kvx_transport_query(writer, &wa1));
        KT_OK(kvx_transport_query(target, &ta));
    } while ((wa1.recv.drop_unknown == wa0.recv.drop_unknown || ta.recv.drop_unproven == 0) &&
             kt_now_ns() < end);
    KT_EQ(wa1.recv.drop_unknown - wa0.recv.drop_unknown, 1);
    KT_EQ(ta.recv.drop_unproven, 1);
    KT_EQ(seen.hello_acks, 0);
    KT_OK(kvx_peer_add(writer, "target", traw, tlen, NULL));
    KT_OK(kvx_xfer_write(writer, "target", l, d, 2, NULL, &id));
    KT_EQ(kt_poll_n(writer, "target", &c, 1, 10000), 1);
    kt_log("... and once the connection it made closed unproven: the writer's rendezvous write "
           "ended %d",
           c.status);
    KT_EQ(c.status, 0);
    KT_OK(kvx_transport_query(target, &ta));
    KT_EQ(ta.recv.rndv_landed, 1);
    for (int i = 0; i < 2; i++)
        KT_EQ(kt_check(&tr, d[i], 0x34, l[i], 6), 0);
    /* 17 more such HELLOs move the target's endpoint count towards the writer 17 on: the
     * target's own connection to the writer must still be answered (its catch-up is over the
     * writer's budget) and its write land */
    KT_OK(kvx_transport_query(writer, &wa0));
    for (int i = 0; i < 17; i++) {
        n = hello_naming(h, tmd.capability, wmd.worker_addr, wmd.worker_addr_len, secret);
        send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
        progress_for(5);
    }
    end = kt_now_ns() + 10000000000ull;
    do {
        progress_for(10);
        KT_OK(kvx_transport_query(writer, &wa1));
    } while (wa1.recv.drop_unknown - wa0.recv.drop_unknown < 17 && kt_now_ns() < end);
    KT_EQ(wa1.recv.drop_unknown - wa0.recv.drop_unknown, 17);
    kt_fill_all(&tr, 0x35, 7);
    KT_OK(kvx_peer_add(target, "writer", wraw, wlen, NULL));
    KT_OK(kvx_xfer_write(target, "writer", l, d, 2, NULL, &id));
    KT_EQ(kt_poll_n(target, "writer", &c, 1, 10000), 1);
    KT_OK(kvx_transport_query(writer, &wa1));
    kt_log("... and after 17 more, the target's own write to that writer ended %d (%llu answered "
           "without a catch-up)",
           c.status, (unsigned long long)(wa1.recv.catchup_over - wa0.recv.catchup_over));
    KT_EQ(c.status, 0);
    KT_EQ(wa1.recv.catchup_over - wa0.recv.catchup_over, 1);
    for (int i = 0; i < 2; i++)
        KT_EQ(kt_check(&wr, d[i], 0x35, l[i], 7), 0);
    KT_EQ(kvx_peer_remove(target, "writer"), 1);
    KT_EQ(kvx_peer_remove(writer, "target"), 1);
    keep_req(ucp_ep_close_nbx(ep, &cp));
    ep = first;
    progress_for(50);
    kvx_transport_destroy(writer);
    kvx_transport_destroy(target);
    free(traw);
    free(wraw);
    kt_region_free(&tr);
    kt_region_free(&wr);
}

/* ---- 8: a rendezvous write to a target that takes none ----------------------------------------
 */

/* A target made with KVX_RNDV_EAGER says in its HELLO_ACK that it takes no rendezvous payload (no
 * KVX_MSGF_RNDV), and kvx never sends it one; a peer that sends one anyway has it refused at its
 * header (the write fails -EPROTO, counted in drop_other), its payload never moves, and an eager
 * write on the same connection still lands. The target is a transport in this process. */
static void eager_target(void)
{
    kt_region_t tr = kt_region_alloc(NB, BL);
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME |
                                    KVX_PARAM_NUM_THREADS | KVX_PARAM_RNDV,
                      .base = tr.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .agent_name = "eager-target",
                      .num_threads = 1,
                      .rndv_mode = KVX_RNDV_EAGER};
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                 .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    kvx_transport_attr_t a0 = {.field_mask = KVX_TRANSPORT_ATTR_RECV}, a1 = a0;
    static uint8_t data[BL];
    uint8_t *raw, h[4096];
    kvx_transport_t *target;
    ucp_ep_h first = ep;
    kvx_md_t tmd;
    size_t len, n;
    int acks;

    kt_fill_all(&tr, 0x36, 8);
    KT_OK(kvx_transport_create(&p, &target));
    raw = kt_metadata(target, &len);
    KT_OK(kvx_md_decode(raw, len, &tmd));
    ep_params.address = (const ucp_address_t *)tmd.worker_addr;
    KT_CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
    progress_for(50);
    seen.hello_acks = 0;
    seen.ack_flags = 0xffff;
    n = hello(h, &tmd, tmd.capability);
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    for (int i = 0; i < 300 && seen.hello_acks == 0; i++)
        progress_for(10);
    KT_EQ(seen.hello_acks, 1);
    KT_EQ(seen.ack_flags, 0); /* it takes no rendezvous payload, and says so */
    KT_OK(kvx_transport_query(target, &a0));
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7 + 1);
    acks = seen.acks;
    n = write_hdr(h, seen.rconn_id, seen.token, 0, 3 * BL, BL, 0);
    send_raw(h, n, data, BL, UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    for (int i = 0; i < 300 && seen.acks == acks; i++)
        progress_for(10);
    KT_EQ(seen.acks, acks + 1);
    KT_ERR(seen.last_ack_status, -EPROTO);
    n = write_hdr(h, seen.rconn_id, seen.token, 0, 2 * BL, BL, 0);
    send_raw(h, n, data, BL, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    for (int i = 0; i < 300 && seen.acks == acks + 1; i++)
        progress_for(10);
    KT_EQ(seen.acks, acks + 2);
    KT_EQ(seen.last_ack_status, 0);
    KT_OK(kvx_transport_query(target, &a1));
    kt_log("a rendezvous write to a target that takes none: %s, %llu refused, %llu received by "
           "rendezvous; an eager one: landed",
           kvx_strerror(-EPROTO), (unsigned long long)(a1.recv.drop_other - a0.recv.drop_other),
           (unsigned long long)(a1.recv.rndv_landed - a0.recv.rndv_landed));
    KT_EQ(a1.recv.drop_other - a0.recv.drop_other, 1);
    KT_EQ(a1.recv.rndv_landed - a0.recv.rndv_landed, 0);
    KT_EQ(a1.recv.rndv_failed - a0.recv.rndv_failed, 0);
    KT_EQ(a1.recv.bytes_landed - a0.recv.bytes_landed, BL);
    KT_EQ(kt_check(&tr, 3, 0x36, 3, 8), 0); /* the refused one: unchanged */
    KT_CHECK(memcmp(tr.base + 2 * BL, data, BL) == 0);
    keep_req(ucp_ep_close_nbx(ep, &cp));
    ep = first;
    progress_for(50);
    kvx_transport_destroy(target);
    free(raw);
    kt_region_free(&tr);
}

/* ---- 9: a reader that holds rendezvous read data while the target closes --------------------- */

/* A reader that says it takes rendezvous read data (KVX_MSGF_RNDV) from a target made with
 * KVX_RNDV_ALWAYS asks 40 reads and keeps every READ_DATA's descriptor without receiving it, so
 * that the target's UCX holds all its sends; then the target closes. The close must drive UCX
 * until it has let go of them: destroying the worker with them still held made UCX 1.19.1 free
 * twice (the registration it made for each send, released while its callback queue was being
 * destroyed: 5 runs of 8), and left kvx's message records behind (ASan: 16 kvx_send_t). */
static void held_reads(void)
{
    kt_region_t tr = kt_region_alloc(NB, BL);
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME |
                                    KVX_PARAM_NUM_THREADS | KVX_PARAM_RNDV,
                      .base = tr.base,
                      .num_blocks = NB,
                      .block_len = BL,
                      .agent_name = "always-target",
                      .num_threads = 1,
                      .rndv_mode = KVX_RNDV_ALWAYS};
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                 .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    kvx_transport_attr_t a = {.field_mask = KVX_TRANSPORT_ATTR_RECV};
    uint8_t *raw, h[4096];
    kvx_transport_t *target;
    ucp_ep_h first = ep;
    kvx_md_t tmd;
    size_t len, n;
    uint64_t t0;

    kt_fill_all(&tr, 0x37, 9);
    KT_OK(kvx_transport_create(&p, &target));
    raw = kt_metadata(target, &len);
    KT_OK(kvx_md_decode(raw, len, &tmd));
    ep_params.address = (const ucp_address_t *)tmd.worker_addr;
    KT_CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
    progress_for(50);
    seen.hello_acks = 0;
    n = hello(h, &tmd, tmd.capability);
    h[2] |= KVX_MSGF_RNDV; /* it takes read data by rendezvous */
    send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    for (int i = 0; i < 300 && seen.hello_acks == 0; i++)
        progress_for(10);
    KT_EQ(seen.hello_acks, 1);
    hold_rndv = true;
    nheld = seen.read_rndv = 0;
    for (int i = 0; i < 40; i++) {
        n = read_hdr(h, 0, 16 * BL);
        kvx_put64(h + 16, 200 + (uint64_t)i);
        send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    }
    for (int i = 0; i < 300 && nheld < 16; i++)
        progress_for(10);
    KT_OK(kvx_transport_query(target, &a));
    kt_log("a reader holding rendezvous read data: %d held, %llu served by rendezvous", nheld,
           (unsigned long long)a.recv.rndv_served);
    KT_CHECK(nheld >= 1);
    t0 = kt_now_ns();
    KT_OK(kvx_transport_close(target));
    kt_log("... the target closed in %.1f ms", (double)(kt_now_ns() - t0) / 1e6);
    kvx_transport_destroy(target);
    hold_rndv = false;
    for (int i = 0; i < nheld; i++)
        ucp_am_data_release(worker, held[i]);
    nheld = 0;
    keep_req(ucp_ep_close_nbx(ep, &cp));
    ep = first;
    progress_for(50);
    free(raw);
    kt_region_free(&tr);
}

/* A child attacker announces a 256 KiB rendezvous write (the whole region) and is killed before
 * it progresses again: the receive the target started ends (it sees the connection fail), and
 * nothing of the target's outside the region moves. */
static void rndv_vanish(const kvx_md_t *md)
{
    kvx_recv_counters_t c0, c1;
    uint64_t end;
    pid_t pid;
    int st;

    kt_target_counters(&tg, &c0);
    pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        static uint8_t big[256 * 1024];
        uint8_t h[4096];
        size_t n;
        attacker_start(md);
        seen.hello_acks = 0;
        n = hello(h, md, md->capability);
        send_raw(h, n, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
        for (int i = 0; i < 200 && seen.hello_acks == 0; i++)
            progress_for(10);
        n = write_hdr(h, seen.rconn_id, seen.token, 0, 0, sizeof(big), 0);
        send_raw(h, n, big, sizeof(big),
                 UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY); /* announced, then gone */
        raise(SIGKILL);
    }
    KT_CHECK(waitpid(pid, &st, 0) == pid);
    end = kt_now_ns() + 15000000000ull; /* a busy host: UCX sees a shm peer gone in ~1-2 s */
    do {
        usleep(100 * 1000);
        kt_target_counters(&tg, &c1);
    } while (c1.rndv_failed + c1.rndv_landed == c0.rndv_failed + c0.rndv_landed &&
             c1.writes_landed == c0.writes_landed && kt_now_ns() < end);
    kt_log("a rendezvous write whose sender was killed: %llu failed, %llu landed",
           (unsigned long long)(c1.rndv_failed - c0.rndv_failed),
           (unsigned long long)(c1.rndv_landed - c0.rndv_landed));
    /* the receive started and ended, one way or the other */
    KT_EQ(c1.rndv_failed - c0.rndv_failed + c1.rndv_landed - c0.rndv_landed, 1);
}

/* ---- 4: kvx with forged metadata ----------------------------------------------------------- */

static void forged_metadata(kvx_transport_t *t, const uint8_t *md, size_t md_len)
{
    uint8_t *f = malloc(md_len);
    uint32_t crc, l[2] = {0, 1}, beyond[2] = {NB + 1, 2 * NB - 1};
    kvx_completion_t c;
    uint64_t id;

    memcpy(f, md, md_len);
    kvx_put64(f + 24, 2 * NB);                   /* num_blocks doubled */
    kvx_put64(f + 16, kvx_get64(f + 16) - 8192); /* base moved */
    memset(f + 12, 0, 4);
    crc = kvx_crc32(f, md_len);
    kvx_put32(f + 12, crc);
    KT_OK(kvx_peer_add(t, "forged", f, md_len, NULL));
    KT_OK(kvx_xfer_write(t, "forged", l, beyond, 2, NULL, &id));
    KT_EQ(kt_poll_n(t, "forged", &c, 1, 5000), 1);
    KT_ERR(c.status, -EINVAL);
    KT_OK(kvx_xfer_read(t, "forged", l, beyond, 2, NULL, &id));
    KT_EQ(kt_poll_n(t, "forged", &c, 1, 5000), 1);
    KT_ERR(c.status, -EINVAL);
    kt_log("forged metadata (num_blocks doubled, base moved): a write and a read beyond the "
           "region refused");
    KT_EQ(kvx_peer_remove(t, "forged"), 1);
    free(f);
}

static int attack(void)
{
    kt_region_t r = kt_region_alloc(NB, BL);
    kvx_transport_t *t;
    kvx_md_t md;
    uint64_t base, canary;
    uint32_t l[3] = {1, 2, 3}, d[3] = {40, 41, 42};
    kvx_completion_t c;
    uint64_t id;

    KT_OK(kvx_md_decode(tg.md, tg.md_len, &md));
    kt_target_info(&tg, &base, &canary);
    attacker_start(&md);
    rma_attacks(base, canary);
    KT_EQ(kt_target_canaries(&tg), 0);
    rma_zcopy_attack(&md, base);
    KT_EQ(kt_target_canaries(&tg), 0);
    message_attacks(&md);
    notice_attacks();
    KT_EQ(kt_target_canaries(&tg), 0);
    region_attacks();
    rndv_stall(&md, 1, false); /* the attacker's second endpoint: its stall limit */
    KT_EQ(kt_target_canaries(&tg), 0);
    rndv_stall(&md, 2, true); /* its third: a fence */
    KT_EQ(kt_target_canaries(&tg), 0);
    hello_order(&md); /* its fourth and fifth */
    KT_EQ(kt_target_canaries(&tg), 0);
    impersonate(&md);
    KT_EQ(kt_target_canaries(&tg), 0);
    impersonate_unproven();
    eager_target();
    held_reads();
    attacker_stop();
    rndv_vanish(&md);
    KT_EQ(kt_target_canaries(&tg), 0);

    /* a real peer is still served, every byte verified */
    kt_fill_all(&r, 0x71, 3);
    t = kt_transport(&r, "honest", 1);
    forged_metadata(t, tg.md, tg.md_len);
    KT_OK(kvx_peer_add(t, "target", tg.md, tg.md_len, NULL));
    KT_OK(kvx_xfer_write(t, "target", l, d, 3, NULL, &id));
    KT_EQ(kt_poll_n(t, "target", &c, 1, 5000), 1);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(&tg, d, l, 3, 0x71, 3), 0);
    KT_EQ(kt_target_canaries(&tg), 0);
    kvx_transport_destroy(t);
    kt_region_free(&r);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "shm";
    kt_target_args_t a = {
        .num_blocks = NB, .block_len = BL, .salt = 8, .threads = 1, .name = "victim"};

    /* the target takes rendezvous payloads (it chose rendezvous, with a threshold so high that
     * its own read replies stay eager, which this attacker reads): a default one refuses them
     * all (tests/test_xfer.c) */
    setenv("KT_RNDV", "auto", 1);
    setenv("KT_RNDV_THRESH", "1073741824", 1);
    if (strcmp(mode, "netns") == 0)
        return kt_two_hosts(&ns, &tg, &a, attack, 90);
    if (strcmp(mode, "tcp") == 0)
        setenv("UCX_TLS", "tcp", 1);
    else
        one_host = true;
    tg = kt_target_start(&a);
    attack();
    return kt_target_stop(&tg);
}
