/* Batch-1 kernels: everything a window-mixer model's step does between its matmuls.
 *
 * laplace_window: the window mixer after the q/k/v projection for T tokens in a row
 *   (`window_decode.window_step_`'s math; T = 1 a decode step, more a prefill), and
 *   laplace_window_memory: the same with the memory of evicted tokens ("novelty" policy);
 * laplace_add_norm: the residual add and the next RMSNorm; laplace_silu_mul: the GLU's middle
 * (and their _rows forms for a prefill's rows);
 * laplace_matmul_i8: int8 weights times fp32 rows (`native/engine.py`, the torch-free runtime).
 *
 * With torch the matmuls stay torch's (`native/decode.py` runs them). Their activations are either fp32
 * or, for int8 weights, bf16 in and bf16 out with one fp32 scale per output channel applied
 * after (`quant.Int8Linear`'s arithmetic); these kernels read and write both forms.
 *
 * Built on first use by `native/__init__.py` (cc -O3 -march=native -fopenmp-simd) and called
 * through ctypes with the tensors' pointers; every array is contiguous. Layouts, per token:
 *
 *   qkv [H + 2G, D]              this token's q, k, v projections, one row (H = G * R query heads):
 *                                fp32, or bf16 times qkv_scale [(H + 2G) D] with io_bf16
 *   win_k, win_v [G, N, D]       the ring (N = S + W slots), written in place at the token's slot
 *   cos3, sin3 [S + 2W, 3, D]    the step tables (`window_decode.StepTables`): per canonical
 *   row [S + 2W, N] int64,       position the angles sinks / lo / hi (sin signed for the roll
 *   bias [S + 2W, N]             form x cos + roll(x, D/2) sin), which angle scores each slot,
 *                                and 0 or -inf (no key in the window there)
 *   gla [H, F, D + 1]            the GLA branch's state (NULL: no branch), written in place
 *   xin [d_model]                the mixer's fp32 input (the branch's decay reads it)
 *   decay_w [H, d_model], decay_b [H], q_map, k_map [H, D, F0] (NULL: the elu map, F = D)
 *   y [H, D]                     the output, before o_proj (bf16 with io_bf16)
 *   mem_k, mem_v [G, M, D] bf16, the memory of evicted tokens (`memory.py`, "novelty" policy;
 *   mem_score [G, M],            mem_k NULL: no memory), written in place: slots in position
 *   mem_pos [G, M] int64         order, empty ones (mem_pos 0) first
 *   mem_tab [2 + 2W, D]          the memory's angles: cos, sin (signed) of the angle a query
 *                                reads it at (W by default); cos [W, D], sin [W, D] of the window slots' angles
 *                                S .. S + W - 1, to rotate their keys back for the score
 *
 * No fast-math: the sums are IEEE fp32; `omp simd` lets the dot products vectorize.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
/* Subnormal floats (below 1.2e-38: a far-off slot's softmax weight, a long-decayed branch
 * state) cost ~100x a normal one on x86. The window kernel flushes them to zero while it
 * runs and restores the caller's mode after: a difference below 1e-38 in any sum. */
#define FTZ_ON(saved) do { saved = _mm_getcsr(); _mm_setcsr(saved | 0x8040); } while (0)
#define FTZ_OFF(saved) _mm_setcsr(saved)
#else
#define FTZ_ON(saved) (void)(saved = 0)
#define FTZ_OFF(saved) (void)(saved)
#endif

static inline float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch's float -> bfloat16 cast; a NaN stays a (quiet) NaN. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Element i of an activation row: fp32, or bf16 times its channel's scale. */
static inline float load(const void *x, int bf16, const float *scale, int64_t i) {
    return bf16 ? from_bf16(((const uint16_t *)x)[i]) * scale[i] : ((const float *)x)[i];
}

static inline void store(void *out, int bf16, int64_t i, float v) {
    if (bf16) ((uint16_t *)out)[i] = to_bf16(v);
    else ((float *)out)[i] = v;
}

/* exp(x), branch-free so that loops of it vectorize (libm's expf is a call per element, and a
 * step makes ~5,000 of them per layer): x = n ln2 + r with |r| <= ln2 / 2, exp(r) by Cephes'
 * degree-7 polynomial, 2^n made in the exponent bits. Within 2 ulp of expf for x >= -87;
 * below that (and -inf, a masked score) exactly 0. */
static inline float vexp(float x) {
    x = x < -88.0f ? -88.0f : x;  /* not fminf/fmaxf: those are calls (NaN rules) and stop vectorizing */
    x = x > 88.0f ? 88.0f : x;
    float n = rintf(x * 1.44269504088896341f);  /* rintf inlines as one rounding instruction; floorf is a call */
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = (int32_t)n + 127;
    uint32_t bits = (uint32_t)(e > 0 ? e : 0) << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    return p * two_n;
}

/* x += y (y NULL: nothing to add), then out = x / rms(x) * w, written fp32 (out_f) and/or in
 * the next matmul's form (out, bf16 with out_bf16). F.rms_norm's arithmetic in fp32. */
void laplace_add_norm(float *x, const void *y, int y_bf16, const float *y_scale, int n, const float *w,
                      float eps, float *out_f, void *out, int out_bf16) {
    if (y)
        for (int i = 0; i < n; i++) x[i] = x[i] + load(y, y_bf16, y_scale, i);
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) {
        float v = x[i] * r * w[i];
        if (out_f) out_f[i] = v;
        if (out) store(out, out_bf16, i, v);
    }
}

/* The GLU's middle: out = silu(gate) * up, gate and up the two halves of one row gu [2n]. */
void laplace_silu_mul(const void *gu, int gu_bf16, const float *gu_scale, int n, void *out, int out_bf16) {
#pragma omp simd
    for (int i = 0; i < n; i++) {
        float g = load(gu, gu_bf16, gu_scale, i), u = load(gu, gu_bf16, gu_scale, (int64_t)n + i);
        store(out, out_bf16, i, g / (1.0f + vexp(-g)) * u);
    }
}

/* The two above over the T rows of a prefill (fp32 only; x, y, out [T, n], gu [T, 2n]): one
 * call for all rows, and no temporaries (numpy's spelling of them made several [T, n] ones). */
void laplace_add_norm_rows(float *x, const float *y, int64_t T, int n, const float *w, float eps, float *out) {
    for (int64_t t = 0; t < T; t++) laplace_add_norm(x + t * n, y ? y + t * n : NULL, 0, NULL, n, w, eps, out + t * n, NULL, 0);
}

void laplace_silu_mul_rows(const float *gu, int64_t T, int n, float *out) {
    for (int64_t t = 0; t < T; t++) laplace_silu_mul(gu + t * 2 * (int64_t)n, 0, NULL, n, out + t * n, 0);
}

/* out[t, n] = scale[n] * sum_k x[t, k] w[n, k] for the T rows of x [T, K] (fp32) and the rows
 * [n0, n1) of w [N, K] (int8): the torch-free engine's matmul for a decode row or a few (a
 * prefill's many rows widen the weights once and take numpy's GEMM instead). Sums and the
 * activations stay fp32 (`quant.Int8Linear` rounds both to bf16, a difference below 2^-8).
 * Four weight rows at a time, each row of x loaded once for the four. Three forms, the best
 * the CPU has: AVX-512 VNNI (below), plain AVX-512 (16 weights a step widened int8 -> int32
 * -> fp32, two fp32 sums per row; 9 G multiply-adds/s here), and a C loop (GCC left it
 * scalar: 4.6 G/s). */
