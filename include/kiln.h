/* kiln.h — the public API of the kiln inference engine.
 *
 * Everything a front end (the `kiln` CLI, the HTTP server, an embedding program) needs, and nothing
 * more: opaque handles for models, engines (sessions over a KV cache) and samplers, an options
 * struct with documented defaults, and status codes with a human-readable message.
 *
 * Error convention: every fallible call returns a kiln_status; on failure a one-line message that
 * names the file / field / offset / parameter at fault is available from kiln_last_error() (per
 * thread). Library code never exits or aborts on bad input.
 *
 * Benchmark, fault-injection and test hooks are not part of this API: they are in kiln_test.h. */
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
typedef struct kiln_tokenizer kiln_tokenizer;
typedef struct kiln_session kiln_session; /* one sequence's state over a KV cache */

/* ---- options ---------------------------------------------------------------------------------- */
typedef enum { KILN_KV_AUTO = 0, KILN_KV_F32, KILN_KV_BF16, KILN_KV_FP8 } kiln_kv_dtype;
typedef enum { KILN_ISA_AUTO = 0, KILN_ISA_SCALAR, KILN_ISA_AVX2, KILN_ISA_AVX512 } kiln_isa;
/* Most end-of-generation token ids a model carries (kiln_model_info.eos_ids). */
#define KILN_MAX_EOS 8
/* Compute backend of a session or engine (src/backend/backend.h). */
typedef enum { KILN_BACKEND_CPU = 0, KILN_BACKEND_REF = 1, KILN_BACKEND_VULKAN = 2 } kiln_backend_kind;
/* FP8 KV scales (see the KV block below and docs/KV.md). */
typedef enum { KILN_KV_SCALE_STATIC = 0, KILN_KV_SCALE_DYNAMIC } kiln_kv_scale_mode;
/* KV integrity mode (see the KV integrity block below and docs/INTEGRITY.md). DEFAULT = HEAL. */
/* FP8 K smoothing (docs/KV.md): DEFAULT = the mean of the stored (post-RoPE) keys when calibrated
 * scales carry one; PREROPE = the mean of the pre-RoPE keys, rotated to each key's position (Llama
 * RoPE over the whole head, FP8 static scales; attention adds q·R(pos)·mean back to each score);
 * OFF = no smoothing (means in a scales file are refused). */
typedef enum { KILN_KV_SMOOTH_DEFAULT = 0, KILN_KV_SMOOTH_PREROPE, KILN_KV_SMOOTH_OFF } kiln_kv_smooth;
typedef enum { KILN_KV_INTEGRITY_DEFAULT = 0, KILN_KV_INTEGRITY_OFF, KILN_KV_INTEGRITY_DETECT, KILN_KV_INTEGRITY_HEAL,
               KILN_KV_INTEGRITY_STRICT } kiln_kv_integrity;

typedef struct kiln_options {
    int threads;            /* compute threads; 0 = all online CPUs (default 0) */
    kiln_isa isa;           /* kernel family; AUTO = best the CPU supports at run time (default) */
    kiln_kv_dtype kv_dtype; /* KV storage; AUTO = the model's activation dtype (F32 for F32 models,
                               BF16 otherwise) (default AUTO) */
    int64_t kv_mem_bytes;   /* KV budget in bytes; 0 = enough for one full context (default 0) */
    int kv_page_tokens;     /* tokens per KV page (default 16) */
    int max_context;        /* 0 = the model's max_position_embeddings / seq_len (default 0) */
    /* KV cache. Appended fields; zero = default. */
    kiln_kv_scale_mode kv_scale_mode; /* FP8 only: STATIC = one scale per (layer, KV head) (default);
                               DYNAMIC = one per (page, layer, KV head) in the page metadata */
    const char *kv_scales_path; /* FP8 static scales file to use; NULL = the checkpoint's k_scale /
                               v_scale tensors, else kv_scales.json beside the model, else a
                               built-in calibration pass at session start (default NULL) */
    int quiet;              /* 1 = no start-up summary on stderr from kiln_session_create (default 0) */
    /* KV integrity. Appended fields; zero = default. */
    kiln_kv_integrity kv_integrity; /* off | detect | heal | strict (default HEAL) */
    const char *kv_inject_faults;   /* fault-injection SPEC for tests and demonstrations, e.g.
                               "bitflip=10,stale=2,every=4" (see kiln_kv_inject_spec_help); NULL = none */
    /* Weights. Appended field; zero = default. */
    int no_repack;          /* 1 = compute on FP8/INT4 weights in their memory-mapped checkpoint layout;
                               0 (default) = at the first session, copy them into the 4-row tile layout
                               the AVX-512 GEMV reads as one stream (same bytes; docs/FORMATS.md) */
    /* FP8 K smoothing. Appended field; zero = default (post-RoPE mean when calibrated). */
    kiln_kv_smooth kv_smooth;
    /* Compute. Appended fields; zero = default. */
    kiln_backend_kind backend; /* CPU (default): the SIMD kernels; REF: the scalar reference, one thread;
                               VULKAN: SPIR-V compute on a Vulkan device (docs/VULKAN.md) */
    int fp8_gemv;           /* activation form of the FP8 GEMV and of the BF16 / FP8 GEMM of steps of
                               several tokens: 0 = auto (bf16 activations and vdpbf16ps on CPUs with
                               AVX512_BF16 unless KILN_FP8_EXACT=1), 1 = exact f32 activations (f32
                               tiles for prefill), 2 = bf16 (default 0) */
    int device_index;       /* VULKAN: which device (`--device vulkan:N`, the order kiln_list_devices
                               prints) (default 0) */
} kiln_options;

