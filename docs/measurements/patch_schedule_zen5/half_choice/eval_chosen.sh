#!/bin/bash
# The chosen candidate (choose.py: the whole volume 1/4 of the time) scored on the test split and the
# 20 held-out cases, as half/run_half.sh scores every arm; same code ($CODE).
CODE=${CODE:-/work/study46}
cd /work/main
PY=/work/main/.venv/bin/python
OUT=/work/main/outputs/patch_schedule_half_choice
for seed in 0 1 2; do
  run=$OUT/whole0.25_seed-$seed
  [ -f $run/eval/test/summary.json ] || $PY $CODE/scripts/evaluate.py run_dir=$run > $OUT/whole0.25_seed-$seed.eval_test.log 2>&1
  [ -f "$run/eval/all@mni_gliomas_heldout/summary.json" ] || $PY $CODE/scripts/evaluate.py run_dir=$run split=all \
    on=mni_gliomas_heldout evaluate.overlays=false > $OUT/whole0.25_seed-$seed.eval_heldout.log 2>&1
  echo "$(date -u +%FT%TZ) evaluated whole0.25_seed-$seed"
done
