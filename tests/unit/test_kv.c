/* test_kv.c — the KV pool: sizes and capacity (FP8 vs BF16, Kimi-K2 MLA arithmetic), budget
 * errors, block tables and prefix sharing, the FP8 / BF16 store conversions against base/fp.h's
 * reference on every ISA, the dynamic-scale rule, and the FP8 scale sources (kv_scales.json and
 * checkpoint k_scale / v_scale tensors) with their bad-input errors.
 * Expected numbers come from the issue (Kimi-K2: 70,272 / 35,136 bytes per token) or from the
 * model shapes (stories260K: 5 layers × 4 KV heads × 8; bench-500m preset: 9 × 4 × 64). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "kv/kv_scales.h"
#include "base/fp.h"
#include "kernels/gemv.h"
#include "model/model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kiln_kv_config shape(int L, int H, int hd, kiln_kv_dtype dt, int64_t mem) {
    kiln_kv_config c = {.n_layers = L, .n_kv_heads = H, .head_dim = hd, .page_tokens = 16, .dtype = dt, .mem_bytes = mem};
    return c;
}

/* ---- sizes and capacity ---- */
static void test_kimi_bytes_per_token(void **state) {
    (void)state;
    /* Kimi-K2: 61 layers, one 576-value latent row per token per layer (kv_lora_rank 512 + rope 64) */
    kiln_kv_config c = {.n_layers = 61, .n_kv_heads = 1, .head_dim = 576, .page_tokens = 16, .dtype = KILN_KV_BF16,
                        .k_dim = 576, .v_dim = 512, .v_shares_k = 1};
    assert_int_equal(kiln_kv_token_bytes(&c), 70272);
    c.dtype = KILN_KV_FP8;
    assert_int_equal(kiln_kv_token_bytes(&c), 35136);
    assert_int_equal(kiln_kv_page_data_bytes(&c), 16 * 35136);
}

static void check_ratio(int L, int H, int hd, int64_t mem) {
    kiln_kv_config b = shape(L, H, hd, KILN_KV_BF16, mem), f = shape(L, H, hd, KILN_KV_FP8, mem);
    assert_int_equal(kiln_kv_token_bytes(&b), 2 * kiln_kv_token_bytes(&f)); /* exactly 2× the data */
    int64_t pb = kiln_kv_plan_pages(&b), pf = kiln_kv_plan_pages(&f);
    assert_true(pb > 0);
    double r = (double)pf / (double)pb;
    fprintf(stderr, "L=%d H=%d hd=%d mem=%lld: bf16 %lld tokens, fp8 %lld tokens, ratio %.4f\n", L, H, hd, (long long)mem,
            (long long)pb * 16, (long long)pf * 16, r);
    assert_true(r >= 1.99);
    assert_true(r <= 2.0);
}

static void test_capacity_ratio(void **state) {
    (void)state;
    check_ratio(5, 4, 8, 512ll << 20);   /* stories260K */
    check_ratio(5, 4, 8, 8ll << 20);
    check_ratio(9, 4, 64, 512ll << 20);  /* bench-500m preset */
    check_ratio(9, 4, 64, 4ll << 30);
}

static void test_budget_too_small(void **state) {
    (void)state;
    kiln_kv_config c = shape(5, 4, 8, KILN_KV_BF16, 1000);
    kiln_kv_pool *p = NULL;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_ERR_KV_EXHAUSTED);
    assert_null(p);
    assert_non_null(strstr(kiln_last_error(), "--kv-mem"));
    c.page_tokens = 0;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "--kv-page"));
}

