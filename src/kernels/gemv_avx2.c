/* gemv_avx2.c — AVX2 + FMA + F16C kernels for every weight format, and the f32 helpers. Compiled
 * with the AVX2 flags (Makefile); reached only after kiln_kernels_select() saw the CPU support them.
 * Contracts: gemv_isa.h. The techniques are those of gemv_avx512.c at 8 lanes, with two changes:
 *   - integer dots use vpmaddubsw (u8 × s8 → s16 pairs, never saturating here: |15·127·2| and
 *     |128·127·2| < 32767) then vpmaddwd with ones to int32 lanes (INT4: the kernel body is
 *     int4_avx2.h, whose AVX-VNNI instantiation in gemv_avxvnni.c replaces this table's entry on
 *     CPUs with AVX-VNNI, see gemv.c);
 *   - Q8_0 uses the sign trick (|w| · sign(x, w)) instead of a +128 offset, which would saturate;
 *   - column tails past the last full vector run the scalar conversions of base/fp.h. */
#include "kernels/gemv_isa.h"
#include "kernels/avx2_common.h"
#include "base/fp.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

/* ---- f32 helpers ---------------------------------------------------------------------------------- */
static float dot_f32(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_f32(float a, const float *x, float *y, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void scale_f32(float *x, float a, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(va, _mm256_loadu_ps(x + i)));
    for (; i < n; i++) x[i] *= a;
}

/* ---- 8-value loaders for the float formats (FP8 yields value/256: see gemv_avx512.c) --------------- */
AI __m256 ld8(int f, const uint8_t *row, int64_t c) {
    switch (f) {
    case KILN_WF_F32: return _mm256_loadu_ps((const float *)(row + 4 * c));
    case KILN_WF_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * c)));
    case KILN_WF_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * c))), 16));
    default: {
        __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(row + c))), 7);
        return _mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16((short)0xBFFF)));
    }
    }
}
/* Scalar value of one element (FP8: the true value, not /256). */
AI float ld1(int f, const uint8_t *row, int64_t c) {
    uint16_t h;
    switch (f) {
    case KILN_WF_F32: { float v; memcpy(&v, row + 4 * c, 4); return v; }
    case KILN_WF_F16: memcpy(&h, row + 2 * c, 2); return kiln_f16_to_f32(h);
    case KILN_WF_BF16: memcpy(&h, row + 2 * c, 2); return kiln_bf16_to_f32(h);
    default: return kiln_fp8_e4m3_to_f32(row[c]);
    }
}


/* ---- F32 / F16 / BF16 GEMV -------------------------------------------------------------------------- */
/* NR rows from r × NT tokens (token t's x at x + t·ldx, its results at y + t·ldy): NT = 1 is the GEMV
 * (NR = 4); NT = 2 the few-token steps (NR = 2: 16 ymm registers), each (row, token) summed in the
 * GEMV's order, so every token gets its 1-token bits. */
AI void float_rows(int f, int NR, int NT, const kiln_weight *w, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t r, int64_t pfg) {
    const int64_t cols = w->cols, c16 = cols & ~(int64_t)15, c8 = cols & ~(int64_t)7;
    const uint8_t *p[4];
    __m256 a[4][2], b[4][2];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        p[j] = w->data + (size_t)(r + j) * w->row_bytes;
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) a[j][t] = b[j][t] = _mm256_setzero_ps();
    }
    int64_t c = 0;
    if (f == KILN_WF_F16 || f == KILN_WF_BF16) {
        /* 16 weights = one 32-byte load per row, software-pipelined, with a prefetch per 64 bytes of
         * each row of the group pfg ahead (as the INT4 kernel) */
        const uint8_t *pf = w->data + (size_t)(r + 4 * pfg) * w->row_bytes;
        __m256i raw[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) raw[j] = c16 ? _mm256_loadu_si256((const __m256i *)p[j]) : _mm256_setzero_si256();
        for (; c < c16; c += 16) {
            if (pfg && (c & 31) == 0)
#pragma GCC unroll 4
                for (int j = 0; j < NR; j++) PF_LINE(pf + (size_t)j * w->row_bytes + 2 * c);
            const int64_t cn = c + 16 < c16 ? c + 16 : c;
            __m256i nxt[4];
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) nxt[j] = _mm256_loadu_si256((const __m256i *)(p[j] + 2 * cn));
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) {
                const __m128i lo = _mm256_castsi256_si128(raw[j]), hi = _mm256_extracti128_si256(raw[j], 1);
                __m256 w0, w1;
                if (f == KILN_WF_F16) {
                    w0 = _mm256_cvtph_ps(lo);
                    w1 = _mm256_cvtph_ps(hi);
                } else {
                    w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16));
                    w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
                }
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    a[j][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c), a[j][t]);
                    b[j][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + c + 8), b[j][t]);
                }
                raw[j] = nxt[j];
            }
        }
    }
    for (; c < c16; c += 16) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m256 w0 = ld8(f, p[j], c), w1 = ld8(f, p[j], c + 8);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                a[j][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c), a[j][t]);
                b[j][t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * ldx + c + 8), b[j][t]);
            }
        }
    }
    if (c < c8) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m256 w0 = ld8(f, p[j], c);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) a[j][t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * ldx + c), a[j][t]);
        }
        c += 8;
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            float s = hsum256(_mm256_add_ps(a[j][t], b[j][t]));
            for (int64_t k = c; k < cols; k++) s += ld1(f, p[j], k) * x[t * ldx + k];
            y[t * ldy + j] = s;
        }
}
AI void gemv_float(int f, const kiln_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
    const int64_t g = pf_groups_avx2(w->row_bytes);
    for (; r + 4 <= r1; r += 4) float_rows(f, 4, 1, w, x, 0, y + (r - r0), 0, r, r + 4 * (g + 1) <= w->rows ? g : 0);
    for (; r < r1; r++) float_rows(f, 1, 1, w, x, 0, y + (r - r0), 0, r, 0);
}
/* Few-token steps of the float formats: pairs of rows × pairs of tokens; the first pass over a
 * pair of rows streams them with the GEMV's prefetch, the others find them in L1. */
