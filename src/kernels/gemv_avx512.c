/* gemv_avx512.c — AVX-512 (F/BW/VL/DQ + VNNI) kernels for every weight format, and the f32
 * helpers. Compiled with the AVX-512 flags (Makefile); reached only after kiln_kernels_select()
 * saw the CPU support them. Contracts: gemv_isa.h.
 *
 * Decode (GEMV) techniques, all reading the weights exactly as stored:
 *   F32/F16/BF16  16 lanes per FMA; F16 via vcvtph2ps, BF16 by a 16-bit shift.
 *   FP8 E4M3      sign-extend byte→word, shift left 7, clear bit 14: the word is then the IEEE half
 *                 whose value is exactly fp8/256 (normals and subnormals alike), converted by
 *                 vcvtph2ps; the 256 is folded into the per-block scale. Accumulated per 128-col
 *                 block, then × scale_inv. (The NaN codes 0x7F/0xFF read as ±480/256: checkpoints
 *                 and kiln's quantiser never contain them.) That general path and the exact fast
 *                 path below serve CPUs without AVX512_BF16 and KILN_FP8_EXACT=1; by default the
 *                 decode GEMV takes the BF16-dot path (x rounded to bf16, vdpbf16ps; see there).
 *   INT4 group    x is quantised to int8 per 32 (kiln_quant_x32) and deinterleaved into even/odd
 *                 columns, so a 64-byte load of packed weights (128 columns) feeds two vpdpbusd
 *                 directly: low nibbles (unsigned q+8) · x_even, high nibbles · x_odd. Each int32 lane
 *                 then holds columns [8l, 8l+8) of one group; the +8 offset is removed by starting
 *                 the lane at −8·Σx_q, and lanes are scaled by (bf16 group scale) × (x block scale).
 *   Q8_0/Q4_0     the same integer dot per 32-block: Q8_0 weights made unsigned by xor 0x80 (lane
 *                 start −128·Σx_q), Q4_0 nibbles unsigned (lane start −8·Σx_q).
 * Four weight rows are processed together so activation loads are shared. */
#include "kernels/gemv_isa.h"
#include "kernels/kquant.h"
#include "kernels/k16_quants.h"
#include "base/fp.h"
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI __mmask16 mask16(int64_t n) { return (__mmask16)((1u << n) - 1u); } /* n in [0, 16) */
AI int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- f32 helpers ---------------------------------------------------------------------------------- */
static float dot_f32(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = mask16(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static void axpy_f32(float a, const float *x, float *y, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = mask16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static void scale_f32(float *x, float a, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(va, _mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = mask16(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* Prefetch distance in groups of 4 rows: at least ~8 KiB ahead of the loads. Until the loads were
 * software-pipelined a second prefetch ran 16 KiB further ahead into L2 (measured then: L1 4 KiB +
 * L2 8 KiB 57 / 55 / 53 GB/s, L1 8 KiB + L2 16 KiB 62 / 59 / 59 GB/s on gate/up-shaped INT4
 * weights, 2 threads). With the pipelined loads it only cost instructions and was removed: tmp
 * micro-benchmark (40 gate/up-shaped weights, 2 threads, ten interleaved rounds, median) INT4
 * 57.6 GB/s with it, 68.6 without (16 KiB alone 70.0, 4 KiB 67.1); FP8 53.7 vs 63.5. */
#ifdef PF_RUNTIME
int kiln_pf_bytes = 8192;
#define PF_BYTES kiln_pf_bytes
#endif
#ifndef PF_BYTES
#define PF_BYTES 8192
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif
#ifdef NO_SWPF
#define PFH(a) ((void)(a))
#else
#define PFH(a) _mm_prefetch((const char *)(a), PF_HINT)
#endif
/* The INT4 loops prefetch their weights and scales with the non-temporal hint (PREFETCHNTA): the line
 * still comes into L1 ahead of its load (the prefetch runs ~8 KiB ahead, well inside L1), but it is
 * not meant to stay in the outer caches, which a weight read once per token has no use for.
 * Measured on the dev VM (AMD EPYC, Zen 5), the knob alternating inside one process: bench-500m INT4
 * decode windows 2-4% faster (total time ratio 0.967 / 0.970 / 0.983 over 40-60 alternating windows
 * of 32 steps), the INT4 GEMV passes over 272 MB of weights +4.5 to +7% (66.0 → 70.5, 68.7 → 71.8,
 * 65.3 → 68.4 GB/s); the FP8 loop with the same hint: no change (total time 1.008 / 1.003, GEMV
 * ±2%), so it keeps T0. Not measured on other CPUs. */
#ifndef I4_PF_HINT
#define I4_PF_HINT _MM_HINT_NTA
#endif
#define PFH4(a) _mm_prefetch((const char *)(a), I4_PF_HINT)
/* The group of 4 rows starting at r prefetches the group g groups ahead while that lies inside the
 * weight, also past this call's rows [r0, r1): the driver's row chunks are small, and the chunk
 * after this one is most often read next by this thread (or, taken by the other one, found in this
 * core's cache rather than DRAM); stopping at r1 left the last PF_BYTES of every chunk unprefetched. */
/* Pipelined runs: the INT4 and FP8 loops load step k + 1's weights during step k, and every
 * PIPE_RUN_BYTES of a 4-row group's weights the next step's load is issued by a second copy of the
 * step's code (the run's peeled last step) instead of the loop's own load instructions. Why: with
 * one unbroken loop, wide rows streamed markedly slower than narrow ones although the address
 * stream is the same sequential one (pure loads without the arithmetic ran at one speed for every
 * row width), and a 2,048-column INT4 row group — 4 KiB, one loop of 16 steps — was fast. The guest
 * has no PMU counters to name the cause; the per-instruction stride prefetcher seeing one endless
 * stride is the likely one, since breaking the loop's load stream every few KiB is all it takes.
 * Measured on the dev VM, 2 threads, interleaved A/B in one process (30 rounds, median ratio):
 * INT4 g32 2048 × 5632 (a "down" projection) +13% (43.8 → 49.2 GB/s at ~60 GB/s plain read), FP8
 * +27% (38.3 → 48.3); 5632 × 2048 unchanged; bench-500m decode INT4 +4%, FP8 +7%. A first version
 * restarted the pipeline at each run (a plain load, its latency exposed): as fast on a quiet host,
 * 4–15% slower than no runs on a contended one (~32 GB/s); the peeled load is not slower there.
 * Runs of 2, 4 and 8 KiB measured alike; 1 KiB (with restarts) lost the gain. PIPE_RT makes the
 * length a variable for such measurements. */
#ifdef PIPE_RT
int kiln_pipe_run_bytes = 4096;
#define PIPE_RUN_BYTES kiln_pipe_run_bytes
#endif
#ifndef PIPE_RUN_BYTES
#define PIPE_RUN_BYTES 4096
#endif
#define PFG(r) ((r) + 4 * (g + 1) <= w->rows ? g : 0)
AI int64_t pf_groups(size_t row_bytes) {
    int64_t g = (int64_t)(PF_BYTES / (4 * (row_bytes ? row_bytes : 1)));
#ifdef PF_RUNTIME
    if (PF_BYTES == 0) return 0;
#endif
    return g < 1 ? 1 : g;
}

/* Rows [r0, r1) in calls of 4 rows where a 4-row call reads one tile group (tiled weights: leading
 * rows up to a multiple of 4 go one at a time), the rest one at a time. */
#define FOR_ROW_GROUPS(w, r0, r1, CALL4, CALL1)                                  \
    do {                                                                         \
        int64_t r_ = (r0);                                                       \
        if ((w)->tiled)                                                          \
            for (; r_ < (r1) && (r_ & 3); r_++) { const int64_t r = r_; CALL1; } \
        for (; r_ + 4 <= (r1); r_ += 4) { const int64_t r = r_; CALL4; }         \
        for (; r_ < (r1); r_++) { const int64_t r = r_; CALL1; }                 \
    } while (0)

/* ---- 16-value loaders for the float formats (FP8 yields value/256, see the top comment) ----------- */
AI __m512 fp8_half_to_ps(__m128i b) {
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16((short)0xBFFF)));
}
AI __m512 ld16(int f, const uint8_t *row, int64_t c) {
    switch (f) {
    case KILN_WF_F32: return _mm512_loadu_ps((const float *)(row + 4 * c));
    case KILN_WF_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * c)));
    case KILN_WF_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * c))), 16));
    default: return fp8_half_to_ps(_mm_loadu_si128((const __m128i *)(row + c)));
    }
}
AI __m512 ld16m(int f, const uint8_t *row, int64_t c, __mmask16 m) {
    switch (f) {
    case KILN_WF_F32: return _mm512_maskz_loadu_ps(m, (const float *)(row + 4 * c));
    case KILN_WF_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * c));
    case KILN_WF_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * c)), 16));
    default: return fp8_half_to_ps(_mm_maskz_loadu_epi8(m, row + c));
    }
}

/* ---- F32 / F16 / BF16 GEMV -------------------------------------------------------------------------- */
/* BF16 reads its activation prepared (xprep_bf16e): per 32 columns, the 16 even columns' x then the
 * 16 odd ones', zero-padded to a multiple of 32. Why: a 64-byte load of 32 bf16 weights then becomes
 * f32 in two single-cycle ops — the even columns by a 32-bit shift left by 16 (each dword's low
 * word), the odd ones by masking off each dword's low word — where widening each half (vpmovzxwd,
 * a cross-lane shuffle) and shifting took four; the GEMV and the few-token steps share the form and
 * so the summation order. */
#define BF16E_CHUNK 128 /* prepared bytes per 32 columns */
static size_t xprep_bytes_bf16e(const kiln_weight *w) { return (size_t)((w->cols + 31) / 32) * BF16E_CHUNK; }
static void xprep_bf16e(const kiln_weight *w, const float *x, void *xp) {
    const int64_t cols = w->cols;
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    float *o = (float *)xp;
    for (int64_t c = 0; c < cols; c += 32, o += 32) {
        const int64_t n = cols - c;
        const __m512 v0 = n >= 16 ? _mm512_loadu_ps(x + c) : _mm512_maskz_loadu_ps(mask16(n), x + c);
        const __m512 v1 = n >= 32 ? _mm512_loadu_ps(x + c + 16) : n > 16 ? _mm512_maskz_loadu_ps(mask16(n - 16), x + c + 16) : _mm512_setzero_ps();
        _mm512_store_ps(o, _mm512_permutex2var_ps(v0, ev, v1));
        _mm512_store_ps(o + 16, _mm512_permutex2var_ps(v0, od, v1));
    }
}
/* One 32-column step of float_rows' F16 / BF16 loop (below): rows' weights in raw, replaced by
 * column cn's (the pipeline); group pfg ahead prefetched. */
AI void half_step(int f, int NR, int NT, const uint8_t *const *p, int64_t c, int64_t cn, const uint8_t *pf, int64_t pfg, const float *x,
                  int64_t ldx, __m512i *raw, __m512 (*a)[2], __m512 (*b)[2]) {
    if (NR == 4 && pfg)
        for (int k = 0; k < 4; k++) PFH(pf + 8 * c + 64 * k);
    __m512i nxt[4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) nxt[j] = _mm512_loadu_si512(p[j] + 2 * cn);
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        __m512 w0, w1;
        if (f == KILN_WF_F16) {
            w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(raw[j]));
            w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(raw[j], 1));
        } else { /* BF16: even columns, odd columns (x prepared to match) */
            w0 = _mm512_castsi512_ps(_mm512_slli_epi32(raw[j], 16));
            w1 = _mm512_castsi512_ps(_mm512_and_si512(raw[j], _mm512_set1_epi32((int)0xFFFF0000u)));
        }
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            a[j][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * ldx + c), a[j][t]);
            b[j][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * ldx + c + 16), b[j][t]);
        }
        raw[j] = nxt[j];
    }
}
/* NR rows starting at r (NR = 4 or 1) × NT tokens (1 or 2; token t's x at x + t·ldx — for BF16 its
 * prepared activation —, its results at y + t·ldy); two accumulator chains per (row, token), each
 * token's sums in the order of the 1-token GEMV, so a few-token step gives the GEMV's bits. */
AI void float_rows(int f, int NR, int NT, const kiln_weight *w, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t r, int64_t pfg) {
    const int64_t cols = w->cols, c32 = cols & ~(int64_t)31, c16 = cols & ~(int64_t)15;
    const uint8_t *p[4];
    __m512 a[4][2], b[4][2];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        p[j] = w->data + (size_t)(r + j) * w->row_bytes;
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) a[j][t] = b[j][t] = _mm512_setzero_ps();
    }
    /* Prefetch of the group PF ahead: 4 rows × 32 elements per step. */
    const int esz = f == KILN_WF_F32 ? 4 : 2;
    const uint8_t *pf = p[0] + 4 * pfg * (int64_t)w->row_bytes;
    int64_t c = 0;
    if (esz == 2) {
        /* F16/BF16: 32 weights = one 64-byte load per row, software-pipelined as in the INT4 kernel
         * (the next 32 columns load while these compute). */
        __m512i raw[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) raw[j] = c32 ? _mm512_loadu_si512(p[j]) : _mm512_setzero_si512();
        /* runs of PIPE_RUN_BYTES of the 4-row group (256 bytes a step) whose last step is its own
         * copy of the code, as the FP8 kernel (see PIPE_RUN_BYTES). Measured (dev VM, AMD EPYC Zen 5,
         * `kiln bench --gemv --weights fp8,bf16 --shape 8192x3072,3072x8192 --threads 1`, three
         * alternations, per-round ratio to FP8): BF16 0.80 / 0.73 → 0.84 / 0.99 (24 / 22 → 31 / 31
         * GB/s); b17 BF16 decode at 2 threads 12.0 → 14.3 tok/s (scripts/bench_ab.py, 3 rounds). */
        const int64_t run = 32 * (PIPE_RUN_BYTES / 256 > 0 ? PIPE_RUN_BYTES / 256 : 1);
        for (int64_t c0 = 0; c0 < c32; c0 += run) {
            const int64_t ce = min64(c0 + run, c32);
            for (c = c0; c < ce - 32; c += 32) half_step(f, NR, NT, p, c, c + 32, pf, pfg, x, ldx, raw, a, b);
            half_step(f, NR, NT, p, c, c + 32 < c32 ? c + 32 : c, pf, pfg, x, ldx, raw, a, b); /* the run's last step */
        }
        c = c32;
    }
    if (f == KILN_WF_BF16 && c < cols) { /* the last cols % 32 columns as one masked 32-column step */
        const __mmask32 m = (__mmask32)((1u << (cols - c)) - 1u);
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m512i raw = _mm512_maskz_loadu_epi16(m, p[j] + 2 * c);
            const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
            const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32((int)0xFFFF0000u)));
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                a[j][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * ldx + c), a[j][t]);
                b[j][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * ldx + c + 16), b[j][t]);
            }
        }
        c = cols;
    }
    for (; c < c32; c += 32) {
        if (NR == 4 && pfg)
            for (int k = 0; k < 2 * esz; k++) PFH(pf + 4 * esz * c + 64 * k);
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m512 w0 = ld16(f, p[j], c), w1 = ld16(f, p[j], c + 16);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                a[j][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * ldx + c), a[j][t]);
                b[j][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * ldx + c + 16), b[j][t]);
            }
        }
    }
    if (c < c16) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m512 w0 = ld16(f, p[j], c);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) a[j][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * ldx + c), a[j][t]);
        }
        c += 16;
    }
    if (c < cols) {
        __mmask16 m = mask16(cols - c);
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m512 w0 = ld16m(f, p[j], c, m);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) b[j][t] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + t * ldx + c), b[j][t]);
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) y[t * ldy + j] = _mm512_reduce_add_ps(_mm512_add_ps(a[j][t], b[j][t]));
}

AI void gemv_float(int f, const kiln_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
    const int64_t g = pf_groups(w->row_bytes);
    for (; r + 4 <= r1; r += 4) float_rows(f, 4, 1, w, x, 0, y + (r - r0), 0, r, PFG(r));
    for (; r < r1; r++) float_rows(f, 1, 1, w, x, 0, y + (r - r0), 0, r, 0);
}
/* Few-token steps of the float formats: per group of 4 rows, the tokens in passes of two — the first
 * streams the rows from memory with the GEMV's prefetch, the others find them in L1 / L2. */
AI void gemv_few_float(int f, const kiln_weight *w, const float *X, int64_t cols, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t g = pf_groups(w->row_bytes);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4)
        for (int t = 0; t < n; t += 2) {
            if (n - t >= 2) float_rows(f, 4, 2, w, X + t * cols, cols, Y + t * ldy + r, ldy, r, t == 0 ? PFG(r) : 0);
            else float_rows(f, 4, 1, w, X + t * cols, cols, Y + t * ldy + r, ldy, r, t == 0 ? PFG(r) : 0);
        }
    for (; r < r1; r++)
        for (int t = 0; t < n; t++) float_rows(f, 1, 1, w, X + t * cols, cols, Y + t * ldy + r, ldy, r, 0);
}
#define FEW_FLOAT(name, f)                                                                                                          \
    static void name(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, \
                     int64_t r1) {                                                                                                  \
        if (f == KILN_WF_BF16) gemv_few_float(f, w, (const float *)xp, (int64_t)(xpb / 4), n, Y, ldy, r0, r1); /* prepared x */ \
        else gemv_few_float(f, w, X, w->cols, n, Y, ldy, r0, r1);                                                                   \
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
    (void)x;
    gemv_float(KILN_WF_BF16, w, (const float *)xp, y, r0, r1); /* x prepared by xprep_bf16e */
}

/* ---- FP8 block GEMV --------------------------------------------------------------------------------- */
/* Fast path (block % 64 == 0 and denormals honoured, i.e. MXCSR.DAZ clear — kiln never sets it):
 * a 64-byte load of weights is spread by four in-lane vpshufb into dwords holding the fp8 byte in
 * bits 31..24; an arithmetic shift by 4 and clearing bits 30..27 leaves the f32 that is exactly
 * fp8 × 2^-120 (the seven magnitude bits become exponent|mantissa; e = 0 codes become exact f32
 * denormals). Shuffle k takes bytes 4k..4k+3 of each 128-bit lane, so it holds columns
 * {16l + 4k + i}; the prepared activation is x × 2^64 in that same order per 64-column chunk, which
 * keeps every product a normal float. The block sum is then × scale_inv × 2^56. No conversion
 * instruction and no lane-crossing shuffle: 4 simple ops per 16 weights. */
#define FP8_CHUNK 256 /* bytes of prepared activation per 64 columns */
static size_t xprep_bytes_fp8(const kiln_weight *w);
static void xprep_fp8_exact(const kiln_weight *w, const float *x, void *xp) {
    const int64_t cols = w->cols;
    const __m512 k2 = _mm512_set1_ps(18446744073709551616.0f); /* 2^64 */
    /* position 4l + i of vector k ← column 16l + 4k + i */
    const __m512i perm0 = _mm512_set_epi32(51, 50, 49, 48, 35, 34, 33, 32, 19, 18, 17, 16, 3, 2, 1, 0);
    float *o = (float *)xp;
    for (int64_t c0 = 0; c0 < cols; c0 += 64, o += 64) {
        float v[64] __attribute__((aligned(64)));
        int64_t n = cols - c0 < 64 ? cols - c0 : 64;
        memset(v, 0, sizeof v);
        memcpy(v, x + c0, (size_t)n * sizeof(float));
        const __m512 v0 = _mm512_load_ps(v), v1 = _mm512_load_ps(v + 16), v2 = _mm512_load_ps(v + 32), v3 = _mm512_load_ps(v + 48);
        for (int k = 0; k < 4; k++) {
            const __m512i idx = _mm512_add_epi32(perm0, _mm512_set1_epi32(4 * k));
            /* indices < 32 pick from (v0, v1), 32..63 from (v2, v3) */
            __m512 lo = _mm512_permutex2var_ps(v0, idx, v1);
            __m512 hi = _mm512_permutex2var_ps(v2, _mm512_sub_epi32(idx, _mm512_set1_epi32(32)), v3);
            __m512 r = _mm512_mask_blend_ps((__mmask16)0xFF00, lo, hi);
            _mm512_store_ps(o + 16 * k, _mm512_mul_ps(r, k2));
        }
    }
}

