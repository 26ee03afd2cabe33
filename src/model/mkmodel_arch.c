/* mkmodel_arch.c — synthetic checkpoints for the GLM / DeepSeek / Kimi architectures
 * (`kiln mkmodel --arch chatglm|glm4|glm4_moe|deepseek_v3|kimi_k2|glm4_moe_lite|deepseek_v32|glm_moe_dsa --preset ...`).
 *
 * Writes config.json with the fields of the official configs and model.safetensors with the
 * official tensor names, deterministic uniform weights (std 1/sqrt(fan_in) for matrices, 1 ± 0.1
 * for norms, ±0.1 for biases, [0, 0.2] for the router correction bias), no tokenizer.
 * Presets:
 *   tiny         every architecture: runs in milliseconds (tests). MoE presets use 16 experts in
 *                4 groups with topk_group 2 where the family routes by groups (glm4_moe,
 *                deepseek_v3), so group-limited selection is exercised; kimi_k2 tiny keeps the real
 *                latent geometry (kv_lora_rank 512 + qk_rope_head_dim 64) for KV-size checks.
 *   glm47-flash  glm4_moe_lite with GLM-4.7-Flash's per-layer shapes (hidden 2048, 20 heads, MLA
 *                768/512/192/64/256, 64 experts top-4 of 1536), 2 layers (1 dense + 1 MoE), vocab 4096.
 *   kimi-k2      kimi_k2 with Kimi K2's per-layer shapes (hidden 7168, 64 heads, MLA 1536/512/128/64/128,
 *                experts of 2048, top-8) but 16 experts and 2 layers (1 dense + 1 MoE), vocab 4096.
 *   tiny (deepseek_v32, glm_moe_dsa)  sparse attention with index_topk 16, 16 indexer heads of 128;
 *   tiny-shared  glm_moe_dsa with 4 layers, indexer_types full, shared, shared, full (GLM-5.2's
 *                cross-layer sharing).
 *   glm52        glm_moe_dsa with GLM-5's per-layer shapes (hidden 6144, 64 heads, MLA 2048/512/192/64/256,
 *                indexer 32 × 128 top-2048, experts of 2048 top-8) but 16 experts, 2 layers, vocab 4096.
 * Shape keys from the command line override the preset: dim, layers, heads, kv-heads, head-dim,
 * ffn, vocab, seq, and mtp (num_nextn_predict_layers; glm4_moe and the MLA family). */
#include "model/arch.h"
#include "base/fp.h"
#include "base/status.h"
#include "format/safetensors.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct ashape {
    const char *arch, *preset;
    int dim, layers, heads, kv_heads, head_dim, ffn, vocab, seq;
    double partial, theta;
    int attn_bias, qk_norm;
    int q_lora, kv_lora, nope, rope, v;                                  /* MLA */
    int experts, used, shared, moe_ffn, first_dense, n_group, topk_group, nextn;
    double routed_scale;
    double yarn_factor, beta_fast, beta_slow, mscale, mscale_all_dim;   /* yarn_factor 0 = none */
    int orig_ctx;
    int idx_heads, idx_dim, idx_topk; /* DSA (deepseek_v32, glm_moe_dsa) */
    const char *idx_pattern;          /* glm_moe_dsa indexer_types as F/S letters, NULL = every layer full */
} ashape;