AI void gemv_few_float(int f, const kiln_weight *w, const float *X, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t g = pf_groups_avx2(w->row_bytes), cols = w->cols;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2)
        for (int t = 0; t < n; t += 2) {
            const int64_t pfg = t == 0 && r + 4 * (g + 1) <= w->rows ? g : 0;
            if (n - t >= 2) float_rows(f, 2, 2, w, X + t * cols, cols, Y + t * ldy + r, ldy, r, pfg);
            else float_rows(f, 2, 1, w, X + t * cols, cols, Y + t * ldy + r, ldy, r, pfg);
        }
    for (; r < r1; r++)
        for (int t = 0; t < n; t++) float_rows(f, 1, 1, w, X + t * cols, cols, Y + t * ldy + r, ldy, r, 0);
}
#define FEW_FLOAT(name, f)                                                                                                          \
    static void name(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, \
                     int64_t r1) {                                                                                                  \
        (void)xp, (void)xpb;                                                                                                        \
        gemv_few_float(f, w, X, n, Y, ldy, r0, r1);                                                                                 \
    }
FEW_FLOAT(gemv_few_f32, KILN_WF_F32)
FEW_FLOAT(gemv_few_f16, KILN_WF_F16)
FEW_FLOAT(gemv_few_bf16, KILN_WF_BF16)
#undef FEW_FLOAT
static void gemv_f32(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)xp;
    gemv_float(KILN_WF_F32, w, x, y, r0, r1);
}
static void gemv_f16(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)xp;
    gemv_float(KILN_WF_F16, w, x, y, r0, r1);
}
static void gemv_bf16(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)xp;
    gemv_float(KILN_WF_BF16, w, x, y, r0, r1);
}

/* ---- FP8 block GEMV --------------------------------------------------------------------------------- */
AI void fp8_rows(int NR, const kiln_weight *w, const float *x, float *y, int64_t r, int64_t pfg) {
    const int64_t cols = w->cols, B = w->block, sc_cols = (cols + B - 1) / B;
    const float *S = (const float *)w->scales;
    const uint8_t *p[4];
    const float *srow[4];
    __m256 tot[4];
    float tail[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        p[j] = w->data + (size_t)(r + j) * w->row_bytes;
        srow[j] = S + ((r + j) / B) * sc_cols;
        tot[j] = _mm256_setzero_ps();
    }
    const uint8_t *pf = w->data + (size_t)(r + 4 * pfg) * w->row_bytes;
    for (int64_t cb = 0, bi = 0; cb < cols; cb += B, bi++) {
        const int64_t ce = min64(cb + B, cols);
        __m256 a[4], b[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) a[j] = b[j] = _mm256_setzero_ps();
        int64_t c = cb;
        /* 16 weights = one 16-byte load per row, software-pipelined, prefetching the group pfg ahead */
        const int64_t c16 = cb + ((ce - cb) & ~(int64_t)15);
        __m128i raw[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) raw[j] = c < c16 ? _mm_loadu_si128((const __m128i *)(p[j] + c)) : _mm_setzero_si128();
        for (; c < c16; c += 16) {
            __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
            if (pfg && (c & 63) == 0)
#pragma GCC unroll 4
                for (int j = 0; j < NR; j++) PF_LINE(pf + (size_t)j * w->row_bytes + c);
            const int64_t cn = c + 16 < c16 ? c + 16 : c;
            __m128i nxt[4];
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) nxt[j] = _mm_loadu_si128((const __m128i *)(p[j] + cn));
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) {
                /* all 16 bytes widened, shifted and masked at once in a 256-bit register (3 ops
                 * instead of 6 for two 8-byte halves), then two half → float conversions */
                const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw[j]), 7), _mm256_set1_epi16((short)0xBFFF));
                a[j] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), x0, a[j]);
                b[j] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), x1, b[j]);
                raw[j] = nxt[j];
            }
        }
        if (c + 8 <= ce) {
            __m256 x0 = _mm256_loadu_ps(x + c);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) a[j] = _mm256_fmadd_ps(ld8(KILN_WF_FP8_BLOCK, p[j], c), x0, a[j]);
            c += 8;
        }
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            tot[j] = _mm256_fmadd_ps(_mm256_add_ps(a[j], b[j]), _mm256_set1_ps(srow[j][bi] * 256.0f), tot[j]);
            float s = 0.0f;
            for (int64_t k = c; k < ce; k++) s += kiln_fp8_e4m3_to_f32(p[j][k]) * x[k];
            tail[j] += s * srow[j][bi];
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) y[j] = hsum256(tot[j]) + tail[j];
}

/* Fast path (block % 64 == 0 and MXCSR.DAZ clear — kiln never sets it): gemv_avx512.c's exact fast
 * path at 8 lanes. A 32-byte load of weights is spread by four in-lane vpshufb into dwords holding
 * the fp8 byte in bits 31..24; an arithmetic shift by 4 and clearing bits 30..27 leave the f32 that
 * is exactly fp8 × 2^-120 (e = 0 codes become exact f32 denormals). Shuffle k takes bytes 4k..4k+3
 * of each 128-bit lane, so within a 32-column half h it holds columns {32h + 16l + 4k + i} at
 * position 4l + i; the prepared activation (xprep_fp8) is x × 2^64 in that order per 64 columns,
 * which keeps every product a normal float, and a block's sum is × scale_inv × 2^56. Three integer
 * ops and one FMA per 8 weights, no vcvtph2ps: the half route above (fp8_rows) ran at 36% of the
 * read bandwidth on Zen 5 (`kiln bench --gemv --weights fp8 --isa avx2`, 25 GB/s of 70). The 14
 * subnormal fp8 codes (|w| < 2^-6: about 1e-4 of a block-scaled checkpoint's weights, below 1/28,672
 * of the block's amax) become f32 denormal operands; on a CPU that takes a microcode assist for a
 * denormal FMA input (~150 cycles; not measurable here: AMD has none) that is at most ~15% on a
 * kernel this change made 1.2–1.5× faster, so the exact conversion stays. */
