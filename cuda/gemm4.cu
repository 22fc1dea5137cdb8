// The classic pipeline's GEMM, for both convolutions and both fcs.
// c (M, N) = a (M, K) . b (K, N), all row-major float32; apply_relu != 0 applies ReLU on store.
// conv: a = weights re-laid (C_out, K*K*C), b = unrolled input (K*K*C, P) -> c (C_out, P)
//   (version 4 the transposed product: a = unrolled input (P, K*K*C), b = weights -> c (P, C_out))
// fc:   a = features (n, in), b = weights (in, out) -> c (n, out)
// 2*M*N*K FLOPs in every version; TILE_WIDTH (-D) is the block tile, the dynamic shared memory
// (SHARED_FLOATS, -D from the host's launch.Gemm) is static_asserted against the kernel's stages.
// gemm_kernel4 (sm_90a): the transposed conv product on Hopper's wgmma in 3xTF32: a = activations
//   (M, K) row-major (the unroll_kernel3 matrix (P, K*K*C), or the fc features), b = weights (K, N)
//   split into TF32 parts and remainders once by the host and laid out as wgmma's K-major core
//   matrices per column block, (N / BN, KP / 8, {hi, lo}, BN / 8, 2, 8, 4), KP = K rounded up to 16;
//   so a conv's c (P, C_out) is already NHWC and needs no placeIntoY. Block 128 rows x BN (16, 32,
//   64: GEMM_BN) = two warpgroups of one m64nBNk8 tile each, a split in registers, k-tiles of 16
//   through a 4-stage cp.async pipeline fetched 2 ahead, KCH k-tiles summed in the tensor cores
//   then added in FP32 (as conv_kernel2); grid (ceil(M / 128), ceil(N / BN)); 6 * M * BN * KP tensor
//   FLOPs per column block.

#include "gemm_store.cuh"

#ifndef GEMM_BN
#error "gemm v4: the host passes the column block as -DGEMM_BN"
#endif
constexpr int BN = GEMM_BN;
static_assert(TM == 128, "gemm v4: block tiles are 128 rows (two warpgroups of 64)");
static_assert(BN == 16 || BN == 32 || BN == 64, "gemm v4: GEMM_BN is 16, 32 or 64");

#include "wgmma.cuh"

// Block tile rows 64 wg + 16 w + g (+ 8) belong to warp w of warpgroup wg; stage = a tile (k
// contiguous, rows AST apart: conflict-free fragment loads) then the k-tile's hi/lo weights.
constexpr int STAGES = 4, KCH = 16, AST = BK + 4;
constexpr int A_FLOATS = TM * AST, B_FLOATS = 2 * BK * BN, STAGE_FLOATS = A_FLOATS + B_FLOATS;
#ifndef SHARED_FLOATS
#error "gemm: the host passes the dynamic shared memory it gives a block as -DSHARED_FLOATS"
#endif
static_assert(STAGES * STAGE_FLOATS == SHARED_FLOATS, "gemm: the host's shared memory (launch.Gemm) differs from the kernel's stages");

// Start the async copy of k-tile `tile` of a (zeros past M and K) and of the column block's weights.
__device__ __forceinline__ void fetch(float* stage, const float* __restrict__ a, const float* __restrict__ wb,
                                      int M, int K, int m0, int tile) {
    const int t = threadIdx.x, k0 = tile * BK;
    if (K % 4 == 0) {  // rows start 16-byte aligned: 4 consecutive k per copy
#pragma unroll
        for (int i = 0; i < TM * BK / 4 / THREADS; ++i) {
            const int e = t + i * THREADS, row = e / (BK / 4), k = 4 * (e % (BK / 4));
            const bool ok = m0 + row < M && k0 + k < K;
            cp_async16(stage + row * AST + k, ok ? a + (size_t)(m0 + row) * K + k0 + k : a, ok);
        }
    } else {
#pragma unroll 1  // the rare path (fc with K % 4 != 0), rolled: unrolled it spills at BN 64
        for (int i = 0; i < TM * BK / THREADS; ++i) {
            const int e = t + i * THREADS, row = e / BK, k = e % BK;
            const bool ok = m0 + row < M && k0 + k < K;
            cp_async4(stage + row * AST + k, ok ? a + (size_t)(m0 + row) * K + k0 + k : a, ok);
        }
    }
    const float4* src = reinterpret_cast<const float4*>(wb + (size_t)tile * B_FLOATS);
#pragma unroll
    for (int e = t; e < B_FLOATS / 4; e += THREADS) cp_async16(stage + A_FLOATS + 4 * e, src + e, true);
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
gemm_kernel4(const float* __restrict__ a, const float* __restrict__ wf, float* __restrict__ c,
             int M, int N, int K, int apply_relu) {
    extern __shared__ float4 smem4[];
    float* stages = reinterpret_cast<float*>(smem4);
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tig = lane % 4;
    const int wg = warp / 4, w = warp % 4;
    const int m0 = blockIdx.x * TM, tiles = (K + BK - 1) / BK;
    const float* wb = wf + (size_t)blockIdx.y * tiles * B_FLOATS;  // this column block's weights

    float acc[1][BN / 2];
    mma3_k_loop<BN, BK, STAGES, KCH, AST, A_FLOATS, STAGE_FLOATS>(
        acc, stages, (64 * wg + 16 * w + g) * AST + tig, tiles,
        [&](int tile) { fetch(stages + (tile % STAGES) * STAGE_FLOATS, a, wb, M, K, m0, tile); });
    // Accumulators 4 j + {0, 1}: row g, columns 8 j + 2 tig + {0, 1}; 4 j + {2, 3}: row g + 8.
    const int row = m0 + 64 * wg + 16 * w + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            store_row(c, M, N, row + 8 * h, blockIdx.y * BN + 8 * j + 2 * tig, &acc[0][4 * j + 2 * h], 2, apply_relu);
}