/* Writes one line per compute device kiln can use besides the CPU (Vulkan devices: "vulkan:N  NAME
 * (TYPE, ...)") to f. KILN_ERR_UNSUPPORTED when there is none or the build has no Vulkan. */
kiln_status kiln_list_devices(FILE *f);

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
    /* Appended: every token id that ends generation (eos_id is the first). GLM-4.x lists three in
     * generation_config.json (<|endoftext|>, <|user|>, <|observation|>). */
    int n_eos;
    int eos_ids[KILN_MAX_EOS];
} kiln_model_info;
/* 1 when id is one of info's end-of-generation ids. */
int kiln_model_is_eos(const kiln_model_info *info, int id);
void kiln_model_get_info(const kiln_model *m, kiln_model_info *info);

/* Tensor parallelism (docs/SCALE.md): turns a loaded model into rank `rank` of `tp` shards (its
 * heads, FFN rows and the matching projection slices; hyper-parameters divided), before its first
 * session. The shard's forward pass needs the ranks' partial sums added: fn(ctx, x, n) must replace
 * x[0, n) by the sum over the ranks (kiln's MPI one: kiln_dist_allreduce_sum in src/dist). */
/* ep = tp: expert parallelism as well (MoE models): the routed experts are spread whole over the
 * same ranks instead of split in width (ep = 1). */
kiln_status kiln_model_shard(kiln_model *m, int rank, int tp, int ep);
void kiln_model_set_allreduce(kiln_model *m, void (*fn)(void *ctx, float *x, int64_t n), void *ctx);
/* The shard's LM head holds rows [rank·V/tp, (rank+1)·V/tp) (vocabulary-parallel) when its format
 * can be cut by rows: fn(ctx, part, rows, V, out) must assemble on rank 0 the logits out[rows, V]
 * from every rank's part [rows, its columns] (kiln's MPI one: kiln_dist_gather_vocab). Every rank
 * computes the head for the same rows. */
void kiln_model_set_logits_gather(kiln_model *m, void (*fn)(void *ctx, const float *part, int rows, int64_t vocab, float *out), void *ctx);

/* ---- scale-out: processes of one model over MPI (src/dist, docs/SCALE.md) ---------------------- */
/* Starts MPI (MPI_Init_thread, errors returned rather than aborting). Fails when the build has no
 * MPI. Call once, before anything else uses MPI. */
kiln_status kiln_dist_init(int *argc, char ***argv);
int kiln_dist_rank(void);   /* 0 when not started */
int kiln_dist_size(void);   /* 1 when not started */
/* x[0, n) = the sum over the ranks of every rank's x (in place): the tensor-parallel partial sums
 * of a row-parallel projection (kiln_model_set_allreduce's function; ctx unused). A failure or a
 * missed deadline is reported on stderr and kept (kiln_dist_failed): x is then not the sum, and the
 * caller must discard the step's output. */
void kiln_dist_allreduce_sum(void *ctx, float *x, int64_t n);
/* Rank 0's out[rows, vocab] = the ranks' parts side by side: rank r's part [rows, its columns
 * [r·vocab/N, (r+1)·vocab/N)] (kiln_model_set_logits_gather's function; ctx unused; out is only
 * written on rank 0). A failure or missed deadline is kept as for kiln_dist_allreduce_sum. */
