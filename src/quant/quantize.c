/* quantize.c — float32 → FP8 block / INT4 group / Q8_0 / Q4_0 / F16 / BF16 / F32 weights, in the
 * conventions documented in quantize.h, and kiln_quantize_weight (any readable format → any).
 * Sections: scalar conversions, per-stripe / per-row encoders, the whole-tensor entry points. */
#include "quant/quantize.h"
#include "base/fp.h"
#include "base/status.h"
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* ---- scalar conversions ------------------------------------------------------------------------- */
/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5·2^23 leaves no fraction bits. */
static inline float rne_small(float v) { return (v + 12582912.0f) - 12582912.0f; }

uint8_t kiln_fp8_from_f32_fast(float f) {
    uint32_t u = kiln_f32_to_bits(f), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    if (a > 0x7f800000u) return 0x7f;                 /* NaN */
    if (a >= 0x43e00000u) return sign | 0x7e;         /* |f| >= 448 (and inf): saturate */
    if (a >= 0x3c800000u) {                           /* >= 2^-6: normal E4M3 */
        uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u); /* RNE on the 20 dropped mantissa bits */
        return sign | (uint8_t)((r >> 20) - (120u << 3));
    }
    /* subnormal: value = m · 2^-9, m = RNE(|f| · 512) in [0, 8]; m = 8 is the smallest normal code */
    return sign | (uint8_t)rne_small(kiln_bits_to_f32(a) * 512.0f);
}

/* ---- encoders ----------------------------------------------------------------------------------- */
/* FP8: one stripe of nr (<= B) rows. W rows of `cols` floats at stride ldw; scales: this stripe's
 * ceil(cols/B) entries. Returns the flat index (r * cols + c) of a non-finite input, or -1. */
static int64_t fp8_stripe(const float *W, int64_t ldw, int64_t nr, int64_t cols, int B, uint8_t *out,
                          float *scales) {
    for (int64_t cb = 0, bi = 0; cb < cols; cb += B, bi++) {
        int64_t ce = cb + B < cols ? cb + B : cols;
        float amax = 0.0f;
        for (int64_t r = 0; r < nr; r++)
            for (int64_t c = cb; c < ce; c++) {
                float v = W[r * ldw + c];
                if (!isfinite(v)) return r * cols + c;
                amax = fmaxf(amax, fabsf(v));
            }
        float s = amax / KILN_FP8_MAX;
        if (!(s >= FLT_EPSILON)) s = FLT_EPSILON;
        scales[bi] = s;
        for (int64_t r = 0; r < nr; r++)
            for (int64_t c = cb; c < ce; c++) out[r * cols + c] = kiln_fp8_from_f32_fast(W[r * ldw + c] / s);
    }
    return -1;
}

/* INT4: one row. packed: cols/2 bytes; sc: cols/G bf16. Returns the column of a non-finite input or -1. */
static int64_t int4_row(const float *x, int64_t cols, int G, uint8_t *packed, uint16_t *sc) {
    memset(packed, 0, (size_t)cols / 2);
    for (int64_t g = 0; g < cols / G; g++) {
        const float *xg = x + g * G;
        float amax = 0.0f;
        for (int i = 0; i < G; i++) {
            if (!isfinite(xg[i])) return g * G + i;
            amax = fmaxf(amax, fabsf(xg[i]));
        }
        float s = amax / 7.5f;
        if (!(s >= FLT_EPSILON)) s = FLT_EPSILON;
        uint16_t sb = kiln_f32_to_bf16(s);
        sc[g] = sb;
        float sq = kiln_bf16_to_f32(sb);
        for (int i = 0; i < G; i++) {
            float q = rne_small(xg[i] / sq);
            q = q < -8.0f ? -8.0f : q > 7.0f ? 7.0f : q;
            int64_t c = g * G + i;
            packed[c / 2] |= (uint8_t)(((int)q + 8) << (4 * (c & 1)));
        }
    }
    return -1;
}

static void put_f16(uint8_t *p, float v) { uint16_t h = kiln_f32_to_f16(v); memcpy(p, &h, 2); }

void kiln_quantize_row_q8_0(const float *x, uint8_t *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, out += 34) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        put_f16(out, d);
        for (int i = 0; i < 32; i++) out[2 + i] = (uint8_t)(int8_t)roundf(xb[i] * id);
    }
}

