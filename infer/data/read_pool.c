/* A pool of native threads reading file bytes into memory with pread: the reader's fast path for
 * contiguous datasets. Python threads reading with os.preadv must take the interpreter lock back
 * after every call, and with the consumer thread busy launching kernels they wait for it: 16 such
 * threads read 10 GB/s where 16 of these read 50 (docs/performance.md, the reader probe). One Python call
 * queues a whole block (rp_submit, pieces spread over the threads) and one waits for it (rp_wait),
 * both through ctypes, which releases the interpreter lock for the wait.
 * The same threads decode chunked datasets (rp_submit_chunks: a job per chunk, read, checked
 * (fletcher32), inflated (libdeflate or zlib, through function pointers the caller hands over,
 * so this file needs neither's headers), LZF-decoded, decoded by the codec inside hdf5plugin's
 * Zstd, LZ4, Blosc and Blosc2 plugins (their libraries export it: rp_chunks_direct) or by an HDF5
 * filter plugin's own function (the other plugins: Bitshuffle...), unshuffled, straight into the
 * destination when the chunk lies wholly in the read); rp_read_chunks decodes on the calling thread.
 * Values stored in the other byte order are swapped on the same threads, after the read or the
 * decoding (folded into the unshuffle where there is one).
 * float32 images that are 8-bit pixels (scaled to [0, 1] as code * float32(1/255), MNIST's own
 * conversion, or code / 255, torchvision's and Keras's, or not at all) can be read as their 8-bit codes
 * (rp_submit_codes): each cache-sized step read into a buffer of the thread's own and every value
 * checked to be exactly a code's as it is packed, so a GPU uploads a quarter of the bytes and
 * rebuilds the same floats; a value that is not fails the read (RP_NOT_CODES) and the caller reads
 * float32.
 * Labels are read here too (rp_submit_labels: one-hot rows, each row's first maximum, values that are
 * not finite refused), queued behind every read: on Python's threads the reads, checks and argmax
 * took ~95 ms of CPU in a 1M-image run, much of it holding the interpreter lock the consumer waited
 * for (docs/performance.md).
 * Built by infer/data/native.py with the C compiler, cached on disk; without one, Python threads read. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

struct batch {                     /* one rp_submit: its pieces still to read, and how they went */
    int pending;
    int status;                    /* 0, RP_EOF where the file ended early, RP_DAMAGED..., else -errno */
    long long where;               /* the chunk whose failure `status` is: the lowest that failed */
    pthread_cond_t done;
};

#define RP_MAX_RANK 8
#define RP_MAX_CD 32

/* An HDF5 filter's function (H5Z_func_t): with H5Z_FLAG_REVERSE in flags it decodes the nbytes at
 * *buf (malloc'd, *buf_size long) and returns the decoded size, or 0 on failure; it may replace
 * *buf with a new malloc'd block, freeing the old one. */
typedef size_t (*plugin_fn)(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes,
                            size_t *buf_size, void **buf);
#define H5Z_FLAG_REVERSE 0x0100

struct chunks {                    /* how one chunked dataset's chunks decode and lie (rp_chunks) */
    int fd;
    size_t itemsize;
    int shuffle;                   /* the shuffle filter, filter 0 where present */
    int swap;                      /* values stored in the other byte order: reversed once decoded */
    int codec;                     /* RP_RAW, RP_DEFLATE, RP_LZF, RP_PLUGIN, or a direct codec: RP_ZSTD... */
    unsigned codec_bit;            /* set in a chunk's filter mask: the codec was skipped for it */
    int summed;                    /* fletcher32: 4 bytes of checksum after the stored data */
    int rank;
    long long shape[RP_MAX_RANK], chunk[RP_MAX_RANK];
    long long per;                 /* chunks per row of chunks, numbered in C order within it */
    int cut;                       /* chunks cut rows (per > 1, or a chunk wider than the data) */
    size_t nbytes;                 /* a chunk's bytes decoded */
    size_t row_bytes;              /* a dataset row's bytes */
    void *direct;                  /* RP_ZSTD, RP_LZ4, RP_BLOSC, RP_BLOSC2: the codec's decoding function */
    int bits;                      /* RP_BITS_BSHUF, RP_BITS_BLOSC: a whole chunk kept shuffled stays bitshuffled */
    size_t bits_block;             /* values per bitshuffled block (the last may be shorter) */
    void *lz4, *zstd;              /* LZ4_decompress_safe, ZSTD_decompress (the Bitshuffle filter: its codec's only) */
    plugin_fn plugin;              /* RP_PLUGIN: an HDF5 filter plugin's function, its flags, cd_values */
    unsigned plugin_flags;
    size_t cd_count;
    unsigned cd[RP_MAX_CD];
};

struct piece {                     /* n bytes at `offset` of fd into dst; or, with spec, one chunk */
    int fd;
    char *dst;                     /* a chunk: where row `lo` of the read goes */
    size_t n;
    long long offset;
    size_t swap;                   /* a plain read of values stored in the other byte order: their size */
    int codes;                     /* a plain read of float32 values packed to 8-bit codes (n: the file's
                                      bytes): 1 + their scaling (see rp_pack_codes) */
    struct batch *batch;
    const struct chunks *spec;
    size_t stored;                 /* the chunk's stored bytes */
    long long lo, from, to;        /* the read's first row; the rows [from, to) this chunk gives it */
    unsigned mask;                 /* the chunk's filter mask */
    long long index;               /* the chunk's number, for errors */
    int keep_shuffled;             /* a chunk wholly in the read stays shuffled (the GPU unshuffles it) */
    int kind;                      /* labels: the values' type (RP_F32...), n rows of `classes` into dst */
    size_t classes;
};

