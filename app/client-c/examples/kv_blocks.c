/* kv_blocks: store fixed-size blocks (think KV-cache pages) in a few large Leasebox leases and read them back,
 * the way a KV-cache tier does: from memory registered once, without a copy, in asynchronous batches.
 *
 *   kv_blocks ADDR TENANT KEY_HEX [REQUESTER]
 *
 * ADDR is the appliance's control address (HOST:PORT). REQUESTER says how RDMA reaches it: `soft` (the software
 * RoCEv2 requester toward 127.0.0.1:4791), `soft:ADDR:PORT`, or `verbs:DEVICE:PORT:GID_INDEX` for an RDMA device
 * through libibverbs (e.g. `verbs:rxe0:1:1` on Soft-RoCE); without it, $LEASEBOX_REQUESTER, else `soft`.
 *
 * One lease costs the appliance a queue pair, so the program takes two large leases and keeps its own block
 * index (block -> lease, offset). It registers its block arrays, writes every block in one asynchronous batch
 * across both leases (the completion fd polled with poll(2)), reads them back zero-copy one by one and
 * scattered, then revokes one lease (as its own tenant) while a batch of reads runs on both: the revoked
 * lease's reads fail with LBX_ERR_REVOKED, the other's complete. Each step prints PASS or FAIL. Exit status: 0
 * when every step passed, 1 when one failed, 2 on a library error (lbx_last_error() is printed).
 *
 * Build (the test app/client-c/tests/kv_blocks.rs does this):
 *   cargo build -p leasebox-client-c
 *   gcc -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -I app/client-c \
 *       app/client-c/examples/kv_blocks.c target/debug/libleasebox_client_c.a -lpthread -ldl -lm -o kv_blocks
 * libibverbs is loaded at run time, only when a verbs requester is used: the program needs no -libverbs.
 */
#include "leasebox_client.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEASES 2
#define BLOCK_SIZE 4096
#define BLOCKS_PER_LEASE 48
#define BLOCKS (LEASES * BLOCKS_PER_LEASE)

/* Where a block lives. */
struct slot {
    int lease;
    uint64_t offset;
};

static int failed = 0;

static void step(int ok, const char *what) {
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    if (!ok) failed++;
}

