#version 450
// moe_route.comp — the MoE router's selection on the device (backend/moe_route.h, the host's
// kiln_moe_route operation for operation): one workgroup of 64 per token. s = sigmoid(logit) through
// kiln_moe_sigmoid's double-precision evaluation (the same IEEE operations, so the same float as
// the host's: the device picks the same experts even at near ties), choice = s + bias; with a group
// limit the score of each group is the sum of its two largest choices, the topk_group best groups
// are kept and the others' choices set to 0.0; the n_used largest choices (ties: lowest index) are
// the experts, their weights s[idx] (normalised by their sum + 1e-20 when norm_topk_prob) ×
// routed_scale.
//
// Table (binding 1, uint words): token t's experts written at [ids_off + t·K + j], its weights (float
// bits) at [wt_off + t·K + j]; the correction bias (float bits) at [bias_off + e] when has_bias.
// Logits: binding 0, token t's E values from l_off + t·E.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Lb { float logit[]; };
layout(std430, binding = 1) buffer Tb { uint tab[]; };
layout(std140, binding = 5) uniform P {
    uint E, K, n_group, topk_group, norm, has_bias, l_off, ids_off, wt_off, bias_off;
    float routed_scale;
} p;
shared float choice[512];
shared float sgm[512];

// kiln_moe_sigmoid (backend/moe_route.c): the same constants and operations, in double precision.
float sigmoid_exact(float x) {
    precise double z = -double(x);
    if ((floatBitsToUint(x) & 0x7fffffffu) > 0x7f800000u) return x; // NaN by its bits: a compiler may assume none
    if (z > 88.0LF) return 0.0;
    if (z < -745.0LF) return 1.0;
    const double LOG2E = 1.4426950408889634LF, LN2_HI = 0.693145751953125LF, LN2_LO = 1.4286068203094173e-06LF;
    precise double k = floor(z * LOG2E + 0.5LF);
    precise double r = (z - k * LN2_HI) - k * LN2_LO;
    const double inv_fact[14] = double[14](1.0LF, 1.0LF, 0.5LF, 0.16666666666666666LF, 0.041666666666666664LF, 0.008333333333333333LF,
                                           0.001388888888888889LF, 0.0001984126984126984LF, 2.48015873015873e-05LF, 2.7557319223985893e-06LF,
                                           2.755731922398589e-07LF, 2.505210838544172e-08LF, 2.08767569878681e-09LF, 1.6059043836821613e-10LF);
    precise double q = inv_fact[13];
    for (int i = 12; i >= 0; i--) q = q * r + inv_fact[i];
    precise double e = ldexp(q, int(k));
    precise double s = 1.0LF / (1.0LF + e);
    if (s < 1.1754943508222875e-38LF) return 0.0;
    return float(s);
}

// Thread 0 selects (E ≤ 512, K and the groups ≤ 64: a few thousand comparisons) with the host's
// top_k: the k largest (ties: lowest index first), in descending order.
void main() {
    const uint t = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x, E = p.E, K = p.K;
    for (uint e = tid; e < E; e += 64u) {
        const float s = sigmoid_exact(logit[p.l_off + t * E + e]);
        sgm[e] = s;
        precise float c = s + (p.has_bias != 0u ? uintBitsToFloat(tab[p.bias_off + e]) : 0.0);
        choice[e] = c;
    }
    barrier();
    if (tid != 0u) return;
    if (p.n_group > 1u && p.topk_group < p.n_group) {
        const uint per = E / p.n_group;
        float gscore[64];
        for (uint g = 0u; g < p.n_group; g++) {
            const uint b = g * per;
            uint i1 = 0u;
            for (uint i = 1u; i < per; i++) if (choice[b + i] > choice[b + i1]) i1 = i;
            uint i2 = i1 == 0u ? 1u : 0u;
            for (uint i = 0u; i < per; i++) if (i != i1 && choice[b + i] > choice[b + i2]) i2 = i;
            precise float gs = choice[b + i1] + choice[b + i2];
            gscore[g] = gs;
        }
        const uint ng = min(p.topk_group, 64u);
        uint gsel[64];
        for (uint j = 0u; j < ng; j++) {
            int best = -1;
            for (uint g = 0u; g < p.n_group; g++) {
                bool taken = false;
                for (uint q = 0u; q < j; q++) if (gsel[q] == g) taken = true;
                if (taken) continue;
                if (best < 0 || gscore[g] > gscore[uint(best)]) best = int(g);
            }
            gsel[j] = uint(best);
        }
        for (uint g = 0u; g < p.n_group; g++) {
            bool keep = false;
            for (uint q = 0u; q < ng; q++) if (gsel[q] == g) keep = true;
            if (!keep) for (uint i = 0u; i < per; i++) choice[g * per + i] = 0.0;
        }
    }
    uint idx[64];
    for (uint j = 0u; j < K; j++) {
        int best = -1;
        for (uint i = 0u; i < E; i++) {
            bool taken = false;
            for (uint q = 0u; q < j; q++) if (idx[q] == i) taken = true;
            if (taken) continue;
            if (best < 0 || choice[i] > choice[uint(best)]) best = int(i);
        }
        idx[j] = uint(best);
    }
    float w[64];
    precise float sum = 0.0;
    for (uint j = 0u; j < K; j++) {
        w[j] = sgm[idx[j]];
        sum += w[j];
    }
    precise float den = sum + 1e-20;
    for (uint j = 0u; j < K; j++) {
        precise float v = w[j];
        // float division is not correctly rounded in Vulkan (2.5 ulp): in double, then rounded once
        // (exact for a quotient of floats: double has more than 2·24 + 2 bits)
        if (p.norm != 0u) v = float(double(v) / double(den));
        v = v * p.routed_scale;
        tab[p.ids_off + t * K + j] = idx[j];
        tab[p.wt_off + t * K + j] = floatBitsToUint(v);
    }
}
