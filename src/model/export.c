/* export.c — writing models: a Hugging Face directory (config.json + model.safetensors + tokenizer
 * files) or a GGUF v3 file, and synthetic checkpoints (`kiln mkmodel`).
 *
 * RoPE layout: HF Llama checkpoints rotate half-split pairs (NEOX); llama2.c and GGUF rotate
 * adjacent pairs (NORM). Writing across conventions permutes the rows of q_proj / k_proj within
 * each head, exactly as HF's and llama.cpp's converters do, so every format runs identically. */
#include "model/model.h"
#include "model/arch.h"
#include "model/export.h"
#include "model/gguf_arch.h"
#include "base/fp.h"
#include "base/status.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "quant/quantize.h"
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


kiln_status kiln_export_make_dir(const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return kiln_fail(KILN_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    return KILN_OK;
}

/* Permutes the rows of a [n_heads*hd, cols] matrix between RoPE pair layouts.
 * to_neox: new row h*hd + j*hd/2 + i  ←  old row h*hd + 2i + j   (NORM → NEOX)
 * else:    new row h*hd + 2i + j      ←  old row h*hd + j*hd/2 + i (NEOX → NORM) */
static void permute_rows(uint8_t *dst, const uint8_t *src, int n_heads, int hd, size_t row_bytes, int to_neox) {
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int j = 0; j < 2; j++) {
                size_t neox = (size_t)h * hd + (size_t)j * (hd / 2) + i, norm = (size_t)h * hd + 2 * (size_t)i + j;
                size_t d = to_neox ? neox : norm, s = to_neox ? norm : neox;
                memcpy(dst + d * row_bytes, src + s * row_bytes, row_bytes);
            }
}

static int is_qk(const char *name) { return strstr(name, "self_attn.q_proj.weight") || strstr(name, "self_attn.k_proj.weight"); }

/* Prepares the tensors to write: q/k permuted when the RoPE layouts differ, GGUF block dtypes
 * dequantized to F32 for safetensors. Buffers allocated here are listed in *owned. */
kiln_status kiln_export_tensors(const struct kiln_model *m, kiln_rope_style target, int allow_blocks, kiln_tensor **out, void ***owned) {
    const kiln_hparams *hp = &m->hp;
    kiln_tensor *ts = calloc((size_t)m->tt.n, sizeof *ts);
    void **own = calloc((size_t)m->tt.n * 2 + 1, sizeof *own);
    int no = 0;
    if (!ts || !own) { free(ts); free(own); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    for (int i = 0; i < m->tt.n; i++) {
        kiln_tensor t = m->tt.v[i];
        const kiln_dtype_info *di = kiln_dtype_get(t.dtype);
        if (!allow_blocks && di->block_elems > 1) { /* Q8_0/Q4_0 have no safetensors dtype */
            float *f = malloc(kiln_tensor_numel(&t) * 4);
            if (!f) { free(ts); for (int k = 0; k < no; k++) free(own[k]); free(own); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
            di->to_f32(t.data, f, kiln_tensor_numel(&t));
            own[no++] = f;
            t.data = (const uint8_t *)f;
            t.dtype = KILN_DT_F32;
            t.nbytes = kiln_tensor_numel(&t) * 4;
        }
        if (hp->rope_style != target && is_qk(t.name) && t.ndim == 2) {
            int nh = strstr(t.name, "q_proj") ? hp->n_heads : hp->n_kv_heads;
            uint8_t *p = malloc(t.nbytes);
            if (!p) { free(ts); for (int k = 0; k < no; k++) free(own[k]); free(own); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
            permute_rows(p, t.data, nh, hp->head_dim, t.nbytes / (size_t)t.shape[0], target == KILN_ROPE_NEOX);
            own[no++] = p;
            t.data = p;
        }
        ts[i] = t;
    }
    *out = ts;
    *owned = own;
    return KILN_OK;
}

void kiln_export_free_owned(void **own) {
    for (int k = 0; own && own[k]; k++) free(own[k]);
    free(own);
}

static const char *torch_dtype_name(kiln_dtype dt) { return dt == KILN_DT_BF16 ? "bfloat16" : dt == KILN_DT_F16 ? "float16" : "float32"; }

static json_t *llama_config(const kiln_hparams *hp) {
    json_t *c = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("LlamaForCausalLM"));
    json_object_set_new(c, "architectures", arch);
    json_object_set_new(c, "model_type", json_string("llama"));
    json_object_set_new(c, "hidden_size", json_integer(hp->dim));
    json_object_set_new(c, "intermediate_size", json_integer(hp->ffn_dim));
    json_object_set_new(c, "num_hidden_layers", json_integer(hp->n_layers));
    json_object_set_new(c, "num_attention_heads", json_integer(hp->n_heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(hp->n_kv_heads));
    json_object_set_new(c, "head_dim", json_integer(hp->head_dim));
    json_object_set_new(c, "vocab_size", json_integer(hp->vocab));
    json_object_set_new(c, "max_position_embeddings", json_integer(hp->max_seq));
    json_object_set_new(c, "rms_norm_eps", json_real(hp->norm_eps));
    json_object_set_new(c, "rope_theta", json_real(hp->rope_theta));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(hp->tie_embeddings));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "mlp_bias", json_false());
    if (hp->bos_id >= 0) json_object_set_new(c, "bos_token_id", json_integer(hp->bos_id));
    if (hp->eos_id >= 0) json_object_set_new(c, "eos_token_id", json_integer(hp->eos_id));
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype_name(hp->act_dtype)));
    return c;
}

