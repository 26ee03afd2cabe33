#version 450
// kv_index.comp — DeepSeek sparse attention's lightning-indexer scan over a pool of compact rows
// (kv/kv.h; the host's kiln_kv_index_topk_cx scan, kv/kv_sparse.c): for token i and each position
// t < lim_i of its sequence, score[i, t] = Σ_h fma-chained w'[h] · relu(dot_h), w'[h] = w[i, h] ×
// w_scale rounded to float, dot_h = Σ over the key's 128-value blocks of (scale × 256) · part, part
// = the fma chain over the block of q[i, h, e] · (code value × 2^-8) — the scalar kernel's
// (kiln_kv_index_scores_scalar) order, one position per invocation. Positions whose page entry
// names no page of the pool keep score −inf (never selected: the host never dereferences them).
// scores = 0 skips the scores (a layer that reuses another layer's selection only verifies).
//
// One workgroup of 64 per (unit of positions, token); hashing, a unit is lcm(64, page_tokens)
// positions, so that every page lies in one workgroup (64 otherwise). A dispatch scans the group
// of tokens tok0 + workgroup.y, whose scores are rows 0.. of the buffer (a long chunk's [tokens ×
// context] scores do not fit one binding: the host loops over groups, each followed by its
// kv_topk.comp). KV integrity (hash = 1): for the token that reads its sequence
// furthest (table word [3i + 2] = where its sums go; 0xffffffff for the others) each invocation
// hashes the whole row of its position (Σ key[w] × word[w] mod 2^64, w the word's index in the
// page's slice) and the workgroup adds the rows of each page into hs[hbase + slot × 2], which the
// host compares with the seals after the dispatch (kiln_kv_integ_check_sums), as it does for
// kv_attend.comp: a page is verified by the pass that reads it, before the step's output is used.
//
// Table (binding 2, uint words): token i at [3i] = its block-table start (ent_off + that), [3i + 1]
// = lim_i (pos + 1), [3i + 2] = its hash base; then the page ids; the hash keys at key_off.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Words { uint w[]; };
layout(std430, binding = 0) readonly buffer Qb { float q[]; };
layout(std430, binding = 1) readonly buffer Wb { float wt[]; };
layout(std430, binding = 2) readonly buffer Tb { uint tab[]; };
layout(std430, binding = 3) writeonly buffer Sb { float score[]; };
layout(std430, binding = 4) buffer Hb { uint64_t hs[]; };
layout(std140, binding = 5) uniform P {
    uint64_t kaddr;
    uint page_k, row_k, key_at, pt, unit, n_pages; // bytes, bytes, bytes, positions, positions
    uint d, hi, q_off, w_off, s_off, s_stride;     // values, heads, floats
    float w_scale;
    uint scores, hash, ent_off, key_off, tok0;
} p;
shared uint64_t rh[64];
shared uint64_t ps[64];

void main() {
    const uint u = gl_WorkGroupID.x, i = p.tok0 + gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint lim = tab[3u * i + 1u], hbase = tab[3u * i + 2u], ent = p.ent_off + tab[3u * i];
    const uint t0 = u * p.unit;
    if (t0 >= lim) return; // uniform in the workgroup
    const bool hashing = p.hash != 0u && hbase != 0xffffffffu;
    const uint words = p.row_k >> 2, slot0 = t0 / p.pt, npg = p.unit / p.pt;
    if (tid < npg) ps[tid] = 0ul;
    for (uint c = 0u; c < p.unit; c += 64u) {
        const uint t = t0 + c + tid;
        const uint pg = t < lim ? tab[ent + t / p.pt] : 0xffffffffu;
        const bool ok = t < lim && pg < p.n_pages;
        const uint64_t base = p.kaddr + uint64_t(pg) * p.page_k + uint64_t((t % p.pt) * p.row_k);
        if (p.scores != 0u && t < lim) {
            precise float sc = uintBitsToFloat(0xff800000u); // −inf
            if (ok) {
                Words r = Words(base + p.key_at);
                const uint qb = p.q_off + i * p.hi * p.d;
                sc = 0.0;
                for (uint h = 0u; h < p.hi; h++) {
                    precise float dt = 0.0;
                    for (uint b0 = 0u; b0 < p.d; b0 += 128u) {
                        precise float part = 0.0;
                        for (uint e = b0; e < b0 + 128u; e += 4u) {
                            const uint cw = r.w[e >> 2];
                            for (uint j = 0u; j < 4u; j++) {
                                const uint cd = (cw >> (8u * j)) & 0xffu;
                                const uint ex = (cd >> 3) & 15u, m = cd & 7u; // the code's value × 2^-8, from its bits (exact)
                                float kv = ex == 0u ? float(m) * uintBitsToFloat(0x37000000u) : uintBitsToFloat(((ex + 112u) << 23) | (m << 20));
                                if ((cd & 0x80u) != 0u) kv = -kv;
                                part = fma(q[qb + h * p.d + e + j], kv, part);
                            }
                        }
                        precise float s256 = uintBitsToFloat(r.w[(p.d + b0 / 32u) >> 2]) * 256.0;
                        dt = fma(s256, part, dt);
                    }
                    precise float wh = wt[p.w_off + i * p.hi + h] * p.w_scale;
                    sc = fma(wh, dt > 0.0 ? dt : 0.0, sc);
                }
            }
            score[p.s_off + gl_WorkGroupID.y * p.s_stride + t] = sc;
        }
        if (hashing) {
            uint64_t h = 0ul;
            if (ok) {
                Words r = Words(base);
                const uint w0 = (t % p.pt) * words;
                for (uint w = 0u; w < words; w++) h += uint64_t(tab[p.key_off + w0 + w]) * uint64_t(r.w[w]);
            }
            rh[tid] = h;
            barrier();
            if (tid < npg) { // page tid of the unit: its rows among these 64
                for (uint k = 0u; k < 64u; k++)
                    if ((t0 + c + k) / p.pt - slot0 == tid && t0 + c + k < lim) ps[tid] += rh[k];
            }
            barrier();
        }
    }
    if (hashing && tid < npg && (slot0 + tid) * p.pt < lim) hs[hbase + (slot0 + tid) * 2u] = ps[tid];
}
