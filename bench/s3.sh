#!/usr/bin/env bash
# Object storage against local disk: a real S3 server (Ceph's radosgw on a
# one-node cluster, tests/s3_server.sh) on this machine, so the "network"
# is the loopback and the server's daemons share the CPU with dtrain.
#
#   bench/s3.sh BUILD [WORK_DIR]
#
# 1. A 256 MB token file read whole (dt_rfile: what a GPT run's loader
#    does at its start): the local file (from the page cache: the file was
#    just written) against s3:// (8 MiB ranged GETs, four in flight).
# 2. gpt2-124m's checkpoint, 1.49 GB (124.5 M parameters, the weights and
#    AdamW's two moments), written atomically: to local disk (fsync,
#    rename) against s3:// (staged under TMPDIR, multipart upload in 16
#    MiB parts, four at a time).
# 3. gpt2-124m trained 30 steps on one worker (2 threads), a checkpoint
#    at step 15 uploaded in the background while steps 16-30 run (and one
#    at the end), against the same run with no checkpoints and with local
#    ones, interleaved over ROUNDS rounds (default 3: the machine is
#    shared, so each round's three runs see the same load): the step times
#    (metrics' step_seconds: the median and mean of steps 2-30, and the sum
#    of steps 16-29, the upload's; the save's own pause, the snapshot, is
#    not in them), the load average before and after, the process's CPU
#    seconds, and the server daemons' CPU seconds during the run.
#    SERVER_NICE=19 renices the gateway and the OSD (every thread), so
#    that their CPU (on other machines in a real deployment) takes what
#    the training leaves.
# The server's OSD keeps its objects on disk here (S3_SERVER_STORE=bluestore,
# a sparse file in WORK_DIR), as local checkpoints are.
# Prints the figures; needs the Debian packages tests/s3_server.sh names.
set -euo pipefail
build=$(cd "${1:?usage: bench/s3.sh BUILD [WORK_DIR]}" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
work=${2:-$(mktemp -d /tmp/dtrain-bench-s3-XXXXXX)}
mkdir -p "$work"
cd "$src"
S3_SERVER_STORE=bluestore tests/s3_server.sh start "$work/srv" >/dev/null
trap 'tests/s3_server.sh stop "$work/srv"; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
tests/s3_server.sh mb "$work/srv" bench
set -a; . "$work/srv/env"; set +a
echo "cpu: $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2-), family $(grep -m1 "cpu family" /proc/cpuinfo | cut -d: -f2 | tr -d " ") model $(grep -m1 "^model\s" /proc/cpuinfo | cut -d: -f2 | tr -d " ")"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), cores: $(nproc)"

echo "== 1. a 256 MB token file read whole"
python3 - "$work/tokens.bin" <<'PY'
import os, struct, sys
n = 128 << 20  # tokens: 256 MiB of uint16
hdr = struct.pack("<256i", 20240520, 1, n, *([0] * 253))
with open(sys.argv[1], "wb") as f:
    f.write(hdr)
    f.write(bytes((i * 7) & 0xff for i in range(1 << 20)) * (2 * n >> 20))
PY
"$build/bench/bench_s3" copy "$work/tokens.bin" s3://bench/tokens.bin
"$build/bench/bench_s3" read "$work/tokens.bin" 3
"$build/bench/bench_s3" read s3://bench/tokens.bin 3
rm -f "$work/tokens.bin"

echo "== 2. gpt2-124m's checkpoint (1.49 GB) written"
mb=$(( 124475904 * 12 >> 20 ))
"$build/bench/bench_s3" write "$work/ckpt.safetensors" $mb 2
rm -f "$work/ckpt.safetensors"
"$build/bench/bench_s3" write s3://bench/ckpt.safetensors $mb 2

echo "== 3. gpt2-124m steps with checkpoints uploaded in the background"
"$build/dtrain" prepare-text docs -o "$work/docs" >/dev/null
cat >"$work/gpt2.ini" <<INI
[model]
preset = gpt2-124m
[data]
dataset = tokens
train_file = $work/docs_train.bin
val_file = $work/docs_val.bin
[optim]
name = adamw
lr = 0.0001
[train]
batch = 2
seq_len = 64
max_steps = 30
eval_batches = 1
threads = 2
INI
median() { python3 - "$1" <<'PY'
import json, statistics, sys
t = [r["step_seconds"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step" and r["step"] > 1]
print("%.3f s, mean %.3f s (%d steps; min %.3f, max %.3f)" % (statistics.median(t), statistics.mean(t), len(t), min(t), max(t)))
PY
}
steps() { python3 - "$1" <<'PY'
import json, statistics, sys
r = [x for x in map(json.loads, open(sys.argv[1])) if x.get("type") == "step"]
t = [x["step_seconds"] for x in r if x["step"] > 1]
u = [x["step_seconds"] for x in r if 16 <= x["step"] <= 29]
print("median %.3f s, mean %.3f s (steps 2-30); steps 16-29 %.2f s in all" % (statistics.median(t), statistics.mean(t), sum(u)))
PY
}
daemons_cpu() { for p in $(cat "$work/srv/gw.pid" "$work/srv/osd.pid"); do awk '{print $14 + $15}' /proc/$p/stat; done |
    awk -v t="$(getconf CLK_TCK)" '{s += $1} END {printf "%.1f", s / t}'; }
if [ -n "${SERVER_NICE:-}" ]; then
    for p in $(cat "$work/srv/gw.pid" "$work/srv/osd.pid"); do
        for t in /proc/$p/task/*; do renice -n "$SERVER_NICE" -p "${t##*/}" >/dev/null; done
    done
    echo "(the gateway and the OSD at nice $SERVER_NICE)"
fi
for round in $(seq "${ROUNDS:-3}"); do
    for how in none local s3; do
        case $how in
        none) flags="" ;;
        local) flags="--checkpoint-every 15 --keep 1" ;;
        s3) flags="--checkpoint-every 15 --keep 1 --checkpoint-dir s3://bench/gpt2" ;;
        esac
        rm -rf "$work/run"
        l0=$(cut -d' ' -f1 /proc/loadavg); d0=$(daemons_cpu)
        /usr/bin/time -f "%U %S" -o "$work/cpu" "$build/dtrain" train "$work/gpt2.ini" --run-dir "$work/run" $flags \
            >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
        l1=$(cut -d' ' -f1 /proc/loadavg); d1=$(daemons_cpu)
        read -r user sys <"$work/cpu"
        echo "round $round $how: $(steps "$work/run/metrics/rank-00000.jsonl"); load $l0 -> $l1;" \
             "dtrain's CPU ${user} s user ${sys} s sys, the server's $(awk -v a="$d0" -v b="$d1" 'BEGIN {printf "%.1f", b - a}') s"
        grep -E "checkpoints?;" "$work/log" | sed 's/^dtrain: info: /    /' || true
    done
done
rm -rf "$work/run"
