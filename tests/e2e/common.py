"""Helpers shared by the end-to-end scripts (no third-party imports beyond httpx)."""

import json
import math
import re
import struct
import sys

try:  # the `openai` package ships its HTTP client as `httpx2` in recent releases
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai releases depend on plain httpx
    import httpx

FAILURES = []


def check(name, cond, detail=""):
    status = "ok  " if cond else "FAIL"
    print(f"{status} {name}" + (f": {detail}" if detail and not cond else ""), flush=True)
    if not cond:
        FAILURES.append(name)
    return cond


def finish(script):
    if FAILURES:
        print(f"\n{script}: {len(FAILURES)} check(s) failed: {', '.join(FAILURES)}", flush=True)
        sys.exit(1)
    print(f"\n{script}: all checks passed", flush=True)


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text):
    """Prometheus text -> {name or name{labels}: float}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC.match(line.strip())
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} from a safetensors file, with plain Python."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        out[name] = (meta["dtype"], meta["shape"], data[base + start : base + end])
    return out


def f32_row(raw, row, width):
    return struct.unpack_from(f"<{width}f", raw, row * width * 4)


def log_softmax(xs):
    m = max(xs)
    lse = m + math.log(sum(math.exp(x - m) for x in xs))
    return [x - lse for x in xs]
