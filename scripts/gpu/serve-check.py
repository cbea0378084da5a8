"""`kestrel serve --device cuda` against `--device cpu` on the same model: many concurrent
greedy requests (the engine batches them into shared GPU steps), a streamed chat, and prefix
reuse (cached_tokens). Usage: serve-check.py KESTREL MODEL. Exit 1 on any difference."""
import concurrent.futures as cf, json, subprocess, sys, time, urllib.request

K, M = sys.argv[1], sys.argv[2]
GPU = __import__("os").environ.get("GPU_DEVICE", "cuda")  # "cpu" tests this script without a GPU


def start(device, port):
    p = subprocess.Popen([K, "serve", "-m", M, "--device", device, "--port", str(port), "--parallel", "8",
                          "-c", "512"], stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except Exception:
            time.sleep(0.1)
    p.kill()
    sys.exit(f"{device} server did not start: {p.stderr.read()}")


def post(port, path, body, stream=False):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode() if stream else json.loads(r.read())


servers = {"cuda": (start(GPU, 8181), 8181), "cpu": (start("cpu", 8182), 8182)}
prompts = [[1 + (i * 37 + j * 11) % 500 for j in range(5 + 7 * i)] for i in range(16)]
out = {}
for dev, (_, port) in servers.items():
    with cf.ThreadPoolExecutor(16) as ex:
        res = list(ex.map(lambda p: post(port, "/v1/completions",
                                         {"prompt": p, "max_tokens": 24, "temperature": 0}), prompts))
    out[dev] = [r["choices"][0]["text"] for r in res]
same = sum(a == b for a, b in zip(out["cuda"], out["cpu"]))
print(f"16 concurrent greedy completions: {same} of 16 equal between --device cuda and --device cpu")
ok = same == 16
port = servers["cuda"][1]
long = [1 + (j * 13) % 500 for j in range(100)]
sse = post(port, "/v1/completions", {"prompt": long, "max_tokens": 16, "temperature": 0, "stream": True,
                                     "stream_options": {"include_usage": True}}, stream=True)
chunks = [l for l in sse.splitlines() if l.startswith("data: ")]
print(f"streamed completion on the GPU: {len(chunks)} events, ends with [DONE]: {chunks[-1] == 'data: [DONE]'}")
ok &= chunks[-1] == "data: [DONE]"
r1 = post(port, "/v1/completions", {"prompt": long + [7], "max_tokens": 8, "temperature": 0})
r2 = post(port, "/v1/completions", {"prompt": long + [7], "max_tokens": 8, "temperature": 0})
cached = (r2["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
print(f"repeated prompt: cached_tokens {cached} of {r2['usage']['prompt_tokens']}; same answer: "
      f"{r1['choices'][0]['text'] == r2['choices'][0]['text']}")
ok &= cached > 0 and r1["choices"][0]["text"] == r2["choices"][0]["text"]
for p, _ in servers.values():
    p.terminate()
print("serve check:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
