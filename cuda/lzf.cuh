// LZF streams (liblzf's format, as h5py's lzf filter stores a chunk: the stream alone, no header),
// decoded by one warp (cuda/lzf.cu) or by one host thread (built with -DZSTD_HOST: the CPU tests
// check this code against liblzf's rules; the GPU test checks the warp's, whose parse is lzf_parse,
// against the host build's statuses and bytes). A stream is tokens, each a control byte c: c < 32:
// c + 1 literal bytes follow; else a back reference of (c >> 5) + 2 bytes (c >> 5 == 7: plus the
// next byte), from ((c & 31) << 8) + the next byte + 1 bytes back (8,192 at most). A batch is up
// to 32 tokens (and LZF_BATCH bytes of output), lane k keeping the k-th: the warp parses them at once
// (lzf_parse; the host build, one by one).
// The output is built in a ring in shared memory holding more than the last 8 KB, so no reference
// reads the output back from global memory: each lane places its literals, and its reference where
// it reaches only before the batch, side by side; the references into the batch's own output (and
// long ones) follow in order, the whole warp a reference; then the batch is stored, coalesced.
// Damaged input never reads or writes out of bounds: ZSTD_BAD (a token past the stream's end, a
// reference before the output's start) or ZSTD_FULL (more output than the capacity).

#include "zstd.cuh"

#define LZF_RING 16384  // bytes: the 8 KB a reference reaches back, a batch's output, and room
#define LZF_MASK (LZF_RING - 1)
#define LZF_BATCH 4096  // a batch ends once its output reaches this (at most + 264 bytes)
#define LZF_WIN 128     // the warp's batch: tokens starting in the next 128 bytes of the stream, 4 a lane

// A token's bytes in the stream, from its control byte c (its literals included).
ZDEV int lzf_token_bytes(int c) { return c < 32 ? c + 2 : c >> 5 == 7 ? 3 : 2; }

// A token from its control byte c and the two bytes after it (b1, b2; p: the position after c): *ll
// literals, or a reference of *ml bytes from *off back; whether its bytes run past the stream's end.
// The warp's parse and the host build's loop both decode a token here.
ZDEV int lzf_token(int c, int b1, int b2, int p, int end, int* ll, int* ml, int* off) {
    *ll = *ml = *off = 0;
    if (c < 32) {
        *ll = c + 1;
        return *ll > end - p;
    }
    int n = c >> 5, low = b1, damaged = 0;  // the length less 2 (7: the next byte adds to it), the offset's low byte
    if (n == 7) {
        damaged = p >= end;
        n += b1;
        low = b2;
        ++p;
    }
    *ml = n + 2;
    *off = ((c & 31) << 8) + low + 1;
    return damaged | (p >= end);
}

// n bytes from `from` (a stream's bytes, or ring positions: masked) to ring position `to` on, by one
// lane, 16 loads before their 16 stores (the two never overlap: literals, or references reaching only
// before the batch).
ZDEV void lzf_lane_copy(zu8* ring, int to, const zu8* from_bytes, int from, int n) {
    const int mask = from_bytes == ring ? LZF_MASK : -1;
    for (int i = 0; i < n; i += 16) {
        zu8 v[16];
        for (int j = 0; j < 16; ++j) v[j] = i + j < n ? from_bytes[(from + i + j) & mask] : 0;
        for (int j = 0; j < 16; ++j)
            if (i + j < n) ring[(to + i + j) & LZF_MASK] = v[j];
    }
}

// mods[off][lane] = lane % off, for off and lane under ZLANES (filled once: no division per reference).
ZDEV void lzf_mods(zu8 (*mods)[ZLANES], int lane) {
    for (int off = 1; off < ZLANES; ++off) mods[off][lane] = (zu8)(lane % off);
    ZSYNC();
}

