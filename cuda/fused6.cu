// The certified low-precision pass's convolution stack (docs/certified.md): conv1 as fused_kernel3 (the
// same bits), conv2 with float16 operands and float32 sums, and per pooled feature a bound dp on how far
// it can lie from the exact path's feature. For conv2 outputs of 8x8, 32 -> 64 channels.
// in/out as fused4.cu (c_conv2_bound the same constants); ISTR is half an image pair's p1 floats
// (halves, in pairs).
// fused_kernel6 (sm_90a only): block 256 threads = 2 warpgroups, 4 images (two pairs), grid ceil(n / 4).
//   Phases 0-1 as fused_kernel3, p1 stored as float16 (rounded to nearest) in core-matrix order per
//   image pair (pair, 8-channel chunk, y, image of the pair, x, 8): the 16 rows (y, image) of 8
//   outputs a conv2 slab reads are P1W pixels apart, one descriptor (LBO = a chunk, SBO = a p1 row).
//   Then qb, the 2x2 means of p1 rounded up (the bound's A: one row per pooled window; a thread a
//   column of an image's 8-channel chunk, each row's pair sum made once for the windows above and
//   below it). Phase 2, per (kh, kw) slab of w2h (fused4's; cp.async into four buffers, two ahead, one group
//   of MMAs left in flight, the bound's A in two register sets in turn): each warpgroup
//   m64n128k16 on its image pair with the slab's nearest columns as A (M = the 64 output channels)
//   and p1 as B (N = 128 outputs of two images): 6 KB of shared memory read an MMA, where two
//   m64n64k16 with the images as A read 8 (ncu: the shared-memory pipe ~75% busy); and m64n32k16 on
//   all 4 images' 16 windows (A qb in registers, B 32 of the slab's bound columns b_up): S = sum b_up
//   qb, a bound on the window's mean of sum b_up fl16(a). A thread's accumulators are channels 16 w +
//   g (+ 8) at x = 2 tig (+ 1) of every row, so it pools windows (py, tig) itself. The epilogue
//   stores the features and dp = D + G3Q (2 sum relu v + 4 D) + 2^-148, D = A1 S + C[c] + BETA_N
//   (qmax + eta) / (1 - u), all rounded up, with qmax the image's largest qb (sum a over a window's
//   inputs <= n (qmax + eta) / (1 - u)). With -DFEAT_HALVES=1 (certify_kernel5's input) both go out
//   as float16, half the bytes: the features rounded to nearest, dp times 2^DSCALE_LOG2 rounded up,
//   the very operands certify_kernel4 makes of the float32 pair.
//   2 x H2*W2*C2*K2*K2*C1 x (1 + 1/4) float16 tensor FLOPs an image, plus conv1's.

#include <cuda_fp16.h>

#include "fused_conv1_wgmma.cuh"

static_assert(C1 == 32 && C2 == 64 && H2 == 8 && W2 == 8, "fused v6: 8x8 conv2 outputs (N = 64 an image), 32 -> 64 channels");
static_assert(IMGS == 4, "fused v6: two image pairs");
// p1: (pair, 8-channel chunk, y, image of the pair, x, 8 halves), chunks CHUNK_WORDS apart (8 mod 32).
constexpr int PAIR_WORDS = 2 * ISTR, CHUNK_WORDS = PAIR_WORDS / (C1 / 8), CHUNK_HALVES = 2 * CHUNK_WORDS;
static_assert(PSTR * 2 == C1 && RSTR == P1W * PSTR && PAIR_WORDS % (C1 / 8) == 0 && CHUNK_WORDS >= 2 * P1H * P1W * 4 &&
              CHUNK_WORDS % 32 == 8, "fused v6: p1 in halves, image pairs' chunks 8 words mod 32 apart");
