/* A pool of native threads reading file bytes into memory with pread: the reader's fast path for
 * contiguous datasets. Python threads reading with os.preadv must take the interpreter lock back
 * after every call, and with the consumer thread busy launching kernels they wait for it: 16 such
 * threads read 10 GB/s where 16 of these read 50 (tools/device_reader_probe.py). One Python call
 * queues a whole block (rp_submit, pieces spread over the threads) and one waits for it (rp_wait),
 * both through ctypes, which releases the interpreter lock for the wait. Also the chunk path's LZF
 * decoder, shuffle undoer and fletcher32 checksum (rp_lzf_decompress, rp_unshuffle, rp_fletcher32, at
 * the end).
 * Built by infer/native.py with the C compiler, cached on disk; without one, Python threads read. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct batch {                     /* one rp_submit: its pieces still to read, and how they went */
    int pending;
    int status;                    /* 0, RP_EOF where the file ended early, else -errno */
    pthread_cond_t done;
};

struct piece {
    int fd;
    char *dst;
    size_t n;
    long long offset;
    struct batch *batch;
};

struct pool {
    pthread_mutex_t lock;
    pthread_cond_t work;
    struct piece *queue;           /* a ring: count pieces from head, capacity cap */
    size_t head, count, cap;
    int stop, threads;
    pthread_t *ids;
    long long busy_ns;             /* the threads' time in pread, summed */
};

enum { RP_EOF = 1 };

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

static void *worker(void *arg)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->count && !p->stop)
            pthread_cond_wait(&p->work, &p->lock);
        if (!p->count)
            break;
        struct piece job = p->queue[p->head];
        p->head = (p->head + 1) % p->cap;
        p->count--;
        pthread_mutex_unlock(&p->lock);
        long long t = now_ns();
        int status = read_fully(job.fd, job.dst, job.n, job.offset);
        t = now_ns() - t;
        pthread_mutex_lock(&p->lock);
        p->busy_ns += t;
        if (status && !job.batch->status)
            job.batch->status = status;
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
    free(p->queue);
    free(p->ids);
    free(p);
}

/* A pool of `threads` threads, or NULL if they cannot be had. */
struct pool *rp_create(int threads)
{
    struct pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->cap = 64;
    p->queue = malloc(p->cap * sizeof *p->queue);
    p->ids = calloc((size_t)threads, sizeof *p->ids);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    if (!p->queue || !p->ids) {
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
    if (p->count == p->cap) {
        struct piece *q = malloc(2 * p->cap * sizeof *q);
        if (!q)
            return -ENOMEM;
        for (size_t i = 0; i < p->count; i++)
            q[i] = p->queue[(p->head + i) % p->cap];
        free(p->queue);
        p->queue = q;
        p->head = 0;
        p->cap *= 2;
    }
    p->queue[(p->head + p->count++) % p->cap] = job;
    return 0;
}

/* Queue the read of n bytes at `offset` of fd into dst, in pieces of at most `piece` bytes; the
 * ticket for rp_wait, or NULL where memory ran out. */
struct batch *rp_submit(struct pool *p, int fd, char *dst, size_t n, long long offset, size_t piece)
{
    struct batch *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    pthread_cond_init(&b->done, NULL);
    if (piece == 0)
        piece = n ? n : 1;
    pthread_mutex_lock(&p->lock);
    b->pending = 1;                /* held until every piece is queued */
    for (size_t at = 0; at < n; at += piece) {
        struct piece job = {fd, dst + at, n - at < piece ? n - at : piece, offset + (long long)at, b};
        if (push(p, job)) {
            b->status = -ENOMEM;
            break;
        }
        b->pending++;
    }
    b->pending--;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    return b;
}

/* Wait for a ticket's pieces, free it, and say how the read went: 0, RP_EOF, or -errno. */
int rp_wait(struct pool *p, struct batch *b)
{
    pthread_mutex_lock(&p->lock);
    while (b->pending)
        pthread_cond_wait(&b->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    int status = b->status;
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
long long rp_lzf_decompress(const unsigned char *in, size_t in_len, unsigned char *out, size_t out_len)
{
    const unsigned char *ip = in, *in_end = in + in_len;
    unsigned char *op = out, *out_end = out + out_len;
    while (ip < in_end) {
        size_t c = *ip++;
        if (c < 32) {
            c++;
            if ((size_t)(in_end - ip) < c || (size_t)(out_end - op) < c)
                return -1;
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
        else /* a repeating run: whole periods of `back` bytes, each copied from what is written */
            for (size_t done = 0, n; done < len; done += n) {
                n = len - done < back ? len - done : back;
                memcpy(op + done, ref + done, n);
            }
        op += len;
    }
    return op - out;
}

/* Undo HDF5's shuffle filter: byte b of value i was stored at b * n + i. */
void rp_unshuffle(const unsigned char *src, unsigned char *dst, size_t n, size_t size)
{
    if (size == 4) { /* float32, the usual case: a loop the compiler unrolls */
        for (size_t i = 0; i < n; i++) {
            dst[4 * i] = src[i];
            dst[4 * i + 1] = src[n + i];
            dst[4 * i + 2] = src[2 * n + i];
            dst[4 * i + 3] = src[3 * n + i];
        }
        return;
    }
    for (size_t b = 0; b < size; b++)
        for (size_t i = 0; i < n; i++)
            dst[i * size + b] = src[b * n + i];
}

/* HDF5's fletcher32 filter checksum (H5_checksum_fletcher32): 16-bit big-endian words, sums
 * folded every 360 words; an odd last byte is the high half of a word. */
unsigned int rp_fletcher32(const unsigned char *data, size_t nbytes)
{
    unsigned int sum1 = 0, sum2 = 0;
    for (size_t words = nbytes / 2; words;) {
        size_t run = words > 360 ? 360 : words;
        words -= run;
        for (; run; run--, data += 2) {
            sum1 += (unsigned int)data[0] << 8 | data[1];
            sum2 += sum1;
        }
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
