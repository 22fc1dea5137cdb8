// The whole convolution stack in one kernel, per group of IMGS images, intermediates in shared
// memory only: conv1 (K1xK1, IN_C -> C1) -> ReLU -> 2x2 avg pool -> conv2 (K2xK2, C1 -> C2) -> ReLU
// -> 2x2 avg pool -> features (n, P2H, P2W, C2), NHWC, i.e. already flattened in (h, w, c) order.
// in: x (n, IN_H, IN_W, IN_C) float32; conv1 weights in constant memory c_w1 (K1, K1, IN_C, C1);
// conv2's weights in global memory, staged through shared memory one (kh, kw) slab at a time.
// All versions: block FUSED_THREADS (256), grid ceil(n / IMGS); phase 0 stages the images and, where
// `bad` is not null, checks them: *bad = min(*bad, i) for every image i holding a value that is not
// finite (check_kernel1's job, done here on the way in: the images are read once); phase 1
// computes one pooled conv1 output per thread-iteration (the thread's channel fixed, its K1*K1*IN_C
// weights in registers; 4 conv outputs, ReLU, ((a+b)+c)+d * 0.25); phase 2 is conv2 as an implicit
// GEMM (the im2col gather is the shared-memory addressing), M = pixels, N = C2, K = K2*K2*C1, with
// ReLU + 2x2 pool + NHWC store in registers. FLOPs per image: 2*(H1*W1*C1*K1*K1*IN_C +
// H2*W2*C2*K2*K2*C1); global bytes: the input once, the features once, w2 once per block (from L2).
// fused_kernel1 (FUSED_VERSION 1): FP32 FFMA, each thread a 2x4-pixel x 8-channel register
//   micro-tile with float4 operands; w2 (K2, K2, C1, C2) as stored, slabs double-buffered.
// fused_kernel2 (FUSED_VERSION 2, sm_80+): tensor cores, 3xTF32 (each operand split into a TF32
//   part and a TF32 remainder; three mma.sync.m16n8k8 per product keep FP32-level accuracy); a warp
//   per (image, half of C2): 4 m-tiles = the 4 positions of a 2x2 pool window over 16 windows, C2/16
//   n-tiles of 8; w2 pre-split and laid out in fragment order by the host: (K2*K2, C1/8, C2/8, 32
//   lanes, {hi k, hi k+4, lo k, lo k+4}), slabs double-buffered with cp.async, one barrier each.
// fused_kernel3 (FUSED_VERSION 3, sm_90a only): both convs on Hopper's warpgroup MMA (wgmma), 3xTF32
//   as in version 2. A tile is 64 rows = 16 pool windows x 4 positions; a thread holds rows (window,
//   dx) for dy = 0, 1, and the pool adds its partner lane's dx = 1 through shuffles, in the
//   reference's order. A fragments come from registers (gathered from shared memory and split per
//   k8 step), B (weight parts, remainders) is read by the tensor cores from shared memory through
//   matrix descriptors, as K-major core matrices without swizzle: per k8 step (parts, remainders) x
//   (N/8, 2 halves of k, 8 rows, 4 k). conv1: m64n32k8 tiles, k = (kh, kw, ci) padded to a multiple
//   of 8, except that a last 1 or 2 k past a whole k8 step go to FFMA; the split w1 in constant
//   memory, copied beside the images; each warpgroup takes two tiles at a time. conv2: each of the 2
//   warpgroups computes 2 images, one m64n64k8 tile per image, host layout of w2 (K2*K2, C1/8, {hi,
//   lo}, C2/8, 2, 8, 4). 3 x 2 x (H1*W1*C1*K1S + H2*W2*C2*K2*K2*C1) tensor FLOPs an image (K1S: the
//   k of conv1's steps, 24 for ECE408's 25), plus 2 x H1*W1*C1 per tail k on FFMA.
// Shapes arrive as -D options; the host checks the preconditions asserted below.

#ifndef IMGS
#define IMGS 4
#endif
#ifndef FUSED_VERSION
#define FUSED_VERSION 1
#endif
#define FUSED_THREADS 256

#include "common.cuh"

constexpr int H1 = IN_H - K1 + 1, W1 = IN_W - K1 + 1;
constexpr int P1H = H1 / 2, P1W = W1 / 2;
constexpr int H2 = P1H - K2 + 1, W2 = P1W - K2 + 1;
constexpr int P2H = H2 / 2, P2W = W2 / 2;
constexpr int X_FLOATS = IMGS * IN_H * IN_W * IN_C;
constexpr int SLAB = C1 * C2;  // one (kh, kw) slab of w2

static_assert(FUSED_THREADS % C1 == 0, "fused: conv1 channels must divide the block");

