/* moe.c — MoE routing (sigmoid + correction bias + group-limited top-k) and grouped execution of
 * the selected experts (see moe.h for the exact routing rules). */
#include "model/moe.h"
#include "base/status.h"
#include <stdlib.h>
#include <string.h>

kiln_status kiln_moe_ws_init(kiln_moe_ws *ws, const kiln_backend *be, const kiln_moe_cfg *c, int max_tokens) {
    memset(ws, 0, sizeof *ws);
    ws->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens, E = (size_t)c->n_experts, K = (size_t)c->n_used, S = T * K;
    ws->logits = kiln_be_alloc(be, T * E * sizeof(float));
    ws->route_tmp = kiln_be_alloc(be, (E + (size_t)c->n_group + 1) * sizeof(float));
    ws->idx = malloc(S * sizeof(int));
    ws->wt = kiln_be_alloc(be, S * sizeof(float));
    ws->count = malloc(E * sizeof(int));
    ws->offset = malloc((E + 1) * sizeof(int));
    ws->slot = malloc(S * sizeof(int));
    ws->slot_token = malloc(S * sizeof(int));
    ws->active = malloc(E * sizeof(int));
    ws->ep_size = c->ep_size > 1 ? c->ep_size : 1;
    ws->ep_load = calloc((size_t)ws->ep_size, sizeof *ws->ep_load);
    ws->xg = kiln_be_alloc(be, S * (size_t)c->dim * sizeof(float));
    ws->hg = kiln_be_alloc(be, S * (size_t)c->ffn * sizeof(float));
    ws->ug = kiln_be_alloc(be, S * (size_t)c->ffn * sizeof(float));
    ws->yg = kiln_be_alloc(be, S * (size_t)c->dim * sizeof(float));
    int ok = ws->ep_load && ws->logits && ws->route_tmp && ws->idx && ws->wt && ws->count && ws->offset && ws->slot && ws->slot_token &&
             ws->active && ws->xg && ws->hg && ws->ug && ws->yg;
    if (ok && c->shared_ffn > 0) {
        ws->sh = kiln_be_alloc(be, T * (size_t)c->shared_ffn * sizeof(float));
        ws->su = kiln_be_alloc(be, T * (size_t)c->shared_ffn * sizeof(float));
        ws->sy = kiln_be_alloc(be, T * (size_t)c->dim * sizeof(float));
        ok = ws->sh && ws->su && ws->sy;
    }
    if (!ok) {
        kiln_moe_ws_free(ws, be);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory allocating MoE scratch (%d tokens × %d experts)", max_tokens, c->n_experts);
    }
    return KILN_OK;
}

void kiln_moe_ws_free(kiln_moe_ws *ws, const kiln_backend *be) {
    float *bufs[] = {ws->logits, ws->route_tmp, ws->wt, ws->xg, ws->hg, ws->ug, ws->yg, ws->sh, ws->su, ws->sy};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) kiln_be_free(be, bufs[i]);
    free(ws->idx); free(ws->count); free(ws->offset); free(ws->slot); free(ws->slot_token); free(ws->active); free(ws->ep_load);
    memset(ws, 0, sizeof *ws);
}

/* Steps 1-4 with the selection on the host: route the logits in ws->logits, group the (token,
 * expert) pairs by expert, run the experts, combine into Y. */
static void route_group_run(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_moe_layer *L, const float *X, int n, float *Y,
                            kiln_moe_ws *ws) {
    const int E = c->n_experts, K = c->n_used, D = c->dim;
    ws->n_group_limited += be->ops->moe_route(be, c, ws->logits, L->bias, n, ws->idx, ws->wt, ws->route_tmp);
    /* 2. group (token, expert) pairs by expert: counting sort, stable in token order. Expert
     *    parallelism: only this rank's experts [e_lo, e_hi) get rows; the other pairs point at one
     *    zeroed row after them, so the combine adds an exact 0 for them. */
    const int per_rank = ws->ep_size > 1 ? E / ws->ep_size : E;
    const int e_lo = ws->ep_size > 1 ? c->ep_rank * per_rank : 0, e_hi = e_lo + per_rank;
    memset(ws->count, 0, (size_t)E * sizeof(int));
    for (int s = 0; s < n * K; s++) ws->count[ws->idx[s]]++;
    if (ws->ep_size > 1)
        for (int e = 0; e < E; e++) ws->ep_load[e / per_rank] += ws->count[e];
    ws->offset[0] = 0;
    int n_active = 0;
    for (int e = 0; e < E; e++) {
        const int mine = e >= e_lo && e < e_hi;
        ws->offset[e + 1] = ws->offset[e] + (mine ? ws->count[e] : 0);
        if (mine && ws->count[e]) ws->active[n_active++] = e;
    }
    const int zero_row = ws->offset[E]; /* < n·K whenever some pair is not this rank's */
    kiln_be_wait(be); /* the rows are gathered on the host (backend.h kiln_be_wait) */
    if (zero_row < n * K) memset(ws->yg + (size_t)zero_row * D, 0, (size_t)D * sizeof(float));
    memset(ws->count, 0, (size_t)E * sizeof(int));
    for (int s = 0; s < n * K; s++) {
        int e = ws->idx[s];
        if (e < e_lo || e >= e_hi) { ws->slot[s] = zero_row; continue; }
        int row = ws->offset[e] + ws->count[e]++;
        ws->slot[s] = row;
        ws->slot_token[row] = s / K;
        memcpy(ws->xg + (size_t)row * D, X + (size_t)(s / K) * D, (size_t)D * sizeof(float));
    }
    /* 3. run the selected experts: threads across experts when there are enough of them, otherwise
     *    each expert's matmuls thread over rows. */
    be->ops->moe_experts(be, c, L->gate, L->up, L->down, ws->active, n_active, ws->offset, ws->xg, ws->hg, ws->ug, ws->yg);
    /* 4. weighted combine, token by token in selection order (deterministic) */
    be->ops->moe_combine(be, n, K, D, ws->slot, ws->wt, ws->yg, Y);
}

kiln_status kiln_moe_forward(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_moe_layer *L, const float *X, int n, float *Y, kiln_moe_ws *ws) {
    const int D = c->dim;
    if (n < 1 || n > ws->max_tokens) return kiln_fail(KILN_ERR_INTERNAL, "moe: batch of %d tokens (max %d)", n, ws->max_tokens);
    /* 1. route (a backend that routes on its device runs 1-4 there: moe_routed; the selection then
     *    stays on the device, so n_group_limited does not count those tokens) */
    kiln_be_matmul(be, &L->router, X, ws->logits, n);
    ws->n_routed_tokens += n;
    if (!(be->ops->moe_routed && ws->ep_size <= 1 &&
          be->ops->moe_routed(be, c, ws->logits, L->bias, L->gate, L->up, L->down, X, n, ws->hg, ws->ug, ws->yg, Y) == 0))
        route_group_run(be, c, L, X, n, Y, ws);
    /* 5. shared experts over every token */
    if (c->shared_ffn > 0) {
        kiln_be_matmul_swiglu(be, &L->sh_gate, &L->sh_up, X, n, ws->sh, ws->su);
        kiln_be_matmul(be, &L->sh_down, ws->sh, ws->sy, n);
        kiln_be_add(be, Y, ws->sy, (int64_t)n * D);
    }
    return KILN_OK;
}
