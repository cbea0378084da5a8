"""A real coding agent's requests against a real server: Qwen Code 0.24.4's recorded turns
(crates/kestrel-server/tests/data/qwen-code; long system prompt, 14 tools, multi-part user
content, stream, max_tokens = the model's whole context).

usage: agent_request.py AGENT_URL --ctx-size N [--small-url URL --small-ctx N]

- turn 1 exactly as the client sent it gets a streamed 200 with a first token, though its
  max_tokens (32768) is above the server's context (accepted up to the model's context);
  the client then goes away (the engine keeps the finished prefill chunks);
- turn 2 (the conversation resent with a tool call and its result) resumes from the cached
  prefix: cached tokens >= 90% of its prompt, time to first token under 10% of turn 1's;
- max_tokens / max_completion_tokens above the model's context are 400s naming the field;
- on the small server, a prompt that leaves a few tokens of room with max_tokens at the
  model's context generates until the context is full: finish_reason "length".
"""

import argparse
import json
import pathlib
import time

from common import check, finish, httpx

DATA = pathlib.Path(__file__).resolve().parents[2] / "crates/kestrel-server/tests/data/qwen-code"


def stream(client, url, body, stop_at_first_token):
    """POSTs a streamed chat request; returns (status, ttft_s, events, usage, finish)."""
    t0 = time.monotonic()
    ttft, events, usage, finish_reason = None, [], None, None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, None, [r.text], None, None
        ctype = r.headers.get("content-type", "")
        check("turn streams text/event-stream", ctype.startswith("text/event-stream"), ctype)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            events.append(event)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                delta = choice.get("delta", {})
                if ttft is None and (delta.get("content") or delta.get("tool_calls")):
                    ttft = time.monotonic() - t0
                finish_reason = choice.get("finish_reason") or finish_reason
            if stop_at_first_token and ttft is not None:
                break  # leaving the `with` closes the connection: the request is cancelled
    return 200, ttft, events, usage, finish_reason


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--ctx-size", type=int, required=True)
    ap.add_argument("--model-ctx", type=int, default=32768)
    ap.add_argument("--small-url")
    ap.add_argument("--small-model-ctx", type=int, default=8192)
    ap.add_argument("--small-ctx", type=int)
    a = ap.parse_args()
    turn1 = json.loads((DATA / "turn1.json").read_text())
    turn2 = json.loads((DATA / "turn2.json").read_text())
    turn1.pop("model")  # the served model's name differs from the capture's
    turn2.pop("model")
    client = httpx.Client(timeout=httpx.Timeout(1800.0))

    status, ttft1, events, _, _ = stream(client, a.url, turn1, stop_at_first_token=True)
    check("turn 1 as sent (max_tokens 32768) is a streamed 200", status == 200, str(events[:1]))
    check("turn 1 streams a first token", ttft1 is not None)
    first = events[0]["choices"][0]["delta"] if events else {}
    check("turn 1's first chunk carries the assistant role", first.get("role") == "assistant", str(first))
    print(f"     turn 1: time to first token {ttft1 or 0:.1f} s", flush=True)

    # The agent sends no temperature, so the server samples; the model may end its answer before
    # 8 tokens. ignore_eos keeps the length check about max_tokens, not about what was sampled.
    turn2["max_tokens"] = 8
    turn2["ignore_eos"] = True
    status, ttft2, events, usage, fin = stream(client, a.url, turn2, stop_at_first_token=False)
    check("turn 2 is a streamed 200", status == 200, str(events[:1]))
    usage = usage or {}
    prompt = usage.get("prompt_tokens", 0)
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    print(f"     turn 2: prompt {prompt}, cached {cached}, time to first token {ttft2 or 0:.2f} s", flush=True)
    check("turn 2 reuses the cached prefix (>= 90% of its prompt)", prompt > 0 and cached >= 0.9 * prompt,
          f"{cached} of {prompt}")
    check("turn 2's first token comes in under 10% of turn 1's time",
          ttft1 is not None and ttft2 is not None and ttft2 < 0.1 * ttft1, f"{ttft2} vs {ttft1}")
    check("turn 2 stops at its max_tokens", fin == "length" and usage.get("completion_tokens") == 8, str(usage))

    short = {"messages": [{"role": "user", "content": "hi"}]}
    for field in ("max_tokens", "max_completion_tokens"):
        r = client.post(f"{a.url}/v1/chat/completions", json={**short, field: a.model_ctx + 1})
        err = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
        check(f"{field} above the model's context is a 400 naming it",
              r.status_code == 400 and err.get("param") == field, f"{r.status_code} {r.text[:200]}")

    if a.small_url:
        # A prompt that leaves ~12 tokens of the context, max_tokens at the model's context.
        room = 12
        words = ["count"] * (a.small_ctx - room - 20)
        body = {"prompt": " ".join(words), "max_tokens": a.small_model_ctx, "ignore_eos": True}
        r = client.post(f"{a.small_url}/v1/completions", json=body)
        ok = r.status_code == 200
        j = r.json() if ok else {}
        usage = j.get("usage", {})
        total = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        check("max_tokens at the model's context generates until the context is full",
              ok and j["choices"][0]["finish_reason"] == "length" and total == a.small_ctx,
              f"{r.status_code} {usage} {r.text[:200]}")
    finish("agent_request.py")


if __name__ == "__main__":
    main()
