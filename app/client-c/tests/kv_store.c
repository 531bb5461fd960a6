/* kv_store: the key-value store's C ABI (lbx_store_*) against one hosted appliance (tests/kv_store.rs compiles
 * this against the header and the staticlib and runs it).
 *
 *   kv_store URL KEY_FILE
 *
 * Every check prints "PASS what" or "FAIL what: why"; the exit status is 0 when all passed, 1 when one failed,
 * 2 on a usage error. */
#include "leasebox_client.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIB 1024u

static int failures = 0;

static void check(int ok, const char *what) {
    if (ok) {
        printf("PASS %s\n", what);
    } else {
        printf("FAIL %s: %s\n", what, lbx_last_error());
        failures++;
    }
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 31u + seed * 7u) % 251u + 1u);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: kv_store URL KEY_FILE\n");
        return 2;
    }
    struct lbx_store *bad = NULL;
    check(lbx_store_open("redis://x", argv[2], 0, 0, 0, -1, 0, &bad) == LBX_ERR_INVALID_ARGUMENT && bad == NULL,
          "a bad URL is refused with a message");
    check(strstr(lbx_last_error(), "unknown scheme") != NULL, "the message names what is wrong");

    struct lbx_store *s = NULL;
    int32_t st = lbx_store_open(argv[1], argv[2], 64 * KIB, 2 * KIB * KIB, 1, 0, 0, &s);
    check(st == LBX_OK && s != NULL, "lbx_store_open");
    if (st != LBX_OK) return 1;

    /* Copying calls. */
    char out[64];
    check(lbx_store_put(s, (const uint8_t *)"alpha", 5, (const uint8_t *)"hello", 5) == LBX_KV_OK, "put");
    check(lbx_store_get(s, (const uint8_t *)"alpha", 5, (uint8_t *)out, sizeof out) == 5 && memcmp(out, "hello", 5) == 0,
          "get gives the value back");
    check(lbx_store_get(s, (const uint8_t *)"alpha", 5, (uint8_t *)out, 2) == LBX_KV_TOO_LARGE, "get into 2 bytes: TOO_LARGE");
    check(lbx_store_get(s, (const uint8_t *)"nothing", 7, (uint8_t *)out, sizeof out) == LBX_KV_NOT_FOUND, "a miss: NOT_FOUND");
    check(lbx_store_get(NULL, (const uint8_t *)"alpha", 5, (uint8_t *)out, sizeof out) == LBX_KV_FAILED, "a NULL store is refused per item");

    /* Zero copy, one result per item. */
    size_t len = 512 * KIB;
    unsigned char *mem = malloc(len);
    fill(mem, 3 * 16 * KIB, 5);
    struct lbx_region *r = NULL;
    check(lbx_store_register(s, mem, len, &r) == LBX_OK, "lbx_store_register");
    struct lbx_kv_item puts[3] = {
        {(const uint8_t *)"k0", 2, r, 0, 16 * KIB},
        {(const uint8_t *)"big", 3, r, 0, 64 * KIB + 1},
        {(const uint8_t *)"k2", 2, r, 32 * KIB, 16 * KIB},
    };
    int64_t res[3] = {99, 99, 99};
    check(lbx_store_batch_put_from(s, puts, 3, res) == LBX_OK && res[0] == LBX_KV_OK && res[1] == LBX_KV_TOO_LARGE &&
              res[2] == LBX_KV_OK,
          "a mixed put batch: OK, TOO_LARGE, OK");
    struct lbx_kv_item gets[3] = {
        {(const uint8_t *)"k0", 2, r, 128 * KIB, 16 * KIB},
        {(const uint8_t *)"big", 3, r, 160 * KIB, 64 * KIB},
        {(const uint8_t *)"k2", 2, r, 192 * KIB, 16 * KIB},
    };
    check(lbx_store_batch_get_into(s, gets, 3, res) == LBX_OK && res[0] == 16 * KIB && res[1] == LBX_KV_NOT_FOUND &&
              res[2] == 16 * KIB,
          "a mixed get batch: 16 KiB, NOT_FOUND, 16 KiB");
    check(memcmp(mem + 128 * KIB, mem, 16 * KIB) == 0 && memcmp(mem + 192 * KIB, mem + 32 * KIB, 16 * KIB) == 0,
          "zero-copy values came back identical");

    /* Asynchronous: submit, the fd, poll, wait. */
    uint64_t ticket = 0;
    gets[1] = gets[0];
    gets[1].offset = 256 * KIB;
    check(lbx_store_submit_batch_get_into(s, gets, 3, &ticket) == LBX_OK && ticket != 0, "submit a get batch");
    struct pollfd pfd = {lbx_store_fileno(s), POLLIN, 0};
    uint64_t done[4];
    size_t n = 0;
    for (int i = 0; i < 100 && n == 0; i++) {
        poll(&pfd, 1, 100);
        check(lbx_store_poll(s, done, 4, &n) == LBX_OK, i == 0 ? "lbx_store_poll" : "lbx_store_poll again");
    }
    check(n == 1 && done[0] == ticket, "the batch comes back through the fd and poll");
    check(lbx_store_wait(s, ticket, 1000, res, 3) == LBX_OK && res[0] == 16 * KIB && res[1] == 16 * KIB &&
              res[2] == 16 * KIB,
          "its results");
    check(lbx_store_wait(s, ticket, 10, res, 3) == LBX_ERR_INVALID_ARGUMENT, "taken results are gone");

    /* Existence, removal, figures. */
    check(lbx_store_is_exist(s, (const uint8_t *)"k0", 2) == 1 && lbx_store_is_exist(s, (const uint8_t *)"big", 3) == 0,
          "is_exist");
    check(lbx_store_remove(s, (const uint8_t *)"k0", 2) == LBX_KV_OK &&
              lbx_store_remove(s, (const uint8_t *)"k0", 2) == LBX_KV_NOT_FOUND,
          "remove, then NOT_FOUND");
    struct lbx_kv_stats stats;
    check(lbx_store_stats(s, &stats) == LBX_OK && stats.puts == 3 && stats.keys == 2 && stats.removes == 1,
          "stats: 3 puts, 2 keys, 1 remove");
    char small[8];
    size_t needed = 0;
    check(lbx_store_stats_prometheus(s, small, sizeof small, &needed) == LBX_ERR_INVALID_ARGUMENT && needed > 100 &&
              small[0] == 0,
          "Prometheus text into too small a buffer: refused, the size needed given");
    char *text = malloc(needed);
    check(lbx_store_stats_prometheus(s, text, needed, NULL) == LBX_OK && strstr(text, "leasebox_kv_puts_total 3\n") &&
              strlen(text) + 1 == needed,
          "Prometheus text into the caller's buffer");
    free(text);

    check(lbx_region_free(r, 1000) == LBX_OK, "lbx_region_free");
    check(lbx_store_close(s) == LBX_OK, "lbx_store_close");
    free(mem);
    printf("kv_store: %s\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