void kiln_dist_gather_vocab(void *ctx, const float *part, int rows, int64_t vocab, float *out);
/* The same, with out assembled on every rank (kiln eval --tp: every rank takes rank 0's decisions). */
void kiln_dist_allgather_vocab(void *ctx, const float *part, int rows, int64_t vocab, float *out);
/* v[0, n) of rank 0 to every rank. */
kiln_status kiln_dist_bcast_i32(int32_t *v, int n);
/* Every rank gives `value` for `what`; KILN_ERR_INVALID_ARG naming the first rank whose value
 * differs from rank 0's (e.g. another model file or --tp), on every rank. */
kiln_status kiln_dist_agree(const char *what, const char *value);
/* MPI_Finalize when started. */
void kiln_dist_finalize(void);
/* This rank's step collectives so far: seconds inside the all-reduces and logits gathers (waiting
 * for the slowest rank included); all-reduce calls and bytes reduced. */
void kiln_dist_stats(double *seconds, unsigned long long *calls, unsigned long long *bytes);
/* 1 when this build has MPI. */
int kiln_dist_built(void);
/* Seconds a collective may wait for the other ranks before the job counts a rank as dead or hung
 * (`--tp-timeout`; 0 = forever, the default). After such a failure kiln_dist_failed() is 1, every
 * later collective returns at once, and kiln_dist_failure() says which call and rank. */
void kiln_dist_set_deadline(double seconds);
int kiln_dist_failed(void);
const char *kiln_dist_failure(void);
/* MPI_Abort(code): ends every rank of the job (after a failure: MPI_Finalize would wait forever). */
void kiln_dist_abort(int code);


/* Human-readable (json=0) or JSON (json=1) description: architecture, hyper-parameters, every
 * tensor's name, dtype and shape, total weight bytes. */
kiln_status kiln_model_describe(const kiln_model *m, FILE *f, int json);

/* Writes the model as a Hugging Face directory (config.json, model.safetensors, tokenizer files). */
kiln_status kiln_model_save_hf(const kiln_model *m, const char *dir);
/* Gives the model the tokenizer t (the model owns it from then on; a tokenizer it had is freed):
 * for writing checkpoints that lacked one (kiln convert --tokenizer). Fails, leaving t with the
 * caller, when t has more entries than the model's vocabulary. BOS / EOS ids the model lacked are
 * taken from t. */
kiln_status kiln_model_set_tokenizer(kiln_model *m, kiln_tokenizer *t);
/* Writes the model as a GGUF v3 file. */
kiln_status kiln_model_save_gguf(const kiln_model *m, const char *path);
/* As kiln_model_save_gguf, with outtype (llama.cpp's convert_hf_to_gguf.py --outtype): NULL or
 * "auto" keeps every tensor's type; "q8_0" / "q4_0" encode every 2-D float tensor whose columns are
 * a multiple of 32 (embeddings and output head included, as llama-quantize --pure) in that GGUF
 * block type with ggml's reference quantizer; norms and other 1-D tensors stay as stored. */
kiln_status kiln_model_save_gguf_as(const kiln_model *m, const char *path, const char *outtype);

/* Re-quantizes the linear layers (weights "fp8": 128×128 block FP8 E4M3; "int4": compressed-tensors
 * pack-quantized, group 32 or 128) within scope ("all", "mlp", "experts") and writes a Hugging Face
 * directory with quantization_config. progress=1 draws a progress line on stderr. */
kiln_status kiln_model_quantize_save(const kiln_model *m, const char *dir, const char *weights, int group,
                                     const char *scope, int progress);

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
    /* DeepSeek sparse attention models (deepseek_v32, glm_moe_dsa): the K row is [latent (dsa_latent)
     * | rope part (dsa_rope) | indexer key (dsa_index_key)], stored compact (docs/DSA.md): latent and
     * indexer key as FP8 E4M3 codes with an f32 scale per 128 values, the rope part in `dtype`
     * (f32 or bf16); dsa_row_bytes per token per layer with an indexer; dsa_key_layers of the
     * n_layers have one (the others reuse a selection and store rows without the key). dsa_fp8:
     * --kv-dtype fp8 was asked and gives this layout with a bf16 rope part (SGLang's / vLLM's). All 0
     * for other models. */
    int dsa_latent, dsa_rope, dsa_index_key, dsa_row_bytes, dsa_key_layers, dsa_fp8;
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
 * of K − kmean. kmean / kamax_centered may be NULL. With opts->kv_smooth = PREROPE (Llama RoPE over
 * the whole head only) kmean is the mean of the keys before RoPE and kamax_centered the amax of
 * K − R(pos)·kmean (two passes over the tokens). */
kiln_status kiln_kv_measure_stats(kiln_model *m, const kiln_options *opts, const int32_t *tokens, size_t n,
                                  int window, float *kamax, float *vamax, float *kmean, float *kamax_centered);