#define FP8X_CHUNK 256 /* bytes of prepared activation per 64 columns */
static size_t xprep_bytes_fp8(const kiln_weight *w) { return (size_t)((w->cols + 63) / 64) * FP8X_CHUNK; }
static void xprep_fp8(const kiln_weight *w, const float *x, void *xp) {
    const int64_t cols = w->cols;
    float *o = (float *)xp;
    for (int64_t c0 = 0; c0 < cols; c0 += 64, o += 64)
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 2; l++)
                    for (int i = 0; i < 4; i++) {
                        const int64_t c = c0 + 32 * h + 16 * l + 4 * k + i;
                        o[32 * h + 8 * k + 4 * l + i] = c < cols ? x[c] * 18446744073709551616.0f /* 2^64 */ : 0.0f;
                    }
}
AI __m256 fp8x_tiny(__m256i w, __m256i shuf) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(w, shuf), 4), _mm256_set1_epi32((int)0x87FFFFFF)));
}
/* NR rows from r (row_at's layout, 64-byte chunks) × NT tokens (token t's prepared row at
 * xp + t·xstride floats, its results at y + t·ldy); prefetches the 4-row group pfg ahead. Two
 * chains per row and token (the 32-column halves), in the same order for every NT, so that a token
 * of a few-token step gets its 1-token GEMV's result bit for bit. 8 accumulators (NR × NT = 4) is
 * what the 16 ymm registers hold without spilling into the chains: 4 rows × 1 token measured
 * 36 GB/s on 8192x3072 where 2 rows ran at 28 and one chain per row at 34. */
AI void fp8x_rows(int NR, int NT, const kiln_weight *w, const float *xp, int64_t xstride, float *y, int64_t ldy, int64_t r, int64_t pfg) {
    const int64_t cols = w->cols, B = w->block, sc_cols = (cols + B - 1) / B, nfull = cols / 64, cpb = B / 64;
    const float *S = (const float *)w->scales;
    __m256i sh[4];
    for (int k = 0; k < 4; k++) {
        uint32_t iv[8];
        for (int e = 0; e < 8; e++) iv[e] = ((uint32_t)(4 * k + (e & 3)) << 24) | 0x808080u;
        sh[k] = _mm256_loadu_si256((const __m256i *)iv);
    }
    row_loc p[4];
    const float *srow[4];
    __m256 tot[4][4], a[4][4], b[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        p[j] = row_at(w, r + j);
        srow[j] = S + ((r + j) / B) * sc_cols;
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) tot[j][t] = a[j][t] = b[j][t] = _mm256_setzero_ps();
    }
    const uint8_t *pf = w->data + (size_t)(r + 4 * pfg) * w->row_bytes;
    int64_t bi = 0, inb = 0;
    for (int64_t k = 0; k <= nfull; k++) {
        const int64_t left = cols - 64 * k;
        if (left <= 0) break;
        if (pfg)
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) PF_LINE(pf + (size_t)j * w->row_bytes + 64 * k);
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            __m256i w0, w1;
            if (left >= 64) {
                w0 = _mm256_loadu_si256((const __m256i *)(p[j].p + p[j].cs * k));
                w1 = _mm256_loadu_si256((const __m256i *)(p[j].p + p[j].cs * k + 32));
            } else { /* the row's last, partial chunk (row_at's tail bytes) */
                uint8_t tb[64] = {0};
                memcpy(tb, p[j].tp, (size_t)left);
                w0 = _mm256_loadu_si256((const __m256i *)tb);
                w1 = _mm256_loadu_si256((const __m256i *)(tb + 32));
            }
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const __m256 f0 = fp8x_tiny(w0, sh[q]), f1 = fp8x_tiny(w1, sh[q]);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const float *xc = xp + t * xstride + 64 * k;
                    a[j][t] = _mm256_fmadd_ps(f0, _mm256_load_ps(xc + 8 * q), a[j][t]);
                    b[j][t] = _mm256_fmadd_ps(f1, _mm256_load_ps(xc + 32 + 8 * q), b[j][t]);
                }
            }
        }
        if (++inb == cpb || left <= 64) { /* block bi complete (or the row's last, partial block) */
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) {
                const __m256 sc = _mm256_set1_ps(srow[j][bi] * 72057594037927936.0f /* 2^56 */);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    tot[j][t] = _mm256_fmadd_ps(_mm256_add_ps(a[j][t], b[j][t]), sc, tot[j][t]);
                    a[j][t] = b[j][t] = _mm256_setzero_ps();
                }
            }
            bi++;
            inb = 0;
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) y[t * ldy + j] = hsum256(tot[j][t]);
}
AI int fp8x_ok(const kiln_weight *w, const void *xp) { return xp && w->block % 64 == 0 && !(_mm_getcsr() & 0x40 /* DAZ */); }
static void gemv_fp8(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
    const int64_t g = pf_groups_avx2(w->row_bytes);
    if (fp8x_ok(w, xp)) {
        for (; r + 4 <= r1; r += 4) fp8x_rows(4, 1, w, (const float *)xp, 0, y + (r - r0), 0, r, r + 4 * (g + 1) <= w->rows ? g : 0);
        for (; r < r1; r++) fp8x_rows(1, 1, w, (const float *)xp, 0, y + (r - r0), 0, r, 0);
        return;
    }
    for (; r + 4 <= r1; r += 4) fp8_rows(4, w, x, y + (r - r0), r, r + 4 * (g + 1) <= w->rows ? g : 0);
    for (; r < r1; r++) fp8_rows(1, w, x, y + (r - r0), r, 0);
}
/* Few-token FP8 steps (2..KILN_GEMV_SMALL_N_FP8 tokens: speculative verification, batched decode,
 * short prompt chunks), each row's weights converted once per 2 or 4 tokens (the conversion, not the
 * read, bounds this kernel): 2–3 tokens as pairs of rows × pairs of tokens, 4 and more as single rows
 * × 4 tokens (2, 1 for the rest); the first token group streams the rows with the GEMV's prefetch,
 * the others find them in cache. Every token's result is its 1-token GEMV's bit for bit (fp8x_rows).
 * Without the fast path's conditions, the GEMV once per token. */
