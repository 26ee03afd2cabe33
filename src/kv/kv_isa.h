/* kv_isa.h — internal: the attention kernels over KV pages and the per-ISA table behind them.
 *
 * One kernel call runs the online-softmax attention of up to KV_MAX_ROWS query rows that share a
 * KV head (the heads of a GQA group, or consecutive tokens of one sequence in prefill) over a
 * context range [t0, t1) of that head's pages, reading K and V in their stored dtype: each row of
 * K or V is dequantized in registers right where it is multiplied (no full-precision copy).
 *
 * Dequantization factors: kmul / vmul are the true factors (FP8: the static scale; BF16 / F32: 1);
 * kmul also carries the softmax scale. With dynamic scales the page's scale dyn_k[page ×
 * dyn_stride] (dyn_v for V) multiplies in per block. The SIMD kernels decode FP8 through FP16
 * (the E4M3 bit pattern shifted into an FP16 is the value × 2^-8, exact, subnormals included) and
 * fold the 2^8 into these factors. */
#ifndef KILN_KV_ISA_H
#define KILN_KV_ISA_H
#include "kv/kv.h"

#define KV_MAX_ROWS 8

typedef struct kiln_kv_span {
    const uint8_t *kbase, *vbase; /* layer arrays (vbase == kbase when V shares K) */
    const int32_t *pages;        /* the sequence's block table */
    size_t page_k, page_v;       /* bytes per page in the K / V array */
    size_t head_k, head_v;       /* byte offset of this KV head's slice inside a page */
    size_t row_k, row_v;         /* bytes per position row */
    int page_tokens, k_dim, v_dim;
    kiln_kv_dtype dtype;
    float kmul, vmul;            /* factors (see above); kmul includes the softmax scale */
    const float *dyn_k, *dyn_v;  /* dynamic FP8: scale of page pg at dyn[pg × dyn_stride]; NULL = static */
    size_t dyn_stride;
    /* Pre-RoPE K smoothing (NULL otherwise): cs + t × k_dim is the cos/sin row of position t
     * (kv.h), and each score of row r gets + Σ_d qc[r][d] × cs[t][d] (already in softmax units). */
    const float *rope_cs;
    /* 1: the SIMD kernels prefetch the blocks ahead (kiln_kv_prefetch_rows); 0 when the pages
     * were just read by the integrity pass (kv/integrity.h), which leaves them in cache: prefetching
     * again only costs instructions (BF16, 16,384 tokens: attention 18.6 → 23 ms per step). */
    int prefetch;
    /* Fused KV integrity hash (docs/INTEGRITY.md, "The content hash"; NULL hsum = off): over each
     * block of K (and V) rows it reads — one page's slice or part of it — a kernel sums key[w] ×
     * word[w] mod 2^64 over the block's little-endian 32-bit words, row by row as it reads them
     * (kiln_kv_hash_add below), w the word's index inside the (page, head) slice, and adds the sum to
     * hsum[2 × (page slot − hslot0) + 0] (K) and + 1 (V; only when hash_v: V has its own bytes, not
     * a view of the K row as in MLA). hkey: [slice bytes / 4 + 16] keys in [1, 2^32). Set only when
     * row_k and row_v are multiples of 4 bytes (a block is then whole words). */
    const uint32_t *hkey;
    uint64_t *hsum;
    int hslot0, hash_v;
} kiln_kv_span;

typedef struct kiln_kv_rows {
    int R;                       /* rows, 1..KV_MAX_ROWS */
    const float *q[KV_MAX_ROWS]; /* [k_dim] */
    float *acc[KV_MAX_ROWS];     /* [v_dim] running Σ p·v (unnormalized), in/out */
    int lim[KV_MAX_ROWS];        /* row r sees positions < lim[r] */
    float m[KV_MAX_ROWS], l[KV_MAX_ROWS]; /* running max score and Σ p, in/out (start -inf, 0) */
    /* Pre-RoPE K smoothing (when span.rope_cs): [k_dim] per row, A_i then B_i for each RoPE pair i,
     * A_i = q_a μ_a + q_b μ_b, B_i = q_b μ_a − q_a μ_b (pair (a, b), μ the pre-RoPE mean), times
     * the softmax scale: q·R(t)μ × scale = Σ_i A_i cos(t θ_i) + B_i sin(t θ_i). */
    const float *qc[KV_MAX_ROWS];
} kiln_kv_rows;

