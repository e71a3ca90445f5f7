// tutti_crc32c.cu: the standard CRC32C (Castagnoli; RFC 3720 section 12.1:
// reflected polynomial 0x82F63B78, initial value 0xFFFFFFFF, final xor
// 0xFFFFFFFF) of many device-memory byte ranges in one launch. The value is
// the one the `crc32c` crate's `crc32c(&bytes)` returns.
//
// Built to PTX by kernels/build.sh (nvcc -arch=compute_75 -ptx) like
// tutti_io.cu; loaded by crates/gpu-io (src/crc32c.rs), which computes the
// per-item task offsets this kernel expects. Keep CHUNK_BYTES and the item
// layout in sync with that file (its tests read this one).
//
// ---------------------------------------------------------------------------
// The math (all "shifts" are in bytes; P is the CRC32C polynomial).
//
// raw(M): the CRC of message M with initial value 0 and no final xor, i.e.
// M(x) * x^32 mod P in the reflected bit order. raw is linear over GF(2):
//   raw(A xor B) = raw(A) xor raw(B)                  (|A| = |B|)
//   raw(A || 0^n) = S_n(raw(A)),  S_n(c) = c * x^(8n) mod P
// S_n ("append n zero bytes") is multiplication by the constant x^(8n) mod
// P: a linear map on 32 bits. x^(8n) is a product of x^(2^k) (k = 3 + the
// bits of n), taken from kX2n below (zlib's crc32_combine does the same).
// Leading zero bytes do not change raw: raw(0^n || M) = raw(M).
//
// A CRC register r (the standard CRC's running value) evolves linearly:
// after message M it is S_|M|(r) xor raw(M). The standard CRC32C of M is
// therefore ~(S_|M|(0xFFFFFFFF) xor raw(M)).
//
// Tables: T_j[b] = raw(byte b followed by j zero bytes) = S_j(T_0[b]).
// With them, 8 lookups fold an 8-byte word into a state c ("slicing-by-8"):
//   S_8(c) xor raw(w) = T_7[w0^c0] ^ T_6[w1^c1] ^ T_5[w2^c2] ^ T_4[w3^c3]
//                     ^ T_3[w4] ^ T_2[w5] ^ T_1[w6] ^ T_0[w7]
// (c0..c3 are the bytes of c, least significant first: c is xored into the
// word's first 4 bytes). The same formula with T_{j+248} instead of T_j
// gives S_256(c) xor raw(w || 0^248): the word followed by 248 zero bytes.
// And S_m(c) for a 32-bit c alone is T_{m-1}[c0]^T_{m-2}[c1]^T_{m-3}[c2]^
// T_{m-4}[c3] (4 lookups).
//
// ---------------------------------------------------------------------------
// The split.
//
// Item = (device pointer, length in bytes). Bytes [0, head) up to the first
// 8-byte-aligned address are the head (0..7 bytes), then `words` aligned
// 8-byte words, then the tail (0..7 bytes). The words are split into chunks
// of CHUNK_WORDS words (CHUNK_BYTES bytes); the last chunk may be shorter.
// An item has max(1, ceil(words / CHUNK_WORDS)) tasks (one per chunk; an
// item without whole words still has one, empty task, whose warp finishes
// the item). The host lays the tasks of all items end to end and passes
// first_task[i] = index of item i's first task (nitems + 1 entries).
//
// One warp computes one chunk. The chunk is read in rounds of 32 words (256
// bytes): in round r lane t reads word 32r + t, so each load instruction of
// the warp reads 256 contiguous bytes (coalesced). Lane t folds its words
// into its own state with the padded tables (each word followed by 248 zero
// bytes, the bytes the other 31 lanes read in between), except its last
// word, folded with the plain tables. Its state then is the raw CRC of its
// words at their true distances from each other, ending at its last word.
// Where that word lies d_t bytes before the end of the chunk, the chunk's
// raw CRC is XOR_t S_{d_t}(state_t). With p = words % 32 (a partial last
// round), lane u = (t - p) mod 32 has d = 8 * (31 - u); after rotating the
// states so lane u holds that one, a 5-level shuffle tree combines pairs
// (left, right) as S_{8 * 2^k}(left) xor right, using table shifts.
//
// The warp stores the chunk's raw CRC, then bumps the item's counter; the
// warp that sees the count reach the item's task count combines the chunk
// CRCs (all chunks but the last have CHUNK_BYTES bytes, so shifts are powers
// of x^(8 * CHUNK_BYTES)), folds in head and tail bytewise, applies the
// standard initial value and final xor, and writes the item's result. One
// launch, no second pass.
// ---------------------------------------------------------------------------

