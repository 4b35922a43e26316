#!/bin/bash
# Copy the small files of each finished, evaluated run of experiment=patches_vs_whole_30 into this
# record folder, with the runner's logs and, when scripts/study.py has run, study.json and its charts.
#   bash docs/measurements/patch_schedule_emr/copy_records.sh [outputs folder of the study]
SRC=${1:-outputs/patches_vs_whole_30}
DST=$(dirname "$0")
for run in $SRC/arm-* $SRC/budget_*; do
  [ -d "$run" ] || continue
  name=$(basename $run)
  mkdir -p $DST/$name
  for f in config.json split.json state.json history.csv plan.txt plan.json postprocess.json train.log training_curves.png; do
    [ -f $run/$f ] && cp $run/$f $DST/$name/
  done
  for s in $run/eval/*/; do
    [ -f $s/summary.json ] || continue
    mkdir -p "$DST/$name/eval/$(basename $s)"
    cp "$s/summary.json" "$s/metrics.csv" "$DST/$name/eval/$(basename $s)/" 2>/dev/null
  done
  cp $SRC/$name.*.log $DST/ 2>/dev/null
done
cp $SRC/run_30.log $DST/ 2>/dev/null
for f in study.json val_dice_vs_time.png throughput.png test_metrics.png heldout2_metrics.png; do
  [ -f $SRC/$f ] && cp $SRC/$f $DST/
done
