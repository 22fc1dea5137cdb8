// The classic pipeline's GEMM, for both convolutions and both fcs.
// c (M, N) = a (M, K) . b (K, N), all row-major float32; apply_relu != 0 applies ReLU on store.
// conv: a = weights re-laid (C_out, K*K*C), b = unrolled input (K*K*C, P) -> c (C_out, P)
//   (version 4 the transposed product: a = unrolled input (P, K*K*C), b = weights -> c (P, C_out))
// fc:   a = features (n, in), b = weights (in, out) -> c (n, out)
// 2*M*N*K FLOPs in every version; TILE_WIDTH (-D) is the block tile, the dynamic shared memory
// (SHARED_FLOATS, -D from the host's launch.Gemm) is static_asserted against the kernel's stages.
// gemm_kernel1: TILE_WIDTH x TILE_WIDTH (8, 16, 32) tiles of a and b in shared memory, one output
//   per thread; block TILE_WIDTH^2, grid (ceil(N/TW), ceil(M/TW)); reads a and b N/TW and M/TW times.

#ifndef TILE_WIDTH
#error "gemm v1: the host passes the square tile as -DTILE_WIDTH"
#endif

#include "common.cuh"

extern "C" __global__ void gemm_kernel1(const float* __restrict__ a, const float* __restrict__ b,
                                        float* __restrict__ c, int M, int N, int K, int apply_relu) {
    __shared__ float as[TILE_WIDTH][TILE_WIDTH];
    __shared__ float bs[TILE_WIDTH][TILE_WIDTH];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE_WIDTH + ty, col = blockIdx.x * TILE_WIDTH + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE_WIDTH) {
        as[ty][tx] = (row < M && k0 + tx < K) ? a[(size_t)row * K + k0 + tx] : 0.0f;
        bs[ty][tx] = (k0 + ty < K && col < N) ? b[(size_t)(k0 + ty) * N + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE_WIDTH; ++k) acc = fmaf(as[ty][k], bs[k][tx], acc);
        __syncthreads();
    }
    if (row < M && col < N) c[(size_t)row * N + col] = apply_relu ? relu(acc) : acc;
}
