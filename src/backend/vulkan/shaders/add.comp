#version 450
// add.comp — y[i] += x[i] for i < len (from element base of this dispatch).
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Yb { float y[]; };
layout(std430, binding = 1) readonly buffer Xb { float x[]; };
layout(std140, binding = 5) uniform P { uint len, y_off, x_off, base; } p;
void main() {
    const uint i = p.base + gl_GlobalInvocationID.x;
    if (i < p.len) y[p.y_off + i] += x[p.x_off + i];
}
