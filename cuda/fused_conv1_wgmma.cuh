// Phases 0 and 1 of fused_kernel3, 4 and 6 (the same bits on all: the certified pass and the exact
// one differ from conv2 on): the block's images staged and checked, conv1 on wgmma -> ReLU -> 2x2
// pool into p1. fused3.cu's opening comment has the tiling. Float32 images: 3xTF32. 8-bit codes
// (scaling not -1): the codes themselves, exact in float16, times each channel's weights scaled by
// 2^S (max |w| 2^S in [2^14, 2^15]) as two float16 parts, hi + lo: every product exact in float32,
// 2 MMAs a k16 step (3xTF32: 3 a k8 step, and its operands split), and the channel's c0 2^-S
// (c0 = the scaling's 1/255, or 1) applied to the pooled sum: within float32's accuracy of the
// float32 images' conv1, but not its bits. The codes are staged as float16 twice, the second copy one
// value on, and k runs over kernel rows padded to even: each A register (a pair of k) is one aligned
// 32-bit load (stage_codes).
#pragma once
#include <cuda_fp16.h>

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
// From codes, k runs over each kernel row padded to an even length (RL1: (kw, ci), then a zero weight
// where K1 * IN_C is odd), so a pair of k (2 tig, + 1) is two adjacent values of one image row.
constexpr int RL1 = (K1 * IN_C + 1) / 2 * 2;
constexpr int KS16 = (K1 * RL1 + 15) / 16;  // conv1's k16 steps from codes, zero-padded (no tail)
constexpr int W1C_FLOATS = KS16 * 16 * C1;  // their float16 weights, {lo, hi} a step
// The codes staged as float16 twice (stage_codes): rows of ROWH halves (IN_W * IN_C padded to even),
// copy 1 one half on from copy 0, each COPYH halves with zeros past the images.
constexpr int ROWH = (IN_W * IN_C + 1) / 2 * 2, COPYH = IMGS * IN_H * ROWH + 4;
static_assert(W1C_FLOATS <= W1F_FLOATS, "fused v3-v6: conv1's codes weights fit where the split ones go");
constexpr int WTILES1 = (IMGS * P1H * P1W + 63) / 64;  // conv1 m64 tiles of the block's pool windows

static_assert((IMGS == 4 || IMGS == 2) && FUSED_THREADS == 256, "fused v3/v4: two warpgroups of IMGS / 2 images each");
static_assert(C1 == 32, "fused v3/v4: N = C1 = 32 (wgmma.m64n32k8)");
static_assert(X_PAD >= X_FLOATS && X_PAD >= COPYH && X_PAD % 32 == 0,
              "fused v3/v4: conv1's weights after the images (float32, or both copies of the codes), 128-byte aligned");
static_assert(STAGE_FLOATS >= X_PAD + W1F_FLOATS, "fused v3/v4: the stage area must hold the images and conv1's weights");

// conv1's weights: the steps' split like w2, zero past k = K1K: (KS1, {hi, lo}, C1/8, 2, 8, 4); then
// the tail's as they are, (TAIL1, C1); then for codes, float16 pairs in words: each channel's weights
// times 2^S, (KS16, {lo, hi}, C1/8, 2, 8, 8 halves), zero past K1K. In global memory (L2), copied
// with cp.async beside the images' staging: from constant memory each thread's own address
// serialized the copy (ncu: ~4% of the certified pass's fused kernel's stall samples). The codes' 2^-S per channel in
// constant memory, read from there into registers: ptxas reloads constants rather than spill them
// (launch.Fused.set_conv1 splits the host's array between the two).
static_assert(W1F_FLOATS % 4 == 0 && W1C_FLOATS % 4 == 0 && X_PAD % 4 == 0, "fused v3-v6: conv1's weights copy in 16 bytes");
__device__ __align__(16) float c_w1[W1F_FLOATS + W1C_FLOATS];
__constant__ float c_w1_scale[C1];

// Two float32 values rounded to nearest float16, packed (the first in the low half).
__device__ __forceinline__ unsigned half2_bits(float2 v) {
    const __half2 h = __floats2half2_rn(v.x, v.y);
    return *reinterpret_cast<const unsigned*>(&h);
}

#include "wgmma.cuh"

