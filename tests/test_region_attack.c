/*
 * A raw-UCX peer (holding the metadata and one region's blob) against a kvx target in this
 * process whose extra region g sits between canaries (0xca), attacking the deregistration fence.
 * argv[1] scenario, argv[2] shm|tcp.
 *   deadctl   its window full (16 rendezvous READ_DATA held, never received), 40 READ_REQs of g
 *             queued, the control queue filled with NOTICEs; the owner then deregisters g: the
 *             refusal of the first queued read dooms the connection, which drops the rest of
 *             the queue being walked. The target survives, the call returns within its bound.
 *   rndvdereg a rendezvous WRITE into g announced, the sender stalls; the owner deregisters g,
 *             overwrites it; the sender resumes: no byte lands.
 *   readdereg 16 rendezvous READ_DATA of g held by the reader, reads queued; the owner
 *             deregisters g. Returned 0: the reader gets no byte written after it. -ETIMEDOUT
 *             (tcp: UCX cannot take back a send it holds, kvx.h): the region stays registered,
 *             and once the reader takes what it holds a later call returns 0.
 */
#include "harness.h"
#include "kvx_int.h"
#include "rawucx.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define AM_ID KT_RAWUCX_AM_ID
#define GLEN ((size_t)1 << 20)
#define PAD (64 * 1024)

static uint8_t *mem, *greg;
static kvx_transport_t *tgt;
static kvx_md_t md;
static uint8_t *mdraw;
static size_t mdlen;
static uint32_t gid;
static uint8_t gcap[16];

static ucp_context_h ctx;
static ucp_worker_h worker;
static ucp_ep_h ep;
static bool no_progress;
static void *reqs[8192];
static int nreqs;
static void *held_desc[64];
static size_t held_len[64];
static int nheld;
static bool hold_rndv;

static struct {
    int hello_acks, acks, read_data, read_rndv, notice_acks, read_refused;
    uint32_t rconn_id;
    uint64_t token, epoch;
    int32_t last_ack_status, last_read_status;
} seen;

static ucs_status_t on_reply(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                             const ucp_am_recv_param_t *param)
{
    kvx_msg_t m;
    (void)arg;
    if (kvx_wire_decode(hdr, hdr_len, len, &m) < 0)
        return UCS_OK;
    if (m.type == KVX_MSG_HELLO_ACK) {
        seen.hello_acks++;
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
    } else if (m.type == KVX_MSG_READ_DATA) {
        seen.read_data++;
        seen.last_read_status = m.u.read_data.status;
        if (m.u.read_data.status < 0)
            seen.read_refused++;
        if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
            seen.read_rndv++;
            if (hold_rndv && nheld < 64) {
                held_len[nheld] = len;
                held_desc[nheld++] = data;
                return UCS_INPROGRESS;
            }
        }
    }
    return UCS_OK;
}

static void progress_for(uint64_t ms)
{
    uint64_t end = kt_now_ns() + ms * 1000000ull;
    while (kt_now_ns() < end)
        ucp_worker_progress(worker);
}

static void keep_req(void *req)
{
    if (UCS_PTR_IS_PTR(req) && nreqs < 8192)
        reqs[nreqs++] = req;
    if (!no_progress)
        ucp_worker_progress(worker);
}

static void send_raw(const void *hdr, size_t hdr_len, const void *data, size_t len, uint32_t flags)
{
    static uint8_t hdrs[1024][640];
    static int next;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = flags};
    uint8_t *h = hdrs[next++ % 1024];
    memcpy(h, hdr, hdr_len);
    keep_req(ucp_am_send_nbx(ep, AM_ID, h, hdr_len, data, len, &p));
}

