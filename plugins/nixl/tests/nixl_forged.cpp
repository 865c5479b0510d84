// Forged connection info, public data and agent metadata given to a NIXL backend: refused, and
// never a crash. Each case runs in a process of its own (this program runs itself per case), so
// a crash is seen as one. Engine cases call the backend's engine directly (the plugin from
// $NIXL_PLUGIN_DIR, as NIXL loads it): loadRemoteConnInfo with the peer's connection info
// empty, truncated, random, with a byte flipped, claimed by another agent name, or one's own;
// loadRemoteMD with its public data mutated the same ways, for an unknown agent, as VRAM, or of
// a third agent; registerMem of VRAM. Agent cases give nixlAgent::loadRemoteMD a whole agent
// metadata blob truncated or with one byte flipped at 16 places (whatever NIXL's parser passes
// on reaches the engine). With --strict (kvx's promise) every forged engine case must be refused
// and every genuine one accepted; without it (UCX) the outcomes are printed, crashes included.
//
//   nixl_forged --backend KVX --strict
#include "backend/backend_plugin.h"
#include <nixl.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace
{

std::string backend = "UCX";

struct Engine {
    nixlBackendPlugin *plugin;
    nixlBackendEngine *e;
    nixl_b_params_t params;
    Engine(nixlBackendPlugin *p, const std::string &name) : plugin(p)
    {
        params = p->get_backend_options();
        nixlBackendInitParams ip;
        ip.localAgent = name;
        ip.type = backend;
        ip.customParams = &params;
        ip.syncMode = nixl_thread_sync_t::NIXL_THREAD_SYNC_NONE;
        e = p->create_engine(&ip);
        if (e == nullptr || e->getInitErr()) {
            std::fprintf(stderr, "nixl_forged: cannot create a %s engine\n", backend.c_str());
            std::exit(2);
        }
    }
    ~Engine() { plugin->destroy_engine(e); }
};

nixlBackendPlugin *loadPlugin()
{
    const char *dir = std::getenv("NIXL_PLUGIN_DIR");
    const std::string path = std::string(dir ? dir : ".") + "/libplugin_" + backend + ".so";
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
        std::fprintf(stderr, "nixl_forged: %s\n", dlerror());
        std::exit(2);
    }
    auto init = reinterpret_cast<nixlBackendPlugin *(*)()>(dlsym(h, "nixl_plugin_init"));
    return init();
}

std::string flip(std::string s, size_t at)
{
    if (!s.empty())
        s[at % s.size()] ^= 0x5a;
    return s;
}

std::string randomLike(const std::string &s)
{
    std::mt19937 g(7);
    std::string r(s.size(), 0);
    for (auto &c : r)
        c = static_cast<char>(g());
    return r;
}

struct Case {
    std::string name;
    bool genuine;                       // expected accepted; otherwise forged: refused
    bool agentLevel;                    // outcome only (NIXL's parser decides what passes)
    std::function<nixl_status_t()> run; // in the child
};

std::vector<uint8_t> buf(1 << 20, 1);

// The peer's engine (forge-b) with a registration: its conn info and public data, genuine.
struct Peer {
    std::unique_ptr<Engine> eng;
    nixlBackendMD *md = nullptr;
    std::string ci, pub;
    Peer(nixlBackendPlugin *p, const std::string &name) : eng(new Engine(p, name))
    {
        nixlBlobDesc d(reinterpret_cast<uintptr_t>(buf.data()), buf.size(), 0, "");
        if (eng->e->registerMem(d, DRAM_SEG, md) != NIXL_SUCCESS ||
            eng->e->getPublicData(md, pub) != NIXL_SUCCESS ||
            eng->e->getConnInfo(ci) != NIXL_SUCCESS) {
            std::fprintf(stderr, "nixl_forged: the genuine peer's registration failed\n");
            std::exit(2);
        }
    }
};

