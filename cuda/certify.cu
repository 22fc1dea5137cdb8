// The certificate of the low-precision pass (docs/certified.md) and the recomputation of the images
// it leaves out. in: per image the float16 pass's features p and their bounds dp (n, FEAT) (float32
// from fused_kernel4 or 6, or float16 from fused_kernel6 with FEAT_HALVES); fc2 (HIDDEN, CLASSES)
// float32; |fc1| rounded up and fc1 rounded to nearest, float16, laid out by the host as wgmma
// operands; c_fc_bound the bound's constants. out: the float16 pass's scores (n, CLASSES) and labels
// (n), ok (n): 1 where the image's label is proven the exact path's. Earlier versions (1-3, which read
// fc1's sums from the fc kernel) live in dev/cuda/certify_early.cu.
// certify_kernel4 (sm_90a only): block 256 threads = 2 warpgroups, 32 images, grid ceil(n / 32), two
//   blocks an SM (at most 128 registers). Phase A: rows 0-31 dp * 2^S (rounded up to float16), rows
//   32-63 fl16(p) (rounded to nearest: p is not negative), times |fc1|_up and times fc1 rounded to
//   nearest on wgmma.m64n64k16 (two products a warpgroup, each per 64 hidden units), k-tiles of 32
//   features in 4 cp.async stages, 2 ahead, with the tensor cores' groups left in flight (no drain a
//   tile: the A fragments in two register sets). Per hidden unit j: q_j = dp . |fc1|, m_j from fl16(p)
//   . |fc1|, z_j (fc1's sum of float16 products, float32 sums: rows 32-63 of the second product), the
//   bound e1_j = q_j + r1_j on z's difference from the exact path's (unit_terms_half), stable = |z_j| >
//   e1_j, active = stable and z_j > 0, ReLU's slope between the paths (1 active, 0 stable and off,
//   1/2 +- 1/2 unstable). Then per image (8 threads, a butterfly) relu(z) . fc2 in float32, the first
//   maximum t, and per class c the fc terms. An image with a non-finite score, or whose margin for some
//   class cannot exceed even stage two's rest (P_c >= 0), is left uncertified at once. Stage one, per
//   class c: |H_c| <= |fc1| slope |dw_c|, so P_c <= A_c = sum slope |dw_c| q: certified where s_t - s_c
//   exceeds A_c + T_c + FR2 (R_t + R_c). A class that fails is a pair (image, c): its column slope
//   (fc2_t - fc2_c) as float16 (HIDDEN halves) and its margin and rest (E_c + T_c + FR2 (R_t + R_c))
//   appended to a list (*npairs counts them; ok stays 1 for the pair kernel to clear).
//   2 x FEAT x HIDDEN x 3 float16 tensor FLOPs an image (the third on the dp rows, unused).
// certify_kernel5 (sm_90a only): version 4 on fused_kernel6's float16 outputs (FEAT_HALVES): the features
//   rounded to nearest and dp times 2^S rounded up, phase A's very operands (the same q, m and z bits),
//   so half the bytes read (a 16-byte copy a thread a k-tile) and no conversion; sum dp <= 2^-S times
//   the sum of the float16 values, sum p <= (sum fl16(p) + FEAT eta) (1 + 2^-10) (docs/certified.md).
// pair_kernel1 (sm_90a only): stage two on the listed pairs: block 256 threads, 32 pairs a round, grid
//   strides over *npairs' rounds; H = fc1 . columns (FEAT x 32) on wgmma.m64n32k16 (each warpgroup
//   every other 64-feature slab, A and B from shared memory), P = sum_i dp_i |H_i| per pair; a pair
//   whose margin does not exceed P + rest clears its image's ok. 2 x FEAT x HIDDEN float16 tensor
//   FLOPs a pair. pair_kernel2: the same on float16 dp times 2^S (certify_kernel5's), P times 2^-S.
// compact_kernel1: one block of 1024 threads: the images with ok = 0 in order into idx, their number
//   into *count and added to *total (the run's recomputed images), *fb_overflow = INT_MAX (for the
//   recomputation's fc kernel).
// scatter_kernel1: the recomputed labels (and scores, where asked) back to the listed images; the
//   recomputation's first image with non-finite scores min'ed into *overflow by its own index.

#include <cuda_fp16.h>

#include <type_traits>

#include "common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

#if !defined(SHARED_V4) || !defined(SHARED_V5) || !defined(SHARED_PAIRS)
#error "certify needs -DSHARED_V4, V5 and -DSHARED_PAIRS: each kernel's shared floats (launch.Certify.defines)"
#endif
// CERTIFY_VERSION: the one certify_kernel built, with its pair kernel (a run compiles only what it
// launches: version 5 alone builds in 1.7 s)
#if !defined(CERTIFY_VERSION) || CERTIFY_VERSION < 4 || CERTIFY_VERSION > 5
#error "certify needs -DCERTIFY_VERSION=4 or 5 (launch.Certify.defines)"
#endif
#pragma nv_diag_suppress 177  // the other versions' constants go unused
#define CERT_THREADS 256

enum { QS, MS, FR1, FR2, ALPHA2, KAPPA, ETA2H, DSCALE, HR, ETA1, E1C, MS4, ETAW, NCONST };
__constant__ float c_fc_bound[NCONST];

