#!/usr/bin/env python3
"""kestrel and llama.cpp side by side, interleaved, on the same GGUF files and threads.

  python3 scripts/bench_vs_peer.py [MODEL.gguf ...] [--rounds 3] [-r 2] [-p 512] [-n 128]
      [--depths 0,4096] [-t 2] [--log FILE] [--check-tokens 16] [--kestrel BIN] [--peer PY]

Each round runs, back to back, `kestrel bench --json`, then llama.cpp with flash attention on
and off (shared/peers/llamacpp_bench.py --json), for every model and depth. These VMs change
speed by tens of percent from minute to minute (neighbours, SMT siblings), so the ratio is taken
per round (kestrel against the faster of the peer's two settings in that same round) and the
median over rounds is reported with its range. Depth rows measure tg at that depth (p = 0).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_json(cmd):
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    text = out.stdout
    return json.loads(text[text.index("{"):])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-r", type=int, default=2, help="repetitions per side per round")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--depths", default="0,4096")
    ap.add_argument("--depth-n", type=int, default=32, help="tg tokens at depth > 0")
    ap.add_argument("--peer", default=str(ROOT.parent / "shared/peers/llamacpp_bench.py"))
    ap.add_argument("--kestrel", default=str(ROOT / "target/release/kestrel"))
    ap.add_argument("--log", help="append every raw JSON result here")
    ap.add_argument("--check-tokens", type=int, default=16,
                    help="kestrel's fast-vs-reference token check (0 skips it)")
    a = ap.parse_args()
    models = a.models or [
        "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ]
    for path in [a.kestrel, a.peer]:
        if not Path(path).exists():
            sys.exit(f"not found: {path} (build with cargo build --release -p kestrel-cli)")
    depths = [int(d) for d in a.depths.split(",")]
    cpu = next(
        (l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
        "?",
    )
    print(f"== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {cpu}, {a.t} threads, "
          f"{a.rounds} rounds x {a.r} reps")
    results = {}  # (model, depth) -> list of rounds: {"kestrel": j, "fa1": j, "fa0": j}
    log = open(a.log, "a") if a.log else None
    for rnd in range(a.rounds):
        for m in models:
            for d in depths:
                p, n = (a.p, a.n) if d == 0 else (0, a.depth_n)
                common = ["-p", str(p), "-n", str(n), "-d", str(d), "-r", str(a.r), "-t", str(a.t)]
                row = {"kestrel": run_json([a.kestrel, "bench", "-m", m, *common, "--json",
                                           "--check-tokens", str(a.check_tokens)])}
                for fa in (1, 0):
                    row[f"fa{fa}"] = run_json(
                        [sys.executable, a.peer, m, *common, "--fa", str(fa), "--json"])
                results.setdefault((m, d), []).append(row)
                if log:
                    log.write(json.dumps({"round": rnd, "model": m, "depth": d, **row}) + "\n")
                    log.flush()
                print(f"   round {rnd + 1}: {Path(m).name} depth {d} done "
                      f"{time.strftime('%H:%M:%S', time.gmtime())}", flush=True)
    print()
    print("| model | figure | kestrel (median of rounds) | llama.cpp best of fa (median) "
          "| ratio per round | median ratio |")
    print("|---|---|---|---|---|---|")
    for (m, d), rows in results.items():
        p, n = (a.p, a.n) if d == 0 else (0, a.depth_n)
        figures = [(f"pp{p}", "prompt_tok_s")] if p else []
        figures.append((f"tg{n}" + (f" @ depth {d}" if d else ""), "decode_tok_s"))
        for name, key in figures:
            peer_key = f"pp{p}" if key == "prompt_tok_s" else f"tg{n}"
            ours = [r["kestrel"][key]["median"] for r in rows]
            theirs = [max(r["fa1"][peer_key]["median"], r["fa0"][peer_key]["median"]) for r in rows]
            ratios = [o / t for o, t in zip(ours, theirs)]
            print(f"| {Path(m).name} | {name} | {statistics.median(ours):.1f} "
                  f"| {statistics.median(theirs):.1f} "
                  f"| {' / '.join(f'{x:.2f}' for x in ratios)} "
                  f"| **{statistics.median(ratios):.2f}x** |")
        if d == 0:
            ours = max(r["kestrel"]["peak_rss_bytes"]["max"] for r in rows) / 2**20
            theirs = min(min(r["fa1"]["peak_rss_bytes"], r["fa0"]["peak_rss_bytes"]) for r in rows)
            print(f"| {Path(m).name} | peak RSS MiB | {ours:.0f} | {theirs / 2**20:.0f} | | "
                  f"{ours / (theirs / 2**20):.2f} (lower is better) |")
        tokens = (all(r["kestrel"].get("tokens_match_reference") for r in rows)
                  if a.check_tokens else "not checked")
        bw = [(r["kestrel"].get("decode_bandwidth_fraction") or {}).get("median", 0) for r in rows]
        print(f"| {Path(m).name} | fast path tokens = reference | {tokens} | | "
              f"decode/bandwidth {' / '.join(f'{x:.0%}' for x in bw)} | |")


if __name__ == "__main__":
    main()
