#!/usr/bin/env python3
"""Dump every f32 node llama.cpp computes for one prompt (one batch) into an .npz, keyed
`{name}#{k}` (k-th node of that name). Run with the peers' venv (shared/peers/README.md):

    ~/.cache/kestrel-peers/venv/bin/python3 scripts/parity/llamacpp_dump.py MODEL.gguf 1,2,3 out.npz

Reads `struct ggml_tensor` fields by offset (ggml of October 2026: type 0, ne 16, nb 48, op 80,
data 248, name 256); see docs/parity.md.
"""
import json, sys, ctypes, numpy as np, llama_cpp
from llama_cpp import _internals
mp, ids_s, out = sys.argv[1], sys.argv[2], sys.argv[3]
ids = [int(t) for t in ids_s.split(',')]
nodes = []
def cb(t, ask, ud):
    if ask: return True
    base = ctypes.cast(t, ctypes.c_void_p).value
    ty = ctypes.c_int32.from_address(base).value
    ne = [ctypes.c_int64.from_address(base + 16 + 8*i).value for i in range(4)]
    nb = [ctypes.c_uint64.from_address(base + 48 + 8*i).value for i in range(4)]
    op = ctypes.c_int32.from_address(base + 80).value
    data = ctypes.c_void_p.from_address(base + 248).value
    name = ctypes.string_at(base + 256).decode()
    n = ne[0]*ne[1]*ne[2]*ne[3]
    if ty == 0 and nb[0] == 4 and nb[1] == 4*ne[0] and nb[2] == nb[1]*ne[1] and data:
        a = np.ctypeslib.as_array((ctypes.c_float * n).from_address(data)).copy()
        nodes.append((name, op, ne, a))
    else:
        nodes.append((name, op, ne, None))
    return True
CB = llama_cpp.ggml_backend_sched_eval_callback(cb)
orig = _internals.LlamaContext.__init__
def patched(self, *a, **kw):
    kw['params'].cb_eval = CB
    return orig(self, *a, **kw)
_internals.LlamaContext.__init__ = patched
llm = llama_cpp.Llama(model_path=mp, n_ctx=4096, n_batch=4096, n_ubatch=512, n_threads=2, verbose=False, flash_attn=True, logits_all=True)
nodes.clear()
llm.eval(ids)
d = {}
seen = {}
for name, op, ne, a in nodes:
    k = seen.get(name, 0); seen[name] = k + 1
    key = f"{name}#{k}"
    print(key, op, ne, 'f32' if a is not None else '-')
    if a is not None: d[key] = a
np.savez(out, **d)
