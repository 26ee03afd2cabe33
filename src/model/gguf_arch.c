/* gguf_arch.c — GGUF files of the GLM / DeepSeek / Kimi families as llama.cpp writes and reads
 * them: the architecture names, metadata keys and tensor names of llama.cpp (its
 * convert_hf_to_gguf.py and src/models/{deepseek2,glm-dsa,glm4-moe,glm4,chatglm}.cpp), read into and
 * written from kiln's Hugging Face rows. (The llama architecture: model/load_gguf.c and export.c.)
 *
 *   GGUF arch   models                                    kiln row (reading)
 *   deepseek2   DeepSeek-V3, Kimi K2.x, GLM-4.7-Flash     deepseek_v3 (kimi_k2 / glm4_moe_lite compute
 *               (MLA + MoE)                               the same; all three are written as deepseek2)
 *   glm-dsa     GLM-5.x (MLA + MoE + sparse attention)    glm_moe_dsa
 *   deepseek32  DeepSeek-V3.2 (the same, NEOX indexer RoPE) deepseek_v32
 *   glm4moe     GLM-4.5 / 4.6 / 4.7 (GQA + MoE)           glm4_moe
 *   glm4        GLM-4-0414 (dense; post norms)            glm4
 *   chatglm     GLM-4-9B remote-code layout (dense)       chatglm
 *
 * Reading turns the metadata into the config.json of the row (so a GGUF file and a Hugging Face
 * directory pass the same validation and bind the same way; `kiln convert FILE.gguf DIR` writes
 * that config back) after checking every key's type and range here, naming the GGUF key; the
 * tensors get the Hugging Face names, with two layouts of llama.cpp's converter undone:
 *   - experts stacked per layer: blk.N.ffn_{gate,up,down}_exps [E, rows, cols] (ggml ne: cols,
 *     rows, E) become E views model.layers.N.mlp.experts.e.{gate,up,down}_proj [rows, cols]: an
 *     expert's rows are whole blocks of any type, so a view is a byte offset (no copy);
 *   - MLA's kv_b_proj [H·(nope + v), r], which the converter splits for the absorbed form into
 *     attn_k_b [H, r, nope] (each head's key half transposed) and attn_v_b [H, v, r]: kv_b_proj is
 *     rebuilt in F32 (a transpose cannot keep quantized rows' blocks; F32 holds every dequantized
 *     value exactly). Older files carry attn_kv_b itself, read as it is.
 * Writing (`kiln convert MODEL OUT.gguf`) does what the converter does: experts stacked, kv_b split,
 * MTP layers kept for glm4moe (blk.{L..}.nextn.*, block_count counting them, nextn_predict_layers)
 * and dropped for deepseek2 (its converter skips them), the router (ffn_gate_inp) and 1-D tensors
 * F32 under --outtype. RoPE: deepseek2 rotates adjacent pairs (llama.cpp ROPE_TYPE_NORM = the
 * official interleaved layout) and glm4moe half-split pairs (NEOX): the Hugging Face layouts of
 * these models, so no rows move in either direction.
 *
 * What llama.cpp cannot express is refused with the field named, never written differently:
 * softmax expert gating (DeepSeek-V2; kiln routes sigmoid + noaux_tc), YaRN with mscale ≠
 * mscale_all_dim (llama.cpp's deepseek2 has one yarn_log_multiplier), dense layers that are not a
 * leading block, DSA indexers. */
#include "model/gguf_arch.h"
#include "model/arch.h"
#include "model/export.h"
#include "base/status.h"
#include "format/gguf.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tensor names ------------------------------------------------------------------------------- */

#define GLOBAL_NAMES                                                                                   \
    {"token_embd.weight", "model.embed_tokens.weight"}, {"output_norm.weight", "model.norm.weight"},   \
        {"output.weight", "lm_head.weight"}
/* the routed-expert router, shared experts, dense MLP and MTP block: the same in both */
#define FFN_NAMES                                                                                      \
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight"},                                \
        {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight"},                                \
        {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight"},                            \
        {"blk.%d.ffn_gate_inp.weight", "model.layers.%d.mlp.gate.weight"},                             \
        {"blk.%d.exp_probs_b.bias", "model.layers.%d.mlp.gate.e_score_correction_bias"},               \
        {"blk.%d.ffn_gate_shexp.weight", "model.layers.%d.mlp.shared_experts.gate_proj.weight"},       \
        {"blk.%d.ffn_up_shexp.weight", "model.layers.%d.mlp.shared_experts.up_proj.weight"},           \
        {"blk.%d.ffn_down_shexp.weight", "model.layers.%d.mlp.shared_experts.down_proj.weight"},       \
        {"blk.%d.nextn.eh_proj.weight", "model.layers.%d.eh_proj.weight"},                             \
        {"blk.%d.nextn.enorm.weight", "model.layers.%d.enorm.weight"},                                 \
        {"blk.%d.nextn.hnorm.weight", "model.layers.%d.hnorm.weight"},                                 \
        {"blk.%d.nextn.embed_tokens.weight", "model.layers.%d.embed_tokens.weight"},                   \
        {"blk.%d.nextn.shared_head_head.weight", "model.layers.%d.shared_head.head.weight"},           \
        {"blk.%d.nextn.shared_head_norm.weight", "model.layers.%d.shared_head.norm.weight"},           \
        {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight"},                         \
        {"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight"}

static const char *const deepseek2_names[][2] = {
    GLOBAL_NAMES,
    FFN_NAMES,
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight"},
    {"blk.%d.attn_q_a.weight", "model.layers.%d.self_attn.q_a_proj.weight"},
    {"blk.%d.attn_q_a_norm.weight", "model.layers.%d.self_attn.q_a_layernorm.weight"},
    {"blk.%d.attn_q_b.weight", "model.layers.%d.self_attn.q_b_proj.weight"},
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight"},
    {"blk.%d.attn_kv_a_mqa.weight", "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight"},
    {"blk.%d.attn_kv_a_norm.weight", "model.layers.%d.self_attn.kv_a_layernorm.weight"},
    {"blk.%d.attn_kv_b.weight", "model.layers.%d.self_attn.kv_b_proj.weight"},
};
/* glm-dsa (GLM-5.x): deepseek2's names plus the lightning indexer's */
static const char *const glm_dsa_names[][2] = {
    GLOBAL_NAMES,
    FFN_NAMES,
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight"},
    {"blk.%d.attn_q_a.weight", "model.layers.%d.self_attn.q_a_proj.weight"},
    {"blk.%d.attn_q_a_norm.weight", "model.layers.%d.self_attn.q_a_layernorm.weight"},
    {"blk.%d.attn_q_b.weight", "model.layers.%d.self_attn.q_b_proj.weight"},
    {"blk.%d.attn_kv_a_mqa.weight", "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight"},
    {"blk.%d.attn_kv_a_norm.weight", "model.layers.%d.self_attn.kv_a_layernorm.weight"},
    {"blk.%d.attn_kv_b.weight", "model.layers.%d.self_attn.kv_b_proj.weight"},
    {"blk.%d.indexer.attn_q_b.weight", "model.layers.%d.self_attn.indexer.wq_b.weight"},
    {"blk.%d.indexer.attn_k.weight", "model.layers.%d.self_attn.indexer.wk.weight"},
    {"blk.%d.indexer.k_norm.weight", "model.layers.%d.self_attn.indexer.k_norm.weight"},
    {"blk.%d.indexer.k_norm.bias", "model.layers.%d.self_attn.indexer.k_norm.bias"},
    {"blk.%d.indexer.proj.weight", "model.layers.%d.self_attn.indexer.weights_proj.weight"},
};
/* glm4moe: llama.cpp's GLM4_MOE loads post_attention_layernorm as ATTN_POST_NORM (the pre-MLP norm) */
static const char *const glm4moe_names[][2] = {
    GLOBAL_NAMES,
    FFN_NAMES,
    {"blk.%d.post_attention_norm.weight", "model.layers.%d.post_attention_layernorm.weight"},
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight"},
    {"blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight"},
    {"blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight"},
    {"blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias"},
    {"blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias"},
    {"blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias"},
    {"blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight"},
    {"blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight"},
};
/* glm4: separate q/k/v as kiln writes them (a fused attn_qkv is split into row views on reading) */
static const char *const glm4_names[][2] = {
    GLOBAL_NAMES,
    {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight"},
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight"},
    {"blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight"},
    {"blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight"},
    {"blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias"},
    {"blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias"},
    {"blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias"},
    {"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight"},
    {"blk.%d.post_attention_norm.weight", "model.layers.%d.post_self_attn_layernorm.weight"},
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight"},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.gate_up_proj.weight"}, /* [2·ffn, dim], gate rows first */
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight"},
    {"blk.%d.post_ffw_norm.weight", "model.layers.%d.post_mlp_layernorm.weight"},
};
/* chatglm: the fused query_key_value and dense_h_to_4h of the remote-code layout */
static const char *const chatglm_names[][2] = {
    {"token_embd.weight", "transformer.embedding.word_embeddings.weight"},
    {"output_norm.weight", "transformer.encoder.final_layernorm.weight"},
    {"output.weight", "transformer.output_layer.weight"},
    {"blk.%d.attn_norm.weight", "transformer.encoder.layers.%d.input_layernorm.weight"},
    {"blk.%d.attn_qkv.weight", "transformer.encoder.layers.%d.self_attention.query_key_value.weight"},
    {"blk.%d.attn_qkv.bias", "transformer.encoder.layers.%d.self_attention.query_key_value.bias"},
    {"blk.%d.attn_output.weight", "transformer.encoder.layers.%d.self_attention.dense.weight"},
    {"blk.%d.ffn_norm.weight", "transformer.encoder.layers.%d.post_attention_layernorm.weight"},
    {"blk.%d.ffn_up.weight", "transformer.encoder.layers.%d.mlp.dense_h_to_4h.weight"},
    {"blk.%d.ffn_down.weight", "transformer.encoder.layers.%d.mlp.dense_4h_to_h.weight"},
};
#define N_NAMES(t) ((int)(sizeof t / sizeof t[0]))

