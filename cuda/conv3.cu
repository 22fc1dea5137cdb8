// One convolution layer whose weights fit in shared memory whole, as conv_kernel2's implicit GEMM with
// ReLU and the 2x2 average pool in the epilogue: out (n, OH/2, OW/2, C_OUT) = pool(relu(conv(x, w))).
// in: x (n, IN_H, IN_W, IN_C) float32 NHWC, any alignment; w as conv_kernel2 reads it (the host's
// wgmma_column_blocks: per column block of BN channels (KP / 8, {hi, lo}, BN / 8, 2, 8, 4)). Shapes,
// BN (16, 32, 64) and SPAN (below) arrive as -D options.
// conv_kernel3 (sm_90a): conv_kernel2's rows, k order, 3xTF32 products and sums (16 k-tiles in the
//   tensor cores, then FP32 adds), so the same bits; for inputs of 1 to 3 channels, whose 4-byte
//   gathers left conv_kernel2 L1-bound (ncu, 32x32x3 conv1, 4,096 images: 259 us, tensor pipe 20%;
//   this kernel 121 us, 44%: 41% of the TF32 peak in FLOPs). Persistent:
//   grid (min(groups, MIN_BLOCKS an SM), C_OUT / BN), each block stages its column block's weights once
//   (KP * 2 * BN floats), then per group of 32 pool windows the contiguous stretch of x its rows read
//   (at most SPAN floats, the host's bound over every group; 16-byte copies, the next group's in
//   flight meanwhile) and reads A from it into registers: no per-k-tile gather. Reads n * image
//   floats once, writes n * WINDOWS * C_OUT; 2 * 3 * 128 * BN * KP tensor FLOPs a group.

#include "conv_geometry.cuh"
#include "conv_epilogue.cuh"

#if !defined(SPAN) || !defined(SHARED_FLOATS) || !defined(MIN_BLOCKS)
#error "conv_kernel3: the host passes SPAN (launch.Conv.span), SHARED_FLOATS and MIN_BLOCKS (blocks an SM) as -D options"
#endif

constexpr int BW = 32;                               // pool windows a group: 16 per warpgroup
constexpr int KP = (KTOT + BK - 1) / BK * BK;        // k padded to conv_kernel2's k-tiles
constexpr int STEPS = KP / 8, CHUNK_STEPS = 2 * 16;  // k8 steps; conv_kernel2's 16 k-tiles a tensor-core sum
constexpr int W_FLOATS = KP * 2 * BN;
constexpr int KOFF_MAX = ((KS - 1) * IN_W + KS - 1) * IN_C + IN_C - 1;
static_assert(BN == 16 || BN == 32 || BN == 64, "conv v3: BN is 16, 32 or 64");
static_assert(SPAN % 4 == 0 && SPAN >= KOFF_MAX + 1, "conv v3: SPAN holds a window's inputs, in 16-byte pieces");
static_assert(W_FLOATS + 2 * SPAN + KP == SHARED_FLOATS, "conv v3: the host's shared memory (launch.Conv) differs from the kernel's");

// Index in x of window win's top-left input value (its row dy = 0, dx = 0).
__device__ __forceinline__ int window_base(int win) {
    const int img = win / WINDOWS, rem = win % WINDOWS;
    return ((img * IN_H + 2 * (rem / PW)) * IN_W + 2 * (rem % PW)) * IN_C;
}

// The stretch of x from index `from` (x + from 16-byte aligned; it may start before x) into buf:
// 16-byte copies inside x, 4-byte ones at its ends, zeros outside.
__device__ __forceinline__ void fetch_span(float* buf, const float* __restrict__ x, int from, int total) {
    for (int e = threadIdx.x; e < SPAN / 4; e += THREADS) {
        const int i = from + 4 * e;
        if (i >= 0 && i + 4 <= total) {
            cp_async16(buf + 4 * e, x + i, true);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const bool ok = i + j >= 0 && i + j < total;
                cp_async4(buf + 4 * e + j, ok ? x + i + j : x, ok);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
conv_kernel3(const float* __restrict__ x, const float* __restrict__ wf, float* __restrict__ out, int n) {
    extern __shared__ float4 smem4[];
    float* ws = reinterpret_cast<float*>(smem4);  // the column block's weights, then two span buffers
    float* spans = ws + W_FLOATS;
    int* koff = reinterpret_cast<int*>(spans + 2 * SPAN);  // k -> offset from a row's base, -1 past KTOT
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tig = lane % 4;
    const int wg = warp / 4, w = warp % 4;
    const int total = n * WINDOWS, groups = (total + BW - 1) / BW, x_total = n * IN_H * IN_W * IN_C;
    // x's misalignment in floats: each stretch starts where x + from is 16-byte aligned
    const int mis = static_cast<int>((reinterpret_cast<size_t>(x) / 4) % 4);
    auto span_from = [&](int group) { return ((window_base(group * BW) + mis) & ~3) - mis; };

    const float4* src = reinterpret_cast<const float4*>(wf + (size_t)blockIdx.y * W_FLOATS);
    for (int e = t; e < W_FLOATS / 4; e += THREADS) cp_async16(ws + 4 * e, src + e, true);
    for (int k = t; k < KP; k += THREADS) koff[k] = k < KTOT ? k_offset(k) : -1;
    int group = blockIdx.x;
    if (group < groups) fetch_span(spans, x, span_from(group), x_total);
    cp_async_commit();

    for (int it = 0; group < groups; group += gridDim.x, ++it) {
        const int next = group + gridDim.x;
        if (next < groups) fetch_span(spans + ((it + 1) % 2) * SPAN, x, span_from(next), x_total);
        cp_async_commit();
        cp_async_wait<1>();  // this group's stretch (and, the first time, the weights) landed
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();

        // This thread's A rows: window win, dx = g % 2, dy = 0 and 1 (rows g and g + 8 of its warp's 16)
        const float* buf = spans + (it % 2) * SPAN;
        const int win = group * BW + 16 * wg + 4 * w + g / 2;
        const bool valid = win < total;
        const int r0 = valid ? window_base(win) + (g % 2) * IN_C - span_from(group) : 0, r1 = r0 + IN_W * IN_C;
        float acc[BN / 2], d[1][BN / 2];
        for (int c0 = 0; c0 < STEPS; c0 += CHUNK_STEPS) {
            for (int s = c0; s < min(STEPS, c0 + CHUNK_STEPS); ++s) {
                const int o0 = koff[8 * s + tig], o1 = koff[8 * s + tig + 4];
                const bool k0 = valid && o0 >= 0, k1 = valid && o1 >= 0;
                const float av[1][4] = {{k0 ? buf[r0 + o0] : 0.0f, k0 ? buf[r1 + o0] : 0.0f,
                                         k1 ? buf[r0 + o1] : 0.0f, k1 ? buf[r1 + o1] : 0.0f}};
                mma3_step(d, av, ws + s * 16 * BN, s == c0);
            }
            wgmma_drain();  // the chunk's sums, added in FP32 as conv_kernel2 does
#pragma unroll
            for (int r = 0; r < BN / 2; ++r) acc[r] = c0 == 0 ? d[0][r] : acc[r] + d[0][r];
        }

        store_pooled(acc, out, win, valid);
        __syncthreads();  // everyone is done with this buffer before the next group's copies refill it
    }
    cp_async_wait<0>();
}
