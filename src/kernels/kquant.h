/* kquant.h — the GGUF K-quant super-blocks of 256 weights (ggml-common.h's block_q4_K / _q5_K /
 * _q6_K; byte layouts in quant/dtype.h): reference dequantization of n values (n a multiple of 256)
 * from src to float32, exactly as ggml's dequantize_row_*_K computes them. Used by the dtype table
 * (quant/dtype.c), the scalar reference (kernels/ref.c) and the driver's f32 tiles. */
#ifndef KILN_KERNELS_KQUANT_H
#define KILN_KERNELS_KQUANT_H
#include <stddef.h>
#include <stdint.h>

/* Q4_K / Q5_K: sub-block j's (0..7) 6-bit scale and min from the 12 packed bytes s (ggml's
 * get_scale_min_k4). */
void kiln_kq_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m);

void kiln_q4_k_to_f32(const void *src, float *dst, size_t n);
void kiln_q5_k_to_f32(const void *src, float *dst, size_t n);
void kiln_q6_k_to_f32(const void *src, float *dst, size_t n);
#endif
