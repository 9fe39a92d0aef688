/* rlft's CPU kernels: the rollout's one-token decode step, sampling, and the LM head's softmax.
 *
 * A decode step multiplies a few rows by every weight of the model; the matmuls stay with
 * PyTorch (oneDNN), and these kernels do what sits between them in one call each instead of a
 * dozen small PyTorch ops: RMSNorm (with the residual add before it), SiLU(gate) * up, and the
 * rotary embedding + KV-cache write + attention of one query token per row. Sampling and the
 * LM head's softmax and gradient read each row of the vocabulary once instead of once an op.
 *
 * Tensors of the compute dtype are bf16 (bf = 1) or fp32 (bf = 0); the residual stream, norms,
 * scores and softmax are fp32, and a value is rounded to bf16 where the PyTorch path rounds it
 * (round to nearest even, as PyTorch's conversion), so the two paths differ by summation order.
 * Loops are written for the compiler's vectoriser (-O3 -fno-trapping-math); attention splits its
 * (row, kv head) groups over OpenMP threads, the runtime PyTorch itself runs on.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define KEY_BLOCK 64 /* keys at a time: converted to fp32 once (16 KB at D = 64, in L1) for every query head */

static inline float round_bf(float f) { return bf_to_f(f_to_bf(f)); }

static void load(const void *src, int bf, int64_t offset, int n, float *restrict dst) {
    if (bf) {
        const uint16_t *s = (const uint16_t *)src + offset;
        for (int i = 0; i < n; i++) dst[i] = bf_to_f(s[i]);
    } else {
        memcpy(dst, (const float *)src + offset, (size_t)n * sizeof(float));
    }
}

static void store(const float *restrict src, int bf, void *dst, int64_t offset, int n) {
    if (bf) {
        uint16_t *d = (uint16_t *)dst + offset;
        for (int i = 0; i < n; i++) d[i] = f_to_bf(src[i]);
    } else {
        memcpy((float *)dst + offset, src, (size_t)n * sizeof(float));
    }
}

/* exp(x) with relative error below 2e-7 for x in [-87, 88], clamped outside (softmax and SiLU need
 * no more); branch-free so that loops over it vectorise */
static inline float fast_exp(float x) {
    x = x > -87.0f ? x : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    float t = x * 1.44269504088896341f + 12582912.0f; /* round to nearest through the float's mantissa */
    int32_t bits;
    memcpy(&bits, &t, 4);
    int32_t k = bits - 0x4B400000;
    float kf = (float)k;
    float r = x - kf * 0.693145751953125f - kf * 1.428606765330187e-06f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = (k + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    return p * scale;
}

static void rms_row(const float *restrict x, const float *restrict w, float eps, int dim, int bf, void *out,
                    int64_t offset, float *restrict scratch) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < dim; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = 0; i < dim; i++) scratch[i] = x[i] * inv * w[i];
    store(scratch, bf, out, offset, dim);
}

/* rows split over threads once a call has enough work to pay for waking them */
#define ROWS_PARALLEL(rows, dim) if (threads > 1 && (rows) > 1 && (int64_t)(rows) * (dim) >= (1 << 13))

/* out [rows, dim] = RMSNorm(x [rows, dim] fp32) * w, in the compute dtype */
void rlft_rms_norm(const float *x, const float *w, float eps, int rows, int dim, void *out, int bf, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) ROWS_PARALLEL(rows, dim)
    for (int r = 0; r < rows; r++) {
        float scratch[dim];
        rms_row(x + (int64_t)r * dim, w, eps, dim, bf, out, (int64_t)r * dim, scratch);
    }
}

/* x += y (y in the compute dtype, x the fp32 residual), then out = RMSNorm(x) * w */
void rlft_add_rms_norm(float *x, const void *y, const float *w, float eps, int rows, int dim, void *out, int bf,
                       int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) ROWS_PARALLEL(rows, dim)
    for (int r = 0; r < rows; r++) {
        float scratch[dim], *xr = x + (int64_t)r * dim;
        load(y, bf, (int64_t)r * dim, dim, scratch);
        for (int i = 0; i < dim; i++) xr[i] += scratch[i];
        rms_row(xr, w, eps, dim, bf, out, (int64_t)r * dim, scratch);
    }
}

