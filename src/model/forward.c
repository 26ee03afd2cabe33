/* forward.c — the forward pass of every architecture of the table (model/arch.h: llama, GLM,
 * DeepSeek / Kimi), built from backend ops (backend/backend.h) and nothing else:
 *
 *   x = embed(tokens)
 *   per layer: h = attn(rmsnorm(x));  [h = rmsnorm(h) post_self_attn]  x += h
 *              h = ffn(rmsnorm(x));   [h = rmsnorm(h) post_mlp]        x += h
 *              attn = GQA (fused or separate QKV, biases, q/k norm, partial RoPE) or MLA (mla.c)
 *              ffn  = dense SwiGLU (fused or separate gate/up) or MoE (moe.c)
 *   logits = head(rmsnorm(x))
 * Linear layers run batched over the step's tokens (one weight read per step); attention runs per
 * token over its own sequence's pages (causal: token i sees positions [0, pos_i]). */
#include "model/forward.h"
#include "model/arch.h"
#include "base/status.h"
#include <stdlib.h>
#include <string.h>

/* ---- scratch ------------------------------------------------------------------------------------ */

kiln_status kiln_forward_ws_init(kiln_forward_ws *ws, const struct kiln_model *m, const kiln_backend *be, int chunk, int n_ctx_max) {
    const kiln_hparams *hp = &m->hp;
    const kiln_arch_hp *ah = &((const kiln_arch_model *)m->arch_state)->hp;
    memset(ws, 0, sizeof *ws);
    if (m->vocab_split && !m->gather) return kiln_fail(KILN_ERR_INVALID_ARG, "the model's LM head is split over %d ranks but no logits gather is set (kiln_model_set_logits_gather)", m->tp);
    ws->be = be;
    ws->chunk = chunk;
    ws->n_ctx_max = n_ctx_max;
    const size_t T = (size_t)chunk, D = (size_t)hp->dim, F = (size_t)hp->ffn_dim;
    int ok = 1;
    size_t failed_bytes = 0; /* the buffer that could not be had (named in the error) */
#define BUF_FROM(alloc, field, floats)                                                                                    \
    do {                                                                                                                  \
        if (ok && !(ws->field = alloc(be, (floats) * sizeof(float)))) ok = 0, failed_bytes = (floats) * sizeof(float);   \
    } while (0)
#define BUF(field, floats) BUF_FROM(kiln_be_alloc, field, floats)
    BUF(x, T * D);
    BUF(xb, T * D);
    BUF(tmp, T * D);
    BUF(hb, T * F * 2);
    BUF(hb2, T * F);
    BUF(cs, T * (size_t)(ah->rope.rot_dim > 0 ? ah->rope.rot_dim : 1));
    /* read by the host after every step (sampling; the vocab-split gather): kiln_be_alloc_readback */
    BUF_FROM(kiln_be_alloc_readback, logits, (size_t)hp->vocab);
    if (m->vocab_split) BUF_FROM(kiln_be_alloc_readback, head_part, T * (size_t)(m->output.rows + 1));
    if (((const kiln_arch_model *)m->arch_state)->n_mtp > 0) BUF(eh, T * 2 * D);
    if (ah->attn == KILN_ATTN_GQA) {
        const size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
        BUF(q, T * qd);
        BUF(k, T * kvd);
        BUF(v, T * kvd);
        BUF(ao, T * qd);
        if (ah->qkv_fused) BUF(qkv, T * (qd + 2 * kvd));
    }
#undef BUF
#undef BUF_FROM
    ws->pos = calloc(T, sizeof *ws->pos);
    ws->out_row = calloc(T, sizeof *ws->out_row);
    ws->seqs = calloc(T, sizeof *ws->seqs);
    if (!ok || !ws->pos || !ws->out_row || !ws->seqs) {
        kiln_forward_ws_free(ws);
        if (failed_bytes)
            return kiln_fail(KILN_ERR_NOMEM, "out of memory allocating forward scratch (chunk %d, context %d): a buffer of %zu bytes on %s", chunk,
                             n_ctx_max, failed_bytes, be->device_name ? be->device_name : kiln_backend_kind_name(be->kind));
        return kiln_fail(KILN_ERR_NOMEM, "out of memory allocating forward scratch (chunk %d, context %d)", chunk, n_ctx_max);
    }
    kiln_status st = KILN_OK;
    if (ah->attn == KILN_ATTN_MLA) {
        st = kiln_mla_ws_init(&ws->mla, be, &ah->mla, chunk);
        ws->has_mla = st == KILN_OK;
    }
    if (st == KILN_OK && ah->n_moe_layers > 0) {
        st = kiln_moe_ws_init(&ws->moe, be, &ah->moe, chunk);
        ws->has_moe = st == KILN_OK;
    }
    if (st != KILN_OK) kiln_forward_ws_free(ws);
    return st;
}