// conv1's k = (kh, kw, ci) as the offset of its pixel from a window's first in the staged images; k
// past K1K (padding: times a zero weight) reads the window's first, finite.
__device__ __forceinline__ int conv1_pixel(int k) {
    const int kk = k / IN_C;
    return k < K1K ? ((kk / K1) * IN_W + kk % K1) * IN_C + k % IN_C : 0;
}

// From codes: the word of copy 0 holding the pair of k (k even) and k + 1 from a window's first value
// (in words: the pair's offset is even); padded k past the last kernel row read the window's first.
__device__ __forceinline__ int codes_pair_word(int k) {
    return k < K1 * RL1 ? (k / RL1 * ROWH + k % RL1) / 2 : 0;
}

// The codes in bytes a and b of w as a pair of float16 values, exact (sel: __byte_perm's selector
// putting them in bytes 0 and 2, 0x64 in bytes 1 and 3): the float16 1024 + b (bits 0x6400 | b) less 1024.
__device__ __forceinline__ unsigned code_halves(unsigned w, unsigned sel) {
    const unsigned biased = __byte_perm(w, 0x64u, sel);
    const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&biased), __float2half2_rn(1024.0f));
    return *reinterpret_cast<const unsigned*>(&h);
}

// The block's images of 8-bit codes staged for conv1 as float16 values (exact), twice: copy 0 as
// the images lie (rows of ROWH halves, a zero after each where IN_W * IN_C is odd; images past imgs
// zeros), copy 1 = copy 0 one half on (copy1[i] = copy0[i + 1]), so every pair of k a window reads is
// one aligned word of one copy: a load a register, no conversion (it was two float loads and a
// conversion). Past each copy's images zeros, which padded k read (times a zero weight). idx: as
// stage_images. Out of line, as stage_images4.
template <int LOADS = 4>
__device__ __noinline__ void stage_codes(float* stage, const float* __restrict__ x, int img0, int imgs, const int* __restrict__ idx) {
    constexpr int IMG = IN_H * IN_W * IN_C, ROW = IN_W * IN_C, END = IMGS * IN_H * ROWH;
    unsigned short* c0 = reinterpret_cast<unsigned short*>(stage);  // half bits
    unsigned short* c1 = c0 + COPYH;
    const int t = threadIdx.x;
    if (t < COPYH - END) c0[END + t] = 0;
    if (t <= COPYH - END) c1[END - 1 + t] = 0;
    const auto src = [&](int i) { return (size_t)(idx != nullptr ? idx[img0 + i / IMG] : img0 + i / IMG) * IMG + i % IMG; };
    if constexpr (IMG % 4 == 0 && ROWH == ROW) {
        // a word of 4 codes a unit, stored where it lies in copy 0 and one half back in copy 1; a code b
        // is the float16 1024 + b (its bits 0x6400 | b) less 1024
        constexpr int PER = IMG / 4, UNITS = X_FLOATS / 4;
        const unsigned* words = reinterpret_cast<const unsigned*>(x);
#pragma unroll 1
        for (int u0 = t; u0 < UNITS; u0 += LOADS * FUSED_THREADS) {
            unsigned raw[LOADS];
#pragma unroll
            for (int k = 0; k < LOADS; ++k) {
                const int u = u0 + k * FUSED_THREADS;
                raw[k] = u < imgs * PER ? words[src(4 * u) / 4] : 0u;
            }
#pragma unroll
            for (int k = 0; k < LOADS; ++k) {
                const int u = u0 + k * FUSED_THREADS;
                if (u < UNITS) {
                    const unsigned w = raw[k];
                    const unsigned h01 = code_halves(w, 0x4140), h23 = code_halves(w, 0x4342), h12 = code_halves(w, 0x4241);
                    reinterpret_cast<uint2*>(c0)[u] = make_uint2(h01, h23);
                    reinterpret_cast<unsigned*>(c1)[2 * u] = h12;
                    c1[4 * u + 2] = h23 >> 16;
                    if (u > 0) c1[4 * u - 1] = h01 & 0xffffu;
                }
            }
        }
    } else {
        const unsigned char* bytes = reinterpret_cast<const unsigned char*>(x);
        for (int i = t; i < IMGS * IMG; i += FUSED_THREADS) {
            const int o = i % IMG, xc = o % ROW, h = i / IMG * IN_H * ROWH + o / ROW * ROWH + xc;
            const unsigned short v = i < imgs * IMG ? code_halves(bytes[src(i)], 0x4140) & 0xffffu : 0;
            c0[h] = v;
            if (h > 0) c1[h - 1] = v;
            if (ROWH > ROW && xc == ROW - 1) c0[h + 1] = c1[h] = 0;  // the row's padding
        }
    }
}

