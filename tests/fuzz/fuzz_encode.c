/* fuzz_encode — arbitrary text through every tokenizer shipped in ../shared (the full files, not
 * the cut-down seeds of fuzz_tokenizer): each tokenizers/NAME/tokenizer.json (+ its config),
 * every .gguf of tokenizers/gguf-vocab, the llama2.c tokenizer.bin files and tiny-dsv3's tokenizer.json.
 * Each input is encoded with special tokens read as text and as tokens; every id must lie in the
 * vocabulary and decode. The tokenizers load once per process ($SHARED, else ../shared); with none
 * found the target checks nothing and says so once. Input: the text (any bytes; invalid UTF-8 must
 * be refused cleanly). */
#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"
#include <glob.h>

#define MAX_TOKENIZERS 32
static kiln_tokenizer *toks[MAX_TOKENIZERS];
static int n_toks = -1;

static void load_one(const char *path) {
    if (n_toks >= MAX_TOKENIZERS) return;
    kiln_tokenizer *t = NULL;
    if (kiln_tok_load_path(path, &t) == KILN_OK) toks[n_toks++] = t;
    else fprintf(stderr, "fuzz_encode: %s: %s (skipped)\n", path, kiln_last_error());
}

static void load_all(void) {
    n_toks = 0;
    const char *shared = getenv("SHARED") ? getenv("SHARED") : "../shared";
    static const char *const patterns[] = {"tokenizers/*/tokenizer.json", "tokenizers/gguf-vocab/*.gguf",
                                           "models/*/tokenizer.json", "models/*/tokenizer.bin", "models/stories260K/tok512.bin"};
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        char pat[4096];
        snprintf(pat, sizeof pat, "%s/%s", shared, patterns[i]);
        glob_t g;
        if (glob(pat, 0, NULL, &g) == 0)
            for (size_t k = 0; k < g.gl_pathc; k++) load_one(g.gl_pathv[k]);
        globfree(&g);
    }
    if (n_toks == 0) fprintf(stderr, "fuzz_encode: no tokenizer found under %s: nothing is checked\n", shared);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (n_toks < 0) load_all();
    for (int k = 0; k < n_toks; k++) {
        const kiln_tokenizer *t = toks[k];
        const int vocab = kiln_tokenizer_vocab_size(t);
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (fuzz_note("encode", kiln_tokenizer_encode(t, (const char *)data, size, 1, special, &ids, &n)) == KILN_OK) {
                for (size_t i = 0; i < n; i++) {
                    if (ids[i] < 0 || ids[i] >= vocab) abort(); /* an id outside the vocabulary */
                    size_t l;
                    (void)kiln_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &l);
                }
            }
            free(ids);
        }
    }
    return 0;
}
