#!/usr/bin/env python3
"""API behaviour checks against running kestrel servers (plain HTTP, no SDK).

    python3 tests/e2e/api_checks.py http://127.0.0.1:PORT --model MODEL.gguf --kestrel BIN \
        --ctx-size N [--keyed-url http://127.0.0.1:PORT2 --api-key KEY --keyed-model MODEL2.gguf]

Checks:
- logprobs agree with `kestrel logits` on the same prompt: the prompt's token ids come from
  POST /tokenize, go to /v1/completions as a token-id prompt (greedy, max_tokens 1,
  logprobs 5), and to `kestrel logits --kv-type f16`; the generated token is the argmax of the
  last logits row, and its logprob and every top_logprobs entry equal a log-softmax of that row
  within LOGPROB_TOL (2e-2: the server batches and keeps an f16 KV cache; `logits` is run with
  --kv-type f16 too, so only kernel/batching differences remain — a real mismatch, e.g. logprobs
  after temperature or penalties, or an off-by-one row, is orders of magnitude larger). Done on
  the main server's model and, with --keyed-url, on the keyed server's model too. Chat logprobs
  are checked for shape and for greedy consistency (the chosen token is the top entry);
- stop strings truncate the output: a greedy run without `stop` gives text T; the same request
  with `stop` = a piece of T ends right before the first occurrence of that piece, with
  finish_reason "stop" (completions and chat, whole and streamed);
- the same seed reproduces the same sampled completion (temperature 0.9), streamed or not, and
  different seeds give a different one (three other seeds: at least one differs);
- unknown fields commonly sent (`user`, `metadata`, `store`, `service_tier`, ...) are accepted;
- `n: 2` is a 400 naming `n` (both routes);
- a prompt over the context is a 400 whose message says so (text and token-id prompts), and a
  `max_tokens` past what the context leaves is a 400 naming `max_tokens`;
- with --keyed-url: /v1 routes answer 401 without the key or with a wrong one, 200 with it;
  /health stays open.
"""

import argparse
import json
import os
import subprocess
import tempfile

from common import check, f32_row, finish, httpx, log_softmax, read_safetensors

LOGPROB_TOL = 2e-2
TOP_N = 5


def err_of(r):
    try:
        return r.json().get("error") or {}
    except ValueError:
        return {}


def expect_400(name, r, param=None, needle=None):
    e = err_of(r)
    ok = r.status_code == 400 and bool(e.get("message"))
    if param is not None:
        ok = ok and e.get("param") == param
    if needle is not None:
        ok = ok and needle.lower() in (e.get("message") or "").lower()
    check(name, ok, f"{r.status_code} {r.text[:300]}")


def completion_text(client, body):
    r = client.post("/v1/completions", json=body)
    r.raise_for_status()
    c = r.json()["choices"][0]
    return c["text"], c["finish_reason"]


def chat_text(client, body):
    r = client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    c = r.json()["choices"][0]
    return c["message"]["content"] or "", c["finish_reason"]


