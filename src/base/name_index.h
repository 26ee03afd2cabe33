/* name_index.h — a string → slot-number index (open addressing over XXH3 hashes), so loaders find
 * a tensor name or a metadata key in O(1) instead of scanning: a hostile file with 60,000 names
 * must not make loading quadratic. The index stores only slot numbers; the caller keeps the strings
 * and passes a lookup function that returns slot i's string. */
#ifndef KILN_BASE_NAME_INDEX_H
#define KILN_BASE_NAME_INDEX_H
#include <stddef.h>

typedef const char *(*kiln_name_at_fn)(const void *owner, int slot);

typedef struct kiln_name_index {
    int *slots;   /* cap entries: slot number + 1, or 0 for empty */
    size_t cap;   /* a power of two, kept at least twice the count */
    size_t count;
} kiln_name_index;

/* Returns the slot holding `name`, or -1. */
int kiln_name_index_find(const kiln_name_index *ix, const char *name, kiln_name_at_fn name_at, const void *owner);
/* Records that slot `slot` holds `name` (the caller has checked it is not present yet).
 * Returns 0, or -1 when out of memory (the index is then unchanged). */
int kiln_name_index_add(kiln_name_index *ix, const char *name, int slot, kiln_name_at_fn name_at, const void *owner);
/* Forgets every slot >= n (the caller dropped them); allocates nothing. */
void kiln_name_index_truncate(kiln_name_index *ix, int n, kiln_name_at_fn name_at, const void *owner);
void kiln_name_index_free(kiln_name_index *ix);
#endif
