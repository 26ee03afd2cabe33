/* checksum.c — weight integrity: an XXH3-64 checksum per tensor computed at load, re-checked on
 * demand (kiln_model_check_weights, used by `serve`'s periodic check) and compared with a manifest
 * file (`kiln verify`). */
#include "model/model.h"
#include "base/status.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

void kiln_model_compute_checksums(struct kiln_model *m) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < m->tt.n; i++) m->tt.v[i].checksum = XXH3_64bits(m->tt.v[i].data, m->tt.v[i].nbytes);
}

int kiln_model_note_copy(struct kiln_model *m, const char *name, const void *data, size_t nbytes) {
    if (m->n_copies == m->cap_copies) {
        int cap = m->cap_copies ? 2 * m->cap_copies : 64;
        struct kiln_checked_copy *c = realloc(m->copies, sizeof *c * (size_t)cap);
        if (!c) return -1;
        m->copies = c;
        m->cap_copies = cap;
    }
    struct kiln_checked_copy *c = &m->copies[m->n_copies++];
    c->data = data;
    c->nbytes = nbytes;
    c->checksum = XXH3_64bits(data, nbytes);
    snprintf(c->name, sizeof c->name, "%s", name);
    return 0;
}

kiln_status kiln_model_check_weights(const kiln_model *m) {
    for (int i = 0; i < m->n_copies; i++) /* the bytes the kernels actually read (repacked FP8/INT4) */
        if (XXH3_64bits(m->copies[i].data, m->copies[i].nbytes) != m->copies[i].checksum)
            return kiln_fail(KILN_ERR_INTEGRITY, "%s: the in-memory tile-layout copy of '%s' no longer matches its checksum %016llx (weights corrupted in memory)",
                             m->path, m->copies[i].name, (unsigned long long)m->copies[i].checksum);
    int bad = -1;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < m->tt.n; i++)
        if (XXH3_64bits(m->tt.v[i].data, m->tt.v[i].nbytes) != m->tt.v[i].checksum) {
            #pragma omp critical
            if (bad < 0 || i < bad) bad = i;
        }
    if (bad >= 0)
        return kiln_fail(KILN_ERR_INTEGRITY, "%s: tensor '%s' no longer matches its load-time checksum %016llx (weights corrupted in memory or on disk)",
                         m->tt.v[bad].file ? m->tt.v[bad].file : m->path, m->tt.v[bad].name, (unsigned long long)m->tt.v[bad].checksum);
    return KILN_OK;
}

static void manifest_path(const kiln_model *m, char *out, size_t cap) {
    struct stat st;
    if (stat(m->path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(out, cap, "%s/kiln.checksums.json", m->path);
    else snprintf(out, cap, "%s.checksums.json", m->path);
}

kiln_status kiln_model_verify(const kiln_model *m, int write_manifest, FILE *report, int *n_bad) {
    char path[4200];
    manifest_path(m, path, sizeof path);
    *n_bad = 0;
    if (write_manifest) {
        json_t *root = json_object(), *ts = json_object();
        json_object_set_new(root, "algorithm", json_string("xxh3-64"));
        for (int i = 0; i < m->tt.n; i++) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)m->tt.v[i].checksum);
            json_object_set_new(ts, m->tt.v[i].name, json_string(hex));
        }
        json_object_set_new(root, "tensors", ts);
        int r = json_dump_file(root, path, JSON_INDENT(1) | JSON_SORT_KEYS);
        json_decref(root);
        if (r) return kiln_fail(KILN_ERR_IO, "%s: cannot write the checksum manifest", path);
        fprintf(report, "wrote %s (%d tensors)\n", path, m->tt.n);
        return KILN_OK;
    }
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) return kiln_fail(KILN_ERR_IO, "%s: no checksum manifest (%s); create one with `kiln verify MODEL --write`", path, e.text);
    json_t *ts = json_object_get(root, "tensors");
    const char *alg = json_string_value(json_object_get(root, "algorithm"));
    if (!json_is_object(ts) || !alg || strcmp(alg, "xxh3-64") != 0) {
        json_decref(root);
        return kiln_fail(KILN_ERR_FORMAT, "%s: field 'tensors' missing or 'algorithm' is not \"xxh3-64\"", path);
    }
    for (int i = 0; i < m->tt.n; i++) {
        const char *want = json_string_value(json_object_get(ts, m->tt.v[i].name));
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)m->tt.v[i].checksum);
        if (!want) { fprintf(report, "MISSING  %s (not in the manifest)\n", m->tt.v[i].name); (*n_bad)++; }
        else if (strcmp(want, hex) != 0) { fprintf(report, "MISMATCH %s: file %s, manifest %s\n", m->tt.v[i].name, hex, want); (*n_bad)++; }
    }
    const char *k;
    json_t *v;
    json_object_foreach(ts, k, v) if (!kiln_tt_find(&m->tt, k)) { fprintf(report, "MISSING  %s (in the manifest, not in the model)\n", k); (*n_bad)++; }
    json_decref(root);
    fprintf(report, "%d tensors checked against %s: %d bad\n", m->tt.n, path, *n_bad);
    return KILN_OK;
}
