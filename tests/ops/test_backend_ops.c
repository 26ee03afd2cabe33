/* test_backend_ops.c — every backend op × weight format × backend against the ref backend, in the
 * manner of llama.cpp's test-backend-ops.
 *
 * Backends under test: cpu with each ISA this CPU has (scalar, AVX2, AVX-512), both FP8 GEMV forms
 * where the CPU has AVX512_BF16, on 1 and 2 threads. The oracle: the ref backend (scalar
 * reference kernels, one thread). Inputs live in buffers the backend allocated, with NaN-poisoned
 * memory after each input (a read past the end shows as NaN) and NaN-prefilled outputs (a missed
 * element shows).
 *
 * Shapes are awkward on purpose: rows 1, 3, 7, 33, 130 (not multiples of the 4-row tiles or of any
 * SIMD width), columns 32, 96, 160, 256 (and 100, 36 for the formats without a 32-block), 1, 2, 3,
 * 4, 7, 16, 33 and 512 tokens (for the integer formats each token of a batch must equal its own
 * n = 1 result bit for bit: the GEMM keeps the GEMV's arithmetic), GQA ratios 1, 4 and 6, head dims 64 and 40, partially filled last pages, weights in
 * the checkpoint layout and in the 4-row tile layout.
 *
 * Error measure: NMSE = Σ(y − y_ref)² / Σ y_ref² over the whole output; for the matmuls the
 * denominator is the energy of the products the outputs sum, Σ (w·x)² (check_matmul says why). Bounds
 * per format (the reasons are those of tests/kernels/test_gemv.c): F32 / F16 / BF16 / FP8 exact 1e-9 (only the float
 * summation order differs); FP8 on the bf16-dot form, and BF16 weights there when n > 1, 5e-5 (x
 * rounded to bf16; format_bound_n); INT4, Q8_0, Q4_0
 * 1e-4 (x quantised to int8 per 32 like llama.cpp), Q4_K / Q5_K / Q6_K 2e-4 (per 256, as llama.cpp's
 * q8_K: about twice the 32-blocks' expected error; outputs fewer than 64 held to the per-output
 * rounding bound). Norms, SwiGLU, attention: 1e-10 (summation order,
 * vector exp). The ops both backends share (backend_common.h: embed, rope, add, bias, MoE routing
 * and combine) must agree bit for bit and are checked against computations written here from their
 * definitions; KV stores (scalar conversions on ref, the ISA's on cpu) must store the same bytes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "backend/vulkan/backend_vulkan.h"
#include "kv/integrity.h"
#include "model/moe.h"
#include "kv/kv_isa.h"
#include "base/fp.h"
#include "quant/quantize.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float urand(void) { return (float)(rnd32() & 0xFFFFFF) / 16777216.0f; }
static float nrand(void) {
    float u = urand() + 1e-7f, v = urand();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* ---- the backends ------------------------------------------------------------------------------- */
#define MAX_BE 16
static kiln_backend *ref_be;
static kiln_backend *bes[MAX_BE];
static int n_bes;

static int setup(void **state) {
    (void)state;
    assert_int_equal(kiln_backend_create(KILN_BACKEND_REF, KILN_ISA_AUTO, 0, 0, &ref_be), KILN_OK);
    const kiln_isa isas[3] = {KILN_ISA_SCALAR, KILN_ISA_AVX2, KILN_ISA_AVX512};
    for (int i = 0; i < 3; i++) {
        if (!kiln_cpu_supports(isas[i])) continue;
        for (int fp8 = KILN_FP8_EXACT; fp8 <= KILN_FP8_BF16; fp8++)
            for (int th = 1; th <= 2; th++) {
                kiln_backend *be;
                assert_int_equal(kiln_backend_create(KILN_BACKEND_CPU, isas[i], th, fp8, &be), KILN_OK);
                assert_int_equal(be->cx.isa, isas[i]);
                /* the bf16 form exists only on the AVX-512 table of AVX512_BF16 CPUs: skip duplicates */
                if (fp8 == KILN_FP8_BF16 && be->cx.fp8_exact) { kiln_backend_free(be); continue; }
                assert_true(n_bes < MAX_BE);
                bes[n_bes++] = be;
            }
    }
    /* vulkan (lavapipe in make test): required when the build has it, so that a CI machine whose
     * Vulkan driver went missing fails here instead of silently testing less. Host-side ops on the
     * exact FP8 form, so that the device's float results are held to the exact bounds. */
    kiln_backend *vk = NULL;
    /* KILN_VK_DEVICE_INDEX: another device than vulkan:0 (scripts/gpu_check.sh picks the GPU) */
    const char *vdi = getenv("KILN_VK_DEVICE_INDEX");
    const kiln_status vst = kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &vk);
    if (vst == KILN_OK) {
        fprintf(stderr, "vulkan: %s (%s reductions)\n", vk->device_name, kiln_backend_vulkan_subgroups(vk) ? "subgroup" : "shared-memory tree");
        assert_true(n_bes < MAX_BE);
        bes[n_bes++] = vk;
        /* a device with subgroup arithmetic runs the sg* shaders; the portable tree sums (what a
         * device without it runs) are tested too, on a second backend object with them forced */
        if (kiln_backend_vulkan_subgroups(vk)) {
            kiln_backend *tree = NULL;
            setenv("KILN_VK_SUBGROUPS", "0", 1);
            assert_int_equal(kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &tree), KILN_OK);
            unsetenv("KILN_VK_SUBGROUPS");
            assert_false(kiln_backend_vulkan_subgroups(tree));
            assert_true(n_bes < MAX_BE);
            bes[n_bes++] = tree;
        }
    } else if (kiln_backend_vulkan_built()) {
        fprintf(stderr, "vulkan backend built but not usable: %s\n", kiln_last_error());
        fail();
    } else
        fprintf(stderr, "vulkan backend not built: not tested (%s)\n", kiln_last_error());
    fprintf(stderr, "backends under test: %d (cpu: ISAs × FP8 forms × 1/2 threads; vulkan), oracle: ref\n", n_bes);
    return 0;
}
static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < n_bes; i++) kiln_backend_free(bes[i]);
    kiln_backend_free(ref_be);
    return 0;
}
static const char *be_desc(const kiln_backend *be) {
    static char s[64];
    snprintf(s, sizeof s, "%s/%s/%s/%dt%s", be->name, kiln_isa_name(be->cx.isa), be->cx.fp8_exact ? "fp8-exact" : "fp8-bf16", be->cx.threads,
             be->kind != KILN_BACKEND_VULKAN ? "" : kiln_backend_vulkan_subgroups(be) ? "/subgroups" : "/tree");
    return s;
}

