// Deflate streams (RFC 1951: zlib's streams without their 2-byte header and adler32 trailer, as
// HDF5's deflate filter stores chunks) decoded on the GPU, each into its own output buffer. Arguments:
// arrays of `count` source pointers, source sizes, output capacities, decoded sizes (out), output
// pointers (4-byte aligned) and statuses (out: INFLATE_OK, _BAD, _FULL).
// inflate_kernel2 (its entry is dev/cuda/inflate_early.cu's: inflate_kernel3 runs its warps a part
//   of a stream at a time): a block of two warps per stream. Warp 1 parses: Huffman codes through
//   tables of 2^LIT_BITS and 2^DIST_BITS entries in shared memory (built by the 32 lanes, ballots
//   ranking each length's symbols), a window of 32 x GROUPS bits at a time: each lane looks up the
//   symbol (a literal, or a length and its distance) that would start at each of its offsets, then
//   the chain of the stream's symbols from the window's start is followed two a step (a shuffle
//   each) and their lanes store their tokens at once. A code longer than its table, or the block's
//   end, stops the window and is decoded by the warp (lane l testing length l + 1, canonically).
//   Its tokens (a literal, a match's length and distance, a stored block, the end) go through a
//   ring of RING in shared memory, published 32 at a time. Warp 0 writes them out a batch of up to
//   32 tokens and BATCH bytes at once: positions by a warp scan, the batch's literals stored together,
//   its matches copied in order by the lanes (32 bytes a step) in a window of the last WINDOW bytes,
//   those from further back read from the output already stored (four loads in flight), then each
//   finished 128-byte line in one coalesced store; a match from before the output's start is its to
//   refuse. So the parse, the serial part, does not wait on copies, stores or the output's latency.
//   Reads the stream once, writes the output about once; 19 KB of shared memory and 80 registers a
//   thread, eleven blocks an SM (the driver keeps 1 KB a block).
// inflate_kernel3 (the product's): inflate_kernel2's two warps for each of PARTS parts of a stream. A
//   part past the first finds its first dynamic block (32 bits tested a step, each passing header read
//   in full) and writes 16-bit values; a part's parse ends where a later part began, which proves that
//   start; inflate_join_kernel3 (256 threads a stream) puts the parts in order, reading 2 bytes and
//   writing 1 a byte of the later parts. A gzip 1 MNIST chunk: 19.5 ms alone, not 31.3 (H200).
//   RING and MIN_BLOCKS size it for dev/cuda/inflate_early.py's --ring and --min-blocks.
//   (Version 1, a warp a stream parsing and writing in lockstep, is dev/cuda/inflate_early.cu.)

#ifndef LIT_BITS
#define LIT_BITS 10
#endif
#ifndef DIST_BITS
#define DIST_BITS 8  // also holds the code-length code (7 bits at most)
#endif
#ifndef WINDOW
#define WINDOW 8192u  // the recent output kept in shared memory (a power of two, >= 1024); older bytes are read back from the output
#endif
#ifdef MIN_BLOCKS  // inflate_kernel3's blocks an SM that its registers must allow (unset: nvcc's choice, 80 registers)
#define KERNEL3_MIN_BLOCKS , MIN_BLOCKS
#else
#define KERNEL3_MIN_BLOCKS
#endif
#ifndef RING
#define RING 256u  // tokens between inflate_kernel2's parser and writer (a power of two, >= 128)
#endif
#define GROUPS 2  // the parser looks up the symbols at 32 x GROUPS bit offsets at once (32 offsets ran 6% slower)
#define ROOM (32u * GROUPS + 40u)  // free slots of the ring the parser waits for after a publication
#define LINE 128u      // output bytes a warp stores at once
static_assert(WINDOW >= 1024u && (WINDOW & (WINDOW - 1u)) == 0, "WINDOW: a power of two of at least 1 KB");
static_assert(RING >= 128u && RING >= ROOM && (RING & (RING - 1u)) == 0, "RING: a power of two, room for a batch and a publication");
#define INFLATE_OK 0
#define INFLATE_BAD 1   // not a deflate stream, damaged, or one that ends past its size
#define INFLATE_FULL 2  // decodes to more bytes than its output holds

// A table entry: bits 0-3 the code's length (0: no symbol, or a code longer than the table, decoded
// by long_code). A literal is len | byte << 8, so 0 < entry < 0x10000 (LITERAL); a length len | extra bits << 4 |
// base << 8 | KIND_LENGTH; a distance len | extra bits << 4 | base << 8; a code-length symbol len | s << 8.
#define KIND_LENGTH (1u << 20)
#define KIND_END (2u << 20)
#define KIND_LONG (1u << 31)  // with length 0: the code is longer than the table
#define LITERAL(e) ((e) - 1u < 0xffffu)

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
    if (s < 256) return len | (s << 8);
    if (s == 256) return len | KIND_END;
    if (s < 286) return len | KIND_LENGTH | ((unsigned)LEN_EXTRA[s - 257] << 4) | ((unsigned)LEN_BASE[s - 257] << 8);
    return 0u;  // 286 and 287 have codes in fixed blocks but never occur
}

// A code's symbols by length, for the codes longer than its table (long_code tests each length).
struct Canonical {
    unsigned short count[16];
    unsigned short symbol[288];
    unsigned short first[16];   // each length's first canonical code
    unsigned short offset[16];  // and its first symbol's place in `symbol`
};


