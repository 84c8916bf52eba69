#!/usr/bin/python3
"""GPT training speed, dtrain against PyTorch in the same run.

Cases: gpt-small at T=256, B=8 (tokens/s) and gpt2-124m at
T=64, B=4 (ms/step), each at 1 and 2 threads. Each side does full AdamW
steps (forward, backward, update) on random tokens with the same model
(GPT-2: pre-LN, GELU tanh, tied head, fp32); the best of --repeat runs is
kept. PyTorch is measured at its best: every environment in TORCH_ENVS is
tried and the fastest kept (dtrain likewise over DTRAIN_ENVS).

    /usr/bin/python3 bench/gpt.py [--dtrain BUILD_DIR] [--json] [--repeat N]
        [--threads 1,2] [--cases gpt-small,gpt2-124m] [--steps N]

--steps 2 --repeat 1 makes a quick check that everything runs; real
figures need a quiet machine and the defaults.
"""
import argparse, json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
from train import best  # noqa: E402

TORCH_ENVS = cpu.torch_envs(passive_only=True)
# dtrain is given the same choice of OpenMP wait policy.
DTRAIN_ENVS = [{}, {"OMP_WAIT_POLICY": "passive"}]
CASES = {  # name: (preset, batch, seq, default steps)
    "gpt-small": ("gpt-small", 8, 256, 10),
    "gpt2-124m": ("gpt2-124m", 4, 64, 5),
    "gpt-tiny": ("gpt-tiny", 8, 64, 20),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build", help="build directory")
    ap.add_argument("--json", action="store_true", help="one JSON object per measurement")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default="gpt-small,gpt2-124m")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default per case)")
    a = ap.parse_args()
    print(cpu.banner(a.json))
    bench = os.path.join(a.dtrain, "bench", "bench_gpt")
    rows = []
    for case in a.cases.split(","):
        preset, B, T, steps = CASES[case]
        steps = a.steps or steps
        warm = 1 if a.steps else 2
        for t in [int(x) for x in a.threads.split(",")]:
            common = ["--preset", preset, "--batch", str(B), "--seq", str(T), "--threads", str(t),
                      "--steps", str(steps), "--warmup", str(warm)]
            d = best([bench, *common, "--json"], DTRAIN_ENVS, a.repeat, "tokens_per_sec")
            p = best([sys.executable, os.path.join(HERE, "torch_gpt.py"), *common], TORCH_ENVS, a.repeat,
                     "tokens_per_sec")
            speedup = d["tokens_per_sec"] / p["tokens_per_sec"]
            if a.json:
                print(json.dumps(d))
                print(json.dumps(p))
                print(json.dumps({"case": case, "threads": t, "speedup": round(speedup, 3),
                                  "time_ratio": round(d["ms_per_step"] / p["ms_per_step"], 3)}))
            rows.append((case, B, T, t, d, p, speedup))
    if not a.json:
        print(f"{'case':10} {'B':>2} {'T':>4} {'thr':>3} {'dtrain tok/s':>12} {'torch tok/s':>11} "
              f"{'dtrain ms':>9} {'torch ms':>9} {'speedup':>7}  pytorch env")
        for c, B, T, t, d, p, s in rows:
            print(f"{c:10} {B:2d} {T:4d} {t:3d} {d['tokens_per_sec']:12.0f} {p['tokens_per_sec']:11.0f} "
                  f"{d['ms_per_step']:9.1f} {p['ms_per_step']:9.1f} {s:7.2f}  {p['env']}")


if __name__ == "__main__":
    main()
