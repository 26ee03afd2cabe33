/* session.c — one sequence over its own paged KV pool: the API behind `kiln run` and the
 * evaluation tools. Prompts are processed in chunks of up to SESSION_CHUNK tokens. */
#include "kiln.h"
#include "base/status.h"
#include "model/forward.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define SESSION_CHUNK 64

struct kiln_session {
    struct kiln_model *m;
    kiln_options opts;
    kiln_kv_pool *pool;
    kiln_kv_seq seq;
    kiln_forward_ws ws;
    int n_ctx;
};

kiln_kv_dtype kiln_resolve_kv_dtype(const struct kiln_model *m, kiln_kv_dtype want) {
    if (want != KILN_KV_AUTO) return want;
    return m->hp.act_dtype == KILN_DT_F32 ? KILN_KV_F32 : KILN_KV_BF16;
}

kiln_status kiln_session_create(kiln_model *m, const kiln_options *opts, kiln_session **out) {
    *out = NULL;
    kiln_options o;
    if (opts) o = *opts; else kiln_options_default(&o);
    if (o.kv_page_tokens <= 0) o.kv_page_tokens = 16;
    if (o.threads > 0) omp_set_num_threads(o.threads);
    kiln_kernels_select(o.isa);
    kiln_session *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->m = m;
    s->opts = o;
    s->n_ctx = o.max_context > 0 && o.max_context < m->hp.max_seq ? o.max_context : m->hp.max_seq;
    kiln_kv_config kc = {m->hp.n_layers, m->hp.n_kv_heads, m->hp.head_dim, o.kv_page_tokens, kiln_resolve_kv_dtype(m, o.kv_dtype), o.kv_mem_bytes};
    if (kc.mem_bytes <= 0) {
        int64_t pages = (s->n_ctx + kc.page_tokens - 1) / kc.page_tokens;
        kc.mem_bytes = pages * (int64_t)kiln_kv_page_cost(&kc);
    }
    kiln_status st = kiln_kv_pool_create(&kc, &s->pool);
    if (st == KILN_OK) st = kiln_forward_ws_init(&s->ws, m, SESSION_CHUNK, s->n_ctx);
    if (st != KILN_OK) { kiln_session_free(s); return st; }
    *out = s;
    return KILN_OK;
}

void kiln_session_free(kiln_session *s) {
    if (!s) return;
    if (s->pool) kiln_kv_seq_release(s->pool, &s->seq);
    free(s->seq.pages);
    kiln_kv_pool_free(s->pool);
    kiln_forward_ws_free(&s->ws);
    free(s);
}

kiln_status kiln_session_eval(kiln_session *s, const int32_t *tokens, int n, float *logits) {
    if (n <= 0) return kiln_fail(KILN_ERR_INVALID_ARG, "session_eval: no tokens");
    if (s->seq.len + n > s->n_ctx)
        return kiln_fail(KILN_ERR_INVALID_ARG, "context length exceeded: %d + %d tokens > context %d", s->seq.len, n, s->n_ctx);
    KILN_TRY(kiln_kv_seq_reserve(s->pool, &s->seq, s->seq.len + n));
    int V = s->m->hp.vocab;
    for (int i = 0; i < n; i += SESSION_CHUNK) {
        int c = n - i < SESSION_CHUNK ? n - i : SESSION_CHUNK;
        int last = i + c == n;
        float *lg = logits ? logits + (size_t)i * V : NULL;
        KILN_TRY(kiln_forward(s->m, s->pool, &s->seq, &s->ws, tokens + i, c, lg));
        if (last && logits) memcpy(s->ws.logits, lg + (size_t)(c - 1) * V, (size_t)V * 4);
    }
    return KILN_OK;
}

const float *kiln_session_logits(const kiln_session *s) { return s->ws.logits; }
int kiln_session_length(const kiln_session *s) { return s->seq.len; }
void kiln_session_reset(kiln_session *s) { kiln_kv_seq_release(s->pool, &s->seq); }

/* Accessor for src/engine/session_util.c (evaluation helpers such as kiln_session_truncate), which
 * cannot see this file's struct. Declared in engine/session_internal.h. */
void kiln_session_kv_(kiln_session *s, kiln_kv_pool **pool, kiln_kv_seq **seq) {
    *pool = s->pool;
    *seq = &s->seq;
}
