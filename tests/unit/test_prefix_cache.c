/* test_prefix_cache.c — the scheduler's page-level prefix cache (src/engine/prefix_cache.c) over a
 * real KV pool: chained page hashes, exact-match lookup (a hash hit with other tokens is no
 * match), reference counts, leaf-first LRU eviction, and that every page returns to the pool. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "engine/prefix_cache.h"

#define PT 4

static kiln_kv_pool *pool_of(int pages) {
    kiln_kv_config c = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .page_tokens = PT, .dtype = KILN_KV_F32};
    c.mem_bytes = (int64_t)kiln_kv_page_cost(&c) * pages + 4096;
    kiln_kv_pool *p = NULL;
    assert_int_equal(kiln_kv_pool_create(&c, &p), KILN_OK);
    return p;
}

/* A sequence holding n full pages of toks, offered to the cache page by page like the scheduler. */
static void fill(kiln_kv_pool *p, kiln_pcache *c, kiln_kv_seq *s, const int32_t *toks, int n_pages) {
    assert_int_equal(kiln_kv_seq_reserve(p, s, n_pages * PT), KILN_OK);
    s->len = n_pages * PT;
    uint64_t parent = 0;
    for (int i = 0; i < n_pages; i++) {
        uint64_t h = kiln_pcache_page_hash(parent, toks + i * PT, PT);
        assert_int_equal(kiln_pcache_insert(c, h, parent, toks + i * PT, s->pages[i]), 1);
        parent = h;
    }
}

