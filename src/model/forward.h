/* forward.h — the transformer forward pass over a chunk of tokens (internal). */
#ifndef KILN_MODEL_FORWARD_H
#define KILN_MODEL_FORWARD_H
#include "model/model.h"
#include "kv/kv.h"

/* Scratch for a chunk of up to `chunk` tokens; allocated once per session so the decode loop never
 * allocates. Shapes in floats. */
typedef struct kiln_forward_ws {
    int chunk, n_ctx_max;
    float *x;      /* [chunk, dim]     residual stream */
    float *xb;     /* [chunk, dim]     normed input to a block */
    float *q;      /* [chunk, H*hd] */
    float *k, *v;  /* [chunk, KV*hd] */
    float *ao;     /* [chunk, H*hd]    attention output */
    float *hb;     /* [chunk, ffn]     gate, then silu(gate)·up */
    float *hb2;    /* [chunk, ffn]     up */
    float *att;    /* [H, n_ctx_max]   attention scores */
    float *rope;   /* [chunk, rot]     cos/sin per position (rot/2 each) */
    float *logits; /* [vocab]          last row when the caller wants no full logits */
    int *pos;      /* [chunk]          positions (single-sequence wrapper) */
    int *out_row;  /* [chunk] */
    kiln_kv_seq **seqs; /* [chunk] */
    void *arch_ws;                  /* extra scratch of model/arch.h architectures */
    void (*arch_ws_free)(void *);
} kiln_forward_ws;

kiln_status kiln_forward_ws_init(kiln_forward_ws *ws, const struct kiln_model *m, int chunk, int n_ctx_max);
void kiln_forward_ws_free(kiln_forward_ws *ws);

/* One step of tokens from any number of sequences (continuous batching): the linear layers run
 * once over all n tokens; attention runs per token over its own sequence's pages. Tokens of one
 * sequence must appear in increasing position order; each token at position p attends to
 * positions [0, p] of its sequence (earlier ones stored in earlier steps or earlier in this batch).
 * The caller has reserved KV room for every position. */
typedef struct kiln_batch {
    int n;                  /* tokens in this step (<= ws->chunk) */
    const int32_t *tokens;  /* [n] */
    kiln_kv_seq *const *seq;/* [n] the sequence each token belongs to */
    const int *pos;         /* [n] the token's position in its sequence */
    const int *out_row;     /* [n] row of `logits` receiving this token's logits, or -1 for none;
                               NULL = every token, row i */
} kiln_batch;

/* Runs a batch; each sequence's len becomes max(len, pos + 1) of its tokens. */
kiln_status kiln_forward_batch(const struct kiln_model *m, kiln_kv_pool *pool, kiln_forward_ws *ws,
                               const kiln_batch *b, float *logits);

/* Single-sequence convenience: tokens[0..n) at positions seq->len .. seq->len+n-1. Writes n × vocab
 * logits to `logits` if non-NULL, else the last row to ws->logits. */
kiln_status kiln_forward(const struct kiln_model *m, kiln_kv_pool *pool, kiln_kv_seq *seq, kiln_forward_ws *ws,
                         const int32_t *tokens, int n, float *logits);

/* RMSNorm reference: out[i] = x[i] / sqrt(mean(x²) + eps) · w[i]. */
void kiln_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* kiln_rmsnorm over n_rows consecutive rows of n floats (out may equal x). */
void kiln_rmsnorm_rows(float *out, const float *x, const float *w, int n_rows, int n, float eps);

/* The two ends every forward pass shares (the llama path in forward.c and model/arch.h's):
 * kiln_forward_embed checks the batch (1..chunk tokens, ids in [0, vocab), positions below
 * n_ctx_max) and writes each token's embedding row to ws->x [n, dim]; kiln_forward_head, after the
 * last layer, sets each sequence's len to max(len, pos + 1), RMSNorms the rows of ws->x that want
 * logits into ws->xb in out_row order and runs the LM head over them into logits [rows, vocab]. */
kiln_status kiln_forward_embed(const struct kiln_model *m, kiln_forward_ws *ws, const kiln_batch *b);
void kiln_forward_head(const struct kiln_model *m, kiln_forward_ws *ws, const kiln_batch *b, float *logits);
#endif
