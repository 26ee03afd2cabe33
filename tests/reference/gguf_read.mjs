// gguf_read.mjs — prints a GGUF file's metadata (tokenizer arrays left out) and tensor infos as JSON,
// read with the independent npm reader @huggingface/gguf (the Hugging Face Hub's GGUF parser), so
// that tests check kiln's files against a reader kiln did not write. Usage: node gguf_read.mjs FILE
import { gguf } from "@huggingface/gguf";

const { metadata, tensorInfos } = await gguf(process.argv[2], { allowLocalFile: true });
const plain = (v) => (typeof v === "bigint" ? Number(v) : v);
const md = {};
for (const [k, v] of Object.entries(metadata)) {
  if (k.startsWith("tokenizer.ggml.") && Array.isArray(v)) continue;
  md[k] = Array.isArray(v) ? v.map(plain) : plain(v);
}
const tensors = tensorInfos.map((t) => ({ name: t.name, ne: t.shape.map(Number), type: Number(t.dtype) }));
process.stdout.write(JSON.stringify({ metadata: md, tensors }));
