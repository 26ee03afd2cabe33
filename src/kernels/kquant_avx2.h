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
    const size_t bsb = kiln_wf_block_bytes((kiln_wformat)f);
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
/* ---- the 16-row super-block interleave (tiled = 1; gemv.h, tile.c: the AVX-512 kernels' layout) ----
 * Each 16-row group as two halves of 8 rows, one after the other (the group stays in L2 meanwhile):
 * bytes 32·hf .. +31 of every 64-byte quant vector, bytes 8·hf .. +7 of every byte plane, f16 words
 * 8·hf .. +7. Per (row, token) the integer sums of gemv_avx512.c's k16_tile (exact in both forms:
 * vpmaddubsw pairs ≤ 2·31·127, vpmaddwd of the pairs), except IQ4_XS: its signed levels by the sign
 * trick (|w| · x with w's sign, pairs ≤ 2·127·127), so nothing to remove afterwards. GEMV and GEMM
 * (NT ≤ 2 tokens: 16 registers) are one kernel; the rows past the last group take kq2_tile in both.
 * Q4_K, Q5_K, Q2_K and IQ4_XS only (K16H_FMT): the same construction for Q6_K and Q3_K (tried)
 * decoded a Q6_K file at 0.75× the row kernel here (`scripts/bench_ab.py`, 3 rounds, `--isa avx2`:
 * the per-group vpmulld and the two passes over each group cost more than the row kernel's vpmaddwd
 * by 16-column scales), so those two keep the row layout on AVX2 (the table's tiled_mask). */
#if KQ_VNNI
#define K16_DPBUSD(acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, x)
#define K16_DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#else
#define K16_DPBUSD(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
#define K16_DPWSSD(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif
#define K16H_NT 2
#define K16H_FMT(f) ((f) == KILN_WF_Q4_K || (f) == KILN_WF_Q5_K || (f) == KILN_WF_Q2_K || (f) == KILN_WF_IQ4_XS)
AI __m256i k16h_bcast(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
AI __m256i k16h_v(const uint8_t *p, int hf) { return _mm256_loadu_si256((const __m256i *)(p + 32 * hf)); }
AI __m128i k16h_plane(const uint8_t *p, int hf) { return _mm_loadl_epi64((const __m128i *)(p + 8 * hf)); }
AI __m256 k16h_f16(const uint8_t *p, int hf) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * hf))); }
/* 8 rows' bytes a (even group) and b (odd) → int32 lanes (a_r | b_r << 16) as unsigned int16. */
AI __m256i k16h_pair16(__m128i a, __m128i b) { return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b)); }

