/* gguf.c — GGUF v3 (and v2) reader and writer.
 *
 * File layout (all little-endian):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv × { string key, u32 type, value },
 *   n_tensors × { string name, u32 n_dims, u64 ne[n_dims] (innermost first), u32 ggml_type,
 *                 u64 offset (relative to the data section) },
 *   padding to general.alignment (default 32), tensor data.
 * A string is u64 length + bytes (no NUL). An array value is u32 element type, u64 count, elements.
 *
 * Every read goes through a cursor that checks the remaining bytes first, so a truncated or
 * hostile file produces an error naming the file, the byte offset and the key / tensor at fault. */
#include "format/gguf.h"
#include "base/status.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_kv {
    char *key;
    kiln_gguf_type type;
    union {
        uint64_t u;
        int64_t i;
        double f;
    } num;
    char *str; /* STRING: NUL-terminated copy */
    size_t str_len;
    /* ARRAY */
    kiln_gguf_type elem_type;
    uint64_t n;
    const uint8_t *arr; /* numeric arrays: the elements in the mapping */
    char **strs;        /* string arrays: NUL-terminated copies (one arena, strs[0] owns it) */
    size_t *str_lens;
    char *arena;
} gguf_kv;

struct kiln_gguf {
    kiln_mapping map;
    uint32_t version;
    gguf_kv *kv;
    int n_kv;
    kiln_name_index kv_by_key; /* key → index into kv (up to 2^24 keys: no linear search) */
    uint64_t data_off;
};

/* ---- cursor ----------------------------------------------------------------------------------- */
typedef struct {
    const uint8_t *p;
    uint64_t size, off;
    const char *path;
} cursor;

static int need(cursor *c, uint64_t n) { return n <= c->size - c->off; }

static kiln_status rd(cursor *c, void *dst, uint64_t n, const char *what) {
    if (!need(c, n))
        return kiln_fail(KILN_ERR_FORMAT, "%s: truncated at offset %llu reading %s (%llu bytes needed, file size %llu)",
                         c->path, (unsigned long long)c->off, what, (unsigned long long)n,
                         (unsigned long long)c->size);
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return KILN_OK;
}
static kiln_status rd_u32(cursor *c, uint32_t *v, const char *what) { return rd(c, v, 4, what); }
static kiln_status rd_u64(cursor *c, uint64_t *v, const char *what) { return rd(c, v, 8, what); }

/* A string: returns a pointer into the mapping (not NUL-terminated). */
static kiln_status rd_str(cursor *c, const uint8_t **s, uint64_t *len, const char *what) {
    uint64_t at = c->off;
    KILN_TRY(rd_u64(c, len, what));
    if (!need(c, *len))
        return kiln_fail(KILN_ERR_FORMAT, "%s: %s at offset %llu: string length %llu runs past end of file (size %llu)",
                         c->path, what, (unsigned long long)at, (unsigned long long)*len,
                         (unsigned long long)c->size);
    *s = c->p + c->off;
    c->off += *len;
    return KILN_OK;
}

static size_t type_size(kiln_gguf_type t) {
    switch (t) {
    case KILN_GGUF_U8: case KILN_GGUF_I8: case KILN_GGUF_BOOL: return 1;
    case KILN_GGUF_U16: case KILN_GGUF_I16: return 2;
    case KILN_GGUF_U32: case KILN_GGUF_I32: case KILN_GGUF_F32: return 4;
    case KILN_GGUF_U64: case KILN_GGUF_I64: case KILN_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Reads one scalar of numeric type t at p into kv->num. */
static void load_num(kiln_gguf_type t, const uint8_t *p, gguf_kv *kv) {
    switch (t) {
    case KILN_GGUF_U8: case KILN_GGUF_BOOL: kv->num.u = p[0]; break;
    case KILN_GGUF_I8: kv->num.i = (int8_t)p[0]; break;
    case KILN_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); kv->num.u = v; break; }
    case KILN_GGUF_I16: { int16_t v; memcpy(&v, p, 2); kv->num.i = v; break; }
    case KILN_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); kv->num.u = v; break; }
    case KILN_GGUF_I32: { int32_t v; memcpy(&v, p, 4); kv->num.i = v; break; }
    case KILN_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); kv->num.u = v; break; }
    case KILN_GGUF_I64: { int64_t v; memcpy(&v, p, 8); kv->num.i = v; break; }
    case KILN_GGUF_F32: { float v; memcpy(&v, p, 4); kv->num.f = v; break; }
    case KILN_GGUF_F64: { double v; memcpy(&v, p, 8); kv->num.f = v; break; }
    default: break;
    }
}

