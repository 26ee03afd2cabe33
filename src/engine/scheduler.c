/* scheduler.c — continuous batching over a shared paged KV pool (see scheduler.h for the model).
 *
 * Sections: requests · engine lifetime · submission (producer threads) · the scheduler thread:
 * cancellation, admission with prefix reuse, batch building with chunked prefill and preemption,
 * the forward step, sampling and output, statistics. */
#include "kiln_test.h"
#include "engine/scheduler.h"
#include "engine/json_grammar.h"
#include "engine/prefix_cache.h"
#include "engine/mtp.h"
#include "model/arch.h"
#include "base/status.h"
#include "model/forward.h"
#include "model/model.h"
#include "engine/kv_setup.h"
#include "kv/integrity.h"
#include "dist/dist.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double kiln_latency_bounds[16] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, INFINITY};

/* ---- requests ------------------------------------------------------------------------------------ */
kiln_status kiln_req_create(const int32_t *prompt, int n_prompt, int max_tokens, const kiln_sampling *sp, int vocab,
                            int top_logprobs, kiln_req **out) {
    *out = NULL;
    if (n_prompt < 1 || max_tokens < 1 || top_logprobs > KILN_MAX_TOP_LOGPROBS)
        return kiln_fail(KILN_ERR_INVALID_ARG, "request: %d prompt tokens, max_tokens %d, top_logprobs %d", n_prompt, max_tokens, top_logprobs);
    kiln_req *r = calloc(1, sizeof *r);
    if (!r) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    size_t total = (size_t)n_prompt + (size_t)max_tokens;
    r->toks = malloc(total * sizeof *r->toks);
    r->ev = calloc((size_t)max_tokens, sizeof *r->ev);
    r->hashes = calloc(total + 1, sizeof *r->hashes); /* more than the pages of `total` tokens */
    if (top_logprobs > 0) {
        r->top_ids = malloc((size_t)max_tokens * (size_t)top_logprobs * sizeof *r->top_ids);
        r->top_lp = malloc((size_t)max_tokens * (size_t)top_logprobs * sizeof *r->top_lp);
    }
    kiln_status st = KILN_OK;
    if (!r->toks || !r->ev || !r->hashes || (top_logprobs > 0 && (!r->top_ids || !r->top_lp)))
        st = kiln_fail(KILN_ERR_NOMEM, "out of memory for a request of %zu tokens", total);
    if (st == KILN_OK) st = kiln_sampler_create(sp, vocab, &r->sampler);
    if (st == KILN_OK) st = kiln_sampler_prompt(r->sampler, prompt, (size_t)n_prompt); /* repetition penalty */
    if (st != KILN_OK) {
        kiln_sampler_free(r->sampler);
        free(r->toks); free(r->ev); free(r->hashes); free(r->top_ids); free(r->top_lp);
        free(r);
        return st;
    }
    memcpy(r->toks, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_prompt = r->n_toks = n_prompt;
    r->max_tokens = max_tokens;
    r->top_logprobs = top_logprobs;
    r->prompt_logprobs = -1;
    r->cached_tokens = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->cancel, 0);
    atomic_init(&r->refs, 1);
    *out = r;
    return KILN_OK;
}

kiln_status kiln_req_want_prompt_logprobs(kiln_req *r, int k) {
    if (k < 0 || k > KILN_MAX_TOP_LOGPROBS) return kiln_fail(KILN_ERR_INVALID_ARG, "prompt logprobs: %d alternatives (0..%d)", k, KILN_MAX_TOP_LOGPROBS);
    const size_t n = (size_t)r->n_prompt;
    r->plp = malloc(n * sizeof *r->plp);
    r->prank = malloc(n * sizeof *r->prank);
    if (k > 0) {
        r->ptop_ids = malloc(n * (size_t)k * sizeof *r->ptop_ids);
        r->ptop_lp = malloc(n * (size_t)k * sizeof *r->ptop_lp);
    }
    if (!r->plp || !r->prank || (k > 0 && (!r->ptop_ids || !r->ptop_lp))) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the logprobs of %zu prompt tokens", n);
    r->plp[0] = NAN; /* the first token has no context: no log-probability */
    r->prank[0] = 0;
    r->prompt_logprobs = k;
    return KILN_OK;
}

kiln_status kiln_req_set_grammar(kiln_req *r, kiln_jg *g) {
    r->grammar = g;
    if (!g) return KILN_OK;
    r->gstate = malloc(sizeof *r->gstate);
    if (!r->gstate) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_jg_start(g, r->gstate);
    return KILN_OK;
}

void kiln_req_unref(kiln_req *r) {
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    kiln_req_unref(r->share_from);
    kiln_mtp_free(r->mtp); /* normally freed at the finish, on the scheduler thread */
    kiln_sampler_free(r->sampler);
    kiln_jg_free(r->grammar);
    free(r->gstate);
    free(r->toks); free(r->ev); free(r->hashes); free(r->top_ids); free(r->top_lp);
    free(r->plp); free(r->prank); free(r->ptop_ids); free(r->ptop_lp);
    free(r->seq.pages);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* ---- engine ---------------------------------------------------------------------------------------- */
struct kiln_engine {
    kiln_model *m;
    kiln_engine_config cfg;
    int n_ctx, vocab, pt;
    int eos_ids[KILN_MAX_EOS], n_eos; /* every id that ends a request (the model's eos set) */
    char kv_source[512];    /* where FP8 scales came from ("none" for f32 / bf16) */
    kiln_kv_pool *pool;
    FILE *spec_trace;       /* KILN_SPEC_TRACE: the drafts of every step, or NULL */
    kiln_kv_pool *mtp_pool; /* MTP drafters' KV, page for page with `pool` (engine/mtp.h); made at the first MTP request */
    int mtp_pool_failed;    /* ... or could not be made (not tried again) */
    kiln_pcache pc;
    kiln_backend *be;       /* computes the engine's steps (its own ISA, threads, FP8 form) */
    kiln_forward_ws ws;
    float *logits;          /* [logits_rows × vocab] */
    int logits_rows;        /* max_batch, grown when speculating requests need a row per draft */
    float *hid;             /* [hid_rows, dim] the step's last-layer hidden rows, for MTP drafters (NULL until needed) */
    int hid_rows;
    int16_t *plain_len;     /* structured output: plain_lengths() (NULL until needed) */
    int32_t *b_tok;         /* [step_tokens] the step's tokens ... */
    kiln_kv_seq **b_seq;    /* ... their sequences ... */
    int *b_pos, *b_out;     /* ... positions and logits rows */
    kiln_req **b_req;       /* [max_batch] requests in the step, in batch order */
    int *b_cnt;             /* [max_batch] tokens each contributes */
    int32_t *m_pages;       /* [n_pages] prefix-match scratch */
    uint64_t *m_hashes;
    pthread_t th;
    int th_started;
    pthread_mutex_t mu;     /* guards: waiting list, closed, stopping, pub */
    pthread_cond_t cv;
    kiln_req *wait_head, *wait_tail;
    int n_waiting, closed, stopping;
    int n_active;           /* submitted and not yet finished (queued or running) */
    uint64_t next_arrival;
    kiln_req **running;     /* [max_batch] scheduler-private, in arrival order */
    int n_running;
    int32_t *bad_pages;     /* [n_pages] integrity: pages reported bad, to drop from the cache */
    kiln_engine_stats acc;  /* scheduler-private running totals */
    kiln_engine_stats pub;  /* published copy (under mu) */
    /* ---- tensor parallelism (scheduler.h, docs/SCALE.md) ---- */
    int tp, rank;           /* ranks of the sharded model (1: one process) and this one */
    double tp_timeout;      /* seconds a follower waits for rank 0's next message (0 = forever) */
    atomic_int failed;      /* a rank was lost: every request failed, nothing more accepted */
    int32_t *msg;           /* the step message (rank 0 builds it, the others receive it) */
    int msg_n, msg_cap;
    int32_t *drops;         /* rank 0: arrivals of announced requests reap finished this step, in order */
    int n_drops, cap_drops;
    int32_t *emitted;       /* [max_batch × EMIT_STRIDE] per batch entry what rank 0 emitted: n tokens,
                               accepted drafts, finish, then the n tokens (speculation: up to 17) */
    int32_t *bad_codes;     /* [max_batch + 1] integrity: first bad slot × 8 + kind per entry, −bad pages */
    uint32_t *bad_map;      /* [(n_pages + 31) / 32] integrity: pages found bad on any rank */
};

/* Step message kinds (rank 0 → the others). Layout of STEP: kind, n_drop, n_new, the dropped
 * arrivals, then per new request: arrival, n_prompt, max_tokens, share_from's arrival (−1 none),
 * its speculation k (0 = none) and n-gram length, its prompt ids. Arrival numbers travel as int32 (2^31 requests per server run). */
enum { TP_MSG_STEP = 1, TP_MSG_STOP = 2, TP_MSG_HEARTBEAT = 3 };
#define SPEC_MAX_K 16                /* drafts per request and step (the "speculative" field's limit) */
#define EMIT_STRIDE (3 + SPEC_MAX_K + 1)

static int pages_for(const kiln_engine *e, int tokens) { return (tokens + e->pt - 1) / e->pt; }

static int is_eos(const kiln_engine *e, int32_t tok) {
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos_ids[i] == tok) return 1;
    return 0;
}
/* ignore_eos: no end-of-generation id can be sampled */
static void mask_eos(const kiln_engine *e, float *lg) {
    for (int i = 0; i < e->n_eos; i++) lg[e->eos_ids[i]] = -INFINITY;
}

static void *sched_main(void *arg);

#define KILN_TRY_FREE(expr, e) do { kiln_status st_ = (expr); if (st_ != KILN_OK) { kiln_engine_free(e); return st_; } } while (0)

