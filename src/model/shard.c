/* shard.c — tensor parallelism by transforming a loaded model into one rank's shard (docs/SCALE.md).
 *
 * Megatron's split of a dense block over T ranks: rank r keeps query heads [r·H/T, (r+1)·H/T) and
 * the KV heads they read [r·KV/T, (r+1)·KV/T) (GQA groups stay whole on one rank; with more ranks
 * than KV heads, T a multiple of KV, rank r keeps KV head r / (T/KV), replicated on the T/KV ranks
 * whose query heads read it), the FFN rows
 * [r·F/T, (r+1)·F/T); Q/K/V, gate and up are split by output rows (column-parallel: views of the
 * mapped rows, or copies of the rows a fused weight interleaves), o_proj and down by input columns
 * (row-parallel: each row's slice copied). The shard's hyper-parameters become H/T, KV/T, F/T, so the
 * KV pool, the scratch and the one forward pass size themselves for the shard unchanged; the
 * forward pass sums the row-parallel partial outputs over the ranks with the all-reduce the caller
 * sets (kiln_model_set_allreduce), once after attention and once after the MLP of every block.
 * Embedding, norms and the LM head stay whole on every rank (every rank then holds the same hidden
 * state and logits; the vocabulary-parallel head is for a later stage).
 *
 * MLA (DeepSeek-V3, Kimi K2, GLM-4.7-Flash, and the sparse-attention GLM-5.x / DeepSeek-V3.2):
 * rank r keeps query heads [r·H/T, (r+1)·H/T): q_b_proj (or q_proj) rows and the absorbed per-head
 * W_UKᵀ / W_UV of those heads, o_proj's columns of their values. The low-rank projections q_a /
 * kv_a, their norms and the indexer are computed whole on every rank, so every rank holds the whole
 * latent cache: replicated, not split. Why: the latent is one 576-value row per token shared by every
 * head (MQA), a split by heads has nothing to split, and a split by positions needs a second
 * all-reduce of the softmax statistics per layer; replication costs KV memory (each rank holds all
 * of it: capacity in tokens does not grow with T) and no communication. MoE layers: every routed and
 * shared expert's intermediate width is split like a dense MLP (gate/up rows, down columns), the
 * router whole on every rank (every rank routes every token identically), one all-reduce after the
 * block as for a dense MLP.
 *
 * Expert parallelism (ep = T, the experts spread over the same ranks as the heads): rank r keeps
 * the routed experts [r·E/T, (r+1)·E/T) whole and runs only the (token, expert) pairs routed to them
 * (model/moe.c); shared experts and dense MLPs stay tensor-parallel. The router still runs whole on
 * every rank, and attention leaves every rank holding every token's hidden state, so no dispatch
 * all-to-all is needed: each rank already has the inputs of its pairs, and its partial output joins
 * the block's one all-reduce (the combine). Why not MPI_Alltoallv: it moves tokens between ranks
 * that each hold only their own, i.e. data-parallel attention, which kiln does not have; with
 * tensor-parallel attention an all-to-all would send top-k copies of every token (8× the
 * all-reduce's bytes for DeepSeek-V3's k = 8) to ranks that have them. Whole experts also need no
 * column cuts, so FP8 / INT4 / K-quant experts shard under ep.
 *
 * Limits of this stage, each refused with a message naming it: T not dividing
 * H, KV (unless KV divides T) or F, weights tiled for the CPU kernels (shard before the
 * first session), column slices of FP8 / INT4 / K-quant weights and of Q8_0 / Q4_0 slices not on a
 * 32-column block boundary. */
#include "model/model.h"
#include "model/arch.h"
#include "base/status.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Bytes from the start of a row to column c of w's format; -1 when c is not on a boundary the
 * format can be cut at (or the format cannot be cut by columns). */
static int64_t col_offset(const kiln_weight *w, int64_t c) {
    switch (w->fmt) {
    case KILN_WF_F32: return c * 4;
    case KILN_WF_F16: case KILN_WF_BF16: return c * 2;
    case KILN_WF_Q8_0: return c % 32 ? -1 : c / 32 * 34;
    case KILN_WF_Q4_0: return c % 32 ? -1 : c / 32 * 18;
    default: return -1;
    }
}

static kiln_status check_plain(const kiln_weight *w, const char *name, int l) {
    if (w->tiled) return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp: layer %d %s is tiled for the CPU kernels: shard the model before its first session", l, name);
    return KILN_OK;
}

/* Rows [r0, r0 + n) of w as a view (column-parallel). FP8 block scales are shared by 128-row blocks:
 * the view must start on one. */
