/* hparams_check.c — one set of hyper-parameter ranges for every loader (see hparams_check.h). */
#include "model/hparams_check.h"
#include "base/status.h"
#include <math.h>

const kiln_hparam_keys kiln_hparam_keys_hf = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "max_position_embeddings", "head_dim", "rms_norm_eps", "rope_theta",
    "head_dim (rotary part)", "bos_token_id", "eos_token_id",
};
const kiln_hparam_keys kiln_hparam_keys_gguf_llama = {
    "llama.embedding_length", "llama.feed_forward_length", "llama.block_count", "llama.attention.head_count",
    "llama.attention.head_count_kv", "token_embd.weight rows (vocabulary)", "llama.context_length",
    "llama.embedding_length / llama.attention.head_count", "llama.attention.layer_norm_rms_epsilon",
    "llama.rope.freq_base", "llama.rope.dimension_count", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
};
const kiln_hparam_keys kiln_hparam_keys_llama2c = {
    "header field dim", "header field hidden_dim", "header field n_layers", "header field n_heads",
    "header field n_kv_heads", "header field vocab_size", "header field seq_len", "head size (dim / n_heads)",
    "rms epsilon", "rope base", "rotary dimension", "bos id", "eos id",
};

static kiln_status int_in(const char *file, const char *key, long long v, long long lo, long long hi) {
    if (v < lo || v > hi)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s = %lld is out of range [%lld, %lld]", file, key, v, lo, hi);
    return KILN_OK;
}

kiln_status kiln_hparams_check(const kiln_hparams *hp, const char *file, const kiln_hparam_keys *k) {
    KILN_TRY(int_in(file, k->dim, hp->dim, 1, 1 << 20));
    KILN_TRY(int_in(file, k->ffn_dim, hp->ffn_dim, 1, 1 << 22));
    KILN_TRY(int_in(file, k->n_layers, hp->n_layers, 1, 4096));
    KILN_TRY(int_in(file, k->n_heads, hp->n_heads, 1, 4096));
    KILN_TRY(int_in(file, k->n_kv_heads, hp->n_kv_heads, 1, 4096));
    if (hp->n_heads % hp->n_kv_heads)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s = %d is not a multiple of %s = %d", file, k->n_heads, hp->n_heads,
                         k->n_kv_heads, hp->n_kv_heads);
    KILN_TRY(int_in(file, k->vocab, hp->vocab, 1, 1 << 24));
    KILN_TRY(int_in(file, k->max_seq, hp->max_seq, 1, 1 << 24));
    KILN_TRY(int_in(file, k->head_dim, hp->head_dim, 2, 1 << 16));
    if (hp->head_dim % 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s = %d must be even (RoPE rotates pairs)", file, k->head_dim, hp->head_dim);
    if (!(isfinite(hp->norm_eps) && hp->norm_eps >= 0 && hp->norm_eps <= 1))
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s = %g is out of range [0, 1]", file, k->norm_eps, (double)hp->norm_eps);
    if (!(isfinite(hp->rope_theta) && hp->rope_theta >= 1 && hp->rope_theta <= 1e12))
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s = %g is out of range [1, 1e12]", file, k->rope_theta, (double)hp->rope_theta);
    KILN_TRY(int_in(file, k->rotary_dim, hp->rotary_dim, 2, hp->head_dim));
    if (hp->rotary_dim % 2)
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s = %d must be even (RoPE rotates pairs)", file, k->rotary_dim, hp->rotary_dim);
    KILN_TRY(int_in(file, k->bos_id, hp->bos_id, -1, (long long)hp->vocab - 1));
    KILN_TRY(int_in(file, k->eos_id, hp->eos_id, -1, (long long)hp->vocab - 1));
    return KILN_OK;
}