static int is_signed(kiln_gguf_type t) {
    return t == KILN_GGUF_I8 || t == KILN_GGUF_I16 || t == KILN_GGUF_I32 || t == KILN_GGUF_I64;
}
static int is_float(kiln_gguf_type t) { return t == KILN_GGUF_F32 || t == KILN_GGUF_F64; }

static void kv_free(gguf_kv *kv) {
    free(kv->key);
    free(kv->str);
    free(kv->strs);
    free(kv->str_lens);
    free(kv->arena);
}

static kiln_status parse_kv(cursor *c, gguf_kv *kv, uint64_t idx) {
    const uint8_t *ks;
    uint64_t klen;
    uint64_t at = c->off;
    char what[64];
    snprintf(what, sizeof what, "key of metadata entry %llu", (unsigned long long)idx);
    KILN_TRY(rd_str(c, &ks, &klen, what));
    if (klen == 0 || klen > 65535)
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata entry %llu at offset %llu: key length %llu out of range (1..65535)",
                         c->path, (unsigned long long)idx, (unsigned long long)at, (unsigned long long)klen);
    kv->key = malloc(klen + 1);
    if (!kv->key) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", c->path);
    memcpy(kv->key, ks, klen);
    kv->key[klen] = 0;
    if (memchr(kv->key, 0, klen))
        return kiln_fail(KILN_ERR_FORMAT, "%s: metadata entry %llu at offset %llu: key contains a NUL byte",
                         c->path, (unsigned long long)idx, (unsigned long long)at);
    uint32_t t;
    uint64_t toff = c->off;
    KILN_TRY(rd_u32(c, &t, "metadata value type"));
    if (t > KILN_GGUF_F64)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s': unknown value type %u at offset %llu", c->path, kv->key, t,
                         (unsigned long long)toff);
    kv->type = (kiln_gguf_type)t;
    if (t == KILN_GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        KILN_TRY(rd_str(c, &s, &len, kv->key));
        kv->str = malloc(len + 1);
        if (!kv->str) return kiln_fail(KILN_ERR_NOMEM, "%s: key '%s': out of memory", c->path, kv->key);
        memcpy(kv->str, s, len);
        kv->str[len] = 0;
        kv->str_len = len;
        return KILN_OK;
    }
    if (t != KILN_GGUF_ARRAY) {
        size_t sz = type_size(kv->type);
        if (!need(c, sz))
            return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s': truncated at offset %llu (value of %zu bytes, file size %llu)",
                             c->path, kv->key, (unsigned long long)c->off, sz, (unsigned long long)c->size);
        load_num(kv->type, c->p + c->off, kv);
        c->off += sz;
        return KILN_OK;
    }
    uint32_t et;
    uint64_t n;
    toff = c->off;
    KILN_TRY(rd_u32(c, &et, kv->key));
    KILN_TRY(rd_u64(c, &n, kv->key));
    if (et > KILN_GGUF_F64 || et == KILN_GGUF_ARRAY)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s': unsupported array element type %u at offset %llu", c->path,
                         kv->key, et, (unsigned long long)toff);
    kv->elem_type = (kiln_gguf_type)et;
    kv->n = n;
    uint64_t rem = c->size - c->off;
    if (et == KILN_GGUF_STRING) {
        /* each element needs at least its 8-byte length */
        if (n > rem / 8)
            return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s': array count %llu at offset %llu exceeds the %llu bytes left in the file",
                             c->path, kv->key, (unsigned long long)n, (unsigned long long)(toff + 4),
                             (unsigned long long)rem);
        /* first pass: validate and size the arena */
        uint64_t start = c->off, total = 0;
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *s;
            uint64_t len;
            char w[300];
            snprintf(w, sizeof w, "key '%s' element %llu", kv->key, (unsigned long long)i);
            KILN_TRY(rd_str(c, &s, &len, w));
            total += len + 1;
        }
        kv->arena = malloc(total ? total : 1);
        kv->strs = malloc((n ? n : 1) * sizeof *kv->strs);
        kv->str_lens = malloc((n ? n : 1) * sizeof *kv->str_lens);
        if (!kv->arena || !kv->strs || !kv->str_lens)
            return kiln_fail(KILN_ERR_NOMEM, "%s: key '%s': out of memory for %llu strings", c->path, kv->key,
                             (unsigned long long)n);
        c->off = start;
        char *a = kv->arena;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t len;
            memcpy(&len, c->p + c->off, 8);
            c->off += 8;
            memcpy(a, c->p + c->off, len);
            a[len] = 0;
            c->off += len;
            kv->strs[i] = a;
            kv->str_lens[i] = len;
            a += len + 1;
        }
        return KILN_OK;
    }
    size_t es = type_size(kv->elem_type);
    if (n > rem / es)
        return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s': array of %llu × %zu-byte elements at offset %llu runs past end of file (size %llu)",
                         c->path, kv->key, (unsigned long long)n, es, (unsigned long long)toff,
                         (unsigned long long)c->size);
    kv->arr = c->p + c->off;
    c->off += n * es;
    return KILN_OK;
}

