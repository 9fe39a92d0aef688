/* A bf16 matmul for the decode step's few rows, on CPUs with AVX512-BF16 and no AMX.
 *
 * A decode step multiplies 1-16 rows by every weight of the model. On a CPU whose bf16 dot product
 * is VDPBF16PS (AVX512-BF16) and has no AMX tiles, oneDNN's kernel for such thin products reached
 * ~45 % of the machine's bf16 peak on SmolLM2's shapes; this one keeps 4 rows x 64 columns of fp32
 * sums in 16 registers and streams the weight once per 4 rows, 1.1-1.3x faster at 16 rows and up
 * to 2x at one (benchmarks in docs/performance.md). With AMX, oneDNN's tile kernels are faster and
 * rlft keeps them (:mod:`rlft.speed.kernels`); without AVX512-BF16 this file builds to a stub that
 * says so.
 *
 * The weight W [N, K] is packed by the caller as [N / 16][K / 2][16][2] (16 output columns, then
 * pairs of the reduction dimension: the operand layout of VDPBF16PS), K even and N a multiple of
 * 16. Sums are fp32 and rounded to bf16 once, at the end, to nearest even (as oneDNN rounds).
 * rlft_pack_bf16 writes that layout straight from the fp32 master weights, in one pass and into
 * the buffer of the previous step: a weight refresh reads each weight once and allocates nothing.
 */
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bf16.h"

/* rows row0 .. row0 + rows - 1 of W [N, K] into `packed` (the layout above), from src [rows, K]:
 * fp32 rounded to bf16 like PyTorch's cast, or bf16 (src_bf) copied; any architecture */
void rlft_pack_bf16(const void *src, int src_bf, int rows, int K, int row0, uint16_t *packed, int threads) {
    int kpairs = K / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && (int64_t)rows * K >= (1 << 16))
    for (int r = 0; r < rows; r++) {
        int n = row0 + r;
        uint16_t *dst = packed + (int64_t)(n / 16) * kpairs * 32 + (n % 16) * 2;
        if (src_bf) {
            const uint16_t *s = (const uint16_t *)src + (int64_t)r * K;
            for (int kp = 0; kp < kpairs; kp++) {
                dst[kp * 32] = s[2 * kp];
                dst[kp * 32 + 1] = s[2 * kp + 1];
            }
        } else {
            const float *s = (const float *)src + (int64_t)r * K;
            for (int kp = 0; kp < kpairs; kp++) {
                dst[kp * 32] = f_to_bf(s[2 * kp]);
                dst[kp * 32 + 1] = f_to_bf(s[2 * kp + 1]);
            }
        }
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

#define RB 4 /* rows of x a micro-kernel takes */
#define CB 4 /* blocks of 16 output columns it takes: RB x CB accumulators, half the vector registers */

int rlft_gemm_bf16_native(void) { return 1; }

/* y [rows, cb * 16] (ldy apart) = x [RB, K] (ldx apart; rows beyond `rows` are read, not written)
 * times the cb packed column blocks at `blocks` (bstride elements apart); meanwhile the column blocks
 * pf0, pf0 + pfs, ... (below pfn) at `next` are prefetched into L2 */
static inline __attribute__((always_inline)) void micro(const uint16_t *x, int64_t ldx, int rows,
                                                        const uint16_t *blocks, int64_t bstride, int kpairs,
                                                        const int cb, uint16_t *y, int64_t ldy,
                                                        const uint16_t *next, int pf0, int pfs, int pfn) {
    __m512 acc[RB][CB];
    for (int r = 0; r < RB; r++)
        for (int c = 0; c < cb; c++) acc[r][c] = _mm512_setzero_ps();
    for (int kp = 0; kp < kpairs; kp++) {
        __m512bh w[CB];
        for (int c = 0; c < cb; c++) w[c] = (__m512bh)_mm512_loadu_si512(blocks + c * bstride + kp * 32);
        for (int c = pf0; c < pfn; c += pfs) _mm_prefetch((const char *)(next + c * bstride + kp * 32), _MM_HINT_T1);
        for (int r = 0; r < RB; r++) {
            int32_t pair;
            memcpy(&pair, x + r * ldx + 2 * kp, 4);
            __m512bh b = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < cb; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], b, w[c]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cb; c++)
            _mm256_storeu_si256((__m256i *)(y + r * ldy + c * 16), (__m256i)_mm512_cvtneps_pbh(acc[r][c]));
}

/* y [M, N] = x [M, K] @ W.T, all bf16, W packed as above; the column blocks split over threads */
void rlft_gemm_bf16(const uint16_t *x, int M, int K, const uint16_t *packed, int N, uint16_t *y, int threads) {
    int nb = N / 16, kpairs = K / 2, full = M / RB * RB, passes = (M + RB - 1) / RB;
    int64_t bstride = (int64_t)kpairs * 32;
    uint16_t tail[RB * K]; /* the last M % RB rows, zero-padded to RB: the micro-kernel reads RB rows */
    if (M > full) {
        memset(tail, 0, sizeof tail);
        memcpy(tail, x + (int64_t)full * K, (size_t)(M - full) * K * 2);
    }
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num(), T = omp_get_num_threads();
#else
        int t = 0, T = 1;
#endif
        int b0 = (int)((int64_t)nb * t / T), b1 = (int)((int64_t)nb * (t + 1) / T);
        for (int b = b0; b < b1; b += CB) {
            int cb = b1 - b < CB ? b1 - b : CB;
            const uint16_t *blocks = packed + (int64_t)b * bstride;
            /* The first pass over a column group would wait on memory for its weights, the others
             * compute from L2. Each pass fetches a share of the next group's weights meanwhile
             * (pass p of P its blocks p, p + P, ... below pfn), so memory and arithmetic
             * overlap in every pass. Against fetching it all in the last pass, SmolLM2's matmuls for
             * a token took 13.3 ms against 16.4 at 16 rows, 10.2 against 11.2 at 8, the same at 1
             * (2-core EPYC, the two builds in turns in one process). */
            const uint16_t *next = blocks + (int64_t)CB * bstride;
            int pfn = b + CB < b1 ? (b1 - b - CB < CB ? b1 - b - CB : CB) : 0;
            for (int m = 0; m < M; m += RB) {
                const uint16_t *xs = m < full ? x + (int64_t)m * K : tail;
                int rows = M - m < RB ? M - m : RB, p = m / RB;
                uint16_t *ys = y + (int64_t)m * N + b * 16;
                /* the column count as a constant, so each micro-kernel's loops unroll into registers */
                if (cb == CB) micro(xs, K, rows, blocks, bstride, kpairs, CB, ys, N, next, p, passes, pfn);
                else if (cb == 3) micro(xs, K, rows, blocks, bstride, kpairs, 3, ys, N, next, p, passes, pfn);
                else if (cb == 2) micro(xs, K, rows, blocks, bstride, kpairs, 2, ys, N, next, p, passes, pfn);
                else micro(xs, K, rows, blocks, bstride, kpairs, 1, ys, N, next, p, passes, pfn);
            }
        }
    }
}
#else
int rlft_gemm_bf16_native(void) { return 0; }

void rlft_gemm_bf16(const uint16_t *x, int M, int K, const uint16_t *packed, int N, uint16_t *y, int threads) {
    (void)x, (void)M, (void)K, (void)packed, (void)N, (void)y, (void)threads;
}
#endif
