/* arch_deepseek.c — the MLA + MoE architectures: DeepSeek-V3 ("deepseek_v3"), Kimi K2 ("kimi_k2";
 * the Kimi K2.5 wrapper "kimi_k25" is read through its text_config, its tensors under
 * "language_model."), and GLM-4.7-Flash ("glm4_moe_lite").
 *
 * Per layer (prefix model.layers.N.):
 *   input_layernorm, post_attention_layernorm                              [hidden]
 *   self_attn.q_a_proj [q_lora_rank, hidden], self_attn.q_a_layernorm [q_lora_rank],
 *   self_attn.q_b_proj [H·(qk_nope + qk_rope), q_lora_rank]     (or self_attn.q_proj when q_lora_rank is null)
 *   self_attn.kv_a_proj_with_mqa [kv_lora_rank + qk_rope, hidden], self_attn.kv_a_layernorm [kv_lora_rank]
 *   self_attn.kv_b_proj [H·(qk_nope + v_head), kv_lora_rank], self_attn.o_proj [hidden, H·v_head]
 *   mlp: dense (gate/up/down_proj of intermediate_size) for the first first_k_dense_replace layers
 *        (or per mlp_layer_types), MoE after (see moe.h).
 * RoPE on the qk_rope dims: rope_interleave (default true) = adjacent pairs, as the official code's
 * interleave-then-rotate_half; YaRN from rope_scaling. Attention: mla.h. MTP layers (index >=
 * num_hidden_layers) are left unbound.
 *
 * The sparse-attention rows, DeepSeek-V3.2 ("deepseek_v32") and GLM-5.x ("glm_moe_dsa"), add per
 * layer with an indexer (docs/DSA.md):
 *   self_attn.indexer.wq_b [index_n_heads·index_head_dim, q_lora_rank], .wk [index_head_dim, hidden],
 *   .k_norm.weight / .k_norm.bias [index_head_dim], .weights_proj [index_n_heads, hidden]
 * and the config fields index_n_heads, index_head_dim, index_topk, indexer_rope_interleave (GLM:
 * default true; DeepSeek-V3.2's indexer RoPE is NEOX-paired) and GLM-5.2's indexer_types (or its
 * index_topk_pattern / index_topk_freq / index_skip_topk_offset schedule, as transformers derives
 * it). */
#include "model/arch.h"
#include "base/status.h"
#include "format/hfconfig.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

/* "full" / "shared" per layer from indexer_types, or from index_topk_pattern ("FSS…" or a list),
 * or from index_topk_freq / index_skip_topk_offset (transformers' GlmMoeDsaConfig: layer i is full
 * when max(i − offset + 1, 0) % freq == 0; freq 1 = every layer). */
static kiln_status dsa_layer_types(struct kiln_model *m, json_t *cfg, const char *file, unsigned char *full) {
    const int L = m->hp.n_layers;
    json_t *types = json_object_get(cfg, "indexer_types");
    const char *key = "indexer_types";
    if (!types || json_is_null(types)) {
        types = json_object_get(cfg, "index_topk_pattern");
        key = "index_topk_pattern";
    }
    if (types && !json_is_null(types)) {
        if (json_is_string(types)) {
            const char *s = json_string_value(types);
            if ((int)strlen(s) != L)
                return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' = \"%s\" has %zu letters; num_hidden_layers is %d", file, key, s, strlen(s), L);
            for (int l = 0; l < L; l++) {
                if (s[l] != 'F' && s[l] != 'S')
                    return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' letter %d is '%c'; each must be F (full) or S (shared)", file, key, l, s[l]);
                full[l] = s[l] == 'F';
            }
        } else {
            if (!json_is_array(types) || (int)json_array_size(types) != L)
                return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' must be a list of %d entries (num_hidden_layers), not %s of %zu", file, key, L,
                                 json_is_array(types) ? "a list" : "a non-list", json_is_array(types) ? json_array_size(types) : (size_t)0);
            for (int l = 0; l < L; l++) {
                const char *t = json_string_value(json_array_get(types, (size_t)l));
                if (!t || (strcmp(t, "full") != 0 && strcmp(t, "shared") != 0))
                    return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s[%d]' = %s is not a known indexer type (\"full\" or \"shared\")", file, key, l,
                                     t ? t : "(not a string)");
                full[l] = strcmp(t, "full") == 0;
            }
        }
    } else {
        int freq, offset;
        KILN_TRY(kiln_cfg_int_opt(cfg, file, "index_topk_freq", -(1 << 20), 1 << 20, 1, &freq));
        KILN_TRY(kiln_cfg_int_opt(cfg, file, "index_skip_topk_offset", -(1 << 20), 1 << 20, 2, &offset));
        if (freq < 1) freq = 1;
        for (int l = 0; l < L; l++) {
            int k = l - offset + 1;
            full[l] = (k > 0 ? k : 0) % freq == 0;
        }
    }
    if (L > 0 && !full[0])
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s': layer 0 is \"shared\" but a shared layer reuses the selection of an earlier full layer", file, key);
    return KILN_OK;
}

