/* kquant.h — the GGUF block quants' reference dequantization: n values from src to float32, exactly
 * as ggml's dequantize_row_* computes them (each product and difference rounded to float32 on its
 * own, in ggml's order). Byte layouts in quant/dtype.h. Used by the dtype table (quant/dtype.c) and
 * the scalar reference (kernels/ref.c); the SIMD kernels (gemv_*.c) multiply int8 dots instead.
 *
 * K-quant super-blocks of 256 (n a multiple of 256): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, and
 * Q8_K (ggml's activation-side type, dequantized here only so that the dtype table is complete);
 * blocks of 32 (n a multiple of 32): Q4_1, Q5_0, Q5_1, IQ4_NL. */
#ifndef KILN_KERNELS_KQUANT_H
#define KILN_KERNELS_KQUANT_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Q4_K / Q5_K: sub-block j's (0..7) 6-bit scale and min from the 12 packed bytes s (ggml's
 * get_scale_min_k4). */
void kiln_kq_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m);

void kiln_q2_k_to_f32(const void *src, float *dst, size_t n);
void kiln_q3_k_to_f32(const void *src, float *dst, size_t n);
void kiln_q4_k_to_f32(const void *src, float *dst, size_t n);
void kiln_q5_k_to_f32(const void *src, float *dst, size_t n);
void kiln_q6_k_to_f32(const void *src, float *dst, size_t n);
void kiln_q8_k_to_f32(const void *src, float *dst, size_t n);
void kiln_iq4_xs_to_f32(const void *src, float *dst, size_t n);
void kiln_q4_1_to_f32(const void *src, float *dst, size_t n);
void kiln_q5_0_to_f32(const void *src, float *dst, size_t n);
void kiln_q5_1_to_f32(const void *src, float *dst, size_t n);
void kiln_iq4_nl_to_f32(const void *src, float *dst, size_t n);
/* Packed sub-block scales as bytes, for the int8-dot kernels (64-bit arithmetic only: the same on
 * every ISA; pdep would do it in fewer steps but is microcoded on AMD Zen 1/2).
 * Q3_K: the 16 6-bit scales minus 32 (int8), groups 0-7 in *lo, 8-15 in *hi (byte g % 8). */
static inline uint64_t kiln_kq_bytes_minus32(uint64_t v) { /* bytes 0..63 → (int8)(v − 32) */
    return ((v | 0x8080808080808080ull) - 0x2020202020202020ull) ^ 0x8080808080808080ull;
}
static inline void kiln_q3k_scales16(const uint8_t *s, uint64_t *lo, uint64_t *hi) {
    uint64_t a;
    uint32_t t;
    memcpy(&a, s, 8);
    memcpy(&t, s + 8, 4);
    const uint64_t m4 = 0x0F0F0F0F0F0F0F0Full, m2 = 0x0303030303030303ull;
    const uint64_t t01 = (uint64_t)t | (uint64_t)(t >> 2) << 32, t23 = (uint64_t)(t >> 4) | (uint64_t)(t >> 6) << 32;
    *lo = kiln_kq_bytes_minus32((a & m4) | (t01 & m2) << 4);
    *hi = kiln_kq_bytes_minus32(((a >> 4) & m4) | (t23 & m2) << 4);
}
/* IQ4_XS: the 8 sub-block scales minus 32 (int8), byte j = sub-block j: low 4 bits from nibble j of
 * the 4 bytes at s + 2, high 2 bits from bits 2j, 2j + 1 of the u16 at s (s = block + 2). */
static inline uint64_t kiln_iq4xs_scales8(const uint8_t *s) {
    uint32_t sl;
    memcpy(&sl, s + 2, 4);
    uint64_t x = sl, y = (uint64_t)s[0] | (uint64_t)s[1] << 8;
    x = (x | x << 16) & 0x0000FFFF0000FFFFull;
    x = (x | x << 8) & 0x00FF00FF00FF00FFull;
    x = (x | x << 4) & 0x0F0F0F0F0F0F0F0Full;
    y = (y | y << 24) & 0x000000FF000000FFull;
    y = (y | y << 12) & 0x000F000F000F000Full;
    y = (y | y << 6) & 0x0303030303030303ull;
    return kiln_kq_bytes_minus32(x | y << 4);
}
#endif
