/* cmd_tokenize.c — `kiln tokenize`, `kiln chat-template` and `kiln bench --tokenizer`.
 *
 *   kiln tokenize MODEL_OR_TOKENIZER [--json] [--no-bos] [--no-special] [--] TEXT
 *       ids and pieces of TEXT ("-" reads standard input; after "--", TEXT may start with "--"). Plain output: one "id<TAB>piece" line per
 *       token (the piece C-escaped: \n, \t, \\, bytes of an incomplete UTF-8 character as \xNN),
 *       then "N tokens". --json: {"ids": [...], "tokens": [...], "pieces": [...], "text": ...}.
 *       --no-bos: no BOS even when the tokenizer adds one; --no-special: special tokens written in
 *       the text are encoded as plain text.
 *   kiln chat-template MODEL --messages FILE.json [--tools FILE.json] [--no-generation-prompt]
 *                      [--template FILE] [--var NAME=JSON ...] [--extra FILE.json]
 *       prints the rendered prompt exactly (no newline added). MODEL: a model or tokenizer
 *       directory, tokenizer_config.json, GGUF, or a .jinja file.
 *   kiln chat-template --batch FILE.jsonl
 *       one render per input line {"path", "template" (file, optional), "messages", "tools"
 *       (optional), "add_generation_prompt" (default true), "extra" (optional)}; one output line
 *       each: {"ok": true, "text": ...} or {"ok": false, "error": ...} (tests drive it).
 *   kiln bench --tokenizer [TOKENIZER] [--text FILE] [--seconds S] [--no-npm] [--json]
 *       single-core encoding speed (MB/s) of English text (default: WikiText-2 test) with
 *       DeepSeek-V3's tokenizer.json (default), beside the npm @huggingface/tokenizers port on the
 *       same text in the same run (node scripts/hf_tokenize.mjs --bench). */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *read_all(FILE *f, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); return NULL; }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[len] = 0;
    if (n) *n = len;
    return buf;
}

static char *read_path(const char *path, size_t *n) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    char *b = read_all(f, n);
    if (f != stdin) fclose(f);
    return b;
}

/* UTF-8 sequence length at s (0 = not a complete valid sequence) */
static size_t u8len(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    size_t k = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if (!k || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return k;
}

static void put_escaped(FILE *f, const char *p, size_t n, int json) {
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c == '\\') { fputs("\\\\", f); i++; continue; }
        if (json && c == '"') { fputs("\\\"", f); i++; continue; }
        if (c == '\n') { fputs("\\n", f); i++; continue; }
        if (c == '\t') { fputs("\\t", f); i++; continue; }
        if (c == '\r') { fputs("\\r", f); i++; continue; }
        if (c < 0x20 || c == 0x7f) { fprintf(f, json ? "\\u%04x" : "\\x%02x", c); i++; continue; }
        size_t k = u8len(s + i, n - i);
        if (!k) { /* part of a character: JSON gets U+FFFD, text the byte */
            if (json) fputs("\xef\xbf\xbd", f);
            else fprintf(f, "\\x%02x", c);
            i++;
            continue;
        }
        fwrite(s + i, 1, k, f);
        i += k;
    }
}

