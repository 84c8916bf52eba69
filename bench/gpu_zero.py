#!/usr/bin/python3
"""ZeRO's stages on GPUs: N ranks (2 by default, sharing one GPU where the
machine has one) of `dtrain train --device cuda` at --zero 0, 1, 2 and 3
on the same global batch (docs/gpu.md, "ZeRO stage 1" to "ZeRO stage 3").
Prints, per stage, the median step, samples per second, the step against
--zero 0's, and rank 0's GPU memory from summary.json: the arena, the
optimizer state, the gradients' and the parameters' peaks where they are
backed on demand (stages 2 and 3: what those stages save, and the cost of
mapping chunks and gathering layers shows in the step), and the gathers.

    python3 bench/gpu_zero.py --dtrain BUILD/dtrain --config RUN.ini
        [--ranks 2] [--stages 0,1,2,3] [--steps N] [--out DIR] [--json FILE]

The config's [train] batch is the global batch; the first 3 steps are
warm-up, left out of the medians (bench/gpu_ranks.py's records). Only the
standard library: it runs on the GPU machine as it is.
"""
import os, statistics, sys

from gpu_ranks import arguments, finish, train

MIB = 1048576.0


def one(args, stage):
    rows, summary = train(args, "zero-%d" % stage, args.ranks, ("--zero", str(stage)))
    if rows is None:
        return {"zero": stage, "error": summary}
    gpu = summary.get("gpu", {})
    return {"zero": stage, "step_seconds": statistics.median(r["step_seconds"] for r in rows),
            "rate": statistics.median(r["samples_per_sec"] for r in rows),
            "arena_bytes": gpu.get("arena_bytes", 0), "optimizer_state_bytes": gpu.get("optimizer_state_bytes", 0),
            "gradients_bytes": gpu.get("gradients_backed_peak_bytes", gpu.get("gradients_bytes", 0)),
            "weights_bytes": gpu.get("weights_backed_peak_bytes", gpu.get("weights_bytes", 0)),
            "gathers": gpu.get("parameter_gathers", 0), "collectives": gpu.get("collectives", "?")}


def main():
    ap = arguments(__doc__, "gpu-zero")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--stages", default="0,1,2,3")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = [one(args, int(z)) for z in args.stages.split(",")]
    base = next((r["step_seconds"] for r in rows if r["zero"] == 0 and "error" not in r), None)
    print("| zero (%d ranks) | collectives | step (ms) | against zero 0 | samples/s | arena (MiB) | optimizer state "
          "(MiB) | gradients' peak (MiB) | weights' peak (MiB) | gathers |" % args.ranks)
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print("| %d | %s | | | | | | | | |" % (r["zero"], r["error"]))
            continue
        against = "%.2fx" % (r["step_seconds"] / base) if base else "(no zero 0 run)"
        print("| %d | %s | %.1f | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %d |" % (
            r["zero"], r["collectives"], r["step_seconds"] * 1e3, against, r["rate"], r["arena_bytes"] / MIB,
            r["optimizer_state_bytes"] / MIB, r["gradients_bytes"] / MIB, r["weights_bytes"] / MIB, r["gathers"]))
    return finish(args, rows)


if __name__ == "__main__":
    sys.exit(main())
