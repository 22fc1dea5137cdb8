// The classifier in one kernel: fc1 (FEAT -> HIDDEN) -> ReLU -> fc2 (HIDDEN -> CLASSES) -> argmax.
// in: features (n, FEAT) float32; fc1 (FEAT, HIDDEN), fc2 (HIDDEN, CLASSES) row-major.
// out: labels (n) int32, the first index of each image's maximum score; *overflow = min(*overflow,
// image) for every image whose scores are not all finite (float32 overflow); the scores (n, CLASSES)
// float32 too unless `scores_out` is null.
// fc_kernel1: block HIDDEN threads (one hidden unit each) x FC_IMGS images in registers; fc1 and
//   the features staged through shared memory FC_TILE rows at a time (float4, coalesced), the
//   inner loop fully unrolled; then fc2 and the argmax from shared memory. grid ceil(n / FC_IMGS);
//   2*(FEAT*HIDDEN + HIDDEN*CLASSES) FLOPs per image; fc1 read once per block (from L2).
// fc_kernel2 + fc_kernel3: the same split over the features for large FEAT, where too few blocks of
//   images would each stream all of fc1: fc_kernel2, grid (ceil(n / FC_IMGS), splits), sums features
//   [split * per_split, + per_split) into partial (splits, n, HIDDEN); fc_kernel3, grid
//   ceil(n / FC_IMGS), adds the splits in order (deterministic), then ReLU -> fc2 -> argmax as above.

#ifndef FC_IMGS
#define FC_IMGS 16
#endif
#ifndef FC_TILE
#define FC_TILE 32
#endif

#include "common.cuh"

static_assert(FC_IMGS % 4 == 0 && HIDDEN % 4 == 0, "fc: FC_IMGS and HIDDEN must be multiples of 4");
constexpr int X_TILE = FC_TILE * FC_IMGS;
constexpr int HID_STRIDE = HIDDEN + 1;  // odd stride: images of a warp hit different banks in fc2
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

// ReLU(acc) -> fc2 -> argmax (and the scores) for this block's images.
__device__ __forceinline__ void fc2_argmax(const float (&acc)[FC_IMGS], const float* __restrict__ fc2, int* __restrict__ labels,
                                           int img0, int imgs, int* __restrict__ overflow, float* __restrict__ scores_out,
                                           float* xh, float* scores) {
    const int j = threadIdx.x;
#pragma unroll
    for (int i = 0; i < FC_IMGS; ++i) xh[i * HID_STRIDE + j] = relu(acc[i]);
    __syncthreads();

    for (int o = j; o < FC_IMGS * CLASSES; o += HIDDEN) {
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
fc_kernel1(const float* __restrict__ feat, const float* __restrict__ fc1, const float* __restrict__ fc2,
           int* __restrict__ labels, int n, int* __restrict__ overflow, float* __restrict__ scores_out) {
    __shared__ float4 w_s[FC_TILE * HIDDEN / 4];        // fc1 rows [f0, f0 + FC_TILE)
    __shared__ __align__(16) float xh[XH_FLOATS];       // feature tile [f][img], then hidden [img][h]
    __shared__ float scores[FC_IMGS * CLASSES];
    const int img0 = blockIdx.x * FC_IMGS;
    const int imgs = min(FC_IMGS, n - img0);
    float acc[FC_IMGS];
#pragma unroll
    for (int i = 0; i < FC_IMGS; ++i) acc[i] = 0.0f;
    fc1_sum(feat, fc1, img0, imgs, 0, FEAT, acc, w_s, xh);
    fc2_argmax(acc, fc2, labels, img0, imgs, overflow, scores_out, xh, scores);
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
    fc2_argmax(acc, fc2, labels, img0, imgs, overflow, scores_out, xh, scores);
}
