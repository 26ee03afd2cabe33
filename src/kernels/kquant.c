/* kquant.c — reference dequantization of the GGUF K-quants (kernels/kquant.h). */
#include "kernels/kquant.h"
#include "base/fp.h"
#include <stdint.h>
#include <string.h>

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
