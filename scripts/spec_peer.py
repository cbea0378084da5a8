#!/usr/bin/env python3
"""llama.cpp's prompt-lookup decoding on kestrel's code-editing workload, beside its plain decoding.

    python3 scripts/spec_peer.py MODEL.gguf KESTREL_BENCH.json [-t 2] [-r 1]

KESTREL_BENCH.json is what `kestrel bench -m MODEL --spec lookup --json` printed: its
`prompt_ids` (the same prompt token for token) and `generated_tokens` (the answer length to
match). Runs the peer package (llama-cpp-python, set up by ../shared/peers/llamacpp_bench.py
into ~/.cache/kestrel-peers) greedy, plain and with
`llama_cpp.llama_speculative.LlamaPromptLookupDecoding`, and prints decode tok/s (first token
to last) of each, and whether the two gave the same tokens.
"""
import argparse, json, os, statistics, sys, time
from pathlib import Path

HOME = Path(os.environ.get("KESTREL_PEERS", Path.home() / ".cache" / "kestrel-peers"))
PY = HOME / "venv" / "bin" / "python3"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("kestrel_json")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=1)
    ap.add_argument("--num-pred-tokens", type=int, default=10)
    ap.add_argument("--max-ngram", type=int, default=2)
    a = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        if os.environ.get("KESTREL_PEERS_CHILD") or not PY.exists():
            sys.exit(f"llama_cpp missing: run ../shared/peers/llamacpp_bench.py once to install it into {HOME}")
        os.execve(str(PY), [str(PY), __file__] + sys.argv[1:], dict(os.environ, KESTREL_PEERS_CHILD="1"))
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    k = json.loads(Path(a.kestrel_json).read_text().strip().splitlines()[-1])
    prompt, n = k["prompt_ids"], k["generated_tokens"]

    def run(draft):
        # logits_all with a draft: the package needs it (its score buffer is sized by the
        # argument, while speculation switches logits_all on inside).
        llm = llama_cpp.Llama(model_path=a.model, n_ctx=len(prompt) + n + 32, n_threads=a.t,
                              n_threads_batch=a.t, n_batch=512, verbose=False, draft_model=draft,
                              logits_all=draft is not None)
        rates, tokens = [], []
        for _ in range(a.r):
            llm.reset()
            tokens, first = [], None
            for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
                if first is None:
                    first = time.perf_counter()
                if tok == llm.token_eos() or len(tokens) >= n:
                    break
                tokens.append(tok)
            dt = time.perf_counter() - first
            rates.append((len(tokens) - 1) / dt)
        return statistics.median(rates), tokens

    plain, t_plain = run(None)
    look, t_look = run(LlamaPromptLookupDecoding(num_pred_tokens=a.num_pred_tokens, max_ngram_size=a.max_ngram))
    out = {"peer": "llama.cpp (llama-cpp-python %s)" % llama_cpp.__version__, "threads": a.t,
           "generated_tokens": len(t_plain), "plain_decode_tok_s": plain,
           "lookup_decode_tok_s": look, "speedup": look / plain,
           "same_tokens": t_plain == t_look, "same_as_kestrel": t_plain == k.get("tokens", [])[:len(t_plain)],
           "lookup": {"num_pred_tokens": a.num_pred_tokens, "max_ngram_size": a.max_ngram}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
