#!/usr/bin/python3
"""Activation recomputation ([train] recompute = blocks) against keeping
every activation, in one run (docs/model-parallel.md, "Activation
recomputation").

One process trains a GPT (by default 12 layers of width 768, a byte
vocabulary, batch 8 x 256 tokens, AdamW) with and without recomputation,
interleaved (none, blocks, none, blocks, ...) --repeat times each; the
median step time of each, their ratio (goal <= 1.35), and the activation
sets' bytes (summary.json's activation_bytes; goal >= 4x smaller) are
printed, with the final weights' equality (recomputation changes no bit).

    /usr/bin/python3 bench/recompute.py [--dtrain build] [--repeat 3] [--steps 4]
        [--layers 12] [--width 768] [--batch 8] [--seq 256] [--threads 2]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
import memory  # noqa: E402


def run(a, tmp, name, ini, rec):
    rd = os.path.join(tmp, name)
    cmd = [os.path.join(a.dtrain, "dtrain"), "train", ini, "--quiet", "--run-dir", rd, "--set",
           f"train.threads={a.threads}", "--set", f"train.recompute={'blocks' if rec else 'none'}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    with open(os.path.join(rd, "summary.json")) as f:
        s = json.load(f)
    with open(os.path.join(rd, "model.safetensors"), "rb") as f:
        weights = f.read()
    return s["train_seconds"] / s["steps"], s["precision"]["activation_bytes"], weights


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dtrain-bench-recompute-")
    tok = memory.tokens(a.dtrain, tmp)
    text = memory.CONFIG.format(layers=a.layers, heads=a.width // 64, width=a.width, seq=a.seq, batch=a.batch,
                                steps=a.steps, tok=tok).replace("[checkpoint]\nevery_steps", "[checkpoint]\n;every_steps")
    ini = os.path.join(tmp, "gpt.ini")
    with open(ini, "w") as f:
        f.write(text)
    print(cpu.banner())
    print(f"# GPT L{a.layers} C{a.width}, batch {a.batch} x {a.seq} tokens, AdamW, {a.steps} steps a run, "
          f"1 process x {a.threads} threads, runs interleaved {a.repeat} times")
    times = {0: [], 1: []}
    acts, weights = {}, {}
    for i in range(a.repeat):
        for rec in (0, 1):
            t, acts[rec], weights[rec] = run(a, tmp, f"r{i}-{rec}", ini, rec)
            times[rec].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'recompute':9} {'step s (median)':>15} {'all runs':>24} {'activation MiB':>14}")
    for rec in (0, 1):
        print(f"{'blocks' if rec else 'none':9} {med[rec]:15.3f} {' '.join(f'{t:.3f}' for t in times[rec]):>24} "
              f"{acts[rec] / 2**20:14.1f}")
    print(f"step time blocks / none: {med[1] / med[0]:.3f} (goal <= 1.35); activations none / blocks: "
          f"{acts[0] / acts[1]:.2f}x (goal >= 4); final weights {'bitwise equal' if weights[0] == weights[1] else 'DIFFER'}")


if __name__ == "__main__":
    main()
