/* One pass over a float32 or float64 buffer for the explorer's exact statistics: mean, the sum of
 * squared deviations (m2), min, max and the count of exact zeros. torch needs four or five
 * passes for the same (sum, aminmax, norm, a zero count), each reading the whole tensor again;
 * a logged training step measures tens of millions of values, so the passes are its main cost.
 *
 * Only the common case is handled here: every value finite. When a NaN or an infinity is met
 * (the sums or extremes stop being finite) the result is None and the caller takes torch's
 * careful path, which counts them. Written with GCC/clang vector extensions, so the compiler
 * emits SSE, AVX2 (chosen at run time on x86-64) or NEON; built as an optional extension: without
 * a C compiler the package falls back to torch's passes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

/* AVX2 and baseline copies of the pass, chosen when the library loads (an ifunc: glibc only) */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__GLIBC__)
#define WIDE_VARIANTS __attribute__((target_clones("avx2", "default")))
#else
#define WIDE_VARIANTS
#endif

/* Partial sums are kept in the values' own type over BLOCK values (BLOCK / 16 per lane for
 * float32), then added in double: the vectors stay full width, and the error stays that of a
 * short sum. */
#define BLOCK 512

typedef struct {
    double sum; /* of (x - shift) */
    double sq;  /* of (x - shift)^2 */
    double lo, hi;
    int64_t zeros;
} Moments;

typedef float vf32 __attribute__((vector_size(32)));
typedef int32_t vi32 __attribute__((vector_size(32)));
typedef double vf64 __attribute__((vector_size(32)));
typedef int64_t vi64 __attribute__((vector_size(32)));

/* Select by mask without the vector ternary, which C (unlike C++) lacks. */
#define PICK(mask, a, b, fv, iv) ((fv)(((mask) & (iv)(a)) | (~(mask) & (iv)(b))))

/* The pass, defined once for each element type T: V and M are its vector and mask types (W
 * lanes). Two vectors per iteration keep two independent chains of additions in flight; the
 * partial sums are added into double every BLOCK values. With y, each value is x[i] - y[i],
 * rounded in T as a subtraction of two T tensors would round it. */
#define DEFINE_MOMENTS(NAME, T, V, M, W)                                                          \
    WIDE_VARIANTS                                                                                 \
    static void NAME(const T *x, const T *y, int64_t n, T shift, Moments *out) {                  \
        V zero = {0}, k = zero + shift, lo = zero + INFINITY, hi = zero - INFINITY;               \
        double sum = 0, sq = 0, l = INFINITY, h = -INFINITY;                                      \
        int64_t zeros = 0, i = 0, whole = n - n % (2 * W);                                        \
        while (i < whole) {                                                                       \
            int64_t end = i + BLOCK < whole ? i + BLOCK : whole;                                  \
            V s0 = zero, s1 = zero, q0 = zero, q1 = zero;                                         \
            M z = {0};                                                                            \
            for (; i < end; i += 2 * W) {                                                         \
                V a, b;                                                                           \
                __builtin_memcpy(&a, x + i, sizeof a);                                            \
                __builtin_memcpy(&b, x + i + W, sizeof b);                                        \
                if (y) { /* the same for the whole loop: the compiler moves it out */             \
                    V c, d;                                                                       \
                    __builtin_memcpy(&c, y + i, sizeof c);                                        \
                    __builtin_memcpy(&d, y + i + W, sizeof d);                                    \
                    a -= c, b -= d;                                                               \
                }                                                                                 \
                lo = PICK(a < lo, a, lo, V, M);                                                   \
                lo = PICK(b < lo, b, lo, V, M);                                                   \
                hi = PICK(a > hi, a, hi, V, M);                                                   \
                hi = PICK(b > hi, b, hi, V, M);                                                   \
                z -= (a == zero); /* a true comparison is -1 */                                   \
                z -= (b == zero);                                                                 \
                V da = a - k, db = b - k;                                                         \
                s0 += da, s1 += db;                                                               \
                q0 += da * da, q1 += db * db;                                                     \
            }                                                                                     \
            for (int j = 0; j < W; j++)                                                           \
                sum += s0[j] + s1[j], sq += q0[j] + q1[j], zeros += z[j];                         \
        }                                                                                         \
        for (int j = 0; j < W; j++) {                                                             \
            l = lo[j] < l ? lo[j] : l;                                                            \
            h = hi[j] > h ? hi[j] : h;                                                            \
        }                                                                                         \
        for (; i < n; i++) {                                                                      \
            T v = y ? x[i] - y[i] : x[i];                                                         \
            double d = (double)v - shift;                                                         \
            sum += d, sq += d * d, zeros += v == 0;                                               \
            l = v < l ? v : l;                                                                    \
            h = v > h ? v : h;                                                                    \
        }                                                                                         \
        *out = (Moments){sum, sq, l, h, zeros};                                                   \
    }

DEFINE_MOMENTS(moments32, float, vf32, vi32, 8)
DEFINE_MOMENTS(moments64, double, vf64, vi64, 4)

