/* quantize_save.c — `kiln quantize`: re-quantize the linear layers of any model kiln loads
 * (F32/F16/BF16/FP8/INT4/GGUF) and write a Hugging Face directory in the checkpoint conventions
 * vLLM / SGLang load:
 *   fp8:  X.weight F8_E4M3 [out, in] + X.weight_scale_inv F32 [ceil(out/128), ceil(in/128)];
 *         quantization_config {quant_method: "fp8", fmt: "e4m3", activation_scheme: "dynamic",
 *         weight_block_size: [128, 128]} (the DeepSeek-V3 layout).
 *   int4: X.weight_packed I32 [out, in/8] + X.weight_scale BF16 [out, in/group] + X.weight_shape
 *         I64 [2]; quantization_config {quant_method: "compressed-tensors", format: "pack-quantized",
 *         config_groups.group_0 {targets: ["Linear"], weights {num_bits: 4, type: "int",
 *         symmetric: true, strategy: "group", group_size, dynamic: false}}, ignore: [layers kept]}
 *         (the Kimi K2 layout).
 * Scope: all (every linear layer, lm_head included), mlp (MLP / expert projections), experts (routed
 * experts only). Embeddings and norms are never quantized. Other tensors are written as they are. */
#include "model/export.h"
#include "base/status.h"
#include "format/safetensors.h"
#include "quant/quantize.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Is `prefix` (a linear layer name without ".weight") inside the scope? */
static int in_scope(const char *prefix, const char *scope) {
    if (strstr(prefix, "embed_tokens") || strstr(prefix, "word_embeddings") || strstr(prefix, "embedding")) return 0;
    if (strcmp(scope, "all") == 0) return 1;
    int expert = strstr(prefix, ".experts.") != NULL;
    if (strcmp(scope, "experts") == 0) return expert;
    /* mlp: dense MLPs, routed and shared experts (not the router gate, which is tiny and sensitive) */
    return (strstr(prefix, ".mlp.") || strstr(prefix, ".dense_h_to_4h") || strstr(prefix, ".dense_4h_to_h")) &&
           !ends_with(prefix, ".mlp.gate");
}

/* A tensor that belongs to a linear layer's quantized storage (other than the main weight). */
static int is_companion(const char *name) {
    return ends_with(name, ".weight_scale_inv") || ends_with(name, ".weight_scale") || ends_with(name, ".weight_shape");
}

typedef struct { kiln_tensor *v; int n, cap; } tvec;
static kiln_status push(tvec *t, kiln_tensor x) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        kiln_tensor *v = realloc(t->v, (size_t)cap * sizeof *v);
        if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = x;
    return KILN_OK;
}

