/* kv.c — the paged KV pool: sizes, block tables, stores (BF16 / FP8 static / FP8 dynamic), the
 * scalar attention kernel, and the attention driver that splits work over threads and merges
 * context splits (see kv.h for the layout and the scale rules, kv_isa.h for the kernel contract). */
#include "kv/kv.h"
#include "kv/kv_isa.h"
#include "kv/integrity.h"
#include "base/fp.h"
#include "base/pool.h"
#include "base/status.h"
#include "kernels/gemv.h"
#include <float.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>

#define KV_PREFAULT_BYTES ((size_t)256 << 20) /* see kiln_kv_pool_create */
#include <stdlib.h>
#include <string.h>

/* ---- sizes ------------------------------------------------------------------------------------- */
size_t kiln_kv_elem_bytes(kiln_kv_dtype dt) {
    return dt == KILN_KV_F32 ? 4 : dt == KILN_KV_BF16 ? 2 : dt == KILN_KV_FP8 ? 1 : 0;
}
static int kdim(const kiln_kv_config *c) { return c->k_dim > 0 ? c->k_dim : c->head_dim; }
static int vdim(const kiln_kv_config *c) { return c->v_dim > 0 ? c->v_dim : c->head_dim; }
static int is_dynamic(const kiln_kv_config *c) { return c->dtype == KILN_KV_FP8 && c->scale_mode == KILN_KV_SCALE_DYNAMIC; }
static int is_static_fp8(const kiln_kv_config *c) { return c->dtype == KILN_KV_FP8 && c->scale_mode != KILN_KV_SCALE_DYNAMIC; }
static int n_kinds(const kiln_kv_config *c) { return c->v_shares_k ? 1 : 2; } /* scale sets: K (and V) */

/* DSA compact row (kv.h): E4M3 codes + one f32 scale per 128 for the latent and the indexer key,
 * the rope part in the pool's dtype. */
static size_t dsa_row_bytes(const kiln_kv_config *c, int with_key) {
    return (size_t)c->dsa_latent + (size_t)c->dsa_latent / 32 + (size_t)c->dsa_rope * kiln_kv_elem_bytes(c->dtype) +
           (with_key ? (size_t)c->dsa_key + (size_t)c->dsa_key / 32 : 0);
}
size_t kiln_kv_row_bytes(const kiln_kv_config *c, int l) {
    return c->dsa_latent > 0 ? dsa_row_bytes(c, kiln_kv_dsa_has_key(c, l)) : (size_t)kdim(c) * kiln_kv_elem_bytes(c->dtype);
}
uint64_t kiln_kv_token_bytes(const kiln_kv_config *c) {
    if (c->dsa_latent > 0) { /* one head, V = a view of the row */
        uint64_t b = 0;
        for (int l = 0; l < c->n_layers; l++) b += kiln_kv_row_bytes(c, l);
        return b;
    }
    uint64_t vals = (uint64_t)kdim(c) + (c->v_shares_k ? 0 : (uint64_t)vdim(c));
    return (uint64_t)c->n_layers * (uint64_t)c->n_kv_heads * vals * kiln_kv_elem_bytes(c->dtype);
}
uint64_t kiln_kv_page_data_bytes(const kiln_kv_config *c) { return (uint64_t)c->page_tokens * kiln_kv_token_bytes(c); }
uint64_t kiln_kv_page_meta_bytes(const kiln_kv_config *c) {
    uint64_t m = sizeof(kiln_kv_page) + 2 * sizeof(int32_t); /* header + refcount + free-list slot */
    if (is_dynamic(c)) m += (uint64_t)n_kinds(c) * (uint64_t)c->n_layers * (uint64_t)c->n_kv_heads * sizeof(float);
    return m;
}
size_t kiln_kv_page_cost(const kiln_kv_config *c) { return (size_t)(kiln_kv_page_data_bytes(c) + kiln_kv_page_meta_bytes(c)); }
static int has_kmean(const kiln_kv_config *c) { return c->dtype == KILN_KV_FP8 && c->k_mean && !c->v_shares_k; }
uint64_t kiln_kv_pool_fixed_bytes(const kiln_kv_config *c) {
    uint64_t lh = (uint64_t)c->n_layers * (uint64_t)c->n_kv_heads;
    uint64_t b = is_static_fp8(c) ? (uint64_t)n_kinds(c) * lh * sizeof(float) : 0;
    if (has_kmean(c)) b += lh * (uint64_t)kdim(c) * sizeof(float);
    if (has_kmean(c) && c->k_prerope) b += (uint64_t)c->rope_positions * (uint64_t)kdim(c) * sizeof(float); /* cos/sin table */
    return b;
}
int64_t kiln_kv_plan_pages(const kiln_kv_config *c) {
    uint64_t cost = kiln_kv_page_cost(c), fixed = kiln_kv_pool_fixed_bytes(c);
    if (c->mem_bytes <= 0 || (uint64_t)c->mem_bytes <= fixed || cost == 0) return 0;
    uint64_t n = ((uint64_t)c->mem_bytes - fixed) / cost;
    return n > (1u << 30) ? (1 << 30) : (int64_t)n;
}

kiln_status kiln_kv_config_check(const kiln_kv_config *c) {
    if (c->n_layers < 1 || c->n_layers > 65536) return kiln_fail(KILN_ERR_INVALID_ARG, "kv config: n_layers = %d is out of range [1, 65536]", c->n_layers);
    if (c->n_kv_heads < 1 || c->n_kv_heads > 65536) return kiln_fail(KILN_ERR_INVALID_ARG, "kv config: n_kv_heads = %d is out of range [1, 65536]", c->n_kv_heads);
    if (kdim(c) < 1 || kdim(c) > 65536) return kiln_fail(KILN_ERR_INVALID_ARG, "kv config: k_dim = %d is out of range [1, 65536]", kdim(c));
    if (vdim(c) < 1 || vdim(c) > 65536) return kiln_fail(KILN_ERR_INVALID_ARG, "kv config: v_dim = %d is out of range [1, 65536]", vdim(c));
    if (c->v_shares_k && vdim(c) > kdim(c))
        return kiln_fail(KILN_ERR_INVALID_ARG, "kv config: v_shares_k with v_dim = %d > k_dim = %d", vdim(c), kdim(c));
    if (c->page_tokens < 1 || c->page_tokens > 4096)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kv page size (--kv-page) = %d tokens is out of range [1, 4096]", c->page_tokens);
    if (!kiln_kv_elem_bytes(c->dtype))
        return kiln_fail(KILN_ERR_INVALID_ARG, "kv-dtype: %d is not f32, bf16 or fp8 (auto must be resolved first)", (int)c->dtype);
    if (c->dsa_latent || c->dsa_rope || c->dsa_key) {
        if (c->dsa_latent < 128 || c->dsa_latent % 128 || c->dsa_key < 128 || c->dsa_key % 128 || c->dsa_rope < 0 || c->dsa_rope % 2)
            return kiln_fail(KILN_ERR_INVALID_ARG, "kv config: DSA rows need a latent and an indexer key of multiples of 128 values and an even "
                             "rope part (latent %d, rope %d, key %d)", c->dsa_latent, c->dsa_rope, c->dsa_key);
        if (c->dsa_latent + c->dsa_rope + c->dsa_key != kdim(c) || c->n_kv_heads != 1 || !c->v_shares_k || vdim(c) > c->dsa_latent)
            return kiln_fail(KILN_ERR_INVALID_ARG, "kv config: DSA rows (latent %d + rope %d + key %d) need one KV head, V sharing the K row "
                             "with v_dim <= the latent and k_dim = their sum (k_dim %d, v_dim %d, %d KV heads)", c->dsa_latent, c->dsa_rope,
                             c->dsa_key, kdim(c), vdim(c), c->n_kv_heads);
        if (c->dtype != KILN_KV_F32 && c->dtype != KILN_KV_BF16)
            return kiln_fail(KILN_ERR_INVALID_ARG, "kv config: DSA rows keep their rope part in f32 or bf16, not dtype %d", (int)c->dtype);
    }
    if (c->scale_mode != KILN_KV_SCALE_STATIC && c->scale_mode != KILN_KV_SCALE_DYNAMIC)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kv-scale: mode %d is not static or dynamic", (int)c->scale_mode);
    if (c->k_prerope) {
        if (!is_static_fp8(c))
            return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth prerope (kv_smooth): needs FP8 KV with static scales (--kv-dtype fp8 --kv-scale static)");
        if (c->v_shares_k)
            return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth prerope (kv_smooth): not for caches whose V shares the K row (MLA latent rows)");
        if (kdim(c) % 2 || kdim(c) > 256)
            return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth prerope (kv_smooth): k_dim = %d must be even and at most 256", kdim(c));
        if (c->rope_positions < 1 || c->rope_positions > (1 << 24) || !(c->rope_theta > 0.0f) || !isfinite(c->rope_theta))
            return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth prerope (kv_smooth): rope_positions = %d / rope_theta = %g are not valid",
                             c->rope_positions, (double)c->rope_theta);
    }
    return KILN_OK;
}

