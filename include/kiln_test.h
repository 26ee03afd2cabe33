/* kiln_test.h — hooks for benchmarks, fault injection and tests, kept apart from the user API in
 * kiln.h (as SQLite keeps sqlite3_test_control apart): `kiln bench`, `kiln bench --integrity`, the
 * test suites and the docs' figures use them; an embedding program has no need of them and they
 * may change without notice. */
#ifndef KILN_TEST_H
#define KILN_TEST_H
#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- sessions: benchmark helpers ---------------------------------------------------------------- */
/* Benchmarks only: extends the sequence to n_tokens positions without running the model; the new
 * positions' KV rows are copies of the rows already stored (cyclically), so decode at that context
 * reads a realistic cache. The sequence must hold at least one token. */
kiln_status kiln_session_kv_fill(kiln_session *s, int n_tokens);
/* Benchmarks only: seconds one decode step's attention takes over every layer at the session's
 * current length (fixed pseudo-random queries; the model's matmuls excluded), best of `reps`.
 * Returns a negative value for an empty sequence. */
double kiln_session_bench_attention(kiln_session *s, int reps);

/* ---- KV integrity: fault injection (docs/INTEGRITY.md) ------------------------------------------ */
/* One line describing the --inject-kv-faults SPEC grammar. */
const char *kiln_kv_inject_spec_help(void);

/* Injects one fault into the session's sequence now (lost writes / partial copies: on the next
 * write / copy). seed picks the target. Returns 1 if injected, 0 if there is no target for that kind
 * (e.g. SCALE needs FP8, WRONG_PAGE and STALE_PAGE need two full pages); errors if integrity is off. */
kiln_status kiln_session_inject_kv_fault(kiln_session *s, kiln_kv_fault kind, uint64_t seed, int *injected);
/* Detection campaign on a synthetic KV pool (2 layers, 2 KV heads, 32-value rows, 16-token pages;
 * BF16, FP8 static and dynamic for scale faults) through the real store / attention / hand-off
 * paths, with the built-in injector: n faults of `fault` injected one at a time, each followed by
 * one decode-style attention over every layer, then undone or healed. fault = -1: a fault-free
 * workload until n page verifications (a page = every layer's K and V slices) have run. For
 * `kiln bench --integrity` and the docs' figures. */
typedef struct kiln_kv_campaign {
    int fault;                   /* kiln_kv_fault, or -1 for the fault-free run */
    uint64_t injected, detected, detected_before_use, false_alarms;
    uint64_t verifications;      /* page-slice verifications run (slices per page: 2 layers × K/V × 2 heads) */
    uint64_t page_verifications; /* verifications / slices per page */
    double seconds;
} kiln_kv_campaign;
kiln_status kiln_kv_integrity_campaign(int fault, uint64_t n, uint64_t seed, kiln_kv_campaign *out);

/* ---- benchmarks (src/model/bench_api.c; used by `kiln bench`) ---------------------------------- */
/* The machine's read bandwidth in GB/s (1e9 B/s), measured on one buffer kept between
 * measurements, so a benchmark can measure every round without allocating and faulting in 1 GiB
 * each time: `bytes` (0 = 1 GiB) split across `threads`
 * threads (0 = all), each part first touched by its reader. Burst: best of 5 passes. Window: one
 * timed read of at least `window_bytes` (passes repeated), a sustained figure that can be made as
 * long as the benchmark's own measuring window. NULL from open: out of memory. */
typedef struct kiln_membw kiln_membw;
kiln_membw *kiln_membw_open(int threads, size_t bytes);
double kiln_membw_burst_gbps(kiln_membw *mb);
double kiln_membw_window_gbps(kiln_membw *mb, uint64_t window_bytes);
void kiln_membw_close(kiln_membw *mb);
/* The read bandwidth of the device the options name (--device vulkan[:N]) in GB/s: a device
 * buffer of `bytes` (0 = 512 MiB) read 8 times per timed submit, best of three. KILN_ERR_UNSUPPORTED
 * for the host backends (kiln_membw measures those). */
kiln_status kiln_device_read_gbps(const kiln_options *o, size_t bytes, double *gbps);
/* The machine's compute peak in G operations/s (a multiply-accumulate counts 2) for kind 0 (f32
 * FMA), 1 (int8 dot) or 2 (bf16 pair dot) with the kernels of `isa` (AUTO: the best) on `threads`
 * threads (0 = all): the best of 3 runs of a register-only loop of the widest such instruction
 * (kernels/membw.c). 0 when that ISA has no such instruction (bf16 without AVX512_BF16). */
double kiln_compute_peak_gops(int kind, kiln_isa isa, int threads);
/* Whether a prompt's FP8 GEMM of n tokens runs on the int8 kernels (FP8 requantized to Q8_0 per
 * call: kernels/gemv.c fp8_q8_tables) with the kernels of `isa` and FP8 form `fp8` (kiln_options
 * fp8_gemv: 0 auto, 1 exact, 2 bf16), for a weight of whole 32-column blocks: `kiln bench` then sets
 * the prompt's GOPS against the int8 (or AMX) peak. */
