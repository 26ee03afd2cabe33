/* bind_linear.c — binding linear layers in every checkpoint storage convention kiln honours:
 * plain (F32/F16/BF16, GGUF Q8_0/Q4_0), FP8 E4M3 with 128×128 block scales (DeepSeek-V3 / GLM-FP8:
 * `weight` + `weight_scale_inv`, dequant = fp8 × scale_inv), and INT4 compressed-tensors
 * pack-quantized (Kimi K2.x: `weight_packed` int32 [out, in/8] with eight values offset by +8,
 * lowest nibble first; `weight_scale` [out, in/group]; `weight_shape` [2]), and FP8 compressed-tensors
 * float-quantized (GLM-4.7-FP8 style: `weight` F8_E4M3 [out, in] × `weight_scale` of strategy
 * "block" [out/B, in/B], "tensor" [1] or "channel" [out, 1]). Block and tensor scales run on the
 * FP8 block kernels exactly (a tensor scale fills every block); per-channel scales have no kernel
 * of their own yet, so those weights are widened at load to BF16 = bf16(fp8 × scale), the same
 * numbers a dequantized BF16 twin holds, at twice the FP8 bytes. */
#include "model/model.h"
#include "base/fp.h"
#include "base/status.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const kiln_tensor *find2(const struct kiln_model *m, const char *prefix, const char *suffix) {
    char n[256];
    snprintf(n, sizeof n, "%s.%s", prefix, suffix);
    return kiln_tt_find(&m->tt, n);
}

static const char *fname(const kiln_tensor *t) { return t->file ? t->file : "?"; }

/* Scales as the kernels want them (FP8: f32; INT4: bf16); other float dtypes get an owned copy.
 * Every scale must be finite (and positive for FP8 scale_inv... zero allowed for all-zero blocks). */
static kiln_status scales_as(struct kiln_model *m, const kiln_tensor *t, kiln_dtype want, const void **out) {
    uint64_t n = kiln_tensor_numel(t);
    const kiln_dtype_info *di = kiln_dtype_get(t->dtype);
    if (!di->to_f32) return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': dtype %s is not a float scale dtype", fname(t), t->name, di->name);
    float *f = malloc(n * 4);
    if (!f) return kiln_fail_oom(fname(t), t->name, (unsigned long long)n * 4);
    di->to_f32(t->data, f, n);
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(f[i]) || f[i] < 0) {
            kiln_status st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': scale [%llu] = %g is not a finite non-negative number",
                                       fname(t), t->name, (unsigned long long)i, (double)f[i]);
            free(f);
            return st;
        }
    if (t->dtype == want && ((uintptr_t)t->data % (want == KILN_DT_F32 ? 4 : 2)) == 0) { free(f); *out = t->data; return KILN_OK; }
    if (want == KILN_DT_F32) { *out = kiln_model_own(m, f); return *out ? KILN_OK : kiln_fail_oom(fname(t), t->name, 0); }
    uint16_t *b = malloc(n * 2);
    if (!b) { free(f); return kiln_fail_oom(fname(t), t->name, (unsigned long long)n * 2); }
    for (uint64_t i = 0; i < n; i++) b[i] = kiln_f32_to_bf16(f[i]);
    free(f);
    *out = kiln_model_own(m, b);
    return *out ? KILN_OK : kiln_fail_oom(fname(t), t->name, 0);
}

static int shape_is(const kiln_tensor *t, int64_t a, int64_t b) { return t->ndim == 2 && t->shape[0] == a && t->shape[1] == b; }

/* The FP8 block size the config names: quantization_config.weight_block_size (fp8), or the
 * block_structure of a compressed-tensors float-quantized weights group; 128 when neither. */
static int config_fp8_block(const struct kiln_model *m) {
    json_t *qc = m->config ? json_object_get((json_t *)m->config, "quantization_config") : NULL;
    json_t *wbs = qc ? json_object_get(qc, "weight_block_size") : NULL;
    if (json_is_array(wbs) && json_array_size(wbs) == 2) return (int)json_integer_value(json_array_get(wbs, 0));
    json_t *groups = qc ? json_object_get(qc, "config_groups") : NULL;
    const char *gname;
    json_t *g;
    json_object_foreach(groups, gname, g) {
        json_t *bs = json_object_get(json_object_get(g, "weights"), "block_structure");
        if (json_is_array(bs) && json_array_size(bs) == 2) return (int)json_integer_value(json_array_get(bs, 0));
    }
    return 128;
}

