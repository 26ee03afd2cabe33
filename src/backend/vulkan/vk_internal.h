/* vk_internal.h — what the vulkan backend's modules share (not a public header): the backend's
 * state, the staging / flush machinery of backend_vulkan.c and the attention helpers of
 * vk_attend.c that the sparse-attention ops reuse.
 *   backend_vulkan.c  state, buffers, staging, flush, weights, matmul, element-wise ops, lifetime
 *   vk_attend.c       attention over KV pages and the KV store (kv_attend / kv_merge / kv_store)
 *   vk_moe.c          MoE: grouped experts, routing and combine on the device
 *   vk_dsa.c          DeepSeek sparse attention: LayerNorm, FP8 rounding, indexer scan + top-k,
 *                     sparse attention, on the compact rows of a DSA pool */
#ifndef KILN_VK_INTERNAL_H
#define KILN_VK_INTERNAL_H
#include "backend/backend.h"
#include "backend/backend_common.h"
#include "backend/vulkan/backend_vulkan.h"
#include "backend/vulkan/vk_device.h"
#include "base/fp.h"
#include "base/status.h"
#include "kv/integrity.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *p;
    size_t size;
    kiln_vk_buf b;
    uint64_t addr;  /* device address of p (0 without buffer device addresses) */
} vk_alloc;

typedef struct {
    kiln_vk_buf data, scales;
    int64_t row0, rows;
} vk_chunk;

typedef struct {
    const void *data, *scales;
    kiln_wformat fmt;
    int64_t rows, cols;
    uint64_t fingerprint;
    int n_chunks;
    vk_chunk *chunks;
} vk_weight;

typedef struct {
    void *host;
    const uint8_t *staged;
    size_t bytes;
} vk_copyback;

/* What record_attend leaves for the check after the flush (KV integrity with device hashing). */
typedef struct {
    uint64_t *hs;    /* per owner token's sequence: [slots][KV heads][K, V] content-hash sums (copied back at the flush) */
    int64_t *hbase;  /* [n]: token i's first sum, or -1 when it is not its sequence's owner */
} att_hash;

/* A hashed attention whose seals are compared when its dispatch has run (at the flush that runs
 * it: backend.h deferred steps), against the integrity call it belonged to. */
typedef struct {
    const kiln_kv_pool *p;
    int layer, n;
    kiln_kv_seq **seq; /* copies of the call's arrays */
    int *pos;
    att_hash ah;
    kiln_kv_integ_call call;
} att_check;

/* A KV store the device writes (kv_store.comp), sealed on the host once its dispatch has run:
 * KV integrity's bookkeeping was done when it was recorded (kiln_kv_integ_store_begin), the seals
 * take the row hashes the shader computed (kiln_kv_integ_store_end) — or, when the flush failed,
 * the bookkeeping is undone so that the host can store the tokens again. */
typedef struct {
    kiln_kv_pool *p;
    int layer, n;
    kiln_kv_seq **seq; /* copies of the call's arrays */
    int *pos;
    kiln_kv_integ_pending *pend;
    uint64_t *hs;      /* [n][kinds][KV heads] row hashes (copied back at the flush) */
} st_seal;
static inline void st_seal_free(st_seal *c) { free(c->seq); free(c->pos); free(c->pend); free(c->hs); }

/* The device addresses of one MoE layer's experts: [gate | up | down][E][data lo, hi, scales lo, hi]
 * (matmul.comp BYID reads them), built when the layer first runs on the device. */
typedef struct moe_tab {
    const kiln_weight *gate, *up, *down;
    int E;
    uint64_t gen, fp_first, fp_last; /* weights_gen when built; fingerprints of gate[0] and down[E-1] */
    uint32_t *addr;
} moe_tab;

/* the two staging arenas (vk_state.arena) */
enum { ARENA_READ = 0, ARENA_WRITTEN = 1 };

