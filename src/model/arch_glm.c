/* arch_glm.c — the dense GLM-4 architectures.
 *
 * chatglm: GLM-4-9B in its original remote-code layout (model_type "chatglm", ChatGLMModel):
 *   transformer.embedding.word_embeddings [padded_vocab_size, hidden]
 *   transformer.encoder.layers.N.{input_layernorm, post_attention_layernorm}  RMSNorm (layernorm_epsilon)
 *   transformer.encoder.layers.N.self_attention.query_key_value [(H + 2·G)·kv_channels, hidden] + bias
 *       (rows: all query heads, then G = multi_query_group_num key heads, then G value heads)
 *   transformer.encoder.layers.N.self_attention.dense [hidden, H·kv_channels]
 *   transformer.encoder.layers.N.mlp.dense_h_to_4h [2·ffn_hidden_size, hidden] (gate rows, then up rows)
 *   transformer.encoder.layers.N.mlp.dense_4h_to_h [hidden, ffn_hidden_size]
 *   transformer.encoder.final_layernorm, transformer.output_layer [padded_vocab_size, hidden]
 *   RoPE (original_rope): the first kv_channels/2 dims of each head, adjacent pairs (2i, 2i+1),
 *   inv_freq[i] = 1 / (10000·rope_ratio)^(2i / (kv_channels/2)).
 * glm4: Glm4ForCausalLM (model_type "glm4"): Llama-like names plus post_self_attn_layernorm and
 *   post_mlp_layernorm (applied to the attention / MLP output before the residual add), q/k/v
 *   biases (attention_bias, default true), mlp.gate_up_proj [2·intermediate, hidden] (gate first),
 *   RoPE on the first head_dim·partial_rotary_factor (default 0.5) dims with adjacent pairs. */
#include "model/arch.h"
#include "base/status.h"
#include "format/hfconfig.h"
#include <stdio.h>
#include <string.h>

static kiln_status req_bool(json_t *cfg, const char *file, const char *key, int def, int want, const char *what) {
    int v;
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, key, def, &v));
    if (v != want) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field '%s' = %s is not supported (%s)", file, key, v ? "true" : "false", what);
    return KILN_OK;
}

/* ---- glm4 ---------------------------------------------------------------------------------------- */

static kiln_status glm4_read(struct kiln_model *m, json_t *cfg, const char *file) {
    kiln_arch_model *am = kiln_arch_state_new(m);
    if (!am) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_arch_hp *ah = &am->hp;
    double theta;
    int rot;
    KILN_TRY(kiln_arch_read_gqa(m, cfg, file, 1, &theta, &rot));
    ah->post_norms = 1;
    ah->ffn_fused = 1;
    m->hp.rope_style = KILN_ROPE_NORM; /* Glm4's rotate_half pairs x[0::2] with x[1::2] */
    return kiln_arch_finish_gqa(m, cfg, file, theta, rot);
}

static kiln_status glm4_bind(struct kiln_model *m) {
    kiln_hparams *hp = &m->hp;
    kiln_arch_model *am = m->arch_state;
    const int64_t D = hp->dim;
    KILN_TRY(kiln_arch_bind_ends(m, "model.embed_tokens.weight", "model.norm.weight", "lm_head"));
    KILN_TRY(kiln_arch_layers_new(m, am));
    char n[192];
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    for (int l = 0; l < hp->n_layers; l++) {
        kiln_arch_layer *L = &am->layers[l];
        KILN_TRY(kiln_arch_vec(m, P("input_layernorm.weight"), D, &L->attn_norm));
        KILN_TRY(kiln_arch_vec(m, P("post_self_attn_layernorm.weight"), D, &L->post_attn_norm));
        KILN_TRY(kiln_arch_vec(m, P("post_attention_layernorm.weight"), D, &L->ffn_norm));
        KILN_TRY(kiln_arch_vec(m, P("post_mlp_layernorm.weight"), D, &L->post_ffn_norm));
        KILN_TRY(kiln_arch_bind_self_attn(m, P("self_attn."), L));
        KILN_TRY(kiln_bind_linear(m, P("mlp.gate_up_proj"), 2 * (int64_t)hp->ffn_dim, D, &L->w_gate_up));
        KILN_TRY(kiln_bind_linear(m, P("mlp.down_proj"), D, hp->ffn_dim, &L->w_down));
    }
#undef P
    return KILN_OK;
}

const kiln_arch kiln_arch_glm4 = {"glm4", {"glm4"}, {"Glm4ForCausalLM"}, glm4_read, glm4_bind, kiln_mkmodel_arch, "glm4", NULL, 0};

/* ---- chatglm -------------------------------------------------------------------------------------- */

