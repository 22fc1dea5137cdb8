/* Chunked datasets on the pool's threads (rp_submit_chunks: a job per chunk, read, checked
 * (fletcher32), inflated (libdeflate or zlib, through function pointers the caller hands over,
 * so this file needs neither's headers), LZF-decoded, decoded by the codec inside hdf5plugin's
 * Zstd, LZ4, Blosc and Blosc2 plugins (their libraries export it: rp_chunks_direct) or by an HDF5
 * filter plugin's own function (the other plugins: Bitshuffle...), unshuffled, straight into the
 * destination when the chunk lies wholly in the read); rp_read_chunks decodes on the calling thread.
 * Values stored in the other byte order are swapped after the decoding (folded into the unshuffle
 * where there is one). */
#include "read_pool.h"

/* The codecs inside hdf5plugin's plugins, called straight into the chunk's place (no plugin
 * buffer): ZSTD_decompress, LZ4_decompress_safe, c-blosc's blosc_decompress_ctx. */
typedef size_t (*zstd_fn)(void *dst, size_t capacity, const void *src, size_t size);
typedef int (*lz4_fn)(const char *src, char *dst, int size, int capacity);
typedef int (*blosc_fn)(const void *src, void *dst, size_t capacity, int threads);
typedef int (*blosc2_getitem_fn)(const void *src, int size, int start, int items, void *dst, int capacity);
/* The inflater, set once by rp_set_inflater: libdeflate's (a decompressor per thread) or zlib's. */
static void *(*ld_alloc)(void);
static void (*ld_free)(void *);
static int (*ld_zlib)(void *, const void *, size_t, void *, size_t, size_t *);
static int (*z_uncompress)(unsigned char *, unsigned long *, const unsigned char *, unsigned long);
/* Whether fletcher32 checksum `sum` is the one stored in the 4 bytes at sum4. */
int checksum_is(unsigned int sum, const unsigned char *sum4)
{
    unsigned int b0 = sum & 255, b1 = sum >> 8 & 255, b2 = sum >> 16 & 255, b3 = sum >> 24;
    unsigned int stored = sum4[0] | sum4[1] << 8 | sum4[2] << 16 | (unsigned)sum4[3] << 24;
    return stored == sum || stored == (b1 << 24 | b0 << 16 | b3 << 8 | b2); /* HDF5 <= 1.6.2's order too */
}

/* Whether a chunk's payload bytes have the checksum stored in the 4 bytes after them. */
static int checksum_ok(const unsigned char *raw, size_t payload, const unsigned char *sum4)
{
    return checksum_is(rp_fletcher32(raw, payload), sum4);
}

/* Inflate a zlib stream into exactly n bytes: 0, RP_DAMAGED or RP_SIZE. */
static int inflate_into(struct local *l, const unsigned char *in, size_t in_len, unsigned char *out, size_t n)
{
    if (ld_zlib) {
        if (!l->decompressor) {
            if (!(l->decompressor = ld_alloc()))
                return -ENOMEM;
            l->release = ld_free;
        }
        size_t got = 0;
        int r = ld_zlib(l->decompressor, in, in_len, out, n, &got);
        return r == 0 ? (got == n ? 0 : RP_SIZE) : r == 3 ? RP_SIZE : RP_DAMAGED; /* 3: output too small */
    }
    unsigned long got = n;
    int r = z_uncompress(out, &got, in, in_len);
    return r == 0 ? (got == n ? 0 : RP_SIZE) : r == -4 ? -ENOMEM : RP_DAMAGED;
}

/* The part of chunk j (decoded at src) in rows [from, to) into the read's rows from lo on at dst:
 * runs along the innermost dimensions the chunk spans whole. codes (1 + a scaling): float32 runs
 * packed to their 8-bit codes (dst a quarter of the rows' bytes); 0 where a value is no code, else 1. */
static int scatter(const struct chunks *c, long long j, const unsigned char *src, unsigned char *dst, long long lo,
                   long long from, long long to, int codes)
{
    int ok = 1;
    long long origin[RP_MAX_RANK], extent[RP_MAX_RANK], idx[RP_MAX_RANK] = {0}, k = j % c->per;
    size_t src_stride[RP_MAX_RANK], dst_stride[RP_MAX_RANK];
    src_stride[c->rank - 1] = dst_stride[c->rank - 1] = c->itemsize;
    for (int d = c->rank - 1; d >= 1; d--) {
        long long count = (c->shape[d] + c->chunk[d] - 1) / c->chunk[d];
        origin[d] = k % count * c->chunk[d];
        k /= count;
        extent[d] = c->shape[d] - origin[d] < c->chunk[d] ? c->shape[d] - origin[d] : c->chunk[d];
        if (d > 1) {
            src_stride[d - 1] = src_stride[d] * (size_t)c->chunk[d];
            dst_stride[d - 1] = dst_stride[d] * (size_t)c->shape[d];
        }
    }
    int q = c->rank - 1;           /* the innermost dimension the chunk does not span whole */
    while (q > 1 && c->chunk[q] == c->shape[q])
        q--;
    size_t run = (size_t)extent[q] * dst_stride[q];
    long long first = j / c->per * c->chunk[0];
    for (long long row = from; row < to; row++)
        for (;;) {
            size_t s = (size_t)(row - first) * c->nbytes / (size_t)c->chunk[0], t = (size_t)(row - lo) * c->row_bytes;
            for (int d = 1; d <= q; d++) {
                s += (size_t)idx[d] * src_stride[d];
                t += (size_t)(origin[d] + idx[d]) * dst_stride[d];
            }
            if (codes)
                ok &= rp_pack_codes((const float *)(src + s), dst + t / 4, run / 4, -1, codes - 1) == 1;
            else
                memcpy(dst + t, src + s, run);
            int d = q - 1;         /* the next run: an odometer over dimensions 1 .. q - 1 */
            while (d >= 1 && ++idx[d] == extent[d])
                idx[d--] = 0;
            if (d < 1)
                break;
        }
    return ok;
}