static void test_fp8_needs_scales(void **state) {
    (void)state;
    kiln_kv_config c = shape(2, 2, 8, KILN_KV_FP8, 1 << 20);
    kiln_kv_pool *p = NULL;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_ERR_INVALID_ARG); /* never a silent 1.0 */
    float ks[4] = {1, 1, 1, 1}, vs[4] = {1, 1, 0, 1};
    c.k_scale = ks;
    c.v_scale = vs;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "layer 1, KV head 0"));
    vs[2] = NAN;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_ERR_INVALID_ARG);
    vs[2] = 0.5f;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_OK);
    kiln_kv_pool_free(p);
    c.scale_mode = KILN_KV_SCALE_DYNAMIC; /* dynamic needs none; costs page metadata */
    c.k_scale = c.v_scale = NULL;
    assert_int_equal(kiln_kv_page_meta_bytes(&c), 16 + 8 + 2 * 2 * 2 * 4);
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_OK);
    kiln_kv_pool_free(p);
}

/* ---- block tables ---- */
static void test_reserve_share_release(void **state) {
    (void)state;
    kiln_kv_config c = shape(2, 1, 4, KILN_KV_F32, 0);
    c.mem_bytes = 6 * (int64_t)kiln_kv_page_cost(&c);
    kiln_kv_pool *p;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_OK);
    assert_int_equal(kiln_kv_capacity_tokens(p), 96);
    kiln_kv_seq a = {0}, b = {0};
    assert_int_equal(kiln_kv_seq_reserve(p, &a, 40), KILN_OK); /* 3 pages */
    float k[4], v[4];
    for (int pos = 0; pos < 40; pos++)
        for (int l = 0; l < 2; l++) {
            for (int i = 0; i < 4; i++) { k[i] = (float)(pos * 100 + l * 10 + i); v[i] = -k[i]; }
            kiln_kv_store(p, &a, l, pos, k, v);
        }
    a.len = 40;
    assert_true(p->pages[a.pages[0]].flags & KILN_KV_PAGE_SEALED);
    assert_false(p->pages[a.pages[2]].flags & KILN_KV_PAGE_SEALED);
    /* b shares 2 full pages and gets a copy of the partial third (5 tokens) */
    assert_int_equal(kiln_kv_seq_share_prefix(p, &b, &a, 37), KILN_OK);
    assert_int_equal(b.len, 37);
    assert_int_equal(b.pages[0], a.pages[0]);
    assert_int_equal(b.pages[1], a.pages[1]);
    assert_int_not_equal(b.pages[2], a.pages[2]);
    assert_int_equal(p->refcount[a.pages[0]], 2);
    assert_int_equal(p->n_free, 2);
    float r[4];
    kiln_kv_read_row(p, &b, 1, 36, 0, 1, r);
    assert_true(r[2] == -(float)(36 * 100 + 10 + 2));
    /* exhaustion: 4 more pages do not fit */
    assert_int_equal(kiln_kv_seq_reserve(p, &b, 37 + 64), KILN_ERR_KV_EXHAUSTED);
    assert_non_null(strstr(kiln_last_error(), "capacity 96 tokens"));
    kiln_kv_seq_release(p, &a);
    assert_int_equal(p->n_free, 3); /* shared pages still held by b */
    kiln_kv_seq_release(p, &b);
    assert_int_equal(p->n_free, 6);
    free(a.pages);
    free(b.pages);
    kiln_kv_pool_free(p);
}

/* ---- conversions ---- */
static const kiln_isa isas[] = {KILN_ISA_SCALAR, KILN_ISA_AVX2, KILN_ISA_AVX512};

static uint8_t ref_fp8(float x) { return isnan(x) ? 0 : kiln_f32_to_fp8_e4m3(x); }

static void check_fp8_block(const float *x, int n) {
    uint8_t *o = malloc((size_t)n);
    kiln_kv_quant_fp8(x, n, 1.0f, o);
    for (int i = 0; i < n; i++) {
        uint8_t want = ref_fp8(x[i]);
        if (o[i] != want || kiln_kv_f32_to_fp8(x[i]) != want) {
            fprintf(stderr, "fp8(%a = %.9g): isa %s got %#x, scalar %#x, reference %#x\n", (double)x[i], (double)x[i],
                    kiln_isa_name(kiln_kernels_current()), o[i], kiln_kv_f32_to_fp8(x[i]), want);
            fail();
        }
        assert_int_not_equal(o[i] & 0x7f, 0x7f); /* never a NaN code */
    }
    free(o);
}

