/* gemv.c — run-time kernel selection, the threaded matmul driver over row blocks, and the
 * dispatched f32 helpers.
 *
 * kiln_matmul(w, X[n, cols], Y[n, rows]):
 *   - the activation is prepared once (for the integer-dot formats: int8 per block of 32, see
 *     kiln_quant_x32) before the rows are split across threads in contiguous ranges, one per
 *     thread, with stealing from the back (chunk_claim); n ≤ POOL_MAX_N runs on kiln's worker pool
 *     (base/pool.h), larger n (prefill, batched decode) in an OpenMP region;
 *   - n = 1 (decode): each thread streams its rows through the ISA's GEMV kernel;
 *   - few-token steps (speculative verification, small decode batches: 1 < n ≤ KILN_GEMV_FEW_MAX,
 *     F32/F16/BF16 ≤ KILN_GEMV_FEW_MAX_FLOAT, FP8 ≤ KILN_GEMV_SMALL_N_FP8) where the table has a
 *     few-token kernel (AVX-512: INT4, FP8, F32/F16/BF16): the weights streamed once at the GEMV's
 *     rate, every token's result the 1-token GEMV's; FP8 elsewhere: the GEMV once per token over
 *     cache-sized row blocks (weights read from memory once);
 *   - otherwise n > 1 (prefill): rows are taken in blocks small enough for L2; for the float-FMA formats
 *     (F32/F16/BF16/FP8) each block is dequantised ONCE into a thread-local f32 tile that a
 *     register-tiled GEMM reuses across all n rows of X; for the integer-dot formats (INT4, Q8_0,
 *     Q4_0, the K-quants) the block's packed weights stay in L1/L2 while every row of X is run
 *     against them.
 * Scratch buffers are thread-local and grow-only, so steady-state decode does not allocate. */
#include "kernels/gemv.h"
#include "kernels/gemv_isa.h"
#include "base/fp.h"
#include "base/pool.h"
#include <cpuid.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- ISA selection ------------------------------------------------------------------------------ */
static kiln_isa current_isa = KILN_ISA_SCALAR;
static const kiln_ktable *current_table = NULL; /* NULL = scalar reference */
static int isa_selected = 0;

const char *kiln_isa_name(kiln_isa isa) {
    switch (isa) {
    case KILN_ISA_AUTO: return "auto";
    case KILN_ISA_SCALAR: return "scalar";
    case KILN_ISA_AVX2: return "avx2";
    case KILN_ISA_AVX512: return "avx512";
    }
    return "?";
}

/* F16C and AVX-VNNI read from CPUID, the way GCC's __builtin_cpu_supports answers them (clang 14
 * knows neither name): the CPUID bit, and the OS saving the YMM state (OSXSAVE, XCR0 bits 1 and 2),
 * as for every AVX feature. */
static int cpu_os_saves_ymm(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 6u) == 6u;
}
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && cpu_os_saves_ymm();
}
static int cpu_has_avxvnni(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return 0; /* leaf 7's last sub-leaf */
    __cpuid_count(7, 1, a, b, c, d);
    return (a & (1u << 4)) && cpu_os_saves_ymm(); /* CPUID.(7,1):EAX[4] AVX-VNNI */
}

/* AVX-512 here means F/BW/VL/DQ + VNNI (Cascade Lake, Ice Lake, Zen 4 and later): the integer-dot
 * kernels use vpdpbusd. A Skylake-SP class CPU without VNNI runs the AVX2 kernels. */
int kiln_cpu_supports(kiln_isa isa) {
    __builtin_cpu_init();
    switch (isa) {
    case KILN_ISA_AUTO:
    case KILN_ISA_SCALAR: return 1;
    case KILN_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case KILN_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni") && kiln_cpu_supports(KILN_ISA_AVX2);
    }
    return 0;
}

/* The AVX2 table, with AVX-VNNI's INT4 kernel where the CPU has AVX-VNNI and it is enabled
 * (KILN_AVX_VNNI=0 or kiln_kernels_avx_vnni(0) keep the vpmaddubsw form; both give the same
 * results). The AVX-VNNI variant of the table is built once; selections only pick a pointer. */
static int avx_vnni_enabled = 1;
static kiln_ktable avx2_vnni_table;
static pthread_once_t avx_vnni_once = PTHREAD_ONCE_INIT;
static void avx_vnni_init(void) {
    const char *e = getenv("KILN_AVX_VNNI");
    __atomic_store_n(&avx_vnni_enabled, !(e && strcmp(e, "0") == 0), __ATOMIC_RELAXED);
    avx2_vnni_table = kiln_ktable_avx2;
    avx2_vnni_table.gemv[KILN_WF_INT4_GROUP] = kiln_gemv_int4_avxvnni;
    avx2_vnni_table.gemm_prep[KILN_WF_INT4_GROUP] = kiln_gemm_int4_avxvnni;
    avx2_vnni_table.gemv_few[KILN_WF_INT4_GROUP] = kiln_gemv_few_int4_avxvnni;
    kiln_kq_avxvnni_fill(&avx2_vnni_table);
    kiln_q16_avxvnni_fill(&avx2_vnni_table);
}
static int avx_vnni_usable(void) {
    pthread_once(&avx_vnni_once, avx_vnni_init);
    __builtin_cpu_init();
    return __atomic_load_n(&avx_vnni_enabled, __ATOMIC_RELAXED) && cpu_has_avxvnni();
}
static const kiln_ktable *avx2_table(void) { return avx_vnni_usable() ? &avx2_vnni_table : &kiln_ktable_avx2; }
int kiln_kernels_avx_vnni(int enable) {
    const int was = avx_vnni_usable();
    __atomic_store_n(&avx_vnni_enabled, enable != 0, __ATOMIC_RELAXED);
    return was;
}

/* AMX (gemv_isa.h). The CPU's word: CPUID.(7,0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8); the OS
 * saving the tile state: XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA); and Linux (5.16 and later)
 * granting this process the tile data on request, arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023,
 * XFEATURE_XTILEDATA = 18) — without it a tile instruction faults. Any "no" leaves AMX off. The
 * request is made when the kernels are first selected (kiln_kernels_select, at start-up), not inside
 * a GEMM: once granted, Linux refuses a later sigaltstack() smaller than the enlarged signal frame
 * (and refuses the grant while a thread has such a stack), which a program embedding kiln should know
 * of before its threads start; KILN_AMX=0 skips the request. */
static int amx_hw_ok = 0;
static int amx_mode = KILN_AMX_HW;
static _Thread_local uint64_t amx_blocks; /* per thread: no shared line bouncing between cores */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_env_emulate = 0, amx_env_said = 0, amx_check_failed = 0;
/* The tiles checked before first use: one 16-row group of Q4_0 (2 blocks), one of Q4_K and one of
 * Q6_K (1 super-block each: both tile shapes), 16 tokens of random prepared activations, through the CPU's tiles and through the C
 * emulation (q16_amxemu_avx512.c) must give the same bits. The kernel test does this in full where the
 * CPU has AMX (tests/kernels/test_gemv.c); this guards a machine the tests never ran on: a mismatch
 * turns AMX off with a message, and the vpdpbusd kernels (the same results by construction) run. */
