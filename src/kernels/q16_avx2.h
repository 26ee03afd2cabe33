/* q16_avx2.h — the Q8_0 / Q4_0 16-row interleave kernels of the AVX2 table (gemv_avx2.c) and of its
 * AVX-VNNI variant (gemv_avxvnni.c), which include it after defining:
 *   Q16_DOT8(acc, a, x)       acc + the 4-byte dots of |w| (u8) by x with w's sign (s8), as int32 lanes;
 *   Q16_DOT4_ACC(s, w, x)     the running Q4_0 dot of nibbles (u8) by x (s8): 16-bit pair sums
 *                             (vpmaddubsw) or int32 lanes (vpdpbusd);
 *   Q16_DOT4_END(s)           that running dot as int32 lanes;
 *   Q16H_BLOCK, Q16H_TILE, Q16H_GROUP, Q16H_REST, Q16H_ROWS  names of the file's static helpers;
 *   Q16H_ROWMAJOR(f, w, xp, y, r0, r1)  the row-major GEMV for weights in checkpoint layout;
 *   Q16H_GEMV_Q8 / _Q4, Q16H_GEMM_Q8 / _Q4, Q16H_LINKAGE  the entry points' names and linkage.
 * Both forms compute the same integers (no 16-bit sum can saturate: see below) and the same float
 * operations per (row, token), so they give the same results bit for bit. */
#include "kernels/avx2_common.h"
#include "kernels/gemv.h"
#include "kiln.h"
#include <math.h>
#include <string.h>

/* ---- Q8_0 / Q4_0 in the 16-row block interleave (tiled = 1, gemv.h), AVX2 -----------------------
 * A 256-bit register holds 8 rows: each 16-row group is two halves (bytes 0–31 / 32–63 of every
 * 64-byte vector, scales 0–7 / 8–15). Per block and token: the 8 rows' exact block dots (Q4_0:
 * vpmaddubsw of the nibbles (0..15) by the broadcast activation words, all 8 products summed in
 * int16 — at most 8 · 2 · 15 · 127 = 30,480, no saturation — then one vpmaddwd, plus the start
 * value −8·Σx; Q8_0: signed weights (the stored w + 128 xor 0x80) by the sign trick, vpmaddwd per
 * vector), one conversion, (scales × the token's scale), one FMA. The same integers and float
 * operations per (row, token) as the AVX-512 kernel, so the same results bit for bit; GEMV (NT = 1)
 * and GEMM alike (batch-invariant). */
/* INT4 group 32 in KILN_TILE_Q16 (gemv.h): Q4_0's vectors without the inline scales (256 bytes a
 * block), the 16 rows' bf16 scales of block b at the group's scale entries 16·b. */