static void gemv_few_fp8(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0,
                         int64_t r1) {
    if (!fp8x_ok(w, xp)) {
        for (int t = 0; t < n; t++)
            gemv_fp8(w, X + (size_t)t * (size_t)w->cols, xp ? xp + (size_t)t * xpb : NULL, Y + (size_t)t * (size_t)ldy + r0, r0, r1);
        return;
    }
    const int64_t g = pf_groups_avx2(w->row_bytes), xs = (int64_t)(xpb / 4);
    const float *x = (const float *)xp;
    int64_t r = r0;
    if (n >= 4) { /* single rows × 4 tokens, over row blocks of ~64 KiB (L2) token group by token group,
                   * so that a group's prepared rows (16 bytes a column) stay close while the block's
                   * rows go by; with rows outermost every row re-read all n prepared rows from L2
                   * (`kiln bench --gemv --weights fp8 --tokens 12,16 --isa avx2`, 8192x3072: 3.6–3.8 →
                   * 4.9–5.0 and 2.6–2.7 → 3.8 GB/s of weights; 4 and 8 tokens unchanged) */
        const int64_t rb = w->row_bytes < 65536 ? (int64_t)(65536 / w->row_bytes) : 1;
        for (int64_t b0 = r0; b0 < r1; b0 += rb) {
            const int64_t b1 = b0 + rb < r1 ? b0 + rb : r1;
            for (int t = 0; t < n;) {
                const int nt = n - t >= 4 ? 4 : n - t >= 2 ? 2 : 1;
                for (r = b0; r < b1; r++) {
                    const int64_t pfg = t == 0 && r + 4 * (g + 1) <= w->rows ? g : 0;
                    float *yt = Y + (size_t)t * (size_t)ldy + r;
                    if (nt == 4) fp8x_rows(1, 4, w, x + t * xs, xs, yt, ldy, r, pfg);
                    else if (nt == 2) fp8x_rows(1, 2, w, x + t * xs, xs, yt, ldy, r, pfg);
                    else fp8x_rows(1, 1, w, x + t * xs, xs, yt, ldy, r, pfg);
                }
                t += nt;
            }
        }
        return;
    }
    for (; r + 2 <= r1; r += 2)
        for (int t = 0; t < n; t += 2) {
            const int64_t pfg = t == 0 && r + 4 * (g + 1) <= w->rows ? g : 0;
            float *yt = Y + (size_t)t * (size_t)ldy + r;
            if (n - t >= 2) fp8x_rows(2, 2, w, x + t * xs, xs, yt, ldy, r, pfg);
            else fp8x_rows(2, 1, w, x + t * xs, xs, yt, ldy, r, pfg);
        }
    for (; r < r1; r++)
        for (int t = 0; t < n; t++) fp8x_rows(1, 1, w, x + t * xs, xs, Y + (size_t)t * (size_t)ldy + r, ldy, r, 0);
}

/* ---- exact dequantisation into f32 tiles (prefill) ------------------------------------------------ */
AI void dequant_float(int f, const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld) {
    const int64_t cols = w->cols, c8 = cols & ~(int64_t)7;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = w->data + (size_t)r * w->row_bytes;
        float *o = out + (r - r0) * ld;
        int64_t c = 0;
        for (; c < c8; c += 8) _mm256_storeu_ps(o + c, ld8(f, p, c));
        for (; c < cols; c++) o[c] = ld1(f, p, c);
    }
}
static void dequant_f16(const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld) {
    dequant_float(KILN_WF_F16, w, r0, r1, out, ld);
}
static void dequant_bf16(const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld) {
    dequant_float(KILN_WF_BF16, w, r0, r1, out, ld);
}
static void dequant_fp8(const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld) {
    const int64_t cols = w->cols, B = w->block, sc_cols = (cols + B - 1) / B;
    const float *S = (const float *)w->scales;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = w->data + (size_t)r * w->row_bytes;
        const float *srow = S + (r / B) * sc_cols;
        float *o = out + (r - r0) * ld;
        for (int64_t cb = 0, bi = 0; cb < cols; cb += B, bi++) {
            const int64_t ce = min64(cb + B, cols);
            __m256 s = _mm256_set1_ps(srow[bi] * 256.0f);
            int64_t c = cb;
            for (; c + 8 <= ce; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(ld8(KILN_WF_FP8_BLOCK, p, c), s));
            for (; c < ce; c++) o[c] = kiln_fp8_e4m3_to_f32(p[c]) * srow[bi];
        }
    }
}

/* ---- FP8 weights in a prompt's GEMM on Q8_0's int8 kernels (issue 20) ------------------------------
 * kiln_fp8_q8_avx512's bytes with 8-lane vectors (gemv.c fp8_q8_tables: the AVX2 tables' prompts,
 * where FP8 otherwise runs f32 tiles at the f32 FMA rate): per row and block of 32 columns the
 * floats fp8 × scale (ld8's value/256 times scale·256, rounded once), then ggml's Q8_0 rule in f32
 * (d = amax / 127, q = round(w · (1 / d)), ties to even; d as f16), written in Q8_0's 16-row
 * interleave for whole groups of 16 rows and as plain Q8_0 blocks after them. Either FP8 layout
 * (row_at). tile: cols floats of scratch (per block amax, d, 1 / d). test_gemv checks the bytes
 * against the AVX-512 form's reference. */
