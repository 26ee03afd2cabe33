/* kiln.c — the one binary. Subcommands: run, inspect, convert, mkmodel (more as they land).
 * Uses only the public API in kiln.h. Every error is one line on stderr and a non-zero exit. */
#include "kiln.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail_status(const char *what, kiln_status st) {
    const char *msg = kiln_last_error();
    fprintf(stderr, "kiln %s: error: %s%s%s\n", what, kiln_status_name(st), *msg ? ": " : "", msg);
    return 1;
}
static int fail_msg(const char *what, const char *msg) {
    fprintf(stderr, "kiln %s: error: %s\n", what, msg);
    return 2;
}

/* ---- argument helpers --------------------------------------------------------------------------- */
typedef struct { int argc; char **argv; int i; const char *cmd; int bad; } args_t;

static const char *arg_value(args_t *a) {
    if (a->i + 1 >= a->argc) {
        fprintf(stderr, "kiln %s: error: option %s needs a value\n", a->cmd, a->argv[a->i]);
        a->bad = 1;
        return NULL;
    }
    return a->argv[++a->i];
}

static int parse_long(args_t *a, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "kiln %s: error: option %s: '%s' is not an integer in [%ld, %ld]\n", a->cmd, opt, s ? s : "", lo, hi);
        a->bad = 1;
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_float(args_t *a, const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    double v = s ? strtod(s, &end) : 0;
    if (!s || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kiln %s: error: option %s: '%s' is not a number in [%g, %g]\n", a->cmd, opt, s ? s : "", lo, hi);
        a->bad = 1;
        return 0;
    }
    *out = v;
    return 1;
}

/* "512M", "2G", "1048576", "40%" (of available RAM). */
static int parse_mem(args_t *a, const char *s, int64_t *out) {
    char *end;
    double v = s ? strtod(s, &end) : -1;
    if (!s || end == s || v <= 0) goto bad;
    double mul = 1;
    if (*end == '%') {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (v > 100 || end[1]) goto bad;
        *out = (int64_t)((double)pages * (double)psz * v / 100.0);
        return 1;
    }
    switch (*end) {
    case 0: break;
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    default: goto bad;
    }
    if (*end == 'i' || *end == 'B' || *end == 'b') end += (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) ? 2 : 1;
    if (*end) goto bad;
    *out = (int64_t)(v * mul);
    return 1;
bad:
    fprintf(stderr, "kiln %s: error: option --kv-mem: '%s' is not a size like 512M, 2G or 40%%\n", a->cmd, s ? s : "");
    a->bad = 1;
    return 0;
}

