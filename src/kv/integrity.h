/* integrity.h — KV cache integrity (issue 5; docs/INTEGRITY.md): seals that bind each KV page's
 * identity to its content, verification fused into attention and at every hand-off, fault
 * injection, counters. Internal API; the public view is the "KV integrity" block of kiln.h.
 *
 * Seal unit. One head's slice of one page of one layer's K (or V) array: the rows
 * [0, n_rows) of a page, contiguous in memory (kv.h layout [page][head][page_tokens][dim]), plus
 * the dequantization parameter the kernels apply to it (static FP8: the (layer, head) scale;
 * dynamic FP8: the page's scale; F32/BF16: none). A page has n_layers × kinds × n_kv_heads units
 * (kinds = 2, or 1 when V shares K). Per unit the integrity state keeps two 64-bit words: the
 * seal and a verification tag.
 *
 *   seal = XXH3-64(unit bytes) XOR seed(identity)
 *   identity = model id, page_tokens, block-table slot i, rows n (positions [i·pt, i·pt + n)),
 *              allocation epoch of the page as recorded in the sequence's block table entry,
 *              prefix hash (chain hash of every token id from position 0 to i·pt + n),
 *              layer, K/V, KV head, the dequantization parameter's bits.
 * The seed is a chain of 64-bit bijective mixes over those fields, so two different identities give
 * different seeds except with probability ~2^-64; a reader recomputes the seed from the identity
 * IT expects (its own slot, its positions, its recorded epoch, its own tokens), so a whole intact
 * page read from the wrong place, a page freed and reused by another sequence, or a stale copy
 * fails like a bit flip does. The prefix chain is the prefix cache's page hash
 * (engine/prefix_cache.h: h_i = XXH3(tokens of page i, seed h_{i-1})), extended to partial pages.
 *
 * When seals are computed. Every kiln_kv_store of a row (layer l, position p, slot i, offset o):
 * first the unit's current seal over rows [0, o) is verified (so a corruption is never laundered by
 * re-sealing), the row is written, then the unit is re-sealed over rows [0, o + 1) from the page
 * memory. A full page is therefore sealed when it fills; the open last page carries a seal over the
 * rows written so far.
 *
 * When seals are verified.
 *   attention   kiln_kv_attend_batch verifies, per task (one KV head of one sequence, a context
 *               range), each page right before the kernel reads it, a few pages at a time so the
 *               bytes are still in L1/L2 when the kernel runs: the hash pass takes the memory
 *               traffic and the kernel reads cached data. A unit verified in this attention call
 *               (= this step, this layer) with the same expected identity is not hashed again
 *               (prefill tiles and sharers of one page read it many times per step).
 *   stores      as above (the open page, before each append).
 *   hand-offs   prefix-cache reuse (kiln_kv_seq_share_page: the page must verify against the new
 *               owner's identity before it is appended), copy-on-write (kiln_kv_seq_share_prefix:
 *               the copy is sealed from the SOURCE bytes, so a partly copied page fails), release
 *               (the block table is checked against the binding records before references drop).
 *   sweep       kiln_kv_integ_sweep_page: idle prefix-cache pages (engine/integrity_engine.c).
 *   parameters  static FP8 scales and K means are compared with a checksummed master copy before
 *               every store and attention call that uses them.
 *
 * Modes (kiln.h kiln_kv_integrity): off = no state at all; detect = count and log, data used as is;
 * heal = a unit that fails is not read by attention (the step's output for that sequence is
 * discarded), the sequence's first bad slot is published (kiln_kv_integ_bad_slot) and the caller
 * rolls back to it and recomputes (engine/session_integrity.c, engine/scheduler.c); strict = same
 * detection, the caller fails the request with KILN_ERR_INTEGRITY.
 *
 * Threads: stores, hand-offs, notes, rollbacks and injections run on the pool owner's thread;
 * attention verification runs in the OpenMP tasks (relaxed atomics on tags and counters, a mutex
 * around the detection log). */
#ifndef KILN_KV_INTEGRITY_H
#define KILN_KV_INTEGRITY_H
#include "kv/kv.h"
#include "kv/kv_isa.h"
#include <stdint.h>

struct kiln_model;
typedef struct kiln_kv_integ kiln_kv_integ; /* per-pool state (kiln_kv_pool.integ), opaque */

/* Per-sequence state (kiln_kv_seq.integ), allocated on first use, freed with the sequence's pages
 * (kiln_kv_seq_release). */
