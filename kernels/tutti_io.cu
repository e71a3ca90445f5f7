// tutti_io.cu: GPU threads submit NVMe commands and poll their completions
// themselves: build the 64-byte SQE, reserve an SQ slot, publish the SQ tail
// in order behind a system-scope fence, ring the doorbell with one 32-bit
// store, and poll the CQ by phase tag with a %globaltimer budget.
//
// Work is shared per warp: the lanes that wait together reserve their
// tickets with one atomicAdd and try each of the queue's two locks once:
// holding the publication lock, the group's leader publishes the SQ tail;
// holding the reap lock, the group reaps cooperatively (publication never
// waits behind a reaper's round trip to the CQ): each lane tests one CQ
// slot, so a warp consumes up
// to 32 posted CQEs per PCIe round trip, delivers each to the thread
// waiting on its CID (dropping unknown, duplicate and late ones), and
// writes the CQ head doorbell once per burst, before handing the burst's
// completions out. crates/gpu-io/src/reap_model.rs models the reaping lane
// for lane on the CPU (tested in CI): keep the two in step.
//
// Queue memory (SQ, CQ) and doorbells live in host memory mapped into the
// GPU (the emulator's queues and register page), or, on real hardware, in
// device memory / a registered BAR0. Layouts follow the NVM Express Base
// Specification 2.0: SQE 64 bytes (4.2), CQE 16 bytes (4.2.1), doorbells
// (3.1.4.23/24).
//
// Built to PTX by kernels/build.sh (nvcc -arch=compute_75 -ptx); the PTX is
// committed so CI machines need no CUDA toolkit. Oldest architecture the PTX
// targets: sm_75 (Turing; CUDA 13 dropped Volta). The code itself needs
// sm_70+ for independent thread scheduling (a per-queue
// lock taken by threads of one warp) and %globaltimer.
//
// ABI shared with crates/gpu-io/src/abi.rs: keep the two in sync (sizes are
// checked there).

#include <stdint.h>

// One queue pair as the kernel sees it (88 bytes).
struct TuttiQueue {
    uint64_t sq;           // device pointer: SQ base, `size` x 64 bytes
    uint64_t cq;           // device pointer: CQ base, `size` x 16 bytes
    uint64_t sq_doorbell;  // device pointer: 32-bit SQ tail doorbell
    uint64_t cq_doorbell;  // device pointer: 32-bit CQ head doorbell
    uint64_t state;        // device pointer: TuttiQueueState
    uint64_t pages;        // device pointer: u64 bus address (IOVA) of each
                           // 4 KiB page of the data region, for this drive
    uint64_t region_len;   // bytes in the data region
    uint64_t prp_lists;    // device pointer: one 4 KiB PRP list page per thread
                           // of the block (host memory the drive can read)
    uint64_t prp_lists_bus;// bus address (IOVA) of the first of those pages
    uint32_t size;         // entries of the SQ and of the CQ (QSIZE + 1)
    uint32_t qid;          // queue identifier (for SQID checks)
    uint32_t list_pages;   // PRP list pages available (threads that may use one)
    uint32_t _pad;
};

// Per-queue mutable state in device memory (initialised by the host).
// Counters are monotonic (mod 2^32); ring index = counter % size.
// Tickets are 64-bit so that `ticket % size` never jumps at a wrap.
struct TuttiQueueState {
    uint32_t lock;                 // lock guarding publication (published, the SQ tail)
    uint32_t cid_next;             // next CID to try (mod 65536)
    unsigned long long reserve;    // next SQ ticket to hand out
    unsigned long long published;  // tickets published to the controller (SQ tail)
    unsigned long long cq_head;    // CQ entries consumed
    unsigned long long sq_head;    // SQ entries fetched, from each CQE's SQHD
    uint32_t phase;                // phase tag expected at cq_head (1 on first pass)
    uint32_t stale;                // CQEs whose CID matched no waiting command
    uint32_t bad_sqid;             // CQEs naming another SQ
    uint32_t bad_sqhd;             // CQEs whose SQHD lies outside [sq_head, tail]
    uint32_t reap_lock;            // lock guarding reaping (cq_head, phase, sq_head, counters)
    uint32_t _pad;
    // followed by: uint32_t ready[size]; uint32_t done[65536] (by CID).
};