/* DSA fields of deepseek_v32 / glm_moe_dsa (after the MLA fields). */
static kiln_status dsa_read(struct kiln_model *m, json_t *cfg, const char *file, int glm) {
    kiln_arch_model *am = m->arch_state;
    kiln_arch_hp *ah = &am->hp;
    kiln_mla_cfg *c = &ah->mla;
    c->dsa = 1;
    KILN_TRY(kiln_cfg_int(cfg, file, "index_n_heads", 1, 4096, &c->idx_heads));
    KILN_TRY(kiln_cfg_int(cfg, file, "index_head_dim", 1, 1 << 16, &c->idx_dim));
    KILN_TRY(kiln_cfg_int(cfg, file, "index_topk", -(1 << 30), 1 << 30, &c->idx_topk));
    if (c->idx_topk <= 0) return kiln_fail(KILN_ERR_FORMAT, "%s: field 'index_topk' = %d must be at least 1", file, c->idx_topk);
    if (c->idx_dim % 128 || (c->idx_dim & (c->idx_dim - 1)))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'index_head_dim' = %d: the indexer's Hadamard rotation and FP8 blocks of 128 need a "
                         "power of two of at least 128", file, c->idx_dim);
    if (c->idx_dim < c->qk_rope)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'index_head_dim' = %d is smaller than qk_rope_head_dim = %d (the indexer's rotated part)", file,
                         c->idx_dim, c->qk_rope);
    if (c->kv_lora_rank % 128)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'kv_lora_rank' = %d: the latent's FP8 rounding works in blocks of 128 values", file,
                         c->kv_lora_rank);
    if (c->q_lora_rank <= 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'q_lora_rank' is null: the indexer reads the low-rank query (q_lora_rank required)", file);
    int inter;
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "indexer_rope_interleave", glm, &inter));
    c->idx_rope = ah->rope;
    c->idx_rope.style = inter ? KILN_ROPE_NORM : KILN_ROPE_NEOX;
    c->idx_norm_eps = 1e-6f; /* indexer.k_norm: LayerNorm(head_dim) with the default eps of both codes */
    /* GLM-5's q_a / kv_a RMSNorms use rms_norm_eps (1e-5) in the engines that serve it (vLLM, SGLang);
     * transformers' GlmMoeDsaRMSNorm(q_lora_rank) falls back to 1e-6 (docs/DSA.md: differences) */
    if (glm) c->lora_eps = m->hp.norm_eps;
    ah->idx_full = kiln_model_own(m, calloc((size_t)m->hp.n_layers, 1));
    if (!ah->idx_full) return kiln_fail_oom(m->path, "indexer layer flags (num_hidden_layers)", (unsigned long long)m->hp.n_layers);
    KILN_TRY(dsa_layer_types(m, cfg, file, ah->idx_full));
    m->hp.kv_dsa_key_layers = ah->idx_full;
    m->hp.head_dim = c->kv_lora_rank + c->qk_rope + c->idx_dim;
    m->hp.kv_dsa = 1;
    return KILN_OK;
}

