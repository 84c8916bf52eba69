#!/usr/bin/python3
"""Peak resident memory of every rank over a whole run, against the formula
the run prints at its start (docs/model-parallel.md, "Memory of a rank").

Each layout trains a GPT (by default 12 layers of width 768, 12 heads, a
byte vocabulary: 85 M parameters, AdamW) for a few steps with an evaluation
after the last, a checkpoint and the final weights file, and reports
summary.json's ranks_peak_rss_bytes (every rank's peak, gathered after the
weights file) beside the formula: the run's own figure (formula_bytes)
with its program part replaced by a measured per-process baseline, the
peak of the same layout on a model of 4 layers of width 16 (so that the
fixed cost of a process -- the program, its threads, the shared-memory
transport -- is measured, not guessed). The worst rank's peak over the
formula is the figure to judge (goal: within 10%).

The tokens/s column is the run's own (summary.json), a few steps with an
evaluation and a checkpoint: a rough figure, not a benchmark.

    /usr/bin/python3 bench/memory.py [--dtrain build] [--layouts one,pp2,...]
        [--steps 2] [--batch 8] [--seq 256] [--layers 12] [--width 768]

Token files come from `dtrain prepare-text` of Debian's fortunes (made in
the scratch directory when missing). Run it on a quiet machine; the CPU is
printed first.
"""
import argparse, json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402

# name: (workers, flags)
LAYOUTS = {
    "one": (1, []),
    "pp2": (2, ["--set", "parallel.pipeline=2"]),
    "pp4": (4, ["--set", "parallel.pipeline=4"]),
    "tp2": (2, ["--set", "parallel.tensor=2"]),
    "tp4": (4, ["--set", "parallel.tensor=4"]),
    "tp2-seq": (2, ["--set", "parallel.tensor=2", "--set", "parallel.sequence=true"]),
    "tp4-seq": (4, ["--set", "parallel.tensor=4", "--set", "parallel.sequence=true"]),
    "tp2pp2": (4, ["--set", "parallel.tensor=2", "--set", "parallel.pipeline=2"]),
    "zero3": (4, ["--zero", "3"]),
    "zero3-rec": (4, ["--zero", "3", "--set", "train.recompute=blocks"]),
    "one-rec": (1, ["--set", "train.recompute=blocks"]),
}

CONFIG = """[model]
preset = gpt
n_layer = {layers}
n_head = {heads}
n_embd = {width}
block_size = {seq}
vocab_size = 256
[data]
dataset = tokens
train_file = {tok}_train.bin
val_file = {tok}_val.bin
[optim]
name = adamw
lr = 0.0003
[train]
batch = {batch}
seq_len = {seq}
max_steps = {steps}
eval_batches = 1
[checkpoint]
every_steps = {steps}
"""


def tokens(dtrain, tmp):
    base = os.path.join(tmp, "fortunes")
    if not os.path.exists(base + "_train.bin"):
        subprocess.run([os.path.join(dtrain, "dtrain"), "prepare-text", "/usr/share/games/fortunes", "-o", base],
                       check=True, stdout=subprocess.DEVNULL)
    return base


def run(dtrain, tmp, name, text, workers, flags):
    ini = os.path.join(tmp, name + ".ini")
    with open(ini, "w") as f:
        f.write(text)
    rd = os.path.join(tmp, name)
    cmd = [os.path.join(dtrain, "dtrain"), "train", ini, "--workers", str(workers), "--set", "train.threads=1", "--quiet",
           "--run-dir", rd] + flags
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    with open(os.path.join(rd, "summary.json")) as f:
        s = json.load(f)
    m = s["memory"]
    peaks = m.get("ranks_peak_rss_bytes") or [m["peak_rss_bytes"]]
    return peaks, m["formula_bytes"], s.get("tokens_per_sec", 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--keep", help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="dtrain-bench-memory-")
    os.makedirs(tmp, exist_ok=True)
    tok = tokens(a.dtrain, tmp)
    big = CONFIG.format(layers=a.layers, heads=a.width // 64, width=a.width, seq=a.seq, batch=a.batch,
                        steps=a.steps, tok=tok)
    tiny = CONFIG.format(layers=4, heads=4, width=16, seq=a.seq, batch=a.batch, steps=a.steps, tok=tok)
    print(cpu.banner())
    print(f"# GPT L{a.layers} C{a.width}, batch {a.batch} x {a.seq} tokens, AdamW, {a.steps} steps, an evaluation, "
          f"a checkpoint and the weights file; MB = 1e6 bytes")
    print(f"{'layout':10} {'workers':>7} {'peak of each rank, MB':>32} {'worst':>7} {'formula':>8} {'baseline':>8} "
          f"{'worst/formula':>13} {'tokens/s':>8}")
    for name in a.layouts.split(","):
        workers, flags = LAYOUTS[name]
        base, base_formula, _ = run(a.dtrain, tmp, name + "-tiny", tiny, workers, flags)
        peaks, formula, tps = run(a.dtrain, tmp, name, big, workers, flags)
        # the formula's model-sized parts (its difference to the tiny
        # model's), on the tiny layout's measured peak: the baseline
        baseline = max(base)
        total = (formula - base_formula) + baseline
        worst = max(peaks)
        print(f"{name:10} {workers:7} {' '.join(f'{p / 1e6:6.0f}' for p in peaks):>32} {worst / 1e6:7.0f} "
              f"{total / 1e6:8.0f} {baseline / 1e6:8.0f} {worst / total:13.2f} {tps:8.0f}", flush=True)


if __name__ == "__main__":
    main()