static bool do_hello(unsigned flags)
{
    uint8_t h[4096];
    ucp_address_t *addr;
    size_t alen;
    int before = seen.hello_acks;
    KT_CHECK(ucp_worker_get_address(worker, &addr, &alen) == UCS_OK);
    memset(h, 0, KVX_WIRE_HELLO_LEN);
    kvx_wire_put_hdr(h, KVX_MSG_HELLO, flags, 0, 0);
    memcpy(h + 16, md.capability, 16);
    kvx_put32(h + 32, 7);
    kvx_put64(h + 40, 0x1234);
    h[56] = 8;
    kvx_put32(h + 60, (uint32_t)alen);
    memcpy(h + 64, "attacker", 8);
    memcpy(h + 72, addr, alen);
    send_raw(h, 72 + alen, NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    ucp_worker_release_address(worker, addr);
    for (int i = 0; i < 300 && seen.hello_acks == before; i++)
        progress_for(10);
    return seen.hello_acks > before;
}

static size_t write_hdr(uint8_t *h, uint64_t off, uint32_t len)
{
    static uint64_t xfer_id = 100;
    kvx_wire_run_t run = {off, len, 0};
    kvx_wire_put_hdr(h, KVX_MSG_WRITE, 0, seen.rconn_id, seen.token);
    kvx_put64(h + 16, xfer_id++);
    kvx_put64(h + 24, 0);
    kvx_put64(h + 32, seen.epoch);
    kvx_put32(h + 40, 1);
    kvx_put32(h + 44, gid);
    memcpy(h + 48, gcap, 16);
    kvx_wire_run_put(h + KVX_WIRE_WRITE_LEN, 0, &run);
    return KVX_WIRE_WRITE_LEN + KVX_WIRE_RUN_LEN;
}

static void send_read(uint64_t xfer_id, uint64_t off, uint32_t len)
{
    uint8_t h[128];
    kvx_wire_run_t run = {off, len, 0};
    memset(h, 0, sizeof(h));
    kvx_wire_put_hdr(h, KVX_MSG_READ_REQ, 0, seen.rconn_id, seen.token);
    kvx_put64(h + 16, xfer_id);
    kvx_put64(h + 24, 0);
    kvx_put32(h + 32, 1);
    kvx_put32(h + 36, 0);
    kvx_put32(h + 40, gid);
    memcpy(h + 48, gcap, 16);
    kvx_wire_run_put(h + KVX_WIRE_READ_REQ_LEN, 0, &run);
    send_raw(h, KVX_WIRE_READ_REQ_LEN + KVX_WIRE_RUN_LEN, NULL, 0,
             UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
}

static void send_notice(uint64_t xfer_id)
{
    uint8_t h[KVX_WIRE_NOTICE_LEN];
    memset(h, 0, sizeof(h));
    kvx_wire_put_hdr(h, KVX_MSG_NOTICE, 0, seen.rconn_id, seen.token);
    kvx_put64(h + 16, xfer_id);
    kvx_put64(h + 24, 0);
    kvx_put64(h + 32, seen.epoch);
    kvx_put64(h + 40, 1);
    kvx_put64(h + 48, 1);
    send_raw(h, sizeof(h), NULL, 0, UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
}

static size_t count_byte(const uint8_t *p, size_t n, uint8_t b)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == b;
    return k;
}

static int canaries_bad(void)
{
    size_t bad = (PAD - count_byte(mem, PAD, 0xca)) + (PAD - count_byte(greg + GLEN, PAD, 0xca));
    if (bad)
        kt_log("!!! %zu canary bytes changed", bad);
    return bad != 0;
}

static void target_start(int mode, uint64_t stall_ms)
{
    static uint8_t main_region[64 * 4096];
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME |
                                    KVX_PARAM_NUM_THREADS | KVX_PARAM_RNDV | KVX_PARAM_STALL,
                      .base = main_region,
                      .num_blocks = 64,
                      .block_len = 4096,
                      .agent_name = "victim",
                      .num_threads = 1,
                      .rndv_mode = mode,
                      .stall_ms = stall_ms};
    uint8_t blob[KVX_REGION_BLOB_MAX];
    size_t blen = sizeof(blob);
    kvx_region_blob_t rb;

    mem = mmap(NULL, GLEN + 2 * PAD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KT_CHECK(mem != MAP_FAILED);
    memset(mem, 0xca, GLEN + 2 * PAD);
    greg = mem + PAD;
    memset(greg, 0x11, GLEN);
    KT_OK(kvx_transport_create(&p, &tgt));
    mdraw = kt_metadata(tgt, &mdlen);
    KT_OK(kvx_md_decode(mdraw, mdlen, &md));
    KT_OK(kvx_region_register(tgt, greg, GLEN, NULL, &gid));
    KT_OK(kvx_region_blob(tgt, gid, blob, &blen));
    KT_OK(kvx_region_blob_decode(blob, blen, &rb)); /* the attacker's copy of the blob */
    memcpy(gcap, rb.capability, 16);
    kt_log("target up: region %u of %zu bytes", gid, GLEN);
}

static void attacker_start(void)
{
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                 .address = (const ucp_address_t *)md.worker_addr,
                                 .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    ctx = kt_rawucx_context(UCP_FEATURE_AM);
    worker = kt_rawucx_worker(ctx, on_reply);
    KT_CHECK(ucp_ep_create(worker, &ep_params, &ep) == UCS_OK);
    progress_for(50);
}

static void attacker_stop(void)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req;
    for (int i = 0; i < nheld; i++)
        ucp_am_data_release(worker, held_desc[i]);
    nheld = 0;
    req = ucp_ep_close_nbx(ep, &p);
    uint64_t end = kt_now_ns() + 2000000000ull;
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
           kt_now_ns() < end)
        ucp_worker_progress(worker);
    if (UCS_PTR_IS_PTR(req))
        ucp_request_free(req);
    for (int i = 0; i < nreqs; i++)
        if (ucp_request_check_status(reqs[i]) != UCS_INPROGRESS)
            ucp_request_free(reqs[i]);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
}

