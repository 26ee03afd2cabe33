/* test_gemv.c — every weight format × ISA (scalar / AVX2 / AVX-512 when this CPU has them) against
 * the scalar reference kiln_gemv_ref, on awkward sizes, with NaN-poisoned memory past every input
 * and a NaN-prefilled output (so a missed or out-of-bounds element shows).
 *
 * Error measure: NMSE = Σ(y − y_ref)² / Σ y_ref² over the whole output. Bounds per format:
 *   F32, F16, BF16, FP8   1e-9  the SIMD kernels dequantise exactly, only the float summation order
 *                              differs (expected NMSE ~1e-13 for these sizes);
 *   FP8, BF16-dot path    5e-5  the AVX-512 kernel on AVX512_BF16 CPUs rounds x to bf16 (relative
 *                              error ≤ 2^-8, uniform: NMSE ≈ 2^-16/3 ≈ 5e-6) and reads the
 *                              subnormal fp8 codes as 0 (kiln_kernels_fp8_exact); both tested;
 *   INT4, Q8_0, Q4_0      1e-4  the SIMD kernels quantise x to int8 per 32 (amax/127, like llama.cpp);
 *                              for Gaussian x the rounding noise is ≈ (2.3/127)²/12 ≈ 3e-5 of the
 *                              signal. Prefill (n > 1) uses the same path.
 * FP8 test bytes avoid the two NaN codes (0x7F, 0xFF), which no checkpoint holds. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kernels/gemv.h"
#include "kiln_test.h"
#include "kernels/gemv_isa.h"
#include "quant/quantize.h"
#include "base/fp.h"
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float urand(void) { return (float)(rnd32() & 0xFFFFFF) / 16777216.0f; } /* [0, 1) */
static float nrand(void) { /* Box-Muller */
    float u = urand() + 1e-7f, v = urand();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

#define POISON_BYTES 256
/* A test weight: data and scales each followed by POISON_BYTES of NaN-pattern bytes. */
typedef struct { kiln_weight w; uint8_t *data; uint8_t *scales; } tweight;

static void *poisoned(size_t n) {
    uint8_t *p = malloc(n + POISON_BYTES);
    assert_non_null(p);
    memset(p + n, 0xFF, POISON_BYTES); /* 0xFFFFFFFF is a NaN as f32, f16, bf16; 0xFF a NaN fp8 */
    return p;
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static tweight make_weight(kiln_wformat f, int64_t rows, int64_t cols, int block) {
    tweight t = {0};
    t.w.fmt = f; t.w.rows = rows; t.w.cols = cols; t.w.block = block;
    size_t sbytes = 0;
    switch (f) {
    case KILN_WF_F32: t.w.row_bytes = 4 * cols; break;
    case KILN_WF_F16: case KILN_WF_BF16: t.w.row_bytes = 2 * cols; break;
    case KILN_WF_FP8_BLOCK:
        t.w.row_bytes = cols;
        sbytes = 4 * (size_t)((rows + block - 1) / block) * (size_t)((cols + block - 1) / block);
        break;
    case KILN_WF_INT4_GROUP: t.w.row_bytes = cols / 2; sbytes = 2 * (size_t)rows * (size_t)(cols / block); break;
    case KILN_WF_Q8_0: t.w.row_bytes = cols / 32 * 34; break;
    case KILN_WF_Q4_0: t.w.row_bytes = cols / 32 * 18; break;
    default: break;
    }
    size_t dbytes = t.w.row_bytes * (size_t)rows;
    t.data = poisoned(dbytes);
    for (size_t i = 0; i < dbytes; i++) t.data[i] = (uint8_t)rnd32();
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = t.data + r * t.w.row_bytes;
        for (int64_t c = 0; c < cols; c++) {
            switch (f) {
            case KILN_WF_F32: { float v = nrand(); memcpy(row + 4 * c, &v, 4); break; }
            case KILN_WF_F16: put16(row + 2 * c, kiln_f32_to_f16(nrand())); break;
            case KILN_WF_BF16: put16(row + 2 * c, kiln_f32_to_bf16(nrand())); break;
            case KILN_WF_FP8_BLOCK: if ((row[c] & 0x7F) == 0x7F) row[c] ^= 0x01; break;
            default: break;
            }
        }
        if (f == KILN_WF_Q8_0)
            for (int64_t b = 0; b < cols / 32; b++) put16(row + 34 * b, kiln_f32_to_f16(0.01f + 0.02f * urand()));
        if (f == KILN_WF_Q4_0)
            for (int64_t b = 0; b < cols / 32; b++) put16(row + 18 * b, kiln_f32_to_f16(0.01f + 0.02f * urand()));
    }
    if (sbytes) {
        t.scales = poisoned(sbytes);
        if (f == KILN_WF_FP8_BLOCK)
            for (size_t i = 0; i < sbytes / 4; i++) { float s = ldexpf(0.5f + urand(), -9); memcpy(t.scales + 4 * i, &s, 4); }
        else
            for (size_t i = 0; i < sbytes / 2; i++) put16(t.scales + 2 * i, kiln_f32_to_bf16(0.005f + 0.02f * urand()));
    }
    t.w.data = t.data;
    t.w.scales = t.scales;
    return t;
}
static void free_weight(tweight *t) { free(t->data); free(t->scales); }

static float *make_x(int n, int64_t cols) {
    size_t m = (size_t)n * (size_t)cols;
    float *x = malloc((m + 64) * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < m; i++) x[i] = nrand();
    for (size_t i = m; i < m + 64; i++) x[i] = NAN;
    return x;
}

/* Whether a matmul of n tokens of format f rounds x (and, for FP8 tiles, fp8 × scale) to bf16: the
 * AVX-512 table of the bf16 form does for FP8 at every n (the GEMV) and for BF16 and FP8 at n > 1
 * (the BF16-dot GEMM). */
/* Whether the current kernels multiply w on n tokens through Q8_0's int8 kernels (a prompt's FP8
 * GEMM on AVX512_BF16 CPUs in the BF16 form: gemv.c fp8_q8_table). */
static int fp8_int8(const kiln_weight *w, int n) {
    kiln_kctx cx;
    kiln_kctx_default(&cx);
    return kiln_cx_fp8_int8(&cx, w, n);
}
static int bf16_rounding(kiln_wformat f, int n) {
    /* FP8 steps of 2..KILN_GEMV_SMALL_N_FP8 tokens run the exact FP8 GEMV per token (gemv.c) */
    return kiln_kernels_fp8_rounds_x() && ((f == KILN_WF_FP8_BLOCK && (n == 1 || n > KILN_GEMV_SMALL_N_FP8)) || (f == KILN_WF_BF16 && n > 1));
}
static double bound_for(kiln_wformat f) {
    /* some n of the test runs a rounding path: FP8 prompts on the int8 route quantize both operands
     * per 32 as Q8_0 does (test_backend_ops weight_bound: ~5.4e-5 expected) */
    const kiln_weight probe = {.fmt = KILN_WF_FP8_BLOCK, .rows = 16, .cols = 128, .row_bytes = 128, .block = 128};
    if (f == KILN_WF_FP8_BLOCK && fp8_int8(&probe, KILN_GEMV_SMALL_N_FP8 + 1)) return 2e-4;
    if (bf16_rounding(f, KILN_GEMV_SMALL_N_FP8 + 1)) return 5e-5;
    return (f == KILN_WF_INT4_GROUP || f == KILN_WF_Q8_0 || f == KILN_WF_Q4_0) ? 1e-4 : 1e-9;
}

/* Per-element hard bound on |y − y_ref| for output (i, r): float summation in either order
 * (2·(cols+16)·u·Σ|w·x|, u = 2^-24 — the textbook worst case, here with a factor 2 for two roundings
 * per term in the block-scaled kernels), plus for the integer-dot formats the activation rounding:
 * |x − q·d| ≤ d/2 per element, so Σ_blocks (d_b/2)·Σ|w| (d_b = amax_b/127, with 0.2% slack for the
 * rounding of 1/d). The BF16-dot paths (bf16_rounding): 2^-8·Σ|w·x| for x rounded to bf16 (twice
 * that for the FP8 GEMM, whose tiles round fp8 × scale as well), plus for the FP8 GEMV (n = 1) Σ|w·x| over the weights with a subnormal
 * code (read as 0; w must still be in checkpoint layout, untiled).
 * This catches a wrong element however small the output is; the NMSE catches a systematic error. */
static void elem_bounds(const kiln_weight *w, const float *x, float *bound, int n) {
    int64_t cols = w->cols;
    float *row = malloc((size_t)cols * sizeof(float));
    assert_non_null(row);
    int intdot = w->fmt == KILN_WF_INT4_GROUP || w->fmt == KILN_WF_Q8_0 || w->fmt == KILN_WF_Q4_0;
    /* bf16 keeps 8 significant bits: each rounding is off by at most 2^-8 relative. 2^-8·Σ|w·x| covers x
     * rounded to bf16; the GEMM's FP8 tiles round fp8 × scale too: (1 + 2^-8)² − 1 < 1.01·2^-7. The
     * GEMV (n = 1) reads subnormal fp8 codes as 0 instead. */
    /* the BF16-dot FP8 GEMV (n = 1) reads subnormal codes as 0; the GEMM (n > KILN_GEMV_SMALL_N_FP8)
     * rounds x and fp8 × scale to BF16; 2..KILN_GEMV_SMALL_N_FP8 tokens run the exact GEMV */
    const int gemv_path = n == 1;
    /* FP8 on the int8 route: x to int8 per 32 as the integer formats (below), and the weights
     * requantized to Q8_0: |w − q·d| ≤ d/2 per element (d = amax_w / 127 of the row's 32-block), plus
     * d's rounding to f16, relative 2^-11 (absolute 2^-25 where d is an f16 subnormal), on every q·d */
    const int q8w = w->fmt == KILN_WF_FP8_BLOCK && fp8_int8(w, n);
    int fp8_rounds = !q8w && bf16_rounding(w->fmt, n), subnormal_zero = fp8_rounds && w->fmt == KILN_WF_FP8_BLOCK && gemv_path;
    assert_true(!subnormal_zero || !w->tiled);
    for (int64_t r = 0; r < w->rows; r++) {
        kiln_weight_row_f32(w, r, row);
        double mag = 0, q = 0;
        for (int64_t c = 0; c < cols; c++) mag += fabs((double)row[c] * x[c]);
        if (fp8_rounds) q += w->fmt == KILN_WF_FP8_BLOCK && !gemv_path ? 1.01 * ldexp(mag, -7) : ldexp(mag, -8);
        if (subnormal_zero)
            for (int64_t c = 0; c < cols; c++)
                if ((w->data[(size_t)r * w->row_bytes + c] & 0x78) == 0) q += fabs((double)row[c] * x[c]);
        if (intdot || q8w)
            for (int64_t b = 0; b < cols / 32; b++) {
                double amax = 0, sw = 0;
                for (int k = 0; k < 32; k++) { amax = fmax(amax, fabs(x[32 * b + k])); sw += fabs(row[32 * b + k]); }
                q += amax / 127.0 * 0.5 * 1.002 * sw;
            }
        if (q8w)
            for (int64_t b = 0; b < cols / 32; b++) {
                double wmax = 0, sx = 0, swx = 0;
                for (int k = 0; k < 32; k++) {
                    wmax = fmax(wmax, fabs(row[32 * b + k]));
                    sx += fabs(x[32 * b + k]);
                    swx += fabs((double)row[32 * b + k] * x[32 * b + k]);
                }
                const double d = wmax / 127.0, e16 = fmax(ldexp(1.0, -11) * d, ldexp(1.0, -25));
                /* half a step per weight, then d's f16 rounding on |q| ≤ |w| / d + 1/2 steps; 1% slack
                 * for the product with x's own error */
                if (d > 0) q += 1.01 * (0.5 * d * sx + e16 / d * swx + 0.5 * e16 * sx);
            }
        bound[r] = (float)(4.0 * (cols + 16) * 5.96e-8 * mag + q + 1e-30);
    }
    free(row);
}

/* NMSE accumulated over every case of one format × ISA. */
static double acc_num, acc_den;

static void check_out(const char *what, kiln_isa isa, const tweight *t, int n, const float *Y, const float *R,
                      const float *B, int64_t r0, int64_t r1) {
    const int64_t rows = t->w.rows;
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            size_t k = (size_t)i * rows + r;
            if (r < r0 || r >= r1) { assert_true(isnan(Y[k])); continue; }
            if (!isfinite(Y[k]) || !(fabsf(Y[k] - R[k]) <= B[k])) {
                fprintf(stderr, "%s: %s %s block=%d rows=%ld cols=%ld n=%d: y[%d][%ld] = %.9g, ref %.9g, bound %.3g\n", what,
                        kiln_isa_name(isa), kiln_wformat_name(t->w.fmt), t->w.block, (long)rows, (long)t->w.cols, n, i,
                        (long)r, Y[k], R[k], B[k]);
                fail();
            }
        }
}

