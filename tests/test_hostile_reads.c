/*
 * A target that is not kvx: a program using UCX directly (in this process, its own context and
 * worker) publishes metadata, answers kvx's handshake, then answers kvx reads with rendezvous
 * READ_DATA that kvx must check against its own request before it receives anything: a wrong
 * transfer id and an offset outside the request (dropped: the read fails at its deadline), a
 * length larger than asked and a piece crossing a local run's end (refused: -EPROTO), one
 * legitimate answer (received, verified byte for byte), and, over tcp, one whose payload never
 * comes (the target stops progressing: the read fails at its deadline, only once its receive
 * ended with the connection's close). The initiator's blocks outside each request stay
 * untouched, nothing crashes. argv[1]: shm or tcp.
 */
#include "harness.h"
#include "kvx_int.h"
#include "rawucx.h"

#include <errno.h>
#include <string.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define BL 4096
#define NB 64
#define AM_ID KT_RAWUCX_AM_ID

static ucp_context_h ctx;
static ucp_worker_h worker;
static ucp_ep_h ep;
static uint8_t payload[8 * BL];
static struct {
    uint32_t conn_id;
    uint64_t token;
    int reqs;
    uint64_t xfer_id, stream_off, bytes;
} seen;
static void *reqs[256];
static int nreqs;

static ucs_status_t on_msg(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                           const ucp_am_recv_param_t *param)
{
    kvx_msg_t m;
    (void)arg;
    (void)data;
    (void)param;
    if (kvx_wire_decode(hdr, hdr_len, len, &m) < 0)
        return UCS_OK;
    if (m.type == KVX_MSG_HELLO && ep == NULL) {
        ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                     .address = (const ucp_address_t *)m.u.hello.waddr,
                                     .err_mode = UCP_ERR_HANDLING_MODE_PEER};
        seen.conn_id = m.u.hello.conn_id;
        seen.token = m.u.hello.token;
        KT_CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
    } else if (m.type == KVX_MSG_READ_REQ) {
        seen.reqs++;
        seen.xfer_id = m.u.read_req.xfer_id;
        seen.stream_off = m.u.read_req.stream_off;
        seen.bytes = m.u.read_req.bytes;
    }
    return UCS_OK;
}

static void progress_for(uint64_t ms)
{
    uint64_t end = (kt_now_ns() / 1000000) + ms;
    while ((kt_now_ns() / 1000000) < end)
        if (ucp_worker_progress(worker) == 0)
            usleep(100);
}

static void send_msg(const uint8_t *hdr, size_t hdr_len, const void *data, size_t len,
                     uint32_t flags)
{
    static uint8_t hdrs[64][KVX_WIRE_HELLO_ACK_LEN];
    static int next;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = flags};
    uint8_t *h = hdrs[next++ % 64];
    void *req;

    memcpy(h, hdr, hdr_len);
    req = ucp_am_send_nbx(ep, AM_ID, h, hdr_len, data, len, &p);
    KT_CHECK(!UCS_PTR_IS_ERR(req));
    if (req != NULL && nreqs < 256)
        reqs[nreqs++] = req;
}

static void read_data(uint64_t xfer_id, uint64_t stream_off, uint32_t len)
{
    uint8_t h[KVX_WIRE_READ_DATA_LEN] = {0};
    kvx_wire_put_hdr(h, KVX_MSG_READ_DATA, 0, seen.conn_id, seen.token);
    kvx_put64(h + 16, xfer_id);
    kvx_put64(h + 24, stream_off);
    kvx_put32(h + 32, len);
    send_msg(h, sizeof(h), payload, len, UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
}

/* A read of 4 blocks (local contiguous or scattered, into [16, 32)), answered by answer(); its
 * completion's status must be want, and every local block it did not ask for untouched. */
static void one_read(kvx_transport_t *t, kt_region_t *r, bool scattered, int want,
                     void (*answer)(void), bool stop_target)
{
    uint32_t li[4], ri[4] = {0, 1, 2, 3};
    kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_DEADLINE, .deadline_ms = 400};
    kvx_completion_t c;
    uint64_t id, end;
    int got = 0, reqs0 = seen.reqs;

    for (int i = 0; i < 4; i++)
        li[i] = 16 + (uint32_t)i * (scattered ? 2 : 1);
    memset(r->base, 0xee, NB * BL);
    KT_OK(kvx_xfer_read(t, "fake", li, ri, 4, &xp, &id));
    end = (kt_now_ns() / 1000000) + 5000;
    while (seen.reqs == reqs0 && (kt_now_ns() / 1000000) < end)
        progress_for(1);
    KT_EQ(seen.reqs, reqs0 + 1);
    KT_EQ(seen.xfer_id, id);
    KT_EQ(seen.bytes, 4 * BL);
    answer();
    end = (kt_now_ns() / 1000000) + 10000;
    while (got == 0 && (kt_now_ns() / 1000000) < end) {
        if (!stop_target)
            progress_for(1);
        else
            usleep(1000);
        got = kvx_transport_poll(t, "fake", &c, 1);
        KT_CHECK(got >= 0);
    }
    KT_EQ(got, 1);
    KT_EQ(c.id, id);
    kt_log("read answered so: status %d (%s)", c.status, kvx_strerror(c.status));
    KT_EQ(c.status, want);
    for (uint32_t b = 0; b < NB; b++) {
        bool asked = false;
        for (int i = 0; i < 4; i++)
            asked |= li[i] == b;
        if (asked && want == 0)
            KT_EQ(memcmp(r->base + (uint64_t)b * BL, payload + (uint64_t)(b - 16) * BL, BL), 0);
        if (asked)
            continue;
        for (size_t k = 0; k < BL; k++)
            if (r->base[(uint64_t)b * BL + k] != 0xee)
                KT_FAIL("block %u outside the read changed at %zu", b, k);
    }
}

