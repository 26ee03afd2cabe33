/* arch_common.c — the architecture table, and the config, binding and weight-listing helpers
 * shared by its rows (arch_llama.c, arch_glm.c, arch_glm4_moe.c, arch_deepseek.c). Every row runs
 * the one forward pass of model/forward.c. */
#include "model/arch.h"
#include "base/status.h"
#include "format/hfconfig.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const kiln_arch kiln_arch_chatglm, kiln_arch_glm4, kiln_arch_glm4_moe, kiln_arch_deepseek_v3, kiln_arch_kimi_k2,
    kiln_arch_glm4_moe_lite, kiln_arch_deepseek_v32, kiln_arch_glm_moe_dsa;

static const kiln_arch *const table[] = {&kiln_arch_llama,       &kiln_arch_chatglm,  &kiln_arch_glm4,
                                         &kiln_arch_glm4_moe,    &kiln_arch_deepseek_v3, &kiln_arch_kimi_k2,
                                         &kiln_arch_glm4_moe_lite, &kiln_arch_deepseek_v32, &kiln_arch_glm_moe_dsa};
#define N_ARCH ((int)(sizeof table / sizeof table[0]))

const kiln_arch *kiln_arch_find(const char *model_type, const char *architecture) {
    for (int i = 0; i < N_ARCH; i++)
        for (int j = 0; j < 4; j++) {
            if (model_type && table[i]->model_types[j] && strcmp(model_type, table[i]->model_types[j]) == 0) return table[i];
            if (!model_type && architecture && table[i]->architectures[j] && strcmp(architecture, table[i]->architectures[j]) == 0)
                return table[i];
        }
    return NULL;
}

const char *kiln_arch_names(void) { return "llama, chatglm, glm4, glm4_moe, deepseek_v3, kimi_k2 (kimi_k25), glm4_moe_lite, deepseek_v32, glm_moe_dsa"; }

const kiln_arch *kiln_arch_find_gguf(const char *gguf_arch) {
    for (int i = 0; i < N_ARCH; i++)
        if (table[i]->gguf_arch && gguf_arch && strcmp(table[i]->gguf_arch, gguf_arch) == 0) return table[i];
    return NULL;
}

int kiln_gguf_rename_table(const char *const (*names)[2], int n_names, const char *from, int to_hf, char *out, size_t cap) {
    const int src = to_hf ? 0 : 1, dst = to_hf ? 1 : 0;
    for (int i = 0; i < n_names; i++) {
        const char *pat = names[i][src];
        const char *pct = strstr(pat, "%d");
        if (!pct) {
            if (strcmp(from, pat) == 0) { snprintf(out, cap, "%s", names[i][dst]); return 1; }
            continue;
        }
        const size_t pre = (size_t)(pct - pat);
        if (strncmp(from, pat, pre) != 0) continue;
        char *end;
        const long l = strtol(from + pre, &end, 10);
        if (end == from + pre || l < 0 || l > 1 << 24 || strcmp(end, pct + 2) != 0) continue;
        snprintf(out, cap, names[i][dst], (int)l);
        return 1;
    }
    return 0;
}

int kiln_arch_gguf_rename(const kiln_arch *a, const char *from, int to_hf, char *out, size_t cap) {
    return kiln_gguf_rename_table(a->gguf_names, a->n_gguf_names, from, to_hf, out, cap);
}

/* ---- config ------------------------------------------------------------------------------------- */

kiln_arch_model *kiln_arch_state_new(struct kiln_model *m) {
    kiln_arch_model *am = kiln_model_own(m, calloc(1, sizeof *am));
    m->arch_state = am;
    return am;
}

static int has_key(const json_t *cfg, const char *k) {
    json_t *v = json_object_get(cfg, k);
    return v && !json_is_null(v);
}