__device__ __forceinline__ unsigned half2_up(float a, float b) {
    const __half2 h = __halves2half2(__float2half_ru(a), __float2half_ru(b));
    return *reinterpret_cast<const unsigned*>(&h);
}

__device__ __forceinline__ unsigned half2_rn(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&h);
}

// |a - b| rounded up.
__device__ __forceinline__ float absdiff_ru(float a, float b) { return a >= b ? __fsub_ru(a, b) : __fsub_ru(b, a); }

// Hidden unit j of an image: from its phase A sums (q: dp . |fc1|, m: |p| . |fc1|, unscaled) and fc1's
// sum before ReLU z, the bound e1 = q + r1 on z's difference between the paths, whether the unit is
// stable (both paths on one side of 0), ReLU's slope between the paths (1 active, 0 stable and off,
// unstable somewhere in [0, 1]: 1/2 in the product, the other 1/2 of q in T_c), and its coefficients in
// T_c (coef_t) and R_c (coef_r), all rounded up (docs/certified.md, steps 3-5).
struct Unit {
    float q, coef_t, coef_r, slope;
};

__device__ __forceinline__ Unit unit_from(float q, float rr, float z) {
    const float e1 = __fadd_ru(q, rr);
    const bool stable = fabsf(z) > e1, active = stable && z > 0.0f;
    return {q, active ? rr : (stable ? 0.0f : __fmaf_ru(0.5f, q, rr)), __fadd_ru(2.0f * relu(z), stable && !active ? 0.0f : e1),
            active ? 1.0f : (stable ? 0.0f : 0.5f)};
}

// Version 4: z is fc1's sum of float16 products (fl16(p) fl16(fc1), float32 sums), msum's from the same
// fl16(p), psum = sum p: r1 = FR1 (m + q) (the exact path's sums) + HR m + ETA1 psum + E1C (the float16
// sums', docs/certified.md), with m = MS4 msum + ETAW.
__device__ __forceinline__ Unit unit_terms_half(float qsum, float msum, float z, float psum) {
    const float q = __fmul_ru(qsum, c_fc_bound[QS]), m = __fmaf_ru(msum, c_fc_bound[MS4], c_fc_bound[ETAW]);
    const float half = __fmaf_ru(c_fc_bound[HR], m, __fmaf_ru(c_fc_bound[ETA1], psum, c_fc_bound[E1C]));
    return unit_from(q, __fmaf_ru(c_fc_bound[FR1], __fadd_ru(m, q), half), z);
}

// The fc terms of hidden unit u for every class c, with dw = |fc2_t - fc2_c| rounded
// up and b = slope dw: A_c += b q and B_c += b where the slope is not 0, T_c += dw coef_t, R_c +=
// coef_r |fc2_c| (w2j: fc2's row j, wt = fc2_jt).
__device__ __forceinline__ void add_class_terms(const Unit& u, float wt, const float* __restrict__ w2j, float (&Ac)[CLASSES],
                                                float (&Bc)[CLASSES], float (&Tc)[CLASSES], float (&Rc)[CLASSES]) {
#pragma unroll
    for (int c = 0; c < CLASSES; ++c) {
        const float wc = w2j[c], dw = absdiff_ru(wt, wc);
        if (u.slope > 0.0f) {
            const float b = __fmul_ru(u.slope, dw);
            Ac[c] = __fmaf_ru(b, u.q, Ac[c]);
            Bc[c] = __fadd_ru(Bc[c], b);
        }
        Tc[c] = __fmaf_ru(dw, u.coef_t, Tc[c]);
        Rc[c] = __fmaf_ru(u.coef_r, fabsf(wc), Rc[c]);
    }
}

// The per-image terms summed over the PARTS adjacent lanes that share an image, rounded up, in a
// butterfly: the additions commute, so every lane ends with the same sums.
template <int PARTS>
__device__ __forceinline__ void sum_lanes(float (&Ac)[CLASSES], float (&Bc)[CLASSES], float (&Tc)[CLASSES], float (&Rc)[CLASSES],
                                          float& qact) {
#pragma unroll
    for (int o = 1; o < PARTS; o *= 2) {
        qact = __fadd_ru(qact, __shfl_xor_sync(0xffffffffu, qact, o));
#pragma unroll
        for (int c = 0; c < CLASSES; ++c) {
            Ac[c] = __fadd_ru(Ac[c], __shfl_xor_sync(0xffffffffu, Ac[c], o));
            Bc[c] = __fadd_ru(Bc[c], __shfl_xor_sync(0xffffffffu, Bc[c], o));
            Tc[c] = __fadd_ru(Tc[c], __shfl_xor_sync(0xffffffffu, Tc[c], o));
            Rc[c] = __fadd_ru(Rc[c], __shfl_xor_sync(0xffffffffu, Rc[c], o));
        }
    }
}

