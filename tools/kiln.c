/* kiln.c — the one binary: the subcommand table, and run / inspect / convert / mkmodel. Other
 * subcommands live in tools/cmd_*.c. Uses only the public API in kiln.h. Every error is one line
 * on stderr and a non-zero exit. */
#include "kiln_test.h"
#include "cli.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- run ---------------------------------------------------------------------------------------- */
/* Streams generated token `tok` (the generated-th) to stdout: its text, or its id for models
 * without a tokenizer. */
static void print_token(const kiln_model *m, const kiln_model_info *info, int32_t prev, int32_t tok, long generated) {
    if (info->has_tokenizer) {
        size_t len;
        const char *p = kiln_token_piece(m, prev, tok, &len);
        if (p) fwrite(p, 1, len, stdout);
    } else {
        printf("%s%d", generated > 1 ? "," : "", tok);
    }
    fflush(stdout);
}

/* kiln run --spec's output hooks (kiln_spec_generate): the tokens printed as they come, the logits
 * rows and MTP draft rows to the --dump-logits / --dump-draft-logits files. */
typedef struct {
    const kiln_model *m;
    const kiln_model_info *info;
    int32_t prev;
    FILE *dump, *draft_dump;
    int V;
} run_out;
static void run_token(void *ud, int32_t tok, long generated) {
    run_out *o = ud;
    print_token(o->m, o->info, o->prev, tok, generated);
    o->prev = tok;
}
static int run_rows(void *ud, const float *rows, int n) {
    const run_out *o = ud;
    return fwrite(rows, sizeof(float), (size_t)n * (size_t)o->V, o->dump) != (size_t)n * (size_t)o->V;
}
static kiln_status run_share(void *ud, int32_t *vals, int n) {
    (void)ud;
    kiln_status st = kiln_dist_bcast_i32(vals, n);
    if (st == KILN_OK && kiln_dist_failed()) st = KILN_ERR_INTERNAL; /* a lost rank: the step's sums were wrong */
    return st;
}
static int run_draft_rows(void *ud, const float *rows, int n) {
    const run_out *o = ud;
    return fwrite(rows, sizeof(float), (size_t)n * (size_t)o->V, o->draft_dump) != (size_t)n * (size_t)o->V;
}