static const ashape presets[] = {
    /* arch, preset, dim, L, H, KV, hd, ffn, vocab, seq, partial, theta, bias, qknorm,
       q_lora, kv_lora, nope, rope, v, E, k, shared, moe_ffn, first_dense, n_group, topk_group, nextn, rsf,
       yarn factor, beta_fast, beta_slow, mscale, mscale_all_dim, orig_ctx, idx_heads, idx_dim, idx_topk, idx_pattern */
    {"chatglm", "tiny", 64, 2, 4, 2, 32, 96, 256, 256, 0.5, 5000000, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL},
    {"glm4", "tiny", 64, 2, 4, 2, 32, 96, 256, 256, 0.5, 10000, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL},
    {"glm4_moe", "tiny", 64, 3, 4, 2, 32, 128, 256, 256, 0.5, 10000, 1, 1, 0, 0, 0, 0, 0, 16, 4, 1, 32, 1, 4, 2, 1, 2.5, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL},
    {"deepseek_v3", "tiny", 64, 3, 4, 4, 0, 128, 256, 256, 1.0, 10000, 0, 0, 0, 32, 16, 8, 16, 16, 4, 1, 32, 1, 4, 2, 1, 2.5, 40, 32, 1,
     1.0, 0.8, 4096, 0, 0, 0, NULL},
    {"kimi_k2", "tiny", 64, 3, 4, 4, 0, 128, 256, 256, 1.0, 50000, 0, 0, 32, 512, 32, 64, 32, 8, 4, 1, 32, 1, 1, 1, 0, 2.827, 32, 1, 1,
     1.0, 1.0, 4096, 0, 0, 0, NULL},
    {"glm4_moe_lite", "tiny", 64, 3, 4, 4, 0, 128, 256, 256, 1.0, 1000000, 0, 0, 32, 32, 24, 8, 32, 16, 4, 1, 32, 1, 1, 1, 1, 1.8, 0,
     0, 0, 0, 0, 0, 0, 0, 0, NULL},
    {"glm4_moe_lite", "glm47-flash", 2048, 2, 20, 20, 0, 10240, 4096, 4096, 1.0, 1000000, 0, 0, 768, 512, 192, 64, 256, 64, 4, 1, 1536, 1,
     1, 1, 0, 1.8, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL},
    /* DSA: index_topk 16 so that a 64-token prompt selects a strict subset; 16 indexer heads so that
     * an all-ReLU-zero score (a tie) is rare (2^-16 per position) */
    {"deepseek_v32", "tiny", 64, 3, 4, 4, 0, 128, 256, 256, 1.0, 10000, 0, 0, 32, 128, 16, 16, 16, 16, 4, 1, 32, 1, 4, 2, 1, 2.5, 40, 32, 1,
     1.0, 1.0, 4096, 16, 128, 16, NULL}, /* mscale = mscale_all_dim = 1 as the released config */
    {"glm_moe_dsa", "tiny", 64, 3, 4, 4, 0, 128, 256, 256, 1.0, 1000000, 0, 0, 32, 128, 24, 16, 32, 16, 4, 1, 32, 1, 1, 1, 1, 2.5, 0,
     0, 0, 0, 0, 0, 16, 128, 16, NULL},
    {"glm_moe_dsa", "tiny-shared", 64, 4, 4, 4, 0, 128, 256, 256, 1.0, 1000000, 0, 0, 32, 128, 24, 16, 32, 16, 4, 1, 32, 1, 1, 1, 1, 2.5, 0,
     0, 0, 0, 0, 0, 16, 128, 16, "FSSF"},
    {"glm_moe_dsa", "glm52", 6144, 2, 64, 64, 0, 12288, 4096, 4096, 1.0, 1000000, 0, 0, 2048, 512, 192, 64, 256, 16, 8, 1, 2048, 1, 1, 1, 0,
     2.5, 0, 0, 0, 0, 0, 0, 32, 128, 2048, NULL},
    {"kimi_k2", "kimi-k2", 7168, 2, 64, 64, 0, 18432, 4096, 4096, 1.0, 50000, 0, 0, 1536, 512, 128, 64, 128, 16, 8, 1, 2048, 1, 1, 1, 0,
     2.827, 32, 1, 1, 1.0, 1.0, 4096, 0, 0, 0, NULL},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

static int is_dsa(const char *a) { return !strcmp(a, "deepseek_v32") || !strcmp(a, "glm_moe_dsa"); }
static int is_mla(const char *a) { return !strcmp(a, "deepseek_v3") || !strcmp(a, "kimi_k2") || !strcmp(a, "glm4_moe_lite") || is_dsa(a); }
static int is_moe(const char *a) { return is_mla(a) || !strcmp(a, "glm4_moe"); }

static kiln_status parse(const char *arch, const char *spec, ashape *s) {
    memset(s, 0, sizeof *s);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    int have = 0;
    /* the preset first, then overrides in any order */
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strncmp(tok, "preset=", 7) != 0) continue;
        for (int i = 0; i < N_PRESETS; i++)
            if (!strcmp(presets[i].arch, arch) && !strcmp(presets[i].preset, tok + 7)) { *s = presets[i]; have = 1; }
        if (!have) {
            char known[256] = "";
            for (int i = 0; i < N_PRESETS; i++)
                if (!strcmp(presets[i].arch, arch)) {
                    size_t l = strlen(known);
                    snprintf(known + l, sizeof known - l, "%s%s", l ? ", " : "", presets[i].preset);
                }
            return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --arch %s has no preset '%s' (known: %s)", arch, tok + 7, known);
        }
    }
    if (!have) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --arch %s needs --preset (e.g. tiny), optionally with shape overrides", arch);
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: '%s' is not key=value", tok);
        *eq = 0;
        if (!strcmp(tok, "preset")) continue;
        char *end;
        long x = strtol(eq + 1, &end, 10);
        if (*end || end == eq + 1 || x <= 0 || x > (1 << 24))
            return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --%s '%s' is not a positive integer", tok, eq + 1);
        if (!strcmp(tok, "dim")) s->dim = (int)x;
        else if (!strcmp(tok, "layers")) s->layers = (int)x;
        else if (!strcmp(tok, "heads")) s->heads = (int)x;
        else if (!strcmp(tok, "kv-heads")) s->kv_heads = (int)x;
        else if (!strcmp(tok, "head-dim")) s->head_dim = (int)x;
        else if (!strcmp(tok, "ffn")) s->ffn = (int)x;
        else if (!strcmp(tok, "vocab")) s->vocab = (int)x;
        else if (!strcmp(tok, "seq")) s->seq = (int)x;
        else if (!strcmp(tok, "mtp")) { /* num_nextn_predict_layers: MTP layers after the decoder (speculative decoding) */
            if (!is_mla(arch) && strcmp(arch, "glm4_moe"))
                return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --arch %s has no MTP layers (mtp=%ld: glm4_moe and the MLA family have)", arch, x);
            if (x > 4) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: mtp=%ld: at most 4 MTP layers", x);
            s->nextn = (int)x;
        }
        else return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: unknown shape key '%s'", tok);
    }
    if (!is_mla(arch) && (s->heads % s->kv_heads || s->head_dim % 4))
        return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: heads %d must be a multiple of kv-heads %d and head-dim %d of 4", s->heads, s->kv_heads,
                         s->head_dim);
    if (is_moe(arch) && s->first_dense > s->layers) s->first_dense = s->layers;
    return KILN_OK;
}