constexpr int SLAB16 = C1 * 2 * C2 / 2;  // floats of one (kh, kw) slab of halves, real and bound columns
constexpr int QX = 12, QW = 18;  // qb: (image, P1H - 1, QX, QW words): 16 banks between rows 2 apart, 4 between columns
static_assert(P1W - 1 <= QX, "fused v6: qb's rows");
constexpr int Q_FLOATS = IMGS * (P1H - 1) * QX * QW;
constexpr int S_ROW = C2 + 4;
static_assert(IMGS * WINDOWS * S_ROW <= Q_FLOATS, "fused v6: S fits where qb was");
static_assert(X_PAD + W1F_FLOATS <= Q_FLOATS, "fused v6: slab 0 lands past the images and w1 during conv1");
static_assert(SLAB16 % (4 * FUSED_THREADS) == 0 && Q_FLOATS % 4 == 0, "fused v6: slabs are 16-byte copies, 16-byte aligned");
constexpr int SLABS = 4;  // slab buffers: two fetched ahead (L2's latency) while the MMAs of one are in flight
static_assert(STAGE_FLOATS >= Q_FLOATS + SLABS * SLAB16 + 4 && STAGE_FLOATS >= X_PAD + W1F_FLOATS + 4,
              "fused v6: the stage area holds the images and w1, or qb and four slabs, then the images' qb maxima");

enum { A1, BETA_N, G3Q, CHAN };
#ifndef FEAT_HALVES
#define FEAT_HALVES 0
#endif
#if FEAT_HALVES && !defined(DSCALE_LOG2)
#error "fused v6: -DFEAT_HALVES needs -DDSCALE_LOG2, dp's scale as certify_kernel5 reads it (certify.DSCALE_LOG2)"
#endif
__constant__ float c_conv2_bound[CHAN + C2];

