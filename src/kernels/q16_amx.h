/* q16_amx.h — the Q8_0 / Q4_0 / INT4-g32 16-row interleave GEMM on AMX tiles (issue 20), included by
 * q16_amx_avx512.c (the CPU's tile instructions) and q16_amxemu_avx512.c (the same code over an
 * emulation of them in C, so that the kernel's logic is tested on every CPU: tests/kernels/test_gemv.c
 * test_q16_amx_exact). Each includer defines:
 *   Q16_AMX_NAME              the function's name;
 *   AMX_CONFIG(cfg)           load a tile configuration (amx_tilecfg, below);
 *   AMX_ZERO(t), AMX_LOAD(t, p, stride), AMX_STORE(t, p, stride), AMX_DPBSUD(c, a, b), AMX_RELEASE()
 *                             tilezero / tileloadd / tilestored / tdpbsud / tilerelease, t a tile number.
 *
 * Why the layout fits: the 16-row interleave (docs/FORMATS.md) stores block b of rows 16q..16q+15 as
 * 64-byte vectors whose bytes 4j..4j+3 are row j's 4 columns 4k..4k+3 — exactly an AMX B tile of K = 32
 * (8 rows of 64 bytes: B[k][4n + i] = W[n][4k + i]). The prepared activations (xprep_q: per block 32
 * int8 then 32 bytes of lane starts, a token's row every xpb bytes) are an A tile of 16 tokens × 32
 * bytes with stride xpb. tdpbsud (signed A × unsigned B, the weights stored + 128 / + 8 as vpdpbusd
 * reads them) gives C[t][j] = Σ x_q · (w + offset): the block dot of token t and row j, exact in
 * int32. Then each token does what q16_tile (gemv_avx512.c) does per block: + the block's start value
 * tot (undoing the offset), one conversion, × (row scales · token scale), one FMA — the same integer
 * and the same float operations in the same order, so every (row, token) result is the AVX-512
 * kernel's bit for bit and a token's logits do not depend on whether its batch took the tiles.
 * Q4_0 / INT4 nibbles are unpacked once per block into a B tile (low nibbles: columns 0..15, high:
 * 16..31, in the activation's column order).
 *
 * Tiles: C 0 / 1 (16 tokens × 16 rows int32), A 2 / 3 (16 × 32 bytes), B 4 / 5 (8 × 64 bytes), in two
 * slots: block b's tile product is issued before block b − 1's float work (below).
 * n: a multiple of 16 tokens; f: KILN_WF_Q8_0, KILN_WF_Q4_0 or KILN_WF_INT4_GROUP (group 32, sg its
 * 16 rows' bf16 scales per block).
 *
 * K16_AMX_NAME: Q4_K / Q5_K / Q6_K / Q2_K / Q3_K / IQ4_XS in the 16-row super-block interleave the
 * same way (below). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include "kernels/k16_quants.h"

#ifndef KILN_Q16_AMX_TILECFG
#define KILN_Q16_AMX_TILECFG
/* The 64-byte operand of ldtilecfg, palette 1 (Intel SDM vol. 2, LDTILECFG). */
typedef struct __attribute__((aligned(64))) {
    uint8_t palette_id, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile i */
    uint8_t rows[16];   /* rows of tile i */
} amx_tilecfg;
#endif

/* The tiles of two slots, loaded: C 0 / 1 (16 tokens × 16 rows int32), A 2 / 3 (16 tokens × k bytes),
 * B 4 / 5 (k / 4 rows × 16 weight rows of 4 bytes); k = 32 (a block or sub-block) or 16 (Q6_K's groups). */
static inline __attribute__((always_inline)) void amx_two_slots(int k) {
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 2; i++) {
        cfg.rows[i] = 16, cfg.colsb[i] = 64;
        cfg.rows[2 + i] = 16, cfg.colsb[2 + i] = (uint16_t)k;
        cfg.rows[4 + i] = (uint8_t)(k / 4), cfg.colsb[4 + i] = 64;
    }
    AMX_CONFIG(&cfg);
}