/* Writes a kv_scales.json: per layer and KV head, scale = max(amax, 1e-6) × margin / 448 for K and
 * V. With kmean (not NULL; ignored for MLA latent caches) the file also carries the K smoothing
 * means and the K scales come from kamax_centered. `source` is recorded (e.g. the data file). */
kiln_status kiln_kv_scales_write(const kiln_model *m, const char *path, const float *kamax, const float *vamax,
                                 const float *kmean, const float *kamax_centered, float margin, const char *source,
                                 uint64_t n_tokens);
/* The same with the K smoothing mode recorded in the file's "k_smooth" field ("post" or "prerope";
 * kmean then holds the pre-RoPE means kiln_kv_measure_stats returns under opts->kv_smooth = PREROPE). */
kiln_status kiln_kv_scales_write_mode(const kiln_model *m, const char *path, const float *kamax, const float *vamax,
                                      const float *kmean, const float *kamax_centered, float margin, const char *source,
                                      uint64_t n_tokens, kiln_kv_smooth mode);
/* The default kv_scales.json path beside the model (its directory). */
void kiln_kv_scales_default_path(const kiln_model *m, char *buf, size_t cap);

/* ---- sampling --------------------------------------------------------------------------------- */
typedef struct kiln_sampling {
    float temperature; /* 0 = greedy (default 1.0) */
    int top_k;         /* 0 = off (default 0) */
    float top_p;       /* 1.0 = off (default 1.0) */
    uint64_t seed;     /* default 42 */
    /* Logit processors (appended; 0 / NULL = off, so a zero-initialised tail keeps the old
     * behaviour bit for bit). Applied to the logits before temperature / top-k / top-p and before
     * greedy, in vLLM's order: logit bias, repetition penalty, frequency and presence penalty. */
    float presence_penalty;    /* logit[t] -= presence_penalty if t was generated (OpenAI [-2, 2]) */
    float frequency_penalty;   /* logit[t] -= frequency_penalty × times t was generated */
    float repetition_penalty;  /* HF / vLLM, over prompt AND generated tokens: logit > 0 ? logit / p
                                  : logit × p; 0 or 1 = off (the prompt: kiln_sampler_prompt) */
    int n_logit_bias;          /* entries of logit_bias_ids / logit_bias (copied at create) */
    const int32_t *logit_bias_ids; /* token ids in [0, vocab) */
    const float *logit_bias;   /* added to those tokens' logits */
    float min_p;               /* 0 = off: keep only tokens whose probability is at least min_p × the
                                  most likely token's (vLLM / llama.cpp min_p), after top-k / top-p */
} kiln_sampling;
void kiln_sampling_default(kiln_sampling *p); /* zeroes the whole struct first */
/* kiln_sampling_default, then the model's generation_config.json defaults (temperature, top_p,
 * top_k, repetition_penalty) where the file gives them: what the server uses for the fields a
 * request leaves out, as vLLM does. */
void kiln_model_default_sampling(const kiln_model *m, kiln_sampling *p);
typedef struct kiln_sampler kiln_sampler;
kiln_status kiln_sampler_create(const kiln_sampling *p, int vocab, kiln_sampler **out);
void kiln_sampler_free(kiln_sampler *s);
/* Samples the next token. With logit processors on it works on a copy of the logits and records
 * the token as generated (as kiln_sample_applied does). */
int32_t kiln_sample(kiln_sampler *s, const float *logits);
/* Speculative decoding's verification of one drafted token (docs/SPECULATIVE.md): the drafter
 * proposed `draft` deterministically (prompt lookup: a one-hot draft distribution), the target's
 * logits at that position are `logits`. Greedy (temperature 0): the argmax, *accepted = (it is the
 * draft). Sampling: the standard rejection rule for a one-hot draft — the draft is kept with the
 * probability p(draft) of the target distribution (after the logit processors, temperature, top-k,
 * top-p and min-p, exactly as kiln_sample builds it); otherwise a token is drawn from p with the
 * draft removed and renormalised. The returned token is distributed exactly as kiln_sample's, and
 * recorded as generated. */
int32_t kiln_sample_verify(kiln_sampler *s, const float *logits, int32_t draft, int *accepted);
/* Greedy pick without a sampler: the first index of the largest logit of logits[0, n) (NaNs never
 * chosen; llama2.c's argmax), vectorised. */
int32_t kiln_argmax(const float *logits, int n);
/* Speculative decoding's prompt-lookup drafter (src/engine/spec.c): the up to k tokens that followed
 * the most recent earlier occurrence of the longest suffix of ctx[0, n_ctx) of n_min..n_max tokens
 * that occurs earlier; written to out, their count returned (0: no match). */
