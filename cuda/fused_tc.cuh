// What fused_kernel2, 3 and 4 share: conv2 on the tensor cores over 16-window m-tiles, w2 slabs
// (TF32 parts and remainders) fetched with cp.async (version 4 fetches its own float16 slabs).
#pragma once
#include "fused_common.cuh"

constexpr int WINDOWS = P2H * P2W;  // pooled outputs per image: 16 of them make an m-tile's rows
constexpr int KSTEPS = C1 / 8;
constexpr int SLAB2 = 2 * SLAB;  // TF32 parts and remainders of one (kh, kw) slab
constexpr int STEPS = WINDOWS / 16 * K2 * K2;  // (group of 16 windows, kh, kw)

static_assert(WINDOWS % 16 == 0 && C1 % 8 == 0, "fused v2/v3: tile shapes");
static_assert(SLAB2 % (4 * FUSED_THREADS) == 0, "fused v2/v3: w2 slab must split into 16 bytes per thread");

#include "mma.cuh"

// Start copying slab s of w2f into shared memory at dst (16 bytes per thread per round, async).
// FLOATS: a slab's size (version 4's float16 slabs are smaller).
template <int FLOATS = SLAB2>
__device__ __forceinline__ void fetch_slab(float4* dst, const float4* __restrict__ w2f, int s) {
    const float4* src = w2f + (size_t)s * (FLOATS / 4);
#pragma unroll
    for (int i = 0; i < FLOATS / 4 / FUSED_THREADS; ++i) {
        const int e = threadIdx.x + i * FUSED_THREADS;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(dst + e)), "l"(src + e));
    }
    asm volatile("cp.async.commit_group;");
}