/* one tile product into out (16 × 16 int32): C = A (16 tokens × k bytes at ap, a token every
 * astride) · B (k / 4 rows of 64 bytes at bp); C, A, B tile numbers (constants) */
#define AMX_PRODUCT(C, A, B, ap, astride, bp, out) \
    do {                                           \
        AMX_ZERO(C);                               \
        AMX_LOAD(A, ap, astride);                  \
        AMX_LOAD(B, bp, 64);                       \
        AMX_DPBSUD(C, A, B);                       \
        AMX_STORE(C, out, 64);                     \
    } while (0)

/* One block's post-processing for 16 tokens: acc[t] += float(C[t] + tot_t) · (ws · dx_t), ws the
 * 16 rows' scales of block b */
#define Q16_AMX_FINISH(cb, b)                                                                                   \
    do {                                                                                                        \
        const uint8_t *gb_ = g + (size_t)(b) * gbb;                                                             \
        const __m512 ws = i4 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(sg + 16 * (b)))), 16)) \
                             : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb_));                      \
        _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) {                                                \
            const uint8_t *xr = xt + (size_t)t * xpb;                                                           \
            const float dt = ((const float *)(xr + nb * 64))[b];                                                \
            const int32_t st = ((const int32_t *)(xr + nb * 64 + nb * 4))[b];                                   \
            const __m512i ia = _mm512_add_epi32(_mm512_load_si512((cb) + 16 * t), _mm512_set1_epi32(st));      \
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(ws, _mm512_set1_ps(dt)), acc[t]);    \
        }                                                                                                       \
    } while (0)

void Q16_AMX_NAME(int f, const uint8_t *g, const uint16_t *sg, int64_t nb, const uint8_t *xp, size_t xpb, int n, float *Y,
                  int64_t ldy) {
    const int q8 = f == KILN_WF_Q8_0, i4 = f == KILN_WF_INT4_GROUP;
    const size_t gbb = i4 ? 256 : 16 * (size_t)(q8 ? 34 : 18), woff = i4 ? 0 : 32;
    amx_two_slots(32);
    int32_t cbuf[2][256] __attribute__((aligned(64)));
    uint8_t bbuf[2][512] __attribute__((aligned(64)));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int t0 = 0; t0 < n; t0 += 16) {
        const uint8_t *xt = xp + (size_t)t0 * xpb;
        __m512 acc[16];
        _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
        /* A software pipeline of two: block b's tile product is issued, then block b − 1's float
         * work runs on the C tile stored one step earlier (slot s ^ 1), so it neither waits for
         * b's tdpbsud nor reads memory a tilestored has only just written. */
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *gb = g + (size_t)b * gbb;
            const int s = (int)(b & 1);
            const uint8_t *bw = gb + woff;
            if (!q8) { /* nibbles → one byte per weight, in B's order */
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
                    const __m512i v = _mm512_loadu_si512(gb + woff + 64 * k);
                    _mm512_store_si512(bbuf[s] + 64 * k, _mm512_and_si512(v, m4));
                    _mm512_store_si512(bbuf[s] + 256 + 64 * k, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                }
                bw = bbuf[s];
            }
            /* tile numbers must be constants: the two slots spelled out */
            if (s == 0) AMX_PRODUCT(0, 2, 4, xt + 64 * b, xpb, bw, cbuf[0]);
            else AMX_PRODUCT(1, 3, 5, xt + 64 * b, xpb, bw, cbuf[1]);
            if (b > 0) Q16_AMX_FINISH(cbuf[s ^ 1], b - 1);
        }
        Q16_AMX_FINISH(cbuf[(nb - 1) & 1], nb - 1);
        _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) _mm512_storeu_ps(Y + (size_t)(t0 + t) * (size_t)ldy, acc[t]);
    }
    AMX_RELEASE();
}
#undef Q16_AMX_FINISH