typedef struct {
    kiln_vk *vk;
    size_t align, max_range;
    uint32_t max_gx;
    vk_alloc *allocs;
    int n_allocs, cap_allocs;
    vk_weight *weights;
    int n_weights, cap_weights;
    int *widx;               /* open addressing over weights by (data, format, shape): index + 1, 0 = empty */
    size_t widx_cap;         /* a power of two, at least twice n_weights */
    kiln_vk_buf lut;         /* FP8 e4m3 byte → f32 */
    /* Staging for pointers kiln_be_alloc did not hand out, two arenas: [ARENA_READ] the operands
     * shaders only read (norm weights, biases, page tables: placed as activations, act_where — in
     * mapped VRAM on a discrete GPU, where a 64-invocation RMSNorm reading its weights from host
     * memory across PCIe took 67 us on an H200), [ARENA_WRITTEN] those a shader writes, which the
     * flush copies back to the caller's memory (host memory: the CPU reads mapped VRAM uncached). */
    kiln_vk_buf arena[2];
    size_t arena_used[2];
    /* The k-th operand staged since the last flush goes to region k of the arena, whose size
     * (slot_cap[k], a power of two) only grows: a step of the same shape stages at the same offsets
     * and ranges whatever its tables' lengths (a decode step's page table grows by a word now and
     * then), so its dispatches bind the same ranges and the recorded command buffer is replayed
     * (vk_device.c). arena_need: the regions a flush used, the arena's size from the next flush. */
    size_t *slot_cap;
    int n_slot_cap, stage_k;
    size_t arena_need[2];
    size_t arena_failed[2];  /* an arena of this size could not be had: not asked for again up to it */
    kiln_vk_buf *extra;      /* staging buffers beyond the arena, freed at the flush */
    int n_extra, cap_extra;
    vk_copyback *cb;
    int n_cb, cap_cb;
    kiln_vk_buf att_part;    /* attention's per-split partial results (device-local, grown as needed) */
    kiln_vk_buf idx_scores;  /* the indexer's scores [group tokens][context] (device-local, grown as needed) */
    size_t idx_budget;       /* bytes of scores one scan may write: min(one binding, 256 MiB; KILN_VK_INDEX_BYTES) */
    int moe_tokens;          /* tokens per piece of a routed MoE chunk: MOE_ROUTED_MAX_TOKENS (KILN_VK_MOE_TOKENS lowers it) */
    att_check *checks;       /* hashed attentions recorded since the last flush */
    int n_checks, cap_checks;
    st_seal *seals;          /* device stores with KV integrity recorded since the last flush */
    int n_seals, cap_seals;
    struct moe_tab *moe_tabs; /* device addresses of MoE layers' experts (vk_moe_routed) */
    int n_moe_tabs, cap_moe_tabs;
    uint64_t weights_gen;    /* bumped whenever a device weight is freed (the address tables are rebuilt) */
    int route_ok;            /* the device's routing checked against the host's: 0 not yet, 1 equal, -1 not (host routes) */
    uint64_t w_total, w_uploaded; /* the model's weight bytes (expect_weights) and those on the device so far */
    int w_tenths;            /* tenths of w_total reported */
    int failed;
    /* Deferred steps (backend.h kiln_be_defer): while depth > 0 the device ops only record, and
     * what they recorded runs at the next flush — a host-side op (which reads their results), a
     * kiln_be_wait / kiln_be_end, a hashed attention. lost: a flush failed while deferring, so the
     * results of ops recorded since the previous flush never came (kiln_be_end reports it). */
    pthread_mutex_t allocs_mu; /* guards allocs / n_allocs / cap_allocs */
    int defer_depth, lost;
    int staged_any;          /* something was staged since the last flush ... */
    uint64_t staged_at;      /* ... last when n_dispatch had this value (a dispatch since: its operands were used) */
    int gemv_rows;           /* INT4 decode GEMV rows per workgroup: 1 or 4 (KILN_VK_GEMV_ROWS) */
    uint64_t n_gemv4;        /* dispatches of the 4-row INT4 GEMV (kiln_backend_vulkan_gemv4_dispatches) */
    int ffn_pair;            /* gate, up and SwiGLU as one dispatch in decode (matmul.comp PAIR; KILN_VK_FFN_PAIR=0: three) */
    uint64_t n_pair;         /* dispatches of matmul_pair */
    int host_threads;        /* the backend's host threads (kiln_kctx threads): the flush's seal comparisons */
    int act_where;           /* kiln_vk_buf_create's placement of kiln_be_alloc's buffers (KILN_VK_ACTIVATIONS) */
    int kv_host_said;        /* the KV-array fallback was reported */
    uint64_t n_dispatch, n_host; /* ops run on the device / ops `supports` calls native that fell back to the host */
} vk_state;

static inline vk_state *ST(const kiln_backend *be) { return (vk_state *)be->impl; }

/* A binding covering [ptr, ptr + bytes) and the element (float / word) offset of ptr inside it.
 * Buffers kiln_be_alloc handed out are bound in place; any other pointer is copied into staging
 * (and back after the flush when `written`). Returns -1 when the range cannot be bound (larger than
 * the device's maxStorageBufferRange): the caller computes on the host. */
typedef struct {
    kiln_vk_bind b;
    uint32_t off;
} vref;

/* matmul.comp's parameters (record_matmul here, the by-id matmuls in vk_moe.c) */
typedef struct {
    uint32_t rows, cols, r0, n, x_off, x_stride, y_off, y_stride, block, scols, row_bytes;
    uint32_t x_hstride, y_hstride, h_rows; /* stacked heads (matmul.comp); 0 for a plain matmul */
    uint32_t x_div, tab_off, ids_off;      /* matmul_id (BYID) only */
    uint32_t ord_off;                      /* matmul8_id only: the expert-sorted tiles (moe_sort.comp) */
    uint32_t g_wlo, g_whi, g_slo, g_shi;   /* matmul_pair only: the gate chunk's data / scales addresses, */
    uint32_t u_wlo, u_whi, u_slo, u_shi;   /* the up chunk's, */
    uint32_t r0u;                          /* and up's first row in its chunk (gate's: r0) */
} mm_push;

