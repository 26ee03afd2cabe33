#!/usr/bin/env python3
"""make_seeds.py — seed inputs for the fuzz targets in tests/fuzz/.

  make_seeds.py committed DIR                 the small handmade seeds committed under
                                              tests/fuzz/corpus/<target>/ (deterministic)
  make_seeds.py runtime DIR KILN [SHARED]     seeds made at test time: `kiln mkmodel` checkpoints
                                              (HF, safetensors, GGUF via kiln convert) for every
                                              architecture, and, when SHARED (../shared) is there,
                                              its llama2.c tokenizers, shrunken copies of its
                                              tokenizer.json files, its chat templates and GGUF
                                              vocabularies. Nothing from SHARED is committed.
Multi-part inputs are joined with SPLIT (fuzz_common.h's FUZZ_SPLIT)."""
from math import prod
import json, os, shutil, struct, subprocess, sys, tempfile

SPLIT = b"\n--kiln-fuzz-split--\n"


def put(root, target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)] → safetensors bytes."""
    hdr, off, blob = {}, 0, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blob += data
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def f32(n, scale=0.02):
    return b"".join(struct.pack("<f", scale * (((i * 7919) % 97) - 48) / 48.0) for i in range(n))


def llama2c(dim=8, hidden=16, layers=1, heads=2, kv=1, vocab=12, seq=8, shared=True):
    hd = dim // heads
    kvd = kv * hd
    hdr = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab if shared else -vocab, seq)
    n = vocab * dim + layers * (dim + dim * dim + 2 * kvd * dim + dim * dim + dim + 3 * hidden * dim) + dim
    n += seq * (hd // 2) * 2
    if not shared:
        n += vocab * dim
    return hdr + f32(n, 0.1)


def tokbin(pieces):
    out = struct.pack("<i", max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        b = p.encode()
        out += struct.pack("<fi", -float(i), len(b)) + b
    return out


TOK_PIECES = ["<unk>", "<s>", "</s>", "<0x41>", " ", "a", "b", "ab", " ab", "ba", "\u00e9", "\u2581the"]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_tokenizer_json():
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = [("a", "b"), ("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(["<s>", "</s>", "<|user|>"])]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [added[0]["id"]], "tokens": ["<s>"]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 123"},
            {"role": "assistant", "content": "Hello", "reasoning_content": "think",
             "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": "{\"q\":1}"}}]},
            {"role": "tool", "content": "42"}, {"role": "user", "content": [{"type": "text", "text": "more"}]}]

TEMPLATES = {
    "loop": "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% if not loop.last %}\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    "macro": "{%- macro fmt(m, i=0) -%}{{ i }}:{{ m.role | upper }}={{ m.content | string | trim }}{%- endmacro -%}"
             "{%- set ns = namespace(n=0) -%}{%- for m in messages if m.role != 'tool' -%}{%- set ns.n = ns.n + 1 -%}"
             "{{ fmt(m, i=loop.index0) }}{{ '\\n' }}{%- endfor -%}{{ ns.n }} {{ messages | length }}"
             "{{ (messages | map(attribute='role') | list | tojson) }}{{ tools | tojson if tools else '' }}",
    "filters": "{{ bos_token }}{% set x = [3, 1, 2] %}{{ x | sort | join(',') }} {{ 'a-b-c'.split('-')[::-1] }} "
               "{{ {'k': 1, 'j': [1, 2]} | dictsort }} {{ '%s=%d' | format('n', 7) }} {{ 7 // 2 }} {{ 2 ** 10 }} "
               "{{ 'Hi'.center(6, '*') }} {% raw %}{{ raw }}{% endraw %}{# c #}{{ range(3) | list }} "
               "{{ messages[0]['content'][1:4] if messages else none }} {{ 1 < 2 < 3 }} {{ 'x' ~ 1 }}"
               "{% if enable_thinking is defined and enable_thinking is false %}/no_think{% endif %}",
}


MESSAGES_PLAIN = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 123"},
                  {"role": "assistant", "content": "Hello", "reasoning_content": "think",
                   "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": {"q": 1}}}]},
                  {"role": "tool", "content": "42"}, {"role": "user", "content": "more"}]


def kv_scales_json(layers=2, heads=2, dim=4, mean=True, smooth="prerope"):
    """a kv_scales.json as `kiln calibrate` writes it (docs/KV.md) for the fuzz target's 2 x 2 x 4 model"""
    c = {"format": "kiln-kv-scales", "version": 1, "dtype": "fp8_e4m3", "num_layers": layers, "num_kv_heads": heads,
         "margin": 2.0, "tokens": 256, "source": "fuzz seed",
         "k_scale": [[0.01 * (1 + l + h) for h in range(heads)] for l in range(layers)],
         "v_scale": [[0.02 * (1 + l + h) for h in range(heads)] for l in range(layers)]}
    if mean:
        c["k_mean"] = [[[0.1 * (d - 1.5) for d in range(dim)] for _ in range(heads)] for _ in range(layers)]
        if smooth:
            c["k_smooth"] = smooth
    return json.dumps(c).encode()


