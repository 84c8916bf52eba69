#!/usr/bin/env bash
# A real Slurm on this one machine: the test generates a munge key and a
# slurm.conf (one node, one partition, MpiDefault=pmix), starts munged,
# slurmctld and slurmd on ports of their own, and runs
#   - `srun -n 4 dtrain train`: 4 ranks of one job (hier backend, rank and
#     size from Slurm's PMIx), bitwise equal to 4 local deterministic workers
#   - the sbatch example of docs/cluster.md (a batch script with #SBATCH
#     lines), waited for until it completes, with the same result
#   - srun without PMI (--mpi=none): every task refuses to train alone,
#     naming SLURM_STEP_NUM_TASKS, instead of 4 separate runs of 1
# and stops everything.
#   tests/slurm.sh BUILD_DIR
# Skipped (exit 77) when not root or Slurm/munge are not installed (Debian
# packages slurmctld slurmd slurm-client munge).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (slurmd runs jobs as their user)"
for t in slurmctld slurmd srun sbatch munged mpirun; do
    command -v $t >/dev/null || skip "'$t' is not installed (Debian packages slurmctld slurmd slurm-client munge openmpi-bin)"
done
tmp=$(mktemp -d /tmp/dtrain-test-slurm-XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
    if [ ${#pids[@]} -gt 1 ]; then # the jobs first, while slurmctld runs
        scancel --full --quiet --user=root 2>/dev/null || true
        for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
    fi
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
    done
    # a step daemon (slurmstepd) of ours that outlived slurmd: it has files
    # open in $tmp
    for p in $(pgrep -x slurmstepd || true); do
        ls -l "/proc/$p/fd" 2>/dev/null | grep -q "$tmp" && kill -KILL "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
    exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---- munge ----
mkdir -m 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
sock=$tmp/munge/munge.sock
munged -F --force --socket="$sock" --key-file="$tmp/munge/munge.key" --pid-file="$tmp/munge/munged.pid" \
    --seed-file="$tmp/munge/seed" --log-file="$tmp/munged.log" >>"$tmp/munged.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || fail "munged did not start"

# ---- slurm.conf: this machine as one node with 4 CPUs ----
node=$(hostname -s)
mkdir -p "$tmp/state" "$tmp/spool"
cat >"$tmp/slurm.conf" <<CONF
ClusterName=dtraintest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=pmix
ReturnToService=2
SchedulerType=sched/builtin
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=10 State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$tmp/slurm.conf
# Open MPI's shared-memory segments in $tmp: under srun no mpirun removes them
export OMPI_MCA_btl_vader_backing_directory=$tmp
slurmctld -D -i -f "$SLURM_CONF" >>"$tmp/slurmctld.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" >>"$tmp/slurmd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    sinfo -h -o %T 2>/dev/null | grep -qE "^idle" && break
    sleep 0.2
done
sinfo -h -o %T 2>/dev/null | grep -qE "^idle" || fail "the node did not become idle: $(sinfo 2>&1)"

# ---- the job ----
. "$src/tests/small_run.sh"
small_run "$tmp" 20 "threads = 1
[parallel]
deterministic = true"
timeout 120 "$build/dtrain" train "$tmp/run.ini" -q --workers 4 --run-dir "$tmp/local" >/dev/null ||
    fail "4 local workers failed"

timeout 120 srun -n 4 -t 2 "$build/dtrain" train "$tmp/run.ini" -q --run-dir "$tmp/srun" >"$tmp/srun.log" 2>&1 ||
    fail "srun -n 4 dtrain train failed"
for r in 0 1 2 3; do
    grep -q '"rank":'$r',"workers":4,"comm_backend":"hier","host":0,"hosts":1' "$tmp/srun/metrics/rank-0000$r.jsonl" ||
        fail "srun rank $r: run record: $(head -1 "$tmp/srun/metrics/rank-0000$r.jsonl")"
done
cmp "$tmp/local/model.safetensors" "$tmp/srun/model.safetensors" || fail "srun -n 4 differs from 4 local workers"
echo "srun -n 4 dtrain train: one job of 4 ranks (hier), bitwise equal to 4 local workers: ok"

# ---- the sbatch example of docs/cluster.md ----
sed -n '/^```sh sbatch-example$/,/^```$/p' "$src/docs/cluster.md" | sed '1d;$d' >"$tmp/job.sbatch"
grep -q "^#SBATCH" "$tmp/job.sbatch" || fail "no sbatch example found in docs/cluster.md"
# the example's dtrain, config and run directory, pointed at this build and data
sed -i -e "s|build/dtrain|$build/dtrain|; s|configs/fashion-mlp.ini|$tmp/run.ini|; s|runs/sbatch-|$tmp/sbatch-|" "$tmp/job.sbatch"
(cd "$tmp" && timeout 120 sbatch --wait -o "$tmp/sbatch.log" "$tmp/job.sbatch" >"$tmp/sbatch.out" 2>&1) ||
    fail "sbatch --wait of the docs example failed: $(cat "$tmp/sbatch.out")"
out=$(ls -d "$tmp"/sbatch-*/ 2>/dev/null | head -1)
[ -n "$out" ] || fail "the sbatch job wrote no run directory"
cmp "$tmp/local/model.safetensors" "$out/model.safetensors" || fail "the sbatch job differs from 4 local workers"
echo "sbatch example of docs/cluster.md: 4 ranks, bitwise equal to 4 local workers: ok"

# ---- without PMI every task would train alone: refused ----
if timeout 60 srun -n 2 --mpi=none "$build/dtrain" train "$tmp/run.ini" -q --run-dir "$tmp/nopmi" >"$tmp/nopmi.log" 2>&1; then
    fail "srun --mpi=none ran 2 separate trainings instead of refusing"
fi
grep -q "SLURM_STEP_NUM_TASKS=2" "$tmp/nopmi.log" || fail "srun --mpi=none: no message naming SLURM_STEP_NUM_TASKS: $(cat "$tmp/nopmi.log")"
echo "srun --mpi=none: refused with a message: ok"