/* compressed-tensors FP8 with one scale per tensor ([1], [1, 1] or a scalar) or per output channel
 * ([rows, 1] / [rows]): *w becomes FP8 block-128 with the tensor scale in every block (exact), or
 * BF16 = bf16(fp8 × scale[row]) for channel scales. Returns 0 when sc has neither shape. */
static int fp8_tensor_or_channel(struct kiln_model *m, const kiln_tensor *t, const kiln_tensor *sc, int64_t rows, int64_t cols, kiln_weight *w,
                                 kiln_status *st) {
    const uint64_t ns = kiln_tensor_numel(sc);
    const int per_tensor = ns == 1, per_channel = (int64_t)ns == rows && rows > 1 && (sc->ndim == 1 || (sc->ndim == 2 && sc->shape[1] == 1));
    if (!per_tensor && !per_channel) return 0;
    const float *s;
    *st = scales_as(m, sc, KILN_DT_F32, (const void **)&s);
    if (*st) return 1;
    if (per_tensor) {
        const int B = 128;
        const int64_t nb = ((rows + B - 1) / B) * ((cols + B - 1) / B);
        float *bs = kiln_model_own(m, malloc((size_t)nb * sizeof *bs));
        if (!bs) { *st = kiln_fail_oom(fname(sc), sc->name, (unsigned long long)nb * 4); return 1; }
        for (int64_t i = 0; i < nb; i++) bs[i] = s[0];
        *w = (kiln_weight){.fmt = KILN_WF_FP8_BLOCK, .rows = rows, .cols = cols, .data = t->data, .row_bytes = (size_t)cols, .block = B, .scales = bs};
        return 1;
    }
    uint16_t *b = kiln_model_own(m, kiln_alloc64((size_t)rows * (size_t)cols * sizeof *b));
    if (!b) { *st = kiln_fail_oom(fname(t), t->name, (unsigned long long)rows * (unsigned long long)cols * 2); return 1; }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) b[r * cols + c] = kiln_f32_to_bf16(kiln_fp8_e4m3_to_f32(t->data[r * cols + c]) * s[r]);
    *w = (kiln_weight){.fmt = KILN_WF_BF16, .rows = rows, .cols = cols, .data = (const uint8_t *)b, .row_bytes = (size_t)cols * 2};
    *st = KILN_OK;
    return 1;
}

