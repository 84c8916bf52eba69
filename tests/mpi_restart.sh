#!/bin/sh
# The restart loop around mpirun (scripts/mpirun-restart.sh): a rank killed
# at step 13 of a 3-rank job; the job is run again from the newest
# checkpoint on 2 ranks and ends bitwise equal to an uninterrupted run
# (deterministic mode). Skipped (exit 77) when mpirun is not installed.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun not installed (scripts/install-deps.sh installs Open MPI)"
    exit 77
fi
tmp=$(mktemp -d /tmp/dtrain-test-mpi-restart-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. "$here/tests/small_run.sh"
small_run "$tmp" 30 "[parallel]
deterministic = true"
mpi="--allow-run-as-root --oversubscribe"
mpirun $mpi -np 2 "$build/dtrain" train "$tmp/run.ini" -q --run-dir "$tmp/clean"
DTRAIN_FAULT_STEP=1:13:kill DTRAIN_FAULT_ONCE="$tmp/once" \
    "$here/scripts/mpirun-restart.sh" -r 2 -m 2 -np 3 $mpi -x DTRAIN_FAULT_STEP -x DTRAIN_FAULT_ONCE -- \
    "$build/dtrain" train "$tmp/run.ini" -q --run-dir "$tmp/job" --checkpoint-every 5 >"$tmp/log" 2>&1 || {
    cat "$tmp/log"; echo "FAIL: the restart loop did not finish the job"; exit 1; }
grep -q "restart 1 of 2 with 2 ranks" "$tmp/log" || { cat "$tmp/log"; echo "FAIL: no restart on 2 ranks"; exit 1; }
[ -f "$tmp/once" ] || { echo "FAIL: the fault did not fire"; exit 1; }
cmp "$tmp/clean/model.safetensors" "$tmp/job/model.safetensors" || {
    echo "FAIL: restarted MPI job differs from the uninterrupted run"; exit 1; }
echo "mpirun restart loop: 3 ranks killed at step 13, resumed on 2 ranks, bitwise equal: ok"
