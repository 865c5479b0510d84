/*
 * Error names and the library version.
 */
#include "base/kvx_base.h"

#include <errno.h>
#include <limits.h>

const char *kvx_strerror(int err)
{
    if (err == INT_MIN) /* -INT_MIN does not exist */
        return "unknown error";
    if (err < 0)
        err = -err;
    switch (err) {
    case 0:
        return "success";
    case KVX_EINCOMPAT:
        return "peer incompatible (block length or config fingerprint)";
    case KVX_EFENCED:
        return "write fenced by the receiver";
    case EACCES:
        return "not authenticated (shared secret missing or different)";
    case EPROTO:
        return "protocol error (the peer sent more or other than asked)";
    case EINVAL:
        return "invalid argument";
    case ENOENT:
        return "unknown peer";
    case ENOMEM:
        return "out of memory";
    case ENOSPC:
        return "no space (buffer too small, too many transfers in flight or tags fenced)";
    case EKEYREVOKED:
        return "metadata retired by the receiver (kvx_fence_ex): add the peer with its new "
               "metadata";
    case ESTALE:
        return "metadata older than the peer's current metadata";
    case EEXIST:
        return "metadata is this transport's own";
    case EBADMSG:
        return "malformed, truncated or foreign metadata";
    case EPROTONOSUPPORT:
        return "unsupported metadata format version";
    case ETIMEDOUT:
        return "timed out";
    case ECONNRESET:
        return "peer failed (connection reset or unresponsive)";
    case ECONNABORTED:
        return "connection closed locally (peer removed, replaced or transport closed)";
    case ECONNREFUSED:
        return "connection refused";
    case ECANCELED:
        return "canceled";
    case ENOTCONN:
        return "peer connection has failed; re-add the peer";
    case ESHUTDOWN:
        return "transport is closed";
    case EHOSTUNREACH:
        return "peer unreachable";
    case ENODEV:
        return "UCX could not start";
    case ENOTSUP:
        return "not supported";
    case EBUSY:
        return "busy";
    case EAGAIN:
        return "resource temporarily unavailable";
    case EIO:
        return "I/O error";
    case EADDRINUSE:
        return "address in use (another listener has it)";
    case EALREADY:
        return "already listening";
    default:
        return "unknown error";
    }
}

const char *kvx_version(void) { return KVX_VERSION_STRING; }