AI __m512 fp8_tiny(__m512i w, __m512i shuf) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(_mm512_shuffle_epi8(w, shuf), 4), _mm512_set1_epi32((int)0x87FFFFFF)));
}

/* One 64-column step of the exact fast path (fp8_rows_pipe, bf = 0) for NR rows (wv[j]: row j's 64
 * weight bytes) × NT tokens (token t's prepared chunk at xc + t·xstride floats): each row's weights
 * are converted once for all NT tokens, and each token's products go into its chains in the 1-token
 * order. */
AI void fp8_fast_step(int NR, int NT, const __m512i *wv, const __m512i *sh, const float *xc, int64_t xstride, __m512 (*a)[2],
                      __m512 (*b)[2]) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        const __m512 f0 = fp8_tiny(wv[j], sh[0]), f1 = fp8_tiny(wv[j], sh[1]), f2 = fp8_tiny(wv[j], sh[2]), f3 = fp8_tiny(wv[j], sh[3]);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const float *x = xc + t * xstride;
            a[j][t] = _mm512_fmadd_ps(f0, _mm512_load_ps(x), a[j][t]);
            b[j][t] = _mm512_fmadd_ps(f1, _mm512_load_ps(x + 16), b[j][t]);
            a[j][t] = _mm512_fmadd_ps(f2, _mm512_load_ps(x + 32), a[j][t]);
            b[j][t] = _mm512_fmadd_ps(f3, _mm512_load_ps(x + 48), b[j][t]);
        }
    }
}

/* General path (any block size, or DAZ set): fp8 → IEEE half holding fp8/256 → f32 (see top). */
AI void fp8_rows(int NR, const kiln_weight *w, const float *x, float *y, int64_t r) {
    const int64_t cols = w->cols, B = w->block, sc_cols = (cols + B - 1) / B;
    const float *S = (const float *)w->scales;
    const uint8_t *p[4];
    const float *srow[4];
    __m512 tot[4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        p[j] = w->data + (size_t)(r + j) * w->row_bytes;
        srow[j] = S + ((r + j) / B) * sc_cols;
        tot[j] = _mm512_setzero_ps();
    }
    for (int64_t cb = 0, bi = 0; cb < cols; cb += B, bi++) {
        const int64_t ce = min64(cb + B, cols);
        __m512 a[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) a[j] = _mm512_setzero_ps();
        for (int64_t c = cb; c < ce; c += 16) {
            __mmask16 m = ce - c >= 16 ? (__mmask16)0xFFFF : mask16(ce - c);
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + c);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) a[j] = _mm512_fmadd_ps(ld16m(KILN_WF_FP8_BLOCK, p[j], c, m), x0, a[j]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) tot[j] = _mm512_fmadd_ps(a[j], _mm512_set1_ps(srow[j][bi] * 256.0f), tot[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) y[j] = _mm512_reduce_add_ps(tot[j]);
}

/* BF16-dot path (CPUs with AVX512_BF16, unless kiln_kernels_fp8_exact(1)): the activation is
 * rounded to bf16 (x × 2^64, round to nearest even) and the weights are turned into bf16 by two
 * shifts and a mask per 32 of them, then vdpbf16ps multiplies 32 pairs at once: 8 instructions per
 * 64 weights against the exact path's 17, which made FP8 decode compute-bound per core (~34 GB/s in
 * cache vs a core's ~30–40 GB/s stream). Why rounding x is within FP8 semantics: the reference
 * FP8 inference (DeepSeek-V3's fp8_gemm, vLLM's and SGLang's block-FP8 linear) quantises the
 * activation to FP8 per 128 columns before the product, a far coarser step than bf16; a BF16 model
 * computes with bf16 activations throughout.
 *   Weight bytes as 16-bit words w = b_odd·256 + b_even: odd = (w >>arith 4) & 0x87F0 and
 *   even = ((w << 8) >>arith 4) & 0x87F0 are bf16 words s|0000eeee|mmm0000 = fp8 × 2^-120 for every
 *   normal fp8; the 14 subnormal codes (|fp8| < 2^-6, below 1/28,672 of a 448-scaled block's
 *   largest weight) become bf16 denormals, which vdpbf16ps reads as zero. Products (x × 2^64) ×
 *   (fp8 × 2^-120) stay normal floats for any activation of f32 range above 2^-62 in magnitude;
 *   the block sum is × scale_inv × 2^56 as in the exact path.
 *   Prepared activation per 64 columns: 32 bf16 of the even columns, then 32 of the odd ones, so
 *   dword lane i of the even product pairs columns 4i and 4i + 2, of the odd one 4i + 1 and 4i + 3. */
#define FP8B_CHUNK 128

static void xprep_fp8_bf16(const kiln_weight *w, const float *x, void *xp) {
    const int64_t cols = w->cols;
    const __m512 k2 = _mm512_set1_ps(18446744073709551616.0f); /* 2^64 */
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    uint8_t *o = (uint8_t *)xp;
    for (int64_t c0 = 0; c0 < cols; c0 += 64, o += FP8B_CHUNK) {
        float v[64] __attribute__((aligned(64)));
        int64_t n = cols - c0 < 64 ? cols - c0 : 64;
        memset(v, 0, sizeof v);
        memcpy(v, x + c0, (size_t)n * sizeof(float));
        const __m512 v0 = _mm512_mul_ps(_mm512_load_ps(v), k2), v1 = _mm512_mul_ps(_mm512_load_ps(v + 16), k2),
                     v2 = _mm512_mul_ps(_mm512_load_ps(v + 32), k2), v3 = _mm512_mul_ps(_mm512_load_ps(v + 48), k2);
        /* cvtne2ps_pbh(a, b): words 0..15 from b, 16..31 from a */
        const __m512bh e = _mm512_cvtne2ps_pbh(_mm512_permutex2var_ps(v2, ev, v3), _mm512_permutex2var_ps(v0, ev, v1));
        const __m512bh d = _mm512_cvtne2ps_pbh(_mm512_permutex2var_ps(v2, od, v3), _mm512_permutex2var_ps(v0, od, v1));
        _mm512_store_si512(o, (__m512i)e);
        _mm512_store_si512(o + 64, (__m512i)d);
    }
}

/* One 64-column step of the BF16-dot path (fp8_rows_pipe, bf = 1) for NR rows (wv[j]: row j's 64 weight bytes). */
AI void fp8_bf16_step(int NR, int NT, const __m512i *wv, const uint8_t *xc, size_t xpb, __m512 (*a)[2], __m512 (*b)[2]) {
    const __m512i mask = _mm512_set1_epi16((short)0x87F0);
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        const __m512i odd = _mm512_and_si512(_mm512_srai_epi16(wv[j], 4), mask);
        const __m512i even = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(wv[j], 8), 4), mask);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) { /* token t's prepared chunk: 32 even-column bf16, then 32 odd */
            const uint8_t *x = xc + (size_t)t * xpb;
            a[j][t] = _mm512_dpbf16_ps(a[j][t], (__m512bh)even, (__m512bh)_mm512_load_si512(x));
            b[j][t] = _mm512_dpbf16_ps(b[j][t], (__m512bh)odd, (__m512bh)_mm512_load_si512(x + 64));
        }
    }
}

/* Both fast FP8 paths (bf = 1: BF16-dot, activation chunks of FP8B_CHUNK bytes; bf = 0: exact,
 * FP8_CHUNK bytes and the shuffle constants sh): one loop over the row's full 64-column chunks,
 * software-pipelined across the 128-column scale blocks too (chunk k + 1 loads while k is
 * computed); a block's sum is scaled when it ends. NT tokens (1 or 2; token t's prepared row at
 * xp + t·xpb, its results at y + t·ldy): the few-token steps. */
AI void fp8_rows_pipe(int bf, int NR, int NT, const kiln_weight *w, const uint8_t *xp, size_t xpb, float *y, int64_t ldy, int64_t r,
                      const __m512i *sh, int64_t pfg) {
    const int64_t cols = w->cols, B = w->block, sc_cols = (cols + B - 1) / B, xchunk = bf ? FP8B_CHUNK : FP8_CHUNK;
    const float *S = (const float *)w->scales;
    row_loc p[4];
    const float *srow[4];
    __m512 tot[4][2], a[4][2], b[4][2];
    __m512i wv[4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        p[j] = row_at(w, r + j);
        srow[j] = S + ((r + j) / B) * sc_cols;
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) tot[j][t] = a[j][t] = b[j][t] = _mm512_setzero_ps();
    }
    const int64_t cs = p[0].cs, nfull = cols / 64, cpb = B / 64 /* B % 64 == 0 here */, xstride = (int64_t)(xpb / 4);
    /* software prefetch, 4 × 64 bytes per 64-column step: in the tile layout (a 4-row group one
     * sequential stream of 256-byte steps) PF_BYTES ahead in that stream, else the 4-row group pfg
     * ahead. The group ahead was 32 KB ahead on 8,192-column rows, where the lines left L1 before
     * their loads: `kiln bench --gemv --weights q8_0,fp8 --shape 8192x3072,3072x8192 --threads 1`,
     * three alternations, FP8 per-round ratio to Q8_0 1.01 / 0.86 → 1.05 / 1.03 (3072x8192: 32.4 →
     * 38.7 GB/s; 16 KiB ahead: 1.02 / 0.99). */
    const uint8_t *pf = w->tiled && NR == 4 ? w->data + (size_t)r * w->row_bytes + PF_BYTES : w->data + (size_t)(r + 4 * pfg) * w->row_bytes;
    int64_t bi = 0, inb = 0;
    const int64_t run = PIPE_RUN_BYTES / 256 > 0 ? PIPE_RUN_BYTES / 256 : 1;
    /* One 64-column step k with wv = its weights; wv ← the weights of step kn. */
#define FP8_STEP(k, kn)                                                                                                  \
    do {                                                                                                                 \
        const uint8_t *xc = xp + (k) * xchunk;                                                                           \
        if (pfg) {                                                                                                       \
            const uint8_t *q = pf + 256 * (k);                                                                           \
            PFH(q); PFH(q + 64); PFH(q + 128); PFH(q + 192);                                                             \
        }                                                                                                                \
        __m512i wn[4];                                                                                                   \
        _Pragma("GCC unroll 4") for (int j = 0; j < NR; j++) wn[j] = _mm512_loadu_si512(p[j].p + cs * (kn));             \
        if (bf) fp8_bf16_step(NR, NT, wv, xc, xpb, a, b);                                                                \
        else fp8_fast_step(NR, NT, wv, sh, (const float *)xc, xstride, a, b);                                            \
        _Pragma("GCC unroll 4") for (int j = 0; j < NR; j++) wv[j] = wn[j];                                              \
        if (++inb == cpb) { /* block bi complete */                                                                      \
            _Pragma("GCC unroll 4") for (int j = 0; j < NR; j++) {                                                       \
                const __m512 sc = _mm512_set1_ps(srow[j][bi] * 72057594037927936.0f /* 2^56 */);                         \
                _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {                                                   \
                    tot[j][t] = _mm512_fmadd_ps(_mm512_add_ps(a[j][t], b[j][t]), sc, tot[j][t]);                         \
                    a[j][t] = b[j][t] = _mm512_setzero_ps();                                                             \
                }                                                                                                        \
            }                                                                                                            \
            bi++;                                                                                                        \
            inb = 0;                                                                                                     \
        }                                                                                                                \
    } while (0)
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wv[j] = nfull ? _mm512_loadu_si512(p[j].p) : _mm512_setzero_si512();
    for (int64_t kb = 0; kb < nfull; kb += run) { /* one run of PIPE_RUN_BYTES (see there) */
        const int64_t ke = min64(kb + run, nfull);
        for (int64_t k = kb; k < ke - 1; k++) FP8_STEP(k, k + 1);
        FP8_STEP(ke - 1, ke < nfull ? ke : ke - 1); /* loads the next run's first step through its own instructions */
    }
#undef FP8_STEP
    if (64 * nfull < cols) { /* the row's last, partial chunk (row_at's tail bytes), in block bi */
        const __mmask64 m = ((__mmask64)1 << (cols - 64 * nfull)) - 1;
        const uint8_t *xc = xp + nfull * xchunk;
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = _mm512_maskz_loadu_epi8(m, p[j].tp);
        if (bf) fp8_bf16_step(NR, NT, wv, xc, xpb, a, b);
        else fp8_fast_step(NR, NT, wv, sh, (const float *)xc, xstride, a, b);
        inb++;
    }
    if (inb) /* the last block, partial */
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++)
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++)
                tot[j][t] = _mm512_fmadd_ps(_mm512_add_ps(a[j][t], b[j][t]), _mm512_set1_ps(srow[j][bi] * 72057594037927936.0f), tot[j][t]);
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) y[t * ldy + j] = _mm512_reduce_add_ps(tot[j][t]);
}

/* The FP8 entries come in two forms, one per kernel table: kiln_ktable_avx512_bf16 (bf16
 * activations and vdpbf16ps, CPUs with AVX512_BF16) and kiln_ktable_avx512 (the exact f32 path).
 * The compute context (gemv.h, kiln_kctx) picks the table, so two engines of one process can each
 * run their own form at the same time. */
static size_t xprep_bytes_fp8(const kiln_weight *w) { return (size_t)((w->cols + 63) / 64) * FP8_CHUNK; }
static size_t xprep_bytes_fp8b(const kiln_weight *w) { return (size_t)((w->cols + 63) / 64) * FP8B_CHUNK; }
static void xprep_fp8(const kiln_weight *w, const float *x, void *xp) { xprep_fp8_exact(w, x, xp); }

static void gemv_fp8_impl(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1, const int bf16);
static void gemv_fp8(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    gemv_fp8_impl(w, x, xp, y, r0, r1, 0);
}
static void gemv_fp8b(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    gemv_fp8_impl(w, x, xp, y, r0, r1, 1);
}

/* vpshufb index k of the exact path: dword i of each lane ← byte 4k + i, placed in the dword's top byte */
AI void fp8_shuffles(__m512i sh[4]) {
    for (int k = 0; k < 4; k++) {
        uint32_t iv[16];
        for (int e = 0; e < 16; e++) iv[e] = ((uint32_t)(4 * k + (e & 3)) << 24) | 0x808080u;
        sh[k] = _mm512_loadu_si512(iv);
    }
}

static void gemv_fp8_impl(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1, const int bf16) {
    int64_t r = r0;
    if (xp && w->block % 64 == 0 && bf16) {
        const int64_t g = pf_groups(w->row_bytes);
        FOR_ROW_GROUPS(w, r0, r1, fp8_rows_pipe(1, 4, 1, w, xp, 0, y + (r - r0), 0, r, NULL, PFG(r)),
                       fp8_rows_pipe(1, 1, 1, w, xp, 0, y + (r - r0), 0, r, NULL, 0));
        return;
    }
    if (xp && w->block % 64 == 0 && !(_mm_getcsr() & 0x40 /* DAZ */)) {
        __m512i sh[4];
        fp8_shuffles(sh);
        const int64_t g = pf_groups(w->row_bytes);
        FOR_ROW_GROUPS(w, r0, r1, fp8_rows_pipe(0, 4, 1, w, xp, 0, y + (r - r0), 0, r, sh, PFG(r)),
                       fp8_rows_pipe(0, 1, 1, w, xp, 0, y + (r - r0), 0, r, sh, 0));
        return;
    }
    if (w->tiled) { /* the general path reads rows in checkpoint order: one gathered row at a time */
        uint8_t row[w->row_bytes];
        const int64_t sc_cols = (w->cols + w->block - 1) / w->block;
        for (; r < r1; r++) {
            kiln_weight v = *w;
            kiln_weight_row_gather(w, r, row);
            v.data = row;
            v.rows = 1;
            v.tiled = 0;
            v.scales = (const float *)w->scales + (r / w->block) * sc_cols;
            fp8_rows(1, &v, x, y + (r - r0), 0);
        }
        return;
    }
    for (; r + 4 <= r1; r += 4) fp8_rows(4, w, x, y + (r - r0), r);
    for (; r < r1; r++) fp8_rows(1, w, x, y + (r - r0), r);
}

/* Few-token FP8 steps: per group of 4 rows, pairs of tokens, each row's weights converted once per
 * pair; the first pass streams the group from memory with the GEMV's prefetch, the others find it in
 * L1 / L2; each token's result is its 1-token GEMV's in the same form bit for bit (the same rows,
 * the same chains per token). bf = 0: the exact form, which gemv.c gives FP8 steps of 2..16 tokens
 * (table_for_n says why); bf = 1: the BF16-dot form (the table of AVX512_BF16 CPUs), taken only for
 * steps the caller marks as n decodes (kiln_kctx.decode_steps: speculative verification, batched
 * decode). Where the fast path does not apply (block % 64; DAZ set for the exact form), the GEMV
 * once per token. */
AI void gemv_few_fp8_form(const int bf, const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy,
                          int64_t r0, int64_t r1) {
    if (!xp || w->block % 64 || (!bf && (_mm_getcsr() & 0x40 /* DAZ */))) {
        for (int t = 0; t < n; t++)
            (bf ? gemv_fp8b : gemv_fp8)(w, X + (size_t)t * (size_t)w->cols, xp ? xp + (size_t)t * xpb : NULL, Y + (size_t)t * (size_t)ldy + r0, r0, r1);
        return;
    }
    __m512i shv[4];
    if (!bf) fp8_shuffles(shv);
    const __m512i *sh = bf ? NULL : shv;
    const int64_t g = pf_groups(w->row_bytes);
    FOR_ROW_GROUPS(w, r0, r1,
                   for (int t = 0; t < n; t += 2) {
                       const int64_t pfg = t == 0 ? PFG(r) : 0;
                       float *yt = Y + (size_t)t * (size_t)ldy + r;
                       if (n - t >= 2) fp8_rows_pipe(bf, 4, 2, w, xp + (size_t)t * xpb, xpb, yt, ldy, r, sh, pfg);
                       else fp8_rows_pipe(bf, 4, 1, w, xp + (size_t)t * xpb, xpb, yt, ldy, r, sh, pfg);
                   },
                   for (int t = 0; t < n; t++) fp8_rows_pipe(bf, 1, 1, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, ldy, r, sh, 0));
}
static void gemv_few_fp8(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0,
                         int64_t r1) {
    gemv_few_fp8_form(0, w, X, xp, xpb, n, Y, ldy, r0, r1);
}
static void gemv_few_fp8b(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0,
                          int64_t r1) {
    gemv_few_fp8_form(1, w, X, xp, xpb, n, Y, ldy, r0, r1);
}

/* ---- exact dequantisation into f32 tiles (prefill) ------------------------------------------------ */
AI void dequant_float(int f, const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld) {
    const int64_t cols = w->cols, c16 = cols & ~(int64_t)15;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = w->data + (size_t)r * w->row_bytes;
        float *o = out + (r - r0) * ld;
        int64_t c = 0;
        for (; c < c16; c += 16) _mm512_storeu_ps(o + c, ld16(f, p, c));
        if (c < cols) {
            __mmask16 m = mask16(cols - c);
            _mm512_mask_storeu_ps(o + c, m, ld16m(f, p, c, m));
        }
    }
}
static void dequant_f16(const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld) {
    dequant_float(KILN_WF_F16, w, r0, r1, out, ld);
}
static void dequant_bf16(const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld) {
    dequant_float(KILN_WF_BF16, w, r0, r1, out, ld);
}
/* (fp8/256) × (scale·256) rounds once, to the same float as fp8 × scale; stored as f32 (out_bf16 = 0)
 * or rounded once more, RNE, to bf16 with the row zero-padded to ld (out_bf16 = 1: the BF16-dot
 * GEMM's tiles). */