/* When set, check_case multiplies by the weight in the 4-row tile layout (gemv.h), against the
 * reference and bounds computed on the checkpoint layout before tiling. */
static int tile_mode;
/* The layout tile_and_check tiles in (gemv.h): the format's own, or KILN_TILE_Q16 (INT4 group 32). */
static int tile_layout = KILN_TILE_GROUPS;

/* Tiles t in place and checks that the permutation is undone exactly by the row/scale readers. */
static void tile_and_check(tweight *t) {
    const kiln_weight orig = t->w;
    const size_t rb = orig.row_bytes;
    uint8_t *copy = malloc(rb * (size_t)orig.rows), *row = malloc(rb);
    assert_non_null(copy); assert_non_null(row);
    memcpy(copy, t->data, rb * (size_t)orig.rows);
    const int64_t ng = orig.fmt == KILN_WF_INT4_GROUP ? orig.cols / orig.block : 0;
    uint16_t *scopy = malloc(2 * (size_t)(orig.rows * ng) + 2);
    assert_non_null(scopy);
    if (ng) memcpy(scopy, t->scales, 2 * (size_t)(orig.rows * ng));
    assert_int_equal(kiln_weight_tile(&t->w, t->data, t->scales, tile_layout), 0);
    if (tile_layout == KILN_TILE_Q16) /* INT4 group 32 of 16 rows or more; anything else stays as it is */
        assert_int_equal(t->w.tiled, orig.fmt == KILN_WF_INT4_GROUP && orig.block == 32 && orig.rows >= 16 ? KILN_TILE_Q16 : 0);
    else
        assert_int_equal(t->w.tiled, orig.rows >= kiln_weight_tile_rows(&orig));
    for (int64_t r = 0; r < orig.rows; r++) {
        kiln_weight_row_gather(&t->w, r, row);
        assert_memory_equal(row, copy + (size_t)r * rb, rb);
        for (int64_t g = 0; g < ng; g++) {
            uint16_t v;
            memcpy(&v, t->scales + 2 * kiln_weight_int4_scale_index(&t->w, r, g), 2);
            assert_int_equal(v, scopy[r * ng + g]);
        }
    }
    free(copy); free(row); free(scopy);
}

/* One case: all n rows of X through kiln_matmul (threaded) and kiln_matmul_rows (a sub-range). */
static void check_case(kiln_isa isa, kiln_wformat f, int64_t rows, int64_t cols, int block, int n) {
    tweight t = make_weight(f, rows, cols, block);
    float *X = make_x(n, cols);
    size_t ny = (size_t)n * (size_t)rows;
    float *Y = malloc((ny + 16) * sizeof(float)), *R = malloc(ny * sizeof(float)), *B = malloc(ny * sizeof(float));
    assert_non_null(Y); assert_non_null(R); assert_non_null(B);
    for (int i = 0; i < n; i++) {
        kiln_gemv_ref(&t.w, X + (size_t)i * cols, R + (size_t)i * rows, 0, rows);
        elem_bounds(&t.w, X + (size_t)i * cols, B + (size_t)i * rows, n);
    }
    if (tile_mode) tile_and_check(&t);
    for (size_t i = 0; i < ny + 16; i++) Y[i] = NAN;
    kiln_matmul(&t.w, X, Y, n);
    check_out("matmul", isa, &t, n, Y, R, B, 0, rows);
    for (size_t i = ny; i < ny + 16; i++) assert_true(isnan(Y[i])); /* nothing written past Y */
    for (size_t i = 0; i < ny; i++) {
        acc_num += (double)(Y[i] - R[i]) * (Y[i] - R[i]);
        acc_den += (double)R[i] * R[i];
    }
    /* Single-threaded sub-range: rows [r0, r1) written, others untouched. */
    int64_t r0 = rows / 3, r1 = rows - rows / 4;
    for (size_t i = 0; i < ny; i++) Y[i] = NAN;
    kiln_matmul_rows(&t.w, X, Y, n, r0, r1);
    check_out("matmul_rows", isa, &t, n, Y, R, B, r0, r1);
    free(X); free(Y); free(R); free(B); free_weight(&t);
}

static const kiln_isa isas[] = {KILN_ISA_SCALAR, KILN_ISA_AVX2, KILN_ISA_AVX512};

