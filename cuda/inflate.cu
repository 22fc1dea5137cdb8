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

template <typename Sym, unsigned W>
struct Scratch {
    unsigned int lit[1u << LIT_BITS];
    unsigned int dist[1u << DIST_BITS];
    Canonical lit_code, dist_code;
    unsigned char lens[288 + 32];
    unsigned char mod[32][64];  // j % d: the lanes' places in a repeated pattern of d < 32 symbols
    __align__(16) Sym window[W];
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

// Store the window's finished lines (LINE bytes) up to symbol p; false where one would end past the
// output's cap (symbols).
template <typename Sym, unsigned W>
__device__ __forceinline__ bool flush(unsigned p, unsigned& flushed, unsigned cap, unsigned* out, const Sym* win, int lane) {
    constexpr unsigned L = LINE / sizeof(Sym), PER = 4 / sizeof(Sym);  // symbols a line, a lane's word
    for (; p - flushed >= L; flushed += L) {
        if (flushed + L > cap) return false;
        out[flushed / PER + lane] = *reinterpret_cast<const unsigned*>(win + ((flushed + PER * lane) & (W - 1u)));
    }
    __syncwarp();  // the stores ordered before any lane's read of them (a far match)
    return true;
}

// Where a unit of inflate_kernel2 stops: at a block's end where the next block starts at one of the
// chunk's candidate starts (sorted, in shared memory).
struct Stops {
    const unsigned* starts;
    int n;
    __device__ bool at(long long bit) const {
        bool hit = false;
        for (int i = threadIdx.x & 31; i < n; i += 32) hit |= starts[i] == (unsigned long long)bit;
        return __any_sync(0xffffffffu, hit);
    }
};

// What a stream decoded: its status, the symbols decoded, the bit after its last block, and whether
// that block was the stream's last.
struct Decoded {
    int status;
    unsigned p;
    long long end;
    bool last;
};

// Decode a deflate stream from bit `start` into out (cap symbols; 4-byte aligned), a warp in
// lockstep. Sym unsigned char: the stream from its start, every symbol a byte. APART (unsigned short
// symbols): from a block start inside it, stopping at a block's end where `stops` has the next one; a
// match reaching before `start` decodes to markers, 255 + how many bytes before `start` its source
// is, copied as values, replaced by inflate_join_kernel1 once the bytes before are known.
template <typename Sym, unsigned W, bool APART>
__device__ Decoded inflate_stream(const unsigned char* src, long long size, long long start, unsigned cap, Sym* sout,
                                  Scratch<Sym, W>& sh, Stops stops, int lane) {
    unsigned* out = reinterpret_cast<unsigned*>(sout);
    Sym* win = sh.window;
    for (int i = lane; i < 32 * 64; i += 32) sh.mod[i / 64][i % 64] = i / 64 ? (i % 64) % (i / 64) : 0;

    Bits in;
    const int head = (int)((size_t)src & 3u);
    in.words = reinterpret_cast<const unsigned*>(src - head);
    in.nwords = (head + size + 3) / 4;
    in.skip = 8 * head;
    in.seek(start >> 3);
    in.drop((int)(start & 7));

    unsigned p = 0, flushed = 0;  // symbols decoded; symbols stored to the output (whole lines)
    int status = INFLATE_OK;
    bool last = false, fixed = false, first = true;  // fixed: the tables hold the fixed codes
    while (!last) {
        if (APART && !first && stops.at(in.consumed())) break;
        first = false;
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
                if (base + lane < n) win[(p + base + lane) & (W - 1u)] = src[from + base + lane];
                __syncwarp();
                if (!flush<Sym, W>(p + min(base + 32, n), flushed, cap, out, win, lane)) status = INFLATE_FULL;
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
                win[p & (W - 1u)] = (Sym)(e >> 4);
                e = lookup<LIT_BITS>(sh.lit, in.bits);
                const bool two = e - 1u < 0xfffu;
                if (two) {
                    in.drop(e & 15u);
                    win[(p + 1) & (W - 1u)] = (Sym)(e >> 4);
                }
                p += 1 + two;
                in.refill();
                if (two) e = lookup<LIT_BITS>(sh.lit, in.bits);
                if (p - flushed >= LINE / sizeof(Sym) && !flush<Sym, W>(p, flushed, cap, out, win, lane)) {
                    status = INFLATE_FULL;
                    break;
                }
                continue;
            }
            if ((e & 15u) == 0) {  // a code longer than the table, or none
                e = long_code<LITLEN>(in.bits, e, sh.lit_code);
                if (e - 1u < 0xfffu) {
                    in.drop(e & 15u);
                    win[p & (W - 1u)] = (Sym)(e >> 4);
                    in.refill();
                    e = lookup<LIT_BITS>(sh.lit, in.bits);
                    if (++p - flushed >= LINE / sizeof(Sym) && !flush<Sym, W>(p, flushed, cap, out, win, lane)) {
                        status = INFLATE_FULL;
                        break;
                    }
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
            if (dist + len > W || dist > p) {  // its source left the window: it lies in the output, stored
                if (dist > p && !APART) { status = INFLATE_BAD; break; }  // (as dist >= len + LINE), or is before the start
                // a symbol's source: the match's own first dist symbols repeat; one before the
                // start is a marker; one in the last unstored line is still only in the window
                for (unsigned i = lane; i < len; i += 32) {
                    const long long at = (long long)p - dist + (i < dist ? i : i % dist);
                    win[(p + i) & (W - 1u)] = at < 0 ? (Sym)(255 - at) : at >= flushed ? win[at & (W - 1u)] : __ldcg(sout + at);
                }
                __syncwarp();
                p += len;
                if (p - flushed >= LINE / sizeof(Sym) && !flush<Sym, W>(p, flushed, cap, out, win, lane)) {
                    status = INFLATE_FULL;
                    break;
                }
                continue;
            }
            // lane i copies symbol i of each 32: from before p where dist < 32 (the pattern's symbol
            // i % dist), else from a step that an earlier step (or an earlier match) wrote; as
            // dist + len <= W, no step writes a symbol that the same step reads
            unsigned r = dist >= 32 ? lane : sh.mod[dist][lane];
            if (lane < len) win[(p + lane) & (W - 1u)] = win[(from + r) & (W - 1u)];
            __syncwarp();
#pragma unroll 1
            for (unsigned base = 32; base < len; base += 32) {
                r = dist >= 32 ? r + 32 : sh.mod[dist][r + 32];
                if (base + lane < len) win[(p + base + lane) & (W - 1u)] = win[(from + r) & (W - 1u)];
                __syncwarp();
            }
            p += len;
            if (p - flushed >= LINE / sizeof(Sym) && !flush<Sym, W>(p, flushed, cap, out, win, lane)) {
                status = INFLATE_FULL;
                break;
            }
        }
        if (status != INFLATE_OK) break;
    }
    Decoded r;
    r.end = in.consumed();
    if (r.end > 8 * size) status = INFLATE_BAD;  // it read past its end (and what it decoded there)
    else if (status == INFLATE_OK && p > cap) status = INFLATE_FULL;
    if (p > cap) p = cap;
    __syncwarp();
    for (unsigned i = flushed + lane; i < p; i += 32) sout[i] = win[i & (W - 1u)];
    r.status = status;
    r.p = p;
    r.last = last;
    return r;
}

// A chunk of the table decoded whole by one warp (inflate_kernel1, and inflate_retry_kernel1's).
__device__ __forceinline__ void inflate_chunk(int c, const unsigned char* const* src_ptrs, const unsigned long long* src_bytes,
                                              const unsigned long long* dst_bytes, unsigned long long* actual_bytes,
                                              unsigned char* const* dst_ptrs, int* statuses) {
    __shared__ Scratch<unsigned char, WINDOW> sh;
    const unsigned cap = (unsigned)min(dst_bytes[c], 0x7fffffffull);
    const Decoded d = inflate_stream<unsigned char, WINDOW, false>(src_ptrs[c], (long long)src_bytes[c], 0, cap, dst_ptrs[c],
                                                                   sh, Stops{nullptr, 0}, threadIdx.x);
    if (threadIdx.x == 0) {
        statuses[c] = d.status;
        actual_bytes[c] = d.p;
    }
}

extern "C" __global__ void __launch_bounds__(32) inflate_kernel1(const unsigned char* const* __restrict__ src_ptrs,
                                                                 const unsigned long long* __restrict__ src_bytes,
                                                                 const unsigned long long* __restrict__ dst_bytes,
                                                                 unsigned long long* __restrict__ actual_bytes,
                                                                 unsigned char* const* __restrict__ dst_ptrs,
                                                                 int* __restrict__ statuses) {
    inflate_chunk(blockIdx.x, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses);
}

// ---- A chunk's blocks decoded apart (inflate_find_kernel1, inflate_kernel2, inflate_join_kernel1,
// inflate_retry_kernel1, in that order on one stream). A chunk's scratch: its count of candidate
// starts (zeroed before the find), its Apart record, and its region of region_bytes.

#ifndef APART_MAX
#define APART_MAX 128  // candidate block starts a chunk; a chunk with more is decoded whole
#endif
#ifndef APART_WINDOW
#define APART_WINDOW 4096u  // symbols of inflate_kernel2's window in shared memory (>= 1024)
#endif
#define INFLATE_RETRY 3  // a chunk whose blocks did not join up: inflate_retry_kernel1 decodes it whole

struct Apart {
    unsigned starts[APART_MAX];      // candidate block starts, bits into the stream, as found
    unsigned sorted[APART_MAX];      // the same, ascending (written by unit 0)
    unsigned end[APART_MAX + 1];     // per unit (0: from the stream's start; k: from sorted[k - 1]):
    unsigned length[APART_MAX + 1];  // the bit after it, its symbols,
    int status[APART_MAX + 1];       // its status | last << 8
};

// 57 bits of the stream from bit `bit` on (zeros past its end).
__device__ __forceinline__ unsigned long long peek(const unsigned char* src, long long size, long long bit) {
    const long long at = bit >> 3;
    unsigned long long w = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) w |= (unsigned long long)(at + k < size ? __ldg(src + at + k) : 0) << (8 * k);
    return w >> (bit & 7);
}

