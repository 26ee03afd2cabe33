/* kiln.h — the public API of the kiln inference engine.
 *
 * Everything a front end (the `kiln` CLI, the HTTP server, an embedding program) needs, and nothing
 * more: opaque handles for models, engines (sessions over a KV cache) and samplers, an options
 * struct with documented defaults, and status codes with a human-readable message.
 *
 * Error convention: every fallible call returns a kiln_status; on failure a one-line message that
 * names the file / field / offset / parameter at fault is available from kiln_last_error() (per
 * thread). Library code never exits or aborts on bad input. */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_IO,            /* a file could not be opened / read / written */
    KILN_ERR_FORMAT,        /* a file is malformed (bad magic, truncated, bad offset, bad field) */
    KILN_ERR_INVALID_ARG,   /* a caller-supplied argument or option is invalid */
    KILN_ERR_NOMEM,         /* an allocation failed */
    KILN_ERR_UNSUPPORTED,   /* valid input kiln does not handle (arch, dtype, quant method) */
    KILN_ERR_KV_EXHAUSTED,  /* the KV budget cannot hold the sequence */
    KILN_ERR_INTEGRITY,     /* a KV page or weight failed its integrity check (strict mode) */
    KILN_ERR_INTERNAL
} kiln_status;

/* The message of the last failure on this thread ("" if none). */
const char *kiln_last_error(void);
const char *kiln_status_name(kiln_status st);

typedef struct kiln_model kiln_model;     /* weights + hyper-parameters + tokenizer (read-only) */
typedef struct kiln_session kiln_session; /* one sequence's state over a KV cache */

/* ---- options ---------------------------------------------------------------------------------- */
typedef enum { KILN_KV_AUTO = 0, KILN_KV_F32, KILN_KV_BF16, KILN_KV_FP8 } kiln_kv_dtype;
typedef enum { KILN_ISA_AUTO = 0, KILN_ISA_SCALAR, KILN_ISA_AVX2, KILN_ISA_AVX512 } kiln_isa;
/* FP8 KV scales (see the KV block below and docs/KV.md). */
typedef enum { KILN_KV_SCALE_STATIC = 0, KILN_KV_SCALE_DYNAMIC } kiln_kv_scale_mode;

typedef struct kiln_options {
    int threads;            /* compute threads; 0 = all online CPUs (default 0) */
    kiln_isa isa;           /* kernel family; AUTO = best the CPU supports at run time (default) */
    kiln_kv_dtype kv_dtype; /* KV storage; AUTO = the model's activation dtype (F32 for F32 models,
                               BF16 otherwise) (default AUTO) */
    int64_t kv_mem_bytes;   /* KV budget in bytes; 0 = enough for one full context (default 0) */
    int kv_page_tokens;     /* tokens per KV page (default 16) */
    int max_context;        /* 0 = the model's max_position_embeddings / seq_len (default 0) */
    /* KV cache (issue 4). Appended fields; zero = default. */
    kiln_kv_scale_mode kv_scale_mode; /* FP8 only: STATIC = one scale per (layer, KV head) (default);
                               DYNAMIC = one per (page, layer, KV head) in the page metadata */
    const char *kv_scales_path; /* FP8 static scales file to use; NULL = the checkpoint's k_scale /
                               v_scale tensors, else kv_scales.json beside the model, else a
                               built-in calibration pass at session start (default NULL) */
    int quiet;              /* 1 = no start-up summary on stderr from kiln_session_create (default 0) */
} kiln_options;

/* Fills *o with the defaults documented above. */
void kiln_options_default(kiln_options *o);

/* ---- models ----------------------------------------------------------------------------------- */
/* Loads a model: a llama2.c checkpoint (.bin, tokenizer from a tokenizer*.bin beside it), a Hugging
 * Face directory (config.json + *.safetensors [+ tokenizer.json]), a GGUF file, or a directory that
 * holds exactly one of these. Weights are memory-mapped read-only. */
kiln_status kiln_model_load(const char *path, const kiln_options *opts, kiln_model **out);
void kiln_model_free(kiln_model *m);

typedef struct kiln_model_info {
    const char *arch;       /* "llama", ... */
    int vocab_size, dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, max_context;
    int bos_id, eos_id;     /* -1 when the model has none */
    int has_tokenizer;
    uint64_t weight_bytes;
} kiln_model_info;
void kiln_model_get_info(const kiln_model *m, kiln_model_info *info);

