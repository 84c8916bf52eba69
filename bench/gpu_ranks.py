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


def arguments(doc, out):
    """The options both GPU benchmarks take (a script adds its own)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--dtrain", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=8, help="timed steps after %d of warm-up" % WARMUP)
    ap.add_argument("--out", default=out)
    ap.add_argument("--json")
    return ap


def finish(args, rows):
    """The rows into --json's file; the exit status: 1 if a run failed."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


def one(args, ranks):
    rows, summary = train(args, "ranks-%d" % ranks, ranks)
    if rows is None:
        return {"ranks": ranks, "error": summary}
    step = statistics.median(r["step_seconds"] for r in rows)
    comm = statistics.median(r["comm_exposed_seconds"] for r in rows)
    return {"ranks": ranks, "step_seconds": step, "wait_after_backward_seconds": comm,
            "rate": statistics.median(r["samples_per_sec"] for r in rows),
            "collectives": summary.get("gpu", {}).get("collectives", "?")}


def main():
    ap = arguments(__doc__, "gpu-ranks")
    ap.add_argument("--ranks", default="1,2,4")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = [one(args, int(r)) for r in args.ranks.split(",")]
    base = next((r["step_seconds"] for r in rows if r["ranks"] == 1 and "error" not in r), None)
    print("| ranks on one GPU | collectives | step (ms) | samples/s (a GPT: sequences) | staging's share of the step "
          "(over the one-rank step) | wait after backward queued (ms) |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print("| %d | %s | | | | |" % (r["ranks"], r["error"]))
            continue
        if base:
            r["staging_share"] = max(0.0, r["step_seconds"] - base) / r["step_seconds"]
        share = "%.0f%%" % (100 * r["staging_share"]) if base else "(no one-rank run)"
        print("| %d | %s | %.1f | %.1f | %s | %.1f |" % (r["ranks"], r["collectives"], r["step_seconds"] * 1e3,
                                                        r["rate"], share, r["wait_after_backward_seconds"] * 1e3))
    return finish(args, rows)


if __name__ == "__main__":
    sys.exit(main())
