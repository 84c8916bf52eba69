#!/usr/bin/python3
"""Ranks sharing one GPU: 1, 2 and 4 ranks of `dtrain train --device cuda`
on the same global batch, each rank's gradients staged through pinned host
memory and summed by the host's communicator (docs/gpu.md, "Several
ranks"). Prints, per rank count, the median step, samples per second,
and the staging's cost as a fraction of the step: the step's excess over
the one-rank step on the same global batch (the ranks share the GPU, so
their kernels add up to the one rank's) over the step. Beside it rank
0's wait after it queued backward (metrics' comm_exposed_seconds), which
on a GPU holds the GPU's backward still running as well as the exchange.

    python3 bench/gpu_ranks.py --dtrain BUILD/dtrain --config RUN.ini
        [--ranks 1,2,4] [--steps N] [--out DIR] [--json FILE]

The config's [train] batch is the global batch (split over the ranks);
the first 3 steps are warm-up, left out of the medians. Only the standard
library: it runs on the GPU machine as it is.
"""
import argparse, json, os, statistics, subprocess, sys

WARMUP = 3


def records(run_dir):
    """Rank 0's step records after the warm-up."""
    path = os.path.join(run_dir, "metrics", "rank-00000.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r.get("type") == "step" and r["step"] > WARMUP]


def train(args, name, ranks, flags=()):
    """`dtrain train` of the config on `ranks` ranks on the GPU, its run
    directory OUT/name, for the warm-up and the timed steps: rank 0's step
    records after the warm-up and summary.json, or (None, "exit N")."""
    run_dir = os.path.join(args.out, name)
    cmd = [args.dtrain, "train", args.config, "--workers", str(ranks), "--device", "cuda", *flags, "--run-dir",
           run_dir, "--set", "train.max_steps=%d" % (args.steps + WARMUP), "--set", "train.log_every=1", "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        return None, "exit %d" % p.returncode
    with open(os.path.join(run_dir, "summary.json")) as f:
        return records(run_dir), json.load(f)


def measured(args, key, value, name, ranks, flags=()):
    """A run of `train`: its row ({key: value}, the median step and rate
    after the warm-up) and summary.json's "gpu" object; the row says its
    error and the object is None where the run failed."""
    rows, summary = train(args, name, ranks, flags)
    if rows is None:
        return {key: value, "error": summary}, None
    return {key: value, "step_seconds": statistics.median(r["step_seconds"] for r in rows),
            "rate": statistics.median(r["samples_per_sec"] for r in rows)}, summary.get("gpu", {})


def arguments(doc, out, config=True):
    """The options the GPU benchmarks take (a script adds its own; --config
    where the script is given the run's config rather than writing it)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--dtrain", required=True)
    if config:
        ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=8, help="timed steps after %d of warm-up" % WARMUP)
    ap.add_argument("--out", default=out)
    ap.add_argument("--json")
    return ap


def table(header, rows, label, cells):
    """A markdown table: header (column names; a name ending in ':' is
    right-aligned, the colon dropped), then a line a row: label(r) and
    cells(r), or label(r) and r's error."""
    print("| " + " | ".join(h.rstrip(":") for h in header) + " |")
    print("|" + "|".join("---:" if h.endswith(":") else "---" for h in header) + "|")
    for r in rows:
        rest = [r["error"]] + [""] * (len(header) - 2) if "error" in r else cells(r)
        print("| " + " | ".join([label(r)] + rest) + " |")


def finish(args, rows):
    """The rows into --json's file; the exit status: 1 if a run failed."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


def one(args, ranks):
    row, gpu = measured(args, "ranks", ranks, "ranks-%d" % ranks, ranks)
    if gpu is not None:
        rows = records(os.path.join(args.out, "ranks-%d" % ranks))
        row["wait_after_backward_seconds"] = statistics.median(r["comm_exposed_seconds"] for r in rows)
        row["collectives"] = gpu.get("collectives", "?")
    return row


def main():
    ap = arguments(__doc__, "gpu-ranks")
    ap.add_argument("--ranks", default="1,2,4")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = [one(args, int(r)) for r in args.ranks.split(",")]
    base = next((r["step_seconds"] for r in rows if r["ranks"] == 1 and "error" not in r), None)
    for r in rows:
        if base and "error" not in r:
            r["staging_share"] = max(0.0, r["step_seconds"] - base) / r["step_seconds"]
    table(["ranks on one GPU:", "collectives", "step (ms):", "samples/s (a GPT: sequences):",
           "staging's share of the step (over the one-rank step):", "wait after backward queued (ms):"], rows,
          lambda r: "%d" % r["ranks"],
          lambda r: [r["collectives"], "%.1f" % (r["step_seconds"] * 1e3), "%.1f" % r["rate"],
                     "%.0f%%" % (100 * r["staging_share"]) if base else "(no one-rank run)",
                     "%.1f" % (r["wait_after_backward_seconds"] * 1e3)])
    return finish(args, rows)


if __name__ == "__main__":
    sys.exit(main())
