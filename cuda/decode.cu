// Compressed HDF5 chunks decoded on the GPU (by inflate_kernel2, into a block of whole chunks, `stride` bytes
// apart) -> checked, then placed as the images the network reads, in the stored type.
// decode_check_kernel1: one block per chunk (but those of no stored size: copied into place, not
//   decoded): the inflater's status and decoded size, then where ADLER is
//   set (zlib streams) the adler32 of the decoded bytes (A = 1 + sum d_i, B = n + sum (n - i) d_i,
//   mod 65521, summed 16 bytes a thread-step) against the 4 big-endian bytes after the deflate data;
//   the lowest failing chunk (first + index) into bad[0] (did not decode) or bad[1] (checksum).
//   Reads each decoded byte once.
// decode_check_kernel2: a thread per stream (those of no stored size: copied into place, not decoded):
//   the decoder's status, and the decoded size against the stream's own capacity (c-blosc's blocks,
//   a shorter last one); the lowest failing stream (first + index) into bad[0]. Reads 20 bytes a stream.
// unshuffle_kernel1: `values` values of VALUE_BYTES bytes from row `first` of the block on (chunks of
//   chunk_values values `stride` bytes apart, each stored byte-shuffled: byte k of every value together, HDF5's shuffle)
//   into consecutive values of dst; one value per thread, grid-stride; reads and writes
//   values * VALUE_BYTES bytes.
// blosc_unshuffle_kernel1: unshuffle_kernel1 for c-blosc's byte shuffle, done a block at a time: each
//   chunk (chunk_values values, `stride` bytes apart) in blocks of block_values values, a shorter last
//   one, each block's values stored byte-shuffled over its own length; one value per thread,
//   grid-stride; reads and writes values * VALUE_BYTES bytes.
// assemble_kernel1: chunks cutting images (HDF5 chunks of R rows x h x w x c of rows of H x W x C
//   values, a row of chunks gh x gw x gc of them, stored in that order, each decoded `stride` bytes
//   apart and, where shuffled, byte-shuffled over its R*h*w*c values) -> `rows` whole rows from row
//   `first` of the first row of chunks on, in dst; one value per thread, grid-stride (a row's value
//   indexed in 32 bits); reads and writes rows * H*W*C * VALUE_BYTES bytes, the chunks' padding past
//   the data's edges unread.
// assemble_kernel2: version 1 for c-blosc's and Bitshuffle's chunks, each value fetched from its chunk
//   as `layout` stores it: PLAIN; BYTES, byte-shuffled a block of `block` values at a time (a shorter
//   last block; HDF5's shuffle is one block a chunk); BITS, bitshuffled (bitunshuffle_kernel1's layout:
//   8 * VALUE_BYTES one-byte loads a value, a bit each, the 8 neighbours of a group in one L1 line).
//   Reads (BITS: 8x) and writes rows * H*W*C * VALUE_BYTES bytes, no unshuffled copy of the chunks.
// bitunshuffle_kernel1: chunks of chunk_values values stored back to back, each bitshuffled (the
//   Bitshuffle filter's and c-blosc's layout: blocks of `block` values, each holding bit b of its
//   values in row b, value i at bit i % 8 of the row's byte i / 8; then a shorter block of the values
//   left, down to a multiple of 8, or with exact_tail only where they are one; then the values after
//   it as they are) -> the values in dst; a thread per 8 values of a chunk (8 * VALUE_BYTES byte
//   loads, one per bit row), grid-stride; reads and writes the chunks' bytes once.
// bitunshuffle_kernel2: version 1 keeping only the `values` values from value first_value of the
//   chunks on (a block of images that starts or ends inside a chunk), written from dst[0]; reads the
//   chunks' groups holding them once.

#ifndef VALUE_BYTES
#define VALUE_BYTES 4
#endif
#define ADLER_MOD 65521u

