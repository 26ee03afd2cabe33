/* arch_llama.c — the llama row of the architecture table (model/arch.h): LlamaForCausalLM from
 * config.json, and every llama2.c and GGUF llama checkpoint, whose loaders (model/load_llama2c.c,
 * model/load_gguf.c) fill m->hp themselves and rename tensors to the Hugging Face names:
 *   model.embed_tokens [vocab, dim], model.norm, lm_head (or tied to the embedding)
 *   model.layers.N.{input_layernorm, post_attention_layernorm} [dim]
 *   model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,down}_proj
 * RoPE over hp->rotary_dim dims of each head in hp->rope_style pairs (NEOX for Hugging Face, NORM
 * for llama2.c / GGUF), frequency theta^(-2i/rot), no scaling; softmax scale 1/sqrt(head_dim). */
#include "model/arch.h"
#include "base/status.h"
#include "format/hfconfig.h"
#include "model/hparams_check.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* config.json of LlamaForCausalLM, with transformers' LlamaConfig defaults: rms_norm_eps 1e-6,
 * num_key_value_heads = num_attention_heads, head_dim = hidden_size / heads, rope_theta 10000,
 * float32 without torch_dtype; NEOX pairs over the whole head. */
static kiln_status llama_read(struct kiln_model *m, json_t *cfg, const char *file) {
    kiln_hparams *hp = &m->hp;
    KILN_TRY(kiln_arch_read_common(m, cfg, file, "rms_norm_eps", 1e-6, KILN_DT_F32));
    KILN_TRY(kiln_cfg_int(cfg, file, "intermediate_size", 1, 1 << 22, &hp->ffn_dim));
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "num_key_value_heads", 1, 4096, hp->n_heads, &hp->n_kv_heads));
    if (hp->n_heads % hp->n_kv_heads)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'num_attention_heads' = %d is not a multiple of 'num_key_value_heads' = %d",
                         file, hp->n_heads, hp->n_kv_heads);
    int def_hd = hp->dim % hp->n_heads == 0 ? hp->dim / hp->n_heads : 0;
    KILN_TRY(kiln_cfg_int_opt(cfg, file, "head_dim", 2, 1 << 16, def_hd, &hp->head_dim));
    if (hp->head_dim <= 0 || hp->head_dim % 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'head_dim' = %d (or hidden_size / num_attention_heads) must be a positive even number", file, hp->head_dim);
    double theta;
    KILN_TRY(kiln_cfg_num_opt(cfg, file, "rope_theta", 1, 1e12, 10000.0, &theta));
    hp->rope_theta = (float)theta;
    hp->rope_style = KILN_ROPE_NEOX;
    hp->rotary_dim = hp->head_dim;
    return kiln_hparams_check(hp, file, &kiln_hparam_keys_hf);
}

/* Attention and RoPE settings of the shared forward pass from m->hp (whichever loader filled it). */
static kiln_status llama_hp(struct kiln_model *m) {
    kiln_hparams *hp = &m->hp;
    kiln_arch_model *am = m->arch_state ? m->arch_state : kiln_arch_state_new(m);
    if (!am) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_arch_hp *ah = &am->hp;
    snprintf(ah->prefix, sizeof ah->prefix, "model.");
    ah->attn = KILN_ATTN_GQA;
    ah->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    KILN_TRY(kiln_rope_init(&ah->rope, hp->rotary_dim, hp->rope_theta, hp->rope_style, NULL));
    hp->kv_v_dim = hp->head_dim;
    hp->kv_v_shares_k = 0;
    return KILN_OK;
}

static kiln_status llama_bind(struct kiln_model *m) {
    const kiln_hparams *hp = &m->hp;
    KILN_TRY(llama_hp(m));
    kiln_arch_model *am = m->arch_state;
    KILN_TRY(kiln_arch_bind_ends(m, "model.embed_tokens.weight", "model.norm.weight", "lm_head"));
    KILN_TRY(kiln_arch_layers_new(m, am));
    char n[160];
#define P(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
    for (int l = 0; l < hp->n_layers; l++) {
        kiln_arch_layer *L = &am->layers[l];
        KILN_TRY(kiln_arch_vec(m, P("input_layernorm.weight"), hp->dim, &L->attn_norm));
        KILN_TRY(kiln_arch_vec(m, P("post_attention_layernorm.weight"), hp->dim, &L->ffn_norm));
        KILN_TRY(kiln_arch_bind_self_attn(m, P("self_attn."), L));
        KILN_TRY(kiln_arch_bind_mlp(m, P("mlp."), hp->ffn_dim, L));
    }
#undef P
    if (m->tok && kiln_tok_vocab_size(m->tok) > hp->vocab)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tokenizer has %d tokens but the model's vocab_size is %d", m->path,
                         kiln_tok_vocab_size(m->tok), hp->vocab);
    return KILN_OK;
}

/* GGUF name ↔ HF name, for per-layer (%d) and global tensors. */
static const char *const gguf_names[][2] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight"},
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight"},
    {"blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight"},
    {"blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight"},
    {"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight"},
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight"},
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight"},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight"},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight"},
};

const kiln_arch kiln_arch_llama = {"llama", {"llama"}, {"LlamaForCausalLM"}, llama_read, llama_bind, kiln_mkmodel_llama,
                                   "llama", gguf_names, (int)(sizeof gguf_names / sizeof *gguf_names)};