/* rank 0 / one process: with the scheduler thread; the other ranks: without (kiln_engine_follow) */
static kiln_status engine_init(kiln_model *m, const kiln_options *o_in, const kiln_engine_config *cfg, int start_thread, kiln_engine **out) {
    *out = NULL;
    kiln_options o;
    if (o_in) o = *o_in; else kiln_options_default(&o);
    if (cfg->max_batch < 1 || cfg->max_batch > 4096) return kiln_fail(KILN_ERR_INVALID_ARG, "--max-batch %d is out of range [1, 4096]", cfg->max_batch);
    if (cfg->max_queue < 0) return kiln_fail(KILN_ERR_INVALID_ARG, "--max-queue %d is negative", cfg->max_queue);
    if (o.kv_page_tokens <= 0) o.kv_page_tokens = 16;
    kiln_model_prepare_compute(m, &o);
    kiln_engine *e = calloc(1, sizeof *e);
    if (!e) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    e->m = m;
    e->cfg = *cfg;
    if (e->cfg.step_tokens < e->cfg.max_batch) e->cfg.step_tokens = e->cfg.max_batch;
    e->n_ctx = kiln_model_context(m, &o);
    e->vocab = m->hp.vocab;
    e->n_eos = m->hp.n_eos;
    memcpy(e->eos_ids, m->hp.eos_ids, sizeof e->eos_ids);
    e->pt = o.kv_page_tokens;
    e->tp = m->tp > 1 ? m->tp : 1;
    e->rank = e->tp > 1 ? kiln_dist_rank() : 0;
    /* KILN_SPEC_TRACE=FILE (tests, docs/SPECULATIVE.md): a line per drafting request and step,
     * "arrival position drafts…", appended by rank 0 */
    const char *trace = getenv("KILN_SPEC_TRACE");
    if (trace && *trace && e->rank == 0 && !(e->spec_trace = fopen(trace, "a")))
        fprintf(stderr, "kiln: KILN_SPEC_TRACE: cannot open %s for appending; no trace\n", trace);
    atomic_init(&e->failed, 0);
    pthread_mutex_init(&e->mu, NULL);
    if (e->tp > 1 && kiln_dist_size() != e->tp) {
        kiln_engine_free(e);
        return kiln_fail(KILN_ERR_INVALID_ARG, "the model is sharded %d ways but %d processes run", m->tp, kiln_dist_size());
    }
    pthread_cond_init(&e->cv, NULL);
    /* layout, dtype, page size and FP8 scales as the session resolves them (engine/kv_setup.h); the
     * default budget differs: every batch slot can hold a full context, capped at 4 GiB (and at
     * least one context) */
    kiln_kv_setup su;
    KILN_TRY_FREE(kiln_kv_setup_for_model(m, &o, e->n_ctx, 1, &su), e);
    kiln_kv_config kc = su.cfg;
    if (o.kv_mem_bytes <= 0) {
        int64_t pages = (int64_t)pages_for(e, e->n_ctx) * e->cfg.max_batch;
        int64_t cost = (int64_t)kiln_kv_page_cost(&kc), cap = ((int64_t)4 << 30) / cost;
        if (pages > cap) pages = cap > pages_for(e, e->n_ctx) ? cap : pages_for(e, e->n_ctx);
        int capped;
        kc.mem_bytes = kiln_kv_default_budget(&kc, pages * cost + (int64_t)kiln_kv_pool_fixed_bytes(&kc), &capped);
    }
    snprintf(e->kv_source, sizeof e->kv_source, "%s", su.source);
    kiln_status st = KILN_OK;
    if (e->tp > 1) {
        /* every rank's pool must have the same pages (rank 0's page ids are everyone's): the
         * fewest any rank's budget gives; and every rank the same engine settings */
        int32_t pages = (int32_t)(kiln_kv_plan_pages(&kc) < INT32_MAX ? kiln_kv_plan_pages(&kc) : INT32_MAX);
        char agree[160];
        snprintf(agree, sizeof agree, "max batch %d, max queue %d, step %d tokens, prefix cache %d, page %d tokens, context %d",
                 e->cfg.max_batch, e->cfg.max_queue, e->cfg.step_tokens, e->cfg.prefix_cache, e->pt, e->n_ctx);
        st = kiln_dist_allreduce_min_i32(&pages, 1);
        if (st == KILN_OK) st = kiln_dist_agree("the engine settings", agree);
        if (st == KILN_OK) kc.mem_bytes = (int64_t)kiln_kv_pool_fixed_bytes(&kc) + (int64_t)pages * (int64_t)kiln_kv_page_cost(&kc);
    }
    /* the backend first: the pool's layer arrays live where its attention reads them (kiln_be_kv_arrays) */
    if (st == KILN_OK) st = kiln_backend_from_options(&o, &e->be);
    if (st == KILN_OK) {
        kiln_model_info mi;
        kiln_model_get_info(m, &mi);
        kiln_be_expect_weights(e->be, mi.weight_bytes); /* a device backend reports its upload's progress */
    }
    if (st == KILN_OK) kiln_be_kv_arrays(e->be, &kc);
    if (st == KILN_OK) st = kiln_kv_plan_pages(&kc) >= 1 ? kiln_kv_pool_create(&kc, &e->pool)
                                                  : kiln_fail(KILN_ERR_KV_EXHAUSTED, "--kv-mem %lld bytes is smaller than one KV page (%zu bytes)",
                                                              (long long)kc.mem_bytes, kiln_kv_page_cost(&kc));
    kiln_kv_setup_free(&su);
    /* KV integrity (kv/integrity.h): seals verified in attention and at prefix reuse; the mode and
     * the fault-injection SPEC come from the options (default heal), as for a session */
    if (st == KILN_OK) {
        kiln_kv_integrity mode = o.kv_integrity == KILN_KV_INTEGRITY_DEFAULT ? KILN_KV_INTEGRITY_HEAL : o.kv_integrity;
        if (mode == KILN_KV_INTEGRITY_OFF && o.kv_inject_faults)
            st = kiln_fail(KILN_ERR_INVALID_ARG, "--inject-kv-faults needs --kv-integrity detect, heal or strict (it is off)");
        else if (mode != KILN_KV_INTEGRITY_OFF)
            st = kiln_kv_integ_attach(e->pool, mode, kiln_kv_integ_model_id(m), o.kv_inject_faults, o.quiet);
    }
    /* the context a request can really have: no more than the pool holds (a request without
     * max_tokens gets that room; /v1/models and /tokenize report it as max_model_len) */
    if (st == KILN_OK && kiln_kv_capacity_tokens(e->pool) < e->n_ctx) e->n_ctx = (int)kiln_kv_capacity_tokens(e->pool);
    if (st == KILN_OK) st = kiln_pcache_init(&e->pc, e->pool);
    if (st == KILN_OK && !o.quiet && e->be->device_name) fprintf(stderr, "kiln: compute: %s\n", e->be->device_name);
    if (st == KILN_OK) st = kiln_forward_ws_init(&e->ws, m, e->be, e->cfg.step_tokens, e->n_ctx);
    if (st == KILN_OK) {
        size_t S = (size_t)e->cfg.step_tokens, B = (size_t)e->cfg.max_batch, P = (size_t)e->pool->n_pages;
        e->logits = malloc(B * (size_t)e->vocab * sizeof *e->logits);
        e->logits_rows = (int)B;
        e->b_tok = malloc(S * sizeof *e->b_tok);
        e->b_seq = malloc(S * sizeof *e->b_seq);
        e->b_pos = malloc(S * sizeof *e->b_pos);
        e->b_out = malloc(S * sizeof *e->b_out);
        e->b_req = malloc(B * sizeof *e->b_req);
        e->b_cnt = malloc(B * sizeof *e->b_cnt);
        e->running = malloc(B * sizeof *e->running);
        e->m_pages = malloc((P + 1) * sizeof *e->m_pages);
        e->m_hashes = malloc((P + 1) * sizeof *e->m_hashes);
        e->bad_pages = malloc((P + 1) * sizeof *e->bad_pages);
        e->emitted = malloc(EMIT_STRIDE * B * sizeof *e->emitted);
        e->bad_codes = malloc((B + 1) * sizeof *e->bad_codes);
        e->bad_map = calloc((P + 31) / 32 + 1, sizeof *e->bad_map);
        if (!e->emitted || !e->bad_codes || !e->bad_map) st = kiln_fail(KILN_ERR_NOMEM, "out of memory for the scheduler's step buffers");
        if (!e->bad_pages || !e->logits || !e->b_tok || !e->b_seq || !e->b_pos || !e->b_out || !e->b_req || !e->b_cnt || !e->running || !e->m_pages || !e->m_hashes)
            st = kiln_fail(KILN_ERR_NOMEM, "out of memory for the scheduler's step buffers");
    }
    if (st == KILN_OK) {
        e->acc.kv_pages_total = e->pool->n_pages;
        e->acc.kv_pages_free = e->pool->n_free;
        e->acc.page_tokens = e->pt;
        e->acc.kv_capacity_tokens = kiln_kv_capacity_tokens(e->pool);
        e->pub = e->acc;
        if (!start_thread) {}
        else if (pthread_create(&e->th, NULL, sched_main, e) != 0) st = kiln_fail(KILN_ERR_INTERNAL, "cannot start the scheduler thread");
        else e->th_started = 1;
    }
    if (st != KILN_OK) { kiln_engine_free(e); return st; }
    *out = e;
    return KILN_OK;
}

kiln_status kiln_engine_create(kiln_model *m, const kiln_options *o_in, const kiln_engine_config *cfg, kiln_engine **out) {
    if (m->tp > 1 && kiln_dist_rank() != 0) return kiln_fail(KILN_ERR_INVALID_ARG, "rank %d of a sharded model follows rank 0's engine (kiln_engine_follow)", kiln_dist_rank());
    return engine_init(m, o_in, cfg, 1, out);
}

int kiln_engine_failed(kiln_engine *e) { return atomic_load(&e->failed); }

int kiln_engine_mtp_ok(const kiln_engine *e) {
    const kiln_arch_model *am = e->m->arch_state;
    return am && am->n_mtp > 0; /* under --tp the MTP layer is sharded like the others: every rank runs it */
}

int kiln_engine_context(const kiln_engine *e) { return e->n_ctx; }
int kiln_engine_ranks(const kiln_engine *e) { return e->tp; }
const kiln_kv_pool *kiln_engine_pool(const kiln_engine *e) { return e->pool; }
const char *kiln_engine_kv_source(const kiln_engine *e) { return e->kv_source; }
int64_t kiln_engine_kv_capacity(const kiln_engine *e) { return kiln_kv_capacity_tokens(e->pool); }

void kiln_engine_stop(kiln_engine *e) {
    if (!e->th_started) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = e->closed = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    e->th_started = 0;
}

