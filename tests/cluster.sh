#!/usr/bin/env bash
# Data parallel across pretend hosts (scripts/cluster.sh): 4 network
# namespace hosts with their own hostnames on a bridge, links shaped to
# 1 Gbit/s, under mpirun through the cluster's rsh agent: 2 hosts x 2 ranks
# and 4 hosts x 1 rank.
#   - up/status/down: hosts, hostnames, addresses; `up` again is a no-op;
#     bad arguments are refused with a message; `up --delay` either works
#     or (no netem in the kernel) fails naming netem and removes what it made; after `down` no namespace,
#     bridge, state or process is left
#   - the backend picks hier by itself and finds 2 hosts (the run record of
#     every rank: comm_backend, hosts, hostname), and the bytes the hosts'
#     network interfaces sent prove it: about one gradient per step per host
#     (the leaders' exchange), against at least 1.35x that for the flat mpi
#     backend on the same job
#   - --deterministic: the runs across 2 hosts x 2 ranks and 4 hosts x 1
#     rank end bitwise equal to 4 local workers; so do ZeRO stages 1-3, a
#     parameter server with 3 workers, and a GPT at tensor = 2 or pipeline = 4
#   - host 1's ranks killed at step 10: mpirun names the host, and
#     scripts/mpirun-restart.sh resumes from the checkpoint and ends bitwise
#     equal to the uninterrupted run
#   tests/cluster.sh BUILD_DIR
# Skipped (exit 77), with the reason, when not root, when ip/tc/unshare/
# nsenter/mpirun are missing, or when the kernel refuses namespaces.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
cluster=$src/scripts/cluster.sh
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
for t in ip tc unshare nsenter mpirun; do
    command -v $t >/dev/null || skip "'$t' is not installed (iproute2, util-linux, openmpi-bin)"
done
# a prefix and a /24 of our own, so that two runs of the suite do not meet
prefix=t$(($$ % 100000))
subnet=10.77.$(($$ % 200 + 20))
probe=${prefix}-probe
ip netns add "$probe" 2>/dev/null || skip "the kernel refuses network namespaces (ip netns add failed)"
ip netns del "$probe"
unshare --uts true 2>/dev/null || skip "the kernel refuses UTS namespaces (unshare --uts failed)"

