/*
 * Shows the whole C API in one place: two processes, each owning a region, exchange metadata
 * through a pipe; one writes blocks into the other, reads them back, and checks them.
 * Built with the project (build/examples/write_read), or alone:
 *   cc write_read.c $(pkg-config --cflags --libs kvx ucx) -o write_read
 */
#include <kvx.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NUM_BLOCKS 64
#define BLOCK_LEN 65536

static kvx_transport_t *open_transport(void *region, const char *name)
{
    kvx_params_t p = {
        .field_mask = KVX_PARAM_REGION | KVX_PARAM_AGENT_NAME,
        .base = region,
        .num_blocks = NUM_BLOCKS,
        .block_len = BLOCK_LEN,
        .agent_name = name,
    };
    kvx_transport_t *t;
    int rc = kvx_transport_create(&p, &t);

    if (rc < 0) {
        fprintf(stderr, "kvx_transport_create: %s\n", kvx_strerror(rc));
        exit(1);
    }
    return t;
}

/* Wait for one transfer's completion. */
static int wait_one(kvx_transport_t *t, const char *peer)
{
    kvx_completion_t c;
    while (kvx_transport_poll(t, peer, &c, 1) == 0)
        ;
    return c.status;
}

int main(void)
{
    int to_parent[2], to_child[2];
    char *region = aligned_alloc(4096, (size_t)NUM_BLOCKS * BLOCK_LEN);
    uint8_t md[4096];
    size_t md_len = sizeof(md);

    if (region == NULL || pipe(to_parent) < 0 || pipe(to_child) < 0)
        return 1;
    if (fork() == 0) {
        /* The target: export metadata, then do nothing. Its progress thread lets the other
         * process write into and read from its region. */
        kvx_transport_t *t = open_transport(region, "target");
        char done;
        if (kvx_transport_metadata(t, md, &md_len) < 0 ||
            write(to_parent[1], md, md_len) != (ssize_t)md_len || read(to_child[0], &done, 1) != 1)
            return 1;
        printf("target: block 7 starts with \"%.11s\"\n", region + 7 * BLOCK_LEN);
        kvx_transport_destroy(t);
        return 0;
    }

    kvx_transport_t *t = open_transport(region, "initiator");
    ssize_t n = read(to_parent[0], md, sizeof(md));
    uint32_t local[2] = {0, 1}, remote[2] = {7, 3}, back[2] = {10, 11};
    uint64_t id;
    int rc;

    memset(region, 0, (size_t)NUM_BLOCKS * BLOCK_LEN);
    strcpy(region, "hello block");
    strcpy(region + BLOCK_LEN, "second one");
    rc = kvx_peer_add(t, "target", md, (size_t)n, NULL);
    if (rc < 0) {
        fprintf(stderr, "kvx_peer_add: %s\n", kvx_strerror(rc));
        return 1;
    }
    /* local blocks 0, 1 -> remote blocks 7, 3 */
    kvx_xfer_write(t, "target", local, remote, 2, NULL, &id);
    printf("write %llu: %s\n", (unsigned long long)id, kvx_strerror(wait_one(t, "target")));
    /* remote blocks 7, 3 -> local blocks 10, 11 */
    kvx_xfer_read(t, "target", back, remote, 2, NULL, &id);
    printf("read %llu: %s\n", (unsigned long long)id, kvx_strerror(wait_one(t, "target")));
    printf("initiator: read back \"%s\" and \"%s\"\n", region + 10 * BLOCK_LEN,
           region + 11 * BLOCK_LEN);

    kvx_peer_attr_t attr = {.field_mask = KVX_PEER_ATTR_TRANSPORT | KVX_PEER_ATTR_COUNTERS};
    kvx_peer_query(t, "target", &attr);
    printf("peer travels on %s: %llu bytes written, %llu read\n", attr.transport,
           (unsigned long long)attr.bytes_written, (unsigned long long)attr.bytes_read);
    rc = strcmp(region + 10 * BLOCK_LEN, "hello block") == 0 &&
                 strcmp(region + 11 * BLOCK_LEN, "second one") == 0
             ? 0
             : 1;
    if (write(to_child[1], "x", 1) != 1)
        rc = 1;
    wait(NULL);
    kvx_transport_destroy(t);
    free(region);
    return rc;
}
