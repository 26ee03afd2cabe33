/* kquant_avx2.h — the AVX2-class GGUF K-quant kernels (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS; checkpoint row layout),
 * instantiated twice: in gemv_avx2.c with vpmaddubsw + vpmaddwd and in gemv_avxvnni.c with AVX-VNNI's
 * 256-bit vpdpbusd + vpdpwssd. The includer defines:
 *   KQ_VNNI            0 or 1 (which form of the scale vectors KQ_DOT wants, see kq2_scale);
 *   KQ_DOT(acc, w, x, S)  int32 lanes acc + S·(Σ of the lane's 4 products w·x) (u8 × s8): with
 *                      vpmaddubsw the 4 products are summed in two int16 pairs (each ≤ 2·63·127 =
 *                      16002: no saturation) and vpmaddwd multiplies both pairs by S's int16; with
 *                      vpdpbusd the lane holds the 4-product sum (≤ 32004: exact in its low 16 bits)
 *                      and vpdpwssd multiplies it by S's low 16 bits (high 16 zero). Same integers,
 *                      so both kernels give the same floats bit for bit;
 *   KQ_GEMV(name), KQ_GEMM(name)   names of the table entries.
 * The arithmetic and the prepared activation record are those of the AVX-512 kernels (gemv_avx512.c,
 * "GGUF K-quants"), with columns in order for every format: per 256-column super-block, 8 chunks of
 * 32 columns (8 int32 lanes of 4 columns); Q4_K / Q5_K chunk k is sub-block k (one scale), Q6_K chunk
 * k holds sub-blocks 2k (lanes 0-3) and 2k + 1 (lanes 4-7), as do Q2_K's and Q3_K's 16-column groups
 * (Q3_K stored as q + 4, 0..7: isum −= 4·Σ sc·bs; Q2_K's mins as Q4_K's). IQ4_XS's signed levels
 * (−127..113) cannot take the u8 side: |w| · (x with w's sign) by vpmaddubsw in both instantiations
 * (pairs ≤ 2·127·127, no saturation), then vpmaddwd by the sub-block scale. */
#include "kernels/avx2_common.h"
#include "kernels/gemv_isa.h"
#include "kernels/kquant.h"
#include <string.h>

#define KQ_REC 320
#define KQ_PF_BYTES 8192 /* software prefetch distance along the (sequential) weight stream */

/* The scale vector of a chunk from a table of 8 int16 scales in both 128-bit lanes: lane 0 takes
 * word w0, lane 1 word w1; as int16 in every word (vpmaddwd) or in the low word of every int32
 * (vpdpwssd; the high word zeroed by vpshufb's 0x80 index). */
