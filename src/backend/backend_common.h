/* backend_common.h — internal: op implementations the cpu and ref backends share because they are
 * plain scalar loops with nothing to vectorise or thread (embedding row copies, RoPE's rotation,
 * residual adds, bias rows, the router's per-token selection and the experts' weighted combine) or
 * differ only in the backend's ISA (KV stores: the row conversions of be->cx, bit-exact RNE on
 * every ISA). Each is written once; tests/ops/test_backend_ops.c checks them against independent
 * computations of its own, and the backends against each other where they differ (matmul, norms,
 * SwiGLU, experts, KV conversions, attention, argmax). */
#ifndef KILN_BACKEND_COMMON_H
#define KILN_BACKEND_COMMON_H
#include "backend/backend.h"

void *kiln_be_common_alloc(const kiln_backend *be, size_t bytes);
void kiln_be_common_free(const kiln_backend *be, void *p);
void kiln_be_common_embed(const kiln_backend *be, const kiln_weight *table, const int32_t *tokens, int n, float *x);
void kiln_be_common_rope_table(const kiln_backend *be, const kiln_rope *r, const int *pos, int n, float *cs);
void kiln_be_common_rope(const kiln_backend *be, const kiln_rope *r, float *x, int n, int64_t row_stride, int n_heads, int head_stride,
                         const float *cs);
void kiln_be_common_add(const kiln_backend *be, float *y, const float *x, int64_t len);
void kiln_be_common_copy_rows(const kiln_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int rows, int width);
void kiln_be_common_add_bias(const kiln_backend *be, float *y, const float *b, int rows, int width);
int kiln_be_common_moe_route(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, int n, int *idx,
                             float *wt, float *tmp);
void kiln_be_common_moe_combine(const kiln_backend *be, int n, int K, int dim, const int *slot, const float *wt, const float *yg, float *Y);
void kiln_be_common_kv_store(const kiln_backend *be, kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer,
                             const float *k, int64_t k_tok, const float *v, int64_t v_tok);
/* DSA ops (backend.h): plain loops every backend shares (the vulkan backend runs them on the host
 * over its mapped buffers). */
void kiln_be_common_layernorm(const kiln_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int width, float eps);
void kiln_be_common_fp8_round(const kiln_backend *be, float *x, int rows, int width, int hadamard);
void kiln_be_common_kv_index_topk(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                                  const float *qi, int n_ih, int d, int off, const float *w, float w_scale, int topk, int32_t *sel, int *nsel);
void kiln_be_common_kv_attend_sparse(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                                     const int32_t *sel, const int *nsel, int topk, const float *q, int n_heads, int kq, float scale, int verify,
                                     float *out);
#endif
