// Development versions of the certificate (cuda/certify.cu), kept to validate each against the
// reference and time it (dev/cuda/certify_early.py); the product runs versions 4 and 5. These read
// fc1's float32-accurate sums before ReLU z (n, HIDDEN), the scores (n, CLASSES) and the labels (n)
// from the fc kernel (fc_kernel6 or 5 on the float16 pass's features p), beside p and its bounds dp
// (n, FEAT); they write ok (n). Built with -I cuda and the product's -D options for version 4 (whose
// certify.cu, included, gives the helpers and pair_kernel1, version 3's second stage), and
// -DSHARED_V1..V3: each kernel's shared floats (certify_early.py's shared()).
// certify_kernel1 (sm_90a only): block 256 threads = 2 warpgroups, 32 images, grid ceil(n / 32).
//   Phase A: [dp * 2^S; |p|] (64 rows, rounded up to float16) . |fc1|_up on wgmma.m64n64k16, a
//   warpgroup per 64 hidden units, k-tiles of 64 features staged by cp.async: per hidden unit j the
//   bound e1_j = q_j + r1_j on fc1's difference between the paths (q = dp.|fc1|, r1 the float32
//   sums' rounding), stable = |z_j| > e1_j, active = stable and z_j > 0, ReLU's slope between the
//   paths (1 active, 0 stable and off, 1/2 +- 1/2 unstable); per class the bound's fc terms.
//   Phase B: per image G = fc1 . diag(slope) . fc2 (FEAT x CLASSES) on wgmma.m64n160k16
//   (A: fc1 in 64-feature slabs from shared memory, B: 16 images x 10 classes per warpgroup), and
//   P_c = sum_i dp_i |G_it - G_ic|; the image is certified (ok = 1) when, for every class c other
//   than its label t, s_t - s_c (rounded down) exceeds P_c + the fc terms (rounded up).
//   2 x FEAT x HIDDEN x (2 + CLASSES) float16 tensor FLOPs an image (Phase A's rows: dp and |p|).
// certify_kernel2 (sm_90a only): block 256 threads, 16 images, grid ceil(n / 16), two blocks an SM
//   (97 KB shared, at most 128 registers). Phase A as version 1 (k-tiles of 64 features; rows 0-15
//   dp, 16-31 |p|, the rest zeros), sum dp from the same tiles. Per image (16 threads, 8 hidden units
//   each) phase B's operand is slope_j (fc2_jt - fc2_jc) rounded to float16 (0 for c = t), and the
//   fc terms with |fc2_t - fc2_c| in place of version 1's |fc2_c| + |fc2_t|. Phase B: per slab of 64
//   features H = fc1 . operand on wgmma.m64n80k16 (8 images x 10 classes a warpgroup), P_c += dp |H_c|
//   in registers (no G tile in shared memory), summed over lanes, then over warps through shared
//   memory once. Certified as version 1 with P_c + E_c (H's rounding) for P_c + E_t + E_c.
//   2 x FEAT x HIDDEN x (2 + CLASSES) float16 tensor FLOPs an image, phase A's half on zero rows.
// certify_kernel3 (sm_90a only): the same bound in two stages, the second only where the first
//   fails. Block 256 threads, 32 images, grid ceil(n / 32), two blocks an SM (90 KB shared, at most
//   128 registers). Phase A as version 1 (rows 0-31 dp, 32-63 |p|: no zero rows), k-tiles of 32
//   features in 4 stages, 2 ahead, with the tensor cores' groups left in flight (no drain a tile: the
//   A fragments in two register sets); z staged with the first tile; the per-image terms as version
//   2 (8 threads an image). An image whose margin for some class cannot exceed even stage two's rest
//   (P_c >= 0), or with a non-finite score, is left uncertified at once. Stage one, per class c:
//   |H_c| <= |fc1| slope |dw_c|, so P_c <= A_c = sum slope |dw_c| q: certified where s_t - s_c
//   exceeds A_c + T_c + FR2 (R_t + R_c).
//   A class that fails is a pair (image, c): its column slope (fc2_t - fc2_c) as float16 (HIDDEN
//   halves) and its margin and rest (E_c + T_c + FR2 (R_t + R_c)) appended to a list (*npairs counts
//   them; ok stays 1 for pair_kernel1 to clear).
//   2 x FEAT x HIDDEN x 2 float16 tensor FLOPs an image (dp and |p| rows).

#include "certify.cu"

