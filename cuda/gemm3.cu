// The classic pipeline's GEMM, for both convolutions and both fcs.
// c (M, N) = a (M, K) . b (K, N), all row-major float32; apply_relu != 0 applies ReLU on store.
// conv: a = weights re-laid (C_out, K*K*C), b = unrolled input (K*K*C, P) -> c (C_out, P)
//   (version 4 the transposed product: a = unrolled input (P, K*K*C), b = weights -> c (P, C_out))
// fc:   a = features (n, in), b = weights (in, out) -> c (n, out)
// 2*M*N*K FLOPs in every version; TILE_WIDTH (-D) is the block tile, the dynamic shared memory
// (SHARED_FLOATS, -D from the host's launch.Gemm) is static_asserted against the kernel's stages.
// gemm_kernel3 (sm_80+): the same block tiles on the tensor cores in 3xTF32 (FP32-level accuracy):
//   8 warps of (TW/2 or 32) x (32 or 16) warp tiles of mma.m16n8k8, k-tiles of 16 through a
//   3-stage cp.async pipeline (zero-filled past the edges), operands split at fragment load.

#include "gemm_store.cuh"

constexpr int BN = 128;
static_assert(TM == 32 || TM == 64 || TM == 128, "gemm: block tiles are 32, 64 or 128 rows");

#include "mma.cuh"

constexpr int STAGES = 3;
constexpr int WARPS_M = TM >= 64 ? 2 : 1, WARPS_N = 8 / WARPS_M;
constexpr int WTM = TM / WARPS_M, WTN = BN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
// Row strides of the a tile (k contiguous) and b tile (n contiguous): BK + 4 and BN + 8 floats put
// the 32 lanes' fragment loads on 32 different banks.
constexpr int AST = BK + 4, BST = BN + 8;
constexpr int A_FLOATS = TM * AST, STAGE_FLOATS = A_FLOATS + BK * BST;
#ifndef SHARED_FLOATS
#error "gemm: the host passes the dynamic shared memory it gives a block as -DSHARED_FLOATS"
#endif
static_assert(STAGES * STAGE_FLOATS == SHARED_FLOATS, "gemm: the host's shared memory (launch.Gemm) differs from the kernel's stages");

// Start the async copy of k-tile k0 of a and b into one pipeline stage (zeros past the edges).
__device__ __forceinline__ void fetch(float* stage, const float* __restrict__ a, const float* __restrict__ b,
                                      int M, int N, int K, int m0, int n0, int k0) {
    const int t = threadIdx.x;
    float* as = stage;
    float* bs = stage + A_FLOATS;
#pragma unroll
    for (int i = 0; i < TM * BK / THREADS; ++i) {
        const int e = t + i * THREADS, row = e / BK, k = e % BK;
        const bool ok = m0 + row < M && k0 + k < K;
        cp_async4(as + row * AST + k, ok ? a + (size_t)(m0 + row) * K + k0 + k : a, ok);
    }
    if (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < BK * BN / 4 / THREADS; ++i) {
            const int e = t + i * THREADS, k = e / (BN / 4), col = 4 * (e % (BN / 4));
            const bool ok = k0 + k < K && n0 + col < N;
            cp_async16(bs + k * BST + col, ok ? b + (size_t)(k0 + k) * N + n0 + col : b, ok);
        }
    } else {
#pragma unroll
        for (int i = 0; i < BK * BN / THREADS; ++i) {
            const int e = t + i * THREADS, k = e / BN, col = e % BN;
            const bool ok = k0 + k < K && n0 + col < N;
            cp_async4(bs + k * BST + col, ok ? b + (size_t)(k0 + k) * N + n0 + col : b, ok);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_kernel3(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
             int M, int N, int K, int apply_relu) {
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, tig = lane % 4;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * BN;
    const int tiles = (K + BK - 1) / BK;

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) fetch(smem + s * STAGE_FLOATS, a, b, M, N, K, m0, n0, s * BK);
        cp_async_commit();
    }
    for (int tile = 0; tile < tiles; ++tile) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of k-tile `tile` have landed
        __syncthreads();              // everyone's have, and everyone is done with tile - 1's stage
        const int next = tile + STAGES - 1;
        if (next < tiles) fetch(smem + (next % STAGES) * STAGE_FLOATS, a, b, M, N, K, m0, n0, next * BK);
        cp_async_commit();
        const float* as = smem + (tile % STAGES) * STAGE_FLOATS + (wm * WTM + g) * AST + tig;
        const float* bs = smem + (tile % STAGES) * STAGE_FLOATS + A_FLOATS + tig * BST + wn * WTN + g;
#pragma unroll
        for (int ks = 0; ks < BK; ks += 8) {
            unsigned bhi[NT][2], blo[NT][2];
            b_fragments(bs + ks * BST, BST, bhi, blo);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                unsigned ahi[4], alo[4];
                a_fragment(as + i * 16 * AST + ks, AST, ahi, alo);
#pragma unroll
                for (int j = 0; j < NT; ++j) mma3_add(acc[i][j], ahi, alo, bhi[j][0], bhi[j][1], blo[j][0], blo[j][1]);
            }
        }
    }
    cp_async_wait<0>();
    // Accumulator r of tile (i, j): row g (r < 2) or g + 8, column 2 * tig + r % 2.
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                store_row(c, M, N, m0 + wm * WTM + i * 16 + g + 8 * h, n0 + wn * WTN + j * 8 + 2 * tig,
                          &acc[i][j][2 * h], 2, apply_relu);
}
