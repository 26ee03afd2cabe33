/* test_kv_integrity.c — KV integrity (issue 5) at the pool level: detection campaigns and the
 * fault-free false-alarm campaign, through the real store and attention paths.
 *
 * The test injects every fault itself, writing the pool memory through the layout kv.h documents
 * (it does not use the library's injector), then runs kiln_kv_attend_batch — the path decode and
 * prefill use — and checks that the call that first reads the faulty page reports it
 * (kiln_kv_integ_bad_slot) and counts it. "Before use" is checked against an independent reference:
 * the attention output must equal a softmax attention the test computes in double precision from
 * its own copies of the stored rows with the bad page's positions left out (the kernel never
 * consumed the corrupted bytes; leaving out 16 of 64 positions moves the output far beyond the
 * tolerance, so a kernel that had read the page would fail).
 *
 * Counts (the "must show"): 100,000 single-bit data flips, 10,000 scale flips (dynamic
 * per-page and static table), 10,000 each of wrong-page, stale-page and lost-write faults, 2,000
 * partial copies; 1,000,000+ fault-free page verifications (pages of 2 layers × K/V × 1 head)
 * over a workload of appends, prefix shares, copy-on-write and rewinds with zero false alarms. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kv/kv.h"
#include "kv/integrity.h"
#include "kernels/gemv.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L_ 2
#define HD 8
#define PT 16

static uint64_t rng = 0x1234567;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng % n);
}
static float rndf(void) { return (float)((int)rnd(2001) - 1000) / 1000.0f; }

/* A sequence with the test's own copy of every row it stored ([pos][layer][K/V][head][HD]). */
typedef struct tseq {
    kiln_kv_seq s;
    int32_t tok[1024];
    float *rows;
    int len;
} tseq;

typedef struct rig {
    kiln_kv_pool *p;
    int H;
} rig;

static float *row_of(const rig *r, tseq *t, int pos, int l, int kind, int h) {
    return t->rows + ((((size_t)pos * L_ + l) * 2 + kind) * (size_t)r->H + h) * HD;
}

static rig make_rig(kiln_kv_dtype dt, kiln_kv_scale_mode sm, int H) {
    rig r = {NULL, H};
    static float ks[L_ * 8], vs[L_ * 8];
    for (int i = 0; i < L_ * 8; i++) ks[i] = vs[i] = 1.0f / 448.0f * 2.0f;
    kiln_kv_config c = {.n_layers = L_, .n_kv_heads = H, .head_dim = HD, .page_tokens = PT, .dtype = dt,
                        .mem_bytes = 256 * (int64_t)(PT * L_ * 2 * H * HD * 4 + 4096), .scale_mode = sm, .k_scale = ks, .v_scale = vs};
    assert_int_equal(kiln_kv_pool_create(&c, &r.p), KILN_OK);
    assert_int_equal(kiln_kv_integ_attach(r.p, KILN_KV_INTEGRITY_HEAL, 42, NULL, 1), KILN_OK);
    return r;
}

/* Appends positions [t->len, n) with fresh rows (tokens noted first, as the engine does). */
static void append(rig *r, tseq *t, int n) {
    if (!t->rows) t->rows = calloc((size_t)1024 * L_ * 2 * r->H * HD, sizeof(float));
    for (int pos = t->len; pos < n; pos++) if (pos >= t->len) t->tok[pos] = t->tok[pos] ? t->tok[pos] : (int32_t)rnd(32000);
    assert_int_equal(kiln_kv_integ_note(r->p, &t->s, t->len, t->tok + t->len, n - t->len, 1), KILN_OK);
    assert_int_equal(kiln_kv_seq_reserve(r->p, &t->s, n), KILN_OK);
    float k[8 * HD], v[8 * HD];
    for (int pos = t->len; pos < n; pos++)
        for (int l = 0; l < L_; l++) {
            for (int h = 0; h < r->H; h++)
                for (int d = 0; d < HD; d++) {
                    k[h * HD + d] = row_of(r, t, pos, l, 0, h)[d] = rndf();
                    v[h * HD + d] = row_of(r, t, pos, l, 1, h)[d] = rndf();
                }
            kiln_kv_store(r->p, &t->s, l, pos, k, v);
        }
    t->len = n;
    t->s.len = n;
}

