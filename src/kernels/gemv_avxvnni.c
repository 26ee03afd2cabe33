/* gemv_avxvnni.c — the INT4 group GEMV with AVX-VNNI (VEX-encoded 256-bit vpdpbusd: Intel Alder
 * Lake and later client cores, Sierra Forest, AMD Zen 5), for CPUs on the AVX2 kernel table: two
 * vpdpbusd per 64 weights and row replace the two vpmaddubsw, the 16-bit add, the vpmaddwd and the
 * start-value add of gemv_avx2.c. The kernel body is int4_avx2.h, shared with gemv_avx2.c; the two
 * give the same floats bit for bit. Compiled with the AVX2 flags plus -mavxvnni (Makefile); chosen
 * by kiln_kernels_select only when the CPU reports AVX-VNNI (gemv.c). */
#define I4_DOT(st, lo, xe, hi, xo) _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(st, lo, xe), hi, xo)
#define I4_ROWS int4_rows_vnni
#define I4_GEMV kiln_gemv_int4_avxvnni
#define I4_GEMM kiln_gemm_int4_avxvnni
#define I4_FEW kiln_gemv_few_int4_avxvnni
#define I4_LINKAGE
#include "kernels/int4_avx2.h"

#define KQ_VNNI 1
#define KQ_DOT(acc, w, x, S) _mm256_dpwssd_avx_epi32(acc, _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x), S)
#define KQ_GEMV(F) gemv_##F##_vnni
#define KQ_GEMM(F) gemm_##F##_vnni
#include "kernels/kquant_avx2.h"
void kiln_kq_avxvnni_fill(kiln_ktable *t) {
    t->gemv[KILN_WF_Q4_K] = gemv_q4k_vnni;
    t->gemv[KILN_WF_Q5_K] = gemv_q5k_vnni;
    t->gemv[KILN_WF_Q6_K] = gemv_q6k_vnni;
    t->gemm_prep[KILN_WF_Q4_K] = gemm_q4k_vnni;
    t->gemm_prep[KILN_WF_Q5_K] = gemm_q5k_vnni;
    t->gemm_prep[KILN_WF_Q6_K] = gemm_q6k_vnni;
    t->gemv[KILN_WF_Q2_K] = gemv_q2k_vnni;
    t->gemv[KILN_WF_Q3_K] = gemv_q3k_vnni;
    t->gemv[KILN_WF_IQ4_XS] = gemv_iq4xs_vnni;
    t->gemm_prep[KILN_WF_Q2_K] = gemm_q2k_vnni;
    t->gemm_prep[KILN_WF_Q3_K] = gemm_q3k_vnni;
    t->gemm_prep[KILN_WF_IQ4_XS] = gemm_iq4xs_vnni;
}

/* Q8_0 / Q4_0 in the 16-row interleave (kernels/q16_avx2.h): one vpdpbusd per 4-byte dot where the
 * AVX2 form needs vpmaddubsw + vpmaddwd + vpaddd (Q8_0) or accumulates 16-bit pairs (Q4_0). */
#define Q16_DOT8(acc, a, x) _mm256_dpbusd_avx_epi32(acc, a, x)
#define Q16_DOT4_ACC(s, w, x) _mm256_dpbusd_avx_epi32(s, w, x)
#define Q16_DOT4_END(s) (s)
#define Q16H_BLOCK q16v_block
#define Q16H_TILE q16v_tile
#define Q16H_GROUP q16v_group
#define Q16H_REST q16v_rest
#define Q16H_ROWS q16v_rows
#define Q16H_ROWMAJOR kiln_gemv_q_rowmajor_avx2
#define Q16H_GEMV_Q8 gemv_q8_vnni
#define Q16H_GEMV_Q4 gemv_q4_vnni
#define Q16H_GEMM_Q8 gemm_q8_vnni
#define Q16H_GEMM_Q4 gemm_q4_vnni
#define Q16H_I4ROWS q16v_i4rows
#define Q16H_I4_GEMV kiln_gemv_int4_avxvnni
#define Q16H_I4_GEMM kiln_gemm_int4_avxvnni
#define Q16H_I4_FEW kiln_gemv_few_int4_avxvnni
#define Q16H_GEMV_I4 gemv_int4_any_vnni
#define Q16H_GEMM_I4 gemm_int4_any_vnni
#define Q16H_FEW_I4 gemv_few_int4_any_vnni
#define Q16H_LINKAGE static
#include "kernels/q16_avx2.h"
void kiln_q16_avxvnni_fill(kiln_ktable *t) {
    t->gemv[KILN_WF_Q8_0] = gemv_q8_vnni;
    t->gemv[KILN_WF_Q4_0] = gemv_q4_vnni;
    t->gemm_prep[KILN_WF_Q8_0] = gemm_q8_vnni;
    t->gemm_prep[KILN_WF_Q4_0] = gemm_q4_vnni;
    t->gemv[KILN_WF_INT4_GROUP] = gemv_int4_any_vnni;
    t->gemm_prep[KILN_WF_INT4_GROUP] = gemm_int4_any_vnni;
    t->gemv_few[KILN_WF_INT4_GROUP] = gemv_few_int4_any_vnni;
}