// n bytes from `off` back to ring position `to` on, in order (off < n: the bytes repeat), by the warp.
ZDEV void lzf_ring_copy(zu8* ring, const zu8 (*mods)[ZLANES], int to, int off, int n, int lane) {
    if (off >= ZLANES) {  // steps of ZLANES bytes, each reading only bytes placed before it
        for (int i = 0; i < n; i += ZLANES) {
            const int j = i + lane;
            const zu8 v = j < n ? ring[(to - off + j) & LZF_MASK] : 0;
            ZSYNC();
            if (j < n) ring[(to + j) & LZF_MASK] = v;
            ZSYNC();
        }
    } else {  // a period under a step: each lane stores the same byte every whole number of periods
        const int step = ZLANES - 1 - mods[off][ZLANES - 1];  // the most whole periods in ZLANES - 1 lanes
        if (lane < step) {
            const zu8 v = ring[(to - off + mods[off][lane]) & LZF_MASK];
            for (int j = lane; j < n; j += step) ring[(to + j) & LZF_MASK] = v;
        }
        ZSYNC();
    }
}

#ifndef ZSTD_HOST
// A batch's tokens, parsed by the warp at once (the host build parses them one by one): those starting
// in the LZF_WIN bytes from ip, 32 at most, up to the first bad one and while the output before each
// is under LZF_BATCH. Each lane finds where a token starting at each of its 4 bytes would end; the
// chain from ip is then followed by pointer doubling (jumps of 1, 2, 4, 8, 16 tokens), so lane k finds
// token k's start in 5 steps, not k. Lane k keeps token k (as the host build's loop does); ip and op
// move past the batch; bad where a token in it is damaged.
ZDEV void lzf_parse(const zu8* __restrict__ src, int end, int& ip, int& op, int lane, int& my_at,
                    int& my_ll, int& my_ml, int& my_off, int& my_lit, int& bad) {
    const int lim = min(LZF_WIN, end - ip);  // offsets where a token may start
    unsigned jump[5];
    jump[0] = 0;
    for (int q = 0; q < 4; ++q) {  // the offset past a token starting at 4 lane + q (255: none)
        const int j = 4 * lane + q;
        const int c = j < lim ? src[ip + j] : 0;
        const int next = j < lim ? j + lzf_token_bytes(c) : 255;
        jump[0] |= (unsigned)next << (8 * q);
    }
    for (int s = 1; s < 5; ++s) {  // jump[s]: 2^s tokens on
        unsigned r = 0;
        for (int q = 0; q < 4; ++q) {
            const unsigned j = (jump[s - 1] >> (8 * q)) & 255u;
            const unsigned v = ZSHFL(jump[s - 1], (int)(j >> 2) & 31);
            r |= (j < (unsigned)lim ? (v >> (8 * (j & 3u))) & 255u : 255u) << (8 * q);
        }
        jump[s] = r;
    }
    unsigned t = 0;  // token `lane`'s offset
    for (int s = 0; s < 5; ++s) {
        const unsigned v = ZSHFL(jump[s], (int)(t >> 2) & 31);
        const unsigned next = t < (unsigned)lim ? (v >> (8 * (t & 3u))) & 255u : 255u;
        if (lane >> s & 1) t = next;
    }
    const bool valid = t < (unsigned)lim;
    const int at = ip + (int)t, c = valid ? src[at] : 0;
    const int b1 = valid && at + 1 < end ? src[at + 1] : 0, b2 = valid && at + 2 < end ? src[at + 2] : 0;
    int ll = 0, ml = 0, off = 0, damaged = 0;
    if (valid) damaged = lzf_token(c, b1, b2, at + 1, end, &ll, &ml, &off);
    int sum = ll + ml;  // the output through this token, from the batch's start
    for (int d = 1; d < ZLANES; d <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, sum, d);
        if (lane >= d) sum += u;
    }
    const int before = sum - ll - ml;
    damaged |= ml > 0 && off > op + before;
    const unsigned taken = ZBALLOT(valid && before < LZF_BATCH), hurt = ZBALLOT(valid && damaged) & taken;
    const int n = hurt ? __ffs(hurt) : __popc(taken);  // tokens in the batch (n >= 1: token 0 is taken)
    if (lane < n) {
        my_at = op + before;
        my_ll = ll;
        my_ml = ml;
        my_off = off;
        my_lit = at + 1;
    }
    bad = hurt != 0;
    const int past = (int)t + lzf_token_bytes(c);
    ip += ZSHFL(past, n - 1);
    op += ZSHFL(sum, n - 1);
}
#endif

