/* dtype.c — the dtype table rows and their scalar reference dequantizers. */
#include "quant/dtype.h"
#include "base/fp.h"
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
/* The K-quants, exactly as ggml's dequantize_row_q4_K / _q5_K / _q6_K compute them (float32,
 * products and differences rounded one by one, in their order). Sub-block j's 6-bit scale and min
 * (Q4_K / Q5_K) are packed into 12 bytes: j < 4: scale = s[j] & 63, min = s[j+4] & 63; else the low
 * 4 bits from s[j+4] (scale: low nibble, min: high nibble) and the top 2 from s[j-4] >> 6 (scale) and
 * s[j] >> 6 (min). */
static void k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}
static void qk45_to_f32(const uint8_t *p, float *y, int five) {
    uint16_t h;
    memcpy(&h, p, 2);
    const float d = kiln_f16_to_f32(h);
    memcpy(&h, p + 2, 2);
    const float dmin = kiln_f16_to_f32(h);
    const uint8_t *sc6 = p + 4, *qh = p + 16, *ql = p + (five ? 48 : 16);
    for (int j = 0, is = 0; j < 256; j += 64, is += 2) {
        uint8_t sc, m;
        k_scale_min(is, sc6, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        k_scale_min(is + 1, sc6, &sc, &m);
        const float d2 = d * sc, m2 = dmin * m;
        const int u1 = 1 << (j / 32), u2 = 2 << (j / 32);
        for (int l = 0; l < 32; l++) {
            const int hi = five && (qh[l] & u1) ? 16 : 0;
            const float v = d1 * (float)((ql[l] & 0xF) + hi);
            *y++ = v - m1;
        }
        for (int l = 0; l < 32; l++) {
            const int hi = five && (qh[l] & u2) ? 16 : 0;
            const float v = d2 * (float)((ql[l] >> 4) + hi);
            *y++ = v - m2;
        }
        ql += 32;
    }
}
static void q4_k_to_f32(const void *s, float *d, size_t n) {
    for (size_t b = 0; b < n / 256; b++) qk45_to_f32((const uint8_t *)s + 144 * b, d + 256 * b, 0);
}
static void q5_k_to_f32(const void *s, float *d, size_t n) {
    for (size_t b = 0; b < n / 256; b++) qk45_to_f32((const uint8_t *)s + 176 * b, d + 256 * b, 1);
}
static void q6_k_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 256; b++) {
        const uint8_t *p = (const uint8_t *)s + 210 * b, *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        uint16_t h;
        memcpy(&h, p + 208, 2);
        const float d = kiln_f16_to_f32(h);
        float *y = dst + 256 * b;
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
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
    [KILN_DT_Q4_K] = {"q4_k", NULL, 12, 256, 144, q4_k_to_f32},
    [KILN_DT_Q5_K] = {"q5_k", NULL, 13, 256, 176, q5_k_to_f32},
    [KILN_DT_Q6_K] = {"q6_k", NULL, 14, 256, 210, q6_k_to_f32},
};

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
