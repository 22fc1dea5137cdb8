// The certified low-precision pass's convolution stack (docs/certified.md): fused_kernel3's conv1
// (the same bits), then conv2 with float16 operands and float32 sums, and beside each pooled feature
// a bound on how far it can lie from the exact path's (3xTF32) feature.
// in: x (n, IN_H, IN_W, IN_C) float32, or 8-bit codes (scaling, scale: as version 3); conv1's weights c_w1 as version 3;
// w2h: per (kh, kw) slab, per k16 step of C1, the B operand of wgmma.m64n128k16 as K-major core
// matrices of halves: (K2*K2, C1/16, 16 column groups, 2 halves of k, 8, 8), columns 0-63 conv2's
// weights rounded to nearest, 64-127 the bound columns (per weight, 2^9 times what its product adds to
// the gap per |fl16(a)|: its own rounding and the sums', rounded up: certify.conv2_bound_columns);
// c_conv2_bound the bound's constants.
// out: feat (n, P2H, P2W, C2) float32 as fused_kernel3's, from the float16 conv2; dp (the same shape):
// per feature, an upper bound on |feature - exact path's feature|; *bad as version 3.
// fused_kernel4 (sm_90a only): block 256 threads = 2 warpgroups, 4 images, grid ceil(n / 4); phases
//   0-1 as fused_kernel3 (fused_conv1_wgmma.cuh), also the largest pooled conv1 output per image;
//   phase 2: each warpgroup its 2 images one after the other, an m64n128k16 tile per image and group
//   of 16 windows (rows as version 3), A = the pooled conv1 outputs rounded to float16 in registers,
//   B the slab (real and bound columns), w2h's slabs double-buffered by cp.async (8 KB each); the
//   pool epilogue stores the features and, from the bound columns S = sum b_up a16, per output
//   d2 = A1 S + C[c] + BETA_N amax and per feature dp = avg d2 + gamma_3 avg (2 |v| + d2) + 2^-148,
//   all rounded up. 2 x 2 x H2*W2*C2*K2*K2*C1 float16 tensor FLOPs an image, plus version 3's conv1.

#include <cuda_fp16.h>

#include "fused_conv1_wgmma.cuh"

static_assert(C2 == 64 && C1 % 16 == 0, "fused v4: N = 2 x C2 = 128 (wgmma.m64n128k16), k16 steps of C1");
constexpr int SLAB16 = C1 * 2 * C2 / 2;  // floats of one (kh, kw) slab of halves, real and bound columns
static_assert(SLAB16 % (4 * FUSED_THREADS) == 0, "fused v4: a slab splits into 16 bytes per thread");
static_assert(STAGE_FLOATS >= 2 * SLAB16 + 4 && STAGE_FLOATS >= X_PAD + W1F_FLOATS + 4,
              "fused v4: the stage area holds the images and w1, or two slabs, then the images' maxima");
static_assert(PSTR % 2 == 0 && RSTR % 2 == 0 && ISTR % 2 == 0, "fused v4: A fragments are float2 loads");

