/* gemv.h — linear layers over every weight format: y = W·x (decode) and Y = X·Wᵀ (prefill).
 *
 * A kiln_weight pairs a weight's data with its scales. Shapes: W is [rows = out_features,
 * cols = in_features], row-major as checkpoints store it; x is [cols]; y is [rows].
 *
 * Each format has a scalar reference kernel (kernels/ref.c, kept forever) and SIMD kernels
 * (AVX2, AVX-512) chosen at run time by kiln_kernels_select(). Weights are never expanded into a
 * full-precision copy. */
#ifndef KILN_KERNELS_GEMV_H
#define KILN_KERNELS_GEMV_H
#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

typedef enum kiln_wformat {
    KILN_WF_F32 = 0,
    KILN_WF_F16,
    KILN_WF_BF16,
    KILN_WF_FP8_BLOCK,  /* data: F8_E4M3 [rows, cols]; scales: f32 [ceil(rows/B), ceil(cols/B)]
                           ("weight_scale_inv"); w = fp8 × scale; B = block (128) */
    KILN_WF_INT4_GROUP, /* data: packed int32 [rows, cols/8], 8 values per int32 offset by +8,
                           lowest nibble first along cols; scales: bf16 [rows, cols/group];
                           w = (q - 8) × scale; group = block (32 or 128) */
    KILN_WF_Q8_0,       /* GGUF blocks of 32 along cols (scales inside the data) */
    KILN_WF_Q4_0,
    KILN_WF_Q4_K,       /* GGUF K-quant super-blocks of 256 along cols (quant/dtype.h), multiplied by */
    KILN_WF_Q5_K,       /* int8 dots on x quantized per super-block (kiln_quant_x256; gemv_avx512.c */
    KILN_WF_Q6_K,       /* "GGUF K-quants") */
    KILN_WF_Q2_K,       /* the rest of llama-quantize's weight types, int8 dots as above: super-blocks */
    KILN_WF_Q3_K,       /* of 256 along cols (x per super-block, as the K-quants) ... */
    KILN_WF_IQ4_XS,
    KILN_WF_Q4_1,       /* ... and blocks of 32 along cols (x per 32, as Q8_0 / Q4_0) */
    KILN_WF_Q5_0,
    KILN_WF_Q5_1,
    KILN_WF_IQ4_NL,
    KILN_WF_COUNT
} kiln_wformat;

typedef struct kiln_weight {
    kiln_wformat fmt;
    int64_t rows, cols;
    const uint8_t *data;  /* row r starts at data + r * row_bytes (tiled = 0; see below) */
    size_t row_bytes;
    const void *scales;   /* FP8_BLOCK / INT4_GROUP only (see above) */
    int block;            /* FP8 block size or INT4 group size */
    int tiled;            /* 0: rows as checkpoints store them; else a tile layout below: KILN_TILE_GROUPS
                             (the format's own), KILN_TILE_Q16 (INT4 group 32 in Q4_0's 16-row interleave) */
} kiln_weight;
#define KILN_TILE_GROUPS 1
#define KILN_TILE_Q16 16