/* The per-token steps the super-block kernels share: mi = Σ_k pairs[k] · (bs_2k, bs_2k+1) by vpdpwssd
 * against the record's 16-column sums at o + 256 (the mins, or the stored offset times the scales),
 * and one scaled accumulation y += (w · dx) · float(v), dx the token's scale at o + 288. */
static inline __attribute__((always_inline)) __m512i k16_pair_sums(const __m512i pairs[8], const uint8_t *o) {
    __m512i mi = _mm512_setzero_si512();
    for (int k = 0; k < 8; k++) {
        int32_t xk;
        memcpy(&xk, o + 256 + 4 * k, 4);
        mi = _mm512_dpwssd_epi32(mi, pairs[k], _mm512_set1_epi32(xk));
    }
    return mi;
}
static inline __attribute__((always_inline)) __m512 k16_scaled_add(__m512 acc, __m512i v, __m512 w, const uint8_t *o) {
    float dx;
    memcpy(&dx, o + 288, 4);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(w, _mm512_set1_ps(dx)), acc);
}

/* Q4_K / Q5_K (gemv_avx512.c k16_tile's arithmetic, per 16 tokens): per super-block and sub-block
 * pair i, the 8 quant vectors 8i + m unpacked (kernels/k16_quants.h) are two B tiles as they come — lo:
 * sub-block 2i, hi: 2i + 1, B row m = columns 4m..4m+3 of the 16 rows — against the A tiles of those
 * sub-blocks' 32 activation bytes, which the prepared record (KQ_REC = 320 bytes a super-block, Q4_K's
 * sub-block order 0,2 | 1,3 | 4,6 | 5,7) keeps contiguous: sub-block j at byte
 * 64·(2·(j >> 2) + (j & 1)) + 32·((j >> 1) & 1). The 8 block dots of 16 tokens × 16 rows are exact
 * int32; then per token the integer sums of k16_tile (isum += p_2i·sc_2i + p_2i+1·sc_2i+1, the mins
 * by vpdpwssd against the record's 16-column sums at 256) and its two float steps (y += (d·dx)·isum,
 * y −= (dmin·dx)·mins): each (row, token) result is k16_tile's bit for bit. */
/* Q6_K: per 16-column group (its own scale) one tdpbsud of K = 16 — A 16 tokens × 16 bytes (the
 * record's natural column order), B 4 rows × 64 bytes: the quant vectors of the group as stored, q + 32
 * (kernels/k16_q6_quants) — then per token k16_tile's sums: isum = Σ_g p_g·sc_g, the +32 removed by
 * vpdpwssd of −32·sc (as 32·sc, subtracted) with the record's 16-column sums, y += (d·dx)·(isum − that). */
/* One Q6_K super-block s for 16 tokens (records xs, a token every xpb) into abuf. */
static inline __attribute__((always_inline)) void k16q6_superblock(const uint8_t *s, const uint8_t *xs, size_t xpb, int32_t (*cbuf)[256],
                                                                   uint8_t (*bbuf)[512], float (*abuf)[16]) {
    for (int h = 0; h < 2; h++)
        for (int jp = 0; jp < 2; jp++)
            for (int half = 0; half < 2; half++) {
                for (int mm = 0; mm < 4; mm++) {
                    __m512i lo, hi;
                    k16_q6_quants(s, h, jp, 4 * half + mm, &lo, &hi);
                    _mm512_store_si512(bbuf[0] + 64 * mm, lo);
                    _mm512_store_si512(bbuf[1] + 64 * mm, hi);
                }
                const int ga = 8 * h + 2 * jp + half, gb = 8 * h + 2 * (jp + 2) + half;
                AMX_PRODUCT(0, 2, 4, xs + 16 * ga, xpb, bbuf[0], cbuf[ga]);
                AMX_PRODUCT(1, 3, 5, xs + 16 * gb, xpb, bbuf[1], cbuf[gb]);
            }
    __m512i a2[8];
    for (int k = 0; k < 8; k++) {
        const __m128i p0 = _mm_loadu_si128((const __m128i *)(s + 3072 + 32 * k)), p1 = _mm_loadu_si128((const __m128i *)(s + 3072 + 32 * k + 16));
        a2[k] = _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(p0, p1), _mm_unpacklo_epi8(p0, p1))), 5);
    }
    const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 3328)));
    for (int t = 0; t < 16; t++) {
        const uint8_t *o = xs + (size_t)t * xpb;
        __m512i isum = _mm512_setzero_si512();
        for (int gi = 0; gi < 16; gi++)
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(cbuf[gi] + 16 * t),
                                                            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + 3072 + 16 * gi)))));
        const __m512i mi = k16_pair_sums(a2, o);
        _mm512_store_ps(abuf[t], k16_scaled_add(_mm512_load_ps(abuf[t]), _mm512_sub_epi32(isum, mi), wd, o));
    }
}