static const char *const expert_proj[3] = {"gate", "up", "down"};

typedef enum { FAM_MLA, FAM_GQA_MOE, FAM_GLM4, FAM_CHATGLM } family_kind;
typedef struct {
    const char *arch;            /* general.architecture */
    const char *const (*names)[2];
    int n_names;
    family_kind kind;
    int dsa;                     /* 0: no sparse attention; 1: glm-dsa; 2: deepseek32 */
} family;
static const family families[] = {
    {"deepseek2", deepseek2_names, N_NAMES(deepseek2_names), FAM_MLA, 0},
    {"glm-dsa", glm_dsa_names, N_NAMES(glm_dsa_names), FAM_MLA, 1},
    /* deepseek32 (DeepSeek-V3.2): glm-dsa's tensors (an indexer on every layer, MTP kept); llama.cpp
     * ropes its indexer NEOX (the official code since the 2025-11-17 fix) and reads no types key */
    {"deepseek32", glm_dsa_names, N_NAMES(glm_dsa_names), FAM_MLA, 2},
    {"glm4moe", glm4moe_names, N_NAMES(glm4moe_names), FAM_GQA_MOE, 0},
    {"glm4", glm4_names, N_NAMES(glm4_names), FAM_GLM4, 0},
    {"chatglm", chatglm_names, N_NAMES(chatglm_names), FAM_CHATGLM, 0},
};

static const family *family_of(const char *gguf_arch) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i].arch, gguf_arch) == 0) return &families[i];
    return NULL;
}

/* "blk.N.<rest>" → N and a pointer to rest; -1 when the name is not per layer */
static int blk_layer(const char *name, const char **rest) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    long l = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || l < 0 || l > 1 << 20) return -1;
    *rest = end + 1;
    return (int)l;
}

/* ---- metadata ----------------------------------------------------------------------------------- */

typedef struct {
    const kiln_gguf *g;
    const char *file, *arch;
    char key[160];
} meta;

static const char *type_name(kiln_gguf_type t) {
    static const char *const n[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < sizeof n / sizeof n[0] ? n[t] : "?";
}

static const char *key_of(meta *M, const char *suffix) {
    snprintf(M->key, sizeof M->key, "%s.%s", M->arch, suffix);
    return M->key;
}

/* Looks `arch.suffix` up: 1 with its type when present; 0 when absent, *st then an error naming
 * the key if it is required (else KILN_OK). *present (may be NULL) says which. */
static int find_key(meta *M, const char *suffix, int required, kiln_gguf_type *t, int *present, kiln_status *st) {
    const char *key = key_of(M, suffix);
    *st = KILN_OK;
    if (present) *present = 0;
    if (kiln_gguf_key_type(M->g, key, t) == 0) {
        if (present) *present = 1;
        return 1;
    }
    if (required) *st = kiln_fail(KILN_ERR_FORMAT, "%s: required metadata key '%s' is missing", M->file, key);
    return 0;
}

/* An unsigned integer key `arch.suffix` in [lo, hi]; absent: def (or an error when required). */
static kiln_status meta_uint(meta *M, const char *suffix, int required, uint64_t lo, uint64_t hi, uint64_t def, uint64_t *v, int *present) {
    kiln_gguf_type t;
    kiln_status st;
    if (!find_key(M, suffix, required, &t, present, &st)) {
        *v = def;
        return st;
    }
    const char *key = M->key;
    if (t == KILN_GGUF_STRING || t == KILN_GGUF_ARRAY || t == KILN_GGUF_BOOL || t == KILN_GGUF_F32 || t == KILN_GGUF_F64)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' is of type %s; an unsigned integer is expected", M->file, key, type_name(t));
    if (kiln_gguf_get_u64(M->g, key, v) != 0) return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' is negative", M->file, key);
    if (*v < lo || *v > hi)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' = %llu is out of range [%llu, %llu]", M->file, key, (unsigned long long)*v,
                         (unsigned long long)lo, (unsigned long long)hi);
    return KILN_OK;
}

