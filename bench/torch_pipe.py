#!/usr/bin/python3
"""PyTorch side of bench/model_parallel.py: the GPT of bench/torch_gpt.py in
PyTorch 1.13's GPipe, torch.distributed.pipeline.sync.Pipe, cut into two
partitions (embedding and the first half of the blocks; the rest, the final
layernorm and the tied head) with --chunks micro-batches, the AdamW step of
torch_gpt.py, random tokens. Pipe pipelines over the devices of one process;
on a CPU both partitions are on the one "cpu" device, which is how a PyTorch
user without GPUs would run it. Prints one JSON object.
"""
import argparse, json, os, time
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import rpc
from torch.distributed.pipeline.sync import Pipe

from torch_gpt import make


class Embed(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.wte, self.wpe = m.wte, m.wpe

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.size(1)))


class Head(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.ln_f, self.lm_head = m.ln_f, m.lm_head

    def forward(self, x):
        return self.lm_head(self.ln_f(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt-small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29561")
    rpc.init_rpc("w0", rank=0, world_size=1)
    m, opt, x, y = make(a.preset, a.batch, a.seq)
    half = len(m.h) // 2
    seq = nn.Sequential(nn.Sequential(Embed(m), *m.h[:half]), nn.Sequential(*m.h[half:], Head(m)))
    pipe = Pipe(seq, chunks=a.chunks)
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = pipe(x).local_value()
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch-pipe", "version": torch.__version__, "preset": a.preset, "batch": a.batch,
                      "seq": a.seq, "chunks": a.chunks, "threads": a.threads, "steps": a.steps,
                      "devices": [str(d) for d in pipe.devices], "loss": round(loss.item(), 4),
                      "tokens_per_sec": round(a.steps * a.batch * a.seq / dt, 1),
                      "ms_per_step": round(1e3 * dt / a.steps, 2)}))
    rpc.shutdown()


if __name__ == "__main__":
    main()