// done[cid]: 0 = free; WAITING = a submitted command waits for it;
// ABANDONED = its command timed out and the drive may still complete it (the
// CID stays out of use until that late CQE comes, or the queue is
// recreated); anything else = its completion: status field (31:17) |
// 0x10000 | CID. A CID is only ever taken from a free cell (compare-and-swap
// from 0), so two commands in flight never share one, however long one of
// them stays outstanding.
#define WAITING 1u
#define ABANDONED 2u

// One request (32 bytes).
struct TuttiRequest {
    uint8_t opcode;        // 01h Write, 02h Read
    uint8_t _pad0;
    uint16_t queue;        // index into the queues array (host-side grouping)
    uint32_t nsid;
    uint64_t slba;         // starting LBA
    uint32_t nlb;          // number of logical blocks, zero-based (CDW12 15:0)
    uint32_t len;          // bytes; at most 513 memory pages (PRP1 + one list page)
    uint64_t mem_offset;   // byte offset into the registered region
};

// Per-request result, written by the kernel.
//   0                 success
//   bit 31 clear      NVMe status field (CQE DW3 bits 31:17: SC 7:0, SCT
//                     10:8, CRD 12:11, M 13, DNR 14)
//   0x80000001        TIMEOUT: no completion within the budget
//   0x80000002        UNSUPPORTED: transfer needs more than one PRP list page
//   0x80000003        BAD_REQUEST: queue index or memory range invalid
#define TUTTI_TIMEOUT 0x80000001u
#define TUTTI_UNSUPPORTED 0x80000002u
#define TUTTI_BAD_REQUEST 0x80000003u
//   0x80000004        NO_CID: every CID of the queue is held (by commands
//                     that timed out and never completed); not submitted
#define TUTTI_NO_CID 0x80000004u
#define PAGE 4096u

__device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// A CQE's DW2 (SQHD, SQID) and DW3 (CID, phase tag, status) in one
// naturally aligned 8-byte load, single-copy atomic, with acquire: a phase
// tag seen as new comes with the DW2 written with or before it (the GPU
// null controllers store both in one 8-byte store; a controller writes the
// entry in one posted write), and what the entry completes is visible
// after it. Returns DW2 | DW3 << 32.
__device__ __forceinline__ unsigned long long load_acquire_sys_u64(const uint32_t* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_volatile_u64(unsigned long long* p, unsigned long long v) {
    *(volatile unsigned long long*)p = v;
}

__device__ __forceinline__ unsigned long long load_volatile_u64(const unsigned long long* p) {
    return *(const volatile unsigned long long*)p;
}

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* p) {
    return *(const volatile uint32_t*)p;
}

__device__ __forceinline__ void store_volatile(uint32_t* p, uint32_t v) {
    *(volatile uint32_t*)p = v;
}

// One 16-byte store (4 of them write an SQE: fewer, larger PCIe writes).
__device__ __forceinline__ void store_volatile_v4(uint32_t* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}

// Try-lock: a thread that finds the lock taken skips the work, because the
// holder publishes and reaps for every thread of the queue, and every waiter
// retries on its next poll.
__device__ __forceinline__ bool try_lock(uint32_t* l) {
    if (atomicCAS(l, 0u, 1u) != 0u) {
        return false;
    }
    // Acquire: what the previous holder wrote is visible.
    __threadfence();
    return true;
}

__device__ __forceinline__ void unlock(uint32_t* l) {
    __threadfence();
    atomicExch(l, 0u);
}

__device__ __forceinline__ uint32_t lane_id() {
    uint32_t l;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
    return l;
}

