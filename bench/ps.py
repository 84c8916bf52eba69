#!/usr/bin/python3
"""Parameter servers per mode against each other and against allreduce data
parallel (docs/parameter-server.md#measured): one `dtrain train` run of a
config per case on W local workers (default 4), one of them slowed
(DTRAIN_SLOW_RANK=1:MS: MS milliseconds of sleep each step, about its own
step time, so about 2x slower); prints samples/s as rank 0 sees it over its
steps (summary.json's samples_per_sec: time in steps, not the waits at
evaluations) and over the whole run (samples trained / wall_seconds), each
with its ratio to sync, the test accuracy, the servers' updates/s (server 0's applied gradients over
the training time) and the bytes through the servers per second (every
applied or dropped gradient pushed and its weights pulled: 2 x 4 bytes x
parameters each).

    /usr/bin/python3 bench/ps.py [--dtrain BUILD_DIR] [--config configs/fashion-mlp.ini]
        [--workers 4] [--slow-ms 40 | --slow-factor 2] [--compute-ms T]
        [--cases dp,sync,async,ssp2,backup1,sync-S1,sync-S2] [--steps N] [--set S.K=V]... [--json]

Cases: `dp` allreduce data parallel; `sync`, `async`, `ssp2` (staleness 2),
`backup1` (one backup worker), each with 2 servers; `async-dyn` and
`ssp2-dyn` the same with `[ps] share = dynamic` (the epoch's pieces to
whichever worker is free); `sync-S1` and `sync-S2`
without the slow worker, 1 and 2 servers, for the single-server
bottleneck. Without --steps the config's shipped epochs run (minutes per
case on a 2-core machine); --steps 20 only checks that everything runs.
Accuracy does not depend on the machine's load; the rates do.

--slow-factor F slows worker 1 F times (DTRAIN_SLOW_RANK=1:xF: it sleeps
F - 1 times its own step time, as the machine's load makes it) in place of
a fixed --slow-ms.

--compute-ms T models compute off this machine's cores: every worker
sleeps T ms a step besides its real compute, worker 1 F times as long
(F = --slow-factor, default 2; DTRAIN_SLOW_RANK=*:T,1:(F-1)T). On a
machine with fewer cores than processes the workers' real compute shares
the cores, and a slow worker's sleep lends its core to the others, so
sync loses little to it; with T well above the real step time the cores
are no longer the bound, as on machines of their own, and what the
modes gain by not waiting for the slow worker shows.
"""
import argparse, json, os, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {  # name: (flags, slowed)
    "dp": ([], True),
    "sync": (["--servers", "2"], True),
    "async": (["--servers", "2", "--set", "ps.mode=async"], True),
    "ssp2": (["--servers", "2", "--set", "ps.mode=ssp", "--set", "ps.staleness=2"], True),
    "backup1": (["--servers", "2", "--set", "ps.mode=backup", "--set", "ps.backup_workers=1"], True),
    "async-dyn": (["--servers", "2", "--set", "ps.mode=async", "--set", "ps.share=dynamic"], True),
    "ssp2-dyn": (["--servers", "2", "--set", "ps.mode=ssp", "--set", "ps.staleness=2", "--set", "ps.share=dynamic"],
                 True),
    "sync-S1": (["--servers", "1"], False),
    "sync-S2": (["--servers", "2"], False),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/fashion-mlp.ini"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--slow-ms", type=int, default=40)
    ap.add_argument("--slow-factor", type=float, default=0, help="worker 1 F times slower (in place of --slow-ms)")
    ap.add_argument("--compute-ms", type=float, default=0,
                    help="every worker sleeps T ms a step (compute modelled off the cores), worker 1 F times as long")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=0, help="max_steps (0: the config's epochs)")
    ap.add_argument("--set", action="append", default=[], help="more config overrides for every run")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    print(cpu.banner(a.json), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-ps-") as tmp:
        for name in a.cases.split(","):
            if name not in CASES:
                sys.exit(f"--cases: unknown case '{name}' (expected some of {', '.join(CASES)})")
            flags, slowed = CASES[name]
            if a.steps and "ps.share=dynamic" in flags:  # its epochs are its only places: no max_steps
                print(f"{name}: skipped with --steps ([ps] share = dynamic refuses [train] max_steps)", flush=True)
                continue
            run = os.path.join(tmp, name)
            cmd = [os.path.abspath(os.path.join(a.dtrain, "dtrain")), "train", os.path.abspath(a.config), "--quiet",
                   "--run-dir", run, "--workers", str(a.workers)] + flags
            for s in a.set + ([f"train.max_steps={a.steps}"] if a.steps else []):
                cmd += ["--set", s]
            env = dict(os.environ)
            env.pop("DTRAIN_SLOW_RANK", None)
            if a.compute_ms:
                more = a.compute_ms * ((a.slow_factor or 2) - 1) if slowed else 0
                env["DTRAIN_SLOW_RANK"] = f"*:{a.compute_ms:g},1:{more:g}"
            elif slowed:
                env["DTRAIN_SLOW_RANK"] = f"1:x{a.slow_factor}" if a.slow_factor else f"1:{a.slow_ms}"
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{name}: exit {p.returncode}\n{p.stderr}")
            with open(os.path.join(run, "summary.json")) as f:
                s = json.load(f)
            ps = s.get("ps", {})
            t = s["train_seconds"]
            pushes = ps.get("applied", 0) + ps.get("dropped", 0)
            # samples trained by all workers: rank 0's steps of global batches, or with dynamic sharing
            # every piece handed out (a piece: a batch's share of one worker)
            trained = ps["pieces"] * s["batch"] / a.workers if ps.get("share") == "dynamic" else s["steps"] * s["batch"]
            rows.append({"case": name, "slowed": slowed, "samples_per_sec": s["samples_per_sec"],
                         "wall_samples_per_sec": trained / s["wall_seconds"],
                         "test_accuracy": s.get("test_accuracy", -1), "updates_per_sec": ps.get("applied", 0) / t,
                         "server_bytes_per_sec": pushes * 2 * 4 * s["params"] / t, "train_seconds": t})
    sync = next((r for r in rows if r["case"] == "sync"), None)
    for r in rows:
        r["vs_sync"] = r["samples_per_sec"] / sync["samples_per_sec"] if sync else 0
        r["wall_vs_sync"] = r["wall_samples_per_sec"] / sync["wall_samples_per_sec"] if sync else 0
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':9} {'slowed':6} {'samples/s':>10} {'vs sync':>8} {'wall s/s':>9} {'vs sync':>8} {'accuracy':>9} "
          f"{'updates/s':>10} {'server MB/s':>12}")
    for r in rows:
        print(f"{r['case']:9} {'yes' if r['slowed'] else 'no':6} {r['samples_per_sec']:10.0f} {r['vs_sync']:8.2f} "
              f"{r['wall_samples_per_sec']:9.0f} {r['wall_vs_sync']:8.2f} "
              f"{r['test_accuracy']:9.4f} {r['updates_per_sec']:10.1f} {r['server_bytes_per_sec'] / 1e6:12.1f}")


if __name__ == "__main__":
    main()
