/* kv_blocks: store fixed-size blocks (think KV-cache pages) in a few large Leasebox leases and read them back.
 *
 *   kv_blocks ADDR TENANT KEY_HEX [RDMA_PEER]
 *
 * One lease costs the appliance a queue pair, so the program takes two large leases and keeps its own block
 * index (block -> lease, offset). It writes every block in batches, reads them back one by one and in a batch,
 * compares, frees and closes. Exit status: 0 when every block read back identical, 1 on a mismatch, 2 on a
 * library error (the message of lbx_last_error() is printed).
 *
 * Build (the test app/client-c/tests/kv_blocks.rs does this):
 *   cargo build -p leasebox-client-c
 *   gcc -Wall -Wextra -Werror -I app/client-c app/client-c/examples/kv_blocks.c \
 *       target/debug/libleasebox_client_c.a -lpthread -ldl -lm -o kv_blocks
 */
#include "leasebox_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEASES 2
#define BLOCK_SIZE 4096
#define BLOCKS_PER_LEASE 48
#define BLOCKS (LEASES * BLOCKS_PER_LEASE)
#define BATCH 16

/* Where a block lives. */
struct slot {
    int lease;
    uint64_t offset;
};

static int fail(const char *what, int32_t status) {
    fprintf(stderr, "kv_blocks: %s: %s: %s\n", what, lbx_status_name(status), lbx_last_error());
    return 2;
}

/* The content of block `b`: a pattern no other block shares. */
static void fill(uint8_t *buf, int b) {
    uint32_t x = 0x9e3779b9u * (uint32_t)(b + 1);
    for (size_t i = 0; i < BLOCK_SIZE; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (uint8_t)x;
    }
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: kv_blocks ADDR TENANT KEY_HEX [RDMA_PEER]\n");
        return 2;
    }
    lbx_client *client = NULL;
    int32_t s = lbx_client_connect(argv[1], argv[2], argv[3], argc == 5 ? argv[4] : NULL, 0, &client);
    if (s != LBX_OK) return fail("connect", s);

    lbx_lease *leases[LEASES] = {0};
    for (int i = 0; i < LEASES; i++) {
        s = lbx_alloc(client, (uint64_t)BLOCK_SIZE * BLOCKS_PER_LEASE, 0, &leases[i]);
        if (s != LBX_OK) return fail("alloc", s);
        lbx_lease_ident id = lbx_lease_id(leases[i]);
        printf("lease %d: id %u.%u, %llu bytes\n", i, id.slot, id.generation,
               (unsigned long long)lbx_lease_size(leases[i]));
    }

    /* The block index: blocks striped over the leases. */
    static struct slot index[BLOCKS];
    for (int b = 0; b < BLOCKS; b++) {
        index[b].lease = b % LEASES;
        index[b].offset = (uint64_t)(b / LEASES) * BLOCK_SIZE;
    }

    /* Store: one batched write per lease per BATCH blocks. */
    static uint8_t blocks[BLOCKS][BLOCK_SIZE];
    for (int b = 0; b < BLOCKS; b++) fill(blocks[b], b);
    for (int l = 0; l < LEASES; l++) {
        lbx_iov iov[BATCH];
        size_t n = 0;
        for (int b = l; b < BLOCKS; b += LEASES) {
            iov[n].offset = index[b].offset;
            iov[n].buf = blocks[b];
            iov[n].len = BLOCK_SIZE;
            if (++n == BATCH || b + LEASES >= BLOCKS) {
                s = lbx_lease_write_batch(leases[l], iov, n);
                if (s != LBX_OK) return fail("write_batch", s);
                n = 0;
            }
        }
    }

    /* Read back: every block alone, then all of lease 0's blocks in one batch. */
    int bad = 0;
    static uint8_t got[BLOCKS][BLOCK_SIZE];
    memset(got, 0, sizeof got);
    for (int b = 0; b < BLOCKS; b++) {
        s = lbx_lease_read(leases[index[b].lease], index[b].offset, got[b], BLOCK_SIZE);
        if (s != LBX_OK) return fail("read", s);
        if (memcmp(got[b], blocks[b], BLOCK_SIZE) != 0) {
            fprintf(stderr, "kv_blocks: block %d differs after read\n", b);
            bad++;
        }
    }
    memset(got, 0, sizeof got);
    lbx_iov iov[BLOCKS_PER_LEASE];
    for (int k = 0; k < BLOCKS_PER_LEASE; k++) {
        int b = k * LEASES;
        iov[k].offset = index[b].offset;
        iov[k].buf = got[b];
        iov[k].len = BLOCK_SIZE;
    }
    s = lbx_lease_read_batch(leases[0], iov, BLOCKS_PER_LEASE);
    if (s != LBX_OK) return fail("read_batch", s);
    for (int k = 0; k < BLOCKS_PER_LEASE; k++) {
        int b = k * LEASES;
        if (memcmp(got[b], blocks[b], BLOCK_SIZE) != 0) {
            fprintf(stderr, "kv_blocks: block %d differs after read_batch\n", b);
            bad++;
        }
    }

    /* Out of bounds is refused, not sent. */
    s = lbx_lease_write(leases[0], lbx_lease_size(leases[0]) - 1, blocks[0], 2);
    if (s != LBX_ERR_OUT_OF_RANGE) {
        fprintf(stderr, "kv_blocks: a write past the lease's end answered %s\n", lbx_status_name(s));
        bad++;
    }

    for (int i = 0; i < LEASES; i++) {
        s = lbx_lease_free(leases[i]);
        if (s != LBX_OK) return fail("free", s);
    }
    s = lbx_client_close(client);
    if (s != LBX_OK) return fail("close", s);
    if (bad) {
        fprintf(stderr, "kv_blocks: %d mismatches\n", bad);
        return 1;
    }
    printf("kv_blocks: stored %d blocks of %d bytes in %d leases and read them back identical\n", BLOCKS, BLOCK_SIZE,
           LEASES);
    return 0;
}
