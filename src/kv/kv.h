/* kv.h — the paged KV cache (internal API; the public view is the KV block of kiln.h).
 *
 * A pool of fixed-size pages sized from a byte budget. Page p holds page_tokens consecutive
 * positions of one sequence for every layer. Per layer there is one K array and (unless
 * v_shares_k) one V array, each laid out [n_pages][n_kv_heads][page_tokens][dim] elements of the
 * KV dtype: head-major inside a page, so one head's rows of a page are contiguous for the
 * attention dot products, and one position's row of one head is `dim` contiguous values.
 *
 * Layout generality (for MLA): K rows have k_dim values and V rows v_dim values per KV head.
 * With v_shares_k no V array exists: V of a position is the first v_dim values of its K row
 * (MLA caches one latent row of kv_lora_rank + qk_rope_head_dim values, e.g. 576, with
 * n_kv_heads = 1, k_dim = 576, v_dim = 512; attention over it is MQA with 576-dim queries and
 * 512-dim outputs per head).
 *
 * Storage dtypes: F32 (calibration, reference), BF16, FP8 E4M3 (OCP "fn", max 448).
 * FP8 scales (value = fp8 × scale):
 *   static (default)  one scale per (layer, KV head) for K and one for V, fixed for the pool's
 *                     life (from the checkpoint, kv_scales.json or calibration). No per-token or
 *                     per-page bytes: FP8 pages are exactly half the bytes of BF16 pages.
 *   dynamic           one scale per (page, layer, KV head) for K and for V, kept in the page's
 *                     metadata. Rule: the scale is max over the rows written to that page so far of
 *                     amax(row) / 448. It is set by the first row written to the page; when a later
 *                     row's amax exceeds it, the scale grows to that amax / 448 and the rows already
 *                     in the page are re-quantized to the new scale (one extra rounding each). Once
 *                     the page's last position has been written (the page is sealed) its scale
 *                     never changes. Cost: 2 × n_layers × n_kv_heads × 4 bytes per page.
 * Conversion to FP8 is x × (1/scale) rounded to nearest even, saturating at ±448; NaN inputs are
 * stored as 0, so no NaN code (0x7F / 0xFF) is ever written.
 * K smoothing (FP8, optional, not with v_shares_k): with a static per-(layer, KV head, channel) key
 * mean k_mean (from calibration), K is stored as fp8((k − k_mean) / scale). Attention reads the
 * stored values as they are: q·(k − k_mean) differs from q·k by q·k_mean, the same for every
 * position of a query, and softmax is invariant to that shift, so the output is unchanged while
 * the quantized magnitudes (and errors) are smaller. kiln_kv_read_row adds k_mean back.
 * Pre-RoPE K smoothing (cfg.k_prerope): the stored key is k − R(pos)·k_mean and attention adds
 * q·R(pos)·k_mean to each score (not position-invariant; see kiln_kv_config).
 *
 * A sequence owns a block table (kiln_kv_seq): entry i is the page holding positions
 * [i × page_tokens, (i + 1) × page_tokens). Pages carry reference counts so sequences can share
 * prefix pages (kiln_kv_seq_share_prefix). Every page has a header (kiln_kv_page) counted in the
 * budget; it reserves room for the integrity seals of issue 5. */
#ifndef KILN_KV_H
#define KILN_KV_H
#include "kiln.h"
#include "kernels/gemv.h"
#include <stdint.h>
#include <stddef.h>

