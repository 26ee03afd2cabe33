/* mla.h — Multi-head Latent Attention (DeepSeek-V3, Kimi K2, GLM-4.7-Flash) over the paged KV pool.
 *
 * Shapes (H heads, r = kv_lora_rank, dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim):
 *   q      = q_b_proj(rmsnorm(q_a_proj x))  or  q_proj x                 [H, dn + dr]
 *   ckv    = kv_a_proj_with_mqa x = [c (r), k_pe (dr)]                    [r + dr]
 *   latent = [rmsnorm(c) (r), rope(k_pe) (dr)]  ← the only thing cached  [r + dr] per token per layer
 *   kv_b_proj [H·(dn + dv), r] holds per head W_UK [dn, r] then W_UV [dv, r].
 * Attention uses the weight-absorption form for prefill and decode alike:
 *   q_abs_h = [W_UK_hᵀ q_nope_h (r), rope(q_pe_h) (dr)]                   [r + dr]
 *   score   = q_abs_h · latent_t · scale,  one KV "head" shared by all H query heads (MQA over the latent)
 *   o_lat_h = Σ softmax · c_t                                           [r]
 *   o_h     = W_UV_h o_lat_h                                            [dv];  out = o_proj([o_h])
 * which equals the expanded form k_h = [W_UK_h c, k_pe], v_h = W_UV_h c of the official code.
 * scale = 1/sqrt(dn + dr) × yarn_get_mscale(factor, mscale_all_dim)².
 * The KV pool holds one row of r + dr values per token per layer (n_kv_heads 1, head_dim r + dr).
 * W_UK_hᵀ and W_UV_h are float32 copies made at bind time from kv_b_proj (any storage format).
 *
 * DeepSeek sparse attention (DSA: deepseek_v32, glm_moe_dsa; docs/DSA.md), as DeepSeek-V3.2's
 * official inference code (inference/model.py, kernel.py) defines it:
 *   c      ← FP8 round trip of rmsnorm(c) per 128 values (power-of-two scales, act_quant ue8m0)
 *   the lightning indexer (Hi heads of d values, d = index_head_dim):
 *     qi   = indexer.wq_b(qr)                 [Hi, d], qr = q_a_layernorm(q_a_proj x)
 *     ki   = indexer.k_norm(indexer.wk x)     [d]   (LayerNorm with bias, eps 1e-6)
 *     RoPE over the first qk_rope values of each (NEOX pairs for deepseek_v32, adjacent pairs
 *     when indexer_rope_interleave), then the Hadamard rotation H/sqrt(d) and the FP8 round trip
 *     of qi and ki (one power-of-two scale per 128 values)
 *     w    = indexer.weights_proj x · Hi^-1/2 · d^-1/2     [Hi]
 *     score_t = Σ_h w_h · relu(qi_h · ki_t) over the positions t <= pos; the top index_topk
 *   attention of every head over the selected positions only (the absorbed form above).
 * The cached row grows to [c (r) | k_pe (dr) | ki (d)]: one pool, one block table, one seal per
 * page slice for both (kv/kv_sparse.c). Layers whose indexer_types entry is "shared" (GLM-5.2)
 * have no indexer and reuse the selection of the last "full" layer before them. */
#ifndef KILN_MODEL_MLA_H
#define KILN_MODEL_MLA_H
#include "backend/backend.h"

typedef struct kiln_mla_cfg {
    int dim, n_heads, q_lora_rank /* 0 = q_proj */, kv_lora_rank, qk_nope, qk_rope, v_head;
    float scale;       /* softmax scale */
    float lora_eps;    /* eps of q_a_layernorm / kv_a_layernorm (the official code uses the RMSNorm default 1e-6) */
    /* DSA (dsa = 1): indexer heads, head size, top-k, k_norm eps, and its RoPE (the model's
     * frequencies with the indexer's own pair layout) */
    int dsa, idx_heads, idx_dim, idx_topk;
    float idx_norm_eps;
    kiln_rope idx_rope;
} kiln_mla_cfg;

/* Values per cached row: r + dr, and the indexer key after them under DSA. */
static inline int kiln_mla_row(const kiln_mla_cfg *c) { return c->kv_lora_rank + c->qk_rope + (c->dsa ? c->idx_dim : 0); }

typedef struct kiln_mla_layer {
    kiln_weight wq_a, wq_b;     /* [q_lora, dim], [H·(dn+dr), q_lora] (q_lora_rank > 0) */
    const float *q_a_norm;      /* [q_lora] */
    kiln_weight wq;             /* [H·(dn+dr), dim] (q_lora_rank == 0) */
    kiln_weight wkv_a;          /* [r + dr, dim] */
    const float *kv_a_norm;     /* [r] */
    kiln_weight wkv_b;          /* [H·(dn+dv), r] as stored */
    kiln_weight *ukt;           /* [H] float32 views [r, dn]: W_UK_hᵀ */
    kiln_weight *uv;            /* [H] float32 views [dv, r]: W_UV_h */
    kiln_weight wo;             /* [dim, H·dv] */
    /* DSA: idx_full = this layer runs its own indexer (else it reuses the previous selection) */
    int idx_full;
    kiln_weight iwq_b;          /* [Hi·d, q_lora] */
    kiln_weight iwk;            /* [d, dim] */
    kiln_weight iw_proj;        /* [Hi, dim] */
    const float *ik_norm_w, *ik_norm_b; /* [d] */
} kiln_mla_layer;

typedef struct kiln_mla_ws {
    int max_tokens;
    float *qa, *q, *kva, *lat, *qabs, *olat, *ov, *gin, *gout;
    float *qi, *iw, *ki;        /* DSA: indexer queries [T, Hi·d], head weights [T, Hi], keys [T, d] */
    int32_t *sel;               /* DSA: selected positions [T, topk] (kept for the "shared" layers after) */
    int *nsel;                  /* [T] */
} kiln_mla_ws;

/* Scratch for up to max_tokens tokens; the float buffers come from the backend. */
kiln_status kiln_mla_ws_init(kiln_mla_ws *ws, const kiln_backend *be, const kiln_mla_cfg *c, int max_tokens);
void kiln_mla_ws_free(kiln_mla_ws *ws, const kiln_backend *be);

/* Builds L->ukt / L->uv from L->wkv_b. Buffers are registered with the model (freed with it). */
kiln_status kiln_mla_absorb(struct kiln_model *m, const kiln_mla_cfg *c, kiln_mla_layer *L);

/* Y[n, dim] = MLA(X[n, dim]) for tokens at (seq[i], pos[i]); writes each token's latent to the pool
 * (layer `layer`) before attending, so tokens of one sequence must be in increasing position order.
 * cs: [n, qk_rope] rope cos/sin per token (kiln_rope_table). Computed through the backend be. */
kiln_status kiln_mla_forward(const kiln_backend *be, const kiln_mla_cfg *c, const kiln_mla_layer *L, const kiln_rope *rope, kiln_kv_pool *pool,
                             int layer, kiln_kv_seq *const *seq, const int *pos, const float *X, int n, const float *cs, float *Y,
                             kiln_mla_ws *ws);
#endif
