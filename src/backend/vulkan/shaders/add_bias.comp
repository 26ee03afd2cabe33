#version 450
// add_bias.comp — y[row, j] += b[j] over rows × width elements (from element base of this dispatch).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Yb { float y[]; };
layout(std430, binding = 1) readonly buffer Bb { float b[]; };
layout(std140, binding = 5) uniform P { uint len, y_off, b_off, base, width; } p;
void main() {
    const uint i = p.base + gl_GlobalInvocationID.x;
    if (i < p.len) y[p.y_off + i] += b[p.b_off + i % p.width];
}
