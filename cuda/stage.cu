// Images as they arrive from the host -> the float32 images the network reads, on the GPU, so the
// host reads and uploads integer images in their own type (uint8: a quarter of the bytes) and
// checks no float32 value itself.
// convert_kernel1: n values of SRC_T (an integer type, -D SRC_T=...) -> float32, rounded to nearest
//   even as NumPy's astype (integers are always finite in float32); grid-stride, one value per
//   thread per step; reads n * sizeof(SRC_T) bytes, writes 4n.
// convert_kernel2: n 8-bit codes of float32 images (infer/data/codes.py) -> by scaling 0 code * scale,
//   1 code / 255, 2 code, in float32 (one rounding at most, as NumPy's uint8 * np.float32(1/255),
//   uint8.astype(float32) / 255 and astype: the values the file holds); reads n bytes, writes 4n.
// check_kernel2: n images of `per_image` float32 values: *bad = min(*bad, i) for every image i
//   holding a value that is not finite (NaN, Inf); grid-stride over 16-byte loads (scalars before
//   x's first 16-byte boundary and after its last), reads 4 * n * per_image bytes. (The fused
//   kernels check the images themselves as they stage them; this is for the other pipelines.)

#ifndef SRC_T
#define SRC_T unsigned char
#endif

extern "C" __global__ void convert_kernel1(const SRC_T* __restrict__ src, float* __restrict__ dst, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = (float)src[i];
}

extern "C" __global__ void convert_kernel2(const unsigned char* __restrict__ src, float* __restrict__ dst, long long n,
                                           float scale, int scaling) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float k = (float)src[i];
        dst[i] = scaling == 1 ? __fdiv_rn(k, 255.0f) : scaling == 2 ? k : __fmul_rn(k, scale);
    }
}

__device__ __forceinline__ void check_value(float v, long long i, int per_image, int* bad) {
    if (!isfinite(v)) atomicMin(bad, (int)(i / per_image));
}

extern "C" __global__ void check_kernel2(const float* __restrict__ x, int n, int per_image, int* __restrict__ bad) {
    const long long total = (long long)n * per_image;
    const long long head = min((long long)((16 - reinterpret_cast<size_t>(x) % 16) % 16 / 4), total);
    const long long quads = (total - head) / 4, tail = head + 4 * quads;
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    const float4* v = reinterpret_cast<const float4*>(x + head);
    for (long long q = first; q < quads; q += stride) {
        const float4 f = __ldg(v + q);
        const long long i = head + 4 * q;
        check_value(f.x, i, per_image, bad);
        check_value(f.y, i + 1, per_image, bad);
        check_value(f.z, i + 2, per_image, bad);
        check_value(f.w, i + 3, per_image, bad);
    }
    if (first < head) check_value(__ldg(x + first), first, per_image, bad);
    if (tail + first < total) check_value(__ldg(x + tail + first), tail + first, per_image, bad);
}
