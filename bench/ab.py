#!/usr/bin/python3
"""Two builds of dtrain against each other, in one run: a change of the
engine must not cost speed, and this measures it on the same machine in the
same minutes.

For each model (the MLP at batch 256, the CNN at batch 64, gpt-small at 8 x
256 tokens) and each layout (1 worker x 1 thread, 1 x 2, 2 workers x 1),
the two builds' `dtrain train` runs alternate (BASE, NEW, BASE, NEW, ...)
--repeat times each, exactly as bench/dp.py runs dtrain; NEW / BASE is
printed for the best of each and for the median of each. Needs no PyTorch.
--layouts picks the layouts (2x1: 2 workers x 1 thread) and --args adds
`dtrain train` flags to both builds' runs (`--args="--zero 3"`: a ZeRO
stage, as bench/zero.py runs it); the load average at the start is printed
with the CPU. The last column is the CPU time (user + system, every process
of the run) of NEW over BASE, medians: on a shared machine it moves less
with the other work than the rates do (lower is better).

    /usr/bin/python3 bench/ab.py BASE_BUILD_DIR NEW_BUILD_DIR [--repeat N]
        [--models mlp,cnn,gpt-small] [--steps N] [--layouts 1x1,1x2,2x1] [--args "FLAGS"]
"""
import argparse, os, resource, shlex, statistics, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
import dp  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn,gpt-small")
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default: bench/dp.py's per model)")
    ap.add_argument("--layouts", default=",".join(f"{w}x{t}" for w, t in dp.LAYOUTS),
                    help="workers x threads, comma-separated (default 1x1,1x2,2x1)")
    ap.add_argument("--args", default="", help="more `dtrain train` flags for both builds, e.g. --args='--zero 3'")
    a = ap.parse_args()
    layouts = [tuple(int(v) for v in x.split("x")) for x in a.layouts.split(",")]
    extra = shlex.split(a.args)
    print(cpu.banner())
    if extra:
        print(f"# both builds run with: {' '.join(extra)}")
    print(f"{'model':9} {'workers x threads':>17} {'base/s':>9} {'new/s':>9} {'new/base':>8}"
          f" {'median base/s':>13} {'median new/s':>12} {'new/base':>8} {'cpu new/base':>12}")
    for model in a.models.split(","):
        steps = a.steps or dp.STEPS[model]
        key = "samples_per_sec" if model in dp.CONFIGS else "tokens_per_sec"
        for w, t in layouts:
            got, cpus = ([], []), ([], [])
            for _ in range(a.repeat):
                for i, build in enumerate((a.base, a.new)):
                    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    got[i].append(dp.run_dtrain(build, model, w, t, steps, extra)[key])
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpus[i].append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            b, n = max(got[0]), max(got[1])
            mb, mn = statistics.median(got[0]), statistics.median(got[1])
            print(f"{model:9} {f'{w} x {t}':>17} {b:9.0f} {n:9.0f} {n / b:8.3f} {mb:13.0f} {mn:12.0f} {mn / mb:8.3f}"
                  f" {statistics.median(cpus[1]) / statistics.median(cpus[0]):12.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