/* ---- tensor list -------------------------------------------------------------------------------- */

typedef struct tlist {
    kiln_tensor *v;
    int n, cap;
    kiln_dtype dt;
    uint64_t seed;
    kiln_status st;
} tlist;

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Adds a [r] (c == 0) or [r, c] tensor of uniform values with mean `base` and std `std`. F32
 * tensors are stored as F32 whatever the model dtype when force_f32 is set. */
static void add_t(tlist *t, const char *name, int64_t r, int64_t c, double std, double base, int force_f32) {
    if (t->st != KILN_OK) return;
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 256;
        kiln_tensor *v = realloc(t->v, (size_t)cap * sizeof *v);
        if (!v) { t->st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); return; }
        t->v = v;
        t->cap = cap;
    }
    kiln_dtype dt = force_f32 ? KILN_DT_F32 : t->dt;
    uint64_t n = (uint64_t)r * (uint64_t)(c ? c : 1);
    size_t es = dt == KILN_DT_F32 ? 4 : 2;
    uint8_t *d = malloc(n * es);
    char *nm = strdup(name);
    if (!d || !nm) { free(d); free(nm); t->st = kiln_fail(KILN_ERR_NOMEM, "out of memory for tensor '%s'", name); return; }
    uint64_t rs = t->seed * 0x100000001B3ull + (uint64_t)t->n * 0x9E3779B97F4A7C15ull;
    float a = (float)(std * 1.7320508);
    for (uint64_t i = 0; i < n; i++) {
        float u = 2.0f * (float)(splitmix(&rs) >> 40) / 16777216.0f - 1.0f;
        float x = (float)base + a * u;
        if (es == 4) memcpy(d + 4 * i, &x, 4);
        else { uint16_t h = kiln_f32_to_bf16(x); memcpy(d + 2 * i, &h, 2); }
    }
    kiln_tensor *T = &t->v[t->n++];
    memset(T, 0, sizeof *T);
    T->name = nm;
    T->dtype = dt;
    T->ndim = c ? 2 : 1;
    T->shape[0] = r;
    T->shape[1] = c;
    T->data = d;
    T->nbytes = n * es;
}

static void tlist_free(tlist *t) {
    for (int i = 0; i < t->n; i++) { free(t->v[i].name); free((void *)t->v[i].data); }
    free(t->v);
}

