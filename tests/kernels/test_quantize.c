/* test_quantize.c — the quantiser (quant/quantize.h): FP8 E4M3 round-to-nearest-even and saturation
 * edge cases with expected codes worked out by hand from the E4M3FN definition (bias 7, 3 mantissa
 * bits, max 448, 0x7F/0xFF NaN), the FP8 block scales on partial edge blocks, INT4 clamping / ties /
 * packing order, ggml Q8_0 / Q4_0 semantics, format-to-format re-encoding, and bad input. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "quant/quantize.h"
#include "base/fp.h"
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd32(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)(rng >> 11); }
static float nrand(void) {
    float u = ((float)(rnd32() & 0xFFFFFF) + 1.0f) / 16777217.0f, v = (float)(rnd32() & 0xFFFFFF) / 16777216.0f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* ---- FP8 scalar ------------------------------------------------------------------------------- */
static void test_fp8_edges(void **s) {
    (void)s;
    kiln_fp_init();
    static const struct { float in; uint8_t code; } cases[] = {
        {0.0f, 0x00}, {-0.0f, 0x80},
        {1.0f, 0x38}, {-1.0f, 0xB8},          /* e = 7, m = 0 */
        {1.0625f, 0x38},                      /* midpoint 1 | 1.125: tie → even mantissa (0) */
        {1.1875f, 0x3A},                      /* midpoint 1.125 | 1.25: tie → even (m = 2) */
        {1.0624f, 0x38}, {1.0626f, 0x39},     /* either side of the midpoint */
        {448.0f, 0x7E}, {-448.0f, 0xFE},      /* max finite: e = 15, m = 6 */
        {440.0f, 0x7E},                       /* 416 | 448 midpoint 432 < 440 */
        {432.0f, 0x7E},                       /* tie 416 (m = 5, odd) | 448 (m = 6) → 448 */
        {464.0f, 0x7E}, {-464.0f, 0xFE},      /* midpoint 448 | (480 = NaN code): saturates */
        {1e9f, 0x7E}, {-1e9f, 0xFE}, {INFINITY, 0x7E}, {-INFINITY, 0xFE},
        {0.015625f, 0x08},                    /* 2^-6: smallest normal */
        {0.001953125f, 0x01},                 /* 2^-9: smallest subnormal */
        {0.0009765625f, 0x00},                /* 2^-10: tie 0 | 2^-9 → even (0) */
        {-0.0009765625f, 0x80},
        {0.0029296875f, 0x02},                /* 3·2^-10: tie 1 | 2 (·2^-9) → even (2) */
        {0.0146484375f, 0x08},                /* 7.5·2^-9: tie 7 | 8 → 8 = 2^-6 (code 0x08) */
        {0.013671875f, 0x07},                 /* 7·2^-9: largest subnormal */
        {1e-30f, 0x00},
        {3.0f, 0x44},                         /* 1.5·2^1: e = 8, m = 4 */
        {240.0f, 0x77},                       /* 1.875·2^7: e = 14, m = 7 */
        {256.0f, 0x78},                       /* 2^8: e = 15, m = 0 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t fast = kiln_fp8_from_f32_fast(cases[i].in), ref = kiln_f32_to_fp8_e4m3(cases[i].in);
        if (fast != cases[i].code || ref != cases[i].code) {
            fprintf(stderr, "fp8(%.10g): fast 0x%02X, ref 0x%02X, expected 0x%02X\n", cases[i].in, fast, ref, cases[i].code);
            fail();
        }
    }
    assert_int_equal(kiln_fp8_from_f32_fast(NAN), 0x7F);
}

/* The fast encoder agrees with the reference table search over a sweep of bit patterns (both signs,
 * every exponent, strided mantissas) and exhaustively over every float in [2^-12, 512). */
static void test_fp8_fast_matches_reference(void **s) {
    (void)s;
    kiln_fp_init();
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093) {
        float f = kiln_bits_to_f32((uint32_t)u);
        if (isnan(f)) continue;
        if (kiln_fp8_from_f32_fast(f) != kiln_f32_to_fp8_e4m3(f)) {
            fprintf(stderr, "bits 0x%08llX (%g): fast 0x%02X ref 0x%02X\n", (unsigned long long)u, f,
                    kiln_fp8_from_f32_fast(f), kiln_f32_to_fp8_e4m3(f));
            fail();
        }
    }
    for (uint32_t u = 0x39800000u; u < 0x44000000u; u += 61) {
        float f = kiln_bits_to_f32(u);
        assert_int_equal(kiln_fp8_from_f32_fast(f), kiln_f32_to_fp8_e4m3(f));
        assert_int_equal(kiln_fp8_from_f32_fast(-f), kiln_f32_to_fp8_e4m3(-f));
    }
}

/* ---- FP8 block ---------------------------------------------------------------------------------- */
static void test_fp8_block_partial_edges(void **s) {
    (void)s;
    const int64_t rows = 130, cols = 200; /* blocks: rows 128 + 2, cols 128 + 72 */
    float *W = malloc(sizeof(float) * rows * cols);
    for (int64_t i = 0; i < rows * cols; i++) W[i] = nrand();
    W[5 * cols + 3] = 12.0f;      /* block (0,0) amax 12 → scale 12/448 */
    W[129 * cols + 199] = -0.5f;  /* bottom-right block (2 rows × 72 cols) */
    for (int64_t c = 128; c < 200; c++) W[128 * cols + c] = W[129 * cols + c] = 0.25f * (c % 2 ? 1 : -1);
    W[129 * cols + 199] = -0.5f;
    uint8_t *d;
    float *sc;
    assert_int_equal(kiln_quantize_fp8_block(W, rows, cols, 128, &d, &sc), KILN_OK);
    assert_true(sc[0] == 12.0f / 448.0f);
    assert_true(sc[3] == 0.5f / 448.0f); /* [1][1]: scales are [2, 2] */
    /* amax of each block maps to ±448 (code 0x7E / 0xFE) */
    assert_int_equal(d[5 * cols + 3], 0x7E);
    assert_int_equal(d[129 * cols + 199], 0xFE);
    /* every element dequantises within half an E4M3 step (relative 2^-4) of the input, or within
     * half the subnormal step 2^-10·scale near zero */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float scale = sc[(r / 128) * 2 + c / 128];
            float deq = kiln_fp8_e4m3_to_f32(d[r * cols + c]) * scale, w = W[r * cols + c];
            assert_true(fabsf(deq - w) <= fmaxf(fabsf(w) * 0.0625f, 0.0009765625f * scale) * 1.0001f);
        }
    free(d); free(sc);
    /* an all-zero block keeps a positive scale (FLT_EPSILON) and zero codes */
    float z[4] = {0, 0, 0, 0};
    assert_int_equal(kiln_quantize_fp8_block(z, 2, 2, 128, &d, &sc), KILN_OK);
    assert_true(sc[0] == FLT_EPSILON);
    for (int i = 0; i < 4; i++) assert_int_equal(d[i], 0);
    free(d); free(sc); free(W);
}

