/* test_quant_dump.c — the C half of the byte-for-byte comparison with an independent NumPy
 * implementation (tests/kernels/test_quant_numpy.py). Not a cmocka suite.
 *
 *   test_quant_dump              self-check: quantises the deterministic inputs and checks that the
 *                                reference dequantisation stays within each format's rounding error;
 *                                exit 0 on success (run by scripts/run_tests.sh like any C test).
 *   test_quant_dump --dump DIR   additionally writes, as raw little-endian files in DIR:
 *       fp8_in.f32        [200, 300]   input of the FP8 block quantiser (block 128: partial edges)
 *       fp8_data.u8       [200, 300]   E4M3 codes            fp8_scale.f32 [2, 3]  scale_inv
 *       fp8_deq.f32       [200, 300]   kiln's dequantisation (kiln_weight_row_f32)
 *       int4_in.f32       [96, 384]    input of the INT4 quantiser
 *       int4_gG_packed.i32 [96, 48]    pack-quantized words  int4_gG_scale.bf16 [96, 384/G]
 *       int4_gG_deq.f32   [96, 384]    kiln's dequantisation, for G = 32 and 128
 * The inputs mix Gaussian values of very different magnitudes per row with planted edge cases:
 * all-zero blocks/groups, values at exact rounding midpoints, FP8 subnormal territory, ±amax ties. */
#include "quant/quantize.h"
#include "kernels/gemv.h"
#include "base/fp.h"
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t rng = 0x853C49E6748FEA9Bull;
static uint32_t rnd32(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)(rng >> 11); }
static float nrand(void) {
    float u = ((float)(rnd32() & 0xFFFFFF) + 1.0f) / 16777217.0f, v = (float)(rnd32() & 0xFFFFFF) / 16777216.0f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

#define FR 200
#define FC 300
#define IR 96
#define IC 384

static void make_fp8_input(float *W) {
    for (int r = 0; r < FR; r++) {
        float mag = powf(10.0f, (float)(r % 7) - 3.0f); /* 1e-3 … 1e3 per row */
        for (int c = 0; c < FC; c++) W[r * FC + c] = mag * nrand();
    }
    /* block (0, 1) [rows 0..127, cols 128..255]: amax exactly 448 → scale_inv 1, values at E4M3
     * midpoints (ties to even) and subnormal boundaries */
    for (int r = 0; r < 128; r++)
        for (int c = 128; c < 256; c++) W[r * FC + c] = 0.5f * nrand();
    static const float edge[] = {448.0f, -448.0f, 1.0625f, 1.1875f, 432.0f, -432.0f, 0.0009765625f, 0.0029296875f,
                                 0.0146484375f, -0.0146484375f, 0.001953125f, -0.0f, 0.0f, 3.0f, 240.0f, 440.0f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) W[7 * FC + 128 + (int)i] = edge[i];
    /* bottom-right partial block [rows 128..199, cols 256..299]: all zero (scale floor) */
    for (int r = 128; r < FR; r++)
        for (int c = 256; c < FC; c++) W[r * FC + c] = 0.0f;
    /* block (1, 0) [rows 128..199, cols 0..127]: tiny values (subnormal codes after scaling) */
    for (int r = 128; r < FR; r++)
        for (int c = 0; c < 128; c++) W[r * FC + c] = (c == 0 && r == 128) ? 1.0f : 2e-5f * nrand();
}

static void make_int4_input(float *W) {
    for (int r = 0; r < IR; r++) {
        float mag = powf(10.0f, (float)(r % 5) - 2.0f);
        for (int c = 0; c < IC; c++) W[r * IC + c] = mag * nrand();
    }
    /* row 0, cols 0..31: amax 7.5 → g32 scale 1 exactly; half-integers tie to even; ±7.5 clamp */
    for (int c = 0; c < 32; c++) W[c] = (float)(c % 16) - 7.5f;
    W[31] = 7.5f;
    /* row 1: one all-zero group of 32 and one all-zero group of 128 */
    for (int c = 0; c < 128; c++) W[IC + c] = 0.0f;
    /* row 2: a single large outlier in a group */
    W[2 * IC + 200] = 1000.0f;
    /* row 3: negative amax (maps to −8 after the tie), positive neighbours */
    for (int c = 0; c < 32; c++) W[3 * IC + c] = 0.1f * (float)c;
    W[3 * IC + 5] = -3.1f;
}

static int write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "test_quant_dump: cannot write %s: %s\n", path, strerror(errno));
        if (f) fclose(f);
        return 0;
    }
    return fclose(f) == 0;
}

