/* backend.c — backend objects: creation from a kind or from kiln_options, names. */
#include "backend/backend.h"
#include "backend/backend_common.h"
#include "backend/vulkan/backend_vulkan.h"
#include "base/fp.h"
#include "base/status.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *kiln_backend_kind_name(kiln_backend_kind k) {
    switch (k) {
    case KILN_BACKEND_CPU: return "cpu";
    case KILN_BACKEND_REF: return "ref";
    case KILN_BACKEND_VULKAN: return "vulkan";
    }
    return "?";
}

const char *kiln_op_name(kiln_op op) {
    static const char *const names[KILN_OP_COUNT] = {"embed", "rmsnorm", "rope", "add", "swiglu", "matmul",
                                                    "matmul_heads", "moe_route", "moe_experts", "moe_combine", "kv_store", "kv_attend", "argmax",
                                                    "layernorm", "fp8_round", "kv_index", "kv_attend_sparse", "copy_rows"};
    return (unsigned)op < KILN_OP_COUNT ? names[op] : "?";
}

kiln_status kiln_backend_create(kiln_backend_kind kind, kiln_isa isa, int threads, int fp8, kiln_backend **out) {
    return kiln_backend_create_device(kind, isa, threads, fp8, 0, out);
}

kiln_status kiln_backend_create_device(kiln_backend_kind kind, kiln_isa isa, int threads, int fp8, int device_index, kiln_backend **out) {
    *out = NULL;
    if (kind != KILN_BACKEND_CPU && kind != KILN_BACKEND_REF && kind != KILN_BACKEND_VULKAN)
        return kiln_fail(KILN_ERR_INVALID_ARG, "backend %d is not one of cpu, ref, vulkan", (int)kind);
    if (fp8 < KILN_FP8_AUTO || fp8 > KILN_FP8_BF16)
        return kiln_fail(KILN_ERR_INVALID_ARG, "fp8 GEMV form %d is not one of 0 (auto), 1 (exact), 2 (bf16)", fp8);
    if (kind != KILN_BACKEND_REF && kiln_kernels_fp8_prefill_bad_env())
        return kiln_fail(KILN_ERR_INVALID_ARG, "KILN_FP8_PREFILL: '%s' is not bf16, auto or int8", kiln_kernels_fp8_prefill_bad_env());
    kiln_backend *be = calloc(1, sizeof *be);
    if (!be) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    be->kind = kind;
    be->name = kiln_backend_kind_name(kind);
    if (kind == KILN_BACKEND_REF) {
        /* the oracle: scalar kernels, one thread, the exact FP8 reference */
        kiln_kctx_init(&be->cx, KILN_ISA_SCALAR, 1, KILN_FP8_EXACT);
        be->ops = &kiln_backend_ref_ops;
    } else {
        kiln_kctx_init(&be->cx, isa, threads, fp8);
        be->ops = &kiln_backend_cpu_ops;
    }
    if (kind == KILN_BACKEND_VULKAN) {
        kiln_status st = kiln_backend_vulkan_open(be, device_index);
        if (st != KILN_OK) { free(be); return st; }
        be->ops = &kiln_backend_vulkan_ops;
    }
    *out = be;
    return KILN_OK;
}

kiln_status kiln_backend_from_options(const kiln_options *o, kiln_backend **out) {
    kiln_options d;
    if (!o) { kiln_options_default(&d); o = &d; }
    return kiln_backend_create_device(o->backend, o->isa, o->threads, o->fp8_gemv, o->device_index, out);
}

void kiln_backend_free(kiln_backend *be) {
    if (!be) return;
    if (be->kind == KILN_BACKEND_VULKAN) kiln_backend_vulkan_close(be);
    free(be);
}

kiln_status kiln_list_devices(FILE *f) { return kiln_backend_vulkan_list(f); }

/* ---- ops shared by the cpu and ref backends (backend_common.h) ---------------------------------- */
void *kiln_be_common_alloc(const kiln_backend *be, size_t bytes) {
    (void)be;
    void *p = kiln_alloc64(bytes ? bytes : 64);
    if (p) memset(p, 0, bytes);
    return p;
}
void kiln_be_common_free(const kiln_backend *be, void *p) {
    (void)be;
    free(p);
}
void kiln_be_common_embed(const kiln_backend *be, const kiln_weight *table, const int32_t *tokens, int n, float *x) {
    (void)be;
    for (int i = 0; i < n; i++) kiln_weight_row_f32(table, tokens[i], x + (size_t)i * (size_t)table->cols);
}
void kiln_be_common_rope_table(const kiln_backend *be, const kiln_rope *r, const int *pos, int n, float *cs) {
    (void)be;
    for (int i = 0; i < n; i++) kiln_rope_table(r, pos[i], cs + (size_t)i * (size_t)r->rot_dim);
}
void kiln_be_common_rope(const kiln_backend *be, const kiln_rope *r, float *x, int n, int64_t row_stride, int n_heads, int head_stride,
                         const float *cs) {
    (void)be;
    for (int i = 0; i < n; i++) kiln_rope_apply(r, x + (size_t)i * (size_t)row_stride, n_heads, head_stride, cs + (size_t)i * (size_t)r->rot_dim);
}
void kiln_be_common_add(const kiln_backend *be, float *y, const float *x, int64_t len) {
    (void)be;
    for (int64_t j = 0; j < len; j++) y[j] += x[j];
}
void kiln_be_common_add_bias(const kiln_backend *be, float *y, const float *b, int rows, int width) {
    (void)be;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < width; j++) y[(size_t)i * (size_t)width + (size_t)j] += b[j];
}
int kiln_be_common_moe_route(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, int n, int *idx,
                             float *wt, float *tmp) {
    (void)be;
    int changed = 0;
    for (int i = 0; i < n; i++)
        changed += kiln_moe_route(c, logits + (size_t)i * (size_t)c->n_experts, bias, idx + (size_t)i * (size_t)c->n_used,
                                  wt + (size_t)i * (size_t)c->n_used, tmp);
    return changed;
}
void kiln_be_common_kv_store(const kiln_backend *be, kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer,
                             const float *k, int64_t k_tok, const float *v, int64_t v_tok) {
    for (int i = 0; i < n; i++)
        kiln_kv_store_cx(&be->cx, p, seq[i], layer, pos[i], k + (size_t)i * (size_t)k_tok, v ? v + (size_t)i * (size_t)v_tok : NULL);
}
void kiln_be_common_copy_rows(const kiln_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int rows, int width) {
    (void)be;
    for (int i = 0; i < rows; i++) memcpy(dst + (size_t)i * (size_t)dst_stride, src + (size_t)i * (size_t)src_stride, (size_t)width * sizeof(float));
}

