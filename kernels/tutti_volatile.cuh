// tutti_volatile.cuh: the volatile loads and stores that tutti_io.cu and
// tutti_null.cu make on memory another agent (the host, a controller, the
// other kernel) reads or writes while they run: queue entries, doorbells,
// per-slot completion cells. Each is one ld.volatile / st.volatile of its
// width (the 8-byte ones single-copy atomic when naturally aligned); none
// orders anything by itself: the callers place the fences.
// store_volatile_u64 has two forms: an 8-byte value (tutti_io), and two
// dwords stored as one 8-byte access (tutti_null's CQE DW2 and DW3).

#pragma once

#include <stdint.h>

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* p) {
    return *(const volatile uint32_t*)p;
}

__device__ __forceinline__ void store_volatile(uint32_t* p, uint32_t v) {
    *(volatile uint32_t*)p = v;
}

__device__ __forceinline__ void store_volatile_u64(unsigned long long* p, unsigned long long v) {
    *(volatile unsigned long long*)p = v;
}

__device__ __forceinline__ unsigned long long load_volatile_u64(const unsigned long long* p) {
    return *(const volatile unsigned long long*)p;
}

// One 16-byte store (4 of them write an SQE: fewer, larger PCIe writes).
__device__ __forceinline__ void store_volatile_v4(uint32_t* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}

// One 16-byte load (four dwords of an SQE).
__device__ __forceinline__ uint4 load_volatile_v4(const uint32_t* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// One 8-byte store, single-copy atomic (naturally aligned): a CQE's DW2
// and DW3 written together, so a host that reads them together (the I/O
// kernel's reaper) sees the phase tag with its body.
__device__ __forceinline__ void store_volatile_u64(uint32_t* p, uint32_t lo, uint32_t hi) {
    unsigned long long v = (unsigned long long)lo | ((unsigned long long)hi << 32);
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
