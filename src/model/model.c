/* model.c — loading entry point (format detection), weight binding with shape checks, model
 * info/description, and freeing. */
#include "model/model.h"
#include "model/arch.h"
#include "base/fp.h"
#include "base/status.h"
#include "format/gguf.h"
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void kiln_options_default(kiln_options *o) {
    memset(o, 0, sizeof *o);
    o->kv_page_tokens = 16;
}

void *kiln_model_own(struct kiln_model *m, void *p) {
    if (!p) return NULL;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 32;
        void **v = realloc(m->owned, (size_t)cap * sizeof *v);
        if (!v) { free(p); return NULL; }
        m->owned = v;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static int is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

/* Decides the format of `path`. For a directory: config.json → HF; else a single *.gguf; else a
 * single llama2.c checkpoint (*.bin that is not a tokenizer). */
static kiln_status detect(const char *path, char *resolved, size_t cap, int *kind) {
    enum { HF = 1, GGUF = 2, L2C = 3 };
    if (is_file(path)) {
        snprintf(resolved, cap, "%s", path);
        FILE *f = fopen(path, "rb");
        char magic[4] = {0};
        if (f) { if (fread(magic, 1, 4, f) != 4) memset(magic, 0, 4); fclose(f); }
        *kind = memcmp(magic, "GGUF", 4) == 0 || has_suffix(path, ".gguf") ? GGUF : has_suffix(path, ".json") ? HF : L2C;
        if (*kind == HF) { /* config.json given directly: use its directory */
            snprintf(resolved, cap, "%s", path);
            char *s = strrchr(resolved, '/');
            if (s) *s = 0; else snprintf(resolved, cap, ".");
        }
        return KILN_OK;
    }
    if (!is_dir(path)) return kiln_fail(KILN_ERR_IO, "%s: no such file or directory", path);
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", path);
    if (is_file(p)) { snprintf(resolved, cap, "%s", path); *kind = HF; return KILN_OK; }
    DIR *d = opendir(path);
    if (!d) return kiln_fail(KILN_ERR_IO, "%s: cannot list directory", path);
    struct dirent *e;
    int n_gguf = 0, n_bin = 0;
    char gguf[4200] = "", bin[4200] = "";
    while ((e = readdir(d))) {
        if (has_suffix(e->d_name, ".gguf") && !strstr(e->d_name, "vocab")) { n_gguf++; snprintf(gguf, sizeof gguf, "%s/%s", path, e->d_name); }
        else if (has_suffix(e->d_name, ".bin") && strncmp(e->d_name, "tok", 3) != 0) { n_bin++; snprintf(bin, sizeof bin, "%s/%s", path, e->d_name); }
    }
    closedir(d);
    if (n_gguf == 1) { snprintf(resolved, cap, "%s", gguf); *kind = GGUF; return KILN_OK; }
    if (n_gguf == 0 && n_bin == 1) { snprintf(resolved, cap, "%s", bin); *kind = L2C; return KILN_OK; }
    return kiln_fail(KILN_ERR_IO, "%s: no config.json, and not exactly one .gguf or llama2.c .bin checkpoint (%d .gguf, %d .bin found)",
                     path, n_gguf, n_bin);
}

kiln_status kiln_model_load(const char *path, const kiln_options *opts, kiln_model **out) {
    *out = NULL;
    kiln_fp_init();
    kiln_clear_error();
    struct kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    /* The ISA the model's own weight copies are laid out for, chosen before anything is laid out:
     * weights requantized after loading (kiln bench, kiln eval) and the first session's repack are
     * tiled for it (kernels/gemv.h), and a backend of another ISA reading that layout falls back to
     * per-call gathered copies (correct, slower). */
    kiln_kctx lx;
    kiln_kctx_init(&lx, opts ? opts->isa : KILN_ISA_AUTO, 1, KILN_FP8_AUTO);
    m->layout_isa = lx.isa;
    char resolved[4200];
    int kind = 0;
    kiln_status st = detect(path, resolved, sizeof resolved, &kind);
    if (st == KILN_OK) {
        m->path = strdup(resolved);
        st = kind == 1 ? kiln_load_hf(m, resolved) : kind == 2 ? kiln_load_gguf_model(m, resolved) : kiln_load_llama2c(m, resolved);
    }
    if (st == KILN_OK && m->hp.n_eos == 0 && m->hp.eos_id >= 0) m->hp.eos_ids[m->hp.n_eos++] = m->hp.eos_id; /* llama2.c, GGUF */
    if (st == KILN_OK) st = kiln_model_bind(m);
    if (st != KILN_OK) { kiln_model_free(m); return st; }
    kiln_model_compute_checksums(m);
    *out = m;
    return KILN_OK;
}

void kiln_model_free(kiln_model *m) {
    if (!m) return;
    free(m->copies);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    if (m->tok) kiln_tok_free(m->tok);
    if (m->gguf) kiln_gguf_close(m->gguf);
    for (int i = 0; i < m->n_maps; i++) kiln_unmap(&m->maps[i]);
    kiln_tt_free(&m->tt);
    if (m->config) json_decref((json_t *)m->config);
    free(m->path);
    free(m);
}

kiln_status kiln_model_set_tokenizer(kiln_model *m, kiln_tokenizer *t) {
    if (!m || !t) return kiln_fail(KILN_ERR_INVALID_ARG, "set tokenizer: no model or no tokenizer");
    const int nv = kiln_tok_vocab_size(t);
    if (nv > m->hp.vocab)
        return kiln_fail(KILN_ERR_INVALID_ARG, "tokenizer: %d entries do not fit the model's vocabulary of %d", nv, m->hp.vocab);
    if (m->tok) kiln_tok_free(m->tok);
    m->tok = t;
    if (m->hp.bos_id < 0) m->hp.bos_id = kiln_tok_bos(t);
    if (m->hp.eos_id < 0) m->hp.eos_id = kiln_tok_eos(t);
    return KILN_OK;
}

/* ---- binding ------------------------------------------------------------------------------------ */

kiln_status kiln_weight_from_tensor(const kiln_tensor *t, int64_t rows, int64_t cols, kiln_weight *w) {
    memset(w, 0, sizeof *w);
    int ok_shape = t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols;
    if (!ok_shape)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has shape [%lld%s%lld] but the config implies [%lld, %lld]",
                         t->file ? t->file : "?", t->name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                         t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)rows, (long long)cols);
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    switch (t->dtype) {
    case KILN_DT_F32: w->fmt = KILN_WF_F32; w->row_bytes = (size_t)cols * 4; break;
    case KILN_DT_F16: w->fmt = KILN_WF_F16; w->row_bytes = (size_t)cols * 2; break;
    case KILN_DT_BF16: w->fmt = KILN_WF_BF16; w->row_bytes = (size_t)cols * 2; break;
    case KILN_DT_Q8_0: w->fmt = KILN_WF_Q8_0; w->row_bytes = (size_t)cols / 32 * 34; break;
    case KILN_DT_Q4_0: w->fmt = KILN_WF_Q4_0; w->row_bytes = (size_t)cols / 32 * 18; break;
    case KILN_DT_Q4_K: w->fmt = KILN_WF_Q4_K; w->row_bytes = (size_t)cols / 256 * 144; break;
    case KILN_DT_Q5_K: w->fmt = KILN_WF_Q5_K; w->row_bytes = (size_t)cols / 256 * 176; break;
    case KILN_DT_Q6_K: w->fmt = KILN_WF_Q6_K; w->row_bytes = (size_t)cols / 256 * 210; break;
    case KILN_DT_Q2_K: w->fmt = KILN_WF_Q2_K; w->row_bytes = (size_t)cols / 256 * 84; break;
    case KILN_DT_Q3_K: w->fmt = KILN_WF_Q3_K; w->row_bytes = (size_t)cols / 256 * 110; break;
    case KILN_DT_IQ4_XS: w->fmt = KILN_WF_IQ4_XS; w->row_bytes = (size_t)cols / 256 * 136; break;
    case KILN_DT_Q4_1: w->fmt = KILN_WF_Q4_1; w->row_bytes = (size_t)cols / 32 * 20; break;
    case KILN_DT_Q5_0: w->fmt = KILN_WF_Q5_0; w->row_bytes = (size_t)cols / 32 * 22; break;
    case KILN_DT_Q5_1: w->fmt = KILN_WF_Q5_1; w->row_bytes = (size_t)cols / 32 * 24; break;
    case KILN_DT_IQ4_NL: w->fmt = KILN_WF_IQ4_NL; w->row_bytes = (size_t)cols / 32 * 18; break;
    case KILN_DT_Q8_K:
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s' is Q8_K, ggml's activation-side type (the other operand of its K-quant "
                         "dot products), which llama.cpp never stores weights in: not read as a weight matrix",
                         t->file ? t->file : "?", t->name);
    default:
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s is not supported for a weight matrix",
                         t->file ? t->file : "?", t->name, kiln_dtype_get(t->dtype)->name);
    }
    const int blk = kiln_dtype_get(t->dtype)->block_elems;
    if (blk > 1 && cols % blk)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' (%s): %lld columns is not a multiple of its block of %d", t->file, t->name,
                         kiln_dtype_get(t->dtype)->name, (long long)cols, blk);
    return KILN_OK;
}

