/*
 * How a connection's runs travel, driven over lane names (this host has no RDMA device): which
 * transports UCX's rendezvous moves by zero-copy RMA, what kvx_rndv_choose picks for each mode,
 * what the peer takes, the lanes, the threshold set and UCX's own, and why (the debug log's
 * words); and what kvx reads of an endpoint from ucp_ep_print_info's text, as UCX 1.13.1 and
 * 1.19.1 print it (texts taken from kvx's own endpoints here, and an RDMA endpoint's lines in the
 * same format).
 */
#include "harness.h"
#include "kvx_int.h"

#include <string.h>

static void zcopy_names(void)
{
    static const char *const yes[] = {"rc_mlx5",         "rc_verbs",        "dc_mlx5",
                                      "gga_mlx5",        "rc_mlx5,rc_mlx5", "rc_mlx5,dc_mlx5",
                                      "rc_verbs,dc_mlx5"};
    static const char *const no[] = {"",
                                     "tcp",
                                     "sysv",
                                     "posix",
                                     "cma",
                                     "self",
                                     "ud_verbs",
                                     "ud_mlx5",
                                     "knem",
                                     "xpmem",
                                     "rc",
                                     "sysv,posix",
                                     "rc_mlx5,tcp",
                                     "tcp,rc_mlx5",
                                     "rc_mlx5,ud_mlx5",
                                     "dc",
                                     "cuda_ipc",
                                     "cuda_copy",
                                     "gdr_copy",
                                     "rocm_copy",
                                     "rocm_ipc",
                                     "rc_mlx5,cuda_ipc"};

    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (!kvx_rndv_lanes_zcopy(yes[i]))
            KT_FAIL("'%s' should be zero-copy RMA", yes[i]);
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        if (kvx_rndv_lanes_zcopy(no[i]))
            KT_FAIL("'%s' should not be zero-copy RMA", no[i]);
}

/* One choice: the threshold it must give, and words its reason must hold. */
static void choose(int mode, uint64_t thresh, bool takes, const char *rndv, const char *am,
                   uint64_t ucx, const char *proto, uint64_t want, const char *words)
{
    char why[256];
    kvx_rndv_in_t in = {.mode = mode,
                        .thresh = thresh,
                        .peer_takes = takes,
                        .rndv_lanes = rndv,
                        .am_lanes = am,
                        .ucx_rndv = ucx,
                        .ucx_proto = proto};
    uint64_t got = kvx_rndv_choose(&in, why, sizeof(why));

    kt_log("mode %d thresh %llu takes %d lanes '%s'/'%s' ucx %lld: %s", mode,
           (unsigned long long)thresh, takes, rndv, am, (long long)ucx, why);
    if (got != want)
        KT_FAIL("'%s' (am '%s', mode %d): %llu, want %llu", rndv, am, mode, (unsigned long long)got,
                (unsigned long long)want);
    if (strstr(why, words) == NULL)
        KT_FAIL("'%s' does not say '%s'", why, words);
}