/* The plain loop: every CPU, and the VNNI form's fallback (K too large, no memory). */
static void matmul_i8_plain(const float *x, int64_t T, int K, const int8_t *w, const float *scale, int n0, int n1,
                            float *out, int64_t out_stride) {
    for (int n = n0; n < n1; n++) {
        const int8_t *wn = w + (int64_t)n * K;
        for (int64_t t = 0; t < T; t++) {
            const float *xt = x + t * K;
            float a = 0.0f;
#pragma omp simd reduction(+ : a)
            for (int k = 0; k < K; k++) a += xt[k] * (float)wn[k];
            out[t * out_stride + n] = a * scale[n];
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
/* With AVX-512 VNNI: each row of x is rounded to int16 with its own scale (max |x| / 32767;
 * an element's error at most 2^-16 of the row's largest, where torch's bf16 rounding is
 * 2^-9 of the element), and vpdpwssd multiplies 32 int16 pairs and adds them into 16 int32
 * sums in one instruction: the weights are only widened int8 -> int16. A lane adds at most
 * K/32 products of 2 * 32767 * 127, so K <= 8192 cannot overflow it (larger K: fp32 loop). */
#define MATMUL_VNNI_MAX_K 8192

static inline float quantize_row16(const float *x, int K, int16_t *q) {
    __m512 mv = _mm512_setzero_ps();
    __mmask16 bad = 0; /* a NaN anywhere */
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 v = _mm512_loadu_ps(x + k);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mv = _mm512_max_ps(mv, _mm512_abs_ps(v));
    }
    float m = _mm512_reduce_max_ps(mv);
    for (; k < K; k++) {
        float a = fabsf(x[k]);
        bad |= a != a;
        m = a > m ? a : m;
    }
    if (m == 0.0f || bad || m > 3.0e38f) { /* all zero; or a NaN or inf, which makes every sum NaN, as in fp32 */
        memset(q, 0, sizeof(int16_t) * K);
        return m == 0.0f && !bad ? 0.0f : NAN;
    }
    const float inv = 32767.0f / m;
    const __m512 iv = _mm512_set1_ps(inv);
    for (k = 0; k + 16 <= K; k += 16)  /* round to nearest even, as lrintf */
        _mm256_storeu_si256((__m256i *)(q + k), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), iv))));
    for (; k < K; k++) q[k] = (int16_t)lrintf(x[k] * inv);
    return m / 32767.0f;
}

static inline __m512i widen32(const int8_t *p, __mmask32 m) {
    return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, p));
}

static inline float lanes(__m512i a) { return _mm512_reduce_add_ps(_mm512_cvtepi32_ps(a)); }

/* out[t..t+R-1, n..n+3] for R = 4 or 1 rows of x: R x 4 int32 sums in named registers (an
 * array of them was kept in memory by GCC), each weight row widened once for the R rows;
 * the last, partial step of 32 in its own pass with masked loads (never past the matrix). */
#define DP(acc, u, b) acc = _mm512_dpwssd_epi32(acc, u, b)
#define STEP4(K_, M_)                                                                                         \
    do {                                                                                                       \
        __m512i b0 = widen32(w0 + (K_), M_), b1 = widen32(w1 + (K_), M_), b2 = widen32(w2 + (K_), M_),        \
                b3 = widen32(w3 + (K_), M_);                                                                   \
        __m512i u0 = _mm512_load_si512((const void *)(q + (K_))), u1 = _mm512_load_si512((const void *)(q + qs + (K_))); \
        DP(c00, u0, b0); DP(c01, u0, b1); DP(c02, u0, b2); DP(c03, u0, b3);                                     \
        DP(c10, u1, b0); DP(c11, u1, b1); DP(c12, u1, b2); DP(c13, u1, b3);                                     \
        u0 = _mm512_load_si512((const void *)(q + 2 * qs + (K_)));                                             \
        u1 = _mm512_load_si512((const void *)(q + 3 * qs + (K_)));                                             \
        DP(c20, u0, b0); DP(c21, u0, b1); DP(c22, u0, b2); DP(c23, u0, b3);                                     \
        DP(c30, u1, b0); DP(c31, u1, b1); DP(c32, u1, b2); DP(c33, u1, b3);                                     \
    } while (0)

static void block4x4(const int16_t *q, int64_t qs, const float *xs, const int8_t *w0, int K, int K32, __mmask32 tail,
                     const float *sc, float *o, int64_t os) {
    const int8_t *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00,
            c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
    int k = 0;
    for (; k < K32; k += 32) STEP4(k, ~0u);
    if (tail) STEP4(k, tail);
#define ROW(i, a0, a1, a2, a3)                                \
    o[i * os + 0] = lanes(a0) * xs[i] * sc[0];                \
    o[i * os + 1] = lanes(a1) * xs[i] * sc[1];                \
    o[i * os + 2] = lanes(a2) * xs[i] * sc[2];                \
    o[i * os + 3] = lanes(a3) * xs[i] * sc[3];
    ROW(0, c00, c01, c02, c03) ROW(1, c10, c11, c12, c13) ROW(2, c20, c21, c22, c23) ROW(3, c30, c31, c32, c33)
}

static void block1x4(const int16_t *q, float xs, const int8_t *w0, int K, int K32, __mmask32 tail, const float *sc,
                     float *o) {
    const int8_t *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
    int k = 0;
    for (; k < K32; k += 32) {
        __m512i u = _mm512_load_si512((const void *)(q + k));
        DP(c0, u, widen32(w0 + k, ~0u)); DP(c1, u, widen32(w1 + k, ~0u));
        DP(c2, u, widen32(w2 + k, ~0u)); DP(c3, u, widen32(w3 + k, ~0u));
    }
    if (tail) {
        __m512i u = _mm512_load_si512((const void *)(q + k));
        DP(c0, u, widen32(w0 + k, tail)); DP(c1, u, widen32(w1 + k, tail));
        DP(c2, u, widen32(w2 + k, tail)); DP(c3, u, widen32(w3 + k, tail));
    }
    o[0] = lanes(c0) * xs * sc[0];
    o[1] = lanes(c1) * xs * sc[1];
    o[2] = lanes(c2) * xs * sc[2];
    o[3] = lanes(c3) * xs * sc[3];
}

static void matmul_i8_rows(const float *x, int64_t T, int K, const int8_t *w, const float *scale, int n0, int n1,
                           float *out, int64_t out_stride) {
    if (K > MATMUL_VNNI_MAX_K) {
        matmul_i8_plain(x, T, K, w, scale, n0, n1, out, out_stride);
        return;
    }
    const int K32 = K & ~31;
    const __mmask32 tail = (__mmask32)((1ull << (K - K32)) - 1);
    const int64_t Kp = K32 + 32; /* a rounded row, zeros past K (the tail's masked step reads them) */
    int16_t one[MATMUL_VNNI_MAX_K + 32] __attribute__((aligned(64)));
    float one_s[1];
    int16_t *q = T == 1 ? one : aligned_alloc(64, (size_t)(T * Kp * 2 + 63) & ~(size_t)63);
    float *xs = T == 1 ? one_s : malloc(sizeof(float) * T);
    if (!q || !xs) { /* no memory for the rounded rows: the fp32 loop */
        if (q != one) free(q);
        if (xs != one_s) free(xs);
        matmul_i8_plain(x, T, K, w, scale, n0, n1, out, out_stride);
        return;
    }
    for (int64_t t = 0; t < T; t++) {
        xs[t] = quantize_row16(x + t * K, K, q + t * Kp);
        memset(q + t * Kp + K, 0, sizeof(int16_t) * (Kp - K));
    }
    int n = n0;
    for (; n + 4 <= n1; n += 4) {
        const int8_t *w0 = w + (int64_t)n * K;
        int64_t t = 0;
        for (; t + 4 <= T; t += 4)
            block4x4(q + t * Kp, Kp, xs + t, w0, K, K32, tail, scale + n, out + t * out_stride + n, out_stride);
        for (; t < T; t++) block1x4(q + t * Kp, xs[t], w0, K, K32, tail, scale + n, out + t * out_stride + n);
    }
    for (; n < n1; n++) {
        const int8_t *wn = w + (int64_t)n * K;
        for (int64_t t = 0; t < T; t++) {
            const int16_t *qt = q + t * Kp;
            __m512i a = _mm512_setzero_si512();
            int k = 0;
            for (; k < K32; k += 32) a = _mm512_dpwssd_epi32(a, _mm512_load_si512((const void *)(qt + k)), widen32(wn + k, ~0u));
            if (tail) a = _mm512_dpwssd_epi32(a, _mm512_load_si512((const void *)(qt + k)), widen32(wn + k, tail));
            out[t * out_stride + n] = lanes(a) * xs[t] * scale[n];
        }
    }
    if (q != one) free(q);
    if (xs != one_s) free(xs);
}

