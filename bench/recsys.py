#!/usr/bin/python3
"""The recommender's tables on parameter servers, row by row, against the
same tables as an ordinary dense block pushed and pulled whole
(docs/recommender.md#measured): one `dtrain train` run a case, 2 workers,
mode sync, 1, 2 and 4 servers. Prints, per case, worker 0's bytes sent a
step as the communicator measured them (summary.json's bytes_sent over
the steps: pushes, pull requests, headers), the bytes of rows it moved a
step both ways (counted: ps.table_bytes_per_step), its step time (the
training seconds over the steps) and the test AUC.

    /usr/bin/python3 bench/recsys.py [--dtrain build/dtrain] [--tables 100000,20000,5000,1000]
        [--records 20000] [--batch 256] [--servers 1,2,4] [--json]

The log is written once into a temporary directory by `dtrain make-clicks`.
Step times depend on the machine's load (say it beside them); bytes do not.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CFG = """[model]
preset = dlrm
[recsys]
tables = {tables}
dim = 16
dense = 4
bottom = 32
top = 32
train = {train}
test = {test}
table_optim = sgd
table_lr = 0.05
[optim]
name = sgd
lr = 0.05
[train]
batch = {batch}
epochs = 1
eval_batch = 2000
seed = 1
"""


def run(dtrain, d, name, text, servers, sparse):
    ini = os.path.join(d, name + ".ini")
    with open(ini, "w") as f:
        f.write(text)
    cmd = [dtrain, "train", ini, "--quiet", "--workers", "2", "--servers", str(servers), "--run-dir",
           os.path.join(d, name), "--set", "recsys.sparse=" + ("true" if sparse else "false")]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(d, name, "summary.json")) as f:
        s = json.load(f)
    steps = s["steps"]
    return {"case": name, "servers": servers, "tables": "rows" if sparse else "dense block",
            "sent_per_step": s["bytes_sent"] / steps,
            "rows_bytes_per_step": s.get("ps", {}).get("table_bytes_per_step", 0),
            "step_ms": 1000 * s["train_seconds"] / steps, "test_auc": s["test_auc"], "params": s["params"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build/dtrain")
    ap.add_argument("--tables", default="100000,20000,5000,1000")
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--servers", default="1,2,4")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dtrain_bench_recsys_")
    tr, te = os.path.join(d, "train.bin"), os.path.join(d, "test.bin")
    subprocess.run([a.dtrain, "make-clicks", "--train", tr, "--test", te, "--tables", a.tables, "--records",
                    str(a.records), "--test-records", "5000"], check=True)
    text = CFG.format(tables=a.tables, train=tr, test=te, batch=a.batch)
    rows = []
    for S in [int(x) for x in a.servers.split(",")]:
        for sparse in (True, False):
            rows.append(run(a.dtrain, d, "%s-S%d" % ("rows" if sparse else "dense", S), text, S, sparse))
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        return
    print("| tables | servers | bytes sent a step (worker 0) | rows moved a step | step (ms) | test AUC |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %.0f | %.0f | %.1f | %.4f |" % (r["tables"], r["servers"], r["sent_per_step"],
                                                         r["rows_bytes_per_step"], r["step_ms"], r["test_auc"]))


if __name__ == "__main__":
    main()