/* A finite number key (f32, f64 or an integer) in [lo, hi]; absent: def or an error. */
static kiln_status meta_num(meta *M, const char *suffix, int required, double lo, double hi, double def, double *v, int *present) {
    kiln_gguf_type t;
    kiln_status st;
    if (!find_key(M, suffix, required, &t, present, &st)) {
        *v = def;
        return st;
    }
    const char *key = M->key;
    float f;
    if (t == KILN_GGUF_STRING || t == KILN_GGUF_ARRAY || t == KILN_GGUF_BOOL || kiln_gguf_get_f32(M->g, key, &f) != 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' is of type %s; a number is expected", M->file, key, type_name(t));
    if (!isfinite(f) || f < lo || f > hi)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' = %g is out of range [%g, %g]", M->file, key, (double)f, lo, hi);
    *v = f;
    return KILN_OK;
}

static kiln_status meta_bool(meta *M, const char *suffix, int def, int *v) {
    const char *key = key_of(M, suffix);
    kiln_gguf_type t;
    if (kiln_gguf_key_type(M->g, key, &t) != 0) {
        *v = def;
        return KILN_OK;
    }
    uint64_t x;
    if (t != KILN_GGUF_BOOL || kiln_gguf_get_u64(M->g, key, &x) != 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' is of type %s; a bool is expected", M->file, key, type_name(t));
    *v = x != 0;
    return KILN_OK;
}

static kiln_status meta_str(meta *M, const char *suffix, const char **s) {
    const char *key = key_of(M, suffix);
    kiln_gguf_type t;
    *s = NULL;
    if (kiln_gguf_key_type(M->g, key, &t) != 0) return KILN_OK;
    if (t != KILN_GGUF_STRING || kiln_gguf_get_str(M->g, key, s, NULL) != 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' is of type %s; a string is expected", M->file, key, type_name(t));
    return KILN_OK;
}

static const kiln_tensor *raw_find(const kiln_tensor_table *raw, const char *name) {
    for (int i = 0; i < raw->n; i++)
        if (strcmp(raw->v[i].name, name) == 0) return &raw->v[i];
    return NULL;
}

#define SI(k, v) json_object_set_new(c, k, json_integer((json_int_t)(v)))
#define SR(k, v) json_object_set_new(c, k, json_real(v))
#define SB(k, v) json_object_set_new(c, k, json_boolean(v))
#define SS(k, v) json_object_set_new(c, k, json_string(v))

/* The keys every family has: sizes, norms, RoPE base, context, vocabulary, special ids. *blocks is
 * block_count, *nextn the MTP blocks among them (nextn_predict_layers). */
static kiln_status base_meta(meta *M, const kiln_tensor_table *raw, json_t *c, uint64_t *dim_out, uint64_t *heads_out, uint64_t *ctx_out,
                             uint64_t *blocks_out, uint64_t *nextn_out) {
    uint64_t dim, blocks, nextn, ffn, heads, ctx, vocab;
    double eps, theta;
    int has_vocab;
    KILN_TRY(meta_uint(M, "embedding_length", 1, 1, 1 << 20, 0, &dim, NULL));
    KILN_TRY(meta_uint(M, "block_count", 1, 1, 4096, 0, &blocks, NULL));
    KILN_TRY(meta_uint(M, "nextn_predict_layers", 0, 0, 64, 0, &nextn, NULL));
    if (nextn >= blocks)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s.nextn_predict_layers' = %llu leaves no decoder layer of %s.block_count = %llu", M->file,
                         M->arch, (unsigned long long)nextn, M->arch, (unsigned long long)blocks);
    KILN_TRY(meta_uint(M, "feed_forward_length", 1, 1, 1 << 22, 0, &ffn, NULL));
    KILN_TRY(meta_uint(M, "attention.head_count", 1, 1, 4096, 0, &heads, NULL));
    KILN_TRY(meta_uint(M, "context_length", 0, 1, 1 << 24, 4096, &ctx, NULL));
    KILN_TRY(meta_num(M, "attention.layer_norm_rms_epsilon", 1, 0, 1, 0, &eps, NULL));
    KILN_TRY(meta_num(M, "rope.freq_base", 0, 1, 1e12, 10000.0, &theta, NULL));
    KILN_TRY(meta_uint(M, "vocab_size", 0, 1, 1 << 24, 0, &vocab, &has_vocab));
    SI("hidden_size", dim);
    SI("num_hidden_layers", blocks - nextn);
    SI("intermediate_size", ffn);
    SI("num_attention_heads", heads);
    SI("max_position_embeddings", ctx);
    SR("rms_norm_eps", eps);
    SR("rope_theta", theta);
    SS("hidden_act", "silu");
    if (has_vocab) SI("vocab_size", vocab);
    else {
        const kiln_tensor *emb = raw_find(raw, "token_embd.weight");
        if (!emb || emb->ndim != 2) return kiln_fail(KILN_ERR_FORMAT, "%s: missing tensor 'token_embd.weight' (and no '%s.vocab_size')", M->file, M->arch);
        SI("vocab_size", emb->shape[0]);
    }
    SB("tie_word_embeddings", raw_find(raw, "output.weight") == NULL);
    /* activations as the llama GGUF path: F32 unless the file stores 16-bit floats */
    int half = 0;
    for (int i = 0; i < raw->n; i++) half |= raw->v[i].dtype == KILN_DT_BF16 || raw->v[i].dtype == KILN_DT_F16;
    SS("torch_dtype", half ? "bfloat16" : "float32");
    int64_t id;
    if (kiln_gguf_get_token_id(M->g, "tokenizer.ggml.bos_token_id", &id) == 0 && id >= 0) SI("bos_token_id", id);
    if (kiln_gguf_get_token_id(M->g, "tokenizer.ggml.eos_token_id", &id) == 0 && id >= 0) SI("eos_token_id", id);
    *dim_out = dim;
    *heads_out = heads;
    *ctx_out = ctx;
    *blocks_out = blocks;
    *nextn_out = nextn;
    return KILN_OK;
}

/* The MoE router and experts (llama.cpp's expert_* keys, read as its loaders default them) and the
 * MTP layer count. */
static kiln_status moe_meta(meta *M, const kiln_tensor_table *raw, json_t *c, int default_sigmoid, uint64_t blocks, uint64_t nextn) {
    uint64_t E, used, shared, moe_ffn, lead, groups, group_used, gating, vocab;
    double scale;
    int gating_present, norm = 0, has_vocab;
    KILN_TRY(meta_uint(M, "expert_count", 1, 1, 1 << 16, 0, &E, NULL));
    KILN_TRY(meta_uint(M, "expert_used_count", 1, 1, 64, 0, &used, NULL));
    KILN_TRY(meta_uint(M, "expert_shared_count", 1, 0, 64, 0, &shared, NULL));
    KILN_TRY(meta_uint(M, "expert_feed_forward_length", 1, 1, 1 << 20, 0, &moe_ffn, NULL));
    KILN_TRY(meta_uint(M, "leading_dense_block_count", 0, 0, 4096, 0, &lead, NULL));
    KILN_TRY(meta_num(M, "expert_weights_scale", 0, 0, 1e6, 1.0, &scale, NULL));
    KILN_TRY(meta_bool(M, "expert_weights_norm", 0, &norm));
    KILN_TRY(meta_uint(M, "expert_group_count", 0, 0, 64, 0, &groups, NULL));
    KILN_TRY(meta_uint(M, "expert_group_used_count", 0, 0, 64, 0, &group_used, NULL));
    KILN_TRY(meta_uint(M, "expert_gating_func", 0, 0, 3, 0, &gating, &gating_present));
    KILN_TRY(meta_uint(M, "vocab_size", 0, 1, 1 << 24, 0, &vocab, &has_vocab));
    /* llama.cpp's defaults for a file without the key: glm4moe / glm-dsa sigmoid; deepseek2 softmax
     * (DeepSeek-V2 files), except GLM-4.7-Flash's shape (47/48 layers, 154,880 tokens): sigmoid */
    if (!gating_present || gating == 0) {
        const kiln_tensor *emb = raw_find(raw, "token_embd.weight");
        const int64_t nv = has_vocab ? (int64_t)vocab : emb && emb->ndim == 2 ? emb->shape[0] : 0;
        const int glm47_lite = (blocks - nextn == 47 || blocks - nextn == 48) && nv == 154880;
        gating = default_sigmoid || glm47_lite ? 2 : 1;
    }
    if (gating != 2)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: metadata '%s.expert_gating_func' = %llu (%s%s): kiln routes experts by sigmoid scores with the "
                         "correction bias (DeepSeek-V3, Kimi K2, GLM; gating func 2)", M->file, M->arch, (unsigned long long)gating,
                         gating == 1 ? "softmax" : "softmax-weight", gating_present ? "" : ", llama.cpp's default when the key is absent");
    if (used > E)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s.expert_used_count' = %llu exceeds '%s.expert_count' = %llu", M->file, M->arch,
                         (unsigned long long)used, M->arch, (unsigned long long)E);
    if (lead > blocks - nextn)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s.leading_dense_block_count' = %llu exceeds the %llu decoder layers", M->file, M->arch,
                         (unsigned long long)lead, (unsigned long long)(blocks - nextn));
    SI("num_nextn_predict_layers", nextn);
    SI("n_routed_experts", E);
    SI("num_experts_per_tok", used);
    SI("n_shared_experts", shared);
    SI("moe_intermediate_size", moe_ffn);
    SI("first_k_dense_replace", lead);
    SR("routed_scaling_factor", scale);
    SB("norm_topk_prob", norm);
    /* llama.cpp groups only when expert_group_count > 1 (and then group_used < groups) */
    SI("n_group", groups > 1 ? groups : 1);
    SI("topk_group", groups > 1 ? group_used : 1);
    SS("scoring_func", "sigmoid");
    SS("topk_method", "noaux_tc");
    return KILN_OK;
}

/* Keys that change the computation in ways kiln does not implement: refused by name. */
static kiln_status refuse_keys(meta *M) {
    static const char *const unsupported[] = {"attention.temperature_scale", "rope.scaling.attn_factor", "attention.sliding_window",
                                              "expert_group_scale", "swiglu_clamp_exp"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        const char *key = key_of(M, unsupported[i]);
        if (kiln_gguf_key_type(M->g, key, NULL) == 0)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: metadata '%s' is present; kiln does not implement it for %s", M->file, key, M->arch);
    }
    return KILN_OK;
}

/* rope.scaling.*: none, or YaRN (deepseek2: yarn_log_multiplier = 0.1 · mscale_all_dim, the
 * converter's convention, which llama.cpp divides back; mscale = mscale_all_dim, the one case the
 * key can express). */
static kiln_status rope_meta(meta *M, json_t *c, int allow_yarn, uint64_t ctx) {
    const char *type;
    double factor, orig, logmul, bf, bs;
    int has_factor;
    KILN_TRY(meta_str(M, "rope.scaling.type", &type));
    KILN_TRY(meta_num(M, "rope.scaling.factor", 0, 0, 1e6, 0, &factor, &has_factor));
    if (!type || strcmp(type, "none") == 0 || (strcmp(type, "linear") == 0 && (!has_factor || factor == 1.0))) return KILN_OK;
    if (strcmp(type, "yarn") != 0 || !allow_yarn)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: metadata '%s.rope.scaling.type' = '%s' is not supported for %s (%s)", M->file, M->arch, type,
                         M->arch, allow_yarn ? "none, yarn" : "none");
    if (!has_factor || factor < 1.0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s.rope.scaling.factor' must be present and at least 1 with YaRN", M->file, M->arch);
    KILN_TRY(meta_num(M, "rope.scaling.original_context_length", 0, 1, 1 << 24, (double)ctx, &orig, NULL));
    KILN_TRY(meta_num(M, "rope.scaling.yarn_log_multiplier", 0, 0, 100, 0, &logmul, NULL));
    KILN_TRY(meta_num(M, "rope.scaling.yarn_beta_fast", 0, 1e-6, 1e6, 32, &bf, NULL));
    KILN_TRY(meta_num(M, "rope.scaling.yarn_beta_slow", 0, 1e-6, 1e6, 1, &bs, NULL));
    json_t *y = json_object();
    json_object_set_new(y, "type", json_string("yarn"));
    json_object_set_new(y, "factor", json_real(factor));
    json_object_set_new(y, "original_max_position_embeddings", json_integer((json_int_t)orig));
    json_object_set_new(y, "mscale", json_real(logmul / 0.1));
    json_object_set_new(y, "mscale_all_dim", json_real(logmul / 0.1));
    json_object_set_new(y, "beta_fast", json_real(bf));
    json_object_set_new(y, "beta_slow", json_real(bs));
    json_object_set_new(c, "rope_scaling", y);
    return KILN_OK;
}

