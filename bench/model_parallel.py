#!/usr/bin/python3
"""Model parallelism on two cores: tensor and pipeline parallel against data
parallel and one process, and each pipeline schedule's bubble against its
formula (docs/model-parallel.md).

The GPT (default gpt-small: L6 C384 H6, batch 8 x 256 tokens, AdamW, random
tokens as bench/dp.py writes them) trains --steps steps in each layout, one
thread a worker so that every layout uses the same two cores:

    one process x 1 thread, one process x 2 threads
    data = 2
    tensor = 2, with and without sequence parallelism
    pipeline = 2, M = 8: gpipe, 1f1b, interleaved (V = 2)

From summary.json: tokens/s (steps after the first). From each stage's
"schedule" records in the metrics logs (the step's forwards and backwards as
they ran, every --log-every steps): each stage's idle share of the step
(first forward to last backward of all stages), beside the model
(P-1)/(M+P-1), (P-1)/(V M+P-1) interleaved. And the step time against a
model of it: the one-process 1-thread step's compute divided over the
ranks, stretched by the formula's bubble for a pipeline, plus the measured
gradient communication.

    /usr/bin/python3 bench/model_parallel.py [--dtrain BUILD_DIR] [--steps N]
        [--preset gpt-small] [--json] [--only TEXT]

--only runs the layouts whose name contains TEXT (and the one-process,
one-thread run the model needs); the PyTorch peer runs with a pipeline.

The peer: PyTorch 1.13's GPipe (torch.distributed.pipeline.sync.Pipe,
bench/torch_pipe.py) on the same model cut in two, M = 8 chunks, one
process x 2 threads (it pipelines over one process's devices; on a CPU both
partitions are on the one "cpu" device), against dtrain's pipeline = 2 at
M = 8 in each schedule (gpipe is Pipe's).
"""
import argparse, glob, json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
import gpt  # noqa: E402
from dp import GPT_INI, write_tokens  # noqa: E402