static uint32_t amx_check_rand(uint32_t *st) { return *st = *st * 1664525u + 1013904223u; }
static int amx_selfcheck(void) {
    if (!kiln_cpu_supports(KILN_ISA_AVX512)) return 0;
    enum { NB = 2, QXPB = NB * 72, KXPB = 320 };
    static uint8_t g[16 * 210], xq[16 * QXPB], xk[16 * KXPB];
    static float y_hw[256], y_emu[256];
    uint32_t st = 12345u;
    for (size_t i = 0; i < sizeof g; i++) g[i] = (uint8_t)(amx_check_rand(&st) >> 24);
    for (size_t i = 0; i < sizeof xq; i++) xq[i] = (uint8_t)(amx_check_rand(&st) >> 24);
    for (size_t i = 0; i < sizeof xk; i++) xk[i] = (uint8_t)(amx_check_rand(&st) >> 24);
    for (int b = 0; b < NB; b++) /* Q4_0 blocks of 16 rows: 16 f16 scales, then 4 nibble vectors (288 bytes) */
        for (int r = 0; r < 16; r++) {
            const uint16_t h = (uint16_t)(0x2C00u + (amx_check_rand(&st) >> 22));
            memcpy(g + 288 * b + 2 * r, &h, 2);
        }
    for (int t = 0; t < 16; t++) {
        for (int b = 0; b < NB; b++) {
            const float dx = 0.01f * (float)(t + b + 1);
            memcpy(xq + QXPB * t + NB * 64 + 4 * b, &dx, 4);
        }
        const float dk = 0.02f * (float)(t + 1);
        memcpy(xk + KXPB * t + 288, &dk, 4);
    }
    kiln_q16_amx_hw(KILN_WF_Q4_0, g, NULL, NB, xq, QXPB, 16, y_hw, 16);
    kiln_q16_amx_emu(KILN_WF_Q4_0, g, NULL, NB, xq, QXPB, 16, y_emu, 16);
    int same = memcmp(y_hw, y_emu, sizeof y_hw) == 0;
    for (int r = 0; r < 32; r++) { /* Q4_K: d, dmin of the 16 rows at [0, 64) */
        const uint16_t h = (uint16_t)(0x2C00u + (amx_check_rand(&st) >> 22));
        memcpy(g + 2 * r, &h, 2);
    }
    kiln_k16_amx_hw(KILN_WF_Q4_K, g, 1, xk, KXPB, 16, y_hw, 16);
    kiln_k16_amx_emu(KILN_WF_Q4_K, g, 1, xk, KXPB, 16, y_emu, 16);
    same = same && memcmp(y_hw, y_emu, sizeof y_hw) == 0;
    for (int r = 0; r < 16; r++) { /* Q6_K (the K = 16 tile shapes): d of the 16 rows at [3328, 3360) */
        const uint16_t h = (uint16_t)(0x2C00u + (amx_check_rand(&st) >> 22));
        memcpy(g + 3328 + 2 * r, &h, 2);
    }
    kiln_k16_amx_hw(KILN_WF_Q6_K, g, 1, xk, KXPB, 16, y_hw, 16);
    kiln_k16_amx_emu(KILN_WF_Q6_K, g, 1, xk, KXPB, 16, y_emu, 16);
    return same && memcmp(y_hw, y_emu, sizeof y_hw) == 0;
}
static void amx_probe(void) {
    const char *e = getenv("KILN_AMX");
    if (e && strcmp(e, "0") == 0) __atomic_store_n(&amx_mode, KILN_AMX_OFF, __ATOMIC_RELAXED);
    /* the emulation end to end (tests/models/test_quantize_files.py: logits byte-identical to AMX off) */
    if (e && strcmp(e, "emulate") == 0) __atomic_store_n(&amx_mode, KILN_AMX_EMULATED, __ATOMIC_RELAXED), amx_env_emulate = 1;
#ifdef KILN_NO_AMX_ASM
    return; /* built without the tile instructions (Makefile HAVE_AMX_AS) */
#endif
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17)) return;
    if (__atomic_load_n(&amx_mode, __ATOMIC_RELAXED) == KILN_AMX_OFF) return; /* KILN_AMX=0: not even asked */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return;
    if (!amx_selfcheck()) {
        __atomic_store_n(&amx_check_failed, 1, __ATOMIC_RELAXED);
        fprintf(stderr, "kiln: AMX: the CPU's tiles and their emulation disagree on a check block; AMX stays off (KILN_AMX=0 skips AMX)\n");
        return;
    }
    __atomic_store_n(&amx_hw_ok, 1, __ATOMIC_RELAXED);
}
int kiln_amx_available(void) {
    pthread_once(&amx_once, amx_probe);
    return __atomic_load_n(&amx_hw_ok, __ATOMIC_RELAXED);
}
int kiln_amx_check_failed(void) {
    pthread_once(&amx_once, amx_probe);
    return __atomic_load_n(&amx_check_failed, __ATOMIC_RELAXED);
}
int kiln_kernels_amx(int mode) {
    pthread_once(&amx_once, amx_probe);
    return __atomic_exchange_n(&amx_mode, mode, __ATOMIC_RELAXED);
}
kiln_q16_amx_fn kiln_q16_amx_kernel(void) {
    pthread_once(&amx_once, amx_probe);
    switch (__atomic_load_n(&amx_mode, __ATOMIC_RELAXED)) {
    case KILN_AMX_HW: return __atomic_load_n(&amx_hw_ok, __ATOMIC_RELAXED) ? kiln_q16_amx_hw : NULL;
    case KILN_AMX_EMULATED:
        if (amx_env_emulate && !__atomic_exchange_n(&amx_env_said, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "kiln: KILN_AMX=emulate: the interleave GEMMs run on AMX tiles emulated in C (for tests; slow)\n");
        return kiln_q16_amx_emu;
    default: return NULL;
    }
}
kiln_k16_amx_fn kiln_k16_amx_kernel(void) {
    const kiln_q16_amx_fn q = kiln_q16_amx_kernel();
    return q == kiln_q16_amx_hw ? kiln_k16_amx_hw : q == kiln_q16_amx_emu ? kiln_k16_amx_emu : NULL;
}
int kiln_amx_in_use(void) { return kiln_q16_amx_kernel() == kiln_q16_amx_hw; }
void kiln_q16_amx_count(uint64_t blocks) { amx_blocks += blocks; }
uint64_t kiln_q16_amx_blocks(void) { return amx_blocks; }

static kiln_isa resolve_isa(kiln_isa want);
kiln_isa kiln_kernels_select(kiln_isa want) {
    kiln_fp_init();
    want = resolve_isa(want);
    if (want == KILN_ISA_AVX512) kiln_amx_available(); /* the tile permission asked at start-up (above) */
    /* the AVX-512 entry of the default context is completed with its FP8 form at each use
     * (kiln_kctx_default), so kiln_kernels_fp8_exact needs no re-selection */
    const kiln_ktable *t = want == KILN_ISA_AVX512 ? &kiln_ktable_avx512 : want == KILN_ISA_AVX2 ? avx2_table() : NULL;
    __atomic_store_n(&current_table, t, __ATOMIC_RELEASE);
    __atomic_store_n(&current_isa, want, __ATOMIC_RELEASE);
    __atomic_store_n(&isa_selected, 1, __ATOMIC_RELEASE);
    return want;
}

static int fp8_exact = -1; /* the environment and the CPU decide, once (fp8_mode_init) */
static int fp8_exact_asked;  /* ... of which the environment or kiln_kernels_fp8_exact alone */
static pthread_once_t fp8_once = PTHREAD_ONCE_INIT;
/* Whether KILN_FP8_EXACT asks for the exact FP8 form (set, non-empty, not "0"). */
static int fp8_exact_env(void) {
    const char *env = getenv("KILN_FP8_EXACT");
    return env && *env && strcmp(env, "0") != 0;
}
static void fp8_mode_init(void) {
    __builtin_cpu_init();
    __atomic_store_n(&fp8_exact_asked, fp8_exact_env(), __ATOMIC_RELAXED);
    __atomic_store_n(&fp8_exact, !__builtin_cpu_supports("avx512bf16") || fp8_exact_asked, __ATOMIC_RELAXED);
}
int kiln_fp8_bf16_dot(void) {
    pthread_once(&fp8_once, fp8_mode_init);
    return !__atomic_load_n(&fp8_exact, __ATOMIC_RELAXED);
}
int kiln_kernels_fp8_exact(int exact) {
    const int was = !kiln_fp8_bf16_dot();
    __builtin_cpu_init();
    __atomic_store_n(&fp8_exact_asked, exact != 0, __ATOMIC_RELAXED);
    __atomic_store_n(&fp8_exact, exact || !__builtin_cpu_supports("avx512bf16"), __ATOMIC_RELAXED);
    return was;
}
int kiln_kernels_fp8_rounds_x(void) { return kiln_kernels_current() == KILN_ISA_AVX512 && kiln_fp8_bf16_dot(); }

/* Callers that never chose get the best the CPU has (once, on first use). */
static pthread_once_t auto_once = PTHREAD_ONCE_INIT;
static void auto_select(void) {
    if (!__atomic_load_n(&isa_selected, __ATOMIC_ACQUIRE)) kiln_kernels_select(KILN_ISA_AUTO);
}
static const kiln_ktable *table(void) {
    if (!__atomic_load_n(&isa_selected, __ATOMIC_ACQUIRE)) pthread_once(&auto_once, auto_select);
    return __atomic_load_n(&current_table, __ATOMIC_ACQUIRE);
}
const kiln_ktable *kiln_ktable_current(void) { return table(); }
kiln_isa kiln_kernels_current(void) {
    table();
    return __atomic_load_n(&current_isa, __ATOMIC_ACQUIRE);
}

/* ---- compute contexts (gemv.h) -------------------------------------------------------------------- */
static int cpu_has_avx512bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
}
static const kiln_ktable *table_for(kiln_isa isa, int fp8_exact) {
    return isa == KILN_ISA_AVX512 ? (fp8_exact ? &kiln_ktable_avx512 : &kiln_ktable_avx512_bf16)
         : isa == KILN_ISA_AVX2   ? avx2_table()
                                  : NULL;
}
static kiln_isa resolve_isa(kiln_isa want) {
    if (want == KILN_ISA_AUTO)
        return kiln_cpu_supports(KILN_ISA_AVX512) ? KILN_ISA_AVX512 : kiln_cpu_supports(KILN_ISA_AVX2) ? KILN_ISA_AVX2 : KILN_ISA_SCALAR;
    return kiln_cpu_supports(want) ? want : KILN_ISA_SCALAR;
}

