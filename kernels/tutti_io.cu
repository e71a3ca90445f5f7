// tutti_io.cu: GPU threads submit NVMe commands and poll their completions
// themselves: build the 64-byte SQE, take an SQ slot, publish the SQ tail
// in order behind a system-scope fence, ring the doorbell with one 32-bit
// store, and poll the CQ by phase tag with a %globaltimer budget.
//
// One block serves one queue pair for the whole launch and owns its state
// (in shared memory; no locks). Its threads work in lockstep rounds: the
// threads with a command ready take consecutive SQ slots and write their
// SQEs, one thread publishes them all with one SQ doorbell store; then
// each thread tests one CQ slot, so the block consumes up to blockDim.x
// posted CQEs per PCIe round trip, delivers each to the thread waiting on
// its CID (dropping unknown, duplicate and late ones) and returns them
// with one CQ head doorbell store. crates/gpu-io/src/reap_model.rs models
// the reaping thread for thread on the CPU (tested in CI): keep the two in
// step.
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
// sm_70+ for __nanosleep and %globaltimer.
//
// ABI shared with crates/gpu-io/src/abi.rs: keep the two in sync (sizes are
// checked there).

#include <stdint.h>

#include "tutti_volatile.cuh"

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

// Per-queue mutable state in device memory (initialised by the host), read
// by the block that serves the queue at the start of a launch and written
// back at its end. Counters are monotonic (mod 2^32); ring index = counter
// % size. They are 64-bit so that `counter % size` never jumps at a wrap.
struct TuttiQueueState {
    uint32_t lock;                 // unused (zero): one block owns the queue
    uint32_t cid_next;             // next CID to try (mod 65536)
    unsigned long long fetched;    // SQ entries known fetched: every one before a completed command's
    unsigned long long published;  // tickets published to the controller (SQ tail)
    unsigned long long cq_head;    // CQ entries consumed
    unsigned long long sq_head;    // SQ entries fetched, from each CQE's SQHD
    uint32_t phase;                // phase tag expected at cq_head (1 on first pass)
    uint32_t stale;                // CQEs whose CID matched no waiting command
    uint32_t bad_sqid;             // CQEs naming another SQ
    uint32_t bad_sqhd;             // CQEs whose SQHD lies outside [sq_head, tail]
    uint32_t reap_lock;            // unused (zero)
    uint32_t _pad;
    // followed by: uint32_t slot_cid[size] (the CID of the command last
    // written into each SQ slot); uint32_t done[65536] (by CID).
};

// done[cid]: 0 = free; CLAIMED (below) = a thread holds it for a command
// not yet submitted; WAITING = a submitted command waits for it;
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

// done[cid] while a thread holds a CID whose command is not submitted yet
// (it waits for an SQ slot): a CQE naming it is dropped as stale, never
// taken for the command (WAITING is stored just before the SQE is
// written, so before any doorbell covers it).
#define CLAIMED 3u

// The queue's state while one block serves it (shared memory). A queue is
// served by one block of one launch at a time (a launch lists a queue
// once; launches on a queue are ordered by the host), so the block owns
// it: no locks; the block's threads take turns in lockstep rounds
// separated by barriers.
struct BlockQueue {
    unsigned long long tail;     // SQ entries published (monotonic)
    unsigned long long head;     // CQ entries consumed (monotonic)
    unsigned long long sq_head;  // SQ head from the CQEs' SQHD (checked, counted)
    unsigned long long fetched;  // SQ entries known fetched: every one before a
                                 // completed command's (the controller fetches
                                 // in order); SQ slots are reused up to here
    uint32_t phase;              // phase tag expected at head
    uint32_t cid_next;           // next CID to try
    uint32_t stale;              // CQEs dropped (unknown, duplicate, late, foreign)
    uint32_t bad_sqid;           // CQEs naming another SQ
    uint32_t bad_sqhd;           // CQEs whose SQHD lay outside [sq_head, tail]
    uint32_t want;               // threads asking for an SQ slot this round
    uint32_t gap;                // first CQ slot of this round's window not posted
    uint32_t ahead;              // furthest valid SQHD this round, entries past sq_head
};

