/* sampler.c — greedy, temperature, top-k and top-p (nucleus) sampling with a seeded xorshift RNG,
 * and the logit processors applied before them: logit bias, repetition penalty (HF / vLLM: prompt
 * and generated tokens), frequency and presence penalty (OpenAI: generated tokens only).
 *
 * Penalty state is per sampler (one sampler per sequence): count[V] generated occurrences of each
 * token and seen[] the distinct tokens of prompt ∪ generated, so applying the penalties touches
 * only those tokens' logits, never the whole vocabulary. */
#include "kiln.h"
#include "base/status.h"
#include "kernels/gemv.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kiln_sampler {
    kiln_sampling p;
    int vocab;
    uint64_t rng;
    float *probs;
    int32_t *idx;
    /* logit processors (all NULL / 0 when none is on) */
    int active;          /* any processor on */
    int32_t *bias_ids;   /* [n_bias] */
    float *bias;         /* [n_bias] */
    int n_bias;
    uint32_t *count;     /* [V] times each token was generated */
    uint8_t *flags;      /* [V] bit 0: in seen[]; bit 1: in the prompt */
    int32_t *seen;       /* [V] distinct tokens of the prompt and the output, first-seen order */
    int n_seen;
    float *work;         /* [V] kiln_sample's copy of the logits */
};

void kiln_sampling_default(kiln_sampling *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->seed = 42;
}

kiln_status kiln_sampler_create(const kiln_sampling *p, int vocab, kiln_sampler **out) {
    *out = NULL;
    if (!(p->temperature >= 0.0f) || p->temperature > 100.0f) return kiln_fail(KILN_ERR_INVALID_ARG, "temperature %g is out of range [0, 100]", p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) return kiln_fail(KILN_ERR_INVALID_ARG, "top_p %g is out of range (0, 1]", p->top_p);
    if (p->top_k < 0) return kiln_fail(KILN_ERR_INVALID_ARG, "top_k %d is negative", p->top_k);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) return kiln_fail(KILN_ERR_INVALID_ARG, "min_p %g is out of range [0, 1]", p->min_p);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return kiln_fail(KILN_ERR_INVALID_ARG, "presence_penalty %g / frequency_penalty %g must be finite", p->presence_penalty, p->frequency_penalty);
    if (!(p->repetition_penalty >= 0.0f) || !isfinite(p->repetition_penalty))
        return kiln_fail(KILN_ERR_INVALID_ARG, "repetition_penalty %g must be > 0 (0 = off)", p->repetition_penalty);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && (!p->logit_bias_ids || !p->logit_bias)))
        return kiln_fail(KILN_ERR_INVALID_ARG, "logit_bias: %d entries without arrays", p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias_ids[i] < 0 || p->logit_bias_ids[i] >= vocab)
            return kiln_fail(KILN_ERR_INVALID_ARG, "logit_bias[%d]: token id %d is out of range [0, %d)", i, p->logit_bias_ids[i], vocab);
        if (!isfinite(p->logit_bias[i])) return kiln_fail(KILN_ERR_INVALID_ARG, "logit_bias[%d]: value %g is not finite", i, p->logit_bias[i]);
    }
    kiln_sampler *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->p.logit_bias_ids = NULL; /* the caller's arrays are not kept */
    s->p.logit_bias = NULL;
    int pen = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f || (p->repetition_penalty != 0.0f && p->repetition_penalty != 1.0f);
    s->active = pen || p->n_logit_bias > 0;
    s->vocab = vocab;
    s->rng = p->seed ? p->seed : 0x9E3779B97F4A7C15ull;
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    int oom = !s->probs || !s->idx;
    if (s->active) {
        s->work = malloc((size_t)vocab * sizeof *s->work);
        oom |= !s->work;
    }
    if (p->n_logit_bias > 0) {
        s->bias_ids = malloc((size_t)p->n_logit_bias * sizeof *s->bias_ids);
        s->bias = malloc((size_t)p->n_logit_bias * sizeof *s->bias);
        oom |= !s->bias_ids || !s->bias;
        if (!oom) {
            memcpy(s->bias_ids, p->logit_bias_ids, (size_t)p->n_logit_bias * sizeof *s->bias_ids);
            memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
            s->n_bias = p->n_logit_bias;
        }
    }
    if (pen) {
        s->count = calloc((size_t)vocab, sizeof *s->count);
        s->flags = calloc((size_t)vocab, 1);
        s->seen = malloc((size_t)vocab * sizeof *s->seen);
        oom |= !s->count || !s->flags || !s->seen;
    }
    if (oom) { kiln_sampler_free(s); return kiln_fail(KILN_ERR_NOMEM, "out of memory for a sampler over %d tokens", vocab); }
    *out = s;
    return KILN_OK;
}

