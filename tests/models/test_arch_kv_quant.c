/* test_arch_kv_quant.c — FP8 and BF16 KV caches of every GLM / DeepSeek / Kimi architecture against
 * the independent PyTorch reference fed the same rounded KV.
 *
 * Comparing an FP8-cache run with a reference that rounds its own K/V is ill-conditioned: kiln's and
 * the reference's pre-rounding values differ by float32 summation-order noise (~1e-7 relative), and a
 * value that lands within that noise of a rounding midpoint rounds the other way (one FP8 step, ~6%),
 * which moves the logits by up to ~1e-3 on these tiny models. So this driver:
 *   1. writes a tiny checkpoint (kiln_mkmodel), derives static FP8 scales from an F32 calibration pass
 *      over the prompt (kiln_kv_measure_amax, margin 2, kv_scales.json);
 *   2. runs a 64-token prompt and 31 greedy decode steps with --kv-dtype fp8 (or bf16), keeping every
 *      logits row and the evaluated tokens;
 *   3. dumps the cache as stored (kiln_kv_read_row: dequantized K and V rows of every layer, position
 *      and KV head; MLA: the latent row);
 *   4. runs tests/reference/check_kv_dump.py, which checks (a) every stored value is the
 *      round-to-nearest-even FP8/BF16 value of the reference's own pre-rounding value, or its
 *      neighbour when that value lies within 1e-3 of a step of the midpoint (noise), and (b) the
 *      reference fed exactly the stored rows reproduces kiln's logits within 1e-3 relative error and
 *      its greedy tokens.
 * DeepSeek sparse attention (deepseek_v32, glm_moe_dsa; docs/DSA.md) is the same problem without
 * any KV option: the model itself rounds the latent and the indexer keys through FP8 (per-128
 * power-of-two scales), stored as those codes (the compact rows, kv.h), so its cases run with BF16,
 * F32 and "fp8" rope parts (fp8 = the FP8 layout whose rope part is bf16), the shared-indexer preset too, and with the routed experts stored as INT4 (group 32) and as FP8
 * blocks (kiln's own checkpoint writer; the reference reads the dequantized values); the checker
 * verifies the model's FP8 roundings of both row parts the same way.
 * Skipped (77) when the Python interpreter ($PY, default /usr/bin/python3) is missing. */
#include "kiln.h"
#include "engine/session_internal.h"
#include "kv/kv.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_PROMPT 64
#define N_GEN 32

static int fail(const char *what) {
    fprintf(stderr, "FAIL: %s: %s\n", what, kiln_last_error());
    return 1;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static int write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) != 0 || w != n;
}

/* Writes DIR = root/NAME with the checkpoint (arch, preset; routed experts stored as `experts`:
 * NULL = as mkmodel wrote them, "int4" = INT4 group 32, "fp8" = FP8 128-blocks) and the run's dump
 * files; 0 on success. */
