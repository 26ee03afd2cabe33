/* backend_cpu.c — the cpu backend: kernels/ (SIMD GEMV / GEMM per the object's ISA and FP8 form),
 * kv/ attention over pages, kiln's worker pool (base/pool.h) for decode sections and OpenMP for
 * prefill, every section as wide as the object's thread count (be->cx.threads). */
#include "backend/backend.h"
#include "backend/backend_common.h"
#include "base/pool.h"
#include "kernels/gemv_isa.h"
#include <math.h>
#include <string.h>

static int cpu_supports(const kiln_backend *be, kiln_op op, kiln_wformat fmt) {
    switch (op) {
    case KILN_OP_MATMUL:
    case KILN_OP_MATMUL_HEADS:
    case KILN_OP_MOE_EXPERTS:
        /* a GEMV kernel, or (the K-quants) dequantization into the driver's f32 GEMM tiles */
        return (unsigned)fmt < KILN_WF_COUNT && be->cx.kt && (be->cx.kt->gemv[fmt] != NULL || be->cx.kt->dequant[fmt] != NULL);
    case KILN_OP_COUNT: return 0;
    default: return 1;
    }
}

/* Σx² through the dispatched dot kernel (16-lane partial sums in several accumulators; the scalar
 * reference without SIMD): a plain loop is one chain of n dependent float adds, ~1.5 µs for a
 * 2,048-wide row, and a decode step of bench-500m runs 19 of them. The partial sums change the
 * rounding of Σx², not its meaning (HF's float32 variance is a vectorised sum too). */
static void cpu_rmsnorm(const kiln_backend *be, float *out, const float *x, const float *w, int rows, int width, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)width;
        float *o = out + (size_t)r * (size_t)width;
        const float ss = 1.0f / sqrtf(kiln_cx_dot(&be->cx, xr, xr, width) / (float)width + eps);
        for (int i = 0; i < width; i++) o[i] = w[i] * (ss * xr[i]);
    }
}

static void cpu_swiglu(const kiln_backend *be, float *g, const float *u, int64_t len) { kiln_cx_silu_mul(&be->cx, g, u, len); }

static void cpu_matmul_many(const kiln_backend *be, const kiln_weight *const *w, float *const *Y, int nw, const float *X, int n) {
    kiln_cx_matmul_many(&be->cx, w, Y, nw, X, n);
}

/* ---- per-head matmuls (MLA) ---------------------------------------------------------------------- */
typedef struct {
    const kiln_kctx *cx;
    const kiln_weight *w;
    const float *X;
    float *Y;
    int64_t x_head, y_head;
} heads_job;

/* Head h of the single token, on one thread. */
static void one_head(void *arg, int64_t h) {
    const heads_job *j = arg;
    const kiln_weight *w = &j->w[h];
    kiln_cx_matmul_rows(j->cx, w, j->X + (size_t)h * (size_t)j->x_head, j->Y + (size_t)h * (size_t)j->y_head, 1, 0, w->rows);
}

/* Decode (one token): the heads as one parallel section, each head's small product on one thread
 * (a section per head would cost more in fork/join than the product). Prefill: head by head, each
 * a threaded matmul over the step's tokens gathered into gin. */
static void cpu_matmul_heads(const kiln_backend *be, const kiln_weight *w, int H, int n, const float *X, int64_t x_tok, int64_t x_head,
                             float *Y, int64_t y_tok, int64_t y_head, float *gin, float *gout) {
    if (n == 1) {
        heads_job j = {&be->cx, w, X, Y, x_head, y_head};
        kiln_pool_for(H, one_head, &j, be->cx.threads);
        return;
    }
    for (int h = 0; h < H; h++) {
        const size_t cols = (size_t)w[h].cols, rows = (size_t)w[h].rows;
        for (int i = 0; i < n; i++) memcpy(gin + (size_t)i * cols, X + (size_t)i * (size_t)x_tok + (size_t)h * (size_t)x_head, cols * sizeof(float));
        kiln_cx_matmul(&be->cx, &w[h], gin, gout, n);
        for (int i = 0; i < n; i++) memcpy(Y + (size_t)i * (size_t)y_tok + (size_t)h * (size_t)y_head, gout + (size_t)i * rows, rows * sizeof(float));
    }
}