/* ---- INT4 ---------------------------------------------------------------------------------------- */
static int nib(const uint8_t *p, int64_t c) { return (p[c / 2] >> (4 * (c & 1))) & 15; }

static void test_int4_ties_clamp_packing(void **s) {
    (void)s;
    /* group of 32 with amax 7.5: scale = 7.5/7.5 = 1 exactly (bf16-exact), so q = RNE(w) */
    float w[32] = {0};
    float vals[] = {7.5f, -7.5f, 2.5f, 3.5f, -0.5f, 0.5f, -2.5f, 1.49f, -1.51f, 6.9f};
    memcpy(w, vals, sizeof vals);
    uint8_t *p;
    uint16_t *sc;
    assert_int_equal(kiln_quantize_int4_group(w, 1, 32, 32, &p, &sc), KILN_OK);
    assert_int_equal(sc[0], 0x3F80); /* bf16 1.0 */
    int expect[] = {7, -8, 2, 4, 0, 0, -2, 1, -2, 7};  /* 7.5 → 8 → clamp 7; −7.5 → −8; ties to even */
    for (int i = 0; i < 10; i++) assert_int_equal(nib(p, i) - 8, expect[i]);
    for (int i = 10; i < 32; i++) assert_int_equal(nib(p, i), 8);
    /* lowest nibble first: byte 0 = (q1+8) << 4 | (q0+8) = 0x0F; as int32 word 0 = Σ (q_i+8) << 4i */
    assert_int_equal(p[0], 0x0F);
    uint32_t word;
    memcpy(&word, p, 4);
    uint32_t ew = 0;
    for (int i = 0; i < 8; i++) ew |= (uint32_t)(expect[i] + 8) << (4 * i);
    assert_int_equal(word, ew);
    free(p); free(sc);

    /* scale = amax / 7.5 rounded to bf16, and a zero group gets FLT_EPSILON with all codes 8 */
    float w2[64];
    for (int i = 0; i < 64; i++) w2[i] = i < 32 ? 0.0f : 0.1f * (float)(i - 40);
    assert_int_equal(kiln_quantize_int4_group(w2, 1, 64, 32, &p, &sc), KILN_OK);
    assert_int_equal(sc[0], kiln_f32_to_bf16(FLT_EPSILON));
    assert_int_equal(sc[1], kiln_f32_to_bf16((0.1f * 23.0f) / 7.5f));
    for (int i = 0; i < 16; i++) assert_int_equal(p[i], 0x88);
    float s1 = kiln_bf16_to_f32(sc[1]);
    for (int i = 32; i < 64; i++) {
        float q = nearbyintf(w2[i] / s1);
        q = fminf(7.0f, fmaxf(-8.0f, q));
        assert_int_equal(nib(p, i) - 8, (int)q);
    }
    free(p); free(sc);
}