void kiln_forward_ws_free(kiln_forward_ws *ws) {
    const kiln_backend *be = ws->be;
    if (be) {
        float *bufs[] = {ws->x, ws->xb, ws->tmp, ws->q, ws->k, ws->v, ws->qkv, ws->ao, ws->hb, ws->hb2, ws->cs, ws->logits, ws->eh, ws->head_part};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) kiln_be_free(be, bufs[i]);
        if (ws->has_mla) kiln_mla_ws_free(&ws->mla, be);
        if (ws->has_moe) kiln_moe_ws_free(&ws->moe, be);
    }
    free(ws->pos); free(ws->out_row); free(ws->seqs);
    memset(ws, 0, sizeof *ws);
}

/* ---- the two ends ------------------------------------------------------------------------------- */

/* Checks the batch (1..chunk tokens, ids in [0, vocab), positions below n_ctx_max) and writes each
 * token's embedding row to ws->x [n, dim]. */
static kiln_status embed(const struct kiln_model *m, kiln_forward_ws *ws, const kiln_batch *b) {
    const kiln_hparams *hp = &m->hp;
    const int n = b->n;
    if (n < 1 || n > ws->chunk) return kiln_fail(KILN_ERR_INTERNAL, "forward: batch of %d tokens (max %d)", n, ws->chunk);
    for (int i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->vocab)
            return kiln_fail(KILN_ERR_INVALID_ARG, "token id %d at position %d is out of range [0, %d)", b->tokens[i], b->pos[i], hp->vocab);
        if (b->pos[i] < 0 || b->pos[i] >= ws->n_ctx_max)
            return kiln_fail(KILN_ERR_INVALID_ARG, "context length exceeded: position %d >= %d", b->pos[i], ws->n_ctx_max);
    }
    ws->be->ops->embed(ws->be, &m->tok_embd, b->tokens, n, ws->x);
    return KILN_OK;
}

/* After the last layer: each sequence's len becomes max(len, pos + 1); the rows of ws->x that want
 * logits are RMSNormed into ws->xb in out_row order and the LM head runs over them into logits
 * [rows, vocab]. */
static void head(const struct kiln_model *m, kiln_forward_ws *ws, const kiln_batch *b, float *logits) {
    const kiln_hparams *hp = &m->hp;
    const int dim = hp->dim, n = b->n;
    for (int i = 0; i < n; i++)
        if (b->seq[i]->len < b->pos[i] + 1) b->seq[i]->len = b->pos[i] + 1;
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        int r = b->out_row ? b->out_row[i] : i;
        if (r < 0) continue;
        kiln_be_rmsnorm(ws->be, ws->xb + (size_t)r * dim, ws->x + (size_t)i * dim, m->output_norm, 1, dim, hp->norm_eps);
        if (r + 1 > n_out) n_out = r + 1;
    }
    if (n_out > 0 && m->vocab_split) { /* this rank's columns, then rank 0 assembles the rows */
        kiln_be_matmul(ws->be, &m->output, ws->xb, ws->head_part, n_out);
        kiln_be_wait(ws->be); /* the gather reads head_part on the host */
        m->gather(m->gather_ctx, ws->head_part, n_out, hp->vocab, logits);
    } else if (n_out > 0) kiln_be_matmul(ws->be, &m->output, ws->xb, logits, n_out);
}

/* ---- blocks ------------------------------------------------------------------------------------- */

