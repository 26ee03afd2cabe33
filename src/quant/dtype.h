/* dtype.h — the one dtype table: every storage type kiln knows, for weights and the KV cache.
 *
 * Element dtypes (F32, F16, BF16, F8_E4M3, integers) describe raw tensors as files store them.
 * Block dtypes (GGUF's Q8_0, Q4_0, K-quants ...) carry their scales inside each block. Scaled formats whose
 * scales live in a separate tensor (FP8 with 128×128 block scales, INT4 group-symmetric) are
 * described by kiln_weight (kernels/gemv.h), which pairs the data tensor with its scale tensor. */
#ifndef KILN_QUANT_DTYPE_H
#define KILN_QUANT_DTYPE_H
#include <stddef.h>
#include <stdint.h>

typedef enum kiln_dtype {
    KILN_DT_F32 = 0,
    KILN_DT_F16,
    KILN_DT_BF16,
    KILN_DT_F8_E4M3,
    KILN_DT_I8,
    KILN_DT_U8,
    KILN_DT_I16,
    KILN_DT_I32,
    KILN_DT_I64,
    KILN_DT_F64,
    KILN_DT_BOOL,
    KILN_DT_Q8_0, /* GGUF: 32 weights per block = f16 scale + 32 × int8 (34 bytes) */
    KILN_DT_Q4_0, /* GGUF: 32 weights per block = f16 scale + 16 bytes of nibbles, value-8 (18 bytes) */
    /* GGUF K-quants: super-blocks of 256 weights (ggml-common.h's block_q4_K / _q5_K / _q6_K):
     *   Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32,
     *     128 bytes of nibbles; w = d·sc·q − dmin·m;
     *   Q5_K (176 bytes): as Q4_K plus 32 bytes of high bits (q 0..31) before the nibbles;
     *   Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one per 16
     *     weights), f16 d; w = d·sc·(q − 32). */
    KILN_DT_Q4_K,
    KILN_DT_Q5_K,
    KILN_DT_Q6_K,
    /* The rest of llama-quantize's weight types (layouts in kernels/kquant.c, beside their reference
     * dequantization; int8-dot kernels in kernels/gemv_*.c):
     *   Q2_K (84 bytes / 256), Q3_K (110 / 256), IQ4_XS (136 / 256): super-blocks as above;
     *   Q4_1 (20 / 32), Q5_0 (22 / 32), Q5_1 (24 / 32), IQ4_NL (18 / 32): blocks of 32 as Q4_0;
     *   Q8_K (292 / 256): ggml's activation-side type (f32 d, 256 int8, 16 int16 sums); read and
     *     dequantized, but refused as a weight matrix (llama.cpp never stores weights in it). */
    KILN_DT_Q2_K,
    KILN_DT_Q3_K,
    KILN_DT_IQ4_XS,
    KILN_DT_Q4_1,
    KILN_DT_Q5_0,
    KILN_DT_Q5_1,
    KILN_DT_IQ4_NL,
    KILN_DT_Q8_K,
    KILN_DT_COUNT
} kiln_dtype;

typedef struct kiln_dtype_info {
    const char *name;          /* kiln's name: "f32", "bf16", "fp8_e4m3", "q4_0" ... */
    const char *st_name;       /* safetensors dtype string, NULL when safetensors has none */
    int gguf_type;             /* ggml_type number, -1 when GGUF has none */
    int block_elems;           /* elements per block (1 for element dtypes) */
    int block_bytes;           /* bytes per block */
    /* Reference dequantization of n elements (n a multiple of block_elems) to float32. NULL for
     * integer dtypes that are not numeric weights. */
    void (*to_f32)(const void *src, float *dst, size_t n);
} kiln_dtype_info;

const kiln_dtype_info *kiln_dtype_get(kiln_dtype dt);
/* Lookups; return -1 when unknown. */
int kiln_dtype_from_st_name(const char *s);
int kiln_dtype_from_gguf(int ggml_type);
int kiln_dtype_from_name(const char *s);
/* ggml's name of ggml type id t ("Q4_K", "IQ2_XXS", "TQ1_0" ...) for every id ggml has, kiln reads it
 * or not; NULL for an id ggml does not have (removed ones such as 4, 5, 31..33, 36..38 included). */
const char *kiln_ggml_type_name(int t);
/* Bytes for n elements (n must be a multiple of the block size; returns 0 otherwise). */
size_t kiln_dtype_nbytes(kiln_dtype dt, uint64_t n);
#endif
