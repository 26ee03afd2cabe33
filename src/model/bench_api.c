/* bench_api.c — what `kiln bench` needs beyond running sessions: the machine's read bandwidth,
 * quantizing the output head too (the bench quantizes every linear layer), and the bytes of weights
 * a batch-1 decode step reads. */
#include "kiln_test.h"
#include "model/arch.h"
#include "backend/backend.h"
#include "backend/vulkan/backend_vulkan.h"
#include "model/model.h"
#include "base/status.h"
#include "quant/quantize.h"
#include "quant/dtype.h"
#include "format/tensor.h"
#include <stdlib.h>
#include <string.h>


/* A bench --weights name → format and group (FP8: its block size). */
static kiln_status bench_weight_format(const char *weights, kiln_wformat *fmt, int *group) {
    if (kiln_weights_name_parse(weights, fmt, group) != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--weights '%s' is not one of " KILN_WEIGHTS_NAMES, weights);
    return KILN_OK;
}

kiln_status kiln_model_requantize_head(kiln_model *m, const char *weights) {
    kiln_wformat fmt;
    int group;
    KILN_TRY(bench_weight_format(weights, &fmt, &group));
    if ((m->output.fmt == fmt && (fmt != KILN_WF_INT4_GROUP || m->output.block == group)) || ((fmt == KILN_WF_INT4_GROUP || fmt == KILN_WF_Q8_0 || fmt == KILN_WF_Q4_0) && m->output.cols % group))
        return KILN_OK;
    kiln_weight q;
    void *d = NULL, *s = NULL;
    KILN_TRY(kiln_quantize_weight(&m->output, fmt, group, &q, &d, &s));
    if (!kiln_model_own(m, d)) { free(s); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    if (s && !kiln_model_own(m, s)) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    const int layout = kiln_weight_prefers_tiled(&q, m->layout_isa);
    if (layout) (void)kiln_weight_tile(&q, d, s, layout); /* as requant.c does */
    m->output = q; /* the embedding lookup keeps reading tok_embd */
    (void)kiln_model_note_copy(m, "lm_head", d, (size_t)q.rows * q.row_bytes);
    if (s) (void)kiln_model_note_copy(m, "lm_head (scales)", s, kiln_weight_bytes(&q) - (size_t)q.rows * q.row_bytes);
    return KILN_OK;
}

/* What one token's linear layers read and compute: every projection and the output head, and for
 * MoE layers only the num_experts_per_tok experts a token is routed to (one token reads exactly
 * that many distinct experts; experts are equal-sized), the router and the shared experts; MLA's
 * absorbed per-head float32 copies of kv_b. The embedding row lookup (dim values) is negligible and not
 * counted. 0, 0 without memory for the weight list. */
static void token_linears(const kiln_model *m, uint64_t *bytes, uint64_t *macs) {
    *bytes = kiln_weight_bytes(&m->output);
    *macs = (uint64_t)m->output.rows * (uint64_t)m->output.cols;
    kiln_arch_model *am = m->arch_state;
    if (!am) return;
    const int E = am->hp.moe.n_experts;
    kiln_arch_linear *lin = malloc(((size_t)KILN_ARCH_DENSE_LINEARS + 3 * (size_t)E) * sizeof *lin);
    if (!lin) { *bytes = *macs = 0; return; }
    for (int l = 0; l < m->hp.n_layers; l++) {
        kiln_arch_layer *L = &am->layers[l];
        const int nw = kiln_arch_layer_linears(L, E, lin);
        uint64_t eb = 0, em = 0;
        for (int i = 0; i < nw; i++) {
            const uint64_t b = kiln_weight_bytes(lin[i].w), k = (uint64_t)lin[i].w->rows * (uint64_t)lin[i].w->cols;
            if (lin[i].expert >= 0) { eb += b; em += k; }
            else { *bytes += b; *macs += k; }
        }
        const uint64_t per = (uint64_t)(E > 0 ? E : 1), used = (uint64_t)am->hp.moe.n_used;
        *bytes += eb / per * used;
        *macs += em / per * used;
        if (L->moe.router.data) {
            *bytes += kiln_weight_bytes(&L->moe.router);
            *macs += (uint64_t)L->moe.router.rows * (uint64_t)L->moe.router.cols;
        }
        for (int h = 0; L->mla.ukt && h < m->hp.n_heads; h++) {
            const kiln_weight *uk = &L->mla.ukt[h], *uv = &L->mla.uv[h];
            *bytes += kiln_weight_bytes(uk) + kiln_weight_bytes(uv);
            *macs += (uint64_t)uk->rows * (uint64_t)uk->cols + (uint64_t)uv->rows * (uint64_t)uv->cols;
        }
    }
    free(lin);
}

uint64_t kiln_model_decode_weight_bytes(const kiln_model *m) {
    uint64_t b, k;
    token_linears(m, &b, &k);
    return b;
}

uint64_t kiln_model_token_macs(const kiln_model *m) {
    uint64_t b, k;
    token_linears(m, &b, &k);
    return k;
}

const char *kiln_model_linear_format(const kiln_model *m) {
    const kiln_arch_model *am = m->arch_state;
    if (!am || m->hp.n_layers < 1) return kiln_wformat_name(m->output.fmt);
    kiln_arch_linear lin[KILN_ARCH_DENSE_LINEARS + 3];
    const int nw = kiln_arch_layer_linears(&am->layers[0], 0, lin);
    return nw > 0 && lin[0].w ? kiln_wformat_name(lin[0].w->fmt) : kiln_wformat_name(m->output.fmt);
}

double kiln_model_bench_linear_step(const kiln_model *m, const kiln_options *opts, int reps) {
    const kiln_arch_model *am = m->arch_state;
    if (m->arch != &kiln_arch_llama || !am || reps < 1) return 0.0;
    kiln_backend *be = NULL;
    if (kiln_backend_from_options(opts, &be) != KILN_OK) return 0.0;
    const kiln_hparams *hp = &m->hp;
    const size_t qd = (size_t)hp->n_heads * (size_t)hp->head_dim, kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    size_t widest = (size_t)(hp->ffn_dim > hp->dim ? hp->ffn_dim : hp->dim);
    if (qd > widest) widest = qd;
    float *x = malloc(widest * sizeof *x), *a = malloc(widest * sizeof *a), *b = malloc(widest * sizeof *b),
          *c = malloc(kvd * sizeof *c), *d = malloc(kvd * sizeof *d), *lg = malloc((size_t)hp->vocab * sizeof *lg);
    double mean = 0.0;
    if (x && a && b && c && d && lg) {
        for (size_t i = 0; i < widest; i++) x[i] = (float)((int)(i % 7) - 3) * 0.25f; /* any finite activation */
        double t0 = kiln_now();
        for (int r = 0; r < reps; r++) {
            for (int l = 0; l < hp->n_layers; l++) {
                const kiln_arch_layer *L = &am->layers[l];
                const kiln_weight *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gu[2] = {&L->w_gate, &L->w_up};
                float *yq[3] = {a, c, d}, *yg[2] = {a, b};
                kiln_be_matmul_many(be, qkv, yq, 3, x, 1);
                kiln_be_matmul(be, &L->wo, x, b, 1);
                kiln_be_matmul_many(be, gu, yg, 2, x, 1);
                kiln_be_matmul(be, &L->w_down, x, b, 1);
            }
            kiln_be_matmul(be, &m->output, x, lg, 1);
        }
        mean = (kiln_now() - t0) / reps;
    }
    free(x); free(a); free(b); free(c); free(d); free(lg);
    kiln_backend_free(be);
    return mean;
}

/* ---- `kiln bench --gemv`: one weight format's streaming rate through kiln_matmul --------------- */
/* `copies` distinct weights of one shape (rows × cols), each quantized and laid out exactly as the
 * model's re-quantized layers are (kiln_quantize_weight, then the 4-row tiles where the kernels read
 * them), so that one pass (a matmul of `tokens` activation rows over every copy in turn: 1 = the
 * decode GEMV) reads at least min_bytes from memory rather than from a cache. */
struct kiln_gemv_bench {
    int copies;
    kiln_weight *w;   /* [copies] */
    void **owned;     /* [2 * copies] data and scales of each copy */
    float *x, *y;     /* [tokens, cols], [tokens, rows] */
    int tokens;       /* activation rows per matmul call: 1 = the decode GEMV, 2+ a few-token step */
    uint64_t bytes;   /* data + scales of all copies: what one pass reads */
    kiln_kctx cx;     /* kernels and threads a pass runs with */
};

void kiln_gemv_bench_close(kiln_gemv_bench *b) {
    if (!b) return;
    for (int i = 0; b->owned && i < 2 * b->copies; i++) free(b->owned[i]);
    free(b->owned);
    free(b->w);
    free(b->x);
    free(b->y);
    free(b);
}

/* The GGUF block types kiln reads but does not quantize to (K-quants, IQ4, Q4_1, Q5_0, Q5_1): a
 * weight of random blocks — bytes uniform, each block's f16 scales (d; dmin / m where the type has
 * one) a small finite value — which the kernels read exactly as a real file's. *q, *d as
 * kiln_quantize_weight's; 1 when `weights` names such a type, 0 when not, -1 out of memory. */
static int gguf_random_weight(const char *weights, int64_t rows, int64_t cols, kiln_weight *q, void **d, kiln_status *st) {
    static const struct { kiln_dtype dt; int f16_at[2], n_f16; } types[] = {
        {KILN_DT_Q4_K, {0, 2}, 2},  {KILN_DT_Q5_K, {0, 2}, 2}, {KILN_DT_Q6_K, {208, 0}, 1}, {KILN_DT_Q2_K, {80, 82}, 2},
        {KILN_DT_Q3_K, {108, 0}, 1}, {KILN_DT_IQ4_XS, {0, 0}, 1}, {KILN_DT_Q4_1, {0, 2}, 2}, {KILN_DT_Q5_0, {0, 0}, 1},
        {KILN_DT_Q5_1, {0, 2}, 2},  {KILN_DT_IQ4_NL, {0, 0}, 1},
    };
    const int dt = kiln_dtype_from_name(weights);
    int ti = -1;
    for (int i = 0; i < (int)(sizeof types / sizeof types[0]); i++)
        if ((int)types[i].dt == dt) ti = i;
    if (ti < 0) return 0;
    const kiln_dtype_info *info = kiln_dtype_get(types[ti].dt);
    if (cols % info->block_elems) {
        *st = kiln_fail(KILN_ERR_INVALID_ARG, "--shape %lldx%lld: cols is not a multiple of the %s block of %d", (long long)rows, (long long)cols,
                        info->name, info->block_elems);
        return 1;
    }
    const size_t nb = (size_t)rows * (size_t)(cols / info->block_elems), bytes = nb * (size_t)info->block_bytes;
    uint8_t *p = kiln_alloc64(bytes);
    if (!p) return -1;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < bytes; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(x >> 56);
    }
    for (size_t b = 0; b < nb; b++)
        for (int j = 0; j < types[ti].n_f16; j++) {
            const uint16_t h = 0x1400; /* 2^-10 */
            memcpy(p + b * (size_t)info->block_bytes + types[ti].f16_at[j], &h, 2);
        }
    const kiln_tensor t = {.name = "bench", .dtype = types[ti].dt, .ndim = 2, .shape = {rows, cols}, .data = p, .nbytes = bytes, .file = "bench"};
    *st = kiln_weight_from_tensor(&t, rows, cols, q);
    if (*st) free(p);
    else *d = p;
    return 1;
}

kiln_status kiln_gemv_bench_open(const char *weights, int64_t rows, int64_t cols, int tokens, uint64_t min_bytes, const kiln_options *opts,
                                 kiln_gemv_bench **out) {
    *out = NULL;
    if (tokens < 1 || tokens > 1024) return kiln_fail(KILN_ERR_INVALID_ARG, "--tokens %d: must be in [1, 1024]", tokens);
    kiln_wformat fmt;
    int group;
    kiln_weight gq = {0};
    void *gd = NULL;
    kiln_status gst = KILN_OK;
    const int gguf = rows >= 1 && cols >= 1 && rows <= (1 << 20) && cols <= (1 << 20) ? gguf_random_weight(weights, rows, cols, &gq, &gd, &gst) : 0;
    if (gguf < 0) return kiln_fail(KILN_ERR_NOMEM, "out of memory for a %lldx%lld weight", (long long)rows, (long long)cols);
    if (gst) return gst;
    if (!gguf && kiln_weights_name_parse(weights, &fmt, &group) != 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--weights '%s' is not one of " KILN_WEIGHTS_NAMES
                         " or a GGUF block type (q4_k, q5_k, q6_k, q2_k, q3_k, iq4_xs, q4_1, q5_0, q5_1, iq4_nl)", weights);
    if (gguf) fmt = gq.fmt, group = 0;
    if (rows < 1 || cols < 1 || rows > (1 << 20) || cols > (1 << 20))
        return kiln_fail(KILN_ERR_INVALID_ARG, "--shape %lldx%lld: rows and cols must be in [1, 1048576]", (long long)rows, (long long)cols);
    if ((fmt == KILN_WF_INT4_GROUP || fmt == KILN_WF_Q8_0 || fmt == KILN_WF_Q4_0) && cols % group)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--shape %lldx%lld: cols is not a multiple of the %s %d", (long long)rows, (long long)cols,
                         fmt == KILN_WF_INT4_GROUP ? "INT4 group" : fmt == KILN_WF_Q8_0 ? "Q8_0 block" : "Q4_0 block", group);
    /* The source: a deterministic pseudo-random F32 matrix in [-1, 1) (the values do not change
     * the bytes a kernel reads), quantized; the GGUF block types: the random blocks above. */
    float *src = gguf ? NULL : malloc((size_t)rows * (size_t)cols * sizeof *src);
    kiln_gemv_bench *b = calloc(1, sizeof *b);
    if (b) /* the options' ISA, threads and FP8 form, as a cpu backend of those options computes */
        kiln_kctx_init(&b->cx, opts ? opts->isa : KILN_ISA_AUTO, opts ? opts->threads : 0, opts ? opts->fp8_gemv : KILN_FP8_AUTO);
    if ((!gguf && !src) || !b) { free(src); free(b); free(gd); return kiln_fail(KILN_ERR_NOMEM, "out of memory for a %lldx%lld weight", (long long)rows, (long long)cols); }
    kiln_weight q = gq;
    void *d = gd, *sc = NULL;
    if (!gguf) {
        uint64_t x = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            src[i] = (float)(int64_t)(x >> 40) / 8388608.0f - 1.0f;
        }
        const kiln_weight f = {.fmt = KILN_WF_F32, .rows = rows, .cols = cols, .data = (const uint8_t *)src, .row_bytes = (size_t)cols * sizeof(float)};
        kiln_status st = kiln_quantize_weight(&f, fmt, group, &q, &d, &sc);
        free(src);
        if (st) { free(b); return st; }
    }
    const size_t db = (size_t)q.rows * q.row_bytes, sb = kiln_weight_bytes(&q) - db;
    const uint64_t per = kiln_weight_bytes(&q);
    int n = (int)((min_bytes + per - 1) / per);
    if (n < 1) n = 1;
    if (n > 4096) n = 4096;
    b->copies = n;
    b->w = calloc((size_t)n, sizeof *b->w);
    b->owned = calloc(2 * (size_t)n, sizeof *b->owned);
    b->tokens = tokens;
    b->x = malloc((size_t)tokens * (size_t)cols * sizeof *b->x);
    b->y = malloc((size_t)tokens * (size_t)rows * sizeof *b->y);
    if (!b->w || !b->owned || !b->x || !b->y) { free(d); free(sc); kiln_gemv_bench_close(b); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    for (int i = 0; i < n; i++) {
        uint8_t *di = i == 0 ? d : kiln_alloc64(db);
        void *si = i == 0 ? sc : sb ? kiln_alloc64(sb) : NULL;
        b->owned[2 * i] = di;
        b->owned[2 * i + 1] = si;
        if (!di || (sb && !si)) { /* only for i > 0: copy 0 is the quantizer's own buffers, owned[0..1] */
            kiln_gemv_bench_close(b);
            return kiln_fail(KILN_ERR_NOMEM, "out of memory for %d copies of a %.1f MB weight", n, per / 1e6);
        }
        if (i == 0) { /* the quantizer's output, tiled in place as requant.c does */
            b->w[0] = q;
            const int layout = kiln_weight_prefers_tiled(&b->w[0], b->cx.isa);
            if (layout) (void)kiln_weight_tile(&b->w[0], di, si, layout);
        } else { /* byte copies of copy 0, already in its final layout */
            memcpy(di, d, db);
            if (sb) memcpy(si, sc, sb);
            b->w[i] = b->w[0];
            b->w[i].data = di;
            b->w[i].scales = si;
        }
        b->bytes += per;
    }
    for (int64_t c = 0; c < (int64_t)tokens * cols; c++) b->x[c] = (float)((int)(c % 7) - 3) * 0.25f; /* any finite activation */
    *out = b;
    return KILN_OK;
}

uint64_t kiln_gemv_bench_bytes(const kiln_gemv_bench *b) { return b->bytes; }
int kiln_gemv_bench_copies(const kiln_gemv_bench *b) { return b->copies; }

double kiln_gemv_bench_pass(kiln_gemv_bench *b) {
    const double t0 = kiln_now();
    for (int i = 0; i < b->copies; i++) kiln_cx_matmul(&b->cx, &b->w[i], b->x, b->y, b->tokens);
    const double dt = kiln_now() - t0;
    return dt > 0 ? (double)b->bytes / dt / 1e9 : 0.0;
}

kiln_status kiln_device_read_gbps(const kiln_options *o, size_t bytes, double *gbps) {
    *gbps = 0.0;
    if (o->backend != KILN_BACKEND_VULKAN) return kiln_fail(KILN_ERR_UNSUPPORTED, "device bandwidth: the %s backend computes in host memory", kiln_backend_kind_name(o->backend));
    kiln_backend *be = NULL;
    KILN_TRY(kiln_backend_from_options(o, &be));
    kiln_status st = kiln_backend_vulkan_read_gbps(be, bytes ? bytes : (size_t)512 << 20, 8, gbps);
    kiln_backend_free(be);
    return st;
}