// conv1 in 3xTF32 for one tile's two rounds (dy) of windows base[0], base[1] (rows g, g + 8 of the
// warp's 16): sum[e], the window's four ReLU'd outputs added in the reference's order. koff: the
// pixel of k = 8 ks + tig + 4 j (padded k: the window's first, times a zero weight).
__device__ __forceinline__ void conv1_split_tile(const float* stage, const int (&base)[2], const int (&koff)[KS1][2], float (&sum)[16]) {
    const int tig = threadIdx.x % 4;
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
            const int off = conv1_pixel(k);
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
}

// conv1 from codes for one tile's two rounds (dy) of windows whose first values are the words
// base[0], base[1] of copy 0 (rows g, g + 8 of the warp's 16), staged by stage_codes: sum[e] as
// conv1_split_tile's, times the channel's c0 2^-S (f[2c + e] for accumulator 4c + 2h + e). koff: the
// words of the pairs k = 16 ks + 8 j + 2 tig, k + 1 from a window's first (codes_pair_word).
__device__ __forceinline__ void conv1_codes_tile(const float* stage, unsigned wlo, const int (&base)[2],
                                                 const int (&koff)[KS16][2], const float (&f)[8], float (&sum)[16]) {
    const unsigned* words = reinterpret_cast<const unsigned*>(stage);
#pragma unroll(KS16 > 2 ? 1 : 2)  // rolled past 2 steps: unrolled, fused_kernel4 spilled for K1*K1*IN_C = 50
    for (int dy = 0; dy < 2; ++dy) {
        float acc[2][16];
        // G k16 steps at a time, every A fragment written before the fence and kept until the drain:
        // all of ECE408's 2; one at a time past 2 (four at once spilled)
        constexpr int G = KS16 <= 2 ? KS16 : 1;
#pragma unroll
        for (int k0 = 0; k0 < KS16; k0 += G) {
            unsigned a[2][G][4];
#pragma unroll
            for (int dx = 0; dx < 2; ++dx) {
                // the window position's first value, dy rows and dx pixels on, in copy 0 where it is
                // even (a pair's offset is even), else one half back in copy 1
                const int off = dy * ROWH + dx * IN_C, at = (off % 2 == 0 ? off : COPYH + off - 1) / 2;
#pragma unroll
                for (int i = 0; i < G; ++i)
#pragma unroll
                    for (int r = 0; r < 4; ++r) a[dx][i][r] = words[base[r % 2] + at + koff[k0 + i][r / 2]];
            }
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int i = 0; i < G; ++i)
#pragma unroll
                for (int dx = 0; dx < 2; ++dx) {
                    // a step's weights: 16 C1 floats, lo then hi (the smaller products first), in 16-byte units
                    const int ks = k0 + i;
                    wgmma16(acc[dx], a[dx][i], desc(wlo + ks * 4 * C1), ks != 0);
                    wgmma16(acc[dx], a[dx][i], desc(wlo + ks * 4 * C1 + 2 * C1), 1);
                }
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            wgmma_drain();
        }
#pragma unroll
        for (int e = 0; e < 16; ++e)
            sum[e] = dy == 0 ? relu(acc[0][e]) + relu(acc[1][e]) : (sum[e] + relu(acc[0][e])) + relu(acc[1][e]);
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) sum[e] *= f[e / 4 * 2 + e % 2];
}

struct NoGroups {
    __device__ void operator()() const {}
};

