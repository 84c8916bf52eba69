# Sourced by the script tests (mpi_restart.sh, cluster.sh, slurm.sh):
#   small_run DIR STEPS [SECTIONS]
# writes the synthetic IDX data of the C tests (tests/make_images, from
# $build) into DIR and DIR/run.ini: a small MLP trained on it for STEPS
# steps; SECTIONS is INI text placed right after [train]'s lines, before
# [data]: more [train] keys ("threads = 1") and further sections
# ("[parallel]\ndeterministic = true").
small_run() {
    "$build/tests/make_images" "$1" >/dev/null
    cat >"$1/run.ini" <<INI
[model]
input = 784
layer = linear out=32
layer = relu
layer = linear out=10
[optim]
name = adamw
lr = 0.003
[train]
batch = 40
epochs = 0
max_steps = $2
eval_batch = 100
${3:-}
[data]
dir = $1
INI
}