void kiln_sampler_free(kiln_sampler *s) {
    if (!s) return;
    free(s->probs);
    free(s->idx);
    free(s->bias_ids); free(s->bias); free(s->count); free(s->flags); free(s->seen); free(s->work);
    free(s);
}

static void mark_seen(kiln_sampler *s, int32_t id, uint8_t bit) {
    if (!(s->flags[id] & 1)) s->seen[s->n_seen++] = id;
    s->flags[id] |= (uint8_t)(1 | bit);
}

kiln_status kiln_sampler_prompt(kiln_sampler *s, const int32_t *ids, size_t n) {
    if (!s->flags) return KILN_OK;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->vocab) return kiln_fail(KILN_ERR_INVALID_ARG, "sampler prompt[%zu]: token id %d is out of range [0, %d)", i, ids[i], s->vocab);
        mark_seen(s, ids[i], 2);
    }
    return KILN_OK;
}

void kiln_sampler_accept(kiln_sampler *s, int32_t id) {
    if (!s->flags || id < 0 || id >= s->vocab) return;
    s->count[id]++;
    mark_seen(s, id, 0);
}

void kiln_sampler_apply(kiln_sampler *s, float *logits) {
    if (!s->active) return;
    /* vLLM order: logit bias first (a logits processor), then the penalties */
    for (int i = 0; i < s->n_bias; i++) logits[s->bias_ids[i]] += s->bias[i];
    if (!s->flags) return;
    float rp = s->p.repetition_penalty, fp = s->p.frequency_penalty, pp = s->p.presence_penalty;
    int rep = rp != 0.0f && rp != 1.0f;
    for (int i = 0; i < s->n_seen; i++) { /* every token of the prompt or the output, once */
        int32_t t = s->seen[i];
        float x = logits[t];
        if (rep) x = x > 0 ? x / rp : x * rp;
        uint32_t c = s->count[t];
        if (c > 0) x -= fp * (float)c + pp;
        logits[t] = x;
    }
}