kiln_status kiln_arch_read_common(struct kiln_model *m, json_t *cfg, const char *file, const char *eps_key, double eps_default, kiln_dtype def_act) {
    kiln_hparams *hp = &m->hp;
    KILN_TRY(kiln_cfg_int(cfg, file, "hidden_size", 1, 1 << 20, &hp->dim));
    const char *nl = has_key(cfg, "num_hidden_layers") ? "num_hidden_layers" : has_key(cfg, "num_layers") ? "num_layers" : "num_hidden_layers";
    KILN_TRY(kiln_cfg_int(cfg, file, nl, 1, 4096, &hp->n_layers));
    KILN_TRY(kiln_cfg_int(cfg, file, "num_attention_heads", 1, 4096, &hp->n_heads));
    const char *vk = has_key(cfg, "vocab_size") ? "vocab_size" : has_key(cfg, "padded_vocab_size") ? "padded_vocab_size" : "vocab_size";
    KILN_TRY(kiln_cfg_int(cfg, file, vk, 1, 1 << 24, &hp->vocab));
    const char *ck = has_key(cfg, "max_position_embeddings") ? "max_position_embeddings" : "seq_length";
    KILN_TRY(kiln_cfg_int_opt(cfg, file, ck, 1, 1 << 24, 2048, &hp->max_seq));
    double eps;
    if (eps_default < 0 && !has_key(cfg, eps_key)) return kiln_fail(KILN_ERR_FORMAT, "%s: required field '%s' is missing", file, eps_key);
    KILN_TRY(kiln_cfg_num_opt(cfg, file, eps_key, 0, 1, eps_default < 0 ? 1e-6 : eps_default, &eps));
    hp->norm_eps = (float)eps;
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "tie_word_embeddings", 0, &hp->tie_embeddings));
    KILN_TRY(kiln_cfg_token_id(cfg, file, "bos_token_id", &hp->bos_id));
    KILN_TRY(kiln_cfg_token_id(cfg, file, "eos_token_id", &hp->eos_id));
    KILN_TRY(kiln_cfg_token_ids(cfg, file, "eos_token_id", hp->eos_ids, KILN_MAX_EOS, &hp->n_eos));
    json_t *td = json_object_get(cfg, "torch_dtype");
    if (!td) td = json_object_get(cfg, "dtype");
    const char *tds = json_is_string(td) ? json_string_value(td) : NULL;
    hp->act_dtype = !tds                           ? def_act
                  : strcmp(tds, "float32") == 0    ? KILN_DT_F32
                  : strcmp(tds, "float16") == 0    ? KILN_DT_F16
                                                   : KILN_DT_BF16;
    json_t *act = json_object_get(cfg, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'hidden_act' = %s is not supported (silu)", file,
                         json_is_string(act) ? json_string_value(act) : "(not a string)");
    return KILN_OK;
}

kiln_status kiln_arch_read_rope(json_t *cfg, const char *file, double def_theta, double def_partial, double *theta, double *partial) {
    json_t *rp = json_object_get(cfg, "rope_parameters");
    if (rp && !json_is_null(rp) && !json_is_object(rp)) return kiln_fail(KILN_ERR_FORMAT, "%s: field 'rope_parameters' must be an object", file);
    if (has_key(cfg, "rope_theta")) KILN_TRY(kiln_cfg_num_opt(cfg, file, "rope_theta", 1, 1e12, def_theta, theta));
    else if (json_is_object(rp) && has_key(rp, "rope_theta")) {
        json_t *v = json_object_get(rp, "rope_theta");
        if (!json_is_number(v) || !(json_number_value(v) > 1 && json_number_value(v) <= 1e12))
            return kiln_fail(KILN_ERR_FORMAT, "%s: field 'rope_parameters.rope_theta' must be a number in (1, 1e12]", file);
        *theta = json_number_value(v);
    } else *theta = def_theta;
    const json_t *src = has_key(cfg, "partial_rotary_factor") ? cfg : (json_is_object(rp) && has_key(rp, "partial_rotary_factor")) ? rp : NULL;
    if (src) {
        json_t *v = json_object_get(src, "partial_rotary_factor");
        if (!json_is_number(v) || !(json_number_value(v) > 0 && json_number_value(v) <= 1))
            return kiln_fail(KILN_ERR_FORMAT, "%s: field 'partial_rotary_factor' must be a number in (0, 1]", file);
        *partial = json_number_value(v);
    } else *partial = def_partial;
    return KILN_OK;
}

kiln_status kiln_arch_read_gqa(struct kiln_model *m, json_t *cfg, const char *file, int def_bias, double *theta, int *rot) {
    kiln_hparams *hp = &m->hp;
    kiln_arch_hp *ah = &((kiln_arch_model *)m->arch_state)->hp;
    KILN_TRY(kiln_arch_read_common(m, cfg, file, "rms_norm_eps", -1, KILN_DT_BF16));
    KILN_TRY(kiln_cfg_int(cfg, file, "intermediate_size", 1, 1 << 22, &hp->ffn_dim));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "num_key_value_heads", 1, 4096, hp->n_heads, &hp->n_kv_heads));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "head_dim", 2, 1 << 16, hp->dim / hp->n_heads, &hp->head_dim));
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "attention_bias", def_bias, &ah->attn_bias));
    double partial;
    KILN_TRY(kiln_arch_read_rope(cfg, file, 10000.0, 0.5, theta, &partial));
    *rot = (int)(hp->head_dim * partial);
    snprintf(ah->prefix, sizeof ah->prefix, "model.");
    return KILN_OK;
}