// Phase 0: images [img0, img0 + imgs) of x into stage (zeros past them up to IMGS), each value checked
// where bad is not null.
__device__ __forceinline__ void stage_images(float* stage, const float* __restrict__ x, int img0, int imgs,
                                             int* __restrict__ bad) {
    constexpr int IMG = IN_H * IN_W * IN_C;
    const float* xb = x + (size_t)img0 * IMG;
    for (int i = threadIdx.x; i < X_FLOATS; i += FUSED_THREADS) {
        const float v = i < imgs * IMG ? xb[i] : 0.0f;
        if (bad != nullptr && !isfinite(v)) atomicMin(bad, img0 + i / IMG);
        stage[i] = v;
    }
}

#if FUSED_VERSION < 3
__constant__ float c_w1[K1 * K1 * IN_C * C1];
#endif

#if FUSED_VERSION == 1

constexpr int QUADS = P2W / 2;                    // 4-column groups of conv2 outputs per row pair
constexpr int PIXEL_GROUPS = IMGS * P2H * QUADS;  // each 2 rows x 4 columns of conv2 outputs
constexpr int CHANNEL_GROUPS = C2 / 8;
// Shared-memory layout of the pooled conv1 output: a pixel stride of C1 + 4 floats and an image
// stride of 4 mod 32 floats spread the 8 float4 reads of a quarter warp over all 32 banks.
constexpr int PSTR = C1 + 4, RSTR = P1W * PSTR;
constexpr int ISTR = P1H * RSTR + ((36 - (P1H * RSTR) % 32) % 32);
constexpr int P1_FLOATS = IMGS * ISTR;
constexpr int STAGE_FLOATS = X_FLOATS > 2 * SLAB ? X_FLOATS : 2 * SLAB;
constexpr int SLAB_F4_PER_THREAD = SLAB / 4 / FUSED_THREADS;

static_assert(P2W % 2 == 0, "fused: pooled conv2 width must be even");
static_assert(C1 % 4 == 0 && C2 % 8 == 0, "fused: channel counts must be multiples of 4 and 8");
static_assert(PIXEL_GROUPS * CHANNEL_GROUPS == FUSED_THREADS, "fused: IMGS must give 256 threads");
static_assert(PIXEL_GROUPS % 16 == 0 && CHANNEL_GROUPS % 2 == 0, "fused: warp mapping");
static_assert(SLAB % (4 * FUSED_THREADS) == 0, "fused: w2 slab must split into float4 per thread");
static_assert((P1_FLOATS + STAGE_FLOATS) * 4 <= 227 * 1024, "fused: shared memory over the 227 KB a block may have");

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel1(const float* __restrict__ x, const float* __restrict__ w2, float* __restrict__ feat, int n, int* __restrict__ bad) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    float* stage = p1 + P1_FLOATS;  // the input images in phase 1, then two w2 slabs in phase 2
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    const int imgs = min(IMGS, n - img0);

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

#else  // versions 2 and 3: conv2 on the tensor cores, w2 slabs (parts and remainders) via cp.async

constexpr int WINDOWS = P2H * P2W;  // pooled outputs per image: 16 of them make an m-tile's rows
constexpr int KSTEPS = C1 / 8;
constexpr int SLAB2 = 2 * SLAB;  // TF32 parts and remainders of one (kh, kw) slab
constexpr int STEPS = WINDOWS / 16 * K2 * K2;  // (group of 16 windows, kh, kw)

static_assert(WINDOWS % 16 == 0 && C1 % 8 == 0, "fused v2/v3: tile shapes");
static_assert(SLAB2 % (4 * FUSED_THREADS) == 0, "fused v2/v3: w2 slab must split into 16 bytes per thread");

#include "mma.cuh"

// Start copying slab s of w2f into shared memory at dst (16 bytes per thread per round, async).
__device__ __forceinline__ void fetch_slab(float4* dst, const float4* __restrict__ w2f, int s) {
    const float4* src = w2f + (size_t)s * (SLAB2 / 4);
#pragma unroll
    for (int i = 0; i < SLAB2 / 4 / FUSED_THREADS; ++i) {
        const int e = threadIdx.x + i * FUSED_THREADS;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(dst + e)), "l"(src + e));
    }
    asm volatile("cp.async.commit_group;");
}

#if FUSED_VERSION == 2

constexpr int NT = C2 / 16;         // n-tiles of 8 channels per warp (two warps per image)
// p1 strides for the A fragments' scalar loads (8 pixels x 4 channels each): a pixel stride of
// C1 + 2 puts columns 2 apart 4 banks apart, a row stride of 8 mod 16 puts rows 2 apart 16 banks
// apart, so the 32 loads of a warp hit 32 banks (for 4x4 pooled outputs and C1 = 32).
constexpr int PSTR = C1 + 2;
constexpr int RSTR = P1W * PSTR + (24 - (P1W * PSTR) % 16) % 16;
constexpr int ISTR = P1H * RSTR;
constexpr int P1_FLOATS = IMGS * ISTR;
constexpr int STAGE_FLOATS = X_FLOATS > 2 * SLAB2 ? X_FLOATS : 2 * SLAB2;  // two slabs in flight

