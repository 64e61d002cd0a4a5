/* One pass over a float32 or float64 buffer for the explorer's exact statistics: mean, the sum of
 * squared deviations (m2), min, max and the count of exact zeros. torch needs four or five
 * passes for the same (sum, aminmax, norm, a zero count), each reading the whole tensor again;
 * a logged training step measures tens of millions of values, so the passes are its main cost.
 *
 * Only the common case is handled here: every value finite. When a NaN or an infinity is met
 * (the sums or extremes stop being finite) the result is None and the caller takes torch's
 * careful path, which counts them. Written with GCC/clang vector extensions, so the compiler
 * emits SSE, AVX2 (chosen at run time on x86-64) or NEON, plus an AVX-512 copy of the float32
 * pass for the CPUs that have it; built as an optional extension: without a C compiler the
 * package falls back to torch's passes. Also here: random samples of the values (``draw``), and
 * both in one call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define X86_INTRINSICS 1
#endif

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

#ifdef X86_INTRINSICS
/* The float32 pass with AVX-512 where the CPU has it: the vector extensions above cannot say
 * min, max or a mask count in C (each costs a compare and three logic operations there), so
 * this copy names the instructions. About 1.7x the AVX2 pass on values in cache, 1.3x on
 * values read from memory. Four chains of every accumulator keep the adders busy; the float
 * partial sums go into double lanes every 2048 values. */
#define CHAINS 4
/* total += v, the 16 floats widened to double (into 8 lanes) */
__attribute__((target("avx512f"))) static inline __m512d add_in_double(__m512d total, __m512 v) {
    __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    total = _mm512_add_pd(total, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    return _mm512_add_pd(total, _mm512_cvtps_pd(high));
}
__attribute__((target("avx512f"))) static void moments32_avx512(const float *x, const float *y, int64_t n, float shift,
                                                               Moments *out) {
    const __m512 k = _mm512_set1_ps(shift), zero = _mm512_setzero_ps();
    const __m512i one = _mm512_set1_epi32(1);
    __m512 lo[CHAINS], hi[CHAINS];
    for (int c = 0; c < CHAINS; c++)
        lo[c] = _mm512_set1_ps(INFINITY), hi[c] = _mm512_set1_ps(-INFINITY);
    double sum = 0, sq = 0, l = INFINITY, h = -INFINITY;
    int64_t zeros = 0, i = 0, whole = n - n % (CHAINS * 16);
    __m512d sums = _mm512_setzero_pd(), squares = _mm512_setzero_pd();
    while (i < whole) {
        int64_t end = i + 4 * BLOCK < whole ? i + 4 * BLOCK : whole; /* 32 values per lane, as above */
        __m512 s[CHAINS], q[CHAINS];
        __m512i z[CHAINS];
        for (int c = 0; c < CHAINS; c++)
            s[c] = q[c] = zero, z[c] = _mm512_setzero_si512();
        for (; i < end; i += CHAINS * 16) {
            for (int c = 0; c < CHAINS; c++) {
                __m512 a = _mm512_loadu_ps(x + i + 16 * c);
                if (y)
                    a = _mm512_sub_ps(a, _mm512_loadu_ps(y + i + 16 * c));
                lo[c] = _mm512_min_ps(lo[c], a);
                hi[c] = _mm512_max_ps(hi[c], a);
                z[c] = _mm512_mask_add_epi32(z[c], _mm512_cmp_ps_mask(a, zero, _CMP_EQ_OQ), z[c], one);
                __m512 d = _mm512_sub_ps(a, k);
                s[c] = _mm512_add_ps(s[c], d);
                q[c] = _mm512_fmadd_ps(d, d, q[c]);
            }
        }
        for (int c = 0; c < CHAINS; c++)
            sums = add_in_double(sums, s[c]), squares = add_in_double(squares, q[c]);
        zeros += _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(z[0], z[1]), _mm512_add_epi32(z[2], z[3])));
    }
    sum = _mm512_reduce_add_pd(sums), sq = _mm512_reduce_add_pd(squares);
    for (int c = 1; c < CHAINS; c++)
        lo[0] = _mm512_min_ps(lo[0], lo[c]), hi[0] = _mm512_max_ps(hi[0], hi[c]);
    if (whole)
        l = _mm512_reduce_min_ps(lo[0]), h = _mm512_reduce_max_ps(hi[0]);
    for (; i < n; i++) {
        float v = y ? x[i] - y[i] : x[i];
        double d = (double)v - shift;
        sum += d, sq += d * d, zeros += v == 0;
        l = v < l ? v : l;
        h = v > h ? v : h;
    }
    *out = (Moments){sum, sq, l, h, zeros};
}
#endif

