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
// fused_kernel1: FP32 FFMA, each thread a 2x4-pixel x 8-channel register
//   micro-tile with float4 operands; w2 (K2, K2, C1, C2) as stored, slabs double-buffered.
// The shared-memory layout is the host's (launch.Fused.plan): it passes the images per block IMGS, the
// pooled conv1 output's strides PSTR (pixel), RSTR (row), ISTR (image) and the floats of the stage
// area after it, STAGE_FLOATS, as -D options; the kernels static_assert what they rely on.

#include "fused_common.cuh"

__constant__ float c_w1[K1 * K1 * IN_C * C1];

constexpr int QUADS = P2W / 2;                    // 4-column groups of conv2 outputs per row pair
constexpr int PIXEL_GROUPS = IMGS * P2H * QUADS;  // each 2 rows x 4 columns of conv2 outputs
constexpr int CHANNEL_GROUPS = C2 / 8;
constexpr int SLAB_F4_PER_THREAD = SLAB / 4 / FUSED_THREADS;

static_assert(P2W % 2 == 0, "fused: pooled conv2 width must be even");
static_assert(C1 % 4 == 0 && C2 % 8 == 0, "fused: channel counts must be multiples of 4 and 8");
static_assert(PIXEL_GROUPS * CHANNEL_GROUPS == FUSED_THREADS, "fused: IMGS must give 256 threads");
static_assert(PIXEL_GROUPS % 16 == 0 && CHANNEL_GROUPS % 2 == 0, "fused: warp mapping");
static_assert(SLAB % (4 * FUSED_THREADS) == 0, "fused: w2 slab must split into float4 per thread");
static_assert(PSTR % 4 == 0 && RSTR % 4 == 0 && ISTR % 4 == 0, "fused v1: p1 is read as float4");
static_assert(STAGE_FLOATS >= 2 * SLAB, "fused v1: the stage area must hold two w2 slabs");

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel1(const float* __restrict__ x, const float* __restrict__ w2, float* __restrict__ feat, int n, int* __restrict__ bad) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    float* stage = p1 + P1_FLOATS;  // the input images in phase 1, then two w2 slabs in phase 2
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    const int imgs = min(IMGS, n - img0);

#define PROLOGUE_LOADS 1  // more at a time: 12 bytes spilled on sm_80
#include "fused_prologue.cuh"
    __syncthreads();  // p1 complete; the staged images are dead from here on

    // Phase 2: conv2 as an implicit GEMM over (kh, kw, c), w2 slabs double-buffered.
    const int lane = t % 32, warp = t / 32;
    constexpr int WARPS_PER_PG_SPAN = PIXEL_GROUPS / 16;
    const int pg = lane % 16 + 16 * (warp % WARPS_PER_PG_SPAN);
    const int cg = 2 * (warp / WARPS_PER_PG_SPAN) + lane / 16;
    const int q = pg % QUADS, img = (pg / QUADS) % IMGS, r = pg / (QUADS * IMGS);
    const float* abase = p1 + img * ISTR + (2 * r) * RSTR + (4 * q) * PSTR;

    const float4* w2v = reinterpret_cast<const float4*>(w2);
    float4* slab = reinterpret_cast<float4*>(stage);
    float4 next[SLAB_F4_PER_THREAD];
#pragma unroll
    for (int i = 0; i < SLAB_F4_PER_THREAD; ++i) slab[t + i * FUSED_THREADS] = __ldg(w2v + t + i * FUSED_THREADS);
    __syncthreads();

    float acc[2][4][8];
#pragma unroll
    for (int dy = 0; dy < 2; ++dy)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int m = 0; m < 8; ++m) acc[dy][j][m] = 0.0f;

    for (int s = 0; s < K2 * K2; ++s) {
        const int kh = s / K2, kw = s % K2;
        if (s + 1 < K2 * K2) {
#pragma unroll
            for (int i = 0; i < SLAB_F4_PER_THREAD; ++i)
                next[i] = __ldg(w2v + (size_t)(s + 1) * (SLAB / 4) + t + i * FUSED_THREADS);
        }
        const float* bs = stage + (s % 2) * SLAB + cg * 8;
        const float* as = abase + kh * RSTR + kw * PSTR;
#pragma unroll 2
        for (int c4 = 0; c4 < C1; c4 += 4) {
            float4 a[2][4];
#pragma unroll
            for (int dy = 0; dy < 2; ++dy)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    a[dy][j] = *reinterpret_cast<const float4*>(as + dy * RSTR + j * PSTR + c4);
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                const float4 b0 = *reinterpret_cast<const float4*>(bs + (c4 + cc) * C2);
                const float4 b1 = *reinterpret_cast<const float4*>(bs + (c4 + cc) * C2 + 4);
                const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int dy = 0; dy < 2; ++dy)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float av = cc == 0 ? a[dy][j].x : cc == 1 ? a[dy][j].y : cc == 2 ? a[dy][j].z : a[dy][j].w;
#pragma unroll
                        for (int m = 0; m < 8; ++m) acc[dy][j][m] = fmaf(av, b[m], acc[dy][j][m]);
                    }
            }
        }
        if (s + 1 < K2 * K2) {
            float4* dst = slab + ((s + 1) % 2) * (SLAB / 4);
#pragma unroll
            for (int i = 0; i < SLAB_F4_PER_THREAD; ++i) dst[t + i * FUSED_THREADS] = next[i];
        }
        __syncthreads();
    }

    // Epilogue: ReLU, 2x2 pool in registers, NHWC store of 2 pooled pixels x 8 channels.
    if (img < imgs) {
        float* out = feat + (((size_t)(img0 + img) * P2H + r) * P2W + 2 * q) * C2 + cg * 8;
#pragma unroll
        for (int pc = 0; pc < 2; ++pc) {
            float o[8];
#pragma unroll
            for (int m = 0; m < 8; ++m)
                o[m] = (((relu(acc[0][2 * pc][m]) + relu(acc[0][2 * pc + 1][m]))
                         + relu(acc[1][2 * pc][m])) + relu(acc[1][2 * pc + 1][m])) * 0.25f;
            reinterpret_cast<float4*>(out + pc * C2)[0] = make_float4(o[0], o[1], o[2], o[3]);
            reinterpret_cast<float4*>(out + pc * C2)[1] = make_float4(o[4], o[5], o[6], o[7]);
        }
    }
}
