/* quantize.h — the offline/in-memory quantiser: float32 weights → every kiln_wformat, in the
 * on-disk conventions kiln loads (and vLLM / SGLang / llama.cpp read).
 *
 * Conventions (W is [rows = out_features, cols = in_features], row-major):
 *
 *   FP8_BLOCK  (DeepSeek-V3 / GLM-FP8 "fp8" with weight_block_size [B, B], B = 128 by default)
 *     per B×B block (partial at the right and bottom edges): amax = max |w|,
 *     scale_inv = max(amax / 448, FLT_EPSILON) as float32 (the FLT_EPSILON floor keeps an all-zero
 *     block's scale positive, as compressed-tensors clamps its scales);
 *     q = E4M3FN(w / scale_inv) with f32 division, round-to-nearest-even, saturating to ±448,
 *     never NaN. data: uint8 [rows, cols]; scales: float32 [ceil(rows/B), ceil(cols/B)].
 *
 *   INT4_GROUP (compressed-tensors "pack-quantized", symmetric, strategy "group", num_bits 4)
 *     per row and group of G columns: amax = max |w|; scale = max(amax / 7.5, FLT_EPSILON)
 *     (compressed-tensors' calculate_qparams: amax / ((q_max − q_min) / 2) with q ∈ [−8, 7]),
 *     rounded to bf16 (RNE); q = clamp(RNE(w / scale_bf16), −8, 7) with f32 division;
 *     packed: int32 word j of a row holds columns 8j..8j+7, column 8j+i in bits 4i..4i+3 as q + 8
 *     (little-endian bytes: byte c/2, low nibble for even c). data: [rows, cols/8] int32 =
 *     [rows, cols/2] bytes; scales: bf16 [rows, cols/G]. G = 32 or 128 (any G with cols % G == 0
 *     and G % 8 == 0 is accepted; the SIMD kernels take G % 32 == 0).
 *
 *   Q8_0 / Q4_0 (GGUF) exactly as ggml's reference quantize_row_q8_0 / quantize_row_q4_0:
 *     Q8_0: d = amax/127, q = roundf(w · (1/d)) (halves away from zero); block = f16 d + 32 int8.
 *     Q4_0: m = the element of largest |w| (first on ties), d = m / −8, q = min(15, (int)(w/d + 8.5))
 *     (truncation); block = f16 d + 16 bytes (element i low nibble of byte i, i+16 high nibble).
 *
 *   F32 / F16 / BF16: element-wise, round-to-nearest-even.
 *
 * Ownership: every output buffer is malloc'ed and owned by the caller (free()). Inputs that are
 * not finite are rejected (KILN_ERR_INVALID_ARG naming the row and column) for FP8/INT4/Q8/Q4. */
#ifndef KILN_QUANT_QUANTIZE_H
#define KILN_QUANT_QUANTIZE_H
#include "kiln.h"
#include "kernels/gemv.h"
#include <stdint.h>

#define KILN_FP8_MAX 448.0f

/* f32 → FP8 E4M3FN, RNE, saturating to ±448, NaN → 0x7F: bit-identical to kiln_f32_to_fp8_e4m3
 * (base/fp.h) but without the table search. */
uint8_t kiln_fp8_from_f32_fast(float f);

/* W[rows, cols] → FP8 with block×block scales (block > 0; 128 is the checkpoint convention). */
kiln_status kiln_quantize_fp8_block(const float *W, int64_t rows, int64_t cols, int block, uint8_t **data,
                                    float **scale_inv);
/* W[rows, cols] → INT4 pack-quantized with bf16 group scales. */
kiln_status kiln_quantize_int4_group(const float *W, int64_t rows, int64_t cols, int group, uint8_t **packed,
                                     uint16_t **scales);
/* One row of n (n % 32 == 0) values into n/32 GGUF blocks (34 or 18 bytes each). */
void kiln_quantize_row_q8_0(const float *x, uint8_t *out, int64_t n);
void kiln_quantize_row_q4_0(const float *x, uint8_t *out, int64_t n);

/* Re-encodes a weight of any format kiln reads (dequantised row by row with the reference
 * kiln_weight_row_f32, never expanded whole) into dst_fmt. `group`: the INT4 group size, or the FP8
 * block size (0 = 128 for FP8; ignored for other formats). Rows are processed in parallel (OpenMP).
 * On success *dst describes the new weight; its data and scales live in *owned_data and
 * *owned_scales (NULL when the format has none), malloc'ed, owned by the caller. On failure nothing
 * is allocated and *dst is untouched. */
kiln_status kiln_quantize_weight(const kiln_weight *src, kiln_wformat dst_fmt, int group, kiln_weight *dst,
                                 void **owned_data, void **owned_scales);
/* A --weights name (kiln bench, kiln eval, requantisation) → format and group: f32, bf16, fp8
 * (128×128 blocks), int4 / int4-g32, int4-g128, q8_0, q4_0 (GGUF blocks of 32). -1 for any other
 * name. KILN_WEIGHTS_NAMES lists them for messages. */
#define KILN_WEIGHTS_NAMES "f32, bf16, fp8, int4 (= int4-g32), int4-g128, q8_0, q4_0"
int kiln_weights_name_parse(const char *name, kiln_wformat *fmt, int *group);
#endif