/* Whether the int8 matmul has its VNNI form here: then the engine runs a prefill's rows
 * through it too (faster than widening to fp32 for numpy's GEMM). */
int laplace_matmul_i8_vnni(void) { return 1; }
#elif defined(__AVX512F__)
#include <immintrin.h>
static inline __m512 widen16(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static void matmul_i8_rows(const float *x, int64_t T, int K, const int8_t *w, const float *scale, int n0, int n1,
                           float *out, int64_t out_stride) {
    const int K32 = K & ~31;
    int n = n0;
    for (; n + 4 <= n1; n += 4) {
        const int8_t *w0 = w + (int64_t)n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        for (int64_t t = 0; t < T; t++) {
            const float *xt = x + t * K;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            int k = 0;
            for (; k < K32; k += 32) {
                __m512 u = _mm512_loadu_ps(xt + k), v = _mm512_loadu_ps(xt + k + 16);
                a0 = _mm512_fmadd_ps(u, widen16(w0 + k), a0);
                a1 = _mm512_fmadd_ps(u, widen16(w1 + k), a1);
                a2 = _mm512_fmadd_ps(u, widen16(w2 + k), a2);
                a3 = _mm512_fmadd_ps(u, widen16(w3 + k), a3);
                b0 = _mm512_fmadd_ps(v, widen16(w0 + k + 16), b0);
                b1 = _mm512_fmadd_ps(v, widen16(w1 + k + 16), b1);
                b2 = _mm512_fmadd_ps(v, widen16(w2 + k + 16), b2);
                b3 = _mm512_fmadd_ps(v, widen16(w3 + k + 16), b3);
            }
            float s0 = _mm512_reduce_add_ps(_mm512_add_ps(a0, b0)), s1 = _mm512_reduce_add_ps(_mm512_add_ps(a1, b1));
            float s2 = _mm512_reduce_add_ps(_mm512_add_ps(a2, b2)), s3 = _mm512_reduce_add_ps(_mm512_add_ps(a3, b3));
            for (; k < K; k++) {
                float u = xt[k];
                s0 += u * (float)w0[k];
                s1 += u * (float)w1[k];
                s2 += u * (float)w2[k];
                s3 += u * (float)w3[k];
            }
            float *o = out + t * out_stride + n;
            o[0] = s0 * scale[n];
            o[1] = s1 * scale[n + 1];
            o[2] = s2 * scale[n + 2];
            o[3] = s3 * scale[n + 3];
        }
    }
    for (; n < n1; n++) {
        const int8_t *wn = w + (int64_t)n * K;
        for (int64_t t = 0; t < T; t++) {
            const float *xt = x + t * K;
            __m512 a = _mm512_setzero_ps();
            int k = 0;
            for (; k + 16 <= K; k += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(xt + k), widen16(wn + k), a);
            float s = _mm512_reduce_add_ps(a);
            for (; k < K; k++) s += xt[k] * (float)wn[k];
            out[t * out_stride + n] = s * scale[n];
        }
    }
}
#else
static void matmul_i8_rows(const float *x, int64_t T, int K, const int8_t *w, const float *scale, int n0, int n1,
                           float *out, int64_t out_stride) {
    matmul_i8_plain(x, T, K, w, scale, n0, n1, out, out_stride);
}
#endif

#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__))
int laplace_matmul_i8_vnni(void) { return 0; }
#endif

struct matmul_job { const float *x; int64_t T; int K; const int8_t *w; const float *scale; int n0, n1; float *out; int64_t out_stride; };

static void *matmul_job_run(void *arg) {
    struct matmul_job *j = arg;
    matmul_i8_rows(j->x, j->T, j->K, j->w, j->scale, j->n0, j->n1, j->out, j->out_stride);
    return NULL;
}

/* One helper thread, started on first use and kept: a decode step splits ~120 matmuls and its
 * 30 window mixers (`window_rows`) between two cores, and starting a thread for each (~20 us)
 * would cost more than it saves. A job is a function and its argument.
 * The helper spins briefly after each job (the next comes within microseconds in a step),
 * then sleeps on a condition variable. One caller at a time uses it (`busy`; another runs
 * its matmul alone), and a forked child, which has no helper, starts its own. */
#define HELPER_SPINS 20000
static struct {
    pthread_mutex_t mu, busy;
    pthread_cond_t cv;
    volatile unsigned posted, finished; /* job numbers (wrapping), read and written with the builtins below */
    void *(*fn)(void *);
    void *arg;
    struct matmul_job matmul;  /* the matmul's job lives here while the helper runs it */
    int started;
} helper = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, NULL, NULL, {0}, 0};

static inline void cpu_relax(void) {
#if defined(__SSE2__)
    _mm_pause();
#endif
}

