/* gemv_isa.h — internal: the per-ISA kernel table behind kiln_matmul and the f32 helpers.
 *
 * Each ISA file (gemv_avx2.c, gemv_avx512.c) fills one kiln_ktable; gemv.c picks one at run time
 * and owns threading. A NULL entry means "no SIMD kernel": the driver runs the scalar reference.
 *
 * Kernel contract (all single-threaded; the driver splits rows across threads):
 *   xprep_bytes(w)      bytes of prepared activation for ONE row of X (0 = reads X directly)
 *   xprep(w, x, xp)     fills xp from x[cols] (int8 quantisation, deinterleaving ...)
 *   gemv(w, x, xp, y, r0, r1)       y[r - r0] = W[r,:]·x for r in [r0, r1)
 *   dequant(w, r0, r1, out, ld)     out[(r - r0) * ld + c] = W[r, c] (exact f32 dequantisation)
 *   gemm_f32(W, ldw, nr, X, ldx, n, cols, Y, ldy)
 *                       Y[i * ldy + j] = Σ_c W[j * ldw + c] · X[i * ldx + c], j < nr, i < n
 * X rows are read only within [0, cols): callers may pass buffers with anything beyond. */
#ifndef KILN_KERNELS_GEMV_ISA_H
#define KILN_KERNELS_GEMV_ISA_H
#include "kernels/gemv.h"
#include <string.h>