static void test_fp8_conversion(void **state) {
    (void)state;
    kiln_fp_init();
    /* Every neighbour pair of E4M3 magnitudes: the midpoint (a tie: round to even), one float ulp
     * either side, the values themselves; plus the saturation edge and specials. */
    int cap = 200000, n = 0;
    float *x = malloc(sizeof(float) * (size_t)cap);
    for (int c = 0; c < 0x7e; c++) {
        float lo = kiln_fp8_e4m3_table[c], hi = kiln_fp8_e4m3_table[c + 1], mid = (lo + hi) / 2;
        float v[] = {lo, hi, mid, nextafterf(mid, 0), nextafterf(mid, 1000), nextafterf(lo, 1000), nextafterf(hi, 0)};
        for (size_t j = 0; j < sizeof v / sizeof v[0]; j++) { x[n++] = v[j]; x[n++] = -v[j]; }
    }
    float sp[] = {448.0f, 449.0f, 463.9f, 464.0f, 465.0f, 480.0f, 1e6f, 3e38f, INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f,
                  1e-30f, 1e-45f, 0.000976f, 0.0009765625f, 0.0009766f, 0.00293f, 0.0029296875f, 0.015625f, 0.0156249f};
    for (size_t j = 0; j < sizeof sp / sizeof sp[0]; j++) { x[n++] = sp[j]; x[n++] = -sp[j]; }
    /* a sweep over float bit patterns from 2^-12 to 2^10 */
    for (uint32_t u = 0x39800000u; u < 0x44800000u && n < cap; u += 1237u) x[n++] = kiln_bits_to_f32(u);
    for (size_t k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        check_fp8_block(x, n);
        for (int len = 1; len < 40; len++) check_fp8_block(x + 3 * len, len); /* tails */
    }
    kiln_kernels_select(KILN_ISA_AUTO);
    free(x);
}