static_assert(IMGS * 2 * 32 == FUSED_THREADS, "fused v2: two warps per image, four images");
static_assert(C2 % 16 == 0 && NT <= 4, "fused v2: tile shapes");
static_assert((P1_FLOATS + STAGE_FLOATS) * 4 <= 227 * 1024, "fused v2: shared memory over 227 KB");

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

#else  // FUSED_VERSION == 3

// p1 strides for the A gathers: a warp's 8 row-groups g read 8 adjacent pixels of one p1 row, 4
// channels each (tig); a pixel stride of C1 + 4 puts them in 32 different banks.
constexpr int PSTR = C1 + 4;
constexpr int RSTR = P1W * PSTR;
constexpr int ISTR = P1H * RSTR;
constexpr int P1_FLOATS = IMGS * ISTR;
// conv1's k = (kh, kw, ci): k8 steps on the tensor cores, padded, except a tail of CONV1_TAIL (1 or
// 2) k past the last whole step, added on the FP32 cores (a k8 step of 3 MMAs for 1 of 8 useful k
// would cost more: ECE408's 5x5x1 is 3 steps + 1). The host chooses it (launch.Fused.conv1_steps).
#ifndef CONV1_TAIL
#error "fused v3 needs -DCONV1_TAIL"
#endif
constexpr int K1K = K1 * K1 * IN_C;
constexpr int TAIL1 = CONV1_TAIL;
constexpr int KS1 = (K1K - TAIL1 + 7) / 8;
static_assert(TAIL1 >= 0 && TAIL1 <= 2 && KS1 >= 1, "fused v3: conv1's tail is 0-2 k after at least one step");
constexpr int X_PAD = (X_FLOATS + 31) / 32 * 32;  // the images, then conv1's weights (128-byte aligned)
constexpr int W1F_FLOATS = KS1 * 2 * 8 * C1 + TAIL1 * C1;
constexpr int STAGE_FLOATS = X_PAD + W1F_FLOATS > 2 * SLAB2 ? X_PAD + W1F_FLOATS : 2 * SLAB2;
constexpr int TILES1 = (P1H * P1W + 15) / 16;  // conv1 m64 tiles (16 pool windows each) per image
constexpr int JOBS1 = IMGS * TILES1;

static_assert(IMGS == 4 && FUSED_THREADS == 256, "fused v3: two warpgroups of two images each");
static_assert(C1 == 32 && C2 == 64, "fused v3: N = C1 = 32 (wgmma.m64n32k8), N = C2 = 64 (m64n64k8)");
static_assert((P1_FLOATS + STAGE_FLOATS) * 4 <= 227 * 1024, "fused v3: shared memory over 227 KB");

// conv1's weights: the steps' split like w2, zero past k = K1K: (KS1, {hi, lo}, C1/8, 2, 8, 4); then
// the tail's as they are, (TAIL1, C1).
__constant__ float c_w1[W1F_FLOATS];