#if !defined(SHARED_V1) || !defined(SHARED_V2) || !defined(SHARED_V3) || CERTIFY_VERSION != 4
#error "certify_early needs -DSHARED_V1 .. V3 and certify.cu's -D options for version 4 (certify_early.py)"
#endif

// Versions 1-3: z is fc1's float32-accurate sum (fc_kernel6 or 5), r1 = FR1 (2 m + q) covers both paths'.
__device__ __forceinline__ Unit unit_terms(float qsum, float msum, float z) {
    const float q = __fmul_ru(qsum, c_fc_bound[QS]), m = __fmul_ru(msum, c_fc_bound[MS]);
    return unit_from(q, __fmul_ru(c_fc_bound[FR1], __fmaf_ru(2.0f, m, q)), z);
}

// The per-image fc terms of one image, each summed over the PARTS adjacent lanes that share it
// (rounded up); the first of them stores E_c (the fc product's own rounding, weighted by dp:
// docs/certified.md), T_c and R_c.
template <int PARTS>
__device__ __forceinline__ void store_fc_terms(float (&Ac)[CLASSES], float (&Bc)[CLASSES], float (&Tc)[CLASSES],
                                               float (&Rc)[CLASSES], float qact, bool first, float d, float* E, float* T,
                                               float* R) {
    sum_lanes<PARTS>(Ac, Bc, Tc, Rc, qact);
    if (first)
#pragma unroll
        for (int c = 0; c < CLASSES; ++c) {
            const float eta = __fmaf_ru(c_fc_bound[KAPPA], __fmaf_ru(d, Bc[c], qact), __fmul_ru(c_fc_bound[ETA2H], d));
            E[c] = __fmaf_ru(c_fc_bound[ALPHA2], Ac[c], eta);
            T[c] = Tc[c];
            R[c] = Rc[c];
        }
}

namespace v1 {  // version 1's tiles and shared-memory layout (floats)
constexpr int IMGS = 32;
static_assert(HIDDEN == 128 && CLASSES == 10 && FEAT % 64 == 0, "certify v1: 128 hidden units, 10 classes, features in 64s");
constexpr int KT = 64;                     // phase A's k-tile (features); phase B's slab (feature rows)
constexpr int A_ROW = KT + 8;              // staged A rows: float2 fragment loads conflict-free
constexpr int A_FLOATS = 64 * A_ROW;       // [dp; |p|] k-tile, float32
constexpr int B_FLOATS = KT * HIDDEN / 2;  // |fc1|_up k-tile, halves
constexpr int NCOL = 16 * CLASSES;         // phase B columns per warpgroup
constexpr int G_ROW = NCOL + 8;            // G tile row stride (floats): float2 stores conflict-free
constexpr int BM_FLOATS = HIDDEN * NCOL / 2;   // a warpgroup's diag(slope) . fc2, halves
constexpr int W1_FLOATS = KT * HIDDEN / 2;     // an fc1 slab, halves
constexpr int DP_FLOATS = IMGS * KT;           // the slab's dp of the block's images
// Shared memory (floats): region 1 = phase A's two stages, then Q; phase B's two G tiles.
constexpr int R1 = 2 * 64 * G_ROW > 2 * (A_FLOATS + B_FLOATS) ? 2 * 64 * G_ROW : 2 * (A_FLOATS + B_FLOATS);
constexpr int R2 = 2 * BM_FLOATS;              // both warpgroups' B operands
constexpr int R3 = 2 * (W1_FLOATS + DP_FLOATS);  // phase B's two stages
constexpr int Q_ROW = HIDDEN + 4;
static_assert(64 * Q_ROW <= R1, "certify: Q fits region 1");
constexpr int SMALL = IMGS * (3 * CLASSES + 2);  // per image: E, T, R per class, D, label
static_assert((R1 + R2 + R3 + SMALL) * 4 <= 227 * 1024, "certify: shared memory (launch.Certify.shared)");
static_assert(R1 + R2 + R3 + SMALL <= SHARED_V1, "certify v1: the shared memory launch.Certify.shared gives it");
}  // namespace v1