typedef struct kiln_kv_config {
    int n_layers, n_kv_heads, head_dim; /* head_dim: K and V row size when k_dim / v_dim are 0 */
    int page_tokens;
    kiln_kv_dtype dtype;    /* F32, BF16 or FP8 (AUTO must be resolved by the caller) */
    int64_t mem_bytes;      /* budget for the whole pool: pages, page metadata and pool scales */
    int k_dim, v_dim;       /* values per KV head per position of K and V (0 = head_dim) */
    int v_shares_k;         /* 1: no V storage; V = first v_dim values of the K row (MLA) */
    kiln_kv_scale_mode scale_mode; /* FP8 only: static (default) or dynamic */
    const float *k_scale, *v_scale; /* FP8 static: [n_layers × n_kv_heads] dequant scales, copied by
                                       kiln_kv_pool_create (v_scale unused when v_shares_k) */
    const float *k_mean;    /* FP8, optional: [n_layers × n_kv_heads × k_dim] K smoothing means
                               (copied; ignored when v_shares_k); NULL = none */
    /* Pre-RoPE K smoothing (FP8 static, needs k_mean): k_mean is the mean of the keys BEFORE RoPE,
     * and K of position pos is stored as fp8((k − R(pos)·k_mean) / scale), R(pos) the model's RoPE
     * rotation over the whole head (pairs (2i, 2i+1) when rope_norm, else (i, i + k_dim/2);
     * frequency of pair i = rope_theta^(-2i/k_dim), as model/forward.c). q·R(pos)·k_mean depends on
     * the key's position, so attention adds it to each score (kv_isa.h). rope_positions: positions
     * [0, rope_positions) may be stored (the pool keeps their cos/sin: rope_positions × k_dim × 4
     * bytes, counted in the pool's fixed bytes). */
    int k_prerope;
    float rope_theta;
    int rope_norm;
    int rope_positions;
    /* DSA compact rows (sparse-attention models, docs/DSA.md; 0 = off): the K row of k_dim =
     * dsa_latent + dsa_rope + dsa_key values (n_kv_heads 1, v_shares_k, v_dim <= dsa_latent) is
     * stored as SGLang's / vLLM's FP8 DSA layout does, in bytes:
     *   [latent: dsa_latent E4M3 codes | dsa_latent / 128 f32 scales | rope: dsa_rope values of
     *    dtype (F32 or BF16) | indexer key: dsa_key E4M3 codes | dsa_key / 128 f32 scales]
     * Each block of 128 latent / key values is stored as act_quant stores it (DeepSeek-V3.2's
     * kernel.py): scale = 2^ceil(log2(max(amax, 1e-4) / 448)), codes = E4M3(x / scale). The model
     * hands over values it has already rounded that way, which this encoding keeps exactly (a value
     * E4M3 × s0 with s0 >= the scale recomputed from the rounded block is E4M3 × the new scale), so
     * reading back gives the model's values bit for bit. dsa_latent and dsa_key: multiples of 128. */
    int dsa_latent, dsa_rope, dsa_key;
    /* DSA: [n_layers] 1 = the layer's rows hold an indexer key, 0 = they end after the rope part (a
     * layer that reuses another layer's selection: no key bytes at all); NULL = every layer. Copied
     * by kiln_kv_pool_create. */
    const unsigned char *dsa_key_layers;
    /* Memory of the layer arrays (optional; NULL = host memory, kiln_alloc64): a backend whose
     * kernels read the pages where they lie gives them from its own allocator (the vulkan backend:
     * device-addressable buffers its attention shader reads; backend.h kiln_be_kv_arrays). An array
     * the allocator cannot give (NULL: too large for one device allocation, out of device memory)
     * falls back to host memory, and that layer's attention then runs on the host. arrays_free takes
     * back exactly what arrays_alloc returned; the arrays' first contents are unspecified (every
     * position is written before it is read). */
    void *(*arrays_alloc)(void *ctx, size_t bytes);
    void (*arrays_free)(void *ctx, void *ptr);
    void *arrays_ctx;
} kiln_kv_config;

/* Page header (16 bytes). One per page, counted in the page's cost together with the page's
 * reference count and free-list slot (kiln_kv_pool.refcount / free_list: 4 bytes each). */
typedef struct kiln_kv_page {
    uint32_t epoch;         /* allocation epoch: bumped each time the page is handed out */
    uint32_t flags;         /* KILN_KV_PAGE_SEALED once its last position is written (last layer) */
    uint64_t seal;          /* issue 5 (integrity): seal over identity + content; unused now */
} kiln_kv_page;
#define KILN_KV_PAGE_SEALED 1u

