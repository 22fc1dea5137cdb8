// What conv_kernel1, conv_kernel2 and conv_kernel3 share: the conv's geometry from the -D shapes.
#pragma once
#if !defined(IN_H) || !defined(IN_W) || !defined(IN_C) || !defined(KS) || !defined(C_OUT) || !defined(BN)
#error "conv: the host passes the shapes and the column block BN as -D options"
#endif

#include "common.cuh"
#include "mma.cuh"

constexpr int OH = IN_H - KS + 1, OW = IN_W - KS + 1, PH = OH / 2, PW = OW / 2, WINDOWS = PH * PW;
constexpr int KTOT = KS * KS * IN_C;
#ifndef CONV_BK
#define CONV_BK 16
#endif
constexpr int THREADS = 256, BK = CONV_BK;  // a k-tile: 16, or 32 (conv_kernel2)
static_assert(BK == 16 || BK == 32, "conv: k-tiles of 16 or 32");
constexpr int AST = BK + 4;  // conflict-free fragment loads (see gemm3.cu): rows 4 banks apart
constexpr bool VEC_A = IN_C % 4 == 0;

// Offset in x of k index r = (kh, kw, c) from a conv output's top-left input value.
__device__ __forceinline__ int k_offset(int r) {
    const int kh = r / (KS * IN_C), kw = (r / IN_C) % KS, c = r % IN_C;
    return (kh * IN_W + kw) * IN_C + c;
}