#define W(nm, r, c) add_t(t, nm, r, c, 1.0 / sqrt((double)(c)), 0.0, 0)
#define NORM(nm, r) add_t(t, nm, r, 0, 0.1, 1.0, 0)
#define BIAS(nm, r) add_t(t, nm, r, 0, 0.1, 0.0, 0)

/* A SwiGLU MLP of width ffn at `p` ("model.layers.3.mlp.", "...mlp.experts.5.", "...mlp.shared_experts."):
 * gate_proj [ffn, dim], up_proj [ffn, dim], down_proj [dim, ffn]. */
static void add_swiglu(tlist *t, const char *p, int ffn, int dim) {
    char n[192];
    snprintf(n, sizeof n, "%sgate_proj.weight", p);
    W(n, ffn, dim);
    snprintf(n, sizeof n, "%sup_proj.weight", p);
    W(n, ffn, dim);
    snprintf(n, sizeof n, "%sdown_proj.weight", p);
    W(n, dim, ffn);
}

static void add_moe(tlist *t, const ashape *s, const char *p) {
    char n[128];
    snprintf(n, sizeof n, "%sgate.weight", p);
    W(n, s->experts, s->dim);
    snprintf(n, sizeof n, "%sgate.e_score_correction_bias", p);
    add_t(t, n, s->experts, 0, 0.1 / 1.7320508, 0.1, 1); /* uniform [0, 0.2], float32 as released */
    for (int e = 0; e < s->experts; e++) {
        snprintf(n, sizeof n, "%sexperts.%d.", p, e);
        add_swiglu(t, n, s->moe_ffn, s->dim);
    }
    if (s->shared) {
        snprintf(n, sizeof n, "%sshared_experts.", p);
        add_swiglu(t, n, s->moe_ffn * s->shared, s->dim);
    }
}

/* Layer l's feed-forward block: MoE or dense SwiGLU at model.layers.<l>.mlp. */
static void add_ffn(tlist *t, const ashape *s, int l, int moe) {
    char n[64];
    snprintf(n, sizeof n, "model.layers.%d.mlp.", l);
    if (moe) add_moe(t, s, n);
    else add_swiglu(t, n, s->ffn, s->dim);
}

/* Llama-named q/k/v projections of layer l, with their biases when attn_bias is set. */
static void add_qkv(tlist *t, const ashape *s, int l) {
    const int qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    char n[192];
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    W(P("self_attn.q_proj.weight"), qd, s->dim);
    W(P("self_attn.k_proj.weight"), kvd, s->dim);
    W(P("self_attn.v_proj.weight"), kvd, s->dim);
    if (s->attn_bias) {
        BIAS(P("self_attn.q_proj.bias"), qd);
        BIAS(P("self_attn.k_proj.bias"), kvd);
        BIAS(P("self_attn.v_proj.bias"), kvd);
    }
#undef P
}

/* MTP (next-n) block l: the extra projections around a full decoder layer (written by the callers). */
static void add_mtp_extras(tlist *t, const ashape *s, int l, int with_head) {
    char n[192];
#define M(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    NORM(M("enorm.weight"), s->dim);
    NORM(M("hnorm.weight"), s->dim);
    W(M("eh_proj.weight"), s->dim, 2 * s->dim);
    NORM(M("shared_head.norm.weight"), s->dim);
    if (with_head) {
        add_t(t, M("embed_tokens.weight"), s->vocab, s->dim, 1.0, 0.0, 0);
        W(M("shared_head.head.weight"), s->vocab, s->dim);
    }
#undef M
}

/* chatglm's remote-code layout (all of its tensors). */
static void tensors_chatglm(tlist *t, const ashape *s) {
    const int qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    char n[192];
    add_t(t, "transformer.embedding.word_embeddings.weight", s->vocab, s->dim, 1.0, 0.0, 0);
    /* the remote code's RotaryEmbedding buffer (persistent): loaders ignore it */
    int rot = s->head_dim / 2;
    float *f = NULL;
    add_t(t, "transformer.rotary_pos_emb.inv_freq", rot / 2, 0, 0.0, 0.0, 1);
    if (t->st == KILN_OK) {
        f = (float *)t->v[t->n - 1].data;
        for (int i = 0; i < rot / 2; i++) f[i] = 1.0f / powf((float)s->theta, (float)(2 * i) / (float)rot);
    }
    for (int l = 0; l < s->layers; l++) {
#define P(fmt) (snprintf(n, sizeof n, "transformer.encoder.layers.%d." fmt, l), n)
        NORM(P("input_layernorm.weight"), s->dim);
        W(P("self_attention.query_key_value.weight"), qd + 2 * kvd, s->dim);
        BIAS(P("self_attention.query_key_value.bias"), qd + 2 * kvd);
        W(P("self_attention.dense.weight"), s->dim, qd);
        NORM(P("post_attention_layernorm.weight"), s->dim);
        W(P("mlp.dense_h_to_4h.weight"), 2 * s->ffn, s->dim);
        W(P("mlp.dense_4h_to_h.weight"), s->dim, s->ffn);
#undef P
    }
    NORM("transformer.encoder.final_layernorm.weight", s->dim);
    W("transformer.output_layer.weight", s->vocab, s->dim);
}

