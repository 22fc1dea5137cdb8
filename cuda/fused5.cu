// The certified low-precision pass's convolution stack, version 5 of fused4.cu (same inputs, outputs
// and bound constants c_conv2_bound; docs/certified.md): conv1 as fused_kernel3 (the same bits), conv2
// with float16 operands and float32 sums, and per pooled feature a bound dp on how far it can lie from
// the exact path's feature. For conv2 outputs of 8x8 (one m64 tile an image), 32 -> 64 channels.
// fused_kernel5 (sm_90a only): block 256 threads = 2 warpgroups, 4 images, grid ceil(n / 4); phases
//   0-1 as fused_kernel3, p1 stored as float16 (rounded to nearest) in core-matrix order (image,
//   8-channel chunk, y, x, 8): 8 adjacent outputs of a conv2 row read 8 adjacent 16-byte rows, so the
//   tensor cores read conv2's A straight from shared memory (descriptors, LBO = a chunk, SBO = a p1
//   row); then qb, the 2x2 means of p1 rounded up (the bound's A: one row per pooled window; a thread
//   a column of an image's 8-channel chunk, each row's pair sum made once for the windows above and
//   below it). Phase 2, per (kh, kw) slab of w2h (fused4's; cp.async into three buffers, one group of
//   MMAs left in flight, the bound's A in two register sets in turn): each warpgroup m64n64k16 on its 2
//   images (rows y*8 + x of the output, B the slab's nearest columns) and m64n32k16 on all 4 images'
//   16 windows (A qb in registers, B 32 of the slab's bound columns b_up): S = sum b_up qb, a bound on
//   the window's mean of sum b_up fl16(a). The pool epilogue stores the features and dp = D + G3Q
//   (2 sum relu v + 4 D) + 2^-148, D = A1 S + C[c] + BETA_N (qmax + eta) / (1 - u), all rounded up, with
//   qmax the image's largest qb (sum a over a window's inputs <= n (qmax + eta) / (1 - u): no conv1
//   maximum to track, unlike version 4's amax).
//   2 x H2*W2*C2*K2*K2*C1 x (1 + 1/4) float16 tensor FLOPs an image (version 4: x 2), plus conv1's.
// in/out as fused4.cu; PSTR, RSTR, ISTR are p1's floats per pixel, row and image (halves, in pairs).

#include <cuda_fp16.h>

#include "fused_conv1_wgmma.cuh"

static_assert(C1 == 32 && C2 == 64 && H2 == 8 && W2 == 8, "fused v5: 8x8 conv2 outputs (M = 64 an image), 32 -> 64 channels");
// p1: (image, 8-channel chunk, y, x, 8 halves), chunks CHUNK_WORDS apart (8 mod 32: qb's 16-byte
// reads of 2 pixels x 4 chunks a quarter warp take all 32 banks); the A descriptor's LBO.
constexpr int CHUNK_WORDS = ISTR / (C1 / 8), CHUNK_HALVES = 2 * CHUNK_WORDS;
static_assert(PSTR * 2 == C1 && RSTR == P1W * PSTR && ISTR % (C1 / 8) == 0 && CHUNK_WORDS >= P1H * P1W * 4 && CHUNK_WORDS % 32 == 8,
              "fused v5: p1 in halves, chunks 8 words mod 32 apart");
constexpr int SLAB16 = C1 * 2 * C2 / 2;  // floats of one (kh, kw) slab of halves, real and bound columns
constexpr int QX = 12, QW = 18;  // qb: (image, P1H - 1, QX, QW words): 16 banks between rows 2 apart, 4 between columns
static_assert(P1W - 1 <= QX, "fused v5: qb's rows");
constexpr int Q_FLOATS = IMGS * (P1H - 1) * QX * QW;
constexpr int S_ROW = C2 + 4;  // the window sums S exchanged between the warpgroups (floats)
static_assert(IMGS * WINDOWS * S_ROW <= Q_FLOATS, "fused v5: S fits where qb was");
static_assert(X_PAD + W1F_FLOATS <= Q_FLOATS, "fused v5: slab 0 lands past the images and w1 during conv1");
static_assert(SLAB16 % (4 * FUSED_THREADS) == 0 && Q_FLOATS % 4 == 0, "fused v5: slabs are 16-byte copies, 16-byte aligned");
static_assert(STAGE_FLOATS >= Q_FLOATS + 3 * SLAB16 + 4 && STAGE_FLOATS >= X_PAD + W1F_FLOATS + 4,
              "fused v5: the stage area holds the images and w1, or qb and three slabs, then the images' qb maxima");

enum { A1, BETA_N, G3Q, CHAN };
__constant__ float c_conv2_bound[CHAN + C2];

