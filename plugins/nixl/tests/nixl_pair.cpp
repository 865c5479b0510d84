// NIXL's C++ agent API (nixlAgent), two processes, one backend named on the command line, DRAM to
// DRAM; run by pair.py, which starts `--role target` and `--role initiator` joined by pipes (a
// line protocol), over shared memory or tcp between two network namespaces. Modes:
//   xfer   WRITE of 5 descriptors (one a sub-range) with a notification, a standalone genNotif,
//          READ back with a notification (the target must get it), the READ handle posted
//          again: every byte checked, by the target after the WRITE's notification and by the
//          initiator after each READ
//   fence  the target deregisters its region while the initiator writes into it in a loop, then
//          zeroes it and checks, 1.5 s later, that no byte changed (--expect-fence: required)
//   stop   the target is SIGSTOPped and a WRITE posted: what getXferStatus says, and when
//   kill   the same with the target SIGKILLed
//   cut    (--net netns) the initiator's link taken down
// For stop, kill and cut, --bound-ms B requires an error within B ms (kvx's promise); without it
// the outcome is printed only (NIXL's UCX backend stays IN_PROG for a stopped peer).
#include <nixl.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace
{

using clk = std::chrono::steady_clock;

FILE *proto; // the real stdout: the line protocol (NIXL's and UCX's prints go to stderr)
std::string backend = "UCX", mode = "xfer";
long bound_ms = -1;
bool expect_fence = false;

[[noreturn]] void die(const std::string &what)
{
    std::fprintf(stderr, "nixl_pair: %s\n", what.c_str());
    std::exit(1);
}

void check(nixl_status_t st, const char *what)
{
    if (st != NIXL_SUCCESS)
        die(std::string(what) + ": " + nixlEnumStrings::statusStr(st));
}

void send(const std::string &line)
{
    std::fprintf(proto, "%s\n", line.c_str());
    std::fflush(proto);
}

std::string recv()
{
    std::string line;
    if (!std::getline(std::cin, line))
        die("the other side exited");
    return line;
}

std::string hex(const std::string &s)
{
    static const char *d = "0123456789abcdef";
    std::string h;
    for (unsigned char c : s) {
        h += d[c >> 4];
        h += d[c & 15];
    }
    return h;
}

std::string unhex(const std::string &h)
{
    std::string s;
    for (size_t i = 0; i + 1 < h.size(); i += 2)
        s += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
    return s;
}

uint8_t pat(size_t buf, size_t i, unsigned salt = 0)
{
    return static_cast<uint8_t>((i * 131 + buf * 17 + salt * 7 + (i >> 12)) ^ (i >> 7));
}

struct Agent {
    nixlAgent a;
    nixlBackendH *b = nullptr;
    explicit Agent(const std::string &name) : a(name, nixlAgentConfig(true))
    {
        nixl_mem_list_t mems;
        nixl_b_params_t params;
        check(a.getPluginParams(backend, mems, params), "getPluginParams");
        check(a.createBackend(backend, params, b), "createBackend");
    }
    nixl_reg_dlist_t reg(const std::vector<std::pair<uint8_t *, size_t>> &bufs)
    {
        nixl_reg_dlist_t d(DRAM_SEG);
        for (auto &[p, n] : bufs)
            d.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(p), n, 0, ""));
        check(a.registerMem(d), "registerMem");
        return d;
    }
    std::string md()
    {
        std::string s;
        check(a.getLocalMD(s), "getLocalMD");
        return s;
    }
    // Post and poll until not in progress or ms pass: the final status, or NIXL_IN_PROG.
    nixl_status_t run(nixlXferReqH *h, long ms, const nixl_opt_args_t *opt = nullptr)
    {
        nixl_status_t st = a.postXferReq(h, opt);
        const auto end = clk::now() + std::chrono::milliseconds(ms);
        while (st == NIXL_IN_PROG && clk::now() < end)
            st = a.getXferStatus(h);
        return st;
    }
    std::vector<std::pair<std::string, std::string>> notifs()
    {
        nixl_notifs_t n;
        check(a.getNotifs(n), "getNotifs");
        std::vector<std::pair<std::string, std::string>> out;
        for (auto &[peer, msgs] : n)
            for (auto &m : msgs)
                out.emplace_back(peer, m);
        return out;
    }
};