// Phase A's A fragments of a staged k-tile (rows ROW floats apart), this thread's rows 16 w + g and
// + 8 (w: its warp in the warpgroup): |value| * scale as float16 pairs rounded up, or where nearest the
// values rounded to nearest (version 4's p: not negative); where sum_dp the values (dp, or version 4's
// p) are also added into dsum, rounded up.
template <int KS, int ROW>
__device__ __forceinline__ void phase_a_fragments(unsigned (&a)[KS][4], const float* as, float scale, bool sum_dp,
                                                  float (&dsum)[2], bool nearest = false) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32 % 4, g = lane / 4, tig = lane % 4;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float2 v = *reinterpret_cast<const float2*>(as + (16 * w + g + 8 * (r % 2)) * ROW + 16 * ks + 2 * tig + 8 * (r / 2));
            a[ks][r] = nearest ? half2_rn(v.x, v.y) : half2_up(fabsf(v.x) * scale, fabsf(v.y) * scale);
            if (sum_dp) dsum[r % 2] = __fadd_ru(dsum[r % 2], __fadd_ru(v.x, v.y));
        }
}

// acc = a 64-feature fc1 slab (ws: the A operand, 64 x HIDDEN halves) . b (HIDDEN x 2 NACC halves),
// both read by the tensor cores from shared memory; returns once the warpgroup's MMAs are done.
template <int NACC>
__device__ __forceinline__ void fc1_slab_product(float (&acc)[NACC], const float* ws, const float* b) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < HIDDEN / 16; ++ks)
        wgmma16_ss(acc, wgmma_desc(ws + ks * (64 * 16 / 2)), wgmma_desc(b + ks * (NACC * 16)), ks > 0);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    wgmma_drain();
}

// Phase B's P = sum_i dp_i |H_i| over a warpgroup's m64 tile of H (accumulators acc, 8 NG columns):
// column 8 cg + 2 tig + e into P[2 cg + e], rows 16 w + g and + 8 of this thread; row(col) points at
// the column's dp for row 16 w + g (its + 8 is the other row's).
template <int NG, class Row>
__device__ __forceinline__ void add_dp_abs(float (&P)[2 * NG], const float (&acc)[4 * NG], Row row) {
    const int tig = threadIdx.x % 4;
#pragma unroll
    for (int cg = 0; cg < NG; ++cg)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const auto* d = row(8 * cg + 2 * tig + e);  // float, or pair_kernel2's __half
            P[2 * cg + e] = __fmaf_ru(static_cast<float>(d[0]), fabsf(acc[4 * cg + e]),
                                      __fmaf_ru(static_cast<float>(d[8]), fabsf(acc[4 * cg + 2 + e]), P[2 * cg + e]));
        }
}

// P summed over the warp's 16 rows (rounded up) and stored per warp: pw[warp][column].
template <int NG>
__device__ __forceinline__ void store_warp_sums(float (&P)[2 * NG], float* pw) {
    const int lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
#pragma unroll
    for (int o = 4; o < 32; o *= 2)
#pragma unroll
        for (int k = 0; k < 2 * NG; ++k) P[k] = __fadd_ru(P[k], __shfl_xor_sync(0xffffffffu, P[k], o));
    if (g == 0)
#pragma unroll
        for (int cg = 0; cg < NG; ++cg)
            *reinterpret_cast<float2*>(pw + (threadIdx.x / 32) * 8 * NG + 8 * cg + 2 * tig) = make_float2(P[2 * cg], P[2 * cg + 1]);
}

// Phase A's sums of dp, each thread's over its k for rows 16 w + g and + 8, summed over the quad of
// lanes that share the rows (rounded up) and stored: D[row].
__device__ __forceinline__ void store_dp_sums(const float (&dsum)[2], float* D) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32 % 4, g = lane / 4, tig = lane % 4;
#pragma unroll
    for (int dy = 0; dy < 2; ++dy) {
        float d = dsum[dy];
        for (int o = 1; o < 4; o *= 2) d = __fadd_ru(d, __shfl_xor_sync(0xffffffffu, d, o));
        if (tig == 0) D[16 * w + g + 8 * dy] = d;
    }
}

// Version 4's phase A rows (and dev/cuda's version 3's): thread t copies one 16-byte piece of image
// t / (KT / 4)'s dp row into stage row i and the same piece of its p row into row IMGS + i (rows
// A_ROW floats apart), a k-tile of KT features at a time; rows past the block's images are zeros.
template <int IMGS, int KT, int A_ROW>
struct PhaseARows {
    const float *dp_src, *p_src;
    float* dst;
    bool live;
    __device__ __forceinline__ PhaseARows(const float* dp, const float* feat, float* stages, int img0, int imgs) {
        const int ci = threadIdx.x / (KT / 4), cc = 4 * (threadIdx.x % (KT / 4));
        const size_t row = (size_t)(img0 + min(ci, imgs - 1)) * FEAT + cc;
        dp_src = dp + row, p_src = feat + row, dst = stages + ci * A_ROW + cc, live = ci < imgs;
    }
    __device__ __forceinline__ void fetch(int tile, int stage_offset) const {
        cp_async16(dst + stage_offset, dp_src + tile * KT, live);
        cp_async16(dst + stage_offset + IMGS * A_ROW, p_src + tile * KT, live);
    }
};

