#!/usr/bin/env bash
# Whole-volume inference's first-call memory (test-time mirroring, depth 4) in float32 and bfloat16
# on this CPU, one fresh process per point, against the planner's forward estimate
# (brats_seg.lms.planner.inference). Full resolution and below are the points a rule may be
# fitted on; 288x336x240 and 2x (384x448x320) are held out.
#   bash docs/measurements/inference_first_call_zen5/run.sh > docs/measurements/inference_first_call_zen5/points.jsonl
set -euo pipefail
cd "$(dirname "$0")/../../.."
run() { .venv/bin/python scripts/measure_inference_peak.py "shape=[$1]" depth=4 filters=$2 precision=$3 2>/dev/null | tail -n 1; }
for p in fp32 bf16; do
  run 96,112,80 8 $p
  run 128,160,112 8 $p
  run 192,224,160 6 $p
  run 192,224,160 10 $p
  run 192,224,160 16 $p
  run 288,336,240 6 $p
  run 288,336,240 10 $p
done
run 384,448,320 6 bf16
run 384,448,320 10 bf16