static int run_case(const char *root, const char *name, const char *arch, const char *preset, const char *kv, const char *experts, int vulkan) {
    char dir[4400], scales[4500], spec[64];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(scales, sizeof scales, "%s/test_kv_scales.json", dir);
    snprintf(spec, sizeof spec, "preset=%s", preset);
    kiln_options o;
    kiln_options_default(&o);
    o.quiet = 1;
    if (vulkan) o.backend = KILN_BACKEND_VULKAN;
    if (experts) { /* write the F32 checkpoint aside, then its quantized-experts copy as the case's checkpoint */
        char src[4500];
        snprintf(src, sizeof src, "%s-src", dir);
        kiln_model *ms;
        if (kiln_mkmodel(arch, spec, "f32", 1, src) != KILN_OK) return fail("mkmodel");
        if (kiln_model_load(src, &o, &ms) != KILN_OK) return fail("load source");
        kiln_status qs = kiln_model_quantize_save(ms, dir, experts, 32, "experts", 0);
        kiln_model_free(ms);
        if (qs != KILN_OK) return fail("quantize experts");
    } else if (kiln_mkmodel(arch, spec, "f32", 1, dir) != KILN_OK) {
        return fail("mkmodel");
    }
    /* the SIMD INT4 kernels quantize activations (W4A8) and the bf16-dot FP8 form rounds them to
     * bf16 (W8A16), neither of which the F32 reference models (tests/kernels bound those paths) */
    if (experts && !strcmp(experts, "int4")) o.isa = KILN_ISA_SCALAR;
    if (experts && !strcmp(experts, "fp8")) o.fp8_gemv = KILN_FP8_EXACT;
    kiln_model *m;
    if (kiln_model_load(dir, &o, &m) != KILN_OK) return fail("load");
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    const int V = info.vocab_size, T = N_PROMPT + N_GEN - 1;
    int32_t tok[N_PROMPT + N_GEN];
    uint32_t lcg = 12345u;
    for (int i = 0; i < N_PROMPT; i++) {
        lcg = lcg * 1664525u + 1013904223u;
        tok[i] = (int32_t)((lcg >> 8) % (uint32_t)V);
    }
    int rc = 1;
    kiln_session *s = NULL;
    float *logits = malloc((size_t)T * V * sizeof(float)), *kamax = NULL, *vamax = NULL, *dump = NULL;
    /* DSA with --kv-dtype fp8: the compact rows with a bf16 rope part (docs/DSA.md), no scales to
     * calibrate; the checker verifies the rows as the bf16 pages they equal */
    const int dsa = !strcmp(arch, "deepseek_v32") || !strcmp(arch, "glm_moe_dsa");
    const char *meta_kv = dsa && !strcmp(kv, "fp8") ? "bf16" : kv;
    if (dsa && !strcmp(kv, "fp8")) {
        o.kv_dtype = KILN_KV_FP8;
    } else if (!strcmp(kv, "fp8")) {
        size_t n = (size_t)info.n_layers * info.n_kv_heads;
        kamax = calloc(n, sizeof *kamax);
        vamax = calloc(n, sizeof *vamax);
        if (kiln_kv_measure_amax(m, &o, tok, N_PROMPT, 0, kamax, vamax) != KILN_OK) { fail("measure amax"); goto out; }
        if (kiln_kv_scales_write(m, scales, kamax, vamax, NULL, NULL, 2.0f, "test_arch_kv_quant", N_PROMPT) != KILN_OK) { fail("write scales"); goto out; }
        o.kv_dtype = KILN_KV_FP8;
        o.kv_scales_path = scales;
    } else {
        o.kv_dtype = !strcmp(kv, "f32") ? KILN_KV_F32 : KILN_KV_BF16;
    }
    if (kiln_session_create(m, &o, &s) != KILN_OK) { fail("session"); goto out; }
    if (kiln_session_eval(s, tok, N_PROMPT, logits) != KILN_OK) { fail("prompt"); goto out; }
    for (int j = 0; j < N_GEN; j++) {
        tok[N_PROMPT + j] = argmax(logits + (size_t)(N_PROMPT - 1 + j) * V, V);
        if (j == N_GEN - 1) break;
        if (kiln_session_eval(s, &tok[N_PROMPT + j], 1, logits + (size_t)(N_PROMPT + j) * V) != KILN_OK) { fail("decode"); goto out; }
    }
    kiln_kv_pool *pool;
    kiln_kv_seq *seq;
    kiln_session_kv_(s, &pool, &seq);
    const kiln_kv_config *c = &pool->cfg;
    size_t row = (size_t)c->k_dim + (c->v_shares_k ? 0 : (size_t)c->v_dim);
    size_t n = (size_t)c->n_layers * T * c->n_kv_heads * row;
    dump = malloc(n * sizeof(float));
    float *p = dump;
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < c->n_kv_heads; h++) {
                kiln_kv_read_row(pool, seq, l, t, h, 0, p);
                p += c->k_dim;
                if (!c->v_shares_k) {
                    kiln_kv_read_row(pool, seq, l, t, h, 1, p);
                    p += c->v_dim;
                }
            }
    char meta[1024];
    int ml = snprintf(meta, sizeof meta,
                      "{\"arch\": \"%s\", \"kv\": \"%s\", \"tokens\": %d, \"generated\": %d, \"vocab\": %d, \"n_layers\": %d, "
                      "\"n_kv_heads\": %d, \"k_dim\": %d, \"v_dim\": %d, \"v_shares_k\": %d, \"scales\": \"%s\", \"device\": \"%s\"}\n",
                      arch, meta_kv, T, N_GEN, V, c->n_layers, c->n_kv_heads, c->k_dim, c->v_dim, c->v_shares_k,
                      !strcmp(meta_kv, "fp8") ? "test_kv_scales.json" : "", vulkan ? "vulkan" : "cpu");
    if (write_file(dir, "kv_meta.json", meta, (size_t)ml) || write_file(dir, "kv_tokens.i32", tok, sizeof tok) ||
        write_file(dir, "kv_logits.f32", logits, (size_t)T * V * sizeof(float)) || write_file(dir, "kv_dump.f32", dump, n * sizeof(float))) {
        fprintf(stderr, "FAIL: cannot write the dump files in %s\n", dir);
        goto out;
    }
    rc = 0;
