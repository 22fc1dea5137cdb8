// Device helpers shared by the kernels (included; changes invalidate every cached cubin).
#pragma once

// ReLU as NumPy's maximum(v, 0): NaN propagates (fmaxf would turn it into 0 and hide an overflow);
// one max.NaN instruction from sm_80 on.
__device__ __forceinline__ float relu(float v) {
#if __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(v));
    return r;
#else
    return v < 0.0f ? 0.0f : v;
#endif
}

// The float32 value of 8-bit code k in scaling 0 (k * scale, scale = float32(1/255)), 1 (k / 255) or
// 2 (k itself), one rounding at most: the values an image file of 8-bit pixels holds (infer/codes.py).
// convert_kernel2 and the fused kernels' staging both use it, so their floats are the same bits.
__device__ __forceinline__ float code_value(unsigned char k, int scaling, float scale) {
    const float v = (float)k;
    return scaling == 1 ? __fdiv_rn(v, 255.0f) : scaling == 2 ? v : __fmul_rn(v, scale);
}
