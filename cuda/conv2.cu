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
// conv_kernel2 (sm_90a): the same GEMM on Hopper's warpgroup MMA (wgmma), 3xTF32;
//   block 2 warpgroups, each one m64nBNk8 tile of 16 pool windows x 4 positions (rows (window, dx)
//   for dy = 0, 1 per thread; the pool adds the partner lane's dx = 1 by shuffles, as fused_kernel3);
//   BN 16, 32 or 64; w pre-split by the host into TF32 parts and remainders as wgmma's K-major core
//   matrices, (C_OUT / BN, KP / 8, {hi, lo}, BN / 8, 2, 8, 4), KP = KTOT rounded up to BK, read by
//   the tensor cores from shared memory; A gathered as in version 1 and split in registers; k-tiles
//   of 32 (-D CONV_BK=32; 16 works too) through a 3-stage cp.async pipeline fetched 1 ahead (16: 4
//   stages, 2 ahead), so the stage refilled was last read two tiles back and no wgmma is drained for
//   it; 256 k summed in the tensor cores, then added in FP32. Grid (ceil(windows / 32), ceil(C_OUT /
//   BN)); 2 * 3 * 4 * windows * BN * KP tensor FLOPs per column block. Tiles of 32 halve the barriers
//   and copies per product: 64x64x1's conv2 (2,000 images) 1.82 -> 1.55 ms, the same bits.

#include "conv_geometry.cuh"

constexpr int BW = 32;            // pool windows per block: 16 per warpgroup
constexpr int ROWS = 4 * BW;      // row 64 wg + 16 w + 8 dy + g: window 16 wg + 4 w + g / 2, dx = g % 2
// k-tiles of 16 through 4 stages fetched 2 ahead, or of 32 through 3 fetched 1 ahead (two blocks an
// SM either way); 256 k summed in the tensor cores, then added in FP32, whatever the tile
constexpr int STAGES = BK == 16 ? 4 : 3, AHEAD = STAGES - 2, KCH = 256 / BK;
constexpr int KP = (KTOT + BK - 1) / BK * BK;
constexpr int A_FLOATS = ROWS * AST, B_FLOATS = 2 * BK * BN, STAGE_FLOATS = A_FLOATS + B_FLOATS;
static_assert(BN == 16 || BN == 32 || BN == 64, "conv v2: BN is 16, 32 or 64");

#include "conv_gather.cuh"

#include "conv_epilogue.cuh"

extern "C" __global__ void __launch_bounds__(THREADS, 2)
conv_kernel2(const float* __restrict__ x, const float* __restrict__ wf, float* __restrict__ out, int n) {
    extern __shared__ float4 smem4[];
    int* rowbase = reinterpret_cast<int*>(smem4);  // ROWS ints, then the pipeline stages
    float* stages = reinterpret_cast<float*>(smem4) + ROWS;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tig = lane % 4;
    const int wg = warp / 4, w = warp % 4;  // warpgroup and warp in it
    const int total = n * WINDOWS, w0 = blockIdx.x * BW;
    const float* wb = wf + (size_t)blockIdx.y * KP * 2 * BN;  // this column block's weights

    for (int p = t; p < ROWS; p += THREADS) {
        const int r = p % 64, gg = r % 8;
        const int win = w0 + 16 * (p / 64) + 4 * (r / 16) + gg / 2;
        const int img = win / WINDOWS, rem = win % WINDOWS;
        const int oh = 2 * (rem / PW) + (r % 16) / 8, ow = 2 * (rem % PW) + gg % 2;
        rowbase[p] = win < total ? ((img * IN_H + oh) * IN_W + ow) * IN_C : -1;
    }
    __syncthreads();

    auto fetch = [&](int tile) {
        float* stage = stages + (tile % STAGES) * STAGE_FLOATS;
        fetch_a(stage, rowbase, x, tile * BK);
        const float4* src = reinterpret_cast<const float4*>(wb + (size_t)tile * B_FLOATS);
        for (int e = t; e < B_FLOATS / 4; e += THREADS) cp_async16(stage + A_FLOATS + 4 * e, src + e, true);
    };

    float acc[1][BN / 2];
    mma3_k_loop<BN, BK, STAGES, KCH, AST, A_FLOATS, STAGE_FLOATS, AHEAD>(acc, stages, (64 * wg + 16 * w + g) * AST + tig, KP / BK, fetch);

    const int win = w0 + 16 * wg + 4 * w + g / 2;
    store_pooled(acc[0], out, win, win < total);
}
