// c-blosc chunks (format 2, codec lz4: hdf5plugin's Blosc filter) decoded on the GPU, each into its
// own output of chunk_bytes, still shuffled as stored. A chunk: a 16-byte header (checked by the host),
// each block's start, then per block its streams (one per value byte where c-blosc split the block,
// else one), each a 4-byte size and an LZ4 block (sequences of a token, literals, a 2-byte offset and a
// match), or the bytes as they are where that size is the stream's. Arguments: arrays of `count`
// chunk starts, stored sizes (0: a chunk to skip) and outputs (uint64); the lowest chunk (first + its index) whose framing
// or streams are damaged, read past their end or decode to other sizes goes into bad[0].
// blosc_lz4_kernel2: a warp per (chunk, block, value byte), WARPS warps a block. It finds its stream in
//   the framing (the block's start, then the sizes of the streams before it) and decodes it, every
//   lane parsing the same tokens: the stream read 32 bytes a load into a window of 64 bytes in two
//   registers a lane, the next 32 loaded as the parse enters the second half, so a sequence's token,
//   offset, length bytes and literals (most sequences: 1 + 0-14 + 2 bytes) come from shuffles, not
//   loads; longer literal runs and length extensions read device memory. Literals are stored 32 bytes
//   a step; the last WIN_BYTES of output are kept in shared memory too, where matches from up to that
//   far back read their source (MNIST: 69% of them at 4 KB; the rest read the output), 32 bytes a
//   step (behind a warp barrier where a match overlaps its source; a period under 32 bytes read once
//   and repeated by shuffles). A warp whose block is not split has nothing to do past the first value
//   byte. Reads the stored bytes once, writes the output once. Shared memory: WARPS x WIN_BYTES.
//   (Version 1, each sequence's bytes loaded as the parse reaches them, is dev/cuda/lz4_early.cu.)
//
// Chunks of hdf5plugin's LZ4 filter and of the Bitshuffle filter (lz4), decoded the same way, each into
// its own output (Bitshuffle's still bitshuffled). A chunk, big-endian: its decoded size (8 bytes), its
// blocks' decoded size (4; the last block shorter), then per block a 4-byte stored size and an LZ4
// block (LZ4's filter: the bytes as they are where that size is the block's), then (Bitshuffle: the
// values past a block's last multiple of 8) `tail` bytes as they are. Blocks are chained: a block's
// start is known only once the sizes before it are read, hence two kernels.
// lz4_index_kernel1: a thread per chunk walks its blocks' sizes (a dependent 4-byte load each: MNIST's
//   1,000-image Bitshuffle chunk holds 383 blocks of 8 KB), writes each block's start and size into
//   `index` (2 uint32 a block), and copies the tail into place. A chunk whose sizes run past its end
//   or leave other than `tail` bytes goes into bad[0], its blocks after the damage marked unreadable.
// lz4_blocks_kernel1: a warp per (chunk, block), WARPS warps a CUDA block, decoding it as
//   blosc_lz4_kernel2 decodes a stream (lz4_window). Reads the stored bytes once, writes the output once.
//   Blosc2's chunks decode with it too: their blocks' starts are a table, which the host reads into
//   `index` (each block one stream, stored as it is where its size is the block's: `raw`).

#ifndef WARPS
#define WARPS 4
#endif
#ifndef WIN_BYTES
#define WIN_BYTES 4096u  // a warp's recent output in shared memory (kernel2; LZ4 reaches 64 KB back)
#endif
static_assert(WIN_BYTES >= 64u && (WIN_BYTES & (WIN_BYTES - 1u)) == 0, "WIN_BYTES: a power of two of at least 64");

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

// The little-endian uint32 at p (any alignment).
__host__ __device__ __forceinline__ u64 le32(const unsigned char* p) {
    return p[0] | ((unsigned)p[1] << 8) | ((unsigned)p[2] << 16) | ((unsigned)p[3] << 24);
}

// Warp w's stream: its chunk c, where its bytes are (src, size) and where they decode to (dst, cap).
// `work` false where it has none (a chunk left to the host, a block not split past its first value
// byte); `ok` false where the chunk's framing is damaged. (find_stream is a host function too, so
// tests find the streams of real chunks with it.)
struct Stream {
    int c;
    bool work, ok;
    const unsigned char* src;
    u64 size;
    unsigned char* dst;
    u64 cap;
};