static kiln_status mla_read(struct kiln_model *m, json_t *top, const char *file) {
    kiln_hparams *hp = &m->hp;
    json_t *cfg = top;
    const char *mt = json_string_value(json_object_get(top, "model_type"));
    if (mt && strcmp(mt, "kimi_k25") == 0) { /* multimodal wrapper: the language model's config is text_config */
        cfg = json_object_get(top, "text_config");
        if (!json_is_object(cfg)) return kiln_fail(KILN_ERR_FORMAT, "%s: model_type 'kimi_k25' needs an object field 'text_config'", file);
    }
    kiln_arch_model *am = kiln_arch_state_new(m);
    if (!am) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_arch_hp *ah = &am->hp;
    kiln_mla_cfg *c = &ah->mla;
    KILN_TRY(kiln_arch_read_common(m, cfg, file, "rms_norm_eps", -1, KILN_DT_BF16));
    KILN_TRY(kiln_cfg_int(cfg, file, "intermediate_size", 1, 1 << 22, &hp->ffn_dim));
    json_t *ql = json_object_get(cfg, "q_lora_rank");
    if (!ql) return kiln_fail(KILN_ERR_FORMAT, "%s: required field 'q_lora_rank' is missing (null when queries are not low-rank)", file);
    if (json_is_null(ql)) c->q_lora_rank = 0;
    else KILN_TRY(kiln_cfg_int(cfg, file, "q_lora_rank", 1, 1 << 16, &c->q_lora_rank));
    KILN_TRY(kiln_cfg_int(cfg, file, "kv_lora_rank", 1, 1 << 16, &c->kv_lora_rank));
    KILN_TRY(kiln_cfg_int(cfg, file, "qk_nope_head_dim", 1, 1 << 16, &c->qk_nope));
    KILN_TRY(kiln_cfg_int(cfg, file, "qk_rope_head_dim", 2, 2 * KILN_ROPE_MAX_HALF, &c->qk_rope));
    KILN_TRY(kiln_cfg_int(cfg, file, "v_head_dim", 1, 1 << 16, &c->v_head));
    if (c->qk_rope % 2) return kiln_fail(KILN_ERR_FORMAT, "%s: field 'qk_rope_head_dim' = %d must be even", file, c->qk_rope);
    int bias;
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "attention_bias", 0, &bias));
    if (bias) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'attention_bias' = true is not supported for MLA", file);
    double theta, partial;
    KILN_TRY(kiln_arch_read_rope(cfg, file, 10000.0, 1.0, &theta, &partial));
    if (partial != 1.0) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'partial_rotary_factor' = %g is not supported with MLA (1.0)", file, partial);
    int interleave;
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "rope_interleave", 1, &interleave));
    hp->rope_style = interleave ? KILN_ROPE_NORM : KILN_ROPE_NEOX;
    KILN_TRY(kiln_arch_read_yarn(cfg, file, &ah->yarn));
    KILN_TRY(kiln_rope_init(&ah->rope, c->qk_rope, (float)theta, hp->rope_style, &ah->yarn));
    KILN_TRY(kiln_arch_read_moe(m, cfg, file));
    ah->attn = KILN_ATTN_MLA;
    c->dim = hp->dim;
    c->n_heads = hp->n_heads;
    c->scale = 1.0f / sqrtf((float)(c->qk_nope + c->qk_rope)) * kiln_yarn_softmax_factor(&ah->yarn);
    c->lora_eps = 1e-6f; /* q_a_layernorm / kv_a_layernorm are built without eps: the RMSNorm default */
    ah->attn_scale = c->scale;
    hp->n_kv_heads = 1;
    hp->head_dim = c->kv_lora_rank + c->qk_rope;
    hp->kv_v_dim = c->kv_lora_rank;
    hp->kv_v_shares_k = 1;
    hp->rope_theta = (float)theta;
    hp->rotary_dim = c->qk_rope;
    if (mt && (!strcmp(mt, "deepseek_v32") || !strcmp(mt, "glm_moe_dsa"))) return dsa_read(m, cfg, file, !strcmp(mt, "glm_moe_dsa"));
    return KILN_OK;
}

/* Layer l's tensors (a decoder layer, or an MTP layer past num_hidden_layers) into L; MoE when
 * is_moe says so (MTP layers: kiln_arch_mtp_is_moe). */