void kiln_engine_free(kiln_engine *e) {
    if (!e) return;
    kiln_engine_stop(e);
    if (e->pc.slots) { kiln_pcache_clear(&e->pc); kiln_pcache_free(&e->pc); }
    kiln_kv_pool_free(e->pool);
    kiln_kv_pool_free(e->mtp_pool);
    if (e->spec_trace) fclose(e->spec_trace);
    kiln_forward_ws_free(&e->ws);
    kiln_backend_free(e->be);
    free(e->logits); free(e->hid); free(e->plain_len); free(e->b_tok); free(e->b_seq); free(e->b_pos); free(e->b_out); free(e->b_req); free(e->b_cnt);
    free(e->running); free(e->m_pages); free(e->m_hashes); free(e->bad_pages);
    free(e->msg); free(e->drops); free(e->emitted); free(e->bad_codes); free(e->bad_map);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* ---- submission (any thread) ------------------------------------------------------------------------ */
/* Appends r to the waiting list, counted as active (under mu, or on a follower's only thread). */
static void wait_append(kiln_engine *e, kiln_req *r) {
    r->prev = e->wait_tail;
    r->next = NULL;
    if (e->wait_tail) e->wait_tail->next = r; else e->wait_head = r;
    e->wait_tail = r;
    e->n_waiting++;
    e->n_active++;
}

kiln_submit_result kiln_engine_submit_all(kiln_engine *e, kiln_req *const *rs, int n, char *why, size_t why_len) {
    for (int i = 0; i < n; i++) {
        const kiln_req *r = rs[i];
        int total = r->n_prompt + r->max_tokens;
        if (total > e->n_ctx) {
            snprintf(why, why_len, "this model's context is %d tokens, but %d prompt tokens + max_tokens %d = %d", e->n_ctx, r->n_prompt, r->max_tokens, total);
            return KILN_SUBMIT_TOO_LONG;
        }
        if (pages_for(e, total) > e->pool->n_pages) {
            snprintf(why, why_len, "%d prompt tokens + max_tokens %d = %d tokens do not fit the KV pool (%lld tokens)", r->n_prompt, r->max_tokens,
                     total, (long long)kiln_kv_capacity_tokens(e->pool));
            return KILN_SUBMIT_TOO_LONG;
        }
    }
    /* all n under one lock: a request's choices are admitted together or not at all (one at a time,
     * the first could finish and free its slot before the last was counted) */
    pthread_mutex_lock(&e->mu);
    kiln_submit_result res = KILN_SUBMIT_OK;
    if (e->closed) { res = KILN_SUBMIT_SHUTDOWN; snprintf(why, why_len, "the server is shutting down"); }
    else if (e->n_active + n > e->cfg.max_batch + e->cfg.max_queue) {
        res = KILN_SUBMIT_QUEUE_FULL;
        snprintf(why, why_len, "the server is at capacity: %d requests running or queued%s%d more would exceed max batch %d + max queue %d", e->n_active,
                 n > 1 ? ", and the request's " : " and ", n, e->cfg.max_batch, e->cfg.max_queue);
    }
    else {
        for (int i = 0; i < n; i++) {
            kiln_req *r = rs[i];
            r->arrival = e->next_arrival++;
            r->t_arrival = kiln_now();
            atomic_fetch_add(&r->refs, 1);
            wait_append(e, r);
        }
        e->pub.waiting = e->n_waiting;
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return res;
}

void kiln_engine_cancel(kiln_engine *e, kiln_req *r) {
    atomic_store(&r->cancel, 1);
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void kiln_engine_close(kiln_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->closed = 1;
    pthread_mutex_unlock(&e->mu);
}

void kiln_engine_get_stats(kiln_engine *e, kiln_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->pub;
    s->waiting = e->n_waiting;
    pthread_mutex_unlock(&e->mu);
}

/* ---- scheduler thread -------------------------------------------------------------------------------- */
static void wait_unlink(kiln_engine *e, kiln_req *r) { /* under mu */
    if (r->prev) r->prev->next = r->next; else e->wait_head = r->next;
    if (r->next) r->next->prev = r->prev; else e->wait_tail = r->prev;
    r->prev = r->next = NULL;
    e->n_waiting--;
}

/* Publishes the end of a request and drops the engine's reference. Its pages must be released. */
static void publish_finish(kiln_engine *e, kiln_req *r, kiln_finish f, kiln_status err, const char *msg) {
    kiln_mtp_free(r->mtp); /* the drafter is the scheduler's: freed on its thread */
    r->mtp = NULL;
    pthread_mutex_lock(&r->mu);
    r->finish = f;
    r->err = err;
    if (msg) snprintf(r->err_msg, sizeof r->err_msg, "%s", msg);
    pthread_cond_broadcast(&r->cv);
    if (r->notify) r->notify(r->notify_arg);
    pthread_mutex_unlock(&r->mu);
    e->acc.finished[f]++;
    pthread_mutex_lock(&e->mu);
    e->n_active--;
    pthread_mutex_unlock(&e->mu);
    kiln_req_unref(r);
}

static void running_remove(kiln_engine *e, kiln_req *r) {
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == r) {
            memmove(e->running + i, e->running + i + 1, (size_t)(e->n_running - i - 1) * sizeof *e->running);
            e->n_running--;
            return;
        }
}

static void finish_running(kiln_engine *e, kiln_req *r, kiln_finish f, kiln_status err, const char *msg) {
    kiln_kv_seq_release(e->pool, &r->seq);
    running_remove(e, r);
    publish_finish(e, r, f, err, msg);
}

/* Frees r's pages and puts it back in the queue (in arrival order, so it is admitted again before
 * anything that came after it); its tokens so far are recomputed on re-admission. */
static void preempt(kiln_engine *e, kiln_req *r) {
    kiln_kv_seq_release(e->pool, &r->seq);
    r->n_computed = 0;
    r->n_hashed = 0;
    r->preempted++;
    if (r->mtp) kiln_mtp_truncate(r->mtp, 0); /* recomputed from position 0: its hidden rows come again */
    running_remove(e, r);
    e->acc.preemptions++;
    pthread_mutex_lock(&e->mu);
    kiln_req *after = NULL, *it = e->wait_head;
    while (it && it->arrival < r->arrival) { after = it; it = it->next; }
    r->prev = after;
    r->next = it;
    if (after) after->next = r; else e->wait_head = r;
    if (it) it->prev = r; else e->wait_tail = r;
    e->n_waiting++;
    pthread_mutex_unlock(&e->mu);
}

/* Tensor parallel, rank 0: the other ranks drop r at the start of this step too, in this order
 * (the order pages return to the free list decides later allocations). */
static void note_drop(kiln_engine *e, const kiln_req *r) {
    if (e->tp < 2 || !r->announced) return;
    if (e->n_drops == e->cap_drops) {
        int cap = e->cap_drops ? 2 * e->cap_drops : 64;
        int32_t *p = realloc(e->drops, (size_t)cap * sizeof *p);
        if (!p) { atomic_store(&e->failed, 1); return; } /* cannot keep the ranks in step: fail (tp_check) */
        e->drops = p;
        e->cap_drops = cap;
    }
    e->drops[e->n_drops++] = (int32_t)r->arrival;
}

/* Drops cancelled and timed-out requests, running or waiting, freeing their pages at once. */
static void reap(kiln_engine *e, double now) {
    for (int i = 0; i < e->n_running;) {
        kiln_req *r = e->running[i];
        int timeout = r->deadline > 0 && now > r->deadline, cancel = atomic_load(&r->cancel); /* read once: it may change meanwhile */
        if (cancel || timeout) note_drop(e, r);
        if (cancel) finish_running(e, r, KILN_FINISH_CANCELLED, KILN_OK, NULL);
        else if (timeout) { r->timed_out = 1; finish_running(e, r, KILN_FINISH_ERROR, KILN_ERR_INTERNAL, "request timed out"); }
        else i++;
    }
    kiln_req *gone = NULL;
    pthread_mutex_lock(&e->mu);
    for (kiln_req *r = e->wait_head, *nx; r; r = nx) {
        nx = r->next;
        if (atomic_load(&r->cancel) || (r->deadline > 0 && now > r->deadline)) {
            wait_unlink(e, r);
            r->next = gone;
            gone = r;
        }
    }
    pthread_mutex_unlock(&e->mu);
    for (kiln_req *r = gone, *nx; r; r = nx) {
        nx = r->next;
        r->next = NULL;
        note_drop(e, r);
        kiln_kv_seq_release(e->pool, &r->seq);
        if (atomic_load(&r->cancel)) publish_finish(e, r, KILN_FINISH_CANCELLED, KILN_OK, NULL);
        else { r->timed_out = 1; publish_finish(e, r, KILN_FINISH_ERROR, KILN_ERR_INTERNAL, "request timed out"); }
    }
}

static int free_plus_idle(kiln_engine *e) { return e->pool->n_free + (e->cfg.prefix_cache ? kiln_pcache_idle(&e->pc) : 0); }

/* Whether r drafts with the MTP layer (a drafter at admission): asked for, possible here, and for a
 * request that may draft at all (no grammar, no forced output, no dynamic FP8 scales: spec_allowed). */
static int mtp_wanted(const kiln_engine *e, const kiln_req *r) {
    return r->spec_mtp && r->spec_k > 0 && !r->grammar && r->n_forced == 0 && !e->pool->dscale && kiln_engine_mtp_ok(e);
}

/* Whether r's prompt rows still need their log-probabilities (every position of its prompt chunks
 * then gets a logits row). */
static int wants_plp(const kiln_req *r) { return r->prompt_logprobs >= 0 && !r->plp_done; }
/* ... in this step: one process only (the server refuses them under tensor parallelism, whose other
 * ranks would have to lay out the same rows) */
static int step_plp(const kiln_engine *e, const kiln_req *r) { return e->tp == 1 && wants_plp(r); }

/* Tries to start r: shares its longest cached prefix, then admits it if the pages for its known
 * tokens are there (keeping one page of headroom per running sequence), or if nothing runs. */
static int try_admit(kiln_engine *e, kiln_req *r) {
    int k = 0;
    const int mtp = mtp_wanted(e, r);
    if (e->cfg.prefix_cache && !wants_plp(r)) { /* (prompt logprobs need every prompt position computed) */
        int max_pages = (r->n_toks - 1) / e->pt; /* at least one token is computed: its logits are needed */
        k = kiln_pcache_match(&e->pc, r->toks, max_pages, e->m_pages, e->m_hashes);
        /* An MTP drafter attends over the MTP layer's rows of every earlier position, and a row needs
         * the target's hidden state there, which a cached position never had computed for r: r takes
         * the leading pages whose MTP rows came whole with them (the draft pool's rows at the same
         * pages, engine/mtp.h), each last row computed with r's own next token (that row's pair). */
        if (mtp && k > 0) {
            for (int i = 0; i < k; i++)
                if (!kiln_pcache_draft_rows(&e->pc, e->m_pages[i], r->toks[(size_t)(i + 1) * e->pt])) {
                    k = i;
                    break;
                }
            /* tensor parallel: the records follow each rank's own drafters, which a memory failure
             * on one rank can stop early; all ranks take the pages every rank has whole */
            if (e->tp > 1) {
                int32_t agreed = k;
                if (kiln_dist_allreduce_min_i32(&agreed, 1) != KILN_OK) atomic_store(&e->failed, 1);
                k = agreed;
            }
        }
        /* integrity: the sequence's tokens are its identity; each shared page must verify against it */
        if (k > 0 && e->pool->integ && kiln_kv_integ_note(e->pool, &r->seq, 0, r->toks, k * e->pt, 0) != KILN_OK) k = 0;
        const int matched = k;
        for (int i = 0; i < k; i++)
            if (kiln_kv_seq_share_page(e->pool, &r->seq, e->m_pages[i]) != KILN_OK) {
                if (e->tp < 2) kiln_pcache_forget(&e->pc, e->m_pages[i]); /* failed its seal: never offered again */
                k = i;
                break;
            }
        if (e->tp > 1 && matched > 0 && e->pool->integ) {
            /* tensor parallel: each rank verified its own shard of the pages; all keep the pages
             * every rank verified, and all forget the first one some rank did not */
            int32_t agreed = k;
            if (kiln_dist_allreduce_min_i32(&agreed, 1) != KILN_OK) atomic_store(&e->failed, 1);
            if (agreed < k) kiln_kv_integ_rollback(e->pool, &r->seq, agreed);
            if (agreed < matched) kiln_pcache_forget(&e->pc, e->m_pages[agreed]);
            k = agreed;
        }
    }
    int need = pages_for(e, r->n_toks) - k;
    if (e->n_running > 0 && need + e->n_running > free_plus_idle(e)) {
        kiln_kv_seq_release(e->pool, &r->seq);
        return 0;
    }
    r->n_computed = k * e->pt;
    r->n_hashed = k;
    memcpy(r->hashes, e->m_hashes, (size_t)k * sizeof *r->hashes);
    /* the drafter: the MTP layer's KV at r's pages in the engine's draft pool (made at the first
     * MTP request); without the memory the request decodes without drafts */
    if (mtp && !r->mtp) {
        if (!e->mtp_pool && !e->mtp_pool_failed && kiln_mtp_pool_create(e->be, e->pool, &e->mtp_pool) != KILN_OK) {
            e->mtp_pool = NULL;
            e->mtp_pool_failed = 1; /* no memory for it: MTP requests decode without drafts from now on */
        }
        if (!e->mtp_pool || kiln_mtp_create_paged(e->m, e->be, e->mtp_pool, e->pool, &r->seq, r->n_prompt + r->max_tokens, &r->mtp) != KILN_OK)
            r->spec_k = 0;
    }
    if (r->mtp) kiln_mtp_restart(r->mtp, k * e->pt); /* the MTP rows of the shared pages are whole */
    r->mtp_marked = k;
    if (r->cached_tokens < 0) {
        pthread_mutex_lock(&r->mu);
        r->cached_tokens = k * e->pt;
        pthread_mutex_unlock(&r->mu);
        e->acc.prompt_tokens += (uint64_t)r->n_prompt;
        e->acc.cached_tokens += (uint64_t)(k * e->pt);
    }
    return 1;
}

/* n > 1: a sibling waits (at the head of the queue) until the first choice has computed the shared
 * prompt and offered its full pages to the prefix cache, or has ended. The first choice arrived
 * earlier, so it is running or ahead in the queue: the wait always ends. */
static int sibling_ready(const kiln_engine *e, const kiln_req *r) {
    const kiln_req *f = r->share_from;
    /* (f's cancel flag is not looked at: a cancelled f ends at the next step's reap, and under
     * tensor parallelism every rank must decide alike, from what reap did) */
    /* (an MTP request does not wait: the first choice's MTP rows of the prompt are whole only once
     * its drafter has run over them, which may be much later; it shares what is whole by then) */
    if (!f || !e->cfg.prefix_cache || f->finish != KILN_FINISH_NONE || mtp_wanted(e, r)) return 1;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == f) return f->n_computed >= f->n_prompt;
    return 1; /* not running (cannot happen while it is ahead in the queue): do not wait */
}

static void admit(kiln_engine *e) {
    while (e->n_running < e->cfg.max_batch) {
        pthread_mutex_lock(&e->mu);
        kiln_req *r = e->wait_head;
        pthread_mutex_unlock(&e->mu);
        /* tensor parallel: a request the other ranks do not know of yet waits for the next step */
        if (!r || (e->tp > 1 && !r->announced) || !sibling_ready(e, r) || !try_admit(e, r)) return;
        pthread_mutex_lock(&e->mu);
        wait_unlink(e, r);
        pthread_mutex_unlock(&e->mu);
        /* keep `running` in arrival order (a preempted request re-enters among younger ones) */
        int i = e->n_running;
        while (i > 0 && e->running[i - 1]->arrival > r->arrival) { e->running[i] = e->running[i - 1]; i--; }
        e->running[i] = r;
        e->n_running++;
    }
}

/* Makes room in r's block table for new_len positions, evicting idle cached pages and then
 * preempting the newest running request as needed. Returns 0 if r itself was preempted. */
static int ensure_pages(kiln_engine *e, kiln_req *r, int new_len) {
    int need = pages_for(e, new_len) - r->seq.n_pages;
    while (need > e->pool->n_free) {
        if (e->cfg.prefix_cache && kiln_pcache_evict(&e->pc, need - e->pool->n_free) > 0) continue;
        kiln_req *victim = e->running[e->n_running - 1];
        preempt(e, victim);
        if (victim == r) return 0;
    }
    return need <= 0 || kiln_kv_seq_reserve(e->pool, &r->seq, new_len) == KILN_OK;
}

/* Brings the prefix cache's record of r's pages whose MTP rows are whole up to date with r's
 * drafter: a page it has gone back into (a rollback, a heal) is not whole any more; a listed page
 * it has finished is, with the token after the page that its last row was computed with. Called
 * before the drafter writes and after it or the cache moved. */
static void mtp_pages(kiln_engine *e, kiln_req *r) {
    const kiln_mtp *d = r->mtp;
    if (!d || !d->tseq || !e->cfg.prefix_cache) return;
    const int done = d->seq.len / e->pt;
    for (; r->mtp_marked > done; r->mtp_marked--)
        if (r->mtp_marked - 1 < r->seq.n_pages) kiln_pcache_clear_draft_rows(&e->pc, r->seq.pages[r->mtp_marked - 1]);
    for (; r->mtp_marked < done && r->mtp_marked < r->n_hashed && r->mtp_marked < r->seq.n_pages; r->mtp_marked++)
        kiln_pcache_set_draft_rows(&e->pc, r->hashes[r->mtp_marked], r->mtp_marked ? r->hashes[r->mtp_marked - 1] : 0,
                                   r->toks + (size_t)r->mtp_marked * e->pt, r->seq.pages[r->mtp_marked],
                                   r->toks[(size_t)(r->mtp_marked + 1) * e->pt]);
}

/* Offers r's newly completed full pages to the prefix cache. */
static void register_pages(kiln_engine *e, kiln_req *r) {
    int full = r->n_computed / e->pt;
    while (r->n_hashed < full && r->n_hashed < r->seq.n_pages) {
        int i = r->n_hashed;
        uint64_t parent = i ? r->hashes[i - 1] : 0;
        const int32_t *t = r->toks + (size_t)i * e->pt;
        r->hashes[i] = kiln_pcache_page_hash(parent, t, e->pt);
        if (e->cfg.prefix_cache) kiln_pcache_insert(&e->pc, r->hashes[i], parent, t, r->seq.pages[i]);
        r->n_hashed++;
    }
    mtp_pages(e, r);
}

static void hist_add(uint64_t *b, uint64_t *n, double *sum, double v) {
    for (int i = 0; i < 16; i++)
        if (v <= kiln_latency_bounds[i]) { b[i]++; break; }
    (*n)++;
    *sum += v;
}

/* Copies the frames of st in use (the rest of a state is never read). */
static void jg_copy(kiln_jg_state *dst, const kiln_jg_state *st) {
    memcpy(dst, st, offsetof(kiln_jg_state, f) + (size_t)st->depth * sizeof st->f[0]);
}

/* Structured output: whether token tok may follow r's text (EOS: only once the document is whole);
 * on success *next is the state after it. Tokens with no text never may (they would not advance). */
static int grammar_allows(const kiln_engine *e, const kiln_req *r, int32_t tok, kiln_jg_state *next) {
    if (is_eos(e, tok)) return kiln_jg_done(r->gstate);
    size_t len = 0;
    const char *piece = kiln_token_piece(e->m, r->toks[r->n_toks - 1], tok, &len);
    if (!piece || !len) return 0;
    jg_copy(next, r->gstate);
    return kiln_jg_feed(next, piece, len);
}

/* Per token of the vocabulary, its length when its text is plain string characters (printable
 * ASCII but '"' and '\\'), else 0: computed once per engine, at the first grammar mask inside a
 * string (pieces are taken after a non-BOS token, as they appear mid-output). The scheduler thread
 * is the only caller. */
static const int16_t *plain_lengths(kiln_engine *e) {
    if (e->plain_len) return e->plain_len;
    int16_t *t = calloc((size_t)e->vocab, sizeof *t);
    if (!t) return NULL;
    const int32_t after = e->eos_ids[0]; /* any token but BOS: SentencePiece keeps the leading space */
    for (int v = 0; v < e->vocab; v++) {
        size_t len = 0;
        const char *p = kiln_token_piece(e->m, after, v, &len);
        if (!p || !len || len > 512 || is_eos(e, v)) continue;
        int ok = 1;
        for (size_t i = 0; i < len && ok; i++) ok = p[i] >= 0x20 && p[i] <= 0x7E && p[i] != '"' && p[i] != '\\';
        if (ok) t[v] = (int16_t)len;
    }
    e->plain_len = t;
    return t;
}

/* The sampler's pick under r's grammar: the pick itself when the grammar allows it (the common
 * case, one check), else every token the grammar refuses is masked to -inf and the pick made again
 * from what remains — sampling from the masked distribution exactly (llama.cpp does the same).
 * No token allowed: the first end id (the request then stops). Records the token in the sampler. */
static int32_t pick_token(kiln_engine *e, kiln_req *r, float *lg) {
    int32_t tok = kiln_sample_pick(r->sampler, lg);
    if (r->grammar) {
        kiln_jg_state next_state, *next = &next_state; /* ~650 bytes: no allocation per token */
        if (grammar_allows(e, r, tok, next)) {
            jg_copy(r->gstate, next);
        } else {
            /* most tokens are refused at their first byte (everything but the few bytes that may
             * come next in the document's structure): each first byte is tried once per step and a
             * token whose first byte is refused is masked without feeding the rest of it */
            int any = 0;
            uint8_t first_ok[256] = {0}; /* 0 not tried, 1 allowed, 2 refused */
            const int32_t prev = r->toks[r->n_toks - 1];
            const int room = kiln_jg_plain_room(r->gstate); /* inside a string: plain tokens need no feed */
            const int16_t *plain = room >= 0 ? plain_lengths(e) : NULL;
            for (int v = 0; v < e->vocab; v++) {
                if (lg[v] == -INFINITY) continue;
                if (plain && plain[v] > 0) {
                    if (plain[v] <= room) any = 1;
                    else lg[v] = -INFINITY;
                    continue;
                }
                if (!is_eos(e, v)) {
                    size_t len = 0;
                    const char *piece = kiln_token_piece(e->m, prev, v, &len);
                    if (!piece || !len) { lg[v] = -INFINITY; continue; }
                    const unsigned char b = (unsigned char)piece[0];
                    if (!first_ok[b]) {
                        jg_copy(next, r->gstate);
                        first_ok[b] = kiln_jg_feed(next, piece, 1) ? 1 : 2;
                    }
                    if (first_ok[b] == 2) { lg[v] = -INFINITY; continue; }
                }
                if (grammar_allows(e, r, v, next)) any = 1;
                else lg[v] = -INFINITY;
            }
            tok = any ? kiln_sample_pick(r->sampler, lg) : e->eos_ids[0];
            if (any && grammar_allows(e, r, tok, next)) jg_copy(r->gstate, next);
        }
    }
    kiln_sampler_accept(r->sampler, tok);
    return tok;
}

/* log Σ exp(lg[0..V)) (the log-softmax's normalizer) and, for K > 0, the K most likely ids (ties
 * to the lower id) with their log-probabilities into tids / tlp [K]. */
static float log_softmax_top(const float *lg, int V, int K, int32_t *tids, float *tlp) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) if (lg[i] > mx) mx = lg[i];
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)lg[i] - mx);
    const float lse = mx + (float)log(s);
    int nt = 0;
    for (int i = 0; i < V && K > 0; i++) { /* insertion into the K best */
        if (nt == K && lg[i] <= lg[tids[nt - 1]]) continue;
        int j = nt < K ? nt++ : K - 1;
        while (j > 0 && lg[tids[j - 1]] < lg[i]) { tids[j] = tids[j - 1]; j--; }
        tids[j] = i;
    }
    for (int i = 0; i < nt; i++) tlp[i] = lg[tids[i]] - lse;
    return lse;
}

