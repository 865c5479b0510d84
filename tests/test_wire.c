/*
 * The wire format's one table and its encoder against its decoder: every message type is in the
 * table (length, flags, who takes it, rendezvous), and each type encoded from a message with
 * every field set decodes back to the same fields, at the length the table says (the fuzzer
 * checks the other way round: whatever decodes encodes back to the same bytes).
 */
#include "harness.h"
#include "kvx_int.h"

#include <string.h>

static uint8_t buf[KVX_WIRE_ACK_LEN + KVX_WIRE_MAX_ACKS * KVX_WIRE_ACK_ENTRY_LEN];

static void round_trip(const kvx_msg_t *in, size_t data_len, size_t want_len, kvx_msg_t *out)
{
    const kvx_wire_type_t *ty = kvx_wire_type(in->type);
    size_t n = kvx_wire_encode(in, buf);

    if (n != want_len)
        KT_FAIL("%s: encoded %zu bytes, want %zu", ty->name, n, want_len);
    if (kvx_wire_decode(buf, n, data_len, out) != 0)
        KT_FAIL("%s: its encoding does not decode", ty->name);
    KT_EQ(out->type, in->type);
    KT_EQ(out->flags, in->flags);
    KT_EQ(out->conn_id, in->conn_id);
    KT_EQ(out->token, in->token);
}

static void table(void)
{
    static const struct {
        unsigned type;
        uint8_t to;
        bool rndv;
    } want[] = {
        {KVX_MSG_HELLO, KVX_TO_RECEIVER, false},       {KVX_MSG_HELLO_ACK, KVX_TO_INITIATOR, false},
        {KVX_MSG_WRITE, KVX_TO_RECEIVER, true},        {KVX_MSG_ACK, KVX_TO_INITIATOR, false},
        {KVX_MSG_READ_REQ, KVX_TO_RECEIVER, false},    {KVX_MSG_READ_DATA, KVX_TO_INITIATOR, true},
        {KVX_MSG_FENCE, KVX_TO_INITIATOR, false},      {KVX_MSG_NOTICE, KVX_TO_RECEIVER, false},
        {KVX_MSG_NOTICE_ACK, KVX_TO_INITIATOR, false}, {KVX_MSG_BYE, KVX_TO_RECEIVER, false},
        {KVX_MSG_CHALLENGE, KVX_TO_PAIRING, false},    {KVX_MSG_MD_REQ, KVX_TO_PAIRING, false},
        {KVX_MSG_MD, KVX_TO_PAIRING, false},           {KVX_MSG_PROOF, KVX_TO_RECEIVER, false}};

    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const kvx_wire_type_t *ty = kvx_wire_type(want[i].type);
        KT_CHECK(ty->fixed >= KVX_WIRE_HDR_LEN);
        KT_EQ(ty->to, want[i].to);
        KT_EQ(ty->rndv, want[i].rndv);
    }
    KT_EQ(kvx_wire_type(0)->to, KVX_TO_NOBODY);
    KT_EQ(kvx_wire_type(KVX_MSG_PROOF + 1)->fixed, 0);
    KT_EQ(kvx_wire_type(255)->fixed, 0);
}

