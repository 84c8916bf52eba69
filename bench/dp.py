#!/usr/bin/python3
"""Data-parallel throughput: dtrain against PyTorch DDP (Gloo) in one run.

For the MLP (batch 256), the CNN (batch 64) and the GPT gpt-small (batch 8
sequences of 256 tokens, bench/gpt.py's main case): 1 worker x 1 thread,
1 worker x 2 threads and 2 workers x 1 thread, the same global batch and
step (SGD momentum for the classifiers, AdamW for the GPT). dtrain runs
`dtrain train` (the classifiers on Fashion-MNIST, data loading included;
the GPT on a file of random tokens) and reads summary.json; PyTorch runs
bench/torch_ddp.py on synthetic data, at its best settings (see
TORCH_ENVS in train.py and gpt.py). Prints samples/s (tokens/s for the
GPT), the ratio, 2-worker scaling efficiency (2w x 1t against 2 x the
1w x 1t rate) and the share of the gradient allreduce that dtrain's own
timers saw hidden behind backward.

    /usr/bin/python3 bench/dp.py [--dtrain BUILD_DIR] [--json] [--repeat N]
        [--models mlp,cnn,gpt-small] [--steps N]

--steps 2 --repeat 1 only checks that everything runs; real figures need a
quiet machine and the default step counts.
"""
import argparse, json, os, random, struct, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
import gpt  # noqa: E402
from train import TORCH_ENVS, best  # noqa: E402

CONFIGS = {"mlp": "configs/fashion-mlp.ini", "cnn": "configs/fashion-cnn.ini"}
STEPS = {"mlp": 300, "cnn": 80, "gpt-small": 12}  # dtrain's; PyTorch times a third after warm-up
LAYOUTS = [(1, 1), (1, 2), (2, 1)]
GPT_INI = """[model]
preset = {preset}
[data]
dataset = tokens
train_file = {tokens}
[optim]
name = adamw
lr = 3e-4
weight_decay = 0.1
[schedule]
name = constant
[train]
batch = {batch}
seq_len = {seq}
"""


def write_tokens(path, n, vocab, seed=1):
    """An llm.c token file of n random ids below vocab."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *[0] * 253))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(vocab) for _ in range(n))))


def classifier_args(model, d):
    return os.path.join(HERE, "..", CONFIGS[model]), [
        "train.epochs=0", "optim.name=sgd", "optim.momentum=0.9", "schedule.name=constant",
        "schedule.warmup_steps=0", "optim.lr=0.01"]


def gpt_args(model, d):
    preset, batch, seq, _ = gpt.CASES[model]
    tokens, ini = os.path.join(d, "tokens.bin"), os.path.join(d, "gpt.ini")
    write_tokens(tokens, 1 << 16, 256)
    with open(ini, "w") as f:
        f.write(GPT_INI.format(preset=preset, tokens=tokens, batch=batch, seq=seq))
    return ini, []


def run_dtrain(build, model, workers, threads, steps, extra=()):
    with tempfile.TemporaryDirectory() as d:
        config, sets = (classifier_args if model in CONFIGS else gpt_args)(model, d)
        cmd = [os.path.join(build, "dtrain"), "train", config, "--workers", str(workers), "--quiet",
               "--run-dir", os.path.join(d, "run")]
        for s in [f"train.threads={threads}", f"train.max_steps={steps}", *sets]:
            cmd += ["--set", s]
        subprocess.run(cmd + list(extra), check=True, capture_output=True)
        with open(os.path.join(d, "run", "summary.json")) as f:
            s = json.load(f)
    hidden = 1 - s["comm_exposed_seconds"] / s["comm_seconds"] if s["comm_seconds"] > 0 else None
    r = {"impl": "dtrain", "model": model, "batch": s["batch"], "workers": workers, "threads": threads,
         "steps": s["steps"], "samples_per_sec": round(s["samples_per_sec"], 1),
         "comm_hidden_share": None if hidden is None else round(hidden, 3)}
    if "tokens_per_sec" in s:
        r.update(seq=s["seq_len"], tokens_per_sec=round(s["tokens_per_sec"], 1))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--models", default="mlp,cnn,gpt-small")
    ap.add_argument("--steps", type=int, default=0, help="dtrain's steps per run (default per model)")
    a = ap.parse_args()
    print(cpu.banner(a.json))
    rows = []
    for model in a.models.split(","):
        steps = a.steps or STEPS[model]
        is_gpt = model not in CONFIGS
        key = "tokens_per_sec" if is_gpt else "samples_per_sec"
        envs = gpt.TORCH_ENVS if is_gpt else TORCH_ENVS
        res = {}
        for w, t in LAYOUTS:
            d = max((run_dtrain(a.dtrain, model, w, t, steps) for _ in range(a.repeat)), key=lambda r: r[key])
            p = best([sys.executable, os.path.join(HERE, "torch_ddp.py"), "--model", model, "--workers", str(w),
                      "--threads", str(t), "--steps", str(max(steps // 3, 1))], envs, a.repeat, key)
            res[(w, t)] = (d, p)
            if a.json:
                print(json.dumps(d))
                print(json.dumps(p))
                print(json.dumps({"model": model, "workers": w, "threads": t, "ratio": round(d[key] / p[key], 3)}))
        for (w, t), (d, p) in res.items():
            rows.append((model, w, t, d[key], p[key], d.get("comm_hidden_share"), p["env"]))
        eff_d = res[(2, 1)][0][key] / (2 * res[(1, 1)][0][key])
        eff_p = res[(2, 1)][1][key] / (2 * res[(1, 1)][1][key])
        if a.json:
            print(json.dumps({"model": model, "scaling_efficiency_dtrain": round(eff_d, 3),
                              "scaling_efficiency_pytorch": round(eff_p, 3)}))
        rows.append((model, "eff", eff_d, eff_p))
    if not a.json:
        print("samples/s (GPT: tokens/s)")
        print(f"{'model':9} {'workers x threads':>17} {'dtrain/s':>9} {'ddp/s':>9} {'ratio':>6} {'hidden':>7}  pytorch env")
        for r in rows:
            if r[1] == "eff":
                print(f"{r[0]:9} {'2-worker scaling':>17} {r[2]:9.0%} {r[3]:9.0%}")
                continue
            m, w, t, d, p, h, env = r
            hs = "-" if h is None else f"{h:.0%}"
            print(f"{m:9} {f'{w} x {t}':>17} {d:9.0f} {p:9.0f} {d / p:6.2f} {hs:>7}  {env}")


if __name__ == "__main__":
    main()