// Version 4 and 5's phase A loop over TILES k-tiles in four cp.async stages fetched two ahead:
// fetch(tile) copies a tile into its stage; mma(tile, a) converts the landed tile's A fragments into
// a and issues its MMAs. A tile's MMAs read their A fragments from registers after they are issued,
// until a wait covers them: the fragments alternate between two sets, and each set is kept live until
// the wait after the next tile's MMAs (wgmma_commit_wait_previous), so the next tile cannot be
// converted into it. Returns once every MMA is done.
template <int TILES, int KS, class Fetch, class Mma>
__device__ __forceinline__ void phase_a_tiles(Fetch fetch, Mma mma) {
    static_assert(TILES % 2 == 0, "certify: k-tiles in pairs");
    fetch(0);
    cp_async_commit();
    if (TILES > 1) fetch(1);
    cp_async_commit();
    unsigned av[2][KS][4] = {};
    auto step = [&](int tile, unsigned (&a)[KS][4], const unsigned (&done)[KS][4]) {
        cp_async_wait<1>();
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads();  // this tile landed; tile - 2's MMAs, the last to read the stage refilled now, are done
        if (tile + 2 < TILES) fetch(tile + 2);
        cp_async_commit();
        mma(tile, a);
        wgmma_commit_wait_previous(done);  // the previous tile's MMAs are done
    };
    for (int tile = 0; tile < TILES; tile += 2) {
        step(tile, av[0], av[1]);
        step(tile + 1, av[1], av[0]);
    }
    wgmma_drain();
}

// Stage one for image i (its 8 threads: part of them), top class tc, scores s(c), sum dp d and the
// per-class terms: P_c <= A_c. A class that fails it is a pair for pair_kernel1, unless its margin
// does not even exceed the rest of the gap (P_c >= 0): then the image is recomputed, nothing paired.
// ok[image] = 1 where certified so far (pair_kernel1 clears it where a pair fails).
template <class Score>
__device__ __forceinline__ void stage_one(int i, int part, int img0, int imgs, int tc, Score s, float d,
                                          const float (&Ac)[CLASSES], const float (&Bc)[CLASSES], const float (&Tc)[CLASSES],
                                          const float (&Rc)[CLASSES], float qact, const float* slopes,
                                          const float* __restrict__ w2, int* __restrict__ ok, float4* __restrict__ pairs,
                                          __half* __restrict__ columns, int* __restrict__ npairs) {
    const int lane = threadIdx.x % 32;
    bool sure = i < imgs && isfinite(s(tc));
    unsigned fail = 0;
    float margin[CLASSES], rest[CLASSES];
#pragma unroll
    for (int c = 0; c < CLASSES; ++c) {
        if (c == tc) continue;
        const float fr = __fmul_ru(c_fc_bound[FR2], __fadd_ru(Rc[tc], Rc[c]));
        const float cheap = __fadd_ru(__fadd_ru(Ac[c], Tc[c]), fr);
        // the rest of the gap: E_c (H's own rounding, weighted by dp), T_c and fc2's rounding
        const float eta = __fmaf_ru(c_fc_bound[KAPPA], __fmaf_ru(d, Bc[c], qact), __fmul_ru(c_fc_bound[ETA2H], d));
        margin[c] = __fsub_rd(s(tc), s(c));
        rest[c] = __fadd_ru(__fadd_ru(__fmaf_ru(c_fc_bound[ALPHA2], Ac[c], eta), Tc[c]), fr);
        const bool first = isfinite(cheap) && margin[c] > cheap;
        sure = sure && isfinite(s(c)) && (first || (isfinite(rest[c]) && margin[c] > rest[c]));
        if (!first) fail |= 1u << c;
    }
    if (!sure) fail = 0;
    int at = part == 0 && fail ? atomicAdd(npairs, __popc(fail)) : 0;
    at = __shfl_sync(0xffffffffu, at, lane & ~7);
    if (part == 0 && i < imgs) ok[img0 + i] = sure;
#pragma unroll
    for (int c = 0; c < CLASSES; ++c) {
        if (!(fail >> c & 1)) continue;
        if (part == 0) pairs[at] = make_float4(__int_as_float(img0 + i), margin[c], rest[c], 0.0f);
#pragma unroll
        for (int jj = 0; jj < HIDDEN / 8; ++jj) {
            const int j = part + 8 * jj;
            columns[(size_t)at * HIDDEN + j] = __float2half_rn(slopes[j] * (w2[j * CLASSES + tc] - w2[j * CLASSES + c]));
        }
        ++at;
    }
}

// Version 5's phase A rows, from float16 inputs (fused_kernel6 with FEAT_HALVES): thread t copies one
// 16-byte piece (8 features) of row t / (KT / 8), rows 0-31 image r's dp times 2^DSCALE_LOG2 (rounded
// up), 32-63 image r - 32's features (rounded to nearest): version 4's operands, made by fused_kernel6.
// A_ROW is in words (pairs of halves); rows past the block's images are zeros.
template <int IMGS, int KT, int A_ROW>
struct PhaseAHalves {
    const __half* src;
    float* dst;
    bool live;
    __device__ __forceinline__ PhaseAHalves(const __half* dp, const __half* feat, float* stages, int img0, int imgs) {
        static_assert(2 * IMGS * (KT / 8) == CERT_THREADS, "certify v5: a 16-byte copy a thread");
        const int row = threadIdx.x / (KT / 8), i = row % IMGS, piece = threadIdx.x % (KT / 8);
        src = (row < IMGS ? dp : feat) + (size_t)(img0 + min(i, imgs - 1)) * FEAT + 8 * piece;
        dst = stages + row * A_ROW + 4 * piece, live = i < imgs;
    }
    __device__ __forceinline__ void fetch(int tile, int stage_offset) const {
        cp_async16(dst + stage_offset, src + tile * KT, live);
    }
};

