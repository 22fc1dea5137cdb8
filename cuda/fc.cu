// The classifier in one kernel: fc1 (FEAT -> HIDDEN) -> ReLU -> fc2 (HIDDEN -> CLASSES) -> argmax.
// in: features (n, FEAT) float32; fc1 (FEAT, HIDDEN), fc2 (HIDDEN, CLASSES) row-major.
// out: labels (n) int32, the first index of each image's maximum score; *overflow = min(*overflow,
// image) for every image whose scores are not all finite (float32 overflow); the scores (n, CLASSES)
// float32 too unless `scores_out` is null.
// fc_kernel1 (retired: fc_kernel4 does its work): block HIDDEN threads, one hidden unit each x
//   FC_IMGS images in registers, fc1 and the features staged through shared memory FC_TILE rows at
//   a time; 5 shared loads per 16 FMAs. 2*(FEAT*HIDDEN + HIDDEN*CLASSES) FLOPs per image.
// fc_kernel2 + fc_kernel3: the same split over the features for large FEAT, where too few blocks of
//   images would each stream all of fc1: fc_kernel2, grid (ceil(n / FC_IMGS), splits), sums features
//   [split * per_split, + per_split) into partial (splits, n, HIDDEN); fc_kernel3, grid
//   ceil(n / FC3_IMGS), adds the splits in order (deterministic), then ReLU -> fc2 -> argmax as above
//   (4 images a block: with 16, 1,000 images were 63 blocks and 66 us for 28,224 x 256, 9 splits);
//   fc1's sums before ReLU into z_out and only the first *count images, as fc_kernel5 and 6, where given.
// fc_kernel4: the whole classifier, register-tiled: block HIDDEN threads x FC4_IMGS images (32, or 16
//   where shared memory is short), thread (q, p) = (t % (HIDDEN/4), t / (HIDDEN/4)) sums hidden units
//   4q..4q+3 of images p*FC4_IMGS/4..: per 4 features 4 float4s of fc1 and FC4_IMGS/4 float4s of
//   the features (broadcasts) for 4*FC4_IMGS FMAs; fc1 and the features staged FC_TILE rows at a
//   time through registers (the next tile's loads in flight while this one is summed), fc1 read
//   from L2 once per FC4_IMGS images (fc_kernel1: 16); then ReLU -> fc2 -> argmax.
// fc_kernel5 (sm_80+): fc1 on the tensor cores in 3xTF32 (FP32-level sums, see mma.cuh): block
//   FC5_WN = ceil(HIDDEN / 32) warps for 32 images; warp wn sums hidden units [32 wn, + 32) as
//   2 m-tiles x 4 n-tiles of mma.m16n8k8 (64 images a block measured slower: fewer blocks);
//   k-tiles of 32 features through a 3-stage cp.async pipeline, each summed in fresh accumulators and
//   added in FP32 (the tensor cores' accumulation rounds toward zero); grid (ceil(n / images), splits):
//   with one split ReLU -> fc2 -> argmax as fc_kernel4 (and fc1's sums before ReLU into z_out (n,
//   HIDDEN) where it is not null: the certificate's), with more the partial sums of its features
//   for fc_kernel3; where `count` is not null only its first *count images (blocks past it return).
//   3 x 2 * FEAT * HIDDEN tensor FLOPs per image; fc1 read from L2 once a block.

#ifndef FC_IMGS
#define FC_IMGS 16
#endif
#ifndef FC_TILE
#define FC_TILE 32
#endif
#ifndef FC3_IMGS
#define FC3_IMGS 4
#endif
#ifndef FC4_IMGS
#define FC4_IMGS 32
#endif

#include "fc_epilogue.cuh"
#include "mma.cuh"

static_assert(FC_IMGS % 4 == 0 && HIDDEN % 4 == 0, "fc: FC_IMGS and HIDDEN must be multiples of 4");
static_assert(FC4_IMGS % 16 == 0, "fc: FC4_IMGS must be a multiple of 16");
constexpr int X_TILE = FC_TILE * FC_IMGS;
constexpr int HID_FLOATS = FC_IMGS * HID_STRIDE;
constexpr int XH_FLOATS = X_TILE > HID_FLOATS ? X_TILE : HID_FLOATS;

