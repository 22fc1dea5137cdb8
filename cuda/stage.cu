// Images as they arrive from the host -> the float32 images the network reads, on the GPU, so the
// host reads and uploads integer images in their own type (uint8: a quarter of the bytes) and
// checks no float32 value itself.
// convert_kernel1: n values of SRC_T (an integer type, -D SRC_T=...) -> float32, rounded to nearest
//   even as NumPy's astype (integers are always finite in float32); grid-stride, one value per
//   thread per step; reads n * sizeof(SRC_T) bytes, writes 4n.
// check_kernel1: n images of `per_image` float32 values: *bad = min(*bad, i) for every image i
//   holding a value that is not finite (NaN, Inf); grid-stride, reads 4 * n * per_image bytes. (The
//   fused kernels check the images themselves as they stage them; this is for the other pipelines.)

#ifndef SRC_T
#define SRC_T unsigned char
#endif

extern "C" __global__ void convert_kernel1(const SRC_T* __restrict__ src, float* __restrict__ dst, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = (float)src[i];
}

extern "C" __global__ void check_kernel1(const float* __restrict__ x, int n, int per_image, int* __restrict__ bad) {
    const long long total = (long long)n * per_image;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        if (!isfinite(__ldg(x + i))) atomicMin(bad, (int)(i / per_image));
}
