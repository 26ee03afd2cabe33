/* spec.c — speculative decoding's drafters (issue 25; docs/SPECULATIVE.md): prompt lookup (n-gram
 * drafting from the context, as vLLM's `ngram` / llama.cpp's lookup decoding), and the draft /
 * verify loop of one sequence that kiln run --spec and kiln bench --spec share.
 *
 * kiln_ngram_draft: for n from n_max down to n_min, the context's last n tokens are searched for an
 * earlier occurrence; the first n with a match wins (the longest suffix that repeats), and of its
 * occurrences the most recent one (the nearest repetition is the likeliest to continue the same
 * way); the up to k tokens that followed it are the draft. O(n_ctx · n_max) per call: a few
 * thousand comparisons for the contexts kiln run sees, nothing next to a forward pass. */
#include "kiln.h"
#include "engine/session_internal.h"
#include "base/status.h"
#include <stdlib.h>
#include <string.h>

int kiln_ngram_draft(const int32_t *ctx, int n_ctx, int n_min, int n_max, int k, int32_t *out) {
    if (!ctx || n_ctx < 2 || k < 1 || n_min < 1 || n_max < n_min) return 0;
    for (int n = n_max < n_ctx - 1 ? n_max : n_ctx - 1; n >= n_min; n--) {
        const int32_t *suffix = ctx + n_ctx - n;
        /* the match must end before the suffix starts (it needs a token after it) */
        for (int start = n_ctx - n - 1; start >= 0; start--) {
            if (memcmp(ctx + start, suffix, (size_t)n * sizeof *ctx) != 0) continue;
            const int from = start + n, avail = n_ctx - from;
            const int m = avail < k ? avail : k;
            memcpy(out, ctx + from, (size_t)m * sizeof *ctx);
            return m;
        }
    }
    return 0;
}

/* ---- the draft / verify loop of one sequence (kiln run --spec, kiln bench --spec) --------------- */
/* The drafts of one step: up to `room` tokens into out; their count. ORACLE / WRONG read the known
 * greedy continuation (oracle[i] = the i-th generated token), `generated` tokens of which are out:
 * the next one to come is oracle[generated]. */
static kiln_status draft(kiln_session *s, const kiln_spec_cfg *c, const int32_t *hist, int n_hist, long generated, int32_t next, int room,
                         int32_t *out, int *nd, float *draft_rows) {
    *nd = 0;
    if (room < 1) return KILN_OK;
    switch (c->drafter) {
    case KILN_DRAFT_NGRAM: *nd = kiln_ngram_draft(hist, n_hist, 1, c->ngram_max, room, out); return KILN_OK;
    case KILN_DRAFT_MTP: return kiln_session_mtp_draft(s, next, room, out, nd, draft_rows);
    case KILN_DRAFT_ORACLE:
    case KILN_DRAFT_WRONG:
        for (int j = 0; j < room && generated + j < c->n_oracle; j++) {
            const int32_t t = c->oracle[generated + j];
            out[(*nd)++] = c->drafter == KILN_DRAFT_ORACLE ? t : (int32_t)((t + 1) % c->vocab);
        }
        return KILN_OK;
    default: return KILN_OK;
    }
}

