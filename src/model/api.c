/* api.c — the tokenizer half of the public API over the model's tokenizer. */
#include "model/model.h"
#include "base/status.h"
#include <stdlib.h>
#include <string.h>

kiln_status kiln_tokenize(const kiln_model *m, const char *text, size_t len, int add_bos, int32_t *ids, size_t cap,
                          size_t *n_out) {
    *n_out = 0;
    if (!m->tok) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the model has no tokenizer (give token ids with --tokens)", m->path);
    int32_t *v = NULL;
    size_t n = 0;
    KILN_TRY(kiln_tok_encode(m->tok, text, len, add_bos, &v, &n));
    memcpy(ids, v, (n < cap ? n : cap) * sizeof *ids);
    free(v);
    *n_out = n;
    return KILN_OK;
}

const char *kiln_token_piece(const kiln_model *m, int32_t prev, int32_t id, size_t *len) {
    *len = 0;
    if (!m->tok) return NULL;
    return kiln_tok_piece(m->tok, prev, id, len);
}

void kiln_model_default_sampling(const kiln_model *m, kiln_sampling *sp) {
    kiln_sampling_default(sp);
    const kiln_hparams *hp = &m->hp;
    if (hp->gen_set & 1) sp->temperature = hp->gen_temperature;
    if (hp->gen_set & 2) sp->top_p = hp->gen_top_p;
    if (hp->gen_set & 4) sp->top_k = hp->gen_top_k;
    if (hp->gen_set & 8) sp->repetition_penalty = hp->gen_repetition_penalty;
}