// A late CQE of the timed-out command holding `cid`: the controller fetched
// its SQ entry, and every entry before it (it fetches in order). Its entry
// is the one among those not yet known fetched, [fetched, tail), whose slot
// holds `cid` (at most one: a CID is in use by one command at a time, and
// a slot is rewritten only once the entry before its next use is known
// fetched). Without this, a ring whose commands all timed out and then
// completed late would stay full for good: no completion of a waiting
// command would ever move `fetched` again. Rare: one lane scans at most
// size entries.
__device__ __forceinline__ void late_fetched(const TuttiQueue& q, BlockQueue& s, const uint32_t* slot_cid,
                                             uint32_t cid) {
    for (unsigned long long p = s.fetched; p < s.tail; p++) {
        if (load_volatile(&slot_cid[p % q.size]) == cid) {
            atomicMax(&s.fetched, p + 1ull);
            return;
        }
    }
}

// One lane's CQE (its phase tag as expected): checks its SQID and SQHD
// and hands its completion to the command waiting on its CID.
__device__ __forceinline__ void take_cqe(const TuttiQueue& q, BlockQueue& s, uint32_t* done,
                                         const uint32_t* slot_cid, uint32_t dw2, uint32_t dw3) {
    if ((dw2 >> 16) != q.qid) {
        // Not this SQ's: neither its SQHD nor its CID mean anything here.
        atomicAdd(&s.bad_sqid, 1u);
        atomicAdd(&s.stale, 1u);
        return;
    }
    // SQ head from SQHD (NVMe Base 2.0 4.2.1): the controller has fetched
    // every entry before it. It must lie in [sq_head, tail].
    uint32_t sqhd = dw2 & 0xFFFFu;
    uint32_t ahead = (sqhd + q.size - (uint32_t)(s.sq_head % q.size)) % q.size;
    if (sqhd < q.size && s.sq_head + ahead <= s.tail) {
        atomicMax(&s.ahead, ahead);
    } else {
        atomicAdd(&s.bad_sqhd, 1u);
    }
    uint32_t cid = dw3 & 0xFFFFu;
    uint32_t value = (dw3 & 0xFFFE0000u) | 0x10000u | cid;
    // Only a command that waits for this CID takes it; an unknown,
    // duplicate or late (timed-out) completion is counted and dropped. A
    // late one frees its CID: the drive has given it back.
    uint32_t was = atomicCAS(&done[cid], WAITING, value);
    if (was != WAITING) {
        atomicAdd(&s.stale, 1u);
        if (was == ABANDONED) {
            late_fetched(q, s, slot_cid, cid);
            atomicCAS(&done[cid], ABANDONED, 0u);
        }
    }
}

// One reaping pass of the block: thread t < window tests CQ slot head + t
// (DW2|DW3 in one 8-byte acquire load); the block takes the run of posted
// entries before the first gap (entries are posted in order; a slot after
// a gap may have been written after the gap was read) and delivers each.
// Returns how many it took; thread 0 then writes the CQ head doorbell once.
// crates/gpu-io/src/reap_model.rs models this pass on the CPU (tested in
// CI): keep the two in step.
__device__ uint32_t block_reap(const TuttiQueue& q, BlockQueue& s, uint32_t* done, const uint32_t* slot_cid,
                               uint32_t window) {
    uint32_t t = threadIdx.x;
    uint32_t dw2 = 0, dw3 = 0;
    bool posted = false;
    if (t < window) {
        uint32_t pos = (uint32_t)(s.head % q.size) + t;
        uint32_t expected = pos >= q.size ? (s.phase ^ 1u) : s.phase;  // window <= size: one wrap at most
        const uint32_t* cqe = (const uint32_t*)(q.cq + (uint64_t)(pos % q.size) * 16u);
        unsigned long long d = load_acquire_sys_u64(cqe + 2);
        dw3 = (uint32_t)(d >> 32);
        dw2 = (uint32_t)d;
        posted = ((dw3 >> 16) & 1u) == expected;
        if (!posted) {
            atomicMin(&s.gap, t);
        }
    }
    __syncthreads();
    uint32_t take = s.gap;
    if (t < take) {
        take_cqe(q, s, done, slot_cid, dw2, dw3);
    }
    // Every CQE taken has been read before the doorbell gives its slot
    // back (the barrier, then a system-scope fence before the store).
    __syncthreads();
    return take;
}

