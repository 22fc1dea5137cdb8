/* The whole network on the CPU, image by image, for any geometry the model declares: the CPU
 * backend's fast path (infer/cpu/backend.py). Built by infer/data/native.py with the C compiler for this
 * machine's vector unit (-march=native), cached on disk; without a compiler the NumPy layers run.
 *
 * Layouts: images (n, H, W, C) float32; conv weights (K, K, C_in, Mp) and fc weights (in, Np) with
 * the output channels zero-padded to Mp / Np, a multiple of the vector width (cn_vector_width):
 * padded channels come out 0 and the next layer's padded weight rows are 0, so they change nothing.
 *
 * conv_relu_pool: a direct NHWC convolution (valid, stride 1), ReLU and the 2x2 average pool in
 *   its epilogue (((a + b) + c) + d, times 0.25, as the reference); register tile: 1 to 6 pool
 *   windows (4 output pixels each) x 1 to MAXV vectors of output channels, up to ACC_MAX sums,
 *   one FMA per input channel, tap and tile element. Kernel rows go in blocks whose weights stay
 *   in L1 (TILE_BUDGET), partial sums parked in a per-image buffer between blocks; windows whose
 *   input is all zero, and pixels that the floored pool drops, are never computed; the images
 *   are checked for values that are not finite on the way. Builds with 16 vector registers run a
 *   layer whose input pixels are an eighth or more all 0 tap by tap (conv_tile_taps), each tap only
 *   for the window's pixels with a non-zero input there (MNIST's conv2 when it ran here: 8% faster
 *   on 2 Zen 3 cores, the same bits).
 * conv_winograd: conv_relu_pool for a 5x5 layer of whole vectors of channels (conv2; not the
 *   images' conv1) by Winograd's F(2x2, 5x5), a pool window a tile: the ECE408 conv2's 3.3M FMAs
 *   an image, 85% of the network, become 1.2M.
 * dense: (rows, K) x (K, Np), ReLU optional; register tile 4 to 6 rows (the rows split evenly) x up to
 *   DENSE_MAXV vectors.
 * cn_forward: n images -> scores (n, classes) and labels (first maximum), in blocks of images whose
 *   conv2 outputs stay in L2 (FEATURE_BUDGET): the fc layers run on a block at once. Where fc1's
 *   weights outweigh that, blocks of `hidden` images: then fc1 reads no more weight bytes than
 *   feature bytes per image. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#define VW 16
#define MAXV 4     /* 32 registers: up to 24 accumulators, 4 weight vectors, a broadcast */
#define ACC_MAX 24
#define DENSE_MAXV 4
#else
#if defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
#define MAXV 3     /* 16 registers: up to 12 accumulators, 3 weight vectors, a broadcast */
#define ACC_MAX 12
#define DENSE_MAXV 2 /* 6 rows x 2 vectors */
#endif
#define TILE_BUDGET (16 * 1024) /* bytes of weights per tap block: they stay in L1 */
#ifndef CONV_TAPS
#define CONV_TAPS 1 /* 16-register builds: conv_tile_taps where many input pixels are 0 (-DCONV_TAPS=0: never) */
#endif
#define ROWS 6                  /* dense: rows per register tile */
#define PANEL_BUDGET (256 * 1024) /* bytes of fc weights per panel: they stay in L2 */
#define FEATURE_BUDGET (1 << 20)  /* bytes of conv2 outputs per fc pass (L2), unless fc1 is larger */
#define WINO_SKEW 16              /* floats between conv_winograd's slices, past their size */
#define WINO_BUDGET (192 * 1024)  /* bytes of conv_winograd's inputs and products per group of windows */

typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VW * sizeof(float))));