static void test_int4_bad_input(void **s) {
    (void)s;
    float w[64] = {0};
    uint8_t *p = NULL;
    uint16_t *sc = NULL;
    assert_int_equal(kiln_quantize_int4_group(w, 1, 64, 48, &p, &sc), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "group size 48"));
    assert_int_equal(kiln_quantize_int4_group(w, 1, 64, 0, &p, &sc), KILN_ERR_INVALID_ARG);
    w[37] = NAN;
    assert_int_equal(kiln_quantize_int4_group(w, 2, 32, 32, &p, &sc), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "row 1 col 5"));
    uint8_t *d;
    float *fs;
    w[37] = INFINITY;
    assert_int_equal(kiln_quantize_fp8_block(w, 2, 32, 128, &d, &fs), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "row 1 col 5"));
}

/* ---- GGUF ---------------------------------------------------------------------------------------- */
static void test_q8_0_q4_0(void **s) {
    (void)s;
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) * 0.25f; /* −4 … 3.75, amax 4 (at i = 0) */
    uint8_t q8[34], q4[18];
    kiln_quantize_row_q8_0(x, q8, 32);
    uint16_t h;
    memcpy(&h, q8, 2);
    assert_int_equal(h, kiln_f32_to_f16(4.0f / 127.0f));
    assert_int_equal((int8_t)q8[2 + 0], -127);
    assert_int_equal((int8_t)q8[2 + 16], 0);
    assert_int_equal((int8_t)q8[2 + 31], (int)roundf(3.75f * (127.0f / 4.0f)));
    /* Q4_0: max-magnitude element −4 → d = −4/−8 = 0.5; q = min(15, (int8)(x/d + 8.5)) */
    kiln_quantize_row_q4_0(x, q4, 32);
    memcpy(&h, q4, 2);
    assert_int_equal(h, kiln_f32_to_f16(0.5f));
    assert_int_equal(q4[2 + 0] & 15, 0);               /* −4/0.5 + 8.5 = 0.5 → 0 */
    assert_int_equal(q4[2 + 15] >> 4, 15);             /* x[31] = 3.75 → 7.5 + 8.5 = 16 → min 15 */
    assert_int_equal(q4[2 + 1] & 15, (int)(int8_t)(x[1] / 0.5f + 8.5f));
    /* round trip through the dtype table's reference dequantiser */
    float back[32];
    kiln_weight w = {.fmt = KILN_WF_Q4_0, .rows = 1, .cols = 32, .data = q4, .row_bytes = 18};
    kiln_weight_row_f32(&w, 0, back);
    for (int i = 0; i < 32; i++) assert_true(fabsf(back[i] - x[i]) <= 0.25f + 1e-6f || (i == 31 && fabsf(back[i] - 3.5f) < 1e-6f));
}