/* The attention kernels walk positions [t0, t1) in blocks that stay inside one page: the block at
 * b0 holds n ≤ max_block positions, its K / V rows start at k / v, and km / vm are the factors of
 * its scores and values (the span's, times the page's dynamic scale, times fp8f: 256 in the SIMD
 * kernels, whose FP8 dequantization yields value/256, else 1). Shared by every ISA. */
typedef struct { const uint8_t *k, *v; int n; float km, vm; } kiln_kv_block;
static inline kiln_kv_block kiln_kv_block_at(const kiln_kv_span *sp, int b0, int t1, int max_block, float fp8f) {
    const int pt = sp->page_tokens, o0 = b0 % pt;
    const size_t pg = (size_t)sp->pages[b0 / pt];
    kiln_kv_block b;
    b.n = pt - o0;
    if (b.n > max_block) b.n = max_block;
    if (b.n > t1 - b0) b.n = t1 - b0;
    b.k = sp->kbase + pg * sp->page_k + sp->head_k + (size_t)o0 * sp->row_k;
    b.v = sp->vbase + pg * sp->page_v + sp->head_v + (size_t)o0 * sp->row_v;
    b.km = sp->kmul * fp8f * (sp->dyn_k ? sp->dyn_k[pg * sp->dyn_stride] : 1.0f);
    b.vm = sp->vmul * fp8f * (sp->dyn_v ? sp->dyn_v[pg * sp->dyn_stride] : 1.0f);
    return b;
}

/* Software prefetch of the K and V rows of the block that starts at position b (nothing past t1):
 * pages are scattered through the pool and one block is one page's slice of this head (1–2 KiB),
 * so the hardware prefetcher, which stops at 4 KiB boundaries and needs a few misses to start,
 * leaves every block's first reads waiting on memory. The kernels call it (kiln_kv_prefetch_head) for
 * the blocks of a span's first positions; further on they prefetch a row at a time (below).
 * Measured (bench-500m, INT4 weights, integrity off, 2 threads): attention per decode step at
 * 16,384 tokens 35 → 15 ms (BF16 KV) and 27 → 12.4 ms (FP8 KV), at 4,096 tokens 6.8–8.1 → 3.4–4.1
 * ms (BF16) and 5.6–6.0 → 2.3–3.4 ms (FP8). */
static inline int kiln_kv_prefetch_block(const kiln_kv_span *sp, int b, int t1, int max_block) {
    if (b >= t1) return 0;
    const kiln_kv_block nb = kiln_kv_block_at(sp, b, t1, max_block, 1.0f);
    const size_t kb = (size_t)nb.n * sp->row_k, vb = (size_t)nb.n * sp->row_v;
    for (size_t o = 0; o < kb; o += 64) __builtin_prefetch(nb.k + o, 0, 3);
    if (nb.v != nb.k)
        for (size_t o = 0; o < vb; o += 64) __builtin_prefetch(nb.v + o, 0, 3);
    return nb.n; /* positions prefetched */
}

/* The kernels' prefetch while they compute a block: the block `ahead` positions further on
 * (kiln_kv_future_block; n = 0 when there is none or the span does not prefetch) is requested a few
 * rows at a time from inside the loop over the current block's keys (kiln_kv_prefetch_rows), not
 * all at once at the block's start: a burst of 128 line requests (a BF16 block of 16 rows of 128:
 * 4 KB of K and 4 KB of V) fills the core's outstanding-miss slots and the demand loads queue behind
 * it. Measured (the kernel alone, 1 thread, 16 layers × 8 KV heads × 4,000 positions, 3 query
 * rows, pages scattered, AVX-512, Zen 5; ns per position and KV head, integrity off / on): BF16
 * 64-67 / 78-81 → 28-29 / 39, FP8 35-37 / 40 → 26-27 / 30.6 (everything in cache: 25 / 24). */