/* Decode-style attention of the last position over every layer (or one layer); returns the
 * sequence's first bad slot (-1 = all pages verified). out: [n_heads × HD] of the last layer run. */
static int attend(rig *r, tseq *t, int layer, float *out) {
    float q[16 * HD], o[16 * HD];
    for (int i = 0; i < 2 * r->H * HD; i++) q[i] = (float)((i * 37) % 17 - 8) / 8.0f;
    kiln_kv_seq *sq = &t->s;
    int pos = t->len - 1;
    for (int l = layer < 0 ? 0 : layer; l < (layer < 0 ? L_ : layer + 1); l++)
        kiln_kv_attend_batch(r->p, l, 1, &sq, &pos, q, 2 * r->H, 0.35f, out ? out : o);
    return kiln_kv_integ_bad_slot(&t->s);
}

/* Reference attention (F32 pools) of layer l from the test's copies, positions of page `skip` left
 * out for the query heads of KV head skip_kvh (-1: all), compared with out. */
static void check_reference(rig *r, tseq *t, int l, int skip, int skip_kvh, const float *out) {
    float q[16 * HD];
    for (int i = 0; i < 2 * r->H * HD; i++) q[i] = (float)((i * 37) % 17 - 8) / 8.0f;
    for (int head = 0; head < 2 * r->H; head++) {
        int kvh = head / 2, sk = skip_kvh < 0 || skip_kvh == kvh ? skip : -1;
        double mx = -1e300, sum = 0, acc[HD] = {0};
        for (int pos = 0; pos < t->len; pos++) {
            if (pos / PT == sk) continue;
            double s = 0;
            for (int d = 0; d < HD; d++) s += (double)q[head * HD + d] * row_of(r, t, pos, l, 0, kvh)[d];
            mx = fmax(mx, s * 0.35);
        }
        for (int pos = 0; pos < t->len; pos++) {
            if (pos / PT == sk) continue;
            double s = 0;
            for (int d = 0; d < HD; d++) s += (double)q[head * HD + d] * row_of(r, t, pos, l, 0, kvh)[d];
            double e = exp(s * 0.35 - mx);
            sum += e;
            for (int d = 0; d < HD; d++) acc[d] += e * row_of(r, t, pos, l, 1, kvh)[d];
        }
        for (int d = 0; d < HD; d++) assert_true(fabs(acc[d] / sum - out[head * HD + d]) < 1e-4);
    }
}

/* Byte address of (layer, K/V, head, position) in page pg, from kv.h's layout. */
static uint8_t *slice(rig *r, int32_t pg, int l, int kind, int h) {
    kiln_kv_pool *p = r->p;
    return kind ? p->v[l] + (size_t)pg * p->page_v + (size_t)h * p->head_v : p->k[l] + (size_t)pg * p->page_k + (size_t)h * p->head_k;
}

static void free_rig(rig *r, tseq *ts, int n) {
    for (int i = 0; i < n; i++) {
        kiln_kv_seq_release(r->p, &ts[i].s);
        free(ts[i].s.pages);
        free(ts[i].rows);
    }
    kiln_kv_pool_free(r->p);
}

