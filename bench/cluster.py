#!/usr/bin/env python3
"""Across pretend hosts (scripts/cluster.sh): allreduce and training step time.

    /usr/bin/python3 bench/cluster.py --build build [--hosts 2,4] [--bw 1gbit,10gbit]
        [--ranks-per-host 1] [--json out.json] [--force] [--prefix P --subnet A.B.C]

For every (hosts, link) pair it brings up that many network-namespace hosts
with links shaped to the rate (tc tbf, both directions), then, in one run:
  link     allreduce_bench --impl shift                   (each host streams to the next
                                                          while the previous streams to it:
                                                          the links' measured rate at the
                                                          largest size, latency at 8 bytes)
  hier     mpirun allreduce_bench                         (dtrain's auto choice)
  ring     DTRAIN_COMM_BACKEND=mpi DTRAIN_COMM_ALGO=ring   (dtrain flat ring over MPI)
  mpi      allreduce_bench --impl mpi                     (Open MPI's MPI_Allreduce)
from 1 MiB to 64 MiB, and a data-parallel training run of --train-config
(default configs/gpt-fortunes.ini with --preset gpt-small on the fortune
cookies, --steps steps) on 1 host and on H hosts: the median step time
(rank 0, after two warm-up steps) and scaling efficiency = the 1-host step /
(H x the H-host step), the global batch being the same. Prints time, busbw (GB/s), busbw as a share of the link, and the
ratios hier/mpi and hier/ring (> 1: hier is faster). The simulator is
validated on the same runs: given the links' measured rate and latency
(`dtrain simulate --link RATE,LATENCY`), `dtrain simulate --allreduce`
predicts each size's hier allreduce time and `dtrain simulate` on the
1-host run (the profile) the H-host step time; both are printed next to
the measured ones with the error (and, for reference, the allreduce at the
link's nominal rate). The pretend hosts share this machine's cores, so each
computes slower on H hosts than alone: the step is predicted again with the
profile's compute scaled by that slowdown, measured on the forward pass
(which carries no communication; `dtrain simulate --compute-scale`). Refuses to run on a busy machine (load average >=
1.5) unless --force; prints the load average before each host count. Needs
root.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpu  # noqa: E402
from allreduce_compare import human, run_json  # noqa: E402

CLUSTER = os.path.join(HERE, "..", "scripts", "cluster.sh")
PREFIX = "bench"
SUBNET = "10.77.250"


def cluster(*args):
    return subprocess.run([CLUSTER] + list(args) + ["--prefix", cluster.prefix], check=True,
                          stdout=subprocess.PIPE, text=True).stdout


cluster.prefix = PREFIX


def measured_link(shift_small, shift_large):
    """`dtrain simulate --link` from allreduce_bench --impl shift: the rate at the
    largest size (after the latency), the latency = the time at the smallest."""
    lat = shift_small["results"][0]["time_us"]
    top = max(shift_large["results"], key=lambda r: r["bytes"])
    rate = top["bytes"] / max(1e-9, top["time_us"] - lat) * 1e6  # bytes/s
    return "%.1fmbit,%.0fus" % (rate * 8 / 1e6, lat), rate, lat


def rate_gbit(bw):
    v = bw.lower()
    for suffix, m in (("gbit", 1.0), ("mbit", 1e-3)):
        if v.endswith(suffix):
            return float(v[: -len(suffix)]) * m
    raise SystemExit("--bw %s: expected a rate such as 1gbit or 500mbit" % bw)


def train(build, mpiargs, np, per_host, args, sets, run_dir):
    cmd = (["mpirun"] + mpiargs + ["-np", str(np), "--map-by", "ppr:%d:node" % per_host,
                                   os.path.join(build, "dtrain"), "train", args.train_config, "-q",
                                   "--set", "train.max_steps=%d" % args.steps, "--run-dir", run_dir])
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("cluster.py: %s failed:\n%s" % (" ".join(cmd), p.stderr))
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def medians(run_dir):
    """Rank 0's median step, and forward and backward per sample of its batch,
    in ms, after two warm-up steps (as dtrain simulate reads its profile)."""
    with open(os.path.join(run_dir, "metrics", "rank-00000.jsonl")) as f:
        steps = [json.loads(line) for line in f if '"type":"step"' in line.replace(" ", "")]
    steps = [d for d in steps if d["step"] > 2] or steps

    def med(key, per=lambda d: 1):
        v = sorted(d[key] / per(d) for d in steps)
        return 1000 * v[len(v) // 2]
    share = lambda d: d.get("share") or d["samples"]  # noqa: E731
    return med("step_seconds"), med("forward_seconds", share), med("backward_seconds", share)


def simulate(build, profile_dir, H, R, link, scale=1.0):
    """The step time dtrain simulate predicts for H hosts, in ms (link: RATE,LATENCY)."""
    out = subprocess.run([os.path.join(build, "dtrain"), "simulate", profile_dir, "--hosts", "1,%d" % H,
                          "--ranks-per-host", str(R), "--link", link, "--compute-scale", "%.4f" % scale],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 10 and f[0] == str(H) and f[1] == str(H * R):
            return float(f[7])
    raise SystemExit("cluster.py: no %d-host row in dtrain simulate's output:\n%s" % (H, out))


def simulate_allreduce(build, sizes, H, R, link):
    """{bytes: microseconds} of one allreduce as dtrain simulate's model has it."""
    out = subprocess.run([os.path.join(build, "dtrain"), "simulate", "--allreduce", ",".join(map(str, sizes)),
                          "--hosts", str(H), "--ranks-per-host", str(R), "--link", link],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return {int(f[2]): float(f[3]) for f in (line.split() for line in out.splitlines()[1:]) if len(f) == 6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--bw", default="1gbit,10gbit")
    ap.add_argument("--ranks-per-host", type=int, default=1)
    ap.add_argument("--min", default=str(1 << 20))
    ap.add_argument("--max", default=str(64 << 20))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--train-config", default=os.path.join(HERE, "..", "configs", "gpt-fortunes.ini"))
    ap.add_argument("--preset", default="gpt-small", help="[model] preset for the training run ('' keeps the config's)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--latency", default="30us",
                    help="the one-way latency the simulator assumes at the links' nominal rate (reference column)")
    ap.add_argument("--prefix", default=PREFIX, help="cluster.sh --prefix of the pretend cluster")
    ap.add_argument("--subnet", default=SUBNET, help="cluster.sh --subnet of the pretend cluster")
    ap.add_argument("--json", help="also write all results to this file")
    ap.add_argument("--force", action="store_true", help="run even when the machine is busy")
    ap.add_argument("--cpus", default="fair",
                    help="cores each host may use (cluster.sh up --cpus): 'fair' = this machine's cores over the "
                         "largest number of hosts, so every host count runs on the same share a host; 'all': no limit")
    args = ap.parse_args()
    cluster.prefix = args.prefix
    load = os.getloadavg()[0]
    if load >= 1.5 and not args.force:
        sys.exit("cluster.py: load average %.2f >= 1.5: the machine is busy, figures would be noise "
                 "(--force to run anyway)" % load)
    build = os.path.abspath(args.build)
    bench = os.path.join(build, "bench", "allreduce_bench")
    sz = ["--min", args.min, "--max", args.max, "--repeat", str(args.repeat), "--json"]
    R = args.ranks_per_host
    cpus = args.cpus
    if cpus == "fair":
        cpus = "%.2f" % (os.cpu_count() / max(int(h) for h in args.hosts.split(",")))
    print(cpu.banner())
    print("# each host limited to %s cores" % cpus if cpus != "all" else "# hosts share all cores")
    out = []
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-cluster-") as tmp:
        sets = ["model.preset=%s" % args.preset] if args.preset else []
        if os.path.basename(args.train_config) == "gpt-fortunes.ini":
            subprocess.run([os.path.join(build, "dtrain"), "prepare-text", "/usr/share/games/fortunes",
                            "-o", os.path.join(tmp, "fortunes")], check=True, stdout=subprocess.DEVNULL)
            sets += ["data.train_file=%s/fortunes_train.bin" % tmp, "data.val_file=%s/fortunes_val.bin" % tmp]
        for H in [int(h) for h in args.hosts.split(",")]:
            for bw in args.bw.split(","):
                cluster("down")
                cluster("up", str(H), "--bw", bw, "--subnet", args.subnet,
                        *(["--cpus", cpus] if cpus != "all" else []))
                load_at = os.getloadavg()[0]
                try:
                    mpiargs = cluster("args").split() + ["--allow-run-as-root"]
                    np = H * R
                    base = ["mpirun"] + mpiargs + ["-np", str(np), "--map-by", "ppr:%d:node" % R,
                                                   "-x", "DTRAIN_COMM_BACKEND", "-x", "DTRAIN_COMM_ALGO"]
                    # the links as measured: one host per rank, so the streams cross them
                    hosts1 = ["mpirun"] + mpiargs + ["-np", str(H), "--map-by", "ppr:1:node", bench, "--impl", "shift"]
                    shift_small = run_json(hosts1 + ["--min", "8", "--max", "8", "--repeat", str(args.repeat), "--json"])
                    shift_large = run_json(hosts1 + ["--min", args.max, "--max", args.max, "--repeat",
                                                     str(args.repeat), "--json"])
                    res = {
                        "hier": run_json(base + [bench] + sz, {"DTRAIN_COMM_BACKEND": "auto"}),
                        "ring": run_json(base + [bench] + sz, {"DTRAIN_COMM_BACKEND": "mpi",
                                                                "DTRAIN_COMM_ALGO": "ring"}),
                        "mpi": run_json(base + [bench, "--impl", "mpi"] + sz),
                    }
                    # a run directory of their own (a run's metrics are appended to)
                    d1, dH = (os.path.join(tmp, "t%d-%d-%s" % (n, H, bw)) for n in (1, H))
                    one = train(build, mpiargs, R, R, args, sets, d1)
                    many = train(build, mpiargs, np, R, args, sets, dH)
                finally:
                    cluster("down")
                if not shift_small or not shift_large:
                    sys.exit("cluster.py: allreduce_bench --impl shift failed: no measured link")
                link_arg, link_rate, link_lat = measured_link(shift_small, shift_large)
                nominal = "%s,%s" % (bw, args.latency)
                predicted = simulate(build, d1, H, R, nominal)
                predicted_cal = simulate(build, d1, H, R, link_arg)
                link = rate_gbit(bw) / 8  # GB/s
                by = {k: {r["bytes"]: r for r in v["results"]} for k, v in res.items() if v}
                model = simulate_allreduce(build, sorted(by.get("hier", {})), H, R, nominal)
                model_cal = simulate_allreduce(build, sorted(by.get("hier", {})), H, R, link_arg)
                print("\n## %d hosts x %d rank(s), links %s (%.3f GB/s), load average %.2f" % (
                    H, R, bw, link, load_at))
                print("measured link (allreduce_bench --impl shift): %.3f GB/s (%.0f%% of the link), latency "
                      "%.0f us -> dtrain simulate --link %s" % (link_rate / 1e9, 100 * link_rate / 1e9 / link,
                                                                 link_lat, link_arg))
                print("%8s  %10s %7s %5s  %10s %7s  %10s %7s  %8s %8s  %10s %6s  %10s %6s" % (
                    "bytes", "hier us", "busbw", "link", "ring us", "busbw", "mpi us", "busbw",
                    "vs mpi", "vs ring", "model us", "error", "nominal us", "error"))
                rows = []
                for nbytes, d in sorted(by.get("hier", {}).items()):
                    r, m = by.get("ring", {}).get(nbytes), by.get("mpi", {}).get(nbytes)
                    pc, pn = model_cal.get(nbytes, 0), model.get(nbytes, 0)
                    err = 100 * (pc - d["time_us"]) / d["time_us"]
                    rows.append({"bytes": nbytes, "model_us": pc, "model_error_pct": err, "nominal_us": pn})
                    print("%8s  %10.0f %7.3f %4.0f%%  %10.0f %7.3f  %10.0f %7.3f  %7.2fx %7.2fx  %10.0f %+5.0f%%  %10.0f %+5.0f%%" % (
                        human(nbytes), d["time_us"], d["busbw"], 100 * d["busbw"] / link,
                        r["time_us"] if r else 0, r["busbw"] if r else 0,
                        m["time_us"] if m else 0, m["busbw"] if m else 0,
                        m["time_us"] / d["time_us"] if m else 0, r["time_us"] / d["time_us"] if r else 0,
                        pc, err, pn, 100 * (pn - d["time_us"]) / d["time_us"]))
                # steady state: median steps (the summary's rate includes the first, slow steps)
                (t1, f1, b1), (tH, fH, bH) = medians(d1), medians(dH)
                print("training %s (%s), %d steps, global batch %d: median step 1 host %.1f ms, %d hosts %.1f ms: "
                      "scaling efficiency %.0f%%" % (
                          os.path.basename(args.train_config), args.preset or "as configured", args.steps,
                          many["batch"], t1, H, tH, 100 * t1 / (H * tH)))
                # forward carries no communication: its time per sample on H hosts against 1 host is
                # what sharing this machine's cores costs each pretend host's compute
                scale = fH / f1
                predicted_sc = simulate(build, d1, H, R, link_arg, scale)
                print("per sample: forward %.1f ms on 1 host, %.1f ms on %d (x%.2f), backward %.1f / %.1f ms (x%.2f)" % (
                    f1, fH, H, scale, b1, bH, bH / b1))
                print("dtrain simulate (profile: the 1-host run): step %.1f ms predicted with the measured link "
                      "(%s), %.1f ms measured: %+.0f%%; with --compute-scale %.2f (the forward's slowdown) "
                      "%.1f ms: %+.0f%%; at the nominal link (%s) %.1f ms: %+.0f%%" % (
                          predicted_cal, link_arg, tH, 100 * (predicted_cal - tH) / tH, scale, predicted_sc,
                          100 * (predicted_sc - tH) / tH, nominal, predicted, 100 * (predicted - tH) / tH))
                out.append({"hosts": H, "ranks_per_host": R, "bw": bw, "cpus": cpus, "load": load_at,
                            "measured_link": link_arg, "shift": [shift_small, shift_large],
                            "allreduce": res, "model": rows, "train_1": one, "train_h": many,
                            "step_ms_1": t1, "step_ms_h": tH, "forward_ms_per_sample": [f1, fH],
                            "backward_ms_per_sample": [b1, bH], "simulated_step_ms": predicted_cal,
                            "compute_scale": scale, "simulated_step_ms_scaled": predicted_sc, "simulated_step_ms_nominal": predicted})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu.info()["name"], "load": load, "runs": out}, f, indent=1)


if __name__ == "__main__":
    main()
