/*
 * A peer paired by address comes back on its own after its process restarts, 20 times in a row:
 *  - writes and reads in flight when the target is SIGKILLed all come out of poll, failed,
 *    within the dead-peer bound: with no deadline, kvx's watch of the peer's process fails them
 *    (under 1.5 s is asserted, docs/guide.md says 0.1-0.2 s; the time taken is logged);
 *  - the peer goes to KVX_PEER_RECONNECTING; a write submitted then waits (with a deadline of
 *    10 s) instead of failing;
 *  - a new target process starts listening at the same address: kvx pairs with it again by itself,
 *    the waiting write lands in it (verified), the generation changed (kvx_peer_query and the
 *    events DOWN then RESTARTED), and a read from it is verified too;
 *  - no leak: descriptors and mappings of this process do not grow over the last 15 rounds, and
 *    the transport still has one peer. (A peer that dies with its shared-memory FIFO full of this
 *    process's messages is another matter: UCX keeps that endpoint, and its two attachments of
 *    the dead peer's segments, until the transport closes; the transfers here fill half of it.)
 * The time from the restart to the first successful transfer is logged for every round. Then:
 *  - the target restarts with its CLOCK_REALTIME an hour behind (tests/clockshift.c preloaded
 *    into it alone): its generation is older, and the peer heals all the same (RESTARTED, the
 *    waiting write verified), and again with the right clock;
 *  - a second peer paired with KVX_PEER_PARAM_EXPECT_REGION is refused when the target comes back
 *    with another region: it stays RECONNECTING and its write times out, while the first heals.
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define KT_MAPS_SLACK 8 /* ThreadSanitizer's own mappings come and go (+3 once) */
#else
#define KT_MAPS_SLACK 2 /* the allocator's own */
#endif

#define BL 65536
#define NB 64
#define ROUNDS 20

static kt_region_t r;

static int peer_state(kvx_transport_t *t, uint64_t *gen)
{
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE | KVX_PEER_ATTR_GENERATION};
    KT_OK(kvx_peer_query(t, "p", &pa));
    if (gen != NULL)
        *gen = pa.generation;
    return pa.state;
}

static kt_target_t start_target_nb(const char *listen, uint64_t salt, uint64_t nb)
{
    kt_target_args_t a = {.num_blocks = nb,
                          .block_len = BL,
                          .salt = salt,
                          .threads = 1,
                          .name = "restarting",
                          .listen = listen};
    return kt_target_start(&a);
}

static kt_target_t start_target(const char *listen, uint64_t salt)
{
    return start_target_nb(listen, salt, NB);
}

/* The target started with its CLOCK_REALTIME an hour behind this machine's (an NTP step back,
 * a VM restored from a snapshot): its generation is older than the one it replaces. The shim
 * (tests/clockshift.c) is preloaded into that process only. */
static kt_target_t start_target_behind(const char *listen, uint64_t salt)
{
    const char *asan = getenv("ASAN_OPTIONS");
    char *asan_saved = asan != NULL ? strdup(asan) : NULL, opts[512];
    kt_target_t tg;

    /* under ASan the shim comes before the sanitizer's runtime: let it */
    snprintf(opts, sizeof(opts), "%s%sverify_asan_link_order=0", asan ? asan : "", asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    setenv("LD_PRELOAD", KT_CLOCKSHIFT_LIB, 1);
    setenv("KVX_TEST_CLOCK_SHIFT", "-3600", 1);
    tg = start_target(listen, salt);
    unsetenv("LD_PRELOAD");
    unsetenv("KVX_TEST_CLOCK_SHIFT");
    if (asan_saved != NULL)
        setenv("ASAN_OPTIONS", asan_saved, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(asan_saved);
    return tg;
}

/* Kill the target and wait for the peer to be pairing again. */
static void kill_target(kvx_transport_t *t, kt_target_t *tg, const char *peer)
{
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_STATE};

    kt_kill(&tg->proc, SIGKILL);
    KT_EQ(kt_wait(&tg->proc), 128 + SIGKILL);
    free(tg->md);
    for (uint64_t end = kt_now_ns() + 5000000000ull; kt_now_ns() < end; usleep(1000)) {
        KT_OK(kvx_peer_query(t, peer, &pa));
        if (pa.state == KVX_PEER_RECONNECTING)
            break;
    }
    KT_EQ(pa.state, KVX_PEER_RECONNECTING);
}

/* A write to the peer while it is pairing again lands once the new target answers: verified. */
static void write_across(kvx_transport_t *t, kt_target_t *tg, const char *addr, bool behind,
                         uint64_t salt, uint64_t round)
{
    uint32_t li[16], ri[16];
    kvx_completion_t c;
    kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_DEADLINE, .deadline_ms = 10000};
    uint64_t wid, t0;

    for (int k = 0; k < 16; k++) {
        li[k] = (uint32_t)(16 + k);
        ri[k] = (uint32_t)((k * 3 + round) % NB);
        kt_fill(&r, li[k], 0x44, li[k], round);
    }
    KT_OK(kvx_xfer_write(t, "p", li, ri, 16, &xp, &wid));
    t0 = kt_now_ns();
    *tg = behind ? start_target_behind(addr, salt) : start_target(addr, salt);
    KT_EQ(kt_poll_n(t, "p", &c, 1, 12000), 1);
    KT_EQ(c.id, wid);
    KT_EQ(c.status, 0);
    KT_EQ(kt_target_verify(tg, ri, li, 16, 0x44, round), 0);
    kt_log("a target restarted %s: the waiting write landed %.1f ms after the restart",
           behind ? "with its clock 1 h behind" : "with the right clock",
           (double)(kt_now_ns() - t0) / 1e6);
}

