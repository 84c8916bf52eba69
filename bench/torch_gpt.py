#!/usr/bin/python3
"""PyTorch side of bench/gpt.py: the same GPT-2 (pre-LN, GELU tanh, tied
head, no dropout, no bias-free variants), sizes, batch, threads and AdamW
step as bench_gpt, on random tokens. Prints one JSON object.

gpt.py runs it under the environments that make PyTorch fastest here
(OPENBLAS_CORETYPE=SkylakeX for Debian's OpenBLAS, OMP_WAIT_POLICY=passive).
On a GPU (--device cuda, tests/gpu/run.sh's bench stage) it is the peer of
docs/gpu.md: bf16 autocast (--autocast), fused AdamW, scaled_dot_product_
attention, TF32 matmuls for fp32 (--tf32), torch.compile (--compile).
"""
import argparse, json, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # L, NH, C, block_size, vocab
    "gpt-tiny": (2, 4, 64, 256, 256),
    "gpt-small": (6, 6, 384, 256, 256),
    "gpt2-124m": (12, 12, 768, 1024, 50257),
}


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, maxT, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # GPT-2's initialisation, as dt_gpt_init: normal(0, 0.02), residual
        # projections 0.02/sqrt(2L), biases 0 (layernorm keeps 1/0).
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make(preset, batch, seq, vocab=0, device="cpu"):
    """The model of `preset` (vocabulary `vocab` if not 0), its AdamW step
    (bench_gpt's; fused on a GPU) and a batch of random tokens: (model,
    optimizer, x, y)."""
    L, NH, C, maxT, V = PRESETS[preset]
    V = vocab or V
    m = GPT(L, NH, C, maxT, V).to(device)
    fused = {"fused": True} if device != "cpu" else {}
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, **fused)
    x = torch.randint(0, V, (batch, seq), device=device)
    y = torch.randint(0, V, (batch, seq), device=device)
    return m, opt, x, y


def run(a, f, opt, x, y, sync, dev, n):
    """n steps, the last a.steps timed (all of them if fewer): (loss, seconds)."""
    t0 = time.perf_counter()
    for s in range(n):
        if s == n - a.steps:
            sync()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=a.autocast):
            loss = f(x, y)
        loss.backward()
        opt.step()
    sync()
    return loss, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt-small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--autocast", action="store_true", help="autocast in bf16 (bench/precision.py; docs/gpu.md)")
    ap.add_argument("--tf32", action="store_true", help="fp32 matmuls on TF32 tensor cores (a GPU)")
    ap.add_argument("--compile", action="store_true", help="torch.compile, default mode")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.tf32:
        torch.set_float32_matmul_precision("high")
    m, opt, x, y = make(a.preset, a.batch, a.seq, a.vocab, a.device)
    V = a.vocab or PRESETS[a.preset][4]
    f = torch.compile(m) if a.compile and hasattr(torch, "compile") else m
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    dev = "cuda" if a.device.startswith("cuda") else "cpu"
    try:
        run(a, f, opt, x, y, sync, dev, 1)  # (compiles here when --compile)
    except Exception as e:  # torch.compile may lack a compiler where it runs: said, not failed
        if not a.compile:
            raise
        print(json.dumps({"impl": "pytorch", "version": torch.__version__, "preset": a.preset, "compile":
                          "unavailable: %s" % str(e).splitlines()[0][:200]}))
        return
    if a.compile and f is m:
        print(json.dumps({"impl": "pytorch", "version": torch.__version__, "preset": a.preset,
                          "compile": "unavailable: torch %s has no torch.compile" % torch.__version__}))
        return
    loss, dt = run(a, f, opt, x, y, sync, dev, a.warmup + a.steps)
    mem = torch.cuda.max_memory_allocated() if dev == "cuda" else 0
    print(json.dumps({"impl": "pytorch", "version": torch.__version__, "preset": a.preset, "device": a.device,
                      "batch": a.batch, "seq": a.seq, "vocab": V, "threads": a.threads, "steps": a.steps,
                      "precision": "autocast-bf16" if a.autocast else "tf32" if a.tf32 else "fp32",
                      "compile": a.compile, "params": sum(p.numel() for p in m.parameters()),
                      "loss": round(loss.item(), 4),
                      "tokens_per_sec": round(a.steps * a.batch * a.seq / dt, 1),
                      "ms_per_step": round(1e3 * dt / a.steps, 2), "max_memory_allocated": mem}))


if __name__ == "__main__":
    main()