struct jobs {                      /* a ring: count pieces from head, capacity cap */
    struct piece *at;
    size_t head, count, cap;
};

struct pool {
    pthread_mutex_t lock;
    pthread_cond_t work;
    struct jobs queue[2];          /* 0: reads and chunks; 1: labels, taken only while 0 is empty */
    int stop, threads;
    pthread_t *ids;
    long long busy_ns;             /* the threads' time in pread, summed */
};

enum { RP_EOF = 1, RP_DAMAGED, RP_SIZE, RP_CHECKSUM, RP_NOT_FINITE, RP_NOT_CODES };  /* rp_wait's failures besides -errno */
enum { RP_F32 = 1, RP_F64, RP_I8, RP_U8, RP_I16, RP_U16, RP_I32, RP_U32, RP_I64, RP_U64 };  /* label value types */
enum { RP_RAW, RP_DEFLATE, RP_LZF, RP_PLUGIN, RP_ZSTD, RP_LZ4, RP_BLOSC, RP_BLOSC2 };
enum { RP_BITS_BSHUF = 1, RP_BITS_BLOSC = 2 };  /* rp_chunks_bits: the Bitshuffle filter's chunks, c-blosc's */
enum { RP_OTHER_LAYOUT = 100 };  /* direct_decode: a chunk the codec's function cannot place, for the plugin */

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

struct scratch {
    unsigned char *p;
    size_t n;
};

/* What a thread that decodes chunks keeps between chunks (the pool's threads and Python's, which
 * call rp_read_chunks), freed when it exits. */
struct local {
    struct scratch stored, decoded, unshuffled, plain;  /* reused: see grow */
    void *decompressor;
    void (*release)(void *);       /* the free that goes with the decompressor's allocator */
};
static pthread_key_t local_key;
static pthread_once_t local_once = PTHREAD_ONCE_INIT;

static void free_local(void *state)
{
    struct local *l = state;
    if (l->decompressor)
        l->release(l->decompressor);
    free(l->stored.p);
    free(l->decoded.p);
    free(l->unshuffled.p);
    free(l->plain.p);
    free(l);
}

static void make_local_key(void)
{
    pthread_key_create(&local_key, free_local);
}

static struct local *thread_local_state(void)
{
    pthread_once(&local_once, make_local_key);
    struct local *l = pthread_getspecific(local_key);
    if (!l && (l = calloc(1, sizeof *l)) && pthread_setspecific(local_key, l)) {
        free(l);
        l = NULL;
    }
    return l;
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int read_fully(int fd, char *dst, size_t n, long long offset)
{
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, dst + done, n - done, (off_t)(offset + done));
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (got == 0)
            return RP_EOF;
        done += (size_t)got;
    }
    return 0;
}

/* A thread's buffer of at least n bytes, kept for its next chunk: a fresh 3 MB block per chunk is
 * mapped and unmapped each time, and the threads serialize on the kernel's memory-map lock. */
static unsigned char *grow(struct scratch *s, size_t n)
{
    if (s->n < n) {
        unsigned char *p = realloc(s->p, n);
        if (!p)
            return NULL;
        s->p = p;
        s->n = n;
    }
    return s->p;
}

static long long rp_lzf_decompress(const unsigned char *in, size_t in_len, unsigned char *out, size_t out_len);
static void rp_unshuffle(const unsigned char *src, unsigned char *dst, size_t n, size_t size, int swap);
static void rp_byteswap(unsigned char *p, size_t n, size_t size);
static void rp_bitshuffle(const unsigned char *src, unsigned char *dst, size_t n, size_t size, size_t block,
                          int exact_tail);
static unsigned int rp_fletcher32(const unsigned char *data, size_t nbytes);

static int checksum_ok(const unsigned char *raw, size_t payload)
{
    unsigned int sum = rp_fletcher32(raw, payload), b0 = sum & 255, b1 = sum >> 8 & 255,
                 b2 = sum >> 16 & 255, b3 = sum >> 24;
    unsigned int stored = raw[payload] | raw[payload + 1] << 8 | raw[payload + 2] << 16 | (unsigned)raw[payload + 3] << 24;
    return stored == sum || stored == (b1 << 24 | b0 << 16 | b3 << 8 | b2); /* HDF5 <= 1.6.2's order too */
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
 * runs along the innermost dimensions the chunk spans whole. */
static void scatter(const struct chunks *c, long long j, const unsigned char *src, unsigned char *dst, long long lo,
                    long long from, long long to)
{
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
            memcpy(dst + t, src + s, run);
            int d = q - 1;         /* the next run: an odometer over dimensions 1 .. q - 1 */
            while (d >= 1 && ++idx[d] == extent[d])
                idx[d--] = 0;
            if (d < 1)
                break;
        }
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
 * padding. So the chunk's first c->nbytes decode straight into place (blosc2_getitem: a context of
 * its own per call, thread-safe), block by block. 0, RP_DAMAGED or RP_SIZE from the codec, or
 * RP_OTHER_LAYOUT: anything else (blocks cutting rows, other metalayers, a header this does not
 * parse), left to the plugin, which decodes it or says it is damaged. */