/* ---- pool -------------------------------------------------------------------------------------- */
kiln_status kiln_kv_pool_create(const kiln_kv_config *cfg, kiln_kv_pool **out) {
    *out = NULL;
    KILN_TRY(kiln_kv_config_check(cfg));
    const int L = cfg->n_layers, H = cfg->n_kv_heads;
    if (is_static_fp8(cfg)) {
        if (!cfg->k_scale || (!cfg->v_shares_k && !cfg->v_scale))
            return kiln_fail(KILN_ERR_INVALID_ARG, "kv: FP8 KV with static scales needs K and V scales per layer and head (never a silent 1.0)");
        for (int i = 0; i < L * H; i++)
            for (int kind = 0; kind < n_kinds(cfg); kind++) {
                float s = (kind ? cfg->v_scale : cfg->k_scale)[i];
                if (!(s > 0.0f) || !isfinite(s))
                    return kiln_fail(KILN_ERR_INVALID_ARG, "kv: %s scale of layer %d, KV head %d is %g; it must be a positive finite number",
                                     kind ? "V" : "K", i / H, i % H, (double)s);
            }
    }
    int64_t n_pages = kiln_kv_plan_pages(cfg);
    if (n_pages < 1)
        return kiln_fail(KILN_ERR_KV_EXHAUSTED,
                         "--kv-mem (kv_mem_bytes) = %lld bytes is smaller than one KV page of %d tokens "
                         "(%llu bytes: %llu data + %llu metadata, plus %llu bytes of pool scales)",
                         (long long)cfg->mem_bytes, cfg->page_tokens, (unsigned long long)kiln_kv_page_cost(cfg),
                         (unsigned long long)kiln_kv_page_data_bytes(cfg), (unsigned long long)kiln_kv_page_meta_bytes(cfg),
                         (unsigned long long)kiln_kv_pool_fixed_bytes(cfg));
    kiln_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    p->cfg = *cfg;
    p->cfg.k_dim = kdim(cfg);
    p->cfg.v_dim = vdim(cfg);
    p->cfg.k_scale = p->cfg.v_scale = NULL;
    p->n_pages = (int)n_pages;
    p->elem_bytes = kiln_kv_elem_bytes(cfg->dtype);
    p->row_kl = malloc((size_t)L * sizeof *p->row_kl);
    if (cfg->dsa_key_layers && (p->dsa_keyl = malloc((size_t)L)) != NULL) memcpy(p->dsa_keyl, cfg->dsa_key_layers, (size_t)L);
    p->cfg.dsa_key_layers = p->dsa_keyl;
    if (!p->row_kl || (cfg->dsa_key_layers && !p->dsa_keyl)) {
        free(p->row_kl);
        free(p->dsa_keyl);
        free(p);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    p->row_k = 0;
    for (int l = 0; l < L; l++) {
        p->row_kl[l] = kiln_kv_row_bytes(&p->cfg, l);
        if (p->row_kl[l] > p->row_k) p->row_k = p->row_kl[l];
    }
    if (cfg->dsa_latent > 0) {
        p->dsa_rope_at = (size_t)cfg->dsa_latent + (size_t)cfg->dsa_latent / 32;
        p->dsa_key_at = p->dsa_rope_at + (size_t)cfg->dsa_rope * p->elem_bytes;
    }
    p->row_v = cfg->v_shares_k ? p->row_k : (size_t)p->cfg.v_dim * p->elem_bytes;
    p->head_k = p->row_k * (size_t)cfg->page_tokens;
    p->head_v = p->row_v * (size_t)cfg->page_tokens;
    p->page_k = p->head_k * (size_t)H;
    p->page_v = p->head_v * (size_t)H;
    p->k = calloc((size_t)L, sizeof *p->k);
    p->v = calloc((size_t)L, sizeof *p->v);
    p->pages = calloc((size_t)n_pages, sizeof *p->pages);
    p->refcount = calloc((size_t)n_pages, sizeof *p->refcount);
    p->free_list = malloc((size_t)n_pages * sizeof *p->free_list);
    p->from_arrays_alloc = calloc(2 * (size_t)L, 1);
    int ok = p->k && p->v && p->pages && p->refcount && p->free_list && p->from_arrays_alloc;
    /* The first pages handed out (the free list gives page 0 first and takes released pages back
     * first) are mapped at creation, up to KV_PREFAULT_BYTES over all layer arrays: a decode step
     * that first writes a fresh OS page pays a page fault inside the step (20–50 µs apiece on the
     * dev VM, ~2 per bench-500m token). The cap keeps a pool sized for a long context (tens of GiB
     * for 128K tokens) from being committed, and its creation fast; beyond it pages map on use. */
    size_t pool_bytes = 0;
    for (int l = 0; l < L; l++) pool_bytes += (kiln_kv_page_k_at(p, l) + (cfg->v_shares_k ? 0 : p->page_v)) * (size_t)n_pages;
    const size_t pre_pages = pool_bytes <= KV_PREFAULT_BYTES ? (size_t)n_pages
                                                            : (size_t)((double)n_pages * ((double)KV_PREFAULT_BYTES / (double)pool_bytes));
    for (int l = 0; ok && l < L; l++) {
        /* kiln_alloc64: layer arrays from 2 MiB land on transparent huge pages like the weights (the
         * attention reads one page slice per block, scattered over the array: fewer TLB misses; the
         * KV write of a decode step touches one slice per layer). bench-500m at 4,096 tokens has 2 MiB
         * per layer array, which the earlier 4 MiB threshold left on 4 KiB pages: RoPE + KV write per
         * INT4 decode step 51 → 27 µs (median of 256 steps, instrumented build, two pairs). */
        const size_t kb = kiln_kv_page_k_at(p, l) * (size_t)n_pages, vb = p->page_v * (size_t)n_pages;
        if (cfg->arrays_alloc && (p->k[l] = cfg->arrays_alloc(cfg->arrays_ctx, kb)) != NULL) p->from_arrays_alloc[2 * l] = 1;
        else if ((p->k[l] = kiln_alloc64(kb)) != NULL && pre_pages) kiln_prefault(p->k[l], kiln_kv_page_k_at(p, l) * pre_pages);
        if (cfg->v_shares_k) p->v[l] = p->k[l];
        else if (cfg->arrays_alloc && (p->v[l] = cfg->arrays_alloc(cfg->arrays_ctx, vb)) != NULL) p->from_arrays_alloc[2 * l + 1] = 1;
        else if ((p->v[l] = kiln_alloc64(vb)) != NULL && pre_pages) kiln_prefault(p->v[l], p->page_v * pre_pages);
        ok = p->k[l] && p->v[l];
    }
    size_t nsc = (size_t)n_kinds(cfg) * (size_t)L * (size_t)H;
    if (ok && is_static_fp8(cfg)) {
        p->k_scale = malloc(nsc * sizeof(float));
        ok = p->k_scale != NULL;
        if (ok) {
            memcpy(p->k_scale, cfg->k_scale, (size_t)L * H * sizeof(float));
            p->v_scale = cfg->v_shares_k ? p->k_scale : p->k_scale + (size_t)L * H;
            if (!cfg->v_shares_k) memcpy(p->v_scale, cfg->v_scale, (size_t)L * H * sizeof(float));
        }
    }
    if (ok && has_kmean(cfg)) {
        size_t nm = (size_t)L * (size_t)H * (size_t)p->cfg.k_dim;
        p->k_mean = malloc(nm * sizeof(float));
        ok = p->k_mean != NULL;
        if (ok) memcpy(p->k_mean, cfg->k_mean, nm * sizeof(float));
        for (size_t i = 0; ok && i < nm; i++)
            if (!isfinite(p->k_mean[i])) {
                size_t kd = (size_t)p->cfg.k_dim; /* read before the pool is freed */
                kiln_kv_pool_free(p);
                return kiln_fail(KILN_ERR_INVALID_ARG, "kv: K mean of layer %d, KV head %d, channel %d is not finite",
                                 (int)(i / ((size_t)H * kd)), (int)(i / kd % H), (int)(i % kd));
            }
    }
    p->cfg.k_mean = NULL;
    if (ok && cfg->k_prerope) {
        if (!p->k_mean) { kiln_kv_pool_free(p); return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-smooth prerope (kv_smooth): the pool has no pre-RoPE K means"); }
        /* cos/sin per position with model/forward.c's float formula: the store subtracts and the
         * attention adds back exactly the rotation the model applied. */
        const int kd = p->cfg.k_dim, half = kd / 2;
        p->rope_cs = malloc((size_t)cfg->rope_positions * (size_t)kd * sizeof(float));
        ok = p->rope_cs != NULL;
        for (int t = 0; ok && t < cfg->rope_positions; t++)
            for (int i = 0; i < half; i++) {
                float freq = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)kd);
                float val = (float)t * freq;
                p->rope_cs[(size_t)t * kd + i] = cosf(val);
                p->rope_cs[(size_t)t * kd + half + i] = sinf(val);
            }
    }
    if (ok && is_dynamic(cfg)) {
        p->dscale = calloc(nsc * (size_t)n_pages, sizeof(float));
        ok = p->dscale != NULL;
    }
    if (!ok) {
        kiln_kv_pool_free(p);
        return kiln_fail(KILN_ERR_NOMEM, "cannot allocate a KV pool of %lld bytes (%lld pages)", (long long)cfg->mem_bytes, (long long)n_pages);
    }
    for (int i = 0; i < p->n_pages; i++) p->free_list[i] = p->n_pages - 1 - i;
    p->n_free = p->n_pages;
    *out = p;
    return KILN_OK;
}