// Whether a dynamic block's header could start at bit b: its type, its counts, a complete code-length
// code, and code lengths (in it) that make a complete literal/length code with an end-of-block code
// and a distance code not oversubscribed. zlib's blocks all pass; elsewhere a chunk of MNIST passes
// at no other bit.
__device__ bool block_starts_at(const unsigned char* src, long long size, long long b) {
    unsigned long long w = peek(src, size, b);
    if (((w >> 1) & 3u) != 2u) return false;
    const int nlit = 257 + (int)((w >> 3) & 31u), ndist = 1 + (int)((w >> 8) & 31u), ncode = 4 + (int)((w >> 13) & 15u);
    if (nlit > 286 || ndist > 30) return false;
    w = peek(src, size, b + 17);
    int count[8] = {0, 0, 0, 0, 0, 0, 0, 0}, kraft = 0;
    unsigned char lens[19];
    for (int s = 0; s < 19; ++s) lens[s] = 0;
    for (int i = 0; i < ncode; ++i) {
        const int l = (int)((w >> (3 * i)) & 7u);
        lens[CODE_ORDER[i]] = l;
        count[l] += 1;
        kraft += l ? 128 >> l : 0;
    }
    if (kraft != 128) return false;
    unsigned char symbol[19];  // canonical order: by length, then symbol
    int offset[9];
    offset[1] = 0;
    for (int l = 1; l < 8; ++l) offset[l + 1] = offset[l] + count[l];
    for (int s = 0; s < 19; ++s)
        if (lens[s]) symbol[offset[lens[s]]++] = s;
    long long q = b + 17 + 3 * ncode;
    int i = 0, prev = -1;
    const int total = nlit + ndist;
    long long lit = 0, dist = 0;
    bool end = false;
    while (i < total) {
        if (q > 8 * size) return false;
        w = peek(src, size, q);
        int code = 0, first = 0, index = 0, len = 1;
        for (; len < 8; ++len) {
            code |= (int)((w >> (len - 1)) & 1u);
            if (code - first < count[len]) break;
            index += count[len];
            first = (first + count[len]) << 1;
            code <<= 1;
        }
        if (len == 8) return false;
        const int s = symbol[index + code - first];
        w >>= len;
        q += len;
        int value = 0, repeat = 1;
        if (s < 16) {
            value = s;
        } else if (s == 16) {
            if (prev < 0) return false;
            value = prev;
            repeat = 3 + (int)(w & 3u);
            q += 2;
        } else if (s == 17) {
            repeat = 3 + (int)(w & 7u);
            q += 3;
        } else {
            repeat = 11 + (int)(w & 127u);
            q += 7;
        }
        if (i + repeat > total) return false;
        if (value) {
            const int in_lit = max(0, min(repeat, nlit - i));
            lit += (long long)in_lit << (15 - value);
            dist += (long long)(repeat - in_lit) << (15 - value);
            end |= i <= 256 && 256 < i + repeat;
        }
        i += repeat;
        prev = value;
    }
    return q <= 8 * size && end && lit == (1ll << 15) && dist <= (1ll << 15);
}