// Position of this lane among the lanes of `mask` below it (0-based).
__device__ __forceinline__ uint32_t rank_in(uint32_t mask) {
    return __popc(mask & ((1u << lane_id()) - 1u));
}

// The lanes of this warp that execute this call together (the "group").
// Every warp-cooperative step below starts from one such mask and then keeps
// control flow uniform across it (decisions are broadcast from the group's
// leader, its lowest lane), so every lane of the mask reaches each *_sync.
// Requires sm_70+ independent thread scheduling.
struct Group {
    uint32_t mask;
    uint32_t leader;  // lowest lane of mask
    uint32_t rank;    // this lane's position in mask
    uint32_t n;       // lanes in mask
};

__device__ __forceinline__ Group group_here() {
    Group g;
    g.mask = __activemask();
    g.leader = __ffs(g.mask) - 1u;
    g.rank = rank_in(g.mask);
    g.n = __popc(g.mask);
    return g;
}

// The leader tries the queue lock for the whole group; every lane learns the
// outcome.
__device__ __forceinline__ bool group_try_lock(const Group& g, uint32_t* l) {
    uint32_t got = 0;
    if (lane_id() == g.leader) {
        got = try_lock(l) ? 1u : 0u;
    }
    return __shfl_sync(g.mask, got, g.leader) != 0u;
}

// Publishes every contiguous filled slot from `published` on and rings the
// SQ tail doorbell once. Caller holds the publication lock. The tail only moves forward,
// and only over slots whose SQE stores are complete.
__device__ void publish(const TuttiQueue& q, TuttiQueueState* st, uint32_t* ready) {
    unsigned long long p = st->published;
    unsigned long long start = p;
    while (load_volatile(&ready[p % q.size]) == (uint32_t)(p + 1u)) {
        p++;
    }
    if (p != start) {
        // The new tail first (reapers, under the other lock, read it after
        // the CQEs it makes valid), then a fence that orders the SQE stores
        // (made visible by their writers' fences) and this thread's view
        // before the doorbell store, system-wide.
        store_volatile_u64(&st->published, p);
        __threadfence_system();
        store_volatile((uint32_t*)q.sq_doorbell, (uint32_t)(p % q.size));
    }
}

// What one pass of warp_reap found, summed over the group.
struct ReapTally {
    uint32_t stale;     // CQEs dropped: unknown, duplicate or late CID, or another SQ's
    uint32_t bad_sqid;  // CQEs naming another SQ
    uint32_t bad_sqhd;  // CQEs whose SQHD lies outside [sq_head, published]
    uint32_t ahead;     // furthest valid SQHD, in entries past sq_head
};

// One lane's CQE (its phase tag as expected, its body read): checks its
// SQID and SQHD, and hands its completion to the command waiting on its CID.
// Sets `ok_sqhd` when its SQHD is valid, with the distance in `ahead`.
__device__ __forceinline__ void take_cqe(const TuttiQueue& q, uint32_t dw2, uint32_t dw3, unsigned long long sq_head,
                                         unsigned long long published, uint32_t* done, uint32_t& stale,
                                         uint32_t& bad_sqid, uint32_t& ok_sqhd, uint32_t& ahead) {
    if ((dw2 >> 16) != q.qid) {
        // Not this SQ's: neither its SQHD nor its CID mean anything here.
        bad_sqid = 1;
        stale = 1;
        return;
    }
    // SQ head from SQHD (NVMe Base 2.0 4.2.1): the controller has fetched
    // every entry before it. It must lie in [sq_head, published].
    uint32_t sqhd = dw2 & 0xFFFFu;
    ahead = (sqhd + q.size - (uint32_t)(sq_head % q.size)) % q.size;
    ok_sqhd = (sqhd < q.size && sq_head + ahead <= published) ? 1u : 0u;
    uint32_t cid = dw3 & 0xFFFFu;
    uint32_t value = (dw3 & 0xFFFE0000u) | 0x10000u | cid;
    // Only a command that waits for this CID takes it; an unknown,
    // duplicate or late (timed-out) completion is counted and dropped. A
    // late one frees its CID: the drive has given it back.
    uint32_t was = atomicCAS(&done[cid], WAITING, value);
    if (was != WAITING) {
        stale = 1;
        if (was == ABANDONED) {
            atomicCAS(&done[cid], ABANDONED, 0u);
        }
    }
}

