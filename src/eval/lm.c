/* lm.c — the model interface of the harness: eval_feed (prefix reuse over one sequence) and the
 * engine backend over a kiln_session.
 *
 * Scoring many continuations after one context is the common case (every choice of a question,
 * every question of an MMLU subject after the same five shots, every GSM8K question after the same
 * eight exemplars). eval_feed keeps the tokens the session holds and, for a new request, rolls the
 * session back to the longest common prefix (kiln_session_truncate) and evaluates only the rest. */
#include "eval/eval.h"
#include "base/status.h"
#include <stdlib.h>
#include <string.h>

kiln_status eval_tokenize(eval_lm *lm, const char *text, int add_bos, int32_t **ids, int *n) {
    return lm->tokenize(lm->ctx, text, strlen(text), add_bos, ids, n);
}

void eval_lm_release(eval_lm *lm) {
    free(lm->hist);
    free(lm->rows);
    lm->hist = NULL;
    lm->rows = NULL;
    lm->hist_len = lm->hist_cap = 0;
}

kiln_status eval_feed(eval_lm *lm, const int32_t *tok, int n, int from, eval_row_fn row, void *ud) {
    if (from < 0 || from >= n || n > lm->n_ctx)
        return kiln_fail(KILN_ERR_INTERNAL, "eval_feed: from = %d, n = %d, context %d", from, n, lm->n_ctx);
    if (!lm->rows && !(lm->rows = malloc((size_t)EVAL_PIECE * (size_t)lm->vocab * sizeof *lm->rows)))
        return kiln_fail(KILN_ERR_NOMEM, "out of memory for %d logits rows", EVAL_PIECE);
    if (lm->hist_cap < n) {
        int32_t *h = realloc(lm->hist, (size_t)n * sizeof *h);
        if (!h) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        lm->hist = h;
        lm->hist_cap = n;
    }
    int keep = 0;
    while (keep < lm->hist_len && keep < from && lm->hist[keep] == tok[keep]) keep++;
    if (keep < lm->hist_len) {
        /* Record the roll-back first: if the backend fails midway, hist never claims more than
         * the backend holds. A backend that cannot roll back exactly (dynamic FP8 KV scales)
         * starts over: slower, same numbers as a fresh session. */
        int had = lm->hist_len;
        lm->hist_len = keep;
        if (keep > 0 && !lm->no_truncate) {
            kiln_status st = lm->truncate(lm->ctx, keep);
            if (st == KILN_ERR_UNSUPPORTED) lm->no_truncate = 1;
            else if (st) return st;
        }
        if (keep > 0 && lm->no_truncate) keep = 0;
        if (keep == 0 && had > 0) {
            lm->hist_len = 0;
            KILN_TRY(lm->truncate(lm->ctx, 0));
        }
    }
    /* [keep, from): no rows needed, one call (only the last row is computed). */
    if (keep < from) {
        KILN_TRY(lm->eval(lm->ctx, tok + keep, from - keep, NULL));
        memcpy(lm->hist + keep, tok + keep, (size_t)(from - keep) * sizeof *tok);
        lm->hist_len = from;
    }
    /* [from, n): pieces of EVAL_PIECE rows. */
    for (int p = from; p < n; p += EVAL_PIECE) {
        int c = n - p < EVAL_PIECE ? n - p : EVAL_PIECE;
        KILN_TRY(lm->eval(lm->ctx, tok + p, c, row ? lm->rows : NULL));
        memcpy(lm->hist + p, tok + p, (size_t)c * sizeof *tok);
        lm->hist_len = p + c;
        if (row)
            for (int i = 0; i < c; i++) KILN_TRY(row(ud, p + i, lm->rows + (size_t)i * lm->vocab));
    }
    return KILN_OK;
}

/* ---- the engine backend ----------------------------------------------------------------------------- */
typedef struct {
    kiln_model *m;
    kiln_session *s;
} sess_ctx;

static kiln_status s_tokenize(void *ctx, const char *text, size_t len, int add_bos, int32_t **ids, int *n) {
    sess_ctx *c = ctx;
    *ids = NULL;
    *n = 0;
    kiln_model_info info;
    kiln_model_get_info(c->m, &info);
    if (!info.has_tokenizer) /* synthetic checkpoints: only ppl:random / kl:random work */
        return kiln_fail(KILN_ERR_UNSUPPORTED, "the model has no tokenizer files: only the ppl:random and kl:random tasks can run on it");
    size_t cap = len + 16, got = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *v = malloc(cap * sizeof *v);
        if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory tokenizing %zu bytes", len);
        kiln_status st = kiln_tokenize(c->m, text, len, add_bos, v, cap, &got);
        if (st) { free(v); return st; }
        if (got <= cap) {
            if (got > 0x7fffffff) { free(v); return kiln_fail(KILN_ERR_INVALID_ARG, "text of %zu tokens is too long", got); }
            *ids = v;
            *n = (int)got;
            return KILN_OK;
        }
        free(v);
        cap = got;
    }
    return kiln_fail(KILN_ERR_INTERNAL, "tokenizer returned a growing token count");
}
static const char *s_piece(void *ctx, int32_t prev, int32_t id, size_t *len) {
    return kiln_token_piece(((sess_ctx *)ctx)->m, prev, id, len);
}
static kiln_status s_eval(void *ctx, const int32_t *tok, int n, float *logits) {
    return kiln_session_eval(((sess_ctx *)ctx)->s, tok, n, logits);
}
static const float *s_last(void *ctx) { return kiln_session_logits(((sess_ctx *)ctx)->s); }
static kiln_status s_truncate(void *ctx, int n) { return kiln_session_truncate(((sess_ctx *)ctx)->s, n); }

kiln_status eval_lm_session(eval_lm *lm, kiln_model *m, const kiln_options *o) {
    memset(lm, 0, sizeof *lm);
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    sess_ctx *c = calloc(1, sizeof *c);
    if (!c) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    c->m = m;
    kiln_options oq;
    if (o) oq = *o; else kiln_options_default(&oq);
    oq.quiet = 1; /* one session per task: the CLI reports the configuration once itself */
    kiln_status st = kiln_session_create(m, &oq, &c->s);
    if (st) { free(c); return st; }
    lm->ctx = c;
    lm->vocab = info.vocab_size;
    lm->n_ctx = o && o->max_context > 0 && o->max_context < info.max_context ? o->max_context : info.max_context;
    lm->bos = info.bos_id;
    lm->eos = info.eos_id;
    lm->n_eos = info.n_eos;
    memcpy(lm->eos_ids, info.eos_ids, sizeof lm->eos_ids);
    lm->tokenize = s_tokenize;
    lm->piece = s_piece;
    lm->eval = s_eval;
    lm->last_logits = s_last;
    lm->truncate = s_truncate;
    return KILN_OK;
}

void eval_lm_session_free(eval_lm *lm) {
    sess_ctx *c = lm->ctx;
    if (c) {
        kiln_session_free(c->s);
        free(c);
    }
    eval_lm_release(lm);
    lm->ctx = NULL;
}