void kiln_quantize_row_q4_0(const float *x, uint8_t *out, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++, out += 18) {
        const float *xb = x + 32 * b;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; i++)
            if (amax < fabsf(xb[i])) { amax = fabsf(xb[i]); max = xb[i]; }
        const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
        put_f16(out, d);
        for (int i = 0; i < 16; i++) {
            int q0 = (int8_t)(xb[i] * id + 8.5f), q1 = (int8_t)(xb[16 + i] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            out[2 + i] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static int64_t finite_check(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

/* ---- whole tensors ---------------------------------------------------------------------------- */
kiln_status kiln_quantize_fp8_block(const float *W, int64_t rows, int64_t cols, int block, uint8_t **data,
                                    float **scale_inv) {
    kiln_fp_init();
    if (rows <= 0 || cols <= 0 || block <= 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize fp8: shape [%lld, %lld] block %d: must be positive",
                         (long long)rows, (long long)cols, block);
    const int64_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
    uint8_t *d = malloc((size_t)rows * (size_t)cols);
    float *s = malloc((size_t)sr * (size_t)sc * sizeof(float));
    if (!d || !s) {
        free(d); free(s);
        return kiln_fail(KILN_ERR_NOMEM, "quantize fp8: out of memory for [%lld, %lld]", (long long)rows, (long long)cols);
    }
    int64_t bad = -1;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t b = 0; b < sr; b++) {
        int64_t r0 = b * block, nr = rows - r0 < block ? rows - r0 : block;
        int64_t e = fp8_stripe(W + r0 * cols, cols, nr, cols, block, d + r0 * cols, s + b * sc);
        if (e >= 0) {
            #pragma omp critical(kiln_quant_err)
            if (bad < 0 || r0 * cols + e < bad) bad = r0 * cols + e;
        }
    }
    if (bad >= 0) {
        free(d); free(s);
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize fp8: weight row %lld col %lld: value is not finite",
                         (long long)(bad / cols), (long long)(bad % cols));
    }
    *data = d;
    *scale_inv = s;
    return KILN_OK;
}

static kiln_status int4_args(int64_t rows, int64_t cols, int group) {
    if (rows <= 0 || cols <= 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize int4: shape [%lld, %lld] must be positive", (long long)rows, (long long)cols);
    if (group <= 0 || group % 8 || cols % group)
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize int4: group size %d must be a positive multiple of 8 dividing cols %lld",
                         group, (long long)cols);
    return KILN_OK;
}

kiln_status kiln_quantize_int4_group(const float *W, int64_t rows, int64_t cols, int group, uint8_t **packed,
                                     uint16_t **scales) {
    KILN_TRY(int4_args(rows, cols, group));
    uint8_t *p = malloc((size_t)rows * (size_t)cols / 2);
    uint16_t *s = malloc((size_t)rows * (size_t)(cols / group) * sizeof(uint16_t));
    if (!p || !s) {
        free(p); free(s);
        return kiln_fail(KILN_ERR_NOMEM, "quantize int4: out of memory for [%lld, %lld]", (long long)rows, (long long)cols);
    }
    int64_t bad = -1;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t e = int4_row(W + r * cols, cols, group, p + r * (cols / 2), s + r * (cols / group));
        if (e >= 0) {
            #pragma omp critical(kiln_quant_err)
            if (bad < 0 || r * cols + e < bad) bad = r * cols + e;
        }
    }
    if (bad >= 0) {
        free(p); free(s);
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize int4: weight row %lld col %lld: value is not finite",
                         (long long)(bad / cols), (long long)(bad % cols));
    }
    *packed = p;
    *scales = s;
    return KILN_OK;
}

/* ---- any format → any format -------------------------------------------------------------------- */
static size_t row_bytes_of(kiln_wformat f, int64_t cols) {
    switch (f) {
    case KILN_WF_F32: return 4 * (size_t)cols;
    case KILN_WF_F16:
    case KILN_WF_BF16: return 2 * (size_t)cols;
    case KILN_WF_FP8_BLOCK: return (size_t)cols;
    case KILN_WF_INT4_GROUP: return (size_t)cols / 2;
    case KILN_WF_Q8_0: return (size_t)cols / 32 * 34;
    case KILN_WF_Q4_0: return (size_t)cols / 32 * 18;
    default: return 0;
    }
}