static void choices(void)
{
    const uint64_t none = UINT64_MAX;
    const char *z = "rendezvous zero-copy read from remote";
    const char *f = "rendezvous fragmented copy-in copy-out";

    /* eager: never, on any lane */
    choose(KVX_RNDV_EAGER, 0, true, "rc_mlx5", "rc_mlx5", 29421, z, none, "KVX_RNDV_EAGER");
    choose(KVX_RNDV_EAGER, 4096, true, "", "tcp", none, "", none, "KVX_RNDV_EAGER");
    /* a peer that takes none: never */
    choose(KVX_RNDV_AUTO, 0, false, "rc_mlx5", "rc_mlx5", 29421, z, none, "takes no rendezvous");
    choose(KVX_RNDV_ALWAYS, 0, false, "", "sysv", none, "", none, "takes no rendezvous");
    /* always: every lane, from the threshold set (every run without one) */
    choose(KVX_RNDV_ALWAYS, 0, true, "", "tcp", 87903, f, 0, "every run: KVX_RNDV_ALWAYS");
    choose(KVX_RNDV_ALWAYS, 65536, true, "", "sysv", none, "", 65536, "65536 bytes or more");
    choose(KVX_RNDV_ALWAYS, 0, true, "rc_mlx5", "rc_mlx5", 29421, z, 0, "every run");
    /* auto: eager where UCX's rendezvous is a copy, whatever threshold UCX or the user says */
    choose(KVX_RNDV_AUTO, 0, true, "", "tcp", 87903, "", none, "is a copy, not zero-copy RMA");
    choose(KVX_RNDV_AUTO, 0, true, "", "sysv", 550999, f, none,
           "(UCX: \""
           "rendezvous frag");
    choose(KVX_RNDV_AUTO, 4096, true, "", "sysv,posix", none, "", none, "'sysv,posix' is a copy");
    choose(KVX_RNDV_AUTO, 0, true, "cma", "sysv", none, "", none, "'cma' is a copy");
    choose(KVX_RNDV_AUTO, 0, true, "", "ud_mlx5", 16384, "", none, "'ud_mlx5' is a copy");
    choose(KVX_RNDV_AUTO, 0, true, "rc_mlx5,tcp", "rc_mlx5", 16384, "", none, "is a copy");
    /* auto on zero-copy RMA lanes: the threshold set, else UCX's own, else KVX_RNDV_ZCOPY_MIN */
    choose(KVX_RNDV_AUTO, 131072, true, "rc_mlx5", "rc_mlx5", 29421, z, 131072,
           "the threshold set (rndv_thresh)");
    choose(KVX_RNDV_AUTO, 0, true, "rc_mlx5", "rc_mlx5", 29421, z, 29421,
           "UCX's own threshold for this endpoint (\"rendezvous zero-copy read from remote\")");
    choose(KVX_RNDV_AUTO, 0, true, "dc_mlx5", "dc_mlx5", 20000, "", 20000,
           "UCX's own threshold for this endpoint");
    choose(KVX_RNDV_AUTO, 0, true, "gga_mlx5", "rc_mlx5", none, "", KVX_RNDV_ZCOPY_MIN,
           "UCX reports no threshold");
    /* a host region through a GPU copy engine is a copy (UCX adds such lanes for GPU memory) */
    choose(KVX_RNDV_AUTO, 0, true, "cuda_ipc", "sysv", none, "", none, "'cuda_ipc' is a copy");
    /* UCX 1.14 and later name the protocol: one that copies is a copy, whatever the lanes */
    choose(KVX_RNDV_AUTO, 0, true, "rc_mlx5", "rc_mlx5", 262144, f, none,
           "is a copy, not zero-copy RMA (UCX: \"rendezvous fragmented");
    choose(KVX_RNDV_AUTO, 0, true, "rc_verbs,rc_verbs", "rc_verbs", 8256, "", 8256,
           "zero-copy RMA on 'rc_verbs,rc_verbs'");
}

/* UCX 1.13.1, kvx's endpoint over tcp here */
static const char ucx113_tcp[] =
    "#\n# UCP endpoint \n#\n#               peer: <no debug data>\n"
    "#                 lane[0]:  0:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am "
    "am_bw#0 keepalive wireup\n#\n"
    "#                 am_send: 0..<egr/short>..61433..<egr/zcopy>..87903..<rndv>..(inf)\n#\n"
    "#                  rma_bw: mds rndv_rkey_size 9\n#\n";
/* UCX 1.13.1 on an RDMA endpoint: the same lines as ucp_ep.c prints them for rc lanes */
static const char ucx113_rc[] =
    "#                 lane[0]:  8:rc_mlx5/mlx5_0:1.0 md[4]      -> md[4]/ib/sysdev[255] rma_bw#0 "
    "am am_bw#0 wireup\n"
    "#                 lane[1]:  9:rc_mlx5/mlx5_1:1.0 md[5]      -> md[5]/ib/sysdev[255] "
    "rma_bw#1 am_bw#1\n"
    "#                 lane[2]:  3:sysv/memory.0 md[0]           -> md[0]/sysv/sysdev[255] "
    "keepalive\n#\n"
    "#                 am_send: 0..<egr/short>..2038..<egr/bcopy>..8256..<egr/zcopy>..29421..<rndv>"
    "..(inf)\n#\n#                  rma_bw: mds [4] [5] rndv_rkey_size 35\n";
/* UCX 1.19.1, kvx's endpoint over shared memory here (three of its tables) */
static const char ucx119_sysv[] =
    "#                 lane[0]:  0:sysv/memory.0 md[0]           -> md[0]/sysv/sysdev[255] seg "
    "4294967295 am keepalive\n#\n"
    "# +----------------------------------------+------------------------------------------------"
    "---------------------+\n"
    "# | kvx-vm-12527-dd5b11af intra-node cfg#0 | active message by ucp_am_send*(fast-completion) "
    "from host memory    |\n"
    "# |                                  0..92 | short                                          "
    "       | sysv/memory |\n"
    "# |                              256K..inf | (?) rendezvous fragmented copy-in copy-out     "
    "       | sysv/memory |\n"
    "# | kvx-vm-12527-dd5b11af intra-node cfg#0 | active message by ucp_am_send* with reply "
    "flag(multi) from host memory    |\n"
    "# |                            242227..inf | (?) rendezvous fragmented copy-in copy-out      "
    "            | sysv/memory |\n"
    "# +----------------------------------------+--------------------------------------------------"
    "------------------+\n"
    "# | kvx-vm-12527-dd5b11af intra-node cfg#0 | active message by ucp_am_send* with reply flag "
    "from host memory    |\n"
    "# +----------------------------------------+------------------------------------------------"
    "------+-------------+\n"
    "# |                                  0..84 | short                                          "
    "      | sysv/memory |\n"
    "# |                              85..32752 | copy-in                                        "
    "      | sysv/memory |\n"
    "# |                          32753..550998 | multi-frag copy-in                             "
    "      | sysv/memory |\n"
    "# |                            550999..inf | (?) rendezvous fragmented copy-in copy-out     "
    "      | sysv/memory |\n"
    "# +----------------------------------------+------------------------------------------------"
    "------+-------------+\n";