static float rand_f32(uint64_t *st) { /* xorshift64*, top 24 bits → [0, 1) */
    *st ^= *st >> 12; *st ^= *st << 25; *st ^= *st >> 27;
    return (float)((*st * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *p = ctx;
    float x = p[*(const int32_t *)a], y = p[*(const int32_t *)b];
    return x > y ? -1 : x < y ? 1 : (*(const int32_t *)a - *(const int32_t *)b);
}

/* The sampling distribution of logits (temperature > 0): probs[idx[0 .. n)] are the candidates that
 * survive top-k / top-p / min-p (unnormalised among themselves: divide by their sum); returns n. */
static int distribution(kiln_sampler *s, const float *logits) {
    int V = s->vocab;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) { s->probs[i] = expf((logits[i] - mx) / s->p.temperature); sum += s->probs[i]; }
    for (int i = 0; i < V; i++) { s->probs[i] = (float)(s->probs[i] / sum); s->idx[i] = i; }
    int n = V;
    if (s->p.top_k > 0 || s->p.top_p < 1.0f || s->p.min_p > 0.0f) {
        qsort_r(s->idx, (size_t)V, sizeof *s->idx, cmp_desc, s->probs);
        if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
        if (s->p.top_p < 1.0f) {
            double c = 0;
            for (int i = 0; i < n; i++) { c += s->probs[s->idx[i]]; if (c >= s->p.top_p) { n = i + 1; break; } }
        }
        if (s->p.min_p > 0.0f) { /* relative to the most likely token: unchanged by the cuts above */
            const float thr = s->p.min_p * s->probs[s->idx[0]];
            for (int i = 1; i < n; i++)
                if (s->probs[s->idx[i]] < thr) { n = i; break; }
        }
    }
    return n;
}

static int32_t sample_core(kiln_sampler *s, const float *logits) {
    if (s->p.temperature == 0.0f) /* greedy: first maximum, as llama2.c's argmax (vectorised) */
        return (int32_t)kiln_argmax_f32(logits, s->vocab);
    const int n = distribution(s, logits);
    double total = 0;
    for (int i = 0; i < n; i++) total += s->probs[s->idx[i]];
    double r = rand_f32(&s->rng) * total, c = 0;
    for (int i = 0; i < n; i++) { c += s->probs[s->idx[i]]; if (r < c) return s->idx[i]; }
    return s->idx[n - 1];
}

/* kiln_sample_verify on logits the processors were applied to. */
static int32_t verify_core(kiln_sampler *s, const float *logits, int32_t draft, int *accepted) {
    if (s->p.temperature == 0.0f) {
        const int32_t t = (int32_t)kiln_argmax_f32(logits, s->vocab);
        *accepted = t == draft;
        return t;
    }
    const int n = distribution(s, logits);
    double total = 0, pd = 0;
    for (int i = 0; i < n; i++) {
        total += s->probs[s->idx[i]];
        if (s->idx[i] == draft) pd = s->probs[draft];
    }
    /* keep the draft with probability p(draft) = pd / total */
    if (pd > 0 && (double)rand_f32(&s->rng) * total < pd) {
        *accepted = 1;
        return draft;
    }
    *accepted = 0;
    /* rejected: p with the draft removed, renormalised (the residual max(p − q, 0) of a one-hot q) */
    const double rest = total - pd;
    if (!(rest > 0)) return draft; /* p is all on the draft: the branch above always keeps it */
    double r = rand_f32(&s->rng) * rest, c = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (s->idx[i] == draft) continue;
        last = s->idx[i];
        c += s->probs[last];
        if (r < c) return last;
    }
    return last;
}

int32_t kiln_sample_verify(kiln_sampler *s, const float *logits, int32_t draft, int *accepted) {
    const float *l = logits;
    if (s->active) {
        memcpy(s->work, logits, (size_t)s->vocab * sizeof *s->work);
        kiln_sampler_apply(s, s->work);
        l = s->work;
    }
    const int32_t t = verify_core(s, l, draft, accepted);
    kiln_sampler_accept(s, t);
    return t;
}

int32_t kiln_sample_pick(kiln_sampler *s, const float *logits) { return sample_core(s, logits); }

int32_t kiln_sample_verify_applied(kiln_sampler *s, const float *logits, int32_t draft, int *accepted) {
    const int32_t t = verify_core(s, logits, draft, accepted);
    kiln_sampler_accept(s, t);
    return t;
}

int32_t kiln_sample_applied(kiln_sampler *s, const float *logits) {
    int32_t t = sample_core(s, logits);
    kiln_sampler_accept(s, t);
    return t;
}

int32_t kiln_argmax(const float *logits, int n) { return n > 0 ? (int32_t)kiln_argmax_f32(logits, n) : 0; }

int32_t kiln_sample(kiln_sampler *s, const float *logits) {
    if (!s->active) return sample_core(s, logits); /* no processors: exactly the plain sampler */
    memcpy(s->work, logits, (size_t)s->vocab * sizeof *s->work);
    kiln_sampler_apply(s, s->work);
    return kiln_sample_applied(s, s->work);
}
