#!/bin/bash
# The half-resolution arms of experiment=patches_vs_whole, one job at a time (as the multirun runs them),
# code from the clone /work/study at a fixed commit, data and outputs in /work/main.
cd /work/main
PY=/work/main/.venv/bin/python
OUT=/work/main/outputs/patches_vs_whole
for seed in 0 1 2; do
  for arm in null 48; do
    if [ "$arm" = null ]; then P="trainer.patch_size=null"; name="patch_size-null_seed-$seed";
    else P="trainer.patch_size=[48,48,48]"; name="patch_size-48x48x48_seed-$seed"; fi
    run=$OUT/$name
    echo "$(date -u +%FT%TZ) train $name"
    $PY /work/study/train.py data=mni_gliomas resolution=half model.depth=4 trainer.batch_size=2 \
      trainer.time_budget_s=150 trainer.epochs=200 "$P" trainer.seed=$seed run_dir=$run > $OUT/$name.train.log 2>&1
    echo "$(date -u +%FT%TZ) train $name rc=$?"
    [ -f $run/eval/test/summary.json ] || $PY /work/study/scripts/evaluate.py run_dir=$run > $OUT/$name.eval_test.log 2>&1
    [ -f "$run/eval/all@mni_gliomas_heldout/summary.json" ] || $PY /work/study/scripts/evaluate.py run_dir=$run split=all on=mni_gliomas_heldout evaluate.overlays=false > $OUT/$name.eval_heldout.log 2>&1
    echo "$(date -u +%FT%TZ) evaluated $name"
  done
done
echo "$(date -u +%FT%TZ) done"