kiln_status kiln_arch_finish_gqa(struct kiln_model *m, json_t *cfg, const char *file, double theta, int rot) {
    kiln_hparams *hp = &m->hp;
    kiln_arch_hp *ah = &((kiln_arch_model *)m->arch_state)->hp;
    if (hp->n_heads % hp->n_kv_heads)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %d attention heads is not a multiple of %d key/value heads", file, hp->n_heads, hp->n_kv_heads);
    if (rot < 2 || rot % 2 || rot > hp->head_dim)
        return kiln_fail(KILN_ERR_FORMAT, "%s: rotary dimension %d (head_dim %d × partial_rotary_factor) must be even and <= head_dim", file, rot,
                         hp->head_dim);
    KILN_TRY(kiln_arch_read_yarn(cfg, file, &ah->yarn));
    KILN_TRY(kiln_rope_init(&ah->rope, rot, (float)theta, hp->rope_style, &ah->yarn));
    ah->attn = KILN_ATTN_GQA;
    ah->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->rope_theta = (float)theta;
    hp->rotary_dim = rot;
    hp->kv_v_dim = hp->head_dim;
    hp->kv_v_shares_k = 0;
    return KILN_OK;
}

static kiln_status num_field(json_t *o, const char *file, const char *obj, const char *key, double def, double *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return KILN_OK; }
    if (!json_is_number(v)) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s.%s' must be a number", file, obj, key);
    *out = json_number_value(v);
    return KILN_OK;
}

kiln_status kiln_arch_read_yarn(json_t *cfg, const char *file, kiln_yarn *y) {
    memset(y, 0, sizeof *y);
    const char *obj = "rope_scaling";
    json_t *rs = json_object_get(cfg, obj);
    if (!rs || json_is_null(rs)) { obj = "rope_parameters"; rs = json_object_get(cfg, obj); }
    if (!rs || json_is_null(rs)) return KILN_OK;
    if (!json_is_object(rs)) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' must be an object", file, obj);
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rs, "type"));
    if (!type || strcmp(type, "default") == 0) return KILN_OK;
    if (strcmp(type, "yarn") != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field '%s.type' = '%s' is not supported (yarn, default)", file, obj, type);
    double f, orig, bf, bs, ms, msa, af;
    json_t *fv = json_object_get(rs, "factor");
    if (!json_is_number(fv)) return kiln_fail(KILN_ERR_FORMAT, "%s: required field '%s.factor' is missing or not a number", file, obj);
    f = json_number_value(fv);
    if (!(f >= 1.0 && f <= 1e6)) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s.factor' = %g is out of range [1, 1e6]", file, obj, f);
    KILN_TRY(num_field(rs, file, obj, "original_max_position_embeddings", 0, &orig));
    if (orig == 0) KILN_TRY(num_field(cfg, file, "", "max_position_embeddings", 0, &orig));
    if (!(orig >= 1 && orig <= (1 << 24)))
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s.original_max_position_embeddings' = %g is out of range", file, obj, orig);
    KILN_TRY(num_field(rs, file, obj, "beta_fast", 32, &bf));
    KILN_TRY(num_field(rs, file, obj, "beta_slow", 1, &bs));
    KILN_TRY(num_field(rs, file, obj, "mscale", 0, &ms));
    KILN_TRY(num_field(rs, file, obj, "mscale_all_dim", 0, &msa));
    KILN_TRY(num_field(rs, file, obj, "attention_factor", 0, &af));
    if (!(bf > 0) || !(bs > 0)) return kiln_fail(KILN_ERR_FORMAT, "%s: fields '%s.beta_fast' / 'beta_slow' must be > 0", file, obj);
    y->enabled = 1;
    y->factor = (float)f;
    y->orig_ctx = (int)orig;
    y->beta_fast = (float)bf;
    y->beta_slow = (float)bs;
    y->mscale = (float)ms;
    y->mscale_all_dim = (float)msa;
    y->attention_factor = (float)af;
    return KILN_OK;
}

