/* mtp.c — drafting with the model's own multi-token-prediction layer (issue 25; docs/SPECULATIVE.md).
 *
 * The target's forward passes leave their last-layer hidden states h_j (before the final norm) in a
 * buffer by position. MTP layer 0 runs on the pairs (h_j, t_{j+1}) at position j, as vLLM's and
 * SGLang's MTP proposers do: its logits after the last pair (j = L - 1, with t_L = `next`, the
 * token chosen after the target's last position) predict t_{L+1}; for k > 1 the layer is chained on
 * its own output hidden state and the drafted token at positions L, L + 1 … (vLLM reuses the one MTP
 * layer the same way). Drafts are the argmax of each step's logits: the draft distribution is
 * one-hot, so kiln_sample_verify's rule keeps the output distribution exactly the target's.
 *
 * The MTP layer attends over its own KV: one layer with the target's row layout, BF16 or F32, no
 * integrity seals (a damaged draft only costs acceptance, since every draft is verified by the
 * target). Its sequence holds the positions whose pair used a real target hidden state; the chained
 * positions are rolled back after each draft. Two ways to hold it:
 *   - own pool (kiln_mtp_create: `kiln run`, one sequence): a small pool of its own;
 *   - the target's pages (kiln_mtp_create_paged: the server): a one-layer "draft pool" with exactly
 *     the target pool's pages, addressed through the target sequence's own block table, so target
 *     page p holds the MTP layer's rows of the same positions in draft page p. The MTP KV then
 *     travels with the target's pages: a page offered to the prefix cache carries the drafter's rows
 *     of its positions, and a later MTP request that shares the page shares them (as SGLang keeps the
 *     draft layer's KV in the radix cache's pages; engine/scheduler.c decides which rows are whole). */
#include "engine/mtp.h"
#include "base/status.h"
#include "engine/kv_setup.h"
#include "model/arch.h"
#include <stdlib.h>
#include <string.h>

#define MTP_CHUNK 64

/* The MTP layer's KV layout: the target's rows (GQA heads, or MLA's latent row with its indexer key),
 * one layer, BF16 (F32 when the target's KV is F32). */
static void draft_kv_config(const kiln_kv_config *target_kv, kiln_kv_config *c) {
    memset(c, 0, sizeof *c);
    c->n_layers = 1;
    c->n_kv_heads = target_kv->n_kv_heads;
    c->head_dim = target_kv->head_dim;
    c->k_dim = target_kv->k_dim;
    c->v_dim = target_kv->v_dim;
    c->v_shares_k = target_kv->v_shares_k;
    c->dsa_latent = target_kv->dsa_latent; /* DSA: the same compact rows */
    c->dsa_rope = target_kv->dsa_rope;
    c->dsa_key = target_kv->dsa_key; /* the MTP layer has its own indexer: every (one) layer keyed */
    c->page_tokens = target_kv->page_tokens;
    c->dtype = target_kv->dtype == KILN_KV_F32 ? KILN_KV_F32 : KILN_KV_BF16;
    c->rope_theta = target_kv->rope_theta;
    c->rope_norm = target_kv->rope_norm;
}

static kiln_status draft_pool_create(const kiln_backend *be, const kiln_kv_config *target_kv, int64_t pages, kiln_kv_pool **out) {
    kiln_kv_config c;
    draft_kv_config(target_kv, &c);
    c.mem_bytes = (int64_t)kiln_kv_pool_fixed_bytes(&c) + pages * (int64_t)kiln_kv_page_cost(&c);
    kiln_be_kv_arrays(be, &c);
    return kiln_kv_pool_create(&c, out);
}

kiln_status kiln_mtp_pool_create(const kiln_backend *be, const kiln_kv_pool *target, kiln_kv_pool **out) {
    *out = NULL;
    KILN_TRY(draft_pool_create(be, &target->cfg, target->n_pages, out));
    if ((*out)->n_pages < target->n_pages) {
        const int got = (*out)->n_pages;
        kiln_kv_pool_free(*out);
        *out = NULL;
        return kiln_fail(KILN_ERR_INTERNAL, "mtp: a draft pool of %d pages for a target pool of %d", got, target->n_pages);
    }
    return KILN_OK;
}