/* ---- open ------------------------------------------------------------------------------------- */
typedef struct {
    uint64_t off, end;
    int idx;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : (x->idx - y->idx);
}

static const char *kv_key_at(const void *owner, int slot) { return ((const kiln_gguf *)owner)->kv[slot].key; }

static const gguf_kv *find_kv(const kiln_gguf *g, const char *key) {
    int i = kiln_name_index_find(&g->kv_by_key, key, kv_key_at, g);
    return i < 0 ? NULL : &g->kv[i];
}

static kiln_status open_impl(kiln_gguf *g, kiln_tensor_table *tt, const char *path) {
    KILN_TRY(kiln_map_file(path, &g->map));
    cursor c = {g->map.base, g->map.size, 0, g->map.path};
    uint32_t magic;
    KILN_TRY(rd_u32(&c, &magic, "magic"));
    if (memcmp(&magic, "GGUF", 4) != 0)
        return kiln_fail(KILN_ERR_FORMAT, "%s: bad magic at offset 0: %02x %02x %02x %02x (expected \"GGUF\")", path,
                         g->map.base[0], g->map.base[1], g->map.base[2], g->map.base[3]);
    KILN_TRY(rd_u32(&c, &g->version, "version"));
    if (g->version != 2 && g->version != 3)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: version at offset 4: %u (kiln reads GGUF v2 and v3)", path,
                         g->version);
    uint64_t n_tensors, n_kv;
    KILN_TRY(rd_u64(&c, &n_tensors, "n_tensors"));
    KILN_TRY(rd_u64(&c, &n_kv, "n_kv"));
    /* the smallest metadata entry is 8 (key len) + 1 (key) + 4 (type) + 1 (u8 value) bytes; the
     * smallest tensor info 8 + 1 + 4 + 8 + 4 + 8 */
    uint64_t rem = c.size - c.off;
    if (n_kv > rem / 14 || n_kv > (1u << 24))
        return kiln_fail(KILN_ERR_FORMAT, "%s: n_kv at offset 16: %llu is absurd for a file of %llu bytes", path,
                         (unsigned long long)n_kv, (unsigned long long)c.size);
    if (n_tensors > rem / 33 || n_tensors > (1u << 24))
        return kiln_fail(KILN_ERR_FORMAT, "%s: n_tensors at offset 8: %llu is absurd for a file of %llu bytes", path,
                         (unsigned long long)n_tensors, (unsigned long long)c.size);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    if (!g->kv) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = (int)i + 1;
        KILN_TRY(parse_kv(&c, &g->kv[i], i));
        if (find_kv(g, g->kv[i].key))
            return kiln_fail(KILN_ERR_FORMAT, "%s: key '%s' appears twice", path, g->kv[i].key);
        if (kiln_name_index_add(&g->kv_by_key, g->kv[i].key, (int)i, kv_key_at, g) != 0)
            return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory indexing key '%s' (%llu keys)", path, g->kv[i].key,
                             (unsigned long long)n_kv);
    }
    uint64_t alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = find_kv(g, "general.alignment");
    if (al) {
        if (al->type != KILN_GGUF_U32 || al->num.u == 0 || (al->num.u & (al->num.u - 1)) || al->num.u > (1u << 20))
            return kiln_fail(KILN_ERR_FORMAT, "%s: key 'general.alignment': %llu is not a power of two u32 up to 1 MiB",
                             path, (unsigned long long)al->num.u);
        alignment = al->num.u;
    }

    /* tensor infos */
    typedef struct {
        const uint8_t *name;
        uint64_t name_len;
        uint32_t n_dims, type;
        uint64_t ne[KILN_MAX_DIMS];
        uint64_t offset;
        uint64_t info_off;
    } tinfo;
    tinfo *ti = calloc(n_tensors ? n_tensors : 1, sizeof *ti);
    span *sp = calloc(n_tensors ? n_tensors : 1, sizeof *sp);
    kiln_status st = KILN_OK;
    if (!ti || !sp) { st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path); goto done; }
    for (uint64_t i = 0; i < n_tensors; i++) {
        tinfo *t = &ti[i];
        t->info_off = c.off;
        char what[64];
        snprintf(what, sizeof what, "name of tensor %llu", (unsigned long long)i);
        if ((st = rd_str(&c, &t->name, &t->name_len, what))) goto done;
        if (t->name_len == 0 || t->name_len > 4096 || memchr(t->name, 0, t->name_len)) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor %llu at offset %llu: bad name (length %llu)", path,
                           (unsigned long long)i, (unsigned long long)t->info_off, (unsigned long long)t->name_len);
            goto done;
        }
        int nl = (int)t->name_len;
        const char *nm = (const char *)t->name;
        uint64_t doff = c.off;
        if ((st = rd_u32(&c, &t->n_dims, "tensor n_dims"))) goto done;
        if (t->n_dims < 1 || t->n_dims > KILN_MAX_DIMS) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%.*s': n_dims at offset %llu is %u (must be 1..%d)", path, nl,
                           nm, (unsigned long long)doff, t->n_dims, KILN_MAX_DIMS);
            goto done;
        }
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t o = c.off;
            if ((st = rd_u64(&c, &t->ne[d], "tensor ne"))) goto done;
            if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 40)) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%.*s': ne[%u] at offset %llu is %llu (out of range)", path,
                               nl, nm, d, (unsigned long long)o, (unsigned long long)t->ne[d]);
                goto done;
            }
        }
        uint64_t to = c.off;
        if ((st = rd_u32(&c, &t->type, "tensor type"))) goto done;
        if ((st = rd_u64(&c, &t->offset, "tensor offset"))) goto done;
        int dt = kiln_dtype_from_gguf((int)t->type);
        const char *gname = t->type <= INT32_MAX ? kiln_ggml_type_name((int)t->type) : NULL;
        if (dt < 0 && gname) { /* a type ggml has and kiln does not read (IQ2_XXS, TQ1_0, MXFP4 ...) */
            st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%.*s' is %s (ggml type %u, at offset %llu), a type kiln does not read",
                           path, nl, nm, gname, t->type, (unsigned long long)to);
            goto done;
        }
        if (dt < 0) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%.*s': ggml type %u at offset %llu is not a type ggml has", path, nl, nm,
                           t->type, (unsigned long long)to);
            goto done;
        }
        if (t->offset % alignment) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%.*s': data offset %llu (at offset %llu) is not a multiple of the alignment %llu",
                           path, nl, nm, (unsigned long long)t->offset, (unsigned long long)(to + 4),
                           (unsigned long long)alignment);
            goto done;
        }
    }
    g->data_off = (c.off + alignment - 1) / alignment * alignment;
    if (n_tensors && g->data_off > c.size) {
        st = kiln_fail(KILN_ERR_FORMAT, "%s: data section at offset %llu starts past end of file (size %llu)", path,
                       (unsigned long long)g->data_off, (unsigned long long)c.size);
        goto done;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        tinfo *t = &ti[i];
        int nl = (int)t->name_len;
        const char *nm = (const char *)t->name;
        kiln_dtype dt = (kiln_dtype)kiln_dtype_from_gguf((int)t->type);
        const kiln_dtype_info *di = kiln_dtype_get(dt);
        uint64_t numel = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if (numel > ((uint64_t)1 << 48) / t->ne[d]) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%.*s': shape overflows (element count too large)", path,
                               nl, nm);
                goto done;
            }
            numel *= t->ne[d];
        }
        if (t->ne[0] % (uint64_t)di->block_elems) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%.*s': ne[0] = %llu is not a multiple of the %s block size %d",
                           path, nl, nm, (unsigned long long)t->ne[0], di->name, di->block_elems);
            goto done;
        }
        uint64_t nbytes = numel / (uint64_t)di->block_elems * (uint64_t)di->block_bytes;
        uint64_t avail = c.size - g->data_off;
        if (t->offset > avail || nbytes > avail - t->offset) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%.*s': data [%llu, %llu) runs past end of file (size %llu)",
                           path, nl, nm, (unsigned long long)(g->data_off + t->offset),
                           (unsigned long long)(g->data_off + t->offset + nbytes), (unsigned long long)c.size);
            goto done;
        }
        sp[i].off = t->offset;
        sp[i].end = t->offset + nbytes;
        sp[i].idx = (int)i;
    }
    qsort(sp, n_tensors, sizeof *sp, span_cmp);
    for (uint64_t i = 1; i < n_tensors; i++) {
        if (sp[i].off < sp[i - 1].end) {
            const tinfo *a = &ti[sp[i - 1].idx], *b = &ti[sp[i].idx];
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%.*s': data [%llu, %llu) overlaps tensor '%.*s' [%llu, %llu)",
                           path, (int)b->name_len, (const char *)b->name,
                           (unsigned long long)(g->data_off + sp[i].off), (unsigned long long)(g->data_off + sp[i].end),
                           (int)a->name_len, (const char *)a->name, (unsigned long long)(g->data_off + sp[i - 1].off),
                           (unsigned long long)(g->data_off + sp[i - 1].end));
            goto done;
        }
    }
    if (tt) {
        for (uint64_t i = 0; i < n_tensors; i++) {
            tinfo *t = &ti[i];
            char nm[4097];
            memcpy(nm, t->name, t->name_len);
            nm[t->name_len] = 0;
            kiln_tensor x;
            memset(&x, 0, sizeof x);
            x.name = nm;
            x.dtype = (kiln_dtype)kiln_dtype_from_gguf((int)t->type);
            x.ndim = (int)t->n_dims;
            /* GGUF ne[] is innermost first; kiln shapes are outermost first */
            for (int d = 0; d < x.ndim; d++) x.shape[d] = (int64_t)t->ne[x.ndim - 1 - d];
            x.nbytes = kiln_dtype_nbytes(x.dtype, kiln_tensor_numel(&x));
            x.offset = g->data_off + t->offset;
            x.data = g->map.base + x.offset;
            x.file = g->map.path;
            if ((st = kiln_tt_add(tt, &x))) goto done;
        }
    }