/* glm-dsa's indexer keys: head count, key length, top-k and the per-layer full / shared types
 * (absent: llama.cpp's rule — every layer full below a 1M-token context (GLM-5, 5.1), else
 * GLM-5.2's pattern, full at layers 0, 1, 2, 6, 10 …: index_topk_freq 4 from offset 3). */
static kiln_status dsa_meta(meta *M, json_t *c, uint64_t ctx, int flavour) {
    uint64_t heads, dim, topk, n_types;
    KILN_TRY(meta_uint(M, "attention.indexer.head_count", 1, 1, 4096, 0, &heads, NULL));
    KILN_TRY(meta_uint(M, "attention.indexer.key_length", 1, 1, 1 << 16, 0, &dim, NULL));
    KILN_TRY(meta_uint(M, "attention.indexer.top_k", 1, 1, 1u << 30, 0, &topk, NULL));
    SI("index_n_heads", heads);
    SI("index_head_dim", dim);
    SI("index_topk", topk);
    if (flavour == 2) { /* deepseek32: NEOX indexer RoPE, an indexer on every layer (no types key is read) */
        SB("indexer_rope_interleave", 0);
        return KILN_OK;
    }
    SB("indexer_rope_interleave", 1); /* llama.cpp ropes the indexer in adjacent pairs (GLM's layout) */
    const int L = (int)json_integer_value(json_object_get(c, "num_hidden_layers"));
    const char *key = key_of(M, "attention.indexer.types");
    kiln_gguf_type t, et;
    if (kiln_gguf_key_type(M->g, key, &t) != 0) {
        if (ctx >= 1048576) {
            SI("index_topk_freq", 4);
            SI("index_skip_topk_offset", 3);
        } else {
            SI("index_topk_freq", 1);
        }
        return KILN_OK;
    }
    if (t != KILN_GGUF_ARRAY || kiln_gguf_get_arr(M->g, key, &et, &n_types) != 0 || et == KILN_GGUF_STRING || et == KILN_GGUF_ARRAY)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' must be an array of integers (1 full, 0 shared)", M->file, key);
    if (n_types != (uint64_t)L)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' has %llu entries; the model has %d decoder layers", M->file, key, (unsigned long long)n_types, L);
    json_t *types = json_array();
    for (int l = 0; l < L; l++) {
        double v = -1;
        kiln_gguf_arr_f64(M->g, key, (uint64_t)l, &v);
        if (v != 0 && v != 1) {
            json_decref(types);
            return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s[%d]' = %g is not 1 (full) or 0 (shared)", M->file, key, l, v);
        }
        json_array_append_new(types, json_string(v == 1 ? "full" : "shared"));
    }
    json_object_set_new(c, "indexer_types", types);
    return KILN_OK;
}

static kiln_status deepseek2_config(meta *M, const kiln_tensor_table *raw, json_t *c, int dsa) {
    uint64_t heads, ctx, q_lora, kv_lora, rope, k_mla, v_mla, k_len, v_len;
    int has_q, has_k_mla, has_v_mla;
    SS("model_type", dsa == 2 ? "deepseek_v32" : dsa ? "glm_moe_dsa" : "deepseek_v3");
    json_t *a = json_array();
    json_array_append_new(a, json_string(dsa == 2 ? "DeepseekV32ForCausalLM" : dsa ? "GlmMoeDsaForCausalLM" : "DeepseekV3ForCausalLM"));
    json_object_set_new(c, "architectures", a);
    uint64_t dim, blocks, nextn;
    KILN_TRY(base_meta(M, raw, c, &dim, &heads, &ctx, &blocks, &nextn));
    KILN_TRY(moe_meta(M, raw, c, dsa, blocks, nextn));
    if (dsa) KILN_TRY(dsa_meta(M, c, ctx, dsa));
    SI("num_key_value_heads", heads);
    KILN_TRY(meta_uint(M, "attention.q_lora_rank", 0, 1, 1 << 16, 0, &q_lora, &has_q));
    if (has_q) SI("q_lora_rank", q_lora);
    else json_object_set_new(c, "q_lora_rank", json_null());
    KILN_TRY(meta_uint(M, "attention.kv_lora_rank", 1, 1, 1 << 16, 0, &kv_lora, NULL));
    KILN_TRY(meta_uint(M, "rope.dimension_count", 1, 2, 1024, 0, &rope, NULL));
    KILN_TRY(meta_uint(M, "attention.key_length_mla", 0, 1, 1 << 16, 0, &k_mla, &has_k_mla));
    KILN_TRY(meta_uint(M, "attention.value_length_mla", 0, 1, 1 << 16, 0, &v_mla, &has_v_mla));
    if (has_k_mla != has_v_mla)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s.attention.%s_length_mla' is missing while its key/value partner is present", M->file,
                         M->arch, has_k_mla ? "value" : "key");
    if (!has_k_mla) { /* files from before the k_b / v_b split: key/value lengths are the MHA view */
        KILN_TRY(meta_uint(M, "attention.key_length", 1, 1, 1 << 16, 0, &k_len, NULL));
        KILN_TRY(meta_uint(M, "attention.value_length", 1, 1, 1 << 16, 0, &v_len, NULL));
        k_mla = k_len;
        v_mla = v_len;
    }
    if (k_mla <= rope)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s.attention.key_length%s' = %llu leaves no non-rotary part beside %s.rope.dimension_count = %llu",
                         M->file, M->arch, has_k_mla ? "_mla" : "", (unsigned long long)k_mla, M->arch, (unsigned long long)rope);
    SI("kv_lora_rank", kv_lora);
    SI("qk_rope_head_dim", rope);
    SI("qk_nope_head_dim", k_mla - rope);
    SI("v_head_dim", v_mla);
    SB("rope_interleave", 1);
    SB("attention_bias", 0);
    return rope_meta(M, c, 1, ctx);
}

/* The head length of the GQA families: attention.key_length, by default embedding_length /
 * head_count as llama.cpp's loader takes it. The MLA families set their head lengths apart, so
 * their hidden size need not divide by the head count (GLM-4.7-Flash: 2,048 over 20 heads). */
static kiln_status head_length(meta *M, uint64_t dim, uint64_t heads, uint64_t *hd) {
    int present;
    KILN_TRY(meta_uint(M, "attention.key_length", 0, 2, 1 << 16, dim / heads, hd, &present));
    if (!present && dim % heads)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s.embedding_length' = %llu is not a multiple of '%s.attention.head_count' = %llu and "
                         "'%s.attention.key_length' is absent", M->file, M->arch, (unsigned long long)dim, M->arch,
                         (unsigned long long)heads, M->arch);
    return KILN_OK;
}

/* glm4moe and glm4: GQA with partial RoPE (head_dim from key_length, rotary dims from
 * rope.dimension_count); glm4moe adds the MoE keys and q/k norms. */
static kiln_status glm_gqa_config(meta *M, const kiln_tensor_table *raw, json_t *c, int moe) {
    uint64_t heads, ctx, kv, hd, vd, rot, dim, blocks, nextn;
    int has_v;
    SS("model_type", moe ? "glm4_moe" : "glm4");
    json_t *a = json_array();
    json_array_append_new(a, json_string(moe ? "Glm4MoeForCausalLM" : "Glm4ForCausalLM"));
    json_object_set_new(c, "architectures", a);
    KILN_TRY(base_meta(M, raw, c, &dim, &heads, &ctx, &blocks, &nextn));
    if (moe) KILN_TRY(moe_meta(M, raw, c, 1, blocks, nextn));
    KILN_TRY(meta_uint(M, "attention.head_count_kv", 0, 1, 4096, heads, &kv, NULL));
    KILN_TRY(head_length(M, dim, heads, &hd));
    KILN_TRY(meta_uint(M, "attention.value_length", 0, 1, 1 << 16, hd, &vd, &has_v));
    if (vd != hd)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: metadata '%s.attention.value_length' = %llu differs from key_length %llu", M->file, M->arch,
                         (unsigned long long)vd, (unsigned long long)hd);
    KILN_TRY(meta_uint(M, "rope.dimension_count", 0, 2, hd, hd, &rot, NULL));
    SI("num_key_value_heads", kv);
    SI("head_dim", hd);
    SR("partial_rotary_factor", (double)rot / (double)hd);
    if ((int)(hd * ((double)rot / (double)hd)) != (int)rot)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: metadata '%s.rope.dimension_count' = %llu is not a representable fraction of head dim %llu", M->file,
                         M->arch, (unsigned long long)rot, (unsigned long long)hd);
    SB("attention_bias", raw_find(raw, "blk.0.attn_q.bias") != NULL || raw_find(raw, "blk.0.attn_qkv.bias") != NULL);
    if (moe) SB("use_qk_norm", raw_find(raw, "blk.0.attn_q_norm.weight") != NULL);
    return rope_meta(M, c, 0, ctx);
}