#include <stdint.h>

// One range to checksum (16 bytes; gpu_io::abi::TuttiCrcItem).
struct TuttiCrcItem {
    uint64_t ptr;  // device pointer of the first byte (any alignment)
    uint64_t len;  // length in bytes (may be 0; then ptr is not read)
};

#define CRC32C_POLY 0x82F63B78u  // reflected Castagnoli polynomial
#define LANES 32
#define FULL_MASK 0xffffffffu
#define WORD_BYTES 8                           // one lane reads 8 bytes per round
#define CHUNK_BYTES 8192u                      // bytes per task (one warp); 2^13
#define CHUNK_WORDS (CHUNK_BYTES / WORD_BYTES) // 1024 words = 32 rounds
#define LOG2_CHUNK_BITS 16                     // x^(8 * CHUNK_BYTES) = x^(2^16)

// kX2n[k] = x^(2^k) mod P, reflected (x^0 is 0x80000000). For CRC32C the
// sequence has period 31 (x^(2^31) = x mod P: P = (x + 1) times an
// irreducible polynomial of degree 31), so x^(2^k) = kX2n[k % 31].
// crates/gpu-io checks these values.
__device__ const uint32_t kX2n[31] = {
    0x40000000, 0x20000000, 0x08000000, 0x00800000, 0x00008000, 0x82f63b78, 0x6ea2d55c, 0x18b8ea18,
    0x510ac59a, 0xb82be955, 0xb8fdb1e7, 0x88e56f72, 0x74c360a4, 0xe4172b16, 0x0d65762a, 0x35d73a62,
    0x28461564, 0xbf455269, 0xe2ea32dc, 0xfe7740e6, 0xf946610b, 0x3c204f8f, 0x538586e3, 0x59726915,
    0x734d5309, 0xbc1ac763, 0x7d0722cc, 0xd289cabe, 0xe94ca9bc, 0x05b74f3f, 0xa51e1f42,
};

// The tables each block builds in shared memory: table index -> j of T_j.
// Groups of 4 consecutive j serve "S_m of a 32-bit value" (m = j_max + 1),
// groups of 8 fold a word.
#define NTAB 36
#define TAB_PLAIN 0    // T_0..T_7: fold a word (its last byte uses T_0)
#define TAB_S8 4       // T_4..T_7: S_8
#define TAB_S16 8      // T_12..T_15: S_16
#define TAB_S32 12     // T_28..T_31: S_32
#define TAB_S64 16     // T_60..T_63: S_64
#define TAB_S128 20    // T_124..T_127: S_128
#define TAB_PADDED 24  // T_248..T_255: fold a word followed by 248 zero bytes
#define TAB_SCHUNK 32  // T_8188..T_8191: S_CHUNK_BYTES
__device__ const uint32_t kTableJ[NTAB] = {
    0,   1,   2,   3,   4,   5,   6,   7,   12,  13,  14,  15,
    28,  29,  30,  31,  60,  61,  62,  63,  124, 125, 126, 127,
    248, 249, 250, 251, 252, 253, 254, 255, CHUNK_BYTES - 4, CHUNK_BYTES - 3, CHUNK_BYTES - 2, CHUNK_BYTES - 1,
};

typedef uint32_t Tables[NTAB][256];

// a * b mod P in the reflected representation (zlib's multmodp), 32 fixed
// steps so that lanes do not diverge.
__device__ __forceinline__ uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t p = 0;
    for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
        if (a & m) p ^= b;
        b = (b & 1) ? (b >> 1) ^ CRC32C_POLY : b >> 1;  // b *= x
    }
    return p;
}

// x^(8n) mod P: the operator that appends n zero bytes (S_n(c) =
// multmodp(x8nmodp(n), c)). n < 2^61 (the host bounds lengths).
__device__ uint32_t x8nmodp(uint64_t n) {
    uint32_t p = 1u << 31;  // x^0
    uint32_t k = 3;         // bit i of n contributes x^(8 * 2^i) = x^(2^(i+3))
    while (n != 0) {
        if (n & 1) p = multmodp(kX2n[k], p);
        n >>= 1;
        k = (k == 30) ? 0 : k + 1;  // kX2n has period 31
    }
    return p;
}

