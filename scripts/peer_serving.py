#!/usr/bin/env python3
"""The peer side of the serving scenarios, measured the way llama-server and llama-batched-bench
do it, through llama.cpp's own C API (llama-cpp-python 0.3.36, the build of
shared/peers/llamacpp_bench.py; run it with that venv's python):

    ~/.cache/kestrel-peers/venv/bin/python3 scripts/peer_serving.py agent MODEL.gguf [-t 2]
    ~/.cache/kestrel-peers/venv/bin/python3 scripts/peer_serving.py concurrent MODEL.gguf [-c 1,2,4,8]

agent: time to first token of a 4,000-token prefix + 100 new tokens, cold (all 4,100 tokens
evaluated) and warm (the 4,000-token prefix already in the KV cache, as llama-server's
`cache_prompt` keeps it: only the 100 new tokens are evaluated), median of -r runs. Flash
attention on, n_batch 2048 / n_ubatch 512 as llama-server's defaults.

concurrent: llama-batched-bench's S_TG: c sequences, 128-token prompts (prefilled first, not
timed), then 64 decode steps in which all c sequences advance together in one batch; aggregate
decode tok/s = c * 64 / time of those steps.

Token ids are random (fixed seed): timings do not depend on which tokens they are.
"""
import argparse, ctypes, json, random, statistics, time

import llama_cpp


def load(model, n_ctx, threads, n_seq=1):
    params = llama_cpp.llama_model_default_params()
    m = llama_cpp.llama_model_load_from_file(model.encode(), params)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = 2048
    cp.n_ubatch = 512
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.n_seq_max = n_seq
    cp.kv_unified = True
    cp.flash_attn_type = 1  # enabled
    ctx = llama_cpp.llama_init_from_model(m, cp)
    return m, ctx


def decode(ctx, batch_tokens, n_vocab):
    """batch_tokens: list of (token, pos, seq, want_logits); returns logits rows asked for."""
    n = len(batch_tokens)
    b = llama_cpp.llama_batch_init(n, 0, 1)
    for i, (tok, pos, seq, want) in enumerate(batch_tokens):
        b.token[i] = tok
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = 1 if want else 0
    b.n_tokens = n
    rc = llama_cpp.llama_decode(ctx, b)
    assert rc == 0, f"llama_decode returned {rc}"
    out = []
    for i, (_, _, _, want) in enumerate(batch_tokens):
        if want:
            p = llama_cpp.llama_get_logits_ith(ctx, i)
            row = [p[j] for j in range(min(n_vocab, 64))]  # touch the row; argmax not needed
            out.append(row)
    llama_cpp.llama_batch_free(b)
    return out


def eval_chunks(ctx, toks, start, seq, n_vocab):
    """Evaluates `toks` at positions start.. in batches of 2048 (llama-server's n_batch)."""
    for i in range(0, len(toks), 2048):
        part = toks[i:i + 2048]
        last = i + len(part) == len(toks)
        decode(ctx, [(t, start + i + k, seq, last and k == len(part) - 1) for k, t in enumerate(part)], n_vocab)


def agent(a):
    m, ctx = load(a.model, 8192, a.threads)
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))
    rng = random.Random(1)
    prefix = [rng.randrange(100, vocab - 100) for _ in range(4000)]
    new = [rng.randrange(100, vocab - 100) for _ in range(100)]
    mem = llama_cpp.llama_get_memory(ctx)
    cold, warm = [], []
    for rep in range(a.r):
        llama_cpp.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        eval_chunks(ctx, prefix + new, 0, 0, vocab)
        cold.append(time.perf_counter() - t0)
        llama_cpp.llama_memory_clear(mem, True)
        eval_chunks(ctx, prefix, 0, 0, vocab)
        t0 = time.perf_counter()
        eval_chunks(ctx, new, 4000, 0, vocab)
        warm.append(time.perf_counter() - t0)
    res = {"cold_ms": 1e3 * statistics.median(cold), "warm_ms": 1e3 * statistics.median(warm)}
    res["speedup"] = res["cold_ms"] / res["warm_ms"]
    print(json.dumps(res) if a.json else
          f"llama.cpp 4,000 + 100: TTFT cold {res['cold_ms']:.0f} ms, warm {res['warm_ms']:.0f} ms: {res['speedup']:.1f}x")


def concurrent(a):
    levels = [int(c) for c in a.c.split(",")]
    rows = {}
    for c in levels:
        m, ctx = load(a.model, 256 * max(levels) * 2, a.threads, n_seq=max(levels))
        vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))
        rng = random.Random(c)
        runs = []
        for rep in range(a.r):
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            for s in range(c):
                eval_chunks(ctx, [rng.randrange(100, vocab - 100) for _ in range(128)], 0, s, vocab)
            t0 = time.perf_counter()
            for step in range(64):
                decode(ctx, [(rng.randrange(100, vocab - 100), 128 + step, s, True) for s in range(c)], vocab)
            runs.append(c * 64 / (time.perf_counter() - t0))
        rows[c] = statistics.median(runs)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(m)
    if a.json:
        print(json.dumps({"aggregate_decode_tok_s": rows}))
    else:
        for c, v in rows.items():
            print(f"llama.cpp c={c}: aggregate decode {v:.1f} tok/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["agent", "concurrent"])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("-c", default="1,2,4,8")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    llama_cpp.llama_backend_init()
    (agent if a.scenario == "agent" else concurrent)(a)


if __name__ == "__main__":
    main()
