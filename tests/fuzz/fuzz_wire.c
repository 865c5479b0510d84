/*
 * libFuzzer harness for what kvx does with a peer's messages before they touch anything: the
 * strict header decoder (src/wire.c) and the receiving side that acts on what it decoded
 * (src/recv.c, hello.c, fence.c: token check, fences, the region named (id, capability,
 * access) and its bounds, applying writes into a region,
 * queueing read requests, notices, handshakes, a retired capability's). Each input is one message:
 * a byte choosing where the header ends, the header, the payload. Messages naming connection 1 get
 * that connection's token when the input asks, so that the fuzzer reaches what a peer holding the
 * token could do. Build with clang (CMake: CC=clang, -DKVX_BUILD_FUZZ=ON); ASan checks every byte
 * written to the region.
 */
#include "kvx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGION 65536
#define TOKEN 0x0123456789abcdefull

/* unproven: the transport has a secret and connection 1 has not proven it yet */
static kvx_transport_t *setup(bool unproven)
{
    kvx_transport_t *t = calloc(1, sizeof(*t));
    kvx_writer_t *w = calloc(1, sizeof(*w));
    kvx_rconn_t *rc;

    pthread_mutex_init(&t->core.lock, NULL);
    kvx_conns_init(&t->conns, &t->core);
    kvx_recv_init(&t->recv, &t->core, 4);
    t->core.base = malloc(REGION);
    t->core.region_len = REGION;
    t->core.block_len = 4096;
    t->core.num_blocks = REGION / 4096;
    memset(t->core.capability, 0x42, sizeof(t->core.capability));
    {
        /* wire 3: the main region (1, capability field zero), and region 2 (write only, its
         * capability 0x55...) over the same bytes, so that the checks of each field are reached */
        kvx_region_t *g;
        uint8_t cap[16];
        memset(cap, 0, sizeof(cap));
        kvx_region_add(&t->core, t->core.base, REGION, KVX_REGION_WRITE | KVX_REGION_READ, cap,
                       true, &g);
        memset(cap, 0x55, sizeof(cap));
        kvx_region_add(&t->core, t->core.base, REGION / 2, KVX_REGION_WRITE, cap, false, &g);
    }
    memset(t->recv.retired[0], 0x43, sizeof(t->recv.retired[0])); /* a HELLO with it is kept */
    t->recv.nretired = 1;
    snprintf(w->name, sizeof(w->name), "writer");
    w->by_name.name = w->name;
    kvx_list_init(&w->rconns);
    w->epoch = 2;
    w->ftags = calloc(1, sizeof(*w->ftags));
    w->nftags = w->ftags_cap = 1;
    w->ftags[0].tag = 7;
    w->ftags[0].at_epoch = 2; /* writes of tag 7 stamped before epoch 2 are fenced */
    w->live = 1;
    t->recv.conns.nftags = 1;
    rc = kvx_rconn_alloc(&t->recv.conns, w, &(kvx_msg_t){.type = KVX_MSG_HELLO});
    rc->token = TOKEN;
    rc->state = KVX_CONN_OPEN;
    rc->proven = !unproven;
    if (unproven) {
        static uint8_t secret[] = "fuzz";
        t->core.secret = secret;
        t->core.secret_len = 4;
    }
    w->nopen = 1;
    w->live = 1;
    kvx_list_add_tail(&w->rconns, &rc->w_link);
    kvx_list_add_tail(&t->recv.conns.all, &rc->all_link);
    kvx_idtab_alloc(&t->recv.conns.ids, rc, &rc->id); /* id 1 */
    t->recv.conns.nopen = 1;
    kvx_names_add(&t->recv.conns.writers, &w->by_name);
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *hdr;
    kvx_transport_t *t;
    kvx_msg_t m;
    size_t hdr_len;

    if (size < 2)
        return 0;
    hdr_len = ((size_t)data[0] << 8 | data[1]) % (size - 1);
    if (hdr_len > 8192)
        return 0;
    /* exactly hdr_len bytes: ASan sees any read past the header */
    hdr = malloc(hdr_len ? hdr_len : 1);
    if (hdr == NULL)
        return 0;
    memcpy(hdr, data + 2, hdr_len);
    /* give a message naming connection 1 its token (the low bit of its flags says so) */
    if (hdr_len >= KVX_WIRE_HDR_LEN && kvx_get32(hdr + 4) == 1 && (hdr[2] & 0x80))
        kvx_put64(hdr + 8, TOKEN), hdr[2] &= 0x7f;
    t = setup(size % 3 == 0);
    if (kvx_wire_decode(hdr, hdr_len, size - 2 - hdr_len, &m) == 0) {
        const uint8_t *payload = data + 2 + hdr_len;
        /* what the decoder hands on stays inside the header */
        if (m.type == KVX_MSG_WRITE &&
            (m.u.write.runs < hdr || m.u.write.runs + m.u.write.nruns * 16 > hdr + hdr_len))
            abort();
        if (m.type == KVX_MSG_HELLO && (m.u.hello.waddr + m.u.hello.waddr_len > hdr + hdr_len ||
                                        m.u.hello.signed_len > hdr_len))
            abort();
        /* the encoder puts every field the decoder read back at its place */
        {
            static uint8_t again[KVX_WIRE_ACK_LEN + KVX_WIRE_MAX_ACKS * KVX_WIRE_ACK_ENTRY_LEN];
            size_t n = kvx_wire_encode(&m, again);
            if (n > hdr_len || memcmp(again, hdr, n) != 0)
                abort();
        }
        /* to the side that takes it, by the codecs' table (as the backend's dispatch) */
        switch (kvx_wire_type(m.type)->to) {
        case KVX_TO_RECEIVER:
            kvx_recv_on_message(&t->recv, &m, hdr, hdr_len, payload, size - 2 - hdr_len);
            break;
        case KVX_TO_INITIATOR:
            kvx_xfer_on_message(&t->conns, &m, payload, size - 2 - hdr_len);
            break;
        default: /* a pairing's: taken only on a pairing's endpoint (fuzz_pair) */
            break;
        }
    }
    kvx_recv_free_all(&t->recv);
    kvx_region_free_all(&t->core);
    free(t->conns.ids.slots);
    kvx_recv_fini(&t->recv);
    free(t->core.base);
    pthread_mutex_destroy(&t->core.lock);
    free(t);
    free(hdr);
    return 0;
}
