/* forward.c — the Llama-architecture forward pass: RMSNorm → Q/K/V → RoPE → paged GQA attention →
 * output projection → RMSNorm → SwiGLU MLP, per layer; final norm and LM head.
 * Linear layers run batched over the chunk (one weight read per chunk); attention runs per token
 * over the paged cache (causal: token i sees positions [0, pos_i]). */
#include "model/forward.h"
#include "model/arch.h"
#include "base/status.h"
#include "kernels/gemv.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Σx² goes through the dispatched dot kernel (kernels/gemv.h: 16-lane partial sums in several
 * accumulators, the scalar reference without SIMD): a plain loop is one chain of n dependent float
 * adds, ~1.5 µs for a 2,048-wide row, and a decode step of bench-500m runs 19 of them. The partial
 * sums change the rounding of Σx², not its meaning (HF's float32 variance is a vectorised sum too). */
void kiln_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    const float ss = 1.0f / sqrtf(kiln_dot_f32(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (ss * x[i]);
}

void kiln_rmsnorm_rows(float *out, const float *x, const float *w, int n_rows, int n, float eps) {
    for (int i = 0; i < n_rows; i++) kiln_rmsnorm(out + (size_t)i * n, x + (size_t)i * n, w, n, eps);
}

/* ---- the ends shared with the arch forward (model/arch.h) ---- */

kiln_status kiln_forward_embed(const struct kiln_model *m, kiln_forward_ws *ws, const kiln_batch *b) {
    const kiln_hparams *hp = &m->hp;
    const int n = b->n;
    if (n < 1 || n > ws->chunk) return kiln_fail(KILN_ERR_INTERNAL, "forward: batch of %d tokens (max %d)", n, ws->chunk);
    for (int i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->vocab)
            return kiln_fail(KILN_ERR_INVALID_ARG, "token id %d at position %d is out of range [0, %d)", b->tokens[i], b->pos[i], hp->vocab);
        if (b->pos[i] < 0 || b->pos[i] >= ws->n_ctx_max)
            return kiln_fail(KILN_ERR_INVALID_ARG, "context length exceeded: position %d >= %d", b->pos[i], ws->n_ctx_max);
        kiln_weight_row_f32(&m->tok_embd, b->tokens[i], ws->x + (size_t)i * hp->dim);
    }
    return KILN_OK;
}

void kiln_forward_head(const struct kiln_model *m, kiln_forward_ws *ws, const kiln_batch *b, float *logits) {
    const kiln_hparams *hp = &m->hp;
    const int dim = hp->dim, n = b->n;
    for (int i = 0; i < n; i++)
        if (b->seq[i]->len < b->pos[i] + 1) b->seq[i]->len = b->pos[i] + 1;
    /* Final norm and LM head only for the rows that want logits, gathered into xb (out_row order). */
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        int r = b->out_row ? b->out_row[i] : i;
        if (r < 0) continue;
        kiln_rmsnorm(ws->xb + (size_t)r * dim, ws->x + (size_t)i * dim, m->output_norm, dim, hp->norm_eps);
        if (r + 1 > n_out) n_out = r + 1;
    }
    if (n_out > 0) kiln_matmul(&m->output, ws->xb, logits, n_out);
}

kiln_status kiln_forward_ws_init(kiln_forward_ws *ws, const struct kiln_model *m, int chunk, int n_ctx_max) {
    const kiln_hparams *hp = &m->hp;
    memset(ws, 0, sizeof *ws);
    ws->chunk = chunk;
    ws->n_ctx_max = n_ctx_max;
    size_t c = (size_t)chunk, qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    ws->x = calloc(c * hp->dim, 4);
    ws->xb = calloc(c * hp->dim, 4);
    ws->q = calloc(c * qd, 4);
    ws->k = calloc(c * kvd, 4);
    ws->v = calloc(c * kvd, 4);
    ws->ao = calloc(c * qd, 4);
    ws->hb = calloc(c * hp->ffn_dim, 4);
    ws->hb2 = calloc(c * hp->ffn_dim, 4);
    ws->att = calloc((size_t)hp->n_heads * (size_t)n_ctx_max, 4);
    ws->rope = calloc(c * (size_t)hp->rotary_dim, 4);
    ws->logits = calloc((size_t)hp->vocab, 4);
    ws->pos = calloc(c, sizeof *ws->pos);
    ws->out_row = calloc(c, sizeof *ws->out_row);
    ws->seqs = calloc(c, sizeof *ws->seqs);
    if (!ws->pos || !ws->out_row || !ws->seqs || !ws->x || !ws->xb || !ws->q || !ws->k || !ws->v || !ws->ao || !ws->hb || !ws->hb2 || !ws->att || !ws->rope || !ws->logits) {
        kiln_forward_ws_free(ws);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory allocating forward scratch (chunk %d, context %d)", chunk, n_ctx_max);
    }
    if (m->arch) { /* GLM / DeepSeek-family scratch (model/arch.h) */
        kiln_status st = kiln_arch_ws_init(ws, m);
        if (st != KILN_OK) { kiln_forward_ws_free(ws); return st; }
    }
    return KILN_OK;
}

