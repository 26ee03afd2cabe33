/* bench_api.c — what `kiln bench` needs beyond running sessions: the machine's read bandwidth,
 * quantizing the output head too (the bench quantizes every linear layer), and the bytes of weights
 * a batch-1 decode step reads. */
#include "model/arch.h"
#include "model/model.h"
#include "base/status.h"
#include "quant/quantize.h"
#include <stdlib.h>
#include <string.h>


kiln_status kiln_model_requantize_head(kiln_model *m, const char *weights) {
    kiln_wformat fmt;
    int group = 0;
    if (strcmp(weights, "f32") == 0) fmt = KILN_WF_F32;
    else if (strcmp(weights, "bf16") == 0) fmt = KILN_WF_BF16;
    else if (strcmp(weights, "fp8") == 0) { fmt = KILN_WF_FP8_BLOCK; group = 128; }
    else if (strcmp(weights, "int4") == 0 || strcmp(weights, "int4-g32") == 0) { fmt = KILN_WF_INT4_GROUP; group = 32; }
    else if (strcmp(weights, "int4-g128") == 0) { fmt = KILN_WF_INT4_GROUP; group = 128; }
    else return kiln_fail(KILN_ERR_INVALID_ARG, "--weights '%s' is not one of f32, bf16, fp8, int4 (= int4-g32), int4-g128", weights);
    if ((m->output.fmt == fmt && (fmt != KILN_WF_INT4_GROUP || m->output.block == group)) || (fmt == KILN_WF_INT4_GROUP && m->output.cols % group))
        return KILN_OK;
    kiln_weight q;
    void *d = NULL, *s = NULL;
    KILN_TRY(kiln_quantize_weight(&m->output, fmt, group, &q, &d, &s));
    if (!kiln_model_own(m, d)) { free(s); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    if (s && !kiln_model_own(m, s)) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (kiln_weight_prefers_tiled(&q)) (void)kiln_weight_tile(&q, d, s); /* as requant.c does */
    m->output = q; /* the embedding lookup keeps reading tok_embd */
    (void)kiln_model_note_copy(m, "lm_head", d, (size_t)q.rows * q.row_bytes);
    if (s) (void)kiln_model_note_copy(m, "lm_head (scales)", s, kiln_weight_bytes(&q) - (size_t)q.rows * q.row_bytes);
    return KILN_OK;
}

/* Bytes of weights one batch-1 decode step reads: every projection of every layer and the output
 * head, and for MoE layers only the num_experts_per_tok experts a token is routed to (one token reads
 * exactly that many distinct experts) plus the router and the shared experts. The embedding row
 * lookup (dim values) is negligible and not counted. */
uint64_t kiln_model_decode_weight_bytes(const kiln_model *m) {
    uint64_t b = kiln_weight_bytes(&m->output);
    if (!m->arch) {
        for (int l = 0; l < m->hp.n_layers; l++) {
            const kiln_layer *L = &m->layers[l];
            const kiln_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int i = 0; i < 7; i++) b += kiln_weight_bytes(ws[i]);
        }
        return b;
    }
    const kiln_arch_model *am = m->arch_state;
    for (int l = 0; l < m->hp.n_layers; l++) {
        const kiln_arch_layer *L = &am->layers[l];
        const kiln_weight *ws[] = {&L->wqkv, &L->wq, &L->wk, &L->wv, &L->wo, &L->mla.wq_a, &L->mla.wq_b, &L->mla.wq,
                                   &L->mla.wkv_a, &L->mla.wo, &L->w_gate_up, &L->w_gate, &L->w_up, &L->w_down,
                                   &L->moe.router, &L->moe.sh_gate, &L->moe.sh_up, &L->moe.sh_down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
            if (ws[i]->data) b += kiln_weight_bytes(ws[i]);
        if (L->mla.ukt) /* absorbed per-head float32 copies of kv_b read in decode */
            for (int h = 0; h < m->hp.n_heads; h++) b += kiln_weight_bytes(&L->mla.ukt[h]) + kiln_weight_bytes(&L->mla.uv[h]);
        if (L->is_moe && L->exp_w) {
            int E = am->hp.moe.n_experts;
            uint64_t all = 0;
            for (int e = 0; e < 3 * E; e++) all += kiln_weight_bytes(&L->exp_w[e]);
            b += all / (uint64_t)E * (uint64_t)am->hp.moe.n_used; /* experts are equal-sized */
        }
    }
    return b;
}

double kiln_model_bench_linear_step(const kiln_model *m, int reps) {
    if (m->arch || reps < 1) return 0.0;
    const kiln_hparams *hp = &m->hp;
    const size_t qd = (size_t)hp->n_heads * (size_t)hp->head_dim, kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    size_t widest = (size_t)(hp->ffn_dim > hp->dim ? hp->ffn_dim : hp->dim);
    if (qd > widest) widest = qd;
    float *x = malloc(widest * sizeof *x), *a = malloc(widest * sizeof *a), *b = malloc(widest * sizeof *b),
          *c = malloc(kvd * sizeof *c), *d = malloc(kvd * sizeof *d), *lg = malloc((size_t)hp->vocab * sizeof *lg);
    double mean = 0.0;
    if (x && a && b && c && d && lg) {
        for (size_t i = 0; i < widest; i++) x[i] = (float)((int)(i % 7) - 3) * 0.25f; /* any finite activation */
        double t0 = kiln_now();
        for (int r = 0; r < reps; r++) {
            for (int l = 0; l < hp->n_layers; l++) {
                const kiln_layer *L = &m->layers[l];
                const kiln_weight *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gu[2] = {&L->w_gate, &L->w_up};
                float *yq[3] = {a, c, d}, *yg[2] = {a, b};
                kiln_matmul_many(qkv, yq, 3, x, 1);
                kiln_matmul(&L->wo, x, b, 1);
                kiln_matmul_many(gu, yg, 2, x, 1);
                kiln_matmul(&L->w_down, x, b, 1);
            }
            kiln_matmul(&m->output, x, lg, 1);
        }
        mean = (kiln_now() - t0) / reps;
    }
    free(x); free(a); free(b); free(c); free(d); free(lg);
    return mean;
}