static inline vf load(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* Keep v in a register: without it GCC reloads a weight vector from L1 for each of its FMAs (a memory
 * operand), and with 16 vector registers (AVX2, SSE) the loads, not the FMAs, set the pace: testfull
 * on 2 Zen 3 cores 0.84 -> 0.66 s. AVX-512 builds are left as they were measured (86% of peak). */
static inline void pin(vf *v)
{
#if (defined(__x86_64__) || defined(__i386__)) && !defined(__AVX512F__)
    __asm__("" : "+x"(*v));
#else
    (void)v;
#endif
}

/* A broadcast ((vf){0} + x would add 0.0 too, and element-wise stores make masked moves). */
static inline vf splat(float x) { return __builtin_shuffle((vf){x}, (vi){0}); }

/* max(v, 0) that keeps NaN, as the reference's np.maximum does: an overflow is never hidden. */
static inline vf relu(vf v)
{
    vi not_positive = v <= (vf){0};
    return (vf)(~not_positive & (vi)v);
}

/* ReLU, then the 2x2 average pool in the reference's order: ((a + b) + c) + d, times 0.25 */
static inline vf relu_pool(vf a, vf b, vf c, vf d) { return (((relu(a) + relu(b)) + relu(c)) + relu(d)) * 0.25f; }

struct conv {
    const float *in;  /* the input image (h, w, c) */
    int h, w, c;
    const float *wt;  /* (k, k, c, mp) */
    int k, mp;
    float *out;       /* (h', w', mp) pooled: h' = (h - k + 1) / 2 */
    float *part;      /* partial sums between tap blocks: 4 * MAXV * VW floats per pool window */
    size_t *live;     /* the pool windows whose input is not all zero: (input offset, output offset) */
    unsigned char *lit; /* whether each input pixel has a non-zero channel: h * w */
    unsigned char *quad; /* per input pixel (y, x): bit q set where pixel q of the 2x2 pixels from it has one */
    int check;        /* whether to check that the input is finite (the images; not conv1's output) */
    const float *u;   /* k = 5 and whole vectors of channels: the weights as Winograd's (36, c, mp), else NULL */
    float *v, *mm;    /* conv_winograd's transformed inputs (36, windows, c) and products (36, windows, mp) */
};

/* One register tile: pw pool windows (live windows j, j + 1, ...), output channels
 * [m, m + nv*VW), kernel rows [y0, y1). Pixel r of the tile: window r / 4, position (r % 4 / 2, r % 2)
 * in it, the reference's pooling order. */
static inline __attribute__((always_inline)) void conv_tile(const struct conv *L, const int nv, const int pw, int j,
                                                             int m, int y0, int y1, int first, int last)
{
    vf acc[ACC_MAX][MAXV];
    const size_t c = L->c, row = (size_t)L->w * c, diag = row + c; /* a window's other three pixels */
    const float *win[ACC_MAX / 4];
    float *part = L->part + (size_t)j * 4 * MAXV * VW;
    for (int w = 0; w < pw; w++)
        win[w] = L->in + L->live[2 * (j + w)];
    for (int r = 0; r < 4 * pw; r++)
        for (int v = 0; v < nv; v++)
            acc[r][v] = first ? (vf){0} : load(part + (r * MAXV + v) * VW);
    /* One kernel row is k * c contiguous floats of the input and k * c weight rows: one run */
    const int run = L->k * (int)c;
    const float *b = L->wt + (size_t)y0 * run * L->mp + m;
    for (int ky = y0; ky < y1; ky++)
        for (int i = 0; i < run; i++, b += L->mp) {
            vf wv[MAXV];
            for (int v = 0; v < nv; v++) {
                wv[v] = load(b + v * VW);
                pin(&wv[v]);
            }
            for (int w = 0; w < pw; w++) {
                const float *p = win[w] + ky * row + i;
#if defined(__AVX512F__) /* as measured at 86% of peak */
                vf x0 = splat(p[0]), x1 = splat(p[c]), x2 = splat(p[row]), x3 = splat(p[diag]);
                for (int v = 0; v < nv; v++) {
                    acc[4 * w][v] += x0 * wv[v];
                    acc[4 * w + 1][v] += x1 * wv[v];
                    acc[4 * w + 2][v] += x2 * wv[v];
                    acc[4 * w + 3][v] += x3 * wv[v];
                }
#else
                const size_t at[4] = {0, c, row, diag};
                for (int q = 0; q < 4; q++) { /* each broadcast used at once: 16 registers hold the tile */
                    const vf x = splat(p[at[q]]);
                    for (int v = 0; v < nv; v++)
                        acc[4 * w + q][v] += x * wv[v];
                }
#endif
            }
        }
    if (!last) {
        for (int r = 0; r < 4 * pw; r++)
            for (int v = 0; v < nv; v++)
                store(part + (r * MAXV + v) * VW, acc[r][v]);
        return;
    }
    for (int w = 0; w < pw; w++)
        for (int v = 0; v < nv; v++) {
            const vf *a = &acc[4 * w][v];
            store(L->out + L->live[2 * (j + w) + 1] + m + v * VW, relu_pool(a[0], a[MAXV], a[2 * MAXV], a[3 * MAXV]));
        }
}

#if !defined(__AVX512F__)
/* One tap of a one-window tile: c input channels into the window's pixels whose bit is set in
 * `lit` (pattern known at compile time: each pattern its own loop), the others' products all 0. */
static inline __attribute__((always_inline)) void tap_run(vf acc[4][MAXV], const int nv, const int lit,
                                                           const float *p, size_t c, size_t row, const float *b,
                                                           size_t mp)
{
    const size_t at[4] = {0, c, row, row + c};
    for (size_t i = 0; i < c; i++, b += mp) {
        vf wv[MAXV];
        for (int v = 0; v < nv; v++) {
            wv[v] = load(b + v * VW);
            pin(&wv[v]);
        }
        for (int q = 0; q < 4; q++)
            if (lit >> q & 1) {
                const vf x = splat(p[at[q] + i]);
                for (int v = 0; v < nv; v++)
                    acc[q][v] += x * wv[v];
            }
    }
}

/* conv_tile for one window (pw = 1) of a layer of whole vectors of channels, a tap at a time:
 * pixels whose c inputs at a tap are all 0 (on MNIST's conv2, 37% of the pixels; a tile's four at
 * once only 11% of the taps) do no FMAs there. The same products in the same order less zeros' (the
 * sums never -0), so the same bits. */
static inline __attribute__((always_inline)) void conv_tile_taps(const struct conv *L, const int nv, int j, int m,
                                                                  int y0, int y1, int first, int last)
{
    vf acc[4][MAXV];
    const size_t c = L->c, row = (size_t)L->w * c, tap = c * L->mp;
    const float *win = L->in + L->live[2 * j];
    const unsigned char *quad = L->quad + L->live[2 * j] / c;
    float *part = L->part + (size_t)j * 4 * MAXV * VW;
    for (int q = 0; q < 4; q++)
        for (int v = 0; v < nv; v++)
            acc[q][v] = first ? (vf){0} : load(part + (q * MAXV + v) * VW);
    const float *b = L->wt + (size_t)y0 * L->k * tap + m;
    for (int ky = y0; ky < y1; ky++)
        for (int kx = 0; kx < L->k; kx++, b += tap) {
            const float *p = win + ky * row + kx * c;
#define RUN(n) case n: tap_run(acc, nv, n, p, c, row, b, L->mp); break
            switch (quad[ky * L->w + kx]) {
                RUN(1); RUN(2); RUN(3); RUN(4); RUN(5); RUN(6); RUN(7); RUN(8);
                RUN(9); RUN(10); RUN(11); RUN(12); RUN(13); RUN(14); RUN(15);
            }
#undef RUN
        }
    if (!last) {
        for (int q = 0; q < 4; q++)
            for (int v = 0; v < nv; v++)
                store(part + (q * MAXV + v) * VW, acc[q][v]);
        return;
    }
    for (int v = 0; v < nv; v++) {
        store(L->out + L->live[2 * j + 1] + m + v * VW, relu_pool(acc[0][v], acc[1][v], acc[2][v], acc[3][v]));
    }
}

/* Its specialisations, in a function apart from conv_tiles', whose dense tiles stay as measured. */
static __attribute__((noinline)) void conv_tiles_taps(const struct conv *L, int nv, int j, int m, int y0, int y1,
                                                      int first, int last)
{
    switch (nv) {
    case 1: conv_tile_taps(L, 1, j, m, y0, y1, first, last); break;
    case 2: conv_tile_taps(L, 2, j, m, y0, y1, first, last); break;
    case 3: conv_tile_taps(L, 3, j, m, y0, y1, first, last); break;
    }
}
#endif

/* The specialisations (constant nv and pw, so the tile lives in registers). */
static void conv_tiles(const struct conv *L, int nv, int pw, int j, int m, int y0, int y1, int first, int last)
{
#define TILE(n, p) case (n) * 8 + (p): conv_tile(L, n, p, j, m, y0, y1, first, last); break
    switch (nv * 8 + pw) {
        TILE(1, 1); TILE(1, 2); TILE(1, 3);
        TILE(2, 1);
#if ACC_MAX >= 24
        TILE(1, 4); TILE(1, 5); TILE(1, 6);
        TILE(2, 2); TILE(2, 3);
        TILE(3, 1); TILE(3, 2);
        TILE(4, 1);
#else
        TILE(3, 1);
#endif
    }
#undef TILE
}

/* The windows with a non-zero input pixel, listed in L->live; the others' outputs set to 0 here.
 * Exact: a window whose inputs are all 0 sums products 0 * w (finite weights) to +-0, and ReLU and
 * the pool make that +0. MNIST-style digits on a blank page leave a third of conv1's windows out. */
static int live_windows(const struct conv *L, int *finite, int *blank)
{
    const int hp = (L->h - L->k + 1) / 2, wp = (L->w - L->k + 1) / 2, side = L->k + 1;
    const float *p = L->in;
    int ok = 1;
    if (!L->check && L->c % VW == 0) { /* a layer's padded channels: whole vectors a pixel */
        for (int i = 0; i < L->h * L->w; i++, p += L->c) {
            vi any = (vi){0};
            for (int ci = 0; ci < L->c; ci += VW)
                any |= load(p + ci) != (vf){0};
            int lit = 0;
            for (int e = 0; e < VW; e++)
                lit |= any[e];
            L->lit[i] = (unsigned char)(lit != 0);
        }
    } else if (L->c == 1) { /* one channel (MNIST's images): whole vectors of pixels */
        const int n = L->h * L->w;
        vi bad = (vi){0};
        int i = 0;
        for (; i + VW <= n; i += VW) {
            const vf v = load(p + i);
            const vi nz = v != (vf){0};
            bad |= (v - v) != (vf){0}; /* NaN for NaN and infinities */
            for (int e = 0; e < VW; e++)
                L->lit[i + e] = (unsigned char)(nz[e] != 0);
        }
        for (int e = 0; e < VW; e++)
            ok &= bad[e] == 0;
        for (; i < n; i++) {
            L->lit[i] = (unsigned char)(p[i] != 0.0f);
            ok &= p[i] - p[i] == 0.0f;
        }
        ok |= !L->check;
    } else
        for (int i = 0; i < L->h * L->w; i++) {
            int any = 0;
            for (int ci = 0; ci < L->c; ci++)
                any |= p[ci] != 0.0f;
            if (L->check)
                for (int ci = 0; ci < L->c; ci++)
                    ok &= p[ci] - p[ci] == 0.0f; /* NaN for NaN and infinities */
            L->lit[i] = (unsigned char)any;
            p += L->c;
        }
    *finite = ok;
    *blank = 0;
    for (int i = 0; i < L->h * L->w; i++)
        *blank += !L->lit[i];
    /* run[y w + x]: whether lit[y][x, x + side) has one (a count slid along each row; in quad's
     * bytes, which conv_relu_pool fills after this), so a window is side bytes, not side^2 */
    unsigned char *run = L->quad;
    for (int y = 0; y < L->h; y++) {
        const unsigned char *l = L->lit + y * L->w;
        int count = 0;
        for (int x = 0; x < side - 1; x++)
            count += l[x];
        for (int x = 0; x + side <= L->w; x++) {
            count += l[x + side - 1];
            run[y * L->w + x] = (unsigned char)(count != 0);
            count -= l[x];
        }
    }
    int live = 0;
    for (int py = 0; py < hp; py++)
        for (int px = 0; px < wp; px++) {
            int any = 0;
            for (int y = 2 * py; y < 2 * py + side; y++)
                any |= run[y * L->w + 2 * px];
            if (any) {
                L->live[2 * live] = (2 * (size_t)py * L->w + 2 * (size_t)px) * L->c;
                L->live[2 * live++ + 1] = ((size_t)py * wp + px) * L->mp;
            } else
                memset(L->out + (size_t)(py * wp + px) * L->mp, 0, L->mp * sizeof(float));
        }
    return live;
}

/* out[r] (+)= a[r][k0:k1] x b[k0:k1] for the rows given (rows <= R <= ROWS; missing rows repeat row 0
 * and are not stored): the sum starts at 0 for the first block of k, ReLU applied after the last. */
static inline __attribute__((always_inline)) void dense_tile(const int nv, const int R, const float *const *a, int rows,
                                                              int k0, int k1, const float *b, int ldb, float *out,
                                                              int ldo, int first, int last_relu)
{
    vf acc[ROWS][DENSE_MAXV];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < nv; v++)
            acc[r][v] = first || r >= rows ? (vf){0} : load(out + (size_t)r * ldo + v * VW);
    b += (size_t)k0 * ldb;
    for (int i = k0; i < k1; i++, b += ldb) {
        vf wv[DENSE_MAXV];
        for (int v = 0; v < nv; v++)
            wv[v] = load(b + v * VW);
        for (int r = 0; r < R; r++) {
            vf x = splat(a[r][i]);
            for (int v = 0; v < nv; v++)
                acc[r][v] += x * wv[v];
        }
    }
    for (int r = 0; r < R && r < rows; r++)
        for (int v = 0; v < nv; v++)
            store(out + (size_t)r * ldo + v * VW, last_relu ? relu(acc[r][v]) : acc[r][v]);
}