kiln_status kiln_arch_read_moe(struct kiln_model *m, json_t *cfg, const char *file) {
    kiln_arch_hp *ah = &((kiln_arch_model *)m->arch_state)->hp;
    kiln_moe_cfg *c = &ah->moe;
    int first_k = 0, freq = 1;
    KILN_TRY(kiln_cfg_int(cfg, file, "n_routed_experts", 1, 1 << 16, &c->n_experts));
    KILN_TRY(kiln_cfg_int(cfg, file, "num_experts_per_tok", 1, 64, &c->n_used));
    KILN_TRY(kiln_cfg_int(cfg, file, "moe_intermediate_size", 1, 1 << 20, &c->ffn));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "n_shared_experts", 0, 64, 1, &ah->n_shared));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "n_group", 1, 64, 1, &c->n_group));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "topk_group", 1, 64, 1, &c->topk_group));
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "norm_topk_prob", 1, &c->norm_topk_prob));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "moe_layer_freq", 1, 4096, 1, &freq));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "num_nextn_predict_layers", 0, 64, 0, &ah->n_nextn));
    double rsf;
    KILN_TRY(kiln_cfg_num_opt(cfg, file, "routed_scaling_factor", 0, 1e6, 1.0, &rsf));
    c->routed_scale = (float)rsf;
    const char *sf = json_string_value(json_object_get(cfg, "scoring_func"));
    if (sf && strcmp(sf, "sigmoid") != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'scoring_func' = '%s' is not supported (sigmoid)", file, sf);
    const char *tm = json_string_value(json_object_get(cfg, "topk_method"));
    if (tm && strcmp(tm, "noaux_tc") != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'topk_method' = '%s' is not supported (noaux_tc)", file, tm);
    if (c->n_used > c->n_experts)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'num_experts_per_tok' = %d exceeds 'n_routed_experts' = %d", file, c->n_used, c->n_experts);
    if (c->n_experts % c->n_group || c->n_experts / c->n_group < 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'n_group' = %d must divide 'n_routed_experts' = %d into groups of at least 2", file,
                         c->n_group, c->n_experts);
    if (c->topk_group > c->n_group || c->topk_group * (c->n_experts / c->n_group) < c->n_used)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'topk_group' = %d: %d of %d groups cannot hold num_experts_per_tok = %d experts", file,
                         c->topk_group, c->topk_group, c->n_group, c->n_used);
    c->dim = m->hp.dim;
    c->shared_ffn = c->ffn * ah->n_shared;
    ah->is_moe = kiln_model_own(m, calloc((size_t)m->hp.n_layers, 1));
    if (!ah->is_moe) return kiln_fail_oom(m->path, "MoE layer flags (num_hidden_layers)", (unsigned long long)m->hp.n_layers);
    json_t *types = json_object_get(cfg, "mlp_layer_types");
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || (int)json_array_size(types) != m->hp.n_layers)
            return kiln_fail(KILN_ERR_FORMAT, "%s: field 'mlp_layer_types' must be a list of %d entries", file, m->hp.n_layers);
        for (int l = 0; l < m->hp.n_layers; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            if (!t || (strcmp(t, "sparse") != 0 && strcmp(t, "dense") != 0))
                return kiln_fail(KILN_ERR_FORMAT, "%s: field 'mlp_layer_types[%d]' must be \"dense\" or \"sparse\"", file, l);
            ah->is_moe[l] = strcmp(t, "sparse") == 0;
        }
    } else {
        KILN_TRY(kiln_cfg_int(cfg, file, "first_k_dense_replace", 0, 4096, &first_k));
        for (int l = 0; l < m->hp.n_layers; l++) ah->is_moe[l] = l >= first_k && l % freq == 0;
    }
    ah->n_moe_layers = 0;
    for (int l = 0; l < m->hp.n_layers; l++) ah->n_moe_layers += ah->is_moe[l];
    return KILN_OK;
}

/* ---- binding ------------------------------------------------------------------------------------ */

kiln_status kiln_arch_layers_new(struct kiln_model *m, kiln_arch_model *am) {
    am->layers = kiln_model_own(m, calloc((size_t)m->hp.n_layers, sizeof *am->layers));
    if (!am->layers) return kiln_fail_oom(m->path, "layers (num_hidden_layers)", (unsigned long long)m->hp.n_layers * sizeof *am->layers);
    return KILN_OK;
}