static void moments(const void *x, const void *y, int64_t n, int wide, double shift, Moments *out) {
#ifdef X86_INTRINSICS
    static int avx512 = -1;
    if (avx512 < 0)
        avx512 = __builtin_cpu_supports("avx512f");
    if (!wide && avx512) {
        moments32_avx512((const float *)x, (const float *)y, n, (float)shift, out);
        return;
    }
#endif
    if (wide)
        moments64((const double *)x, (const double *)y, n, shift, out);
    else
        moments32((const float *)x, (const float *)y, n, (float)shift, out);
}

/* The moments of the n values at x (less those at y if not NULL) when all are finite: 1 and
 * (mean, m2, min, max, zeros) in out, else 0. The values are shifted by the first one (close to
 * the mean in most tensors), and measured again about the mean when the spread is small next to
 * it (cancellation). Needs no Python: it runs without the GIL. */
static int finite_pass(const void *x, const void *y, int64_t n, int wide, double out[5]) {
    double shift; /* the first value, or difference rounded as the subtraction rounds it */
    if (wide)
        shift = ((const double *)x)[0] - (y ? ((const double *)y)[0] : 0.0);
    else
        shift = ((const float *)x)[0] - (y ? ((const float *)y)[0] : 0.0f);
    if (!isfinite(shift))
        return 0;
    Moments m;
    moments(x, y, n, wide, shift, &m);
    double mean = shift + m.sum / n, m2 = m.sq - m.sum * (m.sum / n);
    if (isfinite(m.sq) && isfinite(m.sum) && m.sum != 0 && !(m2 > 1e-3 * m.sq)) {
        double lo = m.lo, hi = m.hi;
        int64_t zeros = m.zeros;
        moments(x, y, n, wide, mean, &m); /* about the mean: the deviations themselves */
        mean += m.sum / n;
        m2 = m.sq - m.sum * (m.sum / n);
        m.lo = lo, m.hi = hi, m.zeros = zeros;
    }
    if (!isfinite(m.sq) || !isfinite(m.sum) || !isfinite(m.lo) || !isfinite(m.hi))
        return 0;
    out[0] = mean, out[1] = m2 > 0 ? m2 : 0.0, out[2] = m.lo, out[3] = m.hi, out[4] = (double)m.zeros;
    return 1;
}

/* k values picked uniformly at random (with replacement) among the n at x (less those at y if
 * not NULL), written as float32 at dest; returns the stream's next state. The positions come
 * from a SplitMix64 stream whose state the caller keeps, so a sampler draws the same positions
 * for the same training; the multiply-shift maps 64 random bits onto [0, n) with a bias below
 * n / 2^64. */
static uint64_t draw_values(const void *x, const void *y, int64_t n, int wide, float *dest, int64_t k, uint64_t s) {
    for (int64_t j = 0; j < k; j++) {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
#ifdef __SIZEOF_INT128__
        uint64_t i = (uint64_t)(((unsigned __int128)z * (uint64_t)n) >> 64);
#else
        uint64_t i = z % (uint64_t)n;
#endif
        if (wide)
            dest[j] = (float)(y ? ((const double *)x)[i] - ((const double *)y)[i] : ((const double *)x)[i]);
        else
            dest[j] = y ? ((const float *)x)[i] - ((const float *)y)[i] : ((const float *)x)[i];
    }
    return s;
}

static PyObject *moments_tuple(int finite, const double m[5]) {
    if (!finite)
        Py_RETURN_NONE;
    return Py_BuildValue("(ddddL)", m[0], m[1], m[2], m[3], (long long)m[4]);
}

/* finite_moments(address, n, wide, minus=0) -> (mean, m2, min, max, zeros) of the values, or of
 * their differences from those at ``minus`` (an optimizer's update, from the parameters before
 * and after it, never written out); None when a value is not finite. */
static PyObject *finite_moments(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *names[] = {"address", "n", "wide", "minus", NULL};
    unsigned long long address, minus = 0;
    long long n;
    int wide, finite;
    double m[5];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KLp|K", names, &address, &n, &wide, &minus))
        return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "finite_moments needs at least one value");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS;
    finite = finite_pass((const void *)(uintptr_t)address, (const void *)(uintptr_t)minus, n, wide, m);
    Py_END_ALLOW_THREADS;
    return moments_tuple(finite, m);
}

/* The arguments of draw and draw_and_measure, the same for both. */
typedef struct {
    const void *x, *y;
    long long n, k;
    int wide;
    float *out;
    uint64_t state;
} DrawCall;

