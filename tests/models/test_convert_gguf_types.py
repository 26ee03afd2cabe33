"""kiln convert --outtype q8_0|q4_0 [--tokenizer PATH]: the GGUF it writes holds every 2-D weight in
the asked block type, byte for byte what ggml's reference quantizers (quantize_row_q8_0_ref /
quantize_row_q4_0_ref, re-implemented here from their published description in float32 arithmetic)
make of the source values; norms as F32 (llama.cpp's converter convention, for every outtype); the tokenizer from the
given file; and the file loads and generates in kiln. Bad --outtype / --tokenizer get clear errors."""
import json, math, os, struct, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import gguf_edit  # noqa: E402
from kiln_cli import run  # noqa: E402

SHARED = os.environ.get("SHARED", "../shared")
VOCAB = os.path.join(SHARED, "tokenizers/gguf-vocab/ggml-vocab-llama-spm.gguf")
GGML_F32, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 2, 8, 30


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16_bytes(x):
    return struct.pack("<e", x)


def q8_0_ref(row):
    """ggml quantize_row_q8_0_ref: d = amax / 127, id = 1 / d (0 if d == 0), q = roundf(x · id)."""
    out = b""
    for b in range(0, len(row), 32):
        xs = row[b:b + 32]
        amax = max(abs(v) for v in xs)
        d = f32(amax / 127.0)
        idv = f32(1.0 / d) if d else 0.0
        qs = []
        for v in xs:
            p = f32(v * idv)
            qs.append(int(math.floor(abs(p) + 0.5)) * (1 if p >= 0 else -1))  # roundf: halves away from 0
        out += f16_bytes(d) + struct.pack("<32b", *qs)
    return out


def q4_0_ref(row):
    """ggml quantize_row_q4_0_ref: max = the value of largest |x| (first on ties), d = max / -8,
    id = 1 / d, q = min(15, (int8)(x · id + 8.5)); element i in the low nibble of byte i, i + 16 high."""
    out = b""
    for b in range(0, len(row), 32):
        xs = row[b:b + 32]
        amax, mx = 0.0, 0.0
        for v in xs:
            if abs(v) > amax:
                amax, mx = abs(v), v
        d = f32(mx / -8.0)
        idv = f32(1.0 / d) if d else 0.0
        q = [min(15, int(f32(f32(v * idv) + 8.5))) for v in xs]  # C truncation toward zero
        out += f16_bytes(d) + bytes(q[i] | (q[i + 16] << 4) for i in range(16))
    return out


def safetensors_f32(path, name):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])[name]
    assert h["dtype"] == "F32", h
    s, e = h["data_offsets"]
    raw = b[8 + n + s:8 + n + e]
    cols = h["shape"][1]
    vals = struct.unpack(f"<{len(raw) // 4}f", raw)
    return [list(vals[i:i + cols]) for i in range(0, len(vals), cols)]


# Mistral-Instruct's template in outline: a SentencePiece GGUF carrying tokenizer.chat_template
MISTRAL_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
                    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
MESSAGES = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "again"}]
# llama.cpp's llama-tokenize (de3ff81) of the rendered prompt with --no-bos: <s> and </s> as the
# control tokens 1 and 2, "[INST]" after <s> with the space symbol in front
MISTRAL_IDS = [1, 518, 25580, 29962, 6324, 727, 518, 29914, 25580, 29962, 10994, 29991, 2, 518, 25580, 29962, 1449, 518,
               29914, 25580, 29962]


def check_spm_chat_template(tmp, gguf):
    """The chat template of a SentencePiece GGUF is used, its rendered prompt tokenized with the
    special tokens it writes, and kept by convert (GGUF and Hugging Face directory)."""
    kv, tensors = gguf_edit.load(gguf)
    gguf_edit.set_kv(kv, "tokenizer.chat_template", gguf_edit.STR, MISTRAL_TEMPLATE)
    with_t = os.path.join(tmp, "m-template.gguf")
    gguf_edit.save(with_t, kv, tensors)
    msgs = os.path.join(tmp, "messages.json")
    json.dump(MESSAGES, open(msgs, "w"))
    want = "<s>[INST] Hi there [/INST]Hello!</s>[INST] again [/INST]"
    back_gguf, back_hf = os.path.join(tmp, "m-template-back.gguf"), os.path.join(tmp, "m-template-hf")
    run("convert", with_t, back_gguf)
    run("convert", with_t, back_hf)
    assert json.load(open(os.path.join(back_hf, "tokenizer_config.json")))["chat_template"] == MISTRAL_TEMPLATE
    for model in (with_t, back_gguf, back_hf):
        text = run("chat-template", model, "--messages", msgs).stdout
        assert text == want, f"{model}: rendered {text!r}"
        ids = json.loads(run("tokenize", model, "--json", "--no-bos", text).stdout)["ids"]
        assert ids == MISTRAL_IDS, f"{model}: {ids}"