/* Half hf (rows 8hf .. 8hf + 7) of the group at g × NT tokens: Y[t·ldy + j], j < 8. */
AI void k16h_tile(int f, int NT, int hf, const uint8_t *g, int64_t nsb, const uint8_t *xp, size_t xpb, float *Y, int64_t ldy) {
    const size_t gsb = 16 * kiln_wf_block_bytes((kiln_wformat)f);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int nc = NT == 1 ? 2 : 1; /* GEMV: two chains per sum (vpdpbusd's latency) */
    __m256 acc[K16H_NT];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *s = g + (size_t)sb * gsb, *o[K16H_NT];
        if (NT == 1 && hf == 0)
            for (size_t l = 0; l < gsb; l += 64) PF_LINE(s + KQ_PF_BYTES + l);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) o[t] = xp + (size_t)t * xpb + (size_t)sb * KQ_REC;
        __m256i isum[K16H_NT], mi[K16H_NT];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) isum[t] = mi[t] = _mm256_setzero_si256();
        __m256 wd, wm = _mm256_setzero_ps();
        if (f == KILN_WF_Q2_K) {
            const __m256i m3 = _mm256_set1_epi8(3);
            const uint8_t *qs = s + 256;
            for (int h = 0; h < 2; h++)
                for (int hl = 0; hl < 2; hl++)
                    for (int sp = 0; sp < 2; sp++) {
                        __m256i pa[2 * K16H_NT], pb[2 * K16H_NT];
                        const int s0 = 2 * sp, s1 = 2 * sp + 1;
#pragma GCC unroll 4
                        for (int t = 0; t < nc * NT; t++) pa[t] = pb[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
                        for (int mm = 0; mm < 4; mm++) {
                            const int m = 4 * hl + mm, c = NT == 1 ? (mm & 1) : 0;
                            const __m256i v = k16h_v(qs + 64 * (8 * h + m), hf);
                            const __m256i wa = _mm256_and_si256(s0 ? _mm256_srli_epi16(v, 2 * s0) : v, m3);
                            const __m256i wb = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s1), m3);
#pragma GCC unroll 2
                            for (int t = 0; t < NT; t++) {
                                pa[c * NT + t] = K16_DPBUSD(pa[c * NT + t], wa, k16h_bcast(o[t] + 128 * h + 32 * s0 + 4 * m));
                                pb[c * NT + t] = K16_DPBUSD(pb[c * NT + t], wb, k16h_bcast(o[t] + 128 * h + 32 * s1 + 4 * m));
                            }
                        }
                        const int ga = 8 * h + 2 * s0 + hl, gb = 8 * h + 2 * s1 + hl;
                        const __m256i n4 = _mm256_set1_epi32(0xF);
                        const __m256i sa = _mm256_and_si256(_mm256_cvtepu8_epi32(k16h_plane(s + 16 * ga, hf)), n4);
                        const __m256i sbv = _mm256_and_si256(_mm256_cvtepu8_epi32(k16h_plane(s + 16 * gb, hf)), n4);
#pragma GCC unroll 2
                        for (int t = 0; t < NT; t++) {
                            const __m256i qa = NT == 1 ? _mm256_add_epi32(pa[0], pa[1]) : pa[t], qb = NT == 1 ? _mm256_add_epi32(pb[0], pb[1]) : pb[t];
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_mullo_epi32(qa, sa), _mm256_mullo_epi32(qb, sbv)));
                        }
                    }
            for (int k = 0; k < 8; k++) { /* the mins */
                const __m128i n15 = _mm_set1_epi8(0x0F);
                const __m256i a2 = k16h_pair16(_mm_and_si128(_mm_srli_epi16(k16h_plane(s + 32 * k, hf), 4), n15),
                                               _mm_and_si128(_mm_srli_epi16(k16h_plane(s + 32 * k + 16, hf), 4), n15));
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) mi[t] = K16_DPWSSD(mi[t], a2, k16h_bcast(o[t] + 256 + 4 * k));
            }
            wd = k16h_f16(s + 1280, hf);
            wm = k16h_f16(s + 1312, hf);
        } else if (f == KILN_WF_IQ4_XS) {
            const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113));
            const __m256i n4 = _mm256_set1_epi32(0xF), n3 = _mm256_set1_epi32(3);
            const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + 32 + 16 * hf)));
            for (int j = 0; j < 8; j++) {
                const __m256i pl = _mm256_cvtepu8_epi32(k16h_plane(s + 64 + 16 * (j / 2), hf));
                const __m256i lo = _mm256_and_si256(j % 2 ? _mm256_srli_epi32(pl, 4) : pl, n4);
                const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(j ? _mm256_srli_epi32(sh, 2 * j) : sh, n3), 4);
                const __m256i sj = _mm256_sub_epi32(_mm256_or_si256(lo, hi), _mm256_set1_epi32(32));
                __m256i pa[2 * K16H_NT];