extern "C" __global__ void decode_check_kernel1(const unsigned char* const* __restrict__ src_ptrs,
                                                const unsigned long long* __restrict__ src_bytes,
                                                const unsigned long long* __restrict__ decoded_bytes,
                                                const int* __restrict__ statuses,
                                                const unsigned char* __restrict__ decoded, long long chunk_bytes,
                                                long long stride, int adler, int first, int* __restrict__ bad) {
    const int c = blockIdx.x;
    if (src_bytes[c] == 0) return;  // stored without the codec: copied into place, not decoded
    if (statuses[c] != 0 || decoded_bytes[c] != (unsigned long long)chunk_bytes) {
        if (threadIdx.x == 0) atomicMin(bad, first + c);
        return;
    }
    if (!adler) return;
    const unsigned char* d = decoded + (long long)c * stride;
    const long long n = chunk_bytes;
    unsigned long long a = 0, b = 0, w = 0;  // sum d, sum (n - base) * (group sum) mod M, sum offset * d
    long long done = 0;
    if (n % 16 == 0) {
        const uint4* q = reinterpret_cast<const uint4*>(d);
        for (long long j = threadIdx.x; j < n / 16; j += blockDim.x) {
            const uint4 v = __ldg(q + j);
            const unsigned int words[4] = {v.x, v.y, v.z, v.w};
            unsigned int s = 0, t = 0;
#pragma unroll
            for (int k = 0; k < 16; ++k) {
                const unsigned int byte = (words[k / 4] >> (8 * (k % 4))) & 0xffu;
                s += byte;
                t += k * byte;
            }
            a += s;
            b += ((unsigned long long)(n - 16 * j) % ADLER_MOD) * s;
            w += t;
        }
        done = n;
    }
    for (long long i = done + threadIdx.x; i < n; i += blockDim.x) {
        const unsigned int byte = d[i];
        a += byte;
        b += ((unsigned long long)(n - i) % ADLER_MOD) * byte;
    }
    b = (b % ADLER_MOD + ADLER_MOD - w % ADLER_MOD) % ADLER_MOD;
    for (int off = 16; off > 0; off >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, off);
        b += __shfl_down_sync(0xffffffffu, b, off);
    }
    __shared__ unsigned long long sa[32], sb[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        sa[warp] = a;
        sb[warp] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        a = b = 0;
        for (int k = 0; k < (int)(blockDim.x + 31) / 32; ++k) {
            a += sa[k];
            b += sb[k];
        }
        const unsigned int A = (unsigned int)((1 + a) % ADLER_MOD);
        const unsigned int B = (unsigned int)((n % ADLER_MOD + b) % ADLER_MOD);
        const unsigned char* t = src_ptrs[c] + src_bytes[c];  // the zlib trailer
        const unsigned int want = ((unsigned int)t[0] << 24) | ((unsigned int)t[1] << 16) | ((unsigned int)t[2] << 8) | t[3];
        if (want != ((B << 16) | A)) atomicMin(bad + 1, first + c);
    }
}

extern "C" __global__ void decode_check_kernel2(const unsigned long long* __restrict__ src_bytes,
                                                const unsigned long long* __restrict__ capacities,
                                                const unsigned long long* __restrict__ decoded_bytes,
                                                const int* __restrict__ statuses, int count, int first,
                                                int* __restrict__ bad) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < count; c += gridDim.x * blockDim.x)
        if (src_bytes[c] != 0 && (statuses[c] != 0 || decoded_bytes[c] != capacities[c])) atomicMin(bad, first + c);
}

#if VALUE_BYTES == 1
typedef unsigned char value_t;
#elif VALUE_BYTES == 2
typedef unsigned short value_t;
#elif VALUE_BYTES == 4
typedef unsigned int value_t;
#else
typedef unsigned long long value_t;
#endif

extern "C" __global__ void unshuffle_kernel1(const unsigned char* __restrict__ decoded, value_t* __restrict__ dst,
                                             long long first_value, long long values, long long chunk_values,
                                             long long stride) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < values;
         e += (long long)gridDim.x * blockDim.x) {
        const long long at = first_value + e, c = at / chunk_values, v = at % chunk_values;
        const unsigned char* planes = decoded + c * stride + v;
        value_t out = 0;
#pragma unroll
        for (int k = 0; k < VALUE_BYTES; ++k) out |= (value_t)__ldg(planes + (long long)k * chunk_values) << (8 * k);
        dst[e] = out;
    }
}

