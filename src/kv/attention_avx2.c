/* attention_avx2.c — paged attention over F32 / BF16 / FP8 pages and the KV store conversions,
 * AVX2 + FMA + F16C. Same structure as attention_avx512.c with 8 lanes and blocks of up to 8
 * positions; tails of rows whose length is not a multiple of 8 go through a zero-padded 8-value
 * buffer decoded with the same exact conversion (FP8 values × 2^-8, like the FP16 path). */
#include "kv/kv_isa.h"
#include "base/fp.h"
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* 8 full values at p. */
AI __m256 deq8(const uint8_t *p, kiln_kv_dtype dt) {
    if (dt == KILN_KV_F32) return _mm256_loadu_ps((const float *)p);
    if (dt == KILN_KV_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m128i w = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16((short)0xBF80));
    return _mm256_cvtph_ps(w);
}
/* n < 8 values at p, zero-padded. */
AI __m256 deq_tail(const uint8_t *p, int n, kiln_kv_dtype dt) {
    uint8_t buf[32] = {0};
    memcpy(buf, p, (size_t)n * (dt == KILN_KV_F32 ? 4 : dt == KILN_KV_BF16 ? 2 : 1));
    return deq8(buf, dt);
}
AI __m256i tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The fused form inside the kernel's key loops (as attention_avx512.c's): the n bytes of a K and a
 * V row (or rows) at the same offset, n a multiple of 4, with one load of their shared keys, added
 * into running vectors of even / odd words that the block folds once (mlh_fold). */
AI void mlh_step(__m256i *ae, __m256i *ao, __m256i x, __m256i k, __m256i ks) {
    *ae = _mm256_add_epi64(*ae, _mm256_mul_epu32(x, k));
    *ao = _mm256_add_epi64(*ao, _mm256_mul_epu32(_mm256_srli_epi64(x, 32), ks));
}
AI void mlh_acc2(__m256i *ae, __m256i *ao, __m256i *be, __m256i *bo, const uint8_t *d, const uint8_t *e, size_t n, const uint32_t *key) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i k = _mm256_loadu_si256((const __m256i *)(key + i / 4)), ks = _mm256_srli_epi64(k, 32);
        mlh_step(ae, ao, _mm256_loadu_si256((const __m256i *)(d + i)), k, ks);
        mlh_step(be, bo, _mm256_loadu_si256((const __m256i *)(e + i)), k, ks);
    }
    if (i < n) {
        const __m256i m = tail_mask((int)((n - i) / 4)), k = _mm256_maskload_epi32((const int *)(key + i / 4), m), ks = _mm256_srli_epi64(k, 32);
        mlh_step(ae, ao, _mm256_maskload_epi32((const int *)(d + i), m), k, ks);
        mlh_step(be, bo, _mm256_maskload_epi32((const int *)(e + i), m), k, ks);
    }
}
AI uint64_t mlh_fold(__m256i ae, __m256i ao) {
    const __m256i v = _mm256_add_epi64(ae, ao);
    const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1);
}

/* ---- content hash (kv_isa.h mlh), as attention_avx512.c's with 32 bytes per step ---- */
static uint64_t mlh(const uint8_t *d, size_t n, const uint32_t *key) {
    __m256i ae = _mm256_setzero_si256(), ao = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(d + i)), k = _mm256_loadu_si256((const __m256i *)(key + i / 4));
        ae = _mm256_add_epi64(ae, _mm256_mul_epu32(x, k));
        ao = _mm256_add_epi64(ao, _mm256_mul_epu32(_mm256_srli_epi64(x, 32), _mm256_srli_epi64(k, 32)));
    }
    return mlh_fold(ae, ao) + kiln_kv_mlh_scalar(d + i, n - i, key + i / 4);
}

