#version 450
// rope.comp — rotates pairs (a, b) of the first rot values of each head: a = 2i, b = 2i + 1 (NORM)
// or a = i, b = i + rot/2 (NEOX); x_a' = x_a·c − x_b·s, x_b' = x_b·c + x_a·s with c, s from the
// token's cos/sin row cs [rot] (cos of pair i at i, sin at rot/2 + i). `precise`: no fused
// multiply-add, so the results equal the C reference's bit for bit.
//
// Two tensors in one dispatch (the backend's rope2: Q and K): pairs [0, pairs_a) are x's (n_heads,
// row_stride from x_off), pairs [pairs_a, pairs_total) x2's (n_heads2, row_stride2 from x2_off);
// one tensor: pairs_a = pairs_total.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Xb { float x[]; };
layout(std430, binding = 1) readonly buffer Cb { float cs[]; };
layout(std430, binding = 2) buffer X2b { float x2[]; };
layout(std140, binding = 5) uniform P {
    uint x_off, row_stride, n_heads, head_stride, rot, neox, cs_off, pairs_total;
    uint pairs_a, x2_off, row_stride2, n_heads2;
} p;
void main() {
    const uint g0 = gl_GlobalInvocationID.x;  // pair index over (tensor, token, head, pair)
    if (g0 >= p.pairs_total) return;
    const bool second = g0 >= p.pairs_a;
    const uint g = second ? g0 - p.pairs_a : g0, nh = second ? p.n_heads2 : p.n_heads;
    const uint half_ = p.rot / 2u;
    const uint i = g % half_, h = (g / half_) % nh, t = g / (half_ * nh);
    const uint base = (second ? p.x2_off + t * p.row_stride2 : p.x_off + t * p.row_stride) + h * p.head_stride;
    const uint a = p.neox != 0u ? i : 2u * i, b = p.neox != 0u ? i + half_ : 2u * i + 1u;
    const float c = cs[p.cs_off + t * p.rot + i], s = cs[p.cs_off + t * p.rot + half_ + i];
    const float x0 = second ? x2[base + a] : x[base + a], x1 = second ? x2[base + b] : x[base + b];
    precise float ya = x0 * c - x1 * s;
    precise float yb = x1 * c + x0 * s;
    if (second) {
        x2[base + a] = ya;
        x2[base + b] = yb;
        return;
    }
    x[base + a] = ya;
    x[base + b] = yb;
}
