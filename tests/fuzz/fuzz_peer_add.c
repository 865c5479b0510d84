/*
 * kvx_peer_add with metadata whose kvx framing and checksum are valid but whose UCX part (the
 * worker address) is junk: random bytes flipped, cut, grown, or replaced. kvx checks its own
 * framing, but UCX's address parser takes no length, so without a shared secret such input can
 * crash the process inside UCX (docs/security.md). With --secret the fuzzer's transport holds a
 * secret and the inputs are what an attacker without it can make: unsigned, or signed with a key
 * of its own. Every one must be refused (-EACCES) before UCX sees it: no crash, no peer added. Each
 * batch of inputs runs in a forked child: a crash kills the child, is counted, and the next child
 * goes on after the input that crashed.
 *
 * The metadata the inputs start from is a live target's, so a mutated address that still parses
 * connects to it and then vanishes with its child: the run also reports whether that target
 * survived.
 *
 * usage: fuzz_peer_add [--secret] [--inputs N] [--seed S] [--verbose]
 * Prints the inputs tried, the crashes and the crashes per million inputs. Without --verbose the
 * children's UCX messages (one backtrace per crash) are discarded.
 */
#include "harness.h"
#include "kvx_int.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 16
static const uint8_t secret[] = "fuzz-peer-add-secret";
static const uint8_t wrong_secret[] = "an-attackers-own-key";

static uint64_t rng_state;
static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Input i: the base blob with its worker address mutated and re-encoded with a valid checksum.
 * With attack set, as an attacker without the secret would: every other input unsigned, the rest
 * signed with a key of the attacker's own. */
static size_t mutate(const kvx_md_t *base, uint64_t i, bool attack, uint8_t *out, size_t cap)
{
    uint8_t addr[2048];
    uint64_t s = rng_state ^ (i * 0x9e3779b97f4a7c15ull) ^ 1;
    size_t len = base->worker_addr_len;
    kvx_md_t md = *base;
    int kind = (int)(rng(&s) % 4);

    memcpy(addr, base->worker_addr, len);
    if (kind == 0) { /* flip a few bytes */
        for (int k = 0, n = 1 + (int)(rng(&s) % 8); k < n; k++)
            addr[rng(&s) % len] ^= (uint8_t)(1 + rng(&s) % 255);
    } else if (kind == 1) { /* cut */
        len = 1 + rng(&s) % len;
    } else if (kind == 2) { /* grow with junk */
        size_t more = 1 + rng(&s) % 256;
        for (size_t k = 0; k < more && len < sizeof(addr); k++)
            addr[len++] = (uint8_t)rng(&s);
    } else { /* all junk */
        len = 1 + rng(&s) % 512;
        for (size_t k = 0; k < len; k++)
            addr[k] = (uint8_t)rng(&s);
    }
    md.worker_addr = addr;
    md.worker_addr_len = (uint32_t)len;
    if (attack && (i & 1)) {
        md.flags = KVX_MDF_MAC;
        return (size_t)kvx_md_encode(&md, wrong_secret, sizeof(wrong_secret), out, cap);
    }
    md.flags = 0;
    return (size_t)kvx_md_encode(&md, NULL, 0, out, cap);
}

typedef struct child_ctx {
    kvx_transport_t *t;
    const kvx_md_t *base;
    bool sign;
    uint64_t next, end;
    uint64_t *progress; /* shared with the parent: the lowest input not yet finished per thread */
    uint64_t *accepted; /* shared with the parent: inputs kvx_peer_add took */
    pthread_mutex_t lock;
} child_ctx_t;

static void *worker(void *arg)
{
    child_ctx_t *c = arg;
    uint8_t blob[4096];
    char id[32];

    for (;;) {
        uint64_t i;
        size_t len;
        int rc;
        pthread_mutex_lock(&c->lock);
        i = c->next++;
        pthread_mutex_unlock(&c->lock);
        if (i >= c->end)
            return NULL;
        len = mutate(c->base, i, c->sign, blob, sizeof(blob));
        snprintf(id, sizeof(id), "f%llu", (unsigned long long)i);
        /* the input in flight in this slot, for the parent if we die */
        c->progress[i % THREADS] = i + 1;
        rc = kvx_peer_add(c->t, id, blob, len, NULL);
        if (rc == 0) {
            __atomic_fetch_add(c->accepted, 1, __ATOMIC_RELAXED);
            kvx_peer_remove(c->t, id);
        } else if (c->sign && rc != -EACCES) {
            fprintf(stderr, "input %llu: refused with %d, not -EACCES\n", (unsigned long long)i,
                    rc);
            __atomic_fetch_add(c->accepted, 1, __ATOMIC_RELAXED);
        }
        c->progress[i % THREADS] = 0;
    }
}

/* The control: the base metadata itself, signed with the right secret when there is one, must be
 * accepted, or the refusals above prove nothing. */
static int control(const kvx_md_t *base, bool sign)
{
    kt_region_t r = kt_region_alloc(16, 4096);
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_LOG,
                      .base = r.base,
                      .num_blocks = 16,
                      .block_len = 4096,
                      .agent_name = "fuzzer",
                      .log_level = KVX_LOG_ERROR};
    kvx_transport_t *t;
    kvx_md_t md = *base;
    uint8_t blob[4096];
    int len, rc;

    if (sign) {
        p.field_mask |= KVX_PARAM_SECRET;
        p.secret = secret;
        p.secret_len = sizeof(secret);
    }
    md.flags = sign ? KVX_MDF_MAC : 0;
    len = kvx_md_encode(&md, sign ? secret : NULL, sign ? sizeof(secret) : 0, blob, sizeof(blob));
    KT_CHECK(len > 0);
    KT_OK(kvx_transport_create(&p, &t));
    rc = kvx_peer_add(t, "control", blob, (size_t)len, NULL);
    kvx_transport_destroy(t);
    return rc == 0 ? 0 : 1;
}