static size_t big_endian(const unsigned char *p, int n)
{
    size_t v = 0;
    for (int i = 0; i < n; ++i)
        v = v << 8 | p[i];
    return v;
}

/* A Blosc or Blosc2 chunk's header (both alike here, little-endian): its decoded and stored sizes. */
static void blosc_sizes(const unsigned char *header, size_t *nbytes, size_t *cbytes)
{
    *nbytes = header[4] | header[5] << 8 | header[6] << 16 | (size_t)header[7] << 24;
    *cbytes = header[12] | header[13] << 8 | header[14] << 16 | (size_t)header[15] << 24;
}

/* msgpack, as far as Blosc2's frame header needs it: the value at in[*at] (of n bytes) skipped, or
 * read as an integer into *v (where v is not NULL); -1 where it runs past n or is not one. */
static int mp_skip(const unsigned char *in, size_t n, size_t *at, int depth);

static int mp_int(const unsigned char *in, size_t n, size_t *at, long long *v)
{
    if (*at >= n)
        return -1;
    unsigned t = in[*at];
    size_t len = t >= 0xcc && t <= 0xcf ? (size_t)1 << (t - 0xcc) : t >= 0xd0 && t <= 0xd3 ? (size_t)1 << (t - 0xd0) : 0;
    if (t <= 0x7f || t >= 0xe0) {  /* fixints */
        *v = t <= 0x7f ? (long long)t : (long long)t - 256;
        *at += 1;
        return 0;
    }
    if (!len || n - *at - 1 < len)
        return -1;
    unsigned long long u = big_endian(in + *at + 1, (int)len);
    *v = t >= 0xd0 && len < 8 && u >> (8 * len - 1) ? (long long)(u - (1ull << (8 * len))) : (long long)u;
    *at += 1 + len;
    return 0;
}

static int mp_skip(const unsigned char *in, size_t n, size_t *at, int depth)
{
    if (*at >= n || depth > 8)
        return -1;
    unsigned t = in[(*at)++];
    size_t len = 0, items = 0;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3)
        return 0;
    if ((t & 0xf0) == 0x80 || (t & 0xf0) == 0x90)
        items = (t & 0x0f) * ((t & 0xf0) == 0x80 ? 2 : 1);
    else if ((t & 0xe0) == 0xa0)
        len = t & 0x1f;
    else if ((t >= 0xc4 && t <= 0xc9) || (t >= 0xd9 && t <= 0xdb)) {
        /* bin, ext (then a type byte) and str with an 8, 16 or 32-bit size */
        int ext = t >= 0xc7 && t <= 0xc9, w = 1 << (t <= 0xc6 ? t - 0xc4 : ext ? t - 0xc7 : t - 0xd9);
        if (n - *at < (size_t)w)
            return -1;
        len = big_endian(in + *at, w) + ext;
        *at += w;
    } else if (t >= 0xd4 && t <= 0xd8)  /* fixext 1-16: type, data */
        len = 1 + ((size_t)1 << (t - 0xd4));
    else if (t >= 0xca && t <= 0xd3)  /* float32/64, (u)int8-64 */
        len = t == 0xca ? 4 : t == 0xcb ? 8 : (size_t)1 << ((t - 0xcc) % 4);
    else if (t == 0xdc || t == 0xdd || t == 0xde || t == 0xdf) {  /* array16/32, map16/32 */
        int w = t == 0xdc || t == 0xde ? 2 : 4;
        if (n - *at < (size_t)w)
            return -1;
        items = big_endian(in + *at, w) * (t >= 0xde ? 2 : 1);
        *at += w;
    } else
        return -1;
    if (n - *at < len)
        return -1;
    *at += len;
    for (size_t i = 0; i < items; i++)
        if (mp_skip(in, n, at, depth + 1))
            return -1;
    return 0;
}

/* hdf5plugin's Blosc2 filter stores a chunk as a Blosc2 contiguous frame (cframe): a msgpack
 * header, then the one Blosc2 chunk. Its "b2nd" metalayer (where there is one) gives the array's
 * shape, the chunk's and the blocks' (the frame holds one chunk: the HDF5 chunk); blocks spanning
 * every dimension but the first hold rows in C order, the last block's rows past the chunk's
 * padding. The frame's one chunk: where it starts (*chunk_at, its 32-byte header there) and the
 * bytes it decodes to (*padded: the HDF5 chunk's, or its rows rounded up to whole b2nd blocks); 0,
 * or RP_OTHER_LAYOUT for a frame this does not parse, other metalayers, or blocks cutting rows. */
