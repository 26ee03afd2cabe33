/* mla.c — Multi-head Latent Attention with weight absorption over the paged latent cache (mla.h). */
#include "model/mla.h"
#include "model/model.h"
#include "base/status.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

kiln_status kiln_mla_ws_init(kiln_mla_ws *ws, const kiln_backend *be, const kiln_mla_cfg *c, int max_tokens) {
    memset(ws, 0, sizeof *ws);
    ws->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens, H = (size_t)c->n_heads, row = (size_t)kiln_mla_row(c);
    size_t qd = H * (size_t)(c->qk_nope + c->qk_rope);
    size_t g = (size_t)(c->kv_lora_rank > c->qk_nope ? c->kv_lora_rank : c->qk_nope);
    if ((size_t)c->v_head > g) g = (size_t)c->v_head;
    ws->qa = kiln_be_alloc(be, T * (size_t)(c->q_lora_rank > 0 ? c->q_lora_rank : 1) * sizeof(float));
    ws->q = kiln_be_alloc(be, T * qd * sizeof(float));
    ws->kva = kiln_be_alloc(be, T * row * sizeof(float));
    ws->lat = kiln_be_alloc(be, T * row * sizeof(float));
    ws->qabs = kiln_be_alloc(be, T * H * row * sizeof(float));
    ws->olat = kiln_be_alloc(be, T * H * row * sizeof(float));
    ws->ov = kiln_be_alloc(be, T * H * (size_t)c->v_head * sizeof(float));
    ws->gin = kiln_be_alloc(be, T * g * sizeof(float));
    ws->gout = kiln_be_alloc(be, T * g * sizeof(float));
    int dsa_ok = 1;
    if (c->dsa) {
        ws->qi = kiln_be_alloc(be, T * (size_t)c->idx_heads * (size_t)c->idx_dim * sizeof(float));
        ws->iw = kiln_be_alloc(be, T * (size_t)c->idx_heads * sizeof(float));
        ws->ki = kiln_be_alloc(be, T * (size_t)c->idx_dim * sizeof(float));
        /* the selection in the backend's memory: a device writes it and reads it in one step */
        ws->sel = kiln_be_alloc(be, T * (size_t)c->idx_topk * sizeof *ws->sel);
        ws->nsel = kiln_be_alloc(be, T * sizeof *ws->nsel);
        dsa_ok = ws->qi && ws->iw && ws->ki && ws->sel && ws->nsel;
    }
    if (!dsa_ok || !ws->qa || !ws->q || !ws->kva || !ws->lat || !ws->qabs || !ws->olat || !ws->ov || !ws->gin || !ws->gout) {
        kiln_mla_ws_free(ws, be);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory allocating MLA scratch (%d tokens, %d heads)", max_tokens, c->n_heads);
    }
    return KILN_OK;
}

void kiln_mla_ws_free(kiln_mla_ws *ws, const kiln_backend *be) {
    float *bufs[] = {ws->qa, ws->q, ws->kva, ws->lat, ws->qabs, ws->olat, ws->ov, ws->gin, ws->gout, ws->qi, ws->iw, ws->ki};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) kiln_be_free(be, bufs[i]);
    kiln_be_free(be, ws->sel);
    kiln_be_free(be, ws->nsel);
    memset(ws, 0, sizeof *ws);
}

kiln_status kiln_mla_absorb(struct kiln_model *m, const kiln_mla_cfg *c, kiln_mla_layer *L) {
    const int H = c->n_heads, r = c->kv_lora_rank, dn = c->qk_nope, dv = c->v_head;
    float *row = malloc((size_t)r * sizeof(float));
    /* kiln_alloc64: streamed every decode step like the other weights (huge pages from 2 MiB) */
    float *ukt = kiln_model_own(m, kiln_alloc64((size_t)H * r * dn * sizeof(float)));
    float *uv = kiln_model_own(m, kiln_alloc64((size_t)H * dv * r * sizeof(float)));
    L->ukt = kiln_model_own(m, calloc((size_t)H, sizeof *L->ukt));
    L->uv = kiln_model_own(m, calloc((size_t)H, sizeof *L->uv));
    if (!row || !ukt || !uv || !L->ukt || !L->uv) {
        free(row);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory absorbing kv_b_proj (%d heads × %d × %d)", H, dn + dv, r);
    }
    for (int h = 0; h < H; h++) {
        float *uk_h = ukt + (size_t)h * r * dn, *uv_h = uv + (size_t)h * dv * r;
        for (int i = 0; i < dn; i++) { /* W_UK_h row i → column i of W_UK_hᵀ */
            kiln_weight_row_f32(&L->wkv_b, (int64_t)h * (dn + dv) + i, row);
            for (int j = 0; j < r; j++) uk_h[(size_t)j * dn + i] = row[j];
        }
        for (int i = 0; i < dv; i++) kiln_weight_row_f32(&L->wkv_b, (int64_t)h * (dn + dv) + dn + i, uv_h + (size_t)i * r);
        L->ukt[h] = (kiln_weight){.fmt = KILN_WF_F32, .rows = r, .cols = dn, .data = (const uint8_t *)uk_h, .row_bytes = (size_t)dn * sizeof(float)};
        L->uv[h] = (kiln_weight){.fmt = KILN_WF_F32, .rows = dv, .cols = r, .data = (const uint8_t *)uv_h, .row_bytes = (size_t)r * sizeof(float)};
    }
    free(row);
    return KILN_OK;
}