/* (n, kdim) x (kdim, np) -> (n, np), ReLU optional. The weights go in panels of rows that stay in
 * L2 while every row of a passes them: each weight is read from memory once per call (fc1 of a
 * 64x64 image is 11 MB). */
static void dense(const float *a, int n, int kdim, const float *b, int np, float *out, int do_relu)
{
    int panel = PANEL_BUDGET / (np * (int)sizeof(float));
    if (panel < 1)
        panel = 1;
    for (int k0 = 0; k0 < kdim; k0 += panel) {
        int k1 = k0 + panel < kdim ? k0 + panel : kdim, first = k0 == 0, last_relu = do_relu && k1 == kdim;
        for (int r0 = 0, rows; r0 < n; r0 += rows) {
            /* the rows left split evenly over the tiles they need: 16 (conv_winograd's) as 6, 5, 5 */
            const int tiles = (n - r0 + ROWS - 1) / ROWS;
            rows = (n - r0 + tiles - 1) / tiles;
            const int R = rows < 4 ? ROWS : rows; /* the tile's rows: 4, 5 or 6 (fewer rows repeat one) */
            const float *rp[ROWS];
            for (int r = 0; r < ROWS; r++)
                rp[r] = a + (size_t)(r0 + (r < rows ? r : 0)) * kdim;
            for (int m = 0; m < np; m += DENSE_MAXV * VW) {
                int nv = (np - m) / VW < DENSE_MAXV ? (np - m) / VW : DENSE_MAXV;
                float *o = out + (size_t)r0 * np + m;
#define TILE(n, r) case (n) * 8 + (r): dense_tile(n, r, rp, rows, k0, k1, b + m, np, o, np, first, last_relu); break
#define TILES(n) TILE(n, 4); TILE(n, 5); TILE(n, 6)
                switch (nv * 8 + R) {
                    TILES(1); TILES(2);
#if DENSE_MAXV >= 4
                    TILES(3); TILES(4);
#endif
                }
#undef TILES
#undef TILE
            }
        }
    }
}