#include "wgmma.cuh"

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel3(const float* __restrict__ x, const float4* __restrict__ w2f, float* __restrict__ feat, int n, int* __restrict__ bad) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    float* stage = p1 + P1_FLOATS;  // the images and w1 in phase 1, then two w2 slabs in phase 2
    float4* slabs = reinterpret_cast<float4*>(stage);
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    const int imgs = min(IMGS, n - img0);
    const int lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int wg = warp / 4, w = warp % 4;  // warpgroup and warp in it

    // Phase 0: this block's images (zeros past the end of the batch), checked, then conv1's weights.
    stage_images(stage, x, img0, imgs, bad);
    for (int i = t; i < W1F_FLOATS; i += FUSED_THREADS) stage[X_PAD + i] = c_w1[i];
    asm volatile("fence.proxy.async.shared::cta;");  // w1 written here, read by the tensor cores
    __syncthreads();

    // Phase 1: conv1 -> ReLU -> pool into p1, m64n32 tiles of 16 pool windows x 4 positions; job j is
    // (image j / TILES1, tile j % TILES1), each warpgroup two jobs at a time. Rows g and g + 8 of warp
    // w: window 16 tile + 4w + g/2, column dx = g % 2, row dy = 0, 1. Padded k read pixel 0 (finite,
    // times a zero weight); windows past the last are computed on window 0 and not stored.
    {
        int koff[KS1][2];
#pragma unroll
        for (int ks = 0; ks < KS1; ++ks)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int k = 8 * ks + tig + 4 * j, kk = k / IN_C;
                koff[ks][j] = k < K1K ? ((kk / K1) * IN_W + kk % K1) * IN_C + k % IN_C : 0;
            }
        for (int pair = wg; pair < (JOBS1 + 1) / 2; pair += 2) {
            const float* base[2];
            int out[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int job = min(2 * pair + i, JOBS1 - 1), img = job / TILES1;
                const int win = (job % TILES1) * 16 + 4 * w + g / 2, wc = win < P1H * P1W ? win : 0;
                const int py = wc / P1W, px = wc % P1W;
                base[i] = stage + ((img * IN_H + 2 * py) * IN_W + 2 * px + g % 2) * IN_C;
                out[i] = 2 * pair + i < JOBS1 && win < P1H * P1W && g % 2 == 0 ? img * ISTR + py * RSTR + px * PSTR + 2 * tig : -1;
            }
            float acc[2][16];
#pragma unroll
            for (int ks = 0; ks < KS1; ++ks) {
                float av[2][4];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    av[i][0] = base[i][koff[ks][0]];
                    av[i][1] = base[i][IN_W * IN_C + koff[ks][0]];
                    av[i][2] = base[i][koff[ks][1]];
                    av[i][3] = base[i][IN_W * IN_C + koff[ks][1]];
                }
                mma3_step(acc, av, stage + X_PAD + ks * 16 * C1, ks == 0);
            }
            wgmma_drain();
#pragma unroll
            for (int k = 8 * KS1; k < K1K; ++k) {  // the tail: accumulator 4c + 2dy + e is channel 8c + 2tig + e
                const int kk = k / IN_C, off = ((kk / K1) * IN_W + kk % K1) * IN_C + k % IN_C;
                const float* wt = stage + X_PAD + KS1 * 16 * C1 + (k - 8 * KS1) * C1 + 2 * tig;
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int dy = 0; dy < 2; ++dy) {
                        const float a = base[i][dy * IN_W * IN_C + off];
#pragma unroll
                        for (int c = 0; c < C1 / 8; ++c)
#pragma unroll
                            for (int e = 0; e < 2; ++e) acc[i][4 * c + 2 * dy + e] = fmaf(a, wt[8 * c + e], acc[i][4 * c + 2 * dy + e]);
                    }
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int c = 0; c < C1 / 8; ++c) {
                    const float2 o = pool_pair(acc[i], c);
                    if (out[i] >= 0) *reinterpret_cast<float2*>(p1 + out[i] + 8 * c) = o;
                }
        }
    }
    __syncthreads();  // p1 complete; the staged images and w1 are dead from here on
    fetch_slab(slabs, w2f, 0);

    // Phase 2: conv2, 2 images per warpgroup, one m64n64 tile per image and group of 16 windows.
    float acc[2][32];
    for (int u = 0; u < STEPS; ++u) {
        const int mg = u / (K2 * K2), s = u % (K2 * K2);
        // Rows g and g + 8 of warp w: pool window mg*16 + 4w + g/2, column dx = g % 2, row dy = 0, 1.
        const int win = mg * 16 + 4 * w + g / 2, py = win / P2W, px = win % P2W;
        const float* as = p1 + (2 * wg) * ISTR + (2 * py + s / K2) * RSTR + (2 * px + g % 2 + s % K2) * PSTR + tig;
        // Slab u has landed (ours; the proxy fence hands it to the tensor cores' reads, the barrier
        // makes everyone's visible), and every warpgroup's MMAs on the other buffer have completed.
        asm volatile("cp.async.wait_group 0;");
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();
        if (u + 1 < STEPS) fetch_slab(slabs + ((u + 1) % 2) * (SLAB2 / 4), w2f, (u + 1) % (K2 * K2));
        const float* slab = stage + (u % 2) * SLAB2;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            float av[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float* a = as + i * ISTR + ks * 8;
                av[i][0] = a[0];
                av[i][1] = a[RSTR];
                av[i][2] = a[4];
                av[i][3] = a[RSTR + 4];
            }
            mma3_step(acc, av, slab + ks * 16 * C2, s == 0 && ks == 0);  // a window group's first step
        }
        wgmma_drain();

        if (s == K2 * K2 - 1) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int img = 2 * wg + i;
                float* out = feat + ((size_t)(img0 + img) * WINDOWS + win) * C2 + 2 * tig;
#pragma unroll
                for (int c = 0; c < C2 / 8; ++c) {
                    const float2 o = pool_pair(acc[i], c);
                    if (g % 2 == 0 && img < imgs) *reinterpret_cast<float2*>(out + c * 8) = o;
                }
            }
        }
    }
}

#endif
#endif
