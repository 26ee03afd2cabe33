/* scheduler.h — the serving engine: one scheduler thread that owns the KV pool, the prefix cache
 * and the running batch (continuous batching, chunked prefill, prefix caching, preemption).
 *
 * Threads: any number of producer threads (the HTTP connection threads) create requests, submit
 * them and read their output; ONE scheduler thread runs the model. A request is shared through a
 * reference count: the submitter's and the engine's. The only fields the submitter writes after
 * submission are `cancel` (atomic); the scheduler publishes output events under req->mu.
 *
 * Per step the scheduler (1) drops cancelled / timed-out requests and frees their pages at once,
 * (2) admits waiting requests in arrival order while the batch and the KV pool have room, reusing
 * cached prefix pages, (3) gives every decoding request its one token and fills the rest of the
 * step's token budget with prompt chunks (chunked prefill), (4) runs one kiln_forward_batch and
 * samples every sequence that reached the end of its known tokens. When a sequence needs a page
 * and none is free (after evicting idle cached pages), the newest running request is preempted:
 * its pages are released and it goes back to the front of the queue to be recomputed later. */
#ifndef KILN_ENGINE_SCHEDULER_H
#define KILN_ENGINE_SCHEDULER_H
#include "kiln.h"
#include "kv/kv.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define KILN_MAX_TOP_LOGPROBS 20

typedef enum {
    KILN_FINISH_NONE = 0,
    KILN_FINISH_STOP,      /* EOS sampled */
    KILN_FINISH_LENGTH,    /* max_tokens or the context reached */
    KILN_FINISH_CANCELLED, /* the submitter cancelled (disconnect, stop string, timeout) */
    KILN_FINISH_ERROR      /* engine error or shutdown; see err */
} kiln_finish;

typedef struct kiln_token_event {
    int32_t id;
    float logprob;                       /* log-softmax of the logits after bias / penalties (when logprobs wanted) */
    double t;                            /* kiln_now() when sampled */
} kiln_token_event;

/* Most stop_token_ids one request may give. */
#define KILN_MAX_STOP_IDS 16
typedef struct kiln_req kiln_req;
struct kiln_req {
    /* ---- set by the submitter before kiln_engine_submit_all, read-only afterwards ---- */
    int32_t *toks;        /* [n_prompt + max_tokens] prompt, then generated ids (scheduler writes) */
    int n_prompt, max_tokens;
    int ignore_eos;
    int32_t stop_ids[KILN_MAX_STOP_IDS]; /* ids that end this request besides the model's end ids
                                            (stop_token_ids); not masked by ignore_eos */
    int n_stop_ids;
    int top_logprobs;     /* -1 = no logprobs; 0..20 = logprob of the sampled token + that many */
    int prompt_logprobs;  /* -1 = none (default); 0..20: the log-probability of every prompt token
                             after the first, under the model's raw logits (no bias, penalties or
                             temperature: vLLM's prompt_logprobs), + that many alternatives; set by
                             kiln_req_want_prompt_logprobs. Such a request computes its whole prompt
                             (it takes no cached prefix pages until they are recorded). */
    kiln_sampler *sampler;
    double deadline;      /* kiln_now() time after which the request is cancelled (0 = none) */
    struct kiln_jg *grammar; /* structured output (json_grammar.h): owned, freed with the request; NULL = none */
    const int32_t *forced; /* test hook (kiln serve --test-forced-output): output token k < n_forced is
                              forced[k] whatever the logits say (borrowed; outlives the request) */
    int n_forced;
    int spec_k, spec_ngram; /* speculative decoding by prompt lookup (docs/SPECULATIVE.md): up to spec_k
                               drafted tokens per step from the longest earlier match of the last
                               1..spec_ngram tokens; 0 = off */
    int spec_mtp;         /* 1: the spec_k drafts come from the model's MTP layer instead (engine/mtp.h;
                             kiln_engine_mtp_ok says whether the engine can) */
    kiln_req *share_from; /* n > 1 siblings: the first choice (same prompt); this request is admitted
                             once that one has computed its prompt, so the prompt's full pages
                             come from the prefix cache. Holds a reference (dropped with this one). */
    /* ---- output: written by the scheduler under mu, read by the submitter ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kiln_token_event *ev; /* [max_tokens] */
    int32_t *top_ids;     /* [max_tokens × top_logprobs] */
    float *top_lp;        /* [max_tokens × top_logprobs] */
    float *plp;           /* prompt_logprobs >= 0: [n_prompt] plp[i] = log P(toks[i] | toks[0..i)), i >= 1 */
    int32_t *prank;       /* [n_prompt] prank[i]: toks[i]'s rank among the vocabulary there (1 = the most likely) */
    int32_t *ptop_ids;    /* [n_prompt × prompt_logprobs] the alternatives at position i (row i; row 0 unused) */
    float *ptop_lp;       /* [n_prompt × prompt_logprobs] */
    int plp_done;         /* 1 once plp is whole (set under mu before the first event is published;
                             the arrays are not written after that) */
    int n_ev;
    int timed_out;        /* finished because the deadline passed */
    int cached_tokens;    /* prompt tokens reused from the prefix cache at first admission (-1 = not admitted yet) */
    kiln_finish finish;
    kiln_status err;
    char err_msg[256];
    double t_arrival, t_first;
    /* Called by the scheduler thread under mu after each published event and at the finish, so a
     * submitter that does not sleep on cv (the server's suspended connections) learns of output.
     * Set before submission; the submitter may clear it (under mu) before it lets go of notify_arg.
     * It must not block nor take locks held while mu is taken. NULL = none. */
    void (*notify)(void *arg);
    void *notify_arg;
    /* ---- control ---- */
    atomic_int cancel;    /* set by the submitter; the scheduler frees the pages on its next step */
    atomic_int refs;
    /* ---- scheduler-private ---- */
    uint64_t arrival;     /* submission order: preemption picks the highest */
    int n_toks;           /* tokens known: prompt + generated */
    int n_computed;       /* of those, positions whose KV is stored */
    kiln_kv_seq seq;
    uint64_t *hashes;     /* [pages of n_prompt + max_tokens] chain hash of each full page */
    int n_hashed;         /* full pages hashed and offered to the prefix cache */
    int preempted;
    int heals;            /* integrity heals since r's last clean step (gives up after 8) */
    int announced;        /* tensor parallel: the other ranks know of r (its arrival was in a step message) */
    int spec_d;           /* drafts in this step's batch (positions n_computed + 1 ...; toks holds them past n_toks) */
    struct kiln_mtp *mtp; /* spec_mtp: the request's MTP drafter (the MTP layer's KV at its pages in the
                             engine's draft pool, the target's hidden rows), made at admission; NULL = none */
    int mtp_marked;       /* full pages whose MTP rows the prefix cache knows are whole (pages 0.. of seq) */
    kiln_req *prev, *next;/* waiting list */
    struct kiln_jg_state *gstate; /* the grammar's parser state after the generated tokens */
};

