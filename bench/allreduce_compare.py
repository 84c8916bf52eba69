#!/usr/bin/env python3
"""Allreduce: dtrain against Open MPI and PyTorch Gloo, in one run, as ratios.

    /usr/bin/python3 bench/allreduce_compare.py --build build --ranks 2 [--json out.json]

Runs, one after the other, on the same sizes and rank count:
  dtrain   dtrun -n N -- allreduce_bench --json          (shm backend)
  mpi      mpirun -np N allreduce_bench --impl mpi --json (MPI_Allreduce itself)
  gloo     bench/allreduce_gloo.py                        (torch.distributed gloo)
  memcpy   allreduce_bench --impl memcpy                  (one core copying: the yardstick)
and prints time and bus bandwidth per size with dtrain/mpi and dtrain/gloo
ratios (> 1 means dtrain is faster). Skips a peer that is not installed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env=None):
    e = dict(os.environ)
    if env:
        e.update(env)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    if out.returncode != 0:
        print("allreduce_compare: %s failed:\n%s" % (" ".join(cmd), out.stderr), file=sys.stderr)
        return None
    return json.loads(out.stdout)


def human(b):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return "%d %s" % (b // s, unit)
    return "%d B" % b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min", default="4096")
    ap.add_argument("--max", default=str(256 << 20))
    ap.add_argument("--skip", default="", help="comma list of peers to skip: mpi,gloo")
    ap.add_argument("--repeat", type=int, default=3, help="best of R timed runs per size")
    ap.add_argument("--json", help="also write all results to this file")
    args = ap.parse_args()
    print(cpu.banner())
    skip = set(filter(None, args.skip.split(",")))
    b = os.path.abspath(args.build)
    bench = os.path.join(b, "bench", "allreduce_bench")
    dtrun = os.path.join(b, "dtrain")
    if not os.path.exists(dtrun):
        dtrun = os.path.join(b, "tests", "comm", "dtrun")
        prefix = [dtrun]
    else:
        prefix = [dtrun, "run"]
    sz = ["--min", args.min, "--max", args.max, "--repeat", str(args.repeat), "--json"]
    res = {}
    res["memcpy"] = run_json([bench, "--impl", "memcpy"] + sz)
    res["dtrain"] = run_json(prefix + ["-n", str(args.ranks), "--", bench] + sz)
    if "mpi" not in skip and shutil.which("mpirun"):
        res["mpi"] = run_json(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                               str(args.ranks), bench, "--impl", "mpi"] + sz)
    if "gloo" not in skip:
        res["gloo"] = run_json([sys.executable, os.path.join(HERE, "allreduce_gloo.py"),
                                "--ranks", str(args.ranks), "--min", args.min, "--max", args.max,
                                "--repeat", str(args.repeat)])
    res = {k: v for k, v in res.items() if v}
    if "dtrain" not in res:
        sys.exit(1)
    by = {k: {r["bytes"]: r for r in v["results"]} for k, v in res.items()}
    peers = [k for k in ("mpi", "gloo") if k in by]
    if "memcpy" in by:
        print("# memcpy (one core, same sizes) for scale: %s GB/s" % ", ".join(
            "%s %.1f" % (human(b), r["algbw"]) for b, r in sorted(by["memcpy"].items())
            if b in (4096, 1 << 20, 16 << 20, 256 << 20)))
    hdr = "%10s  %10s %8s" % ("bytes", "dtrain us", "busbw")
    for p in peers:
        hdr += "  %10s %8s %7s" % (p + " us", "busbw", "ratio")
    print("# allreduce f32 sum in place, %d ranks, best of %d runs; ratio = peer time / dtrain time"
          % (args.ranks, args.repeat))
    print(hdr)
    for nbytes, d in sorted(by["dtrain"].items()):
        line = "%10d  %10.2f %8.2f" % (nbytes, d["time_us"], d["busbw"])
        for p in peers:
            r = by[p].get(nbytes)
            if r:
                line += "  %10.2f %8.2f %6.2fx" % (r["time_us"], r["busbw"], r["time_us"] / d["time_us"])
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