int cmd_tokenize(int argc, char **argv) {
    args_t a = {argc, argv, 0, "tokenize", 0};
    const char *path = NULL, *text = NULL;
    int json = 0, bos = 1, special = 1, ntext = 0, options_end = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        if (!options_end && s[0] == '-' && s[1] == '-') { /* after "--" every word is an operand */
            if (!strcmp(s, "--")) options_end = 1;
            else if (!strcmp(s, "--json")) json = 1;
            else if (!strcmp(s, "--no-bos")) bos = 0;
            else if (!strcmp(s, "--no-special")) special = 0;
            else {
                fprintf(stderr, "kiln tokenize: error: unknown option '%s'\n", s);
                return 2;
            }
        } else if (!path) path = s;
        else { text = s; ntext++; }
    }
    if (!path || ntext != 1)
        return cli_fail_msg("tokenize", "usage: kiln tokenize MODEL_OR_TOKENIZER [--json] [--no-bos] [--no-special] [--] TEXT");
    char *owned = NULL;
    size_t len = strlen(text);
    if (!strcmp(text, "-")) {
        owned = read_all(stdin, &len);
        if (!owned) return cli_fail_msg("tokenize", "cannot read standard input");
        text = owned;
    }
    kiln_tokenizer *t;
    kiln_status st = kiln_tokenizer_load(path, &t);
    if (st) { free(owned); return cli_fail_status("tokenize", st); }
    int32_t *ids = NULL;
    size_t n = 0;
    st = kiln_tokenizer_encode(t, text, len, bos, special, &ids, &n);
    if (st) { kiln_tokenizer_free(t); free(owned); return cli_fail_status("tokenize", st); }
    if (json) {
        printf("{\"ids\": [");
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("], \"tokens\": [");
        for (size_t i = 0; i < n; i++) {
            const char *tok = kiln_tokenizer_token(t, ids[i]);
            printf("%s\"", i ? ", " : "");
            if (tok) put_escaped(stdout, tok, strlen(tok), 1);
            printf("\"");
        }
        printf("], \"pieces\": [");
        for (size_t i = 0; i < n; i++) {
            size_t pl = 0;
            const char *p = kiln_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &pl);
            printf("%s\"", i ? ", " : "");
            if (p) put_escaped(stdout, p, pl, 1);
            printf("\"");
        }
        printf("], \"text\": \"");
        put_escaped(stdout, text, len, 1);
        printf("\"}\n");
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t pl = 0;
            const char *p = kiln_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &pl);
            printf("%d\t", ids[i]);
            if (p) put_escaped(stdout, p, pl, 0);
            printf("\n");
        }
        printf("%zu tokens\n", n);
    }
    free(ids);
    kiln_tokenizer_free(t);
    free(owned);
    return 0;
}

/* ---- chat-template ---------------------------------------------------------------------------------- */
static char *dump_or_null(json_t *j) { return j && !json_is_null(j) ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL; }

static int chat_batch(const char *path) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kiln chat-template: error: cannot open %s: %s\n", path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    while ((got = getline(&line, &cap, f)) > 0) {
        lineno++;
        json_error_t e;
        json_t *req = json_loadb(line, (size_t)got, 0, &e), *res;
        if (!json_is_object(req)) {
            res = json_pack("{s:b, s:s+}", "ok", 0, "error", "batch line is not a JSON object: ", e.text);
        } else {
            json_t *agp = json_object_get(req, "add_generation_prompt");
            char *msgs = dump_or_null(json_object_get(req, "messages")), *tools = dump_or_null(json_object_get(req, "tools"));
            char *extra = dump_or_null(json_object_get(req, "extra")), *out = NULL;
            kiln_status st = kiln_chat_render_path(json_string_value(json_object_get(req, "path")),
                                                   json_string_value(json_object_get(req, "template")), msgs ? msgs : "[]",
                                                   tools, agp ? json_is_true(agp) : 1, extra, &out);
            if (st == KILN_OK) res = json_pack("{s:b, s:s}", "ok", 1, "text", out);
            else res = json_pack("{s:b, s:s}", "ok", 0, "error", kiln_last_error());
            free(out);
            free(msgs);
            free(tools);
            free(extra);
        }
        char *s = res ? json_dumps(res, JSON_COMPACT) : NULL;
        printf("%s\n", s ? s : "{\"ok\": false, \"error\": \"out of memory\"}");
        free(s);
        json_decref(res);
        json_decref(req);
    }
    free(line);
    if (f != stdin) fclose(f);
    fflush(stdout);
    return 0;
}