static void *helper_main(void *arg) {
    (void)arg;
    unsigned seen = 0;
    for (;;) {
        int spins = 0;
        while (__atomic_load_n(&helper.posted, __ATOMIC_ACQUIRE) == seen) {
            if (++spins < HELPER_SPINS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&helper.mu);
            while (__atomic_load_n(&helper.posted, __ATOMIC_ACQUIRE) == seen) pthread_cond_wait(&helper.cv, &helper.mu);
            pthread_mutex_unlock(&helper.mu);
        }
        seen = __atomic_load_n(&helper.posted, __ATOMIC_ACQUIRE);
        helper.fn(helper.arg);
        __atomic_store_n(&helper.finished, seen, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void helper_forget(void) { /* in a forked child: no helper thread exists there */
    pthread_mutex_init(&helper.mu, NULL);
    pthread_mutex_init(&helper.busy, NULL);
    pthread_cond_init(&helper.cv, NULL);
    helper.posted = helper.finished = 0;
    helper.started = 0;
}

static int helper_ready(void) {
    if (helper.started) return 1;
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&tid, &attr, helper_main, NULL) == 0) {
        if (helper.started == 0) pthread_atfork(NULL, NULL, helper_forget);
        helper.started = 1;
    }
    pthread_attr_destroy(&attr);
    return helper.started;
}

/* Give the helper (held through `helper.busy`, and started) fn(arg); returns the job's number. */
static unsigned helper_post(void *(*fn)(void *), void *arg) {
    helper.fn = fn;
    helper.arg = arg;
    pthread_mutex_lock(&helper.mu);
    unsigned job = helper.posted + 1u;
    __atomic_store_n(&helper.posted, job, __ATOMIC_RELEASE);
    pthread_cond_signal(&helper.cv);
    pthread_mutex_unlock(&helper.mu);
    return job;
}

/* Wait for the helper's job, then let another caller have it. */
static void helper_wait(unsigned job) {
    while (__atomic_load_n(&helper.finished, __ATOMIC_ACQUIRE) != job) cpu_relax();
    pthread_mutex_unlock(&helper.busy);
}

/* With threads = 2 and a matrix of at least 64 K weights the rows are split at a multiple of
 * 4: the helper takes the second part while the caller does the first. */
#define MATMUL_SPLIT_MIN (1 << 16)
void laplace_matmul_i8(const float *x, int64_t T, int K, const int8_t *w, const float *scale, int N, float *out,
                       int64_t out_stride, int threads) {
    if (threads < 2 || (int64_t)N * K * T < MATMUL_SPLIT_MIN || N < 8 || pthread_mutex_trylock(&helper.busy) != 0) {
        matmul_i8_rows(x, T, K, w, scale, 0, N, out, out_stride);
        return;
    }
    if (!helper_ready()) {
        pthread_mutex_unlock(&helper.busy);
        matmul_i8_rows(x, T, K, w, scale, 0, N, out, out_stride);
        return;
    }
    int split = (N / 2) & ~3;
    helper.matmul = (struct matmul_job){x, T, K, w, scale, split, N, out, out_stride};
    unsigned job = helper_post(matmul_job_run, &helper.matmul);
    matmul_i8_rows(x, T, K, w, scale, 0, split, out, out_stride);
    helper_wait(job);
}

typedef float v8f __attribute__((vector_size(32)));  /* GCC's portable vectors: 8 floats */

/* out[:D] = sum_r w[r] * M[r, :D] over R rows of M (row stride ld). With D a multiple of 8 up
 * to 128 the sums live in registers for the whole pass (a loop
 * over out[] read and wrote memory per row: the step's hottest loop). */
static inline __attribute__((always_inline)) void weighted_rows(float *out, const float *w, const float *M, int R, int D,
                                                                 int64_t ld) {
    if (D % 8 == 0 && D <= 128) {
        v8f acc[16] = {0};
        for (int r = 0; r < R; r++) {
            float wr = w[r];
            const float *row = M + r * ld;
            for (int j = 0; j < D / 8; j++) {
                v8f x;
                memcpy(&x, row + 8 * j, sizeof x);
                acc[j] += wr * x;
            }
        }
        for (int j = 0; j < D / 8; j++) memcpy(out + 8 * j, &acc[j], sizeof acc[j]);
        return;
    }
    for (int i = 0; i < D; i++) out[i] = 0.0f;
    for (int r = 0; r < R; r++) {
        if (w[r] == 0.0f) continue;
        for (int i = 0; i < D; i++) out[i] += w[r] * M[r * ld + i];
    }
}

typedef int v8i __attribute__((vector_size(32)));

/* The 8 lane-sums of a[0..7] as one vector: a transposing tree of shuffles and adds, instead
 * of 8 horizontal sums (each a chain of dependent adds: the scores' costliest part). */
static inline __attribute__((always_inline)) v8f sum8(const v8f *a) {
    const v8i even = {0, 8, 2, 10, 4, 12, 6, 14}, odd = {1, 9, 3, 11, 5, 13, 7, 15};
    const v8i lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const v8i lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8f b[4], c[2];
    for (int i = 0; i < 4; i++) b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], even) + __builtin_shuffle(a[2 * i], a[2 * i + 1], odd);
    for (int i = 0; i < 2; i++) c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], lo2) + __builtin_shuffle(b[2 * i], b[2 * i + 1], hi2);
    return __builtin_shuffle(c[0], c[1], lo4) + __builtin_shuffle(c[0], c[1], hi4);
}

/* P[r, s] = qr[r, row[s]] . K[s] + bias[s] for a group's R heads (qr [R, 3, D], K [N, D]),
 * 8 slots at a time. */
static inline __attribute__((always_inline)) void group_scores(float *P, const float *qr, const float *K,
                                                                const int64_t *row, const float *bias, int R, int N, int D) {
    int s0 = 0;
    if (D % 8 == 0 && D <= 128) {
        for (; s0 + 8 <= N; s0 += 8) {
            for (int r = 0; r < R; r++) {
                v8f acc[8];
                for (int i = 0; i < 8; i++) {
                    const float *qq = qr + ((int64_t)r * 3 + row[s0 + i]) * D, *ks = K + (int64_t)(s0 + i) * D;
                    v8f sum = {0};
                    for (int j = 0; j < D / 8; j++) {
                        v8f x, y;
                        memcpy(&x, qq + 8 * j, sizeof x);
                        memcpy(&y, ks + 8 * j, sizeof y);
                        sum += x * y;
                    }
                    acc[i] = sum;
                }
                v8f out = sum8(acc), bs;
                memcpy(&bs, bias + s0, sizeof bs);
                out += bs;
                memcpy(P + (int64_t)r * N + s0, &out, sizeof out);
            }
        }
    }
    for (int s = s0; s < N; s++)
        for (int r = 0; r < R; r++) {
            const float *qq = qr + ((int64_t)r * 3 + row[s]) * D, *ks = K + (int64_t)s * D;
            float acc = 0.0f;
            for (int i = 0; i < D; i++) acc += qq[i] * ks[i];
            P[(int64_t)r * N + s] = acc + bias[s];
        }
}

static float dot(const float *a, const float *b, int n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* The memory's keys and values are bf16: widened as read (a shift). Inlined, so that with
 * D = 64 a compile-time constant the loops unroll and the accumulators stay in registers. */
static inline __attribute__((always_inline)) float dot_bf16(const float *a, const uint16_t *b, int n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < n; i++) acc += a[i] * from_bf16(b[i]);
    return acc;
}

/* pm[r, j] = qm[r] . mk[j] for a group's R heads (qm [R, D], pm row stride M): the memory's
 * `group_scores`. A block of 8 bf16 keys is widened once for all R heads, and each head's 8
 * sums come out of one transposing tree (`sum8`), not 8 horizontal sums; an empty slot
 * (mp[j] == 0) scores -inf. */
static inline __attribute__((always_inline)) void memory_scores(float *pm, const float *qm, const uint16_t *mk,
                                                                 const int64_t *mp, int R, int M, int D) {
    int j0 = 0;
    if (D % 8 == 0 && D <= 128) {
        float kf[8 * D];
        for (; j0 + 8 <= M; j0 += 8) {
            const uint16_t *rows = mk + (int64_t)j0 * D;
#pragma omp simd
            for (int i = 0; i < 8 * D; i++) kf[i] = from_bf16(rows[i]);
            for (int r = 0; r < R; r++) {
                v8f acc[8];
                for (int i = 0; i < 8; i++) {
                    v8f sum = {0};
                    for (int j = 0; j < D / 8; j++) {
                        v8f x, y;
                        memcpy(&x, qm + (int64_t)r * D + 8 * j, sizeof x);
                        memcpy(&y, kf + i * D + 8 * j, sizeof y);
                        sum += x * y;
                    }
                    acc[i] = sum;
                }
                v8f out = sum8(acc);
                memcpy(pm + (int64_t)r * M + j0, &out, sizeof out);
            }
            for (int i = 0; i < 8; i++)
                if (mp[j0 + i] == 0)
                    for (int r = 0; r < R; r++) pm[(int64_t)r * M + j0 + i] = -INFINITY;
        }
    }
    for (; j0 < M; j0++)
        for (int r = 0; r < R; r++)
            pm[(int64_t)r * M + j0] = mp[j0] != 0 ? dot_bf16(qm + (int64_t)r * D, mk + (int64_t)j0 * D, D) : -INFINITY;
}

typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

