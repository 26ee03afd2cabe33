/* k16_quants.h — the GGUF K-quants (and IQ4_XS) in the 16-row super-block interleave (docs/FORMATS.md;
 * kernels/tile.c "K16"): the 16 rows' scales, mins and quants unpacked from a super-block's run s.
 * Shared by the AVX-512 kernel (gemv_avx512.c k16_tile) and the AMX one (kernels/q16_amx.h), so that
 * both read each layout with the same operations; and where the prepared activation record
 * (gemv_avx512.c xprep_kq_impl) keeps each 16-column group (kq_pos). AVX-512 F / BW / VNNI.
 *   Q4_K / Q5_K: d, dmin [0, 64) | scale planes [64, 256) | Q5_K: qh vectors [256, 768) | qs vectors
 *     [256, 2304) or [768, 2816): k16_q45_scales, k16_q45_quants;
 *   Q6_K: k16_q6_quants;
 *   Q2_K / Q3_K: k16_q23_quants, k16_q23_scale, k16_q23_minpair;
 *   IQ4_XS: k16_xs_quants, k16_xs_scale. */
#ifndef KILN_KERNELS_K16_QUANTS_H
#define KILN_KERNELS_K16_QUANTS_H
#include <immintrin.h>
#include <stdint.h>

#define K16_AI static inline __attribute__((always_inline))

/* Where natural 16-column group i (0..15) of a super-block goes in the prepared record's q[256]
 * (byte offset), so that each format's 64-byte weight chunks meet their columns:
 *   KQ_NATURAL  Q6_K: columns in order;
 *   KQ_PERM45   Q4_K / Q5_K: sub-blocks of 32 in the order 0,2 | 1,3 | 4,6 | 5,7;
 *   KQ_PERM2    Q2_K / Q3_K: chunk k = sub-blocks k and 4 + k (shift 2k of the 64 quant bytes: bytes
 *               0-31 hold sub-blocks 0-3's 2-bit fields, bytes 32-63 those of 4-7);
 *   KQ_PERMXS   IQ4_XS: chunk 2h + s = nibble s (low, high) of bytes 64h..64h+63, i.e. 16-column
 *               group 2(4h + jj) + s at byte 16jj of the chunk. */
enum { KQ_NATURAL, KQ_PERM45, KQ_PERM2, KQ_PERMXS };
K16_AI int kq_pos(int perm, int i) {
    const int sub = i / 2, half = i % 2;
    switch (perm) {
    case KQ_PERM45: return 64 * ((sub >> 2) * 2 + (sub & 1)) + 32 * ((sub >> 1) & 1) + 16 * half;
    case KQ_PERM2: return 64 * (sub % 4) + 32 * (sub / 4) + 16 * half;
    case KQ_PERMXS: return 64 * (2 * (sub / 4) + half) + 16 * (sub % 4);
    default: return 16 * i;
    }
}

/* kiln_kq_scale_min for 16 rows at once: sub-blocks 2i + e (e = 0, 1), planes of the 12 bytes;
 * each __m128i holds the 16 rows' values as bytes */
K16_AI void k16_q45_scales(const uint8_t *s, int i, __m128i sc[2], __m128i mn[2]) {
    const __m128i n63 = _mm_set1_epi8(63), n15 = _mm_set1_epi8(0x0F), n30 = _mm_set1_epi8(0x30);
    for (int e = 0; e < 2; e++) {
        const int j = 2 * i + e;
        const __m128i pj4 = _mm_loadu_si128((const __m128i *)(s + 64 + 16 * (j + 4 < 12 ? j + 4 : j)));
        if (j < 4) {
            sc[e] = _mm_and_si128(_mm_loadu_si128((const __m128i *)(s + 64 + 16 * j)), n63);
            mn[e] = _mm_and_si128(pj4, n63);
        } else {
            const __m128i pm4 = _mm_loadu_si128((const __m128i *)(s + 64 + 16 * (j - 4))), pj = _mm_loadu_si128((const __m128i *)(s + 64 + 16 * j));
            sc[e] = _mm_or_si128(_mm_and_si128(pj4, n15), _mm_and_si128(_mm_srli_epi16(pm4, 2), n30));
            mn[e] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(pj4, 4), n15), _mm_and_si128(_mm_srli_epi16(pj, 2), n30));
        }
    }
}
/* Quant vector 8i + m: lo = sub-block 2i's columns 4m..4m+3 of the 16 rows (bytes 4r..4r+3 row r),
 * hi = sub-block 2i + 1's; Q5_K with the fifth bit (bit 2i / 2i + 1 of qh byte l is the fifth bit of
 * sub-block 2i / 2i + 1's element l). */
