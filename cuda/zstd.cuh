// Zstandard frames (RFC 8878, as hdf5plugin's Zstd filter stores a chunk), decoded on the GPU
// (cuda/zstd.cu) or by one host thread (built with -DZSTD_HOST: the CPU tests check this same code
// against libzstd). Two ways:
// - zstd_frame: a frame by one warp whose lanes step through it in lockstep. Every lane holds the
//   same decoding state; the lanes split the work that is parallel: a Huffman table's fill, the 4
//   literal streams of a block (a lane each), and the copies. Literals decoded from Huffman streams
//   (or an RLE byte) are written at the end of the output, behind where this block's output can
//   reach, and copied down as the sequences take them, so no scratch memory is needed.
// - zstd_plan, zstd_block_apart, zstd_run: a frame's blocks decoded apart, each by a warp of its own
//   into scratch memory, then carried out in order by another (zstd_kernel2).
// Damaged input never reads or writes out of bounds: the result is ZSTD_BAD (damaged, or reading
// past the frame), or ZSTD_FULL (more output than the capacity). Not supported (ZSTD_BAD):
// dictionaries, several frames in one chunk. A content checksum is skipped.

#ifdef ZSTD_HOST
#define ZDEV static
#define ZCONST static const
#define ZSYNC()
#define ZALL(ok) (ok)
#define ZBALLOT(x) ((unsigned)(x))
#define ZANY(x) (x)
#define ZSHFL(v, k) ((void)(k), (v))
#define ZLANES 1
#include <string.h>
#else
#define ZDEV __device__ __forceinline__
#define ZCONST __constant__
#define ZSYNC() __syncwarp()
#define ZALL(ok) __all_sync(0xffffffffu, (ok))
#define ZBALLOT(x) __ballot_sync(0xffffffffu, (x))
#define ZANY(x) __any_sync(0xffffffffu, (x))
#define ZSHFL(v, k) __shfl_sync(0xffffffffu, (v), (k))
#define ZLANES 32
#endif

#define ZSTD_OK 0
#define ZSTD_BAD 1
#define ZSTD_FULL 2

typedef unsigned char zu8;
typedef unsigned short zu16;
typedef unsigned int zu32;
typedef unsigned long long zu64;
typedef long long zi64;

// An FSE table entry: the next state's base and the bits to read for it; the symbol, or for the
// sequence codes the code's value: its base (value) and its extra bits.
typedef struct __attribute__((aligned(8))) { zu32 value; zu16 base; zu8 bits, extra; } ZEntry;  // one 8-byte load

#define ZBLOCK_MAX 131072  // a block's most bytes, stored or decoded
#define ZOUT_MAX ((1 << 30) - 1)  // a frame's most output (positions are 32-bit); more is ZSTD_FULL

typedef struct {
    zu16 huf[1 << 11];        // Huffman: symbol | bits << 8, indexed by the next huf_bits bits
    ZEntry ll[1 << 9], ml[1 << 9], of[1 << 8], tmp[1 << 6];  // the sequences' tables; tmp: Huffman weights'
    int norm[64];             // while a table is built: its normalized counts, then each symbol's next state
    zu8 weights[256];
    int huf_bits;             // 0: no Huffman table yet
} ZTables;
#ifndef ZTABLES_BYTES
#define ZTABLES_BYTES 15368  // sizeof(ZTables): zstd_kernel2 takes (ZWARPS - 1) of them as dynamic shared memory
#endif
#ifdef ZSTD_HOST
_Static_assert(sizeof(ZTables) == ZTABLES_BYTES, "ZTABLES_BYTES");
#else
static_assert(sizeof(ZTables) == ZTABLES_BYTES, "ZTABLES_BYTES");
#endif

