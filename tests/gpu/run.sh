#!/usr/bin/env bash
# Everything a GPU machine is needed for, as a ladder of stages, each with
# its own time limit and its output written as it goes, so that a few
# minutes on a GPU always yield something (docs/gpu.md):
#   1. device: nvidia-smi's list of the GPUs, their memory and driver
#   2. ops: every GPU op against the CPU's (test_gpu ops), every launch
#      waited for (DTRAIN_CUDA_SYNC=1, CUDA_LAUNCH_BLOCKING=1) so that an
#      error names its kernel
#   3. fault: a kernel's fault named with it under DTRAIN_CUDA_SYNC=1
#      (test_gpu fault; its faults are meant, so never under the sanitizer)
#   4. memcheck and initcheck: compute-sanitizer over the op tests;
#      racecheck and synccheck over the fused attention's (test_gpu
#      attention: its shared memory and barriers, small shapes)
#   5. train: the MLP and a tiny GPT trained 20 steps on the GPU against the
#      CPU's losses shipped in tests/fixtures/gpu-train-losses.txt, and the
#      MLP on 2 ranks sharing the GPU under ZeRO 2 and 3
#      (test_gpu_sim gpu; the CPU's path never runs there)
#   6. peers: PyTorch (bench/torch_gpt.py: eager and torch.compile, bf16
#      autocast and TF32), llm.c (BUILD/llmc/train_gpt2cu, built here by
#      bench/llmc_gpu.sh, where it was carried) and dtrain itself (--device
#      cuda, bf16 and TF32; bf16 again with [train] attention = gemm) on GPT-2
#      124M, T=1024
#   6b. attention: the fused attention alone (test_gpu bench-attention)
#      against PyTorch's scaled_dot_product_attention (bench/torch_attention.py);
#      mlp-cnn: the MLP and the CNN against PyTorch eager (bench/gpu_train.py);
#      profile: each kernel's share of dtrain's bf16 GPT step (ncu,
#      bench/gpu_profile.py)
#   7. ranks: that GPT on 1, 2 and 4 ranks sharing the GPU (bench/gpu_ranks.py:
#      the staging's share of the step); zero: on 2 ranks at ZeRO 0 to 3
#      (bench/gpu_zero.py: the GPU memory each stage keeps, and what backing
#      chunks on demand and gathering layers cost the step); model-parallel:
#      on 2 ranks in data parallel and in 2 pipeline stages
#      (bench/gpu_model_parallel.py: a stage's memory, its update on the
#      device, and what its streams and bubble cost the step)
#   8. forecast: dtrain simulate on dtrain's measured GPT-2 124M step
#      (stage 6's, bf16 where it ran): 124M and 1.3B on 8 GPUs x 1..64 hosts
# Run from the source tree on the GPU machine, with BUILD (default build/)
# built here and carried, and BUILD/gpu-libs/ (scripts/gpu-bundle.sh: the
# shared libraries the binaries need that the GPU machine lacks):
#   [BUILD=build-gpu] [STAGES=ops,train,...] tests/gpu/run.sh OUT_DIR
# STAGES (comma-separated names, default every stage) runs only those, so
# that minutes on a GPU go where they are wanted first.
# Exit status: 0 when every stage that ran passed; the summary is
# OUT_DIR/summary.txt, one line a stage.
set -uo pipefail
out=${1:?usage: tests/gpu/run.sh OUT_DIR}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${BUILD:-build}
# The machine's own libraries before the carried ones (BUILD/gpu-libs), which
# fill only what it lacks: a newer libstdc++ there serves dtrain and PyTorch
# both, where the carried one would break PyTorch's import
sys_libs=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$sys_libs:$root/$build/gpu-libs"
# cuBLASLt, cuDNN and NCCL, which dtrain loads at their first use: the CUDA
# toolkit's, else those in PyTorch's packages (nvidia/*/lib)
[ -d /usr/local/cuda/lib64 ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
for d in $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null); do
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
# the dtrain that test_gpu_sim and the benchmarks start
export DTRAIN_BIN=${DTRAIN_BIN:-$root/$build/dtrain}
# one rank's step as a CUDA graph in the benchmarks ([train] cuda_graph): CUDA_GRAPH=false runs them without it
export CUDA_GRAPH=${CUDA_GRAPH:-true}
fails=0
asked() {  # asked NAME: STAGES names it (or is unset)
    case ",${STAGES:-$1}," in *",$1,"*) return 0 ;; *) return 1 ;; esac
}
said_not_run() {  # said_not_run NAME WHY: in the summary, where the stage was asked for
    asked "$1" && echo "$1: not run ($2)" | tee -a "$out/summary.txt"
    return 0
}
stage() {  # stage NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    asked "$name" || return 0
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    local what=passed
    [ $rc -eq 0 ] || what="FAILED (exit $rc$([ $rc -eq 124 ] && echo ', past its limit'))"
    [ $rc -eq 77 ] && what=skipped
    [ $rc -eq 0 ] || [ $rc -eq 77 ] || fails=$((fails + 1))
    echo "$name: $what in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
}
: >"$out/summary.txt"
stage device 60 sh -c 'nvidia-smi -L && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv &&
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" && { command -v compute-sanitizer || true; } && nproc' 
TL_VERBOSE=1 DTRAIN_CUDA_SYNC=1 CUDA_LAUNCH_BLOCKING=1 stage ops 120 "$build/tests/test_gpu" ops
stage fault 60 "$build/tests/test_gpu" fault
if command -v compute-sanitizer >/dev/null; then
    stage memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/tests/test_gpu" ops
    stage initcheck 300 compute-sanitizer --tool initcheck --error-exitcode 9 "$build/tests/test_gpu" ops
    stage racecheck 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$build/tests/test_gpu" attention
    stage synccheck 300 compute-sanitizer --tool synccheck --error-exitcode 9 "$build/tests/test_gpu" attention
