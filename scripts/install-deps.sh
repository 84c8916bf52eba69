#!/usr/bin/env bash
# Installs what dtrain needs from Debian's package archive. Idempotent: asks
# apt-get only for packages that are missing, and does nothing at all when
# everything is present.
#
#   scripts/install-deps.sh          build + run + demo (make, make demo)
#   scripts/install-deps.sh --test   also what the tests use (make test)
#   scripts/install-deps.sh --bench  also what bench/ compares against (PyTorch)
set -euo pipefail

pkgs=(build-essential cmake libomp-dev pkg-config
      zlib1g-dev libinih-dev libcjson-dev libdnnl-dev libmicrohttpd-dev libhdf5-dev
      libcurl4-openssl-dev                            # s3:// checkpoints and data (docs/s3.md)
      libopenmpi-dev openmpi-bin
      dataset-fashion-mnist fortunes linux-doc-6.1)   # data: images, and two text corpora
if [ "${1:-}" = "--test" ] || [ "${1:-}" = "--bench" ]; then
    pkgs+=(clang                         # the sanitizer builds (make test-asan, test-tsan)
           prometheus chromium           # tests of the metrics endpoint and the HTML report
           slurmctld slurmd slurm-client munge    # the one-machine Slurm test
           radosgw ceph-mon ceph-osd curl)        # a real S3 server for the s3:// tests (tests/s3_server.sh)
fi
if [ "${1:-}" = "--bench" ]; then
    # PyTorch, and an optimised BLAS for it (Debian's torch otherwise runs on
    # the reference BLAS): the peer must be measured at its best.
    pkgs+=(python3-torch python3-numpy libopenblas0-openmp)
fi

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists once if they are empty or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
    $SUDO apt-get update -qq
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