/* Human-readable (json=0) or JSON (json=1) description: architecture, hyper-parameters, every
 * tensor's name, dtype and shape, total weight bytes. */
kiln_status kiln_model_describe(const kiln_model *m, FILE *f, int json);

/* Writes the model as a Hugging Face directory (config.json, model.safetensors, tokenizer files). */
kiln_status kiln_model_save_hf(const kiln_model *m, const char *dir);
/* Writes the model as a GGUF v3 file. */
kiln_status kiln_model_save_gguf(const kiln_model *m, const char *path);

/* Synthetic checkpoints: deterministic random weights in the HF layout with real tensor names.
 * spec: "preset=tiny" or "dim=..,ffn=..,layers=..,heads=..,kv_heads=..,vocab=..,seq=.." pairs.
 * dtype: "f32" or "bf16". */
kiln_status kiln_mkmodel(const char *arch, const char *spec, const char *dtype, uint64_t seed,
                         const char *out_dir);

/* ---- tokenizer -------------------------------------------------------------------------------- */
/* Encodes UTF-8 text (rejects invalid UTF-8 with KILN_ERR_INVALID_ARG). add_bos prepends BOS.
 * Writes at most cap ids; *n_out receives the number needed. */
kiln_status kiln_tokenize(const kiln_model *m, const char *text, size_t len, int add_bos,
                          int32_t *ids, size_t cap, size_t *n_out);
/* The bytes of token `id` as they appear after `prev` (handles SentencePiece's leading-space
 * stripping after BOS and <0xNN> byte tokens). Returns NULL for an invalid id. *len receives the
 * byte count (may be 0, e.g. for special tokens). */
const char *kiln_token_piece(const kiln_model *m, int32_t prev, int32_t id, size_t *len);

/* ---- sessions --------------------------------------------------------------------------------- */
kiln_status kiln_session_create(kiln_model *m, const kiln_options *opts, kiln_session **out);
void kiln_session_free(kiln_session *s);
/* Appends n tokens to the sequence and runs them through the model. If logits != NULL it receives
 * n × vocab floats (row-major, one row per token); otherwise only the last row is computed and is
 * available from kiln_session_logits(). */
kiln_status kiln_session_eval(kiln_session *s, const int32_t *tokens, int n, float *logits);
const float *kiln_session_logits(const kiln_session *s); /* [vocab] of the last evaluated token */
int kiln_session_length(const kiln_session *s);
void kiln_session_reset(kiln_session *s);

/* ---- KV cache (src/kv, src/engine/session.c; docs/KV.md) -------------------------------------- */
typedef struct kiln_kv_info {
    kiln_kv_dtype dtype;
    const char *dtype_name;     /* "f32", "bf16", "fp8_e4m3" */
    kiln_kv_scale_mode scale_mode;
    int n_layers, n_kv_heads, k_dim, v_dim, v_shares_k;
    int page_tokens;
    uint64_t bytes_per_token;   /* KV data per token, all layers, K and V */
    uint64_t page_data_bytes;   /* page_tokens × bytes_per_token */
    uint64_t page_meta_bytes;   /* per-page metadata (header, free-list slot, dynamic scales) */
    uint64_t page_bytes;        /* data + metadata: what one page costs in the budget */
    uint64_t pool_fixed_bytes;  /* per-pool metadata (static scales) */
    int64_t mem_bytes;          /* the budget */
    int64_t n_pages;
    int64_t capacity_tokens;    /* n_pages × page_tokens */
    int max_context;            /* the session's context limit */
    char scale_source[512];     /* where FP8 scales come / would come from; "none" for f32/bf16 */
} kiln_kv_info;

/* The KV pool a session with these options would get, without allocating it or running any
 * calibration (what `kiln inspect --kv` prints). Errors: bad page size, budget below one page. */
kiln_status kiln_kv_plan(const kiln_model *m, const kiln_options *opts, kiln_kv_info *out);
/* The live session's pool (scale_source says what was actually used). */
void kiln_session_kv_info(const kiln_session *s, kiln_kv_info *out);

/* Calibration: runs tokens[0..n) through the model in windows of `window` tokens (0 = the model's
 * context), each window from an empty F32 KV cache, and max-accumulates the absolute value of every
 * stored K and V value per (layer, KV head) into kamax / vamax [n_layers × n_kv_heads] (zero them
 * first). */
