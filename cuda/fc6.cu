// The classifier in one kernel, as fc.cu's fc_kernel5 (the same inputs, outputs, z_out and count):
// fc1 (FEAT -> HIDDEN) -> ReLU -> fc2 (HIDDEN -> CLASSES) -> argmax, fc1 on Hopper's warpgroup MMA.
// in: features (n, FEAT) float32 (FEAT % 4 == 0: 16-byte rows); fc1 pre-split by the host into TF32
// parts and remainders as wgmma's K-major core matrices per column block of HIDDEN / 2 hidden units
// (operands.wgmma_column_blocks(fc1, HIDDEN / 2, 16): (2, KP / 8, 2, HIDDEN / 16, 2, 8, 4), KP = FEAT
// rounded up to 16, zero rows past FEAT); fc2 (HIDDEN, CLASSES) row-major.
// fc_kernel6 (sm_90a): block 2 warpgroups x 64 images (one m64 tile), warpgroup wg sums hidden units
//   [wg HIDDEN / 2, + HIDDEN / 2) as m64n(HIDDEN / 2)k8 tiles in 3xTF32 (wgmma.cuh's mma3_k_loop: A
//   from the staged features into registers, split there; B read by the tensor cores from shared
//   memory); k-tiles of 16 through a 4-stage cp.async pipeline fetched 2 ahead; 16 k-tiles summed in
//   the tensor cores, then added in FP32; then ReLU -> fc2 -> argmax as fc_kernel5. Grid (ceil(n / 64),
//   splits): where `partial` is given, block y sums features [y per_split, + per_split) into partial
//   (splits, n, HIDDEN) for fc_kernel3 (fc.cu) instead, as fc_kernel5 does; blocks past *count
//   return. 3 x 2 x FEAT x HIDDEN tensor FLOPs an image; fc1 read from L2 once a block (fc_kernel5:
//   once per 32 images, on mma.sync). Two blocks an SM, one for 256 hidden units.

#include "fc_epilogue.cuh"
#include "wgmma.cuh"

#ifndef SHARED_FLOATS
#error "fc v6 needs -DSHARED_FLOATS (launch.FullyConnectedWarpgroup.shared)"
#endif
constexpr int IMGS6 = 64, THREADS6 = 256, TK = 16, STAGES6 = 4, CHUNK6 = 16;
constexpr int COLS = HIDDEN / 2;  // a warpgroup's hidden units
constexpr int AST = TK + 4;       // feature rows 20 floats apart: the A fragments' loads hit 32 banks
constexpr int A_FLOATS = IMGS6 * AST, B_CB = 2 * TK * COLS, STAGE_FLOATS = A_FLOATS + 2 * B_CB;
constexpr int KP = (FEAT + TK - 1) / TK * TK;
static_assert(COLS == 32 || COLS == 64 || COLS == 128, "fc v6: 64, 128 or 256 hidden units (m64n32, n64 or n128 a warpgroup)");
constexpr int MIN_BLOCKS6 = COLS == 128 ? 1 : 2;  // 256 hidden units: two m64n128 sums a thread, 128 registers
static_assert(FEAT % 4 == 0, "fc v6: 16-byte feature rows");
static_assert(SHARED_FLOATS >= STAGES6 * STAGE_FLOATS && SHARED_FLOATS >= IMGS6 * (HID_STRIDE + CLASSES),
              "fc v6: the stages, then the hidden layer and the scores");

