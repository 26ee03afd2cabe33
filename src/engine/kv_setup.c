/* kv_setup.c — KV pool configuration for a model: layout, budget, FP8 scale resolution and the
 * calibration pass (see kv_setup.h). Also the public calibration entry points of kiln.h. */
#include "engine/kv_setup.h"
#include "kv/kv_scales.h"
#include "base/status.h"
#include "model/forward.h"
#include "model/model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The built-in calibration text: plain English prose with numbers, names, dialogue and a little
 * code-like punctuation, so keys and values see a spread of token kinds. Written for kiln. */
static const char builtin_text[] =
    "The harbour town woke slowly. At six o'clock the baker, Mrs. Alvarez, opened her shutters and set "
    "out forty-two loaves on the cooling rack, while her son counted coins into a tin: 3 pennies, 7 "
    "nickels and a single silver dollar from 1921. \"Is the ferry late again?\" he asked. \"It left "
    "Portsmouth at 5:45,\" she said, \"so it will dock at half past seven, if the wind holds.\"\n"
    "Down at the pier, a girl named Lily was teaching her little brother to tie a bowline. First make a "
    "small loop, then bring the end up through it, around the standing part, and back down again. He "
    "laughed when the knot fell apart, and tried once more, slowly, with his tongue between his teeth.\n"
    "In the library above the post office, the old clock read 10:15. A student copied a formula from a "
    "thick textbook: E = m * c^2, where c is about 299,792 kilometres per second. Next to it she wrote a "
    "short list: (1) measure the mass; (2) square the speed; (3) multiply. Then she crossed it all out "
    "and drew a cat instead.\n"
    "Weather report: cloudy in the morning, with a 40% chance of rain after noon; winds from the north "
    "west at 15 to 20 km/h; high of 18 degrees, low of 9. Fishermen were advised to return before dusk.\n"
    "That evening the whole town gathered in the square. Someone played an accordion, the children ran "
    "between the tables, and the mayor gave a speech that nobody remembered the next day. It was, "
    "everyone agreed, a very good day.";

void kiln_kv_layout_for_model(const struct kiln_model *m, kiln_kv_config *c) {
    const kiln_hparams *hp = &m->hp;
    c->n_layers = hp->n_layers;
    c->n_kv_heads = hp->n_kv_heads;
    c->head_dim = hp->head_dim;
    c->k_dim = hp->head_dim;
    c->v_dim = hp->kv_v_dim > 0 ? hp->kv_v_dim : hp->head_dim;
    c->v_shares_k = hp->kv_v_shares_k;
    if (hp->kv_dsa) { /* sparse attention: the compact row (kv.h) — latent and indexer key as FP8 codes + scales */
        c->dsa_latent = hp->kv_v_dim;
        c->dsa_rope = hp->rotary_dim;
        c->dsa_key = hp->head_dim - hp->kv_v_dim - hp->rotary_dim;
        c->dsa_key_layers = hp->kv_dsa_key_layers; /* shared-indexer layers store no key */
    }
}

kiln_kv_dtype kiln_kv_pool_dtype(const struct kiln_model *m, kiln_kv_dtype asked, int *dsa_fp8) {
    kiln_kv_dtype dt = kiln_resolve_kv_dtype(m, asked);
    *dsa_fp8 = 0;
    /* DSA: the latent and the indexer key are FP8 codes + power-of-two scales per 128 whatever
     * --kv-dtype says (the model's own rounding, kept exactly: kv.h); --kv-dtype picks the rope part's
     * precision. fp8 asks for the FP8 layout SGLang and vLLM serve these models with, whose rope part
     * is bf16: a second FP8 rounding with one scale per layer would change values the model defines. */
    if (m->hp.kv_dsa && dt == KILN_KV_FP8) {
        dt = KILN_KV_BF16;
        *dsa_fp8 = 1;
    }
    return dt;
}

void kiln_kv_scales_default_path(const kiln_model *m, char *buf, size_t cap) {
    struct stat st;
    if (stat(m->path, &st) == 0 && S_ISDIR(st.st_mode)) { snprintf(buf, cap, "%s/kv_scales.json", m->path); return; }
    const char *sl = strrchr(m->path, '/');
    if (!sl) snprintf(buf, cap, "kv_scales.json");
    else snprintf(buf, cap, "%.*s/kv_scales.json", (int)(sl - m->path), m->path);
}

