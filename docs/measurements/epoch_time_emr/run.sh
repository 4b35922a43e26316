#!/bin/bash
# Issue 47: predicted epoch times against measured ones on this CPU (the Emerald Rapids no shipped
# preset covers), the step-time model being its quick calibration measured three times a point
# (../calibration_3draws_emr/calibration.json, placed where a user's cache keeps it, so the runs'
# own plans print the times it predicts). Two runs, one process at a time on an otherwise idle machine:
#   demo/  `make demo`'s training (experiment=demo: tiny, depth 3, fp32, 26/6 cases), 10 epochs
#   full/  the full-resolution whole-volume arm of the patch study (experiment=patches_vs_whole_30
#          +arm=whole, resolution=full, bf16, batch 2, 15/9 cases), 4 epochs, validating each
# tests/unit/test_run_time.py compares each history.csv (the first epoch, tracing, left out) with
# brats_seg.run_time's prediction.
#   bash docs/measurements/epoch_time_emr/run.sh
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/epoch_time_emr
CACHE=/tmp/epoch_time_emr_cache
rm -rf $CACHE /tmp/epoch_time_emr
mkdir -p $CACHE/step_time
CPU=$($PY -c "from brats_seg.lms.planner.step_time import user_calibration_path; print(user_calibration_path())")
cp docs/measurements/calibration_3draws_emr/calibration.json "$CACHE/step_time/$(basename "$CPU")"
run() {  # name, overrides...
  local name=$1; shift
  echo "$(date +%T) $name"
  BRATS_SEG_CACHE_DIR=$CACHE $PY train.py "$@" tracking=none lms.calibrate=never run_dir=/tmp/epoch_time_emr/$name \
    > $REC/$name.train.log 2>&1
  mkdir -p $REC/$name
  cp /tmp/epoch_time_emr/$name/{history.csv,config.json,split.json,plan.txt,plan.json} $REC/$name/
}
run demo experiment=demo trainer.epochs=10
run full experiment=patches_vs_whole_30 +arm=whole resolution=full backend.precision=bf16 \
  trainer.time_budget_s=0 trainer.epochs=4 trainer.val_every=1
echo "$(date +%T) done"