AI void dequant_fp8_rows(const kiln_weight *w, int64_t r0, int64_t r1, void *out, int64_t ld, int out_bf16) {
    const int64_t cols = w->cols, B = w->block, sc_cols = (cols + B - 1) / B;
    const float *S = (const float *)w->scales;
    uint8_t gathered[w->tiled ? w->row_bytes : 1];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = w->data + (size_t)r * w->row_bytes;
        if (w->tiled) {
            kiln_weight_row_gather(w, r, gathered);
            p = gathered;
        }
        const float *srow = S + (r / B) * sc_cols;
        float *of = (float *)out + (r - r0) * ld;
        uint16_t *ob = (uint16_t *)out + (r - r0) * ld;
        for (int64_t cb = 0, bi = 0; cb < cols; cb += B, bi++) {
            const int64_t ce = min64(cb + B, cols);
            const __m512 s = _mm512_set1_ps(srow[bi] * 256.0f);
            for (int64_t c = cb; c < ce; c += 16) {
                const __mmask16 m = ce - c >= 16 ? (__mmask16)0xFFFF : mask16(ce - c);
                const __m512 v = _mm512_mul_ps(ld16m(KILN_WF_FP8_BLOCK, p, c, m), s);
                if (out_bf16) _mm256_mask_storeu_epi16(ob + c, m, (__m256i)_mm512_cvtneps_pbh(v));
                else _mm512_mask_storeu_ps(of + c, m, v);
            }
        }
        for (int64_t c = cols; out_bf16 && c < ld; c++) ob[c] = 0;
    }
}
static void dequant_fp8(const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld) { dequant_fp8_rows(w, r0, r1, out, ld, 0); }

/* ---- f32 GEMM on a dequantised tile: 4 rows of X × 4 rows of W per register tile ------------------- */
static void gemm_f32(const float *W, int64_t ldw, int nr, const float *X, int64_t ldx, int n, int64_t cols,
                     float *Y, int64_t ldy) {
    const int64_t c16 = cols & ~(int64_t)15;
    const __mmask16 tm = mask16(cols & 15);
    for (int i = 0; i < n; i += 4) {
        const float *xr[4];
        for (int a = 0; a < 4; a++) xr[a] = X + (size_t)(i + a < n ? i + a : n - 1) * (size_t)ldx;
        for (int j = 0; j < nr; j += 4) {
            const float *wr[4];
            for (int b = 0; b < 4; b++) wr[b] = W + (size_t)(j + b < nr ? j + b : nr - 1) * (size_t)ldw;
            __m512 acc[4][4];
#pragma GCC unroll 4
            for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) acc[a][b] = _mm512_setzero_ps();
            for (int64_t c = 0; c < c16; c += 16) {
                __m512 xv[4], wv[4];
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++) xv[a] = _mm512_loadu_ps(xr[a] + c);
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) wv[b] = _mm512_loadu_ps(wr[b] + c);
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++) acc[a][b] = _mm512_fmadd_ps(xv[a], wv[b], acc[a][b]);
            }
            if (tm) {
                __m512 xv[4], wv[4];
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++) xv[a] = _mm512_maskz_loadu_ps(tm, xr[a] + c16);
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) wv[b] = _mm512_maskz_loadu_ps(tm, wr[b] + c16);
#pragma GCC unroll 4
                for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
                    for (int b = 0; b < 4; b++) acc[a][b] = _mm512_fmadd_ps(xv[a], wv[b], acc[a][b]);
            }
            for (int a = 0; a < 4 && i + a < n; a++)
                for (int b = 0; b < 4 && j + b < nr; b++)
                    Y[(size_t)(i + a) * (size_t)ldy + (size_t)(j + b)] = _mm512_reduce_add_ps(acc[a][b]);
        }
    }
}

/* ---- INT4 group (compressed-tensors pack-quantized) -------------------------------------------------- */
/* Prepared activation per 128-column chunk (256 bytes, zero-padded past cols):
 *   xe[64] int8   x_q[128c + 2k]       (even columns: the low nibbles of packed bytes k)
 *   xo[64] int8   x_q[128c + 2k + 1]   (odd columns: the high nibbles)
 *   st[16] int32  −8 · Σ x_q[128c + 8l .. +8)   (lane l's start value: removes the +8 offset)
 *   xs[16] f32    the x block scale of lane l's columns */
#define I4_CHUNK 256
/* INT4 group 32 on AVX-512 computes in Q4_0's arithmetic, per 32 columns, in every layout it is read
 * in (KILN_TILE_Q16 or checkpoint rows; the 4-row tiles of group 32 reach this table only as gathered
 * rows): Q4_0's prepared activation, q16_tile and i4q_rows. Other groups: the 4-row tile kernels,
 * per 8 columns. */
AI int i4q_form(const kiln_weight *w) { return w->block == 32 && w->cols % 32 == 0; }
/* (a 4-row-tiled group-32 weight never reaches these kernels: kiln_ktable_reads_tiled gathers it) */
static size_t xprep_bytes_q(const kiln_weight *w);
static size_t xprep_bytes_int4(const kiln_weight *w) {
    if (i4q_form(w)) return xprep_bytes_q(w); /* Q4_0's prepared activation (q16_tile) */
    return (size_t)((w->cols + 127) / 128) * I4_CHUNK;
}

/* kiln_quant_x32 for one block of 32, vectorised; same arithmetic, so the same bytes. */
AI __m512i quant32(const float *x, float *d) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
    qa = _mm512_min_epi32(_mm512_max_epi32(qa, lo), hi);
    qb = _mm512_min_epi32(_mm512_max_epi32(qb, lo), hi);
    *d = db;
    return _mm512_castsi256_si512(_mm256_set_m128i(_mm512_cvtepi32_epi8(qb), _mm512_cvtepi32_epi8(qa)));
}

static void xprep_q4(const kiln_weight *w, const float *x, void *xp);
static void xprep_int4(const kiln_weight *w, const float *x, void *xp) {
    if (i4q_form(w)) {
        xprep_q4(w, x, xp);
        return;
    }
    const int64_t cols = w->cols, nch = (cols + 127) / 128;
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i bidx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (int64_t ch = 0; ch < nch; ch++) {
        uint8_t *o = (uint8_t *)xp + ch * I4_CHUNK;
        const int64_t base = 128 * ch;
        int8_t q[128] __attribute__((aligned(64)));
        float d[4] = {0, 0, 0, 0};
        memset(q, 0, sizeof q);
        for (int b = 0; b < 4 && base + 32 * b < cols; b++)
            _mm256_store_si256((__m256i *)(q + 32 * b), _mm512_castsi512_si256(quant32(x + base + 32 * b, d + b)));
        /* Even bytes are the low byte of each 16-bit word, odd bytes the high byte. */
        const __m512i q0 = _mm512_load_si512(q), q1 = _mm512_load_si512(q + 64);
        const __m512i xe = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(q0)), _mm512_cvtepi16_epi8(q1), 1);
        const __m512i xo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(q0, 8))),
                                              _mm512_cvtepi16_epi8(_mm512_srai_epi16(q1, 8)), 1);
        _mm512_store_si512(o, xe);
        _mm512_store_si512(o + 64, xo);
        /* Lane l covers xe/xo bytes 4l..4l+3: the sum of its 8 columns by two dot products with 1s. */
        const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, xe), ones, xo);
        _mm512_store_si512(o + 128, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-8)));
        _mm512_store_ps((float *)(o + 192), _mm512_permutexvar_ps(bidx, _mm512_castps128_ps512(_mm_loadu_ps(d))));
    }
}

/* Per-weight constants of the INT4 kernel (computed once per call, not per row). */
typedef struct { __m512i sidx; __mmask32 smask, tsm; int64_t ng, nfull, tail, gstep, cpg, u, nb, tg; } int4_consts;

/* Where INT4 row r's bytes (row_at) and scales are: its group g0 at srow + ss·g0 (g0 a multiple of
 * u; ss = 1 untiled, 4 tiled), its tail groups at stail. */
AI void int4_row_ptrs(const kiln_weight *w, int64_t r, const int4_consts *k, row_loc *p, const uint16_t **srow, const uint16_t **stail) {
    const uint16_t *S = (const uint16_t *)w->scales;
    *p = row_at(w, r);
    if (p->cs == 64) {
        *srow = S + (size_t)r * (size_t)k->ng;
        *stail = *srow + k->nb * k->u;
    } else {
        const uint16_t *base = S + (size_t)(r & ~(int64_t)3) * (size_t)k->ng;
        *srow = base + (r & 3) * k->u;
        *stail = base + 4 * k->nb * k->u + (r & 3) * k->tg;
    }
}

AI void int4_rows(int NR, const kiln_weight *w, const uint8_t *xp, float *y, int64_t r, const int4_consts *k,
                  int64_t pfg) {
    const int64_t ng = k->ng, nfull = k->nfull, tail = k->tail;
    const uint16_t *S = (const uint16_t *)w->scales;
    const __m512i sidx = k->sidx;
    const __mmask32 smask = k->smask;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    row_loc p[4];
    const uint16_t *srow[4], *stail[4];
    __m512 acc[4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        int4_row_ptrs(w, r + j, k, &p[j], &srow[j], &stail[j]);
        acc[j] = _mm512_setzero_ps();
    }
    /* g0: the chunk's first group; advanced without a division (G ≤ 128: 128/G groups per chunk;
     * G > 128: one group per G/128 chunks). */
    const int64_t gstep = k->gstep, cpg = k->cpg;
    int64_t g0 = 0, gc = 0;
    /* Software prefetch (NR = 4): while this group of 4 rows is read, the group PF ahead streams in
     * (4 × 64 bytes of it per step; the hardware prefetcher alone leaves a core at ~15 GB/s). */
    const int64_t pfrows = NR == 4 ? 4 * pfg : pfg;
    const uint8_t *pf = w->data + (size_t)(r + pfrows) * w->row_bytes;
    const uint8_t *pfs = (const uint8_t *)(S + (size_t)(r + pfrows) * (size_t)ng);
    const int64_t ss = p[0].cs == 64 ? 1 : 4;
    /* The weights of chunk ch + 1 are loaded while chunk ch is computed (software pipelining): the
     * loads then issue a whole iteration earlier than the out-of-order window would reach them.
     * One core streaming INT4 weights (tmp micro-benchmark, 40 gate/up-shaped weights): 22–23 →
     * 27–28 GB/s, the plain read beside it ~30. */
    __m512i wcur[4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wcur[j] = nfull ? _mm512_loadu_si512(p[j].p) : _mm512_setzero_si512();
    for (int64_t ch = 0; ch < nfull; ch++) {
        __m512i wnext[4];
        const int64_t chn = ch + 1 < nfull ? ch + 1 : ch;
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wnext[j] = _mm512_loadu_si512(p[j].p + p[j].cs * chn);
        const uint8_t *o = xp + ch * I4_CHUNK;
        const __m512i xe = _mm512_load_si512(o), xo = _mm512_load_si512(o + 64), st = _mm512_load_si512(o + 128);
        const __m512 xs = _mm512_load_ps((const float *)(o + 192));
        if (NR == 4 && pfg) {
            PFH4((const char *)pf + 256 * ch);
            PFH4((const char *)pf + 256 * ch + 64);
            PFH4((const char *)pf + 256 * ch + 128);
            PFH4((const char *)pf + 256 * ch + 192);
            if ((ch & 1) == 0) PFH4((const char *)pfs + 32 * ch);
        } else if (NR == 1 && pfg) {
            PFH4((const char *)pf + 64 * ch);
            if ((ch & 7) == 0) PFH4((const char *)pfs + 8 * ch);
        }
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m512i wv = wcur[j];
            wcur[j] = wnext[j];
            __m512i lo = _mm512_and_si512(wv, m4), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
            __m512i t = _mm512_dpbusd_epi32(st, lo, xe);
            t = _mm512_dpbusd_epi32(t, hi, xo);
            __m512 ws = _mm512_castsi512_ps(_mm512_permutexvar_epi16(sidx, _mm512_maskz_loadu_epi16(smask, srow[j] + ss * g0)));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(ws, xs), acc[j]);
        }
        g0 += gstep;
        if (++gc == cpg) { gc = 0; g0 += !gstep; }
    }
    if (tail) {
        const int64_t ch = nfull;
        const uint8_t *o = xp + ch * I4_CHUNK;
        const __m512i xe = _mm512_load_si512(o), xo = _mm512_load_si512(o + 64), st = _mm512_load_si512(o + 128);
        const __m512 xs = _mm512_load_ps((const float *)(o + 192));
        const __mmask64 bm = ((__mmask64)1 << (tail / 2)) - 1;
        const __mmask32 tsm = k->tsm;
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            __m512i wv = _mm512_maskz_loadu_epi8(bm, p[j].tp);
            __m512i lo = _mm512_and_si512(wv, m4), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
            __m512i t = _mm512_dpbusd_epi32(st, lo, xe);
            t = _mm512_dpbusd_epi32(t, hi, xo);
            __m512 ws = _mm512_castsi512_ps(_mm512_permutexvar_epi16(sidx, _mm512_maskz_loadu_epi16(tsm, stail[j])));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(ws, xs), acc[j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) y[j] = _mm512_reduce_add_ps(acc[j]);
}
/* Four tiled rows r..r+3 (r % 4 == 0) of a weight with group ≤ 128 for NT (1..3) tokens (prepared
 * rows at xp + t·xpb, results y[t·ldy + j]): NT = 1 is the common decode case; NT = 2..3 the
 * few-token steps (speculative verification, small decode batches), which stream the weights once
 * at the GEMV's rate for all their tokens (the GEMM's register tiles, without the GEMV's prefetch
 * and pipelining, read them at half that rate: `kiln bench --gemv --tokens 1,2`). Written so that
 * every stream advances from one base pointer: the weights 256 bytes per 128-column chunk, the
 * scales 4·u words (all four rows' groups of the chunk, one load; lane l of row j takes word
 * j·u + 8l/G through sidx[j]), the prepared activation 256 bytes. The general int4_rows kept ~14
 * loop values on the stack and recomputed each row's address with a multiply per chunk (gcc -O2);
 * in this loop they stay in registers. Per (row, token) the same arithmetic and summation order as
 * int4_rows and the GEMM tiles, so the same results bit for bit (tests/kernels/test_gemv.c compares
 * them). */
AI void int4_tile4(int NT, const kiln_weight *w, const uint8_t *xp, size_t xpb, float *y, int64_t ldy, int64_t r, const int4_consts *k,
                   const __m512i sidx[4], int64_t pfg) {
    const int64_t nfull = k->nfull, u = k->u;
    const uint8_t *wp = w->data + (size_t)r * w->row_bytes;
    const uint16_t *sp = (const uint16_t *)w->scales + (size_t)r * (size_t)k->ng;
    /* the weights prefetched PF_BYTES ahead in the 4-row group's stream (as fp8_rows_pipe), the scales
     * of the group pfg ahead */
    const uint8_t *pf = pfg ? wp + PF_BYTES : NULL;
    const uint8_t *pfs = (const uint8_t *)(sp + (size_t)(4 * pfg) * (size_t)k->ng);
    const int64_t spf = 64 / (8 * u) - 1; /* the scale stream gains a cache line every spf + 1 chunks */
    const __mmask32 sm4 = (__mmask32)((1u << (4 * u)) - 1u);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[4][3];
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = acc[2][t] = acc[3][t] = _mm512_setzero_ps();
    const int64_t run = PIPE_RUN_BYTES / 256 > 0 ? PIPE_RUN_BYTES / 256 : 1;
    /* Row j (weights wv, scales sv) of chunk ch against the NT tokens' prepared chunks. */
#define I4_ROW(wv, j, ch)                                                                                     \
    do {                                                                                                      \
        const __m512i lo = _mm512_and_si512(wv, m4), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);    \
        const __m512 ws = _mm512_castsi512_ps(_mm512_permutexvar_epi16(sidx[j], sv));                         \
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) {                                                \
            const uint8_t *o = xp + (size_t)t * xpb + (ch) * I4_CHUNK;                                        \
            const __m512i xe = _mm512_load_si512(o), xo = _mm512_load_si512(o + 64), st = _mm512_load_si512(o + 128); \
            const __m512 xs = _mm512_load_ps((const float *)(o + 192));                                       \
            const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(st, lo, xe), hi, xo);                  \
            acc[j][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, xs), acc[j][t]);             \
        }                                                                                                     \
    } while (0)
    /* One 128-column chunk ch of the four rows, whose weights are in C0..C3; N0..N3 ← the 256 bytes at wn. */
#define I4_STEP(ch, wn, C0, C1, C2, C3, N0, N1, N2, N3)                                                           \
    do {                                                                                                         \
        N0 = _mm512_loadu_si512(wn);                                                                             \
        N1 = _mm512_loadu_si512((wn) + 64);                                                                      \
        N2 = _mm512_loadu_si512((wn) + 128);                                                                     \
        N3 = _mm512_loadu_si512((wn) + 192);                                                                     \
        const __m512i sv = _mm512_maskz_loadu_epi16(sm4, sp + 4 * u * (ch));                                     \
        if (pf) {                                                                                                \
            PFH4(pf + 256 * (ch));                                                                                \
            PFH4(pf + 256 * (ch) + 64);                                                                           \
            PFH4(pf + 256 * (ch) + 128);                                                                          \
            PFH4(pf + 256 * (ch) + 192);                                                                          \
            if (((ch) & spf) == 0) PFH4(pfs + 8 * u * (ch));                                                      \
        }                                                                                                        \
        I4_ROW(C0, 0, ch);                                                                                       \
        I4_ROW(C1, 1, ch);                                                                                       \
        I4_ROW(C2, 2, ch);                                                                                       \
        I4_ROW(C3, 3, ch);                                                                                       \
    } while (0)
    if (nfull) {
        /* Two register sets trade roles step by step (two steps per loop iteration), so the pipelined
         * weights never need copying between registers. */
        __m512i w0 = _mm512_loadu_si512(wp), w1 = _mm512_loadu_si512(wp + 64);
        __m512i w2 = _mm512_loadu_si512(wp + 128), w3 = _mm512_loadu_si512(wp + 192);
        __m512i n0, n1, n2, n3;
        for (int64_t cb = 0; cb < nfull; cb += run) { /* one run of PIPE_RUN_BYTES */
            const int64_t ce = min64(cb + run, nfull);
            int64_t ch = cb;
            for (; ch + 2 < ce; ch += 2) {
                I4_STEP(ch, wp + 256 * (ch + 1), w0, w1, w2, w3, n0, n1, n2, n3);
                I4_STEP(ch + 1, wp + 256 * (ch + 2), n0, n1, n2, n3, w0, w1, w2, w3);
            }
            if (ch + 1 < ce) {
                I4_STEP(ch, wp + 256 * (ch + 1), w0, w1, w2, w3, n0, n1, n2, n3);
                w0 = n0, w1 = n1, w2 = n2, w3 = n3;
                ch++;
            }
            /* the run's last chunk loads the next run's first through its own instructions */
            I4_STEP(ch, wp + 256 * (ce < nfull ? ce : ch), w0, w1, w2, w3, n0, n1, n2, n3);
            w0 = n0, w1 = n1, w2 = n2, w3 = n3;
        }
    }