AI void fp8_q8_block8(const uint8_t *p, __m256 s256, __m256 v[4]) {
    for (int k = 0; k < 4; k++) v[k] = _mm256_mul_ps(ld8(KILN_WF_FP8_BLOCK, p, 8 * k), s256);
}
void kiln_fp8_q8_avx2(const kiln_weight *w, int64_t r0, int64_t r1, float *tile, uint8_t *out) {
    const int64_t cols = w->cols, nb = cols / 32, nr = r1 - r0, grouped = nr / 16 * 16, B = w->block, sc_cols = (cols + B - 1) / B;
    const size_t rb = (size_t)nb * 34, wrb = w->row_bytes, full = wrb / 64;
    const float *S = (const float *)w->scales;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    float *amx = tile, *dv = tile + nb, *idv = tile + 2 * nb;
    for (int64_t r = 0; r < nr; r++) {
        const int64_t wr = r0 + r;
        const row_loc loc = row_at(w, wr);
        const float *srow = S + (wr / B) * sc_cols;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = row_piece32(&loc, full, b);
            if (!(b & 1) && wr + 4 < w->rows) _mm_prefetch((const char *)(p + 4 * wrb), _MM_HINT_T0); /* as the AVX-512 form */
            __m256 v[4];
            fp8_q8_block8(p, _mm256_set1_ps(srow[(32 * b) / B] * 256.0f), v);
            __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absm), _mm256_and_ps(v[1], absm)),
                                     _mm256_max_ps(_mm256_and_ps(v[2], absm), _mm256_and_ps(v[3], absm)));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            amx[b] = _mm_cvtss_f32(h);
        }
        /* d = amax / 127 and 1 / d (0 where d is not > 0), 8 blocks a division */
        int64_t b0 = 0;
        for (; b0 + 8 <= nb; b0 += 8) {
            const __m256 d = _mm256_div_ps(_mm256_loadu_ps(amx + b0), _mm256_set1_ps(127.0f));
            const __m256 nz = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_GT_OQ);
            _mm256_storeu_ps(dv + b0, d);
            _mm256_storeu_ps(idv + b0, _mm256_and_ps(nz, _mm256_div_ps(_mm256_set1_ps(1.0f), d)));
        }
        for (; b0 < nb; b0++) {
            dv[b0] = amx[b0] / 127.0f;
            idv[b0] = dv[b0] > 0.0f ? 1.0f / dv[b0] : 0.0f;
        }
        for (int64_t b = 0; b < nb; b++) {
            __m256 v[4];
            fp8_q8_block8(row_piece32(&loc, full, b), _mm256_set1_ps(srow[(32 * b) / B] * 256.0f), v);
            const __m256 vid = _mm256_set1_ps(idv[b]);
            __m256i q[4];
            for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid)); /* |q| ≤ 127: the packs never saturate */
            /* packs interleave 128-bit lanes: dwords (0-3, 8-11, 16-19, 24-27, 4-7, 12-15, 20-23, 28-31) → in order */
            const __m256i qb = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), order);
            uint8_t qs[32];
            _mm256_storeu_si256((__m256i *)qs, qb);
            kiln_q8_block_put(out, r, grouped, b, rb, (uint16_t)_cvtss_sh(dv[b], _MM_FROUND_TO_NEAREST_INT), qs);
        }
    }
}

/* ---- f32 GEMM on a dequantised tile: 3 rows of X × 4 rows of W per register tile ------------------- */
static void gemm_f32(const float *W, int64_t ldw, int nr, const float *X, int64_t ldx, int n, int64_t cols,
                     float *Y, int64_t ldy) {
    const int64_t c8 = cols & ~(int64_t)7;
    for (int i = 0; i < n; i += 3) {
        const float *xr[3];
        for (int a = 0; a < 3; a++) xr[a] = X + (size_t)(i + a < n ? i + a : n - 1) * (size_t)ldx;
        for (int j = 0; j < nr; j += 4) {
            const float *wr[4];
            for (int b = 0; b < 4; b++) wr[b] = W + (size_t)(j + b < nr ? j + b : nr - 1) * (size_t)ldw;
            __m256 acc[3][4];
#pragma GCC unroll 4
            for (int a = 0; a < 3; a++)
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) acc[a][b] = _mm256_setzero_ps();
            for (int64_t c = 0; c < c8; c += 8) {
                __m256 wv[4];
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) wv[b] = _mm256_loadu_ps(wr[b] + c);
#pragma GCC unroll 4
                for (int a = 0; a < 3; a++) {
                    __m256 xv = _mm256_loadu_ps(xr[a] + c);
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++) acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);
                }
            }
            for (int a = 0; a < 3 && i + a < n; a++)
                for (int b = 0; b < 4 && j + b < nr; b++) {
                    float s = hsum256(acc[a][b]);
                    for (int64_t c = c8; c < cols; c++) s += xr[a][c] * wr[b][c];
                    Y[(size_t)(i + a) * (size_t)ldy + (size_t)(j + b)] = s;
                }
        }
    }
}

/* ---- INT4 group ------------------------------------------------------------------------------------- */
/* The kernel (and the prepared activation's layout, I4_CHUNK bytes per 64 columns): int4_avx2.h,
 * shared with gemv_avxvnni.c. */
#define I4_DOT(st, lo, xe, hi, xo) \
    _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo)), _mm256_set1_epi16(1)), st)
#define I4_ROWS int4_rows
#define I4_GEMV gemv_int4
#define I4_GEMM gemm_int4
#define I4_FEW gemv_few_int4
#define I4_LINKAGE static
#include "kernels/int4_avx2.h"
/* INT4 group 32 prepares as Q4_0 (q16_avx2.h: Q4_0's arithmetic, in the interleave and in rows);
 * other groups their own way. */
static size_t xprep_bytes_q(const kiln_weight *w);
static void xprep_q4(const kiln_weight *w, const float *x, void *xp);
static size_t xprep_bytes_int4(const kiln_weight *w) {
    if (w->block == 32 && w->cols % 32 == 0) return xprep_bytes_q(w);
    return (size_t)((w->cols + 63) / 64) * I4_CHUNK;
}

static void xprep_int4(const kiln_weight *w, const float *x, void *xp) {
    if (w->block == 32 && w->cols % 32 == 0) {
        xprep_q4(w, x, xp);
        return;
    }
    const int64_t cols = w->cols, nch = (cols + 63) / 64;
    int8_t q[cols];
    float d[cols / 32];
    kiln_quant_x32(x, cols, q, d);
    for (int64_t ch = 0; ch < nch; ch++) {
        uint8_t *o = (uint8_t *)xp + ch * I4_CHUNK;
        int8_t *xe = (int8_t *)o, *xo = (int8_t *)o + 32;
        int32_t *st = (int32_t *)(o + 64);
        float *xs = (float *)(o + 96);
        const int64_t base = 64 * ch;
        for (int k = 0; k < 32; k++) {
            int64_t c = base + 2 * k;
            xe[k] = c < cols ? q[c] : 0;
            xo[k] = c + 1 < cols ? q[c + 1] : 0;
        }
        for (int l = 0; l < 8; l++) {
            int64_t c = base + 8 * l;
            int32_t s = 0;
            for (int k = 0; k < 8; k++) s += c + k < cols ? q[c + k] : 0;
            st[l] = -8 * s;
            xs[l] = c < cols ? d[c / 32] : 0.0f;
        }
    }
}


/* ---- GGUF K-quants (Q4_K, Q5_K, Q6_K) --------------------------------------------------------------
 * int8 dots on the activation quantized per 256-column super-block (kiln_quant_x256's rule); the
 * kernels (kernels/kquant_avx2.h, shared with gemv_avxvnni.c) and the arithmetic are described there
 * and in gemv_avx512.c. Prepared record per super-block (KQ_REC = 320 bytes): q[256] int8 (columns in
 * order), bs[16] int16 (Σ q per 16 columns), dx f32. */
