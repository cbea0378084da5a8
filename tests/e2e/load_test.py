#!/usr/bin/env python3
"""Bounded load test against a running kestrel server (SmolLM2, `--parallel 8`).

    python3 tests/e2e/load_test.py http://127.0.0.1:PORT [--clients 32] [--requests 10] [--seed 7]

32 concurrent clients x 10 requests each (asyncio + httpx), chat and completions mixed,
streamed and not, max_tokens <= 32. Most requests are greedy (temperature 0); a few are
sampled (temperature 0.9 with a seed) just to mix sampling into the batches. 30% of all
requests (chosen with the seed) disconnect: a streamed one closes its response after a
seeded number of chunks, a non-streamed one is cancelled after a seeded delay (it counts as
completed if the answer came first).

Checks:
- no 5xx and no transport error, ever (every response is a 200: every request is valid);
- every completed greedy request's text (and finish_reason) equals the same request run
  alone, sequentially, before the load; a disconnected stream's partial text is a prefix of it;
- afterwards the server still answers (and its answer equals the solo one);
- afterwards the KV pool is back to free/cached: /metrics is polled until
  kestrel_kv_blocks_used, kestrel_running_sequences and kestrel_queue_depth are all 0, and
  used + cached + free adds up to the pool, within a timeout.
Prints a summary (requests, completed, cancelled, wall time, aggregate generated tok/s).
"""

import argparse
import asyncio
import json
import random
import time

from common import check, finish, httpx, parse_metrics

CHAT_PROMPTS = [
    "Tell me a short story about a cat.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colours.",
    "Explain what a CPU does in one sentence.",
    "Give me a tip for learning to cook.",
    "Why is the sky blue?",
    "Say hello in French.",
    "What is 2 + 2?",
    "Name a famous scientist.",
]
COMPLETION_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colours are",
    "In 1492, Columbus",
    "A good breakfast includes",
    "The quick brown fox",
    "Water boils at",
    "import numpy as np\n",
    "The best way to learn programming is",
]
MAX_TOKENS = [8, 16, 24, 32]


def make_request(rng):
    """One request: (kind, body) with a stable identity for the solo reference."""
    kind = rng.choice(["chat", "completion"])
    max_tokens = rng.choice(MAX_TOKENS)
    greedy = rng.random() < 0.85
    body = {"max_tokens": max_tokens}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": rng.choice(CHAT_PROMPTS)}]
    else:
        body["prompt"] = rng.choice(COMPLETION_PROMPTS)
    if greedy:
        body["temperature"] = 0
    else:
        body.update(temperature=0.9, seed=rng.randrange(1 << 31))
    return kind, body, greedy


def key(kind, body):
    return kind + json.dumps(body, sort_keys=True)


def path(kind):
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


def text_of(kind, obj):
    c = obj["choices"][0]
    return c["message"]["content"] or "" if kind == "chat" else c["text"]


class Stats:
    def __init__(self):
        self.requests = 0
        self.completed = 0
        self.cancelled = 0
        self.compared = 0
        self.prefix_compared = 0
        self.mismatches = []
        self.bad_status = []
        self.transport_errors = []
        self.completion_tokens = 0