int cmd_chat_template(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--batch")) return chat_batch(argv[2]);
    args_t a = {argc, argv, 0, "chat-template", 0};
    const char *model = NULL, *messages = NULL, *tools = NULL, *tmpl = NULL, *extra_file = NULL;
    int gen = 1;
    const char *vars[64];
    int nvars = 0;
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        if (!strcmp(s, "--messages")) messages = cli_value(&a);
        else if (!strcmp(s, "--tools")) tools = cli_value(&a);
        else if (!strcmp(s, "--template")) tmpl = cli_value(&a);
        else if (!strcmp(s, "--extra")) extra_file = cli_value(&a);
        else if (!strcmp(s, "--no-generation-prompt")) gen = 0;
        else if (!strcmp(s, "--var")) {
            const char *v = cli_value(&a);
            if (v && nvars < 64) vars[nvars++] = v;
        } else if (s[0] == '-' && s[1] == '-') {
            fprintf(stderr, "kiln chat-template: error: unknown option '%s'\n", s);
            return 2;
        } else if (!model) model = s;
        else return cli_fail_msg("chat-template", "more than one MODEL given");
        if (a.bad) return 2;
    }
    if (!model || !messages)
        return cli_fail_msg("chat-template", "usage: kiln chat-template MODEL --messages FILE.json [--tools FILE.json] "
                                             "[--no-generation-prompt] [--template FILE] [--var NAME=JSON] [--extra FILE.json]");
    char *msg = read_path(messages, NULL), *tl = tools ? read_path(tools, NULL) : NULL;
    char *extra = extra_file ? read_path(extra_file, NULL) : NULL;
    int rc = 0;
    if (!msg || (tools && !tl) || (extra_file && !extra)) {
        fprintf(stderr, "kiln chat-template: error: cannot read %s: %s\n",
                !msg ? messages : (tools && !tl) ? tools : extra_file, strerror(errno));
        rc = 1;
        goto out;
    }
    if (nvars) { /* --var NAME=JSON pairs appended to the extra object */
        size_t cap = (extra ? strlen(extra) : 0) + 64;
        for (int i = 0; i < nvars; i++) cap += strlen(vars[i]) * 2 + 8;
        char *obj = malloc(cap), *p = obj;
        p += sprintf(p, "{");
        int first = 1;
        if (extra) { /* merge: strip the outer braces of the file's object */
            char *l = strchr(extra, '{'), *r = strrchr(extra, '}');
            if (!l || !r || r < l) {
                rc = cli_fail_msg("chat-template", "--extra: expected a JSON object");
                free(obj);
                goto out;
            }
            *r = 0;
            const char *body = l + 1;
            while (*body == ' ' || *body == '\n' || *body == '\t' || *body == '\r') body++;
            if (*body) { p += sprintf(p, "%s", body); first = 0; }
        }
        for (int i = 0; i < nvars; i++) {
            const char *eq = strchr(vars[i], '=');
            if (!eq || eq == vars[i]) {
                rc = cli_fail_msg("chat-template", "--var expects NAME=JSON (e.g. enable_thinking=false)");
                free(obj);
                goto out;
            }
            p += sprintf(p, "%s\"%.*s\": %s", first ? "" : ", ", (int)(eq - vars[i]), vars[i], eq + 1);
            first = 0;
        }
        sprintf(p, "}");
        free(extra);
        extra = obj;
    }
    char *out = NULL;
    kiln_status st = kiln_chat_render_path(model, tmpl, msg, tl, gen, extra, &out);
    if (st) {
        rc = cli_fail_status("chat-template", st);
        goto out;
    }
    fwrite(out, 1, strlen(out), stdout);
    fflush(stdout);
    free(out);
out:
    free(msg);
    free(tl);
    free(extra);
    return rc;
}