static void wrong_id(void) { read_data(seen.xfer_id + 1000, seen.stream_off, 4 * BL); }
static void outside(void) { read_data(seen.xfer_id, seen.stream_off + 4 * BL, BL); }
static void too_long(void) { read_data(seen.xfer_id, seen.stream_off, 5 * BL); }
static void crossing(void) { read_data(seen.xfer_id, seen.stream_off, 2 * BL); }
static void legit(void) { read_data(seen.xfer_id, seen.stream_off, 4 * BL); }

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "shm";
    bool tcp = strcmp(mode, "tcp") == 0;
    ucp_address_t *addr;
    size_t addr_len, md_len;
    kvx_md_t md = {0};
    uint8_t *blob;
    uint8_t ack[KVX_WIRE_HELLO_ACK_LEN] = {0};
    kt_region_t r;
    kvx_transport_t *t;
    uint64_t end;

    setenv("UCX_TLS", tcp ? "tcp" : "sm,self", 1);
    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (uint8_t)(i * 7 + 3);
    ctx = kt_rawucx_context(UCP_FEATURE_AM);
    worker = kt_rawucx_worker(ctx, on_msg);
    KT_CHECK(ucp_worker_get_address(worker, &addr, &addr_len) == UCS_OK);

    snprintf(md.agent_name, sizeof(md.agent_name), "fake-target");
    md.base = 0x10000000;
    md.num_blocks = NB;
    md.block_len = BL;
    md.generation = 1;
    memset(md.capability, 0x5a, sizeof(md.capability));
    md.worker_addr = (const uint8_t *)addr;
    md.worker_addr_len = (uint32_t)addr_len;
    md_len = kvx_md_encoded_len(&md);
    blob = malloc(md_len);
    KT_CHECK(blob != NULL);
    KT_OK(kvx_md_encode(&md, NULL, 0, blob, md_len));

    r = kt_region_alloc(NB, BL);
    setenv("KT_RNDV", "always", 1); /* the reader takes rendezvous replies (a default one refuses
                                     * them: tests/test_xfer.c) */
    t = kt_transport(&r, NULL, 1);
    KT_OK(kvx_peer_add(t, "fake", blob, md_len, NULL));
    end = (kt_now_ns() / 1000000) + 5000;
    while (ep == NULL && (kt_now_ns() / 1000000) < end)
        progress_for(1);
    KT_CHECK(ep != NULL);
    kvx_wire_put_hdr(ack, KVX_MSG_HELLO_ACK, 0, seen.conn_id, seen.token);
    kvx_put32(ack + 16, 7);
    kvx_put64(ack + 24, 0x1234);
    send_msg(ack, sizeof(ack), NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    progress_for(100);

    one_read(t, &r, false, -ETIMEDOUT, wrong_id, false);
    one_read(t, &r, false, -ETIMEDOUT, outside, false);
    one_read(t, &r, false, -EPROTO, too_long, false);
    one_read(t, &r, true, -EPROTO, crossing, false);
    one_read(t, &r, false, 0, legit, false);
    if (tcp) /* over shared memory the reader may fetch the payload without the target */
        one_read(t, &r, false, -ETIMEDOUT, legit, true);

    KT_OK(kvx_transport_close(t)); /* when it returns, nothing touches the region any more */
    kvx_transport_destroy(t);
    for (int i = 0; i < nreqs; i++)
        if (ucp_request_check_status(reqs[i]) != UCS_INPROGRESS)
            ucp_request_free(reqs[i]);
    if (ep != NULL) {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *req = ucp_ep_close_nbx(ep, &p);
        while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(worker);
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req);
    }
    ucp_worker_release_address(worker, addr);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    free(blob);
    kt_region_free(&r);
    kt_log("hostile rendezvous read answers: each refused or ended as it should");
    return 0;
}
