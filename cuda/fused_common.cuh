// What the fused kernels (fused1.cu .. fused4.cu) share: the geometry that follows from the
// -D shapes, the host's shared-memory layout checked, and phase 0 (the images staged and checked).
#pragma once

#define FUSED_THREADS 256
#if !defined(IMGS) || !defined(PSTR) || !defined(RSTR) || !defined(ISTR) || !defined(STAGE_FLOATS)
#error "fused: the host passes the images per block and the shared-memory layout (launch.Fused.plan) as -D options"
#endif

#include "common.cuh"

constexpr int H1 = IN_H - K1 + 1, W1 = IN_W - K1 + 1;
constexpr int P1H = H1 / 2, P1W = W1 / 2;
constexpr int H2 = P1H - K2 + 1, W2 = P1W - K2 + 1;
constexpr int P2H = H2 / 2, P2W = W2 / 2;
constexpr int X_FLOATS = IMGS * IN_H * IN_W * IN_C;
constexpr int SLAB = C1 * C2;  // one (kh, kw) slab of w2
constexpr int P1_FLOATS = IMGS * ISTR;  // the pooled conv1 output, then the stage area

static_assert(FUSED_THREADS % C1 == 0, "fused: conv1 channels must divide the block");
#ifndef P1_HALVES
#define P1_HALVES 0  // fused_kernel5 keeps p1 in float16: a pixel's C1 channels in C1 / 2 floats
#endif
static_assert(PSTR * (P1_HALVES ? 2 : 1) >= C1 && RSTR >= P1W * PSTR && ISTR >= P1H * RSTR, "fused: p1 strides overlap its pixels");
static_assert(P1_FLOATS % 4 == 0, "fused: the stage area must start 16-byte aligned");
static_assert(STAGE_FLOATS >= X_FLOATS, "fused: the stage area must hold the block's images");
static_assert((P1_FLOATS + STAGE_FLOATS) * 4 <= 227 * 1024, "fused: shared memory over the 227 KB a block may have");

// Phase 0: images [img0, img0 + imgs) of x into stage (zeros past them up to IMGS), each value checked
// where bad is not null; where idx is not null, image j of the block is x's image idx[img0 + j] (the
// certified path's recomputed share, read where it lies); where codes, x holds 8-bit codes (a byte a
// value), staged as their integer values (fused_conv1_wgmma.cuh computes conv1 from them). Each thread's
// loads go out STAGE_LOADS at a time before any is used: one at a time, a block waited on ~13 trips
// to memory in turn (ncu: fused_kernel3's staging 11.6% of its stall samples, long scoreboard).
constexpr int STAGE_LOADS = 8;
template <int LOADS = STAGE_LOADS>
__device__ __forceinline__ void stage_images(float* stage, const float* __restrict__ x, int img0, int imgs,
                                             int* __restrict__ bad, const int* __restrict__ idx = nullptr,
                                             bool codes = false) {
    constexpr int IMG = IN_H * IN_W * IN_C;
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(x);
    for (int i0 = threadIdx.x; i0 < X_FLOATS; i0 += LOADS * FUSED_THREADS) {
        float v[LOADS];
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int i = i0 + k * FUSED_THREADS;
            v[k] = 0.0f;
            if (i < imgs * IMG) {
                const size_t at = idx != nullptr ? (size_t)idx[img0 + i / IMG] * IMG + i % IMG : (size_t)img0 * IMG + i;
                v[k] = codes ? (float)bytes[at] : x[at];
            }
        }
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int i = i0 + k * FUSED_THREADS;
            if (i < X_FLOATS) {
                if (bad != nullptr && !isfinite(v[k])) atomicMin(bad, img0 + i / IMG);
                stage[i] = v[k];
            }
        }
    }
}
