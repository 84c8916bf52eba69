#!/usr/bin/python3
"""Model parallel on GPUs: N ranks (2 by default, sharing one GPU where the
machine has one) of `dtrain train --device cuda` in data parallel and in
N pipeline stages on the same global batch (docs/gpu.md, "Model parallel
(pipeline and tensor)"). Prints, per layout, the median step, samples per
second, the step against data parallel's, and rank 0's GPU memory from
summary.json: the weights, gradients and optimizer state it backs (a
stage: its layers'), its activations (a stage: its micro-batches' sets
beside the arena), where the update runs and the reads from the device a
step. A stage sums, clips and updates its layers on the device; what its
streams between stages and its bubble cost shows in the step.

    python3 bench/gpu_model_parallel.py --dtrain BUILD/dtrain --config RUN.ini
        [--ranks 2] [--steps N] [--out DIR] [--json FILE]

The config's [train] batch is the global batch; the first 3 steps are
warm-up, left out of the medians (bench/gpu_ranks.py's records). Only the
standard library: it runs on the GPU machine as it is.
"""
import os, sys

from gpu_ranks import arguments, finish, measured, table

MIB = 1048576.0


def one(args, name, flags):
    row, gpu = measured(args, "layout", name, name, args.ranks, flags)
    if gpu is not None:
        row.update({"weights_bytes": gpu.get("weights_bytes", 0), "gradients_bytes": gpu.get("gradients_bytes", 0),
                    "optimizer_bytes": gpu.get("optimizer_state_bytes", 0),
                    "activations_bytes": gpu.get("activations_bytes", 0), "update": gpu.get("update", "device"),
                    "reads": gpu.get("reads_per_step", 0)})
    return row


def main():
    ap = arguments(__doc__, "gpu-model-parallel")
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    layouts = [("data-parallel", ()),
               ("pipeline-%d" % args.ranks, ("--set", "parallel.pipeline=%d" % args.ranks,
                                             "--set", "parallel.micro_batches=%d" % (2 * args.ranks)))]
    rows = [one(args, name, flags) for name, flags in layouts]
    base = next((r["step_seconds"] for r in rows if r["layout"] == "data-parallel" and "error" not in r), None)
    table(["%d ranks" % args.ranks, "step (ms):", "against data parallel:", "samples/s:", "weights (MiB):",
           "gradients (MiB):", "optimizer (MiB):", "activations (MiB):", "update", "reads a step:"], rows,
          lambda r: r["layout"],
          lambda r: ["%.1f" % (r["step_seconds"] * 1e3),
                     "%.2fx" % (r["step_seconds"] / base) if base else "(no data-parallel run)", "%.1f" % r["rate"],
                     "%.1f" % (r["weights_bytes"] / MIB), "%.1f" % (r["gradients_bytes"] / MIB),
                     "%.1f" % (r["optimizer_bytes"] / MIB), "%.1f" % (r["activations_bytes"] / MIB), r["update"],
                     "%g" % r["reads"]])
    return finish(args, rows)


if __name__ == "__main__":
    sys.exit(main())