int cmd_run(int argc, char **argv) {
    args_t a = {argc, argv, 0, "run", 0};
    kiln_options o;
    kiln_options_default(&o);
    kiln_sampling sp;
    kiln_sampling_default(&sp);
    const char *model_path = NULL, *prompt = NULL, *tokens_arg = NULL, *dump_path = NULL, *draft_dump_path = NULL;
    long n_gen = 256, tp = 1, ep = 1, spec_k = 4, spec_n = 3;
    int spec = 0; /* --spec ngram (1): prompt lookup; --spec mtp (2): the model's MTP layer (docs/SPECULATIVE.md) */
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        long lv;
        double dv;
        if (cli_common_option(&a, &o)) continue;
        if (strcmp(k, "-p") == 0 || strcmp(k, "--prompt") == 0) prompt = cli_value(&a);
        else if (strcmp(k, "-n") == 0) cli_long(&a, k, cli_value(&a), 0, 1 << 24, &n_gen);
        else if (strcmp(k, "--temp") == 0) { if (cli_float(&a, k, cli_value(&a), 0, 100, &dv)) sp.temperature = (float)dv; }
        else if (strcmp(k, "--top-k") == 0) { if (cli_long(&a, k, cli_value(&a), 0, 1 << 24, &lv)) sp.top_k = (int)lv; }
        else if (strcmp(k, "--top-p") == 0) { if (cli_float(&a, k, cli_value(&a), 1e-9, 1, &dv)) sp.top_p = (float)dv; }
        else if (strcmp(k, "--min-p") == 0) { if (cli_float(&a, k, cli_value(&a), 0, 1, &dv)) sp.min_p = (float)dv; }
        else if (strcmp(k, "--seed") == 0) { if (cli_long(&a, k, cli_value(&a), 0, 0x7fffffffL, &lv)) sp.seed = (uint64_t)lv; }
        /* penalties with the server's (OpenAI / vLLM) semantics and ranges: docs/SERVER.md */
        else if (strcmp(k, "--presence-penalty") == 0) { if (cli_float(&a, k, cli_value(&a), -2, 2, &dv)) sp.presence_penalty = (float)dv; }
        else if (strcmp(k, "--frequency-penalty") == 0) { if (cli_float(&a, k, cli_value(&a), -2, 2, &dv)) sp.frequency_penalty = (float)dv; }
        else if (strcmp(k, "--repeat-penalty") == 0 || strcmp(k, "--repetition-penalty") == 0) {
            if (cli_float(&a, k, cli_value(&a), 1e-6, 1e6, &dv)) sp.repetition_penalty = (float)dv;
        }
        else if (strcmp(k, "--tokens") == 0) tokens_arg = cli_value(&a);
        else if (strcmp(k, "--dump-logits") == 0) dump_path = cli_value(&a);
        else if (strcmp(k, "--spec") == 0) {
            const char *v = cli_value(&a);
            if (v && strcmp(v, "ngram") == 0) spec = 1;
            else if (v && strcmp(v, "mtp") == 0) spec = 2;
            else if (v && strcmp(v, "off") == 0) spec = 0;
            else if (v) { fprintf(stderr, "kiln run: error: option --spec: '%s' is not one of mtp, ngram, off\n", v); return 2; }
        }
        else if (strcmp(k, "--dump-draft-logits") == 0) draft_dump_path = cli_value(&a); /* --spec mtp: each draft step's MTP logits */
        else if (strcmp(k, "--spec-k") == 0) cli_long(&a, k, cli_value(&a), 1, 16, &spec_k);
        else if (strcmp(k, "--spec-ngram") == 0) cli_long(&a, k, cli_value(&a), 1, 16, &spec_n);
        else if (strcmp(k, "--tp") == 0) cli_long(&a, k, cli_value(&a), 1, 1024, &tp); /* tensor parallel over mpirun's ranks (docs/SCALE.md) */
        else if (strcmp(k, "--ep") == 0) cli_long(&a, k, cli_value(&a), 1, 1024, &ep); /* expert parallel over the same ranks */
        else if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln run: error: unknown option '%s'\n", k); return 2; }
        else if (!model_path) model_path = k;
        else { fprintf(stderr, "kiln run: error: unexpected argument '%s'\n", k); return 2; }
    }
    if (a.bad) return 2;
    if (!model_path) return cli_fail_msg("run", "usage: kiln run MODEL [-p PROMPT | --tokens ID,...] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--presence-penalty X] [--frequency-penalty X] [--repeat-penalty X] [--threads N] [--no-repack] [--dump-logits FILE] [--kv-dtype auto|f32|bf16|fp8] [--kv-mem SIZE] [--kv-integrity off|detect|heal|strict] [--inject-kv-faults SPEC] [--tp N under mpirun -np N] [--ep 1|N] [--spec mtp|ngram|off] [--spec-k K] [--spec-ngram N] [--dump-draft-logits FILE]");
    if (prompt && tokens_arg) return cli_fail_msg("run", "give either -p or --tokens, not both");
    if (ep > 1 && tp < 2) return cli_fail_msg("run", "--ep spreads the experts over the --tp ranks: give --tp N (under mpirun -np N) as well");

    kiln_model *m;
    kiln_status st;
    /* --tp N under `mpirun -np N`: every rank loads the model and keeps its shard; rank 0 samples,
     * prints and broadcasts each token; the others compute silently */
    int rank = 0;
    if (tp > 1) {
        int trc = cli_tp_load("run", &argc, &argv, tp, ep, model_path, &o, &m, &rank);
        if (trc) return trc;
        /* (the other ranks write no file but ask for the same logits rows: with a
         * vocabulary-parallel head every rank computes its columns of rank 0's rows) */
        if (rank > 0 && dump_path) dump_path = "/dev/null";
        if (rank > 0 && draft_dump_path) draft_dump_path = "/dev/null"; /* rank 0 writes the file */
    } else if ((st = kiln_model_load(model_path, &o, &m))) return cli_fail_status("run", st);
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
        if (!cli_ids(&b, tokens_arg, &ids, &n_prompt)) { rc = 2; goto out; }
    } else {
        if (!info.has_tokenizer) { rc = cli_fail_msg("run", "the model has no tokenizer files: give the prompt as ids with --tokens"); goto out; }
        const char *text = prompt ? prompt : "";
        size_t cap = strlen(text) + 8, n = 0;
        ids = malloc(cap * sizeof *ids);
        st = kiln_tokenize(m, text, strlen(text), 1, ids, cap, &n);
        if (st) { rc = cli_fail_status("run", st); goto out; }
        if (n == 0) { rc = cli_fail_msg("run", "the model has no BOS token and the prompt is empty"); goto out; }
        n_prompt = (int)n;
    }
    if ((st = kiln_session_create(m, &o, &s)) || (st = kiln_sampler_create(&sp, info.vocab_size, &smp)) ||
        (st = kiln_sampler_prompt(smp, ids, (size_t)n_prompt))) { /* the prompt: repetition penalty */
        rc = cli_fail_status("run", st);
        goto out;
    }
    if (dump_path && !(dump = fopen(dump_path, "wb"))) { rc = cli_fail_msg("run", "cannot create the --dump-logits file"); goto out; }
    if (spec == 2 && (st = kiln_session_spec_mtp(s))) { rc = cli_fail_status("run", st); goto out; }
    FILE *draft_dump = NULL;
    if (draft_dump_path && !(draft_dump = fopen(draft_dump_path, "wb"))) { rc = cli_fail_msg("run", "cannot create the --dump-draft-logits file"); goto out; }

    /* Echo the prompt (without BOS) like llama2.c's run.c does, then stream the generated text.
     * Tokenizers without BOS (Qwen, GPT-2) echo from the first token. */
    if (info.has_tokenizer)
        for (int i = ids[0] == info.bos_id ? 1 : 0; i < n_prompt; i++) {
            size_t len;
            const char *p = kiln_token_piece(m, i ? ids[i - 1] : -1, ids[i], &len);
            if (p) fwrite(p, 1, len, stdout);
        }
    fflush(stdout);
    double t0 = kiln_now();
    if (dump) plog = malloc((size_t)n_prompt * (size_t)info.vocab_size * sizeof *plog);
    if ((st = kiln_session_eval(s, ids, n_prompt, plog))) { rc = cli_fail_status("run", st); goto out; }
    if (dump && fwrite(plog, sizeof *plog, (size_t)n_prompt * (size_t)info.vocab_size, dump) != (size_t)n_prompt * (size_t)info.vocab_size) {
        rc = cli_fail_msg("run", "write to the --dump-logits file failed"); goto out;
    }
    double t1 = kiln_now();
    int32_t prev = ids[n_prompt - 1];
    long generated = 0;
    long drafted = 0, accepted = 0, verifies = 0;
    /* One loop for plain and speculative decoding (kiln_spec_generate; KILN_DRAFT_NONE: no drafts).
     * Speculation keeps the output distribution exactly (greedy: the same tokens; sampling: the
     * rejection rule of kiln_sample_verify, drafts checked one by one so the penalties' state follows
     * every accepted token). Under --tp every rank drafts (prompt lookup) and evaluates alike, rank
     * 0 samples and broadcasts its decisions (kiln_spec_hooks.share). */
    {
        run_out ro = {m, &info, prev, dump, draft_dump, info.vocab_size};
        const kiln_spec_hooks hooks = {&ro, run_token, dump ? run_rows : NULL, draft_dump ? run_draft_rows : NULL, tp > 1 ? run_share : NULL, rank != 0};
        const kiln_spec_cfg cfg = {spec == 2 ? KILN_DRAFT_MTP : spec == 1 ? KILN_DRAFT_NGRAM : KILN_DRAFT_NONE, (int)spec_k, (int)spec_n,
                                   info.vocab_size, NULL, 0};
        kiln_spec_stats ss;
        st = kiln_spec_generate(s, smp, &info, ids, n_prompt, n_gen, &cfg, &hooks, &ss);
        generated = ss.generated, drafted = ss.drafted, accepted = ss.accepted, verifies = ss.verifies;
        if (draft_dump) fclose(draft_dump);
        draft_dump = NULL;
        if (st) { rc = tp > 1 && kiln_dist_failed() ? cli_fail_msg("run", kiln_dist_failure()) : cli_fail_status("run", st); goto out; }
    }
    double t2 = kiln_now();
    printf("\n");
    fflush(stdout);
    if (rank == 0)
    fprintf(stderr, "prompt: %d tokens, %.1f tokens/s | decode: %ld tokens, %.1f tokens/s\n", n_prompt,
            n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), generated, generated > 1 ? (generated - 1) / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0);
    if (tp > 1 && rank == 0) { /* the communication share of this rank's run (docs/SCALE.md) */
        double secs;
        unsigned long long calls, bytes;
        kiln_dist_stats(&secs, &calls, &bytes);
        fprintf(stderr, "tensor parallel: %ld ranks, %llu all-reduces of %.1f KiB each, %.3f s in MPI_Allreduce = %.1f%% of prompt + decode time\n", tp,
                calls, calls ? (double)bytes / (double)calls / 1024.0 : 0.0, secs, t2 - t0 > 0 ? 100.0 * secs / (t2 - t0) : 0.0);
    }
    if (spec && rank == 0)
        fprintf(stderr, "speculation: %s (%s%ld, k = %ld): %ld drafted, %ld accepted (%.0f%%), %.2f tokens per forward\n", spec == 2 ? "mtp" : "ngram",
                spec == 2 ? "layer " : "n <= ", spec == 2 ? 0L : spec_n, spec_k, drafted,
                accepted, drafted ? 100.0 * (double)accepted / (double)drafted : 0.0, verifies ? (double)(accepted + verifies) / (double)verifies : 0.0);
    if (rank == 0) { /* KV integrity counters (issue 5) */
        kiln_kv_integrity_stats is;
        kiln_session_kv_integrity(s, &is);
        cli_print_integrity(stderr, &is);
    }
