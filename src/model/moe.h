/* moe.h — mixture-of-experts execution for the GLM-4.5 / DeepSeek-V3 / Kimi K2 families.
 *
 * Routing (noaux_tc, as in the official modeling code):
 *   s      = sigmoid(router · x)                     [E]  (router in float32)
 *   choice = s + e_score_correction_bias             [E]
 *   group score g = sum of the 2 largest choices of each of n_group groups (E / n_group experts)
 *   keep the topk_group best groups; experts of the other groups get choice 0.0 (masked_fill 0.0,
 *   exactly as the reference does, not -inf)
 *   idx    = top num_experts_per_tok of choice; weight = s[idx] (without the bias)
 *   if norm_topk_prob: weight /= sum(weight) + 1e-20;  weight *= routed_scaling_factor
 * Execution over a batch of n tokens: route every token, group the (token, expert) pairs by
 * expert, run each selected expert once over its tokens (SwiGLU: down(silu(gate x) · up x)),
 * threads across experts when enough are active, then the weighted combine in a fixed order
 * (deterministic whatever the thread count) and the shared experts over all tokens. */
#ifndef KILN_MODEL_MOE_H
#define KILN_MODEL_MOE_H
#include "backend/backend.h"


typedef struct kiln_moe_layer {
    kiln_weight router;                      /* [E, dim] mlp.gate.weight */
    const float *bias;                       /* [E] mlp.gate.e_score_correction_bias, or NULL */
    const kiln_weight *gate, *up, *down;     /* [E] each: [ffn, dim] [ffn, dim] [dim, ffn] */
    kiln_weight sh_gate, sh_up, sh_down;     /* shared experts: [sffn, dim] [sffn, dim] [dim, sffn] */
} kiln_moe_layer;

/* Scratch for up to max_tokens tokens, allocated once (no allocation in the decode loop). */
typedef struct kiln_moe_ws {
    int max_tokens;
    float *logits;      /* [max_tokens, E] */
    float *route_tmp;   /* [E + n_group] */
    int *idx;           /* [max_tokens, k] selected experts */
    float *wt;          /* [max_tokens, k] their weights */
    int *count, *offset;/* [E], [E + 1] */
    int *slot;          /* [max_tokens, k] → row in the grouped buffers */
    int *slot_token;    /* [max_tokens · k] token of each grouped row */
    int *active;        /* [E] experts with at least one token */
    float *xg;          /* [max_tokens · k, dim]  gathered inputs, grouped by expert */
    float *hg, *ug;     /* [max_tokens · k, ffn]  gate, up */
    float *yg;          /* [max_tokens · k, dim]  expert outputs */
    float *sh, *su;     /* [max_tokens, shared_ffn] */
    float *sy;          /* [max_tokens, dim] */
    /* statistics since the workspace was created (for tests and bench) */
    long long n_routed_tokens, n_group_limited; /* tokens routed; of them, tokens whose selection the
                                                   group limit changed */
    long long *ep_load; /* [ep_size] expert parallelism: (token, expert) pairs routed to each rank's
                           experts (every rank routes every token, so each sees all ranks' loads) */
    int ep_size;
} kiln_moe_ws;

/* Scratch for up to max_tokens tokens; the float buffers come from the backend. */
kiln_status kiln_moe_ws_init(kiln_moe_ws *ws, const kiln_backend *be, const kiln_moe_cfg *c, int max_tokens);
void kiln_moe_ws_free(kiln_moe_ws *ws, const kiln_backend *be);


/* Y[n, dim] = MoE(X[n, dim]) (routed experts + shared experts). Under expert parallelism
 * (c->ep_size > 1) Y is this rank's partial sum: its own experts' weighted outputs (the others'
 * pairs add an exact zero row) plus its slice of the shared experts; the block's all-reduce adds
 * the ranks' parts. */
kiln_status kiln_moe_forward(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_moe_layer *L, const float *X, int n, float *Y, kiln_moe_ws *ws);
#endif
