#!/usr/bin/python3
"""The MLP (batch 256) and the CNN (batches 64 and 512) on one GPU, dtrain
against PyTorch eager in the same run: the same models and SGD-momentum step
as bench/train.py's (bench/torch_train.py --device cuda for PyTorch, on one
batch already on the GPU; `dtrain train --device cuda` on random 28x28
images through its loader). Prints, per model and batch, each side's
samples per second (dtrain: the median step after the warm-up) and the
ratio dtrain / PyTorch.

    python3 bench/gpu_train.py --dtrain BUILD/dtrain [--steps N] [--out DIR] [--json FILE]

Only the standard library here (PyTorch runs in its own process): it runs
on the GPU machine as it is (tests/gpu/run.sh's mlp-cnn stage).
"""
import json, os, random, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_ranks  # noqa: E402

CASES = (("mlp", 256), ("cnn", 64), ("cnn", 512))


def idx(path, dims, data):
    """An IDX file of unsigned bytes (the Fashion-MNIST format)."""
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims) + data)


def make_data(d, n_train=8192, n_test=512):
    """Random 28x28 images and labels in DIR (the loader's file names)."""
    os.makedirs(d, exist_ok=True)
    rng = random.Random(1)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        idx(os.path.join(d, prefix + "-images-idx3-ubyte"), (n, 28, 28), os.urandom(n * 784))
        idx(os.path.join(d, prefix + "-labels-idx1-ubyte"), (n,), bytes(rng.randrange(10) for _ in range(n)))


def torch_rate(model, batch, steps):
    cmd = [sys.executable, os.path.join(HERE, "torch_train.py"), "--model", model, "--batch", str(batch),
           "--device", "cuda", "--steps", str(steps)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])["samples_per_sec"]


def one(args, data, model, batch):
    name = "%s-%d" % (model, batch)
    args.config = os.path.join(args.out, name + ".ini")
    with open(args.config, "w") as f:
        f.write("[model]\npreset = %s\n[data]\ndir = %s\n[optim]\nname = sgd\nlr = 0.01\nmomentum = 0.9\n"
                "[train]\nbatch = %d\nseed = 1\ncuda_graph = %s\n"
                % (model, data, batch, os.environ.get("CUDA_GRAPH", "true")))
    row, _ = gpu_ranks.measured(args, "case", name, name, 1)
    row["pytorch_rate"] = torch_rate(model, batch, args.steps)
    if "error" not in row and row["pytorch_rate"]:
        row["ratio"] = row["rate"] / row["pytorch_rate"]
    return row


def main():
    ap = gpu_ranks.arguments(__doc__, "gpu-train", config=False)
    ap.set_defaults(steps=100)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data = os.path.join(args.out, "data")
    make_data(data)
    rows = [one(args, data, m, b) for m, b in CASES]
    gpu_ranks.table(["model, batch", "dtrain samples/s:", "PyTorch eager samples/s:", "dtrain / PyTorch:",
                     "dtrain step (ms):"], rows, lambda r: r["case"],
                    lambda r: ["%.0f" % r["rate"], "%.0f" % r["pytorch_rate"] if r["pytorch_rate"] else "failed",
                               "%.2fx" % r["ratio"] if "ratio" in r else "", "%.3f" % (r["step_seconds"] * 1e3)])
    return gpu_ranks.finish(args, rows)


if __name__ == "__main__":
    sys.exit(main())