int kiln_ngram_draft(const int32_t *ctx, int n_ctx, int n_min, int n_max, int k, int32_t *out);
/* The prompt tokens the repetition penalty also covers (no-op without it). */
kiln_status kiln_sampler_prompt(kiln_sampler *s, const int32_t *ids, size_t n);
/* Applies the logit processors in place; touches only the biased tokens and the tokens seen so
 * far (prompt and generated), not the whole vocabulary. No-op when none is on. */
void kiln_sampler_apply(kiln_sampler *s, float *logits);
/* Samples from logits already passed through kiln_sampler_apply and records the token. */
int32_t kiln_sample_applied(kiln_sampler *s, const float *logits);
/* Samples from logits already passed through kiln_sampler_apply without recording the token (a
 * grammar checks the pick first; kiln_sampler_accept records the one kept). */
/* kiln_sample_verify on logits the processors were already applied to (the server applies them in
 * place before its logprobs): the draft kept or replaced by the rejection rule, recorded. */
int32_t kiln_sample_verify_applied(kiln_sampler *s, const float *logits, int32_t draft, int *accepted);
int32_t kiln_sample_pick(kiln_sampler *s, const float *logits);
/* Records a generated token (counts for the presence / frequency / repetition penalties). */
void kiln_sampler_accept(kiln_sampler *s, int32_t id);

/* ---- weight integrity ------------------------------------------------------------------------ */
/* Every tensor gets an XXH3-64 checksum of its bytes at load. kiln_model_check_weights recomputes
 * them over the memory the kernels read (a RAM bit flip or a modified mapped file shows up as a
 * mismatch); on a mismatch it returns KILN_ERR_INTEGRITY naming the tensor. Weights the kernels read
 * from owned copies instead (requantized in memory, or FP8/INT4 repacked into the GEMV tile layout
 * at the first session) are checksummed when made and re-checked too, named as such. */
kiln_status kiln_model_check_weights(const kiln_model *m);
/* Compares the load-time checksums with the manifest beside the model (kiln.checksums.json in a
 * model directory, FILE.checksums.json beside a single file); write_manifest=1 (re)writes it.
 * Prints one line per mismatching or missing tensor to `report`; *n_bad receives their count. */
kiln_status kiln_model_verify(const kiln_model *m, int write_manifest, FILE *report, int *n_bad);

/* ---- KV integrity (src/kv/integrity.[ch], src/engine/session_integrity.c, docs/INTEGRITY.md) ---- */
/* Every KV page slice (page × layer × K/V × KV head) carries a seal binding its identity (model,
 * slot in the block table, positions, allocation epoch, token prefix) to its content (bytes and
 * scales). Attention verifies each page it reads in the step it reads it, before the values are
 * used; hand-offs (prefix reuse, copy-on-write, release) verify too. On a failure: DETECT counts and
 * logs; HEAL drops the bad page and every later position of the sequence and recomputes them from
 * the token history (greedy output identical to a fault-free run); STRICT fails the call with
 * KILN_ERR_INTEGRITY. */