else
    said_not_run memcheck "no compute-sanitizer here"
fi
TL_VERBOSE=1 NVIDIA_TF32_OVERRIDE=0 stage train 300 "$build/tests/test_gpu_sim" gpu
# GPT-2 124M's batch for the peers' comparison: the largest of 8/16/32 that fits (an H100's 80 GB and an H200's
# 141 GB hold 32 on every side); the other stages keep 16 (several ranks share the GPU there)
batch=${GPT_BATCH:-32}
peer="python3 bench/torch_gpt.py --device cuda --preset gpt2-124m --batch $batch --seq 1024 --steps 20 --warmup 3"
stage torch-bf16 300 $peer --autocast
stage torch-bf16-compile 420 $peer --autocast --compile
stage torch-tf32 300 $peer --tf32
if [ -x "$build/llmc/train_gpt2cu" ]; then
    stage llmc-bf16 300 bench/llmc_gpu.sh run "$build/llmc" "$batch" 1024 20
else
    said_not_run llmc-bf16 "$build/llmc/train_gpt2cu not built: bench/llmc_gpu.sh build"
fi
# the attention alone at GPT-2 124M's layer: dtrain's fused kernels against PyTorch's SDPA
stage attention 120 sh -c '"$0" bench-attention | tee "$2/attention-dtrain.log" &&
    python3 bench/torch_attention.py | tee "$2/attention-torch.json"' "$build/tests/test_gpu" "$out"
# the MLP (batch 256) and the CNN (64, 512) against PyTorch eager on the GPU
stage mlp-cnn 300 python3 bench/gpu_train.py --dtrain "$build/dtrain" --out "$out/mlp-cnn" --json "$out/mlp-cnn.json"
# dtrain itself on the same model and tokens: bf16 (llm.c's and PyTorch's autocast's setting), fp32 with TF32
bench/llmc_gpu.sh data "$out/tokens" >/dev/null 2>&1
printf '[model]\npreset = gpt2-124m\n[data]\ndataset = tokens\ntrain_file = %s\nval_file = %s\n[optim]\nname = adamw\nlr = 3e-4\nweight_decay = 0.1\n[train]\nbatch = 16\nseq_len = 1024\nmax_steps = 23\neval_every = 0\nlog_every = 1\ndevice = cuda\n' \
    "$out/tokens/tok_train.bin" "$out/tokens/tok_val.bin" >"$out/gpt2-124m-gpu.ini"