tmp=$(mktemp -d /tmp/dtrain-test-cluster-XXXXXX)
bg=
cleanup() {
    [ -n "$bg" ] && kill "$bg" 2>/dev/null || true
    "$cluster" down --prefix "$prefix" >/dev/null 2>&1 || true
    [ -n "${dprefix:-}" ] && "$cluster" down --prefix "$dprefix" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# ---- up, status, bad arguments ----
"$cluster" up 4 --bw 1gbit --prefix "$prefix" --subnet "$subnet" >"$tmp/up" || { cat "$tmp/up"; fail "cluster.sh up"; }
hostfile=$(tail -1 "$tmp/up")
[ -f "$hostfile" ] || fail "up's last line '$hostfile' is not a file"
[ "$(awk '{print $1}' "$hostfile" | tr '\n' ' ')" = "$prefix-h0 $prefix-h1 $prefix-h2 $prefix-h3 " ] || { cat "$hostfile"; fail "hostfile"; }
[ "$("$cluster" up 4 --prefix "$prefix" --subnet "$subnet" | tail -1)" = "$hostfile" ] || fail "up again did not print the same hostfile"
if "$cluster" up 3 --prefix "$prefix" --subnet "$subnet" >"$tmp/err" 2>&1; then fail "up 3 over a 4-host cluster succeeded"; fi
grep -q "already up" "$tmp/err" || { cat "$tmp/err"; fail "up 3: no 'already up' message"; }
for bad in "up 0" "up 2 --bw fast" "up 2 --delay soon" "up 2 --subnet 8.8.8" "up 2 --prefix Bad_Name" "frobnicate"; do
    # shellcheck disable=SC2086
    if "$cluster" $bad >"$tmp/err" 2>&1; then fail "cluster.sh $bad succeeded"; fi
    grep -q "cluster.sh: " "$tmp/err" || { cat "$tmp/err"; fail "cluster.sh $bad: no message"; }
done
# --delay needs netem: either it works, or up fails saying so and leaves nothing
dprefix=d$(($$ % 100000))
dsubnet=10.77.$((($$ + 1) % 200 + 20))
if "$cluster" up 2 --delay 50us --prefix "$dprefix" --subnet "$dsubnet" >"$tmp/delay" 2>&1; then
    "$cluster" status --prefix "$dprefix" | grep -q "delay=50us" || fail "--delay 50us: not in status"
    "$cluster" down --prefix "$dprefix" >/dev/null
else
    grep -q "netem" "$tmp/delay" || { cat "$tmp/delay"; fail "--delay failed without naming netem"; }
    grep -q "up failed; removing what it made" "$tmp/delay" || { cat "$tmp/delay"; fail "--delay: no cleanup"; }
fi
ip netns list | grep -q "^$dprefix-h" && fail "a namespace is left after a failed or finished up --delay"
ip link show "${dprefix}br0" >/dev/null 2>&1 && fail "the bridge is left after a failed or finished up --delay"
[ -e "/run/dtrain-cluster-$dprefix" ] && fail "the state is left after a failed or finished up --delay"
# --cpus: a cpu cgroup per host with its quota; what the agent starts runs
# in it; down removes it
if "$cluster" up 2 --cpus 0.5 --bw none --prefix "$dprefix" --subnet "$dsubnet" >"$tmp/cpus" 2>&1; then
    cg=
    for d in /sys/fs/cgroup/cpu /sys/fs/cgroup; do [ -d "$d/dtrain-cluster-$dprefix-h1" ] && cg=$d/dtrain-cluster-$dprefix-h1; done
    [ -n "$cg" ] || fail "--cpus 0.5: no cgroup for host 1"
    q=$(cat "$cg/cpu.cfs_quota_us" 2>/dev/null || cut -d' ' -f1 "$cg/cpu.max")
    [ "$q" = 50000 ] || fail "--cpus 0.5: quota $q, expected 50000 of 100000"
    got=$("$cluster" rsh --prefix "$dprefix" "$dprefix-h1" 'cat /proc/self/cgroup')
    grep -q "dtrain-cluster-$dprefix-h1" <<<"$got" || fail "--cpus: a process of host 1 is not in its cgroup: $got"
    "$cluster" down --prefix "$dprefix" >/dev/null
    if [ -d "$cg" ]; then fail "--cpus: down left $cg"; fi
elif grep -q "no writable cpu cgroup" "$tmp/cpus"; then
    echo "--cpus: not tested (no writable cpu cgroup here)"
else
    cat "$tmp/cpus"; fail "up --cpus 0.5"
fi
if "$cluster" up 2 --cpus lots --prefix "$dprefix" --subnet "$dsubnet" >"$tmp/err" 2>&1 ||
    ! grep -q -- "--cpus 'lots': expected a number of cores" "$tmp/err"; then
    cat "$tmp/err"; fail "--cpus lots: not refused with a message"
fi
"$cluster" status --prefix "$prefix" >"$tmp/status"
grep -q "$prefix-h1  $subnet.2/24  hostname $prefix-h1" "$tmp/status" || { cat "$tmp/status"; fail "status"; }
[ "$("$src/scripts/cluster.sh" rsh --prefix "$prefix" "$prefix-h1" hostname)" = "$prefix-h1" ] || fail "rsh agent: hostname"
read -r -a mpiargs < <("$cluster" args --prefix "$prefix")
mpiargs+=(--allow-run-as-root)

. "$src/tests/small_run.sh"
small_run "$tmp" 30 "threads = 1"
txbytes() { ip netns exec "$prefix-h$1" cat /sys/class/net/eth0/statistics/tx_bytes; }
# run NAME PER_HOST [ENV...]: 4 ranks, PER_HOST on each host from host 0
# on; prints the bytes host 0 and host 1 sent
# (the array `extra` holds more flags for dtrain train)
extra=()
run() {
    local name=$1 per=$2 a0 a1; shift 2
    a0=$(txbytes 0); a1=$(txbytes 1)
    timeout 120 env "$@" mpirun "${mpiargs[@]}" -np 4 --map-by "ppr:$per:node" -x DTRAIN_COMM_BACKEND \
        "$build/dtrain" train "$tmp/run.ini" -q --run-dir "$tmp/$name" "${extra[@]}" >"$tmp/$name.log" 2>&1 ||
        { cat "$tmp/$name.log"; fail "$name: mpirun across 2 hosts failed"; }
    echo "$(($(txbytes 0) - a0)) $(($(txbytes 1) - a1))"
}

# ---- hier chosen by itself, proved by the interfaces' byte counters ----
read -r h0 h1 < <(run hier 2 DTRAIN_COMM_BACKEND=auto)
for r in 0 1 2 3; do
    rec=$(head -1 "$tmp/hier/metrics/rank-0000$r.jsonl")
    host=$((r / 2))
    case "$rec" in
    *'"comm_backend":"hier"'*'"host":'$host',"hosts":2,"hostname":"'"$prefix-h$host"'"'*) ;;
    *) fail "rank $r's run record does not say hier, host $host of 2, hostname $prefix-h$host: $rec" ;;
    esac