static void moments(const void *x, const void *y, int64_t n, int wide, double shift, Moments *out) {
    if (wide)
        moments64((const double *)x, (const double *)y, n, shift, out);
    else
        moments32((const float *)x, (const float *)y, n, (float)shift, out);
}

/* finite_moments(address, n, wide, minus=0) -> (mean, m2, min, max, zeros) of the values, or of
 * their differences from those at ``minus`` (an optimizer's update, from the parameters before
 * and after it, never written out); None when a value is not finite. The values are shifted by
 * the first one (close to the mean in most tensors), and measured again about the mean when the
 * spread is small next to it (cancellation). */
static PyObject *finite_moments(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *names[] = {"address", "n", "wide", "minus", NULL};
    unsigned long long address, minus = 0;
    long long n;
    int wide;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KLp|K", names, &address, &n, &wide, &minus))
        return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "finite_moments needs at least one value");
        return NULL;
    }
    const void *x = (const void *)(uintptr_t)address, *y = (const void *)(uintptr_t)minus;
    double shift; /* the first value, or difference rounded as the subtraction rounds it */
    if (wide)
        shift = ((const double *)x)[0] - (y ? ((const double *)y)[0] : 0.0);
    else
        shift = ((const float *)x)[0] - (y ? ((const float *)y)[0] : 0.0f);
    if (!isfinite(shift))
        Py_RETURN_NONE;
    Moments m;
    double mean, m2;
    Py_BEGIN_ALLOW_THREADS;
    moments(x, y, n, wide, shift, &m);
    mean = shift + m.sum / n;
    m2 = m.sq - m.sum * (m.sum / n);
    if (isfinite(m.sq) && isfinite(m.sum) && m.sum != 0 && !(m2 > 1e-3 * m.sq)) {
        double lo = m.lo, hi = m.hi;
        int64_t zeros = m.zeros;
        moments(x, y, n, wide, mean, &m); /* about the mean: the deviations themselves */
        mean += m.sum / n;
        m2 = m.sq - m.sum * (m.sum / n);
        m.lo = lo, m.hi = hi, m.zeros = zeros;
    }
    Py_END_ALLOW_THREADS;
    if (!isfinite(m.sq) || !isfinite(m.sum) || !isfinite(m.lo) || !isfinite(m.hi))
        Py_RETURN_NONE;
    return Py_BuildValue("(ddddL)", mean, m2 > 0 ? m2 : 0.0, m.lo, m.hi, (long long)m.zeros);
}

/* draw(address, n, wide, minus, out, k, state) -> state: k values picked uniformly at random
 * (with replacement) among the n at address (less those at minus if nonzero), written as float32
 * at out. The positions come from a SplitMix64 stream whose state the caller keeps, so a sampler
 * draws the same positions for the same training; the multiply-shift maps 64 random bits onto
 * [0, n) with a bias below n / 2^64. One call costs less than the torch operations it replaces
 * (randint, index_select, a conversion), which dominate for a sample of a hundred values. */
static PyObject *draw(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *names[] = {"address", "n", "wide", "minus", "out", "k", "state", NULL};
    unsigned long long address, minus, out, state;
    long long n, k;
    int wide;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KLpKKLK", names, &address, &n, &wide, &minus, &out, &k, &state))
        return NULL;
    if (n <= 0 || k < 0) {
        PyErr_SetString(PyExc_ValueError, "draw needs at least one value and a count of zero or more");
        return NULL;
    }
    float *dest = (float *)(uintptr_t)out;
    uint64_t s = state;
    for (long long j = 0; j < k; j++) {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
#ifdef __SIZEOF_INT128__
        uint64_t i = (uint64_t)(((unsigned __int128)z * (uint64_t)n) >> 64);
#else
        uint64_t i = z % (uint64_t)n;
#endif
        if (wide) {
            const double *x = (const double *)(uintptr_t)address, *y = (const double *)(uintptr_t)minus;
            dest[j] = (float)(y ? x[i] - y[i] : x[i]);
        } else {
            const float *x = (const float *)(uintptr_t)address, *y = (const float *)(uintptr_t)minus;
            dest[j] = y ? x[i] - y[i] : x[i];
        }
    }
    return PyLong_FromUnsignedLongLong(s);
}

static PyMethodDef methods[] = {
    {"finite_moments", (PyCFunction)(void (*)(void))finite_moments, METH_VARARGS | METH_KEYWORDS,
     "finite_moments(address, n, wide, minus=0) -> (mean, m2, min, max, zeros) of n float32 "
     "(float64 if wide) values at address, less those at minus if given; None if one is not finite."},
    {"draw", (PyCFunction)(void (*)(void))draw, METH_VARARGS | METH_KEYWORDS,
     "draw(address, n, wide, minus, out, k, state) -> state: k of the n values at address (less "
     "those at minus if nonzero), picked at random with replacement, written as float32 at out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fused(void) { return PyModule_Create(&module); }
