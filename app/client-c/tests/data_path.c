/* data_path: the C ABI's data path, one scenario per run (tests/data_path.rs compiles this against the header
 * and the staticlib, starts hosted appliances and runs each scenario).
 *
 *   data_path zero_copy ADDR TENANT KEY_HEX REQUESTER
 *   data_path batch     ADDR TENANT KEY_HEX REQUESTER
 *   data_path revoke    ADDR TENANT KEY_HEX REQUESTER ADMIN_KEY_HEX mkey|qp
 *   data_path busy      ADDR TENANT KEY_HEX MUTE_PEER
 *   data_path verbs     ADDR TENANT KEY_HEX verbs:DEVICE:PORT:GID_INDEX   (a device this host lacks)
 *
 * Every check prints "PASS what" or "FAIL what: why"; the exit status is 0 when all passed, 1 when one failed,
 * 2 on a usage error. */
#include "leasebox_client.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024u * 1024u)

static int failures = 0;

static void check(int ok, const char *what, const char *why) {
    if (ok) {
        printf("PASS %s\n", what);
    } else {
        printf("FAIL %s: %s\n", what, why ? why : "");
        failures++;
    }
}

/* A call that must succeed; on failure the status and message are printed and the scenario ends. */
#define MUST(call)                                                                                          \
    do {                                                                                                    \
        int32_t s_ = (call);                                                                                \
        if (s_ != LBX_OK) {                                                                                 \
            printf("FAIL %s: %s: %s\n", #call, lbx_status_name(s_), lbx_last_error());                      \
            return 1;                                                                                       \
        }                                                                                                   \
    } while (0)

static void pattern(uint8_t *p, size_t n, uint32_t seed) {
    uint32_t x = 0x9e3779b9u * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)(x | 1);
    }
}

static lbx_client *open_client(const char *addr, const char *name, const char *key, const char *requester,
                           uint32_t timeout_ms) {
    lbx_connect_options o = {requester, timeout_ms, 0};
    lbx_client *c = NULL;
    int32_t s = lbx_client_connect_with(addr, name, key, &o, &c);
    if (s != LBX_OK) printf("FAIL connect %s as %s: %s: %s\n", addr, name, lbx_status_name(s), lbx_last_error());
    return c;
}