// One pass over up to g.n CQ slots from `head`: lane of rank r tests slot
// head + r. The group takes the run of posted entries (phase tag as
// expected) from the first on, releases their slots with one CQ head
// doorbell, then each lane delivers its own; returns how many it took.
// `window` caps the slots tested (so no slot is tested twice in one pass
// when the CQ has fewer entries than the group has lanes).
__device__ uint32_t reap_pass(const Group& g, const TuttiQueue& q, unsigned long long head, uint32_t phase,
                              uint32_t window, unsigned long long sq_head, const TuttiQueueState* st,
                              uint32_t* done, ReapTally& t) {
    uint32_t slot = (uint32_t)(head % q.size) + g.rank;
    uint32_t expected = slot >= q.size ? (phase ^ 1u) : phase;  // window <= size: at most one wrap
    slot %= q.size;
    const uint32_t* cqe = (const uint32_t*)(q.cq + (uint64_t)slot * 16u);
    uint32_t dw3 = 0, dw2 = 0;
    bool posted = false;
    if (g.rank < window) {
        // DW2 and DW3 together (one 8-byte acquire load; see
        // load_acquire_sys_u64), the body used only with a posted tag.
        unsigned long long d = load_acquire_sys_u64(cqe + 2);
        dw3 = (uint32_t)(d >> 32);
        posted = ((dw3 >> 16) & 1u) == expected;
        if (posted) {
            dw2 = (uint32_t)d;
        }
    }
    uint32_t gaps = g.mask & ~__ballot_sync(g.mask, posted);
    // Entries are posted in order: only the run before the first gap counts
    // (a slot after a gap may have been written after the gap was read).
    uint32_t take = gaps ? __popc(g.mask & ((1u << (__ffs(gaps) - 1u)) - 1u)) : g.n;
    // Every body taken has been read (the ballot consumes dw2) before the
    // doorbell gives the slots back to the controller.
    uint32_t foreign = __ballot_sync(g.mask, g.rank < take && (dw2 >> 16) != q.qid);
    // Every lane's reads of its CQE are performed before the leader's
    // doorbell store gives the slots back (memory ordering among the
    // group's lanes, then a system-scope fence before the store).
    __syncwarp(g.mask);
    // The SQ tail, read after the entries (publication runs under the other
    // lock and stores it before ringing the doorbell): every valid SQHD in
    // them lies at or below it.
    unsigned long long published = 0;
    if (lane_id() == g.leader) {
        published = load_volatile_u64(&st->published);
    }
    published = __shfl_sync(g.mask, published, g.leader);
    if (take != 0u && lane_id() == g.leader) {
        // Released before the completions are handed out, so a waiter that
        // submits again at once always finds a free CQ slot for its command.
        __threadfence_system();
        store_volatile((uint32_t*)q.cq_doorbell, (uint32_t)((head + take) % q.size));
        __threadfence_system();
    }
    __syncwarp(g.mask);
    uint32_t stale = 0, bad_sqid = 0, ok_sqhd = 0, ahead = 0;
    if (g.rank < take) {
        take_cqe(q, dw2, dw3, sq_head, published, done, stale, bad_sqid, ok_sqhd, ahead);
    }
    t.stale += __popc(__ballot_sync(g.mask, stale != 0u));
    t.bad_sqid += __popc(foreign);
    uint32_t good = __ballot_sync(g.mask, ok_sqhd != 0u);
    uint32_t checked = __ballot_sync(g.mask, g.rank < take) & ~foreign;
    t.bad_sqhd += __popc(checked & ~good);
    // The furthest valid SQHD (entries are fetched in order, so the largest
    // distance is the newest head).
    for (uint32_t b = good; b != 0u; b &= b - 1u) {
        uint32_t a = __shfl_sync(g.mask, ahead, __ffs(b) - 1u);
        t.ahead = max(t.ahead, a);
    }
    return take;
}