/* ---- grouped experts (MoE) ----------------------------------------------------------------------- */
typedef struct {
    const kiln_backend *be;
    const kiln_moe_cfg *c;
    const kiln_weight *gate, *up, *down;
    const int *active, *offset;
    const float *xg;
    float *hg, *ug, *yg;
} experts_job;

/* Expert e over its cnt grouped rows from row `off`: single-threaded (several experts run at once)
 * or with its matmuls threaded over rows. */
static void run_expert(const experts_job *j, int e, int single) {
    const kiln_moe_cfg *c = j->c;
    const int off = j->offset[e], cnt = j->offset[e + 1] - j->offset[e];
    const float *x = j->xg + (size_t)off * (size_t)c->dim;
    float *h = j->hg + (size_t)off * (size_t)c->ffn, *u = j->ug + (size_t)off * (size_t)c->ffn, *y = j->yg + (size_t)off * (size_t)c->dim;
    const kiln_kctx *cx = &j->be->cx;
    if (single) {
        kiln_cx_matmul_rows(cx, &j->gate[e], x, h, cnt, 0, c->ffn);
        kiln_cx_matmul_rows(cx, &j->up[e], x, u, cnt, 0, c->ffn);
        kiln_cx_silu_mul(cx, h, u, (int64_t)cnt * c->ffn);
        kiln_cx_matmul_rows(cx, &j->down[e], h, y, cnt, 0, c->dim);
    } else {
        const kiln_weight *w2[2] = {&j->gate[e], &j->up[e]};
        float *y2[2] = {h, u};
        kiln_cx_matmul_many(cx, w2, y2, 2, x, cnt);
        kiln_cx_silu_mul(cx, h, u, (int64_t)cnt * c->ffn);
        kiln_cx_matmul(cx, &j->down[e], h, y, cnt);
    }
}
static void expert_task(void *arg, int64_t a) {
    const experts_job *j = arg;
    run_expert(j, j->active[a], 1);
}

/* Threads across experts when there are at least as many active experts as threads, otherwise each
 * expert's matmuls thread over rows. */
static void cpu_moe_experts(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_weight *gate, const kiln_weight *up,
                            const kiln_weight *down, const int *active, int n_active, const int *offset, const float *xg, float *hg,
                            float *ug, float *yg) {
    experts_job j = {be, c, gate, up, down, active, offset, xg, hg, ug, yg};
    const int nt = be->cx.threads;
    if (nt > 1 && n_active >= nt) kiln_pool_for(n_active, expert_task, &j, nt);
    else
        for (int a = 0; a < n_active; a++) run_expert(&j, active[a], 0);
}

static void cpu_kv_attend(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                          const float *q, int n_heads, float scale, float *out) {
    kiln_kv_attend_batch_cx(&be->cx, p, layer, n, seq, pos, q, n_heads, scale, out);
}

static int64_t cpu_argmax(const kiln_backend *be, const float *x, int64_t len) { return kiln_cx_argmax(&be->cx, x, len); }

const kiln_backend_ops kiln_backend_cpu_ops = {
    .supports = cpu_supports,
    .alloc = kiln_be_common_alloc,
    .free = kiln_be_common_free,
    .embed = kiln_be_common_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope_table = kiln_be_common_rope_table,
    .rope = kiln_be_common_rope,
    .add = kiln_be_common_add,
    .copy_rows = kiln_be_common_copy_rows,
    .add_bias = kiln_be_common_add_bias,
    .swiglu = cpu_swiglu,
    .matmul_many = cpu_matmul_many,
    .matmul_heads = cpu_matmul_heads,
    .moe_route = kiln_be_common_moe_route,
    .moe_experts = cpu_moe_experts,
    .moe_combine = kiln_be_common_moe_combine,
    .kv_store = kiln_be_common_kv_store,
    .kv_attend = cpu_kv_attend,
    .argmax = cpu_argmax,
    .layernorm = kiln_be_common_layernorm,
    .fp8_round = kiln_be_common_fp8_round,
    .kv_index_topk = kiln_be_common_kv_index_topk,
    .kv_attend_sparse = kiln_be_common_kv_attend_sparse,
};
