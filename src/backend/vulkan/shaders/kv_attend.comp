#version 450
// kv_attend.comp — attention of query heads over their sequences' KV pages, read where they lie in
// the pool's layer arrays (kv/kv.h layout [page][KV head][page_tokens][row]) through buffer device
// addresses, dequantized in registers (compiled once per stored dtype: -DDT=0 F32, 1 BF16, 2 FP8
// E4M3 through a 256-entry table). One workgroup of 64 per (query head, token, context split):
// blocks of 64 positions, one position's score per invocation (q·k over k_dim from shared memory),
// then an online softmax (running max m, running sum l) and each invocation accumulates its own
// output values d = tid, tid + 64, ... over the block's V rows (consecutive invocations read
// consecutive bytes of a row). With one split the output is acc / l; with several, each split
// writes (acc unnormalized, m, l) and kv_merge.comp combines them (flash-decoding: a long context
// is spread over many workgroups when there are few query rows).
//
// KV integrity (hash != 0; pools whose rows are whole 32-bit words): the workgroup of the first
// query head of each KV head's group, for the token that reads its sequence furthest (its table
// word [3i + 2] names the sequence's sums; 0xffffffff for the others), adds the content hash of
// every K row it reads (and V row: hash = 2) — Σ key[w] × word[w] mod 2^64, w the word's index in
// the (page, head) slice, the keys at tab[key_off ..] — into hs[hbase + (slot × H + KV head) × 2 +
// kind]. Splits are whole pages (chunk a multiple of page_tokens), so one workgroup owns each sum.
// The host compares the sums with the seals after the dispatch (kv/integrity.h,
// kiln_kv_integ_check_sums), as the cpu kernels' fused check does.
//
// Table (binding 2, uint words): token i at [3i] = its block-table start in the entry list (ent_off
// + that), [3i + 1] = positions it sees (pos + 1); entry e = ent_stride words: the page id (out of
// [0, n_pages): the position is skipped, as the host never dereferences such an entry), then with
// dynamic FP8 scales (ent_stride = 1 + 2·KV heads) the page's K and V scale of each KV head; the
// static K / V factors of KV head h at [sc_off + 2h] / [+ 1] (FP8 static scale; 1 for F32 / BF16).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 64) in;
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Words { uint w[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Words4 { uvec4 w[]; };
layout(std430, binding = 0) readonly buffer Qb { float q[]; };
layout(std430, binding = 1) writeonly buffer Ob { float o[]; };
layout(std430, binding = 2) readonly buffer Tb { uint tab[]; };
layout(std430, binding = 3) readonly buffer Lb { float lut[]; };
layout(std430, binding = 4) buffer Hb { uint64_t hs[]; };
layout(std140, binding = 5) uniform P {
    uint64_t kaddr, vaddr;
    uint page_k, page_v, head_k, head_v, row_k, row_v;
    uint pt, k_dim, v_dim, n_heads, group, splits, chunk;
    uint q_off, o_off, ent_off, ent_stride, sc_off, n_pages;
    float scale;
    uint hash, key_off, kv_heads;
} p;
shared float qs[1024];
shared float ps[64];
// the block's V rows as the V pass reads them (wide mode): byte offset of position j's row in the V
// array (NO_ROW: skipped — a missing page, or a weight of exactly 0 as the narrow pass skips it) and
// its weight p_j · V factor
#define NO_ROW 0xffffffffffffffffUL
shared uint64_t vrow[64];
shared float vw[64];
shared uint64_t rh[2][64];

// The content hash of a row of `words` 32-bit words at addr whose first word is word w0 of its slice.
// Where the row starts on 16 bytes and is whole 16-byte pieces, four pieces are loaded before
// their products (a dependent load per word made the hashing the integrity's cost on a GPU); the
// sum mod 2^64 is the same in any order.
uint64_t row_hash(uint64_t addr, uint words, uint w0) {
    uint64_t h = 0ul;
    if ((addr & 15ul) == 0ul && (words & 3u) == 0u) {
        Words4 r4 = Words4(addr);
        for (uint w = 0u; w < words; w += 16u) {
            uvec4 a[4];
            for (uint c = 0u; c < 4u; c++) a[c] = w + 4u * c < words ? r4.w[(w >> 2) + c] : uvec4(0u);
            for (uint c = 0u; c < 4u; c++)
                for (uint i = 0u; i < 4u; i++) {
                    const uint wi = w + 4u * c + i;
                    if (wi < words) h += uint64_t(tab[p.key_off + w0 + wi]) * uint64_t(a[c][i]);
                }
        }
        return h;
    }
    Words r = Words(addr);
    for (uint w = 0u; w < words; w++) h += uint64_t(tab[p.key_off + w0 + w]) * uint64_t(r.w[w]);
    return h;
}
#define MAX_VPT 16
// loads in flight per invocation: K row pieces (16 bytes each) and V words (one per position) —
// the attention at short contexts is a chain of dependent loads on a GPU (docs/VULKAN.md)
#define KDEPTH 8u
#define VDEPTH 16u
// elements of the stored dtype per 32-bit word, and element e of word v
#define EPW (DT == 0 ? 1u : DT == 1 ? 2u : 4u)
float word_elem(uint v, uint e) {
#if DT == 0
    return uintBitsToFloat(v);
#elif DT == 1
    return uintBitsToFloat(e == 0u ? v << 16 : v & 0xffff0000u);
#else
    return lut[(v >> (8u * e)) & 0xffu];
#endif
}

// Element e of the row whose bytes start `rb` bytes into the array at `base`.
float elem(uint64_t base, uint64_t rb, uint e) {
    const uint64_t boff = rb + uint64_t(e) * uint64_t(DT == 0 ? 4 : DT == 1 ? 2 : 1);
    const uint wv = Words(base + (boff & ~uint64_t(3))).w[0];
    const uint sh = uint(boff & uint64_t(3)) * 8u;
#if DT == 0
    return uintBitsToFloat(wv);
#elif DT == 1
    return uintBitsToFloat(((wv >> sh) & 0xffffu) << 16);
#else
    return lut[(wv >> sh) & 0xffu];
#endif
}

// NO_SCORE: "no score yet / no readable position", the running maximum's start. Finite (−FLT_MAX)
// rather than −inf: Vulkan lets a compiler assume no infinities or NaNs unless a shader declares
// SignedZeroInfNanPreserve, so no result may rest on −inf arithmetic; exp(NO_SCORE − m) is 0 for
// any real m as exp(−inf) is.
#define NO_SCORE uintBitsToFloat(0xff7fffffu)

// The element acc[k] holds: narrow mode tid + 64k; wide mode element k % EPW of the invocation's
// word k / EPW (words tid, tid + 64, ...).
uint acc_elem(uint k, bool wide) {
    const uint tid = gl_LocalInvocationID.x;
    return wide ? EPW * (tid + 64u * (k / EPW)) + k % EPW : tid + 64u * k;
}

void main() {
    const uint hq = gl_WorkGroupID.x, i = gl_WorkGroupID.y, sp = gl_WorkGroupID.z, tid = gl_LocalInvocationID.x;
    const uint kvh = hq / p.group;
    const uint ent0 = p.ent_off + tab[3u * i], lim = tab[3u * i + 1u], hbase = tab[3u * i + 2u];
    const bool hashing = p.hash != 0u && hbase != 0xffffffffu && hq % p.group == 0u; // uniform in the workgroup
    const uint t0 = min(sp * p.chunk, lim), t1 = min(t0 + p.chunk, lim);
    const uint qb = p.q_off + (i * p.n_heads + hq) * p.k_dim;
    for (uint d = tid; d < p.k_dim; d += 64u) qs[d] = q[qb + d];
    barrier();
    const float ks = uintBitsToFloat(tab[p.sc_off + 2u * kvh]), vs = uintBitsToFloat(tab[p.sc_off + 2u * kvh + 1u]);
    // wide modes (uniform over the dispatch): K rows read 16 bytes at a time where every row starts
    // on a multiple of 16 bytes; V rows read as whole words where every row is whole words
    const bool kwide = (p.kaddr & 15ul) == 0ul && p.page_k % 16u == 0u && p.head_k % 16u == 0u && p.row_k % 16u == 0u &&
                       (p.k_dim + 4u * EPW - 1u) / (4u * EPW) * 16u <= p.row_k;
    const bool vwide = (p.vaddr & 3ul) == 0ul && p.page_v % 4u == 0u && p.head_v % 4u == 0u && p.row_v % 4u == 0u &&
                       p.v_dim % EPW == 0u;
    float m = NO_SCORE, l = 0.0;
    float acc[MAX_VPT];
    for (uint k = 0u; k < MAX_VPT; k++) acc[k] = 0.0;
    for (uint b = t0; b < t1; b += 64u) {
        const uint nb = min(64u, t1 - b);
        // this invocation's position: its score
        float s = NO_SCORE;
        const uint t = b + tid;
        uint64_t hk = 0ul, hv = 0ul;
        uint64_t my_vo = NO_ROW; // this position's V row and factor, for the V pass (no second table load there)
        float my_vf = 0.0;
        if (tid < nb) {
            const uint e = ent0 + (t / p.pt) * p.ent_stride, pg = tab[e];
            if (pg < p.n_pages) {
                my_vo = uint64_t(pg) * p.page_v + uint64_t(kvh * p.head_v + (t % p.pt) * p.row_v);
                my_vf = p.ent_stride > 1u ? uintBitsToFloat(tab[e + 2u + 2u * kvh]) : vs;
                const float kf = p.ent_stride > 1u ? uintBitsToFloat(tab[e + 1u + 2u * kvh]) : ks;
                const uint64_t rb = uint64_t(pg) * p.page_k + uint64_t(kvh * p.head_k + (t % p.pt) * p.row_k);
                float dot = 0.0;
                if (kwide) {
                    // the row in 16-byte pieces, KDEPTH loads in flight before their products (one
                    // dependent load per element was this pass's time on a GPU); products in d order
                    Words4 kr = Words4(p.kaddr + rb);
                    const uint n16 = (p.k_dim + 4u * EPW - 1u) / (4u * EPW);
                    for (uint w = 0u; w < n16; w += KDEPTH) {
                        uvec4 a[KDEPTH];
                        for (uint c = 0u; c < KDEPTH; c++) a[c] = w + c < n16 ? kr.w[w + c] : uvec4(0u);
                        for (uint c = 0u; c < KDEPTH; c++)
                            for (uint h = 0u; h < 4u; h++)
                                for (uint e = 0u; e < EPW; e++) {
                                    const uint d = ((w + c) * 4u + h) * EPW + e;
                                    if (d < p.k_dim) dot += qs[d] * word_elem(a[c][h], e);
                                }
                    }
                } else
                    for (uint d = 0u; d < p.k_dim; d++) dot += qs[d] * elem(p.kaddr, rb, d);
                s = dot * (p.scale * kf);
                if (hashing) {
                    hk = row_hash(p.kaddr + rb, p.row_k >> 2, (t % p.pt) * (p.row_k >> 2));
                    if (p.hash == 2u)
                        hv = row_hash(p.vaddr + uint64_t(pg) * p.page_v + uint64_t(kvh * p.head_v + (t % p.pt) * p.row_v), p.row_v >> 2,
                                      (t % p.pt) * (p.row_v >> 2));
                }
            }
        }
        ps[tid] = s;
        if (hashing) { rh[0][tid] = hk; rh[1][tid] = hv; }
        barrier();
        if (hashing && tid == 0u) { // the rows into their slot's sums (this workgroup owns them)
            // summed per page here first, one read-modify-write of the global sums per page and kind
            // (one per row was a chain of dependent global round trips: on a GPU the integrity's
            // cost); sums mod 2^64, so the order does not change them
            uint64_t sk = 0ul, sv = 0ul;
            for (uint j = 0u; j < nb; j++) {
                const uint tj = b + j;
                sk += rh[0][j];
                if (p.hash == 2u) sv += rh[1][j];
                if (j + 1u == nb || (tj + 1u) % p.pt == 0u) { // the page's last row in this block
                    const uint hi = hbase + ((tj / p.pt) * p.kv_heads + kvh) * 2u;
                    hs[hi] += sk;
                    if (p.hash == 2u) hs[hi + 1u] += sv;
                    sk = 0ul;
                    sv = 0ul;
                }
            }
        }
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
        if (vwide) {
            // each invocation owns whole words of the V row (elements EPW·(tid + 64k) ..): the
            // position's row offset and weight come from shared memory (no page-table load on the
            // chain), and VDEPTH positions' words are loaded before their products — per element the
            // positions' terms still enter in order j
            {
                const bool use = tid < nb && ps[tid] != 0.0 && my_vo != NO_ROW;
                vrow[tid] = use ? my_vo : NO_ROW;
                vw[tid] = use ? ps[tid] * my_vf : 0.0;
            }
            barrier();
            const uint vwords = p.v_dim / EPW;
            for (uint k = 0u; k < MAX_VPT / EPW; k++) {
                const uint wd = tid + 64u * k;
                if (wd >= vwords) break;
                for (uint j0 = 0u; j0 < nb; j0 += VDEPTH) {
                    uint vv[VDEPTH];
                    for (uint c = 0u; c < VDEPTH; c++) {
                        const uint j = j0 + c;
                        vv[c] = j < nb && vrow[j] != NO_ROW ? Words(p.vaddr + vrow[j]).w[wd] : 0u;
                    }
                    for (uint c = 0u; c < VDEPTH; c++) {
                        const uint j = j0 + c;
                        if (j < nb && vrow[j] != NO_ROW)
                            for (uint e = 0u; e < EPW; e++) acc[k * EPW + e] += vw[j] * word_elem(vv[c], e);
                    }
                }
            }
        } else
        for (uint j = 0u; j < nb; j++) {
            const float pj = ps[j];
            if (pj == 0.0) continue;
            const uint tj = b + j, e = ent0 + (tj / p.pt) * p.ent_stride, pg = tab[e];
            if (pg >= p.n_pages) continue; // never follows a missing page, whatever exp gave its score
            const float vf = p.ent_stride > 1u ? uintBitsToFloat(tab[e + 2u + 2u * kvh]) : vs;
            const uint64_t rb = uint64_t(pg) * p.page_v + uint64_t(kvh * p.head_v + (tj % p.pt) * p.row_v);
            const float w = pj * vf;
            for (uint k = 0u; k < MAX_VPT; k++) {
                const uint d = tid + 64u * k;
                if (d < p.v_dim) acc[k] += w * elem(p.vaddr, rb, d);
            }
        }
        m = mn;
        barrier();
    }
    if (p.splits == 1u) {
        const float inv = l > 0.0 ? 1.0 / l : 0.0;
        const uint ob = p.o_off + (i * p.n_heads + hq) * p.v_dim;
        for (uint k = 0u; k < MAX_VPT; k++) {
            const uint d = acc_elem(k, vwide);
            if (d < p.v_dim) o[ob + d] = acc[k] * inv;
        }
    } else { // partial of split sp: [v_dim values of acc | m | l]
        const uint ob = ((i * p.n_heads + hq) * p.splits + sp) * (p.v_dim + 2u);
        for (uint k = 0u; k < MAX_VPT; k++) {
            const uint d = acc_elem(k, vwide);
            if (d < p.v_dim) o[ob + d] = acc[k];
        }
        if (tid == 0u) { o[ob + p.v_dim] = m; o[ob + p.v_dim + 1u] = l; }
    }
}