typedef struct kiln_ktable {
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float a, const float *x, float *y, int64_t n);
    void (*scale)(float *x, float a, int64_t n);
    size_t (*xprep_bytes[KILN_WF_COUNT])(const kiln_weight *w);
    void (*xprep[KILN_WF_COUNT])(const kiln_weight *w, const float *x, void *xp);
    void (*gemv[KILN_WF_COUNT])(const kiln_weight *w, const float *x, const void *xp, float *y,
                                int64_t r0, int64_t r1);
    void (*dequant[KILN_WF_COUNT])(const kiln_weight *w, int64_t r0, int64_t r1, float *out, int64_t ld);
    void (*gemm_f32)(const float *W, int64_t ldw, int nr, const float *X, int64_t ldx, int n,
                     int64_t cols, float *Y, int64_t ldy);
    /* GEMM on prepared activations (the integer-dot formats: prefill, batched decode): for the n
     * rows of X prepared by xprep (row i at xp + i·xpb), Y[i·ldy + r] = W[r,:]·x_i for r in [r0, r1).
     * Each row's result is the GEMV's bit for bit. NULL: the driver runs gemv once per row of X. */
    void (*gemm_prep[KILN_WF_COUNT])(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy,
                                     int64_t r0, int64_t r1);
    /* Few-token steps (1 < n ≤ kiln_gemv_few_max: speculative verification, small decode batches):
     * Y[i·ldy + r] = W[r,:]·x_i for r in [r0, r1), X's n rows of cols floats (the float formats read
     * them), prepared as xprep does at xp + i·xpb (the integer-dot formats). The weights stream from
     * memory once for all n tokens, at the GEMV's rate; each (row, token) result is the GEMV's bit for
     * bit. NULL: the driver runs the GEMM (or the GEMV per token, for FP8). */
    void (*gemv_few[KILN_WF_COUNT])(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy,
                                    int64_t r0, int64_t r1);
    /* BF16-dot GEMM (tables whose bf16_gemm_mask has the format's bit): the driver rounds the n rows
     * of X to bf16 once (xprep_bf16: cols values zero-padded to a multiple of 32, xprep_bf16_bytes per
     * row), then gemm_bf16 multiplies bf16 weight rows — BF16 weights as stored, other formats
     * through dequant_bf16 tiles (row block of W → bf16 rows of ld values, zero-padded):
     *   Y[i·ldy + j] = Σ_c W[j·ldw + c] · X[i·ldx + c], j < nr, i < n. */
    void (*gemm_bf16)(const uint16_t *W, int64_t ldw, int nr, const uint16_t *X, int64_t ldx, int n, int64_t cols, float *Y, int64_t ldy);
    size_t (*xprep_bf16_bytes)(const kiln_weight *w);
    void (*xprep_bf16)(const kiln_weight *w, const float *x, void *xp);
    void (*dequant_bf16[KILN_WF_COUNT])(const kiln_weight *w, int64_t r0, int64_t r1, uint16_t *out, int64_t ld);
    unsigned bf16_gemm_mask;
    /* FP8 weights in a prompt's GEMM on Q8_0's int8 kernels (only the table gemv.c builds for that:
     * fp8_q8_tables): rows [r0, r1) of w → Q8_0 blocks (tile: cols floats of scratch, per row its
     * blocks' amax, d and 1 / d) into
     * out, whole 16-row groups in the 16-row interleave (docs/FORMATS.md) and the rest as plain Q8_0
     * rows — the layout kiln_weight_tile gives a Q8_0 weight of r1 − r0 rows. */
    void (*fp8_q8)(const kiln_weight *w, int64_t r0, int64_t r1, float *tile, uint8_t *out);
    /* Reads bytes (a multiple of 256, p 64-byte aligned) with the widest loads; returns a value
     * that depends on every byte (so the reads cannot be optimised away). For membw.c. */
    uint64_t (*read_sum)(const void *p, size_t bytes);
    /* The compute peak micro-benchmark (membw.c: kiln_compute_peak): `iters` iterations of 12
     * independent multiply-accumulates of the kind's widest instruction on registers (KILN_PEAK_F32:
     * f32 FMA; KILN_PEAK_INT8: u8·s8 dot into int32; KILN_PEAK_BF16: bf16 pair dot); returns the
     * multiply-accumulates done, 0 when the table has no such instruction. KILN_PEAK_BF16 runs
     * vdpbf16ps: callers ask for it only with the table of the bf16 form (AVX512_BF16 CPUs). */
    double (*peak)(int kind, int64_t iters);
    /* g[i] = silu(g[i]) · u[i] = g[i] / (1 + e^-g[i]) · u[i] (e^x from glibc's libmvec). */
    void (*silu_mul)(float *g, const float *u, int64_t n);
    /* the largest finite-or-infinite value of x[0, n) that is not NaN (-inf if none); n ≥ 1 */
    float (*max_f32)(const float *x, int64_t n);
    /* Bit (1 << fmt): this table's gemv and dequant for fmt read the 4-row tile layout (gemv.h)
     * directly; for other formats the driver hands them untiled copies of row groups. */
    unsigned tiled_mask;
    /* INT4 group 32 is read in KILN_TILE_Q16 (gemv.h) instead of the 4-row tiles: a weight in the
     * other layout goes the untiled-copy way (kiln_ktable_reads_tiled) */
    int int4_q16;
} kiln_ktable;
/* Where row r's bytes are, in either layout (gemv.h): 64-byte chunk k at p + cs·k for
 * k < row_bytes / 64, the row_bytes % 64 tail bytes at tp. */
typedef struct { const uint8_t *p, *tp; int64_t cs; } row_loc;
static inline row_loc row_at(const kiln_weight *w, int64_t r) {
    const size_t rb = w->row_bytes, n = rb / 64;
    row_loc o;
    if (!w->tiled || r >= (w->rows & ~(int64_t)3)) {
        o.p = w->data + (size_t)r * rb;
        o.cs = 64;
        o.tp = o.p + 64 * n;
    } else {
        const uint8_t *g = w->data + (size_t)(r & ~(int64_t)3) * rb;
        const size_t j = (size_t)(r & 3);
        o.p = g + 64 * j;
        o.cs = 256;
        o.tp = g + 256 * n + (rb % 64) * j;
    }
    return o;
}
/* Row loc's 32-byte piece b (columns 32b.. of a 1-byte-per-column row): in its 64-byte chunk b / 2
 * while that chunk is whole (full = row_bytes / 64), else the row's 32-byte tail. */