void kiln_kctx_init(kiln_kctx *cx, kiln_isa want, int threads, int fp8) {
    kiln_fp_init();
    cx->isa = resolve_isa(want);
    if (cx->isa == KILN_ISA_AVX512) kiln_amx_available(); /* the tile permission asked at start-up */
    cx->threads = threads > 0 ? threads : omp_get_max_threads();
    if (cx->threads < 1) cx->threads = 1;
    cx->decode_steps = 0;
    cx->fp8_exact_asked = fp8 == KILN_FP8_AUTO ? fp8_exact_env() : fp8 == KILN_FP8_EXACT;
    cx->fp8_exact = cx->fp8_exact_asked || !cpu_has_avx512bf16();
    cx->kt = table_for(cx->isa, cx->fp8_exact);
}

void kiln_kctx_default(kiln_kctx *cx) {
    const kiln_ktable *t = table();
    cx->isa = __atomic_load_n(&current_isa, __ATOMIC_ACQUIRE);
    cx->fp8_exact = !kiln_fp8_bf16_dot();
    cx->fp8_exact_asked = __atomic_load_n(&fp8_exact_asked, __ATOMIC_RELAXED);
    /* the FP8 form of the default table follows kiln_kernels_fp8_exact at call time */
    cx->kt = cx->isa == KILN_ISA_AVX512 ? table_for(KILN_ISA_AVX512, cx->fp8_exact) : t;
    cx->threads = omp_get_max_threads();
    cx->decode_steps = 0;
}

int kiln_cx_fp8_rounds_x(const kiln_kctx *cx) { return cx->kt == &kiln_ktable_avx512_bf16; }