const std::vector<size_t> SIZES = {4096, 65536, 1 << 20, 3 * (1 << 20) + 7};
const std::string INITIATOR = "b2d61c9e-6a41-4c51-9f0d-initiator00", TARGET = "nixl-pair-target";
const std::string W_NOTIF(65536, 'w'), R_NOTIF = "read-done:req-7:1", HELLO = "hello";

// ---- xfer ---------------------------------------------------------------------------------------

int targetXfer()
{
    Agent g(TARGET);
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<std::pair<uint8_t *, size_t>> r;
    for (size_t n : SIZES)
        bufs.emplace_back(n, 0);
    for (auto &b : bufs)
        r.emplace_back(b.data(), b.size());
    auto regd = g.reg(r);
    std::ostringstream hello;
    hello << hex(g.md());
    for (auto &b : bufs)
        hello << ' ' << reinterpret_cast<uintptr_t>(b.data()) << ' ' << b.size();
    send(hello.str());
    bool got_hello = false, got_write = false;
    std::string senders;
    const auto end = clk::now() + std::chrono::seconds(30);
    while (!(got_hello && got_write) && clk::now() < end) {
        for (auto &[p, m] : g.notifs()) {
            got_hello |= m == HELLO;
            got_write |= m == W_NOTIF;
            if (senders.find(p) == std::string::npos)
                senders += p + ";";
        }
    }
    size_t bad = 0; // after the write's notification, every byte must be there
    for (size_t i = 0; i < bufs.size(); i++)
        for (size_t j = 0; j < bufs[i].size(); j++)
            bad += bufs[i][j] != pat(i, j);
    send(std::to_string(got_hello) + " " + std::to_string(got_write) + " " + std::to_string(bad) +
         " " + senders);
    recv(); // the READ is done
    std::string rsender = "-";
    const auto end2 = clk::now() + std::chrono::seconds(30);
    while (rsender == "-" && clk::now() < end2)
        for (auto &[p, m] : g.notifs())
            if (m == R_NOTIF)
                rsender = p;
    send(rsender);
    recv(); // bye
    check(g.a.deregisterMem(regd), "deregisterMem");
    return 0;
}