K16_AI void k16_q45_quants(const uint8_t *s, int q5, int i, int m, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i v = _mm512_loadu_si512(s + (q5 ? 768 : 256) + 64 * (8 * i + m));
    __m512i l = _mm512_and_si512(v, m4), h = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if (q5) {
        const __m512i z = _mm512_loadu_si512(s + 256 + 64 * m), b4 = _mm512_set1_epi8(0x10);
        const __m512i zl = 2 * i <= 4 ? _mm512_slli_epi16(z, 4 - 2 * i) : _mm512_srli_epi16(z, 2 * i - 4);
        const __m512i zh = 2 * i + 1 <= 4 ? _mm512_slli_epi16(z, 3 - 2 * i) : _mm512_srli_epi16(z, 2 * i - 3);
        l = _mm512_ternarylogic_epi32(l, zl, b4, 0xF8);
        h = _mm512_ternarylogic_epi32(h, zh, b4, 0xF8);
    }
    *lo = l;
    *hi = h;
}
/* Q6_K (ql vectors [0, 2048) | qh vectors [2048, 3072) | sc planes [3072, 3328) | d): quant vectors
 * of 16-column groups 8h + 2jp + m / 4 (lo, columns 128h + 32jp + 4m..) and 8h + 2(jp + 2) + m / 4 (hi,
 * 128h + 32(jp + 2) + 4m..), m = 0..7, as the stored q + 32 (0..63): low 4 bits from ql, bits 4-5 from qh. */
K16_AI void k16_q6_quants(const uint8_t *s, int h, int jp, int m, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i a = _mm512_loadu_si512(s + 64 * (16 * h + 8 * jp + m));
    const __m512i z = _mm512_loadu_si512(s + 2048 + 64 * (8 * h + m));
    const __m512i zl = jp ? _mm512_slli_epi16(z, 2) : _mm512_slli_epi16(z, 4); /* bits 2jp → 4 */
    const __m512i zh = jp ? _mm512_srli_epi16(z, 2) : z;                       /* bits 2jp + 4 → 4 */
    *lo = _mm512_ternarylogic_epi32(a, m4, _mm512_and_si512(zl, m30), 0xEA);
    *hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4), m4, _mm512_and_si512(zh, m30), 0xEA);
}

/* Q3_K: the 16 rows' signed scale of 16-column group g (int8 bytes, sc − 32) from the 12 byte planes
 * at pl (plane k = byte k of the 16 rows): low 4 bits from byte g (g < 8) or the high nibble of byte
 * g − 8, top 2 bits from byte 8 + g % 4 at bit 2·(g / 4) (kiln_q3k_scales16 for 16 rows). */
K16_AI __m128i q3k_scale16(const uint8_t *pl, int g) {
    const __m128i n15 = _mm_set1_epi8(0x0F), n3 = _mm_set1_epi8(3);
    const __m128i plo = _mm_loadu_si128((const __m128i *)(pl + 16 * (g % 8))), phi = _mm_loadu_si128((const __m128i *)(pl + 16 * (8 + g % 4)));
    const __m128i lo = g < 8 ? _mm_and_si128(plo, n15) : _mm_and_si128(_mm_srli_epi16(plo, 4), n15);
    const __m128i hi = _mm_slli_epi16(_mm_and_si128(g / 4 ? _mm_srli_epi16(phi, 2 * (g / 4)) : phi, n3), 4);
    return _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
}
/* Two 16-row byte vectors a (even group), b (odd group) → int32 lanes (a_r | b_r << 16) as int16, signed or not. */
K16_AI __m512i k16_pair16(__m128i a, __m128i b, int is_signed) {
    const __m256i ab = _mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b));
    return is_signed ? _mm512_cvtepi8_epi16(ab) : _mm512_cvtepu8_epi16(ab);
}

/* Q2_K (scale planes [0, 256) (scale | min << 4) | qs vectors [256, 1280) | d [1280, 1312) | dmin
 * [1312, 1344)) and Q3_K (hmask vectors [0, 512) | qs vectors [512, 1536) | scale planes [1536, 1728)
 * | d [1728, 1760)): qs byte 32h + l holds elements 128h + 32s + l at bits 2s (Q3_K: the high bit is
 * bit 4h + s of hmask byte l; stored q + 4 in 0..7). Quant vector m (0..7) of half h at shift s:
 * columns 128h + 32s + 4m..+3 of the 16 rows (bytes 4r..4r+3 row r), i.e. 16-column group
 * 8h + 2s + m / 4, as unsigned bytes. */
