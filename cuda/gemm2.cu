// The classic pipeline's GEMM, for both convolutions and both fcs.
// c (M, N) = a (M, K) . b (K, N), all row-major float32; apply_relu != 0 applies ReLU on store.
// conv: a = weights re-laid (C_out, K*K*C), b = unrolled input (K*K*C, P) -> c (C_out, P)
//   (version 4 the transposed product: a = unrolled input (P, K*K*C), b = weights -> c (P, C_out))
// fc:   a = features (n, in), b = weights (in, out) -> c (n, out)
// 2*M*N*K FLOPs in every version; TILE_WIDTH (-D) is the block tile, the dynamic shared memory
// (SHARED_FLOATS, -D from the host's launch.Gemm) is static_asserted against the kernel's stages.
// gemm_kernel2: register-blocked FP32: block tile TILE_WIDTH (32, 64, 128) x 128, k-tiles of 16;
//   256 threads, each a (TW/16) x 8 micro-tile (two float4 column groups); a staged transposed,
//   b with float4 loads where N % 4 == 0; the next k-tile prefetched into registers while this one
//   is used (double-buffered shared memory, one barrier per k-tile); grid (ceil(N/128), ceil(M/TW));
//   reads a N/128 times and b M/TW times.

#include "gemm_store.cuh"

constexpr int BN = 128;
static_assert(TM == 32 || TM == 64 || TM == 128, "gemm: block tiles are 32, 64 or 128 rows");

constexpr int RM = TM / 16;  // rows of a thread's micro-tile
constexpr int A_PER_THREAD = TM * BK / THREADS;
constexpr int AST = TM + 4;  // transposed a tile: k rows of TM (+4 against store conflicts)

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_kernel2(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
             int M, int N, int K, int apply_relu) {
    __shared__ __align__(16) float as[2][BK * AST];
    __shared__ __align__(16) float bs[2][BK * BN];
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * BN;
    const bool vec_b = N % 4 == 0;  // rows of b start 16-byte aligned
    float ra[A_PER_THREAD], rb[8];

    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_PER_THREAD; ++i) {
            const int e = t + i * THREADS, row = m0 + e / BK, k = k0 + e % BK;
            ra[i] = row < M && k < K ? __ldg(a + (size_t)row * K + k) : 0.0f;
        }
        if (vec_b) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int e = t + i * THREADS, k = k0 + e / (BN / 4), col = n0 + 4 * (e % (BN / 4));
                const float4 v = k < K && col < N ? __ldg(reinterpret_cast<const float4*>(b + (size_t)k * N + col))
                                                  : make_float4(0.f, 0.f, 0.f, 0.f);
                rb[4 * i] = v.x, rb[4 * i + 1] = v.y, rb[4 * i + 2] = v.z, rb[4 * i + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int e = t + i * THREADS, k = k0 + e / BN, col = n0 + e % BN;
                rb[i] = k < K && col < N ? __ldg(b + (size_t)k * N + col) : 0.0f;
            }
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_PER_THREAD; ++i) {
            const int e = t + i * THREADS;
            as[buf][(e % BK) * AST + e / BK] = ra[i];
        }
        if (vec_b) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int e = t + i * THREADS;
                *reinterpret_cast<float4*>(&bs[buf][(e / (BN / 4)) * BN + 4 * (e % (BN / 4))]) =
                    make_float4(rb[4 * i], rb[4 * i + 1], rb[4 * i + 2], rb[4 * i + 3]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) bs[buf][t + i * THREADS] = rb[i];
        }
    };

    float acc[RM][8];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    const int tiles = (K + BK - 1) / BK;
    load(0);
    store(0);
    __syncthreads();
    for (int tile = 0; tile < tiles; ++tile) {
        const int buf = tile & 1;
        if (tile + 1 < tiles) load((tile + 1) * BK);  // global loads in flight during the math
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float av[RM];
#pragma unroll
            for (int i = 0; i < RM; i += 2) {
                const float2 v = *reinterpret_cast<const float2*>(&as[buf][k * AST + ty * RM + i]);
                av[i] = v.x, av[i + 1] = v.y;
            }
            const float4 b0 = *reinterpret_cast<const float4*>(&bs[buf][k * BN + 4 * tx]);
            const float4 b1 = *reinterpret_cast<const float4*>(&bs[buf][k * BN + 64 + 4 * tx]);
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (tile + 1 < tiles) store(buf ^ 1);  // buf ^ 1 was last read before the previous barrier
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            store_row(c, M, N, m0 + ty * RM + i, n0 + 64 * h + 4 * tx, &acc[i][4 * h], 4, apply_relu);
}
