#version 450
// kv_store_dsa.comp — the KV store of DeepSeek sparse attention's compact rows (kv/kv.h; the host's
// store_dsa_row in kv/kv.c, byte for byte): token i's row x = [latent (lat) | rope (rope) | indexer
// key (key)] floats becomes [latent as E4M3 codes | one f32 scale per 128 | rope as f32 or bf16
// (rope_bf16) | key codes | key scales] (the key fields only where the layer stores a key:
// key != 0). Each 128-value block takes its act_quant scale s = block_scale(amax) and the codes
// fp8(x × 1/s). One workgroup of 128 per token: a block's values one per invocation (its amax a
// tree max in shared memory), its codes packed four to a word by the first 32 invocations.
//
// KV integrity (hash = 1): the workgroup also computes the row's content hash from the words it
// writes (Σ key[w] × word[w] mod 2^64, w the word's index inside the page's slice: row `off` starts
// at word off × row words; keys at tab[key_off ..]) into hs[i], as kv_store.comp does.
//
// Table (binding 2, uint words): token i's page at [3i] (0xffffffff: nothing stored), its row in the
// page at [3i + 1], at [3i + 2] 0 when its row is hashed but not written (the integrity campaign's
// lost write; 0xffffffff: written).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 128) in;
layout(buffer_reference, std430, buffer_reference_align = 4) writeonly buffer Words { uint w[]; };
layout(std430, binding = 0) readonly buffer Xb { float x[]; };
layout(std430, binding = 2) readonly buffer Tb { uint tab[]; };
layout(std430, binding = 3) writeonly buffer Hb { uint64_t hs[]; };
layout(std140, binding = 5) uniform P {
    uint64_t kaddr;
    uint page_k, row_k;                 // bytes
    uint lat, rope, key, rope_bf16;     // values; key 0: the layer stores none
    uint x_tok, x_off;                  // floats
    uint key_off, hash;
} p;
shared float red[128];
shared uint codes[128];
shared uint64_t hred[128];

#include "fp8.glsl"

uint64_t acc = 0ul;
bool lost = false;
uint rw0 = 0u; // the row's first word in its slice

void put(Words r, uint w, uint word) {
    if (!lost) r.w[w] = word;
    if (p.hash != 0u) acc += uint64_t(tab[p.key_off + rw0 + w]) * uint64_t(word);
}

// kiln_f32_to_bf16 (base/fp.h) on the float's bits.
uint bf16(uint u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

// The n values at x[x0 ..] as E4M3 blocks: codes from word w0 of the row, the scales after them.
void blocks(Words r, uint x0, uint n, uint w0) {
    const uint tid = gl_LocalInvocationID.x;
    for (uint b0 = 0u; b0 < n; b0 += 128u) {
        const float val = x[x0 + b0 + tid];
        red[tid] = (floatBitsToUint(val) & 0x7fffffffu) > 0x7f800000u ? 0.0 : abs(val); // NaN by its bits (a compiler may assume none): the host's fmaxf skips it (fp8() stores it as 0)
        barrier();
        for (uint h = 64u; h > 0u; h >>= 1) {
            if (tid < h) red[tid] = max(red[tid], red[tid + h]);
            barrier();
        }
        const float s = block_scale(red[0]);
        const float inv = block_inv(s);
        precise float y = val * inv;
        codes[tid] = fp8(y);
        barrier();
        if (tid < 32u) put(r, w0 + b0 / 4u + tid, codes[4u * tid] | (codes[4u * tid + 1u] << 8) | (codes[4u * tid + 2u] << 16) | (codes[4u * tid + 3u] << 24));
        if (tid == 0u) put(r, w0 + n / 4u + b0 / 128u, floatBitsToUint(s));
        barrier(); // red and codes are reused by the next block
    }
}

void main() {
    const uint i = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint pg = tab[3u * i], off = tab[3u * i + 1u];
    if (pg == 0xffffffffu) return; // uniform in the workgroup
    lost = tab[3u * i + 2u] == 0u;
    const uint words = p.row_k >> 2;
    rw0 = off * words;
    Words r = Words(p.kaddr + uint64_t(pg) * p.page_k + uint64_t(off * p.row_k));
    const uint x0 = p.x_off + i * p.x_tok;
    blocks(r, x0, p.lat, 0u);
    const uint rope_w0 = p.lat / 4u + p.lat / 128u, rope_words = p.rope_bf16 != 0u ? p.rope / 2u : p.rope;
    for (uint w = tid; w < rope_words; w += 128u) {
        const uint xr = x0 + p.lat;
        const uint word = p.rope_bf16 != 0u ? bf16(floatBitsToUint(x[xr + 2u * w])) | (bf16(floatBitsToUint(x[xr + 2u * w + 1u])) << 16)
                                            : floatBitsToUint(x[xr + w]);
        put(r, rope_w0 + w, word);
    }
    if (p.key != 0u) blocks(r, x0 + p.lat + p.rope, p.key, rope_w0 + rope_words);
    if (p.hash == 0u) return;
    hred[tid] = acc;
    barrier();
    for (uint s = 64u; s > 0u; s >>= 1) {
        if (tid < s) hred[tid] += hred[tid + s];
        barrier();
    }
    if (tid == 0u) hs[i] = hred[0];
}
