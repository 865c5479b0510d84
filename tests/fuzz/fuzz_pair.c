/*
 * libFuzzer harness for the pairing messages (src/peer/listen.c, dial.c): decoded CHALLENGE,
 * MD_REQ and MD handed to kvx_pair_on_message, in either role (the listener's side of an accepted
 * exchange, or the connecting side's), with or without a shared secret, and the work
 * kvx_pairings_work then does (the proof check, the answer, the metadata taken, closing). A
 * pairing object is built by hand, as fuzz_wire.c builds its transport; its endpoint is a zeroed
 * stand-in with no UCP endpoint behind it (sends fail -ENOTCONN, as on an endpoint UCX has
 * closed), or none at all.
 *
 * Input: one byte of options, then up to 8 messages, each a u16 header length, a u16 payload
 * length (little-endian), the header, the payload. Options: bit 0 the listener's side; bit 1 a
 * secret; bit 2 the harness writes the right proof or MAC for this exchange into MD_REQ and MD
 * (so that the fuzzer gets past them too); bit 3 it echoes the connecting side's nonce in MD;
 * bit 4 no endpoint; bit 5 the exchange is past its first step (the connecting side answered the
 * challenge, whose send the stand-in would fail; the listener had an MD_REQ). Oracle: the
 * connecting side takes metadata only from an MD that answers this exchange (its nonce, and with a
 * secret the listener's MAC over both nonces and the metadata). Build with clang (CMake: CC=clang,
 * -DKVX_BUILD_FUZZ=ON).
 */
#include "kvx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char secret[] = "fuzz-pair-secret";
static const char req_label[] = "kvx-pair-req-v1";
static const char md_label[] = "kvx-pair-md-v1";
static uint8_t metadata[200];

static void mac(const char *label, const uint8_t *s, const uint8_t *c, const void *data, size_t len,
                uint8_t out[32])
{
    kvx_iov_t parts[4] = {{(void *)label, strlen(label)},
                          {(void *)s, KVX_WIRE_NONCE_LEN},
                          {(void *)c, KVX_WIRE_NONCE_LEN},
                          {(void *)data, len}};
    kvx_hmac_sha256(secret, strlen(secret), parts, len > 0 ? 4 : 3, out);
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvx_transport_t *t;
    kvx_pairing_t *pg;
    unsigned opt;
    size_t off = 1;

    if (size < 1)
        return 0;
    opt = data[0];
    t = calloc(1, sizeof(*t));
    pg = calloc(1, sizeof(*pg));
    if (t == NULL || pg == NULL) {
        free(t);
        free(pg);
        return 0;
    }
    pthread_mutex_init(&t->core.lock, NULL);
    kvx_peers_init(&t->peers, &t->core, &t->conns);
    snprintf(t->core.log.name, sizeof(t->core.log.name), "fuzz");
    memset(metadata, 0x6d, sizeof(metadata));
    kvx_peers_metadata(&t->peers, metadata, sizeof(metadata));
    if (opt & 2) {
        t->core.secret = (uint8_t *)secret;
        t->core.secret_len = strlen(secret);
    }
    pg->peers = &t->peers;
    pg->accepted = opt & 1;
    pg->side = pg->accepted ? &kvx_listen_side : &kvx_dial_side;
    /* a stand-in larger than kvx_ucx_ep_t, zeroed: no UCP endpoint (ASan would see a read past
     * it); kvx_ucx_ep_free frees it with the pairing */
    pg->ucx = (opt & 16) ? NULL : calloc(1, 4096);
    memset(pg->nonce, 0x11, sizeof(pg->nonce));   /* the listener's */
    memset(pg->cnonce, 0x22, sizeof(pg->cnonce)); /* the connecting side's */
    pg->expires_ns = UINT64_MAX;
    pg->asked = (opt & 32) != 0;
    kvx_list_add_tail(&t->peers.pairings, &pg->link);
    if (pg->accepted)
        t->peers.naccepted = 1;

    for (int i = 0; i < 8 && off + 4 <= size && !kvx_list_empty(&t->peers.pairings); i++) {
        size_t hlen = get16(data + off), dlen = get16(data + off + 2);
        uint8_t *hdr, *payload;
        kvx_msg_t m;
        bool had_md = pg->md != NULL;

        off += 4;
        if (hlen > size - off || dlen > size - off - hlen)
            break;
        /* exactly hlen and dlen bytes: ASan sees any read past them */
        hdr = malloc(hlen ? hlen : 1);
        payload = malloc(dlen ? dlen : 1);
        if (hdr == NULL || payload == NULL) {
            free(hdr);
            free(payload);
            break;
        }
        memcpy(hdr, data + off, hlen);
        memcpy(payload, data + off + hlen, dlen);
        off += hlen + dlen;
        if (hlen >= KVX_WIRE_MD_REQ_LEN && hdr[1] == KVX_MSG_MD_REQ && (opt & 4) &&
            t->core.secret) {
            /* the proof over the listener's nonce and the one this MD_REQ carries */
            mac(req_label, pg->nonce, hdr + KVX_WIRE_HDR_LEN + KVX_PROOF_LEN, NULL, 0,
                hdr + KVX_WIRE_HDR_LEN);
            hdr[2] |= KVX_MSGF_PROOF;
        }
        if (hlen >= KVX_WIRE_MD_LEN && hdr[1] == KVX_MSG_MD) {
            if (opt & 8)
                memcpy(hdr + 24, pg->cnonce, KVX_WIRE_NONCE_LEN);
            if ((opt & 4) && t->core.secret) {
                mac(md_label, pg->nonce, hdr + 24, payload, dlen, hdr + 40);
                hdr[2] |= KVX_MSGF_PROOF;
            }
        }
        if (kvx_wire_decode(hdr, hlen, dlen, &m) == 0) {
            kvx_pair_on_message(pg, &m, payload, dlen);
            if (!pg->accepted && !had_md && pg->md != NULL) {
                /* metadata taken: it must answer this exchange */
                uint8_t want[32];
                if (m.type != KVX_MSG_MD || pg->md_len != dlen ||
                    memcmp(pg->md, payload, dlen) != 0 ||
                    memcmp(m.u.md.cnonce, pg->cnonce, KVX_WIRE_NONCE_LEN) != 0)
                    abort();
                if (t->core.secret != NULL) {
                    mac(md_label, pg->nonce, pg->cnonce, payload, dlen, want);
                    if (m.u.md.mac == NULL || memcmp(m.u.md.mac, want, sizeof(want)) != 0)
                        abort();
                }
            }
            if (t->peers.pair_work) {
                t->peers.pair_work = false;
                kvx_pairings_work(&t->peers); /* may free an accepted pairing once closed */
            }
        }
        free(hdr);
        free(payload);
    }
    if (!kvx_list_empty(&t->peers.pairings)) {
        /* as kvx_peer_connect and close leave it: abandoned, closed, freed */
        pg->abandoned = true;
        kvx_pairings_free_all(&t->peers);
    }
    pthread_mutex_destroy(&t->core.lock);
    free(t);
    return 0;
}
