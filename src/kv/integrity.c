/* integrity.c — KV page seals, verification (stores, attention, hand-offs, sweep), diagnosis,
 * rollback, counters and fault injection. Design and rules: integrity.h and docs/INTEGRITY.md.
 *
 * Layout of the state (kiln_kv_integ, one per pool):
 *   seal[u], tag[u]   u = ((layer × H + head) × n_pages + page) × kinds + kind (uidx): one word each per seal
 *                     unit. tag[u] = mix(seed ^ gen_key) when unit u was verified good in attention
 *                     call `gen` against identity seed, (that ^ TAG_BAD) when it failed.
 *   page_slot[page]   block-table slot of the page's last seal (the sweep's expected slot).
 *   master            copies of the pool-wide dequantization parameters (static FP8 scales, K
 *                     means) and their checksum. */
#include "kiln_test.h"
#include "kv/integrity.h"
#include "base/status.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>
#include <xxhash.h>
#include <xxh_x86dispatch.h>

#define PFX_SEED0 0x6b696c6e70726678ull /* page 0's chain seed: the prefix cache's PC_SEED0 */
#define TAG_BAD 0x8000000000000001ull
#define LOG_MAX 8                       /* detections logged per pool (then one summary line) */

typedef struct inj_fault {
    int kind;                /* kiln_kv_fault */
    const kiln_kv_seq *seq;  /* slot faults: the victim sequence and slot */
    int slot;
    int32_t page;            /* content faults: the page and unit (-1: a static-table scale fault) */
    int64_t unit;
    int layer, ukind, head;  /* static-table scale faults */
    int detected, used, dropped;
    kiln_kv_seq *foreign;    /* stale-page faults: the sequence that took the page */
    /* undo (kiln_kv_integ_undo, campaigns): flipped bits, or the block-table entry replaced */
    uint8_t *flip_at[8];
    uint8_t flip_mask[8];
    int n_flip;
    kiln_kv_seq *victim;
    int32_t old_page;
} inj_fault;

struct kiln_kv_integ {
    kiln_kv_integrity mode;
    uint64_t model_id, model_seed;
    int L, H, nk, pt, n_pages, kd;
    uint64_t *seal, *tag;
    int32_t *page_slot;
    uint64_t gen, gen_key;
    uint64_t call_key;       /* != 0 inside a multi-chunk call: tags last for the whole call */
    int group_tokens;        /* positions verified before each kernel call (L1/L2-sized; unfused path) */
    uint64_t *ukey;          /* [L × H × nk] random keys of the units' identity seeds (unit_seed) */
    uint32_t *hkey;          /* content-hash keys, one per 32-bit word of a slice (+ 16 of padding; 64-byte aligned) */
    int fused;               /* rows are whole 32-bit words: attention hashes what it loads, stores seal by row */
    int store_append;        /* the store in progress appends the row after the sealed ones (before → after_store) */
    /* pool-wide parameters: master copy [k_scale L·H][v_scale L·H][k_mean L·H·kd] */
    float *master;
    size_t n_ks, n_vs, n_km;
    uint64_t master_sum;
    kiln_kv_integrity_stats st; /* counters (relaxed atomics on the hot ones) */
    uint64_t cycles;         /* TSC cycles spent in integrity code (→ st.integrity_ns) */
    pthread_mutex_t mu;      /* detection log, bad pages, fault list */
    int quiet, logged;
    int32_t bad_pages[64];
    int n_bad_pages;
    uint8_t *taint;          /* [nk × H] units of the current store that failed verification */
    /* injection */
    int inj_active, inj_counts[KILN_KV_FAULT_KINDS], inj_every, inj_after, inj_next;
    uint64_t inj_rng, ticks;
    inj_fault *faults;
    int n_faults, cap_faults, n_undetected;
    int arm_lost;            /* lost write armed for the next store of arm_seq (NULL = any) */
    const kiln_kv_seq *arm_seq;
    int64_t lw_unit;         /* snapshot of the row the armed store writes */
    uint8_t *lw_buf, *lw_ptr;
    size_t lw_len, lw_row;   /* the buffer's capacity; the saved row's bytes */
    int32_t lw_page;
    int lw_held, lw_kind, lw_h; /* a snapshot waits for its store to land (a device store holds it until its flush) */
};

/* ---- small helpers ---------------------------------------------------------------------------- */
/* murmur3 fmix64: a bijection, so h → mix(h ^ v) distinguishes every pair of values v. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}
static inline uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}
static inline uint32_t rng_below(uint64_t *s, uint32_t n) { return n ? (uint32_t)((rng_next(s) >> 32) % n) : 0; }
static inline void add(uint64_t *c, uint64_t v) { __atomic_fetch_add(c, v, __ATOMIC_RELAXED); }

/* Time accounting of the integrity code itself: the TSC (a few cycles to read), converted with a
 * rate calibrated once per process against the monotonic clock (1 ms). */
static inline uint64_t tsc(void) { return __rdtsc(); }
static double tsc_ns_per_cycle(void) {
    static double r;
    if (r > 0) return r;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t c0 = tsc();
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec) < 1e6);
    uint64_t c1 = tsc();
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    r = c1 > c0 ? ns / (double)(c1 - c0) : 1.0;
    return r;
}

/* Layer-major: one attention task (layer, head) finds the seals of its pages in one array of
 * n_pages × kinds words, K and V of a page side by side — pages taken from the free list in order
 * share cache lines (4 per line), where a page-major layout spent a line per page per task (at
 * 32K tokens 16 MB of lines per decode step instead of ~4). */
static inline size_t uidx(const kiln_kv_integ *g, int32_t pg, int l, int kind, int h) {
    return (((size_t)l * (size_t)g->H + (size_t)h) * (size_t)g->n_pages + (size_t)pg) * (size_t)g->nk + (size_t)kind;
}
static inline uint8_t *unit_ptr(const kiln_kv_pool *p, int32_t pg, int l, int kind, int h) {
    if (kind && !p->cfg.v_shares_k) return p->v[l] + (size_t)pg * p->page_v + (size_t)h * p->head_v;
    return p->k[l] + (size_t)pg * kiln_kv_page_k_at(p, l) + (size_t)h * kiln_kv_head_k_at(p, l);
}
/* Row bytes of layer l's K (kind 0) or V (1) units (K rows differ per layer in DSA pools, kv.h). */
static inline size_t unit_row(const kiln_kv_pool *p, int l, int kind) { return kind ? p->row_v : kiln_kv_row_k_at(p, l); }
/* The dynamic scale slot of (layer, page, kind, head): the same layout as kv.c's dslot(). */
static inline float *dyn_slot(const kiln_kv_pool *p, int l, int32_t pg, int kind, int h) {
    const int H = p->cfg.n_kv_heads, nk = p->cfg.v_shares_k ? 1 : 2;
    if (kind >= nk) kind = 0;
    return p->dscale + (((size_t)l * (size_t)p->n_pages + (size_t)pg) * (size_t)nk + (size_t)kind) * (size_t)H + (size_t)h;
}
/* Bits of the dequantization factor the kernels apply to the unit (0 without one). */
static inline uint32_t param_bits(const kiln_kv_pool *p, int l, int32_t pg, int kind, int h) {
    if (p->cfg.dtype != KILN_KV_FP8) return 0;
    float f = p->dscale ? *dyn_slot(p, l, pg, kind, h) : (kind && !p->cfg.v_shares_k ? p->v_scale : p->k_scale)[(size_t)l * p->cfg.n_kv_heads + h];
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Identity → seed (integrity.h). base: the page's identity; unit: + layer, kind, head, parameter. */
static inline uint64_t base_seed(const kiln_kv_integ *g, uint64_t prefix, int slot, int n_rows, uint32_t epoch) {
    uint64_t h = mix64(g->model_seed ^ prefix);
    h = mix64(h ^ ((uint64_t)(uint32_t)slot << 16 | (uint64_t)(uint32_t)n_rows));
    return mix64(h ^ (uint64_t)epoch);
}
/* The unit's seed from the page's: base × odd + a random key of (layer, K/V, head) + the
 * parameter × odd — a few cycles per unit (attention checks ~10^5 units per decode step at 4K
 * tokens). Two units of one page differ by their keys; one unit's seed under two page identities
 * differs because the bases do (odd multipliers are bijections mod 2^64); a coincidence across
 * both needs an independent 64-bit equality (~2^-64). */
static inline uint64_t unit_seed(const kiln_kv_integ *g, uint64_t base, int l, int kind, int h, uint32_t param) {
    return base * 0x9e3779b97f4a7c15ull + g->ukey[((size_t)l * (size_t)g->H + (size_t)h) * (size_t)g->nk + (size_t)kind] +
           (uint64_t)param * 0xc2b2ae3d27d4eb4full;
}
/* Content hash of the first n bytes of a slice (docs/INTEGRITY.md, "The content hash"). */
static inline uint64_t hash_bytes(const kiln_kv_integ *g, const void *d, size_t n) { return kiln_kv_mlh(d, n, g->hkey); }
/* ... of rows [r0, r1) of a slice with `row` bytes per row (row a multiple of 4: g->fused). */
static inline uint64_t hash_rows(const kiln_kv_integ *g, const uint8_t *slice, size_t row, int r0, int r1) {
    return r1 > r0 ? kiln_kv_mlh(slice + (size_t)r0 * row, (size_t)(r1 - r0) * row, g->hkey + (size_t)r0 * row / 4) : 0;
}

/* Prefix hash of slot `slot` covering n_rows positions (integrity.h): the prefix cache's chain hash
 * for a full page, the same construction over the first n_rows tokens for a partial one. Tokens
 * not in the history (a caller that never noted them) enter as a count. */
static uint64_t prefix_of(const kiln_kv_seq_integ *si, int slot, int n_rows, int pt) {
    if (n_rows == pt && slot < si->n_chain) return si->chain[slot];
    uint64_t parent = slot == 0 ? 0 : slot - 1 < si->n_chain ? si->chain[slot - 1] : mix64(0x554e4b4e4f574eull ^ (uint64_t)slot);
    int a = slot * pt, have = si->n_tok - a;
    if (have > n_rows) have = n_rows;
    if (have < 0) have = 0;
    uint64_t h = XXH3_64bits_withSeed(si->tok + a, (size_t)have * sizeof(int32_t), parent ? parent : PFX_SEED0);
    if (have < n_rows) h = mix64(h ^ (uint64_t)(n_rows - have) ^ 0x4d495353ull);
    return h;
}
static inline int cov_of(const kiln_kv_seq_integ *si, int l, int slot, int pt) {
    int c = si->hi[l] - slot * pt;
    return c < 0 ? 0 : c > pt ? pt : c;
}

/* ---- names and parsing (public) ---------------------------------------------------------------- */
static const char *fault_names[KILN_KV_FAULT_KINDS] = {"bitflip", "multibit", "scale", "wrongpage", "stale", "lostwrite", "partialcopy"};
const char *kiln_kv_fault_name(kiln_kv_fault f) { return f >= 0 && f < KILN_KV_FAULT_KINDS ? fault_names[f] : "?"; }
const char *kiln_kv_integrity_name(kiln_kv_integrity m) {
    switch (m) {
    case KILN_KV_INTEGRITY_OFF: return "off";
    case KILN_KV_INTEGRITY_DETECT: return "detect";
    case KILN_KV_INTEGRITY_STRICT: return "strict";
    default: return "heal";
    }
}
kiln_status kiln_kv_integrity_parse(const char *s, kiln_kv_integrity *out) {
    static const struct { const char *n; kiln_kv_integrity m; } t[] = {
        {"off", KILN_KV_INTEGRITY_OFF}, {"detect", KILN_KV_INTEGRITY_DETECT}, {"heal", KILN_KV_INTEGRITY_HEAL}, {"strict", KILN_KV_INTEGRITY_STRICT}};
    for (size_t i = 0; s && i < sizeof t / sizeof t[0]; i++)
        if (strcmp(s, t[i].n) == 0) { *out = t[i].m; return KILN_OK; }
    return kiln_fail(KILN_ERR_INVALID_ARG, "--kv-integrity: '%s' is not one of off, detect, heal, strict", s ? s : "");
}
const char *kiln_kv_inject_spec_help(void) {
    return "SPEC = ITEM[,ITEM...]; ITEM = KIND[=N] | all=N | every=K (steps between faults, default 1) | after=T (first step, "
           "default 1) | seed=S; KIND = bitflip multibit scale wrongpage stale lostwrite partialcopy";
}

kiln_status kiln_kv_integ_parse_spec(const char *spec, int counts[KILN_KV_FAULT_KINDS], int *every, int *after, uint64_t *seed) {
    memset(counts, 0, KILN_KV_FAULT_KINDS * sizeof *counts);
    *every = 1;
    *after = 1;
    *seed = 1;
    if (!spec || !*spec) return kiln_fail(KILN_ERR_INVALID_ARG, "--inject-kv-faults: empty SPEC (%s)", kiln_kv_inject_spec_help());
    char item[64];
    for (const char *p = spec; *p;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof item)
            return kiln_fail(KILN_ERR_INVALID_ARG, "--inject-kv-faults: bad item at offset %d of '%s' (%s)", (int)(p - spec), spec, kiln_kv_inject_spec_help());
        memcpy(item, p, n);
        item[n] = 0;
        p += n + (p[n] == ',');
        char *eq = strchr(item, '='), *end = NULL;
        long long v = 1;
        if (eq) {
            *eq = 0;
            v = strtoll(eq + 1, &end, 10);
            if (!eq[1] || *end || v < 0 || v > 100000000)
                return kiln_fail(KILN_ERR_INVALID_ARG, "--inject-kv-faults: '%s=%s' needs a count in [0, 100000000]", item, eq + 1);
        }
        int k;
        for (k = 0; k < KILN_KV_FAULT_KINDS; k++)
            if (strcmp(item, fault_names[k]) == 0) break;
        if (k < KILN_KV_FAULT_KINDS) counts[k] = (int)v;
        else if (strcmp(item, "all") == 0) for (k = 0; k < KILN_KV_FAULT_KINDS; k++) counts[k] = (int)v;
        else if (strcmp(item, "every") == 0 && v >= 1) *every = (int)v;
        else if (strcmp(item, "after") == 0) *after = (int)v;
        else if (strcmp(item, "seed") == 0) *seed = (uint64_t)v;
        else return kiln_fail(KILN_ERR_INVALID_ARG, "--inject-kv-faults: unknown item '%s' (%s)", item, kiln_kv_inject_spec_help());
    }
    return KILN_OK;
}