kiln_status kiln_model_quantize_save(const kiln_model *m, const char *dir, const char *weights, int group, const char *scope,
                                     int progress) {
    int fp8 = strcmp(weights, "fp8") == 0, int4 = strcmp(weights, "int4") == 0;
    if (!fp8 && !int4) return kiln_fail(KILN_ERR_INVALID_ARG, "quantize: --weights '%s' is not fp8 or int4", weights);
    if (int4 && group != 32 && group != 128) return kiln_fail(KILN_ERR_INVALID_ARG, "quantize: --group %d is not 32 or 128", group);
    if (strcmp(scope, "all") && strcmp(scope, "mlp") && strcmp(scope, "experts"))
        return kiln_fail(KILN_ERR_INVALID_ARG, "quantize: --scope '%s' is not all, mlp or experts", scope);
    KILN_TRY(kiln_export_make_dir(dir));
    kiln_tensor *src;
    void **own_src;
    KILN_TRY(kiln_export_tensors(m, m->config ? m->hp.rope_style : KILN_ROPE_NEOX, 0, &src, &own_src));
    tvec out = {0};
    void **owned = calloc((size_t)m->tt.n * 4 + 1, sizeof *owned);
    char **names = calloc((size_t)m->tt.n * 3 + 1, sizeof *names);
    int n_owned = 0, n_names = 0, n_quant = 0, n_total_linear = 0;
    json_t *ignore = json_array();
    kiln_status st = owned && names ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m->tt.n && st == KILN_OK; i++) {
        const kiln_tensor *t = &src[i];
        char prefix[256] = "";
        int linear = 0;
        if (ends_with(t->name, ".weight_packed")) { snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(t->name) - 14), t->name); linear = 1; }
        else if (ends_with(t->name, ".weight") && t->ndim == 2) { snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(t->name) - 7), t->name); linear = 1; }
        else if (is_companion(t->name)) {
            char base[256];
            snprintf(base, sizeof base, "%s", t->name);
            *strrchr(base, '.') = 0;
            char wn[300];
            snprintf(wn, sizeof wn, "%s.weight_packed", base);
            int has_packed = kiln_tt_find(&m->tt, wn) != NULL;
            snprintf(wn, sizeof wn, "%s.weight", base);
            const kiln_tensor *w = kiln_tt_find(&m->tt, wn);
            if (has_packed || (w && w->ndim == 2)) continue; /* handled with its linear layer */
        }
        if (!linear) { st = push(&out, *t); continue; }
        n_total_linear++;
        int quant = in_scope(prefix, scope);
        if (!quant || strstr(prefix, "embed")) {
            json_array_append_new(ignore, json_string(prefix));
            /* keep the layer as stored: the weight and its companions */
            st = push(&out, *t);
            const char *sfx[] = {"weight_scale_inv", "weight_scale", "weight_shape"};
            for (int k = 0; k < 3 && st == KILN_OK; k++) {
                char cn[300];
                snprintf(cn, sizeof cn, "%s.%s", prefix, sfx[k]);
                const kiln_tensor *c = kiln_tt_find(&m->tt, cn);
                if (c) st = push(&out, *c);
            }
            continue;
        }
        /* The source weight as a kiln_weight view (whatever its storage), taken from the exported
         * (possibly RoPE-permuted) tensor for plain dtypes and from the model for quantized ones. */
        int64_t rows = t->shape[0], cols = ends_with(t->name, ".weight_packed") ? t->shape[1] * 8 : t->shape[1];
        kiln_weight w;
        if (t->dtype == KILN_DT_F32 || t->dtype == KILN_DT_F16 || t->dtype == KILN_DT_BF16) st = kiln_weight_from_tensor(t, rows, cols, &w);
        else st = kiln_bind_linear((struct kiln_model *)m, prefix, rows, cols, &w);
        if (st != KILN_OK) break;
        if (int4 && cols % group) { /* cannot be grouped: keep it, and say so in the ignore list */
            fprintf(stderr, "quantize: %s: %lld input columns are not a multiple of group %d; kept as %s\n", prefix, (long long)cols,
                    group, kiln_dtype_get(t->dtype)->name);
            json_array_append_new(ignore, json_string(prefix));
            st = push(&out, *t);
            continue;
        }
        kiln_weight q;
        void *qd = NULL, *qs = NULL;
        st = kiln_quantize_weight(&w, fp8 ? KILN_WF_FP8_BLOCK : KILN_WF_INT4_GROUP, fp8 ? 128 : group, &q, &qd, &qs);
        if (st != KILN_OK) break;
        owned[n_owned++] = qd;
        owned[n_owned++] = qs;
        n_quant++;
        char *nm = malloc(strlen(prefix) + 24), *ns = malloc(strlen(prefix) + 24);
        names[n_names++] = nm;
        names[n_names++] = ns;
        kiln_tensor a = {0}, b = {0};
        a.name = nm; b.name = ns;
        if (fp8) {
            sprintf(nm, "%s.weight", prefix);
            sprintf(ns, "%s.weight_scale_inv", prefix);
            a.dtype = KILN_DT_F8_E4M3; a.ndim = 2; a.shape[0] = rows; a.shape[1] = cols; a.data = qd; a.nbytes = (uint64_t)rows * cols;
            b.dtype = KILN_DT_F32; b.ndim = 2; b.shape[0] = (rows + 127) / 128; b.shape[1] = (cols + 127) / 128; b.data = qs;
            b.nbytes = (uint64_t)b.shape[0] * b.shape[1] * 4;
            if ((st = push(&out, a)) || (st = push(&out, b))) break;
        } else {
            sprintf(nm, "%s.weight_packed", prefix);
            sprintf(ns, "%s.weight_scale", prefix);
            a.dtype = KILN_DT_I32; a.ndim = 2; a.shape[0] = rows; a.shape[1] = cols / 8; a.data = qd; a.nbytes = (uint64_t)rows * cols / 2;
            b.dtype = KILN_DT_BF16; b.ndim = 2; b.shape[0] = rows; b.shape[1] = cols / group; b.data = qs;
            b.nbytes = (uint64_t)rows * (cols / group) * 2;
            char *nshape = malloc(strlen(prefix) + 24);
            int64_t *shp = malloc(16);
            names[n_names++] = nshape;
            owned[n_owned++] = shp;
            sprintf(nshape, "%s.weight_shape", prefix);
            shp[0] = rows; shp[1] = cols;
            kiln_tensor c = {0};
            c.name = nshape; c.dtype = KILN_DT_I64; c.ndim = 1; c.shape[0] = 2; c.data = (const uint8_t *)shp; c.nbytes = 16;
            if ((st = push(&out, a)) || (st = push(&out, b)) || (st = push(&out, c))) break;
        }
        if (progress) {
            fprintf(stderr, "\rquantize: %d/%d layers", n_quant, n_total_linear);
            fflush(stderr);
        }
    }
    if (progress && st == KILN_OK) fprintf(stderr, "\n");
    char path[4200];
    if (st == KILN_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = kiln_safetensors_write(path, out.v, out.n);
    }
    if (st == KILN_OK) {
        json_t *cfg = kiln_export_config(m), *qc = json_object();
        if (fp8) {
            json_object_set_new(qc, "quant_method", json_string("fp8"));
            json_object_set_new(qc, "fmt", json_string("e4m3"));
            json_object_set_new(qc, "activation_scheme", json_string("dynamic"));
            json_t *wbs = json_array();
            json_array_append_new(wbs, json_integer(128));
            json_array_append_new(wbs, json_integer(128));
            json_object_set_new(qc, "weight_block_size", wbs);
            json_object_set_new(qc, "modules_to_not_convert", ignore);
        } else {
            json_t *groups = json_object(), *g0 = json_object(), *wq = json_object(), *targets = json_array();
            json_array_append_new(targets, json_string("Linear"));
            json_object_set_new(wq, "num_bits", json_integer(4));
            json_object_set_new(wq, "type", json_string("int"));
            json_object_set_new(wq, "symmetric", json_true());
            json_object_set_new(wq, "strategy", json_string("group"));
            json_object_set_new(wq, "group_size", json_integer(group));
            json_object_set_new(wq, "dynamic", json_false());
            json_object_set_new(wq, "actorder", json_null());
            json_object_set_new(wq, "observer", json_string("minmax"));
            json_object_set_new(g0, "targets", targets);
            json_object_set_new(g0, "weights", wq);
            json_object_set_new(g0, "input_activations", json_null());
            json_object_set_new(g0, "output_activations", json_null());
            json_object_set_new(groups, "group_0", g0);
            json_object_set_new(qc, "quant_method", json_string("compressed-tensors"));
            json_object_set_new(qc, "format", json_string("pack-quantized"));
            json_object_set_new(qc, "quantization_status", json_string("compressed"));
            json_object_set_new(qc, "config_groups", groups);
            json_object_set_new(qc, "kv_cache_scheme", json_null());
            json_object_set_new(qc, "ignore", ignore);
        }
        ignore = NULL;
        json_object_set_new(cfg, "quantization_config", qc);
        snprintf(path, sizeof path, "%s/config.json", dir);
        st = kiln_export_write_json(cfg, path);
    }
    if (st == KILN_OK && m->tok) st = kiln_tok_save_hf(m->tok, dir);
    if (ignore) json_decref(ignore);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    for (int i = 0; i < n_names; i++) free(names[i]);
    free(owned);
    free(names);
    free(out.v);
    free(src);
    kiln_export_free_owned(own_src);
    return st;
}
