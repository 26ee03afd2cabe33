/* eval.h — the evaluation harness (internal): the language-model interface the scorers run on,
 * the pure scoring functions, the prompt formats of each task and the task runners.
 *
 * Everything above the eval_lm interface is independent of the engine, so the unit tests drive
 * the same runners with hand-made fake models whose answers are known in closed form. The engine
 * backend (lm.c) wraps a kiln_session. */
#ifndef KILN_EVAL_EVAL_H
#define KILN_EVAL_EVAL_H
#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

/* ---- the model as the harness sees it ------------------------------------------------------------ */
/* Rows of logits computed per backend call: bounds scratch memory to EVAL_PIECE × vocab floats
 * whatever the text length (a 150k vocabulary × 2k-token window would otherwise need 1.2 GB). */
#define EVAL_PIECE 64

typedef struct eval_lm {
    void *ctx;
    int vocab, n_ctx;
    int bos, eos;           /* -1 when none */
    int eos_ids[KILN_MAX_EOS], n_eos; /* every id that ends a generation (eos is the first) */
    /* Encodes text; *ids malloc'ed (caller frees). */
    kiln_status (*tokenize)(void *ctx, const char *text, size_t len, int add_bos, int32_t **ids, int *n);
    /* Bytes of token id after prev (NULL for an invalid id). */
    const char *(*piece)(void *ctx, int32_t prev, int32_t id, size_t *len);
    /* Appends n tokens; logits (n × vocab) receives every row when non-NULL. */
    kiln_status (*eval)(void *ctx, const int32_t *tok, int n, float *logits);
    /* [vocab] of the last token appended by eval(..., NULL). */
    const float *(*last_logits)(void *ctx);
    /* Keeps the first n tokens (n = 0: empty, must always work). KILN_ERR_UNSUPPORTED for
     * 0 < n < length when the backend cannot roll back exactly: eval_feed then starts over. */
    kiln_status (*truncate)(void *ctx, int n);
    int no_truncate;        /* set by eval_feed after an UNSUPPORTED roll-back */
    /* Kept by eval_feed: the tokens the backend holds now, and scratch rows. */
    int32_t *hist;
    int hist_len, hist_cap;
    float *rows;            /* [EVAL_PIECE × vocab] */
} eval_lm;

/* Receives the logits row of position pos (it predicts tok[pos + 1]). */
typedef kiln_status (*eval_row_fn)(void *ud, int pos, const float *logits);

/* Makes the backend hold exactly tok[0, n): keeps the longest common prefix with what it holds now,
 * but no more than `from` tokens, so that every position in [from, n) is computed in this call;
 * calls row() for those positions in order (row may be NULL: then only lm->last_logits() is valid).
 * Requires 0 <= from < n <= lm->n_ctx. */
kiln_status eval_feed(eval_lm *lm, const int32_t *tok, int n, int from, eval_row_fn row, void *ud);
/* Tokenizes into a malloc'ed array (wrapper over lm->tokenize). */
kiln_status eval_tokenize(eval_lm *lm, const char *text, int add_bos, int32_t **ids, int *n);
/* Frees what eval_feed allocated (not ctx). */
void eval_lm_release(eval_lm *lm);

/* The engine backend: a kiln_session over m with options o. eval_lm_session_free frees the session. */
kiln_status eval_lm_session(eval_lm *lm, kiln_model *m, const kiln_options *o);
void eval_lm_session_free(eval_lm *lm);

/* ---- scoring functions (score.c) ------------------------------------------------------------------ */
/* log softmax(logits)[target], computed in double with the max subtracted. */
double eval_logprob(const float *logits, int vocab, int32_t target);
/* out[i] = log softmax(logits)[i]. */
void eval_log_softmax(const float *logits, int vocab, float *out);
/* KL(P || Q) = Σ p·(log p − log q) from log-probabilities (nats). */
double eval_kl(const float *logp, const float *logq, int vocab);
/* Index of the largest value (the first one on ties, like numpy.argmax). */
int eval_argmax(const float *x, int n);
/* lm-evaluation-harness multiple choice: *pick = argmax ll (acc), *pick_norm = argmax ll / len
 * (acc_norm, len = the choice's length in bytes; a zero length counts as 1). */
void eval_mc_pick(const double *ll, const size_t *len, int n, int *pick, int *pick_norm);
/* The q-quantile (q in [0, 1]) of sorted[0, n) with linear interpolation between order statistics
 * (numpy.percentile's default); 0 for n = 0. */
double eval_quantile_sorted(const double *sorted, size_t n, double q);
/* Standard error of a mean of n values with sample variance var: sqrt(var / n); for accuracies
 * (0/1 values) lm-evaluation-harness's sqrt(p (1 − p) / (n − 1)). */