void kiln_kv_pool_free(kiln_kv_pool *p) {
    if (!p) return;
    kiln_kv_integ_free(p);
    for (int l = 0; p->k && p->v && p->from_arrays_alloc && l < p->cfg.n_layers; l++) {
        if (p->v[l] != p->k[l]) {
            if (p->from_arrays_alloc[2 * l + 1]) p->cfg.arrays_free(p->cfg.arrays_ctx, p->v[l]);
            else free(p->v[l]);
        }
        if (p->from_arrays_alloc[2 * l]) p->cfg.arrays_free(p->cfg.arrays_ctx, p->k[l]);
        else free(p->k[l]);
    }
    free(p->k); free(p->v); free(p->from_arrays_alloc); free(p->pages); free(p->refcount); free(p->free_list); free(p->k_scale); free(p->k_mean); free(p->rope_cs); free(p->dscale);
    free(p->row_kl); free(p->dsa_keyl);
    free(p);
}

int64_t kiln_kv_capacity_tokens(const kiln_kv_pool *p) { return (int64_t)p->n_pages * p->cfg.page_tokens; }

/* Dynamic scale slot of (layer, page, kind 0 = K / 1 = V, head). */
static inline float *dslot(const kiln_kv_pool *p, int l, int32_t pg, int kind, int h) {
    const int H = p->cfg.n_kv_heads, nk = n_kinds(&p->cfg);
    if (kind >= nk) kind = 0; /* V shares K */
    return p->dscale + (((size_t)l * (size_t)p->n_pages + (size_t)pg) * (size_t)nk + (size_t)kind) * (size_t)H + (size_t)h;
}

static int32_t take_page(kiln_kv_pool *p) {
    int32_t pg = p->free_list[--p->n_free];
    kiln_kv_page *hd = &p->pages[pg];
    p->refcount[pg] = 1;
    hd->epoch = ++p->epoch;
    hd->flags = 0;
    hd->seal = 0;
    if (p->dscale)
        for (int l = 0; l < p->cfg.n_layers; l++)
            memset(dslot(p, l, pg, 0, 0), 0, (size_t)n_kinds(&p->cfg) * (size_t)p->cfg.n_kv_heads * sizeof(float));
    return pg;
}

static kiln_status grow_table(kiln_kv_seq *s, int need) {
    if (need <= s->cap) return KILN_OK;
    int cap = s->cap ? s->cap : 16;
    while (cap < need) cap *= 2;
    int32_t *v = realloc(s->pages, (size_t)cap * sizeof *v);
    if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->pages = v;
    s->cap = cap;
    return KILN_OK;
}

kiln_status kiln_kv_seq_reserve(kiln_kv_pool *p, kiln_kv_seq *s, int new_len) {
    if (new_len < 0) return kiln_fail(KILN_ERR_INVALID_ARG, "kv: reserve of %d tokens", new_len);
    int need = (int)(((int64_t)new_len + p->cfg.page_tokens - 1) / p->cfg.page_tokens);
    if (need - s->n_pages > p->n_free)
        return kiln_fail(KILN_ERR_KV_EXHAUSTED,
                         "%d tokens need %d pages of %d tokens but only %d of %d pages are free "
                         "(capacity %lld tokens; raise --kv-mem or use --kv-dtype fp8)",
                         new_len, need, p->cfg.page_tokens, p->n_free + s->n_pages, p->n_pages, (long long)kiln_kv_capacity_tokens(p));
    KILN_TRY(grow_table(s, need));
    while (s->n_pages < need) s->pages[s->n_pages++] = take_page(p);
    if (p->integ) kiln_kv_integ_bind(p, s); /* integrity: record each new slot's page and epoch */
    return KILN_OK;
}

void kiln_kv_seq_release(kiln_kv_pool *p, kiln_kv_seq *s) {
    if (p->integ) kiln_kv_integ_release(p, s); /* integrity: entries checked against their binding records */
    for (int i = 0; i < s->n_pages; i++) {
        int32_t pg = s->pages[i];
        if (--p->refcount[pg] == 0) p->free_list[p->n_free++] = pg;
    }
    s->n_pages = 0;
    s->len = 0;
}