/* ---- bench --tokenizer ---------------------------------------------------------------------------------- */
static const char *shared_dir(void) {
    const char *s = getenv("SHARED");
    return s && *s ? s : "../shared";
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* scripts/hf_tokenize.mjs: beside the repository the binary was built in, or the working directory */
static int find_script(char *buf, size_t cap) {
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *root = getenv("KILN_ROOT");
    if (root && *root) {
        snprintf(buf, cap, "%s/scripts/hf_tokenize.mjs", root);
        if (exists(buf)) return 1;
    }
    if (k > 0) {
        exe[k] = 0;
        for (int up = 0; up < 4; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = 0;
            snprintf(buf, cap, "%s/scripts/hf_tokenize.mjs", exe);
            if (exists(buf)) return 1;
        }
    }
    snprintf(buf, cap, "scripts/hf_tokenize.mjs");
    return exists(buf);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cmd_bench_tokenizer(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    const char *tok_path = NULL, *text_path = NULL;
    double seconds = 2;
    int npm = 1, json = 0;
    char deftok[1024], deftext[1024];
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        if (!strcmp(s, "--tokenizer")) {
            if (a.i + 1 < argc && argv[a.i + 1][0] != '-') tok_path = argv[++a.i];
        } else if (!strcmp(s, "--text")) text_path = cli_value(&a);
        else if (!strcmp(s, "--seconds")) cli_float(&a, "--seconds", cli_value(&a), 0.05, 600, &seconds);
        else if (!strcmp(s, "--no-npm")) npm = 0;
        else if (!strcmp(s, "--json")) json = 1;
        else {
            fprintf(stderr, "kiln bench --tokenizer: error: unknown argument '%s'\n", s);
            return 2;
        }
        if (a.bad) return 2;
    }
    if (!tok_path) {
        snprintf(deftok, sizeof deftok, "%s/tokenizers/deepseek-v3/tokenizer.json", shared_dir());
        tok_path = deftok;
    }
    if (!text_path) {
        snprintf(deftext, sizeof deftext, "%s/data/wikitext-2-raw/wiki.test.raw", shared_dir());
        text_path = deftext;
    }
    size_t len;
    char *text = read_path(text_path, &len);
    if (!text) {
        fprintf(stderr, "kiln bench --tokenizer: error: cannot read %s: %s\n", text_path, strerror(errno));
        return 1;
    }
    kiln_tokenizer *t;
    double t0 = now_s();
    kiln_status st = kiln_tokenizer_load(tok_path, &t);
    double load_s = now_s() - t0;
    if (st) { free(text); return cli_fail_status("bench", st); }
    /* one warm-up pass, then whole-text passes for about `seconds`; one thread */
    int32_t *ids = NULL;
    size_t n = 0;
    if ((st = kiln_tokenizer_encode(t, text, len, 0, 1, &ids, &n))) { free(text); kiln_tokenizer_free(t); return cli_fail_status("bench", st); }
    free(ids);
    int runs = 0;
    double dt;
    t0 = now_s();
    do {
        if ((st = kiln_tokenizer_encode(t, text, len, 0, 1, &ids, &n))) { free(text); kiln_tokenizer_free(t); return cli_fail_status("bench", st); }
        free(ids);
        runs++;
        dt = now_s() - t0;
    } while (dt < seconds);
    double per = dt / runs, mbs = (double)len / per / 1e6;
    kiln_tokenizer_free(t);
    free(text);

    /* the npm implementation on the same file, same machine, now */
    double npm_mbs = -1;
    size_t npm_tokens = 0;
    char npm_err[4400] = "";
    if (npm) {
        char script[4200], dir[1024];
        const char *slash = strrchr(tok_path, '/');
        struct stat sb;
        if (stat(tok_path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(dir, sizeof dir, "%s", tok_path);
        else snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - tok_path) : 1, slash ? tok_path : ".");
        if (!find_script(script, sizeof script)) {
            snprintf(npm_err, sizeof npm_err, "scripts/hf_tokenize.mjs not found (set KILN_ROOT)");
        } else {
            int pfd[2];
            char secs[32];
            snprintf(secs, sizeof secs, "%g", seconds);
            if (pipe(pfd) == 0) {
                pid_t pid = fork();
                if (pid == 0) {
                    dup2(pfd[1], 1);
                    close(pfd[0]);
                    close(pfd[1]);
                    execlp("node", "node", script, dir, "--bench", text_path, secs, (char *)NULL);
                    _exit(127);
                }
                close(pfd[1]);
                FILE *f = fdopen(pfd[0], "r");
                char line[1024] = "";
                size_t got = f ? fread(line, 1, sizeof line - 1, f) : 0;
                line[got] = 0;
                if (f) fclose(f);
                int status = 0;
                if (pid > 0) waitpid(pid, &status, 0);
                const char *m = strstr(line, "\"mb_per_s\":"), *tk = strstr(line, "\"tokens\":");
                if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && m) {
                    npm_mbs = strtod(m + 11, NULL);
                    if (tk) npm_tokens = (size_t)strtoull(tk + 9, NULL, 10);
                } else {
                    snprintf(npm_err, sizeof npm_err, "node %s failed (exit %d; is node installed and `npm ci` run?)",
                             script, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
                }
            }
        }
    }
    if (json) {
        printf("{\"tokenizer\": \"%s\", \"text\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.3f, "
               "\"kiln_mb_per_s\": %.3f", tok_path, text_path, len, n, load_s, mbs);
        if (npm_mbs >= 0) printf(", \"npm_mb_per_s\": %.3f, \"npm_tokens\": %zu", npm_mbs, npm_tokens);
        printf("}\n");
    } else {
        printf("tokenizer: %s (loaded in %.2f s)\ntext: %s (%zu bytes, %zu tokens)\n", tok_path, load_s, text_path, len, n);
        printf("kiln (C, 1 thread):                 %8.2f MB/s  (%d passes)\n", mbs, runs);
        if (npm_mbs >= 0) {
            printf("npm @huggingface/tokenizers (node): %8.2f MB/s  (%zu tokens)\n", npm_mbs, npm_tokens);
            printf("kiln / npm: %.1fx\n", mbs / npm_mbs);
        } else if (npm) {
            printf("npm @huggingface/tokenizers: not run: %s\n", npm_err);
        }
    }
    return 0;
}
