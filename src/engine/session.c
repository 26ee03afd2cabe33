/* session.c — one sequence over its own paged KV pool: the API behind `kiln run` and the
 * evaluation tools. Prompts are processed in chunks of up to KILN_SESSION_CHUNK tokens.
 *
 * KV set-up (engine/kv_setup.h): dtype, page size, budget and FP8 scales are resolved here, the
 * built-in calibration pass runs here when FP8 static scales have no other source, and one line
 * summarising the cache goes to stderr (unless opts->quiet). */
#include "kiln_test.h"
#include "kiln.h"
#include "base/status.h"
#include "engine/kv_setup.h"
#include "kv/integrity.h"
#include "engine/session_integrity.h"
#include "model/forward.h"
#include "engine/mtp.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prompt calls of KILN_SESSION_CHUNK (kiln_test.h, which `kiln bench` reads too) = 512 tokens:
 * llama.cpp's default micro-batch (n_ubatch), so `kiln bench --prompt 512` is one forward call as
 * `llama-bench -p 512` is one llama_decode. Larger calls amortize what a GEMM pays per call
 * (weights streamed once per call, FP8's per-call requantization to Q8_0, activation preparation):
 * measured on the 1.7B shape, 512 against the first 64, prefill 1.6× (FP8), 1.1–1.3× (INT4, Q4_0),
 * 1.3× (BF16), Q8_0 unchanged (docs/BENCHMARKS.md). The forward scratch grows with it: ~170 KB per
 * token of chunk at that shape (x, xb, tmp, hb, hb2, q, k, v, ao). */

struct kiln_session {
    struct kiln_model *m;
    kiln_options opts;
    kiln_kv_pool *pool;
    kiln_kv_seq seq;
    kiln_backend *be;       /* computes this session's forward passes (its own ISA, threads, FP8 form) */
    kiln_forward_ws ws;
    int n_ctx;
    kiln_kv_info kv;
    kiln_mtp *mtp;          /* --spec mtp: the MTP drafter (engine/mtp.c), or NULL */
};

kiln_kv_dtype kiln_resolve_kv_dtype(const struct kiln_model *m, kiln_kv_dtype want) {
    if (want != KILN_KV_AUTO) return want;
    return m->hp.act_dtype == KILN_DT_F32 ? KILN_KV_F32 : KILN_KV_BF16;
}

static const char *dtype_name(kiln_kv_dtype d) {
    return d == KILN_KV_F32 ? "f32" : d == KILN_KV_BF16 ? "bf16" : d == KILN_KV_FP8 ? "fp8_e4m3" : "auto";
}

static int session_ctx(const struct kiln_model *m, const kiln_options *o) { return kiln_model_context(m, o); }

/* The DSA row's fields (kv.h: the compact row). */
static void fill_dsa(const kiln_kv_setup *su, kiln_kv_info *in) {
    const kiln_kv_config *c = &su->cfg;
    if (!c->dsa_latent) return;
    in->dsa_latent = c->dsa_latent;
    in->dsa_rope = c->dsa_rope;
    in->dsa_index_key = c->dsa_key;
    for (int l = 0; l < c->n_layers; l++) in->dsa_key_layers += kiln_kv_dsa_has_key(c, l);
    in->dsa_row_bytes = (int)kiln_kv_row_bytes(c, 0); /* layer 0 has its own indexer (arch_deepseek.c requires it) */
    in->dsa_fp8 = su->dsa_fp8_asked;
}

static void fill_info(const kiln_kv_setup *su, int64_t n_pages, int n_ctx, kiln_kv_info *in) {
    const kiln_kv_config *c = &su->cfg;
    memset(in, 0, sizeof *in);
    in->dtype = c->dtype;
    in->dtype_name = dtype_name(c->dtype);
    in->scale_mode = c->scale_mode;
    in->n_layers = c->n_layers;
    in->n_kv_heads = c->n_kv_heads;
    in->k_dim = c->k_dim;
    in->v_dim = c->v_dim;
    in->v_shares_k = c->v_shares_k;
    in->page_tokens = c->page_tokens;
    in->bytes_per_token = kiln_kv_token_bytes(c);
    in->page_data_bytes = kiln_kv_page_data_bytes(c);
    in->page_meta_bytes = kiln_kv_page_meta_bytes(c);
    in->page_bytes = kiln_kv_page_cost(c);
    in->pool_fixed_bytes = kiln_kv_pool_fixed_bytes(c);
    in->mem_bytes = c->mem_bytes;
    in->n_pages = n_pages;
    in->capacity_tokens = n_pages * c->page_tokens;
    in->max_context = n_ctx;
    snprintf(in->scale_source, sizeof in->scale_source, "%s", su->source);
}

static kiln_status budget_error(const kiln_kv_config *c) {
    return kiln_fail(KILN_ERR_KV_EXHAUSTED,
                     "--kv-mem (kv_mem_bytes) = %lld bytes is smaller than one KV page of %d tokens (%llu bytes: %llu data + %llu metadata, "
                     "plus %llu bytes of pool scales)",
                     (long long)c->mem_bytes, c->page_tokens, (unsigned long long)kiln_kv_page_cost(c),
                     (unsigned long long)kiln_kv_page_data_bytes(c), (unsigned long long)kiln_kv_page_meta_bytes(c),
                     (unsigned long long)kiln_kv_pool_fixed_bytes(c));
}

kiln_status kiln_kv_plan(const kiln_model *m, const kiln_options *opts, kiln_kv_info *out) {
    kiln_options o;
    if (opts) o = *opts; else kiln_options_default(&o);
    memset(out, 0, sizeof *out);
    kiln_kv_setup su;
    int n_ctx = session_ctx(m, &o);
    KILN_TRY(kiln_kv_setup_for_model((kiln_model *)m, &o, n_ctx, 0, &su));
    int64_t pages = kiln_kv_plan_pages(&su.cfg);
    fill_info(&su, pages, n_ctx, out);
    fill_dsa(&su, out);
    kiln_status st = pages < 1 ? budget_error(&su.cfg) : KILN_OK;
    kiln_kv_setup_free(&su);
    return st;
}

/* The start-up line: what the pool holds and, where a default decided it, why. */
static void print_summary(const kiln_kv_info *in, int file_ctx, int budget_capped) {
    double mib = (double)in->mem_bytes / (1024.0 * 1024.0);
    fprintf(stderr, "kiln: kv cache: %s, %d-token pages, %llu bytes/token, %lld pages = %lld tokens in %.1f MiB (context %d)",
            in->dtype_name, in->page_tokens, (unsigned long long)in->bytes_per_token, (long long)in->n_pages,
            (long long)in->capacity_tokens, mib, in->max_context);
    if (in->dtype == KILN_KV_FP8) fprintf(stderr, "; fp8 scales: %s", in->scale_source);
    if (in->max_context < file_ctx)
        fprintf(stderr, "; context %d of the file's %d (%s)", in->max_context, file_ctx,
                in->max_context == KILN_DEFAULT_CONTEXT_CAP ? "default cap; --ctx raises it" : "--ctx");
    if (budget_capped) fprintf(stderr, "; default budget capped at 1/4 of available memory (--kv-mem sets it)");
    if (in->dsa_index_key)
        fprintf(stderr, "; sparse-attention rows: latent %d as FP8 + %d scales, rope %d in %s, indexer key %d as FP8 + %d scale%s = %d "
                "bytes per layer, the key in %d of %d layers (the model's own FP8 rounding, held exactly%s)", in->dsa_latent,
                in->dsa_latent / 128, in->dsa_rope, in->dtype_name, in->dsa_index_key, in->dsa_index_key / 128,
                in->dsa_index_key > 128 ? "s" : "", in->dsa_row_bytes, in->dsa_key_layers, in->n_layers,
                in->dsa_fp8 ? "; --kv-dtype fp8 gives this layout, rope part in bf16 as SGLang and vLLM store it" : "");
    fprintf(stderr, "\n");
}

kiln_status kiln_session_create(kiln_model *m, const kiln_options *opts, kiln_session **out) {
    *out = NULL;
    kiln_options o;
    if (opts) o = *opts; else kiln_options_default(&o);
    if (o.kv_page_tokens <= 0) o.kv_page_tokens = 16;
    kiln_model_prepare_compute(m, &o);
    kiln_session *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status bst = kiln_backend_from_options(&o, &s->be);
    if (bst != KILN_OK) { free(s); return bst; }
    kiln_model_info mi;
    kiln_model_get_info(m, &mi);
    kiln_be_expect_weights(s->be, mi.weight_bytes); /* a device backend reports its upload's progress */
    s->m = m;
    s->opts = o;
    s->opts.kv_scales_path = NULL; /* not owned: only used during creation */
    s->n_ctx = session_ctx(m, &o);
    kiln_kv_setup su;
    kiln_status st = kiln_kv_setup_for_model(m, &o, s->n_ctx, 1, &su);
    if (st != KILN_OK) { kiln_backend_free(s->be); free(s); return st; }
    if (kiln_kv_plan_pages(&su.cfg) < 1) st = budget_error(&su.cfg);
    kiln_be_kv_arrays(s->be, &su.cfg);
    if (st == KILN_OK) st = kiln_kv_pool_create(&su.cfg, &s->pool);
    if (st == KILN_OK) st = kiln_session_integ_attach_(s->pool, m, &o); /* KV integrity (issue 5), default heal */
    if (st == KILN_OK) {
        fill_info(&su, s->pool->n_pages, s->n_ctx, &s->kv);
        fill_dsa(&su, &s->kv);
    }
    const int budget_capped = su.budget_capped;
    kiln_kv_setup_free(&su);
    if (st == KILN_OK) st = kiln_forward_ws_init(&s->ws, m, s->be, KILN_SESSION_CHUNK, s->n_ctx);
    if (st != KILN_OK) { kiln_session_free(s); return st; }
    if (!o.quiet) print_summary(&s->kv, m->hp.max_seq, budget_capped);
    if (!o.quiet && s->be->device_name) fprintf(stderr, "kiln: compute: %s\n", s->be->device_name);
    *out = s;
    return KILN_OK;
}

void kiln_session_free(kiln_session *s) {
    if (!s) return;
    kiln_mtp_free(s->mtp);
    if (s->pool) kiln_kv_seq_release(s->pool, &s->seq);
    free(s->seq.pages);
    kiln_kv_pool_free(s->pool);
    kiln_forward_ws_free(&s->ws);
    kiln_backend_free(s->be);
    free(s);
}

void kiln_session_kv_info(const kiln_session *s, kiln_kv_info *out) { *out = s->kv; }

kiln_status kiln_session_eval_decodes_(kiln_session *s, const int32_t *tokens, int n, float *logits) {
    s->be->cx.decode_steps = 1;
    const kiln_status st = kiln_session_eval(s, tokens, n, logits);
    s->be->cx.decode_steps = 0;
    return st;
}

kiln_status kiln_session_eval(kiln_session *s, const int32_t *tokens, int n, float *logits) {
    if (n <= 0) return kiln_fail(KILN_ERR_INVALID_ARG, "session_eval: no tokens");
    if (s->seq.len + n > s->n_ctx)
        return kiln_fail(KILN_ERR_INVALID_ARG, "context length exceeded: %d + %d tokens > context %d", s->seq.len, n, s->n_ctx);
    KILN_TRY(kiln_kv_seq_reserve(s->pool, &s->seq, s->seq.len + n));
    int V = s->m->hp.vocab;
    const int start = s->seq.len;
    if (s->pool->integ) kiln_session_integ_begin_call_(s, n); /* fault-injection schedule; multi-chunk call scope */
    for (int i = 0; i < n; i += KILN_SESSION_CHUNK) {
        int c = n - i < KILN_SESSION_CHUNK ? n - i : KILN_SESSION_CHUNK;
        int last = i + c == n;
        float *lg = logits ? logits + (size_t)i * V : NULL;
        /* KV integrity: the chunk's tokens are noted (prefix identity, replay log) before it runs, and
         * a page that failed verification in it is healed (or fails the call) before returning */
        if (s->pool->integ) KILN_TRY(kiln_kv_integ_note(s->pool, &s->seq, s->seq.len, tokens + i, c, 1));
        /* MTP drafting reads the chunk's last-layer hidden states (a heal's replay does not refresh
         * them: a draft from a damaged row only costs acceptance, verification stays exact) */
        if (s->mtp && !(s->ws.hidden_out = kiln_mtp_hidden_rows(s->mtp, tokens + i, s->seq.len, c)))
            return kiln_fail(KILN_ERR_NOMEM, "out of memory keeping hidden states for MTP drafting");
        kiln_status fst = kiln_forward(s->m, s->pool, &s->seq, &s->ws, tokens + i, c, lg);
        s->ws.hidden_out = NULL;
        KILN_TRY(fst);
        if (s->pool->integ) KILN_TRY(kiln_session_integ_after_chunk_(s, start, i + c, n, logits));
        if (last && logits) memcpy(s->ws.logits, lg + (size_t)(c - 1) * V, (size_t)V * 4);
    }
    return KILN_OK;
}

kiln_status kiln_session_kv_fill(kiln_session *s, int n_tokens) {
    const int len = s->seq.len;
    if (len < 1) return kiln_fail(KILN_ERR_INVALID_ARG, "kv_fill: the sequence is empty (evaluate at least one token first)");
    if (n_tokens <= len) return KILN_OK;
    if (n_tokens > s->n_ctx)
        return kiln_fail(KILN_ERR_INVALID_ARG, "context length exceeded: kv_fill to %d tokens > context %d", n_tokens, s->n_ctx);
    KILN_TRY(kiln_kv_seq_reserve(s->pool, &s->seq, n_tokens));
    if (s->pool->integ) KILN_TRY(kiln_kv_integ_note_cyclic(s->pool, &s->seq, len, n_tokens)); /* the copies' tokens */
    const kiln_kv_config *c = &s->pool->cfg;
    const int H = c->n_kv_heads;
    /* The source rows (positions < len, which the fill never writes) are read once into host memory
     * when that fits in 256 MiB: a pool's arrays may be a discrete GPU's mapped VRAM, which the CPU
     * reads uncached (a 4,000-token fill reading every copied row from there did not finish in 90 s
     * on an H200). Row r of (layer l, position p): src[(l·len + p)·(K + V)], K = H·k_dim floats then
     * V = H·v_dim (none where V shares K). */
    const size_t kf = (size_t)H * c->k_dim, vf = c->v_shares_k ? 0 : (size_t)H * c->v_dim, row = kf + vf;
    const size_t src_floats = (size_t)c->n_layers * (size_t)len * row;
    float *src = src_floats <= ((size_t)256 << 20) / sizeof(float) ? malloc(src_floats * sizeof *src) : NULL;
    float *k = malloc(kf * sizeof *k), *v = malloc((vf ? vf : 1) * sizeof *v);
    if (!k || !v) { free(k); free(v); free(src); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    for (int l = 0; src && l < c->n_layers; l++)
        for (int p = 0; p < len; p++) {
            float *r = src + ((size_t)l * (size_t)len + (size_t)p) * row;
            for (int h = 0; h < H; h++) {
                kiln_kv_read_row(s->pool, &s->seq, l, p, h, 0, r + (size_t)h * c->k_dim);
                if (vf) kiln_kv_read_row(s->pool, &s->seq, l, p, h, 1, r + kf + (size_t)h * c->v_dim);
            }
        }
    for (int pos = len; pos < n_tokens; pos++)
        for (int l = 0; l < c->n_layers; l++) {
            const float *kr = k, *vr = v;
            if (src) {
                kr = src + ((size_t)l * (size_t)len + (size_t)(pos % len)) * row;
                vr = kr + kf;
            } else
                for (int h = 0; h < H; h++) {
                    kiln_kv_read_row(s->pool, &s->seq, l, pos % len, h, 0, k + (size_t)h * c->k_dim);
                    if (vf) kiln_kv_read_row(s->pool, &s->seq, l, pos % len, h, 1, v + (size_t)h * c->v_dim);
                }
            kiln_kv_store(s->pool, &s->seq, l, pos, kr, vf ? vr : NULL);
        }
    free(src);
    free(k);
    free(v);
    s->seq.len = n_tokens;
    return KILN_OK;
}

double kiln_session_bench_attention(kiln_session *s, int reps) {
    if (s->seq.len < 1 || s->pool->cfg.dsa_latent) return -1.0; /* DSA: sparse attention only (kiln_kv_sparse_times) */
    const kiln_kv_config *c = &s->pool->cfg;
    const int H = s->m->hp.n_heads;
    float *q = malloc((size_t)H * c->k_dim * sizeof *q), *out = malloc((size_t)H * c->v_dim * sizeof *out);
    if (!q || !out) { free(q); free(out); return -1.0; }
    uint32_t x = 12345;
    for (int i = 0; i < H * c->k_dim; i++) { x = x * 1664525u + 1013904223u; q[i] = (float)(x >> 8) / 16777216.0f - 0.5f; }
    kiln_kv_seq *sq = &s->seq;
    int pos = s->seq.len - 1;
    double best = 1e30;
    for (int r = 0; r < (reps > 0 ? reps : 1); r++) {
        double t0 = kiln_now();
        for (int l = 0; l < c->n_layers; l++) s->be->ops->kv_attend(s->be, s->pool, l, 1, &sq, &pos, q, H, 0.125f, out);
        double t = kiln_now() - t0;
        best = t < best ? t : best;
    }
    free(q);
    free(out);
    return best;
}

const float *kiln_session_logits(const kiln_session *s) { return s->ws.logits; }
int kiln_session_length(const kiln_session *s) { return s->seq.len; }
void kiln_session_reset(kiln_session *s) {
    kiln_kv_seq_release(s->pool, &s->seq);
    if (s->mtp) kiln_mtp_truncate(s->mtp, 0);
}

kiln_status kiln_session_spec_mtp(kiln_session *s) {
    if (s->mtp) return KILN_OK;
    if (s->seq.len > 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "session_spec_mtp: enable MTP drafting before the first evaluation (%d tokens evaluated)", s->seq.len);
    return kiln_mtp_create(s->m, s->be, &s->pool->cfg, s->n_ctx, &s->mtp);
}

kiln_status kiln_session_mtp_draft(kiln_session *s, int32_t next, int k, int32_t *drafts, int *n_drafts, float *draft_logits) {
    *n_drafts = 0;
    if (!s->mtp) return kiln_fail(KILN_ERR_INVALID_ARG, "session_mtp_draft: MTP drafting is not enabled (kiln_session_spec_mtp)");
    if (next < 0 || next >= s->m->hp.vocab) return kiln_fail(KILN_ERR_INVALID_ARG, "session_mtp_draft: token %d is out of range", next);
    return kiln_mtp_draft(s->mtp, s->seq.len, next, k, drafts, n_drafts, draft_logits);
}

/* Accessor for src/engine/session_util.c (evaluation helpers such as kiln_session_truncate), which
 * cannot see this file's struct. Declared in engine/session_internal.h. */
void kiln_session_parts_(kiln_session *s, kiln_model **m, kiln_kv_pool **pool, kiln_kv_seq **seq, kiln_forward_ws **ws) {
    *m = s->m;
    *pool = s->pool;
    *seq = &s->seq;
    *ws = &s->ws;
}

void kiln_session_kv_(kiln_session *s, kiln_kv_pool **pool, kiln_kv_seq **seq) {
    *pool = s->pool;
    *seq = &s->seq;
}

void kiln_session_truncated_(kiln_session *s, int n) {
    if (s->mtp) kiln_mtp_truncate(s->mtp, n);
}
