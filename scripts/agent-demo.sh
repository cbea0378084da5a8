#!/usr/bin/env bash
# A coding agent fixes a bug through kestrel: Qwen Code (pinned npm package), headless, with its
# default settings, against `kestrel serve`, in a throwaway git repo whose calc.py has add()
# subtracting.
#
#   bash scripts/agent-demo.sh [--runs N] [--model GGUF] [--ctx-size N] [--port P]
#                              [--api-key K] [--timeout SECS] [--keep] [-- EXTRA SERVE ARGS]
#   bash scripts/agent-demo.sh --install-only     # only install the pinned client
#   bash scripts/agent-demo.sh --make-repo DIR    # only create the buggy repo in DIR
#
# Each run: a fresh repo, a fresh HOME for the client (no user settings leak in), a fresh server
# (so turn 1 starts from an empty prefix cache). It reports, per request the server finished
# (one "turn" of the agent): prompt tokens, cached prompt tokens, time to first token, completion
# tokens, finish reason -- read from the server's per-request log line on stderr
# (`request finished prompt_tokens=.. cached_tokens=.. ttft_ms=..`); then whether the bug is
# fixed (`python3 test_calc.py` passes in the repo) and the agent's wall time. With --runs N it
# ends with a summary table of all runs.
#
# Environment overrides (flags win): MODEL, CTX, PORT, API_KEY, RUNS, AGENT_TIMEOUT,
# QWEN_CODE_VERSION, KESTREL_BIN (default target/release/kestrel). The rest of the environment
# reaches the client, so its own knobs can be tried without changing the demo, e.g.
# QWEN_CODE_MAX_OUTPUT_TOKENS=4096 (it sends max_tokens 32768 to a model named qwen*) or
# QWEN_STREAM_IDLE_TIMEOUT_MS=0 (it gives up on a stream that sends no chunk for 240 s, and
# retries twice). The demo proper runs with neither.
#
# Needs: node (>= 20; the package declares 22 but 0.24.4 runs on 20), npm (the first time, to
# install the client from the npm registry), python3, git, curl, and target/release/kestrel
# (cargo build --release).
#
# The client's settings are its defaults except three that only stop it from calling home
# (none of them changes a request body; checked against captures with and without them):
# privacy.usageStatisticsEnabled=false (otherwise it sends usage statistics to an Aliyun RUM
# endpoint), general.enableAutoUpdate=false, telemetry.enabled=false.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

QWEN_CODE_VERSION=${QWEN_CODE_VERSION:-0.24.4}
MODEL=${MODEL:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
CTX=${CTX:-32768}
PORT=${PORT:-18091}
API_KEY=${API_KEY:-kestrel-demo}
RUNS=${RUNS:-1}
AGENT_TIMEOUT=${AGENT_TIMEOUT:-3600}
KEEP=0
INSTALL_ONLY=0
MAKE_REPO=
SERVE_EXTRA=()
PROMPT="calc.py has a bug: add() subtracts. Fix it by editing the file."

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --model|-m) MODEL=$2; shift 2 ;;
        --ctx-size|-c) CTX=$2; shift 2 ;;
        --port) PORT=$2; shift 2 ;;
        --api-key) API_KEY=$2; shift 2 ;;
        --timeout) AGENT_TIMEOUT=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        --make-repo) MAKE_REPO=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; SERVE_EXTRA=("$@"); break ;;
        *) echo "agent-demo: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

# The buggy repo: calc.py (4 lines, add() subtracts) and its test, one commit with fixed
# author, committer and dates so the commit hash (which the client puts in its system prompt)
# is the same every time.
make_repo() {
    local dir=$1
    mkdir -p "$dir"
    cat > "$dir/calc.py" <<'EOF'
def add(a, b):
    return a - b
def mul(a, b):
    return a * b
EOF
    cat > "$dir/test_calc.py" <<'EOF'
import unittest

from calc import add, mul


class TestCalc(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)


if __name__ == "__main__":
    unittest.main()
EOF
    (
        cd "$dir"
        export GIT_AUTHOR_NAME=demo GIT_AUTHOR_EMAIL=demo@example.com \
            GIT_COMMITTER_NAME=demo GIT_COMMITTER_EMAIL=demo@example.com \
            GIT_AUTHOR_DATE="2026-01-01T00:00:00Z" GIT_COMMITTER_DATE="2026-01-01T00:00:00Z"
        git init -q -b main . 2>/dev/null || git init -q .
        git add calc.py test_calc.py
        git -c commit.gpgsign=false commit -qm "calc: add and mul"
    )
}