extern "C" __global__ void __launch_bounds__(CERT_THREADS, 1)
certify_kernel1(const float* __restrict__ feat, const float* __restrict__ dp, const float* __restrict__ z,
                const float* __restrict__ scores, const int* __restrict__ labels, const float4* __restrict__ w1abs,
                const float4* __restrict__ w1h, const float* __restrict__ w2, int* __restrict__ ok, int n) {
    using namespace v1;
    extern __shared__ float4 smem4[];
    float* r1 = reinterpret_cast<float*>(smem4);
    float* r2 = r1 + R1;
    float* r3 = r2 + R2;
    float* small = r3 + R3;
    float* E = small;                      // [img][c]
    float* T = E + IMGS * CLASSES;
    float* R = T + IMGS * CLASSES;
    float* D = R + IMGS * CLASSES;         // sum of dp
    int* top = reinterpret_cast<int*>(D + IMGS);
    const int t = threadIdx.x, warp = t / 32;
    const int wg = warp / 4, w = warp % 4, tw = t % 128;
    const int img0 = blockIdx.x * IMGS, imgs = min(IMGS, n - img0);

    if (t < IMGS) top[t] = t < imgs ? labels[img0 + t] : 0;

    // Phase A. Rows 0-31: dp of image r (times 2^S), rows 32-63: |p| of image r - 32.
    auto fetch_a = [&](int tile) {
        float* as = r1 + (tile % 2) * (A_FLOATS + B_FLOATS);
        float* bs = as + A_FLOATS;
        const int f0 = tile * KT;
        for (int e = t; e < 64 * KT / 4; e += CERT_THREADS) {
            const int row = e / (KT / 4), col = 4 * (e % (KT / 4)), img = row % 32;
            const float* src = (row < 32 ? dp : feat) + (size_t)(img0 + min(img, imgs - 1)) * FEAT + f0 + col;
            cp_async16(as + row * A_ROW + col, src, img < imgs);
        }
        const float4* src = w1abs + (size_t)tile * (B_FLOATS / 4);
        for (int e = t; e < B_FLOATS / 4; e += CERT_THREADS) cp_async16(reinterpret_cast<float4*>(bs) + e, src + e, true);
        cp_async_commit();
    };
    float qa[32];
    float dsum[2] = {};  // warps 0-1: sum dp of rows (images) 16 w + g, + 8, over this thread's k, rounded up
    fetch_a(0);
    for (int tile = 0; tile < FEAT / KT; ++tile) {
        cp_async_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();  // this tile landed; every MMA on the other stage has completed
        if (tile + 1 < FEAT / KT) fetch_a(tile + 1);
        const float* as = r1 + (tile % 2) * (A_FLOATS + B_FLOATS);
        const float* bs = as + A_FLOATS;
        const float scale = w < 2 ? c_fc_bound[DSCALE] : 1.0f;  // warps 0-1: dp rows, 2-3: |p| rows
        unsigned av[KT / 16][4];
        phase_a_fragments<KT / 16, A_ROW>(av, as, scale, w < 2, dsum);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < KT / 16; ++ks)  // this warpgroup's 64 hidden units: column groups 8 wg on
            wgmma16(qa, av[ks], wgmma_desc(bs + ks * (HIDDEN * 16 / 2) + wg * 8 * 64), tile > 0 || ks > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        wgmma_drain();
    }
    if (wg == 0 && w < 2) store_dp_sums(dsum, D);
    __syncthreads();  // the stages are dead: Q takes their place
    float* Q = r1;
    store_tile(Q + 64 * wg, Q_ROW, qa);
    __syncthreads();

    // Per image (8 threads, 16 hidden units each): e1, the ReLU pattern, phase B's operand slope_j
    // w2_jc rounded to float16 and the fc terms (b = slope |w2_c|): A_c = sum b q, B_c = sum b, Qa = sum
    // q where slope > 0, T_c = sum |w2_t - w2_c| (active r1, unstable q/2 + r1), R_c = sum (2h + e1
    // unless stable and off) |w2_c|.
    {
        const int i = t / 8, part = t % 8, tc = top[i];
        __half* bm = reinterpret_cast<__half*>(r2) + (i / 16) * 2 * BM_FLOATS;  // halves
        float Ac[CLASSES] = {}, Bc[CLASSES] = {}, Tc[CLASSES] = {}, Rc[CLASSES] = {}, qact = 0.0f;
        for (int jj = 0; jj < 16; ++jj) {
            const int j = part + 8 * jj;  // the 8 threads of an image: adjacent units, adjacent B halves
            const Unit u = unit_terms(Q[i * Q_ROW + j], Q[(32 + i) * Q_ROW + j], i < imgs ? z[(size_t)(img0 + i) * HIDDEN + j] : 0.0f);
            const float q = u.q, coef_t = u.coef_t, coef_r = u.coef_r, slope = u.slope, wt = w2[j * CLASSES + tc];
            if (slope > 0.0f) qact = __fadd_ru(qact, q);
#pragma unroll
            for (int c = 0; c < CLASSES; ++c) {
                const float wc = w2[j * CLASSES + c], aw = fabsf(wc);
                if (slope > 0.0f) {
                    const float b = __fmul_ru(slope, aw);
                    Ac[c] = __fmaf_ru(b, q, Ac[c]);
                    Bc[c] = __fadd_ru(Bc[c], b);
                }
                Tc[c] = __fmaf_ru(absdiff_ru(wt, wc), coef_t, Tc[c]);
                Rc[c] = __fmaf_ru(coef_r, aw, Rc[c]);
                // B operand of this image's column 10 (i % 16) + c, k = j: K-major core matrices
                // (k16 step, 8-column group, half of k, column % 8, k % 8).
                const int col = CLASSES * (i % 16) + c, kk = j % 16;
                bm[(((j / 16) * (NCOL / 8) + col / 8) * 2 + kk / 8) * 64 + (col % 8) * 8 + kk % 8] =
                    __float2half_rn(slope * wc);
            }
        }
        store_fc_terms<8>(Ac, Bc, Tc, Rc, qact, part == 0, D[i], E + i * CLASSES, T + i * CLASSES, R + i * CLASSES);
    }

    // Phase B: fc1 slabs of 64 feature rows (and the slab's dp) staged by cp.async.
    auto fetch_b = [&](int slab) {
        float* ws = r3 + (slab % 2) * (W1_FLOATS + DP_FLOATS);
        const float4* src = w1h + (size_t)slab * (W1_FLOATS / 4);
        for (int e = t; e < W1_FLOATS / 4; e += CERT_THREADS) cp_async16(reinterpret_cast<float4*>(ws) + e, src + e, true);
        float* ds = ws + W1_FLOATS;
        for (int e = t; e < DP_FLOATS / 4; e += CERT_THREADS) {
            const int img = e / (KT / 4), col = 4 * (e % (KT / 4));
            cp_async16(ds + img * KT + col, dp + (size_t)(img0 + min(img, imgs - 1)) * FEAT + slab * KT + col, img < imgs);
        }
        cp_async_commit();
    };
    float P[CLASSES] = {};
    const int il = tw / 8, part = tw % 8, i = 16 * wg + il;  // this thread's image (of its warpgroup's 16), rows part + 8r
    const int tc = top[i];
    float* G = r1 + wg * 64 * G_ROW;
    const float* bm = r2 + wg * BM_FLOATS;
    asm volatile("fence.proxy.async.shared::cta;");  // the B operands, written above, read by the tensor cores
    __syncthreads();
    fetch_b(0);
    float acc[80];
    for (int slab = 0; slab < FEAT / KT; ++slab) {
        cp_async_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();  // this slab landed; the other stage's MMAs and every G tile read are done
        if (slab + 1 < FEAT / KT) fetch_b(slab + 1);
        const float* ws = r3 + (slab % 2) * (W1_FLOATS + DP_FLOATS);
        fc1_slab_product(acc, ws, bm);
        store_tile(G, G_ROW, acc);
        asm volatile("bar.sync %0, 128;" :: "r"(1 + wg));  // this warpgroup's G tile is whole
        const float* ds = ws + W1_FLOATS + i * KT;
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            const int row = part + 8 * r;
            const float* gr = G + row * G_ROW + CLASSES * il;
            const float d = ds[row], gt = gr[tc];
#pragma unroll
            for (int c = 0; c < CLASSES; ++c) P[c] = __fmaf_ru(d, absdiff_ru(gt, gr[c]), P[c]);
        }
    }
