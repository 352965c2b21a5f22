#!/usr/bin/env bash
# The multi-GPU issue's training layout, on a two-GPU machine (part `ranks` of scripts/gpu_check.sh, which installs
# kb_gym and Ray first): the policy on GPU 0, the Ray evaluation service's one worker on GPU 1.
#  1. one supervised model (the learning check's corpus and sft phases, on GPU 0);
#  2. two trainer processes, each the learning check's GRPO phase from that model, on GPU 0, both submitting to the
#     one service: each rank's step time split into generation, evaluation and update (its grpo/steps.jsonl);
#  3. the service's results store read by `kb-gym timeline`: per physical GPU, the timings it held and how many
#     pairs overlapped (0: no two timings on one GPU at once). Exit status 1 if they did, or if a step failed.
# Runs from /tmp: Ray puts the driver's working directory on its workers' sys.path, and the repository root's
# kb_gym/ would shadow the installed package. Knobs: RANKS_GRPO_MINUTES (default 3), RANKS_OUT (default $OUT/ranks).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${RANKS_OUT:-${OUT:-/tmp/kb_gym_out}/ranks}
runs=/tmp/kb_ranks
rm -rf "$runs"
mkdir -p "$out" "$runs"
cd /tmp || exit 1
ray_cli() { python3 -m ray.scripts.scripts "$@"; }
check() { python3 -P "$repo/scripts/learning_check.py" "$@"; }

CUDA_VISIBLE_DEVICES=1 ray_cli start --head --num-gpus 1 --disable-usage-stats >"$out/ray.log" 2>&1 || {
  tail -20 "$out/ray.log"; exit 1; }
trap 'ray_cli stop --force >/dev/null 2>&1' EXIT
export RAY_ADDRESS=auto
python3 -P -m kb_gym.cli serve --workers 1 --config rl --results "$out/service.jsonl" || exit 1

CUDA_VISIBLE_DEVICES=0 check --out "$runs/base" --phase corpus,sft --max-minutes 4 || exit 1
pids=()
for r in 0 1; do
  cp -r "$runs/base" "$runs/rank$r"
  CUDA_VISIBLE_DEVICES=0 check --out "$runs/rank$r" --phase grpo --evaluator ray \
    --grpo-minutes "${RANKS_GRPO_MINUTES:-3}" --max-minutes "$(( ${RANKS_GRPO_MINUTES:-3} + 2 ))" \
    >"$out/rank$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
for r in 0 1; do
  cp "$runs/rank$r/grpo/steps.jsonl" "$out/steps-rank$r.jsonl" 2>/dev/null
  tail -n 12 "$out/rank$r.log"
done
python3 - "$out" <<'EOF'
import json, statistics, sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("steps-rank*.jsonl")):
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not steps:
        print(f"{path.stem}: no steps")
        continue
    med = {k: statistics.median(s[k] for s in steps) for k in ("generation_s", "evaluation_s", "update_s", "wall_s")}
    print(f"{path.stem}: {len(steps)} steps; median s: " + ", ".join(f"{k.removesuffix('_s')} {v:.2f}"
                                                                      for k, v in med.items()))
EOF
python3 -P -m kb_gym.cli timeline "$out/service.jsonl" || rc=1
exit $rc