/*
 * The wall clock is not what heals a peer: a target restarted with its clock an hour behind is
 * taken (the address's answer is authoritative), its generation is older and the event says
 * RESTARTED; then one with the right clock again. A second peer paired with
 * KVX_PEER_PARAM_EXPECT_REGION keeps that expectation across reconnections: a target that comes
 * back with another region is refused, and the peer stays RECONNECTING.
 */
static void clock_and_expectations(kvx_transport_t *t, kt_target_t *tg, const char *addr,
                                   uint64_t gen)
{
    kvx_peer_event_t ev[8];
    kvx_peer_params_t ex = {
        .field_mask = KVX_PEER_PARAM_EXPECT_REGION, .num_blocks = NB, .block_len = BL};
    kvx_peer_attr_t qa = {.field_mask = KVX_PEER_ATTR_STATE | KVX_PEER_ATTR_REGION};
    uint64_t canary, behind_gen, new_gen, qbase;
    kvx_completion_t c;
    uint64_t id;
    uint32_t one = 0;
    int nev;

    while (kvx_peer_event_poll(t, ev, 8) > 0)
        ;
    kill_target(t, tg, "p");
    write_across(t, tg, addr, true, 300, 101);
    KT_EQ(peer_state(t, &behind_gen), KVX_PEER_CONNECTED);
    kt_log("generation %llu, then %llu: %.0f s behind", (unsigned long long)gen,
           (unsigned long long)behind_gen, ((double)gen - (double)behind_gen) / 1e9);
    KT_CHECK(behind_gen < gen && gen - behind_gen > 3500ull * 1000000000ull);
    nev = kvx_peer_event_poll(t, ev, 8);
    KT_EQ(nev, 2);
    KT_EQ(ev[0].type, KVX_PEER_EVENT_DOWN);
    KT_EQ(ev[1].type, KVX_PEER_EVENT_RESTARTED);
    KT_EQ(ev[1].generation, behind_gen);
    /* and forward again */
    kill_target(t, tg, "p");
    write_across(t, tg, addr, false, 301, 102);
    KT_EQ(peer_state(t, &new_gen), KVX_PEER_CONNECTED);
    KT_CHECK(new_gen > behind_gen);

    /* expectations: "q" expects this region (its base as the target reports it) */
    kt_target_info(tg, &qbase, &canary);
    ex.base_addr = qbase;
    KT_OK(kvx_peer_connect(t, "q", addr, &ex));
    kt_kill(&tg->proc, SIGKILL);
    KT_EQ(kt_wait(&tg->proc), 128 + SIGKILL);
    free(tg->md);
    /* the target comes back with half the blocks: "p" (no expectations) takes it, "q" not */
    *tg = start_target_nb(addr, 302, NB / 2);
    for (uint64_t end = kt_now_ns() + 5000000000ull;
         peer_state(t, NULL) != KVX_PEER_CONNECTED && kt_now_ns() < end;)
        usleep(1000);
    KT_EQ(peer_state(t, NULL), KVX_PEER_CONNECTED);
    usleep(1500000); /* attempts every 10-500 ms meanwhile */
    KT_OK(kvx_peer_query(t, "q", &qa));
    kt_log("a peer that expects its region, after the target came back with %d blocks: state %d",
           NB / 2, qa.state);
    KT_EQ(qa.state, KVX_PEER_RECONNECTING);
    KT_EQ(qa.remote_num_blocks, NB);
    KT_EQ(qa.remote_base, qbase);
    {
        kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_DEADLINE, .deadline_ms = 300};
        KT_OK(kvx_xfer_write(t, "q", &one, &one, 1, &xp, &id));
        KT_EQ(kt_poll_n(t, "q", &c, 1, 5000), 1);
        KT_EQ(c.status, -ETIMEDOUT);
    }
    KT_EQ(kvx_peer_remove(t, "q"), 1);
    while (kvx_peer_event_poll(t, ev, 8) > 0)
        ;
}