/* ---- life cycle --------------------------------------------------------------------------------- */
uint64_t kiln_kv_integ_page_bytes(const kiln_kv_config *c) {
    uint64_t units = (uint64_t)c->n_layers * (uint64_t)(c->v_shares_k ? 1 : 2) * (uint64_t)c->n_kv_heads;
    return units * 2 * sizeof(uint64_t) + sizeof(int32_t);
}

uint64_t kiln_kv_integ_model_id(const struct kiln_model *m) {
    kiln_model_info in;
    kiln_model_get_info(m, &in);
    int64_t v[12] = {in.vocab_size, in.dim, in.n_layers, in.n_heads, in.n_kv_heads, in.head_dim, in.ffn_dim, in.max_context,
                     in.bos_id, in.eos_id, (int64_t)in.weight_bytes, 0};
    uint64_t h = XXH3_64bits(v, sizeof v);
    return in.arch ? XXH3_64bits_withSeed(in.arch, strlen(in.arch), h) : h;
}

static uint64_t master_checksum(const kiln_kv_integ *g) {
    return XXH3_64bits(g->master, (g->n_ks + g->n_vs + g->n_km) * sizeof(float));
}

static void free_seq_state(kiln_kv_seq_integ *si) {
    if (!si) return;
    free(si->tok); free(si->chain); free(si->rec_page); free(si->rec_epoch); free(si->hi); free(si->chunk); free(si->ver_hi); free(si->base);
    free(si);
}

kiln_status kiln_kv_integ_attach(kiln_kv_pool *p, kiln_kv_integrity mode, uint64_t model_id, const char *inject, int quiet) {
    if (mode == KILN_KV_INTEGRITY_DEFAULT) mode = KILN_KV_INTEGRITY_HEAL;
    if (mode == KILN_KV_INTEGRITY_OFF) return KILN_OK;
    if (p->integ) return kiln_fail(KILN_ERR_INTERNAL, "kv integrity: the pool already has integrity state");
    kiln_kv_integ *g = calloc(1, sizeof *g);
    if (!g) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    g->mode = mode;
    g->model_id = model_id;
    g->L = p->cfg.n_layers;
    g->H = p->cfg.n_kv_heads;
    g->nk = p->cfg.v_shares_k ? 1 : 2;
    g->pt = p->cfg.page_tokens;
    g->kd = p->cfg.k_dim;
    g->n_pages = p->n_pages;
    g->model_seed = mix64(mix64(model_id ^ 0x6b696c6e5345414cull) ^ (uint64_t)g->pt);
    g->quiet = quiet;
    tsc_ns_per_cycle();
    pthread_mutex_init(&g->mu, NULL);
    size_t units = (size_t)p->n_pages * (size_t)g->L * (size_t)g->nk * (size_t)g->H;
    g->seal = calloc(units, sizeof *g->seal);
    g->tag = calloc(units, sizeof *g->tag);
    g->page_slot = calloc((size_t)p->n_pages, sizeof *g->page_slot);
    g->taint = calloc((size_t)g->nk * (size_t)g->H, 1);
    /* content-hash keys: uniform in [1, 2^32), from the model seed (reproducible runs) */
    size_t slice_words = (p->head_k > p->head_v ? p->head_k : p->head_v) / 4 + 1;
    size_t key_bytes = ((slice_words + 16) * sizeof *g->hkey + 63) & ~(size_t)63;
    g->hkey = aligned_alloc(64, key_bytes);
    if (g->hkey) {
        uint64_t r = g->model_seed ^ 0x6d6c686b657973ull;
        for (size_t i = 0; i < slice_words + 16; i++) {
            uint32_t k;
            do k = (uint32_t)(rng_next(&r) >> 32);
            while (k == 0);
            g->hkey[i] = k;
        }
    }
    g->fused = p->row_k % 4 == 0 && p->row_v % 4 == 0;
    g->ukey = malloc((size_t)g->L * (size_t)g->H * (size_t)g->nk * sizeof *g->ukey);
    if (g->ukey) {
        uint64_t r = g->model_seed ^ 0x756e69746b657973ull;
        for (size_t i = 0; i < (size_t)g->L * (size_t)g->H * (size_t)g->nk; i++) g->ukey[i] = mix64(rng_next(&r) ^ i);
    }
    size_t head_bytes = p->head_k + (g->nk > 1 ? p->head_v : 0);
    /* ~24 KB of one head's K and V per kernel call: verified bytes are still in L1/L2 when read */
    int gp = head_bytes ? (int)((24u << 10) / head_bytes) : 1;
    g->group_tokens = (gp < 1 ? 1 : gp) * g->pt;
    g->st.mode = mode;
    g->st.integrity_bytes = kiln_kv_integ_page_bytes(&p->cfg) * (uint64_t)p->n_pages;
    int ok = g->seal && g->tag && g->page_slot && g->taint && g->hkey && g->ukey;
    if (ok && p->cfg.dtype == KILN_KV_FP8 && !p->dscale) {
        g->n_ks = (size_t)g->L * (size_t)g->H;
        g->n_vs = p->cfg.v_shares_k ? 0 : g->n_ks;
        g->n_km = p->k_mean ? g->n_ks * (size_t)g->kd : 0;
        g->master = malloc((g->n_ks + g->n_vs + g->n_km) * sizeof(float));
        ok = g->master != NULL;
        if (ok) {
            memcpy(g->master, p->k_scale, g->n_ks * sizeof(float));
            if (g->n_vs) memcpy(g->master + g->n_ks, p->v_scale, g->n_vs * sizeof(float));
            if (g->n_km) memcpy(g->master + g->n_ks + g->n_vs, p->k_mean, g->n_km * sizeof(float));
            g->master_sum = master_checksum(g);
            g->st.integrity_bytes += (g->n_ks + g->n_vs + g->n_km) * sizeof(float);
        }
    }
    p->integ = g;
    if (!ok) {
        kiln_kv_integ_free(p);
        return kiln_fail(KILN_ERR_NOMEM, "kv integrity: cannot allocate seals for %d pages (%zu units)", p->n_pages, units);
    }
    if (inject) {
        kiln_status st = kiln_kv_integ_parse_spec(inject, g->inj_counts, &g->inj_every, &g->inj_after, &g->inj_rng);
        if (st != KILN_OK) { kiln_kv_integ_free(p); return st; }
        g->inj_active = 1;
    }
    g->inj_rng = mix64(g->inj_rng + 1);
    return KILN_OK;
}

static void release_foreign(kiln_kv_pool *p, inj_fault *f) {
    if (!f->foreign) return;
    kiln_kv_seq_release(p, f->foreign);
    free(f->foreign->pages);
    free(f->foreign);
    f->foreign = NULL;
}

void kiln_kv_integ_free(kiln_kv_pool *p) {
    kiln_kv_integ *g = p->integ;
    if (!g) return;
    for (int i = 0; i < g->n_faults; i++)
        if (g->faults[i].foreign) {
            free_seq_state(g->faults[i].foreign->integ);
            free(g->faults[i].foreign->pages);
            free(g->faults[i].foreign);
        }
    free(g->faults);
    free(g->seal); free(g->tag); free(g->page_slot); free(g->taint); free(g->hkey); free(g->ukey); free(g->master); free(g->lw_buf);
    pthread_mutex_destroy(&g->mu);
    free(g);
    p->integ = NULL;
}

/* ---- per-sequence state ------------------------------------------------------------------------- */
static int grow(void **v, int *cap, int need, size_t elem) {
    if (need <= *cap) return 1;
    int c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *n = realloc(*v, (size_t)c * elem);
    if (!n) return 0;
    *v = n;
    *cap = c;
    return 1;
}

static kiln_kv_seq_integ *state(kiln_kv_pool *p, kiln_kv_seq *s) {
    if (s->integ) return s->integ;
    kiln_kv_seq_integ *si = calloc(1, sizeof *si);
    if (si) {
        si->hi = calloc((size_t)p->cfg.n_layers, sizeof *si->hi);
        si->ver_hi = calloc((size_t)p->cfg.n_kv_heads, sizeof *si->ver_hi);
    }
    if (!si || !si->hi || !si->ver_hi) {
        if (si) { free(si->hi); free(si->ver_hi); }
        free(si);
        return NULL;
    }
    si->bad_slot = -1;
    s->integ = si;
    return si;
}

/* Binding records for slots appended since the last call (their pages and current epochs). */
static void sync_records(const kiln_kv_pool *p, const kiln_kv_seq *s, kiln_kv_seq_integ *si) {
    if (si->n_rec >= s->n_pages) return;
    int cap = si->cap_rec;
    if (!grow((void **)&si->rec_page, &cap, s->n_pages, sizeof *si->rec_page)) return;
    cap = si->cap_rec;
    if (!grow((void **)&si->rec_epoch, &cap, s->n_pages, sizeof *si->rec_epoch)) return;
    si->cap_rec = cap;
    for (int i = si->n_rec; i < s->n_pages; i++) {
        int32_t pg = s->pages[i];
        si->rec_page[i] = pg;
        si->rec_epoch[i] = pg >= 0 && pg < p->n_pages ? p->pages[pg].epoch : 0;
    }
    si->n_rec = s->n_pages;
}

void kiln_kv_integ_bind(kiln_kv_pool *p, kiln_kv_seq *s) {
    kiln_kv_seq_integ *si = state(p, s);
    if (!si) return;
    int old = si->n_rec;
    sync_records(p, s, si);
    /* full pages shared in (prefix reuse) arrive with all their rows stored; reserved pages are empty */
    for (int i = old; i < si->n_rec; i++)
        if (p->refcount[s->pages[i]] > 1 && s->len >= (i + 1) * p->cfg.page_tokens)
            for (int l = 0; l < p->cfg.n_layers; l++)
                if (si->hi[l] < (i + 1) * p->cfg.page_tokens) si->hi[l] = (i + 1) * p->cfg.page_tokens;
}

/* ---- detection ---------------------------------------------------------------------------------- */
static int diagnose(const kiln_kv_pool *p, const kiln_kv_seq *s, const kiln_kv_seq_integ *si, int slot) {
    if (!s || !si || slot < 0 || slot >= si->n_rec) return KILN_KV_DETECT_CONTENT;
    int32_t pg = s->pages[slot], rec = si->rec_page[slot];
    if (pg != rec) return KILN_KV_DETECT_WRONG_PAGE;
    if (pg < 0 || pg >= p->n_pages || p->refcount[pg] <= 0 || p->pages[pg].epoch != si->rec_epoch[slot]) return KILN_KV_DETECT_STALE_PAGE;
    return KILN_KV_DETECT_CONTENT;
}

static const char *diag_names[KILN_KV_DETECT_KINDS] = {"content mismatch", "scale table changed", "block-table entry names another page",
                                                       "page freed under the sequence"};

/* Attributes a detection to pending injected faults (under g->mu). Returns 1 if one matched. */
static int attribute(kiln_kv_integ *g, const kiln_kv_seq *s, int slot, int32_t pg, int64_t u, int l, int kind, int h, int diag) {
    int hit = 0;
    for (int i = 0; i < g->n_faults; i++) {
        inj_fault *f = &g->faults[i];
        if (f->dropped) continue;
        int m;
        if (f->kind == KILN_KV_FAULT_WRONG_PAGE || f->kind == KILN_KV_FAULT_STALE_PAGE) m = s && f->seq == s && f->slot == slot;
        else if (f->page < 0) m = diag == KILN_KV_DETECT_SCALE && f->layer == l && f->ukind == kind && f->head == h;
        else m = f->page == pg && (f->unit < 0 || f->unit == u || u < 0);
        if (!m) continue;
        hit = 1;
        if (f->detected) continue;
        f->detected = 1;
        g->n_undetected--;
        g->st.injected_detected[f->kind]++;
        if (!f->used) g->st.detected_before_use[f->kind]++;
    }
    return hit;
}