K16_AI __m512i k16_q23_quants(const uint8_t *s, int q3, int h, int sh, int m) {
    const __m512i v = _mm512_loadu_si512(s + (q3 ? 512 : 256) + 64 * (8 * h + m));
    __m512i w = _mm512_and_si512(sh ? _mm512_srli_epi16(v, 2 * sh) : v, _mm512_set1_epi8(3));
    if (q3) { /* hmask bit j = 4h + s → bit 2 */
        const __m512i z = _mm512_loadu_si512(s + 64 * m);
        const int j = 4 * h + sh;
        const __m512i zj = j >= 2 ? _mm512_srli_epi16(z, j - 2) : _mm512_slli_epi16(z, 2 - j);
        w = _mm512_ternarylogic_epi32(w, zj, _mm512_set1_epi8(4), 0xF8);
    }
    return w;
}
/* The 16 rows' scale of 16-column group g as int32 lanes: Q2_K its 4-bit scale, Q3_K sc − 32. */
K16_AI __m512i k16_q23_scale(const uint8_t *s, int q3, int g) {
    if (q3) return _mm512_cvtepi8_epi32(q3k_scale16(s + 1536, g));
    return _mm512_and_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(s + 16 * g))), _mm512_set1_epi32(0xF));
}
/* The pair (groups 2k, 2k + 1) that the activation's pair of 16-column sums (bs_2k, bs_2k+1) meets by
 * vpdpwssd: Q2_K the mins (m_2k, m_2k+1); Q3_K the +4, (4·sc_2k, 4·sc_2k+1). */
K16_AI __m512i k16_q23_minpair(const uint8_t *s, int q3, int k) {
    if (q3) return _mm512_slli_epi16(k16_pair16(q3k_scale16(s + 1536, 2 * k), q3k_scale16(s + 1536, 2 * k + 1), 1), 2);
    const __m128i n15 = _mm_set1_epi8(0x0F);
    return k16_pair16(_mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(s + 32 * k)), 4), n15),
                      _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(s + 32 * k + 16)), 4), n15), 0);
}

/* IQ4_NL / IQ4_XS levels (ggml's kvalues_iq4nl) + 128, as u8, in every 128-bit lane (vpshufb table). */
K16_AI __m512i iq4_lut(void) {
    return _mm512_broadcast_i32x4(_mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153, (char)166,
                                                (char)181, (char)197, (char)217, (char)241));
}
/* IQ4_XS (d [0, 32) | scales_h [32, 64) (row r's u16 at 2r) | scales_l planes [64, 128) | qs vectors
 * [128, 2176)): qs byte 16j + i holds element 32j + i (low nibble) and 32j + 16 + i (high), as levels
 * + 128. Quant vector mm (0..3) of sub-block j: lo = columns 32j + 4mm..+3, hi = 32j + 16 + 4mm..+3. */
K16_AI void k16_xs_quants(const uint8_t *s, int j, int mm, __m512i *lo, __m512i *hi) {
    const __m512i lut = iq4_lut(), m4 = _mm512_set1_epi8(0x0F);
    const __m512i v = _mm512_loadu_si512(s + 128 + 64 * (4 * j + mm));
    *lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4));
    *hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
}
/* The 16 rows' signed 6-bit scale of sub-block j (sc − 32, int32 lanes) and 128·sc in both int16
 * halves (s2: removes the +128 by vpdpwssd against the activation's pair of 16-column sums). */
K16_AI void k16_xs_scale(const uint8_t *s, int j, __m512i *sj, __m512i *s2) {
    const __m512i sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + 32)));
    const __m512i pl = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(s + 64 + 16 * (j / 2))));
    const __m512i lo = _mm512_and_si512(j % 2 ? _mm512_srli_epi32(pl, 4) : pl, _mm512_set1_epi32(0xF));
    const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(j ? _mm512_srli_epi32(sh, 2 * j) : sh, _mm512_set1_epi32(3)), 4);
    *sj = _mm512_sub_epi32(_mm512_or_si512(lo, hi), _mm512_set1_epi32(32));
    const __m512i s7 = _mm512_and_si512(_mm512_slli_epi32(*sj, 7), _mm512_set1_epi32(0xFFFF));
    *s2 = _mm512_or_si512(s7, _mm512_slli_epi32(s7, 16));
}
#endif
