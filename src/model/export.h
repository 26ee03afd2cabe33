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
/* Re-encodes a float tensor (F32 / F16 / BF16) for a GGUF file, named `gguf_name` there, as
 * llama.cpp's converter does (conversion/base.py): the tensors it keeps in F32 whatever the file
 * type (kiln_gguf_keeps_f32) become F32 when stored as F16 / BF16; with `to` Q8_0 / Q4_0 every
 * other tensor of 2 or more dims whose rows (last dim) are a multiple of 32 becomes GGUF blocks
 * (ggml's reference quantizers, quant/quantize.h). The new buffer *out is the caller's to free.
 * Returns 1 (blocks of `to`), 2 (F32), or 0 when the tensor is written as it is stored; *st
 * reports a failure. */
int kiln_export_gguf_encode(const kiln_tensor *t, const char *gguf_name, kiln_dtype to, uint8_t **out, uint64_t *nbytes,
                            kiln_status *st);
/* Whether llama.cpp's converter writes the GGUF tensor `gguf_name` (of ndim dims) as F32 for every
 * file type: 1-D tensors, "*_norm.weight", the MoE routers (ffn_gate_inp, ffn_gate_inp_shexp), the
 * DSA indexer's head weights (indexer.proj) and every tensor whose name does not end in ".weight".
 * Its readers (ggml's element-wise ops on the CPU) take F32 there and nothing else. */
int kiln_gguf_keeps_f32(const char *gguf_name, int ndim);
kiln_status kiln_export_write_json(json_t *j, const char *path); /* takes the reference */
#endif