AI __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* t: 8 rows of 8 floats (32-byte aligned). Returns lane i = Σ t[i][0..8). */
AI __m256 hsum8(const float *t) {
    __m256 h01 = _mm256_hadd_ps(_mm256_load_ps(t), _mm256_load_ps(t + 8));
    __m256 h23 = _mm256_hadd_ps(_mm256_load_ps(t + 16), _mm256_load_ps(t + 24));
    __m256 h45 = _mm256_hadd_ps(_mm256_load_ps(t + 32), _mm256_load_ps(t + 40));
    __m256 h67 = _mm256_hadd_ps(_mm256_load_ps(t + 48), _mm256_load_ps(t + 56));
    __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

AI float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
AI float hadd8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

/* PR = 1: pre-RoPE K smoothing (static FP8 only), as in attention_avx512.c: the correction's
 * coefficients, divided by the block factor km, are accumulated with the position's cos/sin row into
 * the QK accumulators. PR = 0 is the plain kernel, unchanged. */
AI void attend_impl(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1, const int R, const kiln_kv_dtype DT, const int PR, const int HS) {
    const int kd = sp->k_dim, vd = sp->v_dim;
    const size_t es = DT == KILN_KV_F32 ? 4 : DT == KILN_KV_BF16 ? 2 : 1;
    const float fp8f = DT == KILN_KV_FP8 ? 256.0f : 1.0f;
    const int kfull = kd / 8, ktail = kd % 8, vfull = vd / 8, vtail = vd % 8;
    const __m256i kmask = tail_mask(ktail), vmask = tail_mask(vtail);
    float tmp[KV_MAX_ROWS][64] __attribute__((aligned(32)));
    float pb[KV_MAX_ROWS][8] __attribute__((aligned(32)));
    float corr[KV_MAX_ROWS];
    float qcs[PR ? KV_MAX_ROWS : 1][PR ? 256 : 8] __attribute__((aligned(32)));
    if (PR) {
        const float inv = 1.0f / (sp->kmul * fp8f);
        for (int r = 0; r < R; r++)
            for (int d = 0; d < kd; d++) qcs[r][d] = rw->qc[r][d] * inv;
    }
    int lmax = 0;
    _Pragma("GCC unroll 8")
    for (int r = 0; r < R; r++) lmax = rw->lim[r] > lmax ? rw->lim[r] : lmax;
    if (t1 > lmax) t1 = lmax;
    if (sp->prefetch) kiln_kv_prefetch_head(sp, t0, t1, 8, 16);
    /* integrity (sp->hsum, the HS variants): row by row for BF16 / F32 K and V rows of one size and at
     * least a vector, else by block at the block's end (kv_isa.h, kiln_kv_hash_add) */
    const int hrow = HS && DT != KILN_KV_FP8 && sp->hash_v && sp->row_k == sp->row_v && sp->row_k >= 32;
    for (int b0 = t0; b0 < t1;) {
        const kiln_kv_block blk = kiln_kv_block_at(sp, b0, t1, 8, fp8f);
        const kiln_kv_block fut = kiln_kv_future_block(sp, b0 + 16, t1, 8); /* 16 positions ahead, a row at a time (kv_isa.h) */
        const int nb = blk.n;
        const uint8_t *kp = blk.k, *vp = blk.v;
        const float km = blk.km, vm = blk.vm;
        /* the keys of the block's first row (row-by-row hash) */
        const uint32_t *kkey = hrow ? sp->hkey + (size_t)(b0 % sp->page_tokens) * (sp->row_k / 4) : NULL;
        __m256i hke = _mm256_setzero_si256(), hko = hke, hve = hke, hvo = hke;
        int j0 = 0;
        /* QK two key rows at a time where the row is whole 8-value chunks (no pre-RoPE term): each
         * chunk of a query row is loaded once for both (the loads of q bound this loop, as in the
         * AVX-512 kernel); per position the same FMAs in the same order as the one-row loop below */
        if (!PR && !ktail)
            for (; j0 + 2 <= nb; j0 += 2) {
                const uint8_t *kr0 = kp + (size_t)j0 * sp->row_k, *kr1 = kr0 + sp->row_k;
                kiln_kv_prefetch_rows(sp, &fut, j0, 2);
                __m256 acc0[KV_MAX_ROWS], acc1[KV_MAX_ROWS];
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
                for (int c = 0; c < kfull; c++) {
                    __m256 k0 = deq8(kr0 + (size_t)c * 8 * es, DT), k1 = deq8(kr1 + (size_t)c * 8 * es, DT);
                    _Pragma("GCC unroll 8")
                    for (int r = 0; r < R; r++) {
                        __m256 q = _mm256_loadu_ps(rw->q[r] + 8 * c);
                        acc0[r] = _mm256_fmadd_ps(q, k0, acc0[r]);
                        acc1[r] = _mm256_fmadd_ps(q, k1, acc1[r]);
                    }
                }
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    _mm256_store_ps(tmp[r] + 8 * j0, acc0[r]);
                    _mm256_store_ps(tmp[r] + 8 * (j0 + 1), acc1[r]);
                }
                if (hrow) mlh_acc2(&hke, &hko, &hve, &hvo, kr0, vp + (size_t)j0 * sp->row_v, 2 * sp->row_k, kkey + (size_t)j0 * (sp->row_k / 4));
            }
        for (int j = j0; j < nb; j++) {
            const uint8_t *kr = kp + (size_t)j * sp->row_k;
            kiln_kv_prefetch_rows(sp, &fut, j, 1);
            __m256 acc[KV_MAX_ROWS];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
            for (int c = 0; c < kfull; c++) {
                __m256 k = deq8(kr + (size_t)c * 8 * es, DT);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(rw->q[r] + 8 * c), k, acc[r]);
            }
            if (ktail) {
                __m256 k = deq_tail(kr + (size_t)kfull * 8 * es, ktail, DT);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_maskload_ps(rw->q[r] + 8 * kfull, kmask), k, acc[r]);
            }
            if (PR) {
                const float *cs = sp->rope_cs + (size_t)(b0 + j) * kd;
                for (int c = 0; c < kfull; c++) {
                    __m256 cv = _mm256_loadu_ps(cs + 8 * c);
                    for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_load_ps(qcs[r] + 8 * c), cv, acc[r]);
                }
                if (ktail) {
                    __m256 cv = _mm256_maskload_ps(cs + 8 * kfull, kmask);
                    for (int r = 0; r < R; r++) acc[r] = _mm256_fmadd_ps(_mm256_maskload_ps(qcs[r] + 8 * kfull, kmask), cv, acc[r]);
                }
            }
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) _mm256_store_ps(tmp[r] + 8 * j, acc[r]);
            if (hrow) mlh_acc2(&hke, &hko, &hve, &hvo, kr, vp + (size_t)j * sp->row_v, sp->row_k, kkey + (size_t)j * (sp->row_k / 4));
        }
        kiln_kv_prefetch_rows(sp, &fut, nb, fut.n - nb); /* a future block longer than this one */
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++)
            for (int j = nb; j < 8; j++) _mm256_store_ps(tmp[r] + 8 * j, _mm256_setzero_ps());
        _Pragma("GCC unroll 8")
        for (int r = 0; r < R; r++) {
            int n = rw->lim[r] - b0 < nb ? rw->lim[r] - b0 : nb;
            corr[r] = 1.0f;
            if (n <= 0) { _mm256_store_ps(pb[r], _mm256_setzero_ps()); continue; }
            __m256 valid = _mm256_castsi256_ps(tail_mask(n));
            __m256 s = _mm256_mul_ps(hsum8(tmp[r]), _mm256_set1_ps(km));
            float mx = hmax8(_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, valid));
            if (rw->m[r] > mx) mx = rw->m[r];
            corr[r] = kiln_kv_corr(rw->m[r], mx);
            __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(s, _mm256_set1_ps(mx))), valid);
            rw->l[r] = rw->l[r] * corr[r] + hadd8(e);
            rw->m[r] = mx;
            _mm256_store_ps(pb[r], _mm256_mul_ps(e, _mm256_set1_ps(vm)));
        }
        int c = 0;
        /* two 8-value chunks at a time for up to 4 rows (8 accumulators of the 16 registers): each
         * row's probability broadcast once for both (as the AVX-512 kernel's value pass); per value
         * the same FMAs in the same order as the one-chunk loop below */
        if (R <= 4)
            for (; c + 2 <= vfull; c += 2) {
                __m256 a0[KV_MAX_ROWS], a1[KV_MAX_ROWS];
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    a0[r] = _mm256_mul_ps(_mm256_loadu_ps(rw->acc[r] + 8 * c), _mm256_set1_ps(corr[r]));
                    a1[r] = _mm256_mul_ps(_mm256_loadu_ps(rw->acc[r] + 8 * (c + 1)), _mm256_set1_ps(corr[r]));
                }
                for (int j = 0; j < nb; j++) {
                    const uint8_t *vr = vp + (size_t)j * sp->row_v + (size_t)c * 8 * es;
                    __m256 v0 = deq8(vr, DT), v1 = deq8(vr + 8 * es, DT);
                    _Pragma("GCC unroll 8")
                    for (int r = 0; r < R; r++) {
                        __m256 pr = _mm256_set1_ps(pb[r][j]);
                        a0[r] = _mm256_fmadd_ps(pr, v0, a0[r]);
                        a1[r] = _mm256_fmadd_ps(pr, v1, a1[r]);
                    }
                }
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) {
                    _mm256_storeu_ps(rw->acc[r] + 8 * c, a0[r]);
                    _mm256_storeu_ps(rw->acc[r] + 8 * (c + 1), a1[r]);
                }
            }
        for (; c < vfull; c++) {
            __m256 a[KV_MAX_ROWS];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) a[r] = _mm256_mul_ps(_mm256_loadu_ps(rw->acc[r] + 8 * c), _mm256_set1_ps(corr[r]));
            for (int j = 0; j < nb; j++) {
                __m256 v = deq8(vp + (size_t)j * sp->row_v + (size_t)c * 8 * es, DT);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(_mm256_set1_ps(pb[r][j]), v, a[r]);
            }
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) _mm256_storeu_ps(rw->acc[r] + 8 * c, a[r]);
        }
        if (vtail) {
            __m256 a[KV_MAX_ROWS];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) a[r] = _mm256_mul_ps(_mm256_maskload_ps(rw->acc[r] + 8 * vfull, vmask), _mm256_set1_ps(corr[r]));
            for (int j = 0; j < nb; j++) {
                __m256 v = deq_tail(vp + (size_t)j * sp->row_v + (size_t)vfull * 8 * es, vtail, DT);
                _Pragma("GCC unroll 8")
                for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(_mm256_set1_ps(pb[r][j]), v, a[r]);
            }
            _Pragma("GCC unroll 8")
            for (int r = 0; r < R; r++) _mm256_maskstore_ps(rw->acc[r] + 8 * vfull, vmask, a[r]);
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
AI __m256i fp8_codes(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    __m256i norm = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7ffff - 0x3c000000)),
                                    _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1)));
    norm = _mm256_min_epu32(_mm256_srli_epi32(norm, 20), _mm256_set1_epi32(0x7e));
    __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(16384.0f))),
                                   _mm256_set1_epi32(0x46800000));
    /* a is non-negative as a signed int, so signed compares are unsigned compares here */
    __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), a);
    __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
    __m256i code = _mm256_or_si256(_mm256_blendv_epi8(norm, sub, is_sub), sign);
    return _mm256_andnot_si256(is_nan, code);
}
/* Low byte of each of the 8 int32 lanes → 8 bytes. */
AI __m128i pack8(__m256i c) {
    const __m256i sh = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(c, sh), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    return _mm256_castsi256_si128(b);
}

