#!/bin/bash
# Issue 47: how far apart two measurements of one step are on this CPU, the floor under any
# step-time model's held-out error. Five full-resolution points (depth 4, batch 1, lms=off; the
# quick calibration's 4 and 8 filters and the held-out 12 and 16 filters whose bf16 steps the
# model missed or nearly missed), each measured in three fresh benchmark.py processes, round robin
# (rep1 of every point, then rep2, then rep3), one process at a time on an otherwise idle machine.
# Each record holds its timed steps (step_times_s; step_s is their median).
#   bash docs/measurements/repeatability_emr/run.sh && python docs/measurements/repeatability_emr/summary.py
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/repeatability_emr
BASE="backend=cpu_onednn resolution=full model.depth=4 trainer.batch_size=1 lms=off benchmark.steps=3"
POINTS=("model.base_filters=4 backend.precision=fp32" "model.base_filters=8 backend.precision=fp32"
        "model.base_filters=8 backend.precision=bf16" "model.base_filters=12 backend.precision=bf16"
        "model.base_filters=16 backend.precision=bf16")
mkdir -p $REC/records
for rep in 1 2 3; do
  for i in "${!POINTS[@]}"; do
    out=$REC/records/point${i}_rep${rep}.json
    [ -s "$out" ] && continue  # resumes: a measurement done is kept
    echo "[rep $rep] ${POINTS[$i]}"
    # shellcheck disable=SC2086
    $PY scripts/benchmark.py $BASE ${POINTS[$i]} 2>>$REC/run.log | tail -1 > "$out.tmp"
    mv "$out.tmp" "$out"
  done
done