/* ---- 100,000 single-bit flips in KV data (F32, BF16, FP8) ---- */
static void flips(kiln_kv_dtype dt, int trials) {
    rig r = make_rig(dt, KILN_KV_SCALE_STATIC, 2);
    tseq a;
    memset(&a, 0, sizeof a);
    append(&r, &a, 4 * PT + 5); /* 4 full pages and an open one with 5 rows */
    assert_int_equal(attend(&r, &a, -1, NULL), -1);
    kiln_kv_integrity_stats s0, s1;
    kiln_kv_integ_stats(r.p, &s0);
    int detected = 0, before_use = 0;
    float out[16 * HD];
    for (int t = 0; t < trials; t++) {
        int l = (int)rnd(L_), kind = (int)rnd(2), h = (int)rnd(2), slot = (int)rnd(5);
        int rows = slot < 4 ? PT : 5;
        size_t nbytes = (size_t)rows * (kind ? r.p->row_v : r.p->row_k);
        uint8_t *b = slice(&r, a.s.pages[slot], l, kind, h);
        size_t byte = rnd((uint32_t)nbytes);
        uint8_t bit = (uint8_t)(1u << rnd(8));
        b[byte] ^= bit;
        int bad = attend(&r, &a, l, out);
        detected += bad == slot;
        if (bad == slot && dt == KILN_KV_F32 && t % 64 == 0) { check_reference(&r, &a, l, slot, h, out); before_use++; }
        b[byte] ^= bit;
        kiln_kv_integ_clear_bad(&a.s);
    }
    kiln_kv_integ_stats(r.p, &s1);
    fprintf(stderr, "%s data bit flips: injected %d, detected %d (reference-checked unused: %d), detections counted %llu, checks %llu\n",
            dt == KILN_KV_F32 ? "f32" : dt == KILN_KV_BF16 ? "bf16" : "fp8", trials, detected, before_use,
            (unsigned long long)(s1.detections - s0.detections), (unsigned long long)(s1.checks - s0.checks));
    assert_int_equal(detected, trials);
    assert_int_equal(s1.detections - s0.detections, (uint64_t)trials); /* one slice per flip, once */
    assert_int_equal(s1.detected[KILN_KV_DETECT_CONTENT] - s0.detected[KILN_KV_DETECT_CONTENT], (uint64_t)trials);
    /* after the flips are undone nothing is wrong */
    assert_int_equal(attend(&r, &a, -1, NULL), -1);
    free_rig(&r, &a, 1);
}

static void test_bitflips_data(void **state) {
    (void)state;
    flips(KILN_KV_F32, 60000);
    flips(KILN_KV_BF16, 20000);
    flips(KILN_KV_FP8, 20000);
}

/* ---- 10,000 flips in scales: dynamic per-page scales and the static table ---- */
static void test_bitflips_scales(void **state) {
    (void)state;
    rig r = make_rig(KILN_KV_FP8, KILN_KV_SCALE_DYNAMIC, 2);
    tseq a;
    memset(&a, 0, sizeof a);
    append(&r, &a, 4 * PT + 3);
    int detected = 0, n = 6000;
    for (int t = 0; t < n; t++) {
        int l = (int)rnd(L_), kind = (int)rnd(2), h = (int)rnd(2), slot = (int)rnd(5);
        /* kv.h: dynamic scales [n_layers][n_pages][2][n_kv_heads] */
        float *sc = r.p->dscale + (((size_t)l * r.p->n_pages + (size_t)a.s.pages[slot]) * 2 + (size_t)kind) * 2 + (size_t)h;
        uint32_t u, bit = 1u << rnd(32);
        memcpy(&u, sc, 4);
        u ^= bit;
        memcpy(sc, &u, 4);
        detected += attend(&r, &a, l, NULL) == slot;
        u ^= bit;
        memcpy(sc, &u, 4);
        kiln_kv_integ_clear_bad(&a.s);
    }
    fprintf(stderr, "fp8 dynamic scale bit flips: injected %d, detected %d\n", n, detected);
    assert_int_equal(detected, n);
    free_rig(&r, &a, 1);

    /* static table: heal restores the table from its checksummed master copy before any use */
    r = make_rig(KILN_KV_FP8, KILN_KV_SCALE_STATIC, 2);
    tseq b;
    memset(&b, 0, sizeof b);
    append(&r, &b, 3 * PT);
    kiln_kv_integrity_stats s0, s1;
    kiln_kv_integ_stats(r.p, &s0);
    int ns = 4000, restored = 0;
    for (int t = 0; t < ns; t++) {
        int l = (int)rnd(L_), kind = (int)rnd(2), h = (int)rnd(2);
        float *sc = (kind ? r.p->v_scale : r.p->k_scale) + l * 2 + h, orig = *sc;
        uint32_t u;
        memcpy(&u, sc, 4);
        u ^= 1u << rnd(32);
        memcpy(sc, &u, 4);
        attend(&r, &b, l, NULL);
        restored += memcmp(sc, &orig, 4) == 0;
    }
    kiln_kv_integ_stats(r.p, &s1);
    fprintf(stderr, "fp8 static scale-table bit flips: injected %d, detected %llu, restored before use %d\n", ns,
            (unsigned long long)(s1.detected[KILN_KV_DETECT_SCALE] - s0.detected[KILN_KV_DETECT_SCALE]), restored);
    assert_int_equal(s1.detected[KILN_KV_DETECT_SCALE] - s0.detected[KILN_KV_DETECT_SCALE], (uint64_t)ns);
    assert_int_equal(restored, ns);
    assert_int_equal(attend(&r, &b, -1, NULL), -1);
    free_rig(&r, &b, 1);
}

