/* export.h — helpers shared by the model writers (export.c, quantize_save.c). */
#ifndef KILN_MODEL_EXPORT_H
#define KILN_MODEL_EXPORT_H
#include "model/model.h"
#include <jansson.h>

kiln_status kiln_export_make_dir(const char *dir);
/* The tensors to write, Q/K rows permuted to `target`'s RoPE layout; GGUF block dtypes dequantized
 * to F32 unless allow_blocks. Buffers allocated are listed (NULL-terminated) in *owned. */
kiln_status kiln_export_tensors(const struct kiln_model *m, kiln_rope_style target, int allow_blocks, kiln_tensor **out,
                                void ***owned);
void kiln_export_free_owned(void **own);
json_t *kiln_export_config(const struct kiln_model *m);
kiln_status kiln_export_write_json(json_t *j, const char *path); /* takes the reference */
#endif