#pragma GCC unroll 4
                for (int t = 0; t < nc * NT; t++) pa[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int mm = 0; mm < 4; mm++) {
                    const int c = NT == 1 ? (mm & 1) : 0;
                    const __m256i v = k16h_v(s + 128 + 64 * (4 * j + mm), hf);
                    const __m256i wl = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
                    const __m256i wh = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
                    const __m256i al = _mm256_abs_epi8(wl), ah = _mm256_abs_epi8(wh);
#pragma GCC unroll 2
                    for (int t = 0; t < NT; t++) {
                        pa[c * NT + t] = K16_DPBUSD(pa[c * NT + t], al, _mm256_sign_epi8(k16h_bcast(o[t] + 32 * j + 4 * mm), wl));
                        pa[c * NT + t] = K16_DPBUSD(pa[c * NT + t], ah, _mm256_sign_epi8(k16h_bcast(o[t] + 32 * j + 16 + 4 * mm), wh));
                    }
                }
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++)
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(NT == 1 ? _mm256_add_epi32(pa[0], pa[1]) : pa[t], sj));
            }
            wd = k16h_f16(s, hf);
        } else { /* Q4_K, Q5_K */
            const int q5 = f == KILN_WF_Q5_K;
            const uint8_t *qs = s + (q5 ? 768 : 256);
            const __m128i n63 = _mm_set1_epi8(63), n15 = _mm_set1_epi8(0x0F), n30 = _mm_set1_epi8(0x30);
            for (int i = 0; i < 4; i++) {
                __m128i sc[2], mn[2];
                for (int e = 0; e < 2; e++) {
                    const int j = 2 * i + e;
                    const __m128i pj4 = k16h_plane(s + 64 + 16 * (j + 4), hf);
                    if (j < 4) {
                        sc[e] = _mm_and_si128(k16h_plane(s + 64 + 16 * j, hf), n63);
                        mn[e] = _mm_and_si128(pj4, n63);
                    } else {
                        const __m128i pm4 = k16h_plane(s + 64 + 16 * (j - 4), hf), pj = k16h_plane(s + 64 + 16 * j, hf);
                        sc[e] = _mm_or_si128(_mm_and_si128(pj4, n15), _mm_and_si128(_mm_srli_epi16(pm4, 2), n30));
                        mn[e] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(pj4, 4), n15), _mm_and_si128(_mm_srli_epi16(pj, 2), n30));
                    }
                }
                __m256i pa[2 * K16H_NT], pb[2 * K16H_NT];
#pragma GCC unroll 4
                for (int t = 0; t < nc * NT; t++) pa[t] = pb[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int m = 0; m < 8; m++) {
                    const int c = NT == 1 ? (m & 1) : 0;
                    const __m256i v = k16h_v(qs + 64 * (8 * i + m), hf);
                    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (q5) {
                        const __m256i z = k16h_v(s + 256 + 64 * m, hf), b4 = _mm256_set1_epi8(0x10);
                        const __m256i zl = 2 * i <= 4 ? _mm256_slli_epi16(z, 4 - 2 * i) : _mm256_srli_epi16(z, 2 * i - 4);
                        const __m256i zh = 2 * i + 1 <= 4 ? _mm256_slli_epi16(z, 3 - 2 * i) : _mm256_srli_epi16(z, 2 * i - 3);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(zl, b4));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(zh, b4));
                    }