static int check(int ok, const char *what) {
    if (!ok) fprintf(stderr, "test_quant_dump: self-check failed: %s\n", what);
    return ok;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    if (argc == 3 && strcmp(argv[1], "--dump") == 0) dir = argv[2];
    else if (argc != 1) {
        fprintf(stderr, "usage: test_quant_dump [--dump DIR]\n");
        return 2;
    }
    kiln_fp_init();
    int ok = 1;

    /* ---- FP8 ---- */
    float *W = malloc(sizeof(float) * FR * FC), *deq = malloc(sizeof(float) * FR * FC);
    make_fp8_input(W);
    uint8_t *d;
    float *s;
    if (kiln_quantize_fp8_block(W, FR, FC, 128, &d, &s) != KILN_OK) {
        fprintf(stderr, "test_quant_dump: fp8: %s\n", kiln_last_error());
        return 1;
    }
    kiln_weight w8 = {.fmt = KILN_WF_FP8_BLOCK, .rows = FR, .cols = FC, .data = d, .row_bytes = FC, .scales = s, .block = 128};
    for (int r = 0; r < FR; r++) kiln_weight_row_f32(&w8, r, deq + r * FC);
    for (int r = 0; r < FR && ok; r++)
        for (int c = 0; c < FC && ok; c++) {
            float sc = s[(r / 128) * 3 + c / 128], e = fabsf(deq[r * FC + c] - W[r * FC + c]);
            ok = check(e <= fmaxf(fabsf(W[r * FC + c]) * 0.0625f, 0.0009765625f * sc) * 1.0001f, "fp8 dequantisation error");
        }
    ok = ok && check(s[1] == 1.0f && s[5] == FLT_EPSILON, "fp8 scales of the planted blocks");
    if (dir && ok)
        ok = write_file(dir, "fp8_in.f32", W, sizeof(float) * FR * FC) && write_file(dir, "fp8_data.u8", d, FR * FC) &&
             write_file(dir, "fp8_scale.f32", s, sizeof(float) * 6) && write_file(dir, "fp8_deq.f32", deq, sizeof(float) * FR * FC);
    free(d); free(s); free(W); free(deq);

    /* ---- INT4 g32 / g128 ---- */
    W = malloc(sizeof(float) * IR * IC);
    deq = malloc(sizeof(float) * IR * IC);
    make_int4_input(W);
    static const int groups[2] = {32, 128};
    for (int gi = 0; gi < 2 && ok; gi++) {
        int G = groups[gi];
        uint8_t *p;
        uint16_t *sc;
        if (kiln_quantize_int4_group(W, IR, IC, G, &p, &sc) != KILN_OK) {
            fprintf(stderr, "test_quant_dump: int4: %s\n", kiln_last_error());
            return 1;
        }
        kiln_weight w4 = {.fmt = KILN_WF_INT4_GROUP, .rows = IR, .cols = IC, .data = p, .row_bytes = IC / 2, .scales = sc, .block = G};
        for (int r = 0; r < IR; r++) kiln_weight_row_f32(&w4, r, deq + r * IC);
        for (int r = 0; r < IR && ok; r++)
            for (int c = 0; c < IC && ok; c++) {
                float step = kiln_bf16_to_f32(sc[r * (IC / G) + c / G]);
                ok = check(fabsf(deq[r * IC + c] - W[r * IC + c]) <= 0.53f * step, "int4 dequantisation error");
            }
        if (dir && ok) {
            char n1[64], n2[64], n3[64];
            snprintf(n1, sizeof n1, "int4_g%d_packed.i32", G);
            snprintf(n2, sizeof n2, "int4_g%d_scale.bf16", G);
            snprintf(n3, sizeof n3, "int4_g%d_deq.f32", G);
            ok = write_file(dir, n1, p, IR * IC / 2) && write_file(dir, n2, sc, 2 * IR * (IC / G)) &&
                 write_file(dir, n3, deq, sizeof(float) * IR * IC);
        }
        free(p); free(sc);
    }
    if (dir && ok) ok = write_file(dir, "int4_in.f32", W, sizeof(float) * IR * IC);
    free(W); free(deq);
    return ok ? 0 : 1;
}
