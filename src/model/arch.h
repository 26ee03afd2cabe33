/* arch.h — the architecture table: llama, the GLM and the Kimi/DeepSeek families.
 *
 * Each row maps Hugging Face config.json model_type values to: a hyper-parameter reader (validated
 * reads of the official config fields), a binder (the official tensor names, every shape checked,
 * every linear weight through kiln_bind_linear so BF16 / FP8-block / INT4 compressed-tensors all
 * work), and a synthetic-checkpoint writer (`kiln mkmodel --arch NAME`). All rows share one forward
 * pass (model/forward.c, over backend ops) built from blocks: GQA attention (optionally fused QKV, biases, per-head
 * q/k RMSNorm, partial rotary in either pair layout) or MLA (mla.c); dense SwiGLU MLP (optionally
 * fused gate_up) or MoE (moe.c); optional post-attention / post-MLP norms (GLM-4).
 *
 *   name           model_type values                 file
 *   llama          llama (LlamaForCausalLM); llama2.c and GGUF llama files   arch_llama.c
 *   chatglm        chatglm                           arch_glm.c     GLM-4-9B remote-code layout
 *   glm4           glm4                              arch_glm.c     Glm4ForCausalLM
 *   glm4_moe       glm4_moe                          arch_glm4_moe.c GLM-4.5 / 4.6 / 4.7
 *   deepseek_v3    deepseek_v3                       arch_deepseek.c
 *   kimi_k2        kimi_k2, kimi_k25 (text_config)   arch_deepseek.c
 *   glm4_moe_lite  glm4_moe_lite                     arch_deepseek.c GLM-4.7-Flash
 *   deepseek_v32   deepseek_v32                      arch_deepseek.c DeepSeek-V3.2 (sparse attention, mla.h)
 *   glm_moe_dsa    glm_moe_dsa                       arch_deepseek.c GLM-5 / 5.1 / 5.2 (sparse attention)
 * llama2.c and GGUF llama files have no config.json: their loaders fill m->hp and the llama row
 * binds them like any other (the GGUF loader renames tensors to the Hugging Face names). */
#ifndef KILN_MODEL_ARCH_H
#define KILN_MODEL_ARCH_H
#include "model/forward.h"
#include "model/mla.h"
#include "model/moe.h"
#include "backend/rope.h"
#include <jansson.h>

typedef enum { KILN_ATTN_GQA = 0, KILN_ATTN_MLA = 1 } kiln_attn_kind;

/* Architecture hyper-parameters beyond kiln_hparams (m->hp keeps the common ones). */
typedef struct kiln_arch_hp {
    kiln_attn_kind attn;
    char prefix[48];          /* layer/embedding prefix: "model.", "transformer.", "language_model.model." */
    /* GQA */
    int qkv_fused;            /* chatglm: self_attention.query_key_value [(H + 2·KV)·hd, dim] */
    int attn_bias;            /* biases on q, k, v */
    int qk_norm;              /* glm4_moe use_qk_norm: RMSNorm over each head of q and k (before RoPE) */
    int post_norms;           /* glm4: post_self_attn_layernorm, post_mlp_layernorm */
    int ffn_fused;            /* gate and up in one [2·ffn, dim] matrix, gate rows first */
    kiln_rope rope;
    kiln_yarn yarn;
    float attn_scale;         /* softmax scale */
    /* MLA */
    kiln_mla_cfg mla;
    /* MoE */
    kiln_moe_cfg moe;
    int n_shared;             /* n_shared_experts */
    unsigned char *is_moe;    /* [n_layers] */
    int n_moe_layers;
    int n_nextn;              /* num_nextn_predict_layers: MTP layers stored after the last layer, not run */
    int mtp_checked;          /* kiln_arch_check_mtp checked their shapes */
    /* DSA (deepseek_v32, glm_moe_dsa): [n_layers] 1 = the layer runs its own indexer ("full"),
     * 0 = it reuses the previous full layer's selection ("shared"); NULL for the other rows */
    unsigned char *idx_full;
} kiln_arch_hp;

typedef struct kiln_arch_layer {
    const float *attn_norm, *ffn_norm;         /* [dim] */
    const float *post_attn_norm, *post_ffn_norm; /* [dim] (glm4) or NULL */
    /* GQA */
    kiln_weight wqkv;                          /* fused (chatglm) */
    kiln_weight wq, wk, wv, wo;                /* [H·hd, dim] [KV·hd, dim] [KV·hd, dim] [dim, H·hd] */
    const float *bq, *bk, *bv;                 /* [H·hd] [KV·hd] [KV·hd] or NULL */
    const float *q_norm, *k_norm;              /* [hd] or NULL */
    /* MLA */
    kiln_mla_layer mla;
    /* dense FFN */
    kiln_weight w_gate_up, w_gate, w_up, w_down;
    /* MoE */
    int is_moe;
    kiln_weight *exp_w;                        /* [3·E]: gate[E], up[E], down[E] */
    kiln_moe_layer moe;
} kiln_arch_layer;