typedef enum {
    KILN_KV_FAULT_BITFLIP = 0,   /* one bit of KV data */
    KILN_KV_FAULT_MULTIBIT,      /* 2..8 bits of one page slice's data */
    KILN_KV_FAULT_SCALE,         /* one bit of an FP8 scale (per-page dynamic, or the static table) */
    KILN_KV_FAULT_WRONG_PAGE,    /* a block-table entry names another live page */
    KILN_KV_FAULT_STALE_PAGE,    /* a page is freed under its sequence and reused by another one */
    KILN_KV_FAULT_LOST_WRITE,    /* the next row written to a page does not reach memory */
    KILN_KV_FAULT_PARTIAL_COPY,  /* the next copy-on-write copies only part of a page */
    KILN_KV_FAULT_KINDS
} kiln_kv_fault;
const char *kiln_kv_fault_name(kiln_kv_fault f);      /* "bitflip", "multibit", ... */
const char *kiln_kv_integrity_name(kiln_kv_integrity m); /* "off", "detect", "heal", "strict" */
/* "off" | "detect" | "heal" | "strict" → *out; KILN_ERR_INVALID_ARG otherwise. */
kiln_status kiln_kv_integrity_parse(const char *s, kiln_kv_integrity *out);
typedef struct kiln_kv_integrity_stats {
    kiln_kv_integrity mode;       /* resolved (never DEFAULT) */
    uint64_t seals;               /* page slices sealed (every stored row re-seals its slice) */
    uint64_t checks;              /* page-slice verifications (attention, stores, hand-offs, sweeps) */
    uint64_t bytes_verified;      /* bytes hashed by those verifications */
    uint64_t detections;          /* verifications that failed */
    uint64_t detected[4];         /* by diagnosis: content, scale, wrong_page, stale_page */
    uint64_t heals;               /* rollbacks (or scale-table restores) that repaired a failure */
    uint64_t healed_positions;    /* positions recomputed by heals */
    uint64_t strict_failures;     /* calls failed in strict mode */
    uint64_t swept_pages;         /* idle cached pages verified by the background sweep */
    uint64_t integrity_bytes;     /* memory the seals take */
    /* injection campaign (zero without injection) */
    uint64_t injected[KILN_KV_FAULT_KINDS];
    uint64_t injected_detected[KILN_KV_FAULT_KINDS];
    uint64_t detected_before_use[KILN_KV_FAULT_KINDS]; /* detected before any value of it was read */
    uint64_t false_alarms;        /* detections that match no injected fault */
    uint64_t integrity_ns;        /* time spent in integrity code (hashing, seeds, bookkeeping; the
                                     attention kernels it wraps excluded), summed over threads */
} kiln_kv_integrity_stats;
/* Counters of the session's KV pool (all zero with mode OFF). */
void kiln_session_kv_integrity(const kiln_session *s, kiln_kv_integrity_stats *out);
/* ---- engine / server (src/engine/scheduler.c, src/server/, docs/SERVER.md) ---------------------- */
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
    /* Hostile clients (docs/SERVER.md "Connections"). Appended fields; zero = default. */
    int max_conn_per_ip;      /* open connections from one client address (default 64) */
    double header_timeout_s;  /* absolute: from accept (or the end of the previous request) to the
                                 complete request headers; trickled bytes do not extend it (default 30) */
    double body_timeout_s;    /* absolute: from the headers to the complete body (default 60) */
    int http_threads;         /* request threads (epoll thread pool; default 4) */
    /* Tools and reasoning (docs/SERVER.md "Tools and reasoning"). Appended fields; NULL = default. */
    const char *tool_parser;      /* "auto" (default: from the chat template), "glm45" (also glm47,
                                     glm4_moe), "kimi_k2", "none" */
    const char *reasoning_parser; /* "auto" (default: "think" when the template mentions <think>),
                                     "think" (deepseek_r1 semantics; also deepseek_r1, glm45, kimi_k2),
                                     "none" */
    const char *cors_origin;      /* CORS: the Origin allowed to call the API from a browser
                                     ("*" = any); NULL = no CORS headers (browsers refuse cross-origin
                                     calls) */
    /* Speculative decoding by prompt lookup (docs/SPECULATIVE.md): spec_k > 0 drafts up to spec_k
     * tokens per step for every request (a request's "speculative" field overrides it), from the
     * longest earlier match of its last 1..spec_ngram tokens (0 = 3), while at most spec_max_batch
     * requests run (0 = 2, measured: docs/SPECULATIVE.md). */
    int spec_k, spec_ngram, spec_max_batch;
    int spec_mtp;                 /* 1: the drafts come from the model's MTP layer (`--spec mtp`; the
                                     model must ship one) instead of prompt lookup */
    const char *test_forced_output; /* test hook: every completion generates exactly the tokens of
                                     this text, then the model's end id (so that tests drive the
                                     parsers with the real format through the real tokenizer) */
} kiln_server_options;
void kiln_server_options_default(kiln_server_options *o);

typedef struct kiln_server kiln_server;
/* Starts serving m (which must outlive the server) in background threads. */
kiln_status kiln_server_start(kiln_model *m, const char *model_path, const kiln_options *opts,
                              const kiln_server_options *so, kiln_server **out);
int kiln_server_port(const kiln_server *s);
/* Tensor parallelism (docs/SCALE.md): ranks 1.. of a sharded model (kiln_model_shard) run this
 * instead of kiln_server_start, with the same options: they follow rank 0's scheduler step by step
 * until its server stops (KILN_OK) or rank 0 is lost (an error: no message for timeout_s seconds;
 * 0 = wait forever). */
kiln_status kiln_server_follow(kiln_model *m, const kiln_options *opts, const kiln_server_options *so, double timeout_s);
/* 1 once the server cannot serve any more (tensor parallel: a rank was lost): every request got
 * an error, new ones get 503; stop it and exit non-zero. */
int kiln_server_failed(const kiln_server *s);
/* Graceful stop: stop accepting, let in-flight requests finish for up to shutdown_grace_s, cancel
 * the rest, free everything. */
void kiln_server_stop(kiln_server *s);

