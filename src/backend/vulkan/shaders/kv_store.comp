#version 450
// kv_store.comp — the KV store on the device: token i's K (and V) rows written into its page of the
// pool's layer arrays (kv/kv.h layout [page][KV head][page_tokens][row]) through buffer device
// addresses, converted exactly as the host's kiln_kv_store_cx converts them (compiled once per
// stored dtype: -DDT=0 F32 (the bits), 1 BF16 (round to nearest even, NaN kept quiet), 2 FP8 E4M3
// with the (layer, head) static scale (x × inv rounded to float, then kiln_kv_f32_to_fp8: RNE,
// saturating at ±448, NaN → 0)); one workgroup of 64 per (K/V head, token), consecutive
// invocations writing consecutive 32-bit words of the row.
//
// KV integrity (hash = 1): the workgroup also computes the row's content hash from the words it
// writes — Σ key[w] × word[w] mod 2^64, w the word's index inside the (page, head) slice (row `off`
// starts at word off × row words), the keys at tab[key_off ..] — into hs[(i × kinds + kind) × H +
// head]; the host folds it into the slice's seal after the dispatch has run
// (kv/integrity.h kiln_kv_integ_store_end): the seal is computed where the row is written.
//
// Table (binding 2, uint words): token i's page at [3i] (0xffffffff: nothing stored, as the host
// never dereferences a page outside the pool), its row in the page at [3i + 1], at [3i + 2] the
// unit (kind × H + head) whose row is hashed but not written — the integrity campaign's lost write,
// a row that never reaches memory (0xffffffff: none); the FP8 factors
// 1 / scale of KV head h at [sc_off + 2h] (K) and [+ 1] (V), as float bits; with K smoothing
// (mu_off != 0: FP8 pools with key means, kv/kv.h k_mean) the layer's means [KV heads][k_dim] at
// mu_off, subtracted from the K values before the scale (x − μ, rounded, then × 1/scale: the host's
// order).
#extension GL_EXT_buffer_reference : require
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 4) writeonly buffer Words { uint w[]; };
layout(std430, binding = 0) readonly buffer Kb { uint kx[]; };
layout(std430, binding = 1) readonly buffer Vb { uint vx[]; };
layout(std430, binding = 2) readonly buffer Tb { uint tab[]; };
layout(std430, binding = 3) writeonly buffer Hb { uint64_t hs[]; };
layout(std140, binding = 5) uniform P {
    uint64_t kaddr, vaddr;
    uint page_k, head_k, row_k, page_v, head_v, row_v; // bytes
    uint k_dim, v_dim, kv_heads, kinds;
    uint k_tok, v_tok, k_off, v_off;                    // floats: token stride, the binding's first
    uint sc_off, key_off, hash, mu_off;
} p;
shared uint64_t red[64];

// kiln_f32_to_bf16 (base/fp.h) on the float's bits.
uint bf16(uint u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

#include "fp8.glsl"

uint src(uint kind, uint idx) { return kind == 0u ? kx[idx] : vx[idx]; }

void main() {
    const uint kind = gl_WorkGroupID.x / p.kv_heads, h = gl_WorkGroupID.x % p.kv_heads, i = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint pg = tab[3u * i], off = tab[3u * i + 1u];
    const bool lost = tab[3u * i + 2u] == gl_WorkGroupID.x;
    if (pg == 0xffffffffu) return; // uniform in the workgroup
    const uint dim = kind == 0u ? p.k_dim : p.v_dim, row = kind == 0u ? p.row_k : p.row_v, words = row >> 2;
    const uint64_t addr = kind == 0u ? p.kaddr + uint64_t(pg) * p.page_k + uint64_t(h * p.head_k + off * p.row_k)
                                     : p.vaddr + uint64_t(pg) * p.page_v + uint64_t(h * p.head_v + off * p.row_v);
    const uint x0 = kind == 0u ? p.k_off + i * p.k_tok + h * dim : p.v_off + i * p.v_tok + h * dim;
    const float inv = uintBitsToFloat(tab[p.sc_off + 2u * h + kind]);
    Words r = Words(addr);
    uint64_t acc = 0ul;
    for (uint w = tid; w < words; w += 64u) {
#if DT == 0
        const uint word = src(kind, x0 + w);
#elif DT == 1
        const uint word = bf16(src(kind, x0 + 2u * w)) | (bf16(src(kind, x0 + 2u * w + 1u)) << 16);
#else
        uint word = 0u;
        for (uint j = 0u; j < 4u; j++) {
            precise float x = uintBitsToFloat(src(kind, x0 + 4u * w + j));
            if (kind == 0u && p.mu_off != 0u) x = x - uintBitsToFloat(tab[p.mu_off + h * p.k_dim + 4u * w + j]);
            precise float y = x * inv;
            word |= fp8(y) << (8u * j);
        }
#endif
        if (!lost) r.w[w] = word;
        if (p.hash != 0u) acc += uint64_t(tab[p.key_off + off * words + w]) * uint64_t(word);
    }
    if (p.hash == 0u) return;
    red[tid] = acc;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    if (tid == 0u) hs[(i * p.kinds + kind) * p.kv_heads + h] = red[0];
}