// A command a thread holds between taking its request and the end of its
// wait.
struct Cmd {
    uint32_t i;          // request index (into reqs and status)
    uint32_t cid;        // its CID (done[cid] CLAIMED, then WAITING)
    uint32_t op_nlb;     // opcode (7:0) | NLB, zero-based (31:16)
    uint32_t nsid;       // namespace
    uint64_t slba;       // starting LBA
    uint64_t prp1, prp2; // its PRPs
    uint64_t since;      // %globaltimer when it started waiting (for a slot, then for its CQE)
    unsigned long long pos;  // its SQ entry (monotonic position)
};

// Takes the next valid request of this thread from `k` on: checks it,
// builds its PRPs (a PRP list in this thread's own list page, which no
// other command uses until this one has completed: a thread has one
// command at a time) and claims a CID. Requests that fail a check get
// their status at once. Returns false when none is left.
__device__ bool next_cmd(const TuttiQueue& q, BlockQueue& s, uint32_t* done, const TuttiRequest* reqs,
                         const uint32_t* order, uint32_t* status, uint32_t& k, uint32_t end, uint32_t step,
                         Cmd& c) {
    const uint64_t* pages = (const uint64_t*)q.pages;
    for (; k < end; k += step) {
        uint32_t i = order[k];
        TuttiRequest r = reqs[i];
        uint64_t last = r.mem_offset + r.len;
        if (r.len == 0 || last > q.region_len || last < r.mem_offset || (r.mem_offset & 3u)) {
            status[i] = TUTTI_BAD_REQUEST;
            continue;
        }
        // PRPs (NVMe Base 2.0 4.1.1): PRP1 with its in-page offset; PRP2
        // unused, a data page, or a PRP list.
        c.prp1 = pages[r.mem_offset / PAGE] + (r.mem_offset % PAGE);
        c.prp2 = 0;
        uint64_t first = PAGE - (r.mem_offset % PAGE);
        if (r.len > first) {
            uint64_t more = (r.len - first + PAGE - 1) / PAGE;  // pages after PRP1's
            uint64_t p0 = r.mem_offset / PAGE + 1;
            if (more == 1) {
                c.prp2 = pages[p0];
            } else if (more <= PAGE / 8 && threadIdx.x < q.list_pages) {
                uint64_t* list = (uint64_t*)(q.prp_lists + (uint64_t)threadIdx.x * PAGE);
                for (uint64_t e = 0; e < more; e++) {
                    *(volatile uint64_t*)&list[e] = pages[p0 + e];
                }
                c.prp2 = q.prp_lists_bus + (uint64_t)threadIdx.x * PAGE;
            } else {
                status[i] = TUTTI_UNSUPPORTED;
                continue;
            }
        }
        // A free CID (cell at 0), held as CLAIMED until the command is
        // submitted; a whole cycle of held ones: NO_CID.
        bool got = false;
        for (uint32_t tries = 0; tries < 65536u && !got; tries++) {
            c.cid = atomicAdd(&s.cid_next, 1u) & 0xFFFFu;
            got = atomicCAS(&done[c.cid], 0u, CLAIMED) == 0u;
        }
        if (!got) {
            status[i] = TUTTI_NO_CID;
            continue;
        }
        c.i = i;
        c.op_nlb = (uint32_t)r.opcode | (r.nlb << 16);
        c.nsid = r.nsid;
        c.slba = r.slba;
        c.since = globaltimer();
        k += step;
        return true;
    }
    return false;
}

// Builds the SQE in its slot (NVMe Base 2.0 4.2; NVM Read/Write CDW10-12)
// with four 16-byte stores.
__device__ __forceinline__ void write_sqe(const TuttiQueue& q, uint32_t slot, const Cmd& c) {
    uint32_t* sqe = (uint32_t*)(q.sq + (uint64_t)slot * 64u);
    // CDW0: OPC, FUSE = 0, PSDT = 0 (PRPs), CID; NSID; CDW2-3 reserved.
    store_volatile_v4(&sqe[0], (c.op_nlb & 0xFFu) | (c.cid << 16), c.nsid, 0, 0);
    // MPTR (unused), PRP1.
    store_volatile_v4(&sqe[4], 0, 0, (uint32_t)c.prp1, (uint32_t)(c.prp1 >> 32));
    // PRP2, SLBA (CDW10-11).
    store_volatile_v4(&sqe[8], (uint32_t)c.prp2, (uint32_t)(c.prp2 >> 32), (uint32_t)c.slba,
                      (uint32_t)(c.slba >> 32));
    // CDW12: NLB (15:0); CDW13-15 zero.
    store_volatile_v4(&sqe[12], c.op_nlb >> 16, 0, 0, 0);
}