static void run_format(kiln_wformat f, const int64_t *cols, int ncols, const int *blocks, int nblocks) {
    static const int64_t rows[] = {1, 7, 33, 130};
    static const int ns[] = {1, 3, 17};
    for (int k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) { fprintf(stderr, "skip %s: not supported by this CPU\n", kiln_isa_name(isas[k])); continue; }
        assert_int_equal(kiln_kernels_select(isas[k]), isas[k]);
        acc_num = acc_den = 0;
        for (int b = 0; b < nblocks; b++)
            for (int c = 0; c < ncols; c++) {
                if (f == KILN_WF_INT4_GROUP && cols[c] % blocks[b]) continue;
                for (int r = 0; r < 4; r++)
                    for (int i = 0; i < 3; i++) {
                        if (isas[k] == KILN_ISA_SCALAR && rows[r] * cols[c] * ns[i] > 200000) continue;
                        check_case(isas[k], f, rows[r], cols[c], blocks[b], ns[i]);
                    }
            }
        double nmse = acc_num / acc_den;
        fprintf(stderr, "%-6s %-5s NMSE %.3g (bound %.0e)\n", kiln_isa_name(isas[k]), kiln_wformat_name(f), nmse, bound_for(f));
        assert_true(nmse <= bound_for(f));
        if (isas[k] != KILN_ISA_SCALAR) {
            kiln_weight w = {.fmt = f, .rows = 4, .cols = cols[ncols - 1], .block = blocks[0]};
            w.row_bytes = 1;
            if (f == KILN_WF_F32) w.row_bytes = 4 * (size_t)w.cols;
            assert_true(kiln_matmul_is_fast(&w));
        }
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

static void test_f32(void **s) { (void)s; int64_t c[] = {1, 7, 16, 33, 100, 300}; int b[] = {0}; run_format(KILN_WF_F32, c, 6, b, 1); }
static void test_f16(void **s) { (void)s; int64_t c[] = {1, 7, 16, 33, 100, 300}; int b[] = {0}; run_format(KILN_WF_F16, c, 6, b, 1); }
static void test_bf16(void **s) { (void)s; int64_t c[] = {1, 7, 16, 33, 100, 300}; int b[] = {0}; run_format(KILN_WF_BF16, c, 6, b, 1); }
/* FP8: cols that are not multiples of 128 (partial scale blocks at the right edge) and rows = 130
 * (a partial block at the bottom). */
static void test_fp8(void **s) {
    (void)s;
    int64_t c[] = {1, 13, 128, 200, 300, 520};
    int b[] = {128};
    for (int exact = 1; exact >= 0; exact--) { /* AVX-512: the exact path, then (AVX512_BF16 CPUs) the BF16-dot one */
        const int was = kiln_kernels_fp8_exact(exact);
        run_format(KILN_WF_FP8_BLOCK, c, 6, b, 1);
        if (!exact) { /* and its prompts on Q8_0's int8 kernels at every size (KILN_FP8_PREFILL=int8) */
            const int was_int8 = kiln_kernels_fp8_prefill_int8(2);
            run_format(KILN_WF_FP8_BLOCK, c, 6, b, 1);
            kiln_kernels_fp8_prefill_int8(was_int8);
        }
        kiln_kernels_fp8_exact(was);
    }
}
/* The BF16-dot FP8 path converts every normal fp8 code exactly: with x exactly representable in bf16
 * and no subnormal codes, only the float summation order may differ from the reference. */
static void test_fp8_bf16_exact_inputs(void **s) {
    (void)s;
    if (!kiln_cpu_supports(KILN_ISA_AVX512)) return;
    kiln_kernels_select(KILN_ISA_AVX512);
    const int was = kiln_kernels_fp8_exact(0);
    if (!kiln_kernels_fp8_rounds_x()) { fprintf(stderr, "skip: no AVX512_BF16 on this CPU\n"); kiln_kernels_fp8_exact(was); kiln_kernels_select(KILN_ISA_AUTO); return; }
    for (int k = 0; k < 2; k++) {
        const int64_t rows = 37, cols = k ? 1000 : 256;
        tweight t = make_weight(KILN_WF_FP8_BLOCK, rows, cols, k ? 64 : 128);
        for (size_t i = 0; i < (size_t)(rows * cols); i++)
            if ((t.data[i] & 0x78) == 0) t.data[i] |= 0x08; /* every code normal (0x7F/0xFF stay excluded) */
        float *X = make_x(1, cols), Y[37], R[37], B[37];
        for (int64_t c = 0; c < cols; c++) X[c] = kiln_bf16_to_f32(kiln_f32_to_bf16(X[c])); /* exact in bf16 */
        kiln_gemv_ref(&t.w, X, R, 0, rows);
        kiln_kernels_fp8_exact(1); /* the exact bound (float summation only) */
        elem_bounds(&t.w, X, B, 1);
        kiln_kernels_fp8_exact(0);
        kiln_matmul_rows(&t.w, X, Y, 1, 0, rows);
        for (int64_t r = 0; r < rows; r++) assert_true(fabsf(Y[r] - R[r]) <= B[r]);
        free(X); free_weight(&t);
    }
    kiln_kernels_fp8_exact(was);
    kiln_kernels_select(KILN_ISA_AUTO);
}
static void test_int4(void **s) {
    (void)s;
    int64_t c[] = {32, 96, 128, 160, 288, 384, 640};
    int b[] = {32, 128};
    run_format(KILN_WF_INT4_GROUP, c, 7, b, 2);
    /* the AVX2 table's other INT4 kernel (vpmaddubsw where AVX-VNNI is used above, or the other way) */
    const int was = kiln_kernels_avx_vnni(0);
    kiln_kernels_avx_vnni(!was);
    run_format(KILN_WF_INT4_GROUP, c, 7, b, 2);
    kiln_kernels_avx_vnni(was);
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* AVX2 INT4 with AVX-VNNI dots and with vpmaddubsw/vpmaddwd: the same integers, so the same floats
 * bit for bit (groups 32, 64 and 128, a partial last 64-column chunk, threaded). */
static void test_int4_avx_vnni_exact(void **s) {
    (void)s;
    /* kiln_kernels_avx_vnni returns whether AVX-VNNI was in use (enabled and the CPU has it): after
     * enabling it, a second call says whether the CPU has it (clang has no "avxvnni" builtin name) */
    const int was = kiln_kernels_avx_vnni(1);
    const int cpu_has = kiln_kernels_avx_vnni(1);
    if (!kiln_cpu_supports(KILN_ISA_AVX2) || !cpu_has) { kiln_kernels_avx_vnni(was); skip(); return; }
    const int64_t cols[] = {96, 640, 2048 + 32};
    const int blocks[] = {32, 64, 128};
    for (int b = 0; b < 3; b++)
        for (int c = 0; c < 3; c++) {
            if (cols[c] % blocks[b]) continue;
            const int64_t rows = 300;
            tweight t = make_weight(KILN_WF_INT4_GROUP, rows, cols[c], blocks[b]);
            float *X = make_x(1, cols[c]), Yv[300], Ym[300];
            kiln_kernels_avx_vnni(1);
            kiln_kernels_select(KILN_ISA_AVX2);
            kiln_matmul(&t.w, X, Yv, 1);
            kiln_kernels_avx_vnni(0);
            kiln_kernels_select(KILN_ISA_AVX2);
            kiln_matmul(&t.w, X, Ym, 1);
            assert_memory_equal(Yv, Ym, sizeof Yv);
            free(X); free_weight(&t);
        }
    kiln_kernels_avx_vnni(was);
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* The tile layouts (FP8, INT4 g32/g128 4-row tiles; Q8_0 / Q4_0 16-row interleaves; rows not multiples of 4, column tails inside the last
 * 64-byte chunk, sub-ranges starting inside a tile group) on every ISA: the AVX-512 kernels read it
 * directly, the others through gathered row groups, the reference through kiln_weight_row_f32. */
static void test_tiled(void **s) {
    (void)s;
    tile_mode = 1;
    int64_t c8[] = {64, 200, 300, 520};
    int b8[] = {128, 64};
    for (int exact = 1; exact >= 0; exact--) {
        const int was = kiln_kernels_fp8_exact(exact);
        run_format(KILN_WF_FP8_BLOCK, c8, 4, b8, 2);
        kiln_kernels_fp8_exact(was);
    }
    int64_t c4[] = {32, 96, 128, 160, 288, 640};
    int b4[] = {32, 64, 128};
    run_format(KILN_WF_INT4_GROUP, c4, 6, b4, 3);
    /* INT4 group 32 in Q4_0's 16-row interleave (the AVX-512 kernels read it; AVX2 and the
     * reference through gathered rows) */
    tile_layout = KILN_TILE_Q16;
    run_format(KILN_WF_INT4_GROUP, c4, 6, b4, 1);
    tile_layout = KILN_TILE_GROUPS;
    /* Q8_0 / Q4_0: the 16-row block interleave (rows 33 and 130 leave 1 and 2 rows untiled; the
     * sub-ranges of check_case cut groups) */
    int64_t cq[] = {32, 96, 288};
    int bq[] = {32};
    run_format(KILN_WF_Q8_0, cq, 3, bq, 1);
    run_format(KILN_WF_Q4_0, cq, 3, bq, 1);
    /* several MiB, threaded: row chunks and the prefetch running ahead over tile groups */
    for (int k = 1; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        check_case(isas[k], KILN_WF_FP8_BLOCK, 2102, 1000, 128, 1);
        check_case(isas[k], KILN_WF_INT4_GROUP, 4202, 1056, 32, 1);
        check_case(isas[k], KILN_WF_INT4_GROUP, 4202, 1024, 128, 3);
        tile_layout = KILN_TILE_Q16;
        check_case(isas[k], KILN_WF_INT4_GROUP, 4202, 1056, 32, 1);
        check_case(isas[k], KILN_WF_INT4_GROUP, 4210, 1024, 32, 9);
        tile_layout = KILN_TILE_GROUPS;
        check_case(isas[k], KILN_WF_Q8_0, 4210, 1024, 32, 1);
        check_case(isas[k], KILN_WF_Q4_0, 4210, 1024, 32, 9);
    }
    /* DAZ: the AVX-512 FP8 general path (exact mode) gathers tiled rows */
    unsigned int old = __builtin_ia32_stmxcsr();
    const int was_exact = kiln_kernels_fp8_exact(1);
    for (int k = 1; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        tweight t = make_weight(KILN_WF_FP8_BLOCK, 9, 300, 128);
        float *X = make_x(1, 300), Y[9], R[9], B[9];
        kiln_gemv_ref(&t.w, X, R, 0, 9);
        elem_bounds(&t.w, X, B, 1);
        tile_and_check(&t);
        __builtin_ia32_ldmxcsr(old | 0x8040);
        kiln_matmul_rows(&t.w, X, Y, 1, 0, 9);
        __builtin_ia32_ldmxcsr(old);
        for (int r = 0; r < 9; r++) assert_true(fabsf(Y[r] - R[r]) <= B[r]);
        free(X); free_weight(&t);
    }
    kiln_kernels_fp8_exact(was_exact);
    kiln_kernels_select(KILN_ISA_AUTO);
    tile_mode = 0;
}
/* The GGUF block quants with row-layout int8-dot kernels, as ggml-common.h lays them out: weights per
 * block, bytes per block and the byte offsets of the block's f16 scales (d; dmin / m where it has
 * one). (Q8_0 / Q4_0 have their own tests below: they are also read in the 16-row interleave.) */
typedef struct { kiln_wformat f; int elems, bytes, f16_at[2], n_f16; } gguf_block;
static const gguf_block gguf_blocks[] = {
    {KILN_WF_Q4_K, 256, 144, {0, 2}, 2},  {KILN_WF_Q5_K, 256, 176, {0, 2}, 2}, {KILN_WF_Q6_K, 256, 210, {208, 0}, 1},
    {KILN_WF_Q2_K, 256, 84, {80, 82}, 2}, {KILN_WF_Q3_K, 256, 110, {108, 0}, 1}, {KILN_WF_IQ4_XS, 256, 136, {0, 0}, 1},
    {KILN_WF_Q4_1, 32, 20, {0, 2}, 2},    {KILN_WF_Q5_0, 32, 22, {0, 0}, 1},     {KILN_WF_Q5_1, 32, 24, {0, 2}, 2},
    {KILN_WF_IQ4_NL, 32, 18, {0, 0}, 1},
};
#define N_GGUF_BLOCKS ((int)(sizeof gguf_blocks / sizeof gguf_blocks[0]))
/* Random blocks of gb's type for rows × cols: quant and scale bytes uniform, f16 scales small and finite. */
static uint8_t *gguf_random(const gguf_block *gb, kiln_weight *w, int64_t rows, int64_t cols) {
    *w = (kiln_weight){.fmt = gb->f, .rows = rows, .cols = cols, .row_bytes = (size_t)(cols / gb->elems * gb->bytes)};
    uint8_t *d = malloc(w->row_bytes * (size_t)rows);
    assert_non_null(d);
    for (size_t i = 0; i < w->row_bytes * (size_t)rows; i++) d[i] = (uint8_t)rnd32();
    for (int64_t b = 0; b < rows * cols / gb->elems; b++)
        for (int j = 0; j < gb->n_f16; j++) put16(d + (size_t)b * (size_t)gb->bytes + gb->f16_at[j], (uint16_t)(0x1000 + (rnd32() & 0x3FF)));
    w->data = d;
    return d;
}
/* The GGUF block quants (K-quants, IQ4_XS, and the blocks of 32 Q4_1 / Q5_0 / Q5_1 / IQ4_NL) through
 * every ISA's path against the scalar reference: random blocks, rows not multiples of 4 (1, 17, 33),
 * 1 and 3 super-blocks per row (3 and 19 blocks of 32), n = 1 (GEMV) and 9, 17 (GEMM). The SIMD
 * kernels (AVX-512 VNNI, AVX2 with AVX-VNNI and with vpmaddubsw) multiply an int8 copy of x: per block
 * of A = 256 columns (super-block formats: kiln_quant_x256) or A = 32 (blocks of 32: kiln_quant_x32)
 * x̂ = q·dx with dx = amax/127 and q = RNE(x/dx), the dots then exact in int32, so they differ from
 * the reference only by the rounding of x and by f32 rounding.
 *  - float rounding (the old bound of the f32 kernels, kept for every path): per element
 *    F = 4·(cols + 16)·2^-24·Σ_c (|w_c| + max|w|)·|x_c| (float sums in any order, mins apart);
 *  - x's rounding: |x_c − x̂_c| ≤ dx/2, so |Σ w_c·(x_c − x̂_c)| ≤ Q = Σ_c |w_c|·dx_A(c)/2.
 * (a) x integers in [−127, 127] with a ±127 in every block of A: dx = 1 exactly and x̂ = x, so
 *     every path must meet |y − ref| ≤ F alone and NMSE ≤ 1e-9 (a wrong scale, column, level or
 *     sub-block breaks this even where it would hide inside Q);
 * (b) Gaussian x: the kernel against its exact model y* = Σ_c w_c·x̂_c (double; w the reference's f32
 *     weights, x̂ from the quantizer above): |y − y*| ≤ F computed with |x̂| (a kernel quantizing x on
 *     another grid, or mis-scaling, misses this by orders of magnitude); against the reference
 *     |y − ref| ≤ F + Q, so the NMSE over all elements is at most Σ(F + Q)² / Σ ref², the bound
 *     checked. The expected NMSE, Σ_c w_c²·dx²/12 per element over Σ ref² (rounding errors uniform
 *     on [−dx/2, dx/2]), is printed beside the measured one.
 * Also: a token's result is the same bits in a batch as alone (GEMM = GEMV), and AVX2's AVX-VNNI
 * and vpmaddubsw forms give the same bits. */
typedef struct { double num, den, var, bnd; } kq_stats;
static void kq_case(const gguf_block *gb, int64_t rows, int64_t cols, int n, int intx, kq_stats *st) {
    const kiln_wformat f = gb->f;
    const int A = gb->elems; /* columns per activation scale */
    kiln_weight w, wt;
    uint8_t *d = gguf_random(gb, &w, rows, cols);
    /* the current ISA's tile layout where it has one (K16: Q4_K / Q5_K / Q6_K on AVX-512): a tiled
     * copy computes Y, the checkpoint-layout weight the reference and the model */
    uint8_t *dt = NULL;
    wt = w;
    if (kiln_weight_prefers_tiled(&w, kiln_kernels_current())) {
        dt = malloc(w.row_bytes * (size_t)rows);
        assert_non_null(dt);
        wt.data = dt;
        if (n == 1) { /* in place, and (other cases) straight from the checkpoint bytes */
            memcpy(dt, d, w.row_bytes * (size_t)rows);
            assert_int_equal(kiln_weight_tile(&wt, dt, NULL, kiln_weight_prefers_tiled(&w, kiln_kernels_current())), 0);
        } else {
            assert_int_equal(kiln_weight_tile_copy(&wt, d, dt, NULL, kiln_weight_prefers_tiled(&w, kiln_kernels_current())), 0);
        }
        assert_true(wt.tiled || rows < 16);
        uint8_t *row_t = malloc(w.row_bytes);
        assert_non_null(row_t);
        for (int64_t r = 0; r < rows; r++) { /* the layout is a permutation that gathers back */
            kiln_weight_row_gather(&wt, r, row_t);
            assert_memory_equal(row_t, d + (size_t)r * w.row_bytes, w.row_bytes);
        }
        free(row_t);
    }
    float *X = make_x(n, cols), *Y = malloc(sizeof(float) * (size_t)(n * rows)), *R = malloc(sizeof(float) * (size_t)(n * rows));
    float *Y1 = malloc(sizeof(float) * (size_t)rows), *row = malloc(sizeof(float) * (size_t)cols), *dx = malloc(sizeof(float) * (size_t)(n * cols / A));
    int8_t *qx = malloc((size_t)n * (size_t)cols);
    assert_non_null(qx);
    assert_non_null(Y); assert_non_null(R); assert_non_null(Y1); assert_non_null(row); assert_non_null(dx);
    if (intx)
        for (size_t i = 0; i < (size_t)n * (size_t)cols; i++) X[i] = (i % (size_t)A == 7) ? ((rnd32() & 1) ? 127.0f : -127.0f) : (float)((int)(rnd32() % 255) - 127);
    if (A == 256)
        for (int64_t s = 0; s < n * cols / 256; s++) kiln_quant_x256(X + 256 * s, qx + 256 * s, &dx[s]);
    else
        kiln_quant_x32(X, (int64_t)n * cols, qx, dx);
    kiln_matmul(&wt, X, Y, n);
    for (int i = 0; i < n; i++) kiln_gemv_ref(&w, X + (size_t)i * (size_t)cols, R + (size_t)i * (size_t)rows, 0, rows);
    const int simd = kiln_kernels_current() != KILN_ISA_SCALAR;
    for (int i = 0; n > 1 && i < n; i++) { /* batch-independent: token i alone gives the same bits */
        kiln_matmul(&wt, X + (size_t)i * (size_t)cols, Y1, 1);
        assert_memory_equal(Y1, Y + (size_t)i * (size_t)rows, sizeof(float) * (size_t)rows);
    }
    if (rows > 8) { /* a row range cutting tile groups gives each row the bits of the whole */
        float *Yr = malloc(sizeof(float) * (size_t)(n * rows));
        assert_non_null(Yr);
        kiln_matmul_rows(&wt, X, Yr, n, 5, rows - 3);
        for (int i = 0; i < n; i++)
            assert_memory_equal(Yr + (size_t)i * (size_t)rows + 5, Y + (size_t)i * (size_t)rows + 5, sizeof(float) * (size_t)(rows - 8));
        free(Yr);
    }
    for (int64_t r = 0; r < rows; r++) {
        kiln_weight_row_f32(&w, r, row);
        float mx = 0;
        for (int64_t c = 0; c < cols; c++) mx = fmaxf(mx, fabsf(row[c]));
        for (int i = 0; i < n; i++) {
            const float *xi = X + (size_t)i * (size_t)cols;
            double a = 0, ah = 0, qb = 0, v = 0, ym = 0;
            for (int64_t c = 0; c < cols; c++) {
                const double dq = dx[(size_t)i * (size_t)(cols / A) + (size_t)(c / A)];
                const double xh = (double)qx[(size_t)i * (size_t)cols + (size_t)c] * dq;
                a += (fabs(row[c]) + mx) * fabs(xi[c]);
                ah += (fabs(row[c]) + mx) * fabs(xh);
                ym += (double)row[c] * xh;
                qb += fabs(row[c]) * dq / 2;
                v += (double)row[c] * row[c] * dq * dq / 12;
            }
            const size_t kk = (size_t)i * (size_t)rows + (size_t)r;
            const double bound = 4.0 * (double)(cols + 16) * 0x1p-24 * a + (simd && !intx ? qb : 0);
            const double bm = 4.0 * (double)(cols + 16) * 0x1p-24 * ah;
            if (simd && fabs((double)Y[kk] - ym) > bm) {
                fprintf(stderr, "%s %s rows %lld cols %lld n %d: y[%d][%lld] = %.9g, int8 model %.9g, bound %.3g\n",
                        kiln_isa_name(kiln_kernels_current()), kiln_wformat_name(f), (long long)rows, (long long)cols, n, i, (long long)r, Y[kk], ym, bm);
                fail();
            }
            st->bnd += bound * bound;
            if (!isfinite(Y[kk]) || fabs((double)Y[kk] - R[kk]) > bound) {
                fprintf(stderr, "%s %s rows %lld cols %lld n %d intx %d: y[%d][%lld] = %.9g, ref %.9g, bound %.3g\n",
                        kiln_isa_name(kiln_kernels_current()), kiln_wformat_name(f), (long long)rows, (long long)cols, n, intx, i, (long long)r,
                        Y[kk], R[kk], bound);
                fail();
            }
            st->num += ((double)Y[kk] - R[kk]) * ((double)Y[kk] - R[kk]);
            st->den += (double)R[kk] * R[kk];
            st->var += v;
        }
    }
    free(d); free(dt); free(X); free(Y); free(R); free(Y1); free(row); free(dx); free(qx);
}
static void kq_all(const char *name, int simd) {
    for (int fi = 0; fi < N_GGUF_BLOCKS; fi++) {
        const gguf_block *gb = &gguf_blocks[fi];
        kq_stats si = {0, 0, 0, 0}, sg = {0, 0, 0, 0};
        for (int64_t rows = 1; rows <= 49; rows += 16) /* 1, 17, 33, 49: tile groups and rows past them */
            for (int64_t cols = gb->elems == 32 ? 96 : 256; cols <= 768; cols += 512) /* 96, 608 / 256, 768 */
                for (int n = 1; n <= 17; n += 8) {
                    kq_case(gb, rows, cols, n, 1, &si);
                    kq_case(gb, rows, cols, n, 0, &sg);
                }
        kq_case(gb, 1031, 1024, 1, 0, &sg); /* threaded: row chunks over many rows */
        fprintf(stderr, "%-10s %-6s NMSE: integer x %.3g (bound 1e-09); Gaussian x %.3g (expected %.3g, bound %.3g)\n", name,
                kiln_wformat_name(gb->f), si.num / si.den, sg.num / sg.den, simd ? sg.var / sg.den : 0.0, simd ? sg.bnd / sg.den : 1e-9);
        assert_true(si.num / si.den <= 1e-9);
        assert_true(sg.num / sg.den <= (simd ? sg.bnd / sg.den : 1e-9));
    }
}
static void test_kquants(void **s) {
    (void)s;
    for (int k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        if (isas[k] == KILN_ISA_AVX2) { /* both AVX2 forms (AVX-VNNI where the CPU has it) */
            const int was = kiln_kernels_avx_vnni(1), vnni = kiln_kernels_avx_vnni(1);
            for (int v = vnni; v >= 0; v--) {
                kiln_kernels_avx_vnni(v);
                kiln_kernels_select(KILN_ISA_AVX2);
                kq_all(v ? "avx2+vnni" : "avx2", 1);
            }
            kiln_kernels_avx_vnni(was);
            continue;
        }
        kiln_kernels_select(isas[k]);
        kq_all(kiln_isa_name(isas[k]), isas[k] != KILN_ISA_SCALAR);
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* AVX2: the AVX-VNNI K-quant kernels give the vpmaddubsw kernels' bits (GEMV and GEMM). */
static void test_kquants_avx_vnni_exact(void **s) {
    (void)s;
    const int was = kiln_kernels_avx_vnni(1), cpu_has = kiln_kernels_avx_vnni(1);
    if (!kiln_cpu_supports(KILN_ISA_AVX2) || !cpu_has) { kiln_kernels_avx_vnni(was); skip(); return; }
    for (int fi = 0; fi < N_GGUF_BLOCKS; fi++)
        for (int n = 1; n <= 6; n += 5) {
            const int64_t rows = 37, cols = 768;
            kiln_weight w;
            uint8_t *d = gguf_random(&gguf_blocks[fi], &w, rows, cols);
            float *X = make_x(n, cols), Yv[37 * 6], Ym[37 * 6];
            /* and in the 16-row interleave where the AVX2 kernels read it (the super-block types) */
            kiln_weight wt = w;
            uint8_t *dt = malloc(w.row_bytes * (size_t)rows);
            assert_non_null(dt);
            assert_int_equal(kiln_weight_tile_copy(&wt, d, dt, NULL, KILN_TILE_GROUPS), 0);
            for (int tiled = 0; tiled < 2; tiled++) {
                const kiln_weight *wk = tiled ? &wt : &w;
                if (tiled && !wt.tiled) continue;
                kiln_kernels_avx_vnni(1);
                kiln_kernels_select(KILN_ISA_AVX2);
                kiln_matmul(wk, X, Yv, n);
                kiln_kernels_avx_vnni(0);
                kiln_kernels_select(KILN_ISA_AVX2);
                kiln_matmul(wk, X, Ym, n);
                assert_memory_equal(Yv, Ym, sizeof(float) * (size_t)(rows * n));
            }
            free(X); free(d); free(dt);
        }
    kiln_kernels_avx_vnni(was);
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* The 16-row interleave kernels (AVX2 and AVX-512; Q8_0, Q4_0) against a scalar model
 * of their arithmetic, bit for bit: per (row, token) and 32-column block, the exact integer dot of the
 * signed weights and the activation's int8 values (kiln_quant_x32), converted to f32, times
 * (weight scale × activation scale) rounded once, fused-multiply-added onto the row's sum in block
 * order. Any indexing slip (a scale of the wrong group or row, a vector of the wrong columns) breaks
 * this even where it stays inside the reference's error bound. Rows 37: two groups and 5 rows left in
 * checkpoint layout (those against the untiled kernel's result); n = 1 (GEMV) and n = 11 (GEMM). */
static int32_t q16_weight_int(const tweight *t, const uint8_t *rowbytes, int64_t c) {
    switch (t->w.fmt) {
    case KILN_WF_Q8_0: return (int8_t)rowbytes[34 * (c / 32) + 2 + c % 32];
    case KILN_WF_Q4_0: {
        const uint8_t v = rowbytes[18 * (c / 32) + 2 + c % 16];
        return (int32_t)((c % 32 < 16 ? v & 15 : v >> 4)) - 8;
    }
    default: return (int32_t)((rowbytes[c / 2] >> (4 * (c & 1))) & 15) - 8;
    }
}
static float q16_model(const tweight *t, const uint8_t *data0, const uint16_t *scales0, int64_t r, const int8_t *xq, const float *xd) {
    const kiln_weight *w = &t->w;
    const uint8_t *row = data0 + (size_t)r * w->row_bytes;
    float acc = 0.0f;
    for (int64_t b = 0; b < w->cols / 32; b++) {
        int32_t dot = 0;
        for (int64_t c = 32 * b; c < 32 * b + 32; c++) dot += q16_weight_int(t, row, c) * xq[c];
        float ws;
        if (w->fmt == KILN_WF_INT4_GROUP) ws = kiln_bf16_to_f32(scales0[r * (w->cols / w->block) + 32 * b / w->block]);
        else {
            uint16_t h;
            memcpy(&h, row + (w->fmt == KILN_WF_Q8_0 ? 34 : 18) * b, 2);
            ws = kiln_f16_to_f32(h);
        }
        acc = fmaf((float)dot, ws * xd[b], acc);
    }
    return acc;
}
static void test_q16_kernel_exact(void **s) {
    (void)s;
    const int vnni_was = kiln_kernels_avx_vnni(1);
    /* AVX2 and AVX-512 read the same layout, to the same bits; pass 3 is AVX2 again with its other
     * dot form (vpmaddubsw where AVX-VNNI was used, or the other way: gemv_avxvnni.c) */
    for (int pass = 1; pass < 4; pass++) {
    const int isa = pass == 3 ? 1 : pass;
    kiln_kernels_avx_vnni(pass == 3 ? !vnni_was : vnni_was);
    if (!kiln_cpu_supports(isas[isa])) { fprintf(stderr, "skip %s: not supported by this CPU\n", kiln_isa_name(isas[isa])); continue; }
    kiln_kernels_select(isas[isa]);
    const struct { kiln_wformat f; int block; int64_t cols; } cs[] = {
        {KILN_WF_Q8_0, 32, 96}, {KILN_WF_Q8_0, 32, 1056}, {KILN_WF_Q4_0, 32, 96}, {KILN_WF_Q4_0, 32, 1056}, {KILN_WF_Q4_0, 32, 5632 + 96},
    };
    const int64_t rows = 37;
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++)
        for (int n = 1; n <= 11; n += 10) {
            const int64_t cols = cs[k].cols;
            tweight t = make_weight(cs[k].f, rows, cols, cs[k].block);
            const size_t db = t.w.row_bytes * (size_t)rows, sb = cs[k].f == KILN_WF_INT4_GROUP ? 2 * (size_t)(rows * (cols / cs[k].block)) : 0;
            uint8_t *data0 = malloc(db);
            uint16_t *scales0 = malloc(sb + 2);
            assert_non_null(data0); assert_non_null(scales0);
            memcpy(data0, t.data, db);
            if (sb) memcpy(scales0, t.scales, sb);
            float *X = make_x(n, cols), *Yu = malloc(sizeof(float) * (size_t)(n * rows)), *Yt = malloc(sizeof(float) * (size_t)(n * rows));
            int8_t *xq = malloc((size_t)cols);
            float *xd = malloc(sizeof(float) * (size_t)(cols / 32));
            assert_non_null(Yu); assert_non_null(Yt); assert_non_null(xq); assert_non_null(xd);
            kiln_matmul_rows(&t.w, X, Yu, n, 0, rows);
            tile_and_check(&t);
            assert_true(t.w.tiled);
            kiln_matmul_rows(&t.w, X, Yt, n, 0, rows);
            for (int i = 0; i < n; i++) {
                kiln_quant_x32(X + (size_t)i * (size_t)cols, cols, xq, xd);
                for (int64_t r = 0; r < rows; r++) {
                    const float got = Yt[(size_t)i * (size_t)rows + (size_t)r];
                    const float want = r < 32 ? q16_model(&t, data0, scales0, r, xq, xd) : Yu[(size_t)i * (size_t)rows + (size_t)r];
                    if (memcmp(&got, &want, sizeof got) != 0) {
                        fprintf(stderr, "%s g%d cols %lld n %d: token %d row %lld: %.9g, model %.9g\n", kiln_wformat_name(cs[k].f), cs[k].block,
                                (long long)cols, n, i, (long long)r, got, want);
                        fail();
                    }
                }
            }
            free(X); free(Yu); free(Yt); free(xq); free(xd); free(data0); free(scales0); free_weight(&t);
        }
    }
    kiln_kernels_avx_vnni(vnni_was);
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* AMX (gemv_isa.h kiln_kernels_amx): the tile kernel over the 16-row interleave (kernels/q16_amx.h)
 * must give the AVX-512 kernel's results bit for bit, and the scalar model of that arithmetic
 * (q16_model) for the rows in whole groups: on every AVX-512 CPU through the emulated tile
 * instructions, and on the CPU's own tiles where it has AMX-INT8 (skipped with a message where not).
 * Steps of 16, 33 and 70 tokens (whole 16s on tiles, the rest on vpdpbusd); Q8_0, Q4_0 and INT4 g32;
 * 37 rows (two whole groups, five rows in checkpoint layout). The tile blocks run are counted, so the
 * path is known to have been taken. */
static void test_q16_amx_exact(void **s) {
    (void)s;
    if (!kiln_cpu_supports(KILN_ISA_AVX512)) { skip(); return; }
    kiln_kernels_select(KILN_ISA_AVX512);
    const int was = kiln_kernels_amx(KILN_AMX_OFF);
    /* a CPU whose tiles disagreed with the emulation at start-up fails here, not skips */
    assert_int_equal(kiln_amx_check_failed(), 0);
    const int modes[] = {KILN_AMX_EMULATED, KILN_AMX_HW};
    for (int mi = 0; mi < 2; mi++) {
        if (modes[mi] == KILN_AMX_HW && !kiln_amx_available()) {
            fprintf(stderr, "skip AMX hardware: this CPU (or its OS) offers no AMX-INT8 tiles; the emulated tiles ran\n");
            continue;
        }
        const struct { kiln_wformat f; int64_t cols; } cs[] = {
            {KILN_WF_Q8_0, 96}, {KILN_WF_Q8_0, 1056}, {KILN_WF_Q4_0, 288}, {KILN_WF_Q4_0, 1056}, {KILN_WF_INT4_GROUP, 1056},
        };
        const int64_t rows = 37;
        for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
            const int ns[] = {16, 33, 70};
            for (int ni = 0; ni < 3; ni++) {
                const int n = ns[ni];
                const int64_t cols = cs[k].cols;
                tweight t = make_weight(cs[k].f, rows, cols, 32);
                const size_t db = t.w.row_bytes * (size_t)rows, sb = cs[k].f == KILN_WF_INT4_GROUP ? 2 * (size_t)(rows * (cols / 32)) : 0;
                uint8_t *data0 = malloc(db);
                uint16_t *scales0 = malloc(sb + 2);
                assert_non_null(data0); assert_non_null(scales0);
                memcpy(data0, t.data, db);
                if (sb) memcpy(scales0, t.scales, sb);
                tile_layout = cs[k].f == KILN_WF_INT4_GROUP ? KILN_TILE_Q16 : KILN_TILE_GROUPS;
                tile_and_check(&t);
                tile_layout = KILN_TILE_GROUPS;
                assert_true(t.w.tiled);
                float *X = make_x(n, cols), *Yv = malloc(sizeof(float) * (size_t)(n * rows)), *Ya = malloc(sizeof(float) * (size_t)(n * rows));
                int8_t *xq = malloc((size_t)cols);
                float *xd = malloc(sizeof(float) * (size_t)(cols / 32));
                assert_non_null(Yv); assert_non_null(Ya); assert_non_null(xq); assert_non_null(xd);
                kiln_kernels_amx(KILN_AMX_OFF);
                kiln_matmul_rows(&t.w, X, Yv, n, 0, rows);
                kiln_kernels_amx(modes[mi]);
                const uint64_t b0 = kiln_q16_amx_blocks();
                kiln_matmul_rows(&t.w, X, Ya, n, 0, rows);
                assert_int_equal(kiln_q16_amx_blocks() - b0, (uint64_t)(2 * (n / 16)) * (uint64_t)(cols / 32));
                kiln_kernels_amx(KILN_AMX_OFF);
                for (int i = 0; i < n; i++) {
                    kiln_quant_x32(X + (size_t)i * (size_t)cols, cols, xq, xd);
                    for (int64_t r = 0; r < rows; r++) {
                        const float got = Ya[(size_t)i * (size_t)rows + (size_t)r], avx = Yv[(size_t)i * (size_t)rows + (size_t)r];
                        const float model = r < 32 ? q16_model(&t, data0, scales0, r, xq, xd) : avx;
                        if (memcmp(&got, &avx, sizeof got) != 0 || memcmp(&got, &model, sizeof got) != 0) {
                            fprintf(stderr, "AMX %s %s cols %lld n %d: token %d row %lld: %.9g, AVX-512 %.9g, model %.9g\n",
                                    modes[mi] == KILN_AMX_HW ? "tiles" : "emulated", kiln_wformat_name(cs[k].f), (long long)cols, n, i,
                                    (long long)r, got, avx, model);
                            fail();
                        }
                    }
                }
                free(X); free(Yv); free(Ya); free(xq); free(xd); free(data0); free(scales0); free_weight(&t);
            }
        }
    }
    /* Q4_K / Q5_K / Q6_K / Q2_K / Q3_K / IQ4_XS in the super-block interleave: the same comparison with the AVX-512 kernel, bit for
     * bit (random blocks; k16_tile itself is held to the reference by test_kquants) */
    for (int mi = 0; mi < 2; mi++) {
        if (modes[mi] == KILN_AMX_HW && !kiln_amx_available()) continue;
        const kiln_wformat kf[] = {KILN_WF_Q4_K, KILN_WF_Q5_K, KILN_WF_Q6_K, KILN_WF_Q2_K, KILN_WF_Q3_K, KILN_WF_IQ4_XS};
        for (int k = 0; k < (int)(sizeof kf / sizeof *kf); k++) {
            const gguf_block *gb = NULL;
            for (size_t i = 0; i < sizeof gguf_blocks / sizeof *gguf_blocks; i++)
                if (gguf_blocks[i].f == kf[k]) gb = &gguf_blocks[i];
            assert_non_null(gb);
            for (int ci = 0; ci < 2; ci++) {
                const int64_t rows = 37, cols = ci ? 768 : 256;
                kiln_weight w;
                uint8_t *d = gguf_random(gb, &w, rows, cols);
                uint8_t *dt = malloc(w.row_bytes * (size_t)rows);
                assert_non_null(dt);
                kiln_weight wt = w;
                wt.data = dt;
                assert_int_equal(kiln_weight_tile_copy(&wt, d, dt, NULL, kiln_weight_prefers_tiled(&w, KILN_ISA_AVX512)), 0);
                assert_true(wt.tiled);
                const int ns[] = {16, 33, 70};
                for (int ni = 0; ni < 3; ni++) {
                    const int n = ns[ni];
                    float *X = make_x(n, cols), *Yv = malloc(sizeof(float) * (size_t)(n * rows)), *Ya = malloc(sizeof(float) * (size_t)(n * rows));
                    assert_non_null(Yv); assert_non_null(Ya);
                    kiln_kernels_amx(KILN_AMX_OFF);
                    kiln_matmul_rows(&wt, X, Yv, n, 0, rows);
                    kiln_kernels_amx(modes[mi]);
                    const uint64_t b0 = kiln_q16_amx_blocks();
                    kiln_matmul_rows(&wt, X, Ya, n, 0, rows);
                    assert_int_equal(kiln_q16_amx_blocks() - b0, (uint64_t)(2 * (n / 16)) * (uint64_t)(cols / 32));
                    kiln_kernels_amx(KILN_AMX_OFF);
                    if (memcmp(Ya, Yv, sizeof(float) * (size_t)(n * rows)) != 0) {
                        for (int64_t e = 0; e < n * rows; e++)
                            if (memcmp(&Ya[e], &Yv[e], sizeof(float)) != 0) {
                                fprintf(stderr, "AMX %s %s cols %lld n %d: token %lld row %lld: %.9g, AVX-512 %.9g\n",
                                        modes[mi] == KILN_AMX_HW ? "tiles" : "emulated", kiln_wformat_name(kf[k]), (long long)cols, n,
                                        (long long)(e / rows), (long long)(e % rows), Ya[e], Yv[e]);
                                break;
                            }
                        fail();
                    }
                    free(X); free(Yv); free(Ya);
                }
                free(d); free(dt);
            }
        }
    }
    assert_int_equal(kiln_amx_emu_faults(), 0);
    kiln_kernels_amx(was);
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* INT4 on AVX-512: the tiled weight goes through the 4-row tile kernel, the same weight untiled
 * through the general row kernel; both accumulate in the same order, so the outputs must be equal
 * bit for bit (an indexing slip in either, e.g. a scale of the wrong row or chunk, breaks this
 * even where it stays inside the reference's error bound). Group 32, 64, 128 (u = 4, 2, 1 groups
 * per 128-column chunk), with and without a column tail, rows not a multiple of 4. */
static void test_int4_tile_kernel_exact(void **s) {
    (void)s;
    if (!kiln_cpu_supports(KILN_ISA_AVX512)) { skip(); return; }
    kiln_kernels_select(KILN_ISA_AVX512);
    const int64_t cols[] = {128, 640, 672, 5632 + 96};
    const int blocks[] = {32, 64, 128};
    for (int b = 0; b < 3; b++)
        for (int c = 0; c < 4; c++) {
            if (cols[c] % blocks[b]) continue;
            const int64_t rows = 22;
            tweight t = make_weight(KILN_WF_INT4_GROUP, rows, cols[c], blocks[b]);
            float *X = make_x(1, cols[c]), Yu[22], Yt[22];
            kiln_matmul_rows(&t.w, X, Yu, 1, 0, rows);
            tile_and_check(&t);
            assert_true(t.w.tiled);
            kiln_matmul_rows(&t.w, X, Yt, 1, 0, rows);
            assert_memory_equal(Yu, Yt, sizeof Yu);
            free(X); free_weight(&t);
        }
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* Few-token steps (gemv.h: KILN_GEMV_FEW_MAX, F32 / F16 / BF16 up to KILN_GEMV_FEW_MAX_FLOAT, FP8 up
 * to KILN_GEMV_SMALL_N_FP8) on the AVX-512 table (few-token kernels for F32, F16, BF16, FP8 in the
 * exact form, INT4) and the AVX2 table in both dot forms (F32, F16, BF16, INT4 — whose GEMM shares
 * the arithmetic at every n — and FP8 through its GEMV once per token): each token of an n-token
 * matmul gives exactly its 1-token GEMV result, threaded and for row sub-ranges that cut 4-row
 * groups, untiled and tiled, with column tails and partial scale blocks. */
static void few_token_exact(kiln_isa isa) {
    kiln_kernels_select(isa);
    const int was = kiln_kernels_fp8_exact(1); /* the 1-token FP8 GEMV in the form the few-token steps use */
    static const struct { kiln_wformat f; int64_t cols; int block; int tiled; } cases[] = {
        {KILN_WF_F32, 300, 0, 0},          {KILN_WF_F16, 200, 0, 0},          {KILN_WF_BF16, 1000, 0, 0},
        {KILN_WF_BF16, 48, 0, 0},          {KILN_WF_FP8_BLOCK, 320, 128, 0},  {KILN_WF_FP8_BLOCK, 1000, 128, 1},
        {KILN_WF_FP8_BLOCK, 256, 64, 1},   {KILN_WF_INT4_GROUP, 160, 32, 0},  {KILN_WF_INT4_GROUP, 672, 32, 1},
        {KILN_WF_INT4_GROUP, 640, 128, 1}, {KILN_WF_INT4_GROUP, 2048, 64, 1}, {KILN_WF_INT4_GROUP, 512, 256, 1},
        {KILN_WF_INT4_GROUP, 672, 32, KILN_TILE_Q16}, {KILN_WF_INT4_GROUP, 96, 32, KILN_TILE_Q16},
    };
    static const int ns[] = {2, 3, 4, 5, 7, 8, 9, 16};
    const int64_t rows = 37;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tweight t = make_weight(cases[c].f, rows, cases[c].cols, cases[c].block);
        tile_layout = cases[c].tiled == KILN_TILE_Q16 ? KILN_TILE_Q16 : KILN_TILE_GROUPS;
        if (cases[c].tiled) tile_and_check(&t);
        tile_layout = KILN_TILE_GROUPS;
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int n = ns[k];
            const int fl = cases[c].f == KILN_WF_F32 || cases[c].f == KILN_WF_F16 || cases[c].f == KILN_WF_BF16;
            /* BF16 up to KILN_GEMV_FEW_MAX: with fp8_exact(1) no table here has the BF16-dot GEMM (gemv.c small_n) */
            const int fl_max = cases[c].f == KILN_WF_BF16 ? KILN_GEMV_FEW_MAX : KILN_GEMV_FEW_MAX_FLOAT;
            const int few = n <= (cases[c].f == KILN_WF_FP8_BLOCK ? KILN_GEMV_SMALL_N_FP8 : fl ? fl_max : KILN_GEMV_FEW_MAX);
            if (!few && cases[c].f != KILN_WF_INT4_GROUP) continue; /* past the few-token steps: the float GEMMs */
            float *X = make_x(n, cases[c].cols), *Y = malloc((size_t)n * rows * sizeof(float)), *Ys = malloc((size_t)n * rows * sizeof(float));
            float one[37], ones[37];
            assert_non_null(Y); assert_non_null(Ys);
            for (size_t i = 0; i < (size_t)n * rows; i++) Ys[i] = NAN;
            kiln_matmul(&t.w, X, Y, n);
            kiln_matmul_rows(&t.w, X, Ys, n, 5, 30); /* starts and ends inside 4-row groups */
            for (int i = 0; i < n; i++) {
                kiln_matmul(&t.w, X + (size_t)i * (size_t)cases[c].cols, one, 1);
                for (int64_t r = 0; r < rows; r++) ones[r] = r >= 5 && r < 30 ? one[r] : NAN;
                if (memcmp(one, Y + (size_t)i * rows, sizeof one) != 0 || memcmp(ones, Ys + (size_t)i * rows, sizeof ones) != 0) {
                    fprintf(stderr, "few-token %s %s g%d cols %lld%s n=%d: token %d differs from its 1-token GEMV\n", kiln_isa_name(isa), kiln_wformat_name(cases[c].f),
                            cases[c].block, (long long)cases[c].cols, cases[c].tiled ? " tiled" : "", n, i);
                    fail();
                }
            }
            free(X); free(Y); free(Ys);
        }
        free_weight(&t);
    }
    kiln_kernels_fp8_exact(was);
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* Steps marked as n decodes (kiln_kctx.decode_steps: speculative verification) on the BF16-dot FP8
 * form (AVX512_BF16 CPUs): each token's result is its 1-token BF16-dot GEMV's bit for bit, plain
 * and tiled weights, 2..16 tokens; unmarked steps of the same size keep the exact form. */
static void few_token_decode_steps_fp8(void) {
    kiln_kctx cx;
    kiln_kctx_init(&cx, KILN_ISA_AVX512, 1, KILN_FP8_BF16);
    if (cx.fp8_exact) { fprintf(stderr, "skip decode-step FP8 form: no AVX512_BF16\n"); return; }
    static const struct { int64_t cols; int block; int tiled; } cases[] = {{320, 128, 0}, {1000, 128, 1}, {256, 64, 1}};
    static const int ns[] = {2, 3, 5, 8, 16};
    const int64_t rows = 37;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tweight t = make_weight(KILN_WF_FP8_BLOCK, rows, cases[c].cols, cases[c].block);
        if (cases[c].tiled) tile_and_check(&t);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int n = ns[k];
            float *X = make_x(n, cases[c].cols), *Y = malloc((size_t)n * rows * sizeof(float)), *Ye = malloc((size_t)n * rows * sizeof(float));
            float one[37];
            assert_non_null(Y); assert_non_null(Ye);
            cx.decode_steps = 1;
            kiln_cx_matmul(&cx, &t.w, X, Y, n);
            cx.decode_steps = 0;
            kiln_cx_matmul(&cx, &t.w, X, Ye, n);
            int differs_exact = 0;
            for (int i = 0; i < n; i++) {
                kiln_cx_matmul(&cx, &t.w, X + (size_t)i * (size_t)cases[c].cols, one, 1);
                if (memcmp(one, Y + (size_t)i * rows, sizeof one) != 0) {
                    fprintf(stderr, "decode-step FP8 cols %lld g%d%s n=%d: token %d differs from its 1-token BF16-dot GEMV\n", (long long)cases[c].cols,
                            cases[c].block, cases[c].tiled ? " tiled" : "", n, i);
                    fail();
                }
                differs_exact |= memcmp(one, Ye + (size_t)i * rows, sizeof one) != 0;
            }
            assert_true(differs_exact); /* the unmarked step is the exact form: another rounding of x */
            free(X); free(Y); free(Ye);
        }
        free_weight(&t);
    }
}

static void test_few_token_exact(void **s) {
    (void)s;
    if (kiln_cpu_supports(KILN_ISA_AVX512)) few_token_decode_steps_fp8();
    if (kiln_cpu_supports(KILN_ISA_AVX512)) few_token_exact(KILN_ISA_AVX512);
    else fprintf(stderr, "skip avx512: not supported by this CPU\n");
    if (!kiln_cpu_supports(KILN_ISA_AVX2)) { fprintf(stderr, "skip avx2: not supported by this CPU\n"); return; }
    const int was = kiln_kernels_avx_vnni(0); /* the AVX2 table's two INT4 dot forms (AVX-VNNI where the CPU has it) */
    few_token_exact(KILN_ISA_AVX2);
    kiln_kernels_avx_vnni(1);
    few_token_exact(KILN_ISA_AVX2);
    kiln_kernels_avx_vnni(was);
    kiln_kernels_select(KILN_ISA_AUTO);
}
/* kiln_matmul_many: weights of different formats, shapes and layouts sharing one X, in one call,
 * each against its own reference (n = 1 decode and n = 5 prefill), on every ISA. */
static void test_matmul_many(void **s) {
    (void)s;
    const int64_t cols = 384;
    for (int k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        for (int v = 0; v < 4; v++) {
            const int n = v < 2 ? 1 : 5;
            /* t[4] and t[5] have the same preparation as t[0] and t[1] (decode shares it), but where
             * t[0] is in KILN_TILE_Q16 (INT4's 16-row layout prepares Q4_0's way, t[4] untiled not) */
            tile_layout = v & 1 ? KILN_TILE_Q16 : KILN_TILE_GROUPS;
            tweight t[6] = {make_weight(KILN_WF_INT4_GROUP, 130, cols, 32), make_weight(KILN_WF_FP8_BLOCK, 33, cols, 128),
                            make_weight(KILN_WF_BF16, 7, cols, 0), make_weight(KILN_WF_INT4_GROUP, 5, cols, 96),
                            make_weight(KILN_WF_INT4_GROUP, 9, cols, 32), make_weight(KILN_WF_FP8_BLOCK, 6, cols, 128)};
            float *X = make_x(n, cols), *Y[6], *R[6], *B[6];
            const kiln_weight *ws[6];
            for (int w = 0; w < 6; w++) {
                const int64_t rows = t[w].w.rows;
                Y[w] = malloc(sizeof(float) * (size_t)(n * rows)); R[w] = malloc(sizeof(float) * (size_t)(n * rows));
                B[w] = malloc(sizeof(float) * (size_t)(n * rows));
                for (int i = 0; i < n; i++) {
                    kiln_gemv_ref(&t[w].w, X + (size_t)i * cols, R[w] + (size_t)i * rows, 0, rows);
                    elem_bounds(&t[w].w, X + (size_t)i * cols, B[w] + (size_t)i * rows, n);
                }
                for (int64_t i = 0; i < n * rows; i++) Y[w][i] = NAN;
                ws[w] = &t[w].w;
            }
            tile_and_check(&t[0]);
            tile_layout = KILN_TILE_GROUPS;
            kiln_matmul_many(ws, Y, 6, X, n);
            for (int w = 0; w < 6; w++) {
                check_out("matmul_many", isas[k], &t[w], n, Y[w], R[w], B[w], 0, t[w].w.rows);
                free(Y[w]); free(R[w]); free(B[w]); free_weight(&t[w]);
            }
            free(X);
        }
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}
static void test_q8_0(void **s) { (void)s; int64_t c[] = {32, 96, 288}; int b[] = {32}; run_format(KILN_WF_Q8_0, c, 3, b, 1); }
static void test_q4_0(void **s) { (void)s; int64_t c[] = {32, 96, 288}; int b[] = {32}; run_format(KILN_WF_Q4_0, c, 3, b, 1); }

/* An INT4 group size the SIMD kernels do not take (96) still gives the reference's answer. */
static void test_int4_unusual_group(void **s) {
    (void)s;
    kiln_kernels_select(KILN_ISA_AUTO);
    tweight t = make_weight(KILN_WF_INT4_GROUP, 5, 192, 96);
    assert_false(kiln_matmul_is_fast(&t.w));
    float *X = make_x(1, 192), Y[5], R[5];
    kiln_matmul(&t.w, X, Y, 1);
    kiln_gemv_ref(&t.w, X, R, 0, 5);
    for (int i = 0; i < 5; i++) assert_true(Y[i] == R[i]);
    free(X); free_weight(&t);
}

/* Weights of several MiB: kiln_matmul hands out row chunks dynamically (and software prefetch
 * runs ahead within each chunk); checked with the same bounds. */
static void test_large_threaded(void **s) {
    (void)s;
    static const struct { kiln_wformat f; int64_t rows, cols; int block; } cases[] = {
        {KILN_WF_F32, 520, 1024, 0}, {KILN_WF_BF16, 1100, 1024, 0}, {KILN_WF_FP8_BLOCK, 2100, 1000, 128},
        {KILN_WF_INT4_GROUP, 4200, 1024, 32}, {KILN_WF_INT4_GROUP, 4200, 1024, 128}, {KILN_WF_Q4_0, 4000, 1024, 32},
    };
    for (int k = 1; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int n = 1; n <= 3; n += 2) check_case(isas[k], cases[c].f, cases[c].rows, cases[c].cols, cases[c].block, n);
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

/* With denormals-are-zero set (as -ffast-math programs do) the FP8 kernels switch to a path that
 * never produces denormals and stay within the same bounds (the fast path's exact f32 denormals
 * would read as 0). MXCSR is per thread: kiln_matmul_rows runs on this one. */
static void test_fp8_daz(void **s) {
    (void)s;
    unsigned int old = __builtin_ia32_stmxcsr();
    const int was_exact = kiln_kernels_fp8_exact(1); /* the exact paths (the BF16-dot one reads these codes as 0) */
    for (int k = 1; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        tweight t = make_weight(KILN_WF_FP8_BLOCK, 9, 300, 128);
        for (int i = 0; i < 9 * 300; i++) t.data[i] &= 0x87; /* exponent field 0: subnormal codes only */
        float *X = make_x(1, 300), Y[9], R[9], B[9];
        kiln_gemv_ref(&t.w, X, R, 0, 9);
        elem_bounds(&t.w, X, B, 1);
        __builtin_ia32_ldmxcsr(old | 0x8040); /* FTZ | DAZ */
        kiln_matmul_rows(&t.w, X, Y, 1, 0, 9);
        __builtin_ia32_ldmxcsr(old);
        for (int r = 0; r < 9; r++) assert_true(fabsf(Y[r] - R[r]) <= B[r]);
        free(X); free_weight(&t);
    }
    kiln_kernels_fp8_exact(was_exact);
    kiln_kernels_select(KILN_ISA_AUTO);
}

/* FP8 → Q8_0 for prompts' GEMMs on the int8 kernels (gemv_avx512.c kiln_fp8_q8_avx512, gemv_avx2.c
 * kiln_fp8_q8_avx2, each ISA the CPU has): rows
 * [3, 42) of a 42-row FP8 weight, in checkpoint and in 4-row tile layout (its last 2 rows untiled),
 * give byte for byte ggml's Q8_0 quantization (kiln_quantize_row_q8_0) of their exact values
 * fp8 × scale, laid out as kiln_weight_tile lays out a Q8_0 weight of 39 rows (two 16-row groups in
 * the interleave, seven rows as they are); and the driver takes that route for prompts
 * (kiln_cx_fp8_int8) as its mode says (never / from 48 tokens on the BF16 form, 32 on the f32 tables / always) — on the BF16 form, and on
 * the AVX2 and AVX-512 f32 tables where the exact form was not asked for — never for decodes nor
 * where the exact form was asked for. */
static void fp8_q8_requant_case(int64_t cols, int block);
static void test_fp8_q8_requant(void **s) {
    (void)s;
    if (!kiln_cpu_supports(KILN_ISA_AVX2)) { skip(); return; }
    fp8_q8_requant_case(384, 128);
    fp8_q8_requant_case(352, 32); /* a tail chunk in the 4-row tiles (352 % 64 = 32); rows in several scale rows */
}
static void fp8_q8_requant_case(int64_t cols, int block) {
    const int64_t rows = 42, r0 = 3, r1 = 42, nr = r1 - r0; /* rows 40, 41: past the 4-row tiles, in checkpoint order there */
    const size_t rb = (size_t)(cols / 32) * 34;
    tweight t = make_weight(KILN_WF_FP8_BLOCK, rows, cols, block);
    float *tile = malloc((size_t)cols * 4), *v = malloc((size_t)cols * 4);
    uint8_t *got = malloc(nr * rb), *want = malloc(nr * rb), *row = malloc((size_t)cols);
    assert_non_null(tile); assert_non_null(v); assert_non_null(got); assert_non_null(want); assert_non_null(row);
    const float *S = (const float *)t.scales;
    /* each ISA's form (AVX-512, AVX2) on each layout: checkpoint rows, then the 4-row tiles */
    for (int k = 0; k < 4; k++) {
        const int tiled = k / 2, isa = k % 2;
        if (k == 2) assert_int_equal(kiln_weight_tile(&t.w, t.data, t.scales, 1), 0);
        if (isa == 0 && !kiln_cpu_supports(KILN_ISA_AVX512)) continue;
        memset(got, 0xA5, nr * rb);
        (isa == 0 ? kiln_fp8_q8_avx512 : kiln_fp8_q8_avx2)(&t.w, r0, r1, tile, got);
        for (int64_t r = r0; r < r1; r++) {
            kiln_weight_row_gather(&t.w, r, row);
            for (int64_t c = 0; c < cols; c++) v[c] = kiln_fp8_e4m3_to_f32(row[c]) * S[(r / block) * ((cols + block - 1) / block) + c / block];
            kiln_quantize_row_q8_0(v, want + (size_t)(r - r0) * rb, cols);
        }
        kiln_weight q = {.fmt = KILN_WF_Q8_0, .rows = nr, .cols = cols, .data = want, .row_bytes = rb};
        assert_int_equal(kiln_weight_tile(&q, want, NULL, 1), 0);
        if (memcmp(got, want, nr * rb) != 0) {
            size_t i = 0;
            while (got[i] == want[i]) i++;
            fail_msg("%s, cols %lld block %d layout %d: byte %zu of the requantized rows is %u, Q8_0 + kiln_weight_tile give %u", isa ? "AVX2" : "AVX-512",
                     (long long)cols, block, tiled, i, got[i], want[i]);
        }
    }
    /* the route: a prompt's FP8 GEMM, not a decode step's, unless the exact form was asked for */
    kiln_kctx cx;
    const int was = kiln_kernels_fp8_prefill_int8(1);
    /* KILN_FP8_AUTO reads KILN_FP8_EXACT (which asks for the exact form): the cases below name the form */
    const char *env_exact = getenv("KILN_FP8_EXACT");
    char *saved_exact = env_exact ? strdup(env_exact) : NULL;
    unsetenv("KILN_FP8_EXACT");
    kiln_kctx_init(&cx, KILN_ISA_AVX2, 1, KILN_FP8_AUTO); /* the AVX2 tables: f32 tiles otherwise */
    assert_true(kiln_cx_fp8_int8(&cx, &t.w, 256));
    assert_true(kiln_cx_fp8_int8(&cx, &t.w, 32));
    assert_false(kiln_cx_fp8_int8(&cx, &t.w, 31));
    kiln_kctx_init(&cx, KILN_ISA_AVX2, 1, KILN_FP8_EXACT);
    assert_false(kiln_cx_fp8_int8(&cx, &t.w, 256)); /* asked for: exact f32 tiles */
    /* what `kiln bench` asks to pick the prompt's peak: the same decision */
    assert_true(kiln_fp8_prompt_int8(KILN_ISA_AVX2, KILN_FP8_AUTO, 512));
    assert_false(kiln_fp8_prompt_int8(KILN_ISA_AVX2, KILN_FP8_EXACT, 512));
    assert_false(kiln_fp8_prompt_int8(KILN_ISA_AVX2, KILN_FP8_AUTO, 24));
    if (!kiln_cpu_supports(KILN_ISA_AVX512)) goto done;
    kiln_kctx_init(&cx, KILN_ISA_AVX512, 1, KILN_FP8_AUTO);
    cx.kt = &kiln_ktable_avx512; /* an AVX-512 CPU without AVX512_BF16, the exact form not asked for */
    cx.fp8_exact = 1;
    cx.fp8_exact_asked = 0;
    assert_true(kiln_cx_fp8_int8(&cx, &t.w, 256));
    assert_true(kiln_cx_fp8_int8(&cx, &t.w, 32));
    assert_false(kiln_cx_fp8_int8(&cx, &t.w, 31));
    kiln_kctx_init(&cx, KILN_ISA_AVX512, 1, KILN_FP8_BF16);
    kiln_kernels_fp8_prefill_int8(0);
    assert_false(kiln_cx_fp8_int8(&cx, &t.w, 256)); /* never */
    kiln_kernels_fp8_prefill_int8(1); /* from 48 tokens on the BF16 form (32 on the f32 one) */
    assert_int_equal(kiln_cx_fp8_int8(&cx, &t.w, 256), !cx.fp8_exact);
    assert_int_equal(kiln_cx_fp8_int8(&cx, &t.w, 48), !cx.fp8_exact);
    if (!cx.fp8_exact) assert_false(kiln_cx_fp8_int8(&cx, &t.w, 47));
    assert_false(kiln_cx_fp8_int8(&cx, &t.w, 31));
    kiln_kernels_fp8_prefill_int8(2); /* every prompt GEMM */
    if (!cx.fp8_exact) { /* an AVX512_BF16 CPU */
        assert_true(kiln_cx_fp8_int8(&cx, &t.w, 64));
        assert_false(kiln_cx_fp8_int8(&cx, &t.w, 1));
        cx.decode_steps = 1;
        assert_false(kiln_cx_fp8_int8(&cx, &t.w, 64));
    }
    kiln_kctx_init(&cx, KILN_ISA_AVX512, 1, KILN_FP8_EXACT);
    assert_false(kiln_cx_fp8_int8(&cx, &t.w, 64)); /* the exact form stays exact */
done:
    if (saved_exact) setenv("KILN_FP8_EXACT", saved_exact, 1);
    free(saved_exact);
    kiln_kernels_fp8_prefill_int8(was);
    free(tile); free(v); free(got); free(want); free(row); free_weight(&t);
}

/* kiln_silu_mul (SwiGLU) on every ISA against double precision: within 4e-6 relative (libmvec's
 * expf is within 4 ulp; a divide, an add and a multiply round once each). */
static void test_silu_mul(void **s) {
    (void)s;
    static const int64_t ns[] = {0, 1, 7, 8, 16, 17, 100, 5632};
    for (int k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        for (int t = 0; t < 8; t++) {
            const int64_t n = ns[t];
            float *g = make_x(1, n), *u = make_x(1, n);
            double *ref = malloc((size_t)(n + 1) * sizeof *ref);
            assert_non_null(ref);
            for (int64_t i = 0; i < n; i++) {
                g[i] *= 6.0f; /* |g| up to ~30: both tails of the sigmoid */
                ref[i] = (double)g[i] / (1.0 + exp(-(double)g[i])) * (double)u[i];
            }
            kiln_silu_mul(g, u, n);
            for (int64_t i = 0; i < n; i++) assert_true(fabs(g[i] - ref[i]) <= 4e-6 * fabs(ref[i]) + 1e-37);
            assert_true(isnan(g[n])); /* nothing written past n */
            free(g); free(u); free(ref);
        }
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

/* kiln_argmax_f32 on every ISA equals the scalar greedy loop (first maximum, NaN never chosen, a
 * NaN at 0 keeps 0) on random vectors with ties, NaNs, ±inf and odd lengths. */
static void test_argmax(void **s) {
    (void)s;
    for (int k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        for (int trial = 0; trial < 400; trial++) {
            const int64_t n = trial < 300 ? 1 + trial % 67 : 32000 + trial % 17;
            float *x = make_x(1, n);
            for (int64_t i = 0; i < n; i++) {
                const uint32_t u = rnd32() % 100;
                if (u < 30) x[i] = (float)(rnd32() % 5); /* ties */
                else if (u < 35) x[i] = NAN;
                else if (u < 38) x[i] = -INFINITY;
                else if (u < 39 && trial % 7 == 0) x[i] = INFINITY;
            }
            if (trial % 11 == 0) x[0] = NAN;
            int64_t best = 0;
            for (int64_t i = 1; i < n; i++)
                if (x[i] > x[best]) best = i;
            assert_int_equal(kiln_argmax_f32(x, n), best);
            free(x);
        }
        assert_int_equal(kiln_argmax_f32(NULL, 0), -1);
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

static void test_f32_helpers(void **s) {
    (void)s;
    static const int64_t ns[] = {0, 1, 5, 16, 17, 63, 64, 65, 1000};
    for (int k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        for (int t = 0; t < 9; t++) {
            int64_t n = ns[t];
            float *a = make_x(1, n), *b = make_x(1, n), *y = make_x(1, n), *y2 = malloc((n + 64) * sizeof(float));
            memcpy(y2, y, (n + 64) * sizeof(float));
            double exact = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) { exact += (double)a[i] * b[i]; mag += fabs((double)a[i] * b[i]); }
            float d = kiln_dot_f32(a, b, n);
            assert_true(fabs(d - exact) <= 1e-6 * mag + 1e-30);
            kiln_axpy_f32(0.75f, a, y, n);
            for (int64_t i = 0; i < n; i++) assert_true(fabsf(y[i] - (y2[i] + 0.75f * a[i])) <= 1e-6f * (fabsf(y2[i]) + fabsf(a[i])));
            assert_true(isnan(y[n]));
            memcpy(y, y2, (n + 64) * sizeof(float));
            kiln_scale_f32(y2, -2.0f, n);
            for (int64_t i = 0; i < n; i++) assert_true(y2[i] == -2.0f * y[i]); /* exact: a power of 2 */
            assert_true(isnan(y2[n]));
            free(a); free(b); free(y); free(y2);
        }
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

static void test_select(void **s) {
    (void)s;
    assert_int_equal(kiln_kernels_select(KILN_ISA_SCALAR), KILN_ISA_SCALAR);
    assert_int_equal(kiln_kernels_current(), KILN_ISA_SCALAR);
    kiln_isa best = kiln_kernels_select(KILN_ISA_AUTO);
    assert_true(kiln_cpu_supports(best));
    if (kiln_cpu_supports(KILN_ISA_AVX512)) assert_int_equal(best, KILN_ISA_AVX512);
}

int main(void) {
    kiln_fp_init();
    omp_set_num_threads(2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_select),   cmocka_unit_test(test_f32_helpers), cmocka_unit_test(test_silu_mul), cmocka_unit_test(test_argmax), cmocka_unit_test(test_f32),
        cmocka_unit_test(test_f16),      cmocka_unit_test(test_bf16),        cmocka_unit_test(test_fp8),        cmocka_unit_test(test_fp8_bf16_exact_inputs),
        cmocka_unit_test(test_int4),     cmocka_unit_test(test_q8_0),        cmocka_unit_test(test_q4_0),
        cmocka_unit_test(test_int4_unusual_group), cmocka_unit_test(test_large_threaded),
        cmocka_unit_test(test_fp8_daz),  cmocka_unit_test(test_fp8_q8_requant), cmocka_unit_test(test_tiled), cmocka_unit_test(test_int4_tile_kernel_exact), cmocka_unit_test(test_q16_kernel_exact), cmocka_unit_test(test_q16_amx_exact), cmocka_unit_test(test_kquants), cmocka_unit_test(test_kquants_avx_vnni_exact), cmocka_unit_test(test_int4_avx_vnni_exact), cmocka_unit_test(test_matmul_many), cmocka_unit_test(test_few_token_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