/* Q2_K / Q3_K (gemv_avx512.c k16_tile, per 16 tokens): per 16-column group g one tdpbsud of K = 16 —
 * A 16 tokens × the group's 16 activation bytes (the record keeps each group contiguous: kq_pos,
 * KQ_PERM2), B the 4 quant vectors of the group as unsigned bytes (kernels/k16_quants.h
 * k16_q23_quants: 2-bit q, Q3_K with its high bit as q + 4) — then per token k16_tile's sums:
 * isum = Σ_g p_g·sc_g, mi by vpdpwssd of the group pairs' mins (Q2_K) or 4·sc (Q3_K's + 4) against the
 * record's 16-column sums, and its float steps (Q2_K: y += (d·dx)·isum, y −= (dmin·dx)·mi; Q3_K:
 * y += (d·dx)·(isum − mi)). */
static inline __attribute__((always_inline)) void k16q23_superblock(int q3, const uint8_t *s, const uint8_t *xs, size_t xpb, int32_t (*cbuf)[256],
                                                                    uint8_t (*bbuf)[512], float (*abuf)[16]) {
    for (int h = 0; h < 2; h++)
        for (int hf = 0; hf < 2; hf++)     /* columns 16·hf.. of each 32 */
            for (int sp = 0; sp < 2; sp++) { /* shifts 2sp (group 8h + 4sp + hf) and 2sp + 1 (+ 2) */
                const int s0 = 2 * sp, s1 = 2 * sp + 1;
                for (int mm = 0; mm < 4; mm++) {
                    _mm512_store_si512(bbuf[0] + 64 * mm, k16_q23_quants(s, q3, h, s0, 4 * hf + mm));
                    _mm512_store_si512(bbuf[1] + 64 * mm, k16_q23_quants(s, q3, h, s1, 4 * hf + mm));
                }
                const int ga = 8 * h + 2 * s0 + hf, gb = 8 * h + 2 * s1 + hf;
                AMX_PRODUCT(0, 2, 4, xs + kq_pos(KQ_PERM2, ga), xpb, bbuf[0], cbuf[ga]);
                AMX_PRODUCT(1, 3, 5, xs + kq_pos(KQ_PERM2, gb), xpb, bbuf[1], cbuf[gb]);
            }
    __m512i sc[16], a2[8];
    for (int gi = 0; gi < 16; gi++) sc[gi] = k16_q23_scale(s, q3, gi);
    for (int k = 0; k < 8; k++) a2[k] = k16_q23_minpair(s, q3, k);
    const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + (q3 ? 1728 : 1280))));
    const __m512 wm = q3 ? _mm512_setzero_ps() : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 1312)));
    for (int t = 0; t < 16; t++) {
        const uint8_t *o = xs + (size_t)t * xpb;
        __m512i isum = _mm512_setzero_si512();
        for (int gi = 0; gi < 16; gi++) isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_load_si512(cbuf[gi] + 16 * t), sc[gi]));
        const __m512i mi = k16_pair_sums(a2, o);
        __m512 acc = _mm512_load_ps(abuf[t]);
        if (q3) {
            acc = k16_scaled_add(acc, _mm512_sub_epi32(isum, mi), wd, o);
        } else {
            float dx;
            memcpy(&dx, o + 288, 4);
            const __m512 vdx = _mm512_set1_ps(dx);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(wd, vdx), acc);
            acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_mul_ps(wm, vdx), acc);
        }
        _mm512_store_ps(abuf[t], acc);
    }
}

