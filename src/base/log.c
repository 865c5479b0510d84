/*
 * Logging: a settable sink with levels, silent by default, level from KVX_LOG. Errors are logged
 * once, where they are first seen.
 */
#include "base/kvx_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static pthread_mutex_t kvx_log_lock = PTHREAD_MUTEX_INITIALIZER;
static kvx_log_fn kvx_log_global_fn;
static void *kvx_log_global_arg;
static int kvx_log_global_level = -1; /* -1: not read from the environment yet */

static const char *const kvx_level_names[] = {"off", "error", "warn", "info", "debug"};

static int kvx_log_env_level(void)
{
    const char *env = getenv("KVX_LOG");

    if (env == NULL)
        return KVX_LOG_OFF;
    for (int i = 0; i <= KVX_LOG_DEBUG; i++)
        if (strcasecmp(env, kvx_level_names[i]) == 0)
            return i;
    return KVX_LOG_OFF;
}

static void kvx_log_stderr(void *arg, int level, const char *msg)
{
    (void)arg;
    fprintf(stderr, "kvx %s: %s\n", kvx_level_names[level], msg);
}

void kvx_log_set(kvx_log_fn fn, void *arg, int level)
{
    pthread_mutex_lock(&kvx_log_lock);
    kvx_log_global_fn = fn;
    kvx_log_global_arg = arg;
    kvx_log_global_level = level < KVX_LOG_OFF     ? KVX_LOG_OFF
                           : level > KVX_LOG_DEBUG ? KVX_LOG_DEBUG
                                                   : level;
    pthread_mutex_unlock(&kvx_log_lock);
}

static void kvx_log_default(kvx_log_fn *fn, void **arg, int *level)
{
    pthread_mutex_lock(&kvx_log_lock);
    if (kvx_log_global_level < 0)
        kvx_log_global_level = kvx_log_env_level();
    *fn = kvx_log_global_fn != NULL ? kvx_log_global_fn : kvx_log_stderr;
    *arg = kvx_log_global_arg;
    *level = kvx_log_global_level;
    pthread_mutex_unlock(&kvx_log_lock);
}

void kvx_log(const kvx_logger_t *lg, int level, const char *fmt, ...)
{
    kvx_log_fn fn;
    void *arg;
    int max;
    char msg[512];
    va_list ap;

    if (lg != NULL && lg->own) {
        fn = lg->fn != NULL ? lg->fn : kvx_log_stderr;
        arg = lg->arg;
        max = lg->level;
    } else {
        kvx_log_default(&fn, &arg, &max);
    }
    if (level > max || level <= KVX_LOG_OFF)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (lg != NULL && lg->name[0] != '\0') {
        char line[600];
        snprintf(line, sizeof(line), "[%s] %s", lg->name, msg);
        fn(arg, level, line);
    } else {
        fn(arg, level, msg);
    }
}
