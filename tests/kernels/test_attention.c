/* test_attention.c — paged attention (kiln_kv_attend_batch) on every ISA this CPU has, against a
 * double-precision reference written here, over F32 / BF16 / FP8-static / FP8-dynamic pages.
 *
 * The reference never calls the code under test: it dequantizes the K/V it generated with the
 * scalar reference conversions of base/fp.h (kiln_f32_to_bf16, kiln_f32_to_fp8_e4m3 and the
 * E4M3 decode table), re-implementing the documented scale rules (kv.h), and runs a plain
 * two-pass softmax in double.
 *
 * FP8 K smoothing cases give the keys a large per-channel offset and the pool its mean: the kernels
 * then see q·(k − mean) while the reference uses the full keys; softmax is invariant to that
 * per-query shift, so the outputs must agree all the same.
 * Pre-RoPE K smoothing cases (smooth 2: NEOX pairs, 3: NORM pairs) give the keys an offset R(p)·μ
 * that turns with the position (R: RoPE with theta 10000 over the whole head, re-implemented here
 * with the float formula kv.h documents); the pool stores k − R(p)μ and its kernels add q·R(p)μ
 * back to each score, while the reference attends over the full dequantized keys.
 *
 * Cases: decode (one query) and prefill (a tile of consecutive positions, causal), two sequences
 * interleaved in one batch, GQA ratios 1, 4 and 8, odd KV head counts (3, 5), head dims that are
 * not multiples of 8/16 (8, 24, 40, 72), the MLA layout (k_dim 576, v_dim 512, V = first 512 values
 * of the K row), page sizes 16, 7 and 1, context lengths with partly filled last pages, and long
 * contexts that take the context-split path (merged across threads).
 *
 * Bound: max |out − ref| ≤ 1e-4 · max|V| + 1e-5. The kernels compute in float32 on exactly the
 * dequantized values (FP8 via FP16 is exact), so the only differences are float32 summation order
 * (≤ ~kd·2^-24 relative on scores of magnitude ≤ ~10) and the vector exp (~2 ulp): a few 1e-6 of
 * max|V|. The stored values are checked bit-exactly against the reference via kiln_kv_read_row. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "base/fp.h"
#include "kernels/gemv.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float urand(void) { return (float)(rnd32() & 0xFFFFFF) / 16777216.0f; }
static float nrand(void) {
    float u = urand() + 1e-7f, v = urand();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

typedef struct {
    int H, KV, kd, vd, shares, pt;
    kiln_kv_dtype dt;
    kiln_kv_scale_mode mode;
    int smooth;         /* FP8 K smoothing: keys get a large per-channel offset, the pool its mean;
                           2 / 3: pre-RoPE smoothing with NEOX / NORM pairs (offset R(p)·mean) */
} tcase;

/* out = R(p)·mu over kd values (kv.h: frequency of pair i = 10000^(-2i/kd) in float, pairs
 * (i, i + kd/2) for NEOX, (2i, 2i + 1) for NORM), or mu itself when not pre-RoPE. */
static void ref_rot(const tcase *c, int p, const float *mu, float *out) {
    if (c->smooth < 2) { memcpy(out, mu, sizeof(float) * (size_t)c->kd); return; }
    const int half = c->kd / 2;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf(10000.0f, (float)(2 * i) / (float)c->kd), val = (float)p * freq;
        float cs = cosf(val), sn = sinf(val);
        int a = c->smooth == 3 ? 2 * i : i, b = c->smooth == 3 ? 2 * i + 1 : i + half;
        out[a] = mu[a] * cs - mu[b] * sn;
        out[b] = mu[a] * sn + mu[b] * cs;
    }
}

/* Reference dequantization of one row, FP8 static. */
static float ref_fp8(float x, float s) { return kiln_fp8_e4m3_to_f32(kiln_f32_to_fp8_e4m3(x * (1.0f / s))) * s; }

/* Test state: generated K/V (f32), their reference dequantized values, and the pool. */
typedef struct {
    tcase c;
    int n_ctx;
    float *k, *v;       /* [n_ctx][KV][kd], [n_ctx][KV][vd] generated */
    double *kr, *vr;    /* reference dequantized */
    float *ks, *vs;     /* static scales [KV] (one layer) */
    float *mu;          /* K smoothing means [KV][kd] or NULL */
    kiln_kv_pool *pool;
} tstate;