/* out [D] = sum over r < R of w[r] M[r] (M [R, D] bf16): `weighted_rows` for bf16 rows. */
static inline __attribute__((always_inline)) void weighted_rows_bf16(float *out, const float *w, const uint16_t *M, int R,
                                                                     int D) {
    if (D % 8 == 0 && D <= 128) {
        v8f acc[16] = {0};
        for (int r = 0; r < R; r++) {
            float wr = w[r];
            const uint16_t *row = M + (int64_t)r * D;
            for (int j = 0; j < D / 8; j++) {
                v8h h;
                memcpy(&h, row + 8 * j, sizeof h);
                v8u u = __builtin_convertvector(h, v8u) << 16;
                v8f x;
                memcpy(&x, &u, sizeof x);
                acc[j] += wr * x;
            }
        }
        for (int j = 0; j < D / 8; j++) memcpy(out + 8 * j, &acc[j], sizeof acc[j]);
        return;
    }
    for (int i = 0; i < D; i++) out[i] = 0.0f;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < D; i++) out[i] += w[r] * from_bf16(M[(int64_t)r * D + i]);
}

/* out [RC, D] = w [RC, M] (row stride M) @ mv [M, D] bf16 for RC <= 4 heads at once: each
 * value row is widened once for all of them, half a row (32 floats) at a time so the
 * accumulators stay in registers (RC and D constants where it is called). */
static inline __attribute__((always_inline)) void memory_values_rc(float *out, const float *w, const uint16_t *mv, int RC,
                                                                    int M, int D) {
    for (int c0 = 0; c0 < D / 8; c0 += 4) {
        v8f acc[4][4] = {{{0}}};
        for (int j = 0; j < M; j++) {
            const uint16_t *row = mv + (int64_t)j * D + 8 * c0;
            v8f x[4];
            for (int u = 0; u < 4; u++) {
                v8h h;
                memcpy(&h, row + 8 * u, sizeof h);
                v8u b = __builtin_convertvector(h, v8u) << 16;
                memcpy(&x[u], &b, sizeof x[u]);
            }
            for (int r = 0; r < RC; r++) {
                float wr = w[(int64_t)r * M + j];
                for (int u = 0; u < 4; u++) acc[r][u] += wr * x[u];
            }
        }
        for (int r = 0; r < RC; r++)
            for (int u = 0; u < 4; u++) memcpy(out + (int64_t)r * D + 8 * (c0 + u), &acc[r][u], sizeof acc[r][u]);
    }
}

/* out [R, D] = w [R, M] @ mv [M, D]: the memory's read for a group's R heads. */
static inline __attribute__((always_inline)) void memory_values(float *out, const float *w, const uint16_t *mv, int R,
                                                                 int M, int D) {
    if (D % 32 == 0 && D <= 128) {
        for (int r0 = 0; r0 < R; r0 += 4) {
            switch (R - r0 < 4 ? R - r0 : 4) {
            case 1: memory_values_rc(out + (int64_t)r0 * D, w + (int64_t)r0 * M, mv, 1, M, D); break;
            case 2: memory_values_rc(out + (int64_t)r0 * D, w + (int64_t)r0 * M, mv, 2, M, D); break;
            case 3: memory_values_rc(out + (int64_t)r0 * D, w + (int64_t)r0 * M, mv, 3, M, D); break;
            default: memory_values_rc(out + (int64_t)r0 * D, w + (int64_t)r0 * M, mv, 4, M, D); break;
            }
        }
        return;
    }
    for (int r = 0; r < R; r++) weighted_rows_bf16(out + (int64_t)r * D, w + (int64_t)r * M, mv, M, D);
}

/* out = x cos + roll(x, D/2) sin, or with sign = -1 the rotation back (x cos - roll(x) sin). */
static void rotate(float *out, const float *x, const float *cos, const float *sin, int D, float sign) {
    int half = D / 2;
    for (int i = 0; i < D; i++) out[i] = x[i] * cos[i] + sign * (x[(i + half) % D] * sin[i]);
}

/* memory.novelty for the key leaving a group's window: ev [D] (un-rotated) against the keys
 * in its ring's window slots after this step's write, rotated back from their slots' angles
 * (cos_r, sin_r [W, D]); a slot counts only when its token lies more than `span` positions
 * after the leaving one (window_decode.StepTables.twin). twin_cut: 1 - memory.TWIN.
 * `stop`: the caller needs the score only if it is at least a bound b > 0 (the memory is full
 * and its worst slot scores b), so the scan ends, returning -1 (never admitted), as soon as a
 * key is nearer than `stop` = twin_cut - b (+ slack): more keys can only lower the score
 * (INFINITY: never stop). */
static float novelty_score(const float *ev, const float *ring, const float *cos_r, const float *sin_r, int64_t slot,
                           int S, int W, int D, int span, float twin_cut, float stop) {
    /* cos(ev, R_j^-1 k_j) without rotating k_j back: the rotation keeps |k_j|, and with the
     * pair (m, m + D/2) turned by the slot's angle, ev . R_j^-1 k_j = sum over m < D/2 of
     * cos_m (ev_m k_m + ev_m' k_m') + sin_m (ev_m k_m' - ev_m' k_m) (m' = m + D/2; sin_r's
     * second half holds +sin). Eight slots at a time: their sums come out of one transposing
     * tree (`sum8`) and their norms and cosines are one vector each. */
    const int h = D / 2;
    float ne = sqrtf(dot(ev, ev, D)), near = -1.0f;  /* max over no key: -1 */
    ne = ne > 1e-12f ? ne : 1e-12f;  /* F.normalize's eps */
    int j0 = 0;
    if (h % 8 == 0 && h <= 64) {
        for (; j0 + 8 <= W; j0 += 8) {
            v8f an[8], ak[8];
            for (int i = 0; i < 8; i++) {
                const float *k = ring + (int64_t)(S + j0 + i) * D, *c = cos_r + (int64_t)(j0 + i) * D,
                            *sn = sin_r + (int64_t)(j0 + i) * D + h;
                v8f n = {0}, kk = {0};
                for (int m = 0; m < h / 8; m++) {
                    v8f k0, k1, e0, e1, cm, sm;
                    memcpy(&k0, k + 8 * m, sizeof k0);
                    memcpy(&k1, k + h + 8 * m, sizeof k1);
                    memcpy(&e0, ev + 8 * m, sizeof e0);
                    memcpy(&e1, ev + h + 8 * m, sizeof e1);
                    memcpy(&cm, c + 8 * m, sizeof cm);
                    memcpy(&sm, sn + 8 * m, sizeof sm);
                    n += cm * (e0 * k0 + e1 * k1) + sm * (e0 * k1 - e1 * k0);
                    kk += k0 * k0 + k1 * k1;
                }
                an[i] = n;
                ak[i] = kk;
            }
            v8f num = sum8(an), kk = sum8(ak);
            float nv[8], kv[8], cs[8];
            memcpy(nv, &num, sizeof nv);
            memcpy(kv, &kk, sizeof kv);
#pragma omp simd
            for (int i = 0; i < 8; i++) {
                float nb = __builtin_sqrtf(kv[i]);  /* kv >= 0: no errno path */
                nb = nb > 1e-12f ? nb : 1e-12f;
                cs[i] = nv[i] / ne / nb;
            }
            for (int i = 0; i < 8; i++) {
                int64_t d = ((slot - S - (j0 + i)) % W + W) % W;  /* slot S + j holds the token d steps before this one */
                if (W - d > span) near = cs[i] > near ? cs[i] : near;
            }
            if (near > stop) return -1.0f;
        }
    }
    for (int j = j0; j < W; j++) {
        int64_t d = ((slot - S - j) % W + W) % W;
        if (W - d <= span) continue;
        const float *k = ring + (int64_t)(S + j) * D, *c = cos_r + (int64_t)j * D, *sn = sin_r + (int64_t)j * D + h;
        float num = 0.0f, kk = 0.0f;
#pragma omp simd reduction(+ : num, kk)
        for (int m = 0; m < h; m++) {
            float k0 = k[m], k1 = k[m + h], e0 = ev[m], e1 = ev[m + h];
            num += c[m] * (e0 * k0 + e1 * k1) + sn[m] * (e0 * k1 - e1 * k0);
            kk += k0 * k0 + k1 * k1;
        }
        float nb = sqrtf(kk);
        nb = nb > 1e-12f ? nb : 1e-12f;
        float cs = num / ne / nb;
        near = cs > near ? cs : near;
    }
    if (near > stop) return -1.0f;
    float sc = twin_cut - near;
    return sc > 0.0f ? sc : 0.0f;
}

