#!/usr/bin/env bash
# End-to-end tests of `kestrel serve` on loopback ports with the real models.
#
# Expects target/release/kestrel (build it first: cargo build --release -p kestrel-cli) and the
# models in models/ (bash scripts/fetch-models.sh). Uses .venv (created if missing) with the
# `openai` package pinned below. Starts two servers on free loopback ports:
#   - Qwen2.5-Coder 0.5B with an API key: the official SDK checks (tests/e2e/openai_client.py),
#     the API-key checks and a logprobs-vs-logits check;
#   - SmolLM2 135M with --parallel 8: the load test (tests/e2e/load_test.py), then the API
#     behaviour checks (tests/e2e/api_checks.py);
#   - Qwen2.5-Coder 0.5B with a 20k context: Qwen Code's recorded requests (a 17.5k-token first
#     turn, then the next turn from the prefix cache; tests/e2e/agent_request.py);
#   - then, speculative decoding: SmolLM2 with --spec lookup and Qwen2.5-Coder 1.5B with the
#     0.5B as its draft model: greedy output equals plain decoding through the CLI and the
#     server (tests/e2e/spec_check.py); beside them the hybrid tiny-qwen3_5 (in the repository):
#     its prefix cache through the SDK (tests/e2e/hybrid_cache.py), and speculating with
#     tiny-qwen2 as its draft: the server equals plain greedy (tests/e2e/hybrid_spec.py).
# The servers are always killed on exit. Exits non-zero if any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$(date +%s)

BIN=$ROOT/target/release/kestrel
QWEN=$ROOT/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
QWEN15=$ROOT/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
SMOL=$ROOT/models/smollm2-135m-instruct-q4_1.gguf
OPENAI_VERSION=${OPENAI_VERSION:-3.57.0}
SMOL_CTX=2048
AGENT_CTX=20480

if [[ ! -x $BIN ]]; then
    echo "e2e: $BIN is missing; build it first: cargo build --release -p kestrel-cli" >&2
    exit 1
fi
for m in "$QWEN" "$QWEN15" "$SMOL"; do
    if [[ ! -f $m ]]; then
        echo "e2e: model $m is missing; fetch it first: bash scripts/fetch-models.sh" >&2
        exit 1
    fi
done

echo "== e2e: python environment (.venv, openai==$OPENAI_VERSION)"
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
PY=$ROOT/.venv/bin/python
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ next to the test scripts
if ! "$PY" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
    "$PY" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kestrel-e2e.XXXXXX")
