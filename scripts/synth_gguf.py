#!/usr/bin/env python3
"""A GGUF of a real model's exact shapes and metadata with random weights, for timing on a
machine the real file cannot reach (the lent GPU host has no network and a 64 MiB carry).

    python3 scripts/synth_gguf.py extract MODEL.gguf DIR   # header (metadata, tensor table)
    python3 scripts/synth_gguf.py build DIR OUT.gguf [SEED]  # header + random tensor data
    python3 scripts/synth_gguf.py retype MODEL.gguf OUT.gguf f16  # every matrix F16, random
    python3 scripts/synth_gguf.py moe MODEL.gguf OUT.gguf LAYERS  # Qwen3-30B-A3B layers, Q4_K_M

`extract` copies the file up to its tensor data (tokenizer and all: a few MB) and lists the
tensors. `build` writes random quants with small block scales (so activations stay finite),
norms of 1 and small f32 elsewhere. Speed depends on shapes and types only, so the file times
like the real one; its text is meaningless (bench it with `--check-tokens 0`).
"""
import json, struct, sys
from pathlib import Path

# ggml type -> (block elements, block bytes, byte offsets of the block's f16 scales)
TYPES = {
    0: (1, 4, []),  # F32
    1: (1, 2, []),  # F16
    2: (32, 18, [0]),  # Q4_0
    3: (32, 20, [0, 2]),  # Q4_1
    6: (32, 22, [0]),  # Q5_0
    7: (32, 24, [0, 2]),  # Q5_1
    8: (32, 34, [0]),  # Q8_0
    12: (256, 144, [0, 2]),  # Q4_K: d, dmin
    13: (256, 176, [0, 2]),  # Q5_K
    14: (256, 210, [208]),  # Q6_K: d last
    30: (1, 2, []),  # BF16
}


SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read(f, fmt):
    return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]


def read_value(f, t):
    """One metadata value of GGUF type id `t` at f's position."""
    if t == 8:
        return f.read(read(f, "Q")).decode("utf-8", "replace")
    if t == 9:
        et, n = read(f, "I"), read(f, "Q")
        return [read_value(f, et) for _ in range(n)]
    return read(f, SCALAR[t])


def raw_value(f, t):
    """The encoded bytes of the metadata value at f's position (read past it)."""
    start = f.tell()
    read_value(f, t)
    end = f.tell()
    f.seek(start)
    return f.read(end - start)


