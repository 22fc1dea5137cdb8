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
// fused_kernel3 (sm_90a only): both convs on Hopper's warpgroup MMA (wgmma), conv1 in 3xTF32 (or
//   from codes, below), conv2 in 3xFP16. conv2's tile is 64 rows = 16 pool windows x 4 positions; a
//   thread holds rows (window, dx) for dy = 0, 1, and the pool adds its partner lane's dx = 1 through
//   shuffles, in the reference's order. conv1's tile is 64 pool windows at one position (dy, dx): four
//   tiles, two a round, so a thread pools its own accumulators: no shuffles, every lane stores (rows =
//   the block's windows, image after image). conv1: m64n32k8 tiles, A gathered into registers and
//   split per k8 step, B (w1's TF32 parts and remainders, copied beside the images) read by the tensor
//   cores through matrix descriptors as K-major core matrices without swizzle; k = (kh, kw, ci)
//   padded to a multiple of 8, except that a last 1 or 2 k past a whole k8 step go to FFMA; each
//   warpgroup takes every other 64-window tile. Then each image's largest p1 value sets its scale 2^s
//   (into [2^14, 2^15)), and p1 is split in place into float16 parts of p1 2^s (a pixel's C1 hi, then
//   its C1 lo). conv2: each of the 2 warpgroups computes IMGS / 2 images, one m64n64k16 tile per image,
//   three MMAs a k16 step (al wh, ah wl, ah wh; A from registers, one 32-bit load each), host layout
//   of w2 (K2*K2, C1/16, {hi, lo}, C2/8, 2, 8, 8 halves) of each channel's weights times 2^T, then 2^-T
//   per channel; the sums times 2^-s, then 2^-T, before ReLU. SLABS3 slab buffers, all but one fetched
//   ahead. IMGS is 4, or 2 for the certified path's recomputation (a block's latency at a chunk's end,
//   half the tensor work a block; each image's sums the same, so its bits).
//   2 x (3 H1*W1*C1*K1S + 3 H2*W2*C2*K2*K2*C1) tensor FLOPs an image (K1S: the k of conv1's steps, 24
//   for ECE408's 25; conv2's at float16's rate, twice TF32's), plus 2 x H1*W1*C1 per tail k on FFMA.
// The shared-memory layout is the host's (launch.Fused.plan): it passes the images per block IMGS, the
// pooled conv1 output's strides PSTR (pixel), RSTR (row), ISTR (image), the floats of the stage
// area after it, STAGE_FLOATS, and version 3's slab buffers SLABS3 as -D options; the kernels
// static_assert what they rely on.
// Where `count` is not null, only the first *count images are computed (blocks past it return), and
// where `idx` is not null, image i is x's image idx[i] (its features still go to row i): the certified
// path's recomputation, whose list and count certify.cu sets on the GPU. Where `scaling` is not -1, x
// holds 8-bit codes, a byte a value, and conv1 is computed from the codes (fused_conv1_wgmma.cuh:
// float16 m64n32k16 tiles, 2 MMAs a k16 step, the scaling applied to the pooled sums), so images
// uploaded as codes need no conversion kernel (versions 4 and 6 likewise, the same bits).

#include "fused_conv1_wgmma.cuh"
#ifndef SLABS3
#error "fused v3 needs -DSLABS3: its w2 slab buffers (launch.Fused.plan)"
#endif
static_assert(C2 == 64 && C1 % 16 == 0, "fused v3: N = C2 = 64 (wgmma.m64n64k16), k16 steps of conv1 channels");
constexpr int WG_IMGS = IMGS / 2;  // conv2's images per warpgroup
constexpr int KS16_2 = C1 / 16;    // conv2's k16 steps a slab
constexpr int SLABW = C1 * C2;     // floats of a slab: float16 parts hi and lo of C1 x C2 weights
constexpr int AHEAD3 = SLABS3 - 1;  // slabs fetched ahead: each slab's MMAs are drained, so a buffer is free one slab on
static_assert(SLABS3 >= 2 && STAGE_FLOATS >= SLABS3 * SLABW + 4 && STAGE_FLOATS >= X_PAD + W1F_FLOATS + 4 && IMGS <= 4,
              "fused v3: the stage area holds the images and w1, or SLABS3 w2 slabs, then the images' largest p1");
static_assert(SLABW % (4 * FUSED_THREADS) == 0, "fused v3: slabs are 16-byte copies");

// An image's conv2 inputs times 2^s put its largest p1 value (bits: not negative) in [2^14, 2^15),
// float16's top binade, so each value's two float16 parts keep 22 bits (up = 2^s, down = 2^-s; s at
// most 126, so both stay normal). s = 0 where the largest is 0 or not finite (the scores then come out
// non-finite, as in float32).
__device__ __forceinline__ void image_scale(unsigned bits, float& up, float& down) {
    const int s = bits == 0 || bits >= 0x7f800000u ? 0 : min(14 - ((int)(bits >> 23) - 127), 126);
    up = __int_as_float((127 + s) << 23);
    down = __int_as_float((127 - s) << 23);
}