/* ---- buffers ------------------------------------------------------------------------------------ */
#define POISON 64 /* floats of NaN after every input */
static float *input(const kiln_backend *be, size_t n) {
    float *p = kiln_be_alloc(be, (n + POISON) * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = nrand();
    for (size_t i = n; i < n + POISON; i++) p[i] = NAN;
    return p;
}
static float *output(const kiln_backend *be, size_t n) {
    float *p = kiln_be_alloc(be, n * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static float *copy_of(const kiln_backend *be, const float *src, size_t n) {
    float *p = output(be, n + POISON);
    memcpy(p, src, (n + POISON) * sizeof(float));
    return p;
}

/* The formats whose SIMD kernels quantise x to int8 per block of 32 (GEMV and GEMM alike). */
static int is_int_format(kiln_wformat f) {
    return f == KILN_WF_INT4_GROUP || f == KILN_WF_Q8_0 || f == KILN_WF_Q4_0 || f == KILN_WF_Q4_1 || f == KILN_WF_Q5_0 || f == KILN_WF_Q5_1 ||
           f == KILN_WF_IQ4_NL;
}
/* The GGUF super-block types (K-quants, IQ4_XS) multiply int8 copies of x quantized per super-block
 * of 256 (kiln_quant_x256) on every SIMD ISA. */
static int is_kquant(kiln_wformat f) {
    return f == KILN_WF_Q4_K || f == KILN_WF_Q5_K || f == KILN_WF_Q6_K || f == KILN_WF_Q2_K || f == KILN_WF_Q3_K || f == KILN_WF_IQ4_XS;
}
/* Columns per activation step of an int8 format: 32 (llama.cpp's q8_0 rule) or 256 (q8_K's). */
static int64_t int_block(kiln_wformat f) { return is_kquant(f) ? 256 : 32; }

/* Σ over the n × rows outputs of Σ_c (w[r,c]·x[i,c])²: the energy of the products each output sums.
 * The matmul error is measured against it rather than against Σ y², because one output of a few
 * rows can cancel to near zero (a single row's "NMSE" is then any size), while the rounding of x
 * (int8 per 32, or bf16) perturbs each product independently: Σ(y − y_ref)² ≈ ε² · Σ (w·x)². */
static double term_energy(const kiln_weight *w, const float *X, int n) {
    float *row = malloc((size_t)w->cols * sizeof(float));
    assert_non_null(row);
    double e = 0;
    for (int64_t r = 0; r < w->rows; r++) {
        kiln_weight_row_f32(w, r, row);
        for (int i = 0; i < n; i++)
            for (int64_t c = 0; c < w->cols; c++) {
                const double p = (double)row[c] * (double)X[(size_t)i * (size_t)w->cols + (size_t)c];
                e += p * p;
            }
    }
    free(row);
    return e;
}
/* The integer formats round each x to a multiple of its block's step d = amax / 127 (at most d/2
 * off; blocks of 32, or 256 for the K-quants), so |y − y_ref| ≤ Σ_c |w[r,c]| · d_c / 2 for every
 * output; checked with 1e-5 of Σ|w·x| for the float arithmetic around the integer dots. */
static void check_int_elementwise(const char *what, const kiln_backend *be, const kiln_weight *w, const float *X, int n, const float *y,
                                  const float *ref) {
    float *row = malloc((size_t)w->cols * sizeof(float));
    assert_non_null(row);
    for (int64_t r = 0; r < w->rows; r++) {
        kiln_weight_row_f32(w, r, row);
        for (int i = 0; i < n; i++) {
            const float *x = X + (size_t)i * (size_t)w->cols;
            double lim = 0, mag = 0;
            const int64_t blk = int_block(w->fmt);
            for (int64_t c0 = 0; c0 < w->cols; c0 += blk) {
                float amax = 0;
                for (int64_t c = c0; c < c0 + blk && c < w->cols; c++) amax = fmaxf(amax, fabsf(x[c]));
                for (int64_t c = c0; c < c0 + blk && c < w->cols; c++) {
                    lim += fabs((double)row[c]) * (double)amax / 127.0 / 2.0;
                    mag += fabs((double)row[c] * (double)x[c]);
                }
            }
            const double err = fabs((double)y[(size_t)i * (size_t)w->rows + (size_t)r] - (double)ref[(size_t)i * (size_t)w->rows + (size_t)r]);
            if (!(err <= lim * 1.001 + 1e-5 * mag)) {
                fprintf(stderr, "%s on %s: row %lld token %d off by %.3g, more than the rounding of x allows (%.3g)\n", what, be_desc(be),
                        (long long)r, i, err, lim);
                fail();
            }
        }
    }
    free(row);
}

/* Matmul outputs against the ref backend: the error energy over the product energy within the
 * format's bound. An energy ratio is a sum of as many squared errors as there are outputs; for
 * fewer than 64 outputs it is a statistic of a few draws (one row of an integer format exceeds 4×
 * its expected value one time in twenty), so small outputs of the integer formats are held to the
 * per-output worst case instead, which holds for every draw. */
/* energy: the product energy term_energy(w, X, n), computed on first use and kept in *energy (< 0:
 * not yet) — the same for every backend checked against one reference */
static void check_matmul(const char *what, const kiln_backend *be, const kiln_weight *w, const float *X, int n, const float *y, const float *ref,
                         double bound, double *energy) {
    if ((is_int_format(w->fmt) || is_kquant(w->fmt)) && (int64_t)n * w->rows < 64) {
        check_int_elementwise(what, be, w, X, n, y, ref);
        return;
    }
    double num = 0;
    for (size_t i = 0; i < (size_t)n * (size_t)w->rows; i++) {
        if (isnan(y[i]) || isnan(ref[i])) { fprintf(stderr, "%s on %s: NaN at %zu\n", what, be_desc(be), i); fail(); }
        const double d = (double)y[i] - (double)ref[i];
        num += d * d;
    }
    if (*energy < 0) *energy = term_energy(w, X, n);
    const double e = num / *energy;
    if (!(e <= bound)) {
        fprintf(stderr, "%s on %s: error energy / product energy %.3g > bound %.3g\n", what, be_desc(be), e, bound);
        fail();
    }
}

static double nmse(const float *y, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(y[i]) || isnan(ref[i])) return INFINITY;
        double d = (double)y[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? num / den : num;
}
static void check_nmse(const char *what, const kiln_backend *be, const float *y, const float *ref, size_t n, double bound) {
    double e = nmse(y, ref, n);
    if (!(e <= bound)) {
        fprintf(stderr, "%s on %s: NMSE %.3g > bound %.3g\n", what, be_desc(be), e, bound);
        fail();
    }
}
static void check_equal(const char *what, const kiln_backend *be, const float *y, const float *ref, size_t n) {
    if (memcmp(y, ref, n * sizeof(float)) != 0) {
        fprintf(stderr, "%s on %s: not bit-identical to the ref backend\n", what, be_desc(be));
        fail();
    }
}

/* ---- weights ------------------------------------------------------------------------------------ */
typedef struct { kiln_weight w; void *data, *scales; } tweight;
/* A rows × cols weight of format f (group: INT4 group or FP8 block) quantised from Gaussian values;
 * tiled = 1 lays it out in its format's tile layout (4-row tiles; Q8_0 / Q4_0 16-row interleaves),
 * tiled = KILN_TILE_Q16 INT4 group 32 in the 16-row interleave
 * where the AVX-512 kernels read it. */
/* The GGUF block quants kiln reads but does not quantize to (no quantiser): weights per block, bytes per
 * block, the byte offsets of the block's f16 scales (ggml-common.h's layouts). */
typedef struct { kiln_wformat f; int elems, bytes, f16_at[2], n_f16; } gguf_block;
static const gguf_block gguf_blocks[] = {
    {KILN_WF_Q4_K, 256, 144, {0, 2}, 2}, {KILN_WF_Q5_K, 256, 176, {0, 2}, 2}, {KILN_WF_Q6_K, 256, 210, {208, 0}, 1},
    {KILN_WF_Q2_K, 256, 84, {80, 82}, 2}, {KILN_WF_Q3_K, 256, 110, {108, 0}, 1}, {KILN_WF_IQ4_XS, 256, 136, {0, 0}, 1},
    {KILN_WF_Q4_1, 32, 20, {0, 2}, 2},   {KILN_WF_Q5_0, 32, 22, {0, 0}, 1},     {KILN_WF_Q5_1, 32, 24, {0, 2}, 2},
    {KILN_WF_IQ4_NL, 32, 18, {0, 0}, 1},
};
static const gguf_block *gguf_block_of(kiln_wformat f) {
    for (size_t i = 0; i < sizeof gguf_blocks / sizeof *gguf_blocks; i++)
        if (gguf_blocks[i].f == f) return &gguf_blocks[i];
    return NULL;
}
/* A rows × cols weight of GGUF block format f: random quant and scale bytes, small finite f16 scales;
 * every fourth block's scales subnormal halves (2^-15 .. 2^-14, as real Q6_K files have): a
 * decoder that flushed or misread them would be off by far more than the bounds (docs/VULKAN.md). */
static tweight make_block_weight(const gguf_block *gb, int64_t rows, int64_t cols) {
    assert_int_equal(cols % gb->elems, 0);
    tweight t = {0};
    t.w = (kiln_weight){.fmt = gb->f, .rows = rows, .cols = cols, .row_bytes = (size_t)(cols / gb->elems * gb->bytes)};
    uint8_t *d = malloc(t.w.row_bytes * (size_t)rows);
    assert_non_null(d);
    for (size_t i = 0; i < t.w.row_bytes * (size_t)rows; i++) d[i] = (uint8_t)rnd32();
    for (int64_t b = 0; b < rows * cols / gb->elems; b++)
        for (int j = 0; j < gb->n_f16; j++) {
            const uint16_t h = (uint16_t)(b % 4 == 3 ? 0x0200 + (rnd32() & 0x1FF) : 0x1000 + (rnd32() & 0x3FF)); /* 2^-11 .. 2^-10; every fourth block 2^-15 .. 2^-14 */
            memcpy(d + (size_t)b * (size_t)gb->bytes + gb->f16_at[j], &h, 2);
        }
    t.w.data = d;
    t.data = d;
    return t;
}
static tweight make_weight(kiln_wformat f, int64_t rows, int64_t cols, int group, int tiled) {
    if (gguf_block_of(f)) return make_block_weight(gguf_block_of(f), rows, cols);
    float *src = malloc((size_t)rows * (size_t)cols * sizeof(float));
    assert_non_null(src);
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++) src[i] = nrand() * 0.05f;
    kiln_weight sw = {.fmt = KILN_WF_F32, .rows = rows, .cols = cols, .data = (const uint8_t *)src, .row_bytes = (size_t)cols * 4};
    tweight t = {0};
    assert_int_equal(kiln_quantize_weight(&sw, f, group, &t.w, &t.data, &t.scales), KILN_OK);
    free(src);
    if (tiled) assert_int_equal(kiln_weight_tile(&t.w, t.data, t.scales, tiled), 0);
    return t;
}
static void free_weight(tweight *t) { free(t->data); free(t->scales); }

/* The bound for a matmul of n tokens on be. The bf16 form (kiln_cx_fp8_rounds_x) rounds x to bf16
 * for FP8 at every n and for BF16 weights when n > 1 (the BF16-dot GEMM; its FP8 tiles round
 * fp8 × scale to bf16 too): each rounding a relative error uniform within ±2^-8, NMSE ≈ 2^-16/3 ≈
 * 5e-6 apiece. */
static double format_bound_n(kiln_wformat f, const kiln_backend *be, int n) {
    /* K-quants: x rounded to int8 per 256 where the cpu backend's SIMD kernels run them (the ref
     * backend and the Vulkan shaders multiply the f32 dequantized weights: 1e-9). Expected ratio (dx²/12)/σ² with dx = amax/127 and the amax of
     * 256 Gaussians ≈ 2.9σ: 4.3e-5 (the 32-blocks' ≈ 2.3e-5 has the 1e-4 above); 2e-4 leaves the same
     * ~4.5× for the spread of an energy ratio over 64+ outputs */
    if (is_kquant(f)) return be->kind == KILN_BACKEND_REF || be->kind == KILN_BACKEND_VULKAN ? 1e-9 : 2e-4;
    if (be->kind == KILN_BACKEND_VULKAN) return 1e-9; /* f32 products of the dequantized weights: only the summation order differs */
    switch (f) {
    case KILN_WF_INT4_GROUP:
    case KILN_WF_Q8_0:
    case KILN_WF_Q4_0:
    case KILN_WF_Q4_1: /* the other GGUF blocks of 32: x per 32 as Q8_0's */
    case KILN_WF_Q5_0:
    case KILN_WF_Q5_1:
    case KILN_WF_IQ4_NL: return 1e-4;
    case KILN_WF_FP8_BLOCK: return kiln_cx_fp8_rounds_x(&be->cx) ? 5e-5 : 1e-9;
    case KILN_WF_BF16: return kiln_cx_fp8_rounds_x(&be->cx) && n > 1 ? 5e-5 : 1e-9;
    default: return 1e-9;
    }
}
static double format_bound(kiln_wformat f, const kiln_backend *be) { return format_bound_n(f, be, 2); }
/* The bound for w itself: a prompt's FP8 GEMM on the cpu backend's int8 route (kiln_cx_fp8_int8:
 * AVX512_BF16 CPUs in the bf16 form, more than KILN_GEMV_SMALL_N_FP8 tokens) quantizes both
 * operands per 32 as Q8_0 does (weights requantized to Q8_0, x to int8): (dx²/12)/σ² ≈ 2.7e-5 each
 * (dx = amax / 127, the amax of 32 Gaussians ≈ 2.3σ), 5.4e-5 together; 2e-4 leaves the ~3.7× the
 * K-quants' bound leaves for the spread of an energy ratio. */
static double weight_bound(const kiln_weight *w, const kiln_backend *be, int n) {
    if (be->kind == KILN_BACKEND_CPU && kiln_cx_fp8_int8(&be->cx, w, n)) return 2e-4;
    return format_bound_n(w->fmt, be, n);
}

typedef struct { kiln_wformat f; int group; int64_t cols; int tiled; } wcase;
static const wcase wcases[] = {
    {KILN_WF_F32, 0, 100, 0},        {KILN_WF_F32, 0, 256, 0},         {KILN_WF_F16, 0, 36, 0},
    {KILN_WF_F16, 0, 160, 0},        {KILN_WF_BF16, 0, 100, 0},        {KILN_WF_BF16, 0, 256, 0},
    {KILN_WF_FP8_BLOCK, 128, 100, 0},{KILN_WF_FP8_BLOCK, 128, 256, 0}, {KILN_WF_FP8_BLOCK, 128, 256, 1},
    {KILN_WF_INT4_GROUP, 32, 96, 0}, {KILN_WF_INT4_GROUP, 32, 160, 1}, {KILN_WF_INT4_GROUP, 128, 256, 0},
    {KILN_WF_INT4_GROUP, 128, 256, 1}, {KILN_WF_Q8_0, 0, 32, 0},       {KILN_WF_Q8_0, 0, 160, 0},
    {KILN_WF_Q4_0, 0, 96, 0},        {KILN_WF_Q4_0, 0, 256, 0},        {KILN_WF_Q8_0, 0, 160, 1},
    {KILN_WF_Q4_0, 0, 256, 1},
    /* the GGUF block quants (random blocks; int8 kernels on the cpu backend's SIMD ISAs) */
    {KILN_WF_Q4_K, 0, 256, 0},       {KILN_WF_Q5_K, 0, 256, 0},        {KILN_WF_Q6_K, 0, 256, 0},
    {KILN_WF_Q2_K, 0, 256, 0},       {KILN_WF_Q3_K, 0, 512, 0},        {KILN_WF_IQ4_XS, 0, 256, 0},
    {KILN_WF_Q4_1, 0, 96, 0},        {KILN_WF_Q5_0, 0, 160, 0},        {KILN_WF_Q5_1, 0, 96, 0},
    {KILN_WF_IQ4_NL, 0, 288, 0},
    /* the super-block types in the 16-row interleave (AVX-512; 16 rows and more) */
    {KILN_WF_Q4_K, 0, 256, 1},       {KILN_WF_Q5_K, 0, 512, 1},        {KILN_WF_Q6_K, 0, 256, 1},
    {KILN_WF_Q2_K, 0, 256, 1},       {KILN_WF_Q3_K, 0, 256, 1},        {KILN_WF_IQ4_XS, 0, 512, 1},
    /* INT4 group 32 in Q4_0's 16-row interleave (KILN_TILE_Q16: the AVX-512 kernels' layout) */
    {KILN_WF_INT4_GROUP, 32, 160, KILN_TILE_Q16}, {KILN_WF_INT4_GROUP, 32, 1056, KILN_TILE_Q16},
};
#define N_WCASES ((int)(sizeof wcases / sizeof *wcases))

/* ---- matmul ------------------------------------------------------------------------------------- */
/* The tokens of an n-token matmul whose results are compared with their own n = 1 matmul: all of
 * them up to n = 33; beyond, every fifth (5 is prime to the kernels' 2 / 4 / 8 / 16-token blocks, so
 * every place in a block is met) and the last 17 (the remainder blocks). Checking all 512 tokens of
 * the prefill chunk on each of the 14 backends took 13 s of the suite's 51 s (2 cores). */
static int next_token_checked(int i, int n) {
    if (n <= 33 || i >= n - 17) return i + 1;
    return i + 5 < n - 17 ? i + 5 : n - 17;
}
static void test_matmul(void **state) {
    (void)state;
    static const int64_t rows_list[] = {1, 3, 7, 33, 130};
    static const int n_list[] = {1, 2, 3, 4, 7, 16, 33, 512}; /* 512: a prefill chunk (rows 33 and 130 only) */
    int checked = 0;
    for (int c = 0; c < N_WCASES; c++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++) {
            const wcase *wc = &wcases[c];
            const int64_t rows = rows_list[ri];
            if (wc->tiled && rows < 4) continue; /* tiles need 4 rows */
            tweight t = make_weight(wc->f, rows, wc->cols, wc->group, wc->tiled);
            for (size_t ni = 0; ni < sizeof n_list / sizeof *n_list; ni++) {
                const int n = n_list[ni];
                if (n > 33 && rows < 33) continue;
                float *X = input(ref_be, (size_t)n * (size_t)wc->cols);
                float *want = output(ref_be, (size_t)n * (size_t)rows);
                kiln_be_matmul(ref_be, &t.w, X, want, n);
                double energy = -1;
                for (int b = 0; b < n_bes; b++) {
                    float *Xb = copy_of(bes[b], X, (size_t)n * (size_t)wc->cols);
                    float *got = output(bes[b], (size_t)n * (size_t)rows);
                    kiln_be_matmul(bes[b], &t.w, Xb, got, n);
                    char what[96];
                    snprintf(what, sizeof what, "matmul %s%s g%d %lldx%lld n=%d", kiln_wformat_name(wc->f), wc->tiled ? " tiled" : "",
                             wc->group, (long long)rows, (long long)wc->cols, n);
                    check_matmul(what, bes[b], &t.w, X, n, got, want, weight_bound(&t.w, bes[b], n), &energy);
                    if (n > 1 && is_int_format(wc->f)) { /* the batched GEMM gives each token its GEMV result exactly */
                        float *one = output(bes[b], (size_t)rows);
                        for (int i = 0; i < n; i = next_token_checked(i, n)) {
                            kiln_be_matmul(bes[b], &t.w, Xb + (size_t)i * (size_t)wc->cols, one, 1);
                            if (memcmp(one, got + (size_t)i * (size_t)rows, (size_t)rows * sizeof(float)) != 0) {
                                fprintf(stderr, "%s on %s: token %d differs from its n = 1 result\n", what, be_desc(bes[b]), i);
                                fail();
                            }
                        }
                        kiln_be_free(bes[b], one);
                    }
                    kiln_be_free(bes[b], Xb);
                    kiln_be_free(bes[b], got);
                    checked++;
                }
                kiln_be_free(ref_be, X);
                kiln_be_free(ref_be, want);
            }
            free_weight(&t);
        }
    fprintf(stderr, "matmul: %d (format, shape, tokens, backend) cases within their bounds\n", checked);
}

/* A 512-token prefill (several token blocks of the GEMM, both threads busy) of each format. */
/* A token's matmul result does not depend on the tokens computed with it: n rows at once equal each
 * row alone, bit for bit — so a batched verification step (speculative decoding) or a prefill gives
 * the decode step's floats. Checked on the vulkan backend (matmul.comp: 8 tokens per workgroup,
 * explicit fma); the cpu backend's GEMM / GEMV pairing has its own kernel tests. */
static void test_matmul_batch_invariant(void **state) {
    (void)state;
    const int n = 11, rows = 37;
    for (int b = 0; b < n_bes; b++) {
        if (bes[b]->kind != KILN_BACKEND_VULKAN) continue;
        for (int c = 0; c < N_WCASES; c++) {
            const wcase *wc = &wcases[c];
            tweight t = make_weight(wc->f, rows, wc->cols, wc->group, wc->tiled);
            float *X = input(bes[b], (size_t)n * (size_t)wc->cols), *all = output(bes[b], (size_t)n * rows), *one = output(bes[b], rows);
            kiln_be_matmul(bes[b], &t.w, X, all, n);
            for (int i = 0; i < n; i++) {
                kiln_be_matmul(bes[b], &t.w, X + (size_t)i * (size_t)wc->cols, one, 1);
                if (memcmp(one, all + (size_t)i * rows, (size_t)rows * sizeof(float)) != 0) {
                    fprintf(stderr, "matmul %s on %s: token %d of %d differs from the same token alone\n", kiln_wformat_name(wc->f), be_desc(bes[b]), i, n);
                    fail();
                }
            }
            kiln_be_free(bes[b], X); kiln_be_free(bes[b], all); kiln_be_free(bes[b], one);
            free_weight(&t);
        }
    }
}

static void test_matmul_prefill(void **state) {
    (void)state;
    const int n = 512;
    const int pick[] = {1, 5, 8, 10, 12, 14, 16, 35}; /* f32, bf16, fp8 tiled, int4 g32 tiled, int4 g128 tiled, q8_0, q4_0, int4 g32 16-row */
    for (size_t c = 0; c < sizeof pick / sizeof *pick; c++) {
        const wcase *wc = &wcases[pick[c]];
        tweight t = make_weight(wc->f, 67, wc->cols, wc->group, wc->tiled);
        float *X = input(ref_be, (size_t)n * (size_t)wc->cols), *want = output(ref_be, (size_t)n * 67);
        kiln_be_matmul(ref_be, &t.w, X, want, n);
        double energy = -1;
        for (int b = 0; b < n_bes; b++) {
            float *got = output(bes[b], (size_t)n * 67);
            kiln_be_matmul(bes[b], &t.w, X, got, n);
            char what[64];
            snprintf(what, sizeof what, "matmul %s n=512", kiln_wformat_name(wc->f));
            check_matmul(what, bes[b], &t.w, X, n, got, want, weight_bound(&t.w, bes[b], n), &energy);
            kiln_be_free(bes[b], got);
        }
        kiln_be_free(ref_be, X);
        kiln_be_free(ref_be, want);
        free_weight(&t);
    }
}

/* The 4-row INT4 decode GEMV (KILN_VK_GEMV_ROWS=4, matmul.comp ROWS4), for every INT4 layout, row
 * counts 4 does not divide and 1–3 tokens (4 and more take the 8-token variant either way): it ran
 * (its dispatch count), its results are within the format's bound of the ref backend's and are the
 * one-row variant's bit for bit, with subgroup sums and with the shared-memory tree sums
 * (KILN_VK_SUBGROUPS=0) — so decode and a batched verification still agree with it. A value
 * KILN_VK_GEMV_ROWS does not take is refused by name. */
static kiln_backend *vulkan_with(const char *rows, const char *subgroups) {
    const char *vdi = getenv("KILN_VK_DEVICE_INDEX");
    kiln_backend *be = NULL;
    if (rows) setenv("KILN_VK_GEMV_ROWS", rows, 1);
    if (subgroups) setenv("KILN_VK_SUBGROUPS", subgroups, 1);
    const kiln_status st = kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &be);
    unsetenv("KILN_VK_GEMV_ROWS");
    unsetenv("KILN_VK_SUBGROUPS");
    return st == KILN_OK ? be : NULL;
}

static void test_matmul_rows4(void **state) {
    (void)state;
    static const int64_t rows_list[] = {1, 3, 4, 5, 37, 130};
    int have_vulkan = 0;
    for (int b = 0; b < n_bes; b++) have_vulkan |= bes[b]->kind == KILN_BACKEND_VULKAN;
    if (!have_vulkan) return;
    assert_null(vulkan_with("2", NULL));
    assert_non_null(strstr(kiln_last_error(), "KILN_VK_GEMV_ROWS: '2' is not 1 or 4"));
    kiln_backend *r4 = vulkan_with("4", NULL), *r4_tree = vulkan_with("4", "0"), *r1_tree = vulkan_with("1", "0"), *r1 = vulkan_with("1", NULL);
    assert_non_null(r4);
    assert_non_null(r4_tree);
    assert_non_null(r1_tree);
    assert_non_null(r1);
    int cases = 0;
    for (int c = 0; c < N_WCASES; c++) {
        const wcase *wc = &wcases[c];
        if (wc->f != KILN_WF_INT4_GROUP) continue;
        for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++) {
            const int64_t rows = rows_list[ri];
            tweight t = make_weight(wc->f, rows, wc->cols, wc->group, wc->tiled);
            for (int n = 1; n <= 3; n++) {
                const size_t ny = (size_t)n * (size_t)rows;
                float *X = input(ref_be, (size_t)n * (size_t)wc->cols), *want = output(ref_be, ny);
                float *four = output(r4, ny), *four_tree = output(r4_tree, ny), *one_tree = output(r1_tree, ny), *one = output(r1, ny);
                kiln_be_matmul(ref_be, &t.w, X, want, n);
                kiln_be_matmul(r1, &t.w, X, one, n);
                kiln_be_matmul(r1_tree, &t.w, X, one_tree, n);
                const uint64_t before = kiln_backend_vulkan_gemv4_dispatches(r4), before_tree = kiln_backend_vulkan_gemv4_dispatches(r4_tree);
                kiln_be_matmul(r4, &t.w, X, four, n);
                kiln_be_matmul(r4_tree, &t.w, X, four_tree, n);
                if (kiln_backend_vulkan_gemv4_dispatches(r4) == before || kiln_backend_vulkan_gemv4_dispatches(r4_tree) == before_tree) {
                    fprintf(stderr, "int4 g%d layout %d rows %lld n %d: the 4-row GEMV did not run\n", wc->group, wc->tiled, (long long)rows, n);
                    fail();
                }
                if (memcmp(one_tree, four_tree, ny * sizeof(float)) != 0 || memcmp(one, four, ny * sizeof(float)) != 0) {
                    fprintf(stderr, "int4 g%d layout %d rows %lld n %d: the 4-row GEMV (%s sums) differs from the one-row variant\n", wc->group,
                            wc->tiled, (long long)rows, n, memcmp(one, four, ny * sizeof(float)) != 0 ? "subgroup" : "tree");
                    fail();
                }
                check_matmul("matmul int4 4-row GEMV", r4, &t.w, X, n, four, want, format_bound_n(wc->f, r4, n), &(double){-1});
                cases++;
                kiln_be_free(r1, one);
                kiln_be_free(ref_be, X); kiln_be_free(ref_be, want);
                kiln_be_free(r4, four); kiln_be_free(r4_tree, four_tree); kiln_be_free(r1_tree, one_tree);
            }
            free_weight(&t);
        }
    }
    assert_int_equal(cases, 6 * 6 * 3); /* the 6 INT4 layouts of wcases × rows × tokens */
    kiln_backend_free(r1);
    kiln_backend_free(r4);
    kiln_backend_free(r4_tree);
    kiln_backend_free(r1_tree);
}

/* Three weights of different formats and heights reading the same X in one call (q/k/v). */
static void test_matmul_many(void **state) {
    (void)state;
    tweight w[3] = {make_weight(KILN_WF_INT4_GROUP, 33, 256, 32, 0), make_weight(KILN_WF_BF16, 7, 256, 0, 0),
                    make_weight(KILN_WF_FP8_BLOCK, 130, 256, 128, 1)};
    const kiln_weight *ws[3] = {&w[0].w, &w[1].w, &w[2].w};
    for (int n = 1; n <= 6; n += 5) {
        float *X = input(ref_be, (size_t)n * 256);
        float *want[3], *got[3];
        for (int k = 0; k < 3; k++) want[k] = output(ref_be, (size_t)n * (size_t)ws[k]->rows);
        kiln_be_matmul_many(ref_be, ws, want, 3, X, n);
        for (int b = 0; b < n_bes; b++) {
            for (int k = 0; k < 3; k++) got[k] = output(bes[b], (size_t)n * (size_t)ws[k]->rows);
            kiln_be_matmul_many(bes[b], ws, got, 3, X, n);
            for (int k = 0; k < 3; k++) {
                check_matmul("matmul_many", bes[b], ws[k], X, n, got[k], want[k], weight_bound(ws[k], bes[b], n), &(double){-1});
                kiln_be_free(bes[b], got[k]);
            }
        }
        for (int k = 0; k < 3; k++) kiln_be_free(ref_be, want[k]);
        kiln_be_free(ref_be, X);
    }
    for (int k = 0; k < 3; k++) free_weight(&w[k]);
}

