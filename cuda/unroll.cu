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
//   start 16-byte aligned). One warp per row, lanes along it; row segment kh is one contiguous run
//   of K*C input floats, so loads and stores are both contiguous across the warp (float4 where
//   C % 4 == 0, when KU = K*K*C); block 256 = 8 rows, grid-stride; moves 4 * KU * P bytes out.
extern "C" __global__ void unroll_kernel3(const float* __restrict__ x, float* __restrict__ u,
                                          int n, int H, int W, int C, int K, int KU) {
    const int Ho = H - K + 1, Wo = W - K + 1;
    const int P = n * Ho * Wo, run = K * C, lane = threadIdx.x % 32;
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
