/* kquant.c — reference dequantization of the GGUF block quants (kernels/kquant.h). */
#include "kernels/kquant.h"
#include "base/fp.h"
#include <stdint.h>
#include <string.h>

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kiln_f16_to_f32(h);
}

/* The K-quants, exactly as ggml's dequantize_row_q4_K / _q5_K / _q6_K compute them (float32,
 * products and differences rounded one by one, in their order). Sub-block j's 6-bit scale and min
 * (Q4_K / Q5_K) are packed into 12 bytes: j < 4: scale = s[j] & 63, min = s[j+4] & 63; else the low
 * 4 bits from s[j+4] (scale: low nibble, min: high nibble) and the top 2 from s[j-4] >> 6 (scale) and
 * s[j] >> 6 (min). */
void kiln_kq_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
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
        kiln_kq_scale_min(is, sc6, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        kiln_kq_scale_min(is + 1, sc6, &sc, &m);
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
void kiln_q4_k_to_f32(const void *s, float *d, size_t n) {
    for (size_t b = 0; b < n / 256; b++) qk45_to_f32((const uint8_t *)s + 144 * b, d + 256 * b, 0);
}
void kiln_q5_k_to_f32(const void *s, float *d, size_t n) {
    for (size_t b = 0; b < n / 256; b++) qk45_to_f32((const uint8_t *)s + 176 * b, d + 256 * b, 1);
}
void kiln_q6_k_to_f32(const void *s, float *dst, size_t n) {
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

/* Q2_K (84 bytes per 256): 16 scale bytes (low nibble: scale, high nibble: min, one pair per 16
 * weights), 64 bytes of 2-bit quants, f16 d, f16 dmin. Weight e lives in byte 32·(e / 128) + e % 32
 * of the quants at bit 2·((e % 128) / 32); its group of 16 is e / 16. w = (d·sc)·q − dmin·m. */
void kiln_q2_k_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 256; b++) {
        const uint8_t *p = (const uint8_t *)s + 84 * b, *qs = p + 16;
        const float d = f16_at(p + 80), dmin = f16_at(p + 82);
        float *y = dst + 256 * b;
        for (int g = 0; g < 16; g++) {
            const float dl = d * (float)(p[g] & 0xF), ml = dmin * (float)(p[g] >> 4);
            const uint8_t *q = qs + 32 * (g / 8) + 16 * (g % 2);
            const int shift = 2 * ((g % 8) / 2);
            for (int l = 0; l < 16; l++) {
                const float v = dl * (float)((q[l] >> shift) & 3);
                y[16 * g + l] = v - ml;
            }
        }
    }
}

/* Q3_K (110 bytes per 256): 32 bytes of high bits, 64 bytes of 2-bit low quants (placed as Q2_K's),
 * 12 bytes of 16 packed 6-bit scales, f16 d. Weight e's high bit is bit (e / 32) of byte e % 32; a
 * clear bit subtracts 4 (q in −4..3). Scale of group g (0..15): low 4 bits from byte g (g < 8, low
 * nibble) or byte g − 8 (high nibble), top 2 bits from byte 8 + g % 4 at bit 2·(g / 4); stored + 32.
 * w = (d·(sc − 32))·q. */
void kiln_q3_k_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 256; b++) {
        const uint8_t *p = (const uint8_t *)s + 110 * b, *hm = p, *qs = p + 32, *sc = p + 96;
        const float d = f16_at(p + 108);
        float *y = dst + 256 * b;
        for (int g = 0; g < 16; g++) {
            const int lo = g < 8 ? sc[g] & 0xF : sc[g - 8] >> 4, hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
            const float dl = d * (float)((lo | hi << 4) - 32);
            const int half = g / 8, j = (g % 8) / 2, o = 16 * (g % 2);
            const uint8_t *q = qs + 32 * half;
            const uint8_t bit = (uint8_t)(1u << (4 * half + j));
            for (int l = o; l < o + 16; l++) {
                const int v = ((q[l] >> (2 * j)) & 3) - ((hm[l] & bit) ? 0 : 4);
                y[16 * g + l - o] = dl * (float)v;
            }
        }
    }
}

/* Q8_K (292 bytes per 256): f32 d, 256 int8 quants, 16 int16 group sums (unused here). w = d·q. */
void kiln_q8_k_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 256; b++) {
        const uint8_t *p = (const uint8_t *)s + 292 * b;
        float d;
        memcpy(&d, p, 4);
        for (int i = 0; i < 256; i++) dst[256 * b + i] = d * (float)(int8_t)p[4 + i];
    }
}

