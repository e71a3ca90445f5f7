// tutti_null: null-backed NVMe controllers played by GPU warps, one warp
// per I/O queue pair, for measuring the submitter (`tutti_io`) at rates no
// CPU-threaded emulator reaches (`tutti-bench gpu-rate --controller
// gpu-null`). Not a datapath: no data moves. The rings and doorbells are
// the ones `tutti_io` drives: an emulated controller's host memory (whose
// thread leaves its I/O queues to this kernel: `io_queues_detached`), or
// GPU memory (`GpuQueue::with_device_rings`, `gpu-rate --rings device`).
//
// Per queue, a warp loops (NVMe Base 2.0 section 3.3 "Queue mechanics"):
//  1. lane 0 reads the SQ tail and CQ head doorbells (both loads in flight
//     at once, then an acquire fence: the SQEs before the tail were
//     written before it);
//  2. it takes n = min(SQEs waiting, free CQ slots, 32) entries; a tail or
//     head doorbell value out of range is counted and ignored, as a
//     controller would;
//  3. lane i reads SQE head + i and checks it like the emulator's null
//     backing: Read, Write and Flush of namespace 1 succeed, an LBA range
//     past the namespace is LBA Out of Range, another namespace Invalid
//     Namespace or Format, another opcode Invalid Command Opcode;
//  4. lane i writes its CQE: dwords 0-1, then dwords 2 (SQHD = the head
//     after the n fetches, SQID) and 3 (CID, phase tag, status) in one
//     8-byte store; tutti_io's reaper reads dwords 2 and 3 with one 8-byte
//     acquire load, so it never sees the phase tag without its body (both
//     accesses naturally aligned, single-copy atomic);
//  5. CQ slots are reused only after the CQ head doorbell returns them.
// A warp polls `stop` (host memory) while idle and exits when it is set,
// writing its queue's report.

#include <stdint.h>

#include "tutti_volatile.cuh"

struct TuttiNullQueue {       // 48 bytes
    uint64_t sq;              // device pointer: SQ base, `size` x 64 bytes
    uint64_t cq;              // device pointer: CQ base, `size` x 16 bytes
    uint64_t sq_doorbell;     // device pointer: 32-bit SQ tail doorbell
    uint64_t cq_doorbell;     // device pointer: 32-bit CQ head doorbell
    uint32_t size;            // entries of the SQ and of the CQ
    uint32_t qid;             // SQID written in each CQE
    uint32_t sq_head;         // SQ head at start (the queue's current tail)
    uint32_t cq_tail_phase;   // CQ tail at start (the host's CQ head) | phase tag << 31
};

struct TuttiNullReport {      // 32 bytes, written once at exit
    unsigned long long served;         // CQEs posted
    unsigned long long cq_full_polls;  // polls that found SQEs waiting and no CQ slot
    unsigned long long bad_doorbells;  // polls that read a doorbell value out of range
    uint32_t sq_head;                  // SQ head at exit
    uint32_t cq_tail_phase;            // CQ tail at exit | phase << 31
};

#define NULL_OP_FLUSH 0x00u
#define NULL_OP_WRITE 0x01u
#define NULL_OP_READ 0x02u
// Generic command status values (NVMe Base 2.0, Figure 101).
#define SC_INVALID_OPCODE 0x01u
#define SC_INVALID_NAMESPACE 0x0Bu
#define SC_LBA_OUT_OF_RANGE 0x80u

// The status field (SCT 0, generic) of the command whose SQE dwords 0-3,
// 8-11 and 12-15 are `a`, `b` and `c`.
__device__ uint32_t null_status(uint4 a, uint4 b, uint4 c, uint64_t ns_blocks) {
    uint32_t opcode = a.x & 0xFFu;
    uint32_t nsid = a.y;
    if (opcode == NULL_OP_FLUSH) {
        return (nsid == 1u || nsid == 0xFFFFFFFFu) ? 0u : SC_INVALID_NAMESPACE;
    }
    if (opcode != NULL_OP_READ && opcode != NULL_OP_WRITE) {
        return SC_INVALID_OPCODE;
    }
    if (nsid != 1u) {
        return SC_INVALID_NAMESPACE;
    }
    uint64_t slba = (uint64_t)b.z | ((uint64_t)b.w << 32);  // CDW10, CDW11
    uint64_t nlb = (uint64_t)(c.x & 0xFFFFu) + 1u;          // CDW12 15:0, zero-based
    return (slba >= ns_blocks || nlb > ns_blocks - slba) ? SC_LBA_OUT_OF_RANGE : 0u;
}