kiln_status kiln_kv_measure_amax(kiln_model *m, const kiln_options *opts, const int32_t *tokens, size_t n,
                                 int window, float *kamax, float *vamax);
/* The same pass, also returning the K smoothing statistics (docs/KV.md): kmean [n_layers ×
 * n_kv_heads × head_dim] per-channel mean of K, and kamax_centered [n_layers × n_kv_heads] the amax
 * of K − kmean. kmean / kamax_centered may be NULL. */
kiln_status kiln_kv_measure_stats(kiln_model *m, const kiln_options *opts, const int32_t *tokens, size_t n,
                                  int window, float *kamax, float *vamax, float *kmean, float *kamax_centered);
/* Writes a kv_scales.json: per layer and KV head, scale = max(amax, 1e-6) × margin / 448 for K and
 * V. With kmean (not NULL; ignored for MLA latent caches) the file also carries the K smoothing
 * means and the K scales come from kamax_centered. `source` is recorded (e.g. the data file). */
kiln_status kiln_kv_scales_write(const kiln_model *m, const char *path, const float *kamax, const float *vamax,
                                 const float *kmean, const float *kamax_centered, float margin, const char *source,
                                 uint64_t n_tokens);
/* The default kv_scales.json path beside the model (its directory). */
void kiln_kv_scales_default_path(const kiln_model *m, char *buf, size_t cap);

/* Benchmarks only: extends the sequence to n_tokens positions without running the model; the new
 * positions' KV rows are copies of the rows already stored (cyclically), so decode at that context
 * reads a realistic cache. The sequence must hold at least one token. */
kiln_status kiln_session_kv_fill(kiln_session *s, int n_tokens);

/* ---- sampling --------------------------------------------------------------------------------- */
typedef struct kiln_sampling {
    float temperature; /* 0 = greedy (default 1.0) */
    int top_k;         /* 0 = off (default 0) */
    float top_p;       /* 1.0 = off (default 1.0) */
    uint64_t seed;     /* default 42 */
} kiln_sampling;
void kiln_sampling_default(kiln_sampling *p);
typedef struct kiln_sampler kiln_sampler;
kiln_status kiln_sampler_create(const kiln_sampling *p, int vocab, kiln_sampler **out);
void kiln_sampler_free(kiln_sampler *s);
int32_t kiln_sample(kiln_sampler *s, const float *logits);

/* ---- weight integrity ------------------------------------------------------------------------ */
/* Every tensor gets an XXH3-64 checksum of its bytes at load. kiln_model_check_weights recomputes
 * them over the memory the kernels read (a RAM bit flip or a modified mapped file shows up as a
 * mismatch); on a mismatch it returns KILN_ERR_INTEGRITY naming the tensor. */
kiln_status kiln_model_check_weights(const kiln_model *m);
/* Compares the load-time checksums with the manifest beside the model (kiln.checksums.json in a
 * model directory, FILE.checksums.json beside a single file); write_manifest=1 (re)writes it.
 * Prints one line per mismatching or missing tensor to `report`; *n_bad receives their count. */
kiln_status kiln_model_verify(const kiln_model *m, int write_manifest, FILE *report, int *n_bad);

/* ==== engine / server (issue 7: src/engine/scheduler.c, src/server/, docs/SERVER.md) ========== */
/* An OpenAI-compatible HTTP server over one model: HTTP threads parse and stream, one scheduler
 * thread owns the KV pool and runs continuous batching with chunked prefill and prefix caching. */
typedef struct kiln_server_options {
    const char *host;         /* address to bind (default "127.0.0.1") */
    int port;                 /* default 8080; 0 = any free port (see kiln_server_port) */
    const char *api_key;      /* required as "Authorization: Bearer KEY" on /v1 routes; NULL = none */
    const char *model_name;   /* id served in /v1/models; NULL = the model path's base name */
    int max_batch;            /* sequences in the running batch (default 32) */
    int max_queue;            /* requests waiting beyond the batch before 429 (default 64) */
    int step_tokens;          /* token budget of one step: decodes + prefill chunks (default 256) */
    int prefix_cache;         /* 1 = reuse KV pages of repeated prompt prefixes (default 1) */
    size_t max_body_bytes;    /* largest request body (default 1 MiB) → 413 */
    double request_timeout_s; /* per request, queue wait included (default 600) → 504 */
    double shutdown_grace_s;  /* in-flight requests may finish this long on stop (default 10) */
    int max_connections;      /* open HTTP connections (default 512) */
    int quiet;                /* 0 = one start-up summary on stderr */
} kiln_server_options;
void kiln_server_options_default(kiln_server_options *o);