/* The slot a newcomer would replace in a group's memory: the worst (lowest score; on a tie
 * the earlier token, so the first in position order), or -1 while slot 0 is empty (empty
 * slots come first, so the newcomer always gets one). */
static int worst_slot(const float *ms, const int64_t *mp, int M) {
    if (mp[0] == 0) return -1;
    int out = 0;
    for (int j = 1; j < M; j++) out = ms[j] < ms[out] ? j : out;
    return out;
}

/* memory.admit for one step: the token leaving the window (k, v [D], its score, pos = 1 + its
 * position, later than every slot's) into a group's M slots (keys and values stored bf16). The
 * memory is the M best by (score, position), so the newcomer takes an empty slot (slot 0,
 * worst = -1) or replaces the worst slot (`worst_slot`) when it ranks above it, which on a tie
 * it does (it is the later token). The slots after the freed one move down one, and the
 * newcomer goes last: position order stays. */
static void admit_one(uint16_t *mk, uint16_t *mv, float *ms, int64_t *mp, int M, int D, const float *k, const float *v,
                      float score, int64_t pos, int worst) {
    int out = worst < 0 ? 0 : worst;
    if (worst >= 0 && !(score >= ms[out])) return;
    int n = M - 1 - out;
    memmove(mk + (int64_t)out * D, mk + (int64_t)(out + 1) * D, sizeof(uint16_t) * n * D);
    memmove(mv + (int64_t)out * D, mv + (int64_t)(out + 1) * D, sizeof(uint16_t) * n * D);
    memmove(ms + out, ms + out + 1, sizeof(float) * n);
    memmove(mp + out, mp + out + 1, sizeof(int64_t) * n);
    for (int i = 0; i < D; i++) {
        mk[(int64_t)(M - 1) * D + i] = to_bf16(k[i]);
        mv[(int64_t)(M - 1) * D + i] = to_bf16(v[i]);
    }
    ms[M - 1] = score;
    mp[M - 1] = pos;
}

static float logsigmoid(float z) { return fminf(z, 0.0f) - log1pf(expf(-fabsf(z))); }

/* phi(x) for head h: hedgehog softmax(x M_h) ++ softmax(-x M_h) (M [H, D, F0]), or elu(x) + 1. */
static void phi(float *out, const float *x, const float *map, int h, int D, int F0) {
    if (map == NULL) {
        for (int i = 0; i < D; i++) out[i] = x[i] > 0.0f ? x[i] + 1.0f : expm1f(x[i]) + 1.0f;
        return;
    }
    float z[F0];
    weighted_rows(z, x, map + (int64_t)h * D * F0, D, F0, F0);  /* z = x @ M_h */
    float hi = -INFINITY, lo = INFINITY;
#pragma omp simd reduction(max : hi) reduction(min : lo)
    for (int f = 0; f < F0; f++) {
        hi = z[f] > hi ? z[f] : hi;
        lo = z[f] < lo ? z[f] : lo;
    }
    float sp = 0.0f, sn = 0.0f;
#pragma omp simd reduction(+ : sp, sn)
    for (int f = 0; f < F0; f++) {
        out[f] = vexp(z[f] - hi);
        out[F0 + f] = vexp(lo - z[f]);
        sp += out[f];
        sn += out[F0 + f];
    }
    for (int f = 0; f < F0; f++) { out[f] /= sp; out[F0 + f] /= sn; }
}

#define TOKEN_PARAMS                                                                                  \
    const void *qkv, int io_bf16, const float *qkv_scale, float *const *rk, float *const *rv, int h0, int h1, \
    const float *cos3,                                                                                      \
    const float *sin3, const int64_t *row, const float *bias, int64_t slot, int leaves, int H, int G, int D, \
    int N, float *gla, const float *xin, int d_model, const float *decay_w, const float *decay_b,          \
    const float *q_map, const float *k_map, int F0, float gate_normalizer, const float *mix, float scale,   \
    int gated, float eps, void *y, int64_t t, int S, uint16_t *const *mk, uint16_t *const *mv, float *const *ms, \
    int64_t *const *mp, int M, const float *mem_tab, int span, float twin_cut, int phase, float *evbuf
#define TOKEN_ARGS(D, M)                                                                                  \
    qkv, io_bf16, qkv_scale, rk, rv, h0, h1, cos3, sin3, row, bias, slot, leaves, H, G, D, N, gla, xin,     \
    d_model, decay_w, decay_b, q_map, k_map, F0, gate_normalizer, mix, scale, gated, eps, y, t, S, mk, mv, ms, \
    mp, M, mem_tab, span, twin_cut, phase, evbuf

/* Phases of `window_token`: WRITE, the groups' rings and memories take the token (the key and
 * value leaving each ring go to evbuf [G, 2, D] when it is given); READ, the heads' outputs
 * (with the leaving keys and values from evbuf when WRITE ran in another call). A decode
 * step with two threads runs WRITE once, then READ for each half of the heads at once. */
#define WRITE 1
#define READ 2

/* The window mixer for T consecutive tokens from position t0 (T = 1: a decode step; more: a
 * batch-1 prefill, token after token, so its numbers are the step's). Row t of qkv, xin and y
 * is at t * its stride (in elements). The step tables (`window_decode.StepTables`) come
 * whole: cos3, sin3 [S + 2W, 3, D], row [S + 2W, N] int64, bias [S + 2W, N]. */
static void window_token_d64(TOKEN_PARAMS);
static void window_token_any(TOKEN_PARAMS);

/* A run of tokens over the heads [h0, h1), with the rings (and memories) of the groups they
 * read: rk[g], rv[g] [N, D], mk[g], mv[g] [M, D], ms[g], mp[g] [M] (the state's, or a thread's
 * private copy of a group another thread owns). */
struct run {
    const void *qkv; int io_bf16; const float *qkv_scale; int64_t qkv_stride; float *rk[64], *rv[64]; int h0, h1;
    const float *cos3, *sin3; const int64_t *row; const float *bias; int64_t t0; int T, H, G, D, S, W;
    float *gla; const float *xin; int64_t xin_stride; int d_model; const float *decay_w, *decay_b, *q_map, *k_map;
    int F0; float gate_normalizer; const float *mix; float scale; int gated; float eps; void *y; int64_t y_stride;
    uint16_t *mk[64], *mv[64]; float *ms[64]; int64_t *mp[64]; int M; const float *mem_tab; int span; float twin_cut;
    int phase; float *evbuf;  /* WRITE | READ for a prefill's rows; see window_rows for a decode step's */
};

static void *run_tokens(void *arg) {
    struct run *j = arg;
    const int N = j->S + j->W, S = j->S, W = j->W, D = j->D, esize = j->io_bf16 ? 2 : 4;
    unsigned int mode;
    FTZ_ON(mode);
    for (int i = 0; i < j->T; i++) {
        int64_t t = j->t0 + i;
        int64_t c = t < N ? t : N + (t - S) % W;  /* the table row: past S + W a step at t is one at t - W */
        int64_t slot = t < S ? t : S + (t - S) % W;
        (D == 64 ? window_token_d64 : window_token_any)(
            (const char *)j->qkv + i * j->qkv_stride * esize, j->io_bf16, j->qkv_scale, j->rk, j->rv, j->h0, j->h1,
            j->cos3 + c * 3 * D, j->sin3 + c * 3 * D, j->row + c * N, j->bias + c * N, slot, c >= N, j->H, j->G, D, N,
            j->gla, j->xin + i * j->xin_stride, j->d_model, j->decay_w, j->decay_b, j->q_map, j->k_map, j->F0,
            j->gate_normalizer, j->mix, j->scale, j->gated, j->eps, (char *)j->y + i * j->y_stride * esize, t, S,
            j->mk, j->mv, j->ms, j->mp, j->M, j->mem_tab, j->span, j->twin_cut, j->phase, j->evbuf);
    }
    FTZ_OFF(mode);
    return NULL;
}