// 64 bits from bit s (< 64) of the 128 in lo (bits 0-63) and hi.
__device__ __forceinline__ unsigned long long bits64(unsigned long long lo, unsigned long long hi, int s) {
    return s ? (lo >> s) | (hi << (64 - s)) : lo;
}

// A warp's queue of bits passing one test, taken 32 at a time by the next (so every lane works).
struct Queue {
    unsigned* q;  // 64 entries in shared memory
    int n;        // the same in every lane
    __device__ __forceinline__ void push(bool pass, unsigned v, int lane) {
        const unsigned m = __ballot_sync(0xffffffffu, pass);
        if (pass) q[n + __popc(m & ((1u << lane) - 1u))] = v;
        n += __popc(m);
        __syncwarp();
    }
    __device__ __forceinline__ unsigned pop(int lane) {  // n >= 32: a bit a lane; the rest moved down
        const unsigned v = q[lane], rest = lane + 32 < n ? q[lane + 32] : 0u;
        __syncwarp();
        q[lane] = rest;
        n -= 32;
        __syncwarp();
        return v;
    }
};

// Every chunk's candidate block starts (bits 1 on; 0 is unit 0's), a grid of (blocks, chunks) of
// FIND_WARPS warps. A warp takes 32 bits at a time, a lane each, the stream's words loaded once for
// all: about a quarter pass the block type and counts; those, 32 at a time, are tested for a complete
// code-length code (0.07% of a chunk of MNIST's bits pass both); those, 32 at a time, get the whole
// header test (block_starts_at). The queues keep every lane busy, where testing each bit through
// would hold a warp up for its slowest lane.
#define FIND_WARPS 8
extern "C" __global__ void __launch_bounds__(32 * FIND_WARPS) inflate_find_kernel1(const unsigned char* const* __restrict__ src_ptrs,
                                                                                  const unsigned long long* __restrict__ src_bytes,
                                                                                  unsigned* __restrict__ counts,
                                                                                  Apart* __restrict__ aparts) {
    __shared__ unsigned queues[FIND_WARPS][2][64];
    const int c = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned char* src = src_ptrs[c];
    const long long size = (long long)src_bytes[c], bits = 8 * size;
    const int head = (int)((size_t)src & 3u);
    const unsigned* words = reinterpret_cast<const unsigned*>(src - head);
    const long long nwords = (head + size + 3) / 4;
    auto word = [&](long long k) { return k < nwords ? (unsigned long long)__ldg(words + k) : 0ull; };
    auto at = [&](long long wb) {  // 64 bits from bit wb of the words
        const long long k = wb >> 5;
        return bits64(word(k) | word(k + 1) << 32, word(k + 2) | word(k + 3) << 32, (int)(wb & 31));
    };
    Queue typed{queues[warp][0], 0}, coded{queues[warp][1], 0};
    auto complete = [&](unsigned b) {  // its code-length code complete
        const unsigned long long x = at(b + 8ll * head);
        const int ncode = 4 + (int)((x >> 13) & 15u);
        const unsigned long long y = at(b + 8ll * head + 17);
        int sum = 0;
#pragma unroll
        for (int i = 0; i < 19; ++i) {
            const int l = i < ncode ? (int)((y >> (3 * i)) & 7u) : 0;
            sum += (0x0102040810204000ull >> (8 * l)) & 0xffu;  // 128 >> l, 0 for l = 0
        }
        return sum == 128;
    };
    auto test = [&]() {  // the whole header of 32 queued bits
        const unsigned v = coded.pop(lane);
        if (v && block_starts_at(src, size, v)) {
            const unsigned k = atomicAdd(counts + c, 1u);
            if (k < APART_MAX) aparts[c].starts[k] = v;
        }
    };
    const long long step = (long long)gridDim.x * FIND_WARPS;
    for (long long k = (long long)blockIdx.x * FIND_WARPS + warp; k < nwords; k += step) {  // word k's 32 bits
        const unsigned long long x = bits64(word(k) | word(k + 1) << 32, word(k + 2) | word(k + 3) << 32, lane);
        const long long b = 32 * k + lane - 8ll * head;  // the stream's bit
        typed.push(b >= 1 && b + 17 < bits && ((x >> 1) & 3u) == 2u && ((x >> 3) & 31u) < 30u && ((x >> 8) & 31u) < 30u,
                   (unsigned)b, lane);
        if (typed.n >= 32) {
            const unsigned v = typed.pop(lane);
            coded.push(complete(v), v, lane);
            if (coded.n >= 32) test();
        }
    }
    const unsigned v = typed.q[lane];  // what is left in the queues
    coded.push(lane < typed.n && complete(v), v, lane);
    if (coded.n >= 32) test();
    coded.q[coded.n + lane] = 0;
    coded.n = 32;
    __syncwarp();
    test();  // (bit 0, padding, is never a candidate)
}

