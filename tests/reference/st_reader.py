"""Minimal independent safetensors reader for the reference models (no python3-safetensors needed).

Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
then the data region. Returns float32 torch tensors. Quantized linear weights are dequantized to
their plain `<prefix>.weight` name, following the checkpoint conventions:
  FP8 block:  <p>.weight (F8_E4M3) × <p>.weight_scale_inv (F32, one per B×B block)
  INT4 compressed-tensors (pack-quantized, symmetric): <p>.weight_packed (I32 [out, in/8], eight
              4-bit values per int32, lowest nibble first, stored offset by +8) × <p>.weight_scale
              (BF16 [out, in/group]).
"""
import json
import os
import struct

import numpy as np
import torch


def _fp8_e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


_FP8 = _fp8_e4m3_table()


def _decode(dtype, raw, shape):
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F8_E4M3":
        a = _FP8[np.frombuffer(raw, dtype=np.uint8)]
    elif dtype == "I32":
        return torch.from_numpy(np.frombuffer(raw, dtype="<i4").reshape(shape).copy())
    elif dtype == "I64":
        return torch.from_numpy(np.frombuffer(raw, dtype="<i8").reshape(shape).copy())
    else:
        raise ValueError("unsupported dtype " + dtype)
    return torch.from_numpy(a.reshape(shape).astype(np.float32).copy())


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = _decode(info["dtype"], data[base + a:base + b], info["shape"])
    return out


def _dequant(t, block=128):
    names = list(t.keys())
    for name in names:
        if name.endswith(".weight_scale_inv") and name[:-len("_scale_inv")] in t:
            w = name[:-len("_scale_inv")]
            q, s = t[w], t[name]
            r, c = q.shape
            sf = s.repeat_interleave(block, 0)[:r].repeat_interleave(block, 1)[:, :c]
            t[w] = q * sf
            del t[name]
        elif name.endswith(".weight_packed"):
            p = name[:-len(".weight_packed")]
            packed = t[name].to(torch.int64) & 0xFFFFFFFF
            scale = t[p + ".weight_scale"]
            rows, cols8 = packed.shape
            nib = torch.stack([(packed >> (4 * k)) & 0xF for k in range(8)], dim=-1).reshape(rows, cols8 * 8)
            q = nib.to(torch.float32) - 8.0
            group = q.shape[1] // scale.shape[1]
            t[p + ".weight"] = q * scale.repeat_interleave(group, 1)
            for k in (name, p + ".weight_scale", p + ".weight_shape"):
                t.pop(k, None)
    return t


def load_dir(d):
    """All tensors of a Hugging Face directory (single file or sharded via the index), dequantized."""
    idx = os.path.join(d, "model.safetensors.index.json")
    t = {}
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            t.update(read_file(os.path.join(d, fn)))
    else:
        t.update(read_file(os.path.join(d, "model.safetensors")))
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.get("quantization_config") or {}
    block = (qc.get("weight_block_size") or [128, 128])[0]
    return _dequant(t, block), cfg


def write_file(path, tensors):
    """tensors: {name: (dtype string, shape list, raw bytes)} → a safetensors file (8-byte aligned header)."""
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        dt, shape, raw = tensors[name]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_raw(path):
    """{name: (dtype, shape, raw bytes)} without decoding."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    return {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}
