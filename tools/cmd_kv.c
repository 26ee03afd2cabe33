/* cmd_kv.c — the KV cache commands (docs/KV.md):
 *   kiln calibrate MODEL --data FILE [--out PATH] [--margin M] [--max-tokens N] [--no-smooth] [--ctx N]
 *       per (layer, KV head) amax of K and V over FILE's tokens, and the per-channel K means for K
 *       smoothing (unless --no-smooth or an MLA latent cache) → kv_scales.json beside the model;
 *   kiln inspect MODEL --kv [--json] [--kv-dtype ..] [--kv-mem ..] [--kv-page N] [--kv-scale ..]
 *       the KV pool a session would get: bytes per token, pages, capacity, scale source;
 *   kiln bench MODEL --kv-context 512,4096,16384 [--kv-dtype bf16,fp8] [--decode N] [--repeat R]
 *       batch-1 decode tokens/s per (context, KV dtype), the cache filled to the context, and the
 *       time of one decode step's attention alone (all layers) at that context;
 *   kiln bench MODEL --kv-context N --quality FILE [--max-tokens N] [--kv-dtype ...]
 *       teacher-forced agreement of each KV dtype/scale mode with the first one (the reference):
 *       mean KL(P_ref ‖ P), top-1 agreement, over windows of N tokens of FILE.
 * Uses only kiln.h. */
#include "kiln_test.h"
#include "cli.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU seconds of the whole process (all threads): on a shared machine, with --threads 1, the
 * work a step costs independently of how much of the CPU the scheduler gave us. */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *dt_name(kiln_kv_dtype d) {
    return d == KILN_KV_F32 ? "f32" : d == KILN_KV_BF16 ? "bf16" : d == KILN_KV_FP8 ? "fp8" : "auto";
}

/* Reads a whole file (at most max_bytes; 0 = all). */
static char *read_text(const char *path, size_t max_bytes, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            char *b = realloc(buf, (cap *= 2) + 1);
            if (!b) { free(buf); buf = NULL; break; }
            buf = b;
        }
        size_t want = cap - n;
        if (max_bytes && n + want > max_bytes) want = max_bytes - n;
        size_t r = fread(buf + n, 1, want, f);
        n += r;
        if (r == 0 || (max_bytes && n >= max_bytes)) break;
    }
    fclose(f);
    if (!buf) return NULL;
    /* do not cut a UTF-8 sequence in half */
    if (max_bytes && n >= max_bytes)
        while (n > 0 && ((unsigned char)buf[n - 1] & 0xC0) == 0x80) n--;
    if (max_bytes && n >= max_bytes && n > 0 && ((unsigned char)buf[n - 1] & 0x80)) n--;
    buf[n] = 0;
    *len = n;
    return buf;
}

/* FILE's tokens: through the model's tokenizer (BOS first), or, for a model without one, token ids
 * separated by whitespace or commas. */