def streamed_text(client, route, body):
    text, finish_reason = "", None
    with client.stream("POST", route, json=dict(body, stream=True)) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{route} stream: {r.status_code} {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for ch in json.loads(line[6:]).get("choices", []):
                text += (ch["delta"].get("content") or "") if "delta" in ch else (ch.get("text") or "")
                finish_reason = ch.get("finish_reason") or finish_reason
    return text, finish_reason


# ---------------------------------------------------------------------------- logprobs


def logprobs_vs_logits(client, label, model, kestrel, text):
    ids = client.post("/tokenize", json={"content": text}).json()["tokens"]
    r = client.post(
        "/v1/completions",
        json={"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": TOP_N},
    )
    if not check(f"{label}: token-id completion with logprobs answers 200", r.status_code == 200, r.text[:300]):
        return
    lp = r.json()["choices"][0]["logprobs"]
    token, token_lp, top = lp["tokens"][0], lp["token_logprobs"][0], lp["top_logprobs"][0]

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.safetensors")
        subprocess.run(
            [kestrel, "logits", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "--out", out,
             "--kv-type", "f16"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        dtype, shape, raw = read_safetensors(out)["logits"]
    check(f"{label}: logits file is F32 [T, vocab]", dtype == "F32" and len(shape) == 2 and shape[0] == len(ids),
          f"{dtype} {shape} for {len(ids)} ids")
    ref = log_softmax(f32_row(raw, shape[0] - 1, shape[1]))
    order = sorted(range(len(ref)), key=lambda i: -ref[i])[: TOP_N + 3]
    texts = {}
    for i in order:
        t = client.post("/detokenize", json={"tokens": [i]}).json()["content"]
        texts.setdefault(t, i)
    ref_by_text = {t: ref[i] for t, i in texts.items()}

    best = order[0]
    best_text = client.post("/detokenize", json={"tokens": [best]}).json()["content"]
    check(f"{label}: greedy token is the logits argmax", token == best_text, f"{token!r} vs {best_text!r}")
    check(
        f"{label}: token logprob = log-softmax(logits) within {LOGPROB_TOL}",
        abs(token_lp - ref[best]) <= LOGPROB_TOL,
        f"server {token_lp} vs logits {ref[best]}",
    )
    check(f"{label}: {TOP_N} top_logprobs", len(top) == TOP_N, str(top))
    diffs = []
    for t, v in top.items():
        if t not in ref_by_text:
            diffs.append(f"{t!r} not among the reference top {len(order)}")
        elif abs(v - ref_by_text[t]) > LOGPROB_TOL:
            diffs.append(f"{t!r}: server {v} vs logits {ref_by_text[t]}")
    check(f"{label}: top_logprobs = log-softmax(logits) within {LOGPROB_TOL}", not diffs, "; ".join(diffs))
    kth = sorted(ref, reverse=True)[TOP_N - 1]
    check(f"{label}: top_logprobs are the {TOP_N} most likely tokens",
          min(top.values()) >= kth - LOGPROB_TOL, f"{top} vs reference {TOP_N}th {kth}")
    print(f"     ({label}: {len(ids)}-token prompt, next {token!r} logprob {token_lp:.5f}, logits {ref[best]:.5f}, "
          f"max top diff {max((abs(v - ref_by_text.get(t, v)) for t, v in top.items()), default=0):.2e})")


def chat_logprobs(client):
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3,
    })
    if not check("chat logprobs: 200", r.status_code == 200, r.text[:300]):
        return
    content = r.json()["choices"][0]["logprobs"]["content"]
    ok = bool(content) and all(
        len(c["top_logprobs"]) == 3
        and c["top_logprobs"][0]["token"] == c["token"]
        and abs(c["top_logprobs"][0]["logprob"] - c["logprob"]) < 1e-6
        and c["logprob"] <= 0
        and bytes(c["bytes"]).decode("utf-8", "replace") == c["token"]
        for c in content
    )
    check("chat logprobs: greedy token is the top entry, 3 alternatives, bytes match", ok, json.dumps(content)[:400])


# ---------------------------------------------------------------------------- stop strings


def pick_stop(text):
    """A piece from the middle of text, and where its first occurrence starts."""
    k = max(1, len(text) // 2)
    while k < len(text) and text[k].isspace():
        k += 1
    piece = text[k : k + 3]
    return piece, text.find(piece)


def stop_strings(client):
    cases = [
        ("/v1/completions", {"prompt": "The three primary colours are", "max_tokens": 32, "temperature": 0}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a short story about a cat."}],
                                  "max_tokens": 32, "temperature": 0}),
    ]
    for route, body in cases:
        name = "completions" if "chat" not in route else "chat"
        full, _ = completion_text(client, body) if name == "completions" else chat_text(client, body)
        if not check(f"stop ({name}): unstopped greedy text is long enough", len(full) >= 12, repr(full)):
            continue
        piece, at = pick_stop(full)
        stopped = dict(body, stop=[piece, "this string never appears 12345"])
        for how in ("whole", "streamed"):
            if how == "whole":
                got = completion_text(client, stopped) if name == "completions" else chat_text(client, stopped)
            else:
                got = streamed_text(client, route, stopped)
            check(
                f"stop ({name}, {how}): text ends right before the stop string, finish_reason stop",
                got == (full[:at], "stop"),
                f"stop {piece!r}: got {got!r}, expected {(full[:at], 'stop')!r} (full {full!r})",
            )


# ---------------------------------------------------------------------------- seeds


def seeds(client):
    base = {"prompt": "Once upon a time, in a small village,", "max_tokens": 24, "temperature": 0.9}
    a = completion_text(client, dict(base, seed=1234))
    b = completion_text(client, dict(base, seed=1234))
    s = streamed_text(client, "/v1/completions", dict(base, seed=1234))
    others = [completion_text(client, dict(base, seed=x)) for x in (1235, 99, 2024)]
    check("seed: same seed, same sampled completion", a == b, f"{a!r} vs {b!r}")
    check("seed: same seed streamed, same completion", a == s, f"{a!r} vs {s!r}")
    check("seed: different seeds give a different completion", any(o != a for o in others), f"{a!r} {others!r}")
    chat = {"messages": [{"role": "user", "content": "Write one sentence about rain."}], "max_tokens": 24,
            "temperature": 0.9, "seed": 77}
    x, y = chat_text(client, chat), chat_text(client, chat)
    check("seed: chat, same seed, same sampled reply", x == y, f"{x!r} vs {y!r}")


# ---------------------------------------------------------------------------- bad / odd input


def fields_and_errors(client, ctx_size):
    msgs = [{"role": "user", "content": "hi"}]
    extra = {"user": "user-1", "metadata": {"trace": "abc"}, "store": False, "service_tier": "auto",
             "parallel_tool_calls": False, "frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}}
    r = client.post("/v1/chat/completions", json=dict(extra, messages=msgs, max_tokens=2))
    check("unknown common fields (user, metadata, store, ...) accepted on chat", r.status_code == 200, r.text[:300])
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "user": "user-1",
                                             "metadata": {"trace": "abc"}, "store": False})
    check("unknown common fields (user, metadata, store) accepted on completions", r.status_code == 200, r.text[:300])

    r = client.post("/v1/chat/completions", json={"messages": msgs, "n": 2})
    expect_400("n=2 on chat -> 400 naming n", r, param="n", needle="`n`")
    r = client.post("/v1/completions", json={"prompt": "hi", "n": 2})
    expect_400("n=2 on completions -> 400 naming n", r, param="n", needle="`n`")

    # Over the context: token ids (exact length) and text (a long message).
    r = client.post("/v1/completions", json={"prompt": [100] * (ctx_size + 5), "max_tokens": 1})
    expect_400("token-id prompt over the context -> 400 saying so", r, needle="context")
    check("  ... and the message gives the sizes", str(ctx_size) in err_of(r).get("message", ""), r.text[:300])
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hello " * (ctx_size + 50)}], "max_tokens": 1})
    expect_400("chat prompt over the context -> 400 saying so", r, needle="context")
    # Up to the model's own context is accepted (agent_request.py checks that); beyond it, a 400.
    r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 1_000_000})
    expect_400("max_tokens past the model's context -> 400 naming max_tokens", r, param="max_tokens", needle="context")

    r = client.get("/health")
    check("server still healthy after the bad input", r.status_code == 200, str(r.status_code))