// Warp-cooperative reaping: the group consumes every posted CQE at the
// head, up to g.n slots per PCIe round trip (one CQ head doorbell per
// pass), hands each completion to the command waiting on its CID, and the
// leader writes the state once. The caller's group holds the reap lock.
__device__ void warp_reap(const Group& g, const TuttiQueue& q, TuttiQueueState* st, uint32_t* done) {
    // The leader read the state under the reap lock; the group gets it by
    // shuffle.
    unsigned long long head = 0, sq_head = 0;
    uint32_t phase = 0;
    if (lane_id() == g.leader) {
        head = st->cq_head;
        sq_head = st->sq_head;
        phase = st->phase;
    }
    head = __shfl_sync(g.mask, head, g.leader);
    sq_head = __shfl_sync(g.mask, sq_head, g.leader);
    phase = __shfl_sync(g.mask, phase, g.leader);
    ReapTally t = {0, 0, 0, 0};
    uint32_t consumed = 0;
    while (consumed < q.size) {
        uint32_t window = min(g.n, q.size - consumed);
        uint32_t take = reap_pass(g, q, head, phase, window, sq_head, st, done, t);
        if ((uint32_t)(head % q.size) + take >= q.size) {
            phase ^= 1u;
        }
        head += take;
        consumed += take;
        if (take < window) {
            break;
        }
    }
    if (consumed && lane_id() == g.leader) {
        // (The CQ head doorbell was written by each pass.)
        st->cq_head = head;
        st->phase = phase;
        st->sq_head = sq_head + t.ahead;
        st->stale += t.stale;
        st->bad_sqid += t.bad_sqid;
        st->bad_sqhd += t.bad_sqhd;
    }
}

// The group publishes what is ready and, when `reap` is set, reaps: one
// attempt per group instead of one per thread at each of two locks, so
// that publication (GPU memory and one doorbell store) never waits behind
// a reaper's round trip to the CQ.
__device__ __forceinline__ void group_progress(TuttiQueue const& q, TuttiQueueState* st, uint32_t* ready, uint32_t* done,
                                               bool reap) {
    Group g = group_here();
    // Uniform across the group even if the compiler merged call sites.
    reap = __any_sync(g.mask, reap);
    if (group_try_lock(g, &st->lock) && lane_id() == g.leader) {
        publish(q, st, ready);  // ours, if an earlier ticket held it back
        unlock(&st->lock);
    }
    if (reap && group_try_lock(g, &st->reap_lock)) {
        __syncwarp(g.mask);
        warp_reap(g, q, st, done);
        __syncwarp(g.mask);
        if (lane_id() == g.leader) {
            unlock(&st->reap_lock);
        }
    }
}

// A ticket for this lane: one atomicAdd per group of lanes reserving
// together, each lane getting the next in rank order.
__device__ __forceinline__ unsigned long long reserve_ticket(TuttiQueueState* st) {
    Group g = group_here();
    unsigned long long base = 0;
    if (lane_id() == g.leader) {
        base = atomicAdd(&st->reserve, (unsigned long long)g.n);
    }
    return __shfl_sync(g.mask, base, g.leader) + g.rank;
}

