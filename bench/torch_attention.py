#!/usr/bin/python3
"""PyTorch's causal attention alone at GPT-2 124M's layer (B 16, T 1024,
12 heads of 64), the peer of `test_gpu bench-attention` (dtrain's fused
attention; tests/gpu/run.sh's attention stage): scaled_dot_product_attention
with is_causal (flash attention where PyTorch has it for the type) in bf16,
and in fp32 (TF32 off), forward and forward + backward, milliseconds a call
after warm-up, timed by CUDA events over 10 calls. Prints one JSON object."""
import argparse, json
import torch
import torch.nn.functional as F


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {"B": a.batch, "T": a.seq, "NH": a.heads, "hs": a.head_size, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0)}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        q, k, v = (torch.randn(a.batch, a.heads, a.seq, a.head_size, device="cuda", dtype=dtype, requires_grad=True)
                   for _ in range(3))
        dy = torch.randn_like(q)
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        both = lambda: torch.autograd.grad(fwd(), (q, k, v), dy)
        f = timed(fwd, a.reps)
        out[name + "_forward_ms"] = round(f, 3)
        out[name + "_backward_ms"] = round(timed(both, a.reps) - f, 3)  # (forward + backward, less the forward)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
