#!/bin/bash
# The half-resolution arms of experiment=patches_vs_whole (issue 46: whole, patch48, grow; seeds 0-2),
# one job at a time as the multirun runs them, grow first; code from a clone at a fixed commit
# ($CODE), data and outputs in /work/main. Each job resumes if interrupted (the same overrides, the
# same run folder) and is passed over when finished; each finished run is evaluated on the test
# split and on the 20 held-out cases.
CODE=${CODE:-/work/study46}
cd /work/main
PY=/work/main/.venv/bin/python
OUT=/work/main/outputs/patch_schedule_half
mkdir -p $OUT
for arm in grow whole patch48; do
  for seed in 0 1 2; do
    name="arm-${arm}_seed-$seed"
    run=$OUT/$name
    echo "$(date -u +%FT%TZ) train $name"
    $PY $CODE/train.py experiment=patches_vs_whole +arm=$arm trainer.seed=$seed run_dir=$run \
      >> $OUT/$name.train.log 2>&1
    echo "$(date -u +%FT%TZ) train $name rc=$?"
    [ -f $run/eval/test/summary.json ] || $PY $CODE/scripts/evaluate.py run_dir=$run > $OUT/$name.eval_test.log 2>&1
    [ -f "$run/eval/all@mni_gliomas_heldout/summary.json" ] || $PY $CODE/scripts/evaluate.py run_dir=$run split=all \
      on=mni_gliomas_heldout evaluate.overlays=false > $OUT/$name.eval_heldout.log 2>&1
    echo "$(date -u +%FT%TZ) evaluated $name"
  done
done
echo "$(date -u +%FT%TZ) done"