// The first symbol of a unit's share of its chunk's region: the region (syms symbols) shared in
// proportion to the stream's bits, in whole lines.
__device__ __forceinline__ unsigned long long share(unsigned long long syms, long long bit, long long bits) {
    return (unsigned long long)((double)syms * (double)bit / (double)bits) & ~63ull;
}

// Units of each chunk decoded apart, a warp each, a grid of (APART_MAX + 1, chunks): unit 0 from the
// stream's start, unit k from its k-th candidate start, each to a block's end where another candidate
// starts (or the stream's end), into its share of the chunk's region as 16-bit symbols; 17 KB of
// shared memory a block.
extern "C" __global__ void __launch_bounds__(32) inflate_kernel2(const unsigned char* const* __restrict__ src_ptrs,
                                                                 const unsigned long long* __restrict__ src_bytes,
                                                                 const unsigned* __restrict__ counts,
                                                                 Apart* __restrict__ aparts, unsigned char* regions,
                                                                 long long region_bytes) {
    __shared__ Scratch<unsigned short, APART_WINDOW> sh;
    __shared__ unsigned starts[APART_MAX];
    const int unit = blockIdx.x, c = blockIdx.y, lane = threadIdx.x;
    const long long size = (long long)src_bytes[c], bits = 8 * size;
    const int n = (int)counts[c];
    if (size == 0 || n > APART_MAX || unit > n) return;
    Apart& a = aparts[c];
    for (int i = lane; i < n; i += 32) {
        const unsigned v = a.starts[i];
        int rank = 0;
        for (int j = 0; j < n; ++j) rank += a.starts[j] < v;
        starts[rank] = v;
    }
    __syncwarp();
    if (unit == 0)
        for (int i = lane; i < n; i += 32) a.sorted[i] = starts[i];
    const long long from = unit ? starts[unit - 1] : 0, to = unit < n ? starts[unit] : bits;
    const unsigned long long syms = (unsigned long long)region_bytes / 2, at = share(syms, from, bits);
    const unsigned cap = (unsigned)min(share(syms, to, bits) - at, 0x7fffffffull);
    unsigned short* out = reinterpret_cast<unsigned short*>(regions + c * region_bytes) + at;
    const Decoded d = inflate_stream<unsigned short, APART_WINDOW, true>(src_ptrs[c], size, from, cap, out, sh,
                                                                         Stops{starts, n}, lane);
    if (lane == 0) {
        a.end[unit] = (unsigned)min(d.end, 0xffffffffll);
        a.length[unit] = d.p;
        a.status[unit] = d.status | (d.last ? 1 << 8 : 0);
    }
}