// Claims a free CID (a cell at 0) for this lane: the group takes
// consecutive candidates from cid_next with one atomicAdd; a lane whose
// candidate is held tries the following ones alone. Returns false when a
// whole cycle of 65536 candidates found none free.
__device__ __forceinline__ bool claim_cid(TuttiQueueState* st, uint32_t* done, uint32_t& cid) {
    Group g = group_here();
    uint32_t base = 0;
    if (lane_id() == g.leader) {
        base = atomicAdd(&st->cid_next, g.n);
    }
    uint32_t c = (__shfl_sync(g.mask, base, g.leader) + g.rank) & 0xFFFFu;
    for (uint32_t tries = 0; tries < 65536u; tries++) {
        if (atomicCAS(&done[c], 0u, WAITING) == 0u) {
            cid = c;
            return true;
        }
        c = atomicAdd(&st->cid_next, 1u) & 0xFFFFu;
    }
    return false;
}

// Builds the SQE in its slot (NVMe Base 2.0 4.2; NVM Read/Write CDW10-12)
// with four 16-byte stores.
__device__ __forceinline__ void write_sqe(const TuttiQueue& q, uint32_t slot, const TuttiRequest& r, uint32_t cid,
                                          uint64_t prp1, uint64_t prp2) {
    uint32_t* sqe = (uint32_t*)(q.sq + (uint64_t)slot * 64u);
    uint32_t dw[16];
    dw[0] = (uint32_t)r.opcode | (cid << 16);  // OPC, FUSE=0, PSDT=0 (PRP), CID
    dw[1] = r.nsid;
    dw[2] = 0;
    dw[3] = 0;
    dw[4] = 0;  // MPTR
    dw[5] = 0;
    dw[6] = (uint32_t)prp1;
    dw[7] = (uint32_t)(prp1 >> 32);
    dw[8] = (uint32_t)prp2;
    dw[9] = (uint32_t)(prp2 >> 32);
    dw[10] = (uint32_t)r.slba;
    dw[11] = (uint32_t)(r.slba >> 32);
    dw[12] = r.nlb & 0xFFFFu;
    dw[13] = 0;
    dw[14] = 0;
    dw[15] = 0;
    for (int j = 0; j < 16; j += 4) {
        store_volatile_v4(&sqe[j], dw[j], dw[j + 1], dw[j + 2], dw[j + 3]);
    }
}

// Polls for the completion of the command with this CID, reaping for
// everyone, within the budget; returns its status word (0 = success, the
// NVMe status field, or TUTTI_TIMEOUT) and frees its completion cell.
__device__ __forceinline__ uint32_t wait_completion(const TuttiQueue& q, TuttiQueueState* st, uint32_t* ready,
                                                    uint32_t* done, uint32_t cid, uint64_t budget_ns) {
    uint64_t deadline = globaltimer() + budget_ns;
    uint32_t result = TUTTI_TIMEOUT;
    for (;;) {
        uint32_t v = load_volatile(&done[cid]);
        if (v != WAITING) {
            result = v >> 17;  // NVMe status field; 0 = success
            // Only this thread writes a cell it claimed once it is no
            // longer WAITING (reapers only CAS from WAITING).
            store_volatile(&done[cid], 0u);
            break;
        }
        group_progress(q, st, ready, done, true);
        if (globaltimer() > deadline) {
            // Stop waiting; if the completion lands at this instant, take
            // it. Otherwise the CID stays held (ABANDONED) until the drive
            // gives it back with a late CQE.
            uint32_t late = atomicCAS(&done[cid], WAITING, ABANDONED);
            if (late != WAITING) {
                result = late >> 17;
                store_volatile(&done[cid], 0u);
            }
            break;
        }
        __nanosleep(256);
    }
    return result;
}

