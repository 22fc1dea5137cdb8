// unroll (im2col) of a chunk of images for the classic GEMM convolution.
// in:  x (n, H, W, C) float32, NHWC
// out: u (K*K*C, n*Ho*Wo) row-major: row r = (kh, kw, c), column p = (img, oh, ow); Ho = H-K+1
//   (unroll_kernel3: its transpose, (n*Ho*Wo, KU) with rows zero-padded to KU, a multiple of 4)
// Both move 4 * K*K*C*P bytes out (P = n*Ho*Wo) and read each input value up to K*K times (L1).
// unroll_kernel1 (retired, unroll_kernel2 does its work): one thread per element of u, six integer
//   divisions each; grid ceil(K*K*C*P / 256) x 256.
// unroll_kernel2: one thread per column p, its divisions once, then its K*K*C rows in order: for
//   each kh one contiguous run of K*C input floats (row r = kh*K*C + j reads x[oh+kh][ow][j], the
//   run through L1), stores coalesced across the warp (consecutive p); grid-stride, 256 threads.

extern "C" __global__ void unroll_kernel2(const float* __restrict__ x, float* __restrict__ u,
                                          int n, int H, int W, int C, int K) {
    const int Ho = H - K + 1, Wo = W - K + 1;
    const int P = n * Ho * Wo, run = K * C;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < P; p += gridDim.x * blockDim.x) {
        const int img = p / (Ho * Wo), q = p - img * (Ho * Wo);
        const int oh = q / Wo, ow = q - oh * Wo;
        const float* src = x + ((size_t)(img * H + oh) * W + ow) * C;
        float* dst = u + p;
        for (int kh = 0; kh < K; ++kh, src += (size_t)W * C) {
#pragma unroll 8
            for (int j = 0; j < run; ++j, dst += P) *dst = __ldg(src + j);
        }
    }
}

// unroll_kernel3: the transposed layout for gemm_kernel4, whose product is then NHWC: row p = (img,
//   oh, ow) holds the K*K*C values of its window in (kh, kw, c) order, then zeros up to KU (rows
//   start 16-byte aligned); block 256, grid-stride; moves 4 * KU * P bytes out. Rows of up to
//   SHORT_ROW floats (conv1 of 1- or 2-channel images): 8 or 16 lanes a row, one float4 each, 4 or 2
//   adjacent rows a warp (stores contiguous across the warp), gather offsets from a table in shared
//   memory (the same for every row). Longer rows: a warp per row, lanes along it; row segment kh is
//   one contiguous run of K*C input floats, so loads and stores are both contiguous across the warp
//   (float4 where C % 4 == 0, when KU = K*K*C).
#ifndef SHORT_ROW
#define SHORT_ROW 64
#endif

extern "C" __global__ void unroll_kernel3(const float* __restrict__ x, float* __restrict__ u,
                                          int n, int H, int W, int C, int K, int KU) {
    const int Ho = H - K + 1, Wo = W - K + 1;
    const int P = n * Ho * Wo, run = K * C, lane = threadIdx.x % 32;
    if (KU <= SHORT_ROW) {
        __shared__ int offset[SHORT_ROW];  // of row value r from the window's first input value; -1: padding
        for (int r = threadIdx.x; r < KU; r += blockDim.x)
            offset[r] = r < K * run ? (r / run) * W * C + r % run : -1;
        __syncthreads();
        const int lanes = KU <= 32 ? 8 : 16, r4 = lane % lanes;  // lanes a row: one float4 each
        const int rows = gridDim.x * blockDim.x / lanes;
        for (int p = (blockIdx.x * blockDim.x + threadIdx.x) / lanes; p < P; p += rows) {
            if (4 * r4 >= KU) continue;
            const int img = p / (Ho * Wo), q = p - img * (Ho * Wo);
            const int oh = q / Wo, ow = q - oh * Wo;
            const float* src = x + ((size_t)(img * H + oh) * W + ow) * C;
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = offset[4 * r4 + i] >= 0 ? __ldg(src + offset[4 * r4 + i]) : 0.0f;
            reinterpret_cast<float4*>(u + (size_t)p * KU)[r4] = make_float4(v[0], v[1], v[2], v[3]);
        }
        return;
    }
    const int warps = gridDim.x * blockDim.x / 32;
    for (int p = (blockIdx.x * blockDim.x + threadIdx.x) / 32; p < P; p += warps) {
        const int img = p / (Ho * Wo), q = p - img * (Ho * Wo);
        const int oh = q / Wo, ow = q - oh * Wo;
        const float* src = x + ((size_t)(img * H + oh) * W + ow) * C;
        float* dst = u + (size_t)p * KU;
        if (C % 4 == 0) {
            const int run4 = run / 4;
            for (int e = lane, kh = 0, j = lane; e < KU / 4; e += 32, j += 32) {
                while (j >= run4) j -= run4, ++kh;
                reinterpret_cast<float4*>(dst)[e] = __ldg(reinterpret_cast<const float4*>(src + (size_t)kh * W * C) + j);
            }
        } else {
            for (int r = lane, kh = 0, j = lane; r < KU; r += 32, j += 32) {
                while (j >= run && kh < K) j -= run, ++kh;
                dst[r] = kh < K ? __ldg(src + (size_t)kh * W * C + j) : 0.0f;
            }
        }
    }
}