/* chatglm: the remote-code config (ChatGLMModel); RoPE on kv_channels / 2 dims, base 10000 · rope_ratio. */
static kiln_status chatglm_config(meta *M, const kiln_tensor_table *raw, json_t *c) {
    uint64_t heads, ctx, kv, hd, rot, dim, blocks, nextn;
    SS("model_type", "chatglm");
    json_t *a = json_array();
    json_array_append_new(a, json_string("ChatGLMModel"));
    json_object_set_new(c, "architectures", a);
    KILN_TRY(base_meta(M, raw, c, &dim, &heads, &ctx, &blocks, &nextn));
    if (nextn) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: metadata '%s.nextn_predict_layers': chatglm has no MTP layers", M->file, M->arch);
    KILN_TRY(meta_uint(M, "attention.head_count_kv", 0, 1, 4096, heads, &kv, NULL));
    KILN_TRY(head_length(M, dim, heads, &hd));
    KILN_TRY(meta_uint(M, "rope.dimension_count", 0, 2, hd, hd / 2, &rot, NULL));
    if (rot != hd / 2)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: metadata '%s.rope.dimension_count' = %llu: chatglm rotates kv_channels / 2 = %llu dims", M->file,
                         M->arch, (unsigned long long)rot, (unsigned long long)(hd / 2));
    /* the chatglm config's own field names (chatglm_read reads them) */
    json_t *v;
    json_object_set(c, "num_layers", (v = json_object_get(c, "num_hidden_layers")));
    json_object_set(c, "ffn_hidden_size", json_object_get(c, "intermediate_size"));
    json_object_set(c, "layernorm_epsilon", json_object_get(c, "rms_norm_eps"));
    json_object_set(c, "seq_length", json_object_get(c, "max_position_embeddings"));
    SR("rope_ratio", json_real_value(json_object_get(c, "rope_theta")) / 10000.0);
    SI("kv_channels", hd);
    SB("multi_query_attention", kv != heads);
    SI("multi_query_group_num", kv);
    SB("add_qkv_bias", raw_find(raw, "blk.0.attn_qkv.bias") != NULL || raw_find(raw, "blk.0.attn_q.bias") != NULL);
    SB("add_bias_linear", 0);
    SB("rmsnorm", 1);
    SB("post_layer_norm", 1);
    SB("original_rope", 1);
    SB("apply_residual_connection_post_layernorm", 0);
    return KILN_OK;
}

/* ---- reading ------------------------------------------------------------------------------------ */

/* The F32 kv_b_proj [H·(nope + v), r] of layer l from attn_k_b [H, r, nope] and attn_v_b [H, v, r]. */
static kiln_status rebuild_kv_b(struct kiln_model *m, const char *file, int l, const kiln_tensor *kb, const kiln_tensor *vb) {
    kiln_arch_model *am = m->arch_state;
    const kiln_mla_cfg *c = &am->hp.mla;
    const int64_t H = m->hp.n_heads, r = c->kv_lora_rank, dn = c->qk_nope, dv = c->v_head;
    if (kb->ndim != 3 || kb->shape[0] != H || kb->shape[1] != r || kb->shape[2] != dn)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld]; the metadata implies [%lld, %lld, %lld] (heads, kv_lora_rank, "
                         "key_length_mla - rope)", file, kb->name, (long long)kb->shape[0], (long long)kb->shape[1], (long long)kb->shape[2],
                         (long long)H, (long long)r, (long long)dn);
    if (vb->ndim != 3 || vb->shape[0] != H || vb->shape[1] != dv || vb->shape[2] != r)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld]; the metadata implies [%lld, %lld, %lld] (heads, value_length_mla, "
                         "kv_lora_rank)", file, vb->name, (long long)vb->shape[0], (long long)vb->shape[1], (long long)vb->shape[2],
                         (long long)H, (long long)dv, (long long)r);
    const kiln_dtype_info *ki = kiln_dtype_get(kb->dtype), *vi = kiln_dtype_get(vb->dtype);
    if (!ki->to_f32 || !vi->to_f32 || dn % ki->block_elems || r % vi->block_elems)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensors '%s' (%s) / '%s' (%s) cannot be read as numbers row by row", file, kb->name, ki->name, vb->name,
                         vi->name);
    const size_t kb_row = (size_t)(kb->nbytes / (uint64_t)(H * r)), vb_row = (size_t)(vb->nbytes / (uint64_t)(H * dv));
    float *kv = kiln_model_own(m, malloc((size_t)(H * (dn + dv) * r) * sizeof(float)));
    float *tmp = malloc((size_t)(dn > r ? dn : r) * sizeof(float));
    if (!kv || !tmp) {
        free(tmp);
        return kiln_fail_oom(file, "kv_b_proj rebuilt from attn_k_b / attn_v_b (F32)", (unsigned long long)(H * (dn + dv) * r * 4));
    }
    for (int64_t h = 0; h < H; h++) {
        float *out = kv + (size_t)(h * (dn + dv) * r);
        for (int64_t j = 0; j < r; j++) { /* k_b[h][j][·] is column j of the key rows */
            ki->to_f32(kb->data + (size_t)(h * r + j) * kb_row, tmp, (size_t)dn);
            for (int64_t i = 0; i < dn; i++) out[i * r + j] = tmp[i];
        }
        for (int64_t i = 0; i < dv; i++) vi->to_f32(vb->data + (size_t)(h * dv + i) * vb_row, out + (size_t)((dn + i) * r), (size_t)r);
    }
    free(tmp);
    char name[128];
    snprintf(name, sizeof name, "model.layers.%d.self_attn.kv_b_proj.weight", l);
    kiln_tensor t = {.name = name, .dtype = KILN_DT_F32, .ndim = 2, .shape = {H * (dn + dv), r}, .data = (const uint8_t *)kv,
                     .nbytes = (uint64_t)(H * (dn + dv) * r) * 4, .file = kb->file, .offset = kb->offset};
    return kiln_tt_add(&m->tt, &t);
}

/* glm4: a fused attn_qkv [(H + 2·KV)·hd, dim] (or its bias) as three row views q / k / v. */
static kiln_status split_qkv(struct kiln_model *m, const char *file, int l, const kiln_tensor *t, int weight) {
    const kiln_hparams *hp = &m->hp;
    const int64_t rows[3] = {(int64_t)hp->n_heads * hp->head_dim, (int64_t)hp->n_kv_heads * hp->head_dim, (int64_t)hp->n_kv_heads * hp->head_dim};
    const int64_t total = rows[0] + rows[1] + rows[2];
    if (t->ndim != (weight ? 2 : 1) || t->shape[0] != total)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has %lld rows; heads and key_length imply %lld (q, k, v)", file, t->name, (long long)t->shape[0],
                         (long long)total);
    const uint64_t row_bytes = t->nbytes / (uint64_t)total;
    uint64_t off = 0;
    static const char *const part[3] = {"q", "k", "v"};
    for (int p = 0; p < 3; p++) {
        char hf[128];
        snprintf(hf, sizeof hf, "model.layers.%d.self_attn.%s_proj.%s", l, part[p], weight ? "weight" : "bias");
        kiln_tensor v = *t;
        v.name = hf;
        v.shape[0] = rows[p];
        v.data = t->data + off;
        v.offset = t->offset + off;
        v.nbytes = row_bytes * (uint64_t)rows[p];
        off += v.nbytes;
        KILN_TRY(kiln_tt_add(&m->tt, &v));
    }
    return KILN_OK;
}

/* chatglm: separate attn_q / attn_k / attn_v (weights or biases, one type) joined into the fused
 * query_key_value kiln's chatglm row binds (rows q, then k, then v). */
