#version 450
// membw.comp — the device's read bandwidth (kiln bench --device vulkan): each workgroup of 256
// reads per_wg consecutive 16-byte vectors of the bound range (consecutive invocations read
// consecutive vectors) and folds them with xor; the fold is stored only when it equals a constant,
// so the loads cannot be optimised away while almost nothing is written.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Sb { uvec4 v[]; };
layout(std430, binding = 1) writeonly buffer Ob { uint o[]; };
layout(std140, binding = 5) uniform P { uint n, per_wg; } p;

void main() {
    const uint base = gl_WorkGroupID.x * p.per_wg;
    uvec4 a = uvec4(0u);
    for (uint k = gl_LocalInvocationID.x; k < p.per_wg; k += 256u) {
        const uint i = base + k;
        if (i < p.n) a ^= v[i];
    }
    const uint r = a.x ^ a.y ^ a.z ^ a.w;
    if (r == 0x9e3779b9u) o[gl_WorkGroupID.x & 255u] = r;
}
