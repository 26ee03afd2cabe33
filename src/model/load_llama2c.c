/* load_llama2c.c — loader for Karpathy's llama2.c "v0" float32 checkpoints.
 *
 * Layout: 7 × int32 header {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len}
 * (vocab_size < 0 means a separate classifier follows), then float32 arrays:
 *   token_embedding [vocab, dim]; rms_att [L, dim]; wq [L, dim, dim]; wk [L, kv_dim, dim];
 *   wv [L, kv_dim, dim]; wo [L, dim, dim]; rms_ffn [L, dim]; w1 [L, hidden, dim];
 *   w2 [L, dim, hidden]; w3 [L, hidden, dim]; rms_final [dim]; freq_cis_real/imag [seq, hd/2] (unused);
 *   wcls [vocab, dim] when not shared.
 * Every array becomes a tensor with its Hugging Face name pointing into the read-only mapping.
 * llama2.c rotates adjacent pairs (2i, 2i+1), so the model is marked KILN_ROPE_NORM. */
#include "model/model.h"
#include "base/status.h"
#include "model/hparams_check.h"
#include <stdint.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static kiln_status add_f32(struct kiln_model *m, const kiln_mapping *map, const char *name,
                           uint64_t *off, int ndim, int64_t d0, int64_t d1) {
    kiln_tensor t = {0};
    t.name = (char *)name;
    t.dtype = KILN_DT_F32;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    uint64_t n = (uint64_t)d0 * (uint64_t)(ndim > 1 ? d1 : 1);
    t.nbytes = n * 4;
    t.file = map->path;
    t.offset = *off;
    if (*off > map->size || t.nbytes > map->size - *off)
        return kiln_fail(KILN_ERR_FORMAT,
                         "%s: tensor '%s' at offset %llu (%llu bytes) runs past the end of the file (%llu bytes)",
                         map->path, name, (unsigned long long)*off, (unsigned long long)t.nbytes,
                         (unsigned long long)map->size);
    t.data = map->base + *off;
    *off += t.nbytes;
    return kiln_tt_add(&m->tt, &t);
}

/* Finds the llama2.c tokenizer beside the checkpoint: tokenizer.bin, else tok*.bin. */
static char *find_tokenizer(const char *ckpt) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", ckpt);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    char path[4096 + 512];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    if (stat(path, &st) == 0) return strdup(path);
    DIR *d = opendir(dir);
    if (!d) return NULL;
    struct dirent *e;
    char *found = NULL;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "tok", 3) == 0 && l > 4 && strcmp(e->d_name + l - 4, ".bin") == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            free(found);
            found = strdup(path);
        }
    }
    closedir(d);
    return found;
}

kiln_status kiln_load_llama2c(struct kiln_model *m, const char *path) {
    kiln_mapping *map = &m->maps[m->n_maps];
    KILN_TRY(kiln_map_file(path, map));
    m->n_maps++;
    if (map->size < 28) return kiln_fail(KILN_ERR_FORMAT, "%s: truncated llama2.c header (%llu bytes, need 28)", path, (unsigned long long)map->size);
    int32_t h[7];
    memcpy(h, map->base, sizeof h);
    static const char *names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    int shared = h[5] > 0;
    /* a negative vocab_size means "separate classifier"; INT32_MIN has no positive counterpart */
    if (h[5] == INT32_MIN) return kiln_fail(KILN_ERR_FORMAT, "%s: header field vocab_size = %d is out of range", path, h[5]);
    if (h[5] < 0) h[5] = -h[5];
    for (int i = 0; i < 7; i++)
        if (h[i] <= 0 || h[i] > (1 << 24))
            return kiln_fail(KILN_ERR_FORMAT, "%s: header field %s = %d is out of range", path, names[i], h[i]);
    int dim = h[0], hidden = h[1], L = h[2], H = h[3], KV = h[4], V = h[5], seq = h[6];
    if (dim % H) return kiln_fail(KILN_ERR_FORMAT, "%s: header field dim = %d is not divisible by n_heads = %d", path, dim, H);
    if (H % KV) return kiln_fail(KILN_ERR_FORMAT, "%s: header field n_heads = %d is not divisible by n_kv_heads = %d", path, H, KV);
    int hd = dim / H, kv_dim = KV * hd;
    if (hd % 2) return kiln_fail(KILN_ERR_FORMAT, "%s: head size %d is odd (RoPE needs pairs)", path, hd);

    kiln_hparams *hp = &m->hp;
    snprintf(hp->arch, sizeof hp->arch, "llama");
    hp->vocab = V; hp->dim = dim; hp->n_layers = L; hp->n_heads = H; hp->n_kv_heads = KV;
    hp->head_dim = hd; hp->ffn_dim = hidden; hp->max_seq = seq;
    hp->norm_eps = 1e-5f; hp->rope_theta = 10000.0f;
    hp->rope_style = KILN_ROPE_NORM; hp->rotary_dim = hd;
    hp->tie_embeddings = shared; hp->bos_id = 1; hp->eos_id = 2;
    hp->act_dtype = KILN_DT_F32;
    snprintf(m->format, sizeof m->format, "llama2c");
    KILN_TRY(kiln_hparams_check(hp, path, &kiln_hparam_keys_llama2c));

    /* Per-layer arrays are stacked; slice each layer out as its own named tensor. */
    uint64_t off = 28;
    char name[128];
    KILN_TRY(add_f32(m, map, "model.embed_tokens.weight", &off, 2, V, dim));
    struct { const char *fmt; int64_t d0, d1; int ndim; } stacked[] = {
        {"model.layers.%d.input_layernorm.weight", dim, 0, 1},
        {"model.layers.%d.self_attn.q_proj.weight", dim, dim, 2},
        {"model.layers.%d.self_attn.k_proj.weight", kv_dim, dim, 2},
        {"model.layers.%d.self_attn.v_proj.weight", kv_dim, dim, 2},
        {"model.layers.%d.self_attn.o_proj.weight", dim, dim, 2},
        {"model.layers.%d.post_attention_layernorm.weight", dim, 0, 1},
        {"model.layers.%d.mlp.gate_proj.weight", hidden, dim, 2},
        {"model.layers.%d.mlp.down_proj.weight", dim, hidden, 2},
        {"model.layers.%d.mlp.up_proj.weight", hidden, dim, 2},
    };
    for (size_t a = 0; a < sizeof stacked / sizeof stacked[0]; a++)
        for (int l = 0; l < L; l++) {
            snprintf(name, sizeof name, stacked[a].fmt, l);
            KILN_TRY(add_f32(m, map, name, &off, stacked[a].ndim, stacked[a].d0, stacked[a].d1));
        }
    KILN_TRY(add_f32(m, map, "model.norm.weight", &off, 1, dim, 0));
    uint64_t freq_bytes = (uint64_t)seq * (uint64_t)(hd / 2) * 4 * 2; /* freq_cis_real + imag */
    if (off > map->size || freq_bytes > map->size - off)
        return kiln_fail(KILN_ERR_FORMAT, "%s: freq_cis tables at offset %llu run past the end of the file (%llu bytes)",
                         path, (unsigned long long)off, (unsigned long long)map->size);
    off += freq_bytes;
    if (!shared) KILN_TRY(add_f32(m, map, "lm_head.weight", &off, 2, V, dim));

    char *tok_path = find_tokenizer(path);
    if (tok_path) {
        kiln_status st = kiln_tok_load_llama2c(tok_path, V, &m->tok);
        free(tok_path);
        KILN_TRY(st);
    }
    return KILN_OK;
}
