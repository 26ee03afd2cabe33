/* cmd_eval.c — `kiln eval`: quality of a model under a weight / KV configuration, and `kiln eval
 * --matrix` over several configurations with one Markdown table of deltas against the first row.
 * Uses only kiln.h (the evaluation block); JSON output through jansson. */
#include "kiln_test.h"
#include "cli.h"
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *USAGE =
    "usage: kiln eval MODEL --task NAME[,NAME...] [--limit N] [--shots K] [--weights f32|bf16|fp8|int4|int4-g128]\n"
    "                 [--kv-dtype auto|f32|bf16|fp8] [--json] [--out results.json] [--data-dir DIR] [--strict]\n"
    "                 [--save-logits F | --baseline-logits F] [--max-tokens N] [--window N] [--stride N]\n"
    "                 [--max-gen N] [--threads N] [--ctx N] [--tp N [--ep 1|N]] (under mpirun -np N)\n"
    "       kiln eval MODEL --matrix --task ... [--configs W/KV,...]   (default bf16/bf16,bf16/fp8,fp8/bf16,\n"
    "                 fp8/fp8,int4/bf16,int4/fp8; W may be stored: one Markdown table, each row's delta against the first)\n"
    "tasks: ";

/* ---- progress bar and warnings (stderr; the bar only on a terminal) ------------------------------- */
typedef struct {
    int tty;
    const char *label; /* configuration shown before the task in matrix runs */
    double t0, last;
    char task[64];
    int drawn;
} ui_t;

static void ui_clear(ui_t *u) {
    if (u->drawn) { fprintf(stderr, "\r\033[K"); u->drawn = 0; }
}

static void ui_progress(void *ud, const char *task, long done, long total) {
    ui_t *u = ud;
    if (!u->tty) return;
    if (strcmp(u->task, task) != 0 || done <= 1) {
        snprintf(u->task, sizeof u->task, "%s", task);
        u->t0 = kiln_now() - 1e-9;
    }
    double now = kiln_now(), el = now - u->t0;
    if (done < total && u->drawn && now - u->last < 0.1) return; /* ten redraws a second at most */
    u->last = now;
    double frac = total > 0 ? (double)done / (double)total : 0;
    int w = 30, fill = (int)(frac * w + 0.5);
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    char eta[32] = "";
    if (done > 0 && done < total) snprintf(eta, sizeof eta, " ETA %.0fs", el / (double)done * (double)(total - done));
    fprintf(stderr, "\r\033[K%s%s%s [%s] %ld/%ld %.0fs%s", u->label ? u->label : "", u->label ? " " : "", task, bar, done, total, el, eta);
    fflush(stderr);
    u->drawn = 1;
}

static void ui_warn(void *ud, const char *msg) {
    ui_t *u = ud;
    ui_clear(u);
    fprintf(stderr, "kiln eval: warning: %s\n", msg);
}

/* ---- data directory ------------------------------------------------------------------------------- */
static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* --data-dir, else $KILN_DATA_DIR, $SHARED/data, ../shared/data, or shared/data beside one of the
 * binary's ancestors (build/eval/kiln in a checkout next to shared/). */
static char *find_data_dir(const char *given) {
    if (given) return strdup(given);
    const char *e = getenv("KILN_DATA_DIR");
    if (e && *e) return strdup(e);
    char buf[PATH_MAX + 64];
    e = getenv("SHARED");
    if (e && *e) {
        snprintf(buf, sizeof buf, "%s/data", e);
        if (is_dir(buf)) return strdup(buf);
    }
    if (is_dir("../shared/data")) return strdup("../shared/data");
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        for (int up = 0; up < 5; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = 0;
            snprintf(buf, sizeof buf, "%s/../shared/data", exe);
            if (is_dir(buf)) return strdup(buf);
        }
    }
    return NULL;
}

/* ---- results -------------------------------------------------------------------------------------- */
typedef struct {
    char *key;                 /* the task as the user wrote it ("ppl:tinystories") */
    kiln_eval_metric *m;
    int n;
    double seconds;
    char *error;               /* matrix rows: why this task failed */
} task_res;

static const kiln_eval_metric *find_metric(const task_res *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (!t->m[i].sub[0] && strcmp(t->m[i].name, name) == 0) return &t->m[i];
    return NULL;
}

