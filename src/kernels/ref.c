/* ref.c — the scalar reference kernels: the oracle every SIMD kernel is tested against. Plain C,
 * float32 accumulation in index order. */
#include "kernels/gemv.h"
#include "base/fp.h"
#include "kernels/kquant.h"
#include <string.h>

static float scale_at(const kiln_weight *w, int64_t r, int64_t c) {
    if (w->fmt == KILN_WF_FP8_BLOCK) {
        int64_t sc_cols = (w->cols + w->block - 1) / w->block;
        return ((const float *)w->scales)[(r / w->block) * sc_cols + c / w->block];
    }
    /* INT4_GROUP: bf16 [rows, cols/group] (tile layout: gemv.h) */
    uint16_t h;
    memcpy(&h, (const uint8_t *)w->scales + 2 * kiln_weight_int4_scale_index(w, r, c / w->block), 2);
    return kiln_bf16_to_f32(h);
}

void kiln_weight_row_f32(const kiln_weight *w, int64_t r, float *out) {
    uint8_t gathered[w->tiled ? w->row_bytes : 1];
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    if (w->tiled) {
        kiln_weight_row_gather(w, r, gathered);
        row = gathered;
    }
    int64_t n = w->cols;
    switch (w->fmt) {
    case KILN_WF_F32: memcpy(out, row, (size_t)n * 4); break;
    case KILN_WF_F16:
        for (int64_t c = 0; c < n; c++) { uint16_t h; memcpy(&h, row + 2 * c, 2); out[c] = kiln_f16_to_f32(h); }
        break;
    case KILN_WF_BF16:
        for (int64_t c = 0; c < n; c++) { uint16_t h; memcpy(&h, row + 2 * c, 2); out[c] = kiln_bf16_to_f32(h); }
        break;
    case KILN_WF_FP8_BLOCK:
        for (int64_t c = 0; c < n; c++) out[c] = kiln_fp8_e4m3_to_f32(row[c]) * scale_at(w, r, c);
        break;
    case KILN_WF_INT4_GROUP:
        for (int64_t c = 0; c < n; c++) {
            int q = (row[c / 2] >> (4 * (c & 1))) & 15;
            out[c] = (float)(q - 8) * scale_at(w, r, c);
        }
        break;
    case KILN_WF_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *p = row + 34 * b;
            uint16_t h; memcpy(&h, p, 2);
            float s = kiln_f16_to_f32(h);
            for (int i = 0; i < 32; i++) out[32 * b + i] = s * (float)(int8_t)p[2 + i];
        }
        break;
    case KILN_WF_Q4_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *p = row + 18 * b;
            uint16_t h; memcpy(&h, p, 2);
            float s = kiln_f16_to_f32(h);
            for (int i = 0; i < 16; i++) {
                out[32 * b + i] = s * (float)((p[2 + i] & 15) - 8);
                out[32 * b + i + 16] = s * (float)((p[2 + i] >> 4) - 8);
            }
        }
        break;
    case KILN_WF_Q4_K: kiln_q4_k_to_f32(row, out, (size_t)n); break;
    case KILN_WF_Q5_K: kiln_q5_k_to_f32(row, out, (size_t)n); break;
    case KILN_WF_Q6_K: kiln_q6_k_to_f32(row, out, (size_t)n); break;
    case KILN_WF_Q2_K: kiln_q2_k_to_f32(row, out, (size_t)n); break;
    case KILN_WF_Q3_K: kiln_q3_k_to_f32(row, out, (size_t)n); break;
    case KILN_WF_IQ4_XS: kiln_iq4_xs_to_f32(row, out, (size_t)n); break;
    case KILN_WF_Q4_1: kiln_q4_1_to_f32(row, out, (size_t)n); break;
    case KILN_WF_Q5_0: kiln_q5_0_to_f32(row, out, (size_t)n); break;
    case KILN_WF_Q5_1: kiln_q5_1_to_f32(row, out, (size_t)n); break;
    case KILN_WF_IQ4_NL: kiln_iq4_nl_to_f32(row, out, (size_t)n); break;
    default: memset(out, 0, (size_t)n * 4); break;
    }
}

void kiln_gemv_ref(const kiln_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    float row[w->cols > 0 ? w->cols : 1];
    for (int64_t r = r0; r < r1; r++) {
        kiln_weight_row_f32(w, r, row);
        float acc = 0.0f;
        for (int64_t c = 0; c < w->cols; c++) acc += row[c] * x[c];
        y[r - r0] = acc;
    }
}

float kiln_dot_f32_ref(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

void kiln_axpy_f32_ref(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