static kiln_status fuse_qkv(struct kiln_model *m, const char *file, int l, const kiln_tensor *const *p3, int bias) {
    static const char *const part[3] = {"attn_q", "attn_k", "attn_v"};
    uint64_t bytes = 0;
    int64_t rows = 0;
    for (int p = 0; p < 3; p++) {
        if (!p3[p])
            return kiln_fail(KILN_ERR_FORMAT, "%s: layer %d has some of attn_q / attn_k / attn_v but not 'blk.%d.%s.%s'", file, l, l, part[p],
                             bias ? "bias" : "weight");
        if (p3[p]->dtype != p3[0]->dtype || p3[p]->ndim != p3[0]->ndim || (p3[p]->ndim == 2 && p3[p]->shape[1] != p3[0]->shape[1]))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' differs in type or width from '%s'; chatglm needs them fused in one tensor", file,
                             p3[p]->name, p3[0]->name);
        bytes += p3[p]->nbytes;
        rows += p3[p]->shape[0];
    }
    uint8_t *buf = kiln_model_own(m, malloc((size_t)bytes));
    if (!buf) return kiln_fail_oom(file, "fused query_key_value", (unsigned long long)bytes);
    uint64_t off = 0;
    for (int p = 0; p < 3; p++) {
        memcpy(buf + off, p3[p]->data, p3[p]->nbytes);
        off += p3[p]->nbytes;
    }
    char hf[128];
    snprintf(hf, sizeof hf, "transformer.encoder.layers.%d.self_attention.query_key_value.%s", l, bias ? "bias" : "weight");
    kiln_tensor v = *p3[0];
    v.name = hf;
    v.shape[0] = rows;
    v.data = buf;
    v.nbytes = bytes;
    return kiln_tt_add(&m->tt, &v);
}

/* The tensors of `raw` into m->tt with Hugging Face names (experts split, kv_b rebuilt, q/k/v
 * split or joined as the row binds them). */
static kiln_status read_tensors(struct kiln_model *m, const family *F, const kiln_tensor_table *raw, const char *file) {
    kiln_arch_model *am = m->arch_state;
    const int n_all = m->hp.n_layers + am->hp.n_nextn;
    const int E = am->hp.moe.n_experts;
    const kiln_tensor **kb = calloc((size_t)n_all, sizeof *kb), **vb = calloc((size_t)n_all, sizeof *vb);
    const kiln_tensor **qkv_parts = calloc((size_t)n_all * 6, sizeof *qkv_parts); /* chatglm: [layer][w q,k,v | b q,k,v] */
    if (!kb || !vb || !qkv_parts) {
        free(kb);
        free(vb);
        free(qkv_parts);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    kiln_status st = KILN_OK;
    for (int i = 0; i < raw->n && st == KILN_OK; i++) {
        const kiln_tensor *t = &raw->v[i];
        const char *rest;
        const int l = blk_layer(t->name, &rest);
        char hf[192];
        if (l >= n_all) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is past the %d layers of %s.block_count", file, t->name, n_all, F->arch);
            break;
        }
        if (l >= 0 && F->kind == FAM_MLA && (!strcmp(rest, "attn_k_b.weight") || !strcmp(rest, "attn_v_b.weight"))) {
            (rest[5] == 'k' ? kb : vb)[l] = t;
            continue;
        }
        if (l >= 0 && F->kind == FAM_GLM4 && (!strcmp(rest, "attn_qkv.weight") || !strcmp(rest, "attn_qkv.bias"))) {
            st = split_qkv(m, file, l, t, rest[9] == 'w');
            continue;
        }
        if (l >= 0 && F->kind == FAM_CHATGLM && rest[0] == 'a' && (!strncmp(rest, "attn_q.", 7) || !strncmp(rest, "attn_k.", 7) || !strncmp(rest, "attn_v.", 7))) {
            const int part = rest[5] == 'q' ? 0 : rest[5] == 'k' ? 1 : 2, bias = !strcmp(rest + 7, "bias");
            if (!bias && strcmp(rest + 7, "weight") != 0) continue;
            qkv_parts[(size_t)l * 6 + (size_t)(bias * 3 + part)] = t;
            continue;
        }
        int p = -1;
        for (int k = 0; l >= 0 && k < 3; k++) {
            char want[32];
            snprintf(want, sizeof want, "ffn_%s_exps.weight", expert_proj[k]);
            if (strcmp(rest, want) == 0) p = k;
        }
        if (p >= 0) { /* [E, rows, cols] → E views */
            if (t->ndim != 3 || t->shape[0] != E) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' holds %lld experts (%d dims) but metadata '%s.expert_count' = %d", file, t->name,
                               t->ndim == 3 ? (long long)t->shape[0] : 0LL, t->ndim, F->arch, E);
                break;
            }
            const uint64_t per = t->nbytes / (uint64_t)E;
            for (int e = 0; e < E && st == KILN_OK; e++) {
                snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, expert_proj[p]);
                kiln_tensor v = *t;
                v.name = hf;
                v.ndim = 2;
                v.shape[0] = t->shape[1];
                v.shape[1] = t->shape[2];
                v.shape[2] = 0;
                v.data = t->data + per * (uint64_t)e;
                v.offset = t->offset + per * (uint64_t)e;
                v.nbytes = per;
                st = kiln_tt_add(&m->tt, &v);
            }
            continue;
        }
        if (!kiln_gguf_rename_table(F->names, F->n_names, t->name, 1, hf, sizeof hf)) continue; /* not used by kiln (rope_freqs ...) */
        kiln_tensor v = *t;
        v.name = hf;
        st = kiln_tt_add(&m->tt, &v);
    }
    for (int l = 0; l < n_all && st == KILN_OK; l++) {
        if (!kb[l] && !vb[l]) continue;
        if (!kb[l] || !vb[l]) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: layer %d has tensor 'blk.%d.attn_%s_b.weight' but not its partner 'blk.%d.attn_%s_b.weight'", file, l, l,
                           kb[l] ? "k" : "v", l, kb[l] ? "v" : "k");
            break;
        }
        st = rebuild_kv_b(m, file, l, kb[l], vb[l]);
    }
    for (int l = 0; l < n_all && st == KILN_OK; l++)
        for (int bias = 0; bias < 2 && st == KILN_OK; bias++)
            if (qkv_parts[(size_t)l * 6 + (size_t)bias * 3] || qkv_parts[(size_t)l * 6 + (size_t)bias * 3 + 1])
                st = fuse_qkv(m, file, l, qkv_parts + (size_t)l * 6 + (size_t)bias * 3, bias);
    free(kb);
    free(vb);
    free(qkv_parts);
    return st;
}

kiln_status kiln_gguf_arch_load(struct kiln_model *m, const char *path, const kiln_tensor_table *raw, const char *gguf_arch) {
    const family *F = family_of(gguf_arch);
    if (!F) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: general.architecture '%s' is not supported (known: llama, deepseek2, glm-dsa, deepseek32, glm4moe, glm4, chatglm)", path, gguf_arch);
    meta M = {.g = m->gguf, .file = path, .arch = F->arch};
    json_t *cfg = json_object();
    if (!cfg) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    m->config = cfg; /* freed with the model; `kiln convert FILE.gguf DIR` writes it as config.json */
    KILN_TRY(refuse_keys(&M));
    KILN_TRY(F->kind == FAM_MLA       ? deepseek2_config(&M, raw, cfg, F->dsa)
             : F->kind == FAM_CHATGLM ? chatglm_config(&M, raw, cfg)
                                      : glm_gqa_config(&M, raw, cfg, F->kind == FAM_GQA_MOE));
    m->arch = kiln_arch_find(json_string_value(json_object_get(cfg, "model_type")), NULL);
    if (!m->arch) return kiln_fail(KILN_ERR_INTERNAL, "%s: no architecture row for %s", path, gguf_arch);
    snprintf(m->hp.arch, sizeof m->hp.arch, "%s", m->arch->name);
    KILN_TRY(m->arch->read_hparams(m, cfg, path));
    KILN_TRY(read_tensors(m, F, raw, path));
    const char *tm;
    if (kiln_gguf_get_str(m->gguf, "tokenizer.ggml.model", &tm, NULL) == 0) KILN_TRY(kiln_tok_load_gguf(m->gguf, &m->tok));
    if (m->tok) {
        if (m->hp.bos_id < 0) m->hp.bos_id = kiln_tok_bos(m->tok);
        if (m->hp.eos_id < 0) m->hp.eos_id = kiln_tok_eos(m->tok);
    }
    return KILN_OK;
}

/* ---- writing ------------------------------------------------------------------------------------ */

typedef struct {
    kiln_gguf_writer *w;
    const char *path;
    kiln_dtype to;               /* --outtype block type, or KILN_DT_COUNT = as stored */
    void **own;                  /* buffers to free after the write */
    int n_own, cap_own;
} writer;

static void *keep(writer *W, void *p) {
    if (!p) return NULL;
    if (W->n_own == W->cap_own) {
        int cap = W->cap_own ? 2 * W->cap_own : 64;
        void **o = realloc(W->own, (size_t)cap * sizeof *o);
        if (!o) {
            free(p);
            return NULL;
        }
        W->own = o;
        W->cap_own = cap;
    }
    return W->own[W->n_own++] = p;
}

/* Adds one tensor, encoded to --outtype where llama.cpp's converter would quantize it (2-D and
 * stacked 3-D weights), F32 where it keeps F32 for every file type (routers, norms, biases:
 * kiln_gguf_keeps_f32). */
