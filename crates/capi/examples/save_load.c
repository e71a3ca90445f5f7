/*
 * save_load.c: save KV blocks to emulated NVMe drives through tutti's C API
 * and load them back.
 *
 * Creates the built-in emulated runtime (4 drives x 256 MiB, 1 MiB slots),
 * registers one host buffer, opens BLOCKS targets tutti://kv/0.., writes a
 * known pattern to each, reads everything back into the poisoned buffer and
 * checks every byte. Then shows the error handling: a forged handle and a
 * request on a closed target. Exits non-zero on any failure.
 *
 * Build (docs/c-api.md):
 *   cargo build --release -p tutti-capi
 *   cc -std=c11 -Icrates/capi/include crates/capi/examples/save_load.c \
 *      target/release/libtutti_c.a -lpthread -ldl -lm -o save_load
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tutti.h"

#define BLOCKS 8

/* Prints what failed with the status name and the last error message. */
static int fail(const char *what, tutti_status st) {
    char msg[1024];
    size_t len = 0;
    /* A longer message is cut to fit (BUFFER_TOO_SMALL): fine for a print. */
    tutti_last_error_message(msg, sizeof msg, &len);
    fprintf(stderr, "save_load: %s failed: %s: %s\n", what, tutti_status_name(st), msg);
    return 1;
}