static int child(const kvx_md_t *base, bool sign, uint64_t first, uint64_t end, uint64_t *progress,
                 uint64_t *accepted)
{
    kt_region_t r = kt_region_alloc(16, 4096);
    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME | KVX_PARAM_LOG,
                      .base = r.base,
                      .num_blocks = 16,
                      .block_len = 4096,
                      .agent_name = "fuzzer",
                      .log_level = KVX_LOG_OFF};
    child_ctx_t c = {.base = base,
                     .sign = sign,
                     .next = first,
                     .end = end,
                     .progress = progress,
                     .accepted = accepted};
    pthread_t th[THREADS];

    if (sign) {
        p.field_mask |= KVX_PARAM_SECRET;
        p.secret = secret;
        p.secret_len = sizeof(secret);
    }
    pthread_mutex_init(&c.lock, NULL);
    KT_OK(kvx_transport_create(&p, &c.t));
    for (int k = 0; k < THREADS; k++)
        pthread_create(&th[k], NULL, worker, &c);
    for (int k = 0; k < THREADS; k++)
        pthread_join(th[k], NULL);
    kvx_transport_destroy(c.t);
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t inputs = 20000, crashes = 0, i = 0, t0 = kt_now_ns();
    bool sign = false, verbose = false;
    int stop;
    kt_target_args_t a = {.num_blocks = 16, .block_len = 4096, .salt = 1, .threads = 1};
    kt_target_t tg;
    kvx_md_t base;
    uint8_t *md_copy;
    uint64_t *progress = mmap(NULL, (THREADS + 1) * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint64_t *accepted = progress + THREADS;

    rng_state = 0x5eed;
    for (int k = 1; k < argc; k++) {
        if (strcmp(argv[k], "--secret") == 0)
            sign = true;
        else if (strcmp(argv[k], "--inputs") == 0 && k + 1 < argc)
            inputs = strtoull(argv[++k], NULL, 0);
        else if (strcmp(argv[k], "--seed") == 0 && k + 1 < argc)
            rng_state = strtoull(argv[++k], NULL, 0);
        else if (strcmp(argv[k], "--verbose") == 0)
            verbose = true;
    }
    signal(SIGPIPE, SIG_IGN); /* the target may have died: its quit command then finds no one */
    /* a real worker address to start from: a target's metadata */
    a.name = "fuzz-base";
    tg = kt_target_start(&a);
    md_copy = malloc(tg.md_len);
    memcpy(md_copy, tg.md, tg.md_len);
    KT_OK(kvx_md_decode(md_copy, tg.md_len, &base));
    {
        pid_t pid;
        int st;
        fflush(NULL);
        pid = fork();
        if (pid == 0)
            _exit(control(&base, sign));
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("the unchanged metadata was not accepted: the fuzzer is broken\n");
            return 1;
        }
    }
    while (i < inputs) {
        pid_t pid;
        int st;
        memset(progress, 0, THREADS * sizeof(uint64_t));
        fflush(NULL);
        pid = fork();
        if (pid == 0) {
            if (!verbose) { /* UCX writes its messages to stdout */
                (void)!freopen("/dev/null", "w", stdout);
                (void)!freopen("/dev/null", "w", stderr);
            }
            _exit(child(&base, sign, i, inputs, progress, accepted));
        }
        waitpid(pid, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
            break;
        /* a crash: every input the threads had in flight counts as tried; the lowest of them
         * is blamed, the batch resumes after the highest */
        crashes++;
        {
            uint64_t lo = UINT64_MAX, hi = i;
            for (int k = 0; k < THREADS; k++)
                if (progress[k] != 0) {
                    lo = progress[k] - 1 < lo ? progress[k] - 1 : lo;
                    hi = progress[k] > hi ? progress[k] : hi;
                }
            i = hi > i ? hi : i + 1;
            (void)lo;
        }
    }
    printf("kvx_peer_add with junk UCX addresses%s: %llu inputs, %llu accepted, %llu crashes "
           "(%.0f per million), %.1f s\n",
           sign ? " from a signer without the secret" : "", (unsigned long long)inputs,
           (unsigned long long)*accepted, (unsigned long long)crashes,
           1e6 * (double)crashes / (double)inputs, (double)(kt_now_ns() - t0) / 1e9);
    free(md_copy);
    /* the target may have died meanwhile (UCX asserting on a peer that vanished during its
     * wire-up, docs/security.md): then there is no one to tell to quit */
    if (waitpid(tg.proc.pid, &stop, WNOHANG) == tg.proc.pid) {
        stop = 128 + (WIFSIGNALED(stop) ? WTERMSIG(stop) : 0);
        free(tg.md);
    } else {
        stop = kt_target_stop(&tg);
    }
    printf("the target whose address was mutated %s\n",
           stop == 0 ? "survived" : "died (see docs/security.md)");
    return sign && (crashes > 0 || *accepted > 0 || stop != 0);
}