extern "C" __global__ void blosc_unshuffle_kernel1(const unsigned char* __restrict__ decoded, value_t* __restrict__ dst,
                                                   long long first_value, long long values, long long chunk_values,
                                                   long long stride, long long block_values) {
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < values;
         e += (long long)gridDim.x * blockDim.x) {
        const long long at = first_value + e, c = at / chunk_values, v = at % chunk_values;
        const long long k = v / block_values, n = min(block_values, chunk_values - k * block_values);
        const unsigned char* planes = decoded + c * stride + k * block_values * VALUE_BYTES + (v - k * block_values);
        value_t out = 0;
#pragma unroll
        for (int b = 0; b < VALUE_BYTES; ++b) out |= (value_t)__ldg(planes + (long long)b * n) << (8 * b);
        dst[e] = out;
    }
}

// The bit-transposed values of a chunk of chunk_values bitshuffled in blocks of `block`: its whole
// blocks, then a shorter one down to a multiple of 8 values (exact_tail, c-blosc's rule: only where
// the values left are one); the values after them are stored as they are.
__host__ __device__ __forceinline__ long long bitshuffled_values(long long chunk_values, long long block,
                                                                 int exact_tail) {
    const long long full = chunk_values / block * block, rest = chunk_values - full;
    return full + (exact_tail ? (rest % 8 ? 0 : rest) : rest - rest % 8);
}

// Values [lo, hi) of the chunks (numbered across them) into dst[0..hi - lo).
__device__ __forceinline__ void bitunshuffle(const unsigned char* __restrict__ src, value_t* __restrict__ dst,
                                             long long chunks, long long chunk_values, long long block,
                                             int exact_tail, long long lo, long long hi) {
    const long long per = (chunk_values + 7) / 8;  // groups of 8 values a chunk
    const long long full = chunk_values / block * block;
    const long long shuffled = bitshuffled_values(chunk_values, block, exact_tail);
    const long long g0 = lo / chunk_values * per + lo % chunk_values / 8;  // the group holding value lo
    for (long long g = g0 + blockIdx.x * (long long)blockDim.x + threadIdx.x; g < chunks * per;
         g += (long long)gridDim.x * blockDim.x) {
        const long long c = g / per, e = g % per * 8, at = c * chunk_values;
        if (at + e >= hi) break;
        const unsigned char* in = src + at * VALUE_BYTES;
        value_t* out = dst + at - lo;  // value i of chunk c at out[i], kept where lo <= at + i < hi
        const long long a = max(e, lo - at), b = min(min(e + 8, chunk_values), hi - at);
        if (e >= shuffled) {  // the values after the last multiple of 8, as they are
            for (long long i = a; i < b; ++i) {
                value_t v = 0;
#pragma unroll
                for (int k = 0; k < VALUE_BYTES; ++k) v |= (value_t)__ldg(in + i * VALUE_BYTES + k) << (8 * k);
                out[i] = v;
            }
            continue;
        }
        const long long start = e < full ? e / block * block : full;
        const long long row = (e < full ? block : shuffled - full) / 8;
        const unsigned char* bits = in + start * VALUE_BYTES + (e - start) / 8;
        value_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
        for (int b = 0; b < 8 * VALUE_BYTES; ++b) {
            const unsigned int byte = __ldg(bits + b * row);
#pragma unroll
            for (int m = 0; m < 8; ++m) v[m] |= (value_t)((byte >> m) & 1u) << b;
        }
        if (a == e && b == e + 8) {
#pragma unroll
            for (int m = 0; m < 8; ++m) out[e + m] = v[m];
        } else {
#pragma unroll
            for (int m = 0; m < 8; ++m)
                if (e + m >= a && e + m < b) out[e + m] = v[m];
        }
    }
}

extern "C" __global__ void bitunshuffle_kernel1(const unsigned char* __restrict__ src, value_t* __restrict__ dst,
                                                long long chunks, long long chunk_values, long long block,
                                                int exact_tail) {
    bitunshuffle(src, dst, chunks, chunk_values, block, exact_tail, 0, chunks * chunk_values);
}

