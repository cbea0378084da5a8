#!/usr/bin/env python3
"""Sample a model's next reply to a recorded agent request, many times, through kestrel serve.

The first reply of an agent turn decides the run (does the model read the file first, call
`edit`, or write prose?). A whole `scripts/agent-demo.sh` run costs a 17k-token prefill per
try; here the recorded request (crates/kestrel-server/tests/data/qwen-code/turn1.json, or a
capture of your own: scripts/agent-capture.py) is sent N times to one server, so the prompt is
computed once and every later sample reuses it from the prefix cache. Sampling is the
server's (start it with the settings under test, e.g. Qwen's: --temp 0.7 --top-p 0.8
--top-k 20 --repeat-penalty 1.05); the request is sent as recorded, except stream off and
max_tokens 300.

  python3 scripts/agent-replay.py --port P [--api-key K] [-n 12] REQUEST.json [...]

Prints one JSON line per sample (seconds, cached prompt tokens, finish reason, the tool calls
the server parsed, the start of the content) and a tally per request: first call by tool name,
or "no call".
"""
import argparse
import collections
import json
import time
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--api-key", default="kestrel-demo")
    ap.add_argument("-n", type=int, default=12, help="samples per request")
    ap.add_argument("requests", nargs="+")
    a = ap.parse_args()
    for path in a.requests:
        body = json.load(open(path))
        body["stream"] = False
        body.pop("stream_options", None)
        body["max_tokens"] = 300
        tally = collections.Counter()
        for i in range(a.n):
            t = time.time()
            req = urllib.request.Request(
                f"http://127.0.0.1:{a.port}/v1/chat/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json", "Authorization": f"Bearer {a.api_key}"},
            )
            r = json.load(urllib.request.urlopen(req, timeout=3600))
            m = r["choices"][0]["message"]
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
            tally[calls[0][0] if calls else "no call"] += 1
            cached = (r.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens")
            print(json.dumps({"request": path, "i": i, "s": round(time.time() - t, 1), "cached": cached,
                              "finish": r["choices"][0]["finish_reason"], "calls": calls,
                              "content": (m.get("content") or "")[:300]}), flush=True)
        print(f"{path}: first call in {a.n} samples: {dict(tally)}", flush=True)


if __name__ == "__main__":
    main()
