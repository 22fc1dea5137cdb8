/* What the read pool's files share (infer/data/read_pool/, built into one library by
 * infer/data/native.py with the C compiler, cached on disk; without one, Python threads read):
 *   pool.c     the threads, their queues and tickets, plain and byte-swapped reads
 *   chunks.c   chunked datasets: each chunk read, checked, decoded and placed
 *   filters.c  LZF, shuffle, bitshuffle, fletcher32 and byte order, byte for byte
 *   codes.c    float32 values read as their 8-bit codes
 *   labels.c   one-hot labels read as each row's first maximum
 * What one file gives another is hidden from the library's exports (RP_HIDDEN); the rp_ functions
 * Python calls through ctypes are exported. */
#ifndef READ_POOL_H
#define READ_POOL_H

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
    int bits;                      /* RP_BITS_BSHUF, RP_BITS_BLOSC, RP_BITS_BLOSC2: a whole chunk kept shuffled stays
                                      bitshuffled; RP_BYTES_BLOSC: byte-shuffled, a c-blosc block at a time */
    size_t bits_block;             /* values per (bit- or byte-) shuffled block (the last may be shorter) */
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
    int summed;                    /* a plain read of a chunk's stored bytes, its fletcher32 (the last 4) checked */
    int kind;                      /* labels: the values' type (RP_F32...), n rows of `classes` into dst */
    size_t classes;
};

enum { RP_EOF = 1, RP_DAMAGED, RP_SIZE, RP_CHECKSUM, RP_NOT_FINITE, RP_NOT_CODES };  /* rp_wait's failures besides -errno */
enum { RP_F32 = 1, RP_F64, RP_I8, RP_U8, RP_I16, RP_U16, RP_I32, RP_U32, RP_I64, RP_U64 };  /* label value types */
enum { RP_RAW, RP_DEFLATE, RP_LZF, RP_PLUGIN, RP_ZSTD, RP_LZ4, RP_BLOSC, RP_BLOSC2 };
/* rp_chunks_bits: the Bitshuffle filter's chunks, c-blosc's, Blosc2's bitshuffled; c-blosc's byte-shuffled */
enum { RP_BITS_BSHUF = 1, RP_BITS_BLOSC = 2, RP_BITS_BLOSC2 = 3, RP_BYTES_BLOSC = 4 };
enum { RP_OTHER_LAYOUT = 100 };  /* direct_decode: a chunk the codec's function cannot place, for the plugin */

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

#define RP_HIDDEN __attribute__((visibility("hidden")))

/* pool.c */
RP_HIDDEN struct local *thread_local_state(void);
RP_HIDDEN int read_fully(int fd, char *dst, size_t n, long long offset);
RP_HIDDEN unsigned char *grow(struct scratch *s, size_t n);

/* chunks.c */
RP_HIDDEN int decode_chunk(const struct piece *job);
RP_HIDDEN struct piece chunk_job(const struct chunks *c, long long lo, long long hi, const long long *offsets,
                                 const long long *sizes, const unsigned *masks, char *dst, long long j);
RP_HIDDEN int checksum_is(unsigned int sum, const unsigned char *sum4);
RP_HIDDEN void chunk_range(const struct chunks *c, long long lo, long long hi, long long *begin, long long *end);

/* filters.c */
RP_HIDDEN long long rp_lzf_decompress(const unsigned char *in, size_t in_len, unsigned char *out, size_t out_len);
RP_HIDDEN void rp_unshuffle(const unsigned char *src, unsigned char *dst, size_t n, size_t size, int swap);
RP_HIDDEN void rp_byteswap(unsigned char *p, size_t n, size_t size);
RP_HIDDEN void rp_blosc_shuffle(const unsigned char *src, unsigned char *dst, size_t n, size_t size, size_t block);
RP_HIDDEN void rp_bitshuffle(const unsigned char *src, unsigned char *dst, size_t n, size_t size, size_t block,
                             int exact_tail);
RP_HIDDEN unsigned int rp_fletcher32(const unsigned char *data, size_t nbytes);
/* The same over bytes given in steps: each step but the last a multiple of FLETCHER_RUN, 720 bytes
 * (whole runs of 360 words, so the sums fold where one pass over all the bytes folds them). */
struct fletcher {
    unsigned int sum1, sum2;
};
#define FLETCHER_RUN 720
#define FLETCHER_STEP (364 * FLETCHER_RUN)  /* a chunk's bytes summed (and packed) a step at a time: 262,080, in cache */
RP_HIDDEN void fletcher32_add(struct fletcher *f, const unsigned char *data, size_t nbytes);
RP_HIDDEN unsigned int fletcher32_end(const struct fletcher *f);

/* codes.c */
RP_HIDDEN int read_codes(const struct piece *job);
RP_HIDDEN int read_chunk_codes(const struct piece *job);
int rp_pack_codes(const float *src, unsigned char *dst, size_t n, int path, int scaling);

/* labels.c */
RP_HIDDEN int label_rows(struct piece *job);
RP_HIDDEN size_t label_size(int kind);

#endif