static int blosc2_frame_chunk(const struct chunks *c, const unsigned char *in, size_t size, size_t *chunk_at,
                              size_t *padded)
{
    size_t at = 0;
    long long header = 0, frame = 0;
    if (size < 16 || (in[0] & 0xf0) != 0x90 || in[1] != 0xa8 || memcmp(in + 2, "b2frame", 8))
        return RP_OTHER_LAYOUT;
    int fields = in[0] & 0x0f;
    at = 10;
    if (mp_int(in, size, &at, &header) || mp_int(in, size, &at, &frame) || frame != (long long)size || header < 0 ||
        (size_t)header > size)
        return RP_OTHER_LAYOUT;
    if (at + 5 > size || in[at] != 0xa4 || (in[at + 2] & 0x0f) != 0)  /* flags: a contiguous frame */
        return RP_OTHER_LAYOUT;
    size_t n = (size_t)header;
    int found = 0, ndim = 0;
    long long shape[3][RP_MAX_RANK];  /* the array's, the chunk's and the blocks' */
    for (int f = 3; f < fields && !found; f++) {
        /* the metalayers: [index, {name: offset}, [contents]]; the others skipped */
        if (at + 2 < n && in[at] == 0x93 && in[at + 1] == 0xcd) {
            size_t m = at + 4;
            if (m + 3 > n || in[m] != 0xde)
                return RP_OTHER_LAYOUT;
            size_t count = big_endian(in + m + 1, 2);
            m += 3;
            for (size_t k = 0; k < count; k++) {  /* metalayers other than b2nd alone: the plugin's */
                if (m >= n || (in[m] & 0xe0) != 0xa0)
                    return RP_OTHER_LAYOUT;
                size_t len = in[m] & 0x1f;
                const unsigned char *name = in + m + 1;
                long long offset;
                m += 1 + len;
                if (m > n || mp_int(in, n, &m, &offset))
                    return RP_OTHER_LAYOUT;
                if (len != 4 || memcmp(name, "b2nd", 4))
                    continue;
                size_t b = (size_t)offset;  /* bin32: the content, a msgpack array */
                long long version, rank;
                if (offset < 0 || b + 6 > n || in[b] != 0xc6 || (in[b + 5] & 0xf0) != 0x90)
                    return RP_OTHER_LAYOUT;
                b += 6;
                if (mp_int(in, n, &b, &version) || mp_int(in, n, &b, &rank) || rank != c->rank)
                    return RP_OTHER_LAYOUT;
                ndim = (int)rank;
                for (int s = 0; s < 3; s++) {
                    if (b >= n || in[b] != (0x90 | ndim))
                        return RP_OTHER_LAYOUT;
                    b++;
                    for (int d = 0; d < ndim; d++)
                        if (mp_int(in, n, &b, &shape[s][d]))
                            return RP_OTHER_LAYOUT;
                }
                found = 1;
            }
            if (count && !found)
                return RP_OTHER_LAYOUT;
            break;
        }
        if (mp_skip(in, n, &at, 0))
            return RP_OTHER_LAYOUT;
    }
    if (found)
        for (int d = 0; d < ndim; d++)
            if (shape[0][d] != c->chunk[d] || shape[1][d] != c->chunk[d] || (d > 0 && shape[2][d] != c->chunk[d]) ||
                shape[2][d] < 1)
                return RP_OTHER_LAYOUT;
    /* the chunk: Blosc2's header (version, flags, typesize, sizes little-endian), right after the frame's */
    if (size - n < 32)
        return RP_OTHER_LAYOUT;
    *chunk_at = n;
    *padded = found ? (size_t)((c->chunk[0] + shape[2][0] - 1) / shape[2][0] * shape[2][0]) * (c->nbytes / (size_t)c->chunk[0])
                    : c->nbytes;
    return 0;
}

/* A Blosc2 frame whose blocks hold whole rows: the chunk's first c->nbytes decoded straight into
 * place (blosc2_getitem: a context of its own per call, thread-safe), block by block. 0, RP_DAMAGED
 * or RP_SIZE from the codec, or RP_OTHER_LAYOUT: anything else, left to the plugin, which decodes
 * it or says it is damaged. */
static int blosc2_frame_decode(const struct chunks *c, const unsigned char *in, size_t size, unsigned char *out)
{
    size_t n, padded;
    if (blosc2_frame_chunk(c, in, size, &n, &padded))
        return RP_OTHER_LAYOUT;
    const unsigned char *chunk = in + n;
    size_t nbytes, cbytes, typesize = chunk[3];
    blosc_sizes(chunk, &nbytes, &cbytes);
    if (cbytes > size - n || cbytes > 0x7fffffff || typesize < 1)
        return RP_OTHER_LAYOUT;
    if (nbytes != padded || c->nbytes % typesize || c->nbytes > 0x7fffffff)
        return RP_OTHER_LAYOUT;
    int got = ((blosc2_getitem_fn)c->direct)(chunk, (int)cbytes, 0, (int)(c->nbytes / typesize), out, (int)c->nbytes);
    return got < 0 ? RP_DAMAGED : (size_t)got != c->nbytes ? RP_SIZE : 0;
}

/* A chunk's `size` stored bytes decoded into its c->nbytes at out by a direct codec, as the plugin
 * would: 0, RP_DAMAGED, RP_SIZE, or RP_OTHER_LAYOUT (Blosc2 only: for the plugin). */
