/* moe.c — MoE routing (sigmoid + correction bias + group-limited top-k) and grouped execution of
 * the selected experts (see moe.h for the exact routing rules). */
#include "model/moe.h"
#include "base/pool.h"
#include "base/status.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

kiln_status kiln_moe_ws_init(kiln_moe_ws *ws, const kiln_moe_cfg *c, int max_tokens) {
    memset(ws, 0, sizeof *ws);
    ws->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens, E = (size_t)c->n_experts, K = (size_t)c->n_used, S = T * K;
    ws->logits = malloc(T * E * sizeof(float));
    ws->route_tmp = malloc((E + (size_t)c->n_group + 1) * sizeof(float));
    ws->idx = malloc(S * sizeof(int));
    ws->wt = malloc(S * sizeof(float));
    ws->count = malloc(E * sizeof(int));
    ws->offset = malloc((E + 1) * sizeof(int));
    ws->slot = malloc(S * sizeof(int));
    ws->slot_token = malloc(S * sizeof(int));
    ws->active = malloc(E * sizeof(int));
    ws->xg = malloc(S * (size_t)c->dim * sizeof(float));
    ws->hg = malloc(S * (size_t)c->ffn * sizeof(float));
    ws->ug = malloc(S * (size_t)c->ffn * sizeof(float));
    ws->yg = malloc(S * (size_t)c->dim * sizeof(float));
    int ok = ws->logits && ws->route_tmp && ws->idx && ws->wt && ws->count && ws->offset && ws->slot && ws->slot_token &&
             ws->active && ws->xg && ws->hg && ws->ug && ws->yg;
    if (ok && c->shared_ffn > 0) {
        ws->sh = malloc(T * (size_t)c->shared_ffn * sizeof(float));
        ws->su = malloc(T * (size_t)c->shared_ffn * sizeof(float));
        ws->sy = malloc(T * (size_t)c->dim * sizeof(float));
        ok = ws->sh && ws->su && ws->sy;
    }
    if (!ok) {
        kiln_moe_ws_free(ws);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory allocating MoE scratch (%d tokens × %d experts)", max_tokens, c->n_experts);
    }
    return KILN_OK;
}

void kiln_moe_ws_free(kiln_moe_ws *ws) {
    free(ws->logits); free(ws->route_tmp); free(ws->idx); free(ws->wt); free(ws->count); free(ws->offset);
    free(ws->slot); free(ws->slot_token); free(ws->active); free(ws->xg); free(ws->hg); free(ws->ug); free(ws->yg);
    free(ws->sh); free(ws->su); free(ws->sy);
    memset(ws, 0, sizeof *ws);
}

/* Indices of the k largest v[0..n) (ties: lowest index first), in descending order of value. */
static void top_k(const float *v, int n, int k, int *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int t = 0; t < j; t++)
                if (out[t] == i) { taken = 1; break; }
            if (taken) continue;
            if (best < 0 || v[i] > v[best]) best = i;
        }
        out[j] = best;
    }
}

int kiln_moe_route(const kiln_moe_cfg *c, const float *logits, const float *bias, int *idx, float *w, float *tmp) {
    const int E = c->n_experts, K = c->n_used;
    float *choice = tmp, *gscore = tmp + E;
    for (int e = 0; e < E; e++) {
        float s = 1.0f / (1.0f + expf(-logits[e]));
        choice[e] = s + (bias ? bias[e] : 0.0f);
    }
    int changed = 0;
    if (c->n_group > 1 && c->topk_group < c->n_group) {
        int per = E / c->n_group, plain[64], gsel[64];
        int kk = K < 64 ? K : 64;
        top_k(choice, E, kk, plain); /* unconstrained selection, for the statistics only */
        for (int g = 0; g < c->n_group; g++) {
            const float *v = choice + (size_t)g * per;
            int i1 = 0;
            for (int i = 1; i < per; i++) if (v[i] > v[i1]) i1 = i;
            int i2 = i1 == 0 ? 1 : 0;
            for (int i = 0; i < per; i++) if (i != i1 && v[i] > v[i2]) i2 = i;
            gscore[g] = v[i1] + v[i2];
        }
        int ng = c->topk_group < 64 ? c->topk_group : 64;
        top_k(gscore, c->n_group, ng, gsel);
        for (int g = 0; g < c->n_group; g++) {
            int keep = 0;
            for (int t = 0; t < ng; t++) if (gsel[t] == g) keep = 1;
            if (!keep)
                for (int i = 0; i < per; i++) choice[(size_t)g * per + i] = 0.0f;
        }
        top_k(choice, E, K, idx);
        for (int j = 0; j < kk && !changed; j++) {
            int found = 0;
            for (int t = 0; t < K; t++) if (idx[t] == plain[j]) found = 1;
            if (!found) changed = 1;
        }
    } else {
        top_k(choice, E, K, idx);
    }
    float sum = 0.0f;
    for (int j = 0; j < K; j++) {
        w[j] = 1.0f / (1.0f + expf(-logits[idx[j]]));
        sum += w[j];
    }
    if (c->norm_topk_prob) {
        float den = sum + 1e-20f;
        for (int j = 0; j < K; j++) w[j] /= den;
    }
    for (int j = 0; j < K; j++) w[j] *= c->routed_scale;
    return changed;
}