static void quant_fp8(const float *x, int n, float inv, uint8_t *out) {
    const __m256 vi = _mm256_set1_ps(inv);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm_storel_epi64((__m128i *)(out + i), pack8(fp8_codes(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi))));
    if (i < n) {
        float buf[8] = {0};
        uint8_t ob[8];
        memcpy(buf, x + i, (size_t)(n - i) * 4);
        _mm_storel_epi64((__m128i *)ob, pack8(fp8_codes(_mm256_mul_ps(_mm256_loadu_ps(buf), vi))));
        memcpy(out + i, ob, (size_t)(n - i));
    }
}

AI __m128i bf16_codes(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                                   _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i c = _mm256_blendv_epi8(r, q, nan);
    __m256i p = _mm256_packus_epi32(c, c); /* [c0..3 c0..3 | c4..7 c4..7] */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

static void quant_bf16(const float *x, int n, uint16_t *out) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(out + i), bf16_codes(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float buf[8] = {0};
        uint16_t ob[8];
        memcpy(buf, x + i, (size_t)(n - i) * 4);
        _mm_storeu_si128((__m128i *)ob, bf16_codes(_mm256_loadu_ps(buf)));
        memcpy(out + i, ob, (size_t)(n - i) * 2);
    }
}

/* ---- DSA indexer scores (kv_isa.h: kiln_kv_index_fn; the body in kv_index_simd.h) ----
 * 8 heads per lane set, 4 positions per pass (16 ymm registers). Kernel alone, one core of the Zen 5
 * VM: 80 ns per position at 16 heads × 128, 302 ns at 64 heads. */
#define IDX_VEC __m256
#define IDX_W 8
#define IDX_G 4
#define IDX_UNROLL _Pragma("GCC unroll 4")
#define IDX_ZERO() _mm256_setzero_ps()
#define IDX_LOAD(p) _mm256_loadu_ps(p)
#define IDX_STORE(p, v) _mm256_storeu_ps(p, v)
#define IDX_SET1(x) _mm256_set1_ps(x)
#define IDX_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)

/* k_e = code × 2^-8 of d codes: the E4M3 bits shifted into an FP16 (exact, subnormals included) */
AI void idx_keys(const uint8_t *code, int d, float *out) {
    for (int e = 0; e < d; e += 8) {
        const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(code + e)));
        const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                       _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
        _mm256_storeu_ps(out + e, _mm256_cvtph_ps(h));
    }
}
#include "kv/kv_index_simd.h"

const kiln_kv_ktable kiln_kv_ktable_avx2 = {attend, quant_fp8, quant_bf16, mlh, index_scores};