void kiln_be_common_moe_combine(const kiln_backend *be, int n, int K, int dim, const int *slot, const float *wt, const float *yg, float *Y) {
    (void)be;
    for (int i = 0; i < n; i++) {
        float *y = Y + (size_t)i * (size_t)dim;
        memset(y, 0, (size_t)dim * sizeof(float));
        for (int j = 0; j < K; j++) {
            const float *src = yg + (size_t)slot[i * K + j] * (size_t)dim;
            const float w = wt[i * K + j];
            for (int d = 0; d < dim; d++) y[d] += w * src[d];
        }
    }
}

/* ---- DSA ops ------------------------------------------------------------------------------------ */

void kiln_be_common_layernorm(const kiln_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int width, float eps) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)width;
        float *o = out + (size_t)r * (size_t)width;
        float mean = 0.0f, var = 0.0f;
        for (int i = 0; i < width; i++) mean += xr[i];
        mean /= (float)width;
        for (int i = 0; i < width; i++) var += (xr[i] - mean) * (xr[i] - mean);
        var /= (float)width; /* biased variance, as torch's layer_norm */
        const float inv = 1.0f / sqrtf(var + eps);
        for (int i = 0; i < width; i++) o[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
    }
}

void kiln_be_common_fp8_round(const kiln_backend *be, float *x, int rows, int width, int hadamard) {
    (void)be;
    const float norm = hadamard ? 1.0f / sqrtf((float)width) : 1.0f;
    for (int r = 0; r < rows; r++) {
        float *v = x + (size_t)r * (size_t)width;
        if (hadamard) { /* the fast Walsh–Hadamard transform (Sylvester order), then the 1/sqrt(width) scale */
            for (int len = 1; len < width; len <<= 1)
                for (int i = 0; i < width; i += 2 * len)
                    for (int j = i; j < i + len; j++) {
                        float a = v[j], c = v[j + len];
                        v[j] = a + c;
                        v[j + len] = a - c;
                    }
            for (int i = 0; i < width; i++) v[i] *= norm;
        }
        for (int b0 = 0; b0 < width; b0 += 128) {
            float amax = 0.0f;
            for (int i = b0; i < b0 + 128; i++) amax = fmaxf(amax, fabsf(v[i]));
            const float s = kiln_fp8_block_scale(amax), inv = 1.0f / s; /* exact: s is a power of two */
            for (int i = b0; i < b0 + 128; i++) v[i] = kiln_fp8_e4m3_to_f32(kiln_kv_f32_to_fp8(v[i] * inv)) * s;
        }
    }
}

void kiln_be_common_kv_index_topk(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                                  const float *qi, int n_ih, int d, int off, const float *w, float w_scale, int topk, int32_t *sel, int *nsel) {
    kiln_kv_index_topk_cx(&be->cx, p, layer, n, seq, pos, qi, n_ih, d, off, w, w_scale, topk, sel, nsel);
}

void kiln_be_common_kv_attend_sparse(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                                     const int32_t *sel, const int *nsel, int topk, const float *q, int n_heads, int kq, float scale, int verify,
                                     float *out) {
    kiln_kv_attend_sparse_cx(&be->cx, p, layer, n, seq, pos, sel, nsel, topk, q, n_heads, kq, scale, verify, out);
}

static void *kv_arrays_alloc(void *ctx, size_t bytes) {
    const kiln_backend *be = ctx;
    return be->ops->kv_alloc(be, bytes);
}
static void kv_arrays_free(void *ctx, void *p) {
    const kiln_backend *be = ctx;
    be->ops->kv_free(be, p);
}

void kiln_be_kv_arrays(const kiln_backend *be, kiln_kv_config *c) {
    if (!be || !be->ops->kv_alloc || !be->ops->kv_free) return;
    /* pools the host attends over whatever the backend — pre-RoPE K smoothing (kv.h) — keep host
     * memory: on a GPU their arrays would be device memory that the host reads across the bus.
     * DSA's compact rows are the backend's (the vulkan sparse ops read them where they lie). */
    if (c->k_prerope) return;
    c->arrays_alloc = kv_arrays_alloc;
    c->arrays_free = kv_arrays_free;
    c->arrays_ctx = (void *)(uintptr_t)be;
}