kiln_status kiln_quantize_weight(const kiln_weight *src, kiln_wformat dst_fmt, int group, kiln_weight *dst,
                                 void **owned_data, void **owned_scales) {
    kiln_fp_init();
    const int64_t rows = src->rows, cols = src->cols;
    if ((unsigned)src->fmt >= KILN_WF_COUNT || (unsigned)dst_fmt >= KILN_WF_COUNT)
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize: format %d -> %d: unknown weight format", (int)src->fmt, (int)dst_fmt);
    if (rows <= 0 || cols <= 0 || !src->data)
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize: source weight shape [%lld, %lld] or data is empty",
                         (long long)rows, (long long)cols);
    int block = 0;
    if (dst_fmt == KILN_WF_FP8_BLOCK) {
        block = group > 0 ? group : 128;
    } else if (dst_fmt == KILN_WF_INT4_GROUP) {
        KILN_TRY(int4_args(rows, cols, group));
        block = group;
    } else if ((dst_fmt == KILN_WF_Q8_0 || dst_fmt == KILN_WF_Q4_0) && cols % 32) {
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize %s: cols %lld is not a multiple of 32", kiln_wformat_name(dst_fmt),
                         (long long)cols);
    }
    const size_t rb = row_bytes_of(dst_fmt, cols);
    size_t sbytes = 0;
    const int64_t sr = block ? (rows + block - 1) / block : 0, scn = block ? (cols + block - 1) / block : 0;
    if (dst_fmt == KILN_WF_FP8_BLOCK) sbytes = (size_t)sr * (size_t)scn * sizeof(float);
    if (dst_fmt == KILN_WF_INT4_GROUP) sbytes = (size_t)rows * (size_t)(cols / block) * sizeof(uint16_t);
    /* 64-byte aligned: large mallocs come from mmap 16 bytes into a page, which put every 64-byte
     * weight load of the GEMV across two cache lines (and its prefetches one line short). */
    uint8_t *data = kiln_alloc64(rb * (size_t)rows);
    void *scales = sbytes ? kiln_alloc64(sbytes) : NULL;
    if (!data || (sbytes && !scales)) {
        free(data); free(scales);
        return kiln_fail(KILN_ERR_NOMEM, "quantize %s: out of memory for [%lld, %lld]", kiln_wformat_name(dst_fmt),
                         (long long)rows, (long long)cols);
    }
    /* Units of parallel work: FP8 stripes of `block` rows (the scale spans them), else single rows. */
    const int64_t unit = dst_fmt == KILN_WF_FP8_BLOCK ? block : 1, nunits = (rows + unit - 1) / unit;
    int64_t bad = -1;
    int nomem = 0;
    #pragma omp parallel
    {
        float *buf = malloc((size_t)unit * (size_t)cols * sizeof(float));
        if (!buf) {
            #pragma omp atomic write
            nomem = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < nunits; u++) {
            if (!buf) continue;
            int64_t r0 = u * unit, nr = rows - r0 < unit ? rows - r0 : unit;
            for (int64_t r = 0; r < nr; r++) kiln_weight_row_f32(src, r0 + r, buf + r * cols);
            int64_t e = -1;
            uint8_t *out = data + (size_t)r0 * rb;
            switch (dst_fmt) {
            case KILN_WF_FP8_BLOCK: e = fp8_stripe(buf, cols, nr, cols, block, out, (float *)scales + u * scn); break;
            case KILN_WF_INT4_GROUP: e = int4_row(buf, cols, block, out, (uint16_t *)scales + r0 * (cols / block)); break;
            case KILN_WF_Q8_0:
                if ((e = finite_check(buf, cols)) < 0) kiln_quantize_row_q8_0(buf, out, cols);
                break;
            case KILN_WF_Q4_0:
                if ((e = finite_check(buf, cols)) < 0) kiln_quantize_row_q4_0(buf, out, cols);
                break;
            case KILN_WF_F32: memcpy(out, buf, rb); break;
            case KILN_WF_F16:
                for (int64_t c = 0; c < cols; c++) put_f16(out + 2 * c, buf[c]);
                break;
            case KILN_WF_BF16:
                for (int64_t c = 0; c < cols; c++) { uint16_t h = kiln_f32_to_bf16(buf[c]); memcpy(out + 2 * c, &h, 2); }
                break;
            default: break;
            }
            if (e >= 0) {
                #pragma omp critical(kiln_quant_err)
                if (bad < 0 || r0 * cols + e < bad) bad = r0 * cols + e;
            }
        }
        free(buf);
    }
    if (nomem || bad >= 0) {
        free(data); free(scales);
        if (nomem) return kiln_fail(KILN_ERR_NOMEM, "quantize %s: out of memory for a row buffer", kiln_wformat_name(dst_fmt));
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize %s: source weight row %lld col %lld: value is not finite",
                         kiln_wformat_name(dst_fmt), (long long)(bad / cols), (long long)(bad % cols));
    }
    memset(dst, 0, sizeof *dst);
    dst->fmt = dst_fmt;
    dst->rows = rows;
    dst->cols = cols;
    dst->data = data;
    dst->row_bytes = rb;
    dst->scales = scales;
    dst->block = block;
    *owned_data = data;
    *owned_scales = scales;
    return KILN_OK;
}

int kiln_weights_name_parse(const char *name, kiln_wformat *fmt, int *group) {
    static const struct { const char *name; kiln_wformat fmt; int group; } names[] = {
        {"f32", KILN_WF_F32, 0},          {"bf16", KILN_WF_BF16, 0},         {"fp8", KILN_WF_FP8_BLOCK, 128},
        {"int4", KILN_WF_INT4_GROUP, 32}, {"int4-g32", KILN_WF_INT4_GROUP, 32}, {"int4-g128", KILN_WF_INT4_GROUP, 128},
        {"q8_0", KILN_WF_Q8_0, 32},       {"q4_0", KILN_WF_Q4_0, 32},
    };
    for (size_t i = 0; name && i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i].name) == 0) {
            *fmt = names[i].fmt;
            *group = names[i].group;
            return 0;
        }
    return -1;
}
