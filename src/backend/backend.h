/* backend.h — the compute seam: every op the forward pass runs, on a backend object.
 *
 * Model code (model/forward.c, model/moe.c, model/mla.c) computes only through these ops: no
 * kernel call, OpenMP loop, worker-pool section or SIMD intrinsic of its own. A backend object owns
 * its settings — ISA, threads and FP8 GEMV form (a kernels compute context, kernels/gemv.h) — and
 * the buffers it computes on (kiln_be_alloc: host memory for the CPU backends). Nothing of it is
 * process-wide: two engines in one process can run different backends or settings side by side.
 * What they do share: kiln's worker pool (base/pool.h) is one per process, so while one backend's
 * parallel section runs, another's concurrent section runs on its calling thread alone — the same
 * results (work is claimed dynamically, and every split depends on the object's thread count, not
 * on the workers that join), fewer threads; and the per-thread kernel scratch (grow-only buffers of
 * the thread that computes).
 *
 * Backends (KILN_BACKEND_* in kiln.h):
 *   vulkan  SPIR-V compute shaders on a Vulkan device (backend/vulkan/, docs/VULKAN.md): matmuls,
 *        norms, RoPE, element-wise ops, row copies, the KV store and attention over the KV pages
 *        (seals updated and checked from hashes the shaders compute) on the device; the rest on
 *        the host through the cpu backend's kernels, on the same host-visible buffers;
 *   cpu  the SIMD kernels of kernels/ (AVX-512 / AVX2 / scalar, per the object's ISA), attention
 *        over KV pages with the integrity seals verified in the same call, decode sections on
 *        kiln's worker pool and prefill on OpenMP, both as wide as the object's thread count;
 *   ref  the scalar reference kernels, one thread, plain loops: the oracle every other backend is
 *        tested against op by op (tests/ops/test_backend_ops.c).
 *
 * The ops sit at the level the forward pass works at (about llama.cpp's ggml_backend_i ops of a
 * transformer block, or antirez/ds4's ds4_gpu.h): embedding rows, RMSNorm, RoPE (every layout:
 * NEOX / NORM pairs, partial rotary, YaRN through kiln_rope), add / bias, SwiGLU, matmul over
 * several weights of one input (every kiln_wformat), per-head matmuls (MLA's absorbed W_UK / W_UV),
 * MoE routing and grouped expert matmuls, KV store (with its seal) and attention over pages (with
 * seal verification), argmax. `supports` says which (op, weight format) pairs a backend runs
 * natively; an unsupported pair still computes correctly through the scalar reference.
 *
 * Shapes: "X [n, cols]" is n token rows of cols floats, row-major; every op takes the batch shape
 * (n tokens, and for the KV ops each token's sequence and position) as arguments. */
#ifndef KILN_BACKEND_BACKEND_H
#define KILN_BACKEND_BACKEND_H
#include "kiln.h"
#include "kernels/gemv.h"
#include "kv/kv.h"
#include "backend/rope.h"
#include "backend/moe_route.h"

typedef enum kiln_op {
    KILN_OP_EMBED = 0,
    KILN_OP_RMSNORM,
    KILN_OP_ROPE,
    KILN_OP_ADD,
    KILN_OP_SWIGLU,
    KILN_OP_MATMUL,
    KILN_OP_MATMUL_HEADS,
    KILN_OP_MOE_ROUTE,
    KILN_OP_MOE_EXPERTS,
    KILN_OP_MOE_COMBINE,
    KILN_OP_KV_STORE,
    KILN_OP_KV_ATTEND,
    KILN_OP_ARGMAX,
    KILN_OP_LAYERNORM,
    KILN_OP_FP8_ROUND,
    KILN_OP_KV_INDEX,
    KILN_OP_KV_ATTEND_SPARSE,
    KILN_OP_COPY_ROWS,
    KILN_OP_COUNT
} kiln_op;

typedef struct kiln_backend kiln_backend;