/* Winograd's F(2x2, 5x5) (infer/cpu/winograd.py): o[i t] = (B^T d)[i] for d[0], d[s], ..., d[5 s] */
static inline __attribute__((always_inline)) void winograd_bt(const vf *d, size_t s, vf *o, size_t t)
{
    const vf d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
    const vf four = splat(4.0f), five = splat(5.0f), two = splat(2.0f);
    const vf p = d4 - d2, q = d3 - d1; /* rows 3 and 4: p +- 2 q */
    o[0] = (d4 + four * d0) - five * d2;
    o[t] = (d3 + d4) - four * (d1 + d2);
    o[2 * t] = (d4 - d3) + four * (d1 - d2);
    o[3 * t] = p + two * q;
    o[4 * t] = p - two * q;
    o[5 * t] = (d5 + four * d1) - five * d3;
}

/* (A^T m)[0] and [1] for m[0], m[s], ..., m[5 s] */
static inline __attribute__((always_inline)) void winograd_at(const vf *m, size_t s, vf *y0, vf *y1)
{
    const vf a = m[s] + m[2 * s], b = m[3 * s] + m[4 * s];
    *y0 = (m[0] + a) + b;
    *y1 = ((m[s] - m[2 * s]) + splat(2.0f) * (m[3 * s] - m[4 * s])) + m[5 * s];
}