kiln_status kiln_kv_seq_share_prefix(kiln_kv_pool *p, kiln_kv_seq *dst, const kiln_kv_seq *src, int n) {
    const int pt = p->cfg.page_tokens;
    if (dst->n_pages != 0) return kiln_fail(KILN_ERR_INVALID_ARG, "kv: share_prefix into a sequence that holds %d pages", dst->n_pages);
    if (n < 0 || n > src->len) return kiln_fail(KILN_ERR_INVALID_ARG, "kv: share_prefix of %d tokens from a sequence of %d", n, src->len);
    int full = n / pt, part = n % pt ? 1 : 0;
    if (part && p->n_free < 1)
        return kiln_fail(KILN_ERR_KV_EXHAUSTED, "no free page to copy the partial page of a shared prefix (capacity %lld tokens)",
                         (long long)kiln_kv_capacity_tokens(p));
    KILN_TRY(grow_table(dst, full + part));
    for (int i = 0; i < full; i++) {
        dst->pages[i] = src->pages[i];
        p->refcount[src->pages[i]]++;
    }
    if (part) {
        int32_t from = src->pages[full], to = take_page(p);
        for (int l = 0; l < p->cfg.n_layers; l++) {
            memcpy(p->k[l] + (size_t)to * kiln_kv_page_k_at(p, l), p->k[l] + (size_t)from * kiln_kv_page_k_at(p, l), kiln_kv_page_k_at(p, l));
            if (!p->cfg.v_shares_k) memcpy(p->v[l] + (size_t)to * p->page_v, p->v[l] + (size_t)from * p->page_v, p->page_v);
            if (p->dscale)
                memcpy(dslot(p, l, to, 0, 0), dslot(p, l, from, 0, 0), (size_t)n_kinds(&p->cfg) * (size_t)p->cfg.n_kv_heads * sizeof(float));
        }
        dst->pages[full] = to;
    }
    dst->n_pages = full + part;
    dst->len = n;
    if (p->integ) kiln_kv_integ_copied(p, src, dst, n); /* integrity: the copy is sealed from the source */
    return KILN_OK;
}

/* ---- conversions ------------------------------------------------------------------------------- */
const kiln_kv_ktable *kiln_kv_table_for(kiln_isa isa) {
    switch (isa) {
    case KILN_ISA_AVX512: return &kiln_kv_ktable_avx512;
    case KILN_ISA_AVX2: return &kiln_kv_ktable_avx2;
    default: return NULL;
    }
}
static const kiln_kv_ktable *kv_table_for(kiln_isa isa) { return kiln_kv_table_for(isa); }
/* The process default ISA's table (kiln_kv_quant_fp8 / _bf16, kiln_kv_store): every ISA's
 * conversion is bit-exact RNE (tests/unit/test_kv.c), so the stored bytes do not depend on it. */
static const kiln_kv_ktable *kv_table(void) { return kv_table_for(kiln_kernels_current()); }

/* Bit-exact RNE f32 → E4M3 (see kv.h). Normal range (|x| ≥ 2^-6): rebias the exponent and round the
 * 20 dropped mantissa bits to nearest even with integer adds; subnormal range: adding 2^14 makes the
 * FPU round |x| to a multiple of 2^-9 (the E4M3 subnormal step), whose low bits are the code. */
uint8_t kiln_kv_f32_to_fp8(float x) {
    uint32_t u = kiln_f32_to_bits(x), a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
    if (a > 0x7f800000u) return 0; /* NaN → 0 */
    uint32_t code;
    if (a < 0x3c800000u) { /* < 2^-6 */
        code = kiln_f32_to_bits(kiln_bits_to_f32(a) + 16384.0f) - 0x46800000u;
    } else {
        code = (a - 0x3c000000u + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
        if (code > 0x7eu) code = 0x7eu;
    }
    return (uint8_t)(sign | code);
}

static void quant_fp8_scalar(const float *x, int n, float inv, uint8_t *out) {
    for (int i = 0; i < n; i++) out[i] = kiln_kv_f32_to_fp8(x[i] * inv);
}
static void quant_bf16_scalar(const float *x, int n, uint16_t *out) {
    for (int i = 0; i < n; i++) out[i] = kiln_f32_to_bf16(x[i]);
}
void kiln_kv_quant_fp8(const float *x, int n, float inv, uint8_t *out) {
    const kiln_kv_ktable *t = kv_table();
    (t ? t->quant_fp8 : quant_fp8_scalar)(x, n, inv, out);
}
void kiln_kv_quant_bf16(const float *x, int n, uint16_t *out) {
    const kiln_kv_ktable *t = kv_table();
    (t ? t->quant_bf16 : quant_bf16_scalar)(x, n, out);
}

static inline float decode1(kiln_kv_dtype dt, const uint8_t *row, int i) {
    if (dt == KILN_KV_F32) { float f; memcpy(&f, row + 4 * (size_t)i, 4); return f; }
    if (dt == KILN_KV_BF16) { uint16_t h; memcpy(&h, row + 2 * (size_t)i, 2); return kiln_bf16_to_f32(h); }
    return kiln_fp8_e4m3_to_f32(row[i]);
}

/* ---- stores ------------------------------------------------------------------------------------ */
static inline uint8_t *row_ptr(const kiln_kv_pool *p, int is_v, int l, int32_t pg, int h, int off) {
    if (is_v && !p->cfg.v_shares_k)
        return p->v[l] + (size_t)pg * p->page_v + (size_t)h * p->head_v + (size_t)off * p->row_v;
    return p->k[l] + (size_t)pg * kiln_kv_page_k_at(p, l) + (size_t)h * kiln_kv_head_k_at(p, l) + (size_t)off * kiln_kv_row_k_at(p, l);
}

static float amax_of(const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i])); /* fmaxf ignores NaN */
    return m;
}

/* Pair (a, b) of RoPE pair i over a head of kd values (model.h: NORM (2i, 2i+1), NEOX (i, i + kd/2)). */
static inline void rope_pair(int norm, int kd, int i, int *a, int *b) {
    *a = norm ? 2 * i : i;
    *b = norm ? 2 * i + 1 : i + kd / 2;
}
/* out = R(pos)·mu (the forward's rope_apply on one head). */
static void rope_rotate(const kiln_kv_pool *p, int pos, const float *mu, float *out) {
    const int kd = p->cfg.k_dim, half = kd / 2;
    const float *cs = p->rope_cs + (size_t)pos * kd;
    for (int i = 0; i < half; i++) {
        int a, b;
        rope_pair(p->cfg.rope_norm, kd, i, &a, &b);
        float c = cs[i], s = cs[half + i];
        out[a] = mu[a] * c - mu[b] * s;
        out[b] = mu[a] * s + mu[b] * c;
    }
}

/* One row of `dim` values into slot (l, pg, kind, h, off). K rows of a pool with K smoothing store
 * x − mu (mu: k_mean, or R(pos)·k_mean with pre-RoPE smoothing; NULL = none) in chunks through a
 * stack buffer: no allocation. */
/* The row conversions through the kernel table t (NULL: scalar); every ISA's are bit-exact RNE. */
static void quant_fp8_t(const kiln_kv_ktable *t, const float *x, int n, float inv, uint8_t *out) {
    (t ? t->quant_fp8 : quant_fp8_scalar)(x, n, inv, out);
}
static void quant_bf16_t(const kiln_kv_ktable *t, const float *x, int n, uint16_t *out) { (t ? t->quant_bf16 : quant_bf16_scalar)(x, n, out); }

/* Row `off` of unit (kind, h) of page pg, layer l, from x; written at dst (the row in the pool, or a
 * copy the caller moves there). */
static void store_row(const kiln_kv_ktable *t, kiln_kv_pool *p, int kind, int l, int32_t pg, int h, int off, const float *x, int dim,
                      const float *mu, uint8_t *dst) {
    switch (p->cfg.dtype) {
    case KILN_KV_F32: memcpy(dst, x, (size_t)dim * 4); return;
    case KILN_KV_BF16: quant_bf16_t(t, x, dim, (uint16_t *)dst); return;
    default: break;
    }
    const int H = p->cfg.n_kv_heads;
    float inv;
    if (!p->dscale) {
        inv = 1.0f / (kind ? p->v_scale : p->k_scale)[(size_t)l * H + h];
    } else {
        /* Dynamic: grow-only page scale; re-quantize the rows already in the page when it grows. */
        float amax = 0.0f;
        if (mu) for (int i = 0; i < dim; i++) amax = fmaxf(amax, fabsf(x[i] - mu[i]));
        else amax = amax_of(x, dim);
        float *slot = dslot(p, l, pg, kind, h), old = *slot, need = amax / 448.0f;
        if (need > old) {
            if (old > 0.0f) {
                float ni = 1.0f / need;
                for (int o = 0; o < off; o++) {
                    uint8_t *r = row_ptr(p, kind, l, pg, h, o);
                    for (int i = 0; i < dim; i++) r[i] = kiln_kv_f32_to_fp8(kiln_fp8_e4m3_to_f32(r[i]) * old * ni);
                }
            }
            *slot = old = need;
        }
        inv = old > 0.0f ? 1.0f / old : 0.0f;
    }
    if (!mu) { quant_fp8_t(t, x, dim, inv, dst); return; }
    float buf[256];
    for (int i0 = 0; i0 < dim; i0 += 256) {
        int c = dim - i0 < 256 ? dim - i0 : 256;
        for (int j = 0; j < c; j++) buf[j] = x[i0 + j] - mu[i0 + j];
        quant_fp8_t(t, buf, c, inv, dst + i0);
    }
}