const char *kiln_wformat_name(kiln_wformat f) {
    static const char *names[KILN_WF_COUNT] = {"f32", "f16", "bf16", "fp8", "int4", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k",
                                                "q2_k", "q3_k", "iq4_xs", "q4_1", "q5_0", "q5_1", "iq4_nl"};
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

/* ---- activation quantiser shared by the ISA files ----------------------------------------------- */
void kiln_quant_x32(const float *x, int64_t cols, int8_t *q, float *d) {
    for (int64_t b = 0; b < cols / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        for (int i = 0; i < 32; i++) {
            float v = nearbyintf(xb[i] * id); /* RNE under the default rounding mode */
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            q[32 * b + i] = (int8_t)v;
        }
    }
}

void kiln_quant_x256(const float *x, int8_t *q, float *d) {
    float amax = 0.0f;
    for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
    *d = db;
    for (int i = 0; i < 256; i++) {
        float v = nearbyintf(x[i] * id); /* RNE under the default rounding mode */
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[i] = (int8_t)v;
    }
}

/* ---- scratch ------------------------------------------------------------------------------------- */
/* Slot 0: prepared activations; slot 1: dequantised weight tiles. Grow-only, per thread; freed when
 * the thread ends (a thread-specific key's destructor: OpenMP team workers end with the thread that
 * started the team, never calling kiln_kernels_thread_scratch_free), or earlier by that call. */
static _Thread_local void *tl_buf[2];
static _Thread_local size_t tl_cap[2];
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_at_exit(void *unused) {
    (void)unused;
    kiln_kernels_thread_scratch_free();
}
static void scratch_key_make(void) { (void)pthread_key_create(&scratch_key, scratch_at_exit); }
static void scratch_register(void) {
    pthread_once(&scratch_once, scratch_key_make);
    (void)pthread_setspecific(scratch_key, (void *)1); /* non-NULL: the destructor runs at thread exit */
}
static void *scratch(int slot, size_t bytes) {
    if (bytes > tl_cap[slot]) {
        size_t cap = (bytes + bytes / 4 + 4095) & ~(size_t)4095;
        void *p = aligned_alloc(64, cap);
        if (!p) return NULL;
        free(tl_buf[slot]);
        tl_buf[slot] = p;
        tl_cap[slot] = cap;
        scratch_register();
    }
    return tl_buf[slot];
}

void kiln_kernels_thread_scratch_free(void) {
    for (int i = 0; i < 2; i++) {
        free(tl_buf[i]);
        tl_buf[i] = NULL;
        tl_cap[i] = 0;
    }
}

/* ---- driver -------------------------------------------------------------------------------------- */
static int fast_ok(const kiln_ktable *t, const kiln_weight *w) {
    if (!t || (unsigned)w->fmt >= KILN_WF_COUNT || w->cols <= 0) return 0;
    if (!t->gemv[w->fmt]) return t->dequant[w->fmt] && t->gemm_f32; /* f32 tiles for every n */
    switch (w->fmt) {
    case KILN_WF_F32: return w->row_bytes % 4 == 0;
    case KILN_WF_FP8_BLOCK: return w->block > 0;
    case KILN_WF_INT4_GROUP: return kiln_int4_group_ok(w);
    case KILN_WF_Q8_0:
    case KILN_WF_Q4_0:
    case KILN_WF_Q4_1:
    case KILN_WF_Q5_0:
    case KILN_WF_Q5_1:
    case KILN_WF_IQ4_NL: return w->cols % 32 == 0;
    case KILN_WF_Q4_K:
    case KILN_WF_Q5_K:
    case KILN_WF_Q6_K:
    case KILN_WF_Q2_K:
    case KILN_WF_Q3_K:
    case KILN_WF_IQ4_XS: return w->cols % 256 == 0;
    default: return 1;
    }
}
int kiln_cx_matmul_is_fast(const kiln_kctx *cx, const kiln_weight *w) { return fast_ok(cx->kt, w); }

/* Whether a step of n tokens multiplies w through the table's BF16-dot GEMM (n > 1 only: batch-1
 * decode keeps the GEMV). */
/* FP8 steps of up to KILN_GEMV_SMALL_N_FP8 tokens (speculative verification, small decode batches)
 * run the 1-token GEMV kernel once per token over cache-sized row blocks, so the weights stream
 * from memory once at the GEMV's rate. Measured (1.05 GB llama shape, 2 threads, AMD EPYC Zen 5,
 * `kiln bench MODEL --batch 1,2,3,5,9,17 --weights fp8`): through the BF16-tile GEMM, which converts
 * every weight on every call, a 2-token step cost 5.9× a 1-token step and 9 sequences decoded slower
 * together than one (aggregate 41.8 tok/s at 2 sequences, 92.7 at 5, vs 122.7 alone); per-token
 * exact GEMVs: 133.5 at 2, 129.1 at 5, 146.3 at 9 (the BF16-dot form would give 177 at 2, but it
 * reads subnormal codes as 0, see table_for_n). For BF16 and INT4 the per-token GEMVs
 * were no faster than their GEMMs at 2 tokens (1.71× vs 1.63×, 1.84× vs 1.91×) and slower from 3
 * tokens on, so they keep the GEMMs for n ≥ 2. */
/* Formats whose table has a few-token kernel (gemv_few) run steps of up to KILN_GEMV_FEW_MAX tokens
 * (the float formats KILN_GEMV_FEW_MAX_FLOAT; FP8 KILN_GEMV_SMALL_N_FP8) through it: one stream of
 * the weights for all the step's tokens, each token's result the GEMV's (measured in
 * docs/BENCHMARKS.md, "Few-token steps"). */
static int small_n(const kiln_ktable *t, const kiln_weight *w) {
    if (w->fmt == KILN_WF_FP8_BLOCK) return KILN_GEMV_SMALL_N_FP8;
    if (!t || !t->gemv_few[w->fmt]) return 1;
    /* The float formats stop at KILN_GEMV_FEW_MAX_FLOAT (gemv.h says why), but BF16 on a table without
     * the BF16-dot GEMM (AVX2, AVX-512 without AVX512_BF16), whose f32-tile GEMM is slower than the
     * few-token kernel up to 8 tokens (`--isa avx2 --weights bf16 --tokens 6,8`: 0.48–0.53 and
     * 0.37–0.41 of the GEMV's weight rate against 0.33–0.39 and 0.28–0.33); F32's own GEMM needs no
     * conversion and is faster from 6 tokens on (0.84–0.93 against 0.57–0.72). */
    if (w->fmt == KILN_WF_BF16 && !(t->gemm_bf16 && (t->bf16_gemm_mask >> w->fmt & 1u))) return KILN_GEMV_FEW_MAX;
    return w->fmt == KILN_WF_F32 || w->fmt == KILN_WF_F16 || w->fmt == KILN_WF_BF16 ? KILN_GEMV_FEW_MAX_FLOAT : KILN_GEMV_FEW_MAX;
}
/* The table a step of n tokens multiplies w with: FP8 steps of 2..KILN_GEMV_SMALL_N_FP8 tokens use
 * the exact FP8 kernels even where the 1-token step uses the BF16-dot one (--fp8-gemv auto on
 * AVX512_BF16 CPUs), because that one reads subnormal FP8 codes as 0 — measured twice: a
 * per-tensor-scale checkpoint (many subnormal codes) lost its twin's greedy tokens when prompt
 * chunks went through it (tests/models/test_float_quantized.py), first through per-token BF16-dot
 * GEMVs, again through a BF16-dot few-token kernel (tried, removed); the 1-token step keeps its
 * documented form. A step the caller marks as n decodes (cx->decode_steps: speculative
 * verification) keeps the 1-token form, so that its tokens get the 1-token step's logits bit for bit
 * at the 1-token step's weight rate (docs/SPECULATIVE.md); prompts never take it. */
/* Prompts' FP8 GEMMs on Q8_0's int8 kernels (gemv_avx512.c kiln_fp8_q8_avx512, gemv_avx2.c
 * kiln_fp8_q8_avx2: each block of rows requantized once per call to Q8_0 in the 16-row interleave):
 * a copy of the caller's table with FP8's activation preparation Q8_0's and its GEMM the driver's
 * fp8_q8 path (rows_impl), built once per base table:
 *   - the AVX-512 BF16 form (AVX512_BF16 CPUs), whose FP8 prompts otherwise run bf16 tiles on
 *     vdpbf16ps (half the int8 dot rate);
 *   - the AVX-512 f32 form and the AVX2 tables (CPUs without AVX512_BF16, or `--isa avx2`), whose
 *     FP8 prompts otherwise run f32 tiles at the f32 FMA rate — unless the exact form was asked for
 *     (--fp8-gemv exact, KILN_FP8_EXACT: cx->fp8_exact_asked), which keeps its exact f32 tiles.
 * The requantization runs once per call, so it pays off from some tokens a call on (fp8_q8_min_n).
 * `kiln serve` time to first token (1.7B shape, AMD Zen 5 VM, docs/BENCHMARKS.md), BF16 route →
 * int8: 2,048 tokens in 256-token steps 19.6 → 14.3 s (11.5 s with whole 16-row work chunks,
 * chunk_rows), 1,024 in 128-token steps 9.06 → 7.85 s. Modes (kiln_kernels_fp8_prefill_int8;
 * KILN_FP8_PREFILL=bf16|auto|int8 at start): 0 never, 1 from fp8_q8_min_n tokens (the default), 2
 * every prompt GEMM past the table's few-token steps. */
enum { FP8_Q8_AVX512_BF16, FP8_Q8_AVX512, FP8_Q8_AVX2, FP8_Q8_AVX2_VNNI, FP8_Q8_TABLES };
static const kiln_ktable *fp8_q8_base[FP8_Q8_TABLES];
static kiln_ktable fp8_q8_tables[FP8_Q8_TABLES];
static int fp8_q8_mode;
static pthread_once_t fp8_q8_once = PTHREAD_ONCE_INIT;
static const char *fp8_q8_bad_env; /* KILN_FP8_PREFILL's value when it is none of the three (auto used) */
static void fp8_q8_init(void) {
    const char *e = getenv("KILN_FP8_PREFILL");
    if (e && *e && strcmp(e, "bf16") && strcmp(e, "auto") && strcmp(e, "int8")) fp8_q8_bad_env = e;
    __atomic_store_n(&fp8_q8_mode, e && strcmp(e, "bf16") == 0 ? 0 : e && strcmp(e, "int8") == 0 ? 2 : 1, __ATOMIC_RELAXED);
    pthread_once(&avx_vnni_once, avx_vnni_init);
    fp8_q8_base[FP8_Q8_AVX512_BF16] = &kiln_ktable_avx512_bf16;
    fp8_q8_base[FP8_Q8_AVX512] = &kiln_ktable_avx512;
    fp8_q8_base[FP8_Q8_AVX2] = &kiln_ktable_avx2;
    fp8_q8_base[FP8_Q8_AVX2_VNNI] = &avx2_vnni_table;
    for (int i = 0; i < FP8_Q8_TABLES; i++) {
        const kiln_ktable *b = fp8_q8_base[i];
        kiln_ktable *t = &fp8_q8_tables[i];
        *t = *b;
        t->fp8_q8 = i <= FP8_Q8_AVX512 ? kiln_fp8_q8_avx512 : kiln_fp8_q8_avx2;
        t->bf16_gemm_mask &= ~(1u << KILN_WF_FP8_BLOCK);
        t->dequant[KILN_WF_FP8_BLOCK] = NULL; /* not the f32 tiles either */
        t->xprep_bytes[KILN_WF_FP8_BLOCK] = b->xprep_bytes[KILN_WF_Q8_0];
        t->xprep[KILN_WF_FP8_BLOCK] = b->xprep[KILN_WF_Q8_0];
        t->gemm_prep[KILN_WF_FP8_BLOCK] = NULL;
        t->tiled_mask |= 1u << KILN_WF_FP8_BLOCK; /* the requantization reads either layout (row_at) */
    }
}
/* The int8-route table for prompts of FP8 weights on t, or NULL where t keeps its own FP8 GEMM. */
static const kiln_ktable *fp8_q8_for(const kiln_kctx *cx, const kiln_ktable *t) {
    pthread_once(&fp8_q8_once, fp8_q8_init);
    for (int i = 0; i < FP8_Q8_TABLES; i++)
        if (t == fp8_q8_base[i]) return i == FP8_Q8_AVX512_BF16 || !cx->fp8_exact_asked ? &fp8_q8_tables[i] : NULL;
    return NULL;
}
/* Whether t (an fp8_q8 table) takes w's GEMM through the per-call requantization to Q8_0. */
static int fp8_via_int8(const kiln_ktable *t, const kiln_weight *w) { return t && t->fp8_q8 && w->fmt == KILN_WF_FP8_BLOCK; }
/* The fewest tokens of a call for which mode 1 takes the int8 route on base table t, where it beats
 * the route t has otherwise (after chunk_rows' whole 16-row chunks; 1.7B shape, Zen 5 VM, 2 threads,
 * `KILN_FP8_PREFILL=auto|int8 kiln bench B17 --weights fp8 --prompt P --gen 2 [--isa avx2]`, prompt
 * tok/s auto / int8): the BF16 form's bf16 tiles at 32 tokens 84.0 / 81.8, 48: 104.0 / 115.8, 96:
 * 108–116 / 147–148; the f32 tiles of the AVX2 tables (and of the AVX-512 f32 form: the same f32
 * FMAs at twice the width against int8 dots at twice the width) at 24 tokens 45.9 / 38.2, 32: 39.7 /
 * 51.5, 96: 44–48 / 71–82. */
static int fp8_q8_min_n(const kiln_ktable *base) { return base == &kiln_ktable_avx512_bf16 ? 48 : 32; }
/* The Q8_0 blocks of 32 columns must each lie in one FP8 scale block. */
static int fp8_q8_fits(const kiln_ktable *t, const kiln_weight *w) { return w->cols % 32 == 0 && w->block % 32 == 0 && t->gemm_prep[KILN_WF_Q8_0]; }
static const kiln_ktable *table_for_n(const kiln_kctx *cx, const kiln_ktable *t, const kiln_weight *w, int n) {
    if (t == &kiln_ktable_avx512_bf16 && w->fmt == KILN_WF_FP8_BLOCK && n > 1 && n <= small_n(t, w) && !cx->decode_steps) return &kiln_ktable_avx512;
    if (w->fmt == KILN_WF_FP8_BLOCK && n > small_n(t, w) && !cx->decode_steps && fp8_q8_fits(t, w)) {
        const kiln_ktable *q = fp8_q8_for(cx, t);
        const int mode = __atomic_load_n(&fp8_q8_mode, __ATOMIC_RELAXED);
        if (q && (mode == 2 || (mode == 1 && n >= fp8_q8_min_n(t)))) return q;
    }
    return t;
}
const char *kiln_kernels_fp8_prefill_bad_env(void) {
    pthread_once(&fp8_q8_once, fp8_q8_init);
    return fp8_q8_bad_env;
}
int kiln_kernels_fp8_prefill_int8(int mode) {
    pthread_once(&fp8_q8_once, fp8_q8_init);
    return __atomic_exchange_n(&fp8_q8_mode, mode < 0 ? 0 : mode > 2 ? 2 : mode, __ATOMIC_RELAXED);
}
int kiln_cx_fp8_int8(const kiln_kctx *cx, const kiln_weight *w, int n) {
    return fast_ok(cx->kt, w) && fp8_via_int8(table_for_n(cx, cx->kt, w, n), w);
}
static int bf16_gemm(const kiln_ktable *t, const kiln_weight *w, int n) {
    return t && n > small_n(t, w) && t->gemm_bf16 && (t->bf16_gemm_mask >> w->fmt & 1u) && (w->fmt == KILN_WF_BF16 ? !w->tiled : t->dequant_bf16[w->fmt] != NULL);
}
/* The activation preparation a step of n tokens uses for w. */
typedef void (*xprep_fn)(const kiln_weight *w, const float *x, void *xp);
static xprep_fn prep_fn(const kiln_ktable *t, const kiln_weight *w, int n) { return bf16_gemm(t, w, n) ? t->xprep_bf16 : t->xprep[w->fmt]; }

/* Rows per prefill block: the dequantised f32 tile (rows × cols × 4 bytes) stays within ~128 KiB. */
static int64_t prefill_block_rows(const kiln_weight *w) {
    int64_t rb = (32768 / (w->cols > 0 ? w->cols : 1)) & ~(int64_t)3;
    return rb < 4 ? 4 : rb > 32 ? 32 : rb;
}

/* A tiled weight (gemv.h) under kernels that read only the checkpoint layout: each row group is
 * gathered back into that layout in scratch and multiplied as a small weight of its own. */
static void rows_gathered(const kiln_ktable *t, const kiln_weight *w, const float *X, const uint8_t *xp,
                          size_t xpb, float *Y, int n, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, rows = w->rows;
    const size_t sbytes = w->fmt == KILN_WF_INT4_GROUP ? 8 * (size_t)(cols / w->block) : 0;
    uint8_t *buf = scratch(1, 4 * w->row_bytes + sbytes);
    uint16_t *sbuf = buf ? (uint16_t *)(buf + 4 * w->row_bytes) : NULL;
    for (int64_t r = r0; r < r1;) {
        const int64_t e = (r | 3) + 1 < r1 ? (r | 3) + 1 : r1; /* up to the end of r's group */
        if (!buf) { /* out of memory: the reference reads tiled rows itself */
            for (int i = 0; i < n; i++) kiln_gemv_ref(w, X + (size_t)i * cols, Y + (size_t)i * rows + r, r, e);
            r = e;
            continue;
        }
        kiln_weight v = *w;
        v.tiled = 0;
        v.rows = e - r;
        v.data = buf;
        for (int64_t k = r; k < e; k++) kiln_weight_row_gather(w, k, buf + (size_t)(k - r) * w->row_bytes);
        if (w->fmt == KILN_WF_INT4_GROUP) { /* bf16 [rows, cols / group], gathered too */
            const int64_t ng = cols / w->block;
            for (int64_t k = r; k < e; k++)
                for (int64_t gi = 0; gi < ng; gi++) sbuf[(k - r) * ng + gi] = ((const uint16_t *)w->scales)[kiln_weight_int4_scale_index(w, k, gi)];
            v.scales = sbuf;
        } else if (w->fmt == KILN_WF_FP8_BLOCK) /* f32 [rows / B, cols / B]; the group's rows share one block row (B % 4 == 0) */
            v.scales = (const float *)w->scales + (size_t)(r / w->block) * (size_t)((cols + w->block - 1) / w->block);
        for (int i = 0; i < n; i++)
            t->gemv[w->fmt](&v, X + (size_t)i * cols, xp ? xp + (size_t)i * xpb : NULL, Y + (size_t)i * rows + r, 0, e - r);
        r = e;
    }
}

/* Rows [r0, r1) of Y for all n rows of X, on this thread. xp: n prepared rows of xpb bytes. */
static void rows_impl(const kiln_ktable *t, const kiln_weight *w, const float *X, const uint8_t *xp,
                      size_t xpb, float *Y, int n, int64_t r0, int64_t r1) {
    const int64_t cols = w->cols, rows = w->rows;
    if (t && w->tiled && !kiln_ktable_reads_tiled(t, w)) {
        rows_gathered(t, w, X, xp, xpb, Y, n, r0, r1);
        return;
    }
    if (!t) {
        for (int i = 0; i < n; i++) kiln_gemv_ref(w, X + (size_t)i * cols, Y + (size_t)i * rows + r0, r0, r1);
        return;
    }
    const int f = w->fmt;
    if (xp && fp8_via_int8(t, w)) {
        /* FP8 requantized to Q8_0 (fp8_q8_tables): blocks of rows whose Q8_0 bytes stay in L2 (~512 KiB)
         * while every token's prepared row meets them, cols floats of scratch for the conversion (per row its blocks' amax, d, 1 / d) */
        const size_t rbq = (size_t)(cols / 32) * 34;
        int64_t rbk = (int64_t)(((size_t)512 << 10) / rbq) & ~(int64_t)15;
        if (rbk < 16) rbk = 16;
        float *row = scratch(1, (size_t)cols * 4 + (size_t)rbk * rbq + 64);
        if (row) {
            uint8_t *q8 = (uint8_t *)row + (((size_t)cols * 4 + 63) & ~(size_t)63);
            for (int64_t b = r0; b < r1; b += rbk) {
                const int64_t e = b + rbk < r1 ? b + rbk : r1;
                t->fp8_q8(w, b, e, row, q8);
                const kiln_weight v = {.fmt = KILN_WF_Q8_0, .rows = e - b, .cols = cols, .data = q8, .row_bytes = rbq,
                                       .tiled = e - b >= 16 ? KILN_TILE_GROUPS : 0};
                t->gemm_prep[KILN_WF_Q8_0](&v, xp, xpb, n, Y + b, rows, 0, e - b);
            }
            return;
        }
        /* out of memory for the blocks: the reference reads the f32 activations itself */
        for (int i = 0; i < n; i++) kiln_gemv_ref(w, X + (size_t)i * cols, Y + (size_t)i * rows + r0, r0, r1);
        return;
    }
    if (xp && bf16_gemm(t, w, n)) { /* bf16 activations × bf16 weight rows (the table says for which formats) */
        const int64_t ldx = (int64_t)(xpb / 2);
        if (f == KILN_WF_BF16) {
            t->gemm_bf16((const uint16_t *)(w->data + (size_t)r0 * w->row_bytes), (int64_t)(w->row_bytes / 2), (int)(r1 - r0),
                         (const uint16_t *)xp, ldx, n, cols, Y + r0, rows);
            return;
        }
        const int64_t ld = (cols + 31) & ~(int64_t)31;
        int64_t rbb = (32768 / ld) & ~(int64_t)3; /* the bf16 tile stays within ~64 KiB */
        if (rbb < 4) rbb = 4;
        uint16_t *bt = scratch(1, (size_t)rbb * (size_t)ld * 2);
        if (bt) {
            for (int64_t b = r0; b < r1; b += rbb) {
                const int64_t e = b + rbb < r1 ? b + rbb : r1;
                t->dequant_bf16[f](w, b, e, bt, ld);
                t->gemm_bf16(bt, ld, (int)(e - b), (const uint16_t *)xp, ldx, n, cols, Y + b, rows);
            }
            return;
        }
        /* out of memory for the tile: the reference reads the f32 activations itself */
        for (int i = 0; i < n; i++) kiln_gemv_ref(w, X + (size_t)i * cols, Y + (size_t)i * rows + r0, r0, r1);
        return;
    }
    float *tile = NULL;
    int64_t rb = prefill_block_rows(w);
    if ((n > small_n(t, w) || !t->gemv[f]) && t->gemm_f32 && (f == KILN_WF_F32 || t->dequant[f])) {
        if (f != KILN_WF_F32) tile = scratch(1, (size_t)rb * (size_t)cols * 4);
        if (f == KILN_WF_F32 || tile) {
            for (int64_t b = r0; b < r1; b += rb) {
                int64_t e = b + rb < r1 ? b + rb : r1;
                const float *Wb = tile;
                int64_t ldw = cols;
                if (f == KILN_WF_F32) {
                    Wb = (const float *)(w->data + (size_t)b * w->row_bytes);
                    ldw = (int64_t)(w->row_bytes / 4);
                } else {
                    t->dequant[f](w, b, e, tile, cols);
                }
                t->gemm_f32(Wb, ldw, (int)(e - b), X, cols, n, cols, Y + b, rows);
            }
            return;
        }
    }
    /* Few-token steps: the weights streamed once for all n tokens at the GEMV's rate. */
    if (n > 1 && n <= small_n(t, w) && t->gemv_few[f] && (xp || !t->xprep_bytes[f])) {
        t->gemv_few[f](w, X, xp, xpb, n, Y, rows, r0, r1);
        return;
    }
    /* GEMM on the prepared activations (the integer-dot formats): register tiles over rows × tokens. */
    if (n > small_n(t, w) && xp && t->gemm_prep[f]) {
        t->gemm_prep[f](w, xp, xpb, n, Y, rows, r0, r1);
        return;
    }
    /* GEMV per row of X over L1/L2-sized row blocks (weights read from memory once). */
    if (n == 1) rb = r1 - r0;
    else if (w->tiled) { /* whole tile groups (4 or 16 rows) per block */
        const int64_t tr = kiln_weight_tile_rows(w);
        rb = (rb + tr - 1) / tr * tr;
    }
    for (int64_t b = r0; b < r1; b += rb) {
        int64_t e = b + rb < r1 ? b + rb : r1;
        for (int i = 0; i < n; i++)
            t->gemv[f](w, X + (size_t)i * cols, xp ? xp + (size_t)i * xpb : NULL, Y + (size_t)i * rows + b, b, e);
    }
}

/* Bytes of one prepared activation row for w (0: the kernel reads X itself). */
static void prep_size(const kiln_ktable *t, const kiln_weight *w, int n, size_t *xpb) {
    *xpb = t->xprep_bytes[w->fmt] ? t->xprep_bytes[w->fmt](w) : 0;
    if ((n > small_n(t, w) || !t->gemv[w->fmt]) && t->gemm_f32 && t->dequant[w->fmt]) *xpb = 0; /* f32 tiles read X itself */
    if (bf16_gemm(t, w, n)) *xpb = t->xprep_bf16_bytes(w);   /* ... unless it goes through the bf16 GEMM */
    *xpb = (*xpb + 63) & ~(size_t)63; /* each prepared row 64-byte aligned (the kernels' loads) */
}

/* Prepares the n activation rows (thread-shared when called before the parallel split). */
static const uint8_t *prep(const kiln_ktable *t, const kiln_weight *w, int n, size_t *xpb) {
    prep_size(t, w, n, xpb);
    if (!*xpb) return NULL;
    return scratch(0, *xpb * (size_t)n);
}

void kiln_cx_matmul_rows(const kiln_kctx *cx, const kiln_weight *w, const float *X, float *Y, int n, int64_t r0, int64_t r1) {
    if (n <= 0 || r0 >= r1) return;
    const kiln_ktable *t = cx->kt;
    t = fast_ok(t, w) ? table_for_n(cx, t, w, n) : NULL;
    size_t xpb = 0;
    const uint8_t *xp = NULL;
    if (t) {
        xp = prep(t, w, n, &xpb);
        if (xpb && !xp) t = NULL; /* out of memory: the reference needs no scratch */
        else if (xpb)
            for (int i = 0; i < n; i++) prep_fn(t, w, n)(w, X + (size_t)i * w->cols, (uint8_t *)xp + (size_t)i * xpb);
    }
    rows_impl(t, w, X, xp, xpb, Y, n, r0, r1);
}

/* Row chunks of one weight: contiguous, multiples of 4 rows, at most ~64 KiB of weights each (the
 * granularity at which a finished thread takes over another's rows) and at least 4 per thread.
 * They are the unit of work sharing (see chunk_claim below). */
static int64_t chunk_rows(const kiln_weight *w, int nth, const kiln_ktable *t) {
    int64_t chunk = (int64_t)(((size_t)64 << 10) / (w->row_bytes ? w->row_bytes : 1));
    int64_t even = (w->rows + 4 * (int64_t)nth - 1) / (4 * (int64_t)nth);
    if (chunk > even) chunk = even;
    chunk = (chunk + 3) & ~(int64_t)3;
    /* whole 16-row groups: for the 16-row interleave, and for FP8 weights requantized into it per
     * call (fp8_q8_tables: a chunk of 24 rows ran 8 of them on the row-major Q8_0 kernel and re-read
     * every token's activation per 24 rows — prefill 512 on the 1.7B shape 160 → 225 tok/s with this) */
    if ((w->tiled && kiln_weight_tile_rows(w) == 16) || fp8_via_int8(t, w)) chunk = (chunk + 15) & ~(int64_t)15;
    return chunk < 16 ? 16 : chunk;
}

/* Work sharing: thread i owns the contiguous range i of the chunk list and takes its chunks front
 * to back, so each thread streams one contiguous stretch of memory (the hardware and software
 * prefetchers run on across chunk borders); a thread whose range is done takes chunks from the BACK
 * of the other ranges, so a thread that joins late or is slowed by other work on the machine (2
 * shared vCPUs) does not hold the others back. Measured on the dev VM, 2
 * threads, 8 INT4 weights of 16 MiB (tmp microbenchmark): one dynamic chunk queue 50 GB/s, fixed
 * contiguous halves 68 GB/s, the machine's plain read 62–73 GB/s: chunks handed out in turn broke
 * every thread's stream every 256 KiB and sent each chunk's tail prefetches to the other thread's
 * rows. A range is one 64-bit word {front (low 32 bits), end (high 32)}, claimed by CAS. */
typedef struct { _Atomic uint64_t v; char pad[56]; } chunk_range;
static uint64_t range_pack(int64_t front, int64_t end) { return (uint64_t)front | ((uint64_t)end << 32); }
static int64_t range_take(chunk_range *r, int from_back) {
    uint64_t cur = atomic_load_explicit(&r->v, memory_order_relaxed);
    for (;;) {
        const int64_t front = (int64_t)(cur & 0xFFFFFFFFu), end = (int64_t)(cur >> 32);
        if (front >= end) return -1;
        const uint64_t next = from_back ? range_pack(front, end - 1) : range_pack(front + 1, end);
        if (atomic_compare_exchange_weak_explicit(&r->v, &cur, next, memory_order_relaxed, memory_order_relaxed))
            return from_back ? end - 1 : front;
    }
}
/* The next chunk for thread `me`: its own range's front, else the back of the others' in turn. */
static int64_t chunk_claim(chunk_range *ranges, int nranges, int me) {
    if (me < nranges) {
        int64_t c = range_take(&ranges[me], 0);
        if (c >= 0) return c;
    }
    for (int i = 1; i <= nranges; i++) {
        int64_t c = range_take(&ranges[(me + i) % nranges], 1);
        if (c >= 0) return c;
    }
    return -1;
}

#define MANY_MAX 8
/* Steps of up to this many tokens (decode, batched decode of up to 32 sequences) run on kiln's
 * worker pool, whose sections start without a wake-up (base/pool.h); longer ones (prefill chunks) in
 * an OpenMP region that also prepares the activation rows in parallel. Measured (bench-500m INT4, 2
 * threads, `kiln bench --batch 1,4,16,32`): with OpenMP from 4 tokens up, 4 sequences decoded 217
 * tok/s in all, below one sequence's 230 — each of a step's ~46 short sections paid the wake-up. */
#define POOL_MAX_N 32
/* One kiln_matmul_many call's shared state: the chunk list of all nw weights in order (chunks of
 * weight k are [first[k], first[k+1])) and the nt claim ranges over it. */
typedef struct {
    int nw, n, nt;
    const kiln_weight *const *ws;
    float *const *Ys;
    const float *X;
    const kiln_ktable *t[MANY_MAX];
    const uint8_t *xp[MANY_MAX];
    size_t xpb[MANY_MAX];
    int64_t chunk[MANY_MAX], first[MANY_MAX + 1];
    chunk_range *cursor;
} matmul_job;

/* The chunks of all nw weights in one loop: one parallel section for the q/k/v or gate/up
 * projections of a decode step instead of one each. */
static void matmul_chunks(void *arg, int thread) {
    const matmul_job *j = arg;
    for (int64_t c; (c = chunk_claim(j->cursor, j->nt, thread)) >= 0;) {
        int k = 0;
        while (c >= j->first[k + 1]) k++;
        const kiln_weight *w = j->ws[k];
        int64_t r0 = (c - j->first[k]) * j->chunk[k], r1 = r0 + j->chunk[k] < w->rows ? r0 + j->chunk[k] : w->rows;
        rows_impl(j->t[k], w, j->X, j->xp[k], j->xpb[k], j->Ys[k], j->n, r0, r1);
    }
}

void kiln_cx_matmul_many(const kiln_kctx *cx, const kiln_weight *const *ws, float *const *Ys, int nw, const float *X, int n) {
    if (n <= 0 || nw <= 0) return;
    if (nw > MANY_MAX) {
        for (int k = 0; k < nw; k += MANY_MAX) kiln_cx_matmul_many(cx, ws + k, Ys + k, nw - k < MANY_MAX ? nw - k : MANY_MAX, X, n);
        return;
    }
    const kiln_ktable *tab = cx->kt;
    matmul_job j = {.nw = nw, .n = n, .ws = ws, .Ys = Ys, .X = X};
    size_t xoff[MANY_MAX], xtot = 0;
    double work = 0;
    int64_t max_nt = 0;
    for (int k = 0; k < nw; k++) {
        const kiln_weight *w = ws[k];
        j.t[k] = fast_ok(tab, w) ? table_for_n(cx, tab, w, n) : NULL;
        j.xpb[k] = 0;
        if (j.t[k]) {
            prep_size(j.t[k], w, n, &j.xpb[k]);
            xoff[k] = xtot;
            xtot += (j.xpb[k] * (size_t)n + 63) & ~(size_t)63;
        }
        work += (double)w->rows * (double)w->cols * n;
        max_nt += (w->rows + 3) / 4;
    }
    uint8_t *xp_all = xtot ? scratch(0, xtot) : NULL;
    for (int k = 0; k < nw; k++) {
        j.xp[k] = NULL;
        if (j.xpb[k] && !xp_all) j.t[k] = NULL; /* out of memory: the reference needs no scratch */
        else if (j.xpb[k]) j.xp[k] = xp_all + xoff[k];
    }
    /* decode runs on the pool, which uses at most one thread per CPU: one range per thread it has */
    int nt = n <= POOL_MAX_N ? kiln_pool_width(cx->threads) : cx->threads;
    if (work < 65536.0) nt = 1; /* below ~20 µs of work the fork/join costs more than it saves */
    if (nt > max_nt) nt = (int)max_nt;
    if (nt < 1) nt = 1;
    j.nt = nt;
    /* The chunk list is split into nt contiguous ranges, one per thread (chunk_claim). */
    j.first[0] = 0;
    for (int k = 0; k < nw; k++) {
        j.chunk[k] = chunk_rows(ws[k], nt, j.t[k]);
        j.first[k + 1] = j.first[k] + (ws[k]->rows + j.chunk[k] - 1) / j.chunk[k];
    }
    chunk_range cursor[nt];
    for (int i = 0; i < nt; i++)
        atomic_init(&cursor[i].v, range_pack(j.first[nw] * i / nt, j.first[nw] * (i + 1) / nt));
    j.cursor = cursor;
    if (n <= POOL_MAX_N) {
        /* Decode: the activation is prepared before the section, which runs on kiln's worker pool
         * (base/pool.h: no wake-up per section, no wait for a worker that took no chunk). Weights
         * whose preparation is the same (format, columns, group: q/k/v, gate/up) share one. */
        for (int k = 0; k < nw; k++) {
            int same = -1;
            for (int e = 0; e < k && same < 0; e++)
                if (j.xpb[e] && j.xpb[e] == j.xpb[k] && j.t[e] == j.t[k] && ws[e]->fmt == ws[k]->fmt && ws[e]->cols == ws[k]->cols &&
                    ws[e]->block == ws[k]->block) /* (INT4 group 32 prepares alike in every layout on a table: gemv_avx512.c i4q_form) */
                    same = e;
            if (same >= 0) { j.xp[k] = j.xp[same]; continue; }
            for (int i = 0; j.xpb[k] && i < n; i++)
                prep_fn(j.t[k], ws[k], n)(ws[k], X + (size_t)i * ws[k]->cols, (uint8_t *)j.xp[k] + (size_t)i * j.xpb[k]);
        }
        kiln_pool_run(matmul_chunks, &j, nt);
        return;
    }
    /* Prefill: the n activation rows are prepared in parallel first (OpenMP: a barrier is needed). */
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        for (int k = 0; k < nw; k++) {
            if (!j.xpb[k]) continue;
            #pragma omp for schedule(static)
            for (int i = 0; i < n; i++) prep_fn(j.t[k], ws[k], n)(ws[k], X + (size_t)i * ws[k]->cols, (uint8_t *)j.xp[k] + (size_t)i * j.xpb[k]);
        }
        matmul_chunks(&j, omp_get_thread_num());
    }
}