/* ---- evaluation (src/eval, src/engine/session_util.c; used by `kiln eval`) ---------------------- */
/* Rolls the sequence back to its first n tokens (0 <= n <= length) so another continuation can be
 * evaluated after a shared prefix without recomputing it. kiln_session_logits() is stale until the
 * next kiln_session_eval. n = 0 is kiln_session_reset. */
kiln_status kiln_session_truncate(kiln_session *s, int n);

/* ---- speculative decoding with the model's MTP layer (src/engine/mtp.c; docs/SPECULATIVE.md) ---- */
/* Keeps the target's hidden states from now on so that kiln_session_mtp_draft can run the model's
 * first MTP layer (num_nextn_predict_layers). Call before the first evaluation; KILN_ERR_UNSUPPORTED
 * when the model ships no MTP layer. */
kiln_status kiln_session_spec_mtp(kiln_session *s);
/* Up to k greedy drafts of the tokens after `next` (the token chosen after the session's last
 * position, not yet evaluated) into drafts[0..*n_drafts); draft_logits [k, vocab] or NULL receives
 * each draft step's MTP logits. */
kiln_status kiln_session_mtp_draft(kiln_session *s, int32_t next, int k, int32_t *drafts, int *n_drafts, float *draft_logits);

/* ---- one sequence's speculative generation (src/engine/spec.c; kiln run / bench --spec) ---------- */
typedef enum {
    KILN_DRAFT_NONE = 0,  /* no drafts: plain decoding through the same loop (the baseline) */
    KILN_DRAFT_NGRAM,     /* prompt lookup (kiln_ngram_draft, n = 1 .. ngram_max) */
    KILN_DRAFT_MTP,       /* the model's MTP layer (kiln_session_spec_mtp first) */
    KILN_DRAFT_ORACLE,    /* measurement only: the known greedy continuation (every draft right) */
    KILN_DRAFT_WRONG      /* measurement only: the known continuation + 1 (every greedy draft wrong) */
} kiln_drafter_kind;
typedef struct {
    kiln_drafter_kind drafter;
    int k;                  /* drafts per step, 1..64 */
    int ngram_max;          /* NGRAM: longest suffix looked up */
    int vocab;              /* the model's vocabulary (kiln_model_info.vocab_size) */
    const int32_t *oracle;  /* ORACLE / WRONG: oracle[i] = the i-th generated token of a greedy run */
    int n_oracle;
} kiln_spec_cfg;
typedef struct {
    void *ud;
    void (*token)(void *ud, int32_t tok, long generated);          /* each generated token but an end token, in order */
    int (*rows)(void *ud, const float *rows, int n);               /* each verify step's kept logits rows [n, vocab]; nonzero = failed */
    int (*draft_rows)(void *ud, const float *rows, int n);         /* MTP: each step's draft logits [n, vocab]; nonzero = failed */
    /* Tensor parallelism (kiln run --tp): every rank runs the loop, its drafts (prompt lookup: from
     * the same tokens; MTP: the layer's forward, sharded like the others) and its forwards alike; the
     * leader samples and verifies, then share() sends the decided values (the first token; MTP: each
     * step's drafts; per step the accepted count and the next token) to the followers (follower =
     * 1), whose share() receives them: kiln_dist_bcast_i32. NULL: one process. */
    kiln_status (*share)(void *ud, int32_t *vals, int n);
    int follower;
} kiln_spec_hooks;
typedef struct { long generated, drafted, accepted, verifies; } kiln_spec_stats;
/* Generates up to n_gen tokens after the session's last position (prompt[0, n_prompt) = the context
 * so far, for prompt lookup) with drafts verified k + 1 at a time: the output distribution is
 * kiln_sample's exactly (greedy: the same tokens as decoding one at a time; docs/SPECULATIVE.md).
 * Stops at an end token (counted in generated, not passed to hooks->token), n_gen or the context. */
kiln_status kiln_spec_generate(kiln_session *s, kiln_sampler *smp, const kiln_model_info *info, const int32_t *prompt, int n_prompt,
                               long n_gen, const kiln_spec_cfg *cfg, const kiln_spec_hooks *hooks, kiln_spec_stats *stats);

/* Re-quantizes, in memory, the linear layers of every transformer block (attention and MLP
 * projections; embeddings and the output head keep their stored dtype): weights = "f32", "bf16",
 * "fp8" (E4M3, 128x128 block scales) or "int4" (symmetric, group 32, compressed-tensors packing).
 * A weight whose input dimension is not a multiple of the INT4 group keeps its stored format and is
 * counted in *n_kept (may be NULL). Sessions created afterwards use the new weights. */