// store(img, py, px, ch, o) keeps the pooled outputs o of channels ch, ch + 1 at (py, px) of image img
// (p1's layout is the kernel's). Where amax is not null, amax[i] ends as the largest pooled output of
// image i, inf where one is NaN (as float bits: they are not negative), max'ed in by one atomic per
// warp and image. idx: as stage_images takes it; scaling: -1 for float32 images, else 8-bit codes of
// that scaling (codes.SCALINGS; scale = float32(1/255), c0 for scalings 0 and 1). started() runs once the weights' copies are issued
// and may commit LATER cp.async groups of its own (fused_kernel6's first slab), left in flight.
template <int LATER = 0, class Store, class Started = NoGroups>
__device__ __forceinline__ void conv1_wgmma(float* stage, const float* __restrict__ x, int img0, int imgs,
                                            int* __restrict__ bad, unsigned* amax, Store store,
                                            const int* __restrict__ idx, int scaling, float scale, Started started = {}) {
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int wg = warp / 4, w = warp % 4;
    float top[IMGS] = {};
    const bool codes = scaling >= 0;
    // Phase 0: conv1's weights copied (the form the images take), this block's images staged (zeros
    // past the end of the batch) and checked meanwhile.
    const float* w1 = codes ? c_w1 + W1F_FLOATS : c_w1;
    for (int i = t; i < (codes ? W1C_FLOATS : W1F_FLOATS) / 4; i += FUSED_THREADS) cp_async16(stage + X_PAD + 4 * i, w1 + 4 * i, true);
    cp_async_commit();
    started();
    if (codes)
        stage_codes(stage, x, img0, imgs, idx);
    else
        stage_images4(stage, x, img0, imgs, bad, idx);
    cp_async_wait<LATER>();
    asm volatile("fence.proxy.async.shared::cta;");  // w1 and the images written here, w1 read by the tensor cores
    __syncthreads();

    // Phase 1: conv1 -> ReLU -> pool into p1. Tiles of 64 pool windows (the block's, image after image):
    // rows 16 w + g and + 8 of a warpgroup's tile are windows base[0], base[1]; each window position (dy,
    // dx) is an m64n32 tile of its own, two (dx = 0, 1) a round, so a lane pools its own accumulators,
    // in the reference's order ((a + b) + c) + d. Padded k read the window's pixel (finite, times a zero
    // weight); windows past the last are computed on window 0 and not stored.
    {
        // conv(base, sum) for each of the warpgroup's tiles, then the pooled outputs stored
        const auto tiles = [&](auto&& conv) {
            for (int tile = wg; tile < WTILES1; tile += 2) {
                int base[2];  // the windows' first values in stage (from codes: words of copy 0)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int win = tile * 64 + 16 * w + g + 8 * h;
                    const int wc = win < IMGS * P1H * P1W ? win : 0, img = wc / (P1H * P1W), py = wc / P1W % P1H, px = wc % P1W;
                    base[h] = codes ? ((img * IN_H + 2 * py) * ROWH + 2 * px * IN_C) / 2 : ((img * IN_H + 2 * py) * IN_W + 2 * px) * IN_C;
                }
                float sum[16];
                conv(base, sum);
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
        };
        if (codes) {
            int koff[KS16][2];
#pragma unroll
            for (int ks = 0; ks < KS16; ++ks)
#pragma unroll
                for (int j = 0; j < 2; ++j) koff[ks][j] = codes_pair_word(16 * ks + 8 * j + 2 * tig);
            float f[8];  // accumulator 4c + 2h + e's channel 8c + 2tig + e: its c0 2^-S at f[2c + e]
#pragma unroll
            for (int c = 0; c < C1 / 8; ++c)
#pragma unroll
                for (int e = 0; e < 2; ++e) f[2 * c + e] = (scaling == 2 ? 1.0f : scale) * c_w1_scale[8 * c + 2 * tig + e];
            const unsigned wlo = desc_lo(stage + X_PAD);
            tiles([&](const int (&base)[2], float (&sum)[16]) { conv1_codes_tile(stage, wlo, base, koff, f, sum); });
        } else {
            int koff[KS1][2];
#pragma unroll
            for (int ks = 0; ks < KS1; ++ks)
#pragma unroll
                for (int j = 0; j < 2; ++j) koff[ks][j] = conv1_pixel(8 * ks + tig + 4 * j);
            tiles([&](const int (&base)[2], float (&sum)[16]) { conv1_split_tile(stage, base, koff, sum); });
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