static kiln_status chatglm_read(struct kiln_model *m, json_t *cfg, const char *file) {
    kiln_hparams *hp = &m->hp;
    kiln_arch_model *am = kiln_arch_state_new(m);
    if (!am) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_arch_hp *ah = &am->hp;
    KILN_TRY(kiln_arch_read_common(m, cfg, file, "layernorm_epsilon", -1, KILN_DT_BF16));
    if (json_object_get(cfg, "padded_vocab_size")) KILN_TRY(kiln_cfg_int(cfg, file, "padded_vocab_size", 1, 1 << 24, &hp->vocab));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "seq_length", 1, 1 << 24, hp->max_seq, &hp->max_seq));
    KILN_TRY(kiln_cfg_int(cfg, file, "ffn_hidden_size", 1, 1 << 22, &hp->ffn_dim));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "kv_channels", 2, 1 << 16, hp->dim / hp->n_heads, &hp->head_dim));
    int mqa;
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "multi_query_attention", 0, &mqa));
    if (mqa) KILN_TRY(kiln_cfg_int(cfg, file, "multi_query_group_num", 1, 4096, &hp->n_kv_heads));
    else hp->n_kv_heads = hp->n_heads;
    KILN_TRY(kiln_cfg_bool_opt(cfg, file, "add_qkv_bias", 0, &ah->attn_bias));
    KILN_TRY(req_bool(cfg, file, "add_bias_linear", 0, 0, "false"));
    KILN_TRY(req_bool(cfg, file, "rmsnorm", 1, 1, "true: RMSNorm"));
    KILN_TRY(req_bool(cfg, file, "apply_residual_connection_post_layernorm", 0, 0, "false"));
    KILN_TRY(req_bool(cfg, file, "post_layer_norm", 1, 1, "true"));
    KILN_TRY(req_bool(cfg, file, "original_rope", 1, 1, "true"));
    double ratio;
    KILN_TRY(kiln_cfg_num_opt(cfg, file, "rope_ratio", 1e-6, 1e9, 1.0, &ratio));
    snprintf(ah->prefix, sizeof ah->prefix, "transformer.");
    ah->qkv_fused = 1;
    ah->ffn_fused = 1;
    hp->rope_style = KILN_ROPE_NORM; /* apply_rotary_pos_emb pairs (x[2i], x[2i+1]) */
    /* The RotaryEmbedding is built with dim = kv_channels / 2 and base 10000 · rope_ratio. */
    return kiln_arch_finish_gqa(m, cfg, file, 10000.0 * ratio, hp->head_dim / 2);
}

static kiln_status chatglm_bind(struct kiln_model *m) {
    kiln_hparams *hp = &m->hp;
    kiln_arch_model *am = m->arch_state;
    kiln_arch_hp *ah = &am->hp;
    const int64_t D = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    KILN_TRY(kiln_arch_bind_ends(m, "transformer.embedding.word_embeddings.weight", "transformer.encoder.final_layernorm.weight",
                                 "transformer.output_layer"));
    KILN_TRY(kiln_arch_layers_new(m, am));
    char n[192];
#define P(fmt) (snprintf(n, sizeof n, "transformer.encoder.layers.%d." fmt, l), n)
    for (int l = 0; l < hp->n_layers; l++) {
        kiln_arch_layer *L = &am->layers[l];
        KILN_TRY(kiln_arch_vec(m, P("input_layernorm.weight"), D, &L->attn_norm));
        KILN_TRY(kiln_arch_vec(m, P("post_attention_layernorm.weight"), D, &L->ffn_norm));
        KILN_TRY(kiln_bind_linear(m, P("self_attention.query_key_value"), qd + 2 * kvd, D, &L->wqkv));
        if (ah->attn_bias) {
            const float *b;
            KILN_TRY(kiln_arch_vec(m, P("self_attention.query_key_value.bias"), qd + 2 * kvd, &b));
            L->bq = b;
            L->bk = b + qd;
            L->bv = b + qd + kvd;
        }
        KILN_TRY(kiln_bind_linear(m, P("self_attention.dense"), D, qd, &L->wo));
        KILN_TRY(kiln_bind_linear(m, P("mlp.dense_h_to_4h"), 2 * (int64_t)hp->ffn_dim, D, &L->w_gate_up));
        KILN_TRY(kiln_bind_linear(m, P("mlp.dense_4h_to_h"), D, hp->ffn_dim, &L->w_down));
    }
#undef P
    return KILN_OK;
}

const kiln_arch kiln_arch_chatglm = {"chatglm", {"chatglm"}, {"ChatGLMModel", "ChatGLMForConditionalGeneration"}, chatglm_read, chatglm_bind, kiln_mkmodel_arch, "chatglm", NULL, 0};
