/* A pool of native threads reading file bytes into memory with pread: the reader's fast path for
 * contiguous datasets. Python threads reading with os.preadv must take the interpreter lock back
 * after every call, and with the consumer thread busy launching kernels they wait for it: 16 such
 * threads read 10 GB/s where 16 of these read 50 (the reader probe of a880820). One Python call
 * queues a whole block (rp_submit, pieces spread over the threads) and one waits for it (rp_wait),
 * both through ctypes, which releases the interpreter lock for the wait.
 * Chunked datasets (chunks.c), float32 read as 8-bit codes (codes.c) and labels (labels.c) are jobs
 * of the same threads; read_pool.h lists the files. */
#include "read_pool.h"

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

struct local *thread_local_state(void)
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
int read_fully(int fd, char *dst, size_t n, long long offset)
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
unsigned char *grow(struct scratch *s, size_t n)
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

/* A chunk's stored bytes read as they are (for the GPU to decode), its fletcher32 checksum, in the
 * last 4 of them, checked a cache-sized step at a time while the step is still in this core's cache:
 * no copy of the chunk, no second pass over it. */
static int read_summed(const struct piece *job)
{
    if (job->n < 4)
        return RP_CHECKSUM;
    const size_t payload = job->n - 4;
    unsigned char *dst = (unsigned char *)job->dst;
    struct fletcher f = {0, 0};
    for (size_t at = 0; at < job->n; at += FLETCHER_STEP) {
        size_t n = job->n - at < FLETCHER_STEP ? job->n - at : FLETCHER_STEP;
        int status = read_fully(job->fd, (char *)dst + at, n, job->offset + (long long)at);
        if (status)
            return status;
        if (at < payload)
            fletcher32_add(&f, dst + at, payload - at < n ? payload - at : n);
    }
    return checksum_is(fletcher32_end(&f), dst + payload) ? 0 : RP_CHECKSUM;
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
                     : job.codes ? read_codes(&job) : job.summed ? read_summed(&job)
                     : read_fully(job.fd, job.dst, job.n, job.offset);
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

/* Queue the reads of n chunks as they are stored, chunk i's sizes[i] bytes at offsets[i] of fd into
 * dst + positions[i], a job a chunk, each chunk's fletcher32 (its last 4 bytes) checked as it is
 * read: rp_wait's failure RP_CHECKSUM names the lowest chunk (first + i) failing it. The ticket for
 * rp_wait, or NULL where memory ran out. */
struct batch *rp_submit_summed(struct pool *p, int fd, char *dst, long long n, const long long *offsets,
                               const long long *sizes, const long long *positions, long long first)
{
    struct batch *b = new_batch(p);
    if (!b)
        return NULL;
    for (long long i = 0; i < n; i++)
        enqueue(p, b, (struct piece){.fd = fd, .dst = dst + positions[i], .n = (size_t)sizes[i], .offset = offsets[i],
                                      .summed = 1, .index = first + i, .batch = b});
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
    size_t size = label_size(kind);
    for (long long at = 0; at < rows; at += piece)
        enqueue(p, b, (struct piece){.fd = fd, .dst = (char *)(out + at), .n = (size_t)(rows - at < piece ? rows - at : piece),
                                      .offset = offset + at * (long long)(classes * size), .swap = swap ? size : 0,
                                      .batch = b, .kind = kind, .classes = classes, .lo = first + at,
                                      .index = first + at});
    return queued(p, b);
}
/* Queue rows [lo, hi) of a chunked dataset into dst, a job per chunk, for rp_wait; keep_shuffled:
 * the chunks lying wholly in the read are placed still shuffled (values in the machine's order);
 * codes: 1 + a scaling (rp_pack_codes), float32 values packed to their 8-bit codes into dst (a
 * quarter of the bytes): chunks of whole images stored without a codec or shuffle, or chunks cutting
 * images (see decode_chunk), else 0. */
struct batch *rp_submit_chunks(struct pool *p, const struct chunks *c, long long lo, long long hi,
                               const long long *offsets, const long long *sizes, const unsigned *masks, char *dst,
                               int keep_shuffled, int codes)
{
    struct batch *b = new_batch(p);
    if (!b)
        return NULL;
    long long j, end;
    for (chunk_range(c, lo, hi, &j, &end); j < end; j++) {
        struct piece job = chunk_job(c, lo, hi, offsets, sizes, masks, dst, j);
        job.batch = b;
        job.keep_shuffled = keep_shuffled;
        job.codes = codes;
        enqueue(p, b, job);
    }
    return queued(p, b);
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
