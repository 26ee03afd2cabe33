/* fuzz_eval — the evaluation sets' readers (src/eval/tasks.c: JSON Lines for ARC and GSM8K, RFC 4180
 * CSV for MMLU; the layout of ../shared/data) through kiln_eval_run on a small model (context 128), two examples a
 * task, 2 generated tokens for GSM8K. Input: one byte (task = b % 3: arc_easy, gsm8k, mmlu; strict
 * mode = (b / 3) % 2; shots = (b / 6) % 2), then the file's bytes: arc_easy.jsonl; gsm8k test.jsonl
 * SPLIT train.jsonl; mmlu test.csv SPLIT dev.csv (one subject). A malformed record must come back as
 * a skipped line (a warning) or, under strict, an error naming the file and line; a run that ends
 * well must give accuracies within [0, 1].
 * The model, made once at start: fuzz_common.h fuzz_small_model (stories260K from $SHARED; without
 * it a tiny llama with no tokenizer, and the text tasks fail early: the readers untested). */
#include "fuzz_common.h"

static kiln_model *model;
static kiln_options opts;
static const char *const subdirs[] = {"arc", "gsm8k", "mmlu", "mmlu/test", "mmlu/dev"}; /* in the order they are made */
static const char *const files[] = {"arc/arc_easy.jsonl", "gsm8k/test.jsonl", "gsm8k/train.jsonl", "mmlu/test/fuzz_test.csv",
                                    "mmlu/dev/fuzz_dev.csv"};

/* the data folders inside the private directory go before it (atexit runs this first) */
static void remove_data(void) {
    char p[1200];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) { snprintf(p, sizeof p, "%s/%s", fuzz_dir(), files[i]); unlink(p); }
    for (size_t i = sizeof subdirs / sizeof *subdirs; i-- > 0;) { snprintf(p, sizeof p, "%s/%s", fuzz_dir(), subdirs[i]); rmdir(p); }
}
static void no_warnings(void *ud, const char *msg) { (void)ud; (void)msg; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fuzz_options(&opts);
    opts.max_context = 128; /* (the prompts of one shot fit; longer ones take the truncation paths) */
    int trained;
    const char *dir = fuzz_small_model("fuzz_eval", &trained);
    char mp[1200];
    if (kiln_model_load(dir, &opts, &model) != KILN_OK) { fprintf(stderr, "fuzz_eval: %s: %s\n", dir, kiln_last_error()); abort(); }
    for (size_t i = 0; i < sizeof subdirs / sizeof *subdirs; i++) {
        snprintf(mp, sizeof mp, "%s/%s", fuzz_dir(), subdirs[i]); /* the data beside the model, in the private directory */
        if (mkdir(mp, 0700) != 0) abort();
    }
    atexit(remove_data);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *const tasks[] = {"arc_easy", "gsm8k", "mmlu"};
    const int task = data[0] % 3;
    fuzz_part p[2];
    fuzz_split(data + 1, size - 1, p, 2);
    fuzz_dir_file(files[0], p[0].p, p[0].n, task == 0);
    fuzz_dir_file(files[1], p[0].p, p[0].n, task == 1);
    fuzz_dir_file(files[2], p[1].p, p[1].n, task == 1);
    fuzz_dir_file(files[3], p[0].p, p[0].n, task == 2);
    fuzz_dir_file(files[4], p[1].p, p[1].n, task == 2);
    kiln_eval_params ep;
    kiln_eval_params_default(&ep);
    ep.data_dir = fuzz_dir();
    ep.limit = 2;
    ep.max_gen = 2;
    ep.strict = (data[0] / 3) % 2;
    ep.shots = (data[0] / 6) % 2;
    ep.warn = no_warnings;
    kiln_eval_metric *met = NULL;
    int n = 0;
    if (fuzz_note("eval", kiln_eval_run(model, &opts, tasks[task], &ep, &met, &n)) == KILN_OK)
        for (int i = 0; i < n; i++)
            if (strncmp(met[i].name, "acc", 3) == 0 && !(met[i].value >= 0.0 && met[i].value <= 1.0)) abort();
    free(met);
    return 0;
}
