/*
 * Which host and process a transport lives in, and whether a peer on this host is still alive.
 * UCX's shared-memory keepalive only asks whether the peer's pid exists, and a dead process that
 * its parent has not reaped (a zombie) still has one: kvx watches same-host peers itself, through
 * a pidfd (readable once the process has exited, reaped or not) or /proc when pidfds are denied.
 */
#include "base/kvx_base.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int kvx_hexval(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* "f519bec6-4f1c-..." -> 16 bytes; false when unreadable. */
static bool kvx_read_boot_id(uint8_t out[16])
{
    char buf[64];
    size_t n = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");

    if (f == NULL)
        return false;
    if (fgets(buf, sizeof(buf), f) == NULL) {
        fclose(f);
        return false;
    }
    fclose(f);
    for (const char *p = buf; *p && n < 32; p++) {
        int v = kvx_hexval((unsigned char)*p);
        if (v < 0)
            continue;
        if (n % 2 == 0)
            out[n / 2] = (uint8_t)(v << 4);
        else
            out[n / 2] |= (uint8_t)v;
        n++;
    }
    return n == 32;
}

/*
 * State letter and start time (clock ticks after boot) of process pid from /proc/<pid>/stat.
 * Returns 0, or -ESRCH when there is no such process.
 */
static int kvx_proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    const char *p;
    unsigned long long st;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -ESRCH;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -ESRCH;
    buf[n] = '\0';
    /* the command name may hold spaces and parentheses: fields resume after the last ')' */
    p = strrchr(buf, ')');
    if (p == NULL || sscanf(p + 2,
                            "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                            "%*d %*d %llu",
                            state, &st) != 2)
        return -ESRCH;
    *start = st;
    return 0;
}

void kvx_host_self(kvx_host_id_t *id)
{
    struct stat sb;
    char state;

    memset(id, 0, sizeof(*id));
    id->pid = (uint32_t)getpid();
    if (!kvx_read_boot_id(id->boot_id))
        return; /* all zero: "host unknown", so peers never watch this process by pid */
    if (stat("/proc/self/ns/pid", &sb) == 0)
        id->pid_ns = (uint64_t)sb.st_ino;
    if (kvx_proc_stat(getpid(), &state, &id->start_time) < 0)
        memset(id->boot_id, 0, sizeof(id->boot_id));
}

/* Same kernel and same pid namespace: the peer's pid means the same process here. */
static bool kvx_host_same(const kvx_host_id_t *self, const kvx_host_id_t *peer)
{
    static const uint8_t zero[16];

    return memcmp(peer->boot_id, zero, 16) != 0 && memcmp(self->boot_id, peer->boot_id, 16) == 0 &&
           peer->pid_ns == self->pid_ns && peer->pid_ns != 0 && peer->pid != 0;
}

/* The process /proc shows: 1 alive and the one the metadata names, 0 gone (no such process, a
 * zombie, or another process under a reused pid), -1 unknown (/proc does not show it to us,
 * e.g. hidepid). */
static int kvx_host_proc_state(const kvx_host_id_t *peer)
{
    char state;
    uint64_t start;

    if (kvx_proc_stat((pid_t)peer->pid, &state, &start) < 0)
        return kill((pid_t)peer->pid, 0) < 0 && errno == ESRCH ? 0 : -1;
    return start == peer->start_time && state != 'Z' && state != 'X' && state != 'x';
}

int kvx_host_watch(const kvx_host_id_t *self, const kvx_host_id_t *peer, int *pidfd_p)
{
    int fd, st;

    *pidfd_p = -1;
    if (!kvx_host_same(self, peer))
        return 0;
        /* A pidfd first: it tells a gone process apart even where /proc hides other users'. */
#ifdef SYS_pidfd_open
    fd = (int)syscall(SYS_pidfd_open, (pid_t)peer->pid, 0);
#else
    fd = -1;
    errno = ENOSYS;
#endif
    if (fd < 0 && errno == ESRCH)
        return -EHOSTUNREACH;
    if (fd >= 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        close(fd);
        fd = -1;
    }
    /* Is it the process the metadata names (a pid can be reused), and not exited? Where /proc
     * cannot say, a pidfd still sees the exit; without either, UCX's keepalive is all there is. */
    st = kvx_host_proc_state(peer);
    if (st == 0 || (fd >= 0 && !kvx_host_alive(peer, fd))) {
        if (fd >= 0)
            close(fd);
        return -EHOSTUNREACH;
    }
    if (fd < 0 && st < 0)
        return 0;
    *pidfd_p = fd; /* -1: pidfds denied here (seccomp, old kernel, valgrind): /proc is read */
    return 1;
}

bool kvx_host_alive(const kvx_host_id_t *peer, int pidfd)
{
    if (pidfd >= 0) {
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        int n;
        /* a pidfd turns readable when its process exits, before it is reaped */
        while ((n = poll(&p, 1, 0)) < 0 && errno == EINTR)
            ;
        return n <= 0 || !(p.revents & POLLIN); /* an error says nothing: assume alive */
    }
    return kvx_host_proc_state(peer) != 0;
}