#define KQ_VNNI 0
#define KQ_DOT(acc, w, x, S) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), S))
#define KQ_GEMV(F) gemv_##F
#define KQ_GEMM(F) gemm_##F
#include "kernels/kquant_avx2.h"
static size_t xprep_bytes_kq(const kiln_weight *w) { return (size_t)(w->cols / 256) * KQ_REC; }
static void xprep_kq(const kiln_weight *w, const float *x, void *xp) {
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (int64_t sb = 0; sb < w->cols / 256; sb++) {
        const float *xs = x + 256 * sb;
        uint8_t *o = (uint8_t *)xp + sb * KQ_REC;
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 32; i++) m = _mm256_max_ps(m, _mm256_andnot_ps(sgn, _mm256_loadu_ps(xs + 8 * i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f; /* kiln_quant_x256 */
        const __m256 vid = _mm256_set1_ps(id);
        int16_t *bs = (int16_t *)(o + 256);
        for (int i = 0; i < 16; i++) {
            __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + 16 * i), vid)); /* RNE */
            __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + 16 * i + 8), vid));
            a = _mm256_min_epi32(_mm256_max_epi32(a, lo), hi);
            b = _mm256_min_epi32(_mm256_max_epi32(b, lo), hi);
            const __m256i s16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8); /* columns in order */
            const __m128i q8 = _mm_packs_epi16(_mm256_castsi256_si128(s16), _mm256_extracti128_si256(s16, 1));
            _mm_storeu_si128((__m128i *)(o + 16 * i), q8);
            __m256i t = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
            bs[i] = (int16_t)_mm_cvtsi128_si32(h);
        }
        memcpy(o + 288, &d, 4);
    }
}

/* ---- GGUF blocks of 32: Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1 -------------------------------------
 * Prepared activation: per 32-block 64 bytes {x_q[32] int8, st[8] int32}, then d[cols/32] f32.
 * Q4_0: st = −8·Σ(lane's 4 x_q), Q5_0: −16·Σ (nibbles are w + 8 / w + 16); Q8_0 and IQ4_NL (signed
 * weights, sign trick) need no start value: st = 0; Q4_1 / Q5_1 (w = d·q + m) read no st.
 * After d: tot[cols/32] int32, the block's whole start value (the sum of its st lanes), for the
 * 16-row interleave kernels (q16_*); Q4_1 / Q5_1 then xs[cols/32] f32 = dx·Σx_q for the m term. */
static size_t xprep_bytes_q(const kiln_weight *w) { return ((size_t)(w->cols / 32) * 72 + 63) & ~(size_t)63; }
static size_t xprep_bytes_q1(const kiln_weight *w) { return ((size_t)(w->cols / 32) * 76 + 63) & ~(size_t)63; }
AI void xprep_q(const kiln_weight *w, const float *x, void *xp, int32_t off) {
    const int64_t nb = w->cols / 32;
    uint8_t *o = (uint8_t *)xp;
    float *d = (float *)(o + nb * 64);
    int32_t *tot = (int32_t *)(d + nb);
    int8_t q[32];
    for (int64_t b = 0; b < nb; b++) {
        kiln_quant_x32(x + 32 * b, 32, q, d + b);
        memcpy(o + 64 * b, q, 32);
        int32_t *st = (int32_t *)(o + 64 * b + 32);
        tot[b] = 0;
        for (int l = 0; l < 8; l++) tot[b] += st[l] = -off * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
    }
}
static void xprep_q8(const kiln_weight *w, const float *x, void *xp) { xprep_q(w, x, xp, 0); }
static void xprep_q4(const kiln_weight *w, const float *x, void *xp) { xprep_q(w, x, xp, 8); }
static void xprep_q5(const kiln_weight *w, const float *x, void *xp) { xprep_q(w, x, xp, 16); }
static void xprep_q1(const kiln_weight *w, const float *x, void *xp) {
    xprep_q(w, x, xp, -1); /* tot = Σx_q */
    kiln_xprep_q1_sums(xp, w->cols / 32);
}
AI int64_t qb_bytes(int f) { return (int64_t)kiln_wf_block_bytes((kiln_wformat)f); }
AI int qb_qs(int f) { return kiln_q32_qs_offset((kiln_wformat)f); }
AI int qb_has_min(int f) { return kiln_q32_has_min((kiln_wformat)f); }
/* The block's exact integer dot with x_q as 8 int32 lanes (4 columns each), start value included. */
AI __m256i q_dot(int f, const uint8_t *blk, __m256i xq, __m256i st) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (f == KILN_WF_Q8_0) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xq, wv)), ones);
    }
    /* the 16 bytes in both halves; the upper half shifted right by 4: low nibbles = weights 0-15,
     * high nibbles = weights 16-31 (GGML's order) */
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + qb_qs(f))));
    __m256i wv = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0)), _mm256_set1_epi8(0x0F));
    if (f == KILN_WF_IQ4_NL) { /* signed levels: |w| · (x with w's sign), as Q8_0 */
        wv = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)), wv);
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xq, wv)), ones);
    }
    if (f == KILN_WF_Q5_0 || f == KILN_WF_Q5_1) { /* bit i of qh → bit 4 of byte i */
        uint32_t qh;
        memcpy(&qh, blk + (f == KILN_WF_Q5_0 ? 2 : 4), 4);
        const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll,
                                                                                                0x0101010101010101ll, 0));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        wv = _mm256_or_si256(wv, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bit), bit), _mm256_set1_epi8(0x10)));
    }
    const __m256i t = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xq), ones);
    return qb_has_min(f) ? t : _mm256_add_epi32(t, st);
}
AI void q_rows(int f, int NR, const kiln_weight *w, const uint8_t *xp, float *y, int64_t r, int64_t pfg) {
    const int64_t nb = w->cols / 32, bb = qb_bytes(f);
    /* software prefetch of the 4-row group pfg ahead (rows in place, so that group is one linear
     * range of 4 rows): 4 × bb bytes of it per block, as the AVX-512 kernel */
    const uint8_t *pf = w->data + (size_t)(r + 4 * pfg) * w->row_bytes;
    const float *d = (const float *)(xp + nb * 64), *xs = (const float *)(xp + nb * 72);
    const uint8_t *p[4];
    __m256 acc[4];
    __m128 accm = _mm_setzero_ps(); /* the _1 formats' m·xs, lane j = row j */
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        p[j] = w->data + (size_t)(r + j) * w->row_bytes;
        acc[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const __m256i xq = _mm256_load_si256((const __m256i *)(xp + 64 * b));
        const __m256i st = _mm256_load_si256((const __m256i *)(xp + 64 * b + 32));
        const float db = d[b];
        if (pfg) {
            PF_LINE(pf + 4 * bb * b);
            PF_LINE(pf + 4 * bb * b + 64);
            if (4 * bb > 128) PF_LINE(pf + 4 * bb * b + 128);
        }
        /* the NR rows' f16 block scales converted together, × the x block scale */
        uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            memcpy(&h[j], p[j] + bb * b, 2);
            if (qb_has_min(f)) memcpy(&h[4 + j], p[j] + bb * b + 2, 2);
        }
        const __m256 hv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
        const __m256 s4 = _mm256_castps128_ps256(_mm_mul_ps(_mm256_castps256_ps128(hv), _mm_set1_ps(db)));
        if (qb_has_min(f)) accm = _mm_fmadd_ps(_mm256_extractf128_ps(hv, 1), _mm_set1_ps(xs[b]), accm);
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            __m256i t = q_dot(f, p[j] + bb * b, xq, st);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_permutevar8x32_ps(s4, _mm256_set1_epi32(j)), acc[j]);
        }
    }
    float m[4];
    _mm_storeu_ps(m, accm);
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) y[j] = qb_has_min(f) ? hsum256(acc[j]) + m[j] : hsum256(acc[j]);
}
AI void gemv_q(int f, const kiln_weight *w, const void *xp, float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
    const int64_t g = pf_groups_avx2(w->row_bytes);
    for (; r + 4 <= r1; r += 4) q_rows(f, 4, w, xp, y + (r - r0), r, r + 4 * (g + 1) <= w->rows ? g : 0);
    for (; r < r1; r++) q_rows(f, 1, w, xp, y + (r - r0), r, 0);
}
/* ---- Q8_0 / Q4_0 in the 16-row block interleave: kernels/q16_avx2.h (vpmaddubsw form here) ---- */
#define Q16_DOT8(acc, a, x) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, x), _mm256_set1_epi16(1)))
#define Q16_DOT4_ACC(s, w, x) _mm256_add_epi16(s, _mm256_maddubs_epi16(w, x))
#define Q16_DOT4_END(s) _mm256_madd_epi16(s, _mm256_set1_epi16(1))
#define Q16H_BLOCK q16h_block
#define Q16H_TILE q16h_tile
#define Q16H_GROUP q16h_group
#define Q16H_REST q16h_rest
#define Q16H_ROWS q16h_rows
#define Q16H_ROWMAJOR gemv_q
#define Q16H_GEMV_Q8 gemv_q8
#define Q16H_GEMV_Q4 gemv_q4
#define Q16H_GEMM_Q8 gemm_q8
#define Q16H_GEMM_Q4 gemm_q4
#define Q16H_I4ROWS q16h_i4rows
#define Q16H_I4_GEMV gemv_int4
#define Q16H_I4_GEMM gemm_int4
#define Q16H_I4_FEW gemv_few_int4
#define Q16H_GEMV_I4 gemv_int4_any
#define Q16H_GEMM_I4 gemm_int4_any
#define Q16H_FEW_I4 gemv_few_int4_any
#define Q16H_LINKAGE static
#include "kernels/q16_avx2.h"