/* FP8 blocks of a DSA compact row: n (a multiple of 128) values as act_quant stores them, codes at
 * dst, one f32 scale per 128 at dst + n (kv.h). */
static void store_fp8_blocks(const kiln_kv_ktable *t, uint8_t *dst, const float *x, int n) {
    for (int b0 = 0; b0 < n; b0 += 128) {
        const float s = kiln_fp8_block_scale(amax_of(x + b0, 128));
        quant_fp8_t(t, x + b0, 128, 1.0f / s, dst + b0); /* 1/s exact: s is a power of two */
        memcpy(dst + n + (size_t)b0 / 32, &s, sizeof s);
    }
}
/* Layer l's row: the key values of x are dropped where the layer stores no key (they are zeros:
 * model/mla.c). */
static void store_dsa_row(const kiln_kv_ktable *t, const kiln_kv_pool *p, int l, uint8_t *dst, const float *x) {
    const kiln_kv_config *c = &p->cfg;
    store_fp8_blocks(t, dst, x, c->dsa_latent);
    if (c->dtype == KILN_KV_F32) memcpy(dst + p->dsa_rope_at, x + c->dsa_latent, (size_t)c->dsa_rope * sizeof(float));
    else quant_bf16_t(t, x + c->dsa_latent, c->dsa_rope, (uint16_t *)(dst + p->dsa_rope_at)); /* 2-byte aligned: the latent's bytes are a multiple of 4 */
    if (kiln_kv_dsa_has_key(c, l)) store_fp8_blocks(t, dst + p->dsa_key_at, x + c->dsa_latent + c->dsa_rope, c->dsa_key);
}

void kiln_kv_store(kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, const float *k, const float *v) {
    kiln_kctx cx;
    kiln_kctx_default(&cx);
    kiln_kv_store_cx(&cx, p, s, layer, pos, k, v);
}

void kiln_kv_store_cx(const kiln_kctx *cx, kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, const float *k, const float *v) {
    const kiln_kv_ktable *t = kv_table_for(cx->isa);
    const int pt = p->cfg.page_tokens, kd = p->cfg.k_dim, vd = p->cfg.v_dim;
    int32_t pg = s->pages[pos / pt];
    int off = pos % pt;
    if (p->integ) { /* integrity: verify the rows already in the slice, then re-seal it with the new row */
        kiln_kv_integ_before_store(p, s, layer, pos);
        pg = s->pages[pos / pt];
    }
    float rot[256];
    /* integrity, an append: each row is converted into `copy`, hashed there and then copied into the
     * pool, so the seal never reads the pool (mapped VRAM on a discrete GPU: uncached for the CPU) */
    enum { COPY_BYTES = 8192, HASH_HEADS = 128 };
    _Alignas(64) uint8_t copy[COPY_BYTES];
    uint64_t row_hash[2 * HASH_HEADS];
    const int H = p->cfg.n_kv_heads;
    const int hashed = p->integ && !p->dsa_key_at && kiln_kv_integ_store_is_append(p) && H <= HASH_HEADS && p->row_k <= COPY_BYTES &&
                       p->row_v <= COPY_BYTES;
    if (p->dsa_key_at) { /* DSA compact rows: one head, V is a view of the row */
        store_dsa_row(t, p, layer, row_ptr(p, 0, layer, pg, 0, off), k);
    } else for (int h = 0; h < H; h++) {
        const float *mu = p->k_mean ? p->k_mean + ((size_t)layer * H + (size_t)h) * (size_t)kd : NULL;
        if (mu && p->rope_cs) { rope_rotate(p, pos, mu, rot); mu = rot; }
        for (int kind = 0; kind < (p->cfg.v_shares_k ? 1 : 2); kind++) {
            uint8_t *dst = row_ptr(p, kind, layer, pg, h, off);
            const float *x = kind ? v + (size_t)h * vd : k + (size_t)h * kd;
            store_row(t, p, kind, layer, pg, h, off, x, kind ? vd : kd, kind ? NULL : mu, hashed ? copy : dst);
            if (hashed) {
                const size_t row = kind ? p->row_v : p->row_k;
                memcpy(dst, copy, row);
                row_hash[kind * H + h] = kiln_kv_integ_row_hash(p, layer, kind, off, copy);
            }
        }
    }
    if (p->integ) {
        if (hashed) kiln_kv_integ_after_store_rows(p, s, layer, pos, row_hash);
        else kiln_kv_integ_after_store(p, s, layer, pos);
    }
    if (off == pt - 1 && layer == p->cfg.n_layers - 1) p->pages[pg].flags |= KILN_KV_PAGE_SEALED;
}

static float row_scale(const kiln_kv_pool *p, int is_v, int l, int32_t pg, int h) {
    if (p->cfg.dtype != KILN_KV_FP8) return 1.0f;
    if (p->dscale) return *dslot(p, l, pg, is_v, h);
    return (is_v ? p->v_scale : p->k_scale)[(size_t)l * p->cfg.n_kv_heads + h];
}

/* Values [off, off + n) of a DSA compact row r of layer l (kv.h), decoded: codes × their block's
 * scale (exact), the rope part from its dtype; the key of a layer that stores none reads as zeros. */
static void read_dsa_part(const kiln_kv_pool *p, int l, const uint8_t *r, int off, int n, float *out) {
    const kiln_kv_config *c = &p->cfg;
    const int lat = c->dsa_latent, rope_end = lat + c->dsa_rope, has_key = kiln_kv_dsa_has_key(c, l);
    for (int i = off; i < off + n; i++) {
        float v;
        if (i >= rope_end && !has_key) {
            v = 0.0f;
        } else if (i < lat || i >= rope_end) { /* an FP8 field: codes, then one scale per 128 after them */
            const uint8_t *f = i < lat ? r : r + p->dsa_key_at;
            const int j = i < lat ? i : i - rope_end, len = i < lat ? lat : c->dsa_key;
            float sc;
            memcpy(&sc, f + len + (size_t)(j / 128) * 4, 4);
            v = kiln_fp8_e4m3_to_f32(f[j]) * sc;
        } else {
            v = decode1(c->dtype, r + p->dsa_rope_at, i - lat);
        }
        out[i - off] = v;
    }
}

void kiln_kv_read_row(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, int h, int is_v, float *out) {
    const int pt = p->cfg.page_tokens, dim = is_v ? p->cfg.v_dim : p->cfg.k_dim;
    if (p->dsa_key_at) { kiln_kv_read_row_part(p, s, layer, pos, 0, 0, dim, out); return; }
    int32_t pg = s->pages[pos / pt];
    const uint8_t *r = row_ptr(p, is_v, layer, pg, h, pos % pt);
    float sc = row_scale(p, is_v, layer, pg, h);
    for (int i = 0; i < dim; i++) out[i] = decode1(p->cfg.dtype, r, i) * sc;
    if (!is_v && p->k_mean) {
        const float *mu = p->k_mean + ((size_t)layer * p->cfg.n_kv_heads + (size_t)h) * (size_t)dim;
        float rot[256];
        if (p->rope_cs) { rope_rotate(p, pos, mu, rot); mu = rot; }
        for (int i = 0; i < dim; i++) out[i] += mu[i];
    }
}