#undef I4_STEP
    if (k->tail) { /* the last cols % 128 columns: row j's bytes at 256·nfull + t·j, its groups at 4·nb·u + j·tg */
        const __mmask64 bm = ((__mmask64)1 << (k->tail / 2)) - 1;
        const size_t tb = w->row_bytes % 64;
        const uint16_t *stail = sp + 4 * k->nb * u;
        const __m512i sidxt[4] = {k->sidx, k->sidx, k->sidx, k->sidx};
        const __mmask32 tsm = k->tsm;
#define I4_TAIL(j)                                                                                       \
    do {                                                                                                 \
        const __m512i wv = _mm512_maskz_loadu_epi8(bm, wp + 256 * nfull + tb * (j));                     \
        const __m512i sv = _mm512_maskz_loadu_epi16(tsm, stail + (j) * k->tg);                           \
        const __m512i *sidx = sidxt;                                                                     \
        I4_ROW(wv, j, nfull);                                                                            \
    } while (0)
        I4_TAIL(0);
        I4_TAIL(1);
        I4_TAIL(2);
        I4_TAIL(3);
#undef I4_TAIL
    }
#undef I4_ROW
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) y[(size_t)t * (size_t)ldy + (size_t)j] = _mm512_reduce_add_ps(acc[j][t]);
}
/* The per-weight constants of the INT4 kernels. Lane l's scale: the bf16 goes to word 2l+1 (the
 * f32's high half) from group 8l/G of the chunk; word 2l takes word 31 of the source, always zero
 * (at most 4 words are loaded). */
AI void int4_setup(const kiln_weight *w, int4_consts *k) {
    const int64_t G = w->block, tail = w->cols % 128;
    uint16_t iw[32];
    for (int l = 0; l < 16; l++) {
        iw[2 * l] = 31;
        iw[2 * l + 1] = (uint16_t)(G <= 128 ? (8 * l) / G : 0);
    }
    k->sidx = _mm512_loadu_si512(iw);
    k->smask = G <= 128 ? (__mmask32)((1u << (128 / G)) - 1u) : 1u;
    k->tsm = G <= 128 ? (__mmask32)((1u << (tail / G)) - 1u) : 1u;
    k->ng = w->cols / G;
    k->nfull = w->cols / 128;
    k->tail = tail;
    k->gstep = G <= 128 ? 128 / G : 0;
    k->cpg = G <= 128 ? 1 : G / 128;
    k->u = G <= 128 ? 128 / G : 1;
    k->nb = k->ng / k->u;
    k->tg = k->ng % k->u;
}

static void q16_rows(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t yoff, int64_t r0,
                     int64_t r1);
static void i4q_rows(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1);
static void gemv_int4(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    if (w->tiled == KILN_TILE_Q16) {
        q16_rows(KILN_WF_INT4_GROUP, w, xp, 0, 1, y, 0, r0, r0, r1);
        return;
    }
    if (i4q_form(w)) {
        i4q_rows(w, xp, 0, 1, y - r0, 0, r0, r1);
        return;
    }
    const int64_t G = w->block;
    uint16_t iw[32];
    for (int l = 0; l < 16; l++) iw[2 * l] = 31;
    int4_consts k;
    int4_setup(w, &k);
    const int64_t g = pf_groups(w->row_bytes);
    if (w->tiled && G <= 128) {
        __m512i sidx4[4];
        for (int j = 0; j < 4; j++) {
            for (int l = 0; l < 16; l++) iw[2 * l + 1] = (uint16_t)(j * k.u + (8 * l) / G);
            sidx4[j] = _mm512_loadu_si512(iw);
        }
        FOR_ROW_GROUPS(w, r0, r1, int4_tile4(1, w, xp, 0, y + (r - r0), 0, r, &k, sidx4, PFG(r)), int4_rows(1, w, xp, y + (r - r0), r, &k, 0));
        return;
    }
    FOR_ROW_GROUPS(w, r0, r1, int4_rows(4, w, xp, y + (r - r0), r, &k, PFG(r)), int4_rows(1, w, xp, y + (r - r0), r, &k, 0));
}

/* ---- GGUF blocks of 32: Q8_0, Q4_0, Q5_0, IQ4_NL, Q4_1, Q5_1 -------------------------------------
 * Prepared activation: per 32-block 64 bytes {x_q[32] int8, st[8] int32 lane start values}, then the
 * block scales d[cols/32] f32. The weights are made unsigned and the lane starts undo the offset:
 * Q8_0 and IQ4_NL: st = −128·Σ(lane's 4 x_q) (Q8_0 weights xor 0x80 are w + 128; IQ4_NL's levels
 * −127..113 are looked up as level + 128, 1..241); Q4_0: st = −8·Σ (nibbles are w + 8); Q5_0: −16·Σ.
 * After d: tot[cols/32] int32, the block's whole start value (the sum of its 8 st lanes), for the
 * 16-row interleave kernels (q16_*), whose register lanes are rows, not column groups.
 * Q4_1 / Q5_1 (w = d·q + m, q unsigned) need no start (the kernels start lanes at 0) but the
 * block's m term m·dx·Σx_q: after tot, xs[cols/32] f32 = dx·Σx_q (ggml's q8_1 keeps the same sum,
 * rounded to f16; kiln keeps it in f32). Per (row, block): exact int32 dot, one conversion, × d·dx,
 * FMA; the _1 formats then one FMA of m·xs into the row's first lane. */
static size_t xprep_bytes_q(const kiln_weight *w) { return ((size_t)(w->cols / 32) * 72 + 63) & ~(size_t)63; }
static size_t xprep_bytes_q1(const kiln_weight *w) { return ((size_t)(w->cols / 32) * 76 + 63) & ~(size_t)63; }
AI void xprep_q(const kiln_weight *w, const float *x, void *xp, int32_t off) {
    const int64_t nb = w->cols / 32;
    uint8_t *o = (uint8_t *)xp;
    float *d = (float *)(o + nb * 64);
    int32_t *tot = (int32_t *)(d + nb);
    const __m256i ones = _mm256_set1_epi8(1), voff = _mm256_set1_epi32(-off);
    for (int64_t b = 0; b < nb; b++) {
        __m256i q = _mm512_castsi512_si256(quant32(x + 32 * b, d + b));
        _mm256_store_si256((__m256i *)(o + 64 * b), q);
        __m256i sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
        const __m256i st = _mm256_mullo_epi32(sum, voff);
        _mm256_store_si256((__m256i *)(o + 64 * b + 32), st);
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(st), _mm256_extracti128_si256(st, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
        tot[b] = _mm_cvtsi128_si32(h);
    }
}
static void xprep_q8(const kiln_weight *w, const float *x, void *xp) { xprep_q(w, x, xp, 128); }
static void xprep_q4(const kiln_weight *w, const float *x, void *xp) { xprep_q(w, x, xp, 8); }
static void xprep_q5(const kiln_weight *w, const float *x, void *xp) { xprep_q(w, x, xp, 16); }
/* Q4_1 / Q5_1: start −(−1)·Σ gives tot = Σx_q, hence xs; the kernels do not read st. */
static void xprep_q1(const kiln_weight *w, const float *x, void *xp) {
    xprep_q(w, x, xp, -1);
    kiln_xprep_q1_sums(xp, w->cols / 32);
}
AI int64_t qb_bytes(int f) { return (int64_t)kiln_wf_block_bytes((kiln_wformat)f); }
AI int qb_qs(int f) { return kiln_q32_qs_offset((kiln_wformat)f); }
AI int qb_has_min(int f) { return kiln_q32_has_min((kiln_wformat)f); }
AI uint32_t qb_qh(int f, const uint8_t *blk) {
    uint32_t h;
    memcpy(&h, blk + (f == KILN_WF_Q5_0 ? 2 : 4), 4);
    return h;
}
/* One row's block b as 32 unsigned weights (element i in byte i). */
AI __m256i q_weights(int f, const uint8_t *blk) {
    if (f == KILN_WF_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + qb_qs(f))), m4 = _mm_set1_epi8(0x0F);
    __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    if (f == KILN_WF_IQ4_NL) q = _mm256_shuffle_epi8(_mm512_castsi512_si256(iq4_lut()), q);
    if (f == KILN_WF_Q5_0 || f == KILN_WF_Q5_1) /* bit i of qh is element i's fifth bit */
        q = _mm256_mask_add_epi8(q, (__mmask32)qb_qh(f, blk), q, _mm256_set1_epi8(0x10));
    return q;
}
/* Rows ba and bq's block b: ba's 32 unsigned weights in bytes 0-31, bq's in 32-63. */
AI __m512i q_weights2(int f, const uint8_t *ba, const uint8_t *bq) {
    if (f == KILN_WF_Q8_0) {
        const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ba + 2))),
                                              _mm256_loadu_si256((const __m256i *)(bq + 2)), 1);
        return _mm512_xor_si512(wv, _mm512_set1_epi8((char)0x80));
    }
    /* GGML's nibble order: low nibbles are elements 0-15, high nibbles 16-31 */
    const int qs = qb_qs(f);
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(ba + qs))),
                                              _mm_loadu_si128((const __m128i *)(bq + qs)), 1);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    __m512i wv = _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
    if (f == KILN_WF_IQ4_NL) wv = _mm512_shuffle_epi8(iq4_lut(), wv);
    if (f == KILN_WF_Q5_0 || f == KILN_WF_Q5_1)
        wv = _mm512_mask_add_epi8(wv, (__mmask64)((uint64_t)qb_qh(f, ba) | (uint64_t)qb_qh(f, bq) << 32), wv, _mm512_set1_epi8(0x10));
    return wv;
}
/* One row (the rows past the last group of 4; q_rows4 takes the groups). */
AI void q_row1(int f, const kiln_weight *w, const uint8_t *xp, float *y, int64_t r) {
    const int64_t nb = w->cols / 32, bb = qb_bytes(f);
    const float *d = (const float *)(xp + nb * 64), *xs = (const float *)(xp + nb * 72);
    const uint8_t *p = w->data + (size_t)r * w->row_bytes;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i xq = _mm256_load_si256((const __m256i *)(xp + 64 * b));
        const __m256i st = qb_has_min(f) ? _mm256_setzero_si256() : _mm256_load_si256((const __m256i *)(xp + 64 * b + 32));
        const uint8_t *blk = p + bb * b;
        uint32_t h;
        memcpy(&h, blk, 4); /* d, and m for the _1 formats */
        const __m128 s2 = _mm_cvtph_ps(_mm_cvtsi32_si128((int)h));
        const __m256i t = _mm256_dpbusd_epi32(st, q_weights(f, blk), xq);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(_mm_cvtss_f32(s2) * d[b]), acc);
        if (qb_has_min(f)) /* m·xs into lane 0 */
            acc = _mm256_fmadd_ps(_mm256_castps128_ps256(_mm_insert_ps(_mm_setzero_ps(), s2, 0x40)), _mm256_set1_ps(xs[b]), acc);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    *y = _mm_cvtss_f32(s);
}
/* A pair of rows' f16 scales of block b: d in lanes 0-7 (row a) and 8-15 (row q); for the _1
 * formats m (of a in lane 0, of q in lane 8, zero elsewhere) into *mv. */
AI __m512 q_scales2(int f, const uint8_t *ba, const uint8_t *bq, __m512 *mv) {
    uint32_t ha, hq;
    memcpy(&ha, ba, 4);
    memcpy(&hq, bq, 4);
    /* words: d_a, d_q, m_a, m_q */
    const __m128 s4 = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)((ha & 0xFFFFu) | (uint64_t)(hq & 0xFFFFu) << 16 |
                                                                  (uint64_t)(ha >> 16) << 32 | (uint64_t)(hq >> 16) << 48)));
    if (qb_has_min(f))
        *mv = _mm512_maskz_permutexvar_ps(0x0101, _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 2), _mm512_castps128_ps512(s4));
    return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_castps128_ps512(s4));
}
/* Four rows as two pairs, each pair in one 512-bit register: lanes 0-7 the first row's block,
 * lanes 8-15 the second's, against the block's prepared activation in both halves. Per pair and
 * block: one vpdpbusd, one conversion, one FMA, and both rows' f16 scales converted together
 * (two words → vcvtph2ps → × the x scale → spread to 8 lanes each), instead of all of it per row
 * (one row at a time: ~13 operations per row and block, the f16 scale alone ~5). Same integer dots and the
 * same per-block scaling as q_row1; the lanes are summed in another order at the end. */
AI void q_rows4(int f, const kiln_weight *w, const uint8_t *xp, float *y, int64_t r, int64_t pfg) {
    const int64_t nb = w->cols / 32, bb = qb_bytes(f);
    const float *d = (const float *)(xp + nb * 64), *xs = (const float *)(xp + nb * 72);
    const uint8_t *p0 = w->data + (size_t)r * w->row_bytes;
    const size_t rb = w->row_bytes;
    __m512 acc01 = _mm512_setzero_ps(), acc23 = acc01;
    const uint8_t *pf = p0 + 4 * pfg * (int64_t)rb;
    for (int64_t b = 0; b < nb; b++) {
        const __m512i xq = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(xp + 64 * b)));
        const __m512i st = qb_has_min(f) ? _mm512_setzero_si512() : _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(xp + 64 * b + 32)));
        const __m512 db = _mm512_set1_ps(d[b]);
        if (pfg) {
            PFH(pf + 4 * bb * b);
            PFH(pf + 4 * bb * b + 64);
            if (4 * bb > 128) PFH(pf + 4 * bb * b + 128);
        }
#define Q_PAIR(ra, acc)                                                                                             \
    do {                                                                                                            \
        const uint8_t *ba = p0 + (size_t)(ra) * rb + bb * b, *bq = ba + rb;                                         \
        __m512 mv;                                                                                                  \
        const __m512 sc = _mm512_mul_ps(q_scales2(f, ba, bq, &mv), db);                                             \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(st, q_weights2(f, ba, bq), xq)), sc, acc);    \
        if (qb_has_min(f)) acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs[b]), acc);                                  \
    } while (0)
        Q_PAIR(0, acc01);
        Q_PAIR(2, acc23);
#undef Q_PAIR
    }
    y[0] = _mm512_reduce_add_ps(_mm512_maskz_mov_ps(0x00FF, acc01));
    y[1] = _mm512_reduce_add_ps(_mm512_maskz_mov_ps(0xFF00, acc01));
    y[2] = _mm512_reduce_add_ps(_mm512_maskz_mov_ps(0x00FF, acc23));
    y[3] = _mm512_reduce_add_ps(_mm512_maskz_mov_ps(0xFF00, acc23));
}
/* Tokens per block of the GEMMs: their prepared rows fit in L2 (GEMM_X_BYTES), so a row group's
 * weights stay in L1 / L2 across the block (a multiple of the register tile's nt tokens). */
#define GEMM_X_BYTES (256u << 10)
AI int gemm_token_block(size_t xpb, int nt) {
    int tb = (int)(GEMM_X_BYTES / (xpb ? xpb : 1));
    tb -= tb % nt;
    return tb < nt ? nt : tb;
}

/* ---- Q8_0 / Q4_0 in the 16-row block interleave (tiled = 1, gemv.h) -------------------------------
 * One register holds 16 rows: per block, each 64-byte weight vector (4 columns of the 16 rows, u8)
 * meets one token's 4 int8 activations broadcast in a vpdpbusd; the 8 of a block (Q4_0: 4 vectors,
 * low and high nibbles) sum the 16 rows' block dots exactly from the block's start value (tot: −128 or
 * −8 × Σ x_q, undoing the +128 / +8 of the unsigned weights); then one conversion, the 16 rows' f16
 * scales × the token's scale, one FMA per block and token. GEMV (NT = 1) and GEMM (NT tokens sharing
 * each weight vector) compute exactly this per (row, token) in this order, so a token's result does
 * not depend on the batch. */
/* INT4 group 32 (KILN_TILE_Q16): the same kernel over the 256-byte blocks without inline scales; the
 * 16 rows' bf16 scales of block b at sg + 16·b (sg NULL for Q8_0 / Q4_0). */
AI size_t q16_block_bytes(int f) { return f == KILN_WF_INT4_GROUP ? 256 : 16 * (size_t)(f == KILN_WF_Q8_0 ? 34 : 18); }
/* Block b of q16_tile (below): the NT tokens' dots of the group's 16 rows, into acc[0..NT).
 * wcur: the Q4_0 / INT4 GEMV's weights of block b, replaced by block b + 1's (the pipeline). */
AI void q16_block(int f, int NT, int pf, const uint8_t *g, const uint16_t *sg, int64_t nb, int64_t b, const uint8_t *xp, size_t xpb,
                  __m512 *acc, __m512i *wcur) {
    const int q8 = f == KILN_WF_Q8_0, i4 = f == KILN_WF_INT4_GROUP;
    const size_t gbb = q16_block_bytes(f), woff = i4 ? 0 : 32;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const float *dx = (const float *)(xp + nb * 64);
    const int32_t *tot = (const int32_t *)(dx + nb);
    const uint8_t *gb = g + (size_t)b * gbb;
    /* GEMV: the weight stream PF_BYTES ahead (the next groups; a prefetch past the end is harmless).
     * Measured with `kiln bench --gemv --shape 8192x3072,3072x8192` (dev VM, 2 threads): Q4_0
     * 41.5 / 37.0 → 59.7 / 51.3 GB/s, Q8_0 43.7 / 52.4 → 63.9 / 57.6 (the hardware prefetcher
     * alone leaves a core well below the read bandwidth here, as the INT4 / FP8 kernels found). */
    if (pf) { /* (pf: the tile streams the group from memory — the GEMV, a few-token step's first tile) */
        for (size_t l = 0; l < gbb; l += 64) PFH4(gb + PF_BYTES + l);
        if (i4 && (b & 1) == 0) PFH4((const uint8_t *)(sg + 16 * b) + PF_BYTES / 8); /* the scale stream: 1/8 of the weights' */
    }
    const __m512 ws = i4 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(sg + 16 * b))), 16))
                         : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
    /* Integer sums are exact in any order: with few tokens the block's dots run in two chains
     * (ia, ib; added at the end) so that vpdpbusd's latency does not serialize the GEMV. */
    __m512i ia[8], ib[8];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        ia[t] = _mm512_set1_epi32(*(const int32_t *)((const uint8_t *)(tot + b) + (size_t)t * xpb));
        ib[t] = _mm512_setzero_si512();
    }
    if (q8) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i wv = _mm512_loadu_si512(gb + 32 + 64 * k);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const __m512i xb = _mm512_set1_epi32(*(const int32_t *)(xp + (size_t)t * xpb + 64 * b + 4 * k));
                if (NT < 4 && (k & 1)) ib[t] = _mm512_dpbusd_epi32(ib[t], wv, xb);
                else ia[t] = _mm512_dpbusd_epi32(ia[t], wv, xb);
            }
        }
    } else {
        __m512i wnext[4];
        if (NT == 1) {
            const uint8_t *gn = b + 1 < nb ? gb + gbb : gb;
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) wnext[k] = _mm512_loadu_si512(gn + woff + 64 * k);
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m512i v = NT == 1 ? wcur[k] : _mm512_loadu_si512(gb + woff + 64 * k);
            if (NT == 1) wcur[k] = wnext[k];
            const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const uint8_t *xt = xp + (size_t)t * xpb + 64 * b;
                ia[t] = _mm512_dpbusd_epi32(ia[t], lo, _mm512_set1_epi32(*(const int32_t *)(xt + 4 * k)));
                if (NT < 4) ib[t] = _mm512_dpbusd_epi32(ib[t], hi, _mm512_set1_epi32(*(const int32_t *)(xt + 16 + 4 * k)));
                else ia[t] = _mm512_dpbusd_epi32(ia[t], hi, _mm512_set1_epi32(*(const int32_t *)(xt + 16 + 4 * k)));
            }
        }
    }
    if (NT < 4)
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) ia[t] = _mm512_add_epi32(ia[t], ib[t]);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        const float dt = *(const float *)((const uint8_t *)(dx + b) + (size_t)t * xpb);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), _mm512_mul_ps(ws, _mm512_set1_ps(dt)), acc[t]);
    }
}
AI void q16_tile(int f, int NT, int pf, const uint8_t *g, const uint16_t *sg, int64_t nb, const uint8_t *xp, size_t xpb, float *Y, int64_t ldy) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    /* GEMV of Q4_0 / INT4: block b + 1's weights load while block b is computed (software pipelining,
     * as the INT4 GEMV: the loads issue an iteration earlier than the out-of-order window reaches them) */
    __m512i wcur[4];
    if (NT == 1 && f != KILN_WF_Q8_0)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) wcur[k] = _mm512_loadu_si512(g + (f == KILN_WF_INT4_GROUP ? 0 : 32) + 64 * k);
    /* A tile that streams its group from memory (pf) walks it in runs of ~4 KiB (Q8_0 8 blocks of 544
     * bytes, Q4_0 / INT4 16 of 288 / 256) whose last block is a second copy of the block's code, as
     * the FP8 and old INT4 row kernels do (see PIPE_RUN_BYTES): one unbroken loop over a 52 KB group
     * (Q8_0, 3,072 columns) ran one core at 22 GB/s where the FP8 kernel streamed 34–40. Measured
     * on the dev VM (AMD EPYC Zen 5), 1 thread, `kiln bench --gemv --weights fp8,q8_0,q4_0,int4
     * --shape 8192x3072,3072x8192 --tokens 1 --rounds 5 --threads 1`, alternated, median of the
     * per-round ratio to FP8: Q8_0 0.60–0.80 → 0.93–1.06, Q4_0 0.66–0.85 → 1.02–1.13, INT4
     * 0.72–0.83 → 0.95–1.07 (22–25 → 30–38 GB/s). Run lengths measured for Q8_0 (8192x3072, ratio):
     * 3 blocks 0.72, 4 0.87, 5 0.75, 6 0.94, 7 0.81–0.86, 8 0.93–0.97, 10 0.86, 12 0.86, 16 0.83; for
     * Q4_0 / INT4: 8 0.92 / 0.91, 14 0.86 / 0.94, 15 0.94 / 0.92, 16 1.02–1.07 / 0.95–1.01, 32 0.83 /
     * 0.86. Software pipelining of Q8_0's 8 vectors gained nothing with or without the runs. Tiles
     * that find the group in cache (pf = 0) keep one loop. */
    const int64_t run = pf ? (f == KILN_WF_Q8_0 ? 8 : 16) : nb;
    for (int64_t b0 = 0; b0 < nb; b0 += run) {
        const int64_t be = min64(b0 + run, nb);
        for (int64_t b = b0; b < be - 1; b++) q16_block(f, NT, pf, g, sg, nb, b, xp, xpb, acc, wcur);
        q16_block(f, NT, pf, g, sg, nb, be - 1, xp, xpb, acc, wcur); /* the run's last block: its own instructions */
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(Y + (size_t)t * (size_t)ldy, acc[t]);
}
/* Group q (rows 16q..16q+15) for tokens [0, n) into Y (row 16q of token t at Y[t·ldy]), in tiles of
 * up to 8 tokens. */