/* Keys get a per-head magnitude and a few outlier channels, values are ~N(0,1). */
static void gen(tstate *t) {
    const tcase *c = &t->c;
    const int n = t->n_ctx;
    t->k = malloc(sizeof(float) * (size_t)n * c->KV * c->kd);
    t->v = malloc(sizeof(float) * (size_t)n * c->KV * c->vd);
    t->kr = malloc(sizeof(double) * (size_t)n * c->KV * c->kd);
    t->vr = malloc(sizeof(double) * (size_t)n * c->KV * c->vd);
    t->ks = malloc(sizeof(float) * c->KV);
    t->vs = malloc(sizeof(float) * c->KV);
    if (c->smooth) {
        t->mu = malloc(sizeof(float) * c->KV * c->kd);
        for (int i = 0; i < c->KV * c->kd; i++) t->mu[i] = 8.0f * nrand();
    }
    for (int h = 0; h < c->KV; h++) {
        float mag = 0.5f + 2.0f * urand();
        for (int p = 0; p < n; p++) {
            for (int d = 0; d < c->kd; d++) {
                float x = nrand() * mag;
                if (d % 11 == 3) x *= 4.0f; /* outlier channel */
                t->k[((size_t)p * c->KV + h) * c->kd + d] = x;
            }
            for (int d = 0; d < c->vd; d++) t->v[((size_t)p * c->KV + h) * c->vd + d] = nrand();
        }
        /* keys with a per-channel offset (what smoothing removes; rotated to the position when pre-RoPE) */
        float rot[576];
        if (t->mu)
            for (int p = 0; p < n; p++) {
                ref_rot(c, p, t->mu + h * c->kd, rot);
                for (int d = 0; d < c->kd; d++) t->k[((size_t)p * c->KV + h) * c->kd + d] += rot[d];
            }
        /* static scales: amax over the data (of K − mean when smoothing) × a margin of 1.25 (some
         * values land near 448) */
        float ka = 0, va = 0;
        for (int p = 0; p < n; p++) {
            if (t->mu) ref_rot(c, p, t->mu + h * c->kd, rot);
            for (int d = 0; d < c->kd; d++)
                ka = fmaxf(ka, fabsf(t->k[((size_t)p * c->KV + h) * c->kd + d] - (t->mu ? rot[d] : 0.0f)));
            for (int d = 0; d < c->vd; d++) va = fmaxf(va, fabsf(t->v[((size_t)p * c->KV + h) * c->vd + d]));
        }
        t->ks[h] = ka * 1.25f / 448.0f;
        t->vs[h] = va * 1.25f / 448.0f;
    }
    if (c->shares)
        for (int h = 0; h < c->KV; h++) t->vs[h] = t->ks[h];
}

/* Reference dequantization, following kv.h's rules. For dynamic scales the page scale is the running
 * max of amax(row)/448, and rows already in the page are re-quantized when it grows. */
