/* avx2_common.h — small helpers shared by the AVX2-class kernel files (gemv_avx2.c,
 * gemv_avxvnni.c), which are compiled with the AVX2 flags. */
#ifndef KILN_KERNELS_AVX2_COMMON_H
#define KILN_KERNELS_AVX2_COMMON_H
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define AI static inline __attribute__((always_inline))

AI int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
AI float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows prefetched ahead: the 4-row group `pfg` groups further, ~8 KiB of weights ahead (its rows in
 * step with this group's columns; a line per row per 64 bytes). 0 = none (single rows). */
AI int64_t pf_groups_avx2(size_t row_bytes) {
    int64_t g = (int64_t)(8192 / (4 * (row_bytes ? row_bytes : 1)));
    return g < 1 ? 1 : g;
}
#define PF_LINE(a) _mm_prefetch((const char *)(a), _MM_HINT_T0)
#endif