/* Gives r (before submission) the grammar its output must follow (json_grammar.h); r owns g from
 * then on, also on failure (KILN_ERR_NOMEM). */
kiln_status kiln_req_set_grammar(kiln_req *r, struct kiln_jg *g);
/* Creates a request for n_prompt ids (copied) that may generate up to max_tokens; the sampler is
 * created from sp. The caller holds one reference. */
kiln_status kiln_req_create(const int32_t *prompt, int n_prompt, int max_tokens, const kiln_sampling *sp, int vocab,
                            int top_logprobs, kiln_req **out);
void kiln_req_unref(kiln_req *r);
/* Asks r (before submission) for its prompt's log-probabilities with k alternatives (0..20);
 * KILN_ERR_NOMEM when the arrays cannot be had. */
kiln_status kiln_req_want_prompt_logprobs(kiln_req *r, int k);

typedef struct kiln_engine_config {
    int max_batch;        /* sequences in the running batch */
    int max_queue;        /* requests beyond a full batch; kiln_engine_submit_all refuses when
                             max_batch + max_queue requests are queued or running */
    int step_tokens;      /* token budget of one forward step (decodes + prefill chunks) */
    int prefix_cache;     /* 1 = reuse cached prefix pages */
    int spec_max_batch;   /* requests speculate only while at most this many are running (0 = 2: docs/SPECULATIVE.md, "When speculation stops paying in a batch") */
} kiln_engine_config;