kiln_status kiln_model_requantize(kiln_model *m, const char *weights, int *n_kept);
/* The same limited to a scope: "all" (as above) or "experts" (the routed experts of MoE layers). */
kiln_status kiln_model_requantize_scope(kiln_model *m, const char *weights, const char *scope, int *n_kept);

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


/* ---- tokenizers and chat templates (src/tokenizer/, src/model/chat_api.c, docs/TOKENIZERS.md) -- */
/* A tokenizer on its own (no weights): `kiln tokenize`, tools. */
/* path: a tokenizer.json / tokenizer_config.json / tiktoken.model / llama2.c tokenizer .bin / GGUF
 * file, a directory with tokenizer files, or a model kiln_model_load reads (its tokenizer). */
kiln_status kiln_tokenizer_load(const char *path, kiln_tokenizer **out);
void kiln_tokenizer_free(kiln_tokenizer *t);
int kiln_tokenizer_vocab_size(const kiln_tokenizer *t);
int kiln_tokenizer_bos(const kiln_tokenizer *t); /* -1 if none */
int kiln_tokenizer_eos(const kiln_tokenizer *t); /* -1 if none */
/* Encodes UTF-8 text; *ids is malloc'ed (free() it). add_bos: add BOS when the tokenizer's
 * configuration does (as kiln_tokenize). parse_special: special tokens written in the text
 * ("<|im_start|>") are those tokens (1: trusted text such as a rendered chat prompt) or plain text
 * (0: untrusted user text). */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, int add_bos,
                                  int parse_special, int32_t **ids, size_t *n);
/* The bytes token id decodes to (after prev, as kiln_token_piece); NULL for an invalid id. */
const char *kiln_tokenizer_piece(const kiln_tokenizer *t, int32_t prev, int32_t id, size_t *len);
/* The token as the vocabulary stores it ("Ġthe", "<|im_end|>"), NULL for an invalid id. */
const char *kiln_tokenizer_token(const kiln_tokenizer *t, int32_t id);
int kiln_tokenizer_is_special(const kiln_tokenizer *t, int32_t id);
/* The model's tokenizer (owned by the model), NULL if it has none. */
const kiln_tokenizer *kiln_model_tokenizer(const kiln_model *m);

/* Renders the model's own chat template (chat_template.jinja beside the model, else
 * tokenizer_config.json chat_template — its "tool_use" variant when tools are given and it has
 * one, else "default" — else the GGUF tokenizer.chat_template) the way Hugging Face transformers'
 * apply_chat_template does: variables messages, tools (None when tools_json is NULL), documents
 * (None), add_generation_prompt, the special tokens of tokenizer_config.json (bos_token,
 * eos_token, unk_token, pad_token, additional_special_tokens), then the members of extra_json (a
 * JSON object, e.g. {"enable_thinking": false}; may be NULL). messages_json: a JSON array of
 * message objects ({"role", "content", "tool_calls", "reasoning_content", ...}) passed as is (tool
 * call arguments stay strings or objects as given). *out: malloc'ed NUL-terminated text; it already
 * holds the BOS text where the template writes it, so encode it with add_bos = 0 and
 * parse_special = 1. Errors name the template line and construct (see docs/TOKENIZERS.md). */
kiln_status kiln_chat_render(const kiln_model *m, const char *messages_json, const char *tools_json,
                             int add_generation_prompt, const char *extra_json, char **out);
/* The source of the template kiln_chat_render uses (have_tools: the "tool_use" variant where the
 * tokenizer_config has one); *out malloc'ed. Fails as kiln_chat_render does when there is none. */
kiln_status kiln_chat_template_source(const kiln_model *m, int have_tools, char **out);
/* Adds the chat template's end-of-turn tokens to the model's end-of-generation ids (what `kiln
 * serve` stops at, as llama.cpp's end-of-generation tokens): the known turn markers of the GLM,
 * Kimi, DeepSeek, ChatML, Llama-3 and Gemma templates that are special tokens of the model's
 * vocabulary and appear in its template (model/chat_api.c lists them). Writes "name (id), ..." of
 * the ids added to note; returns how many were added. */
int kiln_model_add_turn_ends(kiln_model *m, char *note, size_t cap);
/* The same without loading weights: path is a model or tokenizer directory, a
 * tokenizer_config.json, a GGUF file, or a .jinja template file (then no special-token variables
 * unless extra_json gives them). template_path (may be NULL) replaces the template source. */
kiln_status kiln_chat_render_path(const char *path, const char *template_path, const char *messages_json,
                                  const char *tools_json, int add_generation_prompt, const char *extra_json,
                                  char **out);

#ifdef __cplusplus
}
#endif
#endif