// S_m(c) with the 4 tables T_{m-4}..T_{m-1} at tab[g..g+3].
__device__ __forceinline__ uint32_t shift4(const Tables& tab, int g, uint32_t c) {
    return tab[g + 3][c & 0xff] ^ tab[g + 2][(c >> 8) & 0xff] ^ tab[g + 1][(c >> 16) & 0xff] ^ tab[g][c >> 24];
}

// Folds the 8-byte word w into state c with the 8 tables at tab[base..]:
// TAB_PLAIN gives S_8(c) ^ raw(w), TAB_PADDED S_256(c) ^ raw(w || 0^248).
// Byte k of the word (little-endian) uses tab[base + 7 - k].
__device__ __forceinline__ uint32_t fold(const Tables& tab, int base, uint32_t c, uint2 w) {
    const uint32_t lo = w.x ^ c, hi = w.y;
    return tab[base + 7][lo & 0xff] ^ tab[base + 6][(lo >> 8) & 0xff] ^ tab[base + 5][(lo >> 16) & 0xff] ^
           tab[base + 4][lo >> 24] ^ tab[base + 3][hi & 0xff] ^ tab[base + 2][(hi >> 8) & 0xff] ^
           tab[base + 1][(hi >> 16) & 0xff] ^ tab[base][hi >> 24];
}

// Standard bytewise step (T_0 is tab[TAB_PLAIN]).
__device__ __forceinline__ uint32_t fold_byte(const Tables& tab, uint32_t r, uint8_t b) {
    return tab[TAB_PLAIN][(r ^ b) & 0xff] ^ (r >> 8);
}

// Fills the shared tables. T_j[b] is linear in b, so each table is the XOR
// of 8 basis values T_j[1 << i] = S_j(T_0[1 << i]) over the set bits of b:
// 36 operators x^(8j), then 288 basis values, then 9216 XOR expansions.
__device__ void build_tables(Tables& tab, uint32_t (&basis)[NTAB][8], uint32_t (&op)[NTAB]) {
    for (uint32_t t = threadIdx.x; t < NTAB; t += blockDim.x) op[t] = x8nmodp(kTableJ[t]);
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < NTAB * 8; e += blockDim.x) {
        const uint32_t t = e / 8, i = e % 8;
        uint32_t c = 1u << i;  // T_0[1 << i]: the bitwise CRC step, 8 times
        for (int s = 0; s < 8; ++s) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        basis[t][i] = multmodp(op[t], c);
    }
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < NTAB * 256; e += blockDim.x) {
        const uint32_t t = e / 256, b = e % 256;
        uint32_t v = 0;
        for (int i = 0; i < 8; ++i)
            if (b & (1u << i)) v ^= basis[t][i];
        tab[t][b] = v;
    }
    __syncthreads();
}

// An item's byte layout (see "The split"; all counts in bytes except words).
struct Layout {
    uint64_t head;   // bytes before the first 8-byte-aligned address (0..7)
    uint64_t words;  // whole aligned 8-byte words after the head
    uint64_t tail;   // bytes after the words (0..7)
};

__device__ __forceinline__ Layout layout_of(const TuttiCrcItem& it) {
    Layout l;
    const uint64_t to_aligned = (WORD_BYTES - it.ptr % WORD_BYTES) % WORD_BYTES;
    l.head = to_aligned < it.len ? to_aligned : it.len;
    l.words = (it.len - l.head) / WORD_BYTES;
    l.tail = (it.len - l.head) % WORD_BYTES;
    return l;
}