typedef struct kiln_backend_ops {
    /* 1 when the backend runs op on weights of fmt with a kernel of its own (fmt is ignored by the
     * ops that read no weight); 0: it computes through the scalar reference (slow but correct). */
    int (*supports)(const kiln_backend *be, kiln_op op, kiln_wformat fmt);
    /* Buffers the backend computes on (zeroed; 64-byte aligned); NULL when out of memory. */
    void *(*alloc)(const kiln_backend *be, size_t bytes);
    void (*free)(const kiln_backend *be, void *p);
    /* x [n, table->cols] = rows tokens[0..n) of the embedding table (any weight format). */
    void (*embed)(const kiln_backend *be, const kiln_weight *table, const int32_t *tokens, int n, float *x);
    /* out [rows, width] = x / sqrt(mean(x²) + eps) · w per row (out may equal x). */
    void (*rmsnorm)(const kiln_backend *be, float *out, const float *x, const float *w, int rows, int width, float eps);
    /* cs [n, rot] = the cos/sin rows of positions pos[0..n) (kiln_rope_table). */
    void (*rope_table)(const kiln_backend *be, const kiln_rope *r, const int *pos, int n, float *cs);
    /* Rotates the first rot values of n_heads heads (head_stride apart) of each of n rows
     * (x + i·row_stride) with cos/sin row cs + i·rot. */
    void (*rope)(const kiln_backend *be, const kiln_rope *r, float *x, int n, int64_t row_stride, int n_heads, int head_stride,
                 const float *cs);
    /* Optional (NULL: rope on each): rope over two tensors of the same n tokens in one pass — x
     * (n_heads, row_stride) and x2 (n_heads2, row_stride2), heads head_stride apart in both: Q and K,
     * one dispatch on a GPU; the same floats as the two rope calls. */
    void (*rope2)(const kiln_backend *be, const kiln_rope *r, float *x, int64_t row_stride, int n_heads, float *x2, int64_t row_stride2,
                  int n_heads2, int n, int head_stride, const float *cs);
    /* dst[i·dst_stride + j] = src[i·src_stride + j] for i < rows, j < width (the regions do not
     * overlap): the row copies model code would otherwise make on the host — fused-projection
     * splits, MLA's latent and query parts — so that a deferring backend need not stop for them. */
    void (*copy_rows)(const kiln_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int rows, int width);
    /* y[i] += x[i], i < len. */
    void (*add)(const kiln_backend *be, float *y, const float *x, int64_t len);
    /* Optional (NULL: add, then rmsnorm): x [rows, width] += d, then out = rmsnorm(x) · w — the
     * residual add and the next norm in one pass (one dispatch instead of two on a GPU), the same
     * floats as the two ops (out ≠ x, out ≠ d). */
    void (*add_rmsnorm)(const kiln_backend *be, float *x, const float *d, float *out, const float *w, int rows, int width, float eps);
    /* y [rows, width] += b [width] per row. */
    void (*add_bias)(const kiln_backend *be, float *y, const float *b, int rows, int width);
    /* g[i] = silu(g[i]) · u[i] = g[i] / (1 + e^-g[i]) · u[i], i < len. */
    void (*swiglu)(const kiln_backend *be, float *g, const float *u, int64_t len);
    /* Y_k [n, w[k]->rows] = X [n, cols] · W_kᵀ for the nw weights that read the same X. */
    void (*matmul_many)(const kiln_backend *be, const kiln_weight *const *w, float *const *Y, int nw, const float *X, int n);
    /* Optional (NULL: matmul_many, then swiglu — kiln_be_matmul_swiglu): the SwiGLU MLP's input
     * half, G [n, F] = silu(X · W_gateᵀ) · (X · W_upᵀ) for X [n, cols]; up NULL: gate is the fused
     * [gate F rows; up F rows] weight (GLM's gate_up_proj). scratch is the caller's, [n, F] floats
     * (separate weights) or [n, 2F] (fused), not overlapping G; what it holds afterwards is
     * unspecified. The same floats as the unfused ops: a GPU computes gate, up and the product in
     * one dispatch instead of three. */
    void (*matmul_swiglu)(const kiln_backend *be, const kiln_weight *gate, const kiln_weight *up, const float *X, int n, float *G,
                          float *scratch);
    /* Per-head matmuls (MLA's absorbed W_UKᵀ and W_UV): for h < H and token i < n,
     * Y[i·y_tok + h·y_head .. + w[h].rows) = W_h · X[i·x_tok + h·x_head .. + w[h].cols).
     * gin [n, max cols] and gout [n, max rows] are scratch the caller owns. */
    void (*matmul_heads)(const kiln_backend *be, const kiln_weight *w, int H, int n, const float *X, int64_t x_tok, int64_t x_head,
                         float *Y, int64_t y_tok, int64_t y_head, float *gin, float *gout);
    /* Routes n tokens from router logits [n, E]: idx / wt [n, n_used]; tmp [E + n_group] scratch;
     * returns how many tokens' selection the group limit changed (moe_route.h). */
    int (*moe_route)(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, int n, int *idx,
                     float *wt, float *tmp);
    /* Runs the n_active experts active[0..n_active) over their grouped rows: expert e reads rows
     * [offset[e], offset[e+1]) of xg [*, dim] and writes the same rows of yg [*, dim] =
     * down_e(silu(gate_e x) · up_e x); hg, ug [*, ffn] are scratch rows. */
    void (*moe_experts)(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_weight *gate, const kiln_weight *up,
                        const kiln_weight *down, const int *active, int n_active, const int *offset, const float *xg, float *hg,
                        float *ug, float *yg);
    /* The routed experts of n tokens without the host seeing the routing, optional (NULL, or -1
     * returned: the caller routes with moe_route, groups the rows by expert on the host and calls
     * moe_experts / moe_combine). Router logits [n, E] (bias [E] or NULL) → Y [n, dim] =
     * Σ_j wt_ij · down_e(silu(gate_e x_i) · up_e x_i) over token i's K experts e = idx_ij — the
     * selection and weights of kiln_moe_route, bit for bit; X [n, dim]; hg, ug [n·K, ffn] and
     * yg [n·K, dim]: scratch rows (backend buffers). vulkan: the routing (moe_route.comp), the
     * experts' matmuls by id (matmul.comp BYID) and the combine recorded on the device, so an MoE
     * layer needs no submit. */
    int (*moe_routed)(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, const kiln_weight *gate,
                      const kiln_weight *up, const kiln_weight *down, const float *X, int n, float *hg, float *ug, float *yg, float *Y);
    /* Y [n, dim] = Σ_j wt[i·K + j] · yg[slot[i·K + j], :] over the K experts of token i, summed in
     * selection order (deterministic whatever the thread count). */
    void (*moe_combine)(const kiln_backend *be, int n, int K, int dim, const int *slot, const float *wt, const float *yg, float *Y);
    /* Stores token i's K (k + i·k_tok: n_kv_heads × k_dim) and V (v + i·v_tok, or NULL when V
     * shares K) at position pos[i] of seq[i] in layer `layer`, and re-seals the page slice. */
    void (*kv_store)(const kiln_backend *be, kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer,
                     const float *k, int64_t k_tok, const float *v, int64_t v_tok);
    /* Attention of n tokens over their own sequences' pages (kv.h: kiln_kv_attend_batch_cx): q
     * [n, n_heads, k_dim] → out [n, n_heads, v_dim]; the seals of the slices read are verified. */
    void (*kv_attend)(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                      const float *q, int n_heads, float scale, float *out);
    /* The first index of the largest non-NaN value of x[0, len) (greedy sampling); -1 when len ≤ 0. */
    int64_t (*argmax)(const kiln_backend *be, const float *x, int64_t len);
    /* ---- DeepSeek sparse attention (model/mla.c, docs/DSA.md) ---- */
    /* out [rows, width] = (x − mean) / sqrt(var + eps) · w + b per row (LayerNorm; out may equal x). */
    void (*layernorm)(const kiln_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int width, float eps);
    /* In place over x [rows, width] (width a multiple of 128): with hadamard (width a power of two)
     * first x ← Hx / sqrt(width), H the Sylvester Hadamard matrix (DeepSeek's rotate_activation);
     * then every 128-value block is rounded through FP8 E4M3 with a power-of-two scale as
     * DeepSeek-V3.2's act_quant with scale_fmt ue8m0: s = 2^ceil(log2(max(amax, 1e-4) / 448)),
     * x ← fp8(x / s) · s (round to nearest even, saturating at ±448). */
    void (*fp8_round)(const kiln_backend *be, float *x, int rows, int width, int hadamard);
    /* The lightning indexer's top-k selection (kv.h: kiln_kv_index_topk_cx). */
    void (*kv_index_topk)(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                          const float *qi, int n_ih, int d, int off, const float *w, float w_scale, int topk, int32_t *sel, int *nsel);
    /* Attention over the selected positions only (kv.h: kiln_kv_attend_sparse_cx). */
    void (*kv_attend_sparse)(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                             const int32_t *sel, const int *nsel, int topk, const float *q, int n_heads, int kq, float scale, int verify,
                             float *out);
    /* Memory for a KV pool's layer arrays (kv.h kiln_kv_config.arrays_alloc), optional: NULL in the
     * backends that read host memory (cpu, ref). vulkan: device-addressable buffers that its
     * attention shader reads in place and the host-side KV ops (store, seals) map; NULL when the
     * array cannot be one (the pool then takes host memory for it). */
    void *(*kv_alloc)(const kiln_backend *be, size_t bytes);
    void (*kv_free)(const kiln_backend *be, void *p);
    /* Deferred steps, optional (NULL in the backends that compute when called: cpu, ref). After
     * defer, an op may return before its results exist (vulkan: its dispatches only recorded); they
     * exist after sync. sync(be, 0) waits for everything called so far (the caller is about to read
     * or write a buffer on the host); sync(be, 1) also ends the deferred step (steps nest). Returns 1
     * when results of the step were lost (the device failed while they were pending; the backend
     * computes on the host from then on, so the caller recomputes the step), else 0. Outside a
     * deferred step every op's results exist when it returns. */
    void (*defer)(const kiln_backend *be);
    int (*sync)(const kiln_backend *be, int end);
    /* Optional: the model's weight bytes, so that a backend that copies weights to its device as
     * they are first used can report the progress of the copy (vulkan: a line per tenth on stderr). */
    void (*expect_weights)(const kiln_backend *be, uint64_t bytes);
    /* Optional (NULL: alloc): buffers as alloc's that the host reads after every step (the LM
     * head's logits, which the sampler scans). vulkan: host memory even where alloc gives
     * device-local memory (a discrete GPU's mapped VRAM, which the CPU reads uncached over PCIe,
     * about a microsecond per load). Freed with free. */
    void *(*alloc_readback)(const kiln_backend *be, size_t bytes);
} kiln_backend_ops;

