/* k16_q45.h — Q4_K / Q5_K (and Q6_K's quants, at the end) in the 16-row super-block interleave (docs/FORMATS.md; kernels/tile.c
 * "K16"): the 16 rows' 6-bit scales and mins of a pair of sub-blocks, and their quants as unsigned
 * bytes, unpacked from a super-block's run s (d, dmin [0, 64) | scale planes [64, 256) | Q5_K: qh
 * vectors [256, 768) | qs vectors [256, 2304) or [768, 2816)). Shared by the AVX-512 kernel
 * (gemv_avx512.c k16_tile) and the AMX one (kernels/q16_amx.h), so that both read the layout with the
 * same operations. AVX-512 F / BW. */
#ifndef KILN_KERNELS_K16_Q45_H
#define KILN_KERNELS_K16_Q45_H
#include <immintrin.h>
#include <stdint.h>

/* kiln_kq_scale_min for 16 rows at once: sub-blocks 2i + e (e = 0, 1), planes of the 12 bytes;
 * each __m128i holds the 16 rows' values as bytes */
static inline __attribute__((always_inline)) void k16_q45_scales(const uint8_t *s, int i, __m128i sc[2], __m128i mn[2]) {
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
static inline __attribute__((always_inline)) void k16_q45_quants(const uint8_t *s, int q5, int i, int m, __m512i *lo, __m512i *hi) {
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
static inline __attribute__((always_inline)) void k16_q6_quants(const uint8_t *s, int h, int jp, int m, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i a = _mm512_loadu_si512(s + 64 * (16 * h + 8 * jp + m));
    const __m512i z = _mm512_loadu_si512(s + 2048 + 64 * (8 * h + m));
    const __m512i zl = jp ? _mm512_slli_epi16(z, 2) : _mm512_slli_epi16(z, 4); /* bits 2jp → 4 */
    const __m512i zh = jp ? _mm512_srli_epi16(z, 2) : z;                       /* bits 2jp + 4 → 4 */
    *lo = _mm512_ternarylogic_epi32(a, m4, _mm512_and_si512(zl, m30), 0xEA);
    *hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4), m4, _mm512_and_si512(zh, m30), 0xEA);
}
#endif
