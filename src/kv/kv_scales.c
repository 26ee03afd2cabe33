/* kv_scales.c — FP8 KV scales from checkpoint tensors and kv_scales.json (see kv_scales.h). */
#include "kv/kv_scales.h"
#include "base/status.h"
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A scale is used as a float and inverted (quantization multiplies by 1 / scale): it must be a normal
 * positive float — a smaller one (a denormal, or a double that rounds to float 0) has no finite
 * inverse — and below 3e38. (Found by the kv_scales fuzz target: v_scale 2e-127 read as 0.) */
static int good_scale(double v) { return isfinite(v) && v >= (double)FLT_MIN && v < 3.0e38; }
#define SCALE_RANGE "a normal float, 1.2e-38 to 3e+38"

/* Reads one scale tensor into out[H] (broadcast a scalar). */
static kiln_status read_scale_tensor(const kiln_tensor *t, int H, float *out) {
    const kiln_dtype_info *di = kiln_dtype_get(t->dtype);
    uint64_t n = kiln_tensor_numel(t);
    if (t->dtype != KILN_DT_F32 && t->dtype != KILN_DT_BF16 && t->dtype != KILN_DT_F16)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': dtype %s is not f32, bf16 or f16", t->file ? t->file : "?", t->name, di->name);
    if (n != 1 && n != (uint64_t)H)
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has %llu values; a KV scale is a scalar or one per KV head (%d)",
                         t->file ? t->file : "?", t->name, (unsigned long long)n, H);
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    di->to_f32(t->data, v, (size_t)n);
    for (uint64_t i = 0; i < n; i++)
        if (!good_scale(v[i])) {
            kiln_status st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s'[%llu] = %g is not a positive finite scale (" SCALE_RANGE ")",
                                       t->file ? t->file : "?", t->name, (unsigned long long)i, (double)v[i]);
            free(v);
            return st;
        }
    for (int h = 0; h < H; h++) out[h] = v[n == 1 ? 0 : h];
    free(v);
    return KILN_OK;
}

kiln_status kiln_kv_scales_from_checkpoint(const kiln_tensor_table *tt, const char *model_path, int L, int H, int v_shares_k,
                                           float *ks, float *vs, int *found) {
    *found = 0;
    char name[160];
    int n_k = 0;
    for (int l = 0; l < L; l++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_scale", l);
        n_k += kiln_tt_find(tt, name) != NULL;
    }
    if (n_k == 0) return KILN_OK;
    for (int l = 0; l < L; l++)
        for (int kind = 0; kind < (v_shares_k ? 1 : 2); kind++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", l, kind ? "v_scale" : "k_scale");
            const kiln_tensor *t = kiln_tt_find(tt, name);
            if (!t)
                return kiln_fail(KILN_ERR_FORMAT, "%s: missing tensor '%s' (the checkpoint carries KV scales for %d of %d layers)",
                                 model_path, name, n_k, L);
            KILN_TRY(read_scale_tensor(t, H, (kind ? vs : ks) + (size_t)l * H));
        }
    if (v_shares_k && vs) memcpy(vs, ks, (size_t)L * H * sizeof *vs);
    *found = 1;
    return KILN_OK;
}

static kiln_status read_matrix(const char *path, json_t *root, const char *key, int L, int H, float *out) {
    json_t *a = json_object_get(root, key);
    if (!a) return kiln_fail(KILN_ERR_FORMAT, "%s: required field '%s' is missing", path, key);
    if (!json_is_array(a)) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' is not an array (one row per layer)", path, key);
    if ((int)json_array_size(a) != L)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' has %zu layers but the model has %d", path, key, json_array_size(a), L);
    for (int l = 0; l < L; l++) {
        json_t *row = json_array_get(a, (size_t)l);
        if (!json_is_array(row))
            return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s[%d]' is not an array (one scale per KV head)", path, key, l);
        if ((int)json_array_size(row) != H)
            return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s[%d]' has %zu heads but the model has %d KV heads", path, key, l,
                             json_array_size(row), H);
        for (int h = 0; h < H; h++) {
            json_t *v = json_array_get(row, (size_t)h);
            if (!json_is_number(v))
                return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s[%d][%d]' is not a number", path, key, l, h);
            double d = json_number_value(v);
            if (!good_scale(d))
                return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s[%d][%d]' = %g is not a positive finite scale (" SCALE_RANGE ")", path, key, l, h, d);
            out[(size_t)l * H + h] = (float)d;
        }
    }
    return KILN_OK;
}