double eval_acc_stderr(double p, long n);

/* GSM8K answer extraction, the lm-evaluation-harness filters:
 *   strict, CoT exemplars:  first match of "The answer is (\-?[0-9\.\,]+)."
 *   strict, train exemplars: first match of "#### (\-?[0-9\.\,]+)"
 *   flexible: last match of "(-?[$0-9.,]{2,})|(-?[0-9]+)"
 * Return 1 and write the match (stripped) to out, or 0 when nothing matches. */
typedef enum { EVAL_GSM_COT = 0, EVAL_GSM_HASH = 1 } eval_gsm_style;
int eval_gsm8k_strict(const char *gen, eval_gsm_style style, char *out, size_t cap);
int eval_gsm8k_flexible(const char *gen, char *out, size_t cap);
/* The exact-match normalisation (regexes_to_ignore ",", "\$", "(?s).*#### ", "\.$" then
 * lower case), in place. */
void eval_gsm8k_normalize(char *s);
/* The reference answer of a GSM8K "answer" field (the text after the last "####", stripped and
 * normalised) into out; 0 when the field has no "####". */
int eval_gsm8k_target(const char *answer, char *out, size_t cap);
/* Where the generation stops: the offset of the first stop string in text (len if none). */
size_t eval_stop_at(const char *text, size_t len, const char *const *stops);

/* ---- prompts (prompts.c) --------------------------------------------------------------------------- */
/* A multiple-choice example: choice i is scored as the log-likelihood of cont[i] after ctx[i].
 * ctx[i] is the same for every i except in winogrande (partial evaluation). norm_len[i] is the
 * acc_norm length: the bytes of the choice text without the target delimiter. */
typedef struct eval_mc {
    int n_choices;
    char **ctx;
    char **cont;
    size_t *norm_len;
    int gold;
    int sub;                /* index into the task's subject list (mmlu), else 0 */
} eval_mc;
void eval_mc_free(eval_mc *e);

/* One MMLU row: question, four options, answer index 0..3. */
typedef struct eval_mmlu_row {
    char *q, *opt[4];
    int answer;
} eval_mmlu_row;

/* The lm-evaluation-harness MMLU prompt (malloc'ed): the description line about `subject`
 * (underscores shown as spaces), n_shots solved dev examples, then the question ending in
 * "Answer:". Choices are scored as " A", " B", " C", " D". */
char *eval_mmlu_prompt(const char *subject, const eval_mmlu_row *shots, int n_shots, const eval_mmlu_row *q);

/* Builds the example of one JSONL object of a task's data file. Returns 0 (and a reason in why)
 * when the object lacks a field or has a bad value. task: arc_easy, arc_challenge, piqa,
 * openbook_qa, winogrande. */
struct json_t;
int eval_mc_from_json(const char *task, struct json_t *obj, eval_mc *out, char *why, size_t why_cap);

/* The GSM8K 8-shot chain-of-thought exemplars (lm-evaluation-harness gsm8k-cot). */
#define EVAL_GSM8K_COT_N 8
extern const char *const eval_gsm8k_cot_q[EVAL_GSM8K_COT_N];
extern const char *const eval_gsm8k_cot_a[EVAL_GSM8K_COT_N];

/* ---- runners (tasks.c) ----------------------------------------------------------------------------- */
/* Growable result list. */
typedef struct eval_results {
    kiln_eval_metric *m;
    int n, cap;
} eval_results;
kiln_status eval_results_add(eval_results *r, const char *task, const char *sub, const char *name, double value, long n);

/* Runs `task` on lm. The file arguments of ppl:FILE / kl:FILE are taken as given, then relative
 * to p->data_dir. */
kiln_status eval_run_task(eval_lm *lm, const char *task, const kiln_eval_params *p, eval_results *r);

/* Reads a whole file (NUL-terminated, malloc'ed). */
kiln_status eval_read_file(const char *path, char **data, size_t *len);

/* Logits files of the kl task (logits.c): header, the scored target tokens, then float32
 * log-probabilities [n][vocab]. */
typedef struct eval_logits_file eval_logits_file;
kiln_status eval_logits_create(const char *path, int vocab, int window, int stride, eval_logits_file **out);
kiln_status eval_logits_open(const char *path, eval_logits_file **out);
/* Header fields of an opened file. */
void eval_logits_info(const eval_logits_file *f, int *vocab, int *window, int *stride, int64_t *n);
kiln_status eval_logits_write(eval_logits_file *f, int32_t target, const float *logp);
/* Reads the next row; KILN_ERR_FORMAT past the end. */
kiln_status eval_logits_read(eval_logits_file *f, int32_t *target, float *logp);
kiln_status eval_logits_close(eval_logits_file *f); /* NULL is fine; reports write errors */
#endif
