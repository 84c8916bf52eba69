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
--workers / H processes, ranks K*W/H...). Prints one JSON object (rank 0)."""
import argparse, json, os, socket, sys, time

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
    a = ap.parse_args()
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