static int direct_decode(const struct chunks *c, const unsigned char *in, size_t size, unsigned char *out)
{
    size_t want = c->nbytes;
    if (c->codec == RP_BLOSC2)
        return blosc2_frame_decode(c, in, size, out);
    if (c->codec == RP_ZSTD) {     /* one zstd frame; errors are the largest size_t values */
        size_t got = ((zstd_fn)c->direct)(out, want, in, size);
        return got == want ? 0 : got > (size_t)-256 ? RP_DAMAGED : RP_SIZE;
    }
    if (c->codec == RP_BLOSC) {    /* one c-blosc buffer; its header's sizes checked first, since
                                    * blosc_decompress_ctx takes no source size */
        if (size < 16)
            return RP_DAMAGED;
        size_t nbytes, cbytes;
        blosc_sizes(in, &nbytes, &cbytes);
        if (cbytes != size)
            return RP_DAMAGED;
        if (nbytes != want)
            return RP_SIZE;
        int got = ((blosc_fn)c->direct)(in, out, want, 1);
        return got < 0 ? RP_DAMAGED : (size_t)got != want ? RP_SIZE : 0;
    }
    /* RP_LZ4, hdf5plugin's framing (big-endian): the decoded size (8 bytes), the block size (4),
     * then each block's stored size (4) and bytes, stored as they are where they did not shrink */
    if (size < 12)
        return RP_DAMAGED;
    if (big_endian(in, 8) != want)
        return RP_SIZE;
    size_t block = big_endian(in + 8, 4), at = 12, done = 0;
    if (block == 0 || block > 0x7fffffff)
        return RP_DAMAGED;
    while (done < want) {
        size_t part = want - done < block ? want - done : block;
        if (size - at < 4)
            return RP_DAMAGED;
        size_t stored = big_endian(in + at, 4);
        at += 4;
        if (stored > size - at || stored > 0x7fffffff)
            return RP_DAMAGED;
        if (stored == part)
            memcpy(out + done, in + at, part);
        else if (((lz4_fn)c->direct)((const char *)in + at, (char *)out + done, (int)stored, (int)part) != (int)part)
            return RP_DAMAGED;
        at += stored;
        done += part;
    }
    return at == size ? 0 : RP_DAMAGED;
}

/* A chunk through the dataset's filter plugin: read into a malloc'd block (the plugin frees or
 * replaces it), checked, decoded; *owned: the decoded chunk, the caller's to free. */
static int plugin_decode_once(const struct chunks *c, const struct piece *job, void **owned)
{
    size_t size = job->stored, payload = job->stored - (c->summed ? 4 : 0);
    void *buf = malloc(size ? size : 1);
    if (!buf)
        return -ENOMEM;
    int status = read_fully(c->fd, buf, size, job->offset);
    if (!status && c->summed && !checksum_ok(buf, payload, buf + payload))
        status = RP_CHECKSUM;
    if (!status) {
        size_t got = c->plugin(c->plugin_flags | H5Z_FLAG_REVERSE, c->cd_count, c->cd, payload, &size, &buf);
        status = got == 0 ? RP_DAMAGED : got != c->nbytes ? RP_SIZE : 0;
    }
    if (status) {
        free(buf);
        return status;
    }
    *owned = buf;
    return 0;
}

/* A plugin's failure is final only when it fails alone: Blosc2's filter tears down the library's
 * global state (blosc2_destroy) whenever a chunk fails, and chunks other threads are decoding at
 * that moment fail with it. So a chunk that fails is decoded again with no other retry running. */
static pthread_mutex_t plugin_retry = PTHREAD_MUTEX_INITIALIZER;

static int plugin_decode(const struct chunks *c, const struct piece *job, void **owned)
{
    int status = plugin_decode_once(c, job, owned);
    if (status == RP_DAMAGED || status == RP_SIZE) {
        pthread_mutex_lock(&plugin_retry);
        status = plugin_decode_once(c, job, owned);
        pthread_mutex_unlock(&plugin_retry);
    }
    return status;
}

static size_t little_endian(const unsigned char *p, int n)
{
    size_t v = 0;
    for (int i = n - 1; i >= 0; --i)
        v = v << 8 | p[i];
    return v;
}

/* `stored` bytes at in decoded into `part` at out by the codec named (c->lz4 or c->zstd): 0 or RP_DAMAGED. */
static int block_decode(const struct chunks *c, int zstd, const unsigned char *in, size_t stored,
                        unsigned char *out, size_t part)
{
    if (zstd)
        return ((zstd_fn)c->zstd)(out, part, in, stored) == part ? 0 : RP_DAMAGED;
    return stored <= 0x7fffffff && ((lz4_fn)c->lz4)((const char *)in, (char *)out, (int)stored, (int)part) == (int)part
               ? 0 : RP_DAMAGED;
}

/* The Bitshuffle filter's chunk (its codec lz4 or zstd; big-endian: the decoded size (8 bytes),
 * the block's bytes (4), then per block its stored size (4) and stream, then the values after the
 * last multiple of 8, as they are) decoded into out still bitshuffled: 0, RP_DAMAGED, RP_SIZE, or
 * RP_OTHER_LAYOUT for blocks of another size. */