kiln_status kiln_spec_generate(kiln_session *s, kiln_sampler *smp, const kiln_model_info *info, const int32_t *prompt, int n_prompt,
                               long n_gen, const kiln_spec_cfg *c, const kiln_spec_hooks *h, kiln_spec_stats *stats) {
    memset(stats, 0, sizeof *stats);
    if (!c || c->k < 1 || c->k > 64 || n_gen < 1 || n_prompt < 1 || c->vocab != info->vocab_size ||
        ((c->drafter == KILN_DRAFT_ORACLE || c->drafter == KILN_DRAFT_WRONG) && (!c->oracle || c->n_oracle < 0)) ||
        (c->drafter == KILN_DRAFT_NGRAM && c->ngram_max < 1))
        return kiln_fail(KILN_ERR_INVALID_ARG, "speculation: k %d (1..64), %ld tokens, vocabulary %d: invalid drafter settings", c ? c->k : 0, n_gen,
                         c ? c->vocab : 0);
    const int V = info->vocab_size, k = c->k;
    float *rows = malloc((size_t)(k + 1) * (size_t)V * sizeof *rows);
    float *drows = h && h->draft_rows ? malloc((size_t)k * (size_t)V * sizeof *drows) : NULL;
    int32_t *hist = malloc((size_t)(n_prompt + n_gen + k + 2) * sizeof *hist), *toks = malloc((size_t)(k + 1) * sizeof *toks);
    kiln_status st = rows && hist && toks && (!h || !h->draft_rows || drows) ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (st) goto out;
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *prompt);
    int n_hist = n_prompt, done = 0;
    long generated = 0;
    const int follower = h && h->share && h->follower;
    int32_t next = follower ? 0 : kiln_sample(smp, kiln_session_logits(s));
    if (h && h->share && (st = h->share(h->ud, &next, 1))) goto out;
    while (!done) {
        /* `next` is generated */
        generated++;
        if (kiln_model_is_eos(info, next)) break;
        if (h && h->token) h->token(h->ud, next, generated);
        hist[n_hist++] = next;
        if (generated == n_gen || kiln_session_length(s) >= info->max_context) break;
        /* drafts: each must still leave room for the token after it (n_gen, the context) */
        long room = k;
        if (room > n_gen - generated - 1) room = n_gen - generated - 1;
        if (room > info->max_context - kiln_session_length(s) - 1) room = info->max_context - kiln_session_length(s) - 1;
        int nd = 0;
        if ((st = draft(s, c, hist, n_hist, generated, next, (int)room, toks + 1, &nd, drows))) break;
        if (h && h->share && c->drafter == KILN_DRAFT_MTP) {
            /* MTP drafts come from the layer's arithmetic (its forward runs on every rank: the layer is
             * sharded like the others), not from the tokens alone as prompt lookup's: the leader's
             * drafts go to every rank, so that all verify the same tokens even where two ranks'
             * kernels would round a near-tie differently */
            int32_t sh[1 + 64]; /* k <= 64 (checked above) */
            memset(sh, 0, sizeof sh);
            sh[0] = nd;
            memcpy(sh + 1, toks + 1, (size_t)nd * sizeof *sh);
            if ((st = h->share(h->ud, sh, 1 + k))) break;
            if (sh[0] < 0 || sh[0] > room) { st = kiln_fail(KILN_ERR_INTERNAL, "speculation: %d drafts shared by the leader (room %ld)", sh[0], room); break; }
            nd = sh[0];
            memcpy(toks + 1, sh + 1, (size_t)nd * sizeof *sh);
        }
        if (drows && nd > 0 && h->draft_rows(h->ud, drows, nd)) { st = kiln_fail(KILN_ERR_IO, "writing the draft logits failed"); break; }
        toks[0] = next;
        const int len0 = kiln_session_length(s);
        /* a step without drafts whose rows nobody keeps (plain decoding, a step prompt lookup found
         * nothing for) samples from the session's own logits: no copy of the vocabulary row */
        const float *lg = nd > 0 || (h && h->rows) ? rows : NULL;
        if ((st = kiln_session_eval_decodes_(s, toks, nd + 1, (float *)lg))) break;
        if (!lg) lg = kiln_session_logits(s);
        stats->verifies++;
        stats->drafted += nd;
        /* row j holds the target's logits after toks[j]: verify draft j + 1 there; the first
         * rejection's replacement (or, all kept, the pick after the last draft) is t */
        int acc = 0, ok = 1;
        int32_t t = 0;
        while (!follower && acc < nd && ok) {
            t = kiln_sample_verify(smp, lg + (size_t)acc * V, toks[1 + acc], &ok);
            acc += ok;
        }
        if (!follower && ok) t = kiln_sample(smp, lg + (size_t)acc * V);
        if (h && h->share) { /* the leader's decision to every rank */
            int32_t d[2] = {acc, t};
            if ((st = h->share(h->ud, d, 2))) break;
            acc = d[0], t = d[1];
            if (acc < 0 || acc > nd) { st = kiln_fail(KILN_ERR_INTERNAL, "speculation: %d of %d drafts accepted, shared by the leader", acc, nd); break; }
        }
        stats->accepted += acc;
        if (acc < nd && (st = kiln_session_truncate(s, len0 + 1 + acc))) break;
        int kept_rows = 1 + acc; /* rows of the tokens decoding continues after */
        for (int j = 0; j < acc && !done; j++) { /* the accepted drafts are generated tokens */
            generated++;
            if (kiln_model_is_eos(info, toks[1 + j])) { kept_rows = 1 + j; done = 1; break; }
            if (h && h->token) h->token(h->ud, toks[1 + j], generated);
            hist[n_hist++] = toks[1 + j];
        }
        if (h && h->rows && h->rows(h->ud, rows, kept_rows)) { st = kiln_fail(KILN_ERR_IO, "writing the logits failed"); break; }
        next = t;
    }
    stats->generated = generated;
out:
    free(rows);
    free(drows);
    free(hist);
    free(toks);
    return st;
}