done:
    free(ti);
    free(sp);
    return st;
}

kiln_status kiln_gguf_open(const char *path, kiln_tensor_table *tt, kiln_gguf **out) {
    *out = NULL;
    kiln_gguf *g = calloc(1, sizeof *g);
    if (!g) return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path);
    int n0 = tt ? tt->n : 0;
    kiln_status st = open_impl(g, tt, path);
    if (st != KILN_OK) {
        /* leave the caller's table as it was */
        if (tt) kiln_tt_truncate(tt, n0);
        kiln_gguf_close(g);
        return st;
    }
    *out = g;
    return KILN_OK;
}

void kiln_gguf_close(kiln_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_kv; i++) kv_free(&g->kv[i]);
    free(g->kv);
    kiln_name_index_free(&g->kv_by_key);
    kiln_unmap(&g->map);
    free(g);
}

const char *kiln_gguf_path(const kiln_gguf *g) { return g->map.path; }
uint32_t kiln_gguf_version(const kiln_gguf *g) { return g->version; }
uint64_t kiln_gguf_data_offset(const kiln_gguf *g) { return g->data_off; }
int kiln_gguf_n_kv(const kiln_gguf *g) { return g->n_kv; }
const char *kiln_gguf_key(const kiln_gguf *g, int i, kiln_gguf_type *type) {
    if (i < 0 || i >= g->n_kv) return NULL;
    if (type) *type = g->kv[i].type;
    return g->kv[i].key;
}