static int parse_draw(PyObject *args, PyObject *kwargs, const char *who, DrawCall *c) {
    static char *names[] = {"address", "n", "wide", "minus", "out", "k", "state", NULL};
    unsigned long long address, minus, out, state;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KLpKKLK", names, &address, &c->n, &c->wide, &minus, &out, &c->k,
                                     &state))
        return 0;
    if (c->n <= 0 || c->k < 0) {
        PyErr_Format(PyExc_ValueError, "%s needs at least one value and a count of zero or more", who);
        return 0;
    }
    c->x = (const void *)(uintptr_t)address, c->y = (const void *)(uintptr_t)minus;
    c->out = (float *)(uintptr_t)out, c->state = state;
    return 1;
}

/* draw(address, n, wide, minus, out, k, state) -> state: k values picked at random among the n
 * at address (less those at minus if nonzero), written as float32 at out. One call costs less
 * than the torch operations it replaces (randint, index_select, a conversion), which dominate
 * for a sample of a hundred values. */
static PyObject *draw(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    DrawCall c;
    if (!parse_draw(args, kwargs, "draw", &c))
        return NULL;
    return PyLong_FromUnsignedLongLong(draw_values(c.x, c.y, c.n, c.wide, c.out, c.k, c.state));
}

/* draw_and_measure(address, n, wide, minus, out, k, state) -> (state, moments): ``finite_moments``
 * and ``draw`` in one call, the way a logged step takes most tensors (a sample for the
 * histogram and the exact statistics): the call's own cost is most of the cost for the many
 * tensors of a few thousand values. */
static PyObject *draw_and_measure(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    DrawCall c;
    int finite;
    double m[5];
    if (!parse_draw(args, kwargs, "draw_and_measure", &c))
        return NULL;
    Py_BEGIN_ALLOW_THREADS;
    finite = finite_pass(c.x, c.y, c.n, c.wide, m);
    c.state = draw_values(c.x, c.y, c.n, c.wide, c.out, c.k, c.state); /* from cache, mostly */
    Py_END_ALLOW_THREADS;
    PyObject *found = moments_tuple(finite, m);
    if (found == NULL)
        return NULL;
    return Py_BuildValue("(KN)", (unsigned long long)c.state, found);
}

/* copy(dest, source, nbytes): a copy whose stores go around the caches (x86-64's streaming
 * stores, SSE2 in every such CPU): an optimizer's parameters copied before its step are tens of
 * megabytes, read again only after the step has swept the caches, so filling the caches with
 * them (and reading each destination line before writing it) only costs; about 1.6x memcpy. */
static PyObject *copy(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *names[] = {"dest", "source", "nbytes", NULL};
    unsigned long long dest, source;
    long long nbytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKL", names, &dest, &source, &nbytes))
        return NULL;
    if (nbytes < 0) {
        PyErr_SetString(PyExc_ValueError, "copy needs a count of bytes of zero or more");
        return NULL;
    }
    char *d = (char *)(uintptr_t)dest;
    const char *s = (const char *)(uintptr_t)source;
    Py_BEGIN_ALLOW_THREADS;
#ifdef X86_INTRINSICS
    int64_t head = (int64_t)((16 - ((uintptr_t)d & 15)) & 15); /* streaming stores need 16-byte alignment */
    head = head < nbytes ? head : nbytes;
    memcpy(d, s, (size_t)head);
    int64_t i = head;
    for (; i + 64 <= nbytes; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32)), e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a), _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c), _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, (size_t)(nbytes - i));
    _mm_sfence(); /* the streamed stores are seen by every thread before the copy returns */
#else
    memcpy(d, s, (size_t)nbytes);
#endif
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"finite_moments", (PyCFunction)(void (*)(void))finite_moments, METH_VARARGS | METH_KEYWORDS,
     "finite_moments(address, n, wide, minus=0) -> (mean, m2, min, max, zeros) of n float32 "
     "(float64 if wide) values at address, less those at minus if given; None if one is not finite."},
    {"draw", (PyCFunction)(void (*)(void))draw, METH_VARARGS | METH_KEYWORDS,
     "draw(address, n, wide, minus, out, k, state) -> state: k of the n values at address (less "
     "those at minus if nonzero), picked at random with replacement, written as float32 at out."},
    {"draw_and_measure", (PyCFunction)(void (*)(void))draw_and_measure, METH_VARARGS | METH_KEYWORDS,
     "draw_and_measure(address, n, wide, minus, out, k, state) -> (state, moments): "
     "finite_moments and draw of the same values in one call."},
    {"copy", (PyCFunction)(void (*)(void))copy, METH_VARARGS | METH_KEYWORDS,
     "copy(dest, source, nbytes): copies nbytes from source to dest around the caches."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fused", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fused(void) { return PyModule_Create(&module); }