/* Records the prompt log-probabilities of positions pos..pos+c-1 of r from their logits rows
 * lg [c, V] (raw: before any sampler processing); position p scores toks[p + 1]. */
static void record_plp(kiln_engine *e, kiln_req *r, int pos, int c, const float *lg) {
    const int V = e->vocab, K = r->prompt_logprobs;
    for (int j = 0; j < c; j++) {
        const int p = pos + j;
        if (p + 1 >= r->n_prompt) break;
        const float *row = lg + (size_t)j * V;
        const float lse = log_softmax_top(row, V, K, K > 0 ? r->ptop_ids + (size_t)(p + 1) * K : NULL, K > 0 ? r->ptop_lp + (size_t)(p + 1) * K : NULL);
        const float t = row[r->toks[p + 1]];
        r->plp[p + 1] = t - lse;
        int above = 0; /* vLLM's rank: 1 + the tokens more likely than it */
        for (int i = 0; i < V; i++) above += row[i] > t;
        r->prank[p + 1] = above + 1;
    }
}

/* Samples r's next token from its logits row and publishes it; returns the finish reason.
 * draft >= 0: speculative decoding — the token is the verification of that drafted token
 * (kiln_sample_verify_applied: the draft kept or replaced by the rejection rule), *accepted says
 * which. */
