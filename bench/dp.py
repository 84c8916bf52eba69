#!/usr/bin/python3
"""Data-parallel throughput: dtrain against PyTorch DDP (Gloo) in one run.

For the MLP (batch 256) and the CNN (batch 64): 1 worker x 1 thread,
1 worker x 2 threads and 2 workers x 1 thread, the same global batch and
SGD-momentum step. dtrain runs `dtrain train` on Fashion-MNIST (data loading
included) and reads summary.json; PyTorch runs bench/torch_ddp.py on
synthetic data, at its best settings (see train.py's TORCH_ENVS). Prints
samples/s, the ratio, 2-worker scaling efficiency (2w x 1t against 2 x the
1w x 1t rate) and the share of the gradient allreduce that dtrain's own
timers saw hidden behind backward.

    /usr/bin/python3 bench/dp.py [--dtrain BUILD_DIR] [--json] [--repeat N]
"""
import argparse, json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train import TORCH_ENVS, best  # noqa: E402

CONFIGS = {"mlp": "configs/fashion-mlp.ini", "cnn": "configs/fashion-cnn.ini"}
LAYOUTS = [(1, 1), (1, 2), (2, 1)]


def run_dtrain(build, model, workers, threads, steps):
    with tempfile.TemporaryDirectory() as d:
        cmd = [os.path.join(build, "dtrain"), "train", os.path.join(HERE, "..", CONFIGS[model]),
               "--workers", str(workers), "--quiet", "--run-dir", d,
               "--set", f"train.threads={threads}", "--set", "train.epochs=0",
               "--set", f"train.max_steps={steps}", "--set", "optim.name=sgd",
               "--set", "optim.momentum=0.9", "--set", "schedule.name=constant",
               "--set", "schedule.warmup_steps=0", "--set", "optim.lr=0.01"]
        subprocess.run(cmd, check=True, capture_output=True)
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)
    hidden = 1 - s["comm_exposed_seconds"] / s["comm_seconds"] if s["comm_seconds"] > 0 else None
    return {"impl": "dtrain", "model": model, "batch": s["batch"], "workers": workers, "threads": threads,
            "steps": s["steps"], "samples_per_sec": round(s["samples_per_sec"], 1),
            "comm_hidden_share": None if hidden is None else round(hidden, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--models", default="mlp,cnn")
    a = ap.parse_args()
    rows = []
    for model in a.models.split(","):
        steps = 300 if model == "mlp" else 80
        res = {}
        for w, t in LAYOUTS:
            d = max((run_dtrain(a.dtrain, model, w, t, steps) for _ in range(a.repeat)),
                    key=lambda r: r["samples_per_sec"])
            p = best([sys.executable, os.path.join(HERE, "torch_ddp.py"), "--model", model, "--workers", str(w),
                      "--threads", str(t), "--steps", str(steps // 3)], TORCH_ENVS, a.repeat)
            res[(w, t)] = (d, p)
            if a.json:
                print(json.dumps(d))
                print(json.dumps(p))
        for (w, t), (d, p) in res.items():
            rows.append((model, w, t, d["samples_per_sec"], p["samples_per_sec"], d.get("comm_hidden_share"), p["env"]))
        eff_d = res[(2, 1)][0]["samples_per_sec"] / (2 * res[(1, 1)][0]["samples_per_sec"])
        eff_p = res[(2, 1)][1]["samples_per_sec"] / (2 * res[(1, 1)][1]["samples_per_sec"])
        if a.json:
            print(json.dumps({"model": model, "scaling_efficiency_dtrain": round(eff_d, 3),
                              "scaling_efficiency_pytorch": round(eff_p, 3)}))
        rows.append((model, "eff", eff_d, eff_p))
    if not a.json:
        print(f"{'model':5} {'workers x threads':>17} {'dtrain/s':>9} {'ddp/s':>9} {'ratio':>6} {'hidden':>7}  pytorch env")
        for r in rows:
            if r[1] == "eff":
                print(f"{r[0]:5} {'2-worker scaling':>17} {r[2]:9.0%} {r[3]:9.0%}")
                continue
            m, w, t, d, p, h, env = r
            hs = "-" if h is None else f"{h:.0%}"
            print(f"{m:5} {f'{w} x {t}':>17} {d:9.0f} {p:9.0f} {d / p:6.2f} {hs:>7}  {env}")


if __name__ == "__main__":
    main()
