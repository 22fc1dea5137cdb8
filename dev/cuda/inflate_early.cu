// The deflate decoder's first version (cuda/inflate.cu, whose tables, bit reader, block headers
// (read_codes) and flush it includes; built with -I cuda), kept to validate against zlib and time
// beside the product's inflate_kernel3 (dev/cuda/inflate_early.py, tests/test_inflate.py), and
// inflate_kernel2's entry (its warps are inflate.cu's). Arguments: cuda/inflate.cu's.
// inflate_kernel1: a block of one warp per stream, every lane decoding the same symbols in lockstep
//   (no shuffles): Huffman codes through tables of 2^LIT_BITS and 2^DIST_BITS entries in shared
//   memory (longer codes by inflate.cu's long_code, a lane a length; two literals a step where the bits allow; the next
//   symbol's entry looked up before this one's copy and store), tables
//   built by the 32 lanes (ballots rank each length's symbols); the stream read 32 bits at a time,
//   the next word loaded a refill ahead, no branch; literals and matches land in a window of the last
//   WINDOW bytes in shared memory (a match copied by the lanes, 32 bytes a step; one from further
//   back read from the output already stored), each finished 128-byte line stored in one coalesced
//   store: reads the stream once, writes the output about once; with 8 KB, 17 KB of shared memory
//   and 140 registers a block, twelve blocks an SM.
//   Replaced by version 2, whose parse does not wait on the copies and stores: a 3.2 MB chunk
//   alone 49 ms against 31 (H200), but 86 GB/s of output with every slot full against 65-74.

#include "inflate.cu"

struct Scratch {
    unsigned int lit[1u << LIT_BITS];
    unsigned int dist[1u << DIST_BITS];
    Canonical lit_code, dist_code;
    unsigned char lens[288 + 32];
    unsigned char mod[32][64];  // j % d: the lanes' places in a repeated pattern of d < 32 bytes
    __align__(16) unsigned char window[WINDOW];
};