out:
    if (dump && fclose(dump) != 0 && rc == 0) rc = cli_fail_msg("run", "closing the --dump-logits file failed");
    free(plog);
    free(ids);
    kiln_sampler_free(smp);
    kiln_session_free(s);
    kiln_model_free(m);
    kiln_dist_finalize();
    return rc;
}

/* ---- inspect / convert / mkmodel ----------------------------------------------------------------- */
int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--devices") == 0) { /* the compute devices besides the CPU (--device vulkan:N) */
            printf("cpu  the host CPU (--device cpu; --device ref: its scalar reference kernels)\n");
            kiln_status st = kiln_list_devices(stdout);
            return st ? cli_fail_status("inspect", st) : 0;
        }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else if (argv[i][0] == '-') { fprintf(stderr, "kiln inspect: error: unknown option '%s'\n", argv[i]); return 2; }
        else path = argv[i];
    }
    if (!path) return cli_fail_msg("inspect", "usage: kiln inspect MODEL [--json] | kiln inspect --devices");
    kiln_options o;
    kiln_options_default(&o);
    kiln_model *m;
    kiln_status st = kiln_model_load(path, &o, &m);
    if (st) return cli_fail_status("inspect", st);
    st = kiln_model_describe(m, stdout, json);
    kiln_model_free(m);
    return st ? cli_fail_status("inspect", st) : 0;
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *fmt = NULL, *outtype = NULL, *tok_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--format") == 0 && i + 1 < argc) fmt = argv[++i];
        else if (strcmp(argv[i], "--outtype") == 0 && i + 1 < argc) outtype = argv[++i];
        else if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) tok_path = argv[++i];
        else if (argv[i][0] == '-') { fprintf(stderr, "kiln convert: error: unknown option '%s'\n", argv[i]); return 2; }
        else if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else return cli_fail_msg("convert", "too many arguments");
    }
    if (!in || !out) return cli_fail_msg("convert", "usage: kiln convert IN OUT [--format hf|gguf] [--outtype auto|q8_0|q4_0] [--tokenizer PATH]   (OUT ending in .gguf writes GGUF; --outtype: GGUF only)");
    size_t lo = strlen(out);
    int gguf = fmt ? strcmp(fmt, "gguf") == 0 : (lo > 5 && strcmp(out + lo - 5, ".gguf") == 0);
    if (fmt && !gguf && strcmp(fmt, "hf") != 0) return cli_fail_msg("convert", "option --format must be hf or gguf");
    if (outtype && !gguf) return cli_fail_msg("convert", "option --outtype applies to GGUF output only");
    kiln_options o;
    kiln_options_default(&o);
    kiln_model *m;
    kiln_status st = kiln_model_load(in, &o, &m);
    if (st) return cli_fail_status("convert", st);
    if (tok_path) { /* a tokenizer for a checkpoint without one (kiln mkmodel's): any file kiln tokenize reads */
        kiln_tokenizer *t;
        st = kiln_tokenizer_load(tok_path, &t);
        if (st == KILN_OK && (st = kiln_model_set_tokenizer(m, t)) != KILN_OK) kiln_tokenizer_free(t);
        if (st) { kiln_model_free(m); return cli_fail_status("convert", st); }
    }
    st = gguf ? kiln_model_save_gguf_as(m, out, outtype) : kiln_model_save_hf(m, out);
    kiln_model_free(m);
    if (st) return cli_fail_status("convert", st);
    fprintf(stderr, "wrote %s (%s)\n", out, gguf ? "gguf" : "hugging face directory");
    return 0;
}