AI void q16_group(int f, const kiln_weight *w, int64_t q, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy) {
    const uint8_t *g = w->data + (size_t)q * 16 * w->row_bytes;
    const int64_t nb = w->cols / 32;
    const uint16_t *sg = f == KILN_WF_INT4_GROUP ? (const uint16_t *)w->scales + (size_t)q * 16 * (size_t)nb : NULL;
    int t = 0;
    /* AMX (kernels/q16_amx.h): each whole 16 tokens on tiles, the same bits as the tiles below */
    const kiln_q16_amx_fn amx = n >= 16 ? kiln_q16_amx_kernel() : NULL;
    if (amx) {
        t = n & ~15;
        amx(f, g, sg, nb, xp, xpb, t, Y, ldy);
        kiln_q16_amx_count((uint64_t)(t / 16) * (uint64_t)nb);
    }
    /* the group's first tile streams it from memory: prefetched as in the GEMV (the other tiles find
     * it in L1 / L2). Measured, `kiln bench bench-500m --batch 8,16,32 --weights int4 --ctx 128
     * --decode 16`, two alternated rounds: aggregate 362–387 / 479–508 / 583–692 tok/s with the GEMV
     * alone prefetching, 610–746 / 750–860 / 794–898 with every group's first tile; prefill 512 on the
     * 1.7B shape unchanged within noise */
    for (; t + 8 <= n; t += 8) q16_tile(f, 8, t == 0, g, sg, nb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy);
    switch (n - t) {
    case 7: q16_tile(f, 7, t == 0, g, sg, nb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 6: q16_tile(f, 6, t == 0, g, sg, nb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 5: q16_tile(f, 5, t == 0, g, sg, nb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 4: q16_tile(f, 4, t == 0, g, sg, nb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 3: q16_tile(f, 3, t == 0, g, sg, nb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 2: q16_tile(f, 2, t == 0, g, sg, nb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 1: q16_tile(f, 1, t == 0, g, sg, nb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    default: break;
    }
}
AI void gemv_q(int f, const kiln_weight *w, const void *xp, float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
    const int64_t g = pf_groups(w->row_bytes);
    for (; r + 4 <= r1; r += 4) q_rows4(f, w, xp, y + (r - r0), r, PFG(r));
    for (; r < r1; r++) q_row1(f, w, xp, y + (r - r0), r);
}
/* The row walk over the 16-row interleave (kernels/q16_rows.h); the rows it leaves in checkpoint
 * layout go through the row-major kernels, per token (GEMV) or as a GEMM. */
AI void q_rest(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t yoff, int64_t r0, int64_t r1);
#define Q16_ROWS q16_rows
#define Q16_GROUP q16_group
#define Q16_NT 8
#define Q16_X_BYTES GEMM_X_BYTES
#define Q16_REST q_rest
#include "kernels/q16_rows.h"
static void gemv_q8(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    if (w->tiled) q16_rows(KILN_WF_Q8_0, w, xp, 0, 1, y, 0, r0, r0, r1);
    else gemv_q(KILN_WF_Q8_0, w, xp, y, r0, r1);
}
static void gemv_q4(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    if (w->tiled) q16_rows(KILN_WF_Q4_0, w, xp, 0, 1, y, 0, r0, r0, r1);
    else gemv_q(KILN_WF_Q4_0, w, xp, y, r0, r1);
}


/* ---- integer-dot GEMM: prefill and batched decode (issue 20) -------------------------------------
 * Y[i·ldy + r] = W[r,:]·x_i for r in [r0, r1) and the n prepared activation rows x_i (xprep, row i at
 * xp + i·xpb). Register tiles of 4 weight rows × NT tokens: each weight vector is loaded, unpacked
 * and its scales spread once per NT tokens, each token's activation once per 4 rows; per (row,
 * token) and 128 INT4 columns (64 Q8_0 / Q4_0 columns): the integer dots, one conversion, one scale
 * multiply and one FMA — the GEMV's arithmetic and summation order per row exactly, so a token's
 * result does not depend on the batch it is computed in. Tokens go in blocks whose prepared rows
 * fit in L2 (GEMM_X_BYTES), so the row group's weights stay in L1 across the block. */

/* One 128-column chunk of the tile: the NR rows' unpacked weights (lo, hi) and lane scales (ws)
 * against NT tokens' prepared chunks (o0 + t·xpb): the GEMV's arithmetic per (row, token). */
AI void int4_gemm_chunk(int NR, int NT, const __m512i *lo, const __m512i *hi, const __m512 *ws, const uint8_t *o0, size_t xpb,
                        __m512 acc[4][3]) {
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) {
        const uint8_t *o = o0 + (size_t)t * xpb;
        const __m512i xe = _mm512_load_si512(o), xo = _mm512_load_si512(o + 64), st = _mm512_load_si512(o + 128);
        const __m512 xs = _mm512_load_ps((const float *)(o + 192));
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(st, lo[j], xe), hi[j], xo);
            acc[j][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws[j], xs), acc[j][t]);
        }
    }
}

/* NR (1 or 4) INT4 rows from r × NT (1..3) tokens from xp. */
AI void int4_gemm_tile(int NR, int NT, const kiln_weight *w, const uint8_t *xp, size_t xpb, float *Y, int64_t ldy, int64_t r,
                       const int4_consts *k) {
    const int64_t nfull = k->nfull, tail = k->tail;
    const __m512i sidx = k->sidx, m4 = _mm512_set1_epi8(0x0F);
    row_loc p[4];
    const uint16_t *srow[4], *stail[4];
    __m512 acc[4][3];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
        int4_row_ptrs(w, r + j, k, &p[j], &srow[j], &stail[j]);
#pragma GCC unroll 3
        for (int t = 0; t < NT; t++) acc[j][t] = _mm512_setzero_ps();
    }
    const int64_t ss = p[0].cs == 64 ? 1 : 4, gstep = k->gstep, cpg = k->cpg;
    int64_t g0 = 0, gc = 0;
    for (int64_t ch = 0; ch < nfull; ch++) {
        __m512i lo[4], hi[4];
        __m512 ws[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m512i wv = _mm512_loadu_si512(p[j].p + p[j].cs * ch);
            lo[j] = _mm512_and_si512(wv, m4);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
            ws[j] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(sidx, _mm512_maskz_loadu_epi16(k->smask, srow[j] + ss * g0)));
        }
        int4_gemm_chunk(NR, NT, lo, hi, ws, xp + ch * I4_CHUNK, xpb, acc);
        g0 += gstep;
        if (++gc == cpg) { gc = 0; g0 += !gstep; }
    }
    if (tail) {
        const __mmask64 bm = ((__mmask64)1 << (tail / 2)) - 1;
        __m512i lo[4], hi[4];
        __m512 ws[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) {
            const __m512i wv = _mm512_maskz_loadu_epi8(bm, p[j].tp);
            lo[j] = _mm512_and_si512(wv, m4);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
            ws[j] = _mm512_castsi512_ps(_mm512_permutexvar_epi16(sidx, _mm512_maskz_loadu_epi16(k->tsm, stail[j])));
        }
        int4_gemm_chunk(NR, NT, lo, hi, ws, xp + nfull * I4_CHUNK, xpb, acc);
    }
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) Y[(size_t)t * (size_t)ldy + (size_t)(r + j)] = _mm512_reduce_add_ps(acc[j][t]);
}

/* The rows of [r0, r1) for tokens [t0, t1) in tiles of NR rows × 3 tokens (the last 1–2 tokens in a
 * narrower tile). */
AI void int4_gemm_rows(int NR, const kiln_weight *w, const uint8_t *xp, size_t xpb, float *Y, int64_t ldy, int64_t r, int t0, int t1,
                       const int4_consts *k) {
    int t = t0;
    for (; t + 3 <= t1; t += 3) int4_gemm_tile(NR, 3, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r, k);
    if (t1 - t == 2) int4_gemm_tile(NR, 2, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r, k);
    else if (t1 - t == 1) int4_gemm_tile(NR, 1, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r, k);
}

static void gemm_int4(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->tiled == KILN_TILE_Q16) {
        q16_rows(KILN_WF_INT4_GROUP, w, xp, xpb, n, Y, ldy, 0, r0, r1);
        return;
    }
    if (i4q_form(w)) {
        i4q_rows(w, xp, xpb, n, Y, ldy, r0, r1);
        return;
    }
    int4_consts k;
    int4_setup(w, &k);
    const int tb = gemm_token_block(xpb, 3);
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        FOR_ROW_GROUPS(w, r0, r1, int4_gemm_rows(4, w, xp, xpb, Y, ldy, r, t0, t1, &k), int4_gemm_rows(1, w, xp, xpb, Y, ldy, r, t0, t1, &k));
    }
}

/* Few-token INT4 step (gemv_few): per group of 4 tiled rows, the tokens in passes of up to 3 —
 * the first pass streams the rows from memory with the GEMV's prefetch, the others find them in L1
 * (4 rows of ≤ 16 KiB). The rest (rows before the first or past the last whole group, untiled
 * weights, groups over 128) through the GEMM's tiles, whose arithmetic per (row, token) is the same. */
static void gemv_few_int4(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0,
                          int64_t r1) {
    (void)X;
    const int64_t G = w->block;
    if (!w->tiled || G > 128 || i4q_form(w)) { /* (group 32: the 16-row kernel, 1–8 tokens per pass, or the row kernel) */
        gemm_int4(w, xp, xpb, n, Y, ldy, r0, r1);
        return;
    }
    int4_consts k;
    int4_setup(w, &k);
    uint16_t iw[32];
    __m512i sidx4[4];
    for (int j = 0; j < 4; j++) {
        for (int l = 0; l < 16; l++) iw[2 * l] = 31, iw[2 * l + 1] = (uint16_t)(j * k.u + (8 * l) / G);
        sidx4[j] = _mm512_loadu_si512(iw);
    }
    const int64_t g = pf_groups(w->row_bytes);
#define I4_FEW_PASS(t, nt, pfg)                                                                                                  \
    do {                                                                                                                         \
        const uint8_t *xt = xp + (size_t)(t) * xpb;                                                                              \
        float *yt = Y + (size_t)(t) * (size_t)ldy + r;                                                                           \
        if ((nt) == 3) int4_tile4(3, w, xt, xpb, yt, ldy, r, &k, sidx4, pfg);                                                    \
        else if ((nt) == 2) int4_tile4(2, w, xt, xpb, yt, ldy, r, &k, sidx4, pfg);                                               \
        else int4_tile4(1, w, xt, xpb, yt, ldy, r, &k, sidx4, pfg);                                                              \
    } while (0)
    FOR_ROW_GROUPS(w, r0, r1,
                   for (int t = 0; t < n; t += 3) I4_FEW_PASS(t, n - t < 3 ? n - t : 3, t == 0 ? PFG(r) : 0),
                   int4_gemm_rows(1, w, xp, xpb, Y, ldy, r, 0, n, &k));
#undef I4_FEW_PASS
}

/* Q8_0 / Q4_0: four rows as two pairs per 512-bit register (lanes 0–7 one row's block, 8–15 the
 * next row's), as q_rows4, × NT (1..6) tokens; each pair's weights and f16 scales are unpacked once
 * per NT tokens. Rows past the last group of 4 run q_row1 per token. */
AI void q_gemm_tile(int f, int NT, const kiln_weight *w, const uint8_t *xp, size_t xpb, float *Y, int64_t ldy, int64_t r) {
    const int64_t nb = w->cols / 32, bb = qb_bytes(f);
    const uint8_t *p0 = w->data + (size_t)r * w->row_bytes;
    const size_t rb = w->row_bytes;
    __m512 acc[2][6];
#pragma GCC unroll 6
    for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i wv[2];
        __m512 sc[2], mv[2];
#pragma GCC unroll 2
        for (int P = 0; P < 2; P++) {
            const uint8_t *ba = p0 + (size_t)(2 * P) * rb + bb * b, *bq = ba + rb;
            wv[P] = q_weights2(f, ba, bq);
            sc[P] = q_scales2(f, ba, bq, &mv[P]);
        }
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) {
            const uint8_t *xt = xp + (size_t)t * xpb;
            const __m512i xq = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(xt + 64 * b)));
            const __m512i st = qb_has_min(f) ? _mm512_setzero_si512() : _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)(xt + 64 * b + 32)));
            const __m512 dx = _mm512_set1_ps(((const float *)(xt + nb * 64))[b]);
#pragma GCC unroll 2
            for (int P = 0; P < 2; P++) {
                acc[P][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(st, wv[P], xq)), _mm512_mul_ps(sc[P], dx), acc[P][t]);
                if (qb_has_min(f)) acc[P][t] = _mm512_fmadd_ps(mv[P], _mm512_set1_ps(((const float *)(xt + nb * 72))[b]), acc[P][t]);
            }
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < NT; t++) {
        float *y = Y + (size_t)t * (size_t)ldy + (size_t)r;
        y[0] = _mm512_reduce_add_ps(_mm512_maskz_mov_ps(0x00FF, acc[0][t]));
        y[1] = _mm512_reduce_add_ps(_mm512_maskz_mov_ps(0xFF00, acc[0][t]));
        y[2] = _mm512_reduce_add_ps(_mm512_maskz_mov_ps(0x00FF, acc[1][t]));
        y[3] = _mm512_reduce_add_ps(_mm512_maskz_mov_ps(0xFF00, acc[1][t]));
    }
}
AI void gemm_q(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    const int tb = gemm_token_block(xpb, 6);
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) {
            int t = t0;
            for (; t + 6 <= t1; t += 6) q_gemm_tile(f, 6, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r);
            switch (t1 - t) {
            case 5: q_gemm_tile(f, 5, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r); break;
            case 4: q_gemm_tile(f, 4, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r); break;
            case 3: q_gemm_tile(f, 3, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r); break;
            case 2: q_gemm_tile(f, 2, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r); break;
            case 1: q_gemm_tile(f, 1, w, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy, r); break;
            default: break;
            }
        }
        for (; r < r1; r++)
            for (int t = t0; t < t1; t++) q_row1(f, w, xp + (size_t)t * xpb, Y + (size_t)t * (size_t)ldy + (size_t)r, r);
    }
}
/* INT4 group 32 rows in checkpoint layout on Q4_0's prepared activation (untiled weights, and the
 * rows past a KILN_TILE_Q16 weight's last whole group), in q16_tile's arithmetic per (row, token):
 * per block the exact int32 dot from the start value tot, one conversion, × (scale · dx), one FMA —
 * so an untiled weight (--no-repack, too few rows) gives the bits the 16-row layout gives. Four rows
 * at a time: each row's 16 bytes of the block in one 128-bit lane, low nibbles (even columns) and
 * high nibbles (odd columns) against the block's even and odd activations broadcast, the four lanes
 * of a row summed, the four rows' scale and FMA in one xmm. */