// acc[i] += sum over features [f_begin, f_end) of feat[img0 + i][f] * fc1[f][j], for this thread's j.
__device__ __forceinline__ void fc1_sum(const float* __restrict__ feat, const float* __restrict__ fc1, int img0,
                                        int imgs, int f_begin, int f_end, float (&acc)[FC_IMGS], float4* w_s, float* xh) {
    const int j = threadIdx.x;
    const float4* fc1v = reinterpret_cast<const float4*>(fc1);
    for (int f0 = f_begin; f0 < f_end; f0 += FC_TILE) {
        for (int e = j; e < FC_TILE * HIDDEN / 4; e += HIDDEN)
            w_s[e] = f0 + e / (HIDDEN / 4) < f_end ? __ldg(fc1v + (size_t)f0 * (HIDDEN / 4) + e) : make_float4(0.f, 0.f, 0.f, 0.f);
        for (int e = j; e < X_TILE; e += HIDDEN) {
            const int i = e / FC_TILE, f = e % FC_TILE;  // coalesced along f
            xh[f * FC_IMGS + i] = (i < imgs && f0 + f < f_end) ? feat[(size_t)(img0 + i) * FEAT + f0 + f] : 0.0f;
        }
        __syncthreads();
        const float* ws = reinterpret_cast<const float*>(w_s);
#pragma unroll
        for (int f = 0; f < FC_TILE; ++f) {
            const float w = ws[f * HIDDEN + j];
            const float4* xs = reinterpret_cast<const float4*>(xh + f * FC_IMGS);
#pragma unroll
            for (int i4 = 0; i4 < FC_IMGS / 4; ++i4) {
                const float4 v = xs[i4];
                acc[4 * i4 + 0] = fmaf(v.x, w, acc[4 * i4 + 0]);
                acc[4 * i4 + 1] = fmaf(v.y, w, acc[4 * i4 + 1]);
                acc[4 * i4 + 2] = fmaf(v.z, w, acc[4 * i4 + 2]);
                acc[4 * i4 + 3] = fmaf(v.w, w, acc[4 * i4 + 3]);
            }
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(HIDDEN)
fc_kernel2(const float* __restrict__ feat, const float* __restrict__ fc1, float* __restrict__ partial, int n,
           int per_split) {
    __shared__ float4 w_s[FC_TILE * HIDDEN / 4];
    __shared__ __align__(16) float xh[XH_FLOATS];
    const int img0 = blockIdx.x * FC_IMGS;
    const int imgs = min(FC_IMGS, n - img0);
    const int f_begin = blockIdx.y * per_split, f_end = min(FEAT, f_begin + per_split);
    float acc[FC_IMGS];
#pragma unroll
    for (int i = 0; i < FC_IMGS; ++i) acc[i] = 0.0f;
    fc1_sum(feat, fc1, img0, imgs, f_begin, f_end, acc, w_s, xh);
    for (int i = 0; i < imgs; ++i) partial[((size_t)blockIdx.y * n + img0 + i) * HIDDEN + threadIdx.x] = acc[i];
}

extern "C" __global__ void __launch_bounds__(HIDDEN)
fc_kernel3(const float* __restrict__ partial, const float* __restrict__ fc2, int* __restrict__ labels, int n,
           int* __restrict__ overflow, float* __restrict__ scores_out, int splits, float* __restrict__ z_out,
           const int* __restrict__ count) {
    __shared__ float xh[FC3_IMGS * HID_STRIDE];
    __shared__ float scores[FC3_IMGS * CLASSES];
    const int live = count != nullptr ? min(n, *count) : n;  // the recomputed share: a count the GPU set
    const int img0 = blockIdx.x * FC3_IMGS;
    if (img0 >= live) return;
    const int imgs = min(FC3_IMGS, live - img0);
    float acc[FC3_IMGS];
    for (int s = 0; s < splits; ++s)  // each image's splits added in order; the images' loads in flight together
#pragma unroll
        for (int i = 0; i < FC3_IMGS; ++i)
            if (i < imgs) {
                const float v = partial[((size_t)s * n + img0 + i) * HIDDEN + threadIdx.x];
                acc[i] = s == 0 ? v : acc[i] + v;  // the first split as it is: fc_kernel6's bits, -0 included
            }
#pragma unroll
    for (int i = 0; i < FC3_IMGS; ++i) {
        if (z_out != nullptr && i < imgs) z_out[(size_t)(img0 + i) * HIDDEN + threadIdx.x] = acc[i];
        xh[i * HID_STRIDE + threadIdx.x] = relu(i < imgs ? acc[i] : 0.0f);
    }
    __syncthreads();
    fc2_argmax<FC3_IMGS>(fc2, labels, img0, imgs, overflow, scores_out, xh, scores);
}

extern "C" __global__ void __launch_bounds__(HIDDEN)
fc_kernel4(const float* __restrict__ feat, const float* __restrict__ fc1, const float* __restrict__ fc2,
           int* __restrict__ labels, int n, int* __restrict__ overflow, float* __restrict__ scores_out) {
    constexpr int PER = FC4_IMGS / 4;                    // images per thread
    constexpr int XROW = FC_TILE + 4;                    // feature tile row stride: 16-byte rows
    constexpr bool VEC = FEAT % 4 == 0;                  // feature rows 16-byte aligned: float4 loads
    constexpr int W4 = FC_TILE * HIDDEN / 4, X = FC4_IMGS * FC_TILE / (VEC ? 4 : 1);
    constexpr int WR = (W4 + HIDDEN - 1) / HIDDEN, XR = (X + HIDDEN - 1) / HIDDEN;  // per thread
    constexpr int XH = FC4_IMGS * XROW > FC4_IMGS * HID_STRIDE ? FC4_IMGS * XROW : FC4_IMGS * HID_STRIDE;
    __shared__ float4 w_s[W4];                 // fc1 rows [f0, f0 + FC_TILE)
    __shared__ __align__(16) float xh[XH];     // feature tile [img][XROW], then hidden [img][HID_STRIDE]
    __shared__ float scores[FC4_IMGS * CLASSES];
    const int t = threadIdx.x, q = t % (HIDDEN / 4), p = t / (HIDDEN / 4);
    const int img0 = blockIdx.x * FC4_IMGS;
    const int imgs = min(FC4_IMGS, n - img0);
    const float4* fc1v = reinterpret_cast<const float4*>(fc1);

    // The next tile's fc1 rows and features, loaded into registers while this tile is summed.
    float4 wr[WR];
    float4 xr[VEC ? XR : 1];
    float xs_[VEC ? 1 : XR];
    auto load = [&](int f0) {
#pragma unroll
        for (int r = 0; r < WR; ++r) {
            const int e = t + r * HIDDEN;
            wr[r] = e < W4 && f0 + e / (HIDDEN / 4) < FEAT ? __ldg(fc1v + (size_t)f0 * (HIDDEN / 4) + e) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int r = 0; r < XR; ++r) {
            const int e = t + r * HIDDEN;
            if (VEC) {
                const int i = e / (FC_TILE / 4), f = 4 * (e % (FC_TILE / 4));
                xr[r] = e < X && i < imgs && f0 + f < FEAT
                            ? __ldg(reinterpret_cast<const float4*>(feat + (size_t)(img0 + i) * FEAT + f0 + f)) : make_float4(0.f, 0.f, 0.f, 0.f);
            } else {
                const int i = e / FC_TILE, f = e % FC_TILE;
                xs_[r] = e < X && i < imgs && f0 + f < FEAT ? __ldg(feat + (size_t)(img0 + i) * FEAT + f0 + f) : 0.0f;
            }
        }
    };

    float acc[PER][4];
#pragma unroll
    for (int i = 0; i < PER; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;

    load(0);
    for (int f0 = 0; f0 < FEAT; f0 += FC_TILE) {
#pragma unroll
        for (int r = 0; r < WR; ++r)
            if (t + r * HIDDEN < W4) w_s[t + r * HIDDEN] = wr[r];
#pragma unroll
        for (int r = 0; r < XR; ++r) {
            const int e = t + r * HIDDEN;
            if (e < X) {
                if (VEC) *reinterpret_cast<float4*>(xh + (e / (FC_TILE / 4)) * XROW + 4 * (e % (FC_TILE / 4))) = xr[r];
                else xh[(e / FC_TILE) * XROW + e % FC_TILE] = xs_[r];
            }
        }
        __syncthreads();
        if (f0 + FC_TILE < FEAT) load(f0 + FC_TILE);
#pragma unroll
        for (int f = 0; f < FC_TILE; f += 4) {
            float4 w[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) w[c] = w_s[(f + c) * (HIDDEN / 4) + q];
#pragma unroll
            for (int i = 0; i < PER; ++i) {
                const float4 v = *reinterpret_cast<const float4*>(xh + (p * PER + i) * XROW + f);
                const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    acc[i][0] = fmaf(vv[c], w[c].x, acc[i][0]);
                    acc[i][1] = fmaf(vv[c], w[c].y, acc[i][1]);
                    acc[i][2] = fmaf(vv[c], w[c].z, acc[i][2]);
                    acc[i][3] = fmaf(vv[c], w[c].w, acc[i][3]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < PER; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) xh[(p * PER + i) * HID_STRIDE + 4 * q + e] = relu(acc[i][e]);
    __syncthreads();
    fc2_argmax<FC4_IMGS>(fc2, labels, img0, imgs, overflow, scores_out, xh, scores);
}

constexpr int FC5_WN = (HIDDEN + 31) / 32, FC5_IMGS = 32, FC5_BK = 32, FC5_STAGES = 3;
constexpr int FC5_THREADS = 32 * FC5_WN;
constexpr int FC5_AST = FC5_BK + 4, FC5_BST = 32 * FC5_WN + 8;  // conflict-free fragment loads
constexpr int FC5_A = FC5_IMGS * FC5_AST, FC5_STAGE = FC5_A + FC5_BK * FC5_BST;

// Stage the features [f0, f0 + 32) of the block's images and the same rows of fc1, zero past f_end,
// the last image and HIDDEN.
__device__ __forceinline__ void fc5_fetch(float* stage, const float* __restrict__ feat, const float* __restrict__ fc1,
                                          int img0, int imgs, int f0, int f_end) {
    const int t = threadIdx.x;
    if (FEAT % 4 == 0) {  // then f_end % 4 == 0 too: a split is a multiple of FC_TILE features
        for (int e = t; e < FC5_IMGS * FC5_BK / 4; e += FC5_THREADS) {
            const int i = e / (FC5_BK / 4), f = 4 * (e % (FC5_BK / 4));
            const bool ok = i < imgs && f0 + f < f_end;
            cp_async16(stage + i * FC5_AST + f, ok ? feat + (size_t)(img0 + i) * FEAT + f0 + f : feat, ok);
        }
    } else {
        for (int e = t; e < FC5_IMGS * FC5_BK; e += FC5_THREADS) {
            const int i = e / FC5_BK, f = e % FC5_BK;
            const bool ok = i < imgs && f0 + f < f_end;
            cp_async4(stage + i * FC5_AST + f, ok ? feat + (size_t)(img0 + i) * FEAT + f0 + f : feat, ok);
        }
    }
    for (int e = t; e < FC5_BK * FC5_WN * 8; e += FC5_THREADS) {  // HIDDEN % 4 == 0: whole float4s
        const int k = e / (FC5_WN * 8), col = 4 * (e % (FC5_WN * 8));
        const bool ok = f0 + k < f_end && col < HIDDEN;
        cp_async16(stage + FC5_A + k * FC5_BST + col, ok ? fc1 + (size_t)(f0 + k) * HIDDEN + col : fc1, ok);
    }
}

extern "C" __global__ void __launch_bounds__(FC5_THREADS)
fc_kernel5(const float* __restrict__ feat, const float* __restrict__ fc1, const float* __restrict__ fc2,
           int* __restrict__ labels, int n, int* __restrict__ overflow, float* __restrict__ scores_out,
           float* __restrict__ partial, int per_split, float* __restrict__ z_out, const int* __restrict__ count) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);
    const int t = threadIdx.x, lane = t % 32, wn = t / 32, g = lane / 4, tig = lane % 4;
    const int live = count != nullptr ? min(n, *count) : n;  // the recomputed share: a count the GPU set
    const int img0 = blockIdx.x * FC5_IMGS;
    if (img0 >= live) return;
    const int imgs = min(FC5_IMGS, live - img0);
    const int f_begin = blockIdx.y * per_split, f_end = min(FEAT, f_begin + per_split);
    const int tiles = (f_end - f_begin + FC5_BK - 1) / FC5_BK;

    float acc[2][4][4] = {};

#pragma unroll
    for (int s = 0; s < FC5_STAGES - 1; ++s) {
        if (s < tiles) fc5_fetch(smem + s * FC5_STAGE, feat, fc1, img0, imgs, f_begin + s * FC5_BK, f_end);
        cp_async_commit();
    }
    for (int tile = 0; tile < tiles; ++tile) {
        cp_async_wait<FC5_STAGES - 2>();
        __syncthreads();
        const int next = tile + FC5_STAGES - 1;
        if (next < tiles) fc5_fetch(smem + (next % FC5_STAGES) * FC5_STAGE, feat, fc1, img0, imgs, f_begin + next * FC5_BK, f_end);
        cp_async_commit();
        const float* as = smem + (tile % FC5_STAGES) * FC5_STAGE + g * FC5_AST + tig;
        const float* bs = smem + (tile % FC5_STAGES) * FC5_STAGE + FC5_A + tig * FC5_BST + wn * 32 + g;
        float d[2][4][4] = {};  // this k-tile's sums
#pragma unroll
        for (int ks = 0; ks < FC5_BK; ks += 8) {
            unsigned bhi[4][2], blo[4][2];
            b_fragments(bs + ks * FC5_BST, FC5_BST, bhi, blo);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                unsigned ahi[4], alo[4];
                a_fragment(as + 16 * m * FC5_AST + ks, FC5_AST, ahi, alo);
#pragma unroll
                for (int j = 0; j < 4; ++j) mma3(d[m][j], ahi, alo, bhi[j][0], bhi[j][1], blo[j][0], blo[j][1]);
            }
        }
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[m][j][r] += d[m][j][r];
    }
    cp_async_wait<0>();
    __syncthreads();  // the stages are free: the hidden layer and the scores reuse them

    // Accumulator r of (m, j): image 16 m + g (+8 for r >= 2), hidden unit 32 wn + 8 j + 2 tig + r % 2.
    float* xh = smem;
    float* scores = smem + FC5_IMGS * HID_STRIDE;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int i = 16 * m + g + 8 * (r / 2), h = 32 * wn + 8 * j + 2 * tig + r % 2;
                if (h >= HIDDEN) continue;
                if (gridDim.y == 1) {
                    xh[i * HID_STRIDE + h] = relu(acc[m][j][r]);
                    if (z_out != nullptr && i < imgs) z_out[(size_t)(img0 + i) * HIDDEN + h] = acc[m][j][r];
                }
                else if (i < imgs) partial[((size_t)blockIdx.y * n + img0 + i) * HIDDEN + h] = acc[m][j][r];
            }
    if (gridDim.y > 1) return;
    __syncthreads();
    fc2_argmax<FC5_IMGS, FC5_THREADS>(fc2, labels, img0, imgs, overflow, scores_out, xh, scores);
#else
    __trap();  // the launcher never picks it below sm_80
#endif
}