static kiln_status vec(struct kiln_model *m, const char *name, int64_t n, const float **out, int optional) {
    const kiln_tensor *t = kiln_tt_find(&m->tt, name);
    *out = NULL;
    if (!t) return optional ? KILN_OK : kiln_fail(KILN_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    if (t->ndim != 1 || t->shape[0] != n)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has %d dims / shape[0] = %lld but the config implies [%lld]", t->file, name, t->ndim,
                         (long long)t->shape[0], (long long)n);
    if (t->dtype == KILN_DT_F32 && ((uintptr_t)t->data % 4) == 0) { *out = (const float *)t->data; return KILN_OK; }
    const kiln_dtype_info *di = kiln_dtype_get(t->dtype);
    if (!di->to_f32 || di->block_elems > 1)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s not usable as a vector", t->file, name, di->name);
    float *f = kiln_model_own(m, malloc((size_t)n * 4));
    if (!f) return kiln_fail_oom(t->file, name, (unsigned long long)n * 4);
    di->to_f32(t->data, f, (size_t)n);
    *out = f;
    return KILN_OK;
}
kiln_status kiln_arch_vec(struct kiln_model *m, const char *name, int64_t n, const float **out) { return vec(m, name, n, out, 0); }
kiln_status kiln_arch_vec_opt(struct kiln_model *m, const char *name, int64_t n, const float **out) { return vec(m, name, n, out, 1); }

/* Binds "<name>" given with or without the ".weight" suffix. */
static kiln_status linear(struct kiln_model *m, const char *name, int64_t rows, int64_t cols, kiln_weight *w) {
    char p[256];
    snprintf(p, sizeof p, "%s", name);
    size_t l = strlen(p);
    if (l > 7 && strcmp(p + l - 7, ".weight") == 0) p[l - 7] = 0;
    return kiln_bind_linear(m, p, rows, cols, w);
}

kiln_status kiln_arch_bind_ends(struct kiln_model *m, const char *embd, const char *norm, const char *head) {
    const kiln_hparams *hp = &m->hp;
    KILN_TRY(linear(m, embd, hp->vocab, hp->dim, &m->tok_embd));
    char hw[256];
    snprintf(hw, sizeof hw, "%s.weight", head);
    char hp_[256];
    snprintf(hp_, sizeof hp_, "%s.weight_packed", head);
    if (kiln_tt_find(&m->tt, hw) || kiln_tt_find(&m->tt, hp_)) KILN_TRY(linear(m, head, hp->vocab, hp->dim, &m->output));
    else if (hp->tie_embeddings) m->output = m->tok_embd;
    else return kiln_fail(KILN_ERR_FORMAT, "%s: missing tensor '%s' (and tie_word_embeddings is false)", m->path, hw);
    return kiln_arch_vec(m, norm, hp->dim, &m->output_norm);
}

kiln_status kiln_arch_bind_self_attn(struct kiln_model *m, const char *p, kiln_arch_layer *L) {
    const kiln_hparams *hp = &m->hp;
    const int64_t D = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    char n[256];
#define P(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
    KILN_TRY(kiln_bind_linear(m, P("q_proj"), qd, D, &L->wq));
    KILN_TRY(kiln_bind_linear(m, P("k_proj"), kvd, D, &L->wk));
    KILN_TRY(kiln_bind_linear(m, P("v_proj"), kvd, D, &L->wv));
    KILN_TRY(kiln_bind_linear(m, P("o_proj"), D, qd, &L->wo));
    if (((const kiln_arch_model *)m->arch_state)->hp.attn_bias) {
        KILN_TRY(kiln_arch_vec(m, P("q_proj.bias"), qd, &L->bq));
        KILN_TRY(kiln_arch_vec(m, P("k_proj.bias"), kvd, &L->bk));
        KILN_TRY(kiln_arch_vec(m, P("v_proj.bias"), kvd, &L->bv));
    }
#undef P
    return KILN_OK;
}

static int linear_exists(struct kiln_model *m, const char *prefix) {
    char n[256];
    snprintf(n, sizeof n, "%s.weight", prefix);
    if (kiln_tt_find(&m->tt, n)) return 1;
    snprintf(n, sizeof n, "%s.weight_packed", prefix);
    return kiln_tt_find(&m->tt, n) != NULL;
}