async def one(client, stats, solo, kind, body, greedy, stream, cancel_at):
    """Runs one request. cancel_at: None, ("chunks", k) or ("delay", seconds)."""
    stats.requests += 1
    ref = solo.get(key(kind, body)) if greedy else None
    req = dict(body, stream=stream)
    if stream:
        req["stream_options"] = {"include_usage": True}
        text, finish_reason, chunks, usage = "", None, 0, None
        try:
            async with client.stream("POST", path(kind), json=req) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    stats.bad_status.append((resp.status_code, resp.text[:200]))
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if obj.get("usage"):
                        usage = obj["usage"]
                    for ch in obj.get("choices", []):
                        if kind == "chat":
                            text += ch["delta"].get("content") or ""
                        else:
                            text += ch.get("text") or ""
                        finish_reason = ch.get("finish_reason") or finish_reason
                    chunks += 1
                    if cancel_at and cancel_at[0] == "chunks" and chunks >= cancel_at[1]:
                        break  # leaving the block closes the response mid-stream
                else:
                    pass
        except httpx.HTTPError as e:
            stats.transport_errors.append(f"{kind} stream: {e!r}")
            return
        if finish_reason is None:  # disconnected before the end
            stats.cancelled += 1
            if ref is not None:
                stats.prefix_compared += 1
                if not ref[0].startswith(text):
                    stats.mismatches.append((kind, body, "prefix", text, ref[0]))
            return
        stats.completed += 1
        if usage:
            stats.completion_tokens += usage["completion_tokens"]
        if ref is not None:
            stats.compared += 1
            if (text, finish_reason) != ref:
                stats.mismatches.append((kind, body, "stream", (text, finish_reason), ref))
        return

    async def post():
        return await client.post(path(kind), json=req)

    try:
        if cancel_at:
            task = asyncio.ensure_future(post())
            done, _ = await asyncio.wait({task}, timeout=cancel_at[1])
            if not done:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, httpx.HTTPError):
                    pass
                stats.cancelled += 1
                return
            resp = task.result()
        else:
            resp = await post()
    except httpx.HTTPError as e:
        stats.transport_errors.append(f"{kind}: {e!r}")
        return
    if resp.status_code != 200:
        stats.bad_status.append((resp.status_code, resp.text[:200]))
        return
    obj = resp.json()
    stats.completed += 1
    stats.completion_tokens += obj["usage"]["completion_tokens"]
    if ref is not None:
        stats.compared += 1
        got = (text_of(kind, obj), obj["choices"][0]["finish_reason"])
        if got != ref:
            stats.mismatches.append((kind, body, "whole", got, ref))


async def metrics(client):
    r = await client.get("/metrics")
    r.raise_for_status()
    return parse_metrics(r.text)