// Lane's state over its words of a chunk of nw words at `chunk` (see "The
// split"): words lane, lane + 32, ...; all but the last folded padded.
__device__ __forceinline__ uint32_t lane_state(const Tables& tab, const uint2* chunk, uint32_t nw, uint32_t lane) {
    const uint32_t mine = nw / LANES + (lane < nw % LANES ? 1 : 0);  // words this lane owns
    if (mine == 0) return 0;
    const uint2* w = chunk + lane;  // this lane's word of round r is w[r * LANES]
    uint32_t c = 0, r = 0;
    // Four loads in flight before their folds (the folds depend on each
    // other, the loads do not). __ldcs: streamed, read once.
    for (; r + 4 < mine; r += 4) {
        const uint2 a = __ldcs(w + (r + 0) * LANES), b = __ldcs(w + (r + 1) * LANES);
        const uint2 d = __ldcs(w + (r + 2) * LANES), e = __ldcs(w + (r + 3) * LANES);
        c = fold(tab, TAB_PADDED, c, a);
        c = fold(tab, TAB_PADDED, c, b);
        c = fold(tab, TAB_PADDED, c, d);
        c = fold(tab, TAB_PADDED, c, e);
    }
    for (; r + 1 < mine; ++r) c = fold(tab, TAB_PADDED, c, __ldcs(w + r * LANES));
    return fold(tab, TAB_PLAIN, c, __ldcs(w + r * LANES));  // r == mine - 1: the lane's last word
}

// Raw CRC of a chunk of nw words (whole warp; the result is valid in lane 0).
__device__ uint32_t chunk_crc(const Tables& tab, const uint2* chunk, uint32_t nw, uint32_t lane) {
    uint32_t c = lane_state(tab, chunk, nw, lane);
    // Lane t's last word lies 8 * (31 - u) bytes before the chunk's end, u =
    // (t - nw % 32) mod 32: rotate so that lane u holds lane t's state.
    c = __shfl_sync(FULL_MASK, c, (lane + nw % LANES) % LANES);
    // Tree: after level k, lane u (a multiple of 2^(k+1)) holds the raw CRC
    // of lanes u..u + 2^(k+1) - 1 in round order, which span 8 * 2^(k+1)
    // bytes per round: left is shifted by the right half's 8 * 2^k bytes.
    // Lanes whose partner is past lane 31 compute unused values.
    const int shift_tab[5] = {TAB_S8, TAB_S16, TAB_S32, TAB_S64, TAB_S128};
#pragma unroll
    for (int k = 0; k < 5; ++k) {
        const uint32_t right = __shfl_down_sync(FULL_MASK, c, 1u << k);
        c = shift4(tab, shift_tab[k], c) ^ right;
    }
    return c;
}

// Raw CRC of m consecutive chunks of CHUNK_BYTES each whose raw CRCs are
// crcs[0..m) (whole warp; valid in lane 0). Leading zero chunks do not
// change a raw CRC, so the m values are padded in front to 32 * g (g a
// power of two >= 4): lane t combines virtual chunks [t*g, t*g + g) in four
// independent Horner runs of g/4 (S_CHUNK_BYTES by tables), joins them, and
// a shuffle tree joins the lanes (shifts of CHUNK_BYTES * g * 2^k bytes).
__device__ uint32_t combine_chunks(const Tables& tab, const uint32_t* crcs, uint64_t m, uint32_t lane) {
    if (m == 0) return 0;
    uint32_t lg = 2;  // g = 2^lg values per lane
    while ((uint64_t(LANES) << lg) < m) ++lg;
    const uint64_t g = uint64_t(1) << lg, q = g / 4, lead = uint64_t(LANES) * g - m;
    uint32_t acc[4] = {0, 0, 0, 0};
    for (uint64_t j = 0; j < q; ++j) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const uint64_t v = lane * g + s * q + j;  // virtual index; real = v - lead
            const uint32_t x = v >= lead ? __ldcg(crcs + (v - lead)) : 0;
            acc[s] = shift4(tab, TAB_SCHUNK, acc[s]) ^ x;
        }
    }
    // Each run spans CHUNK_BYTES * q bytes: x^(8 * CHUNK_BYTES * 2^(lg-2)).
    const uint32_t run_op = kX2n[(LOG2_CHUNK_BITS + lg - 2) % 31];
    uint32_t c = acc[0];
    for (int s = 1; s < 4; ++s) c = multmodp(run_op, c) ^ acc[s];
    for (uint32_t k = 0; k < 5; ++k) {
        const uint32_t right = __shfl_down_sync(FULL_MASK, c, 1u << k);
        c = multmodp(kX2n[(LOG2_CHUNK_BITS + lg + k) % 31], c) ^ right;  // span CHUNK_BYTES * g * 2^k
    }
    return c;
}