AI __m256i kq2_scale(__m256i tab, int w0, int w1) {
#if KQ_VNNI
    const __m128i i0 = _mm_set1_epi32((int)(0x80800000u | (uint32_t)(2 * w0) | (uint32_t)(2 * w0 + 1) << 8));
    const __m128i i1 = _mm_set1_epi32((int)(0x80800000u | (uint32_t)(2 * w1) | (uint32_t)(2 * w1 + 1) << 8));
#else
    const __m128i i0 = _mm_set1_epi16((short)((2 * w0) | (2 * w0 + 1) << 8));
    const __m128i i1 = _mm_set1_epi16((short)((2 * w1) | (2 * w1 + 1) << 8));
#endif
    return _mm256_shuffle_epi8(tab, _mm256_set_m128i(i1, i0));
}
/* Q4_K / Q5_K: the 8 scales and mins from the 12 packed bytes (see gemv_avx512.c's kq_scales8). */
AI void kq2_scales8(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t sl = u0 & 0x3F3F3F3Fu, ml = u1 & 0x3F3F3F3Fu;
    const uint32_t sh = (u2 & 0x0F0F0F0Fu) | ((u0 >> 2) & 0x30303030u), mh = ((u2 >> 4) & 0x0F0F0F0Fu) | ((u1 >> 2) & 0x30303030u);
    *sc = sl | (uint64_t)sh << 32;
    *mn = ml | (uint64_t)mh << 32;
}
/* Chunk k's unsigned weights (32 bytes) of the super-block at p. */
AI __m256i kq2_weights(int f, const uint8_t *p, int k) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (f == KILN_WF_Q6_K) { /* ql[128] | qh[64] | sc[16] | d */
        const int h = k / 4, j = k % 4; /* half h: weights 128h + 32j + l */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32 * (j & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
        const __m256i lo = j < 2 ? _mm256_and_si256(v, m4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        /* qh bits 2j, 2j + 1 → bits 4, 5 */
        const __m256i hb = j == 0 ? _mm256_slli_epi16(qh, 4) : j == 1 ? _mm256_slli_epi16(qh, 2) : j == 2 ? qh : _mm256_srli_epi16(qh, 2);
        return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
    }
    if (f == KILN_WF_Q2_K || f == KILN_WF_Q3_K) { /* chunk k: bits 2(k % 4) of quant bytes 32(k / 4) + l */
        const int q3 = f == KILN_WF_Q3_K, sh = 2 * (k % 4);
        const __m256i v = _mm256_loadu_si256((const __m256i *)(p + (q3 ? 32 : 16) + 32 * (k / 4)));
        const __m256i lo = _mm256_and_si256(sh ? _mm256_srli_epi16(v, sh) : v, _mm256_set1_epi8(3));
        if (!q3) return lo;
        /* Q3_K: + (bit k of hmask[l]) << 2, unsigned q + 4 in 0..7 */
        const __m256i hm = _mm256_loadu_si256((const __m256i *)p);
        const __m256i hb = k < 2 ? _mm256_slli_epi16(hm, 2 - k) : k == 2 ? hm : _mm256_srli_epi16(hm, k - 2);
        return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(4)));
    }
    if (f == KILN_WF_IQ4_XS) { /* sub-block k: 16 nibble bytes, elements l (low) and 16 + l (high); signed levels */
        const __m128i v = _mm_loadu_si128((const __m128i *)(p + 8 + 16 * k)), n4 = _mm_set1_epi8(0x0F);
        const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), n4), _mm_and_si128(v, n4));
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
        return _mm256_shuffle_epi8(lut, q);
    }
    const uint8_t *ql = p + (f == KILN_WF_Q5_K ? 48 : 16);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(ql + 32 * (k / 2)));
    __m256i q = (k & 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
    if (f == KILN_WF_Q5_K) { /* bit k of qh[l] → bit 4 */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
        const __m256i hb = k <= 4 ? _mm256_slli_epi16(qh, 4 - k) : _mm256_srli_epi16(qh, k - 4);
        q = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
    }
    return q;
}
/* One row × NT tokens (xp + t·xpb): Y[t·ldy]. */
AI void kq2_tile(int f, int NT, const uint8_t *p, int64_t nsb, size_t bsb, const uint8_t *xp, size_t xpb, float *Y, size_t ldy) {
    __m256 acc[4], accm[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, p += bsb) {
        if (NT == 1)
            for (size_t l = 0; l < bsb; l += 64) PF_LINE(p + KQ_PF_BYTES + l);
        __m256i tab0, tab1, mb = _mm256_setzero_si256();
        float d, dmin = 0.0f;
        uint64_t xs8 = 0; /* IQ4_XS: the 8 sub-block scales (int8 bytes) */
        if (f == KILN_WF_Q2_K || f == KILN_WF_Q3_K) { /* 16 scales of 16 columns, as Q6_K's */
            __m256i s16;
            if (f == KILN_WF_Q3_K) {
                uint64_t lo, hi;
                kiln_q3k_scales16(p + 96, &lo, &hi);
                s16 = _mm256_cvtepi8_epi16(_mm_set_epi64x((long long)hi, (long long)lo));
                mb = s16;
                uint16_t h;
                memcpy(&h, p + 108, 2);
                d = _cvtsh_ss(h);
            } else {
                const __m128i raw = _mm_loadu_si128((const __m128i *)p), n4 = _mm_set1_epi8(0x0F);
                s16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, n4));
                mb = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), n4));
                const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int32_t *)(p + 80)));
                d = _mm_cvtss_f32(dd);
                dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
            }
            tab0 = _mm256_permute2x128_si256(s16, s16, 0x00);
            tab1 = _mm256_permute2x128_si256(s16, s16, 0x11);
        } else if (f == KILN_WF_IQ4_XS) {
            xs8 = kiln_iq4xs_scales8(p + 2);
            tab0 = tab1 = _mm256_setzero_si256();
            uint16_t h;
            memcpy(&h, p, 2);
            d = _cvtsh_ss(h);
        } else if (f == KILN_WF_Q6_K) {
            const __m128i sc = _mm_loadu_si128((const __m128i *)(p + 192));
            const __m256i s16 = _mm256_cvtepi8_epi16(sc);
            tab0 = _mm256_permute2x128_si256(s16, s16, 0x00);
            tab1 = _mm256_permute2x128_si256(s16, s16, 0x11);
            mb = s16;
            uint16_t h;
            memcpy(&h, p + 208, 2);
            d = _cvtsh_ss(h);
        } else {
            uint64_t sc, mn;
            kq2_scales8(p + 4, &sc, &mn);
            tab0 = tab1 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
            const __m128i mv = _mm_cvtsi64_si128((long long)mn);
            mb = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
            const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int32_t *)p));
            d = _mm_cvtss_f32(dd);
            dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
        }
        __m256i isum[4];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i wv = kq2_weights(f, p, k);
            if (f == KILN_WF_IQ4_XS) { /* signed levels: |w| · (x signed by w), int16 pairs ≤ 2·127·127 */
                const __m256i S = _mm256_set1_epi16((int8_t)(xs8 >> (8 * k))), aw = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const __m256i xv = _mm256_load_si256((const __m256i *)(xp + (size_t)t * xpb + (size_t)sb * KQ_REC + 32 * k));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), S));
                }
                continue;
            }
            const __m256i S = f == KILN_WF_Q6_K || f == KILN_WF_Q2_K || f == KILN_WF_Q3_K ? kq2_scale(k < 4 ? tab0 : tab1, (2 * k) % 8, (2 * k + 1) % 8)
                                                                                          : kq2_scale(tab0, k, k);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                isum[t] = KQ_DOT(isum[t], wv, _mm256_load_si256((const __m256i *)(xp + (size_t)t * xpb + (size_t)sb * KQ_REC + 32 * k)), S);
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const uint8_t *o = xp + (size_t)t * xpb + (size_t)sb * KQ_REC;
            float dx;
            memcpy(&dx, o + 288, 4);
            if (f != KILN_WF_IQ4_XS) {
                const __m256i bm = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(o + 256)), mb);
                if (f == KILN_WF_Q6_K) isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(bm, 5));
                else if (f == KILN_WF_Q3_K) isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(bm, 2));
                else accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bm), _mm256_set1_ps(dmin * dx), accm[t]);
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * dx), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
        Y[(size_t)t * ldy] = f == KILN_WF_Q4_K || f == KILN_WF_Q5_K || f == KILN_WF_Q2_K ? hsum256(acc[t]) - hsum256(accm[t]) : hsum256(acc[t]);
}
AI void kq2_rows(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t nsb = w->cols / 256;
    const size_t bsb = f == KILN_WF_Q4_K ? 144 : f == KILN_WF_Q5_K ? 176 : f == KILN_WF_Q2_K ? 84 : f == KILN_WF_Q3_K ? 110 : f == KILN_WF_IQ4_XS ? 136 : 210;
    if (n == 1) {
        for (int64_t r = r0; r < r1; r++) kq2_tile(f, 1, w->data + (size_t)r * w->row_bytes, nsb, bsb, xp, 0, Y + (r - r0), 0);
        return;
    }
    /* tokens in blocks whose prepared rows fit in L2 (256 KiB), each row against the block in tiles
     * of 4 tokens (the row's weights stay in L1 meanwhile) */
    int tb = (int)((256u << 10) / (xpb ? xpb : 1));
    tb = tb < 4 ? 4 : tb - tb % 4;
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *p = w->data + (size_t)r * w->row_bytes;
            int t = t0;
            for (; t + 4 <= t1; t += 4) kq2_tile(f, 4, p, nsb, bsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, (size_t)ldy);
            switch (t1 - t) {
            case 3: kq2_tile(f, 3, p, nsb, bsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, (size_t)ldy); break;
            case 2: kq2_tile(f, 2, p, nsb, bsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, (size_t)ldy); break;
            case 1: kq2_tile(f, 1, p, nsb, bsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, (size_t)ldy); break;
            default: break;
            }
        }
    }
}
#define KQ_ENTRIES(F, fmt)                                                                                                          \
    static void KQ_GEMV(F)(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {                \
        (void)x;                                                                                                                    \
        kq2_rows(fmt, w, xp, 0, 1, y, 0, r0, r1);                                                                                   \
    }                                                                                                                               \
    static void KQ_GEMM(F)(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) { \
        kq2_rows(fmt, w, xp, xpb, n, Y, ldy, r0, r1);                                                                               \
    }
KQ_ENTRIES(q4k, KILN_WF_Q4_K)
KQ_ENTRIES(q5k, KILN_WF_Q5_K)
KQ_ENTRIES(q6k, KILN_WF_Q6_K)
KQ_ENTRIES(q2k, KILN_WF_Q2_K)
KQ_ENTRIES(q3k, KILN_WF_Q3_K)
KQ_ENTRIES(iq4xs, KILN_WF_IQ4_XS)
#undef KQ_ENTRIES
