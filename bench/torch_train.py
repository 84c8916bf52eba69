#!/usr/bin/python3
"""PyTorch side of bench/train.py: the same models, batch, threads and SGD
step as bench_train, on synthetic data. Prints one JSON object.

Run with the settings that make PyTorch fastest on this machine (train.py
sets them): OPENBLAS_CORETYPE=SkylakeX and OMP_WAIT_POLICY=passive.
"""
import argparse, json, time
import torch
import torch.nn as nn


def make(model):
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 1024), nn.ReLU(), nn.Dropout(0.4),
                         nn.Linear(1024, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--autocast", action="store_true", help="CPU autocast in bf16 (bench/precision.py)")
    ap.add_argument("--steps", type=int, default=0)
    a = ap.parse_args()
    cnn = a.model == "cnn"
    batch = a.batch or (64 if cnn else 256)
    steps = a.steps or (60 if cnn else 200)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    m = make(a.model)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    lossf = nn.CrossEntropyLoss()
    warm = steps // 5 + 2
    for s in range(warm + steps):
        if s == warm:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=a.autocast):
            loss = lossf(m(x).float(), y)
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "version": torch.__version__, "model": a.model,
                      "batch": batch, "threads": a.threads, "steps": steps,
                      "precision": "autocast-bf16" if a.autocast else "fp32",
                      "samples_per_sec": round(steps * batch / dt, 1),
                      "ms_per_step": round(1e3 * dt / steps, 3)}))


if __name__ == "__main__":
    main()
