#!/usr/bin/python3
"""PyTorch DistributedDataParallel (Gloo) side of bench/dp.py: W processes x
T threads, a global batch split evenly. The classifiers are torch_train.py's
with its SGD-momentum step; a GPT preset (gpt-small, ...) is torch_gpt.py's
model with its AdamW step on random tokens. With --zero the optimizer is
wrapped in ZeroRedundancyOptimizer (PyTorch's ZeRO stage 1: each rank
updates its share of the parameters, which are then broadcast), the side
of bench/zero.py. --hook fp16|powersgd registers DDP's communication hook of
that name (PyTorch's gradient compression: fp16_compress_hook, powerSGD_hook
at --powersgd-rank), the peer of bench/compression.py. With Debian's
PyTorch 1.13 and its Gloo, powerSGD_hook aborts the process ("enforce fail
at gloo/transport/tcp/pair.cc: op.preamble.length <= op.nbytes", also with
one bucket or a static graph) and batched_powerSGD_hook fails an assertion
in its _orthogonalize: compression.py reports it as a peer that crashed. Across hosts, one
launch per host: --nnodes H --node-rank K --master ADDR:PORT (each host runs
--workers / H processes, ranks K*W/H...). With --data DIR (the MLP or the
CNN) it trains on Fashion-MNIST instead, as configs/fashion-mlp.ini does:
--epochs passes over the 60000 images in a seeded random order, each rank
its contiguous share of every global batch (the last, partial batch too),
the images scaled as dtrain does ((x / 255 - 0.2860) / 0.3530), AdamW (lr
0.001, weight decay 0.01) with 100 warm-up steps and a cosine decay to 0,
then the test accuracy on the 10000 test images, beside the time per
step (the steps alone, not the loading or the evaluation). Prints one JSON
object (rank 0)."""
import argparse, gzip, json, math, os, socket, sys, time

import numpy as np

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402
from torch_train import make  # noqa: E402


def job(a, b):
    """The model, its optimizer and the loss of one step on this rank's b
    samples, given the (possibly DDP-wrapped) model."""
    if a.model in torch_gpt.PRESETS:
        m, opt, x, y = torch_gpt.make(a.model, b, a.seq)
        return m, opt, lambda net: net(x, y)
    m = make(a.model)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(b, 1, 28, 28)
    y = torch.randint(0, 10, (b,))
    lossf = nn.CrossEntropyLoss()
    return m, opt, lambda net: lossf(net(x), y)


def idx(path):
    """An idx file (gzip'd or not) as a numpy array."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        b = f.read()
    nd = b[3]
    dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(b, np.uint8, offset=4 + 4 * nd).reshape(dims)


def fashion(d, kind):
    """Fashion-MNIST's images (N x 1 x 28 x 28, scaled as dtrain's) and labels."""
    def find(stem):
        return next(os.path.join(d, stem + e) for e in ("", ".gz") if os.path.exists(os.path.join(d, stem + e)))
    x = idx(find(f"{kind}-images-idx3-ubyte")).astype(np.float32)
    y = idx(find(f"{kind}-labels-idx1-ubyte")).astype(np.int64)
    x = (x / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(y)


def train_fashion(a, rank, ddp, m):
    """--data: trains on Fashion-MNIST; the time per step and the test accuracy."""
    x, y = fashion(a.data, "train")
    n, B, W = len(y), a.batch, a.workers
    spe = (n + B - 1) // B
    total = spe * a.epochs
    opt = torch.optim.AdamW(m.parameters(), lr=0.001, weight_decay=0.01)
    warm = 100
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / (total - warm)))))
    lossf = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    spent = 0.0
    for e in range(a.epochs):
        order = torch.randperm(n, generator=g)
        for s in range(spe):
            batch = order[s * B:min(n, (s + 1) * B)]
            lo, hi = len(batch) * rank // W, len(batch) * (rank + 1) // W
            xb, yb = x[batch[lo:hi]], y[batch[lo:hi]]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            # the mean over the rank's share; DDP averages the ranks' means
            lossf(ddp(xb), yb).backward()
            opt.step()
            sched.step()
            spent += time.perf_counter() - t0
    m.eval()
    xt, yt = fashion(a.data, "t10k")
    with torch.no_grad():
        right = sum(int((m(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum()) for i in range(0, len(yt), 1000))
    return spent / total, total, right / len(yt)


def worker(local, a, master, q):
    rank = a.node_rank * (a.workers // a.nnodes) + local
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=a.workers)
    torch.manual_seed(1)
    m, opt, loss = job(a, a.batch // a.workers)
    if a.zero:  # the same optimizer and settings, sharded
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=type(opt), **opt.defaults)
    ddp = nn.parallel.DistributedDataParallel(m) if a.workers > 1 else m
    if a.hook == "fp16" and a.workers > 1:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif a.hook == "powersgd" and a.workers > 1:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd_rank,
                                         start_powerSGD_iter=2)
        ddp.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
    if a.data:
        step_s, steps, acc = train_fashion(a, rank, ddp, m)
        if rank == 0:
            q.put({"impl": "pytorch-ddp", "version": torch.__version__, "model": a.model, "batch": a.batch,
                   "hook": a.hook, "workers": a.workers, "threads": a.threads, "epochs": a.epochs, "steps": steps,
                   "step_seconds": step_s, "test_accuracy": acc})
        dist.destroy_process_group()
        return
    warm = a.steps // 5 + 2
    for s in range(warm + a.steps):
        if s == warm:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss(ddp).backward()
        opt.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        r = {"impl": "pytorch-zero1" if a.zero else "pytorch-ddp", "version": torch.__version__, "model": a.model, "batch": a.batch,
             "hook": a.hook, "step_seconds": dt / a.steps,
             "workers": a.workers, "threads": a.threads, "steps": a.steps,
             "samples_per_sec": round(a.steps * a.batch / dt, 1)}
        if a.model in torch_gpt.PRESETS:
            r.update(seq=a.seq, tokens_per_sec=round(a.steps * a.batch * a.seq / dt, 1))
        q.put(r)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", help="mlp, cnn or a GPT preset of torch_gpt.py")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=256, help="GPT: tokens per sequence")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer around the optimizer")
    ap.add_argument("--hook", default="none", choices=["none", "fp16", "powersgd"], help="DDP communication hook")
    ap.add_argument("--powersgd-rank", type=int, default=2)
    ap.add_argument("--nnodes", type=int, default=1, help="hosts, each running --workers / H processes")
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--master", help="ADDR:PORT of rank 0 (default: a free port here)")
    ap.add_argument("--data", help="train on Fashion-MNIST from this directory (mlp, cnn)")
    ap.add_argument("--epochs", type=int, default=15, help="with --data")
    a = ap.parse_args()
    if a.data and a.model not in ("mlp", "cnn"):
        sys.exit("torch_ddp.py: --data trains the mlp or the cnn")
    if a.workers % a.nnodes or not 0 <= a.node_rank < a.nnodes:
        sys.exit("torch_ddp.py: --workers must divide into --nnodes hosts, and --node-rank be one of them")
    a.batch = a.batch or {"mlp": 256, "cnn": 64}.get(a.model, 8)
    a.steps = a.steps or {"mlp": 200, "cnn": 60}.get(a.model, 8)
    master = a.master
    if not master:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            master = "127.0.0.1:%d" % s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(a, master, q), nprocs=a.workers // a.nnodes, join=True)
    if a.node_rank == 0:
        print(json.dumps(q.get()))


if __name__ == "__main__":
    main()
