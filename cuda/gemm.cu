// The classic pipeline's GEMM, for both convolutions and both fcs.
// c (M, N) = a (M, K) . b (K, N), all row-major float32; apply_relu != 0 applies ReLU on store.
// conv: a = weights re-laid (C_out, K*K*C), b = unrolled input (K*K*C, P) -> c (C_out, P)
//   (version 4 the transposed product: a = unrolled input (P, K*K*C), b = weights -> c (P, C_out))
// fc:   a = features (n, in), b = weights (in, out) -> c (n, out)
// 2*M*N*K FLOPs in every version; GEMM_VERSION picks the kernel compiled, TILE_WIDTH its tile.
// gemm_kernel1: TILE_WIDTH x TILE_WIDTH (8, 16, 32) tiles of a and b in shared memory, one output
//   per thread; block TILE_WIDTH^2, grid (ceil(N/TW), ceil(M/TW)); reads a and b N/TW and M/TW times.
// gemm_kernel2: register-blocked FP32: block tile TILE_WIDTH (32, 64, 128) x 128, k-tiles of 16;
//   256 threads, each a (TW/16) x 8 micro-tile (two float4 column groups); a staged transposed,
//   b with float4 loads where N % 4 == 0; the next k-tile prefetched into registers while this one
//   is used (double-buffered shared memory, one barrier per k-tile); grid (ceil(N/128), ceil(M/TW));
//   reads a N/128 times and b M/TW times.
// gemm_kernel3 (sm_80+): the same block tiles on the tensor cores in 3xTF32 (FP32-level accuracy):
//   8 warps of (TW/2 or 32) x (32 or 16) warp tiles of mma.m16n8k8, k-tiles of 16 through a
//   3-stage cp.async pipeline (zero-filled past the edges), operands split at fragment load.
// gemm_kernel4 (sm_90a): the transposed conv product on Hopper's wgmma in 3xTF32: a = activations
//   (M, K) row-major (the unroll_kernel3 matrix (P, K*K*C), or the fc features), b = weights (K, N)
//   split into TF32 parts and remainders once by the host and laid out as wgmma's K-major core
//   matrices per column block, (N / BN, KP / 8, {hi, lo}, BN / 8, 2, 8, 4), KP = K rounded up to 16;
//   so a conv's c (P, C_out) is already NHWC and needs no placeIntoY. Block 128 rows x BN (16, 32,
//   64: GEMM_BN) = two warpgroups of one m64nBNk8 tile each, a split in registers, k-tiles of 16
//   through a 4-stage cp.async pipeline fetched 2 ahead, KCH k-tiles summed in the tensor cores
//   then added in FP32 (as conv_kernel2); grid (ceil(M / 128), ceil(N / BN)); 6 * M * BN * KP tensor
//   FLOPs per column block.

#ifndef GEMM_VERSION
#define GEMM_VERSION 1
#endif
#ifndef TILE_WIDTH
#define TILE_WIDTH 16
#endif

#include "common.cuh"

#if GEMM_VERSION == 1

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

#else

constexpr int TM = TILE_WIDTH, BK = 16, THREADS = 256;
#if GEMM_VERSION == 4
#ifndef GEMM_BN
#define GEMM_BN 64
#endif
constexpr int BN = GEMM_BN;
static_assert(TM == 128, "gemm v4: block tiles are 128 rows (two warpgroups of 64)");
static_assert(BN == 16 || BN == 32 || BN == 64, "gemm v4: GEMM_BN is 16, 32 or 64");
#else
constexpr int BN = 128;
static_assert(TM == 32 || TM == 64 || TM == 128, "gemm: block tiles are 32, 64 or 128 rows");
#endif

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

#if GEMM_VERSION == 2

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

#elif GEMM_VERSION == 3

#include "mma.cuh"

constexpr int STAGES = 3;
constexpr int WARPS_M = TM >= 64 ? 2 : 1, WARPS_N = 8 / WARPS_M;
constexpr int WTM = TM / WARPS_M, WTN = BN / WARPS_N, MT = WTM / 16, NT = WTN / 8;
// Row strides of the a tile (k contiguous) and b tile (n contiguous): BK + 4 and BN + 8 floats put
// the 32 lanes' fragment loads on 32 different banks.
constexpr int AST = BK + 4, BST = BN + 8;
constexpr int A_FLOATS = TM * AST, STAGE_FLOATS = A_FLOATS + BK * BST;

