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
/* Re-encodes a float tensor (F32 / F16 / BF16) of 2 or more dims whose rows (last dim) are a
 * multiple of 32 into GGUF Q8_0 / Q4_0 blocks (ggml's reference quantizers, quant/quantize.h) in a
 * new buffer *out (caller frees); 1-D F16 / BF16 tensors (norms, biases) become F32, as
 * llama.cpp's converter writes them. Returns 1 (blocks), 2 (F32), or 0 when the tensor is left as
 * it is (to not Q8_0 / Q4_0, or not encodable); *st reports a failure. */
int kiln_export_gguf_encode(const kiln_tensor *t, kiln_dtype to, uint8_t **out, uint64_t *nbytes, kiln_status *st);
kiln_status kiln_export_write_json(json_t *j, const char *path); /* takes the reference */
#endif