/* Positions [pos0, pos0 + count) of kiln_kv_read_row_part: out [count, n], a loop per storage dtype. */
static void read_rows_part(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos0, int count, int h, int off, int n, float *out) {
    const int pt = p->cfg.page_tokens;
    for (int t = pos0; t < pos0 + count; t++, out += n) {
        const int32_t pg = s->pages[t / pt];
        const uint8_t *r = row_ptr(p, 0, layer, pg, h, t % pt);
        if (p->dsa_key_at) { read_dsa_part(p, layer, r, off, n, out); continue; }
        const float sc = row_scale(p, 0, layer, pg, h);
        switch (p->cfg.dtype) {
        case KILN_KV_F32:
            memcpy(out, r + 4 * (size_t)off, (size_t)n * sizeof(float));
            break;
        case KILN_KV_BF16:
            for (int i = 0; i < n; i++) { /* bf16 → f32: the 16 bits on top */
                uint16_t b;
                memcpy(&b, r + 2 * ((size_t)off + (size_t)i), 2);
                const uint32_t u = (uint32_t)b << 16;
                memcpy(&out[i], &u, 4);
            }
            break;
        default:
            for (int i = 0; i < n; i++) out[i] = kiln_fp8_e4m3_to_f32(r[off + i]);
            break;
        }
        if (sc != 1.0f)
            for (int i = 0; i < n; i++) out[i] *= sc;
    }
}

void kiln_kv_read_row_part(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, int h, int off, int n, float *out) {
    read_rows_part(p, s, layer, pos, 1, h, off, n, out);
}

void kiln_kv_seq_kstats(const kiln_kv_pool *p, const kiln_kv_seq *s, int n, double *ksum, float *kmin, float *kmax) {
    const int H = p->cfg.n_kv_heads, kd = p->cfg.k_dim;
    float *buf = malloc((size_t)kd * sizeof *buf);
    if (!buf) return;
    for (int l = 0; l < p->cfg.n_layers; l++)
        for (int h = 0; h < H; h++) {
            size_t o = ((size_t)l * H + (size_t)h) * (size_t)kd;
            for (int t = 0; t < n; t++) {
                kiln_kv_read_row(p, s, l, t, h, 0, buf);
                for (int d = 0; d < kd; d++) {
                    ksum[o + d] += buf[d];
                    kmin[o + d] = fminf(kmin[o + d], buf[d]);
                    kmax[o + d] = fmaxf(kmax[o + d], buf[d]);
                }
            }
        }
    free(buf);
}

void kiln_kv_seq_amax(const kiln_kv_pool *p, const kiln_kv_seq *s, int n, float *kamax, float *vamax) {
    const int H = p->cfg.n_kv_heads, kd = p->cfg.k_dim, vd = p->cfg.v_dim;
    float *buf = malloc((size_t)(kd > vd ? kd : vd) * sizeof *buf);
    if (!buf) return;
    for (int l = 0; l < p->cfg.n_layers; l++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < n; t++) {
                kiln_kv_read_row(p, s, l, t, h, 0, buf);
                float *km = &kamax[(size_t)l * H + h];
                *km = fmaxf(*km, amax_of(buf, kd));
                if (vamax) {
                    kiln_kv_read_row(p, s, l, t, h, 1, buf);
                    float *vm = &vamax[(size_t)l * H + h];
                    *vm = fmaxf(*vm, amax_of(buf, vd));
                }
            }
    free(buf);
}

/* ---- content hash of the KV integrity seals (docs/INTEGRITY.md, "The content hash") ------------- */
uint64_t kiln_kv_mlh_scalar(const uint8_t *d, size_t n, const uint32_t *key) {
    uint64_t h = 0;
    size_t w = 0;
    for (; 4 * w + 4 <= n; w++) {
        uint32_t x;
        memcpy(&x, d + 4 * w, 4);
        h += (uint64_t)key[w] * x;
    }
    if (4 * w < n) { /* a last partial word, zero-padded */
        uint8_t b[4] = {0};
        memcpy(b, d + 4 * w, n - 4 * w);
        uint32_t x;
        memcpy(&x, b, 4);
        h += (uint64_t)key[w] * x;
    }
    return h;
}

uint64_t kiln_kv_mlh(const uint8_t *d, size_t n, const uint32_t *key) {
    const kiln_kv_ktable *t = kv_table();
    return t ? t->mlh(d, n, key) : kiln_kv_mlh_scalar(d, n, key);
}

/* ---- scalar attention kernel ------------------------------------------------------------------- */
void kiln_kv_attend_scalar(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1) {
    const int kd = sp->k_dim, vd = sp->v_dim, R = rw->R;
    const kiln_kv_dtype dt = sp->dtype;
    float s[KV_MAX_ROWS][16], corr[KV_MAX_ROWS];
    int lmax = 0;
    for (int r = 0; r < R; r++) lmax = rw->lim[r] > lmax ? rw->lim[r] : lmax;
    if (t1 > lmax) t1 = lmax;
    for (int b0 = t0; b0 < t1;) {
        const kiln_kv_block blk = kiln_kv_block_at(sp, b0, t1, 16, 1.0f);
        const int nb = blk.n;
        const uint8_t *kp = blk.k, *vp = blk.v;
        const float km = blk.km, vm = blk.vm;
        for (int j = 0; j < nb; j++)
            for (int r = 0; r < R; r++) {
                float acc = 0.0f;
                for (int d = 0; d < kd; d++) acc += rw->q[r][d] * decode1(dt, kp + (size_t)j * sp->row_k, d);
                s[r][j] = acc * km;
                if (sp->rope_cs) { /* pre-RoPE K smoothing: + q·R(t)μ × scale (kv_isa.h) */
                    const float *cs = sp->rope_cs + (size_t)(b0 + j) * kd;
                    float c = 0.0f;
                    for (int d = 0; d < kd; d++) c += rw->qc[r][d] * cs[d];
                    s[r][j] += c;
                }
            }
        if (sp->hsum) kiln_kv_hash_block(sp, b0, nb, kp, 0, kiln_kv_mlh_scalar); /* integrity: K (kv_isa.h) */
        for (int r = 0; r < R; r++) {
            int n = rw->lim[r] - b0 < nb ? rw->lim[r] - b0 : nb;
            corr[r] = 1.0f;
            if (n <= 0) { for (int j = 0; j < nb; j++) s[r][j] = 0.0f; continue; }
            float mx = rw->m[r];
            for (int j = 0; j < n; j++) mx = s[r][j] > mx ? s[r][j] : mx;
            corr[r] = kiln_kv_corr(rw->m[r], mx);
            float sum = 0.0f;
            for (int j = 0; j < nb; j++) {
                float e = j < n ? expf(s[r][j] - mx) : 0.0f;
                sum += e;
                s[r][j] = e * vm;
            }
            rw->l[r] = rw->l[r] * corr[r] + sum;
            rw->m[r] = mx;
        }
        for (int r = 0; r < R; r++)
            if (corr[r] != 1.0f)
                for (int d = 0; d < vd; d++) rw->acc[r][d] *= corr[r];
        for (int j = 0; j < nb; j++) {
            const uint8_t *vr = vp + (size_t)j * sp->row_v;
            for (int d = 0; d < vd; d++) {
                float v = decode1(dt, vr, d);
                for (int r = 0; r < R; r++) rw->acc[r][d] += s[r][j] * v;
            }
        }
        if (sp->hsum) kiln_kv_hash_block(sp, b0, nb, vp, 1, kiln_kv_mlh_scalar); /* integrity: V (kv_isa.h) */
        b0 += nb;
    }
}

