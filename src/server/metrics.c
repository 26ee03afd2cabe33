/* metrics.c — GET /metrics in the Prometheus text format (version 0.0.4). Series:
 *   kiln_requests_total{code}            HTTP responses by status code
 *   kiln_requests_finished_total{reason} engine outcomes: stop, length, cancelled, error
 *   kiln_client_disconnects_total, kiln_request_timeouts_total, kiln_stop_string_hits_total,
 *   kiln_http_deadline_closes_total, kiln_http_open_connections
 *   kiln_prompt_tokens_total, kiln_generation_tokens_total, kiln_prefill_tokens_total,
 *   kiln_prefix_cache_hit_tokens_total, kiln_prefix_cache_hit_rate (cached / prompt tokens)
 *   kiln_queue_depth, kiln_running_requests, kiln_batch_size (last step), kiln_batch_size_steps (histogram)
 *   kiln_kv_pages / _free / _used (held by requests) / _cached_idle, kiln_kv_capacity_tokens
 * The output passes `promtool check metrics` (tests/server/test_server_metrics.sh): gauges carry no
 * _total suffix, every histogram has _bucket / _sum / _count.
 *   kiln_preemptions_total, kiln_prefix_cache_evictions_total, kiln_scheduler_steps_total
 *   kiln_kv_integrity_mode{mode}, kiln_kv_integrity_checks_total / _bytes_verified_total /
 *   _detections_total / _detections_by_kind_total{kind} / _heals_total / _healed_positions_total /
 *   _strict_failures_total / _swept_pages_total / _injected_faults_total
 *   kiln_time_to_first_token_seconds, kiln_inter_token_latency_seconds (histograms)
 *   kiln_process_peak_rss_bytes, kiln_uptime_seconds */
#include "kiln_test.h"
#include "server/server_internal.h"
#include <math.h>
#include <stdio.h>
#include <sys/resource.h>

static void head(kiln_sbuf *b, const char *name, const char *type, const char *help) {
    kiln_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(kiln_sbuf *b, const char *name, const char *help, const uint64_t *bk, uint64_t n, double sum) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < 16; i++) {
        cum += bk[i];
        if (isinf(kiln_latency_bounds[i])) kiln_sbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)n);
        else kiln_sbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, kiln_latency_bounds[i], (unsigned long long)cum);
    }
    kiln_sbuf_printf(b, "%s_sum %.6f\n%s_count %llu\n", name, sum, name, (unsigned long long)n);
}