__host__ __device__ Stream find_stream(const u64* chunk_ptrs, const u64* chunk_sizes, const u64* out_ptrs, int count,
                              long long chunk_bytes, long long block_bytes, int typesize, long long w) {
    Stream st{};
    const long long blocks = (chunk_bytes + block_bytes - 1) / block_bytes;
    if (w >= count * blocks * typesize) return st;
    st.c = (int)(w / (blocks * typesize));
    const int j = (int)(w % typesize);
    const long long b = w / typesize % blocks;
    const unsigned char* in = reinterpret_cast<const unsigned char*>(chunk_ptrs[st.c]);
    const u64 size = chunk_sizes[st.c];
    if (size == 0) return st;  // a chunk left to the host
    const long long bsize = b == blocks - 1 ? chunk_bytes - b * block_bytes : block_bytes;
    const bool split = !(in[2] & 0x10) && typesize <= 16 && bsize / typesize >= 128 && bsize == block_bytes;
    const int streams = split ? typesize : 1;
    if (j >= streams) return st;
    st.work = true;
    const u64 head = 16 + 4 * (u64)blocks;
    u64 pos = le32(in + 16 + 4 * b);
    bool ok = pos >= head && pos < size;
    for (int k = 0; ok && k < j; ++k) {  // the streams before this one
        ok = pos + 4 <= size && le32(in + pos) <= size - pos - 4;
        if (ok) pos += 4 + le32(in + pos);
    }
    st.ok = ok && pos + 4 <= size && le32(in + pos) <= size - pos - 4;
    if (st.ok) {
        st.cap = bsize / streams;
        st.src = in + pos + 4;
        st.size = le32(in + pos);
        st.dst = reinterpret_cast<unsigned char*>(out_ptrs[st.c]) + b * block_bytes + j * st.cap;
    }
    return st;
}

#define FULL 0xffffffffu

// kernel2's window: the stream's bytes [base, base + 64) in registers, lane j holding byte base + j
// (lo) and base + 32 + j (hi); 0 past the stream's end.
struct Window {
    const unsigned char* src;
    unsigned size, base, lo, hi;

    __device__ __forceinline__ unsigned load(unsigned i) const { return i < size ? __ldg(src + i) : 0u; }
    __device__ __forceinline__ void open(const unsigned char* s, unsigned n, int lane) {
        src = s;
        size = n;
        base = 0;
        lo = load(lane);
        hi = load(32 + lane);
    }
    // The window moved so that it holds the 32 bytes from p on (p >= base): by 32 bytes (hi becomes
    // lo; the next 32 are loaded, used only once the parse reaches them), or to p.
    __device__ __forceinline__ void seek(unsigned p, int lane) {
        if (p - base >= 64) {
            base = p;
            lo = load(p + lane);
            hi = load(p + 32 + lane);
        } else if (p - base >= 32) {
            base += 32;
            lo = hi;
            hi = load(base + 32 + lane);
        }
    }
    // Byte base + i for i < 32 (the same in every lane): lo only, so no wait on hi's load.
    __device__ __forceinline__ unsigned first(unsigned i) const { return __shfl_sync(FULL, lo, i); }
    // Byte base + i for the lane's own i < 64; `both` (the same in every lane): whether any lane's i
    // reaches hi.
    __device__ __forceinline__ unsigned at(unsigned i, bool both) const {
        const unsigned a = __shfl_sync(FULL, lo, i & 31u);
        if (!both) return a;
        const unsigned b = __shfl_sync(FULL, hi, i & 31u);
        return i < 32 ? a : b;
    }
};

// A length's extension whose bytes start at p (base + k, k < 32): from the window's lo while it
// holds them, else from memory (extend); false where it runs past the stream's end or cap.
__device__ __forceinline__ bool extend_window(const Window& w, unsigned k, unsigned& p, unsigned& len, unsigned cap,
                                              int lane) {
    const unsigned a = __shfl_sync(FULL, w.lo, (k + lane) & 31u), e = k + lane < 32 ? a : 255u;
    const unsigned stop = __ballot_sync(FULL, e != 255u);
    if (stop) {
        const int j = __ffs(stop) - 1;
        len += 255u * j + __shfl_sync(FULL, e, j);
        p += j + 1;
        return p <= w.size;
    }
    u64 pos = p + (32 - k), total = len + 255ull * (32 - k);
    if (!extend(w.src, pos, w.size, total, lane) || total > cap) return false;
    p = (unsigned)pos;
    len = (unsigned)total;
    return true;
}

// kernel2's windows of output: each warp's last WIN_BYTES bytes, where a match under WIN_BYTES back
// reads its source (a file-scope array, so its addresses are plain shared ones).
__shared__ unsigned char lz4_window_bytes[WARPS][WIN_BYTES];