int initiatorXfer()
{
    Agent g(INITIATOR);
    std::vector<std::vector<uint8_t>> src, back;
    std::vector<std::pair<uint8_t *, size_t>> r;
    for (size_t i = 0; i < SIZES.size(); i++) {
        src.emplace_back(SIZES[i]);
        for (size_t j = 0; j < SIZES[i]; j++)
            src[i][j] = pat(i, j);
        back.emplace_back(SIZES[i], 0);
    }
    for (auto &b : src)
        r.emplace_back(b.data(), b.size());
    for (auto &b : back)
        r.emplace_back(b.data(), b.size());
    auto regd = g.reg(r);
    std::istringstream hello(recv());
    std::string mdhex, peer;
    hello >> mdhex;
    check(g.a.loadRemoteMD(unhex(mdhex), peer), "loadRemoteMD");
    if (peer != TARGET)
        die("loadRemoteMD named " + peer);
    std::vector<std::pair<uintptr_t, size_t>> remote(SIZES.size());
    for (auto &[a, n] : remote)
        hello >> a >> n;
    check(g.a.genNotif(peer, HELLO), "genNotif");

    nixl_xfer_dlist_t loc(DRAM_SEG), rem(DRAM_SEG);
    for (size_t i = 0; i < SIZES.size(); i++) {
        loc.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(src[i].data()), SIZES[i], 0));
        rem.addDesc(nixlBasicDesc(remote[i].first, SIZES[i], 0));
    }
    loc.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(src[1].data()) + 100, 1000, 0));
    rem.addDesc(nixlBasicDesc(remote[1].first + 100, 1000, 0));
    nixl_opt_args_t wopt;
    wopt.notif = W_NOTIF;
    nixlXferReqH *h;
    check(g.a.createXferReq(NIXL_WRITE, loc, rem, peer, h, &wopt), "createXferReq WRITE");
    const auto t0 = clk::now();
    const nixl_status_t wst = g.run(h, 30000);
    const double wms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    check(g.a.releaseXferReq(h), "releaseXferReq");
    std::istringstream rep(recv());
    int got_hello, got_write;
    size_t bad_w;
    std::string senders;
    rep >> got_hello >> got_write >> bad_w >> senders;

    nixl_xfer_dlist_t bloc(DRAM_SEG), brem(DRAM_SEG);
    for (size_t i = 0; i < SIZES.size(); i++) {
        bloc.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(back[i].data()), SIZES[i], 0));
        brem.addDesc(nixlBasicDesc(remote[i].first, SIZES[i], 0));
    }
    nixl_opt_args_t ropt;
    ropt.notif = R_NOTIF;
    check(g.a.createXferReq(NIXL_READ, bloc, brem, peer, h, &ropt), "createXferReq READ");
    const nixl_status_t rst = g.run(h, 30000);
    size_t bad_r = 0, bad_rr = 0;
    for (size_t i = 0; i < SIZES.size(); i++) {
        bad_r += !std::equal(back[i].begin(), back[i].end(), src[i].begin());
        std::fill(back[i].begin(), back[i].end(), 0);
    }
    const nixl_status_t rrst = g.run(h, 30000); // posted again once done
    for (size_t i = 0; i < SIZES.size(); i++)
        bad_rr += !std::equal(back[i].begin(), back[i].end(), src[i].begin());
    check(g.a.releaseXferReq(h), "releaseXferReq");
    send("read done");
    const std::string rsender = recv();
    send("bye");
    check(g.a.invalidateRemoteMD(peer), "invalidateRemoteMD");
    check(g.a.deregisterMem(regd), "deregisterMem");
    const bool ok = wst == NIXL_SUCCESS && rst == NIXL_SUCCESS && rrst == NIXL_SUCCESS &&
                    got_hello && got_write && bad_w == 0 && bad_r == 0 && bad_rr == 0 &&
                    senders == INITIATOR + ";" && rsender == INITIATOR;
    std::fprintf(stderr,
                 "nixl_pair xfer %s %s: WRITE %s in %.1f ms; target: hello %d, write notif %d "
                 "(%zu B), %zu bad bytes, senders %s; READ %s, %zu bad buffers; again %s, %zu "
                 "bad; READ notif from %s: %s\n",
                 backend.c_str(), std::getenv("PAIR_NET"), nixlEnumStrings::statusStr(wst).c_str(),
                 wms, got_hello, got_write, W_NOTIF.size(), bad_w, senders.c_str(),
                 nixlEnumStrings::statusStr(rst).c_str(), bad_r,
                 nixlEnumStrings::statusStr(rrst).c_str(), bad_rr, rsender.c_str(),
                 ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

// ---- fence: deregistration while a peer writes
// ----------------------------------------------------

constexpr size_t FENCE_LEN = 64 << 20;

int targetFence()
{
    Agent g(TARGET);
    std::vector<uint8_t> region(FENCE_LEN, 0);
    auto regd = g.reg({{region.data(), region.size()}});
    send(hex(g.md()) + " " + std::to_string(reinterpret_cast<uintptr_t>(region.data())));
    const auto end = clk::now() + std::chrono::seconds(30);
    bool first = false;
    while (!first && clk::now() < end)
        for (auto &[p, m] : g.notifs())
            first |= m == "first";
    std::this_thread::sleep_for(std::chrono::milliseconds(300)); // writes keep streaming in
    const auto t0 = clk::now();
    const nixl_status_t st = g.a.deregisterMem(regd);
    const long dms = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0).count();
    std::memset(region.data(), 0, region.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const size_t changed = region.size() - std::count(region.begin(), region.end(), 0);
    send(std::to_string(first) + " " + std::to_string(st) + " " + std::to_string(dms) + " " +
         std::to_string(changed));
    recv(); // bye
    return 0;
}

int initiatorFence()
{
    Agent g(INITIATOR);
    std::vector<uint8_t> src(FENCE_LEN, 0xab);
    auto regd = g.reg({{src.data(), src.size()}});
    std::istringstream hello(recv());
    std::string mdhex, peer;
    uintptr_t raddr;
    hello >> mdhex >> raddr;
    check(g.a.loadRemoteMD(unhex(mdhex), peer), "loadRemoteMD");
    nixl_xfer_dlist_t loc(DRAM_SEG), rem(DRAM_SEG);
    loc.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(src.data()), FENCE_LEN, 0));
    rem.addDesc(nixlBasicDesc(raddr, FENCE_LEN, 0));
    int ok = 0, failed = 0, late = 0;
    std::string last_err = "-";
    const auto end = clk::now() + std::chrono::milliseconds(3500);
    for (int i = 0; clk::now() < end; i++) {
        nixl_opt_args_t opt;
        if (i == 0)
            opt.notif = "first";
        nixlXferReqH *h;
        nixl_status_t st = g.a.createXferReq(NIXL_WRITE, loc, rem, peer, h, &opt);
        if (st != NIXL_SUCCESS) {
            failed++, last_err = nixlEnumStrings::statusStr(st);
            break; // NIXL dropped the peer (a disconnect)
        }
        st = g.run(h, 5000);
        if (st == NIXL_SUCCESS)
            ok++;
        else if (st == NIXL_IN_PROG)
            late++;
        else
            failed++, last_err = nixlEnumStrings::statusStr(st);
        g.a.releaseXferReq(h);
    }
    std::istringstream rep(recv());
    int first, dst;
    long dms;
    size_t changed;
    rep >> first >> dst >> dms >> changed;
    send("bye");
    g.a.deregisterMem(regd);
    const bool pass = first && (!expect_fence || (changed == 0 && dst == NIXL_SUCCESS));
    std::fprintf(stderr,
                 "nixl_pair fence %s %s: the target deregistered its region in %ld ms (%s) "
                 "while 64 MiB writes streamed in; %zu bytes changed in the 1.5 s after it "
                 "(%s); the initiator's writes: %d done, %d failed (last: %s), %d still in "
                 "progress after 5 s: %s\n",
                 backend.c_str(), std::getenv("PAIR_NET"), dms,
                 nixlEnumStrings::statusStr(static_cast<nixl_status_t>(dst)).c_str(), changed,
                 changed == 0 ? "a fence" : "NO FENCE: a peer writes into deregistered memory", ok,
                 failed, last_err.c_str(), late, pass ? (expect_fence ? "PASS" : "shown") : "FAIL");
    return pass ? 0 : 1;
}