extern "C" __global__ void __launch_bounds__(128) tutti_null_ctrl(const TuttiNullQueue* queues, uint32_t nqueues,
                                                                  uint64_t ns_blocks, const uint32_t* stop,
                                                                  TuttiNullReport* reports) {
    const uint32_t full = 0xFFFFFFFFu;
    uint32_t w = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    uint32_t lane = threadIdx.x % 32u;
    if (w >= nqueues) {
        return;
    }
    const TuttiNullQueue q = queues[w];
    uint32_t head = q.sq_head % q.size, tail_cq = (q.cq_tail_phase & 0x7FFFFFFFu) % q.size;
    uint32_t phase = q.cq_tail_phase >> 31;
    unsigned long long served = 0, cq_full = 0, bad = 0;
    uint32_t idle = 0;
    // The last valid CQ head doorbell value (a value out of range is
    // ignored, as a controller would, never taken modulo the size).
    uint32_t cq_head_seen = tail_cq;
    for (;;) {
        uint32_t sq_tail = 0, cq_head = 0;
        if (lane == 0u) {
            // Both in flight at once, then one acquire fence: the SQEs
            // before the tail were written before it.
            sq_tail = load_volatile((const uint32_t*)q.sq_doorbell);
            cq_head = load_volatile((const uint32_t*)q.cq_doorbell);
            __threadfence_system();
        }
        sq_tail = __shfl_sync(full, sq_tail, 0);
        cq_head = __shfl_sync(full, cq_head, 0);
        if (cq_head < q.size) {
            cq_head_seen = cq_head;
        } else if (lane == 0u) {
            bad++;
        }
        cq_head = cq_head_seen;
        uint32_t waiting = 0;
        if (sq_tail < q.size) {
            waiting = (sq_tail + q.size - head) % q.size;
        } else if (lane == 0u) {
            bad++;
        }
        uint32_t room = q.size - 1u - (tail_cq + q.size - cq_head) % q.size;
        uint32_t n = min(min(waiting, room), 32u);
        if (n == 0u) {
            if (waiting != 0u && lane == 0u) {
                cq_full++;
            }
            uint32_t stopped = 0;
            if (lane == 0u && (++idle & 63u) == 0u) {
                stopped = load_volatile(stop);
            }
            if (__shfl_sync(full, stopped, 0) != 0u) {
                break;
            }
            __nanosleep(100);
            continue;
        }
        idle = 0;
        // Every lane's SQE reads come after lane 0's acquire of the tail.
        __syncwarp(full);
        uint32_t new_head = (head + n) % q.size;
        uint32_t cid = 0, status = 0;
        if (lane < n) {
            // The three 16-byte pieces of the SQE it checks, in flight at once.
            const uint32_t* sqe = (const uint32_t*)(q.sq + (uint64_t)((head + lane) % q.size) * 64u);
            uint4 a = load_volatile_v4(sqe), b = load_volatile_v4(sqe + 8), c = load_volatile_v4(sqe + 12);
            cid = a.x >> 16;
            status = null_status(a, b, c, ns_blocks);
        }
        // Every lane has read its SQE before any CQE (whose SQHD releases
        // all n slots to the host) is written.
        __syncwarp(full);
        if (lane < n) {
            uint32_t slot = tail_cq + lane;
            uint32_t tag = phase;
            if (slot >= q.size) {
                slot -= q.size;
                tag ^= 1u;
            }
            uint32_t* cqe = (uint32_t*)(q.cq + (uint64_t)slot * 16u);
            store_volatile(cqe, 0u);
            store_volatile(cqe + 1, 0u);
            // Errors carry Do Not Retry, as the emulator's do. DW2 and DW3
            // in one atomic store: the body is never seen without its tag.
            uint32_t dnr = status != 0u ? (1u << 31) : 0u;
            store_volatile_u64(cqe + 2, new_head | (q.qid << 16), cid | (tag << 16) | (status << 17) | dnr);
        }
        __syncwarp(full);
        head = new_head;
        if (tail_cq + n >= q.size) {
            phase ^= 1u;
        }
        tail_cq = (tail_cq + n) % q.size;
        served += n;
    }
    if (lane == 0u) {
        TuttiNullReport r;
        r.served = served;
        r.cq_full_polls = cq_full;
        r.bad_doorbells = bad;
        r.sq_head = head;
        r.cq_tail_phase = tail_cq | (phase << 31);
        reports[w] = r;
    }
}
