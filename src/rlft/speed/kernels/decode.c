/* A decode token through every layer of a Llama-family model in one call, on rlft's thin bf16 matmul.
 *
 * The fused decode step (rlft.speed.fused_decode) runs eight native calls a layer: four matmuls and
 * the attention, norm and activation kernels between them. Made from Python, each call costs
 * argument checks and a ctypes crossing, ~3 ms a token over SmolLM2's 30 layers at 16 rows (a seventh
 * of the step). This loop makes the same calls, in the same order on the same buffers, from C: the
 * outputs are bit-identical to the per-call path's. Used where every layer matmul is the thin kernel
 * and no projection has a bias.
 *
 * Layout: x [B, hidden] fp32, the residual stream, updated in place; per layer, the packed weights
 * (gemm.c) of the fused q/k/v, o, fused gate/up and down projections and the two RMSNorm weights;
 * the KV cache [layers][B][KVH][A][D] bf16; scratch laid out by rlft_decode_scratch_elements.
 * On return, `out` [B, hidden] bf16 holds the final norm's output, the LM head's input.
 */
#include <stdint.h>

void rlft_gemm_bf16(const uint16_t *x, int M, int K, const uint16_t *packed, int N, uint16_t *y, int threads);
void rlft_rms_norm(const float *x, const float *w, float eps, int rows, int dim, void *out, int bf, int threads);
void rlft_add_rms_norm(float *x, const void *y, const float *w, float eps, int rows, int dim, void *out, int bf,
                       int threads);
void rlft_silu_mul(const void *gate_up, int rows, int inter, void *out, int bf, int threads);
void rlft_decode_attention(const void *qkv, const float *cos, const float *sin, void *k_cache, void *v_cache,
                           const uint8_t *valid, int B, int H, int KVH, int D, int A, int col, void *out, int bf,
                           int threads);

/* bf16 elements of scratch the loop needs: q/k/v, attention output, a projection's output, gate/up */
int64_t rlft_decode_scratch_elements(int B, int hidden, int H, int KVH, int D, int inter) {
    return (int64_t)B * ((H + 2 * KVH) * D + H * D + hidden + 2 * inter + inter);
}

void rlft_decode_layers_bf16(float *x, int B, int hidden, int layers, const uint16_t *const *qkv_w,
                             const uint16_t *const *o_w, const uint16_t *const *gate_up_w,
                             const uint16_t *const *down_w, const float *const *ln1, const float *const *ln2,
                             const float *final_norm, float eps, const float *cos, const float *sin,
                             uint16_t *k_cache, uint16_t *v_cache, const uint8_t *valid, int H, int KVH, int D,
                             int A, int col, int inter, uint16_t *scratch, uint16_t *out, int threads) {
    int qkv_n = (H + 2 * KVH) * D;
    int64_t layer_cache = (int64_t)B * KVH * A * D;
    uint16_t *qkv = scratch, *attn = qkv + (int64_t)B * qkv_n, *proj = attn + (int64_t)B * H * D;
    uint16_t *gate_up = proj + (int64_t)B * hidden, *act = gate_up + (int64_t)B * 2 * inter;
    rlft_rms_norm(x, ln1[0], eps, B, hidden, out, 1, threads);
    for (int i = 0; i < layers; i++) {
        rlft_gemm_bf16(out, B, hidden, qkv_w[i], qkv_n, qkv, threads);
        rlft_decode_attention(qkv, cos, sin, k_cache + i * layer_cache, v_cache + i * layer_cache, valid, B, H, KVH,
                              D, A, col, attn, 1, threads);
        rlft_gemm_bf16(attn, B, H * D, o_w[i], hidden, proj, threads);
        rlft_add_rms_norm(x, proj, ln2[i], eps, B, hidden, out, 1, threads);
        rlft_gemm_bf16(out, B, hidden, gate_up_w[i], 2 * inter, gate_up, threads);
        rlft_silu_mul(gate_up, B, inter, act, 1, threads);
        rlft_gemm_bf16(act, B, inter, down_w[i], hidden, proj, threads);
        rlft_add_rms_norm(x, proj, i + 1 < layers ? ln1[i + 1] : final_norm, eps, B, hidden, out, 1, threads);
    }
}
