#version 450
// kv_topk.comp — the lightning indexer's selection (the host's select_topk, kv/kv_sparse.c): for
// token i, of its scores [0, lim) the topk best that are not NaN / −inf (the better of two equal
// scores: the lower position), written in increasing position order to sel[i · topk ..], their
// count to nsel[i]. One workgroup of 128 per token (the size every Vulkan device runs), deterministic: scores become order-preserving
// keys (−0 as +0, so that equal scores stay equal; unusable scores key 0), a radix select of four
// 8-bit passes (histograms by shared atomics) finds the key T of the topk-th best and how many of
// the keys equal to T to take (need), then one pass in position order takes every key above T
// and the first `need` keys equal to T, placed by workgroup prefix sums.
//
// Table (binding 2, uint words): lim_i at [3i + 1] (the kv_index.comp table). A dispatch selects for
// the group of tokens tok0 + workgroup; their scores are rows 0.. of the buffer (kv_index.comp's
// group: a long chunk's scores do not fit one binding at once).
#define WG 128u
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer Sb { float score[]; };
layout(std430, binding = 1) writeonly buffer Ob { int sel[]; };
layout(std430, binding = 2) readonly buffer Tb { uint tab[]; };
layout(std430, binding = 3) writeonly buffer Nb { int nsel[]; };
layout(std140, binding = 5) uniform P { uint topk, s_off, s_stride, sel_off, nsel_off, tok0; } p;
shared uint hist[256];
shared uint scan[WG];
shared uint sh_prefix, sh_need;

uint key_of(float s) {
    // by the bits (a compiler may assume no NaN / infinity): −inf and NaN never selected, −0 as +0
    uint u = floatBitsToUint(s);
    if ((u & 0x7fffffffu) > 0x7f800000u || u == 0xff800000u) return 0u;
    if ((u & 0x7fffffffu) == 0u) u = 0u;
    return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
}

// Inclusive prefix sum of v over the workgroup (Hillis–Steele in shared memory); total: the sum of all.
uint prefix(uint v, out uint total) {
    const uint tid = gl_LocalInvocationID.x;
    scan[tid] = v;
    barrier();
    for (uint o = 1u; o < WG; o <<= 1) {
        const uint a = tid >= o ? scan[tid - o] : 0u;
        barrier();
        scan[tid] += a;
        barrier();
    }
    const uint r = scan[tid];
    total = scan[WG - 1u];
    barrier();
    return r;
}

void main() {
    const uint i = p.tok0 + gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint lim = tab[3u * i + 1u], sb = p.s_off + gl_WorkGroupID.x * p.s_stride;
    uint valid = 0u;
    for (uint t = tid; t < lim; t += WG) valid += key_of(score[sb + t]) != 0u ? 1u : 0u;
    uint n_valid;
    prefix(valid, n_valid);
    uint T = 0u, need = 0u; // everything valid when there are at most topk
    if (n_valid > p.topk) {
        uint pre = 0u, mask = 0u;
        need = p.topk;
        for (int shift = 24; shift >= 0; shift -= 8) {
            hist[tid] = 0u;
            hist[tid + WG] = 0u;
            barrier();
            for (uint t = tid; t < lim; t += WG) {
                const uint k = key_of(score[sb + t]);
                if (k != 0u && (k & mask) == pre) atomicAdd(hist[(k >> uint(shift)) & 255u], 1u);
            }
            barrier();
            if (tid == 0u) { // the digit holding the need-th best of those left
                uint above = 0u, b = 255u;
                while (above + hist[b] < need) { above += hist[b]; b--; }
                sh_prefix = pre | (b << uint(shift));
                sh_need = need - above;
            }
            barrier();
            pre = sh_prefix;
            need = sh_need;
            mask |= 255u << uint(shift);
            barrier();
        }
        T = pre;
    }
    uint taken = 0u, equal = 0u;
    for (uint c = 0u; c < lim; c += WG) {
        const uint t = c + tid;
        const uint k = t < lim ? key_of(score[sb + t]) : 0u;
        const bool eq = k != 0u && k == T;
        uint n_eq, n_take;
        const uint eq_incl = prefix(eq ? 1u : 0u, n_eq);
        const bool take = (k != 0u && k > T) || (eq && equal + eq_incl <= need);
        const uint tk_incl = prefix(take ? 1u : 0u, n_take);
        if (take) sel[p.sel_off + i * p.topk + taken + tk_incl - 1u] = int(t);
        equal += n_eq;
        taken += n_take;
    }
    if (tid == 0u) nsel[p.nsel_off + i] = int(taken);
}
