/* kv_bench.c — the attention kernels alone, for `kiln bench --attention` (kiln_test.h).
 *
 * Why a kernel-level bench: end-to-end decode figures on a shared 2-vCPU VM swing ±10% between
 * runs, more than the attention changes they are meant to show; a pass of the kernels over a
 * synthetic KV, with the KV evicted from the caches before it (as a decode step's weight stream
 * leaves it) and hashing on / off alternated round by round, is repeatable to a few percent.
 *
 * Layout: the pool's own, one array per layer of [page][KV head][16 tokens][head_dim] (K and V
 * arrays apart), pages of each sequence in shuffled order; every KV head of every layer is one
 * kernel call over [0, ctx) with `rows` query rows (the heads of a GQA group), as in a decode step.
 * Keys of the fused hash drawn as the pool draws them ([1, 2^32)). */
#include "kiln_test.h"
#include "base/status.h"
#include "kernels/gemv.h"
#include "kv/kv_isa.h"
#include "base/pool.h"
#include <stdlib.h>
#include <string.h>

enum { BENCH_PAGE_TOKENS = 16, BENCH_EVICT_BYTES = 64 << 20 };

static uint32_t next_rand(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* One layer's pass: every KV head one kernel call over [0, ctx), the heads spread over the threads
 * as a decode step spreads them (kiln_pool_for); each head its own accumulators and page sums. */
typedef struct {
    kiln_kv_attend_fn attend;
    const uint8_t *k, *v;
    const int32_t *table;
    const uint32_t *keys;
    const float *q;
    float *acc;     /* [kv_heads][rows][head_dim] */
    uint64_t *hsum; /* [kv_heads][2 × n_pages] */
    size_t page, head, row;
    int pt, n_pages, head_dim, ctx, rows, on;
    kiln_kv_dtype dtype;
} bench_layer;

static void bench_head(void *arg, int64_t h) {
    const bench_layer *b = arg;
    kiln_kv_span sp;
    memset(&sp, 0, sizeof sp);
    sp.kbase = b->k;
    sp.vbase = b->v;
    sp.pages = b->table;
    sp.page_k = sp.page_v = b->page;
    sp.head_k = sp.head_v = (size_t)h * b->head;
    sp.row_k = sp.row_v = b->row;
    sp.page_tokens = b->pt;
    sp.k_dim = sp.v_dim = b->head_dim;
    sp.dtype = b->dtype;
    sp.kmul = 1.0f / (float)b->head_dim;
    sp.vmul = 1.0f;
    sp.prefetch = 1;
    if (b->on) {
        sp.hkey = b->keys;
        sp.hash_v = 1;
        sp.hsum = b->hsum + (size_t)h * 2 * (size_t)b->n_pages;
        memset(sp.hsum, 0, 2 * (size_t)b->n_pages * sizeof *sp.hsum);
    }
    kiln_kv_rows rw;
    memset(&rw, 0, sizeof rw);
    rw.R = b->rows;
    for (int i = 0; i < b->rows; i++) {
        rw.q[i] = b->q + (size_t)i * b->head_dim;
        rw.acc[i] = b->acc + ((size_t)h * b->rows + (size_t)i) * b->head_dim;
        memset(rw.acc[i], 0, (size_t)b->head_dim * sizeof(float));
        rw.lim[i] = b->ctx;
        rw.m[i] = -1e30f;
    }
    b->attend(&sp, &rw, 0, b->ctx);
}

kiln_status kiln_attend_bench(kiln_isa isa, kiln_kv_dtype dtype, int layers, int kv_heads, int head_dim, int ctx, int rows, int rounds,
                              int threads, double *ns_off, double *ns_on) {
    if (dtype != KILN_KV_F32 && dtype != KILN_KV_BF16 && dtype != KILN_KV_FP8)
        return kiln_fail(KILN_ERR_INVALID_ARG, "attention bench: KV dtype %d is not f32, bf16 or fp8", (int)dtype);
    if (layers < 1 || layers > 256 || kv_heads < 1 || kv_heads > 256 || head_dim < 8 || head_dim > 256 || head_dim % 8 || ctx < 1 ||
        ctx > (1 << 20) || rows < 1 || rows > KV_MAX_ROWS || rounds < 1 || threads < 1 || threads > 1024)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "attention bench: layers %d (1-256), KV heads %d (1-256), head dim %d (8-256, a multiple of 8), context %d "
                         "(1-1048576), rows %d (1-%d), rounds %d (>= 1) or threads %d (1-1024) out of range",
                         layers, kv_heads, head_dim, ctx, rows, KV_MAX_ROWS, rounds, threads);
    if (isa == KILN_ISA_AUTO) isa = kiln_kernels_current();
    if (isa != KILN_ISA_SCALAR && !kiln_cpu_supports(isa))
        return kiln_fail(KILN_ERR_INVALID_ARG, "attention bench: this CPU does not have --isa %s", kiln_isa_name(isa));
    const kiln_kv_ktable *kt = kiln_kv_table_for(isa);
    const kiln_kv_attend_fn attend = kt ? kt->attend : kiln_kv_attend_scalar;

    const int pt = BENCH_PAGE_TOKENS, n_pages = (ctx + pt - 1) / pt;
    const size_t es = dtype == KILN_KV_F32 ? 4 : dtype == KILN_KV_BF16 ? 2 : 1;
    const size_t row = (size_t)head_dim * es, head = row * (size_t)pt, page = head * (size_t)kv_heads, arr = page * (size_t)n_pages;
    const size_t n_keys = head / 4 + 16;
    uint8_t **k = calloc((size_t)layers, sizeof *k), **v = calloc((size_t)layers, sizeof *v);
    int32_t *table = malloc((size_t)n_pages * sizeof *table);
    uint32_t *keys = malloc(n_keys * sizeof *keys);
    uint64_t *hsum = malloc((size_t)kv_heads * 2 * (size_t)n_pages * sizeof *hsum);
    float *q = kiln_alloc64((size_t)rows * (size_t)head_dim * sizeof *q);
    float *acc = kiln_alloc64((size_t)kv_heads * (size_t)rows * (size_t)head_dim * sizeof *acc);
    uint8_t *evict = malloc(BENCH_EVICT_BYTES);
    kiln_status st = k && v && table && keys && hsum && q && acc && evict ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "attention bench: out of memory");
    uint32_t seed = 0x9e3779b9u;
    for (int l = 0; st == KILN_OK && l < layers; l++) {
        k[l] = kiln_alloc64(arr);
        v[l] = kiln_alloc64(arr);
        if (!k[l] || !v[l]) {
            st = kiln_fail(KILN_ERR_NOMEM, "attention bench: cannot allocate %zu bytes of KV per layer", 2 * arr);
            break;
        }
        /* finite values in every dtype: BF16 / FP32 bytes below 0x40 in each high byte, FP8 codes below 0x40 */
        for (size_t i = 0; i < arr; i++) {
            k[l][i] = (uint8_t)(next_rand(&seed) & 0x3F);
            v[l][i] = (uint8_t)(next_rand(&seed) & 0x3F);
        }
    }
    if (st == KILN_OK) {
        for (int i = 0; i < n_pages; i++) table[i] = i;
        for (int i = n_pages - 1; i > 0; i--) { /* scattered pages, as a pool hands them out after churn */
            const int j = (int)(next_rand(&seed) % (uint32_t)(i + 1)), t = table[i];
            table[i] = table[j];
            table[j] = t;
        }
        for (size_t i = 0; i < n_keys; i++) keys[i] = next_rand(&seed) | 1u;
        for (int i = 0; i < rows * head_dim; i++) q[i] = (float)((int)(next_rand(&seed) % 200) - 100) / 400.0f;
    }
    for (int r = 0; st == KILN_OK && r < rounds; r++)
        for (int on = 0; on < 2; on++) {
            memset(evict, r + on, BENCH_EVICT_BYTES); /* the KV out of the caches, as after a step's weights */
            const double t0 = kiln_now();
            for (int l = 0; l < layers; l++) {
                bench_layer bl = {attend, k[l], v[l], table, keys, q, acc, hsum, page, head, row, pt, n_pages, head_dim, ctx, rows, on, dtype};
                kiln_pool_for(kv_heads, bench_head, &bl, threads);
            }
            const double ns = (kiln_now() - t0) * 1e9 / ((double)layers * kv_heads * ctx);
            (on ? ns_on : ns_off)[r] = ns;
        }
    for (int l = 0; k && v && l < layers; l++) {
        free(k[l]);
        free(v[l]);
    }
    free(k);
    free(v);
    free(table);
    free(keys);
    free(hsum);
    free(q);
    free(acc);
    free(evict);
    return st;
}