/* ---- 10,000 block-table entries naming another live page ---- */
static void test_wrong_page(void **state) {
    (void)state;
    rig r = make_rig(KILN_KV_F32, KILN_KV_SCALE_STATIC, 2);
    tseq t[2];
    memset(t, 0, sizeof t);
    append(&r, &t[0], 4 * PT);
    /* t[1]: the SAME rows and tokens as t[0] for its first page, other tokens after: a content-only
     * checksum cannot tell its page 0 from t[0]'s; the seal can (the epoch differs) */
    memcpy(t[1].tok, t[0].tok, sizeof t[0].tok);
    for (int i = PT; i < 4 * PT; i++) t[1].tok[i] = t[0].tok[i] + 1;
    append(&r, &t[1], 4 * PT);
    for (int pos = 0; pos < PT; pos++)
        for (int l = 0; l < L_; l++) {
            float k[2 * HD], v[2 * HD];
            for (int h = 0; h < 2; h++)
                for (int d = 0; d < HD; d++) {
                    k[h * HD + d] = row_of(&r, &t[1], pos, l, 0, h)[d] = row_of(&r, &t[0], pos, l, 0, h)[d];
                    v[h * HD + d] = row_of(&r, &t[1], pos, l, 1, h)[d] = row_of(&r, &t[0], pos, l, 1, h)[d];
                }
            kiln_kv_store(r.p, &t[1].s, l, pos, k, v);
        }
    assert_int_equal(memcmp(slice(&r, t[0].s.pages[0], 0, 0, 0), slice(&r, t[1].s.pages[0], 0, 0, 0), r.p->head_k), 0);
    assert_int_equal(attend(&r, &t[0], -1, NULL), -1);
    assert_int_equal(attend(&r, &t[1], -1, NULL), -1);
    int n = 10000, detected = 0, identical_content = 0;
    float out[16 * HD];
    for (int i = 0; i < n; i++) {
        int v = (int)rnd(2), slot = (int)rnd(4);
        tseq *a = &t[v];
        int32_t own = a->s.pages[slot], other;
        do { /* another live page: of the other sequence, or another slot of this one */
            int w = (int)rnd(2), j = (int)rnd(4);
            other = t[w].s.pages[j];
        } while (other == own);
        identical_content += slot == 0 && other == t[!v].s.pages[0];
        a->s.pages[slot] = other;
        int l = (int)rnd(L_), bad = attend(&r, a, l, out);
        detected += bad == slot;
        if (bad == slot && i % 64 == 0) check_reference(&r, a, l, slot, -1, out); /* every head's slices fail */
        a->s.pages[slot] = own;
        kiln_kv_integ_clear_bad(&a->s);
    }
    fprintf(stderr, "wrong-page faults: injected %d, detected %d (%d with byte-identical content)\n", n, detected, identical_content);
    assert_int_equal(detected, n);
    assert_true(identical_content > 0);
    free_rig(&r, t, 2);
}