static inline kiln_kv_block kiln_kv_future_block(const kiln_kv_span *sp, int b, int t1, int max_block) {
    kiln_kv_block f = {0};
    if (sp->prefetch && b < t1) f = kiln_kv_block_at(sp, b, t1, max_block, 1.0f);
    return f;
}
static inline void kiln_kv_prefetch_rows(const kiln_kv_span *sp, const kiln_kv_block *f, int j, int n) {
    if (j >= f->n || n <= 0) return;
    if (n > f->n - j) n = f->n - j;
    const uint8_t *k = f->k + (size_t)j * sp->row_k, *v = f->v + (size_t)j * sp->row_v;
    for (size_t o = 0; o < (size_t)n * sp->row_k; o += 64) __builtin_prefetch(k + o, 0, 3);
    if (f->v != f->k)
        for (size_t o = 0; o < (size_t)n * sp->row_v; o += 64) __builtin_prefetch(v + o, 0, 3);
}

/* Prefetch of the span's first `ahead` positions at kernel entry: the in-loop prefetch runs that far
 * ahead of the block being computed, so without this the first blocks' reads wait on memory — all
 * of them at short contexts (a 48-token decode step has three 16-position blocks per head).
 * Measured (bench-500m shape: 32 heads, 4 KV heads, head dim 64, BF16 KV, integrity off, 2
 * threads, 40 MB read before each layer's call, 300 alternating pairs, median µs per layer):
 * context 16 9.2 → 7.3, 48 14.7 → 11.5 (8.2 → 6.6 in a quieter run), 100 25.9 → 21.5, 512
 * 87 → 84, 2,048 287 → 280. */
static inline void kiln_kv_prefetch_head(const kiln_kv_span *sp, int t0, int t1, int max_block, int ahead) {
    const int end = t0 + ahead < t1 ? t0 + ahead : t1;
    for (int b = t0; b < end;) b += kiln_kv_prefetch_block(sp, b, end, max_block);
}

typedef void (*kiln_kv_attend_fn)(const kiln_kv_span *sp, kiln_kv_rows *rows, int t0, int t1);

/* The fused hash (sp->hsum set): each kernel hashes every K row (and V row, when hash_v) of a block
 * and adds the block's sums to its page's. Two forms, chosen per kernel variant and span:
 *  - row by row (SIMD kernels, BF16 / F32 with separate K and V rows of one size, at least one
 *    vector long): each K row and the V row at the same offset right after the K row's scores, with
 *    one load of their shared keys (a K and a V row at the same place in their slices have the same
 *    keys), into running vectors folded once per block (kiln_kv_hash_add);
 *  - whole blocks at the block's end, V then K, while both are in L1 (kiln_kv_hash_block: FP8, MLA
 *    pools whose V is a view of K, rows shorter than a vector, and the scalar kernel).
 * Measured (hashing cost over off; old = every block at its end): the kernel alone (`kiln bench
 * --attention --rounds 5`, 1 thread, 16 layers × 8 KV heads × 4,000 positions, head dim 128, cold,
 * AVX-512, Zen 5) BF16 +53-62% → +11-16% row by row (V chunk by chunk in the PV loop instead:
 * +20-25%; keys loaded apart for K and V: +15-21%), FP8 +17-19% → +13%; end to end, heal vs off
 * decode, row by row against block: tiny-llama-hd64 BF16 +7-14.5% → +1.4-6.7%, but FP8 +4-6% →
 * +9-12%, tiny-dsv3 (MLA) BF16 −0.1-5.1% → +9-11%, stories260K (head dim 8, a masked partial step per
 * row) +12-15% → +16-23%, and one step's attention at 4,000 tokens of the 1.7B shape FP8 +10-17% →
 * +16-23% — hence the block form there. */
static inline void kiln_kv_hash_add(const kiln_kv_span *sp, int b0, uint64_t k_sum, uint64_t v_sum) {
    uint64_t *h = sp->hsum + 2 * (size_t)(b0 / sp->page_tokens - sp->hslot0);
    h[0] += k_sum;
    if (sp->hash_v) h[1] += v_sum;
}
/* The block form: n rows of K (is_v 0) or V (is_v 1) at d, the block at b0, hashed whole. */
static inline void kiln_kv_hash_block(const kiln_kv_span *sp, int b0, int n, const uint8_t *d, int is_v,
                                      uint64_t (*mlh)(const uint8_t *, size_t, const uint32_t *)) {
    if (is_v && !sp->hash_v) return;
    const size_t row = is_v ? sp->row_v : sp->row_k, o0 = (size_t)(b0 % sp->page_tokens);
    const uint64_t h = mlh(d, (size_t)n * row, sp->hkey + o0 * (row / 4));
    kiln_kv_hash_add(sp, b0, is_v ? 0 : h, is_v ? h : 0);
}

