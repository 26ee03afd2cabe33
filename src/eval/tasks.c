/* tasks.c — the task runners: perplexity and KL over a text with a sliding window, the
 * multiple-choice log-likelihood tasks (ARC, PIQA, Winogrande, OpenBookQA, MMLU) and generative
 * GSM8K, plus data-file reading (a malformed line is reported as file:line and skipped, or fails
 * the task under params.strict) and the public entry points of kiln.h's evaluation block. */
#include "eval/eval.h"
#include "base/status.h"
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One of the model's end-of-generation ids (eval_lm.eos_ids). */
static int lm_is_eos(const eval_lm *lm, int32_t id) {
    for (int i = 0; i < lm->n_eos; i++)
        if (lm->eos_ids[i] == id) return 1;
    return 0;
}
#include <sys/stat.h>

/* ---- small helpers ------------------------------------------------------------------------------------ */
void kiln_eval_params_default(kiln_eval_params *p) {
    memset(p, 0, sizeof *p);
    p->shots = -1;
    p->max_gen = 256;
}

kiln_status eval_results_add(eval_results *r, const char *task, const char *sub, const char *name, double value, long n) {
    if (r->n == r->cap) {
        int c = r->cap ? 2 * r->cap : 16;
        kiln_eval_metric *m = realloc(r->m, (size_t)c * sizeof *m);
        if (!m) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
        r->m = m;
        r->cap = c;
    }
    kiln_eval_metric *x = &r->m[r->n++];
    memset(x, 0, sizeof *x);
    snprintf(x->task, sizeof x->task, "%s", task);
    snprintf(x->sub, sizeof x->sub, "%s", sub ? sub : "");
    snprintf(x->name, sizeof x->name, "%s", name);
    x->value = value;
    x->n = n;
    return KILN_OK;
}

static void warnf(const kiln_eval_params *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warnf(const kiln_eval_params *p, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->warn) p->warn(p->ud, msg);
    else fprintf(stderr, "warning: %s\n", msg);
}

static void progress(const kiln_eval_params *p, const char *task, long done, long total) {
    if (p->progress) p->progress(p->ud, task, done, total);
}

kiln_status eval_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) { fclose(f); return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path); }
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *b = realloc(buf, cap * 2);
        if (!b) free(buf);
        buf = b;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(buf); return kiln_fail(KILN_ERR_IO, "%s: read error", path); }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return KILN_OK;
}

static char *path_join(const char *dir, const char *rel) {
    size_t a = strlen(dir), b = strlen(rel);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    s[a] = '/';
    memcpy(s + a + 1, rel, b + 1);
    return s;
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A data file of the task: data_dir/rel. */
static kiln_status data_path(const kiln_eval_params *p, const char *task, const char *rel, char **out) {
    *out = NULL;
    if (!p->data_dir || !*p->data_dir)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: no data directory (give --data-dir DIR holding %s)", task, rel);
    char *s = path_join(p->data_dir, rel);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!file_exists(s)) {
        kiln_status st = kiln_fail(KILN_ERR_IO, "%s: data file %s not found (set --data-dir to the evaluation sets)", task, s);
        free(s);
        return st;
    }
    *out = s;
    return KILN_OK;
}

/* A malformed record: warn and go on, or fail under strict. */
static kiln_status bad_line(const kiln_eval_params *p, const char *file, long line, const char *why) {
    if (p->strict) return kiln_fail(KILN_ERR_FORMAT, "%s:%ld: %s", file, line, why);
    warnf(p, "%s:%ld: %s (line skipped)", file, line, why);
    return KILN_OK;
}

/* Calls fn(ud, obj, line) for every non-blank line of a JSONL file; malformed JSON goes through
 * bad_line; fn returns 0 with a reason to reject a line the same way. stop_after: stop once fn
 * accepted that many lines (0 = all). */
typedef int (*jsonl_fn)(void *ud, json_t *obj, char *why, size_t why_cap);
static kiln_status read_jsonl(const kiln_eval_params *p, const char *path, jsonl_fn fn, void *ud, long stop_after) {
    char *data;
    size_t len;
    KILN_TRY(eval_read_file(path, &data, &len));
    long line = 0, accepted = 0;
    kiln_status st = KILN_OK;
    for (char *s = data; s < data + len && !st; ) {
        char *e = memchr(s, '\n', (size_t)(data + len - s));
        if (!e) e = data + len;
        line++;
        size_t n = (size_t)(e - s);
        if (n && s[n - 1] == '\r') n--;
        int blank = 1;
        for (size_t i = 0; i < n; i++)
            if (s[i] != ' ' && s[i] != '\t') { blank = 0; break; }
        if (!blank) {
            json_error_t jerr;
            json_t *obj = json_loadb(s, n, 0, &jerr);
            char why[512];
            if (!obj) {
                snprintf(why, sizeof why, "invalid JSON at column %d: %s", jerr.column, jerr.text);
                st = bad_line(p, path, line, why);
            } else {
                if (fn(ud, obj, why, sizeof why)) accepted++;
                else st = bad_line(p, path, line, why);
                json_decref(obj);
            }
            if (stop_after > 0 && accepted >= stop_after) break;
        }
        s = e + 1;
    }
    free(data);
    return st;
}

/* ---- CSV (MMLU) ------------------------------------------------------------------------------------- */
/* RFC 4180 records: fields separated by commas, quoted fields may hold commas, newlines and doubled
 * quotes. Calls fn(ud, fields, n_fields, line of the record's start). */
