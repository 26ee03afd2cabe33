/* backend_ref.c — the ref backend: the scalar reference of every op, on one thread, in plain loops
 * (kernels/ref.c's GEMV for every weight format, kv.c's scalar attention kernel). It is slow on
 * purpose and kept forever: every other backend is tested against it op by op
 * (tests/ops/test_backend_ops.c), and `kiln run --backend ref` runs a whole model on it. */
#include "backend/backend.h"
#include "backend/backend_common.h"
#include <math.h>

static int ref_supports(const kiln_backend *be, kiln_op op, kiln_wformat fmt) {
    (void)be;
    return op < KILN_OP_COUNT && (unsigned)fmt < KILN_WF_COUNT; /* the reference computes everything itself */
}

/* Σx² as one float sum in index order. */
static void ref_rmsnorm(const kiln_backend *be, float *out, const float *x, const float *w, int rows, int width, float eps) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)width;
        float *o = out + (size_t)r * (size_t)width, ss = 0.0f;
        for (int i = 0; i < width; i++) ss += xr[i] * xr[i];
        ss = 1.0f / sqrtf(ss / (float)width + eps);
        for (int i = 0; i < width; i++) o[i] = w[i] * (ss * xr[i]);
    }
}

static void ref_swiglu(const kiln_backend *be, float *g, const float *u, int64_t len) {
    (void)be;
    for (int64_t i = 0; i < len; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* Y[i, :] = W · X[i, :] row by row with the scalar reference GEMV (reads tiled weights too). */
static void ref_matmul_strided(const kiln_weight *w, const float *X, int64_t x_tok, float *Y, int64_t y_tok, int n) {
    for (int i = 0; i < n; i++) kiln_gemv_ref(w, X + (size_t)i * (size_t)x_tok, Y + (size_t)i * (size_t)y_tok, 0, w->rows);
}

static void ref_matmul_many(const kiln_backend *be, const kiln_weight *const *w, float *const *Y, int nw, const float *X, int n) {
    (void)be;
    for (int k = 0; k < nw; k++) ref_matmul_strided(w[k], X, w[k]->cols, Y[k], w[k]->rows, n);
}

static void ref_matmul_heads(const kiln_backend *be, const kiln_weight *w, int H, int n, const float *X, int64_t x_tok, int64_t x_head,
                             float *Y, int64_t y_tok, int64_t y_head, float *gin, float *gout) {
    (void)be, (void)gin, (void)gout;
    for (int h = 0; h < H; h++) ref_matmul_strided(&w[h], X + (size_t)h * (size_t)x_head, x_tok, Y + (size_t)h * (size_t)y_head, y_tok, n);
}

static void ref_moe_experts(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_weight *gate, const kiln_weight *up,
                            const kiln_weight *down, const int *active, int n_active, const int *offset, const float *xg, float *hg,
                            float *ug, float *yg) {
    for (int a = 0; a < n_active; a++) {
        const int e = active[a], off = offset[e], cnt = offset[e + 1] - offset[e];
        const float *x = xg + (size_t)off * (size_t)c->dim;
        float *h = hg + (size_t)off * (size_t)c->ffn, *u = ug + (size_t)off * (size_t)c->ffn, *y = yg + (size_t)off * (size_t)c->dim;
        ref_matmul_strided(&gate[e], x, c->dim, h, c->ffn, cnt);
        ref_matmul_strided(&up[e], x, c->dim, u, c->ffn, cnt);
        ref_swiglu(be, h, u, (int64_t)cnt * c->ffn);
        ref_matmul_strided(&down[e], h, c->ffn, y, c->dim, cnt);
    }
}

/* kv.c's attention with the object's scalar, one-thread context: kiln_kv_attend_scalar. */
static void ref_kv_attend(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                          const float *q, int n_heads, float scale, float *out) {
    kiln_kv_attend_batch_cx(&be->cx, p, layer, n, seq, pos, q, n_heads, scale, out);
}

/* llama2.c's greedy loop: the first index of the largest value (a NaN never compares greater). */
static int64_t ref_argmax(const kiln_backend *be, const float *x, int64_t len) {
    (void)be;
    if (len <= 0) return -1;
    int64_t best = 0;
    for (int64_t i = 1; i < len; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

const kiln_backend_ops kiln_backend_ref_ops = {
    .supports = ref_supports,
    .alloc = kiln_be_common_alloc,
    .free = kiln_be_common_free,
    .embed = kiln_be_common_embed,
    .rmsnorm = ref_rmsnorm,
    .rope_table = kiln_be_common_rope_table,
    .rope = kiln_be_common_rope,
    .add = kiln_be_common_add,
    .copy_rows = kiln_be_common_copy_rows,
    .add_bias = kiln_be_common_add_bias,
    .swiglu = ref_swiglu,
    .matmul_many = ref_matmul_many,
    .matmul_heads = ref_matmul_heads,
    .moe_route = kiln_be_common_moe_route,
    .moe_experts = ref_moe_experts,
    .moe_combine = kiln_be_common_moe_combine,
    .kv_store = kiln_be_common_kv_store,
    .kv_attend = ref_kv_attend,
    .argmax = ref_argmax,
    .layernorm = kiln_be_common_layernorm,
    .fp8_round = kiln_be_common_fp8_round,
    .kv_index_topk = kiln_be_common_kv_index_topk,
    .kv_attend_sparse = kiln_be_common_kv_attend_sparse,
};