struct kiln_backend {
    const kiln_backend_ops *ops;
    kiln_backend_kind kind;
    const char *name;   /* "cpu", "ref", "vulkan" */
    kiln_kctx cx;       /* ISA, kernel table, threads, FP8 GEMV form (ref: scalar, one thread; vulkan:
                           those of the host-side ops, which run the cpu backend's kernels) */
    void *impl;         /* vulkan: the device state (backend/vulkan/); NULL otherwise */
    const char *device_name; /* vulkan: "vulkan:N NAME (...)"; NULL otherwise */
};

/* A backend object. isa / threads / fp8 as kiln_kctx_init (ref ignores them: scalar, 1 thread).
 * vulkan opens device 0; kiln_backend_create_device opens another. */
kiln_status kiln_backend_create(kiln_backend_kind kind, kiln_isa isa, int threads, int fp8, kiln_backend **out);
kiln_status kiln_backend_create_device(kiln_backend_kind kind, kiln_isa isa, int threads, int fp8, int device_index, kiln_backend **out);
/* From kiln_options: backend, isa, threads, fp8_gemv, device_index. */
kiln_status kiln_backend_from_options(const kiln_options *o, kiln_backend **out);
void kiln_backend_free(kiln_backend *be);
const char *kiln_backend_kind_name(kiln_backend_kind k);
const char *kiln_op_name(kiln_op op);