// A1: 2^-9 / (1 - gamma_n), the factor of S; BETA_N: tiny * n (times the image's largest conv1
// output it bounds tiny * sum a); G3Q: gamma_3 / 4; then C[c] per conv2 channel: ((1 + e3) eta +
// tiny) sum |w| (certify.conv2_constants). The host computes them rounded up.
enum { A1, BETA_N, G3Q, CHAN };
__constant__ float c_conv2_bound[CHAN + C2];

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel4(const float* __restrict__ x, const float4* __restrict__ w2h, float* __restrict__ feat, float* __restrict__ dp,
              int n, int* __restrict__ bad, int scaling, float scale) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    float* stage = p1 + P1_FLOATS;  // the images and w1 in phase 1, then two w2h slabs in phase 2
    float4* slabs = reinterpret_cast<float4*>(stage);
    unsigned* amax = reinterpret_cast<unsigned*>(stage + STAGE_FLOATS - 4);
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    const int imgs = min(IMGS, n - img0);
    const int lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int wg = warp / 4, w = warp % 4;

    if (t < IMGS) amax[t] = 0;  // past the images and w1: untouched by phase 1's staging
    __syncthreads();
    conv1_wgmma(stage, x, img0, imgs, bad, amax, [&](int img, int py, int px, int ch, float2 o) {
        *reinterpret_cast<float2*>(p1 + img * ISTR + py * RSTR + px * PSTR + ch) = o;
    }, nullptr, scaling, scale);
    __syncthreads();  // p1 and the maxima complete; the staged images and w1 are dead from here on
    fetch_slab<SLAB16>(slabs, w2h, 0);

    // Phase 2: image 2 wg + u / STEPS of this warpgroup, window group and slab from u % STEPS.
    float acc[64];
    for (int u = 0; u < 2 * STEPS; ++u) {
        const int i = u / STEPS, v = u % STEPS, mg = v / (K2 * K2), s = v % (K2 * K2);
        const int img = 2 * wg + i;
        // Rows g and g + 8 of warp w: pool window mg*16 + 4w + g/2, column dx = g % 2, row dy = 0, 1.
        const int win = mg * 16 + 4 * w + g / 2, py = win / P2W, px = win % P2W;
        const float* as = p1 + img * ISTR + (2 * py + s / K2) * RSTR + (2 * px + g % 2 + s % K2) * PSTR + 2 * tig;
        // As version 3: slab u has landed and every MMA on the other buffer has completed.
        asm volatile("cp.async.wait_group 0;");
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();
        if (u + 1 < 2 * STEPS) fetch_slab<SLAB16>(slabs + ((u + 1) % 2) * (SLAB16 / 4), w2h, (u + 1) % (K2 * K2));
        const float* slab = stage + (u % 2) * SLAB16;
        unsigned av[C1 / 16][4];
#pragma unroll
        for (int ks = 0; ks < C1 / 16; ++ks) {
            const float* a = as + 16 * ks;
            av[ks][0] = half2_bits(*reinterpret_cast<const float2*>(a));
            av[ks][1] = half2_bits(*reinterpret_cast<const float2*>(a + RSTR));
            av[ks][2] = half2_bits(*reinterpret_cast<const float2*>(a + 8));
            av[ks][3] = half2_bits(*reinterpret_cast<const float2*>(a + RSTR + 8));
        }
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");  // after the A registers are written
#pragma unroll
        for (int ks = 0; ks < C1 / 16; ++ks)
            wgmma16(acc, av[ks], wgmma_desc(slab + ks * (SLAB16 / (C1 / 16))), s != 0 || ks != 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        wgmma_drain();

        if (s == K2 * K2 - 1) {
            const float bimg = __fmul_ru(c_conv2_bound[BETA_N], __uint_as_float(amax[img]));
            const size_t at = ((size_t)(img0 + img) * WINDOWS + win) * C2 + 2 * tig;
            const bool store = g % 2 == 0 && img < imgs;
#pragma unroll
            for (int c = 0; c < C2 / 8; ++c) {
                const float2 o = pool_pair(acc, c);
                float d[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float base = __fadd_ru(c_conv2_bound[CHAN + 8 * c + 2 * tig + e], bimg);
                    float ds = __fadd_ru(__fmaf_ru(c_conv2_bound[A1], acc[4 * (c + 8) + e], base),
                                         __fmaf_ru(c_conv2_bound[A1], acc[4 * (c + 8) + 2 + e], base));
                    float vs = __fadd_ru(relu(acc[4 * c + e]), relu(acc[4 * c + 2 + e]));
                    ds = __fadd_ru(ds, __shfl_down_sync(0xffffffffu, ds, 4));  // the dx = 1 half
                    vs = __fadd_ru(vs, __shfl_down_sync(0xffffffffu, vs, 4));
                    d[e] = __fadd_ru(__fmaf_ru(0.25f, ds, __fmul_ru(c_conv2_bound[G3Q], __fmaf_ru(2.0f, vs, ds))), 0x1p-148f);
                }
                if (store) {
                    *reinterpret_cast<float2*>(feat + at + 8 * c) = o;
                    *reinterpret_cast<float2*>(dp + at + 8 * c) = make_float2(d[0], d[1]);
                }
            }
        }
    }
}
