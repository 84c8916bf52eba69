#!/usr/bin/env bash
# The scaled-down twin of configs/gpt2-large-tp.ini (the README's tensor x
# pipeline showcase): the same config, layout and flags but 4 layers of
# width 320 (20 heads, GPT-2's vocabulary: 21 M parameters), on byte tokens
# of dtrain's own docs. As the showcase: 8 workers at tensor 4 x pipeline
# 2, each capped (--memory-limit) at 1.25 x the memory formula (read from
# the start check's refusal under a 1M cap, which starts no worker), 2
# then 4 steps with evaluations, checkpoints written in pieces (steps 2 and
# 4) and the weights file; then the step-2 checkpoint resumed on tensor 2 x
# pipeline 4 under its own cap, to step 4: its weights within 1e-4 of the
# uninterrupted run's (the sums' order differs). Every rank's peak
# (summary.json's ranks_peak_rss_bytes) under its cap, and the checkpoint
# read once over the ranks on resume, beside rank 0's verifying pass
# (io.ranks_read_bytes).
#   tests/large_tp.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
[ -z "${DTRAIN_SANITIZE_FLAGS:-}${ASAN_OPTIONS:-}${TSAN_OPTIONS:-}" ] ||
    { echo "SKIPPED: a sanitizer's build: resident memory against caps means nothing there"; exit 77; }
work=$(mktemp -d /tmp/dtrain-large-tp-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
cd "$work"
"$build/dtrain" prepare-text "$src/docs" -o data/docs >/dev/null
sed -e 's/^n_layer = 36$/n_layer = 4/' -e 's/^n_embd = 1280$/n_embd = 320/' \
    -e 's|data/fortunes_|data/docs_|' "$src/configs/gpt2-large-tp.ini" >twin.ini
grep -q '^n_layer = 4$' twin.ini && grep -q '^n_embd = 320$' twin.ini && grep -q 'data/docs_train' twin.ini ||
    { echo "FAIL: configs/gpt2-large-tp.ini no longer has the lines the twin replaces"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }

# The formula's bytes a worker for the layout in "$@".
formula() {
    local out
    out=$("$build/dtrain" train twin.ini --workers 8 --memory-limit 1M --run-dir "$work/none" "$@" 2>&1 || true)
    echo "$out" | sed -n 's/.*in all a worker needs [^(]*(\([0-9]*\) bytes).*/\1/p'
}
# Every rank's peak of run $1 under cap $2.
under_cap() {
    python3 - "$1/summary.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
peaks, cap = m["ranks_peak_rss_bytes"], int(sys.argv[2])
print(" ".join("%.1f" % (p / 2**20) for p in peaks), "MiB; cap %.1f MiB" % (cap / 2**20))
sys.exit(0 if len(peaks) == 8 and max(peaks) < cap else 1)
PY
}

t2p4="--set parallel.tensor=2 --set parallel.pipeline=4 --set parallel.micro_batches=4"
f1=$(formula); f2=$(formula $t2p4)
[ -n "$f1" ] && [ -n "$f2" ] || fail "no formula from the start check"
cap1=$((f1 * 5 / 4)); cap2=$((f2 * 5 / 4))
echo "formula a worker: tensor 4 x pipeline 2 $f1 bytes (cap $cap1), tensor 2 x pipeline 4 $f2 bytes (cap $cap2)"

out=$("$build/dtrain" train twin.ini --workers 8 --memory-limit $cap1 --run-dir run 2>&1) || { echo "$out" | tail -20; fail "tensor 4 x pipeline 2 under its caps"; }
echo "$out" | grep -q "(written in pieces)" || fail "the start line does not say the checkpoints are written in pieces"
echo "$out" | grep -q "val loss" || fail "no evaluation"
for s in 2 4; do [ -f run/checkpoints/step-0000000$s/COMPLETE ] || fail "no step-$s checkpoint"; done
[ -s run/model.safetensors ] || fail "no weights file"
under_cap run $cap1 || fail "tensor 4 x pipeline 2: a rank's peak over its cap"

out=$("$build/dtrain" train twin.ini --workers 8 --memory-limit $cap2 --run-dir run-t2p4 $t2p4 \
      --set checkpoint.resume="$work/run/checkpoints/step-00000002" 2>&1) || { echo "$out" | tail -20; fail "resumed on tensor 2 x pipeline 4"; }
echo "$out" | grep -q "resuming from .*step-00000002: step 2" || fail "not resumed from the step-2 checkpoint"
[ -f run-t2p4/checkpoints/step-00000004/COMPLETE ] && [ -s run-t2p4/model.safetensors ] || fail "no step-4 checkpoint or weights file"
under_cap run-t2p4 $cap2 || fail "tensor 2 x pipeline 4: a rank's peak over its cap"
# The checkpoint read once over the ranks, beside rank 0's verifying pass:
# rank 0 about 1 + 1/8 of it, every other rank about 1/8.
python3 - run-t2p4/summary.json "$(cat run/checkpoints/step-00000002/*.safetensors | wc -c)" <<'PY' || fail "the resume read more of the checkpoint than rank 0's pass and one read"
import json, sys
rd, size = json.load(open(sys.argv[1]))["io"]["ranks_read_bytes"], int(sys.argv[2])
print("resume: each rank read", " ".join("%.2f" % (b / size) for b in rd), "of the checkpoint's", size, "bytes")
sys.exit(0 if len(rd) == 8 and 1.0 <= rd[0] / size < 1.2 and max(rd[1:]) / size < 0.2 and sum(rd) / size < 2.1 else 1)
PY
# (the same steps on another layout: the sums' order alone differs)
python3 - run/model.safetensors run-t2p4/model.safetensors <<'PY' || fail "the resumed run's weights are not the uninterrupted run's"
import array, json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = {}
    for k, v in h.items():
        if k != "__metadata__":
            a = array.array("f"); a.frombytes(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]); d[k] = a
    return d
x, y = load(sys.argv[1]), load(sys.argv[2])
diff = max(abs(a - b) for k in x for a, b in zip(x[k], y[k]))
print("resumed on tensor 2 x pipeline 4: largest difference to the uninterrupted weights %.3g" % diff)
sys.exit(0 if x.keys() == y.keys() and diff < 1e-4 else 1)
PY
echo "gpt2-large-tp twin: trained, checkpointed in pieces, resumed on another layout, every rank under 1.25 x its formula"