#pragma unroll
    for (int o = 1; o < 8; o *= 2)
#pragma unroll
        for (int c = 0; c < CLASSES; ++c) P[c] = __fadd_ru(P[c], __shfl_xor_sync(0xffffffffu, P[c], o));

    if (part == 0 && i < imgs) {
        const float* s = scores + (size_t)(img0 + i) * CLASSES;
        const float* Ei = E + i * CLASSES;
        const float* Ti = T + i * CLASSES;
        const float* Ri = R + i * CLASSES;
        bool sure = true;
#pragma unroll
        for (int c = 0; c < CLASSES; ++c) {
            if (c == tc) continue;
            float gap = __fadd_ru(__fadd_ru(P[c], __fadd_ru(Ei[tc], Ei[c])), Ti[c]);
            gap = __fmaf_ru(c_fc_bound[FR2], __fadd_ru(Ri[tc], Ri[c]), gap);
            sure = sure && isfinite(s[c]) && isfinite(gap) && __fsub_rd(s[tc], s[c]) > gap;
        }
        ok[img0 + i] = sure && isfinite(s[tc]);
    }
}

// Version 2's layout (floats): region 1 = phase A's two stages, then Q, then phase B's two stages;
// region 2 = both warpgroups' B operands; the per-image terms; the warps' P sums.
namespace v2 {
constexpr int IMGS = 16, KT = 64;                 // images a block; phase A's k-tile (features)
constexpr int A_ROW = KT + 8;                     // staged A rows: float2 fragment loads conflict-free
constexpr int A_FLOATS = 32 * A_ROW;              // rows 0-15: dp, 16-31: |p| (32-63 are zeros, not staged)
constexpr int B_FLOATS = KT * HIDDEN / 2;         // |fc1|_up k-tile, halves
constexpr int Q_ROW = HIDDEN + 4;
constexpr int NCOL = 8 * CLASSES;                 // phase B columns per warpgroup: 8 images x 10 classes
constexpr int BM_FLOATS = HIDDEN * NCOL / 2;      // a warpgroup's B operand, halves
constexpr int W1_FLOATS = 64 * HIDDEN / 2;        // an fc1 slab of 64 feature rows, halves
constexpr int DS_ROW = 64 + 4;                    // a slab's dp per image: images 4 banks apart
constexpr int STAGE = W1_FLOATS + IMGS * DS_ROW;
constexpr int R1 = 2 * STAGE > 2 * (A_FLOATS + B_FLOATS) ? (2 * STAGE > 32 * Q_ROW ? 2 * STAGE : 32 * Q_ROW)
                                                          : (2 * (A_FLOATS + B_FLOATS) > 32 * Q_ROW ? 2 * (A_FLOATS + B_FLOATS) : 32 * Q_ROW);
constexpr int R2 = 2 * BM_FLOATS;
constexpr int SMALL = IMGS * (3 * CLASSES + 2);   // per image: E, T, R per class, D, label
constexpr int PW = 8 * NCOL;                      // per warp, its column sums of dp |H|
static_assert(FEAT % KT == 0 && STAGE % 4 == 0 && R1 % 4 == 0, "certify v2: tiles and 16-byte stages");
static_assert((R1 + R2 + SMALL + PW) * 4 <= 113 * 1024, "certify v2: two blocks an SM (launch.Certify.shared)");
static_assert(R1 + R2 + SMALL + PW <= SHARED_V2, "certify v2: the shared memory launch.Certify.shared gives it");
}  // namespace v2

