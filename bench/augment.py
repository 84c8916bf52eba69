#!/usr/bin/python3
"""The accuracy effect of augmentation on the Fashion-MNIST CNN
(docs/data.md#augmentation): one `dtrain train` run of configs/fashion-cnn.ini
per case, the same seed, schedule and number of steps; prints each case's
test accuracy and loss after the run, and the training loss of its last
epoch.

    /usr/bin/python3 bench/augment.py [--dtrain BUILD_DIR] [--epochs 3] [--cases none,flip,crop,crop+flip]
        [--set S.K=V]... [--json]

Cases: no augmentation, `augment = flip`, `augment = crop` (crop_pad 2 and
4) and `augment = crop, flip`. The shipped config runs 12 epochs (about 10
minutes a case on 2 cores); --epochs shortens the cosine schedule with it.
Accuracy does not depend on the machine's load; the wall time does.
"""
import argparse, json, os, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    "none": [],
    "flip": ["data.augment=flip"],
    "crop2": ["data.augment=crop", "data.crop_pad=2"],
    "crop+flip": ["data.augment=crop,flip", "data.crop_pad=2"],
    "crop4+flip": ["data.augment=crop,flip", "data.crop_pad=4"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "fashion-cnn.ini"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--cases", default="none,flip,crop2,crop+flip")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    print(cpu.banner(a.json), flush=True)
    exe = os.path.join(a.dtrain, "dtrain")
    results = []
    with tempfile.TemporaryDirectory(prefix="dtrain-augment-") as tmp:
        for name in a.cases.split(","):
            run = os.path.join(tmp, name)
            cmd = [exe, "train", a.config, "--quiet", "--run-dir", run, "--set", "train.epochs=%d" % a.epochs]
            for s in CASES[name] + a.set:
                cmd += ["--set", s]
            t0 = time.time()
            subprocess.run(cmd, check=True)
            wall = time.time() - t0
            with open(os.path.join(run, "summary.json")) as f:
                s = json.load(f)
            r = {"case": name, "epochs": a.epochs, "test_accuracy": s["test_accuracy"], "test_loss": s["test_loss"],
                 "final_train_loss": s["final_train_loss"], "wall_seconds": round(wall, 1)}
            results.append(r)
            if not a.json:
                print("%-11s test accuracy %.4f  test loss %.4f  last-epoch train loss %.4f  (%.0f s)" %
                      (name, r["test_accuracy"], r["test_loss"], r["final_train_loss"], wall), flush=True)
    if a.json:
        json.dump(results, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