/* --kv-smooth prerope needs the plain Llama attention (the llama row of model/arch.h: RoPE over the whole head,
 * NORM or NEOX pairs, frequency theta^(-2i/head_dim)) and separate V rows. */
static kiln_status prerope_model_check(const struct kiln_model *m) {
    const kiln_hparams *hp = &m->hp;
    if (strcmp(hp->arch, "llama") != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--kv-smooth prerope (kv_smooth): model architecture '%s' is not supported; it needs "
                         "plain Llama RoPE over the whole head (no MLA, no partial rotary, no RoPE scaling)", hp->arch);
    if (hp->kv_v_shares_k)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--kv-smooth prerope (kv_smooth): not for caches whose V shares the K row (MLA)");
    if (hp->rotary_dim != hp->head_dim || hp->head_dim % 2 || hp->head_dim > 256)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--kv-smooth prerope (kv_smooth): needs RoPE over the whole head (rotary_dim = %d, head_dim = %d; "
                         "even head_dim up to 256)", hp->rotary_dim, hp->head_dim);
    return KILN_OK;
}

/* v ← R(pos)·v (inverse = 0) or R(pos)ᵀ·v (inverse = 1) over one head of kd values: the model's
 * rope_table / rope_apply (model/forward.c) with the same float formula. */
