#!/usr/bin/python3
"""The recommender's tables on parameter servers, row by row, against the
same tables as an ordinary dense block pushed and pulled whole
(docs/recommender.md#measured): one `dtrain train` run a case, 2 workers,
mode sync, for each total table size (--sizes: R rows in 4 tables of 0.889,
0.1, 0.01 and 0.001 R), each server count (--servers) and each case:
`rows-range` and `rows-hash` (the rows on the servers, [recsys] placement
range or hash) and `dense` (the tables in the block, [recsys] sparse =
false); and once a size `tp-range` and `tp-hash`, the tables under tensor
parallel ([recsys] shard = workers: sharded across the 2 workers, no
servers; its bytes are the tables' all-to-all, sent and received, and the
MLPs' allreduce). Prints, per case, worker 0's bytes sent a step as the
communicator measured them (the median of its step records' bytes_sent,
metrics/rank-00000.jsonl: pushes, pull requests, headers), the bytes of
rows it moved a step both ways (counted: ps.table_bytes_per_step), its
step time (the median of its step records' step_seconds, the first step
left out: it waits for the servers to draw their rows), the rows it
pushed to each server a step and their most over their mean
(ps.table_rows_per_server, ps.table_balance: the servers' balance under
the ids' power law), and the test AUC.

    /usr/bin/python3 bench/recsys.py [--dtrain build/dtrain] [--sizes 100000,1000000,10000000]
        [--servers 1,2,4] [--cases rows-range,rows-hash,dense,tp-range,tp-hash] [--steps 40] [--batch 256]
        [--records 20000] [--json]

The logs are written once a size into a temporary directory by `dtrain
make-clicks`. Step times depend on the machine's load (the load average
is printed before and after: say it beside them); bytes and rows do not.
"""
import argparse
import json
import os
import shutil
import statistics
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
max_steps = {steps}
eval_batch = 2000
seed = 1
"""


def tables_of(R):
    t = [R // 10, R // 100, R // 1000]
    return [R - sum(t)] + t


def run(a, d, name, text, servers, case):
    ini = os.path.join(d, name + ".ini")
    with open(ini, "w") as f:
        f.write(text)
    cmd = [a.dtrain, "train", ini, "--quiet", "--workers", "2", "--servers", str(servers), "--run-dir",
           os.path.join(d, name), "--set", "recsys.sparse=" + ("false" if case == "dense" else "true")]
    if case.endswith("-hash"):
        cmd += ["--set", "recsys.placement=hash"]
    if case.startswith("tp-"):
        cmd += ["--set", "recsys.shard=workers"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(d, name, "summary.json")) as f:
        s = json.load(f)
    with open(os.path.join(d, name, "metrics", "rank-00000.jsonl")) as f:
        recs = [json.loads(l) for l in f if '"type":"step"' in l]
    shutil.rmtree(os.path.join(d, name), ignore_errors=True)
    later = [r for r in recs if r["step"] > 1] or recs
    ps = s.get("ps", s.get("tables", {}))
    return {"case": case, "servers": servers, "sent_per_step": statistics.median(r["bytes_sent"] for r in later),
            "rows_bytes_per_step": ps.get("table_bytes_per_step", 0),
            "rows_per_server": ps.get("table_rows_per_server", ps.get("table_rows_per_worker", [])),
            "balance": ps.get("table_balance", 0),
            "step_ms": 1000 * statistics.median(r["step_seconds"] for r in later), "test_auc": s["test_auc"],
            "params": s["params"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build/dtrain")
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--servers", default="1,2,4")
    ap.add_argument("--cases", default="rows-range,rows-hash,dense,tp-range,tp-hash")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dtrain_bench_recsys_")
    print("load average before: %s" % open("/proc/loadavg").read().strip(), file=sys.stderr)
    rows = []
    for R in [int(x) for x in a.sizes.split(",")]:
        tables = ",".join(str(t) for t in tables_of(R))
        tr, te = os.path.join(d, "train.bin"), os.path.join(d, "test.bin")
        subprocess.run([a.dtrain, "make-clicks", "--train", tr, "--test", te, "--tables", tables, "--records",
                        str(a.records), "--test-records", "5000"], check=True, stdout=subprocess.DEVNULL)
        text = CFG.format(tables=tables, train=tr, test=te, batch=a.batch, steps=a.steps)
        cases = [(S, c) for S in [int(x) for x in a.servers.split(",")] for c in a.cases.split(",")
                 if not c.startswith("tp-")]
        cases += [(0, c) for c in a.cases.split(",") if c.startswith("tp-")]
        for S, case in cases:
            r = run(a, d, "%s-%d-S%d" % (case, R, S), text, S, case)
            r["rows"] = R
            r["tables"] = tables
            rows.append(r)
            print("  %s" % json.dumps(r), file=sys.stderr)
    print("load average after: %s" % open("/proc/loadavg").read().strip(), file=sys.stderr)
    shutil.rmtree(d, ignore_errors=True)
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        return
    print("| rows | case | servers | bytes sent a step (worker 0) | rows moved a step | step (ms) | rows a step to each "
          "server (tp: worker) | most / mean | test AUC |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        per = " / ".join("%.1f" % x for x in r["rows_per_server"]) or "—"
        print("| %d | %s | %d | %.0f | %.0f | %.1f | %s | %s | %.4f |" % (
            r["rows"], r["case"], r["servers"], r["sent_per_step"], r["rows_bytes_per_step"], r["step_ms"], per,
            "%.2f" % r["balance"] if r["balance"] else "—", r["test_auc"]))


if __name__ == "__main__":
    main()