int kiln_gguf_key_type(const kiln_gguf *g, const char *key, kiln_gguf_type *type) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return -1;
    if (type) *type = kv->type;
    return 0;
}

int kiln_gguf_get_u64(const kiln_gguf *g, const char *key, uint64_t *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type == KILN_GGUF_STRING || kv->type == KILN_GGUF_ARRAY || is_float(kv->type)) return -1;
    if (is_signed(kv->type)) {
        if (kv->num.i < 0) return -1;
        *v = (uint64_t)kv->num.i;
    } else {
        *v = kv->num.u;
    }
    return 0;
}

int kiln_gguf_get_token_id(const kiln_gguf *g, const char *key, int64_t *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type == KILN_GGUF_STRING || kv->type == KILN_GGUF_ARRAY || kv->type == KILN_GGUF_BOOL || is_float(kv->type)) return -1;
    if (is_signed(kv->type)) *v = kv->num.i;
    else if (kv->num.u == 0xFFFFFFFFull || kv->num.u == UINT64_MAX) *v = -1;
    else if (kv->num.u > (uint64_t)INT64_MAX) *v = INT64_MAX; /* out of every range */
    else *v = (int64_t)kv->num.u;
    return 0;
}

int kiln_gguf_get_f32(const kiln_gguf *g, const char *key, float *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type == KILN_GGUF_STRING || kv->type == KILN_GGUF_ARRAY || kv->type == KILN_GGUF_BOOL) return -1;
    if (is_float(kv->type)) *v = (float)kv->num.f;
    else if (is_signed(kv->type)) *v = (float)kv->num.i;
    else *v = (float)kv->num.u;
    return 0;
}