/* conv_winograd's windows a group: their inputs and products (36 (c + mp) floats a window) stay in
 * L2 beside the weights (a 96x96 image's 441 windows at once: 6 MB); a multiple of dense's 6 rows */
static size_t winograd_group(size_t c, size_t mp)
{
    const size_t group = WINO_BUDGET / (36 * (c + mp) * sizeof(float)) / 6 * 6;
    return group < 6 ? 6 : group;
}

/* conv_relu_pool's body for a 5x5 layer of whole vectors of channels, one pool window (a 2x2 output
 * block) per 6x6 input block: each live window's block through B^T . B (36 vectors a channel
 * vector), then per position of the 6x6 a (windows, c) x (c, mp) product by dense's tiles (the
 * weights' 8 KB per position for the ECE408 conv2 stay in L1), then A^T . A, ReLU and the pool.
 * 36 products per channel pair where the direct tiles take 100: the ECE408 conv2's 3.3M FMAs an
 * image become 1.2M, plus the two transforms' ~0.1M vector operations. */
static void conv_winograd(const struct conv *L, int live)
{
    const size_t c = L->c, mp = L->mp, group = winograd_group(c, mp);
    for (size_t t0 = 0; t0 < (size_t)live; t0 += group) {
        const size_t T = (size_t)live - t0 < group ? (size_t)live - t0 : group;
        /* the 36 positions' slices WINO_SKEW floats apart past their size: at sizes of 4 KB multiples
         * the transforms' 36 loads or stores a vector fall in one L1 set (16 windows x 64 channels) */
        const size_t vs = T * c + WINO_SKEW, ms = T * mp + WINO_SKEW;
        const size_t *at = L->live + 2 * t0;
        for (size_t t = 0; t < T; t++) {
            const float *blk = L->in + at[2 * t];
            for (size_t ci = 0; ci < c; ci += VW) {
                vf d[36], e[36];
                for (int y = 0; y < 6; y++)
                    for (int x = 0; x < 6; x++)
                        d[y * 6 + x] = load(blk + ((size_t)y * L->w + x) * c + ci);
                for (int x = 0; x < 6; x++)
                    winograd_bt(d + x, 6, e + x, 6);
                for (int a = 0; a < 6; a++)
                    winograd_bt(e + a * 6, 1, d + a * 6, 1);
                for (int p = 0; p < 36; p++)
                    store(L->v + p * vs + t * c + ci, d[p]);
            }
        }
        for (int p = 0; p < 36; p++)
            dense(L->v + p * vs, (int)T, (int)c, L->u + p * c * mp, (int)mp, L->mm + p * ms, 0);
        for (size_t t = 0; t < T; t++)
            for (size_t mo = 0; mo < mp; mo += VW) {
                vf m[36], s0[6], s1[6];
                for (int p = 0; p < 36; p++)
                    m[p] = load(L->mm + p * ms + t * mp + mo);
                for (int b = 0; b < 6; b++)
                    winograd_at(m + b, 6, &s0[b], &s1[b]);
                vf y00, y01, y10, y11;
                winograd_at(s0, 1, &y00, &y01);
                winograd_at(s1, 1, &y10, &y11);
                store(L->out + at[2 * t + 1] + mo, relu_pool(y00, y01, y10, y11));
            }
    }
}

