#version 450
// moe_sort.comp — the (token, slot) entries of a chunk grouped by expert, for the experts' matmuls
// over tiles of 8 (matmul8_id_*.spv): ids[ids_off + i] is entry i's expert (moe_route.comp wrote
// them); out at ord_off: each expert's entries in increasing i, its run padded with 0xffffffff to a
// multiple of 8, the runs in expert order, the rest of the cap words 0xffffffff (each word written
// by one invocation). Deterministic (no
// order from atomics reaches the output): the counts use shared-memory atomics, the placement a
// sequential scan per expert. One workgroup of 64; E ≤ 512.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Tb { uint tab[]; };
layout(std140, binding = 5) uniform P { uint nk, E, ids_off, ord_off, cap; } p;
shared uint cnt[512];
shared uint start[513];
void main() {
    const uint tid = gl_LocalInvocationID.x;
    for (uint e = tid; e < p.E; e += 64u) cnt[e] = 0u;
    barrier();
    for (uint i = tid; i < p.nk; i += 64u) atomicAdd(cnt[tab[p.ids_off + i]], 1u);
    barrier();
    if (tid == 0u) {
        uint s = 0u;
        for (uint e = 0u; e < p.E; e++) {
            start[e] = s;
            s += (cnt[e] + 7u) & ~7u;
        }
        start[p.E] = s; // the runs' end (start has E + 1 entries)
    }
    barrier();
    // every word written once: each expert's run and its padding by the expert's invocation, the
    // words past the last run by all
    for (uint e = tid; e < p.E; e += 64u) {
        uint o = start[e];
        for (uint i = 0u; i < p.nk && o < start[e] + cnt[e]; i++)
            if (tab[p.ids_off + i] == e) tab[p.ord_off + o++] = i;
        for (; o < start[e + 1u]; o++) tab[p.ord_off + o] = 0xffffffffu;
    }
    for (uint i = start[p.E] + tid; i < p.cap; i += 64u) tab[p.ord_off + i] = 0xffffffffu;
}