int kiln_gguf_get_str(const kiln_gguf *g, const char *key, const char **s, size_t *len) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KILN_GGUF_STRING) return -1;
    *s = kv->str;
    if (len) *len = kv->str_len;
    return 0;
}

int kiln_gguf_get_arr(const kiln_gguf *g, const char *key, kiln_gguf_type *elem_type, uint64_t *n) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KILN_GGUF_ARRAY) return -1;
    if (elem_type) *elem_type = kv->elem_type;
    if (n) *n = kv->n;
    return 0;
}

int kiln_gguf_arr_str(const kiln_gguf *g, const char *key, uint64_t i, const char **s, size_t *len) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KILN_GGUF_ARRAY || kv->elem_type != KILN_GGUF_STRING || i >= kv->n) return -1;
    *s = kv->strs[i];
    if (len) *len = kv->str_lens[i];
    return 0;
}

int kiln_gguf_arr_f64(const kiln_gguf *g, const char *key, uint64_t i, double *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KILN_GGUF_ARRAY || i >= kv->n) return -1;
    size_t es = type_size(kv->elem_type);
    if (!es) return -1;
    gguf_kv tmp;
    memset(&tmp, 0, sizeof tmp);
    load_num(kv->elem_type, kv->arr + i * es, &tmp);
    if (is_float(kv->elem_type)) *v = tmp.num.f;
    else if (is_signed(kv->elem_type)) *v = (double)tmp.num.i;
    else *v = (double)tmp.num.u;
    return 0;
}

/* ---- writer ----------------------------------------------------------------------------------- */
typedef struct wkv {
    char *key;
    kiln_gguf_type type, elem_type;
    uint8_t num[8];
    char *str;
    uint64_t n;
    void *arr;   /* numeric array elements (little-endian, packed) */
    char **strs; /* string array */
} wkv;

typedef struct wtensor {
    char *name;
    kiln_dtype dt;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} wtensor;

struct kiln_gguf_writer {
    wkv *kv;
    int n_kv, cap_kv;
    wtensor *t;
    int n_t, cap_t;
    int failed; /* an allocation failed or an argument was bad: reported by kiln_gguf_write */
    char err[256];
};

kiln_gguf_writer *kiln_gguf_writer_new(void) { return calloc(1, sizeof(kiln_gguf_writer)); }

static void wkv_free(wkv *k) {
    free(k->key);
    free(k->str);
    free(k->arr);
    if (k->strs)
        for (uint64_t i = 0; i < k->n; i++) free(k->strs[i]);
    free(k->strs);
}

void kiln_gguf_writer_free(kiln_gguf_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_kv; i++) wkv_free(&w->kv[i]);
    free(w->kv);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w);
}