static inline const uint8_t *row_piece32(const row_loc *loc, size_t full, int64_t b) {
    return (size_t)b / 2 < full ? loc->p + (size_t)loc->cs * ((size_t)b / 2) + 32 * ((size_t)b & 1) : loc->tp;
}
/* One requantized Q8_0 block (FP8 prompts on the int8 kernels, kiln_fp8_q8_*): block b of row r of
 * out in the layout kiln_weight_tile gives a Q8_0 weight — rows below `grouped` (a multiple of 16)
 * in the 16-row interleave (per group and block 544 bytes: 16 f16 scales, then 8 × 64 bytes whose
 * dword j is row j's 4 columns, + 128 each), the rest as plain Q8_0 blocks (f16 d, 32 int8; rb
 * bytes a row). q: the block's 32 int8. */
static inline void kiln_q8_block_put(uint8_t *out, int64_t r, int64_t grouped, int64_t b, size_t rb, uint16_t dh, const uint8_t q[32]) {
    if (r < grouped) {
        uint8_t *blk = out + (size_t)(r / 16) * 16 * rb + (size_t)b * 544;
        const size_t j = (size_t)(r % 16);
        memcpy(blk + 2 * j, &dh, 2);
        for (int k = 0; k < 8; k++) {
            uint32_t wd;
            memcpy(&wd, q + 4 * k, 4);
            wd ^= 0x80808080u;
            memcpy(blk + 32 + 64 * k + 4 * j, &wd, 4);
        }
    } else {
        uint8_t *blk = out + (size_t)r * rb + (size_t)b * 34;
        memcpy(blk, &dh, 2);
        memcpy(blk + 2, q, 32);
    }
}
/* Whether t's kernels read w's tile layout directly. */
static inline int kiln_ktable_reads_tiled(const kiln_ktable *t, const kiln_weight *w) {
    if (w->fmt == KILN_WF_INT4_GROUP && w->tiled == KILN_TILE_Q16) return t->int4_q16;
    if (!(t->tiled_mask >> w->fmt & 1u)) return 0;
    if (w->fmt != KILN_WF_INT4_GROUP) return 1;
    return !(t->int4_q16 && w->block == 32); /* the 4-row tiles: group 32 is not read so there */
}
/* The table of the current ISA (NULL = scalar), for membw.c. */
const kiln_ktable *kiln_ktable_current(void);

extern const kiln_ktable kiln_ktable_avx2;
extern const kiln_ktable kiln_ktable_avx512;      /* FP8 GEMV on exact f32 activations */
extern const kiln_ktable kiln_ktable_avx512_bf16; /* FP8 GEMV on bf16 activations (AVX512_BF16) */
/* FP8 rows → Q8_0 blocks in the 16-row interleave (the fp8_q8 entry of the table gemv.c builds from
 * kiln_ktable_avx512_bf16 for prompts' FP8 GEMMs; gemv_avx512.c). */
void kiln_fp8_q8_avx512(const kiln_weight *w, int64_t r0, int64_t r1, float *tile, uint8_t *out);
/* The same bytes with AVX2 + F16C (gemv_avx2.c), for the AVX2 tables. */
void kiln_fp8_q8_avx2(const kiln_weight *w, int64_t r0, int64_t r1, float *tile, uint8_t *out);
/* The AVX2 table's INT4 GEMV with AVX-VNNI dots (gemv_avxvnni.c); the AVX2 table uses it in place of
 * its own when the CPU has AVX-VNNI and kiln_kernels_avx_vnni(0) / KILN_AVX_VNNI=0 did not say no. */
void kiln_gemv_int4_avxvnni(const kiln_weight *w, const float *x, const void *xp, float *y, int64_t r0, int64_t r1);
void kiln_gemm_int4_avxvnni(const kiln_weight *w, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy, int64_t r0, int64_t r1);
void kiln_gemv_few_int4_avxvnni(const kiln_weight *w, const float *X, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy,
                                int64_t r0, int64_t r1);