done
params=$(sed -n 's/.*"params":[[:space:]]*\([0-9]*\).*/\1/p' "$tmp/hier/summary.json")
grad=$((params * 4 * 30)) # one f32 gradient per step, 30 steps
for b in "$h0" "$h1"; do
    # the two leaders exchange one gradient per step each way (+ TCP/IP headers)
    [ "$b" -ge $((grad * 95 / 100)) ] && [ "$b" -le $((grad * 130 / 100)) ] ||
        fail "hier: a host sent $b bytes for 30 steps of a $((params * 4))-byte gradient (expected 0.95-1.3x $grad)"
done
read -r f0 f1 < <(run flat 2 DTRAIN_COMM_BACKEND=mpi)
grep -q '"comm_backend":"mpi"' "$tmp/flat/metrics/rank-00000.jsonl" || fail "flat run did not use mpi"
[ $(((f0 + f1) * 100)) -ge $(((h0 + h1) * 135)) ] ||
    fail "flat mpi sent $((f0 + f1)) bytes between the hosts, hier $((h0 + h1)): expected flat >= 1.35x hier"
echo "hier across 2 hosts x 2 ranks: hosts sent $h0 and $h1 bytes for 30 x $((params * 4)) gradient bytes; flat mpi $f0 and $f1"

# ---- --deterministic: across hosts == local workers, bit for bit ----
sed -i 's/^\[data\]/[parallel]\ndeterministic = true\n[data]/' "$tmp/run.ini"
timeout 120 "$build/dtrain" train "$tmp/run.ini" -q --workers 4 --run-dir "$tmp/local" >/dev/null ||
    fail "4 local deterministic workers failed"
run det 2 DTRAIN_COMM_BACKEND=auto >/dev/null
cmp "$tmp/local/model.safetensors" "$tmp/det/model.safetensors" ||
    fail "--deterministic across 2 hosts x 2 ranks differs from 4 local workers"
run det4 1 DTRAIN_COMM_BACKEND=auto >/dev/null
grep -q '"comm_backend":"hier","host":3,"hosts":4,"hostname":"'"$prefix-h3"'"' "$tmp/det4/metrics/rank-00003.jsonl" ||
    fail "4 hosts x 1 rank: rank 3's run record: $(head -1 "$tmp/det4/metrics/rank-00003.jsonl")"
cmp "$tmp/local/model.safetensors" "$tmp/det4/model.safetensors" ||
    fail "--deterministic across 4 hosts x 1 rank differs from 4 local workers"
echo "deterministic across 2 hosts x 2 ranks and 4 hosts x 1 rank == 4 local workers, bitwise: ok"

# ---- ZeRO across hosts: every stage, deterministic, == the local run ----
for z in 1 2 3; do
    extra=(--zero "$z")
    run "zero$z" 2 DTRAIN_COMM_BACKEND=auto >/dev/null
    grep -q '"strategy":[[:space:]]*"zero' "$tmp/zero$z/summary.json" || fail "zero $z: summary.json names no zero strategy"
    cmp "$tmp/local/model.safetensors" "$tmp/zero$z/model.safetensors" ||
        fail "--deterministic --zero $z across 2 hosts x 2 ranks differs from 4 local workers without ZeRO"
done
extra=()
echo "ZeRO stages 1-3, deterministic, across 2 hosts x 2 ranks == 4 local workers, bitwise: ok"

# ---- the parameter servers across hosts: the first rank serves, 3 workers;
# deterministic sync mode == the local deterministic run, bitwise ----
extra=(--servers 1)
run ps 2 DTRAIN_COMM_BACKEND=auto >/dev/null
cmp "$tmp/local/model.safetensors" "$tmp/ps/model.safetensors" ||
    fail "--deterministic --servers 1 across 2 hosts x 2 ranks differs from 4 local workers"
extra=()
echo "parameter server (1 server, 3 workers) across 2 hosts, deterministic == local workers, bitwise: ok"