// Where pixel (y, x) of image img's 8-channel chunk starts in p1, in halves (chunks 8 words mod 32
// apart: qb's 16-byte reads of 2 pixels x 4 chunks a quarter warp spread over the banks).
__device__ __forceinline__ int p1_pixel(int img, int chunk, int y, int x) {
    return ((img / 2) * (C1 / 8) + chunk) * CHUNK_HALVES + ((2 * y + img % 2) * P1W + x) * 8;
}

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel6(const float* __restrict__ x, const float4* __restrict__ w2h, float* __restrict__ feat, float* __restrict__ dp,
              int n, int* __restrict__ bad, int scaling, float scale) {
    extern __shared__ float4 smem4[];
    float* p1 = reinterpret_cast<float*>(smem4);
    __half* p1h = reinterpret_cast<__half*>(p1);
    float* stage = p1 + P1_FLOATS;  // the images and w1 in phase 1; qb, then the slabs, in phase 2
    unsigned* qb = reinterpret_cast<unsigned*>(stage);  // half2 words
    float4* slabs = reinterpret_cast<float4*>(stage + Q_FLOATS);
    unsigned* qmax = reinterpret_cast<unsigned*>(stage + STAGE_FLOATS - 4);  // float bits, not negative
    const int t = threadIdx.x;
    const int img0 = blockIdx.x * IMGS;
    const int imgs = min(IMGS, n - img0);
    const int lane = t % 32, warp = t / 32, g = lane >> 2, tig = lane & 3;
    const int wg = warp / 4, w = warp % 4;

    if (t < IMGS) qmax[t] = 0;
    __syncthreads();
    conv1_wgmma<2>(stage, x, img0, imgs, bad, nullptr, [&](int img, int py, int px, int ch, float2 o) {
        *reinterpret_cast<__half2*>(p1h + p1_pixel(img, ch / 8, py, px) + ch % 8) = __floats2half2_rn(o.x, o.y);
    }, nullptr, scaling, scale, [&] {  // slabs 0 and 1 (a group each) past the images and w1: they land during conv1
        fetch_slab<SLAB16>(slabs, w2h, 0);
        if (K2 * K2 > 1)
            fetch_slab<SLAB16>(slabs + SLAB16 / 4, w2h, 1);
        else
            asm volatile("cp.async.commit_group;");
    });
    __syncthreads();  // p1 complete; the staged images and w1 are dead from here on

    // qb = the 2x2 means of p1 (float16 values; sums and quarter rounded up, then float16 rounded up):
    // window (py, px) of slab (kh, kw) reads qb at (2py + kh, 2px + kw). A thread walks one column X of
    // an image's 8-channel chunk down the rows: each row's pair p[Y][X] + p[Y][X + 1] is summed once and
    // serves the windows above and below it (a third of the instructions of four loads a window).
    constexpr int QCOLS = IMGS * (C1 / 8) * (P1W - 1);
    static_assert(QCOLS <= FUSED_THREADS, "fused v6: a thread a column of qb");
    if (t < QCOLS) {
        const int X = t % (P1W - 1), chunk = t / (P1W - 1) % (C1 / 8), img = t / ((P1W - 1) * (C1 / 8));
        const uint4* at = reinterpret_cast<const uint4*>(p1h + p1_pixel(img, chunk, 0, X));
        float prev[8], top = 0.0f;
#pragma unroll
        for (int Y = 0; Y < P1H; ++Y) {
            const uint4 a = at[2 * Y * P1W], b = at[2 * Y * P1W + 1];
            float row[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned wa = j == 0 ? a.x : j == 1 ? a.y : j == 2 ? a.z : a.w;
                const unsigned wb = j == 0 ? b.x : j == 1 ? b.y : j == 2 ? b.z : b.w;
                const float2 fa = __half22float2(*reinterpret_cast<const __half2*>(&wa));
                const float2 fb = __half22float2(*reinterpret_cast<const __half2*>(&wb));
                row[2 * j] = __fadd_ru(fa.x, fb.x);
                row[2 * j + 1] = __fadd_ru(fa.y, fb.y);
            }
            if (Y > 0) {
                unsigned out[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float mx = __fmul_ru(__fadd_ru(prev[2 * j], row[2 * j]), 0.25f);
                    const float my = __fmul_ru(__fadd_ru(prev[2 * j + 1], row[2 * j + 1]), 0.25f);
                    const __half2 h = __halves2half2(__float2half_ru(mx), __float2half_ru(my));
                    out[j] = *reinterpret_cast<const unsigned*>(&h);
                    const float2 f = __half22float2(h);
                    top = f.x != f.x || f.y != f.y ? INFINITY : fmaxf(top, fmaxf(f.x, f.y));  // NaN: no certificate
                }
                uint2* q = reinterpret_cast<uint2*>(qb + ((img * (P1H - 1) + Y - 1) * QX + X) * QW + 4 * chunk);
                q[0] = make_uint2(out[0], out[1]);
                q[1] = make_uint2(out[2], out[3]);
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) prev[k] = row[k];
        }
        atomicMax(qmax + img, __float_as_uint(top + 0.0f));  // -0 -> +0
    }

    // Phase 2. Real tile: rows 16 w + g (+ 8) are channels, columns 8 j + 2 tig + e the output at
    // y = j / 2, x = 2 tig + e of the pair's image j % 2. Bound tile: rows g, g + 8 of warp w are
    // windows g, g + 8 of image w; this warpgroup's 32 of the 64 channels. Slab s in buffer s % 4,
    // fetched during slab s - 2 (one ahead, warps waited on L2 ~14% of ncu's stall samples); one group
    // of MMAs left in flight, so slab s's run while slab s + 1 is
    // waited for and its A fragments loaded. The bound's A fragments are read from registers until a
    // wait covers them: two sets in turn, the previous kept live (an empty asm reading it) until the
    // wait after this slab's MMAs (wgmma_commit_wait_previous, as certify_kernel3).
    float acc[64], sacc[16];
    const int qrow[2] = {(w * (P1H - 1) + 2 * (g / 4)) * QX + 2 * (g % 4), (w * (P1H - 1) + 2 * (g / 4 + 2)) * QX + 2 * (g % 4)};
    unsigned av[2][C1 / 16][4] = {};
    const unsigned b0 = desc_lo(p1 + wg * PAIR_WORDS, 4 * CHUNK_WORDS), s0 = desc_lo(stage + Q_FLOATS);
    auto step = [&](int s, unsigned (&a)[C1 / 16][4], const unsigned (&done)[C1 / 16][4]) {
        const int kh = s / K2, kw = s % K2;
        asm volatile("cp.async.wait_group 1;");  // all but the newest group: slab s (each step commits one)
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();  // slab s landed, qb written (s = 0); slab s - 2's MMAs (the buffer refilled now) done
        if (s + 2 < K2 * K2)
            fetch_slab<SLAB16>(slabs + ((s + 2) % SLABS) * (SLAB16 / 4), w2h, s + 2);
        else
            asm volatile("cp.async.commit_group;");
        const unsigned slab = s0 + (s % SLABS) * (SLAB16 / 4);
#pragma unroll
        for (int ks = 0; ks < C1 / 16; ++ks)
#pragma unroll
            for (int r = 0; r < 4; ++r) a[ks][r] = qb[(qrow[r % 2] + kh * QX + kw) * QW + 8 * ks + tig + 4 * (r / 2)];
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < C1 / 16; ++ks)
            wgmma16_ss(acc, desc(slab + ks * (SLAB16 / (C1 / 16)) / 4),
                       desc(b0 + 2 * ks * CHUNK_WORDS / 4 + 2 * kh * P1W + kw, P1W * 16), s != 0 || ks != 0);
#pragma unroll
        for (int ks = 0; ks < C1 / 16; ++ks)
            wgmma16(sacc, a[ks], desc(slab + (ks * (SLAB16 / (C1 / 16)) + (C2 / 8 + 4 * wg) * 64) / 4), s != 0 || ks != 0);
        wgmma_commit_wait_previous(done);  // slab s - 1's MMAs are done
    };
    constexpr int FIRST = K2 * K2 % 2;  // an odd count's first slab on its own, the rest in pairs
    if (FIRST) step(0, av[1], av[0]);
    for (int s = FIRST; s < K2 * K2; s += 2) {
        step(s, av[0], av[1]);
        step(s + 1, av[1], av[0]);
    }
    wgmma_drain();

    __syncthreads();  // qb is dead: the window sums S take its place
    float* S = stage;
    store_tile(S + 32 * wg, S_ROW, sacc);  // row 16 w + g (+ 8): window g (+ 8) of image w
    __syncthreads();

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int img = 2 * wg + i;
        const float bimg = __fmul_ru(__fmul_ru(c_conv2_bound[BETA_N], __fadd_ru(__uint_as_float(qmax[img]), 0x1p-25f)), 1.0f + 0x1p-10f);
