#!/usr/bin/python3
"""ResNet-18 training throughput, dtrain against PyTorch in the same run.

The resnet18 preset (configs/fashion-resnet.ini's shape: a 3x3 stride-1
stem without max pooling, stages of W, 2W, 4W, 8W channels of two basic
blocks each, batch norm, global average pooling) against torchvision's
ResNet-18 built the same way (bench/torch_train.py --model resnet18), on
the same synthetic 1x28x28 batch with the same SGD-momentum step, at each
thread count, best of --repeat runs each, as bench/train.py does.

    /usr/bin/python3 bench/resnet.py [--dtrain BUILD_DIR] [--width 16] [--batch 64] [--json] [--repeat N]
"""
import argparse, json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
from train import best, DTRAIN_ENVS, TORCH_ENVS  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build", help="build directory")
    ap.add_argument("--json", action="store_true", help="one JSON object per measurement")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--widths", default="16", help="first-stage widths, e.g. 16,64")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    print(cpu.banner(a.json))
    bench = os.path.join(a.dtrain, "bench", "bench_train")
    rows = []
    for w in [int(x) for x in a.widths.split(",")]:
        for t in [int(x) for x in a.threads.split(",")]:
            common = ["--model", "resnet18", "--width", str(w), "--batch", str(a.batch), "--threads", str(t)]
            d = best([bench, *common, "--json"], DTRAIN_ENVS, a.repeat)
            p = best([sys.executable, os.path.join(HERE, "torch_train.py"), *common], TORCH_ENVS, a.repeat)
            ratio = d["samples_per_sec"] / p["samples_per_sec"]
            if a.json:
                print(json.dumps(d))
                print(json.dumps(p))
                print(json.dumps({"model": "resnet18", "width": w, "threads": t, "ratio": round(ratio, 3)}))
            rows.append((w, a.batch, t, d["samples_per_sec"], p["samples_per_sec"], ratio, d["env"], p["env"]))
    if not a.json:
        print(f"{'width':5} {'batch':>5} {'thr':>3} {'dtrain/s':>10} {'pytorch/s':>10} {'ratio':>6}  best env: dtrain | pytorch")
        for w, b, t, d, p, r, denv, penv in rows:
            print(f"{w:5d} {b:5d} {t:3d} {d:10.1f} {p:10.1f} {r:6.2f}  {denv} | {penv}")


if __name__ == "__main__":
    main()
