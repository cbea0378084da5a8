#!/usr/bin/env python3
"""Record what the Qwen Code CLI sends to an OpenAI-compatible server.

Runs the pinned client (installed by `bash scripts/agent-demo.sh --install-only`) headless, the
way scripts/agent-demo.sh does, against a scripted mock server on loopback that logs every
request body verbatim, and writes the bodies (pretty-printed JSON) into --out:

  scenario "tool" (the model answers in OpenAI's streamed `tool_calls` deltas):
    turn1.json  the first request (system prompt, tools, multi-part user content)
    turn2.json  after the reply `read_file(calc.py)`: + assistant tool_calls + tool result
    turn3.json  after the reply `edit(calc.py, a - b -> a + b)`: + a second pair
    (the mock's third reply is plain text, which ends the session; the bug is then fixed)
  scenario "content-and-tool-calls": the same, but each tool-call reply also streams text first:
    turn3-content-and-tool-calls.json
  scenario "xml" (the first reply is Qwen3-Coder's XML tool call as plain `content`):
    memory-extractor.json  the client does not parse the XML: it takes the reply as the final
    answer, ends the session, then sends this background "managed auto-memory" request

Fixed paths (/tmp/kestrel-qwen-code-capture/{repo,home}) and a fixed commit make the bodies the
same from one capture to the next except for the date the client writes into the prompt.

  python3 scripts/agent-capture.py [--out DIR] [--model-name NAME] [--keep-raw DIR]
"""
import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN = os.path.join(ROOT, "target/agent-cli/node_modules/.bin/qwen")
BASE = "/tmp/kestrel-qwen-code-capture"
PROMPT = "calc.py has a bug: add() subtracts. Fix it by editing the file."
OLD = "def add(a, b):\n    return a - b"
NEW = "def add(a, b):\n    return a + b"


class Mock:
    """A scripted OpenAI-compatible server: records bodies, answers by scenario and turn."""

    def __init__(self, scenario, calc_path):
        self.scenario = scenario
        self.calc = calc_path
        self.requests = []  # (path, raw body bytes)
        self.lock = threading.Lock()

    def reply(self, req):
        """('tool', name, args, leading_text) or ('text', content)."""
        msgs = req.get("messages", [])
        system = msgs[0].get("content", "") if msgs else ""
        if isinstance(system, str) and "managed memory extraction" in system[:300]:
            return ("text", "Nothing durable to save.")
        turn = 1 + sum(1 for m in msgs if m.get("role") == "assistant")
        if self.scenario in ("tool", "content-and-tool-calls"):
            lead = self.scenario == "content-and-tool-calls"
            if turn == 1:
                return ("tool", "read_file", {"file_path": self.calc},
                        "I'll read calc.py first." if lead else None)
            if turn == 2:
                return ("tool", "edit",
                        {"file_path": self.calc, "old_string": OLD, "new_string": NEW},
                        "add() subtracts; fixing it." if lead else None)
            return ("text", "Fixed: add() now returns a + b.")
        if self.scenario == "xml" and turn == 1:
            return ("text",
                    "<tool_call>\n<function=edit>\n<parameter=file_path>\n" + self.calc +
                    "\n</parameter>\n<parameter=old_string>\n" + OLD +
                    "\n</parameter>\n<parameter=new_string>\n" + NEW +
                    "\n</parameter>\n</function>\n</tool_call>")
        return ("text", "Done.")

    def handler(mock):
        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send_json(self, obj):
                b = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def do_GET(self):
                self.send_json({"object": "list", "data": [{"id": "mock", "object": "model"}]})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with mock.lock:
                    mock.requests.append((self.path, body))
                req = json.loads(body)
                r = mock.reply(req)
                head = {"id": "chatcmpl-mock", "object": "chat.completion.chunk",
                        "created": int(time.time()), "model": req.get("model", "mock")}
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()

                def ev(choices, **extra):
                    o = dict(head, choices=choices, **extra)
                    self.wfile.write(b"data: " + json.dumps(o).encode() + b"\n\n")
                    self.wfile.flush()

                def delta(d, finish=None):
                    ev([{"index": 0, "delta": d, "finish_reason": finish}])

                delta({"role": "assistant", "content": ""})
                if r[0] == "tool":
                    _, name, args, lead = r
                    if lead:
                        delta({"content": lead})
                    a = json.dumps(args)
                    delta({"tool_calls": [{"index": 0, "id": "call_%d" % len(mock.requests),
                                           "type": "function",
                                           "function": {"name": name, "arguments": ""}}]})
                    for i in range(0, len(a), 24):
                        delta({"tool_calls": [{"index": 0, "function": {"arguments": a[i:i + 24]}}]})
                    delta({}, "tool_calls")
                else:
                    text = r[1]
                    for i in range(0, len(text), 16):
                        delta({"content": text[i:i + 16]})
                    delta({}, "stop")
                if (req.get("stream_options") or {}).get("include_usage"):
                    ev([], usage={"prompt_tokens": 100, "completion_tokens": 10,
                                  "total_tokens": 110})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True
        return H


