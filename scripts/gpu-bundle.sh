#!/usr/bin/env bash
# Copies into BUILD/gpu-libs the shared libraries that BUILD's GPU test
# and dtrain need and a GPU machine without Debian's packages lacks
# (oneDNN, inih, cJSON, libgomp, ...: everything ldd resolves outside
# glibc's own), so that the tree travels there with BUILD and runs
# (tests/gpu/run.sh). The CUDA runtime is linked statically; the driver is
# the GPU machine's. Configure BUILD without MPI, HDF5, libmicrohttpd and
# libcurl (docs/gpu.md) so that dtrain's libraries fit what a tree may
# carry (41 MB, oneDNN's 38 of it).
#   scripts/gpu-bundle.sh [BUILD]     (default: build)
set -euo pipefail
build=${1:-build}
dir="$build/gpu-libs"
rm -rf "$dir" && mkdir -p "$dir"
for bin in "$build/tests/test_gpu" "$build/dtrain"; do
    [ -x "$bin" ] || { echo "gpu-bundle: $bin is not built" >&2; exit 1; }
    ldd "$bin" | awk '$3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux*) ;;  # glibc's: the machine's own
    *) cp -L "$lib" "$dir/" ;;
    esac
done
du -sh "$dir"
