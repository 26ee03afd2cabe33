/* model.h — the in-memory model description every loader produces (internal).
 *
 * A loader (model/load_llama2c.c, model/load_hf.c, model/load_gguf.c, over the format/ parsers) fills the tensor table and the
 * hyper-parameters; kiln_model_bind (model.c) then binds tensors to the architecture's weight slots, checking
 * every shape through its row of the architecture table (model/arch.h). The forward pass
 * (model/forward.c) reads only the bound slots. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H
#include "kiln.h"
#include "format/tensor.h"
#include "kernels/gemv.h"
#include "backend/rope.h"
#include "tokenizer/tokenizer.h"


typedef struct kiln_hparams {
    char arch[32];          /* "llama" */
    int vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, max_seq;
    float norm_eps, rope_theta;
    kiln_rope_style rope_style;
    int rotary_dim;         /* dims of each head that RoPE rotates (head_dim for llama) */
    int tie_embeddings;
    int bos_id, eos_id;     /* eos_id: the first of eos_ids (-1: none) */
    int eos_ids[KILN_MAX_EOS], n_eos; /* every id that ends generation: config.json eos_token_id (int or
                               list), generation_config.json's, else the tokenizer's end token */
    /* generation_config.json's default sampling (bits of gen_set: 1 temperature, 2 top_p, 4 top_k,
     * 8 repetition_penalty), used by the server when a request gives none (as vLLM does) */
    unsigned gen_set;
    float gen_temperature, gen_top_p, gen_repetition_penalty;
    int gen_top_k;
    kiln_dtype act_dtype;   /* the checkpoint's activation dtype (torch_dtype): F32, BF16 or F16 */
    /* ---- KV geometry (arch helper, model/arch.h) ----
     * Per token per layer the cache holds n_kv_heads K rows of head_dim values and V rows of kv_v_dim
     * values (0 = head_dim). MLA models (deepseek_v3, kimi_k2, glm4_moe_lite) cache one latent row:
     * n_kv_heads = 1, head_dim = kv_lora_rank + qk_rope_head_dim, kv_v_dim = kv_lora_rank and
     * kv_v_shares_k = 1 (V is the first kv_v_dim values of the K row; nothing else need be stored). */
    int kv_v_dim;
    int kv_v_shares_k;
    /* DSA (deepseek_v32, glm_moe_dsa): the row is [latent | indexer key], both already rounded by the
     * model to FP8 with power-of-two scales per 128 values (docs/DSA.md); F32 and BF16 pools hold
     * those values exactly, an FP8 pool with one scale per layer would round them a second time. */
    int kv_dsa;
    /* DSA: [n_layers] 1 = the layer has its own indexer and caches its key; 0 = it reuses another
     * layer's selection (GLM-5.2's shared indexer) and its row stores no key. NULL = every layer. */
    const unsigned char *kv_dsa_key_layers;
} kiln_hparams;


#define KILN_MAX_MAPS 64
struct kiln_model {
    kiln_hparams hp;
    char *path;               /* what was loaded */
    char format[16];          /* "llama2c", "hf", "gguf" */
    kiln_tensor_table tt;
    kiln_mapping maps[KILN_MAX_MAPS];
    int n_maps;
    struct kiln_gguf *gguf;
    void *config;             /* HF config.json as a jansson json_t* (NULL for other formats) */
    kiln_tokenizer *tok;      /* NULL when the checkpoint has no tokenizer files */
    kiln_weight tok_embd;     /* [vocab, dim] — rows looked up, never multiplied */
    kiln_weight output;       /* [vocab, dim] (== tok_embd data when tied) */
    const float *output_norm; /* [dim] */
    void **owned;             /* buffers freed with the model (converted norms, permuted copies) */
    /* ---- the row of the architecture table (model/arch.h) and its bound layers ---- */
    const struct kiln_arch *arch;
    void *arch_state;         /* struct kiln_arch_model (owned via kiln_model_own) */
    kiln_isa layout_isa;      /* ISA whose kernels the model's own weight copies are tiled for */
    int n_owned, cap_owned;
    int repacked;             /* kiln_model_repack has run (once, at the first session or engine) */
    /* Owned copies the kernels compute on instead of the mapped tensors (the FP8/INT4 repack), with
     * their checksums: kiln_model_check_weights re-checks them too. */
    struct kiln_checked_copy { const void *data; size_t nbytes; uint64_t checksum; char name[120]; } *copies;
    int n_copies, cap_copies;
    /* ---- tensor parallelism (model/shard.c): this process's shard of tp ---- */
    int tp;                   /* 0 / 1: the whole model */
    void (*allreduce)(void *ctx, float *x, int64_t n); /* sums row-parallel partial outputs over the ranks */
    void *allreduce_ctx;
    /* vocabulary-parallel head: `output` holds this rank's rows [r·V/T, (r+1)·V/T) of the LM head;
     * gather(ctx, part [rows, own columns], rows, V, out [rows, V]) assembles the logits on rank 0
     * (kiln_model_set_logits_gather; every rank must call it for the same rows) */
    int vocab_split;
    void (*gather)(void *ctx, const float *part, int rows, int64_t vocab, float *out);
    void *gather_ctx;
};