static int blosc2_frame_decode(const struct chunks *c, const unsigned char *in, size_t size, unsigned char *out)
{
    size_t at = 0;
    long long header = 0, frame = 0, typesize = 0;
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
    const unsigned char *chunk = in + n;
    if (size - n < 32)
        return RP_OTHER_LAYOUT;
    size_t nbytes, cbytes;
    blosc_sizes(chunk, &nbytes, &cbytes);
    typesize = chunk[3];
    size_t padded = found ? (size_t)((c->chunk[0] + shape[2][0] - 1) / shape[2][0] * shape[2][0]) * (c->nbytes / (size_t)c->chunk[0])
                          : c->nbytes;
    if (cbytes > size - n || cbytes > 0x7fffffff || typesize < 1)
        return RP_OTHER_LAYOUT;
    if (nbytes != padded || c->nbytes % (size_t)typesize || c->nbytes > 0x7fffffff)
        return RP_OTHER_LAYOUT;
    int got = ((blosc2_getitem_fn)c->direct)(chunk, (int)cbytes, 0, (int)(c->nbytes / (size_t)typesize), out, (int)c->nbytes);
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
    if (!status && c->summed && !checksum_ok(buf, payload))
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

/* A c-blosc chunk (header: format version, codec version, flags, value size, decoded size, block
 * size, stored size; each block's start; per block its streams, 1 or one per value byte, each a size
 * and lz4 or zstd bytes, stored as they are where that size is the stream's) decoded into out still
 * bitshuffled: 0, RP_DAMAGED, RP_SIZE, or RP_OTHER_LAYOUT for a chunk stored otherwise (not
 * bitshuffled, copied whole, another codec or block size, a format version but c-blosc 1's 2, in
 * which a block whose values are not a multiple of 8 is stored as it is). */
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
    if (in[0] != 2 || (flags & 0x0b) || !(flags & 0x04) || typesize != c->itemsize
        || block != c->bits_block * c->itemsize || !((codec == 1 && c->lz4) || (codec == 4 && c->zstd)))
        return RP_OTHER_LAYOUT;
    size_t blocks = nbytes / block + (nbytes % block > 0);
    if (blocks > (size - 16) / 4)
        return RP_DAMAGED;
    for (size_t k = 0; k < blocks; k++) {
        size_t bsize = k == nbytes / block ? nbytes % block : block, at = little_endian(in + 16 + 4 * k, 4);
        int split = !(flags & 0x10) && typesize <= 16 && bsize / typesize >= 128 && bsize == block;
        size_t streams = split ? typesize : 1, part = bsize / streams;
        for (size_t j = 0; j < streams; j++) {
            if (at > size || size - at < 4)
                return RP_DAMAGED;
            size_t stored = little_endian(in + at, 4);
            at += 4;
            if (stored > size - at)
                return RP_DAMAGED;
            unsigned char *into = out + k * block + j * part;
            if (stored == part)
                memcpy(into, in + at, part);
            else if (block_decode(c, codec == 4, in + at, stored, into, part))
                return RP_DAMAGED;
            at += stored;
        }
    }
    return 0;
}

/* A whole chunk kept shuffled where its filter bitshuffles: read, checked and decoded into dst still
 * bitshuffled (the GPU undoes it); one stored otherwise decoded the usual way, then bitshuffled. */
static int decode_chunk(const struct piece *job);

static int decode_bitshuffled(const struct piece *job, unsigned char *dst)
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
    if (!status && c->summed && !checksum_ok(raw, payload))
        status = RP_CHECKSUM;
    if (!status)
        status = c->bits == RP_BITS_BSHUF ? bshuf_blocks(c, raw, payload, dst) : blosc_blocks(c, raw, payload, dst);
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
    if (!status)
        rp_bitshuffle(plain, dst, c->nbytes / c->itemsize, c->itemsize, c->bits_block, c->bits == RP_BITS_BLOSC);
    return status;
}

/* One chunk read, checked and decoded into its place in the read's rows. */
static int decode_chunk(const struct piece *job)
{
    const struct chunks *c = job->spec;
    int coded = c->codec != RP_RAW && !(job->mask & c->codec_bit);
    long long first = job->index / c->per * c->chunk[0];
    size_t skip = (size_t)(job->from - first) * c->row_bytes, n = (size_t)(job->to - job->from) * c->row_bytes;
    char *dst = job->dst + (size_t)(job->from - job->lo) * c->row_bytes;
    int whole = !c->cut && skip == 0 && n == c->nbytes;
    int shuffled = c->shuffle && c->itemsize > 1 && !(job->mask & 1) && !(whole && job->keep_shuffled && !c->swap);
    if (c->bits && whole && job->keep_shuffled && !c->swap)
        return decode_bitshuffled(job, (unsigned char *)dst);
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
    } else {
        unsigned char *raw = grow(&l->stored, job->stored);
        if (!raw)
            return -ENOMEM;
        status = read_fully(c->fd, (char *)raw, job->stored, job->offset);
        if (!status && c->summed && !checksum_ok(raw, payload))
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
    if (c->cut)
        scatter(c, job->index, out, (unsigned char *)job->dst, job->lo, job->from, job->to);
    else if (out != (unsigned char *)dst)
        memcpy(dst, out + skip, n);
    free(owned);
    return 0;
}

/* A plain read of values stored in the other byte order, swapped a cache-sized step at a time, while
 * the step is still in this core's cache. */
static int read_swapped(const struct piece *job)
{
    const size_t step = 256 * 1024;  /* a multiple of every value size */
    for (size_t at = 0; at < job->n; at += step) {
        size_t n = job->n - at < step ? job->n - at : step;
        int status = read_fully(job->fd, job->dst + at, n, job->offset + (long long)at);
        if (status)
            return status;
        rp_byteswap((unsigned char *)job->dst + at, n, job->swap);
    }
    return 0;
}

#define CODE_STEP (256 * 1024) /* bytes of float32 values read and packed at a time */

enum { CODES_MUL, CODES_DIV, CODES_ONE };  /* scalings: code * float32(1/255), code / 255, code itself */