/* The 4-row tile layout (tiled = 1), a pure permutation of the data bytes, scales unchanged.
 *
 * Why: a batch-1 GEMV reads four rows at once so that each activation load serves four rows; with
 * rows stored one after the other that is four interleaved streams 1 row apart, which a core
 * prefetches far worse than one stream (measured on the 2-vCPU AVX-512 dev VM: 18 GB/s vs 25 GB/s
 * per core for the same bytes and instructions). Tiling makes the kernel's reads one sequential
 * stream; llama.cpp repacks Q4_0 for its CPU kernels for the same reason.
 *
 * Rows 4q..4q+3 (q < rows / 4) keep their byte range [4q·RB, 4q·RB + 4·RB) (RB = row_bytes); inside
 * it, with n = RB / 64 whole 64-byte chunks and t = RB % 64 tail bytes per row, row j's chunk k is
 * at 256·k + 64·j and its tail at 256·n + t·j. The last rows % 4 rows stay as they were.
 * INT4 scales (bf16 [rows, ng = cols / group]) are tiled the same way, so that the scale stream is
 * sequential too (measured: with row-major g32 scales the INT4 kernel stayed at its untiled speed):
 * with u = 128 / group groups per 128-column chunk (1 when group > 128), nb = ng / u and
 * tg = ng % u, row j's groups [b·u, b·u + u) are at 4·b·u + j·u of the group's 4·ng entries and its
 * tg tail groups at 4·nb·u + j·tg.
 *
 * Q8_0 / Q4_0 have their own tiled layout, the 16-row block interleave, also a pure permutation of
 * the bytes (row_bytes unchanged): rows 16q..16q+15 keep their byte range [16q·RB, 16q·RB + 16·RB);
 * inside it, block b (32 columns) of all 16 rows is one run of 16·bb bytes (bb = 34 Q8_0, 18 Q4_0):
 * the 16 rows' f16 scales (row j at 2j), then 64-byte vectors whose bytes 4j..4j+3 are row j's —
 * Q8_0: 8 vectors, vector k = the row's int8 weights 4k..4k+3 each xor 0x80 (w + 128 as u8);
 * Q4_0: 4 vectors, vector k = the row's nibble bytes 4k..4k+3 (low nibbles weights 4k.., high
 * nibbles 16 + 4k..). Why: one vpdpbusd then multiplies 4 columns of 16 rows by one token's 4
 * activations broadcast, so 8 of them give the 16 rows' whole block dots in one register, scaled and
 * accumulated once per block and token (llama.cpp repacks Q4_0 into 8-row interleaves for the
 * same reason); the row-major layout needs a scale and FMA per 4 columns. The last rows % 16 rows
 * stay as they were.
 * The super-block types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS; AVX-512, and AVX2 but for Q6_K / Q3_K) have the 16-row
 * super-block interleave, again a pure permutation with row_bytes unchanged: rows 16q..16q+15 keep
 * their byte range; super-block s of the 16 rows is one run of 16·bb bytes (bb the block's bytes) in
 * which each field of the block (d and dmin; the scale bytes; qh; qs / ql) is stored unit-major over
 * the 16 rows — units of 2 bytes for the f16s, 1 for
 * scale bytes (byte planes: byte k of the 16 rows), 4 for quant bytes (64-byte vectors, row j's bytes
 * at 4j) — at 16 × the field's offset in the block (tile.c: k16_fields). The last rows % 16 rows stay.
 * INT4 with group 32 has, where the AVX-512 kernels read it (tiled = KILN_TILE_Q16), Q4_0's 16-row
 * interleave: rows 16q..16q+15 keep their byte range; block b (32 columns) of the 16 rows is 256 bytes
 * at 256·b, the 4 vectors of Q4_0's layout without the scales (vector k, bytes 4j..4j+3 = row j's
 * columns 4k.. in the low nibbles and 16 + 4k.. in the high ones); the bf16 scales of group q stay in
 * `scales` at the group's 16·ng entries, block b's 16 rows side by side at 16·b (row j at 16·b + j).
 * Why: the 4-row tile's register lanes are 8-column slices of a row, so every 8 columns cost a
 * conversion, a scale product and an FMA per row and token (prefill at 0.71× Q4_0's speed, docs/
 * BENCHMARKS.md); with rows in the lanes these come once per 32 columns for 16 rows: Q4_0's
 * arithmetic (per (row, token) and block: exact int32 dot, conversion, × scale·dx, FMA). INT4 group
 * 32 is Q4_0 with a bf16 scale: the nibbles are the weight + 8 in both. The last rows % 16 rows stay.
 * Only weights kiln owns in memory (requantized ones) are tiled, and only where the kernels of `isa`
 * (the model's layout ISA, chosen when it is loaded) read the layout directly (kiln_weight_prefers_tiled); every other path, the scalar
 * reference included, reads a tiled weight correctly through kiln_weight_row_gather. */
/* Returns the layout to tile w in (0: none; KILN_TILE_GROUPS or KILN_TILE_Q16), for kiln_weight_tile. */
int kiln_weight_prefers_tiled(const kiln_weight *w, kiln_isa isa);
/* Whether w, in checkpoint layout, is read faster from an owned copy (huge pages) than from the file
 * mapping under `isa`'s kernels, with no change of layout (the K-quants; tile.c says why). */
int kiln_weight_prefers_owned(const kiln_weight *w, kiln_isa isa);
/* Rows of one tile group of w's layout (16 for Q8_0 / Q4_0, the super-block types and INT4 in
 * KILN_TILE_Q16, else 4): kiln_weight_tile leaves a weight with fewer rows untiled. */
int kiln_weight_tile_rows(const kiln_weight *w);
/* Permutes w's data and (INT4) scales into tile layout `layout` (KILN_TILE_GROUPS: the format's
 * own; KILN_TILE_Q16: INT4 group 32's 16-row interleave, other weights left as they are) and sets
 * w->tiled; `data` and `scales` are writable aliases of w->data and w->scales. Returns 0, or -1 when
 * the scratch cannot be allocated (w left untouched). */