/* Copies the FP8/INT4/GGUF-block linear weights still in the mapped checkpoint layout into owned
 * buffers in the GEMV's tile layouts (kernels/gemv.h) where the current ISA's kernels read that
 * faster, and the other GGUF blocks into owned buffers as they are (kiln_weight_prefers_owned)
 * (src/eval/requant.c). Returns the bytes copied (0: nothing to do). Best effort: a weight that
 * cannot be copied stays as it is. */
uint64_t kiln_model_repack(struct kiln_model *m);
/* At the first session or engine of a model, unless opts->no_repack: kiln_model_repack, announced
 * on stderr unless opts->quiet. */
void kiln_model_prepare_compute(struct kiln_model *m, const kiln_options *opts);
/* The context a session or engine runs with: --ctx (max_context) when given, never more than the
 * file's context; without it, the file's context capped at KILN_DEFAULT_CONTEXT_CAP tokens, so a
 * file claiming 16M positions does not size a multi-GiB default KV pool (vLLM's --max-model-len,
 * llama.cpp's -c play the same part; --ctx raises the cap up to the file's context). */
#define KILN_DEFAULT_CONTEXT_CAP 131072
int kiln_model_context(const struct kiln_model *m, const kiln_options *opts);

/* Records an owned copy of weight bytes (name for errors) with its checksum now; 0, or -1 without
 * memory (the copy then goes unchecked). */
int kiln_model_note_copy(struct kiln_model *m, const char *name, const void *data, size_t nbytes);

/* Registers a malloc'ed buffer to be freed with the model; returns it (NULL on failure, with p freed). */
void *kiln_model_own(struct kiln_model *m, void *p);

/* Loaders: fill m->tt, m->hp, m->tok (and maps). */
kiln_status kiln_load_llama2c(struct kiln_model *m, const char *path);
kiln_status kiln_load_hf(struct kiln_model *m, const char *dir);
kiln_status kiln_load_gguf_model(struct kiln_model *m, const char *path);

/* XXH3-64 of every tensor into tt.v[i].checksum (model/checksum.c). */
void kiln_model_compute_checksums(struct kiln_model *m);

/* Binds the tensor table to the slots of the model's architecture row (model/arch.h), checking shapes. */
kiln_status kiln_model_bind(struct kiln_model *m);
/* Binds the linear layer `prefix` (e.g. "model.layers.0.mlp.down_proj") of shape [rows, cols],
 * whatever its storage, detected from the tensors present:
 *   prefix.weight (F32/F16/BF16, GGUF Q8_0/Q4_0)                         plain
 *   prefix.weight (F8_E4M3) + prefix.weight_scale_inv (F32 [ceil(r/B), ceil(c/B)])   FP8 block
 *   prefix.weight_packed (I32 [r, c/8]) + prefix.weight_scale (BF16 [r, c/g])
 *     [+ prefix.weight_shape]                                            INT4 compressed-tensors
 * Shapes, group sizes and scale finiteness are checked; errors name the tensor and the field. */
kiln_status kiln_bind_linear(struct kiln_model *m, const char *prefix, int64_t rows, int64_t cols, kiln_weight *w);
/* Validates config.json's quantization_config (quant_method fp8 / compressed-tensors). */
kiln_status kiln_check_quant_config(const void *config_json, const char *file);

/* Makes a kiln_weight view of a 2-D tensor (F32/F16/BF16/Q8_0/Q4_0). */
kiln_status kiln_weight_from_tensor(const kiln_tensor *t, int64_t rows, int64_t cols, kiln_weight *w);
/* AUTO → the model's activation dtype (F32 for F32 checkpoints, BF16 otherwise). */
kiln_kv_dtype kiln_resolve_kv_dtype(const struct kiln_model *m, kiln_kv_dtype want);
#endif