static void ref_dequant(tstate *t) {
    const tcase *c = &t->c;
    const int n = t->n_ctx;
    for (int kind = 0; kind < (c->shares ? 1 : 2); kind++) {
        const int dim = kind ? c->vd : c->kd;
        const float *src = kind ? t->v : t->k;
        double *dst = kind ? t->vr : t->kr;
        for (int h = 0; h < c->KV; h++) {
            float s = 0;                        /* dynamic page scale */
            uint8_t *codes = malloc((size_t)c->pt * dim);
            const float *mu0 = kind == 0 && t->mu && c->dt == KILN_KV_FP8 ? t->mu + (size_t)h * dim : NULL, *mu = NULL;
            float *xc = malloc(sizeof(float) * (size_t)dim), rot[576];
            for (int p = 0; p < n; p++) {
                const float *x = src + ((size_t)p * c->KV + h) * dim;
                if (mu0) { ref_rot(c, p, mu0, rot); mu = rot; }
                if (mu) {
                    for (int d = 0; d < dim; d++) xc[d] = x[d] - mu[d];
                    x = xc;
                }
                double *y = dst + ((size_t)p * c->KV + h) * dim;
                if (c->dt == KILN_KV_F32) { for (int d = 0; d < dim; d++) y[d] = x[d]; continue; }
                if (c->dt == KILN_KV_BF16) { for (int d = 0; d < dim; d++) y[d] = kiln_bf16_to_f32(kiln_f32_to_bf16(x[d])); continue; }
                if (c->mode == KILN_KV_SCALE_STATIC) {
                    float sc = kind ? t->vs[h] : t->ks[h];
                    for (int d = 0; d < dim; d++) y[d] = (double)(ref_fp8(x[d], sc) + (mu ? mu[d] : 0.0f));
                    continue;
                }
                int off = p % c->pt;
                if (off == 0) s = 0;
                float amax = 0;
                for (int d = 0; d < dim; d++) amax = fmaxf(amax, fabsf(x[d]));
                float need = amax / 448.0f;
                if (need > s) {
                    if (s > 0)
                        for (int o = 0; o < off; o++)
                            for (int d = 0; d < dim; d++)
                                codes[(size_t)o * dim + d] = kiln_f32_to_fp8_e4m3(kiln_fp8_e4m3_to_f32(codes[(size_t)o * dim + d]) * s * (1.0f / need));
                    s = need;
                }
                for (int d = 0; d < dim; d++) codes[(size_t)off * dim + d] = kiln_f32_to_fp8_e4m3(x[d] * (s > 0 ? 1.0f / s : 0.0f));
                /* the page's rows so far, decoded with the current scale */
                int p0 = p - off;
                for (int o = 0; o <= off; o++)
                    for (int d = 0; d < dim; d++)
                        dst[((size_t)(p0 + o) * c->KV + h) * dim + d] =
                            (double)(kiln_fp8_e4m3_to_f32(codes[(size_t)o * dim + d]) * s + (mu ? mu[d] : 0.0f));
            }
            free(codes);
            free(xc);
        }
    }
    if (c->shares)
        for (int p = 0; p < n; p++)
            for (int h = 0; h < c->KV; h++)
                for (int d = 0; d < c->vd; d++) t->vr[((size_t)p * c->KV + h) * c->vd + d] = t->kr[((size_t)p * c->KV + h) * c->kd + d];
}

static void make_pool(tstate *t, int n_seqs) {
    const tcase *c = &t->c;
    kiln_kv_config cfg = {.n_layers = 1, .n_kv_heads = c->KV, .head_dim = c->kd, .page_tokens = c->pt, .dtype = c->dt,
                          .k_dim = c->kd, .v_dim = c->vd, .v_shares_k = c->shares, .scale_mode = c->mode,
                          .k_scale = t->ks, .v_scale = t->vs, .k_mean = t->mu,
                          .k_prerope = c->smooth >= 2, .rope_theta = 10000.0f, .rope_norm = c->smooth == 3, .rope_positions = t->n_ctx};
    int pages = n_seqs * ((t->n_ctx + c->pt - 1) / c->pt);
    cfg.mem_bytes = (int64_t)kiln_kv_pool_fixed_bytes(&cfg) + (int64_t)pages * (int64_t)kiln_kv_page_cost(&cfg);
    assert_int_equal(kiln_kv_pool_create(&cfg, &t->pool), KILN_OK);
    assert_int_equal(t->pool->n_pages, pages);
}

static void store_all(tstate *t, kiln_kv_seq *s) {
    const tcase *c = &t->c;
    assert_int_equal(kiln_kv_seq_reserve(t->pool, s, t->n_ctx), KILN_OK);
    for (int p = 0; p < t->n_ctx; p++)
        kiln_kv_store(t->pool, s, 0, p, t->k + (size_t)p * c->KV * c->kd, c->shares ? NULL : t->v + (size_t)p * c->KV * c->vd);
    s->len = t->n_ctx;
}