def api_key(url, key):
    with httpx.Client(base_url=url, timeout=120) as c:
        r = c.get("/v1/models")
        check("api key: /v1/models without key -> 401", r.status_code == 401 and err_of(r).get("message"), r.text[:200])
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        check("api key: chat without key -> 401", r.status_code == 401, r.text[:200])
        r = c.get("/v1/models", headers={"Authorization": "Bearer wrong-" + key})
        check("api key: wrong key -> 401", r.status_code == 401, r.text[:200])
        r = c.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        check("api key: right key -> 200", r.status_code == 200, r.text[:200])
        r = c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        check("api key: chat with key -> 200", r.status_code == 200, r.text[:200])
        r = c.get("/health")
        check("api key: /health open without key", r.status_code == 200, r.text[:200])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url", help="a server without a key, e.g. http://127.0.0.1:8080 (no /v1)")
    ap.add_argument("--model", required=True, help="the model file that server serves")
    ap.add_argument("--kestrel", required=True, help="the kestrel binary (for `kestrel logits`)")
    ap.add_argument("--ctx-size", type=int, required=True, help="that server's --ctx-size")
    ap.add_argument("--keyed-url", help="a server started with --api-key")
    ap.add_argument("--api-key")
    ap.add_argument("--keyed-model", help="the model file the keyed server serves (logprobs check)")
    args = ap.parse_args()

    with httpx.Client(base_url=args.base_url, timeout=300) as client:
        logprobs_vs_logits(client, "logprobs", args.model, args.kestrel, "The capital of France is")
        logprobs_vs_logits(client, "logprobs (2)", args.model, args.kestrel,
                           "def add(a, b):\n    return")
        chat_logprobs(client)
        stop_strings(client)
        seeds(client)
        fields_and_errors(client, args.ctx_size)
    if args.keyed_url:
        api_key(args.keyed_url, args.api_key)
        if args.keyed_model:
            with httpx.Client(base_url=args.keyed_url, timeout=300,
                              headers={"Authorization": f"Bearer {args.api_key}"}) as client:
                logprobs_vs_logits(client, "logprobs (keyed server's model)", args.keyed_model, args.kestrel,
                                   "The capital of France is")
    finish("api_checks")


if __name__ == "__main__":
    main()