kiln_status kiln_arch_bind_moe(struct kiln_model *m, const char *p, kiln_arch_layer *L) {
    kiln_arch_hp *ah = &((kiln_arch_model *)m->arch_state)->hp;
    const kiln_moe_cfg *c = &ah->moe;
    const int E = c->n_experts, D = m->hp.dim;
    char n[256];
    /* the expert count must match the tensors exactly, in both directions */
    snprintf(n, sizeof n, "%sexperts.%d.gate_proj", p, E);
    if (linear_exists(m, n))
        return kiln_fail(KILN_ERR_FORMAT, "%s: config.json says n_routed_experts = %d but the checkpoint has expert %d (tensor '%s.weight')", m->path, E,
                         E, n);
    for (int e = 0; e < E; e++) {
        static const char *const parts[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int k = 0; k < 3; k++) {
            snprintf(n, sizeof n, "%sexperts.%d.%s", p, e, parts[k]);
            if (!linear_exists(m, n))
                return kiln_fail(KILN_ERR_FORMAT, "%s: config.json says n_routed_experts = %d but tensor '%s.weight' is missing", m->path, E, n);
        }
    }
    L->exp_w = kiln_model_own(m, calloc((size_t)E * 3, sizeof *L->exp_w));
    if (!L->exp_w) return kiln_fail_oom(m->path, "expert weights (n_routed_experts)", (unsigned long long)E * 3 * sizeof *L->exp_w);
    for (int e = 0; e < E; e++) {
        snprintf(n, sizeof n, "%sexperts.%d.gate_proj", p, e);
        KILN_TRY(linear(m, n, c->ffn, D, &L->exp_w[e]));
        snprintf(n, sizeof n, "%sexperts.%d.up_proj", p, e);
        KILN_TRY(linear(m, n, c->ffn, D, &L->exp_w[E + e]));
        snprintf(n, sizeof n, "%sexperts.%d.down_proj", p, e);
        KILN_TRY(linear(m, n, D, c->ffn, &L->exp_w[2 * E + e]));
    }
    L->moe.gate = L->exp_w;
    L->moe.up = L->exp_w + E;
    L->moe.down = L->exp_w + 2 * E;
    snprintf(n, sizeof n, "%sgate", p);
    char w[272];
    snprintf(w, sizeof w, "%s.weight", n);
    const kiln_tensor *rt = kiln_tt_find(&m->tt, w);
    if (rt && rt->ndim == 2 && rt->shape[0] != E)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has %lld rows but config.json says n_routed_experts = %d", rt->file, w,
                         (long long)rt->shape[0], E);
    KILN_TRY(linear(m, n, E, D, &L->moe.router));
    snprintf(n, sizeof n, "%sgate.e_score_correction_bias", p);
    KILN_TRY(kiln_arch_vec_opt(m, n, E, &L->moe.bias));
    if (c->shared_ffn > 0) {
        snprintf(n, sizeof n, "%sshared_experts.gate_proj", p);
        KILN_TRY(linear(m, n, c->shared_ffn, D, &L->moe.sh_gate));
        snprintf(n, sizeof n, "%sshared_experts.up_proj", p);
        KILN_TRY(linear(m, n, c->shared_ffn, D, &L->moe.sh_up));
        snprintf(n, sizeof n, "%sshared_experts.down_proj", p);
        KILN_TRY(linear(m, n, D, c->shared_ffn, &L->moe.sh_down));
    }
    L->is_moe = 1;
    return KILN_OK;
}

kiln_status kiln_arch_bind_mlp(struct kiln_model *m, const char *p, int64_t ffn, kiln_arch_layer *L) {
    char n[256];
    snprintf(n, sizeof n, "%sgate_proj", p);
    KILN_TRY(linear(m, n, ffn, m->hp.dim, &L->w_gate));
    snprintf(n, sizeof n, "%sup_proj", p);
    KILN_TRY(linear(m, n, ffn, m->hp.dim, &L->w_up));
    snprintf(n, sizeof n, "%sdown_proj", p);
    return linear(m, n, m->hp.dim, ffn, &L->w_down);
}

/* ---- the linear weights of a layer ------------------------------------------------------------- */

/* Every slot of the one layer struct that holds a linear weight the forward pass multiplies by,
 * with its checkpoint name; absent slots (data NULL) are skipped. Kept as stored and so not listed:
 * MoE routers (routing decisions are what quantization must not move; checkpoints keep them in
 * BF16) and MLA's kv_b, whose per-head absorbed float32 copies (built at load) are what attention
 * reads (listed apart by kiln_arch_layer_absorbed). */
