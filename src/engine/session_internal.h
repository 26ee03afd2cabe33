/* session_internal.h — internal accessors of a kiln_session for engine helpers outside session.c
 * (session_util.c). Not part of the public API. */
#ifndef KILN_ENGINE_SESSION_INTERNAL_H
#define KILN_ENGINE_SESSION_INTERNAL_H
#include "kiln.h"
#include "kv/kv.h"

/* The session's KV pool and its one sequence (defined in session.c). */
void kiln_session_kv_(kiln_session *s, kiln_kv_pool **pool, kiln_kv_seq **seq);
/* Tells the session's helpers (the MTP drafter) that the sequence was rolled back to n positions. */
void kiln_session_truncated_(kiln_session *s, int n);
/* kiln_session_eval of n tokens that are n decodes (a speculative verify step: the token and its
 * drafts): the few-token kernels take the 1-token step's form (kiln_kctx.decode_steps), so each
 * position gets the logits a 1-token step would give it. */
kiln_status kiln_session_eval_decodes_(kiln_session *s, const int32_t *tokens, int n, float *logits);
#endif
