/* gguf.h — GGUF v3 reader and writer (the llama.cpp file format).
 *
 * Reader: parses the header, metadata key/values and tensor infos of a memory-mapped file with
 * every length, count, offset and shape bounds-checked; errors name the file and the offset or
 * key at fault. Tensor data stays in the mapping. */
#ifndef KILN_FORMAT_GGUF_H
#define KILN_FORMAT_GGUF_H
#include "format/tensor.h"

typedef enum {
    KILN_GGUF_U8 = 0, KILN_GGUF_I8 = 1, KILN_GGUF_U16 = 2, KILN_GGUF_I16 = 3, KILN_GGUF_U32 = 4,
    KILN_GGUF_I32 = 5, KILN_GGUF_F32 = 6, KILN_GGUF_BOOL = 7, KILN_GGUF_STRING = 8,
    KILN_GGUF_ARRAY = 9, KILN_GGUF_U64 = 10, KILN_GGUF_I64 = 11, KILN_GGUF_F64 = 12
} kiln_gguf_type;

typedef struct kiln_gguf kiln_gguf; /* opaque parsed file */

/* Parses `path` (mapping it). Tensor infos are appended to *tt (if tt != NULL) with data pointing
 * into the mapping, which lives as long as the kiln_gguf. */
kiln_status kiln_gguf_open(const char *path, kiln_tensor_table *tt, kiln_gguf **out);
void kiln_gguf_close(kiln_gguf *g);
const char *kiln_gguf_path(const kiln_gguf *g);

/* 0 with *type (which may be NULL) when `key` is present, -1 when absent: tells a key of the wrong
 * type (the lookups below return -1) from a missing one. */
int kiln_gguf_key_type(const kiln_gguf *g, const char *key, kiln_gguf_type *type);
/* Metadata lookups. Return 0 when found with the right type (integers of any width convert), -1
 * otherwise. */
int kiln_gguf_get_u64(const kiln_gguf *g, const char *key, uint64_t *v);
/* A token-id key: -1 when the key is absent or not an integer; else 0 with *v the id, or -1 for
 * llama.cpp's "no token" sentinel (LLAMA_TOKEN_NULL: a signed -1, or 0xFFFFFFFF / 2^64-1 as its
 * writers store it unsigned). Other values come back as they are (the caller checks the range). */
int kiln_gguf_get_token_id(const kiln_gguf *g, const char *key, int64_t *v);
int kiln_gguf_get_f32(const kiln_gguf *g, const char *key, float *v);
int kiln_gguf_get_str(const kiln_gguf *g, const char *key, const char **s, size_t *len);
/* Arrays: element type and count; element i as string / number. */
int kiln_gguf_get_arr(const kiln_gguf *g, const char *key, kiln_gguf_type *elem_type, uint64_t *n);
int kiln_gguf_arr_str(const kiln_gguf *g, const char *key, uint64_t i, const char **s, size_t *len);
int kiln_gguf_arr_f64(const kiln_gguf *g, const char *key, uint64_t i, double *v);
/* (additions) Strings returned above are NUL-terminated copies owned by the kiln_gguf. Bools read
 * through get_u64 as 0/1. Key enumeration for `inspect`: */
int kiln_gguf_n_kv(const kiln_gguf *g);
const char *kiln_gguf_key(const kiln_gguf *g, int i, kiln_gguf_type *type);
uint32_t kiln_gguf_version(const kiln_gguf *g);
/* Start of the aligned tensor data section in the file (bytes). */
uint64_t kiln_gguf_data_offset(const kiln_gguf *g);

/* Writer: collect metadata and tensors, then write in one go. */
typedef struct kiln_gguf_writer kiln_gguf_writer;
kiln_gguf_writer *kiln_gguf_writer_new(void);
void kiln_gguf_writer_free(kiln_gguf_writer *w);
void kiln_gguf_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v);
void kiln_gguf_set_f32(kiln_gguf_writer *w, const char *key, float v);
void kiln_gguf_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v);
void kiln_gguf_set_bool(kiln_gguf_writer *w, const char *key, int v);
void kiln_gguf_set_str(kiln_gguf_writer *w, const char *key, const char *s);
void kiln_gguf_set_arr_str(kiln_gguf_writer *w, const char *key, const char *const *s, uint64_t n);
void kiln_gguf_set_arr_f32(kiln_gguf_writer *w, const char *key, const float *v, uint64_t n);
void kiln_gguf_set_arr_i32(kiln_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* shape is given outermost first (PyTorch order); GGUF stores ne[] innermost first. Data copied
 * at write time from `data` (must stay valid until kiln_gguf_write). */
void kiln_gguf_add_tensor(kiln_gguf_writer *w, const char *name, kiln_dtype dt, int ndim,
                          const int64_t *shape, const void *data, uint64_t nbytes);
kiln_status kiln_gguf_write(kiln_gguf_writer *w, const char *path);
#endif