#pragma GCC unroll 2
                    for (int t = 0; t < NT; t++) {
                        pa[c * NT + t] = K16_DPBUSD(pa[c * NT + t], lo, k16h_bcast(o[t] + 64 * i + 4 * m));
                        pb[c * NT + t] = K16_DPBUSD(pb[c * NT + t], hi, k16h_bcast(o[t] + 64 * i + 32 + 4 * m));
                    }
                }
                const __m256i sa = _mm256_cvtepu8_epi32(sc[0]), sbv = _mm256_cvtepu8_epi32(sc[1]);
                const __m256i ma = _mm256_cvtepu8_epi32(mn[0]), mb = _mm256_cvtepu8_epi32(mn[1]);
                const __m256i ma2 = _mm256_or_si256(ma, _mm256_slli_epi32(ma, 16)), mb2 = _mm256_or_si256(mb, _mm256_slli_epi32(mb, 16));
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    const __m256i qa = NT == 1 ? _mm256_add_epi32(pa[0], pa[1]) : pa[t], qb = NT == 1 ? _mm256_add_epi32(pb[0], pb[1]) : pb[t];
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_mullo_epi32(qa, sa), _mm256_mullo_epi32(qb, sbv)));
                    mi[t] = K16_DPWSSD(mi[t], ma2, k16h_bcast(o[t] + 256 + 8 * i));
                    mi[t] = K16_DPWSSD(mi[t], mb2, k16h_bcast(o[t] + 256 + 8 * i + 4));
                }
            }
            wd = k16h_f16(s, hf);
            wm = k16h_f16(s + 32, hf);
        }
        const int has_min = f != KILN_WF_IQ4_XS;
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            float dx;
            memcpy(&dx, o[t] + 288, 4);
            const __m256 vdx = _mm256_set1_ps(dx);
            if (has_min) {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(wd, vdx), acc[t]);
                acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi[t]), _mm256_mul_ps(wm, vdx), acc[t]);
            } else {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], mi[t])), _mm256_mul_ps(wd, vdx), acc[t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(Y + (size_t)t * (size_t)ldy, acc[t]);
}
AI void k16h_group(int f, const kiln_weight *w, int64_t q, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy) {
    const uint8_t *g = w->data + (size_t)q * 16 * w->row_bytes;
    const int64_t nsb = w->cols / 256;
    for (int hf = 0; hf < 2; hf++) {
        int t = 0;
        for (; t + 2 <= n; t += 2) k16h_tile(f, 2, hf, g, nsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + 8 * hf, ldy);
        if (t < n) k16h_tile(f, 1, hf, g, nsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + 8 * hf, ldy);
    }
}
AI void k16h_rest(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t yoff, int64_t r0, int64_t r1) {
    if (xpb == 0) kq2_rows(f, w, xp, 0, 1, Y + (r0 - yoff), 0, r0, r1);
    else kq2_rows(f, w, xp, xpb, n, Y - yoff, ldy, r0, r1);
}
#define Q16_ROWS k16h_rows
#define Q16_GROUP k16h_group
#define Q16_NT K16H_NT
#define Q16_X_BYTES (256u << 10)
#define Q16_REST k16h_rest
#include "kernels/q16_rows.h"
#undef Q16_ROWS
#undef Q16_GROUP
#undef Q16_NT
#undef Q16_X_BYTES
#undef Q16_REST
#undef K16_DPBUSD
#undef K16_DPWSSD
#define KQ_ENTRIES(F, fmt)                                                                                                          \
    static void KQ_GEMV(F)(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {                \
        (void)x;                                                                                                                    \
        if (K16H_FMT(fmt) && w->tiled) k16h_rows(fmt, w, xp, 0, 1, y, 0, r0, r0, r1);                                             \
        else kq2_rows(fmt, w, xp, 0, 1, y, 0, r0, r1);                                                                              \
    }                                                                                                                               \
    static void KQ_GEMM(F)(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) { \
        if (K16H_FMT(fmt) && w->tiled) k16h_rows(fmt, w, xp, xpb, n, Y, ldy, 0, r0, r1);                                          \
        else kq2_rows(fmt, w, xp, xpb, n, Y, ldy, r0, r1);                                                                          \
    }
KQ_ENTRIES(q4k, KILN_WF_Q4_K)
KQ_ENTRIES(q5k, KILN_WF_Q5_K)
KQ_ENTRIES(q6k, KILN_WF_Q6_K)
KQ_ENTRIES(q2k, KILN_WF_Q2_K)
KQ_ENTRIES(q3k, KILN_WF_Q3_K)
KQ_ENTRIES(iq4xs, KILN_WF_IQ4_XS)
#undef KQ_ENTRIES