typedef struct kiln_kv_seq_integ {
    int32_t *tok;            /* token history: ids of positions [0, n_tok) */
    int n_tok, cap_tok;
    uint64_t *chain;         /* [n_chain] prefix hash of full page i (all its tokens known) */
    int n_chain, cap_chain;
    int32_t *rec_page;       /* binding records per block-table slot: the page bound ... */
    uint32_t *rec_epoch;     /* ... and its allocation epoch at binding time */
    int n_rec, cap_rec;
    int *hi;                 /* [n_layers] positions [0, hi) stored in that layer */
    int32_t *chunk;          /* first positions of the forward chunks, in order (replay log) */
    int n_chunk, cap_chunk;
    uint64_t att_gen;        /* attention call this sequence was last seen in ... */
    int att_hi;              /* ... and the positions [0, att_hi) it reads there */
    int *ver_hi;             /* [n_kv_heads] slots [0, ver_hi) verified good in that call (prefill tiles skip them) */
    uint64_t *base;          /* [n_base] identity seeds of full slots (same in every layer and head) */
    int n_base, cap_base;
    int bad_slot;            /* first slot that failed verification since the last clear (-1 none) */
    int bad_kind;            /* diagnosis of that failure (KILN_KV_DETECT_*) */
} kiln_kv_seq_integ;

/* Diagnosed kinds of a detection (counters). */
enum {
    KILN_KV_DETECT_CONTENT = 0, /* data or per-page scale bytes differ from what was sealed */
    KILN_KV_DETECT_SCALE,       /* a pool-wide static FP8 scale / K mean differs from the master copy */
    KILN_KV_DETECT_WRONG_PAGE,  /* the block-table entry names another page than the one bound */
    KILN_KV_DETECT_STALE_PAGE,  /* the page was freed (and maybe reallocated) since it was bound */
    KILN_KV_DETECT_KINDS
};

/* ---- life cycle ---- */
/* Attaches integrity state to a fresh pool (no sequence holds pages yet). mode OFF/DEFAULT
 * resolution is the caller's: OFF attaches nothing. model_id binds seals to the model
 * (kiln_kv_integ_model_id). inject: a fault-injection SPEC (see kiln_kv_integ_parse_spec) or NULL.
 * quiet: no log lines on stderr. */
kiln_status kiln_kv_integ_attach(kiln_kv_pool *p, kiln_kv_integrity mode, uint64_t model_id, const char *inject, int quiet);
void kiln_kv_integ_free(kiln_kv_pool *p);
uint64_t kiln_kv_integ_model_id(const struct kiln_model *m);
/* Seal + tag bytes per page (what integrity adds to a page's metadata). */
uint64_t kiln_kv_integ_page_bytes(const kiln_kv_config *c);

/* ---- hooks called by kv.c / kv_share.c ---- */
void kiln_kv_integ_bind(kiln_kv_pool *p, kiln_kv_seq *s);            /* after slots were appended */
void kiln_kv_integ_release(kiln_kv_pool *p, kiln_kv_seq *s);         /* before the references drop */
void kiln_kv_integ_before_store(kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos);
void kiln_kv_integ_after_store(kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos);
/* Host stores that hash what they wrote: kiln_kv_integ_store_is_append is 1 when the store that
 * kiln_kv_integ_before_store just checked appends to its slices (the seals then add the new rows'
 * content hashes, nothing else is read). The caller may then hash each row from the bytes it wrote
 * (kiln_kv_integ_row_hash: unit kind of layer l, row `off` of the page) and pass them, row_hash[kind·H
 * + h], to kiln_kv_integ_after_store_rows instead of kiln_kv_integ_after_store, which would read the
 * rows back from the pool — on a discrete GPU mapped VRAM, which the CPU reads uncached (~1 µs a
 * load). */
int kiln_kv_integ_store_is_append(const kiln_kv_pool *p);
uint64_t kiln_kv_integ_row_hash(const kiln_kv_pool *p, int layer, int kind, int off, const void *bytes);
void kiln_kv_integ_after_store_rows(kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, const uint64_t *row_hash);
/* Stores a device writes (the vulkan backend records the row writes of a step and runs them at
 * its next flush, hashing each row in the shader as it writes it: the seal is computed where the
 * row is written, not by a second pass). Only plain appends go this way:
 * kiln_kv_integ_store_appends is 1 when storing positions pos[0..n) of seq[0..n) in layer l (in that
 * order) appends each row right after the sealed ones of a page the sequence still owns, in a
 * pool without dynamic scales and with whole-word rows (or integrity off); otherwise the host
 * stores (kiln_kv_store_cx). Per token, in order: kiln_kv_integ_store_begin when the write is
 * recorded (the checks of kiln_kv_integ_before_store and the bookkeeping of the stored row: later
 * tokens of the op see it; pend->lost ≥ 0 names the unit kind·H + h whose row the device must NOT
 * write: the fault campaign's armed lost write), then once the write has run
 * kiln_kv_integ_store_end with the row's content hashes (row_hash[kind·H + h], kind 0 K / 1 V, the
 * keys of its words inside the slice), which seals it (and registers the lost write); or, when the
 * write never ran (a failed submit), kiln_kv_integ_store_undo in reverse order, after which the host
 * may store the token again. */