LAYOUTS = [  # name, workers, threads, --set options
    ("one process x 1 thread", 1, 1, []),
    ("one process x 2 threads", 1, 2, []),
    ("data = 2", 2, 1, []),
    ("tensor = 2", 2, 1, ["parallel.tensor=2"]),
    ("tensor = 2, sequence parallel", 2, 1, ["parallel.tensor=2", "parallel.sequence=true"]),
    ("pipeline = 2, gpipe, M = 8", 2, 1, ["parallel.pipeline=2", "parallel.micro_batches=8", "parallel.schedule=gpipe"]),
    ("pipeline = 2, 1f1b, M = 8", 2, 1, ["parallel.pipeline=2", "parallel.micro_batches=8", "parallel.schedule=1f1b"]),
    ("pipeline = 2, interleaved V = 2, M = 8", 2, 1,
     ["parallel.pipeline=2", "parallel.micro_batches=8", "parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
]


def idle_shares(run):
    """Each stage's idle share in every logged step, averaged over the steps
    (replica 0, tensor rank 0), and the formula."""
    recs = {}
    for path in glob.glob(os.path.join(run, "metrics", "rank-*.jsonl")):
        with open(path) as f:
            for line in f:
                j = json.loads(line)
                if j["type"] == "schedule" and j["tensor"] == 0 and j["replica"] == 0 and j["step"] > 1:
                    recs.setdefault(j["step"], {})[j["stage"]] = j
    if not recs or next(iter(next(iter(recs.values())).values()))["stages"] < 2:
        return None, None
    shares = {}
    for step, stages in recs.items():
        lo = min(s[3] for r in stages.values() for s in r["spans"])
        hi = max(s[4] for r in stages.values() for s in r["spans"])
        for st, r in stages.items():
            busy = sum(s[4] - s[3] for s in r["spans"])
            shares.setdefault(st, []).append(1 - busy / (hi - lo))
    r = next(iter(next(iter(recs.values())).values()))
    P, V, M = r["stages"], r["virtual_stages"], r["micro_batches"]
    return {st: sum(v) / len(v) for st, v in sorted(shares.items())}, (P - 1) / (V * M + P - 1)


def run(build, ini, workers, threads, steps, sets, log_every):
    with tempfile.TemporaryDirectory() as d:
        cmd = [os.path.join(build, "dtrain"), "train", ini, "--workers", str(workers), "--quiet",
               "--run-dir", os.path.join(d, "run")]
        for s in [f"train.threads={threads}", f"train.max_steps={steps}", f"train.log_every={log_every}", *sets]:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, capture_output=True)
        with open(os.path.join(d, "run", "summary.json")) as f:
            s = json.load(f)
        idle, model = idle_shares(os.path.join(d, "run"))
    return s, idle, model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--preset", default="gpt-small")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    print(cpu.banner(a.json), flush=True)
    preset, batch, seq, _ = gpt.CASES[a.preset]
    with tempfile.TemporaryDirectory() as d:
        tokens, ini = os.path.join(d, "tokens.bin"), os.path.join(d, "gpt.ini")
        write_tokens(tokens, 1 << 16, 256)
        with open(ini, "w") as f:
            f.write(GPT_INI.format(preset=preset, tokens=tokens, batch=batch, seq=seq))
        rows, base = [], None
        for i, (name, w, t, sets) in enumerate(LAYOUTS):
            if i > 0 and a.only not in name:
                continue
            s, idle, formula = run(a.dtrain, ini, w, t, a.steps, sets, 1)
            step = batch * seq / s["tokens_per_sec"]
            comm = s["comm_exposed_seconds"] / max(s["steps"], 1)
            if base is None:
                base = step  # one process, 1 thread: the compute of a step
            ranks = w
            model = None
            if ranks > 1:
                model = base / ranks / (1 - (formula or 0)) + comm
            r = {"layout": name, "workers": w, "threads": t, "tokens_per_sec": round(s["tokens_per_sec"], 1),
                 "step_ms": round(step * 1e3, 1), "model_step_ms": None if model is None else round(model * 1e3, 1),
                 "comm_exposed_ms": round(comm * 1e3, 2),
                 "idle": None if idle is None else {k: round(v, 3) for k, v in idle.items()},
                 "bubble_formula": None if formula is None else round(formula, 3)}
            rows.append(r)
            if a.json:
                print(json.dumps(r), flush=True)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    if not any(r["layout"].startswith("pipeline") for r in rows):
        out = subprocess.CompletedProcess([], 1, "", "no pipeline layout run")
    else:
        out = subprocess.run([sys.executable, os.path.join(HERE, "torch_pipe.py"), "--preset", a.preset, "--batch",
                              str(batch), "--seq", str(seq), "--chunks", "8", "--threads", "2",
                              "--steps", str(max(a.steps // 2, 2))], capture_output=True, text=True, env=env)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    pipe = json.loads(lines[-1]) if out.returncode == 0 and lines else None
    if pipe is None and out.args:  # the peer failed: reported, our rows still printed
        err = (out.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"PyTorch Pipe failed (exit {out.returncode}): {err}", file=sys.stderr)
    ours = [r for r in rows if r["layout"].startswith("pipeline")] if pipe else []
    if a.json and pipe:
        print(json.dumps(pipe))
        for r in ours:
            print(json.dumps({"layout": r["layout"], "vs_torch_pipe": round(r["tokens_per_sec"] / pipe["tokens_per_sec"], 3)}))
    if not a.json:
        print(f"{a.preset}, batch {batch} x {seq} tokens, {a.steps} steps")
        print(f"{'layout':40} {'tokens/s':>9} {'step ms':>8} {'model ms':>9} {'measured/model':>15} "
              f"{'idle per stage':>16} {'formula':>8}")
        for r in rows:
            m = r["model_step_ms"]
            ratio = f"{r['step_ms'] / m:.2f}" if m else "-"
            idle = " ".join(f"{v:.0%}" for v in r["idle"].values()) if r["idle"] else "-"
            fo = f"{r['bubble_formula']:.0%}" if r["bubble_formula"] is not None else "-"
            print(f"{r['layout']:40} {r['tokens_per_sec']:9.0f} {r['step_ms']:8.1f} {m or 0:9.1f} {ratio:>15} "
                  f"{idle:>16} {fo:>8}")
        if pipe:
            print(f"{'PyTorch Pipe, 2 partitions, M = 8, 2 threads':40} {pipe['tokens_per_sec']:9.0f} "
                  f"{pipe['ms_per_step']:8.1f}   (devices {', '.join(pipe['devices'])})")
        for r in ours:
            print(f"dtrain {r['layout']} / PyTorch Pipe: {r['tokens_per_sec'] / pipe['tokens_per_sec']:.2f}")


if __name__ == "__main__":
    main()