/* A multi-token-prediction layer (num_nextn_predict_layers; DeepSeek-V3's MTP module as vLLM and
 * SGLang run it): for the target's last hidden state h_j of position j and the token t_{j+1},
 *   x = eh_proj([enorm(embed(t_{j+1})) | hnorm(h_j)])     eh_proj [dim, 2·dim]
 *   x = block(x) at position j (its own KV), logits = head(head_norm(x)) predict t_{j+2};
 * x (before head_norm) is the hidden state of the next chained step. */
typedef struct kiln_mtp_layer {
    kiln_arch_layer L;                         /* the decoder block (attention + MoE / MLP) */
    kiln_weight eh;                            /* [dim, 2·dim] */
    const float *enorm, *hnorm, *head_norm;    /* [dim] */
    kiln_weight embed;                         /* [vocab, dim]: its own embed_tokens, or the model's */
    kiln_weight head;                          /* [vocab, dim]: shared_head.head, or the model's lm_head */
    int absorbed;                              /* MLA: the block's W_UK / W_UV copies exist (kiln_model_mtp_prepare) */
} kiln_mtp_layer;

typedef struct kiln_arch_model {
    kiln_arch_hp hp;
    kiln_arch_layer *layers;                   /* [n_layers] */
    kiln_mtp_layer *mtp;                       /* [n_mtp]: the MTP layers the checkpoint ships (bound, shapes checked) */
    int n_mtp;
} kiln_arch_model;

typedef struct kiln_arch {
    const char *name;
    const char *model_types[4];
    const char *architectures[4];
    /* Reads config.json into m->hp and a new m->arch_state (cfg: the config object). */
    kiln_status (*read_hparams)(struct kiln_model *m, json_t *cfg, const char *file);
    /* Binds tensors (m->tt) to m->arch_state's layers, checking every shape. */
    kiln_status (*bind)(struct kiln_model *m);
    /* Writes a synthetic checkpoint of this architecture (`kiln mkmodel --arch NAME`; spec: preset
     * and shape flags as "key=value,..."). */
    kiln_status (*mkmodel)(const char *arch, const char *spec, const char *dtype, uint64_t seed, const char *out_dir);
    /* GGUF: general.architecture of this row's files and its tensor names ↔ the Hugging Face names
     * the binder uses ("%d" = layer); gguf_arch NULL = GGUF files of this architecture are not read.
     * The MoE rows (deepseek2, glm4moe) have no name table here: model/gguf_arch.c converts them
     * (stacked experts, split kv_b). */
    const char *gguf_arch;
    const char *const (*gguf_names)[2];
    int n_gguf_names;
} kiln_arch;
/* Translates tensor name `from` with row a's GGUF map: to the Hugging Face name (to_hf = 1) or to
 * the GGUF name (to_hf = 0); returns 0 when the name has no counterpart. */
int kiln_arch_gguf_rename(const kiln_arch *a, const char *from, int to_hf, char *out, size_t cap);
/* The same over a table of {GGUF name, HF name} pairs ("%d" = layer) (model/gguf_arch.c's families). */
int kiln_gguf_rename_table(const char *const (*names)[2], int n_names, const char *from, int to_hf, char *out, size_t cap);
/* The row whose gguf_arch is `gguf_arch`, or NULL. */
const kiln_arch *kiln_arch_find_gguf(const char *gguf_arch);

/* Finds the row for a model_type (or, when model_type is absent, architectures[0]); NULL if none. */
const kiln_arch *kiln_arch_find(const char *model_type, const char *architecture);
/* "chatglm, glm4, glm4_moe, deepseek_v3, kimi_k2, glm4_moe_lite" (for error messages). */
const char *kiln_arch_names(void);

/* Synthetic checkpoints: the mkmodel column of the GLM / DeepSeek rows (mkmodel_arch.c) and of llama
 * (export.c). */
kiln_status kiln_mkmodel_llama(const char *arch, const char *spec, const char *dtype, uint64_t seed, const char *out_dir);
kiln_status kiln_mkmodel_arch(const char *arch, const char *spec, const char *dtype, uint64_t seed, const char *out_dir);

/* The llama row (arch_llama.c): every llama-architecture model, whichever loader filled m->hp. */
extern const kiln_arch kiln_arch_llama;

/* The linear weights of one layer, enumerated from the one layer struct (what requantisation,
 * repacking, byte counts and benches walk instead of hand-written lists). */
typedef struct kiln_arch_linear {
    kiln_weight *w;
    int expert;        /* routed expert index, or -1 */
    char name[64];     /* checkpoint name below "model.layers.N." */
} kiln_arch_linear;
#define KILN_ARCH_DENSE_LINEARS 19
/* Fills out (room for KILN_ARCH_DENSE_LINEARS + 3 · n_experts entries) with the present linear
 * weights of L; returns how many. */
int kiln_arch_layer_linears(kiln_arch_layer *L, int n_experts, kiln_arch_linear *out);

