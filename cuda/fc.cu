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
//   ceil(n / FC_IMGS), adds the splits in order (deterministic), then ReLU -> fc2 -> argmax as above.
// fc_kernel4: the whole classifier, register-tiled: block HIDDEN threads x FC4_IMGS images (32, or 16
//   where shared memory is short), thread (q, p) = (t % (HIDDEN/4), t / (HIDDEN/4)) sums hidden units
//   4q..4q+3 of images p*FC4_IMGS/4..: per 4 features 4 float4s of fc1 and FC4_IMGS/4 float4s of
//   the features (broadcasts) for 4*FC4_IMGS FMAs; fc1 and the features staged FC_TILE rows at a
//   time through registers (the next tile's loads in flight while this one is summed), fc1 read
//   from L2 once per FC4_IMGS images (fc_kernel1: 16); then ReLU -> fc2 -> argmax.

#ifndef FC_IMGS
#define FC_IMGS 16
#endif
#ifndef FC_TILE
#define FC_TILE 32
#endif
#ifndef FC4_IMGS
#define FC4_IMGS 32
#endif

#include "common.cuh"

static_assert(FC_IMGS % 4 == 0 && HIDDEN % 4 == 0, "fc: FC_IMGS and HIDDEN must be multiples of 4");
static_assert(FC4_IMGS % 16 == 0, "fc: FC4_IMGS must be a multiple of 16");
constexpr int HID_STRIDE = HIDDEN + 1;  // odd stride: images of a warp hit different banks in fc2
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

// fc2 -> argmax (and the scores) for this block's NI images, their hidden layer (after ReLU) in xh
// [img][HID_STRIDE]; the caller has stored it and synchronized.
template <int NI>
__device__ __forceinline__ void fc2_argmax(const float* __restrict__ fc2, int* __restrict__ labels, int img0, int imgs,
                                           int* __restrict__ overflow, float* __restrict__ scores_out,
                                           const float* xh, float* scores) {
    const int j = threadIdx.x;
    for (int o = j; o < NI * CLASSES; o += HIDDEN) {
        const int i = o / CLASSES, k = o % CLASSES;
        float sum = 0.0f;
        for (int h = 0; h < HIDDEN; ++h) sum = fmaf(xh[i * HID_STRIDE + h], __ldg(fc2 + h * CLASSES + k), sum);
        scores[o] = sum;
    }
    __syncthreads();

    for (int i = j; i < imgs; i += HIDDEN) {
        const float* sc = scores + i * CLASSES;
        int best = 0;
        bool finite = isfinite(sc[0]);
        for (int k = 1; k < CLASSES; ++k) {
            finite = finite && isfinite(sc[k]);
            if (sc[k] > sc[best]) best = k;
        }
        labels[img0 + i] = best;
        if (!finite) atomicMin(overflow, img0 + i);
    }
    if (scores_out != nullptr)
        for (int o = j; o < imgs * CLASSES; o += HIDDEN) scores_out[(size_t)img0 * CLASSES + o] = scores[o];
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
           int* __restrict__ overflow, float* __restrict__ scores_out, int splits) {
    __shared__ __align__(16) float xh[XH_FLOATS];
    __shared__ float scores[FC_IMGS * CLASSES];
    const int img0 = blockIdx.x * FC_IMGS;
    const int imgs = min(FC_IMGS, n - img0);
    float acc[FC_IMGS];
#pragma unroll
    for (int i = 0; i < FC_IMGS; ++i) {
        acc[i] = 0.0f;
        if (i < imgs)
            for (int s = 0; s < splits; ++s) acc[i] += partial[((size_t)s * n + img0 + i) * HIDDEN + threadIdx.x];
    }
#pragma unroll
    for (int i = 0; i < FC_IMGS; ++i) xh[i * HID_STRIDE + threadIdx.x] = relu(acc[i]);
    __syncthreads();
    fc2_argmax<FC_IMGS>(fc2, labels, img0, imgs, overflow, scores_out, xh, scores);
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
