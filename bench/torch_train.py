#!/usr/bin/python3
"""PyTorch side of bench/train.py: the same models, batch, threads and SGD
step as bench_train, on synthetic data. Prints one JSON object.

Run with the settings that make PyTorch fastest on this machine (train.py
sets them): OPENBLAS_CORETYPE=SkylakeX and OMP_WAIT_POLICY=passive.
"""
import argparse, json, time
import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet18(w):
    """torchvision's ResNet-18 for 28x28 single-channel inputs, as dtrain's
    preset: a 3x3 stride-1 stem, no max pooling, stages of w, 2w, 4w, 8w."""
    layers = [nn.Conv2d(1, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
    cin = w
    for k, s in ((1, 1), (2, 2), (4, 2), (8, 2)):
        layers += [BasicBlock(cin, k * w, s), BasicBlock(k * w, k * w)]
        cin = k * w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))


def make(model, width=16):
    if model == "resnet18":
        return resnet18(width)
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
    ap.add_argument("--width", type=int, default=16, help="resnet18: the first stage's channels")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (bench/gpu_train.py)")
    a = ap.parse_args()
    cnn = a.model in ("cnn", "resnet18")
    batch = a.batch or (64 if cnn else 256)
    steps = a.steps or (20 if a.model == "resnet18" else 60 if cnn else 200)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    m = make(a.model, a.width).to(a.device)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 1, 28, 28, device=a.device)
    y = torch.randint(0, 10, (batch,), device=a.device)
    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    lossf = nn.CrossEntropyLoss()
    warm = steps // 5 + 2
    for s in range(warm + steps):
        if s == warm:
            sync()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=a.autocast):
            loss = lossf(m(x).float(), y)
        loss.backward()
        opt.step()
    sync()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "version": torch.__version__, "model": a.model,
                      "batch": batch, "threads": a.threads, "device": a.device, "steps": steps,
                      "precision": "autocast-bf16" if a.autocast else "fp32",
                      "samples_per_sec": round(steps * batch / dt, 1),
                      "ms_per_step": round(1e3 * dt / steps, 3)}))


if __name__ == "__main__":
    main()