kiln_status kiln_mla_forward(const kiln_backend *be, const kiln_mla_cfg *c, const kiln_mla_layer *L, const kiln_rope *rope, kiln_kv_pool *pool,
                             int layer, kiln_kv_seq *const *seq, const int *pos, const float *X, int n, const float *cs, float *Y,
                             kiln_mla_ws *ws) {
    const int H = c->n_heads, r = c->kv_lora_rank, dn = c->qk_nope, dr = c->qk_rope, dv = c->v_head;
    const int qh = dn + dr, row = kiln_mla_row(c), krow = r + dr; /* cached row; latent projection row */
    if (n < 1 || n > ws->max_tokens) return kiln_fail(KILN_ERR_INTERNAL, "mla: batch of %d tokens (max %d)", n, ws->max_tokens);
    if (c->dsa && !L->idx_full && layer == 0) return kiln_fail(KILN_ERR_INTERNAL, "mla: layer 0 reuses an indexer selection that does not exist");
    if (pool->cfg.n_kv_heads != 1 || pool->cfg.k_dim != row || pool->cfg.v_dim < r)
        return kiln_fail(KILN_ERR_INTERNAL, "mla: KV pool rows are %d heads × %d (K) / %d (V) values; the latent needs 1 × %d with V >= %d",
                         pool->cfg.n_kv_heads, pool->cfg.k_dim, pool->cfg.v_dim, row, r);
    if (c->dsa && (pool->cfg.dsa_latent != r || pool->cfg.dsa_rope != dr || pool->cfg.dsa_key != c->idx_dim))
        return kiln_fail(KILN_ERR_INTERNAL, "mla: a sparse-attention layer needs the pool's compact DSA rows (kv.h) of latent %d + rope %d + key %d, "
                         "not %d + %d + %d", r, dr, c->idx_dim, pool->cfg.dsa_latent, pool->cfg.dsa_rope, pool->cfg.dsa_key);
    /* attend returns v_dim values per head: r when the pool stores V as the first r values of the
     * latent row (v_shares_k), the whole row when V is stored as a separate copy; only the first r
     * (the c part) are used. */
    const int ostride = pool->cfg.v_dim;
    /* the query down-projection (or the full query projection without q LoRA) and the latent
     * projection read the same X: one parallel section */
    {
        const kiln_weight *w2[2] = {c->q_lora_rank > 0 ? &L->wq_a : &L->wq, &L->wkv_a};
        float *y2[2] = {c->q_lora_rank > 0 ? ws->qa : ws->q, ws->kva};
        kiln_be_matmul_many(be, w2, y2, 2, X, n);
    }
    /* queries [n, H, dn + dr] */
    if (c->q_lora_rank > 0) {
        kiln_be_rmsnorm(be, ws->qa, ws->qa, L->q_a_norm, n, c->q_lora_rank, c->lora_eps);
        kiln_be_matmul(be, &L->wq_b, ws->qa, ws->q, n);
    }
    /* latents [n, r + dr]: RMSNorm over the c part, RoPE over the shared k_pe part (copied by the
     * backend: no host access, so no stop on a device) */
    /* DSA: the official code rounds the normed latent through FP8 (per 128, power-of-two scales)
     * before caching it: its FP8 KV cache, simulated in bf16. Row by row for a token or two; a
     * chunk's c parts are gathered into olat [n, r] (free until attention writes it) and normed and
     * rounded as n rows there — the same per-row arithmetic, 4 ops instead of 2n (on a device, 2n
     * dispatches per layer of a prefill chunk) */
    if (n <= 2) {
        for (int i = 0; i < n; i++) {
            float *lat = ws->lat + (size_t)i * row;
            kiln_be_rmsnorm(be, lat, ws->kva + (size_t)i * krow, L->kv_a_norm, 1, r, c->lora_eps);
            if (c->dsa) be->ops->fp8_round(be, lat, 1, r, 0);
        }
    } else {
        be->ops->copy_rows(be, ws->olat, r, ws->kva, krow, n, r);
        kiln_be_rmsnorm(be, ws->olat, ws->olat, L->kv_a_norm, n, r, c->lora_eps);
        if (c->dsa) be->ops->fp8_round(be, ws->olat, n, r, 0);
        be->ops->copy_rows(be, ws->lat, row, ws->olat, r, n, r);
    }
    be->ops->copy_rows(be, ws->lat + r, row, ws->kva + r, krow, n, dr);
    /* q_pe of the H heads and the one k_pe in one pass (with one head the second tensor's head
     * stride is never used) */
    kiln_be_rope2(be, rope, ws->q + dn, (int64_t)H * qh, H, ws->lat + r, row, 1, n, qh, cs);
    /* absorbed queries [n, H, r + dr]: q_abs_h = [W_UK_hᵀ q_nope_h, q_pe_h] */
    be->ops->matmul_heads(be, L->ukt, H, n, ws->q, (int64_t)H * qh, qh, ws->qabs, (int64_t)H * krow, krow, ws->gin, ws->gout);
    be->ops->copy_rows(be, ws->qabs + r, krow, ws->q + dn, qh, n * H, dr); /* (token, head) rows: uniform strides */
    if (c->dsa && L->idx_full) { /* the indexer's key of each token goes into its cached row; its query and head weights */
        const int Hi = c->idx_heads, d = c->idx_dim;
        { /* keys ki [n, d] and head weights [n, Hi] read the same X: one parallel section */
            const kiln_weight *w2[2] = {&L->iwk, &L->iw_proj};
            float *y2[2] = {ws->ki, ws->iw};
            kiln_be_matmul_many(be, w2, y2, 2, X, n);
        }
        kiln_be_matmul(be, &L->iwq_b, ws->qa, ws->qi, n);
        be->ops->layernorm(be, ws->ki, ws->ki, L->ik_norm_w, L->ik_norm_b, n, d, c->idx_norm_eps);
        kiln_be_rope2(be, &c->idx_rope, ws->qi, (int64_t)Hi * d, Hi, ws->ki, d, 1, n, d, cs);
        be->ops->fp8_round(be, ws->qi, n * Hi, d, 1);
        be->ops->fp8_round(be, ws->ki, n, d, 1);
        be->ops->copy_rows(be, ws->lat + krow, row, ws->ki, d, n, d);
    } else if (c->dsa && kiln_kv_dsa_has_key(&pool->cfg, layer)) {
        /* a "shared" layer caches no indexer key: zeros, not the scratch's last contents (a pool
         * that gives such layers no key field drops them anyway: no wait for the device here) */
        kiln_be_wait(be);
        for (int i = 0; i < n; i++) memset(ws->lat + (size_t)i * row + krow, 0, (size_t)c->idx_dim * sizeof(float));
    }
    /* store every token's latent, then attend (token i sees positions [0, pos[i]] of its sequence) */
    be->ops->kv_store(be, pool, seq, pos, n, layer, ws->lat, row, pool->cfg.v_shares_k ? NULL : ws->lat, row);
    if (c->dsa) {
        if (L->idx_full) /* w · Hi^-1/2 · d^-1/2: weights_proj's scale and the indexer's softmax scale */
            be->ops->kv_index_topk(be, pool, layer, n, seq, pos, ws->qi, c->idx_heads, c->idx_dim, krow, ws->iw,
                                   1.0f / sqrtf((float)c->idx_heads) / sqrtf((float)c->idx_dim), c->idx_topk, ws->sel, ws->nsel);
        be->ops->kv_attend_sparse(be, pool, layer, n, seq, pos, ws->sel, ws->nsel, c->idx_topk, ws->qabs, H, krow, c->scale, !L->idx_full,
                                  ws->olat);
    } else {
        be->ops->kv_attend(be, pool, layer, n, seq, pos, ws->qabs, H, c->scale, ws->olat);
    }
    /* o_h = W_UV_h o_lat_h → ov [n, H, dv] */
    be->ops->matmul_heads(be, L->uv, H, n, ws->olat, (int64_t)H * ostride, ostride, ws->ov, (int64_t)H * dv, dv, ws->gin, ws->gout);
    kiln_be_matmul(be, &L->wo, ws->ov, Y, n);
    return KILN_OK;
}
