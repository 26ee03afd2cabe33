#version 450
// swiglu.comp — g[i] = g[i] / (1 + e^-g[i]) · u[i] for i < len.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Gb { float g[]; };
layout(std430, binding = 1) readonly buffer Ub { float u[]; };
layout(std140, binding = 5) uniform P { uint len, g_off, u_off, base; } p;
void main() {
    const uint i = p.base + gl_GlobalInvocationID.x;
    if (i < p.len) {
        // precise: the same operations, uncontracted, as matmul.comp's PAIR variant (gate, up and
        // this in one dispatch), so that the two give the same floats
        precise const float v = g[p.g_off + i];
        precise const float o = v / (1.0 + exp(-v)) * u[p.u_off + i];
        g[p.g_off + i] = o;
    }
}