kiln_status kiln_export_write_json(json_t *j, const char *path) {
    int r = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    return r == 0 ? KILN_OK : kiln_fail(KILN_ERR_IO, "%s: cannot write", path);
}

kiln_status kiln_model_save_hf(const kiln_model *m, const char *dir) {
    KILN_TRY(kiln_export_make_dir(dir));
    kiln_tensor *ts;
    void **own;
    KILN_TRY(kiln_export_tensors(m, KILN_ROPE_NEOX, 0, &ts, &own));
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    kiln_status st = kiln_safetensors_write(path, ts, m->tt.n);
    free(ts);
    kiln_export_free_owned(own);
    KILN_TRY(st);
    snprintf(path, sizeof path, "%s/config.json", dir);
    KILN_TRY(kiln_export_write_json(kiln_export_config(m), path));
    if (m->tok) KILN_TRY(kiln_tok_save_hf(m->tok, dir));
    return KILN_OK;
}

/* config.json for a model being written: the checkpoint's own config when it came from a Hugging
 * Face directory (every architecture-specific field kept), else a LlamaForCausalLM config. */
json_t *kiln_export_config(const struct kiln_model *m) {
    if (m->config) return json_deep_copy((const json_t *)m->config);
    kiln_hparams hp = m->hp;
    hp.rope_style = KILN_ROPE_NEOX;
    if (!kiln_tt_find(&m->tt, "lm_head.weight")) hp.tie_embeddings = 1;
    return llama_config(&hp);
}

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int kiln_gguf_keeps_f32(const char *gguf_name, int ndim) {
    if (ndim <= 1 || ends_with(gguf_name, "_norm.weight") || !ends_with(gguf_name, ".weight")) return 1;
    return ends_with(gguf_name, ".ffn_gate_inp.weight") || ends_with(gguf_name, ".ffn_gate_inp_shexp.weight") ||
           ends_with(gguf_name, ".indexer.proj.weight");
}

int kiln_export_gguf_encode(const kiln_tensor *t, const char *gguf_name, kiln_dtype to, uint8_t **out, uint64_t *nbytes,
                            kiln_status *st) {
    *st = KILN_OK;
    if (kiln_gguf_keeps_f32(gguf_name, t->ndim)) {
        if (t->dtype != KILN_DT_F16 && t->dtype != KILN_DT_BF16) return 0; /* F32 already, or a block type kept as read */
        const int64_t n = (int64_t)kiln_tensor_numel(t);
        float *f = malloc((size_t)n * sizeof *f);
        if (!f) {
            *st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
            return 0;
        }
        kiln_dtype_get(t->dtype)->to_f32(t->data, f, n);
        *out = (uint8_t *)f;
        *nbytes = (uint64_t)n * 4;
        return 2;
    }
    if (to != KILN_DT_Q8_0 && to != KILN_DT_Q4_0) return 0;
    if (t->ndim < 2 || t->shape[t->ndim - 1] % 32 || !(t->dtype == KILN_DT_F32 || t->dtype == KILN_DT_F16 || t->dtype == KILN_DT_BF16)) return 0;
    const int64_t cols = t->shape[t->ndim - 1], rows = (int64_t)(kiln_tensor_numel(t) / (uint64_t)cols); /* 3-D: stacked experts, per head */
    const size_t in_row = (size_t)t->nbytes / (size_t)rows, out_row = (size_t)(cols / 32) * (to == KILN_DT_Q8_0 ? 34 : 18);
    const kiln_dtype_info *di = kiln_dtype_get(t->dtype);
    uint8_t *q = malloc(out_row * (size_t)rows);
    float *f = malloc((size_t)cols * sizeof *f);
    if (!q || !f) {
        free(q);
        free(f);
        *st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        return 0;
    }
    for (int64_t r = 0; r < rows; r++) {
        di->to_f32(t->data + (size_t)r * in_row, f, cols);
        if (to == KILN_DT_Q8_0) kiln_quantize_row_q8_0(f, q + (size_t)r * out_row, cols);
        else kiln_quantize_row_q4_0(f, q + (size_t)r * out_row, cols);
    }
    free(f);
    *out = q;
    *nbytes = out_row * (uint64_t)rows;
    return 1;
}