// One launch serves a batch over up to `nqueues` queue pairs (one block per
// queue, the fused multi-drive kernel): block b handles the requests
// order[offsets[b] .. offsets[b+1]] on queues[b], with at most
// min(blockDim.x, size - 1) commands outstanding. So the CQ cannot overflow,
// and a ticket's SQ slot is free: the ticket `size` before it was fetched
// (some ticket after that one has completed, and the controller fetches in
// order), unless commands time out without ever being fetched.
// Every request gets its own status; the kernel returns when each one has
// completed, failed or timed out.
extern "C" __global__ void tutti_io(const TuttiQueue* queues, uint32_t nqueues, const TuttiRequest* reqs,
                                    const uint32_t* order, const uint32_t* offsets, uint32_t* status,
                                    uint64_t budget_ns) {
    uint32_t b = blockIdx.x;
    if (b >= nqueues) {
        return;
    }
    const TuttiQueue q = queues[b];
    TuttiQueueState* st = (TuttiQueueState*)q.state;
    uint32_t* ready = (uint32_t*)(st + 1);
    uint32_t* done = ready + q.size;  // 65536 entries
    uint32_t active = min((uint32_t)blockDim.x, q.size - 1u);
    if (threadIdx.x >= active) {
        return;
    }
    for (uint32_t k = offsets[b] + threadIdx.x; k < offsets[b + 1]; k += active) {
        uint32_t i = order[k];
        TuttiRequest r = reqs[i];
        const uint64_t* pages = (const uint64_t*)q.pages;
        uint64_t end = r.mem_offset + r.len;
        if (r.len == 0 || end > q.region_len || end < r.mem_offset || (r.mem_offset & 3u)) {
            status[i] = TUTTI_BAD_REQUEST;
            continue;
        }
        // PRPs (NVMe Base 2.0 4.1.1): PRP1 with its in-page offset; PRP2
        // unused, a data page, or a PRP list. The list lives in this
        // thread's own list page, which no other command uses until this
        // one has completed (a thread has one command in flight).
        uint64_t prp1 = pages[r.mem_offset / PAGE] + (r.mem_offset % PAGE);
        uint64_t first = PAGE - (r.mem_offset % PAGE);
        uint64_t prp2 = 0;
        if (r.len > first) {
            uint64_t more = (r.len - first + PAGE - 1) / PAGE;  // pages after PRP1's
            uint64_t p0 = r.mem_offset / PAGE + 1;
            if (more == 1) {
                prp2 = pages[p0];
            } else if (more <= PAGE / 8 && threadIdx.x < q.list_pages) {
                uint64_t* list = (uint64_t*)(q.prp_lists + (uint64_t)threadIdx.x * PAGE);
                for (uint64_t e = 0; e < more; e++) {
                    *(volatile uint64_t*)&list[e] = pages[p0 + e];
                }
                prp2 = q.prp_lists_bus + (uint64_t)threadIdx.x * PAGE;
            } else {
                status[i] = TUTTI_UNSUPPORTED;
                continue;
            }
        }

        // Claim a free CID (its completion cell set to WAITING before the
        // command can complete), then reserve a ticket: SQ slot = ticket %
        // size.
        uint32_t cid = 0;
        if (!claim_cid(st, done, cid)) {
            status[i] = TUTTI_NO_CID;
            continue;
        }
        unsigned long long ticket = reserve_ticket(st);
        uint32_t slot = (uint32_t)(ticket % q.size);

        write_sqe(q, slot, r, cid, prp1, prp2);
        // The SQE (and its PRP list) is complete and visible system-wide
        // before its slot is marked ready (whoever publishes rings the
        // doorbell after it).
        __threadfence_system();
        store_volatile(&ready[slot], (uint32_t)(ticket + 1u));

        group_progress(q, st, ready, done, false);

        uint32_t result = wait_completion(q, st, ready, done, cid, budget_ns);
        status[i] = result;
    }
}