extern "C" __global__ void __launch_bounds__(CERT_THREADS, 2)
certify_kernel2(const float* __restrict__ feat, const float* __restrict__ dp, const float* __restrict__ z,
                const float* __restrict__ scores, const int* __restrict__ labels, const float4* __restrict__ w1abs,
                const float4* __restrict__ w1h, const float* __restrict__ w2, int* __restrict__ ok, int n) {
    using namespace v2;
    extern __shared__ float4 smem4[];
    float* r1 = reinterpret_cast<float*>(smem4);
    float* r2 = r1 + R1;
    float* E = r2 + R2;                    // [img][c]: H's own rounding, weighted by dp
    float* T = E + IMGS * CLASSES;
    float* R = T + IMGS * CLASSES;
    float* D = R + IMGS * CLASSES;         // sum of dp
    int* top = reinterpret_cast<int*>(D + IMGS);
    float* pw = reinterpret_cast<float*>(top + IMGS);  // [warp of the block][column]
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane >> 2;
    const int wg = warp / 4, w = warp % 4;
    const int img0 = blockIdx.x * IMGS, imgs = min(IMGS, n - img0);
    if (t < IMGS) top[t] = t < imgs ? labels[img0 + t] : 0;

    // Phase A. Rows 0-15: dp of image r (times 2^S), 16-31: |p| of image r - 16; warps 2-3 feed zeros.
    auto fetch_a = [&](int tile) {
        float* as = r1 + (tile % 2) * (A_FLOATS + B_FLOATS);
        for (int e = t; e < 32 * KT / 4; e += CERT_THREADS) {
            const int row = e / (KT / 4), col = 4 * (e % (KT / 4)), img = row % IMGS;
            cp_async16(as + row * A_ROW + col, (row < IMGS ? dp : feat) + (size_t)(img0 + min(img, imgs - 1)) * FEAT + tile * KT + col,
                       img < imgs);
        }
        const float4* src = w1abs + (size_t)tile * (B_FLOATS / 4);
        for (int e = t; e < B_FLOATS / 4; e += CERT_THREADS)
            cp_async16(reinterpret_cast<float4*>(as + A_FLOATS) + e, src + e, true);
        cp_async_commit();
    };
    float qa[32];
    float dsum[2] = {};  // warp 0: sum dp of images g, g + 8 over this thread's k, rounded up
    fetch_a(0);
    for (int tile = 0; tile < FEAT / KT; ++tile) {
        cp_async_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();  // this tile landed; every MMA on the other stage has completed
        if (tile + 1 < FEAT / KT) fetch_a(tile + 1);
        const float* as = r1 + (tile % 2) * (A_FLOATS + B_FLOATS);
        const float scale = w == 0 ? c_fc_bound[DSCALE] : 1.0f;
        unsigned av[KT / 16][4] = {};  // warps 2-3: the zero rows
        if (w < 2) phase_a_fragments<KT / 16, A_ROW>(av, as, scale, w == 0, dsum);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < KT / 16; ++ks)  // this warpgroup's 64 hidden units: column groups 8 wg on
            wgmma16(qa, av[ks], wgmma_desc(as + A_FLOATS + ks * (HIDDEN * 16 / 2) + wg * 8 * 64), tile > 0 || ks > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        wgmma_drain();
    }
    if (wg == 0 && w == 0) store_dp_sums(dsum, D);
    __syncthreads();  // the stages are dead: Q takes their place
    float* Q = r1;
    if (w < 2) store_tile(Q + 64 * wg, Q_ROW, qa);
    __syncthreads();

    // Per image (16 threads, 8 hidden units each): e1, the ReLU pattern, phase B's operand
    // slope_j (fc2_jt - fc2_jc) (zero for c = t) and the fc terms with dw = |fc2_t - fc2_c| (b = slope
    // dw): A_c = sum b q, B_c = sum b, Qa = sum q where slope > 0, T_c = sum dw (active r1, unstable
    // q/2 + r1), R_c = sum (2h + e1 unless stable and off) |fc2_c|.
    {
        const int i = t / 16, part = t % 16, tc = top[i];
        __half* bm = reinterpret_cast<__half*>(r2) + (i / 8) * 2 * BM_FLOATS;  // halves
        float Ac[CLASSES] = {}, Bc[CLASSES] = {}, Tc[CLASSES] = {}, Rc[CLASSES] = {}, qact = 0.0f;
        for (int jj = 0; jj < HIDDEN / 16; ++jj) {
            const int j = part + 16 * jj;  // the 16 threads of an image: adjacent units, adjacent B halves
            const Unit u = unit_terms(Q[i * Q_ROW + j], Q[(IMGS + i) * Q_ROW + j], i < imgs ? z[(size_t)(img0 + i) * HIDDEN + j] : 0.0f);
            const float wt = w2[j * CLASSES + tc];
            if (u.slope > 0.0f) qact = __fadd_ru(qact, u.q);
            add_class_terms(u, wt, w2 + j * CLASSES, Ac, Bc, Tc, Rc);
#pragma unroll
            for (int c = 0; c < CLASSES; ++c) {
                // B operand of this image's column 10 (i % 8) + c, k = j: K-major core matrices
                // (k16 step, 8-column group, half of k, column % 8, k % 8).
                const int col = CLASSES * (i % 8) + c, kk = j % 16;
                bm[(((j / 16) * (NCOL / 8) + col / 8) * 2 + kk / 8) * 64 + (col % 8) * 8 + kk % 8] =
                    __float2half_rn(u.slope * (wt - w2[j * CLASSES + c]));
            }
        }
        store_fc_terms<16>(Ac, Bc, Tc, Rc, qact, part == 0, D[i], E + i * CLASSES, T + i * CLASSES, R + i * CLASSES);
    }

    // Phase B: fc1 slabs of 64 feature rows (and the slab's dp) staged by cp.async where Q was.
    auto fetch_b = [&](int slab) {
        float* ws = r1 + (slab % 2) * STAGE;
        const float4* src = w1h + (size_t)slab * (W1_FLOATS / 4);
        for (int e = t; e < W1_FLOATS / 4; e += CERT_THREADS) cp_async16(reinterpret_cast<float4*>(ws) + e, src + e, true);
        const int img = t / 16, col = 4 * (t % 16);  // 16 images x 16 copies
        cp_async16(ws + W1_FLOATS + img * DS_ROW + col, dp + (size_t)(img0 + min(img, imgs - 1)) * FEAT + slab * 64 + col, img < imgs);
        cp_async_commit();
    };
    asm volatile("fence.proxy.async.shared::cta;");  // the B operands, written above, read by the tensor cores
    __syncthreads();  // and Q is dead
    fetch_b(0);
    const float* bm = r2 + wg * BM_FLOATS;
    float acc[40], P[20] = {};  // P[2 cg + e]: column 8 cg + 2 tig + e of this warpgroup, this thread's rows
    for (int slab = 0; slab < FEAT / 64; ++slab) {
        cp_async_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();  // this slab landed; the other stage's MMAs are done
        if (slab + 1 < FEAT / 64) fetch_b(slab + 1);
        const float* ws = r1 + (slab % 2) * STAGE;
        fc1_slab_product(acc, ws, bm);
        const float* ds = ws + W1_FLOATS + 16 * w + g;
        add_dp_abs<NCOL / 8>(P, acc, [&](int col) { return ds + (8 * wg + col / CLASSES) * DS_ROW; });
    }
    store_warp_sums<NCOL / 8>(P, pw);
    __syncthreads();

    if (t < imgs) {
        const int i = t, tc = top[i], base = (i / 8) * 4 * NCOL + CLASSES * (i % 8);
        const float* s = scores + (size_t)(img0 + i) * CLASSES;
        bool sure = true;
#pragma unroll
        for (int c = 0; c < CLASSES; ++c) {
            if (c == tc) continue;
            float pc = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; ++k) pc = __fadd_ru(pc, pw[base + k * NCOL + c]);
            float gap = __fadd_ru(__fadd_ru(pc, E[i * CLASSES + c]), T[i * CLASSES + c]);
            gap = __fmaf_ru(c_fc_bound[FR2], __fadd_ru(R[i * CLASSES + tc], R[i * CLASSES + c]), gap);
            sure = sure && isfinite(s[c]) && isfinite(gap) && __fsub_rd(s[tc], s[c]) > gap;
        }
        ok[img0 + i] = sure && isfinite(s[tc]);
    }
}