static int fail(const char *what, int32_t status) {
    fprintf(stderr, "kv_blocks: %s: %s: %s\n", what, lbx_status_name(status), lbx_last_error());
    printf("FAIL %s\n", what);
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

/* Takes `n` completions into `out`, waiting on the completion fd as an event loop would. */
static int collect(lbx_client *client, lbx_completion *out, size_t n) {
    int fd = lbx_completion_fd(client);
    size_t got = 0;
    for (int idle = 0; got < n && idle < 300;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) != 1) {
            idle++;
            continue;
        }
        size_t k = 0;
        int32_t s = lbx_poll(client, out + got, n - got, &k);
        if (s != LBX_OK) return fail("poll", s);
        got += k;
    }
    return got == n ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: kv_blocks ADDR TENANT KEY_HEX [soft | soft:ADDR:PORT | verbs:DEVICE:PORT:GID_INDEX]\n");
        return 2;
    }
    const char *requester = argc == 5 ? argv[4] : getenv("LEASEBOX_REQUESTER");
    if (!requester) requester = "soft";
    printf("kv_blocks: appliance %s, requester %s\n", argv[1], requester);
    lbx_connect_options options = {requester, 0, 0};
    lbx_client *client = NULL;
    int32_t s = lbx_client_connect_with(argv[1], argv[2], argv[3], &options, &client);
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

    /* The program's own memory, registered once: the NIC reads and writes it in place. */
    static uint8_t blocks[BLOCKS][BLOCK_SIZE];
    static uint8_t got[BLOCKS][BLOCK_SIZE];
    for (int b = 0; b < BLOCKS; b++) fill(blocks[b], b);
    lbx_region *src = NULL, *dst = NULL;
    s = lbx_register(client, blocks, sizeof blocks, &src);
    if (s != LBX_OK) return fail("register", s);
    s = lbx_register(client, got, sizeof got, &dst);
    if (s != LBX_OK) return fail("register", s);

    /* Store: every block in one asynchronous batch across both leases. */
    static lbx_op ops[BLOCKS];
    static uint64_t tickets[BLOCKS];
    static lbx_completion done[BLOCKS];
    for (int b = 0; b < BLOCKS; b++) {
        ops[b] = (lbx_op){LBX_OP_WRITE, leases[index[b].lease], index[b].offset, src, (size_t)b * BLOCK_SIZE,
                          BLOCK_SIZE, NULL, 0};
    }
    s = lbx_submit(client, ops, BLOCKS, tickets);
    if (s != LBX_OK) return fail("submit", s);
    int r = collect(client, done, BLOCKS);
    if (r == 2) return 2;
    int ok = r == 0;
    for (int k = 0; ok && k < BLOCKS; k++) ok = done[k].status == LBX_OK && done[k].bytes == BLOCK_SIZE;
    step(ok, "async batch: 96 block writes across 2 leases, completions through the fd");

    /* Read back zero-copy: every block alone, then lease 0's blocks scattered from one read of 8 blocks. */
    int bad = 0;
    for (int b = 0; b < BLOCKS; b++) {
        s = lbx_read_into(leases[index[b].lease], dst, (size_t)b * BLOCK_SIZE, index[b].offset, BLOCK_SIZE);
        if (s != LBX_OK) return fail("read_into", s);
        if (memcmp(got[b], blocks[b], BLOCK_SIZE) != 0) bad++;
    }
    step(bad == 0, "zero-copy reads: every block read back identical");
    memset(got, 0, sizeof got);
    lbx_sge sge[8];
    for (int k = 0; k < 8; k++) sge[k] = (lbx_sge){dst, (size_t)(2 * k) * BLOCK_SIZE, BLOCK_SIZE};
    s = lbx_read_into_sg(leases[0], sge, 8, 0);
    if (s != LBX_OK) return fail("read_into_sg", s);
    bad = 0;
    for (int k = 0; k < 8; k++) bad += memcmp(got[2 * k], blocks[2 * k], BLOCK_SIZE) != 0;
    step(bad == 0, "scatter/gather: 8 blocks scattered from one read");
    step(lbx_bytes_copied(client) == 0, "zero copy: no byte went through a bounce buffer");

    /* Out of bounds is refused, not sent. */
    s = lbx_write_from(leases[0], src, 0, lbx_lease_size(leases[0]) - 1, 2);
    step(s == LBX_ERR_OUT_OF_RANGE, "a write past the lease's end is refused");

    /* A revoke while reads run on both leases: only the revoked lease's fail. */
    lbx_lease *doomed = leases[1];
    s = lbx_lease_set_queue_depth(doomed, 1);
    if (s != LBX_OK) return fail("set_queue_depth", s);
    for (int b = 0; b < BLOCKS; b++) ops[b].kind = LBX_OP_READ, ops[b].region = dst;
    s = lbx_submit(client, ops, BLOCKS, tickets);
    if (s != LBX_OK) return fail("submit", s);
    lbx_lease_ident id = lbx_lease_id(doomed);
    uint32_t outcome = 0;
    s = lbx_client_revoke_with(client, 0, &id, LBX_REVOKE_MKEY_FIRST, &outcome);
    if (s != LBX_OK) return fail("revoke", s);
    step(outcome == LBX_OUTCOME_TORN_DOWN, "revoke of lease 1 answered LBX_OUTCOME_TORN_DOWN");
    size_t n = 0;
    s = lbx_wait(client, 30000, done, BLOCKS, &n);
    if (s != LBX_OK) return fail("wait", s);
    int kept_ok = 1, doomed_ok = 1, revoked = 0;
    for (size_t k = 0; k < n; k++) {
        int b = 0;
        while (b < BLOCKS && tickets[b] != done[k].ticket) b++;
        if (b == BLOCKS) {
            kept_ok = 0;
        } else if (index[b].lease == 0) {
            kept_ok &= done[k].status == LBX_OK;
        } else if (done[k].status == LBX_ERR_REVOKED) {
            revoked++;
        } else {
            doomed_ok &= done[k].status == LBX_OK;
        }
    }
    printf("kv_blocks: %d of lease 1's %d reads failed LBX_ERR_REVOKED (the rest had landed)\n", revoked,
           BLOCKS_PER_LEASE);
    step(n == BLOCKS && kept_ok, "revoke: lease 0's 48 reads all completed");
    step(doomed_ok, "revoke: lease 1's reads each landed or failed LBX_ERR_REVOKED");
    lbx_event ev = {0};
    for (int k = 0; k < 50 && ev.kind != LBX_EVENT_REVOKED; k++) {
        s = lbx_client_next_event(client, 100, &ev);
        if (s != LBX_OK) return fail("next_event", s);
    }
    step(ev.kind == LBX_EVENT_REVOKED && ev.lease.slot == id.slot && ev.lease.generation == id.generation,
         "revoke: LBX_EVENT_REVOKED names lease 1");
    s = lbx_read_into(doomed, dst, 0, 0, BLOCK_SIZE);
    step(s == LBX_ERR_REVOKED, "revoke: lease 1's next read fails LBX_ERR_REVOKED");
    s = lbx_read_into(leases[0], dst, 0, 0, BLOCK_SIZE);
    step(s == LBX_OK && memcmp(got[0], blocks[0], BLOCK_SIZE) == 0, "revoke: lease 0 still carries its blocks");

    s = lbx_lease_free(leases[0]);
    if (s != LBX_OK) return fail("free", s);
    (void)lbx_lease_free(doomed); /* LBX_ERR_REVOKED: its memory was already taken back */
    s = lbx_region_free(src, 1000);
    if (s != LBX_OK) return fail("region_free", s);
    s = lbx_region_free(dst, 1000);
    if (s != LBX_OK) return fail("region_free", s);
    s = lbx_client_close(client);
    if (s != LBX_OK) return fail("close", s);
    if (failed) {
        printf("kv_blocks: FAIL (%d steps failed)\n", failed);
        return 1;
    }
    printf("kv_blocks: stored %d blocks of %d bytes in %d leases and read them back identical\n", BLOCKS, BLOCK_SIZE,
           LEASES);
    printf("kv_blocks: PASS\n");
    return 0;
}