static void layer_glm4(tlist *t, const ashape *s, int l, int moe) {
    const int qd = s->heads * s->head_dim;
    char n[192];
    (void)moe;
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    NORM(P("input_layernorm.weight"), s->dim);
    add_qkv(t, s, l);
    W(P("self_attn.o_proj.weight"), s->dim, qd);
    NORM(P("post_self_attn_layernorm.weight"), s->dim);
    NORM(P("post_attention_layernorm.weight"), s->dim);
    W(P("mlp.gate_up_proj.weight"), 2 * s->ffn, s->dim);
    W(P("mlp.down_proj.weight"), s->dim, s->ffn);
    NORM(P("post_mlp_layernorm.weight"), s->dim);
#undef P
}

static void layer_glm4_moe(tlist *t, const ashape *s, int l, int moe) {
    const int qd = s->heads * s->head_dim;
    char n[192];
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    NORM(P("input_layernorm.weight"), s->dim);
    add_qkv(t, s, l);
    if (s->qk_norm) {
        NORM(P("self_attn.q_norm.weight"), s->head_dim);
        NORM(P("self_attn.k_norm.weight"), s->head_dim);
    }
    W(P("self_attn.o_proj.weight"), s->dim, qd);
    NORM(P("post_attention_layernorm.weight"), s->dim);
    add_ffn(t, s, l, moe);
#undef P
}

static void layer_mla(tlist *t, const ashape *s, int l, int moe) {
    const int H = s->heads, qh = s->nope + s->rope;
    char n[192];
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    NORM(P("input_layernorm.weight"), s->dim);
    if (s->q_lora) {
        W(P("self_attn.q_a_proj.weight"), s->q_lora, s->dim);
        NORM(P("self_attn.q_a_layernorm.weight"), s->q_lora);
        W(P("self_attn.q_b_proj.weight"), H * qh, s->q_lora);
    } else {
        W(P("self_attn.q_proj.weight"), H * qh, s->dim);
    }
    W(P("self_attn.kv_a_proj_with_mqa.weight"), s->kv_lora + s->rope, s->dim);
    NORM(P("self_attn.kv_a_layernorm.weight"), s->kv_lora);
    W(P("self_attn.kv_b_proj.weight"), H * (s->nope + s->v), s->kv_lora);
    W(P("self_attn.o_proj.weight"), s->dim, H * s->v);
    /* DSA: the indexer of a "full" layer (MTP layers past the pattern have one too) */
    if (s->idx_heads && (!s->idx_pattern || l >= (int)strlen(s->idx_pattern) || s->idx_pattern[l] == 'F')) {
        W(P("self_attn.indexer.wq_b.weight"), s->idx_heads * s->idx_dim, s->q_lora);
        W(P("self_attn.indexer.wk.weight"), s->idx_dim, s->dim);
        NORM(P("self_attn.indexer.k_norm.weight"), s->idx_dim);
        BIAS(P("self_attn.indexer.k_norm.bias"), s->idx_dim);
        W(P("self_attn.indexer.weights_proj.weight"), s->idx_heads, s->dim);
    }
    NORM(P("post_attention_layernorm.weight"), s->dim);
    add_ffn(t, s, l, moe);
#undef P
}

/* ---- config.json ---------------------------------------------------------------------------------- */

static json_t *jarch(const char *a) {
    json_t *v = json_array();
    json_array_append_new(v, json_string(a));
    return v;
}
#define SI(k, v) json_object_set_new(c, k, json_integer(v))
#define SR(k, v) json_object_set_new(c, k, json_real(v))
#define SS(k, v) json_object_set_new(c, k, json_string(v))
#define SB(k, v) json_object_set_new(c, k, json_boolean(v))

