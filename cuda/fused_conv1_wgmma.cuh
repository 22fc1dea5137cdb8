// Phases 0 and 1 of fused_kernel3 and fused_kernel4 (the same bits on both: the certified pass and
// the exact one differ from conv2 on): the block's images staged and checked, conv1 on wgmma in
// 3xTF32 -> ReLU -> 2x2 pool into p1. fused3.cu's opening comment has the tiling.
#pragma once
#include "fused_tc.cuh"

// conv1's k = (kh, kw, ci): k8 steps on the tensor cores, padded, except a tail of CONV1_TAIL (1 or
// 2) k past the last whole step, added on the FP32 cores (a k8 step of 3 MMAs for 1 of 8 useful k
// would cost more: ECE408's 5x5x1 is 3 steps + 1). The host chooses it (launch.Fused.conv1_steps).
#ifndef CONV1_TAIL
#error "fused v3/v4 needs -DCONV1_TAIL"
#endif
constexpr int K1K = K1 * K1 * IN_C;
constexpr int TAIL1 = CONV1_TAIL;
constexpr int KS1 = (K1K - TAIL1 + 7) / 8;
static_assert(TAIL1 >= 0 && TAIL1 <= 2 && KS1 >= 1, "fused v3/v4: conv1's tail is 0-2 k after at least one step");
#ifndef X_PAD
#error "fused v3/v4 needs -DX_PAD: where conv1's weights follow the images in the stage area"
#endif
constexpr int W1F_FLOATS = KS1 * 2 * 8 * C1 + TAIL1 * C1;
constexpr int WTILES1 = (IMGS * P1H * P1W + 63) / 64;  // conv1 m64 tiles of the block's pool windows

static_assert((IMGS == 4 || IMGS == 2) && FUSED_THREADS == 256, "fused v3/v4: two warpgroups of IMGS / 2 images each");
static_assert(C1 == 32, "fused v3/v4: N = C1 = 32 (wgmma.m64n32k8)");
static_assert(X_PAD >= X_FLOATS && X_PAD % 32 == 0, "fused v3/v4: conv1's weights after the images, 128-byte aligned");
static_assert(STAGE_FLOATS >= X_PAD + W1F_FLOATS, "fused v3/v4: the stage area must hold the images and conv1's weights");

// conv1's weights: the steps' split like w2, zero past k = K1K: (KS1, {hi, lo}, C1/8, 2, 8, 4); then
// the tail's as they are, (TAIL1, C1).
__constant__ float c_w1[W1F_FLOATS];

#include "wgmma.cuh"

