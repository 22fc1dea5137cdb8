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
