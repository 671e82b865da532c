#!/usr/bin/env bash
# The GPU checks, one script for a machine with a CUDA device whose python3 has the project's
# test dependencies (torch with CUDA, hypothesis, scipy, pytest-benchmark): the CUDA-graph tests
# (replay equals eager, one host sync per round), the kit's graph-replay property on the fast
# engine, the CPU kernels' tests (they build on any x86-64 machine with g++), the kit's trained
# properties on the fast engine with the weight-bound pair (make models-large), the EAGLE-3
# head's chains and dynamic trees on the GPU (tests/test_fast_head_tree.py), and the GPU
# benchmarks: (c) verify of k+1 / decode on Qwen3-1.7B's shape in bf16, (c') an EAGLE-3 head
# step and a 17-node tree's verify against a decode step there (issue 41), (f) eager vs graph.
# Logs and the benchmark JSON go under $OUT (default gpu-out/). About 5 minutes on an H200.
#
#     bash fast/gpu_check.sh            # PYTHON=... to choose the interpreter
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
status=0
step() {   # name, then the command; its output to $out/name.log and the terminal
    local name=$1; shift
    echo "=== gpu_check: $name"
    "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== gpu_check: $name exit $rc"
    [ "$rc" -eq 0 ] || status=1
}
step env bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
    $py -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name())'"
if [ "$status" -ne 0 ]; then
    echo "=== gpu_check: no CUDA device or no torch with CUDA in $py: nothing here is a GPU check"
    exit 2
fi
step graph-tests "$py" -m pytest -q -p no:cacheprovider -m gpu tests/test_fast_graphs.py tests/test_fast_tree.py \
    tests/test_fast_head_tree.py
step kit-graph-replay "$py" -m pytest -q -p no:cacheprovider properties/test_batched.py --impl=fast \
    -k graph_replay
step cpu-kernels "$py" -m pytest -q -p no:cacheprovider tests/test_fast_native.py tests/test_fast_small_m.py \
    tests/test_fast_fused.py tests/test_fast_weights.py
step kit-large "$py" -m pytest -q -p no:cacheprovider properties/ --impl=fast \
    --kit-trained=reference/trained-large -k trained
step gpu-bench "$py" -m pytest -p no:cacheprovider --benchmark-only -m gpu fast/test_bench_step.py \
    fast/test_bench_graphs.py --benchmark-json="$out/gpu-bench.json"
exit $status