// Version 5's A fragments: the staged words as they are (version 4 converts its float32 rows to the
// same bits); sum: the rows' values over this thread's k (rounded up, still scaled for dp).
template <int KS, int ROW>
__device__ __forceinline__ void phase_a_halves(unsigned (&a)[KS][4], const float* as, bool sum, float (&dsum)[2]) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32 % 4, g = lane / 4, tig = lane % 4;
    const unsigned* words = reinterpret_cast<const unsigned*>(as);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            a[ks][r] = words[(16 * w + g + 8 * (r % 2)) * ROW + 8 * ks + tig + 4 * (r / 2)];
            if (sum) {
                const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&a[ks][r]));
                dsum[r % 2] = __fadd_ru(dsum[r % 2], __fadd_ru(v.x, v.y));
            }
        }
}

// Versions 4 and 5's layout (floats): phase A's four stages ([dp; p] rows as float32, or version 5's
// float16, |fc1|_up and fc1 rounded to nearest as halves), then Q, the images' z and their slopes where
// they were; per image sum dp and sum p.
template <bool HALVES>
struct V4 {
    static constexpr int IMGS = 32, KT = 32, NSTAGES = 4;  // images a block; phase A's k-tile (features) and its stages
    static constexpr int A_ROW = HALVES ? KT / 2 + 4 : KT + 8;  // staged A rows: 32-bit or float2 fragment loads conflict-free
    static constexpr int A_FLOATS = 64 * A_ROW;                 // rows 0-31: dp, 32-63: p
    static constexpr int B_FLOATS = KT * HIDDEN / 2;            // a k-tile of |fc1|_up, and one of fc1 rounded to nearest (halves)
    static constexpr int STAGE = A_FLOATS + 2 * B_FLOATS;
    static constexpr int Q_ROW = HIDDEN + 4;
    static constexpr int QZS_FLOATS = 96 * Q_ROW + IMGS * HIDDEN;  // Q (64 rows), z (32 rows), then each image's ReLU slopes
    static constexpr int R1 = NSTAGES * STAGE > QZS_FLOATS ? NSTAGES * STAGE : QZS_FLOATS;
    static constexpr int UNITS = HIDDEN / 8;  // hidden units of each of an image's 8 threads
    static_assert(FEAT % (2 * KT) == 0 && STAGE % 4 == 0 && A_ROW % 4 == 0 && HIDDEN % 8 == 0 && CLASSES <= 16,
                  "certify v4: k-tiles in pairs, 16-byte stages");
    static_assert((R1 + 2 * IMGS) * 4 <= 113 * 1024, "certify v4: two blocks an SM (launch.Certify.shared)");
    static_assert(R1 + 2 * IMGS <= (HALVES ? SHARED_V5 : SHARED_V4), "certify v4: the shared memory launch.Certify.shared gives it");
};