// store(img, py, px, ch, o) keeps the pooled outputs o of channels ch, ch + 1 at (py, px) of image img
// (p1's layout is the kernel's). Where amax is not null, amax[i] ends as the largest pooled output of
// image i, inf where one is NaN (as float bits: they are not negative), max'ed in by one atomic per
// warp and image. idx, scaling, scale: as stage_images takes them.
template <class Store>
__device__ __forceinline__ void conv1_wgmma(float* stage, const float* __restrict__ x, int img0, int imgs,
                                            int* __restrict__ bad, unsigned* amax, Store store,
                                            const int* __restrict__ idx, int scaling, float scale) {
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int wg = warp / 4, w = warp % 4;
    float top[IMGS] = {};
    // Phase 0: this block's images (zeros past the end of the batch), checked, then conv1's weights.
    stage_images(stage, x, img0, imgs, bad, idx, scaling, scale);
    for (int i = t; i < W1F_FLOATS; i += FUSED_THREADS) stage[X_PAD + i] = c_w1[i];
    asm volatile("fence.proxy.async.shared::cta;");  // w1 written here, read by the tensor cores
    __syncthreads();

    // Phase 1: conv1 -> ReLU -> pool into p1. Tiles of 64 pool windows (the block's, image after image):
    // rows 16 w + g and + 8 of a warpgroup's tile are windows base[0], base[1]; each window position (dy,
    // dx) is an m64n32 tile of its own, two (dx = 0, 1) a round, so a lane pools its own accumulators,
    // in the reference's order ((a + b) + c) + d. Padded k read the window's pixel (finite, times a zero
    // weight); windows past the last are computed on window 0 and not stored.
    {
        int koff[KS1][2];
#pragma unroll
        for (int ks = 0; ks < KS1; ++ks)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int k = 8 * ks + tig + 4 * j, kk = k / IN_C;
                koff[ks][j] = k < K1K ? ((kk / K1) * IN_W + kk % K1) * IN_C + k % IN_C : 0;
            }
        for (int tile = wg; tile < WTILES1; tile += 2) {
            int base[2];  // the windows' first pixels in stage
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int win = tile * 64 + 16 * w + g + 8 * h;
                const int wc = win < IMGS * P1H * P1W ? win : 0, img = wc / (P1H * P1W), py = wc / P1W % P1H, px = wc % P1W;
                base[h] = ((img * IN_H + 2 * py) * IN_W + 2 * px) * IN_C;
            }
            float sum[16];
#pragma unroll
            for (int dy = 0; dy < 2; ++dy) {
                float acc[2][16];
#pragma unroll
                for (int ks = 0; ks < KS1; ++ks) {
                    float av[2][4];
#pragma unroll
                    for (int dx = 0; dx < 2; ++dx)
#pragma unroll
                        for (int r = 0; r < 4; ++r) av[dx][r] = stage[base[r % 2] + (dy * IN_W + dx) * IN_C + koff[ks][r / 2]];
                    mma3_step<2, 16, 0>(acc, av, stage + X_PAD + ks * 16 * C1, ks == 0);
                }
                wgmma_drain();
#pragma unroll
                for (int k = 8 * KS1; k < K1K; ++k) {  // the tail: accumulator 4c + 2h + e is channel 8c + 2tig + e of window h
                    const int kk = k / IN_C, off = ((kk / K1) * IN_W + kk % K1) * IN_C + k % IN_C;
                    const float* wt = stage + X_PAD + KS1 * 16 * C1 + (k - 8 * KS1) * C1 + 2 * tig;
#pragma unroll
                    for (int dx = 0; dx < 2; ++dx)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const float a = stage[base[h] + (dy * IN_W + dx) * IN_C + off];
#pragma unroll
                            for (int c = 0; c < C1 / 8; ++c)
#pragma unroll
                                for (int e = 0; e < 2; ++e) acc[dx][4 * c + 2 * h + e] = fmaf(a, wt[8 * c + e], acc[dx][4 * c + 2 * h + e]);
                        }
                }
#pragma unroll
                for (int e = 0; e < 16; ++e)
                    sum[e] = dy == 0 ? relu(acc[0][e]) + relu(acc[1][e]) : (sum[e] + relu(acc[0][e])) + relu(acc[1][e]);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int win = tile * 64 + 16 * w + g + 8 * h;
                if (win < IMGS * P1H * P1W) {
                    const int img = win / (P1H * P1W);
#pragma unroll
                    for (int c = 0; c < C1 / 8; ++c) {
                        const float2 o = make_float2(sum[4 * c + 2 * h] * 0.25f, sum[4 * c + 2 * h + 1] * 0.25f);
                        store(img, win / P1W % P1H, win % P1W, 8 * c + 2 * tig, o);
                        const float hi = o.x != o.x || o.y != o.y ? INFINITY : fmaxf(o.x, o.y);  // NaN: no certificate
#pragma unroll
                        for (int k = 0; k < IMGS; ++k) top[k] = k == img ? fmaxf(top[k], hi) : top[k];
                    }
                }
            }
        }
    }
    if (amax != nullptr)
#pragma unroll
        for (int i = 0; i < IMGS; ++i) {
            unsigned v = __float_as_uint(top[i] + 0.0f);  // -0 -> +0
#pragma unroll
            for (int o = 16; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
            if (lane == 0) atomicMax(amax + i, v);
        }
}