#define CHECK(call)                                   \
    do {                                              \
        tutti_status st_ = (call);                    \
        if (st_ != TUTTI_STATUS_OK) return fail(#call, st_); \
    } while (0)

/* Byte i of block b. */
static uint8_t pattern(size_t b, size_t i) {
    return (uint8_t)((b + 1) * 131 + i * 7 + (i >> 12));
}

/* One request per block, block b at byte b * slot of the buffer. Submits,
 * waits, and checks that every request succeeded. */
static int run_batch(const tutti_runtime *rt, tutti_direction dir, const uint64_t *targets,
                     uint64_t mem, uint64_t slot) {
    tutti_request reqs[BLOCKS];
    tutti_request_status st[BLOCKS];
    for (size_t b = 0; b < BLOCKS; b++) {
        reqs[b] = (tutti_request){.direction = dir, .target = targets[b], .offset = 0,
                                  .len = slot, .memory = mem, .memory_offset = b * slot};
    }
    uint64_t op = 0;
    CHECK(tutti_submit(rt, reqs, BLOCKS, st, &op));
    for (size_t b = 0; b < BLOCKS; b++) {
        if (st[b].kind != TUTTI_OUTCOME_PENDING) {
            fprintf(stderr, "save_load: request %zu not accepted: %s\n", b, st[b].message);
            return 1;
        }
    }
    size_t n = 0;
    CHECK(tutti_wait(rt, op, 10000, st, BLOCKS, &n));
    for (size_t b = 0; b < n; b++) {
        if (st[b].kind != TUTTI_OUTCOME_SUCCESS) {
            fprintf(stderr, "save_load: request %zu: outcome %u (SCT %u SC 0x%02x DNR %d): %s\n", b,
                    (unsigned)st[b].kind, st[b].sct, st[b].sc, st[b].dnr, st[b].message);
            return 1;
        }
    }
    return n == BLOCKS ? 0 : 1;
}

/* The error handling a caller sees: statuses, messages, per-request outcomes. */
static int show_errors(const tutti_runtime *rt, uint64_t target, uint64_t mem, uint64_t slot) {
    char msg[512];
    size_t len = 0;
    uint64_t bytes = 0;
    /* A handle naming a slot this runtime never minted (bits 47..24). */
    uint64_t forged = target + ((uint64_t)1000 << 24);
    tutti_status st = tutti_target_len(rt, forged, &bytes);
    tutti_last_error_message(msg, sizeof msg, &len);
    printf("forged handle: %s: %s\n", tutti_status_name(st), msg);
    if (st != TUTTI_STATUS_HANDLE) return 1;

    /* A closed target: the request is refused on its own, nothing is sent. */
    CHECK(tutti_close(rt, target));
    tutti_request req = {.direction = TUTTI_DIRECTION_READ, .target = target, .offset = 0,
                         .len = slot, .memory = mem, .memory_offset = 0};
    tutti_request_status rs;
    uint64_t op = 1;
    CHECK(tutti_submit(rt, &req, 1, &rs, &op));
    printf("closed target: outcome %s, op %" PRIu64 ": %s\n",
           rs.kind == TUTTI_OUTCOME_NOT_ACCEPTED ? "NOT_ACCEPTED" : "?", op, rs.message);
    return rs.kind == TUTTI_OUTCOME_NOT_ACCEPTED && op == 0 ? 0 : 1;
}

static int run(tutti_runtime *rt) {
    tutti_store_info info;
    CHECK(tutti_store_info_get(rt, "kv", &info));
    printf("store kv: %" PRIu64 " bytes on %u drives, %u-byte blocks, %" PRIu64 " slots of %" PRIu64
           " bytes\n", info.capacity, info.drive_count, info.block_size, info.slots, info.slot_size);
    uint64_t slot = info.slot_size;
    size_t bytes = BLOCKS * slot;
    uint8_t *buf = aligned_alloc(4096, bytes);
    if (buf == NULL) return 1;
    uint64_t mem = 0;
    CHECK(tutti_register_memory(rt, buf, bytes, &mem));

    char names[BLOCKS][32];
    const char *uris[BLOCKS];
    for (size_t b = 0; b < BLOCKS; b++) {
        snprintf(names[b], sizeof names[b], "tutti://kv/%zu", b);
        uris[b] = names[b];
    }
    uint64_t targets[BLOCKS];
    tutti_status opened[BLOCKS];
    CHECK(tutti_open_batch(rt, uris, BLOCKS, targets, opened));

    for (size_t b = 0; b < BLOCKS; b++)
        for (size_t i = 0; i < slot; i++) buf[b * slot + i] = pattern(b, i);
    if (run_batch(rt, TUTTI_DIRECTION_WRITE, targets, mem, slot)) return 1;
    memset(buf, 0xA5, bytes); /* poison: a read that moved nothing shows */
    if (run_batch(rt, TUTTI_DIRECTION_READ, targets, mem, slot)) return 1;
    size_t bad = 0;
    for (size_t b = 0; b < BLOCKS; b++)
        for (size_t i = 0; i < slot; i++) bad += buf[b * slot + i] != pattern(b, i);
    printf("saved and loaded %d blocks of %" PRIu64 " bytes: %zu bytes verified, %zu wrong\n", BLOCKS,
           slot, bytes, bad);
    if (bad) return 1;

    if (show_errors(rt, targets[BLOCKS - 1], mem, slot)) return 1;
    for (size_t b = 0; b + 1 < BLOCKS; b++) CHECK(tutti_close(rt, targets[b]));
    CHECK(tutti_unregister_memory(rt, mem));
    free(buf);
    tutti_stats stats;
    CHECK(tutti_stats_get(rt, &stats));
    tutti_shutdown_report report;
    CHECK(tutti_shutdown(rt, 5000, &report));
    printf("commands: %" PRIu64 " submitted, %" PRIu64 " completed; shutdown: %" PRIu64
           " commands in flight\n", stats.commands_submitted, stats.commands_completed,
           report.commands_in_flight);
    return 0;
}

int main(void) {
    tutti_runtime *rt = NULL;
    tutti_status st = tutti_runtime_new_emulated(TUTTI_EMULATED_DEFAULT_DRIVES,
                                                 TUTTI_EMULATED_DEFAULT_BYTES_PER_DRIVE,
                                                 TUTTI_EMULATED_DEFAULT_SLOT_BYTES, &rt);
    if (st != TUTTI_STATUS_OK) return fail("tutti_runtime_new_emulated", st);
    int rc = run(rt);
    tutti_runtime_destroy(rt);
    printf("save_load: %s\n", rc == 0 ? "OK" : "FAILED");
    return rc;
}