/* GQA attention of ws->xb [n, dim] into ws->tmp [n, dim]. */
static void gqa(const struct kiln_model *m, const kiln_arch_hp *ah, const kiln_arch_layer *L, kiln_kv_pool *pool, int l,
                kiln_forward_ws *ws, const kiln_batch *b) {
    const kiln_backend *be = ws->be;
    const kiln_hparams *hp = &m->hp;
    const int n = b->n, H = hp->n_heads, KV = hp->n_kv_heads, hd = hp->head_dim, qd = H * hd, kvd = KV * hd;
    if (ah->qkv_fused) {
        kiln_be_matmul(be, &L->wqkv, ws->xb, ws->qkv, n);
        /* row i is [q | k | v]: split by the backend (no host access, so no stop on a device) */
        const int64_t row = qd + 2 * kvd;
        be->ops->copy_rows(be, ws->q, qd, ws->qkv, row, n, qd);
        be->ops->copy_rows(be, ws->k, kvd, ws->qkv + qd, row, n, kvd);
        be->ops->copy_rows(be, ws->v, kvd, ws->qkv + qd + kvd, row, n, kvd);
    } else {
        /* one parallel section for the three projections of the same input */
        const kiln_weight *w3[3] = {&L->wq, &L->wk, &L->wv};
        float *y3[3] = {ws->q, ws->k, ws->v};
        kiln_be_matmul_many(be, w3, y3, 3, ws->xb, n);
    }
    if (L->bq) be->ops->add_bias(be, ws->q, L->bq, n, qd);
    if (L->bk) be->ops->add_bias(be, ws->k, L->bk, n, kvd);
    if (L->bv) be->ops->add_bias(be, ws->v, L->bv, n, kvd);
    if (ah->qk_norm) { /* per head, before RoPE */
        kiln_be_rmsnorm(be, ws->q, ws->q, L->q_norm, n * H, hd, hp->norm_eps);
        kiln_be_rmsnorm(be, ws->k, ws->k, L->k_norm, n * KV, hd, hp->norm_eps);
    }
    kiln_be_rope2(be, &ah->rope, ws->q, qd, H, ws->k, kvd, KV, n, hd, ws->cs); /* Q and K in one pass */
    /* every token stored first; token i then sees positions [0, pos[i]] of its own sequence,
     * earlier tokens of this step included (consecutive tokens of one sequence share K/V reads) */
    be->ops->kv_store(be, pool, b->seq, b->pos, n, l, ws->k, kvd, ws->v, kvd);
    be->ops->kv_attend(be, pool, l, n, b->seq, b->pos, ws->q, H, ah->attn_scale, ws->ao);
    kiln_be_matmul(be, &L->wo, ws->ao, ws->tmp, n);
}

/* Dense SwiGLU MLP of X [n, dim] into ws->tmp [n, dim]. */
static void mlp(const kiln_arch_hp *ah, const kiln_arch_layer *L, kiln_forward_ws *ws, const float *X, int n) {
    const kiln_backend *be = ws->be;
    /* hb2 [n, F] = silu(gate) · up; hb [n, 2F] scratch (the fused gate_up weight's rows [gate | up]) */
    if (ah->ffn_fused) kiln_be_matmul_swiglu(be, &L->w_gate_up, NULL, X, n, ws->hb2, ws->hb);
    else kiln_be_matmul_swiglu(be, &L->w_gate, &L->w_up, X, n, ws->hb2, ws->hb);
    kiln_be_matmul(be, &L->w_down, ws->hb2, ws->tmp, n);
}

/* ---- the pass ----------------------------------------------------------------------------------- */

/* One decoder block over ws->x [n, dim] in place (attention + MLP / MoE, residual adds), its KV in
 * pool layer l. Its last residual add is left to the caller: ws->tmp [n, dim] holds it on return,
 * and the next block adds it in the same pass as its first norm (kiln_be_add_rmsnorm: one dispatch
 * instead of two on a GPU); `pending` says the previous block left one. */