ZCONST zu32 ZLL_BASE[36] = {0,  1,  2,  3,  4,  5,  6,   7,   8,   9,   10,   11,   12,   13,   14,   15,    16,    18,
                            20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
ZCONST zu8 ZLL_BITS[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1,
                           1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
ZCONST zu32 ZML_BASE[53] = {3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,  16,  17,  18,   19,   20,
                            21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,  34,  35,  37,   39,   41,
                            43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051, 4099, 8195, 16387, 32771, 65539};
ZCONST zu8 ZML_BITS[53] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                           0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
// The predefined distributions (Predefined_Mode): literal lengths and match lengths at accuracy 6, offsets at 5.
ZCONST signed char ZLL_NORM[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2,
                                   2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
ZCONST signed char ZML_NORM[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                   1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};
ZCONST signed char ZOF_NORM[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};

ZDEV int zhigh(zu64 v) {  // the highest set bit of v > 0
    int h = 0;
    while (v >>= 1) ++h;
    return h;
}

ZDEV zu64 zmask(int n) { return n <= 0 ? 0ull : n >= 64 ? ~0ull : (~0ull >> (64 - n)); }

// A bitstream read backwards (FSE and Huffman), libzstd's way: c holds the 8 bytes from src[at] on
// (little-endian), the next bit the highest not yet used; bits past the stream's start read as zeros.
typedef struct {
    const zu8* src;
    zu64 c;
    int at, used, pad;  // pad: for streams under 8 bytes, the zero bits below the stream in c
} ZBack;

ZDEV zu64 zload8(const zu8* p) {  // p[0..8), little-endian
#ifdef ZSTD_HOST
    zu64 c = 0;
    for (int i = 0; i < 8; ++i) c |= (zu64)p[i] << (8 * i);
    return c;
#else  // the aligned words holding them: two loads, not eight (never past the word of the last byte)
    const unsigned long long a = (unsigned long long)p;
    const zu64* w = (const zu64*)(a & ~7ull);
    const int shift = (int)(a & 7) * 8;
    return shift ? (w[0] >> shift) | (w[1] << (64 - shift)) : w[0];
#endif
}

ZDEV zi64 zback_left(const ZBack* b) { return 8 * (zi64)b->at + 64 - b->used - b->pad; }

// Start at the stream's end, past its last byte's padding and marker bit; 0 for an empty stream or a
// last byte of 0.
ZDEV int zback_init(ZBack* b, const zu8* src, zi64 len) {
    if (len <= 0 || len > 0x7fffffff || src[len - 1] == 0) return 0;
    b->src = src;
    if (len >= 8) {
        b->at = (int)(len - 8);
        b->pad = 0;
        b->c = zload8(src + b->at);
    } else {
        b->at = 0;
        b->pad = 8 * (8 - (int)len);
        b->c = 0;
        for (int i = 0; i < len; ++i) b->c |= (zu64)src[i] << (8 * i + b->pad);
    }
    b->used = 8 - zhigh(src[len - 1]);
    return 1;
}

// Make at least `need` bits (<= 57) readable, where the stream has them: the container moves down
// by the whole bytes used.
ZDEV void zback_need(ZBack* b, int need) {
    if (64 - b->used >= need || b->at == 0) return;
    const int n = (b->used >> 3) < b->at ? b->used >> 3 : b->at;
    b->at -= n;
    b->used -= 8 * n;
    b->c = zload8(b->src + b->at);
}

ZDEV zu64 zback_top(const ZBack* b) { return b->used >= 64 ? 0ull : b->c << b->used; }  // the next bit highest

ZDEV zu32 zfield(zu64 top, int at, int n) {  // n <= 32 bits of top from bit `at` down (at + n <= 64)
    return n ? (zu32)((top << at) >> (64 - n)) : 0u;
}

ZDEV zu32 zback_peek(const ZBack* b, int n) {  // the next n <= 32 bits (made readable before)
    return n ? (zu32)(zback_top(b) >> (64 - n)) : 0u;
}

ZDEV zu32 zback_read(ZBack* b, int n) {
    const zu32 v = zback_peek(b, n);
    b->used += n;
    return v;
}

ZDEV zu32 zfwd(const zu8* src, zi64 bit, int n) {  // n bits from bit `bit` on, read forwards (little-endian)
    zu32 v = 0;
    for (int i = 0; i < n; ++i) v |= (zu32)((src[(bit + i) >> 3] >> ((bit + i) & 7)) & 1u) << i;
    return v;
}

// An FSE table description (RFC 8878 4.1.1) at src[*at..end) into t->norm: the accuracy log, or -1
// for damage (an accuracy over max_log, a symbol past max_symbol, counts that do not add up, or
// running past end); *at moves past it, *symbols is the number of counts.
ZDEV int zfse_counts(ZTables* t, const zu8* src, zi64* at, zi64 end, int max_log, int max_symbol, int* symbols) {
    zi64 bit = 8 * *at;
    const zi64 stop = 8 * end;
    if (bit + 4 > stop) return -1;
    const int log = (int)zfwd(src, bit, 4) + 5;
    bit += 4;
    if (log > max_log) return -1;
    int remaining = 1 << log, s = 0;
    while (remaining > 0) {
        if (s > max_symbol) return -1;
        const int n = zhigh((zu64)remaining + 1) + 1;  // small values take n - 1 bits
        const zu32 low = (1u << (n - 1)) - 1u, threshold = (1u << n) - 1u - (zu32)(remaining + 1);
        if (bit + n - 1 > stop) return -1;
        zu32 val = zfwd(src, bit, n - 1);
        if (val < threshold) {
            bit += n - 1;
        } else {
            if (bit + n > stop) return -1;
            val |= zfwd(src, bit + n - 1, 1) << (n - 1);
            if (val > low) val -= threshold;
            bit += n;
        }
        const int p = (int)val - 1;  // -1: "less than 1", a cell of its own
        remaining -= p < 0 ? -p : p;
        t->norm[s++] = p;
        if (p == 0) {  // then 2-bit counts of more zeros, 3 meaning 3 and another count
            for (;;) {
                if (bit + 2 > stop) return -1;
                const int repeat = (int)zfwd(src, bit, 2);
                bit += 2;
                for (int i = 0; i < repeat; ++i) {
                    if (s > max_symbol) return -1;
                    t->norm[s++] = 0;
                }
                if (repeat != 3) break;
            }
        }
    }
    if (remaining != 0) return -1;
    *at = (bit + 7) >> 3;
    *symbols = s;
    return log;
}

// The decoding table of t->norm's `symbols` counts at accuracy `log` (the format's spread of each
// symbol's cells, "less than 1" symbols at the top), built by lane 0 while the others wait. 0 where
// the counts do not fill the table.
ZDEV int zfse_build(ZTables* t, ZEntry* table, int log, int symbols, int lane) {
    int ok = 1;
    if (lane == 0) {
        const int size = 1 << log, step = (size >> 1) + (size >> 3) + 3, mask = size - 1;
        int high = size, pos = 0;
        for (int s = 0; s < symbols; ++s)
            if (t->norm[s] == -1) table[--high].value = (zu8)s;
        for (int s = 0; s < symbols; ++s)
            for (int i = 0; i < t->norm[s]; ++i) {
                table[pos].value = (zu8)s;
                do pos = (pos + step) & mask;
                while (pos >= high);
            }
        ok = pos == 0;
        for (int s = 0; s < symbols; ++s)
            if (t->norm[s] == -1) t->norm[s] = 1;
        for (int u = 0; u < size && ok; ++u) {  // each cell: its symbol's next state, then bits and base
            const int next = t->norm[table[u].value]++;  // the value holds the symbol while the table is built
            const int bits = log - zhigh((zu64)next);
            table[u].bits = (zu8)bits;
            table[u].base = (zu16)((next << bits) - size);
        }
    }
    ZSYNC();
    return ZALL(ok);
}

// A table of a sequence code, kind 0 literal lengths, 1 offsets, 2 match lengths (mode: 0
// predefined, 1 RLE, 2 described at src[*at..end), 3 repeated from the block before), each entry
// holding its code's base value and extra bits. Returns its accuracy log, or -1.
ZDEV int zseq_table(ZTables* t, ZEntry* table, int kind, int mode, int log_before, const zu8* src, zi64* at,
                    zi64 end, int lane) {
    if (mode == 3) return log_before;
    const int max_symbol = kind == 0 ? 35 : kind == 1 ? 31 : 52;
    int log = 0;
    if (mode == 1) {
        if (*at >= end || src[*at] > max_symbol) return -1;
        if (lane == 0) {
            table[0].value = src[*at];
            table[0].bits = 0;
            table[0].base = 0;
        }
        ZSYNC();
        *at += 1;
    } else {
        int symbols;
        if (mode == 0) {
            const signed char* norm = kind == 0 ? ZLL_NORM : kind == 1 ? ZOF_NORM : ZML_NORM;
            symbols = kind == 0 ? 36 : kind == 1 ? 29 : 53;
            log = kind == 1 ? 5 : 6;
            for (int s = lane; s < symbols; s += ZLANES) t->norm[s] = norm[s];
            ZSYNC();
        } else {
            log = zfse_counts(t, src, at, end, kind == 1 ? 8 : 9, max_symbol, &symbols);
            if (log < 0) return -1;
        }
        if (!zfse_build(t, table, log, symbols, lane)) return -1;
    }
    for (int u = lane; u < 1 << log; u += ZLANES) {
        const int s = (int)table[u].value;
        table[u].extra = (zu8)(kind == 0 ? ZLL_BITS[s] : kind == 1 ? s : ZML_BITS[s]);
        table[u].value = kind == 0 ? ZLL_BASE[s] : kind == 1 ? 1u << s : ZML_BASE[s];
    }
    ZSYNC();
    return log;
}

// The Huffman table of t->weights' n weights (the last symbol's weight is implied): 1 or 0.
ZDEV int zhuf_table(ZTables* t, int n, int lane) {
    zu32 sum = 0;
    for (int s = 0; s < n; ++s) {
        if (t->weights[s] > 11) return 0;
        if (t->weights[s]) sum += 1u << (t->weights[s] - 1);
    }
    if (sum == 0 || n > 255) return 0;
    const int bits = zhigh(sum) + 1;
    const zu32 left = (1u << bits) - sum;
    if (bits > 11 || (left & (left - 1))) return 0;
    const int last = zhigh(left) + 1;
    int start[13];  // the first cell of each weight's symbols: the longest codes (weight 1) first
    int count[13];
    for (int w = 0; w < 13; ++w) count[w] = 0;
    for (int s = 0; s < n; ++s) count[t->weights[s]]++;
    count[last]++;
    start[1] = 0;
    for (int w = 1; w < 12; ++w) start[w + 1] = start[w] + (count[w] << (w - 1));
    for (int s = 0; s <= n; ++s) {
        const int w = s < n ? t->weights[s] : last;
        if (!w) continue;
        const int len = 1 << (w - 1), at = start[w];
        start[w] += len;
        const zu16 e = (zu16)(s | (bits + 1 - w) << 8);
        for (int j = lane; j < len; j += ZLANES) t->huf[at + j] = e;
    }
    t->huf_bits = bits;
    ZSYNC();
    return 1;
}

// A Huffman tree description at src[0..size): the table built; its bytes, or -1.
ZDEV int zhuf_description(ZTables* t, const zu8* src, zi64 size, int lane) {
    if (size < 1) return -1;
    const int head = src[0];
    int n = 0;
    zi64 used;
    if (head >= 128) {  // weights of 4 bits, two a byte
        n = head - 127;
        used = 1 + (n + 1) / 2;
        if (used > size) return -1;
        for (int s = lane; s < n; s += ZLANES) t->weights[s] = (zu8)((s & 1) ? src[1 + s / 2] & 15 : src[1 + s / 2] >> 4);
        ZSYNC();
    } else {  // weights coded with FSE, two interleaved states
        used = 1 + head;
        if (used > size) return -1;
        zi64 at = 1;
        int symbols;
        const int log = zfse_counts(t, src, &at, used, 6, 12, &symbols);
        if (log < 0 || !zfse_build(t, t->tmp, log, symbols, lane)) return -1;
        ZBack b;
        if (!zback_init(&b, src + at, used - at)) return -1;
        zback_need(&b, 2 * log);
        zu32 state[2];
        state[0] = zback_read(&b, log);
        state[1] = zback_read(&b, log);
        for (int k = 0;; k ^= 1) {  // the states take turns; where the bits run out, the other's symbol ends the list
            if (n > 254) return -1;
            const ZEntry e = t->tmp[state[k]];
            t->weights[n++] = e.value;
            zback_need(&b, e.bits);
            state[k] = e.base + zback_read(&b, e.bits);
            if (zback_left(&b) < 0) {
                t->weights[n++] = t->tmp[state[k ^ 1]].value;
                break;
            }
        }
        ZSYNC();
    }
    return zhuf_table(t, n, lane) ? (int)used : -1;
}

// One Huffman stream: n literals into out; 1 where it decodes to exactly its bits.
ZDEV int zhuf_stream(const ZTables* t, const zu8* src, zi64 size, zu8* out, zi64 n) {
    ZBack b;
    if (n <= 0) return n == 0 && size == 0;
    if (!zback_init(&b, src, size)) return 0;
    const int bits = t->huf_bits;  // at most 11: four codes a refill
    zi64 i = 0;
    for (; i + 4 <= n; i += 4) {
        zback_need(&b, 4 * bits);
        for (int j = 0; j < 4; ++j) {
            const zu32 e = t->huf[zback_peek(&b, bits)];
            out[i + j] = (zu8)e;
            b.used += e >> 8;
        }
    }
    for (; i < n; ++i) {
        zback_need(&b, bits);
        const zu32 e = t->huf[zback_peek(&b, bits)];
        out[i] = (zu8)e;
        b.used += e >> 8;
    }
    return zback_left(&b) == 0;
}

#define ZSTEP 8    // bytes a lane moves a step of the warp's copies (a step: up to ZLANES x ZSTEP bytes)
#define ZLONG 128  // a batch's copies longer than this are the warp's, one after another; shorter ones a lane's

// n bytes from src to dst by the warp, at most `step` (<= ZLANES x ZSTEP) a step, each step's loads
// before its stores: for buffers apart, dst <= src (copying down; they may overlap), or src + step <=
// dst (a match at least step bytes back: a step loads only bytes stored before it).
ZDEV void zcopy_warp(zu8* dst, const zu8* src, zi64 n, int step, int lane) {
    for (zi64 i = 0; i < n; i += step) {
        zu8 v[ZSTEP];
        for (int j = 0; j < ZSTEP; ++j) {
            const int at = j * ZLANES + lane;
            v[j] = at < step && i + at < n ? src[i + at] : 0;
        }
        ZSYNC();
        for (int j = 0; j < ZSTEP; ++j) {
            const int at = j * ZLANES + lane;
            if (at < step && i + at < n) dst[i + at] = v[j];
        }
        ZSYNC();
    }
}

// n bytes copied by one lane, 16 loads ahead of their stores (src and dst do not overlap).
ZDEV void zcopy_lane(zu8* __restrict__ dst, const zu8* __restrict__ src, zi64 n) {
    for (zi64 i = 0; i < n; i += 16) {
        zu8 v[16];
        for (int j = 0; j < 16; ++j) v[j] = i + j < n ? src[i + j] : 0;
        for (int j = 0; j < 16; ++j)
            if (i + j < n) dst[i + j] = v[j];
    }
}

ZDEV int zlowest(unsigned x) {  // the lowest set bit of x > 0
#ifdef ZSTD_HOST
    int k = 0;
    while (!(x & 1u)) x >>= 1, ++k;
    return k;
#else
    return __ffs(x) - 1;
#endif
}

// A match: n bytes at out[o] from off bytes back (1 <= off <= o).
ZDEV void zmatch(zu8* out, zi64 o, zi64 off, zi64 n, int lane) {
    if (off >= ZLANES) {  // steps of at most off bytes: a step loads only bytes stored before it
        zcopy_warp(out + o, out + o - off, n, (int)(off < ZLANES * ZSTEP ? off : ZLANES * ZSTEP), lane);
    } else {  // a period under a step: steps of whole periods, each lane storing the same byte every step
        const int step = (int)((ZLANES / off) * off);
        if (lane < step) {
            const zu8 v = out[o - off + lane % off];
            for (zi64 i = lane; i < n; i += step) out[o + i] = v;
        }
        ZSYNC();
    }
}

typedef struct {
    zu32 rep[3];  // the repeated offsets
    int ll_log, of_log, ml_log;  // -1: no table yet
} ZFrame;

// A block's literals section (RFC 8878 3.1.1.3.1): type (0 stored, 1 a byte repeated, 2 Huffman
// coded with its tree, 3 with the tree before), size format, header bytes, literals; its bytes
// (header included) and, past the header, its stored bytes (Huffman: tree description and streams).
typedef struct {
    int type, format, head, n;
    zi64 bytes, stored;
} ZLits;

// The literals section header of the block src[0..size): 1, or 0 for damage.
ZDEV int zlits_head(ZLits* l, const zu8* src, zi64 size) {
    if (size < 1) return 0;
    l->type = src[0] & 3;
    l->format = (src[0] >> 2) & 3;
    if (l->type <= 1) {
        l->head = l->format == 1 ? 2 : l->format == 3 ? 3 : 1;
        if (l->head > size) return 0;
        l->n = l->format == 1 ? (src[0] >> 4) | (src[1] << 4)
             : l->format == 3 ? (src[0] >> 4) | (src[1] << 4) | (src[2] << 12) : src[0] >> 3;
        l->stored = l->type == 0 ? l->n : 1;
    } else {
        l->head = l->format <= 1 ? 3 : l->format + 2;
        if (l->head > size) return 0;
        zu64 h = 0;
        for (int i = 0; i < l->head; ++i) h |= (zu64)src[i] << (8 * i);
        const int width = l->format <= 1 ? 10 : l->format == 2 ? 14 : 18;
        l->n = (int)((h >> 4) & zmask(width));
        l->stored = (zi64)((h >> (4 + width)) & zmask(width));
    }
    l->bytes = l->head + l->stored;
    return l->n <= ZBLOCK_MAX && l->bytes <= size;
}

ZDEV void zfill(zu8* dst, zu8 v, zi64 n, int lane) {
    for (zi64 i = lane; i < n; i += ZLANES) dst[i] = v;
    ZSYNC();
}

// The Huffman coded literals of section l of the block src into dst, its tree built first where it
// has one (else t's is used): 1, or 0 for damage.
ZDEV int zlits_huffman(ZTables* t, const ZLits* l, const zu8* src, zu8* dst, int lane) {
    const zu8* p = src + l->head;
    zi64 left = l->stored;
    if (l->type == 2) {
        const int used = zhuf_description(t, p, left, lane);
        if (used < 0) return 0;
        p += used;
        left -= used;
    } else if (!t->huf_bits) {
        return 0;
    }
    const zi64 nlits = l->n;
    int ok;
    if (l->format == 0) {
        ok = lane == 0 ? zhuf_stream(t, p, left, dst, nlits) : 1;
    } else {  // a jump table of 3 sizes, then 4 streams of (nlits + 3) / 4 literals, the last the rest: a lane each
        if (left < 6) return 0;
        const zi64 s1 = p[0] | p[1] << 8, s2 = p[2] | p[3] << 8, s3 = p[4] | p[5] << 8;
        const zi64 s4 = left - 6 - s1 - s2 - s3, part = (nlits + 3) / 4;
        if (s4 < 0 || nlits - 3 * part < 0) return 0;
        ok = 1;
        for (int s = lane; s < 4; s += ZLANES) {
            const zi64 from = 6 + (s > 0 ? s1 : 0) + (s > 1 ? s2 : 0) + (s > 2 ? s3 : 0);
            const zi64 bytes = s == 0 ? s1 : s == 1 ? s2 : s == 2 ? s3 : s4;
            ok &= zhuf_stream(t, p + from, bytes, dst + s * part, s == 3 ? nlits - 3 * part : part);
        }
    }
    ZSYNC();
    return ZALL(ok);
}

// The sequences section's count, from src[*at] on (the block's bytes to size); *at moves past it.
// -1 for damage.
ZDEV int zseq_count(const zu8* src, zi64* at, zi64 size) {
    if (*at >= size) return -1;
    int nseq = src[*at];
    if (nseq < 128) {
        *at += 1;
    } else if (nseq < 255) {
        if (*at + 2 > size) return -1;
        nseq = ((nseq - 128) << 8) + src[*at + 1];
        *at += 2;
    } else {
        if (*at + 3 > size) return -1;
        nseq = src[*at + 1] + (src[*at + 2] << 8) + 0x7F00;
        *at += 3;
    }
    return nseq;
}

// The three codes' tables of a block with sequences, from its modes byte at src[*at] on: those it
// describes, predefines or gives as RLE built into t, repeated ones left as they are; *at moves past
// them. 1, or 0 for damage (where `need`, a repeated table where there is none).
ZDEV int zseq_tables(ZTables* t, ZFrame* f, const zu8* src, zi64* at, zi64 size, int need, int lane) {
    if (*at >= size) return 0;
    const int modes = src[(*at)++];
    if (modes & 3) return 0;
    const int ll = zseq_table(t, t->ll, 0, modes >> 6, f->ll_log, src, at, size, lane);
    if (ll < 0 && (need || modes >> 6 != 3)) return 0;
    const int of = zseq_table(t, t->of, 1, (modes >> 4) & 3, f->of_log, src, at, size, lane);
    if (of < 0 && (need || ((modes >> 4) & 3) != 3)) return 0;
    const int ml = zseq_table(t, t->ml, 2, (modes >> 2) & 3, f->ml_log, src, at, size, lane);
    if (ml < 0 && (need || ((modes >> 2) & 3) != 3)) return 0;
    f->ll_log = ll;
    f->of_log = of;
    f->ml_log = ml;
    return 1;
}

// The next sequence's offset value and lengths and, where more follow, the three states (RFC 8878
// 3.1.1.3.2). The fields are read side by side from one container where its bits are there (the
// common case), else in two goes; then the container is refilled for the next sequence, loaded
// while its table entries are.
ZDEV void zseq_next(const ZTables* t, ZBack* b, zu32* ls, zu32* os, zu32* ms, int more, zu32* offset_value,
                    int* ll, int* ml) {
    const ZEntry L = t->ll[*ls], O = t->of[*os], M = t->ml[*ms];
    // the fields' places: offset, match and literal extra bits, then the three states
    const int e1 = O.extra, e2 = e1 + M.extra, e3 = e2 + L.extra;
    const int s1 = e3 + (more ? L.bits : 0), s2 = s1 + (more ? M.bits : 0), s3 = s2 + (more ? O.bits : 0);
    if (s3 <= 64 - b->used) {
        const zu64 top = zback_top(b);
        *offset_value = O.value + zfield(top, 0, e1);
        *ml = (int)(M.value + zfield(top, e1, M.extra));  // each length under 2^18
        *ll = (int)(L.value + zfield(top, e2, L.extra));
        *ls = L.base + zfield(top, e3, s1 - e3);
        *ms = M.base + zfield(top, s1, s2 - s1);
        *os = O.base + zfield(top, s2, s3 - s2);
        b->used += s3;
    } else {  // up to 31 + 16 bits, then 16 + 9 + 9 + 8
        zback_need(b, e2);
        *offset_value = O.value + zback_read(b, O.extra);
        *ml = (int)(M.value + zback_read(b, M.extra));
        zback_need(b, s3 - e2);
        *ll = (int)(L.value + zback_read(b, L.extra));
        *ls = L.base + zback_read(b, s1 - e3);
        *ms = M.base + zback_read(b, s2 - s1);
        *os = O.base + zback_read(b, s3 - s2);
    }
    zback_need(b, 57);
}

// A sequence's offset from its offset value, and the repeated offsets moved on (RFC 8878 3.2.2),
// in registers and without branches. less(): the first repeated offset less one.
#define ZREPEAT(offset_value, ll, off, rep0, rep1, rep2, less)                                                   \
    do {                                                                                                        \
        const int r_ = (offset_value) > 3 ? -1 : (int)(offset_value) - 1 + ((ll) == 0);                          \
        off = r_ < 0 ? (offset_value) - 3 : r_ == 0 ? rep0 : r_ == 1 ? rep1 : r_ == 2 ? rep2 : less(rep0);      \
        const zu32 next2_ = r_ == 0 || r_ == 1 ? rep2 : rep1, next1_ = r_ == 0 ? rep1 : rep0;                    \
        rep0 = off;                                                                                             \
        rep1 = next1_;                                                                                          \
        rep2 = next2_;                                                                                          \
    } while (0)
#define ZLESS(v) ((v) - 1)

// A batch's copies, lane k holding the k-th sequence's place, lengths, offset and literals (at lits +
// my_lit; they lie apart from the batch's output), the batch's output starting at `start`: literals,
// and matches reaching before the batch, a lane each (long ones by the whole warp, one after
// another); then the matches into the batch's own output, in order, by the warp.
ZDEV void zbatch(zu8* out, const zu8* lits, int my_at, int my_ll, int my_ml, int my_off, int my_lit, int start,
                 int lane) {
    const int to = my_at + my_ll, from = to - my_off;
    const int before = my_ml == 0 || from + my_ml <= start, long_lits = my_ll > ZLONG, long_far = before && my_ml > ZLONG;
    if (!long_lits) zcopy_lane(out + my_at, lits + my_lit, my_ll);
    if (before && !long_far) zcopy_lane(out + to, out + from, my_ml);
    ZSYNC();
    for (unsigned rest = ZBALLOT(long_lits || long_far); rest; rest &= rest - 1) {
        const int k = zlowest(rest);
        if (ZSHFL(long_lits, k))
            zcopy_warp(out + ZSHFL(my_at, k), lits + ZSHFL(my_lit, k), ZSHFL(my_ll, k), ZLANES * ZSTEP, lane);
        if (ZSHFL(long_far, k))
            zcopy_warp(out + ZSHFL(to, k), out + ZSHFL(from, k), ZSHFL(my_ml, k), ZLANES * ZSTEP, lane);
    }
    for (unsigned rest = ZBALLOT(!before); rest; rest &= rest - 1) {
        const int k = zlowest(rest);
        zmatch(out, ZSHFL(to, k), ZSHFL(my_off, k), ZSHFL(my_ml, k), lane);
    }
}

// A compressed block, src[0..size), its output from out[*o] on (out holds cap bytes), decoded by one
// warp (zstd_kernel1). Its literals are decoded into the end of the output, behind where the block's
// output can reach, and copied down as the sequences take them.
ZDEV int zblock(ZTables* t, ZFrame* f, const zu8* src, zi64 size, zu8* out, zi64* o, zi64 cap, int lane) {
    ZLits l;
    if (!zlits_head(&l, src, size)) return ZSTD_BAD;
    const int n_lits = l.n, in_out = l.type != 0;  // in_out: the literals lie at the end of the output
    const zu8* lits = src + l.head;
    if (in_out) {
        if (n_lits > cap - *o) return ZSTD_FULL;
        zu8* dst = out + cap - n_lits;
        if (l.type == 1) zfill(dst, src[l.head], n_lits, lane);
        else if (!zlits_huffman(t, &l, src, dst, lane)) return ZSTD_BAD;
        lits = dst;
    }
    zi64 at = l.bytes;
    const int nseq = zseq_count(src, &at, size);
    if (nseq < 0) return ZSTD_BAD;
    int used = 0;  // literals taken
    if (nseq > 0) {
        if (!zseq_tables(t, f, src, &at, size, 1, lane)) return ZSTD_BAD;
        ZBack b;
        if (!zback_init(&b, src + at, size - at)) return ZSTD_BAD;
        zback_need(&b, f->ll_log + f->of_log + f->ml_log);
        zu32 ls = zback_read(&b, f->ll_log), os = zback_read(&b, f->of_log), ms = zback_read(&b, f->ml_log);
        zback_need(&b, 57);
        // ZLANES sequences at a time: decoded in lockstep, lane k keeping the k-th, then copied by
        // zbatch. (A batch whose output reaches the literals still to be read, at the end of the
        // output, runs in order, the whole warp a sequence.) Positions are 32-bit (the output is
        // under ZOUT_MAX); a batch's checks are gathered and acted on before its copies.
        zu32 rep0 = f->rep[0], rep1 = f->rep[1], rep2 = f->rep[2];
        const int room = (int)cap;
        int at_out = (int)*o;  // the output position, in a register
        for (int first = 0; first < nseq; first += ZLANES) {
            const int start = at_out, unread = room - n_lits + used;  // the batch's literals lie from unread on
            int my_at = 0, my_ll = 0, my_ml = 0, my_off = 0, my_lit = 0, bad = 0, full = 0;
            for (int k = 0; k < ZLANES && first + k < nseq; ++k) {
                zu32 offset_value, off;
                int ll, ml;
                zseq_next(t, &b, &ls, &os, &ms, first + k + 1 < nseq, &offset_value, &ll, &ml);
                ZREPEAT(offset_value, ll, off, rep0, rep1, rep2, ZLESS);
                bad |= (ll > n_lits - used) | (off == 0) | (off > (zu32)(at_out + ll));
                // the output never passes the literals not yet taken (where they lie in it)
                full |= at_out + ll + ml > (in_out ? room - n_lits + used + ll : room);
                if (lane == k) {
                    my_at = at_out;
                    my_ll = ll;
                    my_ml = ml;
                    my_off = (int)off;
                    my_lit = used;
                }
                at_out += ll + ml;
                used += ll;
            }
            if (bad) return ZSTD_BAD;
            if (full) return ZSTD_FULL;
            if (in_out && at_out > unread) {  // the batch's output reaches its literals: in order
                for (int k = 0; k < ZLANES && first + k < nseq; ++k) {
                    zcopy_warp(out + ZSHFL(my_at, k), lits + ZSHFL(my_lit, k), ZSHFL(my_ll, k), ZLANES * ZSTEP, lane);
                    zmatch(out, ZSHFL(my_at + my_ll, k), ZSHFL(my_off, k), ZSHFL(my_ml, k), lane);
                }
                continue;
            }
            zbatch(out, lits, my_at, my_ll, my_ml, my_off, my_lit, start, lane);
        }
        f->rep[0] = rep0;
        f->rep[1] = rep1;
        f->rep[2] = rep2;
        *o = at_out;
        if (zback_left(&b) != 0) return ZSTD_BAD;
    } else if (at != size) {
        return ZSTD_BAD;
    }
    if (n_lits - used > cap - *o) return ZSTD_FULL;
    zcopy_warp(out + *o, lits + used, n_lits - used, ZLANES * ZSTEP, lane);
    *o += n_lits - used;
    return ZSTD_OK;
}

// A frame's header: ZSTD_OK with *at its first block's header, *fhd its descriptor, *fcs_bytes and
// *content its content size (where it has one); else ZSTD_BAD, or ZSTD_FULL for content over cap.
ZDEV int zframe_head(const zu8* src, zi64 size, zi64 cap, zi64* at, int* fhd, int* fcs_bytes, zu64* content) {
    if (size < 8 || (src[0] | src[1] << 8 | src[2] << 16 | (zu32)src[3] << 24) != 0xFD2FB528u) return ZSTD_BAD;
    *fhd = src[4];
    const int single = (*fhd >> 5) & 1, fcs_flag = *fhd >> 6;
    if (*fhd & 8) return ZSTD_BAD;  // reserved
    *at = 5 + !single;
    const int dict_bytes = (*fhd & 3) == 3 ? 4 : *fhd & 3;
    for (int i = 0; i < dict_bytes; ++i)
        if (*at + i >= size || src[*at + i]) return ZSTD_BAD;  // a dictionary
    *at += dict_bytes;
    *fcs_bytes = fcs_flag == 0 ? single : 1 << fcs_flag;
    if (*at + *fcs_bytes > size) return ZSTD_BAD;
    *content = 0;
    for (int i = 0; i < *fcs_bytes; ++i) *content |= (zu64)src[*at + i] << (8 * i);
    if (*fcs_bytes == 2) *content += 256;
    *at += *fcs_bytes;
    if (*fcs_bytes && *content > (zu64)cap) return ZSTD_FULL;
    return ZSTD_OK;
}

// Past the last block: the content checksum (not checked), then the frame's end; the content size.
ZDEV int zframe_end(zi64 at, zi64 size, int fhd, int fcs_bytes, zu64 content, zi64 decoded) {
    at += 4 * ((fhd >> 2) & 1);
    return at != size || (fcs_bytes && (zu64)decoded != content) ? ZSTD_BAD : ZSTD_OK;
}

// One frame, src[0..size), into out (cap bytes) by one warp: ZSTD_OK with *decoded its size, or
// ZSTD_BAD / _FULL.
ZDEV int zstd_frame(ZTables* t, const zu8* src, zi64 size, zu8* out, zi64 cap, zi64* decoded, int lane) {
    *decoded = 0;
    if (cap > ZOUT_MAX) cap = ZOUT_MAX;
    zi64 at;
    int fhd, fcs_bytes;
    zu64 content;
    const int head = zframe_head(src, size, cap, &at, &fhd, &fcs_bytes, &content);
    if (head != ZSTD_OK) return head;
    t->huf_bits = 0;
    ZFrame f;
    f.rep[0] = 1;
    f.rep[1] = 4;
    f.rep[2] = 8;
    f.ll_log = f.of_log = f.ml_log = -1;
    zi64 o = 0;
    for (int last = 0; !last;) {
        if (at + 3 > size) return ZSTD_BAD;
        const zu32 h = src[at] | src[at + 1] << 8 | src[at + 2] << 16;
        last = h & 1;
        const int type = (h >> 1) & 3;
        const zi64 n = h >> 3;
        at += 3;
        if (type == 3 || n > ZBLOCK_MAX) return ZSTD_BAD;
        if (type == 2) {
            if (at + n > size) return ZSTD_BAD;
            const int status = zblock(t, &f, src + at, n, out, &o, cap, lane);
            if (status != ZSTD_OK) return status;
            at += n;
            continue;
        }
        if (at + (type == 0 ? n : 1) > size) return ZSTD_BAD;
        if (n > cap - o) return ZSTD_FULL;
        if (type == 0) zcopy_warp(out + o, src + at, n, ZLANES * ZSTEP, lane);
        else zfill(out + o, src[at], n, lane);
        o += n;
        at += type == 0 ? n : 1;
    }
    if (zframe_end(at, size, fhd, fcs_bytes, content, o) != ZSTD_OK) return ZSTD_BAD;
    *decoded = o;
    return ZSTD_OK;
}

// ---- A frame's blocks decoded apart (zstd_kernel2): a plan of its blocks, each compressed block's
// literals and sequences decoded by a warp of its own into scratch memory (zstd_block_apart), the
// sequences carried out in order by another warp (zstd_block_run).

#define ZMAX_BLOCKS 128  // blocks a plan holds: a frame of more is decoded whole, by zstd_frame
#define ZREL (1u << 30)  // a block's offsets from zstd_block_apart: v < ZREL an offset; (r + 1) << 30 | d the
                         // block's r-th repeated offset as it starts, less d
#define ZREL_LESS(v) ((v) < ZREL ? (v) - 1 : (v) + 1)

typedef struct {
    int blocks;                 // 0: the frame is decoded whole (zstd_frame)
    int fhd, fcs_bytes, head;   // head: the header's status (zframe_head)
    zu64 content;
    zi64 end;                   // where the last block ends
    int at[ZMAX_BLOCKS], size[ZMAX_BLOCKS];  // a block's bytes in the frame, past its header
    int n[ZMAX_BLOCKS];         // raw and RLE blocks: their bytes; compressed: their literals
    int nseq[ZMAX_BLOCKS];
    zi64 lits[ZMAX_BLOCKS];     // where in the scratch memory a block's literals go (-1: stored, read in place)
    zi64 seqs[ZMAX_BLOCKS];     // and its sequences: nseq literal lengths, match lengths, offsets (zu32)
    signed char kind[ZMAX_BLOCKS];     // 0 raw, 1 RLE, 2 compressed
    signed char from[ZMAX_BLOCKS][4];  // the blocks describing its Huffman, LL, OF and ML tables (-1: none)
    int status[ZMAX_BLOCKS];    // zstd_block_apart's
    zu32 rep[ZMAX_BLOCKS][3];   // the repeated offsets at a block's end, as its offsets are given (ZREL)
    volatile int ready[ZMAX_BLOCKS];  // zstd_block_apart has written status, rep and the scratch memory
} ZPlan;

// The plan of the frame src[0..size) whose blocks start at `at`: p->blocks stays 0 where they are not
// to be decoded apart (more than ZMAX_BLOCKS, or anything amiss, which zstd_frame then reports);
// returns the scratch bytes the plan needs.
ZDEV zi64 zstd_plan(ZPlan* p, const zu8* src, zi64 size, zi64 at) {
    int last_huf = -1, last_ll = -1, last_of = -1, last_ml = -1, j = 0;
    zi64 need = 0;
    p->blocks = 0;
    for (int final = 0; !final; ++j) {
        if (j == ZMAX_BLOCKS || at + 3 > size) return 0;
        const zu32 h = src[at] | src[at + 1] << 8 | src[at + 2] << 16;
        final = h & 1;
        const int type = (h >> 1) & 3, n = (int)(h >> 3);
        at += 3;
        const int stored = type == 1 ? 1 : n;
        if (type == 3 || n > ZBLOCK_MAX || at + stored > size) return 0;
        p->at[j] = (int)at;
        p->size[j] = stored;
        p->kind[j] = (signed char)type;
        p->n[j] = n;
        p->nseq[j] = 0;
        if (type == 2) {
            ZLits l;
            if (!zlits_head(&l, src + at, n) || (l.type == 3 && last_huf < 0)) return 0;
            if (l.type == 2) last_huf = j;
            p->from[j][0] = (signed char)(l.type >= 2 ? last_huf : -1);
            zi64 q = l.bytes;
            const int nseq = zseq_count(src + at, &q, n);
            if (nseq < 0) return 0;
            p->from[j][1] = p->from[j][2] = p->from[j][3] = -1;
            if (nseq > 0) {
                if (q >= n) return 0;
                const int modes = src[at + q];
                if ((modes >> 6) != 3) last_ll = j;
                if (((modes >> 4) & 3) != 3) last_of = j;
                if (((modes >> 2) & 3) != 3) last_ml = j;
                if (last_ll < 0 || last_of < 0 || last_ml < 0) return 0;
                p->from[j][1] = (signed char)last_ll;
                p->from[j][2] = (signed char)last_of;
                p->from[j][3] = (signed char)last_ml;
            }
            p->n[j] = l.n;
            p->nseq[j] = nseq;
            p->lits[j] = l.type == 0 ? -1 : need;
            need += l.type == 0 ? 0 : (l.n + 15) & ~15;
            p->seqs[j] = need;
            need += (12 * (zi64)nseq + 15) & ~15;
        }
        at += stored;
    }
    p->end = at;
    p->blocks = j;
    return need;
}

// Block j of plan p (compressed) decoded apart, by a warp of its own, with tables t of its own: its
// literals into the scratch memory (stored ones are read in place), its tables built from the blocks
// that describe them, in order, and its sequences into the scratch memory as p->seqs[j] says, their
// offsets as ZREL says; p->rep[j] its repeated offsets at its end. ZSTD_OK or ZSTD_BAD.
ZDEV int zstd_block_apart(ZTables* t, ZPlan* p, int j, const zu8* src, zu8* scratch, int lane) {
    const zu8* blk = src + p->at[j];
    const zi64 size = p->size[j];
    ZLits l;
    if (!zlits_head(&l, blk, size)) return ZSTD_BAD;
    t->huf_bits = 0;
    if (l.type == 3) {  // the tree the last block describing one gave
        const int s = p->from[j][0];
        ZLits tree;
        if (!zlits_head(&tree, src + p->at[s], p->size[s])) return ZSTD_BAD;
        if (zhuf_description(t, src + p->at[s] + tree.head, tree.stored, lane) < 0) return ZSTD_BAD;
    }
    if (l.type == 1) zfill(scratch + p->lits[j], blk[l.head], l.n, lane);
    else if (l.type >= 2 && !zlits_huffman(t, &l, blk, scratch + p->lits[j], lane)) return ZSTD_BAD;
    zi64 at = l.bytes;
    const int nseq = zseq_count(blk, &at, size);
    if (nseq <= 0) return nseq == 0 && at == size ? ZSTD_OK : ZSTD_BAD;
    ZFrame f;  // the tables: each block describing some, in order, this one last
    f.ll_log = f.of_log = f.ml_log = -1;
    for (int done = -1;;) {
        int s = j;
        for (int c = 1; c < 4; ++c)
            if (p->from[j][c] > done && p->from[j][c] < s) s = p->from[j][c];
        zi64 q = at;
        if (s != j) {
            ZLits sl;
            if (!zlits_head(&sl, src + p->at[s], p->size[s])) return ZSTD_BAD;
            q = sl.bytes;
            if (zseq_count(src + p->at[s], &q, p->size[s]) <= 0) return ZSTD_BAD;
        }
        if (!zseq_tables(t, &f, src + p->at[s], &q, p->size[s], s == j, lane)) return ZSTD_BAD;
        if (s == j) {
            at = q;
            break;
        }
        done = s;
    }
    ZBack b;
    if (!zback_init(&b, blk + at, size - at)) return ZSTD_BAD;
    zback_need(&b, f.ll_log + f.of_log + f.ml_log);
    zu32 ls = zback_read(&b, f.ll_log), os = zback_read(&b, f.of_log), ms = zback_read(&b, f.ml_log);
    zback_need(&b, 57);
    zu32* lls = (zu32*)(scratch + p->seqs[j]);
    zu32 *mls = lls + nseq, *offs = mls + nseq;
    zu32 rep0 = ZREL, rep1 = 2 * ZREL, rep2 = 3 * ZREL;
    int used = 0, bad = 0;
    for (int i = 0; i < nseq; ++i) {
        zu32 offset_value, off;
        int ll, ml;
        zseq_next(t, &b, &ls, &os, &ms, i + 1 < nseq, &offset_value, &ll, &ml);
        ZREPEAT(offset_value, ll, off, rep0, rep1, rep2, ZREL_LESS);
        bad |= (ll > l.n - used) | (offset_value > 3 && off >= ZREL);  // an offset past any output
        used += ll;
        if (lane == 0) {
            lls[i] = (zu32)ll;
            mls[i] = (zu32)ml;
            offs[i] = off;
        }
    }
    if (bad || zback_left(&b) != 0) return ZSTD_BAD;
    if (lane == 0) {
        p->rep[j][0] = rep0;
        p->rep[j][1] = rep1;
        p->rep[j][2] = rep2;
    }
    return ZSTD_OK;
}

ZDEV zu32 zrel(zu32 v, zu32 rep0, zu32 rep1, zu32 rep2) {  // an offset of zstd_block_apart's, given the repeated ones
    const zu32 r = v >> 30;
    return r == 0 ? v : (r == 1 ? rep0 : r == 2 ? rep1 : rep2) - (v & (ZREL - 1));
}

ZDEV int zscan(int v, int lane) {  // the inclusive prefix sum of v over the lanes
#ifndef ZSTD_HOST
    for (int d = 1; d < ZLANES; d <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += u;
    }
#else
    (void)lane;
#endif
    return v;
}

// Block j's sequences carried out in order (after zstd_block_apart), ZLANES at a time, lane k taking
// the k-th: offsets made whole with rep[] (the repeated offsets as the block starts, moved on to its
// end), places by prefix sums, checks, zbatch's copies; then the literals left. ZSTD_OK, _BAD, _FULL.
ZDEV int zstd_block_run(const ZPlan* p, int j, const zu8* src, const zu8* scratch, zu8* out, zi64* o, zi64 cap,
                        zu32* rep, int lane) {
    const int n_lits = p->n[j], nseq = p->nseq[j], room = (int)cap;
    const zu8* lits = scratch + p->lits[j];
    if (p->lits[j] < 0) {
        ZLits l;
        zlits_head(&l, src + p->at[j], p->size[j]);
        lits = src + p->at[j] + l.head;
    }
    const zu32* lls = (const zu32*)(scratch + p->seqs[j]);
    const zu32 *mls = lls + nseq, *offs = mls + nseq, rep0 = rep[0], rep1 = rep[1], rep2 = rep[2];
    int at_out = (int)*o, used = 0;
    for (int first = 0; first < nseq; first += ZLANES) {
        const int k = first + lane, in = k < nseq;
        const int ll = in ? (int)lls[k] : 0, ml = in ? (int)mls[k] : 0;
        const zu32 off = in ? zrel(offs[k], rep0, rep1, rep2) : 0;
        const int past = zscan(ll + ml, lane), taken = zscan(ll, lane);  // up to this lane's end
        const int my_at = at_out + past - ll - ml, my_lit = used + taken - ll;
        if (ZANY(in && (my_lit + ll > n_lits || off == 0 || off > (zu32)(my_at + ll)))) return ZSTD_BAD;
        if (ZANY(in && my_at + ll + ml > room)) return ZSTD_FULL;
        zbatch(out, lits, in ? my_at : 0, ll, ml, (int)off, my_lit, at_out, lane);
        at_out += ZSHFL(past, ZLANES - 1);
        used += ZSHFL(taken, ZLANES - 1);
    }
    if (nseq > 0) {
        rep[0] = zrel(p->rep[j][0], rep0, rep1, rep2);
        rep[1] = zrel(p->rep[j][1], rep0, rep1, rep2);
        rep[2] = zrel(p->rep[j][2], rep0, rep1, rep2);
    }
    if (n_lits - used > room - at_out) return ZSTD_FULL;
    zcopy_warp(out + at_out, lits + used, n_lits - used, ZLANES * ZSTEP, lane);
    *o = at_out + n_lits - used;
    return ZSTD_OK;
}

// The planned frame's blocks carried out in order, each compressed one once zstd_block_apart has it
// (`ready`): ZSTD_OK with *decoded the output's size, or ZSTD_BAD / _FULL.
ZDEV int zstd_run(ZPlan* p, const zu8* src, zi64 size, const zu8* scratch, zu8* out, zi64 cap, zi64* decoded,
                  int lane) {
    zu32 rep[3] = {1, 4, 8};
    zi64 o = 0;
    *decoded = 0;
    for (int j = 0; j < p->blocks; ++j) {
        if (p->kind[j] != 2) {
            if (p->n[j] > cap - o) return ZSTD_FULL;
            if (p->kind[j] == 0) zcopy_warp(out + o, src + p->at[j], p->n[j], ZLANES * ZSTEP, lane);
            else zfill(out + o, src[p->at[j]], p->n[j], lane);
            o += p->n[j];
            continue;
        }
#ifndef ZSTD_HOST
        while (!p->ready[j]) __nanosleep(256);
        __threadfence_block();
#endif
        if (p->status[j] != ZSTD_OK) return p->status[j];
        const int status = zstd_block_run(p, j, src, scratch, out, &o, cap, rep, lane);
        if (status != ZSTD_OK) return status;
    }
    if (zframe_end(p->end, size, p->fhd, p->fcs_bytes, p->content, o) != ZSTD_OK) return ZSTD_BAD;
    *decoded = o;
    return ZSTD_OK;
}

#ifdef ZSTD_HOST
// The same decoders on one host thread, for the tests: a status, *decoded the bytes written.
int zstd_host_decode(const unsigned char* src, long long size, unsigned char* out, long long cap, long long* decoded) {
    ZTables t;
    return zstd_frame(&t, src, size, out, cap, decoded, 0);
}

// zstd_kernel2's way: planned, the blocks decoded apart last to first (each with tables filled with
// junk, so none leans on another's state), then run; or whole, as zstd_kernel2 does where there is no
// plan or scratch room. *planned: whether it was decoded apart.
int zstd_host_decode2(const unsigned char* src, long long size, unsigned char* out, long long cap,
                      long long* decoded, unsigned char* scratch, long long scratch_bytes, int* planned) {
    static ZPlan p;
    ZTables t;
    zi64 at;
    *decoded = 0;
    *planned = 0;
    if (cap > ZOUT_MAX) cap = ZOUT_MAX;
    p.head = zframe_head(src, size, cap, &at, &p.fhd, &p.fcs_bytes, &p.content);
    if (p.head != ZSTD_OK) return p.head;
    const zi64 need = zstd_plan(&p, src, size, at);
    if (p.blocks == 0 || need > scratch_bytes) return zstd_frame(&t, src, size, out, cap, decoded, 0);
    *planned = 1;
    for (int j = p.blocks - 1; j >= 0; --j) {
        if (p.kind[j] != 2) continue;
        memset(&t, 0xA5, sizeof t);
        p.status[j] = zstd_block_apart(&t, &p, j, src, scratch, 0);
    }
    return zstd_run(&p, src, size, scratch, out, cap, decoded, 0);
}
#endif