typedef struct kiln_kv_pool {
    kiln_kv_config cfg;     /* resolved: k_dim / v_dim set, scale pointers cleared */
    int n_pages;
    size_t elem_bytes;      /* bytes per stored value */
    size_t row_k, row_v;    /* bytes of one position's row of one head (row_v = row_k when shared);
                               K: the largest layer's — kiln_kv_row_k_at gives each layer's (DSA
                               layers without an indexer key have shorter rows) */
    size_t head_k, head_v;  /* bytes of one head's slice of a page: page_tokens × row (K: the largest) */
    size_t page_k, page_v;  /* bytes of one page in one layer's K (V) array (K: the largest) */
    size_t *row_kl;         /* [n_layers] each layer's K row bytes */
    unsigned char *dsa_keyl; /* [n_layers] copy of cfg.dsa_key_layers (NULL when it was NULL) */
    uint8_t **k, **v;       /* [n_layers] → [n_pages × page_k] (v[l] == k[l] when v_shares_k) */
    unsigned char *from_arrays_alloc; /* [2 × n_layers]: K (2l) / V (2l + 1) array came from cfg.arrays_alloc */
    float *k_scale, *v_scale; /* static FP8: [n_layers × n_kv_heads] (v_scale == k_scale when shared) */
    float *k_mean;          /* K smoothing means [n_layers × n_kv_heads × k_dim], or NULL */
    float *rope_cs;         /* pre-RoPE smoothing: [rope_positions][k_dim] = cos of the k_dim/2 pairs,
                               then their sin; NULL otherwise */
    float *dscale;          /* dynamic FP8: [n_layers][n_pages][2][n_kv_heads] (K then V); 0 = unset */
    size_t dsa_rope_at, dsa_key_at; /* DSA compact rows: byte offsets of the rope part and the indexer key
                               (the latent's codes at 0, its scales at dsa_latent); 0 = not compact */
    kiln_kv_page *pages;    /* [n_pages] headers */
    int32_t *refcount;      /* [n_pages] sequences (and caches) holding the page; 0 = free */
    int32_t *free_list;     /* stack of free page ids */
    int n_free;
    uint32_t epoch;
    struct kiln_kv_integ *integ; /* KV integrity state (kv/integrity.h), NULL = integrity off */
} kiln_kv_pool;

typedef struct kiln_kv_seq {
    int32_t *pages;         /* block table */
    int n_pages, cap;
    int len;                /* tokens stored */
    struct kiln_kv_seq_integ *integ; /* KV integrity: tokens, binding records (kv/integrity.h); NULL = none yet */
} kiln_kv_seq;

/* Layer l's K row, head slice and page bytes (a layer's K array is n_pages × page bytes). */
static inline size_t kiln_kv_row_k_at(const kiln_kv_pool *p, int l) { return p->row_kl[l]; }
static inline size_t kiln_kv_head_k_at(const kiln_kv_pool *p, int l) { return p->row_kl[l] * (size_t)p->cfg.page_tokens; }
static inline size_t kiln_kv_page_k_at(const kiln_kv_pool *p, int l) { return kiln_kv_head_k_at(p, l) * (size_t)p->cfg.n_kv_heads; }
/* Whether layer l of a DSA pool stores an indexer key. */
static inline int kiln_kv_dsa_has_key(const kiln_kv_config *c, int l) { return !c->dsa_key_layers || c->dsa_key_layers[l]; }

/* ---- sizes (pure arithmetic on a config; no allocation) ---- */
size_t kiln_kv_elem_bytes(kiln_kv_dtype dt);
/* Bytes of one position's K row of one KV head in layer l (the DSA compact row's bytes when
 * cfg.dsa_latent; without its key when that layer stores none). */
size_t kiln_kv_row_bytes(const kiln_kv_config *cfg, int l);
/* Bytes of KV data one token costs over all layers (K and V): the figure that halves with FP8.
 * E.g. Kimi-K2 (61 layers × 576 latent values, v_shares_k): 70,272 BF16, 35,136 FP8. */
uint64_t kiln_kv_token_bytes(const kiln_kv_config *cfg);
uint64_t kiln_kv_page_data_bytes(const kiln_kv_config *cfg); /* page_tokens × token bytes */
uint64_t kiln_kv_page_meta_bytes(const kiln_kv_config *cfg); /* header + free-list slot (+ dynamic scales) */
size_t kiln_kv_page_cost(const kiln_kv_config *cfg);          /* data + metadata */
uint64_t kiln_kv_pool_fixed_bytes(const kiln_kv_config *cfg);  /* per-pool metadata (static scales, K means) */
/* Pages the budget holds: (mem_bytes − fixed) / page cost (may be 0). */
int64_t kiln_kv_plan_pages(const kiln_kv_config *cfg);
/* Checks the config (dims, page size, dtype, scale mode); errors name the field. */
kiln_status kiln_kv_config_check(const kiln_kv_config *cfg);

