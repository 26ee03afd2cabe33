/* name_index.c — open addressing with linear probing; the hash is XXH3-64 of the name with a
 * per-process random seed, so a file cannot be crafted offline to put all its names in one bucket. */
#include "base/name_index.h"
#include <pthread.h>
#include <stdint.h>
#include <sys/random.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static uint64_t seed;
static pthread_once_t seed_once = PTHREAD_ONCE_INIT;
static void init_seed(void) {
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = (uint64_t)(uintptr_t)&seed ^ 0x9e3779b97f4a7c15ull; /* ASLR still varies it */
}
static uint64_t process_seed(void) {
    pthread_once(&seed_once, init_seed);
    return seed;
}

static size_t home(const char *name, size_t cap) {
    return (size_t)XXH3_64bits_withSeed(name, strlen(name), process_seed()) & (cap - 1);
}

int kiln_name_index_find(const kiln_name_index *ix, const char *name, kiln_name_at_fn name_at, const void *owner) {
    if (!ix->cap) return -1;
    for (size_t i = home(name, ix->cap);; i = (i + 1) & (ix->cap - 1)) {
        int s = ix->slots[i];
        if (!s) return -1;
        if (strcmp(name_at(owner, s - 1), name) == 0) return s - 1;
    }
}

static void place(int *slots, size_t cap, const char *name, int slot) {
    size_t i = home(name, cap);
    while (slots[i]) i = (i + 1) & (cap - 1);
    slots[i] = slot + 1;
}

int kiln_name_index_add(kiln_name_index *ix, const char *name, int slot, kiln_name_at_fn name_at, const void *owner) {
    if ((ix->count + 1) * 2 > ix->cap) {
        size_t cap = ix->cap ? ix->cap * 2 : 64;
        int *slots = calloc(cap, sizeof *slots);
        if (!slots) return -1;
        for (size_t i = 0; i < ix->cap; i++)
            if (ix->slots[i]) place(slots, cap, name_at(owner, ix->slots[i] - 1), ix->slots[i] - 1);
        free(ix->slots);
        ix->slots = slots;
        ix->cap = cap;
    }
    place(ix->slots, ix->cap, name, slot);
    ix->count++;
    return 0;
}

void kiln_name_index_truncate(kiln_name_index *ix, int n, kiln_name_at_fn name_at, const void *owner) {
    if (!ix->cap) return;
    /* linear probing cannot just blank removed entries (later probes would stop early): re-place
     * the kept ones in the same table */
    memset(ix->slots, 0, ix->cap * sizeof *ix->slots);
    ix->count = 0;
    for (int s = 0; s < n; s++) { place(ix->slots, ix->cap, name_at(owner, s), s); ix->count++; }
}

void kiln_name_index_free(kiln_name_index *ix) {
    free(ix->slots);
    memset(ix, 0, sizeof *ix);
}