/* ---- attention driver -------------------------------------------------------------------------- */
typedef struct kv_task {
    kiln_kv_rows rows;
    const kiln_kv_seq *seq;
    int kvh, t0, t1;
    int set;        /* row set this task belongs to */
    int split;      /* 1 when the set is split across tasks (acc in scratch, merged after) */
} kv_task;

typedef struct kv_set {
    int first_task, n_tasks;
    int R;
    float *out[KV_MAX_ROWS];
} kv_set;

/* Grow-only scratch of the calling thread: no allocation in steady-state decode. Freed when the
 * thread ends (a thread-specific key's destructor: OpenMP and pool workers end with their process
 * or their team, never calling kiln_kv_thread_scratch_free), or earlier by that call. */
static _Thread_local void *tl_buf[4];
static _Thread_local size_t tl_cap[4];
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_at_exit(void *unused) {
    (void)unused;
    kiln_kv_thread_scratch_free();
}
static void scratch_key_make(void) { (void)pthread_key_create(&scratch_key, scratch_at_exit); }
static void scratch_register(void) {
    pthread_once(&scratch_once, scratch_key_make);
    (void)pthread_setspecific(scratch_key, (void *)1); /* non-NULL: the destructor runs at thread exit */
}
static void *scratch(int slot, size_t bytes) {
    if (bytes > tl_cap[slot]) {
        size_t cap = (bytes + bytes / 4 + 4095) & ~(size_t)4095;
        void *q = aligned_alloc(64, cap);
        if (!q) return NULL;
        free(tl_buf[slot]);
        tl_buf[slot] = q;
        tl_cap[slot] = cap;
        scratch_register();
    }
    return tl_buf[slot];
}

void kiln_kv_thread_scratch_free(void) {
    for (int i = 0; i < 4; i++) {
        free(tl_buf[i]);
        tl_buf[i] = NULL;
        tl_cap[i] = 0;
    }
}

static void make_span(const kiln_kv_pool *p, int layer, const kiln_kv_seq *s, int kvh, float scale, kiln_kv_span *sp) {
    const int H = p->cfg.n_kv_heads;
    memset(sp, 0, sizeof *sp);
    sp->kbase = p->k[layer];
    sp->vbase = p->v[layer];
    sp->pages = s->pages;
    sp->page_k = kiln_kv_page_k_at(p, layer);
    sp->page_v = p->cfg.v_shares_k ? sp->page_k : p->page_v;
    sp->head_k = (size_t)kvh * kiln_kv_head_k_at(p, layer);
    sp->head_v = (size_t)kvh * (p->cfg.v_shares_k ? kiln_kv_head_k_at(p, layer) : p->head_v);
    sp->row_k = kiln_kv_row_k_at(p, layer);
    sp->row_v = p->cfg.v_shares_k ? sp->row_k : p->row_v;
    sp->page_tokens = p->cfg.page_tokens;
    sp->k_dim = p->cfg.k_dim;
    sp->v_dim = p->cfg.v_dim;
    sp->dtype = p->cfg.dtype;
    sp->kmul = scale;
    sp->vmul = 1.0f;
    sp->rope_cs = p->rope_cs;
    sp->prefetch = !p->integ; /* with integrity: the walker decides (fused: on; a hash pass first: off) */
    if (p->cfg.dtype == KILN_KV_FP8) {
        if (p->dscale) {
            sp->dyn_k = dslot(p, layer, 0, 0, kvh);
            sp->dyn_v = dslot(p, layer, 0, 1, kvh);
            sp->dyn_stride = (size_t)n_kinds(&p->cfg) * (size_t)H;
        } else {
            sp->kmul = scale * p->k_scale[(size_t)layer * H + kvh];
            sp->vmul = p->v_scale[(size_t)layer * H + kvh];
        }
    }
}

/* One attention call's shared state for its parallel sections (attend_task, merge_set). */
typedef struct {
    const kiln_kv_pool *p;
    int layer, vd;
    float scale;
    kv_task *tasks;
    kv_set *sets;
    kiln_kv_attend_fn fn;
} attend_job;

/* Task ti: one row set over one split of the context. */
static void attend_task(void *arg, int64_t ti) {
    const attend_job *j = arg;
    const kiln_kv_pool *p = j->p;
    const int vd = j->vd;
    kv_task *tk = &j->tasks[ti];
    kiln_kv_rows *rw = &tk->rows;
    for (int r = 0; r < rw->R; r++) {
        rw->m[r] = -INFINITY;
        rw->l[r] = 0.0f;
        memset(rw->acc[r], 0, (size_t)vd * sizeof(float));
    }
    kiln_kv_span sp;
    make_span(p, j->layer, tk->seq, tk->kvh, j->scale, &sp);
    /* integrity: the kernel hashes the pages it reads, verified before this task's output is used
     * (kv/integrity.h, fused) */
    if (tk->t1 > tk->t0) {
        if (p->integ) kiln_kv_integ_attend(p, j->layer, tk->seq, tk->kvh, j->fn, &sp, rw, tk->t0, tk->t1, 1);
        else j->fn(&sp, rw, tk->t0, tk->t1);
    }
    if (!tk->split)
        for (int r = 0; r < rw->R; r++) {
            float inv = rw->l[r] > 0.0f ? 1.0f / rw->l[r] : 0.0f;
            for (int d = 0; d < vd; d++) rw->acc[r][d] *= inv;
        }
}

/* Merges the splits of each row of set s2: out = Σ_s acc_s e^{m_s − M} / Σ_s l_s e^{m_s − M}. */
static void merge_set(void *arg, int64_t s2) {
    const attend_job *j = arg;
    const int vd = j->vd;
    const kv_set *st = &j->sets[s2];
    const kv_task *tasks = j->tasks;
    for (int r = 0; r < st->R; r++) {
        float M = -INFINITY, L = 0.0f;
        for (int k = 0; k < st->n_tasks; k++) M = fmaxf(M, tasks[st->first_task + k].rows.m[r]);
        float *o = st->out[r];
        memset(o, 0, (size_t)vd * sizeof(float));
        for (int k = 0; k < st->n_tasks; k++) {
            const kiln_kv_rows *rw = &tasks[st->first_task + k].rows;
            if (rw->l[r] <= 0.0f) continue;
            float w = expf(rw->m[r] - M);
            L += rw->l[r] * w;
            for (int d = 0; d < vd; d++) o[d] += rw->acc[r][d] * w;
        }
        float inv = L > 0.0f ? 1.0f / L : 0.0f;
        for (int d = 0; d < vd; d++) o[d] *= inv;
    }
}

