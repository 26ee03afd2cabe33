/* attention_avx512.c — paged attention over F32 / BF16 / FP8 pages and the KV store conversions,
 * AVX-512 (F, BW, VL) + F16C. Same structure as kiln_kv_attend_scalar (kv.c), 16 lanes wide.
 *
 * Per block of up to 16 positions of one page (a block never crosses a page):
 *   QK: each K row is dequantized in registers chunk by chunk (16 values) and multiplied into R
 *       accumulators (one per query row); the 16 per-position accumulators of a row are then
 *       reduced together by a transpose-add (hsum16), giving 16 scores in one vector;
 *   softmax: masked running max, vector exp, running sum (online softmax);
 *   PV: for each chunk of 16 output values, the block's V rows are dequantized in registers and
 *       accumulated with broadcast probabilities into R accumulators.
 * FP8 E4M3 → F32: sign-extend the byte to 16 bits, shift left 7 and clear bit 14: that is the FP16
 * whose value is the E4M3 value × 2^-8 (exact, subnormals included); vcvtph2ps converts it. The 2^8
 * is folded into the per-block factors. Kernels are instantiated per (row count R, dtype). */
#include "kv/kv_isa.h"
#include "base/fp.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI __m512 deq16(const uint8_t *p, __mmask16 m, kiln_kv_dtype dt) {
    if (dt == KILN_KV_F32) return _mm512_maskz_loadu_ps(m, p);
    if (dt == KILN_KV_BF16) {
        __m256i h = _mm256_maskz_loadu_epi16(m, p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    __m128i b = _mm_maskz_loadu_epi8(m, p);
    __m256i w = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(w);
}

/* The fused form of mlh inside the kernels' key loops: the n bytes of a K and a V row (or rows) at
 * the same offset, n a multiple of 4, with their shared keys (one load for both), added into
 * running vectors of even / odd words that the block folds once (mlh_fold). */
AI void mlh_acc2(__m512i *ae, __m512i *ao, __m512i *be, __m512i *bo, const uint8_t *d, const uint8_t *e, size_t n, const uint32_t *key) {
    for (size_t i = 0; i < n; i += 64) {
        const size_t w = (n - i) / 4;
        const __mmask16 m = (__mmask16)(w >= 16 ? 0xFFFFu : (1u << w) - 1);
        const __m512i x = _mm512_maskz_loadu_epi32(m, d + i), y = _mm512_maskz_loadu_epi32(m, e + i), k = _mm512_maskz_loadu_epi32(m, key + i / 4);
        const __m512i ks = _mm512_srli_epi64(k, 32);
        *ae = _mm512_add_epi64(*ae, _mm512_mul_epu32(x, k));
        *ao = _mm512_add_epi64(*ao, _mm512_mul_epu32(_mm512_srli_epi64(x, 32), ks));
        *be = _mm512_add_epi64(*be, _mm512_mul_epu32(y, k));
        *bo = _mm512_add_epi64(*bo, _mm512_mul_epu32(_mm512_srli_epi64(y, 32), ks));
    }
}
/* the lanes summed with vector adds (wrapping mod 2^64; GCC's _mm512_reduce_add_epi64 adds them as
 * signed scalars, undefined behaviour on the overflow this sum is made of) */
AI uint64_t mlh_fold(__m512i ae, __m512i ao) {
    const __m512i v = _mm512_add_epi64(ae, ao);
    const __m256i a = _mm256_add_epi64(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    const __m128i b = _mm_add_epi64(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    return (uint64_t)_mm_cvtsi128_si64(b) + (uint64_t)_mm_extract_epi64(b, 1);
}

/* ---- content hash (kv_isa.h mlh) ----
 * 64 bytes per step without lane-crossing shuffles (the attention kernels' conversions use those):
 * vpmuludq multiplies the even 32-bit words by the even keys where they lie, and the odd ones after
 * a 32-bit shift of both; the tail is a byte-masked load (a partial last word zero-padded). */
static uint64_t mlh(const uint8_t *d, size_t n, const uint32_t *key) {
    __m512i ae = _mm512_setzero_si512(), ao = _mm512_setzero_si512(), be = _mm512_setzero_si512(), bo = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 128 <= n; i += 128) { /* two independent sums: 83 vs 63 GB/s on L1-resident data (Zen 5) */
        __m512i x = _mm512_loadu_si512(d + i), k = _mm512_loadu_si512(key + i / 4);
        __m512i y = _mm512_loadu_si512(d + i + 64), l = _mm512_loadu_si512(key + i / 4 + 16);
        ae = _mm512_add_epi64(ae, _mm512_mul_epu32(x, k));
        ao = _mm512_add_epi64(ao, _mm512_mul_epu32(_mm512_srli_epi64(x, 32), _mm512_srli_epi64(k, 32)));
        be = _mm512_add_epi64(be, _mm512_mul_epu32(y, l));
        bo = _mm512_add_epi64(bo, _mm512_mul_epu32(_mm512_srli_epi64(y, 32), _mm512_srli_epi64(l, 32)));
    }
    ae = _mm512_add_epi64(ae, be);
    ao = _mm512_add_epi64(ao, bo);
    for (; i + 64 <= n; i += 64) {
        __m512i x = _mm512_loadu_si512(d + i), k = _mm512_loadu_si512(key + i / 4);
        ae = _mm512_add_epi64(ae, _mm512_mul_epu32(x, k));
        ao = _mm512_add_epi64(ao, _mm512_mul_epu32(_mm512_srli_epi64(x, 32), _mm512_srli_epi64(k, 32)));
    }
    if (i < n) {
        const size_t r = n - i, words = (r + 3) / 4;
        __m512i x = _mm512_maskz_loadu_epi8((__mmask64)(r >= 64 ? ~0ull : (1ull << r) - 1), d + i);
        __m512i k = _mm512_maskz_loadu_epi32((__mmask16)((1u << words) - 1), key + i / 4);
        ae = _mm512_add_epi64(ae, _mm512_mul_epu32(x, k));
        ao = _mm512_add_epi64(ao, _mm512_mul_epu32(_mm512_srli_epi64(x, 32), _mm512_srli_epi64(k, 32)));
    }
    return mlh_fold(ae, ao);
}

/* exp(x) for x ≤ 0 (Cephes expf polynomial, ~1 ulp); x is clamped at -87.3 (result ~1e-38). */
AI __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

/* t: 16 rows of 16 floats (64-byte aligned). Returns lane i = Σ t[i][0..16). */
AI __m512 hsum16(const float *t) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++) {
        __m512 x = _mm512_load_ps(t + 32 * i), y = _mm512_load_ps(t + 32 * i + 16);
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    }
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(b[2], b[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(c0, c1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* PR = 1: pre-RoPE K smoothing (static FP8 only): the correction q·R(t)μ × scale (kv_isa.h) is
 * accumulated into the same 16-lane QK accumulators as one more kd-long dot product, with its
 * coefficients divided by the block factor km that multiplies the accumulated sum. PR = 0 is the
 * plain kernel, unchanged. */
AI void attend_impl(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1, const int R, const kiln_kv_dtype DT, const int PR, const int HS) {
    const int kd = sp->k_dim, vd = sp->v_dim;
    const size_t es = DT == KILN_KV_F32 ? 4 : DT == KILN_KV_BF16 ? 2 : 1;
    const float fp8f = DT == KILN_KV_FP8 ? 256.0f : 1.0f;
    const int nkc = (kd + 15) / 16, nvc = (vd + 15) / 16;
    const __mmask16 klast = (__mmask16)(kd % 16 ? (1u << (kd % 16)) - 1 : 0xFFFFu);
    const __mmask16 vlast = (__mmask16)(vd % 16 ? (1u << (vd % 16)) - 1 : 0xFFFFu);
    float tmp[KV_MAX_ROWS][256] __attribute__((aligned(64)));
    float pb[KV_MAX_ROWS][16] __attribute__((aligned(64)));
    float corr[KV_MAX_ROWS];
    float qcs[PR ? KV_MAX_ROWS : 1][PR ? 256 : 16] __attribute__((aligned(64)));
    if (PR) {
        const float inv = 1.0f / (sp->kmul * fp8f);
        for (int r = 0; r < R; r++)
            for (int d = 0; d < kd; d++) qcs[r][d] = rw->qc[r][d] * inv;
    }
    int lmax = 0;
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) lmax = rw->lim[r] > lmax ? rw->lim[r] : lmax;
    if (t1 > lmax) t1 = lmax;
    if (sp->prefetch) kiln_kv_prefetch_head(sp, t0, t1, 16, 32);
    /* integrity (sp->hsum, the HS variants): row by row for BF16 / F32 K and V rows of one size and at
     * least a vector, else by block at the block's end (kv_isa.h, kiln_kv_hash_add) */
    const int hrow = HS && DT != KILN_KV_FP8 && sp->hash_v && sp->row_k == sp->row_v && sp->row_k >= 64;
    for (int b0 = t0; b0 < t1;) {
        const kiln_kv_block blk = kiln_kv_block_at(sp, b0, t1, 16, fp8f);
        const kiln_kv_block fut = kiln_kv_future_block(sp, b0 + 32, t1, 16); /* 32 positions ahead, a few rows at a time (kv_isa.h) */
        const int nb = blk.n;
        const uint8_t *kp = blk.k, *vp = blk.v;
        const float km = blk.km, vm = blk.vm;
        /* the keys of the block's first row (row-by-row hash) */
        const uint32_t *kkey = hrow ? sp->hkey + (size_t)(b0 % sp->page_tokens) * (sp->row_k / 4) : NULL;
        __m512i hke = _mm512_setzero_si512(), hko = hke, hve = hke, hvo = hke;
        /* QK, two key rows at a time: each 16-value slice of a query row is loaded once for both
         * (the loads of q, not the arithmetic, bound this loop: R of them per key slice). */
        int j = 0;
        for (; j + 2 <= nb; j += 2) {
            const uint8_t *kr0 = kp + (size_t)j * sp->row_k, *kr1 = kr0 + sp->row_k;
            kiln_kv_prefetch_rows(sp, &fut, j, 2);
            __m512 acc0[KV_MAX_ROWS], acc1[KV_MAX_ROWS];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
            for (int c = 0; c < nkc; c++) {
                __mmask16 m = c == nkc - 1 ? klast : 0xFFFF;
                __m512 k0 = deq16(kr0 + (size_t)c * 16 * es, m, DT), k1 = deq16(kr1 + (size_t)c * 16 * es, m, DT);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    __m512 q = _mm512_maskz_loadu_ps(m, rw->q[r] + 16 * c);
                    acc0[r] = _mm512_fmadd_ps(q, k0, acc0[r]);
                    acc1[r] = _mm512_fmadd_ps(q, k1, acc1[r]);
                }
            }
            if (PR) {
                const float *cs0 = sp->rope_cs + (size_t)(b0 + j) * kd, *cs1 = cs0 + kd;
                for (int c = 0; c < nkc; c++) {
                    __mmask16 m = c == nkc - 1 ? klast : 0xFFFF;
                    __m512 c0 = _mm512_maskz_loadu_ps(m, cs0 + 16 * c), c1 = _mm512_maskz_loadu_ps(m, cs1 + 16 * c);
                    for (int r = 0; r < R; r++) {
                        __m512 q = _mm512_maskz_loadu_ps(m, qcs[r] + 16 * c);
                        acc0[r] = _mm512_fmadd_ps(q, c0, acc0[r]);
                        acc1[r] = _mm512_fmadd_ps(q, c1, acc1[r]);
                    }
                }
            }
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) {
                _mm512_store_ps(tmp[r] + 16 * j, acc0[r]);
                _mm512_store_ps(tmp[r] + 16 * (j + 1), acc1[r]);
            }
            if (hrow) mlh_acc2(&hke, &hko, &hve, &hvo, kr0, vp + (size_t)j * sp->row_v, 2 * sp->row_k, kkey + (size_t)j * (sp->row_k / 4));
        }
        for (; j < nb; j++) {
            const uint8_t *kr = kp + (size_t)j * sp->row_k;
            kiln_kv_prefetch_rows(sp, &fut, j, 1);
            __m512 acc[KV_MAX_ROWS];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
            for (int c = 0; c < nkc; c++) {
                __mmask16 m = c == nkc - 1 ? klast : 0xFFFF;
                __m512 k = deq16(kr + (size_t)c * 16 * es, m, DT);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, rw->q[r] + 16 * c), k, acc[r]);
            }
            if (PR) {
                const float *cs = sp->rope_cs + (size_t)(b0 + j) * kd;
                for (int c = 0; c < nkc; c++) {
                    __mmask16 m = c == nkc - 1 ? klast : 0xFFFF;
                    __m512 cv = _mm512_maskz_loadu_ps(m, cs + 16 * c);
                    for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qcs[r] + 16 * c), cv, acc[r]);
                }
            }
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) _mm512_store_ps(tmp[r] + 16 * j, acc[r]);
            if (hrow) mlh_acc2(&hke, &hko, &hve, &hvo, kr, vp + (size_t)j * sp->row_v, sp->row_k, kkey + (size_t)j * (sp->row_k / 4));
        }
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++)
            for (int j = nb; j < 16; j++) _mm512_store_ps(tmp[r] + 16 * j, _mm512_setzero_ps());
        kiln_kv_prefetch_rows(sp, &fut, nb, fut.n - nb); /* a future block longer than this one */
        /* online softmax */
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            int n = rw->lim[r] - b0 < nb ? rw->lim[r] - b0 : nb;
            corr[r] = 1.0f;
            if (n <= 0) { _mm512_store_ps(pb[r], _mm512_setzero_ps()); continue; }
            __mmask16 valid = (__mmask16)(n >= 16 ? 0xFFFFu : (1u << n) - 1);
            __m512 s = _mm512_mul_ps(hsum16(tmp[r]), _mm512_set1_ps(km));
            float mx = _mm512_mask_reduce_max_ps(valid, s);
            if (rw->m[r] > mx) mx = rw->m[r];
            corr[r] = kiln_kv_corr(rw->m[r], mx);
            __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(s, _mm512_set1_ps(mx))));
            rw->l[r] = rw->l[r] * corr[r] + _mm512_reduce_add_ps(e);
            rw->m[r] = mx;
            _mm512_store_ps(pb[r], _mm512_mul_ps(e, _mm512_set1_ps(vm)));
        }
        /* PV, G value chunks of 16 at a time: each row's probability of a position is broadcast once
         * for G chunks instead of once per chunk (this loop is bound by its loads — a broadcast per
         * row and chunk matched the FMAs one for one — not by its FMAs); R × G ≤ 16 accumulators.
         * The same FMAs in the same order per output value: bit-identical results. */
        const int G = R <= 4 ? 4 : 2;
        for (int c0 = 0; c0 < nvc; c0 += G) {
            const int ng = nvc - c0 < G ? nvc - c0 : G;
            __mmask16 mg[4];
            __m512 a[KV_MAX_ROWS][4];
            _Pragma("GCC unroll 4")
            for (int g = 0; g < G; g++) {
                mg[g] = c0 + g == nvc - 1 ? vlast : 0xFFFF;
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++)
                    a[r][g] = g < ng ? _mm512_mul_ps(_mm512_maskz_loadu_ps(mg[g], rw->acc[r] + 16 * (c0 + g)), _mm512_set1_ps(corr[r])) : _mm512_setzero_ps();
            }
            for (int j = 0; j < nb; j++) {
                const uint8_t *vr = vp + (size_t)j * sp->row_v + (size_t)c0 * 16 * es;
                __m512 pr[KV_MAX_ROWS];
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) pr[r] = _mm512_set1_ps(pb[r][j]);
                _Pragma("GCC unroll 4")
                for (int g = 0; g < G; g++) {
                    if (g >= ng) break;
                    __m512 v = deq16(vr + (size_t)g * 16 * es, mg[g], DT);
                    _Pragma("GCC unroll 8")
                    for (int r = 0; r < R; r++) a[r][g] = _mm512_fmadd_ps(pr[r], v, a[r][g]);
                }
            }
            _Pragma("GCC unroll 4")
            for (int g = 0; g < G; g++) {
                if (g >= ng) break;
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(rw->acc[r] + 16 * (c0 + g), mg[g], a[r][g]);
            }
        }
        if (hrow) kiln_kv_hash_add(sp, b0, mlh_fold(hke, hko), mlh_fold(hve, hvo));
        else if (HS) { /* V then K, both still in L1 */
            kiln_kv_hash_block(sp, b0, nb, vp, 1, mlh);
            kiln_kv_hash_block(sp, b0, nb, kp, 0, mlh);
        }
        b0 += nb;
    }
}

