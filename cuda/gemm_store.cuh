// What the register-tiled GEMMs (gemm2.cu, gemm3.cu, gemm4.cu) share: the block shape and the
// guarded, ReLU-applying store of an output pair or quad.
#pragma once
#include "common.cuh"

#ifndef TILE_WIDTH
#error "gemm: the host passes the block tile's rows as -DTILE_WIDTH"
#endif
constexpr int TM = TILE_WIDTH, BK = 16, THREADS = 256;

// One output pair or quad (ReLU'd if asked), guarded against the right and bottom edges.
__device__ __forceinline__ void store_row(float* __restrict__ c, int M, int N, int row, int col,
                                          const float* v, int count, bool apply_relu) {
    if (row >= M) return;
    float o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = j < count ? (apply_relu ? relu(v[j]) : v[j]) : 0.0f;
    float* dst = c + (size_t)row * N + col;
    if (count == 4 && N % 4 == 0 && col + 3 < N) {
        *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
    } else if (count == 2 && N % 2 == 0 && col + 1 < N) {
        *reinterpret_cast<float2*>(dst) = make_float2(o[0], o[1]);
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (j < count && col + j < N) dst[j] = o[j];
    }
}
