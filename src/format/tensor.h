/* tensor.h — the tensor table every loader fills: name, dtype, shape and a pointer into read-only
 * mapped (or owned) memory. One table per model, whatever the file format. */
#ifndef KILN_FORMAT_TENSOR_H
#define KILN_FORMAT_TENSOR_H
#include "kiln.h"
#include "quant/dtype.h"
#include "base/name_index.h"
#include <stdint.h>
#include <stddef.h>

#define KILN_MAX_DIMS 4

typedef struct kiln_tensor {
    char *name;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS]; /* outermost first, as safetensors/PyTorch write it ([out, in]) */
    const uint8_t *data;
    uint64_t nbytes;
    const char *file;             /* the file it came from (for error messages); not owned */
    uint64_t offset;              /* byte offset of data in that file */
    uint64_t checksum;            /* XXH3-64 of the data, computed at load (model/checksum.c) */
    unsigned char used;           /* looked up by name (kiln_tt_find) since load: what `kiln inspect` reports as used */
} kiln_tensor;

typedef struct kiln_tensor_table {
    kiln_tensor *v;
    int n, cap;
    kiln_name_index by_name; /* name → index into v (loaders may add tens of thousands of names) */
} kiln_tensor_table;

uint64_t kiln_tensor_numel(const kiln_tensor *t);
/* Adds a tensor (name copied). Rejects duplicates with KILN_ERR_FORMAT naming `file`. */
kiln_status kiln_tt_add(kiln_tensor_table *tt, const kiln_tensor *t);
/* Drops the tensors added after the first n (a loader undoing a failed open). */
void kiln_tt_truncate(kiln_tensor_table *tt, int n);
/* The tensor named `name`, or NULL; marks it used (binders find every tensor they read by name, so the
 * tensors never looked up are the ones a model does not use: `kiln inspect` lists them). */
const kiln_tensor *kiln_tt_find(const kiln_tensor_table *tt, const char *name);
void kiln_tt_free(kiln_tensor_table *tt);

/* A read-only memory map of a whole file. */
typedef struct kiln_mapping {
    char *path;
    const uint8_t *base;
    uint64_t size;
} kiln_mapping;
kiln_status kiln_map_file(const char *path, kiln_mapping *m);
void kiln_unmap(kiln_mapping *m);
#endif