// kernel2's output: stored to dst and to the warp's window.
struct Output {
    unsigned char* dst;
    unsigned warp;
    __device__ __forceinline__ void put(unsigned i, unsigned v) {
        lz4_window_bytes[warp][i & (WIN_BYTES - 1u)] = (unsigned char)v;
        dst[i] = (unsigned char)v;
    }
    __device__ __forceinline__ unsigned get(unsigned i, bool near) const {
        return near ? lz4_window_bytes[warp][i & (WIN_BYTES - 1u)] : dst[i];
    }
};

// A match of len bytes from dist back, at out (after a __syncwarp: its source stored).
__device__ __forceinline__ void copy_match(Output& o, unsigned out, unsigned dist, unsigned len, int lane) {
    const bool near = dist <= WIN_BYTES;  // a step overwrites only window bytes more than dist back
    if (dist < 32) {  // the period read once (lane j < dist: its byte j); lane j takes byte (b + j) % dist of it
        const unsigned period = o.get(out - dist + (lane < dist ? lane : 0), near);
        unsigned r = lane % dist;
        const unsigned step = 32u % dist;
        for (unsigned b = 0; b < len; b += 32) {
            const unsigned v = __shfl_sync(FULL, period, r);
            if (b + lane < len) o.put(out + b + lane, v);
            r += step;
            if (r >= dist) r -= dist;
        }
    } else {  // a step reads bytes at least 32 back: stored by an earlier step, or before the match
        for (unsigned b = 0; b < len; b += 32) {
            if (b + lane < len) o.put(out + b + lane, o.get(out - dist + b + lane, near));
            if (len > dist) __syncwarp();
        }
    }
}

// An LZ4 block of `size` bytes at src decoded into exactly `cap` bytes at dst (streams and outputs
// under 2 GB; `raw`: a block whose size is cap's is stored as it is), the output kept in the warp's
// window too; false where it is damaged. Most sequences (no length past its token, at most 14
// literals, an offset following) take the first branch: their bytes lie in the window.
__device__ bool lz4_window(const unsigned char* src, unsigned size, unsigned char* dst, unsigned cap, bool raw,
                           unsigned warp, int lane) {
    if (raw && size == cap) {  // stored as it is
        for (unsigned i = lane; i < size; i += 32) dst[i] = src[i];
        return true;
    }
    Window w;
    w.open(src, size, lane);
    Output o{dst, warp};
    unsigned pos = 0, out = 0;
    while (pos < size) {
        w.seek(pos, lane);
        const unsigned k = pos - w.base;  // < 32
        const unsigned token = w.first(k);
        unsigned lit = token >> 4, len = token & 15u;
        if (lit < 15 && len < 15 && lit + 3 <= size - pos) {  // its bytes: [k, k + lit + 3), within 48
            const unsigned v = w.at(k + 1 + lane, k + lit + 3 > 32);
            const unsigned dist = __shfl_sync(FULL, v, lit) | __shfl_sync(FULL, v, lit + 1) << 8;
            len += 4;
            if (lit + len > cap - out || dist == 0 || dist > out + lit) return false;
            if (lane < lit) o.put(out + lane, v);
            out += lit;
            pos += lit + 3;
            __syncwarp();  // the literals stored before the match reads them
            copy_match(o, out, dist, len, lane);
            out += len;
            continue;
        }
        unsigned p = pos + 1;
        if (lit == 15) {
            w.seek(p, lane);
            if (!extend_window(w, p - w.base, p, lit, cap, lane)) return false;
        }
        if (lit > size - p || lit > cap - out) return false;
        for (unsigned i = 0; i < lit; i += 32) {  // from the window where the step's bytes lie in it
            const unsigned q = p + i - w.base, n = min(lit - i, 32u);
            unsigned v;
            if (q + n <= 64)
                v = w.at(q + lane, q + n > 32);
            else
                v = lane < n ? __ldg(src + p + i + lane) : 0u;
            if (lane < n) o.put(out + i + lane, v);
        }
        p += lit;
        out += lit;
        if (p == size) break;  // the last sequence: literals only
        if (size - p < 2) return false;
        w.seek(p, lane);
        const unsigned at = p - w.base;
        const unsigned dist = w.first(at) | (at < 31 ? w.first(at + 1) : __shfl_sync(FULL, w.hi, 0)) << 8;
        p += 2;
        if (len == 15) {
            w.seek(p, lane);
            if (!extend_window(w, p - w.base, p, len, cap, lane)) return false;
        }
        len += 4;
        if (dist == 0 || dist > out || len > cap - out) return false;
        __syncwarp();  // the bytes a match reads, stored by any lane, before it reads them
        copy_match(o, out, dist, len, lane);
        out += len;
        pos = p;
    }
    return out == cap;
}