/* {"acc": .., "n": .., "subjects": {"x": {...}}} */
static json_t *task_json(const task_res *t) {
    json_t *o = json_object();
    if (t->error) { json_object_set_new(o, "error", json_string(t->error)); return o; }
    json_t *subs = NULL;
    long n = -1;
    for (int i = 0; i < t->n; i++) {
        const kiln_eval_metric *m = &t->m[i];
        json_t *dst = o;
        if (m->sub[0]) {
            if (!subs) subs = json_object();
            dst = json_object_get(subs, m->sub);
            if (!dst) { dst = json_object(); json_object_set_new(subs, m->sub, dst); }
            json_object_set_new(dst, "n", json_integer(m->n));
        } else if (n < 0) {
            n = m->n;
        }
        json_object_set_new(dst, m->name, json_real(m->value));
    }
    if (n >= 0) json_object_set_new(o, "n", json_integer(n));
    if (subs) json_object_set_new(o, "subjects", subs);
    return o;
}

static json_t *results_json(task_res *tr, int nt) {
    json_t *r = json_object();
    for (int i = 0; i < nt; i++) json_object_set_new(r, tr[i].key, task_json(&tr[i]));
    return r;
}

/* The headline metrics of a task, in table order. */
static const char *const *headline(const char *task) {
    static const char *const ppl[] = {"ppl", NULL};
    static const char *const kl[] = {"kl_mean", "kl_median", "kl_p99", "top1_agree", "ppl", NULL};
    static const char *const mc[] = {"acc", "acc_norm", NULL};
    static const char *const mmlu[] = {"acc", "acc_micro", NULL};
    static const char *const gsm[] = {"exact_match_strict", "exact_match_flexible", NULL};
    if (strncmp(task, "ppl:", 4) == 0) return ppl;
    if (strncmp(task, "kl", 2) == 0) return kl;
    if (strcmp(task, "mmlu") == 0) return mmlu;
    if (strcmp(task, "gsm8k") == 0) return gsm;
    return mc;
}

static void fmt_val(char *b, size_t cap, const char *name, double v, int delta) {
    if (strncmp(name, "kl_", 3) == 0) snprintf(b, cap, delta ? "%+.2e" : "%.2e", v);
    else snprintf(b, cap, delta ? "%+.4f" : "%.4f", v);
}

static void print_human(FILE *f, const task_res *tr, int nt) {
    for (int i = 0; i < nt; i++) {
        const task_res *t = &tr[i];
        if (t->error) { fprintf(f, "%-18s error: %s\n", t->key, t->error); continue; }
        fprintf(f, "%-18s", t->key);
        long n = 0;
        for (const char *const *h = headline(t->key); *h; h++) {
            const kiln_eval_metric *m = find_metric(t, *h);
            if (!m) continue;
            char v[32], se[48] = "";
            fmt_val(v, sizeof v, *h, m->value, 0);
            char sname[48];
            snprintf(sname, sizeof sname, "%s_stderr", *h);
            const kiln_eval_metric *s = find_metric(t, sname);
            if (s) snprintf(se, sizeof se, " ± %.4f", s->value);
            fprintf(f, "  %s %s%s", *h, v, se);
            n = m->n;
        }
        const kiln_eval_metric *tc = find_metric(t, "truncated");
        fprintf(f, "  (n=%ld%s", n, tc && tc->value > 0 ? ", " : "");
        if (tc && tc->value > 0) fprintf(f, "%.0f truncated", tc->value);
        fprintf(f, ", %.1fs)\n", t->seconds);
    }
}

/* ---- one configuration ----------------------------------------------------------------------------- */
typedef struct {
    const char *model;
    kiln_options o;
    kiln_eval_params p;
    char **tasks;
    int n_tasks;
    ui_t ui;
    kiln_model *loaded; /* --tp: this rank's shard, loaded before (run_tasks does not free it) */
} run_cfg;

/* Runs every task under weights w (NULL = as stored); fills tr. In a matrix (keep_going) a task's
 * failure is recorded in its row; otherwise it returns the failure. */