static kiln_finish emit_token(kiln_engine *e, kiln_req *r, float *lg, double now, int32_t draft, int *accepted) {
    int V = e->vocab, K = r->top_logprobs;
    float lp = 0;
    int32_t tids[KILN_MAX_TOP_LOGPROBS];
    float tlp[KILN_MAX_TOP_LOGPROBS];
    /* logit bias and penalties first (in place, only the tokens they touch): logprobs describe
     * the distribution actually sampled from, before temperature / top-k / top-p */
    kiln_sampler_apply(r->sampler, lg);
    if (K >= 0) {
        const float lse = log_softmax_top(lg, V, K, tids, tlp);
        if (r->ignore_eos) mask_eos(e, lg);
        int32_t tok = draft >= 0 ? kiln_sample_verify_applied(r->sampler, lg, draft, accepted) : pick_token(e, r, lg);
        lp = (is_eos(e, tok) && r->ignore_eos) ? -INFINITY : lg[tok] - lse;
        r->toks[r->n_toks] = tok;
    } else {
        if (r->ignore_eos) mask_eos(e, lg);
        r->toks[r->n_toks] = draft >= 0 ? kiln_sample_verify_applied(r->sampler, lg, draft, accepted) : pick_token(e, r, lg);
    }
    if (r->n_ev < r->n_forced) { /* the test hook: this position's token is given */
        r->toks[r->n_toks] = r->forced[r->n_ev];
        if (K >= 0) lp = lg[r->toks[r->n_toks]] - log_softmax_top(lg, V, 0, NULL, NULL);
    }
    int32_t tok = r->toks[r->n_toks++];
    pthread_mutex_lock(&r->mu);
    int k = r->n_ev;
    r->ev[k].id = tok;
    r->ev[k].logprob = lp;
    r->ev[k].t = now;
    r->plp_done = 1; /* (its rows were recorded before this first event: whole from now on) */
    if (K > 0) {
        memcpy(r->top_ids + (size_t)k * K, tids, (size_t)K * sizeof *tids);
        memcpy(r->top_lp + (size_t)k * K, tlp, (size_t)K * sizeof *tlp);
    }
    r->n_ev++;
    if (k == 0) r->t_first = now;
    pthread_cond_broadcast(&r->cv);
    if (r->notify) r->notify(r->notify_arg);
    pthread_mutex_unlock(&r->mu);
    e->acc.generated_tokens++;
    if (k == 0) hist_add(e->acc.ttft_b, &e->acc.ttft_n, &e->acc.ttft_sum, now - r->t_arrival);
    else hist_add(e->acc.itl_b, &e->acc.itl_n, &e->acc.itl_sum, now - r->ev[k - 1].t);
    if (is_eos(e, tok) && !r->ignore_eos) return KILN_FINISH_STOP;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) return KILN_FINISH_STOP;
    if (k + 1 >= r->max_tokens || r->n_toks >= e->n_ctx) return KILN_FINISH_LENGTH;
    return KILN_FINISH_NONE;
}

static void publish_stats(kiln_engine *e, int seqs, int toks) {
    kiln_engine_stats *a = &e->acc;
    a->running = e->n_running;
    a->batch_seqs = seqs;
    a->batch_tokens = toks;
    a->kv_pages_free = e->pool->n_free;
    a->kv_pages_cached_idle = e->cfg.prefix_cache ? kiln_pcache_idle(&e->pc) : 0;
    a->kv_pages_used = e->pool->n_pages - e->pool->n_free - a->kv_pages_cached_idle;
    a->evictions = e->pc.evictions;
    a->pc_queried_pages = e->pc.queried_pages;
    a->pc_hit_pages = e->pc.hits_pages;
    kiln_kv_integ_stats(e->pool, &a->integ);
    a->tp_ranks = e->tp;
    a->ep_ranks = e->ws.moe.ep_size > 1 ? e->ws.moe.ep_size : 0;
    for (int r = 0; r < a->ep_ranks && r < KILN_MAX_EP_METRICS; r++) a->ep_load[r] = (uint64_t)e->ws.moe.ep_load[r];
    pthread_mutex_lock(&e->mu);
    e->pub = *a;
    e->pub.waiting = e->n_waiting;
    pthread_mutex_unlock(&e->mu);
}

#define HEAL_ATTEMPTS 8

/* After a forward step, for a request of the step: whether attention found one of its pages bad.
 * detect → counted, go on; heal → every position from the first bad page on (back to a logged chunk
 * start) is dropped and recomputed in the next steps, no token this step; strict (or a heal that
 * keeps failing) → the request fails with KILN_ERR_INTEGRITY. Returns 1 when r gets no token now. */
static int integ_after_step(kiln_engine *e, kiln_req *r) {
    kiln_kv_pool *p = e->pool;
    int bad = kiln_kv_integ_bad_slot(&r->seq);
    if (bad < 0) {
        r->heals = 0; /* a clean step: the next failure is a new one */
        return 0;
    }
    kiln_kv_integrity_stats ist;
    kiln_kv_integ_stats(p, &ist);
    kiln_kv_integrity mode = ist.mode;
    if (mode == KILN_KV_INTEGRITY_DETECT) {
        kiln_kv_integ_clear_bad(&r->seq);
        return 0;
    }
    char why[256], msg[400];
    kiln_kv_integ_describe_bad(p, &r->seq, why, sizeof why);
    if (mode == KILN_KV_INTEGRITY_STRICT || r->heals >= HEAL_ATTEMPTS) {
        kiln_kv_integ_count_strict(p);
        snprintf(msg, sizeof msg, "KV integrity (%s): %s", mode == KILN_KV_INTEGRITY_STRICT ? "strict" : "heal gave up after repeated failures", why);
        finish_running(e, r, KILN_FINISH_ERROR, KILN_ERR_INTEGRITY, msg);
        return 1;
    }
    int from = kiln_kv_integ_replay_from(&r->seq, e->pt, bad);
    if (from > r->n_computed) from = r->n_computed / e->pt * e->pt;
    kiln_kv_integ_rollback(p, &r->seq, from / e->pt);
    kiln_kv_integ_count_heal(p, r->n_computed - from);
    r->n_computed = from;
    if (r->n_hashed > from / e->pt) r->n_hashed = from / e->pt;
    if (r->mtp) kiln_mtp_truncate(r->mtp, from); /* its rows from `from` on are recomputed with the target's */
    mtp_pages(e, r);
    r->heals++;
    return 1;
}

