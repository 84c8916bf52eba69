#!/bin/sh
# The long chaos run: tests/test_chaos with more kills and a longer run.
# Prints every kill, the recovery times (failure to the first new step) and
# the steps each failure cost, and checks the final model against a clean
# run.   bench/chaos.sh [KILLS [STEPS]]   (default 12 kills, 1200 steps)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$here/build/tests/test_chaos" ] || { echo "build first: make" >&2; exit 1; }
CHAOS_KILLS=${1:-12} CHAOS_STEPS=${2:-1200} DTRAIN_BIN="$here/build/dtrain" exec "$here/build/tests/test_chaos"