static kiln_status put(writer *W, const char *name, kiln_dtype dt, int ndim, const int64_t *shape, const void *data, uint64_t nbytes) {
    kiln_tensor t = {.name = (char *)name, .dtype = dt, .ndim = ndim, .data = data, .nbytes = nbytes};
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    uint8_t *enc = NULL;
    uint64_t nb = 0;
    kiln_status st = KILN_OK;
    const int k = kiln_export_gguf_encode(&t, name, W->to, &enc, &nb, &st);
    KILN_TRY(st);
    if (k) {
        if (!keep(W, enc)) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        kiln_gguf_add_tensor(W->w, name, k == 2 ? KILN_DT_F32 : W->to, ndim, shape, enc, nb);
    } else {
        kiln_gguf_add_tensor(W->w, name, dt, ndim, shape, data, nbytes);
    }
    return KILN_OK;
}

/* The Hugging Face name without the multimodal wrapper's "language_model." (Kimi K2.5). */
static const char *hf_base(const char *name) { return strncmp(name, "language_model.", 15) == 0 ? name + 15 : name; }

/* model.layers.L.mlp.experts.e.P_proj.weight → L, e, P (index into expert_proj); 0 when not an expert */
static int expert_of(const char *name, int *l, int *e) {
    int n = 0;
    char proj[8];
    if (sscanf(name, "model.layers.%d.mlp.experts.%d.%7[a-z]_proj.weight%n", l, e, proj, &n) != 3 || name[n] != 0) return 0;
    for (int k = 0; k < 3; k++)
        if (!strcmp(proj, expert_proj[k])) return k + 1;
    return 0;
}

/* blk.L.ffn_P_exps.weight [E, rows, cols]: the E experts' bytes one after another (one dtype and shape). */
static kiln_status put_experts(writer *W, const struct kiln_model *m, const char *pre, int l, int p, int E) {
    char name[192], gname[96];
    const kiln_tensor *first = NULL;
    uint8_t *buf = NULL;
    for (int e = 0; e < E; e++) {
        snprintf(name, sizeof name, "%smodel.layers.%d.mlp.experts.%d.%s_proj.weight", pre, l, e, expert_proj[p]);
        const kiln_tensor *t = kiln_tt_find(&m->tt, name);
        if (!t) return kiln_fail(KILN_ERR_FORMAT, "%s: expert tensor '%s' is missing (stacking %d experts)", W->path, name, E);
        if (!first) {
            first = t;
            buf = keep(W, malloc((size_t)t->nbytes * (size_t)E));
            if (!buf) return kiln_fail(KILN_ERR_NOMEM, "out of memory stacking '%s' (%d experts)", name, E);
        } else if (t->dtype != first->dtype || t->ndim != 2 || t->shape[0] != first->shape[0] || t->shape[1] != first->shape[1] ||
                   t->nbytes != first->nbytes) {
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: expert tensor '%s' differs in type or shape from expert 0; GGUF stacks a layer's experts in one tensor",
                             W->path, name);
        }
        memcpy(buf + (size_t)e * t->nbytes, t->data, t->nbytes);
    }
    const int64_t shape[3] = {E, first->shape[0], first->shape[1]};
    snprintf(gname, sizeof gname, "blk.%d.ffn_%s_exps.weight", l, expert_proj[p]);
    return put(W, gname, first->dtype, 3, shape, buf, first->nbytes * (uint64_t)E);
}

/* kv_b_proj [H·(dn + dv), r] → blk.L.attn_k_b [H, r, dn] (key rows transposed per head) and
 * blk.L.attn_v_b [H, dv, r]; 16/32-bit floats keep their type, block types go through F32. */
static kiln_status put_kv_b(writer *W, const kiln_tensor *t, int l, const kiln_mla_cfg *c, int H) {
    const int64_t r = c->kv_lora_rank, dn = c->qk_nope, dv = c->v_head;
    if (t->ndim != 2 || t->shape[0] != H * (dn + dv) || t->shape[1] != r)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is not [%lld, %lld]", W->path, t->name, (long long)(H * (dn + dv)), (long long)r);
    const kiln_dtype_info *di = kiln_dtype_get(t->dtype);
    const int keep_type = di->block_elems == 1 && (t->dtype == KILN_DT_F32 || t->dtype == KILN_DT_F16 || t->dtype == KILN_DT_BF16);
    const kiln_dtype dt = keep_type ? t->dtype : KILN_DT_F32;
    const size_t es = dt == KILN_DT_F32 ? 4 : 2, in_row = (size_t)(t->nbytes / (uint64_t)t->shape[0]);
    uint8_t *kb = keep(W, malloc((size_t)(H * r * dn) * es)), *vbuf = keep(W, malloc((size_t)(H * dv * r) * es));
    float *row = malloc((size_t)r * sizeof *row);
    if (!kb || !vbuf || !row) {
        free(row);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory splitting '%s'", t->name);
    }
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < dn + dv; i++) {
            const uint8_t *src = t->data + (size_t)(h * (dn + dv) + i) * in_row;
            if (!keep_type) di->to_f32(src, row, (size_t)r);
            for (int64_t j = 0; j < r; j++) {
                const void *el = keep_type ? (const void *)(src + (size_t)j * es) : (const void *)&row[j];
                uint8_t *dst = i < dn ? kb + ((size_t)(h * r + j) * (size_t)dn + (size_t)i) * es
                                      : vbuf + ((size_t)(h * dv + (i - dn)) * (size_t)r + (size_t)j) * es;
                memcpy(dst, el, es);
            }
        }
    free(row);
    char gname[64];
    const int64_t ks[3] = {H, r, dn}, vs[3] = {H, dv, r};
    snprintf(gname, sizeof gname, "blk.%d.attn_k_b.weight", l);
    KILN_TRY(put(W, gname, dt, 3, ks, kb, (uint64_t)(H * r * dn) * es));
    snprintf(gname, sizeof gname, "blk.%d.attn_v_b.weight", l);
    return put(W, gname, dt, 3, vs, vbuf, (uint64_t)(H * dv * r) * es);
}

static void set_u(writer *W, const char *arch, const char *suffix, uint64_t v) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    kiln_gguf_set_u32(W->w, key, (uint32_t)v);
}
static void set_f(writer *W, const char *arch, const char *suffix, double v) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    kiln_gguf_set_f32(W->w, key, (float)v);
}