static void check_stored(tstate *t, const kiln_kv_seq *s) {
    const tcase *c = &t->c;
    float *row = malloc(sizeof(float) * (size_t)(c->kd > c->vd ? c->kd : c->vd));
    for (int p = 0; p < t->n_ctx; p++)
        for (int h = 0; h < c->KV; h++)
            for (int kind = 0; kind < 2; kind++) {
                int dim = kind ? c->vd : c->kd;
                kiln_kv_read_row(t->pool, s, 0, p, h, kind, row);
                const double *ref = (kind ? t->vr : t->kr) + ((size_t)p * c->KV + h) * dim;
                for (int d = 0; d < dim; d++)
                    if ((float)ref[d] != row[d]) {
                        fprintf(stderr, "stored %s pos %d head %d dim %d: %.9g, reference %.9g\n", kind ? "V" : "K", p, h, d, (double)row[d], ref[d]);
                        fail();
                    }
            }
    free(row);
}

/* Reference attention of query q (one head, kd values) over positions [0, lim) of KV head g. */
static void ref_attend(const tstate *t, const float *q, int g, int lim, float scale, double *out) {
    const tcase *c = &t->c;
    double *sc = malloc(sizeof(double) * (size_t)lim), mx = -INFINITY, sum = 0;
    for (int p = 0; p < lim; p++) {
        double a = 0;
        const double *k = t->kr + ((size_t)p * c->KV + g) * c->kd;
        for (int d = 0; d < c->kd; d++) a += (double)q[d] * k[d];
        sc[p] = a * scale;
        mx = sc[p] > mx ? sc[p] : mx;
    }
    for (int p = 0; p < lim; p++) { sc[p] = exp(sc[p] - mx); sum += sc[p]; }
    for (int d = 0; d < c->vd; d++) out[d] = 0;
    for (int p = 0; p < lim; p++) {
        const double *v = t->vr + ((size_t)p * c->KV + g) * c->vd;
        for (int d = 0; d < c->vd; d++) out[d] += sc[p] / sum * v[d];
    }
    free(sc);
}

static double vmax_abs(const tstate *t) {
    double m = 0;
    for (size_t i = 0; i < (size_t)t->n_ctx * t->c.KV * t->c.vd; i++) m = fmax(m, fabs(t->vr[i]));
    return m;
}

static const char *dtn(kiln_kv_dtype d) { return d == KILN_KV_F32 ? "f32" : d == KILN_KV_BF16 ? "bf16" : "fp8"; }

/* n queries: token i of sequence seqs[i] at position pos[i]. */
static void check_batch(tstate *t, kiln_kv_seq **seqs, const int *pos, int n, kiln_isa isa, const char *what) {
    const tcase *c = &t->c;
    const float scale = 1.0f / sqrtf((float)c->kd);
    float *q = malloc(sizeof(float) * (size_t)n * c->H * c->kd);
    float *out = malloc(sizeof(float) * (size_t)n * c->H * c->vd + 64);
    double *ref = malloc(sizeof(double) * (size_t)c->vd);
    for (size_t i = 0; i < (size_t)n * c->H * c->kd; i++) q[i] = nrand();
    for (size_t i = 0; i < (size_t)n * c->H * c->vd; i++) out[i] = NAN;
    kiln_kv_attend_batch(t->pool, 0, n, seqs, pos, q, c->H, scale, out);
    double tol = 1e-4 * vmax_abs(t) + 1e-5, worst = 0;
    int group = c->H / c->KV;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < c->H; h++) {
            ref_attend(t, q + ((size_t)i * c->H + h) * c->kd, h / group, pos[i] + 1, scale, ref);
            const float *o = out + ((size_t)i * c->H + h) * c->vd;
            for (int d = 0; d < c->vd; d++) {
                double e = fabs((double)o[d] - ref[d]);
                if (!(e <= tol)) {
                    fprintf(stderr, "%s isa %s %s%s smooth %d H=%d KV=%d kd=%d vd=%d page=%d ctx=%d: query %d (pos %d) head %d dim %d: %.9g vs ref %.9g (tol %.3g)\n",
                            what, kiln_isa_name(isa), dtn(c->dt), c->mode ? "-dynamic" : "", c->smooth, c->H, c->KV, c->kd, c->vd, c->pt, t->n_ctx, i, pos[i], h, d,
                            (double)o[d], ref[d], tol);
                    fail();
                }
                worst = fmax(worst, e);
            }
        }
    free(q); free(out); free(ref);
}

