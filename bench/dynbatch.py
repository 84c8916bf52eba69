#!/usr/bin/python3
"""Dynamic batching against the fixed split with one slow rank
(docs/data-parallel.md#dynamic-batching): `dtrain train` of a config on W
local workers with rank R slowed F times (DTRAIN_SLOW_RANK=R:xF: after each
micro-batch's forward and backward the rank sleeps F - 1 times as long), once
with the even split and once with [train] dynamic_batch = true; and once
with no slow rank, the floor. Prints the median step time over the second
half of the steps (rank 0's metrics log; the split settles in the first
steps) and the ratio fixed / dynamic (the goal: at least 1.5 with one rank 2x
slow on 4 workers).

    /usr/bin/python3 bench/dynbatch.py [--dtrain BUILD_DIR] [--config configs/fashion-cnn.ini]
        [--workers 4] [--slow-rank 1] [--factor 2] [--steps 60] [--deterministic] [--set S.K=V]... [--json]

Each worker runs one compute thread (train.threads = 1). On a machine with
fewer cores than workers the ranks share cores; a sleeping slow rank then
leaves its core to the others, which flatters neither case more than the
other, but the absolute times are not those of a machine with a core per
rank.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_times(run):
    t, shares = [], {}
    with open(os.path.join(run, "metrics", "rank-00000.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "step":
                t.append(r["step_seconds"])
    return t


def last_shares(run, W):
    out = []
    for r in range(W):
        last = None
        with open(os.path.join(run, "metrics", "rank-%05d.jsonl" % r)) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("type") == "step":
                    last = rec.get("share")
        out.append(last)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "fashion-cnn.ini"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    print(cpu.banner(a.json), flush=True)
    exe = os.path.join(a.dtrain, "dtrain")
    cases = [("no slow rank", False, False), ("slow, fixed split", True, False), ("slow, dynamic_batch", True, True)]
    results = []
    with tempfile.TemporaryDirectory(prefix="dtrain-dynbatch-") as tmp:
        for name, slow, dyn in cases:
            run = os.path.join(tmp, "run%d" % len(results))
            cmd = [exe, "train", a.config, "--quiet", "--workers", str(a.workers), "--run-dir", run,
                   "--set", "train.max_steps=%d" % a.steps, "--set", "train.threads=1",
                   "--set", "train.dynamic_batch=%s" % ("true" if dyn else "false")]
            if a.deterministic:
                cmd.append("--deterministic")
            for s in a.set:
                cmd += ["--set", s]
            env = dict(os.environ)
            env.pop("DTRAIN_SLOW_RANK", None)
            if slow:
                env["DTRAIN_SLOW_RANK"] = "%d:x%g" % (a.slow_rank, a.factor)
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            t = step_times(run)
            med = statistics.median(t[len(t) // 2:])
            results.append({"case": name, "median_step_seconds": med, "shares": last_shares(run, a.workers)})
    fixed, dynamic = results[1]["median_step_seconds"], results[2]["median_step_seconds"]
    if a.json:
        json.dump({"workers": a.workers, "factor": a.factor, "cases": results, "fixed_over_dynamic": fixed / dynamic},
                  sys.stdout, indent=1)
        print()
        return
    for r in results:
        print("%-22s median step %.1f ms   last shares %s" % (r["case"], 1e3 * r["median_step_seconds"], r["shares"]))
    print("rank %d %gx slow on %d workers: fixed split / dynamic batch = %.2fx" % (a.slow_rank, a.factor, a.workers,
                                                                                   fixed / dynamic))


if __name__ == "__main__":
    main()
