/* kv.h — the paged KV cache.
 *
 * A pool of fixed-size pages, sized from a byte budget. Page p holds, for every layer, K and V of
 * page_tokens consecutive positions: storage per layer is [n_pages][n_kv_heads][page_tokens][head_dim]
 * elements of the KV dtype (head-major inside a page so one head's keys are contiguous for the
 * attention dot products). A sequence owns a block table: its i-th entry is the page holding
 * positions [i*page_tokens, (i+1)*page_tokens). Pages carry reference counts so sequences can share
 * prefix pages. */
#ifndef KILN_KV_H
#define KILN_KV_H
#include "kiln.h"
#include <stdint.h>
#include <stddef.h>

typedef struct kiln_kv_config {
    int n_layers, n_kv_heads, head_dim;
    int page_tokens;
    kiln_kv_dtype dtype;    /* F32, BF16 or FP8 (AUTO must be resolved by the caller) */
    int64_t mem_bytes;      /* budget for all pages (page data + per-page metadata) */
} kiln_kv_config;

typedef struct kiln_kv_pool {
    kiln_kv_config cfg;
    int n_pages;
    size_t elem_bytes;       /* bytes per stored value */
    size_t head_stride;      /* bytes of one head's slice of a page: page_tokens × head_dim × elem */
    size_t page_layer_bytes; /* bytes of one page in one layer for K (same for V) */
    uint8_t **k, **v;        /* [n_layers] → [n_pages × page_layer_bytes] */
    int32_t *refcount;       /* [n_pages] */
    int32_t *free_list;      /* stack of free page ids */
    int n_free;
} kiln_kv_pool;

typedef struct kiln_kv_seq {
    int32_t *pages;          /* block table */
    int n_pages, cap;
    int len;                 /* tokens stored */
} kiln_kv_seq;

/* Bytes one page costs in the pool, all layers, K and V, metadata included. */
size_t kiln_kv_page_cost(const kiln_kv_config *cfg);
kiln_status kiln_kv_pool_create(const kiln_kv_config *cfg, kiln_kv_pool **out);
void kiln_kv_pool_free(kiln_kv_pool *p);
int64_t kiln_kv_capacity_tokens(const kiln_kv_pool *p);

/* Makes room for positions up to new_len (allocating pages); KILN_ERR_KV_EXHAUSTED when the pool
 * cannot. */
kiln_status kiln_kv_seq_reserve(kiln_kv_pool *p, kiln_kv_seq *s, int new_len);
void kiln_kv_seq_release(kiln_kv_pool *p, kiln_kv_seq *s);

/* Stores K and V ([n_kv_heads × head_dim] floats each) of position pos of layer l. */
void kiln_kv_store(kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, const float *k, const float *v);

/* Causal attention of one query position over positions [0, n_ctx) of layer l.
 *   q:   [n_heads × head_dim]  (already rotated)
 *   out: [n_heads × head_dim]
 *   att: scratch [n_heads × n_ctx] floats
 * GQA: query head h reads KV head h / (n_heads / n_kv_heads). scale = 1/sqrt(head_dim) usually. */
void kiln_kv_attend(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, const float *q, int n_heads,
                    int n_ctx, float scale, float *att, float *out);

/* Page-level sharing (kv_share.c; prefix caching in engine/prefix_cache.c, engine/scheduler.c):
 * an extra reference on a page in use / dropping one (the page returns to the free list at 0), and
 * appending another sequence's full page to a sequence that ends on a page boundary. */
void kiln_kv_page_ref(kiln_kv_pool *p, int32_t page);
void kiln_kv_page_unref(kiln_kv_pool *p, int32_t page);
kiln_status kiln_kv_seq_share_page(kiln_kv_pool *p, kiln_kv_seq *s, int32_t page);
#endif
