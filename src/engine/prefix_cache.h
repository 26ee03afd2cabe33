/* prefix_cache.h — prefix caching by KV page (internal to the scheduler).
 *
 * A full page of a sequence is identified by a hash of ALL the token ids from position 0 to the
 * end of that page, computed as a chain: h_0 = XXH3(tokens of page 0, seed K), h_i = XXH3(tokens
 * of page i, seed h_{i-1}). Entries also keep the parent hash and the page's own tokens, so a
 * lookup is an exact match (hash collision → no match, never a wrong page).
 *
 * The cache holds one reference on every page it lists (kv pool refcount); a page whose only
 * reference is the cache's is "idle" and may be evicted, least recently used first. Only the
 * scheduler thread touches the cache (it owns the pool). */
#ifndef KILN_ENGINE_PREFIX_CACHE_H
#define KILN_ENGINE_PREFIX_CACHE_H
#include "kv/kv.h"
#include <stdint.h>

typedef struct kiln_pcache {
    kiln_kv_pool *pool;
    int pt;                 /* tokens per page */
    int n_pages;            /* pool pages: per-page arrays below are indexed by page id */
    uint8_t *cached;        /* [n_pages] 1 = listed in the cache */
    uint64_t *hash, *parent, *stamp; /* [n_pages] */
    int32_t *tokens;        /* [n_pages × pt] the page's token ids (exact-match check) */
    int32_t *draft_next;    /* [n_pages] the MTP layer's rows of a listed page are whole: the token after
                               the page its last row was computed with (that row's pair needs it); -1 not */
    /* open addressing, linear probing, backward-shift deletion; slot = page id or -1 */
    int32_t *slots;
    uint32_t mask;
    int n_cached;
    uint64_t clock;
    uint64_t hits_pages, queried_pages, evictions;
    int sweep_cursor;       /* next page id the idle sweep looks at */
} kiln_pcache;

kiln_status kiln_pcache_init(kiln_pcache *c, kiln_kv_pool *pool);
void kiln_pcache_free(kiln_pcache *c);

/* Hash of a full page whose prefix (pages before it) hashes to `parent` (0 for page 0). */
uint64_t kiln_pcache_page_hash(uint64_t parent, const int32_t *page_tokens, int pt);

/* Longest cached prefix of tokens, at most max_pages full pages. Writes the page ids to pages[] and
 * their chain hashes to hashes[]; marks them recently used. Takes no references. */
int kiln_pcache_match(kiln_pcache *c, const int32_t *tokens, int max_pages, int32_t *pages, uint64_t *hashes);

/* Lists `page` (a full page in use whose chain hash is h, parent hash `parent`) in the cache,
 * taking a reference. No-op (returns 0) if it is already listed or another page has that hash. */
int kiln_pcache_insert(kiln_pcache *c, uint64_t h, uint64_t parent, const int32_t *page_tokens, int32_t page);

/* The MTP layer's KV rows of `page` (in the server's draft pool, engine/mtp.h) are whole, its last
 * row computed with `next`, the token after the page. A page not listed takes the place of a listed
 * copy of the same prefix (chain hash h, parent hash, tokens) that has no whole MTP rows; otherwise
 * nothing changes. Returns 1 if the page is listed with its rows. The record is cleared when the page
 * leaves the cache, so it never outlives the rows it speaks for. */
int kiln_pcache_set_draft_rows(kiln_pcache *c, uint64_t h, uint64_t parent, const int32_t *page_tokens, int32_t page, int32_t next);
void kiln_pcache_clear_draft_rows(kiln_pcache *c, int32_t page);
/* Whether listed `page` has whole MTP rows for a sequence whose token after the page is `next`. */
int kiln_pcache_draft_rows(const kiln_pcache *c, int32_t page, int32_t next);

/* Pages listed whose only reference is the cache's. */
int kiln_pcache_idle(const kiln_pcache *c);
/* Evicts up to n idle pages, least recently used first; returns how many went back to the pool. */
int kiln_pcache_evict(kiln_pcache *c, int n);
/* Drops every idle page (shutdown). */
void kiln_pcache_clear(kiln_pcache *c);
/* Removes `page` from the cache if it is listed (it failed an integrity check): the cache's
 * reference goes; sequences that hold it keep theirs. Returns 1 if it was listed. */
int kiln_pcache_forget(kiln_pcache *c, int32_t page);
/* Calls check(ctx, page, chain hash) on up to n idle listed pages, round robin; a page for which
 * check returns 0 is forgotten. Returns how many were checked. */
int kiln_pcache_sweep(kiln_pcache *c, int n, int (*check)(void *ctx, int32_t page, uint64_t hash), void *ctx);
#endif