void kiln_cx_matmul(const kiln_kctx *cx, const kiln_weight *w, const float *X, float *Y, int n) {
    if (n <= 0 || w->rows <= 0) return;
    kiln_cx_matmul_many(cx, &w, &Y, 1, X, n);
}

/* ---- f32 helpers --------------------------------------------------------------------------------- */
float kiln_cx_dot(const kiln_kctx *cx, const float *a, const float *b, int64_t n) {
    return cx->kt ? cx->kt->dot(a, b, n) : kiln_dot_f32_ref(a, b, n);
}
void kiln_cx_silu_mul(const kiln_kctx *cx, float *g, const float *u, int64_t n) {
    if (cx->kt && cx->kt->silu_mul) cx->kt->silu_mul(g, u, n);
    else
        for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
int64_t kiln_cx_argmax(const kiln_kctx *cx, const float *x, int64_t n) {
    if (n <= 0) return -1;
    const kiln_ktable *t = cx->kt;
    if (t && t->max_f32 && !isnan(x[0])) {
        const float m = t->max_f32(x, n);
        for (int64_t i = 0; i < n; i++)
            if (x[i] == m) return i;
    }
    int64_t best = 0; /* scalar reference, also when x[0] is NaN (nothing then compares greater) */
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ---- the process default context's entry points (gemv.h) ----------------------------------------- */
void kiln_matmul(const kiln_weight *w, const float *X, float *Y, int n) {
    kiln_kctx cx;
    kiln_kctx_default(&cx);
    kiln_cx_matmul(&cx, w, X, Y, n);
}
void kiln_matmul_many(const kiln_weight *const *ws, float *const *Ys, int nw, const float *X, int n) {
    kiln_kctx cx;
    kiln_kctx_default(&cx);
    kiln_cx_matmul_many(&cx, ws, Ys, nw, X, n);
}
void kiln_matmul_rows(const kiln_weight *w, const float *X, float *Y, int n, int64_t r0, int64_t r1) {
    kiln_kctx cx;
    kiln_kctx_default(&cx);
    kiln_cx_matmul_rows(&cx, w, X, Y, n, r0, r1);
}
int kiln_matmul_is_fast(const kiln_weight *w) { return fast_ok(table(), w); }
float kiln_dot_f32(const float *a, const float *b, int64_t n) {
    const kiln_ktable *t = table();
    return t ? t->dot(a, b, n) : kiln_dot_f32_ref(a, b, n);
}
void kiln_axpy_f32(float a, const float *x, float *y, int64_t n) {
    const kiln_ktable *t = table();
    if (t) t->axpy(a, x, y, n);
    else kiln_axpy_f32_ref(a, x, y, n);
}
void kiln_silu_mul(float *g, const float *u, int64_t n) {
    kiln_kctx cx;
    kiln_kctx_default(&cx);
    kiln_cx_silu_mul(&cx, g, u, n);
}
int64_t kiln_argmax_f32(const float *x, int64_t n) {
    kiln_kctx cx;
    kiln_kctx_default(&cx);
    return kiln_cx_argmax(&cx, x, n);
}
void kiln_scale_f32(float *x, float a, int64_t n) {
    const kiln_ktable *t = table();
    if (t) t->scale(x, a, n);
    else
        for (int64_t i = 0; i < n; i++) x[i] *= a;
}