// Version 3's layout (floats): phase A's four stages, then Q and the slopes where they were; per image
// its z, D and the label.
namespace v3 {
constexpr int IMGS = 32, KT = 32, NSTAGES = 4;  // images a block; phase A's k-tile (features) and its stages
constexpr int A_ROW = KT + 8;                    // staged A rows: float2 fragment loads conflict-free
constexpr int A_FLOATS = 64 * A_ROW;             // rows 0-31: dp, 32-63: |p|
constexpr int B_FLOATS = KT * HIDDEN / 2;        // |fc1|_up k-tile, halves
constexpr int STAGE = A_FLOATS + B_FLOATS;
constexpr int Q_ROW = HIDDEN + 4;
constexpr int QS_FLOATS = 64 * Q_ROW + IMGS * HIDDEN;  // Q, then each image's ReLU slopes
constexpr int R1 = NSTAGES * STAGE > QS_FLOATS ? NSTAGES * STAGE : QS_FLOATS;
constexpr int UNITS = HIDDEN / 8;                // hidden units of each of an image's 8 threads
static_assert(FEAT % (2 * KT) == 0 && STAGE % 4 == 0 && HIDDEN % 8 == 0, "certify v3: k-tiles in pairs, 16-byte stages");
static_assert((R1 + IMGS * HIDDEN + 2 * IMGS) * 4 <= 113 * 1024, "certify v3: two blocks an SM (launch.Certify.shared)");
static_assert(R1 + IMGS * HIDDEN + 2 * IMGS <= SHARED_V3, "certify v3: the shared memory launch.Certify.shared gives it");
}  // namespace v3