static kiln_status slice_rows(kiln_weight *w, int64_t r0, int64_t n, const char *name, int l) {
    KILN_TRY(check_plain(w, name, l));
    if (w->fmt == KILN_WF_FP8_BLOCK || w->fmt == KILN_WF_INT4_GROUP)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp: layer %d %s is %s: this stage shards F32 / F16 / BF16 / Q8_0 / Q4_0 weights", l, name,
                         kiln_wformat_name(w->fmt));
    w->data += (size_t)r0 * w->row_bytes;
    w->rows = n;
    return KILN_OK;
}

/* The rows of `parts` ranges [start, start + n) of w, copied in that order into an owned buffer. */
static kiln_status gather_rows(struct kiln_model *m, kiln_weight *w, const int64_t *start, const int64_t *n, int parts, const char *name, int l) {
    KILN_TRY(check_plain(w, name, l));
    if (w->fmt == KILN_WF_FP8_BLOCK || w->fmt == KILN_WF_INT4_GROUP)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp: layer %d %s is %s: this stage shards F32 / F16 / BF16 / Q8_0 / Q4_0 weights", l, name,
                         kiln_wformat_name(w->fmt));
    int64_t total = 0;
    for (int i = 0; i < parts; i++) total += n[i];
    uint8_t *d = kiln_model_own(m, malloc((size_t)total * w->row_bytes + 64));
    if (!d) return kiln_fail_oom(m->path, name, (unsigned long long)total * w->row_bytes);
    size_t o = 0;
    for (int i = 0; i < parts; i++) {
        memcpy(d + o, w->data + (size_t)start[i] * w->row_bytes, (size_t)n[i] * w->row_bytes);
        o += (size_t)n[i] * w->row_bytes;
    }
    w->data = d;
    w->rows = total;
    return KILN_OK;
}

/* Columns [c0, c0 + n) of every row, copied (row-parallel). */
static kiln_status slice_cols(struct kiln_model *m, kiln_weight *w, int64_t c0, int64_t n, const char *name, int l) {
    KILN_TRY(check_plain(w, name, l));
    const int64_t b0 = col_offset(w, c0), b1 = col_offset(w, c0 + n);
    if (b0 < 0 || b1 < 0)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp: layer %d %s (%s) cannot be cut at columns %lld..%lld: this stage cuts F32 / F16 / BF16 anywhere, "
                         "Q8_0 / Q4_0 on 32-column blocks", l, name, kiln_wformat_name(w->fmt), (long long)c0, (long long)(c0 + n));
    const size_t rb = (size_t)(b1 - b0);
    uint8_t *d = kiln_model_own(m, malloc((size_t)w->rows * rb + 64));
    if (!d) return kiln_fail_oom(m->path, name, (unsigned long long)w->rows * rb);
    for (int64_t r = 0; r < w->rows; r++) memcpy(d + (size_t)r * rb, w->data + (size_t)r * w->row_bytes + (size_t)b0, rb);
    w->data = d;
    w->cols = n;
    w->row_bytes = rb;
    return KILN_OK;
}

/* Heads [h0, h0 + hn) of an MLA layer (see the top of the file). */
static kiln_status shard_mla(struct kiln_model *m, const kiln_mla_cfg *c, kiln_mla_layer *A, int h0, int hn, int l) {
    const int64_t qh = c->qk_nope + c->qk_rope;
    if (c->q_lora_rank > 0) KILN_TRY(slice_rows(&A->wq_b, h0 * qh, hn * qh, "q_b_proj", l));
    else KILN_TRY(slice_rows(&A->wq, h0 * qh, hn * qh, "q_proj", l));
    if (A->ukt) A->ukt += h0; /* the absorbed per-head views (float32 copies made at bind; an MTP layer's are */
    if (A->uv) A->uv += h0;   /* made at its first use, from the kv_b_proj rows cut here) */
    KILN_TRY(slice_rows(&A->wkv_b, h0 * (int64_t)(c->qk_nope + c->v_head), hn * (int64_t)(c->qk_nope + c->v_head), "kv_b_proj", l));
    return slice_cols(m, &A->wo, (int64_t)h0 * c->v_head, (int64_t)hn * c->v_head, "o_proj", l);
}

/* Intermediate columns [f0, f0 + fn) of one SwiGLU expert (gate/up rows, down columns). */
static kiln_status shard_swiglu(struct kiln_model *m, kiln_weight *g, kiln_weight *u, kiln_weight *d, int64_t f0, int64_t fn, const char *what, int l) {
    KILN_TRY(slice_rows(g, f0, fn, what, l));
    KILN_TRY(slice_rows(u, f0, fn, what, l));
    return slice_cols(m, d, f0, fn, what, l);
}

