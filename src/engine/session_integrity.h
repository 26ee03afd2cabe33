/* session_integrity.h — KV integrity in a kiln_session (internal; see kv/integrity.h and
 * docs/INTEGRITY.md): attaching the pool's integrity state, and healing after a forward chunk. */
#ifndef KILN_ENGINE_SESSION_INTEGRITY_H
#define KILN_ENGINE_SESSION_INTEGRITY_H
#include "kiln.h"
#include "kv/kv.h"

struct kiln_forward_ws;

/* The session's parts (defined in session.c). */
void kiln_session_parts_(kiln_session *s, kiln_model **m, kiln_kv_pool **pool, kiln_kv_seq **seq, struct kiln_forward_ws **ws);

/* Attaches integrity in the mode the options ask for (default heal) to a fresh session pool. */
kiln_status kiln_session_integ_attach_(kiln_kv_pool *pool, const kiln_model *m, const kiln_options *o);

/* At the start of kiln_session_eval(tokens, n): the fault-injection schedule (so each fault is read
 * by this call), and, when the call runs in several chunks, the multi-chunk scope
 * (kiln_kv_integ_call_begin: each slice hashed once per call, all re-verified after the last chunk). */
void kiln_session_integ_begin_call_(kiln_session *s, int n);

/* After each forward chunk of kiln_session_eval(tokens, n): the call started at position `start`,
 * `done` of its n tokens are computed. On a verification failure: detect → counted, go on;
 * heal → roll back to the first bad page and replay the logged chunks from there (the same chunks,
 * so the same bits; rows of this call's logits are rewritten); strict → KILN_ERR_INTEGRITY. */
kiln_status kiln_session_integ_after_chunk_(kiln_session *s, int start, int done, int n, float *logits);
#endif