typedef struct kiln_kv_integ_pending { int32_t pg, prev_slot; int prev_hi, lost; } kiln_kv_integ_pending;
int kiln_kv_integ_store_appends(kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int layer);
void kiln_kv_integ_store_begin(kiln_kv_pool *p, kiln_kv_seq *s, int layer, int pos, kiln_kv_integ_pending *pend);
void kiln_kv_integ_store_end(kiln_kv_pool *p, const kiln_kv_seq *s, int layer, int pos, const uint64_t *row_hash,
                             const kiln_kv_integ_pending *pend);
void kiln_kv_integ_store_undo(kiln_kv_pool *p, kiln_kv_seq *s, int layer, const kiln_kv_integ_pending *pend);
/* End of kiln_kv_seq_share_prefix(dst, src, n): dst takes src's tokens and binding records; a
 * copied partial last page is verified at the source and sealed for dst from the SOURCE bytes. */
void kiln_kv_integ_copied(kiln_kv_pool *p, const kiln_kv_seq *src, kiln_kv_seq *dst, int n);
/* Before `page` is appended to s as a shared full page: KILN_ERR_INTEGRITY if it does not verify
 * against s's identity for that slot (s's tokens must be noted), KILN_OK otherwise. */
kiln_status kiln_kv_integ_check_share(kiln_kv_pool *p, kiln_kv_seq *s, int32_t page);
void kiln_kv_integ_begin_attend(const kiln_kv_pool *p, int layer, int n, kiln_kv_seq *const *seq, const int *pos);
/* Runs fn over [t0, t1) of s for KV head kvh and verifies every page it reads before returning.
 * fused = 1: fn is an attention kernel that hashes what it loads (kv_isa.h, hsum) and rw holds
 * fresh rows (m = -inf, l = 0, acc = 0): the pages are compared with their seals after the kernel
 * read them, and a failed page is taken out by re-running without it (heal / strict). fused = 0
 * (other scans over the pages): each page is hashed on its own right before fn reads it. */
void kiln_kv_integ_attend(const kiln_kv_pool *p, int layer, const kiln_kv_seq *s, int kvh, kiln_kv_attend_fn fn,
                          const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int t1, int fused);

/* ---- content hashes computed where the pages are read (the vulkan attention shader) ----
 * A backend that attends on a device can hash what its kernel loads with the fused content hash
 * (docs/INTEGRITY.md "The content hash": Σ key[w] × word[w] mod 2^64 over a slice's 32-bit words,
 * w the word's index inside the (page, head) slice) and hand the per-slot sums here; the seals are
 * then compared on the host exactly as the cpu backend's fused walk compares them (identity seeds,
 * tags of a multi-chunk call, detections, bad-slot publication). Only for pools whose rows are
 * whole words (kiln_kv_integ_fusable); otherwise the backend verifies first
 * (kv.h kiln_kv_verify_attend_cx). */
int kiln_kv_integ_fusable(const kiln_kv_pool *p); /* integrity on and every row a multiple of 4 bytes */
/* The keys: key[w] for word w of a slice, *n of them (a slice's words + 16). */
const uint32_t *kiln_kv_integ_hash_keys(const kiln_kv_pool *p, size_t *n);
/* What identifies an attention call (kiln_kv_integ_begin_attend) to checks made after later calls
 * began (a device step compares the sums of every layer once its work has run). */
typedef struct kiln_kv_integ_call { uint64_t gen, gen_key; } kiln_kv_integ_call;
void kiln_kv_integ_call_state(const kiln_kv_pool *p, kiln_kv_integ_call *out); /* of the call begun last */
/* After the call `call` and a kernel that read s's positions [0, t1) (t1 = that call's max pos + 1
 * for s) of KV head kvh: sums[stride·slot + kind] is the content hash of rows [0, n_rows) of that
 * slot's K (kind 0) and V (kind 1, pools with a V array) slice. 1 = every slice good. The slices
 * must not have been stored to since the kernel read them (a step stores a layer before it
 * attends over it). */
int kiln_kv_integ_check_sums(const kiln_kv_pool *p, const kiln_kv_integ_call *call, int layer, const kiln_kv_seq *s, int kvh, int t1,
                             const uint64_t *sums, size_t stride);

/* ---- callers (session, scheduler) ---- */
/* Records the token ids of positions [first, first + n) of s before they are run (and, with
 * log_chunk, that they form one forward chunk, for bit-exact replay). A position below the history's
 * end whose id differs rewinds: the page holding it is verified and re-sealed to the rows before it. */