/* The SwiGLU MLP's input half (backend.h matmul_swiglu; on the Vulkan backend gate, up and the
 * product in one dispatch, matmul.comp PAIR) for every weight format of wcases, separate gate / up
 * weights and GLM's fused [gate; up] one (its up rows from row F: an FP8 scale block shared by gate
 * and up rows when F = 130), 1–5 tokens: G is the unfused ops' (matmul_many, swiglu; the fused
 * weight's rows packed by copy_rows) bit for bit on every backend, subgroup and tree sums — the
 * pair's dispatches counted where it is forced on (KILN_VK_FFN_PAIR=1, n < 4: lavapipe's default is
 * off), and the fused weight's prefill on the Vulkan backends its
 * matmul and one swiglu_rows dispatch — and within the format's bound of the ref backend's. KILN_VK_FFN_PAIR takes 1 or 0, and refuses another value by name. */
static void test_matmul_swiglu(void **state) {
    (void)state;
    static const int64_t F_list[] = {1, 130};
    /* bes' Vulkan backends take the device's default (the pair on a GPU, not on lavapipe); two more
     * with the pair forced on (KILN_VK_FFN_PAIR=1), subgroup and tree sums, must run it */
    const kiln_backend *all[MAX_BE + 2];
    int n_all = 0, n_forced = 0, pairs = 0, have_vulkan = 0;
    for (int b = 0; b < n_bes; b++) {
        all[n_all++] = bes[b];
        have_vulkan |= bes[b]->kind == KILN_BACKEND_VULKAN;
    }
    kiln_backend *forced[2] = {NULL, NULL};
    if (have_vulkan) {
        setenv("KILN_VK_FFN_PAIR", "2", 1);
        assert_null(vulkan_with(NULL, NULL));
        assert_non_null(strstr(kiln_last_error(), "KILN_VK_FFN_PAIR: '2' is not 1 or 0"));
        setenv("KILN_VK_FFN_PAIR", "1", 1);
        forced[0] = vulkan_with(NULL, NULL);
        forced[1] = vulkan_with(NULL, "0");
        unsetenv("KILN_VK_FFN_PAIR");
        assert_non_null(forced[0]);
        assert_non_null(forced[1]);
        all[n_all++] = forced[0];
        all[n_all++] = forced[1];
        n_forced = 2;
    }
    for (int c = 0; c < N_WCASES; c++) {
        const wcase *wc = &wcases[c];
        for (size_t fi = 0; fi < sizeof F_list / sizeof *F_list; fi++) {
            const int64_t F = F_list[fi];
            tweight tg = make_weight(wc->f, F, wc->cols, wc->group, wc->tiled), tu = make_weight(wc->f, F, wc->cols, wc->group, wc->tiled);
            tweight tgu = make_weight(wc->f, 2 * F, wc->cols, wc->group, wc->tiled);
            for (int fused = 0; fused < 2; fused++) {
                const kiln_weight *gate = fused ? &tgu.w : &tg.w, *up = fused ? NULL : &tu.w;
                for (int n = 1; n <= 5; n++) {
                    const size_t ng = (size_t)n * (size_t)F, ns = fused ? 2 * ng : ng;
                    float *X = input(ref_be, (size_t)n * (size_t)wc->cols), *want = output(ref_be, ng), *wscr = output(ref_be, ns);
                    kiln_be_matmul_swiglu(ref_be, gate, up, X, n, want, wscr);
                    for (int b = 0; b < n_all; b++) {
                        const kiln_backend *be = all[b];
                        const int must_pair = b >= n_bes; /* the forced ones */
                        float *got = output(be, ng), *scr = output(be, ns), *unf = output(be, ng), *uscr = output(be, ns);
                        kiln_be_matmul_swiglu_unfused(be, gate, up, X, n, unf, uscr);
                        const int vk = be->kind == KILN_BACKEND_VULKAN;
                        const uint64_t before = vk ? kiln_backend_vulkan_pair_dispatches(be) : 0;
                        uint64_t d0 = 0, d1 = 0, host = 0;
                        if (vk) kiln_backend_vulkan_counts(be, &d0, &host);
                        kiln_be_matmul_swiglu(be, gate, up, X, n, got, scr);
                        if (vk) kiln_backend_vulkan_counts(be, &d1, &host);
                        /* the fused weight's prefill: its matmul and one swiglu_rows dispatch (not n + 1 more) */
                        if (vk && fused && n >= 4 && d1 - d0 != 2) {
                            fprintf(stderr, "matmul_swiglu %s F %lld n %d (fused) on %s: %llu dispatches, not the matmul and swiglu_rows\n",
                                    kiln_wformat_name(wc->f), (long long)F, n, be_desc(be), (unsigned long long)(d1 - d0));
                            fail();
                        }
                        if (must_pair && n < 4 && kiln_backend_vulkan_pair_dispatches(be) == before) {
                            fprintf(stderr, "matmul_swiglu %s cols %lld F %lld n %d%s on %s: the one-dispatch pair did not run\n", kiln_wformat_name(wc->f),
                                    (long long)wc->cols, (long long)F, n, fused ? " (fused)" : "", be_desc(be));
                            fail();
                        }
                        pairs += must_pair && n < 4;
                        if (memcmp(got, unf, ng * sizeof(float)) != 0) {
                            fprintf(stderr, "matmul_swiglu %s cols %lld layout %d F %lld n %d%s on %s: not the unfused ops' floats\n", kiln_wformat_name(wc->f),
                                    (long long)wc->cols, wc->tiled, (long long)F, n, fused ? " (fused)" : "", be_desc(be));
                            fail();
                        }
                        /* against the ref backend where the matmuls are exact up to summation order
                         * (f32 products: bounds of 1e-9); where x is quantized (the int8 routes, bounds
                         * of 1e-4 and more) silu(g)·u's error over one row's outputs is a statistic of a
                         * few heavy-tailed draws (a Q4_K case measured 27× the per-matmul expectation),
                         * and the unfused ops it equals bit for bit are held to their bounds by
                         * test_matmul and test_norm_swiglu_add */
                        if (ng >= 64 && format_bound_n(wc->f, be, n) <= 1e-6) {
                            char what[96];
                            snprintf(what, sizeof what, "matmul_swiglu %s cols %lld F %lld n %d%s", kiln_wformat_name(wc->f), (long long)wc->cols,
                                     (long long)F, n, fused ? " (fused)" : "");
                            check_nmse(what, be, got, want, ng, 4 * format_bound_n(wc->f, be, n));
                        }
                        kiln_be_free(be, got);
                        kiln_be_free(be, scr);
                        kiln_be_free(be, unf);
                        kiln_be_free(be, uscr);
                    }
                    kiln_be_free(ref_be, X);
                    kiln_be_free(ref_be, want);
                    kiln_be_free(ref_be, wscr);
                }
            }
            free_weight(&tg);
            free_weight(&tu);
            free_weight(&tgu);
        }
    }
    assert_int_equal(pairs, N_WCASES * 2 * 2 * 3 * n_forced); /* wcases × F × separate / fused × n < 4 × the forced backends */
    for (int k = 0; k < 2; k++)
        if (forced[k]) kiln_backend_free(forced[k]);
}

/* Per-head products with strided heads (MLA's absorbed W_UKᵀ / W_UV: f32 views). */
static void test_matmul_heads(void **state) {
    (void)state;
    const int H = 3, rows = 40, cols = 24, x_head = 30, y_head = 44; /* gaps between heads */
    tweight w[3];
    kiln_weight wv[3];
    for (int h = 0; h < H; h++) { w[h] = make_weight(KILN_WF_F32, rows, cols, 0, 0); wv[h] = w[h].w; }
    /* stacked: the heads as one array, head h's rows right after head h − 1's, as mla.c builds them
     * (the vulkan backend runs them as one dispatch over the heads) */
    uint8_t *stack = malloc((size_t)H * (size_t)rows * wv[0].row_bytes);
    assert_non_null(stack);
    kiln_weight sv[3];
    for (int h = 0; h < H; h++) {
        memcpy(stack + (size_t)h * (size_t)rows * wv[0].row_bytes, wv[h].data, (size_t)rows * wv[0].row_bytes);
        sv[h] = wv[h];
        sv[h].data = stack + (size_t)h * (size_t)rows * wv[0].row_bytes;
    }
    for (int k = 0; k < 4; k++) { /* n = 1, 4 × separate, stacked */
        const int n = k < 2 ? 1 : 4, stacked = k & 1;
        const kiln_weight *wv_ = stacked ? sv : wv;
        uint64_t d0 = 0, d1 = 0, host = 0;
        const int64_t x_tok = (int64_t)H * x_head + 5, y_tok = (int64_t)H * y_head + 3;
        float *X = input(ref_be, (size_t)n * (size_t)x_tok);
        float *want = output(ref_be, (size_t)n * (size_t)y_tok), *gin = output(ref_be, (size_t)n * 64), *gout = output(ref_be, (size_t)n * 64);
        ref_be->ops->matmul_heads(ref_be, wv_, H, n, X, x_tok, x_head, want, y_tok, y_head, gin, gout);
        for (int b = 0; b < n_bes; b++) {
            float *got = output(bes[b], (size_t)n * (size_t)y_tok);
            if (bes[b]->kind == KILN_BACKEND_VULKAN) kiln_backend_vulkan_counts(bes[b], &d0, &host);
            bes[b]->ops->matmul_heads(bes[b], wv_, H, n, X, x_tok, x_head, got, y_tok, y_head, gin, gout);
            if (bes[b]->kind == KILN_BACKEND_VULKAN) { /* stacked heads: one dispatch; separate ones: one per head */
                kiln_backend_vulkan_counts(bes[b], &d1, &host);
                assert_int_equal(d1 - d0, stacked ? 1 : H);
            }
            /* compare only the rows written (the gaps stay NaN in both) */
            for (int i = 0; i < n; i++)
                for (int h = 0; h < H; h++)
                    check_nmse("matmul_heads", bes[b], got + (size_t)i * y_tok + (size_t)h * y_head, want + (size_t)i * y_tok + (size_t)h * y_head, rows, 1e-9);
            kiln_be_free(bes[b], got);
        }
        kiln_be_free(ref_be, X); kiln_be_free(ref_be, want); kiln_be_free(ref_be, gin); kiln_be_free(ref_be, gout);
    }
    for (int h = 0; h < H; h++) free_weight(&w[h]);
    free(stack);
}

/* ---- element-wise ops ---------------------------------------------------------------------------- */
static void test_norm_swiglu_add(void **state) {
    (void)state;
    static const int widths[] = {1, 7, 64, 100, 2048};
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        const int width = widths[wi], rows = 3;
        const size_t n = (size_t)rows * (size_t)width;
        float *x = input(ref_be, n), *w = input(ref_be, (size_t)width), *u = input(ref_be, n), *bias = input(ref_be, (size_t)width);
        float *want = output(ref_be, n), *wg = copy_of(ref_be, x, n), *wa = copy_of(ref_be, x, n);
        kiln_be_rmsnorm(ref_be, want, x, w, rows, width, 1e-5f);
        kiln_be_swiglu(ref_be, wg, u, (int64_t)n);
        kiln_be_add(ref_be, wa, u, (int64_t)n);
        ref_be->ops->add_bias(ref_be, wa, bias, rows, width);
        for (int b = 0; b < n_bes; b++) {
            float *got = output(bes[b], n), *g = copy_of(bes[b], x, n), *a = copy_of(bes[b], x, n);
            kiln_be_rmsnorm(bes[b], got, x, w, rows, width, 1e-5f);
            check_nmse("rmsnorm", bes[b], got, want, n, 1e-10);
            kiln_be_rmsnorm(bes[b], g, g, w, rows, width, 1e-5f); /* in place, out == x */
            check_nmse("rmsnorm in place", bes[b], g, want, n, 1e-10);
            memcpy(g, x, n * sizeof(float));
            kiln_be_swiglu(bes[b], g, u, (int64_t)n);
            check_nmse("swiglu", bes[b], g, wg, n, 1e-10);
            kiln_be_add(bes[b], a, u, (int64_t)n);
            bes[b]->ops->add_bias(bes[b], a, bias, rows, width);
            check_equal("add + add_bias", bes[b], a, wa, n);
            for (size_t i = 0; i < n; i++) /* the definition, computed here: x + u + bias[column] */
                if (a[i] != (x[i] + u[i]) + bias[i % (size_t)width]) { fprintf(stderr, "add + add_bias on %s: element %zu\n", be_desc(bes[b]), i); fail(); }
            /* add_rmsnorm: x += u, then the norm of the sums — the floats of add followed by rmsnorm
             * on the same backend, bit for bit, and the ref backend's within the norm's bound */
            float *xf = copy_of(bes[b], x, n), *of = output(bes[b], n), *xs = copy_of(bes[b], x, n), *os = output(bes[b], n);
            kiln_be_add_rmsnorm(bes[b], xf, u, of, w, rows, width, 1e-5f);
            kiln_be_add(bes[b], xs, u, (int64_t)n);
            kiln_be_rmsnorm(bes[b], os, xs, w, rows, width, 1e-5f);
            kiln_be_wait(bes[b]);
            for (size_t i = 0; i < n; i++)
                if (xf[i] != x[i] + u[i]) { fprintf(stderr, "add_rmsnorm on %s: x element %zu is not x + d\n", be_desc(bes[b]), i); fail(); }
            if (memcmp(of, os, n * sizeof(float)) != 0) { fprintf(stderr, "add_rmsnorm on %s: not add then rmsnorm's floats\n", be_desc(bes[b])); fail(); }
            float *xr = copy_of(ref_be, x, n), *orf = output(ref_be, n);
            kiln_be_add(ref_be, xr, u, (int64_t)n);
            kiln_be_rmsnorm(ref_be, orf, xr, w, rows, width, 1e-5f);
            check_nmse("add_rmsnorm", bes[b], of, orf, n, 1e-10);
            kiln_be_free(ref_be, xr); kiln_be_free(ref_be, orf);
            kiln_be_free(bes[b], xf); kiln_be_free(bes[b], of); kiln_be_free(bes[b], xs); kiln_be_free(bes[b], os);
            kiln_be_free(bes[b], got); kiln_be_free(bes[b], g); kiln_be_free(bes[b], a);
        }
        kiln_be_free(ref_be, x); kiln_be_free(ref_be, w); kiln_be_free(ref_be, u); kiln_be_free(ref_be, bias);
        kiln_be_free(ref_be, want); kiln_be_free(ref_be, wg); kiln_be_free(ref_be, wa);
    }
}

/* RoPE in every layout: NEOX / NORM pairs, whole and partial rotary, YaRN; several heads and tokens. */
/* copy_rows: rows of a strided source into a strided destination, bit for bit (NaN payloads
 * too), the gaps of the destination untouched — into a backend buffer and into the caller's own
 * array (staged by the vulkan backend). */
static void test_copy_rows(void **state) {
    (void)state;
    static const int shapes[][4] = {{3, 7, 10, 9}, {5, 64, 64, 200}, {70, 1, 3, 2}, {2, 300, 310, 305}}; /* rows, width, dst stride, src stride */
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int rows = shapes[si][0], width = shapes[si][1], ds = shapes[si][2], ss = shapes[si][3];
        const size_t dn = (size_t)rows * (size_t)ds, sn = (size_t)rows * (size_t)ss;
        for (int b = 0; b < n_bes; b++)
            for (int own = 0; own < 2; own++) {
                float *src = input(bes[b], sn);
                uint32_t nan_bits = 0x7fa12345u; /* a signalling-NaN payload survives */
                memcpy(&src[0], &nan_bits, 4);
                float *dst = own ? malloc(dn * sizeof(float)) : kiln_be_alloc(bes[b], dn * sizeof(float));
                assert_non_null(dst);
                for (size_t i = 0; i < dn; i++) dst[i] = -1.5f;
                bes[b]->ops->copy_rows(bes[b], dst, ds, src, ss, rows, width);
                for (int i = 0; i < rows; i++)
                    for (int j = 0; j < ds; j++) {
                        const float *got = &dst[(size_t)i * ds + j];
                        const int ok = j < width ? memcmp(got, &src[(size_t)i * ss + j], 4) == 0 : *got == -1.5f;
                        if (!ok) { fprintf(stderr, "copy_rows on %s (%d x %d, strides %d / %d): row %d column %d\n", be_desc(bes[b]), rows, width, ds, ss, i, j); fail(); }
                    }
                if (own) free(dst); else kiln_be_free(bes[b], dst);
                kiln_be_free(bes[b], src);
            }
    }
}

