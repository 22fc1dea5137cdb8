// Tensor-core and async-copy helpers for the 3xTF32 kernels (sm_80 and later): each FP32 operand
// v is split into a TF32 part hi and a TF32 remainder lo; a.b ~ lo(a).hi(b) + hi(a).lo(b) + hi(a).hi(b)
// keeps FP32-level accuracy (the dropped lo.lo term is below FP32 rounding).
#pragma once

// v as its TF32 part and TF32 remainder, in three instructions. The tensor cores read only the top 19
// bits of a TF32 operand (they truncate), so v's own bits are its part, trunc(v), and an inf or NaN
// in v stays in it; the remainder v - trunc(v) is exact in FP32, and adding half a TF32 ulp to its
// bits makes the truncation round it to nearest. (cvt.rna.tf32.f32 is four instructions on sm_90,
// an inf/NaN guard among them: the split took nine.) Measured error of a product: as the rounded
// split's, both a third of an FP32 dot product's own (tools/split_error.py).
__device__ __forceinline__ void split(float v, unsigned& hi, unsigned& lo) {
    hi = __float_as_uint(v);
    lo = __float_as_uint(v - __uint_as_float(hi & 0xffffe000u)) + 0x1000u;
}

// The A fragment of an m16n8k8 step from a row-major tile in shared memory, split: `a` points at
// (row g, k tig) of the step, rows `stride` floats apart; rows g, g + 8 x k tig, tig + 4.
__device__ __forceinline__ void a_fragment(const float* a, int stride, unsigned (&hi)[4], unsigned (&lo)[4]) {
    const float v[4] = {a[0], a[8 * stride], a[4], a[8 * stride + 4]};
#pragma unroll
    for (int r = 0; r < 4; ++r) split(v[r], hi[r], lo[r]);
}

// The B fragments of NT n-tiles (8 columns apart) of an m16n8k8 step from a k-major tile in shared
// memory, split: `b` points at (k tig, column g) of the step, k rows `stride` floats apart.
template <int NT>
__device__ __forceinline__ void b_fragments(const float* b, int stride, unsigned (&hi)[NT][2], unsigned (&lo)[NT][2]) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        split(b[j * 8], hi[j][0], lo[j][0]);
        split(b[4 * stride + j * 8], hi[j][1], lo[j][1]);
    }
}

// d += a . b for one m16n8k8 tile, TF32 operands, FP32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a . b in 3xTF32, smallest products first.
__device__ __forceinline__ void mma3(float (&d)[4], const unsigned (&ahi)[4], const unsigned (&alo)[4],
                                     unsigned bhi0, unsigned bhi1, unsigned blo0, unsigned blo1) {
    mma(d, alo, bhi0, bhi1);
    mma(d, ahi, blo0, blo1);
    mma(d, ahi, bhi0, bhi1);
}

// acc += a . b in 3xTF32 through fresh accumulators, added to acc with an IEEE FP32 add: the tensor
// cores add into their accumulators rounding toward zero, a bias that grows with the length of the
// sum (relative 2^-23 per mma); starting each k-step from zero keeps long sums (large K) at FP32 level.
__device__ __forceinline__ void mma3_add(float (&acc)[4], const unsigned (&ahi)[4], const unsigned (&alo)[4],
                                         unsigned bhi0, unsigned bhi1, unsigned blo0, unsigned blo1) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma3(d, ahi, alo, bhi0, bhi1, blo0, blo1);
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[r] += d[r];
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// Asynchronous global -> shared copies; `valid` false writes zeros and reads nothing.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }
