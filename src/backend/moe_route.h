/* moe_route.h — MoE router decisions (noaux_tc, as the official GLM-4.5 / DeepSeek-V3 / Kimi K2
 * modeling code): the pure per-token selection every backend shares (model/moe.h gives the rules).
 *   s      = sigmoid(router · x)                     [E]
 *   choice = s + e_score_correction_bias             [E]
 *   group score = sum of the 2 largest choices of each of n_group groups; keep the topk_group best
 *   groups (other experts' choice 0.0, masked_fill 0.0 as the reference); idx = top n_used of
 *   choice; weight = s[idx], normalised when norm_topk_prob (+ 1e-20), × routed_scaling_factor. */
#ifndef KILN_BACKEND_MOE_ROUTE_H
#define KILN_BACKEND_MOE_ROUTE_H

typedef struct kiln_moe_cfg {
    int n_experts, n_used;      /* n_routed_experts, num_experts_per_tok */
    int n_group, topk_group;    /* group-limited selection (1, 1 = off) */
    int norm_topk_prob;
    float routed_scale;         /* routed_scaling_factor */
    int dim, ffn;               /* hidden_size, moe_intermediate_size */
    int shared_ffn;             /* moe_intermediate_size × n_shared_experts (0 = no shared experts) */
    int ep_size, ep_rank;       /* expert parallelism (model/shard.c, docs/SCALE.md): this rank runs the
                                   routed experts [ep_rank·E/ep_size, (ep_rank + 1)·E/ep_size) only and
                                   gives a partial sum (0 / 1: every expert) */
} kiln_moe_cfg;

/* The router's sigmoid, 1 / (1 + e^-x), the same float on every platform and on the device: a
 * double evaluation in plain IEEE operations (add, subtract, multiply, divide, floor, ×2^k), rounded
 * once to float; the vulkan route shader (moe_route.comp) runs the same operations in double
 * precision, so that a device picks the same experts as the host even at near ties (expf differs
 * between C libraries and GPU drivers by an ulp). Correctly rounded except within ~1e-15 relative of
 * a rounding boundary; results below FLT_MIN are 0 (a device may flush float subnormals). */
float kiln_moe_sigmoid(float x);
/* Routes one token: idx[k], w[k] from router logits [E]; tmp: [E + n_group] floats.
 * Returns 1 when the group limit changed the selection compared with plain top-k of choice. */
int kiln_moe_route(const kiln_moe_cfg *c, const float *logits, const float *bias, int *idx, float *w, float *tmp);
#endif