// v's two values as float16 parts: hi = fl16(v), lo = fl16(v - hi) (v - hi is exact in float32).
__device__ __forceinline__ void split_halves(float2 v, unsigned& hi, unsigned& lo) {
    hi = half2_bits(v);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    lo = half2_bits(make_float2(v.x - f.x, v.y - f.y));
}

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel3(const float* __restrict__ x, const float4* __restrict__ w2f, float* __restrict__ feat, int n, int* __restrict__ bad,
              const int* __restrict__ count, const int* __restrict__ idx, int scaling, float scale) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    float* stage = p1 + P1_FLOATS;  // the images and w1 in phase 1, then the w2 slabs in phase 2
    float4* slabs = reinterpret_cast<float4*>(stage);
    unsigned* amax = reinterpret_cast<unsigned*>(stage + STAGE_FLOATS - 4);  // each image's largest p1 (float bits)
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    if (count != nullptr && img0 >= min(n, *count)) return;  // the recomputed share: a count the GPU set
    const int imgs = min(IMGS, (count != nullptr ? min(n, *count) : n) - img0);
    const int lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int wg = warp / 4, w = warp % 4;  // warpgroup and warp in it

    if (t < IMGS) amax[t] = 0;
    conv1_wgmma(
        stage, x, img0, imgs, bad, nullptr,
        [&](int img, int py, int px, int ch, float2 o) { *reinterpret_cast<float2*>(p1 + img * ISTR + py * RSTR + px * PSTR + ch) = o; },
        idx, scaling, scale);
    __syncthreads();  // p1 complete; the staged images and w1 are dead from here on
    // Each image's largest p1 value, NaN as inf, in a pass over p1 (tracked inside conv1 it spilled
    // registers on 28x28x2). The values are not negative: their bits order as the values do.
    {
        constexpr int PIECES = P1H * P1W * (C1 / 4);  // float4s of an image
        unsigned top[IMGS] = {};
        for (int e = t; e < IMGS * PIECES; e += FUSED_THREADS) {
            const int img = e / PIECES, pix = e % PIECES / (C1 / 4), q = e % (C1 / 4);
            const float4 v = *reinterpret_cast<const float4*>(p1 + img * ISTR + pix / P1W * RSTR + pix % P1W * PSTR + 4 * q);
            const float m = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
            const unsigned bits = v.x != v.x || v.y != v.y || v.z != v.z || v.w != v.w ? 0x7f800000u : __float_as_uint(m + 0.0f);
#pragma unroll
            for (int i = 0; i < IMGS; ++i) top[i] = i == img ? max(top[i], bits) : top[i];
        }
#pragma unroll
        for (int i = 0; i < IMGS; ++i) {
#pragma unroll
            for (int o = 16; o > 0; o /= 2) top[i] = max(top[i], __shfl_xor_sync(0xffffffffu, top[i], o));
            if (lane == 0) atomicMax(amax + i, top[i]);
        }
    }
    __syncthreads();
    // p1 in place as conv2's A operand: each pixel's C1 values times the image's 2^s as float16 parts,
    // hi in its first C1 / 2 words, lo in the next (a pair of channels a word), a thread a pixel: each
    // value is split once, not at each of the K2*K2 slabs that read it.
    for (int e = t; e < IMGS * P1H * P1W; e += FUSED_THREADS) {
        const int img = e / (P1H * P1W), pix = e % (P1H * P1W);
        float* at = p1 + img * ISTR + pix / P1W * RSTR + pix % P1W * PSTR;
        float up, down;
        image_scale(amax[img], up, down);
        float4 v[C1 / 4];
#pragma unroll
        for (int q = 0; q < C1 / 4; ++q) v[q] = reinterpret_cast<const float4*>(at)[q];
        unsigned* words = reinterpret_cast<unsigned*>(at);
#pragma unroll
        for (int q = 0; q < C1 / 4; ++q) {
            split_halves(make_float2(v[q].x * up, v[q].y * up), words[2 * q], words[C1 / 2 + 2 * q]);
            split_halves(make_float2(v[q].z * up, v[q].w * up), words[2 * q + 1], words[C1 / 2 + 2 * q + 1]);
        }
    }
