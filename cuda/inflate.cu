// Deflate streams (RFC 1951: zlib's streams without their 2-byte header and adler32 trailer, as
// HDF5's deflate filter stores chunks) decoded on the GPU, each into its own output buffer. Arguments:
// arrays of `count` source pointers, source sizes, output capacities, decoded sizes (out), output
// pointers (4-byte aligned) and statuses (out: INFLATE_OK, _BAD, _FULL).
// inflate_kernel1: a block of one warp per stream, every lane decoding the same symbols in lockstep
//   (no shuffles): Huffman codes through tables of 2^LIT_BITS and 2^DIST_BITS entries in shared
//   memory (longer codes bit by bit, canonically; two literals a step where the bits allow; the next
//   symbol's entry looked up before this one's copy and store), tables
//   built by the 32 lanes (ballots rank each length's symbols); the stream read 32 bits at a time,
//   the next word loaded a refill ahead, no branch; literals and matches land in a window of the last
//   WINDOW bytes in shared memory (a match copied by the lanes, 32 bytes a step; one from further
//   back read from the output already stored), each finished 128-byte line stored in one coalesced
//   store: reads the stream once, writes the output about once; with 8 KB, 17 KB of shared memory
//   and 140 registers a block, twelve blocks an SM.

#ifndef LIT_BITS
#define LIT_BITS 10
#endif
#ifndef DIST_BITS
#define DIST_BITS 8  // also holds the code-length code (7 bits at most)
#endif
#ifndef WINDOW
#define WINDOW 8192u  // the recent output kept in shared memory (a power of two, >= 1024); older bytes are read back from the output
#endif
#define LINE 128u      // output bytes a warp stores at once
#define INFLATE_OK 0
#define INFLATE_BAD 1   // not a deflate stream, damaged, or one that ends past its size
#define INFLATE_FULL 2  // decodes to more bytes than its output holds

// A table entry: bits 0-3 the code's length (0: no symbol, or a code longer than the table, decoded
// bit by bit). A literal is len | byte << 4, so 0 < entry < 0x1000; a length len | extra bits << 4 |
// base << 8 | KIND_LENGTH; a distance len | extra bits << 4 | base << 8; a code-length symbol len | s << 8.
#define KIND_LENGTH (1u << 20)
#define KIND_END (2u << 20)
#define KIND_LONG (1u << 31)  // with length 0: the code is longer than the table

