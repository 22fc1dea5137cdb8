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
#define P1_HALVES 0  // fused_kernel6 keeps p1 in float16: a pixel's C1 channels in C1 / 2 floats
#endif
static_assert(PSTR * (P1_HALVES ? 2 : 1) >= C1 && RSTR >= P1W * PSTR && ISTR >= P1H * RSTR, "fused: p1 strides overlap its pixels");
static_assert(P1_FLOATS % 4 == 0, "fused: the stage area must start 16-byte aligned");
static_assert(STAGE_FLOATS >= X_FLOATS, "fused: the stage area must hold the block's images");
static_assert((P1_FLOATS + STAGE_FLOATS) * 4 <= 227 * 1024, "fused: shared memory over the 227 KB a block may have");

// Phase 0: images [img0, img0 + imgs) of x into stage (zeros past them up to IMGS), each value checked
// where bad is not null; where idx is not null, image j of the block is x's image idx[img0 + j] (the
// certified path's recomputed share, read where it lies; 8-bit codes are staged by
// fused_conv1_wgmma.cuh's stage_codes). Each thread's
// loads go out STAGE_LOADS at a time before any is used: one at a time, a block waited on ~13 trips
// to memory in turn (ncu: fused_kernel3's staging 11.6% of its stall samples, long scoreboard).
constexpr int STAGE_LOADS = 8;
template <int LOADS = STAGE_LOADS>
__device__ __forceinline__ void stage_images(float* stage, const float* __restrict__ x, int img0, int imgs,
                                             int* __restrict__ bad, const int* __restrict__ idx = nullptr) {
    constexpr int IMG = IN_H * IN_W * IN_C;
    for (int i0 = threadIdx.x; i0 < X_FLOATS; i0 += LOADS * FUSED_THREADS) {
        float v[LOADS];
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int i = i0 + k * FUSED_THREADS;
            v[k] = 0.0f;
            if (i < imgs * IMG) {
                const size_t at = idx != nullptr ? (size_t)idx[img0 + i / IMG] * IMG + i % IMG : (size_t)img0 * IMG + i;
                v[k] = x[at];
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

// stage_images with 4 values a load (a float4), for images whose values come in 4s (others take
// stage_images): ECE408's 4 images are 3.1 loads a thread, all out before any is used. Kept out of
// line: inlined, ptxas spilled the certified pass's fused kernel (at its 128 registers) for a 3x3
// conv2 whatever the loads in flight.
template <int LOADS = 4>
__device__ __noinline__ void stage_images4(float* stage, const float* __restrict__ x, int img0, int imgs,
                                          int* __restrict__ bad, const int* __restrict__ idx) {
    constexpr int IMG = IN_H * IN_W * IN_C;
    if constexpr (IMG % 4 != 0) {
        stage_images(stage, x, img0, imgs, bad, idx);
    } else {
        constexpr int PER = IMG / 4, UNITS = X_FLOATS / 4;
        const float4* src = reinterpret_cast<const float4*>(x);
#pragma unroll 1
        for (int u0 = threadIdx.x; u0 < UNITS; u0 += LOADS * FUSED_THREADS) {
            float4 v[LOADS];
#pragma unroll
            for (int k = 0; k < LOADS; ++k) {
                const int u = u0 + k * FUSED_THREADS;
                v[k] = {};
                if (u < imgs * PER) v[k] = src[(size_t)(idx != nullptr ? idx[img0 + u / PER] : img0 + u / PER) * PER + u % PER];
            }
#pragma unroll
            for (int k = 0; k < LOADS; ++k) {
                const int u = u0 + k * FUSED_THREADS;
                if (u < UNITS) {
                    if (bad != nullptr && !(isfinite(v[k].x) && isfinite(v[k].y) && isfinite(v[k].z) && isfinite(v[k].w)))
                        atomicMin(bad, img0 + u / PER);
                    reinterpret_cast<float4*>(stage)[u] = v[k];
                }
            }
        }
    }
}
