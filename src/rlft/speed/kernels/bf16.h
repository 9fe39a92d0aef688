/* bf16 <-> fp32 for the kernels: bf16 is the top half of an fp32, rounded to nearest even as
 * PyTorch rounds (a NaN stays a NaN). */
#ifndef RLFT_BF16_H
#define RLFT_BF16_H
#include <stdint.h>
#include <string.h>

static inline float bf_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f_to_bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? ((u >> 16) | 0x40u) : rounded); /* NaN stays NaN */
}

#endif
