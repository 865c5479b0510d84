/*
 * kvx-bench's control channel: framed messages over TCP between an initiator and a server, the
 * initiator's requests, and the sockets under them.
 */
#ifndef KVX_BENCH_CTL_H
#define KVX_BENCH_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The salts of the blocks' patterns (common.h): the server fills its regions with SERVER_SALT,
 * initiator k its own with CLIENT_SALT + k, so that a block that travelled names its origin. */
#define SERVER_SALT 0x5eull
#define CLIENT_SALT 0xc0ull

/* Every message is a header {type, len} and len bytes. The server answers each request with a
 * message of the same type, or with MSG_ERROR (a text) and closes that client. */
enum {
    MSG_REGION = 1,
    MSG_VERIFY,
    MSG_REFILL,
    MSG_BARRIER,
    MSG_BYE,
    MSG_ERROR,
    MSG_CPU,
    MSG_REGIONS,
    MSG_VERIFY_RANGES
};

typedef struct msg_hdr {
    uint32_t type;
    uint32_t len;
} msg_hdr_t;

/* MSG_REGION and MSG_REFILL carry {block_len, num_blocks}; MSG_REGION is answered with the port
 * (u32) that region's transport listens on, at the server's address. MSG_BARRIER {id, n};
 * MSG_CPU nothing, answered with the server process's CPU time in ns (u64). */
typedef struct verify_req {
    uint64_t block_len, num_blocks, salt, round;
    uint32_t n;
    uint32_t pad;
    /* followed by n pairs {dst, src} */
} verify_req_t;

/* MSG_REGIONS: count regions of bytes each registered (kvx_region_register) on the transport
 * of the region of that geometry (MSG_REGION made it), region k filled with the pattern of
 * (SERVER_SALT, RR_SRC + k, 0) as one block (MSG_REFILL fills them again); answered with the
 * count blobs, each a u32 length and that many bytes. Asked again with the same count and
 * bytes, the same regions. */
typedef struct regions_req {
    uint64_t block_len, num_blocks, count, bytes;
} regions_req_t;
#define RR_SRC 0x1000000ull
#define RR_BLOB_MAX 256 /* KVX_REGION_BLOB_MAX */

/* MSG_VERIFY_RANGES: n runs, each len bytes at off of the server's region `region` (an index of
 * MSG_REGIONS) that must hold the bytes at src_off of a region filled with (salt, RR_SRC + src,
 * round); answered with the count of wrong runs (u64). */
typedef struct range_check {
    uint32_t region, src;
    uint64_t off, src_off, len;
} range_check_t;
typedef struct verify_ranges_req {
    uint64_t block_len, num_blocks, salt, round;
    uint32_t n;
    uint32_t pad;
    /* followed by n range_check_t */
} verify_ranges_req_t;
#define RANGE_CHECKS_MAX (1u << 17) /* per message: well under MSG_MAX */

/* The largest message either side accepts: a VERIFY of 2^20 blocks (8 MiB). */
#define MSG_MAX (sizeof(verify_req_t) + 8u * (1u << 20))

bool io_all(int fd, void *buf, size_t len, bool wr);
void msg_send(int fd, uint32_t type, const void *buf, uint32_t len);
/* The client's receive: a malloc'd payload; dies on a closed channel, on MSG_ERROR and on a
 * message over MSG_MAX. */
uint8_t *msg_recv(int fd, msg_hdr_t *h);
/* Listen on addr (an IPv4 address; NULL: 127.0.0.1) and port (0: any). */
int listen_on(const char *addr, int port, int *port_out);
/* Connect to host[:port] (default_port without one), retrying for 5 s. */
int connect_to(const char *spec, int default_port);

/* ---- the initiator's requests: each waits for its answer, and dies on a refusal ------------ */

/* The server's region of that geometry (made on first use): the port its transport listens on. */
uint32_t ctl_region(int fd, uint64_t block_len, uint64_t num_blocks);
/* Its blocks written again with the server's pattern. */
void ctl_refill(int fd, uint64_t block_len, uint64_t num_blocks);
/* Returns once n initiators have sent barrier id. */
void ctl_barrier(int fd, uint32_t id, uint32_t n);
/* The server process's CPU time (ns). */
uint64_t ctl_cpu_ns(int fd);
/* The count of wrong blocks among q->n: remote block dst[k] must hold the pattern of
 * (q->salt, src[k], q->round). */
uint64_t ctl_verify(int fd, const verify_req_t *q, const uint32_t *dst, const uint32_t *src);
/* count regions of bytes each beside the region of that geometry (MSG_REGIONS): blob k into
 * blobs + k * RR_BLOB_MAX, its length into lens[k]. */
void ctl_regions(int fd, uint64_t block_len, uint64_t num_blocks, uint32_t count, uint64_t bytes,
                 uint8_t *blobs, size_t *lens);
/* The count of wrong runs among n (sent in messages of at most RANGE_CHECKS_MAX). */
uint64_t ctl_verify_ranges(int fd, const verify_ranges_req_t *q, const range_check_t *c, size_t n);
/* Say goodbye and close. */
void ctl_bye(int fd);

#endif