/* The entry point of an ISA file's attention kernel: one instantiation of IMPL(sp, rw, t0, t1, R,
 * dtype, prerope, hashed) per row count R (1..KV_MAX_ROWS) and storage dtype, so that the rows' loops are
 * unrolled at compile time, and `static void attend(...)` picking the one for rw->R. Used by
 * attention_avx2.c and attention_avx512.c, which differ only in IMPL. Each (R, dtype) variant is
 * its own function (noinline) rather than a case inlined into one 40 KB function per R: a decode
 * step reaches the attention with its code evicted by the weight stream, and the variant it runs
 * is then one contiguous ~10 KB. Measured: cold-cache attention at 160 tokens (bench-500m shape,
 * BF16 KV, 40 MB read between calls, 6 alternating pairs) 0.98× — within this VM's noise. */
#define KILN_KV_ATTEND_VARIANT(IMPL, R, NAME, DT, PR, HS)                                        \
    static __attribute__((noinline)) void attend_r##R##_##NAME(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1) { \
        IMPL(sp, rw, t0, t1, R, DT, PR, HS);                                                       \
    }
/* HS: the fused hash compiled in (the _h variants, run when sp->hsum is set) or out: a runtime test
 * of sp->hsum inside the key loop cost the integrity-off kernel its register allocation (FP8,
 * 16,384 tokens, 2 threads: attention per step 34-38 → 37-43 ms). */
