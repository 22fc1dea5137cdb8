// Hopper warpgroup MMA (wgmma, sm_90a) helpers for the 3xTF32 kernels: B operands in shared memory
// as K-major core matrices without swizzle, laid out by the host (pipelines.wgmma_operand); A from
// registers, split into TF32 parts and remainders per k8 step (mma.cuh).
#pragma once

#include "common.cuh"
#include "mma.cuh"

// Matrix descriptor of a K-major operand in shared memory without swizzle: core matrices of 8 rows x
// 16 bytes; the next 4 k 128 bytes on (leading byte offset), the next 8 rows 256 bytes on (stride).
// lbo, sbo: other strides (bytes, multiples of 16), for operands laid out otherwise.
__device__ __forceinline__ unsigned long long wgmma_desc(const float* p, unsigned lbo = 128, unsigned sbo = 256) {
    return (unsigned long long)((smem_addr(p) & 0x3FFFF) >> 4) | (unsigned long long)(lbo >> 4) << 16 | (unsigned long long)(sbo >> 4) << 32;
}

// A descriptor's low word (address and LBO), to be made once outside a loop: an offset of f floats
// (a multiple of 4) within shared memory is + f / 4 to it (no carry out of the address field, the
// shared window ending below 2^18 bytes); desc(lo, sbo) is the whole descriptor. Rebuilt from
// pointers at every MMA they cost the certified pass's fused kernel ~8% of its time (fused_kernel3, 4 and certify_kernel3
// measured the same either way).
__device__ __forceinline__ unsigned desc_lo(const float* p, unsigned lbo = 128) { return (unsigned)wgmma_desc(p, lbo); }
__device__ __forceinline__ unsigned long long desc(unsigned lo, unsigned sbo = 256) {
    return (unsigned long long)(sbo >> 4) << 32 | lo;
}