static int load_tokens(const char *cmd, kiln_model *m, const char *path, size_t max_tokens, int32_t **out, size_t *n_out) {
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    size_t len = 0;
    /* ~4 bytes per token is generous for any tokenizer; read enough for max_tokens */
    char *text = read_text(path, max_tokens ? max_tokens * 16 + 4096 : 0, &len);
    if (!text) {
        fprintf(stderr, "kiln %s: error: --data/--quality file %s: %s\n", cmd, path, strerror(errno));
        return 0;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (info.has_tokenizer) {
        ids = malloc((len + 8) * sizeof *ids);
        kiln_status st = ids ? kiln_tokenize(m, text, len, 1, ids, len + 8, &n) : KILN_ERR_NOMEM;
        if (st) { free(text); free(ids); cli_fail_status(cmd, st); return 0; }
    } else {
        ids = malloc((len / 2 + 8) * sizeof *ids);
        char *p = text, *end;
        while (ids && *p) {
            while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r') p++;
            if (!*p) break;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= info.vocab_size) {
                fprintf(stderr, "kiln %s: error: %s: the model has no tokenizer, so the file must hold token ids in [0, %d); bad token at byte %ld\n",
                        cmd, path, info.vocab_size, (long)(p - text));
                free(text); free(ids);
                return 0;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
    }
    free(text);
    if (max_tokens && n > max_tokens) n = max_tokens;
    if (n < 2) { fprintf(stderr, "kiln %s: error: %s holds fewer than 2 tokens\n", cmd, path); free(ids); return 0; }
    *out = ids;
    *n_out = n;
    return 1;
}

/* ---- calibrate ------------------------------------------------------------------------------------ */
int cmd_calibrate(int argc, char **argv) {
    args_t a = {argc, argv, 0, "calibrate", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *model_path = NULL, *data = NULL, *out = NULL;
    double margin = 2.0;
    long max_tokens = 8192;
    int smooth = 1;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--data") == 0) data = cli_value(&a);
        else if (strcmp(k, "--out") == 0) out = cli_value(&a);
        else if (strcmp(k, "--margin") == 0) cli_float(&a, k, cli_value(&a), 1.0, 1000.0, &margin);
        else if (strcmp(k, "--max-tokens") == 0) cli_long(&a, k, cli_value(&a), 2, 1L << 30, &max_tokens);
        else if (strcmp(k, "--no-smooth") == 0) smooth = 0;
        else if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln calibrate: error: unknown option '%s'\n", k); return 2; }
        else if (!model_path) model_path = k;
        else { fprintf(stderr, "kiln calibrate: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!model_path || !data)
        return cli_fail_msg("calibrate", "usage: kiln calibrate MODEL --data FILE [--out PATH] [--margin M (2)] [--max-tokens N (8192)] [--no-smooth] [--kv-smooth post|prerope|off] [--ctx N] [--threads N]");
    if (!smooth && o.kv_smooth == KILN_KV_SMOOTH_PREROPE)
        return cli_fail_msg("calibrate", "--no-smooth and --kv-smooth prerope contradict each other");
    if (o.kv_smooth == KILN_KV_SMOOTH_OFF) smooth = 0;
    kiln_model *m;
    kiln_status st = kiln_model_load(model_path, &o, &m);
    if (st) return cli_fail_status("calibrate", st);
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    float *ka = NULL, *va = NULL, *km = NULL, *kc = NULL;
    if (!load_tokens("calibrate", m, data, (size_t)max_tokens, &ids, &n)) { rc = 1; goto done; }
    size_t nlh = (size_t)info.n_layers * (size_t)info.n_kv_heads;
    ka = calloc(nlh, sizeof *ka);
    va = calloc(nlh, sizeof *va);
    km = calloc(nlh * (size_t)info.head_dim, sizeof *km);
    kc = calloc(nlh, sizeof *kc);
    if (!ka || !va || !km || !kc) { rc = cli_fail_msg("calibrate", "out of memory"); goto done; }
    double t0 = kiln_now();
    st = kiln_kv_measure_stats(m, &o, ids, n, o.max_context, ka, va, km, kc);
    if (st) { rc = cli_fail_status("calibrate", st); goto done; }
    char path[4400];
    if (out) snprintf(path, sizeof path, "%s", out);
    else kiln_kv_scales_default_path(m, path, sizeof path);
    char src[4200];
    snprintf(src, sizeof src, "kiln calibrate --data %s", data);
    st = kiln_kv_scales_write_mode(m, path, ka, va, smooth ? km : NULL, kc, (float)margin, src, n, o.kv_smooth);
    if (st) { rc = cli_fail_status("calibrate", st); goto done; }
    float kmin = INFINITY, kmax = 0, vmin = INFINITY, vmax = 0;
    for (size_t i = 0; i < nlh; i++) {
        kmin = fminf(kmin, ka[i]); kmax = fmaxf(kmax, ka[i]);
        vmin = fminf(vmin, va[i]); vmax = fmaxf(vmax, va[i]);
    }
    fprintf(stderr, "calibrated %zu tokens of %s in %.1f s: |K| amax per (layer, head) %.4g..%.4g, |V| %.4g..%.4g; margin %g\nwrote %s\n",
            n, data, kiln_now() - t0, (double)kmin, (double)kmax, (double)vmin, (double)vmax, margin, path);
done:
    free(ids); free(ka); free(va); free(km); free(kc);
    kiln_model_free(m);
    return rc;
}

/* ---- inspect --kv ------------------------------------------------------------------------------------ */
int cmd_inspect_kv(int argc, char **argv) {
    args_t a = {argc, argv, 0, "inspect", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *model_path = NULL;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--json") == 0) json = 1;
        else if (strcmp(k, "--kv") == 0) continue;
        else if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln inspect: error: unknown option '%s'\n", k); return 2; }
        else if (!model_path) model_path = k;
        else { fprintf(stderr, "kiln inspect: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!model_path)
        return cli_fail_msg("inspect", "usage: kiln inspect MODEL --kv [--json] [--kv-dtype auto|f32|bf16|fp8] [--kv-mem SIZE] [--kv-page N] [--kv-scale static|dynamic] [--kv-scales FILE] [--ctx N]");
    kiln_model *m;
    kiln_status st = kiln_model_load(model_path, &o, &m);
    if (st) return cli_fail_status("inspect", st);
    kiln_kv_info in;
    st = kiln_kv_plan(m, &o, &in);
    kiln_model_free(m);
    if (st) return cli_fail_status("inspect", st);
    const char *mode = in.dtype != KILN_KV_FP8 ? "none" : in.scale_mode == KILN_KV_SCALE_DYNAMIC ? "dynamic" : "static";
    if (json) {
        /* scale_source may hold a path: escape it */
        char src[1100];
        size_t j = 0;
        for (const char *p = in.scale_source; *p && j + 7 < sizeof src; p++) {
            unsigned char c = (unsigned char)*p;
            if (c == '"' || c == '\\') { src[j++] = '\\'; src[j++] = (char)c; }
            else if (c < 0x20) j += (size_t)snprintf(src + j, sizeof src - j, "\\u%04x", c);
            else src[j++] = (char)c;
        }
        src[j] = 0;
        printf("{\"kv_dtype\": \"%s\", \"scale_mode\": \"%s\", \"scale_source\": \"%s\", \"page_tokens\": %d, "
               "\"bytes_per_token\": %llu, \"capacity_tokens\": %lld, \"pages\": %lld, \"page_bytes\": %llu, "
               "\"page_data_bytes\": %llu, \"page_meta_bytes\": %llu, \"pool_fixed_bytes\": %llu, \"mem_bytes\": %lld, "
               "\"n_layers\": %d, \"n_kv_heads\": %d, \"k_dim\": %d, \"v_dim\": %d, \"v_shares_k\": %s, \"max_context\": %d, "
               "\"dsa_latent\": %d, \"dsa_rope\": %d, \"dsa_index_key\": %d, \"dsa_row_bytes\": %d, \"dsa_key_layers\": %d}\n",
               in.dtype_name, mode, src, in.page_tokens, (unsigned long long)in.bytes_per_token, (long long)in.capacity_tokens,
               (long long)in.n_pages, (unsigned long long)in.page_bytes, (unsigned long long)in.page_data_bytes,
               (unsigned long long)in.page_meta_bytes, (unsigned long long)in.pool_fixed_bytes, (long long)in.mem_bytes, in.n_layers,
               in.n_kv_heads, in.k_dim, in.v_dim, in.v_shares_k ? "true" : "false", in.max_context,
               in.dsa_latent, in.dsa_rope, in.dsa_index_key, in.dsa_row_bytes, in.dsa_key_layers);
    } else {
        printf("kv dtype:        %s (scales: %s)\n", in.dtype_name, mode);
        if (in.dtype == KILN_KV_FP8) printf("scale source:    %s\n", in.scale_source);
        printf("layout:          %d layers × %d KV heads × (K %d%s V %d) values per token\n", in.n_layers, in.n_kv_heads, in.k_dim,
               in.v_shares_k ? ", V = first" : " +", in.v_dim);
        if (in.dsa_index_key)
            printf("row:             latent %d + rope %d + indexer key %d, %d bytes, the key in %d of %d layers (the others\n"
                   "                 reuse a selection: %d bytes) (sparse attention: the latent and the indexer key as FP8 E4M3\n"
                   "                 codes with a power-of-two f32 scale per 128, as the model rounds them, kept exactly; the\n"
                   "                 rope part in %s%s)\n",
                   in.dsa_latent, in.dsa_rope, in.dsa_index_key, in.dsa_row_bytes, in.dsa_key_layers, in.n_layers,
                   in.dsa_row_bytes - in.dsa_index_key - in.dsa_index_key / 32, in.dtype_name,
                   in.dsa_fp8 ? ": --kv-dtype fp8 gives SGLang's / vLLM's FP8 layout, whose rope part is bf16" : "");
        printf("bytes per token: %llu\n", (unsigned long long)in.bytes_per_token);
        printf("page:            %d tokens, %llu bytes (%llu data + %llu metadata)\n", in.page_tokens, (unsigned long long)in.page_bytes,
               (unsigned long long)in.page_data_bytes, (unsigned long long)in.page_meta_bytes);
        printf("budget:          %lld bytes (%.1f MiB)%s\n", (long long)in.mem_bytes, (double)in.mem_bytes / 1048576.0,
               o.kv_mem_bytes ? "" : " = one full context (no --kv-mem)");
        printf("capacity:        %lld pages = %lld tokens (context %d)\n", (long long)in.n_pages, (long long)in.capacity_tokens, in.max_context);
    }
    return 0;
}

/* ---- bench --kv-context ------------------------------------------------------------------------------ */
static int parse_list(args_t *a, const char *opt, const char *s, long *v, int cap, long lo, long hi) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s ? s : "");
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        if (n == cap || !cli_long(a, opt, t, lo, hi, &v[n])) { a->bad = 1; return 0; }
        n++;
    }
    if (!n) { fprintf(stderr, "kiln %s: error: option %s: empty list\n", a->cmd, opt); a->bad = 1; }
    return n;
}

typedef struct { kiln_kv_dtype dt; kiln_kv_scale_mode mode; } kv_variant;

static int parse_variants(args_t *a, const char *s, kv_variant *v, int cap) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s ? s : "");
    for (char *t = strtok(buf, ","); t && n < cap; t = strtok(NULL, ",")) {
        if (strcmp(t, "f32") == 0) v[n++] = (kv_variant){KILN_KV_F32, KILN_KV_SCALE_STATIC};
        else if (strcmp(t, "bf16") == 0) v[n++] = (kv_variant){KILN_KV_BF16, KILN_KV_SCALE_STATIC};
        else if (strcmp(t, "fp8") == 0 || strcmp(t, "fp8-static") == 0) v[n++] = (kv_variant){KILN_KV_FP8, KILN_KV_SCALE_STATIC};
        else if (strcmp(t, "fp8-dynamic") == 0) v[n++] = (kv_variant){KILN_KV_FP8, KILN_KV_SCALE_DYNAMIC};
        else {
            fprintf(stderr, "kiln bench: error: option --kv-dtype: '%s' is not one of f32, bf16, fp8, fp8-static, fp8-dynamic\n", t);
            a->bad = 1;
            return 0;
        }
    }
    return n;
}

static const char *variant_name(kv_variant v) {
    if (v.dt != KILN_KV_FP8) return dt_name(v.dt);
    return v.mode == KILN_KV_SCALE_DYNAMIC ? "fp8-dynamic" : "fp8";
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* KL(p ‖ q) of the softmaxes of two logit rows, in double. */
static double kl_logits(const float *lp, const float *lq, int n) {
    double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, kl = 0;
    for (int i = 0; i < n; i++) { mp = fmax(mp, lp[i]); mq = fmax(mq, lq[i]); }
    for (int i = 0; i < n; i++) { sp += exp(lp[i] - mp); sq += exp(lq[i] - mq); }
    double lsp = log(sp), lsq = log(sq);
    for (int i = 0; i < n; i++) {
        double a = lp[i] - mp - lsp, b = lq[i] - mq - lsq;
        kl += exp(a) * (a - b);
    }
    return kl > 0 ? kl : 0;
}

static int kv_quality(kiln_model *m, const kiln_options *base, const char *file, long window, long max_tokens, const kv_variant *vs, int nv, int json) {
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!load_tokens("bench", m, file, (size_t)max_tokens, &ids, &n)) return 1;
    if (window > info.max_context) window = info.max_context;
    kiln_session *ss[8] = {0};
    float *lg[8] = {0};
    int rc = 0;
    for (int v = 0; v < nv; v++) {
        kiln_options o = *base;
        o.kv_dtype = vs[v].dt;
        o.kv_scale_mode = vs[v].mode;
        o.max_context = (int)window;
        /* --kv-smooth prerope is for static FP8 pools: the BF16 / F32 reference and dynamic variants
         * run without it (they have no key means) */
        if (o.kv_smooth == KILN_KV_SMOOTH_PREROPE && (o.kv_dtype != KILN_KV_FP8 || o.kv_scale_mode == KILN_KV_SCALE_DYNAMIC))
            o.kv_smooth = KILN_KV_SMOOTH_DEFAULT;
        kiln_status st = kiln_session_create(m, &o, &ss[v]);
        if (st) { rc = cli_fail_status("bench", st); goto done; }
        lg[v] = malloc((size_t)window * (size_t)info.vocab_size * sizeof(float));
        if (!lg[v]) { rc = cli_fail_msg("bench", "out of memory"); goto done; }
    }
    /* windows: BOS (when the model has one) + window-1 tokens of the text */
    double kl[8] = {0}, klmax[8] = {0};
    long agree[8] = {0}, scored = 0;
    int bos = info.bos_id >= 0;
    size_t step = (size_t)window - (size_t)bos;
    int32_t *w = malloc((size_t)window * sizeof *w);
    size_t start = bos && n > 0 && ids[0] == info.bos_id ? 1 : 0; /* the tokenizer's BOS is re-added per window */
    for (size_t pos = start; pos + 1 < n && w; pos += step) {
        int len = 0;
        if (bos) w[len++] = info.bos_id;
        for (size_t j = pos; j < n && len < window; j++) w[len++] = ids[j];
        if (len < 2) break;
        for (int v = 0; v < nv; v++) {
            kiln_session_reset(ss[v]);
            kiln_status st = kiln_session_eval(ss[v], w, len, lg[v]);
            if (st) { rc = cli_fail_status("bench", st); free(w); goto done; }
        }
        for (int t = 0; t < len; t++) {
            const float *r = lg[0] + (size_t)t * info.vocab_size;
            int top = argmax(r, info.vocab_size);
            for (int v = 1; v < nv; v++) {
                const float *q = lg[v] + (size_t)t * info.vocab_size;
                double d = kl_logits(r, q, info.vocab_size);
                kl[v] += d;
                klmax[v] = fmax(klmax[v], d);
                agree[v] += argmax(q, info.vocab_size) == top;
            }
            scored++;
        }
    }
    free(w);
    if (json) {
        printf("{\"file\": \"%s\", \"tokens\": %ld, \"window\": %ld, \"reference\": \"%s\", \"results\": [", file, scored, window, variant_name(vs[0]));
        for (int v = 1; v < nv; v++)
            printf("%s{\"kv\": \"%s\", \"mean_kl\": %.6g, \"max_kl\": %.6g, \"top1_agreement\": %.6f}", v > 1 ? ", " : "", variant_name(vs[v]),
                   kl[v] / (double)scored, klmax[v], (double)agree[v] / (double)scored);
        printf("]}\n");
    } else {
        printf("teacher-forced over %ld positions of %s (windows of %ld tokens), reference KV %s:\n", scored, file, window, variant_name(vs[0]));
        printf("%-12s %12s %12s %10s\n", "kv", "mean KL", "max KL", "top-1");
        for (int v = 1; v < nv; v++)
            printf("%-12s %12.3e %12.3e %9.4f%%\n", variant_name(vs[v]), kl[v] / (double)scored, klmax[v], 100.0 * (double)agree[v] / (double)scored);
    }
done:
    for (int v = 0; v < nv; v++) { kiln_session_free(ss[v]); free(lg[v]); }
    free(ids);
    return rc;
}

int kv_bench(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    const char *model_path = NULL, *quality = NULL, *dts = NULL, *weights = NULL;
    long ctx[16], n_ctx = 0, decode = 16, repeat = 3, max_tokens = 20000;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (strcmp(k, "--kv-dtype") == 0) { dts = cli_value(&a); continue; } /* a list here */
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "--kv-context") == 0) n_ctx = parse_list(&a, k, cli_value(&a), ctx, 16, 2, 1 << 24);
        else if (strcmp(k, "--decode") == 0) cli_long(&a, k, cli_value(&a), 1, 100000, &decode);
        else if (strcmp(k, "--repeat") == 0) cli_long(&a, k, cli_value(&a), 1, 1000, &repeat);
        else if (strcmp(k, "--quality") == 0) quality = cli_value(&a);
        else if (strcmp(k, "--weights") == 0) weights = cli_value(&a); /* one format: the weights the KV variants share */
        else if (strcmp(k, "--max-tokens") == 0) cli_long(&a, k, cli_value(&a), 2, 1L << 30, &max_tokens);
        else if (strcmp(k, "--json") == 0) json = 1;
        else if (strcmp(k, "--kv") == 0) continue;
        else if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln bench: error: unknown option '%s'\n", k); return 2; }
        else if (!model_path) model_path = k;
        else { fprintf(stderr, "kiln bench: error: unexpected argument '%s'\n", k); return 2; }
    }
    kv_variant vs[8];
    int nv = parse_variants(&a, dts ? dts : quality ? "bf16,fp8,fp8-dynamic" : "bf16,fp8", vs, 8);
    if (a.bad) return 2;
    if (!model_path || !n_ctx || nv < 1)
        return cli_fail_msg("bench", "usage: kiln bench MODEL --kv-context N[,N...] [--kv-dtype bf16,fp8[,fp8-dynamic]] [--decode N (16)] [--repeat R (3)] [--weights FMT] [--threads N] [--json]\n"
                                     "       kiln bench MODEL --kv-context N --quality FILE [--max-tokens N (20000)] [--kv-dtype REF,TEST,...]");
    o.quiet = 1;
    kiln_model *m;
    kiln_status st = kiln_model_load(model_path, &o, &m);
    if (st) return cli_fail_status("bench", st);
    if (weights) { /* every linear layer and the head, as `kiln bench --weights` does */
        int kept = 0;
        if ((st = kiln_model_requantize(m, weights, &kept)) || (st = kiln_model_requantize_head(m, weights))) {
            kiln_model_free(m);
            return cli_fail_status("bench", st);
        }
    }
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    int rc = 0;
    if (quality) {
        if (nv < 2) { kiln_model_free(m); return cli_fail_msg("bench", "--quality needs a reference and at least one KV dtype to compare (e.g. --kv-dtype bf16,fp8)"); }
        rc = kv_quality(m, &o, quality, ctx[0], max_tokens, vs, nv, json);
        kiln_model_free(m);
        return rc;
    }
    /* Speed: one session per KV variant with room for the longest context + the decoded tokens. The
     * cache is filled to each context with copies of a short real prompt's rows, then `decode`
     * greedy steps are timed; repeats alternate variants and keep the best (least disturbed) run. */
    long cmax = 0;
    for (int i = 0; i < n_ctx; i++) cmax = ctx[i] > cmax ? ctx[i] : cmax;
    if (cmax + decode + 1 > info.max_context) {
        char msg[400];
        snprintf(msg, sizeof msg, "context %ld + %ld decoded tokens exceeds the model's context %d (make a model with a longer one, e.g. "
                 "kiln mkmodel --preset bench-500m --seq %ld)", cmax, decode, info.max_context, cmax + decode + 64);
        kiln_model_free(m);
        return cli_fail_msg("bench", msg);
    }
    kiln_session *ss[8] = {0};
    double best[16][8], attn[16][8], cbest[16][8], cattn[16][8];
    int32_t prompt[8];
    for (int i = 0; i < 8; i++) prompt[i] = (int32_t)((i == 0 && info.bos_id >= 0) ? info.bos_id : (1000 + 37 * i) % info.vocab_size);
    for (int v = 0; v < nv; v++) {
        kiln_options oo = o;
        oo.kv_dtype = vs[v].dt;
        oo.kv_scale_mode = vs[v].mode;
        /* --kv-smooth prerope applies to the static-scale FP8 variants (as in the quality bench) */
        if (oo.kv_smooth == KILN_KV_SMOOTH_PREROPE && (oo.kv_dtype != KILN_KV_FP8 || oo.kv_scale_mode == KILN_KV_SCALE_DYNAMIC))
            oo.kv_smooth = KILN_KV_SMOOTH_DEFAULT;
        oo.max_context = (int)(cmax + decode + 9);
        oo.quiet = 0; /* the KV summary line (with the scale source) goes to stderr */
        st = kiln_session_create(m, &oo, &ss[v]);
        if (!st) st = kiln_session_eval(ss[v], prompt, 8, NULL);
        if (st) { rc = cli_fail_status("bench", st); goto done; }
    }
    for (int c = 0; c < n_ctx; c++)
        for (int v = 0; v < nv; v++) { best[c][v] = cbest[c][v] = 0; attn[c][v] = cattn[c][v] = 1e30; }
    for (int c = 0; c < n_ctx; c++) {
        for (int r = 0; r < repeat; r++)
            for (int vi = 0; vi < nv; vi++) {
                /* ABBA order: odd rounds run the variants in reverse, so that no variant always runs
                 * first (measured: the first of two variants after the fills came out up to ~3%
                 * faster whichever it was) */
                const int v = (r & 1) ? nv - 1 - vi : vi;
                kiln_session *s = ss[v];
                if ((st = kiln_session_truncate(s, 8)) || (st = kiln_session_kv_fill(s, (int)ctx[c]))) { rc = cli_fail_status("bench", st); goto done; }
                int32_t tok = (int32_t)argmax(kiln_session_logits(s), info.vocab_size);
                /* one untimed step first: the first read of freshly filled pages also pays their
                 * one-time work (integrity seals of the fill), which a decode at steady state does not */
                if ((st = kiln_session_eval(s, &tok, 1, NULL))) { rc = cli_fail_status("bench", st); goto done; }
                tok = (int32_t)argmax(kiln_session_logits(s), info.vocab_size);
                double t0 = kiln_now(), c0 = cpu_now();
                for (long i = 0; i < decode; i++) {
                    if ((st = kiln_session_eval(s, &tok, 1, NULL))) { rc = cli_fail_status("bench", st); goto done; }
                    tok = (int32_t)argmax(kiln_session_logits(s), info.vocab_size);
                }
                double tps = (double)decode / (kiln_now() - t0), ctps = (double)decode / (cpu_now() - c0);
                if (tps > best[c][v]) best[c][v] = tps;
                if (ctps > cbest[c][v]) cbest[c][v] = ctps;
                for (int k = 0; k < 3; k++) {
                    double c1 = cpu_now(), at = kiln_session_bench_attention(s, 1), ca = cpu_now() - c1;
                    if (at > 0 && at < attn[c][v]) attn[c][v] = at;
                    if (at > 0 && ca < cattn[c][v]) cattn[c][v] = ca;
                }
            }
    }
    if (json) {
        printf("{\"model\": \"%s\", \"decode_tokens\": %ld, \"repeats\": %ld, \"results\": [", model_path, decode, repeat);
        for (int c = 0; c < n_ctx; c++)
            for (int v = 0; v < nv; v++) {
                kiln_kv_info in;
                kiln_session_kv_info(ss[v], &in);
                printf("%s{\"context\": %ld, \"kv\": \"%s\", \"tokens_per_s\": %.3f, \"tokens_per_cpu_s\": %.3f, \"attention_ms\": %.4f, "
                       "\"attention_cpu_ms\": %.4f, \"kv_bytes_read_per_token\": %llu, \"vs_first\": %.4f, \"cpu_vs_first\": %.4f, "
                       "\"attention_vs_first\": %.4f, \"attention_cpu_vs_first\": %.4f}",
                       c || v ? ", " : "", ctx[c], variant_name(vs[v]), best[c][v], cbest[c][v], 1e3 * attn[c][v], 1e3 * cattn[c][v],
                       (unsigned long long)(in.bytes_per_token * (uint64_t)ctx[c]), best[c][v] / best[c][0], cbest[c][v] / cbest[c][0],
                       attn[c][0] / attn[c][v], cattn[c][0] / cattn[c][v]);
            }
        printf("]}\n");
    } else {
        printf("batch-1 decode, %ld tokens per run, best of %ld (variants interleaved), %s:\n", decode, repeat, model_path);
        printf("wall clock, and CPU time of the process (the fair measure on a shared machine with --threads 1):\n");
        printf("%8s  %-12s %9s %9s %10s %9s | %10s %9s %10s %9s | %8s\n", "context", "kv", "tokens/s", "vs first", "attn ms", "attn x",
               "tok/cpu-s", "vs first", "attn cpu", "attn x", "KV MB");
        for (int c = 0; c < n_ctx; c++)
            for (int v = 0; v < nv; v++) {
                kiln_kv_info in;
                kiln_session_kv_info(ss[v], &in);
                printf("%8ld  %-12s %9.3f %8.3fx %10.3f %8.3fx | %10.3f %8.3fx %10.3f %8.3fx | %8.1f\n", ctx[c], variant_name(vs[v]), best[c][v],
                       best[c][v] / best[c][0], 1e3 * attn[c][v], attn[c][0] / attn[c][v], cbest[c][v], cbest[c][v] / cbest[c][0],
                       1e3 * cattn[c][v], cattn[c][0] / cattn[c][v], (double)in.bytes_per_token * (double)ctx[c] / 1e6);
            }
    }
done:
    for (int v = 0; v < nv; v++) kiln_session_free(ss[v]);
    kiln_model_free(m);
    return rc;
}