/* One failed verification: counters, the sequence's first bad slot, the bad-page list, the log.
 * where: "attention", "store", ... (log only). Safe from the attention tasks. */
static void on_detect(kiln_kv_integ *g, const kiln_kv_pool *p, const kiln_kv_seq *s, int slot, int32_t pg, int64_t u, int l, int kind,
                      int h, int diag, const char *where) {
    (void)p;
    add(&g->st.detections, 1);
    add(&g->st.detected[diag], 1);
    kiln_kv_seq_integ *si = s ? s->integ : NULL;
    if (si && slot >= 0) {
        int cur = __atomic_load_n(&si->bad_slot, __ATOMIC_RELAXED);
        while ((cur < 0 || slot < cur) && !__atomic_compare_exchange_n(&si->bad_slot, &cur, slot, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
        if (__atomic_load_n(&si->bad_slot, __ATOMIC_RELAXED) == slot) __atomic_store_n(&si->bad_kind, diag, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&g->mu);
    if (diag == KILN_KV_DETECT_CONTENT && pg >= 0 && g->n_bad_pages < (int)(sizeof g->bad_pages / sizeof g->bad_pages[0])) {
        int dup = 0;
        for (int i = 0; i < g->n_bad_pages; i++) dup |= g->bad_pages[i] == pg;
        if (!dup) g->bad_pages[g->n_bad_pages++] = pg;
    }
    if (g->inj_active && !attribute(g, s, slot, pg, u, l, kind, h, diag)) g->st.false_alarms++;
    if (!g->quiet && g->logged <= LOG_MAX) {
        if (g->logged < LOG_MAX) {
            const char *act = g->mode == KILN_KV_INTEGRITY_DETECT ? "detect: counted" : g->mode == KILN_KV_INTEGRITY_STRICT ? "strict: the call fails"
                              : diag == KILN_KV_DETECT_SCALE ? "heal: restored from the master copy" : "heal: recomputing from this page";
            if (slot >= 0)
                fprintf(stderr, "kiln: kv integrity: %s: layer %d %s head %d of page %d (slot %d, positions %d-%d): %s (%s)\n", where, l,
                        kind ? "V" : "K", h, pg, slot, slot * g->pt, slot * g->pt + g->pt - 1, diag_names[diag], act);
            else
                fprintf(stderr, "kiln: kv integrity: %s: layer %d %s head %d: %s (%s)\n", where, l, kind ? "V" : "K", h, diag_names[diag], act);
        } else {
            fprintf(stderr, "kiln: kv integrity: further detections are counted, not logged\n");
        }
        g->logged++;
    }
    pthread_mutex_unlock(&g->mu);
}

/* Pool-wide parameters (static FP8 scales, K means) of `layer` against the master copy, before a
 * store or an attention call uses them. heal / strict restore them (strict also fails the
 * sequences given); detect only counts. */
static void check_params(kiln_kv_pool *p, kiln_kv_integ *g, int l, kiln_kv_seq *const *seqs, int n) {
    if (!g->master) return;
    const int H = g->H;
    const float *mk = g->master + (size_t)l * H, *mv = g->master + g->n_ks + (size_t)l * H;
    const float *mm = g->master + g->n_ks + g->n_vs + (size_t)l * H * g->kd;
    int same = memcmp(p->k_scale + (size_t)l * H, mk, (size_t)H * sizeof(float)) == 0 &&
               (!g->n_vs || memcmp(p->v_scale + (size_t)l * H, mv, (size_t)H * sizeof(float)) == 0) &&
               (!g->n_km || memcmp(p->k_mean + (size_t)l * H * g->kd, mm, (size_t)H * (size_t)g->kd * sizeof(float)) == 0);
    if (same) return;
    if (master_checksum(g) != g->master_sum) {
        /* the master copy is the corrupted one: rebuild it from the pool's table */
        memcpy(g->master, p->k_scale, g->n_ks * sizeof(float));
        if (g->n_vs) memcpy(g->master + g->n_ks, p->v_scale, g->n_vs * sizeof(float));
        if (g->n_km) memcpy(g->master + g->n_ks + g->n_vs, p->k_mean, g->n_km * sizeof(float));
        g->master_sum = master_checksum(g);
        return;
    }
    for (int h = 0; h < H; h++)
        for (int kind = 0; kind < g->nk; kind++) {
            int bad = kind ? memcmp(p->v_scale + (size_t)l * H + h, mv + h, sizeof(float)) != 0
                           : memcmp(p->k_scale + (size_t)l * H + h, mk + h, sizeof(float)) != 0 ||
                                 (g->n_km && memcmp(p->k_mean + ((size_t)l * H + h) * g->kd, mm + (size_t)h * g->kd, (size_t)g->kd * sizeof(float)) != 0);
            if (!bad) continue;
            on_detect(g, p, NULL, -1, -1, -1, l, kind, h, KILN_KV_DETECT_SCALE, "scales");
            if (g->mode == KILN_KV_INTEGRITY_STRICT)
                for (int i = 0; i < n; i++)
                    if (seqs[i] && seqs[i]->integ && seqs[i]->integ->bad_slot < 0) {
                        seqs[i]->integ->bad_slot = 0;
                        seqs[i]->integ->bad_kind = KILN_KV_DETECT_SCALE;
                    }
        }
    if (g->mode == KILN_KV_INTEGRITY_DETECT) return;
    memcpy(p->k_scale + (size_t)l * H, mk, (size_t)H * sizeof(float));
    if (g->n_vs) memcpy(p->v_scale + (size_t)l * H, mv, (size_t)H * sizeof(float));
    if (g->n_km) memcpy(p->k_mean + (size_t)l * H * g->kd, mm, (size_t)H * (size_t)g->kd * sizeof(float));
    if (g->mode == KILN_KV_INTEGRITY_HEAL) g->st.heals++;
}

/* Verifies unit (pg, l, kind, h) against seed over n_rows rows; counts; no tag. */
static int verify_unit(kiln_kv_integ *g, const kiln_kv_pool *p, int32_t pg, int l, int kind, int h, int n_rows, uint64_t seed) {
    size_t nb = (size_t)n_rows * unit_row(p, l, kind);
    add(&g->st.checks, 1);
    add(&g->st.bytes_verified, nb);
    return (hash_bytes(g, unit_ptr(p, pg, l, kind, h), nb) ^ seed) == g->seal[uidx(g, pg, l, kind, h)];
}

/* Expected epoch of s's slot (its binding record). */
static inline uint32_t rec_epoch(const kiln_kv_pool *p, const kiln_kv_seq *s, const kiln_kv_seq_integ *si, int slot) {
    if (slot < si->n_rec) return si->rec_epoch[slot];
    int32_t pg = s->pages[slot];
    return pg >= 0 && pg < p->n_pages ? p->pages[pg].epoch : 0;
}

/* ---- stores ------------------------------------------------------------------------------------- */
static void before_store(kiln_kv_pool *p, const kiln_kv_seq *cs, int l, int pos);
void kiln_kv_integ_before_store(kiln_kv_pool *p, const kiln_kv_seq *cs, int l, int pos) {
    uint64_t t0 = tsc();
    before_store(p, cs, l, pos);
    add(&p->integ->cycles, tsc() - t0);
}
static void before_store(kiln_kv_pool *p, const kiln_kv_seq *cs, int l, int pos) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq *s = (kiln_kv_seq *)cs;
    kiln_kv_seq_integ *si = state(p, s);
    memset(g->taint, 0, (size_t)g->nk * (size_t)g->H);
    if (!si) return;
    sync_records(p, s, si);
    kiln_kv_seq *one[1] = {s};
    check_params(p, g, l, one, 1);
    const int pt = g->pt, slot = pos / pt;
    int32_t pg = s->pages[slot];
    int cov = cov_of(si, l, slot, pt);
    int diag = diagnose(p, s, si, slot);
    /* seal by row when the row lands right after the sealed ones and no dynamic page scale can
     * re-quantize them (p->dscale: a growing scale rewrites every row of the slice) */
    g->store_append = g->fused && !p->dscale && pos % pt == cov;
    if (diag != KILN_KV_DETECT_CONTENT) {
        /* the write would land in a page that is not (or no longer) this sequence's */
        on_detect(g, p, s, slot, pg, -1, l, 0, 0, diag, "store");
        if (diag == KILN_KV_DETECT_WRONG_PAGE && g->mode != KILN_KV_INTEGRITY_DETECT) s->pages[slot] = pg = si->rec_page[slot];
        memset(g->taint, 1, (size_t)g->nk * (size_t)g->H);
    } else if (g->store_append) {
        /* an append to a static-scale slice: after_store adds the new row's hash to the seal, which
         * never reads the rows already there, so a corruption of them stays a mismatch (nothing to
         * launder) and attention finds it at its next read */
    } else if (cov > 0) {
        uint64_t base = base_seed(g, prefix_of(si, slot, cov, pt), slot, cov, rec_epoch(p, s, si, slot));
        for (int kind = 0; kind < g->nk; kind++)
            for (int h = 0; h < g->H; h++)
                if (!verify_unit(g, p, pg, l, kind, h, cov, unit_seed(g, base, l, kind, h, param_bits(p, l, pg, kind, h)))) {
                    on_detect(g, p, s, slot, pg, (int64_t)uidx(g, pg, l, kind, h), l, kind, h, KILN_KV_DETECT_CONTENT, "store");
                    g->taint[kind * g->H + h] = 1; /* never re-seal over a corrupted slice */
                }
    }
    if (g->arm_lost && !g->lw_held && (!g->arm_seq || g->arm_seq == s) && pg >= 0 && pg < p->n_pages) {
        int kind = (int)rng_below(&g->inj_rng, (uint32_t)g->nk), h = (int)rng_below(&g->inj_rng, (uint32_t)g->H);
        size_t row = unit_row(p, l, kind);
        if (g->lw_len < row) {
            free(g->lw_buf);
            g->lw_buf = malloc(row);
            g->lw_len = g->lw_buf ? row : 0;
        }
        if (g->lw_buf) {
            g->lw_ptr = unit_ptr(p, pg, l, kind, h) + (size_t)(pos % pt) * row;
            g->lw_row = row;
            memcpy(g->lw_buf, g->lw_ptr, row);
            g->lw_unit = (int64_t)uidx(g, pg, l, kind, h);
            g->lw_page = pg;
            g->lw_held = 1;
            g->lw_kind = kind;
            g->lw_h = h;
        }
    }
}

static void add_fault(kiln_kv_integ *g, inj_fault f) {
    pthread_mutex_lock(&g->mu);
    if (grow((void **)&g->faults, &g->cap_faults, g->n_faults + 1, sizeof *g->faults)) {
        g->faults[g->n_faults++] = f;
        g->n_undetected++;
        g->st.injected[f.kind]++;
    }
    pthread_mutex_unlock(&g->mu);
}

static void after_store(kiln_kv_pool *p, const kiln_kv_seq *cs, int l, int pos, const uint64_t *row_hash);
void kiln_kv_integ_after_store(kiln_kv_pool *p, const kiln_kv_seq *cs, int l, int pos) {
    uint64_t t0 = tsc();
    after_store(p, cs, l, pos, NULL);
    add(&p->integ->cycles, tsc() - t0);
}
int kiln_kv_integ_store_is_append(const kiln_kv_pool *p) { return p->integ && p->integ->store_append; }
uint64_t kiln_kv_integ_row_hash(const kiln_kv_pool *p, int l, int kind, int off, const void *bytes) {
    const size_t row = unit_row(p, l, kind);
    return kiln_kv_mlh(bytes, row, p->integ->hkey + (size_t)off * row / 4); /* as hash_rows over row off */
}
void kiln_kv_integ_after_store_rows(kiln_kv_pool *p, const kiln_kv_seq *cs, int l, int pos, const uint64_t *row_hash) {
    uint64_t t0 = tsc();
    after_store(p, cs, l, pos, row_hash);
    add(&p->integ->cycles, tsc() - t0);
}
/* The seals of slot pos / pt's units of layer l over rows [0, pos % pt], the new row being the
 * last: append = 1 adds its content hash to what the seal held (the rows before it are not read
 * again), else the slice is hashed whole. row_hash (NULL: hashed here from memory) gives the new
 * row's content hash of unit (kind, h) at row_hash[kind·H + h] — a device that hashed the row as it
 * wrote it. taint (NULL: none) skips the units a detection left unsealed. */
static void seal_slice(kiln_kv_pool *p, const kiln_kv_seq *s, kiln_kv_seq_integ *si, int l, int pos, int append, const uint64_t *row_hash,
                       const uint8_t *taint) {
    kiln_kv_integ *g = p->integ;
    const int pt = g->pt, slot = pos / pt, n_rows = pos % pt + 1;
    const int32_t pg = s->pages[slot];
    const uint32_t ep = rec_epoch(p, s, si, slot);
    uint64_t base = base_seed(g, prefix_of(si, slot, n_rows, pt), slot, n_rows, ep);
    /* append: content hash of rows [0, o) = old seal ^ old identity seed, plus the new row's */
    const int o = n_rows - 1;
    uint64_t obase = append && o > 0 ? base_seed(g, prefix_of(si, slot, o, pt), slot, o, ep) : 0;
    int sealed = 0;
    for (int kind = 0; kind < g->nk; kind++)
        for (int h = 0; h < g->H; h++) {
            if (taint && taint[kind * g->H + h]) continue;
            size_t u = uidx(g, pg, l, kind, h);
            const uint32_t pb = param_bits(p, l, pg, kind, h);
            const size_t row = unit_row(p, l, kind);
            uint64_t content;
            if (append) {
                content = o > 0 ? g->seal[u] ^ unit_seed(g, obase, l, kind, h, pb) : 0;
                content += row_hash ? row_hash[kind * g->H + h] : hash_rows(g, unit_ptr(p, pg, l, kind, h), row, o, o + 1);
            } else {
                content = hash_bytes(g, unit_ptr(p, pg, l, kind, h), (size_t)n_rows * row);
            }
            g->seal[u] = content ^ unit_seed(g, base, l, kind, h, pb);
            g->tag[u] = 0;
            sealed++;
        }
    g->st.seals += (uint64_t)sealed;
}

/* An armed lost write lands once the store it watched has written (and sealed) its row: the row
 * goes back to what it held before the store, as if the write never reached memory. */
static void land_lost_write(kiln_kv_integ *g, const kiln_kv_seq *s, int slot, int32_t pg) {
    if (!(g->arm_lost && g->lw_buf && g->lw_page == pg && (!g->arm_seq || g->arm_seq == s))) return;
    size_t row = g->lw_row;
    if (memcmp(g->lw_ptr, g->lw_buf, row) != 0) {
        memcpy(g->lw_ptr, g->lw_buf, row);
        inj_fault f = {.kind = KILN_KV_FAULT_LOST_WRITE, .seq = (kiln_kv_seq *)s, .slot = slot, .page = pg, .unit = g->lw_unit};
        add_fault(g, f);
        g->arm_lost = 0;
    }
    g->lw_page = -1;
    g->lw_held = 0;
}

static void after_store(kiln_kv_pool *p, const kiln_kv_seq *cs, int l, int pos, const uint64_t *row_hash) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq *s = (kiln_kv_seq *)cs;
    kiln_kv_seq_integ *si = s->integ;
    if (!si) return;
    const int pt = g->pt, slot = pos / pt;
    int32_t pg = s->pages[slot];
    if (pg < 0 || pg >= p->n_pages) return;
    seal_slice(p, s, si, l, pos, g->store_append, g->store_append ? row_hash : NULL, g->taint);
    g->store_append = 0;
    g->page_slot[pg] = slot;
    si->hi[l] = pos + 1;
    land_lost_write(g, s, slot, pg);
}

/* ---- stores the device writes (integrity.h "Stores a device writes") --------------------------- */
int kiln_kv_integ_store_appends(kiln_kv_pool *p, kiln_kv_seq *const *seq, const int *pos, int n, int l) {
    kiln_kv_integ *g = p->integ;
    if (!g) return 1;
    if (!g->fused || p->dscale) return 0;
    const int pt = g->pt;
    for (int i = 0; i < n; i++) {
        kiln_kv_seq *s = seq[i];
        kiln_kv_seq_integ *si = state(p, s);
        const int slot = pos[i] / pt;
        if (!si || pos[i] < 0 || slot >= s->n_pages) return 0;
        sync_records(p, s, si);
        int hi = si->hi[l];
        for (int j = i - 1; j >= 0; j--) /* an earlier token of the op stored the sequence's latest row */
            if (seq[j] == s) { hi = pos[j] + 1; break; }
        int cov = hi - slot * pt;
        cov = cov < 0 ? 0 : cov > pt ? pt : cov;
        if (pos[i] % pt != cov || diagnose(p, s, si, slot) != KILN_KV_DETECT_CONTENT) return 0;
    }
    return 1;
}

void kiln_kv_integ_store_begin(kiln_kv_pool *p, kiln_kv_seq *s, int l, int pos, kiln_kv_integ_pending *pend) {
    kiln_kv_integ *g = p->integ;
    uint64_t t0 = tsc();
    const int held = g->lw_held;
    before_store(p, s, l, pos); /* an append (kiln_kv_integ_store_appends): checks, no slice read */
    g->store_append = 0;
    /* a lost write armed by the campaign takes this store's row: the device must not write it */
    pend->lost = !held && g->lw_held ? g->lw_kind * g->H + g->lw_h : -1;
    kiln_kv_seq_integ *si = s->integ;
    const int slot = pos / g->pt;
    const int32_t pg = s->pages[slot];
    pend->pg = pg;
    pend->prev_hi = si ? si->hi[l] : 0;
    pend->prev_slot = pg >= 0 && pg < p->n_pages ? g->page_slot[pg] : 0;
    if (si && pg >= 0 && pg < p->n_pages) {
        g->page_slot[pg] = slot;
        si->hi[l] = pos + 1;
    }
    add(&g->cycles, tsc() - t0);
}

void kiln_kv_integ_store_end(kiln_kv_pool *p, const kiln_kv_seq *s, int l, int pos, const uint64_t *row_hash, const kiln_kv_integ_pending *pend) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq_integ *si = s->integ;
    const int pt = g->pt, slot = pos / pt;
    const int32_t pg = si && slot < s->n_pages ? s->pages[slot] : -1;
    if (pg < 0 || pg >= p->n_pages) {
        if (pend->lost >= 0 && g->lw_held) { g->lw_page = -1; g->lw_held = 0; } /* nothing stored: the armed write waits for the next store */
        return;
    }
    uint64_t t0 = tsc();
    seal_slice(p, s, si, l, pos, 1, row_hash, NULL);
    if (pend->lost >= 0 && g->lw_held) {
        /* the device left the row as it was: a fault when what it should have written differs
         * (compared by the content hashes; the cpu store compares the bytes) */
        const size_t row = g->lw_row;
        if (kiln_kv_mlh(g->lw_buf, row, g->hkey + (size_t)(pos % pt) * row / 4) != row_hash[pend->lost]) {
            inj_fault f = {.kind = KILN_KV_FAULT_LOST_WRITE, .seq = (kiln_kv_seq *)s, .slot = slot, .page = pg, .unit = g->lw_unit};
            add_fault(g, f);
            g->arm_lost = 0;
        }
        g->lw_page = -1;
        g->lw_held = 0;
    }
    add(&g->cycles, tsc() - t0);
}

