#version 450
#extension GL_GOOGLE_include_directive : require
// fp8_round.comp — DeepSeek sparse attention's act_quant in place over x [rows, width] (width a
// multiple of 128), bit for bit the host's kiln_be_common_fp8_round: with hadamard (width a power
// of two, at most 2048) first x ← H x · norm, H the Sylvester Hadamard matrix by the fast
// Walsh–Hadamard transform in shared memory (the host's butterflies, each a + c and a − c of the
// same two values, so the same bits whatever the order of the stages' pairs) and norm = 1 /
// sqrt(width) as the host's float; then every 128-value block is rounded through E4M3 with its
// power-of-two scale s: x ← fp8(x / s) · s. One workgroup of 128 per row, one value of a block per
// invocation.
layout(local_size_x = 128) in;
layout(std430, binding = 0) buffer Xb { float x[]; };
layout(std140, binding = 5) uniform P { uint width, x_off, hadamard; float norm; } p;
shared float v[2048];
shared float red[128];

#include "fp8.glsl"

void main() {
    const uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x, xb = p.x_off + row * p.width;
    if (p.hadamard != 0u) {
        for (uint i = tid; i < p.width; i += 128u) v[i] = x[xb + i];
        barrier();
        for (uint len = 1u; len < p.width; len <<= 1) {
            for (uint k = tid; k < p.width / 2u; k += 128u) { // pair k: j = its block's start + its offset
                const uint j = (k / len) * 2u * len + k % len;
                const float a = v[j], c = v[j + len];
                v[j] = a + c;
                v[j + len] = a - c;
            }
            barrier();
        }
        for (uint i = tid; i < p.width; i += 128u) {
            precise float y = v[i] * p.norm;
            v[i] = y;
        }
        barrier();
    }
    for (uint b0 = 0u; b0 < p.width; b0 += 128u) {
        const float val = p.hadamard != 0u ? v[b0 + tid] : x[xb + b0 + tid];
        red[tid] = (floatBitsToUint(val) & 0x7fffffffu) > 0x7f800000u ? 0.0 : abs(val); // NaN by its bits (a compiler may assume none): the host's fmaxf skips it (fp8() stores it as 0)
        barrier();
        for (uint h = 64u; h > 0u; h >>= 1) {
            if (tid < h) red[tid] = max(red[tid], red[tid + h]);
            barrier();
        }
        const float s = block_scale(red[0]);
        const float inv = block_inv(s);
        barrier();
        precise float y = val * inv;
        precise float r = fp8_value(fp8(y)) * s;
        x[xb + b0 + tid] = r;
    }
}