/* ---- tensor parallelism: keeping the ranks' schedulers in step (scheduler.h) ---------------------- */
static int msg_reserve(kiln_engine *e, int more) {
    if (e->msg_n + more <= e->msg_cap) return 1;
    int cap = e->msg_cap ? e->msg_cap : 256;
    while (cap < e->msg_n + more) cap *= 2;
    int32_t *p = realloc(e->msg, (size_t)cap * sizeof *p);
    if (!p) return 0;
    e->msg = p;
    e->msg_cap = cap;
    return 1;
}

/* Rank 0: every request that failed or ended because a rank was lost gets the error; nothing new
 * is accepted (kiln_engine_failed: the server exits non-zero). No MPI call is made again. */
static void drain_all(kiln_engine *e, kiln_status err, const char *msg);
static void tp_lost(kiln_engine *e) {
    atomic_store(&e->failed, 1);
    if (e->rank != 0) return;
    char msg[320];
    snprintf(msg, sizeof msg, "tensor parallel: %s", kiln_dist_failed() ? kiln_dist_failure() : "the ranks could not be kept in step (out of memory)");
    pthread_mutex_lock(&e->mu);
    e->closed = 1;
    pthread_mutex_unlock(&e->mu);
    drain_all(e, KILN_ERR_IO, msg);
}

/* Whether r speculates at all: a prompt-lookup k, no grammar (drafts would skip its mask), not the
 * forced-output test hook. Decided from what rank 0 announces, so every rank decides alike. */
static int spec_allowed(const kiln_req *r) { return r->spec_k > 0 && !r->grammar && r->n_forced == 0 && (!r->spec_mtp || r->mtp); }
/* What rank 0 announces as a request's k: the part of spec_allowed known before admission (the
 * other ranks see no grammar nor forced output; an MTP drafter is made at admission on every rank). */
static int spec_announced_k(const kiln_req *r) { return r->spec_k > 0 && !r->grammar && r->n_forced == 0 ? r->spec_k : 0; }

/* Rank 0: the step message — what reap dropped, then the requests that arrived since the last one
 * (in arrival order; one that does not fit in memory waits, with everything after it). */
static kiln_status tp_send(kiln_engine *e, int kind) {
    e->msg_n = 0;
    if (!msg_reserve(e, 3 + e->n_drops)) return kiln_fail(KILN_ERR_NOMEM, "out of memory for a step message");
    e->msg[0] = kind;
    e->msg[1] = e->n_drops;
    e->msg[2] = 0;
    memcpy(e->msg + 3, e->drops, (size_t)e->n_drops * sizeof *e->drops);
    e->msg_n = 3 + e->n_drops;
    e->n_drops = 0;
    if (kind == TP_MSG_STEP) {
        pthread_mutex_lock(&e->mu);
        for (kiln_req *r = e->wait_head; r; r = r->next) {
            if (r->announced) continue;
            if (!msg_reserve(e, 6 + r->n_toks)) break;
            int32_t *w = e->msg + e->msg_n;
            w[0] = (int32_t)r->arrival;
            w[1] = r->n_toks;
            w[2] = r->max_tokens;
            w[3] = r->share_from && r->share_from->announced ? (int32_t)r->share_from->arrival : -1;
            w[4] = spec_announced_k(r); /* the others draft exactly when rank 0 does */
            w[5] = r->spec_ngram | (r->spec_mtp ? 1 << 8 : 0);
            memcpy(w + 6, r->toks, (size_t)r->n_toks * sizeof *r->toks);
            e->msg_n += 6 + r->n_toks;
            e->msg[2]++;
            r->announced = 1;
        }
        pthread_mutex_unlock(&e->mu);
    }
    return kiln_dist_bcast_msg(&e->msg, &e->msg_n, &e->msg_cap, 0);
}

static kiln_req *tp_find(kiln_engine *e, int32_t arrival) {
    for (int i = 0; i < e->n_running; i++)
        if ((int32_t)e->running[i]->arrival == arrival) return e->running[i];
    for (kiln_req *r = e->wait_head; r; r = r->next)
        if ((int32_t)r->arrival == arrival) return r;
    return NULL;
}

/* The other ranks: rank 0's drops and arrivals, applied in its order. */
static kiln_status tp_apply(kiln_engine *e) {
    const int32_t *w = e->msg;
    const int n = e->msg_n;
    if (n < 3 || w[1] < 0 || w[2] < 0 || w[1] > n - 3) return kiln_fail(KILN_ERR_INTERNAL, "a malformed step message from rank 0 (%d words)", n);
    int at = 3;
    for (int i = 0; i < w[1]; i++) {
        kiln_req *r = tp_find(e, w[at++]);
        if (!r) continue;
        int running = 0;
        for (int j = 0; j < e->n_running; j++) running |= e->running[j] == r;
        if (running) { finish_running(e, r, KILN_FINISH_CANCELLED, KILN_OK, NULL); continue; }
        wait_unlink(e, r);
        kiln_kv_seq_release(e->pool, &r->seq);
        publish_finish(e, r, KILN_FINISH_CANCELLED, KILN_OK, NULL);
    }
    kiln_sampling sp;
    kiln_sampling_default(&sp);
    for (int i = 0; i < w[2]; i++) {
        if (at + 6 > n || w[at + 1] < 1 || w[at + 2] < 1 || w[at + 1] > n - at - 6 || w[at + 4] < 0 || w[at + 4] > SPEC_MAX_K)
            return kiln_fail(KILN_ERR_INTERNAL, "a malformed request in a step message from rank 0 (word %d of %d)", at, n);
        kiln_req *r;
        kiln_status st = kiln_req_create(w + at + 6, w[at + 1], w[at + 2], &sp, e->vocab, -1, &r);
        if (st != KILN_OK) return st;
        r->arrival = (uint32_t)w[at];
        r->announced = 1;
        r->spec_k = w[at + 4];
        r->spec_ngram = w[at + 5] & 0xFF;
        r->spec_mtp = (w[at + 5] >> 8) & 1;
        if (w[at + 3] >= 0 && (r->share_from = tp_find(e, w[at + 3])) != NULL) atomic_fetch_add(&r->share_from->refs, 1);
        at += 6 + w[at + 1];
        wait_append(e, r);
    }
    return KILN_OK;
}

/* After the forward pass: each rank checked its own shard of the KV; every rank takes, per batch
 * entry, the first bad slot any rank found (so a heal on one rank replays on all), and the union
 * of the pages found bad (so every rank's prefix cache forgets the same pages). */
static kiln_status tp_combine_integrity(kiln_engine *e, int nb, int *nbad) {
    for (int b = 0; b < nb; b++) {
        const kiln_kv_seq *q = &e->b_req[b]->seq;
        int slot = kiln_kv_integ_bad_slot(q);
        e->bad_codes[b] = slot >= 0 && q->integ ? slot * 8 + q->integ->bad_kind : INT32_MAX;
    }
    e->bad_codes[nb] = -*nbad;
    kiln_status st = kiln_dist_allreduce_min_i32(e->bad_codes, nb + 1);
    if (st != KILN_OK) return st;
    for (int b = 0; b < nb; b++) {
        kiln_kv_seq_integ *si = e->b_req[b]->seq.integ;
        if (!si) continue;
        si->bad_slot = e->bad_codes[b] == INT32_MAX ? -1 : e->bad_codes[b] / 8;
        if (si->bad_slot >= 0) si->bad_kind = e->bad_codes[b] % 8;
    }
    if (e->bad_codes[nb] == 0) return KILN_OK;
    const int P = e->pool->n_pages, words = (P + 31) / 32;
    memset(e->bad_map, 0, (size_t)words * sizeof *e->bad_map);
    for (int i = 0; i < *nbad; i++) e->bad_map[e->bad_pages[i] / 32] |= 1u << (e->bad_pages[i] % 32);
    if ((st = kiln_dist_allreduce_or_u32(e->bad_map, words)) != KILN_OK) return st;
    *nbad = 0;
    for (int pg = 0; pg < P; pg++)
        if (e->bad_map[pg / 32] >> (pg % 32) & 1) e->bad_pages[(*nbad)++] = pg;
    return KILN_OK;
}

static void step_run(kiln_engine *e);

/* Makes room for `rows` logits rows (a speculating request needs one per draft, a request
 * scoring its prompt one per prompt position); 0 when that memory is not to be had (the request
 * then decodes without drafts / its prompt chunk waits for a later step). */
static int logits_rows_fit(kiln_engine *e, int rows) {
    if (rows <= e->logits_rows) return 1;
    float *p = realloc(e->logits, (size_t)rows * (size_t)e->vocab * sizeof *p);
    if (!p) return 0;
    e->logits = p;
    e->logits_rows = rows;
    return 1;
}

/* After a step's forward: each MTP drafter of the batch takes its request's hidden rows (the step's
 * token and drafts included: rows of rejected drafts are dropped when the drafter next sees where
 * its target stands, kiln_mtp_hidden_rows). Without them (no memory) it drafts no more. */
static void mtp_take_hidden(kiln_engine *e, int nb) {
    const size_t dim = (size_t)e->m->hp.dim;
    for (int b = 0, t = 0; b < nb; t += e->b_cnt[b++]) {
        kiln_mtp *d = e->b_req[b]->mtp;
        if (!d || d->broken) continue;
        float *dst = e->ws.hidden_out ? kiln_mtp_hidden_rows(d, e->b_tok + t, e->b_pos[t], e->b_cnt[b]) : NULL;
        if (dst) memcpy(dst, e->hid + (size_t)t * dim, (size_t)e->b_cnt[b] * dim * sizeof *dst);
        else d->broken = 1;
    }
}

/* Tensor parallel: every rank drafted with its MTP drafters (the layer's forward is sharded, so they
 * all ran it together); rank 0's drafts replace the others' (kiln run --tp does the same), so every
 * rank verifies the same tokens even where a near-tie rounded differently. The counts agree by
 * construction (the same decisions from the same state); a difference means the ranks diverged. */