void kiln_kv_integ_store_undo(kiln_kv_pool *p, kiln_kv_seq *s, int l, const kiln_kv_integ_pending *pend) {
    kiln_kv_integ *g = p->integ;
    if (s->integ) s->integ->hi[l] = pend->prev_hi;
    if (pend->pg >= 0 && pend->pg < p->n_pages) g->page_slot[pend->pg] = pend->prev_slot;
    if (pend->lost >= 0) { /* still armed: the host's store of the token takes it */
        g->lw_page = -1;
        g->lw_held = 0;
    }
}

/* ---- notes, rewinds ----------------------------------------------------------------------------- */
static void compute_chain(kiln_kv_seq_integ *si, int pt) {
    while ((si->n_chain + 1) * pt <= si->n_tok) {
        if (!grow((void **)&si->chain, &si->cap_chain, si->n_chain + 1, sizeof *si->chain)) return;
        int i = si->n_chain;
        uint64_t parent = i ? si->chain[i - 1] : 0;
        si->chain[i] = XXH3_64bits_withSeed(si->tok + (size_t)i * pt, (size_t)pt * sizeof(int32_t), parent ? parent : PFX_SEED0);
        si->n_chain++;
    }
}

/* Positions >= q get new tokens: the page holding q keeps rows [0, q mod pt) — verified against
 * the old tokens, then re-sealed to those rows — and the history, chain and stored extents shrink. */
static void rewind_to(kiln_kv_pool *p, kiln_kv_seq *s, kiln_kv_seq_integ *si, int q) {
    kiln_kv_integ *g = p->integ;
    const int pt = g->pt, slot = q / pt, keep = q % pt;
    sync_records(p, s, si);
    if (slot < s->n_pages && keep > 0) {
        int32_t pg = s->pages[slot];
        uint32_t ep = rec_epoch(p, s, si, slot);
        uint64_t nbase = base_seed(g, prefix_of(si, slot, keep, pt), slot, keep, ep);
        for (int l = 0; l < g->L; l++) {
            int cov = cov_of(si, l, slot, pt);
            if (cov <= keep) continue;
            uint64_t obase = base_seed(g, prefix_of(si, slot, cov, pt), slot, cov, ep);
            for (int kind = 0; kind < g->nk; kind++)
                for (int h = 0; h < g->H; h++) {
                    uint32_t pb = param_bits(p, l, pg, kind, h);
                    size_t u = uidx(g, pg, l, kind, h);
                    if (!verify_unit(g, p, pg, l, kind, h, cov, unit_seed(g, obase, l, kind, h, pb))) {
                        on_detect(g, p, s, slot, pg, (int64_t)u, l, kind, h, diagnose(p, s, si, slot), "rewind");
                        continue;
                    }
                    g->seal[u] = hash_bytes(g, unit_ptr(p, pg, l, kind, h), (size_t)keep * unit_row(p, l, kind)) ^ unit_seed(g, nbase, l, kind, h, pb);
                    g->tag[u] = 0;
                    g->st.seals++;
                }
        }
    }
    for (int l = 0; l < g->L; l++)
        if (si->hi[l] > q) si->hi[l] = q;
    if (si->n_base > q / pt) si->n_base = q / pt;
    if (si->n_tok > q) si->n_tok = q;
    if (si->n_chain > q / pt) si->n_chain = q / pt;
    while (si->n_chunk > 0 && si->chunk[si->n_chunk - 1] >= q) si->n_chunk--;
}

static kiln_status note(kiln_kv_pool *p, kiln_kv_seq *s, int first, const int32_t *toks, int n, int log_chunk);
kiln_status kiln_kv_integ_note(kiln_kv_pool *p, kiln_kv_seq *s, int first, const int32_t *toks, int n, int log_chunk) {
    uint64_t t0 = tsc();
    kiln_status st = note(p, s, first, toks, n, log_chunk);
    if (p->integ) add(&p->integ->cycles, tsc() - t0);
    return st;
}
static kiln_status note(kiln_kv_pool *p, kiln_kv_seq *s, int first, const int32_t *toks, int n, int log_chunk) {
    kiln_kv_seq_integ *si = state(p, s);
    if (!si) return kiln_fail(KILN_ERR_NOMEM, "out of memory (kv integrity state)");
    if (first < 0 || first > si->n_tok)
        return kiln_fail(KILN_ERR_INTERNAL, "kv integrity: tokens noted at position %d but the history ends at %d", first, si->n_tok);
    int q = first;
    while (q < si->n_tok && q < first + n && si->tok[q] == toks[q - first]) q++;
    /* the same tokens again (a replay, a re-evaluation after a truncation) change nothing */
    if (q < si->n_tok && q < first + n) rewind_to(p, s, si, q);
    if (q >= si->n_tok && q < first + n) {
        if (!grow((void **)&si->tok, &si->cap_tok, first + n, sizeof *si->tok)) return kiln_fail(KILN_ERR_NOMEM, "out of memory (kv integrity state)");
        memcpy(si->tok + q, toks + (q - first), (size_t)(first + n - q) * sizeof *toks);
        si->n_tok = first + n;
        compute_chain(si, p->cfg.page_tokens);
    }
    if (log_chunk) {
        while (si->n_chunk > 0 && si->chunk[si->n_chunk - 1] >= first) si->n_chunk--;
        if (!grow((void **)&si->chunk, &si->cap_chunk, si->n_chunk + 1, sizeof *si->chunk)) return kiln_fail(KILN_ERR_NOMEM, "out of memory (kv integrity state)");
        si->chunk[si->n_chunk++] = first;
    }
    return KILN_OK;
}

kiln_status kiln_kv_integ_note_cyclic(kiln_kv_pool *p, kiln_kv_seq *s, int from, int to) {
    kiln_kv_seq_integ *si = state(p, s);
    if (!si) return kiln_fail(KILN_ERR_NOMEM, "out of memory (kv integrity state)");
    if (from < 1 || from > si->n_tok) return kiln_fail(KILN_ERR_INTERNAL, "kv integrity: cyclic tokens from %d with a history of %d", from, si->n_tok);
    for (int pos = from; pos < to; pos++) {
        int32_t t = si->tok[pos % from];
        KILN_TRY(kiln_kv_integ_note(p, s, pos, &t, 1, 0));
    }
    return KILN_OK;
}