// ---- stop, kill, cut: a peer that goes silent ---------------------------------------------------

constexpr size_t SILENT_LEN = 32 << 20;

int targetSilent()
{
    Agent g(TARGET);
    std::vector<uint8_t> region(SILENT_LEN, 0);
    auto regd = g.reg({{region.data(), region.size()}});
    send(hex(g.md()) + " " + std::to_string(reinterpret_cast<uintptr_t>(region.data())) + " " +
         std::to_string(getpid()));
    recv(); // bye (after a SIGSTOP and SIGCONT)
    g.a.deregisterMem(regd);
    return 0;
}

int initiatorSilent()
{
    Agent g(INITIATOR);
    std::vector<uint8_t> src(SILENT_LEN, 0x5a);
    auto regd = g.reg({{src.data(), src.size()}});
    std::istringstream hello(recv());
    std::string mdhex, peer;
    uintptr_t raddr;
    pid_t pid;
    hello >> mdhex >> raddr >> pid;
    check(g.a.loadRemoteMD(unhex(mdhex), peer), "loadRemoteMD");
    nixl_xfer_dlist_t loc(DRAM_SEG), rem(DRAM_SEG);
    loc.addDesc(nixlBasicDesc(reinterpret_cast<uintptr_t>(src.data()), SILENT_LEN, 0));
    rem.addDesc(nixlBasicDesc(raddr, SILENT_LEN, 0));
    nixlXferReqH *h;
    check(g.a.createXferReq(NIXL_WRITE, loc, rem, peer, h), "createXferReq");
    check(g.run(h, 30000), "the first WRITE"); // the path works
    std::string ifname = std::getenv("UCX_NET_DEVICES") ? std::getenv("UCX_NET_DEVICES") : "";
    if (mode == "stop")
        kill(pid, SIGSTOP);
    else if (mode == "kill")
        kill(pid, SIGKILL);
    else if (std::system(("ip link set " + ifname + " down").c_str()) != 0)
        die("cannot take " + ifname + " down");
    const long wait_ms = bound_ms > 0 ? bound_ms + 2000 : 10000;
    const auto t0 = clk::now();
    nixl_status_t st = g.run(h, wait_ms);
    const long ms = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - t0).count();
    if (mode == "stop")
        kill(pid, SIGCONT);
    else if (mode == "cut" && std::system(("ip link set " + ifname + " up").c_str()) != 0)
        die("cannot bring " + ifname + " up");
    const nixl_status_t rel = g.a.releaseXferReq(h);
    if (mode != "kill")
        send("bye");
    g.a.deregisterMem(regd);
    const bool pass = bound_ms < 0 || (st < 0 && ms <= bound_ms);
    std::fprintf(stderr,
                 "nixl_pair %s %s %s: a 32 MiB WRITE to the %s peer: %s after %ld ms%s; "
                 "releaseXferReq %s: %s\n",
                 mode.c_str(), backend.c_str(), std::getenv("PAIR_NET"),
                 mode == "stop"   ? "stopped (SIGSTOP)"
                 : mode == "kill" ? "killed (SIGKILL)"
                                  : "cut-off (link down)",
                 nixlEnumStrings::statusStr(st).c_str(), ms,
                 st == NIXL_IN_PROG ? " (still in progress)" : "",
                 nixlEnumStrings::statusStr(rel).c_str(),
                 bound_ms < 0 ? "shown"
                 : pass       ? ("PASS (bound " + std::to_string(bound_ms) + " ms)").c_str()
                              : ("FAIL (bound " + std::to_string(bound_ms) + " ms)").c_str());
    if (bound_ms < 0) {
        // A run that only shows what a backend does (NIXL's UCX one) ends here: its agent's
        // teardown towards the killed peer hung once past the 150 s bound (CI), which is NIXL's
        // to fix, not what this run shows
        std::fflush(nullptr);
        _exit(0);
    }
    return pass ? 0 : 1;
}

} // namespace

int main(int argc, char **argv)
{
    std::string role;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (a == "--role")
            role = val();
        else if (a == "--backend")
            backend = val();
        else if (a == "--mode")
            mode = val();
        else if (a == "--bound-ms")
            bound_ms = std::stol(val());
        else if (a == "--expect-fence")
            expect_fence = true;
        else
            die("unknown argument " + a);
    }
    proto = fdopen(dup(1), "w");
    dup2(2, 1);
    const bool tgt = role == "target";
    if (mode == "xfer")
        return tgt ? targetXfer() : initiatorXfer();
    if (mode == "fence")
        return tgt ? targetFence() : initiatorFence();
    if (mode == "stop" || mode == "kill" || mode == "cut")
        return tgt ? targetSilent() : initiatorSilent();
    die("unknown mode " + mode);
}