static int bshuf_blocks(const struct chunks *c, const unsigned char *in, size_t size, unsigned char *out)
{
    if (size < 12)
        return RP_DAMAGED;
    if (big_endian(in, 8) != c->nbytes)
        return RP_SIZE;
    if (big_endian(in + 8, 4) != c->bits_block * c->itemsize)
        return RP_OTHER_LAYOUT;
    size_t n = c->nbytes / c->itemsize, full = n / c->bits_block, last = n % c->bits_block - n % c->bits_block % 8;
    size_t at = 12, done = 0;
    for (size_t k = 0; k < full + (last > 0); k++) {
        size_t part = (k < full ? c->bits_block : last) * c->itemsize;
        if (size - at < 4)
            return RP_DAMAGED;
        size_t stored = big_endian(in + at, 4);
        at += 4;
        if (stored > size - at || block_decode(c, c->lz4 == NULL, in + at, stored, out + done, part))
            return RP_DAMAGED;
        at += stored;
        done += part;
    }
    size_t rest = c->nbytes - done;
    if (size - at != rest)
        return RP_DAMAGED;
    memcpy(out + done, in + at, rest);
    return 0;
}

/* The first m values of a block of n values laid out as the Bitshuffle filter's shorter last block
 * (bits_head): from a block bitshuffled whole (its first n - n % 8 values as bit rows, then the rest
 * as they are) to rows of m / 8 bytes, then the m % 8 values left as they are. A bit row's first
 * bytes hold its first values' bits, so that is each row cut short. */
static void bits_head(const unsigned char *src, size_t n, size_t size, size_t m, unsigned char *dst)
{
    size_t n8 = n - n % 8, m8 = m - m % 8, from = n8 / 8, to = m8 / 8;
    for (size_t r = 0; r < 8 * size; r++)
        memcpy(dst + r * to, src + r * from, to);
    for (size_t i = m8; i < m; i++)
        for (size_t b = 0; b < size; b++) {
            unsigned char v = 0;
            if (i < n8)
                for (int k = 0; k < 8; k++)
                    v |= (unsigned char)((src[(8 * b + k) * from + i / 8] >> (i % 8) & 1) << k);
            else
                v = src[n8 * size + (i - n8) * size + b];
            dst[m8 * size + (i - m8) * size + b] = v;
        }
}

/* The blocks of a c-blosc or Blosc2 chunk of cbytes at `chunk` decoding to nbytes (header: `header`
 * bytes, then each block's start; per block its streams, 1 or one per value byte unless flags say
 * one, each a size and lz4 or zstd bytes, stored as they are where that size is the stream's)
 * decoded into out as they are (still bitshuffled): 0, RP_DAMAGED, or RP_OTHER_LAYOUT for Blosc2's
 * runs (a size not above 0), which c-blosc does not write. A Blosc2 frame padded past the HDF5
 * chunk (nbytes > c->nbytes) has its block across the chunk's end decoded into this thread's
 * buffer and only the chunk's values of it laid out, as Bitshuffle's shorter last block (the
 * padding is less than a block: that block is the last). */
static int blosc_streams(const struct chunks *c, const unsigned char *chunk, size_t cbytes, size_t header, size_t nbytes,
                         size_t block, int flags, unsigned char *out)
{
    size_t typesize = c->itemsize, blocks = nbytes / block + (nbytes % block > 0);
    int zstd = flags >> 5 == 4;
    if (cbytes < header || blocks > (cbytes - header) / 4)
        return RP_DAMAGED;
    for (size_t k = 0; k < blocks; k++) {
        size_t bsize = k == nbytes / block ? nbytes % block : block, at = little_endian(chunk + header + 4 * k, 4);
        int split = !(flags & 0x10) && typesize <= 16 && bsize / typesize >= 128 && bsize == block;
        int across = k * block + bsize > c->nbytes;
        size_t streams = split ? typesize : 1, part = bsize / streams;
        unsigned char *into = out + k * block;
        if (across) {
            struct local *l = thread_local_state();
            if (!l || !(into = grow(&l->decoded, block)))
                return -ENOMEM;
        }
        for (size_t j = 0; j < streams; j++) {
            if (at > cbytes || cbytes - at < 4)
                return RP_DAMAGED;
            long long stored = (int)little_endian(chunk + at, 4);
            at += 4;
            if (stored <= 0)
                return header == 32 ? RP_OTHER_LAYOUT : RP_DAMAGED;
            if ((size_t)stored > cbytes - at)
                return RP_DAMAGED;
            if ((size_t)stored == part)
                memcpy(into + j * part, chunk + at, part);
            else if (block_decode(c, zstd, chunk + at, (size_t)stored, into + j * part, part))
                return RP_DAMAGED;
            at += (size_t)stored;
        }
        if (across)
            bits_head(into, bsize / typesize, typesize, (c->nbytes - k * block) / typesize, out + k * block);
    }
    return 0;
}

/* A c-blosc chunk (header: format version, codec version, flags, value size, decoded size, block
 * size, stored size; each block's start; per block its streams, 1 or one per value byte, each a size
 * and lz4 or zstd bytes, stored as they are where that size is the stream's) decoded into out still
 * shuffled as c->bits says (bitshuffled, or byte-shuffled a block at a time): 0, RP_DAMAGED, RP_SIZE,
 * or RP_OTHER_LAYOUT for a chunk stored otherwise (shuffled the other way or not at all, copied whole,
 * another codec or block size, a format version but c-blosc 1's 2, in which a block whose values are
 * not a multiple of 8 is stored as it is). */