kiln_status kiln_kv_pool_create(const kiln_kv_config *cfg, kiln_kv_pool **out);
void kiln_kv_pool_free(kiln_kv_pool *p);
int64_t kiln_kv_capacity_tokens(const kiln_kv_pool *p);

/* Makes room for positions up to new_len (allocating pages); KILN_ERR_KV_EXHAUSTED when the pool
 * cannot. */
kiln_status kiln_kv_seq_reserve(kiln_kv_pool *p, kiln_kv_seq *s, int new_len);
void kiln_kv_seq_release(kiln_kv_pool *p, kiln_kv_seq *s);
/* dst (empty) takes the first n_tokens of src: full pages are shared (refcount + 1), a partial last
 * page is copied into a fresh page (copy-on-write up front), so either sequence can append. */
kiln_status kiln_kv_seq_share_prefix(kiln_kv_pool *p, kiln_kv_seq *dst, const kiln_kv_seq *src, int n_tokens);

/* Page-level sharing (kv_share.c; prefix caching in engine/prefix_cache.c, engine/scheduler.c):
 * an extra reference on a page in use / dropping one (the page returns to the free list at 0), and
 * appending another sequence's full page to a sequence that ends on a page boundary. */
void kiln_kv_page_ref(kiln_kv_pool *p, int32_t page);
void kiln_kv_page_unref(kiln_kv_pool *p, int32_t page);
kiln_status kiln_kv_seq_share_page(kiln_kv_pool *p, kiln_kv_seq *s, int32_t page);

/* Stores K ([n_kv_heads × k_dim] floats) and V ([n_kv_heads × v_dim] floats; NULL when v_shares_k)
 * of position pos of layer l. The page must be reserved and not shared. */
void kiln_kv_store(kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, const float *k, const float *v);
/* kiln_kv_store with the row conversions of the compute context's ISA (kiln_kv_store: the process
 * default's); the stored bytes are the same on every ISA. */
void kiln_kv_store_cx(const kiln_kctx *cx, kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, const float *k, const float *v);

/* Frees the calling thread's attention scratch (grow-only, kept between calls so steady-state decode
 * does not allocate). A thread that ran attention calls it before it exits (the scheduler thread
 * does at stop); the next attention call on the thread allocates again. */
void kiln_kv_thread_scratch_free(void);
/* Attention of n query tokens, each over its own sequence: token i (sequence seq[i], position
 * pos[i]) attends to positions [0, pos[i]] of its sequence in layer l, which must be stored.
 *   q:   [n × n_heads × k_dim]   (already rotated)
 *   out: [n × n_heads × v_dim]
 * GQA/MQA: query head h reads KV head h / (n_heads / n_kv_heads). Scores are (q · k) × scale.
 * Dequantization is fused into the dot products; decode (n = 1) and prefill (n > 1, tiles of
 * consecutive tokens of one sequence share each K/V read) run the same kernels, dispatched on the
 * compute context's ISA and split over its threads (kiln's worker pool) by (KV head, query rows,
 * context splits). Seals of the pages read are verified in the same call when the pool has
 * integrity on (kv/integrity.h). */
void kiln_kv_attend_batch_cx(const kiln_kctx *cx, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                             const float *q, int n_heads, float scale, float *out);
/* The integrity half of kiln_kv_attend_batch_cx alone: with integrity on, verifies the seals of
 * every page that call would read (each distinct sequence's positions [0, max pos + 1), every KV
 * head), with the same detections, counters and bad-slot publication, and computes nothing. For a
 * backend that computes the attention itself on the pages as they lie (the vulkan shader): it calls
 * this first and, in heal / strict mode, the caller discards the outputs of a sequence that failed
 * exactly as after kiln_kv_attend_batch_cx. No-op without integrity. */
void kiln_kv_verify_attend_cx(const kiln_kctx *cx, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos);
/* kiln_kv_attend_batch_cx under the process default context (kernels/gemv.h: kiln_kctx_default). */
void kiln_kv_attend_batch(const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                          const float *q, int n_heads, float scale, float *out);
/* One query position over positions [0, n_ctx). att is unused (kept for older callers; may be NULL). */
void kiln_kv_attend(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, const float *q, int n_heads,
                    int n_ctx, float scale, float *att, float *out);

