#!/usr/bin/env bash
# llm.c's CUDA trainer (train_gpt2cu), the peer of docs/gpu.md's GPT-2 124M
# figures: built HERE from a checkout of llm.c's public source (never
# committed: its code is its own) for sm_90 with cuDNN's flash attention
# (the cudnn-frontend headers, also public), then carried to the GPU
# machine with the tree, where tests/gpu/run.sh's bench stage runs it.
#
#   bench/llmc_gpu.sh build LLMC_DIR CUDNN_FRONTEND_DIR OUT_DIR
#       builds OUT_DIR/train_gpt2cu (NO_MULTI_GPU, bf16, -arch sm_90);
#       CUDNN_FRONTEND_DIR: cudnn-frontend at tag v1.5.2, the version llm.c's
#       attention was written against (later ones also need NVRTC). It needs
#       libcublasLt.so.13 and libcudnn.so.9 where it runs (the GPU machine's
#       toolkit, or PyTorch's nvidia/*/lib: run sets LD_LIBRARY_PATH)
#   bench/llmc_gpu.sh data DIR
#       random GPT-2 tokens (vocabulary 50257) in llm.c's format, which is
#       dtrain's too: DIR/tok_train.bin (4 Mi tokens), DIR/tok_val.bin
#   bench/llmc_gpu.sh run OUT_DIR B T STEPS
#       on the GPU machine: random GPT-2 tokens in llm.c's format (made
#       there with python3), a GPT-2 124M from scratch (-e d12), STEPS
#       steps of B x T; prints llm.c's own lines (tokens/s, MFU)
set -euo pipefail
cmd=${1:?usage: bench/llmc_gpu.sh build LLMC_DIR CUDNN_FRONTEND_DIR OUT_DIR | data DIR | run OUT_DIR B T STEPS}
case "$cmd" in
build)
    llmc=${2:?LLMC_DIR} fe=${3:?CUDNN_FRONTEND_DIR} out=${4:?OUT_DIR}
    [ -f "$llmc/train_gpt2.cu" ] || { echo "llmc_gpu: $llmc has no train_gpt2.cu (a checkout of llm.c?)" >&2; exit 1; }
    [ -f "$fe/include/cudnn_frontend.h" ] || { echo "llmc_gpu: $fe has no include/cudnn_frontend.h" >&2; exit 1; }
    command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
    mkdir -p "$out"
    ln -sfn "$(cd "$fe" && pwd)" "$llmc/cudnn-frontend"  # (where llm.c's Makefile looks)
    # CUDA 13's cudaMemAdvise takes a cudaMemLocation (llm.c was written for
    # CUDA 12): its one call, in the out-of-memory fallback, adapted in the
    # checkout (not in the kernels measured)
    sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
        "$llmc/llmc/cuda_utils.cuh"
    # NVML: the driver's library, absent where no driver is. llm.c uses it
    # only where <nvml.h> exists (not in the toolkit), but its Makefile links
    # it: an empty library of its name to link against; the GPU machine's
    # driver has the real one
    stub=$(mktemp -d)
    echo 'void dtrain_nvml_stub(void) {}' | cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -x c - -o "$stub/libnvidia-ml.so"
    LIBRARY_PATH=$stub${LIBRARY_PATH:+:$LIBRARY_PATH} make -C "$llmc" train_gpt2cu USE_CUDNN=1 GPU_COMPUTE_CAPABILITY=90 NO_MULTI_GPU=1 NO_USE_MPI=1
    cp "$llmc/train_gpt2cu" "$out/"
    ls -la "$out/train_gpt2cu"
    ;;
data)
    mkdir -p "${2:?DIR}"
    python3 - "$2" <<'PY'
import array, os, random, sys
d = sys.argv[1]
rng = random.Random(1)
for name, n in (("train", 4 << 20), ("val", 1 << 20)):
    p = os.path.join(d, "tok_%s.bin" % name)
    if os.path.exists(p):
        continue
    h = array.array("i", [20240520, 1, n] + [0] * 253)
    t = array.array("H", (rng.randrange(50257) for _ in range(n)))
    with open(p + ".tmp", "wb") as f:
        f.write(h.tobytes())
        f.write(t.tobytes())
    os.replace(p + ".tmp", p)
PY
    ;;
run)
    out=${2:?OUT_DIR} B=${3:?B} T=${4:?T} steps=${5:?STEPS}
    data="$out/data"
    "$0" data "$data"
    for d in $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null) /usr/local/cuda/lib64; do
        LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
    done
    export LD_LIBRARY_PATH
    # -e d12: GPT-2 124M from scratch; no logs; validation only at the last
    # step, one batch (-v: a period past the run; 0 would divide by zero),
    # no sampling; no ZeRO; AdamW as bench/torch_gpt.py's (lr 3e-4, wd 0.1)
    "$out/train_gpt2cu" -i "$data/tok_train.bin" -j "$data/tok_val.bin" -e d12 -b "$B" -t "$T" \
        -x "$steps" -v 1000000 -m 1 -s 0 -l 3e-4 -c 0.1 -d $((B * T)) -z 0
    ;;
*) echo "llmc_gpu: unknown command '$cmd'" >&2; exit 2 ;;
esac