stage dtrain-bf16 420 "$build/dtrain" train "$out/gpt2-124m-gpu.ini" --precision bf16 --set train.batch="$batch" \
    --set train.cuda_graph="$CUDA_GRAPH" --run-dir "$out/dtrain-bf16"
stage dtrain-tf32 420 "$build/dtrain" train "$out/gpt2-124m-gpu.ini" --set train.batch="$batch" \
    --set train.cuda_graph="$CUDA_GRAPH" --run-dir "$out/dtrain-tf32"
# bf16 again with the attention as GEMMs ([train] attention = gemm: cuBLASLt's batches and the softmax's row
# kernels, the probabilities kept) in place of the fused kernels: which of the two is faster here
stage dtrain-bf16-gemm 420 "$build/dtrain" train "$out/gpt2-124m-gpu.ini" --precision bf16 --set train.batch="$batch" \
    --set train.cuda_graph="$CUDA_GRAPH" --set train.attention=gemm --run-dir "$out/dtrain-bf16-gemm"
# where dtrain's bf16 step spends the GPU's time: each kernel's duration by
# Nsight Compute over 2 steps, summed by kernel name (bench/gpu_profile.py)
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
if [ -n "$ncu" ]; then
    stage profile 300 sh -c '"$0" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv "$1" train "$2" \
        --precision bf16 --set train.max_steps=2 --quiet --run-dir "$3/profile-run" >"$3/profile.csv" &&
        python3 bench/gpu_profile.py "$3/profile.csv" --steps 2 --json "$3/profile.json"' \
        "$ncu" "$build/dtrain" "$out/gpt2-124m-gpu.ini" "$out"
else
    said_not_run profile "no ncu here"
fi
# 1, 2 and 4 ranks sharing the GPU (staged through host memory): the staging's share of the step
stage ranks 420 python3 bench/gpu_ranks.py --dtrain "$build/dtrain" --config "$out/gpt2-124m-gpu.ini" \
    --ranks 1,2,4 --steps 5 --out "$out/ranks" --json "$out/ranks.json"
# ZeRO 0 to 3 on 2 ranks sharing the GPU: each stage's GPU memory and step
stage zero 420 python3 bench/gpu_zero.py --dtrain "$build/dtrain" --config "$out/gpt2-124m-gpu.ini" \
    --ranks 2 --steps 5 --out "$out/zero" --json "$out/zero.json"
# data parallel against 2 pipeline stages on 2 ranks sharing the GPU: a stage's memory and step
stage model-parallel 420 python3 bench/gpu_model_parallel.py --dtrain "$build/dtrain" \
    --config "$out/gpt2-124m-gpu.ini" --ranks 2 --steps 5 --out "$out/model-parallel" --json "$out/model-parallel.json"
# the forecast of GPT-2 124M and 1.3B on 8 GPUs x 1..64 hosts from that measured step (docs/gpu.md)
measured=$out/dtrain-bf16
[ -s "$measured/summary.json" ] || measured=$out/dtrain-tf32
fc=("$build/dtrain" simulate "$measured" --gpus-per-host 8 --hosts 1..64 --weak --strategy dp,zero)
for f in forecast-124m forecast-1.3b forecast-1.3b-bf16; do
    [ -s "$measured/summary.json" ] || said_not_run $f "no measured run in $out/dtrain-bf16 or $out/dtrain-tf32"
done
if [ -s "$measured/summary.json" ]; then
    stage forecast-124m 60 "${fc[@]}"
    stage forecast-1.3b 60 "${fc[@]}" --model-params 1313722368
    stage forecast-1.3b-bf16 60 "${fc[@]}" --model-params 1313722368 --grad-bytes 2
fi
exit $((fails > 0))
