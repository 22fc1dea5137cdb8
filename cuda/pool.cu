// 2x2 average pool ("subsample"), stride 2, over a whole chunk of NHWC images; odd sizes floored.
// in (n, H, W, C) -> out (n, H/2, W/2, C); each output ((a + b) + c) + d times 0.25, the NumPy
// reference's order, so results are bit-identical to it.
// pool_kernel1: one thread per output, consecutive threads on consecutive channels (coalesced);
//   grid ceil(n*H/2*W/2*C / 256) x 256; moves 4 * (4 + 1) * outputs bytes.

extern "C" __global__ void pool_kernel1(const float* __restrict__ in, float* __restrict__ out,
                                        int n, int H, int W, int C) {
    const int Ho = H / 2, Wo = W / 2;
    const int total = n * Ho * Wo * C;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int c = i % C, q = i / C;
        const int ow = q % Wo, oh = (q / Wo) % Ho, img = q / (Wo * Ho);
        const float* s = in + ((size_t)(img * H + 2 * oh) * W + 2 * ow) * C + c;
        out[i] = (((s[0] + s[C]) + s[W * C]) + s[W * C + C]) * 0.25f;
    }
}