/* ---- hand-offs ---------------------------------------------------------------------------------- */
kiln_status kiln_kv_integ_check_share(kiln_kv_pool *p, kiln_kv_seq *s, int32_t page) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq_integ *si = state(p, s);
    const int slot = s->n_pages, pt = g->pt;
    if (!si || slot >= si->n_chain) return KILN_OK; /* tokens not noted: attention verifies it on first read */
    sync_records(p, s, si);
    uint64_t base = base_seed(g, si->chain[slot], slot, pt, p->pages[page].epoch);
    for (int l = 0; l < g->L; l++)
        for (int kind = 0; kind < g->nk; kind++)
            for (int h = 0; h < g->H; h++)
                if (!verify_unit(g, p, page, l, kind, h, pt, unit_seed(g, base, l, kind, h, param_bits(p, l, page, kind, h)))) {
                    on_detect(g, p, NULL, slot, page, (int64_t)uidx(g, page, l, kind, h), l, kind, h, KILN_KV_DETECT_CONTENT, "prefix reuse");
                    return kiln_fail(KILN_ERR_INTEGRITY, "kv integrity: cached page %d failed verification against the prefix it is shared for "
                                     "(slot %d, layer %d %s head %d); it is not reused", page, slot, l, kind ? "V" : "K", h);
                }
    return KILN_OK;
}

void kiln_kv_integ_copied(kiln_kv_pool *p, const kiln_kv_seq *src, kiln_kv_seq *dst, int n) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq_integ *di = state(p, dst), *si = src->integ;
    if (!di) return;
    const int pt = g->pt, slot = n / pt, rows = n % pt;
    if (si && si->n_tok > 0) kiln_kv_integ_note(p, dst, 0, si->tok, si->n_tok < n ? si->n_tok : n, 0);
    kiln_kv_integ_bind(p, dst);
    for (int l = 0; l < g->L; l++) di->hi[l] = n; /* dst holds rows [0, n) in every layer */
    if (!rows) return;
    int32_t from = src->pages[slot], to = dst->pages[slot];
    uint64_t dbase = base_seed(g, prefix_of(di, slot, rows, pt), slot, rows, rec_epoch(p, dst, di, slot));
    for (int l = 0; l < g->L; l++) {
        int scov = si ? cov_of(si, l, slot, pt) : 0;
        uint64_t sbase = si ? base_seed(g, prefix_of(si, slot, scov, pt), slot, scov, rec_epoch(p, src, si, slot)) : 0;
        for (int kind = 0; kind < g->nk; kind++)
            for (int h = 0; h < g->H; h++) {
                size_t u = uidx(g, to, l, kind, h);
                if (si && scov >= rows && !verify_unit(g, p, from, l, kind, h, scov, unit_seed(g, sbase, l, kind, h, param_bits(p, l, from, kind, h)))) {
                    on_detect(g, p, src, slot, from, (int64_t)uidx(g, from, l, kind, h), l, kind, h, diagnose(p, src, si, slot), "copy source");
                    g->seal[u] = ~0ull; /* the copy of a bad slice must not verify */
                    continue;
                }
                /* sealed from the SOURCE bytes: a copy that did not complete fails on first read */
                g->seal[u] = hash_bytes(g, unit_ptr(p, from, l, kind, h), (size_t)rows * unit_row(p, l, kind)) ^
                             unit_seed(g, dbase, l, kind, h, param_bits(p, l, to, kind, h));
                g->tag[u] = 0;
                g->st.seals++;
            }
    }
    g->page_slot[to] = slot;
}

void kiln_kv_integ_release(kiln_kv_pool *p, kiln_kv_seq *s) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq_integ *si = s->integ;
    if (!si) return;
    /* the references to drop are those of the binding records: repair entries that name another
     * page, and leave out entries whose page was freed under the sequence (not ours any more) */
    int w = 0;
    for (int i = 0; i < s->n_pages; i++) {
        int diag = i < si->n_rec ? diagnose(p, s, si, i) : KILN_KV_DETECT_CONTENT;
        if (diag == KILN_KV_DETECT_WRONG_PAGE) {
            on_detect(g, p, s, i, s->pages[i], -1, 0, 0, 0, diag, "release");
            s->pages[i] = si->rec_page[i];
            diag = diagnose(p, s, si, i);
        }
        if (diag == KILN_KV_DETECT_STALE_PAGE) {
            on_detect(g, p, s, i, s->pages[i], -1, 0, 0, 0, diag, "release");
            continue;
        }
        s->pages[w++] = s->pages[i];
    }
    s->n_pages = w;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_faults; i++)
        if (g->faults[i].seq == s && !g->faults[i].detected && !g->faults[i].dropped) {
            g->faults[i].dropped = 1;
            g->n_undetected--;
        }
    pthread_mutex_unlock(&g->mu);
    free_seq_state(si);
    s->integ = NULL;
}

/* ---- attention ---------------------------------------------------------------------------------- */
void kiln_kv_integ_begin_attend(const kiln_kv_pool *cp, int layer, int n, kiln_kv_seq *const *seq, const int *pos) {
    kiln_kv_pool *p = (kiln_kv_pool *)cp;
    kiln_kv_integ *g = p->integ;
    uint64_t t0 = tsc();
    g->gen++;
    g->gen_key = g->call_key ? g->call_key : mix64(g->gen * 0x9e3779b97f4a7c15ull + 0x41545445ull);
    for (int i = 0; i < n; i++) {
        kiln_kv_seq_integ *si = state(p, seq[i]);
        if (!si) continue;
        if (si->att_gen != g->gen) {
            sync_records(p, seq[i], si);
            si->att_gen = g->gen;
            si->att_hi = 0;
            memset(si->ver_hi, 0, (size_t)g->H * sizeof *si->ver_hi);
        }
        if (si->att_hi < pos[i] + 1) si->att_hi = pos[i] + 1;
    }
    /* identity seeds of the full slots, once (they do not depend on layer or head) */
    for (int i = 0; i < n; i++) {
        kiln_kv_seq_integ *si = seq[i]->integ;
        if (!si || (i > 0 && seq[i] == seq[i - 1])) continue;
        int full = si->att_hi / g->pt;
        if (full > si->n_rec) full = si->n_rec;
        if (full > si->n_chain) full = si->n_chain;
        if (si->n_base >= full || !grow((void **)&si->base, &si->cap_base, full, sizeof *si->base)) continue;
        for (int k = si->n_base; k < full; k++) si->base[k] = base_seed(g, si->chain[k], k, g->pt, si->rec_epoch[k]);
        si->n_base = full;
    }
    check_params(p, g, layer, seq, n);
    add(&g->cycles, tsc() - t0);
}

/* The positions of a kernel call over [a, b) read pending injected faults that were not detected
 * yet (campaign accounting only). */
static void note_use(kiln_kv_integ *g, const kiln_kv_seq *s, int layer, int kvh, int a, int b) {
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_faults; i++) {
        inj_fault *f = &g->faults[i];
        if (f->detected || f->dropped || f->used) continue;
        for (int slot = a / g->pt; slot * g->pt < b && !f->used; slot++) {
            if (f->kind == KILN_KV_FAULT_WRONG_PAGE || f->kind == KILN_KV_FAULT_STALE_PAGE) f->used = f->seq == s && f->slot == slot;
            else if (f->page < 0) f->used = f->layer == layer && f->head == kvh;
            else f->used = f->page == s->pages[slot] && (f->unit < 0 || f->unit == (int64_t)uidx(g, f->page, layer, 0, kvh) ||
                                                          (g->nk > 1 && f->unit == (int64_t)uidx(g, f->page, layer, 1, kvh)));
        }
    }
    pthread_mutex_unlock(&g->mu);
}

static inline int check_unit(kiln_kv_integ *g, const kiln_kv_pool *p, const kiln_kv_seq *s, int slot, int32_t pg, int l, int kind, int h,
                             int n_rows, uint64_t base, uint64_t *checks, uint64_t *bytes) {
    size_t u = uidx(g, pg, l, kind, h);
    uint64_t seed = unit_seed(g, base, l, kind, h, param_bits(p, l, pg, kind, h));
    uint64_t ok = seed ^ g->gen_key, t = __atomic_load_n(&g->tag[u], __ATOMIC_RELAXED);
    if (t == ok) return 1;
    if (t == (ok ^ TAG_BAD)) return 0;
    size_t nb = (size_t)n_rows * unit_row(p, l, kind);
    (*checks)++;
    *bytes += nb;
    int good = (hash_bytes(g, unit_ptr(p, pg, l, kind, h), nb) ^ seed) == g->seal[u];
    if (good) __atomic_store_n(&g->tag[u], ok, __ATOMIC_RELAXED);
    /* a failure is reported once per call, as check_fused's: tasks of several tokens of one
     * sequence (the indexer's scans) may check the same unit at once, and only the one whose
     * exchange flips the tag reports it */
    else if (__atomic_exchange_n(&g->tag[u], ok ^ TAG_BAD, __ATOMIC_RELAXED) != (ok ^ TAG_BAD))
        on_detect(g, p, s, slot, pg, (int64_t)u, l, kind, h, diagnose(p, s, s->integ, slot), "attention");
    return good;
}

/* Starts loading page pg's K (and V) slices of head h in layer l: each slice is a few KB in its own
 * 4 KB page, which the hardware prefetcher does not run ahead into. */
static void prefetch_slices(const kiln_kv_integ *g, const kiln_kv_pool *p, int32_t pg, int l, int h) {
    if (pg < 0 || pg >= p->n_pages) return;
    for (int kind = 0; kind < g->nk; kind++) {
        const char *a = (const char *)unit_ptr(p, pg, l, kind, h);
        const size_t nb = (size_t)g->pt * unit_row(p, l, kind);
        for (size_t o = 0; o < nb; o += 64) __builtin_prefetch(a + o, 0, 3);
    }
}

/* Fused verification of one unit (docs/INTEGRITY.md, "Fused verification"): the kernel hashed rows
 * [ra, rb) while it read them (kernel_sum); rows of the unit it did not read (a context split or a
 * prefill tile ending inside the page) are hashed here. Same tags and reporting as check_unit. */
static int check_fused(kiln_kv_integ *g, const kiln_kv_pool *p, const kiln_kv_seq *s, int slot, int32_t pg, int l, int kind, int h,
                       int n_rows, uint64_t base, uint64_t kernel_sum, int ra, int rb, uint64_t *checks, uint64_t *bytes, uint64_t gen_key) {
    size_t u = uidx(g, pg, l, kind, h);
    uint64_t seed = unit_seed(g, base, l, kind, h, param_bits(p, l, pg, kind, h));
    const uint64_t ok = seed ^ gen_key, bad = ok ^ TAG_BAD;
    /* inside a multi-chunk call a unit verified once is not compared again (kiln_kv_integ_verify_seq
     * re-verifies the sequence at the end of the call); a single step compares every time: that
     * costs less than writing a tag */
    if (g->call_key) {
        uint64_t t = __atomic_load_n(&g->tag[u], __ATOMIC_RELAXED);
        if (t == ok) return 1;
        if (t == bad) return 0;
    }
    const size_t row = unit_row(p, l, kind);
    const uint8_t *slice = unit_ptr(p, pg, l, kind, h);
    (*checks)++;
    *bytes += (size_t)n_rows * row;
    uint64_t content = kernel_sum;
    if (ra > 0 || rb < n_rows) content += hash_rows(g, slice, row, 0, ra) + hash_rows(g, slice, row, rb, n_rows);
    if ((content ^ seed) == g->seal[u]) {
        if (g->call_key) __atomic_store_n(&g->tag[u], ok, __ATOMIC_RELAXED);
        return 1;
    }
    /* a failure is reported once per call (prefill tiles and GQA row sets read a unit repeatedly) */
    if (__atomic_exchange_n(&g->tag[u], bad, __ATOMIC_RELAXED) != bad)
        on_detect(g, p, s, slot, pg, (int64_t)u, l, kind, h, diagnose(p, s, s->integ, slot), "attention");
    return 0;
}

/* The fast comparison of a whole slice read in one step, outside a multi-chunk call, with static or
 * no scales (no per-page parameter enters the unit seeds): the seeds' page-independent part once per
 * (layer, KV head) — fast_seeds — then both of a page's seals compared inline — fast_pair_ok; a
 * page that does not compare equal goes through check_fused, which diagnoses it. */
typedef struct { int on; uint64_t uadd[2]; size_t bytes_row; } fast_seeds;
static fast_seeds fast_seeds_for(const kiln_kv_integ *g, const kiln_kv_pool *p, int layer, int kvh) {
    fast_seeds f = {!g->call_key && !p->dscale, {0, 0}, kiln_kv_row_k_at(p, layer) + (g->nk > 1 ? p->row_v : 0)};
    for (int kind = 0; f.on && kind < g->nk; kind++) f.uadd[kind] = unit_seed(g, 0, layer, kind, kvh, param_bits(p, layer, 0, kind, kvh));
    return f;
}
static inline int fast_pair_ok(const kiln_kv_integ *g, const fast_seeds *f, int32_t pg, int layer, int kvh, uint64_t base, const uint64_t *h2) {
    const uint64_t *sl = &g->seal[uidx(g, pg, layer, 0, kvh)], b1 = base * 0x9e3779b97f4a7c15ull;
    return (h2[0] ^ (b1 + f->uadd[0])) == sl[0] && (g->nk == 1 || (h2[1] ^ (b1 + f->uadd[1])) == sl[1]);
}