static void test_bf16_conversion(void **state) {
    (void)state;
    enum { N = 4099 };
    float x[N];
    uint16_t o[N];
    for (int i = 0; i < N; i++) x[i] = kiln_bits_to_f32(0x2f000000u + (uint32_t)i * 524287u * 7u);
    x[0] = NAN; x[1] = INFINITY; x[2] = -0.0f; x[3] = kiln_bits_to_f32(0x3f808000u); /* a tie */
    x[4] = kiln_bits_to_f32(0x3f818000u); /* a tie, odd */
    for (size_t k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        for (int len = 1; len <= N; len += len < 40 ? 1 : 997) {
            kiln_kv_quant_bf16(x, len, o);
            for (int i = 0; i < len; i++) assert_int_equal(o[i], kiln_f32_to_bf16(x[i]));
        }
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

/* ---- dynamic scales ---- */
static void test_dynamic_rule(void **state) {
    (void)state;
    kiln_fp_init();
    kiln_kv_config c = shape(1, 1, 4, KILN_KV_FP8, 0);
    c.page_tokens = 4;
    c.scale_mode = KILN_KV_SCALE_DYNAMIC;
    c.mem_bytes = 2 * (int64_t)kiln_kv_page_cost(&c);
    kiln_kv_pool *p;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_OK);
    kiln_kv_seq s = {0};
    assert_int_equal(kiln_kv_seq_reserve(p, &s, 6), KILN_OK);
    /* rows of amax 1, 3 (grows: row 0 re-quantized), 2 (no change), 10 (grows) in page 0 */
    float rows[4][4] = {{1, -0.3f, 0.07f, 0.5f}, {3, 0.1f, -2.2f, 0.9f}, {2, 1.1f, -0.01f, 0.2f}, {-10, 0.4f, 0.33f, 7}};
    for (int t = 0; t < 4; t++) kiln_kv_store(p, &s, 0, t, rows[t], rows[t]);
    /* the page scale is 10/448; row t reads back as the reference rule gives */
    float sc = 10.0f / 448.0f, r[4];
    for (int t = 0; t < 4; t++) {
        kiln_kv_read_row(p, &s, 0, t, 0, 0, r);
        for (int d = 0; d < 4; d++) {
            /* rows 0..2 went through re-quantizations; their values stay within one step of the
             * final grid: |err| ≤ 2^-4·|x| + (2^-9·sc for subnormals), twice (two roundings) */
            float tol = 2.0f * (fabsf(rows[t][d]) / 16.0f + sc / 512.0f);
            assert_true(fabsf(r[d] - rows[t][d]) <= tol);
        }
    }
    kiln_kv_read_row(p, &s, 0, 3, 0, 0, r);
    assert_true(fabsf(r[0] + 10.0f) < 1e-5f); /* the row that set the scale maps its amax to ±448 */
    assert_true(p->pages[s.pages[0]].flags & KILN_KV_PAGE_SEALED);
    /* a new page starts unset: its first row sets its own scale */
    float small[4] = {0.01f, 0.02f, -0.005f, 0};
    kiln_kv_store(p, &s, 0, 4, small, small);
    kiln_kv_read_row(p, &s, 0, 4, 0, 1, r);
    for (int d = 0; d < 4; d++) assert_true(fabsf(r[d] - small[d]) <= fabsf(small[d]) / 16.0f + 1e-9f);
    assert_true(r[1] == 0.02f || fabsf(r[1] - 0.02f) <= 0.02f / 16.0f);
    kiln_kv_seq_release(p, &s);
    free(s.pages);
    kiln_kv_pool_free(p);
}

/* ---- K smoothing ---- */
static void test_k_smoothing(void **state) {
    (void)state;
    kiln_fp_init();
    float ks[1] = {0.5f / 448.0f}, vs[1] = {1.0f / 448.0f}, mu[4] = {10.0f, -20.0f, 0.0f, 3.0f};
    kiln_kv_config c = shape(1, 1, 4, KILN_KV_FP8, 1 << 16);
    c.k_scale = ks;
    c.v_scale = vs;
    c.k_mean = mu;
    assert_int_equal(kiln_kv_pool_fixed_bytes(&c), 2 * 4 + 4 * 4); /* scales + means */
    kiln_kv_pool *p;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_OK);
    kiln_kv_seq s = {0};
    assert_int_equal(kiln_kv_seq_reserve(p, &s, 2), KILN_OK);
    /* K = mean + small offsets: stored as fp8(offset / scale); read back = mean + dequantized offset */
    float k[4] = {10.3f, -20.1f, 0.45f, 2.8f}, v[4] = {0.1f, 0.2f, 0.3f, 0.4f}, r[4];
    kiln_kv_store(p, &s, 0, 0, k, v);
    kiln_kv_read_row(p, &s, 0, 0, 0, 0, r);
    for (int d = 0; d < 4; d++) {
        float off = (k[d] - mu[d]);
        float want = kiln_fp8_e4m3_to_f32(kiln_f32_to_fp8_e4m3(off * (1.0f / ks[0]))) * ks[0] + mu[d];
        assert_true(r[d] == want);
    }
    /* without the mean, 10.3 with this scale would saturate at 0.5: smoothing keeps it */
    assert_true(fabsf(r[0] - 10.3f) < 0.02f);
    kiln_kv_seq_release(p, &s);
    free(s.pages);
    kiln_kv_pool_free(p);
    mu[1] = NAN;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "channel 1"));
}

/* ---- kv_scales.json ---- */
static char tmpdir[256];
static void write_file(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}
static void expect_error(const char *name, const char *text, const char *needle) {
    float ks[6], vs[6], km[12];
    char path[512];
    write_file(name, text);
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    kiln_status st = kiln_kv_scales_read_json(path, 2, 3, 2, 0, ks, vs, km, NULL);
    if (st == KILN_OK || !strstr(kiln_last_error(), needle)) {
        fprintf(stderr, "%s: status %d, message '%s' lacks '%s'\n", name, st, kiln_last_error(), needle);
        fail();
    }
}