/* Options shared by every command that builds a session. Returns 1 if argv[a->i] was consumed. */
static int common_option(args_t *a, kiln_options *o) {
    const char *k = a->argv[a->i];
    long v;
    if (strcmp(k, "--threads") == 0) { if (parse_long(a, k, arg_value(a), 0, 1024, &v)) o->threads = (int)v; return 1; }
    if (strcmp(k, "--kv-mem") == 0) { parse_mem(a, arg_value(a), &o->kv_mem_bytes); return 1; }
    if (strcmp(k, "--kv-page") == 0) { if (parse_long(a, k, arg_value(a), 1, 4096, &v)) o->kv_page_tokens = (int)v; return 1; }
    if (strcmp(k, "--ctx") == 0) { if (parse_long(a, k, arg_value(a), 1, 1 << 24, &v)) o->max_context = (int)v; return 1; }
    if (strcmp(k, "--kv-dtype") == 0) {
        const char *s = arg_value(a);
        if (!s) return 1;
        if (strcmp(s, "auto") == 0) o->kv_dtype = KILN_KV_AUTO;
        else if (strcmp(s, "f32") == 0) o->kv_dtype = KILN_KV_F32;
        else if (strcmp(s, "bf16") == 0) o->kv_dtype = KILN_KV_BF16;
        else if (strcmp(s, "fp8") == 0) o->kv_dtype = KILN_KV_FP8;
        else { fprintf(stderr, "kiln %s: error: option --kv-dtype: '%s' is not one of auto, f32, bf16, fp8\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    if (strcmp(k, "--isa") == 0) {
        const char *s = arg_value(a);
        if (!s) return 1;
        if (strcmp(s, "auto") == 0) o->isa = KILN_ISA_AUTO;
        else if (strcmp(s, "scalar") == 0) o->isa = KILN_ISA_SCALAR;
        else if (strcmp(s, "avx2") == 0) o->isa = KILN_ISA_AVX2;
        else if (strcmp(s, "avx512") == 0) o->isa = KILN_ISA_AVX512;
        else { fprintf(stderr, "kiln %s: error: option --isa: '%s' is not one of auto, scalar, avx2, avx512\n", a->cmd, s); a->bad = 1; }
        return 1;
    }
    return 0;
}

/* "1,2,3" → ids. */
static int parse_ids(args_t *a, const char *s, int32_t **ids, int *n) {
    int cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    const char *p = s;
    while (p && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "kiln %s: error: option --tokens: '%s' is not a comma-separated list of token ids\n", a->cmd, s);
            free(v);
            a->bad = 1;
            return 0;
        }
        if (k == cap) v = realloc(v, (size_t)(cap *= 2) * sizeof *v);
        v[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) { free(v); fprintf(stderr, "kiln %s: error: option --tokens: empty list\n", a->cmd); a->bad = 1; return 0; }
    *ids = v;
    *n = k;
    return 1;
}

/* ---- run ---------------------------------------------------------------------------------------- */
static int cmd_run(int argc, char **argv) {
    args_t a = {argc, argv, 0, "run", 0};
    kiln_options o;
    kiln_options_default(&o);
    kiln_sampling sp;
    kiln_sampling_default(&sp);
    const char *model_path = NULL, *prompt = NULL, *tokens_arg = NULL, *dump_path = NULL;
    long n_gen = 256;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        long lv;
        double dv;
        if (common_option(&a, &o)) continue;
        if (strcmp(k, "-p") == 0 || strcmp(k, "--prompt") == 0) prompt = arg_value(&a);
        else if (strcmp(k, "-n") == 0) parse_long(&a, k, arg_value(&a), 0, 1 << 24, &n_gen);
        else if (strcmp(k, "--temp") == 0) { if (parse_float(&a, k, arg_value(&a), 0, 100, &dv)) sp.temperature = (float)dv; }
        else if (strcmp(k, "--top-k") == 0) { if (parse_long(&a, k, arg_value(&a), 0, 1 << 24, &lv)) sp.top_k = (int)lv; }
        else if (strcmp(k, "--top-p") == 0) { if (parse_float(&a, k, arg_value(&a), 1e-9, 1, &dv)) sp.top_p = (float)dv; }
        else if (strcmp(k, "--seed") == 0) { if (parse_long(&a, k, arg_value(&a), 0, 0x7fffffffL, &lv)) sp.seed = (uint64_t)lv; }
        else if (strcmp(k, "--tokens") == 0) tokens_arg = arg_value(&a);
        else if (strcmp(k, "--dump-logits") == 0) dump_path = arg_value(&a);
        else if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln run: error: unknown option '%s'\n", k); return 2; }
        else if (!model_path) model_path = k;
        else { fprintf(stderr, "kiln run: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!model_path) return fail_msg("run", "usage: kiln run MODEL [-p PROMPT | --tokens ID,...] [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S] [--threads N] [--dump-logits FILE] [--kv-dtype auto|f32|bf16|fp8] [--kv-mem SIZE]");
    if (prompt && tokens_arg) return fail_msg("run", "give either -p or --tokens, not both");

    kiln_model *m;
    kiln_status st = kiln_model_load(model_path, &o, &m);
    if (st) return fail_status("run", st);
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    int32_t *ids = NULL;
    int n_prompt = 0, rc = 0;
    kiln_session *s = NULL;
    kiln_sampler *smp = NULL;
    FILE *dump = NULL;
    float *plog = NULL;
    if (tokens_arg) {
        args_t b = {0, NULL, 0, "run", 0};
        if (!parse_ids(&b, tokens_arg, &ids, &n_prompt)) { rc = 2; goto out; }
    } else {
        if (!info.has_tokenizer) { rc = fail_msg("run", "the model has no tokenizer files: give the prompt as ids with --tokens"); goto out; }
        const char *text = prompt ? prompt : "";
        size_t cap = strlen(text) + 8, n = 0;
        ids = malloc(cap * sizeof *ids);
        st = kiln_tokenize(m, text, strlen(text), 1, ids, cap, &n);
        if (st) { rc = fail_status("run", st); goto out; }
        if (n == 0) { rc = fail_msg("run", "the model has no BOS token and the prompt is empty"); goto out; }
        n_prompt = (int)n;
    }
    if ((st = kiln_session_create(m, &o, &s)) || (st = kiln_sampler_create(&sp, info.vocab_size, &smp))) { rc = fail_status("run", st); goto out; }
    if (dump_path && !(dump = fopen(dump_path, "wb"))) { rc = fail_msg("run", "cannot create the --dump-logits file"); goto out; }

    /* Echo the prompt (without BOS) like llama2.c's run.c does, then stream the generated text. */
    if (info.has_tokenizer)
        for (int i = 1; i < n_prompt; i++) {
            size_t len;
            const char *p = kiln_token_piece(m, ids[i - 1], ids[i], &len);
            if (p) fwrite(p, 1, len, stdout);
        }
    fflush(stdout);
    double t0 = kiln_now();
    if (dump) plog = malloc((size_t)n_prompt * (size_t)info.vocab_size * sizeof *plog);
    if ((st = kiln_session_eval(s, ids, n_prompt, plog))) { rc = fail_status("run", st); goto out; }
    if (dump && fwrite(plog, sizeof *plog, (size_t)n_prompt * (size_t)info.vocab_size, dump) != (size_t)n_prompt * (size_t)info.vocab_size) {
        rc = fail_msg("run", "write to the --dump-logits file failed"); goto out;
    }
    double t1 = kiln_now();
    int32_t prev = ids[n_prompt - 1];
    long generated = 0;
    for (; generated < n_gen; ) {
        int32_t next = kiln_sample(smp, kiln_session_logits(s));
        generated++;
        if (next == info.eos_id) break;
        if (info.has_tokenizer) {
            size_t len;
            const char *p = kiln_token_piece(m, prev, next, &len);
            if (p) { fwrite(p, 1, len, stdout); fflush(stdout); }
        } else {
            printf("%s%d", generated > 1 ? "," : "", next);
            fflush(stdout);
        }
        prev = next;
        if (generated == n_gen) break;
        if (kiln_session_length(s) >= info.max_context) break;
        if ((st = kiln_session_eval(s, &next, 1, NULL))) { rc = fail_status("run", st); goto out; }
        if (dump && fwrite(kiln_session_logits(s), sizeof(float), (size_t)info.vocab_size, dump) != (size_t)info.vocab_size) {
            rc = fail_msg("run", "write to the --dump-logits file failed"); goto out;
        }
    }
    double t2 = kiln_now();
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "prompt: %d tokens, %.1f tokens/s | decode: %ld tokens, %.1f tokens/s\n", n_prompt,
            n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), generated, generated > 1 ? (generated - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0);
out:
    if (dump && fclose(dump) != 0 && rc == 0) rc = fail_msg("run", "closing the --dump-logits file failed");
    free(plog);
    free(ids);
    kiln_sampler_free(smp);
    kiln_session_free(s);
    kiln_model_free(m);
    return rc;
}

/* ---- inspect / convert / mkmodel ----------------------------------------------------------------- */
static int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else if (argv[i][0] == '-') { fprintf(stderr, "kiln inspect: error: unknown option '%s'\n", argv[i]); return 2; }
        else path = argv[i];
    }
    if (!path) return fail_msg("inspect", "usage: kiln inspect MODEL [--json]");
    kiln_options o;
    kiln_options_default(&o);
    kiln_model *m;
    kiln_status st = kiln_model_load(path, &o, &m);
    if (st) return fail_status("inspect", st);
    st = kiln_model_describe(m, stdout, json);
    kiln_model_free(m);
    return st ? fail_status("inspect", st) : 0;
}