KILN_KV_ATTEND_ENTRY(attend_impl)

/* ---- store conversions ---- */
AI __m512i fp8_codes(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    __m512i norm = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7ffff - 0x3c000000)),
                                    _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1)));
    norm = _mm512_min_epu32(_mm512_srli_epi32(norm, 20), _mm512_set1_epi32(0x7e));
    __m512i sub = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(16384.0f))),
                                   _mm512_set1_epi32(0x46800000));
    __mmask16 is_sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x3c800000));
    __mmask16 not_nan = _mm512_cmple_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    __m512i code = _mm512_or_si512(_mm512_mask_blend_epi32(is_sub, norm, sub), sign);
    return _mm512_maskz_mov_epi32(not_nan, code);
}

static void quant_fp8(const float *x, int n, float inv, uint8_t *out) {
    const __m512 vi = _mm512_set1_ps(inv);
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm_storeu_si128((__m128i *)(out + i), _mm512_cvtepi32_epi8(fp8_codes(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm_mask_storeu_epi8(out + i, m, _mm512_cvtepi32_epi8(fp8_codes(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vi))));
    }
}

AI __m256i bf16_codes(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                                   _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}

static void quant_bf16(const float *x, int n, uint16_t *out) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(out + i), bf16_codes(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(out + i, m, bf16_codes(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* ---- DSA indexer scores (kv_isa.h: kiln_kv_index_fn; the body in kv_index_simd.h) ----
 * 16 heads per lane set, 8 positions per pass (8 accumulators + 8 dot vectors; 16 positions with
 * the dot vectors in memory measured 0.8× the rate on Zen 5). Kernel alone, keys in L1, one core of
 * the Zen 5 VM: 37 ns per position at 16 heads × 128 (55 GFMA/s), 141 ns at 64 heads. */
#define IDX_VEC __m512
#define IDX_W 16
#define IDX_G 8
#define IDX_UNROLL _Pragma("GCC unroll 8")
#define IDX_ZERO() _mm512_setzero_ps()
#define IDX_LOAD(p) _mm512_loadu_ps(p)
#define IDX_STORE(p, v) _mm512_storeu_ps(p, v)
#define IDX_SET1(x) _mm512_set1_ps(x)
#define IDX_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)

/* k_e = code × 2^-8 of d codes: the E4M3 bits shifted into an FP16 (exact, subnormals included) */
AI void idx_keys(const uint8_t *code, int d, float *out) {
    for (int e = 0; e < d; e += 16) {
        const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(code + e)));
        const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                          _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7));
        _mm512_storeu_ps(out + e, _mm512_cvtph_ps(h));
    }
}
#include "kv/kv_index_simd.h"

const kiln_kv_ktable kiln_kv_ktable_avx512 = {attend, quant_fp8, quant_bf16, mlh, index_scores};