/* ---- 10,000 pages freed under their sequence and reused by another one ---- */
static void test_stale_page(void **state) {
    (void)state;
    rig r = make_rig(KILN_KV_F32, KILN_KV_SCALE_STATIC, 1);
    tseq a;
    memset(&a, 0, sizeof a);
    append(&r, &a, 4 * PT);
    int n = 10000, detected = 0;
    for (int i = 0; i < n; i++) {
        int slot = (int)rnd(4);
        int32_t pg = a.s.pages[slot];
        kiln_kv_page_unref(r.p, pg); /* the bug: a's reference is dropped while a still lists the page */
        tseq b;
    memset(&b, 0, sizeof b);
        append(&r, &b, PT);        /* another sequence takes the page (LIFO free list) and writes it */
        assert_int_equal(b.s.pages[0], pg);
        detected += attend(&r, &a, (int)rnd(L_), NULL) == slot;
        /* clean up: b ends; a heals (drop from the bad slot, recompute = store its rows again) */
        kiln_kv_seq_release(r.p, &b.s);
        free(b.s.pages);
        free(b.rows);
        kiln_kv_integ_rollback(r.p, &a.s, slot);
        int keep = slot * PT;
        a.len = keep;
        append(&r, &a, 4 * PT);
        assert_int_equal(attend(&r, &a, -1, NULL), -1);
    }
    fprintf(stderr, "stale-page faults: injected %d, detected %d\n", n, detected);
    assert_int_equal(detected, n);
    free_rig(&r, &a, 1);
}

/* ---- 10,000 lost writes: a stored row that never reaches memory ---- */
static void test_lost_write(void **state) {
    (void)state;
    rig r = make_rig(KILN_KV_BF16, KILN_KV_SCALE_STATIC, 1);
    tseq a;
    memset(&a, 0, sizeof a);
    append(&r, &a, 4 * PT);
    int n = 10000, detected = 0;
    for (int i = 0; i < n; i++) {
        /* rewrite the last page with new rows; one row of one layer's K or V is lost */
        kiln_kv_integ_rollback(r.p, &a.s, 3);
        a.len = 3 * PT;
        int lost_pos = 3 * PT + (int)rnd(PT), lost_l = (int)rnd(L_), lost_kind = (int)rnd(2);
        assert_int_equal(kiln_kv_integ_note(r.p, &a.s, a.len, a.tok + a.len, PT, 1), KILN_OK);
        assert_int_equal(kiln_kv_seq_reserve(r.p, &a.s, 4 * PT), KILN_OK);
        uint8_t saved[HD * 4];
        for (int pos = 3 * PT; pos < 4 * PT; pos++)
            for (int l = 0; l < L_; l++) {
                float k[HD], v[HD];
                for (int d = 0; d < HD; d++) k[d] = rndf(), v[d] = rndf();
                uint8_t *row = slice(&r, a.s.pages[3], l, lost_kind, 0) + (size_t)(pos % PT) * r.p->row_k;
                int lose = pos == lost_pos && l == lost_l;
                if (lose) memcpy(saved, row, r.p->row_k);
                kiln_kv_store(r.p, &a.s, l, pos, k, v);
                if (lose && memcmp(saved, row, r.p->row_k) == 0) saved[0] ^= 1; /* keep it a real loss */
                if (lose) memcpy(row, saved, r.p->row_k);
            }
        a.len = a.s.len = 4 * PT;
        int bad = attend(&r, &a, lost_l, NULL);
        detected += bad == 3;
        kiln_kv_integ_clear_bad(&a.s);
    }
    fprintf(stderr, "lost writes: injected %d, detected %d\n", n, detected);
    assert_int_equal(detected, n);
    free_rig(&r, &a, 1);
}

