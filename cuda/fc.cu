// The classifier in one kernel: fc1 (FEAT -> HIDDEN) -> ReLU -> fc2 (HIDDEN -> CLASSES) -> argmax.
// in: features (n, FEAT) float32; fc1 (FEAT, HIDDEN), fc2 (HIDDEN, CLASSES) row-major.
// out: labels (n) int32, the first index of each image's maximum score; *overflow = min(*overflow,
// image) for every image whose scores are not all finite (float32 overflow); the scores (n, CLASSES)
// float32 too unless `scores_out` is null.
// fc_kernel1: block HIDDEN threads (one hidden unit each) x FC_IMGS images in registers; fc1 and
//   the features staged through shared memory FC_TILE rows at a time (float4, coalesced), the
//   inner loop fully unrolled; then fc2 and the argmax from shared memory. grid ceil(n / FC_IMGS);
//   2*(FEAT*HIDDEN + HIDDEN*CLASSES) FLOPs per image; fc1 read once per block (from L2).

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

extern "C" __global__ void __launch_bounds__(HIDDEN)
fc_kernel1(const float* __restrict__ feat, const float* __restrict__ fc1, const float* __restrict__ fc2,
           int* __restrict__ labels, int n, int* __restrict__ overflow, float* __restrict__ scores_out) {
    __shared__ float4 w_s[FC_TILE * HIDDEN / 4];        // fc1 rows [f0, f0 + FC_TILE)
    __shared__ __align__(16) float xh[XH_FLOATS];       // feature tile [f][img], then hidden [img][h]
    __shared__ float scores[FC_IMGS * CLASSES];
    const int j = threadIdx.x;
    const int img0 = blockIdx.x * FC_IMGS;
    const int imgs = min(FC_IMGS, n - img0);
    float acc[FC_IMGS];
#pragma unroll
    for (int i = 0; i < FC_IMGS; ++i) acc[i] = 0.0f;

    const float4* fc1v = reinterpret_cast<const float4*>(fc1);
    for (int f0 = 0; f0 < FEAT; f0 += FC_TILE) {
        for (int e = j; e < FC_TILE * HIDDEN / 4; e += HIDDEN)
            w_s[e] = f0 + e / (HIDDEN / 4) < FEAT ? __ldg(fc1v + (size_t)f0 * (HIDDEN / 4) + e) : make_float4(0.f, 0.f, 0.f, 0.f);
        for (int e = j; e < X_TILE; e += HIDDEN) {
            const int i = e / FC_TILE, f = e % FC_TILE;  // coalesced along f
            xh[f * FC_IMGS + i] = (i < imgs && f0 + f < FEAT) ? feat[(size_t)(img0 + i) * FEAT + f0 + f] : 0.0f;
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
