"""Decode speed through `kestrel serve` with sampling chains, not only greedy: what a client that
sends sampling fields (or none: OpenAI's defaults, temperature 1) gets on this device. One
server, one request at a time: 256 new tokens (`ignore_eos`) after a short prompt, each chain
twice; prints the decode rate (new tokens / the request's wall time, prefill included: the
prompt is 8 tokens) and the host's time picking a token (`kestrel_sample_seconds_total` from
/metrics, per token). Usage: sampled.py KESTREL MODEL [DEVICE] (default cuda)."""
import atexit, json, re, socket, subprocess, sys, tempfile, time, urllib.request

K, M = sys.argv[1], sys.argv[2]
DEVICE = sys.argv[3] if len(sys.argv) > 3 else "cuda"
N = 256
CHAINS = [
    ("greedy", {"temperature": 0}),
    ("OpenAI defaults (no sampling fields)", {}),
    ("t 0.8 top_k 40 top_p 0.95 min_p 0.05", {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}),
    ("t 0.7 top_p 0.8", {"temperature": 0.7, "top_p": 0.8}),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


port = free_port()
log = tempfile.TemporaryFile(mode="w+")
p = subprocess.Popen([K, "serve", "-m", M, "--device", DEVICE, "--port", str(port), "-c", "1024"],
                     stderr=log, text=True)
atexit.register(p.kill)
for _ in range(3000):
    if p.poll() is not None:
        break
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
        break
    except Exception:
        time.sleep(0.1)
if p.poll() is not None:
    log.seek(0)
    sys.exit(f"server did not start: {log.read()[-3000:]}")


def sample_seconds():
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(r"^kestrel_sample_seconds_total\s+([0-9.eE+-]+)", text, re.M)
    return float(m.group(1)) if m else float("nan")


def complete(fields):
    body = {"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": N, "ignore_eos": True, "seed": 1, **fields}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        res = json.loads(r.read())
    return res["usage"]["completion_tokens"], time.perf_counter() - t0


complete({"temperature": 0})  # warm-up: graphs captured, kernels loaded
for name, fields in CHAINS:
    for rep in range(2):
        s0 = sample_seconds()
        n, wall = complete(fields)
        s1 = sample_seconds()
        print(f"sampled {DEVICE} [{name}] run {rep + 1}: {n} tokens in {wall:.3f} s = {n / wall:.1f} tok/s; "
              f"host picking {1e3 * (s1 - s0) / max(n, 1):.3f} ms a token", flush=True)