/* What kiln_model_shard cuts every layer to (the same for decoder and MTP layers). */
typedef struct {
    int mla, rank, tp, ep, H, KV, hd;
    int64_t q0, qn, k0, kn, f0, fn, F;
} shard_plan;

/* One transformer block (attention + MLP / MoE) cut to this rank's heads and widths. */
static kiln_status shard_layer(struct kiln_model *m, kiln_arch_model *am, const shard_plan *sp, kiln_arch_layer *L, int l) {
    const kiln_moe_cfg *mc = &am->hp.moe;
    if (sp->mla) {
        KILN_TRY(shard_mla(m, &am->hp.mla, &L->mla, sp->rank * (sp->H / sp->tp), sp->H / sp->tp, l));
    } else if (am->hp.qkv_fused) {
        const int64_t st[3] = {sp->q0, (int64_t)sp->H * sp->hd + sp->k0, (int64_t)sp->H * sp->hd + (int64_t)sp->KV * sp->hd + sp->k0}, n[3] = {sp->qn, sp->kn, sp->kn};
        KILN_TRY(gather_rows(m, &L->wqkv, st, n, 3, "qkv", l));
    } else {
        KILN_TRY(slice_rows(&L->wq, sp->q0, sp->qn, "q_proj", l));
        KILN_TRY(slice_rows(&L->wk, sp->k0, sp->kn, "k_proj", l));
        KILN_TRY(slice_rows(&L->wv, sp->k0, sp->kn, "v_proj", l));
    }
    if (!sp->mla) {
        if (L->bq) L->bq += sp->q0;
        if (L->bk) L->bk += sp->k0;
        if (L->bv) L->bv += sp->k0;
        KILN_TRY(slice_cols(m, &L->wo, sp->q0, sp->qn, "o_proj", l));
    }
    if (L->is_moe) {
        const int E = mc->n_experts;
        const int64_t e0 = (int64_t)sp->rank * (mc->ffn / sp->tp), en = mc->ffn / sp->tp;
        if (sp->ep == 1) /* (ep: the experts stay whole; moe.c runs this rank's) */
            for (int e = 0; e < E; e++) KILN_TRY(shard_swiglu(m, &L->exp_w[e], &L->exp_w[E + e], &L->exp_w[2 * E + e], e0, en, "expert", l));
        if (mc->shared_ffn > 0) {
            const int64_t s0 = (int64_t)sp->rank * (mc->shared_ffn / sp->tp), sn = mc->shared_ffn / sp->tp;
            KILN_TRY(shard_swiglu(m, &L->moe.sh_gate, &L->moe.sh_up, &L->moe.sh_down, s0, sn, "shared expert", l));
        }
    } else if (am->hp.ffn_fused) {
        const int64_t st[2] = {sp->f0, (int64_t)sp->F + sp->f0}, n[2] = {sp->fn, sp->fn};
        KILN_TRY(gather_rows(m, &L->w_gate_up, st, n, 2, "gate_up_proj", l));
    } else {
        KILN_TRY(slice_rows(&L->w_gate, sp->f0, sp->fn, "gate_proj", l));
        KILN_TRY(slice_rows(&L->w_up, sp->f0, sp->fn, "up_proj", l));
    }
    if (!L->is_moe) KILN_TRY(slice_cols(m, &L->w_down, sp->f0, sp->fn, "down_proj", l));
    return KILN_OK;
}

