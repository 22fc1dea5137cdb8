// The whole convolution stack in one kernel, per group of IMGS images, intermediates in shared
// memory only: conv1 (K1xK1, IN_C -> C1) -> ReLU -> 2x2 avg pool -> conv2 (K2xK2, C1 -> C2) -> ReLU
// -> 2x2 avg pool -> features (n, P2H, P2W, C2), NHWC, i.e. already flattened in (h, w, c) order.
// in: x (n, IN_H, IN_W, IN_C) float32; conv1 weights in constant memory c_w1 (K1, K1, IN_C, C1);
// conv2's weights in global memory, staged through shared memory one (kh, kw) slab at a time.
// All versions: block FUSED_THREADS (256), grid ceil(n / IMGS); phase 0 stages the images and, where
// `bad` is not null, checks them: *bad = min(*bad, i) for every image i holding a value that is not
// finite (check_kernel1's job, done here on the way in: the images are read once); phase 1
// computes one pooled conv1 output per thread-iteration (the thread's channel fixed, its K1*K1*IN_C
// weights in registers; 4 conv outputs, ReLU, ((a+b)+c)+d * 0.25); phase 2 is conv2 as an implicit
// GEMM (the im2col gather is the shared-memory addressing), M = pixels, N = C2, K = K2*K2*C1, with
// ReLU + 2x2 pool + NHWC store in registers. FLOPs per image: 2*(H1*W1*C1*K1*K1*IN_C +
// H2*W2*C2*K2*K2*C1); global bytes: the input once, the features once, w2 once per block (from L2).
// fused_kernel3 (sm_90a only): both convs on Hopper's warpgroup MMA (wgmma), 3xTF32
//   as in version 2. A tile is 64 rows = 16 pool windows x 4 positions; a thread holds rows (window,
//   dx) for dy = 0, 1, and the pool adds its partner lane's dx = 1 through shuffles, in the
//   reference's order. A fragments come from registers (gathered from shared memory and split per
//   k8 step), B (weight parts, remainders) is read by the tensor cores from shared memory through
//   matrix descriptors, as K-major core matrices without swizzle: per k8 step (parts, remainders) x
//   (N/8, 2 halves of k, 8 rows, 4 k). conv1: m64n32k8 tiles, k = (kh, kw, ci) padded to a multiple
//   of 8, except that a last 1 or 2 k past a whole k8 step go to FFMA; the split w1 in constant
//   memory, copied beside the images; each warpgroup takes two tiles at a time. conv2: each of the 2
//   warpgroups computes 2 images, one m64n64k8 tile per image, host layout of w2 (K2*K2, C1/8, {hi,
//   lo}, C2/8, 2, 8, 4). 3 x 2 x (H1*W1*C1*K1S + H2*W2*C2*K2*K2*C1) tensor FLOPs an image (K1S: the
//   k of conv1's steps, 24 for ECE408's 25), plus 2 x H1*W1*C1 per tail k on FFMA.
// The shared-memory layout is the host's (launch.Fused.plan): it passes the images per block IMGS, the
// pooled conv1 output's strides PSTR (pixel), RSTR (row), ISTR (image) and the floats of the stage
// area after it, STAGE_FLOATS, as -D options; the kernels static_assert what they rely on.

#include "fused_tc.cuh"

// conv1's k = (kh, kw, ci): k8 steps on the tensor cores, padded, except a tail of CONV1_TAIL (1 or
// 2) k past the last whole step, added on the FP32 cores (a k8 step of 3 MMAs for 1 of 8 useful k
// would cost more: ECE408's 5x5x1 is 3 steps + 1). The host chooses it (launch.Fused.conv1_steps).
#ifndef CONV1_TAIL
#error "fused v3 needs -DCONV1_TAIL"
#endif
constexpr int K1K = K1 * K1 * IN_C;
constexpr int TAIL1 = CONV1_TAIL;
constexpr int KS1 = (K1K - TAIL1 + 7) / 8;
static_assert(TAIL1 >= 0 && TAIL1 <= 2 && KS1 >= 1, "fused v3: conv1's tail is 0-2 k after at least one step");
#ifndef X_PAD
#error "fused v3 needs -DX_PAD: where conv1's weights follow the images in the stage area"
#endif
constexpr int W1F_FLOATS = KS1 * 2 * 8 * C1 + TAIL1 * C1;
constexpr int TILES1 = (P1H * P1W + 15) / 16;  // conv1 m64 tiles (16 pool windows each) per image
constexpr int JOBS1 = IMGS * TILES1;

static_assert(IMGS == 4 && FUSED_THREADS == 256, "fused v3: two warpgroups of two images each");
static_assert(C1 == 32 && C2 == 64, "fused v3: N = C1 = 32 (wgmma.m64n32k8), N = C2 = 64 (m64n64k8)");
static_assert(X_PAD >= X_FLOATS && X_PAD % 32 == 0, "fused v3: conv1's weights after the images, 128-byte aligned");
static_assert(STAGE_FLOATS >= X_PAD + W1F_FLOATS, "fused v3: the stage area must hold the images and conv1's weights");

// conv1's weights: the steps' split like w2, zero past k = K1K: (KS1, {hi, lo}, C1/8, 2, 8, 4); then
// the tail's as they are, (TAIL1, C1).
__constant__ float c_w1[W1F_FLOATS];