// The table of the code given by lens[0..n) (n <= 288); false where the lengths oversubscribe the
// code. An incomplete code is accepted (unless COMPLETE): its missing codes are entries of 0, refused when met.
template <Alphabet A, int BITS, bool COMPLETE = false>
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
    if (left < 0 || (COMPLETE && left != 0)) return false;
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
    // The stream of `size` bytes at src, read as the aligned words holding it (seek before reading).
    __device__ __forceinline__ void open(const unsigned char* src, long long size) {
        const int head = (int)((size_t)src & 3u);
        words = reinterpret_cast<const unsigned*>(src - head);
        nwords = (int)((head + size + 3) / 4);
        skip = 8 * head;
    }
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
    __device__ void seek_bit(long long bit) {  // to a bit of the stream (then refill before reading)
        seek(bit >> 3);
        drop((int)(bit & 7));
    }
};

// The table entry of the stream's next bits.
template <int BITS>
__device__ __forceinline__ unsigned lookup(const unsigned* table, unsigned long long bits) {
    return table[bits & ((1u << BITS) - 1u)];
}

// The codes of a block of type 1 (fixed: built unless `fixed` says the tables hold them) or 2
// (dynamic: the code lengths' code, then the two codes' lengths in it, read from the stream) in the
// tables of sh (lit, dist, lit_code, dist_code, lens: inflate_kernel2's Parser or inflate_kernel1's
// Scratch); false where the block's header is damaged (or, STRICT, its literal/length code incomplete).
template <class Tables, bool STRICT = false>
__device__ __forceinline__ bool read_codes(Tables& sh, Bits& in, unsigned type, bool& fixed, int lane) {
    if (type == 1) {
        if (!fixed) {
            for (int s = lane; s < 320; s += 32) sh.lens[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : s < 288 ? 8 : 5;
            __syncwarp();
            build<LITLEN, LIT_BITS>(sh.lens, 288, sh.lit, sh.lit_code, lane);
            build<DISTANCE, DIST_BITS>(sh.lens + 288, 32, sh.dist, sh.dist_code, lane);
            fixed = true;
        }
        return true;
    }
    fixed = false;
    in.refill();
    const int nlit = 257 + (int)(in.bits & 31u), ndist = 1 + (int)((in.bits >> 5) & 31u);
    const int ncode = 4 + (int)((in.bits >> 10) & 15u);
    in.drop(14);
    if (nlit > 286 || ndist > 30) return false;
    if (lane < 19) sh.lens[lane] = 0;
    __syncwarp();
    for (int i = 0; i < ncode; ++i) {
        in.refill();
        if (lane == 0) sh.lens[CODE_ORDER[i]] = in.bits & 7u;
        in.drop(3);
    }
    __syncwarp();
    if (!build<CODE_LENGTH, DIST_BITS>(sh.lens, 19, sh.dist, sh.dist_code, lane)) return false;
    int i = 0;
    const int total = nlit + ndist;
    while (i < total) {
        in.refill();
        const unsigned e = lookup<DIST_BITS>(sh.dist, in.bits);
        if (e == 0) return false;
        in.drop(e & 15u);
        const unsigned s = e >> 8;
        if (s < 16) {
            if (lane == 0) sh.lens[i] = s;
            ++i;
            continue;
        }
        unsigned value = 0, repeat;
        if (s == 16) {
            if (i == 0) return false;
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
        if (i + (int)repeat > total) return false;
        for (unsigned j = lane; j < repeat; j += 32) sh.lens[i + j] = value;
        i += repeat;
    }
    __syncwarp();
    if (sh.lens[256] == 0) return false;  // no end-of-block code
    // the distance lengths move up past 288, where the fixed code keeps them
    const unsigned char moved = lane < ndist ? sh.lens[nlit + lane] : 0;
    __syncwarp();
    sh.lens[288 + lane] = moved;
    __syncwarp();
    return build<LITLEN, LIT_BITS, STRICT>(sh.lens, nlit, sh.lit, sh.lit_code, lane)
           && build<DISTANCE, DIST_BITS>(sh.lens + 288, ndist, sh.dist, sh.dist_code, lane);
}

// A window of output elements T (bytes; or inflate_kernel3's 16-bit values, a byte or a mark naming a
// byte before its part): WINDOW bytes of shared memory, LINE bytes a store.
template <typename T>
struct Win {
    static constexpr unsigned SIZE = WINDOW / sizeof(T), MASK = SIZE - 1u, LINE_E = LINE / sizeof(T);
    // the writer's batch (a lone first token up to 258): with a line's and a match's elements, less than
    // the window, so a match it reads from the output lies in lines the batch before stored (write())
    static constexpr unsigned BATCH_E = SIZE >= 4096u ? 1024u : SIZE / 4u;
};

// A match of len elements from `from` (dist back) to `to` in the window, by the warp: lane i copies
// element i of each 32, from before `to` where dist < 32 (the pattern's element i % dist, mod[dist][i]),
// else from a step that an earlier step (or an earlier match) wrote; as dist + len <= the window, no
// step writes an element that the same step reads.
template <typename T>
__device__ __forceinline__ void window_copy(T* win, const unsigned char (*mod)[64], unsigned to, unsigned from,
                                            unsigned dist, unsigned len, int lane) {
    constexpr unsigned M = Win<T>::MASK;
    unsigned r = dist >= 32 ? lane : mod[dist][lane];
    if (lane < len) win[(to + lane) & M] = win[(from + r) & M];
    __syncwarp();
#pragma unroll 1
    for (unsigned base = 32; base < len; base += 32) {
        r = dist >= 32 ? r + 32 : mod[dist][r + 32];
        if (base + lane < len) win[(to + base + lane) & M] = win[(from + r) & M];
        __syncwarp();
    }
}

// Store the window's finished lines up to p; false where one would end past the output's cap.
template <typename T>
__device__ __forceinline__ bool flush(unsigned p, unsigned& flushed, unsigned cap, unsigned* out, const T* win, int lane) {
    constexpr unsigned L = Win<T>::LINE_E;
    for (; p - flushed >= L; flushed += L) {
        if (flushed + L > cap) return false;
        out[flushed * sizeof(T) / 4 + lane] =
            *reinterpret_cast<const unsigned*>(win + ((flushed + 4 / sizeof(T) * lane) & Win<T>::MASK));
    }
    __syncwarp();  // the stores ordered before any lane's read of them (a far match)
    return true;
}

// inflate_kernel2's and 3's tokens: x = kind << 16 | length (a literal's 1, a stored block's bytes),
// y = the literal, the match's distance, the stored block's offset in the stream, the end's status,
// or (TOKEN_NEXT) the later part whose start the parse reached (inflate_kernel3).
#define TOKEN_LITERAL 0u
#define TOKEN_MATCH 1u
#define TOKEN_STORED 2u
#define TOKEN_END 3u
#define TOKEN_NEXT 4u

struct Parser {  // warp 1's: the codes of the block it parses
    unsigned int lit[1u << LIT_BITS];
    unsigned int dist[1u << DIST_BITS];
    Canonical lit_code, dist_code;
    unsigned char lens[288 + 32];
};

struct Handoff {
    uint2 token[RING];
    volatile unsigned head;  // tokens published by the parser
    volatile unsigned tail;  // tokens the writer has taken (their slots free again)
    volatile int stop;       // the writer stopped (its output full): the parser stops too
    volatile int done;       // the parser has stopped: 1, or 2 where it read past the stream's end
};

struct Writer {  // warp 0's
    unsigned char mod[32][64];
    __align__(16) unsigned char window[WINDOW];
};

// The parser's tokens up to h published (each lane's stores before it); then, until the ring has room
// for ROOM more (a step of the parse adds at most 32 x GROUPS + 1, and a publication follows 32), it
// waits. False where the writer has stopped.
__device__ bool publish(Handoff& ho, unsigned h, unsigned& published, int lane) {
    __threadfence_block();  // the tokens written before head says so
    __syncwarp();
    if (lane == 0) ho.head = h;
    published = h;
    for (;;) {
        int go = 0;
        if (lane == 0) go = ho.stop ? 2 : (h + ROOM - ho.tail <= RING ? 1 : 0);
        go = __shfl_sync(0xffffffffu, go, 0);
        if (go) return go == 1;
        __nanosleep(64);
    }
}

__device__ __forceinline__ void put(Handoff& ho, unsigned& h, unsigned kind, unsigned n, unsigned y, int lane) {
    if (lane == 0) ho.token[h & (RING - 1u)] = make_uint2(kind << 16 | n, y);
    ++h;
}

// inflate_kernel3's record of one part of a stream (set to all ones before the launch).
struct Part {
    long long start;  // the bit of the stream its parse starts at (a block's first), -1 until found
    int status;       // its writer's: INFLATE_OK, _BAD or _FULL
    int next;         // the part whose start its parse reached (its output follows), or -1
    unsigned length;  // the bytes (or 16-bit values) it wrote
    unsigned pad[3];
};

// Where a parse may stop (inflate_kernel3): the end of a block where a later part's parse started,
// parts[from..count) (their start read as it is published).
struct Stops {
    const Part* parts;
    int from, count;
};

// The symbol whose code starts at a lane's bit offset `off` of the window (lo, hi: the 64 bits from
// there): where it is a literal, or a length and distance both in the tables (lengths of at most
// LIT_BITS + 5 + DIST_BITS + 13 bits), its token and the offset past it; else (a longer code, the
// block's end, no code) off + 128, for the parse to decode it alone. (Its token is built here, not by
// a helper shared with lone_symbol: the distance's extra bits taken from the 32 bits past the length,
// as lone_symbol does, ran 9% slower on shuffled streams, H200.)
__device__ __forceinline__ void symbol_at(const Parser& sh, unsigned lo, unsigned hi, unsigned off, unsigned& next,
                                          uint2& token) {
    const unsigned e = sh.lit[lo & ((1u << LIT_BITS) - 1u)];
    const unsigned code = e & 15u, extra = (e >> 4) & 15u, at = code + extra;  // (at < 32 for every entry)
    const unsigned d = sh.dist[__funnelshift_r(lo, hi, at) & ((1u << DIST_BITS) - 1u)];
    const unsigned dcode = d & 15u, dextra = (d >> 4) & 15u;
    const bool literal = LITERAL(e), match = (e >> 20) == 1u && dcode != 0;
    next = off + (literal ? code : match ? at + dcode + dextra : 128u);
    const unsigned len = ((e >> 8) & 0x1ffu) + ((lo >> code) & ((1u << extra) - 1u));
    const unsigned dist = ((d >> 8) & 0xffffu) + (__funnelshift_r(lo, hi, at + dcode) & ((1u << dextra) - 1u));
    token = literal ? make_uint2(TOKEN_LITERAL << 16 | 1u, e >> 8) : make_uint2(TOKEN_MATCH << 16 | len, dist);
}

// The entry of a code longer than its table (e: its table entry, KIND_LONG; bits: the next 32 of the
// stream), or 0 (no such code): lane l tests the length l + 1 (of a canonical code, the shortest that fits).
template <Alphabet A>
__device__ __forceinline__ unsigned long_code(unsigned bits, unsigned e, const Canonical& code, int lane) {
    bool fits = false;
    unsigned s = 0;
    if (lane < 15) {
        const unsigned len = lane + 1, k = (__brev(bits) >> (32 - len)) - code.first[len];
        fits = k < code.count[len];
        if (fits) s = code.symbol[code.offset[len] + k];
    }
    const unsigned m = __ballot_sync(0xffffffffu, fits);
    if (e == 0 || m == 0) return 0u;
    const int l = __ffs(m) - 1;
    return entry<A>(__shfl_sync(0xffffffffu, s, l), l + 1);
}

// The symbol that symbol_at left to the warp (a code longer than its table, the block's end, or no
// code), from the 64 bits where it starts (lo, hi): its bits and token. Returns 0, 1 at the block's
// end (no token), or 2 where the code is damaged.
__device__ __forceinline__ int lone_symbol(const Parser& sh, unsigned lo, unsigned hi, unsigned& used, uint2& token,
                                           int lane) {
    unsigned e = lookup<LIT_BITS>(sh.lit, lo);
    if ((e & 15u) == 0) e = long_code<LITLEN>(lo, e, sh.lit_code, lane);
    const unsigned code = e & 15u, extra = (e >> 4) & 15u, at = code + extra;
    used = code;
    if (LITERAL(e)) {
        token = make_uint2(TOKEN_LITERAL << 16 | 1u, e >> 8);
        return 0;
    }
    if (e >= KIND_END && e < KIND_LONG) return 1;
    if ((e >> 20) != 1u) return 2;
    const unsigned x = __funnelshift_r(lo, hi, at);  // (the 32 bits from the distance's code on)
    unsigned d = lookup<DIST_BITS>(sh.dist, x);
    if ((d & 15u) == 0) d = long_code<DISTANCE>(x, d, sh.dist_code, lane);
    if (d == 0) return 2;
    const unsigned dcode = d & 15u, dextra = (d >> 4) & 15u;
    used = at + dcode + dextra;
    token = make_uint2(TOKEN_MATCH << 16 | (((e >> 8) & 0x1ffu) + ((lo >> code) & ((1u << extra) - 1u))),
                       ((d >> 8) & 0xffffu) + ((x >> dcode) & ((1u << dextra) - 1u)));
    return 0;
}

// v[g] of lane i, for the window's offset 32 g + i = `at` (< 32 x GROUPS).
__device__ __forceinline__ unsigned pick(const unsigned (&v)[GROUPS], unsigned at) {
    unsigned x = __shfl_sync(0xffffffffu, v[0], at & 31u);
#pragma unroll
    for (int g = 1; g < GROUPS; ++g) {
        const unsigned y = __shfl_sync(0xffffffffu, v[g], at & 31u);
        x = at >> 5 == (unsigned)g ? y : x;
    }
    return x;
}

// Warp 1: the stream parsed into tokens from bit `start` (a block's first), ending with TOKEN_END and
// its status (INFLATE_OK or _BAD), or with TOKEN_NEXT where STOPS and a block ends where a later part
// starts; unless the writer stops first. A block's symbols are taken a window of 32 x GROUPS bits
// at a time: each lane looks up the symbol starting at each of its offsets (symbol_at), then the
// chain of the stream's symbols from the window's start is followed two a step (a shuffle a step),
// lane k storing step k's two tokens. (A match's distance before the output's start is the writer's
// to refuse.) Returns whether it read past the stream's end.
template <bool STOPS>
__device__ bool parse(Parser& sh, Handoff& ho, const unsigned char* src, long long size, long long start, Stops stops,
                      int lane) {
    Bits in;
    in.open(src, size);
    in.seek_bit(start);

    unsigned h = 0, published = 0;
    int status = INFLATE_OK;
    bool last = false, fixed = false;
    const long long end_bit = 8 * size + in.skip;  // the stream's end in its words' bits
    while (!last) {
        if (STOPS) {  // (once a block)
            const long long here = in.consumed();
            int next = -1;
            for (int j = stops.from; j < stops.count && next < 0; ++j)
                if (*reinterpret_cast<const volatile long long*>(&stops.parts[j].start) == here) next = j;
            if (next >= 0) {
                put(ho, h, TOKEN_NEXT, 0, (unsigned)next, lane);
                publish(ho, h, published, lane);
                return false;
            }
        }
        in.refill();
        if (in.consumed() + 3 > 8 * size) { status = INFLATE_BAD; break; }
        last = in.bits & 1u;
        const unsigned type = (in.bits >> 1) & 3u;
        in.drop(3);
        if (type == 0) {
            in.drop(in.count & 7);
            in.refill();
            const unsigned n = in.bits & 0xffffu;
            if (((in.bits >> 16) & 0xffffu) != (~n & 0xffffu)) { status = INFLATE_BAD; break; }
            in.drop(32);
            const long long from = in.consumed() / 8;
            if (from + n > size) { status = INFLATE_BAD; break; }
            if (n) put(ho, h, TOKEN_STORED, n, (unsigned)from, lane);
            in.seek(from + n);
            if (h - published >= 32 && !publish(ho, h, published, lane)) return in.consumed() > 8 * size;
            continue;
        }
        if (type == 3) { status = INFLATE_BAD; break; }
        if (!read_codes(sh, in, type, fixed, lane)) { status = INFLATE_BAD; break; }
        long long pos = in.consumed() + in.skip;
        for (;;) {  // the block's symbols, a window at a time
            const int wi = (int)(pos >> 5);
            unsigned w[GROUPS + 3];
            if (wi + GROUPS + 3 <= in.nwords) {
#pragma unroll
                for (int k = 0; k < GROUPS + 3; ++k) w[k] = __ldg(in.words + wi + k);
            } else {  // (the last words read again past the end, as Bits::refill does)
#pragma unroll
                for (int k = 0; k < GROUPS + 3; ++k) w[k] = __ldg(in.words + min(wi + k, in.nwords - 1));
            }
            const unsigned r = (unsigned)pos & 31u, s = (r + lane) & 31u;
            const bool up = r + lane >= 32u;  // the lane's offsets start a word later
            unsigned lo[GROUPS], hi[GROUPS], next[GROUPS], x[GROUPS], y[GROUPS];
#pragma unroll
            for (int g = 0; g < GROUPS; ++g) {
                const unsigned a = up ? w[g + 1] : w[g], b = up ? w[g + 2] : w[g + 1], c = up ? w[g + 3] : w[g + 2];
                lo[g] = __funnelshift_r(a, b, s);
                hi[g] = __funnelshift_r(b, c, s);
                uint2 t;
                symbol_at(sh, lo[g], hi[g], 32u * g + lane, next[g], t);
                x[g] = t.x;
                y[g] = t.y;
            }
            unsigned both[GROUPS];  // the offsets one and two symbols on (the second, where the first is in the window)
#pragma unroll
            for (int g = 0; g < GROUPS; ++g) {
                const unsigned n2 = pick(next, next[g]);
                both[g] = next[g] | (next[g] < 32u * GROUPS ? n2 : next[g]) << 8;
            }
            // The chain of the stream's symbols from the window's start, two a step: lane k keeps the
            // offset of step k's first (step k's symbols: that one and the next, their tokens 2k, 2k + 1).
            unsigned j = 0, k = 0, mine = 0;
            do {
                if (lane == k) mine = j;
                ++k;
                j = pick(both, j) >> 8;
            } while (j < 32u * GROUPS);
            const unsigned pair = pick(both, mine), second = pair & 0xffu;
            const bool one = lane < k && second < 128u, two = lane < k && second < 32u * GROUPS && pair >> 8 < 128u;
            const uint2 t1 = make_uint2(pick(x, mine), pick(y, mine)), t2 = make_uint2(pick(x, second), pick(y, second));
            if (one) ho.token[(h + 2 * lane) & (RING - 1u)] = t1;
            if (two) ho.token[(h + 2 * lane + 1) & (RING - 1u)] = t2;
            h += __popc(__ballot_sync(0xffffffffu, one)) + __popc(__ballot_sync(0xffffffffu, two));
            const bool alone = j >= 128u;  // the symbol at j - 128 is left to lone_symbol
            if (alone) j -= 128u;
            pos += j;
            if (alone) {
                unsigned used = 0;
                uint2 t;
                const int lone = lone_symbol(sh, pick(lo, j), pick(hi, j), used, t, lane);
                if (lone == 2) {
                    status = INFLATE_BAD;
                    break;
                }
                pos += used;
                if (lone == 1) break;
                if (lane == 0) ho.token[h & (RING - 1u)] = t;
                ++h;
            }
            if (pos > end_bit) {  // (a stream read past its end)
                status = INFLATE_BAD;
                break;
            }
            if (h - published >= 32 && !publish(ho, h, published, lane)) return false;
        }
        in.seek_bit(pos - in.skip);
        if (status != INFLATE_OK) break;
    }
    if (in.consumed() > 8 * size) status = INFLATE_BAD;  // it read past its end
    put(ho, h, TOKEN_END, 0, (unsigned)status, lane);
    publish(ho, h, published, lane);
    return in.consumed() > 8 * size;
}

// Warp 0: the tokens written out as elements T (bytes, or inflate_kernel3's 16-bit values), in
// batches, from element p on (the window already holding the elements before it). Returns the
// status; *decoded: the elements written, up to p; *next: a TOKEN_NEXT's part, if one ended it.
template <typename T>
__device__ int write(Writer& sh, Handoff& ho, const unsigned char* src, unsigned cap, T* out_elements, unsigned p,
                     unsigned* decoded, int* next, int lane) {
    constexpr unsigned M = Win<T>::MASK, SIZE = Win<T>::SIZE, BATCH_E = Win<T>::BATCH_E;
    static_assert((BATCH_E > 258u ? BATCH_E : 258u) + 258u + Win<T>::LINE_E <= SIZE, "BATCH: too large for the window");
    T* win = reinterpret_cast<T*>(sh.window);
    unsigned* out = reinterpret_cast<unsigned*>(out_elements);
    const T* stored = out_elements;
    unsigned tail = 0, flushed = p;
    int status = INFLATE_OK;
    bool stopped = true;  // the writer stopped first (its output full, or a match from before the start)
    for (;;) {
        unsigned h = 0;
        for (;;) {
            if (lane == 0) h = ho.head;
            h = __shfl_sync(0xffffffffu, h, 0);
            if (h != tail) break;
            __nanosleep(32);
        }
        __threadfence_block();  // head read before the tokens it covers
        const unsigned n = min(h - tail, 32u);
        const uint2 t = lane < n ? ho.token[(tail + lane) & (RING - 1u)] : make_uint2(TOKEN_END << 16, 0u);
        const unsigned kind = t.x >> 16;
        const unsigned special = __ballot_sync(0xffffffffu, kind >= TOKEN_STORED);  // (every lane past n too)
        if (special & 1u) {  // a stored block, the end or the next part comes first
            const unsigned k0 = __shfl_sync(0xffffffffu, kind, 0), n0 = __shfl_sync(0xffffffffu, t.x & 0xffffu, 0);
            const unsigned y0 = __shfl_sync(0xffffffffu, t.y, 0);
            ++tail;
            if (lane == 0) ho.tail = tail;
            if (k0 == TOKEN_END || k0 == TOKEN_NEXT) {
                if (k0 == TOKEN_END) status = (int)y0;
                else *next = (int)y0;
                stopped = false;
                break;
            }
            for (unsigned base = 0; base < n0 && status == INFLATE_OK; base += 32) {
                if (base + lane < n0) win[(p + base + lane) & M] = src[y0 + base + lane];
                __syncwarp();
                if (!flush(p + min(base + 32, n0), flushed, cap, out, win, lane)) status = INFLATE_FULL;
            }
            p += n0;
            if (status != INFLATE_OK) break;
            continue;
        }
        const unsigned m = special ? __ffs(special) - 1 : 32u;  // the tokens before a special one (>= 1)
        const unsigned len = lane < m ? (t.x & 0xffffu) : 0u;
        unsigned incl = len;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        const unsigned take = __ballot_sync(0xffffffffu, lane < m && (incl <= BATCH_E || lane == 0));  // a prefix
        const unsigned k = __popc(take);
        tail += k;
        if (lane == 0) ho.tail = tail;  // (after the ballot, which needed the tokens loaded)
        const unsigned at = p + incl - len;  // this token's place in the output
        const unsigned end = p + __shfl_sync(0xffffffffu, incl, k - 1);
        const bool mine = (take >> lane) & 1u;
        if (__any_sync(0xffffffffu, mine && kind == TOKEN_MATCH && t.y > at)) {  // from before the stream's start
            status = INFLATE_BAD;
            break;
        }
        if (mine && kind == TOKEN_LITERAL) win[at & M] = (T)t.y;
        // A match whose source starts before end - SIZE reads it from the output, as the batch's
        // literals (stored above) may have taken its place in the window; it was stored by the last
        // batch's flush, as max(BATCH, 258) + 258 + LINE <= the window.
        const bool far_one = mine && kind == TOKEN_MATCH && at - t.y + SIZE < end;
        unsigned matches = __ballot_sync(0xffffffffu, mine && kind == TOKEN_MATCH);
        unsigned far = __ballot_sync(0xffffffffu, far_one);
        T ahead[4];  // the next far matches' first 32 elements (element lane of each), loaded together
        int loaded = 0;
        __syncwarp();
        while (matches) {
            const int j = __ffs(matches) - 1;
            matches &= matches - 1u;
            const unsigned ml = __shfl_sync(0xffffffffu, len, j), dist = __shfl_sync(0xffffffffu, t.y, j);
            const unsigned q = __shfl_sync(0xffffffffu, at, j), from = q - dist;
            if ((far >> j) & 1u) {
                if (loaded == 0) {
                    unsigned f = far;
#pragma unroll
                    for (int g = 0; g < 4; ++g) {
                        const int i = f ? __ffs(f) - 1 : 0;
                        const unsigned fl = __shfl_sync(0xffffffffu, len, i), fa = __shfl_sync(0xffffffffu, at - t.y, i);
                        ahead[g] = f && lane < fl ? __ldcg(stored + fa + lane) : (T)0;
                        loaded += f != 0;
                        f &= f - 1u;
                    }
                }
                if (lane < ml) win[(q + lane) & M] = ahead[0];
                ahead[0] = ahead[1];
                ahead[1] = ahead[2];
                ahead[2] = ahead[3];
                --loaded;
                far &= far - 1u;
                for (unsigned i = 32 + lane; i < ml; i += 32) win[(q + i) & M] = __ldcg(stored + from + i);
                __syncwarp();
                continue;
            }
            window_copy(win, sh.mod, q, from, dist, ml, lane);
        }
        p = end;
        if (p - flushed >= Win<T>::LINE_E && !flush(p, flushed, cap, out, win, lane)) {
            status = INFLATE_FULL;
            break;
        }
    }
    if (stopped) {  // the parser stopped too, and a stream it read past the end of is BAD (as kernel1's)
        if (lane == 0) ho.stop = 1;
        int done = 0;
        for (;;) {
            if (lane == 0) done = ho.done;
            done = __shfl_sync(0xffffffffu, done, 0);
            if (done) break;
            __nanosleep(64);
        }
        if (done == 2) status = INFLATE_BAD;
    }
    if (status == INFLATE_OK && p > cap) status = INFLATE_FULL;
    if (p > cap) p = cap;
    __syncwarp();
    for (unsigned i = flushed + lane; i < p; i += 32) out_elements[i] = win[i & M];
    *decoded = p;
    return status;
}

// The block's shared memory, and its setup: the handoff's counters, the writer's pattern table.
struct Shared {
    Parser parser;
    Writer writer;
    Handoff handoff;
};

__device__ __forceinline__ void setup(Shared& sh) {
    if (threadIdx.x == 0) {
        sh.handoff.head = 0;
        sh.handoff.tail = 0;
        sh.handoff.stop = 0;
        sh.handoff.done = 0;
    }
    for (int i = threadIdx.x; i < 32 * 64; i += 64) sh.writer.mod[i / 64][i % 64] = i / 64 ? (i % 64) % (i / 64) : 0;
    __syncthreads();
}

#if WINDOW >= 4096u  // (a 16-bit window of at least 2,048 values; smaller ones spill registers)
#ifndef PARTS
#define PARTS 2
#endif
#ifndef SPLIT_MIN
#define SPLIT_MIN 4096  // a stream of fewer bytes is not split
#endif
#define MARK 0x8000u   // a 16-bit value naming one of the 32,768 bytes before its part: MARK | (32768 + offset)
#define BEFORE 32768u  // a part's values start after that many marks (deflate's farthest distance)
static_assert(PARTS >= 2 && PARTS <= 8, "PARTS: 2 to 8 parts a stream");

// Whether a dynamic block's header starts at the stream's bit `bit` and passes find_block's checks
// (out of line, handed the words find_block reads: the search's registers stay its own; handed the
// stream's address and size instead, kernel3 spilled 24 bytes at a 4 KB window on sm_90).
__device__ __noinline__ bool block_at(Parser& sh, const unsigned* words, int nwords, int skip, long long size,
                                      long long bit, int lane) {
    Bits in;
    in.words = words;
    in.nwords = nwords;
    in.skip = skip;
    in.seek_bit(bit);
    in.refill();
    in.drop(3);
    bool fixed = false;
    return read_codes<Parser, true>(sh, in, 2u, fixed, lane) && in.consumed() <= 8 * size;
}

// The first bit in [from, to) of the stream of `size` bytes at src where a dynamic block's header
// starts that passes every check (the code lengths' code and the literal/length code complete, its
// lengths read to their exact count, an end-of-block code), its codes then in sh's tables; or -1.
// The warp tests 32 bits at once for the header's fixed fields and a complete code lengths' code
// (about 1 in 1,200 bits of a deflate stream pass), then reads each such header in full.
__device__ long long find_block(Parser& sh, const unsigned char* src, long long size, long long from, long long to,
                                int lane) {
    Bits stream;
    stream.open(src, size);
    const unsigned* words = stream.words;
    const int nwords = stream.nwords, skip = stream.skip;
    auto word = [&](long long i) { return i < nwords ? __ldg(words + i) : 0u; };
    for (long long base = (from + skip) & ~31ll; base < to + skip; base += 32) {
        const unsigned a0 = word(base >> 5), a1 = word((base >> 5) + 1), a2 = word((base >> 5) + 2),
                       a3 = word((base >> 5) + 3);
        const unsigned x0 = __funnelshift_r(a0, a1, lane), x1 = __funnelshift_r(a1, a2, lane),
                       x2 = __funnelshift_r(a2, a3, lane);  // the 96 bits from this lane's bit on
        const long long at = base + lane - skip;
        bool ok = at >= from && at < to && ((x0 >> 1) & 3u) == 2u && ((x0 >> 3) & 31u) <= 29u && ((x0 >> 8) & 31u) <= 29u;
        if (__any_sync(0xffffffffu, ok)) {
            const unsigned ncode = 4u + ((x0 >> 13) & 15u);
            const unsigned long long lo = ((unsigned long long)x1 << 32 | x0) >> 17;  // the first 15 lengths
            const unsigned hi = __funnelshift_r(x1, x2, 30);                         // the last 4
            unsigned kraft = 0;
#pragma unroll
            for (unsigned i = 0; i < 19; ++i) {
                const unsigned l = i < 15 ? (unsigned)(lo >> (3 * i)) & 7u : (hi >> (3 * (i - 15))) & 7u;
                kraft += i < ncode && l ? 128u >> l : 0u;
            }
            ok = ok && kraft == 128u;
        }
        for (unsigned m = __ballot_sync(0xffffffffu, ok); m; m &= m - 1u) {
            const long long bit = base + (__ffs(m) - 1) - skip;
            if (block_at(sh, words, nwords, skip, size, bit, lane)) return bit;
        }
    }
    return -1;
}

// The warp's slot on its SM (%warpid), its scheduler the slot mod 4. A block's two warps take an even
// slot and the next (H200), so with fixed roles every parser shares two of the four schedulers and
// every writer the other two: where the parse is the longer part (`spread`: a stream of mostly
// literals, as HDF5's shuffle makes of float images) the parser is the block's warp 0 or 1 as its
// slot's bit 2 says, which puts a quarter of them on each scheduler.
__device__ __forceinline__ unsigned warp_slot() {
    unsigned w;
    asm volatile("mov.u32 %0, %%warpid;" : "=r"(w));
    return w;
}

// inflate_kernel3: inflate_kernel2's two warps for each of PARTS parts of a stream, a block each
//   (blockIdx: the last parts' first). Part k > 0 starts at the first dynamic block its parser finds
//   past k/PARTS of the stream (find_block) and writes 16-bit values into its scratch memory: bytes,
//   and marks for the bytes before its start its matches copy. A part's parse stops at the end of a
//   block where a later part started (so that part's start is proven: a deflate block ends there);
//   inflate_join_kernel3 then puts the parts in order. Part 0 writes the output itself. Scratch: the
//   parts' records (count x PARTS), then for each stream (PARTS - 1) x `stride` bytes: BEFORE marks
//   and the part's values (a stream whose values do not fit is not split).
extern "C" __global__ void __launch_bounds__(64 KERNEL3_MIN_BLOCKS) inflate_kernel3(const unsigned char* const* __restrict__ src_ptrs,
                                                                 const unsigned long long* __restrict__ src_bytes,
                                                                 const unsigned long long* __restrict__ dst_bytes,
                                                                 unsigned char* const* __restrict__ dst_ptrs,
                                                                 Part* __restrict__ parts,
                                                                 unsigned short* __restrict__ values,
                                                                 unsigned long long stride, int count, int spread) {
    __shared__ Shared sh;
    __shared__ long long start;
    __shared__ unsigned parser;  // the warp of the block that parses (role 1)
    const int part = PARTS - 1 - (int)blockIdx.x / count, c = (int)blockIdx.x % count;
    if (threadIdx.x == 0) parser = spread ? (warp_slot() >> 2) & 1u : 1u;
    __syncthreads();
    const int warp = (int)(threadIdx.x / 32 == parser), lane = threadIdx.x % 32;  // warp: the role, 1 the parser
    const unsigned char* src = src_ptrs[c];
    const long long size = (long long)src_bytes[c];
    const unsigned cap = (unsigned)min(dst_bytes[c], 0x7fffffffull - BEFORE);
    Part* rec = parts + (long long)c * PARTS;
    unsigned short* mine = values + ((long long)c * (PARTS - 1) + part - 1) * (long long)(stride / 2);
    if (part > 0) {  // find the part's first block, or leave the stream to the others
        if (warp == 1) {
            long long bit = -1;
            if (size >= SPLIT_MIN && 2ull * (BEFORE + cap) <= stride)
                bit = find_block(sh.parser, src, size, 8 * size * part / PARTS, 8 * size * (part + 1) / PARTS, lane);
            if (lane == 0) start = bit;
        }
        __syncthreads();
        if (start < 0) return;
    }
    setup(sh);
    if (warp == 1) {
        if (part > 0 && lane == 0) *reinterpret_cast<volatile long long*>(&rec[part].start) = start;
        const bool past = parse<true>(sh.parser, sh.handoff, src, size, part ? start : 0,
                                      Stops{rec, part + 1, PARTS}, lane);
        __syncwarp();
        if (lane == 0) sh.handoff.done = past ? 2 : 1;
        return;
    }
    unsigned decoded;
    int next = -1, status;
    if (part == 0) {
        status = write(sh.writer, sh.handoff, src, cap, dst_ptrs[c], 0u, &decoded, &next, lane);
    } else {  // the marks before the part, in the output and the window
        unsigned short* win = reinterpret_cast<unsigned short*>(sh.writer.window);
        for (unsigned i = lane; i < BEFORE; i += 32) mine[i] = (unsigned short)(MARK | i);
        for (unsigned i = BEFORE - Win<unsigned short>::SIZE + lane; i < BEFORE; i += 32)
            win[i & Win<unsigned short>::MASK] = (unsigned short)(MARK | i);
        __syncwarp();
        status = write(sh.writer, sh.handoff, src, BEFORE + cap, mine, BEFORE, &decoded, &next, lane);
        decoded -= BEFORE;
    }
    if (lane == 0) {
        rec[part].status = status;
        rec[part].next = next;
        rec[part].length = decoded;
    }
}

// inflate_join_kernel3: a block of 256 threads a stream follows its parts from part 0 (in the output
//   already) through each part whose start the one before reached, each part's values stored after
//   the output so far, its marks replaced by the bytes they name; the stream's status and decoded size.
//   Reads 2 bytes and writes 1 a byte of the parts past the first.
extern "C" __global__ void __launch_bounds__(256) inflate_join_kernel3(const unsigned long long* __restrict__ dst_bytes,
                                                                       unsigned long long* __restrict__ actual_bytes,
                                                                       unsigned char* const* __restrict__ dst_ptrs,
                                                                       int* __restrict__ statuses,
                                                                       const Part* __restrict__ parts,
                                                                       const unsigned short* __restrict__ values,
                                                                       unsigned long long stride) {
    const int c = blockIdx.x;
    const Part* rec = parts + (long long)c * PARTS;
    unsigned char* out = dst_ptrs[c];
    const unsigned cap = (unsigned)min(dst_bytes[c], 0x7fffffffull - BEFORE);
    int status = rec[0].status, next = rec[0].next;
    unsigned at = rec[0].length;
    while (status == INFLATE_OK && next > 0) {
        const unsigned n = rec[next].length;
        if (n > cap - at) {
            status = INFLATE_FULL;
            break;
        }
        const unsigned short* v = values + ((long long)c * (PARTS - 1) + next - 1) * (long long)(stride / 2) + BEFORE;
        bool bad = false;
        for (unsigned i = threadIdx.x; i < n; i += 256) {
            unsigned x = v[i];
            if (x & MARK) {
                x &= MARK - 1u;
                bad |= at + x < BEFORE;  // a byte before the stream's start
                x = bad ? 0u : out[at + x - BEFORE];
            }
            out[at + i] = (unsigned char)x;
        }
        if (__syncthreads_or(bad)) {  // (and the part's bytes stored before the next part reads them)
            status = INFLATE_BAD;
            break;
        }
        at += n;
        status = rec[next].status;
        next = rec[next].next;
    }
    if (threadIdx.x == 0) {
        statuses[c] = status;
        actual_bytes[c] = at;
    }
}
#endif
