/*
 * How fast can one process's bytes get into another process's private memory on this host? The
 * three ways a transport has, without UCX or kvx, between a parent (the sender, CPU 0) and a
 * forked child (the receiver, CPU 1), moving the same BS-byte block (cache-hot, as nixlbench
 * moves it: batch 1, the same block every iteration) 4 GiB worth of times, one block at a time
 * (the sender starts the next once the receiver has the whole block):
 *
 *   cma-write   the sender's process_vm_writev into the receiver's buffer: one copy, by the
 *               sender's kernel (what NIXL's UCX backend does on shared memory: UCX 1.19.1 picks
 *               "zero-copy cma/memory" for ucp_put of host memory between two processes)
 *   cma-split   the sender writes the first half so while the receiver reads the second half
 *               with process_vm_readv: both cores copy, each one half
 *   ring        copy-in, copy-out through a shared ring of 128 slots of SEG bytes (kvx's eager
 *               path on shared memory: UCX's sysv FIFO of 128 elements of 32 KiB): the sender
 *               copies into a slot, the receiver copies out of it, pipelined
 *
 * Build: gcc -std=gnu11 -O2 -Wall -o copy_paths copy_paths.c
 * Run:   ./copy_paths [BS [SEG]]   (default 1 MiB, 32 KiB); run.sh runs 64 KiB to 4 MiB five
 *        times. No part of the test command. Results differ from minute to minute on a shared
 *        host: compare the three within one run.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NSLOT 128

struct shared {
    _Atomic long go; /* blocks the sender started */
    char pad1[120];
    _Atomic long done; /* blocks the receiver has (cma) or slots it emptied (ring) */
    char pad2[120];
    _Atomic long head; /* ring: slots filled */
    char pad3[120];
    _Atomic(char *) dst; /* the receiver's buffer */
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void pin(int cpu)
{
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(cpu, &cs);
    sched_setaffinity(0, sizeof(cs), &cs);
}

static double run(const char *mode, size_t bs, size_t seg)
{
    long iters = (long)((4ul << 30) / bs);
    size_t per = bs / seg;
    struct shared *sh = mmap(NULL, sizeof(*sh) + NSLOT * seg, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *slots = (char *)(sh + 1), *src = malloc(bs);
    pid_t parent = getpid(), child;
    double t;

    if (sh == MAP_FAILED || src == NULL)
        exit(1);
    memset(sh, 0, sizeof(*sh) + NSLOT * seg);
    memset(src, 1, bs);
    child = fork();
    if (child == 0) { /* the receiver */
        char *dst = malloc(bs);
        long tail = 0;
        pin(1);
        memset(dst, 0, bs);
        atomic_store(&sh->dst, dst);
        for (long it = 0; it < iters; it++) {
            if (strcmp(mode, "ring") == 0) {
                for (size_t k = 0; k < per; k++, tail++) {
                    while (atomic_load_explicit(&sh->head, memory_order_acquire) == tail)
                        ;
                    memcpy(dst + k * seg, slots + (size_t)(tail % NSLOT) * seg, seg);
                    atomic_store_explicit(&sh->done, tail + 1, memory_order_release);
                }
                continue;
            }
            while (atomic_load_explicit(&sh->go, memory_order_acquire) <= it)
                ;
            if (strcmp(mode, "cma-split") == 0) {
                struct iovec l = {dst + bs / 2, bs - bs / 2}, r = {src + bs / 2, bs - bs / 2};
                if (process_vm_readv(parent, &l, 1, &r, 1, 0) != (ssize_t)(bs - bs / 2))
                    _exit(2);
            }
            atomic_store_explicit(&sh->done, it + 1, memory_order_release);
        }
        _exit(0);
    }
    pin(0);
    while (atomic_load(&sh->dst) == NULL)
        ;
    char *dst = atomic_load(&sh->dst);
    long head = 0;
    t = now();
    for (long it = 0; it < iters; it++) {
        if (strcmp(mode, "ring") == 0) {
            for (size_t k = 0; k < per; k++, head++) {
                while (head - atomic_load_explicit(&sh->done, memory_order_acquire) >= NSLOT)
                    ;
                memcpy(slots + (size_t)(head % NSLOT) * seg, src + k * seg, seg);
                atomic_store_explicit(&sh->head, head + 1, memory_order_release);
            }
            while (atomic_load_explicit(&sh->done, memory_order_acquire) != head)
                ;
            continue;
        }
        size_t n = strcmp(mode, "cma-split") == 0 ? bs / 2 : bs;
        struct iovec l = {src, n}, r = {dst, n};
        atomic_store_explicit(&sh->go, it + 1, memory_order_release);
        if (process_vm_writev(child, &l, 1, &r, 1, 0) != (ssize_t)n) {
            perror("process_vm_writev");
            exit(1);
        }
        while (atomic_load_explicit(&sh->done, memory_order_acquire) <= it)
            ;
    }
    t = now() - t;
    waitpid(child, NULL, 0);
    munmap(sh, sizeof(*sh) + NSLOT * seg);
    free(src);
    return (double)bs * (double)iters / t / 1e9;
}

int main(int argc, char **argv)
{
    size_t bs = argc > 1 ? strtoul(argv[1], NULL, 0) : 1u << 20;
    size_t seg = argc > 2 ? strtoul(argv[2], NULL, 0) : 32u << 10;

    if (bs < seg || bs % seg != 0 || bs % 2 != 0) {
        fprintf(stderr, "BS must be a multiple of SEG\n");
        return 1;
    }
    printf("block %zu KiB: cma-write %.2f GB/s, cma-split %.2f, ring (%zu KiB slots) %.2f\n",
           bs >> 10, run("cma-write", bs, seg), run("cma-split", bs, seg), seg >> 10,
           run("ring", bs, seg));
    return 0;
}