/* Codes of values [i, n) one at a time: the tail past the vector steps, or all without SSE2. */
static int pack_codes_tail(const float *src, unsigned char *dst, size_t i, size_t n, int scaling)
{
    const float scale = 1.0f / 255.0f;
    int ok = 1;
    for (; i < n; i++) {
        const float v = src[i], r = scaling == CODES_ONE ? v : v * 255.0f;
        const long k = r >= 0.0f && r <= 255.0f ? lrintf(r) : -1;
        float back = scaling == CODES_DIV ? (float)k / 255.0f : scaling == CODES_ONE ? (float)k : (float)k * scale;
        ok &= k >= 0 && memcmp(&back, &v, sizeof v) == 0;
        dst[i] = (unsigned char)k;
    }
    return ok;
}

/* k = v * 255 (CODES_ONE: v) rounded to nearest (the conversion's default rounding); v is a code
 * where k scaled back has v's bits and k is 0..255: `bad` gathers (back ^ v) | (k & ~255) (NaN and
 * values past the int range convert to 0x80000000, which fails the range). */
#ifdef __SSE2__
static int pack_codes_sse2(const float *src, unsigned char *dst, size_t n, int scaling)
{
    const __m128 c = _mm_set1_ps(1.0f / 255.0f), k255 = _mm_set1_ps(255.0f);
    const __m128i high = _mm_set1_epi32(~255);
    __m128i bad = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i k[4];
        for (int j = 0; j < 4; j++) {
            const __m128 v = _mm_loadu_ps(src + i + 4 * j);
            k[j] = _mm_cvtps_epi32(scaling == CODES_ONE ? v : _mm_mul_ps(v, k255));
            const __m128 f = _mm_cvtepi32_ps(k[j]);
            const __m128 back = scaling == CODES_DIV ? _mm_div_ps(f, k255) : scaling == CODES_ONE ? f : _mm_mul_ps(f, c);
            bad = _mm_or_si128(bad, _mm_xor_si128(_mm_castps_si128(back), _mm_castps_si128(v)));
            bad = _mm_or_si128(bad, _mm_and_si128(k[j], high));
        }
        _mm_storeu_si128((__m128i *)(dst + i), _mm_packus_epi16(_mm_packs_epi32(k[0], k[1]), _mm_packs_epi32(k[2], k[3])));
    }
    const int ok = _mm_movemask_epi8(_mm_cmpeq_epi32(bad, _mm_setzero_si128())) == 0xffff;
    return ok & pack_codes_tail(src, dst, i, n, scaling);
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The same, 32 values a step with AVX2 (this file is built for any x86-64: chosen at run time).
 * With SSE2 alone the packing took as long as the read: float32 streamed slower as codes. */
__attribute__((target("avx2"))) static int pack_codes_avx2(const float *src, unsigned char *dst, size_t n, int scaling)
{
    const __m256 c = _mm256_set1_ps(1.0f / 255.0f), k255 = _mm256_set1_ps(255.0f);
    const __m256i high = _mm256_set1_epi32(~255), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i bad = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i k[4];
        for (int j = 0; j < 4; j++) {
            const __m256 v = _mm256_loadu_ps(src + i + 8 * j);
            k[j] = _mm256_cvtps_epi32(scaling == CODES_ONE ? v : _mm256_mul_ps(v, k255));
            const __m256 f = _mm256_cvtepi32_ps(k[j]);
            const __m256 back = scaling == CODES_DIV ? _mm256_div_ps(f, k255) : scaling == CODES_ONE ? f : _mm256_mul_ps(f, c);
            bad = _mm256_or_si256(bad, _mm256_xor_si256(_mm256_castps_si256(back), _mm256_castps_si256(v)));
            bad = _mm256_or_si256(bad, _mm256_and_si256(k[j], high));
        }
        /* the packs work within 128-bit lanes: the permute puts the 32 bytes back in order */
        const __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(k[0], k[1]), _mm256_packs_epi32(k[2], k[3]));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_permutevar8x32_epi32(packed, order));
    }
    return _mm256_testz_si256(bad, bad) & pack_codes_tail(src, dst, i, n, scaling);
}
#endif

/* n float32 values at src -> their codes k (0..255) at dst on the given path (0: one at a time,
 * 1: SSE2, 2: AVX2, -1: the best this CPU runs): 1 where every value is exactly k scaled as
 * `scaling` says (CODES_MUL: k * float32(1/255); CODES_DIV: k / 255 in float32; CODES_ONE: k; -0.0,
 * NaN and anything past 255 are none), else 0; -1 where the path is not built or not on this CPU.
 * Exported for the tests, which compare every path with NumPy's. */
int rp_pack_codes(const float *src, unsigned char *dst, size_t n, int path, int scaling)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (path == 2 || (path < 0 && __builtin_cpu_supports("avx2")))
        return __builtin_cpu_supports("avx2") ? pack_codes_avx2(src, dst, n, scaling) : -1;
#endif
#ifdef __SSE2__
    if (path == 1 || path < 0)
        return pack_codes_sse2(src, dst, n, scaling);
#endif
    return path <= 0 ? pack_codes_tail(src, dst, 0, n, scaling) : -1;
}

/* A plain read of float32 values packed to codes: a step at a time into this thread's buffer. */
static int read_codes(const struct piece *job)
{
    struct local *l = thread_local_state();
    float *step_buf = l ? (float *)grow(&l->plain, CODE_STEP) : NULL;
    if (!step_buf)
        return -ENOMEM;
    for (size_t at = 0; at < job->n; at += CODE_STEP) {
        size_t n = job->n - at < CODE_STEP ? job->n - at : CODE_STEP;
        int status = read_fully(job->fd, (char *)step_buf, n, job->offset + (long long)at);
        if (status)
            return status;
        if (rp_pack_codes(step_buf, (unsigned char *)job->dst + at / 4, n / 4, -1, job->codes - 1) != 1)
            return RP_NOT_CODES;
    }
    return 0;
}