/* ---- any → any ------------------------------------------------------------------------------------ */
static void test_quantize_weight_chain(void **s) {
    (void)s;
    const int64_t rows = 37, cols = 256;
    float *W = malloc(sizeof(float) * rows * cols), *row = malloc(sizeof(float) * cols);
    for (int64_t i = 0; i < rows * cols; i++) W[i] = 0.05f * nrand();
    kiln_weight f32 = {.fmt = KILN_WF_F32, .rows = rows, .cols = cols, .data = (const uint8_t *)W, .row_bytes = 4 * cols};
    /* F32 → BF16 → FP8 → INT4(g32) → Q8_0: each step within its format's error of its input */
    kiln_weight bf, f8, i4, q8;
    void *d1, *s1, *d2, *s2, *d3, *s3, *d4, *s4;
    assert_int_equal(kiln_quantize_weight(&f32, KILN_WF_BF16, 0, &bf, &d1, &s1), KILN_OK);
    assert_null(s1);
    assert_int_equal(kiln_quantize_weight(&bf, KILN_WF_FP8_BLOCK, 0, &f8, &d2, &s2), KILN_OK);
    assert_int_equal(f8.block, 128);
    assert_int_equal(kiln_quantize_weight(&f8, KILN_WF_INT4_GROUP, 32, &i4, &d3, &s3), KILN_OK);
    assert_int_equal(kiln_quantize_weight(&i4, KILN_WF_Q8_0, 0, &q8, &d4, &s4), KILN_OK);
    assert_int_equal(i4.row_bytes, cols / 2);
    assert_int_equal(q8.row_bytes, cols / 32 * 34);
    /* direct encoders agree byte for byte with kiln_quantize_weight from an F32 source */
    uint8_t *pd;
    uint16_t *ps;
    float *bfw = malloc(sizeof(float) * rows * cols);
    for (int64_t r = 0; r < rows; r++) kiln_weight_row_f32(&f8, r, bfw + r * cols);
    assert_int_equal(kiln_quantize_int4_group(bfw, rows, cols, 32, &pd, &ps), KILN_OK);
    assert_memory_equal(pd, d3, (size_t)rows * cols / 2);
    assert_memory_equal(ps, s3, (size_t)rows * (cols / 32) * 2);
    free(pd); free(ps);
    /* INT4 dequantisation error ≤ half a step, plus the bf16 rounding of the scale at the clamp
     * (bf16 unit roundoff 2^-8: amax ≤ 7.5·scale·(1 + 2^-8) → 7.5·2^-8 ≈ 0.03 of a step more) */
    for (int64_t r = 0; r < rows; r++) {
        kiln_weight_row_f32(&i4, r, row);
        for (int64_t c = 0; c < cols; c++) {
            float sc = kiln_bf16_to_f32(((const uint16_t *)i4.scales)[r * (cols / 32) + c / 32]);
            assert_true(fabsf(row[c] - bfw[r * cols + c]) <= 0.53f * sc);
        }
    }
    /* bad destination parameters */
    kiln_weight bad;
    void *bd, *bs;
    assert_int_equal(kiln_quantize_weight(&f32, KILN_WF_INT4_GROUP, 96, &bad, &bd, &bs), KILN_ERR_INVALID_ARG);
    kiln_weight odd = f32;
    odd.cols = 40;
    odd.row_bytes = 160;
    assert_int_equal(kiln_quantize_weight(&odd, KILN_WF_Q4_0, 0, &bad, &bd, &bs), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "cols 40"));
    free(d1); free(d2); free(s2); free(d3); free(s3); free(d4);
    free(W); free(row); free(bfw);
}

int main(void) {
    kiln_fp_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_edges),
        cmocka_unit_test(test_fp8_fast_matches_reference),
        cmocka_unit_test(test_fp8_block_partial_edges),
        cmocka_unit_test(test_int4_ties_clamp_packing),
        cmocka_unit_test(test_int4_bad_input),
        cmocka_unit_test(test_q8_0_q4_0),
        cmocka_unit_test(test_quantize_weight_chain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