static int blosc_blocks(const struct chunks *c, const unsigned char *in, size_t size, unsigned char *out)
{
    if (size < 16)
        return RP_DAMAGED;
    size_t nbytes, cbytes, block = little_endian(in + 8, 4), typesize = in[3];
    blosc_sizes(in, &nbytes, &cbytes);
    if (cbytes != size)
        return RP_DAMAGED;
    if (nbytes != c->nbytes)
        return RP_SIZE;
    int flags = in[2], codec = flags >> 5;
    int shuffle = c->bits == RP_BYTES_BLOSC ? 0x01 : 0x04;  /* flags: 0x01 byte shuffle, 0x04 bitshuffle, 0x02 copied whole */
    if (in[0] != 2 || (flags & 0x0f) != shuffle || typesize != c->itemsize
        || block != c->bits_block * c->itemsize || !((codec == 1 && c->lz4) || (codec == 4 && c->zstd)))
        return RP_OTHER_LAYOUT;
    return blosc_streams(c, in, size, 16, nbytes, block, flags, out);
}

/* A Blosc2 frame's chunk (its header: format version, codec version, flags, value size, decoded,
 * block and stored sizes, the filters; each block's start; per block one stream, its size and lz4
 * or zstd bytes, stored as they are where that size is the block's) decoded into out still
 * bitshuffled, as the Bitshuffle filter lays its blocks out (format versions 3 to 5 bitshuffle a
 * block's values down to a multiple of 8 and leave the rest as they are): 0, RP_DAMAGED, or
 * RP_OTHER_LAYOUT for a chunk stored otherwise (a filter but bitshuffle alone, split streams,
 * copied whole, runs, a dictionary, another block size), which is decoded the usual way and
 * bitshuffled again. A frame padded past the HDF5 chunk by its b2nd blocks (a 1,000-row chunk of
 * 64-row blocks: 1,024 rows) keeps the layout of the chunk's own rows (see blosc_streams). */
static int blosc2_blocks(const struct chunks *c, const unsigned char *in, size_t size, unsigned char *out)
{
    static const unsigned char bitshuffle_alone[6] = {0, 0, 0, 0, 0, 2};
    size_t n, padded;
    if (blosc2_frame_chunk(c, in, size, &n, &padded))
        return RP_OTHER_LAYOUT;
    const unsigned char *chunk = in + n;
    size_t nbytes, cbytes, block = little_endian(chunk + 8, 4);
    blosc_sizes(chunk, &nbytes, &cbytes);
    int flags = chunk[2], codec = flags >> 5;
    /* flags: 0x05 an extended header, 0x02 copied whole, 0x10 one stream a block */
    if (chunk[0] < 3 || chunk[0] > 5 || (flags & 0x17) != 0x15 || chunk[3] != c->itemsize || chunk[31] != 0
        || memcmp(chunk + 16, bitshuffle_alone, 6) || block != c->bits_block * c->itemsize
        || nbytes != padded || !((codec == 1 && c->lz4) || (codec == 4 && c->zstd)))
        return RP_OTHER_LAYOUT;
    if (cbytes > size - n)
        return RP_DAMAGED;
    return blosc_streams(c, chunk, cbytes, 32, nbytes, block, flags, out);
}

/* A whole chunk kept shuffled where its filter bitshuffles (or c-blosc byte-shuffles): read, checked and
 * decoded into dst still shuffled (the GPU undoes it); one stored otherwise decoded the usual way,
 * then shuffled again. */
static int decode_kept_shuffled(const struct piece *job, unsigned char *dst)
{
    const struct chunks *c = job->spec;
    struct local *l = thread_local_state();
    unsigned char *raw = l ? grow(&l->stored, job->stored) : NULL;
    if (!raw)
        return -ENOMEM;
    size_t payload = job->stored - (c->summed ? 4 : 0);
    if (c->summed && job->stored < 4)
        return RP_CHECKSUM;
    int status = job->mask & c->codec_bit ? RP_OTHER_LAYOUT : read_fully(c->fd, (char *)raw, job->stored, job->offset);
    if (!status && c->summed && !checksum_ok(raw, payload, raw + payload))
        status = RP_CHECKSUM;
    if (!status)
        status = c->bits == RP_BITS_BSHUF    ? bshuf_blocks(c, raw, payload, dst)
                 : c->bits == RP_BITS_BLOSC2 ? blosc2_blocks(c, raw, payload, dst)
                                             : blosc_blocks(c, raw, payload, dst);
    if (status != RP_OTHER_LAYOUT)
        return status;
    unsigned char *plain = grow(&l->plain, c->nbytes);
    if (!plain)
        return -ENOMEM;
    struct piece whole = *job;
    whole.keep_shuffled = 0;
    whole.dst = (char *)plain;
    whole.lo = whole.from;
    status = decode_chunk(&whole);
    if (!status && c->bits == RP_BYTES_BLOSC)
        rp_blosc_shuffle(plain, dst, c->nbytes / c->itemsize, c->itemsize, c->bits_block);
    else if (!status)
        rp_bitshuffle(plain, dst, c->nbytes / c->itemsize, c->itemsize, c->bits_block, c->bits == RP_BITS_BLOSC);
    return status;
}