// Start the async copy of k-tile k0 of a and b into one pipeline stage (zeros past the edges).
__device__ __forceinline__ void fetch(float* stage, const float* __restrict__ a, const float* __restrict__ b,
                                      int M, int N, int K, int m0, int n0, int k0) {
    const int t = threadIdx.x;
    float* as = stage;
    float* bs = stage + A_FLOATS;
#pragma unroll
    for (int i = 0; i < TM * BK / THREADS; ++i) {
        const int e = t + i * THREADS, row = e / BK, k = e % BK;
        const bool ok = m0 + row < M && k0 + k < K;
        cp_async4(as + row * AST + k, ok ? a + (size_t)(m0 + row) * K + k0 + k : a, ok);
    }
    if (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < BK * BN / 4 / THREADS; ++i) {
            const int e = t + i * THREADS, k = e / (BN / 4), col = 4 * (e % (BN / 4));
            const bool ok = k0 + k < K && n0 + col < N;
            cp_async16(bs + k * BST + col, ok ? b + (size_t)(k0 + k) * N + n0 + col : b, ok);
        }
    } else {
#pragma unroll
        for (int i = 0; i < BK * BN / THREADS; ++i) {
            const int e = t + i * THREADS, k = e / BN, col = e % BN;
            const bool ok = k0 + k < K && n0 + col < N;
            cp_async4(bs + k * BST + col, ok ? b + (size_t)(k0 + k) * N + n0 + col : b, ok);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_kernel3(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
             int M, int N, int K, int apply_relu) {
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, tig = lane % 4;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * BN;
    const int tiles = (K + BK - 1) / BK;

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) fetch(smem + s * STAGE_FLOATS, a, b, M, N, K, m0, n0, s * BK);
        cp_async_commit();
    }
    for (int tile = 0; tile < tiles; ++tile) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of k-tile `tile` have landed
        __syncthreads();              // everyone's have, and everyone is done with tile - 1's stage
        const int next = tile + STAGES - 1;
        if (next < tiles) fetch(smem + (next % STAGES) * STAGE_FLOATS, a, b, M, N, K, m0, n0, next * BK);
        cp_async_commit();
        const float* as = smem + (tile % STAGES) * STAGE_FLOATS + (wm * WTM + g) * AST + tig;
        const float* bs = smem + (tile % STAGES) * STAGE_FLOATS + A_FLOATS + tig * BST + wn * WTN + g;
#pragma unroll
        for (int ks = 0; ks < BK; ks += 8) {
            unsigned bhi[NT][2], blo[NT][2];
            b_fragments(bs + ks * BST, BST, bhi, blo);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                unsigned ahi[4], alo[4];
                a_fragment(as + i * 16 * AST + ks, AST, ahi, alo);
#pragma unroll
                for (int j = 0; j < NT; ++j) mma3_add(acc[i][j], ahi, alo, bhi[j][0], bhi[j][1], blo[j][0], blo[j][1]);
            }
        }
    }
    cp_async_wait<0>();
    // Accumulator r of tile (i, j): row g (r < 2) or g + 8, column 2 * tig + r % 2.
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                store_row(c, M, N, m0 + wm * WTM + i * 16 + g + 8 * h, n0 + wn * WTN + j * 8 + 2 * tig,
                          &acc[i][j][2 * h], 2, apply_relu);
}

#else  // GEMM_VERSION == 4

#include "wgmma.cuh"

// Block tile rows 64 wg + 16 w + g (+ 8) belong to warp w of warpgroup wg; stage = a tile (k
// contiguous, rows AST apart: conflict-free fragment loads) then the k-tile's hi/lo weights.
constexpr int STAGES = 4, KCH = 16, AST = BK + 4;
constexpr int A_FLOATS = TM * AST, B_FLOATS = 2 * BK * BN, STAGE_FLOATS = A_FLOATS + B_FLOATS;

// Start the async copy of k-tile `tile` of a (zeros past M and K) and of the column block's weights.
__device__ __forceinline__ void fetch(float* stage, const float* __restrict__ a, const float* __restrict__ wb,
                                      int M, int K, int m0, int tile) {
    const int t = threadIdx.x, k0 = tile * BK;
    if (K % 4 == 0) {  // rows start 16-byte aligned: 4 consecutive k per copy
#pragma unroll
        for (int i = 0; i < TM * BK / 4 / THREADS; ++i) {
            const int e = t + i * THREADS, row = e / (BK / 4), k = 4 * (e % (BK / 4));
            const bool ok = m0 + row < M && k0 + k < K;
            cp_async16(stage + row * AST + k, ok ? a + (size_t)(m0 + row) * K + k0 + k : a, ok);
        }
    } else {
#pragma unroll 1  // the rare path (fc with K % 4 != 0), rolled: unrolled it spills at BN 64
        for (int i = 0; i < TM * BK / THREADS; ++i) {
            const int e = t + i * THREADS, row = e / BK, k = e % BK;
            const bool ok = m0 + row < M && k0 + k < K;
            cp_async4(stage + row * AST + k, ok ? a + (size_t)(m0 + row) * K + k0 + k : a, ok);
        }
    }
    const float4* src = reinterpret_cast<const float4*>(wb + (size_t)tile * B_FLOATS);
#pragma unroll
    for (int e = t; e < B_FLOATS / 4; e += THREADS) cp_async16(stage + A_FLOATS + 4 * e, src + e, true);
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
gemm_kernel4(const float* __restrict__ a, const float* __restrict__ wf, float* __restrict__ c,
             int M, int N, int K, int apply_relu) {
    extern __shared__ float4 smem4[];
    float* stages = reinterpret_cast<float*>(smem4);
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tig = lane % 4;
    const int wg = warp / 4, w = warp % 4;
    const int m0 = blockIdx.x * TM, tiles = (K + BK - 1) / BK;
    const float* wb = wf + (size_t)blockIdx.y * tiles * B_FLOATS;  // this column block's weights

    float acc[1][BN / 2];
    mma3_k_loop<BN, BK, STAGES, KCH, AST, A_FLOATS, STAGE_FLOATS>(
        acc, stages, (64 * wg + 16 * w + g) * AST + tig, tiles,
        [&](int tile) { fetch(stages + (tile % STAGES) * STAGE_FLOATS, a, wb, M, K, m0, tile); });
    // Accumulators 4 j + {0, 1}: row g, columns 8 j + 2 tig + {0, 1}; 4 j + {2, 3}: row g + 8.
    const int row = m0 + 64 * wg + 16 * w + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            store_row(c, M, N, row + 8 * h, blockIdx.y * BN + 8 * j + 2 * tig, &acc[0][4 * j + 2 * h], 2, apply_relu);
}

#endif
#endif
