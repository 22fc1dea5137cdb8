// c-blosc chunks (format 2, codec lz4: hdf5plugin's Blosc filter) decoded on the GPU, each into its
// own output of chunk_bytes, still shuffled as stored. A chunk: a 16-byte header (checked by the host),
// each block's start, then per block its streams (one per value byte where c-blosc split the block,
// else one), each a 4-byte size and an LZ4 block (sequences of a token, literals, a 2-byte offset and a
// match), or the bytes as they are where that size is the stream's. Arguments: arrays of `count`
// chunk starts, stored sizes (0: a chunk to skip) and outputs (uint64); the lowest chunk (first + its index) whose framing
// or streams are damaged, read past their end or decode to other sizes goes into bad[0].
// blosc_lz4_kernel1: a warp per (chunk, block, value byte), WARPS warps a block: it finds its stream
//   in the framing (the block's start, then the sizes of the streams before it) and decodes it, every
//   lane parsing the same tokens (a length's 255-bytes found by a ballot over 32 bytes at a time);
//   literals copied by the lanes 32 bytes a step, matches from the output already written (a period
//   under 32 bytes repeated lane by lane, else 32 bytes a step behind a warp barrier); a warp whose
//   block is not split has nothing to do past the first value byte. Reads the stored bytes once,
//   writes the output once, reads a match's source once.

#ifndef WARPS
#define WARPS 4
#endif

typedef unsigned long long u64;

// A length's extension (LZ4: bytes of 255 added until one that is not, which is added too) read
// from src[*pos..end); false where it runs past end.
__device__ __forceinline__ bool extend(const unsigned char* src, u64& pos, u64 end, u64& len, int lane) {
    for (;;) {
        if (pos >= end) return false;
        const unsigned byte = pos + lane < end ? src[pos + lane] : 0u;
        const unsigned stop = __ballot_sync(0xffffffffu, byte != 255u);
        if (stop) {
            const int k = __ffs(stop) - 1;
            len += 255ull * k + __shfl_sync(0xffffffffu, byte, k);
            pos += k + 1;
            return pos <= end;
        }
        len += 255ull * 32;
        pos += 32;
    }
}

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

// The little-endian uint32 at p (any alignment).
__device__ __forceinline__ u64 le32(const unsigned char* p) {
    return p[0] | ((unsigned)p[1] << 8) | ((unsigned)p[2] << 16) | ((unsigned)p[3] << 24);
}

extern "C" __global__ void __launch_bounds__(32 * WARPS) blosc_lz4_kernel1(const u64* __restrict__ chunk_ptrs,
                                                                          const u64* __restrict__ chunk_sizes,
                                                                          const u64* __restrict__ out_ptrs, int count,
                                                                          long long chunk_bytes, long long block_bytes,
                                                                          int typesize, int first, int* __restrict__ bad) {
    const long long blocks = (chunk_bytes + block_bytes - 1) / block_bytes;
    const long long w = (long long)blockIdx.x * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (w >= count * blocks * typesize) return;
    const int c = (int)(w / (blocks * typesize)), j = (int)(w % typesize);
    const long long b = w / typesize % blocks;
    const unsigned char* in = reinterpret_cast<const unsigned char*>(chunk_ptrs[c]);
    const u64 size = chunk_sizes[c];
    if (size == 0) return;  // a chunk left to the host
    const long long bsize = b == blocks - 1 ? chunk_bytes - b * block_bytes : block_bytes;
    const bool split = !(in[2] & 0x10) && typesize <= 16 && bsize / typesize >= 128 && bsize == block_bytes;
    const int streams = split ? typesize : 1;
    if (j >= streams) return;
    const u64 head = 16 + 4 * (u64)blocks;
    u64 pos = le32(in + 16 + 4 * b);
    bool ok = pos >= head && pos < size;
    for (int k = 0; ok && k < j; ++k) {  // the streams before this one
        ok = pos + 4 <= size && le32(in + pos) <= size - pos - 4;
        if (ok) pos += 4 + le32(in + pos);
    }
    ok = ok && pos + 4 <= size && le32(in + pos) <= size - pos - 4;
    if (ok) {
        const u64 part = bsize / streams;
        ok = lz4_stream(in + pos + 4, le32(in + pos), reinterpret_cast<unsigned char*>(out_ptrs[c]) + b * block_bytes + j * part,
                        part, lane);
    }
    if (!ok && lane == 0) atomicMin(bad, first + c);
}