static int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *fmt = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--format") == 0 && i + 1 < argc) fmt = argv[++i];
        else if (argv[i][0] == '-') { fprintf(stderr, "kiln convert: error: unknown option '%s'\n", argv[i]); return 2; }
        else if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else return fail_msg("convert", "too many arguments");
    }
    if (!in || !out) return fail_msg("convert", "usage: kiln convert IN OUT [--format hf|gguf]   (OUT ending in .gguf writes GGUF)");
    size_t lo = strlen(out);
    int gguf = fmt ? strcmp(fmt, "gguf") == 0 : (lo > 5 && strcmp(out + lo - 5, ".gguf") == 0);
    if (fmt && !gguf && strcmp(fmt, "hf") != 0) return fail_msg("convert", "option --format must be hf or gguf");
    kiln_options o;
    kiln_options_default(&o);
    kiln_model *m;
    kiln_status st = kiln_model_load(in, &o, &m);
    if (st) return fail_status("convert", st);
    st = gguf ? kiln_model_save_gguf(m, out) : kiln_model_save_hf(m, out);
    kiln_model_free(m);
    if (st) return fail_status("convert", st);
    fprintf(stderr, "wrote %s (%s)\n", out, gguf ? "gguf" : "hugging face directory");
    return 0;
}

static int cmd_mkmodel(int argc, char **argv) {
    const char *arch = "llama", *preset = NULL, *dtype = "f32", *out = NULL;
    long seed = 1;
    char spec[1024] = "";
    args_t a = {argc, argv, 0, "mkmodel", 0};
    static const char *shape_flags[] = {"--dim", "--ffn", "--layers", "--heads", "--kv-heads", "--vocab", "--seq", "--head-dim", NULL};
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        int shape = 0;
        for (int j = 0; shape_flags[j]; j++)
            if (strcmp(k, shape_flags[j]) == 0) {
                const char *v = arg_value(&a);
                if (v) {
                    size_t l = strlen(spec);
                    snprintf(spec + l, sizeof spec - l, "%s%s=%s", l ? "," : "", k + 2, v);
                }
                shape = 1;
            }
        if (shape) continue;
        if (strcmp(k, "--arch") == 0) arch = arg_value(&a);
        else if (strcmp(k, "--preset") == 0) preset = arg_value(&a);
        else if (strcmp(k, "--dtype") == 0) dtype = arg_value(&a);
        else if (strcmp(k, "--seed") == 0) parse_long(&a, k, arg_value(&a), 0, 0x7fffffffL, &seed);
        else if (k[0] == '-') { fprintf(stderr, "kiln mkmodel: error: unknown option '%s'\n", k); return 2; }
        else out = k;
    }
    if (a.bad) return 2;
    if (!out || (!preset && !spec[0]))
        return fail_msg("mkmodel", "usage: kiln mkmodel --arch llama (--preset tiny|bench-500m|... | --dim D --ffn F --layers L --heads H --kv-heads K --vocab V --seq S) [--dtype f32|bf16] [--seed S] OUT");
    char full[1200];
    if (preset) snprintf(full, sizeof full, "preset=%s%s%s", preset, spec[0] ? "," : "", spec);
    else snprintf(full, sizeof full, "%s", spec);
    kiln_status st = kiln_mkmodel(arch, full, dtype, (uint64_t)seed, out);
    if (st) return fail_status("mkmodel", st);
    fprintf(stderr, "wrote %s\n", out);
    return 0;
}

static int usage(void) {
    fprintf(stderr,
            "kiln — LLM inference engine\n"
            "usage: kiln <command> [options]\n"
            "  run MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S] [--threads N]\n"
            "            [--tokens ID,...] [--dump-logits FILE] [--kv-dtype auto|f32|bf16|fp8] [--kv-mem SIZE]\n"
            "  inspect MODEL [--json]\n"
            "  convert IN OUT [--format hf|gguf]\n"
            "  mkmodel --arch llama (--preset NAME | shape flags) [--dtype f32|bf16] [--seed S] OUT\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *c = argv[1];
    if (strcmp(c, "run") == 0) return cmd_run(argc - 1, argv + 1);
    if (strcmp(c, "inspect") == 0) return cmd_inspect(argc - 1, argv + 1);
    if (strcmp(c, "convert") == 0) return cmd_convert(argc - 1, argv + 1);
    if (strcmp(c, "mkmodel") == 0) return cmd_mkmodel(argc - 1, argv + 1);
    if (strcmp(c, "-h") == 0 || strcmp(c, "--help") == 0 || strcmp(c, "help") == 0) { usage(); return 0; }
    fprintf(stderr, "kiln: error: unknown command '%s'\n", c);
    return usage();
}
