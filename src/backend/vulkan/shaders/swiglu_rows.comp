#version 450
// swiglu_rows.comp — the fused gate_up weight's SwiGLU (backend.h matmul_swiglu, GLM's
// gate_up_proj): for row i = row0 + workgroup y and j < width (F),
// G[d_off + i·d_stride + j] = silu(S[s_off + i·s_stride + j]) · S[s_off + i·s_stride + width + j],
// S row i being [gate F | up F]. swiglu.comp's expression, as precise there: the floats of a
// swiglu per row followed by copy_rows, in one dispatch instead of n + 1.
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer Gb { float g[]; };
layout(std430, binding = 1) readonly buffer Sb { float s[]; };
layout(std140, binding = 5) uniform P { uint width, d_stride, s_stride, d_off, s_off, row0; } p;
void main() {
    const uint i = p.row0 + gl_WorkGroupID.y;
    for (uint j = gl_GlobalInvocationID.x; j < p.width; j += gl_NumWorkGroups.x * 64u) {
        precise const float v = s[p.s_off + i * p.s_stride + j];
        precise const float o = v / (1.0 + exp(-v)) * s[p.s_off + i * p.s_stride + p.width + j];
        g[p.d_off + i * p.d_stride + j] = o;
    }
}