extern "C" __global__ void __launch_bounds__(32) inflate_kernel1(const unsigned char* const* __restrict__ src_ptrs,
                                                                 const unsigned long long* __restrict__ src_bytes,
                                                                 const unsigned long long* __restrict__ dst_bytes,
                                                                 unsigned long long* __restrict__ actual_bytes,
                                                                 unsigned char* const* __restrict__ dst_ptrs,
                                                                 int* __restrict__ statuses) {
    __shared__ Scratch sh;
    const int c = blockIdx.x, lane = threadIdx.x;
    const unsigned char* src = src_ptrs[c];
    const long long size = (long long)src_bytes[c];
    const unsigned cap = (unsigned)min(dst_bytes[c], 0x7fffffffull);
    unsigned* out = reinterpret_cast<unsigned*>(dst_ptrs[c]);  // 4-byte aligned (chunk_decode: 256-byte strides)
    unsigned char* win = sh.window;
    for (int i = lane; i < 32 * 64; i += 32) sh.mod[i / 64][i % 64] = i / 64 ? (i % 64) % (i / 64) : 0;

    Bits in;
    in.open(src, size);
    in.seek(0);

    unsigned p = 0, flushed = 0;  // bytes decoded; bytes stored to the output (whole lines)
    int status = INFLATE_OK;
    bool last = false, fixed = false;  // fixed: the tables hold the fixed codes
    while (!last) {
        in.refill();
        if (in.consumed() + 3 > 8 * size) { status = INFLATE_BAD; break; }
        last = in.bits & 1u;
        const unsigned type = (in.bits >> 1) & 3u;
        in.drop(3);
        if (type == 0) {  // stored: LEN, ~LEN, then LEN bytes from the next byte on
            in.drop(in.count & 7);
            in.refill();
            const unsigned n = in.bits & 0xffffu;
            if (((in.bits >> 16) & 0xffffu) != (~n & 0xffffu)) { status = INFLATE_BAD; break; }
            in.drop(32);
            const long long from = in.consumed() / 8;
            if (from + n > size) { status = INFLATE_BAD; break; }
            for (unsigned base = 0; base < n && status == INFLATE_OK; base += 32) {
                if (base + lane < n) win[(p + base + lane) & (WINDOW - 1u)] = src[from + base + lane];
                __syncwarp();
                if (!flush(p + min(base + 32, n), flushed, cap, out, win, lane)) status = INFLATE_FULL;
            }
            if (status != INFLATE_OK) break;
            p += n;
            in.seek(from + n);
            continue;
        }
        if (type == 3) { status = INFLATE_BAD; break; }
        if (!read_codes(sh, in, type, fixed, lane)) { status = INFLATE_BAD; break; }
        // The next symbol's table entry is looked up as soon as its bits are known, before the work
        // on this one (a match's copy, a line's store) that does not need it.
        in.refill();
        unsigned e = lookup<LIT_BITS>(sh.lit, in.bits);
        for (;;) {  // the block's symbols; e: the next one's entry (>= 33 bits in hand)
            if (LITERAL(e)) {  // a literal (every lane writes the same byte, so each sees it), and
                in.drop(e & 15u);   // another where the table gives one for the bits left (>= 23)
                win[p & (WINDOW - 1u)] = (unsigned char)(e >> 8);
                e = lookup<LIT_BITS>(sh.lit, in.bits);
                const bool two = LITERAL(e);
                if (two) {
                    in.drop(e & 15u);
                    win[(p + 1) & (WINDOW - 1u)] = (unsigned char)(e >> 8);
                }
                p += 1 + two;
                in.refill();
                if (two) e = lookup<LIT_BITS>(sh.lit, in.bits);
                if (p - flushed >= LINE && !flush(p, flushed, cap, out, win, lane)) { status = INFLATE_FULL; break; }
                continue;
            }
            if ((e & 15u) == 0) {  // a code longer than the table, or none
                e = long_code<LITLEN>((unsigned)in.bits, e, sh.lit_code, lane);
                if (LITERAL(e)) {
                    in.drop(e & 15u);
                    win[p & (WINDOW - 1u)] = (unsigned char)(e >> 8);
                    in.refill();
                    e = lookup<LIT_BITS>(sh.lit, in.bits);
                    if (++p - flushed >= LINE && !flush(p, flushed, cap, out, win, lane)) { status = INFLATE_FULL; break; }
                    continue;
                }
            }
            if ((e >> 20) != 1u) {  // not a length: the block's end, or no such code
                if (e >= KIND_END && e < KIND_LONG) {
                    in.drop(e & 15u);
                    break;
                }
                status = INFLATE_BAD;
                break;
            }
            in.drop(e & 15u);
            const unsigned extra = (e >> 4) & 15u;
            const unsigned len = ((e >> 8) & 0x1ffu) + (unsigned)(in.bits & ((1u << extra) - 1u));
            in.drop(extra);
            in.refill();
            unsigned d = lookup<DIST_BITS>(sh.dist, in.bits);
            if ((d & 15u) == 0) {
                d = long_code<DISTANCE>((unsigned)in.bits, d, sh.dist_code, lane);
                if (d == 0) { status = INFLATE_BAD; break; }
            }
            in.drop(d & 15u);
            const unsigned dextra = (d >> 4) & 15u;
            const unsigned dist = ((d >> 8) & 0xffffu) + (unsigned)(in.bits & ((1u << dextra) - 1u));
            in.drop(dextra);
            in.refill();
            e = lookup<LIT_BITS>(sh.lit, in.bits);
            const unsigned from = p - dist;
            if (dist + len > WINDOW || dist > p) {  // its source left the window: it lies in the output, stored
                if (dist > p) { status = INFLATE_BAD; break; }  // (as dist >= len + LINE), or is before the start
                const unsigned char* stored = reinterpret_cast<const unsigned char*>(out) + from;
                for (unsigned i = lane; i < len; i += 32) win[(p + i) & (WINDOW - 1u)] = __ldcg(stored + i);
                __syncwarp();
                p += len;
                if (p - flushed >= LINE && !flush(p, flushed, cap, out, win, lane)) { status = INFLATE_FULL; break; }
                continue;
            }
            window_copy(win, sh.mod, p, from, dist, len, lane);
            p += len;
            if (p - flushed >= LINE && !flush(p, flushed, cap, out, win, lane)) { status = INFLATE_FULL; break; }
        }
        if (status != INFLATE_OK) break;
    }
    if (in.consumed() > 8 * size) status = INFLATE_BAD;  // it read past its end (and what it decoded there)
    else if (status == INFLATE_OK && p > cap) status = INFLATE_FULL;
    if (p > cap) p = cap;
    __syncwarp();
    unsigned char* tail = reinterpret_cast<unsigned char*>(out);
    for (unsigned i = flushed + lane; i < p; i += 32) tail[i] = win[i & (WINDOW - 1u)];
    if (lane == 0) {
        statuses[c] = status;
        actual_bytes[c] = p;
    }
}

// inflate_kernel2: a stream whole by cuda/inflate.cu's two warps (inflate_kernel3 with one part).
extern "C" __global__ void __launch_bounds__(64) inflate_kernel2(const unsigned char* const* __restrict__ src_ptrs,
                                                                 const unsigned long long* __restrict__ src_bytes,
                                                                 const unsigned long long* __restrict__ dst_bytes,
                                                                 unsigned long long* __restrict__ actual_bytes,
                                                                 unsigned char* const* __restrict__ dst_ptrs,
                                                                 int* __restrict__ statuses) {
    __shared__ Shared sh;
    const int c = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    setup(sh);
    const unsigned char* src = src_ptrs[c];
    if (warp == 1) {
        const bool past = parse<false>(sh.parser, sh.handoff, src, (long long)src_bytes[c], 0, Stops{}, lane);
        __syncwarp();
        if (lane == 0) sh.handoff.done = past ? 2 : 1;
        return;
    }
    unsigned decoded;
    int next;
    const int status = write(sh.writer, sh.handoff, src, (unsigned)min(dst_bytes[c], 0x7fffffffull), dst_ptrs[c], 0u,
                             &decoded, &next, lane);
    if (lane == 0) {
        statuses[c] = status;
        actual_bytes[c] = decoded;
    }
}