/* 1 when the forward pass never reads tensor t (its binder never looked it up, or it belongs to an
 * MTP layer, which is checked but not run), with the reason in buf (for `kiln inspect`); 0 otherwise. */
int kiln_arch_tensor_unused(const struct kiln_model *m, const kiln_tensor *t, char *buf, size_t cap);
/* MTP (next-n) layers (glm4_moe and the MLA family): checks the shapes of every tensor of layers
 * [n_layers, n_layers + num_nextn_predict_layers) that are present (a checkpoint may ship without
 * them); they are not run (speculative decoding with MTP is not built yet). */
/* An MTP layer's feed-forward block at `mlp_prefix` is MoE when it has a router (mlp.gate.weight):
 * the layer-type lists of the configs stop at num_hidden_layers. */
int kiln_arch_mtp_is_moe(struct kiln_model *m, const char *mlp_prefix);
/* Prepares the MTP layers to run (MLA: absorbs their kv_b_proj); KILN_ERR_UNSUPPORTED naming the
 * model when it ships none. */
kiln_status kiln_model_mtp_prepare(struct kiln_model *m);
kiln_status kiln_arch_check_mtp(struct kiln_model *m, const char *prefix, kiln_status (*bind_layer)(struct kiln_model *, int, kiln_arch_layer *));

/* ---- helpers shared by the arch_*.c files (arch_common.c) ---- */
kiln_arch_model *kiln_arch_state_new(struct kiln_model *m);
/* Common fields: hidden_size, num_hidden_layers (or num_layers), num_attention_heads, vocab_size
 * (or padded_vocab_size), max_position_embeddings (or seq_length), tie_word_embeddings, the norm
 * epsilon eps_key (required when eps_default < 0, else eps_default when absent), torch_dtype (or
 * dtype; def_act when absent), bos/eos; rejects hidden_act other than silu. */
kiln_status kiln_arch_read_common(struct kiln_model *m, json_t *cfg, const char *file, const char *eps_key, double eps_default, kiln_dtype def_act);
/* m's n_layers zeroed layers, owned by the model. */
kiln_status kiln_arch_layers_new(struct kiln_model *m, kiln_arch_model *am);
/* rope_theta from the top level or rope_parameters; partial_rotary_factor likewise (default def_partial). */
kiln_status kiln_arch_read_rope(json_t *cfg, const char *file, double def_theta, double def_partial, double *theta, double *partial);
/* The Llama-style GQA fields of glm4 and glm4_moe: kiln_arch_read_common (rms_norm_eps),
 * intermediate_size, num_key_value_heads (default num_attention_heads), head_dim (default
 * hidden_size / heads), attention_bias (default def_bias), rope theta (default 10000) and
 * *rot = head_dim · partial_rotary_factor (default 0.5); layer prefix "model.". */
kiln_status kiln_arch_read_gqa(struct kiln_model *m, json_t *cfg, const char *file, int def_bias, double *theta, int *rot);
/* Checks heads % kv_heads and the rotary width (even, 2..head_dim), reads YaRN, builds the RoPE
 * tables (style from m->hp.rope_style) and sets the GQA attention fields (scale 1/sqrt(head_dim),
 * V rows of head_dim). */
kiln_status kiln_arch_finish_gqa(struct kiln_model *m, json_t *cfg, const char *file, double theta, int rot);
/* rope_scaling / rope_parameters of type "yarn" → y (y->enabled = 0 when absent or default). */
kiln_status kiln_arch_read_yarn(json_t *cfg, const char *file, kiln_yarn *y);
/* MoE fields shared by glm4_moe and the deepseek family. */
kiln_status kiln_arch_read_moe(struct kiln_model *m, json_t *cfg, const char *file);
/* Norm vector [n] as float32 (narrower storage gets an owned copy). */
kiln_status kiln_arch_vec(struct kiln_model *m, const char *name, int64_t n, const float **out);
/* Optional vector: *out = NULL when the tensor is absent. */
kiln_status kiln_arch_vec_opt(struct kiln_model *m, const char *name, int64_t n, const float **out);
/* Embedding, final norm and LM head (tied or not). */
kiln_status kiln_arch_bind_ends(struct kiln_model *m, const char *embd, const char *norm, const char *head);
/* A MoE block at `p` ("model.layers.3.mlp."): router, correction bias, experts, shared experts;
 * checks that the tensors hold exactly n_routed_experts experts. */
kiln_status kiln_arch_bind_moe(struct kiln_model *m, const char *p, kiln_arch_layer *L);
/* Llama-named attention at `p` ("model.layers.3.self_attn."): q/k/v/o_proj, and the q/k/v biases
 * when attn_bias is set. */
kiln_status kiln_arch_bind_self_attn(struct kiln_model *m, const char *p, kiln_arch_layer *L);
/* A dense SwiGLU MLP at `p` with gate_proj / up_proj / down_proj of width ffn. */
kiln_status kiln_arch_bind_mlp(struct kiln_model *m, const char *p, int64_t ffn, kiln_arch_layer *L);
#endif
