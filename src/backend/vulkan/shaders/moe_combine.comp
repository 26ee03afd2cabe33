#version 450
// moe_combine.comp — Y[i, :] = Σ_j wt[i·K + j] · yg[slot[i·K + j], :] over the K experts of token i,
// in selection order, each product rounded and then added (precise: no fused multiply-add), as the
// host's combine computes it: the same floats bit for bit. One workgroup of 64 per token,
// invocations over the dim values.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Gb { float yg[]; };
layout(std430, binding = 1) writeonly buffer Yb { float y[]; };
layout(std430, binding = 2) readonly buffer Sb { int slot[]; };
layout(std430, binding = 3) readonly buffer Wb { float wt[]; };
layout(std140, binding = 5) uniform P { uint K, dim, g_off, y_off, s_off, w_off; } p;

void main() {
    const uint i = gl_WorkGroupID.x;
    for (uint d = gl_LocalInvocationID.x; d < p.dim; d += 64u) {
        precise float acc = 0.0;
        for (uint j = 0u; j < p.K; j++) {
            precise float prod = wt[p.w_off + i * p.K + j] * yg[p.g_off + uint(slot[p.s_off + i * p.K + j]) * p.dim + d];
            acc = acc + prod;
        }
        y[p.y_off + i * p.dim + d] = acc;
    }
}