/* out [rows, inter] = SiLU(gate) * up for gate_up [rows, 2 * inter] (gate first); in bf16 the SiLU is
 * rounded before the product, as two PyTorch ops round it */
void rlft_silu_mul(const void *gate_up, int rows, int inter, void *out, int bf, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) ROWS_PARALLEL(rows, inter)
    for (int r = 0; r < rows; r++) {
        float g[inter], u[inter];
        load(gate_up, bf, (int64_t)r * 2 * inter, inter, g);
        load(gate_up, bf, (int64_t)r * 2 * inter + inter, inter, u);
        if (bf) {
            for (int i = 0; i < inter; i++) g[i] = round_bf(g[i] / (1.0f + fast_exp(-g[i]))) * u[i];
        } else {
            for (int i = 0; i < inter; i++) g[i] = g[i] / (1.0f + fast_exp(-g[i])) * u[i];
        }
        store(g, bf, out, (int64_t)r * inter, inter);
    }
}

/* out[d] = x[d] * cos[d] + x[(d + D/2) % D] * sin[d]: rotate_half with its sign folded into sin */
static void rotate(const float *restrict x, const float *restrict cos, const float *restrict sin, int dim,
                   float *restrict out) {
    int half = dim / 2;
    for (int d = 0; d < half; d++) out[d] = x[d] * cos[d] + x[d + half] * sin[d];
    for (int d = half; d < dim; d++) out[d] = x[d] * cos[d] + x[d - half] * sin[d];
}

#define INLINE static inline __attribute__((always_inline))

/* 16 floats as one vector value (GCC/Clang vector extensions: AVX-512, 2 x AVX2, 4 x SSE or NEON) */
typedef float vf __attribute__((vector_size(64)));

INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* the sum of a vector's lanes as a tree (a chain of 15 adds would be the slowest part of a dot
 * product); lanes are read by subscript, so the vector never leaves its register */
INLINE float hsum(vf v) {
    return (((v[0] + v[8]) + (v[4] + v[12])) + ((v[2] + v[10]) + (v[6] + v[14]))) +
           (((v[1] + v[9]) + (v[5] + v[13])) + ((v[3] + v[11]) + (v[7] + v[15])));
}

/* p[j] = exp(s[j] - top) where valid[j], else 0; returns the sum (its own function: inlined, the
 * compiler left this loop scalar) */
__attribute__((noinline)) static float exp_shifted(float *restrict s, const uint8_t *restrict valid, float top,
                                                   int n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        float p = fast_exp(s[j] - top);
        p = valid[j] ? p : 0.0f;
        s[j] = p;
        sum += p;
    }
    return sum;
}

__attribute__((noinline)) static float masked_max(const float *restrict s, const uint8_t *restrict valid, float top,
                                                  int n) {
#pragma omp simd reduction(max : top)
    for (int j = 0; j < n; j++) {
        float v = valid[j] ? s[j] : -FLT_MAX;
        top = v > top ? v : top;
    }
    return top;
}

#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
/* lane i of the result: the sum of the lanes of v[i] (16 vectors in, one out), as a butterfly:
 * 15 shuffle-and-add pairs where 16 tree sums take 64 adds and 45 shuffles */
