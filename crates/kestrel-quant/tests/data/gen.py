#!/usr/bin/env python3
"""Make kestrel-quant's reference test data.

Run with the `gguf` Python package, version 0.19.0, and numpy (2.x):
    python3 -m venv /tmp/qvenv && /tmp/qvenv/bin/pip install gguf==0.19.0 numpy
    /tmp/qvenv/bin/python crates/kestrel-quant/tests/data/gen.py [models_dir]

What it writes next to itself (all little-endian, no headers):
  dequant/<T>.bin, dequant/<T>.f32   random blocks of type T (f16 scale fields replaced by sane
                                     random halves) and gguf.quants.dequantize() of them
  quant/<T>.in.f32, quant/<T>.out    random f32 rows and gguf.quants.quantize() of them, for the
                                     types gguf can quantize (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
                                     Q8_0), plus Q8_1 and Q8_K from the numpy ports below of
                                     llama.cpp's quantize_row_q8_1_ref / quantize_row_q8_K_ref
                                     (gguf has no quantizer for those two)
  models.txt                         for each tensor type in each real model: one tensor, three
                                     rows (first, second, last), and the FNV-1a 64 hash of the
                                     f32 bits gguf dequantizes them to, plus the first 4 values
The seed is fixed, so running it again reproduces the files byte for byte.
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf.quants import dequantize, quantize, np_roundf

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261130)

# (type, block bytes, block elements, byte offsets of f16 scale fields, blocks to make)
DEQUANT = [
    (T.F32, 4, 1, [], 512),
    (T.F16, 2, 1, [0], 512),
    (T.BF16, 2, 1, [], 512),
    (T.Q4_0, 18, 32, [0], 64),
    (T.Q4_1, 20, 32, [0, 2], 64),
    (T.Q5_0, 22, 32, [0], 64),
    (T.Q5_1, 24, 32, [0, 2], 64),
    (T.Q8_0, 34, 32, [0], 64),
    (T.Q2_K, 84, 256, [80, 82], 16),
    (T.Q3_K, 110, 256, [108], 16),
    (T.Q4_K, 144, 256, [0, 2], 16),
    (T.Q5_K, 176, 256, [0, 2], 16),
    (T.Q6_K, 210, 256, [208], 16),
]


def write(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def gen_dequant():
    for t, nbytes, _, halves, nblocks in DEQUANT:
        if t == T.F32:
            raw = rng.standard_normal(nblocks).astype(np.float32).view(np.uint8)
        elif t == T.BF16:
            raw = (rng.standard_normal(nblocks).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        else:
            raw = rng.integers(0, 256, size=(nblocks, nbytes), dtype=np.uint8)
            for off in halves:
                h = (rng.standard_normal(nblocks) * 0.05).astype(np.float16)
                raw[:, off:off + 2] = h.view(np.uint8).reshape(nblocks, 2)
        raw = np.ascontiguousarray(raw).reshape(-1)
        out = dequantize(raw, t).astype(np.float32).reshape(-1)
        write(f"{HERE}/dequant/{t.name}.bin", raw)
        write(f"{HERE}/dequant/{t.name}.f32", out)


def q8_1_ref(x):
    """llama.cpp quantize_row_q8_1_ref: Q8_0 plus s = fp16(sum(q) * d)."""
    b = x.reshape(-1, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    qs = np_roundf(b * idv).astype(np.int8)
    s = qs.astype(np.int32).sum(axis=1, keepdims=True).astype(np.float32) * d
    return np.concatenate([d.astype(np.float16).view(np.uint8), s.astype(np.float16).view(np.uint8),
                           qs.view(np.uint8)], axis=1).reshape(-1)


def nearest_int(f):
    v = (f.astype(np.float32) + np.float32(12582912.0)).astype(np.float32)
    return (v.view(np.int32) & 0x007FFFFF) - 0x00400000


def q8_k_ref(x):
    """llama.cpp quantize_row_q8_K_ref (all-zero blocks get zero bsums)."""
    out = []
    for b in x.reshape(-1, 256):
        imax = int(np.abs(b).argmax())
        mx = b[imax]
        if np.abs(b).max() == 0:
            out.append(np.zeros(292, dtype=np.uint8))
            continue
        iscale = np.float32(-127.0) / np.float32(mx)
        q = np.minimum(127, nearest_int(iscale * b)).astype(np.int8)
        bsums = q.reshape(16, 16).astype(np.int16).sum(axis=1).astype(np.int16)
        d = np.array([np.float32(1.0) / iscale], dtype=np.float32)
        out.append(np.concatenate([d.view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)]))
    return np.concatenate(out)


def gen_quant():
    for t, nblocks in [(T.F16, 256), (T.BF16, 256), (T.Q4_0, 64), (T.Q4_1, 64), (T.Q5_0, 64),
                       (T.Q5_1, 64), (T.Q8_0, 64), (T.Q8_1, 64), (T.Q8_K, 16)]:
        blk = 1 if t in (T.F16, T.BF16) else (256 if t == T.Q8_K else 32)
        x = (rng.standard_normal(nblocks * blk) * rng.choice([0.01, 1.0, 30.0], size=nblocks * blk)).astype(np.float32)
        if blk > 1:
            x[:blk] = 0.0  # an all-zero block
            x[blk:2 * blk] = np.round(x[blk:2 * blk] * 4) / 4  # many exact ties
        if t == T.Q8_1:
            out = q8_1_ref(x)
        elif t == T.Q8_K:
            out = q8_k_ref(x)
        else:
            out = quantize(x.reshape(-1, blk), t).reshape(-1)
        write(f"{HERE}/quant/{t.name}.in.f32", x)
        write(f"{HERE}/quant/{t.name}.out", out)


def fnv64(b):
    h = 0xcbf29ce484222325
    for byte in b:
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def gen_models(models_dir):
    lines = ["# model tensor type row n_per_row fnv1a64(f32 LE bits) first4"]
    for name in ["smollm2-135m-instruct-q4_1.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                 "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]:
        path = os.path.join(models_dir, name)
        if not os.path.exists(path):
            print("missing", path)
            continue
        r = GGUFReader(path)
        seen = set()
        for t in r.tensors:
            qt = T(t.tensor_type)
            if qt in seen:
                continue
            seen.add(qt)
            n = int(t.shape[0])
            rows = int(t.n_elements) // n
            raw = np.asarray(t.data).view(np.uint8).reshape(-1)
            row_bytes = raw.size // rows
            for row in sorted({0, 1, rows - 1} & set(range(rows))):
                b = raw[row * row_bytes:(row + 1) * row_bytes]
                y = dequantize(b, qt).astype(np.float32).reshape(-1)
                first = " ".join(f"{v:.9g}" for v in y[:4])
                lines.append(f"{name} {t.name} {qt.name} {row} {n} {fnv64(y.tobytes()):016x} {first}")
    with open(f"{HERE}/models.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    gen_dequant()
    gen_quant()
    gen_models(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "../../../../models"))