extern const kiln_backend_ops kiln_backend_cpu_ops;
extern const kiln_backend_ops kiln_backend_ref_ops;
extern const kiln_backend_ops kiln_backend_vulkan_ops;

/* Points c's layer-array allocator at be's kv_alloc when it has one (every pool a backend's KV ops
 * will see is configured through this, so that its pages live where its kernels read them) — not
 * for the pools whose attention always runs on the host (DSA's compact rows, pre-RoPE K
 * smoothing). Call it with c complete. */
void kiln_be_kv_arrays(const kiln_backend *be, kiln_kv_config *c);

/* ---- call-site helpers (one line each over be->ops) ---- */
static inline void kiln_be_defer(const kiln_backend *be) { if (be->ops->defer) be->ops->defer(be); }
static inline void kiln_be_expect_weights(const kiln_backend *be, uint64_t bytes) { if (be->ops->expect_weights) be->ops->expect_weights(be, bytes); }
/* Inside a deferred step: before model code touches a buffer on the host (backend.h ops->sync). */
static inline void kiln_be_wait(const kiln_backend *be) { if (be->ops->sync) (void)be->ops->sync(be, 0); }
/* Ends a deferred step; 1 when its results were lost and it must be computed again. */
static inline int kiln_be_end(const kiln_backend *be) { return be->ops->sync ? be->ops->sync(be, 1) : 0; }
static inline void *kiln_be_alloc(const kiln_backend *be, size_t bytes) { return be->ops->alloc(be, bytes); }
static inline void *kiln_be_alloc_readback(const kiln_backend *be, size_t bytes) {
    return be->ops->alloc_readback ? be->ops->alloc_readback(be, bytes) : be->ops->alloc(be, bytes);
}
static inline void kiln_be_free(const kiln_backend *be, void *p) { be->ops->free(be, p); }
static inline void kiln_be_matmul(const kiln_backend *be, const kiln_weight *w, const float *X, float *Y, int n) {
    be->ops->matmul_many(be, &w, &Y, 1, X, n);
}
static inline void kiln_be_matmul_many(const kiln_backend *be, const kiln_weight *const *w, float *const *Y, int nw, const float *X, int n) {
    be->ops->matmul_many(be, w, Y, nw, X, n);
}
static inline void kiln_be_rmsnorm(const kiln_backend *be, float *out, const float *x, const float *w, int rows, int width, float eps) {
    be->ops->rmsnorm(be, out, x, w, rows, width, eps);
}
static inline void kiln_be_add(const kiln_backend *be, float *y, const float *x, int64_t len) { be->ops->add(be, y, x, len); }
static inline void kiln_be_rope2(const kiln_backend *be, const kiln_rope *r, float *x, int64_t row_stride, int n_heads, float *x2,
                                 int64_t row_stride2, int n_heads2, int n, int head_stride, const float *cs) {
    if (be->ops->rope2) {
        be->ops->rope2(be, r, x, row_stride, n_heads, x2, row_stride2, n_heads2, n, head_stride, cs);
        return;
    }
    be->ops->rope(be, r, x, n, row_stride, n_heads, head_stride, cs);
    be->ops->rope(be, r, x2, n, row_stride2, n_heads2, head_stride, cs);
}
static inline void kiln_be_add_rmsnorm(const kiln_backend *be, float *x, const float *d, float *out, const float *w, int rows, int width,
                                       float eps) {
    if (be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, x, d, out, w, rows, width, eps);
        return;
    }
    be->ops->add(be, x, d, (int64_t)rows * width);
    be->ops->rmsnorm(be, out, x, w, rows, width, eps);
}
static inline void kiln_be_swiglu(const kiln_backend *be, float *g, const float *u, int64_t len) { be->ops->swiglu(be, g, u, len); }
/* backend.h matmul_swiglu as its unfused ops: gate and up into G and scratch, or the fused weight
 * into scratch [n, 2F] then each row's product packed into G. */
