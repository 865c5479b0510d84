/*
 * LD_PRELOAD shim for tests: this process's CLOCK_REALTIME reads KVX_TEST_CLOCK_SHIFT seconds
 * off (negative: behind), as after an NTP step or a VM restore, without touching the machine's
 * clock. Every other clock is left alone. Built as libkvx_clockshift.so (tests/CMakeLists.txt);
 * test_restart starts a target with it.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

typedef int (*kt_clock_gettime_fn)(clockid_t, struct timespec *);

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static kt_clock_gettime_fn real;
    const char *shift;
    int rc;

    if (real == NULL)
        real = (kt_clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    rc = real(id, ts);
    if (rc == 0 && id == CLOCK_REALTIME && (shift = getenv("KVX_TEST_CLOCK_SHIFT")) != NULL)
        ts->tv_sec += strtol(shift, NULL, 10);
    return rc;
}
