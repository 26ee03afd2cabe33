/* driver_main.c — main() for the fuzz targets built without libFuzzer (gcc, make tests / make
 * check): every file named on the command line, or found (recursively, sorted) under a directory
 * named there, is passed once to LLVMFuzzerTestOneInput. A crash or sanitizer report ends the
 * process non-zero; a clean replay prints "replayed N inputs" and exits 0. Like libFuzzer, it
 * calls LLVMFuzzerInitialize first when the target defines one. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static long replayed;
static int verbose;

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "driver: cannot open %s\n", path); return 1; }
    size_t cap = 1 << 16, n = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) { uint8_t *nb = realloc(buf, cap * 2); if (!nb) { free(buf); buf = NULL; break; } buf = nb; cap *= 2; }
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "driver: out of memory reading %s\n", path); return 1; }
    /* an exact-size copy, so ASan sees reads past the input's end */
    uint8_t *in = malloc(n ? n : 1);
    if (!in) { free(buf); return 1; }
    memcpy(in, buf, n);
    free(buf);
    if (verbose) fprintf(stderr, "driver: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(in, n);
    free(in);
    replayed++;
    return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) { fprintf(stderr, "driver: no such file or directory: %s\n", path); return 1; }
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    DIR *d = opendir(path);
    if (!d) { fprintf(stderr, "driver: cannot list %s\n", path); return 1; }
    char **names = NULL;
    size_t nn = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* ., .., .gitkeep */
        if (nn == cap) { cap = cap ? cap * 2 : 64; names = realloc(names, cap * sizeof *names); if (!names) abort(); }
        names[nn++] = strdup(e->d_name);
    }
    closedir(d);
    if (nn) qsort(names, nn, sizeof *names, cmp);
    int rc = 0;
    for (size_t i = 0; i < nn; i++) {
        size_t l = strlen(path) + strlen(names[i]) + 2;
        char *p = malloc(l);
        snprintf(p, l, "%s/%s", path, names[i]);
        rc |= run_path(p);
        free(p);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    verbose = getenv("FUZZ_VERBOSE") != NULL;
    int rc = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') continue; /* libFuzzer flags: ignored here */
        files++;
        rc |= run_path(argv[i]);
    }
    if (!files) { fprintf(stderr, "usage: %s FILE_OR_DIR...  (replays each input through the fuzz target)\n", argv[0]); return 2; }
    printf("replayed %ld inputs\n", replayed);
    return rc;
}