void kiln_forward_ws_free(kiln_forward_ws *ws) {
    free(ws->x); free(ws->xb); free(ws->q); free(ws->k); free(ws->v); free(ws->ao);
    free(ws->hb); free(ws->hb2); free(ws->att); free(ws->rope); free(ws->logits);
    free(ws->pos); free(ws->out_row); free(ws->seqs);
    if (ws->arch_ws_free) ws->arch_ws_free(ws->arch_ws);
    memset(ws, 0, sizeof *ws);
}

/* cos/sin for one position: rope[0..rot/2) = cos, rope[rot/2..rot) = sin, frequency of pair i
 * = theta^(-2i/rot) (the same float32 formula as llama2.c and HF's inv_freq). */
static void rope_table(float *rope, int pos, int rot, float theta) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf(theta, (float)(2 * i) / (float)rot);
        float val = (float)pos * freq;
        rope[i] = cosf(val);
        rope[half + i] = sinf(val);
    }
}

static void rope_apply(float *v, int n_heads, int hd, int rot, kiln_rope_style style, const float *rope) {
    int half = rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (int i = 0; i < half; i++) {
            float c = rope[i], s = rope[half + i];
            int a = style == KILN_ROPE_NORM ? 2 * i : i, b = style == KILN_ROPE_NORM ? 2 * i + 1 : i + half;
            float x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

kiln_status kiln_forward_batch(const struct kiln_model *m, kiln_kv_pool *pool, kiln_forward_ws *ws,
                               const kiln_batch *b, float *logits) {
    if (m->arch) return kiln_arch_forward(m, pool, ws, b, logits); /* GLM / DeepSeek families (model/arch.h) */
    const kiln_hparams *hp = &m->hp;
    const int dim = hp->dim, H = hp->n_heads, KV = hp->n_kv_heads, hd = hp->head_dim, ffn = hp->ffn_dim;
    const int qd = H * hd, kvd = KV * hd, n = b->n;
    KILN_TRY(kiln_forward_embed(m, ws, b));
    for (int i = 0; i < n; i++) rope_table(ws->rope + (size_t)i * hp->rotary_dim, b->pos[i], hp->rotary_dim, hp->rope_theta);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int l = 0; l < hp->n_layers; l++) {
        const kiln_layer *L = &m->layers[l];
        kiln_rmsnorm_rows(ws->xb, ws->x, L->attn_norm, n, dim, hp->norm_eps);
        { /* one parallel region for the three projections of the same input */
            const kiln_weight *w3[3] = {&L->wq, &L->wk, &L->wv};
            float *y3[3] = {ws->q, ws->k, ws->v};
            kiln_matmul_many(w3, y3, 3, ws->xb, n);
        }
        for (int i = 0; i < n; i++) {
            const float *rope = ws->rope + (size_t)i * hp->rotary_dim;
            rope_apply(ws->q + (size_t)i * qd, H, hd, hp->rotary_dim, hp->rope_style, rope);
            rope_apply(ws->k + (size_t)i * kvd, KV, hd, hp->rotary_dim, hp->rope_style, rope);
            kiln_kv_store(pool, b->seq[i], l, b->pos[i], ws->k + (size_t)i * kvd, ws->v + (size_t)i * kvd);
        }
        /* All of the step's K/V are stored first: token i sees positions [0, pos_i] of its sequence,
         * including earlier tokens of this step; consecutive tokens of one sequence share K/V reads. */
        kiln_kv_attend_batch(pool, l, n, b->seq, b->pos, ws->q, H, scale, ws->ao);
        kiln_matmul(&L->wo, ws->ao, ws->xb, n);
        for (size_t j = 0; j < (size_t)n * dim; j++) ws->x[j] += ws->xb[j];
        kiln_rmsnorm_rows(ws->xb, ws->x, L->ffn_norm, n, dim, hp->norm_eps);
        {
            const kiln_weight *w2[2] = {&L->w_gate, &L->w_up};
            float *y2[2] = {ws->hb, ws->hb2};
            kiln_matmul_many(w2, y2, 2, ws->xb, n);
        }
        kiln_silu_mul(ws->hb, ws->hb2, (int64_t)n * ffn);
        kiln_matmul(&L->w_down, ws->hb, ws->xb, n);
        for (size_t j = 0; j < (size_t)n * dim; j++) ws->x[j] += ws->xb[j];
    }
    kiln_forward_head(m, ws, b, logits);
    return KILN_OK;
}

kiln_status kiln_forward(const struct kiln_model *m, kiln_kv_pool *pool, kiln_kv_seq *seq, kiln_forward_ws *ws,
                         const int32_t *tokens, int n, float *logits) {
    if (n < 1 || n > ws->chunk) return kiln_fail(KILN_ERR_INTERNAL, "forward: chunk of %d tokens (max %d)", n, ws->chunk);
    for (int i = 0; i < n; i++) {
        ws->seqs[i] = seq;
        ws->pos[i] = seq->len + i;
        ws->out_row[i] = logits ? i : (i == n - 1 ? 0 : -1);
    }
    kiln_batch b = {n, tokens, ws->seqs, ws->pos, ws->out_row};
    return kiln_forward_batch(m, pool, ws, &b, logits ? logits : ws->logits);
}
