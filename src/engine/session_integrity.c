/* session_integrity.c — KV integrity of a kiln_session: attach, heal by replay, counters, fault
 * injection through the public API (kiln.h "KV integrity" block; design in kv/integrity.h).
 *
 * Heal by replay. kiln_session_eval runs its tokens in chunks and logs each chunk's first position
 * (kiln_kv_integ_note). When a page fails, every position from that page on is dropped and the
 * logged chunks are run again, with the same tokens at the same positions in the same chunk sizes.
 * The kernels are deterministic for a given chunk (same threads, same splits), and the replay
 * starts at a page start that is also a chunk start (kiln_kv_integ_replay_from), so a replayed page
 * is rebuilt from empty exactly as the first time (FP8 dynamic scales included): the KV bytes, the
 * logits and hence the greedy output are those of a fault-free run. */
#include "kiln_test.h"
#include "engine/session_integrity.h"
#include "base/status.h"
#include "kv/integrity.h"
#include "model/forward.h"
#include "model/model.h"
#include <stdlib.h>
#include <string.h>

#define HEAL_ATTEMPTS 8

kiln_status kiln_session_integ_attach_(kiln_kv_pool *pool, const kiln_model *m, const kiln_options *o) {
    kiln_kv_integrity mode = o->kv_integrity;
    if (mode == KILN_KV_INTEGRITY_DEFAULT) mode = KILN_KV_INTEGRITY_HEAL;
    if (mode == KILN_KV_INTEGRITY_OFF) {
        if (o->kv_inject_faults) return kiln_fail(KILN_ERR_INVALID_ARG, "--inject-kv-faults needs --kv-integrity detect, heal or strict (it is off)");
        return KILN_OK;
    }
    return kiln_kv_integ_attach(pool, mode, kiln_kv_integ_model_id(m), o->kv_inject_faults, o->quiet);
}

/* Replays the logged chunks from position `from` to `end` (rolled back already). */
static kiln_status replay(kiln_model *m, kiln_kv_pool *pool, kiln_kv_seq *seq, kiln_forward_ws *ws, const int32_t *chunks, int n_chunks,
                          const int32_t *toks, int from, int end, int start, float *logits) {
    const int V = m->hp.vocab;
    for (int i = 0; i < n_chunks; i++) {
        int cs = chunks[i], ce = i + 1 < n_chunks ? chunks[i + 1] : end;
        if (ce > end) ce = end;
        if (ce <= cs) continue;
        if (ce - cs > ws->chunk)
            return kiln_fail(KILN_ERR_INTEGRITY, "kv integrity: cannot heal positions %d-%d: they were not computed by the model "
                             "(kiln_session_kv_fill copies), so there is nothing to replay", cs, ce - 1);
        KILN_TRY(kiln_kv_seq_reserve(pool, seq, ce));
        KILN_TRY(kiln_kv_integ_note(pool, seq, cs, toks + (cs - from), ce - cs, 1));
        float *lg = logits && cs >= start ? logits + (size_t)(cs - start) * V : NULL;
        KILN_TRY(kiln_forward(m, pool, seq, ws, toks + (cs - from), ce - cs, lg));
        if (kiln_kv_integ_bad_slot(seq) >= 0) return KILN_OK; /* failed again: the caller heals again */
    }
    return KILN_OK;
}

void kiln_session_integ_begin_call_(kiln_session *s, int n) {
    kiln_model *m;
    kiln_kv_pool *pool;
    kiln_kv_seq *seq;
    kiln_forward_ws *ws;
    kiln_session_parts_(s, &m, &pool, &seq, &ws);
    kiln_kv_integ_call_end(pool); /* a call that failed half-way left its scope open */
    kiln_kv_integ_tick(pool, seq);
    if (n > ws->chunk) kiln_kv_integ_call_begin(pool);
}

static kiln_status after_chunk(kiln_session *s, int start, int done, int n, float *logits);
kiln_status kiln_session_integ_after_chunk_(kiln_session *s, int start, int done, int n, float *logits) {
    kiln_status st = after_chunk(s, start, done, n, logits);
    if (st != KILN_OK || done == n) {
        kiln_model *m;
        kiln_kv_pool *pool;
        kiln_kv_seq *seq;
        kiln_forward_ws *ws;
        kiln_session_parts_(s, &m, &pool, &seq, &ws);
        kiln_kv_integ_call_end(pool);
    }
    return st;
}

