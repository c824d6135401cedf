/* Batch-1 decode kernels: everything a window-mixer model's step does between its matmuls.
 *
 * laplace_window_step: the window mixer after the q/k/v projection, `window_decode.window_step_`'s
 *   math in one call instead of ~100 torch ops;
 * laplace_add_norm: the residual add and the next RMSNorm; laplace_silu_mul: the GLU's middle.
 *
 * The matmuls stay torch's (`native/decode.py` runs them). Their activations are either fp32
 * or, for int8 weights, bf16 in and bf16 out with one fp32 scale per output channel applied
 * after (`quant.Int8Linear`'s arithmetic); these kernels read and write both forms.
 *
 * Built on first use by `native.py` (cc -O3 -march=native -fopenmp-simd) and called through
 * ctypes with the tensors' pointers; every array is fp32 and contiguous. Layouts:
 *
 *   qkv [H + 2G, D]              this token's q, k, v projections, one row (H = G * R query heads):
 *                                fp32, or bf16 times qkv_scale [(H + 2G) D] with io_bf16
 *   win_k, win_v [G, N, D]       the ring (N = S + W slots), written in place at `slot`
 *   cos3, sin3 [3, D]            the step table's rows for this position: angles sinks / lo / hi,
 *                                sin signed for the roll form (x cos + roll(x, D/2) sin)
 *   row [N] int64, bias [N]      which of the three angles scores each slot; 0 or -inf
 *   gla [H, F, D + 1]            the GLA branch's state (NULL: no branch), written in place
 *   xin [d_model]                the mixer's input (the branch's decay reads it)
 *   decay_w [H, d_model], decay_b [H], q_map, k_map [H, D, F0] (NULL: the elu map, F = D)
 *   y [H, D]                     the output, before o_proj (bf16 with io_bf16)
 *
 * No fast-math: the sums are IEEE fp32; `omp simd` lets the dot products vectorize.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

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
    for (int i = 0; i < n; i++) {
        float g = load(gu, gu_bf16, gu_scale, i), u = load(gu, gu_bf16, gu_scale, (int64_t)n + i);
        store(out, out_bf16, i, g / (1.0f + expf(-g)) * u);
    }
}

static float dot(const float *a, const float *b, int n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* out = x cos + roll(x, D/2) sin, or with sign = -1 the rotation back (x cos - roll(x) sin). */
static void rotate(float *out, const float *x, const float *cos, const float *sin, int D, float sign) {
    int half = D / 2;
    for (int i = 0; i < D; i++) out[i] = x[i] * cos[i] + sign * (x[(i + half) % D] * sin[i]);
}

static float logsigmoid(float z) { return fminf(z, 0.0f) - log1pf(expf(-fabsf(z))); }

/* phi(x) for head h: hedgehog softmax(x M_h) ++ softmax(-x M_h) (M [H, D, F0]), or elu(x) + 1. */
static void phi(float *out, const float *x, const float *map, int h, int D, int F0) {
    if (map == NULL) {
        for (int i = 0; i < D; i++) out[i] = x[i] > 0.0f ? x[i] + 1.0f : expm1f(x[i]) + 1.0f;
        return;
    }
    float z[F0];
    const float *m = map + (int64_t)h * D * F0;
    for (int f = 0; f < F0; f++) z[f] = 0.0f;
    for (int d = 0; d < D; d++) {
        float xd = x[d];
#pragma omp simd
        for (int f = 0; f < F0; f++) z[f] += xd * m[d * F0 + f];
    }
    float hi = -INFINITY, lo = INFINITY;
    for (int f = 0; f < F0; f++) { hi = fmaxf(hi, z[f]); lo = fminf(lo, z[f]); }
    float sp = 0.0f, sn = 0.0f;
    for (int f = 0; f < F0; f++) {
        out[f] = expf(z[f] - hi);
        out[F0 + f] = expf(lo - z[f]);
        sp += out[f];
        sn += out[F0 + f];
    }
    for (int f = 0; f < F0; f++) { out[f] /= sp; out[F0 + f] /= sn; }
}

