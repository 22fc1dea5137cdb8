// The whole convolution stack in one kernel, per group of IMGS images, intermediates in shared
// memory only: conv1 (K1xK1, IN_C -> C1) -> ReLU -> 2x2 avg pool -> conv2 (K2xK2, C1 -> C2) -> ReLU
// -> 2x2 avg pool -> features (n, P2H, P2W, C2), NHWC, i.e. already flattened in (h, w, c) order.
// in: x (n, IN_H, IN_W, IN_C) float32; conv1 weights in constant memory c_w1 (K1, K1, IN_C, C1);
// conv2's weights in global memory, staged through shared memory one (kh, kw) slab at a time.
// All versions: block FUSED_THREADS (256), grid ceil(n / IMGS); phase 0 stages the images and, where
// `bad` is not null, checks them: *bad = min(*bad, i) for every image i holding a value that is not
// finite (check_kernel2's job, done here on the way in: the images are read once); phase 1
// computes one pooled conv1 output per thread-iteration (the thread's channel fixed, its K1*K1*IN_C
// weights in registers; 4 conv outputs, ReLU, ((a+b)+c)+d * 0.25); phase 2 is conv2 as an implicit
// GEMM (the im2col gather is the shared-memory addressing), M = pixels, N = C2, K = K2*K2*C1, with
// ReLU + 2x2 pool + NHWC store in registers. FLOPs per image: 2*(H1*W1*C1*K1*K1*IN_C +
// H2*W2*C2*K2*K2*C1); global bytes: the input once, the features once, w2 once per block (from L2).
// fused_kernel2 (sm_80+): tensor cores, 3xTF32 (each operand split into a TF32
//   part and a TF32 remainder; three mma.sync.m16n8k8 per product keep FP32-level accuracy); a warp
//   per (image, half of C2): 4 m-tiles = the 4 positions of a 2x2 pool window over 16 windows, C2/16
//   n-tiles of 8; w2 pre-split and laid out in fragment order by the host: (K2*K2, C1/8, C2/8, 32
//   lanes, {hi k, hi k+4, lo k, lo k+4}), slabs double-buffered with cp.async, one barrier each.
// The shared-memory layout is the host's (launch.Fused.plan): it passes the images per block IMGS, the
// pooled conv1 output's strides PSTR (pixel), RSTR (row), ISTR (image) and the floats of the stage
// area after it, STAGE_FLOATS, as -D options; the kernels static_assert what they rely on.

#include "fused_tc.cuh"
static_assert(STAGE_FLOATS >= 2 * SLAB2, "fused v2/v3: the stage area must hold two w2 slabs");

__constant__ float c_w1[K1 * K1 * IN_C * C1];

constexpr int NT = C2 / 16;         // n-tiles of 8 channels per warp (two warps per image)

static_assert(IMGS * 2 * 32 == FUSED_THREADS, "fused v2: two warps per image, four images");
static_assert(C2 % 16 == 0 && NT <= 4, "fused v2: tile shapes");

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel2(const float* __restrict__ x, const float4* __restrict__ w2f, float* __restrict__ feat, int n, int* __restrict__ bad) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    float* stage = p1 + P1_FLOATS;  // the input images in phase 1, then two w2 slabs in phase 2
    float4* slabs = reinterpret_cast<float4*>(stage);
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    const int imgs = min(IMGS, n - img0);

#include "fused_prologue.cuh"
    __syncthreads();  // p1 complete; the staged images are dead from here on
    fetch_slab(slabs, w2f, 0);

    const int lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int img = warp >> 1, half = warp & 1;
    const float* pimg = p1 + img * ISTR;
    float acc[4][NT][4];

    for (int u = 0; u < STEPS; ++u) {
        const int mg = u / (K2 * K2), s = u % (K2 * K2);
        if (s == 0) {
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int r = 0; r < 4; ++r) acc[q][j][r] = 0.0f;
        }
        // Rows g and g + 8 of m-tile q are pool windows mg*16 + g (+8) at position (q / 2, q % 2);
        // recomputed each step rather than held across the loop, to spare registers.
        int off[4][2];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int win = mg * 16 + g + 8 * h, py = win / P2W, px = win % P2W;
                off[q][h] = (2 * py + q / 2) * RSTR + (2 * px + q % 2) * PSTR + tig;
            }
        // Slab u has landed (ours; the barrier makes everyone's visible), and every warp is done
        // with the other buffer, so slab u + 1 may start into it while we compute on slab u.
        asm volatile("cp.async.wait_group 0;");
        __syncthreads();
        if (u + 1 < STEPS) fetch_slab(slabs + ((u + 1) % 2) * (SLAB2 / 4), w2f, (u + 1) % (K2 * K2));
        const float4* slab = slabs + (u % 2) * (SLAB2 / 4);
        const float* as = pimg + (s / K2) * RSTR + (s % K2) * PSTR;
#pragma unroll 2
        for (int ks = 0; ks < KSTEPS; ++ks) {
            float4 b[NT];
#pragma unroll
            for (int j = 0; j < NT; ++j) b[j] = slab[(ks * (C2 / 8) + half * NT + j) * 32 + lane];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float av[4] = {as[off[q][0] + ks * 8], as[off[q][1] + ks * 8],
                                     as[off[q][0] + ks * 8 + 4], as[off[q][1] + ks * 8 + 4]};
                unsigned hi[4], lo[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) split(av[r], hi[r], lo[r]);
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    mma(acc[q][j], lo, __float_as_uint(b[j].x), __float_as_uint(b[j].y));
                    mma(acc[q][j], hi, __float_as_uint(b[j].z), __float_as_uint(b[j].w));
                    mma(acc[q][j], hi, __float_as_uint(b[j].x), __float_as_uint(b[j].y));
                }
            }
        }

        // Epilogue: accumulator r of m-tile q is window g (r < 2) or g + 8, channel 2*tig + r % 2.
        if (s == K2 * K2 - 1 && img < imgs) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int win = mg * 16 + g + 8 * h;
                float* out = feat + ((size_t)(img0 + img) * WINDOWS + win) * C2 + half * NT * 8 + 2 * tig;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    float o[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int r = 2 * h + e;
                        o[e] = (((relu(acc[0][j][r]) + relu(acc[1][j][r])) + relu(acc[2][j][r])) + relu(acc[3][j][r])) * 0.25f;
                    }
                    *reinterpret_cast<float2*>(out + j * 8) = make_float2(o[0], o[1]);
                }
            }
        }
    }
}