static kiln_status block(const struct kiln_model *m, const kiln_arch_hp *ah, const kiln_arch_layer *L, kiln_kv_pool *pool, int l,
                         kiln_forward_ws *ws, const kiln_batch *b, int pending) {
    const kiln_hparams *hp = &m->hp;
    const kiln_backend *be = ws->be;
    const int dim = hp->dim, n = b->n;
    const int64_t nd = (int64_t)n * dim;
    if (pending) kiln_be_add_rmsnorm(be, ws->x, ws->tmp, ws->xb, L->attn_norm, n, dim, hp->norm_eps);
    else kiln_be_rmsnorm(be, ws->xb, ws->x, L->attn_norm, n, dim, hp->norm_eps);
    if (ah->attn == KILN_ATTN_MLA)
        KILN_TRY(kiln_mla_forward(be, &ah->mla, &L->mla, &ah->rope, pool, l, b->seq, b->pos, ws->xb, n, ws->cs, ws->tmp, &ws->mla));
    else gqa(m, ah, L, pool, l, ws, b);
    if (m->allreduce) { /* tensor parallel: o_proj's partial sums (MPI reads and writes them on the host) */
        kiln_be_wait(be);
        m->allreduce(m->allreduce_ctx, ws->tmp, nd);
    }
    if (L->post_attn_norm) kiln_be_rmsnorm(be, ws->tmp, ws->tmp, L->post_attn_norm, n, dim, hp->norm_eps);
    kiln_be_add_rmsnorm(be, ws->x, ws->tmp, ws->xb, L->ffn_norm, n, dim, hp->norm_eps);
    if (L->is_moe) KILN_TRY(kiln_moe_forward(be, &ah->moe, &L->moe, ws->xb, n, ws->tmp, &ws->moe));
    else mlp(ah, L, ws, ws->xb, n);
    if (m->allreduce) { /* tensor parallel: down_proj's partial sums */
        kiln_be_wait(be);
        m->allreduce(m->allreduce_ctx, ws->tmp, nd);
    }
    if (L->post_ffn_norm) kiln_be_rmsnorm(be, ws->tmp, ws->tmp, L->post_ffn_norm, n, dim, hp->norm_eps);
    return KILN_OK; /* ws->tmp: the residual add still to make */
}

static kiln_status forward_batch_once(const struct kiln_model *m, kiln_kv_pool *pool, kiln_forward_ws *ws, const kiln_batch *b, float *logits) {
    const kiln_hparams *hp = &m->hp;
    const kiln_arch_model *am = m->arch_state;
    const kiln_arch_hp *ah = &am->hp;
    KILN_TRY(embed(m, ws, b));
    ws->be->ops->rope_table(ws->be, &ah->rope, b->pos, b->n, ws->cs);
    for (int l = 0; l < hp->n_layers; l++) KILN_TRY(block(m, ah, &am->layers[l], pool, l, ws, b, l > 0));
    if (hp->n_layers > 0) kiln_be_add(ws->be, ws->x, ws->tmp, (int64_t)b->n * hp->dim); /* the last block's residual add */
    if (ws->hidden_out) {
        kiln_be_wait(ws->be);
        memcpy(ws->hidden_out, ws->x, (size_t)b->n * (size_t)hp->dim * sizeof(float));
    }
    head(m, ws, b, logits);
    return KILN_OK;
}

/* A step is one deferred step of the backend (backend.h: the vulkan backend records its ops and
 * submits them when the host needs their results, instead of once per op); model code waits for it
 * before it touches a buffer itself. Should the device fail while results were pending, the step is
 * computed again — the backend then computes on the host — which is safe because a step's effects
 * repeat exactly: the KV rows it stores are stored again (re-sealed), the lengths it sets are
 * maxima, everything else is recomputed from the tokens. */
/* The end of a deferred step: 1 when it must be computed again. Under tensor parallelism the ranks
 * agree (one all-reduce of the flag, only with a backend that defers): a rank whose device failed
 * fed garbage partial sums to every rank's all-reduces, and all must repeat the step together, or
 * their collectives would no longer pair up. */
static int step_lost(const struct kiln_model *m, const kiln_backend *be) {
    int lost = kiln_be_end(be);
    if (m->allreduce && be->ops->sync) {
        float f = (float)lost;
        m->allreduce(m->allreduce_ctx, &f, 1);
        lost = f > 0.0f;
    }
    return lost;
}

kiln_status kiln_forward_batch(const struct kiln_model *m, kiln_kv_pool *pool, kiln_forward_ws *ws, const kiln_batch *b, float *logits) {
    if (!m->arch_state || !ws->be) return kiln_fail(KILN_ERR_INTERNAL, "forward: %s model not bound or scratch not initialised", m->hp.arch);
    kiln_be_defer(ws->be);
    kiln_status st = forward_batch_once(m, pool, ws, b, logits);
    if (step_lost(m, ws->be) && st == KILN_OK) st = forward_batch_once(m, pool, ws, b, logits);
    return st;
}

