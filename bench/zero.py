#!/usr/bin/python3
"""ZeRO stages against plain data parallel, in one run (docs/zero.md,
docs/benchmarks.md).

For each model (the MLP at batch 256, the CNN at batch 64, gpt-small at
8 x 256 tokens) on 2 workers x 1 thread, `dtrain train --zero N` for N = 0
(plain data parallel), 1, 2 and 3 alternate (0, 1, 2, 3, 0, 1, ...)
--repeat times each, exactly as bench/dp.py runs dtrain; the best of each
is kept and the throughput of each stage over stage 0's is printed, with
the share of gradient communication hidden behind backward. The goal is
>= 0.95 for stages 1 and 2 and >= 0.85 for stage 3 on gpt-small.

With --torch, PyTorch's ZeroRedundancyOptimizer (its ZeRO stage 1, Gloo,
CPU: bench/torch_ddp.py --zero, at its best environment as bench/dp.py
runs DDP) on the same model, global batch and optimizer is measured in the
same run, and dtrain's stage 1 over it is printed (goal >= 1.3 on the MLP
and gpt-small). --args adds `dtrain train` flags to every stage's runs:
`--args="--memory-limit 4G"` measures stages 2 and 3 with the pages of
the parts a rank does not own given back each step, as under a memory cap
(docs/zero.md); without it they keep them where the machine has room.
--base BUILD runs a second build too, its runs alternating with the
first's (base, new for each stage), and prints both builds' rows; the
median column is each stage's median rate over stage 0's median. Run it only on a quiet machine (`uptime` load < 1.5); the
CPU model is printed first, to go beside the figures.

    /usr/bin/python3 bench/zero.py [--dtrain build] [--repeat N] [--torch]
        [--models mlp,cnn,gpt-small] [--steps N] [--workers N] [--args "FLAGS"] [--base BUILD]
"""
import argparse, os, shlex, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
import dp  # noqa: E402

STAGES = (0, 1, 2, 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn,gpt-small")
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default: bench/dp.py's per model)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--torch", action="store_true", help="also PyTorch's ZeroRedundancyOptimizer")
    ap.add_argument("--args", default="", help="more `dtrain train` flags for every run, e.g. --args='--memory-limit 4G'")
    ap.add_argument("--base", default="", help="a second build, alternating with --dtrain's runs")
    a = ap.parse_args()
    extra = shlex.split(a.args)
    builds = ([a.base] if a.base else []) + [a.dtrain]
    print(cpu.banner())
    print(f"# {a.workers} workers x 1 thread{' with ' + ' '.join(extra) if extra else ''}")
    print(f"{'model':9} {'zero':>4} {'per s':>9} {'/ zero 0':>8} {'median':>8} {'comm hidden':>11}"
          f"{'  build' if a.base else ''}")
    for model in a.models.split(","):
        steps = a.steps or dp.STEPS[model]
        key = "samples_per_sec" if model in dp.CONFIGS else "tokens_per_sec"
        runs = {(b, z): [] for b in builds for z in STAGES}
        for _ in range(a.repeat):
            for z in STAGES:
                for b in builds:
                    runs[b, z].append(dp.run_dtrain(b, model, a.workers, 1, steps, ["--zero", str(z), *extra]))
        for b in builds:
            best = {z: max(runs[b, z], key=lambda r: r[key]) for z in STAGES}
            med = {z: statistics.median(r[key] for r in runs[b, z]) for z in STAGES}
            for z in STAGES:
                r, h = best[z], best[z]["comm_hidden_share"]
                print(f"{model:9} {z:4} {r[key]:9.0f} {r[key] / best[0][key]:8.3f} {med[z] / med[0]:8.3f} "
                      f"{'-' if h is None else f'{h:.2f}':>11}{'  ' + b if a.base else ''}", flush=True)
        best = {z: max(runs[a.dtrain, z], key=lambda r: r[key]) for z in STAGES}
        if a.torch:
            envs = dp.gpt.TORCH_ENVS if model not in dp.CONFIGS else dp.TORCH_ENVS
            cmd = [sys.executable, os.path.join(HERE, "torch_ddp.py"), "--model", model, "--workers", str(a.workers),
                   "--threads", "1", "--steps", str(max(steps // 3, 1)), "--zero"]
            try:
                p = dp.best(cmd, envs, a.repeat, key)
            except subprocess.CalledProcessError as e:  # a peer that crashes is reported, not fatal
                print(f"{model:9} PyTorch ZeroRedundancyOptimizer failed: exit {e.returncode}", flush=True)
                continue
            print(f"{model:9} PyTorch ZeroRedundancyOptimizer {p[key]:9.0f} per s ({p['env']}); "
                  f"dtrain zero 1 / PyTorch ZeRO-1 {best[1][key] / p[key]:.2f}", flush=True)


if __name__ == "__main__":
    main()