#define ALWAYS_FINITE(v) 1
/* Each of `rows` rows of `classes` values of type T at src: the index of its first maximum into out;
 * the first row holding a value that is not finite (nothing written for it or after), or -1. */
#define FIRST_MAX(name, T, FINITE)                                                                  \
    static long long name(const void *src, long long rows, size_t classes, long long *out)         \
    {                                                                                               \
        const T *v = src;                                                                           \
        for (long long r = 0; r < rows; r++, v += classes) {                                        \
            size_t best = 0;                                                                        \
            for (size_t k = 0; k < classes; k++) {                                                  \
                if (!FINITE(v[k]))                                                                  \
                    return r;                                                                       \
                best = v[k] > v[best] ? k : best;                                                   \
            }                                                                                       \
            out[r] = (long long)best;                                                               \
        }                                                                                           \
        return -1;                                                                                  \
    }
FIRST_MAX(first_max_f32, float, isfinite)
FIRST_MAX(first_max_f64, double, isfinite)
FIRST_MAX(first_max_i8, signed char, ALWAYS_FINITE)
FIRST_MAX(first_max_u8, unsigned char, ALWAYS_FINITE)
FIRST_MAX(first_max_i16, short, ALWAYS_FINITE)
FIRST_MAX(first_max_u16, unsigned short, ALWAYS_FINITE)
FIRST_MAX(first_max_i32, int, ALWAYS_FINITE)
FIRST_MAX(first_max_u32, unsigned int, ALWAYS_FINITE)
FIRST_MAX(first_max_i64, long long, ALWAYS_FINITE)
FIRST_MAX(first_max_u64, unsigned long long, ALWAYS_FINITE)

static const struct {
    size_t size;
    long long (*first_max)(const void *, long long, size_t, long long *);
} label_types[] = {{0, NULL}, {4, first_max_f32}, {8, first_max_f64}, {1, first_max_i8}, {1, first_max_u8},
                   {2, first_max_i16}, {2, first_max_u16}, {4, first_max_i32}, {4, first_max_u32},
                   {8, first_max_i64}, {8, first_max_u64}};

/* rp_submit_labels' job: its rows read a cache-sized step at a time into the thread's buffer
 * (swapped where stored in the other byte order), each row's first maximum into dst (int64). A row
 * holding a value that is not finite: RP_NOT_FINITE, job->index that row. */
static int label_rows(struct piece *job)
{
    struct local *l = thread_local_state();
    size_t size = label_types[job->kind].size, row_bytes = job->classes * size;
    long long step = (long long)(256 * 1024 / row_bytes) + 1;
    unsigned char *buf = l ? grow(&l->plain, (size_t)step * row_bytes) : NULL;
    if (!buf)
        return -ENOMEM;
    for (long long at = 0; at < (long long)job->n; at += step) {
        long long rows = (long long)job->n - at < step ? (long long)job->n - at : step;
        int status = read_fully(job->fd, (char *)buf, (size_t)rows * row_bytes, job->offset + at * (long long)row_bytes);
        if (status)
            return status;
        if (job->swap > 1)
            rp_byteswap(buf, (size_t)rows * row_bytes, size);
        long long bad = label_types[job->kind].first_max(buf, rows, job->classes, (long long *)job->dst + at);
        if (bad >= 0) {
            job->index = job->lo + at + bad;
            return RP_NOT_FINITE;
        }
    }
    return 0;
}

/* The same on rows already in memory (Python's threads, for labels read otherwise): the first
 * row not finite, or -1; -2 for a type rp_submit_labels does not take. */
long long rp_first_max(const void *src, long long rows, size_t classes, int kind, long long *out)
{
    if (kind < RP_F32 || kind > RP_U64)
        return -2;
    return label_types[kind].first_max(src, rows, classes, out);
}