static kiln_status forward_mtp_once(const struct kiln_model *m, int j, kiln_kv_pool *pool, kiln_forward_ws *ws, const kiln_batch *b,
                                    const float *h_in, float *h_out, float *logits) {
    const kiln_hparams *hp = &m->hp;
    const kiln_arch_model *am = m->arch_state;
    if (!am || !ws->be || j < 0 || j >= am->n_mtp || !ws->eh || !am->mtp[j].absorbed)
        return kiln_fail(KILN_ERR_INTERNAL, "forward_mtp: MTP layer %d not bound, prepared or given scratch", j);
    const kiln_mtp_layer *M = &am->mtp[j];
    const kiln_arch_hp *ah = &am->hp;
    const kiln_backend *be = ws->be;
    const int dim = hp->dim, n = b->n;
    if (n < 1 || n > ws->chunk) return kiln_fail(KILN_ERR_INTERNAL, "forward_mtp: batch of %d tokens (max %d)", n, ws->chunk);
    for (int i = 0; i < n; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= hp->vocab || b->pos[i] < 0 || b->pos[i] >= ws->n_ctx_max)
            return kiln_fail(KILN_ERR_INVALID_ARG, "forward_mtp: token %d at position %d is out of range", b->tokens[i], b->pos[i]);
    /* eh rows [enorm(embed(t)) | hnorm(h)]; the embedding of position 0 is zero (vLLM masks it) */
    be->ops->embed(be, &M->embed, b->tokens, n, ws->x);
    for (int i = 0; i < n; i++)
        if (b->pos[i] == 0) memset(ws->x + (size_t)i * dim, 0, (size_t)dim * sizeof(float));
    kiln_be_rmsnorm(be, ws->xb, ws->x, M->enorm, n, dim, hp->norm_eps);
    kiln_be_rmsnorm(be, ws->tmp, h_in, M->hnorm, n, dim, hp->norm_eps);
    kiln_be_wait(be);
    for (int i = 0; i < n; i++) {
        memcpy(ws->eh + (size_t)i * 2 * dim, ws->xb + (size_t)i * dim, (size_t)dim * sizeof(float));
        memcpy(ws->eh + (size_t)i * 2 * dim + dim, ws->tmp + (size_t)i * dim, (size_t)dim * sizeof(float));
    }
    kiln_be_matmul(be, &M->eh, ws->eh, ws->x, n);
    be->ops->rope_table(be, &ah->rope, b->pos, n, ws->cs);
    KILN_TRY(block(m, ah, &M->L, pool, 0, ws, b, 0));
    kiln_be_add(be, ws->x, ws->tmp, (int64_t)n * dim); /* the block's residual add */
    if (h_out) {
        kiln_be_wait(be);
        memcpy(h_out, ws->x, (size_t)n * (size_t)dim * sizeof(float));
    }
    for (int i = 0; i < n; i++)
        if (b->seq[i]->len < b->pos[i] + 1) b->seq[i]->len = b->pos[i] + 1;
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        const int r = b->out_row ? b->out_row[i] : i;
        if (r < 0) continue;
        kiln_be_rmsnorm(be, ws->xb + (size_t)r * dim, ws->x + (size_t)i * dim, M->head_norm, 1, dim, hp->norm_eps);
        if (r + 1 > n_out) n_out = r + 1;
    }
    if (n_out > 0 && logits) kiln_be_matmul(be, &M->head, ws->xb, logits, n_out);
    return KILN_OK;
}

/* One deferred step, computed again if the device failed during it (kiln_forward_batch). */
kiln_status kiln_forward_mtp(const struct kiln_model *m, int j, kiln_kv_pool *pool, kiln_forward_ws *ws, const kiln_batch *b, const float *h_in,
                             float *h_out, float *logits) {
    if (!ws->be) return kiln_fail(KILN_ERR_INTERNAL, "forward_mtp: no scratch");
    kiln_be_defer(ws->be);
    kiln_status st = forward_mtp_once(m, j, pool, ws, b, h_in, h_out, logits);
    if (step_lost(m, ws->be) && st == KILN_OK) st = forward_mtp_once(m, j, pool, ws, b, h_in, h_out, logits);
    return st;
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