// Versions 4 (T = float: fused_kernel6's or 4's float32 features and bounds) and 5 (T = __half: fused_kernel6's
// float16 ones, half the bytes to read; the sums of dp and p bounded from them).
template <class T>
__device__ __forceinline__ void certify_fc1(const T* __restrict__ feat, const T* __restrict__ dp, float* __restrict__ scores,
                                            int* __restrict__ labels, const float4* __restrict__ w1abs,
                                            const float4* __restrict__ w1near, const float* __restrict__ w2, int* __restrict__ ok,
                                            float4* __restrict__ pairs, __half* __restrict__ columns, int* __restrict__ npairs, int n,
                                            float* r1) {
    constexpr bool HALVES = sizeof(T) == 2;
    using L = V4<HALVES>;
    constexpr int IMGS = L::IMGS, KT = L::KT, NSTAGES = L::NSTAGES, A_ROW = L::A_ROW, A_FLOATS = L::A_FLOATS,
                  B_FLOATS = L::B_FLOATS, STAGE = L::STAGE, Q_ROW = L::Q_ROW, R1 = L::R1, UNITS = L::UNITS;
    float* D = r1 + R1;  // rows 0-31: sum of dp; 32-63: sum of p
    const int t = threadIdx.x, warp = t / 32;
    const int wg = warp / 4, w = warp % 4;
    const int img0 = blockIdx.x * IMGS, imgs = min(IMGS, n - img0);

    // Phase A. Rows 0-31: dp of image r (times 2^S), 32-63: p of image r - 32. Version 4: each thread
    // copies one 16-byte piece of a dp row and the same piece of its image's p row; version 5 one piece
    // of one row; and two of each fc1 operand's.
    static_assert(B_FLOATS == 8 * CERT_THREADS, "certify v4: two copies of each fc1 operand a thread");
    using Rows = typename std::conditional<HALVES, PhaseAHalves<IMGS, KT, A_ROW>, PhaseARows<IMGS, KT, A_ROW>>::type;
    const Rows rows(dp, feat, r1, img0, imgs);
    auto fetch_a = [&](int tile) {
        rows.fetch(tile, (tile % NSTAGES) * STAGE);
        float4* bs = reinterpret_cast<float4*>(r1 + (tile % NSTAGES) * STAGE + A_FLOATS) + t;
        const size_t b = (size_t)tile * (B_FLOATS / 4) + t;
        cp_async16(bs, w1abs + b, true);
        cp_async16(bs + CERT_THREADS, w1abs + b + CERT_THREADS, true);
        cp_async16(bs + B_FLOATS / 4, w1near + b, true);
        cp_async16(bs + B_FLOATS / 4 + CERT_THREADS, w1near + b + CERT_THREADS, true);
    };
    constexpr int TILES = FEAT / KT;
    float qa[32], za[32];  // [dp; fl16(p)] . |fc1|_up, and . fl16(fc1): rows 32-63 of za are z
    float dsum[2] = {};    // warpgroup 0: sum dp (warps 0-1) or p (2-3) of rows 16 w + g, + 8, over this thread's k, rounded up
    const float scale = w < 2 ? c_fc_bound[DSCALE] : 1.0f;
    phase_a_tiles<TILES, KT / 16>(fetch_a, [&](int tile, unsigned (&a)[KT / 16][4]) {
        const float* as = r1 + (tile % NSTAGES) * STAGE;
        if constexpr (HALVES)
            phase_a_halves<KT / 16, A_ROW>(a, as, wg == 0, dsum);
        else
            phase_a_fragments<KT / 16, A_ROW>(a, as, scale, wg == 0, dsum, w >= 2);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int ks = 0; ks < KT / 16; ++ks) {  // this warpgroup's 64 hidden units: column groups 8 wg on
            const float* b = as + A_FLOATS + ks * (HIDDEN * 16 / 2) + wg * 8 * 64;
            wgmma16(qa, a[ks], wgmma_desc(b), tile > 0 || ks > 0);
            wgmma16(za, a[ks], wgmma_desc(b + B_FLOATS), tile > 0 || ks > 0);
        }
    });
    if (HALVES && wg == 0) {  // the sums of the float16 values: of dp times 2^S, of p rounded to nearest
#pragma unroll
        for (int dy = 0; dy < 2; ++dy)  // sum dp <= 2^-S sum fl16_up(dp 2^S); sum p <= (sum fl16(p) + FEAT eta) / (1 - u)
            dsum[dy] = w < 2 ? __fmul_ru(dsum[dy], 1.0f / c_fc_bound[DSCALE])
                             : __fmul_ru(__fadd_ru(dsum[dy], FEAT * 0x1p-25f), 1.0f + 0x1p-10f);
    }
    if (wg == 0) store_dp_sums(dsum, D);
    cp_async_wait<0>();
    __syncthreads();  // the stages are dead: Q and z take their place
    float* Q = r1;
    float* Z = Q + 64 * Q_ROW;  // fc1's float16 sums before ReLU, [img][Q_ROW]
    store_tile(Q + 64 * wg, Q_ROW, qa);
    if (w >= 2) store_tile(Z - 32 * Q_ROW + 64 * wg, Q_ROW, za);  // rows 32-63: the p rows
    __syncthreads();

    // Per image (8 threads, 16 hidden units each): the scores relu(z) . fc2 in float32, summed over the
    // 8 threads in a butterfly (every thread ends with the same sums), the first maximum; then the terms
    // of stage one (stage_one).
    const int i = t / 8, part = t % 8;
    const float* zi = Z + i * Q_ROW;
    float s[CLASSES] = {};
    for (int jj = 0; jj < UNITS; ++jj) {
        const int j = part + 8 * jj;
        const float h = relu(zi[j]);
#pragma unroll
        for (int c = 0; c < CLASSES; ++c) s[c] = fmaf(h, w2[j * CLASSES + c], s[c]);
    }
#pragma unroll
    for (int o = 1; o < 8; o *= 2)
#pragma unroll
        for (int c = 0; c < CLASSES; ++c) s[c] += __shfl_xor_sync(0xffffffffu, s[c], o);
    int tc = 0;
#pragma unroll
    for (int c = 1; c < CLASSES; ++c)
        if (s[c] > s[tc]) tc = c;
    if (i < imgs) {
        float* out = scores + (size_t)(img0 + i) * CLASSES;
        if (part == 0) labels[img0 + i] = tc;
#pragma unroll
        for (int c = 0; c < CLASSES; ++c)
            if (c % 8 == part) out[c] = s[c];
    }

    float* slopes = Z + 32 * Q_ROW + i * HIDDEN;  // this image's, for its pairs' columns
    float Ac[CLASSES] = {}, Bc[CLASSES] = {}, Tc[CLASSES] = {}, Rc[CLASSES] = {}, qact = 0.0f;
    const float psum = D[IMGS + i];
    for (int jj = 0; jj < UNITS; ++jj) {
        const int j = part + 8 * jj;
        const Unit u = unit_terms_half(Q[i * Q_ROW + j], Q[(IMGS + i) * Q_ROW + j], zi[j], psum);
        slopes[j] = u.slope;
        if (u.slope > 0.0f) qact = __fadd_ru(qact, u.q);
        add_class_terms(u, w2[j * CLASSES + tc], w2 + j * CLASSES, Ac, Bc, Tc, Rc);
    }
    sum_lanes<8>(Ac, Bc, Tc, Rc, qact);

    stage_one(i, part, img0, imgs, tc, [&](int c) { return s[c]; }, D[i], Ac, Bc, Tc, Rc, qact, slopes, w2, ok, pairs,
              columns, npairs);
}

