/* The label of each row of a labels dataset: the index of the row's first largest value (NumPy's
 * argmax), for float32 and float64 rows, with their values checked finite in the same pass.
 * NumPy's argmax over rows of 10 costs ~35 ns a row (a call per row), host time that two GPUs'
 * streamed runs compete for (labels: 44.2 ms against 41.0 without, 2 H200s, 1M uint8 images);
 * this loop costs a few ns a row and, called through ctypes, runs without the interpreter lock.
 * Built into the native library with read_pool.c (native.py). */
#include <math.h>

/* labels[r] = the first index of row r's largest value, for rows [0, rows) of `cols` values;
 * returns -1, or the first row holding a value that is not finite (labels from it on unset). */
#define FIRST_MAX(name, type)                                                      \
    long long name(const type *y, long long rows, int cols, long long *labels)     \
    {                                                                              \
        for (long long r = 0; r < rows; r++) {                                     \
            const type *row = y + r * cols;                                        \
            type top = row[0];                                                     \
            int best = 0, finite = isfinite(top);                                  \
            for (int c = 1; c < cols; c++) {                                       \
                type v = row[c];                                                   \
                finite &= isfinite(v);                                             \
                best = v > top ? c : best;                                         \
                top = v > top ? v : top;                                           \
            }                                                                      \
            if (!finite)                                                           \
                return r;                                                          \
            labels[r] = best;                                                      \
        }                                                                          \
        return -1;                                                                 \
    }

FIRST_MAX(first_max_f32, float)
FIRST_MAX(first_max_f64, double)