// Ends a command whose completion arrived or whose budget ran out: its
// status, and its CID freed (or held as ABANDONED: the drive may still
// complete it, and the CID stays out of use until then). Returns whether
// it ended.
__device__ __forceinline__ bool settle(BlockQueue& s, uint32_t* done, uint32_t* status, const Cmd& c,
                                       uint64_t budget_ns) {
    uint32_t v = load_volatile(&done[c.cid]);
    if (v == WAITING) {
        if (globaltimer() - c.since <= budget_ns) {
            return false;
        }
        // If the completion lands at this instant, take it.
        v = atomicCAS(&done[c.cid], WAITING, ABANDONED);
        if (v == WAITING) {
            status[c.i] = TUTTI_TIMEOUT;
            return true;
        }
    }
    status[c.i] = v >> 17;  // NVMe status field; 0 = success
    // Only this thread writes a cell it claimed once it is no longer
    // WAITING (the reaper only CASes from WAITING).
    store_volatile(&done[c.cid], 0u);
    // Its completion came: its entry and every one before it were fetched.
    atomicMax(&s.fetched, c.pos + 1ull);
    return true;
}

// Reads the queue's state into shared memory (thread 0) at the start of a
// launch.
__device__ __forceinline__ void load_state(const TuttiQueueState* st, BlockQueue& s, uint32_t window) {
    s.tail = st->published;
    s.head = st->cq_head;
    s.sq_head = st->sq_head;
    s.fetched = st->fetched;
    s.phase = st->phase;
    s.cid_next = st->cid_next;
    s.stale = 0;
    s.bad_sqid = 0;
    s.bad_sqhd = 0;
    s.want = 0;
    s.gap = window;
    s.ahead = 0;
}

// Writes the queue's state back (thread 0) at the end of a launch: the
// tail, the entries known fetched, the CQ head, the SQ head, the counters
// added.
__device__ __forceinline__ void store_state(TuttiQueueState* st, const BlockQueue& s) {
    st->fetched = s.fetched;
    st->published = s.tail;
    st->cq_head = s.head;
    st->sq_head = s.sq_head;
    st->phase = s.phase;
    st->cid_next = s.cid_next;
    st->stale += s.stale;
    st->bad_sqid += s.bad_sqid;
    st->bad_sqhd += s.bad_sqhd;
}