static void test_rope(void **state) {
    (void)state;
    const kiln_yarn yarn = {.enabled = 1, .factor = 40.0f, .orig_ctx = 4096, .beta_fast = 32, .beta_slow = 1, .mscale = 1.0f, .mscale_all_dim = 1.0f};
    struct { int rot, hd; kiln_rope_style st; int use_yarn; } cases[] = {
        {64, 64, KILN_ROPE_NEOX, 0}, {64, 64, KILN_ROPE_NORM, 0}, {32, 128, KILN_ROPE_NEOX, 0}, {20, 40, KILN_ROPE_NORM, 0}, {64, 192, KILN_ROPE_NEOX, 1}};
    const int pos[5] = {0, 1, 17, 4095, 70000}, n = 5, H = 3;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        kiln_rope r;
        assert_int_equal(kiln_rope_init(&r, cases[c].rot, 10000.0f, cases[c].st, cases[c].use_yarn ? &yarn : NULL), KILN_OK);
        const int64_t stride = (int64_t)H * cases[c].hd + 3;
        float *x = input(ref_be, (size_t)n * (size_t)stride), *cs = output(ref_be, (size_t)n * (size_t)cases[c].rot);
        float *want = copy_of(ref_be, x, (size_t)n * (size_t)stride);
        ref_be->ops->rope_table(ref_be, &r, pos, n, cs);
        ref_be->ops->rope(ref_be, &r, want, n, stride, H, cases[c].hd, cs);
        if (!cases[c].use_yarn) /* the rotation written here from the definition (HF's float32 inv_freq) */
            for (int i = 0; i < n; i++)
                for (int h = 0; h < H; h++) {
                    const float *xi = x + (size_t)i * (size_t)stride + (size_t)h * (size_t)cases[c].hd;
                    const float *yi = want + (size_t)i * (size_t)stride + (size_t)h * (size_t)cases[c].hd;
                    const int half = cases[c].rot / 2;
                    for (int j = 0; j < half; j++) {
                        const float inv = 1.0f / powf(10000.0f, (float)(2 * j) / (float)cases[c].rot), ang = (float)pos[i] * inv;
                        const int ia = cases[c].st == KILN_ROPE_NORM ? 2 * j : j, ib = cases[c].st == KILN_ROPE_NORM ? 2 * j + 1 : j + half;
                        const double ea = (double)xi[ia] * cos((double)ang) - (double)xi[ib] * sin((double)ang);
                        const double eb = (double)xi[ib] * cos((double)ang) + (double)xi[ia] * sin((double)ang);
                        if (fabs(yi[ia] - ea) > 1e-5 * (1 + fabs(ea)) || fabs(yi[ib] - eb) > 1e-5 * (1 + fabs(eb))) {
                            fprintf(stderr, "rope case %zu token %d head %d pair %d: %g %g, expected %g %g\n", c, i, h, j, yi[ia], yi[ib], ea, eb);
                            fail();
                        }
                    }
                }
        /* token 2 (position 17): the rotation changes the first rot dims of each head and only them */
        for (int h = 0; h < H; h++) {
            const size_t o = 2 * (size_t)stride + (size_t)h * (size_t)cases[c].hd;
            assert_true(memcmp(want + o, x + o, (size_t)cases[c].rot * sizeof(float)) != 0);
            assert_memory_equal(want + o + cases[c].rot, x + o + cases[c].rot, (size_t)(cases[c].hd - cases[c].rot) * sizeof(float));
        }
        for (int b = 0; b < n_bes; b++) {
            float *cb = output(bes[b], (size_t)n * (size_t)cases[c].rot), *got = copy_of(bes[b], x, (size_t)n * (size_t)stride);
            bes[b]->ops->rope_table(bes[b], &r, pos, n, cb);
            check_equal("rope_table", bes[b], cb, cs, (size_t)n * (size_t)cases[c].rot);
            bes[b]->ops->rope(bes[b], &r, got, n, stride, H, cases[c].hd, cb);
            check_equal("rope", bes[b], got, want, (size_t)n * (size_t)stride + POISON);
            /* rope2: the same tensor as Q (H heads) and its first head alone as K (1 head, rows
             * `stride` apart, in a second copy) in one call — each the single rope's floats */
            float *q2 = copy_of(bes[b], x, (size_t)n * (size_t)stride), *k2 = copy_of(bes[b], x, (size_t)n * (size_t)stride);
            float *k1 = copy_of(ref_be, x, (size_t)n * (size_t)stride);
            ref_be->ops->rope(ref_be, &r, k1, n, stride, 1, cases[c].hd, cs);
            kiln_be_rope2(bes[b], &r, q2, stride, H, k2, stride, 1, n, cases[c].hd, cb);
            kiln_be_wait(bes[b]);
            check_equal("rope2 (first tensor)", bes[b], q2, want, (size_t)n * (size_t)stride + POISON);
            check_equal("rope2 (second tensor)", bes[b], k2, k1, (size_t)n * (size_t)stride + POISON);
            kiln_be_free(bes[b], q2); kiln_be_free(bes[b], k2); kiln_be_free(ref_be, k1);
            kiln_be_free(bes[b], cb); kiln_be_free(bes[b], got);
        }
        kiln_be_free(ref_be, x); kiln_be_free(ref_be, cs); kiln_be_free(ref_be, want);
    }
}

static void test_embed_argmax(void **state) {
    (void)state;
    const int32_t tokens[4] = {0, 6, 3, 6};
    for (int c = 0; c < N_WCASES; c++) {
        tweight t = make_weight(wcases[c].f, 7, wcases[c].cols, wcases[c].group, 0);
        float *want = output(ref_be, 4 * (size_t)wcases[c].cols);
        ref_be->ops->embed(ref_be, &t.w, tokens, 4, want);
        for (int i = 0; i < 4; i++) { /* each row is the token's row of the table, dequantised by the reference */
            float *row = malloc((size_t)wcases[c].cols * sizeof(float));
            assert_non_null(row);
            kiln_weight_row_f32(&t.w, tokens[i], row);
            assert_memory_equal(row, want + (size_t)i * (size_t)wcases[c].cols, (size_t)wcases[c].cols * sizeof(float));
            free(row);
        }
        for (int b = 0; b < n_bes; b++) {
            float *got = output(bes[b], 4 * (size_t)wcases[c].cols);
            bes[b]->ops->embed(bes[b], &t.w, tokens, 4, got);
            check_equal("embed", bes[b], got, want, 4 * (size_t)wcases[c].cols);
            kiln_be_free(bes[b], got);
        }
        kiln_be_free(ref_be, want);
        free_weight(&t);
    }
    /* argmax: ties take the first index, NaNs are never chosen past index 0 (llama2.c's loop) */
    float v[37];
    for (int trial = 0; trial < 4; trial++) {
        for (int i = 0; i < 37; i++) v[i] = nrand();
        if (trial == 1) { v[30] = 9.0f; v[12] = 9.0f; }
        if (trial == 2) { v[5] = NAN; v[20] = 7.0f; }
        if (trial == 3) v[0] = NAN;
        const int64_t want = ref_be->ops->argmax(ref_be, v, 37);
        if (trial == 1) assert_int_equal(want, 12);
        if (trial == 2) assert_int_equal(want, 20);
        for (int b = 0; b < n_bes; b++) assert_int_equal(bes[b]->ops->argmax(bes[b], v, 37), want);
    }
    for (int b = 0; b < n_bes; b++) assert_int_equal(bes[b]->ops->argmax(bes[b], v, 0), -1);
}

/* ---- MoE ---------------------------------------------------------------------------------------- */
static void test_moe(void **state) {
    (void)state;
    const kiln_moe_cfg c = {.n_experts = 8, .n_used = 3, .n_group = 4, .topk_group = 2, .norm_topk_prob = 1, .routed_scale = 2.5f,
                            .dim = 64, .ffn = 96};
    const kiln_wformat fmts[3] = {KILN_WF_INT4_GROUP, KILN_WF_F32, KILN_WF_FP8_BLOCK};
    for (int fi = 0; fi < 3; fi++) {
        const int E = c.n_experts, K = c.n_used, n = 5, grp = fmts[fi] == KILN_WF_INT4_GROUP ? 32 : fmts[fi] == KILN_WF_FP8_BLOCK ? 128 : 0;
        tweight tw[24];
        kiln_weight gate[8], up[8], down[8];
        for (int e = 0; e < E; e++) {
            tw[e] = make_weight(fmts[fi], c.ffn, c.dim, grp, 0);
            tw[E + e] = make_weight(fmts[fi], c.ffn, c.dim, grp, 0);
            tw[2 * E + e] = make_weight(fmts[fi], c.dim, c.ffn, grp, 0);
            gate[e] = tw[e].w; up[e] = tw[E + e].w; down[e] = tw[2 * E + e].w;
        }
        float *logits = input(ref_be, (size_t)n * E), tmp[16];
        int idx[15], ridx[15], count[8] = {0}, offset[9], active[8], slot[15], n_active = 0;
        float wt[15], rwt[15];
        const int limited = ref_be->ops->moe_route(ref_be, &c, logits, NULL, n, ridx, rwt, tmp);
        for (int b = 0; b < n_bes; b++) {
            assert_int_equal(bes[b]->ops->moe_route(bes[b], &c, logits, NULL, n, idx, wt, tmp), limited);
            assert_memory_equal(idx, ridx, sizeof idx);
            assert_memory_equal(wt, rwt, sizeof wt);
        }
        /* group the (token, expert) pairs by expert as model/moe.c does */
        for (int s = 0; s < n * K; s++) count[ridx[s]]++;
        offset[0] = 0;
        for (int e = 0; e < E; e++) { offset[e + 1] = offset[e] + count[e]; if (count[e]) active[n_active++] = e; count[e] = 0; }
        float *xg = output(ref_be, (size_t)n * K * c.dim);
        float *X = input(ref_be, (size_t)n * c.dim);
        for (int s = 0; s < n * K; s++) {
            const int e = ridx[s], row = offset[e] + count[e]++;
            slot[s] = row;
            memcpy(xg + (size_t)row * c.dim, X + (size_t)(s / K) * c.dim, (size_t)c.dim * sizeof(float));
        }
        float *hg = output(ref_be, (size_t)n * K * c.ffn), *ug = output(ref_be, (size_t)n * K * c.ffn), *yg = output(ref_be, (size_t)n * K * c.dim);
        float *want = output(ref_be, (size_t)n * c.dim);
        ref_be->ops->moe_experts(ref_be, &c, gate, up, down, active, n_active, offset, xg, hg, ug, yg);
        ref_be->ops->moe_combine(ref_be, n, K, c.dim, slot, rwt, yg, want);
        for (int i = 0; i < n; i++) /* the definition: Σ_j wt · yg[slot], in selection order */
            for (int d = 0; d < c.dim; d++) {
                float e = 0;
                for (int j = 0; j < K; j++) e += rwt[i * K + j] * yg[(size_t)slot[i * K + j] * c.dim + (size_t)d];
                assert_true(want[(size_t)i * c.dim + (size_t)d] == e);
            }
        /* routing: each token's experts are distinct, its weights sum to routed_scale (norm_topk_prob) */
        for (int i = 0; i < n; i++) {
            float sum = 0;
            for (int j = 0; j < K; j++) {
                sum += rwt[i * K + j];
                for (int q = 0; q < j; q++) assert_true(ridx[i * K + j] != ridx[i * K + q]);
                assert_true(ridx[i * K + j] >= 0 && ridx[i * K + j] < E);
            }
            assert_true(fabsf(sum - c.routed_scale) < 1e-5f);
        }
        for (int b = 0; b < n_bes; b++) {
            float *yb = output(bes[b], (size_t)n * K * c.dim), *got = output(bes[b], (size_t)n * c.dim);
            float *hb = output(bes[b], (size_t)n * K * c.ffn), *ub = output(bes[b], (size_t)n * K * c.ffn);
            bes[b]->ops->moe_experts(bes[b], &c, gate, up, down, active, n_active, offset, xg, hb, ub, yb);
            /* two matmuls in series (gate/up, then down on their product): each rounds its own x, so
             * the error of the output is about the sum of two matmuls' (2 × the format's bound) */
            check_nmse("moe_experts", bes[b], yb, yg, (size_t)n * K * c.dim, 2 * format_bound(fmts[fi], bes[b]));
            bes[b]->ops->moe_combine(bes[b], n, K, c.dim, slot, rwt, yg, got);
            check_equal("moe_combine", bes[b], got, want, (size_t)n * c.dim);
            kiln_be_free(bes[b], yb); kiln_be_free(bes[b], got); kiln_be_free(bes[b], hb); kiln_be_free(bes[b], ub);
        }
        kiln_be_free(ref_be, logits); kiln_be_free(ref_be, xg); kiln_be_free(ref_be, X); kiln_be_free(ref_be, hg);
        kiln_be_free(ref_be, ug); kiln_be_free(ref_be, yg); kiln_be_free(ref_be, want);
        for (int i = 0; i < 3 * E; i++) free_weight(&tw[i]);
    }
}

/* ---- the routed experts without the host (backend.h moe_routed) -------------------------------------
 * A backend that routes on its device (vulkan: moe_route.comp, the experts' matmuls by id, the
 * combine) gives the ref backend's routing and experts' output, token by token, at the expert
 * matmuls' error bound: the same experts chosen with the same weights (the router's sigmoid is
 * kiln_moe_sigmoid on both sides, bit for bit), for group-limited and plain routing, with and
 * without the correction bias, 1 to 40 tokens. A backend that says it routes natively must have
 * taken the op (returned 0). And through model/moe.c on the vulkan backend: a 20-token chunk
 * (routed on the host, experts over grouped rows) gives each token the floats it gets alone
 * (routed on the device), bit for bit. kiln_moe_sigmoid itself: the correctly rounded float of
 * 1 / (1 + e^-x) (long double) over a sweep of inputs. */
/* A chunk longer than the device's piece (KILN_VK_MOE_TOKENS: MOE_PIECE tokens here, 8,192 by default)
 * runs on the device in pieces: every token's floats those of the whole chunk in one piece, bit
 * for bit, with more dispatches (the pieces happened); a count the backend refuses is an error
 * naming it. */
#define MOE_PIECE 20
static void moe_in_pieces(const kiln_backend *whole, const kiln_moe_cfg *c, const float *logits, const kiln_moe_layer *L, const float *X, int n,
                          const float *want) {
    const char *vdi = getenv("KILN_VK_DEVICE_INDEX");
    kiln_backend *bad = NULL, *split = NULL;
    setenv("KILN_VK_MOE_TOKENS", "0", 1);
    assert_int_not_equal(kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &bad), KILN_OK);
    assert_non_null(strstr(kiln_last_error(), "KILN_VK_MOE_TOKENS: '0'"));
    if (!kiln_backend_vulkan_subgroups(whole)) setenv("KILN_VK_SUBGROUPS", "0", 1); /* the same reductions as the whole chunk's backend */
    setenv("KILN_VK_MOE_TOKENS", "20", 1); /* MOE_PIECE: 40 tokens in 20 + 20 (sorted tiles), 33 in 20 + 13 (tiles, then by id) */
    assert_int_equal(kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &split), KILN_OK);
    unsetenv("KILN_VK_MOE_TOKENS");
    unsetenv("KILN_VK_SUBGROUPS");
    assert_int_equal(kiln_backend_vulkan_subgroups(split), kiln_backend_vulkan_subgroups(whole));
    const size_t nk = (size_t)n * (size_t)c->n_used;
    uint64_t d0, d1, w0, w1, host;
    float *hg = output(whole, nk * c->ffn), *ug = output(whole, nk * c->ffn), *yg = output(whole, nk * c->dim), *y = output(whole, (size_t)n * c->dim);
    kiln_backend_vulkan_counts(whole, &w0, &host);
    assert_int_equal(whole->ops->moe_routed(whole, c, logits, L->bias, L->gate, L->up, L->down, X, n, hg, ug, yg, y), 0);
    kiln_backend_vulkan_counts(whole, &w1, &host);
    kiln_be_free(whole, hg); kiln_be_free(whole, ug); kiln_be_free(whole, yg); kiln_be_free(whole, y);
    hg = output(split, nk * c->ffn), ug = output(split, nk * c->ffn), yg = output(split, nk * c->dim), y = output(split, (size_t)n * c->dim);
    kiln_backend_vulkan_counts(split, &d0, &host);
    assert_int_equal(split->ops->moe_routed(split, c, logits, L->bias, L->gate, L->up, L->down, X, n, hg, ug, yg, y), 0);
    kiln_backend_vulkan_counts(split, &d1, &host);
    assert_true(d1 - d0 > w1 - w0);
    for (size_t i = 0; i < (size_t)n * c->dim; i++)
        if (memcmp(&y[i], &want[i], sizeof *y) != 0) {
            fprintf(stderr, "moe_routed in pieces of %d: token %zu [%zu] %.9g, whole chunk %.9g\n", MOE_PIECE, i / c->dim, i % c->dim, (double)y[i], (double)want[i]);
            fail();
        }
    kiln_be_free(split, hg); kiln_be_free(split, ug); kiln_be_free(split, yg); kiln_be_free(split, y);
    kiln_backend_free(split);
}