static void rope_head(const kiln_hparams *hp, int pos, int inverse, float *v) {
    const int kd = hp->head_dim, half = kd / 2;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf(hp->rope_theta, (float)(2 * i) / (float)kd);
        float val = (float)pos * freq, c = cosf(val), s = sinf(val);
        if (inverse) s = -s;
        int a = hp->rope_style == KILN_ROPE_NORM ? 2 * i : i, b = hp->rope_style == KILN_ROPE_NORM ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

kiln_status kiln_kv_measure_stats(kiln_model *m, const kiln_options *opts, const int32_t *tokens, size_t n, int window,
                                  float *kamax, float *vamax, float *kmean, float *kamax_c) {
    const int prerope = opts && opts->kv_smooth == KILN_KV_SMOOTH_PREROPE && kmean;
    if (prerope) KILN_TRY(prerope_model_check(m));
    kiln_kv_config c;
    memset(&c, 0, sizeof c);
    kiln_kv_layout_for_model(m, &c);
    int n_ctx = kiln_model_context(m, opts);
    if (window <= 0 || window > n_ctx) window = n_ctx;
    if ((size_t)window > n) window = (int)n;
    if (n == 0 || window < 1) return kiln_fail(KILN_ERR_INVALID_ARG, "kv calibration: no tokens");
    c.page_tokens = 16;
    c.dtype = KILN_KV_F32;
    c.mem_bytes = (int64_t)((window + 15) / 16) * (int64_t)kiln_kv_page_cost(&c);
    const size_t nlh = (size_t)c.n_layers * (size_t)c.n_kv_heads, nm = nlh * (size_t)c.k_dim;
    double *ksum = kmean ? calloc(nm, sizeof *ksum) : NULL;
    float *kmin = kmean ? malloc(nm * sizeof *kmin) : NULL, *kmax = kmean ? malloc(nm * sizeof *kmax) : NULL;
    if (kmean && (!ksum || !kmin || !kmax)) { free(ksum); free(kmin); free(kmax); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    for (size_t i = 0; kmean && i < nm; i++) { kmin[i] = INFINITY; kmax[i] = -INFINITY; }
    kiln_kv_pool *pool = NULL;
    kiln_kv_seq seq = {0};
    kiln_forward_ws ws;
    memset(&ws, 0, sizeof ws);
    const int chunk = 64;
    kiln_backend *be = NULL; /* the calibration pass computes on the options' backend, like a session */
    kiln_status st = kiln_backend_from_options(opts, &be);
    if (st == KILN_OK) kiln_be_kv_arrays(be, &c);
    if (st == KILN_OK) st = kiln_kv_pool_create(&c, &pool);
    if (st == KILN_OK) st = kiln_forward_ws_init(&ws, m, be, chunk, window);
    for (size_t i = 0; st == KILN_OK && i < n; i += (size_t)window) {
        int w = n - i < (size_t)window ? (int)(n - i) : window;
        st = kiln_kv_seq_reserve(pool, &seq, w);
        for (int j = 0; st == KILN_OK && j < w; j += chunk)
            st = kiln_forward(m, pool, &seq, &ws, tokens + i + j, w - j < chunk ? w - j : chunk, NULL);
        if (st == KILN_OK) kiln_kv_seq_amax(pool, &seq, w, kamax, c.v_shares_k ? NULL : vamax);
        if (st == KILN_OK && kmean && !prerope) kiln_kv_seq_kstats(pool, &seq, w, ksum, kmin, kmax);
        if (st == KILN_OK && prerope) /* pre-RoPE keys: the stored (rotated) rows turned back by R(t)ᵀ */
            for (int l = 0; l < c.n_layers; l++)
                for (int h = 0; h < c.n_kv_heads; h++)
                    for (int t = 0; t < w; t++) {
                        float row[256];
                        kiln_kv_read_row(pool, &seq, l, t, h, 0, row);
                        rope_head(&m->hp, t, 1, row);
                        double *ks = ksum + ((size_t)l * c.n_kv_heads + (size_t)h) * (size_t)c.k_dim;
                        for (int d = 0; d < c.k_dim; d++) ks[d] += row[d];
                    }
        kiln_kv_seq_release(pool, &seq);
    }
    /* Pre-RoPE: a second pass for the amax of the stored keys K − R(t)·mean (per (layer, head)). */
    if (st == KILN_OK && prerope) {
        for (size_t i = 0; i < nm; i++) kmean[i] = (float)(ksum[i] / (double)n);
        for (size_t lh = 0; kamax_c && lh < nlh; lh++) kamax_c[lh] = 0.0f;
        for (size_t i = 0; st == KILN_OK && i < n; i += (size_t)window) {
            int w = n - i < (size_t)window ? (int)(n - i) : window;
            st = kiln_kv_seq_reserve(pool, &seq, w);
            for (int j = 0; st == KILN_OK && j < w; j += chunk)
                st = kiln_forward(m, pool, &seq, &ws, tokens + i + j, w - j < chunk ? w - j : chunk, NULL);
            for (int l = 0; st == KILN_OK && kamax_c && l < c.n_layers; l++)
                for (int h = 0; h < c.n_kv_heads; h++) {
                    size_t lh = (size_t)l * c.n_kv_heads + (size_t)h;
                    for (int t = 0; t < w; t++) {
                        float row[256], mu[256];
                        kiln_kv_read_row(pool, &seq, l, t, h, 0, row);
                        memcpy(mu, kmean + lh * (size_t)c.k_dim, (size_t)c.k_dim * sizeof(float));
                        rope_head(&m->hp, t, 0, mu);
                        for (int d = 0; d < c.k_dim; d++) kamax_c[lh] = fmaxf(kamax_c[lh], fabsf(row[d] - mu[d]));
                    }
                }
            kiln_kv_seq_release(pool, &seq);
        }
    }
    if (st == KILN_OK && c.v_shares_k && vamax) memcpy(vamax, kamax, nlh * sizeof *vamax);
    if (st == KILN_OK && kmean && !prerope) {
        for (size_t lh = 0; lh < nlh; lh++) {
            float a = 0.0f;
            for (int d = 0; d < c.k_dim; d++) {
                size_t i = lh * (size_t)c.k_dim + (size_t)d;
                float mu = (float)(ksum[i] / (double)n);
                kmean[i] = mu;
                a = fmaxf(a, fmaxf(kmax[i] - mu, mu - kmin[i]));
            }
            if (kamax_c) kamax_c[lh] = a;
        }
    }
    free(ksum); free(kmin); free(kmax);
    free(seq.pages);
    kiln_forward_ws_free(&ws);
    kiln_kv_pool_free(pool);
    kiln_backend_free(be);
    return st;
}

kiln_status kiln_kv_measure_amax(kiln_model *m, const kiln_options *opts, const int32_t *tokens, size_t n, int window,
                                 float *kamax, float *vamax) {
    return kiln_kv_measure_stats(m, opts, tokens, n, window, kamax, vamax, NULL, NULL);
}

static void amax_to_scales(const float *amax, int n, float margin, float *out) {
    for (int i = 0; i < n; i++) out[i] = fmaxf(amax[i], 1e-6f) * margin / 448.0f;
}

kiln_status kiln_kv_scales_write(const kiln_model *m, const char *path, const float *kamax, const float *vamax,
                                 const float *kmean, const float *kamax_c, float margin, const char *source, uint64_t n_tokens) {
    return kiln_kv_scales_write_mode(m, path, kamax, vamax, kmean, kamax_c, margin, source, n_tokens, KILN_KV_SMOOTH_DEFAULT);
}

kiln_status kiln_kv_scales_write_mode(const kiln_model *m, const char *path, const float *kamax, const float *vamax,
                                      const float *kmean, const float *kamax_c, float margin, const char *source, uint64_t n_tokens,
                                      kiln_kv_smooth mode) {
    if (mode == KILN_KV_SMOOTH_PREROPE) KILN_TRY(prerope_model_check(m));
    if (!(margin >= 1.0f && margin <= 1000.0f)) return kiln_fail(KILN_ERR_INVALID_ARG, "calibrate: --margin %g is outside [1, 1000]", (double)margin);
    int n = m->hp.n_layers * m->hp.n_kv_heads;
    if (m->hp.kv_v_shares_k || !kamax_c) kmean = NULL; /* no smoothing for MLA latent rows */
    float *ks = malloc((size_t)n * sizeof *ks), *vs = malloc((size_t)n * sizeof *vs);
    if (!ks || !vs) { free(ks); free(vs); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    amax_to_scales(kmean ? kamax_c : kamax, n, margin, ks);
    amax_to_scales(vamax, n, margin, vs);
    kiln_status st = kiln_kv_scales_write_json_mode(path, m->hp.n_layers, m->hp.n_kv_heads, m->hp.head_dim, ks, vs, kmean, margin, source,
                                                    n_tokens, kmean && mode == KILN_KV_SMOOTH_PREROPE);
    free(ks);
    free(vs);
    return st;
}

/* Built-in calibration tokens: the text above through the model's tokenizer, or a fixed
 * pseudo-random sequence (splitmix64) for models without one. */
static int calib_tokens(kiln_model *m, int n_ctx, int32_t **out) {
    int cap = KILN_KV_CALIB_TOKENS < n_ctx ? KILN_KV_CALIB_TOKENS : n_ctx;
    int32_t *t = malloc(sizeof builtin_text * sizeof *t + 64);
    if (!t) return 0;
    size_t n = 0;
    if (!m->tok || kiln_tokenize(m, builtin_text, sizeof builtin_text - 1, 1, t, sizeof builtin_text, &n) != KILN_OK || n < 16) {
        uint64_t x = 0x243F6A8885A308D3ull;
        n = 0;
        if (m->hp.bos_id >= 0 && m->hp.bos_id < m->hp.vocab) t[n++] = m->hp.bos_id;
        while (n < (size_t)cap) {
            uint64_t z = (x += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            t[n++] = (int32_t)((z ^ (z >> 31)) % (uint64_t)m->hp.vocab);
        }
    }
    *out = t;
    return (int)(n < (size_t)cap ? n : (size_t)cap);
}

static kiln_status setup_scales(struct kiln_model *m, const kiln_options *o, int n_ctx, int run_cal, kiln_kv_setup *su);

/* A kv_scales.json into su; its K smoothing mode ("k_smooth") must match the session's kv_smooth:
 * prerope needs a prerope file, post / no-means files serve the default, off takes no means. */
static kiln_status read_file_mode(const char *path, const kiln_options *o, kiln_kv_config *c, kiln_kv_setup *su, int *has_mean) {
    int file_pre = 0;
    KILN_TRY(kiln_kv_scales_read_json_mode(path, c->n_layers, c->n_kv_heads, c->k_dim, c->v_shares_k, su->k_scale, su->v_scale,
                                           su->k_mean, has_mean, &file_pre));
    const char *fmode = !*has_mean ? "none (no k_mean)" : file_pre ? "prerope" : "post";
    if (o->kv_smooth == KILN_KV_SMOOTH_PREROPE && !file_pre)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: field 'k_smooth' = %s does not match --kv-smooth prerope; "
                         "run `kiln calibrate --kv-smooth prerope`", path, fmode);
    if (o->kv_smooth != KILN_KV_SMOOTH_PREROPE && file_pre)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: field 'k_smooth' = prerope does not match --kv-smooth %s (pass --kv-smooth prerope "
                         "or recalibrate)", path, o->kv_smooth == KILN_KV_SMOOTH_OFF ? "off" : "post (the default)");
    if (o->kv_smooth == KILN_KV_SMOOTH_OFF && *has_mean)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: field 'k_smooth' = post (its k_scale applies to K - k_mean) does not match "
                         "--kv-smooth off; run `kiln calibrate --no-smooth`", path);
    if (*has_mean) c->k_mean = su->k_mean;
    return KILN_OK;
}

int64_t kiln_kv_default_budget(const kiln_kv_config *c, int64_t want, int *capped) {
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    int64_t floor_bytes = (int64_t)kiln_kv_pool_fixed_bytes(c) + (int64_t)kiln_kv_page_cost(c);
    *capped = 0;
    if (pages > 0 && psz > 0) {
        int64_t cap = (int64_t)pages / 4 * (int64_t)psz;
        if (want > cap) { want = cap; *capped = 1; }
    }
    return want > floor_bytes ? want : floor_bytes;
}

kiln_status kiln_kv_setup_for_model(struct kiln_model *m, const kiln_options *o, int n_ctx, int run_cal, kiln_kv_setup *su) {
    KILN_TRY(setup_scales(m, o, n_ctx, run_cal, su));
    kiln_kv_config *c = &su->cfg;
    if (c->mem_bytes <= 0) { /* one full context; computed last: the pool's fixed bytes depend on the scales */
        int64_t pages = ((int64_t)n_ctx + c->page_tokens - 1) / c->page_tokens;
        c->mem_bytes = kiln_kv_default_budget(c, (int64_t)kiln_kv_pool_fixed_bytes(c) + pages * (int64_t)kiln_kv_page_cost(c),
                                              &su->budget_capped);
    }
    return KILN_OK;
}

static kiln_status setup_scales(struct kiln_model *m, const kiln_options *o, int n_ctx, int run_cal, kiln_kv_setup *su) {
    memset(su, 0, sizeof *su);
    kiln_kv_config *c = &su->cfg;
    kiln_kv_layout_for_model(m, c);
    c->page_tokens = o->kv_page_tokens > 0 ? o->kv_page_tokens : 16;
    c->dtype = kiln_kv_pool_dtype(m, o->kv_dtype, &su->dsa_fp8_asked);
    c->scale_mode = o->kv_scale_mode;
    c->mem_bytes = o->kv_mem_bytes;
    KILN_TRY(kiln_kv_config_check(c));
    const int pre = o->kv_smooth == KILN_KV_SMOOTH_PREROPE, off = o->kv_smooth == KILN_KV_SMOOTH_OFF;
    if (o->kv_smooth < KILN_KV_SMOOTH_DEFAULT || o->kv_smooth > KILN_KV_SMOOTH_OFF)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth (kv_smooth): %d is not post, prerope or off", (int)o->kv_smooth);
    if (pre) {
        KILN_TRY(prerope_model_check(m));
        if (c->dtype != KILN_KV_FP8)
            return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth prerope (kv_smooth): applies to FP8 KV only (--kv-dtype fp8), not %s",
                             c->dtype == KILN_KV_F32 ? "f32" : "bf16");
        if (c->scale_mode == KILN_KV_SCALE_DYNAMIC)
            return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth prerope (kv_smooth): needs static FP8 scales (the means come from "
                             "calibration), not --kv-scale dynamic");
        c->k_prerope = 1;
        c->rope_theta = m->hp.rope_theta;
        c->rope_norm = m->hp.rope_style == KILN_ROPE_NORM;
        c->rope_positions = n_ctx;
    }
    if (c->dtype != KILN_KV_FP8) {
        snprintf(su->source, sizeof su->source, "none (%s storage needs no scales)", c->dtype == KILN_KV_F32 ? "f32" : "bf16");
        return KILN_OK;
    }
    if (c->scale_mode == KILN_KV_SCALE_DYNAMIC) {
        snprintf(su->source, sizeof su->source, "dynamic: one scale per (page, layer, KV head) = running amax / 448 of the page's rows");
        return KILN_OK;
    }
    const int L = c->n_layers, H = c->n_kv_heads;
    su->k_scale = malloc((size_t)L * H * sizeof(float));
    su->v_scale = malloc((size_t)L * H * sizeof(float));
    if (!su->k_scale || !su->v_scale) { kiln_kv_setup_free(su); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    c->k_scale = su->k_scale;
    c->v_scale = su->v_scale;
    kiln_status st;
    int has_mean = 0;
    su->k_mean = c->v_shares_k ? NULL : malloc((size_t)L * H * (size_t)c->k_dim * sizeof(float));
    if (!c->v_shares_k && !su->k_mean) { kiln_kv_setup_free(su); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    const char *smooth_txt = pre ? "; pre-RoPE K smoothing" : "; K smoothing";
    if (o->kv_scales_path) {
        st = read_file_mode(o->kv_scales_path, o, c, su, &has_mean);
        if (st != KILN_OK) { kiln_kv_setup_free(su); return st; }
        snprintf(su->source, sizeof su->source, "%.400s (--kv-scales%s)", o->kv_scales_path, has_mean ? smooth_txt : "");
        return KILN_OK;
    }
    int found = 0;
    st = kiln_kv_scales_from_checkpoint(&m->tt, m->path, L, H, c->v_shares_k, su->k_scale, su->v_scale, &found);
    if (st != KILN_OK) { kiln_kv_setup_free(su); return st; }
    if (found && pre) {
        kiln_kv_setup_free(su);
        return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth prerope (kv_smooth): the checkpoint carries its own k_scale / v_scale "
                         "(vLLM convention, no key means); pass a kv_scales.json from `kiln calibrate --kv-smooth prerope` with --kv-scales");
    }
    if (found) {
        free(su->k_mean);
        su->k_mean = NULL;
        snprintf(su->source, sizeof su->source, "checkpoint (model.layers.N.self_attn.k_scale%s)", c->v_shares_k ? "" : " / v_scale");
        return KILN_OK;
    }
    char path[4300];
    kiln_kv_scales_default_path(m, path, sizeof path);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        st = read_file_mode(path, o, c, su, &has_mean);
        if (st != KILN_OK) { kiln_kv_setup_free(su); return st; }
        snprintf(su->source, sizeof su->source, "%.400s (kiln calibrate%s)", path, has_mean ? smooth_txt : "");
        return KILN_OK;
    }
    if (off) { free(su->k_mean); su->k_mean = NULL; } /* --kv-smooth off: calibrate without means */
    int32_t *toks = NULL;
    int nt = calib_tokens(m, n_ctx, &toks);
    if (nt < 1) { free(toks); kiln_kv_setup_free(su); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    const char *what = m->tok ? "a built-in English text" : "a fixed pseudo-random token sequence (no tokenizer)";
    if (!run_cal) {
        /* plan only: no scales yet, but the pool arithmetic counts the K means calibration will add */
        free(toks);
        free(su->k_scale); free(su->v_scale);
        su->k_scale = su->v_scale = NULL;
        c->k_scale = c->v_scale = NULL;
        if (su->k_mean) c->k_mean = su->k_mean;
        snprintf(su->source, sizeof su->source, "built-in calibration at session start (%d tokens of %s, margin %g); "
                 "run `kiln calibrate` to write kv_scales.json", nt, what, (double)KILN_KV_MARGIN);
        return KILN_OK;
    }
    float *ka = calloc((size_t)L * H, sizeof *ka), *va = calloc((size_t)L * H, sizeof *va), *kc = calloc((size_t)L * H, sizeof *kc);
    st = ka && va && kc ? kiln_kv_measure_stats(m, o, toks, (size_t)nt, nt, ka, va, su->k_mean, kc) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (st == KILN_OK) {
        if (su->k_mean) c->k_mean = su->k_mean;
        amax_to_scales(su->k_mean ? kc : ka, L * H, KILN_KV_MARGIN, su->k_scale);
        amax_to_scales(va, L * H, KILN_KV_MARGIN, su->v_scale);
        su->calib_tokens = nt;
        snprintf(su->source, sizeof su->source, "built-in calibration (%d tokens of %s, margin %g%s); run `kiln calibrate` to write kv_scales.json",
                 nt, what, (double)KILN_KV_MARGIN, su->k_mean ? (pre ? ", pre-RoPE K smoothing" : ", K smoothing") : "");
    }
    free(ka); free(va); free(kc); free(toks);
    if (st != KILN_OK) kiln_kv_setup_free(su);
    return st;
}

void kiln_kv_setup_free(kiln_kv_setup *s) {
    free(s->k_scale);
    free(s->v_scale);
    free(s->k_mean);
    s->k_scale = s->v_scale = s->k_mean = NULL;
    s->cfg.k_scale = s->cfg.v_scale = s->cfg.k_mean = NULL;
}