static kiln_status run_tasks(run_cfg *c, const char *w, task_res *tr, int keep_going, char **row_err) {
    kiln_model *m = c->loaded;
    kiln_status st = m ? KILN_OK : kiln_model_load(c->model, &c->o, &m);
    if (st) {
        if (row_err) *row_err = strdup(kiln_last_error());
        return st;
    }
    int kept = 0;
    if (w && (st = kiln_model_requantize(m, w, &kept))) {
        if (row_err) *row_err = strdup(kiln_last_error());
        kiln_model_free(m);
        return st;
    }
    if (kept) {
        char msg[160];
        snprintf(msg, sizeof msg, "--weights %s: %d linear weight%s kept in the stored format (input dimension not a multiple of the INT4 group of 32)",
                 w, kept, kept == 1 ? "" : "s");
        ui_warn(&c->ui, msg);
    }
    for (int i = 0; i < c->n_tasks; i++) {
        tr[i].key = c->tasks[i];
        double t0 = kiln_now();
        st = kiln_eval_run(m, &c->o, c->tasks[i], &c->p, &tr[i].m, &tr[i].n);
        ui_clear(&c->ui);
        tr[i].seconds = kiln_now() - t0;
        if (st) {
            if (!keep_going) break;
            tr[i].error = strdup(kiln_last_error());
            st = KILN_OK;
        }
    }
    if (!c->loaded) kiln_model_free(m);
    return st;
}

static void free_res(task_res *tr, int nt) {
    for (int i = 0; i < nt; i++) { free(tr[i].m); free(tr[i].error); }
}

static const char *kv_name(kiln_kv_dtype d) {
    return d == KILN_KV_F32 ? "f32" : d == KILN_KV_BF16 ? "bf16" : d == KILN_KV_FP8 ? "fp8" : "auto";
}

static int write_json(const char *path, json_t *j) {
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) != 0) {
        fprintf(stderr, "kiln eval: error: cannot write %s\n", path);
        return 0;
    }
    return 1;
}

/* ---- matrix ----------------------------------------------------------------------------------------- */
typedef struct { char w[16]; kiln_kv_dtype kv; } cfg_t; /* w: "stored" = as loaded */

static int parse_configs(const char *s, cfg_t **out, int *n) {
    int cap = 8, k = 0;
    cfg_t *v = malloc((size_t)cap * sizeof *v);
    char *dup = strdup(s), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *slash = strchr(t, '/');
        if (!slash) goto bad;
        *slash = 0;
        const char *kv = slash + 1;
        if (strcmp(t, "stored") && strcmp(t, "f32") && strcmp(t, "bf16") && strcmp(t, "fp8") && strcmp(t, "int4") && strcmp(t, "int4-g32") &&
            strcmp(t, "int4-g128"))
            goto bad;
        if (k == cap) v = realloc(v, (size_t)(cap *= 2) * sizeof *v);
        snprintf(v[k].w, sizeof v[k].w, "%s", t);
        if (!strcmp(kv, "auto")) v[k].kv = KILN_KV_AUTO;
        else if (!strcmp(kv, "f32")) v[k].kv = KILN_KV_F32;
        else if (!strcmp(kv, "bf16")) v[k].kv = KILN_KV_BF16;
        else if (!strcmp(kv, "fp8")) v[k].kv = KILN_KV_FP8;
        else goto bad;
        k++;
    }
    free(dup);
    if (!k) { free(v); return 0; }
    *out = v;
    *n = k;
    return 1;
bad:
    free(dup);
    free(v);
    return 0;
}

