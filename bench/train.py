#!/usr/bin/python3
"""Training throughput, dtrain against PyTorch in the same run.

For each model (MLP 784-1024-1024-10 at batch 256, the CNN at batch 64) and
each thread count, runs bench_train (dtrain) and bench/torch_train.py
(PyTorch) on the same synthetic batch with the same SGD-momentum step, each
best of --repeat runs, and prints samples/s and the ratio dtrain/PyTorch.

PyTorch is measured at its best on this machine: every environment in
TORCH_ENVS is tried and the fastest kept (Debian's OpenBLAS mis-detects the
core type unless OPENBLAS_CORETYPE is set, and a passive OpenMP wait policy
stops idle threads spinning).

    /usr/bin/python3 bench/train.py [--dtrain BUILD_DIR] [--json] [--repeat N]
"""
import argparse, json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402

TORCH_ENVS = cpu.torch_envs()
# bench_train is not the CLI, which sets a passive wait policy itself.
DTRAIN_ENVS = [{}, {"OMP_WAIT_POLICY": "passive"}]


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    out = subprocess.run(cmd, env=e, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def best(cmd, envs, repeat, key="samples_per_sec"):
    """The fastest (largest `key`) of `repeat` runs of cmd under each
    environment in envs; the result's "env" names the environment."""
    results, failed = [], []
    for env in envs:
        name = " ".join(f"{k}={v}" for k, v in env.items()) or "default"
        for _ in range(repeat):
            try:
                r = run(cmd, env)
            except subprocess.CalledProcessError as e:  # an environment this CPU cannot run (SIGILL): reported, skipped
                failed.append(f"{name}: exit {e.returncode}")
                print(f"note: {os.path.basename(cmd[1])} under {name} failed ({failed[-1]}); skipped", file=sys.stderr)
                break
            r["env"] = name
            results.append(r)
    if not results:
        raise subprocess.CalledProcessError(1, cmd, "every environment failed: " + "; ".join(failed))
    return max(results, key=lambda r: r[key])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build", help="build directory")
    ap.add_argument("--json", action="store_true", help="one JSON object per measurement")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="mlp,cnn")
    a = ap.parse_args()
    print(cpu.banner(a.json))
    bench = os.path.join(a.dtrain, "bench", "bench_train")
    rows = []
    for model in a.models.split(","):
        for t in [int(x) for x in a.threads.split(",")]:
            common = ["--model", model, "--threads", str(t)]
            d = best([bench, *common, "--json"], DTRAIN_ENVS, a.repeat)
            p = best([sys.executable, os.path.join(HERE, "torch_train.py"), *common], TORCH_ENVS, a.repeat)
            ratio = d["samples_per_sec"] / p["samples_per_sec"]
            if a.json:
                print(json.dumps(d))
                print(json.dumps(p))
                print(json.dumps({"model": model, "threads": t, "ratio": round(ratio, 3)}))
            rows.append((model, d["batch"], t, d["samples_per_sec"], p["samples_per_sec"], ratio, d["env"], p["env"]))
    if not a.json:
        print(f"{'model':5} {'batch':>5} {'thr':>3} {'dtrain/s':>10} {'pytorch/s':>10} {'ratio':>6}  best env: dtrain | pytorch")
        for m, b, t, d, p, r, denv, penv in rows:
            print(f"{m:5} {b:5d} {t:3d} {d:10.0f} {p:10.0f} {r:6.2f}  {denv} | {penv}")


if __name__ == "__main__":
    main()
