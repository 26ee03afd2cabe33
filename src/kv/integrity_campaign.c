/* integrity_campaign.c — kiln_kv_integrity_campaign (kiln.h): the built-in injector against a small
 * synthetic pool, through the same store / attention / hand-off code the engine runs. Used by
 * `kiln bench --integrity`; the independent campaign with its own injections and reference
 * attention is tests/integrity/test_kv_integrity.c. */
#include "kiln_test.h"
#include "kv/integrity.h"
#include "base/status.h"
#include "kernels/gemv.h"
#include <stdlib.h>
#include <string.h>

#define C_L 2
#define C_H 2
#define C_D 32
#define C_PT 16

typedef struct camp {
    kiln_kv_pool *p;
    kiln_kv_seq v, w;        /* the victim, and a second live sequence (other pages to point at) */
    int32_t tok[8 * C_PT];
    uint64_t rng;
    float *q, *out;
} camp;

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

/* Positions [from, to) of s: tokens noted, pages reserved, fresh rows stored in every layer. */
static kiln_status fill(camp *c, kiln_kv_seq *s, int from, int to, int salt) {
    int32_t t[8 * C_PT];
    for (int i = from; i < to; i++) t[i] = c->tok[i] + salt;
    KILN_TRY(kiln_kv_integ_note(c->p, s, from, t + from, to - from, 1));
    KILN_TRY(kiln_kv_seq_reserve(c->p, s, to));
    float k[C_H * C_D], v[C_H * C_D];
    for (int pos = from; pos < to; pos++)
        for (int l = 0; l < C_L; l++) {
            for (int i = 0; i < C_H * C_D; i++) {
                k[i] = (float)((int)(next(&c->rng) % 2001) - 1000) / 1000.0f;
                v[i] = (float)((int)(next(&c->rng) % 2001) - 1000) / 1000.0f;
            }
            kiln_kv_store(c->p, s, l, pos, k, v);
        }
    s->len = to;
    return KILN_OK;
}

static void attend_all(camp *c, kiln_kv_seq *s) {
    int pos = s->len - 1;
    for (int l = 0; l < C_L; l++) kiln_kv_attend_batch(c->p, l, 1, &s, &pos, c->q, 2 * C_H, 0.2f, c->out);
}

static kiln_status camp_open(camp *c, kiln_kv_dtype dt, kiln_kv_scale_mode sm, uint64_t seed) {
    memset(c, 0, sizeof *c);
    static const float sc[C_L * C_H] = {2.0f / 448, 2.0f / 448, 2.0f / 448, 2.0f / 448};
    kiln_kv_config cfg = {.n_layers = C_L, .n_kv_heads = C_H, .head_dim = C_D, .page_tokens = C_PT, .dtype = dt, .scale_mode = sm,
                          .k_scale = sc, .v_scale = sc};
    cfg.mem_bytes = 40 * (int64_t)kiln_kv_page_cost(&cfg) + (int64_t)kiln_kv_pool_fixed_bytes(&cfg);
    c->rng = seed * 0x9e3779b97f4a7c15ull + 7;
    for (int i = 0; i < 8 * C_PT; i++) c->tok[i] = (int32_t)(next(&c->rng) % 32000);
    c->q = malloc(2 * C_H * C_D * sizeof *c->q);
    c->out = malloc(2 * C_H * C_D * sizeof *c->out);
    if (!c->q || !c->out) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < 2 * C_H * C_D; i++) c->q[i] = (float)((int)(next(&c->rng) % 2001) - 1000) / 1000.0f;
    KILN_TRY(kiln_kv_pool_create(&cfg, &c->p));
    KILN_TRY(kiln_kv_integ_attach(c->p, KILN_KV_INTEGRITY_HEAL, 0x6b696c6e43414d50ull, NULL, 1));
    KILN_TRY(fill(c, &c->v, 0, 4 * C_PT + 5, 0)); /* 4 full pages and an open one */
    KILN_TRY(fill(c, &c->w, 0, 3 * C_PT, 1));
    return KILN_OK;
}

static void camp_close(camp *c) {
    if (c->p) {
        kiln_kv_seq_release(c->p, &c->v);
        kiln_kv_seq_release(c->p, &c->w);
        kiln_kv_pool_free(c->p);
    }
    free(c->v.pages); free(c->w.pages); free(c->q); free(c->out);
}