static void moe_fields(json_t *c, const ashape *s) {
    SI("n_routed_experts", s->experts);
    SI("num_experts_per_tok", s->used);
    SI("n_shared_experts", s->shared);
    SI("moe_intermediate_size", s->moe_ffn);
    SI("first_k_dense_replace", s->first_dense);
    SI("n_group", s->n_group);
    SI("topk_group", s->topk_group);
    SB("norm_topk_prob", 1);
    SR("routed_scaling_factor", s->routed_scale);
    SI("num_nextn_predict_layers", s->nextn);
}

static json_t *config(const ashape *s, const char *dtype) {
    json_t *c = json_object();
    const char *a = s->arch;
    if (!strcmp(a, "chatglm")) {
        json_object_set_new(c, "architectures", jarch("ChatGLMModel"));
        SS("model_type", "chatglm");
        SB("add_bias_linear", 0);
        SB("add_qkv_bias", 1);
        SB("apply_query_key_layer_scaling", 1);
        SB("apply_residual_connection_post_layernorm", 0);
        SR("attention_dropout", 0.0);
        SB("attention_softmax_in_fp32", 1);
        SI("ffn_hidden_size", s->ffn);
        SB("fp32_residual_connection", 0);
        SR("hidden_dropout", 0.0);
        SI("hidden_size", s->dim);
        SI("kv_channels", s->head_dim);
        SR("layernorm_epsilon", 1.5625e-07);
        SB("multi_query_attention", 1);
        SI("multi_query_group_num", s->kv_heads);
        SI("num_attention_heads", s->heads);
        SI("num_hidden_layers", s->layers);
        SI("num_layers", s->layers);
        SR("rope_ratio", s->theta / 10000.0);
        SB("original_rope", 1);
        SI("padded_vocab_size", s->vocab);
        SB("post_layer_norm", 1);
        SB("rmsnorm", 1);
        SI("seq_length", s->seq);
        SB("tie_word_embeddings", 0);
    } else {
        SS("hidden_act", "silu");
        SI("hidden_size", s->dim);
        SI("intermediate_size", s->ffn);
        SI("num_hidden_layers", s->layers);
        SI("num_attention_heads", s->heads);
        SI("num_key_value_heads", s->kv_heads);
        SI("vocab_size", s->vocab);
        SI("max_position_embeddings", s->seq);
        SB("tie_word_embeddings", 0);
        SR("attention_dropout", 0.0);
        if (!strcmp(a, "glm4") || !strcmp(a, "glm4_moe")) {
            const int moe = !strcmp(a, "glm4_moe");
            json_object_set_new(c, "architectures", jarch(moe ? "Glm4MoeForCausalLM" : "Glm4ForCausalLM"));
            SS("model_type", a);
            SI("head_dim", s->head_dim);
            SB("attention_bias", s->attn_bias);
            if (moe) SB("use_qk_norm", s->qk_norm);
            SR("partial_rotary_factor", s->partial);
            SR("rms_norm_eps", 1e-05);
            SR("rope_theta", s->theta);
            if (moe) {
                json_object_set_new(c, "rope_scaling", json_null());
                moe_fields(c, s);
            }
        } else { /* MLA */
            /* glm4_moe_lite and glm_moe_dsa: GLM's config style (rope_parameters, eps 1e-5) */
            int lite = !strcmp(a, "glm4_moe_lite") || !strcmp(a, "glm_moe_dsa");
            json_object_set_new(c, "architectures", jarch(!strcmp(a, "glm_moe_dsa")    ? "GlmMoeDsaForCausalLM"
                                                          : !strcmp(a, "deepseek_v32") ? "DeepseekV32ForCausalLM"
                                                          : lite                       ? "Glm4MoeLiteForCausalLM"
                                                                                       : "DeepseekV3ForCausalLM"));
            SS("model_type", a);
            SB("attention_bias", 0);
            if (s->q_lora) SI("q_lora_rank", s->q_lora);
            else json_object_set_new(c, "q_lora_rank", json_null());
            SI("kv_lora_rank", s->kv_lora);
            SI("qk_nope_head_dim", s->nope);
            SI("qk_rope_head_dim", s->rope);
            SI("v_head_dim", s->v);
            SR("rms_norm_eps", lite ? 1e-05 : 1e-06);
            moe_fields(c, s);
            SS("scoring_func", "sigmoid");
            SS("topk_method", "noaux_tc");
            SI("moe_layer_freq", 1);
            if (lite) {
                json_t *rp = json_object();
                json_object_set_new(rp, "rope_theta", json_real(s->theta));
                json_object_set_new(rp, "rope_type", json_string("default"));
                json_object_set_new(c, "rope_parameters", rp);
                SR("partial_rotary_factor", 1.0);
            } else {
                SR("rope_theta", s->theta);
            }
            if (s->yarn_factor > 0) {
                json_t *y = json_object();
                json_object_set_new(y, "beta_fast", json_real(s->beta_fast));
                json_object_set_new(y, "beta_slow", json_real(s->beta_slow));
                json_object_set_new(y, "factor", json_real(s->yarn_factor));
                json_object_set_new(y, "mscale", json_real(s->mscale));
                json_object_set_new(y, "mscale_all_dim", json_real(s->mscale_all_dim));
                json_object_set_new(y, "original_max_position_embeddings", json_integer(s->orig_ctx));
                json_object_set_new(y, "type", json_string("yarn"));
                json_object_set_new(c, "rope_scaling", y);
            } else if (!lite) {
                json_object_set_new(c, "rope_scaling", json_null());
            }
            if (s->idx_heads) {
                SI("index_n_heads", s->idx_heads);
                SI("index_head_dim", s->idx_dim);
                SI("index_topk", s->idx_topk);
                if (!strcmp(a, "glm_moe_dsa")) SB("indexer_rope_interleave", 1);
                if (s->idx_pattern) {
                    json_t *v = json_array();
                    for (const char *q = s->idx_pattern; *q; q++) json_array_append_new(v, json_string(*q == 'F' ? "full" : "shared"));
                    json_object_set_new(c, "indexer_types", v);
                }
            }
        }
    }
    SS("torch_dtype", dtype);
    SB("use_cache", 1);
    return c;
}

