#!/usr/bin/env bash
# The checks that need a CUDA device, in one go (about 8 minutes; each step has its own time
# limit, so one that hangs cannot eat the others' time):
#   1. the CUDA tests;
#   2. Pong's throughput with the learner on the GPU, in the Atari default layout and in one
#      sized for a 16-core host, with EnvPool (training / raw: the goal is >= 0.8);
#   3. the framework's own overhead on the GPU path (--noop: trivial env, tiny network);
#   4. the ingest benchmark: simulated remote actors into the GPU learner, Atari-sized steps;
#   5. a short R2D2 Pong run on the GPU, for its learner steps/s (summary.json).
# docs/benchmarks.md records what they printed, with the machine.
#
# `pong` instead runs only the time to score (about 10 minutes, so a 15-minute device lease
# holds one of the two): sticky Pong with the learner on the GPU, in the 16-core layout, to a
# 100-episode mean of +18 or 9 minutes, whichever comes first; pong-tts.json has its ladder.
#
#     bench/gpu.sh [OUT_DIR] [checks|pong]   # on a machine with a GPU and the project installed
set -u
out=${1:-runs/gpu}
what=${2:-checks}
if [ "$what" != checks ] && [ "$what" != pong ]; then
  echo "bench/gpu.sh: unknown check set '$what'; use checks or pong" >&2
  exit 2
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
layout_16core=(--env-backend envpool --actors 12 --envs-per-actor 16 --batch 96
  --inference-batch 96 --queue-size 192)
if [ "$what" = pong ]; then
  # time_to_score stops the run itself at the budget; the outer limit only guards a hang.
  timeout 580 python3 bench/time_to_score.py --minutes 9 --protocol sticky --out "$out/pong-tts" \
    -- --device cuda --no-energy "${layout_16core[@]}" >"$out/pong-tts.json" 2>"$out/pong-tts.log"
  echo "pong-tts: exit $?"
  cat "$out/pong-tts.json"
  exit 0
fi
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_cuda.py 2>&1 \
  | tee "$out/pytest.log"
step() {  # NAME SECONDS COMMAND...: runs COMMAND within SECONDS, its stdout to NAME.json
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" >"$out/$name.json" 2>"$out/$name.log"
  echo "$name: exit $?"
  cat "$out/$name.json"
}
step pong-cuda-default 90 python3 bench/throughput.py --env atari:Pong --device cuda --profile \
  --frames 1000000 -- --env-backend envpool
step pong-cuda-16core 110 python3 bench/throughput.py --env atari:Pong --device cuda --profile \
  --frames 3000000 -- "${layout_16core[@]}"
step noop-cuda-16core 50 python3 bench/throughput.py --noop --device cuda --profile \
  --frames 5000000 -- --actors 12 --envs-per-actor 128 --inference-batch 1024
step ingest-cuda 100 python3 bench/ingest.py --sizes atari,atari1 --actors-list 32,256 \
  --seconds 15 -- --device cuda
# SIGINT at the limit: the run stops in order and still writes its summary.
timeout -s INT 80 python3 -m seedbed train --env atari:Pong --agent r2d2 --device cuda \
  --env-backend envpool --actors 12 --envs-per-actor 16 --total-frames 2000000 --no-progress \
  --no-energy --run-dir "$out/r2d2-run" >"$out/r2d2-pong-cuda.log" 2>&1
echo "r2d2-pong-cuda: exit $?"
python3 - "$out/r2d2-run/summary.json" <<'EOF' | tee "$out/r2d2-learner.json"
import json, sys
s = json.load(open(sys.argv[1]))
steps, wall = s["learner_steps"], s["wall_s"]
print(json.dumps({"learner_steps": steps, "wall_s": wall, "learner_steps_per_s": steps / wall,
                  "frames": s["frames"], "stop_reason": s["stop_reason"]}))
EOF
