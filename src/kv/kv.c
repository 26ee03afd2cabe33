/* kv.c — the paged KV pool, block tables and attention over pages. */
#include "kv/kv.h"
#include "base/fp.h"
#include "base/status.h"
#include "kernels/gemv.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t elem_size(kiln_kv_dtype dt) { return dt == KILN_KV_F32 ? 4 : dt == KILN_KV_BF16 ? 2 : 1; }

size_t kiln_kv_page_cost(const kiln_kv_config *c) {
    size_t data = 2ull * (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)c->page_tokens * (size_t)c->head_dim * elem_size(c->dtype);
    return data + 2 * sizeof(int32_t); /* refcount + free-list slot */
}

kiln_status kiln_kv_pool_create(const kiln_kv_config *cfg, kiln_kv_pool **out) {
    *out = NULL;
    if (cfg->dtype != KILN_KV_F32 && cfg->dtype != KILN_KV_BF16)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "kv-dtype: only f32 and bf16 are implemented in this build");
    if (cfg->page_tokens < 1 || cfg->page_tokens > 4096)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kv page size %d is out of range [1, 4096]", cfg->page_tokens);
    size_t cost = kiln_kv_page_cost(cfg);
    int64_t n_pages = cfg->mem_bytes / (int64_t)cost;
    if (n_pages < 1)
        return kiln_fail(KILN_ERR_KV_EXHAUSTED, "KV budget exhausted: --kv-mem %lld bytes is smaller than one page (%zu bytes)",
                         (long long)cfg->mem_bytes, cost);
    if (n_pages > (1 << 30)) n_pages = 1 << 30;
    kiln_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    p->cfg = *cfg;
    p->n_pages = (int)n_pages;
    p->elem_bytes = elem_size(cfg->dtype);
    p->head_stride = (size_t)cfg->page_tokens * (size_t)cfg->head_dim * p->elem_bytes;
    p->page_layer_bytes = p->head_stride * (size_t)cfg->n_kv_heads;
    p->k = calloc((size_t)cfg->n_layers, sizeof *p->k);
    p->v = calloc((size_t)cfg->n_layers, sizeof *p->v);
    p->refcount = calloc((size_t)n_pages, sizeof *p->refcount);
    p->free_list = malloc((size_t)n_pages * sizeof *p->free_list);
    int ok = p->k && p->v && p->refcount && p->free_list;
    for (int l = 0; ok && l < cfg->n_layers; l++) {
        p->k[l] = malloc(p->page_layer_bytes * (size_t)n_pages);
        p->v[l] = malloc(p->page_layer_bytes * (size_t)n_pages);
        ok = p->k[l] && p->v[l];
    }
    if (!ok) {
        kiln_kv_pool_free(p);
        return kiln_fail(KILN_ERR_NOMEM, "cannot allocate a KV pool of %lld bytes", (long long)cfg->mem_bytes);
    }
    for (int i = 0; i < p->n_pages; i++) p->free_list[i] = p->n_pages - 1 - i;
    p->n_free = p->n_pages;
    *out = p;
    return KILN_OK;
}

void kiln_kv_pool_free(kiln_kv_pool *p) {
    if (!p) return;
    for (int l = 0; p->k && p->v && l < p->cfg.n_layers; l++) { free(p->k[l]); free(p->v[l]); }
    free(p->k); free(p->v); free(p->refcount); free(p->free_list);
    free(p);
}

int64_t kiln_kv_capacity_tokens(const kiln_kv_pool *p) { return (int64_t)p->n_pages * p->cfg.page_tokens; }

kiln_status kiln_kv_seq_reserve(kiln_kv_pool *p, kiln_kv_seq *s, int new_len) {
    int need = (new_len + p->cfg.page_tokens - 1) / p->cfg.page_tokens;
    if (need > s->cap) {
        int cap = s->cap ? s->cap : 16;
        while (cap < need) cap *= 2;
        int32_t *v = realloc(s->pages, (size_t)cap * sizeof *v);
        if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        s->pages = v;
        s->cap = cap;
    }
    if (need - s->n_pages > p->n_free)
        return kiln_fail(KILN_ERR_KV_EXHAUSTED,
                         "KV budget exhausted: %d tokens need %d pages of %d tokens but only %d of %d pages are free (capacity %lld tokens)",
                         new_len, need, p->cfg.page_tokens, p->n_free + s->n_pages, p->n_pages, (long long)kiln_kv_capacity_tokens(p));
    while (s->n_pages < need) {
        int32_t pg = p->free_list[--p->n_free];
        p->refcount[pg] = 1;
        s->pages[s->n_pages++] = pg;
    }
    return KILN_OK;
}