/* With threads = 2 and more than one token (a prefill) the heads are split in two halves,
 * each run through all T tokens by its own thread: heads (and their branch states) are
 * independent, and so are the groups' rings, but for a group split between the halves; the
 * second thread reads a private copy of that one (and of its memory), written with the same
 * keys (its writes to the state's would race the first thread's reads).
 * laplace_window_memory adds the memory (M slots, mem_tab, span = memory.NOVELTY_SPAN,
 * twin_cut = 1 - memory.TWIN): `window_decode.window_step_`'s with the "novelty" policy. */
#define WINDOW_PARAMS                                                                                       \
    const void *qkv, int io_bf16, const float *qkv_scale, int64_t qkv_stride, float *win_k, float *win_v,  \
    const float *cos3, const float *sin3, const int64_t *row, const float *bias,                             \
    int64_t t0, int T, int H, int G, int D, int S, int W,                                                    \
    float *gla, const float *xin, int64_t xin_stride, int d_model, const float *decay_w, const float *decay_b, \
    const float *q_map, const float *k_map, int F0, float gate_normalizer, const float *mix,                 \
    float scale, int gated, float eps, void *y, int64_t y_stride, int threads
#define WINDOW_ARGS                                                                                         \
    qkv, io_bf16, qkv_scale, qkv_stride, win_k, win_v, cos3, sin3, row, bias, t0, T, H, G, D, S, W, gla, xin, \
    xin_stride, d_model, decay_w, decay_b, q_map, k_map, F0, gate_normalizer, mix, scale, gated, eps, y,      \
    y_stride, threads

static int window_rows(WINDOW_PARAMS, uint16_t *mem_k, uint16_t *mem_v, float *mem_score, int64_t *mem_pos, int M,
                       const float *mem_tab, int span, float twin_cut) {
    if (H <= 0 || G <= 0 || G > 64 || H % G || D % 2 || S < 0 || W <= 0 || T < 0) return 1;
    if (mem_k && (M <= 0 || !mem_v || !mem_score || !mem_pos || !mem_tab)) return 1;
    const int N = S + W, R = H / G;
    struct run job = {qkv, io_bf16, qkv_scale, qkv_stride, {0}, {0}, 0, H, cos3, sin3, row, bias, t0, T, H, G, D, S, W,
                      gla, xin, xin_stride, d_model, decay_w, decay_b, q_map, k_map, F0, gate_normalizer, mix, scale,
                      gated, eps, y, y_stride, {0}, {0}, {0}, {0}, mem_k ? M : 0, mem_tab, span, twin_cut,
                      WRITE | READ, NULL};
    for (int g = 0; g < G; g++) {
        job.rk[g] = win_k + (int64_t)g * N * D;
        job.rv[g] = win_v + (int64_t)g * N * D;
        if (mem_k) {
            job.mk[g] = mem_k + (int64_t)g * M * D;
            job.mv[g] = mem_v + (int64_t)g * M * D;
            job.ms[g] = mem_score + (int64_t)g * M;
            job.mp[g] = mem_pos + (int64_t)g * M;
        }
    }
    int split = (H + 1) / 2, shared = split % R ? split / R : -1;
    if (T == 1 && threads >= 2 && H >= 2 && pthread_mutex_trylock(&helper.busy) == 0) {
        /* A decode step: the rings and memories take the token first (one thread: a group's
         * ring is written once), then the two halves of the heads read them at once, the
         * second on the helper thread; nothing is written that the other half reads. */
        if (helper_ready()) {
            float evbuf[2 * G * D];
            job.phase = WRITE;
            job.evbuf = evbuf;
            run_tokens(&job);
            struct run second = job;
            job.phase = second.phase = READ;
            job.h1 = second.h0 = split;
            unsigned posted = helper_post(run_tokens, &second);
            run_tokens(&job);
            helper_wait(posted);
            return 0;
        }
        pthread_mutex_unlock(&helper.busy);
    }
    if (threads < 2 || T < 2 || H < 2) {
        run_tokens(&job);
        return 0;
    }
    struct run second = job;
    job.h1 = second.h0 = split;
    float *copy = NULL;
    uint16_t *copy_kv = NULL;
    int64_t *copy_pos = NULL;
    if (shared >= 0) {
        const int64_t MD = (int64_t)job.M * D;  /* the memory's part (0 without one) */
        copy = malloc(sizeof(float) * (2 * N * D + job.M));
        if (job.M) {
            copy_kv = malloc(sizeof(uint16_t) * 2 * MD);
            copy_pos = malloc(sizeof(int64_t) * job.M);
        }
        if (!copy || (job.M && (!copy_kv || !copy_pos))) {
            free(copy);
            free(copy_kv);
            free(copy_pos);
            return 2;
        }
        memcpy(copy, job.rk[shared], sizeof(float) * N * D);
        memcpy(copy + N * D, job.rv[shared], sizeof(float) * N * D);
        second.rk[shared] = copy;
        second.rv[shared] = copy + N * D;
        if (job.M) {
            memcpy(copy_kv, job.mk[shared], sizeof(uint16_t) * MD);
            memcpy(copy_kv + MD, job.mv[shared], sizeof(uint16_t) * MD);
            memcpy(copy + 2 * N * D, job.ms[shared], sizeof(float) * job.M);
            memcpy(copy_pos, job.mp[shared], sizeof(int64_t) * job.M);
            second.mk[shared] = copy_kv;
            second.mv[shared] = copy_kv + MD;
            second.ms[shared] = copy + 2 * N * D;
            second.mp[shared] = copy_pos;
        }
    }
    pthread_t tid;
    int started = pthread_create(&tid, NULL, run_tokens, &second) == 0;
    run_tokens(&job);
    if (started) pthread_join(tid, NULL);
    else run_tokens(&second);
    free(copy);
    free(copy_kv);
    free(copy_pos);
    return 0;
}

int laplace_window(WINDOW_PARAMS) { return window_rows(WINDOW_ARGS, NULL, NULL, NULL, NULL, 0, NULL, 0, 0.0f); }

int laplace_window_memory(WINDOW_PARAMS, uint16_t *mem_k, uint16_t *mem_v, float *mem_score, int64_t *mem_pos, int M,
                          const float *mem_tab, int span, float twin_cut) {
    if (!mem_k) return 1;
    return window_rows(WINDOW_ARGS, mem_k, mem_v, mem_score, mem_pos, M, mem_tab, span, twin_cut);
}

/* One token (the body of laplace_window), inlined three times: with D = 64 (the default model's
 * head size) a compile-time constant, so the dot products unroll and the 64 accumulators of
 * a head's output stay in registers (2.5x faster here), once without a memory (M = 0 a
 * constant too: none of its work is compiled in) and once with; and with any D. */