/* ---- 2,000 partly copied pages (copy-on-write of a shared prefix's partial page) ---- */
static void test_partial_copy(void **state) {
    (void)state;
    rig r = make_rig(KILN_KV_F32, KILN_KV_SCALE_STATIC, 1);
    tseq a;
    memset(&a, 0, sizeof a);
    append(&r, &a, 4 * PT);
    int n = 2000, detected = 0, complete_ok = 0;
    for (int i = 0; i < n; i++) {
        tseq d;
        memset(&d, 0, sizeof d);
        int upto = 3 * PT + 1 + (int)rnd(PT - 1); /* a partial last page: copied */
        assert_int_equal(kiln_kv_seq_share_prefix(r.p, &d.s, &a.s, upto), KILN_OK);
        d.len = upto;
        d.rows = a.rows; /* same rows */
        if (i % 2) {
            /* the copy stopped part-way in one slice: its tail is something else */
            int l = (int)rnd(L_), kind = (int)rnd(2);
            uint8_t *b = slice(&r, d.s.pages[3], l, kind, 0);
            size_t nb = (size_t)(upto - 3 * PT) * r.p->row_k, cut = rnd((uint32_t)nb);
            for (size_t j = cut; j < nb; j++) b[j] ^= 0x5a;
            detected += attend(&r, &d, l, NULL) == 3;
        } else {
            complete_ok += attend(&r, &d, -1, NULL) == -1;
        }
        kiln_kv_seq_release(r.p, &d.s);
        free(d.s.pages);
    }
    fprintf(stderr, "partial copies: injected %d, detected %d; complete copies verified clean %d\n", n / 2, detected, complete_ok);
    assert_int_equal(detected, n / 2);
    assert_int_equal(complete_ok, n / 2);
    free_rig(&r, &a, 1);
}

/* ---- zero false alarms over 1,000,000+ fault-free page verifications ---- */
static void test_no_false_alarms(void **state) {
    (void)state;
    const kiln_kv_dtype dts[3] = {KILN_KV_F32, KILN_KV_BF16, KILN_KV_FP8};
    uint64_t pages_verified = 0;
    for (int di = 0; di < 3; di++) {
        rig r = make_rig(dts[di], di == 2 ? KILN_KV_SCALE_DYNAMIC : KILN_KV_SCALE_STATIC, 1);
        tseq t[4];
        memset(t, 0, sizeof t);
        kiln_kv_integrity_stats st;
        for (int round = 0;; round++) {
            kiln_kv_integ_stats(r.p, &st);
            if (st.checks / (L_ * 2) >= 400000) break; /* a page = 2 layers × K/V × 1 head */
            int i = (int)rnd(4);
            tseq *s = &t[i];
            int op = (int)rnd(10);
            if (op < 6 && s->len + 1 < 160) {
                append(&r, s, s->len + 1 + (int)rnd(3)); /* decode / small prefill */
                assert_int_equal(attend(&r, s, -1, NULL), -1);
            } else if (op < 8 && s->len > PT + 2) {
                /* rewind (truncate) to a random point with different tokens after it */
                int to = 1 + (int)rnd((uint32_t)s->len - 1), own = s->s.n_pages;
                while (own > 0 && r.p->refcount[s->s.pages[own - 1]] == 1) own--;
                if (to < own * PT) to = own * PT;
                if (to >= s->len) continue;
                for (int pos = to; pos < s->len; pos++) s->tok[pos] = (int32_t)rnd(32000);
                s->len = s->s.len = to;
                append(&r, s, to + 1);
                assert_int_equal(attend(&r, s, -1, NULL), -1);
            } else if (op == 8 && s->len > 0) {
                /* another sequence takes a prefix of this one (full pages shared, partial page copied) */
                int j = (i + 1 + (int)rnd(3)) % 4;
                tseq *d = &t[j];
                kiln_kv_seq_release(r.p, &d->s);
                int n = 1 + (int)rnd((uint32_t)s->len);
                assert_int_equal(kiln_kv_seq_share_prefix(r.p, &d->s, &s->s, n), KILN_OK);
                if (!d->rows) d->rows = calloc((size_t)1024 * L_ * 2 * HD, sizeof(float));
                memcpy(d->rows, s->rows, (size_t)n * L_ * 2 * HD * sizeof(float));
                memcpy(d->tok, s->tok, sizeof s->tok);
                d->len = n;
                assert_int_equal(attend(&r, d, -1, NULL), -1);
                append(&r, d, n + 1);
                assert_int_equal(attend(&r, d, -1, NULL), -1);
            } else {
                kiln_kv_seq_release(r.p, &s->s);
                s->len = 0;
                memset(s->tok, 0, sizeof s->tok);
            }
            if (s->len == 0) continue;
            assert_int_equal(kiln_kv_integ_bad_slot(&s->s), -1);
        }
        kiln_kv_integ_stats(r.p, &st);
        fprintf(stderr, "fault-free workload (%s): %llu page verifications (%llu slices, %.1f MB), %llu seals, detections %llu\n",
                di == 0 ? "f32" : di == 1 ? "bf16" : "fp8 dynamic", (unsigned long long)(st.checks / (L_ * 2)), (unsigned long long)st.checks,
                (double)st.bytes_verified / 1e6, (unsigned long long)st.seals, (unsigned long long)st.detections);
        assert_int_equal(st.detections, 0);
        pages_verified += st.checks / (L_ * 2);
        free_rig(&r, t, 4);
    }
    assert_true(pages_verified >= 1000000);
}