/* Block b of Q16H_TILE (below) into acc[0..NT): group g, its INT4 scales sg. */
AI void Q16H_BLOCK(int f, int NT, int half, const uint8_t *g, const uint16_t *sg, int64_t nb, int64_t b, const uint8_t *xp, size_t xpb, __m256 *acc) {
    const int q8 = f == KILN_WF_Q8_0, i4 = f == KILN_WF_INT4_GROUP;
    const size_t gbb = i4 ? 256 : 16 * (size_t)(q8 ? 34 : 18), h = 32 * (size_t)half, woff = i4 ? 0 : 32;
    const __m256i m4 = _mm256_set1_epi8(0x0F), x80 = _mm256_set1_epi8((char)0x80);
    const float *dx = (const float *)(xp + nb * 64);
    const int32_t *tot = (const int32_t *)(dx + nb);
    const uint8_t *gb = g + (size_t)b * gbb;
    if (NT == 1 && half == 0) { /* GEMV: the weight stream 8 KiB ahead (half 1 re-reads the group from cache) */
        for (size_t l = 0; l < gbb; l += 64) PF_LINE(gb + 8192 + l);
        if (i4 && (b & 1) == 0) PF_LINE((const uint8_t *)(sg + 16 * b) + 1024);
    }
    const __m256 ws = i4 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(sg + 16 * b))), 16))
                         : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + h / 2)));
    __m256i ia[4];
    if (q8) {
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) ia[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(gb + 32 + 64 * k + h)), x80), a = _mm256_abs_epi8(v);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m256i xb = _mm256_set1_epi32(*(const int32_t *)(xp + (size_t)t * xpb + 64 * b + 4 * k));
                ia[t] = Q16_DOT8(ia[t], a, _mm256_sign_epi8(xb, v));
            }
        }
    } else {
        __m256i s[4]; /* Q16_DOT4_*: 16-bit partial sums (vpmaddubsw) or 32-bit ones (vpdpbusd) */
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(gb + woff + 64 * k + h));
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const uint8_t *xt = xp + (size_t)t * xpb + 64 * b;
                s[t] = Q16_DOT4_ACC(s[t], lo, _mm256_set1_epi32(*(const int32_t *)(xt + 4 * k)));
                s[t] = Q16_DOT4_ACC(s[t], hi, _mm256_set1_epi32(*(const int32_t *)(xt + 16 + 4 * k)));
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            ia[t] = _mm256_add_epi32(Q16_DOT4_END(s[t]), _mm256_set1_epi32(*(const int32_t *)((const uint8_t *)(tot + b) + (size_t)t * xpb)));
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        const float dt = *(const float *)((const uint8_t *)(dx + b) + (size_t)t * xpb);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_mul_ps(ws, _mm256_set1_ps(dt)), acc[t]);
    }
}
AI void Q16H_TILE(int f, int NT, const kiln_weight *w, int64_t q, int half, const uint8_t *xp, size_t xpb, float *Y, int64_t ldy) {
    const int64_t nb = w->cols / 32;
    const uint8_t *g = w->data + (size_t)q * 16 * w->row_bytes;
    const uint16_t *sg = f == KILN_WF_INT4_GROUP ? (const uint16_t *)w->scales + (size_t)q * 16 * (size_t)nb + 8 * (size_t)half : NULL;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    /* The GEMV's streaming pass (half 0) in runs of ~4 KiB whose last block is its own code copy,
     * as the AVX-512 kernel (gemv_avx512.c q16_tile, which gives the measurements and the lengths) */
    const int64_t run = NT == 1 && half == 0 ? (f == KILN_WF_Q8_0 ? 8 : 16) : nb;
    for (int64_t b0 = 0; b0 < nb; b0 += run) {
        const int64_t be = b0 + run < nb ? b0 + run : nb;
        for (int64_t b = b0; b < be - 1; b++) Q16H_BLOCK(f, NT, half, g, sg, nb, b, xp, xpb, acc);
        Q16H_BLOCK(f, NT, half, g, sg, nb, be - 1, xp, xpb, acc); /* the run's last block: its own instructions */
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(Y + (size_t)t * (size_t)ldy + 8 * half, acc[t]);
}
/* Group q for tokens [0, n) (row 16q of token t at Y[t·ldy]), both halves, in tiles of up to 4 tokens. */
AI void Q16H_GROUP(int f, const kiln_weight *w, int64_t q, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy) {
    for (int half = 0; half < 2; half++) {
        int t = 0;
        for (; t + 4 <= n; t += 4) Q16H_TILE(f, 4, w, q, half, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy);
        switch (n - t) {
        case 3: Q16H_TILE(f, 3, w, q, half, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
        case 2: Q16H_TILE(f, 2, w, q, half, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
        case 1: Q16H_TILE(f, 1, w, q, half, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
        default: break;
        }
    }
}
/* INT4 group 32 rows in checkpoint layout (untiled weights, the rows past a KILN_TILE_Q16 weight's
 * last group) on Q4_0's prepared activation, in the interleave's arithmetic per (row, token): the
 * block's exact int32 dot from tot, one conversion, × (scale · dx), one FMA — tiled and untiled
 * give the same bits (as gemv_avx512.c i4q_rows). Y[t·ldy + r]. */
AI void Q16H_I4ROWS(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t nb = w->cols / 32;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w->data + (size_t)r * w->row_bytes;
        const uint16_t *sr = (const uint16_t *)w->scales + (size_t)r * (size_t)nb;
        for (int t = 0; t < n; t++) {
            const uint8_t *x = xp + (size_t)t * xpb;
            const float *dx = (const float *)(x + nb * 64);
            const int32_t *tot = (const int32_t *)(dx + nb);
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                /* the block's 16 bytes → its 32 nibbles in column order (byte m: columns 2m, 2m + 1);
                 * pair sums of nibble × int8 fit int16 (2 · 15 · 127) */
                const __m128i v = _mm_loadu_si128((const __m128i *)(row + 16 * b));
                const __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
                const __m256i u = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
                const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_load_si256((const __m256i *)(x + 64 * b))), ones);
                __m128i hs = _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
                hs = _mm_add_epi32(hs, _mm_shuffle_epi32(hs, _MM_SHUFFLE(1, 0, 3, 2)));
                hs = _mm_add_epi32(hs, _mm_shuffle_epi32(hs, _MM_SHUFFLE(2, 3, 0, 1)));
                const int32_t is = _mm_cvtsi128_si32(hs) + tot[b];
                uint32_t sb = (uint32_t)sr[b] << 16;
                float ws;
                memcpy(&ws, &sb, 4);
                const float prod = ws * dx[b];
                acc = fmaf((float)is, prod, acc);
            }
            Y[(size_t)t * (size_t)ldy + (size_t)r] = acc;
        }
    }
}
/* The row walk (kernels/q16_rows.h); rows past the last group through the row-major GEMV per token. */
AI void Q16H_REST(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t yoff, int64_t r0, int64_t r1) {
    if (f == KILN_WF_INT4_GROUP) {
        Q16H_I4ROWS(w, xp, xpb, xpb ? n : 1, Y - yoff, ldy, r0, r1);
        return;
    }
    for (int t = 0; t < n; t++) Q16H_ROWMAJOR(f, w, xp + (size_t)t * xpb, Y + (size_t)t * (size_t)ldy + (r0 - yoff), r0, r1);
}
#define Q16_ROWS Q16H_ROWS
#define Q16_GROUP Q16H_GROUP
#define Q16_NT 4
#define Q16_X_BYTES (256u << 10)
#define Q16_REST Q16H_REST
#include "kernels/q16_rows.h"
#undef Q16_ROWS
#undef Q16_GROUP
#undef Q16_NT
#undef Q16_X_BYTES
#undef Q16_REST