/* n faults of one kind into c (or a fault-free workload when fault < 0). */
static kiln_status run(camp *c, int fault, uint64_t n) {
    const int len = c->v.len;
    if (fault < 0) {
        kiln_kv_integrity_stats st;
        kiln_kv_integ_stats(c->p, &st);
        const uint64_t base = st.checks;
        for (uint64_t r = 0;; r++) {
            kiln_kv_integ_stats(c->p, &st);
            if ((st.checks - base) / (C_L * 2 * C_H) >= n) return KILN_OK;
            /* decode-like appends, rewinds and prefix shares (see the test's workload) */
            if (r % 8 == 7 && c->v.len > 2 * C_PT) {
                int to = c->v.len - 1 - (int)(next(&c->rng) % C_PT);
                c->tok[to] ^= 1;
                c->v.len = to; /* a truncation (kiln_session_truncate), then other tokens */
                KILN_TRY(fill(c, &c->v, to, to + 1, 0));
            } else if (c->v.len + 1 >= 8 * C_PT) {
                kiln_kv_integ_rollback(c->p, &c->v, 2);
            } else {
                KILN_TRY(fill(c, &c->v, c->v.len, c->v.len + 1, 0));
            }
            if (r % 64 == 0) {
                kiln_kv_seq tmp = {0};
                KILN_TRY(kiln_kv_seq_share_prefix(c->p, &tmp, &c->v, c->v.len - 1));
                attend_all(c, &tmp);
                kiln_kv_seq_release(c->p, &tmp);
                free(tmp.pages);
            }
            attend_all(c, &c->v);
            if (kiln_kv_integ_bad_slot(&c->v) >= 0) return kiln_fail(KILN_ERR_INTEGRITY, "fault-free campaign: a page failed verification (round %llu, length %d, slot %d)", (unsigned long long)r, c->v.len, kiln_kv_integ_bad_slot(&c->v));
        }
    }
    for (uint64_t i = 0; i < n; i++) {
        if (!kiln_kv_integ_inject(c->p, &c->v, (kiln_kv_fault)fault, &c->rng))
            return kiln_fail(KILN_ERR_INTERNAL, "campaign: no target for a %s fault", kiln_kv_fault_name((kiln_kv_fault)fault));
        if (fault == KILN_KV_FAULT_LOST_WRITE) {
            /* the armed lost write hits the next row written: rewrite the open page */
            kiln_kv_integ_rollback(c->p, &c->v, 4);
            KILN_TRY(fill(c, &c->v, 4 * C_PT, len, 0));
        }
        attend_all(c, &c->v);
        int bad = kiln_kv_integ_bad_slot(&c->v);
        if (kiln_kv_integ_undo(c->p) > 0) continue; /* bit flips and block-table changes reverted */
        if (bad >= 0) { /* heal: drop from the bad page, recompute (store) the rows again */
            kiln_kv_integ_rollback(c->p, &c->v, bad);
            KILN_TRY(fill(c, &c->v, bad * C_PT, len, 0));
        }
    }
    return KILN_OK;
}

kiln_status kiln_kv_integrity_campaign(int fault, uint64_t n, uint64_t seed, kiln_kv_campaign *out) {
    memset(out, 0, sizeof *out);
    out->fault = fault;
    if (fault >= KILN_KV_FAULT_KINDS) return kiln_fail(KILN_ERR_INVALID_ARG, "campaign: fault kind %d is out of range", fault);
    double t0 = kiln_now();
    /* data faults on BF16 pages; scale faults half on FP8 dynamic (per-page) and half on the FP8 static table */
    const int parts = fault == KILN_KV_FAULT_SCALE ? 2 : 1;
    for (int part = 0; part < parts; part++) {
        camp c;
        kiln_kv_dtype dt = fault == KILN_KV_FAULT_SCALE ? KILN_KV_FP8 : KILN_KV_BF16;
        kiln_kv_scale_mode sm = part ? KILN_KV_SCALE_STATIC : KILN_KV_SCALE_DYNAMIC;
        uint64_t m = parts == 2 ? (part ? n - n / 2 : n / 2) : n;
        kiln_status st = camp_open(&c, dt, sm, seed + (uint64_t)part);
        kiln_kv_integrity_stats a, b;
        if (st == KILN_OK) {
            kiln_kv_integ_stats(c.p, &a);
            st = run(&c, fault, m);
            kiln_kv_integ_stats(c.p, &b);
        }
        if (st != KILN_OK) { camp_close(&c); return st; }
        if (fault >= 0) {
            out->injected += b.injected[fault] - a.injected[fault];
            out->detected += b.injected_detected[fault] - a.injected_detected[fault];
            out->detected_before_use += b.detected_before_use[fault] - a.detected_before_use[fault];
            out->false_alarms += b.false_alarms - a.false_alarms;
        } else {
            out->false_alarms += b.detections - a.detections; /* nothing was injected: every detection is false */
        }
        out->verifications += b.checks - a.checks;
        camp_close(&c);
    }
    out->page_verifications = out->verifications / (C_L * 2 * C_H);
    out->seconds = kiln_now() - t0;
    return KILN_OK;
}