/* Dequantized row of position pos, KV head h, of layer l: K (is_v = 0, k_dim values) or V
 * (is_v = 1, v_dim values). For tests, calibration and inspection. */
void kiln_kv_read_row(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, int h, int is_v, float *out);
/* Values [off, off + n) of K row (layer, pos, KV head h), dequantized (no K-smoothing mean: for
 * pools whose rows hold several fields, e.g. DSA's [latent | indexer key], kv_sparse.c). */
void kiln_kv_read_row_part(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, int h, int off, int n, float *out);

/* ---- DeepSeek sparse attention (DSA; kv_sparse.c, model/mla.h) over an MLA pool (n_kv_heads 1,
 * V = the first v_dim values of the K row) whose K row is [latent (kq values) | indexer key (d
 * values at offset off)]. ---- */
/* The lightning indexer's selection: for token i (sequence seq[i], position pos[i]) the score of
 * position t <= pos[i] is  s_t = Σ_h (w[i·Hi + h] · w_scale) · relu(qi[i, h, :] · k_t),  k_t the indexer key
 * stored at t (w already multiplied by w_scale); sel[i·topk ..] receives the min(topk, pos[i] + 1) positions of highest score (ties:
 * the lower position first), in increasing position order, and nsel[i] their count. With
 * integrity on, every page read is verified first (kv/integrity.h) and positions in a page that
 * failed are never selected (nsel may then be smaller). qi [n, Hi, d], w [n, Hi]. */
void kiln_kv_index_topk_cx(const kiln_kctx *cx, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                           const float *qi, int n_ih, int d, int off, const float *w, float w_scale, int topk, int32_t *sel, int *nsel);
/* Seconds spent in the two ops above since the process started (all threads' calls, wall time of
 * each call): what `kiln bench --batch` reports per decode step for sparse-attention models. */
void kiln_kv_sparse_times(double *index_s, double *attend_s);
/* Attention of n tokens over their selected positions only (sel/nsel as above, rows of topk):
 * q [n, H, kq] against the first kq values of each selected row, softmax × scale, out [n, H, v_dim]
 * = Σ p_t · (first v_dim values of row t). verify: 1 = check the seals of the pages of
 * [0, pos[i]] here (a layer that reuses another layer's selection; kiln_kv_index_topk_cx verified
 * them for a layer with its own indexer), and never read a page that failed. */
void kiln_kv_attend_sparse_cx(const kiln_kctx *cx, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                              const int32_t *sel, const int *nsel, int topk, const float *q, int n_heads, int kq, float scale, int verify,
                              float *out);

/* amax of the stored rows of positions [0, n) per (layer, KV head), max-accumulated into
 * kamax / vamax [n_layers × n_kv_heads] (vamax may be NULL). */
void kiln_kv_seq_amax(const kiln_kv_pool *p, const kiln_kv_seq *s, int n, float *kamax, float *vamax);
/* Per-channel K statistics of positions [0, n), accumulated into ksum (double), kmin, kmax
 * [n_layers × n_kv_heads × k_dim] (for the K smoothing means: mean = ksum / tokens, and the amax
 * of K − mean per (layer, head) = max over channels of max(kmax − mean, mean − kmin)). */
void kiln_kv_seq_kstats(const kiln_kv_pool *p, const kiln_kv_seq *s, int n, double *ksum, float *kmin, float *kmax);

/* ---- conversions (dispatched like the kernels; exact against base/fp.h's reference) ---- */
/* f32 → E4M3: round to nearest even, saturating to ±448, NaN → 0 (never a NaN code). Equals
 * kiln_f32_to_fp8_e4m3 for every non-NaN input; bit manipulation instead of a table search. */
uint8_t kiln_kv_f32_to_fp8(float x);
/* out[i] = kiln_kv_f32_to_fp8(x[i] × inv_scale), SIMD under AVX2 / AVX-512. */
void kiln_kv_quant_fp8(const float *x, int n, float inv_scale, uint8_t *out);
/* out[i] = bf16 RNE of x[i] (kiln_f32_to_bf16), SIMD under AVX2 / AVX-512. */
void kiln_kv_quant_bf16(const float *x, int n, uint16_t *out);
#endif