#define FUSED_RUN_SLOTS 256 /* pages per kernel call of the fused walk (their sums live on the stack: 4 KB) */
#define FUSED_MAX_BAD 64   /* failed pages remembered for the re-run without them */

/* The fused walk over [b, t1) (slots below vh verified already, [t0, b) already run): the kernel
 * runs over up to FUSED_RUN_SLOTS pages at a time hashing what it loads; each page's K and V slices
 * are compared with their seals right after, before this call returns. An entry that names no page
 * of the pool is never dereferenced. When a page failed and the mode is heal or strict, the rows
 * are reset and the kernel runs again over [t0, t1) without the failed pages, so the output this
 * call returns never contains them (detect: used as is) — the cost of a detection, not of a check. */
static int attend_fused(const kiln_kv_pool *p, kiln_kv_integ *g, int layer, const kiln_kv_seq *s, const kiln_kv_seq_integ *si, int kvh,
                        kiln_kv_attend_fn fn, const kiln_kv_span *sp, kiln_kv_rows *rw, int t0, int b, int t1, int vh, uint64_t *checks,
                        uint64_t *bytes, uint64_t *c_fn) {
    const int pt = g->pt;
    kiln_kv_span hsp = *sp;
    hsp.hkey = g->hkey;
    hsp.hash_v = g->nk > 1;
    hsp.prefetch = 1;
    uint64_t hs[2 * FUSED_RUN_SLOTS];
    int bad[FUSED_MAX_BAD], n_bad = 0, all_good = 1;
    const fast_seeds fs = fast_seeds_for(g, p, layer, kvh);
    if (g->call_key && b < t1) {
        /* inside a multi-chunk call: the leading pages whose slices were verified earlier in the call
         * (tags) are read without hashing — later chunks of a long prompt re-read the whole prefix,
         * and hashing it again at every chunk would make the prompt's hashing quadratic */
        int e = b;
        while (e < t1) {
            const int slot = e / pt, n_rows = (slot + 1) * pt <= si->att_hi ? pt : si->att_hi - slot * pt;
            const int32_t pg = s->pages[slot];
            if (n_rows != pt || slot >= si->n_base || pg < 0 || pg >= p->n_pages) break;
            int tagged = 1;
            for (int kind = 0; kind < g->nk && tagged; kind++) {
                const uint64_t seed = unit_seed(g, si->base[slot], layer, kind, kvh, param_bits(p, layer, pg, kind, kvh));
                tagged = __atomic_load_n(&g->tag[uidx(g, pg, layer, kind, kvh)], __ATOMIC_RELAXED) == (seed ^ g->gen_key);
            }
            if (!tagged) break;
            e = (slot + 1) * pt < t1 ? (slot + 1) * pt : t1;
        }
        if (e > b) {
            if (g->n_undetected) note_use(g, s, layer, kvh, b, e);
            kiln_kv_span psp = *sp;
            psp.prefetch = 1;
            uint64_t c = tsc();
            fn(&psp, rw, b, e);
            *c_fn += tsc() - c;
            b = e;
        }
    }
    while (b < t1) {
        const int slot0 = b / pt;
        int e = b;
        while (e < t1 && e / pt - slot0 < FUSED_RUN_SLOTS) {
            const int32_t pg = s->pages[e / pt];
            if (pg < 0 || pg >= p->n_pages) break;
            e = (e / pt + 1) * pt < t1 ? (e / pt + 1) * pt : t1;
        }
        if (e == b) { /* a block-table entry outside the pool: never read */
            on_detect(g, p, s, slot0, s->pages[slot0], -1, layer, 0, kvh, KILN_KV_DETECT_WRONG_PAGE, "attention");
            all_good = 0;
            if (n_bad < FUSED_MAX_BAD) bad[n_bad++] = slot0;
            b = (slot0 + 1) * pt < t1 ? (slot0 + 1) * pt : t1;
            continue;
        }
        const int n_slots = (e - 1) / pt - slot0 + 1;
        memset(hs, 0, 2 * (size_t)n_slots * sizeof *hs);
        /* the run's seals start loading now and arrive while the kernel runs (one line per page) */
        for (int k = 0; k < n_slots; k++) __builtin_prefetch(&g->seal[uidx(g, s->pages[slot0 + k], layer, 0, kvh)], 0, 1);
        hsp.hsum = hs;
        hsp.hslot0 = slot0;
        uint64_t c = tsc();
        fn(&hsp, rw, b, e);
        *c_fn += tsc() - c;
        for (int slot = slot0; slot < slot0 + n_slots; slot++) {
            const int n_rows = (slot + 1) * pt <= si->att_hi ? pt : si->att_hi - slot * pt;
            const int ra = (b > slot * pt ? b : slot * pt) - slot * pt, rb = (e < (slot + 1) * pt ? e : (slot + 1) * pt) - slot * pt;
            const int32_t pg = s->pages[slot];
            uint64_t base = n_rows == pt && slot < si->n_base ? si->base[slot]
                                                              : base_seed(g, prefix_of(si, slot, n_rows, pt), slot, n_rows, rec_epoch(p, s, si, slot));
            const uint64_t *h2 = hs + 2 * (size_t)(slot - slot0);
            if (fs.on && ra == 0 && rb == n_rows && fast_pair_ok(g, &fs, pg, layer, kvh, base, h2)) {
                *checks += (uint64_t)g->nk;
                *bytes += (size_t)n_rows * fs.bytes_row;
                continue;
            }
            int good = check_fused(g, p, s, slot, pg, layer, 0, kvh, n_rows, base, h2[0], ra, rb, checks, bytes, g->gen_key);
            if (g->nk > 1) good &= check_fused(g, p, s, slot, pg, layer, 1, kvh, n_rows, base, h2[1], ra, rb, checks, bytes, g->gen_key);
            if (!good) {
                all_good = 0;
                if (n_bad < FUSED_MAX_BAD) bad[n_bad++] = slot;
            }
        }
        if (g->n_undetected) note_use(g, s, layer, kvh, b, e); /* undetected faults only: they reach the output */
        b = e;
    }
    if (all_good || g->mode == KILN_KV_INTEGRITY_DETECT) return all_good;
    /* heal / strict: the same rows again without the failed pages (and, past FUSED_MAX_BAD of them,
     * without anything after the last one remembered: the step's output is discarded either way) */
    kiln_kv_span psp = *sp;
    psp.prefetch = 1;
    for (int r = 0; r < rw->R; r++) {
        rw->m[r] = -INFINITY;
        rw->l[r] = 0.0f;
        memset(rw->acc[r], 0, (size_t)sp->v_dim * sizeof(float));
    }
    int stop = n_bad == FUSED_MAX_BAD ? bad[n_bad - 1] * pt : t1, run0 = t0;
    (void)vh;
    for (int i = 0; i <= n_bad && run0 < stop; i++) {
        int cut = i < n_bad && bad[i] * pt < stop ? bad[i] * pt : stop;
        if (cut > run0) fn(&psp, rw, run0, cut);
        run0 = i < n_bad ? (bad[i] + 1) * pt : stop;
    }
    return 0;
}