kiln_status kiln_gguf_arch_save(const struct kiln_model *m, const char *path, kiln_dtype to) {
    const kiln_arch_model *am = m->arch_state;
    const kiln_arch_hp *ah = &am->hp;
    const kiln_hparams *hp = &m->hp;
    const char *name = m->arch->name;
    const int mla = ah->attn == KILN_ATTN_MLA;
    const int dsa = mla && ah->mla.dsa;
    const int glm4 = !strcmp(name, "glm4"), chatglm = !strcmp(name, "chatglm"), moe = ah->n_moe_layers > 0 || !strcmp(name, "glm4_moe") || mla;
    const int ds32 = dsa && !strcmp(name, "deepseek_v32");
    if (strcmp(name, "glm4_moe") != 0 && !mla && !glm4 && !chatglm)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: architecture '%s' has no GGUF writer (llama, deepseek_v3, kimi_k2, glm4_moe_lite, glm_moe_dsa, glm4_moe, glm4, "
                         "chatglm)", path, name);
    if (dsa && !ds32 && ah->mla.idx_rope.style != KILN_ROPE_NORM)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: indexer_rope_interleave = false: llama.cpp's glm-dsa ropes the indexer in adjacent pairs only", path);
    if (ds32 && ah->mla.idx_rope.style != KILN_ROPE_NEOX)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: indexer_rope_interleave = true: llama.cpp's deepseek32 ropes the indexer NEOX only", path);
    if (dsa && ah->mla.q_lora_rank == 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: q_lora_rank is null: llama.cpp's %s needs the q_a / q_b projections (the indexer reads q_a's output)",
                         path, ds32 ? "deepseek32" : "glm-dsa");
    for (int l = 0; ds32 && l < hp->n_layers; l++)
        if (!ah->idx_full[l])
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: layer %d shares another layer's indexer: llama.cpp's deepseek32 has an indexer on every layer", path, l);
    const family *F = family_of(ds32 ? "deepseek32" : dsa ? "glm-dsa" : mla ? "deepseek2" : glm4 ? "glm4" : chatglm ? "chatglm" : "glm4moe");
    const char *A = F->arch;
    /* what llama.cpp has no key for */
    int lead = 0;
    if (moe) {
        while (lead < hp->n_layers && !ah->is_moe[lead]) lead++;
        for (int l = lead; l < hp->n_layers; l++)
            if (!ah->is_moe[l])
                return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: layer %d is dense after MoE layers; GGUF (%s.leading_dense_block_count) has dense layers only "
                                 "as a leading block", path, l, A);
    }
    /* llama.cpp's rope types: NORM (adjacent pairs) for deepseek2 / glm-dsa / glm4 / chatglm, NEOX for glm4moe */
    if (hp->rope_style != (F->kind == FAM_GQA_MOE ? KILN_ROPE_NEOX : KILN_ROPE_NORM))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the model's RoPE pair layout is not the one llama.cpp's %s rotates", path, A);
    if (ah->yarn.enabled && !mla) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: rope_scaling (YaRN) has no %s GGUF keys", path, A);
    if (ah->yarn.enabled && ah->yarn.factor > 1.0f && ah->yarn.mscale != ah->yarn.mscale_all_dim)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: rope_scaling.mscale = %g differs from mscale_all_dim = %g: llama.cpp's deepseek2 has one "
                         "rope.scaling.yarn_log_multiplier (mscale = mscale_all_dim)", path, (double)ah->yarn.mscale, (double)ah->yarn.mscale_all_dim);
    if (ah->yarn.enabled && ah->yarn.attention_factor != 0.0f)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: rope_scaling.attention_factor has no deepseek2 GGUF key", path);
    if (chatglm && hp->n_heads * hp->head_dim != hp->dim)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: chatglm: llama.cpp's chatglm needs num_attention_heads × kv_channels = hidden_size (%d × %d != %d)", path,
                         hp->n_heads, hp->head_dim, hp->dim);
    if (chatglm && hp->rotary_dim != hp->head_dim / 2)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: chatglm rotates kv_channels / 2 dims in llama.cpp; this model rotates %d of %d", path, hp->rotary_dim,
                         hp->head_dim);
    writer W = {.w = kiln_gguf_writer_new(), .path = path, .to = to};
    if (!W.w) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    const kiln_moe_cfg *mc = &ah->moe;
    /* deepseek2: MTP layers dropped, as its converter does; glm4moe and glm-dsa keep them */
    const int n_layers_out = hp->n_layers + (mla && !dsa ? 0 : ah->n_nextn);
    kiln_gguf_set_str(W.w, "general.architecture", A);
    kiln_gguf_set_str(W.w, "general.name", "kiln export");
    if (to == KILN_DT_Q8_0 || to == KILN_DT_Q4_0) kiln_gguf_set_u32(W.w, "general.file_type", to == KILN_DT_Q8_0 ? 7 : 2);
    set_u(&W, A, "context_length", (uint64_t)hp->max_seq);
    set_u(&W, A, "embedding_length", (uint64_t)hp->dim);
    set_u(&W, A, "feed_forward_length", (uint64_t)hp->ffn_dim);
    set_u(&W, A, "block_count", (uint64_t)n_layers_out);
    set_u(&W, A, "attention.head_count", (uint64_t)hp->n_heads);
    set_u(&W, A, "attention.head_count_kv", mla ? 1u : (uint64_t)hp->n_kv_heads);
    set_f(&W, A, "rope.freq_base", hp->rope_theta);
    set_f(&W, A, "attention.layer_norm_rms_epsilon", hp->norm_eps);
    set_u(&W, A, "vocab_size", (uint64_t)hp->vocab);
    char key[160];
    if (moe) {
        set_u(&W, A, "expert_count", (uint64_t)mc->n_experts);
        set_u(&W, A, "expert_used_count", (uint64_t)mc->n_used);
        set_u(&W, A, "expert_shared_count", (uint64_t)ah->n_shared);
        set_u(&W, A, "expert_feed_forward_length", (uint64_t)mc->ffn);
        set_u(&W, A, "leading_dense_block_count", (uint64_t)lead);
        set_f(&W, A, "expert_weights_scale", mc->routed_scale);
        snprintf(key, sizeof key, "%s.expert_weights_norm", A);
        kiln_gguf_set_bool(W.w, key, mc->norm_topk_prob);
        set_u(&W, A, "expert_gating_func", 2); /* LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID */
        if (mc->n_group > 1 && mc->topk_group < mc->n_group) { /* llama.cpp asserts group_used < groups; equal = no limit */
            set_u(&W, A, "expert_group_count", (uint64_t)mc->n_group);
            set_u(&W, A, "expert_group_used_count", (uint64_t)mc->topk_group);
        }
    }
    if (mla) {
        const kiln_mla_cfg *c = &ah->mla;
        if (c->q_lora_rank > 0) set_u(&W, A, "attention.q_lora_rank", (uint64_t)c->q_lora_rank);
        set_u(&W, A, "attention.kv_lora_rank", (uint64_t)c->kv_lora_rank);
        set_u(&W, A, "attention.key_length", (uint64_t)(c->kv_lora_rank + c->qk_rope)); /* the MQA view of the latent */
        set_u(&W, A, "attention.value_length", (uint64_t)c->kv_lora_rank);
        set_u(&W, A, "attention.key_length_mla", (uint64_t)(c->qk_nope + c->qk_rope));
        set_u(&W, A, "attention.value_length_mla", (uint64_t)c->v_head);
        set_u(&W, A, "rope.dimension_count", (uint64_t)c->qk_rope);
        if (ah->yarn.enabled) {
            snprintf(key, sizeof key, "%s.rope.scaling.type", A);
            kiln_gguf_set_str(W.w, key, "yarn");
            set_f(&W, A, "rope.scaling.factor", ah->yarn.factor);
            set_u(&W, A, "rope.scaling.original_context_length", (uint64_t)ah->yarn.orig_ctx);
            set_f(&W, A, "rope.scaling.yarn_log_multiplier", 0.1 * (double)ah->yarn.mscale_all_dim);
            set_f(&W, A, "rope.scaling.yarn_beta_fast", ah->yarn.beta_fast);
            set_f(&W, A, "rope.scaling.yarn_beta_slow", ah->yarn.beta_slow);
        }
        if (dsa) {
            set_u(&W, A, "attention.indexer.head_count", (uint64_t)c->idx_heads);
            set_u(&W, A, "attention.indexer.key_length", (uint64_t)c->idx_dim);
            set_u(&W, A, "attention.indexer.top_k", (uint64_t)c->idx_topk);
            set_u(&W, A, "nextn_predict_layers", (uint64_t)ah->n_nextn);
        }
        if (dsa && !ds32) { /* glm-dsa's per-layer full / shared indexers (deepseek32: every layer full, no key) */
            int32_t *types = malloc((size_t)hp->n_layers * sizeof *types);
            if (!types) {
                kiln_gguf_writer_free(W.w);
                return kiln_fail(KILN_ERR_NOMEM, "out of memory");
            }
            for (int l = 0; l < hp->n_layers; l++) types[l] = ah->idx_full[l] ? 1 : 0;
            snprintf(key, sizeof key, "%s.attention.indexer.types", A);
            kiln_gguf_set_arr_i32(W.w, key, types, (uint64_t)hp->n_layers);
            free(types);
        }
    } else {
        set_u(&W, A, "attention.key_length", (uint64_t)hp->head_dim);
        set_u(&W, A, "attention.value_length", (uint64_t)hp->head_dim);
        set_u(&W, A, "rope.dimension_count", (uint64_t)hp->rotary_dim);
        set_u(&W, A, "nextn_predict_layers", (uint64_t)ah->n_nextn);
    }
    if (m->tok) kiln_tok_save_gguf(m->tok, W.w);
    const char *pre = kiln_tt_find(&m->tt, "language_model.model.embed_tokens.weight") ? "language_model." : "";
    kiln_status st = KILN_OK;
    for (int i = 0; i < m->tt.n && st == KILN_OK; i++) {
        const kiln_tensor *t = &m->tt.v[i];
        const char *hf = hf_base(t->name);
        int l = -1, e = -1;
        const int p = expert_of(hf, &l, &e);
        if (l < 0) sscanf(hf, "model.layers.%d.", &l);
        if (l >= n_layers_out) continue; /* deepseek2: MTP layers are not written */
        if (p) {
            if (e == 0) st = put_experts(&W, m, pre, l, p - 1, mc->n_experts);
            continue;
        }
        if (mla && l >= 0 && strstr(hf, ".self_attn.kv_b_proj.weight")) {
            st = put_kv_b(&W, t, l, &ah->mla, hp->n_heads);
            continue;
        }
        if (strstr(hf, "rotary_pos_emb.inv_freq")) continue; /* chatglm: derived from the config, not written by llama.cpp's converter */
        char gname[192];
        if (!kiln_gguf_rename_table(F->names, F->n_names, hf, 0, gname, sizeof gname)) {
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has no GGUF %s name", path, t->name, A);
            break;
        }
        st = put(&W, gname, t->dtype, t->ndim, t->shape, t->data, t->nbytes);
    }
    if (st == KILN_OK) st = kiln_gguf_write(W.w, path);
    kiln_gguf_writer_free(W.w);
    for (int i = 0; i < W.n_own; i++) free(W.own[i]);
    free(W.own);
    return st;
}
