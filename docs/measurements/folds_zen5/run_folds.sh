#!/bin/bash
# 5-fold cross-validation at tiny on the 40 generated cases (issue 47's Done-when): one command per
# fold (the demo's recipe, 40 epochs instead of 120 to keep the five folds within ~15 min on a
# 2-core machine), each fold evaluated on the test split (8 cases, in no fold), then the ensemble of
# the five: its cross-validation score (split=val: each case by the fold that held it out; the
# post-processing chosen on all 32 together) and its test score. Re-running resumes and passes over
# what is done. EPOCHS=120 OUT=outputs/folds_e120: the demo's own length (records in e120/).
set -e
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/folds}
EPOCHS=${EPOCHS:-40}
mkdir -p $OUT
runs=()
for k in 0 1 2 3 4; do
  run=$OUT/fold_$k
  echo "$(date -u +%FT%TZ) train fold $k"
  $PY train.py experiment=demo trainer.epochs=$EPOCHS data.fold=$k run_dir=$run tracking=none > $OUT/fold_$k.train.log 2>&1
  $PY scripts/evaluate.py run_dir=$run evaluate.overlays=false > $OUT/fold_$k.eval_test.log 2>&1
  runs+=("$run")
done
list=$(IFS=,; echo "${runs[*]}")
echo "$(date -u +%FT%TZ) ensemble"
$PY scripts/evaluate.py run_dir=$OUT/ensemble "runs=[$list]" split=val evaluate.overlays=false > $OUT/ensemble.eval_val.log 2>&1
$PY scripts/evaluate.py run_dir=$OUT/ensemble evaluate.overlays=false > $OUT/ensemble.eval_test.log 2>&1
echo "$(date -u +%FT%TZ) done"
