/* hparams_check.h — the one validator every loader runs on the llama-shaped hyper-parameters it
 * read (config.json, GGUF metadata, a llama2.c header), so that a GGUF or llama2.c file is held to
 * exactly the ranges config.json is. Errors name the file and the source's own key. */
#ifndef KILN_MODEL_HPARAMS_CHECK_H
#define KILN_MODEL_HPARAMS_CHECK_H
#include "model/model.h"

/* The name each field has in the source format (for messages). */
typedef struct kiln_hparam_keys {
    const char *dim, *ffn_dim, *n_layers, *n_heads, *n_kv_heads, *vocab, *max_seq, *head_dim, *norm_eps, *rope_theta,
        *rotary_dim, *bos_id, *eos_id;
} kiln_hparam_keys;

extern const kiln_hparam_keys kiln_hparam_keys_hf, kiln_hparam_keys_gguf_llama, kiln_hparam_keys_llama2c;

/* Ranges (the same for every source):
 *   dim [1, 2^20], ffn_dim [1, 2^22], n_layers [1, 4096], n_heads and n_kv_heads [1, 4096] with
 *   n_heads a multiple of n_kv_heads, vocab [1, 2^24], max_seq [1, 2^24], head_dim even in [2, 2^16],
 *   norm_eps finite in [0, 1], rope_theta finite in [1, 1e12], rotary_dim even in [2, head_dim],
 *   bos_id / eos_id -1 (none) or in [0, vocab). */
kiln_status kiln_hparams_check(const kiln_hparams *hp, const char *file, const kiln_hparam_keys *keys);
#endif