/* The row-major Q8_0 / Q4_0 GEMV (checkpoint layout), for the AVX-VNNI variant's rows outside the
 * interleave (gemv_avxvnni.c). */
void kiln_gemv_q_rowmajor_avx2(int f, const kiln_weight *w, const void *xp, float *y, int64_t r0, int64_t r1) { gemv_q(f, w, xp, y, r0, r1); }

/* The other blocks of 32 stay in checkpoint layout: one GEMV per token, as above. */
#define Q_ENTRIES(F, fmt)                                                                                                          \
    static void gemv_##F(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {                 \
        (void)x;                                                                                                                   \
        gemv_q(fmt, w, xp, y, r0, r1);                                                                                             \
    }                                                                                                                              \
    static void gemm_##F(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) { \
        for (int t = 0; t < n; t++) gemv_q(fmt, w, xp + (size_t)t * xpb, Y + (size_t)t * (size_t)ldy + r0, r0, r1);                 \
    }
Q_ENTRIES(q5_0, KILN_WF_Q5_0)
Q_ENTRIES(q4_1, KILN_WF_Q4_1)
Q_ENTRIES(q5_1, KILN_WF_Q5_1)
Q_ENTRIES(iq4nl, KILN_WF_IQ4_NL)
#undef Q_ENTRIES

/* The compute peak loop (gemv_isa.h: peak) for AVX2: f32 FMA and the int8 dot as the INT4 / Q8_0
 * kernels of this table compute it (vpmaddubsw + vpmaddwd: 32 multiply-accumulates per pair). */
static double peak(int kind, int64_t iters) {
    __m256 f[12];
    __m256i q[12];
    for (int i = 0; i < 12; i++) { f[i] = _mm256_set1_ps((float)i * 1e-3f); q[i] = _mm256_set1_epi32(i); }
    __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
    __m256i u = _mm256_set1_epi8(3), v = _mm256_set1_epi8(-2);
    const __m256i ones = _mm256_set1_epi16(1);
    double per = 0;
    if (kind == KILN_PEAK_F32) {
        for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++) f[i] = _mm256_fmadd_ps(f[i], a, b);
            __asm__ volatile("" : "+x"(a), "+x"(b));
        }
        per = 12.0 * 8;
    } else if (kind == KILN_PEAK_INT8) {
        for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++) q[i] = _mm256_add_epi32(q[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), ones));
            __asm__ volatile("" : "+x"(u), "+x"(v));
        }
        per = 12.0 * 32;
    } else return 0;
    float sink = 0;
    int32_t qs[8];
    for (int i = 0; i < 12; i++) {
        float fs[8];
        _mm256_storeu_ps(fs, f[i]);
        _mm256_storeu_si256((__m256i *)qs, q[i]);
        sink += fs[0] + (float)qs[0];
    }
    __asm__ volatile("" : : "x"(sink));
    return per * (double)iters;
}

