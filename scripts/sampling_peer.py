#!/usr/bin/env python3
"""The peer's side of `kestrel bench --scenario sampling`: llama.cpp's sampler chain picking one
token from the model's own logits, chain by chain, timed per token.

    python3 scripts/sampling_peer.py MODEL.gguf [-n 32] [-r 5]

Runs inside the peers' virtual environment of ../shared/peers/llamacpp_bench.py (llama-cpp-python,
October 2026 llama.cpp; built there on first use). The same prompt as kestrel's scenario, then
`-n` greedy steps; at each step every chain samples the step's logits `-r` times
(`llama_sampler_sample`: the chain's copy of the row into its candidate array included, as in
llama.cpp's own generation loop). Prints the median per token of each chain; then the same over
the rows flattened (logits / 20 in the context's logits buffer: near-uniform, as a random-weight
model's), as kestrel's scenario does.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

PEERS = Path(os.environ.get("KESTREL_PEERS", Path.home() / ".cache" / "kestrel-peers"))
FLATTEN = 20.0  # what the flattened rows divide the logits by (kestrel's scenario: the same)
PROMPT = "def quicksort(items):\n    \"\"\"Sort a list of numbers in ascending order.\"\"\"\n"


def in_peer_venv():
    try:
        import llama_cpp  # noqa: F401
        return
    except ImportError:
        pass
    py = PEERS / "venv" / "bin" / "python3"
    if os.environ.get("KESTREL_PEERS_CHILD") or not py.exists():
        sys.exit("llama_cpp not found: run ../shared/peers/llamacpp_bench.py once (it builds the peer)")
    os.execve(str(py), [str(py), __file__] + sys.argv[1:], dict(os.environ, KESTREL_PEERS_CHILD="1"))


def chains(lc, n_vocab):
    """(name, builder) pairs: the chains of kestrel's scenario, in llama.cpp's samplers."""
    def chain(*parts):
        c = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        for p in parts:
            lc.llama_sampler_chain_add(c, p)
        return c

    return [
        ("greedy", lambda: chain(lc.llama_sampler_init_greedy())),
        ("llama.cpp defaults (t 0.8, top_k 40, top_p 0.95, min_p 0.05)", lambda: chain(
            lc.llama_sampler_init_top_k(40), lc.llama_sampler_init_top_p(0.95, 1),
            lc.llama_sampler_init_min_p(0.05, 1), lc.llama_sampler_init_temp(0.8),
            lc.llama_sampler_init_dist(1))),
        ("Qwen's (t 0.7, top_k 20, top_p 0.8, repeat 1.05)", lambda: chain(
            lc.llama_sampler_init_penalties(n_vocab, 64, 1.05, 0.0, 0.0), lc.llama_sampler_init_top_k(20),
            lc.llama_sampler_init_top_p(0.8, 1), lc.llama_sampler_init_temp(0.7),
            lc.llama_sampler_init_dist(1))),
        ("OpenAI defaults (t 1, top_p 1, no top_k)", lambda: chain(
            lc.llama_sampler_init_temp(1.0), lc.llama_sampler_init_dist(1))),
        ("nucleus (t 0.7, top_p 0.8, no top_k)", lambda: chain(
            lc.llama_sampler_init_top_p(0.8, 1), lc.llama_sampler_init_temp(0.7),
            lc.llama_sampler_init_dist(1))),
    ]


def main():
    in_peer_venv()
    import llama_cpp
    lc = llama_cpp
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("-t", type=int, default=2)
    a = ap.parse_args()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=512, n_threads=a.t, n_batch=512, verbose=False)
    ctx = llm._ctx.ctx
    toks = llm.tokenize(PROMPT.encode(), add_bos=True, special=True)
    llm.eval(toks)
    import numpy as np
    made = [(name, build()) for name, build in chains(lc, llm.n_vocab())]
    times = {(name, flat): [] for name, _ in made for flat in (False, True)}
    greedy = made[0][1]
    for step in range(a.n + 1):
        row = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(llm.n_vocab(),))
        model_row = row.copy()
        for flat in (False, True):
            row[:] = model_row / FLATTEN if flat else model_row
            for name, c in made:
                t = time.perf_counter()
                for _ in range(a.r):
                    lc.llama_sampler_sample(c, ctx, -1)
                times[(name, flat)].append((time.perf_counter() - t) * 1e6 / a.r)
        row[:] = model_row
        if step < a.n:
            llm.eval([lc.llama_sampler_sample(greedy, ctx, -1)])
    print(f"llama.cpp's sampler chain, {a.model} (vocabulary {llm.n_vocab()}), {a.n + 1} rows, {a.r} draws each")
    for flat in (False, True):
        if flat:
            print(f"  the same rows flattened (logits / {FLATTEN:g}):")
        for name, _ in made:
            print(f"  {name:<62} {statistics.median(times[(name, flat)]):>8.1f} us a token")
    for _, c in made:
        lc.llama_sampler_free(c)


if __name__ == "__main__":
    main()