typedef struct kiln_server kiln_server;
/* Starts serving m (which must outlive the server) in background threads. */
kiln_status kiln_server_start(kiln_model *m, const char *model_path, const kiln_options *opts,
                              const kiln_server_options *so, kiln_server **out);
int kiln_server_port(const kiln_server *s);
/* Graceful stop: stop accepting, let in-flight requests finish for up to shutdown_grace_s, cancel
 * the rest, free everything. */
void kiln_server_stop(kiln_server *s);

/* Utility: a monotonic clock in seconds. */
double kiln_now(void);

/* ---- evaluation (src/eval, src/engine/session_util.c; used by `kiln eval`) ---------------------- */
/* Rolls the sequence back to its first n tokens (0 <= n <= length) so another continuation can be
 * evaluated after a shared prefix without recomputing it. kiln_session_logits() is stale until the
 * next kiln_session_eval. n = 0 is kiln_session_reset. */
kiln_status kiln_session_truncate(kiln_session *s, int n);

/* Re-quantizes, in memory, the linear layers of every transformer block (attention and MLP
 * projections; embeddings and the output head keep their stored dtype): weights = "f32", "bf16",
 * "fp8" (E4M3, 128x128 block scales) or "int4" (symmetric, group 32, compressed-tensors packing).
 * A weight whose input dimension is not a multiple of the INT4 group keeps its stored format and is
 * counted in *n_kept (may be NULL). Sessions created afterwards use the new weights. */
kiln_status kiln_model_requantize(kiln_model *m, const char *weights, int *n_kept);

typedef struct kiln_eval_params {
    const char *data_dir;        /* the evaluation sets (../shared/data layout); required for named tasks */
    long limit;                  /* examples per task (per subject for mmlu); 0 = all (default 0) */
    int shots;                   /* few-shot examples; -1 = the task's default (default -1) */
    long max_tokens;             /* ppl / kl: tokens of the text to score; 0 = all (default 0) */
    int window;                  /* ppl / kl: tokens per window; 0 = the context length (default 0) */
    int stride;                  /* ppl / kl: new tokens scored per window; 0 = window / 2 (default 0) */
    int max_gen;                 /* gsm8k: tokens generated per question (default 256) */
    int strict;                  /* a malformed data line fails the task instead of being skipped */
    const char *save_logits;     /* kl: write the log-probabilities of every scored position here */
    const char *baseline_logits; /* kl: compare against a file written by save_logits */
    /* Called as work advances (done of total units of the current task); may be NULL. */
    void (*progress)(void *ud, const char *task, long done, long total);
    /* Called for every warning (a skipped malformed line, a truncated prompt); NULL = stderr. */
    void (*warn)(void *ud, const char *msg);
    void *ud;
} kiln_eval_params;
void kiln_eval_params_default(kiln_eval_params *p);

/* One result: task "arc_easy", sub "" (or the MMLU subject), name "acc", value, examples counted. */
typedef struct kiln_eval_metric {
    char task[64];
    char sub[64];
    char name[32];
    double value;
    long n;
} kiln_eval_metric;

/* The task names kiln_eval_run knows, as one human-readable comma-separated line. */
const char *kiln_eval_known_tasks(void);
/* KILN_OK if `task` is a known task name ("ppl:FILE", "kl", "kl:FILE", "arc_easy", ...); otherwise
 * KILN_ERR_INVALID_ARG with a message that lists the known ones. */
kiln_status kiln_eval_check_task(const char *task);
/* Runs one task on a fresh session over m. *metrics (malloc'ed, caller frees) receives *n_metrics
 * results. Deterministic: the same model, options and params give the same numbers. */
kiln_status kiln_eval_run(kiln_model *m, const kiln_options *opts, const char *task, const kiln_eval_params *p,
                          kiln_eval_metric **metrics, int *n_metrics);

#ifdef __cplusplus
}
#endif
#endif