#include "wgmma.cuh"

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel3(const float* __restrict__ x, const float4* __restrict__ w2f, float* __restrict__ feat, int n, int* __restrict__ bad) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    float* stage = p1 + P1_FLOATS;  // the images and w1 in phase 1, then two w2 slabs in phase 2
    float4* slabs = reinterpret_cast<float4*>(stage);
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    const int imgs = min(IMGS, n - img0);
    const int lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int wg = warp / 4, w = warp % 4;  // warpgroup and warp in it

    // Phase 0: this block's images (zeros past the end of the batch), checked, then conv1's weights.
    stage_images(stage, x, img0, imgs, bad);
    for (int i = t; i < W1F_FLOATS; i += FUSED_THREADS) stage[X_PAD + i] = c_w1[i];
    asm volatile("fence.proxy.async.shared::cta;");  // w1 written here, read by the tensor cores
    __syncthreads();

    // Phase 1: conv1 -> ReLU -> pool into p1, m64n32 tiles of 16 pool windows x 4 positions; job j is
    // (image j / TILES1, tile j % TILES1), each warpgroup two jobs at a time. Rows g and g + 8 of warp
    // w: window 16 tile + 4w + g/2, column dx = g % 2, row dy = 0, 1. Padded k read pixel 0 (finite,
    // times a zero weight); windows past the last are computed on window 0 and not stored.
    {
        int koff[KS1][2];
#pragma unroll
        for (int ks = 0; ks < KS1; ++ks)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int k = 8 * ks + tig + 4 * j, kk = k / IN_C;
                koff[ks][j] = k < K1K ? ((kk / K1) * IN_W + kk % K1) * IN_C + k % IN_C : 0;
            }
        for (int pair = wg; pair < (JOBS1 + 1) / 2; pair += 2) {
            const float* base[2];
            int out[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int job = min(2 * pair + i, JOBS1 - 1), img = job / TILES1;
                const int win = (job % TILES1) * 16 + 4 * w + g / 2, wc = win < P1H * P1W ? win : 0;
                const int py = wc / P1W, px = wc % P1W;
                base[i] = stage + ((img * IN_H + 2 * py) * IN_W + 2 * px + g % 2) * IN_C;
                out[i] = 2 * pair + i < JOBS1 && win < P1H * P1W && g % 2 == 0 ? img * ISTR + py * RSTR + px * PSTR + 2 * tig : -1;
            }
            float acc[2][16];
#pragma unroll
            for (int ks = 0; ks < KS1; ++ks) {
                float av[2][4];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    av[i][0] = base[i][koff[ks][0]];
                    av[i][1] = base[i][IN_W * IN_C + koff[ks][0]];
                    av[i][2] = base[i][koff[ks][1]];
                    av[i][3] = base[i][IN_W * IN_C + koff[ks][1]];
                }
                mma3_step(acc, av, stage + X_PAD + ks * 16 * C1, ks == 0);
            }
            wgmma_drain();
#pragma unroll
            for (int k = 8 * KS1; k < K1K; ++k) {  // the tail: accumulator 4c + 2dy + e is channel 8c + 2tig + e
                const int kk = k / IN_C, off = ((kk / K1) * IN_W + kk % K1) * IN_C + k % IN_C;
                const float* wt = stage + X_PAD + KS1 * 16 * C1 + (k - 8 * KS1) * C1 + 2 * tig;
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int dy = 0; dy < 2; ++dy) {
                        const float a = base[i][dy * IN_W * IN_C + off];
#pragma unroll
                        for (int c = 0; c < C1 / 8; ++c)
#pragma unroll
                            for (int e = 0; e < 2; ++e) acc[i][4 * c + 2 * dy + e] = fmaf(a, wt[8 * c + e], acc[i][4 * c + 2 * dy + e]);
                    }
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int c = 0; c < C1 / 8; ++c) {
                    const float2 o = pool_pair(acc[i], c);
                    if (out[i] >= 0) *reinterpret_cast<float2*>(p1 + out[i] + 8 * c) = o;
                }
        }
    }
    __syncthreads();  // p1 complete; the staged images and w1 are dead from here on
    fetch_slab(slabs, w2f, 0);

    // Phase 2: conv2, 2 images per warpgroup, one m64n64 tile per image and group of 16 windows.
    float acc[2][32];
    for (int u = 0; u < STEPS; ++u) {
        const int mg = u / (K2 * K2), s = u % (K2 * K2);
        // Rows g and g + 8 of warp w: pool window mg*16 + 4w + g/2, column dx = g % 2, row dy = 0, 1.
        const int win = mg * 16 + 4 * w + g / 2, py = win / P2W, px = win % P2W;
        const float* as = p1 + (2 * wg) * ISTR + (2 * py + s / K2) * RSTR + (2 * px + g % 2 + s % K2) * PSTR + tig;
        // Slab u has landed (ours; the proxy fence hands it to the tensor cores' reads, the barrier
        // makes everyone's visible), and every warpgroup's MMAs on the other buffer have completed.
        asm volatile("cp.async.wait_group 0;");
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();
        if (u + 1 < STEPS) fetch_slab(slabs + ((u + 1) % 2) * (SLAB2 / 4), w2f, (u + 1) % (K2 * K2));
        const float* slab = stage + (u % 2) * SLAB2;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            float av[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float* a = as + i * ISTR + ks * 8;
                av[i][0] = a[0];
                av[i][1] = a[RSTR];
                av[i][2] = a[4];
                av[i][3] = a[RSTR + 4];
            }
            mma3_step(acc, av, slab + ks * 16 * C2, s == 0 && ks == 0);  // a window group's first step
        }
        wgmma_drain();

        if (s == K2 * K2 - 1) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int img = 2 * wg + i;
                float* out = feat + ((size_t)(img0 + img) * WINDOWS + win) * C2 + 2 * tig;
#pragma unroll
                for (int c = 0; c < C2 / 8; ++c) {
                    const float2 o = pool_pair(acc[i], c);
                    if (g % 2 == 0 && img < imgs) *reinterpret_cast<float2*>(out + c * 8) = o;
                }
            }
        }
    }
}
