#version 450
// kv_attend_sparse.comp — DeepSeek sparse attention over the positions the indexer selected (the
// host's kiln_kv_attend_sparse_cx, kv/kv_sparse.c): for token i and query head h, softmax(scale ·
// q · k_t) over the selected positions t (sel[i · topk ..], nsel[i] of them) weighting the first
// v_dim values of each row. Rows are DSA compact rows (kv/kv.h) read where they lie through buffer
// device addresses: the latent's E4M3 codes × their block's scale (exact, as the host decodes
// them), the rope part from f32 or bf16; k = [latent | rope] (kq = lat + rope values), v = the
// latent's first v_dim values. One workgroup of 64 per (query head, token): blocks of 64 selected
// positions, one position's score per invocation (q from shared memory), an online softmax (as
// kv_attend.comp), each invocation accumulating its own output values d = tid, tid + 64, ...
//
// Table (binding 2, uint words): token i's block-table start at [3i] (ent_off + that), the positions
// it sees (pos + 1: a selected position outside them is never read) at [3i + 1]; then the
// page ids (out of [0, n_pages): the position is skipped, as the host never dereferences it).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Words { uint w[]; };
layout(std430, binding = 0) readonly buffer Qb { float q[]; };
layout(std430, binding = 1) writeonly buffer Ob { float o[]; };
layout(std430, binding = 2) readonly buffer Tb { uint tab[]; };
layout(std430, binding = 3) readonly buffer Sb { int sel[]; };
layout(std430, binding = 4) readonly buffer Nb { int nsel[]; };
layout(std140, binding = 5) uniform P {
    uint64_t kaddr;
    uint page_k, row_k, pt, n_pages;          // bytes, bytes, positions
    uint lat, rope, rope_bf16, v_dim, n_heads; // values
    uint topk, q_off, o_off, sel_off, nsel_off, ent_off;
    float scale;
} p;
#define MAX_VPT 16
shared float qs[1024];
shared float ps[64];

#include "fp8.glsl"

// q · k_t over the row at r: the latent block by block (codes' values, then × the block's scale),
// then the rope part.
float row_dot(Words r) {
    float dot = 0.0;
    for (uint b0 = 0u; b0 < p.lat; b0 += 128u) {
        float part = 0.0;
        for (uint e = b0; e < b0 + 128u; e += 4u) {
            const uint cw = r.w[e >> 2];
            for (uint j = 0u; j < 4u; j++) part += qs[e + j] * fp8_value((cw >> (8u * j)) & 0xffu);
        }
        dot += part * uintBitsToFloat(r.w[p.lat / 4u + b0 / 128u]);
    }
    const uint rw = p.lat / 4u + p.lat / 128u; // the rope part's first word
    for (uint j = 0u; j < p.rope; j++) {
        const float kv = p.rope_bf16 != 0u ? uintBitsToFloat(((r.w[rw + j / 2u] >> (16u * (j & 1u))) & 0xffffu) << 16) : uintBitsToFloat(r.w[rw + j]);
        dot += qs[p.lat + j] * kv;
    }
    return dot;
}

// NO_SCORE: "no score yet / no readable position", the running maximum's start. Finite (−FLT_MAX)
// rather than −inf: Vulkan lets a compiler assume no infinities or NaNs unless a shader declares
// SignedZeroInfNanPreserve, so no result may rest on −inf arithmetic; exp(NO_SCORE − m) is 0 for
// any real m as exp(−inf) is.
#define NO_SCORE uintBitsToFloat(0xff7fffffu)

void main() {
    const uint hq = gl_WorkGroupID.x, i = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint ent0 = p.ent_off + tab[3u * i], lim = tab[3u * i + 1u], kq = p.lat + p.rope;
    const uint m_sel = uint(max(nsel[p.nsel_off + i], 0));
    const uint qb = p.q_off + (i * p.n_heads + hq) * kq;
    for (uint d = tid; d < kq; d += 64u) qs[d] = q[qb + d];
    barrier();
    float m = NO_SCORE, l = 0.0;
    float acc[MAX_VPT];
    for (uint k = 0u; k < MAX_VPT; k++) acc[k] = 0.0;
    for (uint b = 0u; b < m_sel; b += 64u) {
        const uint nb = min(64u, m_sel - b);
        float s = NO_SCORE;
        if (tid < nb) {
            const uint t = uint(sel[p.sel_off + i * p.topk + b + tid]); // a position outside [0, lim): never read
            const uint pg = t < lim ? tab[ent0 + t / p.pt] : 0xffffffffu;
            if (pg < p.n_pages) s = row_dot(Words(p.kaddr + uint64_t(pg) * p.page_k + uint64_t((t % p.pt) * p.row_k))) * p.scale;
        }
        ps[tid] = s;
        barrier();
        float mb = NO_SCORE;
        for (uint j = 0u; j < nb; j++) mb = max(mb, ps[j]);
        const float mn = max(m, mb);
        barrier();
        if (mn == NO_SCORE) continue; // nothing readable yet: uniform across the group
        const float f = exp(m - mn);    // m = NO_SCORE → 0
        ps[tid] = tid < nb ? exp(s - mn) : 0.0;
        barrier();
        float bl = 0.0;
        for (uint j = 0u; j < nb; j++) bl += ps[j];
        l = l * f + bl;
        for (uint k = 0u; k < MAX_VPT; k++) acc[k] *= f;
        for (uint j = 0u; j < nb; j++) {
            const float pj = ps[j];
            if (pj == 0.0) continue;
            const uint t = uint(sel[p.sel_off + i * p.topk + b + j]);
            if (t >= lim) continue; // checked again, not inferred from pj: never a wild address
            const uint pg = tab[ent0 + t / p.pt];
            if (pg >= p.n_pages) continue;
            Words r = Words(p.kaddr + uint64_t(pg) * p.page_k + uint64_t((t % p.pt) * p.row_k));
            for (uint k = 0u; k < MAX_VPT; k++) {
                const uint d = tid + 64u * k;
                if (d < p.v_dim)
                    acc[k] += pj * (fp8_value((r.w[d >> 2] >> (8u * (d & 3u))) & 0xffu) * uintBitsToFloat(r.w[p.lat / 4u + d / 128u]));
            }
        }
        m = mn;
        barrier();
    }
    const float inv = l > 0.0 ? 1.0 / l : 0.0;
    const uint ob = p.o_off + (i * p.n_heads + hq) * p.v_dim;
    for (uint k = 0u; k < MAX_VPT; k++) {
        const uint d = tid + 64u * k;
        if (d < p.v_dim) o[ob + d] = acc[k] * inv;
    }
}