std::vector<Case> cases()
{
    std::vector<Case> c;
    auto conn = [&](std::string name, bool genuine, std::function<std::string(const Peer &)> f,
                    std::string as = "forge-b") {
        c.push_back({"loadRemoteConnInfo: " + name, genuine, false, [f, as]() {
                         auto *p = loadPlugin();
                         Peer b(p, "forge-b");
                         Engine a(p, "forge-a");
                         std::string info = f(b);
                         if (info == "<own>")
                             a.e->getConnInfo(info);
                         return a.e->loadRemoteConnInfo(as, info);
                     }});
    };
    conn("genuine", true, [](const Peer &b) { return b.ci; });
    conn("empty", false, [](const Peer &) { return std::string(); });
    conn("1 byte", false, [](const Peer &b) { return b.ci.substr(0, 1); });
    conn("half", false, [](const Peer &b) { return b.ci.substr(0, b.ci.size() / 2); });
    conn("all but the last byte", false,
         [](const Peer &b) { return b.ci.substr(0, b.ci.size() - 1); });
    conn("random bytes", false, [](const Peer &b) { return randomLike(b.ci); });
    for (int k = 0; k < 6; k++)
        conn("a byte flipped at " + std::to_string(k) + "/6", false,
             [k](const Peer &b) { return flip(b.ci, b.ci.size() * k / 6 + 3); });
    conn(
        "the peer's, claimed by another agent name", false, [](const Peer &b) { return b.ci; },
        "someone-else");
    conn("one's own", false, [](const Peer &) { return std::string("<own>"); });

    auto md = [&](std::string name, bool genuine, std::function<std::string(const Peer &)> f,
                  std::string agent = "forge-b", nixl_mem_t kind = DRAM_SEG) {
        c.push_back({"loadRemoteMD: " + name, genuine, false, [f, agent, kind]() {
                         auto *p = loadPlugin();
                         Peer b(p, "forge-b");
                         Engine a(p, "forge-a");
                         if (a.e->loadRemoteConnInfo("forge-b", b.ci) != NIXL_SUCCESS)
                             return NIXL_ERR_UNKNOWN; // the genuine path must work
                         std::string blob = f(b);
                         if (blob == "<third>") {
                             Peer c3(p, "forge-c");
                             blob = c3.pub;
                         }
                         nixlBlobDesc d(reinterpret_cast<uintptr_t>(buf.data()), buf.size(), 0,
                                        blob);
                         nixlBackendMD *out = nullptr;
                         nixl_status_t st = a.e->loadRemoteMD(d, kind, agent, out);
                         if (st == NIXL_SUCCESS)
                             a.e->unloadMD(out);
                         return st;
                     }});
    };
    md("genuine", true, [](const Peer &b) { return b.pub; });
    md("empty", false, [](const Peer &) { return std::string(); });
    md("half", false, [](const Peer &b) { return b.pub.substr(0, b.pub.size() / 2); });
    md("all but the last byte", false,
       [](const Peer &b) { return b.pub.substr(0, b.pub.size() - 1); });
    md("random bytes", false, [](const Peer &b) { return randomLike(b.pub); });
    for (int k = 0; k < 6; k++)
        md("a byte flipped at " + std::to_string(k) + "/6", false,
           [k](const Peer &b) { return flip(b.pub, b.pub.size() * k / 6 + 1); });
    md(
        "genuine, for an agent never loaded", false, [](const Peer &b) { return b.pub; }, "nobody");
    md(
        "genuine, as VRAM", false, [](const Peer &b) { return b.pub; }, "forge-b", VRAM_SEG);
    md("a third agent's, for this one", false, [](const Peer &) { return std::string("<third>"); });

    c.push_back({"registerMem: VRAM", false, false, []() {
                     Engine a(loadPlugin(), "forge-a");
                     nixlBlobDesc d(reinterpret_cast<uintptr_t>(buf.data()), buf.size(), 0, "");
                     nixlBackendMD *out = nullptr;
                     return a.e->registerMem(d, VRAM_SEG, out);
                 }});

    auto agent = [&](std::string name, bool genuine, std::function<std::string(std::string)> f) {
        c.push_back({"nixlAgent::loadRemoteMD: " + name, genuine, true, [f]() {
                         nixlAgentConfig cfg(false);
                         nixlAgent a("forge-a", cfg), b("forge-b", cfg);
                         nixlBackendH *ha, *hb;
                         nixl_mem_list_t mems;
                         nixl_b_params_t pa, pb;
                         a.getPluginParams(backend, mems, pa);
                         pb = pa;
                         if (a.createBackend(backend, pa, ha) != NIXL_SUCCESS ||
                             b.createBackend(backend, pb, hb) != NIXL_SUCCESS)
                             return NIXL_ERR_UNKNOWN;
                         nixl_reg_dlist_t r(DRAM_SEG);
                         r.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(buf.data()), buf.size(),
                                                0, ""));
                         std::string md, name;
                         if (b.registerMem(r) != NIXL_SUCCESS || b.getLocalMD(md) != NIXL_SUCCESS)
                             return NIXL_ERR_UNKNOWN;
                         nixl_status_t st = a.loadRemoteMD(f(md), name);
                         if (st == NIXL_SUCCESS)
                             a.invalidateRemoteMD(name);
                         b.deregisterMem(r);
                         return st;
                     }});
    };
    agent("genuine", true, [](std::string m) { return m; });
    agent("half", false, [](std::string m) { return m.substr(0, m.size() / 2); });
    for (int k = 0; k < 16; k++)
        agent("a byte flipped at " + std::to_string(k) + "/16", false,
              [k](std::string m) { return flip(m, m.size() * k / 16 + 5); });
    return c;
}

} // namespace

