#version 450
// layernorm.comp — out[row, i] = (x[row, i] − mean) · inv · w[i] + b[i] (b: has_b, else + 0.0), inv
// = 1 / sqrt(var + eps), var the biased variance (torch's layer_norm), operation for operation the
// host's kiln_be_common_layernorm, so that the indexer key — FP8-rounded next, where a last-bit
// difference can flip a code — is the host's bits: invocation 0 sums the row and then the squares
// of the centred values in index order (precise: no reassociation, no fma contraction; a row is
// the indexer's 128 values), the other 63 write the outputs. -DF64 (layernorm64, devices with
// shaderFloat64): the divisions and the square root in double, rounded once to float, which is
// the correctly rounded float result (a double has more than 2 × 24 + 2 bits: double rounding is
// innocuous for + − × ÷ √) whatever the device's float division / sqrt precision (2.5 ULP and
// "inherited" by the Vulkan spec). Without it, the float operations (exact on lavapipe; on a GPU a
// last-bit difference now and then). One workgroup of 64 per row; out may be x (the row is read
// whole before the barrier that precedes any write).
#ifdef F64
#extension GL_ARB_gpu_shader_fp64 : enable
#endif
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Ob { float o[]; };
layout(std430, binding = 1) readonly buffer Xb { float x[]; };
layout(std430, binding = 2) readonly buffer Wb { float w[]; };
layout(std430, binding = 3) readonly buffer Bb { float b[]; };
layout(std140, binding = 5) uniform P { uint width, o_off, x_off, w_off, b_off, has_b; float eps; } p;
shared float sh_mean, sh_inv;

// a / c rounded to float as IEEE division does
float div_rn(float a, float c) {
#ifdef F64
    return float(double(a) / double(c));
#else
    return a / c;
#endif
}

void main() {
    const uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint xb = p.x_off + row * p.width, ob = p.o_off + row * p.width;
    if (tid == 0u) {
        precise float mean = 0.0;
        for (uint i = 0u; i < p.width; i++) mean += x[xb + i];
        mean = div_rn(mean, float(p.width));
        precise float var = 0.0;
        for (uint i = 0u; i < p.width; i++) {
            precise float d = x[xb + i] - mean;
            precise float d2 = d * d;
            var += d2;
        }
        var = div_rn(var, float(p.width));
        precise float ve = var + p.eps;
#ifdef F64
        const float root = float(sqrt(double(ve)));
#else
        const float root = sqrt(ve);
#endif
        sh_mean = mean;
        sh_inv = div_rn(1.0, root);
    }
    barrier();
    const float mean = sh_mean, inv = sh_inv;
    for (uint i = tid; i < p.width; i += 64u) {
        precise float c = x[xb + i] - mean;
        precise float ci = c * inv;
        precise float y = ci * w[p.w_off + i];
        y += p.has_b != 0u ? b[p.b_off + i] : 0.0;
        o[ob + i] = y;
    }
}