static int run_matrix(run_cfg *c, const char *configs, int json, const char *out_path) {
    cfg_t *cf;
    int nc;
    if (!parse_configs(configs, &cf, &nc))
        return cli_fail_msg("eval", "option --configs: expected WEIGHTS/KV pairs like bf16/bf16,int4/fp8 (weights stored|f32|bf16|fp8|int4|int4-g128, KV auto|f32|bf16|fp8)");
    /* kl without a given baseline: the first row writes it, the others compare against it. */
    char tmp[PATH_MAX] = "";
    int has_kl = 0;
    for (int i = 0; i < c->n_tasks; i++) has_kl |= strncmp(c->tasks[i], "kl", 2) == 0;
    if (has_kl && !c->p.baseline_logits) {
        const char *td = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/kiln-eval-XXXXXX", td && *td ? td : "/tmp");
        int fd = mkstemp(tmp);
        if (fd < 0) { free(cf); return cli_fail_msg("eval", "cannot create a temporary file for the matrix baseline logits"); }
        close(fd);
    }
    task_res *rows = calloc((size_t)nc * (size_t)c->n_tasks, sizeof *rows);
    char **row_err = calloc((size_t)nc, sizeof *row_err);
    int failed = 0;
    for (int r = 0; r < nc; r++) {
        char label[64];
        snprintf(label, sizeof label, "[%s/%s]", cf[r].w, kv_name(cf[r].kv));
        c->ui.label = label;
        c->o.kv_dtype = cf[r].kv;
        kiln_eval_params p = c->p;
        if (tmp[0]) {
            p.save_logits = r == 0 ? tmp : NULL;
            p.baseline_logits = r == 0 ? NULL : tmp;
        }
        run_cfg rc = *c;
        rc.p = p;
        run_tasks(&rc, strcmp(cf[r].w, "stored") ? cf[r].w : NULL, rows + (size_t)r * c->n_tasks, 1, &row_err[r]);
        for (int i = 0; i < c->n_tasks; i++) {
            task_res *t = &rows[(size_t)r * c->n_tasks + i];
            if (!t->key) t->key = c->tasks[i];
            if (t->error || row_err[r]) failed = 1;
            if (t->error) fprintf(stderr, "kiln eval: %s %s: %s\n", label, c->tasks[i], t->error);
        }
        if (row_err[r]) fprintf(stderr, "kiln eval: %s: %s\n", label, row_err[r]);
        if (tmp[0] && r == 0 && (row_err[0] || failed)) {
            fprintf(stderr, "kiln eval: the first row failed: the kl columns of the other rows have no baseline\n");
        }
    }
    if (tmp[0]) unlink(tmp);

    /* Markdown table: one column per headline metric; rows after the first show their delta. */
    json_t *jrows = json_array();
    FILE *f = stdout;
    if (!json) {
        fprintf(f, "| weights | KV |");
        for (int i = 0; i < c->n_tasks; i++)
            for (const char *const *h = headline(c->tasks[i]); *h; h++) fprintf(f, " %s %s |", c->tasks[i], *h);
        fprintf(f, "\n|---|---|");
        for (int i = 0; i < c->n_tasks; i++)
            for (const char *const *h = headline(c->tasks[i]); *h; h++) fprintf(f, "---|");
        fprintf(f, "\n");
    }
    for (int r = 0; r < nc; r++) {
        task_res *row = rows + (size_t)r * c->n_tasks;
        json_t *jr = json_object();
        json_object_set_new(jr, "weights", json_string(cf[r].w));
        json_object_set_new(jr, "kv_dtype", json_string(kv_name(cf[r].kv)));
        if (row_err[r]) json_object_set_new(jr, "error", json_string(row_err[r]));
        else json_object_set_new(jr, "results", results_json(row, c->n_tasks));
        json_array_append_new(jrows, jr);
        if (json) continue;
        fprintf(f, "| %s | %s |", cf[r].w, kv_name(cf[r].kv));
        for (int i = 0; i < c->n_tasks; i++)
            for (const char *const *h = headline(c->tasks[i]); *h; h++) {
                const kiln_eval_metric *m = row_err[r] || row[i].error ? NULL : find_metric(&row[i], *h);
                if (!m) { fprintf(f, " %s |", row_err[r] || row[i].error ? "n/a" : "—"); continue; }
                char v[32], d[40] = "";
                fmt_val(v, sizeof v, *h, m->value, 0);
                const kiln_eval_metric *b = r > 0 && !row_err[0] && !rows[i].error ? find_metric(&rows[i], *h) : NULL;
                if (b) {
                    char dv[32];
                    fmt_val(dv, sizeof dv, *h, m->value - b->value, 1);
                    snprintf(d, sizeof d, " (%s)", dv);
                }
                fprintf(f, " %s%s |", v, d);
            }
        fprintf(f, "\n");
    }
    json_t *doc = json_object();
    json_object_set_new(doc, "model", json_string(c->model));
    json_object_set_new(doc, "limit", json_integer(c->p.limit));
    json_object_set_new(doc, "shots", json_integer(c->p.shots));
    json_object_set_new(doc, "matrix", jrows);
    int ok = 1;
    if (json) { json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(17)); printf("\n"); }
    if (out_path) ok = write_json(out_path, doc);
    json_decref(doc);
    for (int r = 0; r < nc; r++) { free_res(rows + (size_t)r * c->n_tasks, c->n_tasks); free(row_err[r]); }
    free(rows);
    free(row_err);
    free(cf);
    return failed || !ok ? 1 : 0;
}