static kiln_status check_int(const char *path, json_t *root, const char *key, int want, const char *what) {
    json_t *v = json_object_get(root, key);
    if (!v) return kiln_fail(KILN_ERR_FORMAT, "%s: required field '%s' is missing", path, key);
    if (!json_is_integer(v)) return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' is not an integer", path, key);
    if (json_integer_value(v) != want)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' = %lld but the model has %d %s", path, key, (long long)json_integer_value(v), want, what);
    return KILN_OK;
}

static kiln_status read_means(const char *path, json_t *root, int L, int H, int kd, float *out) {
    json_t *a = json_object_get(root, "k_mean");
    if (!json_is_array(a) || (int)json_array_size(a) != L)
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'k_mean' is not an array of %d layers", path, L);
    for (int l = 0; l < L; l++) {
        json_t *hs = json_array_get(a, (size_t)l);
        if (!json_is_array(hs) || (int)json_array_size(hs) != H)
            return kiln_fail(KILN_ERR_FORMAT, "%s: field 'k_mean[%d]' is not an array of %d KV heads", path, l, H);
        for (int h = 0; h < H; h++) {
            json_t *row = json_array_get(hs, (size_t)h);
            if (!json_is_array(row) || (int)json_array_size(row) != kd)
                return kiln_fail(KILN_ERR_FORMAT, "%s: field 'k_mean[%d][%d]' is not an array of %d channels (the model's head dim)", path, l, h, kd);
            for (int d = 0; d < kd; d++) {
                json_t *v = json_array_get(row, (size_t)d);
                double x = json_is_number(v) ? json_number_value(v) : NAN;
                if (!isfinite(x) || fabs(x) > 3.0e38)
                    return kiln_fail(KILN_ERR_FORMAT, "%s: field 'k_mean[%d][%d][%d]' is not a finite number", path, l, h, d);
                out[((size_t)l * H + (size_t)h) * (size_t)kd + (size_t)d] = (float)x;
            }
        }
    }
    return KILN_OK;
}

kiln_status kiln_kv_scales_read_json(const char *path, int L, int H, int kd, int v_shares_k, float *ks, float *vs, float *km,
                                     int *has_mean) {
    return kiln_kv_scales_read_json_mode(path, L, H, kd, v_shares_k, ks, vs, km, has_mean, NULL);
}

kiln_status kiln_kv_scales_read_json_mode(const char *path, int L, int H, int kd, int v_shares_k, float *ks, float *vs, float *km,
                                          int *has_mean, int *prerope) {
    if (has_mean) *has_mean = 0;
    if (prerope) *prerope = 0;
    json_error_t e;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!root) {
        FILE *f = fopen(path, "rb");
        if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open", path);
        fclose(f);
        return kiln_fail(KILN_ERR_FORMAT, "%s: line %d: %s", path, e.line, e.text);
    }
    kiln_status st = KILN_OK;
    const char *fmt = json_string_value(json_object_get(root, "format"));
    const char *dt = json_string_value(json_object_get(root, "dtype"));
    if (!json_is_object(root)) st = kiln_fail(KILN_ERR_FORMAT, "%s: not a JSON object", path);
    else if (!fmt || strcmp(fmt, "kiln-kv-scales") != 0)
        st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'format' must be \"kiln-kv-scales\"", path);
    else if (json_integer_value(json_object_get(root, "version")) != 1)
        st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'version' must be 1", path);
    else if (dt && strcmp(dt, "fp8_e4m3") != 0)
        st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'dtype' = \"%s\" is not \"fp8_e4m3\"", path, dt);
    if (st == KILN_OK) st = check_int(path, root, "num_layers", L, "layers");
    if (st == KILN_OK) st = check_int(path, root, "num_kv_heads", H, "KV heads");
    if (st == KILN_OK) st = read_matrix(path, root, "k_scale", L, H, ks);
    if (st == KILN_OK && vs) {
        if (v_shares_k && !json_object_get(root, "v_scale")) memcpy(vs, ks, (size_t)L * H * sizeof *vs);
        else st = read_matrix(path, root, "v_scale", L, H, vs);
        if (st == KILN_OK && v_shares_k) memcpy(vs, ks, (size_t)L * H * sizeof *vs); /* V is read from K storage */
    }
    if (st == KILN_OK && json_object_get(root, "k_mean")) {
        if (v_shares_k) st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'k_mean' (K smoothing) cannot apply when V shares the K row (MLA)", path);
        else if (km) {
            st = read_means(path, root, L, H, kd, km);
            if (st == KILN_OK && has_mean) *has_mean = 1;
        }
    }
    json_t *mode = json_object_get(root, "k_smooth");
    if (st == KILN_OK && mode) {
        const char *ms = json_string_value(mode);
        if (!ms || (strcmp(ms, "post") != 0 && strcmp(ms, "prerope") != 0))
            st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'k_smooth' is not \"post\" or \"prerope\"", path);
        else if (!json_object_get(root, "k_mean"))
            st = kiln_fail(KILN_ERR_FORMAT, "%s: field 'k_smooth' = \"%s\" but the file has no 'k_mean'", path, ms);
        else if (prerope) *prerope = strcmp(ms, "prerope") == 0;
    }
    json_decref(root);
    return st;
}

