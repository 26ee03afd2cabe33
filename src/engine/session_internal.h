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
#endif