/* Returns 0 where L->check finds an input value that is not finite (the images are checked here, on
 * the way), else 1. */
static int conv_relu_pool(const struct conv *L)
{
    int finite, blank;
    const int live = live_windows(L, &finite, &blank);
    if (L->u) {
        conv_winograd(L, live);
        return finite;
    }
#if !defined(__AVX512F__) /* (AVX-512 builds keep their tiles as measured: 86% of peak) */
    /* tap by tap where an eighth of the input pixels or more are 0 (MNIST's conv2: 37%; random
     * images: none), as the split loop costs more than the dense tile's where few taps are skipped */
    const int taps = CONV_TAPS && L->c % VW == 0 && 8 * blank >= L->h * L->w;
    for (int y = 0; taps && y + 1 < L->h; y++)
        for (int x = 0; x + 1 < L->w; x++) {
            const unsigned char *l = L->lit + y * L->w + x;
            L->quad[y * L->w + x] = (unsigned char)(l[0] | l[1] << 1 | l[L->w] << 2 | l[L->w + 1] << 3);
        }
#else
    (void)blank;
#endif
    for (int m = 0; m < L->mp; m += MAXV * VW) {
        /* as many windows per tile as the accumulator registers hold: fewer vectors of channels, more windows */
        int nv = (L->mp - m) / VW < MAXV ? (L->mp - m) / VW : MAXV;
        int pw = ACC_MAX / (4 * nv);
        int rows = TILE_BUDGET / (L->k * L->c * nv * VW * (int)sizeof(float));
        if (rows < 1)
            rows = 1;
        for (int y0 = 0; y0 < L->k; y0 += rows) {
            int y1 = y0 + rows < L->k ? y0 + rows : L->k;
            for (int j = 0; j < live; j += pw)
#if !defined(__AVX512F__)
                if (taps && pw == 1)
                    conv_tiles_taps(L, nv, j, m, y0, y1, y0 == 0, y1 == L->k);
                else
#endif
                    conv_tiles(L, nv, live - j < pw ? live - j : pw, j, m, y0, y1, y0 == 0, y1 == L->k);
        }
    }
    return finite;
}

