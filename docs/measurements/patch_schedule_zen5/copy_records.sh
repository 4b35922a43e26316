#!/bin/bash
# Copy the small files of each finished, evaluated run of a study (half or full) into its record
# folder here, with the runner's log and, when scripts/study.py has run, study.json and its charts.
#   bash docs/measurements/patch_schedule_zen5/copy_records.sh half
WHICH=${1:?half or full}
SRC=/work/main/outputs/patch_schedule_$WHICH
DST=/work/main/docs/measurements/patch_schedule_zen5/$WHICH
for run in $SRC/arm-*; do
  [ -d "$run" ] || continue
  name=$(basename $run)
  [ -f "$run/eval/all@mni_gliomas_heldout/summary.json" ] || continue
  mkdir -p $DST/$name
  for f in config.json split.json state.json history.csv plan.txt plan.json postprocess.json train.log training_curves.png; do
    [ -f $run/$f ] && cp $run/$f $DST/$name/
  done
  for s in test "all@mni_gliomas_heldout"; do
    mkdir -p "$DST/$name/eval/$s"
    cp "$run/eval/$s/summary.json" "$run/eval/$s/metrics.csv" "$DST/$name/eval/$s/" 2>/dev/null
  done
  cp $SRC/$name.train.log $SRC/$name.eval_test.log $SRC/$name.eval_heldout.log $DST/ 2>/dev/null
done
cp $SRC/run_$WHICH.log $DST/
for f in study.json val_dice_vs_time.png throughput.png test_metrics.png heldout_metrics.png; do
  [ -f $SRC/$f ] && cp $SRC/$f $DST/
done
