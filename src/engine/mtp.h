/* mtp.h — the MTP drafter behind `--spec mtp` (engine/mtp.c; internal). */
#ifndef KILN_ENGINE_MTP_H
#define KILN_ENGINE_MTP_H
#include "model/forward.h"
#include "kv/kv.h"

typedef struct kiln_mtp {
    struct kiln_model *m;
    kiln_kv_pool *pool;     /* the MTP layer's KV (one layer): its own, or the server's draft pool (paged) */
    kiln_kv_pool *tpool;    /* paged: the target's pool and sequence, whose block table the draft pool */
    kiln_kv_seq *tseq;      /*   shares; NULL for a drafter with its own pool */
    kiln_kv_seq seq;        /* len = positions whose (h_j, t_{j+1}) pair the MTP layer has processed
                               (paged: its block table is a view of tseq's) */
    kiln_forward_ws ws;
    int n_ctx, dim, broken;
    float *hid;             /* target hidden rows [hid_n, dim] of positions [hid_pos, hid_pos + hid_n) */
    int hid_pos, hid_n, hid_cap;
    int32_t *tok;           /* [n_ctx + 1] the target's tokens by position */
    float *h_chain, *hout;  /* [dim] the last step's output hidden state; [chunk, dim] scratch */
    float *logits;          /* [vocab] */
} kiln_mtp;

/* A drafter for model m (KILN_ERR_UNSUPPORTED when it ships no MTP layer), computing with `be`, its
 * KV rows laid out as the target's pool `target_kv`, for contexts up to n_ctx. */
kiln_status kiln_mtp_create(struct kiln_model *m, const kiln_backend *be, const kiln_kv_config *target_kv, int n_ctx, kiln_mtp **out);
/* The server's draft pool: one MTP layer's rows for every page of the target pool (page p of one
 * holds the positions page p of the other does). */
kiln_status kiln_mtp_pool_create(const kiln_backend *be, const kiln_kv_pool *target, kiln_kv_pool **out);
/* A drafter whose MTP KV lives in draft_pool (kiln_mtp_pool_create of target_pool) at the pages of
 * target_seq (a sequence of target_pool that outlives the drafter). */
kiln_status kiln_mtp_create_paged(struct kiln_model *m, const kiln_backend *be, kiln_kv_pool *draft_pool, kiln_kv_pool *target_pool,
                                  kiln_kv_seq *target_seq, int n_ctx, kiln_mtp **out);
void kiln_mtp_free(kiln_mtp *d);
/* Before the target evaluates tokens[0..n) at positions pos..: where its forward pass must copy
 * the n hidden rows ([n, dim]); NULL without memory. */
float *kiln_mtp_hidden_rows(kiln_mtp *d, const int32_t *tokens, int pos, int n);
/* Runs the MTP layer over the pairs (h_p, toks[p + 1]) of positions [seq.len, upto) once at least
 * one chunk of them is pending, and drops their hidden rows: a request that does not draft for a
 * while (a large batch, a grammar) keeps a bounded number of rows instead of its whole context.
 * toks: the target's final tokens by position (toks[p + 1] known for p < upto). */
kiln_status kiln_mtp_catch_up(kiln_mtp *d, const int32_t *toks, int upto);
/* The target rolled back to n positions. */
void kiln_mtp_truncate(kiln_mtp *d, int n);
/* The target starts over at position n (its positions below n came from the prefix cache together
 * with the MTP layer's rows of them, which the caller checked were whole: paged drafters only). */
void kiln_mtp_restart(kiln_mtp *d, int n);
/* Up to k greedy drafts after `next` (the token chosen after the target's target_len positions) into
 * drafts; *n_drafts the count (0 when drafting is not possible); draft_logits [k, vocab] or NULL. */
kiln_status kiln_mtp_draft(kiln_mtp *d, int target_len, int32_t next, int k, int32_t *drafts, int *n_drafts, float *draft_logits);
#endif
