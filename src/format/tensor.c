/* tensor.c — the tensor table and read-only file mappings. */
#include "format/tensor.h"
#include "base/status.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t kiln_tensor_numel(const kiln_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

static const char *tensor_name_at(const void *owner, int slot) {
    return ((const kiln_tensor_table *)owner)->v[slot].name;
}

kiln_status kiln_tt_add(kiln_tensor_table *tt, const kiln_tensor *t) {
    if (kiln_tt_find(tt, t->name))
        return kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s' appears twice", t->file ? t->file : "?", t->name);
    if (tt->n == tt->cap) {
        int cap = tt->cap ? tt->cap * 2 : 64;
        kiln_tensor *v = realloc(tt->v, (size_t)cap * sizeof *v);
        if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory adding tensor '%s'", t->name);
        tt->v = v;
        tt->cap = cap;
    }
    kiln_tensor *d = &tt->v[tt->n];
    *d = *t;
    d->used = 0;
    d->name = strdup(t->name);
    if (!d->name) return kiln_fail(KILN_ERR_NOMEM, "out of memory adding tensor '%s'", t->name);
    if (kiln_name_index_add(&tt->by_name, d->name, tt->n, tensor_name_at, tt) != 0) {
        free(d->name);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory indexing tensor '%s'", t->name);
    }
    tt->n++;
    return KILN_OK;
}

const kiln_tensor *kiln_tt_find(const kiln_tensor_table *tt, const char *name) {
    int i = kiln_name_index_find(&tt->by_name, name, tensor_name_at, tt);
    if (i < 0) return NULL;
    __atomic_store_n(&tt->v[i].used, 1, __ATOMIC_RELAXED); /* the table's usage record, not its contents */
    return &tt->v[i];
}

void kiln_tt_truncate(kiln_tensor_table *tt, int n) {
    if (n < 0 || n >= tt->n) return;
    for (int i = n; i < tt->n; i++) free(tt->v[i].name);
    tt->n = n;
    kiln_name_index_truncate(&tt->by_name, n, tensor_name_at, tt);
}

void kiln_tt_free(kiln_tensor_table *tt) {
    for (int i = 0; i < tt->n; i++) free(tt->v[i].name);
    free(tt->v);
    kiln_name_index_free(&tt->by_name);
    memset(tt, 0, sizeof *tt);
}

kiln_status kiln_map_file(const char *path, kiln_mapping *m) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_fail(KILN_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (uint64_t)st.st_size;
    if (m->size == 0) {
        close(fd);
        return kiln_fail(KILN_ERR_FORMAT, "%s: file is empty", path);
    }
    void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return kiln_fail(KILN_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    m->base = p;
    m->path = strdup(path);
    return KILN_OK;
}

void kiln_unmap(kiln_mapping *m) {
    if (m->base) munmap((void *)m->base, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}