Q16H_LINKAGE void Q16H_GEMV_Q8(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    if (w->tiled) Q16H_ROWS(KILN_WF_Q8_0, w, xp, 0, 1, y, 0, r0, r0, r1);
    else Q16H_ROWMAJOR(KILN_WF_Q8_0, w, xp, y, r0, r1);
}
Q16H_LINKAGE void Q16H_GEMV_Q4(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    if (w->tiled) Q16H_ROWS(KILN_WF_Q4_0, w, xp, 0, 1, y, 0, r0, r0, r1);
    else Q16H_ROWMAJOR(KILN_WF_Q4_0, w, xp, y, r0, r1);
}
/* GEMM (prefill, batched decode) on the prepared rows: tiled weights through q16h_rows; weights in
 * checkpoint layout (mapped files under --no-repack) one GEMV per token over L2-sized row blocks. */
Q16H_LINKAGE void Q16H_GEMM_Q8(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->tiled) Q16H_ROWS(KILN_WF_Q8_0, w, xp, xpb, n, Y, ldy, 0, r0, r1);
    else
        for (int t = 0; t < n; t++) Q16H_ROWMAJOR(KILN_WF_Q8_0, w, xp + (size_t)t * xpb, Y + (size_t)t * (size_t)ldy + r0, r0, r1);
}
Q16H_LINKAGE void Q16H_GEMM_Q4(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->tiled) Q16H_ROWS(KILN_WF_Q4_0, w, xp, xpb, n, Y, ldy, 0, r0, r1);
    else
        for (int t = 0; t < n; t++) Q16H_ROWMAJOR(KILN_WF_Q4_0, w, xp + (size_t)t * xpb, Y + (size_t)t * (size_t)ldy + r0, r0, r1);
}

/* INT4: group 32 in Q4_0's arithmetic (the interleave, or checkpoint rows through Q16H_I4ROWS, on
 * Q4_0's prepared activation); other groups: the row kernels of int4_avx2.h (Q16H_I4_GEMV / _GEMM /
 * _FEW, their own preparation). */
Q16H_LINKAGE void Q16H_GEMV_I4(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    if (w->block != 32 || w->cols % 32) Q16H_I4_GEMV(w, x, xp, y, r0, r1);
    else if (w->tiled == KILN_TILE_Q16) Q16H_ROWS(KILN_WF_INT4_GROUP, w, xp, 0, 1, y, 0, r0, r0, r1);
    else Q16H_I4ROWS(w, xp, 0, 1, y - r0, 0, r0, r1);
}
Q16H_LINKAGE void Q16H_GEMM_I4(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->block != 32 || w->cols % 32) Q16H_I4_GEMM(w, xp, xpb, n, Y, ldy, r0, r1);
    else if (w->tiled == KILN_TILE_Q16) Q16H_ROWS(KILN_WF_INT4_GROUP, w, xp, xpb, n, Y, ldy, 0, r0, r1);
    else Q16H_I4ROWS(w, xp, xpb, n, Y, ldy, r0, r1);
}
Q16H_LINKAGE void Q16H_FEW_I4(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->block != 32 || w->cols % 32) Q16H_I4_FEW(w, X, xp, xpb, n, Y, ldy, r0, r1);
    else Q16H_GEMM_I4(w, xp, xpb, n, Y, ldy, r0, r1);
}
