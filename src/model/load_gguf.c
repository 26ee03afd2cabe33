/* load_gguf.c — a GGUF file as a kiln model: llama.* hyper-parameters, tensors renamed from
 * llama.cpp names (blk.N.attn_q.weight ...) to the Hugging Face names the binder uses, and the
 * embedded tokenizer. llama.cpp stores Q/K rows permuted for adjacent-pair RoPE, so GGUF llama
 * models run with KILN_ROPE_NORM (no data is moved). The MoE families (deepseek2, glm4moe) are read
 * by model/gguf_arch.c. */
#include "model/model.h"
#include "model/arch.h"
#include "base/status.h"
#include "format/gguf.h"
#include "model/hparams_check.h"
#include "model/gguf_arch.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_status get_u(const kiln_gguf *g, const char *file, const char *key, int required, int def, int *out) {
    uint64_t v;
    if (kiln_gguf_get_u64(g, key, &v) != 0) {
        if (required) return kiln_fail(KILN_ERR_FORMAT, "%s: required metadata key '%s' is missing", file, key);
        *out = def;
        return KILN_OK;
    }
    if (v == 0 || v > (1u << 24)) return kiln_fail(KILN_ERR_FORMAT, "%s: metadata '%s' = %llu is out of range", file, key, (unsigned long long)v);
    *out = (int)v;
    return KILN_OK;
}

kiln_status kiln_load_gguf_model(struct kiln_model *m, const char *path) {
    kiln_tensor_table raw = {0};
    kiln_status st = kiln_gguf_open(path, &raw, &m->gguf);
    if (st != KILN_OK) { kiln_tt_free(&raw); return st; }
    snprintf(m->format, sizeof m->format, "gguf");
    const char *arch = NULL;
    size_t alen;
    if (kiln_gguf_get_str(m->gguf, "general.architecture", &arch, &alen) != 0) {
        kiln_tt_free(&raw);
        return kiln_fail(KILN_ERR_FORMAT, "%s: required metadata key 'general.architecture' is missing", path);
    }
    const kiln_arch *row = kiln_arch_find_gguf(arch);
    if (!row) {
        kiln_tt_free(&raw);
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: general.architecture '%s' is not supported (known: llama, deepseek2, glm-dsa, deepseek32, glm4moe, glm4, chatglm)", path, arch);
    }
    if (row != &kiln_arch_llama) { /* the MoE families: model/gguf_arch.c */
        st = kiln_gguf_arch_load(m, path, &raw, arch);
        kiln_tt_free(&raw);
        return st;
    }
    m->arch = row;
    kiln_hparams *hp = &m->hp;
    snprintf(hp->arch, sizeof hp->arch, "llama");
    if ((st = get_u(m->gguf, path, "llama.embedding_length", 1, 0, &hp->dim)) ||
        (st = get_u(m->gguf, path, "llama.feed_forward_length", 1, 0, &hp->ffn_dim)) ||
        (st = get_u(m->gguf, path, "llama.block_count", 1, 0, &hp->n_layers)) ||
        (st = get_u(m->gguf, path, "llama.attention.head_count", 1, 0, &hp->n_heads)) ||
        (st = get_u(m->gguf, path, "llama.attention.head_count_kv", 0, hp->n_heads, &hp->n_kv_heads)) ||
        (st = get_u(m->gguf, path, "llama.context_length", 0, 2048, &hp->max_seq))) {
        kiln_tt_free(&raw);
        return st;
    }
    if (hp->n_heads > 4096 || hp->dim % hp->n_heads || hp->n_kv_heads > 4096 || hp->n_heads % hp->n_kv_heads) {
        kiln_tt_free(&raw);
        return kiln_fail(KILN_ERR_FORMAT, "%s: llama.embedding_length %d / head_count %d / head_count_kv %d are inconsistent", path,
                         hp->dim, hp->n_heads, hp->n_kv_heads);
    }
    hp->head_dim = hp->dim / hp->n_heads;
    int rot = 0;
    if ((st = get_u(m->gguf, path, "llama.rope.dimension_count", 0, hp->head_dim, &rot))) { kiln_tt_free(&raw); return st; }
    hp->rotary_dim = rot;
    float f;
    hp->norm_eps = kiln_gguf_get_f32(m->gguf, "llama.attention.layer_norm_rms_epsilon", &f) == 0 ? f : 1e-5f;
    hp->rope_theta = kiln_gguf_get_f32(m->gguf, "llama.rope.freq_base", &f) == 0 ? f : 10000.0f;
    /* everything but the vocabulary and the special ids is known: refuse a bad file before any
     * tensor work or allocation sized by it (the shared validator runs again once those are known) */
    hp->vocab = 1;
    hp->bos_id = hp->eos_id = -1;
    if ((st = kiln_hparams_check(hp, path, &kiln_hparam_keys_gguf_llama))) { kiln_tt_free(&raw); return st; }
    hp->rope_style = KILN_ROPE_NORM;
    hp->act_dtype = KILN_DT_F32;
    for (int i = 0; i < raw.n; i++) {
        char hf[160];
        kiln_tensor t = raw.v[i];
        if (!kiln_arch_gguf_rename(row, t.name, 1, hf, sizeof hf)) continue; /* tensors kiln does not use (rope_freqs ...) */
        t.name = hf;
        if (t.dtype == KILN_DT_BF16 || t.dtype == KILN_DT_F16) hp->act_dtype = KILN_DT_BF16;
        if ((st = kiln_tt_add(&m->tt, &t))) { kiln_tt_free(&raw); return st; }
    }
    kiln_tt_free(&raw);
    const kiln_tensor *emb = kiln_tt_find(&m->tt, "model.embed_tokens.weight");
    if (!emb || emb->ndim != 2) return kiln_fail(KILN_ERR_FORMAT, "%s: missing tensor 'token_embd.weight'", path);
    if (emb->shape[0] > (1 << 24))
        return kiln_fail(KILN_ERR_FORMAT, "%s: token_embd.weight has %lld rows (vocabulary), more than 2^24", path,
                         (long long)emb->shape[0]);
    hp->vocab = (int)emb->shape[0];
    hp->tie_embeddings = kiln_tt_find(&m->tt, "lm_head.weight") == NULL;
    const char *tm;
    size_t tml;
    if (kiln_gguf_get_str(m->gguf, "tokenizer.ggml.model", &tm, &tml) == 0) KILN_TRY(kiln_tok_load_gguf(m->gguf, &m->tok));
    hp->bos_id = m->tok ? kiln_tok_bos(m->tok) : -1;
    hp->eos_id = m->tok ? kiln_tok_eos(m->tok) : -1;
    return kiln_hparams_check(hp, path, &kiln_hparam_keys_gguf_llama);
}