static void swiglu(float *g, const float *u, size_t n) {
    kiln_silu_mul(g, u, (int64_t)n);
}

/* One expert over its cnt grouped rows starting at row `off`; single-threaded (threads=0) or using
 * kiln_matmul's own row threading. */
static void run_expert(const kiln_moe_cfg *c, const kiln_moe_layer *L, int e, int off, int cnt, kiln_moe_ws *ws, int single) {
    const float *x = ws->xg + (size_t)off * c->dim;
    float *h = ws->hg + (size_t)off * c->ffn, *u = ws->ug + (size_t)off * c->ffn, *y = ws->yg + (size_t)off * c->dim;
    if (single) {
        kiln_matmul_rows(&L->gate[e], x, h, cnt, 0, c->ffn);
        kiln_matmul_rows(&L->up[e], x, u, cnt, 0, c->ffn);
        swiglu(h, u, (size_t)cnt * c->ffn);
        kiln_matmul_rows(&L->down[e], h, y, cnt, 0, c->dim);
    } else {
        const kiln_weight *w2[2] = {&L->gate[e], &L->up[e]};
        float *y2[2] = {h, u};
        kiln_matmul_many(w2, y2, 2, x, cnt);
        swiglu(h, u, (size_t)cnt * c->ffn);
        kiln_matmul(&L->down[e], h, y, cnt);
    }
}

typedef struct {
    const kiln_moe_cfg *c;
    const kiln_moe_layer *L;
    kiln_moe_ws *ws;
} expert_job;
/* Active expert a on one thread (its matmuls single-threaded). */
static void expert_task(void *arg, int64_t a) {
    const expert_job *j = arg;
    int e = j->ws->active[a];
    run_expert(j->c, j->L, e, j->ws->offset[e], j->ws->offset[e + 1] - j->ws->offset[e], j->ws, 1);
}

kiln_status kiln_moe_forward(const kiln_moe_cfg *c, const kiln_moe_layer *L, const float *X, int n, float *Y, kiln_moe_ws *ws) {
    const int E = c->n_experts, K = c->n_used, D = c->dim;
    if (n < 1 || n > ws->max_tokens) return kiln_fail(KILN_ERR_INTERNAL, "moe: batch of %d tokens (max %d)", n, ws->max_tokens);
    /* 1. route */
    kiln_matmul(&L->router, X, ws->logits, n);
    for (int i = 0; i < n; i++) {
        int ch = kiln_moe_route(c, ws->logits + (size_t)i * E, L->bias, ws->idx + (size_t)i * K, ws->wt + (size_t)i * K, ws->route_tmp);
        ws->n_routed_tokens++;
        ws->n_group_limited += ch;
    }
    /* 2. group (token, expert) pairs by expert: counting sort, stable in token order */
    memset(ws->count, 0, (size_t)E * sizeof(int));
    for (int s = 0; s < n * K; s++) ws->count[ws->idx[s]]++;
    ws->offset[0] = 0;
    int n_active = 0;
    for (int e = 0; e < E; e++) {
        ws->offset[e + 1] = ws->offset[e] + ws->count[e];
        if (ws->count[e]) ws->active[n_active++] = e;
    }
    memset(ws->count, 0, (size_t)E * sizeof(int));
    for (int s = 0; s < n * K; s++) {
        int e = ws->idx[s], row = ws->offset[e] + ws->count[e]++;
        ws->slot[s] = row;
        ws->slot_token[row] = s / K;
        memcpy(ws->xg + (size_t)row * D, X + (size_t)(s / K) * D, (size_t)D * sizeof(float));
    }
    /* 3. run the selected experts: threads across experts when there are enough of them, otherwise
     *    each expert's matmuls thread over rows. */
    int nt = omp_get_max_threads();
    if (nt > 1 && n_active >= nt) {
        expert_job job = {c, L, ws};
        kiln_pool_for(n_active, expert_task, &job, nt); /* kiln's worker pool, as the matmuls (base/pool.h) */
    } else {
        for (int a = 0; a < n_active; a++) {
            int e = ws->active[a];
            run_expert(c, L, e, ws->offset[e], ws->offset[e + 1] - ws->offset[e], ws, 0);
        }
    }
    /* 4. weighted combine, token by token in selection order (deterministic) */
    for (int i = 0; i < n; i++) {
        float *y = Y + (size_t)i * D;
        memset(y, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < K; j++) {
            const float *src = ws->yg + (size_t)ws->slot[i * K + j] * D;
            float w = ws->wt[i * K + j];
            for (int d = 0; d < D; d++) y[d] += w * src[d];
        }
    }
    /* 5. shared experts over every token */
    if (c->shared_ffn > 0) {
        const kiln_weight *w2[2] = {&L->sh_gate, &L->sh_up};
        float *y2[2] = {ws->sh, ws->su};
        kiln_matmul_many(w2, y2, 2, X, n);
        swiglu(ws->sh, ws->su, (size_t)n * c->shared_ffn);
        kiln_matmul(&L->sh_down, ws->sh, ws->sy, n);
        for (size_t j = 0; j < (size_t)n * D; j++) Y[j] += ws->sy[j];
    }
    return KILN_OK;
}