static void test_moe_routed(void **state) {
    (void)state;
    for (int i = 0; i < 200000; i++) {
        const float x = (float)((int)(rnd32() % 4000001u) - 2000000) * (i % 2 ? 1e-5f : 6e-5f);
        float want = (float)(1.0L / (1.0L + expl(-(long double)x)));
        if (want < 1.1754943508222875e-38f) want = 0.0f;
        if (kiln_moe_sigmoid(x) != want) { fprintf(stderr, "kiln_moe_sigmoid(%.9g) = %.9g, correctly rounded %.9g\n", (double)x, (double)kiln_moe_sigmoid(x), (double)want); fail(); }
    }
    const struct { kiln_moe_cfg c; kiln_wformat f; int n, bias; } cases[] = {
        {{.n_experts = 8, .n_used = 3, .n_group = 4, .topk_group = 2, .norm_topk_prob = 1, .routed_scale = 2.5f, .dim = 64, .ffn = 96}, KILN_WF_INT4_GROUP, 5, 0},
        {{.n_experts = 64, .n_used = 6, .n_group = 8, .topk_group = 3, .norm_topk_prob = 1, .routed_scale = 1.5f, .dim = 128, .ffn = 64}, KILN_WF_FP8_BLOCK, 16, 1},
        {{.n_experts = 16, .n_used = 4, .n_group = 1, .topk_group = 1, .norm_topk_prob = 0, .routed_scale = 1.0f, .dim = 64, .ffn = 32}, KILN_WF_Q8_0, 1, 1},
        {{.n_experts = 12, .n_used = 2, .n_group = 1, .topk_group = 1, .norm_topk_prob = 1, .routed_scale = 1.0f, .dim = 256, .ffn = 256}, KILN_WF_Q4_K, 7, 0},
        /* prefill chunks (more than 16 tokens): the entries sorted by expert on the device, tiles of 8 */
        {{.n_experts = 16, .n_used = 4, .n_group = 4, .topk_group = 2, .norm_topk_prob = 1, .routed_scale = 2.0f, .dim = 64, .ffn = 96}, KILN_WF_INT4_GROUP, 40, 1},
        {{.n_experts = 8, .n_used = 2, .n_group = 1, .topk_group = 1, .norm_topk_prob = 0, .routed_scale = 1.0f, .dim = 128, .ffn = 64}, KILN_WF_Q8_0, 33, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const kiln_moe_cfg *c = &cases[ci].c;
        const int E = c->n_experts, n = cases[ci].n, grp = cases[ci].f == KILN_WF_INT4_GROUP ? 32 : cases[ci].f == KILN_WF_FP8_BLOCK ? 128 : 0;
        tweight *tw = malloc(3 * (size_t)E * sizeof *tw);
        kiln_weight *w3 = malloc(3 * (size_t)E * sizeof *w3);
        assert_non_null(tw);
        assert_non_null(w3);
        for (int e = 0; e < 3 * E; e++) {
            tw[e] = e < 2 * E ? make_weight(cases[ci].f, c->ffn, c->dim, grp, 0) : make_weight(cases[ci].f, c->dim, c->ffn, grp, 0);
            w3[e] = tw[e].w;
        }
        kiln_moe_layer L = {.gate = w3, .up = w3 + E, .down = w3 + 2 * E};
        float bias[64];
        for (int e = 0; e < E; e++) bias[e] = 0.05f * nrand();
        if (cases[ci].bias) L.bias = bias;
        float *logits = input(ref_be, (size_t)n * E), *X = input(ref_be, (size_t)n * c->dim);
        /* the reference, token by token on the ref backend: its routing, each selected expert's
         * matmuls, the weighted sum in selection order */
        float *want = output(ref_be, (size_t)n * c->dim);
        int *idx = malloc((size_t)n * c->n_used * sizeof(int));
        float *wt = malloc((size_t)n * c->n_used * sizeof(float)), tmp[128];
        ref_be->ops->moe_route(ref_be, c, logits, L.bias, n, idx, wt, tmp);
        /* Y_i = Σ_j wt_ij · down(silu(gate x_i) · up x_i), each expert through the ref backend */
        float *h = output(ref_be, c->ffn), *u = output(ref_be, c->ffn), *y = output(ref_be, c->dim);
        for (int i = 0; i < n; i++) {
            float *yi = want + (size_t)i * c->dim;
            memset(yi, 0, (size_t)c->dim * sizeof(float));
            for (int j = 0; j < c->n_used; j++) {
                const int e = idx[i * c->n_used + j];
                kiln_be_matmul(ref_be, &L.gate[e], X + (size_t)i * c->dim, h, 1);
                kiln_be_matmul(ref_be, &L.up[e], X + (size_t)i * c->dim, u, 1);
                kiln_be_swiglu(ref_be, h, u, c->ffn);
                kiln_be_matmul(ref_be, &L.down[e], h, y, 1);
                for (int d = 0; d < c->dim; d++) yi[d] += wt[i * c->n_used + j] * y[d];
            }
        }
        for (int b = 0; b < n_bes; b++) {
            const kiln_backend *be = bes[b];
            if (!be->ops->moe_routed) continue;
            const size_t nk = (size_t)n * (size_t)c->n_used;
            float *hg = output(be, nk * c->ffn), *ug = output(be, nk * c->ffn), *yg = output(be, nk * c->dim), *got = output(be, (size_t)n * c->dim);
            const int rc = be->ops->moe_routed(be, c, logits, L.bias, L.gate, L.up, L.down, X, n, hg, ug, yg, got);
            if (be->ops->supports(be, KILN_OP_MOE_ROUTE, cases[ci].f)) assert_int_equal(rc, 0); /* on the device (by entry, or sorted tiles past 16 tokens) */
            if (rc == 0) check_nmse("moe_routed", be, got, want, (size_t)n * c->dim, 2 * format_bound(cases[ci].f, be));
            if (rc == 0 && be->kind == KILN_BACKEND_VULKAN && n > MOE_PIECE) moe_in_pieces(be, c, logits, &L, X, n, got);
            kiln_be_free(be, hg); kiln_be_free(be, ug); kiln_be_free(be, yg); kiln_be_free(be, got);
        }
        /* model/moe.c on each backend: a chunk of 20 tokens at once (the vulkan backend sorts its
         * entries by expert on the device and runs tiles of 8 of them) gives every token the floats
         * it gets alone (one workgroup per entry), bit for bit */
        tweight router = make_weight(KILN_WF_F32, E, c->dim, 0, 0);
        L.router = router.w;
        const int nc = 20;
        float *Xc = input(ref_be, (size_t)nc * c->dim);
        for (int b = 0; b < n_bes; b++) {
            const kiln_backend *be = bes[b];
            if (be->kind != KILN_BACKEND_VULKAN) continue; /* the cpu GEMM / GEMV pairs are not bit-identical for every format */
            kiln_moe_ws mw;
            assert_int_equal(kiln_moe_ws_init(&mw, be, c, nc), KILN_OK);
            float *all = output(be, (size_t)nc * c->dim), *one = output(be, c->dim), *xi = output(be, c->dim);
            assert_int_equal(kiln_moe_forward(be, c, &L, Xc, nc, all, &mw), KILN_OK);
            for (int i = 0; i < nc; i++) {
                memcpy(xi, Xc + (size_t)i * c->dim, (size_t)c->dim * sizeof(float));
                assert_int_equal(kiln_moe_forward(be, c, &L, xi, 1, one, &mw), KILN_OK);
                if (memcmp(one, all + (size_t)i * c->dim, (size_t)c->dim * sizeof(float)) != 0) {
                    fprintf(stderr, "moe forward on %s (%s experts): token %d of a %d-token chunk differs from the token alone\n", be_desc(be),
                            kiln_wformat_name(cases[ci].f), i, nc);
                    fail();
                }
            }
            kiln_moe_ws_free(&mw, be);
            kiln_be_free(be, all); kiln_be_free(be, one); kiln_be_free(be, xi);
        }
        free_weight(&router);
        kiln_be_free(ref_be, Xc);
        kiln_be_free(ref_be, h); kiln_be_free(ref_be, u); kiln_be_free(ref_be, y); kiln_be_free(ref_be, want);
        kiln_be_free(ref_be, logits); kiln_be_free(ref_be, X);
        free(idx); free(wt);
        for (int e = 0; e < 3 * E; e++) free_weight(&tw[e]);
        free(tw); free(w3);
    }
}

/* ---- KV store and attention --------------------------------------------------------------------- */
/* vd, shared: MLA's layout (V = the first vd values of the K row, no V array); dyn: FP8 with
 * dynamic per-page scales. */
typedef struct { int H, KV, kd, pt; kiln_kv_dtype dt; int len0, n, vd, shared, dyn; } kvcase;

/* Releases the two sequences of each backend's pool (ref's first) and the pools. */
static void free_pools(kiln_kv_pool **pools, kiln_kv_seq *sa, kiln_kv_seq *sb) {
    for (int p = 0; p <= n_bes; p++) {
        kiln_kv_seq_release(pools[p], &sa[p]);
        kiln_kv_seq_release(pools[p], &sb[p]);
        free(sa[p].pages);
        free(sb[p].pages);
        kiln_kv_pool_free(pools[p]);
    }
}

/* Two sequences: seq A holds len0 positions stored before, then the step stores and attends n
 * tokens of A (prefill tile) and one token of B (decode) in one batch. Each backend's pool takes
 * its layer arrays where that backend's attention reads them (kiln_be_kv_arrays: the vulkan
 * backend's device-addressable buffers), and a backend that says it runs kv_attend natively must
 * have run it on its device (the dispatch count grows). */
static void kv_case(const kvcase *c) {
    const int n_tok = c->n + 1, lenA = c->len0 + c->n, lenB = 9, vd = c->shared ? c->vd : c->kd;
    float ks[64], vs[64];
    for (int i = 0; i < c->KV; i++) { ks[i] = 0.02f + 0.01f * (float)i; vs[i] = 0.015f; }
    kiln_kv_config cfg = {.n_layers = 2, .n_kv_heads = c->KV, .head_dim = c->kd, .page_tokens = c->pt, .dtype = c->dt,
                          .v_dim = vd, .v_shares_k = c->shared, .scale_mode = c->dyn ? KILN_KV_SCALE_DYNAMIC : KILN_KV_SCALE_STATIC};
    float kscale[2 * 64], vscale[2 * 64];
    for (int i = 0; i < 2 * c->KV; i++) { kscale[i] = ks[i % c->KV]; vscale[i] = vs[i % c->KV]; }
    if (c->dt == KILN_KV_FP8 && !c->dyn) { cfg.k_scale = kscale; cfg.v_scale = vscale; }
    const int pages = 2 * ((lenA + c->pt - 1) / c->pt + (lenB + c->pt - 1) / c->pt) + 2;
    cfg.mem_bytes = (int64_t)kiln_kv_pool_fixed_bytes(&cfg) + (int64_t)pages * (int64_t)kiln_kv_page_cost(&cfg);
    /* one pool per backend run (the step stores into it), filled identically */
    kiln_kv_pool *pools[MAX_BE + 1];
    kiln_kv_seq sa[MAX_BE + 1], sb[MAX_BE + 1];
    const size_t kvd = (size_t)c->KV * (size_t)c->kd;
    float *hist = input(ref_be, (size_t)(c->len0 + lenB) * kvd * 2);
    float *k_step = input(ref_be, (size_t)n_tok * kvd), *v_step = input(ref_be, (size_t)n_tok * kvd);
    float *q = input(ref_be, (size_t)n_tok * (size_t)c->H * (size_t)c->kd);
    for (int p = 0; p <= n_bes; p++) {
        const kiln_backend *be = p == 0 ? ref_be : bes[p - 1];
        kiln_kv_config bc = cfg;
        kiln_be_kv_arrays(be, &bc);
        assert_int_equal(kiln_kv_pool_create(&bc, &pools[p]), KILN_OK);
        memset(&sa[p], 0, sizeof sa[p]);
        memset(&sb[p], 0, sizeof sb[p]);
        assert_int_equal(kiln_kv_seq_reserve(pools[p], &sa[p], lenA), KILN_OK);
        assert_int_equal(kiln_kv_seq_reserve(pools[p], &sb[p], lenB), KILN_OK);
        for (int l = 0; l < 2; l++) { /* history: A's first len0 and B's first lenB - 1 positions */
            for (int t = 0; t < c->len0; t++) {
                kiln_kv_seq *s = &sa[p];
                be->ops->kv_store(be, pools[p], &s, &t, 1, l, hist + (size_t)t * 2 * kvd, 0, c->shared ? NULL : hist + (size_t)t * 2 * kvd + kvd, 0);
            }
            for (int t = 0; t < lenB - 1; t++) {
                kiln_kv_seq *s = &sb[p];
                const float *h = hist + (size_t)(c->len0 + t) * 2 * kvd;
                be->ops->kv_store(be, pools[p], &s, &t, 1, l, h, 0, c->shared ? NULL : h + kvd, 0);
            }
        }
    }
    kiln_kv_seq *seqs[MAX_BE + 1][16];
    int pos[16];
    for (int i = 0; i < c->n; i++) pos[i] = c->len0 + i;
    pos[c->n] = lenB - 1;
    const size_t out_n = (size_t)n_tok * (size_t)c->H * (size_t)vd;
    float *want = NULL;
    for (int p = 0; p <= n_bes; p++) {
        const kiln_backend *be = p == 0 ? ref_be : bes[p - 1];
        for (int i = 0; i < c->n; i++) seqs[p][i] = &sa[p];
        seqs[p][c->n] = &sb[p];
        float *out = output(be, out_n);
        for (int l = 0; l < 2; l++) {
            be->ops->kv_store(be, pools[p], seqs[p], pos, n_tok, l, k_step, (int64_t)kvd, c->shared ? NULL : v_step, (int64_t)kvd);
            uint64_t d0 = 0, d1 = 0, host = 0;
            if (be->kind == KILN_BACKEND_VULKAN) kiln_backend_vulkan_counts(be, &d0, &host);
            be->ops->kv_attend(be, pools[p], l, n_tok, seqs[p], pos, q, c->H, 1.0f / sqrtf((float)c->kd), out);
            if (be->kind == KILN_BACKEND_VULKAN && be->ops->supports(be, KILN_OP_KV_ATTEND, KILN_WF_F32)) {
                kiln_backend_vulkan_counts(be, &d1, &host);
                assert_true(d1 > d0); /* the attention ran on the device */
            }
        }
        if (p == 0) want = out;
        else {
            char what[128];
            snprintf(what, sizeof what, "kv_attend %s%s H%d KV%d kd%d vd%d%s page%d len%d+%d", c->dt == KILN_KV_FP8 ? "fp8" : c->dt == KILN_KV_BF16 ? "bf16" : "f32",
                     c->dyn ? " dynamic" : "", c->H, c->KV, c->kd, vd, c->shared ? " (V in K)" : "", c->pt, c->len0, c->n);
            check_nmse(what, be, out, want, out_n, 1e-10);
            /* the stored rows are the same whatever the backend (the ref backend converts with the scalar
             * code, the cpu backends with their ISA's) */
            float r0[1024], r1[1024];
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < c->KV; h++)
                    for (int kv = 0; kv < (c->shared ? 1 : 2); kv++) {
                        for (int t = 0; t < lenA; t++) {
                            kiln_kv_read_row(pools[0], &sa[0], l, t, h, kv, r0);
                            kiln_kv_read_row(pools[p], &sa[p], l, t, h, kv, r1);
                            assert_memory_equal(r0, r1, (size_t)c->kd * sizeof(float));
                        }
                        for (int t = 0; t < lenB; t++) {
                            kiln_kv_read_row(pools[0], &sb[0], l, t, h, kv, r0);
                            kiln_kv_read_row(pools[p], &sb[p], l, t, h, kv, r1);
                            assert_memory_equal(r0, r1, (size_t)c->kd * sizeof(float));
                        }
                    }
            kiln_be_free(be, out);
        }
    }
    kiln_be_free(ref_be, want);
    free_pools(pools, sa, sb);
    kiln_be_free(ref_be, hist); kiln_be_free(ref_be, k_step); kiln_be_free(ref_be, v_step); kiln_be_free(ref_be, q);
}