void kiln_server_metrics(kiln_server *s, kiln_sbuf *b) {
    kiln_engine_stats e;
    kiln_engine_get_stats(s->eng, &e);
    head(b, "kiln_requests_total", "counter", "HTTP responses by status code");
    for (int i = 0; i < KILN_N_CODES; i++) {
        unsigned long long v = atomic_load(&s->code_count[i]);
        if (kiln_counted_codes[i]) kiln_sbuf_printf(b, "kiln_requests_total{code=\"%d\"} %llu\n", kiln_counted_codes[i], v);
        else kiln_sbuf_printf(b, "kiln_requests_total{code=\"other\"} %llu\n", v);
    }
    static const char *reasons[] = {"none", "stop", "length", "cancelled", "error"};
    head(b, "kiln_requests_finished_total", "counter", "requests the engine finished, by reason");
    for (int i = 1; i < 5; i++) kiln_sbuf_printf(b, "kiln_requests_finished_total{reason=\"%s\"} %llu\n", reasons[i], (unsigned long long)e.finished[i]);
#define C(name, help, v) do { head(b, name, "counter", help); kiln_sbuf_printf(b, "%s %llu\n", name, (unsigned long long)(v)); } while (0)
#define G(name, help, fmt, v) do { head(b, name, "gauge", help); kiln_sbuf_printf(b, "%s " fmt "\n", name, v); } while (0)
    C("kiln_client_disconnects_total", "requests cancelled because the client went away", atomic_load(&s->disconnects));
    C("kiln_request_timeouts_total", "requests that ran past the request timeout", atomic_load(&s->timeouts));
    C("kiln_stop_string_hits_total", "requests ended by a stop string", atomic_load(&s->stop_strings));
    C("kiln_http_deadline_closes_total", "connections closed at their header / body / send deadline", atomic_load(&s->deadline_closes));
    G("kiln_http_open_connections", "open HTTP connections", "%d", atomic_load(&s->open_conns));
    C("kiln_prompt_tokens_total", "prompt tokens of admitted requests", e.prompt_tokens);
    C("kiln_generation_tokens_total", "tokens generated", e.generated_tokens);
    C("kiln_prefill_tokens_total", "prompt (and recomputed) tokens run through the model", e.prefill_tokens);
    C("kiln_prefix_cache_hit_tokens_total", "prompt tokens served from cached KV pages", e.cached_tokens);
    G("kiln_prefix_cache_hit_rate", "cached prompt tokens / prompt tokens", "%.6f", e.prompt_tokens ? (double)e.cached_tokens / (double)e.prompt_tokens : 0.0);
    C("kiln_prefix_cache_evictions_total", "idle cached pages evicted (LRU)", e.evictions);
    C("kiln_preemptions_total", "requests preempted (pages freed, recomputed later) when KV ran out", e.preemptions);
    C("kiln_scheduler_steps_total", "forward steps", e.steps);
    C("kiln_spec_verify_steps_total", "speculative decoding: a request's steps that verified drafts", e.spec_steps);
    C("kiln_spec_drafted_tokens_total", "speculative decoding: tokens drafted (prompt lookup or the MTP layer)", e.spec_drafted);
    C("kiln_spec_accepted_tokens_total", "speculative decoding: drafted tokens the target kept", e.spec_accepted);
    G("kiln_queue_depth", "requests waiting for admission", "%d", e.waiting);
    G("kiln_running_requests", "requests in the running batch", "%d", e.running);
    G("kiln_batch_size", "sequences in the last step", "%d", e.batch_seqs);
    G("kiln_batch_tokens", "tokens in the last step", "%d", e.batch_tokens);
    head(b, "kiln_batch_size_steps", "histogram", "sequences per forward step");
    {
        static const char *le[8] = {"1", "3", "7", "15", "31", "63", "127", "+Inf"};
        uint64_t cum = 0;
        for (int i = 0; i < 8; i++) {
            cum += e.batch_hist[i];
            kiln_sbuf_printf(b, "kiln_batch_size_steps_bucket{le=\"%s\"} %llu\n", le[i], (unsigned long long)cum);
        }
        kiln_sbuf_printf(b, "kiln_batch_size_steps_sum %llu\nkiln_batch_size_steps_count %llu\n", (unsigned long long)e.batch_seq_sum,
                         (unsigned long long)cum);
    }
    G("kiln_kv_pages", "pages in the KV pool", "%d", e.kv_pages_total); /* a gauge: no _total (promtool) */
    G("kiln_kv_pages_free", "pages on the free list", "%d", e.kv_pages_free);
    G("kiln_kv_pages_used", "pages held by requests (queued or running)", "%d", e.kv_pages_used);
    G("kiln_kv_pages_cached_idle", "pages held only by the prefix cache (evictable)", "%d", e.kv_pages_cached_idle);
    G("kiln_kv_page_tokens", "tokens per KV page", "%d", e.page_tokens);
    G("kiln_kv_capacity_tokens", "tokens the KV pool holds", "%lld", (long long)e.kv_capacity_tokens);
    /* KV integrity (kv/integrity.h): seal checks in attention, at prefix reuse and by the idle sweep */
    head(b, "kiln_kv_integrity_mode", "gauge", "KV integrity mode (label) of the pool");
    kiln_sbuf_printf(b, "kiln_kv_integrity_mode{mode=\"%s\"} 1\n", kiln_kv_integrity_name(e.integ.mode));
    C("kiln_kv_integrity_checks_total", "KV page-slice seal verifications", e.integ.checks);
    C("kiln_kv_integrity_bytes_verified_total", "bytes hashed by those verifications", e.integ.bytes_verified);
    C("kiln_kv_integrity_detections_total", "KV seal verifications that failed", e.integ.detections);
    head(b, "kiln_kv_integrity_detections_by_kind_total", "counter", "failed verifications by diagnosis");
    {
        static const char *kinds[4] = {"content", "scale", "wrong_page", "stale_page"};
        for (int i = 0; i < 4; i++)
            kiln_sbuf_printf(b, "kiln_kv_integrity_detections_by_kind_total{kind=\"%s\"} %llu\n", kinds[i], (unsigned long long)e.integ.detected[i]);
    }
    C("kiln_kv_integrity_heals_total", "rollbacks that dropped bad KV pages and recomputed them", e.integ.heals);
    C("kiln_kv_integrity_healed_positions_total", "positions recomputed by heals", e.integ.healed_positions);
    C("kiln_kv_integrity_strict_failures_total", "requests failed by a KV integrity error", e.integ.strict_failures);
    C("kiln_kv_integrity_swept_pages_total", "idle prefix-cache pages verified by the sweep", e.integ.swept_pages);
    {
        uint64_t inj = 0;
        for (int i = 0; i < KILN_KV_FAULT_KINDS; i++) inj += e.integ.injected[i];
        C("kiln_kv_integrity_injected_faults_total", "faults injected (--inject-kv-faults; tests only)", inj);
    }
    G("kiln_tensor_parallel_ranks", "processes the model is sharded over (kiln serve --tp)", "%d", e.tp_ranks);
    if (e.ep_ranks > 0) {
        head(b, "kiln_expert_parallel_routed_total", "counter", "(token, expert) pairs routed to each rank's experts (--ep)");
        for (int r = 0; r < e.ep_ranks && r < KILN_MAX_EP_METRICS; r++)
            kiln_sbuf_printf(b, "kiln_expert_parallel_routed_total{rank=\"%d\"} %llu\n", r, (unsigned long long)e.ep_load[r]);
    }
    hist(b, "kiln_time_to_first_token_seconds", "arrival to first token", e.ttft_b, e.ttft_n, e.ttft_sum);
    hist(b, "kiln_inter_token_latency_seconds", "time between consecutive tokens of a request", e.itl_b, e.itl_n, e.itl_sum);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    G("kiln_process_peak_rss_bytes", "peak resident set size of the server process", "%lld", (long long)ru.ru_maxrss * 1024);
    G("kiln_uptime_seconds", "seconds since start", "%.3f", kiln_now() - s->t_start);
#undef C
#undef G
}
