#!/usr/bin/env python3
"""Speculative decoding gives plain greedy decoding's tokens, through the CLI and the server.

    spec_check.py --kestrel BIN --model MODEL --server URL [--draft-model DRAFT]

For every llama.cpp generation fixture of MODEL (testdata/llamacpp/generate_public.json: its
prompts as token ids, greedy, up to 48 tokens):
- `kestrel run` plain, then with `--spec lookup` (and `--spec draft --draft-model DRAFT` when
  given): the same token ids, or a first difference at a near-tie of the plain path: the token
  chosen there is plain's runner-up and the two logits differ by less than 0.25 (the
  verification pass multiplies several tokens at once and writes K/V through those kernels,
  which round differently from one-token decodes; on the 1.5B the plain path's own logits move
  by 0.1–0.2 between the f16 and f32 KV caches or against the f32 reference);
- the server at URL (started with the last of those --spec modes): POST /v1/completions with
  the prompt ids, greedy: exactly the text and finish reason of `kestrel run` in that mode (one
  request at a time gives the same steps).
Then the server's /metrics must count proposed and accepted speculative tokens.
"""
NEAR_TIE_LOGITS = 0.25
import argparse, json, subprocess, sys, urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    if not ok:
        failures.append(name)
    return ok


def run(bin_, model, ids, n, extra):
    out = subprocess.run([bin_, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", str(n),
                          "--temp", "0", "--json", "--device", "cpu", *extra],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"kestrel run {' '.join(extra)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def top2(bin_, model, ids):
    """The plain path's two most likely next tokens after `ids`: [(id, logit), (id, logit)]."""
    import struct, tempfile
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "l.safetensors"
        r = subprocess.run([bin_, "logits", "-m", model, "--prompt-ids", ",".join(map(str, ids)),
                            "--out", str(out), "--device", "cpu", "--kv-type", "f16"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"kestrel logits: {r.stderr.strip()}")
        raw = out.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    meta = json.loads(raw[8:8 + n])["logits"]
    t, vocab = meta["shape"]
    a, b = meta["data_offsets"]
    row = struct.unpack(f"<{vocab}f", raw[8 + n + a + (t - 1) * vocab * 4: 8 + n + a + t * vocab * 4])
    best = sorted(range(vocab), key=lambda i: -row[i])[:2]
    return [(i, row[i]) for i in best]


def same_or_near_tie(bin_, model, prompt, plain, spec):
    """(ok, detail): equal tokens, or the first difference at a near-tie of the plain run."""
    if spec == plain:
        return True, ""
    i = next((k for k, (x, y) in enumerate(zip(plain, spec)) if x != y), min(len(plain), len(spec)))
    if i >= min(len(plain), len(spec)):
        return False, f"one output is a prefix of the other ({len(spec)} vs {len(plain)} tokens)"
    (a1, l1), (a2, l2) = top2(bin_, model, prompt + plain[:i])
    detail = f"first difference at token {i}: {spec[i]} for {plain[i]}; plain's top two {a1} ({l1:.3f}), {a2} ({l2:.3f})"
    return {spec[i], plain[i]} == {a1, a2} and l1 - l2 < NEAR_TIE_LOGITS, detail


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kestrel", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--draft-model")
    a = ap.parse_args()
    fx = json.loads((ROOT / "testdata/llamacpp/generate_public.json").read_text())
    name = Path(a.model).name
    cases = [c for c in fx["cases"] if c["model"] == name]
    if not check(f"{name}: generation fixtures found", len(cases) > 0):
        sys.exit(1)
    kinds = [("lookup", ["--spec", "lookup"])]
    if a.draft_model:
        kinds.append(("draft", ["--spec", "draft", "--draft-model", a.draft_model]))
    accepted = 0
    for c in cases:
        n = 48
        plain = run(a.kestrel, a.model, c["prompt_ids"], n, [])
        for kind, extra in kinds:
            spec = run(a.kestrel, a.model, c["prompt_ids"], n, extra)
            accepted += spec["timings"]["spec_accepted"]
            ok, detail = same_or_near_tie(a.kestrel, a.model, c["prompt_ids"], plain["tokens"], spec["tokens"])
            check(f"{name} {c['name']}: run --spec {kind} gives the plain tokens" + (f" up to a near-tie ({detail})" if detail else ""),
                  ok, f"{detail}; {spec['tokens']} vs {plain['tokens']}")
        resp = post(a.server.rstrip("/") + "/v1/completions",
                    {"model": Path(a.model).stem, "prompt": c["prompt_ids"], "max_tokens": n, "temperature": 0})
        choice = resp["choices"][0]
        want_finish = "stop" if spec["stop_reason"] == "stop" else "length"
        check(f"{name} {c['name']}: the --spec {kinds[-1][0]} server gives `run --spec {kinds[-1][0]}`'s text",
              choice["text"] == spec["text"] and choice["finish_reason"] == want_finish,
              f"{choice['text']!r} ({choice['finish_reason']}) vs {spec['text']!r} ({want_finish})")
    check(f"{name}: the CLI kept speculative tokens", accepted > 0, str(accepted))
    with urllib.request.urlopen(a.server.rstrip("/") + "/metrics", timeout=30) as r:
        metrics = r.read().decode()
    counts = {l.split()[0]: float(l.split()[1]) for l in metrics.splitlines()
              if l.startswith("kestrel_spec_")}
    check(f"{name}: /metrics counts proposed and accepted tokens",
          counts.get("kestrel_spec_proposed_tokens_total", 0) >= counts.get("kestrel_spec_accepted_tokens_total", 0) > 0,
          str(counts))
    if failures:
        print(f"{len(failures)} spec check(s) failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
