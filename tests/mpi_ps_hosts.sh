#!/bin/sh
# Parameter servers under mpirun across hosts: [ps] groups defaults to one
# group of workers per host (mode sync). 6 ranks on 2 pretend hosts
# (DTRAIN_FAKE_NODES=2: contiguous blocks of 3 ranks): servers 0-1 and
# worker 0 on host 0, workers 1-3 on host 1, so the hosts' groups (1 and 3
# workers) are not the even split that [ps] groups = 2 would make. In
# deterministic mode the result is bitwise one process's; [ps] groups set
# by hand still wins, and on one host there are no groups.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun not installed (scripts/install-deps.sh installs Open MPI)"
    exit 77
fi
tmp=$(mktemp -d /tmp/dtrain-test-mpi-ps-hosts-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. "$here/tests/small_run.sh"
small_run "$tmp" 12 "[parallel]
deterministic = true
servers = 2"
fail() { cat "$tmp/log"; echo "FAIL: $1"; exit 1; }
groups() { sed -n 's/.*"groups":[[:space:]]*\([0-9]*\).*/\1/p' "$tmp/$1/summary.json" | head -n 1; }
mpi="--allow-run-as-root --oversubscribe"
"$build/dtrain" train "$tmp/run.ini" -q --run-dir "$tmp/one" --set parallel.servers=0 >"$tmp/log" 2>&1 ||
    fail "one process"
DTRAIN_FAKE_NODES=2 mpirun $mpi -np 6 -x DTRAIN_FAKE_NODES "$build/dtrain" train "$tmp/run.ini" \
    --run-dir "$tmp/hosts" >"$tmp/log" 2>&1 || fail "6 ranks on 2 pretend hosts"
grep -q "2 groups of workers, one per host" "$tmp/log" || fail "no line naming the hosts' groups"
[ "$(groups hosts)" = 2 ] || fail "summary.json: groups $(groups hosts), expected 2"
cmp "$tmp/one/model.safetensors" "$tmp/hosts/model.safetensors" || fail "hosts' groups differ from one process"
DTRAIN_FAKE_NODES=2 mpirun $mpi -np 6 -x DTRAIN_FAKE_NODES "$build/dtrain" train "$tmp/run.ini" \
    --run-dir "$tmp/set" --set ps.groups=1 >"$tmp/log" 2>&1 || fail "[ps] groups = 1 on 2 hosts"
[ "$(groups set)" = 1 ] || fail "summary.json: groups $(groups set) with [ps] groups = 1"
mpirun $mpi -np 6 "$build/dtrain" train "$tmp/run.ini" --run-dir "$tmp/flat" >"$tmp/log" 2>&1 ||
    fail "6 ranks on one host"
[ "$(groups flat)" = 0 ] || fail "summary.json: groups $(groups flat) on one host, expected none"
cmp "$tmp/one/model.safetensors" "$tmp/flat/model.safetensors" || fail "one host differs from one process"
echo "mpirun, 2 servers x 4 workers: one group per (pretend) host by default, bitwise one process's: ok"