AI __m128i i4q_dot4(const uint8_t *p0, size_t rb, int64_t b, __m512i xe, __m512i xo) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const uint8_t *p = p0 + 16 * b;
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)(p + rb)), _mm_loadu_si128((const __m128i *)p))),
                                         _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(p + 3 * rb)), _mm_loadu_si128((const __m128i *)(p + 2 * rb))), 1);
    const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xe), hi, xo);
    d = _mm512_add_epi32(d, _mm512_shuffle_epi32(d, _MM_PERM_BADC));
    d = _mm512_add_epi32(d, _mm512_shuffle_epi32(d, _MM_PERM_CDAB));
    return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), d));
}
/* The block's 32 prepared activations split into even and odd columns, each broadcast to 4 lanes. */
AI void i4q_x(const uint8_t *x, int64_t b, __m512i *xe, __m512i *xo) {
    const __m256i idx = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i sh = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(_mm256_load_si256((const __m256i *)(x + 64 * b)), idx), 0xD8);
    *xe = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sh));
    *xo = _mm512_broadcast_i32x4(_mm256_extracti128_si256(sh, 1));
}
static void i4q_rows(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t nb = w->cols / 32;
    const uint16_t *S = (const uint16_t *)w->scales;
    for (int64_t r = r0; r < r1;) {
        /* four rows, or the last ones one at a time: then all four lanes read the same row (row and
         * scale strides 0) and lane 0 is kept — the same per-lane operations either way */
        const int four = r + 4 <= r1;
        const size_t rb = four ? w->row_bytes : 0, ss = four ? (size_t)nb : 0;
        const uint8_t *p0 = w->data + (size_t)r * w->row_bytes;
        const uint16_t *s0 = S + (size_t)r * (size_t)nb;
        for (int t = 0; t < n; t++) {
            const uint8_t *x = xp + (size_t)t * xpb;
            const float *dx = (const float *)(x + nb * 64);
            const int32_t *tot = (const int32_t *)(dx + nb);
            __m128 acc = _mm_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                __m512i xe, xo;
                i4q_x(x, b, &xe, &xo);
                const __m128i is = _mm_add_epi32(i4q_dot4(p0, rb, b, xe, xo), _mm_set1_epi32(tot[b]));
                const __m128 ws = _mm_castsi128_ps(_mm_slli_epi32(_mm_setr_epi32(s0[b], s0[ss + (size_t)b], s0[2 * ss + (size_t)b], s0[3 * ss + (size_t)b]), 16));
                acc = _mm_fmadd_ps(_mm_cvtepi32_ps(is), _mm_mul_ps(ws, _mm_set1_ps(dx[b])), acc);
            }
            float *y = Y + (size_t)t * (size_t)ldy + (size_t)r;
            if (four) _mm_storeu_ps(y, acc);
            else _mm_store_ss(y, acc);
        }
        r += four ? 4 : 1;
    }
}
AI void q_rest(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t yoff, int64_t r0, int64_t r1) {
    if (f == KILN_WF_INT4_GROUP) {
        i4q_rows(w, xp, xpb, xpb ? n : 1, Y - yoff, ldy, r0, r1);
        return;
    }
    if (xpb == 0) gemv_q(f, w, xp, Y + (r0 - yoff), r0, r1); /* GEMV: one token, y[r - yoff] */
    else gemm_q(f, w, xp, xpb, n, Y - yoff, ldy, r0, r1);
}
static void gemm_q8(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->tiled) q16_rows(KILN_WF_Q8_0, w, xp, xpb, n, Y, ldy, 0, r0, r1);
    else gemm_q(KILN_WF_Q8_0, w, xp, xpb, n, Y, ldy, r0, r1);
}
static void gemm_q4(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->tiled) q16_rows(KILN_WF_Q4_0, w, xp, xpb, n, Y, ldy, 0, r0, r1);
    else gemm_q(KILN_WF_Q4_0, w, xp, xpb, n, Y, ldy, r0, r1);
}
/* ---- FP8 weights in a prompt's GEMM on Q8_0's int8 kernels (issue 20) ------------------------------
 * The BF16 route (vdpbf16ps) peaks at half the int8 dot rate (770 GFLOP/s against 1,626 GOPS on the
 * Zen 5 VM, docs/BENCHMARKS.md), so gemv.c's fp8_q8_tables take a prompt's FP8 GEMMs here: each
 * block of rows becomes, once per call, Q8_0 blocks in the 16-row interleave — per row and 32
 * columns fp8 × scale in f32 (dequant_fp8's floats, rounded once), then ggml's Q8_0 rule as quant32 applies it to
 * activations (d = amax / 127, q = round(v / d), d stored as f16) — which gemm_q8 multiplies with
 * Q8_0-prepared activations. The error added is Q8_0's: an NMSE of ~3e-5 for the weights (the E4M3
 * values themselves are within ~1e-3 of the originals) and the same for the activations (the BF16
 * route's rounding ~5e-6). Rows of whole 16-row groups go in the interleave, the rest as plain Q8_0
 * rows: kiln_weight_tile's layout for a Q8_0 weight of r1 − r0 rows (test_gemv checks it byte for
 * byte). tile: cols floats of scratch. */
/* The row's block b of 32 values, w = (fp8/256) × (scale·256) rounded once: dequant_fp8's floats. */
AI void fp8_q8_block_ps(const uint8_t *p, float scale, __m512 *lo, __m512 *hi) {
    const __m512 s256 = _mm512_set1_ps(scale * 256.0f);
    *lo = _mm512_mul_ps(fp8_half_to_ps(_mm_loadu_si128((const __m128i *)p)), s256);
    *hi = _mm512_mul_ps(fp8_half_to_ps(_mm_loadu_si128((const __m128i *)(p + 16))), s256);
}
void kiln_fp8_q8_avx512(const kiln_weight *w, int64_t r0, int64_t r1, float *tile, uint8_t *out) {
    const int64_t cols = w->cols, nb = cols / 32, nr = r1 - r0, grouped = nr / 16 * 16, B = w->block, sc_cols = (cols + B - 1) / B;
    const size_t rb = (size_t)nb * 34, wrb = w->row_bytes, full = wrb / 64;
    const float *S = (const float *)w->scales;
    /* per block of the row: amax, d, 1 / d (3·nb ≤ cols floats of tile) — the divisions 16 blocks at
     * a time instead of two dependent scalar ones per block (they were the function's critical path:
     * perf put ~35% of its samples on the division chain and the f16 conversion waiting for it) */
    float *amx = tile, *dv = tile + nb, *idv = tile + 2 * nb;
    for (int64_t r = 0; r < nr; r++) {
        const int64_t wr = r0 + r;
        /* the row's 32-byte pieces where they lie (row_at: checkpoint rows, or the 4-row tiles' 64-byte
         * chunks, the last rows % 4 rows and each row's row_bytes % 64 tail in checkpoint order) */
        const row_loc loc = row_at(w, wr);
        const float *srow = S + (wr / B) * sc_cols;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = row_piece32(&loc, full, b);
            /* the same bytes of the row 4 on (both layouts: 4 × row_bytes further), a line per 64 bytes:
             * the rows come from memory (measured: the first load of each block took half of this
             * function's time without it) */
            if (!(b & 1) && wr + 4 < w->rows) _mm_prefetch((const char *)(p + 4 * wrb), _MM_HINT_T0);
            __m512 lo, hi;
            fp8_q8_block_ps(p, srow[(32 * b) / B], &lo, &hi);
            amx[b] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        }
        /* ggml's quantize_row_q8_0 in f32: d = amax / 127, 1 / d (0 where d is 0) */
        for (int64_t b0 = 0; b0 < nb; b0 += 16) {
            const __mmask16 m = nb - b0 >= 16 ? (__mmask16)0xFFFF : mask16(nb - b0);
            const __m512 d = _mm512_div_ps(_mm512_maskz_loadu_ps(m, amx + b0), _mm512_set1_ps(127.0f));
            const __mmask16 nz = _mm512_mask_cmp_ps_mask(m, d, _mm512_setzero_ps(), _CMP_GT_OQ);
            _mm512_mask_storeu_ps(dv + b0, m, d);
            _mm512_mask_storeu_ps(idv + b0, m, _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d));
        }
        for (int64_t b = 0; b < nb; b++) {
            __m512 lo, hi; /* the same floats again, from L1: q = round(w · (1 / d)) (ties to even) */
            fp8_q8_block_ps(row_piece32(&loc, full, b), srow[(32 * b) / B], &lo, &hi);
            const __m512 vid = _mm512_set1_ps(idv[b]);
            const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, vid)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, vid));
            const __m256i q = _mm256_set_m128i(_mm512_cvtepi32_epi8(qhi), _mm512_cvtepi32_epi8(qlo));
            uint8_t qs[32];
            _mm256_storeu_si256((__m256i *)qs, q);
            kiln_q8_block_put(out, r, grouped, b, rb, (uint16_t)_cvtss_sh(dv[b], _MM_FROUND_TO_NEAREST_INT), qs);
        }
    }
}

/* The other blocks of 32 stay in checkpoint layout (owned copies on huge pages: tile.c). */
#define Q_ENTRIES(F, fmt)                                                                                                          \
    static void gemv_##F(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {                 \
        (void)x;                                                                                                                   \
        gemv_q(fmt, w, xp, y, r0, r1);                                                                                             \
    }                                                                                                                              \
    static void gemm_##F(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) { \
        gemm_q(fmt, w, xp, xpb, n, Y, ldy, r0, r1);                                                                                \
    }
Q_ENTRIES(q5_0, KILN_WF_Q5_0)
Q_ENTRIES(q4_1, KILN_WF_Q4_1)
Q_ENTRIES(q5_1, KILN_WF_Q5_1)
Q_ENTRIES(iq4nl, KILN_WF_IQ4_NL)
#undef Q_ENTRIES


/* ---- BF16-dot GEMM (prefill, batched decode): BF16 weights as stored, FP8 weights through bf16 tiles
 * Only in kiln_ktable_avx512_bf16 (CPUs with AVX512_BF16, the backend's FP8 form not "exact"): the
 * activation rows are rounded to bf16 once (as the FP8 decode GEMV of this table does) and vdpbf16ps
 * multiplies 32 pairs per instruction, twice the f32 FMA rate. FP8 weights are converted a row block
 * at a time into a bf16 tile of fp8 × scale (rounded once, to bf16: a relative error ≤ 2^-8 like the
 * activation's) that the same kernel reads; the exact table keeps the f32 tiles. */
static size_t xprep_bytes_bf16row(const kiln_weight *w) { return (size_t)((w->cols + 31) / 32) * 64; }
/* x[cols] → bf16 (RNE), zero-padded to a multiple of 32 values. */
static void xprep_bf16row(const kiln_weight *w, const float *x, void *xp) {
    const int64_t cols = w->cols;
    uint8_t *o = (uint8_t *)xp;
    for (int64_t c = 0; c < cols; c += 32, o += 64) {
        const int64_t n = cols - c;
        const __m512 a = n >= 16 ? _mm512_loadu_ps(x + c) : _mm512_maskz_loadu_ps(mask16(n), x + c);
        const __m512 b = n >= 32 ? _mm512_loadu_ps(x + c + 16) : n > 16 ? _mm512_maskz_loadu_ps(mask16(n - 16), x + c + 16) : _mm512_setzero_ps();
        _mm512_storeu_si512(o, (__m512i)_mm512_cvtne2ps_pbh(b, a)); /* words 0..15 from a, 16..31 from b */
    }
}

/* NR rows of W (bf16, row j at W + j·ldw) × NT tokens of X (bf16 rows ldx apart, zero-padded to 32):
 * Y[t·ldy + j] = Σ_c W[j][c]·X[t][c]. The weight tail past cols is masked off (the next row's bytes
 * may be NaN patterns; 0 × NaN would poison the sum). */
AI void bf16_gemm_tile(int NR, int NT, const uint16_t *W, int64_t ldw, const uint16_t *X, int64_t ldx, int64_t cols, float *Y, int64_t ldy) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[j][t] = _mm512_setzero_ps();
    const int64_t c32 = cols & ~(int64_t)31;
    for (int64_t c = 0; c < c32; c += 32) {
        __m512i wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = _mm512_loadu_si512(W + (size_t)j * (size_t)ldw + c);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(X + (size_t)t * (size_t)ldx + c);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[j][t] = _mm512_dpbf16_ps(acc[j][t], (__m512bh)wv[j], xv);
        }
    }
    if (c32 < cols) {
        const __mmask32 m = (__mmask32)((1ull << (cols - c32)) - 1);
        __m512i wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) wv[j] = _mm512_maskz_loadu_epi16(m, W + (size_t)j * (size_t)ldw + c32);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(X + (size_t)t * (size_t)ldx + c32);
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) acc[j][t] = _mm512_dpbf16_ps(acc[j][t], (__m512bh)wv[j], xv);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++) Y[(size_t)t * (size_t)ldy + (size_t)j] = _mm512_reduce_add_ps(acc[j][t]);
}
AI void bf16_gemm_rows(int NR, const uint16_t *W, int64_t ldw, const uint16_t *X, int64_t ldx, int t0, int t1, int64_t cols, float *Y, int64_t ldy) {
    int t = t0;
    for (; t + 4 <= t1; t += 4) bf16_gemm_tile(NR, 4, W, ldw, X + (size_t)t * (size_t)ldx, ldx, cols, Y + (size_t)t * (size_t)ldy, ldy);
    switch (t1 - t) {
    case 3: bf16_gemm_tile(NR, 3, W, ldw, X + (size_t)t * (size_t)ldx, ldx, cols, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 2: bf16_gemm_tile(NR, 2, W, ldw, X + (size_t)t * (size_t)ldx, ldx, cols, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 1: bf16_gemm_tile(NR, 1, W, ldw, X + (size_t)t * (size_t)ldx, ldx, cols, Y + (size_t)t * (size_t)ldy, ldy); break;
    default: break;
    }
}
/* nr rows of bf16 W × tokens [t0, t1) of X into Y (row j of the block → column j of Y). */
static void bf16_gemm_block(const uint16_t *W, int64_t ldw, int64_t nr, const uint16_t *X, int64_t ldx, int t0, int t1, int64_t cols,
                            float *Y, int64_t ldy) {
    int64_t j = 0;
    for (; j + 4 <= nr; j += 4) bf16_gemm_rows(4, W + (size_t)j * (size_t)ldw, ldw, X, ldx, t0, t1, cols, Y + j, ldy);
    for (; j < nr; j++) bf16_gemm_rows(1, W + (size_t)j * (size_t)ldw, ldw, X, ldx, t0, t1, cols, Y + j, ldy);
}

/* The table's gemm_bf16: nr rows of bf16 W × the n bf16 rows of X, over token blocks whose rows fit
 * in L2 (four weight rows stay in L1 across a block). */
static void gemm_bf16(const uint16_t *W, int64_t ldw, int nr, const uint16_t *X, int64_t ldx, int n, int64_t cols, float *Y, int64_t ldy) {
    const int tb = gemm_token_block((size_t)ldx * 2, 4);
    for (int t0 = 0; t0 < n; t0 += tb) bf16_gemm_block(W, ldw, nr, X, ldx, t0, t0 + tb < n ? t0 + tb : n, cols, Y, ldy);
}

/* FP8 rows [r0, r1) → bf16 tile rows of fp8 × scale (rounded once, RNE), zero-padded to ld. */
static void dequant_bf16t_fp8(const kiln_weight *w, int64_t r0, int64_t r1, uint16_t *out, int64_t ld) {
    dequant_fp8_rows(w, r0, r1, out, ld, 1);
}

/* The compute peak loop (gemv_isa.h: peak): 12 independent accumulators, so the loop runs at the
 * instruction's throughput, not its latency; the operands change every iteration so nothing folds. */
static double peak(int kind, int64_t iters) {
    __m512 f[12];
    __m512i q[12];
    for (int i = 0; i < 12; i++) { f[i] = _mm512_set1_ps((float)i * 1e-3f); q[i] = _mm512_set1_epi32(i); }
    __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
    __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2);
    double per = 0;
    if (kind == KILN_PEAK_F32) {
        for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++) f[i] = _mm512_fmadd_ps(f[i], a, b);
            __asm__ volatile("" : "+v"(a), "+v"(b));
        }
        per = 12.0 * 16;
    } else if (kind == KILN_PEAK_INT8) {
        for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++) q[i] = _mm512_dpbusd_epi32(q[i], u, v);
            __asm__ volatile("" : "+v"(u), "+v"(v));
        }
        per = 12.0 * 64;
    } else if (kind == KILN_PEAK_BF16) {
        const __m512bh x = _mm512_cvtne2ps_pbh(a, b);
        __m512bh y = x;
        for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++) f[i] = _mm512_dpbf16_ps(f[i], x, y);
            __asm__ volatile("" : "+v"(y));
        }
        per = 12.0 * 32;
    }
    float sink = 0;
    for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_ps(f[i]) + (float)_mm512_reduce_add_epi32(q[i]);
    __asm__ volatile("" : : "x"(sink));
    return per * (double)iters;
}

static uint64_t read_sum(const void *p, size_t bytes) {
    const uint8_t *b = (const uint8_t *)p;
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < bytes; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512(b + i));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512(b + i + 64));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512(b + i + 128));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512(b + i + 192));
    }
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (uint64_t)_mm512_reduce_or_epi64(a0); /* a sink: or, not add (a signed scalar add could overflow) */
}

/* ---- SwiGLU activation ---------------------------------------------------------------------------- */
/* glibc's libmvec AVX-512 expf (the vector variant GCC calls for `#pragma omp simd` loops; ≤ 4 ulp,
 * like scalar expf's ≤ 1 ulp well inside any check): the scalar loop cost ~14 µs per bench-500m
 * layer (5,632 expf calls), a visible share of a 5 ms decode step. */
__m512 _ZGVeN16v_expf(__m512 x);
static void silu_mul(float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
    if (i < n) {
        const __mmask16 m = mask16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* Maximum ignoring NaN (vmaxps returns its second operand when either is NaN: the running max is
 * passed second, so a NaN element never replaces it). */
static float max_f32(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + i), m);
    if (i < n) m = _mm512_mask_max_ps(m, mask16(n - i), _mm512_maskz_loadu_ps(mask16(n - i), x + i), m);
    return _mm512_reduce_max_ps(m);
}

/* One table per FP8 form (see gemv_fp8_impl); everything else is shared. */
/* ---- GGUF K-quants (Q4_K, Q5_K, Q6_K): int8 dots on activations quantized per super-block ---------
 * The activation is quantized per super-block of 256 columns (kiln_quant_x256: one f32 scale, int8
 * values; per-16-column sums of the int8 values for the formats' offsets), as llama.cpp's q8_K
 * does; a super-block's integer dot is exact, so a row's result differs from the f32 reference only
 * by that rounding of x. Prepared record per super-block (KQ_REC = 320 bytes, 64-aligned):
 *   q[256] int8   Q6_K: columns in order; Q4_K / Q5_K: in the order of the 64-byte chunks below
 *                 (sub-blocks of 32: 0,2 | 1,3 | 4,6 | 5,7), so one 64-byte load of packed nibbles
 *                 meets its columns: bytes 0-63 of the nibbles hold sub-blocks 0 (low nibbles of
 *                 0-31), 1 (high of 0-31), 2 (low of 32-63), 3 (high of 32-63);
 *   bs[16] int16  Σ q over columns 16i..16i+15 (natural order);
 *   dx f32        the super-block's activation scale.
 * Per super-block and row, four 64-column chunks k: p_k = vpdpbusd(0, unsigned weights, x_q) — each
 * int32 lane the dot of 4 columns, |p| ≤ 4·63·127 = 32004, so it is exact in the lane's low 16 bits
 * — then isum = vpdpwssd(isum, p_k, S_k) with S_k the lane's sub-block scale in the low 16 bits
 * (high 16 zero): isum lanes = Σ sc · dot, exact int32 (|isum| ≤ 4·32004·128 < 2^24).
 *   Q4_K / Q5_K: y += (d·dx)·Σ isum − (dmin·dx)·Σ_j m_j·(bs_2j + bs_2j+1)  (mins: one vpmaddwd of the
 *                bs with the mins each repeated twice, 8 int32 lanes);
 *   Q6_K:        weights stored as q + 32 (0..63): isum −= 32·Σ_j sc_j·bs_j (one vpmaddwd), then
 *                y += (d·dx)·Σ isum.
 * The f32 accumulators (16 lanes; 8 for the mins) are summed at the end of the row. GEMV and GEMM
 * are one kernel (kq_tile: NT tokens share each row's unpacked weights), so a token's result does not
 * depend on the batch it is computed in. Rows are read one after the other — in checkpoint layout a
 * K-quant weight is then one sequential stream — with software prefetch PF_BYTES ahead. */
#define KQ_REC 320
static size_t xprep_bytes_kq(const kiln_weight *w) { return (size_t)(w->cols / 256) * KQ_REC; }
/* (where each 16-column group goes in the record: kq_pos, kernels/k16_quants.h) */
AI void xprep_kq_impl(const kiln_weight *w, const float *x, void *xp, int perm) {
    const int64_t nsb = w->cols / 256;
    for (int64_t sb = 0; sb < nsb; sb++) {
        const float *xs = x + 256 * sb;
        uint8_t *o = (uint8_t *)xp + sb * KQ_REC;
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < 16; i++) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xs + 16 * i)));
        const float amax = _mm512_reduce_max_ps(m);
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
        int16_t *bs = (int16_t *)(o + 256);
        for (int i = 0; i < 16; i++) { /* columns 16i..16i+15 */
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 16 * i), vid)); /* RNE */
            q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
            bs[i] = (int16_t)_mm512_reduce_add_epi32(q);
            _mm_storeu_si128((__m128i *)(o + kq_pos(perm, i)), _mm512_cvtepi32_epi8(q));
        }
        memcpy(o + 288, &d, 4);
    }
}
static void xprep_kq45(const kiln_weight *w, const float *x, void *xp) { xprep_kq_impl(w, x, xp, KQ_PERM45); }
static void xprep_kq6(const kiln_weight *w, const float *x, void *xp) { xprep_kq_impl(w, x, xp, KQ_NATURAL); }
static void xprep_kq2(const kiln_weight *w, const float *x, void *xp) { xprep_kq_impl(w, x, xp, KQ_PERM2); }
static void xprep_kqxs(const kiln_weight *w, const float *x, void *xp) { xprep_kq_impl(w, x, xp, KQ_PERMXS); }