// The bare ring probe, for `tutti-bench gpu-rate`: the same queues, the same
// launch and the same requests as tutti_io, with none of the protocol. Each
// block drives its queue in lockstep bursts of up to min(blockDim.x,
// size - 1) Read SQEs: every thread writes one SQE (CID = slot, PRP1 from
// the request, no PRP lists, no ticket, no lock, no ready marks), thread 0
// rings the SQ tail doorbell once, every thread polls its own CQ slot for
// the phase tag (no CID matching, no SQHD or SQID checks), and thread 0
// rings the CQ head doorbell once. A request's status is 0 when its CQE
// arrived, TUTTI_TIMEOUT when the budget ran out first (its SQE may still be
// in flight: the queue is then unusable). At the end thread 0 writes the
// queue's state as tutti_io expects it of an idle queue (every ticket
// published, fetched and reaped), so the queue can serve tutti_io again.
// The queue must be idle at launch (the launch waits for its last kernel).
extern "C" __global__ void tutti_ring_probe(const TuttiQueue* queues, uint32_t nqueues, const TuttiRequest* reqs,
                                            const uint32_t* order, const uint32_t* offsets, uint32_t* status,
                                            uint64_t budget_ns) {
    uint32_t b = blockIdx.x;
    if (b >= nqueues) {
        return;
    }
    const TuttiQueue q = queues[b];
    TuttiQueueState* st = (TuttiQueueState*)q.state;
    const uint64_t* pages = (const uint64_t*)q.pages;
    uint32_t burst = min((uint32_t)blockDim.x, q.size - 1u);
    __shared__ unsigned long long tail;
    __shared__ unsigned long long head;
    __shared__ uint32_t phase;
    __shared__ uint32_t expired;
    if (threadIdx.x == 0) {
        tail = st->published;
        head = st->cq_head;
        phase = st->phase;
        expired = 0;
    }
    __syncthreads();
    uint64_t deadline = globaltimer() + budget_ns;
    uint32_t first = offsets[b], count = offsets[b + 1] - first;
    for (uint32_t base = 0; base < count && !expired; base += burst) {
        uint32_t nb = min(burst, count - base);
        uint32_t t = threadIdx.x;
        uint32_t i = 0;
        if (t < nb) {
            i = order[first + base + t];
            TuttiRequest r = reqs[i];
            uint32_t slot = (uint32_t)((tail + t) % q.size);
            uint64_t prp1 = r.mem_offset < q.region_len ? pages[r.mem_offset / PAGE] + (r.mem_offset % PAGE) : 0;
            uint32_t* sqe = (uint32_t*)(q.sq + (uint64_t)slot * 64u);
            store_volatile_v4(&sqe[0], (uint32_t)r.opcode | (slot << 16), r.nsid, 0, 0);
            store_volatile_v4(&sqe[4], 0, 0, (uint32_t)prp1, (uint32_t)(prp1 >> 32));
            store_volatile_v4(&sqe[8], 0, 0, (uint32_t)r.slba, (uint32_t)(r.slba >> 32));
            store_volatile_v4(&sqe[12], r.nlb & 0xFFFFu, 0, 0, 0);
        }
        __threadfence_system();
        __syncthreads();
        if (t == 0) {
            tail += nb;
            store_volatile((uint32_t*)q.sq_doorbell, (uint32_t)(tail % q.size));
        }
        if (t < nb) {
            uint32_t pos = (uint32_t)(head % q.size) + t;
            uint32_t want = pos >= q.size ? (phase ^ 1u) : phase;
            const uint32_t* cqe = (const uint32_t*)(q.cq + (uint64_t)(pos % q.size) * 16u);
            uint32_t result = TUTTI_TIMEOUT;
            for (;;) {
                if (((load_acquire_sys(cqe + 3) >> 16) & 1u) == want) {
                    result = 0;
                    break;
                }
                if (globaltimer() > deadline) {
                    expired = 1;
                    break;
                }
            }
            status[i] = result;
        }
        __syncthreads();
        if (t == 0 && !expired) {
            if ((uint32_t)(head % q.size) + nb >= q.size) {
                phase ^= 1u;
            }
            head += nb;
            store_volatile((uint32_t*)q.cq_doorbell, (uint32_t)(head % q.size));
        }
        __syncthreads();
    }
    // Requests of bursts never started keep the host's "not run" word.
    if (threadIdx.x == 0) {
        st->reserve = tail;
        st->published = tail;
        st->sq_head = tail;
        st->cq_head = head;
        st->phase = phase;
    }
}