int cmd_mkmodel(int argc, char **argv) {
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
                const char *v = cli_value(&a);
                if (v) {
                    size_t l = strlen(spec);
                    snprintf(spec + l, sizeof spec - l, "%s%s=%s", l ? "," : "", k + 2, v);
                }
                shape = 1;
            }
        if (shape) continue;
        if (strcmp(k, "--arch") == 0) arch = cli_value(&a);
        else if (strcmp(k, "--preset") == 0) preset = cli_value(&a);
        else if (strcmp(k, "--dtype") == 0) dtype = cli_value(&a);
        else if (strcmp(k, "--seed") == 0) cli_long(&a, k, cli_value(&a), 0, 0x7fffffffL, &seed);
        else if (k[0] == '-') { fprintf(stderr, "kiln mkmodel: error: unknown option '%s'\n", k); return 2; }
        else out = k;
    }
    if (a.bad) return 2;
    if (!out || (!preset && !spec[0]))
        return cli_fail_msg("mkmodel", "usage: kiln mkmodel --arch llama (--preset tiny|bench-500m|... | --dim D --ffn F --layers L --heads H --kv-heads K --vocab V --seq S) [--dtype f32|bf16] [--seed S] OUT");
    char full[1200];
    if (preset) snprintf(full, sizeof full, "preset=%s%s%s", preset, spec[0] ? "," : "", spec);
    else snprintf(full, sizeof full, "%s", spec);
    kiln_status st = kiln_mkmodel(arch, full, dtype, (uint64_t)seed, out);
    if (st) return cli_fail_status("mkmodel", st);
    fprintf(stderr, "wrote %s\n", out);
    return 0;
}