/* One chunk read, checked and decoded into its place in the read's rows. */
int decode_chunk(const struct piece *job)
{
    const struct chunks *c = job->spec;
    int coded = c->codec != RP_RAW && !(job->mask & c->codec_bit);
    long long first = job->index / c->per * c->chunk[0];
    size_t skip = (size_t)(job->from - first) * c->row_bytes, n = (size_t)(job->to - job->from) * c->row_bytes;
    /* codes (reader.py's takes_codes): chunks of whole images stored without a codec or shuffle,
     * read a step at a time (read_chunk_codes); chunks cutting images, decoded into this thread's
     * buffer as always and packed to 8-bit codes as they are scattered. Chunks of whole images a
     * codec decodes go straight into place as float32: a pass through a buffer would cost more
     * than the narrower upload saves. */
    const int codes = job->codes;
    if (codes && !c->cut)
        return read_chunk_codes(job);
    char *dst = job->dst + (size_t)(job->from - job->lo) * c->row_bytes;
    int whole = !c->cut && skip == 0 && n == c->nbytes;
    int shuffled = c->shuffle && c->itemsize > 1 && !(job->mask & 1) && !(whole && job->keep_shuffled && !c->swap);
    if (c->bits && whole && job->keep_shuffled && !c->swap)
        return decode_kept_shuffled(job, (unsigned char *)dst);
    struct local *l = thread_local_state();
    if (!l)
        return -ENOMEM;
    int plugin = coded && c->codec == RP_PLUGIN;
    unsigned char *out = plugin ? NULL : whole && !shuffled ? (unsigned char *)dst : grow(&l->decoded, c->nbytes);
    if (!out && !plugin)
        return -ENOMEM;
    size_t payload = job->stored - (c->summed ? 4 : 0);
    if (c->summed && job->stored < 4)
        return RP_CHECKSUM;
    int status = 0;
    void *owned = NULL;            /* a plugin's output, freed once placed */
    if (plugin) {
        status = plugin_decode(c, job, &owned);
        if (status)
            return status;
        out = owned;
    } else if (!coded && !c->summed) {
        if (job->stored != c->nbytes)
            return RP_SIZE;
        status = read_fully(c->fd, (char *)out, c->nbytes, job->offset);
    } else if (!coded && payload == c->nbytes) {
        /* fletcher32 alone: the values read straight into their place (no copy of the chunk held by
         * the thread), a cache-sized step at a time, each summed while still in this core's cache;
         * the 4 checksum bytes read beside */
        const size_t step = FLETCHER_STEP;
        struct fletcher f = {0, 0};
        unsigned char sum[4];
        for (size_t at = 0; at < payload && !status; at += step) {
            size_t n = payload - at < step ? payload - at : step;
            status = read_fully(c->fd, (char *)out + at, n, job->offset + (long long)at);
            fletcher32_add(&f, out + at, n);
        }
        if (!status)
            status = read_fully(c->fd, (char *)sum, 4, job->offset + (long long)payload);
        if (!status && !checksum_is(fletcher32_end(&f), sum))
            status = RP_CHECKSUM;
    } else {
        unsigned char *raw = grow(&l->stored, job->stored);
        if (!raw)
            return -ENOMEM;
        status = read_fully(c->fd, (char *)raw, job->stored, job->offset);
        if (!status && c->summed && !checksum_ok(raw, payload, raw + payload))
            status = RP_CHECKSUM;
        if (!status && !coded)
            payload == c->nbytes ? (void)memcpy(out, raw, payload) : (void)(status = RP_SIZE);
        else if (!status && c->codec == RP_DEFLATE)
            status = inflate_into(l, raw, payload, out, c->nbytes);
        else if (!status && c->codec == RP_LZF) {
            long long got = rp_lzf_decompress(raw, payload, out, c->nbytes);
            status = got < 0 ? RP_DAMAGED : (size_t)got != c->nbytes ? RP_SIZE : 0;
        } else if (!status)
            status = direct_decode(c, raw, payload, out);
        if (status == RP_OTHER_LAYOUT && c->plugin) {
            status = plugin_decode(c, job, &owned);
            out = owned;
        }
    }
    if (status)
        return status == RP_OTHER_LAYOUT ? RP_DAMAGED : status;
    if (shuffled) {
        unsigned char *into = whole ? (unsigned char *)dst : grow(&l->unshuffled, c->nbytes);
        if (!into) {
            free(owned);
            return -ENOMEM;
        }
        rp_unshuffle(out, into, c->nbytes / c->itemsize, c->itemsize, c->swap);
        out = into;
    } else if (c->swap)
        rp_byteswap(out, c->nbytes, c->itemsize);
    int ok = 1;
    if (c->cut)
        ok = scatter(c, job->index, out, (unsigned char *)job->dst, job->lo, job->from, job->to, codes);
    else if (out != (unsigned char *)dst)
        memcpy(dst, out + skip, n);
    free(owned);
    return ok ? 0 : RP_NOT_CODES;
}

/* A chunked dataset's recipe for rp_submit_chunks (freed by rp_chunks_free), or NULL: its shape
 * and chunk shape (rank dimensions, the first the rows), value size and filters; swap: its values
 * are stored in the other byte order. */
struct chunks *rp_chunks(int fd, size_t itemsize, int shuffle, int swap, int codec, unsigned codec_bit, int summed,
                         int rank, const long long *shape, const long long *chunk)
{
    if (rank < 1 || rank > RP_MAX_RANK)
        return NULL;
    struct chunks *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    *c = (struct chunks){.fd = fd, .itemsize = itemsize, .shuffle = shuffle, .swap = swap && itemsize > 1,
                         .codec = codec, .codec_bit = codec_bit,
                         .summed = summed, .rank = rank, .per = 1, .nbytes = itemsize, .row_bytes = itemsize};
    for (int d = 0; d < rank; d++) {
        c->shape[d] = shape[d];
        c->chunk[d] = chunk[d];
        c->nbytes *= (size_t)chunk[d];
        if (d > 0) {
            c->per *= (shape[d] + chunk[d] - 1) / chunk[d];
            c->row_bytes *= (size_t)shape[d];
            c->cut |= chunk[d] != shape[d];
        }
    }
    return c;
}