#if CERTIFY_VERSION == 4
extern "C" __global__ void __launch_bounds__(CERT_THREADS, 2)
certify_kernel4(const float* __restrict__ feat, const float* __restrict__ dp, float* __restrict__ scores,
                int* __restrict__ labels, const float4* __restrict__ w1abs, const float4* __restrict__ w1near,
                const float* __restrict__ w2, int* __restrict__ ok, float4* __restrict__ pairs, __half* __restrict__ columns,
                int* __restrict__ npairs, int n) {
    extern __shared__ float4 smem4[];
    certify_fc1(feat, dp, scores, labels, w1abs, w1near, w2, ok, pairs, columns, npairs, n, reinterpret_cast<float*>(smem4));
}
#endif

#if CERTIFY_VERSION == 5
extern "C" __global__ void __launch_bounds__(CERT_THREADS, 2)
certify_kernel5(const __half* __restrict__ feat, const __half* __restrict__ dp, float* __restrict__ scores,
                int* __restrict__ labels, const float4* __restrict__ w1abs, const float4* __restrict__ w1near,
                const float* __restrict__ w2, int* __restrict__ ok, float4* __restrict__ pairs, __half* __restrict__ columns,
                int* __restrict__ npairs, int n) {
    extern __shared__ float4 smem4[];
    certify_fc1(feat, dp, scores, labels, w1abs, w1near, w2, ok, pairs, columns, npairs, n, reinterpret_cast<float*>(smem4));
}
#endif

// The pair kernels' layout (floats): two stages of both warpgroups' fc1 slab and its dp per pair (T:
// pair_kernel1's float, pair_kernel2's __half, a row padded by 16 bytes); the round's columns as wgmma's
// B operand; per warp its P sums; per pair its image.
template <class T>
struct Pr {
    static constexpr int NP = 32;                  // pairs a round
    static constexpr int SLABS = FEAT / 64;        // fc1 slabs of 64 feature rows
    static constexpr int ITERS = (SLABS + 1) / 2;  // a slab for each warpgroup per iteration
    static constexpr int SLAB = 64 * HIDDEN / 2;   // a slab, halves
    static constexpr int PIECE = 16 / sizeof(T);   // dp values a 16-byte copy
    static constexpr int DS_ROW = 64 + PIECE;      // a slab's dp per pair (values): pairs 4 banks apart
    static constexpr int HALF = SLAB + NP * DS_ROW * sizeof(T) / 4;  // one warpgroup's share of a stage
    static constexpr int STAGE = 2 * HALF;
    static constexpr int COLS = HIDDEN * NP / 2;   // the round's columns, halves
    static_assert(HALF % 4 == 0, "pair: 16-byte stages");
    static_assert((2 * STAGE + COLS + 8 * NP + NP) * 4 <= 113 * 1024, "pair: two blocks an SM (launch.Certify.pair_shared)");
    static_assert(2 * STAGE + COLS + 8 * NP + NP <= SHARED_PAIRS, "pair: the shared memory launch.Certify.pair_shared gives it");
};

// pair_kernel1 (dp float32) and 2 (dp times 2^S as float16, rounded up: P is scaled back at the end).
template <class T>
__device__ __forceinline__ void pairs_round(const float4* __restrict__ pairs, const float4* __restrict__ columns,
                                            const int* __restrict__ npairs, const T* __restrict__ dp,
                                            const float4* __restrict__ w1h, int* __restrict__ ok, float* stages) {
    using L = Pr<T>;
    constexpr int NP = L::NP, SLABS = L::SLABS, ITERS = L::ITERS, SLAB = L::SLAB, PIECE = L::PIECE, DS_ROW = L::DS_ROW,
                  HALF = L::HALF, STAGE = L::STAGE, COLS = L::COLS;
    float* cols = stages + 2 * STAGE;
    float* pw = cols + COLS;  // [warp of the block][pair]
    int* pim = reinterpret_cast<int*>(pw + 8 * NP);
    const int t = threadIdx.x, warp = t / 32, g = t % 32 / 4;
    const int wg = warp / 4, w = warp % 4, count = *npairs;
    for (int p0 = blockIdx.x * NP; p0 < count; p0 += gridDim.x * NP) {
        const int np = min(NP, count - p0);
        __syncthreads();  // the previous round is done with cols, pim and pw
        if (t < NP) pim[t] = t < np ? __float_as_int(pairs[p0 + t].x) : 0;
        // Pair k's halves 8 ch .. 8 ch + 7 are one 16-byte row of B's K-major core matrices (k16 step,
        // 8-column group, half of k, column % 8, k % 8).
        for (int e = t; e < NP * HIDDEN / 8; e += CERT_THREADS) {
            const int k = e / (HIDDEN / 8), ch = e % (HIDDEN / 8);
            cp_async16(cols + (((ch / 2) * (NP / 8) + k / 8) * 2 + ch % 2) * 32 + (k % 8) * 4,
                       columns + (size_t)(p0 + min(k, np - 1)) * (HIDDEN / 8) + ch, k < np);
        }
        __syncthreads();  // pim
        auto fetch = [&](int it) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int slab = 2 * it + h;
                if (slab >= SLABS) break;
                float* ws = stages + (it % 2) * STAGE + h * HALF;
                const float4* src = w1h + (size_t)slab * (SLAB / 4);
                for (int e = t; e < SLAB / 4; e += CERT_THREADS) cp_async16(reinterpret_cast<float4*>(ws) + e, src + e, true);
                T* ds = reinterpret_cast<T*>(ws + SLAB);
                for (int e = t; e < NP * (64 / PIECE); e += CERT_THREADS) {
                    const int k = e / (64 / PIECE), col = PIECE * (e % (64 / PIECE));
                    cp_async16(ds + k * DS_ROW + col, dp + (size_t)pim[k] * FEAT + slab * 64 + col, k < np);
                }
            }
            cp_async_commit();
        };
        float P[NP / 4] = {};  // P[2 cg + e]: pair 8 cg + 2 tig + e, this thread's rows of its warpgroup's slabs
        fetch(0);
        for (int it = 0; it < ITERS; ++it) {
            cp_async_wait<0>();
            asm volatile("fence.proxy.async.shared::cta;");
            __syncthreads();  // this iteration's slabs landed; the other stage's MMAs and dp reads are done
            if (it + 1 < ITERS) fetch(it + 1);
            if (2 * it + wg < SLABS) {
                const float* ws = stages + (it % 2) * STAGE + wg * HALF;
                float acc[16];
                fc1_slab_product(acc, ws, cols);
                const T* ds = reinterpret_cast<const T*>(ws + SLAB) + 16 * w + g;
                add_dp_abs<NP / 8>(P, acc, [&](int col) { return ds + col * DS_ROW; });
            }
        }
        store_warp_sums<NP / 8>(P, pw);
        __syncthreads();
        if (t < np) {
            float pc = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) pc = __fadd_ru(pc, pw[k * NP + t]);
            if (sizeof(T) == 2) pc = __fmul_ru(pc, 1.0f / c_fc_bound[DSCALE]);  // dp 2^S back to dp (rounded up)
            const float4 m = pairs[p0 + t];  // image, s_t - s_c rounded down, the rest of the gap
            const float gap = __fadd_ru(pc, m.z);
            if (!(isfinite(gap) && m.y > gap)) ok[__float_as_int(m.x)] = 0;
        }
    }
}

