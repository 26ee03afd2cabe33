#version 450
// rope.comp — rotates pairs (a, b) of the first rot values of each head: a = 2i, b = 2i + 1 (NORM)
// or a = i, b = i + rot/2 (NEOX); x_a' = x_a·c − x_b·s, x_b' = x_b·c + x_a·s with c, s from the
// token's cos/sin row cs [rot] (cos of pair i at i, sin at rot/2 + i). `precise`: no fused
// multiply-add, so the results equal the C reference's bit for bit.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Xb { float x[]; };
layout(std430, binding = 1) readonly buffer Cb { float cs[]; };
layout(std140, binding = 5) uniform P { uint x_off, row_stride, n_heads, head_stride, rot, neox, cs_off, pairs_total; } p;
void main() {
    const uint g = gl_GlobalInvocationID.x;   // pair index over (token, head, pair)
    if (g >= p.pairs_total) return;
    const uint half_ = p.rot / 2u;
    const uint i = g % half_, h = (g / half_) % p.n_heads, t = g / (half_ * p.n_heads);
    const uint base = p.x_off + t * p.row_stride + h * p.head_stride;
    const uint a = p.neox != 0u ? i : 2u * i, b = p.neox != 0u ? i + half_ : 2u * i + 1u;
    const float c = cs[p.cs_off + t * p.rot + i], s = cs[p.cs_off + t * p.rot + half_ + i];
    const float x0 = x[base + a], x1 = x[base + b];
    precise float ya = x0 * c - x1 * s;
    precise float yb = x1 * c + x0 * s;
    x[base + a] = ya;
    x[base + b] = yb;
}