int kiln_weight_tile(kiln_weight *w, uint8_t *data, void *scales, int layout);
/* kiln_weight_tile of a copy: src (w's data in checkpoint layout, rows × row_bytes) into data (as
 * large, not overlapping), then the tile layout; INT4 scales in `scales` as kiln_weight_tile. The
 * K-quant interleave is written straight from src (no second pass). Returns 0, or -1 without scratch
 * memory (data then holds the untiled copy and w stays untiled). */
int kiln_weight_tile_copy(kiln_weight *w, const uint8_t *src, uint8_t *data, void *scales, int layout);
/* Copies row r's row_bytes bytes, in checkpoint order, to out (either layout). */
void kiln_weight_row_gather(const kiln_weight *w, int64_t r, uint8_t *out);
/* INT4: the index into w->scales (bf16 entries) of group gi of row r, in either layout. */
int64_t kiln_weight_int4_scale_index(const kiln_weight *w, int64_t r, int64_t gi);

/* Frees the calling thread's matmul scratch (grow-only per thread: prepared activations and
 * dequantised tiles). A thread that ran matmuls calls it before it exits (the scheduler thread does
 * at stop); the next matmul on the thread allocates again. */
void kiln_kernels_thread_scratch_free(void);
const char *kiln_wformat_name(kiln_wformat f);
/* Weight buffers the kernels stream (free() releases them): 64-byte aligned; from 2 MiB on,
 * 2 MiB aligned and advised onto transparent huge pages (tile.c; KILN_THP=0 opts out). */
void *kiln_alloc64(size_t n);
/* Maps every page of [p, p + n) now (MADV_POPULATE_WRITE, else a write per page), so that the
 * first writes later (KV rows of new positions) do not each take a page fault — 20–50 µs apiece
 * on the virtualized dev machine, ~2 per bench-500m decode token. Contents are unchanged. */
void kiln_prefault(void *p, size_t n);

/* Bytes of weight data + scales (what a GEMV reads). */
uint64_t kiln_weight_bytes(const kiln_weight *w);

/* Scalar reference: y[r - r0] for rows r in [r0, r1). */
void kiln_gemv_ref(const kiln_weight *w, const float *x, float *y, int64_t r0, int64_t r1);
/* Dequantizes row r into out[cols] (reference; used by tests and embedding lookups). */
void kiln_weight_row_f32(const kiln_weight *w, int64_t r, float *out);

/* ---- compute contexts ----------------------------------------------------------------------------
 * A compute context is everything a kernel call depends on besides its operands: the kernel table
 * (ISA, and for AVX-512 the FP8 GEMV form), and how many threads a parallel section may use. A
 * backend object owns one (backend/backend.h), so two engines of one process can run different
 * ISAs, thread counts and FP8 forms at the same time. The kiln_cx_* functions compute with an
 * explicit context; the older entry points below them (kiln_matmul, kiln_dot_f32 ...) use the
 * process default context (kiln_kernels_select, kiln_kernels_fp8_exact, omp_get_max_threads),
 * which tests and tools that run no model use. */
typedef struct kiln_kctx {
    kiln_isa isa;                   /* resolved: SCALAR, AVX2 or AVX512 */
    const struct kiln_ktable *kt;   /* NULL = the scalar reference kernels */
    int threads;                    /* threads a parallel section may use (>= 1) */
    int fp8_exact;                  /* 1: FP8 GEMV on exact f32 activations; 0: bf16 activations with
                                       vdpbf16ps (AVX-512 with AVX512_BF16 only) */
    int fp8_exact_asked;            /* 1: the exact FP8 form was asked for (KILN_FP8_EXACT, --fp8-gemv
                                       exact), not only forced by a CPU without AVX512_BF16: FP8
                                       prompts then keep exact f32 tiles instead of the int8 route
                                       (gemv.c fp8_q8_for) */
    int decode_steps;               /* 1: a step of n tokens is n decodes (speculative verification):
                                       FP8 few-token steps take the 1-token GEMV's form too (its
                                       BF16-dot form where fp8_exact is 0), so each token gets its
                                       1-token result; 0 (default): they keep the exact form (gemv.c
                                       table_for_n) */
} kiln_kctx;
/* FP8 GEMV form requested of kiln_kctx_init. */
enum { KILN_FP8_AUTO = 0, KILN_FP8_EXACT = 1, KILN_FP8_BF16 = 2 };
/* want: AUTO = the best ISA the CPU has; an ISA the CPU lacks gives SCALAR. threads <= 0: the
 * OpenMP default (omp_get_max_threads). fp8: AUTO = bf16 dots where the CPU has AVX512_BF16 unless
 * the environment says KILN_FP8_EXACT=1; EXACT; BF16 (exact where the CPU cannot). */