static void free_state(tstate *t) {
    kiln_kv_pool_free(t->pool);
    free(t->k); free(t->v); free(t->kr); free(t->vr); free(t->ks); free(t->vs); free(t->mu);
}

static void run_case(const tcase *c, int n_ctx, kiln_isa isa) {
    tstate t = {0};
    t.c = *c;
    t.n_ctx = n_ctx;
    gen(&t);
    ref_dequant(&t);
    make_pool(&t, 1);
    kiln_kv_seq s = {0};
    store_all(&t, &s);
    check_stored(&t, &s);
    kiln_kv_seq *sp = &s;
    /* decode: the last position, and an early one (a partly used prefix of the cache) */
    int p = n_ctx - 1;
    check_batch(&t, &sp, &p, 1, isa, "decode");
    p = n_ctx / 3;
    check_batch(&t, &sp, &p, 1, isa, "decode-early");
    /* prefill: the last up-to-13 positions as one causal chunk */
    int m = n_ctx < 13 ? n_ctx : 13;
    kiln_kv_seq *seqs[13];
    int pos[13];
    for (int i = 0; i < m; i++) { seqs[i] = &s; pos[i] = n_ctx - m + i; }
    check_batch(&t, seqs, pos, m, isa, "prefill");
    kiln_kv_seq_release(t.pool, &s);
    free(s.pages);
    free_state(&t);
}

/* Two sequences with different contents and lengths in one batch (continuous batching). */
static void run_two_seqs(const tcase *c, int n_ctx, kiln_isa isa) {
    tstate a = {0}, b = {0};
    a.c = b.c = *c;
    a.n_ctx = n_ctx;
    b.n_ctx = n_ctx;
    gen(&a);
    gen(&b);
    /* one pool with room for both; b uses a's scales so one pool serves both */
    memcpy(b.ks, a.ks, sizeof(float) * c->KV);
    memcpy(b.vs, a.vs, sizeof(float) * c->KV);
    ref_dequant(&a);
    ref_dequant(&b);
    make_pool(&a, 2);
    b.pool = a.pool;
    kiln_kv_seq sa = {0}, sb = {0};
    store_all(&a, &sa);
    store_all(&b, &sb);
    check_stored(&b, &sb);
    /* batch: [a: pos n-3, n-2, n-1] [b: n/2] — check each sequence's rows against its own reference */
    kiln_kv_seq *seqs[4] = {&sa, &sa, &sa, &sb};
    int pos[4] = {n_ctx - 3, n_ctx - 2, n_ctx - 1, n_ctx / 2};
    const float scale = 1.0f / sqrtf((float)c->kd);
    float *q = malloc(sizeof(float) * 4 * c->H * c->kd), *out = malloc(sizeof(float) * 4 * c->H * c->vd);
    double *ref = malloc(sizeof(double) * c->vd);
    for (int i = 0; i < 4 * c->H * c->kd; i++) q[i] = nrand();
    kiln_kv_attend_batch(a.pool, 0, 4, seqs, pos, q, c->H, scale, out);
    double tol = 1e-4 * fmax(vmax_abs(&a), vmax_abs(&b)) + 1e-5;
    for (int i = 0; i < 4; i++)
        for (int h = 0; h < c->H; h++) {
            ref_attend(i < 3 ? &a : &b, q + ((size_t)i * c->H + h) * c->kd, h / (c->H / c->KV), pos[i] + 1, scale, ref);
            for (int d = 0; d < c->vd; d++)
                if (!(fabs((double)out[((size_t)i * c->H + h) * c->vd + d] - ref[d]) <= tol)) {
                    fprintf(stderr, "two-seq isa %s %s: query %d head %d dim %d: %.9g vs %.9g\n", kiln_isa_name(isa), dtn(c->dt), i, h, d,
                            (double)out[((size_t)i * c->H + h) * c->vd + d], ref[d]);
                    fail();
                }
        }
    free(q); free(out); free(ref);
    kiln_kv_seq_release(a.pool, &sa);
    kiln_kv_seq_release(a.pool, &sb);
    free(sa.pages); free(sb.pages);
    b.pool = NULL;
    free_state(&a);
    free_state(&b);
}

