#version 450
// layernorm.comp — out[row, i] = (x[row, i] − mean) · inv · w[i] + b[i] (b: has_b), inv = 1 /
// sqrt(var + eps), var the biased variance (torch's layer_norm; the host's
// kiln_be_common_layernorm): one workgroup of 64 per row, the mean and then the variance of the
// centred values as tree sums in shared memory. out may be x (the row is read whole before the
// barrier that precedes any write).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Ob { float o[]; };
layout(std430, binding = 1) readonly buffer Xb { float x[]; };
layout(std430, binding = 2) readonly buffer Wb { float w[]; };
layout(std430, binding = 3) readonly buffer Bb { float b[]; };
layout(std140, binding = 5) uniform P { uint width, o_off, x_off, w_off, b_off, has_b; float eps; } p;
shared float part[64];

float total(float v) {
    const uint tid = gl_LocalInvocationID.x;
    part[tid] = v;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h) part[tid] += part[tid + h];
        barrier();
    }
    const float t = part[0];
    barrier(); // every invocation has read part[0] before the next total writes part
    return t;
}

void main() {
    const uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint xb = p.x_off + row * p.width, ob = p.o_off + row * p.width;
    float acc = 0.0;
    for (uint i = tid; i < p.width; i += 64u) acc += x[xb + i];
    const float mean = total(acc) / float(p.width);
    acc = 0.0;
    for (uint i = tid; i < p.width; i += 64u) {
        const float d = x[xb + i] - mean;
        acc += d * d;
    }
    const float inv = 1.0 / sqrt(total(acc) / float(p.width) + p.eps);
    for (uint i = tid; i < p.width; i += 64u) {
        precise float y = (x[xb + i] - mean) * inv * w[p.w_off + i];
        if (p.has_b != 0u) y += b[p.b_off + i];
        o[ob + i] = y;
    }
}
