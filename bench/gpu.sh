#!/usr/bin/env bash
# The checks that need a CUDA device, in one go: the CUDA tests, then Pong's throughput with the
# learner on the GPU, in the Atari default layout and in one sized for a 16-core host.
# docs/benchmarks.md records what they printed.
#
#     bench/gpu.sh [OUT_DIR]        # on a machine with a GPU and the project installed
set -u
out=${1:-runs/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_cuda.py 2>&1 \
  | tee "$out/pytest.log"
pong() {  # NAME FRAMES [seedbed train flags]
  local name=$1 frames=$2
  shift 2
  timeout 170 python3 bench/throughput.py --env atari:Pong --device cuda --profile \
    --frames "$frames" -- --env-backend envpool "$@" >"$out/$name.json" 2>"$out/$name.log"
  echo "$name: exit $?"
  cat "$out/$name.json"
}
pong pong-cuda-default 1000000
pong pong-cuda-16core 3000000 --actors 12 --envs-per-actor 16 --batch 96 --inference-batch 96 --queue-size 192