// One launch serves a batch over up to `nqueues` queue pairs (one block per
// queue, the fused multi-drive kernel): block b handles the requests
// order[offsets[b] .. offsets[b+1]] on queues[b]. Its threads below
// min(blockDim.x, size - 1) each carry one command at a time (so the CQ
// never overflows), and the block works in lockstep rounds:
//  1. each thread without a command takes its next request (checks, PRPs,
//     a claimed CID); those that have one get consecutive SQ slots from
//     the tail, as many as the SQ has free (entries before a completed
//     command's were fetched), write their SQEs and fence them
//     system-wide;
//  2. thread 0 publishes the new tail with one SQ doorbell store;
//  3. the block reaps one window of CQ slots (block_reap) and thread 0
//     returns the slots taken with one CQ head doorbell store;
//  4. each thread whose completion arrived writes its status; one whose
//     budget ran out writes TIMEOUT and abandons its CID.
// The kernel returns when every request has a status. Every request waits
// at most `budget_ns` for an SQ slot and then for its completion.
extern "C" __global__ void tutti_io(const TuttiQueue* queues, uint32_t nqueues, const TuttiRequest* reqs,
                                    const uint32_t* order, const uint32_t* offsets, uint32_t* status,
                                    uint64_t budget_ns) {
    uint32_t b = blockIdx.x;
    if (b >= nqueues) {
        return;
    }
    __shared__ BlockQueue s;
    const TuttiQueue q = queues[b];
    TuttiQueueState* st = (TuttiQueueState*)q.state;
    uint32_t* slot_cid = (uint32_t*)(st + 1);       // size cells
    uint32_t* done = slot_cid + q.size;              // 65536 cells
    uint32_t active = min((uint32_t)blockDim.x, q.size - 1u);
    uint32_t window_max = min((uint32_t)blockDim.x, q.size);
    if (threadIdx.x == 0) {
        load_state(st, s, window_max);
    }
    __syncthreads();
    uint32_t k = offsets[b] + threadIdx.x, end = offsets[b + 1];
    if (threadIdx.x >= active) {
        k = end;  // no requests: this thread only takes part in the rounds
    }
    Cmd c;
    bool held = false;     // c is taken and waits for an SQ slot
    bool inflight = false; // c is submitted and waits for its completion
    for (;;) {
        // 1. Submission.
        if (!held && !inflight) {
            held = next_cmd(q, s, done, reqs, order, status, k, end, active, c);
        }
        uint32_t rank = 0;
        if (held) {
            rank = atomicAdd(&s.want, 1u);
        }
        __syncthreads();
        unsigned long long tail = s.tail;
        // Slots whose entries are known fetched: from completions, never
        // from SQHD values alone (with the SQ full, an SQHD one entry stale
        // reads as the whole ring fetched). tail - fetched <= size - 1.
        uint32_t free_slots = (uint32_t)(s.fetched + q.size - 1u - tail);
        uint32_t nsub = min(s.want, free_slots);
        if (held && rank < nsub) {
            store_volatile(&done[c.cid], WAITING);
            c.pos = tail + rank;
            store_volatile(&slot_cid[c.pos % q.size], c.cid);
            write_sqe(q, (uint32_t)(c.pos % q.size), c);
            // The SQE, its PRP list and WAITING are visible system-wide
            // before the doorbell (stored after the barrier below).
            __threadfence_system();
            held = false;
            inflight = true;
            c.since = globaltimer();
        } else if (held && globaltimer() - c.since > budget_ns) {
            // No SQ slot within the budget (the drive fetches nothing).
            status[c.i] = TUTTI_TIMEOUT;
            store_volatile(&done[c.cid], 0u);
            held = false;
        }
        __syncthreads();
        // 2. Publication, and the window of this round's reaping.
        // CQEs expected (late ones included; none when duplicates have run
        // the head past the tail), and a warp's worth more.
        unsigned long long expected = tail + nsub > s.head ? tail + nsub - s.head : 0ull;
        uint32_t window = (uint32_t)min((unsigned long long)window_max, (expected / 32u + 1u) * 32u);
        if (threadIdx.x == 0) {
            s.want = 0;
            s.gap = window;
            if (nsub != 0) {
                s.tail = tail + nsub;
                __threadfence_system();
                store_volatile((uint32_t*)q.sq_doorbell, (uint32_t)(s.tail % q.size));
            }
        }
        __syncthreads();
        // 3. Reaping.
        uint32_t take = block_reap(q, s, done, slot_cid, window);
        if (threadIdx.x == 0 && take != 0) {
            __threadfence_system();
            store_volatile((uint32_t*)q.cq_doorbell, (uint32_t)((s.head + take) % q.size));
            if ((uint32_t)(s.head % q.size) + take >= q.size) {
                s.phase ^= 1u;
            }
            s.head += take;
            s.sq_head += s.ahead;
            s.ahead = 0;
        }
        // 4. Completions (each thread its own cell, written by the reap
        // before the barrier in block_reap).
        if (inflight && settle(s, done, status, c, budget_ns)) {
            inflight = false;
        }
        if (!__syncthreads_or(held || inflight || k < end)) {
            break;
        }
        if (take == 0 && nsub == 0) {
            __nanosleep(128);
        }
    }
    if (threadIdx.x == 0) {
        store_state(st, s);
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
        st->fetched = tail;
        st->published = tail;
        st->sq_head = tail;
        st->cq_head = head;
        st->phase = phase;
    }
}
