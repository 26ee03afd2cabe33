/* forward.h — the one transformer forward pass every architecture runs, over a chunk of tokens
 * from any number of sequences, computed through a backend object (backend/backend.h) (internal). */
#ifndef KILN_MODEL_FORWARD_H
#define KILN_MODEL_FORWARD_H
#include "model/model.h"
#include "model/mla.h"
#include "model/moe.h"
#include "backend/backend.h"
#include "kv/kv.h"

/* Scratch for a chunk of up to `chunk` tokens, allocated once per session or engine from its
 * backend (so the decode loop never allocates). Shapes in floats. */
typedef struct kiln_forward_ws {
    const kiln_backend *be; /* computes every op of the pass; not owned */
    int chunk, n_ctx_max;
    float *x;      /* [chunk, dim]         residual stream */
    float *xb;     /* [chunk, dim]         normed input to a block; the head's normed rows */
    float *tmp;    /* [chunk, dim]         a block's output before the residual add */
    float *q;      /* [chunk, H·hd]        GQA queries */
    float *k, *v;  /* [chunk, KV·hd]       GQA keys and values */
    float *qkv;    /* [chunk, (H+2KV)·hd]  fused QKV output (chatglm) or NULL */
    float *ao;     /* [chunk, H·hd]        attention output */
    float *hb;     /* [chunk, 2·ffn]       gate (or fused gate|up), then silu(gate)·up */
    float *hb2;    /* [chunk, ffn]         up */
    float *cs;     /* [chunk, rot]         RoPE cos/sin per token (rot/2 each) */
    float *logits; /* [vocab]              last row when the caller wants no full logits */
    float *head_part; /* [chunk, V/T + 1]  vocabulary-parallel head: this rank's logit columns, or NULL */
    float *eh;     /* [chunk, 2·dim]       MTP input [enorm(embed) | hnorm(h)], or NULL (no MTP layer) */
    float *hidden_out; /* caller's [n, dim]: when set, kiln_forward_batch copies the last layer's
                          output rows (before the final norm) there (MTP drafting reads them) */
    int *pos;      /* [chunk]              positions (single-sequence wrapper) */
    int *out_row;  /* [chunk] */
    kiln_kv_seq **seqs; /* [chunk] */
    int has_mla, has_moe;
    kiln_mla_ws mla;
    kiln_moe_ws moe;
} kiln_forward_ws;

kiln_status kiln_forward_ws_init(kiln_forward_ws *ws, const struct kiln_model *m, const kiln_backend *be, int chunk, int n_ctx_max);
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

/* Runs a batch; each sequence's len becomes max(len, pos + 1) of its tokens.
 *   x = embed(tokens)
 *   per layer: h = attn(rmsnorm(x));  [h = rmsnorm(h) post_self_attn]  x += h
 *              h = ffn(rmsnorm(x));   [h = rmsnorm(h) post_mlp]        x += h
 *              attn = GQA (fused or separate QKV, biases, q/k norm, partial RoPE) or MLA (mla.c)
 *              ffn  = dense SwiGLU (fused or separate gate/up) or MoE (moe.c)
 *   logits = head(rmsnorm(x)) for the rows that want them */
kiln_status kiln_forward_batch(const struct kiln_model *m, kiln_kv_pool *pool, kiln_forward_ws *ws,
                               const kiln_batch *b, float *logits);

/* MTP layer j (model/arch.h: kiln_mtp_layer) over a batch: token i is t_{j+1} for the target's
 * hidden state h_in row i of position b->pos[i] (the embedding is zeroed at position 0, as vLLM's
 * MTP module does), attending over the MTP layer's own KV in `pool` (layer 0 there). Writes the
 * rows' pre-norm outputs to h_out [n, dim] (if non-NULL) and the logits of the rows b->out_row
 * selects. Each sequence's len becomes max(len, pos + 1). */
kiln_status kiln_forward_mtp(const struct kiln_model *m, int j, kiln_kv_pool *pool, kiln_forward_ws *ws, const kiln_batch *b, const float *h_in,
                             float *h_out, float *logits);

/* Single-sequence convenience: tokens[0..n) at positions seq->len .. seq->len+n-1. Writes n × vocab
 * logits to `logits` if non-NULL, else the last row to ws->logits. */
kiln_status kiln_forward(const struct kiln_model *m, kiln_kv_pool *pool, kiln_kv_seq *seq, kiln_forward_ws *ws,
                         const int32_t *tokens, int n, float *logits);
#endif
