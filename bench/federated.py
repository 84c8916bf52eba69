#!/usr/bin/python3
"""Federated averaging on Fashion-MNIST: accuracy per round, rounds to 85%
and bytes per round, for the cases of docs/federated.md.

    /usr/bin/python3 bench/federated.py [--dtrain BUILD_DIR] [--rounds N]
        [--workers N] [--config configs/fashion-fedavg.ini] [--cases A,B,...]
        [--out DIR] [--svg FILE] [--ymin Y] [--json]
    /usr/bin/python3 bench/federated.py --chart CSV [CSV...] --svg FILE [--ymin Y]

Each case is `dtrain federate CONFIG` with --set overrides; the figures come
from its summary.json (round_test_accuracy, rounds_to_85,
bytes_sent_per_round). Cases: partition iid, dirichlet alpha 0.5 and 0.1,
each with E = 1 and 5, with FedAvg; FedAvgM and FedAdam on alpha 0.5, E = 1.
Writes the runs, a CSV of accuracy per round (one column per case) and an
SVG line chart of it into --out (a new temporary directory by default).
--chart runs nothing and draws the CSVs of earlier runs into one chart, so
cases run separately can share one. The full set is long on a 2-core
machine (each round trains 10 clients and evaluates 10000 test images;
about 1 s a round for E = 1 and 4 s for E = 5 on 2 workers): --rounds 20
gives a first look.
"""
import argparse, csv, json, math, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402

CASES = [
    ("iid-E1", ["federated.partition=iid", "federated.local_epochs=1"]),
    ("iid-E5", ["federated.partition=iid", "federated.local_epochs=5"]),
    ("dir0.5-E1", ["federated.partition=dirichlet", "federated.alpha=0.5", "federated.local_epochs=1"]),
    ("dir0.5-E5", ["federated.partition=dirichlet", "federated.alpha=0.5", "federated.local_epochs=5"]),
    ("dir0.1-E1", ["federated.partition=dirichlet", "federated.alpha=0.1", "federated.local_epochs=1"]),
    ("dir0.1-E5", ["federated.partition=dirichlet", "federated.alpha=0.1", "federated.local_epochs=5"]),
    ("dir0.5-E1-fedavgm", ["federated.partition=dirichlet", "federated.alpha=0.5", "federated.algorithm=fedavgm",
                           "federated.server_momentum=0.9", "federated.server_lr=0.5"]),
    ("dir0.5-E1-fedadam", ["federated.partition=dirichlet", "federated.alpha=0.5", "federated.algorithm=fedadam",
                           "federated.server_lr=0.01"]),
]

COLORS = {"iid": "#1f77b4", "dir0.5": "#2ca02c", "dir0.1": "#d62728", "dir0.5-E1-fedavgm": "#9467bd",
          "dir0.5-E1-fedadam": "#8c564b"}