kiln_status kiln_model_shard(kiln_model *m, int rank, int tp, int ep) {
    if (tp < 1 || rank < 0 || rank >= tp) return kiln_fail(KILN_ERR_INVALID_ARG, "--tp %d: rank %d is out of range", tp, rank);
    if (ep != 1 && ep != tp) return kiln_fail(KILN_ERR_INVALID_ARG, "--ep %d with --tp %d: expert parallelism spreads the experts over the same ranks (--ep 1 or --ep %d)", ep, tp, tp);
    if (tp == 1) return KILN_OK;
    kiln_hparams *hp = &m->hp;
    kiln_arch_model *am = m->arch_state;
    if (!am) return kiln_fail(KILN_ERR_INTERNAL, "--tp: the model is not bound");
    if (m->repacked) return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp: shard the model before its first session (its weights are already repacked)");
    const int mla = am->hp.attn == KILN_ATTN_MLA;
    const int H = hp->n_heads, KV = mla ? tp : hp->n_kv_heads, F = hp->ffn_dim, hd = hp->head_dim; /* MLA: the latent is replicated */
    kiln_moe_cfg *mc = &am->hp.moe;
    if (ep > 1 && am->hp.n_moe_layers == 0) return kiln_fail(KILN_ERR_INVALID_ARG, "--ep %d: the model has no MoE layers", ep);
    if (ep > 1 && mc->n_experts % ep)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--ep %d: the %d routed experts are not a multiple of it", ep, mc->n_experts);
    if (am->hp.n_moe_layers > 0 && ((ep == 1 && mc->ffn % tp) || mc->shared_ffn % tp))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp %d: the experts' width %d (shared %d) is not a multiple of it", tp, mc->ffn, mc->shared_ffn);
    /* GQA with more ranks than KV heads: each KV head is replicated on the tp / KV ranks whose query
     * heads read it (every rank's query heads stay inside one KV group) */
    const int kv_rep = !mla && KV < tp && tp % KV == 0 ? tp / KV : 1;
    if (H % tp || (kv_rep == 1 && KV % tp))
        return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp %d: %d query heads must be a multiple of it, and %d KV heads a multiple of it or a divisor of it",
                         tp, H, KV);
    if (F % tp) return kiln_fail(KILN_ERR_UNSUPPORTED, "--tp %d: the FFN width %d is not a multiple of it", tp, F);
    const int64_t q0 = (int64_t)rank * (H / tp) * hd, qn = (int64_t)(H / tp) * hd;
    const int64_t k0 = kv_rep > 1 ? (int64_t)(rank / kv_rep) * hd : (int64_t)rank * (KV / tp) * hd, kn = kv_rep > 1 ? hd : (int64_t)(KV / tp) * hd;
    const int64_t f0 = (int64_t)rank * (F / tp), fn = F / tp;
    const shard_plan sp = {mla, rank, tp, ep, H, KV, hd, q0, qn, k0, kn, f0, fn, F};
    for (int l = 0; l < hp->n_layers; l++) KILN_TRY(shard_layer(m, am, &sp, &am->layers[l], l));
    /* MTP layers (speculative decoding): sharded like the decoder layers, since their block runs the
     * same forward with the same all-reduces (its eh_proj, norms, embedding and head stay whole:
     * their outputs are replicated) */
    for (int j = 0; j < am->n_mtp; j++) KILN_TRY(shard_layer(m, am, &sp, &am->mtp[j].L, hp->n_layers + j));
    hp->n_heads = H / tp;
    if (mla) am->hp.mla.n_heads = H / tp;
    else hp->n_kv_heads = kv_rep > 1 ? 1 : KV / tp;
    hp->ffn_dim = F / tp;
    if (am->hp.n_moe_layers > 0) {
        if (ep == 1) mc->ffn /= tp;
        else {
            mc->ep_size = ep;
            mc->ep_rank = rank;
        }
        mc->shared_ffn /= tp;
    }
    m->tp = tp;
    /* vocabulary-parallel head: rank r computes logit columns [r·V/T, (r+1)·V/T) (a view of those
     * rows of the head; the tied embedding keeps its own whole view for lookups), rank 0 gathers
     * them. Where the head's format cannot be cut by rows every rank keeps it whole. Why only the
     * head: it is read whole for every sampled token (131 MB for a 32000 × 2048 BF16 head, 2.3 GB for
     * Kimi K2's), while an embedding row is read only for the tokens looked up — the other rows are
     * never resident (see below), so a vocabulary-parallel embedding would add an all-reduce per
     * step and save nothing. */
    {
        const int64_t V = m->output.rows, v0 = V * rank / tp, v1 = V * (rank + 1) / tp;
        kiln_weight head = m->output;
        if (V >= tp && slice_rows(&head, v0, v1 - v0, "lm_head", -1) == KILN_OK) {
            m->output = head;
            m->vocab_split = 1;
        } else kiln_clear_error();
    }
    /* Loading read every byte of the checkpoint (the weight checksums), so all of it is resident in
     * this process. Drop the mapped pages: what this rank computes with faults back in from the
     * page cache on first use, the other ranks' slices never do, so the rank's resident memory is
     * its shard (+ the whole embedding / head and its copied slices). Best effort. */
    for (int i = 0; i < m->n_maps; i++)
        if (m->maps[i].base && m->maps[i].size) (void)madvise((void *)m->maps[i].base, m->maps[i].size, MADV_DONTNEED);
    return KILN_OK;
}

void kiln_model_set_allreduce(kiln_model *m, void (*fn)(void *ctx, float *x, int64_t n), void *ctx) {
    m->allreduce = fn;
    m->allreduce_ctx = ctx;
}

void kiln_model_set_logits_gather(kiln_model *m, void (*fn)(void *ctx, const float *part, int rows, int64_t vocab, float *out), void *ctx) {
    m->gather = fn;
    m->gather_ctx = ctx;
}