/* IQ4_XS (k16_tile's arithmetic): per sub-block j of 32 columns two tdpbsud of K = 16 — its low and
 * high 16-column groups, whose activation bytes the record (KQ_PERMXS) keeps 64 bytes apart, against
 * the level bytes (+ 128, unsigned) of k16_xs_quants — then per token isum = Σ_j (p_2j + p_2j+1)·sc_j,
 * the + 128 removed by vpdpwssd of 128·sc_j with the record's 16-column sums, y += (d·dx)·(isum − mi). */
static inline __attribute__((always_inline)) void k16xs_superblock(const uint8_t *s, const uint8_t *xs, size_t xpb, int32_t (*cbuf)[256],
                                                                   uint8_t (*bbuf)[512], float (*abuf)[16]) {
    __m512i sj[8], s2[8];
    for (int j = 0; j < 8; j++) {
        for (int mm = 0; mm < 4; mm++) {
            __m512i lo, hi;
            k16_xs_quants(s, j, mm, &lo, &hi);
            _mm512_store_si512(bbuf[0] + 64 * mm, lo);
            _mm512_store_si512(bbuf[1] + 64 * mm, hi);
        }
        AMX_PRODUCT(0, 2, 4, xs + kq_pos(KQ_PERMXS, 2 * j), xpb, bbuf[0], cbuf[2 * j]);
        AMX_PRODUCT(1, 3, 5, xs + kq_pos(KQ_PERMXS, 2 * j + 1), xpb, bbuf[1], cbuf[2 * j + 1]);
        k16_xs_scale(s, j, &sj[j], &s2[j]);
    }
    const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
    for (int t = 0; t < 16; t++) {
        const uint8_t *o = xs + (size_t)t * xpb;
        __m512i isum = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            const __m512i q = _mm512_add_epi32(_mm512_load_si512(cbuf[2 * j] + 16 * t), _mm512_load_si512(cbuf[2 * j + 1] + 16 * t));
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(q, sj[j]));
        }
        const __m512i mi = k16_pair_sums(s2, o);
        _mm512_store_ps(abuf[t], k16_scaled_add(_mm512_load_ps(abuf[t]), _mm512_sub_epi32(isum, mi), wd, o));
    }
}

