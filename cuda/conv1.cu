// One convolution layer of any geometry as an implicit GEMM on the tensor cores, with ReLU and the
// 2x2 average pool in the epilogue: out (n, OH/2, OW/2, C_OUT) = pool(relu(conv(x, w))), NHWC.
// in: x (n, IN_H, IN_W, IN_C) float32 NHWC; w (KS, KS, IN_C, C_OUT) read as (KTOT, C_OUT) row-major,
// KTOT = KS*KS*IN_C; valid convolution, stride 1; an odd last conv row or column (which the pool
// floors away) is never computed. Shapes and BN (32, 64, 128) arrive as -D options.
// GEMM view: rows = conv outputs, grouped as (pool window, position in the window); columns = output
// channels; k = (kh, kw, c), gathered from x through a per-row base offset plus a per-k offset
// (the im2col is the addressing, nothing is unrolled in memory).
// The dynamic shared memory (SHARED_FLOATS, -D from the host's launch.Conv) is static_asserted
// against the kernel's row table and stages.
// conv_kernel1 (sm_80+): 3xTF32 (FP32-level accuracy); block 256 threads = 8 warps, (8 / (BN/32)) x
//   (BN/32) warps; a warp owns 16 pool windows x 32 channels as 4 m-tiles (the 4 window positions)
//   x 4 n-tiles of mma.m16n8k8, so the pool is a sum of its own registers; k-tiles of 16 through a
//   cp.async pipeline (16-byte copies where IN_C % 4 == 0, zero-filled past the edges); grid
//   (ceil(windows / (16 * warps_m)), ceil(C_OUT / BN)); 2 * 4 * windows * C_OUT * KTOT FLOPs;
//   x read once per column block (through L1/L2, KS*KS-fold reuse), w once per block from L2.

#include "conv_geometry.cuh"

constexpr int WARPS_N = BN / 32, WARPS_M = 8 / WARPS_N;
constexpr int BW = 16 * WARPS_M;  // pool windows per block
constexpr int ROWS = 4 * BW;      // GEMM rows per block: row q * BW + w is position q of window w
constexpr int STAGES = BN == 32 ? 2 : 3;
constexpr int BST = BN + 8;
constexpr int A_FLOATS = ROWS * AST, STAGE_FLOATS = A_FLOATS + BK * BST;
constexpr bool VEC_B = C_OUT % 4 == 0;
static_assert(BN == 32 || BN == 64 || BN == 128, "conv: BN is 32, 64 or 128");

#include "conv_gather.cuh"

__device__ __forceinline__ void fetch(float* stage, const int* rowbase, const float* __restrict__ x,
                                      const float* __restrict__ w, int n0, int k0) {
    const int t = threadIdx.x;
    float* bs = stage + A_FLOATS;
    fetch_a(stage, rowbase, x, k0);
    if (VEC_B) {
        for (int e = t; e < BK * BN / 4; e += THREADS) {
            const int k = e / (BN / 4), col = 4 * (e % (BN / 4));
            const bool ok = k0 + k < KTOT && n0 + col < C_OUT;
            cp_async16(bs + k * BST + col, ok ? w + (size_t)(k0 + k) * C_OUT + n0 + col : w, ok);
        }
    } else {
        for (int e = t; e < BK * BN; e += THREADS) {
            const int k = e / BN, col = e % BN;
            const bool ok = k0 + k < KTOT && n0 + col < C_OUT;
            cp_async4(bs + k * BST + col, ok ? w + (size_t)(k0 + k) * C_OUT + n0 + col : w, ok);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
conv_kernel1(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out, int n) {
    extern __shared__ float4 smem4[];
    int* rowbase = reinterpret_cast<int*>(smem4);  // ROWS ints, then the pipeline stages
    float* stages = reinterpret_cast<float*>(smem4) + ROWS;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tig = lane % 4;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int total = n * WINDOWS, w0 = blockIdx.x * BW, n0 = blockIdx.y * BN;

    for (int p = t; p < ROWS; p += THREADS) {
        const int q = p / BW, win = w0 + p % BW;
        const int img = win / WINDOWS, rem = win % WINDOWS;
        const int oh = 2 * (rem / PW) + q / 2, ow = 2 * (rem % PW) + q % 2;
        rowbase[p] = win < total ? ((img * IN_H + oh) * IN_W + ow) * IN_C : -1;
    }
    __syncthreads();

    float acc[4][4][4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[q][j][r] = 0.0f;

    constexpr int TILES = (KTOT + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < TILES) fetch(stages + s * STAGE_FLOATS, rowbase, x, w, n0, s * BK);
        cp_async_commit();
    }
    for (int tile = 0; tile < TILES; ++tile) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = tile + STAGES - 1;
        if (next < TILES) fetch(stages + (next % STAGES) * STAGE_FLOATS, rowbase, x, w, n0, next * BK);
        cp_async_commit();
        const float* as = stages + (tile % STAGES) * STAGE_FLOATS + (wm * 16 + g) * AST + tig;
        const float* bs = stages + (tile % STAGES) * STAGE_FLOATS + A_FLOATS + tig * BST + wn * 32 + g;
#pragma unroll
        for (int ks = 0; ks < BK; ks += 8) {
            unsigned bhi[4][2], blo[4][2];
            b_fragments(bs + ks * BST, BST, bhi, blo);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                unsigned ahi[4], alo[4];
                a_fragment(as + q * BW * AST + ks, AST, ahi, alo);
#pragma unroll
                for (int j = 0; j < 4; ++j) mma3_add(acc[q][j], ahi, alo, bhi[j][0], bhi[j][1], blo[j][0], blo[j][1]);
            }
        }
    }
    cp_async_wait<0>();

    // Accumulator r of m-tile q: window g (r < 2) or g + 8, channel 2 * tig + r % 2; the pool sums
    // positions (0,0), (0,1), (1,0), (1,1) in that order, as the reference does.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int win = w0 + wm * 16 + g + 8 * h;
        if (win >= total) continue;
        float* dst = out + (size_t)win * C_OUT;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int ch = n0 + wn * 32 + j * 8 + 2 * tig;
            float o[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r = 2 * h + e;
                o[e] = (((relu(acc[0][j][r]) + relu(acc[1][j][r])) + relu(acc[2][j][r])) + relu(acc[3][j][r])) * 0.25f;
            }
            if (C_OUT % 2 == 0 && ch + 1 < C_OUT) {
                *reinterpret_cast<float2*>(dst + ch) = make_float2(o[0], o[1]);
            } else {
                if (ch < C_OUT) dst[ch] = o[0];
                if (ch + 1 < C_OUT) dst[ch + 1] = o[1];
            }
        }
    }
}
