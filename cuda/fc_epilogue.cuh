// The classifier's last step, shared by fc.cu and fc6.cu: fc2 -> argmax (and the scores) for a
// block's images whose hidden layer (after ReLU) is in shared memory.
#pragma once

#include "common.cuh"

constexpr int HID_STRIDE = HIDDEN + 1;  // odd stride: images of a warp hit different banks in fc2

// fc2 -> argmax (and the scores) for this block's NI images, their hidden layer (after ReLU) in xh
// [img][HID_STRIDE]; the caller has stored it and synchronized. NT: the block's threads.
template <int NI, int NT = HIDDEN>
__device__ __forceinline__ void fc2_argmax(const float* __restrict__ fc2, int* __restrict__ labels, int img0, int imgs,
                                           int* __restrict__ overflow, float* __restrict__ scores_out,
                                           const float* xh, float* scores) {
    const int j = threadIdx.x;
    for (int o = j; o < NI * CLASSES; o += NT) {
        const int i = o / CLASSES, k = o % CLASSES;
        float sum = 0.0f;
        for (int h = 0; h < HIDDEN; ++h) sum = fmaf(xh[i * HID_STRIDE + h], __ldg(fc2 + h * CLASSES + k), sum);
        scores[o] = sum;
    }
    __syncthreads();

    for (int i = j; i < imgs; i += NT) {
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
        for (int o = j; o < imgs * CLASSES; o += NT) scores_out[(size_t)img0 * CLASSES + o] = scores[o];
}