def eval_seeds(root):
    """fuzz_eval inputs: a selector byte (task = b % 3: arc_easy, gsm8k, mmlu; strict = (b // 3) % 2;
    shots = (b // 6) % 2), then the files in the layout of ../shared/data, made-up examples"""
    arc = [{"query": "Question: Which one is a fruit?", "choices": ["a stone", "an apple", "a car", "a cloud"], "gold": 1},
           {"query": "Question: What melts ice?", "choices": ["heat", "cold"], "gold": 0},
           {"query": "Question: Where do fish live?", "choices": ["in trees", "in water", "in the sky"], "gold": 1}]
    arc_lines = "\n".join(json.dumps(a) for a in arc).encode() + b"\n"
    gsm = [{"question": "Tom has 3 apples and buys 2 more. How many apples does he have?", "answer": "3 + 2 = <<3+2=5>>5\n#### 5"},
           {"question": "A box holds 4 pens. How many pens are in 3 boxes?", "answer": "4 * 3 = <<4*3=12>>12\n#### 12"}]
    gsm_lines = "\n".join(json.dumps(g) for g in gsm).encode() + b"\n"
    mmlu = b'"What is 2 + 2?",3,4,5,22,B\n"Which, of these, is a colour?",red,dog,""quoted"" cat,run,A\r\nPlain question,one,two,three,four,D\n'
    for b, name, body in [(0, "arc.bin", arc_lines), (3, "arc_strict.bin", arc_lines), (6, "arc_shot.bin", arc_lines),
                          (1, "gsm8k.bin", gsm_lines + SPLIT + gsm_lines), (7, "gsm8k_shot.bin", gsm_lines + SPLIT + gsm_lines),
                          (2, "mmlu.bin", mmlu + SPLIT + mmlu), (8, "mmlu_shot.bin", mmlu + SPLIT + mmlu),
                          (3, "arc_bad_line_strict.bin", b'{"query": "Question: no choices", "gold": 0}\n' + arc_lines),
                          (0, "arc_bad_lines.bin", b"not json\n" + b'{"query": "Q?", "choices": ["x"], "gold": 7}\n' + arc_lines)]:
        put(root, "eval", name, bytes([b]) + body)