/* Whether the AVX2 table uses AVX-VNNI (the CPU has it and it is enabled); sets it for later
 * kiln_kernels_select calls (like kiln_kernels_fp8_exact: only while no kernel runs) and returns the
 * previous setting. Tests run both forms. */
int kiln_kernels_avx_vnni(int enable);
/* The AVX-VNNI forms of the K-quant GEMV / GEMM (gemv_avxvnni.c, kquant_avx2.h) into an AVX2 table. */
void kiln_kq_avxvnni_fill(kiln_ktable *t);
/* The Q8_0 / Q4_0 16-row interleave kernels with AVX-VNNI dots (gemv_avxvnni.c, kernels/q16_avx2.h):
 * the AVX2 table's GEMV and GEMM entries for those formats on CPUs with AVX-VNNI; the same results
 * bit for bit. Their rows in checkpoint layout go through the AVX2 row-major GEMV. */
void kiln_q16_avxvnni_fill(kiln_ktable *t);
void kiln_gemv_q_rowmajor_avx2(int f, const kiln_weight *w, const void *xp, float *y, int64_t r0, int64_t r1);

/* AMX (issue 20): the Q8_0 / Q4_0 / INT4-g32 16-row interleave GEMM, and Q4_K / Q5_K's super-block
 * interleave, on tiles (kernels/q16_amx.h),
 * taken by the AVX-512 table's GEMM for each whole 16 tokens of a step (the rest, and every GEMV,
 * stay on vpdpbusd); every (row, token) result is the AVX-512 kernel's bit for bit. Modes: OFF;
 * HW, the CPU's tiles where it has AMX-INT8 and Linux granted the tile state (the default there;
 * KILN_AMX=0 says no); EMULATED, the same kernel over tile instructions emulated in C (tests, any
 * CPU). Like kiln_kernels_avx_vnni: set only while no kernel runs; returns the previous mode. */
enum { KILN_AMX_OFF = 0, KILN_AMX_HW = 1, KILN_AMX_EMULATED = 2 };
int kiln_kernels_amx(int mode);
/* 1 when this CPU and OS let kiln use AMX-INT8 tiles (asked once: CPUID, XCR0, arch_prctl). */
int kiln_amx_available(void);
/* 1 when the CPU offered AMX-INT8 tiles but their check block at start-up differed from the emulation
 * (gemv.c amx_selfcheck): AMX was then turned off. */
int kiln_amx_check_failed(void);
/* The kernel a GEMM of the 16-row interleave should use now (NULL: none), and the tile blocks run on
 * the calling thread (block dots of 16 tokens × 16 rows; tests check the path was taken). */
typedef void (*kiln_q16_amx_fn)(int f, const uint8_t *g, const uint16_t *sg, int64_t nb, const uint8_t *xp, size_t xpb, int n, float *Y,
                                int64_t ldy);
kiln_q16_amx_fn kiln_q16_amx_kernel(void);
/* The same for Q4_K / Q5_K in the 16-row super-block interleave (kernels/q16_amx.h K16_AMX_NAME). */
typedef void (*kiln_k16_amx_fn)(int f, const uint8_t *g, int64_t nsb, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy);
kiln_k16_amx_fn kiln_k16_amx_kernel(void);
void kiln_q16_amx_count(uint64_t blocks);
uint64_t kiln_q16_amx_blocks(void);
void kiln_q16_amx_hw(int f, const uint8_t *g, const uint16_t *sg, int64_t nb, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy);
void kiln_q16_amx_emu(int f, const uint8_t *g, const uint16_t *sg, int64_t nb, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy);
void kiln_k16_amx_hw(int f, const uint8_t *g, int64_t nsb, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy);
void kiln_k16_amx_emu(int f, const uint8_t *g, int64_t nsb, const uint8_t *xp, size_t xpb, int n, float *Y, int64_t ldy);
/* The AMX peak micro-benchmark (KILN_PEAK_AMX_INT8): iters × 4 independent tdpbsud of 16 × 16 × 64 on
 * registers; returns the multiply-accumulates done. Only where kiln_amx_available(). */
