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
} kiln_forward_ws;

kiln_status kiln_forward_ws_init(kiln_forward_ws *ws, const struct kiln_model *m, int chunk, int n_ctx_max);
void kiln_forward_ws_free(kiln_forward_ws *ws);

/* Runs tokens[0..n) at positions seq->len .. seq->len+n-1 (n <= ws->chunk); the caller has
 * reserved KV room. Writes n × vocab logits to `logits` if non-NULL, else the last row to
 * ws->logits. Advances seq->len by n. */
kiln_status kiln_forward(const struct kiln_model *m, kiln_kv_pool *pool, kiln_kv_seq *seq, kiln_forward_ws *ws,
                         const int32_t *tokens, int n, float *logits);

/* RMSNorm reference: out[i] = x[i] / sqrt(mean(x²) + eps) · w[i]. */
void kiln_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
#endif