/* The drafter's buffers; its pool is set by the caller. */
static kiln_status drafter_new(struct kiln_model *m, const kiln_backend *be, int n_ctx, kiln_mtp **out) {
    *out = NULL;
    KILN_TRY(kiln_model_mtp_prepare(m));
    kiln_mtp *d = calloc(1, sizeof *d);
    if (!d) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    d->m = m;
    d->n_ctx = n_ctx;
    d->dim = m->hp.dim;
    kiln_status st = kiln_forward_ws_init(&d->ws, m, be, MTP_CHUNK, n_ctx + MTP_CHUNK);
    d->hid_cap = MTP_CHUNK;
    d->hid = malloc((size_t)d->hid_cap * (size_t)d->dim * sizeof *d->hid);
    d->tok = malloc((size_t)(n_ctx + 1) * sizeof *d->tok);
    d->h_chain = malloc((size_t)d->dim * sizeof *d->h_chain);
    d->hout = malloc((size_t)MTP_CHUNK * (size_t)d->dim * sizeof *d->hout);
    d->logits = malloc((size_t)m->hp.vocab * sizeof *d->logits);
    if (st == KILN_OK && (!d->hid || !d->tok || !d->h_chain || !d->hout || !d->logits)) st = kiln_fail(KILN_ERR_NOMEM, "out of memory for the MTP drafter");
    if (st != KILN_OK) {
        kiln_mtp_free(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

kiln_status kiln_mtp_create(struct kiln_model *m, const kiln_backend *be, const kiln_kv_config *target_kv, int n_ctx, kiln_mtp **out) {
    kiln_mtp *d;
    KILN_TRY(drafter_new(m, be, n_ctx, &d));
    const int64_t pages = (n_ctx + MTP_CHUNK + 2 * target_kv->page_tokens) / target_kv->page_tokens;
    kiln_status st = draft_pool_create(be, target_kv, pages, &d->pool);
    if (st != KILN_OK) {
        kiln_mtp_free(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

kiln_status kiln_mtp_create_paged(struct kiln_model *m, const kiln_backend *be, kiln_kv_pool *draft_pool, kiln_kv_pool *target_pool,
                                  kiln_kv_seq *target_seq, int n_ctx, kiln_mtp **out) {
    kiln_mtp *d;
    KILN_TRY(drafter_new(m, be, n_ctx, &d));
    d->pool = draft_pool;
    d->tpool = target_pool;
    d->tseq = target_seq;
    *out = d;
    return KILN_OK;
}

void kiln_mtp_free(kiln_mtp *d) {
    if (!d) return;
    if (!d->tseq) { /* its own pool; a paged drafter's pages are the target sequence's */
        if (d->pool) kiln_kv_seq_release(d->pool, &d->seq);
        free(d->seq.pages);
        kiln_kv_pool_free(d->pool);
    }
    if (d->ws.be) kiln_forward_ws_free(&d->ws);
    free(d->hid);
    free(d->tok);
    free(d->h_chain);
    free(d->hout);
    free(d->logits);
    free(d);
}

float *kiln_mtp_hidden_rows(kiln_mtp *d, const int32_t *tokens, int pos, int n) {
    /* the MTP layer redoes every position from `pos` on; it still needs the rows of [seq.len, pos) */
    if (d->seq.len > pos) d->seq.len = pos;
    const int lo = d->seq.len;
    int have_end = d->hid_pos + d->hid_n;
    if (have_end > pos) have_end = pos;
    if (pos > lo && (lo < d->hid_pos || have_end < pos)) d->broken = 1; /* a row it needs was never captured: no more drafts */
    int keep = pos > lo ? have_end - lo : 0; /* pos == lo (re-evaluating from where the layer stands, e.g. after a rewind past
                                                 the rows it kept): nothing from before is needed */
    if (keep < 0) keep = 0;
    if (keep > 0 && lo > d->hid_pos) memmove(d->hid, d->hid + (size_t)(lo - d->hid_pos) * d->dim, (size_t)keep * d->dim * sizeof *d->hid);
    d->hid_pos = lo;
    if (keep + n > d->hid_cap) {
        int cap = d->hid_cap;
        while (cap < keep + n) cap *= 2;
        float *h = realloc(d->hid, (size_t)cap * (size_t)d->dim * sizeof *h);
        if (!h) return NULL;
        d->hid = h;
        d->hid_cap = cap;
    }
    d->hid_n = keep + n;
    if (pos + n <= d->n_ctx) memcpy(d->tok + pos, tokens, (size_t)n * sizeof *tokens);
    return d->hid + (size_t)keep * d->dim;
}

void kiln_mtp_truncate(kiln_mtp *d, int n) {
    if (n == 0) d->broken = 0; /* a fresh sequence needs no earlier row */
    if (d->seq.len > n) d->seq.len = n;
    if (d->hid_pos + d->hid_n > n) d->hid_n = n > d->hid_pos ? n - d->hid_pos : 0;
}

void kiln_mtp_restart(kiln_mtp *d, int n) {
    d->broken = 0;
    d->seq.len = n;
    d->hid_pos = n;
    d->hid_n = 0;
}

/* One MTP step over n pairs at positions pos0.. (tokens toks, hidden rows h): the last row's logits
 * into d->logits and its output hidden state into d->h_chain. */
static kiln_status step(kiln_mtp *d, const int32_t *toks, const float *h, int pos0, int n) {
    kiln_kv_seq *seqs[MTP_CHUNK];
    int pos[MTP_CHUNK], out_row[MTP_CHUNK];
    float *hout = d->hout;
    for (int i = 0; i < n; i++) {
        seqs[i] = &d->seq;
        pos[i] = pos0 + i;
        out_row[i] = i == n - 1 ? 0 : -1;
    }
    if (d->tseq) { /* the target's block table, reserved in the target's pool (a draft page per target page) */
        KILN_TRY(kiln_kv_seq_reserve(d->tpool, d->tseq, pos0 + n));
        d->seq.pages = d->tseq->pages;
        d->seq.n_pages = d->tseq->n_pages;
        d->seq.cap = d->tseq->cap;
    } else
        KILN_TRY(kiln_kv_seq_reserve(d->pool, &d->seq, pos0 + n));
    kiln_batch b = {n, toks, seqs, pos, out_row};
    KILN_TRY(kiln_forward_mtp(d->m, 0, d->pool, &d->ws, &b, h, hout, d->logits));
    memcpy(d->h_chain, hout + (size_t)(n - 1) * d->dim, (size_t)d->dim * sizeof *d->h_chain);
    return KILN_OK;
}

kiln_status kiln_mtp_catch_up(kiln_mtp *d, const int32_t *toks, int upto) {
    if (d->broken) return KILN_OK;
    if (upto > d->hid_pos + d->hid_n) upto = d->hid_pos + d->hid_n; /* only positions whose rows it has */
    if (upto - d->seq.len < MTP_CHUNK) return KILN_OK;
    if (d->seq.len < d->hid_pos) { d->broken = 1; return KILN_OK; } /* a row it needs was never captured */
    for (int p = d->seq.len; p < upto;) {
        const int n = upto - p < MTP_CHUNK ? upto - p : MTP_CHUNK;
        KILN_TRY(step(d, toks + p + 1, d->hid + (size_t)(p - d->hid_pos) * d->dim, p, n));
        p += n;
    }
    const int drop = d->seq.len - d->hid_pos; /* the rows of the pairs just done are not needed again */
    if (drop > 0) {
        memmove(d->hid, d->hid + (size_t)drop * d->dim, (size_t)(d->hid_n - drop) * d->dim * sizeof *d->hid);
        d->hid_pos += drop;
        d->hid_n -= drop;
    }
    return KILN_OK;
}

static int32_t argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

kiln_status kiln_mtp_draft(kiln_mtp *d, int target_len, int32_t next, int k, int32_t *drafts, int *n_drafts, float *draft_logits) {
    *n_drafts = 0;
    const int V = d->m->hp.vocab, L = target_len;
    if (k < 1 || L < 1 || d->broken) return KILN_OK;
    if (d->seq.len < d->hid_pos || d->hid_pos + d->hid_n < L)
        return kiln_fail(KILN_ERR_INTERNAL, "mtp: hidden states of positions [%d, %d) missing (have [%d, %d))", d->seq.len, L, d->hid_pos,
                         d->hid_pos + d->hid_n);
    if (L + k + 1 > d->n_ctx + MTP_CHUNK) k = d->n_ctx + MTP_CHUNK - L - 1;
    if (k < 1) return KILN_OK;
    d->tok[L < d->n_ctx ? L : d->n_ctx] = next;
    /* the pending real pairs: positions [seq.len, L), the token after each from the history (the
     * last one is `next`) */
    for (int p = d->seq.len; p < L;) {
        const int n = L - p < MTP_CHUNK ? L - p : MTP_CHUNK;
        int32_t toks[MTP_CHUNK];
        for (int i = 0; i < n; i++) toks[i] = p + i + 1 < L ? d->tok[p + i + 1] : next;
        KILN_TRY(step(d, toks, d->hid + (size_t)(p - d->hid_pos) * d->dim, p, n));
        p += n;
    }
    if (d->seq.len < L) return kiln_fail(KILN_ERR_INTERNAL, "mtp: layer at %d of %d positions", d->seq.len, L);
    int32_t t = argmax(d->logits, V);
    drafts[0] = t;
    if (draft_logits) memcpy(draft_logits, d->logits, (size_t)V * sizeof *d->logits);
    int nd = 1;
    /* chained steps on the layer's own hidden state; their KV rows are rolled back afterwards */
    for (; nd < k; nd++) {
        /* paged: the target's pool may have no page left for a chained position; the drafts so far
         * stand (the scheduler reserves what verification needs, evicting or preempting as it must) */
        if (d->tseq && (L + nd) > d->tseq->n_pages * d->pool->cfg.page_tokens && d->tpool->n_free < 1) break;
        KILN_TRY(step(d, &t, d->h_chain, L + nd - 1, 1));
        t = argmax(d->logits, V);
        drafts[nd] = t;
        if (draft_logits) memcpy(draft_logits + (size_t)nd * V, d->logits, (size_t)V * sizeof *d->logits);
    }
    d->seq.len = L;
    *n_drafts = nd;
    return KILN_OK;
}