INLINE vf hsum16(vf v[16]) {
    vf t[8], u[4], w[2];
    for (int i = 0; i < 8; i++) /* lanes 0-7 of v[2i] (+ 8-15), then of v[2i+1] */
        t[i] = SHUFFLE(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUFFLE(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++) /* four lanes each of v[4i .. 4i+3] */
        u[i] = SHUFFLE(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               SHUFFLE(t[2 * i], t[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++) /* two lanes each of v[8i .. 8i+7] */
        w[i] = SHUFFLE(u[2 * i], u[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               SHUFFLE(u[2 * i], u[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return SHUFFLE(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           SHUFFLE(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#endif

/* scores [n] = q [D] . keys [j, D] (a key not attended to gets some finite number; the softmax masks it) */
static void score_block(const float *restrict q, const float *restrict keys, int n, int D, float *restrict scores) {
    int j = 0;
    if (D % 16 == 0) {
#ifdef SHUFFLE
        for (; j + 16 <= n; j += 16) {
            vf acc[16];
            for (int k = 0; k < 16; k++) acc[k] = (vf){0};
            for (int c = 0; c < D; c += 16) {
                vf qc = vload(q + c);
                for (int k = 0; k < 16; k++) acc[k] += qc * vload(keys + (j + k) * D + c);
            }
            vstore(scores + j, hsum16(acc));
        }
#endif
        for (; j < n; j++) {
            vf s = {0};
            for (int c = 0; c < D; c += 16) s += vload(q + c) * vload(keys + j * D + c);
            scores[j] = hsum(s);
        }
        return;
    }
    for (; j < n; j++) {
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += q[d] * keys[j * D + d];
        scores[j] = s;
    }
}

/* out [D] = out * rescale + sum_j p[j] * values [j, D]; p[j] is 0 for a key not attended to (as the
 * PyTorch path's softmax makes it), so every key of the block is added */
static void accumulate_block(float *restrict out, float rescale, const float *restrict p,
                             const float *restrict values, int n, int D) {
    if (D % 16 == 0) {
        for (int c = 0; c < D; c += 16) { /* four accumulators a chunk keep four FMA chains in flight */
            vf a0 = vload(out + c) * rescale, a1 = {0}, a2 = {0}, a3 = {0};
            int j = 0;
            for (; j + 4 <= n; j += 4) {
                a0 += p[j] * vload(values + j * D + c);
                a1 += p[j + 1] * vload(values + (j + 1) * D + c);
                a2 += p[j + 2] * vload(values + (j + 2) * D + c);
                a3 += p[j + 3] * vload(values + (j + 3) * D + c);
            }
            for (; j < n; j++) a0 += p[j] * vload(values + j * D + c);
            vstore(out + c, (a0 + a1) + (a2 + a3));
        }
        return;
    }
    for (int d = 0; d < D; d++) out[d] *= rescale;
    for (int j = 0; j < n; j++)
        for (int d = 0; d < D; d++) out[d] += p[j] * values[j * D + d];
}

/* One (row, kv head) group: G query heads q [G, D] (rotated) against the keys and values [A, D] of
 * its cache where valid[j]; out [G, D] fp32. Keys and values are read a block at a time into fp32
 * scratch (in L1 for every query head); the softmax runs online over the blocks, so scratch stays
 * KEY_BLOCK long whatever the cache length. */
static void attend_group(const float *restrict q, const void *keys, const void *values, const uint8_t *restrict valid,
                         int A, int D, int G, int bf, float *restrict out) {
    float block[KEY_BLOCK * D], scores[G * KEY_BLOCK], rescale[G], top[G], total[G];
    for (int g = 0; g < G; g++) top[g] = -FLT_MAX, total[g] = 0.0f;
    memset(out, 0, sizeof(float) * (size_t)G * D);
    for (int j0 = 0; j0 < A; j0 += KEY_BLOCK) {
        int n = A - j0 < KEY_BLOCK ? A - j0 : KEY_BLOCK, any = 0;
        const uint8_t *ok = valid + j0;
        for (int j = 0; j < n; j++) any |= ok[j];
        if (!any) continue;
        load(keys, bf, (int64_t)j0 * D, n * D, block);
        for (int g = 0; g < G; g++) {
            float *s = scores + g * KEY_BLOCK;
            score_block(q + g * D, block, n, D, s);
            float m = masked_max(s, ok, top[g], n);
            rescale[g] = fast_exp(top[g] - m);
            top[g] = m;
            total[g] = total[g] * rescale[g] + exp_shifted(s, ok, m, n);
        }
        load(values, bf, (int64_t)j0 * D, n * D, block);
        for (int g = 0; g < G; g++) accumulate_block(out + g * D, rescale[g], scores + g * KEY_BLOCK, block, n, D);
    }
    for (int g = 0; g < G; g++)
        for (int d = 0; d < D; d++) out[g * D + d] /= total[g];
}

/* The attention of one new token per row, rotary embedding and cache write included.
 *   qkv [B, (H + 2 KVH) D]: the fused projection (queries, keys, values) in the compute dtype;
 *   cos, sin [B, H + KVH, D] fp32: rotary tables, rotate_half's sign and (query heads) 1/sqrt(D) folded in;
 *   k_cache, v_cache [B, KVH, A, D] in the compute dtype: this token's key and value are written at column col;
 *   valid [B, A] bool: the columns each row attends to (col included);
 *   out [B, H D] in the compute dtype. Query head h reads kv head h / (H / KVH).
 * The (row, kv head) groups are split over `threads` OpenMP threads when the cache is long enough to pay. */
void rlft_decode_attention(const void *qkv, const float *cos, const float *sin, void *k_cache, void *v_cache,
                           const uint8_t *valid, int B, int H, int KVH, int D, int A, int col, void *out, int bf,
                           int threads) {
    int G = H / KVH;
    int64_t width = (int64_t)(H + 2 * KVH) * D, tables = (int64_t)(H + KVH) * D;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && (int64_t)B * KVH * A * D >= (1 << 16))
    for (int bh = 0; bh < B * KVH; bh++) {
        int b = bh / KVH, h = bh % KVH;
        float x[D], q[G * D], o[G * D];
        const float *c = cos + b * tables, *s = sin + b * tables;
        int64_t cache = ((int64_t)b * KVH + h) * A * D;
        load(qkv, bf, b * width + (int64_t)(H + h) * D, D, x);
        rotate(x, c + (H + h) * D, s + (H + h) * D, D, o);
        store(o, bf, k_cache, cache + (int64_t)col * D, D);
        load(qkv, bf, b * width + (int64_t)(H + KVH + h) * D, D, x);
        store(x, bf, v_cache, cache + (int64_t)col * D, D);
        for (int g = 0; g < G; g++) {
            int head = h * G + g;
            load(qkv, bf, b * width + (int64_t)head * D, D, x);
            rotate(x, c + head * D, s + head * D, D, q + g * D);
            if (bf)
                for (int d = 0; d < D; d++) q[g * D + d] = round_bf(q[g * D + d]);
        }
        const char *kc = (const char *)k_cache, *vc = (const char *)v_cache;
        size_t elem = bf ? 2 : 4;
        attend_group(q, kc + cache * elem, vc + cache * elem, valid + (int64_t)b * A, A, D, G, bf, o);
        store(o, bf, out, (int64_t)b * H * D + (int64_t)h * G * D, G * D);
    }
}

/* exp(z[i] / t - top) over a block, written to e [n]; returns their sum (in double: the draw compares
 * running sums over the whole vocabulary) */
__attribute__((noinline)) static double exp_block(const float *restrict z, float t, float top, int n,
                                                   float *restrict e) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) {
        e[i] = fast_exp(z[i] / t - top);
        sum += e[i];
    }
    return sum;
}

__attribute__((noinline)) static float max_of(const float *restrict z, int n) {
    float top = -FLT_MAX;
#pragma omp simd reduction(max : top)
    for (int i = 0; i < n; i++) top = z[i] > top ? z[i] : top;
    return top;
}

#define SAMPLE_BLOCK 256

/* One draw per row from softmax(logits / temperature), by inverting its cumulative distribution at
 * u [rows] (in [0, 1)), the token ids in suppress [n_suppress] (sorted, distinct) never drawn: the
 * first token whose cumulative mass passes u times the mass of the tokens that may be drawn.
 *   logits [rows, vocab] fp32; token [rows] int64; logprob [rows]: the token's log-prob under the
 *   tempered distribution before suppression (what the trainer's forward computes). */
void rlft_sample(const float *logits, int rows, int vocab, float temperature, const int64_t *suppress,
                 int n_suppress, const double *u, int64_t *token, float *logprob, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows > 1)
    for (int r = 0; r < rows; r++) {
        const float *z = logits + (int64_t)r * vocab;
        float top = max_of(z, vocab) / temperature, e[SAMPLE_BLOCK]; /* division is monotone: the max of z / t */
        double total = 0.0, kept;
        for (int j0 = 0; j0 < vocab; j0 += SAMPLE_BLOCK)
            total += exp_block(z + j0, temperature, top, vocab - j0 < SAMPLE_BLOCK ? vocab - j0 : SAMPLE_BLOCK, e);
        kept = total;
        for (int s = 0; s < n_suppress; s++)
            if (suppress[s] >= 0 && suppress[s] < vocab) kept -= fast_exp(z[suppress[s]] / temperature - top);
        double target = u[r] * kept, mass = 0.0;
        int64_t pick = -1, last = -1, next = 0;
        for (int j0 = 0; j0 < vocab && pick < 0; j0 += SAMPLE_BLOCK) {
            int n = vocab - j0 < SAMPLE_BLOCK ? vocab - j0 : SAMPLE_BLOCK;
            double block = exp_block(z + j0, temperature, top, n, e);
            for (; next < n_suppress && suppress[next] < j0 + n; next++)
                if (suppress[next] >= j0) block -= e[suppress[next] - j0], e[suppress[next] - j0] = 0.0f;
            if (mass + block <= target) { /* the draw is past this block */
                mass += block;
                for (int i = n - 1; i >= 0 && last < j0; i--)
                    if (e[i] > 0.0f) last = j0 + i;
                continue;
            }
            for (int i = 0; i < n; i++) {
                mass += e[i];
                if (e[i] > 0.0f) last = j0 + i;
                if (mass > target) { pick = j0 + i; break; }
            }
        }
        if (pick < 0) pick = last >= 0 ? last : vocab - 1; /* rounding left the draw past the end */
        token[r] = pick;
        logprob[r] = (float)(z[pick] / temperature - top - log(total));
    }
}

/* The LM head's softmax over each row of logits [n, V] in the compute dtype (the head matmul's
 * output), with z = logits / temperature:
 *   lse[r] = log sum_j exp(z_j);  logprob[r] = z[target[r]] - lse[r];
 *   entropy[r] = lse[r] - sum_j p_j z_j (when entropy is not NULL);
 * and with keep, the probabilities p_j = exp(z_j - lse) written over the logits. One read of the row
 * into fp32 scratch, the passes over it in cache, one write: where PyTorch makes six passes over
 * fp32 copies of the logits. */
void rlft_head_softmax(void *logits, int n, int vocab, int bf, float temperature, const int64_t *targets,
                       float *logprob, float *lse, float *entropy, int keep, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n > 1)
    for (int r = 0; r < n; r++) {
        float z[vocab];
        load(logits, bf, (int64_t)r * vocab, vocab, z);
        if (temperature != 1.0f)
            for (int j = 0; j < vocab; j++) z[j] /= temperature;
        float top = max_of(z, vocab);
        double total = 0.0, weighted = 0.0;
#pragma omp simd reduction(+ : total, weighted)
        for (int j = 0; j < vocab; j++) {
            float e = fast_exp(z[j] - top);
            total += e;
            weighted += e * (z[j] - top);
        }
        float log_total = (float)log(total), l = top + log_total;
        int64_t t = targets[r] >= 0 && targets[r] < vocab ? targets[r] : 0;
        lse[r] = l;
        logprob[r] = z[t] - l;
        if (entropy) entropy[r] = log_total - (float)(weighted / total);
        if (keep) {
            for (int j = 0; j < vocab; j++) z[j] = fast_exp(z[j] - l);
            store(z, bf, logits, (int64_t)r * vocab, vocab);
        }
    }
}

/* d(sum_r g[r] logprob[r]) / d logits, written over buf [n, V] (the compute dtype):
 * (g[r] / temperature) (onehot(target) - p). buf holds the probabilities, or (from_logits) the
 * logits, p = exp(logits / temperature - lse). The target entry comes from the fp32 log-prob,
 * (g / t) * -expm1(logprob), which keeps its precision where p is near 1. */
void rlft_head_grad(void *buf, int n, int vocab, int bf, float temperature, const int64_t *targets,
                    const float *logprob, const float *lse, const float *g, int from_logits, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n > 1)
    for (int r = 0; r < n; r++) {
        float p[vocab], scale = g[r] / temperature;
        load(buf, bf, (int64_t)r * vocab, vocab, p);
        if (from_logits)
            for (int j = 0; j < vocab; j++) p[j] = fast_exp(p[j] / temperature - lse[r]);
        for (int j = 0; j < vocab; j++) p[j] *= -scale;
        int64_t t = targets[r];
        if (t >= 0 && t < vocab) p[t] = scale * -expm1f(logprob[r]);
        store(p, bf, buf, (int64_t)r * vocab, vocab);
    }
}

/* Attention in the update, as matmuls around these two kernels (grouped heads: a kv head's G query
 * heads are one block of G * L rows, query i = row % L). scores [B, KVH, G * L, S] in the compute
 * dtype; mask [B, L, S] (1: attend) or NULL: causal from the first key (key j <= query i; a longer
 * key block is a static cache's empty tail, as PyTorch's SDPA takes it), and every key for a single
 * query (a decode step). A query with no key to attend to (left padding) attends to every key
 * uniformly: finite, and its output is never used. */

/* which keys query i of L attends to; returns how many */
static int attended(const uint8_t *mask, int i, int L, int S, uint8_t *restrict on) {
    int count = 0;
    for (int j = 0; j < S; j++) {
        on[j] = mask ? mask[j] != 0 : (L == 1 || j <= i);
        count += on[j];
    }
    return count;
}

__attribute__((noinline)) static void scale_row(float *restrict s, float scale, int n) {
    for (int j = 0; j < n; j++) s[j] *= scale;
}

/* p = exp(scale * s - lse) where attended, else 0 (written over s); g = scale * p * (g - delta) where
 * attended, else 0 */
__attribute__((noinline)) static void softmax_grad_row(float *restrict s, float *restrict g,
                                                       const uint8_t *restrict on, float scale, float lse,
                                                       float delta, int n) {
    for (int j = 0; j < n; j++) {
        float p = fast_exp(scale * s[j] - lse);
        p = on[j] ? p : 0.0f;
        float d = scale * p * (g[j] - delta);
        s[j] = p;
        g[j] = on[j] ? d : 0.0f;
    }
}

/* Forward: the softmax of scale * scores over the attended keys, written over the scores, and its
 * log-sum-exp lse [B, KVH, G * L] (fp32) for the backward. */
void rlft_attention_softmax(void *scores, const uint8_t *mask, int B, int KVH, int G, int L, int S, float scale,
                            float *lse, int bf, int threads) {
    int64_t rows = (int64_t)B * KVH * G * L;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * S >= (1 << 15))
    for (int64_t r = 0; r < rows; r++) {
        int i = (int)(r % L), b = (int)(r / ((int64_t)KVH * G * L));
        float s[S];
        uint8_t on[S];
        load(scores, bf, r * S, S, s);
        if (attended(mask ? mask + ((int64_t)b * L + i) * S : NULL, i, L, S, on) == 0) { /* uniform over every key */
            for (int j = 0; j < S; j++) s[j] = 1.0f / (float)S;
            lse[r] = 0.0f;
        } else {
            scale_row(s, scale, S);
            float top = masked_max(s, on, -FLT_MAX, S), total = exp_shifted(s, on, top, S);
            scale_row(s, 1.0f / total, S);
            lse[r] = top + logf(total);
        }
        store(s, bf, scores, r * S, S);
    }
}

/* Backward, flash-style from the recomputed scores (q k^T again, [B, KVH, G * L, S]) and dp = dO v^T:
 * p = exp(scale * scores - lse) over the attended keys, delta [B, KVH, G * L] = rowsum(dO * O) (fp32),
 * and the gradient of the scores dS = scale * p * (dp - delta), 0 where masked, written over dp; p
 * itself written over the scores (for dV = p^T dO). */
void rlft_attention_softmax_backward(void *scores, void *dp, const float *lse, const float *delta, const uint8_t *mask,
                                     int B, int KVH, int G, int L, int S, float scale, int bf, int threads) {
    int64_t rows = (int64_t)B * KVH * G * L;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * S >= (1 << 15))
    for (int64_t r = 0; r < rows; r++) {
        int i = (int)(r % L), b = (int)(r / ((int64_t)KVH * G * L));
        float s[S], g[S];
        uint8_t on[S];
        load(scores, bf, r * S, S, s);
        load(dp, bf, r * S, S, g);
        if (attended(mask ? mask + ((int64_t)b * L + i) * S : NULL, i, L, S, on) == 0) {
            for (int j = 0; j < S; j++) s[j] = 1.0f / (float)S, g[j] = 0.0f;
        } else {
            softmax_grad_row(s, g, on, scale, lse[r], delta[r], S);
        }
        store(s, bf, scores, r * S, S);
        store(g, bf, dp, r * S, S);
    }
}