kiln_status kiln_mkmodel_arch(const char *arch, const char *spec, const char *dtype, uint64_t seed, const char *out_dir) {
    if (!kiln_arch_find(arch, NULL) || !strcmp(arch, "kimi_k25"))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "mkmodel: --arch '%s' is not supported (known: llama, chatglm, glm4, glm4_moe, deepseek_v3, kimi_k2, glm4_moe_lite, deepseek_v32, glm_moe_dsa)",
                         arch);
    kiln_dtype dt;
    if (!strcmp(dtype, "f32")) dt = KILN_DT_F32;
    else if (!strcmp(dtype, "bf16")) dt = KILN_DT_BF16;
    else return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --dtype '%s' is not f32 or bf16", dtype);
    ashape s;
    KILN_TRY(parse(arch, spec, &s));
    kiln_fp_init();
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) return kiln_fail(KILN_ERR_IO, "%s: cannot create directory: %s", out_dir, strerror(errno));
    tlist tl = {0}, *t = &tl;
    tl.dt = dt;
    tl.seed = seed;
    if (!strcmp(arch, "chatglm")) {
        tensors_chatglm(t, &s);
    } else { /* Llama-style names: embedding, layers (+ MTP layers), final norm, head */
        add_t(t, "model.embed_tokens.weight", s.vocab, s.dim, 1.0, 0.0, 0);
        const int mla = is_mla(arch);
        void (*layer)(tlist *, const ashape *, int, int) = mla ? layer_mla : !strcmp(arch, "glm4") ? layer_glm4 : layer_glm4_moe;
        for (int l = 0; l < s.layers + s.nextn; l++) {
            layer(t, &s, l, l >= s.first_dense);
            if (l >= s.layers) add_mtp_extras(t, &s, l, mla);
        }
        NORM("model.norm.weight", s.dim);
        W("lm_head.weight", s.vocab, s.dim);
    }
    kiln_status st = tl.st;
    char path[4200];
    if (st == KILN_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
        st = kiln_safetensors_write(path, tl.v, tl.n);
    }
    if (st == KILN_OK) {
        json_t *c = config(&s, dt == KILN_DT_F32 ? "float32" : "bfloat16");
        snprintf(path, sizeof path, "%s/config.json", out_dir);
        int r = json_dump_file(c, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(c);
        if (r != 0) st = kiln_fail(KILN_ERR_IO, "%s: cannot write", path);
    }
    tlist_free(t);
    return st;
}