int main(void)
{
    uint8_t cap[16], nonce[16], seg[16], mac[32], runs[2 * KVX_WIRE_RUN_LEN];
    uint8_t entries[3 * KVX_WIRE_ACK_ENTRY_LEN], waddr[40];
    kvx_wire_run_t r = {1 << 20, 65536, 0xabcd}, r2;
    kvx_msg_t m, d;
    size_t n;

    memset(cap, 0x11, sizeof(cap));
    memset(nonce, 0x22, sizeof(nonce));
    memset(seg, 0x33, sizeof(seg));
    memset(mac, 0x44, sizeof(mac));
    memset(waddr, 0x55, sizeof(waddr));
    table();

    m = (kvx_msg_t){.type = KVX_MSG_HELLO,
                    .flags = KVX_MSGF_RNDV,
                    .u.hello = {.capability = cap,
                                .conn_id = 7,
                                .ep_sn = 3,
                                .token = 99,
                                .generation = 1234,
                                .waddr = waddr,
                                .waddr_len = sizeof(waddr)}};
    strcpy(m.u.hello.name, "writer-a");
    round_trip(&m, 0, KVX_WIRE_HELLO_LEN + 8 + sizeof(waddr), &d);
    KT_CHECK(memcmp(d.u.hello.capability, cap, 16) == 0);
    KT_EQ(d.u.hello.conn_id, 7);
    KT_EQ(d.u.hello.ep_sn, 3);
    KT_EQ(d.u.hello.token, 99);
    KT_EQ(d.u.hello.generation, 1234);
    KT_CHECK(strcmp(d.u.hello.name, "writer-a") == 0);
    KT_EQ(d.u.hello.waddr_len, sizeof(waddr));
    KT_CHECK(memcmp(d.u.hello.waddr, waddr, sizeof(waddr)) == 0);

    m = (kvx_msg_t){
        .type = KVX_MSG_HELLO_ACK,
        .flags = KVX_MSGF_RNDV,
        .conn_id = 7,
        .token = 99,
        .u.hello_ack = {.rconn_id = 5, .token = 77, .epoch = 3, .seg_token = seg, .nonce = nonce}};
    round_trip(&m, 0, KVX_WIRE_HELLO_ACK_LEN, &d);
    KT_EQ(d.u.hello_ack.rconn_id, 5);
    KT_EQ(d.u.hello_ack.status, 0);
    KT_EQ(d.u.hello_ack.token, 77);
    KT_EQ(d.u.hello_ack.epoch, 3);
    KT_CHECK(memcmp(d.u.hello_ack.seg_token, seg, 16) == 0 &&
             memcmp(d.u.hello_ack.nonce, nonce, 16) == 0);
    memset(&m.u.hello_ack, 0, sizeof(m.u.hello_ack)); /* NULL tokens: zero */
    m.u.hello_ack.status = -EKEYREVOKED;
    round_trip(&m, 0, KVX_WIRE_HELLO_ACK_LEN, &d);
    KT_EQ(d.u.hello_ack.status, -EKEYREVOKED);
    KT_EQ(d.u.hello_ack.seg_token[15], 0);

    kvx_wire_run_put(runs, 0, &r);
    kvx_wire_run_put(runs, 1, &(kvx_wire_run_t){0, 4096, 0});
    m = (kvx_msg_t){.type = KVX_MSG_WRITE,
                    .flags = KVX_MSGF_CRC,
                    .conn_id = 2,
                    .token = 8,
                    .u.write = {.xfer_id = 11,
                                .tag = 12,
                                .epoch = 13,
                                .nruns = 2,
                                .region = 7,
                                .region_cap = seg,
                                .runs = runs}};
    round_trip(&m, 65536 + 4096, KVX_WIRE_WRITE_LEN + 2 * KVX_WIRE_RUN_LEN, &d);
    KT_EQ(d.u.write.region, 7);
    KT_CHECK(memcmp(d.u.write.region_cap, seg, 16) == 0);
    KT_EQ(d.u.write.xfer_id, 11);
    KT_EQ(d.u.write.tag, 12);
    KT_EQ(d.u.write.epoch, 13);
    KT_EQ(d.u.write.nruns, 2);
    kvx_wire_run_get(d.u.write.runs, 0, &r2);
    KT_CHECK(r2.offset == r.offset && r2.len == r.len && r2.crc == r.crc);

    for (uint32_t i = 0; i < 3; i++)
        kvx_wire_ack_put(entries, i, 100 + i, 4096 * i, -(int32_t)i);
    m = (kvx_msg_t){
        .type = KVX_MSG_ACK, .conn_id = 1, .token = 2, .u.ack = {.n = 3, .entries = entries}};
    round_trip(&m, 0, KVX_WIRE_ACK_LEN + 3 * KVX_WIRE_ACK_ENTRY_LEN, &d);
    KT_EQ(d.u.ack.n, 3);
    KT_CHECK(memcmp(d.u.ack.entries, entries, sizeof(entries)) == 0);

    m = (kvx_msg_t){.type = KVX_MSG_READ_REQ,
                    .conn_id = 1,
                    .token = 2,
                    .u.read_req = {.xfer_id = 21,
                                   .stream_off = 22,
                                   .nruns = 1,
                                   .prio = KVX_PRIO_HIGH,
                                   .region = 9,
                                   .region_cap = nonce,
                                   .runs = runs}};
    round_trip(&m, 0, KVX_WIRE_READ_REQ_LEN + KVX_WIRE_RUN_LEN, &d);
    KT_EQ(d.u.read_req.region, 9);
    KT_CHECK(memcmp(d.u.read_req.region_cap, nonce, 16) == 0);
    KT_EQ(d.u.read_req.xfer_id, 21);
    KT_EQ(d.u.read_req.stream_off, 22);
    KT_EQ(d.u.read_req.prio, KVX_PRIO_HIGH);
    KT_EQ(d.u.read_req.bytes, 65536);

    m = (kvx_msg_t){.type = KVX_MSG_READ_DATA,
                    .flags = KVX_MSGF_CRC,
                    .u.read_data = {.xfer_id = 31, .stream_off = 32, .len = 100, .crc = 33}};
    round_trip(&m, 100, KVX_WIRE_READ_DATA_LEN, &d);
    KT_CHECK(d.u.read_data.xfer_id == 31 && d.u.read_data.stream_off == 32 &&
             d.u.read_data.len == 100 && d.u.read_data.crc == 33 && d.u.read_data.status == 0);
    m.flags = 0;
    memset(&m.u.read_data, 0, sizeof(m.u.read_data));
    m.u.read_data.xfer_id = 31;
    m.u.read_data.status = -EINVAL;
    round_trip(&m, 0, KVX_WIRE_READ_DATA_LEN, &d);
    KT_EQ(d.u.read_data.status, -EINVAL);

    m = (kvx_msg_t){.type = KVX_MSG_FENCE, .u.fence.epoch = 41};
    round_trip(&m, 0, KVX_WIRE_FENCE_LEN, &d);
    KT_EQ(d.u.fence.epoch, 41);
    m = (kvx_msg_t){.type = KVX_MSG_NOTICE,
                    .u.notice = {.xfer_id = 51, .tag = 52, .epoch = 53, .blocks = 54, .bytes = 55}};
    round_trip(&m, 0, KVX_WIRE_NOTICE_LEN, &d);
    KT_CHECK(d.u.notice.xfer_id == 51 && d.u.notice.tag == 52 && d.u.notice.epoch == 53 &&
             d.u.notice.blocks == 54 && d.u.notice.bytes == 55);
    /* a payload: its length in the tail, which must be the payload's, at most the max; 0 too */
    m.flags = KVX_MSGF_DATA;
    m.u.notice.data_len = 4096;
    round_trip(&m, 4096, KVX_WIRE_NOTICE_LEN + KVX_WIRE_NOTICE_DATA_LEN, &d);
    KT_CHECK(d.u.notice.xfer_id == 51 && d.u.notice.data_len == 4096);
    n = kvx_wire_encode(&m, buf);
    KT_EQ(kvx_wire_decode(buf, n, 4095, &d), -EBADMSG); /* lengths disagree */
    KT_EQ(kvx_wire_decode(buf, n, 0, &d), -EBADMSG);
    KT_EQ(kvx_wire_decode(buf, KVX_WIRE_NOTICE_LEN, 4096, &d), -EBADMSG); /* no tail */
    buf[KVX_WIRE_NOTICE_LEN + 4] = 1;                                     /* its reserved word */
    KT_EQ(kvx_wire_decode(buf, n, 4096, &d), -EBADMSG);
    m.u.notice.data_len = KVX_NOTICE_DATA_MAX + 1; /* over the max, though the payload agrees */
    n = kvx_wire_encode(&m, buf);
    KT_EQ(kvx_wire_decode(buf, n, KVX_NOTICE_DATA_MAX + 1, &d), -EBADMSG);
    m.u.notice.data_len = KVX_NOTICE_DATA_MAX;
    round_trip(&m, KVX_NOTICE_DATA_MAX, KVX_WIRE_NOTICE_LEN + KVX_WIRE_NOTICE_DATA_LEN, &d);
    m.u.notice.data_len = 0; /* empty, and still a payload */
    round_trip(&m, 0, KVX_WIRE_NOTICE_LEN + KVX_WIRE_NOTICE_DATA_LEN, &d);
    KT_EQ(d.flags, KVX_MSGF_DATA);
    m.flags = 0; /* without the flag: neither a tail nor a payload */
    n = kvx_wire_encode(&m, buf);
    KT_EQ(n, KVX_WIRE_NOTICE_LEN);
    KT_EQ(kvx_wire_decode(buf, n, 1, &d), -EBADMSG);
    memset(buf + n, 0, 8);
    KT_EQ(kvx_wire_decode(buf, n + 8, 0, &d), -EBADMSG);
    m = (kvx_msg_t){.type = KVX_MSG_NOTICE_ACK, .u.notice_ack = {.xfer_id = 61, .status = -ENOSPC}};
    round_trip(&m, 0, KVX_WIRE_NOTICE_ACK_LEN, &d);
    KT_CHECK(d.u.notice_ack.xfer_id == 61 && d.u.notice_ack.status == -ENOSPC);
    m = (kvx_msg_t){.type = KVX_MSG_BYE, .conn_id = 9, .token = 10};
    round_trip(&m, 0, KVX_WIRE_HDR_LEN, &d);
    m = (kvx_msg_t){.type = KVX_MSG_PROOF, .u.proof.mac = mac};
    round_trip(&m, 0, KVX_WIRE_PROOF_LEN, &d);
    KT_CHECK(memcmp(d.u.proof.mac, mac, 32) == 0);
    m = (kvx_msg_t){
        .type = KVX_MSG_CHALLENGE, .flags = KVX_MSGF_SECRET, .u.challenge.nonce = nonce};
    round_trip(&m, 0, KVX_WIRE_CHALLENGE_LEN, &d);
    KT_CHECK(memcmp(d.u.challenge.nonce, nonce, 16) == 0);
    m = (kvx_msg_t){.type = KVX_MSG_MD_REQ,
                    .flags = KVX_MSGF_PROOF,
                    .u.md_req = {.proof = mac, .cnonce = nonce}};
    round_trip(&m, 0, KVX_WIRE_MD_REQ_LEN, &d);
    KT_CHECK(memcmp(d.u.md_req.proof, mac, 32) == 0 && memcmp(d.u.md_req.cnonce, nonce, 16) == 0);
    m = (kvx_msg_t){.type = KVX_MSG_MD_REQ, .u.md_req = {.cnonce = nonce}}; /* no proof: zeros */
    round_trip(&m, 0, KVX_WIRE_MD_REQ_LEN, &d);
    KT_CHECK(d.u.md_req.proof == NULL);
    m = (kvx_msg_t){.type = KVX_MSG_MD,
                    .flags = KVX_MSGF_PROOF,
                    .u.md = {.status = 0, .len = 300, .cnonce = nonce, .mac = mac}};
    round_trip(&m, 300, KVX_WIRE_MD_LEN, &d);
    KT_CHECK(d.u.md.len == 300 && memcmp(d.u.md.mac, mac, 32) == 0);
    kt_log("the wire table holds %d types; each encoded message decodes to its fields", 14);
    return 0;
}