/* The 16 non-linear levels of IQ4_NL / IQ4_XS (ggml-common.h's kvalues_iq4nl). */
static const int8_t iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* IQ4_XS (136 bytes per 256): f16 d, u16 of 2-bit scale highs (sub-block j at bit 2j), 4 bytes of
 * 4-bit scale lows (sub-block j: byte j / 2, low nibble for even j), 128 bytes of nibbles, 16 per
 * sub-block of 32 (element i: low nibble of byte i, element i + 16: high nibble). Scale stored + 32.
 * w = (d·(sc − 32))·level[q]. */
void kiln_iq4_xs_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 256; b++) {
        const uint8_t *p = (const uint8_t *)s + 136 * b;
        const float d = f16_at(p);
        const unsigned sh = (unsigned)p[2] | (unsigned)p[3] << 8;
        float *y = dst + 256 * b;
        for (int j = 0; j < 8; j++) {
            const int ls = ((p[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (int)((sh >> (2 * j)) & 3) << 4;
            const float dl = d * (float)(ls - 32);
            const uint8_t *q = p + 8 + 16 * j;
            for (int i = 0; i < 16; i++) {
                y[32 * j + i] = dl * (float)iq4_levels[q[i] & 0xF];
                y[32 * j + i + 16] = dl * (float)iq4_levels[q[i] >> 4];
            }
        }
    }
}

/* The blocks of 32: element i (0..15) is the low nibble of quant byte i, element i + 16 its high
 * nibble; Q5_0 / Q5_1 add a fifth bit, element i's being bit i of the 32-bit little-endian qh.
 *   Q4_1 (20 bytes): f16 d, f16 m, 16 nibble bytes; w = q·d + m;
 *   Q5_0 (22 bytes): f16 d, qh, 16 nibble bytes; w = (q − 16)·d;
 *   Q5_1 (24 bytes): f16 d, f16 m, qh, 16 nibble bytes; w = q·d + m;
 *   IQ4_NL (18 bytes): f16 d, 16 nibble bytes; w = d·level[q]. */
void kiln_q4_1_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 32; b++) {
        const uint8_t *p = (const uint8_t *)s + 20 * b, *q = p + 4;
        const float d = f16_at(p), m = f16_at(p + 2);
        for (int i = 0; i < 16; i++) {
            const float v0 = (float)(q[i] & 0xF) * d, v1 = (float)(q[i] >> 4) * d;
            dst[32 * b + i] = v0 + m;
            dst[32 * b + i + 16] = v1 + m;
        }
    }
}
static uint32_t u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
void kiln_q5_0_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 32; b++) {
        const uint8_t *p = (const uint8_t *)s + 22 * b, *q = p + 6;
        const float d = f16_at(p);
        const uint32_t qh = u32_at(p + 2);
        for (int i = 0; i < 16; i++) {
            const int x0 = (int)((q[i] & 0xF) | ((qh >> i) & 1) << 4) - 16;
            const int x1 = (int)((q[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - 16;
            dst[32 * b + i] = (float)x0 * d;
            dst[32 * b + i + 16] = (float)x1 * d;
        }
    }
}
void kiln_q5_1_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 32; b++) {
        const uint8_t *p = (const uint8_t *)s + 24 * b, *q = p + 8;
        const float d = f16_at(p), m = f16_at(p + 2);
        const uint32_t qh = u32_at(p + 4);
        for (int i = 0; i < 16; i++) {
            const float v0 = (float)((q[i] & 0xF) | ((qh >> i) & 1) << 4) * d;
            const float v1 = (float)((q[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) * d;
            dst[32 * b + i] = v0 + m;
            dst[32 * b + i + 16] = v1 + m;
        }
    }
}
void kiln_iq4_nl_to_f32(const void *s, float *dst, size_t n) {
    for (size_t b = 0; b < n / 32; b++) {
        const uint8_t *p = (const uint8_t *)s + 18 * b, *q = p + 2;
        const float d = f16_at(p);
        for (int i = 0; i < 16; i++) {
            dst[32 * b + i] = d * (float)iq4_levels[q[i] & 0xF];
            dst[32 * b + i + 16] = d * (float)iq4_levels[q[i] >> 4];
        }
    }
}