static void test_match_share_evict(void **st) {
    (void)st;
    kiln_kv_pool *p = pool_of(16);
    int total = p->n_pages;
    kiln_pcache c;
    assert_int_equal(kiln_pcache_init(&c, p), KILN_OK);
    int32_t a[12] = {1, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    int32_t pages[8];
    uint64_t hashes[8];
    assert_int_equal(kiln_pcache_match(&c, a, 3, pages, hashes), 0);
    kiln_kv_seq sa = {0};
    fill(p, &c, &sa, a, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(p->refcount[sa.pages[i]], 2); /* sequence + cache */
    /* the same tokens find the same pages, in order, with the chain hashes */
    assert_int_equal(kiln_pcache_match(&c, a, 3, pages, hashes), 3);
    for (int i = 0; i < 3; i++) assert_int_equal(pages[i], sa.pages[i]);
    assert_int_equal(hashes[0], kiln_pcache_page_hash(0, a, PT));
    assert_int_equal(kiln_pcache_match(&c, a, 2, pages, hashes), 2); /* max_pages honoured */
    /* a different second page: only the first matches; a different first page: nothing */
    int32_t b[12];
    memcpy(b, a, sizeof b);
    b[5] = 99;
    assert_int_equal(kiln_pcache_match(&c, b, 3, pages, hashes), 1);
    b[5] = a[5];
    b[0] = 2;
    assert_int_equal(kiln_pcache_match(&c, b, 3, pages, hashes), 0);
    /* the page hash covers the whole prefix: page 1's tokens after another page 0 do not match */
    int32_t c1[8] = {7, 7, 7, 7, 14, 15, 16, 17};
    assert_int_equal(kiln_pcache_match(&c, c1, 2, pages, hashes), 0);
    /* share into a second sequence, then release both: the pages stay, idle, held by the cache */
    kiln_kv_seq sb = {0};
    int k = kiln_pcache_match(&c, a, 2, pages, hashes);
    for (int i = 0; i < k; i++) assert_int_equal(kiln_kv_seq_share_page(p, &sb, pages[i]), KILN_OK);
    assert_int_equal(sb.len, 2 * PT);
    assert_int_equal(p->refcount[pages[0]], 3);
    assert_int_equal(kiln_pcache_idle(&c), 0);
    kiln_kv_seq_release(p, &sa);
    assert_int_equal(kiln_pcache_idle(&c), 1); /* page 2: only the cache holds it */
    kiln_kv_seq_release(p, &sb);
    assert_int_equal(kiln_pcache_idle(&c), 3);
    assert_int_equal(p->n_free, total - 3);
    /* leaf-first: the deepest page goes first, and a chain is never cut in its middle */
    assert_int_equal(kiln_pcache_match(&c, a, 3, pages, hashes), 3);
    int32_t deepest = pages[2];
    assert_int_equal(kiln_pcache_evict(&c, 1), 1);
    assert_int_equal(p->refcount[deepest], 0);
    assert_int_equal(kiln_pcache_match(&c, a, 3, pages, hashes), 2);
    assert_int_equal(kiln_pcache_evict(&c, 5), 2);
    assert_int_equal(p->n_free, total);
    assert_int_equal(kiln_pcache_match(&c, a, 3, pages, hashes), 0);
    free(sa.pages);
    free(sb.pages);
    kiln_pcache_free(&c);
    kiln_kv_pool_free(p);
}

static void test_lru_and_pages_in_use(void **st) {
    (void)st;
    kiln_kv_pool *p = pool_of(16);
    kiln_pcache c;
    assert_int_equal(kiln_pcache_init(&c, p), KILN_OK);
    int32_t x[4] = {1, 2, 3, 4}, y[4] = {1, 5, 6, 7}, z[4] = {1, 8, 9, 10};
    kiln_kv_seq sx = {0}, sy = {0}, sz = {0};
    fill(p, &c, &sx, x, 1);
    fill(p, &c, &sy, y, 1);
    fill(p, &c, &sz, z, 1);
    int32_t px = sx.pages[0], py = sy.pages[0];
    kiln_kv_seq_release(p, &sx);
    kiln_kv_seq_release(p, &sy);
    /* z is still in use: never evicted */
    int32_t pages[2];
    uint64_t h[2];
    assert_int_equal(kiln_pcache_match(&c, x, 1, pages, h), 1); /* x used more recently than y */
    assert_int_equal(kiln_pcache_evict(&c, 1), 1);
    assert_int_equal(p->refcount[py], 0);
    assert_int_equal(p->refcount[px], 1);
    assert_int_equal(kiln_pcache_evict(&c, 10), 1); /* only x was idle */
    assert_int_equal(p->refcount[sz.pages[0]], 2);
    assert_int_equal(kiln_pcache_match(&c, z, 1, pages, h), 1);
    kiln_kv_seq_release(p, &sz);
    kiln_pcache_clear(&c);
    assert_int_equal(p->n_free, p->n_pages);
    free(sx.pages); free(sy.pages); free(sz.pages);
    kiln_pcache_free(&c);
    kiln_kv_pool_free(p);
}

static void test_exact_match_and_duplicates(void **st) {
    (void)st;
    kiln_kv_pool *p = pool_of(8);
    kiln_pcache c;
    assert_int_equal(kiln_pcache_init(&c, p), KILN_OK);
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {1, 2, 3, 5};
    kiln_kv_seq s = {0}, s2 = {0};
    assert_int_equal(kiln_kv_seq_reserve(p, &s, PT), KILN_OK);
    assert_int_equal(kiln_kv_seq_reserve(p, &s2, PT), KILN_OK);
    /* an entry listed under t1's hash but holding t2's tokens (a stand-in for a hash collision) */
    uint64_t h1 = kiln_pcache_page_hash(0, t1, PT);
    assert_int_equal(kiln_pcache_insert(&c, h1, 0, t2, s.pages[0]), 1);
    int32_t pages[1];
    uint64_t hs[1];
    assert_int_equal(kiln_pcache_match(&c, t1, 1, pages, hs), 0); /* hash hit, tokens differ: no match */
    /* a second page with a listed hash is not listed and takes no reference */
    assert_int_equal(kiln_pcache_insert(&c, h1, 0, t2, s2.pages[0]), 0);
    assert_int_equal(p->refcount[s2.pages[0]], 1);
    /* pages that are not in use cannot be listed */
    kiln_kv_seq_release(p, &s2);
    assert_int_equal(kiln_pcache_insert(&c, kiln_pcache_page_hash(0, t2, PT), 0, t2, pages[0] = 7), 0);
    kiln_kv_seq_release(p, &s);
    kiln_pcache_clear(&c);
    assert_int_equal(p->n_free, p->n_pages);
    free(s.pages); free(s2.pages);
    kiln_pcache_free(&c);
    kiln_kv_pool_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_share_evict),
        cmocka_unit_test(test_lru_and_pages_in_use),
        cmocka_unit_test(test_exact_match_and_duplicates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