out:
    free(logits); free(kamax); free(vamax); free(dump);
    kiln_session_free(s);
    kiln_model_free(m);
    return rc;
}

int main(void) {
    const char *py = getenv("PY") ? getenv("PY") : "/usr/bin/python3";
    if (access(py, X_OK) != 0) {
        printf("SKIP: no python interpreter at %s\n", py);
        return 77;
    }
    /* tests/reference/check_kv_dump.py next to this file's directory */
    char checker[4200];
    snprintf(checker, sizeof checker, "%s", __FILE__);
    char *sl = strstr(checker, "tests/models/");
    if (!sl) return 77;
    strcpy(sl, "tests/reference/check_kv_dump.py");
    if (access(checker, R_OK) != 0) {
        printf("SKIP: %s not found (run from the repository root)\n", checker);
        return 77;
    }
    char root[4200];
    snprintf(root, sizeof root, "%.3000s/kiln_kvq_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) return 1;
    /* KILN_DEVICES naming vulkan (scripts/run_tests.sh, where the build has a device): the sparse-
     * attention cases also run on the vulkan backend, whose shaders store the compact rows, scan,
     * select and attend (the same checker, the same tolerances) */
    const int vk = getenv("KILN_DEVICES") && strstr(getenv("KILN_DEVICES"), "vulkan");
    static const struct { const char *arch, *preset, *kv, *experts; } cases[] = {
        {"chatglm", "tiny", "fp8", NULL},         {"chatglm", "tiny", "bf16", NULL},        {"glm4", "tiny", "fp8", NULL},
        {"glm4", "tiny", "bf16", NULL},           {"glm4_moe", "tiny", "fp8", NULL},        {"glm4_moe", "tiny", "bf16", NULL},
        {"deepseek_v3", "tiny", "fp8", NULL},     {"deepseek_v3", "tiny", "bf16", NULL},    {"kimi_k2", "tiny", "fp8", NULL},
        {"kimi_k2", "tiny", "bf16", NULL},        {"glm4_moe_lite", "tiny", "fp8", NULL},   {"glm4_moe_lite", "tiny", "bf16", NULL},
        {"deepseek_v32", "tiny", "f32", NULL},    {"deepseek_v32", "tiny", "bf16", NULL},   {"glm_moe_dsa", "tiny", "f32", NULL},
        {"glm_moe_dsa", "tiny", "bf16", NULL},    {"glm_moe_dsa", "tiny-shared", "f32", NULL}, {"glm_moe_dsa", "tiny-shared", "bf16", NULL},
        {"glm_moe_dsa", "tiny", "bf16", "int4"},  {"deepseek_v32", "tiny", "bf16", "fp8"},
        {"glm_moe_dsa", "tiny-shared", "fp8", "int4"}, {"deepseek_v32", "tiny", "fp8", NULL}, /* --kv-dtype fp8: compact rows, rope bf16 */
    };
    int failures = 0;
    char cmd[16384];
    int len = snprintf(cmd, sizeof cmd, "'%s' '%s'", py, checker);
    const size_t n_cases = sizeof cases / sizeof cases[0];
    for (size_t k = 0; k < n_cases * (vk ? 2 : 1); k++) {
        const size_t i = k % n_cases;
        const int on_vk = k >= n_cases;
        if (on_vk && strcmp(cases[i].arch, "deepseek_v32") != 0 && strcmp(cases[i].arch, "glm_moe_dsa") != 0) continue;
        char name[160];
        snprintf(name, sizeof name, "%s-%s-%s%s%s%s", cases[i].arch, cases[i].preset, cases[i].kv, cases[i].experts ? "-experts-" : "",
                 cases[i].experts ? cases[i].experts : "", on_vk ? "-vulkan" : "");
        if (run_case(root, name, cases[i].arch, cases[i].preset, cases[i].kv, cases[i].experts, on_vk) != 0) { failures++; continue; }
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " '%s/%s'", root, name);
    }
    /* one interpreter checks every dump (torch starts once) */
    if (system(cmd) != 0) failures++;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (getenv("KILN_TEST_KEEP")) printf("kept %s\n", root); /* debugging: keep the dumps */
    else if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", root);
    printf("%s\n", failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}