double kiln_amx_peak_macs(int64_t iters);
/* 1 when GEMMs of the 16-row interleave run on the CPU's tiles now (mode HW and available). */
int kiln_amx_in_use(void);
/* Tile shapes or operands the emulation found the hardware would refuse (0 when the kernel is right). */
unsigned long long kiln_amx_emu_faults(void);

/* Shared activation quantiser for the integer-dot kernels (INT4, Q8_0, Q4_0): x[cols] (cols a
 * multiple of 32) → q[cols] int8 and d[cols/32] with x ≈ q · d per block of 32; d = amax/127,
 * q = round-to-nearest-even(x / d) (ggml's q8_0 activation rule). */
void kiln_quant_x32(const float *x, int64_t cols, int8_t *q, float *d);
/* The K-quant kernels' activation rule, per super-block of 256 (the ISA files vectorize it with the
 * same operations, so every ISA quantizes alike): d = amax/127, q = RNE(x · (1/d)) clamped to ±127
 * (0 when amax = 0). For tests and the reference's model of the kernels. */
void kiln_quant_x256(const float *x, int8_t *q, float *d);

/* Whether the AVX-512 FP8 GEMV takes its BF16-dot path (gemv_avx512.c): the CPU has AVX512_BF16
 * and neither kiln_kernels_fp8_exact(1) nor KILN_FP8_EXACT=1 asked for the exact path. */
int kiln_fp8_bf16_dot(void);

/* The GGUF block types the int8 kernels read: bytes per block (the super-block types per 256
 * columns, the others per 32; 0 for formats that are not GGUF blocks) ... */
static inline size_t kiln_wf_block_bytes(kiln_wformat f) {
    switch (f) {
    case KILN_WF_Q8_0: return 34;
    case KILN_WF_Q4_0: return 18;
    case KILN_WF_Q4_1: return 20;
    case KILN_WF_Q5_0: return 22;
    case KILN_WF_Q5_1: return 24;
    case KILN_WF_IQ4_NL: return 18;
    case KILN_WF_Q4_K: return 144;
    case KILN_WF_Q5_K: return 176;
    case KILN_WF_Q6_K: return 210;
    case KILN_WF_Q2_K: return 84;
    case KILN_WF_Q3_K: return 110;
    case KILN_WF_IQ4_XS: return 136;
    default: return 0;
    }
}
/* ... and for the blocks of 32: where a block's 16 quant bytes start (after f16 d, f16 m and the
 * u32 qh as the type has them), and whether w = d·q + m (Q4_1, Q5_1). */
static inline int kiln_q32_qs_offset(kiln_wformat f) { return f == KILN_WF_Q5_0 ? 6 : f == KILN_WF_Q4_1 ? 4 : f == KILN_WF_Q5_1 ? 8 : 2; }
static inline int kiln_q32_has_min(kiln_wformat f) { return f == KILN_WF_Q4_1 || f == KILN_WF_Q5_1; }
/* Q4_1 / Q5_1's prepared record: after the per-32 record of xprep_q called with offset −1 (st lanes
 * +Σ, so tot = Σx_q), xs[b] = d[b]·tot[b] (the m term's dx·Σx_q) for the nb blocks. */
static inline void kiln_xprep_q1_sums(void *xp, int64_t nb) {
    const float *d = (const float *)((uint8_t *)xp + nb * 64);
    const int32_t *tot = (const int32_t *)(d + nb);
    float *xs = (float *)(tot + nb);
    for (int64_t b = 0; b < nb; b++) xs[b] = d[b] * (float)tot[b];
}

/* Whether the SIMD INT4 kernels handle this group size (see kiln_matmul_is_fast). */
static inline int kiln_int4_group_ok(const kiln_weight *w) {
    int g = w->block;
    return g >= 32 && g % 32 == 0 && (128 % g == 0 || g % 128 == 0) && w->cols % g == 0;
}
#endif
