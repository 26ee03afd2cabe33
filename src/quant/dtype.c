/* dtype.c — the dtype table rows and their scalar reference dequantizers. */
#include "quant/dtype.h"
#include "base/fp.h"
#include "kernels/kquant.h"
#include <string.h>

static void f32_to_f32(const void *s, float *d, size_t n) { memcpy(d, s, n * 4); }
static void f16_to_f32(const void *s, float *d, size_t n) {
    const uint8_t *p = s;
    for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); d[i] = kiln_f16_to_f32(h); }
}
static void bf16_to_f32(const void *s, float *d, size_t n) {
    const uint8_t *p = s;
    for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); d[i] = kiln_bf16_to_f32(h); }
}
static void fp8_to_f32(const void *s, float *d, size_t n) {
    const uint8_t *p = s;
    for (size_t i = 0; i < n; i++) d[i] = kiln_fp8_e4m3_to_f32(p[i]);
}
static void q8_0_to_f32(const void *s, float *d, size_t n) {
    const uint8_t *p = s;
    for (size_t b = 0; b < n / 32; b++, p += 34) {
        uint16_t h; memcpy(&h, p, 2);
        float sc = kiln_f16_to_f32(h);
        for (int i = 0; i < 32; i++) d[b * 32 + i] = sc * (float)(int8_t)p[2 + i];
    }
}
static void q4_0_to_f32(const void *s, float *d, size_t n) {
    /* ggml layout: element i (0..15) is the low nibble of byte i, element i+16 the high nibble. */
    const uint8_t *p = s;
    for (size_t b = 0; b < n / 32; b++, p += 18) {
        uint16_t h; memcpy(&h, p, 2);
        float sc = kiln_f16_to_f32(h);
        for (int i = 0; i < 16; i++) {
            d[b * 32 + i] = sc * (float)((p[2 + i] & 15) - 8);
            d[b * 32 + i + 16] = sc * (float)((p[2 + i] >> 4) - 8);
        }
    }
}
static void f64_to_f32(const void *s, float *d, size_t n) {
    const uint8_t *p = s;
    for (size_t i = 0; i < n; i++) { double v; memcpy(&v, p + 8 * i, 8); d[i] = (float)v; }
}

static const kiln_dtype_info table[KILN_DT_COUNT] = {
    [KILN_DT_F32] = {"f32", "F32", 0, 1, 4, f32_to_f32},
    [KILN_DT_F16] = {"f16", "F16", 1, 1, 2, f16_to_f32},
    [KILN_DT_BF16] = {"bf16", "BF16", 30, 1, 2, bf16_to_f32},
    [KILN_DT_F8_E4M3] = {"fp8_e4m3", "F8_E4M3", -1, 1, 1, fp8_to_f32},
    [KILN_DT_I8] = {"i8", "I8", 24, 1, 1, NULL},
    [KILN_DT_U8] = {"u8", "U8", -1, 1, 1, NULL},
    [KILN_DT_I16] = {"i16", "I16", 25, 1, 2, NULL},
    [KILN_DT_I32] = {"i32", "I32", 26, 1, 4, NULL},
    [KILN_DT_I64] = {"i64", "I64", 27, 1, 8, NULL},
    [KILN_DT_F64] = {"f64", "F64", 28, 1, 8, f64_to_f32},
    [KILN_DT_BOOL] = {"bool", "BOOL", -1, 1, 1, NULL},
    [KILN_DT_Q8_0] = {"q8_0", NULL, 8, 32, 34, q8_0_to_f32},
    [KILN_DT_Q4_0] = {"q4_0", NULL, 2, 32, 18, q4_0_to_f32},
    [KILN_DT_Q4_K] = {"q4_k", NULL, 12, 256, 144, kiln_q4_k_to_f32},
    [KILN_DT_Q5_K] = {"q5_k", NULL, 13, 256, 176, kiln_q5_k_to_f32},
    [KILN_DT_Q6_K] = {"q6_k", NULL, 14, 256, 210, kiln_q6_k_to_f32},
    [KILN_DT_Q2_K] = {"q2_k", NULL, 10, 256, 84, kiln_q2_k_to_f32},
    [KILN_DT_Q3_K] = {"q3_k", NULL, 11, 256, 110, kiln_q3_k_to_f32},
    [KILN_DT_IQ4_XS] = {"iq4_xs", NULL, 23, 256, 136, kiln_iq4_xs_to_f32},
    [KILN_DT_Q4_1] = {"q4_1", NULL, 3, 32, 20, kiln_q4_1_to_f32},
    [KILN_DT_Q5_0] = {"q5_0", NULL, 6, 32, 22, kiln_q5_0_to_f32},
    [KILN_DT_Q5_1] = {"q5_1", NULL, 7, 32, 24, kiln_q5_1_to_f32},
    [KILN_DT_IQ4_NL] = {"iq4_nl", NULL, 20, 32, 18, kiln_iq4_nl_to_f32},
    [KILN_DT_Q8_K] = {"q8_k", NULL, 15, 256, 292, kiln_q8_k_to_f32},
};

/* ggml's type ids (ggml.h's enum ggml_type) up to the newest kiln knows of. Gaps are ids ggml
 * removed (Q4_2 / Q4_3, the Q4_0_4_4 / IQ4_NL_4_4 repacks): files can no longer hold them. */
static const char *const ggml_names[] = {
    [0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [6] = "Q5_0", [7] = "Q5_1", [8] = "Q8_0", [9] = "Q8_1",
    [10] = "Q2_K", [11] = "Q3_K", [12] = "Q4_K", [13] = "Q5_K", [14] = "Q6_K", [15] = "Q8_K", [16] = "IQ2_XXS",
    [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S", [23] = "IQ4_XS",
    [24] = "I8", [25] = "I16", [26] = "I32", [27] = "I64", [28] = "F64", [29] = "IQ1_M", [30] = "BF16", [34] = "TQ1_0",
    [35] = "TQ2_0", [39] = "MXFP4", [40] = "NVFP4", [41] = "Q1_0",
};
const char *kiln_ggml_type_name(int t) {
    return t >= 0 && t < (int)(sizeof ggml_names / sizeof ggml_names[0]) ? ggml_names[t] : NULL;
}

const kiln_dtype_info *kiln_dtype_get(kiln_dtype dt) {
    return (unsigned)dt < KILN_DT_COUNT ? &table[dt] : NULL;
}
int kiln_dtype_from_st_name(const char *s) {
    for (int i = 0; i < KILN_DT_COUNT; i++)
        if (table[i].st_name && strcmp(table[i].st_name, s) == 0) return i;
    return -1;
}
int kiln_dtype_from_gguf(int t) {
    for (int i = 0; i < KILN_DT_COUNT; i++)
        if (table[i].gguf_type == t) return i;
    return -1;
}
int kiln_dtype_from_name(const char *s) {
    for (int i = 0; i < KILN_DT_COUNT; i++)
        if (strcmp(table[i].name, s) == 0) return i;
    return -1;
}
size_t kiln_dtype_nbytes(kiln_dtype dt, uint64_t n) {
    const kiln_dtype_info *d = kiln_dtype_get(dt);
    if (!d || n % (uint64_t)d->block_elems) return 0;
    return (size_t)(n / (uint64_t)d->block_elems * (uint64_t)d->block_bytes);
}
