// LZF streams (liblzf's format, as h5py's lzf filter stores a chunk: the stream alone, no header),
// decoded by one warp (cuda/lzf.cu) or by one host thread (built with -DZSTD_HOST: the CPU tests
// check this same code against liblzf's rules). A stream is tokens, each a control byte c: c < 32:
// c + 1 literal bytes follow; else a back reference of (c >> 5) + 2 bytes (c >> 5 == 7: plus the
// next byte), from ((c & 31) << 8) + the next byte + 1 bytes back (8,192 at most). The lanes parse
// the tokens in lockstep, up to 32 (and LZF_BATCH bytes of output) a batch, lane k keeping the k-th.
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
        for (int k = 0; k < ZLANES && ip < end && !bad && op - start < LZF_BATCH; ++k) {
            // the token's three possible head bytes loaded side by side: one load's wait a token
            const int c = src[ip], b1 = ip + 1 < end ? src[ip + 1] : 0, b2 = ip + 2 < end ? src[ip + 2] : 0;
            int ll = 0, ml = 0, off = 0;
            const int lit = ++ip;
            if (c < 32) {
                ll = c + 1;
                bad = ll > end - ip;
                ip += ll;
            } else {
                ml = c >> 5;
                int low = b1;  // the offset's low byte
                if (ml == 7) {
                    bad = ip >= end;
                    ml += b1;
                    low = b2;
                    ++ip;
                }
                bad |= ip >= end;
                off = ((c & 31) << 8) + low + 1;
                ++ip;
                ml += 2;
                bad |= off > op;
            }
            if (lane == k) {
                my_at = op;
                my_ll = ll;
                my_ml = ml;
                my_off = off;
                my_lit = lit;
            }
            op += ll + ml;
        }
        if (bad) return ZSTD_BAD;
        if (op > room) return ZSTD_FULL;  // (op only grows: checked once a batch, before any store)
        const int in_order = my_ml > 0 && (my_at - my_off + my_ml > start || my_ml > ZLONG);
        if (my_ll > 0) lzf_lane_copy(ring, my_at, src + my_lit, 0, my_ll);
        if (my_ml > 0 && !in_order) lzf_lane_copy(ring, my_at, ring, my_at - my_off, my_ml);
        ZSYNC();
        for (unsigned rest = ZBALLOT(in_order); rest; rest &= rest - 1) {
            const int k = zlowest(rest);
            lzf_ring_copy(ring, mods, ZSHFL(my_at, k), ZSHFL(my_off, k), ZSHFL(my_ml, k), lane);
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