int cn_vector_width(void) { return VW; }

/* Each calling thread keeps its scratch memory between calls (freed when the thread ends): a
 * fresh block per call would be mapped and unmapped each time, and every unmap interrupts all the
 * threads of the process to flush their TLBs. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
struct scratch {
    size_t bytes;
    float *at;
};

static void scratch_free(void *p)
{
    struct scratch *s = p;
    free(s->at);
    free(s);
}

static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

static float *scratch_get(size_t bytes)
{
    pthread_once(&scratch_once, scratch_init);
    struct scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    if (s->bytes < bytes) {
        free(s->at);
        s->bytes = 0;
        if (!(s->at = aligned_alloc(64, (bytes + 63) / 64 * 64)))
            return NULL;
        s->bytes = bytes;
    }
    return s->at;
}

/* Geometry g: h, w, c, k1, c1p, k2, c2p, flat_p (= h2 * w2 * c2p), hidden_p, classes, classes_p; w2 is
 * (k2, k2, c1p, c2p): conv2 reads pool1's padded channels too, so each kernel row is one run. u2:
 * for k2 = 5 w2 as Winograd's (36, c1p, c2p) (infer/cpu/winograd.py), conv2 then by conv_winograd; or NULL.
 * Returns -1 when every image and score is finite; else the first image whose scores are not
 * finite (image i returned as i), or that holds a value that is not finite (returned as -3 - i),
 * nothing after it guaranteed; or -2 when scratch memory cannot be had. */