void kiln_kv_integ_attend(const kiln_kv_pool *p, int layer, const kiln_kv_seq *s, int kvh, kiln_kv_attend_fn fn, const kiln_kv_span *sp,
                          kiln_kv_rows *rw, int t0, int t1, int fused) {
    kiln_kv_integ *g = p->integ;
    const kiln_kv_seq_integ *si = s->integ;
    if (!si || si->att_gen != g->gen) { /* cannot happen: begin_attend saw every sequence of the call */
        fn(sp, rw, t0, t1);
        return;
    }
    int lmax = 0;
    for (int r = 0; r < rw->R; r++) lmax = rw->lim[r] > lmax ? rw->lim[r] : lmax;
    if (t1 > lmax) t1 = lmax;
    if (t1 > si->att_hi) t1 = si->att_hi;
    const int pt = g->pt, detect_only = g->mode == KILN_KV_INTEGRITY_DETECT;
    uint64_t checks = 0, bytes = 0, c_start = tsc(), c_fn = 0;
    int run0 = t0, all_good = 1;
    /* slots [0, vh) were verified good in this call already (the tiles of a prefill chunk all read
     * the sequence from position 0): nothing to check there */
    const int vh = __atomic_load_n(&si->ver_hi[kvh], __ATOMIC_RELAXED);
    int b = t0;
    /* fused: a kernel's span, copied with its own prefetch on (nothing reads the pages before it);
     * unfused: the caller's span itself (kv_sparse.c's scans find their state through it) */
    fused = fused && g->fused;
    kiln_kv_span psp = *sp;
    psp.prefetch = 1;
    if (vh * pt > t0 && t1 > t0) { /* the verified prefix in one kernel call, as without integrity */
        int e = vh * pt < t1 ? vh * pt : t1;
        if (g->n_undetected) note_use(g, s, layer, kvh, t0, e);
        uint64_t c = tsc();
        fn(fused ? &psp : sp, rw, t0, e);
        c_fn += tsc() - c;
        run0 = b = e;
    }
    if (fused && b < t1) {
        all_good = attend_fused(p, g, layer, s, si, kvh, fn, sp, rw, t0, b, t1, vh, &checks, &bytes, &c_fn);
        b = t1;
    }
    for (int first_page = 1; b < t1; first_page = 0) {
        const int slot = b / pt, n_rows = (slot + 1) * pt <= si->att_hi ? pt : si->att_hi - slot * pt;
        int pe = (slot + 1) * pt < t1 ? (slot + 1) * pt : t1;
        int32_t pg = s->pages[slot];
        int good;
        if (slot < vh) {
            good = 1;
        } else if (pg < 0 || pg >= p->n_pages) { /* never dereference a block-table entry out of the pool */
            on_detect(g, p, s, slot, pg, -1, layer, 0, kvh, KILN_KV_DETECT_WRONG_PAGE, "attention");
            good = -1;
        } else {
            /* the next page's slices start loading while this one is checked; the first page's
             * too, which nothing has loaded yet (cold-cache decode: kv_isa.h, kiln_kv_prefetch_head) */
            if (first_page) prefetch_slices(g, p, pg, layer, kvh);
            if (pe < t1) prefetch_slices(g, p, s->pages[slot + 1], layer, kvh);
            uint64_t base = n_rows == pt && slot < si->n_base ? si->base[slot]
                                                              : base_seed(g, prefix_of(si, slot, n_rows, pt), slot, n_rows, rec_epoch(p, s, si, slot));
            good = check_unit(g, p, s, slot, pg, layer, 0, kvh, n_rows, base, &checks, &bytes);
            if (g->nk > 1) good &= check_unit(g, p, s, slot, pg, layer, 1, kvh, n_rows, base, &checks, &bytes);
        }
        all_good &= good == 1;
        if (good < 0 || (!good && !detect_only)) { /* the kernel never reads this page */
            if (run0 < b) {
                if (g->n_undetected) note_use(g, s, layer, kvh, run0, b);
                uint64_t c = tsc();
                fn(sp, rw, run0, b);
                c_fn += tsc() - c;
            }
            run0 = pe;
        } else if (pe - run0 >= g->group_tokens || pe == t1) {
            if (g->n_undetected) note_use(g, s, layer, kvh, run0, pe);
            uint64_t c = tsc();
            fn(sp, rw, run0, pe);
            c_fn += tsc() - c;
            run0 = pe;
        }
        b = pe;
    }
    if (t0 == 0 && all_good && t1 > 0) { /* publish: slots [0, ceil(t1 / pt)) are good in this call */
        int nv = (t1 + pt - 1) / pt, cur = __atomic_load_n(&si->ver_hi[kvh], __ATOMIC_RELAXED);
        while (cur < nv && !__atomic_compare_exchange_n(&si->ver_hi[kvh], &cur, nv, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    }
    add(&g->st.checks, checks);
    add(&g->st.bytes_verified, bytes);
    add(&g->cycles, tsc() - c_start - c_fn);
}

/* ---- content hashes computed elsewhere (a device that attends where the pages lie) ---------------- */
int kiln_kv_integ_fusable(const kiln_kv_pool *p) { return p->integ && p->integ->fused; }

const uint32_t *kiln_kv_integ_hash_keys(const kiln_kv_pool *p, size_t *n) {
    const size_t slice_words = (p->head_k > p->head_v ? p->head_k : p->head_v) / 4 + 1;
    *n = slice_words + 16;
    return p->integ->hkey;
}

void kiln_kv_integ_call_state(const kiln_kv_pool *p, kiln_kv_integ_call *out) {
    out->gen = p->integ ? p->integ->gen : 0;
    out->gen_key = p->integ ? p->integ->gen_key : 0;
}

int kiln_kv_integ_check_sums(const kiln_kv_pool *p, const kiln_kv_integ_call *call, int layer, const kiln_kv_seq *s, int kvh, int t1,
                             const uint64_t *sums, size_t stride) {
    kiln_kv_integ *g = p->integ;
    const kiln_kv_seq_integ *si = s->integ;
    if (!g || !si || si->att_gen < call->gen) return 1; /* not in that call (cannot happen: begin_attend saw every sequence) */
    const int att_hi = t1; /* the reach of the sequence in that call: what its rows were hashed over */
    const int pt = g->pt;
    uint64_t checks = 0, bytes = 0, c_start = tsc();
    int all_good = 1;
    const fast_seeds fs = fast_seeds_for(g, p, layer, kvh); /* as attend_fused: every slice here is read whole */
    const int n_slots = (t1 + pt - 1) / pt;
    /* the seals of a head's pages lie one line per page, in page order: scattered pages and, after a
     * step's weight stream, cold — loaded SEAL_AHEAD slots ahead of their comparison */
    enum { SEAL_AHEAD = 16 };
    for (int k = 0; k < SEAL_AHEAD && k < n_slots && k < s->n_pages; k++)
        if (s->pages[k] >= 0 && s->pages[k] < p->n_pages) __builtin_prefetch(&g->seal[uidx(g, s->pages[k], layer, 0, kvh)], 0, 1);
    for (int slot = 0; slot < n_slots; slot++) {
        const int n_rows = (slot + 1) * pt <= att_hi ? pt : att_hi - slot * pt;
        const int32_t pg = slot < s->n_pages ? s->pages[slot] : -1;
        const int ahead = slot + SEAL_AHEAD;
        if (ahead < n_slots && ahead < s->n_pages && s->pages[ahead] >= 0 && s->pages[ahead] < p->n_pages)
            __builtin_prefetch(&g->seal[uidx(g, s->pages[ahead], layer, 0, kvh)], 0, 1);
        if (pg < 0 || pg >= p->n_pages) { /* the device skipped it too: never read */
            on_detect(g, p, s, slot, pg, -1, layer, 0, kvh, KILN_KV_DETECT_WRONG_PAGE, "attention");
            all_good = 0;
            continue;
        }
        const uint64_t base = n_rows == pt && slot < si->n_base ? si->base[slot]
                                                                : base_seed(g, prefix_of(si, slot, n_rows, pt), slot, n_rows, rec_epoch(p, s, si, slot));
        const uint64_t *h2 = sums + stride * (size_t)slot;
        if (fs.on && fast_pair_ok(g, &fs, pg, layer, kvh, base, h2)) {
            checks += (uint64_t)g->nk;
            bytes += (size_t)n_rows * fs.bytes_row;
            continue;
        }
        int good = check_fused(g, p, s, slot, pg, layer, 0, kvh, n_rows, base, h2[0], 0, n_rows, &checks, &bytes, call->gen_key);
        if (g->nk > 1) good &= check_fused(g, p, s, slot, pg, layer, 1, kvh, n_rows, base, h2[1], 0, n_rows, &checks, &bytes, call->gen_key);
        all_good &= good;
    }
    if (g->n_undetected) note_use(g, s, layer, kvh, 0, t1);
    add(&g->st.checks, checks);
    add(&g->st.bytes_verified, bytes);
    add(&g->cycles, tsc() - c_start);
    return all_good;
}

/* ---- callers ------------------------------------------------------------------------------------ */
int kiln_kv_integ_bad_slot(const kiln_kv_seq *s) { return s->integ ? __atomic_load_n(&s->integ->bad_slot, __ATOMIC_RELAXED) : -1; }
void kiln_kv_integ_clear_bad(kiln_kv_seq *s) {
    if (s->integ) s->integ->bad_slot = -1;
}

void kiln_kv_integ_describe_bad(const kiln_kv_pool *p, const kiln_kv_seq *s, char *buf, size_t cap) {
    const kiln_kv_seq_integ *si = s->integ;
    int slot = si ? si->bad_slot : -1, pt = p->cfg.page_tokens;
    if (slot < 0) { snprintf(buf, cap, "no KV page failed verification"); return; }
    int kind = si->bad_kind >= 0 && si->bad_kind < KILN_KV_DETECT_KINDS ? si->bad_kind : 0;
    if (kind == KILN_KV_DETECT_SCALE) snprintf(buf, cap, "a KV scale of the pool's static table changed (%s)", diag_names[kind]);
    else
        snprintf(buf, cap, "KV page %d (block-table slot %d, positions %d-%d) failed its seal: %s", slot < s->n_pages ? s->pages[slot] : -1, slot,
                 slot * pt, slot * pt + pt - 1, diag_names[kind]);
}

void kiln_kv_integ_rollback(kiln_kv_pool *p, kiln_kv_seq *s, int slot) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq_integ *si = s->integ;
    if (slot < 0) slot = 0;
    if (slot > s->n_pages) slot = s->n_pages;
    const int pt = p->cfg.page_tokens;
    if (si) sync_records(p, s, si);
    for (int i = slot; i < s->n_pages; i++) {
        int32_t pg = si && i < si->n_rec ? si->rec_page[i] : s->pages[i];
        uint32_t ep = si ? rec_epoch(p, s, si, i) : p->pages[pg].epoch;
        /* only our own reference goes: a page freed (and reused) under us is not ours */
        if (pg >= 0 && pg < p->n_pages && p->refcount[pg] > 0 && p->pages[pg].epoch == ep) kiln_kv_page_unref(p, pg);
    }
    s->n_pages = slot;
    if (s->len > slot * pt) s->len = slot * pt;
    if (!si) return;
    if (si->n_rec > slot) si->n_rec = slot;
    if (si->n_base > slot) si->n_base = slot;
    for (int l = 0; l < g->L; l++)
        if (si->hi[l] > slot * pt) si->hi[l] = slot * pt;
    while (si->n_chunk > 0 && si->chunk[si->n_chunk - 1] >= slot * pt) si->n_chunk--;
    si->bad_slot = -1;
    si->att_gen = 0;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_faults; i++) {
        inj_fault *f = &g->faults[i];
        int gone = f->seq == s && f->slot >= slot;
        if (!gone || f->detected || f->dropped) continue;
        f->dropped = 1;
        g->n_undetected--;
    }
    pthread_mutex_unlock(&g->mu);
}

int kiln_kv_integ_replay_from(const kiln_kv_seq *s, int pt, int slot) {
    const kiln_kv_seq_integ *si = s->integ;
    int q = slot * pt;
    if (!si) return q;
    for (;;) {
        int cs = 0;
        for (int i = 0; i < si->n_chunk; i++)
            if (si->chunk[i] <= q) cs = si->chunk[i];
        if (cs % pt == 0) return cs;
        q = cs / pt * pt;
    }
}

void kiln_kv_integ_count_heal(kiln_kv_pool *p, int positions) {
    if (!p->integ) return;
    p->integ->st.heals++;
    p->integ->st.healed_positions += (uint64_t)(positions > 0 ? positions : 0);
}
void kiln_kv_integ_count_strict(kiln_kv_pool *p) {
    if (p->integ) p->integ->st.strict_failures++;
}

int kiln_kv_integ_sweep_page(kiln_kv_pool *p, int32_t pg, uint64_t prefix) {
    kiln_kv_integ *g = p->integ;
    if (!g || pg < 0 || pg >= p->n_pages) return 1;
    const int slot = g->page_slot[pg], pt = g->pt;
    uint64_t base = base_seed(g, prefix, slot, pt, p->pages[pg].epoch);
    g->st.swept_pages++;
    for (int l = 0; l < g->L; l++)
        for (int kind = 0; kind < g->nk; kind++)
            for (int h = 0; h < g->H; h++)
                if (!verify_unit(g, p, pg, l, kind, h, pt, unit_seed(g, base, l, kind, h, param_bits(p, l, pg, kind, h)))) {
                    on_detect(g, p, NULL, slot, pg, (int64_t)uidx(g, pg, l, kind, h), l, kind, h, KILN_KV_DETECT_CONTENT, "sweep");
                    return 0;
                }
    return 1;
}

int kiln_kv_integ_take_bad_pages(kiln_kv_pool *p, int32_t *out, int cap) {
    kiln_kv_integ *g = p->integ;
    if (!g) return 0;
    pthread_mutex_lock(&g->mu);
    int n = g->n_bad_pages < cap ? g->n_bad_pages : cap;
    memcpy(out, g->bad_pages, (size_t)n * sizeof *out);
    g->n_bad_pages = 0;
    pthread_mutex_unlock(&g->mu);
    return n;
}

void kiln_kv_integ_stats(const kiln_kv_pool *p, kiln_kv_integrity_stats *out) {
    memset(out, 0, sizeof *out);
    out->mode = KILN_KV_INTEGRITY_OFF;
    kiln_kv_integ *g = p ? p->integ : NULL;
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    *out = g->st;
    out->integrity_ns = (uint64_t)((double)__atomic_load_n(&g->cycles, __ATOMIC_RELAXED) * tsc_ns_per_cycle());
    pthread_mutex_unlock(&g->mu);
}

/* ---- fault injection ---------------------------------------------------------------------------- */
/* A random sealed slice of s: layer, kind, head, slot and its covered rows. full_only: a slot that
 * is complete in every layer. */
static int pick_unit(const kiln_kv_pool *p, const kiln_kv_seq_integ *si, int n_pages, uint64_t *rng, int full_only, int *slot, int *l,
                     int *kind, int *h, int *rows) {
    const kiln_kv_integ *g = p->integ;
    const int pt = g->pt;
    int full = n_pages;
    for (int i = 0; i < g->L; i++)
        if (si->hi[i] / pt < full) full = si->hi[i] / pt;
    for (int tries = 0; tries < 4 * g->L; tries++) {
        int li = (int)rng_below(rng, (uint32_t)g->L);
        int n = full_only ? full : (si->hi[li] + pt - 1) / pt;
        if (n > n_pages) n = n_pages;
        if (n < 1) continue;
        *l = li;
        *slot = (int)rng_below(rng, (uint32_t)n);
        *kind = (int)rng_below(rng, (uint32_t)g->nk);
        *h = (int)rng_below(rng, (uint32_t)g->H);
        *rows = cov_of(si, li, *slot, pt);
        if (*rows > 0) return 1;
    }
    return 0;
}

static void flip_bit(uint8_t *b, uint64_t bit) { b[bit >> 3] ^= (uint8_t)(1u << (bit & 7)); }

/* Stale page: the page of slot `slot` is freed under s (a use-after-free elsewhere) and taken by
 * another sequence, which writes its own rows into it. */
static int inject_stale(kiln_kv_pool *p, kiln_kv_seq *s, int slot, uint64_t *rng) {
    kiln_kv_integ *g = p->integ;
    int32_t pg = s->pages[slot];
    if (p->refcount[pg] != 1) return 0;
    kiln_kv_seq *f = calloc(1, sizeof *f);
    const int H = g->H, kd = p->cfg.k_dim, vd = p->cfg.v_dim, pt = g->pt;
    float *k = malloc((size_t)H * kd * sizeof *k), *v = malloc((size_t)H * vd * sizeof *v);
    int32_t *toks = malloc((size_t)pt * sizeof *toks);
    int ok = f && k && v && toks;
    if (ok) {
        kiln_kv_page_unref(p, pg); /* the bug: the page goes back to the free list while s still lists it */
        ok = kiln_kv_seq_reserve(p, f, pt) == KILN_OK;
    }
    if (ok) {
        for (int i = 0; i < pt; i++) toks[i] = (int32_t)rng_below(rng, 1u << 20);
        ok = kiln_kv_integ_note(p, f, 0, toks, pt, 0) == KILN_OK;
    }
    for (int pos = 0; ok && pos < pt; pos++)
        for (int l = 0; l < g->L; l++) {
            for (int i = 0; i < H * kd; i++) k[i] = (float)((int)rng_below(rng, 2001) - 1000) / 1000.0f;
            for (int i = 0; i < H * vd; i++) v[i] = (float)((int)rng_below(rng, 2001) - 1000) / 1000.0f;
            kiln_kv_store(p, f, l, pos, k, p->cfg.v_shares_k ? NULL : v);
        }
    free(k); free(v); free(toks);
    if (!ok) {
        if (f) { kiln_kv_seq_release(p, f); free(f->pages); free(f); }
        return 0;
    }
    f->len = pt;
    inj_fault fl = {.kind = KILN_KV_FAULT_STALE_PAGE, .seq = s, .slot = slot, .page = pg, .unit = -1, .foreign = f};
    add_fault(g, fl);
    return 1;
}

/* Partial copy: slot `slot` migrates to a fresh page (as an offload / compaction would) and the
 * copy of one slice stops part-way: its tail keeps what the fresh page held before. */
