#!/bin/sh
# Runs a dtrain training job under mpirun and, when it fails, runs it again
# from the newest checkpoint, optionally with fewer ranks: the restart loop
# that `dtrain train --max-restarts` gives local workers, for MPI jobs.
#
#   scripts/mpirun-restart.sh [-r RESTARTS] [-m MIN_RANKS] -np N [MPIRUN_ARGS...] -- \
#       dtrain train CONFIG --run-dir DIR --checkpoint-every K [ARGS...]
#
#   -r RESTARTS   how many times to start again (default 3)
#   -m MIN_RANKS  after a failure, start again with one rank fewer, down to
#                 MIN_RANKS (default: N, the same number of ranks)
#
# The dtrain command gets --resume auto, so every attempt continues from the
# newest valid checkpoint in DIR/checkpoints (the first starts at step 0
# when there is none). A checkpoint does not depend on the number of ranks.
set -u
restarts=3 np= min=
while [ $# -gt 0 ]; do
    case "$1" in
    -r) restarts=$2; shift 2 ;;
    -m) min=$2; shift 2 ;;
    -np|-n) np=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
    esac
done
mpiargs=
while [ $# -gt 0 ] && [ "$1" != "--" ]; do mpiargs="$mpiargs $1"; shift; done
[ $# -gt 0 ] && shift
if [ -z "$np" ] || [ $# -eq 0 ]; then
    echo "usage: $0 [-r RESTARTS] [-m MIN_RANKS] -np N [MPIRUN_ARGS...] -- dtrain train CONFIG ..." >&2
    exit 2
fi
[ -z "$min" ] && min=$np
attempt=0
while :; do
    # shellcheck disable=SC2086
    mpirun -np "$np" $mpiargs "$@" --resume auto
    rc=$?
    [ $rc -eq 0 ] && exit 0
    if [ $attempt -ge "$restarts" ]; then
        echo "mpirun-restart: exit status $rc; giving up after $attempt restarts" >&2
        exit $rc
    fi
    attempt=$((attempt + 1))
    [ "$np" -gt "$min" ] && np=$((np - 1))
    echo "mpirun-restart: exit status $rc; restart $attempt of $restarts with $np ranks from the newest checkpoint" >&2
done