/* Q4_K / Q5_K: sub-block j's 6-bit scale (byte j of *sc) and min (byte j of *mn) from the 12 packed
 * bytes (kiln_kq_scale_min for all 8 at once: bytes 0-3 hold scales 0-3 and the top 2 bits of scales
 * 4-7, bytes 4-7 mins 0-3 and the top bits of mins 4-7, bytes 8-11 the low 4 bits of scales 4-7
 * (low nibbles) and mins 4-7 (high nibbles)). */
AI void kq_scales8(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t sl = u0 & 0x3F3F3F3Fu, ml = u1 & 0x3F3F3F3Fu;
    const uint32_t sh = (u2 & 0x0F0F0F0Fu) | ((u0 >> 2) & 0x30303030u), mh = ((u2 >> 4) & 0x0F0F0F0Fu) | ((u1 >> 2) & 0x30303030u);
    *sc = sl | (uint64_t)sh << 32;
    *mn = ml | (uint64_t)mh << 32;
}
/* One row's super-block, unpacked: 4 weight chunks (u8), their lane scales, d (and dmin), and the
 * 16 int16 the activation sums are multiplied with (Q4_K/Q5_K: mins repeated twice; Q6_K: scales). */
typedef struct { __m512i wv[4], S[4]; __m256i mb; float d, dmin; } kq_sb;
AI void kq_unpack(int f, const uint8_t *p, kq_sb *u) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (f == KILN_WF_Q6_K) { /* ql[128] | qh[64] | sc[16] int8 | d f16 */
        const __m512i m30 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* weights 128h + 0..63 (low nibbles) and 128h + 64..127 (high) */
            const __m512i v = _mm512_loadu_si512(p + 64 * h);
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
            /* qh bits 0-1 → weights l, 2-3 → 32 + l, 4-5 → 64 + l, 6-7 → 96 + l (l < 32) */
            const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
            u->wv[2 * h] = _mm512_ternarylogic_epi32(v, m4, _mm512_and_si512(_mm512_slli_epi16(z, 4), m30), 0xEA);
            u->wv[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m4, _mm512_and_si512(z, m30), 0xEA);
        }
        const __m128i sc = _mm_loadu_si128((const __m128i *)(p + 192));
        const __m512i s32 = _mm512_and_si512(_mm512_cvtepi8_epi32(sc), _mm512_set1_epi32(0xFFFF));
        const __m512i i0 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), four = _mm512_set1_epi32(4);
        u->S[0] = _mm512_permutexvar_epi32(i0, s32);
        u->S[1] = _mm512_permutexvar_epi32(_mm512_add_epi32(i0, four), s32);
        u->S[2] = _mm512_permutexvar_epi32(_mm512_add_epi32(i0, _mm512_add_epi32(four, four)), s32);
        u->S[3] = _mm512_permutexvar_epi32(_mm512_add_epi32(i0, _mm512_set1_epi32(12)), s32);
        u->mb = _mm256_cvtepi8_epi16(sc);
        uint16_t h;
        memcpy(&h, p + 208, 2);
        u->d = _cvtsh_ss(h);
        u->dmin = 0.0f;
        return;
    }
    if (f == KILN_WF_Q2_K || f == KILN_WF_Q3_K) {
        /* Q2_K: sc[16] (scale | min << 4) | qs[64] | d | dmin;  Q3_K: hmask[32] | qs[64] | scales[12] | d.
         * Chunk k (KQ_PERM2) = bits 2k, 2k + 1 of the 64 quant bytes; lanes 0-3 / 4-7 / 8-11 / 12-15
         * are 16-column groups 2k, 2k + 1, 8 + 2k, 9 + 2k. */
        const int q3 = f == KILN_WF_Q3_K;
        const __m512i v = _mm512_loadu_si512(p + (q3 ? 32 : 16)), m3 = _mm512_set1_epi8(3);
        __m128i sc16;
        if (q3) {
            uint64_t lo, hi;
            kiln_q3k_scales16(p + 96, &lo, &hi);
            sc16 = _mm_set_epi64x((long long)hi, (long long)lo);
            /* the high bit of sub-block j's weight l is bit j of hmask[l]: halves with bits k, 4 + k */
            const __m256i hm = _mm256_loadu_si256((const __m256i *)p);
            const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(hm), _mm256_srli_epi16(hm, 4), 1), b2 = _mm512_set1_epi8(4);
            /* unsigned weights q + 4 = low 2 bits | high bit << 2 (0..7) */
            u->wv[0] = _mm512_ternarylogic_epi32(v, m3, _mm512_and_si512(_mm512_slli_epi16(z, 2), b2), 0xEA);
            u->wv[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 2), m3, _mm512_and_si512(_mm512_slli_epi16(z, 1), b2), 0xEA);
            u->wv[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m3, _mm512_and_si512(z, b2), 0xEA);
            u->wv[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 6), m3, _mm512_and_si512(_mm512_srli_epi16(z, 1), b2), 0xEA);
            u->mb = _mm256_cvtepi8_epi16(sc16);
            uint16_t h;
            memcpy(&h, p + 108, 2);
            u->d = _cvtsh_ss(h);
            u->dmin = 0.0f;
        } else {
            const __m128i raw = _mm_loadu_si128((const __m128i *)p), n4 = _mm_set1_epi8(0x0F);
            sc16 = _mm_and_si128(raw, n4);
            u->mb = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), n4));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) u->wv[k] = _mm512_and_si512(k ? _mm512_srli_epi16(v, 2 * k) : v, m3);
            const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int32_t *)(p + 80))); /* d, dmin */
            u->d = _mm_cvtss_f32(dd);
            u->dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
        }
        const __m512i s32 = _mm512_and_si512(_mm512_cvtepi8_epi32(sc16), _mm512_set1_epi32(0xFFFF));
        const __m512i i0 = _mm512_set_epi32(9, 9, 9, 9, 8, 8, 8, 8, 1, 1, 1, 1, 0, 0, 0, 0), two = _mm512_set1_epi32(2);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) u->S[k] = _mm512_permutexvar_epi32(_mm512_add_epi32(i0, _mm512_mullo_epi32(two, _mm512_set1_epi32(k))), s32);
        return;
    }
    if (f == KILN_WF_IQ4_XS) {
        /* d | scales_h u16 | scales_l[4] | qs[128]: chunks (KQ_PERMXS) 2h + s = nibble s of qs[64h..]
         * looked up as level + 128; S[h] lane l = sub-block 4h + l / 4's scale (int32, signed);
         * mb = the scale of each natural 16-column group (sub-block i / 2) for the −128 correction. */
        const __m512i lut = iq4_lut(), m4b = _mm512_set1_epi8(0x0F);
        const __m512i v0 = _mm512_loadu_si512(p + 8), v1 = _mm512_loadu_si512(p + 72);
        u->wv[0] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v0, m4b));
        u->wv[1] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4b));
        u->wv[2] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v1, m4b));
        u->wv[3] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4b));
        const __m128i sc8 = _mm_cvtsi64_si128((long long)kiln_iq4xs_scales8(p + 2));
        const __m512i s32 = _mm512_cvtepi8_epi32(sc8);
        u->S[0] = _mm512_permutexvar_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), s32);
        u->S[1] = _mm512_permutexvar_epi32(_mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4), s32);
        u->mb = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc8, sc8));
        uint16_t h;
        memcpy(&h, p, 2);
        u->d = _cvtsh_ss(h);
        u->dmin = 0.0f;
        return;
    }
    /* Q4_K: d, dmin f16 | scales[12] | ql[128]; Q5_K: ... | qh[32] | ql[128] */
    const uint8_t *ql = p + (f == KILN_WF_Q5_K ? 48 : 16);
    const __m512i v0 = _mm512_loadu_si512(ql), v1 = _mm512_loadu_si512(ql + 64);
    if (f == KILN_WF_Q5_K) { /* bit j of qh[l] is the fifth bit of sub-block j's weight l */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1); /* halves: bits j, j + 2 */
        const __m512i b4 = _mm512_set1_epi8(0x10);
        u->wv[0] = _mm512_ternarylogic_epi32(v0, m4, _mm512_and_si512(_mm512_slli_epi16(z, 4), b4), 0xEA); /* sub-blocks 0 | 2 */
        u->wv[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v0, 4), m4, _mm512_and_si512(_mm512_slli_epi16(z, 3), b4), 0xEA); /* 1 | 3 */
        u->wv[2] = _mm512_ternarylogic_epi32(v1, m4, _mm512_and_si512(z, b4), 0xEA);                               /* 4 | 6 */
        u->wv[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v1, 4), m4, _mm512_and_si512(_mm512_srli_epi16(z, 1), b4), 0xEA); /* 5 | 7 */
    } else {
        u->wv[0] = _mm512_and_si512(v0, m4);
        u->wv[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
        u->wv[2] = _mm512_and_si512(v1, m4);
        u->wv[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
    }
    uint64_t sc, mn;
    kq_scales8(p + 4, &sc, &mn);
    const __m512i s32 = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc));
    u->S[0] = _mm512_permutexvar_epi32(_mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0), s32);
    u->S[1] = _mm512_permutexvar_epi32(_mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1), s32);
    u->S[2] = _mm512_permutexvar_epi32(_mm512_set_epi32(6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4), s32);
    u->S[3] = _mm512_permutexvar_epi32(_mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5, 5, 5), s32);
    const __m128i mv = _mm_cvtsi64_si128((long long)mn);
    u->mb = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int32_t *)p)); /* d, dmin */
    u->d = _mm_cvtss_f32(dd);
    u->dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
}
/* The formats whose weights carry a min (Q4_K, Q5_K, Q2_K: w = d·sc·q − dmin·m), and those stored
 * as unsigned q + 2^shift (Q6_K: 32, Q3_K: 4, IQ4_XS: levels + 128), 0 for the others. */
AI int kq_has_min(int f) { return f == KILN_WF_Q4_K || f == KILN_WF_Q5_K || f == KILN_WF_Q2_K; }
AI int kq_offset_shift(int f) { return f == KILN_WF_Q6_K ? 5 : f == KILN_WF_Q3_K ? 2 : f == KILN_WF_IQ4_XS ? 7 : 0; }
/* One row × NT tokens (xp + t·xpb): Y[t·ldy] = the row's dot with token t. */
AI void kq_tile(int f, int NT, const uint8_t *p, int64_t nsb, size_t bsb, const uint8_t *xp, size_t xpb, float *Y, size_t ldy) {
    __m512 acc[4];
    __m256 accm[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) { acc[t] = _mm512_setzero_ps(); accm[t] = _mm256_setzero_ps(); }
    for (int64_t sb = 0; sb < nsb; sb++, p += bsb) {
        if (NT == 1)
            for (size_t l = 0; l < bsb; l += 64) PFH(p + PF_BYTES + l);
        kq_sb u;
        kq_unpack(f, p, &u);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const uint8_t *o = xp + (size_t)t * xpb + (size_t)sb * KQ_REC;
            __m512i isum = _mm512_setzero_si512();
            if (f == KILN_WF_IQ4_XS) { /* lanes up to 8·241·127: scaled by vpmulld, not the 16-bit vpdpwssd */
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m512i pd = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u.wv[2 * h], _mm512_load_si512(o + 128 * h)),
                                                           u.wv[2 * h + 1], _mm512_load_si512(o + 128 * h + 64));
                    isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(pd, u.S[h]));
                }
            } else {
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++)
                    isum = _mm512_dpwssd_epi32(isum, _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.wv[k], _mm512_load_si512(o + 64 * k)), u.S[k]);
            }
            const __m256i bm = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(o + 256)), u.mb);
            float dx;
            memcpy(&dx, o + 288, 4);
            if (kq_offset_shift(f)) { /* unsigned weights q + 2^shift: isum −= 2^shift · Σ_g sc_g · bs_g */
                isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_sll_epi32(bm, _mm_cvtsi32_si128(kq_offset_shift(f)))));
            } else {
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bm), _mm256_set1_ps(u.dmin * dx), accm[t]);
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(u.d * dx), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        float y = _mm512_reduce_add_ps(acc[t]);
        if (kq_has_min(f)) {
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(accm[t]), _mm256_extractf128_ps(accm[t], 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            y -= _mm_cvtss_f32(s);
        }
        Y[(size_t)t * ldy] = y;
    }
}
AI size_t kq_block_bytes(int f) { return kiln_wf_block_bytes((kiln_wformat)f); }
/* Rows [r0, r1) × tokens [0, n): tokens in blocks whose prepared rows fit in L2 (GEMM_X_BYTES), each
 * row against the block in tiles of 4 tokens (its weights stay in L1 meanwhile). */
AI void kq_rows(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t nsb = w->cols / 256;
    const size_t bsb = kq_block_bytes(f);
    if (n == 1) {
        for (int64_t r = r0; r < r1; r++) kq_tile(f, 1, w->data + (size_t)r * w->row_bytes, nsb, bsb, xp, 0, Y + (r - r0), 0);
        return;
    }
    const int tb = gemm_token_block(xpb, 4);
    for (int t0 = 0; t0 < n; t0 += tb) {
        const int t1 = t0 + tb < n ? t0 + tb : n;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *p = w->data + (size_t)r * w->row_bytes;
            int t = t0;
            for (; t + 4 <= t1; t += 4) kq_tile(f, 4, p, nsb, bsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, (size_t)ldy);
            switch (t1 - t) {
            case 3: kq_tile(f, 3, p, nsb, bsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, (size_t)ldy); break;
            case 2: kq_tile(f, 2, p, nsb, bsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, (size_t)ldy); break;
            case 1: kq_tile(f, 1, p, nsb, bsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy + r, (size_t)ldy); break;
            default: break;
            }
        }
    }
}
/* ---- Q4_K / Q5_K / Q6_K in the 16-row super-block interleave (tiled = 1; tile.c, gemv.h) -----------
 * A register holds 16 rows: per super-block, each 64-byte quant vector is 4 bytes of each of the 16
 * rows, which meet one token's 4 activation bytes broadcast in a vpdpbusd; the int32 lanes are rows.
 * Per (16 rows, token, super-block):
 *   Q4_K / Q5_K: per sub-block j of 32 columns, 8 vpdpbusd (16 for the two nibbles of a 64-column
 *     pair) sum the rows' exact dots p_j (≤ 32·31·127), isum += p_j · sc_j (vpmulld: the 16 rows'
 *     6-bit scales); mins mi = Σ_j m_j · (bs_2j + bs_2j+1) by vpdpwssd of the rows' mins (both int16
 *     halves) with the activation's pair of 16-column sums; y += (d·dx)·isum − (dmin·dx)·mi;
 *   Q6_K: per 16-column group g, 4 vpdpbusd of the stored q + 32 (0..63), isum += p_g · sc_g, and
 *     isum += Σ_k (−32·sc_2k, −32·sc_2k+1) · (bs_2k, bs_2k+1) (vpdpwssd) removes the +32; y += (d·dx)·isum.
 * Integer sums are exact, so the order of the dots within a super-block is free (GEMV: two chains per
 * sub-block so that vpdpbusd's latency does not serialize it). GEMV (NT = 1) and GEMM (NT ≤ 4 tokens
 * sharing each unpacked vector) compute exactly this per (row, token), and the rows past the last
 * whole group (rows % 16, checkpoint layout) go through kq_tile in both: a token's result does not
 * depend on the batch. The row kernel's activation record serves as it is (Q4_K / Q5_K sub-blocks at
 * kq_pos's places: the broadcasts read 4 bytes of one sub-block at a time). */
AI int k16_xcol(int f, int c) { /* byte offset of column c's activation byte (c % 4 = 0: 4 in a row) */
    const int perm = f == KILN_WF_Q6_K ? KQ_NATURAL : f == KILN_WF_Q4_K || f == KILN_WF_Q5_K ? KQ_PERM45
                     : f == KILN_WF_IQ4_XS ? KQ_PERMXS : KQ_PERM2;
    return kq_pos(perm, c / 16) + c % 16;
}
AI __m512i bcast4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
#define K16_NT 4
AI void k16_tile(int f, int NT, const uint8_t *g, int64_t nsb, const uint8_t *xp, size_t xpb, float *Y, int64_t ldy) {
    const size_t gsb = 16 * kq_block_bytes(f);
    __m512 acc[K16_NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *s = g + (size_t)sb * gsb, *o[K16_NT];
        if (NT == 1)
            for (size_t l = 0; l < gsb; l += 64) PFH4(s + PF_BYTES + l);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) o[t] = xp + (size_t)t * xpb + (size_t)sb * KQ_REC;
        __m512i isum[K16_NT], mi[K16_NT];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) isum[t] = mi[t] = _mm512_setzero_si512();
        if (f == KILN_WF_Q6_K) { /* ql vectors [0, 2048) | qh vectors [2048, 3072) | sc planes [3072, 3328) | d */
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
                for (int jp = 0; jp < 2; jp++)     /* j = jp (low nibbles) and jp + 2 (high nibbles) */
#pragma GCC unroll 2
                    for (int half = 0; half < 2; half++) { /* columns l = 16·half .. +15 of the 32 */
                        __m512i pa[2 * K16_NT], pb[2 * K16_NT];
                        const int nc = NT == 1 ? 2 : 1;
#pragma GCC unroll 8
                        for (int t = 0; t < nc * NT; t++) pa[t] = pb[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
                        for (int mm = 0; mm < 4; mm++) {
                            const int m = 4 * half + mm, c = NT == 1 ? (mm & 1) : 0;
                            __m512i lo, hi;
                            k16_q6_quants(s, h, jp, m, &lo, &hi);
#pragma GCC unroll 4
                            for (int t = 0; t < NT; t++) {
                                pa[c * NT + t] = _mm512_dpbusd_epi32(pa[c * NT + t], lo, bcast4(o[t] + 128 * h + 32 * jp + 4 * m));
                                pb[c * NT + t] = _mm512_dpbusd_epi32(pb[c * NT + t], hi, bcast4(o[t] + 128 * h + 32 * (jp + 2) + 4 * m));
                            }
                        }
                        const __m512i sa = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + 3072 + 16 * (8 * h + 2 * jp + half))));
                        const __m512i sbv = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + 3072 + 16 * (8 * h + 2 * (jp + 2) + half))));