def main():
    tmp = tempfile.mkdtemp(prefix="kiln_convert_types_")
    src = os.path.join(tmp, "src")
    # ffn 192: every 2-D weight's columns a multiple of 32 (others would stay as stored)
    run("mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", "32000", "--ffn", "192", "--dtype", "f32", src)
    rows = safetensors_f32(os.path.join(src, "model.safetensors"), "model.layers.0.mlp.down_proj.weight")
    checked = 0
    for outtype, gtype, ftype, ref in (("q8_0", GGML_Q8_0, 7, q8_0_ref), ("q4_0", GGML_Q4_0, 2, q4_0_ref)):
        out = os.path.join(tmp, f"m-{outtype}.gguf")
        run("convert", src, out, "--outtype", outtype, "--tokenizer", VOCAB)
        kv, tensors = gguf_edit.load(out)
        meta = {k: v for k, _, v in kv}
        assert meta["general.file_type"] == ftype, meta["general.file_type"]
        assert meta["tokenizer.ggml.model"] == "llama", meta.get("tokenizer.ggml.model")
        assert len(meta["tokenizer.ggml.tokens"][1]) == 32000
        for name, ne, t, data in tensors:
            want = gtype if len(ne) == 2 else GGML_F32
            assert t == want, f"{outtype}: {name} has ggml type {t}, want {want}"
            if name == "blk.0.ffn_down.weight":
                exp = b"".join(ref(r) for r in rows)
                assert data == exp, f"{outtype}: {name} differs from ggml's reference quantizer"
                checked += 1
        p = run("run", out, "--tokens", "1,2,3", "-n", "4", "--temp", "0")
        assert p.stdout.strip() or p.stderr, "no output"
    assert checked == 2
    # the default outtype keeps a BF16 checkpoint's weights BF16 and writes its norms F32, as
    # llama.cpp's converter does (ggml's CPU element-wise ops refuse a BF16 norm: llama.cpp aborts
    # with "binary_op: unsupported types" on such a file)
    bf = os.path.join(tmp, "bf16")
    run("mkmodel", "--arch", "llama", "--preset", "tiny", "--vocab", "32000", "--ffn", "192", "--dtype", "bf16", bf)
    out = os.path.join(tmp, "m-bf16.gguf")
    run("convert", bf, out, "--tokenizer", VOCAB)
    _, tensors = gguf_edit.load(out)
    for name, ne, t, data in tensors:
        want = GGML_BF16 if len(ne) == 2 else GGML_F32
        assert t == want, f"bf16: {name} has ggml type {t}, want {want}"
    assert sum(len(ne) == 1 for _, ne, _, _ in tensors) == 5, "the 2 layers' 4 norms and the final norm"
    check_spm_chat_template(tmp, out)
    # bad input: named option and value
    p = run("convert", src, os.path.join(tmp, "x.gguf"), "--outtype", "q5_1", ok=False)
    assert "--outtype" in p.stderr and "q5_1" in p.stderr, p.stderr
    p = run("convert", src, os.path.join(tmp, "hf"), "--format", "hf", "--outtype", "q8_0", ok=False)
    assert "--outtype" in p.stderr, p.stderr
    small = os.path.join(tmp, "small")
    run("mkmodel", "--arch", "llama", "--preset", "tiny", "--dtype", "f32", small)  # vocab 256 < 32000
    p = run("convert", small, os.path.join(tmp, "y.gguf"), "--tokenizer", VOCAB, ok=False)
    assert "32000" in p.stderr and "256" in p.stderr, p.stderr
    print("convert --outtype q8_0 / q4_0: types, reference bytes, tokenizer and errors as expected")


if __name__ == "__main__":
    main()
