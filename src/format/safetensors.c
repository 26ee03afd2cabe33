/* safetensors.c — bounds-checked safetensors reader and a writer. */
#include "format/safetensors.h"
#include "base/status.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint64_t b, e; const char *name; } span;
static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : 0;
}

kiln_status kiln_safetensors_parse(const kiln_mapping *map, kiln_tensor_table *tt) {
    const char *path = map->path;
    if (map->size < 8) return kiln_fail(KILN_ERR_FORMAT, "%s: truncated: %llu bytes, no header length", path, (unsigned long long)map->size);
    uint64_t hlen;
    memcpy(&hlen, map->base, 8);
    if (hlen > map->size - 8 || hlen > (100u << 20))
        return kiln_fail(KILN_ERR_FORMAT, "%s: header length %llu exceeds the file size %llu (truncated or not safetensors)",
                         path, (unsigned long long)hlen, (unsigned long long)map->size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)map->base + 8, hlen, 0, &jerr);
    if (!root || !json_is_object(root)) {
        if (root) json_decref(root);
        return kiln_fail(KILN_ERR_FORMAT, "%s: header is not a JSON object: %s (offset %d)", path, jerr.text, jerr.position + 8);
    }
    uint64_t data_start = 8 + hlen, data_size = map->size - data_start;
    size_t nt = json_object_size(root);
    span *spans = calloc(nt ? nt : 1, sizeof *spans);
    int ns = 0;
    kiln_status st = KILN_OK;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': missing or malformed dtype/shape/data_offsets", path, key);
            break;
        }
        int dt = kiln_dtype_from_st_name(json_string_value(jd));
        if (dt < 0) { st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported dtype '%s'", path, key, json_string_value(jd)); break; }
        kiln_tensor t = {0};
        t.name = (char *)key;
        t.dtype = (kiln_dtype)dt;
        t.file = path;
        size_t nd = json_array_size(js);
        if (nd > KILN_MAX_DIMS) { st = kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dimensions (max %d)", path, key, nd, KILN_MAX_DIMS); break; }
        t.ndim = (int)nd;
        uint64_t numel = 1;
        for (size_t i = 0; i < nd; i++) {
            json_t *d = json_array_get(js, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > (1ll << 40)) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a valid dimension", path, key, i);
                goto done;
            }
            t.shape[i] = json_integer_value(d);
            /* checked before the multiply: 2^40 × 2^40 would wrap to a small count and pass */
            if (t.shape[i] && numel > (1ull << 42) / (uint64_t)t.shape[i]) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': shape[%zu] = %lld makes more than 2^42 elements", path, key, i,
                               (long long)t.shape[i]);
                goto done;
            }
            numel *= (uint64_t)t.shape[i];
        }
        json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
        if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b)) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': data_offsets are not a valid [begin, end] pair", path, key);
            break;
        }
        uint64_t ob = (uint64_t)json_integer_value(b), oe = (uint64_t)json_integer_value(e);
        if (oe > data_size) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) run past the end of the data (%llu bytes)",
                           path, key, (unsigned long long)ob, (unsigned long long)oe, (unsigned long long)data_size);
            break;
        }
        uint64_t want = kiln_dtype_nbytes(t.dtype, numel);
        if (oe - ob != want) {
            st = kiln_fail(KILN_ERR_FORMAT, "%s: tensor '%s': data_offsets span %llu bytes but dtype %s × shape needs %llu",
                           path, key, (unsigned long long)(oe - ob), json_string_value(jd), (unsigned long long)want);
            break;
        }
        t.offset = data_start + ob;
        t.data = map->base + t.offset;
        t.nbytes = want;
        spans[ns++] = (span){ob, oe, key};
        if ((st = kiln_tt_add(tt, &t)) != KILN_OK) break;
    }
    if (st == KILN_OK) {
        qsort(spans, (size_t)ns, sizeof *spans, span_cmp);
        for (int i = 1; i < ns; i++)
            if (spans[i].b < spans[i - 1].e) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap (data_offsets %llu < %llu)", path,
                               spans[i - 1].name, spans[i].name, (unsigned long long)spans[i].b, (unsigned long long)spans[i - 1].e);
                break;
            }
    }
done:
    free(spans);
    json_decref(root);
    return st;
}

kiln_status kiln_safetensors_write(const char *path, const kiln_tensor *ts, int n) {
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const kiln_dtype_info *di = kiln_dtype_get(ts[i].dtype);
        if (!di || !di->st_name) {
            json_decref(root);
            return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s has no safetensors name", path, ts[i].name, di ? di->name : "?");
        }
        json_t *o = json_object(), *sh = json_array();
        json_object_set_new(o, "dtype", json_string(di->st_name));
        for (int d = 0; d < ts[i].ndim; d++) json_array_append_new(sh, json_integer(ts[i].shape[d]));
        json_object_set_new(o, "shape", sh);
        json_t *jo = json_array();
        json_array_append_new(jo, json_integer((json_int_t)off));
        json_array_append_new(jo, json_integer((json_int_t)(off + ts[i].nbytes)));
        json_object_set_new(o, "data_offsets", jo);
        json_object_set_new(root, ts[i].name, o);
        off += ts[i].nbytes;
    }
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!hdr) return kiln_fail(KILN_ERR_NOMEM, "%s: cannot serialize header", path);
    /* Header padded with spaces so that the data starts 64-byte aligned in the file (the format
     * requires 8): memory-mapped weights whose sizes are multiples of 64 bytes are then each
     * 64-byte aligned, so a GEMV's 64-byte loads do not straddle cache lines. */
    size_t hl = strlen(hdr), padded = (8 + hl + 63) / 64 * 64 - 8;
    FILE *f = fopen(path, "wb");
    if (!f) { free(hdr); return kiln_fail(KILN_ERR_IO, "%s: cannot create file", path); }
    uint64_t hlen = padded;
    int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(hdr, 1, hl, f) == hl;
    for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    for (int i = 0; ok && i < n; i++) ok = fwrite(ts[i].data, 1, ts[i].nbytes, f) == ts[i].nbytes;
    if (fclose(f) != 0) ok = 0;
    return ok ? KILN_OK : kiln_fail(KILN_ERR_IO, "%s: write failed", path);
}
