/*
 * The standard test target as a program of its own (see kt_target_start): kt-target FD BLOCKS
 * BLOCK_LEN SALT THREADS NAME FINGERPRINT NETNS IFNAME OWNED LISTEN, "-" for an unset string.
 */
#include "harness.h"

#include <string.h>

static const char *opt(const char *s) { return strcmp(s, "-") == 0 ? NULL : s; }

int main(int argc, char **argv)
{
    kt_target_args_t a = {0};

    if (argc != 12) {
        fprintf(
            stderr,
            "usage: kt-target FD BLOCKS BLOCK_LEN SALT THREADS NAME FP NETNS IF OWNED LISTEN\n");
        return 2;
    }
    a.num_blocks = strtoull(argv[2], NULL, 0);
    a.block_len = strtoull(argv[3], NULL, 0);
    a.salt = strtoull(argv[4], NULL, 0);
    a.threads = (unsigned)atoi(argv[5]);
    a.name = opt(argv[6]);
    a.fingerprint = opt(argv[7]);
    a.owned = atoi(argv[10]) != 0;
    a.listen = opt(argv[11]);
    if (opt(argv[8]) != NULL)
        kt_netns_enter_named(argv[8], argv[9]);
    return kt_target_main(atoi(argv[1]), &a);
}