static kiln_status tp_share_mtp_drafts(kiln_engine *e, int nb) {
    int any = 0;
    for (int b = 0; b < nb; b++) any |= e->b_req[b]->mtp && e->b_req[b]->spec_d > 0;
    if (!any) return KILN_OK;
    int words = 0;
    for (int b = 0; b < nb; b++)
        if (e->b_req[b]->mtp && e->b_req[b]->spec_d > 0) words += 1 + e->b_req[b]->spec_d;
    e->msg_n = 0; /* the step message was applied: the buffer is free */
    if (!msg_reserve(e, words)) return kiln_fail(KILN_ERR_NOMEM, "out of memory for the MTP drafts message");
    if (e->rank == 0) {
        int at = 0;
        for (int b = 0; b < nb; b++) {
            const kiln_req *r = e->b_req[b];
            if (!r->mtp || r->spec_d <= 0) continue;
            e->msg[at++] = r->spec_d;
            memcpy(e->msg + at, r->toks + r->n_toks, (size_t)r->spec_d * sizeof *e->msg);
            at += r->spec_d;
        }
        e->msg_n = at;
    }
    KILN_TRY(kiln_dist_bcast_msg(&e->msg, &e->msg_n, &e->msg_cap, e->rank == 0 ? 0 : e->tp_timeout));
    if (e->msg_n != words) return kiln_fail(KILN_ERR_INTERNAL, "MTP drafts: rank 0 sent %d words, this rank expected %d", e->msg_n, words);
    int at = 0;
    for (int b = 0, t = 0; b < nb; t += e->b_cnt[b++]) {
        kiln_req *r = e->b_req[b];
        if (!r->mtp || r->spec_d <= 0) continue;
        if (e->msg[at] != r->spec_d) return kiln_fail(KILN_ERR_INTERNAL, "MTP drafts: rank 0 drafted %d tokens, this rank %d", e->msg[at], r->spec_d);
        for (int j = 0; j < r->spec_d; j++) {
            const int32_t tok = e->msg[at + 1 + j];
            if (tok < 0 || tok >= e->vocab) return kiln_fail(KILN_ERR_INTERNAL, "MTP drafts: token %d from rank 0 is out of range", tok);
            r->toks[r->n_toks + j] = tok;
            e->b_tok[t + 1 + j] = tok;
        }
        at += 1 + r->spec_d;
    }
    return KILN_OK;
}

/* One scheduler step (rank 0 or one process). */
static void step(kiln_engine *e) {
    reap(e, kiln_now());
    if (e->tp > 1 && (atomic_load(&e->failed) || tp_send(e, TP_MSG_STEP) != KILN_OK)) { tp_lost(e); return; }
    step_run(e);
}

/* The step after reap: every rank runs it alike. */
static void step_run(kiln_engine *e) {
    double now;
    admit(e);
    const int S = e->cfg.step_tokens;
    int n = 0, nb = 0;
    /* speculative decoding (docs/SPECULATIVE.md): while few requests run, a decoding request with
     * spec_k > 0 adds up to spec_k prompt-lookup drafts after its token, all verified by this one
     * forward pass; the drafts share what the step budget leaves after every decode's one token */
    int n_dec = 0;
    for (int i = 0; i < e->n_running; i++) n_dec += e->running[i]->n_toks - e->running[i]->n_computed == 1;
    /* (under --tp every rank drafts alike: the drafts come from the request's tokens alone) */
    const int spec_on = !e->pool->dscale && e->n_running <= (e->cfg.spec_max_batch > 0 ? e->cfg.spec_max_batch : 2);
    int spec_budget = S - n_dec;
    /* decodes first: every sequence that has prefilled gets its one token this step */
    for (int i = 0; i < e->n_running; i++) {
        kiln_req *r = e->running[i];
        if (r->n_toks - r->n_computed != 1) continue;
        int d = 0;
        if (spec_on && spec_allowed(r) && spec_budget > 0) {
            /* at most what may still be generated after this step's token, and within the context */
            int cap = r->max_tokens - (r->n_toks - r->n_prompt) - 1, ctx_room = e->n_ctx - 1 - r->n_computed;
            if (cap > ctx_room) cap = ctx_room;
            if (cap > r->spec_k) cap = r->spec_k;
            if (cap > SPEC_MAX_K) cap = SPEC_MAX_K;
            if (cap > spec_budget) cap = spec_budget;
            if (cap > 0 && logits_rows_fit(e, e->n_running + (S - n_dec - spec_budget) + cap)) {
                if (!r->mtp)
                    d = kiln_ngram_draft(r->toks, r->n_toks, 1, r->spec_ngram > 0 ? r->spec_ngram : 3, cap, r->toks + r->n_toks);
                else {
                    mtp_pages(e, r);
                    if (kiln_mtp_draft(r->mtp, r->n_computed, r->toks[r->n_computed], cap, r->toks + r->n_toks, &d, NULL) != KILN_OK) {
                        d = r->spec_k = 0; /* the drafter failed (memory): this request goes on without drafts, and without it */
                        kiln_mtp_free(r->mtp);
                        r->mtp = NULL;
                    }
                    mtp_pages(e, r);
                }
            }
        }
        if (!ensure_pages(e, r, r->n_computed + 1 + d)) continue; /* r was the newest and got preempted */
        if (e->spec_trace && d > 0) {
            fprintf(e->spec_trace, "%llu %d", (unsigned long long)r->arrival, r->n_computed);
            for (int j = 0; j < d; j++) fprintf(e->spec_trace, " %d", r->toks[r->n_toks + j]);
            fputc('\n', e->spec_trace);
            fflush(e->spec_trace);
        }
        r->spec_d = d;
        spec_budget -= d;
        e->b_req[nb] = r;
        e->b_cnt[nb++] = 1 + d;
        for (int j = 0; j <= d; j++, n++) { /* the token, then the drafts (held in toks past n_toks) */
            e->b_tok[n] = r->toks[r->n_computed + j];
            e->b_seq[n] = &r->seq;
            e->b_pos[n] = r->n_computed + j;
        }
    }
    int n_decode = n;
    if (e->tp > 1 && tp_share_mtp_drafts(e, nb) != KILN_OK) { tp_lost(e); return; }
    /* then prompt chunks, oldest first, within the step budget and the pages there are; a request
     * scoring its prompt needs a logits row per position (at most ~64 MiB of them a step) */
    const int draft_rows = S - n_dec - spec_budget;
    int plp_rows = 0;
    for (int i = 0; i < e->n_running && n < S; i++) {
        kiln_req *r = e->running[i];
        int rem = r->n_toks - r->n_computed;
        if (rem <= 1) continue;
        int c = rem < S - n ? rem : S - n;
        int room = (r->seq.n_pages + free_plus_idle(e)) * e->pt - r->n_computed;
        if (c > room) c = room;
        if (c > 0 && step_plp(e, r)) {
            const int cap = (int)((64u << 20) / ((size_t)e->vocab * sizeof *e->logits));
            if (c > (cap > 16 ? cap : 16)) c = cap > 16 ? cap : 16;
            if (!logits_rows_fit(e, e->n_running + draft_rows + plp_rows + c)) continue;
            plp_rows += c;
        }
        if (c <= 0) continue;
        int need = pages_for(e, r->n_computed + c) - r->seq.n_pages;
        if (need > e->pool->n_free && e->cfg.prefix_cache) kiln_pcache_evict(&e->pc, need - e->pool->n_free);
        if (kiln_kv_seq_reserve(e->pool, &r->seq, r->n_computed + c) != KILN_OK) continue;
        e->b_req[nb] = r;
        e->b_cnt[nb++] = c;
        for (int j = 0; j < c; j++, n++) {
            e->b_tok[n] = r->toks[r->n_computed + j];
            e->b_seq[n] = &r->seq;
            e->b_pos[n] = r->n_computed + j;
        }
    }
    if (n == 0) {
        /* nothing could run: prompts hold pages while waiting for more. Free the newest. */
        if (e->n_running > 1) preempt(e, e->running[e->n_running - 1]);
        else if (e->n_running == 1)
            finish_running(e, e->running[0], KILN_FINISH_ERROR, KILN_ERR_KV_EXHAUSTED, "the KV pool cannot hold this request");
        publish_stats(e, 0, 0);
        return;
    }
    /* logits rows: one per request whose tokens reach the end of what it knows */
    int rows = 0;
    for (int b = 0, t = 0; b < nb; b++) {
        kiln_req *r = e->b_req[b];
        if (r->spec_d > 0) { /* a speculating request: every position's logits verify the next draft */
            for (int j = 0; j < e->b_cnt[b]; j++, t++, rows++) e->b_out[t] = e->rank == 0 || e->m->vocab_split ? rows : -1;
            continue;
        }
        int reach = r->n_computed + e->b_cnt[b] == r->n_toks;
        if (step_plp(e, r)) { /* every position's logits: each scores the next prompt token */
            for (int j = 0; j < e->b_cnt[b]; j++, t++) e->b_out[t] = rows++;
            continue;
        }
        /* (the other ranks of a tensor-parallel model sample nothing: no logits; with a
         * vocabulary-parallel head they compute their columns of the same rows for rank 0) */
        for (int j = 0; j < e->b_cnt[b]; j++, t++) e->b_out[t] = (reach && j == e->b_cnt[b] - 1 && (e->rank == 0 || e->m->vocab_split)) ? rows : -1;
        if (reach) rows++;
    }
    /* integrity: each sequence's tokens of this step, logged as one chunk (its identity and replay log) */
    if (e->pool->integ)
        for (int b = 0; b < nb; b++) {
            kiln_req *r = e->b_req[b];
            if (kiln_kv_integ_note(e->pool, &r->seq, r->n_computed, r->toks + r->n_computed, e->b_cnt[b], 1) != KILN_OK) {
                char msg[256];
                snprintf(msg, sizeof msg, "kv integrity: %s", kiln_last_error());
                for (int j = 0; j < nb; j++) finish_running(e, e->b_req[j], KILN_FINISH_ERROR, KILN_ERR_NOMEM, msg);
                publish_stats(e, 0, 0);
                return;
            }
        }
    /* MTP drafters read the last-layer hidden row of every position their request computes */
    int want_hid = 0;
    for (int b = 0; b < nb; b++) want_hid |= e->b_req[b]->mtp && !e->b_req[b]->mtp->broken;
    if (want_hid && n > e->hid_rows) {
        float *h = realloc(e->hid, (size_t)n * (size_t)e->m->hp.dim * sizeof *h);
        if (h) { e->hid = h; e->hid_rows = n; }
    }
    e->ws.hidden_out = want_hid && n <= e->hid_rows ? e->hid : NULL;
    kiln_batch batch = {n, e->b_tok, e->b_seq, e->b_pos, e->b_out};
    /* a step of decodes only (requests' tokens and their drafts, no prompt chunk): the few-token
     * kernels take the 1-token step's form (kiln_kctx.decode_steps), so a request's logits do not
     * depend on what else is in the batch (FP8: the BF16-dot form; prompt chunks keep the exact one) */
    e->be->cx.decode_steps = n == n_decode;
    kiln_status st = kiln_forward_batch(e->m, e->pool, &e->ws, &batch, e->logits);
    e->be->cx.decode_steps = 0;
    if (st == KILN_OK && want_hid) mtp_take_hidden(e, nb);
    e->ws.hidden_out = NULL;
    e->acc.steps++;
    e->acc.prefill_tokens += (uint64_t)(n - n_decode);
    for (int b = 0; b < 8; b++)
        if (nb < (2 << b) || b == 7) { e->acc.batch_hist[b]++; break; }
    e->acc.batch_seq_sum += (uint64_t)nb;
    if (st != KILN_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "forward step failed: %s", kiln_last_error());
        for (int b = 0; b < nb; b++) finish_running(e, e->b_req[b], KILN_FINISH_ERROR, st, msg);
        publish_stats(e, nb, n);
        return;
    }
    int nbad = e->pool->integ ? kiln_kv_integ_take_bad_pages(e->pool, e->bad_pages, e->pool->n_pages) : 0;
    if (e->tp > 1) {
        /* every rank must now decide alike: the integrity verdicts combined, then rank 0's tokens */
        if (e->pool->integ && tp_combine_integrity(e, nb, &nbad) != KILN_OK) { tp_lost(e); return; }
        if (kiln_dist_failed() || atomic_load(&e->failed)) { tp_lost(e); return; }
        memset(e->emitted, 0, (size_t)nb * EMIT_STRIDE * sizeof *e->emitted);
        if (e->rank > 0) {
            if (kiln_dist_bcast_msg(&e->msg, &e->msg_n, &e->msg_cap, e->tp_timeout) != KILN_OK || e->msg_n != EMIT_STRIDE * nb) { tp_lost(e); return; }
            memcpy(e->emitted, e->msg, (size_t)(EMIT_STRIDE * nb) * sizeof *e->emitted);
        }
    }
    now = kiln_now();
    int row = 0;
    for (int b = 0; b < nb; b++) {
        kiln_req *r = e->b_req[b];
        if (r->spec_d > 0) {
            const int d = r->spec_d, first = row;
            row += 1 + d;
            r->spec_d = 0;
            /* only the step's own token is known good until the drafts are verified; a heal
             * replays from before it */
            r->n_computed += 1;
            if (e->pool->integ && integ_after_step(e, r)) continue;
            kiln_finish f = KILN_FINISH_NONE;
            int kept = 0;
            int32_t *em = e->emitted + (size_t)b * EMIT_STRIDE;
            if (e->rank > 0) { /* tensor parallel: rank 0 verified; take its tokens */
                if (em[0] < 1 || em[0] > 1 + d || em[1] < 0 || em[1] > d || r->n_toks + em[0] > r->n_prompt + r->max_tokens) { tp_lost(e); return; }
                for (int j = 0; j < em[0]; j++) {
                    if (em[3 + j] < 0 || em[3 + j] >= e->vocab) { tp_lost(e); return; }
                    r->toks[r->n_toks++] = em[3 + j];
                }
                kept = em[1];
                f = (kiln_finish)em[2];
            } else {
                const int before = r->n_toks;
                for (int j = 0; j <= d && f == KILN_FINISH_NONE; j++) {
                    int acc = 0;
                    const int32_t draft = j < d ? r->toks[r->n_toks] : -1; /* read before the emit overwrites the slot */
                    f = emit_token(e, r, e->logits + (size_t)(first + j) * e->vocab, now, draft, &acc);
                    if (j == d || !acc) break;
                    kept++;
                }
                em[0] = r->n_toks - before;
                em[1] = kept;
                em[2] = (int32_t)f;
                memcpy(em + 3, r->toks + before, (size_t)em[0] * sizeof *em);
            }
            r->n_computed += kept; /* the accepted drafts' KV stays; the rest is overwritten later */
            r->seq.len = r->n_computed;
            e->acc.spec_steps++;
            e->acc.spec_drafted += (uint64_t)d;
            e->acc.spec_accepted += (uint64_t)kept;
            register_pages(e, r);
            if (f != KILN_FINISH_NONE) finish_running(e, r, f, KILN_OK, NULL);
            continue;
        }
        const int reach = r->n_computed + e->b_cnt[b] == r->n_toks, pos0 = r->n_computed, plp = step_plp(e, r), first = row;
        int my_row;
        if (plp) { /* a row per position, the last one the sampling row */
            row += e->b_cnt[b];
            my_row = reach ? row - 1 : -1;
        } else
            my_row = reach ? row++ : -1;
        r->n_computed += e->b_cnt[b];
        if (e->pool->integ && integ_after_step(e, r)) continue; /* healed (recomputed later) or failed */
        if (plp) record_plp(e, r, pos0, e->b_cnt[b], e->logits + (size_t)first * e->vocab);
        register_pages(e, r);
        if (!reach) continue;
        kiln_finish f;
        int32_t *em = e->emitted + (size_t)b * EMIT_STRIDE;
        if (e->rank > 0) { /* rank 0 sampled it */
            if (em[0] != 1 || em[3] < 0 || em[3] >= e->vocab || r->n_toks >= r->n_prompt + r->max_tokens) { tp_lost(e); return; }
            r->toks[r->n_toks++] = em[3];
            f = (kiln_finish)em[2];
        } else {
            f = emit_token(e, r, e->logits + (size_t)my_row * e->vocab, now, -1, NULL);
            em[0] = 1;
            em[2] = (int32_t)f;
            em[3] = r->toks[r->n_toks - 1];
        }
        if (f != KILN_FINISH_NONE) finish_running(e, r, f, KILN_OK, NULL);
    }
    if (e->tp > 1 && e->rank == 0) {
        int n_words = EMIT_STRIDE * nb, cap = EMIT_STRIDE * e->cfg.max_batch;
        if (kiln_dist_bcast_msg(&e->emitted, &n_words, &cap, 0) != KILN_OK) { tp_lost(e); return; }
    }
    if (e->pool->integ) {
        /* pages that failed a check leave the prefix cache; fault injection (tests) on its schedule */
        for (int i = 0; i < nbad; i++) kiln_pcache_forget(&e->pc, e->bad_pages[i]);
        if (e->n_running > 0) kiln_kv_integ_tick(e->pool, &e->running[0]->seq);
    }
    /* MTP drafters of requests that have not drafted lately (speculation paused in a large batch)
     * run their layer over a chunk of pending pairs, so that their hidden rows stay bounded */
    for (int i = 0; i < e->n_running; i++) {
        kiln_req *r = e->running[i];
        mtp_pages(e, r);
        if (r->mtp && kiln_mtp_catch_up(r->mtp, r->toks, r->n_computed - 1) != KILN_OK) {
            kiln_mtp_free(r->mtp);
            r->mtp = NULL;
            r->spec_k = 0;
        }
        mtp_pages(e, r);
    }
    publish_stats(e, nb, n);
}