static kiln_status after_chunk(kiln_session *s, int start, int done, int n, float *logits) {
    kiln_model *m;
    kiln_kv_pool *pool;
    kiln_kv_seq *seq;
    kiln_forward_ws *ws;
    kiln_session_parts_(s, &m, &pool, &seq, &ws);
    const int pt = pool->cfg.page_tokens, end = start + done;
    const kiln_kv_integrity mode = kiln_kv_integ_mode(pool);
    /* a multi-chunk call verified each slice once: all of them again before its logits go out */
    const int final = done == n && kiln_kv_integ_in_call(pool);
    for (int attempt = 0;; attempt++) {
        if (final) kiln_kv_integ_verify_seq(pool, seq);
        int bad = kiln_kv_integ_bad_slot(seq);
        if (bad < 0) break;
        if (mode == KILN_KV_INTEGRITY_DETECT) {
            kiln_kv_integ_clear_bad(seq);
            break;
        }
        char why[256];
        kiln_kv_integ_describe_bad(pool, seq, why, sizeof why);
        if (mode == KILN_KV_INTEGRITY_STRICT || attempt >= HEAL_ATTEMPTS) {
            kiln_kv_integ_count_strict(pool);
            kiln_kv_integ_rollback(pool, seq, bad);
            return kiln_fail(KILN_ERR_INTEGRITY, "KV integrity (%s): %s; detected before any value computed from it was returned; the call failed "
                             "and the sequence was rolled back to %d tokens", mode == KILN_KV_INTEGRITY_STRICT ? "--kv-integrity strict"
                             : "heal gave up after repeated failures", why, seq->len);
        }
        /* heal: everything from the first bad page on is dropped and recomputed */
        const kiln_kv_seq_integ *si = seq->integ;
        int from = kiln_kv_integ_replay_from(seq, pt, bad), n_chunks = 0;
        if (from > end) from = end;
        int32_t *chunks = malloc(((size_t)si->n_chunk + 1) * sizeof *chunks);
        int32_t *toks = malloc(((size_t)(end - from) + 1) * sizeof *toks);
        if (!chunks || !toks || si->n_tok < end) {
            free(chunks);
            free(toks);
            return kiln_fail(KILN_ERR_NOMEM, "kv integrity: cannot heal (out of memory or no token history)");
        }
        for (int i = 0; i < si->n_chunk; i++)
            if (si->chunk[i] >= from && si->chunk[i] < end) chunks[n_chunks++] = si->chunk[i];
        memcpy(toks, si->tok + from, (size_t)(end - from) * sizeof *toks);
        kiln_kv_integ_rollback(pool, seq, from / pt);
        kiln_kv_integ_count_heal(pool, end - from);
        kiln_status st = replay(m, pool, seq, ws, chunks, n_chunks, toks, from, end, start, logits);
        free(chunks);
        free(toks);
        if (st != KILN_OK) return st;
    }
    /* pages past this chunk were released by a rollback: the rest of the call needs them again */
    KILN_TRY(kiln_kv_seq_reserve(pool, seq, start + n));
    return KILN_OK;
}

void kiln_session_kv_integrity(const kiln_session *s, kiln_kv_integrity_stats *out) {
    kiln_model *m;
    kiln_kv_pool *pool;
    kiln_kv_seq *seq;
    kiln_forward_ws *ws;
    kiln_session_parts_((kiln_session *)s, &m, &pool, &seq, &ws);
    kiln_kv_integ_stats(pool, out);
}

kiln_status kiln_session_inject_kv_fault(kiln_session *s, kiln_kv_fault kind, uint64_t seed, int *injected) {
    kiln_model *m;
    kiln_kv_pool *pool;
    kiln_kv_seq *seq;
    kiln_forward_ws *ws;
    kiln_session_parts_(s, &m, &pool, &seq, &ws);
    *injected = 0;
    if (!pool->integ) return kiln_fail(KILN_ERR_INVALID_ARG, "inject_kv_fault: KV integrity is off for this session");
    if (kind < 0 || kind >= KILN_KV_FAULT_KINDS) return kiln_fail(KILN_ERR_INVALID_ARG, "inject_kv_fault: fault kind %d is out of range", (int)kind);
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 1;
    *injected = kiln_kv_integ_inject(pool, seq, kind, &rng);
    return KILN_OK;
}