extern "C" __global__ void __launch_bounds__(CERT_THREADS, 2)
certify_kernel3(const float* __restrict__ feat, const float* __restrict__ dp, const float* __restrict__ z,
                const float* __restrict__ scores, const int* __restrict__ labels, const float4* __restrict__ w1abs,
                const float* __restrict__ w2, int* __restrict__ ok, float4* __restrict__ pairs, __half* __restrict__ columns,
                int* __restrict__ npairs, int n) {
    using namespace v3;
    extern __shared__ float4 smem4[];
    float* r1 = reinterpret_cast<float*>(smem4);
    float* Z = r1 + R1;  // fc1's sums before ReLU, [img][HIDDEN]
    float* D = Z + IMGS * HIDDEN;  // sum of dp
    int* top = reinterpret_cast<int*>(D + IMGS);
    const int t = threadIdx.x, warp = t / 32;
    const int wg = warp / 4, w = warp % 4;
    const int img0 = blockIdx.x * IMGS, imgs = min(IMGS, n - img0);
    if (t < IMGS) top[t] = t < imgs ? labels[img0 + t] : 0;
    for (int e = t; e < IMGS * HIDDEN / 4; e += CERT_THREADS) {  // with the first k-tile's copies
        const int i = e / (HIDDEN / 4);
        cp_async16(Z + 4 * e, z + (size_t)(img0 + min(i, imgs - 1)) * HIDDEN + 4 * (e % (HIDDEN / 4)), i < imgs);
    }

    // Phase A. Rows 0-31: dp of image r (times 2^S), 32-63: |p| of image r - 32. Each thread copies
    // one 16-byte piece of a dp row and the same piece of its image's |p| row, and two of |fc1|'s.
    static_assert(IMGS * KT / 4 == CERT_THREADS && B_FLOATS == 8 * CERT_THREADS, "certify v3: two copies a thread each");
    const PhaseARows<IMGS, KT, A_ROW> rows(dp, feat, r1, img0, imgs);
    const float4* b_src = w1abs + t;
    auto fetch_a = [&](int tile) {
        rows.fetch(tile, (tile % NSTAGES) * STAGE);
        float4* bs = reinterpret_cast<float4*>(r1 + (tile % NSTAGES) * STAGE + A_FLOATS) + t;
        cp_async16(bs, b_src + tile * (B_FLOATS / 4), true);
        cp_async16(bs + CERT_THREADS, b_src + tile * (B_FLOATS / 4) + CERT_THREADS, true);
    };
    constexpr int TILES = FEAT / KT;
    float qa[32];
    float dsum[2] = {};  // warps 0-1 of warpgroup 0: sum dp of rows (images) 16 w + g, + 8, over this thread's k, rounded up
    const float scale = w < 2 ? c_fc_bound[DSCALE] : 1.0f;  // warps 0-1: dp rows, 2-3: |p| rows
    phase_a_tiles<TILES, KT / 16>(fetch_a, [&](int tile, unsigned (&a)[KT / 16][4]) {
        const float* as = r1 + (tile % NSTAGES) * STAGE;
        phase_a_fragments<KT / 16, A_ROW>(a, as, scale, wg == 0 && w < 2, dsum);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < KT / 16; ++ks)  // this warpgroup's 64 hidden units: column groups 8 wg on
            wgmma16(qa, a[ks], wgmma_desc(as + A_FLOATS + ks * (HIDDEN * 16 / 2) + wg * 8 * 64), tile > 0 || ks > 0);
    });
    if (wg == 0 && w < 2) store_dp_sums(dsum, D);
    cp_async_wait<0>();
    __syncthreads();  // the stages are dead: Q takes their place
    float* Q = r1;
    store_tile(Q + 64 * wg, Q_ROW, qa);
    __syncthreads();

    // Per image (8 threads, 16 hidden units each) the terms of version 2, summed over the 8 threads
    // in a butterfly (commutative additions: every thread ends with the same sums).
    const int i = t / 8, part = t % 8, tc = top[i];
    float* slopes = Q + 64 * Q_ROW + i * HIDDEN;  // this image's, for its pairs' columns
    float Ac[CLASSES] = {}, Bc[CLASSES] = {}, Tc[CLASSES] = {}, Rc[CLASSES] = {}, qact = 0.0f;
    for (int jj = 0; jj < UNITS; ++jj) {
        const int j = part + 8 * jj;
        const Unit u = unit_terms(Q[i * Q_ROW + j], Q[(IMGS + i) * Q_ROW + j], Z[i * HIDDEN + j]);
        slopes[j] = u.slope;
        if (u.slope > 0.0f) qact = __fadd_ru(qact, u.q);
        add_class_terms(u, w2[j * CLASSES + tc], w2 + j * CLASSES, Ac, Bc, Tc, Rc);
    }
    sum_lanes<8>(Ac, Bc, Tc, Rc, qact);

    const float* sp = scores + (size_t)(img0 + min(i, imgs - 1)) * CLASSES;
    stage_one(i, part, img0, imgs, tc, [&](int c) { return sp[c]; }, D[i], Ac, Bc, Tc, Rc, qact, slopes, w2, ok, pairs,
              columns, npairs);
}