int main(void)
{
    kvx_transport_t *t;
    /* no deadline: only kvx's watch of the dead process may fail the transfers in flight */
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME |
                                    KVX_PARAM_NUM_THREADS | KVX_PARAM_DEADLINE,
                      .num_blocks = NB,
                      .block_len = BL,
                      .agent_name = "initiator",
                      .num_threads = 1,
                      .deadline_ms = 0};
    kt_target_t tg;
    char addr[KVX_ADDR_MAX];
    uint64_t gen, fds0 = 0, maps0 = 0;
    size_t sysv0 = 0, sysv_kept = 0;
    double worst_fail = 0, worst_back = 0;

    r = kt_region_alloc(NB, BL);
    p.base = r.base;
    KT_OK(kvx_transport_create(&p, &t));
    tg = start_target("127.0.0.1:0", 100);
    memcpy(addr, tg.listen_addr, sizeof(addr));
    KT_OK(kvx_peer_connect(t, "p", addr, NULL));
    /* its handshake may still be under way (the add waits 200 ms for it) */
    for (uint64_t end = kt_now_ns() + 5000000000ull;
         peer_state(t, NULL) == KVX_PEER_WIRING && kt_now_ns() < end;)
        usleep(1000);
    KT_EQ(peer_state(t, &gen), KVX_PEER_CONNECTED);

    for (int round = 1; round <= ROUNDS; round++) {
        kvx_completion_t c[32];
        kvx_peer_event_t ev[8];
        uint32_t li[16], ri[16], back[16];
        uint64_t ids[16], wid, t_kill, t_start, new_gen;
        int n = 0, nev, failed = 0;
        double out_ms;

        /* 8 writes and 8 reads of 4 blocks in flight (the target is stopped first, so that they
         * surely are), then the target dies */
        kt_stop(&tg.proc);
        for (int i = 0; i < 16; i++) {
            for (int k = 0; k < 4; k++) {
                li[k] = (uint32_t)(i * 4 + k);
                ri[k] = (uint32_t)((i * 4 + k) % NB);
            }
            if (i < 8)
                KT_OK(kvx_xfer_write(t, "p", li, ri, 4, NULL, &ids[i]));
            else
                KT_OK(kvx_xfer_read(t, "p", li, ri, 4, NULL, &ids[i]));
        }
        kt_kill(&tg.proc, SIGKILL);
        t_kill = kt_now_ns();
        KT_EQ(kt_wait(&tg.proc), 128 + SIGKILL);
        free(tg.md);
        while (n < 16) {
            int got = kt_poll_n(t, "p", c, 16 - n, 5000);
            KT_CHECK(got > 0);
            for (int i = 0; i < got; i++)
                failed += c[i].status == -ECONNRESET; /* the watch, not a deadline */
            n += got;
        }
        out_ms = (double)(kt_now_ns() - t_kill) / 1e6;
        KT_EQ(failed, 16);
        /* kvx checks a watched peer's process every 100 ms while transfers are in flight, and the
         * stall limit (2 s) did not get to act: docs/guide.md's "within 0.1-0.2 s", with a margin
         * for a loaded machine */
        KT_CHECK(out_ms < 1500);
        worst_fail = out_ms > worst_fail ? out_ms : worst_fail;
        /* the peer is pairing again; a write submitted now waits for it */
        for (uint64_t end = kt_now_ns() + 5000000000ull;
             peer_state(t, NULL) != KVX_PEER_RECONNECTING && kt_now_ns() < end;)
            usleep(1000);
        KT_EQ(peer_state(t, NULL), KVX_PEER_RECONNECTING);
        for (int k = 0; k < 16; k++) {
            li[k] = (uint32_t)(16 + k);
            ri[k] = (uint32_t)((k * 5 + (unsigned)round) % NB);
            back[k] = (uint32_t)(32 + k);
            kt_fill(&r, li[k], 0x33, li[k], (uint64_t)round);
        }
        {
            kvx_xfer_params_t xp = {.field_mask = KVX_XFER_PARAM_DEADLINE, .deadline_ms = 10000};
            KT_OK(kvx_xfer_write(t, "p", li, ri, 16, &xp, &wid));
        }
        usleep(20000); /* let it wait while nothing listens (attempts are refused meanwhile) */
        KT_EQ(kvx_transport_poll(t, "p", c, 1), 0);
        /* the new process, at the same address */
        t_start = kt_now_ns();
        tg = start_target(addr, 100 + (uint64_t)round);
        KT_CHECK(strcmp(tg.listen_addr, addr) == 0);
        KT_EQ(kt_poll_n(t, "p", c, 1, 10000), 1);
        KT_EQ(c[0].id, wid);
        KT_EQ(c[0].status, 0);
        if ((double)(kt_now_ns() - t_start) / 1e6 > worst_back)
            worst_back = (double)(kt_now_ns() - t_start) / 1e6;
        kt_log("round %d: the 16 transfers in flight failed within %.1f ms of the kill; the write "
               "that waited landed %.1f ms after the restart",
               round, out_ms, (double)(kt_now_ns() - t_start) / 1e6);
        KT_EQ(kt_target_verify(&tg, ri, li, 16, 0x33, (uint64_t)round), 0);
        KT_EQ(peer_state(t, &new_gen), KVX_PEER_CONNECTED);
        KT_CHECK(new_gen > gen);
        /* events: DOWN, then RESTARTED with the new generation */
        nev = kvx_peer_event_poll(t, ev, 8);
        KT_EQ(nev, 2);
        KT_EQ(ev[0].type, KVX_PEER_EVENT_DOWN);
        KT_CHECK(ev[0].error < 0);
        KT_EQ(ev[0].generation, gen);
        KT_EQ(ev[1].type, KVX_PEER_EVENT_RESTARTED);
        KT_EQ(ev[1].generation, new_gen);
        KT_CHECK(strcmp(ev[1].peer_id, "p") == 0);
        gen = new_gen;
        /* and a read of what the new target holds */
        KT_OK(kvx_xfer_read(t, "p", back, ri, 16, NULL, &wid));
        KT_EQ(kt_poll_n(t, "p", c, 1, 10000), 1);
        KT_EQ(c[0].status, 0);
        for (int k = 0; k < 16; k++)
            KT_EQ(kt_check(&r, back[k], 0x33, li[k], (uint64_t)round), 0);
        /* UCX keeps a dead peer's shared-memory FIFO attached when it saw that FIFO full: the
         * discarded endpoint's flush never completes (uct_mm_ep_flush answers NO_RESOURCE for
         * ever; UCX 1.13.1 and 1.19.1). kvx cannot release it, so System V mappings are counted
         * apart (at most a FIFO and a descriptor segment per target that died) */
        if (round == 5) {
            fds0 = kt_count_entries("/proc/self/fd");
            maps0 = kt_count_maps(&sysv0);
        } else if (round > 5) {
            size_t sysv, maps = kt_count_maps(&sysv);
            KT_CHECK(kt_count_entries("/proc/self/fd") <= fds0);
            KT_CHECK(maps <= maps0 + KT_MAPS_SLACK);
            KT_CHECK(sysv <= sysv0 + 2 * (size_t)(round - 5));
            sysv_kept = sysv - sysv0;
        }
    }
    kt_log("%d restarts: in-flight writes out within %.1f ms of the kill at worst; the peer back "
           "and a write landed within %.1f ms of the restart at worst; UCX kept %zu shared-memory "
           "segments of dead targets attached over the last %d",
           ROUNDS, worst_fail, worst_back, sysv_kept, ROUNDS - 5);
    clock_and_expectations(t, &tg, addr, gen);
    {
        kvx_transport_attr_t ta = {.field_mask = KVX_TRANSPORT_ATTR_NUM_PEERS};
        KT_OK(kvx_transport_query(t, &ta));
        KT_EQ(ta.num_peers, 1);
    }
    /* removed while the target is gone: no more pairing again, waiting writes fail */
    kt_kill(&tg.proc, SIGKILL);
    KT_EQ(kt_wait(&tg.proc), 128 + SIGKILL);
    free(tg.md);
    for (uint64_t end = kt_now_ns() + 5000000000ull;
         peer_state(t, NULL) != KVX_PEER_RECONNECTING && kt_now_ns() < end;)
        usleep(1000);
    {
        uint32_t one = 0;
        uint64_t id;
        kvx_completion_t c;
        KT_OK(kvx_xfer_write(t, "p", &one, &one, 1, NULL, &id));
        KT_EQ(kvx_peer_remove(t, "p"), 1);
        KT_EQ(kt_poll_n(t, "p", &c, 1, 5000), 1);
        KT_EQ(c.id, id);
        KT_EQ(c.status, -ECONNABORTED);
    }
    kvx_transport_destroy(t);
    kt_region_free(&r);
    return 0;
}