def nice_step(span, n):
    """A tick spacing of 1, 2 or 5 x 10^k giving about n ticks over span."""
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def svg_chart(curves, path, title, ymin=None):
    """Writes accuracy per round as an SVG line chart: one line per case (E = 5
    dashed, colour by partition), grid lines, the 85% and 90% goals dotted, a
    legend at the bottom right. curves: {case: [accuracy after round 1, 2, ...]};
    ymin: the bottom of the y axis (lower points are cut off), by default the
    lowest accuracy's tenth."""
    W, H, ML, MR, MT, MB = 760, 420, 56, 190, 40, 46
    rounds = max(len(c) for c in curves.values())
    lo = min(min(c) for c in curves.values())
    y0 = ymin if ymin is not None else max(0.0, min(0.6, math.floor(lo * 10) / 10))
    y1 = 1.0
    px = lambda x: ML + (x - 1) / max(1, rounds - 1) * (W - ML - MR)
    py = lambda y: H - MB - (y - y0) / (y1 - y0) * (H - MT - MB)
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
         'font-family="sans-serif" font-size="11">' % (W, H, W, H),
         '<title>%s</title>' % title, '<rect width="%d" height="%d" fill="#fff"/>' % (W, H),
         '<text x="%d" y="22" font-size="14" font-weight="600">%s</text>' % (ML, title)]
    step = nice_step(y1 - y0, 8)
    for i in range(int(round((y1 - y0) / step)) + 1):
        y = y0 + i * step
        o.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/>'
                 '<text x="%d" y="%.1f" text-anchor="end" fill="#444">%.2f</text>' %
                 (ML, W - MR, py(y), py(y), ML - 6, py(y) + 4, y))
    step = nice_step(rounds, 8)
    for x in [1] + list(range(int(step), rounds + 1, int(step))):
        o.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#e5e5e5"/>'
                 '<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%d</text>' %
                 (px(x), px(x), MT, H - MB, px(x), H - MB + 16, x))
    o.append('<path d="M%d %dV%dH%d" fill="none" stroke="#888"/>' % (ML, MT, H - MB, W - MR))
    o.append('<text x="%d" y="%d" text-anchor="middle" font-size="12">round</text>' % ((ML + W - MR) / 2, H - 10))
    o.append('<text x="14" y="%d" text-anchor="middle" font-size="12" transform="rotate(-90 14 %d)">'
             'test accuracy</text>' % ((MT + H - MB) / 2, (MT + H - MB) / 2))
    o.append('<clipPath id="plot"><rect x="%d" y="%d" width="%d" height="%d"/></clipPath>' %
             (ML, MT, W - ML - MR, H - MT - MB))
    for i, (name, acc) in enumerate(curves.items()):
        color = COLORS.get(name, COLORS.get(name.split("-E")[0], "#7f7f7f"))
        dash = ' stroke-dasharray="6 3"' if "-E5" in name else ""
        d = "".join("%s%.1f %.1f" % ("L" if r else "M", px(r + 1), py(a)) for r, a in enumerate(acc))
        o.append('<path d="%s" fill="none" stroke="%s" stroke-width="1.5"%s clip-path="url(#plot)"/>' %
                 (d, color, dash))
        y = H - MB - 18 * (len(curves) - 1 - i) - 4  # the legend from the bottom up, clear of the goals
        label = name if len(acc) == rounds else "%s (to round %d)" % (name, len(acc))
        o.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>'
                 '<text x="%d" y="%d">%s</text>' % (W - MR + 16, W - MR + 40, y, y, color, dash, W - MR + 46, y + 4,
                                                      label))
    for goal in (0.85, 0.90):  # over the curves, labelled in the right margin
        o.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#888" stroke-dasharray="2 3"/>'
                 '<text x="%d" y="%.1f" fill="#555">%d%%</text>' %
                 (ML, W - MR, py(goal), py(goal), W - MR + 4, py(goal) + 4, round(goal * 100)))
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def read_csv(paths):
    """The curves of one or more accuracy_per_round.csv files, merged."""
    curves = {}
    for p in paths:
        with open(p) as f:
            rows = list(csv.DictReader(f))
        for name in rows[0]:
            if name != "round":
                curves[name] = [float(r[name]) for r in rows if r[name]]  # blank: that run stopped
    return curves


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build")
    ap.add_argument("--config", default="configs/fashion-fedavg.ini")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cases", default=",".join(c for c, _ in CASES))
    ap.add_argument("--out", help="directory for the runs, the CSV and the chart (default: a new temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--chart", nargs="+", metavar="CSV",
                    help="run nothing: draw these accuracy_per_round.csv files into one chart (--svg)")
    ap.add_argument("--svg", help="the chart's path (default: accuracy_per_round.svg beside the CSV)")
    ap.add_argument("--ymin", type=float, help="the chart's lowest accuracy (default: from the data)")
    ap.add_argument("--title", default="Fashion-MNIST CNN, 100 clients, f = 0.1: test accuracy per round")
    a = ap.parse_args()
    print(cpu.banner(a.json))
    if a.chart:
        svg_chart(read_csv(a.chart), a.svg or "accuracy_per_round.svg", a.title, a.ymin)
        return 0
    want = a.cases.split(",")
    out, curves = [], {}
    tmp = a.out or tempfile.mkdtemp(prefix="dtrain-fed-")
    os.makedirs(tmp, exist_ok=True)
    for name, sets in CASES:
        if name not in want:
            continue
        run = os.path.join(tmp, name)
        cmd = [os.path.join(a.dtrain, "dtrain"), "federate", a.config, "--workers", str(a.workers), "--quiet",
               "--run-dir", run, "--set", "federated.rounds=%d" % a.rounds]
        for s in sets:
            cmd += ["--set", s]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode == 0
        if done:
            s = json.load(open(os.path.join(run, "summary.json")))
            acc = s["round_test_accuracy"]
            to85, per_round, wall = s["rounds_to_85"], s["bytes_sent_per_round"], s["wall_seconds"]
        else:  # it stopped (dtrain's error is above): the rounds before, from the metrics log
            with open(os.path.join(run, "metrics", "rank-00000.jsonl")) as f:
                acc = [r["accuracy"] for r in map(json.loads, f) if r.get("type") == "eval"]
            if not acc:
                sys.exit("%s: dtrain federate failed before its first round" % name)
            to85 = next((i + 1 for i, x in enumerate(acc) if x >= 0.85), -1)
            per_round = wall = None
        curves[name] = acc
        row = {"case": name, "rounds": len(acc), "completed": done, "final_accuracy": acc[-1],
               "best_accuracy": max(acc), "accuracy_at_100": acc[99] if len(acc) >= 100 else None,
               "best_within_100": max(acc[:100]), "rounds_to_85": to85,
               "bytes_sent_per_round": per_round, "wall_seconds": wall}
        out.append(row)
        if not a.json:
            at100 = "%.4f" % row["accuracy_at_100"] if row["accuracy_at_100"] is not None else "-"
            tail = ("%.2f MB/round (rank 0)  %.0f s" % (per_round / 1e6, wall) if done else
                    "STOPPED after round %d" % len(acc))
            print("%-20s at 100 %s  best within 100 %.4f  final %.4f  best %.4f  rounds to 85%% %4s  %s" %
                  (name, at100, row["best_within_100"], row["final_accuracy"], row["best_accuracy"], to85, tail),
                  flush=True)
    with open(os.path.join(tmp, "accuracy_per_round.csv"), "w") as f:
        names = list(curves)
        f.write("round," + ",".join(names) + "\n")
        for r in range(max((len(c) for c in curves.values()), default=0)):
            f.write("%d," % (r + 1) + ",".join("%.4f" % curves[n][r] if r < len(curves[n]) else "" for n in names) +
                    "\n")
    svg = a.svg or os.path.join(tmp, "accuracy_per_round.svg")
    if curves:
        svg_chart(curves, svg, a.title, a.ymin)
    if a.json:
        print(json.dumps(out))
    else:
        print("accuracy per round: %s, chart %s" % (os.path.join(tmp, "accuracy_per_round.csv"), svg))


if __name__ == "__main__":
    sys.exit(main())