static void *worker(void *arg)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->queue[0].count && !p->queue[1].count && !p->stop)
            pthread_cond_wait(&p->work, &p->lock);
        struct jobs *q = &p->queue[p->queue[0].count ? 0 : 1];
        if (!q->count)
            break;
        struct piece job = q->at[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
        pthread_mutex_unlock(&p->lock);
        long long t = now_ns();
        int status = job.spec ? decode_chunk(&job) : job.kind ? label_rows(&job) : job.swap > 1 ? read_swapped(&job)
                     : job.codes ? read_codes(&job) : read_fully(job.fd, job.dst, job.n, job.offset);
        t = now_ns() - t;
        pthread_mutex_lock(&p->lock);
        p->busy_ns += t;
        if (status && (!job.batch->status || job.index < job.batch->where)) {
            job.batch->status = status;
            job.batch->where = job.index;
        }
        if (--job.batch->pending == 0)
            pthread_cond_broadcast(&job.batch->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

void rp_destroy(struct pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->threads; i++)
        pthread_join(p->ids[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    free(p->queue[0].at);
    free(p->queue[1].at);
    free(p->ids);
    free(p);
}

/* A pool of `threads` threads, or NULL if they cannot be had. */
struct pool *rp_create(int threads)
{
    struct pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    for (int k = 0; k < 2; k++) {
        p->queue[k].cap = 64;
        p->queue[k].at = malloc(p->queue[k].cap * sizeof *p->queue[k].at);
    }
    p->ids = calloc((size_t)threads, sizeof *p->ids);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    if (!p->queue[0].at || !p->queue[1].at || !p->ids) {
        rp_destroy(p);
        return NULL;
    }
    for (; p->threads < threads; p->threads++)
        if (pthread_create(&p->ids[p->threads], NULL, worker, p)) {
            rp_destroy(p);
            return NULL;
        }
    return p;
}

static int push(struct pool *p, struct piece job)
{
    struct jobs *q = &p->queue[job.kind ? 1 : 0];  /* labels are needed only at a run's end */
    if (q->count == q->cap) {
        struct piece *at = malloc(2 * q->cap * sizeof *at);
        if (!at)
            return -ENOMEM;
        for (size_t i = 0; i < q->count; i++)
            at[i] = q->at[(q->head + i) % q->cap];
        free(q->at);
        q->at = at;
        q->head = 0;
        q->cap *= 2;
    }
    q->at[(q->head + q->count++) % q->cap] = job;
    return 0;
}

static struct batch *new_batch(struct pool *p)
{
    struct batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    pthread_cond_init(&b->done, NULL);
    pthread_mutex_lock(&p->lock);
    b->pending = 1;                /* held until every piece is queued */
    return b;
}

static struct batch *queued(struct pool *p, struct batch *b)
{
    b->pending--;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    return b;
}

static void enqueue(struct pool *p, struct batch *b, struct piece job)
{
    if (b->status)
        return;
    if (push(p, job))
        b->status = -ENOMEM;
    else
        b->pending++;
}

/* Queue the read of n bytes at `offset` of fd into dst, in pieces of at most `piece` bytes; where
 * swap > 1, values of that many bytes stored in the other byte order, swapped (pieces rounded to
 * whole values). The ticket for rp_wait, or NULL where memory ran out. */
struct batch *rp_submit(struct pool *p, int fd, char *dst, size_t n, long long offset, size_t piece, size_t swap)
{
    struct batch *b = new_batch(p);
    if (!b)
        return NULL;
    if (swap > 1)
        piece -= piece % swap;
    if (piece == 0)
        piece = n ? n : 1;
    for (size_t at = 0; at < n; at += piece)
        enqueue(p, b, (struct piece){.fd = fd, .dst = dst + at, .n = n - at < piece ? n - at : piece,
                                      .offset = offset + (long long)at, .swap = swap, .batch = b});
    return queued(p, b);
}

/* Queue the read of n bytes of float32 values (n a multiple of 4) at `offset` of fd as their 8-bit
 * codes into dst (n / 4 bytes), in pieces of about `piece` bytes of the file: RP_NOT_CODES where a
 * value is not a code in the given scaling (see rp_pack_codes). The ticket for rp_wait, or NULL. */
struct batch *rp_submit_codes(struct pool *p, int fd, char *dst, size_t n, long long offset, size_t piece, int scaling)
{
    struct batch *b = new_batch(p);
    if (!b)
        return NULL;
    piece -= piece % 64;
    if (piece == 0)
        piece = 64;
    for (size_t at = 0; at < n; at += piece)
        enqueue(p, b, (struct piece){.fd = fd, .dst = dst + at / 4, .n = n - at < piece ? n - at : piece,
                                      .offset = offset + (long long)at, .codes = 1 + scaling, .batch = b});
    return queued(p, b);
}

/* Queue the labels of `rows` one-hot rows of `classes` values of type `kind` (RP_F32...; stored in
 * the other byte order where swap) at `offset` of fd, the first of them row `first` of the dataset:
 * each row's first maximum into out (int64), in pieces of `piece` rows. rp_wait's failure
 * RP_NOT_FINITE names the first row holding a value that is not finite. NULL: no memory, or a kind
 * it does not take. */
struct batch *rp_submit_labels(struct pool *p, int fd, long long offset, long long rows, size_t classes, int kind,
                               int swap, long long *out, long long piece, long long first)
{
    if (kind < RP_F32 || kind > RP_U64 || classes == 0 || piece < 1)
        return NULL;
    struct batch *b = new_batch(p);
    if (!b)
        return NULL;
    size_t size = label_types[kind].size;
    for (long long at = 0; at < rows; at += piece)
        enqueue(p, b, (struct piece){.fd = fd, .dst = (char *)(out + at), .n = (size_t)(rows - at < piece ? rows - at : piece),
                                      .offset = offset + at * (long long)(classes * size), .swap = swap ? size : 0,
                                      .batch = b, .kind = kind, .classes = classes, .lo = first + at,
                                      .index = first + at});
    return queued(p, b);
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
 * `block` values: bits RP_BITS_BSHUF (the Bitshuffle filter; lz4 or zstd: its codec's function) or
 * RP_BITS_BLOSC (c-blosc; either or both). 0, or -EINVAL. */
int rp_chunks_bits(struct chunks *c, int bits, size_t block, void *lz4, void *zstd)
{
    if ((bits != RP_BITS_BSHUF && bits != RP_BITS_BLOSC) || block == 0 || block % 8 || (!lz4 && !zstd)
        || (bits == RP_BITS_BSHUF && lz4 && zstd))
        return -EINVAL;
    c->bits = bits;
    c->bits_block = block;
    c->lz4 = lz4;
    c->zstd = zstd;
    return 0;
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
static struct piece chunk_job(const struct chunks *c, long long lo, long long hi, const long long *offsets,
                              const long long *sizes, const unsigned *masks, char *dst, long long j)
{
    long long first = j / c->per * c->chunk[0], end = first + c->chunk[0];
    return (struct piece){.fd = c->fd, .dst = dst, .offset = offsets[j], .spec = c, .stored = (size_t)sizes[j],
                          .lo = lo, .from = first > lo ? first : lo, .to = end < hi ? end : hi, .mask = masks[j],
                          .index = j};
}

static void chunk_range(const struct chunks *c, long long lo, long long hi, long long *begin, long long *end)
{
    *begin = lo / c->chunk[0] * c->per;
    *end = (hi + c->chunk[0] - 1) / c->chunk[0] * c->per;
}

/* Queue rows [lo, hi) of a chunked dataset into dst, a job per chunk, for rp_wait; keep_shuffled:
 * the chunks lying wholly in the read are placed still shuffled (values in the machine's order). */
struct batch *rp_submit_chunks(struct pool *p, const struct chunks *c, long long lo, long long hi,
                               const long long *offsets, const long long *sizes, const unsigned *masks, char *dst,
                               int keep_shuffled)
{
    struct batch *b = new_batch(p);
    if (!b)
        return NULL;
    long long j, end;
    for (chunk_range(c, lo, hi, &j, &end); j < end; j++) {
        struct piece job = chunk_job(c, lo, hi, offsets, sizes, masks, dst, j);
        job.batch = b;
        job.keep_shuffled = keep_shuffled;
        enqueue(p, b, job);
    }
    return queued(p, b);
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

/* Wait for a ticket's pieces, free it, and say how the read went: 0, RP_EOF, RP_DAMAGED (a chunk
 * that does not decode), RP_SIZE (one that decodes to another size), RP_CHECKSUM, or -errno;
 * *where: the lowest chunk that failed. */
int rp_wait(struct pool *p, struct batch *b, long long *where)
{
    pthread_mutex_lock(&p->lock);
    while (b->pending)
        pthread_cond_wait(&b->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    int status = b->status;
    if (where)
        *where = b->where;
    pthread_cond_destroy(&b->done);
    free(b);
    return status;
}

long long rp_busy_ns(struct pool *p)
{
    pthread_mutex_lock(&p->lock);
    long long ns = p->busy_ns;
    pthread_mutex_unlock(&p->lock);
    return ns;
}

/* LZF (h5py's filter 32000), decoded here so lzf chunks take the parallel chunk path instead of
 * h5py's serial one. The format, from liblzf: a control byte c; c < 32: c + 1 literal bytes
 * follow; else a back reference of length c >> 5 (7: plus the next byte) + 2, at distance
 * ((c & 31) << 8) + the next byte + 1 behind the output. Returns the bytes written, or -1 where
 * the input is damaged (a run past either end, a reference before the start). */
static long long rp_lzf_decompress(const unsigned char *in, size_t in_len, unsigned char *out, size_t out_len)
{
    const unsigned char *ip = in, *in_end = in + in_len;
    unsigned char *op = out, *out_end = out + out_len;
    while (ip < in_end) {
        size_t c = *ip++;
        if (c < 32) {
            c++;
            if ((size_t)(in_end - ip) < c || (size_t)(out_end - op) < c)
                return -1;
            if (in_end - ip >= 32 && out_end - op >= 32)
                memcpy(op, ip, 32); /* a fixed size: two vector moves, not a call; the excess is overwritten */
            else
                memcpy(op, ip, c);
            op += c;
            ip += c;
            continue;
        }
        size_t len = c >> 5;
        if (len == 7) {
            if (ip >= in_end)
                return -1;
            len += *ip++;
        }
        if (ip >= in_end)
            return -1;
        size_t back = ((c & 31) << 8) + *ip++ + 1;
        len += 2;
        if (back > (size_t)(op - out) || (size_t)(out_end - op) < len)
            return -1;
        const unsigned char *ref = op - back;
        if (back == 1) /* a run of one byte: zeros of blank pixels */
            memset(op, *ref, len);
        else if (back >= 16 && (size_t)(out_end - op) >= len + 32) {
            /* blocks of 16 never read unwritten bytes; most references are short: two blocks, no loop */
            memcpy(op, ref, 16);
            memcpy(op + 16, ref + 16, 16);
            for (size_t done = 32; done < len; done += 16)
                memcpy(op + done, ref + done, 16);
        } else /* a repeating run: whole periods of `back` bytes, each copied from what is written */
            for (size_t done = 0, n; done < len; done += n) {
                n = len - done < back ? len - done : back;
                memcpy(op + done, ref + done, n);
            }
        op += len;
    }
    return op - out;
}

/* Undo HDF5's shuffle filter: byte b of value i was stored at b * n + i; with swap, the values
 * were stored in the other byte order, so byte b comes from plane size - 1 - b. */
static void rp_unshuffle(const unsigned char *src, unsigned char *dst, size_t n, size_t size, int swap)
{
    if (size == 4) { /* float32, the usual case */
        const unsigned char *p0 = src + (swap ? 3 : 0) * n, *p1 = src + (swap ? 2 : 1) * n,
                            *p2 = src + (swap ? 1 : 2) * n, *p3 = src + (swap ? 0 : 3) * n;
        size_t i = 0;
#ifdef __SSE2__ /* 16 values at a time: a 4 x 16 byte transpose by interleaving (0.6 -> 0.2 ms a 3 MB chunk) */
        for (; i + 16 <= n; i += 16) {
            __m128i b0 = _mm_loadu_si128((const __m128i *)(p0 + i)), b1 = _mm_loadu_si128((const __m128i *)(p1 + i)),
                    b2 = _mm_loadu_si128((const __m128i *)(p2 + i)), b3 = _mm_loadu_si128((const __m128i *)(p3 + i));
            __m128i lo01 = _mm_unpacklo_epi8(b0, b1), hi01 = _mm_unpackhi_epi8(b0, b1),
                    lo23 = _mm_unpacklo_epi8(b2, b3), hi23 = _mm_unpackhi_epi8(b2, b3);
            __m128i *out = (__m128i *)(dst + 4 * i);
            _mm_storeu_si128(out, _mm_unpacklo_epi16(lo01, lo23));
            _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(lo01, lo23));
            _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(hi01, hi23));
            _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(hi01, hi23));
        }
#endif
        for (; i < n; i++) {
            dst[4 * i] = p0[i];
            dst[4 * i + 1] = p1[i];
            dst[4 * i + 2] = p2[i];
            dst[4 * i + 3] = p3[i];
        }
        return;
    }
    for (size_t b = 0; b < size; b++) {
        const unsigned char *plane = src + (swap ? size - 1 - b : b) * n;
        for (size_t i = 0; i < n; i++)
            dst[i * size + b] = plane[i];
    }
}

/* Values of `size` bytes (n bytes of them) reversed in place: the other byte order to this one.
 * With SSE2, 16 bytes at a time: bytes swapped within 16-bit words, then the words reversed within
 * each value (H100 host, 1M big-endian float32 images: 5.6M images/s with a scalar loop). */
static void rp_byteswap(unsigned char *p, size_t n, size_t size)
{
    size_t i = 0;
#ifdef __SSE2__
    if (size == 2 || size == 4 || size == 8)
        for (; i + 16 <= n; i += 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
            v = _mm_or_si128(_mm_slli_epi16(v, 8), _mm_srli_epi16(v, 8));
            if (size == 4)
                v = _mm_shufflehi_epi16(_mm_shufflelo_epi16(v, 0xB1), 0xB1);
            else if (size == 8)
                v = _mm_shufflehi_epi16(_mm_shufflelo_epi16(v, 0x1B), 0x1B);
            _mm_storeu_si128((__m128i *)(p + i), v);
        }
#endif
    for (; i + size <= n; i += size)
        for (size_t a = i, b = i + size - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

/* HDF5's fletcher32 filter checksum (H5_checksum_fletcher32): 16-bit big-endian words, sums
 * folded every 360 words; an odd last byte is the high half of a word. A block of n words w_i adds
 * sum w_i to sum1 and n * sum1 + sum (n - i) w_i to sum2 (both below 2^32 for n <= 360, and HDF5's
 * uint32 arithmetic wraps as ours does), so the words can be summed independently: with SSE2,
 * 0.5 ms a 3 MB chunk against 1.6 word by word here. */
/* n values of `size` bytes bitshuffled as the filters store them: blocks of `block` values (each
 * value's bit b of every value in a row, value i at bit i % 8 of byte i / 8), then a shorter block
 * of the values left, down to a multiple of 8 (exact_tail: only where they are one), then the
 * values after it as they are. Bit by bit: only for the rare chunk stored otherwise. */
static void rp_bitshuffle(const unsigned char *src, unsigned char *dst, size_t n, size_t size, size_t block,
                          int exact_tail)
{
    size_t full = n / block * block, rest = n - full;
    size_t shuffled = full + (exact_tail ? (rest % 8 ? 0 : rest) : rest - rest % 8);
    memset(dst, 0, shuffled * size);
    for (size_t s = 0; s < shuffled; s += block) {
        size_t len = shuffled - s < block ? shuffled - s : block, row = len / 8;
        for (size_t i = 0; i < len; i++)
            for (size_t b = 0; b < 8 * size; b++)
                if (src[(s + i) * size + b / 8] >> (b % 8) & 1)
                    dst[s * size + b * row + i / 8] |= (unsigned char)(1u << (i % 8));
    }
    memcpy(dst + shuffled * size, src + shuffled * size, (n - shuffled) * size);
}

static unsigned int rp_fletcher32(const unsigned char *data, size_t nbytes)
{
    unsigned int sum1 = 0, sum2 = 0;
    for (size_t words = nbytes / 2; words;) {
        unsigned int run = words > 360 ? 360 : (unsigned int)words, a = 0, b = 0, i = 0;
        words -= run;
#ifdef __SSE2__ /* 8 words at a time, high and low bytes apart: a word's weight times a byte fits madd's int16 */
        __m128i weight = _mm_sub_epi16(_mm_set1_epi16((short)run), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
        __m128i sums = _mm_setzero_si128(), bhi = sums, blo = sums, low = _mm_set1_epi16(0xff);
        for (; i + 8 <= run; i += 8) {
            __m128i v = _mm_loadu_si128((const __m128i *)(data + 2 * i));
            __m128i hi = _mm_and_si128(v, low), lo = _mm_srli_epi16(v, 8); /* data[2i], data[2i + 1] */
            sums = _mm_add_epi64(sums, _mm_add_epi64(_mm_slli_epi64(_mm_sad_epu8(hi, _mm_setzero_si128()), 8),
                                                     _mm_sad_epu8(lo, _mm_setzero_si128())));
            bhi = _mm_add_epi32(bhi, _mm_madd_epi16(hi, weight));
            blo = _mm_add_epi32(blo, _mm_madd_epi16(lo, weight));
            weight = _mm_sub_epi16(weight, _mm_set1_epi16(8));
        }
        unsigned int lanes[4], halves[4];
        _mm_storeu_si128((__m128i *)lanes, _mm_add_epi32(_mm_slli_epi32(bhi, 8), blo));
        _mm_storeu_si128((__m128i *)halves, sums);
        a = halves[0] + halves[2];
        b = lanes[0] + lanes[1] + lanes[2] + lanes[3];
#endif
        for (; i < run; i++) {
            unsigned int w = (unsigned int)data[2 * i] << 8 | data[2 * i + 1];
            a += w;
            b += (run - i) * w;
        }
        data += 2 * run;
        sum2 += run * sum1 + b;
        sum1 += a;
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    if (nbytes % 2) {
        sum1 += (unsigned int)data[0] << 8;
        sum2 += sum1;
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    return sum2 << 16 | sum1;
}