// Each chunk's units joined, a block of 1,024 threads a chunk: from unit 0, each unit's successor is
// the one starting where it ended, until the last block; their symbols go to the output in turn,
// markers replaced by the output's bytes before the unit (written by the units before it). A chunk
// whose units do not join up (a unit failed or ran out of its share, the candidates missed a block,
// more than APART_MAX of them) is marked INFLATE_RETRY.
extern "C" __global__ void __launch_bounds__(1024) inflate_join_kernel1(const unsigned long long* __restrict__ src_bytes,
                                                                       const unsigned long long* __restrict__ dst_bytes,
                                                                       unsigned long long* __restrict__ actual_bytes,
                                                                       unsigned char* const* __restrict__ dst_ptrs,
                                                                       int* __restrict__ statuses,
                                                                       const unsigned* __restrict__ counts,
                                                                       const Apart* __restrict__ aparts,
                                                                       const unsigned char* regions, long long region_bytes) {
    __shared__ int chain[APART_MAX + 1];
    __shared__ unsigned offsets[APART_MAX + 2];
    __shared__ int links, bad;
    const int c = blockIdx.x;
    const long long size = (long long)src_bytes[c], bits = 8 * size;
    const int n = (int)counts[c];
    const Apart& a = aparts[c];
    const unsigned long long cap = dst_bytes[c];
    if (threadIdx.x == 0) {
        int k = 0, unit = 0;
        unsigned long long off = 0;
        bad = size == 0 || n > APART_MAX;
        while (!bad) {
            const int st = a.status[unit];
            if ((st & 255) != INFLATE_OK || off + a.length[unit] > cap) { bad = 1; break; }
            chain[k] = unit;
            offsets[k++] = (unsigned)off;
            off += a.length[unit];
            if (st >> 8) break;
            int lo = 0, hi = n;  // the unit starting at this one's end
            while (lo < hi) {
                const int mid = (lo + hi) / 2;
                if (a.sorted[mid] < a.end[unit]) lo = mid + 1;
                else hi = mid;
            }
            if (lo == n || a.sorted[lo] != a.end[unit]) { bad = 1; break; }
            unit = lo + 1;
        }
        links = k;
        offsets[k] = (unsigned)off;
    }
    __syncthreads();
    unsigned char* out = dst_ptrs[c];
    const unsigned long long syms = (unsigned long long)region_bytes / 2;
    for (int k = 0; k < links && !bad; ++k) {
        const int unit = chain[k];
        const unsigned off = offsets[k], len = offsets[k + 1] - off;
        const unsigned short* in = reinterpret_cast<const unsigned short*>(regions + c * region_bytes)
                                   + share(syms, unit ? a.sorted[unit - 1] : 0, bits);
        bool wrong = false;
        for (unsigned i = threadIdx.x; i < len; i += blockDim.x) {
            const unsigned v = in[i];
            if (v < 256) {
                out[off + i] = (unsigned char)v;
            } else if (v - 255 <= off) {
                out[off + i] = __ldcg(out + off - (v - 255));
            } else {
                wrong = true;  // a distance past the stream's start
            }
        }
        if (__syncthreads_or(wrong) && threadIdx.x == 0) bad = 1;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        statuses[c] = bad ? INFLATE_RETRY : INFLATE_OK;
        actual_bytes[c] = bad ? 0 : offsets[links];
    }
}

// inflate_kernel1 on the chunks inflate_join_kernel1 marked INFLATE_RETRY, the rest left as they are.
extern "C" __global__ void __launch_bounds__(32) inflate_retry_kernel1(const unsigned char* const* __restrict__ src_ptrs,
                                                                       const unsigned long long* __restrict__ src_bytes,
                                                                       const unsigned long long* __restrict__ dst_bytes,
                                                                       unsigned long long* __restrict__ actual_bytes,
                                                                       unsigned char* const* __restrict__ dst_ptrs,
                                                                       int* __restrict__ statuses) {
    if (statuses[blockIdx.x] != INFLATE_RETRY) return;
    inflate_chunk(blockIdx.x, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses);
}
