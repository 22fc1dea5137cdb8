// What conv_kernel1 and conv_kernel2 share once their block layout is set (ROWS, STAGES,
// STAGE_FLOATS, AST, VEC_A from the including kernel): the host's shared memory checked against it,
// and the implicit im2col, a k-tile of the block's ROWS GEMM rows gathered from x into shared memory.
#pragma once

#ifndef SHARED_FLOATS
#error "conv: the host passes the dynamic shared memory it gives a block as -DSHARED_FLOATS"
#endif
static_assert(ROWS + STAGES * STAGE_FLOATS == SHARED_FLOATS, "conv: the host's shared memory (launch.Conv) differs from the kernel's");

static_assert(PH >= 1 && PW >= 1, "conv: the pooled output is empty");

// Gather the k-tile [k0, k0 + BK) of the block's ROWS GEMM rows into as (row stride AST), zeros past
// KTOT and for rows past the last window (rowbase -1).
__device__ __forceinline__ void fetch_a(float* as, const int* rowbase, const float* __restrict__ x, int k0) {
    const int t = threadIdx.x;
    if (VEC_A) {  // 4 consecutive channels of one (kh, kw) per copy; a thread's k group is fixed
        constexpr int QUADS = BK / 4;  // copies a row
        const int r = k0 + 4 * (t % QUADS), off = k_offset(r);
#pragma unroll
        for (int i = 0; i < ROWS * QUADS / THREADS; ++i) {
            const int row = t / QUADS + i * (THREADS / QUADS), base = rowbase[row];
            const bool ok = base >= 0 && r < KTOT;
            cp_async16(as + row * AST + 4 * (t % QUADS), ok ? x + base + off : x, ok);
        }
    } else {
        const int r = k0 + t % BK, off = k_offset(r);
#pragma unroll 4
        for (int i = 0; i < ROWS * BK / THREADS; ++i) {
            const int row = t / BK + i * (THREADS / BK), base = rowbase[row];
            const bool ok = base >= 0 && r < KTOT;
            cp_async4(as + row * AST + t % BK, ok ? x + base + off : x, ok);
        }
    }
}