/* One Q4_K / Q5_K super-block s for 16 tokens into abuf. */
static inline __attribute__((always_inline)) void k16q45_superblock(int q5, const uint8_t *s, const uint8_t *xs, size_t xpb, int32_t (*cbuf)[256],
                                                                    uint8_t (*bbuf)[512], float (*abuf)[16]) {
    __m512i sa[4], sbv[4], ma2[4], mb2[4];
    for (int i = 0; i < 4; i++) {
        for (int m = 0; m < 8; m++) {
            __m512i lo, hi;
            k16_q45_quants(s, q5, i, m, &lo, &hi);
            _mm512_store_si512(bbuf[0] + 64 * m, lo);
            _mm512_store_si512(bbuf[1] + 64 * m, hi);
        }
        const int ja = 2 * i, jb = 2 * i + 1;
        AMX_PRODUCT(0, 2, 4, xs + 64 * (2 * (ja >> 2) + (ja & 1)) + 32 * ((ja >> 1) & 1), xpb, bbuf[0], cbuf[ja]);
        AMX_PRODUCT(1, 3, 5, xs + 64 * (2 * (jb >> 2) + (jb & 1)) + 32 * ((jb >> 1) & 1), xpb, bbuf[1], cbuf[jb]);
        __m128i sc[2], mn[2];
        k16_q45_scales(s, i, sc, mn);
        sa[i] = _mm512_cvtepu8_epi32(sc[0]), sbv[i] = _mm512_cvtepu8_epi32(sc[1]);
        const __m512i ma = _mm512_cvtepu8_epi32(mn[0]), mb = _mm512_cvtepu8_epi32(mn[1]);
        ma2[i] = _mm512_or_si512(ma, _mm512_slli_epi32(ma, 16)), mb2[i] = _mm512_or_si512(mb, _mm512_slli_epi32(mb, 16));
    }
    const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s)), wm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 32)));
    for (int t = 0; t < 16; t++) {
        const uint8_t *o = xs + (size_t)t * xpb;
        __m512i isum = _mm512_setzero_si512(), mi = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            const __m512i qa = _mm512_load_si512(cbuf[2 * i] + 16 * t), qb = _mm512_load_si512(cbuf[2 * i + 1] + 16 * t);
            int32_t xa, xb;
            memcpy(&xa, o + 256 + 8 * i, 4);
            memcpy(&xb, o + 256 + 8 * i + 4, 4);
            isum = _mm512_add_epi32(isum, _mm512_add_epi32(_mm512_mullo_epi32(qa, sa[i]), _mm512_mullo_epi32(qb, sbv[i])));
            mi = _mm512_dpwssd_epi32(mi, ma2[i], _mm512_set1_epi32(xa));
            mi = _mm512_dpwssd_epi32(mi, mb2[i], _mm512_set1_epi32(xb));
        }
        float dx;
        memcpy(&dx, o + 288, 4);
        const __m512 vdx = _mm512_set1_ps(dx);
        __m512 acc = _mm512_load_ps(abuf[t]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(wd, vdx), acc);
        acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_mul_ps(wm, vdx), acc);
        _mm512_store_ps(abuf[t], acc);
    }
}

void K16_AMX_NAME(int f, const uint8_t *g, int64_t nsb, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy) {
    const int q6 = f == KILN_WF_Q6_K, q5 = f == KILN_WF_Q5_K, q2 = f == KILN_WF_Q2_K, q3 = f == KILN_WF_Q3_K, xs4 = f == KILN_WF_IQ4_XS;
    /* a super-block's 16 rows (gemv.c kq_block_bytes), rec: its prepared record (KQ_REC) */
    const size_t gsb = 16 * (size_t)(q6 ? 210 : q5 ? 176 : q2 ? 84 : q3 ? 110 : xs4 ? 136 : 144), rec = 320;
    amx_two_slots(f == KILN_WF_Q4_K || q5 ? 32 : 16);
    int32_t cbuf[16][256] __attribute__((aligned(64)));
    uint8_t bbuf[2][512] __attribute__((aligned(64)));
    float abuf[16][16] __attribute__((aligned(64)));
    for (int t0 = 0; t0 < n; t0 += 16) {
        const uint8_t *xt = xp + (size_t)t0 * xpb;
        memset(abuf, 0, sizeof abuf);
        for (int64_t sb = 0; sb < nsb; sb++) {
            const uint8_t *s = g + (size_t)sb * gsb, *xs = xt + (size_t)sb * rec;
            if (q6) k16q6_superblock(s, xs, xpb, cbuf, bbuf, abuf);
            else if (q2 || q3) k16q23_superblock(q3, s, xs, xpb, cbuf, bbuf, abuf);
            else if (xs4) k16xs_superblock(s, xs, xpb, cbuf, bbuf, abuf);
            else k16q45_superblock(q5, s, xs, xpb, cbuf, bbuf, abuf);
        }
        for (int t = 0; t < 16; t++) _mm512_storeu_ps(Y + (size_t)(t0 + t) * (size_t)ldy, _mm512_load_ps(abuf[t]));
    }
    AMX_RELEASE();
}
