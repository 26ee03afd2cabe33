/* session_util.c — small session operations used by the evaluation harness (src/eval), kept out of
 * session.c: rolling a sequence back so that many continuations can be scored after one shared
 * context. */
#include "kiln.h"
#include "base/status.h"
#include "engine/session_internal.h"

/* Rolls the sequence back to its first n tokens. The pages that held positions >= n stay in the
 * sequence's block table (the next kiln_session_eval overwrites those positions before any query
 * can attend to them: attention reads positions [0, len) only), so truncating and re-extending
 * never allocates. n == 0 releases every page, like kiln_session_reset. */
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
    seq->len = n;
    return KILN_OK;
}
