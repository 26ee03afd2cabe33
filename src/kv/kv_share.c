/* kv_share.c — page sharing between sequences (prefix caching): extra references on pages and
 * block-table entries that point at another sequence's full pages. Additive to kv.c: freeing goes
 * through kiln_kv_seq_release so the pool's own bookkeeping on free stays in one place. */
#include "kv/kv.h"
#include "kv/integrity.h"
#include "base/status.h"
#include <stdlib.h>

void kiln_kv_page_ref(kiln_kv_pool *p, int32_t page) {
    if (page >= 0 && page < p->n_pages && p->refcount[page] > 0) p->refcount[page]++;
}

void kiln_kv_page_unref(kiln_kv_pool *p, int32_t page) {
    if (page < 0 || page >= p->n_pages || p->refcount[page] <= 0) return;
    int32_t one = page;
    kiln_kv_seq tmp = {&one, 1, 1, p->cfg.page_tokens, NULL};
    kiln_kv_seq_release(p, &tmp);
}

kiln_status kiln_kv_seq_share_page(kiln_kv_pool *p, kiln_kv_seq *s, int32_t page) {
    if (page < 0 || page >= p->n_pages || p->refcount[page] <= 0)
        return kiln_fail(KILN_ERR_INTERNAL, "kv share: page %d is not in use (pool of %d pages)", page, p->n_pages);
    if (s->len != s->n_pages * p->cfg.page_tokens)
        return kiln_fail(KILN_ERR_INTERNAL, "kv share: sequence of %d tokens does not end on a page boundary", s->len);
    if (p->integ) KILN_TRY(kiln_kv_integ_check_share(p, s, page)); /* integrity: hand-off check */
    if (s->n_pages == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        int32_t *v = realloc(s->pages, (size_t)cap * sizeof *v);
        if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        s->pages = v;
        s->cap = cap;
    }
    p->refcount[page]++;
    s->pages[s->n_pages++] = page;
    s->len = s->n_pages * p->cfg.page_tokens;
    if (p->integ) kiln_kv_integ_bind(p, s);
    return KILN_OK;
}