def committed(root):
    eval_seeds(root)
    # kv_scales.json: with pre-RoPE means, post-RoPE means, none, and one of the wrong shape
    put(root, "kv_scales", "prerope.json", kv_scales_json())
    put(root, "kv_scales", "post.json", kv_scales_json(smooth="post"))
    put(root, "kv_scales", "no_mean.json", kv_scales_json(mean=False))
    put(root, "kv_scales", "three_layers.json", kv_scales_json(layers=3))
    # safetensors
    put(root, "safetensors", "two_tensors.safetensors",
        safetensors([("a", "F32", [2, 2], f32(4)), ("b", "BF16", [3], b"\x80\x3f" * 3)], {"format": "pt"}))
    put(root, "safetensors", "dtypes.safetensors",
        safetensors([("i8", "I8", [4], b"\x01\x02\x03\x04"), ("f16", "F16", [1], b"\x00\x3c"), ("e4", "F8_E4M3", [2], b"\x38\x40"),
                     ("i32", "I32", [1], b"\x01\x00\x00\x00"), ("u8", "U8", [0], b""), ("s", "F32", [], f32(1))]))
    # HF: a Llama config.json + the safetensors it describes (dim 8, one layer)
    D, F, V, KV = 8, 16, 12, 4
    L = "model.layers.0."
    ts = [("model.embed_tokens.weight", [V, D]), (L + "input_layernorm.weight", [D]), (L + "self_attn.q_proj.weight", [D, D]),
          (L + "self_attn.k_proj.weight", [KV, D]), (L + "self_attn.v_proj.weight", [KV, D]), (L + "self_attn.o_proj.weight", [D, D]),
          (L + "post_attention_layernorm.weight", [D]), (L + "mlp.gate_proj.weight", [F, D]), (L + "mlp.up_proj.weight", [F, D]),
          (L + "mlp.down_proj.weight", [D, F]), ("model.norm.weight", [D]), ("lm_head.weight", [V, D])]
    st = safetensors([(n, "F32", s, f32(prod(s), 0.3)) for n, s in ts])
    hcfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "intermediate_size": F,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": V,
            "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8}}
    put(root, "hf", "llama_d8.bin", json.dumps(hcfg, indent=1).encode() + SPLIT + st)
    del hcfg["rope_scaling"]
    put(root, "hf", "llama_d8_plain.bin", json.dumps(hcfg, indent=1).encode() + SPLIT + st)
    gen = {"eos_token_id": [2, 3], "temperature": 0.6, "top_p": 0.95, "top_k": 40, "repetition_penalty": 1.1}
    put(root, "hf", "llama_d8_genconfig.bin", json.dumps(hcfg, indent=1).encode() + SPLIT + st + SPLIT + json.dumps(gen).encode())
    # llama2c: checkpoint + tokenizer.bin
    put(root, "llama2c", "tiny_shared.bin", llama2c() + SPLIT + tokbin(TOK_PIECES))
    put(root, "llama2c", "tiny_unshared_gqa.bin", llama2c(dim=8, heads=4, kv=2, shared=False) + SPLIT + tokbin(TOK_PIECES))
    put(root, "llama2c", "header_only.bin", struct.pack("<7i", 8, 16, 1, 2, 1, 12, 8))
    # tokenizer.json (+ tokenizer_config.json) + text
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
           "added_tokens_decoder": {"259": {"content": "<|user|>", "special": True}}}
    tj = json.dumps(tiny_tokenizer_json()).encode()
    put(root, "tokenizer", "bytelevel_bpe.bin", tj + SPLIT + json.dumps(cfg).encode() + SPLIT + "<s>the 12345 ab\u00e9 <|user|>!".encode())
    put(root, "tokenizer", "bytelevel_bpe_nocfg.bin", tj + SPLIT + SPLIT + b"hello the world")
    put(root, "tokenizer", "tiktoken.bin", b"YQ== 0\nYg== 1\nYWI= 2\nIA== 3\nIGFi 4\n" + SPLIT +
        json.dumps({"added_tokens_decoder": {"5": {"content": "<|im_end|>", "special": True}}, "eos_token": "<|im_end|>"}).encode()
        + SPLIT + b"ab ab<|im_end|>")
    # chat templates + messages + extra
    for name, t in TEMPLATES.items():
        put(root, "chat_template", name + ".txt", t.encode() + SPLIT + json.dumps(MESSAGES).encode() + SPLIT +
            json.dumps({"bos_token": "<s>", "enable_thinking": False}).encode())
    put(root, "chat_template", "tools.txt", TEMPLATES["macro"].encode() + SPLIT +
        json.dumps({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "get", "parameters": {}}}]}).encode())
    # OpenAI request bodies
    reqs = {
        "chat_min": {"model": "kiln", "messages": [{"role": "user", "content": "Once upon a time"}]},
        "chat_full": {"model": "kiln", "messages": MESSAGES[:2] + [{"role": "assistant", "content": None}], "n": 2, "stream": True,
                      "stream_options": {"include_usage": True}, "temperature": 0.7, "top_p": 0.9, "seed": -5,
                      "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
                      "logit_bias": {"1": -100, "42": 3.5}, "stop": ["\n", "The end"], "logprobs": True, "top_logprobs": 3,
                      "max_completion_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True},
        "chat_tools": {"model": "kiln", "messages": MESSAGES, "parallel_tool_calls": False, "tool_choice": {"type": "function", "function": {"name": "get"}},
                       "tools": [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]},
        "completion_text": {"model": "kiln", "prompt": "Lily was happy", "max_tokens": 4, "logprobs": 2, "stop": "."},
        "completion_ids": {"model": "kiln", "prompt": [1, 2, 3, 4], "max_tokens": 2},
        "completion_nested": {"model": "kiln", "prompt": [[1, 5, 9]], "temperature": 0, "user": "u"},
        "completion_spec": {"model": "kiln", "prompt": "Lily", "max_tokens": 4,
                            "speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}},
        "completion_spec_off": {"model": "kiln", "prompt": [1, 2], "speculative": "off"},
        "completion_spec_mtp": {"model": "kiln", "prompt": [1, 2], "speculative": {"method": "mtp", "num_speculative_tokens": 2}},
    }
    for k, v in reqs.items():
        put(root, "openai", k + ".json", json.dumps(v))
    put(root, "openai", "not_object.json", "[1, 2]")
    put(root, "openai", "chat_json_schema.json", json.dumps({"model": "kiln", "messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": {"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 3}, "b": {"type": "array", "items": {"enum": [1, "x", None]}, "maxItems": 2},
            "c": {"type": "number"}, "d": {"type": "object", "properties": {"e": {"type": "boolean"}}}}}}}}))
    # Anthropic Messages bodies
    put(root, "openai", "anthropic_tools.json", json.dumps({"model": "kiln", "max_tokens": 16, "system": [{"type": "text", "text": "s"}],
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""}, {"type": "text", "text": "x"},
                                                       {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"q": 1}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                                                  {"type": "text", "text": "more"}]}],
        "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object", "properties": {"q": {"type": "integer"}}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "stop_sequences": ["END"], "temperature": 0.5, "stream": True}))
    # model output as the reasoning / tool-call splitter reads the same bytes
    put(root, "openai", "glm_output.txt", "<think>why</think>\nok<tool_call>get\n<arg_key>q</arg_key>\n<arg_value>x</arg_value>\n</tool_call>")
    put(root, "openai", "kimi_output.txt", "a<|tool_calls_section_begin|><|tool_call_begin|>functions.get:0<|tool_call_argument_begin|>"
        "{\"q\": 1}<|tool_call_end|><|tool_calls_section_end|>")
    put(root, "openai", "bad_utf8.json", b'{"model":"kiln","prompt":"\xff\xfe"}')
    # GGUF: a hand-written v3 file: a few metadata kinds and one tensor (model load fails: not a
    # whole model; kiln convert seeds whole ones at test time)
    def gstr(s):
        b = s.encode(); return struct.pack("<Q", len(b)) + b
    kv = [(gstr("general.architecture") + struct.pack("<I", 8) + gstr("llama")),
          (gstr("llama.block_count") + struct.pack("<II", 4, 1)),
          (gstr("llama.rope.freq_base") + struct.pack("<If", 6, 10000.0)),
          (gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + gstr("a") + gstr("b")),
          (gstr("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<ff", 0.0, -1.0))]
    ti = gstr("token_embd.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 4, 2) + struct.pack("<IQ", 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv)) + b"".join(kv) + ti
    head += b"\0" * (-len(head) % 32)
    put(root, "gguf", "handmade_v3.gguf", head + f32(8))


def shrink_tokenizer(tj, keep=400):
    """A tokenizer.json cut to its first `keep` ids (merges among them), added tokens renumbered
    after them: the real normalizer / pre-tokenizer / decoder / post-processor at a fuzzable size."""
    m = tj.get("model", {})
    voc = m.get("vocab")
    if isinstance(voc, dict):
        kept = {k: v for k, v in voc.items() if v < keep}
        m["vocab"] = kept
        merges = []
        for mg in m.get("merges", []):
            a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
            if a in kept and b in kept and a + b in kept:
                merges.append(mg)
        m["merges"] = merges
    remap = {}
    for i, t in enumerate(tj.get("added_tokens", [])[:16]):
        remap[t["id"]] = keep + i
        t["id"] = keep + i
    tj["added_tokens"] = tj.get("added_tokens", [])[:16]
    pp = json.dumps(tj.get("post_processor"))
    tj["post_processor"] = json.loads(pp) if pp else None
    sp = (tj.get("post_processor") or {}).get("special_tokens") or {}
    for v in sp.values():
        v["ids"] = [remap.get(i, i % keep) for i in v.get("ids", [])]
    return tj


# ggml type id → (weights per block, bytes per block, byte offsets of its f16 scales) (ggml-common.h)
GGUF_BLOCKS = {3: (32, 20, (0, 2)), 6: (32, 22, (0,)), 7: (32, 24, (0, 2)), 20: (32, 18, (0,)), 10: (256, 84, (80, 82)),
               11: (256, 110, (108,)), 12: (256, 144, (0, 2)), 13: (256, 176, (0, 2)), 14: (256, 210, (208,)), 23: (256, 136, (0,))}


def block_quant_gguf(path, types):
    """The GGUF at path with its 2-D tensors rewritten as random blocks of `types` in turn."""
    import random
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
    import gguf_edit
    rnd = random.Random(21)
    kv, tensors = gguf_edit.load(path)
    out, k = [], 0
    for name, ne, gt, data in tensors:
        if len(ne) == 2:
            t = types[k % len(types)]
            k += 1
            elems, nb, f16s = GGUF_BLOCKS[t]
            blocks = []
            for _ in range(ne[0] * ne[1] // elems):
                b = bytearray(rnd.getrandbits(8) for _ in range(nb))
                for o in f16s:
                    b[o:o + 2] = struct.pack("<H", 0x1000 + rnd.getrandbits(10))
                blocks.append(bytes(b))
            out.append((name, ne, t, b"".join(blocks)))
        else:
            out.append((name, ne, gt, data))
    p = path + ".blocks"
    gguf_edit.save(p, kv, out)
    return open(p, "rb").read()


def runtime(root, kiln, shared):
    tmp = tempfile.mkdtemp(prefix="kiln-seeds-")
    try:
        shapes = ["--dim", "16", "--ffn", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--vocab", "32", "--seq", "32"]
        for arch in ["llama", "glm4", "chatglm", "glm4_moe", "deepseek_v3", "kimi_k2", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa",
                     "glm_moe_dsa-shared"]:
            d = os.path.join(tmp, arch)
            if arch == "glm_moe_dsa-shared":  # indexer_types full/shared: 4 layers, the preset's own count
                cmd = [kiln, "mkmodel", "--arch", "glm_moe_dsa", "--preset", "tiny-shared"] + [x for i, x in enumerate(shapes)
                                                                                              if shapes[i - 1] != "--layers" and x != "--layers"]
            else:
                cmd = [kiln, "mkmodel", "--arch", arch] + ([] if arch == "llama" else ["--preset", "tiny"]) + shapes
            if arch not in ("llama", "glm4", "chatglm"):
                cmd += ["--dtype", "bf16"]
            if subprocess.run(cmd + [d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
                continue
            cfg = open(os.path.join(d, "config.json"), "rb").read()
            st = open(os.path.join(d, "model.safetensors"), "rb").read()
            put(root, "hf", arch + ".bin", cfg + SPLIT + st)
            put(root, "safetensors", arch + ".safetensors", st)
            g = os.path.join(tmp, arch + ".gguf")
            if subprocess.run([kiln, "convert", d, g], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                put(root, "gguf", arch + ".gguf", open(g, "rb").read())
        # GGUFs whose weights are GGUF block quants (random blocks, f16 scales fixed small): the
        # blocks of 32 on a 32-wide model, the super-blocks of 256 on a 256-wide one
        for label, dim, types in (("blocks32", 32, (3, 6, 7, 20)), ("kquants", 256, (10, 11, 12, 13, 14, 23))):
            d, g = os.path.join(tmp, label), os.path.join(tmp, label + ".gguf")
            cmd = [kiln, "mkmodel", "--arch", "llama", "--dim", str(dim), "--ffn", str(dim), "--layers", "1", "--heads", "2",
                   "--kv-heads", "1", "--vocab", "32", "--seq", "32", d]
            if (subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0 and
                    subprocess.run([kiln, "convert", d, g], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0):
                put(root, "gguf", label + ".gguf", block_quant_gguf(g, types))
        # a GGUF with a llama (SentencePiece) tokenizer: the handmade llama2.c checkpoint converted
        d = os.path.join(tmp, "l2c")
        os.makedirs(d)
        open(os.path.join(d, "model.bin"), "wb").write(llama2c())
        open(os.path.join(d, "tokenizer.bin"), "wb").write(tokbin(TOK_PIECES))
        g = os.path.join(tmp, "l2c.gguf")
        if subprocess.run([kiln, "convert", os.path.join(d, "model.bin"), g], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            put(root, "gguf", "llama2c_tok.gguf", open(g, "rb").read())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not shared or not os.path.isdir(shared):
        return
    p = lambda *a: os.path.join(shared, *a)
    ck = llama2c(vocab=512)
    for name in ["models/stories260K/tok512.bin", "models/tiny-llama-hd64/tok512.bin"]:
        if os.path.exists(p(name)):
            put(root, "llama2c", name.replace("/", "_"), ck + SPLIT + open(p(name), "rb").read())
    for name in ["deepseek-v3", "qwen3"]:
        tjp, tcp = p("tokenizers", name, "tokenizer.json"), p("tokenizers", name, "tokenizer_config.json")
        if not os.path.exists(tjp):
            continue
        tj = shrink_tokenizer(json.load(open(tjp, encoding="utf-8")))
        tc = json.load(open(tcp, encoding="utf-8")) if os.path.exists(tcp) else {}
        tmpl = tc.pop("chat_template", None)
        tc.pop("added_tokens_decoder", None)
        text = "Hello world! 12345 caf\u00e9 \u4f60\u597d <|im_start|> \n\n  tabs\t\u00a0x".encode()
        put(root, "tokenizer", name + "_small.bin", json.dumps(tj).encode() + SPLIT + json.dumps(tc).encode() + SPLIT + text)
        if isinstance(tmpl, str):
            put(root, "chat_template", name + ".txt", tmpl.encode() + SPLIT + json.dumps(MESSAGES_PLAIN).encode() + SPLIT +
                json.dumps({"bos_token": "<s>", "eos_token": "</s>"}).encode())
    for name in ["glm-4.6.jinja", "kimi-k2.jinja"]:
        if os.path.exists(p("tokenizers", "templates", name)):
            put(root, "chat_template", name + ".txt", open(p("tokenizers", "templates", name), "rb").read() + SPLIT +
                json.dumps(MESSAGES_PLAIN).encode())
    gv = p("tokenizers", "gguf-vocab")
    if os.path.isdir(gv):
        for f in sorted(os.listdir(gv)):
            if f.endswith(".gguf") and os.path.getsize(os.path.join(gv, f)) < (2 << 20):
                put(root, "gguf", f, open(os.path.join(gv, f), "rb").read())
    # eval: the first records of the real sets (fuzz_eval's selector byte first)
    head = lambda path, n: b"".join(open(path, "rb").readlines()[:n])
    d = p("data")
    if os.path.exists(os.path.join(d, "arc", "arc_easy.jsonl")):
        put(root, "eval", "arc_easy_head.bin", b"\x00" + head(os.path.join(d, "arc", "arc_easy.jsonl"), 4))
    if os.path.exists(os.path.join(d, "gsm8k", "test.jsonl")) and os.path.exists(os.path.join(d, "gsm8k", "train.jsonl")):
        put(root, "eval", "gsm8k_head.bin", b"\x07" + head(os.path.join(d, "gsm8k", "test.jsonl"), 3) + SPLIT +
            head(os.path.join(d, "gsm8k", "train.jsonl"), 3))
    mt, md = os.path.join(d, "mmlu", "test", "anatomy_test.csv"), os.path.join(d, "mmlu", "dev", "anatomy_dev.csv")
    if os.path.exists(mt) and os.path.exists(md):
        put(root, "eval", "mmlu_head.bin", b"\x08" + head(mt, 4) + SPLIT + head(md, 3))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "committed":
        committed(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "runtime":
        runtime(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        sys.exit(__doc__)
