#!/usr/bin/python3
"""Gradient compression (docs/compression.md): per [compression] method, one
`dtrain train` run of a config on W local workers; prints the test accuracy
(or the GPT's validation loss) and its difference to the uncompressed run,
the bytes this rank sent (summary.json's bytes_sent) as a share of the
uncompressed run's, and the time per step as a ratio.

    /usr/bin/python3 bench/compression.py [--dtrain BUILD_DIR] [--config configs/fashion-mlp.ini]
        [--workers 4] [--methods none,fp16,...] [--steps N] [--set S.K=V]... [--json]
        [--slow-link RATE]

Without --steps the config's shipped epochs run (the Fashion-MNIST MLP:
about 20 minutes per method on 4 workers of a 2-core machine). --steps 5
only checks that everything runs. The workers share memory, so step times
are not a network's; with --slow-link RATE (root) they run instead as two
hosts of W/2 ranks each, network namespaces whose links are shaped to RATE
(e.g. 1gbit) by scripts/cluster.sh, under mpirun, where the step is
communication-bound. --torch adds PyTorch DDP on the same two hosts (Gloo,
the same MLP shape, bench/torch_ddp.py) plain and with its fp16 and PowerSGD
communication hooks, for the step times a PyTorch user would get; with the
config's epochs (no --steps) PyTorch trains Fashion-MNIST the same way (the
same batch, epochs, AdamW, warm-up and cosine schedule) and its test accuracy
is reported beside dtrain's.
"""
import argparse, configparser, json, os, signal, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
PREFIX, SUBNET = "cmp", "10.79.0"  # the pretend hosts of --slow-link
TORCH_HOOKS = ["none", "fp16", "powersgd"]
METHODS = {  # name: --set flags (the settings docs/benchmarks.md reports)
    "none": [],
    "fp16": ["compression.method=fp16"],
    "bf16": ["compression.method=bf16"],
    "int8": ["compression.method=int8"],
    "qsgd": ["compression.method=qsgd"],
    "sign": ["compression.method=sign"],
    "topk": ["compression.method=topk", "compression.ratio=0.01"],
    "randomk": ["compression.method=randomk", "compression.ratio=0.01"],
    "powersgd": ["compression.method=powersgd", "compression.rank=2"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/fashion-mlp.ini"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=0, help="max_steps (0: the config's epochs)")
    ap.add_argument("--set", action="append", default=[], help="more config overrides for every run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--slow-link", metavar="RATE",
                    help="run on two pretend hosts (scripts/cluster.sh) linked at this rate (needs root)")
    ap.add_argument("--torch", action="store_true", help="with --slow-link: PyTorch DDP and its hooks too")
    a = ap.parse_args()
    print(cpu.banner(a.json))
    if a.slow_link and a.workers % 2:
        sys.exit("--slow-link: --workers must be even (W/2 ranks on each of two hosts)")
    rows, torch_rows = [], []
    if a.slow_link:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit("compression.py: terminated"))  # still take the hosts down
        cluster("down")
        cluster("up", "2", "--bw", a.slow_link, "--subnet", SUBNET)
    try:
        run_all(a, rows, torch_rows)
    finally:
        if a.slow_link:
            cluster("down")
    report(a, rows, torch_rows)


def cluster(*args):
    return subprocess.run([CLUSTER, *args, "--prefix", PREFIX], check=True, stdout=subprocess.PIPE, text=True).stdout


def config_value(path, section, key, default):
    """One value of a dtrain config (INI; repeated keys such as layer= allowed)."""
    c = configparser.ConfigParser(strict=False, inline_comment_prefixes=(";", "#"))
    c.read(path)
    return c.get(section, key, fallback=default)


def torch_run(a, hook):
    """bench/torch_ddp.py on both pretend hosts at once; its JSON, or None when it failed.
    With --steps, that many timed steps on synthetic data; otherwise the config's
    epochs of Fashion-MNIST, with the test accuracy."""
    common = [sys.executable, os.path.join(ROOT, "bench", "torch_ddp.py"), "--model", "mlp", "--workers",
              str(a.workers), "--hook", hook, "--nnodes", "2", "--master", f"{SUBNET}.1:29531",
              "--batch", config_value(a.config, "train", "batch", "256")]
    if a.steps:
        common += ["--steps", str(a.steps)]
    else:
        common += ["--data", config_value(a.config, "data", "dir", "/usr/share/datasets/fashion-mnist"),
                   "--epochs", config_value(a.config, "train", "epochs", "15")]
    procs = [subprocess.Popen([CLUSTER, "rsh", "--prefix", PREFIX, f"{PREFIX}-h{k}",
                               # Gloo takes the address of the interface it is told, not the hostname's
                               "GLOO_SOCKET_IFNAME=eth0 " + " ".join(common + ["--node-rank", str(k)])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    try:
        outs = [p.communicate(timeout=600 if a.steps else 7200) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        print(f"note: PyTorch DDP with hook {hook} did not finish in time (a hung Gloo); left out", file=sys.stderr)
        return None
    if any(p.returncode for p in procs):
        err = (outs[0][1] + outs[1][1]).strip().splitlines()
        why = next((l for l in err if "enforce fail" in l or "Error" in l), err[-1] if err else "?")
        print(f"note: PyTorch DDP with hook {hook} failed ({why.strip()}); left out", file=sys.stderr)
        return None
    return json.loads(outs[0][0].strip().splitlines()[-1])


def run_all(a, rows, torch_rows):
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-compression-") as tmp:
        for m in a.methods.split(","):
            if m not in METHODS:
                sys.exit(f"--methods: unknown method '{m}' (expected some of {', '.join(METHODS)})")
            sets = METHODS[m] + a.set + ([f"train.max_steps={a.steps}"] if a.steps else [])
            cmd = [os.path.abspath(os.path.join(a.dtrain, "dtrain")), "train", os.path.abspath(a.config), "--quiet",
                   "--run-dir", os.path.join(tmp, m)]
            if a.slow_link:
                cmd = [CLUSTER, "mpirun", "--prefix", PREFIX, "--allow-run-as-root", "-np", str(a.workers),
                       "--map-by", f"ppr:{a.workers // 2}:node"] + cmd
            else:
                cmd += ["--workers", str(a.workers)]
            for s in sets:
                cmd += ["--set", s]
            subprocess.run(cmd, check=True)
            with open(os.path.join(tmp, m, "summary.json")) as f:
                s = json.load(f)
            rows.append({"method": m, "accuracy": s.get("test_accuracy"), "val_loss": s.get("val_loss"),
                         "bytes_sent": s["bytes_sent"], "steps": s["steps"],
                         "step_seconds": s["train_seconds"] / max(s["steps"], 1)})
    if a.torch and a.slow_link:
        for hook in TORCH_HOOKS:
            r = torch_run(a, hook) or {}
            torch_rows.append({"hook": hook, "step_seconds": r.get("step_seconds"),
                               "accuracy": r.get("test_accuracy"), "steps": r.get("steps")})


def report(a, rows, torch_rows):
    base = next((r for r in rows if r["method"] == "none"), rows[0])
    if a.json:
        print(json.dumps({"dtrain": rows, "pytorch": torch_rows}, indent=1))
        return
    link = f", two hosts over a {a.slow_link} link" if a.slow_link else ", one host"
    print(f"{os.path.basename(a.config)}, {a.workers} workers{link}, {base['steps']} steps")
    print(f"{'method':9} {'accuracy':>9} {'vs none':>8} {'bytes sent':>12} {'share':>6} {'s/step':>8} {'speed-up':>8}")
    for r in rows:
        q = r["accuracy"] if r["accuracy"] is not None else r["val_loss"]
        qb = base["accuracy"] if base["accuracy"] is not None else base["val_loss"]
        print(f"{r['method']:9} {q:9.4f} {100 * (q - qb):+7.2f}p {r['bytes_sent']:12.0f} "
              f"{r['bytes_sent'] / base['bytes_sent']:6.3f} {r['step_seconds']:8.4f} "
              f"{base['step_seconds'] / r['step_seconds']:7.2f}x")

    if torch_rows:
        print(f"PyTorch DDP, the same link: {'hook':9} {'accuracy':>9} {'s/step':>8}   dtrain's speed-up over it "
              "(PyTorch's s/step / dtrain's, the same method)")
        for t in torch_rows:
            d = next((r for r in rows if r["method"] == t["hook"]), None)
            if t["step_seconds"] is None:
                print(f"{'':28}{t['hook']:9} {'failed':>9}")
                continue
            acc = f"{t['accuracy']:9.4f}" if t["accuracy"] is not None else f"{'-':>9}"
            ratio = f"{t['step_seconds'] / d['step_seconds']:.2f}x" if d else "-"
            print(f"{'':28}{t['hook']:9} {acc} {t['step_seconds']:8.4f}   {ratio}")

if __name__ == "__main__":
    main()