static void test_kv(void **state) {
    (void)state;
    const kvcase cases[] = {
        {4, 4, 64, 16, KILN_KV_F32, 20, 1, 0, 0, 0},  {8, 2, 64, 16, KILN_KV_BF16, 37, 5, 0, 0, 0}, {12, 2, 40, 7, KILN_KV_FP8, 50, 3, 0, 0, 0},
        {6, 1, 64, 16, KILN_KV_FP8, 700, 1, 0, 0, 0}, {4, 4, 40, 1, KILN_KV_BF16, 3, 4, 0, 0, 0},   {24, 4, 64, 16, KILN_KV_F32, 0, 6, 0, 0, 0},
        /* dynamic FP8 scales; a long decode context (split over many workgroups on the device); MLA's
         * latent row (V in K, 576 / 512) in BF16 and FP8; odd row bytes (FP8 rows of 6 bytes) */
        {8, 2, 64, 16, KILN_KV_FP8, 45, 3, 0, 0, 1},    {4, 2, 64, 16, KILN_KV_BF16, 3000, 1, 0, 0, 0},
        {4, 1, 576, 16, KILN_KV_BF16, 40, 2, 512, 1, 0}, {4, 1, 576, 64, KILN_KV_FP8, 600, 1, 512, 1, 0},
        {3, 3, 6, 5, KILN_KV_FP8, 30, 2, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) kv_case(&cases[i]);
}

/* ---- KV integrity through each backend's attention ------------------------------------------------
 * Every backend verifies the seals of the pages its kv_attend reads — the cpu kernels by hashing
 * what they load, the vulkan shader by hashing on the device (rows of whole words) or the host
 * before the dispatch (rows of partial words). One sequence of 37 positions (pages of 8) per
 * backend: a clean call checks slices and detects nothing; then one bit of a stored K (or V) row
 * in slot 2 is flipped and the next call must publish slot 2 as bad with one content detection. */
typedef struct { kiln_kv_dtype dt; int hd, flip_v; } kvicase;

static void kv_integrity_case(const kiln_backend *be, const kvicase *c) {
    const int H = 2, NH = 4, PT = 8, LEN = 37;
    float ks[2 * 2], vs[2 * 2];
    for (int i = 0; i < 4; i++) ks[i] = vs[i] = 0.01f;
    kiln_kv_config cfg = {.n_layers = 2, .n_kv_heads = H, .head_dim = c->hd, .page_tokens = PT, .dtype = c->dt};
    if (c->dt == KILN_KV_FP8) { cfg.k_scale = ks; cfg.v_scale = vs; }
    cfg.mem_bytes = (int64_t)kiln_kv_pool_fixed_bytes(&cfg) + 8 * (int64_t)kiln_kv_page_cost(&cfg);
    kiln_be_kv_arrays(be, &cfg);
    kiln_kv_pool *p = NULL;
    assert_int_equal(kiln_kv_pool_create(&cfg, &p), KILN_OK);
    assert_int_equal(kiln_kv_integ_attach(p, KILN_KV_INTEGRITY_HEAL, 7, NULL, 1), KILN_OK);
    kiln_kv_seq sq = {0}, *sp = &sq;
    int32_t tok[64];
    for (int i = 0; i < LEN; i++) tok[i] = 100 + 7 * i;
    assert_int_equal(kiln_kv_integ_note(p, &sq, 0, tok, LEN, 1), KILN_OK);
    assert_int_equal(kiln_kv_seq_reserve(p, &sq, LEN), KILN_OK);
    const size_t kvd = (size_t)H * (size_t)c->hd;
    float *kv = input(be, 2 * kvd), *q = input(be, (size_t)NH * (size_t)c->hd), *out = output(be, (size_t)NH * (size_t)c->hd);
    for (int t = 0; t < LEN; t++) {
        for (size_t i = 0; i < 2 * kvd; i++) kv[i] = nrand();
        for (int l = 0; l < 2; l++) be->ops->kv_store(be, p, &sp, &t, 1, l, kv, 0, kv + kvd, 0);
    }
    sq.len = LEN;
    const int pos = LEN - 1;
    kiln_kv_integrity_stats st0, st1, st2;
    kiln_kv_integ_stats(p, &st0);
    for (int l = 0; l < 2; l++) be->ops->kv_attend(be, p, l, 1, &sp, &pos, q, NH, 0.3f, out);
    kiln_kv_integ_stats(p, &st1);
    assert_int_equal(kiln_kv_integ_bad_slot(&sq), -1);
    assert_int_equal(st1.detections, 0);
    assert_true(st1.checks >= st0.checks + 2 * 5 * 2 * (uint64_t)H); /* 2 layers × 5 slots × K, V × heads */
    /* one bit of layer 1's KV head 1, slot 2, row 3 */
    uint8_t *arr = c->flip_v ? p->v[1] : p->k[1];
    const size_t head = c->flip_v ? p->head_v : kiln_kv_head_k_at(p, 1), page = c->flip_v ? p->page_v : kiln_kv_page_k_at(p, 1);
    const size_t row = c->flip_v ? p->row_v : kiln_kv_row_k_at(p, 1);
    arr[(size_t)sq.pages[2] * page + head + 3 * row + 1] ^= 0x10;
    for (int l = 0; l < 2; l++) be->ops->kv_attend(be, p, l, 1, &sp, &pos, q, NH, 0.3f, out);
    kiln_kv_integ_stats(p, &st2);
    if (kiln_kv_integ_bad_slot(&sq) != 2 || st2.detections != 1 || st2.detected[KILN_KV_DETECT_CONTENT] != 1) {
        fprintf(stderr, "kv integrity on %s (%s, head dim %d, %s flipped): bad slot %d, %llu detections\n", be_desc(be),
                c->dt == KILN_KV_FP8 ? "fp8" : c->dt == KILN_KV_BF16 ? "bf16" : "f32", c->hd, c->flip_v ? "V" : "K", kiln_kv_integ_bad_slot(&sq),
                (unsigned long long)st2.detections);
        fail();
    }
    kiln_be_free(be, kv); kiln_be_free(be, q); kiln_be_free(be, out);
    kiln_kv_seq_release(p, &sq);
    free(sq.pages);
    kiln_kv_pool_free(p);
}

static void test_kv_integrity(void **state) {
    (void)state;
    /* whole-word rows (hashed where they are read) and FP8 rows of 6 bytes (verified first) */
    const kvicase cases[] = {{KILN_KV_FP8, 64, 0}, {KILN_KV_BF16, 32, 1}, {KILN_KV_F32, 16, 0}, {KILN_KV_FP8, 6, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kv_integrity_case(ref_be, &cases[i]);
        for (int b = 0; b < n_bes; b++) kv_integrity_case(bes[b], &cases[i]);
    }
}

/* ---- the KV store: conversions and seals ---------------------------------------------------------
 * Every backend stores rows bit for bit as the scalar reference converts them — the vulkan shader
 * converts on the device (BF16 / FP8 round to nearest even in integers, FP8 saturates at ±448 and
 * stores NaN as 0) — edge values included: ties at FP8 steps (subnormal and normal) and BF16 steps,
 * values around 448, infinities, NaN, ±0, float subnormals. With KV integrity on, the seals it
 * leaves (the vulkan shader's row hashes folded on the host) verify on the host: a full verification
 * of the sequences finds nothing, then one flipped bit is found. FP8 with K smoothing (key means
 * subtracted before the scale) too. One call stores a prefill tile of
 * one sequence (many rows of one page) and a decode token of another, as a batched step does. A
 * backend that says it runs kv_store natively must have dispatched. */
static float edge_value(uint32_t i) {
    static const uint32_t bits[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xff800001u, 0x7f800001u,
                                    0x00000001u, 0x80012345u, 0x00800000u, /* float subnormals, min normal */
                                    0x3f808000u, 0x3f818000u, 0x3f800001u, 0xbf808000u}; /* BF16 ties (1 + 2^-8, 1 + 3·2^-8) */
    static const float vals[] = {448.0f, 449.0f, 464.0f, 465.0f, 480.0f, -464.0f, 1e6f, -1e30f,           /* saturation */
                                 1.0625f, 1.1875f, -1.0625f, 0.0078125f * 1.0625f, 240.0f, 248.0f, 232.0f, /* normal FP8 ties */
                                 0.015625f, 0.015625f - 0.0009765625f, 0.0009765625f, 0.0029296875f, 0.0048828125f, /* 2^-6; subnormal ties */
                                 -0.0009765625f, 0.00048828125f, 0.0009765626f, 0.0009765624f, 0.0136718750f, 0.0068359375f};
    const uint32_t nb = sizeof bits / sizeof *bits, nv = sizeof vals / sizeof *vals;
    if (i < nb) { float f; memcpy(&f, &bits[i], 4); return f; }
    if (i < nb + nv) return vals[i - nb];
    return nrand() * ldexpf(1.0f, (int)(rnd32() % 24) - 14); /* magnitudes from 2^-14 to 2^10 */
}

typedef struct { kiln_kv_dtype dt; float scale; int hd, KV, shared, smooth; } kvscase;

static void kv_store_case(const kvscase *c) {
    const int PT = 8, LA = 19, LB = 5, L = 2, vd = c->shared ? c->hd - 64 : c->hd;
    float ks[8], vs[8];
    for (int i = 0; i < 8; i++) ks[i] = vs[i] = c->scale;
    kiln_kv_config cfg = {.n_layers = L, .n_kv_heads = c->KV, .head_dim = c->hd, .page_tokens = PT, .dtype = c->dt, .v_dim = vd, .v_shares_k = c->shared};
    if (c->dt == KILN_KV_FP8) { cfg.k_scale = ks; cfg.v_scale = vs; }
    float mu[2 * 4 * 64]; /* K smoothing: means [layer][KV head][k_dim] subtracted before the scale */
    for (int i = 0; i < L * c->KV * c->hd && c->smooth; i++) mu[i] = 0.3f * nrand();
    if (c->smooth) cfg.k_mean = mu;
    cfg.mem_bytes = (int64_t)kiln_kv_pool_fixed_bytes(&cfg) + 12 * (int64_t)kiln_kv_page_cost(&cfg);
    const size_t kvd = (size_t)c->KV * (size_t)c->hd;
    float *rows = input(ref_be, (size_t)(LA + LB) * 2 * kvd);
    for (size_t i = 0; i < (size_t)(LA + LB) * 2 * kvd; i++) rows[i] = edge_value((uint32_t)(i % 97 == 0 ? rnd32() % 40 : i < 40 ? i : 1000));
    int32_t tok[64];
    for (int i = 0; i < LA + LB; i++) tok[i] = 3 + 5 * i;
    kiln_kv_pool *pools[MAX_BE + 1];
    kiln_kv_seq sa[MAX_BE + 1], sb[MAX_BE + 1];
    for (int p = 0; p <= n_bes; p++) {
        const kiln_backend *be = p == 0 ? ref_be : bes[p - 1];
        kiln_kv_config bc = cfg;
        kiln_be_kv_arrays(be, &bc);
        assert_int_equal(kiln_kv_pool_create(&bc, &pools[p]), KILN_OK);
        assert_int_equal(kiln_kv_integ_attach(pools[p], KILN_KV_INTEGRITY_HEAL, 7, NULL, 1), KILN_OK);
        memset(&sa[p], 0, sizeof sa[p]);
        memset(&sb[p], 0, sizeof sb[p]);
        assert_int_equal(kiln_kv_integ_note(pools[p], &sa[p], 0, tok, LA, 1), KILN_OK);
        assert_int_equal(kiln_kv_integ_note(pools[p], &sb[p], 0, tok + LA, LB, 1), KILN_OK);
        assert_int_equal(kiln_kv_seq_reserve(pools[p], &sa[p], LA), KILN_OK);
        assert_int_equal(kiln_kv_seq_reserve(pools[p], &sb[p], LB), KILN_OK);
        /* B's first LB - 1 rows one by one; then one call: A's LA rows (3 pages, the last partial) and
         * B's last row */
        for (int l = 0; l < L; l++)
            for (int t = 0; t < LB - 1; t++) {
                kiln_kv_seq *s1 = &sb[p];
                const float *r = rows + (size_t)(LA + t) * 2 * kvd;
                be->ops->kv_store(be, pools[p], &s1, &t, 1, l, r, 0, c->shared ? NULL : r + kvd, 0);
            }
        kiln_kv_seq *seqs[64];
        int pos[64];
        for (int i = 0; i < LA; i++) { seqs[i] = &sa[p]; pos[i] = i; }
        seqs[LA] = &sb[p];
        pos[LA] = LB - 1;
        float *kin = output(be, (size_t)(LA + 1) * kvd), *vin = output(be, (size_t)(LA + 1) * kvd);
        for (int i = 0; i <= LA; i++) {
            const float *r = rows + (size_t)(i < LA ? i : LA + LB - 1) * 2 * kvd;
            memcpy(kin + (size_t)i * kvd, r, kvd * sizeof(float));
            memcpy(vin + (size_t)i * kvd, r + kvd, kvd * sizeof(float));
        }
        for (int l = 0; l < L; l++) {
            uint64_t d0 = 0, d1 = 0, host = 0;
            if (be->kind == KILN_BACKEND_VULKAN) kiln_backend_vulkan_counts(be, &d0, &host);
            be->ops->kv_store(be, pools[p], seqs, pos, LA + 1, l, kin, (int64_t)kvd, c->shared ? NULL : vin, (int64_t)kvd);
            if (be->kind == KILN_BACKEND_VULKAN && be->ops->supports(be, KILN_OP_KV_STORE, KILN_WF_F32)) {
                kiln_backend_vulkan_counts(be, &d1, &host);
                assert_true(d1 > d0); /* the store ran on the device */
            }
        }
        kiln_be_free(be, kin);
        kiln_be_free(be, vin);
        sa[p].len = LA;
        sb[p].len = LB;
        /* every stored byte as the reference wrote it */
        for (int l = 0; p > 0 && l < L; l++)
            for (int kind = 0; kind < (c->shared ? 1 : 2); kind++)
                for (int h = 0; h < c->KV; h++)
                    for (int w = 0; w < 2; w++) {
                        const kiln_kv_seq *s0 = w ? &sb[0] : &sa[0], *s1 = w ? &sb[p] : &sa[p];
                        for (int t = 0; t < (w ? LB : LA); t++) {
                            const size_t row = kind ? pools[0]->row_v : kiln_kv_row_k_at(pools[0], l);
                            const size_t head = kind ? pools[0]->head_v : kiln_kv_head_k_at(pools[0], l);
                            const size_t page = kind ? pools[0]->page_v : kiln_kv_page_k_at(pools[0], l);
                            const uint8_t *a0 = (kind ? pools[0]->v[l] : pools[0]->k[l]) + (size_t)s0->pages[t / PT] * page + (size_t)h * head + (size_t)(t % PT) * row;
                            const uint8_t *a1 = (kind ? pools[p]->v[l] : pools[p]->k[l]) + (size_t)s1->pages[t / PT] * page + (size_t)h * head + (size_t)(t % PT) * row;
                            if (memcmp(a0, a1, row) != 0) {
                                fprintf(stderr, "kv_store on %s (%s scale %g): layer %d %s head %d seq %c row %d differs from the reference\n", be_desc(be),
                                        c->dt == KILN_KV_FP8 ? "fp8" : c->dt == KILN_KV_BF16 ? "bf16" : "f32", (double)c->scale, l, kind ? "V" : "K", h,
                                        w ? 'B' : 'A', t);
                                fail();
                            }
                        }
                    }
    }
    for (int p = 0; p <= n_bes; p++) { /* the seals verify; one flipped bit (A's slot 1, row 2 of layer 1) does not */
        kiln_kv_integrity_stats st;
        assert_int_equal(kiln_kv_integ_verify_seq(pools[p], &sa[p]), 1);
        assert_int_equal(kiln_kv_integ_verify_seq(pools[p], &sb[p]), 1);
        kiln_kv_integ_stats(pools[p], &st);
        assert_int_equal(st.detections, 0);
        pools[p]->k[1][(size_t)sa[p].pages[1] * kiln_kv_page_k_at(pools[p], 1) + 2 * kiln_kv_row_k_at(pools[p], 1)] ^= 0x04;
        assert_int_equal(kiln_kv_integ_verify_seq(pools[p], &sa[p]), 0);
        kiln_kv_integ_stats(pools[p], &st);
        assert_int_equal(st.detected[KILN_KV_DETECT_CONTENT], 1);
    }
    free_pools(pools, sa, sb);
    kiln_be_free(ref_be, rows);
}

static void test_kv_store(void **state) {
    (void)state;
    const kvscase cases[] = {{KILN_KV_FP8, 1.0f, 64, 2, 0, 0}, {KILN_KV_FP8, 0.37f, 32, 3, 0, 0}, {KILN_KV_FP8, 0.05f, 64, 4, 0, 1},
                             {KILN_KV_BF16, 1.0f, 64, 2, 0, 0}, {KILN_KV_F32, 1.0f, 16, 1, 0, 0}, {KILN_KV_BF16, 1.0f, 576, 1, 1, 0},
                             {KILN_KV_FP8, 1.0f, 576, 1, 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) kv_store_case(&cases[i]);
}

/* ---- deferred steps (backend.h defer / sync) ---------------------------------------------------------
 * A chain of ops inside a deferred step gives exactly what the same chain gives op by op (the
 * vulkan backend records and submits later; the others compute at once): matmul → RMSNorm →
 * SwiGLU → add, a host-side op in the middle that reads a device result (argmax: the recorded work
 * must run first), model-style host access after kiln_be_wait, and an op writing the caller's own
 * array (staged, copied back at the flush) that the next op reads (it must not take the stale
 * bytes). */
static void deferred_chain(const kiln_backend *be, const tweight *w, const float *X, int n, int defer, float *out_y, float *own,
                           int64_t *amax_out) {
    const int64_t rows = w->w.rows;
    float *y = output(be, (size_t)n * (size_t)rows), *g = output(be, (size_t)n * (size_t)rows), *nw = input(be, (size_t)rows);
    for (int64_t i = 0; i < rows; i++) nw[i] = 1.0f + 0.01f * (float)i;
    if (defer) kiln_be_defer(be);
    kiln_be_matmul(be, &w->w, X, y, n);                         /* y = X·Wᵀ */
    kiln_be_rmsnorm(be, g, y, nw, n, (int)rows, 1e-5f);        /* g = norm(y) */
    *amax_out = be->ops->argmax(be, g, rows);                   /* host op: reads g */
    kiln_be_swiglu(be, g, y, (int64_t)n * rows);                /* g = silu(g)·y */
    kiln_be_matmul(be, &w->w, X, own, n);                       /* into the caller's own array (staged) */
    kiln_be_add(be, own, g, (int64_t)n * rows);                 /* reads own: the staged copy must not be stale */
    kiln_be_add(be, g, y, (int64_t)n * rows);
    if (defer) kiln_be_wait(be);
    memcpy(out_y, g, (size_t)n * (size_t)rows * sizeof(float)); /* model-style host read after the wait */
    if (defer) assert_int_equal(kiln_be_end(be), 0);
    kiln_be_free(be, y); kiln_be_free(be, g); kiln_be_free(be, nw);
}

static void test_deferred_steps(void **state) {
    (void)state;
    const int n = 5;
    tweight w = make_weight(KILN_WF_Q8_0, 96, 128, 0, 0);
    for (int b = 0; b < n_bes; b++) {
        const kiln_backend *be = bes[b];
        float *X = input(be, (size_t)n * 128);
        const size_t ny = (size_t)n * 96;
        float *now = malloc(ny * sizeof(float)), *later = malloc(ny * sizeof(float));
        float *own_now = calloc(ny, sizeof(float)), *own_later = calloc(ny, sizeof(float));
        assert_non_null(now); assert_non_null(later); assert_non_null(own_now); assert_non_null(own_later);
        int64_t a_now = -1, a_later = -2;
        uint64_t d0 = 0, d1 = 0, host = 0;
        if (be->kind == KILN_BACKEND_VULKAN) kiln_backend_vulkan_counts(be, &d0, &host);
        deferred_chain(be, &w, X, n, 0, now, own_now, &a_now);
        deferred_chain(be, &w, X, n, 1, later, own_later, &a_later);
        if (be->kind == KILN_BACKEND_VULKAN) {
            kiln_backend_vulkan_counts(be, &d1, &host);
            assert_true(d1 > d0 + 8); /* both chains dispatched on the device */
        }
        if (a_now != a_later || memcmp(now, later, ny * sizeof(float)) != 0 || memcmp(own_now, own_later, ny * sizeof(float)) != 0) {
            fprintf(stderr, "deferred step on %s: results differ from op-by-op (argmax %lld vs %lld)\n", be_desc(be), (long long)a_now,
                    (long long)a_later);
            fail();
        }
        free(now); free(later); free(own_now); free(own_later);
        kiln_be_free(be, X);
    }
    free_weight(&w);
}

/* ---- replayed command buffers (vulkan: vk_device.c) -------------------------------------------------
 * A deferred step of the same pipelines and bindings replays the command buffer recorded for it,
 * with its own parameters and workgroup counts: n = 2, then n = 3 over the same buffers, then n = 2
 * again with new inputs — each equal to the ref backend's chain, the last two replayed. A buffer
 * freed and a new one bound in its place records afresh (a destroyed buffer's handle may come back
 * for the new one: the old program must not be taken for it). */
static void replay_chain(const kiln_backend *be, const kiln_weight *w, const float *X, float *y, float *g, const float *nw, int n) {
    const int rows = (int)w->rows;
    kiln_be_defer(be);
    kiln_be_matmul(be, w, X, y, n);
    kiln_be_rmsnorm(be, g, y, nw, n, rows, 1e-5f);
    kiln_be_add(be, g, y, (int64_t)n * rows);
    assert_int_equal(kiln_be_end(be), 0);
}

static void replay_case(const kiln_backend *vk, const tweight *w, float *X, float *y, float *g, const float *nw, int n, const char *what) {
    const int64_t rows = w->w.rows, cols = w->w.cols;
    float *Xr = input(ref_be, (size_t)n * (size_t)cols), *yr = output(ref_be, (size_t)n * (size_t)rows), *gr = output(ref_be, (size_t)n * (size_t)rows);
    float *nwr = input(ref_be, (size_t)rows);
    memcpy(X, Xr, (size_t)n * (size_t)cols * sizeof(float)); /* fresh inputs every case */
    memcpy(nwr, nw, (size_t)rows * sizeof(float));
    replay_chain(ref_be, &w->w, Xr, yr, gr, nwr, n);
    replay_chain(vk, &w->w, X, y, g, nw, n);
    const double e = nmse(g, gr, (size_t)n * (size_t)rows);
    if (!(e < 1e-10)) {
        fprintf(stderr, "replayed step (%s, n = %d): NMSE %.3g against ref\n", what, n, e);
        fail();
    }
    kiln_be_free(ref_be, Xr); kiln_be_free(ref_be, yr); kiln_be_free(ref_be, gr); kiln_be_free(ref_be, nwr);
}

static void test_step_replay(void **state) {
    (void)state;
    const kiln_backend *vk = NULL;
    for (int b = 0; b < n_bes; b++)
        if (bes[b]->kind == KILN_BACKEND_VULKAN) vk = bes[b];
    if (!vk) { fprintf(stderr, "no vulkan backend: replay not tested\n"); return; }
    tweight w = make_weight(KILN_WF_F32, 96, 128, 0, 0);
    float *X = input(vk, 3 * 128), *y = output(vk, 3 * 96), *g = output(vk, 3 * 96), *nw = input(vk, 96);
    for (int i = 0; i < 96; i++) nw[i] = 0.5f + 0.01f * (float)i;
    uint64_t r0, p0, r1, p1;
    kiln_backend_vulkan_programs(vk, &r0, &p0);
    replay_case(vk, &w, X, y, g, nw, 2, "first");
    replay_case(vk, &w, X, y, g, nw, 3, "three tokens");
    replay_case(vk, &w, X, y, g, nw, 2, "new inputs");
    kiln_backend_vulkan_programs(vk, &r1, &p1);
    if (r1 != r0 + 1 || p1 != p0 + 2) {
        fprintf(stderr, "three steps of one shape: %llu recorded, %llu replayed (want 1, 2)\n", (unsigned long long)(r1 - r0), (unsigned long long)(p1 - p0));
        fail();
    }
    kiln_be_free(vk, y);
    y = output(vk, 3 * 96);
    replay_case(vk, &w, X, y, g, nw, 2, "a new buffer");
    kiln_backend_vulkan_programs(vk, &r0, &p0);
    if (r0 != r1 + 1 || p0 != p1) {
        fprintf(stderr, "after a buffer was replaced: %llu recorded, %llu replayed (want 1, 0)\n", (unsigned long long)(r0 - r1), (unsigned long long)(p0 - p1));
        fail();
    }
    kiln_be_free(vk, X); kiln_be_free(vk, y); kiln_be_free(vk, g); kiln_be_free(vk, nw);
    free_weight(&w);
}

/* ---- DeepSeek sparse attention ops --------------------------------------------------------------- */
/* E4M3 written out here from the format (bias 7, 3 mantissa bits, subnormals below 2^-6, max 448):
 * round to nearest, ties to the even code, saturating; the comparison for fp8_round. */
static double e4m3_value(int code) { /* code 0..126: the non-negative finite values, ascending */
    int e = code >> 3, m = code & 7;
    return e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
}
static double e4m3_round(double x) {
    double a = fabs(x) > 448.0 ? 448.0 : fabs(x);
    int best = 0;
    for (int c = 1; c <= 126; c++) {
        double d = fabs(e4m3_value(c) - a), db = fabs(e4m3_value(best) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return x < 0 ? -e4m3_value(best) : e4m3_value(best);
}

static void test_dsa_norm_fp8(void **state) {
    (void)state;
    /* layernorm: rows of 128 with an offset (a mean to remove), against double arithmetic */
    const int rows = 7, w = 128;
    float *x = input(ref_be, (size_t)rows * w), *g = input(ref_be, w), *b = input(ref_be, w);
    for (int i = 0; i < rows * w; i++) x[i] = 3.0f + 2.0f * x[i];
    for (int i = 0; i < w; i++) x[i] = 3.0f; /* a constant row: every x − mean is 0, and × a negative weight −0 */
    for (int i = 0; i < w; i += 3) g[i] = -fabsf(g[i]) - 0.1f;
    double *want = malloc((size_t)rows * w * sizeof *want);
    for (int r = 0; r < rows; r++) {
        double mean = 0, var = 0;
        for (int i = 0; i < w; i++) mean += x[r * w + i];
        mean /= w;
        for (int i = 0; i < w; i++) var += (x[r * w + i] - mean) * (x[r * w + i] - mean);
        var /= w;
        for (int i = 0; i < w; i++) want[r * w + i] = (x[r * w + i] - mean) / sqrt(var + 1e-6) * g[i] + b[i];
    }
    /* The vulkan backend's result is the host's bit for bit (the ref and cpu backends run
     * kiln_be_common_layernorm): with 64-bit floats (layernorm64) by construction on any device;
     * the float variant (a third backend object, KILN_VK_F64=0) on lavapipe, whose float division
     * and sqrt are IEEE — on a GPU it may differ in the last bit, so it is held to the bound only. */
    kiln_backend *nof64 = NULL;
    for (int b = 0; b < n_bes && !nof64; b++)
        if (bes[b]->kind == KILN_BACKEND_VULKAN) {
            const char *vdi = getenv("KILN_VK_DEVICE_INDEX");
            setenv("KILN_VK_F64", "0", 1);
            assert_int_equal(kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &nof64), KILN_OK);
            unsetenv("KILN_VK_F64");
        }
    float *host_out = malloc((size_t)rows * w * sizeof *host_out), *nob = malloc((size_t)rows * w * sizeof *nob);
    ref_be->ops->layernorm(ref_be, host_out, x, g, b, rows, w, 1e-6f);
    ref_be->ops->layernorm(ref_be, nob, x, g, NULL, rows, w, 1e-6f);
    for (int i = 0; i < w; i++) assert_false(signbit(nob[i])); /* the constant row: +0 everywhere, −0 × … + 0.0 included */
    for (int p = 0; p <= n_bes + (nof64 != NULL); p++) {
        const kiln_backend *be = p == 0 ? ref_be : p <= n_bes ? bes[p - 1] : nof64;
        float *out = output(be, (size_t)rows * w);
        uint64_t d0 = 0, d1 = 0, host = 0;
        if (be->kind == KILN_BACKEND_VULKAN) kiln_backend_vulkan_counts(be, &d0, &host);
        be->ops->layernorm(be, out, x, g, b, rows, w, 1e-6f);
        if (be->kind == KILN_BACKEND_VULKAN) { /* on the device */
            kiln_backend_vulkan_counts(be, &d1, &host);
            assert_int_equal(d1 - d0, 1);
        }
        for (int i = 0; i < rows * w; i++) assert_true(fabs(out[i] - want[i]) <= 1e-5 * (1.0 + fabs(want[i])));
        /* bit for bit: the doubles variant on any device; the float one where division and sqrt are IEEE */
        const int exact = be->kind == KILN_BACKEND_VULKAN && (kiln_backend_vulkan_f64(be) || strstr(be->device_name, "llvmpipe"));
        if (be == nof64) assert_false(kiln_backend_vulkan_f64(be));
        if (exact) {
            assert_memory_equal(out, host_out, (size_t)rows * w * sizeof *out);
            kiln_backend_vulkan_counts(be, &d0, &host);
            be->ops->layernorm(be, out, x, g, NULL, rows, w, 1e-6f); /* no bias: + 0.0 as the host adds it (−0 becomes +0) */
            kiln_backend_vulkan_counts(be, &d1, &host);
            assert_int_equal(d1 - d0, 1);
            assert_memory_equal(out, nob, (size_t)rows * w * sizeof *out);
        }
        kiln_be_free(be, out);
    }
    if (nof64) kiln_backend_free(nof64);
    free(host_out);
    free(nob);
    /* fp8_round: without the rotation every value must equal the rounding computed here exactly
     * (power-of-two scale from the block's amax, E4M3 nearest-even); with it, the Hadamard is done
     * here in double, so a value sitting on an FP8 rounding boundary may land one step apart */
    const int fr = 5, fw = 256;
    float *src = input(ref_be, (size_t)fr * fw);
    for (int i = 0; i < fr * fw; i++) src[i] *= (i / 128) % 3 == 0 ? 1e-3f : (i / 128) % 3 == 1 ? 50.0f : 1.0f;
    src[3] = 0.0f;
    for (int i = 128; i < 256; i++) src[i] = 1e-6f * src[i]; /* amax below the 1e-4 clamp */
    for (int had = 0; had <= 1; had++) {
        double *v = malloc((size_t)fr * fw * sizeof *v);
        for (int r = 0; r < fr; r++)
            for (int i = 0; i < fw; i++) {
                double acc = 0;
                if (had)
                    for (int j = 0; j < fw; j++) acc += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * src[r * fw + j];
                else acc = src[r * fw + i];
                v[r * fw + i] = had ? acc / sqrt((double)fw) : acc;
            }
        for (int blk = 0; blk < fr * fw / 128; blk++) {
            double amax = 1e-4;
            for (int i = 0; i < 128; i++) amax = fmax(amax, fabs(v[blk * 128 + i]));
            double sc = ldexp(1.0, (int)ceil(log2((float)((float)amax * (1.0f / 448.0f)))));
            for (int i = 0; i < 128; i++) v[blk * 128 + i] = e4m3_round(v[blk * 128 + i] / sc) * sc;
        }
        for (int p = 0; p <= n_bes; p++) {
            const kiln_backend *be = p == 0 ? ref_be : bes[p - 1];
            float *y = output(be, (size_t)fr * fw);
            memcpy(y, src, (size_t)fr * fw * sizeof *y);
            uint64_t d0 = 0, d1 = 0, host = 0;
            if (be->kind == KILN_BACKEND_VULKAN) kiln_backend_vulkan_counts(be, &d0, &host);
            be->ops->fp8_round(be, y, fr, fw, had);
            if (be->kind == KILN_BACKEND_VULKAN) { /* on the device */
                kiln_backend_vulkan_counts(be, &d1, &host);
                assert_int_equal(d1 - d0, 1);
            }
            int off_by_step = 0;
            for (int i = 0; i < fr * fw; i++) {
                if ((double)y[i] == v[i]) continue;
                off_by_step++;
                assert_true(had);                                       /* exact without the rotation */
                assert_true(fabs(y[i] - v[i]) <= fabs(v[i]) / 8.0 + 1e-30); /* one E4M3 step at most */
            }
            assert_true(off_by_step <= fr * fw / 200);
            kiln_be_free(be, y);
        }
        free(v);
    }
    /* a block holding an infinity: its scale is +inf and 1/scale 0 (the host's 1.0f / inf), so every
     * value of the block comes back NaN (0 × inf), on every backend; the next block is untouched */
    for (int p = 0; p <= n_bes; p++) {
        const kiln_backend *be = p == 0 ? ref_be : bes[p - 1];
        float *y = output(be, 256);
        memcpy(y, src, 256 * sizeof *y);
        y[5] = INFINITY;
        y[9] = -3.0f;
        uint64_t d0 = 0, d1 = 0, host = 0;
        if (be->kind == KILN_BACKEND_VULKAN) kiln_backend_vulkan_counts(be, &d0, &host);
        be->ops->fp8_round(be, y, 1, 256, 0);
        if (be->kind == KILN_BACKEND_VULKAN) { /* on the device */
            kiln_backend_vulkan_counts(be, &d1, &host);
            assert_int_equal(d1 - d0, 1);
        }
        for (int i = 0; i < 128; i++) assert_true(isnan(y[i]));
        float *z = output(ref_be, 256);
        memcpy(z, src, 256 * sizeof *z);
        ref_be->ops->fp8_round(ref_be, z, 1, 256, 0);
        assert_memory_equal(y + 128, z + 128, 128 * sizeof *y);
        kiln_be_free(ref_be, z);
        kiln_be_free(be, y);
    }
    free(want);
    kiln_be_free(ref_be, x); kiln_be_free(ref_be, g); kiln_be_free(ref_be, b); kiln_be_free(ref_be, src);
}

/* act_quant of n values (a multiple of 128) in place, written here from kernel.py: per 128, scale =
 * 2^ceil(log2(max(amax, 1e-4) / 448)), values rounded to E4M3 of x / scale, times the scale. */
static void act_quant_here(float *x, int n) {
    for (int b0 = 0; b0 < n; b0 += 128) {
        double amax = 1e-4;
        for (int i = b0; i < b0 + 128; i++) amax = fmax(amax, fabs(x[i]));
        const double sc = ldexp(1.0, (int)ceil(log2((float)((float)amax * (1.0f / 448.0f)))));
        for (int i = b0; i < b0 + 128; i++) x[i] = (float)(e4m3_round(x[i] / sc) * sc);
    }
}

/* The indexer's selection and the sparse attention over a pool of DSA compact rows (kv.h: latent
 * 128 and indexer key 128 as FP8 codes + scales, rope 16 in dt): two sequences (a decode token and a
 * 5-token prefill chunk), against a brute-force selection and a softmax computed here in double.
 * The rows are act_quant'ed here first (as the model does before storing), so the pool must hand
 * them back bit for bit. */
/* A second vulkan backend whose indexer scans in token groups (KILN_VK_INDEX_BYTES: the scores of
 * a few tokens at a time), as a long chunk at a long context does: the same selection, every page
 * still hashed once. */
static kiln_backend *dsa_grouped;
static size_t dsa_grouped_bytes;

static void dsa_case(kiln_kv_dtype dt, int pt, int ctx, int topk, int integ) {
    const int lat = 128, rope = 16, kq = lat + rope, vd = lat, d = 128, Hi = 4, H = 3, n = 6;
    kiln_kv_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = kq + d, .k_dim = kq + d, .v_dim = vd, .v_shares_k = 1,
                          .page_tokens = pt, .dtype = dt, .dsa_latent = lat, .dsa_rope = rope, .dsa_key = d};
    cfg.mem_bytes = (int64_t)kiln_kv_pool_fixed_bytes(&cfg) + (int64_t)(2 * ((ctx + pt - 1) / pt) + 2) * (int64_t)kiln_kv_page_cost(&cfg);
    assert_int_equal(kiln_kv_row_bytes(&cfg, 0), 128 + 4 + rope * (dt == KILN_KV_F32 ? 4 : 2) + 128 + 4);
    const int row = kq + d;
    float *rows = input(ref_be, (size_t)2 * ctx * row);
    for (int t = 0; t < 2 * ctx; t++) {
        float *r = rows + (size_t)t * row;
        if (t % 7 == 3) for (int i = 0; i < lat; i++) r[i] *= 1e-6f; /* a latent under the 1e-4 clamp */
        act_quant_here(r, lat);
        act_quant_here(r + kq, d);
        if (t % 3 == 1) memcpy(r + kq, r - row + kq, (size_t)d * sizeof *r); /* the previous position's key: equal scores, the lower position wins */
        if (dt == KILN_KV_BF16) /* a rope part bf16 holds exactly */
            for (int i = lat; i < kq; i++) { /* the low 16 bits cleared */
                uint32_t u;
                memcpy(&u, &r[i], 4);
                u &= 0xFFFF0000u;
                memcpy(&r[i], &u, 4);
            }
    }
    float *qi = input(ref_be, (size_t)n * Hi * d), *w = input(ref_be, (size_t)n * Hi), *q = input(ref_be, (size_t)n * H * kq);
    for (int i = 0; i < n * Hi; i++) act_quant_here(qi + (size_t)i * d, d); /* the indexer's queries are FP8-rounded too */
    int pos[6] = {ctx - 1, ctx - 5, ctx - 4, ctx - 3, ctx - 2, ctx - 1};
    int32_t *want_sel = malloc((size_t)n * topk * sizeof *want_sel);
    int want_n[6];
    double *want_out = calloc((size_t)n * H * vd, sizeof *want_out);
    for (int i = 0; i < n; i++) {
        const float *R = rows + (size_t)(i == 0 ? 0 : ctx) * row; /* token 0: sequence A, the others sequence B */
        const int m = pos[i] + 1;
        double *sc = malloc((size_t)m * sizeof *sc);
        for (int t = 0; t < m; t++) {
            double s = 0;
            for (int h = 0; h < Hi; h++) {
                double dot = 0;
                for (int e = 0; e < d; e++) dot += (double)qi[((size_t)i * Hi + h) * d + e] * R[(size_t)t * row + kq + e];
                s += 0.5 * w[i * Hi + h] * (dot > 0 ? dot : 0);
            }
            sc[t] = s;
        }
        int k = m < topk ? m : topk;
        unsigned char *taken = calloc((size_t)m, 1);
        for (int j = 0; j < k; j++) { /* the best remaining, the lower position on ties */
            int b = -1;
            for (int t = 0; t < m; t++)
                if (!taken[t] && (b < 0 || sc[t] > sc[b])) b = t;
            taken[b] = 1;
        }
        want_n[i] = 0;
        for (int t = 0; t < m; t++)
            if (taken[t]) want_sel[(size_t)i * topk + want_n[i]++] = t;
        for (int h = 0; h < H; h++) {
            double mx = -INFINITY, *p = malloc((size_t)k * sizeof *p), sum = 0;
            for (int j = 0; j < k; j++) {
                const int t = want_sel[(size_t)i * topk + j];
                double dot = 0;
                for (int e = 0; e < kq; e++) dot += (double)q[((size_t)i * H + h) * kq + e] * R[(size_t)t * row + e];
                p[j] = dot * 0.125;
                mx = fmax(mx, p[j]);
            }
            for (int j = 0; j < k; j++) sum += (p[j] = exp(p[j] - mx));
            for (int j = 0; j < k; j++)
                for (int c = 0; c < vd; c++)
                    want_out[((size_t)i * H + h) * vd + c] += p[j] / sum * R[(size_t)want_sel[(size_t)i * topk + j] * row + c];
            free(p);
        }
        free(taken);
        free(sc);
    }
    for (int p = 0; p <= n_bes + (dsa_grouped != NULL); p++) {
        const kiln_backend *be = p == 0 ? ref_be : p <= n_bes ? bes[p - 1] : dsa_grouped;
        /* scan + top-k per group of tokens (one group unless the scores are limited) */
        const int per = be == dsa_grouped ? (int)(dsa_grouped_bytes / ((size_t)ctx * sizeof(float))) : n;
        assert_true(per > 0); /* a case whose one token's scores pass the bound would run on the host */
        const int groups = (n + per - 1) / per;
        kiln_kv_pool *pool;
        kiln_kv_config bc = cfg;
        kiln_be_kv_arrays(be, &bc); /* where that backend's sparse ops read the rows */
        assert_int_equal(kiln_kv_pool_create(&bc, &pool), KILN_OK);
        kiln_kv_seq sa = {0}, sb = {0};
        if (integ) {
            int32_t *tok = malloc((size_t)ctx * sizeof *tok);
            for (int t = 0; t < ctx; t++) tok[t] = 11 + 3 * t;
            assert_int_equal(kiln_kv_integ_attach(pool, KILN_KV_INTEGRITY_HEAL, 7, NULL, 1), KILN_OK);
            assert_int_equal(kiln_kv_integ_note(pool, &sa, 0, tok, ctx, 1), KILN_OK);
            tok[0] = 5; /* another prefix */
            assert_int_equal(kiln_kv_integ_note(pool, &sb, 0, tok, ctx, 1), KILN_OK);
            free(tok);
        }
        assert_int_equal(kiln_kv_seq_reserve(pool, &sa, ctx), KILN_OK);
        assert_int_equal(kiln_kv_seq_reserve(pool, &sb, ctx), KILN_OK);
        /* a backend that runs an op natively must have dispatched it (vulkan: store 1, indexer scan
         * and top-k 2, sparse attention 1, and with verification and KV integrity a hashing scan) */
        const int vk = be->kind == KILN_BACKEND_VULKAN;
        uint64_t d0 = 0, d1 = 0, host = 0;
        if (vk) kiln_backend_vulkan_counts(be, &d0, &host);
        for (int t = 0; t < ctx; t++) {
            kiln_kv_seq *s1 = &sa, *s2 = &sb;
            be->ops->kv_store(be, pool, &s1, &t, 1, 0, rows + (size_t)t * row, 0, NULL, 0);
            be->ops->kv_store(be, pool, &s2, &t, 1, 0, rows + (size_t)(ctx + t) * row, 0, NULL, 0);
        }
        sa.len = sb.len = ctx;
        if (vk) {
            kiln_backend_vulkan_counts(be, &d1, &host);
            assert_int_equal(d1 - d0, 2 * (uint64_t)ctx);
        }
        float *back = malloc((size_t)row * sizeof *back); /* the compact rows give back the values stored */
        for (int t = 0; t < ctx; t++) {
            kiln_kv_read_row(pool, &sa, 0, t, 0, 0, back);
            assert_memory_equal(back, rows + (size_t)t * row, (size_t)row * sizeof *back);
            kiln_kv_read_row(pool, &sb, 0, t, 0, 0, back);
            assert_memory_equal(back, rows + (size_t)(ctx + t) * row, (size_t)row * sizeof *back);
        }
        free(back);
        kiln_kv_seq *seqs[6] = {&sa, &sb, &sb, &sb, &sb, &sb};
        /* the selection in the backend's memory, as model/mla.c keeps it */
        int32_t *sel = kiln_be_alloc(be, (size_t)n * topk * sizeof *sel);
        int *nsel = kiln_be_alloc(be, (size_t)n * sizeof *nsel);
        float *out = output(be, (size_t)n * H * vd);
        if (vk) kiln_backend_vulkan_counts(be, &d0, &host);
        be->ops->kv_index_topk(be, pool, 0, n, seqs, pos, qi, Hi, d, kq, w, 0.5f, topk, sel, nsel);
        if (vk) {
            kiln_backend_vulkan_counts(be, &d1, &host);
            assert_int_equal(d1 - d0, 2 * (uint64_t)groups);
        }
        for (int i = 0; i < n; i++) {
            assert_int_equal(nsel[i], want_n[i]);
            assert_memory_equal(sel + (size_t)i * topk, want_sel + (size_t)i * topk, (size_t)want_n[i] * sizeof *sel);
        }
        for (int verify = 0; verify <= 1; verify++) {
            if (vk) kiln_backend_vulkan_counts(be, &d0, &host);
            be->ops->kv_attend_sparse(be, pool, 0, n, seqs, pos, sel, nsel, topk, q, H, kq, 0.125f, verify, out);
            if (vk) {
                kiln_backend_vulkan_counts(be, &d1, &host);
                assert_int_equal(d1 - d0, verify && integ ? 2 : 1);
            }
            for (int i = 0; i < n * H * vd; i++) assert_true(fabs(out[i] - want_out[i]) <= 1e-5 * (1.0 + fabs(want_out[i])));
        }
        if (integ) { /* nothing detected so far; one flipped bit of B's slot 1 is caught by the indexer's pass and by a verifying attention */
            kiln_kv_integrity_stats st;
            kiln_kv_integ_stats(pool, &st);
            assert_int_equal(st.detections, 0);
            assert_true(st.checks > 0);
            const size_t rb = kiln_kv_row_k_at(pool, 0);
            for (int pass = 0; pass < 2; pass++) {
                pool->k[0][(size_t)sb.pages[1] * kiln_kv_page_k_at(pool, 0) + (pt > 2 ? 2 : 0) * rb + rb - 3] ^= 0x20;
                if (pass == 0) be->ops->kv_index_topk(be, pool, 0, n, seqs, pos, qi, Hi, d, kq, w, 0.5f, topk, sel, nsel);
                else be->ops->kv_attend_sparse(be, pool, 0, n, seqs, pos, sel, nsel, topk, q, H, kq, 0.125f, 1, out);
                kiln_kv_integ_stats(pool, &st);
                if (kiln_kv_integ_bad_slot(&sb) != 1 || st.detected[KILN_KV_DETECT_CONTENT] != (uint64_t)pass + 1 || kiln_kv_integ_bad_slot(&sa) != -1) {
                    fprintf(stderr, "dsa integrity on %s (%s): pass %d: bad slots %d / %d, %llu content detections\n", be_desc(be),
                            pass ? "sparse attention" : "indexer", pass, kiln_kv_integ_bad_slot(&sa), kiln_kv_integ_bad_slot(&sb),
                            (unsigned long long)st.detected[KILN_KV_DETECT_CONTENT]);
                    fail();
                }
                pool->k[0][(size_t)sb.pages[1] * kiln_kv_page_k_at(pool, 0) + (pt > 2 ? 2 : 0) * rb + rb - 3] ^= 0x20; /* restored */
                kiln_kv_integ_clear_bad(&sb);
            }
        }
        kiln_be_free(be, sel);
        kiln_be_free(be, nsel);
        kiln_be_free(be, out);
        kiln_kv_seq_release(pool, &sa);
        kiln_kv_seq_release(pool, &sb);
        free(sa.pages); /* the block tables (the release returns the pages, not the tables) */
        free(sb.pages);
        kiln_kv_pool_free(pool);
    }
    free(want_sel);
    free(want_out);
    kiln_be_free(ref_be, rows); kiln_be_free(ref_be, qi); kiln_be_free(ref_be, w); kiln_be_free(ref_be, q);
}

/* kiln_kv_index_fn (kv_isa.h): every ISA's kernel gives the scalar kernel's scores bit for bit (one
 * summation order by definition), and those are the exact scores within f32 summation error: head
 * counts that fill part of a lane set (4, 20 of 32 padded) and keys of one and two blocks; random
 * codes (subnormals included, never the NaN codes) with scales 2^-20 .. 2^3. */
static void test_dsa_index_kernels(void **state) {
    (void)state;
    kiln_fp_init();
    const int shapes[3][2] = {{4, 128}, {20, 256}, {16, 128}}; /* Hi, d */
    for (int c = 0; c < 3; c++) {
        const int Hi = shapes[c][0], d = shapes[c][1], hp = (Hi + 15) / 16 * 16, n = 29;
        const size_t kb = (size_t)d + (size_t)d / 32;
        uint8_t *keys = malloc((size_t)n * kb);
        const uint8_t *key[29];
        float *qt = calloc((size_t)d * hp, sizeof *qt), *w = malloc((size_t)Hi * sizeof *w), *scr = malloc(KILN_KV_INDEX_SCRATCH(d, hp) * sizeof *scr);
        float want[29], got[29];
        for (int i = 0; i < n; i++) {
            uint8_t *k = keys + (size_t)i * kb;
            for (int e = 0; e < d; e++) {
                uint8_t v = (uint8_t)(rnd32() & 0xFF);
                k[e] = (v & 0x7F) == 0x7F ? (uint8_t)(v ^ 1) : v;
            }
            for (int b = 0; b < d / 128; b++) {
                const float sc = ldexpf(1.0f, (int)(rnd32() % 24) - 20);
                memcpy(k + d + 4 * b, &sc, 4);
            }
            key[i] = k;
        }
        for (int h = 0; h < Hi; h++) {
            float qh[256];
            for (int e = 0; e < d; e++) qh[e] = nrand();
            act_quant_here(qh, d);
            for (int e = 0; e < d; e++) qt[(size_t)e * hp + h] = qh[e];
            w[h] = nrand();
        }
        kiln_kv_index_scores_scalar(key, n, d, qt, hp, w, Hi, scr, want);
        for (int i = 0; i < n; i++) { /* the exact score, in double */
            double s = 0, mag = 0;
            for (int h = 0; h < Hi; h++) {
                double dot = 0, dmag = 0;
                for (int e = 0; e < d; e++) {
                    float sc;
                    memcpy(&sc, key[i] + d + 4 * (e / 128), 4);
                    const double prod = (double)qt[(size_t)e * hp + h] * (double)kiln_fp8_e4m3_to_f32(key[i][e]) * sc;
                    dot += prod;
                    dmag += fabs(prod);
                }
                s += w[h] * (dot > 0 ? dot : 0);
                mag += fabs(w[h]) * dmag;
            }
            assert_true(fabs(want[i] - s) <= 1e-5 * mag);
        }
        const kiln_isa isas[2] = {KILN_ISA_AVX2, KILN_ISA_AVX512};
        for (int t = 0; t < 2; t++) {
            if (!kiln_cpu_supports(isas[t])) continue;
            const kiln_kv_ktable *tab = kiln_kv_table_for(isas[t]);
            assert_non_null(tab);
            for (int m = 1; m <= n; m += 7) { /* whole passes and tails */
                memset(got, 0, sizeof got);
                tab->index_scores(key, m, d, qt, hp, w, Hi, scr, got);
                assert_memory_equal(got, want, (size_t)m * sizeof *got);
            }
        }
        free(keys); free(qt); free(w); free(scr);
    }
}

static void test_dsa_select_attend(void **state) {
    (void)state;
    dsa_case(KILN_KV_F32, 16, 70, 16, 0);  /* a strict subset, partial last page */
    dsa_case(KILN_KV_BF16, 7, 40, 8, 0);
    dsa_case(KILN_KV_F32, 16, 12, 16, 0);  /* context below topk: every position of the shorter prefixes */
    /* KV integrity on: pages hashed where the device reads them; contexts past one top-k workgroup's
     * 128 positions, pages that do not divide 64 (several pages per scan workgroup) */
    dsa_case(KILN_KV_BF16, 16, 300, 64, 1);
    dsa_case(KILN_KV_F32, 48, 200, 32, 1);
    dsa_case(KILN_KV_BF16, 5, 41, 8, 1);
    for (int b = 0; b < n_bes && !dsa_grouped; b++) {
        if (bes[b]->kind != KILN_BACKEND_VULKAN) continue;
        /* 1,300 bytes: 1 token per group at 300 and 200 positions, 4 at 70 and at 81, all 6 at 41;
         * a count the backend refuses is an error naming it */
        const char *vdi = getenv("KILN_VK_DEVICE_INDEX");
        setenv("KILN_VK_INDEX_BYTES", "2x", 1);
        kiln_backend *bad = NULL;
        assert_int_not_equal(kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &bad), KILN_OK);
        assert_non_null(strstr(kiln_last_error(), "KILN_VK_INDEX_BYTES: '2x'"));
        dsa_grouped_bytes = 1300;
        setenv("KILN_VK_INDEX_BYTES", "1300", 1);
        assert_int_equal(kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &dsa_grouped), KILN_OK);
        unsetenv("KILN_VK_INDEX_BYTES");
    }
    if (!dsa_grouped) return;
    kiln_backend *keep[MAX_BE];
    const int keep_n = n_bes;
    memcpy(keep, bes, sizeof keep);
    n_bes = 0; /* only the grouped backend (and the ref oracle) */
    dsa_case(KILN_KV_BF16, 16, 300, 64, 1);
    dsa_case(KILN_KV_F32, 48, 200, 32, 1);
    dsa_case(KILN_KV_BF16, 5, 41, 8, 1);
    dsa_case(KILN_KV_F32, 16, 70, 16, 0);
    /* hashing with groups of several tokens: {A's owner, three of B's non-owners}, {B's last
     * non-owner, B's owner} — every page of both sequences hashed once, the flipped bit caught */
    dsa_case(KILN_KV_BF16, 5, 81, 8, 1);
    n_bes = keep_n;
    memcpy(bes, keep, sizeof keep);
    kiln_backend_free(dsa_grouped);
    dsa_grouped = NULL;
}

/* ---- weights the host cannot map (a discrete GPU's device memory) -----------------------------------
 * KILN_VK_UNMAPPED=1 keeps device buffers unmapped on lavapipe, so weights reach them as on a GPU
 * whose device-local memory the host cannot map: through the staging buffer and a copy, in pieces
 * of at most 64 MiB. An F32 weight of 67.4 MB (two pieces) and two block formats give the ref
 * backend's products at their bounds, with nothing computed on the host; a malformed value is
 * refused, naming the variable. */
static void test_unmapped_uploads(void **state) {
    (void)state;
    if (!kiln_backend_vulkan_built()) { fprintf(stderr, "no vulkan backend in this build\n"); return; }
    const char *vdi = getenv("KILN_VK_DEVICE_INDEX");
    kiln_backend *vk = NULL;
    setenv("KILN_VK_UNMAPPED", "yes", 1);
    assert_int_not_equal(kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &vk), KILN_OK);
    assert_non_null(strstr(kiln_last_error(), "KILN_VK_UNMAPPED: 'yes'"));
    setenv("KILN_VK_UNMAPPED", "1", 1);
    const kiln_status st = kiln_backend_create_device(KILN_BACKEND_VULKAN, KILN_ISA_AUTO, 2, KILN_FP8_EXACT, vdi ? atoi(vdi) : 0, &vk);
    unsetenv("KILN_VK_UNMAPPED");
    if (st != KILN_OK) { fprintf(stderr, "no vulkan device: %s\n", kiln_last_error()); return; }
    const struct { kiln_wformat f; int64_t rows, cols; int group; } ws[] = {
        {KILN_WF_F32, 4112, 4096, 0}, {KILN_WF_INT4_GROUP, 256, 512, 32}, {KILN_WF_Q4_K, 256, 256, 0}};
    const int n = 3;
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
        tweight t = make_weight(ws[i].f, ws[i].rows, ws[i].cols, ws[i].group, 0);
        float *X = input(ref_be, (size_t)n * (size_t)ws[i].cols), *want = output(ref_be, (size_t)n * (size_t)ws[i].rows);
        kiln_be_matmul(ref_be, &t.w, X, want, n);
        float *Xv = copy_of(vk, X, (size_t)n * (size_t)ws[i].cols), *got = output(vk, (size_t)n * (size_t)ws[i].rows);
        uint64_t d0, d1, h0, h1;
        kiln_backend_vulkan_counts(vk, &d0, &h0);
        kiln_be_matmul(vk, &t.w, Xv, got, n);
        kiln_backend_vulkan_counts(vk, &d1, &h1);
        assert_true(d1 > d0);
        assert_int_equal(h1, h0);
        check_nmse("matmul (unmapped weights)", vk, got, want, (size_t)n * (size_t)ws[i].rows, format_bound_n(ws[i].f, vk, n));
        kiln_be_free(vk, Xv); kiln_be_free(vk, got); kiln_be_free(ref_be, X); kiln_be_free(ref_be, want);
        free_weight(&t);
    }
    kiln_backend_free(vk);
}

