#!/usr/bin/env python3
"""Drives a running kestrel server with the official `openai` Python SDK.

Usage (the server must already be serving a chat model, e.g. Qwen2.5-Coder; scripts/e2e.sh
runs it against the 0.5B model):

    pip install openai
    kestrel serve -m models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --port 8080 --api-key KEY &
    python3 tests/e2e/openai_client.py http://127.0.0.1:8080/v1 [--api-key KEY]

Exits 0 when every check passes, 1 (with the failing check named) otherwise. Checks: chat
non-streamed and streamed, a text completion, usage with cached tokens on a repeated prefix,
a tool-call round trip, a cancelled stream (the server keeps answering afterwards), and a few
error shapes (unknown model, n > 1, bad temperature).
"""

import argparse
import json
import sys
import time

import openai
from openai import OpenAI

FAILURES = []


def check(name, cond, detail=""):
    status = "ok  " if cond else "FAIL"
    print(f"{status} {name}" + (f": {detail}" if detail and not cond else ""))
    if not cond:
        FAILURES.append(name)


def model_id(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    check("models.list has one model", len(ids) == 1, str(ids))
    return ids[0]


def chat_non_streamed(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Write a Python function that adds two numbers."}],
        max_tokens=48,
        temperature=0,
    )
    c = r.choices[0]
    check("chat: content", bool(c.message.content), repr(c.message.content))
    check("chat: finish_reason", c.finish_reason in ("stop", "length"), c.finish_reason)
    check("chat: usage", r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, str(r.usage))
    check(
        "chat: cached_tokens present",
        r.usage.prompt_tokens_details is not None
        and r.usage.prompt_tokens_details.cached_tokens is not None,
        str(r.usage),
    )
    return c.message.content


def chat_streamed(client, model, expected):
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Write a Python function that adds two numbers."}],
        max_tokens=48,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, roles, finish, usage = "", [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    check("stream: role first", roles[:1] == ["assistant"], str(roles))
    check("stream: greedy text equals non-streamed", text == expected, f"{text!r} vs {expected!r}")
    check("stream: finish_reason", finish in ("stop", "length"), str(finish))
    check("stream: usage chunk", usage is not None and usage.completion_tokens > 0, str(usage))


def completion(client, model):
    r = client.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=24, temperature=0)
    check("completion: text", bool(r.choices[0].text), repr(r.choices[0].text))
    check("completion: usage", r.usage.completion_tokens > 0, str(r.usage))


def cached_prefix(client, model):
    long_system = "You are a careful assistant. " + " ".join(f"Rule {i}: be precise." for i in range(60))
    msgs = lambda q: [{"role": "system", "content": long_system}, {"role": "user", "content": q}]
    client.chat.completions.create(model=model, messages=msgs("Say hi."), max_tokens=4, temperature=0)
    r = client.chat.completions.create(model=model, messages=msgs("Say bye."), max_tokens=4, temperature=0)
    cached = r.usage.prompt_tokens_details.cached_tokens
    check("prefix cache: cached_tokens > 0 on a repeated prefix", cached > 0, str(r.usage))
    check("prefix cache: cached < prompt", cached < r.usage.prompt_tokens, str(r.usage))


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]


def tool_round_trip(client, model):
    messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=96, temperature=0)
    msg = r.choices[0].message
    calls = msg.tool_calls or []
    check("tools: a call came back", len(calls) >= 1, repr(msg))
    if not calls:
        return
    call = calls[0]
    check("tools: finish_reason tool_calls", r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
    check("tools: function name", call.function.name == "get_weather", call.function.name)
    args = json.loads(call.function.arguments)
    check("tools: arguments are a JSON object string", isinstance(args, dict), call.function.arguments)
    messages.append(msg.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "temp_c": 21})})
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=64, temperature=0)
    check("tools: answer after the tool result", bool(r.choices[0].message.content), repr(r.choices[0].message))

    # Streamed tool call deltas accumulate to the same call.
    stream = client.chat.completions.create(
        model=model, messages=messages[:1], tools=TOOLS, max_tokens=96, temperature=0, stream=True
    )
    names = []
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
    check("tools: streamed delta.tool_calls", names == ["get_weather"], str(names))


def cancelled_stream(client, model):
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count from 1 to 1000, one number per line."}],
        max_tokens=2000,
        stream=True,
    )
    got = 0
    for chunk in stream:
        got += 1
        if got >= 5:
            break
    stream.close()  # closes the connection: the server must cancel the request
    time.sleep(0.5)
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say ok."}], max_tokens=4, temperature=0
    )
    check("cancel: server answers after a cancelled stream", r.choices[0].message is not None)


def errors(client, model):
    def expect(name, status, fn):
        try:
            fn()
            check(name, False, "no error")
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            ok = e.status_code == status and bool(body.get("message"))
            check(name, ok, f"{e.status_code} {e.body}")

    msgs = [{"role": "user", "content": "hi"}]
    expect("error: unknown model -> 404", 404, lambda: client.chat.completions.create(model="no-such-model", messages=msgs))
    expect("error: n=2 -> 400", 400, lambda: client.chat.completions.create(model=model, messages=msgs, n=2))
    expect("error: temperature=-1 -> 400", 400, lambda: client.chat.completions.create(model=model, messages=msgs, temperature=-1))
    expect("error: empty messages -> 400", 400, lambda: client.chat.completions.create(model=model, messages=[]))
    # Commonly sent fields are accepted.
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=2, user="u", metadata={"a": "b"}, store=False)
    check("unknown common fields accepted", r.choices[0].finish_reason in ("stop", "length"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url", help="e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="none")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=120, max_retries=0)
    model = model_id(client)
    expected = chat_non_streamed(client, model)
    chat_streamed(client, model, expected)
    completion(client, model)
    cached_prefix(client, model)
    tool_round_trip(client, model)
    cancelled_stream(client, model)
    errors(client, model)
    if FAILURES:
        print(f"\n{len(FAILURES)} check(s) failed: {', '.join(FAILURES)}")
        sys.exit(1)
    print("\nall checks passed")


if __name__ == "__main__":
    main()