typedef int (*csv_fn)(void *ud, char **f, int n, char *why, size_t why_cap);
static kiln_status read_csv(const kiln_eval_params *p, const char *path, csv_fn fn, void *ud, long stop_after) {
    char *data;
    size_t len;
    KILN_TRY(eval_read_file(path, &data, &len));
    long line = 1, accepted = 0;
    kiln_status st = KILN_OK;
    enum { MAXF = 16 };
    char *fields[MAXF];
    char *field = malloc(len + 1); /* all fields of one record, NUL-separated */
    if (!field) { free(data); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    size_t i = 0;
    while (i < len && !st) {
        long rec_line = line;
        int nf = 0, too_many = 0, bad_quote = 0;
        size_t w = 0;
        for (;;) { /* one field */
            char *start = field + w;
            if (i < len && data[i] == '"') {
                i++;
                for (;;) {
                    if (i >= len) { bad_quote = 1; break; }
                    if (data[i] == '"') {
                        if (i + 1 < len && data[i + 1] == '"') { field[w++] = '"'; i += 2; continue; }
                        i++;
                        break;
                    }
                    if (data[i] == '\n') line++;
                    field[w++] = data[i++];
                }
                /* after a closing quote only a separator may follow */
                while (i < len && data[i] != ',' && data[i] != '\n') { if (data[i] != '\r') bad_quote = 1; i++; }
            } else {
                while (i < len && data[i] != ',' && data[i] != '\n') field[w++] = data[i++];
                if (w > (size_t)(start - field) && field[w - 1] == '\r') w--;
            }
            field[w++] = 0;
            if (nf < MAXF) fields[nf++] = start;
            else too_many = 1;
            if (i < len && data[i] == ',') { i++; continue; }
            if (i < len && data[i] == '\n') { i++; line++; }
            break;
        }
        if (nf == 1 && fields[0][0] == 0) continue; /* blank line */
        char why[256];
        if (bad_quote) st = bad_line(p, path, rec_line, "unterminated or misplaced quote");
        else if (too_many) st = bad_line(p, path, rec_line, "more than 16 fields");
        else if (fn(ud, fields, nf, why, sizeof why)) accepted++;
        else st = bad_line(p, path, rec_line, why);
        if (stop_after > 0 && accepted >= stop_after) break;
    }
    free(field);
    free(data);
    return st;
}

/* ---- log-likelihood requests ------------------------------------------------------------------------- */
typedef struct {
    int vocab;
    const int32_t *tok; /* the window's tokens */
    int first;          /* first row that scores a continuation token */
    double ll;
    int greedy;         /* every continuation token is the argmax */
} ll_ctx;

static kiln_status ll_row(void *ud, int pos, const float *logits) {
    ll_ctx *c = ud;
    if (pos < c->first) return KILN_OK;
    int32_t t = c->tok[pos + 1];
    c->ll += eval_logprob(logits, c->vocab, t);
    if (eval_argmax(logits, c->vocab) != t) c->greedy = 0;
    return KILN_OK;
}

/* Tokenization cache of the last context (every choice of a question shares it). */
typedef struct {
    char *text;
    int32_t *ids;
    int n;
} tok_cache;
static void tok_cache_free(tok_cache *c) { free(c->text); free(c->ids); memset(c, 0, sizeof *c); }

/* log P(cont | ctx), the lm-evaluation-harness way (_encode_pair): trailing whitespace of the
 * context moves to the continuation; the continuation's tokens are those of the whole string
 * after the context's tokens; input = (context + continuation)[:-1], truncated on the left to the
 * context length. BOS starts the context when the model has one. *truncated is set when the
 * request did not fit. */
static kiln_status loglik(eval_lm *lm, tok_cache *tc, const char *ctx, const char *cont, double *ll, int *truncated) {
    size_t lc = strlen(ctx), lk = strlen(cont);
    size_t sp = 0;
    while (sp < lc && (ctx[lc - 1 - sp] == ' ' || ctx[lc - 1 - sp] == '\t' || ctx[lc - 1 - sp] == '\n')) sp++;
    char *c2 = malloc(lc - sp + 1), *whole = malloc(lc + lk + 1);
    if (!c2 || !whole) { free(c2); free(whole); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    memcpy(c2, ctx, lc - sp);
    c2[lc - sp] = 0;
    memcpy(whole, ctx, lc);
    memcpy(whole + lc, cont, lk + 1);
    int add_bos = lm->bos >= 0;
    kiln_status st = KILN_OK;
    if (!tc->text || strcmp(tc->text, c2) != 0) {
        tok_cache_free(tc);
        st = eval_tokenize(lm, c2, add_bos, &tc->ids, &tc->n);
        if (st) { free(c2); free(whole); return st; }
        tc->text = c2;
        c2 = NULL;
    }
    free(c2);
    int32_t *w = NULL, *k = NULL;
    int nw = 0, nk = 0;
    st = eval_tokenize(lm, whole, add_bos, &w, &nw);
    free(whole);
    if (st) return st;
    int nc = tc->n;
    const int32_t *kt;
    if (nw > nc) {
        kt = w + nc;
        nk = nw - nc;
    } else { /* the joint encoding did not extend the context's: encode the continuation alone */
        if ((st = eval_tokenize(lm, cont, 0, &k, &nk))) { free(w); return st; }
        kt = k;
    }
    /* full = [ctx tokens (or one BOS/EOS token for an empty context)] + cont tokens */
    int32_t lead = lm->bos >= 0 ? lm->bos : lm->eos;
    int use_lead = nc == 0;
    if (use_lead && lead < 0) { free(w); free(k); return kiln_fail(KILN_ERR_UNSUPPORTED, "empty context and the model has neither BOS nor EOS"); }
    int n_ctx_tok = use_lead ? 1 : nc;
    int nf = n_ctx_tok + nk;
    int32_t *full = malloc((size_t)(nf > 0 ? nf : 1) * sizeof *full);
    if (!full) { free(w); free(k); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    if (use_lead) full[0] = lead;
    else memcpy(full, tc->ids, (size_t)nc * sizeof *full);
    memcpy(full + n_ctx_tok, kt, (size_t)nk * sizeof *full);
    free(w);
    free(k);
    *ll = 0;
    if (nk == 0) { free(full); return KILN_OK; }
    /* input = full[0, nf - 1); rows [n_ctx_tok - 1, nf - 1) score the continuation */
    int n_in = nf - 1, shift = 0;
    if (n_in > lm->n_ctx) { shift = n_in - lm->n_ctx; *truncated = 1; }
    int first = n_ctx_tok - 1 - shift;
    ll_ctx c = {lm->vocab, full + shift, first < 0 ? 0 : first, 0, 1};
    st = eval_feed(lm, full + shift, n_in - shift, c.first, ll_row, &c);
    free(full);
    *ll = c.ll;
    return st;
}

/* ---- multiple choice --------------------------------------------------------------------------------- */
typedef struct {
    eval_mc *v;
    int n, cap;
    const char *task;
} mc_list;

static void mc_list_free(mc_list *l) {
    for (int i = 0; i < l->n; i++) eval_mc_free(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int mc_push(mc_list *l, eval_mc *e) {
    if (l->n == l->cap) {
        int c = l->cap ? 2 * l->cap : 64;
        eval_mc *v = realloc(l->v, (size_t)c * sizeof *v);
        if (!v) return 0;
        l->v = v;
        l->cap = c;
    }
    l->v[l->n++] = *e;
    return 1;
}

static int mc_line(void *ud, json_t *obj, char *why, size_t cap) {
    mc_list *l = ud;
    eval_mc e;
    if (!eval_mc_from_json(l->task, obj, &e, why, cap)) return 0;
    if (!mc_push(l, &e)) { eval_mc_free(&e); snprintf(why, cap, "out of memory"); return 0; }
    return 1;
}

/* Prepends the K-shot prefix (the gold choice of the first K examples, joined by "\n\n") to every
 * remaining example's contexts, and drops the K from the list. */
static kiln_status apply_shots(mc_list *l, int k) {
    if (k <= 0) return KILN_OK;
    if (k >= l->n) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: --shots %d leaves no example to score (%d in the file)", l->task, k, l->n);
    size_t len = 0;
    for (int i = 0; i < k; i++) len += strlen(l->v[i].ctx[l->v[i].gold]) + strlen(l->v[i].cont[l->v[i].gold]) + 2;
    char *pre = malloc(len + 1);
    if (!pre) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    pre[0] = 0;
    for (int i = 0; i < k; i++) {
        strcat(pre, l->v[i].ctx[l->v[i].gold]);
        strcat(pre, l->v[i].cont[l->v[i].gold]);
        strcat(pre, "\n\n");
    }
    for (int i = k; i < l->n; i++)
        for (int j = 0; j < l->v[i].n_choices; j++) {
            char *c = l->v[i].ctx[j];
            char *s = malloc(len + strlen(c) + 1);
            if (!s) { free(pre); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
            strcpy(s, pre);
            strcat(s, c);
            free(c);
            l->v[i].ctx[j] = s;
        }
    for (int i = 0; i < k; i++) eval_mc_free(&l->v[i]);
    memmove(l->v, l->v + k, (size_t)(l->n - k) * sizeof *l->v);
    l->n -= k;
    free(pre);
    return KILN_OK;
}

/* Scores examples [0, n); per-subject tallies when subs != NULL (n_subs entries). */
typedef struct { long n, acc, acc_norm; } tally;

static kiln_status score_mc(eval_lm *lm, const char *task, const eval_mc *ex, long n, const kiln_eval_params *p,
                            tally *total, tally *subs, long *n_trunc) {
    kiln_status st = KILN_OK;
    tok_cache tc = {0};
    double *ll = NULL;
    size_t *nl = NULL;
    int cap = 0;
    for (long i = 0; i < n && !st; i++) {
        const eval_mc *e = &ex[i];
        if (e->n_choices > cap) {
            cap = e->n_choices;
            double *a = realloc(ll, (size_t)cap * sizeof *ll);
            if (a) ll = a;
            size_t *b = realloc(nl, (size_t)cap * sizeof *nl);
            if (b) nl = b;
            if (!a || !b) { st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); break; }
        }
        int trunc = 0;
        for (int j = 0; j < e->n_choices && !st; j++) {
            st = loglik(lm, &tc, e->ctx[j], e->cont[j], &ll[j], &trunc);
            nl[j] = e->norm_len[j];
        }
        if (st) break;
        int pick, pick_norm;
        eval_mc_pick(ll, nl, e->n_choices, &pick, &pick_norm);
        total->n++;
        total->acc += pick == e->gold;
        total->acc_norm += pick_norm == e->gold;
        if (subs) {
            subs[e->sub].n++;
            subs[e->sub].acc += pick == e->gold;
            subs[e->sub].acc_norm += pick_norm == e->gold;
        }
        *n_trunc += trunc;
        progress(p, task, i + 1, n);
    }
    tok_cache_free(&tc);
    free(ll);
    free(nl);
    return st;
}

static kiln_status add_acc(eval_results *r, const char *task, const char *sub, const tally *t, int with_norm) {
    double a = t->n ? (double)t->acc / (double)t->n : 0, an = t->n ? (double)t->acc_norm / (double)t->n : 0;
    KILN_TRY(eval_results_add(r, task, sub, "acc", a, t->n));
    KILN_TRY(eval_results_add(r, task, sub, "acc_stderr", eval_acc_stderr(a, t->n), t->n));
    if (with_norm) {
        KILN_TRY(eval_results_add(r, task, sub, "acc_norm", an, t->n));
        KILN_TRY(eval_results_add(r, task, sub, "acc_norm_stderr", eval_acc_stderr(an, t->n), t->n));
    }
    return KILN_OK;
}

static kiln_status run_mc(eval_lm *lm, const char *task, const char *rel, const kiln_eval_params *p, eval_results *r) {
    char *path;
    KILN_TRY(data_path(p, task, rel, &path));
    mc_list l = {.task = task};
    int k = p->shots > 0 ? p->shots : 0;
    long want = p->limit > 0 ? p->limit + k : 0;
    kiln_status st = read_jsonl(p, path, mc_line, &l, want);
    if (!st) st = apply_shots(&l, k);
    tally t = {0};
    long n_trunc = 0;
    long n = p->limit > 0 && p->limit < l.n ? p->limit : l.n;
    if (!st) st = score_mc(lm, task, l.v, n, p, &t, NULL, &n_trunc);
    if (!st && n_trunc) warnf(p, "%s: %ld of %ld examples did not fit the %d-token context and were truncated on the left", task, n_trunc, n, lm->n_ctx);
    if (!st) st = add_acc(r, task, "", &t, 1);
    if (!st) st = eval_results_add(r, task, "", "truncated", (double)n_trunc, t.n);
    mc_list_free(&l);
    free(path);
    return st;
}

/* ---- MMLU ------------------------------------------------------------------------------------------- */
typedef struct {
    eval_mmlu_row *v;
    int n, cap;
} mmlu_rows;

static void mmlu_rows_free(mmlu_rows *m) {
    for (int i = 0; i < m->n; i++) {
        free(m->v[i].q);
        for (int j = 0; j < 4; j++) free(m->v[i].opt[j]);
    }
    free(m->v);
    memset(m, 0, sizeof *m);
}

static int mmlu_line(void *ud, char **f, int n, char *why, size_t cap) {
    mmlu_rows *m = ud;
    if (n != 6) { snprintf(why, cap, "%d fields, expected 6 (question, A, B, C, D, answer)", n); return 0; }
    const char *a = f[5];
    while (*a == ' ') a++;
    if (!(a[0] >= 'A' && a[0] <= 'D') || (a[1] && a[1] != ' ')) { snprintf(why, cap, "answer field '%.20s' is not one of A, B, C, D", f[5]); return 0; }
    if (m->n == m->cap) {
        int c = m->cap ? 2 * m->cap : 64;
        eval_mmlu_row *v = realloc(m->v, (size_t)c * sizeof *v);
        if (!v) { snprintf(why, cap, "out of memory"); return 0; }
        m->v = v;
        m->cap = c;
    }
    eval_mmlu_row *r = &m->v[m->n];
    r->q = strdup(f[0]);
    for (int j = 0; j < 4; j++) r->opt[j] = strdup(f[1 + j]);
    r->answer = a[0] - 'A';
    m->n++;
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static kiln_status run_mmlu(eval_lm *lm, const kiln_eval_params *p, eval_results *r) {
    const char *task = "mmlu";
    if (!p->data_dir) return kiln_fail(KILN_ERR_INVALID_ARG, "mmlu: no data directory (give --data-dir)");
    char *test_dir = path_join(p->data_dir, "mmlu/test");
    if (!test_dir) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    DIR *d = opendir(test_dir);
    if (!d) { kiln_status st = kiln_fail(KILN_ERR_IO, "mmlu: cannot open %s: %s", test_dir, strerror(errno)); free(test_dir); return st; }
    char **subj = NULL;
    int n_subj = 0, cap_subj = 0;
    for (struct dirent *de; (de = readdir(d)); ) {
        size_t l = strlen(de->d_name);
        if (l <= 9 || strcmp(de->d_name + l - 9, "_test.csv") != 0) continue;
        if (n_subj == cap_subj) {
            cap_subj = cap_subj ? 2 * cap_subj : 64;
            char **s = realloc(subj, (size_t)cap_subj * sizeof *s);
            if (!s) break;
            subj = s;
        }
        subj[n_subj++] = strndup(de->d_name, l - 9);
    }
    closedir(d);
    free(test_dir);
    if (n_subj == 0) { free(subj); return kiln_fail(KILN_ERR_IO, "mmlu: no SUBJECT_test.csv files under %s/mmlu/test", p->data_dir); }
    qsort(subj, (size_t)n_subj, sizeof *subj, cmp_str);
    int shots = p->shots >= 0 ? p->shots : 5;

    /* Build every example first (the progress total), then score. */
    mc_list l = {.task = task};
    kiln_status st = KILN_OK;
    for (int s = 0; s < n_subj && !st; s++) {
        char rel[512];
        mmlu_rows dev = {0}, test = {0};
        char *dpath = NULL, *tpath = NULL;
        if (shots > 0) {
            snprintf(rel, sizeof rel, "mmlu/dev/%s_dev.csv", subj[s]);
            st = data_path(p, task, rel, &dpath);
            if (!st) st = read_csv(p, dpath, mmlu_line, &dev, shots);
            if (!st && dev.n < shots) st = kiln_fail(KILN_ERR_FORMAT, "%s: %d usable rows, fewer than the %d shots", dpath, dev.n, shots);
        }
        snprintf(rel, sizeof rel, "mmlu/test/%s_test.csv", subj[s]);
        if (!st) st = data_path(p, task, rel, &tpath);
        if (!st) st = read_csv(p, tpath, mmlu_line, &test, p->limit > 0 ? p->limit : 0);
        for (int i = 0; i < test.n && !st; i++) {
            eval_mc e = {0};
            char *prompt = eval_mmlu_prompt(subj[s], dev.v, shots, &test.v[i]);
            if (!prompt || !(e.ctx = calloc(4, sizeof *e.ctx)) || !(e.cont = calloc(4, sizeof *e.cont)) ||
                !(e.norm_len = calloc(4, sizeof *e.norm_len))) {
                free(prompt);
                e.n_choices = e.ctx && e.cont ? 4 : 0;
                eval_mc_free(&e);
                st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
                break;
            }
            e.n_choices = 4;
            e.gold = test.v[i].answer;
            e.sub = s;
            for (int j = 0; j < 4; j++) {
                char c[3] = {' ', (char)('A' + j), 0};
                e.ctx[j] = strdup(prompt);
                e.cont[j] = strdup(c);
                e.norm_len[j] = 1;
            }
            free(prompt);
            if (!mc_push(&l, &e)) { eval_mc_free(&e); st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
        }
        free(dpath);
        free(tpath);
        mmlu_rows_free(&dev);
        mmlu_rows_free(&test);
    }
    tally t = {0};
    tally *subs = calloc((size_t)n_subj, sizeof *subs);
    long n_trunc = 0;
    if (!subs && !st) st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!st) st = score_mc(lm, task, l.v, l.n, p, &t, subs, &n_trunc);
    if (!st && n_trunc) warnf(p, "mmlu: %ld of %d questions did not fit the %d-token context and were truncated on the left", n_trunc, l.n, lm->n_ctx);
    if (!st) {
        /* macro average: the mean of the subjects' accuracies; micro: over all questions */
        double macro = 0;
        int counted = 0;
        for (int s = 0; s < n_subj && !st; s++) {
            if (!subs[s].n) continue;
            macro += (double)subs[s].acc / (double)subs[s].n;
            counted++;
            st = add_acc(r, task, subj[s], &subs[s], 0);
        }
        if (!st) st = eval_results_add(r, task, "", "acc", counted ? macro / counted : 0, t.n);
        if (!st) st = eval_results_add(r, task, "", "acc_micro", t.n ? (double)t.acc / (double)t.n : 0, t.n);
        if (!st) st = eval_results_add(r, task, "", "n_subjects", counted, t.n);
        if (!st) st = eval_results_add(r, task, "", "truncated", (double)n_trunc, t.n);
    }
    free(subs);
    mc_list_free(&l);
    for (int s = 0; s < n_subj; s++) free(subj[s]);
    free(subj);
    return st;
}

/* ---- perplexity and KL ------------------------------------------------------------------------------- */
typedef struct {
    eval_lm *lm;
    const int32_t *tok;  /* window tokens */
    int first;           /* first scored row */
    double nll;
    long count;
    float *lp;           /* [vocab] scratch */
    float *lb;           /* [vocab] baseline row */
    eval_logits_file *save, *base;
    double *kl;          /* per position, grows */
    long n_kl, cap_kl;
    long top1;
    double base_nll;
} ppl_ctx;

static kiln_status ppl_row(void *ud, int pos, const float *logits) {
    ppl_ctx *c = ud;
    if (pos < c->first) return KILN_OK;
    int V = c->lm->vocab;
    int32_t t = c->tok[pos + 1];
    if (!c->save && !c->base) {
        c->nll -= eval_logprob(logits, V, t);
        c->count++;
        return KILN_OK;
    }
    eval_log_softmax(logits, V, c->lp);
    c->nll -= c->lp[t];
    c->count++;
    if (c->save) KILN_TRY(eval_logits_write(c->save, t, c->lp));
    if (c->base) {
        int32_t bt;
        KILN_TRY(eval_logits_read(c->base, &bt, c->lb));
        if (bt != t)
            return kiln_fail(KILN_ERR_INVALID_ARG, "baseline logits: position %ld scores token %d, this run token %d: the runs did not score the same text", c->count - 1, bt, t);
        if (c->n_kl == c->cap_kl) {
            long nc = c->cap_kl ? 2 * c->cap_kl : 1024;
            double *k = realloc(c->kl, (size_t)nc * sizeof *k);
            if (!k) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
            c->kl = k;
            c->cap_kl = nc;
        }
        c->kl[c->n_kl++] = eval_kl(c->lb, c->lp, V);
        c->top1 += eval_argmax(c->lb, V) == eval_argmax(c->lp, V);
        c->base_nll -= c->lb[t];
    }
    return KILN_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Resolves the text file of ppl:FILE / kl:FILE: aliases, then as given, then under data_dir. */
static kiln_status text_path(const kiln_eval_params *p, const char *task, const char *file, char **out) {
    *out = NULL;
    if (!file || !*file) file = "tinystories";
    const char *rel = NULL;
    if (strcmp(file, "tinystories") == 0) rel = "more/tinystories_sample.txt";
    else if (strcmp(file, "wikitext2") == 0 || strcmp(file, "wikitext") == 0) rel = "wikitext-2-raw/wiki.test.raw";
    if (rel) return data_path(p, task, rel, out);
    if (file_exists(file)) {
        *out = strdup(file);
        return *out ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    if (p->data_dir) {
        char *s = path_join(p->data_dir, file);
        if (s && file_exists(s)) { *out = s; return KILN_OK; }
        free(s);
    }
    return kiln_fail(KILN_ERR_IO, "%s: text file '%s' not found (as given%s%s)", task, file, p->data_dir ? " or under " : "", p->data_dir ? p->data_dir : "");
}

/* Tokens of the text (CRLF line ends read as LF), BOS first when the model has one; with
 * max_tokens only a prefix of the text (cut at a line end) is encoded. */
static kiln_status text_tokens(eval_lm *lm, const char *path, long max_tokens, int32_t **ids, int *n) {
    char *data;
    size_t len;
    KILN_TRY(eval_read_file(path, &data, &len));
    size_t w = 0;
    for (size_t i = 0; i < len; i++)
        if (!(data[i] == '\r' && i + 1 < len && data[i + 1] == '\n')) data[w++] = data[i];
    len = w;
    data[len] = 0;
    size_t take = len;
    if (max_tokens > 0) take = (size_t)max_tokens * 8 + 256 < len ? (size_t)max_tokens * 8 + 256 : len;
    kiln_status st;
    for (;;) {
        size_t cut = take;
        if (cut < len) { /* end on a line break so no UTF-8 sequence is split */
            while (cut > 0 && data[cut - 1] != '\n') cut--;
            if (cut == 0) cut = take;
            while (cut < len && (data[cut] & 0xC0) == 0x80) cut++;
        }
        char save = data[cut];
        data[cut] = 0;
        st = eval_tokenize(lm, data, lm->bos >= 0, ids, n);
        data[cut] = save;
        if (st || max_tokens <= 0 || *n >= max_tokens || take >= len) break;
        free(*ids);
        *ids = NULL;
        take = take * 2 < len ? take * 2 : len;
    }
    free(data);
    if (!st && max_tokens > 0 && *n > max_tokens) *n = (int)max_tokens;
    return st;
}

/* "random": a fixed pseudo-random token stream (BOS first when the model has one), for models
 * without a tokenizer (synthetic checkpoints): KL between configurations stays meaningful. */
static kiln_status random_tokens(eval_lm *lm, long max_tokens, int32_t **ids, int *n) {
    long len = max_tokens > 0 ? max_tokens : 2048;
    if (len > (1L << 28)) return kiln_fail(KILN_ERR_INVALID_ARG, "random text: %ld tokens is too many", len);
    int32_t *v = malloc((size_t)len * sizeof *v);
    if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    uint64_t x = 0x6b696c6e6576616cull; /* splitmix64, fixed seed: the same text every run */
    for (long i = 0; i < len; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        v[i] = (int32_t)(z % (uint64_t)lm->vocab);
    }
    if (lm->bos >= 0) v[0] = lm->bos;
    *ids = v;
    *n = (int)len;
    return KILN_OK;
}

static kiln_status run_ppl(eval_lm *lm, const char *task, const char *file, int kl, const kiln_eval_params *p, eval_results *r) {
    if (kl && !p->save_logits && !p->baseline_logits)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: needs --save-logits FILE (baseline run) or --baseline-logits FILE (comparison run)", task);
    int32_t *tok = NULL;
    int n = 0;
    kiln_status st;
    if (file && strcmp(file, "random") == 0) {
        st = random_tokens(lm, p->max_tokens, &tok, &n);
    } else {
        char *path;
        KILN_TRY(text_path(p, task, file, &path));
        st = text_tokens(lm, path, p->max_tokens, &tok, &n);
        free(path);
    }
    if (st) return st;
    int W = p->window > 0 && p->window < lm->n_ctx ? p->window : lm->n_ctx;
    int S = p->stride > 0 ? p->stride : W / 2;
    if (S < 1) S = 1;
    if (S > W) S = W;
    if (W < 2) { free(tok); return kiln_fail(KILN_ERR_INVALID_ARG, "%s: window of %d tokens is too small", task, W); }
    if (n < 2) { free(tok); return kiln_fail(KILN_ERR_INVALID_ARG, "%s: the text has %d tokens; at least 2 are needed", task, n); }

    ppl_ctx c = {.lm = lm};
    c.lp = malloc((size_t)lm->vocab * sizeof *c.lp);
    c.lb = malloc((size_t)lm->vocab * sizeof *c.lb);
    if (!c.lp || !c.lb) st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!st && kl && p->save_logits) st = eval_logits_create(p->save_logits, lm->vocab, W, S, &c.save);
    if (!st && kl && p->baseline_logits) {
        st = eval_logits_open(p->baseline_logits, &c.base);
        if (!st) {
            int bv, bw, bs;
            int64_t bn;
            eval_logits_info(c.base, &bv, &bw, &bs, &bn);
            if (bv != lm->vocab) st = kiln_fail(KILN_ERR_INVALID_ARG, "%s: vocab %d, this model's is %d", p->baseline_logits, bv, lm->vocab);
            else if (bw != W || bs != S) st = kiln_fail(KILN_ERR_INVALID_ARG, "%s: written with window %d / stride %d, this run uses %d / %d (give the same --ctx / --window / --stride)", p->baseline_logits, bw, bs, W, S);
            else if (bn < n - 1) st = kiln_fail(KILN_ERR_INVALID_ARG, "%s: holds %lld positions, this run scores %d (give the same --max-tokens)", p->baseline_logits, (long long)bn, n - 1);
        }
    }
    /* Windows of W tokens starting every S tokens; each scores the tokens not scored before
     * (Hugging Face's strided perplexity): every token but the first is scored exactly once, with
     * at least W - S tokens of context after the first window. */
    long total = n > W ? 1 + (n - W + S - 1) / S : 1, done = 0;
    int prev_end = 0;
    for (int b = 0; !st; b += S) {
        int e = b + W < n ? b + W : n;
        int first_target = prev_end > b + 1 ? prev_end : b + 1; /* index of the first token scored */
        c.tok = tok + b;
        c.first = first_target - 1 - b;
        /* input = tok[b, e - 1): the last token is only a target */
        st = eval_feed(lm, tok + b, e - 1 - b, c.first, ppl_row, &c);
        prev_end = e;
        progress(p, task, ++done, total);
        if (e == n) break;
    }
    if (!st) {
        double ppl = exp(c.nll / (double)c.count);
        st = eval_results_add(r, task, "", "ppl", ppl, c.count);
        if (!st) st = eval_results_add(r, task, "", "nll", c.nll / (double)c.count, c.count);
    }
    if (!st && c.base) {
        qsort(c.kl, (size_t)c.n_kl, sizeof *c.kl, cmp_double);
        double mean = 0;
        for (long i = 0; i < c.n_kl; i++) mean += c.kl[i];
        mean /= (double)(c.n_kl ? c.n_kl : 1);
        long k = c.n_kl;
        if (!st) st = eval_results_add(r, task, "", "kl_mean", mean, k);
        if (!st) st = eval_results_add(r, task, "", "kl_median", eval_quantile_sorted(c.kl, (size_t)k, 0.5), k);
        if (!st) st = eval_results_add(r, task, "", "kl_p99", eval_quantile_sorted(c.kl, (size_t)k, 0.99), k);
        if (!st) st = eval_results_add(r, task, "", "kl_max", k ? c.kl[k - 1] : 0, k);
        if (!st) st = eval_results_add(r, task, "", "top1_agree", k ? (double)c.top1 / (double)k : 0, k);
        if (!st) st = eval_results_add(r, task, "", "ppl_baseline", exp(c.base_nll / (double)(k ? k : 1)), k);
    }
    kiln_status st2 = eval_logits_close(c.save);
    if (!st) st = st2;
    eval_logits_close(c.base);
    free(c.kl);
    free(c.lp);
    free(c.lb);
    free(tok);
    return st;
}

/* ---- GSM8K ------------------------------------------------------------------------------------------ */
typedef struct {
    char **q, **a;
    int n, cap;
    long stop_after;
} qa_list;

static void qa_free(qa_list *l) {
    for (int i = 0; i < l->n; i++) { free(l->q[i]); free(l->a[i]); }
    free(l->q);
    free(l->a);
    memset(l, 0, sizeof *l);
}

static int qa_line(void *ud, json_t *obj, char *why, size_t cap) {
    qa_list *l = ud;
    json_t *q = json_object_get(obj, "question"), *a = json_object_get(obj, "answer");
    if (!json_is_object(obj)) { snprintf(why, cap, "not a JSON object"); return 0; }
    if (!json_is_string(q)) { snprintf(why, cap, "field \"question\" is missing or not a string"); return 0; }
    if (!json_is_string(a)) { snprintf(why, cap, "field \"answer\" is missing or not a string"); return 0; }
    if (!strstr(json_string_value(a), "####")) { snprintf(why, cap, "field \"answer\" has no '#### N' final answer"); return 0; }
    if (l->n == l->cap) {
        int c = l->cap ? 2 * l->cap : 64;
        char **nq = realloc(l->q, (size_t)c * sizeof *nq);
        if (nq) l->q = nq;
        char **na = realloc(l->a, (size_t)c * sizeof *na);
        if (na) l->a = na;
        if (!nq || !na) { snprintf(why, cap, "out of memory"); return 0; }
        l->cap = c;
    }
    l->q[l->n] = strdup(json_string_value(q));
    l->a[l->n] = strdup(json_string_value(a));
    l->n++;
    return 1;
}

static kiln_status run_gsm8k(eval_lm *lm, const kiln_eval_params *p, eval_results *r) {
    const char *task = "gsm8k";
    char *tpath = NULL, *trpath = NULL;
    qa_list test = {0}, train = {0};
    kiln_status st = data_path(p, task, "gsm8k/test.jsonl", &tpath);
    if (!st) st = read_jsonl(p, tpath, qa_line, &test, p->limit);
    int cot = p->shots < 0;
    if (!st && !cot && p->shots > 0) {
        st = data_path(p, task, "gsm8k/train.jsonl", &trpath);
        if (!st) st = read_jsonl(p, trpath, qa_line, &train, p->shots);
        if (!st && train.n < p->shots) st = kiln_fail(KILN_ERR_INVALID_ARG, "gsm8k: --shots %d but %s has %d usable rows", p->shots, trpath, train.n);
    }
    /* Few-shot prefix: gsm8k-cot "Q: {q}\nA: {target}" or gsm8k "Question: {q}\nAnswer: {answer}",
     * joined by "\n\n". */
    const char *qp = cot ? "Q: " : "Question: ", *ap = cot ? "\nA:" : "\nAnswer:";
    static const char *const stops_cot[] = {"Q:", "</s>", "<|im_end|>", NULL};
    static const char *const stops_hash[] = {"Question:", "</s>", "<|im_end|>", NULL};
    const char *const *stops = cot ? stops_cot : stops_hash;
    size_t plen = 1;
    int n_shots = cot ? EVAL_GSM8K_COT_N : train.n;
    for (int i = 0; i < n_shots; i++)
        plen += strlen(cot ? eval_gsm8k_cot_q[i] : train.q[i]) + strlen(cot ? eval_gsm8k_cot_a[i] : train.a[i]) + 32;
    char *prefix = st ? NULL : malloc(plen);
    if (!st && !prefix) st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (prefix) {
        prefix[0] = 0;
        for (int i = 0; i < n_shots; i++) {
            strcat(prefix, qp);
            strcat(prefix, cot ? eval_gsm8k_cot_q[i] : train.q[i]);
            strcat(prefix, ap);
            strcat(prefix, " ");
            strcat(prefix, cot ? eval_gsm8k_cot_a[i] : train.a[i]);
            strcat(prefix, "\n\n");
        }
    }
    int max_gen = p->max_gen > 0 ? p->max_gen : 256;
    if (max_gen > lm->n_ctx / 2) max_gen = lm->n_ctx / 2; /* leave room for a prompt */
    kiln_sampler *smp = NULL;
    kiln_sampling sp;
    kiln_sampling_default(&sp);
    sp.temperature = 0; /* greedy */
    if (!st) st = kiln_sampler_create(&sp, lm->vocab, &smp);
    long n_strict = 0, n_flex = 0, n_trunc = 0, n_done = 0;
    int32_t *seq = NULL;
    char *gen = NULL;
    size_t gen_cap = 0;
    for (int i = 0; i < test.n && !st; i++) {
        size_t ql = strlen(prefix) + strlen(test.q[i]) + 32;
        char *prompt = malloc(ql);
        if (!prompt) { st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); break; }
        snprintf(prompt, ql, "%s%s%s%s", prefix, qp, test.q[i], ap);
        int32_t *ids;
        int n;
        st = eval_tokenize(lm, prompt, lm->bos >= 0, &ids, &n);
        free(prompt);
        if (st) break;
        int room = lm->n_ctx - max_gen, shift = 0;
        if (n > room) { shift = n - room; n_trunc++; }
        int len = n - shift;
        free(seq);
        seq = malloc((size_t)(len + max_gen + 1) * sizeof *seq);
        if (!seq) { free(ids); st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); break; }
        memcpy(seq, ids + shift, (size_t)len * sizeof *seq);
        free(ids);
        st = eval_feed(lm, seq, len, len - 1, NULL, NULL);
        size_t gl = 0;
        int32_t prev = seq[len - 1];
        for (int g = 0; g < max_gen && !st; g++) {
            int32_t next = kiln_sample(smp, lm->last_logits(lm->ctx));
            if (next == lm->eos || lm_is_eos(lm, next)) break;
            size_t pl;
            const char *pc = lm->piece(lm->ctx, prev, next, &pl);
            if (pc && pl) {
                if (gl + pl + 1 > gen_cap) {
                    size_t c = gen_cap ? gen_cap * 2 : 1024;
                    while (c < gl + pl + 1) c *= 2;
                    char *ng = realloc(gen, c);
                    if (!ng) { st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); break; }
                    gen = ng;
                    gen_cap = c;
                }
                memcpy(gen + gl, pc, pl);
                gl += pl;
                gen[gl] = 0;
                if (eval_stop_at(gen, gl, stops) < gl) break;
            }
            seq[len++] = next;
            prev = next;
            if (g + 1 == max_gen || len >= lm->n_ctx) break;
            st = eval_feed(lm, seq, len, len - 1, NULL, NULL);
        }
        if (st) break;
        if (!gen) { gen = malloc(1); gen_cap = gen ? 1 : 0; }
        if (!gen) { st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); break; }
        gl = eval_stop_at(gen, gl, stops);
        gen[gl] = 0;
        char target[128], got[256];
        eval_gsm8k_target(test.a[i], target, sizeof target);
        if (eval_gsm8k_strict(gen, cot ? EVAL_GSM_COT : EVAL_GSM_HASH, got, sizeof got)) {
            eval_gsm8k_normalize(got);
            n_strict += strcmp(got, target) == 0;
        }
        if (eval_gsm8k_flexible(gen, got, sizeof got)) {
            eval_gsm8k_normalize(got);
            n_flex += strcmp(got, target) == 0;
        }
        n_done++;
        progress(p, task, n_done, test.n);
    }
    if (!st && n_trunc) warnf(p, "gsm8k: %ld of %ld prompts were truncated on the left to leave %d tokens for the answer in the %d-token context", n_trunc, n_done, max_gen, lm->n_ctx);
    if (!st) {
        double s = n_done ? (double)n_strict / (double)n_done : 0, f = n_done ? (double)n_flex / (double)n_done : 0;
        st = eval_results_add(r, task, "", "exact_match_strict", s, n_done);
        if (!st) st = eval_results_add(r, task, "", "exact_match_strict_stderr", eval_acc_stderr(s, n_done), n_done);
        if (!st) st = eval_results_add(r, task, "", "exact_match_flexible", f, n_done);
        if (!st) st = eval_results_add(r, task, "", "exact_match_flexible_stderr", eval_acc_stderr(f, n_done), n_done);
        if (!st) st = eval_results_add(r, task, "", "truncated", (double)n_trunc, n_done);
    }
    kiln_sampler_free(smp);
    free(seq);
    free(gen);
    free(prefix);
    qa_free(&test);
    qa_free(&train);
    free(tpath);
    free(trpath);
    return st;
}

/* ---- dispatch -------------------------------------------------------------------------------------- */
static const struct { const char *name, *file; } mc_tasks[] = {
    {"arc_easy", "arc/arc_easy.jsonl"},
    {"arc_challenge", "arc/arc_challenge.jsonl"},
    {"piqa", "more/piqa.jsonl"},
    {"winogrande", "more/winogrande.jsonl"},
    {"openbook_qa", "more/openbook_qa.jsonl"},
};

const char *kiln_eval_known_tasks(void) {
    return "ppl:FILE (FILE may be tinystories, wikitext2 or random), kl[:FILE], arc_easy, arc_challenge, piqa, winogrande, "
           "openbook_qa, mmlu, gsm8k";
}

kiln_status kiln_eval_check_task(const char *t) {
    if (!t) t = "";
    if (strncmp(t, "ppl:", 4) == 0 && t[4]) return KILN_OK;
    if (strcmp(t, "kl") == 0 || (strncmp(t, "kl:", 3) == 0 && t[3])) return KILN_OK;
    if (strcmp(t, "mmlu") == 0 || strcmp(t, "gsm8k") == 0) return KILN_OK;
    for (size_t i = 0; i < sizeof mc_tasks / sizeof *mc_tasks; i++)
        if (strcmp(t, mc_tasks[i].name) == 0) return KILN_OK;
    return kiln_fail(KILN_ERR_INVALID_ARG, "unknown task '%s'; known tasks: %s", t, kiln_eval_known_tasks());
}

kiln_status eval_run_task(eval_lm *lm, const char *t, const kiln_eval_params *p, eval_results *r) {
    KILN_TRY(kiln_eval_check_task(t));
    if (strncmp(t, "ppl:", 4) == 0) return run_ppl(lm, "ppl", t + 4, 0, p, r);
    if (strncmp(t, "kl", 2) == 0) return run_ppl(lm, "kl", t[2] == ':' ? t + 3 : NULL, 1, p, r);
    if (strcmp(t, "mmlu") == 0) return run_mmlu(lm, p, r);
    if (strcmp(t, "gsm8k") == 0) return run_gsm8k(lm, p, r);
    for (size_t i = 0; i < sizeof mc_tasks / sizeof *mc_tasks; i++)
        if (strcmp(t, mc_tasks[i].name) == 0) return run_mc(lm, t, mc_tasks[i].file, p, r);
    return kiln_fail(KILN_ERR_INTERNAL, "task '%s' has no runner", t);
}

kiln_status kiln_eval_run(kiln_model *m, const kiln_options *o, const char *task, const kiln_eval_params *p,
                          kiln_eval_metric **metrics, int *n_metrics) {
    *metrics = NULL;
    *n_metrics = 0;
    kiln_eval_params dp;
    if (!p) { kiln_eval_params_default(&dp); p = &dp; }
    KILN_TRY(kiln_eval_check_task(task));
    eval_lm lm;
    KILN_TRY(eval_lm_session(&lm, m, o));
    eval_results r = {0};
    kiln_status st = eval_run_task(&lm, task, p, &r);
    eval_lm_session_free(&lm);
    if (st) { free(r.m); return st; }
    *metrics = r.m;
    *n_metrics = r.n;
    return KILN_OK;
}