int laplace_window_step(
    const void *qkv, int io_bf16, const float *qkv_scale, float *win_k, float *win_v,
    const float *cos3, const float *sin3, const int64_t *row, const float *bias,
    int64_t slot, int leaves, int H, int G, int D, int N,
    float *gla, const float *xin, int d_model, const float *decay_w, const float *decay_b,
    const float *q_map, const float *k_map, int F0, float gate_normalizer, const float *mix,
    float scale, int gated, float eps, void *y) {
    if (H % G || D % 2 || N <= 0) return 1;
    const int R = H / G, F = q_map ? 2 * F0 : D, DV = D + 1;
    float q[H * D], k[G * D], v[G * D];
    for (int i = 0; i < H * D; i++) q[i] = load(qkv, io_bf16, qkv_scale, i);
    for (int i = 0; i < G * D; i++) {
        k[i] = load(qkv, io_bf16, qkv_scale, (int64_t)H * D + i);
        v[i] = load(qkv, io_bf16, qkv_scale, (int64_t)(H + G) * D + i);
    }
    const float *cos_k = cos3 + D, *sin_k = sin3 + D;  /* a key is stored at its slot's angle (row 1) */
    float ev_k[G][D], ev_v[G][D];
    if (gla) { /* the key and value leaving the window: the slot's old content, read before the write */
        for (int g = 0; g < G; g++) {
            float *old = win_k + ((int64_t)g * N + slot) * D;
            rotate(ev_k[g], old, cos_k, sin_k, D, -1.0f);
            memcpy(ev_v[g], win_v + ((int64_t)g * N + slot) * D, sizeof(float) * D);
        }
    }
    for (int g = 0; g < G; g++) {
        rotate(win_k + ((int64_t)g * N + slot) * D, k + g * D, cos_k, sin_k, D, 1.0f);
        memcpy(win_v + ((int64_t)g * N + slot) * D, v + g * D, sizeof(float) * D);
    }
    /* Each query head at the three angles, scored against every slot with its row's angle. */
    const float qscale = 1.0f / sqrtf((float)D);
    float qs[D], qr[3][D], p[N], num[D];
    for (int h = 0; h < H; h++) {
        int g = h / R;
        for (int i = 0; i < D; i++) qs[i] = q[h * D + i] * qscale;
        for (int a = 0; a < 3; a++) rotate(qr[a], qs, cos3 + a * D, sin3 + a * D, D, 1.0f);
        const float *kg = win_k + (int64_t)g * N * D, *vg = win_v + (int64_t)g * N * D;
        float m = -INFINITY;
        for (int s = 0; s < N; s++) {
            p[s] = dot(qr[row[s]], kg + (int64_t)s * D, D) + bias[s];
            m = fmaxf(m, p[s]);
        }
        float den = 0.0f;
        for (int s = 0; s < N; s++) { p[s] = expf(p[s] - m); den += p[s]; }
        memset(num, 0, sizeof num);
        for (int s = 0; s < N; s++) {
            float ps = p[s];
            if (ps == 0.0f) continue;
            const float *vs = vg + (int64_t)s * D;
#pragma omp simd
            for (int i = 0; i < D; i++) num[i] += ps * vs[i];
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
        memset(o, 0, sizeof o);
        for (int f = 0; f < F; f++) {
            float *sf = st + (int64_t)f * DV, pk = phi_k[f], pq = phi_q[f];
#pragma omp simd
            for (int i = 0; i < D; i++) sf[i] = sf[i] * decay + pk * ev_v[g][i];
            sf[D] = sf[D] * decay + pk;
#pragma omp simd
            for (int i = 0; i < DV; i++) o[i] += pq * sf[i];
        }
        if (gated) {
            float gden = o[D] * scale + eps;
            for (int i = 0; i < D; i++) store(y, io_bf16, yh + i, num[i] / den + mix[h] * (o[i] * scale / gden));
        } else {
            float beta = expf(mix[h]) * scale, dd = den + beta * o[D];
            for (int i = 0; i < D; i++) store(y, io_bf16, yh + i, (num[i] + beta * o[i]) / dd);
        }
    }
    return 0;
}