extern "C" __global__ void bitunshuffle_kernel2(const unsigned char* __restrict__ src, value_t* __restrict__ dst,
                                                long long chunks, long long chunk_values, long long block,
                                                int exact_tail, long long first_value, long long values) {
    bitunshuffle(src, dst, chunks, chunk_values, block, exact_tail, first_value, first_value + values);
}

enum { PLAIN = 0, BYTES = 1, BITS = 2 };  // how a chunk stores its values (assemble_kernel2's layout)

__host__ __device__ __forceinline__ unsigned char load_byte(const unsigned char* p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;  // (the CPU tests build this file for the host)
#endif
}

// Value v of a chunk of chunk_values values stored at src as `layout` says (see assemble_kernel2).
__host__ __device__ __forceinline__ value_t chunk_value(const unsigned char* src, long long v, long long chunk_values,
                                                        int layout, long long block, int exact_tail) {
    value_t out = 0;
    if (layout == BYTES) {
        const long long start = v / block * block, n = min(block, chunk_values - start);
        const unsigned char* planes = src + start * VALUE_BYTES + (v - start);
#pragma unroll
        for (int k = 0; k < VALUE_BYTES; ++k) out |= (value_t)load_byte(planes + (long long)k * n) << (8 * k);
        return out;
    }
    if (layout == BITS) {
        const long long full = chunk_values / block * block;
        const long long shuffled = bitshuffled_values(chunk_values, block, exact_tail);
        if (v < shuffled) {  // bit b of the values of a block in row b: value i at bit i % 8 of byte i / 8
            const long long start = v < full ? v / block * block : full, i = v - start;
            const long long row = (v < full ? block : shuffled - full) / 8;
            const unsigned char* bits = src + start * VALUE_BYTES + i / 8;
#pragma unroll
            for (int b = 0; b < 8 * VALUE_BYTES; ++b) out |= (value_t)((load_byte(bits + b * row) >> (i % 8)) & 1u) << b;
            return out;
        }  // (the values after the last multiple of 8: as they are)
    }
#ifdef __CUDA_ARCH__
    return __ldg(reinterpret_cast<const value_t*>(src) + v);  // (chunks start value-aligned)
#else
    return reinterpret_cast<const value_t*>(src)[v];
#endif
}

// Value e of the rows assembled (rows from row `first` of the first row of chunks on): its chunk's
// bytes at decoded + chunk * stride, value v of them.
__host__ __device__ __forceinline__ value_t assembled(const unsigned char* decoded, long long e, int H, int W, int C,
                                                      int R, int h, int w, int c, long long first, long long stride,
                                                      int layout, long long block, int exact_tail) {
    const int row_values = H * W * C;
    const int gh = (H + h - 1) / h, gw = (W + w - 1) / w, gc = (C + c - 1) / c;
    const long long r = first + e / row_values;
    const int at = (int)(e % row_values), z = at % C, x = at / C % W, y = at / (C * W);
    const long long chunk = (r / R * gh + y / h) * (long long)(gw * gc) + x / w * gc + z / c;
    const long long v = ((r % R * h + y % h) * w + x % w) * (long long)c + z % c;
    return chunk_value(decoded + chunk * stride, v, (long long)R * h * w * c, layout, block, exact_tail);
}

extern "C" __global__ void assemble_kernel1(const unsigned char* __restrict__ decoded, value_t* __restrict__ dst,
                                            int H, int W, int C, int R, int h, int w, int c, long long first,
                                            long long rows, long long stride, int shuffled) {
    const long long n = rows * H * W * C, chunk_values = (long long)R * h * w * c;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        dst[e] = assembled(decoded, e, H, W, C, R, h, w, c, first, stride, shuffled ? BYTES : PLAIN, chunk_values, 0);
}

extern "C" __global__ void assemble_kernel2(const unsigned char* __restrict__ decoded, value_t* __restrict__ dst,
                                            int H, int W, int C, int R, int h, int w, int c, long long first,
                                            long long rows, long long stride, int layout, long long block,
                                            int exact_tail) {
    const long long n = rows * H * W * C;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        dst[e] = assembled(decoded, e, H, W, C, R, h, w, c, first, stride, layout, block, exact_tail);
}
