/* int4_avx2.h — the AVX2-class INT4 group GEMV (checkpoint row layout), instantiated twice: in
 * gemv_avx2.c with vpmaddubsw/vpmaddwd integer dots and in gemv_avxvnni.c with AVX-VNNI's 256-bit
 * vpdpbusd. The includer defines:
 *   I4_DOT(st, lo, xe, hi, xo)  int32 lanes st + Σ lo·xe + Σ hi·xo (u8 × s8, 4 products a lane);
 *                               both forms give the same integers (no saturation: |15·127·2|
 *                               fits int16), so both kernels give the same floats bit for bit;
 *   I4_ROWS, I4_GEMV, I4_GEMM, I4_FEW   names of the row kernel and the table's gemv, gemm_prep and
 *                               gemv_few entries;
 *   I4_LINKAGE                  static or nothing.
 * Prepared activation per 64-column chunk (I4_CHUNK = 128 bytes, zero-padded past cols):
 *   xe[32] int8 x_q[64c + 2k]; xo[32] int8 x_q[64c + 2k + 1];
 *   st[8] int32 −8 · Σ x_q[64c + 8l .. +8); xs[8] f32 x block scale of lane l. */
#include "kernels/avx2_common.h"
#include "kernels/gemv_isa.h"
#include <string.h>
#define I4_CHUNK 128

/* NR rows from r × NT tokens (token t's prepared row at xp + t·xpb, its results at y + t·ldy): NT = 1
 * is the GEMV (NR = 4); NT = 2 the few-token steps and the GEMM (NR = 2: 16 ymm registers), whose
 * per (row, token) arithmetic and order are the GEMV's, so every token gets its 1-token bits. */
AI void I4_ROWS(int NR, int NT, const kiln_weight *w, const uint8_t *xp, size_t xpb, float *y, int64_t ldy, int64_t r, int64_t pfg) {
    const int64_t cols = w->cols, G = w->block, ng = cols / G, nch = (cols + 63) / 64, nfull = cols / 64;
    const uint16_t *S = (const uint16_t *)w->scales;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i sshift = _mm256_set_epi32(0, 0, 0, 0, 16, 16, 16, 16), smask = _mm256_set_epi32(-65536, -65536, -65536, -65536, -1, -1, -1, -1);
    const uint8_t *p[4];
    const uint16_t *srow[4];
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        p[j] = w->data + (size_t)(r + j) * w->row_bytes;
        srow[j] = S + (size_t)(r + j) * (size_t)ng;
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[j][t] = _mm256_setzero_ps();
    }
    const uint8_t *pf = w->data + (size_t)(r + 4 * pfg) * w->row_bytes;
    /* Lanes 0-3 of a chunk take group g0's bf16 scale, lanes 4-7 group g1's (bf16 → f32 is a 16-bit
     * shift). Group 32 (g1 = g0 + 1): both scales in one 32-bit broadcast, lanes 0-3 shift the low
     * one up, lanes 4-7 keep the high one; larger groups (g1 = g0): one 16-bit broadcast. g0
     * advances without a division: 2 per chunk for group 32, else 1 every G / 64 chunks. */
    const int pair = G == 32;
    const int64_t cpg = G >= 64 ? G / 64 : 1;
    int64_t g0 = 0, gc = 0;
#define I4_ROW_STEP(j, wv, two, ch)                                                                                    \
    do {                                                                                                              \
        const __m256i lo = _mm256_and_si256(wv, m4), hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), m4);             \
        __m256i sv;                                                                                                    \
        if (two) {                                                                                                     \
            uint32_t sp2;                                                                                              \
            memcpy(&sp2, srow[j] + g0, 4);                                                                             \
            sv = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32((int)sp2), sshift), smask);                      \
        } else {                                                                                                       \
            sv = _mm256_slli_epi32(_mm256_set1_epi16((short)srow[j][g0]), 16);                                         \
        }                                                                                                              \
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {                                                         \
            const uint8_t *o = xp + (size_t)t * xpb + (ch) * I4_CHUNK;                                                 \
            const __m256i xe = _mm256_load_si256((const __m256i *)o), xo = _mm256_load_si256((const __m256i *)(o + 32)); \
            const __m256i st = _mm256_load_si256((const __m256i *)(o + 64));                                           \
            const __m256 xs = _mm256_load_ps((const float *)(o + 96));                                                 \
            const __m256i d = I4_DOT(st, lo, xe, hi, xo);                                                              \
            acc[j][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(_mm256_castsi256_ps(sv), xs), acc[j][t]); \
        }                                                                                                              \
    } while (0)
    /* software-pipelined: chunk ch + 1's weights load while chunk ch is computed (see gemv_avx512.c) */
    __m256i wcur[4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wcur[j] = nfull ? _mm256_loadu_si256((const __m256i *)p[j]) : _mm256_setzero_si256();
    for (int64_t ch = 0; ch < nfull; ch++) {
        if (pfg && (ch & 1) == 0)
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) PF_LINE(pf + (size_t)j * w->row_bytes + 32 * ch);
        __m256i wn[4];
        const int64_t chn = ch + 1 < nfull ? ch + 1 : ch;
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wn[j] = _mm256_loadu_si256((const __m256i *)(p[j] + 32 * chn));
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m256i wv = wcur[j];
            wcur[j] = wn[j];
            I4_ROW_STEP(j, wv, pair, ch);
        }
        if (pair) g0 += 2;
        else if (++gc == cpg) gc = 0, g0++;
    }
    if (nch > nfull) { /* the last 32 columns (cols % 64 == 32): 16 bytes a row, group g0 */
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m256i wv = _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(p[j] + 32 * nfull)));
            I4_ROW_STEP(j, wv, 0, nfull);
        }
    }
#undef I4_ROW_STEP
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) y[(size_t)t * (size_t)ldy + (size_t)j] = hsum256(acc[j][t]);
}
I4_LINKAGE void I4_GEMV(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    int64_t r = r0;
    const int64_t g = pf_groups_avx2(w->row_bytes);
    for (; r + 4 <= r1; r += 4) I4_ROWS(4, 1, w, xp, 0, y + (r - r0), 0, r, r + 4 * (g + 1) <= w->rows ? g : 0);
    for (; r < r1; r++) I4_ROWS(1, 1, w, xp, 0, y + (r - r0), 0, r, 0);
}
/* Steps of n ≥ 2 tokens (few-token steps and prefill): Y[t·ldy + r] for r in [r0, r1), tokens in
 * blocks whose prepared rows stay in L2 (64 KiB), within a block pairs of rows × pairs of tokens:
 * the first pair of tokens streams the rows from memory with the GEMV's prefetch, the others find
 * them in L1. */
I4_LINKAGE void I4_GEMM(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t g = pf_groups_avx2(w->row_bytes);
    int tb = (int)((64u << 10) / (xpb ? xpb : 1));
    tb = tb < 2 ? 2 : tb & ~1;
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        int64_t r = r0;
        for (; r + 2 <= r1; r += 2)
            for (int t = t0; t < t1; t += 2) {
                const int64_t pfg = t == t0 && r + 4 * (g + 1) <= w->rows ? g : 0;
                if (t1 - t >= 2) I4_ROWS(2, 2, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, ldy, r, pfg);
                else I4_ROWS(2, 1, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, ldy, r, pfg);
            }
        for (; r < r1; r++)
            for (int t = t0; t < t1; t++) I4_ROWS(1, 1, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, ldy, r, 0);
    }
}
I4_LINKAGE void I4_FEW(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    (void)X;
    I4_GEMM(w, xp, xpb, n, Y, ldy, r0, r1);
}