static int inject_partial_copy(kiln_kv_pool *p, kiln_kv_seq *s, kiln_kv_seq_integ *si, int slot, uint64_t *rng) {
    kiln_kv_integ *g = p->integ;
    if (p->n_free < 1) return 0;
    const int pt = g->pt;
    int32_t from = s->pages[slot];
    kiln_kv_seq tmp = {0};
    if (kiln_kv_seq_reserve(p, &tmp, 1) != KILN_OK) return 0;
    int32_t to = tmp.pages[0];
    free_seq_state(tmp.integ);
    free(tmp.pages);
    int l0 = (int)rng_below(rng, (uint32_t)g->L), k0 = (int)rng_below(rng, (uint32_t)g->nk), h0 = (int)rng_below(rng, (uint32_t)g->H);
    size_t nb = (size_t)pt * unit_row(p, l0, k0);
    uint8_t *old = malloc(nb);
    if (!old) { kiln_kv_page_unref(p, to); return 0; }
    memcpy(old, unit_ptr(p, to, l0, k0, h0), nb);
    /* the hand-off: verify the source against s's identity, copy, seal the copy from the source */
    uint32_t ep_to = p->pages[to].epoch;
    uint64_t sbase = base_seed(g, prefix_of(si, slot, pt, pt), slot, pt, rec_epoch(p, s, si, slot));
    uint64_t dbase = base_seed(g, prefix_of(si, slot, pt, pt), slot, pt, ep_to);
    for (int l = 0; l < g->L; l++) {
        for (int kind = 0; kind < g->nk; kind++)
            for (int h = 0; h < g->H; h++) {
                uint32_t pb = param_bits(p, l, from, kind, h);
                if (!verify_unit(g, p, from, l, kind, h, pt, unit_seed(g, sbase, l, kind, h, pb)))
                    on_detect(g, p, s, slot, from, (int64_t)uidx(g, from, l, kind, h), l, kind, h, diagnose(p, s, si, slot), "migration source");
                size_t u = uidx(g, to, l, kind, h);
                g->seal[u] = hash_bytes(g, unit_ptr(p, from, l, kind, h), (size_t)pt * unit_row(p, l, kind)) ^ unit_seed(g, dbase, l, kind, h, pb);
                g->tag[u] = 0;
                g->st.seals++;
            }
        memcpy(p->k[l] + (size_t)to * kiln_kv_page_k_at(p, l), p->k[l] + (size_t)from * kiln_kv_page_k_at(p, l), kiln_kv_page_k_at(p, l));
        if (!p->cfg.v_shares_k) memcpy(p->v[l] + (size_t)to * p->page_v, p->v[l] + (size_t)from * p->page_v, p->page_v);
        if (p->dscale)
            for (int kind = 0; kind < g->nk; kind++)
                for (int h = 0; h < g->H; h++) *dyn_slot(p, l, to, kind, h) = *dyn_slot(p, l, from, kind, h);
    }
    g->page_slot[to] = slot;
    /* the copy of slice (l0, k0, h0) stopped at byte `cut`: find a cut where the stale tail differs */
    uint8_t *d = unit_ptr(p, to, l0, k0, h0);
    size_t cut = nb;
    for (int tries = 0; tries < 16 && cut == nb; tries++) {
        size_t c = 1 + rng_below(rng, (uint32_t)(nb - 1 > 0 ? nb - 1 : 1));
        if (c < nb && memcmp(d + c, old + c, nb - c) != 0) cut = c;
    }
    if (cut < nb) memcpy(d + cut, old + cut, nb - cut);
    free(old);
    s->pages[slot] = to;
    si->rec_page[slot] = to;
    si->rec_epoch[slot] = ep_to;
    if (si->n_base > slot) si->n_base = slot;
    kiln_kv_page_unref(p, from);
    if (cut == nb) return 0; /* the copy happened to be complete: no fault */
    inj_fault f = {.kind = KILN_KV_FAULT_PARTIAL_COPY, .seq = s, .slot = slot, .page = to, .unit = (int64_t)uidx(g, to, l0, k0, h0)};
    add_fault(g, f);
    return 1;
}

/* Finished faults leave the list (the sequences that took stale pages end), so it stays short. */
static void compact_faults(kiln_kv_pool *p, kiln_kv_integ *g) {
    int w = 0;
    for (int i = 0; i < g->n_faults; i++) {
        inj_fault *f = &g->faults[i];
        /* in detect mode a detected fault stays (its corruption stays and is detected again) */
        if (f->dropped || (f->detected && g->mode != KILN_KV_INTEGRITY_DETECT)) {
            release_foreign(p, f);
            continue;
        }
        g->faults[w++] = *f;
    }
    g->n_faults = w;
}

int kiln_kv_integ_inject(kiln_kv_pool *p, kiln_kv_seq *s, kiln_kv_fault kind, uint64_t *rng) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq_integ *si = g ? state(p, s) : NULL;
    if (!si) return 0;
    compact_faults(p, g);
    sync_records(p, s, si);
    g->inj_active = 1;
    int slot, l, uk, h, rows;
    switch (kind) {
    case KILN_KV_FAULT_BITFLIP:
    case KILN_KV_FAULT_MULTIBIT: {
        if (!pick_unit(p, si, s->n_pages, rng, 0, &slot, &l, &uk, &h, &rows)) return 0;
        int32_t pg = s->pages[slot];
        uint64_t nbits = (uint64_t)rows * unit_row(p, l, uk) * 8, bits[8];
        inj_fault f = {.kind = kind, .seq = s, .slot = slot, .page = pg, .unit = (int64_t)uidx(g, pg, l, uk, h)};
        int n = kind == KILN_KV_FAULT_BITFLIP ? 1 : 2 + (int)rng_below(rng, 7);
        for (int i = 0; i < n; i++) {
            uint64_t b;
            int dup;
            do {
                b = rng_next(rng) % nbits;
                dup = 0;
                for (int j = 0; j < i; j++) dup |= bits[j] == b;
            } while (dup && (uint64_t)i < nbits);
            bits[i] = b;
            flip_bit(unit_ptr(p, pg, l, uk, h), b);
            f.flip_at[f.n_flip] = unit_ptr(p, pg, l, uk, h) + (b >> 3);
            f.flip_mask[f.n_flip++] = (uint8_t)(1u << (b & 7));
        }
        add_fault(g, f);
        return 1;
    }
    case KILN_KV_FAULT_SCALE: {
        if (p->cfg.dtype != KILN_KV_FP8) return 0;
        uint32_t bit = rng_below(rng, 32);
        if (p->dscale) {
            if (!pick_unit(p, si, s->n_pages, rng, 0, &slot, &l, &uk, &h, &rows)) return 0;
            int32_t pg = s->pages[slot];
            flip_bit((uint8_t *)dyn_slot(p, l, pg, uk, h), bit);
            inj_fault f = {.kind = kind, .seq = s, .slot = slot, .page = pg, .unit = (int64_t)uidx(g, pg, l, uk, h), .n_flip = 1,
                           .flip_at = {(uint8_t *)dyn_slot(p, l, pg, uk, h) + (bit >> 3)}, .flip_mask = {(uint8_t)(1u << (bit & 7))}};
            add_fault(g, f);
        } else {
            l = (int)rng_below(rng, (uint32_t)g->L);
            uk = (int)rng_below(rng, (uint32_t)g->nk);
            h = (int)rng_below(rng, (uint32_t)g->H);
            flip_bit((uint8_t *)((uk ? p->v_scale : p->k_scale) + (size_t)l * g->H + h), bit);
            inj_fault f = {.kind = kind, .seq = s, .slot = -1, .page = -1, .unit = -1, .layer = l, .ukind = uk, .head = h};
            add_fault(g, f);
        }
        return 1;
    }
    case KILN_KV_FAULT_WRONG_PAGE: {
        if (!pick_unit(p, si, s->n_pages, rng, 1, &slot, &l, &uk, &h, &rows)) return 0;
        int32_t pg = s->pages[slot], q = -1;
        uint32_t start = rng_below(rng, (uint32_t)p->n_pages);
        for (int i = 0; i < p->n_pages && q < 0; i++) {
            int32_t c = (int32_t)((start + (uint32_t)i) % (uint32_t)p->n_pages);
            if (c != pg && p->refcount[c] > 0) q = c;
        }
        if (q < 0) return 0;
        s->pages[slot] = q;
        inj_fault f = {.kind = kind, .seq = s, .slot = slot, .page = q, .unit = -1, .victim = s, .old_page = pg};
        add_fault(g, f);
        return 1;
    }
    case KILN_KV_FAULT_STALE_PAGE:
        if (!pick_unit(p, si, s->n_pages, rng, 1, &slot, &l, &uk, &h, &rows)) return 0;
        return inject_stale(p, s, slot, rng);
    case KILN_KV_FAULT_LOST_WRITE:
        g->arm_lost = 1;
        g->arm_seq = s;
        return 1;
    case KILN_KV_FAULT_PARTIAL_COPY:
        if (!pick_unit(p, si, s->n_pages, rng, 1, &slot, &l, &uk, &h, &rows)) return 0;
        return inject_partial_copy(p, s, si, slot, rng);
    default: return 0;
    }
}

void kiln_kv_integ_tick(kiln_kv_pool *p, kiln_kv_seq *s) {
    kiln_kv_integ *g = p->integ;
    if (!g) return;
    g->ticks++;
    compact_faults(p, g);
    if (!g->inj_active || !s || g->ticks < (uint64_t)g->inj_after || (g->ticks - (uint64_t)g->inj_after) % (uint64_t)g->inj_every) return;
    if (g->arm_lost || g->n_undetected > 0) return; /* one fault at a time: each is detected before the next */
    for (int t = 0; t < KILN_KV_FAULT_KINDS; t++) {
        int k = (g->inj_next + t) % KILN_KV_FAULT_KINDS;
        if (g->inj_counts[k] <= 0) continue;
        if (kiln_kv_integ_inject(p, s, (kiln_kv_fault)k, &g->inj_rng)) {
            g->inj_counts[k]--;
            g->inj_next = k + 1;
            return;
        }
    }
}

kiln_kv_integrity kiln_kv_integ_mode(const kiln_kv_pool *p) { return p && p->integ ? p->integ->mode : KILN_KV_INTEGRITY_OFF; }

int kiln_kv_integ_undo(kiln_kv_pool *p) {
    kiln_kv_integ *g = p->integ;
    if (!g) return 0;
    int n = 0;
    for (int i = 0; i < g->n_faults; i++) {
        inj_fault *f = &g->faults[i];
        if (f->dropped) continue;
        if (f->n_flip) {
            for (int j = 0; j < f->n_flip; j++) *f->flip_at[j] ^= f->flip_mask[j];
            f->n_flip = 0;
        } else if (f->victim) {
            f->victim->pages[f->slot] = f->old_page;
            f->victim = NULL;
        } else {
            continue;
        }
        if (!f->detected) g->n_undetected--;
        f->dropped = 1;
        if (f->seq && f->seq->integ) f->seq->integ->bad_slot = -1;
        n++;
    }
    return n;
}

/* ---- multi-chunk calls ---------------------------------------------------------------------------- */
void kiln_kv_integ_call_begin(kiln_kv_pool *p) {
    kiln_kv_integ *g = p->integ;
    if (!g) return;
    g->gen++;
    g->call_key = mix64(g->gen * 0x9e3779b97f4a7c15ull + 0x43414c4cull) | 1;
}

int kiln_kv_integ_in_call(const kiln_kv_pool *p) { return p->integ && p->integ->call_key != 0; }

void kiln_kv_integ_call_end(kiln_kv_pool *p) {
    if (p->integ) p->integ->call_key = 0;
}

int kiln_kv_integ_verify_seq(kiln_kv_pool *p, kiln_kv_seq *s) {
    kiln_kv_integ *g = p->integ;
    kiln_kv_seq_integ *si = g ? state(p, s) : NULL;
    if (!si) return 1;
    uint64_t t0 = tsc();
    sync_records(p, s, si);
    const int pt = g->pt;
    int good = 1;
    for (int l = 0; l < g->L; l++) {
        const int slots = (si->hi[l] + pt - 1) / pt < s->n_pages ? (si->hi[l] + pt - 1) / pt : s->n_pages;
        for (int slot = 0; slot < slots; slot++) {
            int32_t pg = s->pages[slot];
            int rows = cov_of(si, l, slot, pt);
            if (pg < 0 || pg >= p->n_pages) {
                on_detect(g, p, s, slot, pg, -1, l, 0, 0, KILN_KV_DETECT_WRONG_PAGE, "end of call");
                good = 0;
                continue;
            }
            uint64_t base = rows == pt && slot < si->n_base ? si->base[slot] : base_seed(g, prefix_of(si, slot, rows, pt), slot, rows, rec_epoch(p, s, si, slot));
            for (int kind = 0; kind < g->nk; kind++)
                for (int h = 0; h < g->H; h++)
                    if (!verify_unit(g, p, pg, l, kind, h, rows, unit_seed(g, base, l, kind, h, param_bits(p, l, pg, kind, h)))) {
                        on_detect(g, p, s, slot, pg, (int64_t)uidx(g, pg, l, kind, h), l, kind, h, diagnose(p, s, si, slot), "end of call");
                        good = 0;
                    }
        }
    }
    add(&g->cycles, tsc() - t0);
    return good;
}