/* ---- a multi-chunk call: slices hashed once per call, all re-verified at its end ---- */
static void test_call_scope(void **state) {
    (void)state;
    rig r = make_rig(KILN_KV_BF16, KILN_KV_SCALE_STATIC, 2);
    tseq a;
    memset(&a, 0, sizeof a);
    append(&r, &a, 4 * PT);
    kiln_kv_integrity_stats s0, s1, s2;
    kiln_kv_integ_call_begin(r.p);
    assert_int_equal(attend(&r, &a, -1, NULL), -1);
    kiln_kv_integ_stats(r.p, &s0);
    assert_int_equal(attend(&r, &a, -1, NULL), -1); /* same call: nothing hashed again */
    kiln_kv_integ_stats(r.p, &s1);
    assert_int_equal(s1.checks, s0.checks);
    uint8_t *b = slice(&r, a.s.pages[1], 1, 1, 0);
    b[5] ^= 0x10; /* corrupted between two chunks of the call */
    assert_int_equal(kiln_kv_integ_verify_seq(r.p, &a.s), 0); /* the end-of-call pass catches it */
    assert_int_equal(kiln_kv_integ_bad_slot(&a.s), 1);
    kiln_kv_integ_stats(r.p, &s2);
    assert_int_equal(s2.checks - s1.checks, (uint64_t)(4 * L_ * 2 * 2)); /* every slice of every page */
    kiln_kv_integ_call_end(r.p);
    b[5] ^= 0x10;
    kiln_kv_integ_clear_bad(&a.s);
    assert_int_equal(attend(&r, &a, -1, NULL), -1); /* outside the call: hashed again, clean */
    free_rig(&r, &a, 1);
}

int main(void) {
    kiln_kernels_select(KILN_ISA_AUTO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bitflips_data),  cmocka_unit_test(test_bitflips_scales), cmocka_unit_test(test_wrong_page),
        cmocka_unit_test(test_stale_page),     cmocka_unit_test(test_lost_write),      cmocka_unit_test(test_partial_copy),
        cmocka_unit_test(test_no_false_alarms), cmocka_unit_test(test_call_scope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
