// placeIntoY: the conv GEMM's output (C_out, P) re-laid into NHWC (P, C_out), i.e. a transpose.
// place_kernel1: 32x32 tiles through shared memory (padded against bank conflicts), one element
//   per thread, reads and writes both coalesced; block 32x32, grid (ceil(P/32), ceil(C_out/32));
//   moves 8 * C_out * P bytes.

#define PLACE_TILE 32

extern "C" __global__ void place_kernel1(const float* __restrict__ y, float* __restrict__ out,
                                         int C_out, int P) {
    __shared__ float t[PLACE_TILE][PLACE_TILE + 1];
    const int p = blockIdx.x * PLACE_TILE + threadIdx.x, m = blockIdx.y * PLACE_TILE + threadIdx.y;
    if (m < C_out && p < P) t[threadIdx.y][threadIdx.x] = y[(size_t)m * P + p];
    __syncthreads();
    const int p2 = blockIdx.x * PLACE_TILE + threadIdx.y, m2 = blockIdx.y * PLACE_TILE + threadIdx.x;
    if (m2 < C_out && p2 < P) out[(size_t)p2 * C_out + m2] = t[threadIdx.x][threadIdx.y];
}
