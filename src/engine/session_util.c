/* session_util.c — small session operations used by the evaluation harness (src/eval), kept out of
 * session.c: rolling a sequence back so that many continuations can be scored after one shared
 * context. */
#include "kiln.h"
#include "base/status.h"
#include "engine/session_internal.h"

/* Rolls the sequence back to its first n tokens. The pages that held positions >= n stay in the
 * sequence's block table (the next kiln_session_eval overwrites those positions before any query
 * can attend to them: attention reads positions [0, len) only), so truncating and re-extending
 * never allocates. n == 0 releases every page, like kiln_session_reset.
 *
 * Exact only when a page holds no state derived from the positions rolled back: with dynamic FP8
 * scales a page's scale is the max over every row written to it so far (and grows only), so the
 * rows written after a roll-back would be quantized differently from a fresh run. That case is
 * refused with KILN_ERR_UNSUPPORTED (callers fall back to kiln_session_reset); n = 0 and n = length
 * always work. */
kiln_status kiln_session_truncate(kiln_session *s, int n) {
    kiln_kv_pool *pool;
    kiln_kv_seq *seq;
    kiln_session_kv_(s, &pool, &seq);
    if (n < 0 || n > seq->len)
        return kiln_fail(KILN_ERR_INVALID_ARG, "session_truncate: n = %d is outside [0, %d] (the sequence length)", n, seq->len);
    if (n == 0) {
        kiln_session_reset(s);
        return KILN_OK;
    }
    if (n == seq->len) return KILN_OK;
    if (pool->dscale)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "session_truncate: a KV cache with dynamic FP8 scales cannot roll back to %d of %d tokens "
                         "exactly (page scales keep the rolled-back rows' maxima): reset instead", n, seq->len);
    seq->len = n;
    kiln_session_truncated_(s, n);
    return KILN_OK;
}