void kiln_kv_attend_batch_cx(const kiln_kctx *cx, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                             const float *q, int n_heads, float scale, float *out) {
    const int H = p->cfg.n_kv_heads, kd = p->cfg.k_dim, vd = p->cfg.v_dim;
    if (p->dsa_key_at) { /* DSA compact rows are read by the sparse attention only (kv_sparse.c): never misread their bytes as dtype rows */
        memset(out, 0, (size_t)n * (size_t)n_heads * (size_t)vd * sizeof *out);
        return;
    }
    const int group = n_heads / H;
    const int hb_max = group < KV_MAX_ROWS ? group : KV_MAX_ROWS;  /* heads per row set */
    const int tok_max = group < KV_MAX_ROWS ? KV_MAX_ROWS / group : 1; /* tokens per row set */
    const int n_hblk = (group + hb_max - 1) / hb_max;
    const int nth = cx->threads;
    /* Row sets: tiles of up to tok_max consecutive tokens of one sequence × up to hb_max heads of
     * one KV head's group. Upper bound on their number: n × H × n_hblk. */
    size_t max_sets = (size_t)n * (size_t)H * (size_t)n_hblk;
    kv_set *sets = scratch(0, max_sets * sizeof *sets);
    if (!sets) return; /* cannot happen in practice: scratch of a few KB */
    int n_sets = 0, max_lim = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && j - i < tok_max && seq[j] == seq[i]) j++;
        for (int kvh = 0; kvh < H; kvh++)
            for (int hb = 0; hb < group; hb += hb_max) {
                int hn = group - hb < hb_max ? group - hb : hb_max;
                kv_set *st = &sets[n_sets++];
                st->R = 0;
                for (int t = i; t < j; t++)
                    for (int hh = 0; hh < hn; hh++)
                        st->out[st->R++] = out + ((size_t)t * n_heads + (size_t)(kvh * group + hb + hh)) * vd;
            }
        for (int t = i; t < j; t++) max_lim = pos[t] + 1 > max_lim ? pos[t] + 1 : max_lim;
        i = j;
    }
    /* Context splits when there are too few row sets to feed the threads (long-context decode). */
    int splits = 1;
    if (n_sets < 2 * nth && max_lim >= 512) {
        splits = (2 * nth + n_sets - 1) / n_sets;
        if (splits > max_lim / 256) splits = max_lim / 256;
        if (splits < 1) splits = 1;
    }
    size_t n_tasks = (size_t)n_sets * (size_t)splits;
    kv_task *tasks = scratch(1, n_tasks * sizeof *tasks);
    float *part = splits > 1 ? scratch(2, n_tasks * KV_MAX_ROWS * (size_t)vd * sizeof(float)) : NULL;
    if (!tasks || (splits > 1 && !part)) return;
    /* Pre-RoPE K smoothing: the per-pair coefficients of q·R(t)μ × scale for every (token, head)
     * [n × n_heads × kd] (kv_isa.h): one extra kd-long dot product per score in the kernels. */
    float *qc = NULL;
    if (p->rope_cs) {
        qc = scratch(3, (size_t)n * (size_t)n_heads * (size_t)kd * sizeof(float));
        if (!qc) return;
        const int half = kd / 2;
        for (int t = 0; t < n; t++)
            for (int hq = 0; hq < n_heads; hq++) {
                const float *qq = q + ((size_t)t * n_heads + (size_t)hq) * kd;
                const float *mu = p->k_mean + ((size_t)layer * H + (size_t)(hq / group)) * (size_t)kd;
                float *o = qc + ((size_t)t * n_heads + (size_t)hq) * kd;
                for (int i = 0; i < half; i++) {
                    int a, b;
                    rope_pair(p->cfg.rope_norm, kd, i, &a, &b);
                    o[i] = (qq[a] * mu[a] + qq[b] * mu[b]) * scale;
                    o[half + i] = (qq[b] * mu[a] - qq[a] * mu[b]) * scale;
                }
            }
    }
    /* Fill tasks (re-walk the same tiling). */
    int si = 0;
    double work = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && j - i < tok_max && seq[j] == seq[i]) j++;
        int lim_hi = 0;
        for (int t = i; t < j; t++) lim_hi = pos[t] + 1 > lim_hi ? pos[t] + 1 : lim_hi;
        int chunk = ((lim_hi + splits - 1) / splits + 15) & ~15;
        for (int kvh = 0; kvh < H; kvh++)
            for (int hb = 0; hb < group; hb += hb_max, si++) {
                int hn = group - hb < hb_max ? group - hb : hb_max;
                kv_set *st = &sets[si];
                st->first_task = si * splits;
                st->n_tasks = splits;
                for (int sp = 0; sp < splits; sp++) {
                    kv_task *tk = &tasks[si * splits + sp];
                    tk->seq = seq[i];
                    tk->kvh = kvh;
                    tk->set = si;
                    tk->split = splits > 1;
                    tk->t0 = sp * chunk < lim_hi ? sp * chunk : lim_hi;
                    tk->t1 = (sp + 1) * chunk < lim_hi ? (sp + 1) * chunk : lim_hi;
                    kiln_kv_rows *rw = &tk->rows;
                    rw->R = 0;
                    for (int t = i; t < j; t++)
                        for (int hh = 0; hh < hn; hh++) {
                            int r = rw->R++, head = kvh * group + hb + hh;
                            rw->q[r] = q + ((size_t)t * n_heads + (size_t)head) * kd;
                            rw->qc[r] = qc ? qc + ((size_t)t * n_heads + (size_t)head) * kd : NULL;
                            rw->lim[r] = pos[t] + 1;
                            rw->acc[r] = splits > 1 ? part + ((size_t)(si * splits + sp) * KV_MAX_ROWS + (size_t)r) * vd : st->out[r];
                        }
                    work += (double)rw->R * (double)(tk->t1 - tk->t0) * (double)(kd + vd);
                }
            }
        i = j;
    }
    const kiln_kv_ktable *kt = kv_table_for(cx->isa);
    attend_job job = {.p = p, .layer = layer, .vd = vd, .scale = scale, .tasks = tasks, .sets = sets,
                      .fn = kt ? kt->attend : kiln_kv_attend_scalar};
    if (p->integ) kiln_kv_integ_begin_attend(p, layer, n, seq, pos); /* integrity: a new verification round */
    /* Sections on kiln's worker pool (base/pool.h), like the matmuls around them. */
    kiln_pool_for((int64_t)n_tasks, attend_task, &job, n_tasks > 1 && work > 65536.0 ? nth : 1);
    if (splits == 1) return;
    kiln_pool_for(n_sets, merge_set, &job, n_sets > 1 && work > 65536.0 ? nth : 1);
}

/* ---- verification without the computation (backends that attend elsewhere) ---- */
static void attend_nothing(const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1) { (void)sp; (void)rw; (void)t0; (void)t1; }

typedef struct {
    const kiln_kv_pool *p;
    int layer, H;
    kiln_kv_seq *const *seq;
    const int *lim; /* per distinct sequence: positions its tokens read */
} verify_job;

static void verify_task(void *arg, int64_t ti) {
    const verify_job *j = arg;
    const int si = (int)(ti / j->H), kvh = (int)(ti % j->H);
    kiln_kv_span sp;
    make_span(j->p, j->layer, j->seq[si], kvh, 1.0f, &sp);
    kiln_kv_rows rw;
    memset(&rw, 0, sizeof rw);
    rw.R = 1;
    rw.lim[0] = j->lim[si];
    kiln_kv_integ_attend(j->p, j->layer, j->seq[si], kvh, attend_nothing, &sp, &rw, 0, j->lim[si], 0);
}

void kiln_kv_verify_attend_cx(const kiln_kctx *cx, const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos) {
    if (!p->integ || n <= 0) return;
    kiln_kv_seq **ds = scratch(0, (size_t)n * sizeof *ds);
    int *lim = scratch(1, (size_t)n * sizeof *lim);
    if (!ds || !lim) return;
    int nd = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < nd && ds[k] != seq[i]) k++;
        if (k == nd) { ds[nd] = seq[i]; lim[nd++] = 0; }
        if (pos[i] + 1 > lim[k]) lim[k] = pos[i] + 1;
    }
    kiln_kv_integ_begin_attend(p, layer, n, seq, pos);
    const int H = p->cfg.n_kv_heads;
    verify_job job = {.p = p, .layer = layer, .H = H, .seq = ds, .lim = lim};
    kiln_pool_for((int64_t)nd * H, verify_task, &job, (int64_t)nd * H > 1 ? cx->threads : 1);
}

void kiln_kv_attend_batch(const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos,
                          const float *q, int n_heads, float scale, float *out) {
    kiln_kctx cx;
    kiln_kctx_default(&cx);
    kiln_kv_attend_batch_cx(&cx, p, layer, n, seq, pos, q, n_heads, scale, out);
}

void kiln_kv_attend(const kiln_kv_pool *p, const kiln_kv_seq *s, int layer, const float *q, int n_heads,
                    int n_ctx, float scale, float *att, float *out) {
    (void)att;
    kiln_kv_seq *sq = (kiln_kv_seq *)s;
    int pos = n_ctx - 1;
    kiln_kv_attend_batch(p, layer, 1, &sq, &pos, q, n_heads, scale, out);
}