static void wfail(kiln_gguf_writer *w, const char *msg, const char *key) {
    if (!w->failed) snprintf(w->err, sizeof w->err, "%s: %s", key ? key : "?", msg);
    w->failed = 1;
}

/* Returns a fresh (or replaced) entry for key, or NULL on allocation failure. */
static wkv *wkv_slot(kiln_gguf_writer *w, const char *key) {
    for (int i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            char *k = w->kv[i].key;
            w->kv[i].key = NULL;
            wkv_free(&w->kv[i]);
            memset(&w->kv[i], 0, sizeof w->kv[i]);
            w->kv[i].key = k;
            return &w->kv[i];
        }
    if (w->n_kv == w->cap_kv) {
        int cap = w->cap_kv ? w->cap_kv * 2 : 32;
        wkv *v = realloc(w->kv, (size_t)cap * sizeof *v);
        if (!v) { wfail(w, "out of memory", key); return NULL; }
        w->kv = v;
        w->cap_kv = cap;
    }
    wkv *k = &w->kv[w->n_kv];
    memset(k, 0, sizeof *k);
    k->key = strdup(key);
    if (!k->key) { wfail(w, "out of memory", key); return NULL; }
    w->n_kv++;
    return k;
}

static void set_num(kiln_gguf_writer *w, const char *key, kiln_gguf_type t, const void *v, size_t sz) {
    wkv *k = wkv_slot(w, key);
    if (!k) return;
    k->type = t;
    memcpy(k->num, v, sz);
}
void kiln_gguf_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v) { set_num(w, key, KILN_GGUF_U32, &v, 4); }
void kiln_gguf_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v) { set_num(w, key, KILN_GGUF_U64, &v, 8); }
void kiln_gguf_set_f32(kiln_gguf_writer *w, const char *key, float v) { set_num(w, key, KILN_GGUF_F32, &v, 4); }
void kiln_gguf_set_bool(kiln_gguf_writer *w, const char *key, int v) {
    uint8_t b = v ? 1 : 0;
    set_num(w, key, KILN_GGUF_BOOL, &b, 1);
}
void kiln_gguf_set_str(kiln_gguf_writer *w, const char *key, const char *s) {
    wkv *k = wkv_slot(w, key);
    if (!k) return;
    k->type = KILN_GGUF_STRING;
    k->str = strdup(s ? s : "");
    if (!k->str) wfail(w, "out of memory", key);
}
void kiln_gguf_set_arr_str(kiln_gguf_writer *w, const char *key, const char *const *s, uint64_t n) {
    wkv *k = wkv_slot(w, key);
    if (!k) return;
    k->type = KILN_GGUF_ARRAY;
    k->elem_type = KILN_GGUF_STRING;
    k->strs = calloc(n ? n : 1, sizeof *k->strs);
    if (!k->strs) { wfail(w, "out of memory", key); return; }
    k->n = n;
    for (uint64_t i = 0; i < n; i++) {
        k->strs[i] = strdup(s[i] ? s[i] : "");
        if (!k->strs[i]) { wfail(w, "out of memory", key); return; }
    }
}
static void set_arr(kiln_gguf_writer *w, const char *key, kiln_gguf_type et, const void *v, uint64_t n, size_t es) {
    wkv *k = wkv_slot(w, key);
    if (!k) return;
    k->type = KILN_GGUF_ARRAY;
    k->elem_type = et;
    k->arr = malloc(n ? n * es : 1);
    if (!k->arr) { wfail(w, "out of memory", key); return; }
    if (n) memcpy(k->arr, v, n * es);
    k->n = n;
}
void kiln_gguf_set_arr_f32(kiln_gguf_writer *w, const char *key, const float *v, uint64_t n) {
    set_arr(w, key, KILN_GGUF_F32, v, n, 4);
}
void kiln_gguf_set_arr_i32(kiln_gguf_writer *w, const char *key, const int32_t *v, uint64_t n) {
    set_arr(w, key, KILN_GGUF_I32, v, n, 4);
}

