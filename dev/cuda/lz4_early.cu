// The c-blosc lz4 decoder's first version (cuda/lz4.cu, whose framing (find_stream) and length
// extensions (extend) it includes; built with -I cuda), kept to validate and time beside the
// product's blosc_lz4_kernel2 (dev/cuda/lz4_early.py, tests/test_gpu_lz4.py). Arguments: lz4.cu's.
// blosc_lz4_kernel1: kernel2's warps and framing; a sequence's token, lengths' bytes, literals and
//   offset each loaded from device memory as the parse reaches them (several dependent loads a
//   sequence), its matches read from the output already stored. Replaced by version 2 (H200, 1M
//   images in 1,024-image chunks: about as fast, 89.9-94.6 ms against 87.9-90.3; in 1,000-image
//   chunks, whose last block is one stream of 514 KB, 115.6-118.0 against 105.0-105.8).

#include "lz4.cu"

// An LZ4 block of `size` stored bytes decoded into dst: true where it decodes to exactly cap bytes,
// using all its bytes.
__device__ bool lz4_stream(const unsigned char* src, u64 size, unsigned char* dst, u64 cap, int lane) {
    if (size == cap) {  // stored as it is
        for (u64 i = lane; i < size; i += 32) dst[i] = src[i];
        return true;
    }
    u64 pos = 0, out = 0;
    while (pos < size) {
        const unsigned token = src[pos++];
        u64 lit = token >> 4;
        if (lit == 15 && !extend(src, pos, size, lit, lane)) return false;
        if (lit > size - pos || lit > cap - out) return false;
        for (u64 i = lane; i < lit; i += 32) dst[out + i] = src[pos + i];
        pos += lit;
        out += lit;
        if (pos == size) break;  // the last sequence: literals only
        if (size - pos < 2) return false;
        const unsigned dist = src[pos] | ((unsigned)src[pos + 1] << 8);
        pos += 2;
        u64 len = token & 15u;
        if (len == 15 && !extend(src, pos, size, len, lane)) return false;
        len += 4;
        if (dist == 0 || dist > out || len > cap - out) return false;
        __syncwarp();  // the bytes a match reads, stored by any lane, before it reads them
        const unsigned char* from = dst + out - dist;
        if (dist < 32) {  // lane j takes byte j % dist of the period, and 32 % dist further each step
            unsigned r = lane % dist;
            const unsigned step = 32u % dist;
            for (u64 i = lane; i < len; i += 32) {
                dst[out + i] = from[r];
                r += step;
                if (r >= dist) r -= dist;
            }
        } else {  // a step reads bytes at least 32 back: written by an earlier step
            for (u64 base = 0; base < len; base += 32) {
                if (base + lane < len) dst[out + base + lane] = from[base + lane];
                __syncwarp();
            }
        }
        out += len;
        __syncwarp();
    }
    return out == cap;
}

extern "C" __global__ void __launch_bounds__(32 * WARPS) blosc_lz4_kernel1(const u64* __restrict__ chunk_ptrs,
                                                                          const u64* __restrict__ chunk_sizes,
                                                                          const u64* __restrict__ out_ptrs, int count,
                                                                          long long chunk_bytes, long long block_bytes,
                                                                          int typesize, int first, int* __restrict__ bad) {
    const int lane = threadIdx.x % 32;
    const Stream st = find_stream(chunk_ptrs, chunk_sizes, out_ptrs, count, chunk_bytes, block_bytes, typesize,
                                  (long long)blockIdx.x * WARPS + threadIdx.x / 32);
    if (!st.work) return;
    const bool ok = st.ok && lz4_stream(st.src, st.size, st.dst, st.cap, lane);
    if (!ok && lane == 0) atomicMin(bad, first + st.c);
}