static int usage(void) {
    fprintf(stderr,
            "kiln — LLM inference engine\n"
            "usage: kiln <command> [options]\n"
            "  run MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--threads N] [--no-repack]\n"
            "            [--presence-penalty X] [--frequency-penalty X] [--repeat-penalty X]\n"
            "            [--tokens ID,...] [--dump-logits FILE] [--kv-dtype auto|f32|bf16|fp8] [--kv-mem SIZE]\n"
            "  inspect MODEL [--json] [--kv [--kv-dtype ...] [--kv-mem ...]] | inspect --devices\n"
            "  convert IN OUT [--format hf|gguf] [--outtype auto|q8_0|q4_0] [--tokenizer PATH]\n"
            "  mkmodel --arch ARCH (--preset NAME | shape flags) [--dtype f32|bf16] [--seed S] OUT\n"
            "  quantize IN OUT --weights fp8|int4 [--group 32|128] [--scope all|mlp|experts]\n"
            "  bench MODEL [--weights ...] [--integrity | --server | --tokenizer] [--json]\n"
            "  bench --gemv [--weights fp8,int4] [--shape 5632x2048,...] [--tokens 1,2,4] [--rounds N] [--mb N] [--json]\n"
            "  bench --attention [--kv-dtype bf16,fp8] [--ctx 4000] [--layers 16] [--kv-heads 8] [--head-dim 128] [--rows 3] [--rounds 7] [--isa ...] [--json]\n"
            "  bench MODEL --batch 1,4,16,32 [--weights ...] [--ctx 128] [--decode 16] [--json]\n"
            "  bench MODEL --spec off,ngram,oracle,wrong[,mtp] [--spec-k 1,2,4] [--weights ...] [-p TEXT | --prompt N] [--gen N] [--repeat R] [--json]\n"
            "  calibrate MODEL --data FILE\n"
            "  verify MODEL\n"
            "  serve MODEL [--host H] [--port P] ...\n"
            "  eval MODEL --task NAME[,NAME...] ...\n"
            "  tokenize MODEL_OR_TOKENIZER [--json] TEXT\n"
            "  chat-template MODEL --messages FILE.json\n");
    return 2;
}

