#!/usr/bin/python3
"""Where a GPU step's time goes: Nsight Compute's (ncu) duration of every
kernel a `dtrain train --device cuda` run launched, summed by kernel name.
tests/gpu/run.sh's profile stage runs

    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \\
        dtrain train RUN.ini ... >PROFILE.csv

and then

    python3 bench/gpu_profile.py PROFILE.csv --steps N [--json FILE]

which prints a table: each kernel name's launches, its time per step and
its share of the kernels' time, largest first, and the kernels' time per
step in all (against the run's own step time, the gap is the host's: launch
gaps and synchronisations). Only the standard library: it runs on the GPU
machine as it is.
"""
import argparse, collections, csv, json, sys


def kernels(path):
    """(kernel name, nanoseconds) for each launch in ncu's CSV (its header
    line starts with "ID"; the program's own output around it is skipped)."""
    with open(path, errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit("gpu_profile: %s holds no ncu CSV (no line starting with \"ID\")" % path)
    rows = csv.DictReader(l for l in lines[start:] if l.startswith('"'))
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
        yield r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, required=True, help="the run's steps (the times are divided by it)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    a = ap.parse_args()
    count, total = collections.Counter(), collections.Counter()
    for name, ns in kernels(a.csv):
        count[name] += 1
        total[name] += ns
    all_ns = sum(total.values())
    if not all_ns:
        sys.exit("gpu_profile: no kernel durations in %s" % a.csv)
    rows = [{"kernel": k, "launches": count[k], "ms_per_step": total[k] / a.steps / 1e6, "share": total[k] / all_ns}
            for k in sorted(total, key=total.get, reverse=True)]
    print("kernels' time per step: %.2f ms over %d launches a step" % (all_ns / a.steps / 1e6,
                                                                      sum(count.values()) // a.steps))
    print("| kernel | launches a step | ms a step | share |")
    print("|---|---:|---:|---:|")
    for r in rows[:a.top]:
        print("| %s | %d | %.3f | %.1f%% |" % (r["kernel"][:90], r["launches"] // a.steps, r["ms_per_step"],
                                             100 * r["share"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ms_per_step": all_ns / a.steps / 1e6, "kernels": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