#define HDR "{\"format\":\"kiln-kv-scales\",\"version\":1,\"dtype\":\"fp8_e4m3\","
static void test_scales_json(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/kiln_test_kv_XXXXXX", base);
    assert_non_null(mkdtemp(tmpdir));
    /* round trip */
    float ks[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, vs[6] = {1, 2, 3, 4, 5, 6}, k2[6], v2[6];
    char path[512];
    snprintf(path, sizeof path, "%s/ok.json", tmpdir);
    float km[12] = {1, -2, 3.5f, 0, 0.25f, 6, -7, 8, 9, 10, -11, 12}, km2[12];
    int has = -1;
    assert_int_equal(kiln_kv_scales_write_json(path, 2, 3, 2, ks, vs, km, 2.0f, "test", 123), KILN_OK);
    assert_int_equal(kiln_kv_scales_read_json(path, 2, 3, 2, 0, k2, v2, km2, &has), KILN_OK);
    assert_int_equal(has, 1);
    for (int i = 0; i < 6; i++) { assert_true(k2[i] == ks[i]); assert_true(v2[i] == vs[i]); }
    for (int i = 0; i < 12; i++) assert_true(km2[i] == km[i]);
    /* means of the wrong head dim; means with an MLA latent cache */
    assert_int_equal(kiln_kv_scales_read_json(path, 2, 3, 4, 0, k2, v2, km2, &has), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "'k_mean[0][0]' is not an array of 4 channels"));
    assert_int_equal(kiln_kv_scales_read_json(path, 2, 3, 2, 1, k2, v2, km2, &has), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "k_mean"));
    /* without means */
    assert_int_equal(kiln_kv_scales_write_json(path, 2, 3, 2, ks, vs, NULL, 2.0f, "test", 123), KILN_OK);
    assert_int_equal(kiln_kv_scales_read_json(path, 2, 3, 2, 0, k2, v2, km2, &has), KILN_OK);
    assert_int_equal(has, 0);
    /* wrong model */
    assert_int_equal(kiln_kv_scales_read_json(path, 3, 3, 2, 0, k2, v2, NULL, NULL), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "num_layers"));
    assert_int_equal(kiln_kv_scales_read_json(path, 2, 4, 2, 0, k2, v2, NULL, NULL), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "num_kv_heads"));
    /* bad files */
    expect_error("layers.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1]],\"v_scale\":[[1,1,1],[1,1,1]]}", "'k_scale' has 1 layers");
    expect_error("heads.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,1]],\"v_scale\":[[1,1,1],[1,1,1]]}", "'k_scale[1]' has 2 heads");
    expect_error("neg.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,1,1]],\"v_scale\":[[1,-2,1],[1,1,1]]}", "'v_scale[0][1]' = -2");
    expect_error("zero.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,1,0]],\"v_scale\":[[1,1,1],[1,1,1]]}", "'k_scale[1][2]' = 0");
    expect_error("str.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,\"x\",1]],\"v_scale\":[[1,1,1],[1,1,1]]}", "'k_scale[1][1]' is not a number");
    expect_error("inf.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,1e999,1]],\"v_scale\":[[1,1,1],[1,1,1]]}", "inf.json");
    expect_error("nan.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,NaN,1]],\"v_scale\":[[1,1,1],[1,1,1]]}", "nan.json: line 1");
    expect_error("missing.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,1,1]]}", "'v_scale' is missing");
    expect_error("nl.json", HDR "\"num_layers\":5,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,1,1]],\"v_scale\":[[1,1,1],[1,1,1]]}", "'num_layers' = 5 but the model has 2");
    expect_error("fmt.json", "{\"format\":\"other\"}", "'format'");
    expect_error("trunc.json", HDR "\"num_layers\":2,", "trunc.json: line");
    expect_error("mean.json", HDR "\"num_layers\":2,\"num_kv_heads\":3,\"k_scale\":[[1,1,1],[1,1,1]],\"v_scale\":[[1,1,1],[1,1,1]],"
                 "\"k_mean\":[[[0,0],[0,0],[0,0]],[[0,0],[0,\"x\"],[0,0]]]}", "'k_mean[1][1][1]' is not a finite number");
    const char *names[] = {"ok.json", "layers.json", "heads.json", "neg.json", "zero.json", "str.json", "inf.json", "nan.json",
                           "missing.json", "nl.json", "fmt.json", "trunc.json", "mean.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    rmdir(tmpdir);
}