int kiln_arch_layer_linears(kiln_arch_layer *L, int n_experts, kiln_arch_linear *out) {
    struct { kiln_weight *w; const char *name; } slots[] = {
        {&L->wqkv, "self_attn.query_key_value"}, {&L->wq, "self_attn.q_proj"}, {&L->wk, "self_attn.k_proj"},
        {&L->wv, "self_attn.v_proj"}, {&L->wo, "self_attn.o_proj"}, {&L->mla.wq_a, "self_attn.q_a_proj"},
        {&L->mla.wq_b, "self_attn.q_b_proj"}, {&L->mla.wq, "self_attn.q_proj"}, {&L->mla.wkv_a, "self_attn.kv_a_proj_with_mqa"},
        {&L->mla.wo, "self_attn.o_proj"}, {&L->w_gate_up, "mlp.gate_up_proj"}, {&L->w_gate, "mlp.gate_proj"},
        {&L->w_up, "mlp.up_proj"}, {&L->w_down, "mlp.down_proj"}, {&L->moe.sh_gate, "mlp.shared_experts.gate_proj"},
        {&L->moe.sh_up, "mlp.shared_experts.up_proj"}, {&L->moe.sh_down, "mlp.shared_experts.down_proj"},
        /* DSA's indexer projections; weights_proj stays as stored (the official code runs it in f32) */
        {&L->mla.iwq_b, "self_attn.indexer.wq_b"}, {&L->mla.iwk, "self_attn.indexer.wk"}};
    int n = 0;
    for (size_t i = 0; i < sizeof slots / sizeof *slots; i++) {
        if (!slots[i].w->data) continue;
        out[n].w = slots[i].w;
        out[n].expert = -1;
        snprintf(out[n].name, sizeof out[n].name, "%s", slots[i].name);
        n++;
    }
    if (L->is_moe && L->exp_w) /* gate[E], up[E], down[E]; moe.gate/up/down point into this array */
        for (int e = 0; e < 3 * n_experts; e++) {
            out[n].w = &L->exp_w[e];
            out[n].expert = e % n_experts;
            snprintf(out[n].name, sizeof out[n].name, "mlp.experts.%d.%s", e % n_experts,
                     e < n_experts ? "gate_proj" : e < 2 * n_experts ? "up_proj" : "down_proj");
            n++;
        }
    return n;
}

/* ---- tensors a model does not use ------------------------------------------------------------- */

/* Layer index of a name "...layers.N....", or -1. */
static int layer_of(const char *name) {
    const char *p = strstr(name, "layers.");
    if (!p) return -1;
    char *end;
    long l = strtol(p + 7, &end, 10);
    return end != p + 7 && *end == '.' ? (int)l : -1;
}

int kiln_arch_tensor_unused(const struct kiln_model *m, const kiln_tensor *t, char *buf, size_t cap) {
    const kiln_arch_model *am = m->arch_state;
    const int l = layer_of(t->name);
    const int mtp = l >= m->hp.n_layers && am && am->hp.n_nextn > 0;
    if (t->used && !mtp) return 0;
    if (mtp)
        snprintf(buf, cap, "MTP layer %d (num_nextn_predict_layers = %d):%s not run (speculative decoding with MTP is not built yet)", l,
                 am->hp.n_nextn, am->hp.mtp_checked ? " shapes checked at load;" : "");
    else if (strstr(t->name, "inv_freq"))
        snprintf(buf, cap, "RoPE frequency buffer: kiln computes the frequencies from the config");
    else if (am && am->hp.idx_full && l >= 0 && l < m->hp.n_layers && !am->hp.idx_full[l] && strstr(t->name, ".indexer."))
        snprintf(buf, cap, "indexer of a layer whose indexer_types entry is \"shared\": it reuses layer %d's selection", l - 1);
    else
        snprintf(buf, cap, "not read by the %s architecture", m->hp.arch);
    return 1;
}

int kiln_arch_mtp_is_moe(struct kiln_model *m, const char *mlp_prefix) {
    char n[192];
    snprintf(n, sizeof n, "%sgate.weight", mlp_prefix);
    if (kiln_tt_find(&m->tt, n)) return 1;
    snprintf(n, sizeof n, "%sgate.weight_packed", mlp_prefix); /* the router stored quantized (`kiln quantize --scope all`) */
    return kiln_tt_find(&m->tt, n) != NULL;
}