void kiln_kctx_init(kiln_kctx *cx, kiln_isa want, int threads, int fp8);
/* The process default context as it stands now (what kiln_matmul and the other plain entry points use). */
void kiln_kctx_default(kiln_kctx *cx);

void kiln_cx_matmul(const kiln_kctx *cx, const kiln_weight *w, const float *X, float *Y, int n);
void kiln_cx_matmul_many(const kiln_kctx *cx, const kiln_weight *const *ws, float *const *Ys, int nw, const float *X, int n);
void kiln_cx_matmul_rows(const kiln_kctx *cx, const kiln_weight *w, const float *X, float *Y, int n, int64_t r0, int64_t r1);
int kiln_cx_matmul_is_fast(const kiln_kctx *cx, const kiln_weight *w);
/* 1 when a step of n tokens (not marked as decodes) multiplies the FP8 weight w on Q8_0's int8
 * kernels (gemv.c fp8_q8_tables: prompts of 48 tokens and more a call on the BF16 form, 32 on the f32 ones, unless the exact FP8 form was asked for): each block of rows
 * requantized per call to Q8_0, the activations to int8 per 32. */
int kiln_cx_fp8_int8(const kiln_kctx *cx, const kiln_weight *w, int n);
/* When that route runs: 0 never, 1 from 48 / 32 tokens a call (the default; gemv.c fp8_q8_min_n says why), 2 every
 * prompt GEMM (KILN_FP8_PREFILL=bf16|auto|int8 at start); returns the previous mode. Like
 * kiln_kernels_avx_vnni: only while no kernel runs. */
int kiln_kernels_fp8_prefill_int8(int mode);
/* KILN_FP8_PREFILL's value when it is not bf16, auto or int8 (backend creation refuses it by name),
 * else NULL. */
const char *kiln_kernels_fp8_prefill_bad_env(void);
float kiln_cx_dot(const kiln_kctx *cx, const float *a, const float *b, int64_t n);
void kiln_cx_silu_mul(const kiln_kctx *cx, float *g, const float *u, int64_t n);
int64_t kiln_cx_argmax(const kiln_kctx *cx, const float *x, int64_t n);
/* 1 when FP8 GEMV under cx rounds x to bf16 (the AVX-512 table with the BF16-dot form). */
int kiln_cx_fp8_rounds_x(const kiln_kctx *cx);

/* Selects the kernel family (AUTO = best supported by this CPU). Returns the one chosen. */
kiln_isa kiln_kernels_select(kiln_isa want);
kiln_isa kiln_kernels_current(void);
/* FP8 decode GEMV precision. On CPUs with AVX512_BF16 the AVX-512 kernel rounds the activation to
 * bf16 and multiplies with vdpbf16ps (fp8 subnormal weights read as zero; gemv_avx512.c says why
 * that is within FP8 semantics); exact = 1 selects the exact f32 path instead (also the environment
 * variable KILN_FP8_EXACT=1). Returns the previous setting. Like kiln_kernels_select, call it only
 * while no matmul runs: a call's activation preparation and its kernels read the setting apart. */
int kiln_kernels_fp8_exact(int exact);
/* 1 when FP8 GEMV with the current kernels rounds x to bf16 (AVX-512 with the BF16-dot path). */
int kiln_kernels_fp8_rounds_x(void);
/* FP8 steps of at most this many tokens run the exact FP8 GEMV's arithmetic per token (its
 * numerics: the same as an exact 1-token step): on AVX-512 the few-token kernel, two tokens per
 * conversion of the weights, elsewhere the 1-token GEMV once per token over cache-sized row blocks;
 * larger steps the GEMMs (gemv.c). */
#define KILN_GEMV_SMALL_N_FP8 16
/* Steps of 2 .. KILN_GEMV_FEW_MAX tokens of a format whose kernel table has a few-token kernel
 * (gemv_isa.h: gemv_few) run it: the weights read once at the GEMV's rate, each token's result the
 * 1-token GEMV's bit for bit (speculative verification, small decode batches). */