void rp_chunks_free(struct chunks *c)
{
    free(c);
}

/* Decode c's chunks with an HDF5 filter plugin's function (codec RP_PLUGIN), called with the
 * dataset's filter flags and cd_values: 0, or -EINVAL where there are too many values. */
int rp_chunks_plugin(struct chunks *c, void *filter, unsigned flags, size_t cd_count, const unsigned *cd)
{
    if (cd_count > RP_MAX_CD)
        return -EINVAL;
    c->plugin = (plugin_fn)filter;
    c->plugin_flags = flags;
    c->cd_count = cd_count;
    memcpy(c->cd, cd, cd_count * sizeof *cd);
    return 0;
}

/* Decode c's chunks with a codec's own function instead of the plugin's (codec RP_ZSTD, RP_LZ4,
 * RP_BLOSC or RP_BLOSC2, see direct_decode; the plugin, where also set, takes the Blosc2 chunks it
 * cannot place): 0, or -EINVAL. */
int rp_chunks_direct(struct chunks *c, int codec, void *fn)
{
    if (codec < RP_ZSTD || codec > RP_BLOSC2 || !fn)
        return -EINVAL;
    c->codec = codec;
    c->direct = fn;
    return 0;
}

/* Decode the whole chunks of a read that keeps them shuffled only to their bitshuffled blocks of
 * `block` values: bits RP_BITS_BSHUF (the Bitshuffle filter; lz4 or zstd: its codec's function),
 * RP_BITS_BLOSC (c-blosc) or RP_BITS_BLOSC2 (Blosc2's frames; either or both); or, RP_BYTES_BLOSC,
 * to c-blosc's blocks of `block` values each byte-shuffled. 0, or -EINVAL. */
int rp_chunks_bits(struct chunks *c, int bits, size_t block, void *lz4, void *zstd)
{
    if (bits < RP_BITS_BSHUF || bits > RP_BYTES_BLOSC || block == 0 || (block % 8 && bits != RP_BYTES_BLOSC)
        || (!lz4 && !zstd) || (bits == RP_BITS_BSHUF && lz4 && zstd))
        return -EINVAL;
    c->bits = bits;
    c->bits_block = block;
    c->lz4 = lz4;
    c->zstd = zstd;
    return 0;
}

/* Where a Blosc2 frame of `size` bytes holds its chunk (the chunk's header there), its b2nd blocks
 * (where it has them) holding whole rows, and the bytes that chunk decodes to (*padded: past the
 * HDF5 chunk's where the blocks' rows do not divide its rows); else -1. */
long long rp_blosc2_chunk(const struct chunks *c, const unsigned char *frame, size_t size, size_t *padded)
{
    size_t at;
    return blosc2_frame_chunk(c, frame, size, &at, padded) ? -1 : (long long)at;
}

/* Hand over the inflater: libdeflate's allocator, free and zlib decompressor, or (those NULL)
 * zlib's uncompress. Before any chunk is submitted. */
void rp_set_inflater(void *alloc, void *release, void *zlib_decompress, void *uncompress)
{
    ld_alloc = (void *(*)(void))alloc;
    ld_free = (void (*)(void *))release;
    ld_zlib = (int (*)(void *, const void *, size_t, void *, size_t, size_t *))zlib_decompress;
    z_uncompress = (int (*)(unsigned char *, unsigned long *, const unsigned char *, unsigned long))uncompress;
}
/* Chunk j's job in the read of rows [lo, hi) into dst (chunk j: row of chunks j / per; its file
 * offset, stored size and filter mask in the arrays); the read's chunks are j in chunk_range. */
struct piece chunk_job(const struct chunks *c, long long lo, long long hi, const long long *offsets,
                       const long long *sizes, const unsigned *masks, char *dst, long long j)
{
    long long first = j / c->per * c->chunk[0], end = first + c->chunk[0];
    return (struct piece){.fd = c->fd, .dst = dst, .offset = offsets[j], .spec = c, .stored = (size_t)sizes[j],
                          .lo = lo, .from = first > lo ? first : lo, .to = end < hi ? end : hi, .mask = masks[j],
                          .index = j};
}

void chunk_range(const struct chunks *c, long long lo, long long hi, long long *begin, long long *end)
{
    *begin = lo / c->chunk[0] * c->per;
    *end = (hi + c->chunk[0] - 1) / c->chunk[0] * c->per;
}
/* The same read on the calling thread (Python's reader threads, for reads they check or convert):
 * 0 or a failure as rp_wait's, *where the chunk. */
int rp_read_chunks(const struct chunks *c, long long lo, long long hi, const long long *offsets,
                   const long long *sizes, const unsigned *masks, char *dst, long long *where)
{
    long long j, end;
    for (chunk_range(c, lo, hi, &j, &end); j < end; j++) {
        struct piece job = chunk_job(c, lo, hi, offsets, sizes, masks, dst, j);
        int status = decode_chunk(&job);
        if (status) {
            *where = j;
            return status;
        }
    }
    return 0;
}