void kiln_kv_seq_release(kiln_kv_pool *p, kiln_kv_seq *s) {
    for (int i = 0; i < s->n_pages; i++) {
        int32_t pg = s->pages[i];
        if (--p->refcount[pg] == 0) p->free_list[p->n_free++] = pg;
    }
    s->n_pages = 0;
    s->len = 0;
}

static inline uint8_t *slot(const kiln_kv_pool *p, uint8_t *base, const kiln_kv_seq *s, int pos, int head) {
    int32_t pg = s->pages[pos / p->cfg.page_tokens];
    return base + (size_t)pg * p->page_layer_bytes + (size_t)head * p->head_stride +
           (size_t)(pos % p->cfg.page_tokens) * (size_t)p->cfg.head_dim * p->elem_bytes;
}

void kiln_kv_store(kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, const float *k, const float *v) {
    int hd = p->cfg.head_dim;
    for (int h = 0; h < p->cfg.n_kv_heads; h++) {
        uint8_t *dk = slot(p, p->k[layer], s, pos, h), *dv = slot(p, p->v[layer], s, pos, h);
        const float *sk = k + (size_t)h * hd, *sv = v + (size_t)h * hd;
        if (p->cfg.dtype == KILN_KV_F32) {
            memcpy(dk, sk, (size_t)hd * 4);
            memcpy(dv, sv, (size_t)hd * 4);
        } else {
            uint16_t *bk = (uint16_t *)dk, *bv = (uint16_t *)dv;
            for (int i = 0; i < hd; i++) { bk[i] = kiln_f32_to_bf16(sk[i]); bv[i] = kiln_f32_to_bf16(sv[i]); }
        }
    }
}

/* Dot product of a query with a stored key row of head_dim values. */
static inline float dot_kv(const kiln_kv_pool *p, const float *q, const uint8_t *k, int hd) {
    if (p->cfg.dtype == KILN_KV_F32) return kiln_dot_f32(q, (const float *)k, hd);
    const uint16_t *b = (const uint16_t *)k;
    float acc = 0;
    for (int i = 0; i < hd; i++) acc += q[i] * kiln_bf16_to_f32(b[i]);
    return acc;
}
static inline void axpy_kv(const kiln_kv_pool *p, float a, const uint8_t *v, float *out, int hd) {
    if (p->cfg.dtype == KILN_KV_F32) { kiln_axpy_f32(a, (const float *)v, out, hd); return; }
    const uint16_t *b = (const uint16_t *)v;
    for (int i = 0; i < hd; i++) out[i] += a * kiln_bf16_to_f32(b[i]);
}

void kiln_kv_attend(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, const float *q, int n_heads,
                    int n_ctx, float scale, float *att, float *out) {
    int hd = p->cfg.head_dim, group = n_heads / p->cfg.n_kv_heads;
    #pragma omp parallel for schedule(static) if (n_heads > 1 && n_ctx > 64)
    for (int h = 0; h < n_heads; h++) {
        int kvh = h / group;
        const float *qh = q + (size_t)h * hd;
        float *a = att + (size_t)h * n_ctx, *o = out + (size_t)h * hd;
        float mx = -INFINITY;
        for (int t = 0; t < n_ctx; t++) {
            a[t] = dot_kv(p, qh, slot(p, p->k[layer], s, t, kvh), hd) * scale;
            if (a[t] > mx) mx = a[t];
        }
        float sum = 0;
        for (int t = 0; t < n_ctx; t++) { a[t] = expf(a[t] - mx); sum += a[t]; }
        float inv = 1.0f / sum;
        memset(o, 0, (size_t)hd * 4);
        for (int t = 0; t < n_ctx; t++) axpy_kv(p, a[t] * inv, slot(p, p->v[layer], s, t, kvh), o, hd);
    }
}
