// Prediction per image: the first index of the maximum score.
// scores (n, classes) float32 -> labels (n) int32; *overflow = min(*overflow, i) for every image i
// whose scores are not all finite (float32 overflow), so the host can refuse the result.
// argmax_kernel1: one thread per image, a scan over its row; grid ceil(n/128) x 128.

extern "C" __global__ void argmax_kernel1(const float* __restrict__ scores, int* __restrict__ labels,
                                          int n, int classes, int* __restrict__ overflow) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float* s = scores + (size_t)i * classes;
    int best = 0;
    bool finite = isfinite(s[0]);
    for (int j = 1; j < classes; ++j) {
        finite = finite && isfinite(s[j]);
        if (s[j] > s[best]) best = j;
    }
    labels[i] = best;
    if (!finite) atomicMin(overflow, i);
}