def read_header(path):
    f = open(path, "rb")
    rd = lambda fmt: read(f, fmt)
    rstr = lambda: f.read(rd("Q")).decode("utf-8", "replace")
    value = lambda t: read_value(f, t)

    if f.read(4) != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    version, n_tensors, n_kv = rd("I"), rd("Q"), rd("Q")
    align = 32
    for _ in range(n_kv):
        key, t = rstr(), rd("I")
        v = value(t)
        if key == "general.alignment":
            align = v
    tensors = []
    for _ in range(n_tensors):
        name = rstr()
        dims = [rd("Q") for _ in range(rd("I"))]
        ty, off = rd("I"), rd("Q")
        n = 1
        for d in dims:
            n *= d
        if ty not in TYPES:
            sys.exit(f"{name}: ggml type {ty} not supported here")
        blk, size, _ = TYPES[ty]
        tensors.append({"name": name, "type": ty, "offset": off, "bytes": n // blk * size})
    data_start = -(-f.tell() // align) * align
    return version, data_start, tensors


def extract(model, out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    version, start, tensors = read_header(model)
    with open(model, "rb") as f:
        (out / "header.bin").write_bytes(f.read(start))
    (out / "tensors.json").write_text(json.dumps({"data_start": start, "tensors": tensors}))
    print(f"GGUF v{version}: {len(tensors)} tensors, header {start} bytes -> {out}")


def build(src, out, seed=0):
    src = Path(src)
    meta = json.loads((src / "tensors.json").read_text())
    with open(out, "wb") as f:
        f.write((src / "header.bin").read_bytes())
        write_data(f, meta["data_start"], meta["tensors"], seed)
    print(f"wrote {out}")


def write_data(f, base, tensors, seed):
    """Random data for `tensors` (name, type, offset, bytes) at `base + offset` of `f`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for t in sorted(tensors, key=lambda t: t["offset"]):
        pad = base + t["offset"] - f.tell()
        f.write(b"\0" * pad)
        blk, size, scales = TYPES[t["type"]]
        if t["type"] == 0:
            n = t["bytes"] // 4
            v = np.ones(n, np.float32) if "norm" in t["name"] else rng.normal(0, 0.02, n).astype(np.float32)
            f.write(v.tobytes())
            continue
        if blk == 1:
            n = t["bytes"] // 2
            f.write(rng.normal(0, 0.02, n).astype(np.float16).tobytes())
            continue
        data = rng.integers(0, 256, t["bytes"], dtype=np.uint8).reshape(-1, size)
        for at in scales:
            # f16 scale in [0.0005, 0.002): finite, so layers stay finite
            s = rng.uniform(0.0005, 0.002, data.shape[0]).astype(np.float16)
            data[:, at:at + 2] = s.view(np.uint8).reshape(-1, 2)
        f.write(data.tobytes())


def moe(model, out, n_layers, seed=0):
    """A Qwen3-30B-A3B-shape file (hidden 2048, 128 experts of 768, 8 used, 32 q / 4 kv heads
    of 128) with `n_layers` layers, MODEL's tokenizer (a Qwen vocabulary of 151,936), tensor
    types as llama.cpp's Q4_K_M gives them for this shape, random data."""
    f = open(model, "rb")
    rd = lambda fmt: read(f, fmt)
    rstr = lambda: f.read(rd("Q"))
    assert f.read(4) == b"GGUF"
    _, _, n_kv = rd("I"), rd("Q"), rd("Q")
    kvs = []
    for _ in range(n_kv):
        key = rstr()
        t = rd("I")
        v = raw_value(f, t)
        if key.startswith(b"tokenizer."):
            kvs.append((key, t, v))
    n, L = 2048, n_layers
    ffn, experts, used, heads, kv_heads, hd, vocab = 768, 128, 8, 32, 4, 128, 151936
    u32 = lambda x: (4, struct.pack("<I", x))
    f32 = lambda x: (6, struct.pack("<f", x))
    sval = lambda x: (8, struct.pack("<Q", len(x)) + x.encode())
    arch = [("general.architecture", sval("qwen3moe")), ("general.name", sval(f"Qwen3-30B-A3B-shape {L} layers")),
            ("general.file_type", u32(15)), ("general.quantization_version", u32(2)),
            ("qwen3moe.block_count", u32(L)), ("qwen3moe.context_length", u32(40960)),
            ("qwen3moe.embedding_length", u32(n)), ("qwen3moe.feed_forward_length", u32(6144)),
            ("qwen3moe.attention.head_count", u32(heads)), ("qwen3moe.attention.head_count_kv", u32(kv_heads)),
            ("qwen3moe.attention.key_length", u32(hd)), ("qwen3moe.attention.value_length", u32(hd)),
            ("qwen3moe.rope.freq_base", f32(1e6)), ("qwen3moe.attention.layer_norm_rms_epsilon", f32(1e-6)),
            ("qwen3moe.expert_count", u32(experts)), ("qwen3moe.expert_used_count", u32(used)),
            ("qwen3moe.expert_feed_forward_length", u32(ffn))]
    F32, Q4K, Q6K = 0, 12, 14
    more = lambda i: i < L // 8 or i >= 7 * L // 8 or (i - L // 8) % 3 == 2  # llama.cpp's use_more_bits
    tensors = [("token_embd.weight", [n, vocab], Q4K), ("output_norm.weight", [n], F32), ("output.weight", [n, vocab], Q6K)]
    for i in range(L):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", [n], F32), (b + "attn_q.weight", [n, heads * hd], Q4K),
                    (b + "attn_k.weight", [n, kv_heads * hd], Q4K),
                    (b + "attn_v.weight", [n, kv_heads * hd], Q6K if more(i) else Q4K),
                    (b + "attn_output.weight", [heads * hd, n], Q4K), (b + "attn_q_norm.weight", [hd], F32),
                    (b + "attn_k_norm.weight", [hd], F32), (b + "ffn_norm.weight", [n], F32),
                    (b + "ffn_gate_inp.weight", [n, experts], F32),
                    (b + "ffn_gate_exps.weight", [n, ffn, experts], Q4K), (b + "ffn_up_exps.weight", [n, ffn, experts], Q4K),
                    (b + "ffn_down_exps.weight", [ffn, n, experts], Q6K if more(i) else Q4K)]
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(arch) + len(kvs)))
    for k, (t, v) in arch:
        head += struct.pack("<Q", len(k)) + k.encode() + struct.pack("<I", t) + v
    for k, t, v in kvs:
        head += struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + v
    offset, placed = 0, []
    for name, dims, ty in tensors:
        count = 1
        for d in dims:
            count *= d
        blk, size, _ = TYPES[ty]
        nbytes = count // blk * size
        head += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ty, offset)
        placed.append({"name": name, "type": ty, "offset": offset, "bytes": nbytes})
        offset = -(-(offset + nbytes) // 32) * 32
    with open(out, "wb") as o:
        o.write(head)
        o.write(b"\0" * (-len(head) % 32))
        write_data(o, o.tell(), placed, seed)
    print(f"wrote {out}: {L} layers, {offset / 2**30:.2f} GiB of tensors")


def retype(model, out, seed=0):
    """MODEL's metadata and tensor names with every 2-D+ tensor F16 (1-D ones F32) and random
    data: an unquantized source of a real model's shapes, for comparing quantizers."""
    import numpy as np

    f = open(model, "rb")
    rd = lambda fmt: read(f, fmt)
    assert f.read(4) == b"GGUF"
    version, n_tensors, n_kv = rd("I"), rd("Q"), rd("Q")
    for _ in range(n_kv):
        f.read(rd("Q"))
        read_value(f, rd("I"))
    kv_end = f.tell()
    infos = []
    for _ in range(n_tensors):
        name = f.read(rd("Q"))
        dims = [rd("Q") for _ in range(rd("I"))]
        rd("I"), rd("Q")
        infos.append((name, dims, 1 if len(dims) >= 2 else 0))
    f.seek(0)
    head = bytearray(f.read(kv_end))
    offset = 0
    placed = []
    for name, dims, ty in infos:
        n = 1
        for d in dims:
            n *= d
        head += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ty, offset)
        placed.append((n, ty, offset))
        offset = -(-(offset + n * (2 if ty == 1 else 4)) // 32) * 32
    rng = np.random.default_rng(seed)
    with open(out, "wb") as o:
        o.write(head)
        o.write(b"\0" * (-len(head) % 32))
        base = o.tell()
        for n, ty, off in placed:
            o.write(b"\0" * (base + off - o.tell()))
            v = rng.normal(0, 0.02, n)
            o.write((v.astype(np.float16) if ty == 1 else (1 + v).astype(np.float32)).tobytes())
    print(f"wrote {out}: {len(infos)} tensors, every matrix F16")


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "moe":
        moe(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        sys.exit(0)
    if len(sys.argv) >= 4 and sys.argv[1] == "retype":
        retype(sys.argv[2], sys.argv[3])
        sys.exit(0)
    if len(sys.argv) >= 4 and sys.argv[1] == "extract":
        extract(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    else:
        sys.exit(__doc__)
