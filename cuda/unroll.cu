// unroll (im2col) of a chunk of images for the classic GEMM convolution.
// in:  x (n, H, W, C) float32, NHWC
// out: u (K*K*C, n*Ho*Wo) row-major: row r = (kh, kw, c), column p = (img, oh, ow); Ho = H-K+1
// unroll_kernel1: one thread per element of u, consecutive threads on consecutive p (coalesced
//   stores, reads strided by C); grid ceil(K*K*C*P / 256) x 256; moves 4 * K*K*C*P bytes out.

extern "C" __global__ void unroll_kernel1(const float* __restrict__ x, float* __restrict__ u,
                                          int n, int H, int W, int C, int K) {
    const int Ho = H - K + 1, Wo = W - K + 1;
    const int P = n * Ho * Wo;
    const int total = K * K * C * P;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int r = i / P, p = i - r * P;
        const int kh = r / (K * C), kw = (r / C) % K, c = r % C;
        const int img = p / (Ho * Wo), q = p - img * (Ho * Wo);
        const int oh = q / Wo, ow = q - oh * Wo;
        u[i] = x[((img * H + oh + kh) * W + ow + kw) * C + c];
    }
}
