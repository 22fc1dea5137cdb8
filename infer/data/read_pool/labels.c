/* Labels on the pool's threads (rp_submit_labels: one-hot rows, each row's first maximum, values that are
 * not finite refused), queued behind every read: on Python's threads the reads, checks and argmax
 * took ~95 ms of CPU in a 1M-image run, much of it holding the interpreter lock the consumer waited
 * for (a 1M-image run, 65bdc40). */
#include "read_pool.h"

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
int label_rows(struct piece *job)
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

size_t label_size(int kind)
{
    return label_types[kind].size;
}
