/* gemv.c — run-time kernel selection and the threaded matmul driver over row blocks. */
#include "kernels/gemv.h"
#include "base/fp.h"
#include <omp.h>
#include <string.h>

static kiln_isa current_isa = KILN_ISA_SCALAR;

const char *kiln_isa_name(kiln_isa isa) {
    switch (isa) {
    case KILN_ISA_AUTO: return "auto";
    case KILN_ISA_SCALAR: return "scalar";
    case KILN_ISA_AVX2: return "avx2";
    case KILN_ISA_AVX512: return "avx512";
    }
    return "?";
}

int kiln_cpu_supports(kiln_isa isa) {
    __builtin_cpu_init();
    switch (isa) {
    case KILN_ISA_AUTO:
    case KILN_ISA_SCALAR: return 1;
    case KILN_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case KILN_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               kiln_cpu_supports(KILN_ISA_AVX2);
    }
    return 0;
}

kiln_isa kiln_kernels_select(kiln_isa want) {
    kiln_fp_init();
    if (want == KILN_ISA_AUTO) {
        want = kiln_cpu_supports(KILN_ISA_AVX512) ? KILN_ISA_AVX512
             : kiln_cpu_supports(KILN_ISA_AVX2)   ? KILN_ISA_AVX2
                                                  : KILN_ISA_SCALAR;
    } else if (!kiln_cpu_supports(want)) {
        want = KILN_ISA_SCALAR;
    }
    current_isa = want;
    return want;
}
kiln_isa kiln_kernels_current(void) { return current_isa; }

const char *kiln_wformat_name(kiln_wformat f) {
    static const char *names[KILN_WF_COUNT] = {"f32", "f16", "bf16", "fp8", "int4", "q8_0", "q4_0"};
    return (unsigned)f < KILN_WF_COUNT ? names[f] : "?";
}

uint64_t kiln_weight_bytes(const kiln_weight *w) {
    uint64_t b = (uint64_t)w->rows * w->row_bytes;
    if (w->fmt == KILN_WF_FP8_BLOCK)
        b += 4ull * (uint64_t)((w->rows + w->block - 1) / w->block) * (uint64_t)((w->cols + w->block - 1) / w->block);
    else if (w->fmt == KILN_WF_INT4_GROUP)
        b += 2ull * (uint64_t)w->rows * (uint64_t)(w->cols / w->block);
    return b;
}

/* Rows per task: large enough to amortize scheduling, small enough to balance threads. */
#define ROW_BLOCK 16

void kiln_matmul(const kiln_weight *w, const float *X, float *Y, int n) {
    int64_t nblk = (w->rows + ROW_BLOCK - 1) / ROW_BLOCK;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t r0 = b * ROW_BLOCK, r1 = r0 + ROW_BLOCK < w->rows ? r0 + ROW_BLOCK : w->rows;
        float tmp[ROW_BLOCK];
        for (int i = 0; i < n; i++) {
            kiln_gemv_ref(w, X + (size_t)i * w->cols, tmp, r0, r1);
            memcpy(Y + (size_t)i * w->rows + r0, tmp, (size_t)(r1 - r0) * 4);
        }
    }
}

/* Until the SIMD versions land these forward to the reference. */
float kiln_dot_f32(const float *a, const float *b, int64_t n) { return kiln_dot_f32_ref(a, b, n); }
void kiln_axpy_f32(float a, const float *x, float *y, int64_t n) { kiln_axpy_f32_ref(a, x, y, n); }