static void region_counters(const char *what)
{
    kvx_transport_attr_t a = {.field_mask = KVX_TRANSPORT_ATTR_REGIONS | KVX_TRANSPORT_ATTR_RECV};
    KT_OK(kvx_transport_query(tgt, &a));
    kt_log("%s: regions registered %llu drop_region %llu dereg_closed %llu; recv landed %llu "
           "rndv_failed %llu overflow %llu",
           what, (unsigned long long)a.regions.registered,
           (unsigned long long)a.regions.drop_region, (unsigned long long)a.regions.dereg_closed,
           (unsigned long long)a.recv.bytes_landed, (unsigned long long)a.recv.rndv_failed,
           (unsigned long long)a.recv.conns_overflow);
}

/* fill the send window with held rendezvous READ_DATA */
static void fill_window(void)
{
    hold_rndv = true;
    for (int i = 0; i < 16; i++)
        send_read(1000 + i, (uint64_t)i * 65536, 65536);
    for (int i = 0; i < 500 && nheld < 16; i++)
        progress_for(10);
    kt_log("held %d rendezvous READ_DATA (window full)", nheld);
    KT_CHECK(nheld == 16);
}

static int sc_deadctl(void)
{
    uint64_t t0;
    int rc;

    target_start(KVX_RNDV_ALWAYS, 5000);
    attacker_start();
    KT_CHECK(do_hello(KVX_MSGF_RNDV));
    fill_window();
    for (int i = 0; i < 40; i++) /* queued: the window is full */
        send_read(2000 + i, 0, 4096);
    for (int i = 0; i < 256; i++) /* each one's NOTICE_ACK waits in the control queue */
        send_notice(5000 + i);
    progress_for(500);
    kt_log("queued 40 reads and 256 notices (acks seen %d)", seen.notice_acks);
    t0 = kt_now_ns();
    rc = kvx_region_deregister(tgt, gid);
    kt_log("kvx_region_deregister: %d (%s) after %.0f ms", rc, kvx_strerror(rc),
           (double)(kt_now_ns() - t0) / 1e6);
    region_counters("after");
    KT_CHECK(rc == 0 || rc == -ETIMEDOUT);
    KT_CHECK(kt_now_ns() - t0 < 2500000000ull); /* min(1 s, stall) + 200 ms, and slack */
    progress_for(300);
    rc = canaries_bad();
    attacker_stop();
    kvx_transport_destroy(tgt);
    return rc;
}