// Called by the warp that finished an item's last task: every chunk CRC of
// the item is in chunk_crcs[0..n). Writes the item's standard CRC32C.
__device__ void finish_item(const Tables& tab, const TuttiCrcItem& it, const Layout& l, const uint32_t* chunk_crcs,
                            uint32_t n, uint32_t* out, uint32_t lane) {
    // Chunks 0..n-2 have CHUNK_WORDS words each; the last has the rest.
    const uint64_t full = n - 1;
    const uint32_t front = combine_chunks(tab, chunk_crcs, full, lane);
    if (lane != 0) return;
    const uint64_t last_words = l.words - full * CHUNK_WORDS;
    const uint32_t body = multmodp(x8nmodp(last_words * WORD_BYTES), front) ^ __ldcg(chunk_crcs + full);
    // The standard register: 0xFFFFFFFF, then head bytes, then the words
    // (register shifted over them, xor their raw CRC), then tail bytes.
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(it.ptr);
    uint32_t r = 0xFFFFFFFFu;
    for (uint64_t k = 0; k < l.head; ++k) r = fold_byte(tab, r, bytes[k]);
    r = multmodp(x8nmodp(l.words * WORD_BYTES), r) ^ body;
    const uint8_t* tail = bytes + l.head + l.words * WORD_BYTES;
    for (uint64_t k = 0; k < l.tail; ++k) r = fold_byte(tab, r, tail[k]);
    *out = ~r;
}

// One launch: items[0..nitems) in, out[i] = CRC32C of item i. first_task
// has nitems + 1 entries (see "The split"; first_task[nitems] = ntasks);
// chunk_crcs has ntasks entries of scratch; done has nitems counters, zero
// at launch. blockDim.x must be a multiple of 32; any grid size works
// (warps stride over the tasks).
extern "C" __global__ void __launch_bounds__(256)
    tutti_crc32c(const TuttiCrcItem* items, const uint32_t* first_task, uint32_t nitems, uint32_t ntasks,
                 uint32_t* chunk_crcs, uint32_t* done, uint32_t* out) {
    __shared__ uint32_t tab[NTAB][256];
    __shared__ uint32_t basis[NTAB][8];
    __shared__ uint32_t op[NTAB];
    build_tables(tab, basis, op);

    const uint32_t lane = threadIdx.x % LANES;
    const uint64_t nwarps = uint64_t(gridDim.x) * (blockDim.x / LANES);
    for (uint64_t task = uint64_t(blockIdx.x) * (blockDim.x / LANES) + threadIdx.x / LANES; task < ntasks;
         task += nwarps) {
        // The item: the last i with first_task[i] <= task (first_task is
        // strictly increasing: every item has at least one task).
        uint32_t lo = 0, hi = nitems - 1;
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo + 1) / 2;
            if (first_task[mid] <= task) lo = mid; else hi = mid - 1;
        }
        const TuttiCrcItem it = items[lo];
        const Layout l = layout_of(it);
        const uint32_t first = first_task[lo], n = first_task[lo + 1] - first;
        const uint64_t j = task - first;  // chunk index in the item
        const uint64_t before = j * CHUNK_WORDS;
        const uint64_t left = l.words > before ? l.words - before : 0;  // words from this chunk on
        const uint32_t nw = left < CHUNK_WORDS ? uint32_t(left) : CHUNK_WORDS;
        const uint2* chunk = reinterpret_cast<const uint2*>(it.ptr + l.head) + before;
        const uint32_t c = chunk_crc(tab, chunk, nw, lane);

        // Publish the chunk CRC, then count it: the fence orders the store
        // before the count for whichever warp reads the count last.
        uint32_t prior = 0;
        if (lane == 0) {
            chunk_crcs[task] = c;
            __threadfence();
            prior = atomicAdd(done + lo, 1u);
        }
        prior = __shfl_sync(FULL_MASK, prior, 0);
        if (prior == n - 1) {
            // Last chunk of the item: every other chunk's store happened
            // before its count; this fence orders our loads after ours
            // (loads go to L2 with __ldcg, past a possibly stale L1).
            __syncwarp();
            __threadfence();
            finish_item(tab, it, l, chunk_crcs + first, n, out + lo, lane);
        }
    }
}
