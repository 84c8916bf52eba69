#!/usr/bin/python3
"""Local SGD against plain data parallel (docs/data-parallel.md#local-sgd):
one `dtrain train` run of a config per case on W local workers; prints the
test accuracy, the bytes rank 0 sent and their share of plain data
parallel's, and the wall time.

    /usr/bin/python3 bench/localsgd.py [--dtrain BUILD_DIR] [--config configs/fashion-mlp.ini]
        [--workers 2] [--cases dp,H4,H16,warmup500-H16] [--steps N] [--set S.K=V]... [--json]

Cases: plain data parallel (`dp`), `[parallel] sync_every` = 4 and 16, and
post-local SGD: 500 plain data-parallel steps (`sync_warmup`), then
sync_every = 16. "bytes sent" is summary.json's bytes_sent, the collectives
of the training steps; "all bytes" adds what the run sent outside them (the
parameter average before each evaluation, the evaluations' own sums), summed
from rank 0's metrics log (all but the last evaluation's, which follows the
last record). Without --steps the config's shipped epochs run
(the Fashion-MNIST MLP: 15 epochs, a few minutes per case on 2 workers of a
2-core machine); --steps 20 only checks that everything runs. Accuracy does
not depend on the machine's load; the wall time does.
"""
import argparse, json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {  # name: --set flags
    "dp": [],
    "H4": ["parallel.sync_every=4"],
    "H16": ["parallel.sync_every=16"],
    "warmup500-H16": ["parallel.sync_warmup=500", "parallel.sync_every=16"],
}


def all_bytes(run):
    """Rank 0's bytes sent over the whole run: its metrics log's step records
    each count those since the one before."""
    total = 0
    with open(os.path.join(run, "metrics", "rank-00000.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "step":
                total += r.get("bytes_sent", 0)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/fashion-mlp.ini"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=0, help="max_steps (0: the config's epochs)")
    ap.add_argument("--set", action="append", default=[], help="more config overrides for every run")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    print(cpu.banner(a.json))
    rows = []
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-localsgd-") as tmp:
        for name in a.cases.split(","):
            if name not in CASES:
                sys.exit(f"--cases: unknown case '{name}' (expected some of {', '.join(CASES)})")
            run = os.path.join(tmp, name)
            cmd = [os.path.abspath(os.path.join(a.dtrain, "dtrain")), "train", os.path.abspath(a.config), "--quiet",
                   "--workers", str(a.workers), "--run-dir", run]
            for s in CASES[name] + a.set + ([f"train.max_steps={a.steps}"] if a.steps else []):
                cmd += ["--set", s]
            subprocess.run(cmd, check=True)
            with open(os.path.join(run, "summary.json")) as f:
                s = json.load(f)
            rows.append({"case": name, "strategy": s["strategy"], "steps": s["steps"],
                         "accuracy": s["test_accuracy"], "bytes_sent": s["bytes_sent"],
                         "all_bytes_sent": all_bytes(run), "wall_seconds": s["wall_seconds"]})
    base = next((r for r in rows if r["case"] == "dp"), rows[0])
    for r in rows:
        r["bytes_share"] = r["bytes_sent"] / base["bytes_sent"] if base["bytes_sent"] else None
        r["all_bytes_share"] = r["all_bytes_sent"] / base["all_bytes_sent"] if base["all_bytes_sent"] else None
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{os.path.basename(a.config)}, {a.workers} workers, {base['steps']} steps; bytes: rank 0's")
    print(f"{'case':14} {'strategy':10} {'accuracy':>9} {'vs dp':>7} {'bytes sent':>14} {'share':>6} "
          f"{'all bytes':>14} {'share':>6} {'wall s':>7}")
    for r in rows:
        share = lambda v: f"{v:6.3f}" if v is not None else "     -"
        print(f"{r['case']:14} {r['strategy']:10} {r['accuracy']:9.4f} {100 * (r['accuracy'] - base['accuracy']):+6.2f}p "
              f"{r['bytes_sent']:14.0f} {share(r['bytes_share'])} {r['all_bytes_sent']:14.0f} "
              f"{share(r['all_bytes_share'])} {r['wall_seconds']:7.0f}")


if __name__ == "__main__":
    main()