kiln_status kiln_kv_integ_note(kiln_kv_pool *p, kiln_kv_seq *s, int first, const int32_t *toks, int n, int log_chunk);
/* Tokens of positions [from, to) as copies of positions (pos mod from) (kiln_session_kv_fill). */
kiln_status kiln_kv_integ_note_cyclic(kiln_kv_pool *p, kiln_kv_seq *s, int from, int to);
int kiln_kv_integ_bad_slot(const kiln_kv_seq *s);   /* -1 when nothing failed */
void kiln_kv_integ_clear_bad(kiln_kv_seq *s);
/* Describes s's first failure in one line (for strict errors and logs). */
void kiln_kv_integ_describe_bad(const kiln_kv_pool *p, const kiln_kv_seq *s, char *buf, size_t cap);
/* Drops slots [slot, n_pages) of s: entries are repaired from the binding records first, entries
 * whose page was freed under the sequence are dropped without a release; len and the integrity
 * state shrink to slot × page_tokens. Counts a heal. */
void kiln_kv_integ_rollback(kiln_kv_pool *p, kiln_kv_seq *s, int slot);
/* Replay start for healing from `slot`: the greatest logged chunk start <= slot × pt that is also
 * a page start (so replayed pages are rebuilt from empty, as the first time). */
int kiln_kv_integ_replay_from(const kiln_kv_seq *s, int pt, int slot);
/* Counts a heal that recomputed `positions` positions. */
void kiln_kv_integ_count_heal(kiln_kv_pool *p, int positions);
void kiln_kv_integ_count_strict(kiln_kv_pool *p);
/* Verifies a full page on its own (sweep): expected identity slot, prefix hash (prefix cache chain),
 * epoch from the page header. 1 = good, 0 = bad (counted, logged). */
int kiln_kv_integ_sweep_page(kiln_kv_pool *p, int32_t page, uint64_t prefix);
/* Physical pages whose content failed since the last call (for the prefix cache); returns n. */
int kiln_kv_integ_take_bad_pages(kiln_kv_pool *p, int32_t *out, int cap);
void kiln_kv_integ_stats(const kiln_kv_pool *p, kiln_kv_integrity_stats *out);
kiln_kv_integrity kiln_kv_integ_mode(const kiln_kv_pool *p); /* OFF when the pool has no integrity state */

/* ---- multi-chunk calls (a prompt run in several forward chunks, docs/INTEGRITY.md) ----
 * Between call_begin and call_end, a slice verified once against an identity is not hashed again
 * in later chunks of the call (a prefill would otherwise re-hash the whole cache at every chunk:
 * quadratic in the prompt length); instead kiln_kv_integ_verify_seq re-verifies every slice of the
 * sequence after the last chunk, before the call returns logits, so a page corrupted between two
 * chunks is still detected before any token computed from it is emitted. */
void kiln_kv_integ_call_begin(kiln_kv_pool *p);
int kiln_kv_integ_in_call(const kiln_kv_pool *p);
void kiln_kv_integ_call_end(kiln_kv_pool *p);
/* Every stored slice of s in every layer; failures are detections (bad slot set). 1 = all good. */
int kiln_kv_integ_verify_seq(kiln_kv_pool *p, kiln_kv_seq *s);

/* ---- fault injection ---- */
/* Injects one fault of `kind` into s now (or arms it, for lost writes and partial copies, which act
 * on the next store / copy). rng: xorshift state. Returns 1 if a fault was injected or armed, 0 if
 * s offers no target for that kind (e.g. no full page, no FP8 scales). */
int kiln_kv_integ_inject(kiln_kv_pool *p, kiln_kv_seq *s, kiln_kv_fault kind, uint64_t *rng);
/* Injection schedule from the SPEC given at attach: called once per step with a sequence of the
 * step; injects when the schedule says so. */
void kiln_kv_integ_tick(kiln_kv_pool *p, kiln_kv_seq *s);
/* Undoes every injected bit flip and block-table change still in place (campaigns: the next fault
 * starts from a clean pool) and clears the victims' bad slots. Returns how many were undone. */
int kiln_kv_integ_undo(kiln_kv_pool *p);
/* Parses a SPEC ("bitflip=10,scale=2,every=4,after=8,seed=7"; kinds: bitflip multibit scale
 * wrongpage stale lostwrite partialcopy, or all=N): KILN_ERR_INVALID_ARG naming the bad item. */
kiln_status kiln_kv_integ_parse_spec(const char *spec, int counts[KILN_KV_FAULT_KINDS], int *every, int *after, uint64_t *seed);
#endif