int kiln_fp8_prompt_int8(kiln_isa isa, int fp8, int n);
/* Tokens per forward call of a kiln_session prompt (engine/session.c): 512, llama.cpp's n_ubatch. */
#define KILN_SESSION_CHUNK 512
/* Multiply-accumulates of the linear layers one token runs (every projection and the head; for
 * MoE layers the num_experts_per_tok experts a token is routed to, the router and the shared
 * experts): achieved GFLOP/s of a prefill = 2 × this × tokens/s. */
uint64_t kiln_model_token_macs(const kiln_model *m);
/* The weight format name (kiln_wformat_name: "q8_0", "int4", ...) of layer 0's first linear layer
 * (the output head's for a model without layers): what `kiln bench --weights native` runs. */
const char *kiln_model_linear_format(const kiln_model *m);
/* Aggregate decode tokens/s of `batch` sequences stepped together (src/engine/bench_batch.c): each
 * prefilled with `ctx` tokens, then `steps` timed steps of one token per sequence through the
 * forward pass on the options' backend (KV integrity off). */
kiln_status kiln_bench_batched_decode(kiln_model *m, const kiln_options *opts, int batch, int ctx, int steps, double *tps);
/* Of the last kiln_bench_batched_decode: seconds per timed decode step spent in the sparse-attention
 * indexer scan and in the sparse attention (both 0 for models without DeepSeek sparse attention). */
void kiln_bench_batched_sparse(double *index_s, double *attend_s);
/* Re-quantizes the output head (lm_head) in memory too: "f32", "bf16", "fp8", "int4" (group 32),
 * "int4-g128". */
kiln_status kiln_model_requantize_head(kiln_model *m, const char *weights);
/* Bytes of weights (data + scales) one batch-1 decode step reads; for MoE layers only the experts a
 * token is routed to. */
uint64_t kiln_model_decode_weight_bytes(const kiln_model *m);
/* The linear layers of one batch-1 decode step alone, replayed with the forward pass's own calls
 * (Llama-architecture models: q/k/v and gate/up each in one call, o, down, the output head) on a
 * fixed activation: mean seconds per step over `reps` consecutive steps (a window as long as a
 * decode window of `reps` tokens, not the best single step, which on a shared machine catches quiet
 * moments a decode window does not). What the GEMV kernels reach without the rest of a step
 * (attention, norms, sampling), on the backend opts describes (backend, ISA, threads, FP8 form;
 * NULL = defaults). 0 for other architectures or when scratch memory cannot be had. */
double kiln_model_bench_linear_step(const kiln_model *m, const kiln_options *opts, int reps);

/* One weight format's batch-1 GEMV streaming rate, alone (`kiln bench --gemv`): weights = "f32",
 * "bf16", "fp8", "int4" (group 32) or "int4-g128"; as many copies of one rows × cols weight
 * (quantized and laid out as the model's re-quantized layers are) as make at least min_bytes, so a
 * pass reads memory, not cache; ISA, threads and FP8 form from opts (NULL = defaults). A pass is y = W·x
 * through the matmul driver over every copy in turn; it returns the GB/s (1e9 B/s) of weight data + scales read.
 * Open fails with a message naming --weights or --shape for a bad format or shape. */
typedef struct kiln_gemv_bench kiln_gemv_bench;
/* tokens: activation rows per matmul (1 = the decode GEMV; 2+ = a few-token step, e.g. speculative
 * verification): a pass's GB/s is always the weight bytes over its time. */
kiln_status kiln_gemv_bench_open(const char *weights, int64_t rows, int64_t cols, int tokens, uint64_t min_bytes, const kiln_options *opts,
                                 kiln_gemv_bench **out);
double kiln_gemv_bench_pass(kiln_gemv_bench *b);
uint64_t kiln_gemv_bench_bytes(const kiln_gemv_bench *b);
int kiln_gemv_bench_copies(const kiln_gemv_bench *b);
void kiln_gemv_bench_close(kiln_gemv_bench *b);

/* The attention kernels alone (`kiln bench --attention`, src/kv/kv_bench.c): the `isa` kernel
 * (KILN_ISA_AUTO: the process default) over a synthetic KV of `layers` × `kv_heads` slices of
 * `head_dim`, `ctx` positions in 16-token pages in shuffled order, `rows` query rows per call (a GQA
 * group), each layer's heads spread over `threads` threads as a decode step spreads them, the caches
 * flushed with a 64 MB write before each pass. Each of `rounds` rounds times one pass with the fused
 * KV integrity hash off, then one with it on: ns_off[r] / ns_on[r] in wall-clock ns per position
 * and KV head. */
kiln_status kiln_attend_bench(kiln_isa isa, kiln_kv_dtype dtype, int layers, int kv_heads, int head_dim, int ctx, int rows, int rounds,
                              int threads, double *ns_off, double *ns_on);

/* Utility: a monotonic clock in seconds. */
double kiln_now(void);

#ifdef __cplusplus
}
#endif
#endif