PIDS=()
FAILED=()
cleanup() {
    local rc=$?
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ $rc -ne 0 ]]; then
        for log in "$WORK"/*.log; do
            [[ -f $log ]] || continue
            echo "--- last lines of $(basename "$log")"
            tail -n 20 "$log"
        done
    fi
    rm -rf "$WORK"
    echo "== e2e: total $(($(date +%s) - START))s"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Free loopback ports (bound, then released; the servers bind them right after).
read -r QWEN_PORT SMOL_PORT AGENT_PORT < <("$PY" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
API_KEY="e2e-$RANDOM$RANDOM"

echo "== e2e: starting servers (qwen 0.5B on :$QWEN_PORT with a key, SmolLM2 on :$SMOL_PORT --parallel 8)"
"$BIN" serve -m "$QWEN" --port "$QWEN_PORT" --api-key "$API_KEY" >"$WORK/qwen.log" 2>&1 &
PIDS+=($!)
QWEN_PID=$!
"$BIN" serve -m "$SMOL" --port "$SMOL_PORT" --parallel 8 --ctx-size "$SMOL_CTX" >"$WORK/smol.log" 2>&1 &
PIDS+=($!)
SMOL_PID=$!
"$BIN" serve -m "$QWEN" --port "$AGENT_PORT" --parallel 1 --ctx-size "$AGENT_CTX" >"$WORK/agent.log" 2>&1 &
PIDS+=($!)
AGENT_PID=$!

wait_health() { # name pid port
    local deadline=$(($(date +%s) + 180))
    while :; do
        if ! kill -0 "$2" 2>/dev/null; then
            echo "e2e: the $1 server exited before it was ready" >&2
            return 1
        fi
        if "$PY" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$3/health', timeout=2)" 2>/dev/null; then
            echo "   $1 server ready on :$3"
            return 0
        fi
        if (($(date +%s) > deadline)); then
            echo "e2e: the $1 server did not answer /health within 180s" >&2
            return 1
        fi
        sleep 0.2
    done
}
wait_health qwen "$QWEN_PID" "$QWEN_PORT"
wait_health smollm2 "$SMOL_PID" "$SMOL_PORT"
wait_health agent "$AGENT_PID" "$AGENT_PORT"

step() { # name command...
    local name=$1 t0
    shift
    t0=$(date +%s)
    echo "== e2e: $name"
    if "$@"; then
        echo "== e2e: $name passed ($(($(date +%s) - t0))s)"
    else
        echo "== e2e: $name FAILED ($(($(date +%s) - t0))s)"
        FAILED+=("$name")
    fi
}

step "openai SDK checks (qwen 0.5B)" \
    "$PY" tests/e2e/openai_client.py "http://127.0.0.1:$QWEN_PORT/v1" --api-key "$API_KEY"
step "load test (SmolLM2, 32 clients x 10 requests, 30% disconnecting)" \
    "$PY" tests/e2e/load_test.py "http://127.0.0.1:$SMOL_PORT"
step "API checks (SmolLM2; key and logprobs on qwen 0.5B)" \
    "$PY" tests/e2e/api_checks.py "http://127.0.0.1:$SMOL_PORT" --model "$SMOL" --kestrel "$BIN" \
    --ctx-size "$SMOL_CTX" --keyed-url "http://127.0.0.1:$QWEN_PORT" --api-key "$API_KEY" --keyed-model "$QWEN"

step "agent requests (Qwen Code's recorded turns on qwen 0.5B; max_tokens to the context on SmolLM2)" \
    "$PY" tests/e2e/agent_request.py "http://127.0.0.1:$AGENT_PORT" --ctx-size "$AGENT_CTX" \
    --small-url "http://127.0.0.1:$SMOL_PORT" --small-ctx "$SMOL_CTX" --small-model-ctx 8192

for pid in "$QWEN_PID" "$SMOL_PID" "$AGENT_PID"; do
    if ! kill -0 "$pid" 2>/dev/null; then
        FAILED+=("server (pid $pid) exited during the tests")
    fi
done

# Speculative decoding: two more servers, started now that the others are done with the CPU;
# and the hybrid model (tiny-qwen3_5, in the repository) for its prefix cache, and speculating
# with tiny-qwen2 as its draft.
read -r LOOKUP_PORT DRAFT_PORT HYBRID_PORT HYBRID_SPEC_PORT < <("$PY" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
echo "== e2e: starting speculative servers (SmolLM2 --spec lookup on :$LOOKUP_PORT, qwen 1.5B --spec draft with 0.5B on :$DRAFT_PORT)"
"$BIN" serve -m "$SMOL" --port "$LOOKUP_PORT" --parallel 2 --spec lookup >"$WORK/lookup.log" 2>&1 &
PIDS+=($!)
LOOKUP_PID=$!
"$BIN" serve -m "$QWEN15" --port "$DRAFT_PORT" --parallel 2 --ctx-size 2048 --spec draft \
    --draft-model "$QWEN" >"$WORK/draft.log" 2>&1 &
PIDS+=($!)
DRAFT_PID=$!
"$BIN" serve -m testdata/tiny/tiny-qwen3_5/qwen3_5-f32.gguf --port "$HYBRID_PORT" >"$WORK/hybrid.log" 2>&1 &
PIDS+=($!)
HYBRID_PID=$!
"$BIN" serve -m testdata/tiny/tiny-qwen3_5/qwen3_5-f32.gguf --port "$HYBRID_SPEC_PORT" --spec draft \
    --draft-model testdata/tiny/tiny-qwen2/qwen2-f32.gguf --spec-k 4 --kv-type f32 >"$WORK/hybrid-spec.log" 2>&1 &
PIDS+=($!)
HYBRID_SPEC_PID=$!
wait_health lookup "$LOOKUP_PID" "$LOOKUP_PORT"
wait_health draft "$DRAFT_PID" "$DRAFT_PORT"
wait_health hybrid "$HYBRID_PID" "$HYBRID_PORT"
wait_health hybrid-spec "$HYBRID_SPEC_PID" "$HYBRID_SPEC_PORT"
step "hybrid prefix cache (tiny-qwen3_5: the same prompt reused whole, a second turn, a cold rerun)" \
    "$PY" tests/e2e/hybrid_cache.py "http://127.0.0.1:$HYBRID_PORT/v1"
step "speculative decoding equals plain greedy (SmolLM2 lookup: CLI and server)" \
    "$PY" tests/e2e/spec_check.py --kestrel "$BIN" --model "$SMOL" --server "http://127.0.0.1:$LOOKUP_PORT"
step "speculative decoding equals plain greedy (qwen 1.5B lookup and 0.5B draft: CLI; draft: server)" \
    "$PY" tests/e2e/spec_check.py --kestrel "$BIN" --model "$QWEN15" --draft-model "$QWEN" \
    --server "http://127.0.0.1:$DRAFT_PORT"
step "speculative decoding on the hybrid model (tiny-qwen3_5, tiny-qwen2 drafting): server equals plain greedy" \
    "$PY" tests/e2e/hybrid_spec.py --kestrel "$BIN" --model testdata/tiny/tiny-qwen3_5/qwen3_5-f32.gguf \
    --server "http://127.0.0.1:$HYBRID_SPEC_PORT"
step "the hybrid speculating server's plan says which state snapshot slots back up its sequences (the dense one's does not)" \
    bash -c 'grep -q "speculation: 2 of the [0-9]* state snapshot slots" "$1" && ! grep -q "snapshot slots" "$2"' _ \
    "$WORK/hybrid-spec.log" "$WORK/lookup.log"
for pid in "$LOOKUP_PID" "$DRAFT_PID" "$HYBRID_PID" "$HYBRID_SPEC_PID"; do
    if ! kill -0 "$pid" 2>/dev/null; then
        FAILED+=("server (pid $pid) exited during the tests")
    fi
done

if ((${#FAILED[@]})); then
    echo "== e2e: FAILED: ${FAILED[*]}"
    exit 1
fi
echo "== e2e: all passed"