// src[0..size) into out (cap bytes at most, cap <= ZOUT_MAX): a status, *decoded the bytes written.
// ring: LZF_RING bytes of shared memory; mods: lzf_mods's table, filled.
ZDEV int lzf_stream(const zu8* __restrict__ src, zi64 size, zu8* __restrict__ out, zi64 cap, zi64* decoded, int lane,
                    zu8* __restrict__ ring, const zu8 (*mods)[ZLANES]) {
    const int end = (int)(size < ZOUT_MAX ? size : ZOUT_MAX), room = (int)(cap < ZOUT_MAX ? cap : ZOUT_MAX);
    int ip = 0, op = 0;
    *decoded = 0;
    if (size > ZOUT_MAX) return ZSTD_BAD;
    while (ip < end) {
        const int start = op;
        int my_at = 0, my_ll = 0, my_ml = 0, my_off = 0, my_lit = 0, bad = 0;
#ifdef ZSTD_HOST
        for (int k = 0; k < ZLANES && ip < end && !bad && op - start < LZF_BATCH; ++k) {
            // the token's three possible head bytes loaded side by side: one load's wait a token
            const int c = src[ip], b1 = ip + 1 < end ? src[ip + 1] : 0, b2 = ip + 2 < end ? src[ip + 2] : 0;
            int ll, ml, off;
            const int lit = ++ip;
            bad = lzf_token(c, b1, b2, ip, end, &ll, &ml, &off) | (ml > 0 && off > op);
            ip = lit - 1 + lzf_token_bytes(c);
            if (lane == k) {
                my_at = op;
                my_ll = ll;
                my_ml = ml;
                my_off = off;
                my_lit = lit;
            }
            op += ll + ml;
        }
#else
        lzf_parse(src, end, ip, op, lane, my_at, my_ll, my_ml, my_off, my_lit, bad);
#endif
        if (bad) return ZSTD_BAD;
        if (op > room) return ZSTD_FULL;  // (op only grows: checked once a batch, before any store)
        const int in_order = my_ml > 0 && (my_at - my_off + my_ml > start || my_ml > ZLONG);
        // a lane's literals, or its reference reaching only before the batch: one pass for both kinds
        const int lane_bytes = my_ll > 0 ? my_ll : in_order ? 0 : my_ml;
        if (lane_bytes > 0)
            lzf_lane_copy(ring, my_at, my_ll > 0 ? src + my_lit : ring, my_ll > 0 ? 0 : my_at - my_off, lane_bytes);
        ZSYNC();
        unsigned rest = ZBALLOT(in_order);
        int k = rest ? zlowest(rest) : 0, to = ZSHFL(my_at, k), back = ZSHFL(my_off, k), n = ZSHFL(my_ml, k);
        while (rest) {  // each reference's place fetched while the one before it copies
            rest &= rest - 1;
            k = rest ? zlowest(rest) : 0;
            const int to2 = ZSHFL(my_at, k), back2 = ZSHFL(my_off, k), n2 = ZSHFL(my_ml, k);
            lzf_ring_copy(ring, mods, to, back, n, lane);
            to = to2, back = back2, n = n2;
        }
        for (int j = start + lane; j < op; j += ZLANES) out[j] = ring[j & LZF_MASK];
        ZSYNC();
        *decoded = op;
    }
    return ZSTD_OK;
}

#ifdef ZSTD_HOST
int lzf_host_decode(const unsigned char* src, long long size, unsigned char* out, long long cap, long long* decoded) {
    static zu8 ring[LZF_RING], mods[ZLANES][ZLANES];
    lzf_mods(mods, 0);
    return lzf_stream(src, size, out, cap, decoded, 0, ring, (const zu8(*)[ZLANES])mods);
}
#endif
