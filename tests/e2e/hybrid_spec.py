#!/usr/bin/env python3
"""Speculative decoding on a hybrid model (tiny-qwen3_5: its recurrent state backed up before
each verify pass and restored after a rejection) through the server.

    hybrid_spec.py --kestrel BIN --model HYBRID --server URL

The server at URL serves HYBRID with `--spec draft` and a dense draft of the same vocabulary
(tiny-qwen2: nearly every proposal is rejected, so nearly every step restores the state) and
`--kv-type f32`, as `kestrel run` here: the random tiny model has next-token near-ties (4.2259
against 4.2253 after the third prompt's first token) that an f16 cache, or a multi-token
verify pass against it, can resolve the other way.
- for a few prompts, the server's greedy completion equals `kestrel run`'s plain greedy text;
- /metrics counts proposed tokens and kept tokens run again to restore the state.
Exits non-zero on any failure.
"""
import argparse
import json
import subprocess
import urllib.request

from common import check, finish, parse_metrics

PROMPTS = [
    "def add(a, b):",
    "The lighthouse keeper counted the ships that passed each night.",
    "1, 2, 3, 4, 5, 6, 7,",
]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kestrel", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--server", required=True)
    a = ap.parse_args()
    base = a.server.rstrip("/")
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        model = json.load(r)["data"][0]["id"]
    for prompt in PROMPTS:
        run = subprocess.run([a.kestrel, "run", "-m", a.model, "-p", prompt, "-n", "24",
                              "--temp", "0", "--kv-type", "f32", "--json", "--device", "cpu"],
                             capture_output=True, text=True, timeout=120)
        if not check(f"run {prompt!r}", run.returncode == 0, run.stderr[-300:]):
            continue
        plain = json.loads(run.stdout)["text"]
        got = post(base + "/v1/completions", {"model": model, "prompt": prompt,
                                              "max_tokens": 24, "temperature": 0})
        text = got["choices"][0]["text"]
        check(f"{prompt!r}: the speculative server gives plain greedy's text", text == plain,
              f"{text!r} vs {plain!r}")
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        m = parse_metrics(r.read().decode())
    proposed = m.get("kestrel_spec_proposed_tokens_total", 0)
    redone = m.get("kestrel_spec_redone_tokens_total", 0)
    check("/metrics counts proposed tokens", proposed > 0, f"{proposed}")
    check("/metrics counts kept tokens run again to restore the state", redone > 0, f"{redone}")
    finish("hybrid_spec.py")


if __name__ == "__main__":
    main()