kiln_status kiln_model_bind(struct kiln_model *m) {
    /* llama2.c and GGUF files come as llama without config.json: the llama row binds them */
    if (!m->arch) {
        if (strcmp(m->hp.arch, "llama") != 0) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: architecture '%s' not supported", m->path, m->hp.arch);
        m->arch = &kiln_arch_llama;
    }
    return m->arch->bind(m);
}

/* ---- info ----------------------------------------------------------------------------------------- */

static uint64_t weight_bytes(const kiln_model *m) {
    uint64_t b = 0;
    for (int i = 0; i < m->tt.n; i++) b += m->tt.v[i].nbytes;
    return b;
}

int kiln_model_context(const kiln_model *m, const kiln_options *o) {
    int file = m->hp.max_seq;
    if (o && o->max_context > 0) return o->max_context < file ? o->max_context : file;
    return file < KILN_DEFAULT_CONTEXT_CAP ? file : KILN_DEFAULT_CONTEXT_CAP;
}

int kiln_model_is_eos(const kiln_model_info *info, int id) {
    for (int i = 0; i < info->n_eos; i++)
        if (info->eos_ids[i] == id) return 1;
    return 0;
}

void kiln_model_get_info(const kiln_model *m, kiln_model_info *in) {
    const kiln_hparams *hp = &m->hp;
    memset(in, 0, sizeof *in);
    in->arch = hp->arch;
    in->vocab_size = hp->vocab; in->dim = hp->dim; in->n_layers = hp->n_layers; in->n_heads = hp->n_heads;
    in->n_kv_heads = hp->n_kv_heads; in->head_dim = hp->head_dim; in->ffn_dim = hp->ffn_dim;
    in->max_context = hp->max_seq; in->bos_id = hp->bos_id; in->eos_id = hp->eos_id;
    in->has_tokenizer = m->tok != NULL;
    in->n_eos = hp->n_eos;
    for (int i = 0; i < hp->n_eos && i < KILN_MAX_EOS; i++) in->eos_ids[i] = hp->eos_ids[i];
    in->weight_bytes = weight_bytes(m);
}