def run_scenario(scenario, model_name):
    shutil.rmtree(BASE, ignore_errors=True)
    repo, home = os.path.join(BASE, "repo"), os.path.join(BASE, "home")
    subprocess.run(["bash", os.path.join(ROOT, "scripts/agent-demo.sh"), "--make-repo", repo],
                   check=True)
    os.makedirs(os.path.join(home, ".qwen"))
    with open(os.path.join(home, ".qwen/settings.json"), "w") as f:
        json.dump({"privacy": {"usageStatisticsEnabled": False},
                   "general": {"enableAutoUpdate": False},
                   "telemetry": {"enabled": False}}, f, indent=2)
    mock = Mock(scenario, os.path.join(repo, "calc.py"))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), mock.handler())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    env = dict(os.environ, HOME=home, QWEN_CODE_SUPPRESS_YOLO_WARNING="1", NO_COLOR="1")
    for k in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"):
        env.pop(k, None)
    cmd = [QWEN, "--auth-type", "openai", "--openai-base-url", "http://127.0.0.1:%d/v1" % port,
           "--openai-api-key", "sk-capture", "-m", model_name, "--approval-mode", "yolo",
           "-o", "json", PROMPT]
    p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    srv.shutdown()
    fixed = subprocess.run([sys.executable, "test_calc.py"], cwd=repo,
                           capture_output=True).returncode == 0
    print("scenario %s: client exit %d, %d request(s), bug fixed: %s"
          % (scenario, p.returncode, len(mock.requests), fixed))
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-2000:])
    return mock.requests


def write(out, name, raw):
    with open(os.path.join(out, name), "w") as f:
        json.dump(json.loads(raw), f, indent=2, ensure_ascii=False)
        f.write("\n")
    print("  wrote %s (%d bytes raw)" % (os.path.join(out, name), len(raw)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "crates/kestrel-server/tests/data/qwen-code"))
    ap.add_argument("--model-name", default="qwen2.5-coder-1.5b-instruct-q4_k_m",
                    help="the model id kestrel serves for the 1.5B GGUF (its file stem)")
    ap.add_argument("--keep-raw", help="also copy the raw request bodies into this folder")
    args = ap.parse_args()
    if not os.access(QWEN, os.X_OK):
        sys.exit("agent-capture: %s missing; run: bash scripts/agent-demo.sh --install-only" % QWEN)
    os.makedirs(args.out, exist_ok=True)
    captures = {}
    for scenario in ("tool", "content-and-tool-calls", "xml"):
        captures[scenario] = run_scenario(scenario, args.model_name)
        if args.keep_raw:
            d = os.path.join(args.keep_raw, scenario)
            os.makedirs(d, exist_ok=True)
            for i, (_, raw) in enumerate(captures[scenario], 1):
                with open(os.path.join(d, "%03d.json" % i), "wb") as f:
                    f.write(raw)
    tool = captures["tool"]
    assert len(tool) == 3, "expected 3 requests in the tool scenario, got %d" % len(tool)
    for i, (_, raw) in enumerate(tool, 1):
        write(args.out, "turn%d.json" % i, raw)
    both = captures["content-and-tool-calls"]
    assert len(both) == 3, len(both)
    write(args.out, "turn3-content-and-tool-calls.json", both[2][1])
    xml = captures["xml"]
    extractor = [raw for _, raw in xml if b"managed memory extraction" in raw[:2000]]
    assert extractor, "expected the memory-extractor request in the xml scenario"
    write(args.out, "memory-extractor.json", extractor[0])
    shutil.rmtree(BASE, ignore_errors=True)


if __name__ == "__main__":
    main()
