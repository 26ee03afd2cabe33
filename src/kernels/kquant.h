/* kquant.h — the GGUF block quants kiln multiplies through f32 tiles: reference dequantization of n
 * values from src to float32, exactly as ggml's dequantize_row_* computes them (each product and
 * difference rounded to float32 on its own, in ggml's order). Byte layouts in quant/dtype.h. Used by
 * the dtype table (quant/dtype.c), the scalar reference (kernels/ref.c) and the driver's f32 tiles.
 *
 * K-quant super-blocks of 256 (n a multiple of 256): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, and
 * Q8_K (ggml's activation-side type, dequantized here only so that the dtype table is complete);
 * blocks of 32 (n a multiple of 32): Q4_1, Q5_0, Q5_1, IQ4_NL. */
#ifndef KILN_KERNELS_KQUANT_H
#define KILN_KERNELS_KQUANT_H
#include <stddef.h>
#include <stdint.h>

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
#endif