kiln_status kiln_kv_scales_write_json(const char *path, int L, int H, int kd, const float *ks, const float *vs, const float *km,
                                      float margin, const char *source, uint64_t n_tokens) {
    return kiln_kv_scales_write_json_mode(path, L, H, kd, ks, vs, km, margin, source, n_tokens, 0);
}

kiln_status kiln_kv_scales_write_json_mode(const char *path, int L, int H, int kd, const float *ks, const float *vs, const float *km,
                                           float margin, const char *source, uint64_t n_tokens, int prerope) {
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string("kiln-kv-scales"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "dtype", json_string("fp8_e4m3"));
    json_object_set_new(root, "num_layers", json_integer(L));
    json_object_set_new(root, "num_kv_heads", json_integer(H));
    json_object_set_new(root, "margin", json_real(margin));
    json_object_set_new(root, "tokens", json_integer((json_int_t)n_tokens));
    json_object_set_new(root, "source", json_string(source ? source : ""));
    json_object_set_new(root, "rule", json_string("scale = max(amax, 1e-6) * margin / 448 per layer and KV head; value = fp8 * scale"));
    for (int kind = 0; kind < 2; kind++) {
        json_t *a = json_array();
        const float *s = kind ? vs : ks;
        for (int l = 0; l < L; l++) {
            json_t *row = json_array();
            for (int h = 0; h < H; h++) json_array_append_new(row, json_real(s[(size_t)l * H + h]));
            json_array_append_new(a, row);
        }
        json_object_set_new(root, kind ? "v_scale" : "k_scale", a);
    }
    if (km) {
        if (prerope) {
            json_object_set_new(root, "k_smooth", json_string("prerope"));
            json_object_set_new(root, "k_smoothing", json_string("k_mean is the mean of K before RoPE; K of position pos is stored as K - R(pos) k_mean "
                                                                 "(R: the model's RoPE rotation); k_scale applies to K - R(pos) k_mean"));
        } else {
            json_object_set_new(root, "k_smooth", json_string("post"));
            json_object_set_new(root, "k_smoothing", json_string("K is stored as K - k_mean (per layer, KV head, channel); k_scale applies to K - k_mean"));
        }
        json_t *a = json_array();
        for (int l = 0; l < L; l++) {
            json_t *hs = json_array();
            for (int h = 0; h < H; h++) {
                json_t *row = json_array();
                for (int d = 0; d < kd; d++) json_array_append_new(row, json_real(km[((size_t)l * H + (size_t)h) * (size_t)kd + (size_t)d]));
                json_array_append_new(hs, row);
            }
            json_array_append_new(a, hs);
        }
        json_object_set_new(root, "k_mean", a);
    }
    int rc = json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(9));
    json_decref(root);
    if (rc != 0) return kiln_fail(KILN_ERR_IO, "%s: cannot write", path);
    return KILN_OK;
}