#pragma unroll
        for (int py = 0; py < P2H; ++py) {
            const int win = py * P2W + tig;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int ch = 16 * w + g + 8 * h;
                const int j = 4 * (4 * py + i) + 2 * h;  // y = 2 py: columns 8 (4 py + i) + 2 tig + e; y + 1 two groups on
                const float a = relu(acc[j]), b = relu(acc[j + 1]), c = relu(acc[j + 8]), d = relu(acc[j + 9]);
                const float o = (((a + b) + c) + d) * 0.25f;
                const float vs = __fadd_ru(__fadd_ru(a, c), __fadd_ru(b, d));
                const float base = __fadd_ru(c_conv2_bound[CHAN + ch], bimg);
                const float dm = __fmaf_ru(c_conv2_bound[A1], S[(img * WINDOWS + win) * S_ROW + ch], base);
                const float bound = __fadd_ru(__fadd_ru(dm, __fmul_ru(c_conv2_bound[G3Q], __fmaf_ru(2.0f, vs, __fmul_ru(4.0f, dm)))), 0x1p-148f);
                if (img < imgs) {
                    const size_t at = ((size_t)(img0 + img) * WINDOWS + win) * C2 + ch;
#if FEAT_HALVES
                    reinterpret_cast<__half*>(feat)[at] = __float2half_rn(o);
                    reinterpret_cast<__half*>(dp)[at] = __float2half_ru(bound * (float)(1 << DSCALE_LOG2));
#else
                    feat[at] = o;
                    dp[at] = bound;
#endif
                }
            }
        }
    }
}
