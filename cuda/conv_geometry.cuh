// What conv_kernel1 and conv_kernel2 share: the conv's geometry from the -D shapes.
#pragma once
#if !defined(IN_H) || !defined(IN_W) || !defined(IN_C) || !defined(KS) || !defined(C_OUT) || !defined(BN)
#error "conv: the host passes the shapes and the column block BN as -D options"
#endif

#include "common.cuh"
#include "mma.cuh"

constexpr int OH = IN_H - KS + 1, OW = IN_W - KS + 1, PH = OH / 2, PW = OW / 2, WINDOWS = PH * PW;
constexpr int KTOT = KS * KS * IN_C;
constexpr int THREADS = 256, BK = 16;
constexpr int AST = BK + 4;  // conflict-free fragment loads (see gemm3.cu)
constexpr bool VEC_A = IN_C % 4 == 0;
