#!/usr/bin/python3
"""Federated averaging on Fashion-MNIST: accuracy per round, rounds to 85%
and bytes per round, for the cases of docs/federated.md.

    /usr/bin/python3 bench/federated.py [--dtrain BUILD_DIR] [--rounds N]
        [--workers N] [--config configs/fashion-fedavg.ini] [--json]

Each case is `dtrain federate CONFIG` with --set overrides; the figures come
from its summary.json (round_test_accuracy, rounds_to_85,
bytes_sent_per_round). Cases: partition iid, dirichlet alpha 0.5 and 0.1,
each with E = 1 and 5, with FedAvg; FedAvgM and FedAdam on alpha 0.5, E = 1.
Writes a CSV of accuracy per round (one column per case) beside the JSON,
for a chart. The full set is long on a 2-core machine (each round trains 10
clients and evaluates 10000 test images): --rounds 20 gives a first look.
"""
import argparse, json, os, subprocess, sys, tempfile

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build")
    ap.add_argument("--config", default="configs/fashion-fedavg.ini")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cases", default=",".join(c for c, _ in CASES))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    want = a.cases.split(",")
    out, curves = [], {}
    tmp = tempfile.mkdtemp(prefix="dtrain-fed-")
    for name, sets in CASES:
        if name not in want:
            continue
        run = os.path.join(tmp, name)
        cmd = [os.path.join(a.dtrain, "dtrain"), "federate", a.config, "--workers", str(a.workers), "--quiet",
               "--run-dir", run, "--set", "federated.rounds=%d" % a.rounds]
        for s in sets:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        s = json.load(open(os.path.join(run, "summary.json")))
        curves[name] = s["round_test_accuracy"]
        row = {"case": name, "rounds": a.rounds, "final_accuracy": s["test_accuracy"],
               "best_accuracy": max(s["round_test_accuracy"]), "rounds_to_85": s["rounds_to_85"],
               "bytes_sent_per_round": s["bytes_sent_per_round"], "wall_seconds": s["wall_seconds"]}
        out.append(row)
        if not a.json:
            print("%-20s final %.4f  best %.4f  rounds to 85%% %4s  %.2f MB/round (rank 0)  %.0f s" %
                  (name, row["final_accuracy"], row["best_accuracy"], row["rounds_to_85"],
                   row["bytes_sent_per_round"] / 1e6, row["wall_seconds"]), flush=True)
    with open(os.path.join(tmp, "accuracy_per_round.csv"), "w") as f:
        names = list(curves)
        f.write("round," + ",".join(names) + "\n")
        for r in range(a.rounds):
            f.write("%d," % (r + 1) + ",".join("%.4f" % curves[n][r] for n in names) + "\n")
    if a.json:
        print(json.dumps(out))
    else:
        print("accuracy per round: %s" % os.path.join(tmp, "accuracy_per_round.csv"))


if __name__ == "__main__":
    sys.exit(main())
