/* gguf_arch.h — GGUF files of the MoE families (llama.cpp's `deepseek2` and `glm4moe`), read into
 * and written from kiln's Hugging Face architecture rows (model/gguf_arch.c has the conventions). */
#ifndef KILN_MODEL_GGUF_ARCH_H
#define KILN_MODEL_GGUF_ARCH_H
#include "model/model.h"

/* Reads an opened GGUF file (m->gguf) whose general.architecture is `gguf_arch`: config, tensors
 * (from raw, llama.cpp names) and tokenizer into m. */
kiln_status kiln_gguf_arch_load(struct kiln_model *m, const char *path, const kiln_tensor_table *raw, const char *gguf_arch);
/* Writes a deepseek_v3 / kimi_k2 / glm4_moe_lite (as deepseek2) or glm4_moe (as glm4moe) model;
 * to = KILN_DT_Q8_0 / KILN_DT_Q4_0 encodes the weights (--outtype), KILN_DT_COUNT keeps them. */
kiln_status kiln_gguf_arch_save(const struct kiln_model *m, const char *path, kiln_dtype to);
#endif