extern "C" __global__ void __launch_bounds__(FUSED_THREADS, 2)
fused_kernel5(const float* __restrict__ x, const float4* __restrict__ w2h, float* __restrict__ feat, float* __restrict__ dp,
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
    conv1_wgmma<1>(stage, x, img0, imgs, bad, nullptr, [&](int img, int py, int px, int ch, float2 o) {
        *reinterpret_cast<__half2*>(p1h + (img * (C1 / 8) + ch / 8) * CHUNK_HALVES + (py * P1W + px) * 8 + ch % 8) =
            __floats2half2_rn(o.x, o.y);
    }, nullptr, scaling, scale, [&] { fetch_slab<SLAB16>(slabs, w2h, 0); });  // past the images and w1: it lands during conv1
    __syncthreads();  // p1 complete; the staged images and w1 are dead from here on

    // qb = the 2x2 means of p1 (float16 values; sums and quarter rounded up, then float16 rounded up):
    // window (py, px) of slab (kh, kw) reads qb at (2py + kh, 2px + kw). A thread walks one column X of
    // an image's 8-channel chunk down the rows: each row's pair p[Y][X] + p[Y][X + 1] is summed once and
    // serves the windows above and below it (a third of the instructions of four loads a window).
    constexpr int QCOLS = IMGS * (C1 / 8) * (P1W - 1);
    static_assert(QCOLS <= FUSED_THREADS, "fused v5: a thread a column of qb");
    if (t < QCOLS) {
        const int X = t % (P1W - 1), chunk = t / (P1W - 1) % (C1 / 8), img = t / ((P1W - 1) * (C1 / 8));
        const uint4* at = reinterpret_cast<const uint4*>(p1h + (img * (C1 / 8) + chunk) * CHUNK_HALVES + X * 8);
        float prev[8], top = 0.0f;
#pragma unroll
        for (int Y = 0; Y < P1H; ++Y) {
            const uint4 a = at[Y * P1W], b = at[Y * P1W + 1];
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

    // Phase 2. Real tiles: rows 16w + g, + 8 are output (2w, g), (2w + 1, g): pool window (w, g / 2),
    // dx = g % 2, dy = 0, 1 (fused_kernel3's). Bound tile: rows g, g + 8 of warp w are windows g, g + 8
    // of image w; this warpgroup's 32 of the 64 channels.
    float acc[2][32], sacc[16];
    const int qrow[2] = {(w * (P1H - 1) + 2 * (g / 4)) * QX + 2 * (g % 4), (w * (P1H - 1) + 2 * (g / 4 + 2)) * QX + 2 * (g % 4)};
    // Slab s in buffer s % 3, fetched during slab s - 1; one group of MMAs left in flight, so slab s's
    // run while slab s + 1 is waited for and its A fragments loaded. The bound's A fragments are read
    // from registers until a wait covers them: two sets in turn, the previous kept live (an empty asm
    // reading it) until the wait after this slab's MMAs (wgmma_commit_wait_previous, as certify_kernel3).
    unsigned av[2][C1 / 16][4] = {};
    // The descriptors' low words made once (wgmma.cuh's desc_lo): a slab or tap adds its offset.
    const unsigned a0 = desc_lo(p1 + 2 * wg * ISTR, 4 * CHUNK_WORDS), b0 = desc_lo(stage + Q_FLOATS);
    auto step = [&](int s, unsigned (&a)[C1 / 16][4], const unsigned (&done)[C1 / 16][4]) {
        const int kh = s / K2, kw = s % K2;
        asm volatile("cp.async.wait_group 0;");
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();  // slab s landed, qb written (s = 0); slab s - 2's MMAs (the buffer refilled now) done
        if (s + 1 < K2 * K2) fetch_slab<SLAB16>(slabs + ((s + 1) % 3) * (SLAB16 / 4), w2h, s + 1);
        const unsigned slab = b0 + (s % 3) * (SLAB16 / 4);
#pragma unroll
        for (int ks = 0; ks < C1 / 16; ++ks)
#pragma unroll
            for (int r = 0; r < 4; ++r) a[ks][r] = qb[(qrow[r % 2] + kh * QX + kw) * QW + 8 * ks + tig + 4 * (r / 2)];
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int ks = 0; ks < C1 / 16; ++ks)
                wgmma16_ss(acc[i], desc(a0 + (i * ISTR + 2 * ks * CHUNK_WORDS) / 4 + kh * P1W + kw, P1W * 16),
                           desc(slab + ks * (SLAB16 / (C1 / 16)) / 4), s != 0 || ks != 0);
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

    const int win = 4 * w + g / 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int img = 2 * wg + i;
        const float bimg = __fmul_ru(__fmul_ru(c_conv2_bound[BETA_N], __fadd_ru(__uint_as_float(qmax[img]), 0x1p-25f)), 1.0f + 0x1p-10f);
        const size_t at = ((size_t)(img0 + img) * WINDOWS + win) * C2 + 2 * tig;
        const bool store = g % 2 == 0 && img < imgs;
#pragma unroll
        for (int c = 0; c < C2 / 8; ++c) {
            const float2 o = pool_pair(acc[i], c);
            const float2 sw = *reinterpret_cast<const float2*>(S + (img * WINDOWS + win) * S_ROW + 8 * c + 2 * tig);
            float d[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float vs = __fadd_ru(relu(acc[i][4 * c + e]), relu(acc[i][4 * c + 2 + e]));
                vs = __fadd_ru(vs, __shfl_down_sync(0xffffffffu, vs, 4));  // the dx = 1 half
                const float base = __fadd_ru(c_conv2_bound[CHAN + 8 * c + 2 * tig + e], bimg);
                const float dm = __fmaf_ru(c_conv2_bound[A1], e ? sw.y : sw.x, base);
                d[e] = __fadd_ru(__fadd_ru(dm, __fmul_ru(c_conv2_bound[G3Q], __fmaf_ru(2.0f, vs, __fmul_ru(4.0f, dm)))), 0x1p-148f);
            }
            if (store) {
                *reinterpret_cast<float2*>(feat + at + 8 * c) = o;
                *reinterpret_cast<float2*>(dp + at + 8 * c) = make_float2(d[0], d[1]);
            }
        }
    }
}