# A client HOME with only the no-phoning-home settings.
make_home() {
    mkdir -p "$1/.qwen"
    cat > "$1/.qwen/settings.json" <<'EOF'
{
  "privacy": { "usageStatisticsEnabled": false },
  "general": { "enableAutoUpdate": false },
  "telemetry": { "enabled": false }
}
EOF
}

if [[ -n $MAKE_REPO ]]; then
    make_repo "$MAKE_REPO"
    exit 0
fi

# --- the pinned client, installed locally (idempotent) --------------------------------------
AGENT_DIR=$ROOT/target/agent-cli
QWEN=$AGENT_DIR/node_modules/.bin/qwen
installed_version() {
    node -e 'try{console.log(require(process.argv[1]).version)}catch(e){}' \
        "$AGENT_DIR/node_modules/@qwen-code/qwen-code/package.json" 2>/dev/null || true
}
command -v node >/dev/null || { echo "agent-demo: node is missing (need >= 20)" >&2; exit 1; }
NODE_MAJOR=$(node -p 'process.versions.node.split(".")[0]')
if (( NODE_MAJOR < 20 )); then
    echo "agent-demo: node $(node --version) is too old (need >= 20)" >&2
    exit 1
fi
if [[ $(installed_version) != "$QWEN_CODE_VERSION" || ! -x $QWEN ]]; then
    echo "== installing @qwen-code/qwen-code@$QWEN_CODE_VERSION into $AGENT_DIR"
    mkdir -p "$AGENT_DIR"
    [[ -f $AGENT_DIR/package.json ]] || echo '{"private": true}' > "$AGENT_DIR/package.json"
    (cd "$AGENT_DIR" && npm install --no-audit --no-fund --loglevel=error --engine-strict=false \
        "@qwen-code/qwen-code@$QWEN_CODE_VERSION")
fi
if [[ $(installed_version) != "$QWEN_CODE_VERSION" ]]; then
    echo "agent-demo: installing @qwen-code/qwen-code@$QWEN_CODE_VERSION failed" >&2
    exit 1
fi
echo "== client: Qwen Code $("$QWEN" --version 2>/dev/null) (node $(node --version)) at $QWEN"
(( INSTALL_ONLY )) && exit 0

