#version 450
#ifdef SG
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
// rmsnorm.comp — out[row, i] = w[i] · (ss · x[row, i]), ss = 1 / sqrt(mean(x²) + eps): one
// workgroup per row, Σx² as a tree sum in shared memory (-DSG: subgroup sums). out may be x (each invocation reads its
// elements before the barrier that precedes any write).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Ob { float o[]; };
layout(std430, binding = 1) buffer Xb { float x[]; };
layout(std430, binding = 2) readonly buffer Wb { float w[]; };
// add != 0 (the backend's add_rmsnorm): x[row, i] += d[row, i] first, written back, and the norm is
// of the sums — the floats of the add op followed by this one (out is then neither x nor d)
layout(std430, binding = 3) readonly buffer Db { float d[]; };
layout(std140, binding = 5) uniform P { uint width, o_off, x_off, w_off; float eps; uint d_off, add; } p;
shared float part[64];
void main() {
    const uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint xb = p.x_off + row * p.width, ob = p.o_off + row * p.width;
    // eight loads in flight per invocation before their squares (one workgroup per row: at decode a
    // dependent load per element made this dispatch latency-bound on a GPU); the sum still takes
    // elements tid, tid + 64, ... in order (the padding adds +0)
    float acc = 0.0;
    for (uint i0 = tid; i0 < p.width; i0 += 512u) {
        float a[8];
        for (uint c = 0u; c < 8u; c++) a[c] = i0 + 64u * c < p.width ? x[xb + i0 + 64u * c] : 0.0;
        if (p.add != 0u) {
            float e[8];
            const uint db = p.d_off + row * p.width;
            for (uint c = 0u; c < 8u; c++) e[c] = i0 + 64u * c < p.width ? d[db + i0 + 64u * c] : 0.0;
            for (uint c = 0u; c < 8u; c++) {
                precise float sum = a[c] + e[c];
                a[c] = sum;
                if (i0 + 64u * c < p.width) x[xb + i0 + 64u * c] = sum; // this invocation's own elements
            }
        }
        for (uint c = 0u; c < 8u; c++) acc += a[c] * a[c];
    }
#ifdef SG
    // subgroup variant (sgrmsnorm.spv): each subgroup's sum, then the subgroups' in order
    const float s = subgroupAdd(acc);
    if (subgroupElect()) part[gl_SubgroupID] = s;
    barrier();
    float total = part[0];
    for (uint i = 1u; i < gl_NumSubgroups; i++) total += part[i];
    const float ss = 1.0 / sqrt(total / float(p.width) + p.eps);
#else
    part[tid] = acc;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h) part[tid] += part[tid + h];
        barrier();
    }
    const float ss = 1.0 / sqrt(part[0] / float(p.width) + p.eps);
#endif
    for (uint i0 = tid; i0 < p.width; i0 += 512u) {
        float a[8], b[8];
        for (uint c = 0u; c < 8u; c++) {
            const uint i = i0 + 64u * c;
            a[c] = i < p.width ? x[xb + i] : 0.0;
            b[c] = i < p.width ? w[p.w_off + i] : 0.0;
        }
        for (uint c = 0u; c < 8u; c++)
            if (i0 + 64u * c < p.width) o[ob + i0 + 64u * c] = b[c] * (ss * a[c]);
    }
}