static inline __attribute__((always_inline)) void window_token(TOKEN_PARAMS) {
    const int R = H / G, F = q_map ? 2 * F0 : D, DV = D + 1;
    float q[H * D], k[G * D], v[G * D];
    for (int i = 0; i < H * D; i++) q[i] = load(qkv, io_bf16, qkv_scale, i);
    for (int i = 0; i < G * D; i++) {
        k[i] = load(qkv, io_bf16, qkv_scale, (int64_t)H * D + i);
        v[i] = load(qkv, io_bf16, qkv_scale, (int64_t)(H + G) * D + i);
    }
    const float *cos_k = cos3 + D, *sin_k = sin3 + D;  /* a key is stored at its slot's angle (row 1) */
    float ev_k[G][D], ev_v[G][D];
    const int g_lo = h0 / R, g_hi = (h1 - 1) / R;  /* the groups these heads read */
    if (!(phase & WRITE)) { /* another call wrote this token: the leaving keys and values it kept */
        if (gla)
            for (int g = g_lo; g <= g_hi; g++) {
                memcpy(ev_k[g], evbuf + (int64_t)2 * g * D, sizeof(float) * D);
                memcpy(ev_v[g], evbuf + (int64_t)(2 * g + 1) * D, sizeof(float) * D);
            }
    } else {
        if (gla || M) { /* the key and value leaving the window: the slot's old content, read before the write */
            for (int g = g_lo; g <= g_hi; g++) {
                rotate(ev_k[g], rk[g] + slot * D, cos_k, sin_k, D, -1.0f);
                memcpy(ev_v[g], rv[g] + slot * D, sizeof(float) * D);
            }
        }
        for (int g = g_lo; g <= g_hi; g++) {
            rotate(rk[g] + slot * D, k + g * D, cos_k, sin_k, D, 1.0f);
            memcpy(rv[g] + slot * D, v + g * D, sizeof(float) * D);
        }
        if (M && leaves) { /* the memory: the leaving token scored against the window left after the write, then admitted */
            const int W = N - S;
            for (int g = g_lo; g <= g_hi; g++) {
                int worst = worst_slot(ms[g], mp[g], M);
                /* 1e-5 of slack: the scan stops only where the score is surely below the bound, so the
                 * admission itself is decided by the same comparison as always */
                float stop = worst >= 0 && ms[g][worst] > 0.0f ? twin_cut - ms[g][worst] + 1e-5f : INFINITY;
                float score = novelty_score(ev_k[g], rk[g], mem_tab + 2 * D, mem_tab + (2 + (int64_t)W) * D, slot, S, W, D,
                                            span, twin_cut, stop);
                admit_one(mk[g], mv[g], ms[g], mp[g], M, D, ev_k[g], ev_v[g], score, t - W + 1, worst);
            }
        }
        if (evbuf)
            for (int g = g_lo; g <= g_hi; g++) {
                memcpy(evbuf + (int64_t)2 * g * D, ev_k[g], sizeof(float) * D);
                memcpy(evbuf + (int64_t)(2 * g + 1) * D, ev_v[g], sizeof(float) * D);
            }
    }
    if (!(phase & READ)) return;
    /* Each query head at the three angles, scored against every slot with its row's angle:
     * a group's R heads together, so each key is read once. */
    const float qscale = 1.0f / sqrtf((float)D);
    float qs[D], qr[R][3][D], P[R][N], num[D];
    float qm[M ? R : 1][D], pm[M ? R : 1][M ? M : 1], num_m[M ? R : 1][D], den_r[R];  /* the memory's: queries at angle W, scores, read */
    for (int h = h0; h < h1; h++) {
        int g = h / R, r = h % R;
        const float *kg = rk[g], *vg = rv[g];
        if (r == 0 || h == h0) { /* the group's heads in [h0, h1), scored together */
            int ra = r, rb = h1 - g * R < R ? h1 - g * R : R;
            for (int rr = ra; rr < rb; rr++) {
                for (int i = 0; i < D; i++) qs[i] = q[(g * R + rr) * D + i] * qscale;
                for (int a = 0; a < 3; a++) rotate(qr[rr][a], qs, cos3 + a * D, sin3 + a * D, D, 1.0f);
                if (M) rotate(qm[rr], qs, mem_tab, mem_tab + D, D, 1.0f);
            }
            group_scores(&P[ra][0], &qr[ra][0][0], kg, row, bias, rb - ra, N, D);
            if (M) { /* the memory's slots join each head's softmax (an empty slot: -inf); read for the heads at once */
                memory_scores(&pm[ra][0], &qm[ra][0], mk[g], mp[g], rb - ra, M, D);
                for (int rr = ra; rr < rb; rr++) {
                    float *pw = P[rr], *pr = pm[rr], mx = -INFINITY, dw = 0.0f, dm = 0.0f;
#pragma omp simd reduction(max : mx)
                    for (int s = 0; s < N; s++) mx = pw[s] > mx ? pw[s] : mx;
#pragma omp simd reduction(max : mx)
                    for (int j = 0; j < M; j++) mx = pr[j] > mx ? pr[j] : mx;
#pragma omp simd reduction(+ : dw)
                    for (int s = 0; s < N; s++) { pw[s] = vexp(pw[s] - mx); dw += pw[s]; }
#pragma omp simd reduction(+ : dm)
                    for (int j = 0; j < M; j++) { pr[j] = vexp(pr[j] - mx); dm += pr[j]; }
                    den_r[rr] = dw + dm;
                }
                memory_values(&num_m[ra][0], &pm[ra][0], mv[g], rb - ra, M, D);
            }
        }
        float *p = P[r], den;
        if (M) { /* exponentiated above, with the memory's */
            den = den_r[r];
            weighted_rows(num, p, vg, N, D, D);
            for (int i = 0; i < D; i++) num[i] += num_m[r][i];
        } else {
            float m = -INFINITY;
#pragma omp simd reduction(max : m)
            for (int s = 0; s < N; s++) m = p[s] > m ? p[s] : m;
            den = 0.0f;
#pragma omp simd reduction(+ : den)
            for (int s = 0; s < N; s++) { p[s] = vexp(p[s] - m); den += p[s]; }
            weighted_rows(num, p, vg, N, D, D);
        }
        const int64_t yh = (int64_t)h * D;
        if (!gla) {
            for (int i = 0; i < D; i++) store(y, io_bf16, yh + i, num[i] / den);
            continue;
        }
        /* The branch: S <- exp(g) S + phi(k_leaving) [v_leaving, 1]^T; o = phi(q) S. */
        float phi_q[F], phi_k[F], o[DV];
        phi(phi_q, q + h * D, q_map, h, D, F0);
        if (leaves) phi(phi_k, ev_k[g], k_map, h, D, F0);
        else memset(phi_k, 0, sizeof phi_k);
        float decay = expf(logsigmoid(dot(decay_w + (int64_t)h * d_model, xin, d_model) + decay_b[h]) / gate_normalizer);
        float *st = gla + (int64_t)h * F * DV;
        o[D] = 0.0f;
        for (int f = 0; f < F; f++) {
            float *sf = st + (int64_t)f * DV, pk = phi_k[f];
#pragma omp simd
            for (int i = 0; i < D; i++) sf[i] = sf[i] * decay + pk * ev_v[g][i];
            sf[D] = sf[D] * decay + pk;
            o[D] += phi_q[f] * sf[D];
        }
        weighted_rows(o, phi_q, st, F, D, DV);  /* o[:D] = phi_q @ S[:, :D] */
        if (gated) {
            float gden = o[D] * scale + eps;
            for (int i = 0; i < D; i++) store(y, io_bf16, yh + i, num[i] / den + mix[h] * (o[i] * scale / gden));
        } else {
            float beta = expf(mix[h]) * scale, dd = den + beta * o[D];
            for (int i = 0; i < D; i++) store(y, io_bf16, yh + i, (num[i] + beta * o[i]) / dd);
        }
    }
}

static void window_token_d64(TOKEN_PARAMS) {
    (void)D;
    if (M == 0) window_token(TOKEN_ARGS(64, 0));
    else window_token(TOKEN_ARGS(64, M));
}

static void window_token_any(TOKEN_PARAMS) { window_token(TOKEN_ARGS(D, M)); }