/* ---- checkpoint scales ---- */
static void add_scalar(kiln_tensor_table *tt, const char *name, float *val, int n) {
    kiln_tensor t = {0};
    t.name = (char *)name;
    t.dtype = KILN_DT_F32;
    t.ndim = n == 1 ? 0 : 1;
    t.shape[0] = n;
    t.data = (const uint8_t *)val;
    t.nbytes = 4u * (unsigned)n;
    t.file = "model.safetensors";
    assert_int_equal(kiln_tt_add(tt, &t), KILN_OK);
}

static void test_checkpoint_scales(void **state) {
    (void)state;
    struct kiln_model *m = calloc(1, sizeof *m);
    m->path = "testmodel";
    float ks[6], vs[6];
    int found = -1;
    assert_int_equal(kiln_kv_scales_from_checkpoint(&m->tt, m->path, 2, 3, 0, ks, vs, &found), KILN_OK);
    assert_int_equal(found, 0);
    static float a = 0.05f, b[3] = {0.1f, 0.2f, 0.3f}, c = 0.07f, bad = -1.0f;
    add_scalar(&m->tt, "model.layers.0.self_attn.k_scale", &a, 1);
    add_scalar(&m->tt, "model.layers.0.self_attn.v_scale", b, 3);
    add_scalar(&m->tt, "model.layers.1.self_attn.k_scale", &c, 1);
    assert_int_equal(kiln_kv_scales_from_checkpoint(&m->tt, m->path, 2, 3, 0, ks, vs, &found), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "model.layers.1.self_attn.v_scale"));
    add_scalar(&m->tt, "model.layers.1.self_attn.v_scale", &bad, 1);
    assert_int_equal(kiln_kv_scales_from_checkpoint(&m->tt, m->path, 2, 3, 0, ks, vs, &found), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "= -1"));
    bad = 0.5f;
    assert_int_equal(kiln_kv_scales_from_checkpoint(&m->tt, m->path, 2, 3, 0, ks, vs, &found), KILN_OK);
    assert_int_equal(found, 1);
    float want_k[6] = {0.05f, 0.05f, 0.05f, 0.07f, 0.07f, 0.07f}, want_v[6] = {0.1f, 0.2f, 0.3f, 0.5f, 0.5f, 0.5f};
    for (int i = 0; i < 6; i++) { assert_true(ks[i] == want_k[i]); assert_true(vs[i] == want_v[i]); }
    /* wrong head count */
    assert_int_equal(kiln_kv_scales_from_checkpoint(&m->tt, m->path, 2, 4, 0, ks, vs, &found), KILN_ERR_FORMAT);
    assert_non_null(strstr(kiln_last_error(), "one per KV head (4)"));
    kiln_tt_free(&m->tt);
    free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kimi_bytes_per_token),
        cmocka_unit_test(test_capacity_ratio),
        cmocka_unit_test(test_budget_too_small),
        cmocka_unit_test(test_fp8_needs_scales),
        cmocka_unit_test(test_reserve_share_release),
        cmocka_unit_test(test_fp8_conversion),
        cmocka_unit_test(test_bf16_conversion),
        cmocka_unit_test(test_dynamic_rule),
        cmocka_unit_test(test_k_smoothing),
        cmocka_unit_test(test_scales_json),
        cmocka_unit_test(test_checkpoint_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
