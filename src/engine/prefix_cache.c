/* prefix_cache.c — page-granular prefix cache over the KV pool (see prefix_cache.h).
 * Eviction is leaf-first LRU: among idle pages (only the cache references them) that no other
 * listed page names as its parent, the least recently used goes first, so a chain is trimmed from
 * its end and never leaves unreachable children behind. */
#include "engine/prefix_cache.h"
#include "base/status.h"
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define PC_SEED0 0x6b696c6e70726678ull /* "kilnprfx": seed of page 0's hash */

static void drop(kiln_pcache *c, int32_t pg);
static int32_t *nchild_of(const kiln_pcache *c) { return (int32_t *)(c->tokens + (size_t)c->n_pages * c->pt); }

kiln_status kiln_pcache_init(kiln_pcache *c, kiln_kv_pool *pool) {
    memset(c, 0, sizeof *c);
    c->pool = pool;
    c->pt = pool->cfg.page_tokens;
    c->n_pages = pool->n_pages;
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)c->n_pages) cap <<= 1;
    c->mask = cap - 1;
    size_t np = (size_t)c->n_pages;
    c->cached = calloc(np, 1);
    c->hash = calloc(np, sizeof *c->hash);
    c->parent = calloc(np, sizeof *c->parent);
    c->stamp = calloc(np, sizeof *c->stamp);
    c->draft_next = malloc(np * sizeof *c->draft_next);
    /* tokens [n_pages × pt] followed by the child counts [n_pages] */
    c->tokens = calloc(np * (size_t)c->pt + np, sizeof *c->tokens);
    c->slots = malloc((size_t)cap * sizeof *c->slots);
    if (!c->cached || !c->hash || !c->parent || !c->stamp || !c->tokens || !c->slots || !c->draft_next) {
        kiln_pcache_free(c);
        return kiln_fail(KILN_ERR_NOMEM, "prefix cache: out of memory for %d pages", (int)np);
    }
    for (uint32_t i = 0; i < cap; i++) c->slots[i] = -1;
    for (size_t i = 0; i < np; i++) c->draft_next[i] = -1;
    return KILN_OK;
}

void kiln_pcache_free(kiln_pcache *c) {
    free(c->cached); free(c->hash); free(c->parent); free(c->stamp); free(c->tokens); free(c->slots); free(c->draft_next);
    memset(c, 0, sizeof *c);
}

uint64_t kiln_pcache_page_hash(uint64_t parent, const int32_t *toks, int pt) {
    return XXH3_64bits_withSeed(toks, (size_t)pt * sizeof *toks, parent ? parent : PC_SEED0);
}

/* Slot of the entry with hash h whose parent and tokens match (or whose hash matches when toks is
 * NULL), or -1. */
static int64_t find(const kiln_pcache *c, uint64_t h, uint64_t parent, const int32_t *toks) {
    for (uint32_t i = (uint32_t)h & c->mask;; i = (i + 1) & c->mask) {
        int32_t pg = c->slots[i];
        if (pg < 0) return -1;
        if (c->hash[pg] != h) continue;
        if (!toks) return i;
        if (c->parent[pg] == parent && memcmp(c->tokens + (size_t)pg * c->pt, toks, (size_t)c->pt * sizeof *toks) == 0) return i;
    }
}

static void slot_delete(kiln_pcache *c, uint32_t i) {
    /* backward-shift deletion keeps every probe chain unbroken without tombstones */
    uint32_t j = i;
    for (;;) {
        c->slots[i] = -1;
        for (;;) {
            j = (j + 1) & c->mask;
            int32_t pg = c->slots[j];
            if (pg < 0) return;
            uint32_t home = (uint32_t)c->hash[pg] & c->mask;
            /* the entry at j may move to i when its home is not cyclically inside (i, j] */
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
        }
        c->slots[i] = c->slots[j];
        i = j;
    }
}

int kiln_pcache_match(kiln_pcache *c, const int32_t *tokens, int max_pages, int32_t *pages, uint64_t *hashes) {
    uint64_t parent = 0;
    int n = 0;
    for (; n < max_pages; n++) {
        const int32_t *t = tokens + (size_t)n * c->pt;
        uint64_t h = kiln_pcache_page_hash(parent, t, c->pt);
        int64_t s = find(c, h, parent, t);
        if (s < 0) break;
        pages[n] = c->slots[s];
        hashes[n] = h;
        parent = h;
    }
    c->queried_pages += (uint64_t)max_pages;
    c->hits_pages += (uint64_t)n;
    /* deeper pages get older stamps: a chain ages from its end */
    for (int i = n - 1; i >= 0; i--) c->stamp[pages[i]] = ++c->clock;
    return n;
}

