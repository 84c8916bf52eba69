#!/usr/bin/env bash
# A real Prometheus server scrapes `dtrain train --metrics-port`: it starts
# with a generated config that scrapes the endpoint every second, a 2-worker
# run (slowed by DTRAIN_SLOW_RANK, and stopped with SIGUSR1 once the checks
# are done, so that it outlasts them however slow the machine) serves
# /metrics, and the series are read back through Prometheus's HTTP API (/api/v1/query),
# including the per-rank ones with their rank label. The endpoint's answers
# to a bad request and a NUL byte (400), a wrong path (404) and a wrong
# method (405) are checked directly.
#   tests/prometheus.sh BUILD_DIR
# Skipped (exit 77) when Prometheus is not installed.
set -euo pipefail
build=$(cd "$1" && pwd)
if ! command -v prometheus >/dev/null; then
    echo "SKIPPED: prometheus is not installed (Debian package 'prometheus'; scripts/install-deps.sh installs it)"
    exit 77
fi
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mport=$(free_port)
pport=$(free_port)

# The C tests' small synthetic image set.
"$build/tests/make_images" "$tmp"

cat > "$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dtrain
    static_configs:
      - targets: ['127.0.0.1:$mport']
YML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
    --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$tmp/prometheus.log" 2>&1 &
pids+=($!)

# Prometheus reads its targets a few seconds after it starts: wait for that.
python3 - "$pport" <<'PY'
import json, sys, time, urllib.request
deadline = time.time() + 30
while time.time() < deadline:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/v1/targets", timeout=2) as r:
            if json.load(r)["data"]["activeTargets"]:
                sys.exit(0)
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.3)
print("Prometheus did not come up in 30 s")
sys.exit(1)
PY

# Training until the checks are done: rank 1 sleeps 100 ms in each step's
# forward pass (10 steps a second, far more steps than the checks take).
DTRAIN_SLOW_RANK=1:100 "$build/dtrain" train "$src/tests/fixtures/obs-mlp.ini" --workers 2 --quiet \
    --set data.dir="$tmp" --set train.epochs=1000000 --set train.max_steps=100000000 --run-dir "$tmp/run" \
    --metrics-port "$mport" >"$tmp/train.log" 2>&1 &
train=$!
pids+=($train)

rc=0
python3 - "$mport" "$pport" <<'PY' || rc=1
import json, socket, sys, time, urllib.parse, urllib.request
mport, pport = sys.argv[1], sys.argv[2]
deadline = time.time() + 30
failed = 0

def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed += not ok

def raw(req):
    s = socket.create_connection(("127.0.0.1", int(mport)), timeout=5)
    s.sendall(req)
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    return data

def query(q):
    url = f"http://127.0.0.1:{pport}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)["data"]["result"]

# The endpoint itself, once it is up.
while time.time() < deadline:
    try:
        page = raw(b"GET /metrics HTTP/1.0\r\n\r\n")
        break
    except OSError:
        time.sleep(0.2)
else:
    page = b""
head, _, body = page.partition(b"\r\n\r\n")
check(head.startswith(b"HTTP/1.1 200") and b"text/plain; version=0.0.4" in head, "GET /metrics: 200, exposition format 0.0.4")
check(b"# TYPE dtrain_samples_total counter" in body and b"# HELP dtrain_loss " in body, "HELP and TYPE lines")
check(raw(b"GET /nope HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 404"), "GET /nope: 404")
check(raw(b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400"), "malformed request: 400")
check(raw(b"POST /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 405"), "POST: 405")
check(raw(b"GET /metrics\0 HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 400"), "a NUL byte in the request line: 400")

# Prometheus's view: job-level and per-rank series, scraped while training runs.
want = {
    "dtrain_samples_total": 1,
    "dtrain_step": 1,
    "dtrain_loss": 1,
    "dtrain_rank_step_seconds": 2,
    'dtrain_rank_phase_seconds_total{phase="forward"}': 2,
    "dtrain_rank_comm_sent_bytes_total": 2,
}
got = {}
while time.time() < deadline:
    try:
        got = {q: query(q) for q in want}
        if all(len(got[q]) >= n for q, n in want.items()) and float(got["dtrain_step"][0]["value"][1]) > 0:
            break
    except (OSError, KeyError, ValueError):
        pass
    time.sleep(0.5)
for q, n in want.items():
    check(len(got.get(q, [])) >= n, f"Prometheus has {q} ({len(got.get(q, []))} series, want {n})")
ranks = sorted(r["metric"].get("rank", "") for r in got.get("dtrain_rank_step_seconds", []))
check(ranks == ["0", "1"], f"rank labels {ranks}")
up = query('up{job="dtrain"}') if got else []
check(bool(up) and up[0]["value"][1] == "1", "the scrape target is up")
print(f"{6 + len(want) + 2 - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
# SIGUSR1: every worker checkpoints and stops (exit 75); anything else
# means the run did not last through the checks.
kill -USR1 "$train"
trc=0
wait "$train" || trc=$?
[ "$trc" = 75 ] || { echo "training ended with $trc before it was stopped (expected 75):"; cat "$tmp/train.log"; exit 1; }
exit $rc