void kiln_gguf_add_tensor(kiln_gguf_writer *w, const char *name, kiln_dtype dt, int ndim, const int64_t *shape,
                          const void *data, uint64_t nbytes) {
    if (ndim < 1 || ndim > KILN_MAX_DIMS) { wfail(w, "tensor rank must be 1..4", name); return; }
    const kiln_dtype_info *di = kiln_dtype_get(dt);
    if (!di || di->gguf_type < 0) { wfail(w, "dtype has no GGUF type", name); return; }
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0) { wfail(w, "tensor dimension must be positive", name); return; }
        numel *= (uint64_t)shape[i];
    }
    if (shape[ndim - 1] % di->block_elems || kiln_dtype_nbytes(dt, numel) != nbytes) {
        wfail(w, "byte size does not match dtype and shape", name);
        return;
    }
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *v = realloc(w->t, (size_t)cap * sizeof *v);
        if (!v) { wfail(w, "out of memory", name); return; }
        w->t = v;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) { wfail(w, "out of memory", name); return; }
    t->dt = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = nbytes;
    w->n_t++;
}

static int put(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }
static int put_u32(FILE *f, uint32_t v) { return put(f, &v, 4); }
static int put_u64(FILE *f, uint64_t v) { return put(f, &v, 8); }
static int put_str(FILE *f, const char *s) {
    uint64_t n = strlen(s);
    return put_u64(f, n) || put(f, s, n);
}
static int pad_to(FILE *f, uint64_t *pos, uint64_t align) {
    static const uint8_t zeros[64];
    uint64_t target = (*pos + align - 1) / align * align;
    if (put(f, zeros, (size_t)(target - *pos))) return -1;
    *pos = target;
    return 0;
}

static uint64_t str_sz(const char *s) { return 8 + strlen(s); }

kiln_status kiln_gguf_write(kiln_gguf_writer *w, const char *path) {
    if (w->failed) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: gguf writer: %s", path, w->err);
    const uint64_t align = GGUF_DEFAULT_ALIGNMENT;
    FILE *f = fopen(path, "wb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot create", path);
    int e = 0;
    uint64_t pos = 0;
    e |= put(f, "GGUF", 4);
    e |= put_u32(f, 3);
    e |= put_u64(f, (uint64_t)w->n_t);
    e |= put_u64(f, (uint64_t)w->n_kv);
    pos = 24;
    for (int i = 0; i < w->n_kv && !e; i++) {
        const wkv *k = &w->kv[i];
        e |= put_str(f, k->key);
        e |= put_u32(f, (uint32_t)k->type);
        pos += str_sz(k->key) + 4;
        if (k->type == KILN_GGUF_STRING) {
            e |= put_str(f, k->str);
            pos += str_sz(k->str);
        } else if (k->type == KILN_GGUF_ARRAY) {
            e |= put_u32(f, (uint32_t)k->elem_type);
            e |= put_u64(f, k->n);
            pos += 12;
            if (k->elem_type == KILN_GGUF_STRING) {
                for (uint64_t j = 0; j < k->n && !e; j++) {
                    e |= put_str(f, k->strs[j]);
                    pos += str_sz(k->strs[j]);
                }
            } else {
                size_t es = type_size(k->elem_type);
                e |= put(f, k->arr, k->n * es);
                pos += k->n * es;
            }
        } else {
            size_t sz = type_size(k->type);
            e |= put(f, k->num, sz);
            pos += sz;
        }
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n_t && !e; i++) {
        const wtensor *t = &w->t[i];
        e |= put_str(f, t->name);
        e |= put_u32(f, (uint32_t)t->ndim);
        for (int d = t->ndim - 1; d >= 0; d--) e |= put_u64(f, (uint64_t)t->shape[d]); /* innermost first */
        e |= put_u32(f, (uint32_t)kiln_dtype_get(t->dt)->gguf_type);
        e |= put_u64(f, off);
        pos += str_sz(t->name) + 4 + 8 * (uint64_t)t->ndim + 4 + 8;
        off += (t->nbytes + align - 1) / align * align;
    }
    if (!e) e |= pad_to(f, &pos, align);
    for (int i = 0; i < w->n_t && !e; i++) {
        const wtensor *t = &w->t[i];
        e |= put(f, t->data, t->nbytes);
        pos += t->nbytes;
        e |= pad_to(f, &pos, align);
    }
    if (fclose(f) != 0) e = -1;
    if (e) {
        remove(path);
        return kiln_fail(KILN_ERR_IO, "%s: write failed", path);
    }
    return KILN_OK;
}
