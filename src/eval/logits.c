/* logits.c — the baseline files of the kl task (`kiln eval --save-logits F` / `--baseline-logits F`).
 *
 * Layout (little-endian):
 *   0   char[8]  "KILNLGP1"
 *   8   u32      vocab
 *   12  u32      window   (tokens per window of the run that wrote it)
 *   16  u32      stride   (new tokens scored per window)
 *   20  u32      reserved (0)
 *   24  u64      n        (scored positions; written when the file is closed)
 *   32  n records: i32 target token, then f32[vocab] log-probabilities of that position.
 * The target tokens let the comparing run check that both runs scored the same text the same way. */
#include "eval/eval.h"
#include "base/status.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC "KILNLGP1"
#define HEADER 32

struct eval_logits_file {
    FILE *f;
    char *path;
    int writing;
    uint32_t vocab, window, stride;
    uint64_t n, pos;
};

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

static kiln_status write_header(eval_logits_file *f) {
    uint8_t h[HEADER] = {0};
    memcpy(h, MAGIC, 8);
    put32(h + 8, f->vocab);
    put32(h + 12, f->window);
    put32(h + 16, f->stride);
    put64(h + 24, f->n);
    if (fseek(f->f, 0, SEEK_SET) != 0 || fwrite(h, 1, HEADER, f->f) != HEADER)
        return kiln_fail(KILN_ERR_IO, "%s: cannot write the header", f->path);
    return KILN_OK;
}

static void lf_free(eval_logits_file *f) {
    if (!f) return;
    if (f->f) fclose(f->f);
    free(f->path);
    free(f);
}

kiln_status eval_logits_create(const char *path, int vocab, int window, int stride, eval_logits_file **out) {
    *out = NULL;
    eval_logits_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) { free(f); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    f->writing = 1;
    f->vocab = (uint32_t)vocab;
    f->window = (uint32_t)window;
    f->stride = (uint32_t)stride;
    if (!(f->f = fopen(path, "wb"))) { lf_free(f); return kiln_fail(KILN_ERR_IO, "%s: cannot create the logits file", path); }
    kiln_status st = write_header(f);
    if (st) { lf_free(f); return st; }
    *out = f;
    return KILN_OK;
}

kiln_status eval_logits_open(const char *path, eval_logits_file **out) {
    *out = NULL;
    eval_logits_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) { free(f); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    if (!(f->f = fopen(path, "rb"))) { lf_free(f); return kiln_fail(KILN_ERR_IO, "%s: cannot open the baseline logits file", path); }
    uint8_t h[HEADER];
    if (fread(h, 1, HEADER, f->f) != HEADER) { lf_free(f); return kiln_fail(KILN_ERR_FORMAT, "%s: truncated header (need %d bytes)", path, HEADER); }
    if (memcmp(h, MAGIC, 8) != 0) { lf_free(f); return kiln_fail(KILN_ERR_FORMAT, "%s: offset 0: bad magic (not a kiln logits file written by --save-logits)", path); }
    f->vocab = get32(h + 8);
    f->window = get32(h + 12);
    f->stride = get32(h + 16);
    f->n = get64(h + 24);
    if (f->vocab == 0 || f->vocab > (1u << 24)) { uint32_t v = f->vocab; lf_free(f); return kiln_fail(KILN_ERR_FORMAT, "%s: offset 8: vocab = %u is out of range", path, v); }
    /* The records must all be there. */
    if (fseek(f->f, 0, SEEK_END) != 0) { lf_free(f); return kiln_fail(KILN_ERR_IO, "%s: cannot seek", path); }
    long size = ftell(f->f);
    uint64_t rec = 4 + 4ull * f->vocab;
    if (size < HEADER || f->n > ((uint64_t)size - HEADER) / rec) {
        lf_free(f);
        return kiln_fail(KILN_ERR_FORMAT, "%s: offset 24: n = %llu records of %llu bytes do not fit in the %ld-byte file", path,
                         (unsigned long long)get64(h + 24), (unsigned long long)rec, size);
    }
    fseek(f->f, HEADER, SEEK_SET);
    *out = f;
    return KILN_OK;
}

void eval_logits_info(const eval_logits_file *f, int *vocab, int *window, int *stride, int64_t *n) {
    *vocab = (int)f->vocab;
    *window = (int)f->window;
    *stride = (int)f->stride;
    *n = (int64_t)f->n;
}

kiln_status eval_logits_write(eval_logits_file *f, int32_t target, const float *logp) {
    uint8_t t[4];
    put32(t, (uint32_t)target);
    /* Rows are written in the host's float layout: kiln's targets are little-endian. */
    if (fwrite(t, 1, 4, f->f) != 4 || fwrite(logp, sizeof *logp, f->vocab, f->f) != f->vocab)
        return kiln_fail(KILN_ERR_IO, "%s: write failed at record %llu", f->path, (unsigned long long)f->n);
    f->n++;
    return KILN_OK;
}

kiln_status eval_logits_read(eval_logits_file *f, int32_t *target, float *logp) {
    if (f->pos >= f->n) return kiln_fail(KILN_ERR_FORMAT, "%s: only %llu positions stored", f->path, (unsigned long long)f->n);
    uint8_t t[4];
    if (fread(t, 1, 4, f->f) != 4 || fread(logp, sizeof *logp, f->vocab, f->f) != f->vocab)
        return kiln_fail(KILN_ERR_FORMAT, "%s: truncated at record %llu", f->path, (unsigned long long)f->pos);
    *target = (int32_t)get32(t);
    f->pos++;
    return KILN_OK;
}

kiln_status eval_logits_close(eval_logits_file *f) {
    if (!f) return KILN_OK;
    kiln_status st = KILN_OK;
    if (f->writing) {
        st = write_header(f);
        if (fflush(f->f) != 0 && !st) st = kiln_fail(KILN_ERR_IO, "%s: write failed", f->path);
        if (fclose(f->f) != 0 && !st) st = kiln_fail(KILN_ERR_IO, "%s: closing failed", f->path);
        f->f = NULL;
    }
    lf_free(f);
    return st;
}