/* Whether the completion fd polls readable within `ms`. */
static int readable(int fd, int ms) {
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* Register a buffer; zero copy both ways, gathered and scattered; nothing copied; the copying calls counted. */
static int zero_copy(lbx_client *c) {
    lbx_lease *l = NULL;
    MUST(lbx_alloc(c, 4 * MIB, 0, &l));
    size_t len = MIB + 100;
    uint8_t *src = malloc(len + 300), *dst = calloc(1, len + 50);
    pattern(src, len + 300, 7);
    lbx_region *from = NULL, *into = NULL;
    MUST(lbx_register(c, src, len + 300, &from));
    MUST(lbx_register(c, dst, len + 50, &into));
    check(lbx_region_len(from) == len + 300, "lbx_region_len", NULL);
    MUST(lbx_write_from(l, from, 300, 4096, len));
    MUST(lbx_read_into(l, into, 50, 4096, len));
    check(memcmp(dst + 50, src + 300, len) == 0, "zero-copy round trip of 1 MiB + 100 bytes", "bytes differ");
    check(dst[0] == 0 && dst[49] == 0, "bytes before the region offset untouched", NULL);
    check(lbx_bytes_copied(c) == 0, "zero copy: lbx_bytes_copied stays 0", NULL);

    /* Scatter/gather: three pieces of src gathered into one write, scattered back in another order. */
    size_t max = lbx_lease_max_sge(l);
    check(max >= 3, "lbx_lease_max_sge >= 3", NULL);
    lbx_sge g[3] = {{from, 0, 100}, {from, 1000, 200}, {from, 5000, 300}};
    MUST(lbx_write_from_sg(l, g, 3, 2 * MIB));
    memset(dst, 0, len + 50);
    lbx_sge sc[2] = {{into, 600, 300}, {into, 0, 300}};
    MUST(lbx_read_into_sg(l, sc, 2, 2 * MIB));
    int sg_ok = memcmp(dst + 600, src, 100) == 0 && memcmp(dst + 700, src + 1000, 200) == 0 &&
                memcmp(dst, src + 5000, 300) == 0;
    check(sg_ok, "scatter/gather in order", "bytes differ");
    /* Too many pieces, a range outside the region, outside the lease: refused, nothing sent. */
    lbx_sge *many = calloc(max + 1, sizeof *many);
    for (size_t i = 0; i <= max; i++) many[i] = (lbx_sge){from, i, 1};
    int32_t s = lbx_write_from_sg(l, many, max + 1, 0);
    check(s == LBX_ERR_INVALID_ARGUMENT, "more pieces than max_sge refused", lbx_status_name(s));
    s = lbx_write_from(l, from, len, 0, 301);
    check(s == LBX_ERR_INVALID_ARGUMENT, "a range outside the region refused", lbx_status_name(s));
    s = lbx_read_into(l, into, 0, lbx_lease_size(l) - 10, 20);
    check(s == LBX_ERR_OUT_OF_RANGE, "a range outside the lease refused", lbx_status_name(s));
    check(lbx_bytes_copied(c) == 0, "still nothing copied", NULL);

    /* The copying calls stay, and are counted. */
    uint8_t back[64];
    MUST(lbx_lease_write(l, 0, src, 64));
    MUST(lbx_lease_read(l, 0, back, 64));
    check(memcmp(back, src, 64) == 0 && lbx_bytes_copied(c) == 128, "copying calls counted: 128 bytes", NULL);

    MUST(lbx_region_free(from, 1000));
    MUST(lbx_region_free(into, 1000));
    s = lbx_register(c, NULL, 10, &from);
    check(s == LBX_ERR_INVALID_ARGUMENT && from == NULL, "a NULL address is refused", lbx_status_name(s));
    MUST(lbx_lease_free(l));
    free(many);
    free(src);
    free(dst);
    return 0;
}

/* A 64-deep asynchronous batch across two leases, both ways, the completion fd polled with poll(2). */
static int batch(lbx_client *c) {
    enum { N = 64, BLOCK = 16 << 10 };
    lbx_lease *l[2] = {NULL, NULL};
    MUST(lbx_alloc(c, 2 * MIB, 0, &l[0]));
    MUST(lbx_alloc(c, 2 * MIB, 0, &l[1]));
    check(lbx_lease_queue_depth(l[0]) == 64, "default queue depth 64", NULL);
    uint8_t *src = malloc(N * BLOCK), *dst = calloc(N, BLOCK);
    pattern(src, N * BLOCK, 41);
    lbx_region *rs = NULL, *rd = NULL;
    MUST(lbx_register(c, src, N * BLOCK, &rs));
    MUST(lbx_register(c, dst, N * BLOCK, &rd));
    int fd = lbx_completion_fd(c);
    check(fd >= 0 && !readable(fd, 0), "completion fd quiet before anything was submitted", NULL);

    lbx_op ops[N];
    uint64_t t[N];
    for (int i = 0; i < N; i++)
        ops[i] = (lbx_op){LBX_OP_WRITE, l[i % 2], (uint64_t)(i / 2) * BLOCK, rs, (size_t)i * BLOCK, BLOCK, NULL, 0};
    MUST(lbx_submit(c, ops, N, t));
    check(lbx_pending(c) <= N, "lbx_pending counts the batch", NULL);
    check(readable(fd, 10000), "completion fd readable once writes complete", NULL);
    /* Poll as an event loop would: poll(2) on the fd, then lbx_poll. */
    lbx_completion done[N];
    size_t got = 0;
    for (int spins = 0; got < N && spins < 2000; spins++) {
        if (!readable(fd, 100)) continue;
        size_t n = 0;
        MUST(lbx_poll(c, done + got, N - got, &n));
        got += n;
    }
    check(got == N, "64 write completions taken through the fd", NULL);
    int ok = 1;
    for (size_t i = 0; i < got; i++) ok &= done[i].status == LBX_OK && done[i].bytes == BLOCK;
    check(ok, "every write completed with its bytes", NULL);
    check(!readable(fd, 0) && lbx_pending(c) == 0, "fd quiet and nothing pending once all are taken", NULL);

    for (int i = 0; i < N; i++) ops[i].kind = LBX_OP_READ, ops[i].region = rd;
    MUST(lbx_submit(c, ops, N, t));
    lbx_completion one;
    MUST(lbx_wait_ticket(c, t[5], 10000, &one));
    check(one.ticket == t[5] && one.status == LBX_OK && one.bytes == BLOCK, "lbx_wait_ticket takes one", NULL);
    size_t n = 0;
    MUST(lbx_wait(c, 20000, done, N, &n));
    check(n == N - 1, "lbx_wait takes the other 63", NULL);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= done[i].status == LBX_OK && done[i].ticket != t[5];
    check(ok, "every read completed", NULL);
    int32_t s = lbx_wait_ticket(c, t[5], 0, &one);
    check(s == LBX_ERR_INVALID_ARGUMENT, "a ticket taken already is refused", lbx_status_name(s));
    check(memcmp(src, dst, N * BLOCK) == 0, "64 blocks through two leases came back identical", NULL);
    check(lbx_bytes_copied(c) == 0, "the batch copied nothing", NULL);

    /* A bad range is that operation's own result; the other completes. */
    lbx_op two[2] = {{LBX_OP_WRITE, l[0], 2 * MIB - 10, rs, 0, 20, NULL, 0}, {LBX_OP_WRITE, l[1], 0, rs, 0, 8, NULL, 0}};
    MUST(lbx_submit(c, two, 2, t));
    MUST(lbx_wait(c, 10000, done, 2, &n));
    int by = done[0].ticket == t[0] ? 0 : 1;
    check(n == 2 && done[by].status == LBX_ERR_OUT_OF_RANGE && done[1 - by].status == LBX_OK,
          "a range outside the lease fails alone", lbx_last_error());
    /* A NULL lease fails the whole call, nothing submitted. */
    two[0].lease = NULL;
    s = lbx_submit(c, two, 2, t);
    check(s == LBX_ERR_INVALID_ARGUMENT && lbx_pending(c) == 0, "an op without a lease refuses the call", NULL);

    MUST(lbx_region_free(rs, 1000));
    MUST(lbx_region_free(rd, 1000));
    MUST(lbx_lease_free(l[0]));
    MUST(lbx_lease_free(l[1]));
    free(src);
    free(dst);
    return 0;
}

/* A batch over two leases; the admin revokes the first (in `order`) while its writes are in flight: they fail
 * with LBX_ERR_REVOKED and the outcome, the other lease's all complete, and the event comes once. */
static int revoke(lbx_client *c, lbx_client *admin, int32_t order) {
    enum { PAIRS = 32 };
    lbx_lease *doomed = NULL, *kept = NULL;
    MUST(lbx_alloc(c, 32 * MIB, 0, &doomed));
    MUST(lbx_alloc(c, 2 * MIB, 0, &kept));
    /* One write at a time on the doomed lease, so most of its batch is still to come when the revoke lands. */
    MUST(lbx_lease_set_queue_depth(doomed, 1));
    uint8_t *src = malloc(MIB);
    pattern(src, MIB, 51);
    lbx_region *r = NULL;
    MUST(lbx_register(c, src, MIB, &r));
    lbx_op ops[2 * PAIRS];
    uint64_t t[2 * PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        ops[2 * i] = (lbx_op){LBX_OP_WRITE, doomed, (uint64_t)i * MIB, r, 0, MIB, NULL, 0};
        ops[2 * i + 1] = (lbx_op){LBX_OP_WRITE, kept, (uint64_t)i * 4096, r, (size_t)i * 4096, 4096, NULL, 0};
    }
    MUST(lbx_submit(c, ops, 2 * PAIRS, t));
    lbx_completion first;
    MUST(lbx_wait_ticket(c, t[0], 20000, &first));
    check(first.status == LBX_OK && first.bytes == MIB, "the doomed lease's first write landed", NULL);

    lbx_lease_ident id = lbx_lease_id(doomed);
    uint32_t outcome = 99;
    MUST(lbx_client_revoke_with(admin, 0, &id, order, &outcome));
    check(outcome == LBX_OUTCOME_TORN_DOWN, "REVOKE answered LBX_OUTCOME_TORN_DOWN", NULL);

    lbx_completion done[2 * PAIRS];
    size_t n = 0;
    MUST(lbx_wait(c, 30000, done, 2 * PAIRS, &n));
    check(n == 2 * PAIRS - 1, "every other operation completed or failed", NULL);
    int revoked = 0, landed = 0, wrong = 0;
    for (size_t k = 0; k < n; k++) {
        int i = -1;
        for (int j = 0; j < 2 * PAIRS; j++)
            if (t[j] == done[k].ticket) i = j;
        if (i % 2 == 1) {
            if (done[k].status != LBX_OK || done[k].bytes != 4096) {
                printf("  kept lease op %d: %s\n", i, lbx_status_name(done[k].status));
                wrong++;
            }
        } else if (done[k].status == LBX_OK && done[k].bytes == MIB) {
            landed++;
        } else if (done[k].status == LBX_ERR_REVOKED &&
                   (done[k].outcome == LBX_OUTCOME_TORN_DOWN || done[k].outcome == LBX_OUTCOME_NOT_FOUND)) {
            revoked++;
        } else {
            printf("  doomed lease op %d: %s outcome %u\n", i, lbx_status_name(done[k].status), done[k].outcome);
            wrong++;
        }
    }
    printf("  %d of the doomed lease's %d later writes failed LBX_ERR_REVOKED, %d had landed\n", revoked,
           PAIRS - 1, landed);
    check(wrong == 0, "only the revoked lease's operations failed, each with LBX_ERR_REVOKED", NULL);
    check(revoked >= 20, "most of the doomed lease's writes were revoked", NULL);

    /* The event comes, once; later operations on the doomed lease fail at once, the kept one works on. */
    lbx_event ev;
    int events = 0;
    for (int k = 0; k < 20; k++) {
        MUST(lbx_client_next_event(c, 50, &ev));
        if (ev.kind == LBX_EVENT_REVOKED) {
            events++;
            check(memcmp(&ev.lease, &id, sizeof id) == 0, "the event names the revoked lease", NULL);
        }
    }
    check(events == 1, "LBX_EVENT_REVOKED came once", NULL);
    lbx_op after[2] = {{LBX_OP_WRITE, doomed, 0, r, 0, 8, NULL, 0}, {LBX_OP_WRITE, kept, 0, r, 0, 8, NULL, 0}};
    MUST(lbx_submit(c, after, 2, t));
    MUST(lbx_wait(c, 10000, done, 2, &n));
    int d = done[0].ticket == t[0] ? 0 : 1;
    check(n == 2 && done[d].status == LBX_ERR_REVOKED && done[1 - d].status == LBX_OK,
          "afterwards the revoked lease refuses, the other works", NULL);
    int32_t s = lbx_write_from(doomed, r, 0, 0, 8);
    check(s == LBX_ERR_REVOKED, "a blocking call on the revoked lease: LBX_ERR_REVOKED", lbx_status_name(s));

    MUST(lbx_region_free(r, 1000));
    s = lbx_lease_free(doomed);
    check(s == LBX_ERR_REVOKED, "freeing the revoked lease says so", lbx_status_name(s));
    MUST(lbx_lease_free(kept));
    free(src);
    return 0;
}

/* A region a transfer holds is not freed: its READ goes to a peer that never answers. */
static int busy(lbx_client *c) {
    lbx_lease *l = NULL;
    MUST(lbx_alloc(c, MIB, 0, &l));
    uint8_t *buf = calloc(1, 4096);
    lbx_region *r = NULL;
    MUST(lbx_register(c, buf, 4096, &r));
    lbx_op op = {LBX_OP_READ, l, 0, r, 0, 4096, NULL, 0};
    uint64_t t;
    MUST(lbx_submit(c, &op, 1, &t));
    check(lbx_region_in_use(r) == 1, "a submitted READ holds the region", NULL);
    int32_t s = lbx_region_free(r, 0);
    check(s == LBX_ERR_BUSY, "lbx_region_free refuses a region in use", lbx_status_name(s));
    s = lbx_region_free(r, 50);
    check(s == LBX_ERR_BUSY, "and still after waiting 50 ms", lbx_status_name(s));
    check(lbx_region_len(r) == 4096, "the refused handle stays valid", NULL);
    lbx_completion done;
    size_t n = 0;
    MUST(lbx_wait(c, 20000, &done, 1, &n));
    check(n == 1 && done.status != LBX_OK, "the READ to a mute peer fails", lbx_status_name(done.status));
    printf("  its status: %s (%s)\n", lbx_status_name(done.status), lbx_last_error());
    MUST(lbx_region_free(r, 1000));
    free(buf);
    (void)lbx_lease_free(l);
    return 0;
}

/* A verbs requester where it cannot work (no such device, or no libibverbs): the client connects (the device is
 * opened with the first lease), and lbx_alloc fails with LBX_ERR_RDMA and says why. */
static int verbs(lbx_client *c) {
    lbx_lease *l = NULL;
    int32_t s = lbx_alloc(c, MIB, 0, &l);
    check(s == LBX_ERR_RDMA && l == NULL, "lbx_alloc on a verbs requester that cannot open fails LBX_ERR_RDMA",
          lbx_status_name(s));
    printf("  alloc: %s: %s\n", lbx_status_name(s), lbx_last_error());
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: data_path zero_copy|batch|revoke|busy|verbs ADDR TENANT KEY_HEX REQUESTER [...]\n");
        return 2;
    }
    const char *what = argv[1];
    lbx_client *c = open_client(argv[2], argv[3], argv[4], argv[5], 0);
    if (!c) return 1;
    int r = 2;
    if (strcmp(what, "zero_copy") == 0) {
        r = zero_copy(c);
    } else if (strcmp(what, "batch") == 0) {
        r = batch(c);
    } else if (strcmp(what, "verbs") == 0) {
        r = verbs(c);
    } else if (strcmp(what, "busy") == 0) {
        r = busy(c);
    } else if (strcmp(what, "revoke") == 0 && argc == 8) {
        lbx_client *admin = open_client(argv[2], "admin", argv[6], argv[5], 0);
        if (!admin) return 1;
        r = revoke(c, admin, strcmp(argv[7], "qp") == 0 ? LBX_REVOKE_QP_FIRST : LBX_REVOKE_MKEY_FIRST);
        lbx_client_close(admin);
    } else {
        fprintf(stderr, "data_path: unknown scenario or arguments\n");
    }
    lbx_client_close(c);
    if (r != 0) return r;
    printf("%s: %s\n", what, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
