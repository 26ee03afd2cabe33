/* safetensors.h — reading and writing the safetensors format (Hugging Face).
 * File: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
 * "__metadata__" optional, then the data region. */
#ifndef KILN_FORMAT_SAFETENSORS_H
#define KILN_FORMAT_SAFETENSORS_H
#include "format/tensor.h"

/* Parses a mapped file and appends its tensors (pointing into the mapping) to tt. Checks dtype,
 * shape, offsets within the data region, size == numel × dtype size, and no overlap. */
kiln_status kiln_safetensors_parse(const kiln_mapping *map, kiln_tensor_table *tt);

/* Writes tensors (data copied from each t.data) to path; metadata: optional {"format": "pt"}. */
kiln_status kiln_safetensors_write(const char *path, const kiln_tensor *tensors, int n);
#endif
