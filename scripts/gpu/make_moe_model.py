"""Write a random-weight F16 GGUF with Qwen3-30B-A3B's layer shapes, for speed measurements only.

Usage: make_moe_model.py OUT.gguf [LAYERS]   (default 12 of the model's 48 layers: every layer has
the real shapes, 128 experts of 768 x 2,048, 8 routed a token; the whole model's 61 GB of F16 would
not fit the GPU host's disk beside its quantized copy). Both engines read the same file, so a
figure against llama.cpp on it is fair; a decode figure scales with the layers (the embedding and
the output head are whole).
The tokenizer comes from llama.cpp's vocab-only qwen2 file beside the dense writer
(make_dense_model.py, VOCAB_GGUF), so the file loads in any GGUF engine. Weights are slices of one
random pool (values do not matter for speed, only shapes and types); the router is F32, as
llama.cpp's quantizer leaves it.
"""
import os
import sys
from pathlib import Path

import numpy as np

import gguf  # PyPI package "gguf" (>= 0.19)

VOCAB = Path(os.environ.get("VOCAB_GGUF", Path(__file__).with_name("ggml-vocab-qwen2.gguf")))
ARCH = "qwen3moe"
# hidden, heads, kv heads, head dim, experts, used, expert width, vocab, rope base
H, NH, NKV, HD, NE, K, EFF, V, BASE = 2048, 32, 4, 128, 128, 8, 768, 151936, 1e6

out = sys.argv[1]
L = int(sys.argv[2]) if len(sys.argv) > 2 else 12
voc = gguf.GGUFReader(str(VOCAB))


def field(name):
    return voc.fields[name].contents()


w = gguf.GGUFWriter(out, ARCH)
w.add_name(f"random qwen3-30b-a3b ({L} layers)")
w.add_block_count(L)
w.add_context_length(40960)
w.add_embedding_length(H)
w.add_feed_forward_length(6144)
w.add_head_count(NH)
w.add_head_count_kv(NKV)
w.add_key_length(HD)
w.add_value_length(HD)
w.add_rope_freq_base(BASE)
w.add_layer_norm_rms_eps(1e-6)
w.add_uint32(f"{ARCH}.expert_count", NE)
w.add_uint32(f"{ARCH}.expert_used_count", K)
w.add_uint32(f"{ARCH}.expert_feed_forward_length", EFF)
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("qwen2")
tokens = field("tokenizer.ggml.tokens")
types = field("tokenizer.ggml.token_type")
pad = V - len(tokens)
w.add_token_list(list(tokens) + [f"[PAD{i}]" for i in range(pad)])
w.add_token_types(list(types) + [gguf.TokenType.USER_DEFINED] * pad)
w.add_token_merges(field("tokenizer.ggml.merges"))
w.add_eos_token_id(151645)
w.add_bos_token_id(151643)
w.add_add_bos_token(False)

rng = np.random.default_rng(0)
pool = (rng.standard_normal(64 * 1024 * 1024, dtype=np.float32) * 0.02).astype(np.float16)
cursor = 0


def rand(*shape):
    global cursor
    n = int(np.prod(shape))
    reps = -(-(cursor + n) // pool.size)
    src = np.tile(pool, reps) if reps > 1 else pool
    a = src[cursor:cursor + n]
    cursor = (cursor + 7919) % pool.size
    return a.reshape(shape)


def ones(n):
    return np.ones(n, dtype=np.float32)


w.add_tensor("token_embd.weight", rand(V, H))
w.add_tensor("output_norm.weight", ones(H))
w.add_tensor("output.weight", rand(V, H))
for i in range(L):
    p = f"blk.{i}."
    w.add_tensor(p + "attn_norm.weight", ones(H))
    w.add_tensor(p + "attn_q.weight", rand(NH * HD, H))
    w.add_tensor(p + "attn_k.weight", rand(NKV * HD, H))
    w.add_tensor(p + "attn_v.weight", rand(NKV * HD, H))
    w.add_tensor(p + "attn_output.weight", rand(H, NH * HD))
    w.add_tensor(p + "attn_q_norm.weight", ones(HD))
    w.add_tensor(p + "attn_k_norm.weight", ones(HD))
    w.add_tensor(p + "ffn_norm.weight", ones(H))
    w.add_tensor(p + "ffn_gate_inp.weight", rand(NE, H).astype(np.float32))
    w.add_tensor(p + "ffn_gate_exps.weight", rand(NE, EFF, H))
    w.add_tensor(p + "ffn_up_exps.weight", rand(NE, EFF, H))
    w.add_tensor(p + "ffn_down_exps.weight", rand(NE, H, EFF))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file(progress=False)
w.close()
print("wrote", out)