static uint64_t read_sum(const void *p, size_t bytes) {
    const uint8_t *b = (const uint8_t *)p;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < bytes; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(b + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(b + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(b + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(b + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, a0);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* ---- SwiGLU activation (libmvec AVX2 expf; see gemv_avx512.c) --------------------------------- */
__m256 _ZGVdN8v_expf(__m256 x);
/* The tail goes through the same vector expf (in a padded buffer), not scalar expf: an element's
 * result must not depend on where it falls in the array — a step of n tokens calls this on n × ffn
 * values, so with the scalar tail the last ffn % 8 values of a token differed between a 1-token
 * step and a verify step (speculative decoding's logits on AVX2 differed from decoding's by ~4e-7). */
static void silu_mul(float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    if (i < n) {
        float gb[8] = {0}, ub[8] = {0};
        memcpy(gb, g + i, (size_t)(n - i) * sizeof *gb);
        memcpy(ub, u + i, (size_t)(n - i) * sizeof *ub);
        const __m256 x = _mm256_loadu_ps(gb);
        const __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_storeu_ps(gb, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(ub)));
        memcpy(g + i, gb, (size_t)(n - i) * sizeof *gb);
    }
}

/* Maximum ignoring NaN (see gemv_avx512.c). */
static float max_f32(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

const kiln_ktable kiln_ktable_avx2 = {
    .dot = dot_f32,
    .axpy = axpy_f32,
    .scale = scale_f32,
    .xprep_bytes = {[KILN_WF_FP8_BLOCK] = xprep_bytes_fp8, [KILN_WF_INT4_GROUP] = xprep_bytes_int4, [KILN_WF_Q8_0] = xprep_bytes_q, [KILN_WF_Q4_0] = xprep_bytes_q,
                    [KILN_WF_Q4_K] = xprep_bytes_kq, [KILN_WF_Q5_K] = xprep_bytes_kq, [KILN_WF_Q6_K] = xprep_bytes_kq,
                    [KILN_WF_Q2_K] = xprep_bytes_kq, [KILN_WF_Q3_K] = xprep_bytes_kq, [KILN_WF_IQ4_XS] = xprep_bytes_kq,
                    [KILN_WF_Q5_0] = xprep_bytes_q, [KILN_WF_IQ4_NL] = xprep_bytes_q, [KILN_WF_Q4_1] = xprep_bytes_q1,
                    [KILN_WF_Q5_1] = xprep_bytes_q1},
    .xprep = {[KILN_WF_FP8_BLOCK] = xprep_fp8, [KILN_WF_INT4_GROUP] = xprep_int4, [KILN_WF_Q8_0] = xprep_q8, [KILN_WF_Q4_0] = xprep_q4,
              [KILN_WF_Q4_K] = xprep_kq, [KILN_WF_Q5_K] = xprep_kq, [KILN_WF_Q6_K] = xprep_kq, [KILN_WF_Q2_K] = xprep_kq,
              [KILN_WF_Q3_K] = xprep_kq, [KILN_WF_IQ4_XS] = xprep_kq, [KILN_WF_Q5_0] = xprep_q5, [KILN_WF_IQ4_NL] = xprep_q8,
              [KILN_WF_Q4_1] = xprep_q1, [KILN_WF_Q5_1] = xprep_q1},
    .gemv = {[KILN_WF_F32] = gemv_f32, [KILN_WF_F16] = gemv_f16, [KILN_WF_BF16] = gemv_bf16,
             [KILN_WF_FP8_BLOCK] = gemv_fp8, [KILN_WF_INT4_GROUP] = gemv_int4_any, [KILN_WF_Q8_0] = gemv_q8,
             [KILN_WF_Q4_0] = gemv_q4, [KILN_WF_Q4_K] = gemv_q4k, [KILN_WF_Q5_K] = gemv_q5k, [KILN_WF_Q6_K] = gemv_q6k,
             [KILN_WF_Q2_K] = gemv_q2k, [KILN_WF_Q3_K] = gemv_q3k, [KILN_WF_IQ4_XS] = gemv_iq4xs, [KILN_WF_Q5_0] = gemv_q5_0,
             [KILN_WF_IQ4_NL] = gemv_iq4nl, [KILN_WF_Q4_1] = gemv_q4_1, [KILN_WF_Q5_1] = gemv_q5_1},
    .dequant = {[KILN_WF_F16] = dequant_f16, [KILN_WF_BF16] = dequant_bf16, [KILN_WF_FP8_BLOCK] = dequant_fp8},
    .gemm_f32 = gemm_f32,
    .gemv_few = {[KILN_WF_FP8_BLOCK] = gemv_few_fp8, [KILN_WF_INT4_GROUP] = gemv_few_int4_any, [KILN_WF_F32] = gemv_few_f32, [KILN_WF_F16] = gemv_few_f16, [KILN_WF_BF16] = gemv_few_bf16},
    .gemm_prep = {[KILN_WF_INT4_GROUP] = gemm_int4_any, [KILN_WF_Q8_0] = gemm_q8, [KILN_WF_Q4_0] = gemm_q4, [KILN_WF_Q4_K] = gemm_q4k, [KILN_WF_Q5_K] = gemm_q5k,
                  [KILN_WF_Q6_K] = gemm_q6k, [KILN_WF_Q2_K] = gemm_q2k, [KILN_WF_Q3_K] = gemm_q3k, [KILN_WF_IQ4_XS] = gemm_iq4xs,
                  [KILN_WF_Q5_0] = gemm_q5_0, [KILN_WF_IQ4_NL] = gemm_iq4nl, [KILN_WF_Q4_1] = gemm_q4_1, [KILN_WF_Q5_1] = gemm_q5_1},
    .tiled_mask = (1u << KILN_WF_Q8_0) | (1u << KILN_WF_Q4_0) | (1u << KILN_WF_Q4_K) | (1u << KILN_WF_Q5_K) | (1u << KILN_WF_Q2_K) |
                  (1u << KILN_WF_IQ4_XS), /* not Q6_K / Q3_K: kquant_avx2.h says why */
    .int4_q16 = 1, /* INT4 group 32 in the interleave (other INT4 groups read untiled rows) */
    .read_sum = read_sum,
    .peak = peak,
    .silu_mul = silu_mul,
    .max_f32 = max_f32,
};
