#!/bin/bash
# The full-resolution arms of experiment=patches_vs_whole_full (issue 46: grow, whole, patch96;
# seeds 0-2; bf16, so a CPU with native bf16), one job at a time as the multirun runs them; code from
# a clone at a fixed commit ($CODE), data and outputs in /work/main. ARMS picks the arms to run (one
# arm of three seeds is about two hours here). Each job resumes if interrupted (the same overrides,
# the same run folder) and is passed over when finished; each finished run is evaluated on the test
# split and on the 20 held-out cases. While a file HOLD exists in the outputs folder, no training
# starts (evaluations are not timed and go on): other work can use the machine between budgeted runs.
CODE=${CODE:-/work/study46}
ARMS=${ARMS:-grow whole patch96}
cd /work/main
PY=/work/main/.venv/bin/python
OUT=/work/main/outputs/patch_schedule_full
mkdir -p $OUT
echo "$(date -u +%FT%TZ) prepare (code $(git -C $CODE rev-parse --short HEAD))"
$PY $CODE/scripts/prepare_data.py data=mni_gliomas resolution=full >> $OUT/prepare.log 2>&1
$PY $CODE/scripts/prepare_data.py data=mni_gliomas_heldout resolution=full >> $OUT/prepare.log 2>&1
for arm in $ARMS; do
  for seed in 0 1 2; do
    name="arm-${arm}_seed-$seed"
    run=$OUT/$name
    if [ -f $OUT/HOLD ]; then
      echo "$(date -u +%FT%TZ) held before $name ($(cat $OUT/HOLD))"
      while [ -f $OUT/HOLD ]; do sleep 5; done
      echo "$(date -u +%FT%TZ) released"
    fi
    echo "$(date -u +%FT%TZ) train $name"
    $PY $CODE/train.py experiment=patches_vs_whole_full +arm=$arm trainer.seed=$seed run_dir=$run \
      >> $OUT/$name.train.log 2>&1
    rc=$?
    echo "$(date -u +%FT%TZ) train $name rc=$rc"
    [ $rc = 0 ] || continue
    [ -f $run/eval/test/summary.json ] || $PY $CODE/scripts/evaluate.py run_dir=$run > $OUT/$name.eval_test.log 2>&1
    [ -f "$run/eval/all@mni_gliomas_heldout/summary.json" ] || $PY $CODE/scripts/evaluate.py run_dir=$run split=all \
      on=mni_gliomas_heldout evaluate.overlays=false > $OUT/$name.eval_heldout.log 2>&1
    echo "$(date -u +%FT%TZ) evaluated $name"
  done
done
echo "$(date -u +%FT%TZ) done"