static inline void kiln_be_matmul_swiglu_unfused(const kiln_backend *be, const kiln_weight *gate, const kiln_weight *up, const float *X,
                                                 int n, float *G, float *scratch) {
    if (up) {
        const kiln_weight *w2[2] = {gate, up};
        float *y2[2] = {G, scratch};
        be->ops->matmul_many(be, w2, y2, 2, X, n);
        be->ops->swiglu(be, G, scratch, (int64_t)n * up->rows);
        return;
    }
    const int64_t F = gate->rows / 2;
    be->ops->matmul_many(be, &gate, &scratch, 1, X, n);
    for (int i = 0; i < n; i++) be->ops->swiglu(be, scratch + (size_t)i * 2 * (size_t)F, scratch + (size_t)i * 2 * (size_t)F + F, F);
    be->ops->copy_rows(be, G, F, scratch, 2 * F, n, (int)F);
}
static inline void kiln_be_matmul_swiglu(const kiln_backend *be, const kiln_weight *gate, const kiln_weight *up, const float *X, int n,
                                         float *G, float *scratch) {
    if (be->ops->matmul_swiglu) be->ops->matmul_swiglu(be, gate, up, X, n, G, scratch);
    else kiln_be_matmul_swiglu_unfused(be, gate, up, X, n, G, scratch);
}
#endif