static const kiln_isa isas[] = {KILN_ISA_SCALAR, KILN_ISA_AVX2, KILN_ISA_AVX512};

/* {H, KV, kd, vd, shares, page} */
static const int shapes[][6] = {
    {8, 4, 8, 8, 0, 16},     /* stories260K: GQA 2, head dim 8 */
    {3, 3, 24, 24, 0, 7},    /* odd head count, GQA 1, odd page size */
    {20, 5, 40, 40, 0, 16},  /* 5 KV heads, GQA 4 */
    {32, 4, 64, 64, 0, 16},  /* bench-500m: GQA 8 */
    {12, 3, 72, 72, 0, 1},   /* GQA 4, one-token pages */
    {16, 2, 64, 64, 0, 16},  /* GQA 8 */
    {24, 2, 128, 128, 0, 16}, /* head dim 128 (GLM-4.x): the kernels' other compile-time head dim; GQA 12 */
    {10, 1, 576, 512, 1, 16}, /* MLA latent: MQA, V = first 512 of the 576-value K row */
};

static void test_attention_all(void **state) {
    (void)state;
    kiln_fp_init();
    /* f32, bf16, fp8 static, fp8 dynamic, fp8 dynamic + smoothing, fp8 static + smoothing,
     * fp8 static + pre-RoPE smoothing (NEOX pairs, NORM pairs) */
    const kiln_kv_dtype dts[] = {KILN_KV_F32, KILN_KV_BF16, KILN_KV_FP8, KILN_KV_FP8, KILN_KV_FP8, KILN_KV_FP8, KILN_KV_FP8, KILN_KV_FP8};
    const int lens[] = {1, 5, 37, 100};
    for (size_t k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) { fprintf(stderr, "skip %s: not supported by this CPU\n", kiln_isa_name(isas[k])); continue; }
        assert_int_equal(kiln_kernels_select(isas[k]), isas[k]);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int d = 0; d < 8; d++)
                for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
                    if (d >= 6 && shapes[s][4]) continue; /* pre-RoPE smoothing: not for MLA */
                    tcase c = {shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], shapes[s][5], dts[d],
                               d == 3 || d == 4 ? KILN_KV_SCALE_DYNAMIC : KILN_KV_SCALE_STATIC,
                               d >= 6 ? d - 4 : (d == 4 || d == 5) && !shapes[s][4]};
                    run_case(&c, lens[l], isas[k]);
                }
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

/* Long contexts: the driver splits the context across threads and merges (m, l, acc) partials. */
static void test_attention_long(void **state) {
    (void)state;
    kiln_fp_init();
    for (size_t k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        tcase c1 = {8, 1, 64, 64, 0, 16, KILN_KV_FP8, KILN_KV_SCALE_STATIC, 1};
        run_case(&c1, 1500, isas[k]);
        tcase c2 = {4, 2, 40, 40, 0, 16, KILN_KV_BF16, KILN_KV_SCALE_STATIC, 0};
        run_case(&c2, 1029, isas[k]);
        tcase c3 = {4, 1, 576, 512, 1, 16, KILN_KV_FP8, KILN_KV_SCALE_DYNAMIC, 0};
        run_case(&c3, 700, isas[k]);
        tcase c4 = {8, 2, 64, 64, 0, 16, KILN_KV_FP8, KILN_KV_SCALE_STATIC, 2}; /* pre-RoPE, split path */
        run_case(&c4, 1500, isas[k]);
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

static void test_attention_batch(void **state) {
    (void)state;
    kiln_fp_init();
    for (size_t k = 0; k < 3; k++) {
        if (!kiln_cpu_supports(isas[k])) continue;
        kiln_kernels_select(isas[k]);
        tcase c1 = {8, 4, 8, 8, 0, 16, KILN_KV_FP8, KILN_KV_SCALE_STATIC, 0};
        run_two_seqs(&c1, 45, isas[k]);
        tcase c2 = {32, 4, 64, 64, 0, 16, KILN_KV_BF16, KILN_KV_SCALE_STATIC, 0};
        run_two_seqs(&c2, 33, isas[k]);
    }
    kiln_kernels_select(KILN_ISA_AUTO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_all),
        cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_attention_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