/* kiln_arch_tensor_unused for every model: llama2.c files have no arch state and read every tensor. */
static int unused_reason(const kiln_model *m, const kiln_tensor *t, char *buf, size_t cap) {
    if (!m->arch_state) {
        if (t->used) return 0;
        snprintf(buf, cap, "not read by the %s architecture", m->hp.arch);
        return 1;
    }
    return kiln_arch_tensor_unused(m, t, buf, cap);
}

kiln_status kiln_model_describe(const kiln_model *m, FILE *f, int json) {
    const kiln_hparams *hp = &m->hp;
    if (json) {
        json_t *o = json_object(), *h = json_object(), *ts = json_array();
        json_object_set_new(o, "path", json_string(m->path));
        json_object_set_new(o, "format", json_string(m->format));
        json_object_set_new(o, "arch", json_string(hp->arch));
#define HI(k, v) json_object_set_new(h, k, json_integer(v))
        HI("vocab_size", hp->vocab); HI("hidden_size", hp->dim); HI("num_hidden_layers", hp->n_layers);
        HI("num_attention_heads", hp->n_heads); HI("num_key_value_heads", hp->n_kv_heads); HI("head_dim", hp->head_dim);
        HI("intermediate_size", hp->ffn_dim); HI("max_position_embeddings", hp->max_seq);
        HI("bos_token_id", hp->bos_id); HI("eos_token_id", hp->eos_id); HI("tie_word_embeddings", hp->tie_embeddings);
#undef HI
        json_object_set_new(h, "rms_norm_eps", json_real(hp->norm_eps));
        json_object_set_new(h, "rope_theta", json_real(hp->rope_theta));
        json_object_set_new(h, "rope_style", json_string(hp->rope_style == KILN_ROPE_NEOX ? "neox" : "norm"));
        json_object_set_new(o, "hparams", h);
        for (int i = 0; i < m->tt.n; i++) {
            const kiln_tensor *t = &m->tt.v[i];
            json_t *jt = json_object(), *sh = json_array();
            for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
            json_object_set_new(jt, "name", json_string(t->name));
            json_object_set_new(jt, "dtype", json_string(kiln_dtype_get(t->dtype)->name));
            json_object_set_new(jt, "shape", sh);
            json_object_set_new(jt, "bytes", json_integer((json_int_t)t->nbytes));
            json_array_append_new(ts, jt);
        }
        json_object_set_new(o, "tensors", ts);
        json_t *un = json_array();
        for (int i = 0; i < m->tt.n; i++) {
            char why[256];
            if (!unused_reason(m, &m->tt.v[i], why, sizeof why)) continue;
            json_t *u = json_object();
            json_object_set_new(u, "name", json_string(m->tt.v[i].name));
            json_object_set_new(u, "reason", json_string(why));
            json_array_append_new(un, u);
        }
        json_object_set_new(o, "unused_tensors", un);
        json_object_set_new(o, "n_tensors", json_integer(m->tt.n));
        json_object_set_new(o, "weight_bytes", json_integer((json_int_t)weight_bytes(m)));
        json_object_set_new(o, "has_tokenizer", json_boolean(m->tok != NULL));
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(o);
        if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        fprintf(f, "%s\n", s);
        free(s);
        return KILN_OK;
    }
    fprintf(f, "model:        %s (%s)\n", m->path, m->format);
    fprintf(f, "architecture: %s\n", hp->arch);
    fprintf(f, "vocab %d, dim %d, layers %d, heads %d, kv_heads %d, head_dim %d, ffn %d, context %d\n", hp->vocab, hp->dim,
            hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->ffn_dim, hp->max_seq);
    fprintf(f, "rms_norm_eps %g, rope_theta %g (%s), tied embeddings %s, bos %d, eos %d, tokenizer %s\n", hp->norm_eps,
            hp->rope_theta, hp->rope_style == KILN_ROPE_NEOX ? "neox" : "norm", hp->tie_embeddings ? "yes" : "no", hp->bos_id,
            hp->eos_id, m->tok ? "yes" : "no");
    fprintf(f, "tensors (%d):\n", m->tt.n);
    for (int i = 0; i < m->tt.n; i++) {
        const kiln_tensor *t = &m->tt.v[i];
        fprintf(f, "  %-56s %-9s [", t->name, kiln_dtype_get(t->dtype)->name);
        for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        fprintf(f, "]\n");
    }
    fprintf(f, "total weight bytes: %llu\n", (unsigned long long)weight_bytes(m));
    int n_unused = 0;
    for (int i = 0; i < m->tt.n; i++) {
        char why[256];
        if (!unused_reason(m, &m->tt.v[i], why, sizeof why)) continue;
        if (n_unused++ == 0) fprintf(f, "tensors not used by the forward pass:\n");
        fprintf(f, "  %-56s %s\n", m->tt.v[i].name, why);
    }
    if (n_unused == 0) fprintf(f, "every tensor is used by the forward pass\n");
    return KILN_OK;
}
