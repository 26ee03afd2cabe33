#version 450
// kv_merge.comp — combines the context splits of kv_attend.comp: for each (query head, token),
// out = Σ_s acc_s · e^{m_s − M} / Σ_s l_s · e^{m_s − M}, M = max_s m_s (splits that saw nothing have
// l = 0 and add nothing; M starts at −FLT_MAX, not −inf: see kv_attend.comp's NO_SCORE). One workgroup of 64 per (query head, token), invocations
// over the output values.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Pb { float part[]; };
layout(std430, binding = 1) writeonly buffer Ob { float o[]; };
layout(std140, binding = 5) uniform P { uint n_heads, v_dim, splits, o_off; } p;

void main() {
    const uint hq = gl_WorkGroupID.x, i = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint row = i * p.n_heads + hq, stride = p.v_dim + 2u, pb = row * p.splits * stride;
    float M = uintBitsToFloat(0xff7fffffu);
    for (uint s = 0u; s < p.splits; s++)
        if (part[pb + s * stride + p.v_dim + 1u] > 0.0) M = max(M, part[pb + s * stride + p.v_dim]);
    float L = 0.0;
    for (uint s = 0u; s < p.splits; s++) {
        const float ls = part[pb + s * stride + p.v_dim + 1u];
        if (ls > 0.0) L += ls * exp(part[pb + s * stride + p.v_dim] - M);
    }
    const float inv = L > 0.0 ? 1.0 / L : 0.0;
    for (uint d = tid; d < p.v_dim; d += 64u) {
        float a = 0.0;
        for (uint s = 0u; s < p.splits; s++) {
            const float ls = part[pb + s * stride + p.v_dim + 1u];
            if (ls > 0.0) a += part[pb + s * stride + d] * exp(part[pb + s * stride + p.v_dim] - M);
        }
        o[p.o_off + row * p.v_dim + d] = a * inv;
    }
}
