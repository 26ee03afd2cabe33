/* bench_batch.c — `kiln bench --batch`: aggregate decode tokens/s of B sequences stepped together
 * (what the server's continuous batching does with B running requests), through the same forward
 * pass and backend as the engine: one step multiplies every weight once for all B tokens (the
 * batched GEMM), then each token attends over its own sequence's pages. */
#include "kiln_test.h"
#include "base/status.h"
#include "engine/kv_setup.h"
#include "model/forward.h"
#include <stdlib.h>
#include <string.h>

static double last_index_s, last_attend_s;

void kiln_bench_batched_sparse(double *index_s, double *attend_s) {
    *index_s = last_index_s;
    *attend_s = last_attend_s;
}

kiln_status kiln_bench_batched_decode(kiln_model *m, const kiln_options *opts, int batch, int ctx, int steps, double *tps) {
    *tps = 0;
    if (batch < 1 || batch > 1024 || ctx < 1 || steps < 1)
        return kiln_fail(KILN_ERR_INVALID_ARG, "--batch %d / --ctx %d / --decode %d: need 1..1024 sequences, a context and steps", batch, ctx, steps);
    kiln_options o;
    if (opts) o = *opts; else kiln_options_default(&o);
    o.kv_integrity = KILN_KV_INTEGRITY_OFF; /* the batch's compute alone (the integrity bench measures seals) */
    const int n_ctx = ctx + steps + 1;
    if (n_ctx > kiln_model_context(m, &o))
        return kiln_fail(KILN_ERR_INVALID_ARG, "--ctx %d + %d decode steps exceed the model's context %d", ctx, steps, kiln_model_context(m, &o));
    if (o.kv_mem_bytes <= 0) { /* room for every sequence (the default budget sizes one context) */
        kiln_kv_config c;
        memset(&c, 0, sizeof c);
        kiln_kv_layout_for_model(m, &c);
        c.page_tokens = o.kv_page_tokens > 0 ? o.kv_page_tokens : 16;
        int dsa_fp8;
        c.dtype = kiln_kv_pool_dtype(m, o.kv_dtype, &dsa_fp8);
        o.kv_mem_bytes = (int64_t)batch * ((n_ctx + c.page_tokens - 1) / c.page_tokens + 1) * (int64_t)kiln_kv_page_cost(&c) + (64 << 20);
    }
    kiln_model_prepare_compute(m, &o);
    kiln_backend *be = NULL;
    kiln_kv_pool *pool = NULL;
    kiln_kv_setup su;
    memset(&su, 0, sizeof su);
    kiln_forward_ws ws;
    memset(&ws, 0, sizeof ws);
    kiln_kv_seq *seqs = calloc((size_t)batch, sizeof *seqs);
    kiln_kv_seq **sp = calloc((size_t)batch, sizeof *sp);
    int32_t *toks = malloc((size_t)(batch > ctx ? batch : ctx) * sizeof *toks);
    int *pos = malloc((size_t)batch * sizeof *pos), *out_row = malloc((size_t)batch * sizeof *out_row);
    float *logits = malloc((size_t)batch * (size_t)m->hp.vocab * sizeof *logits);
    kiln_status st = seqs && sp && toks && pos && out_row && logits ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (st == KILN_OK) st = kiln_backend_from_options(&o, &be);
    if (st == KILN_OK) st = kiln_kv_setup_for_model(m, &o, n_ctx, 1, &su);
    if (st == KILN_OK) kiln_be_kv_arrays(be, &su.cfg);
    if (st == KILN_OK) st = kiln_kv_pool_create(&su.cfg, &pool);
    if (st == KILN_OK) st = kiln_forward_ws_init(&ws, m, be, batch > 64 ? batch : 64, n_ctx);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    /* every sequence prefilled with its own ctx pseudo-random tokens */
    for (int b = 0; st == KILN_OK && b < batch; b++) {
        for (int i = 0; i < ctx; i++) { x = x * 6364136223846793005ull + 1442695040888963407ull; toks[i] = (int32_t)((x >> 33) % (uint64_t)m->hp.vocab); }
        st = kiln_kv_seq_reserve(pool, &seqs[b], n_ctx);
        for (int i = 0; st == KILN_OK && i < ctx; i += 64)
            st = kiln_forward(m, pool, &seqs[b], &ws, toks + i, ctx - i < 64 ? ctx - i : 64, NULL);
        sp[b] = &seqs[b];
    }
    double t0 = 0, ix0 = 0, at0 = 0;
    for (int s = 0; st == KILN_OK && s <= steps; s++) {
        if (s == 1) { /* the first step warms the batch's buffers; steps 1..steps are timed */
            t0 = kiln_now();
            kiln_kv_sparse_times(&ix0, &at0);
        }
        for (int b = 0; b < batch; b++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            toks[b] = (int32_t)((x >> 33) % (uint64_t)m->hp.vocab);
            pos[b] = seqs[b].len;
            out_row[b] = b;
        }
        kiln_batch bt = {batch, toks, sp, pos, out_row};
        be->cx.decode_steps = 1; /* a step of `batch` decodes: the 1-token kernels' form (kiln_kctx), as the server's */
        st = kiln_forward_batch(m, pool, &ws, &bt, logits);
        be->cx.decode_steps = 0;
    }
    if (st == KILN_OK) {
        const double dt = kiln_now() - t0;
        *tps = dt > 0 ? (double)batch * steps / dt : 0;
        double ix1, at1;
        kiln_kv_sparse_times(&ix1, &at1);
        last_index_s = (ix1 - ix0) / steps;
        last_attend_s = (at1 - at0) / steps;
    }
    for (int b = 0; seqs && pool && b < batch; b++) {
        kiln_kv_seq_release(pool, &seqs[b]);
        free(seqs[b].pages);
    }
    kiln_forward_ws_free(&ws);
    kiln_kv_pool_free(pool);
    kiln_kv_setup_free(&su);
    kiln_backend_free(be);
    free(seqs); free(sp); free(toks); free(pos); free(out_row); free(logits);
    return st;
}