#pragma unroll
    for (int u = 0; u < AHEAD3; ++u) {
        if (u < STEPS)
            fetch_slab<SLABW>(slabs + u * (SLABW / 4), w2f, u % (K2 * K2));
        else
            cp_async_commit();
    }

    // Phase 2: conv2 in 3xFP16, WG_IMGS images per warpgroup, one m64n64 tile per image and group of 16
    // windows: per k16 step the image's inputs times 2^s split into float16 parts ah + al (A, from
    // registers) and the weights' wh + wl (B: each channel's weights times 2^T, pipelines.
    // FusedWarpgroup.conv2_weights), the three products al wh, ah wl, ah wh (the smallest first) summed
    // in float32 on the tensor cores; the sums times 2^-s, then 2^-T, before ReLU and the pool.
    float acc[WG_IMGS][32];
    const unsigned s0 = desc_lo(stage);
    for (int u = 0; u < STEPS; ++u) {
        const int mg = u / (K2 * K2), s = u % (K2 * K2);
        // Rows g and g + 8 of warp w: pool window mg*16 + 4w + g/2, column dx = g % 2, row dy = 0, 1.
        const int win = mg * 16 + 4 * w + g / 2, py = win / P2W, px = win % P2W;
        const unsigned* as = reinterpret_cast<const unsigned*>(p1) + (WG_IMGS * wg) * ISTR + (2 * py + s / K2) * RSTR +
                             (2 * px + g % 2 + s % K2) * PSTR + tig;
        // Slab u has landed (ours; the proxy fence hands it to the tensor cores' reads, the barrier
        // makes everyone's visible; each step commits one group), and every warpgroup's MMAs on slab
        // u - 1, whose buffer is refilled now, have completed (drained).
        cp_async_wait<AHEAD3 - 1>();
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();
        if (u + AHEAD3 < STEPS)
            fetch_slab<SLABW>(slabs + ((u + AHEAD3) % SLABS3) * (SLABW / 4), w2f, (u + AHEAD3) % (K2 * K2));
        else
            cp_async_commit();
        const unsigned slab = s0 + (u % SLABS3) * (SLABW / 4);
        // A fragments: rows g, g + 8 x k = 16 ks + 2 tig (+ 1), + 8, per (k16 step, image) a group of
        // three MMAs; each group's {hi, lo} kept live until the wait after the next group's MMAs (an
        // MMA reads its registers after it is issued), so one group is in flight while the next is loaded.
        constexpr int GROUPS = KS16_2 * WG_IMGS;
        unsigned frag[GROUPS][2][4];
#pragma unroll
        for (int j = 0; j < GROUPS; ++j) {
            const int ks = j / WG_IMGS, i = j % WG_IMGS;
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const unsigned* a = as + i * ISTR + (r % 2) * RSTR + 8 * ks + 4 * (r / 2);
                frag[j][0][r] = a[0];
                frag[j][1][r] = a[C1 / 2];
            }
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            const unsigned b = slab + ks * (SLABW / KS16_2) / 4;  // the step's hi, then its lo 2 KB on
            wgmma16(acc[i], frag[j][1], desc(b), s != 0 || ks != 0);  // a window group's first product starts the sums
            wgmma16(acc[i], frag[j][0], desc(b + C2 * 16 / 2 / 4), 1);
            wgmma16(acc[i], frag[j][0], desc(b), 1);
            if (j > 0)
                wgmma_commit_wait_previous(frag[j - 1]);
            else
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        }
        wgmma_drain();
        asm volatile("" :: "r"(frag[GROUPS - 1][0][0]), "r"(frag[GROUPS - 1][0][1]), "r"(frag[GROUPS - 1][0][2]),
                     "r"(frag[GROUPS - 1][0][3]), "r"(frag[GROUPS - 1][1][0]), "r"(frag[GROUPS - 1][1][1]),
                     "r"(frag[GROUPS - 1][1][2]), "r"(frag[GROUPS - 1][1][3]));

        if (s == K2 * K2 - 1) {
            // accumulator 4c + 2dy + e is channel 8c + 2 tig + e: its 2^-T after the slabs
            const float* wdown = reinterpret_cast<const float*>(w2f) + K2 * K2 * SLABW + 2 * tig;
#pragma unroll
            for (int i = 0; i < WG_IMGS; ++i) {
                const int img = WG_IMGS * wg + i;
                float up, down;
                image_scale(amax[img], up, down);
                float* out = feat + ((size_t)(img0 + img) * WINDOWS + win) * C2 + 2 * tig;
#pragma unroll
                for (int c = 0; c < C2 / 8; ++c) {
                    const float2 wd = *reinterpret_cast<const float2*>(wdown + 8 * c);
#pragma unroll
                    for (int j = 4 * c; j < 4 * c + 4; ++j) acc[i][j] = acc[i][j] * down * (j % 2 ? wd.y : wd.x);
                    const float2 o = pool_pair(acc[i], c);
                    if (g % 2 == 0 && img < imgs) *reinterpret_cast<float2*>(out + c * 8) = o;
                }
            }
        }
    }
}