#define KILN_GEMV_FEW_MAX 8
/* ... and for F32 / F16 / BF16 up to 5: speculative verification of up to 4 drafts keeps each
 * position's 1-token logits exactly — greedy speculation whose verify step went through the BF16-dot
 * GEMM (x rounded to bf16) flipped a near-tie and lost its token identity with `--spec-k 4` on BF16
 * weights (`kiln bench MODEL --weights bf16 --spec off,oracle --spec-k 4`). Not beyond: these
 * kernels multiply in f32 FMAs, and from about 4 tokens on the BF16-dot GEMM streams faster (8
 * tokens: 0.66–0.80 of the GEMV's weight rate against 0.50–0.53, `kiln bench --gemv --weights bf16
 * --tokens 1,2,4,5,8`, AMD EPYC Zen 5), which batched decode of 6+ sequences keeps. */
#define KILN_GEMV_FEW_MAX_FLOAT 5 /* BF16 without the BF16-dot GEMM: KILN_GEMV_FEW_MAX (gemv.c small_n) */
const char *kiln_isa_name(kiln_isa isa);
int kiln_cpu_supports(kiln_isa isa);

/* Dispatched and multi-threaded (OpenMP, over rows): Y[n, rows] = X[n, cols] · Wᵀ. n = 1 is the
 * decode GEMV; n > 1 the prefill GEMM (weights read once per block of rows, reused across n). */
void kiln_matmul(const kiln_weight *w, const float *X, float *Y, int n);

/* Float vector helpers for attention and norms, dispatched like the GEMV kernels.
 * kiln_dot_f32 = Σ a[i]·b[i]; kiln_axpy_f32: y[i] += a·x[i]. The *_ref versions are the oracle. */
float kiln_dot_f32(const float *a, const float *b, int64_t n);
void kiln_axpy_f32(float a, const float *x, float *y, int64_t n);
float kiln_dot_f32_ref(const float *a, const float *b, int64_t n);
void kiln_axpy_f32_ref(float a, const float *x, float *y, int64_t n);

/* kiln_matmul for nw weights that read the same X (rows of X: the common cols): Y_k = X · W_kᵀ,
 * all in one parallel region (a decode step's q/k/v or gate/up projections: one fork/join). */
void kiln_matmul_many(const kiln_weight *const *ws, float *const *Ys, int nw, const float *X, int n);

/* Single-threaded form of kiln_matmul for callers that thread themselves (e.g. over MoE experts):
 * Y[i * w->rows + r] for rows r in [r0, r1) and i in [0, n); other entries of Y are untouched. */
void kiln_matmul_rows(const kiln_weight *w, const float *X, float *Y, int n, int64_t r0, int64_t r1);

/* Whether kiln_matmul has a SIMD kernel for this weight under the current ISA (otherwise it runs
 * the scalar reference: slow but correct). SIMD kernels need: INT4 group % 32 == 0 and group
 * dividing 128 or a multiple of 128; FP8 any block; the GGUF blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL) cols % 32 == 0; the super-blocks (Q2_K .. Q6_K, IQ4_XS) cols % 256 == 0. */
int kiln_matmul_is_fast(const kiln_weight *w);

/* x[i] *= a (dispatched like kiln_dot_f32). */
void kiln_scale_f32(float *x, float a, int64_t n);
/* SwiGLU's gate: g[i] = g[i] / (1 + e^-g[i]) · u[i], vectorised with glibc's libmvec expf. */
void kiln_silu_mul(float *g, const float *u, int64_t n);
/* Greedy decoding's argmax: the first index of the largest value, NaNs never chosen (exactly the
 * scalar loop `if (x[i] > x[best]) best = i` from best = 0, as llama2.c); -1 when n ≤ 0. */
int64_t kiln_argmax_f32(const float *x, int64_t n);

/* Kinds of the compute peak micro-benchmark (kiln_compute_peak in kiln_test.h). */
/* KILN_PEAK_AMX_INT8: AMX tdpbsud on tiles (0 unless the AVX-512 table runs the 16-row interleave
 * GEMM on the CPU's tiles: gemv_isa.h kiln_kernels_amx). */
enum { KILN_PEAK_F32 = 0, KILN_PEAK_INT8 = 1, KILN_PEAK_BF16 = 2, KILN_PEAK_AMX_INT8 = 3 };

/* kiln_membw_open / _burst_gbps / _window_gbps / _close: kiln.h (the bench uses them). */
#endif
