/* fuzz_common.h — helpers shared by the libFuzzer targets in tests/fuzz/ (header-only; each
 * fuzz_*.c is its own binary).
 *
 * Inputs stay in memory: a loader that wants a path gets /proc/self/fd/N of a memfd holding the
 * bytes; loaders that want a directory (Hugging Face, llama2.c + tokenizer.bin) get one private
 * directory on tmpfs (/dev/shm when present), made once per process and removed at exit.
 * Multi-part inputs (config.json + safetensors, template + messages, ...) are split at
 * FUZZ_SPLIT, a line no real file holds (tests/fuzz/fuzz.dict lists it for the mutator). */
#ifndef KILN_TESTS_FUZZ_COMMON_H
#define KILN_TESTS_FUZZ_COMMON_H
#include "kiln.h"
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_SPLIT "\n--kiln-fuzz-split--\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct { const uint8_t *p; size_t n; } fuzz_part;

/* FUZZ_DEBUG=1: say what each stage returned (for checking that seeds get past the parsers). */
static inline kiln_status fuzz_note(const char *what, kiln_status st) {
    static int dbg = -1;
    if (dbg < 0) dbg = getenv("FUZZ_DEBUG") != NULL;
    if (dbg) fprintf(stderr, "  %s: %s%s%s\n", what, kiln_status_name(st), st == KILN_OK ? "" : ": ", st == KILN_OK ? "" : kiln_last_error());
    return st;
}

/* Splits data at FUZZ_SPLIT into at most max parts (the last takes the rest); returns the count.
 * Missing parts are empty. */
static inline int fuzz_split(const uint8_t *data, size_t size, fuzz_part *parts, int max) {
    const size_t sl = sizeof FUZZ_SPLIT - 1;
    int k = 0;
    size_t start = 0;
    for (int i = 0; i < max; i++) parts[i] = (fuzz_part){(const uint8_t *)"", 0};
    while (k < max - 1) {
        const uint8_t *hit = size - start >= sl ? memmem(data + start, size - start, FUZZ_SPLIT, sl) : NULL;
        if (!hit) break;
        parts[k++] = (fuzz_part){data + start, (size_t)(hit - (data + start))};
        start = (size_t)(hit - data) + sl;
    }
    parts[k++] = (fuzz_part){data + start, size - start};
    return k;
}

/* A NUL-terminated copy (free() it). */
static inline char *fuzz_strndup(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, p, n);
    s[n] = 0;
    return s;
}

/* A memfd holding exactly these bytes, reused across inputs (slot 0..7); *path receives
 * /proc/self/fd/N. */
static inline const char *fuzz_memfd(int slot, const void *p, size_t n) {
    static int fds[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    static char paths[8][64];
    if (fds[slot] < 0) {
        fds[slot] = memfd_create("kiln-fuzz", MFD_CLOEXEC);
        if (fds[slot] < 0) { perror("memfd_create"); abort(); }
        snprintf(paths[slot], sizeof paths[slot], "/proc/self/fd/%d", fds[slot]);
    }
    if (ftruncate(fds[slot], 0) != 0) abort();
    size_t off = 0;
    while (off < n) {
        ssize_t w = pwrite(fds[slot], (const char *)p + off, n - off, (off_t)off);
        if (w <= 0) abort();
        off += (size_t)w;
    }
    return paths[slot];
}

static char fuzz_dir_path[512];
static inline void fuzz_dir_remove(void) {
    if (!fuzz_dir_path[0]) return;
    DIR *d = opendir(fuzz_dir_path);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') { snprintf(p, sizeof p, "%s/%s", fuzz_dir_path, e->d_name); unlink(p); }
        closedir(d);
    }
    rmdir(fuzz_dir_path);
}
/* This process's private directory (empty at the first call). */
static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_path[0]) {
        struct stat st;
        const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                         : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/kiln-fuzz-XXXXXX", base);
        if (!mkdtemp(fuzz_dir_path)) { perror("mkdtemp"); abort(); }
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}
/* Writes (n > 0 or always_create) or removes dir/name. */
static inline void fuzz_dir_file(const char *name, const void *p, size_t n, int present) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    if (!present) { unlink(path); return; }
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n)) abort();
    fclose(f);
}

/* The model the request-level targets (openai, eval) load once at start: $KILN_FUZZ_MODEL when set;
 * else stories260K from $SHARED (default ../shared) linked into this process's private directory
 * (*trained = 1: a trained tokenizer, so text tokenizes); else a tiny `kiln mkmodel` llama there
 * without a tokenizer (token ids only). Returns the directory or file to load. */
static inline const char *fuzz_small_model(const char *who, int *trained) {
    struct stat st;
    *trained = 0;
    if (getenv("KILN_FUZZ_MODEL")) return getenv("KILN_FUZZ_MODEL");
    char bin[1200], tok[1200], mp[1200];
    const char *sh = getenv("SHARED") && *getenv("SHARED") ? getenv("SHARED") : "../shared";
    snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", sh);
    const char *dir = fuzz_dir();
    if (stat(bin, &st) == 0 && stat(tok, &st) == 0) {
        char abin[PATH_MAX], atok[PATH_MAX];
        if (!realpath(bin, abin) || !realpath(tok, atok)) abort();
        snprintf(mp, sizeof mp, "%s/model.bin", dir);
        if (symlink(abin, mp) != 0) abort();
        snprintf(mp, sizeof mp, "%s/tok512.bin", dir);
        if (symlink(atok, mp) != 0) abort();
        *trained = 1;
    } else if (kiln_mkmodel("llama", "dim=16,ffn=32,layers=1,heads=2,kv_heads=1,vocab=64,seq=64", "f32", 1, dir) != KILN_OK) {
        fprintf(stderr, "%s: mkmodel: %s\n", who, kiln_last_error());
        abort();
    }
    return dir;
}

/* Options for models a fuzz input made: one thread, a context of 8 tokens (the KV pool stays
 * small whatever the file claims), no start-up summary. */
static inline void fuzz_options(kiln_options *o) {
    kiln_options_default(o);
    o->threads = 1;
    o->max_context = 8;
    o->quiet = 1;
}

/* What a user does with a model that loaded: a session, two tokens through the forward pass, the
 * tokenizer on a short text and the pieces back. Errors are fine; crashes are findings. */
static inline void fuzz_exercise_model(kiln_model *m, const kiln_options *o) {
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    int32_t toks[2] = {0, info.vocab_size > 1 ? 1 : 0};
    if (info.bos_id >= 0 && info.bos_id < info.vocab_size) toks[0] = info.bos_id;
    kiln_session *s = NULL;
    if (fuzz_note("session", kiln_session_create(m, o, &s)) == KILN_OK) {
        if (fuzz_note("eval", kiln_session_eval(s, toks, 1, NULL)) == KILN_OK) (void)fuzz_note("eval", kiln_session_eval(s, toks + 1, 1, NULL));
        kiln_session_free(s);
    }
    const kiln_tokenizer *t = kiln_model_tokenizer(m);
    if (t) {
        static const char text[] = "Hello world, <s> once upon a time\n\xc3\xa9t\xc3\xa9 12345";
        int32_t *ids = NULL;
        size_t n = 0;
        if (fuzz_note("encode", kiln_tokenizer_encode(t, text, sizeof text - 1, 1, 1, &ids, &n)) == KILN_OK) {
            int32_t prev = -1;
            for (size_t i = 0; i < n; i++) { size_t l; (void)kiln_tokenizer_piece(t, prev, ids[i], &l); prev = ids[i]; }
        }
        free(ids);
    }
}
#endif
