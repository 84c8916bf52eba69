#!/usr/bin/env python3
"""PyTorch Gloo allreduce timings, in the same format as allreduce_bench --json.

    /usr/bin/python3 bench/allreduce_gloo.py --ranks 2 --min 4096 --max 268435456

Each size: warm-up, then enough in-place all_reduce(SUM) calls on a float32
tensor for ~0.25 s; the time reported is the slowest rank's mean.
"""
import argparse
import json
import os
import sys
import time


def worker(rank, args, port, q):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    results = []
    size = args.min
    while size <= args.max:
        t = torch.zeros(size // 4, dtype=torch.float32)
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        per = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)
        iters = max(3, min(20000, int(0.25 / args.repeat / max(per.item(), 1e-7))))
        e = 1e30
        for _ in range(args.repeat):  # best of `repeat` timed runs
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            el = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
            dist.all_reduce(el, op=dist.ReduceOp.MAX)
            e = min(e, el.item())
        algbw = size / e / 1e9
        results.append({"bytes": size, "time_us": e * 1e6, "algbw": algbw,
                        "busbw": algbw * 2 * (args.ranks - 1) / args.ranks, "iters": iters})
        size *= 2
    dist.destroy_process_group()
    if rank == 0:
        q.put(results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min", type=int, default=4096)
    ap.add_argument("--max", type=int, default=256 << 20)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    import torch.multiprocessing as mp

    port = 29500 + os.getpid() % 1000
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, port, q)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    res = q.get()
    for p in procs:
        p.join()
    json.dump({"impl": "gloo", "backend": "gloo", "ranks": args.ranks, "dtype": "F32",
               "results": res}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