# --- checks ---------------------------------------------------------------------------------
BIN=${KESTREL_BIN:-$ROOT/target/release/kestrel}
[[ -x $BIN ]] || { echo "agent-demo: $BIN is missing; build it: cargo build --release" >&2; exit 1; }
[[ -f $MODEL ]] || { echo "agent-demo: model $MODEL is missing (bash scripts/fetch-models.sh)" >&2; exit 1; }
for t in python3 git curl timeout; do
    command -v $t >/dev/null || { echo "agent-demo: $t is missing" >&2; exit 1; }
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "agent-demo: --runs wants a positive integer" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kestrel-agent-demo.XXXXXX")
SERVER_PID=
cleanup() {
    if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    if (( KEEP )); then
        echo "== kept $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

BASE=http://127.0.0.1:$PORT
echo "== model $MODEL, --ctx-size $CTX, port $PORT, $RUNS run(s), agent timeout ${AGENT_TIMEOUT}s"
echo "== prompt: $PROMPT"

# Per-run report from the server log (and the client's JSON output as a cross-check); appends a
# summary row to $WORK/summary.tsv.
report_run() {
    python3 - "$@" <<'PYEOF'
import json, re, sys
run, log, client_out, fixed, wall, load_s, rc, summary, metrics = sys.argv[1:10]
finished, cancelled, failed = [], 0, []
kv = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
for line in open(log, errors="replace"):
    if "request finished" in line:
        f = dict(kv.findall(line.split("request finished", 1)[1]))
        finished.append(f)
    elif "request cancelled" in line:
        cancelled += 1
    elif "request failed" in line or "request rejected" in line:
        failed.append(line.strip())

# Cancellations also from /metrics (a server that does not log them still counts them).
try:
    for line in open(metrics):
        if line.startswith("kestrel_requests_cancelled_total "):
            cancelled = max(cancelled, int(float(line.split()[1])))
except OSError:
    pass

# The client's view: usage of each model reply it received (main agent), and requests per source.
client_turns, by_source, client_error = [], {}, None
try:
    events = json.load(open(client_out))
    for e in events:
        if e.get("type") == "assistant":
            u = e.get("message", {}).get("usage") or {}
            if u.get("input_tokens"):
                client_turns.append((u.get("input_tokens"), u.get("cache_read_input_tokens", 0)))
        if e.get("type") == "result":
            if e.get("is_error"):
                client_error = (e.get("error") or {}).get("message", "error")
            for m in (e.get("stats", {}).get("models") or {}).values():
                for src, s in (m.get("bySource") or {}).items():
                    by_source[src] = by_source.get(src, 0) + s.get("api", {}).get("totalRequests", 0)
except Exception as ex:  # no JSON: the client died or timed out
    client_error = client_error or "no JSON result from the client (%s)" % type(ex).__name__

def num(f, k):
    try:
        return float(f.get(k, "nan"))
    except ValueError:
        return float("nan")

print("  %-5s %8s %8s %7s %10s %7s %10s  %s" % ("turn", "prompt", "cached", "cached%", "ttft_ms", "gen", "decode_ms", "finish"))
for i, f in enumerate(finished, 1):
    p, c = num(f, "prompt_tokens"), num(f, "cached_tokens")
    pct = 100 * c / p if p == p and p > 0 else float("nan")
    print("  %-5d %8s %8s %6.1f%% %10s %7s %10s  %s" % (i, f.get("prompt_tokens", "?"), f.get("cached_tokens", "?"),
          pct, f.get("ttft_ms", "?"), f.get("completion_tokens", "?"), f.get("decode_ms", "?"), f.get("finish", "?")))
if not finished:
    print("  (no 'request finished' line in the server log)")
if cancelled:
    print("  %d request(s) cancelled by the client (it gave up waiting, or retried)" % cancelled)
for l in failed:
    print("  " + l)
if client_turns:
    print("  client saw (prompt, cached) per reply: %s" % ", ".join("(%s, %s)" % t for t in client_turns))
if by_source:
    print("  client requests by source: %s" % ", ".join("%s=%d" % kv_ for kv_ in sorted(by_source.items())))
if client_error:
    print("  client error: %s" % client_error[:300])
    if "No stream activity" in client_error:
        print("  (the client's stream idle timeout, 240 s by default: no chunk came while the prompt"
              " was prefilled; it retried twice, then gave up)")
    elif "max_tokens" in client_error:
        print("  (the client asks for max_tokens 32768 for a model named qwen*)")
print("  agent exit %s, bug fixed: %s, agent wall %.1f s (server load %.1f s)" % (rc, fixed, float(wall), float(load_s)))

first = finished[0] if finished else {}
later = finished[1:]
later_pct = [100 * num(f, "cached_tokens") / num(f, "prompt_tokens") for f in later if num(f, "prompt_tokens") > 0]
later_ttft = [num(f, "ttft_ms") for f in later]
t1_ttft = num(first, "ttft_ms")
ratio = 100 * max(later_ttft) / t1_ttft if later_ttft and t1_ttft > 0 else float("nan")
if later:
    print("  later turns: cached >= %.1f%% of the prompt, TTFT <= %.1f%% of turn 1's" % (min(later_pct), ratio))
row = [run, fixed, "%.1f" % float(wall), str(len(finished)), str(cancelled),
       first.get("prompt_tokens", "-"), first.get("ttft_ms", "-"),
       "%.1f" % min(later_pct) if later_pct else "-",
       "%.0f" % max(later_ttft) if later_ttft else "-",
       "%.1f" % ratio if ratio == ratio else "-", rc]
with open(summary, "a") as s:
    s.write("\t".join(row) + "\n")
PYEOF
}

SUMMARY=$WORK/summary.tsv
: > "$SUMMARY"
for run in $(seq 1 "$RUNS"); do
    RUN_DIR=$WORK/run$run
    REPO=$RUN_DIR/repo
    CHOME=$RUN_DIR/home
    LOG=$RUN_DIR/server.log
    mkdir -p "$RUN_DIR"
    make_repo "$REPO"
    make_home "$CHOME"
    echo
    echo "== run $run/$RUNS: repo $REPO"

    if curl -s -o /dev/null "$BASE/health" 2>/dev/null; then
        echo "agent-demo: something already answers on port $PORT; pick another with --port" >&2
        exit 1
    fi
    LOAD_START=$(date +%s.%N)
    "$BIN" serve -m "$MODEL" --port "$PORT" --api-key "$API_KEY" --ctx-size "$CTX" \
        ${SERVE_EXTRA[@]+"${SERVE_EXTRA[@]}"} 2> "$LOG" > "$RUN_DIR/server.out" &
    SERVER_PID=$!
    until curl -sf "$BASE/health" >/dev/null 2>&1; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "agent-demo: the server exited while loading; its log:" >&2
            cat "$LOG" >&2
            exit 1
        fi
        sleep 0.5
    done
    LOAD_S=$(python3 -c "import sys,time; print('%.1f' % (time.time() - float(sys.argv[1])))" "$LOAD_START")
    # The name the server gives the model (the client picks its prompt examples and max_tokens
    # from it: a name starting with "qwen" gets max_tokens 32768 and the Qwen-coder XML examples).
    MODEL_ID=$(curl -sf -H "Authorization: Bearer $API_KEY" "$BASE/v1/models" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    echo "   server up in ${LOAD_S}s, model id $MODEL_ID; agent running (timeout ${AGENT_TIMEOUT}s)..."

    AGENT_START=$(date +%s.%N)
    set +e
    (cd "$REPO" && env HOME="$CHOME" QWEN_CODE_SUPPRESS_YOLO_WARNING=1 NO_COLOR=1 \
        timeout -k 10 "$AGENT_TIMEOUT" "$QWEN" --auth-type openai \
            --openai-base-url "$BASE/v1" --openai-api-key "$API_KEY" -m "$MODEL_ID" \
            --approval-mode yolo -o json "$PROMPT" \
            > "$RUN_DIR/agent.json" 2> "$RUN_DIR/agent.err" < /dev/null)
    AGENT_RC=$?
    set -e
    WALL=$(python3 -c "import sys,time; print('%.1f' % (time.time() - float(sys.argv[1])))" "$AGENT_START")
    [[ $AGENT_RC == 124 ]] && echo "   the agent timed out after ${AGENT_TIMEOUT}s"

    if (cd "$REPO" && timeout 60 python3 test_calc.py > "$RUN_DIR/test.out" 2>&1); then
        FIXED=yes
    else
        FIXED=no
    fi
    curl -sf -H "Authorization: Bearer $API_KEY" "$BASE/metrics" > "$RUN_DIR/metrics.txt" || true
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=

    report_run "$run" "$LOG" "$RUN_DIR/agent.json" "$FIXED" "$WALL" "$LOAD_S" "$AGENT_RC" \
        "$SUMMARY" "$RUN_DIR/metrics.txt"
    grep -h 'kestrel_http_requests_total{route="/v1/chat' "$RUN_DIR/metrics.txt" 2>/dev/null |
        sed 's/^/   metrics: /' || true
    echo "   repo diff:"
    (cd "$REPO" && git --no-pager diff --stat && git --no-pager diff -- calc.py) | sed 's/^/     /'
done

echo
echo "== summary ($RUNS run(s), model $(basename "$MODEL"), ctx $CTX)"
python3 - "$SUMMARY" <<'PYEOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
head = ["run", "fixed", "wall_s", "turns", "cancelled", "t1_prompt", "t1_ttft_ms",
        "later_min_cached%", "later_max_ttft_ms", "later/t1_ttft%", "exit"]
w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
print("  " + "  ".join(h.rjust(w[i]) for i, h in enumerate(head)))
for r in rows:
    print("  " + "  ".join(c.rjust(w[i]) for i, c in enumerate(r)))
fixed = sum(r[1] == "yes" for r in rows)
print("  fixed in %d of %d run(s)" % (fixed, len(rows)))
PYEOF