static void drain_all(kiln_engine *e, kiln_status err, const char *msg) {
    while (e->n_running > 0) finish_running(e, e->running[0], KILN_FINISH_ERROR, err, msg);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        kiln_req *r = e->wait_head;
        if (r) wait_unlink(e, r);
        pthread_mutex_unlock(&e->mu);
        if (!r) break;
        kiln_kv_seq_release(e->pool, &r->seq);
        publish_finish(e, r, KILN_FINISH_ERROR, err, msg);
    }
    publish_stats(e, 0, 0);
}

kiln_status kiln_engine_follow(kiln_model *m, const kiln_options *o, const kiln_engine_config *cfg, double timeout_s) {
    if (m->tp < 2 || kiln_dist_rank() == 0) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_engine_follow runs on ranks 1.. of a sharded model");
    kiln_engine *e;
    kiln_status st = engine_init(m, o, cfg, 0, &e);
    if (st != KILN_OK) return st;
    e->tp_timeout = timeout_s;
    for (;;) {
        if ((st = kiln_dist_bcast_msg(&e->msg, &e->msg_n, &e->msg_cap, timeout_s)) != KILN_OK) break;
        if (e->msg_n < 3) { st = kiln_fail(KILN_ERR_INTERNAL, "a malformed message from rank 0 (%d words)", e->msg_n); break; }
        if (e->msg[0] == TP_MSG_HEARTBEAT) continue;
        if (e->msg[0] == TP_MSG_STOP) break;
        if ((st = tp_apply(e)) != KILN_OK) break;
        step_run(e);
        if (atomic_load(&e->failed)) { st = kiln_fail(KILN_ERR_IO, "tensor parallel: %s", kiln_dist_failed() ? kiln_dist_failure() : "lost step with rank 0"); break; }
    }
    drain_all(e, KILN_ERR_UNSUPPORTED, "stopping");
    kiln_kv_thread_scratch_free();
    kiln_kernels_thread_scratch_free();
    kiln_engine_free(e);
    return st;
}

static int sweep_check(void *ctx, int32_t page, uint64_t hash) { return kiln_kv_integ_sweep_page(ctx, page, hash); }

static void *sched_main(void *arg) {
    kiln_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stopping && e->n_running == 0 && e->n_waiting == 0) {
            if (e->tp > 1 && !atomic_load(&e->failed)) {
                /* tensor parallel, idle: a heartbeat every second, so that the other ranks can
                 * tell an idle rank 0 from a lost one (the idle sweep is not run: its verdicts
                 * would have to be combined over the ranks as well) */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == 0) continue;
                pthread_mutex_unlock(&e->mu);
                if (tp_send(e, TP_MSG_HEARTBEAT) != KILN_OK) tp_lost(e);
                pthread_mutex_lock(&e->mu);
                continue;
            }
            if (!e->pool->integ || e->pc.n_cached == 0 || e->tp > 1) { pthread_cond_wait(&e->cv, &e->mu); continue; }
            /* idle with cached pages: verify a few of them every 200 ms (bad ones leave the cache) */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == 0) continue;
            pthread_mutex_unlock(&e->mu);
            kiln_pcache_sweep(&e->pc, 32, sweep_check, e->pool);
            publish_stats(e, 0, 0);
            pthread_mutex_lock(&e->mu);
        }
        if (e->stopping) break;
        pthread_mutex_unlock(&e->mu);
        step(e);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    /* shutdown: the other ranks stop too; everything still queued or running ends with an error;
     * all pages go back */
    if (e->tp > 1 && !atomic_load(&e->failed) && tp_send(e, TP_MSG_STOP) != KILN_OK) atomic_store(&e->failed, 1);
    drain_all(e, KILN_ERR_UNSUPPORTED, "the server is shutting down");
    kiln_kv_thread_scratch_free();      /* this thread's attention scratch (kv.c) and matmul scratch */
    kiln_kernels_thread_scratch_free(); /* (gemv.c), so a stop leaves nothing behind */
    return NULL;
}
