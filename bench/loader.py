#!/usr/bin/python3
"""The loader's throughput alone against the CNN's training rate
(docs/data.md#throughput): bench_loader on one thread (the caller's, no
prefetch) over Fashion-MNIST for each case, then bench_train's CNN (the cnn
preset, batch 64, on --train-threads threads) in the same run; prints each
case's samples/s and its ratio to the training rate (the goal: at least 5x,
so that data never limits training).

    /usr/bin/python3 bench/loader.py [--build BUILD_DIR] [--epochs 2] [--train-threads 2] [--json]

Cases: decoded cache, no augmentation; crop + flip (crop_pad 2) from the
cache; crop + flip from the file's bytes (cache = false), IDX and HDF5 (the
HDF5 file is written by `dtrain convert-data` into a temporary directory);
the balanced sampler with crop + flip.
"""
import argparse, json, os, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = "/usr/share/datasets/fashion-mnist"


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    print(cpu.banner(a.json), flush=True)
    loader = os.path.join(a.build, "bench", "bench_loader")
    with tempfile.TemporaryDirectory(prefix="dtrain-loader-") as tmp:
        h5 = os.path.join(tmp, "fashion.h5")
        subprocess.run([os.path.join(a.build, "dtrain"), "convert-data", "--from", "idx", FMNIST, "--to", h5],
                       check=True, capture_output=True)
        aug = ["--augment", "crop,flip", "--crop-pad", "2"]
        cases = [
            ("cache, no augmentation", []),
            ("cache, crop+flip", aug),
            ("bytes (cache=false), crop+flip", aug + ["--cache", "0"]),
            ("HDF5 bytes, crop+flip", aug + ["--cache", "0", "--hdf5", h5]),
            ("balanced sampler, crop+flip", aug + ["--sampler", "balanced"]),
        ]
        train = run_json([os.path.join(a.build, "bench", "bench_train"), "--model", "cnn", "--threads",
                          str(a.train_threads), "--json"])
        rate = train["samples_per_sec"]
        results = []
        for name, flags in cases:
            r = run_json([loader, "--epochs", str(a.epochs), "--json"] + flags)
            results.append({"case": name, "samples_per_sec": r["samples_per_sec"],
                            "ratio_to_training": r["samples_per_sec"] / rate})
    if a.json:
        json.dump({"cnn_training_samples_per_sec": rate, "train_threads": a.train_threads, "loader": results},
                  sys.stdout, indent=1)
        print()
        return
    print("CNN training (cnn preset, batch 64, %d threads): %.0f samples/s" % (a.train_threads, rate))
    for r in results:
        print("loader, 1 thread, %-32s %10.0f samples/s  %7.0fx training" % (r["case"] + ":", r["samples_per_sec"],
                                                                          r["ratio_to_training"]))


if __name__ == "__main__":
    main()