#pragma GCC unroll 4
                        for (int t = 0; t < NT; t++) {
                            const __m512i qa = NT == 1 ? _mm512_add_epi32(pa[0], pa[1]) : pa[t], qb = NT == 1 ? _mm512_add_epi32(pb[0], pb[1]) : pb[t];
                            isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(qa, sa), _mm512_mullo_epi32(qb, sbv)));
                        }
                    }
            /* the +32: (−32·sc_2k, −32·sc_2k+1) per row against the pair (bs_2k, bs_2k+1) */
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m128i p0 = _mm_loadu_si128((const __m128i *)(s + 3072 + 32 * k)), p1 = _mm_loadu_si128((const __m128i *)(s + 3072 + 32 * k + 16));
                const __m512i a2 = _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(p0, p1), _mm_unpacklo_epi8(p0, p1))), 5);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) mi[t] = _mm512_dpwssd_epi32(mi[t], a2, bcast4(o[t] + 256 + 4 * k));
            }
            const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 3328)));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                float dx;
                memcpy(&dx, o[t] + 288, 4);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], mi[t])), _mm512_mul_ps(wd, _mm512_set1_ps(dx)), acc[t]);
            }
            continue;
        }
        if (f == KILN_WF_Q2_K || f == KILN_WF_Q3_K) {
            /* Q2_K: scale planes [0, 256) (scale | min << 4) | qs vectors [256, 1280) | d [1280, 1312) | dmin [1312, 1344);
             * Q3_K: hmask vectors [0, 512) | qs vectors [512, 1536) | scale planes [1536, 1728) | d [1728, 1760).
             * qs byte 32h + l holds elements 128h + 32s + l at bits 2s (Q3_K: high bit = bit 4h + s of hmask
             * byte l; stored q + 4 in 0..7); element e's group of 16 is e / 16. */
            const int q3 = f == KILN_WF_Q3_K;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
                for (int hf = 0; hf < 2; hf++)     /* l < 16, l ≥ 16 */
#pragma GCC unroll 2
                    for (int sp = 0; sp < 2; sp++) { /* shifts s = 2sp (group 8h + 4sp + hf) and 2sp + 1 (+2) */
                        __m512i pa[2 * K16_NT], pb[2 * K16_NT];
                        const int nc = NT == 1 ? 2 : 1, s0 = 2 * sp, s1 = 2 * sp + 1;
#pragma GCC unroll 8
                        for (int t = 0; t < nc * NT; t++) pa[t] = pb[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
                        for (int mm = 0; mm < 4; mm++) {
                            const int m = 4 * hf + mm, c = NT == 1 ? (mm & 1) : 0;
                            const __m512i wa = k16_q23_quants(s, q3, h, s0, m), wb = k16_q23_quants(s, q3, h, s1, m);
#pragma GCC unroll 4
                            for (int t = 0; t < NT; t++) {
                                pa[c * NT + t] = _mm512_dpbusd_epi32(pa[c * NT + t], wa, bcast4(o[t] + k16_xcol(f, 128 * h + 32 * s0 + 4 * m)));
                                pb[c * NT + t] = _mm512_dpbusd_epi32(pb[c * NT + t], wb, bcast4(o[t] + k16_xcol(f, 128 * h + 32 * s1 + 4 * m)));
                            }
                        }
                        const __m512i sa = k16_q23_scale(s, q3, 8 * h + 2 * s0 + hf), sbv = k16_q23_scale(s, q3, 8 * h + 2 * s1 + hf);
#pragma GCC unroll 4
                        for (int t = 0; t < NT; t++) {
                            const __m512i qa = NT == 1 ? _mm512_add_epi32(pa[0], pa[1]) : pa[t], qb = NT == 1 ? _mm512_add_epi32(pb[0], pb[1]) : pb[t];
                            isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(qa, sa), _mm512_mullo_epi32(qb, sbv)));
                        }
                    }
            /* Q2_K: mins (m_2k, m_2k+1) per row; Q3_K: the +4, (4·sc_2k, 4·sc_2k+1); against (bs_2k, bs_2k+1) */
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m512i a2 = k16_q23_minpair(s, q3, k);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) mi[t] = _mm512_dpwssd_epi32(mi[t], a2, bcast4(o[t] + 256 + 4 * k));
            }
            const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + (q3 ? 1728 : 1280))));
            const __m512 wm = q3 ? _mm512_setzero_ps() : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 1312)));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                float dx;
                memcpy(&dx, o[t] + 288, 4);
                const __m512 vdx = _mm512_set1_ps(dx);
                if (q3) {
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], mi[t])), _mm512_mul_ps(wd, vdx), acc[t]);
                } else {
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(wd, vdx), acc[t]);
                    acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi[t]), _mm512_mul_ps(wm, vdx), acc[t]);
                }
            }
            continue;
        }
        if (f == KILN_WF_IQ4_XS) {
            /* d [0, 32) | scales_h [32, 64) (row r's u16 at 2r) | scales_l planes [64, 128) | qs vectors [128, 2176);
             * qs byte 16j + i: element 32j + i (low nibble), 32j + 16 + i (high), levels + 128 */
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m512i sj, s2; /* the scale, and 128·sc in both int16 halves */
                k16_xs_scale(s, j, &sj, &s2);
                __m512i pa[2 * K16_NT];
                const int nc = NT == 1 ? 2 : 1;
#pragma GCC unroll 8
                for (int t = 0; t < nc * NT; t++) pa[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int mm = 0; mm < 4; mm++) {
                    const int c = NT == 1 ? (mm & 1) : 0;
                    __m512i wl, wh;
                    k16_xs_quants(s, j, mm, &wl, &wh);
#pragma GCC unroll 4
                    for (int t = 0; t < NT; t++) {
                        pa[c * NT + t] = _mm512_dpbusd_epi32(pa[c * NT + t], wl, bcast4(o[t] + k16_xcol(f, 32 * j + 4 * mm)));
                        pa[c * NT + t] = _mm512_dpbusd_epi32(pa[c * NT + t], wh, bcast4(o[t] + k16_xcol(f, 32 * j + 16 + 4 * mm)));
                    }
                }
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const __m512i qa = NT == 1 ? _mm512_add_epi32(pa[0], pa[1]) : pa[t];
                    isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(qa, sj));
                    mi[t] = _mm512_dpwssd_epi32(mi[t], s2, bcast4(o[t] + 256 + 4 * j)); /* the +128 */
                }
            }
            const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                float dx;
                memcpy(&dx, o[t] + 288, 4);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], mi[t])), _mm512_mul_ps(wd, _mm512_set1_ps(dx)), acc[t]);
            }
            continue;
        }
        /* Q4_K: d, dmin [0, 64) | scale planes [64, 256) | qs vectors [256, 2304);
         * Q5_K: d, dmin | scale planes | qh vectors [256, 768) | qs vectors [768, 2816) (kernels/k16_quants.h) */
        const int q5 = f == KILN_WF_Q5_K;
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) { /* sub-blocks 2i (low nibbles of qs bytes 32i..) and 2i + 1 (high) */
            __m128i sc[2], mn[2];
            k16_q45_scales(s, i, sc, mn);
            __m512i pa[2 * K16_NT], pb[2 * K16_NT];
            const int nc = NT == 1 ? 2 : 1;
#pragma GCC unroll 8
            for (int t = 0; t < nc * NT; t++) pa[t] = pb[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) {
                const int c = NT == 1 ? (m & 1) : 0;
                __m512i lo, hi;
                k16_q45_quants(s, q5, i, m, &lo, &hi);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    pa[c * NT + t] = _mm512_dpbusd_epi32(pa[c * NT + t], lo, bcast4(o[t] + k16_xcol(f, 64 * i + 4 * m)));
                    pb[c * NT + t] = _mm512_dpbusd_epi32(pb[c * NT + t], hi, bcast4(o[t] + k16_xcol(f, 64 * i + 32 + 4 * m)));
                }
            }
            const __m512i sa = _mm512_cvtepu8_epi32(sc[0]), sbv = _mm512_cvtepu8_epi32(sc[1]);
            const __m512i ma = _mm512_cvtepu8_epi32(mn[0]), mb = _mm512_cvtepu8_epi32(mn[1]);
            const __m512i ma2 = _mm512_or_si512(ma, _mm512_slli_epi32(ma, 16)), mb2 = _mm512_or_si512(mb, _mm512_slli_epi32(mb, 16));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m512i qa = NT == 1 ? _mm512_add_epi32(pa[0], pa[1]) : pa[t], qb = NT == 1 ? _mm512_add_epi32(pb[0], pb[1]) : pb[t];
                isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(qa, sa), _mm512_mullo_epi32(qb, sbv)));
                mi[t] = _mm512_dpwssd_epi32(mi[t], ma2, bcast4(o[t] + 256 + 8 * i));
                mi[t] = _mm512_dpwssd_epi32(mi[t], mb2, bcast4(o[t] + 256 + 8 * i + 4));
            }
        }
        const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s)), wm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 32)));
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            float dx;
            memcpy(&dx, o[t] + 288, 4);
            const __m512 vdx = _mm512_set1_ps(dx);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(wd, vdx), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi[t]), _mm512_mul_ps(wm, vdx), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(Y + (size_t)t * (size_t)ldy, acc[t]);
}
AI void k16_group(int f, const kiln_weight *w, int64_t q, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy) {
    const uint8_t *g = w->data + (size_t)q * 16 * w->row_bytes;
    const int64_t nsb = w->cols / 256;
    int t = 0;
    /* AMX (kernels/q16_amx.h): every super-block format, each whole 16 tokens on tiles, k16_tile's bits */
    const int on_tiles = f == KILN_WF_Q4_K || f == KILN_WF_Q5_K || f == KILN_WF_Q6_K || f == KILN_WF_Q2_K || f == KILN_WF_Q3_K || f == KILN_WF_IQ4_XS;
    const kiln_k16_amx_fn amx = n >= 16 && on_tiles ? kiln_k16_amx_kernel() : NULL;
    if (amx) {
        t = n & ~15;
        amx(f, g, nsb, xp, xpb, t, Y, ldy);
        kiln_q16_amx_count((uint64_t)(t / 16) * (uint64_t)nsb * 8); /* (Q6_K, Q2_K, Q3_K, IQ4_XS: 16 half-size products a super-block) */
    }
    for (; t + 4 <= n; t += 4) k16_tile(f, 4, g, nsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy);
    switch (n - t) {
    case 3: k16_tile(f, 3, g, nsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 2: k16_tile(f, 2, g, nsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    case 1: k16_tile(f, 1, g, nsb, xp + (size_t)t * xpb, xpb, Y + (size_t)t * (size_t)ldy, ldy); break;
    default: break;
    }
}
/* The rows past the last whole group, checkpoint layout: the row kernel, per token (GEMV) or as a GEMM. */
AI void k16_rest(int f, const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t yoff, int64_t r0, int64_t r1) {
    if (xpb == 0) kq_rows(f, w, xp, 0, 1, Y + (r0 - yoff), 0, r0, r1);
    else kq_rows(f, w, xp, xpb, n, Y - yoff, ldy, r0, r1);
}
#undef Q16_ROWS
#undef Q16_GROUP
#undef Q16_NT
#undef Q16_X_BYTES
#undef Q16_REST
#define Q16_ROWS k16_rows
#define Q16_GROUP k16_group
#define Q16_NT K16_NT
#define Q16_X_BYTES GEMM_X_BYTES
#define Q16_REST k16_rest
#include "kernels/q16_rows.h"
static void gemv_q4k(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    if (w->tiled) k16_rows(KILN_WF_Q4_K, w, xp, 0, 1, y, 0, r0, r0, r1);
    else kq_rows(KILN_WF_Q4_K, w, xp, 0, 1, y, 0, r0, r1);
}
static void gemv_q5k(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    if (w->tiled) k16_rows(KILN_WF_Q5_K, w, xp, 0, 1, y, 0, r0, r0, r1);
    else kq_rows(KILN_WF_Q5_K, w, xp, 0, 1, y, 0, r0, r1);
}
static void gemv_q6k(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {
    (void)x;
    if (w->tiled) k16_rows(KILN_WF_Q6_K, w, xp, 0, 1, y, 0, r0, r0, r1);
    else kq_rows(KILN_WF_Q6_K, w, xp, 0, 1, y, 0, r0, r1);
}
static void gemm_q4k(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->tiled) k16_rows(KILN_WF_Q4_K, w, xp, xpb, n, Y, ldy, 0, r0, r1);
    else kq_rows(KILN_WF_Q4_K, w, xp, xpb, n, Y, ldy, r0, r1);
}
static void gemm_q5k(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->tiled) k16_rows(KILN_WF_Q5_K, w, xp, xpb, n, Y, ldy, 0, r0, r1);
    else kq_rows(KILN_WF_Q5_K, w, xp, xpb, n, Y, ldy, r0, r1);
}
static void gemm_q6k(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) {
    if (w->tiled) k16_rows(KILN_WF_Q6_K, w, xp, xpb, n, Y, ldy, 0, r0, r1);
    else kq_rows(KILN_WF_Q6_K, w, xp, xpb, n, Y, ldy, r0, r1);
}
#define KQ_ENTRIES(F, fmt)                                                                                                          \
    static void gemv_##F(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1) {                \
        (void)x;                                                                                                                    \
        if (w->tiled) k16_rows(fmt, w, xp, 0, 1, y, 0, r0, r0, r1);                                                                 \
        else kq_rows(fmt, w, xp, 0, 1, y, 0, r0, r1);                                                                               \
    }                                                                                                                               \
    static void gemm_##F(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1) { \
        if (w->tiled) k16_rows(fmt, w, xp, xpb, n, Y, ldy, 0, r0, r1);                                                              \
        else kq_rows(fmt, w, xp, xpb, n, Y, ldy, r0, r1);                                                                           \
    }
KQ_ENTRIES(q2k, KILN_WF_Q2_K)
KQ_ENTRIES(q3k, KILN_WF_Q3_K)
KQ_ENTRIES(iq4xs, KILN_WF_IQ4_XS)
#undef KQ_ENTRIES

#define AVX512_TABLE(FP8_XPREP_BYTES, FP8_XPREP, FP8_GEMV, FP8_FEW)                                                              \
    {                                                                                                            \
        .dot = dot_f32, .axpy = axpy_f32, .scale = scale_f32,                                                    \
        .xprep_bytes = {[KILN_WF_BF16] = xprep_bytes_bf16e, [KILN_WF_FP8_BLOCK] = FP8_XPREP_BYTES, [KILN_WF_INT4_GROUP] = xprep_bytes_int4,          \
                        [KILN_WF_Q8_0] = xprep_bytes_q, [KILN_WF_Q4_0] = xprep_bytes_q, [KILN_WF_Q4_K] = xprep_bytes_kq,            \
                        [KILN_WF_Q5_K] = xprep_bytes_kq, [KILN_WF_Q6_K] = xprep_bytes_kq, [KILN_WF_Q2_K] = xprep_bytes_kq,            \
                        [KILN_WF_Q3_K] = xprep_bytes_kq, [KILN_WF_IQ4_XS] = xprep_bytes_kq, [KILN_WF_Q5_0] = xprep_bytes_q,             \
                        [KILN_WF_IQ4_NL] = xprep_bytes_q, [KILN_WF_Q4_1] = xprep_bytes_q1, [KILN_WF_Q5_1] = xprep_bytes_q1}, \
        .xprep = {[KILN_WF_BF16] = xprep_bf16e, [KILN_WF_FP8_BLOCK] = FP8_XPREP, [KILN_WF_INT4_GROUP] = xprep_int4, [KILN_WF_Q8_0] = xprep_q8, \
                  [KILN_WF_Q4_0] = xprep_q4, [KILN_WF_Q4_K] = xprep_kq45, [KILN_WF_Q5_K] = xprep_kq45, [KILN_WF_Q6_K] = xprep_kq6, \
                  [KILN_WF_Q2_K] = xprep_kq2, [KILN_WF_Q3_K] = xprep_kq2, [KILN_WF_IQ4_XS] = xprep_kqxs, [KILN_WF_Q5_0] = xprep_q5,     \
                  [KILN_WF_IQ4_NL] = xprep_q8, [KILN_WF_Q4_1] = xprep_q1, [KILN_WF_Q5_1] = xprep_q1},                                  \
        .gemv = {[KILN_WF_F32] = gemv_f32, [KILN_WF_F16] = gemv_f16, [KILN_WF_BF16] = gemv_bf16,                 \
                 [KILN_WF_FP8_BLOCK] = FP8_GEMV, [KILN_WF_INT4_GROUP] = gemv_int4, [KILN_WF_Q8_0] = gemv_q8,     \
                 [KILN_WF_Q4_0] = gemv_q4, [KILN_WF_Q4_K] = gemv_q4k, [KILN_WF_Q5_K] = gemv_q5k, [KILN_WF_Q6_K] = gemv_q6k,  \
                 [KILN_WF_Q2_K] = gemv_q2k, [KILN_WF_Q3_K] = gemv_q3k, [KILN_WF_IQ4_XS] = gemv_iq4xs, [KILN_WF_Q5_0] = gemv_q5_0, \
                 [KILN_WF_IQ4_NL] = gemv_iq4nl, [KILN_WF_Q4_1] = gemv_q4_1, [KILN_WF_Q5_1] = gemv_q5_1},                        \
        .dequant = {[KILN_WF_F16] = dequant_f16, [KILN_WF_BF16] = dequant_bf16, [KILN_WF_FP8_BLOCK] = dequant_fp8}, \
        .gemm_f32 = gemm_f32, .read_sum = read_sum, .silu_mul = silu_mul, .max_f32 = max_f32, .peak = peak,      \
        .gemv_few = {[KILN_WF_INT4_GROUP] = gemv_few_int4, [KILN_WF_FP8_BLOCK] = FP8_FEW, [KILN_WF_F32] = gemv_few_f32, [KILN_WF_F16] = gemv_few_f16,         \
                     [KILN_WF_BF16] = gemv_few_bf16},                                                   \
        .gemm_prep = {[KILN_WF_INT4_GROUP] = gemm_int4, [KILN_WF_Q8_0] = gemm_q8, [KILN_WF_Q4_0] = gemm_q4,     \
                      [KILN_WF_Q4_K] = gemm_q4k, [KILN_WF_Q5_K] = gemm_q5k, [KILN_WF_Q6_K] = gemm_q6k,      \
                      [KILN_WF_Q2_K] = gemm_q2k, [KILN_WF_Q3_K] = gemm_q3k, [KILN_WF_IQ4_XS] = gemm_iq4xs,  \
                      [KILN_WF_Q5_0] = gemm_q5_0, [KILN_WF_IQ4_NL] = gemm_iq4nl, [KILN_WF_Q4_1] = gemm_q4_1, \
                      [KILN_WF_Q5_1] = gemm_q5_1},                                                          \
        .gemm_bf16 = BF16_GEMM(gemm_bf16), .xprep_bf16_bytes = BF16_GEMM(xprep_bytes_bf16row),                  \
        .xprep_bf16 = BF16_GEMM(xprep_bf16row), .dequant_bf16 = {[KILN_WF_FP8_BLOCK] = BF16_GEMM(dequant_bf16t_fp8)}, \
        .bf16_gemm_mask = BF16_GEMM((1u << KILN_WF_BF16) | (1u << KILN_WF_FP8_BLOCK)),                          \
        .tiled_mask = (1u << KILN_WF_FP8_BLOCK) | (1u << KILN_WF_INT4_GROUP) | (1u << KILN_WF_Q8_0) | (1u << KILN_WF_Q4_0) | \
                      (1u << KILN_WF_Q4_K) | (1u << KILN_WF_Q5_K) | (1u << KILN_WF_Q6_K) | (1u << KILN_WF_Q2_K) |              \
                      (1u << KILN_WF_Q3_K) | (1u << KILN_WF_IQ4_XS),                                                            \
        .int4_q16 = 1,                                                                                                  \
    }
#define BF16_GEMM(fn) 0
const kiln_ktable kiln_ktable_avx512 = AVX512_TABLE(xprep_bytes_fp8, xprep_fp8, gemv_fp8, gemv_few_fp8);
#undef BF16_GEMM
/* The FP8 GEMV and the BF16 / FP8 GEMM on bf16 activations (vdpbf16ps): only for CPUs with AVX512_BF16. */
#define BF16_GEMM(fn) fn
const kiln_ktable kiln_ktable_avx512_bf16 = AVX512_TABLE(xprep_bytes_fp8b, xprep_fp8_bf16, gemv_fp8b, gemv_few_fp8b);
#undef BF16_GEMM