long long cn_forward(const float *x, long long n, const int *g, const float *w1, const float *w2, const float *u2,
                     const float *f1, const float *f2, float *scores, long long *labels)
{
    const int h = g[0], w = g[1], c = g[2], k1 = g[3], c1p = g[4], k2 = g[5], c2p = g[6];
    const int flat = g[7], hidden = g[8], classes = g[9], classes_p = g[10];
    const int h1 = (h - k1 + 1) / 2, w1p = (w - k1 + 1) / 2;
    const size_t windows = (size_t)h1 * w1p; /* more than conv2's */
    /* conv_winograd's inputs and products: a group of conv2's windows (all of them where fewer) */
    const size_t windows2 = (size_t)((h1 - k2 + 1) / 2) * ((w1p - k2 + 1) / 2), group = winograd_group(c1p, c2p);
    const size_t held = windows2 < group ? windows2 : group;
    const size_t wino_v = u2 ? 36 * (held * c1p + WINO_SKEW) : 0, wino = u2 ? wino_v + 36 * (held * c2p + WINO_SKEW) : 0;
    long long block = FEATURE_BUDGET / ((long long)flat * (long long)sizeof(float));
    block = block < hidden ? hidden : block;
    block = block < ROWS ? ROWS : block > n ? n : block;
    const size_t need = windows * c1p + windows * 4 * MAXV * VW + (size_t)block * (flat + hidden + classes_p)
                        + windows * 2 * sizeof(size_t) / sizeof(float) + ((size_t)h * w + 1) / 2 /* live, lit, quad */
                        + wino;
    float *scratch = scratch_get(need * sizeof(float));
    if (!scratch)
        return -2;
    float *pool1 = scratch, *part = pool1 + windows * c1p, *feat = part + windows * 4 * MAXV * VW;
    float *hid = feat + (size_t)block * flat, *out = hid + (size_t)block * hidden;
    size_t *live = (size_t *)(out + (size_t)block * classes_p);
    unsigned char *lit = (unsigned char *)(live + 2 * windows), *quad = lit + (size_t)h * w;
    float *wv = scratch + need - wino, *wm = wv + wino_v;
    long long bad = -1;
    for (long long i0 = 0; i0 < n && bad == -1; i0 += block) {
        int count = n - i0 < block ? (int)(n - i0) : block;
        for (int j = 0; j < count; j++) {
            struct conv a = {x + (size_t)(i0 + j) * h * w * c, h, w, c, w1, k1, c1p, pool1, part, live, lit, quad, 1,
                             NULL, NULL, NULL};
            if (!conv_relu_pool(&a)) {
                bad = -3 - (i0 + j);
                break;
            }
            struct conv b = {pool1, h1, w1p, c1p, w2, k2, c2p, feat + (size_t)j * flat, part, live, lit, quad, 0,
                             u2, wv, wm};
            conv_relu_pool(&b);
        }
        if (bad != -1)
            break; /* a value that is not finite is the answer, whatever the scores */
        dense(feat, count, flat, f1, hidden, hid, 1);
        dense(hid, count, hidden, f2, classes_p, out, 0);
        for (int j = 0; j < count && bad == -1; j++) {
            const float *s = out + (size_t)j * classes_p;
            float *dst = scores + (size_t)(i0 + j) * classes;
            int best = 0;
            for (int q = 0; q < classes; q++) {
                float v = s[q];
                if (v - v != 0.0f) { /* inf or NaN */
                    bad = i0 + j;
                    break;
                }
                dst[q] = v;
                if (v > s[best])
                    best = q;
            }
            labels[i0 + j] = best;
        }
    }
    return bad;
}