async def main_async(args):
    rng = random.Random(args.seed)
    total = args.clients * args.requests
    cancel_ids = set(rng.sample(range(total), round(total * args.cancel_fraction)))
    plan = []  # per client: list of (kind, body, greedy, stream, cancel_at)
    for c in range(args.clients):
        reqs = []
        for i in range(args.requests):
            kind, body, greedy = make_request(rng)
            stream = rng.random() < 0.5
            cancel_at = None
            if c * args.requests + i in cancel_ids:
                if stream:
                    cancel_at = ("chunks", rng.randint(1, body["max_tokens"]))
                else:
                    cancel_at = ("delay", rng.uniform(0.02, 2.0))
            reqs.append((kind, body, greedy, stream, cancel_at))
        plan.append(reqs)

    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients)
    timeout = httpx.Timeout(300.0, connect=30.0)
    async with httpx.AsyncClient(base_url=args.base_url, limits=limits, timeout=timeout) as client:
        # Solo references: every distinct greedy request, alone, one after another.
        distinct = {}
        for reqs in plan:
            for kind, body, greedy, _, _ in reqs:
                if greedy:
                    distinct.setdefault(key(kind, body), (kind, body))
        t0 = time.monotonic()
        solo = {}
        for k, (kind, body) in distinct.items():
            r = await client.post(path(kind), json=body)
            if r.status_code != 200:
                check(f"solo {kind} request answers 200", False, r.text[:300])
                finish("load_test")
            obj = r.json()
            solo[k] = (text_of(kind, obj), obj["choices"][0]["finish_reason"])
        print(f"solo references: {len(solo)} distinct greedy requests in {time.monotonic() - t0:.1f}s", flush=True)

        before = await metrics(client)
        stats = Stats()

        async def run_client(reqs):
            for kind, body, greedy, stream, cancel_at in reqs:
                await one(client, stats, solo, kind, body, greedy, stream, cancel_at)

        t0 = time.monotonic()
        await asyncio.gather(*(run_client(reqs) for reqs in plan))
        wall = time.monotonic() - t0

        # The pool drains: no sequence running or queued, no block held by a sequence.
        deadline = time.monotonic() + args.drain_timeout
        while True:
            m = await metrics(client)
            used = m.get("kestrel_kv_blocks_used")
            running = m.get("kestrel_running_sequences")
            queued = m.get("kestrel_queue_depth")
            if (used, running, queued) == (0, 0, 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        check(
            "after load: kv_blocks_used, running_sequences, queue_depth all 0",
            (used, running, queued) == (0, 0, 0),
            f"used={used} running={running} queued={queued} after {args.drain_timeout}s",
        )
        pool = before["kestrel_kv_blocks_used"] + before["kestrel_kv_blocks_cached"] + before["kestrel_kv_blocks_free"]
        check(
            "after load: cached + free blocks = the whole pool",
            m["kestrel_kv_blocks_cached"] + m["kestrel_kv_blocks_free"] == pool,
            f"cached={m['kestrel_kv_blocks_cached']} free={m['kestrel_kv_blocks_free']} pool={pool}",
        )
        generated = m["kestrel_generated_tokens_total"] - before["kestrel_generated_tokens_total"]
        engine_cancelled = m["kestrel_requests_cancelled_total"] - before["kestrel_requests_cancelled_total"]
        fivexx = sum(
            v - before.get(k, 0) for k, v in m.items()
            if k.startswith("kestrel_http_requests_total") and 'status="5' in k
        )

        # Still answering, and still the same answer.
        kind, body = next(iter(distinct.values()))
        r = await client.post(path(kind), json=body)
        check("after load: the server still answers 200", r.status_code == 200, r.text[:300])
        if r.status_code == 200:
            obj = r.json()
            got = (text_of(kind, obj), obj["choices"][0]["finish_reason"])
            check("after load: a greedy answer still equals the solo one", got == solo[key(kind, body)],
                  f"{got!r} vs {solo[key(kind, body)]!r}")
        h = await client.get("/health")
        check("after load: /health 200", h.status_code == 200, str(h.status_code))

    check("no 5xx (client side)", not [s for s, _ in stats.bad_status if s >= 500], str(stats.bad_status[:5]))
    check("no 5xx (server metrics)", fivexx == 0, f"{fivexx} 5xx responses")
    check("every response is a 200", not stats.bad_status, str(stats.bad_status[:5]))
    check("no transport errors", not stats.transport_errors, "; ".join(stats.transport_errors[:5]))
    check("all requests accounted for", stats.completed + stats.cancelled + len(stats.bad_status)
          + len(stats.transport_errors) == total, f"{stats.completed}+{stats.cancelled} of {total}")
    check("some requests were cancelled mid-flight", stats.cancelled > 0, str(stats.cancelled))
    check("greedy requests were compared", stats.compared > 0, str(stats.compared))
    for kind, body, how, got, ref in stats.mismatches[:5]:
        print(f"  mismatch ({how}) {kind} {json.dumps(body)}\n    got  {got!r}\n    solo {ref!r}")
    check(
        "completed greedy requests equal the same requests run alone",
        not stats.mismatches,
        f"{len(stats.mismatches)} of {stats.compared + stats.prefix_compared} differ",
    )
    print(
        f"\nload summary: {stats.requests} requests from {args.clients} clients, "
        f"{stats.completed} completed, {stats.cancelled} cancelled by the client "
        f"({engine_cancelled:.0f} cancelled in the engine), {stats.compared} greedy compared whole "
        f"+ {stats.prefix_compared} as prefixes; wall {wall:.1f}s; "
        f"{stats.completion_tokens} tokens in completed responses = "
        f"{stats.completion_tokens / wall:.1f} tok/s aggregate "
        f"(server metric kestrel_generated_tokens_total: +{generated:.0f})",
        flush=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url", help="e.g. http://127.0.0.1:8080 (no /v1)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--cancel-fraction", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    args = ap.parse_args()
    asyncio.run(main_async(args))
    finish("load_test")


if __name__ == "__main__":
    main()