kiln_status kiln_model_save_gguf(const kiln_model *m, const char *path) { return kiln_model_save_gguf_as(m, path, NULL); }

kiln_status kiln_model_save_gguf_as(const kiln_model *m, const char *path, const char *outtype) {
    const kiln_hparams *hp = &m->hp;
    kiln_dtype to = KILN_DT_COUNT; /* as stored */
    if (outtype && strcmp(outtype, "q8_0") == 0) to = KILN_DT_Q8_0;
    else if (outtype && strcmp(outtype, "q4_0") == 0) to = KILN_DT_Q4_0;
    else if (outtype && strcmp(outtype, "auto") != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: --outtype '%s' is not one of auto, q8_0, q4_0", path, outtype);
    if (m->arch && m->arch != &kiln_arch_llama) return kiln_gguf_arch_save(m, path, to); /* deepseek2 / glm4moe (model/gguf_arch.c) */
    kiln_tensor *ts;
    void **own;
    KILN_TRY(kiln_export_tensors(m, KILN_ROPE_NORM, 1, &ts, &own));
    uint8_t **blocks = calloc((size_t)m->tt.n + 1, sizeof *blocks);
    if (!blocks) {
        free(ts);
        kiln_export_free_owned(own);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_set_str(w, "general.architecture", "llama");
    kiln_gguf_set_str(w, "general.name", "kiln export");
    /* llama.cpp's LLAMA_FTYPE_MOSTLY_Q8_0 / _Q4_0 (display only: types are per tensor) */
    if (to == KILN_DT_Q8_0 || to == KILN_DT_Q4_0) kiln_gguf_set_u32(w, "general.file_type", to == KILN_DT_Q8_0 ? 7 : 2);
    kiln_gguf_set_u32(w, "llama.context_length", (uint32_t)hp->max_seq);
    kiln_gguf_set_u32(w, "llama.embedding_length", (uint32_t)hp->dim);
    kiln_gguf_set_u32(w, "llama.block_count", (uint32_t)hp->n_layers);
    kiln_gguf_set_u32(w, "llama.feed_forward_length", (uint32_t)hp->ffn_dim);
    kiln_gguf_set_u32(w, "llama.attention.head_count", (uint32_t)hp->n_heads);
    kiln_gguf_set_u32(w, "llama.attention.head_count_kv", (uint32_t)hp->n_kv_heads);
    kiln_gguf_set_u32(w, "llama.rope.dimension_count", (uint32_t)hp->rotary_dim);
    kiln_gguf_set_f32(w, "llama.rope.freq_base", hp->rope_theta);
    kiln_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", hp->norm_eps);
    if (m->tok) kiln_tok_save_gguf(m->tok, w);
    kiln_status st = KILN_OK;
    for (int i = 0; i < m->tt.n && st == KILN_OK; i++) {
        char gname[160];
        if (!kiln_arch_gguf_rename(&kiln_arch_llama, ts[i].name, 0, gname, sizeof gname)) {
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' has no GGUF llama name", path, ts[i].name);
            break;
        }
        uint64_t nb;
        const int enc = kiln_export_gguf_encode(&ts[i], gname, to, &blocks[i], &nb, &st);
        if (enc)
            kiln_gguf_add_tensor(w, gname, enc == 2 ? KILN_DT_F32 : to, ts[i].ndim, ts[i].shape, blocks[i], nb);
        else if (st == KILN_OK)
            kiln_gguf_add_tensor(w, gname, ts[i].dtype, ts[i].ndim, ts[i].shape, ts[i].data, ts[i].nbytes);
    }
    if (st == KILN_OK) st = kiln_gguf_write(w, path);
    kiln_gguf_writer_free(w);
    for (int i = 0; i < m->tt.n; i++) free(blocks[i]);
    free(blocks);
    free(ts);
    kiln_export_free_owned(own);
    return st;
}

/* ---- mkmodel ------------------------------------------------------------------------------------- */

typedef struct { int dim, ffn, layers, heads, kv_heads, vocab, seq, head_dim; } llama_shape;

static const struct { const char *name; llama_shape s; } presets[] = {
    {"tiny", {64, 176, 2, 4, 2, 256, 512, 0}},
    {"small", {256, 704, 4, 8, 2, 1024, 2048, 0}},
    {"bench-500m", {2048, 5632, 9, 32, 4, 32000, 4096, 0}},
};

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Uniform in [-a, a]. */
static float urand(uint64_t *x, float a) { return a * (2.0f * (float)(splitmix(x) >> 40) / 16777216.0f - 1.0f); }

static kiln_status parse_spec(const char *spec, llama_shape *s) {
    memset(s, 0, sizeof *s);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: '%s' is not key=value", tok);
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        if (strcmp(k, "preset") == 0) {
            size_t i;
            for (i = 0; i < sizeof presets / sizeof presets[0]; i++)
                if (strcmp(presets[i].name, v) == 0) { *s = presets[i].s; break; }
            if (i == sizeof presets / sizeof presets[0])
                return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: unknown preset '%s' (known: tiny, small, bench-500m)", v);
            continue;
        }
        char *end;
        long x = strtol(v, &end, 10);
        if (*end || end == v || x <= 0 || x > (1 << 24)) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --%s '%s' is not a positive integer", k, v);
        if (strcmp(k, "dim") == 0) s->dim = (int)x;
        else if (strcmp(k, "ffn") == 0) s->ffn = (int)x;
        else if (strcmp(k, "layers") == 0) s->layers = (int)x;
        else if (strcmp(k, "heads") == 0) s->heads = (int)x;
        else if (strcmp(k, "kv-heads") == 0) s->kv_heads = (int)x;
        else if (strcmp(k, "vocab") == 0) s->vocab = (int)x;
        else if (strcmp(k, "seq") == 0) s->seq = (int)x;
        else if (strcmp(k, "head-dim") == 0) s->head_dim = (int)x;
        else return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: unknown shape key '%s'", k);
    }
    if (!s->kv_heads) s->kv_heads = s->heads;
    if (!s->dim || !s->ffn || !s->layers || !s->heads || !s->vocab || !s->seq)
        return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: shape needs --dim, --ffn, --layers, --heads, --vocab and --seq (or --preset)");
    if (!s->head_dim) {
        if (s->dim % s->heads) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --dim %d is not divisible by --heads %d", s->dim, s->heads);
        s->head_dim = s->dim / s->heads;
    }
    if (s->heads % s->kv_heads) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --heads %d is not a multiple of --kv-heads %d", s->heads, s->kv_heads);
    if (s->head_dim % 2) return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: head dim %d must be even", s->head_dim);
    return KILN_OK;
}

kiln_status kiln_mkmodel(const char *arch, const char *spec, const char *dtype, uint64_t seed, const char *out_dir) {
    const kiln_arch *row = kiln_arch_find(arch, NULL); /* the mkmodel column of the architecture table */
    if (!row || !row->mkmodel || strcmp(arch, row->name) != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "mkmodel: --arch '%s' is not supported (known: llama, chatglm, glm4, glm4_moe, deepseek_v3, kimi_k2, glm4_moe_lite, deepseek_v32, glm_moe_dsa)",
                         arch);
    return row->mkmodel(arch, spec, dtype, seed, out_dir);
}

kiln_status kiln_mkmodel_llama(const char *arch, const char *spec, const char *dtype, uint64_t seed, const char *out_dir) {
    (void)arch;
    kiln_dtype dt;
    if (strcmp(dtype, "f32") == 0) dt = KILN_DT_F32;
    else if (strcmp(dtype, "bf16") == 0) dt = KILN_DT_BF16;
    else return kiln_fail(KILN_ERR_INVALID_ARG, "mkmodel: --dtype '%s' is not f32 or bf16", dtype);
    llama_shape s;
    KILN_TRY(parse_spec(spec, &s));
    kiln_fp_init();
    KILN_TRY(kiln_export_make_dir(out_dir));
    int qd = s.heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
    int n_t = 3 + 9 * s.layers;
    kiln_tensor *ts = calloc((size_t)n_t, sizeof *ts);
    char **names = calloc((size_t)n_t, sizeof *names);
    if (!ts || !names) { free(ts); free(names); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    int k = 0;
    kiln_status st = KILN_OK;
    /* Weights uniform with std 1/sqrt(fan_in) keep activations O(1) through the layers; norms near 1;
     * embeddings std 1. Each tensor has its own stream (seed, index) so the files are reproducible. */
#define ADD(nm, r, c, std, base) do {                                                                  \
        names[k] = strdup(nm);                                                                         \
        int64_t rr = (r), cc = (c);                                                                    \
        uint64_t n = (uint64_t)rr * (uint64_t)(cc ? cc : 1);                                           \
        size_t es = dt == KILN_DT_F32 ? 4 : 2;                                                         \
        uint8_t *d = malloc(n * es);                                                                   \
        if (!names[k] || !d) { free(d); st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); goto done; }  \
        uint64_t rs = seed * 0x100000001B3ull + (uint64_t)k * 0x9E3779B97F4A7C15ull;                   \
        float a = (float)(std) * 1.7320508f;                                                           \
        for (uint64_t i = 0; i < n; i++) {                                                             \
            float v = (float)(base) + urand(&rs, a);                                                   \
            if (es == 4) memcpy(d + 4 * i, &v, 4);                                                     \
            else { uint16_t h = kiln_f32_to_bf16(v); memcpy(d + 2 * i, &h, 2); }                       \
        }                                                                                              \
        ts[k].name = names[k]; ts[k].dtype = dt; ts[k].ndim = cc ? 2 : 1;                              \
        ts[k].shape[0] = rr; ts[k].shape[1] = cc; ts[k].data = d; ts[k].nbytes = n * es; k++;          \
    } while (0)
    char nm[160];
    ADD("model.embed_tokens.weight", s.vocab, s.dim, 1.0, 0.0);
    for (int l = 0; l < s.layers; l++) {
#define LN(fmt) (snprintf(nm, sizeof nm, "model.layers.%d." fmt, l), nm)
        ADD(LN("input_layernorm.weight"), s.dim, 0, 0.1, 1.0);
        ADD(LN("self_attn.q_proj.weight"), qd, s.dim, 1.0 / sqrt(s.dim), 0.0);
        ADD(LN("self_attn.k_proj.weight"), kvd, s.dim, 1.0 / sqrt(s.dim), 0.0);
        ADD(LN("self_attn.v_proj.weight"), kvd, s.dim, 1.0 / sqrt(s.dim), 0.0);
        ADD(LN("self_attn.o_proj.weight"), s.dim, qd, 1.0 / sqrt(qd), 0.0);
        ADD(LN("post_attention_layernorm.weight"), s.dim, 0, 0.1, 1.0);
        ADD(LN("mlp.gate_proj.weight"), s.ffn, s.dim, 1.0 / sqrt(s.dim), 0.0);
        ADD(LN("mlp.up_proj.weight"), s.ffn, s.dim, 1.0 / sqrt(s.dim), 0.0);
        ADD(LN("mlp.down_proj.weight"), s.dim, s.ffn, 1.0 / sqrt(s.ffn), 0.0);
#undef LN
    }
    ADD("model.norm.weight", s.dim, 0, 0.1, 1.0);
    ADD("lm_head.weight", s.vocab, s.dim, 1.0 / sqrt(s.dim), 0.0);
#undef ADD
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    st = kiln_safetensors_write(path, ts, k);
    if (st == KILN_OK) {
        kiln_hparams hp = {0};
        snprintf(hp.arch, sizeof hp.arch, "llama");
        hp.vocab = s.vocab; hp.dim = s.dim; hp.n_layers = s.layers; hp.n_heads = s.heads; hp.n_kv_heads = s.kv_heads;
        hp.head_dim = s.head_dim; hp.ffn_dim = s.ffn; hp.max_seq = s.seq; hp.norm_eps = 1e-5f; hp.rope_theta = 10000.0f;
        hp.tie_embeddings = 0; hp.bos_id = 1; hp.eos_id = 2; hp.act_dtype = dt;
        snprintf(path, sizeof path, "%s/config.json", out_dir);
        st = kiln_export_write_json(llama_config(&hp), path);
    }
done:
    for (int i = 0; i < n_t; i++) { free(names[i]); if (i < k) free((void *)ts[i].data); }
    free(names);
    free(ts);
    return st;
}
