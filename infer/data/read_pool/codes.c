/* float32 images that are 8-bit pixels (scaled to [0, 1] as code * float32(1/255), MNIST's own
 * conversion, or code / 255, torchvision's and Keras's, or not at all) can be read as their 8-bit codes
 * (rp_submit_codes from contiguous datasets, read_chunk_codes from chunks of whole images stored
 * without a codec or shuffle; chunks.c's scatter packs chunks cutting images once decoded): each
 * cache-sized step read into a buffer of the thread's own and every value checked to be exactly a
 * code's as it is packed, so a GPU uploads a quarter of the bytes and rebuilds the same floats; a
 * value that is not fails the read (RP_NOT_CODES) and the caller reads float32. */
#include "read_pool.h"

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
int read_codes(const struct piece *job)
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

/* A chunk of float32 values stored without a codec (with a fletcher32 checksum or not) whose rows
 * the read takes as codes: read a step at a time into this thread's buffer, summed there where it
 * carries a checksum, and the read's rows of the step packed to their codes into dst. A damaged
 * checksum first, then a chunk of another size, then a value that is no code (RP_NOT_CODES: the
 * caller reads float32 instead, which names any damage). */
int read_chunk_codes(const struct piece *job)
{
    const struct chunks *c = job->spec;
    const size_t step = FLETCHER_STEP;  /* whole runs of the sums, and of float32 values */
    struct local *l = thread_local_state();
    unsigned char *buf = l ? grow(&l->plain, step) : NULL;
    if (!buf)
        return -ENOMEM;
    if (c->summed && job->stored < 4)
        return RP_CHECKSUM;
    long long first = job->index / c->per * c->chunk[0];
    size_t payload = job->stored - (c->summed ? 4 : 0);
    size_t lo = (size_t)(job->from - first) * c->row_bytes, hi = (size_t)(job->to - first) * c->row_bytes;
    unsigned char *dst = (unsigned char *)job->dst + (size_t)(job->from - job->lo) * c->row_bytes / 4;
    struct fletcher f = {0, 0};
    int codes = 1;
    size_t end = c->summed ? payload : (hi < payload ? hi : payload);  /* unsummed: only the rows read */
    for (size_t at = c->summed ? 0 : lo; at < end; at += step) {
        size_t n = end - at < step ? end - at : step;
        int status = read_fully(c->fd, (char *)buf, n, job->offset + (long long)at);
        if (status)
            return status;
        if (c->summed)
            fletcher32_add(&f, buf, n);
        size_t a = at > lo ? at : lo, b = at + n < hi ? at + n : hi;  /* the read's bytes in this step */
        if (codes && a < b && payload == c->nbytes)
            codes = rp_pack_codes((const float *)(buf + (a - at)), dst + (a - lo) / 4, (b - a) / 4, -1, job->codes - 1) == 1;
    }
    if (c->summed) {
        unsigned char sum[4];
        int status = read_fully(c->fd, (char *)sum, 4, job->offset + (long long)payload);
        if (status)
            return status;
        if (!checksum_is(fletcher32_end(&f), sum))
            return RP_CHECKSUM;
    }
    if (payload != c->nbytes)
        return RP_SIZE;
    return codes ? 0 : RP_NOT_CODES;
}