#define KILN_KV_ATTEND_INST(IMPL, R)                                                             \
    KILN_KV_ATTEND_VARIANT(IMPL, R, f32, KILN_KV_F32, 0, 0)                                        \
    KILN_KV_ATTEND_VARIANT(IMPL, R, bf16, KILN_KV_BF16, 0, 0)                                      \
    KILN_KV_ATTEND_VARIANT(IMPL, R, fp8, KILN_KV_FP8, 0, 0)                                        \
    KILN_KV_ATTEND_VARIANT(IMPL, R, fp8pr, KILN_KV_FP8, 1, 0)                                      \
    KILN_KV_ATTEND_VARIANT(IMPL, R, f32_h, KILN_KV_F32, 0, 1)                                      \
    KILN_KV_ATTEND_VARIANT(IMPL, R, bf16_h, KILN_KV_BF16, 0, 1)                                    \
    KILN_KV_ATTEND_VARIANT(IMPL, R, fp8_h, KILN_KV_FP8, 0, 1)                                      \
    KILN_KV_ATTEND_VARIANT(IMPL, R, fp8pr_h, KILN_KV_FP8, 1, 1)                                    \
    static void attend_r##R(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1) {           \
        const int h = sp->hsum != NULL;                                                            \
        switch (sp->dtype) {                                                                       \
        case KILN_KV_F32: (h ? attend_r##R##_f32_h : attend_r##R##_f32)(sp, rw, t0, t1); break;    \
        case KILN_KV_BF16: (h ? attend_r##R##_bf16_h : attend_r##R##_bf16)(sp, rw, t0, t1); break; \
        default:                                                                                   \
            if (sp->rope_cs) (h ? attend_r##R##_fp8pr_h : attend_r##R##_fp8pr)(sp, rw, t0, t1);    \
            else (h ? attend_r##R##_fp8_h : attend_r##R##_fp8)(sp, rw, t0, t1);                    \
            break;                                                                                 \
        }                                                                                          \
    }
#define KILN_KV_ATTEND_ENTRY(IMPL)                                                                 \
    KILN_KV_ATTEND_INST(IMPL, 1) KILN_KV_ATTEND_INST(IMPL, 2) KILN_KV_ATTEND_INST(IMPL, 3)         \
    KILN_KV_ATTEND_INST(IMPL, 4) KILN_KV_ATTEND_INST(IMPL, 5) KILN_KV_ATTEND_INST(IMPL, 6)         \
    KILN_KV_ATTEND_INST(IMPL, 7) KILN_KV_ATTEND_INST(IMPL, 8)                                      \
    static void attend(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1) {                \
        static void (*const fns[KV_MAX_ROWS + 1])(const kiln_kv_span *, kiln_kv_rows *, int, int) = { \
            NULL, attend_r1, attend_r2, attend_r3, attend_r4, attend_r5, attend_r6, attend_r7, attend_r8}; \
        if (rw->R >= 1 && rw->R <= KV_MAX_ROWS) fns[rw->R](sp, rw, t0, t1);                       \
    }

/* DSA indexer scores over FP8 keys (kv_sparse.c; DSA compact rows, kv.h). One definition of the
 * arithmetic that every ISA follows to the bit (tests/ops/test_backend_ops.c compares them):
 *   key[i]: position i's indexer key, d E4M3 codes followed by d/128 f32 scales s_b;
 *   qt [d][hp]: the token's indexer queries transposed (head h of value e at qt[e·hp + h]), heads
 *     padded with zeros to hp (a multiple of 16); w [hi]: the head weights (× their scale);
 *   k_e = code_e × 2^-8 (exact in f32; the SIMD files get it from the code shifted into an FP16);
 *   part_{h,b} = fma chain over e of block b, in increasing e, of qt[e][h] × k_e, from 0;
 *   dot_h = fma chain over b of (s_b × 2^8) × part_{h,b}, from 0 (a power of two: exact);
 *   score[i] = fma chain over h < hi of w[h] × (dot_h > 0 ? dot_h : 0), from 0.
 * The products q × k are exact in f32 (both are E4M3 values times powers of two), so only the
 * summation rounds, in this fixed order (NaN codes 0x7F / 0xFF, which the pool never writes, are
 * the exception: the scalar kernel reads NaN, the FP16 shift a finite value): a position's score does not depend on the ISA, the block
 * it is computed in or the other tokens of the step (prefill and decode agree bit for bit).
 * scratch: KILN_KV_INDEX_SCRATCH(d, hp) floats. */
#define KILN_KV_INDEX_SCRATCH(d, hp) (8 * ((size_t)(d) + (size_t)(hp))) /* up to 8 positions per pass */
typedef void (*kiln_kv_index_fn)(const uint8_t *const *key, int n, int d, const float *qt, int hp, const float *w, int hi, float *scratch,
                                 float *score);

typedef struct kiln_kv_ktable {
    kiln_kv_attend_fn attend;
    void (*quant_fp8)(const float *x, int n, float inv_scale, uint8_t *out);
    void (*quant_bf16)(const float *x, int n, uint16_t *out);
    /* Σ key[w] × word[w] mod 2^64 over the n bytes at d as little-endian 32-bit words (a last
     * partial word zero-padded): the content hash (kiln_kv_mlh, and the kernels' blocks). */
    uint64_t (*mlh)(const uint8_t *d, size_t n, const uint32_t *key);
    kiln_kv_index_fn index_scores;
} kiln_kv_ktable;

extern const kiln_kv_ktable kiln_kv_ktable_avx2;
extern const kiln_kv_ktable kiln_kv_ktable_avx512;

/* Scalar kernels (kv.c): the ISA-less path and the structure the SIMD files follow. */
void kiln_kv_attend_scalar(const kiln_kv_span *sp, kiln_kv_rows *rows, int t0, int t1);
uint64_t kiln_kv_mlh_scalar(const uint8_t *d, size_t n, const uint32_t *key);
void kiln_kv_index_scores_scalar(const uint8_t *const *key, int n, int d, const float *qt, int hp, const float *w, int hi, float *scratch,
                                 float *score);
/* The kernel table of an ISA (NULL: the scalar kernels). */
const kiln_kv_ktable *kiln_kv_table_for(kiln_isa isa);
/* The same with the process default ISA's kernel (every ISA gives the same value). */
uint64_t kiln_kv_mlh(const uint8_t *d, size_t n, const uint32_t *key);

/* exp(m_old − m_new) for the running-max update; 0 when m_old is -inf (nothing seen yet). */
static inline float kiln_kv_corr(float m_old, float m_new);
#include <math.h>
static inline float kiln_kv_corr(float m_old, float m_new) {
    return m_old == -INFINITY ? 0.0f : m_old == m_new ? 1.0f : expf(m_old - m_new);
}
/* The last step of kiln_kv_index_fn: score = fma chain over h < hi of w[h] × relu(dot[h]), from 0. */
static inline float kiln_kv_index_headsum(const float *dot, const float *w, int hi) {
    float s = 0.0f;
    for (int h = 0; h < hi; h++) s = fmaf(w[h], dot[h] > 0.0f ? dot[h] : 0.0f, s);
    return s;
}
#endif