static int sc_rndvdereg(void)
{
    uint8_t h[256];
    static uint8_t payload[256 * 1024];
    uint64_t t0;
    int rc, bad;
    size_t changed;

    target_start(KVX_RNDV_ALWAYS, 5000);
    attacker_start();
    KT_CHECK(do_hello(0));
    memset(payload, 0x5c, sizeof(payload));
    no_progress = true;
    send_raw(h, write_hdr(h, 4096, sizeof(payload)), payload, sizeof(payload),
             UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
    usleep(300 * 1000);
    t0 = kt_now_ns();
    rc = kvx_region_deregister(tgt, gid);
    kt_log("kvx_region_deregister with a stalled rendezvous WRITE in flight: %d (%s) after %.0f ms"
           " (bytes of the payload already in: %zu)",
           rc, kvx_strerror(rc), (double)(kt_now_ns() - t0) / 1e6, count_byte(greg, GLEN, 0x5c));
    memset(greg, 0x77, GLEN); /* the memory is the application's again */
    no_progress = false;
    progress_for(2000);
    changed = GLEN - count_byte(greg, GLEN, 0x77);
    kt_log("%s: %zu bytes of the region changed after deregister returned",
           changed ? "!!! FENCE BROKEN" : "held", changed);
    region_counters("after");
    bad = canaries_bad() || changed != 0;
    attacker_stop();
    kvx_transport_destroy(tgt);
    return bad;
}

static void recv_cb(void *req, ucs_status_t st, size_t len, void *arg)
{
    (void)req, (void)len;
    *(ucs_status_t *)arg = st;
}

static int sc_readdereg(void)
{
    static uint8_t buf[65536];
    uint64_t t0;
    int rc, leaked = 0, got = 0;

    target_start(KVX_RNDV_ALWAYS, 5000);
    attacker_start();
    KT_CHECK(do_hello(KVX_MSGF_RNDV));
    fill_window();
    for (int i = 0; i < 8; i++)
        send_read(2000 + i, 0, 4096);
    progress_for(300);
    t0 = kt_now_ns();
    rc = kvx_region_deregister(tgt, gid);
    kt_log("kvx_region_deregister with 16 READ_DATA held + 8 queued: %d (%s) after %.0f ms", rc,
           kvx_strerror(rc), (double)(kt_now_ns() - t0) / 1e6);
    KT_CHECK(rc == 0 || rc == -ETIMEDOUT);
    if (rc == 0)
        memset(greg, 0x77, GLEN); /* the memory is the application's again: a secret */
    region_counters("after");
    hold_rndv = false;
    for (int i = 0; i < nheld; i++) {
        ucs_status_t st = UCS_INPROGRESS;
        ucp_request_param_t p = {.op_attr_mask =
                                     UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                                 .cb.recv_am = recv_cb,
                                 .user_data = &st};
        void *req;
        memset(buf, 0, sizeof(buf));
        req = ucp_am_recv_data_nbx(worker, held_desc[i], buf, held_len[i], &p);
        if (req == NULL)
            st = UCS_OK;
        else if (UCS_PTR_IS_ERR(req))
            st = UCS_PTR_STATUS(req);
        else {
            uint64_t end = kt_now_ns() + 300000000ull; /* one that can come comes at once */
            while (st == UCS_INPROGRESS && kt_now_ns() < end)
                ucp_worker_progress(worker);
            if (st == UCS_INPROGRESS) {
                ucp_request_cancel(worker, req);
                progress_for(10);
            }
            ucp_request_free(req);
        }
        if (st == UCS_OK) {
            got++;
            if (count_byte(buf, held_len[i], 0x77) > 0)
                leaked++;
        }
    }
    nheld = 0;
    kt_log("%s: after deregister returned %d, %d of the held READ_DATA still received, %d "
           "carrying bytes written after it (0x77); read replies refused %d",
           leaked ? "!!! READ AFTER FENCE" : "held", rc, got, leaked, seen.read_refused);
    if (rc == -ETIMEDOUT) { /* the reader took what UCX held: the region lets go now */
        progress_for(500);
        t0 = kt_now_ns();
        rc = kvx_region_deregister(tgt, gid);
        kt_log("deregister again once the reader took its data: %d (%s) after %.0f ms", rc,
               kvx_strerror(rc), (double)(kt_now_ns() - t0) / 1e6);
        KT_EQ(rc, 0);
    }
    leaked += canaries_bad();
    progress_for(200);
    attacker_stop();
    kvx_transport_destroy(tgt);
    return leaked != 0;
}

int main(int argc, char **argv)
{
    const char *sc = argc > 1 ? argv[1] : "deadctl";
    if (argc > 2 && strcmp(argv[2], "tcp") == 0)
        setenv("UCX_TLS", "tcp", 1);
    if (strcmp(sc, "deadctl") == 0)
        return sc_deadctl();
    if (strcmp(sc, "rndvdereg") == 0)
        return sc_rndvdereg();
    if (strcmp(sc, "readdereg") == 0)
        return sc_readdereg();
    return 2;
}