# ---- model parallel across hosts: a small GPT, tensor = 2 inside each host
# (data across them) and pipeline = 4 (two stages a host), each bitwise equal
# to the same layout on 4 local workers (every group has 2 ranks, whose
# sums a + b are the same whatever the backend, so no deterministic mode is
# needed, nor does tensor parallel have one; pipeline = 4 leaves no data
# axis, so its only sum is the tied embedding's two halves) ----
"$build/dtrain" prepare-text /usr/share/common-licenses -o "$tmp/text" >/dev/null || fail "prepare-text"
cat >"$tmp/gpt.ini" <<INI
[model]
preset = gpt
n_layer = 4
n_head = 4
n_embd = 32
block_size = 32
vocab_size = 256
[data]
dataset = tokens
train_file = $tmp/text_train.bin
val_file = $tmp/text_val.bin
[optim]
name = adamw
lr = 0.003
[train]
batch = 8
seq_len = 32
max_steps = 6
threads = 1
eval_batches = 1
INI
for layout in "parallel.tensor=2" "parallel.pipeline=4 --set parallel.micro_batches=4"; do
    name=mp$(echo "$layout" | tr -cd 'a-z0-9' | head -c 12)
    # shellcheck disable=SC2086
    timeout 120 "$build/dtrain" train "$tmp/gpt.ini" -q --workers 4 --run-dir "$tmp/$name-local" --set $layout \
        >"$tmp/$name-local.log" 2>&1 || { cat "$tmp/$name-local.log"; fail "$layout: 4 local workers failed"; }
    # shellcheck disable=SC2086
    timeout 120 env DTRAIN_COMM_BACKEND=auto mpirun "${mpiargs[@]}" -np 4 --map-by ppr:2:node -x DTRAIN_COMM_BACKEND \
        "$build/dtrain" train "$tmp/gpt.ini" -q --run-dir "$tmp/$name" --set $layout >"$tmp/$name.log" 2>&1 ||
        { cat "$tmp/$name.log"; fail "$layout: mpirun across 2 hosts failed"; }
    cmp "$tmp/$name-local/model.safetensors" "$tmp/$name/model.safetensors" ||
        fail "GPT --set $layout across 2 hosts x 2 ranks differs from 4 local workers"
done
echo "GPT tensor = 2 and pipeline = 4 across 2 hosts x 2 ranks == 4 local workers, bitwise: ok"

# ---- host 1's ranks killed: named by host, the restart loop recovers ----
(
    for _ in $(seq 600); do [ -f "$tmp/job/checkpoints/step-00000010.safetensors" ] && break; sleep 0.05; done
    for p in $(ip netns pids "$prefix-h1"); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = orted ] || continue
        for r in $(pgrep -P "$p"); do
            kill -KILL "$r"
            echo "$r" >>"$tmp/killed"
        done
    done
) &
bg=$!
DTRAIN_SLOW_RANK=0:30 timeout 180 "$src/scripts/mpirun-restart.sh" -r 2 -np 4 "${mpiargs[@]}" --map-by ppr:2:node \
    -x DTRAIN_SLOW_RANK -- \
    "$build/dtrain" train "$tmp/run.ini" -q --run-dir "$tmp/job" --checkpoint-every 5 >"$tmp/job.log" 2>&1 ||
    { cat "$tmp/job.log"; fail "the restart loop did not finish the job"; }
wait "$bg" || true
bg=
# what the killed ranks' OpenMP runtime left in /dev/shm
for r in $(cat "$tmp/killed" 2>/dev/null); do rm -f /dev/shm/__KMP_REGISTERED_LIB_"$r"_*; done
grep -q "on node $prefix-h1 exited on signal 9" "$tmp/job.log" || { cat "$tmp/job.log"; fail "the dead host was not named"; }
grep -q "restart 1 of 2 with 4 ranks" "$tmp/job.log" || { cat "$tmp/job.log"; fail "no restart"; }
cmp "$tmp/local/model.safetensors" "$tmp/job/model.safetensors" ||
    fail "the job restarted after host $prefix-h1's ranks died differs from the uninterrupted run"
echo "host $prefix-h1's ranks killed at step 10: named, restarted from the checkpoint, bitwise equal: ok"

# ---- down leaves nothing ----
"$cluster" down --prefix "$prefix" >/dev/null
ip netns list | grep -q "^$prefix-h" && fail "a namespace is left after down"
ip link show "${prefix}br0" >/dev/null 2>&1 && fail "the bridge is left after down"
[ -e "/run/dtrain-cluster-$prefix" ] && fail "the state directory is left after down"
ls /dev/shm | grep -q "^vader_segment\.$prefix-h" && fail "Open MPI segments of the hosts are left in /dev/shm"
"$cluster" down --prefix "$prefix" >/dev/null || fail "down twice failed"
echo "cluster.sh down: no namespace, bridge or state left: ok"
