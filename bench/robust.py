#!/usr/bin/env python3
"""Robust aggregation and DP-FedAvg under simulated attacks (docs/federated.md,
"Robust aggregation" and "Differential privacy").

Runs `dtrain federate` on Fashion-MNIST (an MLP or configs/fashion-fedavg.ini's
CNN; 100 clients, 10 a round, IID, E = 1, B = 10) with a fraction f of each
round's clients attacking (DTRAIN_ATTACK, a simulation for benches and tests,
never a training option) and prints a markdown table: test accuracy after the
rounds and seconds per round, for FedAvg and every aggregator.

  nice -n 19 /usr/bin/python3 bench/robust.py --dtrain build --model mlp --rounds 50 \
      --attacks scale --fractions 0,0.1,0.2,0.3
  nice -n 19 /usr/bin/python3 bench/robust.py --dtrain build --model mlp --rounds 50 \
      --attacks signflip,random,lie,labelflip --fractions 0.2
  nice -n 19 /usr/bin/python3 bench/robust.py --dtrain build --model mlp --rounds 20 --fraction 1 --dp 1,4,8,inf
  nice -n 19 /usr/bin/python3 bench/robust.py --dtrain build --ps 5 --attacks scale,nan --fractions 0,0.2

--ps N runs `dtrain train` with N workers and one parameter server (mode
sync, the MLP, batch 64, one epoch) instead, the aggregators as [ps] keys.

The aggregators run with [federated] outlier = 0 (no screen), so that each
row measures the aggregator alone; the row "mean+screen" is FedAvg with the
default screen (outlier = 10).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MLP = """[model]
input = 784
layer = linear out=128
layer = relu
layer = linear out=10
"""

COMMON = """[data]
dataset = fashion-mnist
dir = {data}
[optim]
name = sgd
lr = 0.05
[train]
eval_batch = 1000
seed = 1
[federated]
clients = 100
fraction = 0.1
rounds = {rounds}
local_epochs = 1
local_batch = 10
"""

AGGREGATORS = {
    "mean": ["federated.aggregator=mean", "federated.outlier=0"],
    "mean+screen": ["federated.aggregator=mean"],
    "median": ["federated.aggregator=median", "federated.outlier=0"],
    "trimmed 0.3": ["federated.aggregator=trimmed", "federated.trim=0.3", "federated.outlier=0"],
    "krum f=3 m=4": ["federated.aggregator=krum", "federated.krum_f=3", "federated.krum_m=4", "federated.outlier=0"],
    "clip 1": ["federated.aggregator=clip", "federated.clip_bound=1", "federated.outlier=0"],
}


def config(model, rounds, data):
    if model == "mlp":
        head = MLP
    else:  # the CNN of configs/fashion-fedavg.ini
        text = open(os.path.join(ROOT, "configs", "fashion-fedavg.ini")).read()
        head = text[text.index("[model]"):text.index("[data]")]
    return head + COMMON.format(rounds=rounds, data=data)


def run(args, name, cfg, sets, attack, how=None):
    out = os.path.join(args.out, name)
    ini = out + ".ini"
    os.makedirs(args.out, exist_ok=True)
    with open(ini, "w") as f:
        f.write(cfg)
    how = how or ["federate", "--workers", str(args.workers)]
    cmd = [os.path.join(args.dtrain, "dtrain"), how[0], ini] + how[1:] + ["--quiet", "--run-dir", out]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ)
    env.pop("DTRAIN_ATTACK", None)
    if attack:
        env["DTRAIN_ATTACK"] = attack
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0 and "loss is NaN" in p.stdout + p.stderr:
        return None  # the training diverged: a collapse
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return json.load(open(os.path.join(out, "summary.json")))


PS_TRAIN = """[optim]
name = sgd
lr = 0.05
[train]
batch = 64
epochs = 1
eval_batch = 1000
seed = 1
"""


def ps_sets(sets, N):
    # The federated keys as [ps] keys; krum's f and m for N workers.
    out = [x.replace("federated.", "ps.") for x in sets]
    if any("krum" in x for x in out):
        out = [x for x in out if "krum_" not in x] + [f"ps.krum_f={max(1, (N - 3) // 2)}", "ps.krum_m=1"]
    if any("trim=" in x for x in out):
        out = [x for x in out if "trim=" not in x] + ["ps.trim=0.2"]
    return out


def attacks_table(args, cfg):
    print(f"| attack | f | " + " | ".join(AGGREGATORS) + " |")
    print("|---|---:|" + "---:|" * len(AGGREGATORS))
    for attack in args.attacks.split(","):
        for f in [float(x) for x in args.fractions.split(",")]:
            cells = []
            for agg, sets in AGGREGATORS.items():
                name = f"{args.model}-{attack}-{f}-{agg.replace(' ', '_').replace('=', '')}"
                if args.ps:
                    s = run(args, "ps-" + name, cfg, ps_sets(sets, args.ps), f"{attack}:{f}" if f > 0 else None,
                            ["train", "--servers", "1", "--workers", str(args.ps)])
                    if s is None:
                        cells.append("diverged")
                        left = "-"
                    else:
                        per = s["train_seconds"] / s["steps"] * 1000
                        cells.append(f"{s['test_accuracy']:.4f} ({per:.1f} ms)")
                        left = s["ps"]["left_out"]
                else:
                    s = run(args, name, cfg, sets, f"{attack}:{f}" if f > 0 else None)
                    cells.append(f"{s['test_accuracy']:.4f} ({s['wall_seconds'] / s['rounds']:.2f} s)")
                    left = s["updates_left_out"]
                print(f"  {name}: {cells[-1]}, left out {left}", file=sys.stderr)
            print(f"| {attack} | {f:g} | " + " | ".join(cells) + " |", flush=True)


def dp_table(args, cfg):
    print("| target epsilon | noise multiplier | epsilon spent | test accuracy | s/round |")
    print("|---:|---:|---:|---:|---:|")
    for e in args.dp.split(","):
        sets = [f"federated.dp_clip={args.dp_clip}"]
        if e != "inf":
            sets.append(f"federated.dp_epsilon={e}")
        s = run(args, f"{args.model}-dp-{e}", cfg, sets if e != "inf" else ["federated.outlier=0"], None)
        dp = s.get("dp", {"noise_multiplier": 0, "epsilon": float("inf")})
        print(f"| {e} | {dp['noise_multiplier']:.3f} | {dp['epsilon']:.3f} | {s['test_accuracy']:.4f} | "
              f"{s['wall_seconds'] / s['rounds']:.2f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtrain", default="build", help="the build directory holding dtrain")
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", default="/tmp/dtrain-robust")
    ap.add_argument("--attacks", default="scale")
    ap.add_argument("--fractions", default="0,0.1,0.2,0.3")
    ap.add_argument("--aggregators", default=",".join(AGGREGATORS), help="a subset of: " + ", ".join(AGGREGATORS))
    ap.add_argument("--dp", default="", help="DP-FedAvg instead: target epsilons, e.g. 1,4,8,inf")
    ap.add_argument("--dp-clip", default="1", help="dp_clip of the DP runs")
    ap.add_argument("--ps", type=int, default=0, help="N workers and one parameter server instead of federate")
    ap.add_argument("--fraction", default="0.1", help="[federated] fraction (clients sampled per round, of 100)")
    args = ap.parse_args()
    for k in [k for k in AGGREGATORS if k not in args.aggregators.split(",")]:
        del AGGREGATORS[k]
    cfg = config(args.model, args.rounds, args.data).replace("fraction = 0.1", "fraction = " + args.fraction)
    if args.ps:
        cfg = cfg[:cfg.index("[optim]")] + PS_TRAIN
    if args.dp:
        dp_table(args, cfg)
    else:
        attacks_table(args, cfg)


if __name__ == "__main__":
    main()
