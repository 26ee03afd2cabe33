/* sampler.c — greedy, temperature, top-k and top-p (nucleus) sampling with a seeded xorshift RNG. */
#include "kiln.h"
#include "base/status.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kiln_sampler {
    kiln_sampling p;
    int vocab;
    uint64_t rng;
    float *probs;
    int32_t *idx;
};

void kiln_sampling_default(kiln_sampling *p) {
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
    kiln_sampler *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->vocab = vocab;
    s->rng = p->seed ? p->seed : 0x9E3779B97F4A7C15ull;
    s->probs = malloc((size_t)vocab * sizeof *s->probs);
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    if (!s->probs || !s->idx) { kiln_sampler_free(s); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    *out = s;
    return KILN_OK;
}

void kiln_sampler_free(kiln_sampler *s) {
    if (!s) return;
    free(s->probs);
    free(s->idx);
    free(s);
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

int32_t kiln_sample(kiln_sampler *s, const float *logits) {
    int V = s->vocab;
    if (s->p.temperature == 0.0f) { /* greedy: first maximum, as llama2.c's argmax */
        int32_t best = 0;
        for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) { s->probs[i] = expf((logits[i] - mx) / s->p.temperature); sum += s->probs[i]; }
    for (int i = 0; i < V; i++) { s->probs[i] = (float)(s->probs[i] / sum); s->idx[i] = i; }
    int n = V;
    if (s->p.top_k > 0 || s->p.top_p < 1.0f) {
        qsort_r(s->idx, (size_t)V, sizeof *s->idx, cmp_desc, s->probs);
        if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
        if (s->p.top_p < 1.0f) {
            double c = 0;
            for (int i = 0; i < n; i++) { c += s->probs[s->idx[i]]; if (c >= s->p.top_p) { n = i + 1; break; } }
        }
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += s->probs[s->idx[i]];
    double r = rand_f32(&s->rng) * total, c = 0;
    for (int i = 0; i < n; i++) { c += s->probs[s->idx[i]]; if (r < c) return s->idx[i]; }
    return s->idx[n - 1];
}