/* ---- backend_vulkan.c ---- */
const vk_weight *vkb_device_weight(vk_state *s, const kiln_weight *w);
int vkb_done(vk_state *s);
void vkb_fail_once(vk_state *s, const char *op);
uint64_t vkb_fingerprint(const kiln_weight *w);
int vkb_flush(vk_state *s);
int vkb_grow(void **arr, int *cap, int need, size_t elem);
void vkb_host_first(vk_state *s);
kiln_vk_shader vkb_matmul_shader(kiln_wformat f);
int vkb_matmul_shape_ok(const kiln_weight *w);
int vkb_record_ew(vk_state *s, kiln_vk_shader sh, float *y, const float *x, size_t x_len, int64_t len, int width);
int vkb_record_matmul(vk_state *s, const kiln_weight *w, const float *X, int64_t x_stride, float *Y, int64_t y_stride, int n);
int vkb_find_alloc(vk_state *s, const void *ptr, size_t bytes, vk_alloc *a);
int vkb_resolve(vk_state *s, const void *ptr, size_t bytes, int written, vref *r);
int vkb_stage(vk_state *s, const void *ptr, size_t bytes, int written, vref *r);
void vkb_abandon_op(vk_state *s, const char *op);
/* an op that recorded something and then could not finish on the device: run what was recorded
 * (its host fallback reads those results), then count the fallback */
/* Up to MOE_BYID_MAX_TOKENS tokens the experts run by id on the device's own routing, one
 * workgroup per (row, (token, slot) entry) (decode, small batches, speculative verification). A
 * longer chunk (prefill) has its entries sorted by expert on the device too (moe_sort.comp), in
 * pieces of up to MOE_ROUTED_MAX_TOKENS tokens, and runs them in tiles of 8 entries of one expert
 * (matmul8_id), so an expert's weights are read once per 8 of its entries, as the host-grouped path
 * did — without the submit per MoE layer the host's routing needed. A token's floats are the same
 * either way (the same routing, the same per-token matmul operations, the same combine order). More
 * tiles than the device's workgroup grid holds: the host-routed path. */
#define MOE_BYID_MAX_TOKENS 16
#define MOE_ROUTED_MAX_TOKENS 8192

#define abandon(s) vkb_abandon_op((s), __func__)

/* ---- vk_attend.c ---- */
int vkb_arrays_on_device(vk_state *s, const kiln_kv_pool *p, int layer);
void vkb_call_reach(int n, kiln_kv_seq *const *seq, const int *pos, int pt, int hashing, size_t sums_per_slot, int *first, int *reach,
                    int64_t *hbase, size_t *n_ent, size_t *n_sums, int *max_lim);
/* Compares the sums of n_checks hashed passes with their seals, on up to `threads` host threads. */
void vkb_check_all(const att_check *checks, int n_checks, int threads);
uint64_t vkb_device_address(vk_state *s, const void *ptr, size_t bytes);
void vk_kv_attend(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, const float *q,
                  int n_heads, float scale, float *out);
void vk_kv_store(const kiln_backend *be, kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer, const float *k, int64_t k_tok,
                 const float *v, int64_t v_tok);

/* ---- vk_moe.c ---- */
void vk_moe_combine(const kiln_backend *be, int n, int K, int dim, const int *slot, const float *wt, const float *yg, float *Y);
void vk_moe_experts(const kiln_backend *be, const kiln_moe_cfg *c, const kiln_weight *gate, const kiln_weight *up, const kiln_weight *down,
                    const int *active, int n_active, const int *offset, const float *xg, float *hg, float *ug, float *yg);
int vk_moe_routed(const kiln_backend *be, const kiln_moe_cfg *c, const float *logits, const float *bias, const kiln_weight *gate,
                  const kiln_weight *up, const kiln_weight *down, const float *X, int n, float *hg, float *ug, float *yg, float *Y);

/* ---- vk_dsa.c ---- */
void vk_fp8_round(const kiln_backend *be, float *x, int rows, int width, int hadamard);
void vk_kv_attend_sparse(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                         const int32_t *sel, const int *nsel, int topk, const float *q, int n_heads, int kq, float scale, int verify, float *out);
void vk_kv_index_topk(const kiln_backend *be, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos, const float *qi,
                      int n_ih, int d, int off, const float *w, float w_scale, int topk, int32_t *sel, int *nsel);
void vk_layernorm(const kiln_backend *be, float *out, const float *x, const float *w, const float *b, int rows, int width, float eps);

#endif
