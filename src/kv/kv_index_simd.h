/* kv_index_simd.h — internal: the body of the SIMD DSA indexer-score kernels (kv_isa.h:
 * kiln_kv_index_fn), included once by attention_avx2.c and once by attention_avx512.c, which define
 * first:
 *   IDX_VEC, IDX_W       the vector type and its f32 lanes (heads per pass: hp is a multiple of 16)
 *   IDX_G, IDX_UNROLL    positions per pass and _Pragma("GCC unroll IDX_G")
 *   IDX_ZERO(), IDX_LOAD(p), IDX_STORE(p, v), IDX_SET1(x), IDX_FMA(a, b, c)  (a × b + c, fused)
 *   idx_keys(code, d, out)  out[e] = code[e] as E4M3 × 2^-8, exact
 * Lanes = heads: for each key value e one FMA per position adds qt[e][lanes] × k_e, so each head's
 * chain runs over e in order exactly as the definition (and the scalar kernel) does, and IDX_G
 * positions share each query load; no horizontal sums. */
#ifndef KILN_KV_INDEX_SIMD_H
#define KILN_KV_INDEX_SIMD_H
_Static_assert(IDX_G <= 8, "KILN_KV_INDEX_SCRATCH holds 8 positions' keys and dots");

/* dot [G][hp] of G positions (G <= IDX_G, a constant at each call); kv: scratch [G][d] */
static inline __attribute__((always_inline)) void idx_group(const uint8_t *const *key, const int G, int d, const float *qt, int hp, float *kv,
                                                            float *dot) {
    for (int g = 0; g < G; g++) idx_keys(key[g], d, kv + (size_t)g * d);
    for (int c = 0; c < hp; c += IDX_W) {
        IDX_VEC dt[IDX_G];
        IDX_UNROLL
        for (int g = 0; g < G; g++) dt[g] = IDX_ZERO();
        for (int b0 = 0; b0 < d; b0 += 128) {
            IDX_VEC acc[IDX_G];
            IDX_UNROLL
            for (int g = 0; g < G; g++) acc[g] = IDX_ZERO();
            for (int e = b0; e < b0 + 128; e++) {
                const IDX_VEC q = IDX_LOAD(qt + (size_t)e * hp + c);
                IDX_UNROLL
                for (int g = 0; g < G; g++) acc[g] = IDX_FMA(q, IDX_SET1(kv[(size_t)g * d + e]), acc[g]);
            }
            IDX_UNROLL
            for (int g = 0; g < G; g++) {
                float sc;
                memcpy(&sc, key[g] + d + b0 / 32, 4);
                dt[g] = IDX_FMA(IDX_SET1(sc * 256.0f), acc[g], dt[g]);
            }
        }
        IDX_UNROLL
        for (int g = 0; g < G; g++) IDX_STORE(dot + (size_t)g * hp + c, dt[g]);
    }
}

static void index_scores(const uint8_t *const *key, int n, int d, const float *qt, int hp, const float *w, int hi, float *scratch,
                         float *score) {
    float *kv = scratch, *dot = scratch + (size_t)IDX_G * d;
    int i = 0;
    for (; i + IDX_G <= n; i += IDX_G) {
        idx_group(key + i, IDX_G, d, qt, hp, kv, dot);
        for (int g = 0; g < IDX_G; g++) score[i + g] = kiln_kv_index_headsum(dot + (size_t)g * hp, w, hi);
    }
    for (; i < n; i++) {
        idx_group(key + i, 1, d, qt, hp, kv, dot);
        score[i] = kiln_kv_index_headsum(dot, w, hi);
    }
}
#endif