/* ---- supports ----------------------------------------------------------------------------------- */
static void test_supports(void **state) {
    (void)state;
    for (int op = 0; op < KILN_OP_COUNT; op++)
        for (int f = 0; f < KILN_WF_COUNT; f++) assert_true(ref_be->ops->supports(ref_be, (kiln_op)op, (kiln_wformat)f));
    for (int b = 0; b < n_bes; b++)
        for (int f = 0; f < KILN_WF_COUNT; f++) {
            if (bes[b]->kind == KILN_BACKEND_VULKAN) { /* a matmul shader for every weight format */
                assert_int_equal(bes[b]->ops->supports(bes[b], KILN_OP_MATMUL, (kiln_wformat)f), 1);
                assert_int_equal(bes[b]->ops->supports(bes[b], KILN_OP_KV_ATTEND, (kiln_wformat)f), 1); /* lavapipe has buffer device addresses */
                continue;
            }
            const int native = bes[b]->ops->supports(bes[b], KILN_OP_MATMUL, (kiln_wformat)f);
            /* scalar cpu has no kernels of its own; the SIMD tables cover every format */
            assert_int_equal(native, bes[b]->cx.isa != KILN_ISA_SCALAR);
            assert_true(bes[b]->ops->supports(bes[b], KILN_OP_RMSNORM, (kiln_wformat)f));
        }
    for (int b = 0; b < n_bes; b++) /* every op above that vulkan calls native ran on the device */
        if (bes[b]->kind == KILN_BACKEND_VULKAN) {
            uint64_t disp, host;
            kiln_backend_vulkan_counts(bes[b], &disp, &host);
            fprintf(stderr, "vulkan: %llu dispatches, %llu native ops computed on the host\n", (unsigned long long)disp, (unsigned long long)host);
            assert_true(disp > 1000);
            assert_int_equal(host, 0);
        }
    assert_false(ref_be->ops->supports(ref_be, KILN_OP_COUNT, KILN_WF_F32));
    assert_string_equal(kiln_op_name(KILN_OP_KV_ATTEND), "kv_attend");
    assert_string_equal(kiln_op_name(KILN_OP_KV_ATTEND_SPARSE), "kv_attend_sparse");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),    cmocka_unit_test(test_matmul_prefill), cmocka_unit_test(test_matmul_batch_invariant), cmocka_unit_test(test_matmul_rows4), cmocka_unit_test(test_matmul_many), cmocka_unit_test(test_matmul_swiglu),     cmocka_unit_test(test_matmul_heads),
        cmocka_unit_test(test_norm_swiglu_add), cmocka_unit_test(test_rope),     cmocka_unit_test(test_embed_argmax),
        cmocka_unit_test(test_moe), cmocka_unit_test(test_moe_routed),       cmocka_unit_test(test_kv),              cmocka_unit_test(test_kv_integrity),
        cmocka_unit_test(test_kv_store), cmocka_unit_test(test_copy_rows), cmocka_unit_test(test_deferred_steps), cmocka_unit_test(test_step_replay),              cmocka_unit_test(test_dsa_norm_fp8),
        cmocka_unit_test(test_dsa_index_kernels), cmocka_unit_test(test_dsa_select_attend), cmocka_unit_test(test_supports), cmocka_unit_test(test_unmapped_uploads),
    };
    /* KILN_TEST_FILTER=test_dsa_*: only the tests it matches (cmocka's pattern; for reruns) */
    if (getenv("KILN_TEST_FILTER")) cmocka_set_test_filter(getenv("KILN_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