extern "C" __global__ void __launch_bounds__(32 * WARPS) blosc_lz4_kernel2(const u64* __restrict__ chunk_ptrs,
                                                                          const u64* __restrict__ chunk_sizes,
                                                                          const u64* __restrict__ out_ptrs, int count,
                                                                          long long chunk_bytes, long long block_bytes,
                                                                          int typesize, int first, int* __restrict__ bad) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const Stream st = find_stream(chunk_ptrs, chunk_sizes, out_ptrs, count, chunk_bytes, block_bytes, typesize,
                                  (long long)blockIdx.x * WARPS + warp);
    if (!st.work) return;
    const bool ok = st.ok && st.size < (1ull << 31) && st.cap < (1ull << 31)
                    && lz4_window(st.src, (unsigned)st.size, st.dst, (unsigned)st.cap, true, warp, lane);
    if (!ok && lane == 0) atomicMin(bad, first + st.c);
}

// The big-endian uint32 at p (any alignment).
__host__ __device__ __forceinline__ unsigned be32(const unsigned char* p) {
    return (unsigned)p[0] << 24 | (unsigned)p[1] << 16 | (unsigned)p[2] << 8 | p[3];
}

#define UNREADABLE 0xffffffffu  // an index size: the block is not decoded (its chunk is damaged)

// A chunk of `size` bytes at `in` walked: each of its `blocks` blocks' start and stored size into
// at_k (2 uint32 a block), UNREADABLE from a block whose size runs past the chunk's end on; true
// where the sizes leave exactly `tail` bytes. (lz4_index_kernel1's thread; a host function too, so
// tests walk real chunks with it.)
__host__ __device__ inline bool lz4_walk(const unsigned char* in, u64 size, int blocks, int tail, unsigned* at_k) {
    u64 at = 12;
    int k = 0;
    for (; k < blocks; ++k) {
        if (size < at || size - at < 4) break;
        const u64 stored = be32(in + at);
        at += 4;
        if (stored > size - at) break;
        at_k[2 * k] = (unsigned)at;
        at_k[2 * k + 1] = (unsigned)stored;
        at += stored;
    }
    if (k == blocks) return size - at == (u64)tail;
    for (; k < blocks; ++k) at_k[2 * k + 1] = UNREADABLE;
    return false;
}

extern "C" __global__ void lz4_index_kernel1(const u64* __restrict__ chunk_ptrs, const u64* __restrict__ chunk_sizes,
                                             const u64* __restrict__ out_ptrs, int count, long long chunk_bytes,
                                             int blocks, int tail, unsigned* __restrict__ index, int first,
                                             int* __restrict__ bad) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= count) return;
    const u64 size = chunk_sizes[c];  // (the host checked the 12-byte header; 0: a chunk left to the host)
    if (size == 0) return;
    const unsigned char* in = reinterpret_cast<const unsigned char*>(chunk_ptrs[c]);
    if (!lz4_walk(in, size, blocks, tail, index + 2ull * blocks * c)) {
        atomicMin(bad, first + c);
        return;
    }
    unsigned char* out = reinterpret_cast<unsigned char*>(out_ptrs[c]) + chunk_bytes - tail;
    for (int i = 0; i < tail; ++i) out[i] = in[size - tail + i];
}

extern "C" __global__ void __launch_bounds__(32 * WARPS) lz4_blocks_kernel1(const u64* __restrict__ chunk_ptrs,
                                                                           const u64* __restrict__ chunk_sizes,
                                                                           const u64* __restrict__ out_ptrs, int count,
                                                                           long long block_bytes, int blocks,
                                                                           long long last_bytes, int raw,
                                                                           const unsigned* __restrict__ index,
                                                                           int first, int* __restrict__ bad) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long w = (long long)blockIdx.x * WARPS + warp;
    if (w >= (long long)count * blocks) return;
    const int c = (int)(w / blocks), k = (int)(w % blocks);
    if (chunk_sizes[c] == 0) return;
    const unsigned at = index[2 * w], size = index[2 * w + 1];
    if (size == UNREADABLE) return;  // (lz4_index_kernel1 flagged the chunk)
    const long long cap = k == blocks - 1 ? last_bytes : block_bytes;
    const unsigned char* src = reinterpret_cast<const unsigned char*>(chunk_ptrs[c]) + at;
    unsigned char* dst = reinterpret_cast<unsigned char*>(out_ptrs[c]) + k * block_bytes;
    const bool ok = size < (1u << 31) && cap < (1ll << 31) && lz4_window(src, size, dst, (unsigned)cap, raw, warp, lane);
    if (!ok && lane == 0) atomicMin(bad, first + c);
}