/* UCX 1.19.1 on an RDMA endpoint, in the same format (a table in megabytes too) */
static const char ucx119_rc[] =
    "#                 lane[0]:  1:rc_mlx5/mlx5_0:1.0 md[1]      -> md[1]/ib/sysdev[255] seg 8256 "
    "rma_bw#0 am wireup\n"
    "# +------------+---------------------------------------------------------------+\n"
    "# | host cfg#1 | active message by ucp_am_send* with reply flag from host memory |\n"
    "# +------------+---------------------------------------+------------------------+\n"
    "# |     0..2038 | short                                 | rc_mlx5/mlx5_0:1 |\n"
    "# |  2039..8246 | copy-in                               | rc_mlx5/mlx5_0:1 |\n"
    "# | 8247..29420 | zero-copy                             | rc_mlx5/mlx5_0:1 |\n"
    "# |   28K..inf  | rendezvous zero-copy read from remote | rc_mlx5/mlx5_0:1 |\n"
    "# +------------+---------------------------------------+------------------------+\n";
/* ... kvx's table with no rendezvous row, and another table's after it: UCX says none for kvx */
static const char ucx119_none[] =
    "#                 lane[0]:  1:rc_mlx5/mlx5_0:1.0 md[1]      -> md[1]/ib/sysdev[255] seg 8256 "
    "rma_bw#0 am wireup\n"
    "# +------------+---------------------------------------------------------------+\n"
    "# | host cfg#1 | active message by ucp_am_send* with reply flag from host memory |\n"
    "# +------------+---------------------------------------+------------------------+\n"
    "# |    0..inf   | zero-copy                             | rc_mlx5/mlx5_0:1 |\n"
    "# +------------+---------------------------------------+------------------------+\n"
    "# | host cfg#1 | active message by ucp_am_send*(multi) from host memory |\n"
    "# +------------+---------------------------------------+------------------------+\n"
    "# |   64K..inf  | rendezvous zero-copy read from remote | rc_mlx5/mlx5_0:1 |\n"
    "# +------------+---------------------------------------+------------------------+\n";

static void parse(const char *name, const char *text, const char *am, const char *rndv,
                  uint64_t ucx, const char *proto)
{
    kvx_lanes_t l;

    kvx_ucx_lanes_parse(text, &l);
    kt_log("%s: am '%s', rendezvous lanes '%s', UCX's threshold %lld, \"%s\"", name, l.am, l.rndv,
           (long long)l.ucx_rndv, l.ucx_proto);
    if (strcmp(l.am, am) != 0 || strcmp(l.rndv, rndv) != 0 || l.ucx_rndv != ucx ||
        strcmp(l.ucx_proto, proto) != 0)
        KT_FAIL("%s: got '%s' '%s' %llu '%s', want '%s' '%s' %llu '%s'", name, l.am, l.rndv,
                (unsigned long long)l.ucx_rndv, l.ucx_proto, am, rndv, (unsigned long long)ucx,
                proto);
}

int main(void)
{
    zcopy_names();
    choices();
    parse("ucx 1.13.1 tcp", ucx113_tcp, "tcp", "", 87903, "");
    parse("ucx 1.13.1 rc", ucx113_rc, "rc_mlx5", "rc_mlx5", 29421, "");
    parse("ucx 1.19.1 sysv", ucx119_sysv, "sysv", "", 550999,
          "rendezvous fragmented copy-in copy-out");
    parse("ucx 1.19.1 rc", ucx119_rc, "rc_mlx5", "rc_mlx5", 28 << 10,
          "rendezvous zero-copy read from remote");
    parse("ucx 1.19.1 rc, no rendezvous for kvx's sends", ucx119_none, "rc_mlx5", "rc_mlx5",
          UINT64_MAX, "");
    parse("nothing", "", "", "", UINT64_MAX, "");
    parse("junk", "lane[0]: :\n am_send: <rndv>\n| x..y | rendezvous |\n", "", "", UINT64_MAX, "");
    return 0;
}