kiln_status kiln_arch_check_mtp(struct kiln_model *m, const char *prefix, kiln_status (*bind_layer)(struct kiln_model *, int, kiln_arch_layer *)) {
    kiln_arch_model *am = m->arch_state;
    const int64_t D = m->hp.dim;
    am->hp.mtp_checked = 1;
    am->n_mtp = 0;
    if (am->hp.n_nextn > 0 && !(am->mtp = kiln_model_own(m, calloc((size_t)am->hp.n_nextn, sizeof *am->mtp))))
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int l = m->hp.n_layers; l < m->hp.n_layers + am->hp.n_nextn; l++) {
        char n[192];
        /* the MTP layer's linears may be stored quantized as the others (compressed-tensors'
         * X.weight_packed: a Kimi / GLM INT4 checkpoint, `kiln quantize`) */
        char np[200];
        snprintf(n, sizeof n, "%slayers.%d.eh_proj.weight", prefix, l);
        snprintf(np, sizeof np, "%slayers.%d.eh_proj.weight_packed", prefix, l);
        if (!kiln_tt_find(&m->tt, n) && !kiln_tt_find(&m->tt, np)) continue; /* shipped without its MTP layer: nothing to check */
        kiln_mtp_layer *M = &am->mtp[am->n_mtp];
        KILN_TRY(kiln_bind_linear(m, (snprintf(n, sizeof n, "%slayers.%d.eh_proj", prefix, l), n), D, 2 * D, &M->eh));
        const float **norms[] = {&M->enorm, &M->hnorm, &M->head_norm};
        const char *names[] = {"enorm", "hnorm", "shared_head.norm"};
        for (int i = 0; i < 3; i++) {
            snprintf(n, sizeof n, "%slayers.%d.%s.weight", prefix, l, names[i]);
            KILN_TRY(kiln_arch_vec(m, n, D, norms[i]));
        }
        const kiln_tensor *t;
        snprintf(n, sizeof n, "%slayers.%d.embed_tokens.weight", prefix, l);
        if ((t = kiln_tt_find(&m->tt, n)) && (t->ndim != 2 || t->shape[0] != m->hp.vocab || t->shape[1] != D))
            return kiln_fail(KILN_ERR_FORMAT, "%s: MTP tensor '%s' must be [%d, %lld] (vocab, hidden)", t->file ? t->file : m->path, n, m->hp.vocab, (long long)D);
        if (t) KILN_TRY(linear(m, (snprintf(n, sizeof n, "%slayers.%d.embed_tokens", prefix, l), n), m->hp.vocab, D, &M->embed));
        else M->embed = m->tok_embd;
        snprintf(n, sizeof n, "%slayers.%d.shared_head.head.weight", prefix, l);
        if ((t = kiln_tt_find(&m->tt, n)) && (t->ndim != 2 || t->shape[0] != m->hp.vocab || t->shape[1] != D))
            return kiln_fail(KILN_ERR_FORMAT, "%s: MTP tensor '%s' must be [%d, %lld] (vocab, hidden)", t->file ? t->file : m->path, n, m->hp.vocab, (long long)D);
        snprintf(np, sizeof np, "%slayers.%d.shared_head.head.weight_packed", prefix, l);
        if (!t) t = kiln_tt_find(&m->tt, np); /* quantized: kiln_bind_linear checks its shape */
        if (t) KILN_TRY(linear(m, (snprintf(n, sizeof n, "%slayers.%d.shared_head.head", prefix, l), n), m->hp.vocab, D, &M->head));
        else M->head = m->output;
        KILN_TRY(bind_layer(m, l, &M->L)); /* the decoder block: attention and MoE, every shape */
        am->n_mtp++;
    }
    return KILN_OK;
}

kiln_status kiln_model_mtp_prepare(struct kiln_model *m) {
    kiln_arch_model *am = m->arch_state;
    if (!am || am->n_mtp == 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the model ships no MTP layer (num_nextn_predict_layers with model.layers.N.eh_proj ...)", m->path);
    for (int j = 0; j < am->n_mtp; j++) {
        kiln_mtp_layer *M = &am->mtp[j];
        if (am->hp.attn == KILN_ATTN_MLA && !M->absorbed) KILN_TRY(kiln_mla_absorb(m, &am->hp.mla, &M->L.mla));
        M->absorbed = 1;
    }
    return KILN_OK;
}