static int has_flag(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], flag) == 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    /* OpenMP threads wait passively (sleep) between parallel regions unless the user chose otherwise.
     * (Since then the many short sections of a decode step moved to kiln's own pool, base/pool.h,
     * which spins briefly and never waits for a worker that took no work; OpenMP is left with
     * prefill, quantization and checksums, where a wake-up per region is cheap against the work.)
     * libgomp reads OMP_WAIT_POLICY once, when it is loaded, so kiln re-executes itself with the
     * variable set. Why: on shared or virtualized machines with few cores (the 2-vCPU machines kiln is
     * developed and tested on), spin-waiting threads burn the time slices the working threads need;
     * measured on bench-500m INT4 decode under load: 1.4 tokens/s spinning vs 14.8 passive.
     * Re-measured (this session, bench-500m INT4, 2 vCPUs): idle machine 94–99 tok/s passive vs
     * 97–111 with GOMP_SPINCOUNT=30000 (a futex wake-up per parallel region is the difference);
     * with one busy process beside it 55–59 passive vs 22–23 spin-then-sleep. Passive stays the
     * default because it never collapses; on a dedicated machine set GOMP_SPINCOUNT=30000 (or
     * OMP_WAIT_POLICY=active) for the extra 5–10% (docs/BENCHMARKS.md); either variable set by the
     * user is left alone (a forced passive policy would make libgomp ignore the spin count). */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0) execv("/proc/self/exe", argv);
    if (argc < 2) return usage();
    const char *c = argv[1];
    int n = argc - 1;
    char **v = argv + 1;
    if (strcmp(c, "run") == 0) return cmd_run(n, v);
    if (strcmp(c, "inspect") == 0) return has_flag(n, v, "--kv") ? cmd_inspect_kv(n, v) : cmd_inspect(n, v);
    if (strcmp(c, "convert") == 0) return cmd_convert(n, v);
    if (strcmp(c, "mkmodel") == 0) return cmd_mkmodel(n, v);
    if (strcmp(c, "quantize") == 0) return cmd_quantize(n, v);
    if (strcmp(c, "bench") == 0) {
        if (has_flag(n, v, "--kv-context")) return kv_bench(n, v); /* tools/cmd_kv.c */
        if (has_flag(n, v, "--integrity")) return cmd_bench_integrity(n, v);
        if (has_flag(n, v, "--server")) return cmd_bench_server(n, v);
        if (has_flag(n, v, "--tokenizer")) return cmd_bench_tokenizer(n, v);
        if (has_flag(n, v, "--gemv")) return cmd_bench_gemv(n, v); /* tools/cmd_bench.c */
        if (has_flag(n, v, "--attention")) return cmd_bench_attention(n, v); /* tools/cmd_bench.c */
        if (has_flag(n, v, "--batch")) return cmd_bench_batch(n, v); /* tools/cmd_bench.c */
        if (has_flag(n, v, "--spec")) return cmd_bench_spec(n, v);   /* tools/cmd_bench_spec.c */
        return cmd_bench(n, v);
    }
    if (strcmp(c, "calibrate") == 0) return cmd_calibrate(n, v);
    if (strcmp(c, "verify") == 0) return cmd_verify(n, v);
    if (strcmp(c, "serve") == 0) return cmd_serve(n, v);
    if (strcmp(c, "eval") == 0) return cmd_eval(n, v);
    if (strcmp(c, "tokenize") == 0) return cmd_tokenize(n, v);
    if (strcmp(c, "chat-template") == 0) return cmd_chat_template(n, v);
    if (strcmp(c, "-h") == 0 || strcmp(c, "--help") == 0 || strcmp(c, "help") == 0) { usage(); return 0; }
    fprintf(stderr, "kiln: error: unknown command '%s'\n", c);
    return usage();
}