kiln_status kiln_bind_linear(struct kiln_model *m, const char *prefix, int64_t rows, int64_t cols, kiln_weight *w) {
    memset(w, 0, sizeof *w);
    const kiln_tensor *packed = find2(m, prefix, "weight_packed");
    if (packed) {
        const kiln_tensor *sc = find2(m, prefix, "weight_scale"), *shp = find2(m, prefix, "weight_shape");
        if (!sc) return kiln_fail(KILN_ERR_FORMAT, "%s: missing tensor '%s.weight_scale' for INT4 weight '%s'", fname(packed), prefix, packed->name);
        if (shp) { /* weight_shape holds [out, in] as integers */
            int64_t v[2] = {0, 0};
            if (kiln_tensor_numel(shp) != 2 || (shp->dtype != KILN_DT_I32 && shp->dtype != KILN_DT_I64))
                return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' must be 2 integers", fname(shp), shp->name);
            for (int i = 0; i < 2; i++) {
                if (shp->dtype == KILN_DT_I32) { int32_t x; memcpy(&x, shp->data + 4 * i, 4); v[i] = x; }
                else memcpy(&v[i], shp->data + 8 * i, 8);
            }
            if (v[0] != rows || v[1] != cols)
                return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' = [%lld, %lld] but the config implies [%lld, %lld]", fname(shp), shp->name,
                                 (long long)v[0], (long long)v[1], (long long)rows, (long long)cols);
        }
        if (packed->dtype != KILN_DT_I32 || cols % 8 || !shape_is(packed, rows, cols / 8))
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' (%s [%lld, %lld]) disagrees with weight_shape [%lld, %lld] (want I32 [%lld, %lld])",
                             fname(packed), packed->name, kiln_dtype_get(packed->dtype)->name, (long long)packed->shape[0],
                             (long long)(packed->ndim > 1 ? packed->shape[1] : 0), (long long)rows, (long long)cols, (long long)rows,
                             (long long)(cols / 8));
        if (sc->ndim != 2 || sc->shape[0] != rows || sc->shape[1] < 1 || cols % sc->shape[1])
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has a shape that is not [%lld, in/group] for in = %lld", fname(sc), sc->name,
                             (long long)rows, (long long)cols);
        int64_t group = cols / sc->shape[1];
        if (group != 32 && group != 128 && group != 64)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': group size %lld is not supported (32, 64 or 128)", fname(sc), sc->name, (long long)group);
        w->fmt = KILN_WF_INT4_GROUP;
        w->rows = rows;
        w->cols = cols;
        w->data = packed->data;
        w->row_bytes = (size_t)cols / 2;
        w->block = (int)group;
        return scales_as(m, sc, KILN_DT_BF16, &w->scales);
    }
    const kiln_tensor *t = find2(m, prefix, "weight");
    if (!t) return kiln_fail(KILN_ERR_FORMAT, "%s: missing tensor '%s.weight'", m->path, prefix);
    if (t->dtype == KILN_DT_F8_E4M3) {
        const kiln_tensor *sc = find2(m, prefix, "weight_scale_inv");
        if (!sc) sc = find2(m, prefix, "weight_scale");
        if (!sc) return kiln_fail(KILN_ERR_FORMAT, "%s: missing tensor '%s.weight_scale_inv' for FP8 weight '%s'", fname(t), prefix, t->name);
        if (!shape_is(t, rows, cols))
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] but the config implies [%lld, %lld]", fname(t), t->name,
                             (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)rows, (long long)cols);
        kiln_status st;
        if (fp8_tensor_or_channel(m, t, sc, rows, cols, w, &st)) return st;
        int64_t sr = sc->ndim == 2 ? sc->shape[0] : 0, scc = sc->ndim == 2 ? sc->shape[1] : 0;
        const int block = config_fp8_block(m);
        if (block <= 0 || sr != (rows + block - 1) / block || scc != (cols + block - 1) / block)
            return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] but %d×%d blocks of [%lld, %lld] need [%lld, %lld]", fname(sc),
                             sc->name, (long long)sr, (long long)scc, block, block, (long long)rows, (long long)cols,
                             (long long)((rows + block - 1) / block), (long long)((cols + block - 1) / block));
        w->fmt = KILN_WF_FP8_BLOCK;
        w->rows = rows;
        w->cols = cols;
        w->data = t->data;
        w->row_bytes = (size_t)cols;
        w->block = block;
        return scales_as(m, sc, KILN_DT_F32, &w->scales);
    }
    return kiln_weight_from_tensor(t, rows, cols, w);
}

/* A compressed-tensors float-quantized weights group: FP8 E4M3 (num_bits 8, type float), symmetric,
 * static, strategy tensor / channel / block (square block_structure). Activations are not
 * quantized by kiln (input_activations are read as the checkpoint's dynamic per-token FP8 scheme
 * would compute them on the fly: kiln keeps them in f32, as for the fp8 block checkpoints). */
static kiln_status check_float_group(const char *file, const char *gname, json_t *wq) {
    const int bits = (int)json_integer_value(json_object_get(wq, "num_bits"));
    const char *type = json_string_value(json_object_get(wq, "type"));
    const char *strategy = json_string_value(json_object_get(wq, "strategy"));
    if (bits != 8)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.num_bits = %d is not supported by float-quantized (8)",
                         file, gname, bits);
    if (!type || strcmp(type, "float") != 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.type = '%s' is not supported by float-quantized (float)",
                         file, gname, type ? type : "(missing)");
    if (json_is_false(json_object_get(wq, "symmetric")))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.symmetric must be true", file, gname);
    if (json_is_true(json_object_get(wq, "dynamic")))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.dynamic = true: weight scales must be stored", file, gname);
    if (!strategy || (strcmp(strategy, "tensor") != 0 && strcmp(strategy, "channel") != 0 && strcmp(strategy, "block") != 0))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.strategy = '%s' is not supported (tensor, channel, block)",
                         file, gname, strategy ? strategy : "(missing)");
    if (strcmp(strategy, "block") == 0) {
        json_t *bs = json_object_get(wq, "block_structure");
        if (!json_is_array(bs) || json_array_size(bs) != 2 || json_integer_value(json_array_get(bs, 0)) != json_integer_value(json_array_get(bs, 1)) ||
            json_integer_value(json_array_get(bs, 0)) <= 0)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.block_structure must be [B, B] (square blocks)", file, gname);
    }
    return KILN_OK;
}

