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
import os, sys

from gpu_ranks import arguments, finish, measured, table

MIB = 1048576.0


def one(args, stage):
    row, gpu = measured(args, "zero", stage, "zero-%d" % stage, args.ranks, ("--zero", str(stage)))
    if gpu is not None:
        row.update({"arena_bytes": gpu.get("arena_bytes", 0),
                    "optimizer_state_bytes": gpu.get("optimizer_state_bytes", 0),
                    "gradients_bytes": gpu.get("gradients_backed_peak_bytes", gpu.get("gradients_bytes", 0)),
                    "weights_bytes": gpu.get("weights_backed_peak_bytes", gpu.get("weights_bytes", 0)),
                    "gathers": gpu.get("parameter_gathers", 0), "collectives": gpu.get("collectives", "?")})
    return row


def main():
    ap = arguments(__doc__, "gpu-zero")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--stages", default="0,1,2,3")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = [one(args, int(z)) for z in args.stages.split(",")]
    base = next((r["step_seconds"] for r in rows if r["zero"] == 0 and "error" not in r), None)
    table(["zero (%d ranks):" % args.ranks, "collectives", "step (ms):", "against zero 0:", "samples/s:",
           "arena (MiB):", "optimizer state (MiB):", "gradients' peak (MiB):", "weights' peak (MiB):", "gathers:"], rows,
          lambda r: "%d" % r["zero"],
          lambda r: [r["collectives"], "%.1f" % (r["step_seconds"] * 1e3),
                     "%.2fx" % (r["step_seconds"] / base) if base else "(no zero 0 run)", "%.1f" % r["rate"],
                     "%.1f" % (r["arena_bytes"] / MIB), "%.1f" % (r["optimizer_state_bytes"] / MIB),
                     "%.1f" % (r["gradients_bytes"] / MIB), "%.1f" % (r["weights_bytes"] / MIB), "%d" % r["gathers"]])
    return finish(args, rows)


if __name__ == "__main__":
    sys.exit(main())