/* A consistent snapshot published by the scheduler after each step. */
typedef struct kiln_engine_stats {
    int waiting, running, batch_seqs, batch_tokens;
    int kv_pages_total, kv_pages_free, kv_pages_cached_idle, kv_pages_used; /* used = held by requests */
    int page_tokens;
    int64_t kv_capacity_tokens;
    uint64_t steps, prompt_tokens, cached_tokens, generated_tokens, prefill_tokens;
    uint64_t preemptions, evictions, pc_queried_pages, pc_hit_pages;
    uint64_t spec_steps, spec_drafted, spec_accepted; /* speculative decoding: verifications (a request's
                                                          step with drafts), drafted and accepted tokens */
    uint64_t finished[5]; /* by kiln_finish */
    uint64_t batch_hist[8]; /* steps with 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64-127, 128+ sequences */
    uint64_t batch_seq_sum; /* sequences summed over the steps (the histogram's _sum) */
    /* latency histograms (seconds), cumulative counts per upper bound, + sum and count */
    uint64_t ttft_b[16], itl_b[16];
    uint64_t ttft_n, itl_n;
    double ttft_sum, itl_sum;
    kiln_kv_integrity_stats integ; /* KV integrity counters of the pool (mode OFF: all zero) */
    /* tensor / expert parallelism (docs/SCALE.md): ranks (1: one process) and, under --ep, the
     * (token, expert) pairs routed to each rank's experts (rank 0 routes every token, so it counts
     * every rank's load without asking); at most KILN_MAX_EP_METRICS ranks are listed */
    int tp_ranks, ep_ranks;
#define KILN_MAX_EP_METRICS 64
    uint64_t ep_load[KILN_MAX_EP_METRICS];
} kiln_engine_stats;
extern const double kiln_latency_bounds[16]; /* upper bounds in seconds (last = +Inf) */

typedef struct kiln_engine kiln_engine;
kiln_status kiln_engine_create(kiln_model *m, const kiln_options *o, const kiln_engine_config *cfg, kiln_engine **out);
/* Stops the scheduler (every request still queued or running finishes with KILN_FINISH_ERROR) and
 * frees the engine. */
void kiln_engine_free(kiln_engine *e);
/* Submits the n requests of one API call (its n choices) together: all are queued, or none.
 * QUEUE_FULL when n more would exceed max_batch + max_queue queued or running, TOO_LONG when one can
 * never fit (prompt + max_tokens vs context / KV pool), SHUTDOWN once closed; `why` receives the
 * reason. On success the engine holds a reference of its own to each. */
typedef enum { KILN_SUBMIT_OK = 0, KILN_SUBMIT_QUEUE_FULL, KILN_SUBMIT_TOO_LONG, KILN_SUBMIT_SHUTDOWN } kiln_submit_result;
kiln_submit_result kiln_engine_submit_all(kiln_engine *e, kiln_req *const *rs, int n, char *why, size_t why_len);
/* Asks the scheduler to drop r as soon as possible (its pages are freed on the next step). */
void kiln_engine_cancel(kiln_engine *e, kiln_req *r);
/* Refuses new submissions from now on. */
void kiln_engine_close(kiln_engine *e);
/* Stops the scheduler thread: every request still queued or running finishes with
 * KILN_FINISH_ERROR ("shutting down") and all pages go back to the pool. Idempotent; the engine
 * stays valid (submit refuses, cancel is harmless) until kiln_engine_free. */
void kiln_engine_stop(kiln_engine *e);
void kiln_engine_get_stats(kiln_engine *e, kiln_engine_stats *s);
/* Tensor parallelism (docs/SCALE.md, "kiln serve under mpirun"). On rank 0 of a sharded model
 * (kiln_model_shard, kiln_dist_size() > 1) kiln_engine_create's scheduler tells the other ranks,
 * at the start of every step, which requests were dropped and which arrived; every rank then runs
 * the same admission, batching, preemption and pool operations on its own shard and KV pool, so
 * page ids, allocation epochs and integrity seals agree without being sent. Rank 0 samples and
 * broadcasts each step's tokens; KV integrity failures and bad pages are combined over the ranks
 * (a heal on one rank replays on all). The other ranks run kiln_engine_follow until rank 0's engine
 * stops (KILN_OK) or is lost (an error). timeout_s: seconds without a message from rank 0 (it sends
 * one at least every second) after which rank 0 counts as lost (0 = never). */
kiln_status kiln_engine_follow(kiln_model *m, const kiln_options *o, const kiln_engine_config *cfg, double timeout_s);
/* 1 once a rank was lost (a collective missed its deadline): every request got an error, no new
 * one is accepted, and the process should exit non-zero (kiln_dist_abort). */
int kiln_engine_failed(kiln_engine *e);
int kiln_engine_context(const kiln_engine *e);   /* max tokens of one sequence */
int kiln_engine_ranks(const kiln_engine *e);     /* processes the model is sharded over (1: none) */
/* Whether requests may draft with the model's MTP layer (spec_mtp): the model ships one (under --tp
 * it is sharded like the decoder layers and every rank runs it; rank 0's drafts are broadcast). */
int kiln_engine_mtp_ok(const kiln_engine *e);
int64_t kiln_engine_kv_capacity(const kiln_engine *e);
/* The pool's configuration (read-only: dtype, dims, page size) and where FP8 scales came from. */
const kiln_kv_pool *kiln_engine_pool(const kiln_engine *e);
const char *kiln_engine_kv_source(const kiln_engine *e);
#endif