#if CERTIFY_VERSION == 4
extern "C" __global__ void __launch_bounds__(CERT_THREADS, 2)
pair_kernel1(const float4* __restrict__ pairs, const float4* __restrict__ columns, const int* __restrict__ npairs,
             const float* __restrict__ dp, const float4* __restrict__ w1h, int* __restrict__ ok) {
    extern __shared__ float4 smem4[];
    pairs_round(pairs, columns, npairs, dp, w1h, ok, reinterpret_cast<float*>(smem4));
}
#endif

#if CERTIFY_VERSION == 5
extern "C" __global__ void __launch_bounds__(CERT_THREADS, 2)
pair_kernel2(const float4* __restrict__ pairs, const float4* __restrict__ columns, const int* __restrict__ npairs,
             const __half* __restrict__ dp, const float4* __restrict__ w1h, int* __restrict__ ok) {
    extern __shared__ float4 smem4[];
    pairs_round(pairs, columns, npairs, dp, w1h, ok, reinterpret_cast<float*>(smem4));
}
#endif

extern "C" __global__ void __launch_bounds__(1024)
compact_kernel1(const int* __restrict__ ok, int n, int* __restrict__ idx, int* __restrict__ count, int* __restrict__ fb_overflow,
                int* __restrict__ total) {
    __shared__ int warp_sums[32];
    const int t = threadIdx.x, per = (n + 1023) / 1024, begin = min(n, t * per), end = min(n, begin + per);
    int mine = 0;
    for (int i = begin; i < end; ++i) mine += ok[i] == 0;
    int incl = mine;  // inclusive scan over the warp, then over the warps' sums
    for (int o = 1; o < 32; o *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (t % 32 >= o) incl += v;
    }
    if (t % 32 == 31) warp_sums[t / 32] = incl;
    __syncthreads();
    if (t < 32) {
        int v = warp_sums[t];
        for (int o = 1; o < 32; o *= 2) {
            const int u = __shfl_up_sync(0xffffffffu, v, o);
            if (t >= o) v += u;
        }
        warp_sums[t] = v;
    }
    __syncthreads();
    int at = incl - mine + (t >= 32 ? warp_sums[t / 32 - 1] : 0);
    for (int i = begin; i < end; ++i)
        if (ok[i] == 0) idx[at++] = i;
    if (t == 1023) {
        *count = at;
        *fb_overflow = 0x7fffffff;
        atomicAdd(total, at);
    }
}

extern "C" __global__ void scatter_kernel1(const int* __restrict__ idx, const int* __restrict__ count, const int* __restrict__ fb_labels,
                                           int* __restrict__ labels, const float* __restrict__ fb_scores, float* __restrict__ scores,
                                           const int* __restrict__ fb_overflow, int* __restrict__ overflow) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= *count) return;
    labels[idx[i]] = fb_labels[i];
    if (scores != nullptr)
        for (int c = 0; c < CLASSES; ++c) scores[(size_t)idx[i] * CLASSES + c] = fb_scores[(size_t)i * CLASSES + c];
    if (i == *fb_overflow) atomicMin(overflow, idx[i]);
}