// d = a . b (+ d where accumulate) for the warpgroup's 64 x N tile, k = 8: a (TF32) in registers, b
// in shared memory. N = 64:
__device__ __forceinline__ void wgmma(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
        "%31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// N = 128:
__device__ __forceinline__ void wgmma(float (&d)[64], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// N = 32:
__device__ __forceinline__ void wgmma(float (&d)[16], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// N = 16:
__device__ __forceinline__ void wgmma(float (&d)[8], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
        "%12, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// One k8 step of MT tiles in 3xTF32: A values av[i] = rows (g, k), (g + 8, k), (g, k + 4), (g + 8, k
// + 4) of tile i, split here; bhi, blo: the descriptors of the step's weight parts and remainders. The
// three products smallest first; `first` starts the sums. Commits the step as one group and lets the
// previous one finish (IN_FLIGHT 1), or this one too (0: no registers held across steps).
template <int MT, int NACC, int IN_FLIGHT = 1>
__device__ __forceinline__ void mma3_step(float (&acc)[MT][NACC], const float (&av)[MT][4], unsigned long long bhi,
                                          unsigned long long blo, bool first) {
    unsigned hi[MT][4], lo[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) split(av[i][r], hi[i][r], lo[i][r]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        wgmma(acc[i], lo[i], bhi, !first);
        wgmma(acc[i], hi[i], blo, 1);
        wgmma(acc[i], hi[i], bhi, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(IN_FLIGHT) : "memory");
}

// The same with b the step's parts in shared memory, its remainders 8 * N floats on.
template <int MT, int NACC, int IN_FLIGHT = 1>
__device__ __forceinline__ void mma3_step(float (&acc)[MT][NACC], const float (&av)[MT][4], const float* b, bool first) {
    mma3_step<MT, NACC, IN_FLIGHT>(acc, av, wgmma_desc(b), wgmma_desc(b + 8 * (NACC * 2)), first);
}

// The warpgroup's m64 x (NACC / 2) accumulator tile into shared memory as float2 pairs: row r
// (16 w + g, + 8) at dst + r * stride floats, columns 8 c + 2 tig.
template <int NACC>
__device__ __forceinline__ void store_tile(float* dst, int stride, const float (&acc)[NACC]) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32 % 4, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int c = 0; c < NACC / 4; ++c)
#pragma unroll
        for (int dy = 0; dy < 2; ++dy)
            *reinterpret_cast<float2*>(dst + (16 * w + g + 8 * dy) * stride + 8 * c + 2 * tig) =
                make_float2(acc[4 * c + 2 * dy], acc[4 * c + 2 * dy + 1]);
}

__device__ __forceinline__ void wgmma_drain() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Commit the MMAs just issued as a group and wait for the group before it, whose A fragments from
// registers (`done`) may be overwritten only now: an MMA reads its A registers after it is issued,
// until a wait covers it, and ptxas does not know that (it reused them without a warning). The empty
// asm keeps `done` live up to here, so a rolled loop alternates two fragment sets (certify_kernel3,
// fused_kernel6).
template <int FRAGS>
__device__ __forceinline__ void wgmma_commit_wait_previous(const unsigned (&done)[FRAGS][4]) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
#pragma unroll
    for (int f = 0; f < FRAGS; ++f) asm volatile("" :: "r"(done[f][0]), "r"(done[f][1]), "r"(done[f][2]), "r"(done[f][3]));
}

// The k loop of a warpgroup's m64 x COLS tile (MT = 1) in 3xTF32 whose NSTAGES pipeline stages of
// STAGE_SIZE floats hold A_SIZE floats (an A tile, or nothing) then the k-tile's weight parts and
// remainders: fetch(tile) starts the copies of k-tile `tile` into its stage; load_a(stage, tile, ks,
// av) gives this thread's A values of k8 step ks (rows g, g + 8 x k tig, tig + 4); b_off is its
// warpgroup's weights past the A tile (fc_kernel6's two column blocks). Tiles are fetched AHEAD ahead
// (2, or 1 with 3 stages), so the stage refilled was last read by tile - 2's MMAs or earlier, which
// every warpgroup has finished (each k8 step waits for the one before it): no drain per tile. Groups
// of copies committed before the loop have landed by its first tile. CHUNK k-tiles are summed in the
// tensor cores, then added to acc in FP32 (the tensor cores' accumulation rounds toward zero). Nested
// loops on purpose: with one flat loop and the FP32 add under a condition, ptxas injects a warpgroup
// wait at every back-edge (C7517). HOIST: the weights' descriptors made once, a step adding its offset
// (conv_kernel4; the other kernels measured level either way).
template <int COLS, int TK, int NSTAGES, int CHUNK, int A_SIZE, int STAGE_SIZE, int AHEAD, bool HOIST = false, class Fetch,
          class LoadA>
__device__ __forceinline__ void mma3_k_loop_with(float (&acc)[1][COLS / 2], const float* stages, int tiles, Fetch fetch,
                                                 LoadA load_a, int b_off = 0) {
    static_assert(NSTAGES >= AHEAD + 2, "mma3_k_loop: the stage refilled must be two tiles old");
#pragma unroll
    for (int a = 0; a < AHEAD; ++a) {
        if (a < tiles) fetch(a);
        cp_async_commit();
    }
    float d[1][COLS / 2];
    const unsigned b_lo = desc_lo(stages + A_SIZE + b_off);
    for (int c0 = 0; c0 < tiles; c0 += CHUNK) {
        for (int tile = c0; tile < min(tiles, c0 + CHUNK); ++tile) {
            // Tile `tile` has landed (ours; the proxy fence hands it to the tensor cores, the barrier
            // makes everyone's visible).
            cp_async_wait<AHEAD - 1>();
            asm volatile("fence.proxy.async.shared::cta;");
            __syncthreads();
            if (tile + AHEAD < tiles) fetch(tile + AHEAD);
            cp_async_commit();
            const float* stage = stages + (tile % NSTAGES) * STAGE_SIZE;
#pragma unroll
            for (int ks = 0; ks < TK / 8; ++ks) {
                float av[1][4];
                load_a(stage, tile, ks, av[0]);
                if (HOIST) {  // offsets in 16-byte units
                    const unsigned lo = b_lo + ((tile % NSTAGES) * STAGE_SIZE + ks * 16 * COLS) / 4;
                    mma3_step(d, av, desc(lo), desc(lo + 8 * COLS / 4), tile == c0 && ks == 0);
                } else {
                    mma3_step(d, av, stage + A_SIZE + b_off + ks * 16 * COLS, tile == c0 && ks == 0);
                }
            }
        }
        wgmma_drain();  // the chunk's sums, added in FP32
#pragma unroll
        for (int r = 0; r < COLS / 2; ++r) acc[0][r] = c0 == 0 ? d[0][r] : acc[0][r] + d[0][r];
    }
    cp_async_wait<0>();
}

// mma3_k_loop_with an A tile in each stage, rows ASTRIDE apart, TK k: a_row is this thread's A
// fragment offset in a stage.
template <int COLS, int TK, int NSTAGES, int CHUNK, int ASTRIDE, int A_SIZE, int STAGE_SIZE, int AHEAD = 2, class Fetch>
__device__ __forceinline__ void mma3_k_loop(float (&acc)[1][COLS / 2], const float* stages, int a_row, int tiles, Fetch fetch,
                                            int b_off = 0) {
    mma3_k_loop_with<COLS, TK, NSTAGES, CHUNK, A_SIZE, STAGE_SIZE, AHEAD>(acc, stages, tiles, fetch,
        [&](const float* stage, int, int ks, float (&av)[4]) {
            const float* as = stage + a_row;
            av[0] = as[8 * ks];
            av[1] = as[8 * ASTRIDE + 8 * ks];
            av[2] = as[8 * ks + 4];
            av[3] = as[8 * ASTRIDE + 8 * ks + 4];
        }, b_off);
}

// A tile's rows are (pool window, dx, dy): accumulator 4c + 2dy + e is channel 8c + 2 tig + e. ReLU and
// the 2x2 average of channels 8c + 2 tig + {0, 1} in the reference's order ((a + b) + c) + d, the
// dx = 1 half taken from lane + 4; valid in the even lanes (dx = 0).
template <int NACC>
__device__ __forceinline__ float2 pool_pair(const float (&acc)[NACC], int c) {
    float o[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const float a = relu(acc[4 * c + e]), cc = relu(acc[4 * c + 2 + e]);
        const float b = __shfl_down_sync(0xffffffffu, a, 4);
        const float d = __shfl_down_sync(0xffffffffu, cc, 4);
        o[e] = (((a + b) + cc) + d) * 0.25f;
    }
    return make_float2(o[0], o[1]);
}

// Float16 operands, float32 sums (fused_kernel4's conv2, certify_kernel1): d = a . b (+ d where
// accumulate) for the warpgroup's 64 x N tile, k = 16: a in registers, 4 x 2 halves per thread (rows
// g and g + 8 of its warp's 16, k 2 tig + {0, 1} then + 8), b K-major core matrices in shared memory
// (8 rows x 8 halves: the same 16-byte rows and descriptor as TF32's 4 k). N = 128:
__device__ __forceinline__ void wgmma16(float (&d)[64], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// N = 64:
__device__ __forceinline__ void wgmma16(float (&d)[32], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// N = 32:
__device__ __forceinline__ void wgmma16(float (&d)[16], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// N = 160, A also K-major core matrices in shared memory (descriptor a):
__device__ __forceinline__ void wgmma16_ss(float (&d)[80], unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n160k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, "
        "%80, %81, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
        : "l"(a), "l"(b), "r"(accumulate));
}

// N = 64, A from shared memory too:
__device__ __forceinline__ void wgmma16_ss(float (&d)[32], unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate));
}

// N = 128, A from shared memory too:
__device__ __forceinline__ void wgmma16_ss(float (&d)[64], unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(accumulate));
}

// N = 80, A from shared memory too:
__device__ __forceinline__ void wgmma16_ss(float (&d)[40], unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, "
        "%40, %41, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
        : "l"(a), "l"(b), "r"(accumulate));
}

// N = 32, A from shared memory too:
__device__ __forceinline__ void wgmma16_ss(float (&d)[16], unsigned long long a, unsigned long long b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b), "r"(accumulate));
}
