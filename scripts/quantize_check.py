#!/usr/bin/env python3
"""kestrel-quantized files in llama.cpp (the peer package), side by side with kestrel.

    python3 scripts/quantize_check.py            # after: cargo build --release -p kestrel-cli

1. Each tiny model's safetensors folder is quantized to q8_0 by `kestrel quantize`; llama.cpp
   loads the file and its logits at the first prompt position are compared with kestrel's
   (`kestrel logits`) on the same file: max-abs difference, goal < 1e-2.
2. A random-weight F16 GGUF of Qwen2.5-0.5B's shapes (its real header: tokenizer and all) is
   quantized to q4_k_m by kestrel and by llama.cpp's quantizer (`llama_model_quantize`): the
   type of every tensor must be the same, and the sizes within 1%.
Runs inside the peers venv (shared/peers/llamacpp_bench.py installs it).
"""
import ctypes, json, os, struct, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from synth_gguf import read_header  # noqa: E402
KESTREL = ROOT / "target/release/kestrel"
VENV_PY = Path(os.environ.get("KESTREL_PEERS", Path.home() / ".cache/kestrel-peers")) / "venv/bin/python3"

try:
    import llama_cpp
    import numpy as np
except ImportError:
    if not VENV_PY.exists():
        sys.exit(f"no peers venv at {VENV_PY}: run shared/peers/llamacpp_bench.py once to install it")
    os.execv(str(VENV_PY), [str(VENV_PY), __file__, *sys.argv[1:]])


def kestrel(*args):
    return subprocess.run([str(KESTREL), *map(str, args)], check=True, capture_output=True, text=True).stdout


def read_tensors(path):
    """A safetensors file: {name: (dtype, shape, bytes)}."""
    b = Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], b[8 + n + s:8 + n + e])
    return out


def gguf_types(path, with_data=False):
    """{tensor name: ggml type id} of a GGUF file (with `with_data`: {name: (type, bytes)})."""
    _, start, tensors = read_header(path)
    if not with_data:
        return {t["name"]: t["type"] for t in tensors}
    data = Path(path).read_bytes()
    at = lambda t: start + t["offset"]
    return {t["name"]: (t["type"], data[at(t):at(t) + t["bytes"]]) for t in tensors}


def tiny_logits(tmp):
    worst = 0.0
    for arch in ["llama", "qwen2", "qwen3", "qwen3_moe"]:
        folder = ROOT / "testdata/tiny" / f"tiny-{arch}"
        out = tmp / f"{arch}-q8_0.gguf"
        kestrel("quantize", folder, out, "--type", "q8_0", "-t", "2")
        ref = read_tensors(folder / "reference.safetensors")
        ids = list(np.frombuffer(ref["tokens_2"][2], dtype=np.int32))
        kestrel("logits", "-m", out, "--prompt-ids", ",".join(map(str, ids)), "--out", tmp / "k.safetensors", "-t", "2", "--kv-type", "f16")
        ours = np.frombuffer(read_tensors(tmp / "k.safetensors")["logits"][2], dtype=np.float32).reshape(len(ids), -1)
        llm = llama_cpp.Llama(model_path=str(out), n_ctx=128, n_threads=2, logits_all=True, verbose=False)
        llm.eval(ids)
        theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)
        first = float(np.abs(ours[0] - theirs[0]).max())
        every = float(np.abs(ours - theirs).max())
        worst = max(worst, first)
        same = int(ours.argmax(-1).tolist() == theirs.argmax(-1).tolist())
        print(f"{arch:10} q8_0 by kestrel, in llama.cpp: first-position max-abs logit diff {first:.2e} "
              f"(all {len(ids)} positions {every:.2e}); argmax equal at every position: {bool(same)}")
        del llm
    print(f"worst first-position difference {worst:.2e} (goal < 1e-2): {'ok' if worst < 1e-2 else 'MISSED'}")
    return worst < 1e-2


def q4_k_m_types(tmp):
    model = ROOT / "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not model.exists():
        print(f"skip the q4_k_m comparison: {model} missing (scripts/fetch-models.sh)")
        return True
    # the real header with every tensor F16 (1-D ones F32), random data
    f16 = tmp / "qwen2.5-0.5b-shape-f16.gguf"
    subprocess.run([sys.executable, ROOT / "scripts/synth_gguf.py", "retype", model, f16, "f16"], check=True)
    ours, theirs = tmp / "kestrel-q4_k_m.gguf", tmp / "llamacpp-q4_k_m.gguf"
    kestrel("quantize", f16, ours, "--type", "q4_k_m", "-t", "2")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(theirs).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed: {rc}"
    a, b = gguf_types(ours), gguf_types(theirs)
    differ = [(n, a.get(n), b.get(n)) for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]
    da, db = gguf_types(ours, True), gguf_types(theirs, True)
    same_bytes = sum(da[n][1] == db[n][1] for n in da if n in db)
    print(f"  tensors with byte-identical data: {same_bytes} of {len(da)}")
    sa, sb = ours.stat().st_size, theirs.stat().st_size
    print(f"q4_k_m of a Qwen2.5-0.5B-shape F16 file: {len(a)} tensors; types differ on {len(differ)}"
          f"{': ' + str(differ[:5]) if differ else ''}")
    print(f"  size kestrel {sa / 2**20:.1f} MiB, llama.cpp {sb / 2**20:.1f} MiB ({100 * (sa - sb) / sb:+.2f}%)")
    return not differ and abs(sa - sb) <= 0.01 * sb


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        ok = tiny_logits(Path(d))
        ok = q4_k_m_types(Path(d)) and ok
    sys.exit(0 if ok else 1)