/* ---- entry ------------------------------------------------------------------------------------------ */
int cmd_eval(int argc, char **argv) {
    args_t a = {argc, argv, 0, "eval", 0};
    run_cfg c;
    memset(&c, 0, sizeof c);
    kiln_options_default(&c.o);
    kiln_eval_params_default(&c.p);
    const char *task_arg = NULL, *weights = NULL, *out_path = NULL, *data_dir = NULL, *configs = NULL;
    int json = 0, matrix = 0;
    long tp = 1, ep = 1;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        long v;
        if (cli_common_option(&a, &c.o)) continue;
        if (!strcmp(k, "--tp")) { cli_long(&a, k, cli_value(&a), 1, 1024, &tp); continue; } /* under mpirun -np N (docs/SCALE.md) */
        if (!strcmp(k, "--ep")) { cli_long(&a, k, cli_value(&a), 1, 1024, &ep); continue; }
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) { printf("%s%s\n", USAGE, kiln_eval_known_tasks()); return 0; }
        if (!strcmp(k, "--task") || !strcmp(k, "--tasks")) task_arg = cli_value(&a);
        else if (!strcmp(k, "--limit")) { if (cli_long(&a, k, cli_value(&a), 1, LONG_MAX / 2, &v)) c.p.limit = v; }
        else if (!strcmp(k, "--shots")) { if (cli_long(&a, k, cli_value(&a), 0, 64, &v)) c.p.shots = (int)v; }
        else if (!strcmp(k, "--max-tokens")) { if (cli_long(&a, k, cli_value(&a), 2, 1L << 30, &v)) c.p.max_tokens = v; }
        else if (!strcmp(k, "--window")) { if (cli_long(&a, k, cli_value(&a), 2, 1 << 24, &v)) c.p.window = (int)v; }
        else if (!strcmp(k, "--stride")) { if (cli_long(&a, k, cli_value(&a), 1, 1 << 24, &v)) c.p.stride = (int)v; }
        else if (!strcmp(k, "--max-gen")) { if (cli_long(&a, k, cli_value(&a), 1, 1 << 20, &v)) c.p.max_gen = (int)v; }
        else if (!strcmp(k, "--weights")) weights = cli_value(&a);
        else if (!strcmp(k, "--json")) json = 1;
        else if (!strcmp(k, "--out")) out_path = cli_value(&a);
        else if (!strcmp(k, "--data-dir")) data_dir = cli_value(&a);
        else if (!strcmp(k, "--save-logits")) c.p.save_logits = cli_value(&a);
        else if (!strcmp(k, "--baseline-logits")) c.p.baseline_logits = cli_value(&a);
        else if (!strcmp(k, "--strict")) c.p.strict = 1;
        else if (!strcmp(k, "--matrix")) matrix = 1;
        else if (!strcmp(k, "--configs")) { configs = cli_value(&a); matrix = 1; }
        else if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln eval: error: unknown option '%s'\n", k); return 2; }
        else if (!c.model) c.model = k;
        else { fprintf(stderr, "kiln eval: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!c.model || !task_arg) {
        fprintf(stderr, "kiln eval: error: %s%s\n", USAGE, kiln_eval_known_tasks());
        return 2;
    }
    if (weights && strcmp(weights, "f32") && strcmp(weights, "bf16") && strcmp(weights, "fp8") && strcmp(weights, "int4") &&
        strcmp(weights, "int4-g32") && strcmp(weights, "int4-g128")) {
        fprintf(stderr, "kiln eval: error: option --weights: '%s' is not one of f32, bf16, fp8, int4 (= int4-g32), int4-g128\n", weights);
        return 2;
    }
    if (matrix && weights) return cli_fail_msg("eval", "--matrix sets the weights of each row itself: drop --weights (or use --configs)");
    if (matrix && c.p.save_logits) return cli_fail_msg("eval", "--matrix keeps its own baseline logits: drop --save-logits");
    if (tp > 1 && (matrix || weights))
        return cli_fail_msg("eval", "--tp runs the model as stored: --matrix and --weights re-quantize whole models (quantize the file first with kiln quantize)");
    if (ep > 1 && tp < 2) return cli_fail_msg("eval", "--ep spreads the experts over the --tp ranks: give --tp N (under mpirun -np N) as well");
    /* Split and check every task before loading anything. */
    char *tl = strdup(task_arg), *save = NULL;
    for (char *t = strtok_r(tl, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (kiln_eval_check_task(t)) { int rc = cli_fail_status("eval", KILN_ERR_INVALID_ARG); free(tl); free(c.tasks); return rc == 1 ? 2 : rc; }
        c.tasks = realloc(c.tasks, (size_t)(c.n_tasks + 1) * sizeof *c.tasks);
        c.tasks[c.n_tasks++] = t;
    }
    if (!c.n_tasks) { free(tl); return cli_fail_msg("eval", "option --task: no task named"); }
    char *dd = find_data_dir(data_dir);
    c.p.data_dir = dd;
    if (tp > 1) {
        /* every rank runs the same evaluation on its shard: the logits are gathered to every rank
         * (not only rank 0), so each takes the same decisions with no further messages; rank 0
         * prints and writes the files */
        int rank = 0;
        int trc = cli_tp_load("eval", &argc, &argv, tp, ep, c.model, &c.o, &c.loaded, &rank);
        if (trc) { free(tl); free(c.tasks); free(dd); return trc; }
        kiln_model_set_logits_gather(c.loaded, kiln_dist_allgather_vocab, NULL);
        if (rank > 0) {
            out_path = NULL;
            if (c.p.save_logits) c.p.save_logits = "/dev/null";
            if (!freopen("/dev/null", "w", stderr)) { /* progress and warnings come from rank 0 */ }
        }
    }
    c.ui.tty = isatty(2);
    c.p.progress = ui_progress;
    c.p.warn = ui_warn;
    c.p.ud = &c.ui;
    int rc = 0;
    if (matrix) {
        /* p.ud must follow the ui of the row being run: run_matrix keeps c.ui current. */
        rc = run_matrix(&c, configs ? configs : "bf16/bf16,bf16/fp8,fp8/bf16,fp8/fp8,int4/bf16,int4/fp8", json, out_path);
    } else {
        task_res *tr = calloc((size_t)c.n_tasks, sizeof *tr);
        kiln_status st = run_tasks(&c, weights, tr, 0, NULL);
        ui_clear(&c.ui);
        if (st) rc = cli_fail_status("eval", st);
        else {
            json_t *doc = json_object();
            json_object_set_new(doc, "model", json_string(c.model));
            json_object_set_new(doc, "weights", json_string(weights ? weights : "stored"));
            json_object_set_new(doc, "kv_dtype", json_string(kv_name(c.o.kv_dtype)));
            json_object_set_new(doc, "limit", json_integer(c.p.limit));
            json_object_set_new(doc, "shots", json_integer(c.p.shots));
            json_object_set_new(doc, "results", results_json(tr, c.n_tasks));
            json_t *secs = json_object();
            for (int i = 0; i < c.n_tasks; i++) json_object_set_new(secs, tr[i].key, json_real(tr[i].seconds));
            json_object_set_new(doc, "seconds", secs);
            if (json) { json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(17)); printf("\n"); }
            else print_human(stdout, tr, c.n_tasks);
            if (out_path && !write_json(out_path, doc)) rc = 1;
            json_decref(doc);
        }
        free_res(tr, c.n_tasks);
        free(tr);
    }
    free(dd);
    free(tl);
    free(c.tasks);
    if (c.loaded) {
        kiln_model_free(c.loaded);
        if (rc && kiln_dist_failed()) kiln_dist_abort(rc);
        kiln_dist_finalize();
    }
    return rc;
}