__constant__ unsigned short LEN_BASE[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                            31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
__constant__ unsigned char LEN_EXTRA[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
__constant__ unsigned short DIST_BASE[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                             193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
__constant__ unsigned char DIST_EXTRA[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
__constant__ unsigned char CODE_ORDER[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

enum Alphabet { LITLEN, DISTANCE, CODE_LENGTH };

template <Alphabet A>
__device__ __forceinline__ unsigned entry(unsigned s, unsigned len) {
    if (A == CODE_LENGTH) return len | (s << 8);
    if (A == DISTANCE) return s < 30 ? len | ((unsigned)DIST_EXTRA[s] << 4) | ((unsigned)DIST_BASE[s] << 8) : 0u;
    if (s < 256) return len | (s << 4);
    if (s == 256) return len | KIND_END;
    if (s < 286) return len | KIND_LENGTH | ((unsigned)LEN_EXTRA[s - 257] << 4) | ((unsigned)LEN_BASE[s - 257] << 8);
    return 0u;  // 286 and 287 have codes in fixed blocks but never occur
}

// A code's symbols by length, for the codes longer than its table (puff's canonical decoding).
struct Canonical {
    unsigned short count[16];
    unsigned short symbol[288];
    unsigned short first[16];   // scratch of the build: each length's first canonical code
    unsigned short offset[16];  // and its first symbol's place in `symbol`
};

struct Scratch {
    unsigned int lit[1u << LIT_BITS];
    unsigned int dist[1u << DIST_BITS];
    Canonical lit_code, dist_code;
    unsigned char lens[288 + 32];
    unsigned char mod[32][64];  // j % d: the lanes' places in a repeated pattern of d < 32 bytes
    __align__(16) unsigned char window[WINDOW];
};

// The table of the code given by lens[0..n) (n <= 288); false where the lengths oversubscribe the
// code. An incomplete code is accepted: its missing codes are entries of 0, refused when met.
template <Alphabet A, int BITS>
__device__ bool build(const unsigned char* lens, int n, unsigned* table, Canonical& code, int lane) {
    for (int i = lane; i < (1 << BITS); i += 32) table[i] = 0u;
    unsigned run[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) run[l] = 0;
    unsigned rank[9];
    const unsigned below = (1u << lane) - 1u;
#pragma unroll
    for (int g = 0; g < 9; ++g) {  // each symbol's rank among the symbols of its length
        const int s = g * 32 + lane;
        const unsigned len = s < n ? lens[s] : 0u;
        rank[g] = 0;
#pragma unroll
        for (int l = 1; l < 16; ++l) {
            const unsigned b = __ballot_sync(0xffffffffu, len == (unsigned)l);
            if (len == (unsigned)l) rank[g] = run[l] + __popc(b & below);
            run[l] += __popc(b);
        }
    }
    int left = 1;
    unsigned first = 0, offset = 0;
#pragma unroll
    for (int l = 1; l < 16; ++l) {
        left = 2 * left - (int)run[l];
        if (lane == 0) {
            code.count[l] = run[l];
            code.first[l] = first;
            code.offset[l] = offset;
        }
        first = (first + run[l]) << 1;
        offset += run[l];
    }
    if (lane == 0) code.count[0] = 0;
    __syncwarp();
    if (left < 0) return false;
#pragma unroll
    for (int g = 0; g < 9; ++g) {
        const int s = g * 32 + lane;
        const unsigned len = s < n ? lens[s] : 0u;
        if (len == 0) continue;
        const unsigned c = code.first[len] + rank[g];
        code.symbol[code.offset[len] + rank[g]] = s;
        const unsigned rev = __brev(c) >> (32 - len);  // the code as the stream's bits arrive, first bit lowest
        if (len <= BITS) {
            const unsigned e = entry<A>(s, len);
            for (unsigned k = rev; k < (1u << BITS); k += 1u << len) table[k] = e;
        } else {
            table[rev & ((1u << BITS) - 1u)] = KIND_LONG;
        }
    }
    __syncwarp();
    return true;
}

// Bits of the stream, lowest first: 32 to 64 of them in `bits` after a refill; `next` the word after.
struct Bits {
    const unsigned* words;
    int nwords, at;  // at: the index of `next`
    unsigned long long bits;
    int count;
    unsigned next;
    int skip;  // the stream's offset into its first word, in bits

    __device__ __forceinline__ unsigned load(int i) const { return i < nwords ? __ldg(words + i) : 0u; }
    // Branch-free (a branch costs the warp more than these few instructions): the word after the
    // last is read again instead of 0, which only a stream read past its end sees (consumed() tells).
    __device__ __forceinline__ void refill() {
        const bool need = count <= 32;
        bits |= need ? (unsigned long long)next << count : 0ull;
        count += need ? 32 : 0;
        at += need;
        next = __ldg(words + min(at, nwords - 1));
    }
    __device__ __forceinline__ void drop(int n) {
        bits >>= n;
        count -= n;
    }
    __device__ __forceinline__ long long consumed() const { return 32ll * at - count - skip; }
    __device__ void seek(long long byte) {  // to a byte of the stream
        const long long b = skip / 8 + byte;
        at = (int)(b >> 2);
        bits = load(at);
        count = 32;
        next = load(++at);
        drop(8 * (int)(b & 3));
    }
};

// The table entry of the stream's next bits.
template <int BITS>
__device__ __forceinline__ unsigned lookup(const unsigned* table, unsigned long long bits) {
    return table[bits & ((1u << BITS) - 1u)];
}

// A symbol of a code longer than its table, bit by bit (bits: at least 15 of them).
__device__ int slow_symbol(unsigned long long bits, const Canonical& code, int* used) {
    int c = 0, first = 0, index = 0;
    for (int len = 1; len < 16; ++len) {
        c |= (int)((bits >> (len - 1)) & 1u);
        const int count = code.count[len];
        if (c - count < first) {
            *used = len;
            return code.symbol[index + (c - first)];
        }
        index += count;
        first = (first + count) << 1;
        c <<= 1;
    }
    return -1;
}

// The entry of a code longer than its table (e: its table entry, KIND_LONG) or 0 (no such code).
template <Alphabet A>
__device__ __noinline__ unsigned long_code(unsigned long long bits, unsigned e, const Canonical& code) {
    if (e == 0) return 0u;
    int used = 0;
    const int s = slow_symbol(bits, code, &used);
    return s < 0 ? 0u : entry<A>(s, used);
}

// Store the window's finished lines up to p; false where one would end past the output's cap.
__device__ __forceinline__ bool flush(unsigned p, unsigned& flushed, unsigned cap, unsigned* out, const unsigned char* win,
                                      int lane) {
    for (; p - flushed >= LINE; flushed += LINE) {
        if (flushed + LINE > cap) return false;
        out[flushed / 4 + lane] = *reinterpret_cast<const unsigned*>(win + ((flushed + 4 * lane) & (WINDOW - 1u)));
    }
    __syncwarp();  // the stores ordered before any lane's read of them (a far match)
    return true;
}

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
    const int head = (int)((size_t)src & 3u);
    in.words = reinterpret_cast<const unsigned*>(src - head);
    in.nwords = (head + size + 3) / 4;
    in.skip = 8 * head;
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
        if (type == 1) {
            if (!fixed) {
                for (int s = lane; s < 320; s += 32) sh.lens[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : s < 288 ? 8 : 5;
                __syncwarp();
                build<LITLEN, LIT_BITS>(sh.lens, 288, sh.lit, sh.lit_code, lane);
                build<DISTANCE, DIST_BITS>(sh.lens + 288, 32, sh.dist, sh.dist_code, lane);
                fixed = true;
            }
        } else {  // dynamic: the code lengths' code, then the two codes' lengths in it
            fixed = false;
            in.refill();
            const int nlit = 257 + (int)(in.bits & 31u), ndist = 1 + (int)((in.bits >> 5) & 31u);
            const int ncode = 4 + (int)((in.bits >> 10) & 15u);
            in.drop(14);
            if (nlit > 286 || ndist > 30) { status = INFLATE_BAD; break; }
            if (lane < 19) sh.lens[lane] = 0;
            __syncwarp();
            for (int i = 0; i < ncode; ++i) {
                in.refill();
                if (lane == 0) sh.lens[CODE_ORDER[i]] = in.bits & 7u;
                in.drop(3);
            }
            __syncwarp();
            if (!build<CODE_LENGTH, DIST_BITS>(sh.lens, 19, sh.dist, sh.dist_code, lane)) { status = INFLATE_BAD; break; }
            int i = 0;
            const int total = nlit + ndist;
            while (i < total) {
                in.refill();
                const unsigned e = lookup<DIST_BITS>(sh.dist, in.bits);
                if (e == 0) { status = INFLATE_BAD; break; }
                in.drop(e & 15u);
                const unsigned s = e >> 8;
                if (s < 16) {
                    if (lane == 0) sh.lens[i] = s;
                    ++i;
                    continue;
                }
                unsigned value = 0, repeat;
                if (s == 16) {
                    if (i == 0) { status = INFLATE_BAD; break; }
                    __syncwarp();
                    value = sh.lens[i - 1];
                    repeat = 3 + (in.bits & 3u);
                    in.drop(2);
                } else if (s == 17) {
                    repeat = 3 + (in.bits & 7u);
                    in.drop(3);
                } else {
                    repeat = 11 + (in.bits & 127u);
                    in.drop(7);
                }
                if (i + (int)repeat > total) { status = INFLATE_BAD; break; }
                for (unsigned j = lane; j < repeat; j += 32) sh.lens[i + j] = value;
                i += repeat;
            }
            if (status != INFLATE_OK) break;
            __syncwarp();
            if (sh.lens[256] == 0) { status = INFLATE_BAD; break; }  // no end-of-block code
            // the distance lengths move up past 288, where the fixed code keeps them
            const unsigned char moved = lane < ndist ? sh.lens[nlit + lane] : 0;
            __syncwarp();
            sh.lens[288 + lane] = moved;
            __syncwarp();
            if (!build<LITLEN, LIT_BITS>(sh.lens, nlit, sh.lit, sh.lit_code, lane)
                || !build<DISTANCE, DIST_BITS>(sh.lens + 288, ndist, sh.dist, sh.dist_code, lane)) {
                status = INFLATE_BAD;
                break;
            }
        }
        // The next symbol's table entry is looked up as soon as its bits are known, before the work
        // on this one (a match's copy, a line's store) that does not need it.
        in.refill();
        unsigned e = lookup<LIT_BITS>(sh.lit, in.bits);
        for (;;) {  // the block's symbols; e: the next one's entry (>= 33 bits in hand)
            if (e - 1u < 0xfffu) {  // a literal (every lane writes the same byte, so each sees it), and
                in.drop(e & 15u);   // another where the table gives one for the bits left (>= 23)
                win[p & (WINDOW - 1u)] = (unsigned char)(e >> 4);
                e = lookup<LIT_BITS>(sh.lit, in.bits);
                const bool two = e - 1u < 0xfffu;
                if (two) {
                    in.drop(e & 15u);
                    win[(p + 1) & (WINDOW - 1u)] = (unsigned char)(e >> 4);
                }
                p += 1 + two;
                in.refill();
                if (two) e = lookup<LIT_BITS>(sh.lit, in.bits);
                if (p - flushed >= LINE && !flush(p, flushed, cap, out, win, lane)) { status = INFLATE_FULL; break; }
                continue;
            }
            if ((e & 15u) == 0) {  // a code longer than the table, or none
                e = long_code<LITLEN>(in.bits, e, sh.lit_code);
                if (e - 1u < 0xfffu) {
                    in.drop(e & 15u);
                    win[p & (WINDOW - 1u)] = (unsigned char)(e >> 4);
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
                d = long_code<DISTANCE>(in.bits, d, sh.dist_code);
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
            // lane i copies byte i of each 32: from before p where dist < 32 (the pattern's byte i % dist),
            // else from a step that an earlier step (or an earlier match) wrote; as dist + len <= WINDOW,
            // no step writes a byte that the same step reads
            unsigned r = dist >= 32 ? lane : sh.mod[dist][lane];
            if (lane < len) win[(p + lane) & (WINDOW - 1u)] = win[(from + r) & (WINDOW - 1u)];
            __syncwarp();
#pragma unroll 1
            for (unsigned base = 32; base < len; base += 32) {
                r = dist >= 32 ? r + 32 : sh.mod[dist][r + 32];
                if (base + lane < len) win[(p + base + lane) & (WINDOW - 1u)] = win[(from + r) & (WINDOW - 1u)];
                __syncwarp();
            }
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
