// One convolution layer of a multiple of 32 input channels as conv_kernel2's implicit GEMM, with ReLU and
// the 2x2 average pool in the epilogue: out (n, OH/2, OW/2, C_OUT) = pool(relu(conv(x, w))).
// in: x (n, IN_H, IN_W, IN_C) float32 NHWC, 16-byte aligned; w as conv_kernel2 reads it (the host's
// wgmma_column_blocks for column blocks of BN channels, k-tiles of BK). Shapes, BN (16, 32, 64), BK and
// SPAN_PIX (below), CONV_STAGES arrive as -D options.
// conv_kernel4 (sm_90a): conv_kernel2's rows, k order, 3xTF32 products and sums, so the same bits, but
//   its A read from a stretch of x staged once a block: conv_kernel2 is bound by the latency of its
//   instruction stream, 300 instructions a warp a k-tile of which the gather of the next A tile (row
//   table loads, k offsets, predicated addresses, 16-byte copies) is about half (ncu source counters,
//   64x64x1's conv2). Block 256 threads, 32 pool windows as conv_kernel2; the SPAN_PIX pixels from its
//   first window's top-left one (the host's bound over every block) copied 16 bytes at a time, pixels
//   IN_C + 4 floats apart (an odd number of 16-byte pieces: the 8 adjacent pixels of a fragment's rows
//   on 8 different groups of 4 banks), so a k8 step's A loads are one address a thread plus constants;
//   the weights' k-tiles through STAGES fetched STAGES - 2 ahead (BK 32 and 3, else 16 and 4 or 3:
//   launch.Conv.pipeline), their descriptors made once. Reads SPAN_PIX * IN_C + KTOT * 2 * BN floats a
//   block (conv_kernel2: 128 * KTOT more); 2 * 3 * 128 * BN * KTOT tensor FLOPs a block.

#include "conv_epilogue.cuh"

#if !defined(SPAN_PIX) || !defined(SHARED_FLOATS) || !defined(CONV_STAGES)
#error "conv_kernel4: the host passes SPAN_PIX (launch.Conv.span_pixels), CONV_STAGES and SHARED_FLOATS as -D options"
#endif

constexpr int BW = 32;  // pool windows a block: 16 per warpgroup, rows as conv_kernel2's
constexpr int STAGES = CONV_STAGES, AHEAD = STAGES - 2, KCH = 256 / BK;
constexpr int B_FLOATS = 2 * BK * BN;
constexpr int PIX = IN_C + 4, SPAN_FLOATS = SPAN_PIX * PIX;
constexpr int TAP_TILES = IN_C / BK;  // k-tiles a tap (kh, kw)
static_assert(IN_C % 32 == 0, "conv v4: a multiple of 32 input channels (whole k-tiles a tap)");
static_assert(BN == 16 || BN == 32 || BN == 64, "conv v4: BN is 16, 32 or 64");
static_assert(SPAN_PIX >= KS * IN_W + KS + 1, "conv v4: the span holds a window's inputs");
static_assert(SPAN_FLOATS + STAGES * B_FLOATS == SHARED_FLOATS, "conv v4: the host's shared memory (launch.Conv) differs from the kernel's");

// The pixel index in x of window win's top-left input.
__device__ __forceinline__ int window_pixel(int win) {
    const int img = win / WINDOWS, rem = win % WINDOWS;
    return (img * IN_H + 2 * (rem / PW)) * IN_W + 2 * (rem % PW);
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
conv_kernel4(const float* __restrict__ x, const float* __restrict__ wf, float* __restrict__ out, int n) {
    extern __shared__ float4 smem4[];
    float* span = reinterpret_cast<float*>(smem4);
    float* stages = span + SPAN_FLOATS;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tig = lane % 4;
    const int wg = warp / 4, w = warp % 4;
    const int total = n * WINDOWS, w0 = blockIdx.x * BW, pixels = n * IN_H * IN_W;
    const int p0 = window_pixel(w0);
    const float* wb = wf + (size_t)blockIdx.y * KTOT * 2 * BN;  // this column block's weights

    constexpr int PIECES = IN_C / 4;  // 16-byte pieces a pixel; zeros past x's last pixel
    for (int e = t; e < SPAN_PIX * PIECES; e += THREADS) {
        const int p = e / PIECES, c = 4 * (e % PIECES);
        const bool ok = p0 + p < pixels;
        cp_async16(span + p * PIX + c, ok ? x + (size_t)(p0 + p) * IN_C + c : x, ok);
    }
    cp_async_commit();  // landed by the k loop's first tile

    auto fetch = [&](int tile) {
        float* stage = stages + (tile % STAGES) * B_FLOATS;
        const float4* src = reinterpret_cast<const float4*>(wb + (size_t)tile * B_FLOATS);
        if constexpr (B_FLOATS / 4 % THREADS == 0) {
#pragma unroll
            for (int i = 0; i < B_FLOATS / 4 / THREADS; ++i) cp_async16(stage + 4 * (t + i * THREADS), src + t + i * THREADS, true);
        } else {
            for (int e = t; e < B_FLOATS / 4; e += THREADS) cp_async16(stage + 4 * e, src + e, true);
        }
    };
    // This thread's rows: window win, dx = g % 2, dy = 0 and 1 (a0, a0 + IN_W pixels); a window past the
    // last reads from pixel 0 (its sums are never stored)
    const int win = w0 + 16 * wg + 4 * w + g / 2;
    const bool valid = win < total;
    const float* a0 = span + (valid ? window_pixel(win) + g % 2 - p0 : 0) * PIX + tig;
    auto load_a = [&](const float*, int tile, int ks, float (&av)[4]) {
        const int tap = tile / TAP_TILES, c = tile % TAP_TILES * BK + 8 * ks;  // the same in every thread
        const float* a = a0 + ((tap / KS) * IN_W + tap % KS) * PIX + c;
        av[0] = a[0];
        av[1] = a[IN_W * PIX];
        av[2] = a[4];
        av[3] = a[IN_W * PIX + 4];
    };
    float acc[1][BN / 2];
    mma3_k_loop_with<BN, BK, STAGES, KCH, 0, B_FLOATS, AHEAD, true>(acc, stages, KTOT / BK, fetch, load_a);
    store_pooled(acc[0], out, win, valid);
}
