#!/bin/sh
# Recovery with a hot spare against a restart from the newest checkpoint, on
# the same job: Fashion-MNIST's MLP (configs/fashion-mlp.ini), 3 workers,
# deterministic, 40 steps, a checkpoint every 10, worker 1 SIGKILLed in step
# 25 (DTRAIN_FAULT_STEP). The two ways alternate, RUNS times each; each line
# is the launcher's own figure (the death to the first step finished after
# it) and the steps lost, and every pair must end bitwise equal.
#   bench/spares.sh [RUNS [WORKERS]]   (default 5 runs, 3 workers)
# The numbers in docs/checkpoints.md ("Spares") come from this script.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
dtrain="$here/build/dtrain"
runs=${1:-5}
workers=${2:-3}
data=/usr/share/datasets/fashion-mnist
[ -x "$dtrain" ] || { echo "build first: make" >&2; exit 1; }
[ -d "$data" ] || { echo "spares.sh: $data not found (configs/fashion-mlp.ini's data)" >&2; exit 1; }
dir=$(mktemp -d /tmp/dtrain-bench-spares-XXXXXX)
trap 'rm -rf "$dir"' EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores;" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
sets="--set train.epochs=0 --set train.max_steps=40 --set parallel.deterministic=true"
i=1
while [ "$i" -le "$runs" ]; do
    for mode in restart spare; do
        rm -rf "$dir/$mode" "$dir/once"
        if [ $mode = spare ]; then how="--spares 1"; else how="--max-restarts 1"; fi
        # shellcheck disable=SC2086
        DTRAIN_FAULT_STEP=1:25:kill DTRAIN_FAULT_ONCE="$dir/once" "$dtrain" train "$here/configs/fashion-mlp.ini" \
            $sets --workers "$workers" $how --checkpoint-every 10 --run-dir "$dir/$mode" >"$dir/$mode.log" 2>&1 ||
            { cat "$dir/$mode.log" >&2; exit 1; }
        printf '%-8s %s\n' "$mode" "$(grep -o 'recovered in .*' "$dir/$mode.log")"
    done
    cmp -s "$dir/restart/model.safetensors" "$dir/spare/model.safetensors" ||
        { echo "run $i: the two final models differ" >&2; exit 1; }
    i=$((i + 1))
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; every pair bitwise equal"
