// What conv_kernel2, 3 and 4 share after their k loops: a warpgroup tile's accumulators (rows as
// pool_pair reads them, columns the block's BN channels) through ReLU and the 2x2 pool into out.
#pragma once

#include "conv_geometry.cuh"
#include "wgmma.cuh"

// Pool window win (rows dx = g % 2, dy = 0 and 1 of this thread's warp) of the column block blockIdx.y;
// every lane takes part in the shuffles, the even lanes store, nothing for a window past the last.
__device__ __forceinline__ void store_pooled(const float (&acc)[BN / 2], float* __restrict__ out, int win, bool valid) {
    const int lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
    float* dst = out + (size_t)win * C_OUT;
#pragma unroll
    for (int c = 0; c < BN / 8; ++c) {
        const float2 o = pool_pair(acc, c);
        const int ch = blockIdx.y * BN + 8 * c + 2 * tig;
        if (g % 2 || !valid) continue;
        if (C_OUT % 2 == 0 && ch + 1 < C_OUT) {
            *reinterpret_cast<float2*>(dst + ch) = o;
        } else {
            if (ch < C_OUT) dst[ch] = o.x;
            if (ch + 1 < C_OUT) dst[ch + 1] = o.y;
        }
    }
}
