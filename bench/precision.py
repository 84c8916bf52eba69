#!/usr/bin/python3
"""Mixed precision: dtrain bf16 against dtrain fp32 and PyTorch 1.13's CPU
autocast (bf16), in one run (docs/mixed-precision.md).

Cases: the GPTs of bench/gpt.py (gpt-small at T=256, B=8; gpt2-124m at
T=64, B=4) and the CNN of bench/train.py (batch 64), full training steps;
then the GEMMs of bench_gemm in fp32 and bf16, whose best bf16 figure (a
large square GEMM, the operands' conversion included) is taken as the
measured peak the GPTs' large GEMMs are quoted against. PyTorch runs under
every environment of bench/gpt.py's TORCH_ENVS and keeps its best.

    /usr/bin/python3 bench/precision.py [--dtrain BUILD_DIR] [--threads 2]
        [--cases gpt-small,gpt2-124m,cnn] [--steps N] [--repeat N] [--json]

--steps 2 --repeat 1 is a quick check; real figures need a quiet machine.
"""
import argparse, json, os, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
from gpt import CASES, DTRAIN_ENVS, TORCH_ENVS  # noqa: E402
from train import best  # noqa: E402


def cpu_model():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    name = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "?")
    family = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("cpu family")), "?")
    flags = [x for x in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if " %s" % x in info]
    return "%s (family %s; %s)" % (name, family, " ".join(flags))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build", help="build directory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default="gpt-small,gpt2-124m,cnn")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    print(cpu.banner(a.json), flush=True)
    t = str(a.threads)
    print("CPU: %s, %s threads" % (cpu_model(), t))
    out = []
    for case in a.cases.split(","):
        if case == "cnn":
            steps = str(a.steps or 30)
            common = ["--model", "cnn", "--threads", t, "--steps", steps]
            key, cmd_d = "samples_per_sec", [os.path.join(a.dtrain, "bench", "bench_train"), *common, "--json"]
            cmd_t = [sys.executable, os.path.join(HERE, "torch_train.py"), *common]
        else:
            preset, B, T, steps = CASES[case]
            common = ["--preset", preset, "--batch", str(B), "--seq", str(T), "--threads", t,
                      "--steps", str(a.steps or steps), "--warmup", "1" if a.steps else "2"]
            key, cmd_d = "tokens_per_sec", [os.path.join(a.dtrain, "bench", "bench_gpt"), *common, "--json"]
            cmd_t = [sys.executable, os.path.join(HERE, "torch_gpt.py"), *common]
        d32 = best(cmd_d + ["--precision", "fp32"], DTRAIN_ENVS, a.repeat, key)
        d16 = best(cmd_d + ["--precision", "bf16"], DTRAIN_ENVS, a.repeat, key)
        p16 = best(cmd_t + ["--autocast"], TORCH_ENVS, a.repeat, key)
        row = {"case": case, "unit": key, "dtrain_fp32": d32[key], "dtrain_bf16": d16[key], "torch_autocast_bf16": p16[key],
               "bf16_vs_fp32": round(d16[key] / d32[key], 2), "bf16_vs_torch_autocast": round(d16[key] / p16[key], 2),
               "torch_env": p16.get("env")}
        out.append(row)
        print("%-10s %s: dtrain fp32 %.0f, dtrain bf16 %.0f (x%.2f), torch autocast bf16 %.0f [%s] -> dtrain bf16 x%.2f" %
              (case, key, d32[key], d16[key], row["bf16_vs_fp32"], p16[key], p16.get("env"), row["bf16_vs_torch_autocast"]))
    gemm = {}
    for prec in ("fp32", "bf16"):
        r = subprocess.run([os.path.join(a.dtrain, "bench", "bench_gemm"), "--threads", t, "--precision", prec, "--json"],
                           capture_output=True, text=True, check=True)
        for line in r.stdout.splitlines():
            o = json.loads(line)
            if o["impl"] == "onednn":
                gemm[(o["shape"], prec)] = o["gflops"]
    peak = max(gemm[(s, "bf16")] for s, p in gemm if p == "bf16" and s.startswith("square"))
    print("GEMM GFLOPS (%s threads): fp32 / bf16; bf16 peak measured %.0f (best square)" % (t, peak))
    for (s, p), g in sorted(gemm.items()):
        if p == "bf16":
            print("  %-34s %7.1f / %7.1f  (%3.0f%% of the bf16 peak)" % (s, gemm[(s, "fp32")], g, 100 * g / peak))
            out.append({"gemm": s, "fp32_gflops": gemm[(s, "fp32")], "bf16_gflops": g, "of_peak": round(g / peak, 3)})
    if a.json:
        for o in out:
            print(json.dumps(o))


if __name__ == "__main__":
    main()