int main(int argc, char **argv)
{
    bool strict = false;
    int only = -1;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--backend" && i + 1 < argc)
            backend = argv[++i];
        else if (a == "--strict")
            strict = true;
        else if (a == "--case" && i + 1 < argc)
            only = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "usage: nixl_forged --backend NAME [--strict]\n");
            return 2;
        }
    }
    auto all = cases();
    if (only >= 0) { // the child: one case, its status as the exit code (+ 64)
        alarm(60);
        dup2(2, 1); // UCX's prints
        return 64 + all.at(only).run();
    }
    int bad = 0, crashed = 0, accepted_forged = 0;
    for (size_t i = 0; i < all.size(); i++) {
        pid_t pid = fork();
        if (pid == 0) {
            std::string n = std::to_string(i);
            execl("/proc/self/exe", argv[0], "--backend", backend.c_str(), "--case", n.c_str(),
                  (char *)nullptr);
            _exit(127);
        }
        int ws = 0;
        waitpid(pid, &ws, 0);
        std::string outcome;
        bool ok;
        if (WIFSIGNALED(ws)) {
            outcome = std::string("CRASHED (") + strsignal(WTERMSIG(ws)) + ")";
            crashed++;
            ok = false;
        } else if (WEXITSTATUS(ws) == 2) {
            outcome = "setup failed";
            ok = false;
        } else {
            auto st = static_cast<nixl_status_t>(WEXITSTATUS(ws) - 64);
            outcome = nixlEnumStrings::statusStr(st);
            ok = all[i].genuine ? st == NIXL_SUCCESS : (all[i].agentLevel || st != NIXL_SUCCESS);
            if (!all[i].genuine && st == NIXL_SUCCESS)
                accepted_forged++;
        }
        bad += !ok;
        std::fprintf(stderr, "  %-60s %s%s\n", all[i].name.c_str(), outcome.c_str(),
                     ok ? "" : (strict ? "  <- FAIL" : "  <- not refused"));
    }
    std::fprintf(stderr,
                 "nixl_forged %s: %zu cases, %d crashed, %d forged inputs accepted (engine "
                 "and agent level): %s\n",
                 backend.c_str(), all.size(), crashed, accepted_forged,
                 !strict    ? "shown"
                 : bad == 0 ? "PASS"
                            : "FAIL");
    return strict && bad != 0 ? 1 : 0;
}