int kiln_pcache_insert(kiln_pcache *c, uint64_t h, uint64_t parent, const int32_t *toks, int32_t pg) {
    if (pg < 0 || pg >= c->n_pages || c->cached[pg] || c->pool->refcount[pg] <= 0) return 0;
    if (find(c, h, 0, NULL) >= 0) return 0; /* that hash is listed (another copy of the prefix) */
    uint32_t i = (uint32_t)h & c->mask;
    while (c->slots[i] >= 0) i = (i + 1) & c->mask;
    c->slots[i] = pg;
    c->cached[pg] = 1;
    c->hash[pg] = h;
    c->parent[pg] = parent;
    c->stamp[pg] = ++c->clock;
    c->draft_next[pg] = -1;
    memcpy(c->tokens + (size_t)pg * c->pt, toks, (size_t)c->pt * sizeof *toks);
    nchild_of(c)[pg] = 0;
    if (parent) {
        int64_t ps = find(c, parent, 0, NULL);
        if (ps >= 0) nchild_of(c)[c->slots[ps]]++;
    }
    kiln_kv_page_ref(c->pool, pg);
    c->n_cached++;
    return 1;
}

int kiln_pcache_set_draft_rows(kiln_pcache *c, uint64_t h, uint64_t parent, const int32_t *toks, int32_t pg, int32_t next) {
    if (pg < 0 || pg >= c->n_pages || next < 0) return 0;
    if (c->cached[pg] && c->hash[pg] != h) return 0; /* listed for another prefix (cannot happen while it is in use) */
    if (!c->cached[pg]) {
        /* another copy of the prefix is listed (a request without MTP computed it first): this copy,
         * with its MTP rows, takes its place; the listed children find it by the same hash */
        const int64_t s = find(c, h, parent, toks);
        if (s < 0 || c->draft_next[c->slots[s]] >= 0) return 0;
        const int32_t old = c->slots[s], children = nchild_of(c)[old];
        drop(c, old);
        if (!kiln_pcache_insert(c, h, parent, toks, pg)) return 0;
        nchild_of(c)[pg] = children;
    }
    c->draft_next[pg] = next;
    return 1;
}

void kiln_pcache_clear_draft_rows(kiln_pcache *c, int32_t pg) {
    if (pg >= 0 && pg < c->n_pages) c->draft_next[pg] = -1;
}

int kiln_pcache_draft_rows(const kiln_pcache *c, int32_t pg, int32_t next) {
    return pg >= 0 && pg < c->n_pages && c->cached[pg] && next >= 0 && c->draft_next[pg] == next;
}

int kiln_pcache_idle(const kiln_pcache *c) {
    int n = 0;
    for (int pg = 0; pg < c->n_pages; pg++) n += c->cached[pg] && c->pool->refcount[pg] == 1;
    return n;
}

static void drop(kiln_pcache *c, int32_t pg) {
    int64_t s = find(c, c->hash[pg], 0, NULL);
    /* the hash slot found first may be another page only if two pages share a hash, which insert
     * forbids; so s names pg */
    if (s >= 0) slot_delete(c, (uint32_t)s);
    if (c->parent[pg]) {
        int64_t ps = find(c, c->parent[pg], 0, NULL);
        if (ps >= 0 && nchild_of(c)[c->slots[ps]] > 0) nchild_of(c)[c->slots[ps]]--;
    }
    c->cached[pg] = 0;
    c->draft_next[pg] = -1;
    c->n_cached--;
    kiln_kv_page_unref(c->pool, pg);
}

int kiln_pcache_evict(kiln_pcache *c, int n) {
    int done = 0;
    const int32_t *nchild = nchild_of(c);
    while (done < n) {
        int32_t best = -1;
        for (int pg = 0; pg < c->n_pages; pg++)
            if (c->cached[pg] && c->pool->refcount[pg] == 1 && nchild[pg] == 0 && (best < 0 || c->stamp[pg] < c->stamp[best])) best = pg;
        if (best < 0) break;
        drop(c, best);
        c->evictions++;
        done++;
    }
    return done;
}

int kiln_pcache_forget(kiln_pcache *c, int32_t pg) {
    if (pg < 0 || pg >= c->n_pages || !c->cached[pg]) return 0;
    drop(c, pg);
    return 1;
}

int kiln_pcache_sweep(kiln_pcache *c, int n, int (*check)(void *ctx, int32_t page, uint64_t hash), void *ctx) {
    int done = 0;
    for (int k = 0; k < c->n_pages && done < n; k++) {
        int32_t pg = c->sweep_cursor;
        c->sweep_cursor = (c->sweep_cursor + 1) % c->n_pages;
        if (!c->cached[pg] || c->pool->refcount[pg] != 1) continue;
        done++;
        if (!check(ctx, pg, c->hash[pg])) drop(c, pg);
    }
    return done;
}

void kiln_pcache_clear(kiln_pcache *c) {
    for (int pg = 0; pg < c->n_pages; pg++)
        if (c->cached[pg]) drop(c, pg);
}
