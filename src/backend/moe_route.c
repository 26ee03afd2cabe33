/* moe_route.c — the MoE router's per-token expert selection (moe_route.h). */
#include "backend/moe_route.h"
#include <math.h>
#include <stddef.h>

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

float kiln_moe_sigmoid(float x) {
    const double z = -(double)x;
    if (z != z) return x;                 /* NaN stays NaN */
    if (z > 88.0) return 0.0f;            /* 1 / (1 + e^z) < e^-88 < FLT_MIN (and ×2^k stays in range) */
    if (z < -745.0) return 1.0f;          /* e^z below double's subnormals: 1 / (1 + 0) */
    /* z = k·ln2 + r, |r| ≤ ln2 / 2 + ε: ln2 in two parts (the high one has 21 significant bits, so
     * k · LN2_HI is exact for |k| < 2^32) */
    const double LOG2E = 1.4426950408889634, LN2_HI = 0.693145751953125, LN2_LO = 1.4286068203094173e-06;
    const double k = floor(z * LOG2E + 0.5);
    const double r = (z - k * LN2_HI) - k * LN2_LO;
    /* e^r: Taylor series to degree 13, Horner (truncation below 1e-17 relative for |r| ≤ 0.35) */
    static const double inv_fact[14] = {1.0, 1.0, 0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
                                        0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05, 2.7557319223985893e-06,
                                        2.755731922398589e-07, 2.505210838544172e-08, 2.08767569878681e-09, 1.6059043836821613e-10};
    double p = inv_fact[13];
    for (int i = 12; i >= 0; i--) p = p * r + inv_fact[i];
    const double e = ldexp(p, (int)k);
    const double s = 1.0 / (1.0 + e);
    if (s < 1.1754943508222875e-38) return 0.0f; /* below FLT_MIN */
    return (float)s;
}

int kiln_moe_route(const kiln_moe_cfg *c, const float *logits, const float *bias, int *idx, float *w, float *tmp) {
    const int E = c->n_experts, K = c->n_used;
    float *choice = tmp, *gscore = tmp + E;
    for (int e = 0; e < E; e++) {
        float s = kiln_moe_sigmoid(logits[e]);
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
        w[j] = kiln_moe_sigmoid(logits[idx[j]]);
        sum += w[j];
    }
    if (c->norm_topk_prob) {
        float den = sum + 1e-20f;
        for (int j = 0; j < K; j++) w[j] /= den;
    }
    for (int j = 0; j < K; j++) w[j] *= c->routed_scale;
    return changed;
}

