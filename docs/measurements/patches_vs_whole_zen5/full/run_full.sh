#!/bin/bash
# The full-resolution arms of experiment=patches_vs_whole_full, one job at a time (as the multirun runs them),
# code from the clone /work/study at a fixed commit, data and outputs in /work/main.
cd /work/main
PY=/work/main/.venv/bin/python
OUT=/work/main/outputs/patches_vs_whole_full
echo "$(date -u +%FT%TZ) prepare"
$PY /work/study/scripts/prepare_data.py data=mni_gliomas resolution=full > $OUT/prepare.log 2>&1
for arm in null 128 96; do
  if [ "$arm" = null ]; then P="trainer.patch_size=null"; name="patch_size-null_seed-0";
  else P="trainer.patch_size=[$arm,$arm,$arm]"; name="patch_size-${arm}x${arm}x${arm}_seed-0"; fi
  run=$OUT/$name
  echo "$(date -u +%FT%TZ) train $name"
  $PY /work/study/train.py data=mni_gliomas resolution=full model.depth=4 trainer.batch_size=2 backend.precision=bf16 \
    trainer.time_budget_s=1200 trainer.epochs=200 "$P" trainer.seed=0 run_dir=$run > $OUT/$name.train.log 2>&1
  echo "$(date -u +%FT%TZ) train $name rc=$?"
done
for arm in null 128 96; do
  if [ "$arm" = null ]; then name="patch_size-null_seed-0"; else name="patch_size-${arm}x${arm}x${arm}_seed-0"; fi
  run=$OUT/$name
  [ -f $run/eval/test/summary.json ] || $PY /work/study/scripts/evaluate.py run_dir=$run > $OUT/$name.eval_test.log 2>&1
  echo "$(date -u +%FT%TZ) evaluated $name rc=$?"
done
echo "$(date -u +%FT%TZ) done"