static kiln_status bind_mla_layer(struct kiln_model *m, int l, kiln_arch_layer *L) {
    kiln_arch_model *am = m->arch_state;
    kiln_arch_hp *ah = &am->hp;
    const kiln_mla_cfg *c = &ah->mla;
    const int64_t D = m->hp.dim, H = m->hp.n_heads, qh = c->qk_nope + c->qk_rope;
    const int mtp = l >= m->hp.n_layers;
    const char *pre = ah->prefix; /* "model." or "language_model.model." */
    char n[192];
    kiln_mla_layer *A = &L->mla;
#define P(fmt) (snprintf(n, sizeof n, "%slayers.%d." fmt, pre, l), n)
    KILN_TRY(kiln_arch_vec(m, P("input_layernorm.weight"), D, &L->attn_norm));
    KILN_TRY(kiln_arch_vec(m, P("post_attention_layernorm.weight"), D, &L->ffn_norm));
    if (c->q_lora_rank > 0) {
        KILN_TRY(kiln_bind_linear(m, P("self_attn.q_a_proj"), c->q_lora_rank, D, &A->wq_a));
        KILN_TRY(kiln_arch_vec(m, P("self_attn.q_a_layernorm.weight"), c->q_lora_rank, &A->q_a_norm));
        KILN_TRY(kiln_bind_linear(m, P("self_attn.q_b_proj"), H * qh, c->q_lora_rank, &A->wq_b));
    } else {
        KILN_TRY(kiln_bind_linear(m, P("self_attn.q_proj"), H * qh, D, &A->wq));
    }
    KILN_TRY(kiln_bind_linear(m, P("self_attn.kv_a_proj_with_mqa"), c->kv_lora_rank + c->qk_rope, D, &A->wkv_a));
    KILN_TRY(kiln_arch_vec(m, P("self_attn.kv_a_layernorm.weight"), c->kv_lora_rank, &A->kv_a_norm));
    KILN_TRY(kiln_bind_linear(m, P("self_attn.kv_b_proj"), H * (c->qk_nope + c->v_head), c->kv_lora_rank, &A->wkv_b));
    KILN_TRY(kiln_bind_linear(m, P("self_attn.o_proj"), D, H * c->v_head, &A->wo));
    if (!mtp) KILN_TRY(kiln_mla_absorb(m, c, A)); /* MTP layers are checked, not run: no absorbed copies */
    if (c->dsa && (mtp || ah->idx_full[l])) {
        const int64_t Hi = c->idx_heads, d = c->idx_dim;
        A->idx_full = 1;
        KILN_TRY(kiln_bind_linear(m, P("self_attn.indexer.wq_b"), Hi * d, c->q_lora_rank, &A->iwq_b));
        KILN_TRY(kiln_bind_linear(m, P("self_attn.indexer.wk"), d, D, &A->iwk));
        KILN_TRY(kiln_arch_vec(m, P("self_attn.indexer.k_norm.weight"), d, &A->ik_norm_w));
        KILN_TRY(kiln_arch_vec(m, P("self_attn.indexer.k_norm.bias"), d, &A->ik_norm_b));
        KILN_TRY(kiln_bind_linear(m, P("self_attn.indexer.weights_proj"), Hi, D, &A->iw_proj));
    }
#undef P
    char mp[96];
    snprintf(mp, sizeof mp, "%slayers.%d.mlp.", pre, l);
    if (mtp ? kiln_arch_mtp_is_moe(m, mp) : ah->is_moe[l]) return kiln_arch_bind_moe(m, mp, L);
    return kiln_arch_bind_mlp(m, mp, m->hp.ffn_dim, L);
}

static kiln_status mla_bind(struct kiln_model *m) {
    kiln_arch_model *am = m->arch_state;
    kiln_arch_hp *ah = &am->hp;
    const char *pre = kiln_tt_find(&m->tt, "language_model.model.embed_tokens.weight") ? "language_model." : "";
    snprintf(ah->prefix, sizeof ah->prefix, "%smodel.", pre);
    char n[192], n2[192], n3[192];
    snprintf(n, sizeof n, "%smodel.embed_tokens.weight", pre);
    snprintf(n2, sizeof n2, "%smodel.norm.weight", pre);
    snprintf(n3, sizeof n3, "%slm_head", pre);
    KILN_TRY(kiln_arch_bind_ends(m, n, n2, n3));
    KILN_TRY(kiln_arch_layers_new(m, am));
    for (int l = 0; l < m->hp.n_layers; l++) KILN_TRY(bind_mla_layer(m, l, &am->layers[l]));
    return kiln_arch_check_mtp(m, ah->prefix, bind_mla_layer);
}

const kiln_arch kiln_arch_deepseek_v3 = {"deepseek_v3", {"deepseek_v3"}, {"DeepseekV3ForCausalLM"}, mla_read, mla_bind, kiln_mkmodel_arch, "deepseek2", NULL, 0};
const kiln_arch kiln_arch_kimi_k2 = {"kimi_k2", {"kimi_k2", "kimi_k25"}, {"KimiK25ForConditionalGeneration"}, mla_read, mla_bind, kiln_mkmodel_arch, "deepseek2", NULL, 0};
const kiln_arch kiln_arch_deepseek_v32 = {"deepseek_v32", {"deepseek_v32"}, {"DeepseekV32ForCausalLM"}, mla_read, mla_bind, kiln_mkmodel_arch, "deepseek32", NULL, 0};
const kiln_arch kiln_arch_glm_moe_dsa = {"glm_moe_dsa", {"glm_moe_dsa"}, {"GlmMoeDsaForCausalLM"}, mla_read, mla_bind, kiln_mkmodel_arch, "glm-dsa", NULL, 0};
const kiln_arch kiln_arch_glm4_moe_lite = {"glm4_moe_lite", {"glm4_moe_lite"}, {"Glm4MoeLiteForCausalLM"}, mla_read, mla_bind, kiln_mkmodel_arch, "deepseek2", NULL, 0};