kiln_status kiln_check_quant_config(const void *config_json, const char *file) {
    json_t *qc = json_object_get((const json_t *)config_json, "quantization_config");
    if (!qc || json_is_null(qc)) return KILN_OK;
    if (!json_is_object(qc)) return kiln_fail(KILN_ERR_FORMAT, "%s: field 'quantization_config' must be an object", file);
    const char *qm = json_string_value(json_object_get(qc, "quant_method"));
    if (!qm) return kiln_fail(KILN_ERR_FORMAT, "%s: field 'quantization_config.quant_method' is missing", file);
    if (strcmp(qm, "fp8") == 0) {
        json_t *wbs = json_object_get(qc, "weight_block_size");
        if (wbs && (!json_is_array(wbs) || json_array_size(wbs) != 2 || json_integer_value(json_array_get(wbs, 0)) != json_integer_value(json_array_get(wbs, 1)) ||
                    json_integer_value(json_array_get(wbs, 0)) <= 0))
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'quantization_config.weight_block_size' must be [B, B] (square blocks)", file);
        const char *fmt = json_string_value(json_object_get(qc, "fmt"));
        if (fmt && strcmp(fmt, "e4m3") != 0)
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: field 'quantization_config.fmt' = '%s' is not supported (e4m3)", file, fmt);
        return KILN_OK;
    }
    if (strcmp(qm, "compressed-tensors") == 0) {
        const char *format = json_string_value(json_object_get(qc, "format"));
        json_t *groups = json_object_get(qc, "config_groups");
        if (!json_is_object(groups)) return kiln_fail(KILN_ERR_FORMAT, "%s: field 'quantization_config.config_groups' is missing", file);
        const char *gname;
        json_t *g;
        json_object_foreach(groups, gname, g) {
            json_t *wq = json_object_get(g, "weights");
            if (!json_is_object(wq)) continue;
            const char *gformat = json_string_value(json_object_get(g, "format"));
            const char *f = gformat ? gformat : format;
            if (f && strcmp(f, "float-quantized") == 0) {
                KILN_TRY(check_float_group(file, gname, wq));
                continue;
            }
            int bits = (int)json_integer_value(json_object_get(wq, "num_bits"));
            const char *type = json_string_value(json_object_get(wq, "type"));
            const char *strategy = json_string_value(json_object_get(wq, "strategy"));
            json_t *gs = json_object_get(wq, "group_size");
            if (f && strcmp(f, "pack-quantized") != 0)
                return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s: format '%s' is not supported (pack-quantized, "
                                 "float-quantized)", file, gname, f);
            if (bits != 4)
                return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.num_bits = %d is not supported (4)", file, gname, bits);
            if (type && strcmp(type, "int") != 0)
                return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.type = '%s' is not supported (int)", file, gname, type);
            if (!json_is_true(json_object_get(wq, "symmetric")))
                return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.symmetric must be true", file, gname);
            if (strategy && strcmp(strategy, "group") != 0)
                return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.strategy = '%s' is not supported (group)", file, gname, strategy);
            long long gsz = json_integer_value(gs);
            if (gsz != 32 && gsz != 64 && gsz != 128)
                return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.config_groups.%s.weights.group_size = %lld is not supported (32, 64, 128)", file, gname, gsz);
        }
        return KILN_OK;
    }
    return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: quantization_config.quant_method '%s' is not supported (fp8, compressed-tensors)", file, qm);
}
