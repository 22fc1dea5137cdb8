// The whole convolution stack in one kernel, per group of IMGS images, intermediates in shared
// memory only: conv1 (K1xK1, IN_C -> C1) -> ReLU -> 2x2 avg pool -> conv2 (K2xK2, C1 -> C2) -> ReLU
// -> 2x2 avg pool -> features (n, P2H, P2W, C2), NHWC, i.e. already flattened in (h, w, c) order.
// in: x (n, IN_H, IN_W, IN_C) float32; conv1 weights c_w1 (K1, K1, IN_C, C1) in constant memory
// (versions 3, 4 and 6: in global memory, laid out for the tensor cores: fused_conv1_wgmma.cuh);
// conv2's weights in global memory, staged through shared memory one (kh, kw) slab at a time.
// All versions: block FUSED_THREADS (256), grid ceil(n / IMGS); phase 0 stages the images and, where
// `bad` is not null, checks them: *bad = min(*bad, i) for every image i holding a value that is not
// finite (check_kernel2's job, done here on the way in: the images are read once); phase 1
// computes one pooled conv1 output per thread-iteration (the thread's channel fixed, its K1*K1*IN_C
// weights in registers; 4 conv outputs, ReLU, ((a+b)+c)+d * 0.25); phase 2 is conv2 as an implicit
// GEMM (the im2col gather is the shared-memory addressing), M = pixels, N = C2, K = K2*K2*C1, with
// ReLU + 2x2 pool + NHWC store in registers. FLOPs per image: 2*(H1*W1*C1*K1*K1*IN_C +
// H2*W2*C2*K2*K2*C1); global bytes: the input once, the features once, w2 once per block (from L2).
// fused_kernel3 (sm_90a only): both convs on Hopper's warpgroup MMA (wgmma), 3xTF32
//   as in version 2. conv2's tile is 64 rows = 16 pool windows x 4 positions; a thread holds rows
//   (window, dx) for dy = 0, 1, and the pool adds its partner lane's dx = 1 through shuffles, in the
//   reference's order. conv1's tile is 64 pool windows at one position (dy, dx): four tiles, two a
//   round, so a thread pools its own accumulators: no shuffles, every lane stores (rows = the block's
//   windows, image after image). A fragments come from registers (gathered from shared memory and split per
//   k8 step), B (weight parts, remainders) is read by the tensor cores from shared memory through
//   matrix descriptors, as K-major core matrices without swizzle: per k8 step (parts, remainders) x
//   (N/8, 2 halves of k, 8 rows, 4 k). conv1: m64n32k8 tiles, k = (kh, kw, ci) padded to a multiple
//   of 8, except that a last 1 or 2 k past a whole k8 step go to FFMA; the split w1 in constant
//   memory, copied beside the images; each warpgroup takes every other 64-window tile. conv2: each of the 2
//   warpgroups computes IMGS / 2 images, one m64n64k8 tile per image, host layout of w2 (K2*K2, C1/8,
//   {hi, lo}, C2/8, 2, 8, 4). IMGS is 4, or 2 for the certified path's recomputation (a block's
//   latency at a chunk's end, half the tensor work a block; each image's sums the same, so its bits). 3 x 2 x (H1*W1*C1*K1S + H2*W2*C2*K2*K2*C1) tensor FLOPs an image (K1S: the
//   k of conv1's steps, 24 for ECE408's 25), plus 2 x H1*W1*C1 per tail k on FFMA.
// The shared-memory layout is the host's (launch.Fused.plan): it passes the images per block IMGS, the
// pooled conv1 output's strides PSTR (pixel), RSTR (row), ISTR (image) and the floats of the stage
// area after it, STAGE_FLOATS, as -D options; the kernels static_assert what they rely on.
// Where `count` is not null, only the first *count images are computed (blocks past it return), and
// where `idx` is not null, image i is x's image idx[i] (its features still go to row i): the certified
// path's recomputation, whose list and count certify.cu sets on the GPU. Where `scaling` is not -1, x
// holds 8-bit codes, a byte a value, and conv1 is computed from the codes (fused_conv1_wgmma.cuh:
// float16 m64n32k16 tiles, 2 MMAs a k16 step, the scaling applied to the pooled sums), so images
// uploaded as codes need no conversion kernel (versions 4 and 6 likewise, the same bits).

#include "fused_conv1_wgmma.cuh"
static_assert(STAGE_FLOATS >= 2 * SLAB2, "fused v2/v3: the stage area must hold two w2 slabs");
static_assert(C2 == 64, "fused v3: N = C2 = 64 (wgmma.m64n64k8)");
constexpr int WG_IMGS = IMGS / 2;  // conv2's images per warpgroup


extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel3(const float* __restrict__ x, const float4* __restrict__ w2f, float* __restrict__ feat, int n, int* __restrict__ bad,
              const int* __restrict__ count, const int* __restrict__ idx, int scaling, float scale) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    float* stage = p1 + P1_FLOATS;  // the images and w1 in phase 1, then two w2 slabs in phase 2
    float4* slabs = reinterpret_cast<float4*>(stage);
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    if (count != nullptr && img0 >= min(n, *count)) return;  // the recomputed share: a count the GPU set
    const int imgs = min(IMGS, (count != nullptr ? min(n, *count) : n) - img0);
    const int lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int wg = warp / 4, w = warp % 4;  // warpgroup and warp in it

    conv1_wgmma(
        stage, x, img0, imgs, bad, nullptr,
        [&](int img, int py, int px, int ch, float2 o) { *reinterpret_cast<float2*>(p1 + img * ISTR + py * RSTR + px * PSTR + ch) = o; },
        idx, scaling, scale);
    __syncthreads();  // p1 complete; the staged images and w1 are dead from here on
    fetch_slab(slabs, w2f, 0);

    // Phase 2: conv2, WG_IMGS images per warpgroup, one m64n64 tile per image and group of 16 windows.
    float acc[WG_IMGS][32];
    for (int u = 0; u < STEPS; ++u) {
        const int mg = u / (K2 * K2), s = u % (K2 * K2);
        // Rows g and g + 8 of warp w: pool window mg*16 + 4w + g/2, column dx = g % 2, row dy = 0, 1.
        const int win = mg * 16 + 4 * w + g / 2, py = win / P2W, px = win % P2W;
        const float* as = p1 + (WG_IMGS * wg) * ISTR + (2 * py + s / K2) * RSTR + (2 * px + g % 2 + s % K2) * PSTR + tig;
        // Slab u has landed (ours; the proxy fence hands it to the tensor cores' reads, the barrier
        // makes everyone's visible), and every warpgroup's MMAs on the other buffer have completed.
        asm volatile("cp.async.wait_group 0;");
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();
        if (u + 1 < STEPS) fetch_slab(slabs + ((u + 1) % 2) * (SLAB2 / 4), w2f, (u + 1) % (K2 * K2));
        const float* slab = stage + (u % 2) * SLAB2;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            float av[WG_IMGS][4];
#pragma unroll
            for (int i = 0; i < WG_IMGS; ++i) {
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
            for (int i = 0; i < WG_IMGS; ++i) {
                const int img = WG_IMGS * wg + i;
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