extern "C" __global__ void __launch_bounds__(THREADS6, MIN_BLOCKS6)
fc_kernel6(const float* __restrict__ feat, const float* __restrict__ w1f, const float* __restrict__ fc2,
           int* __restrict__ labels, int n, int* __restrict__ overflow, float* __restrict__ scores_out,
           float* __restrict__ z_out, const int* __restrict__ count, float* __restrict__ partial, int per_split) {
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tig = lane % 4;
    const int wg = warp / 4, w = warp % 4;
    const int live = count != nullptr ? min(n, *count) : n;  // the recomputed share: a count the GPU set
    const int img0 = blockIdx.x * IMGS6;
    if (img0 >= live) return;
    const int imgs = min(IMGS6, live - img0);

    // A k-tile: the 64 x 16 features, a float4 a thread; both column blocks' weights, B_CB / 1024 float4s
    // a thread each.
    static_assert(IMGS6 * TK / 4 == THREADS6 && B_CB % (4 * THREADS6) == 0, "fc v6: whole copies a thread");
    const int ai = t / (TK / 4), af = 4 * (t % (TK / 4));
    const float* a_src = feat + (size_t)(img0 + min(ai, imgs - 1)) * FEAT + af;
    const float* b_src = w1f + 4 * t;
    // This block's k-tiles: split blockIdx.y's per_split features, or all of them (per_split 0)
    const int t0 = per_split ? blockIdx.y * (per_split / TK) : 0;
    const int tiles = per_split ? min(KP / TK - t0, per_split / TK) : KP / TK;
    auto fetch = [&](int tile) {
        float* stage = smem + (tile % STAGES6) * STAGE_FLOATS;
        const int f0 = (t0 + tile) * TK;
        cp_async16(stage + ai * AST + af, a_src + f0, ai < imgs && f0 + af < FEAT);
#pragma unroll
        for (int cb = 0; cb < 2; ++cb)
#pragma unroll
            for (int r = 0; r < B_CB / (4 * THREADS6); ++r)
                cp_async16(stage + A_FLOATS + cb * B_CB + 4 * (t + r * THREADS6),
                           b_src + (size_t)cb * KP * 2 * COLS + (size_t)(t0 + tile) * B_CB + 4 * r * THREADS6, true);
    };

    float acc[1][COLS / 2];
    mma3_k_loop<COLS, TK, STAGES6, CHUNK6, AST, A_FLOATS, STAGE_FLOATS>(acc, smem, (16 * w + g) * AST + tig, tiles, fetch,
                                                                       wg * B_CB);
    if (partial != nullptr) {  // a split: its sums into partial (splits, n, HIDDEN), for fc_kernel3
#pragma unroll
        for (int c = 0; c < COLS / 8; ++c)
#pragma unroll
            for (int dy = 0; dy < 2; ++dy) {
                const int i = 16 * w + g + 8 * dy, h = wg * COLS + 8 * c + 2 * tig;
                if (i < imgs)
                    *reinterpret_cast<float2*>(partial + ((size_t)blockIdx.y * n + img0 + i) * HIDDEN + h) =
                        make_float2(acc[0][4 * c + 2 * dy], acc[0][4 * c + 2 * dy + 1]);
            }
        return;
    }
    __syncthreads();  // both warpgroups are done with the stages: the hidden layer and the scores reuse them

    // Accumulator 4c + 2dy + e: image 16 w + g + 8 dy, hidden unit wg COLS + 8 c + 2 tig + e.
    float* xh = smem;
    float* scores = smem + IMGS6 * HID_STRIDE;
#pragma unroll
    for (int c = 0; c < COLS / 8; ++c)
#pragma unroll
        for (int dy = 0; dy < 2; ++dy) {
            const int i = 16 * w + g + 8 * dy, h = wg * COLS + 8 * c + 2 * tig;
            const float2 v = make_float2(acc[0][4 * c + 2 * dy], acc[0][4 * c + 2 * dy + 1]);
            xh[i * HID_STRIDE + h] = relu(v.x);
            xh[i * HID_STRIDE + h + 1] = relu(v.y);
            if (z_out != nullptr && i < imgs) *reinterpret_cast<float2*>(z_out + (size_t)(img0 + i) * HIDDEN + h) = v;
        }
    __syncthreads();
    fc2_argmax<IMGS6, THREADS6>(fc2, labels, img0, imgs, overflow, scores_out, xh, scores);
}
